//! The state task's request protocol: what the D-Bus face (and the
//! metrics endpoint, and a log reader that fell behind) asks the daemon's
//! state task, the reply channel each request carries, and [`ApiError`].

use tokio::sync::oneshot;

use crate::gpu::GpuError;
use crate::notifications::{DeliveriesError, DeliveryView, RetryTarget};
use crate::store::{RejectRecord, StoreError};
use crate::systemd::SystemdError;
use crate::views::{GpusView, JobView};

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
    /// `ptrain stop`: the stop request could not be made durable.
    #[error("cannot record the stop request: {0}")]
    RecordStop(StoreError),
    /// `ptrain hold`, `release`: the job is no longer queued.
    #[error(
        "job {id} is not queued (status: {status}); only a queued job can be held or released"
    )]
    NotQueued { id: String, status: &'static str },
    /// `ptrain hold`, `release`: the change could not be made durable (for
    /// a sweep, the members before this one were changed).
    #[error("cannot record that job {id} is {held_or_released}: {source}; it stays as it was, try again once the state directory accepts writes")]
    RecordHold {
        id: String,
        held_or_released: &'static str,
        source: StoreError,
    },
    /// `ptrain stop`: systemd refused to stop the job's unit.
    #[error("{0}")]
    StopUnit(SystemdError),
    #[error("only root may {0}; run it with sudo")]
    RootOnly(&'static str),
}

/// A request from the API to the daemon's state task.
pub enum ApiRequest {
    List(oneshot::Sender<Vec<JobView>>),
    /// Queued and running jobs plus the `limit` most recently ended.
    ListRecent(u32, oneshot::Sender<Vec<JobView>>),
    Stop {
        id: String,
        caller_uid: u32,
        reply: oneshot::Sender<Result<String, ApiError>>,
    },
    /// Holds (`hold: true`) or releases a queued job, or a sweep's.
    Hold {
        id: String,
        hold: bool,
        caller_uid: u32,
        reply: oneshot::Sender<Result<String, ApiError>>,
    },
    Rejected {
        caller_uid: u32,
        reply: oneshot::Sender<Result<Vec<RejectRecord>, ApiError>>,
    },
    Gpus(oneshot::Sender<Result<GpusView, ApiError>>),
    /// Notification deliveries (root only; checked by the API).
    Notifications(oneshot::Sender<Result<Vec<DeliveryView>, DeliveriesError>>),
    RetryNotifications(
        RetryTarget,
        oneshot::Sender<Result<String, DeliveriesError>>,
    ),
}
