//! What callers read without waiting for the state task: the view of each
//! job that has not ended, as the state task last posted it, and the
//! ended ones ([`Board::ended`]: the newest summarised in memory,
//! [`Recent`], which the state task keeps here rather than beside it; the
//! rest read from their records). `ptrain status` (`Status` on the bus) and
//! a log follower's look at its job are answered from it, so that a burst
//! of 10,000 jobs, whose every claim, launch and end costs the state task
//! fsyncs, does not make another user wait for them (`make bench`,
//! `responsive.api`).
//!
//! The state task posts a job's view at each change of its record (with
//! its JobChanged signal, after: a caller who saw the signal reads the
//! change) and when what a queued job waits for changes (a plan, its
//! parents, its sweep's `max_parallel`); it takes the view down when the
//! job's end is in the history. Locks are held for map operations only;
//! an ended job's full record is read from disk outside them.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::gpu::GpuInventory;
use crate::history::{End, EndedJob, Recent};
use crate::requests::ApiError;
use crate::spec::JobId;
use crate::store::{JobState, Store, StoreError};
use crate::views::JobView;

/// What a queued job's detail was made of when posted: what it waits for
/// and the ids it waits on (None: nothing beyond its state).
pub type QueuedDetail = Option<(String, Vec<String>)>;

struct Posted {
    view: Arc<JobView>,
    queued: QueuedDetail,
}

#[derive(Default)]
struct Shelf {
    posted: HashMap<JobId, Posted>,
    recent: Recent,
}

pub struct Board {
    shelf: RwLock<Shelf>,
    store: Arc<Store>,
    inventory: Arc<dyn GpuInventory>,
}

/// The newest ends' summaries, for the state task to change.
pub struct RecentWrite<'a>(RwLockWriteGuard<'a, Shelf>);

impl std::ops::Deref for RecentWrite<'_> {
    type Target = Recent;
    fn deref(&self) -> &Recent {
        &self.0.recent
    }
}

impl std::ops::DerefMut for RecentWrite<'_> {
    fn deref_mut(&mut self) -> &mut Recent {
        &mut self.0.recent
    }
}

impl Board {
    pub fn new(store: Arc<Store>, inventory: Arc<dyn GpuInventory>) -> Board {
        Board {
            shelf: RwLock::default(),
            store,
            inventory,
        }
    }

    // A panic while a lock was held left whole maps: every change here is
    // one map operation.
    fn read(&self) -> RwLockReadGuard<'_, Shelf> {
        self.shelf.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Shelf> {
        self.shelf.write().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn recent_mut(&self) -> RecentWrite<'_> {
        RecentWrite(self.write())
    }

    /// An ended job's summary: from memory if it ended recently, else
    /// from its record on disk (read outside the lock). None if the job
    /// has not ended, or is not known (never claimed, or compacted).
    pub fn ended(&self, id: &JobId) -> Option<EndedJob> {
        if let Some(job) = self.read().recent.get(id) {
            return Some(job.clone());
        }
        self.ended_record(id)
            .and_then(|record| EndedJob::of_ended(&record))
    }

    /// A job's record from disk; a read that fails other than by absence
    /// is logged.
    fn ended_record(&self, id: &JobId) -> Option<crate::store::JobRecord> {
        match self.store.load(id) {
            Ok(record) => Some(record),
            Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                None
            }
            Err(e) => {
                tracing::warn!(job = %id, PTRAIN_JOB = %id, error = %e, "cannot read a finished job's record");
                None
            }
        }
    }

    /// The views of the ends `ends` names, the newest first as given: the
    /// first `whole` as `ptrain status` shows them, the rest summarised.
    /// A stale end (restarted or compacted since) is left out. Read from
    /// memory where the end is recent, else from disk: called off the
    /// state task.
    pub fn ended_views(&self, ends: &[End], whole: usize) -> Vec<JobView> {
        let mut views = Vec::with_capacity(ends.len());
        for (newer, end) in ends.iter().enumerate() {
            let summary = match self.read().recent.get(&end.id) {
                Some(job) if job.ended_at == end.ended_at => Some(job.view()),
                _ => None,
            };
            let view = match (summary, newer < whole) {
                (Some(view), false) => Some(view),
                _ => self
                    .ended_record(&end.id)
                    .filter(|record| end.is_of(record))
                    .map(|record| match newer < whole {
                        true => JobView::of(&record),
                        false => {
                            EndedJob::of(&record, Arc::from(record.owner.name.as_str())).view()
                        }
                    }),
            };
            views.extend(view);
        }
        views
    }

    /// A live job's view now, with what its queued detail was made of.
    pub fn post(&self, id: &JobId, view: JobView, queued: QueuedDetail) {
        let posted = Posted {
            view: Arc::new(view),
            queued,
        };
        self.write().posted.insert(id.clone(), posted);
    }

    /// Whether the queued detail posted for `id` differs from `queued`
    /// (true when nothing is posted).
    pub fn queued_detail_differs(&self, id: &JobId, queued: &QueuedDetail) -> bool {
        self.read()
            .posted
            .get(id)
            .is_none_or(|p| p.queued != *queued)
    }

    /// The job ended (its summary is in the history) or is gone.
    pub fn take_down(&self, id: &JobId) {
        self.write().posted.remove(id);
    }

    /// `ptrain status ID`: a live job's posted view, or an ended job's
    /// full record read from disk (its summary if that fails), with the
    /// GPU warning the inventory holds for it.
    pub async fn status(&self, id: &str) -> Result<JobView, ApiError> {
        let not_found = || ApiError::NotFound(id.to_owned());
        let job_id = JobId::parse(id).map_err(|_| not_found())?;
        let live = self.read().posted.get(&job_id).map(|p| p.view.clone());
        let gpu_warning = self.inventory.job_warning(id);
        if let Some(view) = live {
            return Ok(JobView {
                gpu_warning,
                ..(*view).clone()
            });
        }
        // One small file, read here as the state task did: a thread of the
        // blocking pool would be started for it and end 10 s later (the
        // idle bench counts every thread's switches). Only an ended
        // record will do: a live one is posted (or was, a moment ago: the
        // caller asks again).
        let record = self
            .ended_record(&job_id)
            .filter(|r| r.state == JobState::Ended)
            .ok_or_else(not_found)?;
        Ok(JobView {
            source: Some(record.source.clone()),
            gpu_warning,
            ..JobView::of(&record)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{GpuError, GpuInfo};
    use crate::store::{test_kit, Outcome};

    /// No GPUs, and a warning for job "warned".
    struct Warns;

    impl GpuInventory for Warns {
        fn backend(&self) -> &'static str {
            "declared"
        }
        fn snapshot(&self) -> Result<Vec<GpuInfo>, GpuError> {
            Ok(Vec::new())
        }
        fn job_warning(&self, job: &str) -> Option<String> {
            (job == "warned").then(|| "GPU 0 left the pool".to_owned())
        }
    }

    fn board() -> (tempfile::TempDir, Arc<Store>, Board) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let board = Board::new(store.clone(), Arc::new(Warns));
        (dir, store, board)
    }

    fn record(id: &str, submitted_at: u64) -> crate::store::JobRecord {
        let json = r#"{"version": 1, "command": ["true"], "comment": "full"}"#;
        test_kit::record(json, id, test_kit::owner(1000, "alice"), submitted_at)
    }

    fn ended(mut r: crate::store::JobRecord) -> crate::store::JobRecord {
        r.state = JobState::Ended;
        r.ended_at = Some(r.submitted_at + 5);
        r.outcome = Some(Outcome::Succeeded);
        r
    }

    #[tokio::test]
    async fn a_live_job_is_answered_as_posted_with_its_gpu_warning() {
        let (_dir, _store, board) = board();
        let r = record("warned", 1);
        let view = JobView {
            detail: "waiting for 1 GPU".into(),
            ..JobView::of(&r)
        };
        board.post(&r.id, view, Some(("waiting for 1 GPU".into(), Vec::new())));
        let seen = board.status("warned").await.unwrap();
        assert_eq!(seen.detail, "waiting for 1 GPU");
        assert_eq!(seen.gpu_warning.as_deref(), Some("GPU 0 left the pool"));
        assert!(
            !board.queued_detail_differs(&r.id, &Some(("waiting for 1 GPU".into(), Vec::new())))
        );
        assert!(board.queued_detail_differs(&r.id, &None));
        assert!(matches!(
            board.status("nobody").await,
            Err(ApiError::NotFound(_))
        ));
        assert!(matches!(
            board.status("../x").await,
            Err(ApiError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn an_ended_job_is_read_whole_from_its_own_record_only() {
        let (_dir, store, board) = board();
        let r = ended(record("done", 10));
        store.claim(&r, b"{}").unwrap();
        store.save(&r).unwrap();
        board.post(&r.id, JobView::of(&r), None);
        board.recent_mut().insert(&r);
        board.take_down(&r.id);
        let seen = board.status("done").await.unwrap();
        assert_eq!(seen.status, "succeeded");
        assert_eq!(seen.comment.as_deref(), Some("full"), "not read whole");
        assert_eq!(seen.source, Some(r.source.clone()));
        assert_eq!(board.ended(&r.id).unwrap().ended_at, 15);
        // Out of memory's recent ends: read from disk, the same.
        board.recent_mut().remove(&r.id);
        assert_eq!(board.ended(&r.id), EndedJob::of_ended(&r));
        let end = End {
            ended_at: 15,
            id: r.id.clone(),
        };
        let views = board.ended_views(std::slice::from_ref(&end), 0);
        assert_eq!((views.len(), views[0].summary), (1, true));
        let views = board.ended_views(std::slice::from_ref(&end), 1);
        assert_eq!(views[0].comment.as_deref(), Some("full"));
        // Compacted and claimed again under its id, not yet posted: the
        // new job's record is not an end, and the old end is stale.
        let again = record("done", 99);
        store.save(&again).unwrap();
        assert!(matches!(
            board.status("done").await,
            Err(ApiError::NotFound(_))
        ));
        assert_eq!(board.ended(&r.id), None);
        assert!(board.ended_views(&[end], 0).is_empty());
    }
}
