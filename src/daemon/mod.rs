//! The daemon: one task owns every job's state and applies events in
//! order (spool files, systemd signals, API requests). No lock is held
//! across an await; other tasks only send events.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::os::fd::OwnedFd;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

mod admission;
mod checkpoints;
mod images;
mod lifecycle;
mod live;
mod planning;
pub mod scan;

use admission::Admission;

use std::sync::Arc;

use crate::api::DaemonApi;
use crate::board::{Board, QueuedDetail};
use crate::config::Config;
use crate::fsutil::{self, FileIdentity};
use crate::gpu::{GpuInfo, GpuInventory, GpuState};
use crate::requests::{ApiError, ApiRequest, Change};
use crate::scheduler::{self, Rules};
use crate::spec::checkpoint::CheckpointSignal;
use crate::spec::{JobId, JOB_UNIT_PREFIX};
use crate::spool::{self, SpoolEvent, SpoolRead};
use crate::store::{JobRecord, JobState, Outcome, RejectRecord, SpoolSource, Store};
use crate::systemd::{Systemd, SystemdError, UnitSignal, UnitState};
use crate::views::{GpuView, GpusView, JobView};
use crate::{now_micros, unit, users, DBUS_NAME, DBUS_PATH};

/// Which bound of `[retention]` a quarantine entry went past.
#[derive(Clone, Copy)]
enum QuarantineBound {
    MaxAge,
    PerUser,
}

/// Fault injection for the crash tests: with `PTRAIN_CRASH_AT=POINT` (or
/// `POINT:N`, the Nth time) ptraind kills itself with SIGKILL when it
/// reaches that named point, exactly as the OOM killer would.
fn crash_point(point: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static TARGET: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static HITS: AtomicU64 = AtomicU64::new(0);
    let target = TARGET.get_or_init(|| {
        let spec = std::env::var("PTRAIN_CRASH_AT").ok()?;
        let (name, nth) = spec.split_once(':').unwrap_or((&spec, "1"));
        Some((name.to_owned(), nth.parse().unwrap_or(1)))
    });
    if let Some((name, nth)) = target {
        if name == point && HITS.fetch_add(1, Ordering::SeqCst) + 1 == *nth {
            error!(point, "PTRAIN_CRASH_AT: killing ptraind");
            // SAFETY: kill(2) on our own pid.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("{0}")]
    UnsafeSpool(String),
    #[error(transparent)]
    Notify(#[from] crate::notifications::NotifyError),
    #[error("cannot set up {what} {path}: {source}")]
    Setup {
        what: &'static str,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Runtime(#[from] crate::runtime::RuntimeError),
    #[error(transparent)]
    Systemd(#[from] SystemdError),
    #[error(transparent)]
    Gpu(#[from] crate::gpu::GpuError),
    #[error("cannot serve the D-Bus API as {DBUS_NAME}: {0}; is the D-Bus policy installed (packaging/dbus) and is another ptraind running?")]
    Api(zbus::Error),
    #[error("the systemd {0} signal stream ended (D-Bus connection lost); ptraind exits so that systemd restarts it, and it re-attaches to every job")]
    SignalsLost(&'static str),
    #[error("cannot watch the spool: {0}")]
    Watch(#[from] notify::Error),
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    #[error(transparent)]
    EndOrder(#[from] crate::history::EndOrderError),
    #[error("{0}")]
    Scan(String),
}

/// Everything the state task reacts to.
pub enum Event {
    Unit(UnitSignal),
    Api(ApiRequest),
    /// The unit wrote no output for its job's idle timeout ([`crate::logs`]).
    Idle(String),
    /// Time to send a launch again whose StartTransientUnit got no answer.
    Relaunch(JobId),
    /// What a unit looked like when ptraind asked off the state task
    /// (after systemd came back on the bus: `Daemon::look_again_at_all`).
    Looked {
        unit: String,
        state: Result<UnitState, SystemdError>,
    },
    /// A job's image is in the store and its root made, or why not
    /// (`images::Images::want`).
    ImageReady {
        id: JobId,
        /// The job the pull was started for: the answer is applied only
        /// to it (`images::Wanted`).
        wanted: images::Wanted,
        result: Result<crate::store::ReadyImage, String>,
    },
    /// The image store's collector asks which images the live jobs need
    /// (`images::Images`: asked while no pull runs).
    ImagesInUse(tokio::sync::oneshot::Sender<images::InUse>),
    /// systemd froze or thawed a job's unit, or did not (`error`), as
    /// `ptrain pause` or `resume` asked ([`Daemon::pause`]).
    Freezer {
        id: JobId,
        pause: bool,
        error: Option<String>,
    },
    /// The accounting database's fair-share figures for the runs that
    /// ended before this start (`Daemon::read_back_fair_share`).
    FairShareRead(Result<crate::fair_share::Usage, String>),
    /// The accounting database's sums for the quota window of `per`, of
    /// the runs that ended before this start (`Daemon::read_back_quotas`).
    QuotaWindowRead {
        per: std::time::Duration,
        sums: Result<Vec<(u32, u64, f64)>, String>,
    },
    /// systemd answered a job's StartTransientUnit (sent by `Daemon::dispatch_launch`).
    Started {
        id: JobId,
        unit: String,
        result: Result<(), SystemdError>,
    },
}

/// StartTransientUnit calls out at once. The state task never awaits one:
/// each is a task of its own whose answer comes back as an event, so a
/// burst of launches cannot hold up the API, claims or the watchdog. The
/// bound keeps ptraind far under dbus-daemon's 128 pending replies per
/// connection. Later launches wait in [`Daemon::launch_backlog`], and count
/// against [`MAX_TRACKED_UNITS`] like started ones ([`Daemon::tracked_units`]):
/// when they did not, a kill -9 flood of 1,000 jobs
/// (tests/integration/durability.rs) had systemd track more references than
/// dbus-daemon's 512 match rules allow, and it dropped off the bus.
const MAX_LAUNCHES_IN_FLIGHT: usize = 16;
/// How long a launch whose StartTransientUnit got no answer waits before
/// it is sent again.
const LAUNCH_RETRY: std::time::Duration = std::time::Duration::from_secs(2);
/// How long a StartTransientUnit may take before it counts as unanswered
/// (systemd answers in milliseconds, in seconds when very busy).
const LAUNCH_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// How long a FreezeUnit or ThawUnit may take: systemd answers once the
/// cgroup is frozen, which a process in an uninterruptible wait delays.
/// How long a deferred stop that systemd refused waits to be asked again.
const STOP_RETRY: std::time::Duration = std::time::Duration::from_secs(10);
const FREEZER_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

pub struct Daemon {
    config: Config,
    store: Arc<Store>,
    systemd: Systemd,
    inventory: Arc<dyn GpuInventory>,
    spool_fd: OwnedFd,
    /// Queued, launching and running jobs, and the indices over them.
    live: live::Live,
    /// What callers read without the state task: each live job's view,
    /// and the newest ends' summaries (the records stay on disk).
    board: Arc<Board>,
    /// The order in which the jobs in history ended, on disk.
    end_order: crate::history::EndOrder,
    /// Units we started (or adopted) and still wait to see end.
    by_unit: HashMap<String, JobId>,
    /// Spool file owners looked up recently.
    owners: users::OwnerCache,
    /// Quarantined files by owner, for `[retention]`.
    quarantine: crate::store::QuarantineIndex,
    /// When each file the quarantine held at the start was refused: one
    /// a crash left in the spool after it was quarantined is refused
    /// again under the same entry and event ids, not a second time.
    refused_before: HashMap<crate::store::RefusedFile, u64>,
    /// Spool entries we could neither claim nor remove (a user's non-empty
    /// directory): refused once, then left alone.
    stuck_entries: HashSet<(u64, u64)>,
    /// The ptraind binary: each unit's ExecStart is `ptraind exec-job`.
    ptraind: std::path::PathBuf,
    /// How image jobs' units run `ptraind` in the image's root.
    host_exec: Option<crate::runtime::HostExec>,
    /// The image store and its pulls (`Err`: why it could not be opened;
    /// image jobs then end with that reason).
    images: Result<images::Images, String>,
    /// Each job's launch files and result directory.
    runtime: crate::runtime::JobRuntime,
    /// Jobs whose unit is gone while its exit recorder still runs: their
    /// end is recorded when the recorder's unit ends.
    awaiting_recorder: HashSet<JobId>,
    /// Launching jobs whose StartTransientUnit waits for a free call.
    launch_backlog: std::collections::VecDeque<JobId>,
    launches_in_flight: usize,
    /// Launched jobs whose unit systemd has not yet shown running or
    /// ended: each has a start job pending in systemd, or soon will
    /// (waiting for a call) ([`MAX_STARTS_PENDING`]).
    starting: HashSet<JobId>,
    /// Where the launch tasks send systemd's answers.
    events: mpsc::UnboundedSender<Event>,
    /// When a state write last failed; cleared by a retry that succeeds.
    store_failed_at: Option<tokio::time::Instant>,
    /// `[policy]` with group names resolved.
    policy: crate::policy::Policy,
    /// Free GPUs the last plan kept for waiting jobs, for `ptrain gpus`.
    reserved: BTreeMap<u32, JobId>,
    /// What the last plan found each GPU job it read waits for, for
    /// `ptrain status` (a cap, GPUs kept for a job ahead, busy GPUs).
    waits: BTreeMap<JobId, scheduler::Wait>,
    /// The GPUs (as [`scheduler::inventory_fingerprint`]) every queued job
    /// was last checked against for whether it can ever start: a plan
    /// checks them all again only when the GPUs change.
    never_checked_against: Option<u64>,
    /// When to plan again although nothing happened; see [`Daemon::schedule`].
    gpu_replan_at: Option<tokio::time::Instant>,
    /// When the GPUs running jobs hold are next looked at (NVML only).
    gpu_watch_at: Option<tokio::time::Instant>,
    /// The status line systemd shows, coalesced.
    status: StatusLine,
    /// Cancelled when systemd's signals are lost for good: the loop exits
    /// so that systemd restarts ptraind, which re-attaches to every job;
    /// `lost_stream` names what was lost.
    signals_lost: CancellationToken,
    lost_stream: std::sync::Arc<std::sync::Mutex<Option<&'static str>>>,
    /// Callers' requests (the D-Bus API's), taken by the loop.
    requests: mpsc::UnboundedReceiver<ApiRequest>,
    /// Where the status line and watchdog pings go, off the state task.
    notify_socket: crate::notify_socket::NotifySocket,
    /// What the spool's watcher saw, in the order it saw it; taken into
    /// the intake whenever the loop looks ([`Daemon::fresh_file_waiting`]).
    spool_events: mpsc::UnboundedReceiver<SpoolEvent>,
    /// Spool files seen and not yet claimed, taken in turn by owner.
    intake: spool::FairIntake,
    /// A plan stopped at [`PASS_BUDGET`] with launches left: plan again
    /// once the API and systemd's signals had their turn.
    schedule_again: bool,
    /// Sweep id → its members, in expansion order.
    groups: BTreeMap<JobId, Vec<JobId>>,
    /// Queued jobs that may not start yet (dependencies, max_parallel).
    blocked: HashSet<JobId>,
    /// Hands notification intents to the sender task (never waits on it).
    notifier: crate::notifications::Notifier,
    /// Delivery status per notification key, read before compacting a job.
    outbox: crate::notifications::outbox::Outbox,
    /// What ptraind last told of each GPU's health (`gpu-unhealthy`,
    /// `gpu-healthy`), across restarts.
    gpu_health: crate::gpu_health::Ledger,
    /// What the Prometheus endpoint reports; updated as jobs move.
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// Output readers, the idle-output watchdog and archives.
    logs: crate::logs::Logs,
    /// (id, status) of each job change, for [`spawn_job_signals`] to emit.
    job_signals: mpsc::UnboundedSender<(String, String)>,
    /// Owners whose workdir's file system did not answer, and since when.
    slow_workdirs: HashMap<u32, tokio::time::Instant>,
    /// Jobs whose image became ready since the last plan: recorded after
    /// it unless the plan launched them (the launch's write-ahead save
    /// records the image), so a warm image job's start waits on one
    /// durable write, not two.
    images_unrecorded: Vec<JobId>,
    /// The accounting database's writer thread (issue 23): each recorded
    /// end is sent there, never written from this task.
    accounting: Option<crate::accounting::db::Writer>,
    /// `[policy] fair_share`: each user's and group's decayed GPU use
    /// ([`crate::fair_share`]), read back from the accounting database at
    /// the start and added to at each end.
    fair_share: Option<crate::fair_share::Ledger>,
    /// `gpu_hours` quotas ([`crate::quota`]): each window's use, read back
    /// from the accounting database at the start and added to at each end.
    quotas: crate::quota::Quotas,
    /// The owners over their quota at the last plan, with the reason
    /// their queued GPU jobs show; and when the first of them is under it
    /// again (a plan then).
    over_quota: HashMap<u32, String>,
    quota_wake_at: Option<tokio::time::Instant>,
    /// Entries under stray names, refused when their grace is over.
    strays: spool::Strays,
    /// Running jobs whose units systemd is stopping without ptraind having
    /// asked ([`Daemon::note_stop_from_outside`]).
    stopping_outside: HashSet<JobId>,
    /// Running jobs' checkpoint signals and ptraind's deferred stops.
    checkpoints: checkpoints::Timers,
    /// Jobs whose FreezeUnit or ThawUnit is out ([`Daemon::pause`]): what
    /// a look at their unit says of the freezer may be older than it.
    freezing: HashSet<JobId>,
    /// Ended units still referenced, for `systemctl status`; released
    /// oldest first (`[jobs] keep_ended_units`, `max_kept_units`).
    kept: crate::kept_units::KeptUnits,
    /// The tasks a stop waits for (under [`SHUTDOWN_GRACE`]): the emitter
    /// of the last JobChanged signals. Timers and calls whose answers only
    /// the loop would read are not in it: the next start re-attaches.
    tasks: tokio_util::task::TaskTracker,
}

/// How long a stop waits for the last notifications and signals
/// ([`Daemon::shut_down`]); the unit's `TimeoutStopSec=30s` is above it.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(20);
/// Most events applied before the loop plans and looks at other work.
const MAX_EVENT_BATCH: usize = 256;
/// How long one pass of the loop (a batch of events, claims or launches)
/// may hold the state task before the API and systemd's signals get their
/// turn: each claim, launch and end costs fsyncs, and a burst of 10,000
/// must not make another user's `ptrain status` wait for all of them
/// (`make bench`, `responsive.*`). At least one item is done per pass.
const PASS_BUDGET: std::time::Duration = std::time::Duration::from_millis(10);
/// The waits between tries to subscribe to systemd's signals again after
/// it came back on the bus; after the last, ptraind exits to be restarted.
const RESUBSCRIBE_BACKOFF: [std::time::Duration; 5] = [
    std::time::Duration::from_secs(1),
    std::time::Duration::from_secs(2),
    std::time::Duration::from_secs(4),
    std::time::Duration::from_secs(8),
    std::time::Duration::from_secs(15),
];

/// How many of the most recent ends `ListRecent` (`ptrain list`) shows
/// whole, read from their records; older ones, and `List` (`--all`, up
/// to 20,000, whose reply must not cost a read per job), are the
/// summaries kept in memory, marked `summary` (`ptrain status ID` reads
/// the rest).
const FULL_ENDS_LISTED: usize = 50;
/// Most jobs one `List` reply carries (dbus-daemon's default maximum
/// message on the system bus is 32 MiB).
const MAX_LIST_ALL: usize = 20_000;
/// Most spool files claimed in one go (each costs a few fsyncs).
const MAX_SPOOL_BATCH: usize = 64;
/// Most job units referenced at once. systemd's connection to dbus-daemon
/// gets a match rule per client reference it tracks, and dbus-daemon cuts
/// a connection past 512 (max_match_rules_per_connection): past that,
/// systemd drops off the bus and forgets every reference. Jobs beyond this
/// wait in ptraind's queue, which costs nothing.
const MAX_TRACKED_UNITS: usize = 256;
/// Most launches whose unit has not yet been seen running, counting those
/// waiting for a call. StartTransientUnit returns once systemd has queued
/// the start job, and systemd tracks the caller of each pending job with a
/// match rule of its own, besides the unit's reference: with every tracked
/// unit also starting, a burst took systemd past dbus-daemon's 512 match
/// rules, and it was cut off the bus nine times in a 3,000-job burst
/// (`make bench`). 256 references and 64 pending starts stay under it.
const MAX_STARTS_PENDING: usize = 64;
/// Most of those one owner may have: a user whose starts hang (a workdir
/// on a file system that stopped answering blocks the unit's `chdir`
/// until systemd's start timeout) leaves the others a quarter of them.
const MAX_STARTS_PER_OWNER: usize = 48;

/// How long an owner whose workdir's file system hung goes unchecked.
const SLOW_WORKDIR_PAUSE: std::time::Duration = std::time::Duration::from_secs(600);

/// How long to wait before retrying after a failed state write.
const STORE_RETRY_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);
/// How long GPU jobs that wait on an NVML inventory go without a new plan.
const GPU_REPLAN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);
/// The status line (`systemctl status ptraind`) is sent at most this often:
/// each one is a message systemd handles and announces on the bus, and in
/// a burst the line changes with every event, several times per job.
const STATUS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// What was last sent as the status line, and when the next may go.
#[derive(Default)]
struct StatusLine {
    sent: String,
    sent_at: Option<tokio::time::Instant>,
    /// A newer line waits until then.
    flush_at: Option<tokio::time::Instant>,
}

/// Real, effective, saved and filesystem uids of a process, from
/// /proc/PID/status.
fn process_uids(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line["Uid:".len()..]
        .split_whitespace()
        .map(|u| u.parse().ok())
        .collect()
}

/// This binary's path, for the units' ExecStart (`ptraind exec-job`).
fn ptraind_path() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|_| "/usr/sbin/ptraind".into());
    // After a package upgrade replaced the binary, name the new one.
    let text = exe.display().to_string();
    match text.strip_suffix(" (deleted)") {
        Some(path) => path.into(),
        None => exe,
    }
}

/// Runs ptraind until `cancel` fires. Returns after state is consistent on
/// disk; running jobs keep running (they are systemd units, not children).
pub async fn run(config: Config, cancel: CancellationToken) -> Result<(), DaemonError> {
    let setup = |what, path: &std::path::Path| {
        let path = path.to_owned();
        move |source| DaemonError::Setup { what, path, source }
    };
    spool::ensure_spool_dir(&config.spool_dir)
        .map_err(setup("spool directory", &config.spool_dir))?;
    spool::check_spool_dir(&config.spool_dir).map_err(DaemonError::UnsafeSpool)?;
    let spool_fd =
        fsutil::open_dir(&config.spool_dir).map_err(setup("spool directory", &config.spool_dir))?;
    let store = Arc::new(Store::open(&config.state_dir)?);
    let runtime = crate::runtime::JobRuntime::open(&config.runtime_dir)?;
    let inventory: Arc<dyn GpuInventory> = crate::gpu::open_inventory(&config.gpus)?.into();
    info!(backend = inventory.backend(), "GPU inventory ready");

    // Two queues: systemd, API and idle events first, spool files after
    // them, so a flood of files never delays recording a job's end.
    let (tx, mut rx) = mpsc::unbounded_channel::<Event>();
    let (spool_tx, spool_rx) = mpsc::unbounded_channel::<SpoolEvent>();
    let images_dir = config.state_dir.join("images");
    let images = images::Images::open(&images_dir, &config.images, tx.clone());
    let systemd = Systemd::connect().await?;
    let unit_tx = tx.clone();
    let signals_lost = CancellationToken::new();
    let lost = signals_lost.clone();
    let lost_stream = std::sync::Arc::new(std::sync::Mutex::new(None));
    let lost_name = lost_stream.clone();
    systemd
        .forward_signals(
            &[JOB_UNIT_PREFIX, crate::spec::RECORDER_PREFIX],
            move |signal| {
                let _ = unit_tx.send(Event::Unit(signal));
            },
            move |stream| {
                if let Ok(mut name) = lost_name.lock() {
                    name.get_or_insert(stream);
                }
                lost.cancel();
            },
        )
        .await?;

    let notifier = crate::notifications::Notifier::start(&config.notifications, &config.state_dir)?;
    let idle_tx = tx.clone();
    let logs = crate::logs::Logs::start(&config, move |unit| {
        let _ = idle_tx.send(Event::Idle(unit));
    });
    let outbox = crate::notifications::outbox::Outbox::open(&config.state_dir).map_err(setup(
        "the notification outbox",
        &config.state_dir.join("outbox"),
    ))?;
    let gpu_health = crate::gpu_health::Ledger::load(&config.state_dir).map_err(setup(
        "the GPU health ledger",
        &config.state_dir.join("gpu-health.json"),
    ))?;
    // What must finish before ptraind exits ([`Daemon::shut_down`]).
    let tasks = tokio_util::task::TaskTracker::new();
    let job_signals = spawn_job_signals(&tasks, systemd.connection().clone());
    // Callers' requests: the loop takes them first, and a pass under way
    // yields to them between its steps ([`Daemon::callers_waiting`]).
    let (api_tx, api_rx) = mpsc::unbounded_channel();
    let board = Arc::new(Board::new(store.clone(), inventory.clone()));
    // Rebuilt from the records by the restore.
    let end_order = crate::history::EndOrder::rebuild(&config.state_dir, Vec::new())?;
    let mut daemon = Daemon {
        board: board.clone(),
        end_order,
        logs,
        job_signals,
        notifier,
        outbox,
        gpu_health,
        config,
        store,
        systemd,
        inventory,
        spool_fd,
        live: live::Live::default(),
        owners: Default::default(),
        quarantine: Default::default(),
        refused_before: HashMap::new(),
        by_unit: HashMap::new(),
        stuck_entries: HashSet::new(),
        ptraind: ptraind_path(),
        host_exec: crate::runtime::HostExec::detect(&ptraind_path()),
        images,
        runtime,
        awaiting_recorder: HashSet::new(),
        launch_backlog: Default::default(),
        launches_in_flight: 0,
        starting: HashSet::new(),
        events: tx.clone(),
        store_failed_at: None,
        policy: crate::policy::Policy::none(),
        reserved: BTreeMap::new(),
        waits: BTreeMap::new(),
        never_checked_against: None,
        status: StatusLine::default(),
        notify_socket: crate::notify_socket::NotifySocket::start(),
        gpu_replan_at: None,
        gpu_watch_at: None,
        groups: BTreeMap::new(),
        blocked: HashSet::new(),
        metrics: Default::default(),
        intake: Default::default(),
        schedule_again: false,
        kept: Default::default(),
        tasks,
        stopping_outside: HashSet::new(),
        checkpoints: Default::default(),
        freezing: HashSet::new(),
        strays: Default::default(),
        slow_workdirs: HashMap::new(),
        images_unrecorded: Vec::new(),
        requests: api_rx,
        spool_events: spool_rx,
        signals_lost: signals_lost.clone(),
        lost_stream: lost_stream.clone(),
        accounting: None,
        fair_share: None,
        quotas: crate::quota::Quotas::new([], 0),
        over_quota: HashMap::new(),
        quota_wake_at: None,
    };
    daemon.kept = crate::kept_units::KeptUnits::new(daemon.config.kept_units);
    daemon.policy = crate::policy::Policy::from_system(&daemon.config.policy);
    daemon.restore().await?;
    daemon.logs.restored(daemon.live.records());
    let restored: Vec<JobId> = daemon.live.records().map(|r| r.id.clone()).collect();
    for id in &restored {
        daemon.post_view(id);
    }
    daemon.prune_history();
    // After the restore: its back-fill reads the records restore settled.
    if daemon.config.accounting.enabled {
        daemon.accounting = Some(crate::accounting::db::Writer::start(
            &daemon.config.state_dir,
        ));
    } else {
        info!("accounting is off ([accounting] enabled = false): no run is measured or kept");
    }
    daemon.read_back_fair_share();
    daemon.quotas = crate::quota::Quotas::new(daemon.config.limits.quotas(), now_micros());
    daemon.read_back_quotas();

    // The API comes up after the state is restored, so no caller ever sees
    // a half-loaded daemon.
    let conn = daemon.systemd.connection().clone();
    let metrics_api = api_tx.clone();
    conn.object_server()
        .at(
            DBUS_PATH,
            DaemonApi {
                requests: api_tx,
                board,
                callers: Default::default(),
                privacy: daemon.config.privacy,
                logs: daemon.logs.clone(),
                spool_dir: daemon.config.spool_dir.clone(),
                accounting: daemon.accounting.clone(),
            },
        )
        .await
        .map_err(DaemonError::Api)?;
    conn.request_name(DBUS_NAME)
        .await
        .map_err(DaemonError::Api)?;
    let _watcher = spool::watch(&daemon.config.spool_dir, move |event| {
        let _ = spool_tx.send(event);
    })?;
    // Files dropped while ptraind was down (or before the watch began):
    // queued as events, claimed by the loop after READY=1, so thousands of
    // leftovers never hold up the start.
    daemon.rescan();
    daemon.forget_refused_before_once_listed();
    daemon.schedule().await;

    // Before READY=1: an endpoint the admin asked for that cannot listen
    // fails the start, rather than going missing unnoticed.
    let sources = crate::metrics::Sources {
        api: metrics_api,
        notifier: daemon.notifier.clone(),
    };
    let metrics = daemon.metrics.clone();
    if let Some(addr) =
        crate::metrics::start(&daemon.config.metrics, metrics, sources, cancel.clone()).await?
    {
        info!(%addr, "Prometheus metrics at http://{addr}/metrics");
    }

    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    daemon.notify_status();
    info!(spool = %daemon.config.spool_dir.display(), jobs = daemon.live.len(), finished = daemon.end_order.len(), "ptraind ready");

    let watchdog = sd_notify::watchdog_enabled().map(|d| d / 2);
    let mut watchdog_tick =
        tokio::time::interval(watchdog.unwrap_or(std::time::Duration::from_secs(3600)));
    loop {
        // Armed only after a state write failed (disk full, I/O error):
        // nothing signals that space came back, so look again in a while.
        let retry_at = daemon.store_failed_at.map(|t| t + STORE_RETRY_INTERVAL);
        let replan_at = daemon.gpu_replan_at;
        let status_at = daemon.status.flush_at;
        let strays_at = daemon.strays.next_due();
        let release_at = daemon.kept.next_due().map(instant_of);
        let begin_at = daemon.live.next_begin().map(instant_of);
        let step_at = daemon.checkpoints.next_due().map(instant_of);
        let quota_at = daemon.quota_wake_at;
        tokio::select! {
            // In this order: a flood of spool files must starve neither the
            // watchdog nor the recording of jobs that end.
            biased;
            _ = cancel.cancelled() => break,
            _ = signals_lost.cancelled() => {
                let stream = lost_stream.lock().ok().and_then(|name| *name).unwrap_or("D-Bus");
                error!(stream, "lost systemd's signals; exiting so that systemd restarts ptraind, which re-attaches to every job");
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
                return Err(DaemonError::SignalsLost(stream));
            }
            _ = watchdog_tick.tick(), if watchdog.is_some() => {
                daemon.notify_socket.watchdog();
            }
            // A file of an owner who had nothing waiting is claimed
            // before anything else: a burst of another user's claims,
            // launches and ends holds it for one step, not for passes.
            _ = std::future::ready(()), if daemon.fresh_file_waiting() => {
                daemon.claim_fresh_files();
                daemon.schedule().await;
                daemon.notify_status();
            }
            // Callers first: a request waits at most for the pass under
            // way ([`PASS_BUDGET`]), never behind a queue of unit events.
            request = daemon.requests.recv() => {
                let Some(request) = request else { break };
                let pass = std::time::Instant::now();
                daemon.handle(Event::Api(request)).await;
                while pass.elapsed() < PASS_BUDGET {
                    let Ok(request) = daemon.requests.try_recv() else { break };
                    daemon.handle(Event::Api(request)).await;
                }
                daemon.schedule().await;
                daemon.notify_status();
            }
            event = rx.recv() => {
                let Some(event) = event else { break };
                let pass = std::time::Instant::now();
                daemon.handle(event).await;
                for _ in 0..MAX_EVENT_BATCH {
                    if pass.elapsed() >= PASS_BUDGET
                        || daemon.callers_waiting()
                        || daemon.fresh_file_waiting()
                    {
                        break;
                    }
                    let Ok(event) = rx.try_recv() else { break };
                    daemon.handle(event).await;
                }
                // Claims take turns with systemd's signals: a flood of unit
                // events must not hold another user's file unclaimed.
                daemon.claim_and_plan().await;
            }
            _ = tokio::time::sleep_until(retry_at.unwrap_or_else(tokio::time::Instant::now)), if retry_at.is_some() => {
                daemon.retry_after_store_failure().await;
                daemon.schedule().await;
                daemon.notify_status();
            }
            _ = tokio::time::sleep_until(replan_at.unwrap_or_else(tokio::time::Instant::now)), if replan_at.is_some() => {
                daemon.schedule().await;
                daemon.notify_status();
            }
            _ = tokio::time::sleep_until(status_at.unwrap_or_else(tokio::time::Instant::now)), if status_at.is_some() => {
                daemon.notify_status();
            }
            _ = tokio::time::sleep_until(release_at.unwrap_or_else(tokio::time::Instant::now)), if release_at.is_some() => {
                daemon.release_kept_units();
            }
            _ = tokio::time::sleep_until(strays_at.unwrap_or_else(tokio::time::Instant::now)), if strays_at.is_some() => {
                daemon.refuse_strays();
            }
            // A job's `begin` came: it may start now. (The monotonic
            // timer may fire a little before the wall clock says so;
            // then nothing is due and it is armed again for the rest.)
            _ = tokio::time::sleep_until(begin_at.unwrap_or_else(tokio::time::Instant::now)), if begin_at.is_some() => {
                if daemon.live.take_due_begins(now_micros()) {
                    daemon.schedule().await;
                    daemon.notify_status();
                }
            }
            // A user's oldest GPU-hours aged out of their quota's window.
            _ = tokio::time::sleep_until(quota_at.unwrap_or_else(tokio::time::Instant::now)), if quota_at.is_some() => {
                daemon.quota_wake_at = None;
                daemon.schedule().await;
                daemon.notify_status();
            }
            // A running job's checkpoint signal, or the stop after one.
            _ = tokio::time::sleep_until(step_at.unwrap_or_else(tokio::time::Instant::now)), if step_at.is_some() => {
                daemon.take_checkpoint_steps().await;
            }
            // Every file seen goes into the fair intake at once (a name
            // costs an lstat); claims are taken from it a pass at a time.
            event = daemon.spool_events.recv() => {
                let Some(event) = event else { break };
                daemon.note_spool_event(event);
                daemon.claim_and_plan().await;
            }
            _ = std::future::ready(()), if !daemon.intake.is_empty() => {
                daemon.claim_a_pass().await;
                daemon.schedule().await;
                daemon.prune_history();
                daemon.notify_status();
            }
            _ = std::future::ready(()), if daemon.schedule_again => {
                daemon.schedule().await;
                daemon.notify_status();
            }
        }
    }
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    info!("ptraind stopping; running jobs keep running");
    daemon.shut_down().await;
    Ok(())
}

/// What admission knows of the jobs: the live map, the history, the
/// sweeps, and each claim's stored descriptor.
impl admission::Known for Daemon {
    fn namesake(&self, id: &JobId) -> Option<admission::Namesake> {
        if let Some(live) = self.live.get(id) {
            return Some(admission::Namesake {
                source: live.source.clone(),
                status: live.status(),
                owner_name: live.owner.name.clone(),
            });
        }
        let ended = self.board.ended(id)?;
        Some(admission::Namesake {
            source: ended.source.clone(),
            status: ended.status(),
            owner_name: ended.owner_name.to_string(),
        })
    }

    fn sweep_members(&self, id: &JobId) -> Option<&[JobId]> {
        self.groups.get(id).map(Vec::as_slice)
    }

    fn is_taken(&self, id: &JobId) -> bool {
        self.live.contains(id) || self.groups.contains_key(id) || self.board.ended(id).is_some()
    }

    fn owner_of(&self, id: &JobId) -> Option<(u32, String)> {
        match self.live.get(id) {
            Some(live) => Some((live.owner.uid, live.owner.name.clone())),
            None => self
                .board
                .ended(id)
                .map(|ended| (ended.owner_uid, ended.owner_name.to_string())),
        }
    }

    fn queued_of(&self, uid: u32) -> usize {
        self.live.queued_of(uid)
    }

    fn claimed_from(&self, id: &JobId, bytes: &[u8]) -> bool {
        self.store.descriptor(id).is_ok_and(|d| d == bytes)
    }

    fn gpus(&self) -> Option<Vec<GpuInfo>> {
        self.inventory.snapshot().ok()
    }
}

/// The monotonic instant of a wall-clock moment (µs since the epoch),
/// for the loop's timers; a moment passed is now.
/// The jobs a change applies to ([`Daemon::steered`]).
struct Steered {
    is_sweep: bool,
    members: Vec<(JobId, JobState, &'static str)>,
}

fn instant_of(moment: u64) -> tokio::time::Instant {
    tokio::time::Instant::now()
        + std::time::Duration::from_micros(moment.saturating_sub(now_micros()))
}

/// FreezeUnit (`pause`) or ThawUnit, within [`FREEZER_CALL_TIMEOUT`];
/// the error in words.
async fn freezer_call(systemd: &Systemd, unit: &str, pause: bool) -> Result<(), String> {
    let call = async {
        if pause {
            systemd.freeze_unit(unit).await
        } else {
            systemd.thaw_unit(unit).await
        }
    };
    match tokio::time::timeout(FREEZER_CALL_TIMEOUT, call).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "systemd did not answer in {}s",
            FREEZER_CALL_TIMEOUT.as_secs()
        )),
    }
}

/// A unit's state, or NoAnswer when systemd does not answer in time (zbus
/// would wait forever).
async fn timed_look(systemd: &Systemd, unit: &str) -> Result<UnitState, SystemdError> {
    match tokio::time::timeout(LAUNCH_CALL_TIMEOUT, systemd.unit_state(unit)).await {
        Ok(state) => state,
        Err(_) => Err(SystemdError::NoAnswer {
            call: "GetUnit",
            unit: unit.to_string(),
            secs: LAUNCH_CALL_TIMEOUT.as_secs(),
        }),
    }
}

impl Daemon {
    /// A stop as the unit file promises: the notifications due are sent
    /// and the attempts under way finish, and the last JobChanged signals
    /// go out, within [`SHUTDOWN_GRACE`] (under the unit's
    /// `TimeoutStopSec`). What is left is in the outbox and the records,
    /// and the next start takes it up.
    async fn shut_down(self) {
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        // The running jobs' GPU samples since their record was last written
        // are in memory only: written now, the next start goes on from
        // them (a kill -9 loses them).
        for record in self
            .live
            .records()
            .filter(|r| r.state == JobState::Running && !r.gpu_usage.is_empty())
        {
            if let Err(e) = self.store.save(record) {
                warn!(job = %record.id, PTRAIN_JOB = %record.id, error = %e, "cannot keep a running job's GPU samples; its figures go on from its record as last written");
            }
        }
        let Daemon {
            notifier,
            tasks,
            job_signals,
            requests,
            accounting,
            ..
        } = self;
        // Callers that need the state task are told at once that it is
        // gone, not after the drain.
        drop(requests);
        // The rows waiting for their group, written (those of retried
        // attempts have no end record for the next start to back-fill).
        if let Some(accounting) = accounting {
            if tokio::time::timeout_at(deadline, accounting.flush())
                .await
                .is_err()
            {
                warn!("the accounting rows waiting to be written were not; the next start back-fills those of ended jobs");
            }
        }
        // The emitter ends once it has sent what the channel holds.
        drop(job_signals);
        tasks.close();
        match tokio::time::timeout_at(deadline, notifier.drain()).await {
            Ok(Some(drained)) if drained.pending == 0 => {
                info!("every notification due was sent");
            }
            Ok(Some(drained)) => {
                info!(pending = drained.pending, "notifications waiting for a retry are sent after the next start");
            }
            Ok(None) => {}
            Err(_) => warn!(
                secs = SHUTDOWN_GRACE.as_secs(),
                "notifications still under way after {}s are sent again after the next start (same keys)",
                SHUTDOWN_GRACE.as_secs()
            ),
        }
        if tokio::time::timeout_at(deadline, tasks.wait())
            .await
            .is_err()
        {
            warn!("the last JobChanged signals were not all sent; `ptrain wait` re-checks after the next start");
        }
    }

    /// A caller waits: a pass stops after its current step (one state
    /// write, a few ms; tens under a burst's load) and lets the loop
    /// answer first, so a request waits for one step, not a whole pass.
    fn callers_waiting(&self) -> bool {
        !self.requests.is_empty()
    }

    /// After a pass of events: a pass of claims and a plan, unless a
    /// caller waits. Then both come after the answer: the files stay in the
    /// intake (the loop claims while it is not empty) and the plan is due
    /// (`schedule_again`).
    async fn claim_and_plan(&mut self) {
        if self.callers_waiting() {
            self.schedule_again = true;
        } else {
            self.claim_a_pass().await;
            if self.callers_waiting() {
                self.schedule_again = true;
            } else {
                self.schedule().await;
            }
        }
        self.prune_history();
        self.notify_status();
    }

    async fn handle(&mut self, event: Event) {
        match event {
            Event::Unit(signal) => self.on_unit_signal(signal).await,
            Event::Api(request) => self.on_api(request).await,
            Event::Idle(unit) => self.on_idle(&unit).await,
            Event::Started { id, unit, result } => self.on_started(&id, &unit, result).await,
            Event::Relaunch(id) => self.start_unit(&id).await,
            Event::Looked { unit, state } => self.on_looked(&unit, state).await,
            Event::Freezer { id, pause, error } => self.on_freezer(&id, pause, error),
            Event::ImageReady { id, wanted, result } => {
                self.on_image_ready(&id, &wanted, result).await
            }
            Event::ImagesInUse(reply) => {
                let _ = reply.send(images::InUse::of(self.live.records()));
            }
            Event::FairShareRead(usage) => self.on_fair_share_read(usage),
            Event::QuotaWindowRead { per, sums } => self.on_quota_window_read(per, sums),
        }
    }

    /// With `[policy] fair_share`: the runs that end from now on are
    /// counted as they end; those that ended before are read back from
    /// the accounting database, after its back-fill (the writer answers
    /// in order), off this task ([`Event::FairShareRead`]). Until then,
    /// the order counts only what ended since the start.
    fn read_back_fair_share(&mut self) {
        let (Some(half_life), Some(accounting)) =
            (self.config.policy.fair_share_half_life(), &self.accounting)
        else {
            return;
        };
        let ledger = crate::fair_share::Ledger::new(half_life, now_micros());
        let answer = accounting.usage(ledger.since(), half_life);
        self.fair_share = Some(ledger);
        let events = self.events.clone();
        tokio::spawn(async move {
            let _ = events.send(Event::FairShareRead(answer.await));
        });
    }

    fn on_fair_share_read(&mut self, usage: Result<crate::fair_share::Usage, String>) {
        let Some(ledger) = &mut self.fair_share else {
            return;
        };
        match usage {
            Ok(usage) => {
                info!(
                    users = usage.users.len(),
                    "fair share: the usage before this start read back from the accounting database"
                );
                ledger.read_back(&usage);
                self.schedule_again = true;
            }
            Err(e) => warn!(
                error = %e,
                "fair share: cannot read the usage before this start from the accounting database; it counts only the runs that end from now on until ptraind restarts"
            ),
        }
    }

    /// With `gpu_hours` quotas: as for fair share, the runs that ended
    /// before this start are read back from the accounting database (one
    /// query per window length), off this task.
    fn read_back_quotas(&mut self) {
        let Some(accounting) = &self.accounting else {
            return;
        };
        let since = self.quotas.since();
        for (per, bucket_us) in self.quotas.periods() {
            let from = since.saturating_sub(per.as_micros() as u64);
            let answer = accounting.window(from, since, bucket_us);
            let events = self.events.clone();
            tokio::spawn(async move {
                let sums = answer.await;
                let _ = events.send(Event::QuotaWindowRead { per, sums });
            });
        }
    }

    fn on_quota_window_read(
        &mut self,
        per: std::time::Duration,
        sums: Result<Vec<(u32, u64, f64)>, String>,
    ) {
        match sums {
            Ok(sums) => {
                info!(
                    per = %crate::setting::span_text(per),
                    users = sums.iter().map(|s| s.0).collect::<HashSet<_>>().len(),
                    "quotas: the GPU-hours before this start read back from the accounting database"
                );
                self.quotas.read_back(per, &sums);
                self.schedule_again = true;
            }
            Err(e) => warn!(
                error = %e,
                "quotas: cannot read the GPU-hours before this start from the accounting database; they count only the runs that end from now on until ptraind restarts"
            ),
        }
    }

    /// Who of the owners of queued GPU jobs is over their `gpu_hours`
    /// quota now (running jobs count their GPU-seconds so far); their jobs
    /// show why, and the first moment one is under it again wakes a plan.
    /// Costs the owners of queued GPU jobs and the GPUs held.
    fn check_quotas(&mut self) {
        if self.quotas.is_empty() {
            return;
        }
        let now = now_micros();
        let mut running: HashMap<u32, f64> = HashMap::new();
        for id in self.live.held().values() {
            if let Some(r) = self.live.get(id) {
                *running.entry(r.owner.uid).or_default() += r
                    .started_at
                    .map_or(0.0, |s| now.saturating_sub(s) as f64 / 1e6);
            }
        }
        let mut over = HashMap::new();
        let mut wake: Option<u64> = None;
        let owners: Vec<u32> = self.live.queue().gpu_owners().map(|(uid, _)| uid).collect();
        for uid in owners {
            let Some(owner) = self.owners.owner_of_uid(uid) else {
                continue;
            };
            let Some((quota, key)) = self.config.limits.quota_for(&owner.name) else {
                continue;
            };
            let used = running.get(&uid).copied().unwrap_or(0.0);
            if let Some(o) = self.quotas.over(uid, quota, now, used) {
                if let Some(at) = o.under_at {
                    wake = Some(wake.map_or(at, |w| w.min(at)));
                }
                over.insert(
                    uid,
                    o.describe(&owner.name, &key, crate::spec::begin::format_moment),
                );
            }
        }
        self.quota_wake_at = wake.map(instant_of);
        let before = std::mem::replace(&mut self.over_quota, over);
        // Only those who went over or came under: their jobs show it. (The
        // figures of one who stays over move with their running jobs; a
        // change of every plan would cost the queue each time.)
        let crossed: HashSet<u32> = before
            .keys()
            .chain(self.over_quota.keys())
            .filter(|uid| before.contains_key(*uid) != self.over_quota.contains_key(*uid))
            .copied()
            .collect();
        if crossed.is_empty() {
            return;
        }
        for uid in &crossed {
            match self.over_quota.get(uid) {
                Some(why) => info!(uid, "over the GPU-hour quota; its GPU jobs wait: {why}"),
                None => info!(
                    uid,
                    "under the GPU-hour quota again; its GPU jobs may start"
                ),
            }
        }
        let theirs: Vec<JobId> = self
            .live
            .queue()
            .gpu_jobs()
            .filter(|id| crossed.contains(&self.live[*id].owner.uid))
            .cloned()
            .collect();
        self.refresh_queued(theirs.iter());
    }

    /// An ended run, to the accounting database, fair share and quotas;
    /// `only_here`: see [`crate::accounting::db::Writer::record`].
    fn account(&mut self, record: &JobRecord, only_here: bool) {
        if let Some(accounting) = &self.accounting {
            accounting.record(record, only_here);
        }
        if let (Some(ledger), Some(ended_at)) = (&mut self.fair_share, record.ended_at) {
            let account = crate::fair_share::Account {
                uid: record.owner.uid,
                gid: record.owner.gid,
            };
            ledger.ended(account, record.gpu_seconds(), ended_at);
        }
        if let Some(ended_at) = record.ended_at {
            self.quotas
                .ended(record.owner.uid, record.gpu_seconds(), ended_at);
        }
    }

    /// Each owner's fair-share factor now (running jobs count their
    /// GPU-seconds so far): costs the users with usage, the owners of
    /// queued GPU jobs and the GPUs held, never the queue's length.
    fn fair_share_factors(&mut self) -> Option<HashMap<u32, f64>> {
        let standings = self.fair_share_standings()?;
        Some(crate::fair_share::factors(&standings))
    }

    fn fair_share_standings(&mut self) -> Option<Vec<crate::fair_share::Standing>> {
        let ledger = self.fair_share.as_mut()?;
        let now = now_micros();
        let running: Vec<crate::fair_share::Running> = self
            .live
            .held()
            .values()
            .filter_map(|id| self.live.get(id))
            .map(|r| crate::fair_share::Running {
                account: crate::fair_share::Account {
                    uid: r.owner.uid,
                    gid: r.owner.gid,
                },
                // One entry per GPU held: each adds its seconds.
                gpu_seconds: r
                    .started_at
                    .map_or(0.0, |s| now.saturating_sub(s) as f64 / 1e6),
            })
            .collect();
        let queued: Vec<crate::fair_share::Account> = self
            .live
            .queue()
            .gpu_owners()
            .map(|(uid, gid)| crate::fair_share::Account { uid, gid })
            .collect();
        Some(ledger.standings(now, &running, &queued))
    }

    /// A running job wrote nothing for its idle timeout: stop it, and it
    /// ends as `idle-timeout` (see [`crate::job::idle_outcome`]). With
    /// `idle_requires_gpu_idle`, a job whose GPUs still work is left alone
    /// for another window.
    async fn on_idle(&mut self, unit: &str) {
        let Some(id) = self.by_unit.get(unit).cloned() else {
            return;
        };
        let Some(record) = self.live.get(&id) else {
            return;
        };
        let Some(limit) = self.logs.idle_timeout_of(record) else {
            return;
        };
        if record.state != JobState::Running
            || record.stop_requested_by.is_some()
            || record.idle_timeout_hit.is_some()
        {
            return;
        }
        if record.paused {
            // Frozen, it cannot write: another window once it runs.
            self.logs.rearm(unit, limit);
            return;
        }
        if self.config.idle_requires_gpu_idle && !record.gpus.is_empty() {
            let gpus: Vec<u32> = record.gpus.iter().map(|g| g.index).collect();
            let busy = self
                .inventory
                .snapshot()
                .map(|snapshot| crate::logs::busy_gpus(&gpus, &snapshot))
                .unwrap_or_default();
            if !busy.is_empty() {
                info!(job = %id, PTRAIN_JOB = %id, unit, gpus = ?busy, "job wrote no output for its idle_timeout but its GPUs are busy; letting it run");
                self.logs.rearm(unit, limit);
                return;
            }
        }
        let record = self.live.get_mut(&id).expect("looked up above");
        let before = checkpoints::StopMarks::of(record);
        record.idle_timeout_hit = Some(limit.as_secs());
        let plan = checkpoints::plan_stop(record, now_micros());
        if let Err(e) = self.store.save(record) {
            error!(job = %id, PTRAIN_JOB = %id, error = %e, "cannot record the idle stop; trying again after another idle window");
            before.put_back(record);
            self.logs.rearm(unit, limit);
            return;
        }
        warn!(
            job = %id,
            PTRAIN_JOB = %id,
            unit,
            "job wrote no output for {}; stopping it (idle_timeout)",
            humantime::format_duration(limit)
        );
        if let Err(e) = self.carry_out_stop(&id, plan).await {
            error!(job = %id, PTRAIN_JOB = %id, unit, error = %e, "cannot stop an idle job");
        }
    }

    /// Stops a running job for the urgent one ([`crate::preemption`]): the
    /// stop of ptraind's own, checkpoint signal first, recorded with who it
    /// is for, so that its end queues it again ([`lifecycle::requeued`]).
    async fn preempt(&mut self, victim: &JobId, urgent: &JobId) {
        let urgent_priority = self.live.get(urgent).map_or(0, |r| r.spec.priority);
        let Some(record) = self.live.get_mut(victim) else {
            return;
        };
        let before = checkpoints::StopMarks::of(record);
        record.preempted_by = Some(urgent.clone());
        record.stop_requested_by = Some(0);
        let plan = checkpoints::plan_stop(record, now_micros());
        if let Err(e) = self.store.save(record) {
            error!(job = %victim, PTRAIN_JOB = %victim, error = %e, "cannot record the preemption; leaving the job running");
            before.put_back(record);
            record.preempted_by = None;
            return;
        }
        warn!(
            job = %victim,
            PTRAIN_JOB = %victim,
            priority = record.spec.priority,
            for_job = %urgent,
            for_priority = urgent_priority,
            "preempting the job for a queued job of higher priority; it runs again as its next attempt"
        );
        self.post_view(victim);
        if let Err(e) = self.carry_out_stop(victim, plan).await {
            error!(job = %victim, PTRAIN_JOB = %victim, error = %e, "cannot stop the preempted job");
        }
    }

    /// Carries out ptraind's own stop of a running or launching job as
    /// [`checkpoints::plan_stop`] planned it (recorded already): StopUnit
    /// now, or the checkpoint signal now and the stop at its moment. Says
    /// which, for the caller's answer.
    async fn carry_out_stop(
        &mut self,
        id: &JobId,
        plan: checkpoints::StopPlan,
    ) -> Result<Option<String>, SystemdError> {
        let Some(record) = self.live.get(id) else {
            return Ok(None);
        };
        let unit = record.unit.clone();
        match plan {
            checkpoints::StopPlan::Now => {
                self.stop_job_unit(id, &unit).await?;
                Ok(None)
            }
            checkpoints::StopPlan::Later { signal, at } => {
                if self.thaw_to_stop(id) {
                    let (systemd, id, unit) = (self.systemd.clone(), id.clone(), unit.clone());
                    tokio::spawn(async move {
                        if let Err(e) = freezer_call(&systemd, &unit, false).await {
                            warn!(job = %id, PTRAIN_JOB = %id, unit, error = %e, "cannot thaw the paused job for its checkpoint");
                        }
                    });
                }
                let record = &self.live[id];
                self.checkpoints.rearm(record);
                let at = crate::spec::begin::format_moment(at);
                let said = match signal {
                    Some(signal) => {
                        info!(job = %id, PTRAIN_JOB = %id, unit, signal = signal.name(), "sending the job its checkpoint signal; stopping it at {at} (its checkpoint_lead)");
                        self.signal_in_background(id, &unit, signal);
                        format!("{} sent to save a checkpoint", signal.name())
                    }
                    None => "its checkpoint signal was sent before its timeout".to_owned(),
                };
                Ok(Some(format!(
                    "{said}; it stops at {at} (its checkpoint_lead)"
                )))
            }
        }
    }

    /// StopUnit; for a paused job, ThawUnit then StopUnit from a task of
    /// their own, so a slow thaw holds up nobody else.
    async fn stop_job_unit(&mut self, id: &JobId, unit: &str) -> Result<(), SystemdError> {
        if !self.thaw_to_stop(id) {
            return self.systemd.stop_unit(unit).await;
        }
        let systemd = self.systemd.clone();
        let (id, unit) = (id.clone(), unit.to_owned());
        tokio::spawn(async move {
            if let Err(e) = freezer_call(&systemd, &unit, false).await {
                warn!(job = %id, PTRAIN_JOB = %id, unit, error = %e, "cannot thaw the paused job before stopping it");
            }
            if let Err(e) = systemd.stop_unit(&unit).await {
                error!(job = %id, PTRAIN_JOB = %id, unit, error = %e, "cannot stop the job");
            }
        });
        Ok(())
    }

    /// A paused job that ptraind stops runs again first: frozen, its
    /// processes can act on neither the checkpoint signal nor SIGTERM.
    /// Records it; whether the job was paused (the caller thaws it).
    fn thaw_to_stop(&mut self, id: &JobId) -> bool {
        let Some(record) = self.live.get_mut(id).filter(|r| r.paused) else {
            return false;
        };
        record.paused = false;
        if let Err(e) = self.store.save(record) {
            warn!(job = %id, PTRAIN_JOB = %id, error = %e, "cannot record that the paused job runs again to stop");
        }
        info!(job = %id, PTRAIN_JOB = %id, unit = %record.unit, "resuming the paused job to stop it");
        true
    }

    /// Sends a job's checkpoint signal to its main process, off the state
    /// task; a failure is logged with the job's entries.
    fn signal_in_background(&self, id: &JobId, unit: &str, signal: CheckpointSignal) {
        let systemd = self.systemd.clone();
        let (id, unit) = (id.clone(), unit.to_owned());
        tokio::spawn(async move {
            let sent = tokio::time::timeout(
                LAUNCH_CALL_TIMEOUT,
                systemd.signal_main(&unit, signal.number()),
            )
            .await;
            match sent {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    warn!(job = %id, PTRAIN_JOB = %id, unit, error = %e, "cannot send the job its checkpoint signal")
                }
                Err(_) => {
                    warn!(job = %id, PTRAIN_JOB = %id, unit, "systemd did not answer the checkpoint signal in {LAUNCH_CALL_TIMEOUT:?}")
                }
            }
        });
    }

    /// The running jobs' timed steps that fell due ([`checkpoints`]): a
    /// checkpoint signal before a timeout, recorded before it is sent (so
    /// a restart never sends it twice), or the stop that follows the
    /// signal of ptraind's own stop.
    async fn take_checkpoint_steps(&mut self) {
        let now = now_micros();
        for (id, step) in self.checkpoints.take_due(now) {
            let Some(record) = self.live.get_mut(&id) else {
                continue;
            };
            if record.state != JobState::Running {
                continue;
            }
            let unit = record.unit.clone();
            match (step, record.spec.checkpoint) {
                (checkpoints::Step::Signal, Some(checkpoint)) => {
                    record.checkpoint_sent_at = Some(now);
                    if let Err(e) = self.store.save(record) {
                        // Sent all the same: a second signal after a
                        // restart costs less than a checkpoint missed.
                        error!(job = %id, PTRAIN_JOB = %id, error = %e, "cannot record the checkpoint signal");
                    }
                    self.checkpoints.rearm(record);
                    info!(
                        job = %id,
                        PTRAIN_JOB = %id,
                        unit,
                        signal = checkpoint.signal.name(),
                        "sending the job its checkpoint signal: its timeout comes in {} (its checkpoint_lead)",
                        humantime::format_duration(checkpoint.lead)
                    );
                    self.signal_in_background(&id, &unit, checkpoint.signal);
                    self.post_view(&id);
                }
                (checkpoints::Step::Signal, None) => {}
                (checkpoints::Step::Stop, _) => {
                    info!(job = %id, PTRAIN_JOB = %id, unit, "the job's checkpoint_lead is over; stopping it");
                    if let Err(e) = self.stop_job_unit(&id, &unit).await {
                        error!(job = %id, PTRAIN_JOB = %id, unit, error = %e, "cannot stop the job after its checkpoint_lead; trying again in {STOP_RETRY:?}");
                        self.checkpoints.arm(
                            &id,
                            now.saturating_add(STOP_RETRY.as_micros() as u64),
                            checkpoints::Step::Stop,
                        );
                    }
                }
            }
        }
    }

    fn notify_status(&mut self) {
        // Tracked units are the launching and running jobs: counting them
        // costs nothing per finished job in history.
        let running = self.tracked_units();
        let mut status = format!(
            "{} queued, {} running, {} GPUs busy",
            self.live.queue().len(),
            running,
            self.live.held().len()
        );
        if self.store_failed_at.is_some() {
            status.push_str(
                "; state directory not writable (disk full?), new files wait in the spool",
            );
        }
        self.offer_status(status);
        let launching = self.launch_backlog.len()
            + self
                .by_unit
                .values()
                .filter(|id| {
                    self.live
                        .get(id)
                        .is_some_and(|r| r.state == JobState::Launching)
                })
                .count();
        let queued = self.live.queue().len();
        let running = running.saturating_sub(launching);
        self.metrics
            .set_active(queued, launching, running, self.live.held().len());
    }

    /// Sends `status` now, or once STATUS_INTERVAL has passed since the
    /// last one (the loop wakes at `status.flush_at`); an unchanged line
    /// is not sent again.
    fn offer_status(&mut self, status: String) {
        let line = &mut self.status;
        if status == line.sent {
            line.flush_at = None;
            return;
        }
        let now = tokio::time::Instant::now();
        if let Some(next) = line.sent_at.map(|at| at + STATUS_INTERVAL) {
            if now < next {
                line.flush_at = Some(next);
                return;
            }
        }
        self.notify_socket.status(status.clone());
        *line = StatusLine {
            sent: status,
            sent_at: Some(now),
            flush_at: None,
        };
    }

    /// Every record, read by a child process ([`scan`]): the live ones
    /// whole, the sweeps' members, the newest ends' ids and the end order
    /// of all (`STATE/end-order`, written by the child). A long history's
    /// parses then never touch ptraind's heap.
    async fn scan_records(&self) -> Result<scan::Scanned, DaemonError> {
        let notifier = &self.notifier;
        // Intents whose outbox status is not final go out again, with
        // their keys: nothing recorded is lost to a crash.
        let mut deliver = |intents| notifier.deliver(intents);
        scan::scan(&self.config.state_dir, &mut deliver)
            .await
            .map_err(|e| {
                DaemonError::Scan(format!(
                    "cannot read the job records in {}: {e}; fix what it names (the state \
                     directory must be root's and readable), then restart ptraind",
                    self.config.state_dir.join("jobs").display()
                ))
            })
    }

    /// The summaries of the newest ends (`ids`, oldest first), for the
    /// board, from their records (read by the daemon: the summaries are
    /// its to keep).
    fn summarise_newest(&mut self, ids: Vec<JobId>) {
        let mut recent = self.board.recent_mut();
        for id in ids {
            match self.store.load(&id) {
                Ok(record) => recent.insert(&record),
                Err(e) => {
                    warn!(job = %id, PTRAIN_JOB = %id, error = %e, "cannot read a finished job's record again; it is read from disk when asked for")
                }
            }
        }
    }

    /// Loads every record and re-attaches to units that were launched
    /// before a restart.
    async fn restore(&mut self) -> Result<(), DaemonError> {
        // Streamed, in a child: a finished job's record is read, its end
        // noted and the record dropped, so a long history never sits in
        // memory whole, nor leaves ptraind's heap in pieces.
        let scan::Scanned {
            live,
            members,
            newest,
            end_order,
        } = self.scan_records().await?;
        self.end_order = end_order;
        self.summarise_newest(newest);
        // The newest ends were read and dropped: the blocks go back.
        crate::memory::release_freed_memory();
        let per_user = self.config.retention.rejected_per_user;
        let mut refusals = HashMap::new();
        let mut past_retention = Vec::new();
        for entry in self.store.rejected_entries()? {
            past_retention.extend(self.quarantine.add(entry.uid, entry.name.clone(), per_user));
            refusals.insert(entry.name, (entry.notifications, entry.refused));
        }
        for gone in &past_retention {
            refusals.remove(gone);
        }
        // A kept refusal's event not yet delivered or dead goes out again,
        // under its key; one past the per-user bound is dropped below.
        let mut unsent = Vec::new();
        let mut refused_before = HashMap::new();
        for (intents, refused) in refusals.into_values() {
            unsent.extend(
                intents
                    .into_iter()
                    .filter(|i| !self.outbox.is_final(&i.key).unwrap_or(false)),
            );
            refused_before.extend(refused);
        }
        self.refused_before = refused_before;
        unsent.extend(
            self.gpu_health
                .intents()
                .filter(|i| !self.outbox.is_final(&i.key).unwrap_or(false))
                .cloned(),
        );
        self.notifier.deliver(unsent);
        for gone in past_retention {
            self.forget_rejected(&gone, QuarantineBound::PerUser);
        }
        let mut members = members;
        members.sort();
        for (_, id, group) in members {
            self.groups
                .entry(group.own_copy())
                .or_default()
                .push(id.own_copy());
        }
        let mut live = live;
        live.sort_by_key(|r| (r.submitted_at, r.id.clone()));
        let mut to_check = Vec::new();
        for record in live {
            let id = record.id.clone();
            if record.state == JobState::Queued {
                self.queue(record);
            } else {
                // Launching or running.
                self.by_unit.insert(record.unit.clone(), id.clone());
                to_check.push(id);
                self.checkpoints.rearm(&record);
                self.live.restore_active(record);
                self.held_changed();
            }
        }
        // Recorders that wrote after ptraind had recorded the end itself
        // (or an attempt's end, the job queued again since).
        for id in self.store.exit_record_ids() {
            if self
                .live
                .get(&id)
                .is_none_or(|r| r.state == JobState::Queued)
            {
                self.store.remove_exit_record(&id);
            }
        }
        for id in to_check {
            self.reattach(&id).await;
        }
        Ok(())
    }

    async fn reattach(&mut self, id: &JobId) {
        let Some(record) = self.live.get(id) else {
            return;
        };
        let unit = record.unit.clone();
        match self.systemd.ref_unit(&unit).await {
            Ok(()) => {
                info!(job = %id, PTRAIN_JOB = %id, unit, "re-attached to its unit");
                self.check_unit(&unit);
                return;
            }
            Err(SystemdError::NoSuchUnit(_)) => {}
            Err(e) => {
                // The bus is not answering for this unit: keep tracking
                // it, its next signal will tell.
                warn!(job = %id, PTRAIN_JOB = %id, unit, error = %e, "cannot re-attach to unit yet");
                return;
            }
        }
        self.unit_gone(id).await;
    }

    /// The job's unit is not loaded: it ended and was collected while
    /// ptraind did not watch, or it never started.
    async fn unit_gone(&mut self, id: &JobId) {
        let Some(record) = self.live.get(id) else {
            return;
        };
        let unit = record.unit.clone();
        let state = record.state;
        if self.finish_from_exit_record(id).await {
            return;
        }
        if self.recorder_pending(id).await {
            // systemd started the recorder when the unit ended; its end
            // (a signal) brings the record.
            info!(job = %id, PTRAIN_JOB = %id, unit, "job ended; waiting for its exit recorder");
            self.awaiting_recorder.insert(id.clone());
            return;
        }
        // The recorder may have finished between the two looks.
        if self.finish_from_exit_record(id).await {
            return;
        }
        if state == JobState::Launching {
            // Recorded as launching, but systemd never got the unit and
            // it left no exit: it never ran. Start it now, once.
            warn!(job = %id, PTRAIN_JOB = %id, unit, "launch was interrupted; launching now");
            self.by_unit.remove(&unit);
            // Boxed: start_unit comes back here when systemd cannot be read.
            Box::pin(self.start_unit(id)).await;
        } else {
            warn!(job = %id, PTRAIN_JOB = %id, unit, "unit is gone without a recorded exit; its result is unknown");
            self.finish(
                id,
                Outcome::LaunchFailed {
                    reason: "the unit vanished while ptraind was down and left no exit record"
                        .into(),
                },
                None,
            )
            .await;
        }
    }

    /// Records the job's end from what its exit recorder wrote, if it did:
    /// the facts systemd gave the recorder unit.
    async fn finish_from_exit_record(&mut self, id: &JobId) -> bool {
        let Some(exit) = self.store.exit_record(id) else {
            return false;
        };
        let Some(record) = self.live.get(id) else {
            return false;
        };
        let other_invocation = exit.invocation_id.is_some()
            && (record.invocation_id.is_some() && exit.invocation_id != record.invocation_id
                || record
                    .attempts
                    .iter()
                    .any(|a| a.invocation_id == exit.invocation_id));
        // Written before this job was even submitted: a namesake's.
        if other_invocation || exit.recorded_at < record.submitted_at {
            // A namesake's: an earlier job with this id ended after ptraind
            // had recorded it.
            self.store.remove_exit_record(id);
            return false;
        }
        info!(job = %id, PTRAIN_JOB = %id, unit = %record.unit, "job ended while ptraind was not watching; using its recorded exit");
        let (result, code, status) = exit.as_unit_result();
        let unit_state = UnitState {
            active_state: "inactive".into(),
            invocation_id: exit.invocation_id.clone(),
            result: result.clone(),
            exec_main_code: code,
            exec_main_status: status,
            exec_main_exit: exit.recorded_at,
            ..UnitState::default()
        };
        let outcome = crate::job::outcome_of_unit(&result, code, status, record.stop_requested_by);
        self.finish(id, outcome, Some(&unit_state)).await;
        true
    }

    /// Whether systemd still runs (or has queued) one of the job's exit
    /// recorders.
    async fn recorder_pending(&self, id: &JobId) -> bool {
        match self.systemd.any_pending(&id.recorder_units()).await {
            Ok(pending) => pending,
            Err(e) => {
                // Unknown: wait for its signal rather than guess an end.
                warn!(job = %id, PTRAIN_JOB = %id, error = %e, "cannot ask systemd about the job's exit recorder");
                true
            }
        }
    }

    /// An exit recorder's unit ended: its record is complete.
    async fn recorder_ended(&mut self, id: &JobId) {
        if self.awaiting_recorder.remove(id) {
            self.unit_gone(id).await;
        } else if !self.live.contains(id) {
            // ptraind recorded this end from the unit itself already.
            self.store.remove_exit_record(id);
        }
    }

    /// Queues every file in the spool for claiming, a pass at a time
    /// through the loop (at start, and after an inotify overflow).
    fn rescan(&mut self) {
        match spool::scan(&self.config.spool_dir) {
            Ok(listing) => {
                for name in listing.candidates {
                    self.note_spool_file(name);
                }
                for name in listing.strays {
                    self.note_stray(name);
                }
            }
            Err(e) => {
                error!(spool = %self.config.spool_dir.display(), error = %e, "cannot read the spool")
            }
        }
    }

    /// Takes what the spool's watcher saw so far into the intake (an
    /// lstat a name) and says whether an owner who had nothing waiting has
    /// a file there now. The loop claims such a file before any other
    /// work, and each pass of claims, launches or ends stops for it, so
    /// another user's one file waits for one step of a burst, not for its
    /// passes (`make bench`, `responsive.claim`).
    fn fresh_file_waiting(&mut self) -> bool {
        self.take_spool_events();
        self.intake.has_fresh()
    }

    fn take_spool_events(&mut self) {
        while let Ok(event) = self.spool_events.try_recv() {
            self.note_spool_event(event);
        }
    }

    fn note_spool_event(&mut self, event: SpoolEvent) {
        match event {
            SpoolEvent::File(name) => self.note_spool_file(name),
            SpoolEvent::Stray(name) => self.note_stray(name),
            SpoolEvent::Rescan => self.rescan(),
        }
    }

    /// Claims the files of owners who had nothing waiting, one each, in
    /// the order they came; at least one, then for one pass at most.
    fn claim_fresh_files(&mut self) {
        let pass = std::time::Instant::now();
        while self.intake.has_fresh() {
            let Some(name) = self.intake.pop() else { break };
            self.ingest(&name);
            if pass.elapsed() >= PASS_BUDGET {
                break;
            }
            self.take_spool_events();
        }
    }

    /// Puts a spool file in the intake, in its owner's turn.
    fn note_spool_file(&mut self, name: String) {
        let owner = fsutil::lstat_at(&self.spool_fd, &name)
            .ok()
            .map(|st| st.uid);
        self.intake.push(name, owner);
    }

    /// Refuses what is still left under stray names after their grace
    /// ([`spool::STRAY_GRACE`]), a pass at a time ([`PASS_BUDGET`]): their
    /// owners learn through `ptrain rejected`, and the bytes are kept in
    /// quarantine. Root's entries (`lost+found` of a spool that is its own
    /// file system) and hard links (the file may be another user's, whose
    /// quarantine it would fill) are left where they are.
    fn refuse_strays(&mut self) {
        let pass = std::time::Instant::now();
        let now = tokio::time::Instant::now();
        while pass.elapsed() < PASS_BUDGET {
            let Some(name) = self.strays.pop_due(now) else {
                break;
            };
            let Ok(entry) = fsutil::lstat_at(&self.spool_fd, &name) else {
                continue;
            };
            if entry.uid == 0 || (entry.is_regular() && entry.nlink > 1) {
                continue;
            }
            // Another entry came under that name meanwhile: its own grace.
            let grace_ns = spool::STRAY_GRACE.as_nanos() as i128;
            if entry.ctime_ns > now_micros() as i128 * 1000 - grace_ns {
                self.strays.note(name, Some(entry.uid), now);
                continue;
            }
            // A refusal (or nothing, if it went meanwhile), never a job.
            self.take(spool::read_stray(&self.spool_fd, &name));
        }
    }

    /// Notes a stray spool name, with its owner as the hint for its share.
    fn note_stray(&mut self, name: String) {
        let owner = fsutil::lstat_at(&self.spool_fd, &name)
            .ok()
            .map(|st| st.uid);
        self.strays.note(name, owner, tokio::time::Instant::now());
    }

    /// Why `owner` cannot enter `dir`, if the file system says so in time.
    /// An owner whose file system did not answer is not asked again for
    /// [`SLOW_WORKDIR_PAUSE`]: each look would hold the state task for the
    /// whole timeout and leave a thread blocked (systemd's own check at
    /// the start still refuses a bad workdir).
    fn workdir_problem(&mut self, owner: &users::Owner, dir: &std::path::Path) -> Option<String> {
        let now = tokio::time::Instant::now();
        if self
            .slow_workdirs
            .get(&owner.uid)
            .is_some_and(|since| now.duration_since(*since) < SLOW_WORKDIR_PAUSE)
        {
            return None;
        }
        match fsutil::check_enterable(dir, owner.uid, owner.gid, &owner.groups) {
            fsutil::Enterable::Yes => None,
            fsutil::Enterable::No(why) => Some(why),
            fsutil::Enterable::Unknown => {
                warn!(owner = %owner.name, workdir = %dir.display(), "the workdir's file system did not answer in {:?}; not checking {}'s workdirs for {:?}", fsutil::ENTER_CHECK_TIMEOUT, owner.name, SLOW_WORKDIR_PAUSE);
                self.slow_workdirs.insert(owner.uid, now);
                None
            }
        }
    }

    /// Claims files from the intake for one pass ([`PASS_BUDGET`], at most
    /// [`MAX_SPOOL_BATCH`]), owners in turn.
    async fn claim_a_pass(&mut self) {
        let pass = std::time::Instant::now();
        for _ in 0..MAX_SPOOL_BATCH {
            // Names seen meanwhile join first: a fresh owner's comes next.
            self.take_spool_events();
            let Some(name) = self.intake.pop() else { break };
            self.ingest(&name);
            if pass.elapsed() >= PASS_BUDGET || self.callers_waiting() {
                break;
            }
        }
        self.forget_refused_before_once_listed();
    }

    /// A file a crash left in the spool is in the listing made at the
    /// start, so once that listing is handled (the intake empty) what was
    /// refused before the start is needed no more.
    fn forget_refused_before_once_listed(&mut self) {
        if self.intake.is_empty() && !self.refused_before.is_empty() {
            self.refused_before = HashMap::new();
        }
    }

    /// Claims one spool file: validate, record durably, then remove it.
    fn ingest(&mut self, name: &str) {
        self.take(spool::read_spool_file(&self.spool_fd, name));
    }

    /// Acts on what a spool entry read as: a job to claim or a refusal.
    fn take(&mut self, read: SpoolRead) {
        match read {
            SpoolRead::Ignored => {}
            SpoolRead::Refused {
                name,
                reason,
                identity,
                bytes,
                is_dir,
                held: _held,
            } => self.reject(&name, &reason, identity, bytes.as_deref(), is_dir),
            SpoolRead::File {
                name,
                stem,
                identity,
                bytes,
                held: _held,
            } => self.claim(&name, &stem, identity, bytes),
        }
    }

    fn claim(&mut self, name: &str, stem: &str, identity: FileIdentity, bytes: Vec<u8>) {
        let reject = |this: &mut Self, reason: String| {
            this.reject(name, &reason, Some(identity), Some(&bytes), false)
        };
        let Some(owner) = self.owners.owner_of_uid(identity.uid) else {
            return reject(
                self,
                format!(
                    "its owner uid {} has no passwd entry; jobs run only as known users",
                    identity.uid
                ),
            );
        };
        let source = SpoolSource {
            file: name.to_owned(),
            dev: identity.dev,
            ino: identity.ino,
            ctime_ns: identity.ctime_ns,
            size: identity.size,
        };
        let rules = admission::Rules {
            allow_root_jobs: self.config.allow_root_jobs,
            max_queued_per_user: self.config.max_queued_per_user,
            limits: &self.config.limits,
            notifications: &self.config.notifications,
            policy: &self.policy,
            max_stop_grace: self.config.max_stop_grace,
            max_retries: self.config.max_retries,
        };
        let file = admission::Submitted {
            stem,
            bytes: &bytes,
            source,
        };
        let (mut records, group) = match admission::admit(
            &file,
            &owner,
            &rules,
            &*self,
            now_micros(),
        ) {
            Admission::Accept { records, group } => (records, group),
            Admission::ClaimedBefore(id) => {
                info!(job = %id, PTRAIN_JOB = %id, file = name, "spool file was already claimed; removing it");
                self.remove_spool_entry(name, &identity, false);
                return;
            }
            Admission::Refuse(reason) => return reject(self, reason),
        };
        // Checked as the owner now, so that a typo is refused with its
        // reason instead of failing at the start with exit status 200/226.
        let mut workdirs: Vec<&std::path::Path> = records
            .iter()
            .filter_map(|r| r.spec.workdir.as_deref())
            .collect();
        workdirs.dedup();
        for dir in workdirs {
            if let Some(why) = self.workdir_problem(&owner, dir) {
                let reason = format!(
                    "workdir {} cannot be the job's working directory: {why}; create it, or name a directory {} can enter",
                    crate::display::escape(&dir.display().to_string()),
                    owner.name
                );
                return reject(self, reason);
            }
        }
        // Told "submitted" in the claim's own write: a crash cannot keep
        // the job and lose the event, or the reverse.
        let now = now_micros();
        let mut told = Vec::new();
        for record in &mut records {
            let intents = crate::notifications::intents_for(
                &self.config.notifications,
                record,
                crate::notifications::NotifyEvent::Submitted,
                now,
            );
            record.notifications.extend(intents.iter().cloned());
            told.extend(intents);
        }
        // Each image job's pull starts now, before the claim's durable
        // write (a few ms of fsync on the state task), so a warm pull's
        // registry round trip and the job's root run beside it instead of
        // after it. Nothing is lost or loosened: the pull's answer is an
        // event, applied only after this claim (one state task), to a job
        // that is then live and `pulling` (the collection's question comes
        // through the same channel, so it sees the job as pulling); a
        // claim that fails leaves no job, its pull's answer is dropped
        // ([`Self::on_image_ready`]) and the file, still in the spool, is
        // claimed (and pulled) again later. Admission already accepted the
        // job: no refused file ever has its image pulled.
        for record in &records {
            self.want_image(record);
        }
        let claimed = match &group {
            Some(group) => self.store.claim_group(group, &records, &bytes),
            None => self.store.claim(&records[0], &bytes),
        };
        if let Err(e) = claimed {
            // Not claimed: the file stays in the spool and is tried again
            // at the next event or rescan. Nothing is lost.
            error!(
                file = name,
                error = %e,
                "cannot claim job file {name:?}: {e}; it stays in the spool and is claimed once the state directory accepts writes"
            );
            self.store_failed();
            return;
        }
        crash_point("after-claim");
        self.notifier.deliver(told);
        if let Some(group) = &group {
            info!(group = %group, jobs = records.len(), file = name, "sweep accepted");
            self.groups.insert(
                group.clone(),
                records.iter().map(|r| r.id.clone()).collect(),
            );
        }
        for record in records {
            info!(
                job = %record.id,
                PTRAIN_JOB = %record.id,
                owner = %record.owner.name,
                uid = record.owner.uid,
                file = name,
                "job accepted"
            );
            let id = record.id.clone();
            self.queue_pulling(record);
            self.emit_changed(&id);
        }
        // Only once every job of the file is on the board: `ptrain submit`
        // takes the file's leaving the spool as the decision, and then asks
        // after each member of a sweep.
        self.remove_spool_entry(name, &identity, false);
    }

    /// A job into the queue; one whose image is not on disk yet starts
    /// its pull (`pulling` until [`Event::ImageReady`]).
    fn queue(&mut self, mut record: JobRecord) {
        // Its image left the store since it ran (collected while the job
        // had ended): pulled again, pinned to the digest it ran.
        if let Some(gone) = record.image.take_if(|image| !image.rootfs.is_dir()) {
            record.image_pin = Some(gone.digest);
        }
        self.want_image(&record);
        self.live.queue_job(record);
    }

    /// A job just claimed into the queue: its pull, if it has an image,
    /// was started before the claim ([`Self::claim`]).
    fn queue_pulling(&mut self, record: JobRecord) {
        self.live.queue_job(record);
    }

    /// Starts the pull of `record`'s image when it names one not on disk
    /// yet; its answer comes as an [`Event::ImageReady`].
    fn want_image(&self, record: &JobRecord) {
        if record.spec.image.is_none() || record.image.is_some() {
            return;
        }
        match &self.images {
            Ok(images) => {
                let workdir = unit::workdir(record, record.owner.home.is_dir());
                let points = if workdir == std::path::Path::new("/") {
                    Vec::new()
                } else {
                    vec![workdir]
                };
                images.want(record, points);
            }
            Err(why) => {
                let _ = self.events.send(Event::ImageReady {
                    id: record.id.clone(),
                    wanted: images::Wanted::of(record),
                    result: Err(format!("ptraind's image store is not open: {why}")),
                });
            }
        }
    }

    /// A job's image is ready, or it never will be: the job ends with the
    /// reason. The ready image goes on disk with the launch's write-ahead
    /// save ([`Self::launch`]) when the next plan launches the job, or
    /// after that plan ([`Self::record_ready_images`]): every attempt runs
    /// the same digest. A kill -9 in between pulls again, for a job that
    /// has not started. An answer for another job of the same id (a
    /// pull started before a claim that failed, [`Self::claim`]) is
    /// dropped: that job started its own.
    async fn on_image_ready(
        &mut self,
        id: &JobId,
        wanted: &images::Wanted,
        result: Result<crate::store::ReadyImage, String>,
    ) {
        let Some(record) = self.live.get(id).filter(|r| {
            r.state == JobState::Queued && r.image.is_none() && images::Wanted::of(r) == *wanted
        }) else {
            return;
        };
        let reference = record.spec.image.clone().unwrap_or_default();
        match result {
            Ok(ready) => {
                let mut record = record.clone();
                info!(job = %id, PTRAIN_JOB = %id, image = %reference, digest = %ready.digest, rootfs = %ready.rootfs.display(), "the job's image is ready");
                record.image = Some(ready);
                record.image_pin = None;
                self.images_unrecorded.push(id.clone());
                self.live.update_queued(record);
                self.emit_changed(id);
                self.schedule_again = true;
            }
            Err(reason) => {
                warn!(job = %id, PTRAIN_JOB = %id, image = %reference, "the job's image cannot be had: {reason}");
                let reason = format!("image {reference}: {reason}");
                self.finish(id, Outcome::LaunchFailed { reason }, None)
                    .await;
            }
        }
    }

    /// How each job a dependency names stands: a job, or every member of
    /// a sweep.
    fn parents(&self, named: &JobId) -> Vec<(JobId, crate::chain::ParentState)> {
        use crate::chain::ParentState;
        // A live job is pending without a look at the history; an ended
        // one is most often a recent end, in memory.
        let state = |id: &JobId| match (!self.live.contains(id))
            .then(|| self.board.ended(id))
            .flatten()
        {
            Some(ended) if ended.succeeded() => ParentState::Succeeded,
            Some(ended) if matches!(ended.outcome, Some(Outcome::NotNeeded { .. })) => {
                ParentState::NotNeeded
            }
            Some(ended) => ParentState::NotOk(ended.status().to_string()),
            None => ParentState::Pending,
        };
        match self.groups.get(named) {
            Some(members) => members.iter().map(|m| (m.clone(), state(m))).collect(),
            None => vec![(named.clone(), state(named))],
        }
    }

    /// Decides which queued jobs wait on others, and ends the ones whose
    /// dependencies can never be satisfied (then their dependents, in turn).
    async fn resolve_dependencies(&mut self) {
        use crate::chain::{readiness, Readiness};
        loop {
            self.blocked.clear();
            if self.live.constrained().is_empty() {
                return;
            }
            let now = now_micros();
            let mut never = Vec::new();
            let mut running_in_group: HashMap<&JobId, u32> = HashMap::new();
            // Launching jobs whose call waits count as running.
            for id in self.by_unit.values().chain(&self.launch_backlog) {
                if let Some(g) = self.live.get(id).and_then(|r| r.group.as_ref()) {
                    *running_in_group.entry(g).or_default() += 1;
                }
            }
            for id in self.live.queue().iter() {
                if !self.live.constrained().contains(id) {
                    continue;
                }
                let record = &self.live[id];
                if record.held || (record.spec.image.is_some() && record.image.is_none()) {
                    self.blocked.insert(id.clone());
                    continue;
                }
                if !record.spec.after.is_empty() {
                    match readiness(&record.spec.after, |named| self.parents(named)) {
                        Readiness::Ready => {}
                        Readiness::Waiting(_) => {
                            self.blocked.insert(id.clone());
                            continue;
                        }
                        Readiness::Never { parent, reason } => {
                            never.push((
                                id.clone(),
                                parent.clone(),
                                Outcome::DependencyFailed { parent, reason },
                            ));
                            continue;
                        }
                        Readiness::NotNeeded { parent, reason } => {
                            never.push((
                                id.clone(),
                                parent.clone(),
                                Outcome::NotNeeded { parent, reason },
                            ));
                            continue;
                        }
                    }
                }
                // After the dependencies, so that a failed parent ends a
                // job that waits for its time now, not at that time.
                if record.begin_at.is_some_and(|at| at > now) {
                    self.blocked.insert(id.clone());
                    continue;
                }
                // max_parallel: only as many members as free slots may be
                // planned now (one plan may start several at once).
                if let (Some(g), Some(max)) = (&record.group, record.max_parallel) {
                    let running = running_in_group.entry(g).or_default();
                    if *running >= max {
                        self.blocked.insert(id.clone());
                    } else {
                        *running += 1;
                    }
                }
            }
            if never.is_empty() {
                return;
            }
            for (id, parent, outcome) in never {
                info!(job = %id, PTRAIN_JOB = %id, parent, "will never run: {}", outcome.describe());
                self.finish(&id, outcome, None).await;
            }
        }
    }

    /// `PTRAIN_PARENT_RESULTS`: the results of every job this one waited
    /// for, as one JSON object keyed by job id.
    fn parent_results(&self, record: &JobRecord) -> Option<String> {
        let mut results = serde_json::Map::new();
        for named in record.spec.after.all() {
            for (id, _) in self.parents(named) {
                // Only a finished parent has a result; memory knows whether.
                let has_result = self.board.ended(&id).is_some_and(|p| p.has_result);
                let parent = has_result.then(|| self.ended_record(&id)).flatten();
                if let Some(result) = parent.and_then(|p| p.result) {
                    results.insert(id.to_string(), result);
                }
            }
        }
        (!record.spec.after.is_empty()).then(|| serde_json::Value::Object(results).to_string())
    }

    fn reject(
        &mut self,
        name: &str,
        reason: &str,
        identity: Option<FileIdentity>,
        bytes: Option<&[u8]>,
        is_dir: bool,
    ) {
        if let Some(id) = identity {
            if self.stuck_entries.contains(&(id.dev, id.ino)) {
                return;
            }
        }
        let uid = identity.map(|i| i.uid);
        let owner = uid.and_then(users::owner_of_uid).map(|o| o.name);
        warn!(
            file = name,
            PTRAIN_FILE = name,
            uid = ?uid,
            owner = owner.as_deref().unwrap_or("?"),
            reason,
            "rejected job file {name:?}: {reason}"
        );
        let mut record = RejectRecord {
            file: name.to_owned(),
            uid,
            owner,
            rejected_at: now_micros(),
            reason: reason.to_owned(),
            saved_as: None,
            dev: identity.map(|i| i.dev),
            ino: identity.map(|i| i.ino),
            ctime_ns: identity.and_then(|i| i64::try_from(i.ctime_ns).ok()),
            notifications: Vec::new(),
        };
        if let Some(at) = record
            .refused_file()
            .and_then(|file| self.refused_before.remove(&file))
        {
            // Quarantined before a crash that left it in the spool: the
            // same entry, and its event under the same id.
            info!(
                file = name,
                "refused again after a restart: the same refusal as before it"
            );
            record.rejected_at = at;
        }
        let config = &self.config.notifications;
        if let Some(notice) = crate::notifications::Notice::refused(
            &record,
            &crate::store::printable_file_name(name),
            &config.host(),
        ) {
            let which = crate::store::quarantine_name(record.rejected_at, name);
            record.notifications = crate::notifications::intents_not_of_a_job(
                config,
                &notice,
                &which,
                record.rejected_at,
            );
        }
        let told = record.notifications.clone();
        match self.store.reject(record, bytes) {
            Ok(entry) => {
                crash_point("after-quarantine");
                self.notifier.deliver(told);
                let per_user = self.config.retention.rejected_per_user;
                for gone in self.quarantine.add(uid, entry, per_user) {
                    self.forget_rejected(&gone, QuarantineBound::PerUser);
                }
            }
            Err(e) => {
                // Keep the file where its owner can still see it.
                error!(file = name, error = %e, "cannot quarantine a rejected file; leaving it in the spool");
                self.store_failed();
                return;
            }
        }
        self.metrics.file_rejected();
        match identity {
            Some(identity) => self.remove_spool_entry(name, &identity, is_dir),
            None => {
                let _ = fsutil::unlink_at(&self.spool_fd, name, is_dir);
            }
        }
    }

    /// Drops a quarantine entry past `[retention]`.
    ///
    /// Past `rejected_max_age` its event's outbox entries go once they
    /// are delivered or dead (one still on its way is still sent). Past
    /// `rejected_per_user` they go at once, sent or not: a user can
    /// refuse files at will, and while a broker is down their events
    /// would otherwise pile up on disk without a bound.
    fn forget_rejected(&mut self, entry: &str, past: QuarantineBound) {
        let keys = self.store.forget_rejected(entry);
        match past {
            QuarantineBound::MaxAge => self.notifier.forget(keys),
            QuarantineBound::PerUser => self.notifier.discard(keys),
        }
    }

    /// Removes a spool entry only if it is still the one we read: a user
    /// who renamed a new file over it meanwhile keeps the new one.
    fn remove_spool_entry(&mut self, name: &str, identity: &FileIdentity, is_dir: bool) {
        match fsutil::lstat_at(&self.spool_fd, name) {
            Ok(now) if spool::same_entry(&now, identity) => {
                if let Err(e) = fsutil::unlink_at(&self.spool_fd, name, is_dir) {
                    warn!(file = name, error = %e, "cannot remove spool entry; ignoring it from now on");
                    self.stuck_entries.insert((identity.dev, identity.ino));
                }
            }
            _ => {}
        }
    }

    /// Starts every queued job that can start now (see [`scheduler`] for
    /// the rule), and fails queued jobs that never could.
    ///
    /// Runs after every batch of events. Foreign use of a GPU and GPU
    /// health change without any event ptraind could wait on, so while GPU
    /// jobs wait on an NVML inventory it also runs every
    /// [`GPU_REPLAN_INTERVAL`] as a safety net; declared GPUs change only
    /// through events.
    async fn schedule(&mut self) {
        self.plan().await;
        self.record_ready_images();
        self.watch_held_gpus();
    }

    /// Records the ready image of each job the plan left queued (held,
    /// waiting for GPUs, a dependency, its `begin`): every attempt runs
    /// the digest `ptrain status` shows, across restarts too.
    fn record_ready_images(&mut self) {
        for id in std::mem::take(&mut self.images_unrecorded) {
            let Some(record) = self
                .live
                .get(&id)
                .filter(|r| r.state == JobState::Queued && r.image.is_some())
            else {
                continue;
            };
            if let Err(e) = self.store.save(record) {
                // In memory still: the launch's save records it, and a
                // restart before it pulls again.
                error!(job = %id, PTRAIN_JOB = %id, error = %e, "cannot record the job's image");
                self.store_failed_at = Some(tokio::time::Instant::now());
            }
        }
    }

    /// GPU health changes without any event ptraind could wait on, and
    /// only a look at the inventory notices: while jobs hold GPUs on NVML,
    /// ptraind looks every [`GPU_REPLAN_INTERVAL`] (or `[accounting]
    /// gpu_sample_interval`, if shorter) even when nobody asks (`ptrain
    /// gpus`) and no job waits (a plan), so that a GPU failing under a job
    /// is logged and its owner told within that time; each look is also a
    /// sample of the running jobs' GPU usage (a job still launching, as at
    /// the first look after its plan, has none). An idle ptraind (no job
    /// holds a GPU) does not wake up for it.
    fn watch_held_gpus(&mut self) {
        let health_streamed = self.config.notifications.channels.values().any(|c| {
            c.streamed_events().is_some_and(|events| {
                events.contains(&crate::notifications::NotifyEvent::GpuUnhealthy)
                    || events.contains(&crate::notifications::NotifyEvent::GpuHealthy)
            })
        });
        if (self.live.held().is_empty() && !health_streamed) || self.inventory.backend() != "nvml" {
            self.gpu_watch_at = None;
            // A look someone asked for (`ptrain gpus`) may have noticed.
            if let Some(snapshot) = self.inventory.take_health() {
                self.tell_gpu_health(&snapshot);
            }
            return;
        }
        let interval = match self.config.accounting.enabled {
            true => GPU_REPLAN_INTERVAL.min(self.config.accounting.gpu_sample_interval),
            false => GPU_REPLAN_INTERVAL,
        };
        let now = tokio::time::Instant::now();
        if self.gpu_watch_at.is_none_or(|at| at <= now) {
            // Errors are logged by the plans that need the inventory.
            if let Ok(snapshot) = self.inventory.snapshot() {
                self.sample_gpu_usage(&snapshot);
            }
            self.gpu_watch_at = Some(now + interval);
        }
        self.announce_gpu_warnings();
        let at = self.gpu_watch_at.unwrap_or(now + interval);
        self.gpu_replan_at = Some(self.gpu_replan_at.map_or(at, |r| r.min(at)));
    }

    /// Adds `snapshot` to each running job's GPU usage
    /// ([`crate::accounting::gpu`]) and posts its view, so that `ptrain
    /// status` shows the figures so far; the end record keeps them.
    fn sample_gpu_usage(&mut self, snapshot: &[GpuInfo]) {
        if !self.config.accounting.enabled {
            return;
        }
        let holders: BTreeSet<JobId> = self.live.held().values().cloned().collect();
        for id in holders {
            let Some(record) = self.live.get_mut(&id) else {
                continue;
            };
            if record.state != JobState::Running {
                continue;
            }
            let gpus: Vec<u32> = record.gpus.iter().map(|g| g.index).collect();
            crate::accounting::gpu::sample(&mut record.gpu_usage, &gpus, snapshot);
            self.post_view(&id);
        }
    }

    /// See [`Daemon::schedule`].
    async fn plan(&mut self) {
        self.gpu_replan_at = None;
        self.schedule_again = false;
        self.announce_gpu_warnings();
        self.resolve_dependencies().await;
        self.refresh_queued(self.live.constrained());
        let mut starting_by_owner: HashMap<u32, usize> = HashMap::new();
        for id in &self.starting {
            if let Some(record) = self.live.get(id) {
                *starting_by_owner.entry(record.owner.uid).or_default() += 1;
            }
        }
        let factors = self.fair_share_factors();
        self.check_quotas();
        let mut look_at_gpus = || self.gpu_snapshot();
        let decided = planning::decide(
            &self.live,
            planning::Situation {
                blocked: &self.blocked,
                look_at_gpus: &mut look_at_gpus,
                rules: Rules {
                    foreign_memory_threshold_mib: self.config.gpus.foreign_memory_threshold_mib,
                    policy: &self.policy,
                },
                checked_against: self.never_checked_against,
                room: self.launch_room(),
                starting_by_owner: &starting_by_owner,
                max_starts_per_owner: MAX_STARTS_PER_OWNER,
                preempt: self.config.policy.preempt,
                fair_share: factors.as_ref(),
                over_quota: &self.over_quota,
            },
        );
        let Some(decision) = decided else {
            return;
        };
        self.never_checked_against = decision.checked_against;
        self.reserved = decision.reserved;
        if let Some((urgent, victims)) = decision.preemption {
            for victim in victims {
                self.preempt(&victim, &urgent).await;
            }
        }
        let before = std::mem::replace(&mut self.waits, decision.waits);
        self.refresh_queued(before.keys().chain(self.waits.keys()));
        // Queued before the GPUs or the policy changed (a restart).
        for (id, reason) in decision.never {
            warn!(job = %id, PTRAIN_JOB = %id, "job can never start: {reason}");
            self.finish(
                &id,
                Outcome::LaunchFailed {
                    reason: format!("it can never start here: {reason}"),
                },
                None,
            )
            .await;
        }
        let mut gpu_jobs_wait = decision.gpu_jobs_wait;
        let pass = std::time::Instant::now();
        for (n, placement) in decision.launches.into_iter().enumerate() {
            if self.launch_room() == 0 {
                // A launch that ended at once left no room (each end plans
                // again).
                gpu_jobs_wait = true;
                break;
            }
            // At least one launch a pass: callers that never stop coming
            // must not hold every launch back.
            if n > 0
                && (pass.elapsed() >= PASS_BUDGET
                    || self.callers_waiting()
                    || self.fresh_file_waiting())
            {
                // The rest in a pass of their own, after the API's turn.
                self.schedule_again = true;
                break;
            }
            self.launch(&placement.id, &placement.gpus, &decision.gpus)
                .await;
        }
        if gpu_jobs_wait && self.inventory.backend() == "nvml" {
            self.gpu_replan_at = Some(tokio::time::Instant::now() + GPU_REPLAN_INTERVAL);
        }
        // What this plan's own look at the GPUs noticed.
        self.announce_gpu_warnings();
    }

    /// Tells the owners of jobs whose GPU left the pool under them
    /// (`gpu-lost`; once per job, by the intent's key), with what their
    /// `ptrain status` says. Whichever look at the inventory noticed (a
    /// plan, `ptrain gpus`, the idle check), the next plan tells.
    fn announce_gpu_warnings(&mut self) {
        for (job, warning) in self.inventory.take_new_warnings() {
            let Some(record) = JobId::parse(&job)
                .ok()
                .and_then(|id| self.live.get_mut(&id))
            else {
                continue;
            };
            let mut intents = crate::notifications::intents_for(
                &self.config.notifications,
                record,
                crate::notifications::NotifyEvent::GpuLost,
                now_micros(),
            );
            if intents.is_empty() {
                continue;
            }
            for intent in &mut intents {
                intent.notice.detail.clone_from(&warning);
            }
            record.notifications.extend(intents.iter().cloned());
            if let Err(e) = self.store.save(record) {
                error!(job = %job, PTRAIN_JOB = %job, error = %e, "cannot record the notification that the job lost a GPU");
            }
            self.notifier.deliver(intents);
        }
        if let Some(snapshot) = self.inventory.take_health() {
            self.tell_gpu_health(&snapshot);
        }
    }

    /// Tells the streams that take them of GPUs leaving or rejoining the
    /// pool since the health last told ([`crate::gpu_health`]), whether
    /// or not a job holds them. The ledger, with the intents, is durable
    /// before they are handed to the sender.
    fn tell_gpu_health(&mut self, snapshot: &[crate::gpu::GpuInfo]) {
        let now = now_micros();
        let (changes, changed) = self.gpu_health.observe(snapshot, now);
        let config = &self.config.notifications;
        let host = config.host();
        let mut told = Vec::new();
        let mut replaced = Vec::new();
        for change in changes {
            let uuid = change.gpu.uuid.clone();
            let index = change.gpu.index;
            let since = self.gpu_health.since(&uuid).unwrap_or(now);
            let notice = crate::notifications::Notice::gpu_health(
                change.gpu,
                change.unhealthy.as_deref(),
                since,
                &host,
            );
            // The index tells apart two GPUs of one look whose UUIDs print
            // the same (a UUID is made printable and cut short).
            let which = format!(
                "{since}-{index}-{}",
                crate::store::printable_file_name(&uuid)
            );
            let intents =
                crate::notifications::intents_not_of_a_job(config, &notice, &which, since);
            told.extend(intents.iter().cloned());
            replaced.extend(self.gpu_health.record_intents(&uuid, intents));
        }
        let saved = !changed
            || {
                let saved = self.gpu_health.save();
                if let Err(e) = &saved {
                    // Sent all the same; a restart before they are delivered
                    // tells the GPUs' health afresh.
                    error!(error = %e, path = %self.config.state_dir.join("gpu-health.json").display(), "cannot record the GPUs' health; check the state directory's disk");
                }
                saved.is_ok()
            };
        self.notifier.deliver(told);
        // A change replaced by a newer one is forgotten once done with,
        // and only once the ledger no longer lists it: a restart with the
        // old ledger would send again what the outbox had forgotten.
        if saved {
            self.notifier.forget(replaced);
        }
    }

    /// Tells the inventory which job holds each GPU, so that a GPU leaving
    /// the pool under a running job names the job in its log entry.
    fn held_changed(&self) {
        self.inventory.set_holders(
            self.live
                .held()
                .iter()
                .map(|(gpu, id)| (*gpu, id.to_string()))
                .collect(),
        );
    }

    fn gpu_snapshot(&self) -> Option<Vec<GpuInfo>> {
        match self.inventory.snapshot() {
            Ok(snapshot) => Some(snapshot),
            Err(e) => {
                error!(error = %e, "cannot read the GPU inventory; GPU jobs wait");
                None
            }
        }
    }

    /// Write-ahead: the record says "launching as unit U on these GPUs"
    /// durably before systemd is asked.
    async fn launch(&mut self, id: &JobId, gpus: &[u32], snapshot: &[GpuInfo]) {
        let Some(record) = self.live.get_mut(id) else {
            return;
        };
        let before = record.clone();
        lifecycle::launching(record, gpus, snapshot);
        if let Err(e) = self.store.save(record) {
            error!(job = %id, PTRAIN_JOB = %id, error = %e, "cannot record the launch; the job stays queued");
            *record = before;
            self.store_failed();
            return;
        }
        self.metrics
            .job_launched(now_micros().saturating_sub(record.submitted_at));
        self.live.launched(id);
        self.starting.insert(id.clone());
        self.held_changed();
        self.emit_changed(id);
        self.start_unit(id).await;
        // The new unit's reference comes out of the kept units' share.
        if !self.kept.is_empty() {
            self.release_kept_units();
        }
    }

    /// Units systemd tracks a reference of ptraind's for, or soon will:
    /// those started, those whose launch waits for a call, and those whose
    /// release is still on its way.
    fn tracked_units(&self) -> usize {
        self.by_unit.len() + self.launch_backlog.len() + self.systemd.releases_pending()
    }

    /// How many more jobs may be launched now: within the references
    /// systemd can track and the starts it may have pending.
    fn launch_room(&self) -> usize {
        let references = MAX_TRACKED_UNITS.saturating_sub(self.tracked_units());
        references.min(MAX_STARTS_PENDING.saturating_sub(self.starting.len()))
    }

    /// Lets systemd collect the kept units whose time is up, or whose
    /// references the launching and running jobs need.
    fn release_kept_units(&mut self) {
        let room = MAX_TRACKED_UNITS.saturating_sub(self.tracked_units());
        for unit in self.kept.due(now_micros(), room) {
            self.systemd.release_in_background(unit);
        }
    }

    /// Starts the launching job's unit now, or once a call is free.
    async fn start_unit(&mut self, id: &JobId) {
        if self.launches_in_flight >= MAX_LAUNCHES_IN_FLIGHT {
            self.launch_backlog.push_back(id.clone());
            return;
        }
        self.dispatch_launch(id).await;
    }

    /// Prepares the job's launch files and sends its StartTransientUnit
    /// from a task of its own.
    async fn dispatch_launch(&mut self, id: &JobId) {
        let Some(record) = self.live.get(id).filter(|r| r.state == JobState::Launching) else {
            return;
        };
        let unit = record.unit.clone();
        let mut launch = unit::launch_file(record, self.parent_results(record).as_deref());
        // `exec-job` leaves a watcher behind that reads what the run used
        // at its end (not with `[accounting] enabled = false`).
        if self.config.accounting.enabled {
            launch.usage_dir = Some(self.runtime.result_dir(id));
        }
        // An image job's GPUs: as the host's CDI specs put them in a
        // container (nodes, driver files, variables, links in its root).
        let devices = match (&record.image, record.gpus.is_empty()) {
            (Some(image), false) => {
                let devices = crate::cdi::load::host_job_devices(
                    &self.config.gpus.cdi_spec_dirs,
                    &record.gpus,
                )
                .map_err(|e| e.to_string())
                .and_then(|devices| {
                    let points: Vec<_> = devices
                        .binds
                        .iter()
                        .map(|b| (b.destination.clone(), b.source.is_dir()))
                        .collect();
                    crate::images::runtime_root::add_mount_points(&image.rootfs, &points)
                        .map_err(|e| e.to_string())?;
                    let links: Vec<_> = devices
                        .symlinks
                        .iter()
                        .map(|l| (l.link.clone(), l.target.clone()))
                        .collect();
                    crate::images::runtime_root::add_symlinks(&image.rootfs, &links)
                        .map_err(|e| e.to_string())?;
                    Ok(devices)
                });
                match devices {
                    Ok(devices) => Some(devices),
                    Err(e) => {
                        let reason = format!("the job's GPUs in its image: {e}");
                        error!(job = %id, PTRAIN_JOB = %id, unit, "{reason}");
                        self.finish(id, Outcome::LaunchFailed { reason }, None)
                            .await;
                        return;
                    }
                }
            }
            _ => None,
        };
        if let Some(devices) = &devices {
            unit::add_device_environment(&mut launch, devices);
        }
        let workdir_bind = match &record.image {
            Some(_) => {
                let workdir = unit::workdir(record, record.owner.home.is_dir());
                let owner = &record.owner;
                let checked = (workdir != std::path::Path::new("/")).then(|| {
                    crate::images::runtime_root::check_workdir_as(
                        &workdir,
                        owner.uid,
                        owner.gid,
                        &owner.groups,
                    )
                });
                if let Some(Err(reason)) = checked {
                    error!(job = %id, PTRAIN_JOB = %id, unit, "{reason}");
                    self.finish(id, Outcome::LaunchFailed { reason }, None)
                        .await;
                    return;
                }
                (workdir != std::path::Path::new("/")).then_some(workdir)
            }
            None => None,
        };
        let prepared = match self.runtime.prepare(
            id,
            &record.owner,
            &launch,
            &record.spec.credentials,
        ) {
            Ok(prepared) => prepared,
            Err(e) => {
                error!(job = %id, PTRAIN_JOB = %id, unit, error = %e, "cannot prepare the job's launch");
                let reason = e.to_string();
                self.finish(id, Outcome::LaunchFailed { reason }, None)
                    .await;
                return;
            }
        };
        if record.image.is_some() && self.host_exec.is_none() {
            let reason = "this ptraind cannot tell its own dynamic loader and C library (/proc/self/maps), which an image job's unit binds into the image to run `ptraind exec-job`; run the packaged, dynamically linked ptraind".to_owned();
            error!(job = %id, PTRAIN_JOB = %id, unit, "{reason}");
            self.finish(id, Outcome::LaunchFailed { reason }, None)
                .await;
            return;
        }
        let result_file = self.runtime.result_file(id);
        let ctx = unit::LaunchContext {
            home_exists: record.owner.home.is_dir(),
            ptraind: &self.ptraind,
            prepared: &prepared,
            result_file: &result_file,
            host_exec: self.host_exec.as_ref(),
            devices: devices.as_ref(),
            workdir_bind: workdir_bind.as_deref(),
        };
        let props = unit::job_unit_properties(record, (&self.config).into(), &ctx);
        crash_point("before-start-unit");
        self.by_unit.insert(unit.clone(), id.clone());
        self.launches_in_flight += 1;
        let systemd = self.systemd.clone();
        let events = self.events.clone();
        let id = id.clone();
        tokio::spawn(async move {
            // zbus waits for a reply forever: a call systemd never answers
            // would hold its slot, and with all of them every launch.
            let call = systemd.start_unit(&unit, &props);
            let result = match tokio::time::timeout(LAUNCH_CALL_TIMEOUT, call).await {
                Ok(result) => result.map(drop),
                Err(_) => Err(SystemdError::NoAnswer {
                    call: "StartTransientUnit",
                    unit: unit.clone(),
                    secs: LAUNCH_CALL_TIMEOUT.as_secs(),
                }),
            };
            if result.is_ok() {
                crash_point("after-start-unit");
            }
            let _ = events.send(Event::Started { id, unit, result });
        });
    }

    /// systemd's answer to a StartTransientUnit; the next launch goes out.
    async fn on_started(&mut self, id: &JobId, unit: &str, result: Result<(), SystemdError>) {
        self.launches_in_flight = self.launches_in_flight.saturating_sub(1);
        match result {
            Ok(()) => {
                if let Some(record) = self.live.get(id) {
                    let gpus: Vec<u32> = record.gpus.iter().map(|g| g.index).collect();
                    info!(job = %id, PTRAIN_JOB = %id, unit, gpus = ?gpus, "unit started");
                    if record.stop_requested_by.is_some() && record.state == JobState::Launching {
                        // Stopped while its StartTransientUnit was out.
                        if let Err(e) = self.systemd.stop_unit(unit).await {
                            warn!(job = %id, PTRAIN_JOB = %id, unit, error = %e, "cannot stop a job stopped while it launched");
                        }
                    }
                }
            }
            Err(SystemdError::UnitExists(_)) if self.is_an_earlier_jobs_unit(id, unit).await => {
                // An earlier job of this id (compacted since) whose unit is
                // still loaded: its end must not be taken for this job's.
                warn!(job = %id, PTRAIN_JOB = %id, unit, "a unit of an earlier job with this id is still loaded; releasing it and starting this job's own");
                self.systemd.release_now(unit).await;
                self.by_unit.remove(unit);
                let _ = self.events.send(Event::Relaunch(id.clone()));
            }
            Err(SystemdError::UnitExists(_)) => {
                // Started before a crash: adopt it, never start it twice.
                info!(job = %id, PTRAIN_JOB = %id, unit, "unit already exists; adopting it");
                if let Err(e) = self.systemd.ref_unit(unit).await {
                    warn!(job = %id, PTRAIN_JOB = %id, unit, error = %e, "cannot reference existing unit");
                }
                self.check_unit(unit);
            }
            Err(e) if e.is_transient() => {
                // Whether systemd made the unit is unknown: ask again in a
                // while (a unit it made answers UnitExists, and is adopted).
                // The job stays launching, its GPUs held: never reported as
                // failed for the bus's sake.
                warn!(job = %id, PTRAIN_JOB = %id, unit, error = %e, "no answer to StartTransientUnit; asking again in {LAUNCH_RETRY:?}");
                self.by_unit.remove(unit);
                let events = self.events.clone();
                let id = id.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(LAUNCH_RETRY).await;
                    let _ = events.send(Event::Relaunch(id));
                });
            }
            Err(e) => {
                // The job may have ended meanwhile (stopped): only a job
                // still launching failed to launch.
                if self
                    .live
                    .get(id)
                    .is_some_and(|r| r.state == JobState::Launching)
                {
                    error!(job = %id, PTRAIN_JOB = %id, unit, error = %e, "cannot start unit");
                    self.finish(
                        id,
                        Outcome::LaunchFailed {
                            reason: e.to_string(),
                        },
                        None,
                    )
                    .await;
                }
            }
        }
        while self.launches_in_flight < MAX_LAUNCHES_IN_FLIGHT {
            let Some(next) = self.launch_backlog.pop_front() else {
                break;
            };
            self.dispatch_launch(&next).await;
        }
    }

    /// Whether the loaded unit that made StartTransientUnit answer
    /// UnitExists ended before this job was submitted: then it ran an
    /// earlier job of the same id, not this one.
    async fn is_an_earlier_jobs_unit(&self, id: &JobId, unit: &str) -> bool {
        let Some(submitted_at) = self.live.get(id).map(|r| r.submitted_at) else {
            return false;
        };
        match self.systemd.unit_state(unit).await {
            Ok(state) => {
                state.has_ended() && state.inactive_enter > 0 && state.inactive_enter < submitted_at
            }
            Err(_) => false,
        }
    }

    fn store_failed(&mut self) {
        self.store_failed_at = Some(tokio::time::Instant::now());
    }

    /// Redoes what a failed state write left undone: claims files still in
    /// the spool and records ends of units still held.
    async fn retry_after_store_failure(&mut self) {
        self.store_failed_at = None;
        info!("retrying after a failed state write");
        self.rescan();
        let units: Vec<String> = self.by_unit.keys().cloned().collect();
        for unit in units {
            self.check_unit(&unit);
        }
    }

    async fn on_unit_signal(&mut self, signal: UnitSignal) {
        if let UnitSignal::SystemdReconnected = signal {
            self.look_again_at_all();
            return;
        }
        if let Some(id) = JobId::from_recorder_unit(signal.unit()) {
            if let UnitSignal::StateChanged { active_state, .. } = &signal {
                if matches!(active_state.as_str(), "inactive" | "failed") {
                    self.recorder_ended(&id).await;
                }
            }
            return;
        }
        let Some(job_state) = self
            .by_unit
            .get(signal.unit())
            .and_then(|id| self.live.get(id))
            .map(|r| r.state)
        else {
            return;
        };
        if let UnitSignal::StateChanged {
            active_state,
            state: Some(state),
            ..
        } = &signal
        {
            // systemd stops the unit while its command still runs: a stop
            // job, which ptraind did not ask for if it has no request.
            if active_state == "deactivating"
                && job_state == JobState::Running
                && state.exec_main_code == 0
            {
                self.note_stop_from_outside(signal.unit());
            }
        }
        match signal {
            // Passing states move no job on, and "active" of a job already
            // seen running tells nothing new (skipping their looks took
            // ptraind's CPU per job from 11 to 9 ms, benches/ptrain). The
            // end still comes: the unit's final inactive/failed.
            UnitSignal::StateChanged { active_state, .. }
                if matches!(
                    active_state.as_str(),
                    "activating" | "deactivating" | "reloading"
                ) || (active_state == "active" && job_state == JobState::Running) => {}
            // The state as the signals carried it: no round trip into a
            // busy systemd between a job's end and the next launch.
            UnitSignal::StateChanged {
                unit,
                state: Some(state),
                ..
            } => self.apply_unit_state(&unit, &state).await,
            // A JobRemoved adds nothing when the job went as planned, or
            // when the unit's job runs already (its stop's): systemd
            // uninstalls the job and queues the unit's state for a
            // PropertiesChanged pair (its Job property changed), which
            // carries what a round trip would read. A start job done came
            // before the unit's "active" in most launches, and looking at
            // the unit then cost a tenth of ptraind's CPU per GPU job
            // (GetUnit and two GetAll into a busy systemd). A start job that
            // failed, timed out or was cancelled is looked at.
            UnitSignal::JobRemoved { result, .. }
                if job_state != JobState::Launching || result == "done" => {}
            signal => self.check_unit(signal.unit()),
        }
    }

    /// A running job's unit is being stopped by systemd itself (`systemctl
    /// stop`, a shutdown): unless ptraind asked (a stop request, an idle
    /// timeout), its end is recorded as stopped by systemd, not as killed
    /// by the SIGTERM that the stop sends.
    fn note_stop_from_outside(&mut self, unit: &str) {
        let Some(id) = self.by_unit.get(unit) else {
            return;
        };
        let record = &self.live[id];
        if record.stop_requested_by.is_none()
            && record.idle_timeout_hit.is_none()
            && self.stopping_outside.insert(id.clone())
        {
            info!(job = %id, PTRAIN_JOB = %id, unit, "systemd is stopping the job (systemctl stop or a shutdown, not through ptrain)");
        }
    }

    /// Looks at a unit and moves its job on (launching → running →
    /// ended) when the answer comes back ([`Event::Looked`]): off the state
    /// task, since a busy systemd answers a GetUnit in hundreds of ms
    /// (`make bench`: one look held the API for 0.4 s in a 500-job burst).
    fn check_unit(&self, unit: &str) {
        self.look_at(unit, None);
    }

    /// [`Daemon::check_unit`], after a while when `after` says so.
    fn look_at(&self, unit: &str, after: Option<std::time::Duration>) {
        if !self.by_unit.contains_key(unit) {
            return;
        }
        let systemd = self.systemd.clone();
        let events = self.events.clone();
        let unit = unit.to_string();
        tokio::spawn(async move {
            if let Some(after) = after {
                tokio::time::sleep(after).await;
            }
            let state = timed_look(&systemd, &unit).await;
            let _ = events.send(Event::Looked { unit, state });
        });
    }

    /// Moves a job on from what its unit looked like.
    async fn on_looked(&mut self, unit: &str, state: Result<UnitState, SystemdError>) {
        let Some(id) = self.by_unit.get(unit).cloned() else {
            // Ended meanwhile.
            return;
        };
        match state {
            Ok(state) => self.apply_unit_state(unit, &state).await,
            // Collected before we could read it (our reference went with a
            // lost bus connection), or never loaded.
            Err(SystemdError::NoSuchUnit(_)) => self.unit_gone(&id).await,
            Err(e) => {
                // Its next signal may never come (it ended while systemd
                // was off the bus): look again in a while.
                warn!(job = %id, PTRAIN_JOB = %id, unit, error = %e, "cannot read unit state; looking again in {LAUNCH_RETRY:?}");
                self.look_at(unit, Some(LAUNCH_RETRY));
            }
        }
    }

    /// systemd came back on the bus: a new connection knows no
    /// subscribers, and signals sent meanwhile are lost. Subscribes again,
    /// then looks at every unit ptraind waits on, a few calls at a time,
    /// off the state task: systemd drops off the bus when it is busiest
    /// (`make bench`: four times in a 500-job burst on two cores), and
    /// 256 looks in a row held the API and claims for up to 7.5 s.
    fn look_again_at_all(&self) {
        let units: Vec<String> = self.by_unit.keys().cloned().collect();
        let systemd = self.systemd.clone();
        let events = self.events.clone();
        let lost = self.signals_lost.clone();
        let lost_stream = self.lost_stream.clone();
        tokio::spawn(async move {
            use futures_util::StreamExt;
            // A busy systemd may not answer at first (`make bench`: once in
            // a 500-job burst); without a subscription no unit's end would
            // ever be seen, so after the last try ptraind starts afresh.
            let mut tries = RESUBSCRIBE_BACKOFF.iter();
            while let Err(e) = systemd.resubscribe().await {
                let Some(wait) = tries.next() else {
                    error!(error = %e, "cannot subscribe to systemd's signals again");
                    if let Ok(mut name) = lost_stream.lock() {
                        name.get_or_insert("Subscribe");
                    }
                    lost.cancel();
                    return;
                };
                warn!(error = %e, "cannot subscribe to systemd's signals again; trying again in {wait:?}");
                tokio::time::sleep(*wait).await;
            }
            info!(
                units = units.len(),
                "subscribed to systemd's signals again; looking at the units of running jobs"
            );
            let mut looks = futures_util::stream::iter(units)
                .map(|unit| {
                    let systemd = systemd.clone();
                    async move {
                        let state = timed_look(&systemd, &unit).await;
                        (unit, state)
                    }
                })
                .buffer_unordered(MAX_LAUNCHES_IN_FLIGHT);
            while let Some((unit, state)) = looks.next().await {
                if events.send(Event::Looked { unit, state }).is_err() {
                    break;
                }
            }
        });
    }

    /// Moves a unit's job on to what the unit's state says.
    async fn apply_unit_state(&mut self, unit: &str, state: &UnitState) {
        let Some(id) = self.by_unit.get(unit).cloned() else {
            return;
        };
        if state.has_ended() {
            let outcome = lifecycle::outcome_of_end(
                state,
                self.live[&id].stop_requested_by,
                self.stopping_outside.contains(&id),
            );
            self.finish(&id, outcome, Some(state)).await;
        } else if state.active_state == "active" || state.active_state == "deactivating" {
            self.starting.remove(&id);
            let record = self.live.get_mut(&id).expect("tracked job exists");
            let notifications = &self.config.notifications;
            let Some(intents) = lifecycle::running(record, state, notifications, now_micros())
            else {
                self.agree_on_pause(&id, state);
                return;
            };
            if let Err(e) = self.store.save(record) {
                error!(job = %id, PTRAIN_JOB = %id, error = %e, "cannot record that the job runs");
            }
            self.notifier.deliver(intents);
            info!(job = %id, PTRAIN_JOB = %id, unit, pid = state.main_pid, "job running");
            self.checkpoints.rearm(record);
            let owner_uid = record.owner.uid;
            self.emit_changed(&id);
            self.verify_identity(&id, unit, state.main_pid, owner_uid)
                .await;
        }
    }

    /// A running job's record says paused exactly when systemd has its
    /// unit frozen: set right after a restart that came between the
    /// record and the freeze, or after `systemctl freeze` and `thaw`.
    fn agree_on_pause(&mut self, id: &JobId, state: &UnitState) {
        if self.freezing.contains(id) {
            return;
        }
        let frozen = match state.freezer_state.as_str() {
            "frozen" | "freezing" => true,
            "running" | "thawing" => false,
            _ => return,
        };
        let Some(record) = self.live.get_mut(id).filter(|r| r.paused != frozen) else {
            return;
        };
        record.paused = frozen;
        info!(job = %id, PTRAIN_JOB = %id, unit = %record.unit, frozen, "the job's unit is {}; recording it so", if frozen { "frozen" } else { "not frozen" });
        if let Err(e) = self.store.save(record) {
            error!(job = %id, PTRAIN_JOB = %id, error = %e, "cannot record whether the job is paused");
        }
        self.post_view(id);
    }

    /// Checks that the job's main process really runs as its owner: the
    /// last line of defence against a unit that systemd started as someone
    /// else (CVE-2017-1000082 style). A mismatch stops the job at once.
    async fn verify_identity(&mut self, id: &JobId, unit: &str, pid: u32, owner_uid: u32) {
        if pid == 0 {
            return;
        }
        // The process may already have exited; only a uid we read counts.
        let Some(uids) = process_uids(pid) else {
            return;
        };
        if uids.iter().all(|u| *u == owner_uid) {
            return;
        }
        error!(
            job = %id,
            PTRAIN_JOB = %id,
            unit,
            pid,
            expected = owner_uid,
            found = ?uids,
            "job process runs with the wrong uid; stopping it"
        );
        if let Some(record) = self.live.get_mut(id) {
            record.stop_requested_by = Some(0);
            self.post_view(id);
        }
        if let Err(e) = self.stop_job_unit(id, unit).await {
            error!(job = %id, PTRAIN_JOB = %id, unit, error = %e, "cannot stop a job running with the wrong uid");
        }
    }

    /// Records a job's end durably, then frees its GPUs and lets systemd
    /// collect the unit.
    async fn finish(&mut self, id: &JobId, outcome: Outcome, state: Option<&UnitState>) {
        let Some(current) = self.live.get(id) else {
            return;
        };
        self.stopping_outside.remove(id);
        self.starting.remove(id);
        let result = self.runtime.read_result(id, &current.owner);
        if let Err(e) = &result {
            // Shown with the job's own entries (`journalctl PTRAIN_JOB=ID`).
            warn!(job = %id, PTRAIN_JOB = %id, error = %e, "ignoring the job's result file");
        }
        let usage = match self.runtime.read_usage(id, &current.owner) {
            Ok(usage) => usage,
            Err(e) => {
                warn!(job = %id, PTRAIN_JOB = %id, error = %e, "ignoring the job's usage file");
                None
            }
        };
        let stopper_name = lifecycle::stopper_to_name(&outcome)
            .and_then(|uid| self.owners.owner_of_uid(uid))
            .map(|o| o.name);
        let now = now_micros();
        let facts = lifecycle::EndFacts {
            outcome,
            unit: state,
            result,
            usage,
            stopper_name,
            now,
        };
        // The end and its notification intents are one durable write, made
        // on a copy: memory says "ended" only once the disk does.
        let ended = lifecycle::ended(current, facts, &self.config.notifications);
        // A retried attempt is not the job's end: the next one is saved.
        if let Some((next, told)) =
            lifecycle::requeued(current, &ended, &self.config.notifications, now)
        {
            // Each attempt is a run of its own in the accounting (its own
            // invocation); feeding it twice adds nothing.
            self.account(&ended.record, true);
            self.run_again(next, told);
            return;
        }
        let lifecycle::Ended {
            record,
            outcome,
            intents,
        } = ended;
        crash_point("before-record-exit");
        if let Err(e) = self.store.save(&record) {
            // Keep our reference on the unit so the result can still be
            // read once the disk accepts writes again.
            error!(job = %id, PTRAIN_JOB = %id, error = %e, "cannot record the job's end; keeping the unit until it can be recorded");
            self.store_failed();
            return;
        }
        let ran = record.started_at.zip(record.ended_at);
        self.metrics
            .job_finished(outcome.status(), ran.map(|(s, e)| e.saturating_sub(s)));
        let cpu_ns = record.usage.as_ref().and_then(|u| u.cpu_nsec).unwrap_or(0);
        self.metrics.job_usage(
            &record.owner.name,
            outcome.status(),
            record.gpu_seconds(),
            cpu_ns as f64 / 1e9,
        );
        self.notifier.deliver(intents);
        self.account(&record, false);
        self.live.ended(id);
        if record.spec.image.is_some() {
            // Its image may be unused now: `[images]` decides.
            if let Ok(images) = &self.images {
                images.collect_soon();
            }
        }
        self.checkpoints.remove(id);
        info!(
            job = %id,
            PTRAIN_JOB = %id,
            unit = %record.unit,
            outcome = outcome.status(),
            "job ended: {}",
            outcome.describe()
        );
        crash_point("after-record-exit");
        self.store.remove_exit_record(id);
        self.runtime.remove(id);
        let unit = record.unit.clone();
        self.held_changed();
        if self.by_unit.remove(&unit).is_some() && state.is_some() {
            // Kept loaded a while, so that `systemctl status` shows how
            // it ended; released oldest first.
            let room = MAX_TRACKED_UNITS.saturating_sub(self.tracked_units());
            let ended_at = record.ended_at.unwrap_or_else(now_micros);
            for unit in self.kept.keep(unit, ended_at, now_micros(), room) {
                self.systemd.release_in_background(unit);
            }
        }
        self.board.recent_mut().insert(&record);
        let end = crate::history::End {
            ended_at: record.ended_at.unwrap_or(0),
            id: record.id.clone(),
        };
        if let Err(e) = self.end_order.push(&end) {
            // Listings and retention miss it until the next start, which
            // rebuilds the order from the records.
            error!(job = %id, PTRAIN_JOB = %id, error = %e, "cannot add a finished job to the history's order");
        }
        // Its dependents' detail ("waiting for ID") changed with it:
        // posted before its signal, which a caller may act on.
        self.refresh_queued(self.live.constrained());
        self.announce(&record);
    }

    /// An attempt ended and the job runs again ([`lifecycle::requeued`]):
    /// the next attempt is saved queued first; then the ended unit is let
    /// go at once (the next attempt's unit has its name), its GPUs are
    /// free, and its begin timer is armed.
    fn run_again(&mut self, record: JobRecord, told: Vec<crate::notifications::Intent>) {
        let id = record.id.clone();
        crash_point("before-record-requeue");
        if let Err(e) = self.store.save(&record) {
            error!(job = %id, PTRAIN_JOB = %id, error = %e, "cannot record the job's next attempt; keeping the unit until it can be recorded");
            self.store_failed();
            return;
        }
        if let Some(last) = record.attempts.last() {
            info!(
                job = %id,
                PTRAIN_JOB = %id,
                attempt = last.attempt,
                "attempt {} ended: {}; {}: attempt {} from {}",
                last.attempt,
                last.outcome.describe(),
                last.why,
                record.attempt,
                record
                    .begin_at
                    .map(crate::spec::begin::format_moment)
                    .unwrap_or_default(),
            );
        }
        self.notifier.deliver(told);
        self.live.requeued(record);
        self.checkpoints.remove(&id);
        self.store.remove_exit_record(&id);
        self.runtime.remove(&id);
        self.held_changed();
        let unit = id.unit_name();
        if self.by_unit.remove(&unit).is_some() {
            self.systemd.release_in_background(unit);
        }
        self.emit_changed(&id);
    }

    /// A finished job's full record, from disk (memory keeps a summary).
    fn ended_record(&self, id: &JobId) -> Option<JobRecord> {
        match self.store.load(id) {
            Ok(full) => Some(full),
            Err(e) => {
                warn!(job = %id, PTRAIN_JOB = %id, error = %e, "cannot read a finished job's record");
                None
            }
        }
    }

    async fn on_api(&mut self, request: ApiRequest) {
        match request {
            ApiRequest::ListRecent(limit, reply) => {
                let _ = reply.send(self.listing(limit as usize, FULL_ENDS_LISTED));
            }
            ApiRequest::List(reply) => {
                // At most MAX_LIST_ALL, newest first, so the reply stays
                // under the system bus's message size limit.
                let room =
                    MAX_LIST_ALL.saturating_sub(self.live.queue().len() + self.by_unit.len());
                let _ = reply.send(self.listing(room, 0));
            }
            ApiRequest::Stop {
                id,
                caller_uid,
                reply,
            } => {
                let result = self.stop(&id, caller_uid).await;
                let _ = reply.send(result);
            }
            // Answered once systemd froze or thawed the units, off this task.
            ApiRequest::Change {
                id,
                change: change @ (Change::Pause | Change::Resume),
                caller_uid,
                reply,
            } => self.pause(&id, change == Change::Pause, caller_uid, reply),
            ApiRequest::Change {
                id,
                change,
                caller_uid,
                reply,
            } => {
                let result = self.change(&id, change, caller_uid);
                let _ = reply.send(result);
            }
            ApiRequest::Rejected { caller_uid, reply } => {
                let result = self
                    .store
                    .rejected()
                    .map(|all| {
                        all.into_iter()
                            .filter(|r| caller_uid == 0 || r.uid == Some(caller_uid))
                            .collect()
                    })
                    .map_err(ApiError::Rejected);
                let _ = reply.send(result);
            }
            ApiRequest::FairShare { caller_uid, reply } => {
                let half_life_secs = self.fair_share.as_ref().map(|l| l.half_life().as_secs());
                let read_back = self.fair_share.as_ref().is_some_and(|l| l.is_read_back());
                let view = match (half_life_secs, self.fair_share_standings()) {
                    (Some(half_life_secs), Some(mut users)) => {
                        users.retain(|s| caller_uid == 0 || s.uid == caller_uid);
                        Ok(crate::fair_share::FairShareView {
                            half_life_secs,
                            read_back,
                            users,
                        })
                    }
                    _ => Err(ApiError::FairShareOff),
                };
                let _ = reply.send(view);
            }
            ApiRequest::Gpus(reply) => {
                let snapshot = self.inventory.snapshot().map_err(ApiError::Gpus);
                let view = snapshot.map(|gpus| GpusView {
                    backend: self.inventory.backend().to_string(),
                    gpus: gpus
                        .into_iter()
                        .map(|gpu| {
                            let held_by = self.live.held().get(&gpu.index).map(|id| id.to_string());
                            let reserved_for =
                                self.reserved.get(&gpu.index).map(|id| id.to_string());
                            let state = GpuState::of(
                                &gpu,
                                held_by.as_deref(),
                                reserved_for.as_deref(),
                                self.config.gpus.foreign_memory_threshold_mib,
                            );
                            GpuView {
                                state: state.name().to_owned(),
                                detail: state.describe(),
                                held_by,
                                reserved_for,
                                gpu,
                            }
                        })
                        .collect(),
                });
                let _ = reply.send(view);
            }
            // Read off this task.
            ApiRequest::Images { caller_uid, reply } => match &self.images {
                Ok(images) => images.list(caller_uid, self.config.privacy.show_all_jobs, reply),
                Err(why) => {
                    let _ = reply.send(Err(ApiError::Images(format!(
                        "ptraind's image store is not open: {why}"
                    ))));
                }
            },
            // Answered by the sender task; the state task does not wait.
            ApiRequest::Notifications(reply) => self.notifier.list(reply),
            ApiRequest::RetryNotifications(target, reply) => self.notifier.retry(target, reply),
        }
    }

    /// Applies `[retention]`: the oldest finished jobs beyond the limits
    /// are compacted (see [`Store::compact`]). Looks only at the oldest end,
    /// so its cost does not grow with the history.
    fn prune_history(&mut self) {
        let retention = self.config.retention.clone();
        let now = now_micros();
        let cutoff = now.saturating_sub(retention.rejected_max_age.as_micros() as u64);
        for gone in self.quarantine.expire(cutoff) {
            self.forget_rejected(&gone, QuarantineBound::MaxAge);
        }
        loop {
            let oldest = match self.end_order.oldest() {
                Ok(Some(oldest)) => oldest,
                Ok(None) => break,
                Err(e) => {
                    error!(error = %e, "cannot apply [retention]");
                    break;
                }
            };
            let too_many = self.end_order.len() > retention.max_ended_jobs;
            let too_old = retention
                .max_age
                .is_some_and(|age| oldest.ended_at.saturating_add(age.as_micros() as u64) < now);
            if !too_many && !too_old {
                break;
            }
            let id = oldest.id.clone();
            let record = match self.store.load(&id) {
                Ok(record) => Some(record).filter(|r| oldest.is_of(r)),
                Err(crate::store::StoreError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    None
                }
                Err(e) => {
                    error!(job = %id, PTRAIN_JOB = %id, error = %e, "cannot read a finished job to compact it; keeping it");
                    break;
                }
            };
            let Some(record) = record else {
                // Restarted since, or compacted and its id claimed again:
                // the line is stale.
                if let Err(e) = self.end_order.pop_oldest(false) {
                    error!(error = %e, "cannot apply [retention]");
                    break;
                }
                continue;
            };
            // A queued job still needs its parents' outcomes (and results).
            let group = record.group.clone();
            let needed = self.live.constrained().iter().any(|q| {
                let after = self.live[q].spec.after.all();
                after.contains(&id) || group.as_ref().is_some_and(|g| after.contains(g))
            });
            if needed {
                break;
            }
            // Its notifications go first: one still being retried keeps
            // the job (and its outbox entry) until it is delivered or dead.
            let keys: Vec<String> = record.notifications.iter().map(|i| i.key.clone()).collect();
            if !keys
                .iter()
                .all(|k| self.outbox.is_final(k).unwrap_or(false))
            {
                break;
            }
            if let Err(e) = self.store.compact(&record) {
                error!(job = %id, PTRAIN_JOB = %id, error = %e, "cannot compact a finished job; keeping it");
                self.store_failed();
                break;
            }
            // Removed by the sender, the outbox's only writer: a dead
            // letter root re-sent meanwhile goes once it is final again.
            self.notifier.forget(keys);
            // Its id is free again: the old unit must be gone before a new
            // job of that id starts, or systemd would answer UnitExists and
            // the old end be taken for the new job's. The Unref is sent
            // now, a pass before any claim of that id, on the connection
            // that would carry its StartTransientUnit: systemd handles it
            // (and collects the unit) first.
            if self.kept.forget(&record.unit) {
                self.systemd.release_in_background(record.unit.clone());
            }
            self.board.recent_mut().remove(&id);
            if let Err(e) = self.end_order.pop_oldest(true) {
                error!(error = %e, "cannot apply [retention]");
                break;
            }
            if let Some(group) = group {
                if let Some(members) = self.groups.get_mut(&group) {
                    members.retain(|m| *m != id);
                    if members.is_empty() {
                        self.groups.remove(&group);
                        self.store.remove_group(&group);
                    }
                }
            }
        }
    }

    /// Queued and running jobs, and which of the `ended` most recently
    /// finished to show (the caller reads their views: a finished job's
    /// record is on disk, its summary in memory if it ended recently).
    fn listing(&self, ended: usize, whole: usize) -> crate::requests::Listing {
        let mut live: Vec<&JobId> = self
            .live
            .queue()
            .iter()
            .chain(self.by_unit.values())
            .chain(&self.launch_backlog)
            .collect();
        live.sort();
        live.dedup();
        let ends = match ended {
            0 => Vec::new(),
            n => self.end_order.newest(n).unwrap_or_else(|e| {
                error!(error = %e, "cannot list the finished jobs");
                Vec::new()
            }),
        };
        crate::requests::Listing {
            live: live
                .into_iter()
                .filter_map(|id| self.live.get(id))
                .map(|record| self.view(record))
                .collect(),
            ends,
            whole,
        }
    }

    /// A live job as the API shows it, with what a queued job waits for:
    /// its parents, its sweep's max_parallel, or what the last plan said
    /// (a cap, GPUs kept for a job ahead, busy GPUs).
    fn view(&self, record: &JobRecord) -> JobView {
        let mut view = JobView::of(record);
        if let (Some(by), JobState::Launching | JobState::Running) =
            (record.stop_requested_by, record.state)
        {
            // Until systemd says it ended, the job still runs: say that it
            // is on its way out.
            let who = match by {
                0 => "root".to_string(),
                uid => users::owner_of_uid(uid).map_or_else(|| format!("uid {uid}"), |o| o.name),
            };
            view.detail = match record.stop_at {
                Some(at) => format!(
                    "stopping at {} (asked by {who}; its checkpoint_lead after its checkpoint signal), then SIGTERM, then SIGKILL after the stop grace",
                    crate::spec::begin::format_moment(at)
                ),
                None => format!("stopping (asked by {who}): SIGTERM, then SIGKILL if it is still there after the stop grace"),
            };
        }
        if let Some((detail, waiting_for)) = self.queued_detail(record) {
            view.detail = detail;
            view.waiting_for = waiting_for;
        }
        view
    }

    /// What a queued job waits for, and the ids it waits on: its parents,
    /// its sweep's max_parallel, or what the last plan said. None: nothing
    /// beyond its state (or it is not queued).
    fn queued_detail(&self, record: &JobRecord) -> QueuedDetail {
        if record.state != JobState::Queued {
            return None;
        }
        if record.held {
            return Some((
                format!("held; `ptrain release {}` lets it start", record.id),
                Vec::new(),
            ));
        }
        if let (Some(reference), None) = (&record.spec.image, &record.image) {
            let progress = self
                .images
                .as_ref()
                .ok()
                .and_then(|i| i.progress(reference));
            let detail = match progress {
                Some((done, total)) if total > 0 => format!(
                    "pulling image {reference}: {:.1} of {:.1} MiB ({}%)",
                    done as f64 / 1048576.0,
                    total as f64 / 1048576.0,
                    done * 100 / total
                ),
                _ => format!("pulling image {reference}"),
            };
            return Some((detail, Vec::new()));
        }
        if !record.spec.after.is_empty() {
            if let crate::chain::Readiness::Waiting(ids) =
                crate::chain::readiness(&record.spec.after, |named| self.parents(named))
            {
                return Some((format!("waiting for {}", ids.join(", ")), ids));
            }
        }
        if let Some(at) = record.begin_at.filter(|at| *at > now_micros()) {
            let at = crate::spec::begin::format_moment(at);
            let detail = match record.attempts.last() {
                Some(last) => format!(
                    "attempt {} waits until {at} ({}; attempt {}: {})",
                    record.attempt,
                    last.why,
                    last.attempt,
                    last.outcome.describe()
                ),
                None => format!("waiting until {at} (its `begin`)"),
            };
            return Some((detail, Vec::new()));
        }
        if let (true, Some(group), Some(max)) = (
            self.blocked.contains(&record.id),
            &record.group,
            record.max_parallel,
        ) {
            return Some((
                format!(
                    "waiting: sweep {group} runs at most {max} job(s) at once (its max_parallel)"
                ),
                Vec::new(),
            ));
        }
        if record.spec.gpus.count() > 0 {
            if let Some(why) = self.over_quota.get(&record.owner.uid) {
                return Some((why.clone(), Vec::new()));
            }
        }
        self.waits
            .get(&record.id)
            .map(|wait| (wait.describe(&record.spec.gpus), Vec::new()))
    }

    async fn stop(&mut self, id: &str, caller_uid: u32) -> Result<String, ApiError> {
        let job_id = JobId::parse(id).map_err(|_| ApiError::NotFound(id.to_owned()))?;
        if let Some(members) = self.groups.get(&job_id).cloned() {
            // A sweep id stops every member still queued or running.
            let mut lines = Vec::new();
            for member in members {
                if self.live.contains(&member) {
                    lines.push(Box::pin(self.stop(member.as_str(), caller_uid)).await?);
                }
            }
            if lines.is_empty() {
                return Ok(format!("every job of sweep {id} already ended"));
            }
            return Ok(lines.join("\n"));
        }
        let ended = self
            .board
            .ended(&job_id)
            .map(|e| (e.owner_uid, e.owner_name.to_string(), e.status()));
        if let Some((owner_uid, owner, status)) = ended {
            if caller_uid != 0 && caller_uid != owner_uid {
                return Err(ApiError::NotYours {
                    id: id.to_owned(),
                    owner,
                    action: "stop",
                });
            }
            return Ok(format!("job {id} already ended ({status})"));
        }
        let record = self
            .live
            .get_mut(&job_id)
            .ok_or_else(|| ApiError::NotFound(id.to_owned()))?;
        if caller_uid != 0 && caller_uid != record.owner.uid {
            return Err(ApiError::NotYours {
                id: id.to_owned(),
                owner: record.owner.name.clone(),
                action: "stop",
            });
        }
        match record.state {
            JobState::Ended => Ok(format!("job {id} already ended ({})", record.status())),
            JobState::Queued => {
                self.finish(&job_id, Outcome::stopped_by(caller_uid), None)
                    .await;
                Ok(format!("job {id} removed from the queue"))
            }
            JobState::Launching if self.launch_backlog.contains(&job_id) => {
                // Its unit was never asked for: nothing to stop in systemd.
                self.launch_backlog.retain(|queued| *queued != job_id);
                self.finish(&job_id, Outcome::stopped_by(caller_uid), None)
                    .await;
                Ok(format!("job {id} stopped before its unit started"))
            }
            JobState::Launching | JobState::Running => {
                let before = checkpoints::StopMarks::of(record);
                record.stop_requested_by = Some(caller_uid);
                let plan = checkpoints::plan_stop(record, now_micros());
                if let Err(e) = self.store.save(record) {
                    // Not recorded, so not made: memory says what disk says.
                    before.put_back(record);
                    return Err(ApiError::RecordStop(e));
                }
                let unit = record.unit.clone();
                let launching = record.state == JobState::Launching;
                self.post_view(&job_id);
                info!(job = %id, PTRAIN_JOB = %id, unit, by_uid = caller_uid, "stopping job");
                match self.carry_out_stop(&job_id, plan).await {
                    Ok(Some(later)) => Ok(format!(
                        "job {id}: {later}; `ptrain stop {id}` again stops it now"
                    )),
                    Ok(None) => Ok(format!("job {id} is stopping")),
                    // Its StartTransientUnit is still out: the answer
                    // stops it (on_started), the stop request is recorded.
                    Err(SystemdError::NoSuchUnit(_)) if launching => {
                        Ok(format!("job {id} is stopping"))
                    }
                    Err(e) => Err(ApiError::StopUnit(e)),
                }
            }
        }
    }

    /// The jobs a change to `id` applies to, each its caller's own (or
    /// the caller is root): the job, or every member of the sweep `id`
    /// names (the members ended and compacted away left out), with their
    /// state and status.
    fn steered(&self, id: &str, caller_uid: u32, verb: &'static str) -> Result<Steered, ApiError> {
        let job_id = JobId::parse(id).map_err(|_| ApiError::NotFound(id.to_owned()))?;
        let is_sweep = self.groups.contains_key(&job_id);
        let members = match self.groups.get(&job_id) {
            Some(members) => members.clone(),
            None => vec![job_id.clone()],
        };
        let mut steered = Steered {
            is_sweep,
            members: Vec::with_capacity(members.len()),
        };
        for member in members {
            let (owner_uid, owner, state, status) = match self.live.get(&member) {
                Some(r) => (r.owner.uid, r.owner.name.clone(), r.state, r.status()),
                None => match self.board.ended(&member) {
                    Some(e) => (
                        e.owner_uid,
                        e.owner_name.to_string(),
                        JobState::Ended,
                        e.status(),
                    ),
                    None if is_sweep => continue,
                    None => return Err(ApiError::NotFound(id.to_owned())),
                },
            };
            if caller_uid != 0 && caller_uid != owner_uid {
                return Err(ApiError::NotYours {
                    id: id.to_owned(),
                    owner,
                    action: verb,
                });
            }
            steered.members.push((member, state, status));
        }
        Ok(steered)
    }

    /// The members of `steered` in `state` whose `flag` is not `wanted`
    /// yet; a job not in `state` is an error `not_in_state` makes (a
    /// sweep's are passed over).
    fn to_change(
        &self,
        id: &str,
        steered: Steered,
        state: JobState,
        flag: impl Fn(&JobRecord) -> bool,
        wanted: bool,
        not_in_state: impl Fn(String, &'static str) -> ApiError,
    ) -> Result<Vec<JobId>, ApiError> {
        let mut changed = Vec::new();
        for (member, member_state, status) in steered.members {
            if member_state != state {
                if steered.is_sweep {
                    continue;
                }
                return Err(not_in_state(id.to_owned(), status));
            }
            if flag(&self.live[&member]) != wanted {
                changed.push(member);
            }
        }
        Ok(changed)
    }

    /// What a change did, for its answer.
    fn changed_answer(id: &str, is_sweep: bool, n: usize, done: &str) -> String {
        match (is_sweep, n) {
            (false, 0) => format!("job {id} was already {done}"),
            (false, _) => format!("job {id} {done}"),
            (true, 0) => format!("no job of sweep {id} to be {done}"),
            (true, n) => format!("{n} job(s) of sweep {id} {done}"),
        }
    }

    /// The changes answered at once (pause and resume wait for systemd:
    /// [`Daemon::pause`]).
    fn change(&mut self, id: &str, change: Change, caller_uid: u32) -> Result<String, ApiError> {
        match change {
            Change::Hold => self.hold(id, true, caller_uid),
            Change::Release => self.hold(id, false, caller_uid),
            Change::Pause | Change::Resume => unreachable!("answered by Daemon::pause"),
            Change::Update(update) => self.update(id, &update, caller_uid),
            Change::Restart { as_id } => self.restart(id, as_id.as_deref(), caller_uid),
        }
    }

    /// Runs ended jobs again, their specs unchanged (`ptrain restart`):
    /// each as its next attempt under its id ([`lifecycle::restarted`]),
    /// or one as a new job `as_id`. Saved before it is queued; its
    /// dependents decided by the run that ended stay decided.
    fn restart(
        &mut self,
        id: &str,
        as_id: Option<&str>,
        caller_uid: u32,
    ) -> Result<String, ApiError> {
        let steered = self.steered(id, caller_uid, "restart")?;
        let is_sweep = steered.is_sweep;
        if is_sweep && as_id.is_some() {
            return Err(ApiError::BadUpdate(format!(
                "{id} is a sweep: `--as` gives one job a new id; restart its jobs by their own ids, or the sweep without --as"
            )));
        }
        let by = match caller_uid {
            0 => "root".to_owned(),
            uid => users::owner_of_uid(uid).map_or_else(|| format!("uid {uid}"), |o| o.name),
        };
        let now = now_micros();
        let mut records = Vec::new();
        for (member, state, status) in steered.members {
            if state != JobState::Ended {
                if is_sweep {
                    continue;
                }
                return Err(ApiError::NotEnded {
                    id: id.to_owned(),
                    status,
                });
            }
            let ended = self
                .ended_record(&member)
                .ok_or_else(|| ApiError::Compacted(member.to_string()))?;
            let record = match as_id {
                Some(new_id) => self.restarted_as(&ended, new_id, now)?,
                None => lifecycle::restarted(&ended, &by, now).ok_or_else(|| {
                    ApiError::BadUpdate(format!(
                        "job {member} ran {} attempts, the most one job may; restart it under a new id (`--as NEW`)",
                        ended.attempt
                    ))
                })?,
            };
            records.push(record);
        }
        if let Some(first) = records.first() {
            let owner = &first.owner;
            let queued = self.live.queued_of(owner.uid);
            if queued + records.len() > self.config.max_queued_per_user {
                return Err(ApiError::BadUpdate(format!(
                    "{} already has {queued} queued jobs, the limit (max_queued_per_user); wait for some to start",
                    owner.name
                )));
            }
        }
        let n = records.len();
        let mut said = Vec::new();
        for record in records {
            let new_id = record.id.clone();
            // A new id is claimed with the descriptor its job came from.
            let saved = match as_id {
                None => self.store.save(&record),
                Some(_) => self
                    .store
                    .descriptor(&JobId::parse(id).expect("steered"))
                    .and_then(|descriptor| self.store.claim(&record, &descriptor)),
            };
            if let Err(source) = saved {
                return Err(ApiError::RecordChange {
                    id: new_id.to_string(),
                    done: "restarted",
                    source,
                });
            }
            if as_id.is_none() {
                // Out of the history, its kept unit let go: the next
                // attempt's unit has its name.
                // Its end's line in the order is stale now.
                self.board.recent_mut().remove(&new_id);
                self.end_order.forget_one();
                if self.kept.forget(&record.unit) {
                    self.systemd.release_in_background(record.unit.clone());
                }
                said.push(format!(
                    "job {new_id} queued again as attempt {}",
                    record.attempt
                ));
            } else {
                said.push(format!("job {id} restarted as job {new_id}"));
            }
            info!(job = %new_id, PTRAIN_JOB = %new_id, from = id, by_uid = caller_uid, attempt = record.attempt, "job restarted");
            self.queue(record);
            self.emit_changed(&new_id);
        }
        Ok(match (is_sweep, n) {
            (true, 0) => format!("no ended job of sweep {id} to restart"),
            _ => said.join("\n"),
        })
    }

    /// An ended job's spec as a new job `new_id` of the same owner,
    /// submitted now: not held, no `begin`, out of any sweep.
    fn restarted_as(
        &self,
        ended: &JobRecord,
        new_id: &str,
        now: u64,
    ) -> Result<JobRecord, ApiError> {
        let new_id = JobId::parse(new_id).map_err(|e| ApiError::BadUpdate(format!("--as: {e}")))?;
        if admission::Known::is_taken(self, &new_id) {
            return Err(ApiError::BadUpdate(format!(
                "job id {new_id} already exists; ids are unique: pick another for --as"
            )));
        }
        let mut spec = ended.spec.clone();
        spec.id = new_id;
        spec.hold = false;
        spec.begin = None;
        let mut record = JobRecord::new(spec, ended.owner.clone(), ended.source.clone(), now);
        record.limits = ended.limits;
        record.params = ended.params.clone();
        Ok(record)
    }

    /// Changes a queued job's priority, begin or timeout, or every queued
    /// member's of a sweep, by the job file's rules: every member is
    /// checked before any is changed, and each is saved before its place
    /// in the queue moves (a restart keeps the change).
    fn update(
        &mut self,
        id: &str,
        update: &crate::spec::Update,
        caller_uid: u32,
    ) -> Result<String, ApiError> {
        let steered = self.steered(id, caller_uid, "update")?;
        let is_sweep = steered.is_sweep;
        let now = now_micros();
        let begin_at = update
            .begin
            .map(|begin| crate::spec::begin::resolve(begin, now, now))
            .transpose()
            .map_err(ApiError::BadUpdate)?;
        let mut updated = Vec::new();
        for (member, state, status) in steered.members {
            if state != JobState::Queued {
                if is_sweep {
                    continue;
                }
                return Err(ApiError::NotQueued {
                    id: id.to_owned(),
                    status,
                    done: "updated",
                });
            }
            let mut next = self.live[&member].clone();
            if let Some(priority) = update.priority {
                next.spec.priority = priority;
            }
            if let Some(at) = begin_at {
                next.begin_at = Some(at);
                next.spec.begin = Some(crate::spec::begin::Begin::At(at));
            }
            if let Some(timeout) = update.timeout {
                if let Some(checkpoint) = next.spec.checkpoint.filter(|c| c.lead >= timeout) {
                    return Err(ApiError::BadUpdate(format!(
                        "job {member}'s checkpoint_lead ({}) is not shorter than the new timeout ({}); pick a longer timeout",
                        humantime::format_duration(checkpoint.lead),
                        humantime::format_duration(timeout)
                    )));
                }
                next.spec.timeout = Some(timeout);
            }
            updated.push(next);
        }
        let n = updated.len();
        for next in updated {
            let member = next.id.clone();
            if let Err(source) = self.store.save(&next) {
                return Err(ApiError::RecordChange {
                    id: member.to_string(),
                    done: "updated",
                    source,
                });
            }
            info!(job = %member, PTRAIN_JOB = %member, by_uid = caller_uid, priority = next.spec.priority, begin_at = ?next.begin_at, timeout = ?next.spec.timeout, "job updated");
            self.live.update_queued(next);
            self.emit_changed(&member);
        }
        // Planned again by the loop after the request (`schedule`).
        Ok(Self::changed_answer(id, is_sweep, n, "updated"))
    }

    /// Holds or releases a queued job, or every queued member of a sweep;
    /// says what it did. Durable before it answers: the record says held
    /// before the caller hears so (a restart keeps it held).
    fn hold(&mut self, id: &str, hold: bool, caller_uid: u32) -> Result<String, ApiError> {
        let change = if hold { Change::Hold } else { Change::Release };
        let steered = self.steered(id, caller_uid, change.verb())?;
        let is_sweep = steered.is_sweep;
        let changed = self.to_change(
            id,
            steered,
            JobState::Queued,
            |r| r.held,
            hold,
            |id, status| ApiError::NotQueued {
                id,
                status,
                done: change.done(),
            },
        )?;
        for member in &changed {
            self.live.set_held(member, hold);
            if let Err(source) = self.store.save(&self.live[member]) {
                // Not recorded, so not made: memory says what disk says.
                self.live.set_held(member, !hold);
                return Err(ApiError::RecordChange {
                    id: member.to_string(),
                    done: change.done(),
                    source,
                });
            }
            info!(job = %member, PTRAIN_JOB = %member, by_uid = caller_uid, "job {}", change.done());
            self.emit_changed(member);
        }
        // Planned again by the loop after the request (`schedule`).
        Ok(Self::changed_answer(
            id,
            is_sweep,
            changed.len(),
            change.done(),
        ))
    }

    /// Pauses (systemd's FreezeUnit) or resumes (ThawUnit) a running job,
    /// or every running member of a sweep; its GPUs stay its own. The
    /// record says paused before systemd is asked; the calls go out from a
    /// task of their own (systemd answers a freeze once the cgroup is
    /// frozen, which a process stuck in the kernel delays), which answers
    /// the caller, and each result comes back as [`Event::Freezer`]: a
    /// refusal puts the record back. A resume always asks for the thaw,
    /// so a unit frozen behind the record's back runs again too.
    fn pause(
        &mut self,
        id: &str,
        pause: bool,
        caller_uid: u32,
        reply: tokio::sync::oneshot::Sender<Result<String, ApiError>>,
    ) {
        let change = if pause { Change::Pause } else { Change::Resume };
        let steered = match self.steered(id, caller_uid, change.verb()) {
            Ok(steered) => steered,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let is_sweep = steered.is_sweep;
        let changed = self.to_change(
            id,
            steered,
            JobState::Running,
            // A resume asks for every running job's thaw.
            |r| !pause || r.paused,
            pause,
            |id, status| ApiError::NotRunning { id, status },
        );
        let changed = match changed {
            Ok(changed) => changed,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let mut calls = Vec::new();
        let mut not_recorded = None;
        for member in &changed {
            let record = self.live.get_mut(member).expect("running");
            let was = record.paused;
            record.paused = pause;
            if let Err(source) = self.store.save(record) {
                record.paused = was;
                // The members recorded before this one are still asked.
                not_recorded = Some(ApiError::RecordChange {
                    id: member.to_string(),
                    done: change.done(),
                    source,
                });
                break;
            }
            calls.push((member.clone(), record.unit.clone()));
            self.freezing.insert(member.clone());
            self.post_view(member);
        }
        let answer = Self::changed_answer(id, is_sweep, changed.len(), change.done());
        let systemd = self.systemd.clone();
        let events = self.events.clone();
        tokio::spawn(async move {
            let mut failed = None;
            for (member, unit) in calls {
                let error = match &failed {
                    Some(_) => {
                        Some("not asked: systemd refused an earlier job of the sweep".to_owned())
                    }
                    None => freezer_call(&systemd, &unit, pause).await.err(),
                };
                if let (None, Some(e)) = (&failed, &error) {
                    failed = Some(ApiError::Freezer {
                        id: member.to_string(),
                        verb: change.verb(),
                        why: e.clone(),
                    });
                }
                let _ = events.send(Event::Freezer {
                    id: member,
                    pause,
                    error,
                });
            }
            let _ = reply.send(match not_recorded.or(failed) {
                Some(e) => Err(e),
                None => Ok(answer),
            });
        });
    }

    /// A freeze or thaw came back ([`Daemon::pause`]): a refused one is
    /// undone in the record, unless another change came since.
    fn on_freezer(&mut self, id: &JobId, pause: bool, error: Option<String>) {
        self.freezing.remove(id);
        let Some(record) = self.live.get_mut(id) else {
            return;
        };
        let done = if pause { "paused" } else { "resumed" };
        match error {
            None => info!(job = %id, PTRAIN_JOB = %id, unit = %record.unit, "job {done}"),
            Some(e) => {
                warn!(job = %id, PTRAIN_JOB = %id, unit = %record.unit, error = %e, "systemd did not let the job be {done}");
                if record.paused == pause && record.state == JobState::Running {
                    record.paused = !pause;
                    if let Err(e) = self.store.save(record) {
                        error!(job = %id, PTRAIN_JOB = %id, error = %e, "cannot record that the job was not {done}");
                    }
                }
            }
        }
        self.post_view(id);
        self.emit_changed(id);
    }

    /// Posts a live job's view, as `ptrain status` shows it, on the board.
    fn post_view(&self, id: &JobId) {
        let Some(record) = self.live.get(id) else {
            return;
        };
        let view = JobView {
            source: Some(record.source.clone()),
            ..self.view(record)
        };
        self.board.post(id, view, self.queued_detail(record));
    }

    /// Posts again the queued jobs among `ids` whose detail changed (a
    /// plan's wait, their parents, their sweep's slots).
    fn refresh_queued<'a>(&self, ids: impl IntoIterator<Item = &'a JobId>) {
        for id in ids {
            let Some(record) = self.live.get(id).filter(|r| r.state == JobState::Queued) else {
                continue;
            };
            if self
                .board
                .queued_detail_differs(id, &self.queued_detail(record))
            {
                self.post_view(id);
            }
        }
    }

    /// Tells the output readers and D-Bus listeners that a live job moved.
    fn emit_changed(&self, id: &JobId) {
        if let Some(record) = self.live.get(id) {
            self.announce(record);
        }
    }

    fn announce(&self, record: &JobRecord) {
        // Before the signal: a caller who saw it reads the change.
        match record.state {
            JobState::Ended => self.board.take_down(&record.id),
            _ => self.post_view(&record.id),
        }
        self.logs.job_changed(record);
        // Never waits: a slow bus must not hold up the state task.
        let _ = self
            .job_signals
            .send((record.id.to_string(), record.status().to_string()));
    }
}

/// Emits JobChanged for each change sent, one after the other, in the
/// order the state task made them. (A task per signal, as before, let two
/// changes of one job reach listeners in either order on the
/// multi-threaded runtime: "succeeded", then "running".)
fn spawn_job_signals(
    tasks: &tokio_util::task::TaskTracker,
    conn: zbus::Connection,
) -> mpsc::UnboundedSender<(String, String)> {
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, String)>();
    tasks.spawn(async move {
        while let Some((id, status)) = rx.recv().await {
            let _ = conn
                .emit_signal(
                    None::<&str>,
                    DBUS_PATH,
                    DBUS_NAME,
                    "JobChanged",
                    &(id.as_str(), status.as_str()),
                )
                .await;
        }
    });
    tx
}
