//! The durable record of every job, one file per job, `STATE/jobs/ID.json`,
//! so that the cost of a change never grows with history: a state change
//! rewrites only that job's small file, whole, through the directory's
//! one spare ([`SpareDir`]). The file keeps the exact bytes the user
//! submitted beside the record. Exits written by a unit's recorder wait in
//! `STATE/exits/ID.json` until the end is recorded. Rejected spool files
//! go to `STATE/rejected/` with their reason.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::job::NotifyEvent;
pub use crate::job::{signal_name, signal_number, JobState, Outcome};

use crate::fsutil::{ensure_dir, fsync_dir, write_atomic, SpareDir};
use crate::spec::{JobId, JobSpec};
use crate::users::Owner;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("record {path} is corrupt: {message}; move it aside to let ptraind start")]
    Corrupt { path: PathBuf, message: String },
    #[error("job id {0} already exists")]
    Exists(JobId),
}

impl StoreError {
    /// True when the disk is full: the caller keeps the spool file and
    /// retries later instead of rejecting it.
    pub fn is_no_space(&self) -> bool {
        matches!(self, StoreError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC))
    }
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

/// Where a job came from, to recognise its own spool file after a crash
/// between the claim and the unlink (and never mistake a new file for it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpoolSource {
    pub file: String,
    pub dev: u64,
    pub ino: u64,
    pub ctime_ns: i128,
    pub size: u64,
}

/// A job's image, pulled, verified and unpacked ([`crate::images`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadyImage {
    /// The image manifest's digest: a tag is resolved once, at the pull,
    /// so every attempt (and a rerun naming the digest) runs the same
    /// image.
    pub digest: String,
    /// The root the job's unit runs in (`RootDirectory=`): the image's
    /// shared tree with the job's mount points
    /// ([`crate::images::runtime_root`]).
    pub rootfs: PathBuf,
    /// The image's `Entrypoint`, `Cmd` and `Env`, applied as `docker run`
    /// does ([`crate::images::manifest::launch_argv`], `merge_env`).
    pub run: crate::images::manifest::RunConfig,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignedGpu {
    pub index: u32,
    pub uuid: String,
    pub device: PathBuf,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: JobId,
    pub spec: JobSpec,
    pub owner: Owner,
    pub source: SpoolSource,
    /// Microseconds since the epoch, like every timestamp here.
    pub submitted_at: u64,
    pub state: JobState,
    pub unit: String,
    #[serde(default)]
    pub gpus: Vec<AssignedGpu>,
    #[serde(default)]
    pub invocation_id: Option<String>,
    #[serde(default)]
    pub main_pid: Option<u32>,
    #[serde(default)]
    pub started_at: Option<u64>,
    #[serde(default)]
    pub ended_at: Option<u64>,
    #[serde(default)]
    pub outcome: Option<Outcome>,
    /// systemd's own word for the end (`success`, `exit-code`, `timeout`...).
    #[serde(default)]
    pub systemd_result: Option<String>,
    #[serde(default)]
    pub stop_requested_by: Option<u32>,
    /// Set (to the idle timeout, seconds) before ptraind stops a job that
    /// wrote nothing for that long: its end is then `idle-timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_hit: Option<u64>,
    /// The cgroup limits the unit gets, fixed at submission.
    #[serde(default)]
    pub limits: crate::resources::EffectiveLimits,
    /// The sweep this job belongs to, and its parameter values.
    #[serde(default)]
    pub group: Option<JobId>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, String>,
    #[serde(default)]
    pub max_parallel: Option<u32>,
    /// What the job wrote to $PTRAIN_RESULT_FILE (a JSON object).
    #[serde(default)]
    pub result: Option<serde_json::Value>,
    /// Why the file at $PTRAIN_RESULT_FILE was not taken as its result
    /// (not JSON, not an object, too large, a symlink).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_error: Option<String>,
    /// The outbox: notification intents, written in the same save as the
    /// transition they announce. Delivery status is in `STATE/outbox/`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notifications: Vec<Intent>,
    /// What the job used, as its cgroup counted it at its end
    /// ([`Usage`]); absent in records written before accounting, and when
    /// the end left no figures (the unit never ran, or /run was lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// How busy the run kept each of its GPUs, sampled from NVML while it
    /// ran ([`crate::accounting::gpu`]); empty without NVML or samples.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_usage: Vec<GpuRunUsage>,
    /// The job's image once it is on disk (issue 21): the exact image that
    /// runs and the root the unit gets. `None` while a job with an
    /// `image` is pulling (it is not planned until then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ReadyImage>,
    /// The digest a new pull of the job's image must give: an attempt
    /// restarted after its image left the store runs the image it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pin: Option<String>,
    /// Held: queued, never planned, until released (`ptrain hold` and
    /// `release`; a descriptor's `hold: true` submits it so).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    /// Not planned before this moment (µs since the epoch): the
    /// descriptor's `begin`, resolved when it was claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begin_at: Option<u64>,
    /// Which attempt this is (1 for the first; a retry or requeue is
    /// the next, under the same id).
    #[serde(default = "first_attempt", skip_serializing_if = "is_first_attempt")]
    pub attempt: u32,
    /// The attempts before this one, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<Attempt>,
    /// When this attempt got its checkpoint signal (µs), before its
    /// timeout or a stop ptraind made: sent once per attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_sent_at: Option<u64>,
    /// When ptraind stops the job it asked to stop, its checkpoint lead
    /// after the signal (µs); a restart stops it then, or at once if
    /// that passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_at: Option<u64>,
    /// The queued job this one is stopped for ([`crate::preemption`]):
    /// its end is not its last, it runs again as its next attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_by: Option<JobId>,
    /// Frozen by `ptrain pause` (systemd's FreezeUnit), its GPUs kept.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

fn first_attempt() -> u32 {
    1
}

fn is_first_attempt(n: &u32) -> bool {
    *n == 1
}

/// An attempt that ended and was followed by another: how it ran and
/// ended, and its invocation (its output in the journal).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub attempt: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<u64>,
    pub ended_at: u64,
    pub outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub systemd_result: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    /// Why it runs again, in words.
    pub why: String,
}

/// A job's resource use over its run, read from its unit's cgroup when the
/// job's command ended (the watcher of `ptraind exec-job`,
/// [`crate::accounting::usage::start_watcher`]; `ptraind job-usage`, the
/// `ExecStopPost=` of units an older release started): CPU time (`cpu.stat`), the peak of its memory
/// (`memory.peak`) and the bytes it read and wrote (`io.stat`). Each is
/// absent when the kernel did not count it. Wall time and GPU-seconds are
/// not here: they follow from the record's start, end and GPUs
/// ([`JobRecord::wall_usec`], [`JobRecord::gpu_seconds`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_nsec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_peak_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_read_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_write_bytes: Option<u64>,
}

/// One GPU's NVML samples over a run, as its record keeps them: sums and
/// peaks, so that adding one is exact (`accounting::gpu` adds them and
/// makes the figures).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuRunUsage {
    pub index: u32,
    #[serde(default)]
    pub uuid: String,
    /// Samples taken (with or without each figure).
    pub samples: u32,
    #[serde(default)]
    pub util_samples: u32,
    #[serde(default)]
    pub util_sum_pct: u64,
    #[serde(default)]
    pub util_peak_pct: u32,
    #[serde(default)]
    pub mem_samples: u32,
    #[serde(default)]
    pub mem_sum_mib: u64,
    #[serde(default)]
    pub mem_peak_mib: u64,
}

impl JobRecord {
    /// Microseconds from the start of the job's command to its end, if it
    /// ran.
    pub fn wall_usec(&self) -> Option<u64> {
        let (start, end) = self.started_at.zip(self.ended_at)?;
        Some(end.saturating_sub(start))
    }

    /// GPU-seconds: the run's wall time times the GPUs it held (0 for a
    /// job that held none or never ran).
    pub fn gpu_seconds(&self) -> f64 {
        self.wall_usec()
            .map_or(0.0, |w| w as f64 / 1e6 * self.gpus.len() as f64)
    }

    pub fn new(spec: JobSpec, owner: Owner, source: SpoolSource, now: u64) -> JobRecord {
        JobRecord {
            held: spec.hold,
            image: None,
            image_pin: None,
            id: spec.id.clone(),
            unit: spec.id.unit_name(),
            spec,
            owner,
            source,
            submitted_at: now,
            state: JobState::Queued,
            gpus: Vec::new(),
            invocation_id: None,
            main_pid: None,
            started_at: None,
            ended_at: None,
            outcome: None,
            systemd_result: None,
            stop_requested_by: None,
            idle_timeout_hit: None,
            limits: Default::default(),
            group: None,
            params: BTreeMap::new(),
            max_parallel: None,
            result: None,
            result_error: None,
            notifications: Vec::new(),
            usage: None,
            gpu_usage: Vec::new(),
            begin_at: None,
            attempt: 1,
            attempts: Vec::new(),
            checkpoint_sent_at: None,
            stop_at: None,
            preempted_by: None,
            paused: false,
        }
    }

    /// `queued`, `launching`, `running`, or the outcome's status.
    pub fn status(&self) -> &'static str {
        match (&self.state, &self.outcome) {
            (JobState::Ended, Some(outcome)) => outcome.status(),
            (JobState::Ended, None) => "ended",
            (JobState::Queued, _) if self.spec.image.is_some() && self.image.is_none() => "pulling",
            (JobState::Queued, _) => "queued",
            (JobState::Launching, _) => "launching",
            (JobState::Running, _) => "running",
        }
    }
}

/// A notification of the job's outbox, recorded with the transition it
/// announces (the notifications deliver it; see [`crate::notifications`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    /// `JOB.EVENT.CHANNEL`, see [`crate::notifications::key_of`].
    pub key: String,
    pub channel: String,
    /// Microseconds since the epoch; the retry lifetime counts from here.
    pub created_at: u64,
    pub notice: Notice,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoticeGpu {
    pub index: u32,
    pub uuid: String,
}

/// The facts of one event, frozen when the intent is recorded, so a
/// message re-sent after a restart is byte-for-byte the same one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    pub job_id: String,
    pub owner: String,
    pub uid: u32,
    pub event: NotifyEvent,
    /// The job's status word (`succeeded`, `failed`, `running`...).
    pub status: String,
    /// A sentence: what happened and, on failure, why.
    pub detail: String,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub signal: Option<i32>,
    pub submitted_at: u64,
    #[serde(default)]
    pub started_at: Option<u64>,
    #[serde(default)]
    pub ended_at: Option<u64>,
    #[serde(default)]
    pub gpus: Vec<NoticeGpu>,
    pub host: String,
    pub unit: String,
    /// What the job wrote to its result file, if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<serde_json::Value>,
    /// The run's systemd invocation, to tell its output from another run's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation_id: Option<String>,
    /// The last lines of the job's output
    /// ([`crate::notifications::tail`]): None until the sender
    /// reads them, once, before the first attempt; then kept in the outbox
    /// copy so every attempt and a restart send the same bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tail: Option<Vec<String>>,
}

/// Why a spool file was refused, kept in quarantine for its owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectRecord {
    pub file: String,
    pub uid: Option<u32>,
    pub owner: Option<String>,
    pub rejected_at: u64,
    pub reason: String,
    /// Name of the quarantined copy of the bytes, when they were readable.
    pub saved_as: Option<String>,
    /// The refused file's device and inode (from fstat, else lstat): how
    /// `ptrain submit` knows the refusal is of the file it published.
    #[serde(default)]
    pub dev: Option<u64>,
    #[serde(default)]
    pub ino: Option<u64>,
    /// Its inode's change time (ns): with `dev` and `ino`, which file it
    /// was, so the same file refused again after a crash (before its
    /// spool entry went) is the same refusal, not a second one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctime_ns: Option<i64>,
    /// The `refused` event's intents (one per stream channel that takes
    /// it), durable in the same write as the refusal: the quarantine is
    /// their outbox record, as a job's record is for its events.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notifications: Vec<Intent>,
}

impl RejectRecord {
    /// Which file was refused, when that is known.
    pub fn refused_file(&self) -> Option<RefusedFile> {
        Some(RefusedFile {
            dev: self.dev?,
            ino: self.ino?,
            ctime_ns: self.ctime_ns?,
            file: self.file.clone(),
        })
    }
}

/// A refused file's identity: its name and inode, as it was when refused.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RefusedFile {
    pub dev: u64,
    pub ino: u64,
    pub ctime_ns: i64,
    pub file: String,
}

/// One quarantine entry as ptraind keeps track of it.
pub struct QuarantineEntry {
    /// The entry's name ([`quarantine_name`]).
    pub name: String,
    pub uid: Option<u32>,
    pub notifications: Vec<Intent>,
    /// The file it is of, and when it was refused.
    pub refused: Option<(RefusedFile, u64)>,
}

/// What the unit's own ExecStopPost recorder (`ptraind record-exit`)
/// wrote when the job ended: the true result even when ptraind was down
/// and systemd has already collected the unit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitRecord {
    pub invocation_id: Option<String>,
    /// $SERVICE_RESULT: success, exit-code, signal, core-dump, timeout, ...
    pub service_result: String,
    /// $EXIT_CODE: exited, killed, dumped (empty if the process never ran).
    pub exit_code: String,
    /// $EXIT_STATUS: a number, or a signal name without "SIG".
    pub exit_status: String,
    pub recorded_at: u64,
    /// The job's result file, read by the recorder as the job's user.
    #[serde(default)]
    pub result: Option<serde_json::Value>,
}

impl ExitRecord {
    /// The same triple systemd reports over D-Bus: (Result, ExecMainCode,
    /// ExecMainStatus).
    pub fn as_unit_result(&self) -> (String, i32, i32) {
        let code = match self.exit_code.as_str() {
            "exited" => 1,
            "killed" => 2,
            "dumped" => 3,
            _ => 0,
        };
        let status = self
            .exit_status
            .parse::<i32>()
            .ok()
            .or_else(|| signal_number(&self.exit_status))
            .unwrap_or(0);
        (self.service_result.clone(), code, status)
    }
}

pub struct Store {
    /// `ID.json` per job: its record and the bytes it was submitted with.
    jobs: SpareDir,
    rejected_dir: PathBuf,
    exits_dir: PathBuf,
    groups_dir: PathBuf,
}

/// A job's file as written: its record, then the exact bytes it was
/// submitted with (a JSON string; as numbers in the one case they are not
/// UTF-8, which a parsed descriptor never is).
#[derive(Serialize)]
struct JobFileOut<'a, D: Serialize + ?Sized> {
    record: &'a JobRecord,
    descriptor: &'a D,
}

/// A job's file as read when only the record is wanted: the descriptor is
/// skipped over, never copied.
#[derive(Deserialize)]
struct JobFileRecord {
    record: JobRecord,
}

/// The descriptor as it stands in the file, to carry over verbatim when
/// the record is rewritten.
#[derive(Deserialize)]
struct JobFileDescriptor<'a> {
    #[serde(borrow)]
    descriptor: &'a serde_json::value::RawValue,
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Descriptor {
    Text(String),
    Bytes(Vec<u8>),
}

impl Descriptor {
    fn of(bytes: &[u8]) -> Descriptor {
        match std::str::from_utf8(bytes) {
            Ok(text) => Descriptor::Text(text.to_owned()),
            Err(_) => Descriptor::Bytes(bytes.to_vec()),
        }
    }

    fn into_bytes(self) -> Vec<u8> {
        match self {
            Descriptor::Text(text) => text.into_bytes(),
            Descriptor::Bytes(bytes) => bytes,
        }
    }
}

/// The name of a job's file in `STATE/jobs/`. A JobId is validated
/// ([A-Za-z0-9._-], never "." or ".."), and a name starting with a dot is
/// never a job's, so it is one safe path component apart from the spare.
pub fn job_file_name(id: &JobId) -> String {
    format!("{id}.json")
}

/// The bytes of a job's file (also used to seed history in benchmarks).
pub fn job_file_bytes(record: &JobRecord, descriptor: &[u8]) -> Vec<u8> {
    serde_json::to_vec(&JobFileOut {
        record,
        descriptor: &Descriptor::of(descriptor),
    })
    .expect("records always serialise")
}

impl Store {
    pub fn open(state_dir: &Path) -> Result<Store, StoreError> {
        let jobs_dir = state_dir.join("jobs");
        let rejected_dir = state_dir.join("rejected");
        let exits_dir = exits_dir(state_dir);
        let groups_dir = state_dir.join("groups");
        for dir in [state_dir, &jobs_dir, &rejected_dir, &exits_dir, &groups_dir] {
            ensure_dir(dir, 0o700).map_err(io_err("create directory", dir))?;
        }
        Ok(Store {
            jobs: SpareDir::open(&jobs_dir).map_err(io_err("open", &jobs_dir))?,
            rejected_dir,
            exits_dir,
            groups_dir,
        })
    }

    fn exit_path(&self, id: &JobId) -> PathBuf {
        self.exits_dir.join(format!("{id}.json"))
    }

    /// The exit a unit's recorder wrote for this job, if any.
    pub fn exit_record(&self, id: &JobId) -> Option<ExitRecord> {
        let bytes = std::fs::read(self.exit_path(id)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// The jobs with a recorder's file, to forget those already recorded.
    pub fn exit_record_ids(&self) -> Vec<JobId> {
        let Ok(entries) = std::fs::read_dir(&self.exits_dir) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                JobId::parse(name.strip_suffix(".json")?).ok()
            })
            .collect()
    }

    /// Forgets the recorder's file once its result is in the job's record:
    /// `exits/` holds only ends not yet recorded.
    pub fn remove_exit_record(&self, id: &JobId) {
        let _ = std::fs::remove_file(self.exit_path(id));
    }

    fn job_path(&self, id: &JobId) -> PathBuf {
        self.jobs.path().join(job_file_name(id))
    }

    pub fn exists(&self, id: &JobId) -> bool {
        self.jobs.exists(&job_file_name(id))
    }

    /// Every job record, in submission order (tests; ptraind streams them
    /// with [`Store::load_each`]).
    #[cfg(test)]
    pub fn load_all(&self) -> Result<Vec<JobRecord>, StoreError> {
        let mut records = Vec::new();
        self.load_each(|r| records.push(r))?;
        records.sort_by_key(|r| (r.submitted_at, r.id.clone()));
        Ok(records)
    }

    /// Reads every committed record and hands each to `each`, one at a
    /// time, in no particular order. Cleans up what a crash left
    /// half-done: members of a sweep whose group commit never happened
    /// (their spool file is still there and is claimed again). Moves jobs
    /// kept by an older ptraind (a directory each) into one file each.
    pub fn load_each(&self, mut each: impl FnMut(JobRecord)) -> Result<(), StoreError> {
        let jobs_dir = self.jobs.path();
        let entries = std::fs::read_dir(jobs_dir).map_err(io_err("read", jobs_dir))?;
        let mut group_committed: HashMap<JobId, bool> = HashMap::new();
        for entry in entries {
            let entry = entry.map_err(io_err("read", jobs_dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let path = entry.path();
            let record = if entry.file_type().is_ok_and(|t| t.is_dir()) {
                match self.move_legacy_dir(&name, &path)? {
                    Some(record) => record,
                    None => continue,
                }
            } else if name.ends_with(".json") {
                let bytes = std::fs::read(&path).map_err(io_err("read", &path))?;
                parse_record(&path, &bytes)?
            } else {
                continue;
            };
            if let Some(group) = &record.group {
                let committed = *group_committed
                    .entry(group.clone())
                    .or_insert_with(|| self.groups_dir.join(format!("{group}.json")).exists());
                if !committed {
                    tracing::warn!(job = %record.id, PTRAIN_JOB = %record.id, group = %group, "removing a member of a sweep whose claim did not complete; it will be claimed again");
                    self.jobs
                        .remove(&job_file_name(&record.id))
                        .map_err(io_err("remove", &self.job_path(&record.id)))?;
                    continue;
                }
            }
            each(record);
        }
        Ok(())
    }

    /// An older ptraind kept `jobs/ID/` with `record.json`,
    /// `descriptor.json` and the recorder's `exit.json`: the record and
    /// descriptor become `jobs/ID.json`, the exit moves to `exits/`. A
    /// directory without a record is a claim that never committed.
    fn move_legacy_dir(&self, name: &str, dir: &Path) -> Result<Option<JobRecord>, StoreError> {
        let remove_dir = || std::fs::remove_dir_all(dir).map_err(io_err("remove", dir));
        let Ok(id) = JobId::parse(name) else {
            tracing::warn!(dir = %dir.display(), "not a job's directory; leaving it");
            return Ok(None);
        };
        let record_path = dir.join("record.json");
        let bytes = match std::fs::read(&record_path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                tracing::warn!(dir = %dir.display(), "removing an uncommitted claim; its spool file will be claimed again");
                remove_dir()?;
                return Ok(None);
            }
            Err(e) => return Err(io_err("read", &record_path)(e)),
        };
        let record: JobRecord =
            serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
                path: record_path.clone(),
                message: e.to_string(),
            })?;
        let exit = dir.join("exit.json");
        if exit.exists() && !self.exit_path(&id).exists() {
            std::fs::rename(&exit, self.exit_path(&id)).map_err(io_err("move", &exit))?;
            fsync_dir(&self.exits_dir).map_err(io_err("sync", &self.exits_dir))?;
        }
        let name = job_file_name(&id);
        if !self.jobs.exists(&name) {
            let descriptor = std::fs::read(dir.join("descriptor.json")).unwrap_or_default();
            self.jobs
                .create(&name, &job_file_bytes(&record, &descriptor))
                .map_err(io_err("write", &self.job_path(&id)))?;
        }
        remove_dir()?;
        Ok(Some(record))
    }

    /// Durably records a new job: once this returns Ok the job exists and
    /// the spool file may be removed. One file, written whole.
    pub fn claim(&self, record: &JobRecord, descriptor: &[u8]) -> Result<(), StoreError> {
        match self.jobs.create(
            &job_file_name(&record.id),
            &job_file_bytes(record, descriptor),
        ) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Err(StoreError::Exists(record.id.clone()))
            }
            Err(e) => Err(io_err("write", &self.job_path(&record.id))(e)),
        }
    }

    /// Claims every member of a sweep, then commits the group with one
    /// durable marker: after a crash either all members exist or none.
    pub fn claim_group(
        &self,
        group: &JobId,
        members: &[JobRecord],
        descriptor: &[u8],
    ) -> Result<(), StoreError> {
        let mut claimed = Vec::new();
        let mut result = Ok(());
        for member in members {
            if let Err(e) = self.claim(member, descriptor) {
                result = Err(e);
                break;
            }
            claimed.push(&member.id);
        }
        if result.is_ok() {
            let ids: Vec<&str> = members.iter().map(|m| m.id.as_str()).collect();
            let bytes = serde_json::to_vec(&ids).expect("ids serialise");
            result = write_atomic(&self.groups_dir, &format!("{group}.json"), &bytes)
                .map_err(io_err("write", &self.groups_dir));
        }
        if result.is_err() {
            for id in claimed {
                let _ = self.jobs.remove(&job_file_name(id));
            }
        }
        result
    }

    /// Compacts a finished job: one summary line appended (and synced) to
    /// `history.jsonl`, then its file removed. Cost per job, never per
    /// history.
    pub fn compact(&self, record: &JobRecord) -> Result<(), StoreError> {
        use std::io::Write;
        let history = self.jobs.path().with_file_name("history.jsonl");
        let line = serde_json::json!({
            "id": record.id,
            "owner": record.owner.name,
            "uid": record.owner.uid,
            "status": record.status(),
            "outcome": record.outcome,
            "submitted_at": record.submitted_at,
            "started_at": record.started_at,
            "ended_at": record.ended_at,
            "group": record.group,
            "result": record.result,
        });
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&history)
            .map_err(io_err("open", &history))?;
        writeln!(file, "{line}")
            .and_then(|()| file.sync_data())
            .map_err(io_err("append to", &history))?;
        self.jobs
            .remove(&job_file_name(&record.id))
            .map_err(io_err("remove", &self.job_path(&record.id)))?;
        self.remove_exit_record(&record.id);
        Ok(())
    }

    /// Forgets a sweep once its last member is compacted.
    pub fn remove_group(&self, group: &JobId) {
        let _ = std::fs::remove_file(self.groups_dir.join(format!("{group}.json")));
    }

    fn read_job_file(&self, id: &JobId) -> Result<(PathBuf, Vec<u8>), StoreError> {
        let path = self.job_path(id);
        let bytes = std::fs::read(&path).map_err(io_err("read", &path))?;
        Ok((path, bytes))
    }

    /// One job's full record, from disk.
    pub fn load(&self, id: &JobId) -> Result<JobRecord, StoreError> {
        let (path, bytes) = self.read_job_file(id)?;
        parse_record(&path, &bytes)
    }

    /// The exact bytes the job was submitted with.
    pub fn descriptor(&self, id: &JobId) -> Result<Vec<u8>, StoreError> {
        #[derive(Deserialize)]
        struct Only {
            descriptor: Descriptor,
        }
        let (path, bytes) = self.read_job_file(id)?;
        let only: Only = serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
            path,
            message: e.to_string(),
        })?;
        Ok(only.descriptor.into_bytes())
    }

    /// Durably replaces a job's record; its descriptor is carried over.
    pub fn save(&self, record: &JobRecord) -> Result<(), StoreError> {
        let (path, old) = self.read_job_file(&record.id)?;
        let kept: JobFileDescriptor =
            serde_json::from_slice(&old).map_err(|e| StoreError::Corrupt {
                path: path.clone(),
                message: e.to_string(),
            })?;
        let bytes = serde_json::to_vec(&JobFileOut {
            record,
            descriptor: kept.descriptor,
        })
        .expect("records always serialise");
        self.jobs
            .replace(&job_file_name(&record.id), &bytes)
            .map_err(io_err("write", &path))
    }

    /// Quarantines a rejected file's bytes (if any) with its reason.
    /// Quarantines a rejected file: its bytes (if readable) and why.
    /// Returns the entry's name, for [`Store::forget_rejected`].
    pub fn reject(
        &self,
        mut record: RejectRecord,
        bytes: Option<&[u8]>,
    ) -> Result<String, StoreError> {
        let base = quarantine_name(record.rejected_at, &record.file);
        if let Some(bytes) = bytes {
            let name = format!("{base}.data");
            write_atomic(&self.rejected_dir, &name, bytes)
                .map_err(io_err("write", &self.rejected_dir.join(&name)))?;
            record.saved_as = Some(name);
        }
        let name = format!("{base}.reason.json");
        let json = serde_json::to_vec_pretty(&record).expect("records always serialise");
        write_atomic(&self.rejected_dir, &name, &json)
            .map_err(io_err("write", &self.rejected_dir.join(&name)))?;
        Ok(base)
    }

    /// Every quarantine entry, for retention and its events.
    pub fn rejected_entries(&self) -> Result<Vec<QuarantineEntry>, StoreError> {
        let entries =
            std::fs::read_dir(&self.rejected_dir).map_err(io_err("read", &self.rejected_dir))?;
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(base) = name.strip_suffix(".reason.json") else {
                continue;
            };
            if base.starts_with('.') {
                continue;
            }
            let record = std::fs::read(entry.path())
                .ok()
                .and_then(|b| serde_json::from_slice::<RejectRecord>(&b).ok());
            let refused = record
                .as_ref()
                .and_then(|r| Some((r.refused_file()?, r.rejected_at)));
            let (uid, notifications) =
                record.map_or((None, Vec::new()), |r| (r.uid, r.notifications));
            out.push(QuarantineEntry {
                name: base.to_owned(),
                uid,
                notifications,
                refused,
            });
        }
        Ok(out)
    }

    /// Removes one quarantine entry (its reason and its saved bytes).
    /// Returns the keys of its event's intents, whose outbox entries go
    /// with it.
    pub fn forget_rejected(&self, base: &str) -> Vec<String> {
        let keys = std::fs::read(self.rejected_dir.join(format!("{base}.reason.json")))
            .ok()
            .and_then(|b| serde_json::from_slice::<RejectRecord>(&b).ok())
            .map(|r| r.notifications.into_iter().map(|i| i.key).collect())
            .unwrap_or_default();
        for name in [format!("{base}.reason.json"), format!("{base}.data")] {
            let _ = std::fs::remove_file(self.rejected_dir.join(name));
        }
        keys
    }

    /// Every rejection on record, oldest first.
    pub fn rejected(&self) -> Result<Vec<RejectRecord>, StoreError> {
        let mut out = Vec::new();
        let entries =
            std::fs::read_dir(&self.rejected_dir).map_err(io_err("read", &self.rejected_dir))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".reason.json") || name.starts_with('.') {
                continue;
            }
            if let Ok(bytes) = std::fs::read(entry.path()) {
                if let Ok(mut record) = serde_json::from_slice::<RejectRecord>(&bytes) {
                    // ptraind's to deliver, not the owner's to read.
                    record.notifications.clear();
                    out.push(record);
                }
            }
        }
        out.sort_by_key(|r| r.rejected_at);
        Ok(out)
    }
}

/// The quarantine's entries by owner, oldest first, to keep it within
/// `[retention]` (per owner, and by age) without listing the directory on
/// every rejection. Entry names start with their rejection time (µs since
/// the epoch), so name order is age order. Pure.
#[derive(Default)]
pub struct QuarantineIndex {
    by_owner: HashMap<Option<u32>, std::collections::BTreeSet<String>>,
}

impl QuarantineIndex {
    /// Adds an entry; returns the entries that go to stay within `per_owner`.
    pub fn add(&mut self, uid: Option<u32>, base: String, per_owner: usize) -> Vec<String> {
        let entries = self.by_owner.entry(uid).or_default();
        entries.insert(base);
        let mut gone = Vec::new();
        while entries.len() > per_owner {
            gone.extend(entries.pop_first());
        }
        gone
    }

    /// Removes and returns the entries rejected before `cutoff` (µs).
    /// Looks at each owner's oldest only, so it costs O(owners) when
    /// nothing is due.
    pub fn expire(&mut self, cutoff: u64) -> Vec<String> {
        let mut gone = Vec::new();
        for entries in self.by_owner.values_mut() {
            while let Some(oldest) = entries.first() {
                let at = oldest
                    .split('-')
                    .next()
                    .and_then(|t| t.parse::<u64>().ok())
                    .unwrap_or(0);
                if at >= cutoff {
                    break;
                }
                gone.extend(entries.pop_first());
            }
        }
        self.by_owner.retain(|_, entries| !entries.is_empty());
        gone
    }
}

pub fn exits_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("exits")
}

/// Called by `ptraind record-exit` from the unit's ExecStopPost (as root,
/// inside the job's unit): records the exit from systemd's environment.
pub fn record_exit(state_dir: &Path, id: &JobId, record: &ExitRecord) -> Result<(), StoreError> {
    let dir = exits_dir(state_dir);
    let bytes = serde_json::to_vec(record).expect("records always serialise");
    write_atomic(&dir, &format!("{id}.json"), &bytes).map_err(io_err("write", &dir))
}

/// Hands every ended record of `STATE/jobs/` to `each`, reading only: no
/// clean-up, no migration (that is [`Store::load_each`]'s, in the state
/// task), so it may run beside ptraind (the accounting back-fill). A file
/// that cannot be read or parsed is skipped with a warning.
pub fn each_ended_record(
    state_dir: &Path,
    mut each: impl FnMut(JobRecord),
) -> Result<(), StoreError> {
    let jobs_dir = state_dir.join("jobs");
    let entries = std::fs::read_dir(&jobs_dir).map_err(io_err("read", &jobs_dir))?;
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with('.') || !name.ends_with(".json") {
            continue;
        }
        let path = entry.path();
        let record = std::fs::read(&path)
            .map_err(io_err("read", &path))
            .and_then(|bytes| parse_record(&path, &bytes));
        match record {
            Ok(record) if record.state == JobState::Ended => each(record),
            Ok(_) => {}
            // Gone since the listing (compacted, or a relaunch's rewrite).
            Err(StoreError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(error = %e, "skipping a job record"),
        }
    }
    Ok(())
}

fn parse_record(path: &Path, bytes: &[u8]) -> Result<JobRecord, StoreError> {
    serde_json::from_slice::<JobFileRecord>(bytes)
        .map(|file| file.record)
        .map_err(|e| StoreError::Corrupt {
            path: path.to_owned(),
            message: e.to_string(),
        })
}

/// A quarantine entry's name: when the file was refused (µs since the
/// epoch, so name order is age order), then its name made printable.
pub fn quarantine_name(rejected_at: u64, file: &str) -> String {
    format!("{rejected_at}-{}", printable_file_name(file))
}

/// A file name as one safe, printable path component: for the quarantine,
/// and as a `refused` event's subject.
pub fn printable_file_name(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(80)
        .collect();
    if s.starts_with('.') {
        s.insert(0, '_');
    }
    s
}

/// One way to make a job record in unit tests, for every module's tests:
/// an owner, the spool file, and the record of a descriptor.
#[cfg(test)]
pub(crate) mod test_kit {
    use super::{JobRecord, SpoolSource};
    use crate::users::Owner;

    /// A user whose primary group is their uid, home under /home, with no
    /// supplementary groups (change the fields a test is about).
    pub(crate) fn owner(uid: u32, name: &str) -> Owner {
        Owner {
            uid,
            gid: uid,
            name: name.into(),
            home: format!("/home/{name}").into(),
            groups: Vec::new(),
        }
    }

    /// The spool file job `id` was read from.
    pub(crate) fn source(id: &str) -> SpoolSource {
        SpoolSource {
            file: format!("{id}.json"),
            dev: 0,
            ino: 0,
            ctime_ns: 0,
            size: 0,
        }
    }

    /// The record of the descriptor `json` (with `id` as its id when it
    /// names none), submitted by `owner` at `now`.
    pub(crate) fn record(json: &str, id: &str, owner: Owner, now: u64) -> JobRecord {
        let spec = crate::spec::parse_spec(json.as_bytes(), id).unwrap();
        JobRecord::new(spec, owner, source(id), now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quarantine_keeps_each_owner_within_the_limit_and_age() {
        let mut q = QuarantineIndex::default();
        let name = |t: u64, f: &str| format!("{t:016}-{f}");
        assert!(q.add(Some(1), name(10, "a.json"), 2).is_empty());
        assert!(q.add(Some(1), name(20, "b.json"), 2).is_empty());
        assert!(q.add(Some(2), name(5, "x.json"), 2).is_empty());
        // A third from uid 1 pushes out its own oldest, not uid 2's.
        assert_eq!(q.add(Some(1), name(30, "c.json"), 2), [name(10, "a.json")]);
        assert!(q.add(None, name(1, "unknown"), 2).is_empty());
        let mut expired = q.expire(21);
        expired.sort();
        assert_eq!(
            expired,
            [name(1, "unknown"), name(5, "x.json"), name(20, "b.json")]
        );
        assert!(q.expire(21).is_empty());
        assert_eq!(q.add(Some(1), name(40, "d.json"), 2), Vec::<String>::new());
    }

    fn record(id: &str) -> JobRecord {
        let root = test_kit::owner(0, "root");
        test_kit::record(r#"{"version": 1, "command": ["true"]}"#, id, root, 10)
    }

    #[test]
    fn claim_save_load_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut r = record("a");
        store.claim(&r, b"{}").unwrap();
        assert!(matches!(store.claim(&r, b"{}"), Err(StoreError::Exists(_))));
        r.state = JobState::Ended;
        r.outcome = Some(Outcome::Killed { signal: 9 });
        store.save(&r).unwrap();
        let all = store.load_all().unwrap();
        assert_eq!(all, vec![r.clone()]);
        assert_eq!(all[0].status(), "killed");
        assert_eq!(store.descriptor(&r.id).unwrap(), b"{}");
    }

    #[test]
    fn exit_records_round_trip_and_map_to_unit_results() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let id = JobId::parse("j").unwrap();
        assert!(store.exit_record(&id).is_none());
        let rec = ExitRecord {
            invocation_id: Some("abc".into()),
            service_result: "signal".into(),
            exit_code: "killed".into(),
            exit_status: "KILL".into(),
            recorded_at: 1,
            result: None,
        };
        record_exit(dir.path(), &id, &rec).unwrap();
        let back = store.exit_record(&id).unwrap();
        assert_eq!(back.as_unit_result(), ("signal".into(), 2, 9));
        store.remove_exit_record(&id);
        assert!(store.exit_record(&id).is_none());
        // Compaction takes a recorder's file that was never removed.
        let claimed = record("claimed");
        store.claim(&claimed, b"{}").unwrap();
        record_exit(dir.path(), &claimed.id, &rec).unwrap();
        assert_eq!(store.exit_record(&claimed.id).unwrap(), rec);
        store.compact(&claimed).unwrap();
        assert!(store.exit_record(&claimed.id).is_none());
        assert!(!store.exists(&claimed.id));
        assert_eq!(signal_number("SIGSEGV"), Some(11));
        assert_eq!(signal_number("TERM"), Some(15));
    }

    #[test]
    fn one_file_per_job_whose_rewrites_keep_the_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let descriptor = b"{\"version\": 1,\n \"command\": [\"caf\xc3\xa9\"]}\n";
        let mut r = record("one");
        store.claim(&r, descriptor).unwrap();
        for state in [JobState::Launching, JobState::Running, JobState::Ended] {
            r.state = state;
            store.save(&r).unwrap();
        }
        assert_eq!(store.descriptor(&r.id).unwrap(), descriptor);
        assert_eq!(store.load(&r.id).unwrap(), r);
        let names: Vec<String> = std::fs::read_dir(dir.path().join("jobs"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.contains(&"one.json".to_owned()));
        // A corrupt file is named, never skipped.
        std::fs::write(dir.path().join("jobs/bad.json"), b"{").unwrap();
        let err = store.load_all().unwrap_err().to_string();
        assert!(
            err.contains("jobs/bad.json") && err.contains("move it aside"),
            "{err}"
        );
    }

    #[test]
    fn an_older_ptrainds_job_directories_become_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut old = record("old");
        old.state = JobState::Running;
        let legacy = dir.path().join("jobs/old");
        std::fs::create_dir(&legacy).unwrap();
        std::fs::write(
            legacy.join("record.json"),
            serde_json::to_vec(&old).unwrap(),
        )
        .unwrap();
        std::fs::write(legacy.join("descriptor.json"), b"{\"v\":1}").unwrap();
        std::fs::write(legacy.join("exit.json"), br#"{"invocation_id":null,"service_result":"success","exit_code":"exited","exit_status":"0","recorded_at":1}"#).unwrap();
        // A claim that never committed its record.
        std::fs::create_dir(dir.path().join("jobs/half")).unwrap();
        assert_eq!(store.load_all().unwrap(), vec![old.clone()]);
        assert!(!legacy.exists() && !dir.path().join("jobs/half").exists());
        assert_eq!(store.descriptor(&old.id).unwrap(), b"{\"v\":1}");
        assert_eq!(
            store.exit_record(&old.id).unwrap().service_result,
            "success"
        );
        assert_eq!(store.load_all().unwrap(), vec![old]);
    }

    #[test]
    fn rejections_are_listed_with_reason() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let rec = RejectRecord {
            file: "../x\n.json".into(),
            uid: Some(1000),
            owner: Some("alice".into()),
            rejected_at: 5,
            reason: "bad".into(),
            saved_as: None,
            dev: Some(1),
            ino: Some(2),
            ctime_ns: Some(3),
            notifications: Vec::new(),
        };
        store.reject(rec, Some(b"data")).unwrap();
        let listed = store.rejected().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].reason, "bad");
        let saved = listed[0].saved_as.as_ref().unwrap();
        assert!(!saved.contains('/') && !saved.contains('\n'));
    }
}
#[cfg(test)]
mod compat {
    use super::*;

    /// A job file written by the release of 2026-12-01 (an ended, stopped
    /// job with GPUs, a result and a notification intent): it loads, and
    /// written back it is the same bytes, so the record's shape is unchanged.
    const RECORD_2026_12_01: &[u8] = include_bytes!("../tests/fixtures/record-2026-12-01.json");

    #[test]
    fn a_record_written_by_the_release_of_2026_12_01_loads_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        std::fs::write(dir.path().join("jobs/resnet-1.json"), RECORD_2026_12_01).unwrap();
        let all = store.load_all().unwrap();
        assert_eq!(all.len(), 1);
        let r = &all[0];
        assert_eq!(r.id.as_str(), "resnet-1");
        assert_eq!(r.state, JobState::Ended);
        assert_eq!(
            r.outcome,
            Some(Outcome::Stopped {
                by_uid: 1000,
                by_name: Some("alice".into())
            })
        );
        assert_eq!(r.status(), "stopped");
        assert_eq!(r.spec.notify.as_deref(), Some(&["ops".to_string()][..]));
        assert_eq!(r.spec.notify_on.as_ref().map(|v| v.len()), Some(3));
        assert_eq!(
            r.spec.idle_timeout,
            Some(std::time::Duration::from_secs(1800))
        );
        assert_eq!(r.notifications.len(), 1);
        assert_eq!(r.notifications[0].notice.detail, "stopped by alice");
        let descriptor = store.descriptor(&r.id).unwrap();
        assert_eq!(job_file_bytes(r, &descriptor), RECORD_2026_12_01);
    }
}
