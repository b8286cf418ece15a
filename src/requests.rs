//! The state task's request protocol: what the D-Bus face (and the
//! metrics endpoint, and a log reader that fell behind) asks the daemon's
//! state task, the reply channel each request carries, and [`ApiError`].

use tokio::sync::oneshot;

use crate::gpu::GpuError;
use crate::notifications::{DeliveriesError, DeliveryView, RetryTarget};
use crate::store::{RejectRecord, StoreError};
use crate::systemd::SystemdError;
use crate::views::{GpusView, ImageView, JobView};

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
    /// `ptrain rejected`: the quarantine could not be read.
    #[error("{0}")]
    Rejected(StoreError),
    /// `ptrain gpus`: the inventory could not be read.
    #[error("{0}")]
    Gpus(GpuError),
    /// `ptrain images`: the image store could not be read (or opened).
    #[error("{0}")]
    Images(String),
    /// `ptrain stop`: the stop request could not be made durable.
    #[error("cannot record the stop request: {0}")]
    RecordStop(StoreError),
    /// `ptrain hold`, `release`: the job is no longer queued.
    #[error("job {id} is not queued (status: {status}); only a queued job can be {done}")]
    NotQueued {
        id: String,
        status: &'static str,
        done: &'static str,
    },
    /// `ptrain restart`: the job has not ended.
    #[error("job {id} has not ended (status: {status}); only an ended job can be restarted (`ptrain stop {id}` first)")]
    NotEnded { id: String, status: &'static str },
    /// `ptrain update`: the change breaks a rule of the job file.
    #[error("{0}")]
    BadUpdate(String),
    /// `ptrain pause`, `resume`: the job is not running.
    #[error(
        "job {id} is not running (status: {status}); only a running job can be paused or resumed"
    )]
    NotRunning { id: String, status: &'static str },
    /// A [`Change`] could not be made durable (for a sweep, the members
    /// before this one were changed).
    #[error("cannot record that job {id} is {done}: {source}; it stays as it was, try again once the state directory accepts writes")]
    RecordChange {
        id: String,
        done: &'static str,
        source: StoreError,
    },
    /// `ptrain pause`, `resume`: systemd did not freeze or thaw the unit.
    #[error("systemd could not {verb} job {id}: {why}; it stays as it was")]
    Freezer {
        id: String,
        verb: &'static str,
        why: String,
    },
    /// `ptrain stop`: systemd refused to stop the job's unit.
    #[error("{0}")]
    StopUnit(SystemdError),
    #[error("only root may {0}; run it with sudo")]
    RootOnly(&'static str),
    /// `ptrain report --fair-share` on a host without it.
    #[error("fair share is off on this host; an admin turns it on with `[policy] fair_share = {{ half_life = \"7d\" }}` in ptraind.toml")]
    FairShareOff,
}

/// What the state task answers a listing with: the live jobs' views,
/// and which ends to show (the newest first), whose views the caller
/// reads ([`crate::board::Board::ended_views`]) so that the state task
/// reads no file for them.
pub struct Listing {
    pub live: Vec<JobView>,
    pub ends: Vec<crate::history::End>,
    /// How many of the newest ends are shown whole, as `ptrain status`.
    pub whole: usize,
}

/// A request from the API to the daemon's state task.
pub enum ApiRequest {
    List(oneshot::Sender<Listing>),
    /// Queued and running jobs plus the `limit` most recently ended.
    ListRecent(u32, oneshot::Sender<Listing>),
    Stop {
        id: String,
        caller_uid: u32,
        reply: oneshot::Sender<Result<String, ApiError>>,
    },
    /// A change to a job, or to a sweep's members, by its owner or root.
    Change {
        id: String,
        change: Change,
        caller_uid: u32,
        reply: oneshot::Sender<Result<String, ApiError>>,
    },
    Rejected {
        caller_uid: u32,
        reply: oneshot::Sender<Result<Vec<RejectRecord>, ApiError>>,
    },
    Gpus(oneshot::Sender<Result<GpusView, ApiError>>),
    /// The image store's images (`ptrain images`), answered off the
    /// state task: every image, with only the caller's own name among
    /// its users unless the caller is root.
    Images {
        caller_uid: u32,
        reply: oneshot::Sender<Result<Vec<ImageView>, ApiError>>,
    },
    /// Each user's fair-share standing (`ptrain report --fair-share`):
    /// root sees everyone's, another caller their own.
    FairShare {
        caller_uid: u32,
        reply: oneshot::Sender<Result<crate::fair_share::FairShareView, ApiError>>,
    },
    /// Notification deliveries (root only; checked by the API).
    Notifications(oneshot::Sender<Result<Vec<DeliveryView>, DeliveriesError>>),
    RetryNotifications(
        RetryTarget,
        oneshot::Sender<Result<String, DeliveriesError>>,
    ),
}

/// What its owner (or root) may change of a job.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// Keep a queued job from starting (`ptrain hold`).
    Hold,
    Release,
    /// Freeze a running job, its GPUs kept (`ptrain pause`).
    Pause,
    Resume,
    /// Run an ended job again (`ptrain restart`): as its next attempt, or
    /// as a new job of this id.
    Restart {
        as_id: Option<String>,
    },
    /// Change a queued job's priority, begin or timeout (`ptrain update`).
    Update(Box<crate::spec::Update>),
}

impl Change {
    pub fn verb(&self) -> &'static str {
        match self {
            Change::Hold => "hold",
            Change::Release => "release",
            Change::Pause => "pause",
            Change::Resume => "resume",
            Change::Update(_) => "update",
            Change::Restart { .. } => "restart",
        }
    }

    pub fn done(&self) -> &'static str {
        match self {
            Change::Hold => "held",
            Change::Release => "released",
            Change::Pause => "paused",
            Change::Resume => "resumed",
            Change::Update(_) => "updated",
            Change::Restart { .. } => "restarted",
        }
    }
}
