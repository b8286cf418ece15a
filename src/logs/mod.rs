//! Job output: reading and following it, the idle-output watchdog, and
//! per-job archives that outlive the journal.
//!
//! A job's stdout and stderr go to journald (`ptrain-job@ID.service`).
//! Users cannot read the system journal, so ptraind serves it:
//! `ptrain logs` calls `OpenLogs` and gets the read end of a pipe that
//! `serve` fills from the journal (or the archive) as root, following a
//! running job until it ends. Which entries are one run is decided in
//! [`journal`].
//!
//! The daemon's state task talks to this module through [`Logs`] only:
//! [`Logs::job_changed`] on every state change (start watching for idle
//! output, archive at the end, wake followers) and an `on_idle` callback
//! when a job wrote nothing for its `idle_timeout` ([`idle`]). Archives
//! and their retention live on their own thread ([`archive`],
//! [`retention`]); nothing here blocks the state task.

pub mod archive;
pub mod idle;
pub mod journal;
pub mod resume;
pub mod retention;
pub mod sd_journal;
mod serve;

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::Deserialize;
use tokio::sync::{broadcast, mpsc};
use tracing::{error, warn};

use crate::gpu::GpuInfo;
use crate::setting::InvalidSetting;
use crate::store::{JobRecord, JobState};
use crate::views::JobView;
use archive::{ArchiveCatalog, ArchiveJob, LogUsage};
use idle::IdleCommand;
use journal::Selection;
use retention::{MinFree, RetentionPolicy};

/// Why a job's output cannot be served; the D-Bus face turns it into an
/// error for the CLI.
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    #[error("too many `ptrain logs` readers open (at most {MAX_READERS_PER_USER} per user, {MAX_READERS} in all); end some and try again")]
    TooManyReaders,
    #[error("cannot create a pipe for the output: {0}")]
    Pipe(std::io::Error),
    /// The pipe's read end could not be registered with the runtime.
    #[error("{0}")]
    OpenPipe(std::io::Error),
    #[error("cannot read the output: {0}")]
    Read(std::io::Error),
    #[error("the log archive is not available ({} could not be set up; see `journalctl -u ptraind`)", .0.display())]
    ArchiveUnavailable(PathBuf),
}

/// How a follower that fell behind the change broadcast learns where a
/// job stands now: the caller's (the D-Bus face asks the state task).
/// An error ends the reader with it.
pub type JobLookup =
    Arc<dyn Fn(String) -> BoxFuture<'static, std::io::Result<JobOutput>> + Send + Sync>;

/// `ptrain logs` readers one user may have open at once, and all users.
const MAX_READERS_PER_USER: usize = 16;
const MAX_READERS: usize = 256;
/// Most bytes the string-returning `Logs` call returns.
const MAX_STRING_BYTES: usize = 8 << 20;
/// A GPU above this utilization (percent) is busy: with
/// `idle_requires_gpu_idle` its silent job is left running.
pub const GPU_BUSY_PCT: u32 = 5;

/// `[logs]` as written in ptrain.toml.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLogsConfig {
    archive: Option<bool>,
    max_age: Option<String>,
    max_total_size: Option<SizeValue>,
    max_count: Option<u64>,
    user_max_total_size: Option<SizeValue>,
    user_max_count: Option<u64>,
    min_free: Option<SizeValue>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

/// `[logs]`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogsConfig {
    /// Copy each ended job's output into `log_dir`.
    pub archive: bool,
    pub retention: RetentionPolicy,
}

impl Default for LogsConfig {
    fn default() -> Self {
        LogsConfig {
            archive: true,
            retention: RetentionPolicy::default(),
        }
    }
}

impl RawLogsConfig {
    /// Errors are (key, message with the fix).
    pub fn validate(self) -> Result<LogsConfig, InvalidSetting> {
        let bad = |key: &str, message: String| InvalidSetting::new(format!("logs.{key}"), message);
        let size = |key: &str, v: Option<SizeValue>| -> Result<Option<u64>, InvalidSetting> {
            match v {
                None => Ok(None),
                Some(SizeValue::Bytes(b)) => Ok(Some(b)),
                Some(SizeValue::Text(t)) => crate::resources::parse_size(&t)
                    .map(Some)
                    .map_err(|m| bad(key, m)),
            }
        };
        let defaults = RetentionPolicy::default();
        let max_age_secs = match self.max_age.as_deref().map(str::trim) {
            None => defaults.max_age_secs,
            Some("off" | "none") => None,
            Some(t) => Some(
                humantime::parse_duration(t)
                    .map_err(|e| {
                        bad(
                            "max_age",
                            format!(
                                "{t:?} is not a duration ({e}); write e.g. \"30d\", or \"off\""
                            ),
                        )
                    })?
                    .as_secs()
                    .max(1),
            ),
        };
        let min_free = match self.min_free {
            None => defaults.min_free,
            Some(SizeValue::Text(t)) if t.trim().ends_with('%') => {
                let pct = t.trim().trim_end_matches('%').trim();
                match pct.parse::<u8>() {
                    Ok(p) if p <= 90 => MinFree::Percent(p),
                    _ => {
                        return Err(bad(
                            "min_free",
                            format!("{t:?} is not a percentage from 0% to 90%; write e.g. \"10%\" or \"5G\""),
                        ))
                    }
                }
            }
            other => MinFree::Bytes(size("min_free", other)?.unwrap_or(0)),
        };
        Ok(LogsConfig {
            archive: self.archive.unwrap_or(true),
            retention: RetentionPolicy {
                max_age_secs,
                max_total_bytes: size("max_total_size", self.max_total_size)?,
                max_count: self.max_count,
                user_max_total_bytes: size("user_max_total_size", self.user_max_total_size)?,
                user_max_count: self.user_max_count,
                min_free,
            },
        })
    }
}

/// The job's GPUs that are busy (utilization above [`GPU_BUSY_PCT`]);
/// a GPU whose utilization is unknown is not proof of work.
pub fn busy_gpus(gpus: &[u32], snapshot: &[GpuInfo]) -> Vec<u32> {
    snapshot
        .iter()
        .filter(|g| gpus.contains(&g.index))
        .filter(|g| g.utilization_pct.is_some_and(|u| u > GPU_BUSY_PCT))
        .map(|g| g.index)
        .collect()
}

/// `ptrain logs --since`: a duration ago ("10m", "2h") or a time
/// ("2026-05-01T12:00:00Z", "2026-05-01 12:00:00" in UTC); µs.
pub fn parse_since(text: &str, now_us: u64) -> Result<u64, String> {
    let t = text.trim();
    if let Ok(d) = humantime::parse_duration(t) {
        return Ok(now_us.saturating_sub(d.as_micros() as u64));
    }
    humantime::parse_rfc3339_weak(t)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_micros() as u64)
        .ok_or_else(|| {
            format!("--since {text:?} is neither a duration like \"10m\" nor a UTC time like \"2026-05-01 12:00:00\"")
        })
}

/// What a reader asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// Only the last N lines (0: all).
    pub lines: u32,
    /// Only lines at or after this time, µs (0: all).
    pub since_us: u64,
    /// Keep streaming until the job ends.
    pub follow: bool,
}

/// A job as its output readers need it; broadcast on every change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobOutput {
    pub id: String,
    pub uid: u32,
    pub unit: String,
    pub invocation_id: Option<String>,
    pub started_at: Option<u64>,
    /// No more output will come.
    pub ended: bool,
    /// Known by its archive only (`[retention]` compacted the job): the
    /// journal is never read for it, as the unit name may since have run
    /// another job of the same id.
    pub archive_only: bool,
}

impl JobOutput {
    pub fn of_view(v: &JobView) -> JobOutput {
        JobOutput {
            id: v.id.clone(),
            uid: v.uid,
            unit: v.unit.clone(),
            invocation_id: v.invocation_id.clone(),
            started_at: v.started_at,
            ended: !crate::job::Outcome::is_active(&v.status),
            archive_only: false,
        }
    }

    pub fn of_record(r: &JobRecord) -> JobOutput {
        JobOutput {
            id: r.id.to_string(),
            uid: r.owner.uid,
            unit: r.unit.clone(),
            invocation_id: r.invocation_id.clone(),
            started_at: r.started_at,
            ended: r.state == JobState::Ended,
            archive_only: false,
        }
    }

    /// The output of the job's attempt `attempt`, ended: this one's when
    /// it is the current attempt, else the earlier one's by its
    /// invocation. None: no such attempt (or its details are hidden).
    pub fn of_attempt(v: &JobView, attempt: u32) -> Option<JobOutput> {
        if attempt == v.attempt {
            return Some(JobOutput::of_view(v));
        }
        let earlier = v.attempts.iter().find(|a| a.attempt == attempt)?;
        Some(JobOutput::of_earlier(&v.id, v.uid, &v.unit, earlier))
    }

    fn of_earlier(id: &str, uid: u32, unit: &str, a: &crate::store::Attempt) -> JobOutput {
        JobOutput {
            id: id.to_owned(),
            uid,
            unit: unit.to_owned(),
            invocation_id: a.invocation_id.clone(),
            started_at: a.started_at,
            ended: true,
            archive_only: false,
        }
    }

    /// The journal entries of this run; None if it never started.
    pub fn selection(&self) -> Option<Selection> {
        Some(Selection {
            unit: self.unit.clone(),
            invocation_id: self.invocation_id.clone(),
            started_at: self.started_at?,
        })
    }
}

/// Keeps the last `n` items; with `n == 0` passes every item through.
pub(crate) struct Tail {
    n: usize,
    kept: VecDeque<String>,
}

impl Tail {
    pub(crate) fn new(n: u32) -> Tail {
        Tail {
            n: n as usize,
            kept: VecDeque::new(),
        }
    }

    /// Returns the item back when it is to be written at once.
    pub(crate) fn push(&mut self, item: String) -> Option<String> {
        if self.n == 0 {
            return Some(item);
        }
        if self.kept.len() == self.n {
            self.kept.pop_front();
        }
        self.kept.push_back(item);
        None
    }

    pub(crate) fn drain(&mut self) -> impl Iterator<Item = String> + '_ {
        self.kept.drain(..)
    }
}

/// The daemon's handle on everything here. Cheap to clone.
#[derive(Clone)]
pub struct Logs {
    inner: Arc<Inner>,
}

struct Inner {
    log_dir: PathBuf,
    default_idle_timeout: Option<Duration>,
    changes: broadcast::Sender<JobOutput>,
    idle: mpsc::UnboundedSender<IdleCommand>,
    archiver: Option<std::sync::mpsc::Sender<ArchiveJob>>,
    /// What is archived, read without waiting for the archiver.
    catalog: Option<ArchiveCatalog>,
    readers: Mutex<HashMap<u32, usize>>,
}

/// One open reader, counted against its user's limit until dropped.
struct ReaderSlot {
    inner: Arc<Inner>,
    uid: u32,
}

impl Drop for ReaderSlot {
    fn drop(&mut self) {
        let mut readers = self.inner.readers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = readers.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                readers.remove(&self.uid);
            }
        }
    }
}

/// Creates the log directory (root, 0700) or checks the one there.
fn prepare_log_dir(path: &std::path::Path) -> Result<(), String> {
    crate::fsutil::ensure_dir(path, 0o700).map_err(|e| e.to_string())?;
    let dir = crate::fsutil::open_dir(path).map_err(|e| e.to_string())?;
    let st = crate::fsutil::fstat(&dir).map_err(|e| e.to_string())?;
    // SAFETY: geteuid has no preconditions.
    if st.uid != unsafe { libc::geteuid() } {
        return Err(format!("it belongs to uid {}, not to ptraind", st.uid));
    }
    if st.mode & 0o077 != 0 {
        use std::os::fd::AsRawFd;
        // Ours, only too open: close it (it holds other users' output).
        // SAFETY: fchmod on a valid fd.
        if unsafe { libc::fchmod(dir.as_raw_fd(), 0o700) } != 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        warn!(log_dir = %path.display(), "log directory was open to others; set it to 0700");
    }
    Ok(())
}

/// What [`Logs::start`] takes of the config: the logs' own settings only
/// (`From<&Config>` is the config's).
#[derive(Clone, Debug)]
pub struct LogSettings {
    pub log_dir: PathBuf,
    pub logs: LogsConfig,
    /// The slice the job units run in, which the idle watchdog watches.
    pub slice: String,
    /// `[jobs] idle_timeout`: the default for jobs that set none.
    pub idle_timeout: Option<Duration>,
}

impl Logs {
    /// Prepares the log directory and starts the archiver thread and the
    /// idle-output watchdog; `on_idle` gets the unit of each job silent
    /// for its whole `idle_timeout`. Must run inside the tokio runtime.
    pub fn start(
        settings: impl Into<LogSettings>,
        on_idle: impl Fn(String) + Send + 'static,
    ) -> Logs {
        let config = settings.into();
        let (archiver, catalog) = match prepare_log_dir(&config.log_dir) {
            Ok(()) => {
                let (archiver, catalog) = archive::spawn_archiver(
                    config.log_dir.clone(),
                    config.logs.retention.clone(),
                    config.logs.archive,
                );
                (Some(archiver), Some(catalog))
            }
            Err(e) => {
                error!(log_dir = %config.log_dir.display(), error = %e,
                    "cannot use the log directory: {e}; job output is not archived (make it a root-only directory, or set log_dir)");
                (None, None)
            }
        };
        let (idle_tx, idle_rx) = mpsc::unbounded_channel();
        tokio::spawn(idle::run(config.slice.clone(), idle_rx, on_idle));
        let (changes, _) = broadcast::channel(1024);
        Logs {
            inner: Arc::new(Inner {
                log_dir: config.log_dir.clone(),
                default_idle_timeout: config.idle_timeout,
                changes,
                idle: idle_tx,
                archiver,
                catalog,
                readers: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The idle timeout that applies to a job: its own, else the default.
    pub fn idle_timeout_of(&self, record: &JobRecord) -> Option<Duration> {
        record.spec.idle_timeout.or(self.inner.default_idle_timeout)
    }

    /// Every state change of a job (from the state task; never blocks).
    pub fn job_changed(&self, record: &JobRecord) {
        let _ = self.inner.changes.send(JobOutput::of_record(record));
        match record.state {
            JobState::Running => self.watch(record),
            JobState::Ended => {
                let _ = self.inner.idle.send(IdleCommand::Untrack {
                    unit: record.unit.clone(),
                });
                let output = JobOutput::of_record(record);
                if let (Some(selection), Some(archiver)) =
                    (output.selection(), &self.inner.archiver)
                {
                    let _ = archiver.send(ArchiveJob {
                        id: output.id,
                        uid: output.uid,
                        selection,
                    });
                }
            }
            // Queued again as its next attempt: not watched while it
            // waits (a retry's backoff); its run is watched anew. The
            // attempt that ended is archived under its invocation, so
            // `ptrain logs --attempt N` reads it after the journal rotated.
            JobState::Queued => {
                let _ = self.inner.idle.send(IdleCommand::Untrack {
                    unit: record.unit.clone(),
                });
                let ended = record.attempts.last().map(|a| {
                    JobOutput::of_earlier(record.id.as_str(), record.owner.uid, &record.unit, a)
                });
                if let (Some(output), Some(archiver)) = (ended, &self.inner.archiver) {
                    if let Some(selection) = output.selection() {
                        let _ = archiver.send(ArchiveJob {
                            id: output.id,
                            uid: output.uid,
                            selection,
                        });
                    }
                }
            }
            JobState::Launching => {}
        }
    }

    /// Jobs found running at start: watched again from now on.
    pub fn restored<'a>(&self, records: impl IntoIterator<Item = &'a JobRecord>) {
        for r in records {
            if r.state == JobState::Running {
                self.watch(r);
            }
        }
    }

    fn watch(&self, record: &JobRecord) {
        if let Some(timeout) = self.idle_timeout_of(record) {
            self.rearm(&record.unit, timeout);
        }
    }

    /// Watches a unit for a new idle window starting now (after a reprieve).
    pub fn rearm(&self, unit: &str, timeout: Duration) {
        let _ = self.inner.idle.send(IdleCommand::Track {
            unit: unit.to_owned(),
            timeout,
        });
    }

    /// Subscribe before looking a job up, so no change falls in between.
    pub fn subscribe(&self) -> broadcast::Receiver<JobOutput> {
        self.inner.changes.subscribe()
    }

    fn reader_slot(&self, uid: u32) -> Result<ReaderSlot, LogsError> {
        let mut readers = self.inner.readers.lock().unwrap_or_else(|e| e.into_inner());
        let total: usize = readers.values().sum();
        let mine = readers.get(&uid).copied().unwrap_or(0);
        if mine >= MAX_READERS_PER_USER || total >= MAX_READERS {
            return Err(LogsError::TooManyReaders);
        }
        *readers.entry(uid).or_default() += 1;
        Ok(ReaderSlot {
            inner: self.inner.clone(),
            uid,
        })
    }

    /// Starts serving a job's output; returns the pipe's read end for the
    /// caller. Access is checked by the caller (owner or root).
    pub fn open(
        &self,
        job: JobOutput,
        caller_uid: u32,
        opts: ReadOptions,
        changes: broadcast::Receiver<JobOutput>,
        lookup: JobLookup,
    ) -> Result<OwnedFd, LogsError> {
        let slot = self.reader_slot(caller_uid)?;
        let (read_end, write_end) = pipe().map_err(LogsError::Pipe)?;
        let log_dir = self.inner.log_dir.clone();
        tokio::spawn(async move {
            serve::serve(log_dir, job, opts, changes, lookup, write_end).await;
            drop(slot);
        });
        Ok(read_end)
    }

    /// The output as one string (at most 8 MiB), for the older `Logs` call.
    pub async fn read_to_string(
        &self,
        job: JobOutput,
        caller_uid: u32,
        lines: u32,
        lookup: JobLookup,
    ) -> Result<String, LogsError> {
        use tokio::io::AsyncReadExt;
        let opts = ReadOptions {
            lines,
            ..ReadOptions::default()
        };
        let fd = self.open(job, caller_uid, opts, self.subscribe(), lookup)?;
        let reader =
            tokio::net::unix::pipe::Receiver::from_owned_fd(fd).map_err(LogsError::OpenPipe)?;
        let mut out = Vec::new();
        reader
            .take(MAX_STRING_BYTES as u64)
            .read_to_end(&mut out)
            .await
            .map_err(LogsError::Read)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// The newest archive of a job ptraind no longer has a record of
    /// (`[retention]` compacted it), as the output to serve; None when
    /// there is none or the archiver is not running.
    pub async fn archived_output(&self, id: &str) -> Option<JobOutput> {
        // Only a job id can name an archive: anything else costs nothing.
        let unit = crate::spec::JobId::parse(id).ok()?.unit_name();
        let found = self.inner.catalog.as_ref()?.of_job(id).await?;
        let newest = found.into_iter().max_by_key(|a| a.written_at)?;
        Some(JobOutput {
            id: id.to_owned(),
            uid: newest.uid,
            unit,
            invocation_id: archive::invocation_of_name(&newest.name).map(str::to_owned),
            // What marks it as having run; the archive holds the times.
            started_at: Some(0),
            ended: true,
            archive_only: true,
        })
    }

    /// The retention policy and archive usage; a user sees only their own
    /// row besides the totals.
    pub async fn usage(&self, caller_uid: u32) -> Result<LogUsage, LogsError> {
        let unavailable = || LogsError::ArchiveUnavailable(self.inner.log_dir.clone());
        let catalog = self.inner.catalog.as_ref().ok_or_else(unavailable)?;
        let mut usage = catalog.usage().await.ok_or_else(unavailable)?;
        if caller_uid != 0 {
            // Only the caller's own, totals included: how much others keep
            // is theirs to know.
            usage.users.retain(|u| u.uid == caller_uid);
            usage.count = usage.users.iter().map(|u| u.count).sum();
            usage.bytes = usage.users.iter().map(|u| u.bytes).sum();
        }
        Ok(usage)
    }
}

/// A pipe with both ends blocking and close-on-exec.
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two fds or fails.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both fds are fresh and owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(text: &str) -> Result<LogsConfig, InvalidSetting> {
        toml::from_str::<RawLogsConfig>(text).unwrap().validate()
    }

    #[test]
    fn logs_config_defaults_and_values() {
        let c = raw("").unwrap();
        assert!(c.archive);
        assert_eq!(c.retention, RetentionPolicy::default());
        let c = raw(
            "archive = false\nmax_age = \"7d\"\nmax_total_size = \"10G\"\nmax_count = 100\n\
             user_max_total_size = 1048576\nuser_max_count = 5\nmin_free = \"5%\"\n",
        )
        .unwrap();
        assert!(!c.archive);
        let r = c.retention;
        assert_eq!(r.max_age_secs, Some(7 * 86400));
        assert_eq!(r.max_total_bytes, Some(10 << 30));
        assert_eq!((r.max_count, r.user_max_count), (Some(100), Some(5)));
        assert_eq!(r.user_max_total_bytes, Some(1 << 20));
        assert_eq!(r.min_free, MinFree::Percent(5));
        assert_eq!(
            raw("min_free = \"2G\"").unwrap().retention.min_free,
            MinFree::Bytes(2 << 30)
        );
        assert_eq!(
            raw("max_age = \"off\"").unwrap().retention.max_age_secs,
            None
        );
    }

    #[test]
    fn logs_config_errors_name_the_key() {
        for (text, key) in [
            ("max_age = \"soon\"", "logs.max_age"),
            ("min_free = \"95%\"", "logs.min_free"),
            ("max_total_size = \"10Q\"", "logs.max_total_size"),
        ] {
            let InvalidSetting { key: k, message: m } = raw(text).unwrap_err();
            assert_eq!(k, key, "{m}");
            assert!(m.contains("write") || m.contains("use"), "{m}");
        }
        assert!(toml::from_str::<RawLogsConfig>("max_ages = 1").is_err());
    }

    #[test]
    fn descriptor_accepts_idle_timeout() {
        let spec = crate::spec::parse_spec(
            br#"{"version": 1, "command": ["x"], "idle_timeout": "2s"}"#,
            "j",
        )
        .unwrap();
        assert_eq!(spec.idle_timeout, Some(Duration::from_secs(2)));
        let e = crate::spec::parse_spec(
            br#"{"version": 1, "command": ["x"], "idle_timeout": "x"}"#,
            "j",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("field `idle_timeout`"), "{e}");
        let none = crate::spec::parse_spec(br#"{"version": 1, "command": ["x"]}"#, "j").unwrap();
        assert_eq!(none.idle_timeout, None);
        let back: crate::spec::JobSpec =
            serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn only_known_busy_gpus_of_the_job_count() {
        let gpu = |index: u32, util: Option<u32>| -> GpuInfo {
            serde_json::from_value(json!({
                "index": index, "uuid": format!("GPU-{index}"), "name": "t",
                "pci_bus_id": null, "memory_total_mib": 1, "memory_used_mib": null,
                "utilization_pct": util, "temperature_c": null,
                "device": format!("/dev/nvidia{index}"), "processes": []
            }))
            .unwrap()
        };
        let snap = [
            gpu(0, Some(90)),
            gpu(1, Some(2)),
            gpu(2, None),
            gpu(3, Some(80)),
        ];
        assert_eq!(busy_gpus(&[0, 1, 2], &snap), [0]);
        assert!(busy_gpus(&[1, 2], &snap).is_empty());
    }

    #[test]
    fn since_is_a_duration_ago_or_a_utc_time() {
        let now = 1_000_000 * 1_000_000;
        assert_eq!(parse_since("10m", now), Ok(now - 600 * 1_000_000));
        assert_eq!(parse_since("1970-01-01 00:01:00", now), Ok(60 * 1_000_000));
        assert_eq!(parse_since("1970-01-01T00:01:00Z", now), Ok(60 * 1_000_000));
        assert!(parse_since("yesterday-ish", now)
            .unwrap_err()
            .contains("--since"));
    }

    #[test]
    fn tail_keeps_the_last_n() {
        let mut t = Tail::new(2);
        for s in ["a", "b", "c"] {
            assert!(t.push(s.into()).is_none());
        }
        assert_eq!(t.drain().collect::<Vec<_>>(), ["b", "c"]);
        let mut all = Tail::new(0);
        assert_eq!(all.push("x".into()), Some("x".into()));
    }
}
