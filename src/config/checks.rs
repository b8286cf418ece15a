//! What a parsed config means on this host: the checks `ptraind
//! --check-config` prints and ptraind's start applies, one function for
//! both, so a config the check calls clean is one the daemon accepts.
//!
//! [`Config::from_toml`](super::Config::from_toml) reads no host state (the
//! `ptrain` CLI loads the same file as an ordinary user); these checks do:
//! secret files and their modes, the GPU inventory, user and group
//! accounts, the cgroup controllers. Errors make ptraind refuse to start;
//! warnings are printed (and logged at start) and the daemon runs.
//!
//! Where the line falls: an error is the file contradicting itself or the
//! host in a way that stays wrong until the admin edits something (a secret
//! that is missing or readable by users, a config users can change, a slice
//! shared with system services, a policy naming a GPU `backend = "declared"`
//! does not list). A warning is what may be transient or outside the file (a GPU
//! NVML does not see now, a device node the driver has not made yet, an
//! account a directory service has not served yet, a cgroup controller a
//! container does not delegate): refusing to start over it would stop
//! every job on the machine.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::Config;
use crate::gpu::{GpuBackend, GpuConfig, GpuInfo, GpuInventory};
use crate::notifications::config::ChannelKind;

/// Where cgroup v2 is mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// ptraind refuses to start; `--check-config` exits non-zero.
    Error,
    /// Printed and logged; ptraind starts.
    Warning,
}

/// One problem: the dotted key it is about (empty for the file itself),
/// and what is wrong and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub severity: Severity,
    pub key: String,
    pub message: String,
}

impl Finding {
    fn error(key: impl Into<String>, message: impl Into<String>) -> Finding {
        Finding {
            severity: Severity::Error,
            key: key.into(),
            message: message.into(),
        }
    }

    fn warning(key: impl Into<String>, message: impl Into<String>) -> Finding {
        Finding {
            severity: Severity::Warning,
            key: key.into(),
            message: message.into(),
        }
    }

    /// `error: config /etc/ptrain/ptrain.toml: key `slice`: ...`, the shape
    /// of [`super::ConfigError`]'s messages.
    pub fn render(&self, config_path: &Path) -> String {
        let level = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        if self.key.is_empty() {
            format!(
                "{level}: config {}: {}",
                config_path.display(),
                self.message
            )
        } else {
            format!(
                "{level}: config {}: key `{}`: {}",
                config_path.display(),
                self.key,
                self.message
            )
        }
    }
}

/// The host facts the checks read. [`Host::this_host`] gathers the real
/// ones; tests build their own.
pub struct Host {
    /// Where cgroup v2 is mounted ([`CGROUP_ROOT`]).
    pub cgroup_root: PathBuf,
    /// The inventory ptraind would use: its backend and snapshot, or why
    /// it cannot be read.
    pub inventory: Result<(&'static str, Vec<GpuInfo>), String>,
    pub user_exists: fn(&str) -> bool,
    pub group_exists: fn(&str) -> bool,
}

impl Host {
    pub fn this_host(config: &Config) -> Host {
        Host {
            cgroup_root: PathBuf::from(CGROUP_ROOT),
            inventory: read_inventory(&config.gpus),
            user_exists: |name| crate::users::uid_of_name(name).is_some(),
            group_exists: |name| crate::users::gid_of_group(name).is_some(),
        }
    }
}

/// The inventory [`crate::gpu::open_inventory`] would give, read once and
/// without its logging: the daemon logs the fallback and pool changes
/// itself when it opens its own.
fn read_inventory(cfg: &GpuConfig) -> Result<(&'static str, Vec<GpuInfo>), String> {
    use crate::gpu::{DeclaredInventory, NvmlInventory};
    let declared = || DeclaredInventory::new(cfg.declared.clone());
    let inventory: Box<dyn GpuInventory> = match cfg.backend {
        GpuBackend::Declared => Box::new(declared()),
        GpuBackend::Nvml => Box::new(NvmlInventory::init().map_err(|e| e.to_string())?),
        GpuBackend::Auto => match NvmlInventory::init() {
            Ok(nvml) => Box::new(nvml),
            Err(_) => Box::new(declared()),
        },
    };
    let snapshot = inventory.snapshot().map_err(|e| e.to_string())?;
    Ok((inventory.backend(), snapshot))
}

/// Every finding for `config` on `host`, errors first.
pub fn check(config: &Config, host: &Host) -> Vec<Finding> {
    let mut findings = Vec::new();
    check_config_file(config, &mut findings);
    check_secret_files(config, &mut findings);
    check_slice(&config.slice, &mut findings);
    check_gpus(config, host, &mut findings);
    check_accounts(config, host, &mut findings);
    check_controllers(config, &host.cgroup_root, &mut findings);
    check_default_channels(config, &mut findings);
    findings.sort_by_key(|f| f.severity);
    findings
}

/// A stream among the defaults does nothing there: it hears every job's
/// events it takes whatever the job names. A warning, not an error: a
/// config that loaded before streams were told apart still starts.
fn check_default_channels(config: &Config, findings: &mut Vec<Finding>) {
    let notify = &config.notifications;
    for (i, name) in notify.default_channels.iter().enumerate() {
        if notify
            .channels
            .get(name)
            .is_some_and(|c| c.streamed_events().is_some())
        {
            findings.push(Finding::warning(
                format!("notify.default_channels[{i}]"),
                format!("{name:?} is a stream: it hears every job's events its `events` lists whatever a job names, so naming it here changes nothing; remove it"),
            ));
        }
    }
}

/// The channels whose secret sits in the config file itself: a WeCom
/// robot's `key=` in its url when no `key_file` holds it.
fn secrets_in_config(config: &Config) -> Vec<String> {
    config
        .notifications
        .channels
        .iter()
        .filter(|(_, c)| matches!(&c.kind, ChannelKind::WeCom(w) if w.key_file.is_none()))
        .map(|(name, _)| format!("channels.{name}.url"))
        .collect()
}

/// Whoever can change the config decides what root runs (paths granted to
/// every job, the slice, the channels); and one holding a secret must be
/// as closed as a secret file.
fn check_config_file(config: &Config, findings: &mut Vec<Finding>) {
    let path = &config.notifications.config_path;
    let Ok(meta) = std::fs::metadata(path) else {
        return; // just read by the loader; nothing to say that it did not
    };
    let mode = meta.mode() & 0o7777;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != 0 && meta.uid() != euid {
        findings.push(Finding::error(
            "",
            format!(
                "{} belongs to uid {}, who can change what ptraind runs as root; \
                 `chown root:root {}`",
                path.display(),
                meta.uid(),
                path.display()
            ),
        ));
    }
    if mode & 0o022 != 0 {
        findings.push(Finding::error(
            "",
            format!(
                "{} is writable by group or others (mode {mode:04o}), who could change what \
                 ptraind runs as root; `chmod go-w {}`",
                path.display(),
                path.display()
            ),
        ));
    }
    let holders = secrets_in_config(config);
    if !holders.is_empty() && mode & 0o077 != 0 {
        findings.push(Finding::error(
            &holders[0],
            format!(
                "holds the robot's key, but {} is readable by users other than root \
                 (mode {mode:04o}); `chmod 600 {}`, or move the key into a root-only \
                 key_file",
                path.display(),
                path.display()
            ),
        ));
    }
}

/// Each channel's secret and CA files: there, and (secrets) root-only, as
/// the notifier will read them, so a typo is found now and not at the
/// first job's end.
fn check_secret_files(config: &Config, findings: &mut Vec<Finding>) {
    for (name, channel) in &config.notifications.channels {
        let (secrets, ca): (Vec<(&str, &Option<PathBuf>)>, &Option<PathBuf>) = match &channel.kind {
            ChannelKind::WeCom(w) => (vec![("key_file", &w.key_file)], &w.ca_file),
            ChannelKind::Webhook(w) => (
                vec![
                    ("secret_file", &w.secret_file),
                    ("token_file", &w.token_file),
                ],
                &w.ca_file,
            ),
            ChannelKind::Email(e) => (vec![("password_file", &e.password_file)], &e.ca_file),
            ChannelKind::Amqp(a) => (vec![("password_file", &a.password_file)], &a.ca_file),
            ChannelKind::Kafka(k) => (vec![("password_file", &k.password_file)], &k.ca_file),
        };
        for (field, path) in secrets {
            let Some(path) = path else { continue };
            let key = format!("channels.{name}.{field}");
            if let Err(message) = crate::notifications::transport::read_secret_file(&key, path) {
                // read_secret_file names the key first; the finding does.
                let message = message
                    .strip_prefix(&format!("{key}: "))
                    .unwrap_or(&message)
                    .to_owned();
                findings.push(Finding::error(key, message));
            }
        }
        if let Some(path) = ca {
            if let Err(e) = std::fs::File::open(path) {
                findings.push(Finding::error(
                    format!("channels.{name}.ca_file"),
                    format!(
                        "cannot read {}: {e}; point it at the PEM file of the CA that signed \
                         the server's certificate, or remove the key to use the system's CAs",
                        path.display()
                    ),
                ));
            }
        }
    }
}

/// Jobs get a slice of ptrain's own: one shared with system services or
/// users' sessions would put jobs under their limits and accounting (and
/// `systemctl stop` of the slice would stop them too).
fn check_slice(slice: &str, findings: &mut Vec<Finding>) {
    let shared = match slice {
        "-.slice" => Some("the root slice, which holds everything"),
        "system.slice" => Some("shared with every system service"),
        "user.slice" => Some("shared with every user's login sessions"),
        "machine.slice" => Some("shared with virtual machines and containers"),
        s if s.starts_with("user-") => Some("a user's login sessions (logind owns it)"),
        _ => None,
    };
    if let Some(why) = shared {
        findings.push(Finding::error(
            "slice",
            format!(
                "{slice:?} is {why}: jobs would share its limits and accounting; \
                 use a slice of ptrain's own, like the shipped \"ptrain.slice\""
            ),
        ));
    }
}

/// `allowed_gpus` against the inventory, and the inventory's own state.
fn check_gpus(config: &Config, host: &Host, findings: &mut Vec<Finding>) {
    let (backend, snapshot) = match &host.inventory {
        Ok(inventory) => inventory,
        Err(why) => {
            findings.push(Finding::warning(
                "gpus",
                format!(
                    "cannot read the GPU inventory ptraind would use ({why}); GPU indices in \
                     [policy] were not checked against this host"
                ),
            ));
            return;
        }
    };
    let present: BTreeSet<u32> = snapshot.iter().map(|g| g.index).collect();
    let shown = if present.is_empty() {
        "none".to_owned()
    } else {
        present
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let policy = &config.policy;
    let rules = policy
        .default
        .iter()
        .map(|l| ("policy.default".to_owned(), l))
        .chain(
            policy
                .users
                .iter()
                .map(|(n, l)| (format!("policy.users.{n}"), l)),
        )
        .chain(
            policy
                .groups
                .iter()
                .map(|(n, l)| (format!("policy.groups.{n}"), l)),
        );
    for (rule, limits) in rules {
        for (i, index) in limits.allowed_gpus.iter().flatten().enumerate() {
            if present.contains(index) {
                continue;
            }
            let key = format!("{rule}.allowed_gpus[{i}]");
            // A declared list the admin chose is the file itself: naming
            // a GPU it lacks stays wrong until edited. NVML's view can
            // lose a GPU for a while (off the bus, mid driver upgrade),
            // and so can `auto`, which falls back to the declared list
            // while NVML does not load.
            if config.gpus.backend == GpuBackend::Declared {
                findings.push(Finding::error(
                    key,
                    format!(
                        "GPU {index} is not in [[gpus.declared]] (indices: {shown}); \
                         correct the index or declare the GPU"
                    ),
                ));
            } else {
                findings.push(Finding::warning(
                    key,
                    format!(
                        "GPU {index} is not on this host (the {backend} inventory has: {shown}); \
                         jobs under this rule cannot get it; check `nvidia-smi -L` and correct \
                         the index"
                    ),
                ));
            }
        }
    }
    for gpu in snapshot.iter().filter(|g| g.unhealthy.is_some()) {
        let why = gpu.unhealthy.as_deref().unwrap_or_default();
        let key = match config
            .gpus
            .declared
            .iter()
            .position(|d| d.index == gpu.index && d.device == gpu.device)
        {
            Some(i) if *backend == "declared" => format!("gpus.declared[{i}].device"),
            _ => "gpus".to_owned(),
        };
        findings.push(Finding::warning(
            key,
            format!(
                "GPU {} is kept out of the pool, no job will get it: {why}",
                gpu.index
            ),
        ));
    }
}

/// Rules for accounts this host does not know apply to no one: most often
/// a misspelt name.
fn check_accounts(config: &Config, host: &Host, findings: &mut Vec<Finding>) {
    let users = config
        .policy
        .users
        .keys()
        .map(|n| (format!("policy.users.{n}"), n))
        .chain(
            config
                .limits
                .users
                .keys()
                .map(|n| (format!("limits.users.{n}"), n)),
        )
        .chain(
            config
                .notifications
                .owner_email
                .keys()
                .map(|n| (format!("notify.owner_email.{n}"), n)),
        );
    for (key, name) in users {
        if !(host.user_exists)(name) {
            findings.push(Finding::warning(
                key,
                format!(
                    "there is no user {name:?} on this host (`getent passwd {name}` finds \
                     none), so this applies to no one; correct the name or remove the entry"
                ),
            ));
        }
    }
    for name in config.policy.groups.keys() {
        if !(host.group_exists)(name) {
            findings.push(Finding::warning(
                format!("policy.groups.{name}"),
                format!(
                    "there is no group {name:?} on this host (`getent group {name}` finds \
                     none), so this rule applies to no one; correct the name or remove it"
                ),
            ));
        }
    }
}

/// The cgroup path of a slice unit: systemd nests `a-b.slice` in
/// `a.slice`, so `a-b.slice` is at `a.slice/a-b.slice`.
pub fn slice_cgroup_path(slice: &str) -> PathBuf {
    let stem = slice.strip_suffix(".slice").unwrap_or(slice);
    let mut path = PathBuf::new();
    if stem == "-" {
        return path;
    }
    let mut prefix = String::new();
    for part in stem.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push(format!("{prefix}.slice"));
    }
    path
}

/// `[limits]` is enforced by the cgroup controllers (memory for
/// memory_max, cpu for cpus_max, pids for tasks_max). systemd enables a
/// controller down to a job's unit on demand, but only one its parent
/// cgroup has: so the controllers the slice's parent lists (a container
/// may be delegated fewer than the kernel has) are what jobs can get; the
/// slice's own list is added when the slice is up.
fn check_controllers(config: &Config, cgroup_root: &Path, findings: &mut Vec<Finding>) {
    let limits = &config.limits;
    let first = |global: bool, user: fn(&crate::resources::UserLimits) -> bool, field: &str| {
        if global {
            Some(format!("limits.{field}"))
        } else {
            limits
                .users
                .iter()
                .find(|(_, u)| user(u))
                .map(|(name, _)| format!("limits.users.{name}.{field}"))
        }
    };
    let wanted: Vec<(&str, &str, String)> = [
        (
            "memory",
            "MemoryMax=",
            first(
                limits.memory_max.is_some(),
                |u| u.memory_max.is_some(),
                "memory_max",
            ),
        ),
        (
            "cpu",
            "CPUQuota=",
            first(
                limits.cpus_max.is_some(),
                |u| u.cpus_max.is_some(),
                "cpus_max",
            ),
        ),
        (
            "pids",
            "TasksMax=",
            first(
                limits.tasks_max.is_some(),
                |u| u.tasks_max.is_some(),
                "tasks_max",
            ),
        ),
    ]
    .into_iter()
    .filter_map(|(controller, property, key)| key.map(|k| (controller, property, k)))
    .collect();
    if wanted.is_empty() {
        return;
    }
    let slice_path = cgroup_root.join(slice_cgroup_path(&config.slice));
    // The nearest existing ancestor: a nested slice's parents may not be
    // up yet either.
    let parent = slice_path
        .ancestors()
        .skip(1)
        .take_while(|p| p.starts_with(cgroup_root))
        .find(|p| p.join("cgroup.controllers").exists());
    let Some(parent) = parent else {
        findings.push(Finding::warning(
            &wanted[0].2,
            format!(
                "cannot read {}: cgroup v2 is not mounted there, so the limits in [limits] \
                 may not be enforced; ptraind needs the unified cgroup hierarchy \
                 (systemd.unified_cgroup_hierarchy=1)",
                cgroup_root.join("cgroup.controllers").display()
            ),
        ));
        return;
    };
    let read = |dir: &Path| -> BTreeSet<String> {
        std::fs::read_to_string(dir.join("cgroup.controllers"))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    let mut available = read(parent);
    available.extend(read(&slice_path));
    let listed = if available.is_empty() {
        "none".to_owned()
    } else {
        available.iter().cloned().collect::<Vec<_>>().join(" ")
    };
    for (controller, property, key) in wanted {
        if available.contains(controller) {
            continue;
        }
        findings.push(Finding::warning(
            key,
            format!(
                "cannot be enforced: the {controller} cgroup controller is not available to \
                 {} ({} lists: {listed}), so jobs' {property} would be ignored; enable it \
                 (in a container, delegate it from the host) or remove the limit",
                config.slice,
                parent.join("cgroup.controllers").display()
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn host(dir: &Path) -> Host {
        Host {
            cgroup_root: dir.to_owned(),
            inventory: Ok(("declared", vec![])),
            user_exists: |name| name == "root" || name == "alice",
            group_exists: |name| name == "root",
        }
    }

    /// The config in `text`, written to `dir/ptrain.toml` with `mode`.
    fn config(dir: &Path, text: &str, mode: u32) -> Config {
        let path = dir.join("ptrain.toml");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        Config::load(&path).unwrap()
    }

    fn keys(findings: &[Finding], severity: Severity) -> Vec<&str> {
        findings
            .iter()
            .filter(|f| f.severity == severity)
            .map(|f| f.key.as_str())
            .collect()
    }

    fn controllers(dir: &Path, list: &str) {
        std::fs::write(dir.join("cgroup.controllers"), list).unwrap();
    }

    #[test]
    fn a_plain_config_has_no_findings() {
        let dir = tempfile::tempdir().unwrap();
        controllers(dir.path(), "cpuset cpu io memory pids");
        let c = config(dir.path(), "[limits]\nmemory_max = \"8G\"\n", 0o644);
        assert_eq!(check(&c, &host(dir.path())), vec![]);
    }

    #[test]
    fn missing_and_open_secret_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open.secret");
        std::fs::write(&open, "s\n").unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        let text = format!(
            "[channels.hook]\nkind = \"webhook\"\nurl = \"https://h/\"\n\
             secret_file = \"{}\"\ntoken_file = \"{}\"\nca_file = \"/nonexistent/ca.pem\"\n",
            dir.path().join("missing.secret").display(),
            open.display()
        );
        let c = config(dir.path(), &text, 0o644);
        let f = check(&c, &host(dir.path()));
        assert_eq!(
            keys(&f, Severity::Error),
            [
                "channels.hook.secret_file",
                "channels.hook.token_file",
                "channels.hook.ca_file"
            ],
            "{f:?}"
        );
        assert!(f[0].message.contains("No such file") && f[0].message.contains("install -m 600"));
        assert!(f[1].message.contains("chmod 600"), "{f:?}");
        let shown = f[0].render(Path::new("/etc/ptrain/ptrain.toml"));
        assert!(
            shown.starts_with(
                "error: config /etc/ptrain/ptrain.toml: key `channels.hook.secret_file`: cannot read"
            ),
            "{shown}"
        );
    }

    #[test]
    fn a_config_holding_a_key_must_be_root_only_and_none_may_be_writable() {
        let dir = tempfile::tempdir().unwrap();
        let robot = "[channels.ops]\nkind = \"wecom\"\nurl = \"https://h/send?key=k\"\n";
        let f = check(&config(dir.path(), robot, 0o644), &host(dir.path()));
        assert_eq!(keys(&f, Severity::Error), ["channels.ops.url"], "{f:?}");
        assert!(f[0].message.contains("chmod 600"), "{f:?}");
        assert_eq!(
            check(&config(dir.path(), robot, 0o600), &host(dir.path())),
            vec![]
        );
        // Without a secret a readable config is fine; a writable one never.
        assert_eq!(
            check(&config(dir.path(), "", 0o644), &host(dir.path())),
            vec![]
        );
        let f = check(&config(dir.path(), "", 0o666), &host(dir.path()));
        assert_eq!(keys(&f, Severity::Error), [""], "{f:?}");
        assert!(f[0].message.contains("chmod go-w"), "{f:?}");
    }

    #[test]
    fn a_shared_slice_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        for slice in [
            "system.slice",
            "user.slice",
            "user-1000.slice",
            "-.slice",
            "machine.slice",
        ] {
            let c = config(dir.path(), &format!("slice = {slice:?}\n"), 0o644);
            let f = check(&c, &host(dir.path()));
            assert_eq!(keys(&f, Severity::Error), ["slice"], "{slice}: {f:?}");
            assert!(f[0].message.contains("ptrain.slice"), "{f:?}");
        }
        let c = config(dir.path(), "slice = \"system-ptrain.slice\"\n", 0o644);
        assert_eq!(check(&c, &host(dir.path())), vec![]);
    }

    #[test]
    fn allowed_gpus_are_checked_against_the_inventory() {
        let dir = tempfile::tempdir().unwrap();
        let text = "[policy.users.alice]\nallowed_gpus = [0, 3]\n[gpus]\nbackend = \"declared\"\n\
                    [[gpus.declared]]\nindex = 0\nuuid = \"GPU-0\"\nname = \"G\"\nmemory_mib = 1\ndevice = \"/dev/null\"\n";
        let c = config(dir.path(), text, 0o644);
        let snapshot = |backend: &'static str| {
            let inventory = crate::gpu::DeclaredInventory::new(c.gpus.declared.clone());
            Ok((backend, inventory.snapshot().unwrap()))
        };
        let mut h = host(dir.path());
        h.inventory = snapshot("declared");
        let f = check(&c, &h);
        assert_eq!(
            keys(&f, Severity::Error),
            ["policy.users.alice.allowed_gpus[1]"],
            "{f:?}"
        );
        assert!(f[0].message.contains("indices: 0"), "{f:?}");
        // What NVML does not see now is a warning: it may be back soon;
        // so is what `auto` misses while it falls back to the declared list.
        let with_backend = |backend: &str| {
            let text = text.replace("backend = \"declared\"", &format!("backend = {backend:?}"));
            config(dir.path(), &text, 0o644)
        };
        let (nvml, auto) = (with_backend("nvml"), with_backend("auto"));
        for (c, backend) in [(&nvml, "nvml"), (&auto, "declared")] {
            h.inventory = snapshot(backend);
            let f = check(c, &h);
            assert_eq!(
                keys(&f, Severity::Warning),
                ["policy.users.alice.allowed_gpus[1]"],
                "{f:?}"
            );
            assert!(keys(&f, Severity::Error).is_empty(), "{f:?}");
        }
        // No inventory at all: said once, as a warning.
        h.inventory = Err("NVML is not loaded".into());
        let f = check(&c, &h);
        assert_eq!(keys(&f, Severity::Warning), ["gpus"]);
        assert!(f[0].message.contains("NVML is not loaded"), "{f:?}");
    }

    #[test]
    fn a_declared_gpu_without_its_node_is_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let text = "[gpus]\nbackend = \"declared\"\n\
                    [[gpus.declared]]\nindex = 0\nuuid = \"GPU-0\"\nname = \"G\"\nmemory_mib = 1\ndevice = \"/dev/null\"\n\
                    [[gpus.declared]]\nindex = 1\nuuid = \"GPU-1\"\nname = \"G\"\nmemory_mib = 1\ndevice = \"/dev/ptrain-test-nvidia1\"\n";
        let c = config(dir.path(), text, 0o644);
        let h = Host {
            inventory: read_inventory(&c.gpus),
            ..host(dir.path())
        };
        let f = check(&c, &h);
        assert_eq!(
            keys(&f, Severity::Warning),
            ["gpus.declared[1].device"],
            "{f:?}"
        );
        assert!(f[0].message.contains("/dev/ptrain-test-nvidia1"), "{f:?}");
        assert!(keys(&f, Severity::Error).is_empty());
    }

    #[test]
    fn rules_for_unknown_accounts_are_warnings() {
        let dir = tempfile::tempdir().unwrap();
        let text = "[policy.users.alice]\nmax_gpus = 1\n[policy.users.alcie]\nmax_gpus = 1\n\
                    [policy.groups.studnets]\nmax_gpus = 1\n[limits.users.bob]\ntasks_max = 10\n\
                    [notify]\nowner_email = { carol = \"c@example.com\" }\n";
        controllers(dir.path(), "pids");
        let f = check(&config(dir.path(), text, 0o644), &host(dir.path()));
        assert_eq!(
            keys(&f, Severity::Warning),
            [
                "policy.users.alcie",
                "limits.users.bob",
                "notify.owner_email.carol",
                "policy.groups.studnets"
            ],
            "{f:?}"
        );
        assert!(f[0].message.contains("getent passwd alcie"), "{f:?}");
    }

    #[test]
    fn a_stream_among_the_default_channels_is_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let text = "[notify]\ndefault_channels = [\"ops\", \"bus\"]\n\
                    [channels.ops]\nkind = \"webhook\"\nurl = \"https://h.example/ops\"\n\
                    [channels.bus]\nkind = \"amqp\"\nurl = \"amqp://r/%2f\"\nexchange = \"x\"\n";
        controllers(dir.path(), "pids");
        let f = check(&config(dir.path(), text, 0o644), &host(dir.path()));
        assert_eq!(
            keys(&f, Severity::Warning),
            ["notify.default_channels[1]"],
            "{f:?}"
        );
        assert!(f[0].message.contains("is a stream"), "{f:?}");
        assert!(keys(&f, Severity::Error).is_empty(), "{f:?}");
    }

    #[test]
    fn slice_paths_nest_like_systemd() {
        assert_eq!(slice_cgroup_path("ptrain.slice"), Path::new("ptrain.slice"));
        assert_eq!(
            slice_cgroup_path("system-ptrain.slice"),
            Path::new("system.slice/system-ptrain.slice")
        );
        assert_eq!(slice_cgroup_path("-.slice"), Path::new(""));
    }

    #[test]
    fn limits_without_their_controller_are_warnings() {
        let dir = tempfile::tempdir().unwrap();
        let text =
            "[limits]\nmemory_max = \"8G\"\n[limits.users.alice]\ncpus_max = 2\ntasks_max = 100\n";
        // A container delegated only cpuset, io and pids.
        controllers(dir.path(), "cpuset io pids\n");
        let c = config(dir.path(), text, 0o644);
        let f = check(&c, &host(dir.path()));
        assert_eq!(
            keys(&f, Severity::Warning),
            ["limits.memory_max", "limits.users.alice.cpus_max"],
            "{f:?}"
        );
        assert!(
            f[0].message.contains("memory cgroup controller")
                && f[0].message.contains("MemoryMax=")
                && f[0].message.contains("cpuset io pids"),
            "{f:?}"
        );
        // The slice's own list counts once the slice is up; a nested
        // slice's missing parents are skipped to the nearest one there.
        std::fs::create_dir(dir.path().join("ptrain.slice")).unwrap();
        controllers(&dir.path().join("ptrain.slice"), "cpu memory pids");
        assert_eq!(check(&c, &host(dir.path())), vec![]);
        let nested = config(
            dir.path(),
            &format!("slice = \"lab-gpu.slice\"\n{text}"),
            0o644,
        );
        assert_eq!(check(&nested, &host(dir.path())).len(), 2);
        // No cgroup v2 at all: one warning that says so.
        let empty = tempfile::tempdir().unwrap();
        let f = check(&c, &host(empty.path()));
        assert_eq!(keys(&f, Severity::Warning), ["limits.memory_max"]);
        assert!(f[0].message.contains("cgroup v2"), "{f:?}");
    }
}
