//! `/etc/ptrain/ptrain.toml`: read in two stages, a raw serde layer that
//! mirrors the file (unknown keys are errors) and a validated [`Config`].
//! Every error names the file, the key and the fix.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::gpu::GpuConfig;
use crate::setting::InvalidSetting;

pub mod checks;

pub const DEFAULT_CONFIG_PATH: &str = "/etc/ptrain/ptrain.toml";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}; create it (see packaging/ptrain.toml) or pass --config")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config {path}: key `{key}`: {message}")]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    spool_dir: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    log_dir: Option<PathBuf>,
    runtime_dir: Option<PathBuf>,
    slice: Option<String>,
    allow_root_jobs: Option<bool>,
    max_queued_per_user: Option<usize>,
    gpus: Option<GpuConfig>,
    jobs: Option<RawJobs>,
    limits: Option<crate::resources::LimitsConfig>,
    retention: Option<RawRetention>,
    logs: Option<crate::logs::RawLogsConfig>,
    policy: Option<crate::policy::PolicyConfig>,
    notify: Option<crate::notifications::config::RawNotify>,
    metrics: Option<crate::metrics::RawMetrics>,
    channels: Option<std::collections::BTreeMap<String, crate::notifications::config::RawChannel>>,
    privacy: Option<Privacy>,
    accounting: Option<crate::accounting::RawAccounting>,
    images: Option<crate::images::RawImagesConfig>,
}

pub use crate::views::Privacy;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJobs {
    read_write_paths: Option<Vec<PathBuf>>,
    /// "30m" or seconds; checked by [`crate::spec::validate_idle_timeout`].
    idle_timeout: Option<serde_json::Value>,
    idle_requires_gpu_idle: Option<bool>,
    stop_grace: Option<String>,
    max_stop_grace: Option<String>,
    max_retries: Option<u32>,
    keep_ended_units: Option<String>,
    max_kept_units: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetention {
    max_ended_jobs: Option<usize>,
    max_age: Option<String>,
    rejected_per_user: Option<usize>,
    rejected_max_age: Option<String>,
}

/// `[retention]`: finished jobs beyond these limits are compacted into one
/// line each of `STATE/history.jsonl` and their records removed.
#[derive(Clone, Debug)]
pub struct Retention {
    pub max_ended_jobs: usize,
    pub max_age: Option<std::time::Duration>,
    /// Quarantined (rejected) files kept per owner: a user who floods the
    /// spool with bad files pushes out only their own oldest.
    pub rejected_per_user: usize,
    pub rejected_max_age: std::time::Duration,
}

/// Defaults of `[retention]` for rejected files.
pub const DEFAULT_REJECTED_PER_USER: usize = 1000;
pub const DEFAULT_REJECTED_MAX_AGE: std::time::Duration =
    std::time::Duration::from_secs(30 * 24 * 3600);

/// `[jobs] stop_grace` by default, and its ceiling.
pub const DEFAULT_STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(30);
pub const MAX_STOP_GRACE: std::time::Duration = crate::spec::checkpoint::MAX_STOP_GRACE;

/// The validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub spool_dir: PathBuf,
    pub state_dir: PathBuf,
    pub log_dir: PathBuf,
    /// Per-job files that live while a job does (its launch credential,
    /// staged secrets, its result directory); see [`crate::runtime`].
    pub runtime_dir: PathBuf,
    pub slice: String,
    pub allow_root_jobs: bool,
    pub max_queued_per_user: usize,
    pub gpus: GpuConfig,
    /// Paths every job may write besides its workdir (datasets, caches).
    pub read_write_paths: Vec<PathBuf>,
    /// Memory/CPU/task caps per job, per user (`[limits]`).
    pub limits: crate::resources::LimitsConfig,
    /// How much finished-job history ptraind keeps as full records.
    pub retention: Retention,
    /// `[jobs] idle_timeout`: the default for jobs that set none.
    pub idle_timeout: Option<std::time::Duration>,
    /// `[jobs] idle_requires_gpu_idle`: a silent job is stopped only if
    /// its GPUs are idle too (NVML utilization).
    pub idle_requires_gpu_idle: bool,
    /// `[jobs] stop_grace`: how long a stopped or timed-out job has between
    /// SIGTERM and SIGKILL (the unit's TimeoutStopSec); its GPUs stay held
    /// until then.
    pub stop_grace: std::time::Duration,
    /// `[jobs] max_stop_grace`: the longest `stop_grace` a job may ask
    /// for (at most [`MAX_STOP_GRACE`], its default).
    pub max_stop_grace: std::time::Duration,
    /// `[jobs] max_retries`: the most `retries` a job may ask for (at most
    /// [`crate::spec::retry::MAX_RETRIES`], its default).
    pub max_retries: u32,
    /// `[jobs] keep_ended_units`, `max_kept_units`: how long and how many
    /// ended units stay loaded for `systemctl status`.
    pub kept_units: crate::kept_units::KeepPolicy,
    /// `[logs]`: output archives and their retention.
    pub logs: crate::logs::LogsConfig,
    /// Which GPUs users and groups may use, and how many at once (`[policy]`).
    pub policy: crate::policy::PolicyConfig,
    /// Notification channels, retry timing, defaults (`[notify]`, `[channels.NAME]`).
    pub notifications: crate::notifications::NotificationsConfig,
    /// The Prometheus endpoint (`[metrics]`), off unless `listen` is set.
    pub metrics: crate::metrics::MetricsConfig,
    /// `[privacy]`: what users see of each other's jobs.
    pub privacy: Privacy,
    /// `[accounting]`: whether runs are measured and kept.
    pub accounting: crate::accounting::AccountingConfig,
    /// `[images]`: the image store's collection policy, plain-http
    /// registries and the size limit of one image.
    pub images: crate::images::ImagesConfig,
}

/// Parses the file into the raw layer. A syntax error keeps toml's own
/// message (it points at the line); a type error or unknown key is reported
/// under the dotted key it sits at, with its line and what the key takes,
/// because serde alone says only "invalid type: string \"many\", expected
/// usize" and leaves the admin to guess which of forty keys that was.
fn parse_raw(path: &Path, text: &str) -> Result<RawConfig, ConfigError> {
    let document = toml::Deserializer::parse(text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string().trim_end().replace('\n', "\n  "),
    })?;
    serde_path_to_error::deserialize(document).map_err(|e| {
        let key = e.path().to_string();
        let inner = e.into_inner();
        let line = inner
            .span()
            .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
        let at = line.map(|l| format!(" (line {l})")).unwrap_or_default();
        let message = plain_expectation(inner.message().trim_end());
        if key.is_empty() || key == "." {
            ConfigError::Parse {
                path: path.to_owned(),
                message: format!("{message}{at}"),
            }
        } else {
            ConfigError::Invalid {
                path: path.to_owned(),
                key,
                message: format!("{message}{at}"),
            }
        }
    })
}

/// serde's "expected usize" and friends, said the way the file is written.
fn plain_expectation(message: &str) -> String {
    const PLAIN: &[(&str, &str)] = &[
        (
            "expected usize",
            "expected a whole number (0 or more), like 1000",
        ),
        ("expected u64", "expected a whole number (0 or more)"),
        ("expected u32", "expected a whole number (0 or more)"),
        ("expected u16", "expected a whole number from 0 to 65535"),
        ("expected f64", "expected a number, like 4 or 1.5"),
        ("expected a boolean", "expected true or false (no quotes)"),
        ("expected a string", "expected a quoted string"),
        ("expected a sequence", "expected a list, like [0, 1]"),
        ("expected a map", "expected a table"),
    ];
    let mut out = message.to_owned();
    for (serde_says, file_says) in PLAIN {
        if let Some(at) = out.find(serde_says) {
            // Only a whole word: "expected u32" must not match "expected u325".
            let end = at + serde_says.len();
            if !out[end..].starts_with(|c: char| c.is_ascii_alphanumeric()) {
                out.replace_range(at..end, file_says);
                break;
            }
        }
    }
    out
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::from_toml(path, &text)
    }

    pub fn from_toml(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let raw = parse_raw(path, text)?;
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            path: path.to_owned(),
            key: key.to_owned(),
            message,
        };
        // Each section checks its own values; the error gains the path.
        let setting = |e: InvalidSetting| invalid(&e.key, e.message);
        let absolute = |key: &str, value: Option<PathBuf>, default: &str| {
            let value = value.unwrap_or_else(|| PathBuf::from(default));
            if value.is_absolute() {
                Ok(value)
            } else {
                Err(invalid(
                    key,
                    format!(
                        "{} is relative; give an absolute path like {default}",
                        value.display()
                    ),
                ))
            }
        };
        let spool_dir = absolute("spool_dir", raw.spool_dir, "/var/spool/ptrain")?;
        let state_dir = absolute("state_dir", raw.state_dir, "/var/lib/ptrain")?;
        let log_dir = absolute("log_dir", raw.log_dir, "/var/log/ptrain")?;
        let runtime_dir = absolute("runtime_dir", raw.runtime_dir, "/run/ptrain")?;
        if spool_dir.starts_with(&state_dir) || state_dir.starts_with(&spool_dir) {
            return Err(invalid(
                "state_dir",
                "must not be inside spool_dir or contain it; users can write the spool".into(),
            ));
        }
        let slice = raw.slice.unwrap_or_else(|| "ptrain.slice".into());
        let stem = slice.strip_suffix(".slice").unwrap_or_default();
        // systemd reads each dash as a level of nesting: a leading,
        // trailing or doubled dash names no slice (`-.slice`, the root, is
        // well-formed and refused by the checks as shared).
        let slice_ok = slice.len() <= 255
            && !stem.is_empty()
            && stem
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
            && (stem == "-"
                || !(stem.starts_with('-') || stem.ends_with('-') || stem.contains("--")));
        if !slice_ok {
            return Err(invalid(
                "slice",
                format!("{slice:?} is not a slice unit name; use something like \"ptrain.slice\""),
            ));
        }
        let max_queued_per_user = raw.max_queued_per_user.unwrap_or(1000);
        if max_queued_per_user == 0 {
            return Err(invalid("max_queued_per_user", "must be at least 1".into()));
        }
        let gpus = match raw.gpus {
            Some(g) => g,
            None => GpuConfig::deserialize(toml::Value::Table(Default::default()))
                .map_err(|e| invalid("gpus", format!("defaults do not load: {e}")))?,
        };
        gpus.validate().map_err(setting)?;
        let metrics = crate::metrics::MetricsConfig::from_raw(raw.metrics).map_err(setting)?;
        let notifications =
            crate::notifications::NotificationsConfig::from_raw(path, raw.notify, raw.channels)
                .map_err(setting)?;
        let policy = raw.policy.unwrap_or_default();
        policy.validate().map_err(setting)?;
        let raw_retention = raw.retention.unwrap_or_default();
        let duration = |key: &str, text: Option<String>| match text {
            None => Ok(None),
            Some(text) => humantime::parse_duration(&text).map(Some).map_err(|e| {
                invalid(
                    key,
                    format!("{text:?} is not a duration ({e}); write e.g. \"90d\""),
                )
            }),
        };
        let retention = Retention {
            max_ended_jobs: raw_retention.max_ended_jobs.unwrap_or(100_000),
            max_age: duration("retention.max_age", raw_retention.max_age)?,
            rejected_per_user: raw_retention
                .rejected_per_user
                .unwrap_or(DEFAULT_REJECTED_PER_USER),
            rejected_max_age: duration(
                "retention.rejected_max_age",
                raw_retention.rejected_max_age,
            )?
            .unwrap_or(DEFAULT_REJECTED_MAX_AGE),
        };
        if retention.rejected_per_user == 0 {
            return Err(invalid(
                "retention.rejected_per_user",
                "must be at least 1 (owners read why their files were refused)".into(),
            ));
        }
        if retention.max_ended_jobs == 0 {
            return Err(invalid(
                "retention.max_ended_jobs",
                "must be at least 1 (dependents and `ptrain status` need recent ends)".into(),
            ));
        }
        let limits = raw.limits.unwrap_or_default();
        limits.validate().map_err(setting)?;
        let accounting =
            crate::accounting::AccountingConfig::from_raw(raw.accounting, &policy, &limits)
                .map_err(setting)?;
        let idle_timeout = raw
            .jobs
            .as_ref()
            .and_then(|j| j.idle_timeout.as_ref())
            .map(|v| {
                crate::spec::validate_idle_timeout(v).map_err(|m| invalid("jobs.idle_timeout", m))
            })
            .transpose()?;
        let idle_requires_gpu_idle = raw
            .jobs
            .as_ref()
            .and_then(|j| j.idle_requires_gpu_idle)
            .unwrap_or(false);
        let stop_grace = duration(
            "jobs.stop_grace",
            raw.jobs.as_ref().and_then(|j| j.stop_grace.clone()),
        )?
        .unwrap_or(DEFAULT_STOP_GRACE);
        let max_stop_grace = duration(
            "jobs.max_stop_grace",
            raw.jobs.as_ref().and_then(|j| j.max_stop_grace.clone()),
        )?
        .unwrap_or(MAX_STOP_GRACE);
        for (key, grace) in [
            ("jobs.stop_grace", stop_grace),
            ("jobs.max_stop_grace", max_stop_grace),
        ] {
            if grace.is_zero() || grace > MAX_STOP_GRACE {
                return Err(invalid(
                    key,
                    format!(
                        "{} is outside 1s..{}; a job that ignores SIGTERM keeps its GPUs this long",
                        humantime::format_duration(grace),
                        humantime::format_duration(MAX_STOP_GRACE)
                    ),
                ));
            }
        }
        if stop_grace > max_stop_grace {
            return Err(invalid(
                "jobs.stop_grace",
                format!(
                    "{} is longer than jobs.max_stop_grace ({}); the default cannot exceed what a job may ask for, so lower it or raise max_stop_grace",
                    humantime::format_duration(stop_grace),
                    humantime::format_duration(max_stop_grace)
                ),
            ));
        }
        let max_retries = raw
            .jobs
            .as_ref()
            .and_then(|j| j.max_retries)
            .unwrap_or(crate::spec::retry::MAX_RETRIES);
        if max_retries > crate::spec::retry::MAX_RETRIES {
            return Err(invalid(
                "jobs.max_retries",
                format!(
                    "{max_retries} is more than {}: each attempt keeps its record and logs; lower it",
                    crate::spec::retry::MAX_RETRIES
                ),
            ));
        }
        let kept_units = crate::kept_units::KeepPolicy {
            keep: duration(
                "jobs.keep_ended_units",
                raw.jobs.as_ref().and_then(|j| j.keep_ended_units.clone()),
            )?
            .unwrap_or(crate::kept_units::DEFAULT_KEEP),
            max_kept: raw
                .jobs
                .as_ref()
                .and_then(|j| j.max_kept_units)
                .unwrap_or(crate::kept_units::DEFAULT_MAX_KEPT),
        };
        if kept_units.max_kept > crate::kept_units::MAX_KEPT {
            return Err(invalid(
                "jobs.max_kept_units",
                format!(
                    "{} is more than {}: each kept unit holds a reference that costs systemd a D-Bus match rule, and dbus-daemon disconnects it past 512; lower it",
                    kept_units.max_kept,
                    crate::kept_units::MAX_KEPT
                ),
            ));
        }
        let logs = raw.logs.unwrap_or_default().validate().map_err(setting)?;
        let images = raw.images.unwrap_or_default().validate().map_err(setting)?;
        let read_write_paths = raw
            .jobs
            .and_then(|j| j.read_write_paths)
            .unwrap_or_default();
        for (i, p) in read_write_paths.iter().enumerate() {
            if !p.is_absolute() {
                return Err(invalid(
                    &format!("jobs.read_write_paths[{i}]"),
                    format!("{} is relative; give an absolute path", p.display()),
                ));
            }
        }
        Ok(Config {
            spool_dir,
            state_dir,
            log_dir,
            runtime_dir,
            slice,
            allow_root_jobs: raw.allow_root_jobs.unwrap_or(false),
            max_queued_per_user,
            gpus,
            read_write_paths,
            limits,
            retention,
            idle_timeout,
            idle_requires_gpu_idle,
            stop_grace,
            max_stop_grace,
            max_retries,
            kept_units,
            logs,
            policy,
            notifications,
            metrics,
            privacy: raw.privacy.unwrap_or_default(),
            accounting,
            images,
        })
    }
}

impl From<&Config> for crate::logs::LogSettings {
    fn from(c: &Config) -> Self {
        crate::logs::LogSettings {
            log_dir: c.log_dir.clone(),
            logs: c.logs.clone(),
            slice: c.slice.clone(),
            idle_timeout: c.idle_timeout,
        }
    }
}

impl<'a> From<&'a Config> for crate::unit::UnitSettings<'a> {
    fn from(c: &'a Config) -> Self {
        crate::unit::UnitSettings {
            slice: &c.slice,
            stop_grace: c.stop_grace,
            max_stop_grace: c.max_stop_grace,
            read_write_paths: &c.read_write_paths,
            usage_watcher: c.accounting.enabled,
        }
    }
}

/// The policy as the system's group database resolves it: the lookup is
/// in the config's floor, so [`crate::policy`] stays pure.
impl crate::policy::Policy {
    /// [`crate::policy::Policy::resolve`] against the system's group database, warning
    /// once about groups it does not know.
    pub fn from_system(cfg: &crate::policy::PolicyConfig) -> crate::policy::Policy {
        let (policy, unknown) = crate::policy::Policy::resolve(cfg, crate::users::gid_of_group);
        for name in unknown {
            tracing::warn!(
                "config key `policy.groups.{name}`: there is no group {name:?}, so this rule applies to nobody; \
                 create the group or fix the name, then restart ptraind"
            );
        }
        policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml(Path::new("/etc/ptrain/ptrain.toml"), text)
    }

    #[test]
    fn empty_config_gives_defaults() {
        let c = load("").unwrap();
        assert_eq!(c.spool_dir, Path::new("/var/spool/ptrain"));
        assert_eq!(c.slice, "ptrain.slice");
        assert!(!c.allow_root_jobs);
    }

    #[test]
    fn shipped_default_config_loads() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/packaging/ptrain.toml"
        ));
        if let Ok(text) = text {
            load(&text).unwrap();
        }
    }

    #[test]
    fn policy_section_loads_and_errors_name_the_key() {
        let c =
            load("[policy.users.alice]\nmax_gpus = 1\n[policy.groups.lab]\nallowed_gpus = [0]\n")
                .unwrap();
        assert_eq!(c.policy.users["alice"].max_gpus, Some(1));
        assert!(load("").unwrap().policy.users.is_empty());
        let e = load("[policy.users.alice]\nallowed_gpus = [1, 1]\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`policy.users.alice.allowed_gpus[1]`") && e.contains("once"),
            "{e}"
        );
        let e = load("[policy.users.alice]\nmax_gpu = 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_gpu"), "{e}");
    }

    #[test]
    fn accounting_is_on_by_default_and_off_refuses_what_reads_its_database() {
        assert!(load("").unwrap().accounting.enabled);
        let off = load("[accounting]\nenabled = false\n").unwrap();
        assert!(!off.accounting.enabled);
        for (text, key) in [
            (
                "[accounting]\nenabled = false\n[policy]\nfair_share = { half_life = \"7d\" }\n",
                "`policy.fair_share`",
            ),
            (
                "[accounting]\nenabled = false\n[limits]\ngpu_hours = { per = \"7d\", max = 100 }\n",
                "`limits.gpu_hours`",
            ),
            (
                "[accounting]\nenabled = false\n[limits.users.bob]\ngpu_hours = { per = \"7d\", max = 1 }\n",
                "`limits.users.bob.gpu_hours`",
            ),
        ] {
            let e = load(text).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("enabled = true"), "{e}");
        }
        let e = load("[accounting]\nenable = false\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("enable"), "{e}");
        let every = load("[accounting]\ngpu_sample_interval = \"5s\"\n").unwrap();
        assert_eq!(every.accounting.gpu_sample_interval.as_secs(), 5);
        assert_eq!(
            load("").unwrap().accounting.gpu_sample_interval.as_secs(),
            30
        );
        for bad in ["\"0s\"", "\"2h\"", "\"often\""] {
            let e = load(&format!("[accounting]\ngpu_sample_interval = {bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("`accounting.gpu_sample_interval`"), "{e}");
        }
    }

    #[test]
    fn idle_timeout_and_logs_sections_load() {
        let c = load("[jobs]\nidle_timeout = \"30m\"\nidle_requires_gpu_idle = true\n[logs]\nuser_max_count = 3\n")
            .unwrap();
        assert_eq!(c.idle_timeout, Some(std::time::Duration::from_secs(1800)));
        assert!(c.idle_requires_gpu_idle);
        assert_eq!(c.logs.retention.user_max_count, Some(3));
        let d = load("").unwrap();
        assert_eq!((d.idle_timeout, d.idle_requires_gpu_idle), (None, false));
        let e = load("[jobs]\nidle_timeout = \"0s\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`jobs.idle_timeout`"), "{e}");
        let e = load("[logs]\nmin_free = \"99%\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`logs.min_free`"), "{e}");
    }

    #[test]
    fn type_errors_name_the_key_path_and_what_it_takes() {
        let e = load("max_queued_per_user = \"many\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("key `max_queued_per_user`")
                && e.contains("whole number")
                && e.contains("line 1"),
            "{e}"
        );
        let e = load("slice = \"ptrain.slice\"\n[limits.users.alice]\ntasks_max = \"lots\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("key `limits.users.alice.tasks_max`") && e.contains("line 3"),
            "{e}"
        );
        let e = load("[jobs]\nidle_requires_gpu_idle = \"yes\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`jobs.idle_requires_gpu_idle`") && e.contains("true or false"),
            "{e}"
        );
        let e = load("[[gpus.declared]]\nindex = 0\nuuid = \"GPU-1\"\nname = \"G\"\nmemory_mib = \"16G\"\ndevice = \"/dev/nvidia0\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`gpus.declared[0].memory_mib`"), "{e}");
        // A syntax error still points at the line, in toml's words.
        let e = load("slice = \n").unwrap_err().to_string();
        assert!(e.contains("line 1"), "{e}");
    }

    #[test]
    fn images_section_loads_and_errors_name_the_key() {
        let d = load("").unwrap().images;
        assert_eq!(d, crate::images::ImagesConfig::default());
        let c = load(
            "[images]\nmax_size = \"200GiB\"\nmax_unused = \"0s\"\ninsecure_registries = [\"registry.lab:5000\"]\nmax_image_size = \"8G\"\n",
        )
        .unwrap()
        .images;
        assert_eq!(c.max_size, Some(200 << 30));
        assert_eq!(c.max_unused, None);
        assert_eq!(c.max_image_size, 8 << 30);
        assert!(c.insecure_registries.contains("registry.lab:5000"));
        let e = load("[images]\nmax_size = \"big\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("key `images.max_size`") && e.contains("32G"),
            "{e}"
        );
        let e = load("[images]\ninsecure_registries = [\"http://r.lab\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("key `images.insecure_registries[0]`"), "{e}");
        let e = load("[images]\nmax_age = \"1d\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_age"), "{e}");
        let e = load("[images]\nmax_image_size = true\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`images.max_image_size`"), "{e}");
    }

    #[test]
    fn errors_name_the_key_and_fix() {
        let e = load("spool_dir = \"spool\"").unwrap_err().to_string();
        assert!(e.contains("spool_dir") && e.contains("absolute"), "{e}");
        let e = load("spol_dir = \"/x\"").unwrap_err().to_string();
        assert!(e.contains("spol_dir"), "{e}");
        for bad in [
            "ptrain",
            "-ptrain.slice",
            "ptrain-.slice",
            "lab--gpu.slice",
            ".slice",
        ] {
            let e = load(&format!("slice = {bad:?}")).unwrap_err().to_string();
            assert!(
                e.contains("slice") && e.contains("ptrain.slice"),
                "{bad}: {e}"
            );
        }
        load("slice = \"lab-gpu.slice\"").unwrap();
        let e = load("state_dir = \"/var/spool/ptrain/state\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("state_dir"), "{e}");
    }
}
