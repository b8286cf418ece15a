//! ptraind's D-Bus API (`org.ptrain.Daemon1` on the system bus): the
//! object the daemon serves and the proxy the CLI calls. It answers with
//! [`crate::views`]' JSON, asks the state task through
//! [`crate::requests`], and serves output through [`crate::logs`]; each
//! wing's error becomes a D-Bus error here.
//!
//! Callers are identified by the uid the bus daemon vouches for; a user may
//! stop only their own jobs (root any). Reads are open to every local user,
//! as `squeue` and `systemctl list-units` are.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::board::Board;
use crate::logs::{JobLookup, JobOutput, Logs, LogsError, ReadOptions};
use crate::notifications::{DeliveriesError, RetryTarget};
use crate::requests::{ApiError, ApiRequest, Change};
use crate::views::{JobView, Privacy};

impl From<ApiError> for zbus::fdo::Error {
    fn from(e: ApiError) -> Self {
        match e {
            ApiError::NotFound(_) | ApiError::Compacted(_) => {
                zbus::fdo::Error::FileNotFound(e.to_string())
            }
            ApiError::NotYours { .. } => zbus::fdo::Error::AccessDenied(e.to_string()),
            ApiError::Rejected(_)
            | ApiError::Gpus(_)
            | ApiError::Images(_)
            | ApiError::NotQueued { .. }
            | ApiError::NotRunning { .. }
            | ApiError::NotEnded { .. }
            | ApiError::RecordChange { .. }
            | ApiError::Freezer { .. }
            | ApiError::RecordStop(_)
            | ApiError::StopUnit(_)
            | ApiError::FairShareOff => zbus::fdo::Error::Failed(e.to_string()),
            ApiError::RootOnly(_) => zbus::fdo::Error::AccessDenied(e.to_string()),
            ApiError::BadUpdate(_) => zbus::fdo::Error::InvalidArgs(e.to_string()),
        }
    }
}

impl From<LogsError> for zbus::fdo::Error {
    fn from(e: LogsError) -> Self {
        zbus::fdo::Error::Failed(e.to_string())
    }
}

impl From<DeliveriesError> for zbus::fdo::Error {
    fn from(e: DeliveriesError) -> Self {
        match e {
            DeliveriesError::NotAKey(_) => zbus::fdo::Error::FileNotFound(e.to_string()),
            _ => zbus::fdo::Error::Failed(e.to_string()),
        }
    }
}

/// The object served at [`crate::DBUS_PATH`].
pub struct DaemonApi {
    pub requests: mpsc::UnboundedSender<ApiRequest>,
    /// What `Status` reads without the state task.
    pub board: Arc<Board>,
    /// Each caller's uid, asked of dbus-daemon once per connection.
    pub callers: Callers,
    /// `[privacy]`: what callers see of others' jobs.
    pub privacy: Privacy,
    /// Serves job output ([`crate::logs`]).
    pub logs: Logs,
    /// The spool directory ptraind watches, for `ptrain submit` when the
    /// config is not readable to its user.
    pub spool_dir: std::path::PathBuf,
    /// The accounting database's writer, which runs `History` and
    /// `Report` once the runs ended before them are written; `None` with
    /// `[accounting] enabled = false`, when they say so rather than answer
    /// from a database nothing writes.
    pub accounting: Option<crate::accounting::db::Writer>,
}

impl DaemonApi {
    fn seen_by(&self, views: Vec<JobView>, caller_uid: u32) -> Vec<JobView> {
        views
            .into_iter()
            .map(|v| v.as_seen_by(caller_uid, self.privacy))
            .collect()
    }

    /// The job whose output `caller_uid` asks for: theirs, or any for root.
    async fn output_of(&self, id: String, caller_uid: u32) -> zbus::fdo::Result<JobOutput> {
        let job = match self.board.status(&id).await {
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
        Ok(JobOutput::of_view(&job))
    }

    /// The output of a job `[retention]` compacted, known now by its
    /// archive only: for its owner and root; to others it is no job.
    async fn compacted(&self, id: &str, caller_uid: u32) -> Option<JobOutput> {
        let output = self.logs.archived_output(id).await?;
        (caller_uid == 0 || caller_uid == output.uid).then_some(output)
    }

    /// How a log follower that fell behind looks up where its job stands.
    fn lookup(&self) -> JobLookup {
        let board = self.board.clone();
        Arc::new(move |id| {
            let board = board.clone();
            Box::pin(async move {
                let view = board
                    .status(&id)
                    .await
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                Ok(JobOutput::of_view(&view))
            })
        })
    }

    /// Runs an accounting query in its child (`ptraind accounting`): SQLite
    /// never runs in ptraind, whose idle RSS it would keep. The query is
    /// parsed strictly here and written again for the child, which is told
    /// the caller's uid (a user other than root gets only their own rows).
    async fn accounting_query<Q: serde::de::DeserializeOwned + Serialize>(
        &self,
        conn: &zbus::Connection,
        header: &zbus::message::Header<'_>,
        query: &str,
        task: impl FnOnce(u32) -> crate::accounting::helper::Task,
    ) -> zbus::fdo::Result<String> {
        let Some(accounting) = &self.accounting else {
            return Err(zbus::fdo::Error::Failed(
                crate::accounting::ACCOUNTING_OFF.into(),
            ));
        };
        let caller = self.callers.uid(conn, header).await?;
        let query: Q = parse_query(query)?;
        let input = serde_json::to_vec(&query).expect("queries always serialise");
        accounting
            .query(task(caller), input)
            .await
            .map_err(zbus::fdo::Error::Failed)
    }

    /// `Hold`, `Release`, `Pause`, `Resume`: the caller as the bus knows
    /// it, the decision the state task's.
    async fn change(
        &self,
        id: String,
        change: Change,
        conn: &zbus::Connection,
        header: &zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        let caller_uid = self.callers.uid(conn, header).await?;
        Ok(self
            .ask(|reply| ApiRequest::Change {
                id,
                change,
                caller_uid,
                reply,
            })
            .await??)
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

/// Who calls: the uid dbus-daemon vouches for, asked once per caller's
/// connection. A unique bus name is never given to another connection
/// while the bus runs (and ptraind restarts when it loses the bus), so its
/// uid cannot change; a call then costs no round trip to dbus-daemon,
/// which a burst keeps busy with systemd's signals.
#[derive(Default)]
pub struct Callers {
    uids: std::sync::Mutex<HashMap<String, u32>>,
    dbus: tokio::sync::OnceCell<zbus::fdo::DBusProxy<'static>>,
}

/// Callers remembered at most; past it the map starts again.
const MAX_CALLERS: usize = 4096;

impl Callers {
    async fn uid(
        &self,
        conn: &zbus::Connection,
        header: &zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<u32> {
        let sender = header
            .sender()
            .ok_or_else(|| zbus::fdo::Error::AccessDenied("caller has no bus name".into()))?;
        let known = |uids: &HashMap<String, u32>| uids.get(sender.as_str()).copied();
        if let Some(uid) = known(&self.lock()) {
            return Ok(uid);
        }
        let dbus = self
            .dbus
            .get_or_try_init(|| async {
                zbus::fdo::DBusProxy::builder(conn)
                    .cache_properties(zbus::proxy::CacheProperties::No)
                    .build()
                    .await
            })
            .await?;
        let uid = dbus.get_connection_unix_user(sender.clone().into()).await?;
        let mut uids = self.lock();
        if uids.len() >= MAX_CALLERS {
            uids.clear();
        }
        uids.insert(sender.to_string(), uid);
        Ok(uid)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.uids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A listing's views: the live jobs', then the ends' (read from the
/// board), in submission order.
fn listed(board: &Board, listing: crate::requests::Listing) -> Vec<JobView> {
    let mut views = listing.live;
    views.extend(board.ended_views(&listing.ends, listing.whole));
    views.sort_by(|a, b| (a.submitted_at, &a.id).cmp(&(b.submitted_at, &b.id)));
    views
}

/// An accounting query's JSON, strictly (unknown fields are refused).
fn parse_query<T: serde::de::DeserializeOwned>(json: &str) -> zbus::fdo::Result<T> {
    serde_json::from_str(json).map_err(|e| {
        zbus::fdo::Error::InvalidArgs(format!(
            "the accounting query is not one this ptraind knows ({e}); use the ptrain of the same release"
        ))
    })
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
        let caller = self.callers.uid(conn, &header).await?;
        let listing = self.ask(ApiRequest::List).await?;
        // Up to MAX_LIST_ALL records read from disk: on a thread of the
        // blocking pool, not an async worker's.
        let board = self.board.clone();
        let views = tokio::task::spawn_blocking(move || listed(&board, listing))
            .await
            .map_err(|e| zbus::fdo::Error::Failed(format!("the listing failed: {e}")))?;
        let views = self.seen_by(views, caller);
        let json = to_json(&views);
        drop(views);
        // A listing of the whole history is tens of thousands of small
        // strings: one `ptrain list --all` over 100,000 jobs left the idle
        // daemon 2 MiB larger for good (`make bench`).
        crate::memory::release_freed_memory();
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
        let caller = self.callers.uid(conn, &header).await?;
        let listing = self.ask(|tx| ApiRequest::ListRecent(limit, tx)).await?;
        // The recent ends are in memory; only the few shown whole are read.
        let views = listed(&self.board, listing);
        Ok(to_json(&self.seen_by(views, caller)))
    }

    /// One job, as a JSON JobView.
    async fn status(
        &self,
        id: String,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        let caller = self.callers.uid(conn, &header).await?;
        let view = match self.board.status(&id).await {
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
        let caller_uid = self.callers.uid(conn, &header).await?;
        Ok(self
            .ask(|reply| ApiRequest::Stop {
                id,
                caller_uid,
                reply,
            })
            .await??)
    }

    /// Holds a queued job (or every queued job of a sweep): it stays
    /// queued and is not started until released. Its owner or root.
    async fn hold(
        &self,
        id: String,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        self.change(id, Change::Hold, conn, &header).await
    }

    /// Releases a held job (or every held job of a sweep). Its owner or root.
    async fn release(
        &self,
        id: String,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        self.change(id, Change::Release, conn, &header).await
    }

    /// Pauses a running job (or every running job of a sweep): systemd
    /// freezes its processes, which keep their memory and GPUs. Its owner
    /// or root.
    async fn pause(
        &self,
        id: String,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        self.change(id, Change::Pause, conn, &header).await
    }

    /// Resumes a paused job (or every paused job of a sweep). Its owner or
    /// root.
    async fn resume(
        &self,
        id: String,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        self.change(id, Change::Resume, conn, &header).await
    }

    /// Changes a queued job's (or every queued job of a sweep's)
    /// `priority`, `begin` or `timeout`: `changes` is a JSON object of
    /// them, each checked as in a job file (a `begin` delay counts from
    /// now). Its owner or root.
    async fn update(
        &self,
        id: String,
        changes: String,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        let update = crate::spec::parse_update(&changes).map_err(zbus::fdo::Error::InvalidArgs)?;
        self.change(id, Change::Update(Box::new(update)), conn, &header)
            .await
    }

    /// Runs an ended job (or every ended job of a sweep) again, its spec
    /// unchanged: as its next attempt under its id, or, with `as_id` not
    /// empty, as a new job of that id. Its owner or root.
    async fn restart(
        &self,
        id: String,
        as_id: String,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        let as_id = Some(as_id).filter(|a| !a.is_empty());
        self.change(id, Change::Restart { as_id }, conn, &header)
            .await
    }

    /// Rejected spool files: the caller's own (root: all), JSON array.
    async fn rejected(
        &self,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        let caller_uid = self.callers.uid(conn, &header).await?;
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
        let caller_uid = self.callers.uid(conn, &header).await?;
        let job = self.output_of(id, caller_uid).await?;
        Ok(self
            .logs
            .read_to_string(job, caller_uid, lines, self.lookup())
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
        let caller_uid = self.callers.uid(conn, &header).await?;
        // Subscribed before the job is looked up, so no change falls in
        // between.
        let changes = self.logs.subscribe();
        let job = self.output_of(id, caller_uid).await?;
        let opts = ReadOptions {
            lines,
            since_us: since_usec,
            follow,
        };
        let fd = self
            .logs
            .open(job, caller_uid, opts, changes, self.lookup())?;
        Ok(fd.into())
    }

    /// The output of one attempt of a job (1 first; `ptrain logs` with
    /// its attempt option): an earlier attempt's by its invocation, from the
    /// journal or its archive. Its owner and root, as `OpenLogs`; a job
    /// `[retention]` compacted has only its last run's archive (`OpenLogs`).
    async fn open_attempt_logs(
        &self,
        id: String,
        attempt: u32,
        lines: u32,
        since_usec: u64,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<zbus::OwnedFd> {
        let caller_uid = self.callers.uid(conn, &header).await?;
        let changes = self.logs.subscribe();
        // One view, checked and read: the id cannot name another job in
        // between (ids are reused once retention compacts a job).
        let view = self.board.status(&id).await?;
        if caller_uid != 0 && caller_uid != view.uid {
            return Err(ApiError::NotYours {
                id,
                owner: view.owner,
                action: "read the output of",
            }
            .into());
        }
        let Some(job) = JobOutput::of_attempt(&view, attempt) else {
            return Err(zbus::fdo::Error::FileNotFound(format!(
                "job {id} has no attempt {attempt}; it is on attempt {} (`ptrain status {id}` lists them)",
                view.attempt
            )));
        };
        let opts = ReadOptions {
            lines,
            since_us: since_usec,
            follow: false,
        };
        let fd = self
            .logs
            .open(job, caller_uid, opts, changes, self.lookup())?;
        Ok(fd.into())
    }

    /// Ended runs from the accounting database (`ptrain history`): `query`
    /// is a JSON HistoryQuery; returns a JSON array of HistoryRow, oldest
    /// first. A caller other than root gets only their own runs.
    async fn history(
        &self,
        query: String,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        self.accounting_query::<crate::accounting::query::HistoryQuery>(
            conn,
            &header,
            &query,
            |caller| crate::accounting::helper::Task::History { caller },
        )
        .await
    }

    /// Usage summed per user or group (`ptrain report`): `query` is a
    /// JSON ReportQuery; returns a JSON array of ReportRow. A caller other
    /// than root gets only their own line.
    async fn report(
        &self,
        query: String,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        self.accounting_query::<crate::accounting::query::ReportQuery>(
            conn,
            &header,
            &query,
            |caller| crate::accounting::helper::Task::Report { caller },
        )
        .await
    }

    /// Each user's fair-share standing (what `ptrain report` prints with
    /// its fair-share flag), JSON FairShareView; a caller other than root
    /// gets only their own. No double hyphen here: zbus puts this text in
    /// an XML comment of the introspection.
    async fn fair_share(
        &self,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        let caller_uid = self.callers.uid(conn, &header).await?;
        Ok(to_json(
            &self
                .ask(|reply| ApiRequest::FairShare { caller_uid, reply })
                .await??,
        ))
    }

    /// The log archive's retention policy and usage (`ptrain du`), JSON
    /// LogUsage; a user's own row only, root sees every user.
    async fn log_usage(
        &self,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        let caller_uid = self.callers.uid(conn, &header).await?;
        Ok(to_json(&self.logs.usage(caller_uid).await?))
    }

    /// The GPU inventory and which job holds each GPU, JSON.
    async fn gpus(&self) -> zbus::fdo::Result<String> {
        Ok(to_json(&self.ask(ApiRequest::Gpus).await??))
    }

    /// The image store's images (`ptrain images`), JSON array of
    /// ImageView: every image; a caller other than root sees only their
    /// own name among its users (and how many others there are).
    async fn images(
        &self,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        let caller_uid = self.callers.uid(conn, &header).await?;
        Ok(to_json(
            &self
                .ask(|reply| ApiRequest::Images { caller_uid, reply })
                .await??,
        ))
    }

    /// Every notification delivery (pending, retrying, delivered, dead,
    /// with the last error), JSON array of DeliveryView. Root only: they
    /// name the admin's channels.
    async fn notifications(
        &self,
        #[zbus(connection)] conn: &zbus::Connection,
        #[zbus(header)] header: zbus::message::Header<'_>,
    ) -> zbus::fdo::Result<String> {
        if self.callers.uid(conn, &header).await? != 0 {
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
        if self.callers.uid(conn, &header).await? != 0 {
            return Err(ApiError::RootOnly("re-send notifications").into());
        }
        let target = if all_dead {
            RetryTarget::AllDead
        } else {
            RetryTarget::Key(key)
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
    fn hold(&self, id: &str) -> zbus::Result<String>;
    fn release(&self, id: &str) -> zbus::Result<String>;
    fn pause(&self, id: &str) -> zbus::Result<String>;
    fn resume(&self, id: &str) -> zbus::Result<String>;
    fn update(&self, id: &str, changes: &str) -> zbus::Result<String>;
    fn restart(&self, id: &str, as_id: &str) -> zbus::Result<String>;
    fn rejected(&self) -> zbus::Result<String>;
    fn gpus(&self) -> zbus::Result<String>;
    fn images(&self) -> zbus::Result<String>;
    fn logs(&self, id: &str, lines: u32) -> zbus::Result<String>;
    fn open_logs(
        &self,
        id: &str,
        lines: u32,
        since_usec: u64,
        follow: bool,
    ) -> zbus::Result<zbus::OwnedFd>;
    fn open_attempt_logs(
        &self,
        id: &str,
        attempt: u32,
        lines: u32,
        since_usec: u64,
    ) -> zbus::Result<zbus::OwnedFd>;
    fn log_usage(&self) -> zbus::Result<String>;
    fn history(&self, query: &str) -> zbus::Result<String>;
    fn report(&self, query: &str) -> zbus::Result<String>;
    fn fair_share(&self) -> zbus::Result<String>;
    fn notifications(&self) -> zbus::Result<String>;
    fn retry_notifications(&self, key: &str, all_dead: bool) -> zbus::Result<String>;
    #[zbus(property)]
    fn spool_dir(&self) -> zbus::Result<String>;
    #[zbus(signal)]
    fn job_changed(&self, id: String, status: String) -> zbus::Result<()>;
}
