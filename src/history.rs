//! Finished jobs in memory: one compact summary each.
//!
//! A host keeps tens of thousands of finished jobs (until `[retention]`
//! compacts them), and all ptraind needs of them in memory is what a
//! listing shows, what a dependent asks (did it succeed? whose is it?) and
//! what recognises a spool file claimed before a crash. The full record
//! stays on disk (`STATE/jobs/ID.json`) for `ptrain status`. A
//! summary is a few hundred bytes against a full record's ~2 KiB, which is
//! what keeps an idle ptraind small with a long history.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::chain::Dependencies;
use crate::spec::JobId;
use crate::store::{JobRecord, Outcome, SpoolSource};
use crate::views::JobView;

/// What memory keeps of a finished job.
#[derive(Clone, Debug, PartialEq)]
pub struct EndedJob {
    pub id: JobId,
    pub owner_uid: u32,
    /// Shared by every job of the same owner.
    pub owner_name: Arc<str>,
    pub submitted_at: u64,
    pub started_at: Option<u64>,
    pub ended_at: u64,
    /// None only for records written without one (they read as `ended`).
    pub outcome: Option<Outcome>,
    pub group: Option<JobId>,
    /// Boxed: most jobs have no parameters and no dependencies.
    pub params: Option<Box<std::collections::BTreeMap<String, String>>>,
    pub after: Option<Box<Dependencies>>,
    pub gpus: Box<[u32]>,
    pub priority: i32,
    /// Whether it wrote a result file: dependents then read it from disk.
    pub has_result: bool,
    pub source: SpoolSource,
}

impl EndedJob {
    pub fn status(&self) -> &'static str {
        self.outcome.as_ref().map_or("ended", Outcome::status)
    }

    pub fn succeeded(&self) -> bool {
        matches!(self.outcome, Some(Outcome::Succeeded))
    }

    /// What `ptrain list` shows; `ptrain status ID` reads the full record.
    pub fn view(&self) -> JobView {
        let (exit_code, signal, detail) =
            crate::views::outcome_fields(self.outcome.as_ref(), self.status());
        let after = self.after.as_deref().cloned().unwrap_or_default();
        let ids = |v: &[JobId]| v.iter().map(|i| i.to_string()).collect();
        JobView {
            id: self.id.to_string(),
            // On disk with the rest (`summary`): listings show the newest
            // ends whole, `ptrain status` any.
            name: None,
            comment: None,
            status: self.status().to_string(),
            owner: self.owner_name.to_string(),
            uid: self.owner_uid,
            unit: self.id.unit_name(),
            command: Vec::new(),
            workdir: None,
            gpus: self.gpus.to_vec(),
            gpu_uuids: Vec::new(),
            submitted_at: self.submitted_at,
            begin_at: None,
            attempt: 1,
            attempts: Vec::new(),
            paused: false,
            checkpoint_sent_at: None,
            stop_at: None,
            started_at: self.started_at,
            ended_at: Some(self.ended_at),
            exit_code,
            signal,
            outcome: self.outcome.clone(),
            detail,
            invocation_id: None,
            systemd_result: None,
            timeout_secs: None,
            group: self.group.as_ref().map(|g| g.to_string()),
            params: self.params.as_deref().cloned().unwrap_or_default(),
            after_ok: ids(&after.after_ok),
            after_fail: ids(&after.after_fail),
            after_any: ids(&after.after_any),
            waiting_for: Vec::new(),
            result: None,
            result_error: None,
            resources: String::new(),
            private: false,
            priority: self.priority,
            gpu_request: String::new(),
            source: None,
            gpu_warning: None,
            summary: true,
            usage: None,
        }
    }
}

/// Every finished job still in history, by id and by end time.
#[derive(Default)]
pub struct History {
    /// Boxed: the table keeps a power of two of slots, up to half of
    /// them empty after a load, and an empty slot then costs a pointer,
    /// not a whole summary.
    jobs: HashMap<JobId, Box<EndedJob>>,
    /// (ended_at, id): the oldest first, for retention; the newest last,
    /// for `ListRecent`.
    order: BTreeSet<(u64, JobId)>,
    owner_names: HashMap<u32, Arc<str>>,
}

impl History {
    /// Keeps the summary of an ended job's record (the record itself is
    /// on disk).
    pub fn insert(&mut self, record: &JobRecord) {
        let owner_name = self
            .owner_names
            .entry(record.owner.uid)
            .and_modify(|name| {
                if **name != *record.owner.name {
                    *name = Arc::from(record.owner.name.as_str());
                }
            })
            .or_insert_with(|| Arc::from(record.owner.name.as_str()))
            .clone();
        let ended_at = record.ended_at.unwrap_or(0);
        let mut source = record.source.clone();
        source.file.shrink_to_fit();
        let job = EndedJob {
            id: record.id.clone(),
            owner_uid: record.owner.uid,
            owner_name,
            submitted_at: record.submitted_at,
            started_at: record.started_at,
            ended_at,
            outcome: record.outcome.clone(),
            group: record.group.clone(),
            params: (!record.params.is_empty()).then(|| Box::new(record.params.clone())),
            after: (!record.spec.after.is_empty()).then(|| Box::new(record.spec.after.clone())),
            gpus: record.gpus.iter().map(|g| g.index).collect(),
            priority: record.spec.priority,
            has_result: record.result.is_some(),
            source,
        };
        if let Some(old) = self.jobs.insert(record.id.clone(), Box::new(job)) {
            self.order.remove(&(old.ended_at, old.id));
        }
        self.order.insert((ended_at, record.id.clone()));
    }

    pub fn get(&self, id: &JobId) -> Option<&EndedJob> {
        self.jobs.get(id).map(|job| &**job)
    }

    pub fn contains(&self, id: &JobId) -> bool {
        self.jobs.contains_key(id)
    }

    pub fn remove(&mut self, id: &JobId) -> Option<EndedJob> {
        let job = self.jobs.remove(id)?;
        self.order.remove(&(job.ended_at, job.id.clone()));
        Some(*job)
    }

    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The job that ended first.
    pub fn oldest(&self) -> Option<&EndedJob> {
        let (_, id) = self.order.first()?;
        self.get(id)
    }

    /// Up to `n` jobs, the most recently ended first.
    pub fn newest(&self, n: usize) -> impl Iterator<Item = &EndedJob> {
        self.order
            .iter()
            .rev()
            .take(n)
            .filter_map(|(_, id)| self.get(id))
    }

    /// Gives back what loading the history over-allocated.
    pub fn shrink_to_fit(&mut self) {
        self.jobs.shrink_to_fit();
        self.owner_names.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_kit;

    fn record(id: &str, owner: &str, uid: u32, ended_at: u64, outcome: Outcome) -> JobRecord {
        let json = format!(
            r#"{{"version": 1, "id": "{id}", "command": ["true"], "after_ok": ["p"], "priority": 3}}"#
        );
        let mut r = test_kit::record(&json, id, test_kit::owner(uid, owner), 10);
        r.state = crate::store::JobState::Ended;
        r.started_at = Some(11);
        r.ended_at = Some(ended_at);
        r.outcome = Some(outcome);
        r
    }

    #[test]
    fn a_summary_lists_like_the_full_record() {
        let mut r = record("a", "alice", 1000, 20, Outcome::Failed { exit_code: 3 });
        r.params.insert("lr".into(), "0.1".into());
        let mut history = History::default();
        history.insert(&r);
        let summary = history.get(&r.id).unwrap();
        let (full, brief) = (JobView::of(&r), summary.view());
        assert_eq!(
            (
                &brief.id,
                &brief.status,
                &brief.owner,
                brief.uid,
                &brief.unit
            ),
            (&full.id, &full.status, &full.owner, full.uid, &full.unit)
        );
        assert_eq!(
            (brief.exit_code, brief.signal, &brief.detail, &brief.outcome),
            (full.exit_code, full.signal, &full.detail, &full.outcome)
        );
        assert_eq!(
            (brief.submitted_at, brief.started_at, brief.ended_at),
            (full.submitted_at, full.started_at, full.ended_at)
        );
        assert_eq!(
            (&brief.after_ok, &brief.params, brief.priority),
            (&full.after_ok, &full.params, full.priority)
        );
        assert_eq!(summary.source, r.source);
        assert!(!summary.succeeded());
    }

    #[test]
    fn order_is_by_end_and_owner_names_are_shared() {
        let mut history = History::default();
        for (id, ended) in [("late", 30), ("early", 10), ("mid", 20)] {
            history.insert(&record(id, "alice", 1000, ended, Outcome::Succeeded));
        }
        assert_eq!(history.oldest().unwrap().id.as_str(), "early");
        let newest: Vec<&str> = history.newest(2).map(|j| j.id.as_str()).collect();
        assert_eq!(newest, ["late", "mid"]);
        let (a, b) = (
            history.get(&JobId::parse("late").unwrap()).unwrap(),
            history.get(&JobId::parse("mid").unwrap()).unwrap(),
        );
        assert!(Arc::ptr_eq(&a.owner_name, &b.owner_name));
        // Recorded again (a restart reloads it): still one entry.
        history.insert(&record("mid", "alice", 1000, 40, Outcome::Succeeded));
        assert_eq!(history.len(), 3);
        assert_eq!(history.newest(1).next().unwrap().id.as_str(), "mid");
        history.remove(&JobId::parse("early").unwrap());
        assert_eq!(history.oldest().unwrap().id.as_str(), "late");
        assert_eq!(history.len(), 2);
    }
}
