//! ptraind's D-Bus API (`org.ptrain.Daemon1` on the system bus), and the
//! stable JSON shapes the CLI prints with `--json`.
//!
//! Callers are identified by the uid the bus daemon vouches for; a user may
//! stop only their own jobs (root any). Reads are open to every local user,
//! as `squeue` and `systemctl list-units` are.

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::gpu::GpuInfo;
use crate::job::explain_exit_status;
use crate::store::{JobRecord, JobState, Outcome, RejectRecord, SpoolSource};

/// One job as `ptrain status --json` and `ptrain list --json` show it.
/// Fields are only ever added, never renamed.
/// `[privacy]` (Slurm's `PrivateData` is the anchor): what a user sees of
/// other users' jobs. By default only their id, owner, state and GPUs; the
/// command, workdir, result, exit and detail only with the admin's consent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Privacy {
    /// Show every job's details to every user.
    #[serde(default)]
    pub show_all_jobs: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct JobView {
    pub id: String,
    /// The descriptor's `name` and `comment`: text for people, the
    /// owner's (hidden from others like the command, [`JobView::as_seen_by`]).
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub comment: Option<String>,
    pub status: String,
    pub owner: String,
    pub uid: u32,
    pub unit: String,
    pub command: Vec<String>,
    pub workdir: Option<String>,
    pub gpus: Vec<u32>,
    pub gpu_uuids: Vec<String>,
    pub submitted_at: u64,
    pub started_at: Option<u64>,
    pub ended_at: Option<u64>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub outcome: Option<Outcome>,
    /// A sentence for people: what happened and, on failure, why.
    pub detail: String,
    pub invocation_id: Option<String>,
    pub systemd_result: Option<String>,
    pub timeout_secs: Option<u64>,
    /// The sweep this job belongs to and its parameter values.
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub params: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub after_ok: Vec<String>,
    #[serde(default)]
    pub after_fail: Vec<String>,
    #[serde(default)]
    pub after_any: Vec<String>,
    /// Jobs a queued job still waits for.
    #[serde(default)]
    pub waiting_for: Vec<String>,
    /// What the job wrote to $PTRAIN_RESULT_FILE.
    #[serde(default)]
    pub result: Option<serde_json::Value>,
    /// Why what it wrote there was not taken as its result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_error: Option<String>,
    /// Its memory, CPU and task limits in words ("4 CPUs, 12.0 GiB of
    /// memory"); empty when it has none.
    #[serde(default)]
    pub resources: String,
    /// The details are the owner's ([`JobView::as_seen_by`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub private: bool,
    /// Queue priority (higher first; 0 by default).
    #[serde(default)]
    pub priority: i32,
    /// What the job asked of its GPUs, in words ("2 GPUs (model \"A100\")").
    #[serde(default)]
    pub gpu_request: String,
    /// The spool file the job was made of, as ptraind read it (its
    /// fstat): how `ptrain submit` tells the job of the file it published
    /// from a namesake's. Only `Status` fills it in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SpoolSource>,
    /// A GPU the job held left the pool under it (lost, or uncorrected
    /// ECC errors): which, and why. Only `Status` fills it in, from
    /// ptraind's memory (`PoolMonitor`), so a restart forgets it unless
    /// the GPU is still out then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_warning: Option<String>,
    /// Only what ptraind keeps in memory of an older end: the command,
    /// result, invocation and timeout are not filled in (`ptrain status
    /// ID` reads them from the job's record).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub summary: bool,
}

/// A job's exit code, signal and the sentence that says how it ended (or
/// its status word while it has no outcome).
pub fn outcome_fields(
    outcome: Option<&Outcome>,
    status: &str,
) -> (Option<i32>, Option<i32>, String) {
    let (exit_code, signal) = match outcome {
        Some(Outcome::Failed { exit_code }) => (Some(*exit_code), None),
        Some(Outcome::Succeeded) => (Some(0), None),
        Some(Outcome::Killed { signal }) => (None, Some(*signal)),
        _ => (None, None),
    };
    let detail = match outcome {
        Some(outcome) => {
            let mut s = outcome.describe();
            if let Some(why) = exit_code.and_then(explain_exit_status) {
                s.push_str(&format!(" ({why})"));
            }
            s
        }
        None => status.to_string(),
    };
    (exit_code, signal, detail)
}

impl JobView {
    /// The view as `caller_uid` may see it: whole for its owner and root
    /// (and for everyone under `[privacy] show_all_jobs`), else only the
    /// id, owner, state, GPUs and times.
    pub fn as_seen_by(self, caller_uid: u32, privacy: Privacy) -> JobView {
        if privacy.show_all_jobs || caller_uid == 0 || caller_uid == self.uid {
            return self;
        }
        JobView {
            name: None,
            comment: None,
            command: Vec::new(),
            workdir: None,
            exit_code: None,
            signal: None,
            outcome: None,
            detail: String::new(),
            systemd_result: None,
            params: Default::default(),
            result: None,
            result_error: None,
            resources: String::new(),
            invocation_id: None,
            timeout_secs: None,
            after_ok: Vec::new(),
            after_fail: Vec::new(),
            after_any: Vec::new(),
            waiting_for: Vec::new(),
            // The sweep's id stays: it names jobs, as their ids do, and
            // `ptrain wait SWEEP` by others needs it.
            priority: 0,
            gpu_request: String::new(),
            gpu_warning: None,
            private: true,
            ..self
        }
    }

    pub fn of(record: &JobRecord) -> JobView {
        let (exit_code, signal, mut detail) =
            outcome_fields(record.outcome.as_ref(), record.status());
        if record.outcome.is_none()
            && record.state == JobState::Queued
            && record.spec.gpus.count() > 0
        {
            detail = format!("waiting for {}", record.spec.gpus.describe());
        }
        JobView {
            id: record.id.to_string(),
            name: record.spec.name.clone(),
            comment: record.spec.comment.clone(),
            status: record.status().to_string(),
            owner: record.owner.name.clone(),
            uid: record.owner.uid,
            unit: record.unit.clone(),
            command: record.spec.command.clone(),
            workdir: record
                .spec
                .workdir
                .as_ref()
                .map(|p| p.display().to_string()),
            gpus: record.gpus.iter().map(|g| g.index).collect(),
            gpu_uuids: record.gpus.iter().map(|g| g.uuid.clone()).collect(),
            submitted_at: record.submitted_at,
            started_at: record.started_at,
            ended_at: record.ended_at,
            exit_code,
            signal,
            outcome: record.outcome.clone(),
            detail,
            invocation_id: record.invocation_id.clone(),
            systemd_result: record.systemd_result.clone(),
            timeout_secs: record.spec.timeout.map(|t| t.as_secs()),
            group: record.group.as_ref().map(|g| g.to_string()),
            params: record.params.clone(),
            after_ok: record
                .spec
                .after
                .after_ok
                .iter()
                .map(|i| i.to_string())
                .collect(),
            after_fail: record
                .spec
                .after
                .after_fail
                .iter()
                .map(|i| i.to_string())
                .collect(),
            after_any: record
                .spec
                .after
                .after_any
                .iter()
                .map(|i| i.to_string())
                .collect(),
            waiting_for: Vec::new(),
            result: record.result.clone(),
            result_error: record.result_error.clone(),
            resources: record.limits.describe(),
            private: false,
            priority: record.spec.priority,
            gpu_request: record.spec.gpus.describe(),
            source: None,
            gpu_warning: None,
            summary: false,
        }
    }
}

/// A GPU, its state and the job holding it, for `ptrain gpus`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GpuView {
    #[serde(flatten)]
    pub gpu: GpuInfo,
    pub held_by: Option<String>,
    /// `free`, `held`, `reserved`, `busy-foreign` or `unhealthy`
    /// ([`crate::gpu::GpuState::name`]).
    #[serde(default)]
    pub state: String,
    /// The waiting job the GPU is kept for (state `reserved`).
    #[serde(default)]
    pub reserved_for: Option<String>,
    /// The state in words: who holds it, how much others use, why unhealthy.
    #[serde(default)]
    pub detail: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GpusView {
    pub backend: String,
    pub gpus: Vec<GpuView>,
}

/// Why an API call failed; becomes a D-Bus error the CLI maps to an exit code.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("no job {0:?}; `ptrain list` shows the jobs ptraind knows")]
    NotFound(String),
    #[error("job {id} belongs to {owner}; only its owner or root may {action} it")]
    NotYours {
        id: String,
        owner: String,
        action: &'static str,
    },
    #[error("job {0:?} is no longer in ptraind's records ([retention] compacted it; its summary is a line of STATE/history.jsonl); its output is still archived: `ptrain logs {0}`")]
    Compacted(String),
    #[error("{0}")]
    Failed(String),
    #[error("only root may {0}; run it with sudo")]
    RootOnly(&'static str),
}

impl From<ApiError> for zbus::fdo::Error {
    fn from(e: ApiError) -> Self {
        match e {
            ApiError::NotFound(_) | ApiError::Compacted(_) => {
                zbus::fdo::Error::FileNotFound(e.to_string())
            }
            ApiError::NotYours { .. } => zbus::fdo::Error::AccessDenied(e.to_string()),
            ApiError::Failed(_) => zbus::fdo::Error::Failed(e.to_string()),
            ApiError::RootOnly(_) => zbus::fdo::Error::AccessDenied(e.to_string()),
        }
    }
}

/// A request from the API to the daemon's state task.
pub enum ApiRequest {
    List(oneshot::Sender<Vec<JobView>>),
    /// Queued and running jobs plus the `limit` most recently ended.
    ListRecent(u32, oneshot::Sender<Vec<JobView>>),
    Status(String, oneshot::Sender<Result<JobView, ApiError>>),
    Stop {
        id: String,
        caller_uid: u32,
        reply: oneshot::Sender<Result<String, ApiError>>,
    },
    Rejected {
        caller_uid: u32,
        reply: oneshot::Sender<Result<Vec<RejectRecord>, ApiError>>,
    },
    Gpus(oneshot::Sender<Result<GpusView, ApiError>>),
    /// Notification deliveries (root only; checked by the API).
    Notifications(oneshot::Sender<Result<Vec<crate::notifications::DeliveryView>, ApiError>>),
    RetryNotifications(
        crate::notifications::RetryTarget,
        oneshot::Sender<Result<String, ApiError>>,
    ),
}

/// The object served at [`crate::DBUS_PATH`].
pub struct DaemonApi {
    pub requests: mpsc::UnboundedSender<ApiRequest>,
    /// `[privacy]`: what callers see of others' jobs.
    pub privacy: Privacy,
    /// Serves job output ([`crate::logs`]).
    pub logs: crate::logs::Logs,
    /// The spool directory ptraind watches, for `ptrain submit` when the
    /// config is not readable to its user.
    pub spool_dir: std::path::PathBuf,
}

impl DaemonApi {
    fn seen_by(&self, views: Vec<JobView>, caller_uid: u32) -> Vec<JobView> {
        views
            .into_iter()
            .map(|v| v.as_seen_by(caller_uid, self.privacy))
            .collect()
    }

    /// The job whose output `caller_uid` asks for: theirs, or any for root.
    async fn output_of(
        &self,
        id: String,
        caller_uid: u32,
    ) -> zbus::fdo::Result<crate::logs::JobOutput> {
        let job = match self.ask(|tx| ApiRequest::Status(id.clone(), tx)).await? {
            Ok(job) => job,
            Err(ApiError::NotFound(_)) => {
                return self
                    .compacted(&id, caller_uid)
                    .await
                    .ok_or_else(|| ApiError::NotFound(id).into());
            }
            Err(e) => return Err(e.into()),
        };
        if caller_uid != 0 && caller_uid != job.uid {
            return Err(ApiError::NotYours {
                id,
                owner: job.owner,
                action: "read the output of",
            }
            .into());
        }
        Ok(crate::logs::JobOutput::of_view(&job))
    }

    /// The output of a job `[retention]` compacted, known now by its
    /// archive only: for its owner and root; to others it is no job.
    async fn compacted(&self, id: &str, caller_uid: u32) -> Option<crate::logs::JobOutput> {
        let output = self.logs.archived_output(id).await?;
        (caller_uid == 0 || caller_uid == output.uid).then_some(output)
    }

    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> ApiRequest,
    ) -> zbus::fdo::Result<T> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send(make(tx))
            .map_err(|_| zbus::fdo::Error::Failed("ptraind is shutting down".into()))?;
        rx.await
            .map_err(|_| zbus::fdo::Error::Failed("ptraind is shutting down".into()))
    }
}

async fn caller_uid(
    conn: &zbus::Connection,
    header: &zbus::message::Header<'_>,
) -> zbus::fdo::Result<u32> {
    let sender = header
        .sender()
        .ok_or_else(|| zbus::fdo::Error::AccessDenied("caller has no bus name".into()))?;
    let dbus = zbus::fdo::DBusProxy::new(conn).await?;
    dbus.get_connection_unix_user(sender.clone().into()).await
}

/// Hands freed heap pages back to the kernel. A listing of the whole
/// history is tens of thousands of small strings, freed in the middle of
/// glibc's arenas where they stay: one `ptrain list --all` over 100,000
/// jobs left the idle daemon 2 MiB larger for good (`make bench`).
fn release_freed_memory() {
    // SAFETY: malloc_trim only returns free memory; it is thread-safe.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}

fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("views always serialise")
}

#[zbus::interface(name = "org.ptrain.Daemon1")]
impl DaemonApi {
    /// Every job, as a JSON array of JobView.
    async fn list(
        &self,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        let caller = caller_uid(conn, &header).await?;
        let views = self.seen_by(self.ask(ApiRequest::List).await?, caller);
        let json = to_json(&views);
        drop(views);
        release_freed_memory();
        Ok(json)
    }

    /// Queued and running jobs plus the `limit` most recently ended, as a
    /// JSON array of JobView: what `ptrain list` shows by default. Its
    /// cost does not grow with the history.
    async fn list_recent(
        &self,
        limit: u32,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        let caller = caller_uid(conn, &header).await?;
        let views = self.ask(|tx| ApiRequest::ListRecent(limit, tx)).await?;
        Ok(to_json(&self.seen_by(views, caller)))
    }

    /// One job, as a JSON JobView.
    async fn status(
        &self,
        id: String,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        let caller = caller_uid(conn, &header).await?;
        let view = match self.ask(|tx| ApiRequest::Status(id.clone(), tx)).await? {
            Ok(view) => view,
            Err(ApiError::NotFound(_)) if self.compacted(&id, caller).await.is_some() => {
                return Err(ApiError::Compacted(id).into());
            }
            Err(e) => return Err(e.into()),
        };
        Ok(to_json(&view.as_seen_by(caller, self.privacy)))
    }

    /// Stops a job (queued or running); returns a sentence saying what happened.
    async fn stop(
        &self,
        id: String,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        let caller_uid = caller_uid(conn, &header).await?;
        Ok(self
            .ask(|reply| ApiRequest::Stop {
                id,
                caller_uid,
                reply,
            })
            .await??)
    }

    /// Rejected spool files: the caller's own (root: all), JSON array.
    async fn rejected(
        &self,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        let caller_uid = caller_uid(conn, &header).await?;
        let list = self
            .ask(|reply| ApiRequest::Rejected { caller_uid, reply })
            .await??;
        Ok(to_json(&list))
    }

    /// The last `lines` lines of a job's output (0: all, up to a cap), for
    /// its owner or root. Users often cannot read the system journal
    /// themselves (volatile storage keeps one root-only file).
    async fn logs(
        &self,
        id: String,
        lines: u32,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        let caller_uid = caller_uid(conn, &header).await?;
        let job = self.output_of(id, caller_uid).await?;
        Ok(self
            .logs
            .read_to_string(job, caller_uid, lines, self.requests.clone())
            .await?)
    }

    /// A job's output as the read end of a pipe (a unix fd), for its
    /// owner or root; read it to EOF. From the journal, or from the job's
    /// archive once it ended and the journal may have rotated it away.
    /// `lines`: only the last N (0: all); `since_usec`: only lines written
    /// at or after that time (µs since the epoch, 0: all); `follow`: keep
    /// the pipe open and stream new output until the job ends (a queued
    /// job is waited for).
    async fn open_logs(
        &self,
        id: String,
        lines: u32,
        since_usec: u64,
        follow: bool,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<zbus::OwnedFd> {
        let caller_uid = caller_uid(conn, &header).await?;
        // Subscribed before the job is looked up, so no change falls in
        // between.
        let changes = self.logs.subscribe();
        let job = self.output_of(id, caller_uid).await?;
        let opts = crate::logs::ReadOptions {
            lines,
            since_us: since_usec,
            follow,
        };
        let fd = self
            .logs
            .open(job, caller_uid, opts, changes, self.requests.clone())?;
        Ok(fd.into())
    }

    /// The log archive's retention policy and usage (`ptrain du`), JSON
    /// LogUsage; a user's own row only, root sees every user.
    async fn log_usage(
        &self,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        let caller_uid = caller_uid(conn, &header).await?;
        Ok(to_json(&self.logs.usage(caller_uid).await?))
    }

    /// The GPU inventory and which job holds each GPU, JSON.
    async fn gpus(&self) -> zbus::fdo::Result<String> {
        Ok(to_json(&self.ask(ApiRequest::Gpus).await??))
    }

    /// Every notification delivery (pending, retrying, delivered, dead,
    /// with the last error), JSON array of DeliveryView. Root only: they
    /// name the admin's channels.
    async fn notifications(
        &self,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        if caller_uid(conn, &header).await? != 0 {
            return Err(ApiError::RootOnly("list notifications").into());
        }
        Ok(to_json(&self.ask(ApiRequest::Notifications).await??))
    }

    /// Re-sends the dead notification `key` (or hurries a retrying one), or
    /// with `all_dead` every dead one; returns a sentence. Root only.
    async fn retry_notifications(
        &self,
        key: String,
        all_dead: bool,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        if caller_uid(conn, &header).await? != 0 {
            return Err(ApiError::RootOnly("re-send notifications").into());
        }
        let target = if all_dead {
            crate::notifications::RetryTarget::AllDead
        } else {
            crate::notifications::RetryTarget::Key(key)
        };
        Ok(self
            .ask(|reply| ApiRequest::RetryNotifications(target, reply))
            .await??)
    }

    /// The spool directory ptraind watches, where job files are dropped:
    /// how a user who cannot read the config finds it. Fixed while
    /// ptraind runs.
    #[zbus(property(emits_changed_signal = "const"))]
    async fn spool_dir(&self) -> String {
        self.spool_dir.display().to_string()
    }

    /// Emitted on every job state change: id and new status.
    #[zbus(signal)]
    pub async fn job_changed(
        emitter: &zbus::object_server::SignalEmitter<'_>,
        id: &str,
        status: &str,
    ) -> zbus::Result<()>;
}

/// The client side, for the `ptrain` CLI.
#[zbus::proxy(
    interface = "org.ptrain.Daemon1",
    default_service = "org.ptrain.Daemon1",
    default_path = "/org/ptrain/Daemon1"
)]
pub trait Daemon1 {
    fn list(&self) -> zbus::Result<String>;
    fn list_recent(&self, limit: u32) -> zbus::Result<String>;
    fn status(&self, id: &str) -> zbus::Result<String>;
    fn stop(&self, id: &str) -> zbus::Result<String>;
    fn rejected(&self) -> zbus::Result<String>;
    fn gpus(&self) -> zbus::Result<String>;
    fn logs(&self, id: &str, lines: u32) -> zbus::Result<String>;
    fn open_logs(
        &self,
        id: &str,
        lines: u32,
        since_usec: u64,
        follow: bool,
    ) -> zbus::Result<zbus::OwnedFd>;
    fn log_usage(&self) -> zbus::Result<String>;
    fn notifications(&self) -> zbus::Result<String>;
    fn retry_notifications(&self, key: &str, all_dead: bool) -> zbus::Result<String>;
    #[zbus(property)]
    fn spool_dir(&self) -> zbus::Result<String>;
    #[zbus(signal)]
    fn job_changed(&self, id: String, status: String) -> zbus::Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn others_see_only_id_owner_state_and_gpus_unless_the_admin_shows_all() {
        let spec = crate::spec::parse_spec(
            br#"{"version":1,"command":["python3","train.py","--key","s3cret"],"workdir":"/home/alice/p","name":"project-x","comment":"for the grant"}"#,
            "j",
        )
        .unwrap();
        let owner = crate::users::Owner {
            uid: 1000,
            gid: 1000,
            name: "alice".into(),
            home: "/home/alice".into(),
            groups: vec![],
        };
        let source = crate::store::SpoolSource {
            file: "j.json".into(),
            dev: 0,
            ino: 0,
            ctime_ns: 0,
            size: 0,
        };
        let mut record = JobRecord::new(spec, owner, source, 0);
        record.result = Some(serde_json::json!({"acc": 1}));
        let view = JobView::of(&record);
        let private = Privacy::default();
        let shown = serde_json::to_string(&view.clone().as_seen_by(2000, private)).unwrap();
        for secret in [
            "s3cret",
            "train.py",
            "/home/alice/p",
            "acc",
            "project-x",
            "grant",
        ] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        let seen = view.clone().as_seen_by(2000, private);
        assert_eq!(
            (seen.id.as_str(), seen.owner.as_str(), seen.private),
            ("j", "alice", true)
        );
        assert_eq!(seen.status, view.status);
        for (caller, privacy) in [
            (1000, private),
            (0, private),
            (
                2000,
                Privacy {
                    show_all_jobs: true,
                },
            ),
        ] {
            assert_eq!(view.clone().as_seen_by(caller, privacy), view);
        }
    }

    #[test]
    fn a_job_not_needed_has_no_exit_status_and_says_why() {
        let outcome = Outcome::NotNeeded {
            parent: "train".into(),
            reason: "after_fail: train succeeded, so this job is not needed".into(),
        };
        assert_eq!(outcome.status(), "not-needed");
        let (exit_code, signal, detail) = outcome_fields(Some(&outcome), outcome.status());
        assert_eq!((exit_code, signal), (None, None));
        assert_eq!(
            detail,
            "not needed, never ran: after_fail: train succeeded, so this job is not needed"
        );
        // The JSON shape `ptrain status --json` shows, and reads back.
        let json = serde_json::to_value(&outcome).unwrap();
        assert_eq!(json["kind"], "not-needed");
        assert_eq!(json["parent"], "train");
        assert_eq!(serde_json::from_value::<Outcome>(json).unwrap(), outcome);
    }
}
