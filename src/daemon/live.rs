//! The jobs that have not ended, and the indices over them that must agree:
//!
//! - every id in `queue` is a queued record of `jobs`, and every queued
//!   record is in `queue`;
//! - every `(at, id)` in `begins` is a queued record whose `begin_at` is
//!   `at`: the begin timers not yet due ([`Live::take_due_begins`] drops
//!   those that are);
//! - `queued_per_user[uid]` counts the queued records of `uid`;
//! - `constrained` holds exactly the queued records that wait on other jobs,
//!   on their sweep's `max_parallel`, on a release or on a begin time
//!   ([`is_constrained`]);
//! - `held[gpu]` is a launching or running record that names `gpu`, and
//!   such a record holds each GPU it names.
//!
//! The state task changes them only through [`Live`]'s methods, one per
//! step of a job's life: [`Live::queue_job`] (accepted or restored
//! queued), [`Live::restore_active`] (launching or running at a restart),
//! [`Live::launched`] (its launch is recorded), [`Live::requeued`] (its
//! next attempt is recorded), [`Live::ended`], and
//! [`Live::set_held`] (held or released while queued). A record's
//! other fields change in place ([`Live::get_mut`]); its state moves only
//! from launching to running there. [`Live::check`] states the rules, for
//! the tests. Pure: no I/O.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::scheduler::Queue;
use crate::spec::JobId;
use crate::store::{JobRecord, JobState};

/// Whether a queued job waits on something besides GPUs: other jobs
/// (`after`), its sweep's `max_parallel`, a release (held), its image
/// (pulling), or a begin
/// time (kept after it passed: one comparison per plan).
pub(super) fn is_constrained(record: &JobRecord) -> bool {
    record.held
        || (record.spec.image.is_some() && record.image.is_none())
        || record.begin_at.is_some()
        || !record.spec.after.is_empty()
        || (record.group.is_some() && record.max_parallel.is_some())
}

#[derive(Default)]
pub(super) struct Live {
    /// Queued, launching and running jobs: their full records.
    jobs: BTreeMap<JobId, JobRecord>,
    /// Queued jobs in planning order (priority, then arrival).
    queue: Queue,
    queued_per_user: HashMap<u32, usize>,
    /// Queued jobs that wait on others (`after`) or on their sweep's
    /// `max_parallel`: the only ones dependency resolution looks at, so it
    /// costs nothing per queued job that waits on nothing.
    constrained: HashSet<JobId>,
    /// GPU index → the job holding it.
    held: BTreeMap<u32, JobId>,
    /// Queued jobs' begin times not yet due, earliest first: the one
    /// timer the state task arms.
    begins: BTreeSet<(u64, JobId)>,
}

impl std::ops::Index<&JobId> for Live {
    type Output = JobRecord;

    fn index(&self, id: &JobId) -> &JobRecord {
        &self.jobs[id]
    }
}

impl Live {
    pub(super) fn get(&self, id: &JobId) -> Option<&JobRecord> {
        self.jobs.get(id)
    }

    /// For the fields a step changes in place (start times, a stop
    /// request, an idle stop, notifications). The state may go from
    /// launching to running here; into or out of the queue, and to the
    /// end, only through the methods below.
    pub(super) fn get_mut(&mut self, id: &JobId) -> Option<&mut JobRecord> {
        self.jobs.get_mut(id)
    }

    pub(super) fn contains(&self, id: &JobId) -> bool {
        self.jobs.contains_key(id)
    }

    pub(super) fn records(&self) -> impl Iterator<Item = &JobRecord> {
        self.jobs.values()
    }

    pub(super) fn len(&self) -> usize {
        self.jobs.len()
    }

    pub(super) fn queue(&self) -> &Queue {
        &self.queue
    }

    pub(super) fn held(&self) -> &BTreeMap<u32, JobId> {
        &self.held
    }

    pub(super) fn constrained(&self) -> &HashSet<JobId> {
        &self.constrained
    }

    pub(super) fn queued_of(&self, uid: u32) -> usize {
        self.queued_per_user.get(&uid).copied().unwrap_or(0)
    }

    /// The earliest begin time (µs since the epoch) not yet due.
    pub(super) fn next_begin(&self) -> Option<u64> {
        self.begins.first().map(|(at, _)| *at)
    }

    /// Drops the begin times due by `now`: whether any was (a plan then
    /// sees those jobs free to start).
    pub(super) fn take_due_begins(&mut self, now: u64) -> bool {
        let mut any = false;
        while self.begins.first().is_some_and(|(at, _)| *at <= now) {
            self.begins.pop_first();
            any = true;
        }
        any
    }

    /// A queued job: accepted now, or restored at a start.
    pub(super) fn queue_job(&mut self, record: JobRecord) {
        debug_assert_eq!(record.state, JobState::Queued);
        if is_constrained(&record) {
            self.constrained.insert(record.id.clone());
        }
        if let Some(at) = record.begin_at {
            self.begins.insert((at, record.id.clone()));
        }
        self.queue.push(
            record.id.clone(),
            record.spec.priority,
            record.spec.gpus.count() > 0,
            record.submitted_at,
            (record.owner.uid, record.owner.gid),
        );
        *self.queued_per_user.entry(record.owner.uid).or_default() += 1;
        self.jobs.insert(record.id.clone(), record);
    }

    /// Holds or releases a queued job; false (and nothing changes) for a
    /// job that is not queued.
    pub(super) fn set_held(&mut self, id: &JobId, held: bool) -> bool {
        let Some(record) = self.jobs.get_mut(id) else {
            return false;
        };
        if record.state != JobState::Queued {
            return false;
        }
        record.held = held;
        if is_constrained(record) {
            self.constrained.insert(id.clone());
        } else {
            self.constrained.remove(id);
        }
        true
    }

    /// A queued job's record replaced by one with another priority or
    /// begin (`ptrain update`): its place in the queue follows the
    /// priority, its arrival kept; its begin timer is the new one. False
    /// (and nothing changes) unless both records are queued.
    pub(super) fn update_queued(&mut self, record: JobRecord) -> bool {
        let id = record.id.clone();
        let Some(old) = self.jobs.get(&id).filter(|r| r.state == JobState::Queued) else {
            return false;
        };
        if record.state != JobState::Queued {
            return false;
        }
        if let Some(at) = old.begin_at {
            self.begins.remove(&(at, id.clone()));
        }
        if let Some(at) = record.begin_at {
            self.begins.insert((at, id.clone()));
        }
        self.queue.reprioritize(&id, record.spec.priority);
        if is_constrained(&record) {
            self.constrained.insert(id.clone());
        } else {
            self.constrained.remove(&id);
        }
        self.jobs.insert(id, record);
        true
    }

    /// A launching or running job found at a start: it holds its GPUs.
    pub(super) fn restore_active(&mut self, record: JobRecord) {
        debug_assert_ne!(record.state, JobState::Queued);
        for gpu in &record.gpus {
            self.held.insert(gpu.index, record.id.clone());
        }
        self.jobs.insert(record.id.clone(), record);
    }

    /// A queued job's launch is recorded (its record says launching, on
    /// its GPUs): out of the queue, holding them.
    pub(super) fn launched(&mut self, id: &JobId) {
        let Some(record) = self.jobs.get(id) else {
            return;
        };
        debug_assert_eq!(record.state, JobState::Launching);
        let (uid, begin_at) = (record.owner.uid, record.begin_at);
        for gpu in &record.gpus {
            self.held.insert(gpu.index, id.clone());
        }
        self.dequeue(id, uid, begin_at);
    }

    /// A launching or running job's attempt ended and the next one is
    /// recorded queued ([`super::lifecycle::requeued`]): its GPUs are
    /// free, and it waits in the queue (for its begin) like a new job.
    pub(super) fn requeued(&mut self, record: JobRecord) {
        debug_assert_eq!(record.state, JobState::Queued);
        let id = record.id.clone();
        if self
            .jobs
            .get(&id)
            .is_some_and(|r| r.state == JobState::Queued)
        {
            return;
        }
        self.held.retain(|_, holder| *holder != id);
        self.jobs.remove(&id);
        self.queue_job(record);
    }

    /// A job's end is recorded: it leaves every index, its GPUs are free.
    pub(super) fn ended(&mut self, id: &JobId) -> Option<JobRecord> {
        let record = self.jobs.remove(id)?;
        if record.state == JobState::Queued {
            self.dequeue(id, record.owner.uid, record.begin_at);
        }
        self.held.retain(|_, holder| holder != id);
        Some(record)
    }

    fn dequeue(&mut self, id: &JobId, owner_uid: u32, begin_at: Option<u64>) {
        self.queue.remove(id);
        self.constrained.remove(id);
        if let Some(at) = begin_at {
            self.begins.remove(&(at, id.clone()));
        }
        if let Some(n) = self.queued_per_user.get_mut(&owner_uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.queued_per_user.remove(&owner_uid);
            }
        }
    }

    /// The rules in this module's doc; the first broken one, said.
    #[cfg(test)]
    pub(super) fn check(&self) -> Result<(), String> {
        let queued: Vec<&JobRecord> = self
            .jobs
            .values()
            .filter(|r| r.state == JobState::Queued)
            .collect();
        if self.queue.len() != queued.len() {
            return Err(format!(
                "{} queued records, {} in the queue",
                queued.len(),
                self.queue.len()
            ));
        }
        for r in &queued {
            if self.queue.position(&r.id).is_none() {
                return Err(format!("{} is queued but not in the queue", r.id));
            }
            if is_constrained(r) != self.constrained.contains(&r.id) {
                return Err(format!("{} is misfiled as constrained or not", r.id));
            }
        }
        if self.constrained.len() > queued.len() {
            return Err("a job is constrained but not queued".into());
        }
        for (at, id) in &self.begins {
            let r = self.jobs.get(id).filter(|r| r.state == JobState::Queued);
            if r.and_then(|r| r.begin_at) != Some(*at) {
                return Err(format!("{id}'s begin timer is not its queued record's"));
            }
        }
        let mut per_user: HashMap<u32, usize> = HashMap::new();
        for r in &queued {
            *per_user.entry(r.owner.uid).or_default() += 1;
        }
        if per_user != self.queued_per_user {
            return Err(format!(
                "queued per user {:?}, counted {:?}",
                per_user, self.queued_per_user
            ));
        }
        let mut holds = BTreeMap::new();
        for r in self.jobs.values().filter(|r| r.state != JobState::Queued) {
            for gpu in &r.gpus {
                holds.insert(gpu.index, r.id.clone());
            }
        }
        if holds != self.held {
            return Err(format!("held {:?}, records say {:?}", self.held, holds));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{test_kit, AssignedGpu};

    fn queued(json: &str, id: &str, uid: u32) -> JobRecord {
        test_kit::record(json, id, test_kit::owner(uid, &format!("u{uid}")), 1)
    }

    const PLAIN: &str = r#"{"version": 1, "command": ["true"]}"#;
    const GPU: &str = r#"{"version": 1, "command": ["true"], "gpus": 1}"#;

    /// The record of `id` as its launch writes it: launching, on `gpus`.
    fn launching(live: &Live, id: &JobId, gpus: &[u32]) -> JobRecord {
        let mut record = live[id].clone();
        record.state = JobState::Launching;
        record.gpus = gpus
            .iter()
            .map(|&index| AssignedGpu {
                index,
                uuid: format!("GPU-{index}"),
                device: format!("/dev/nvidia{index}").into(),
            })
            .collect();
        record
    }

    #[test]
    fn a_job_from_the_queue_to_its_end_keeps_every_index_in_step() {
        let mut live = Live::default();
        let a = queued(GPU, "a", 1000);
        let b = queued(PLAIN, "b", 1000);
        let c = queued(
            r#"{"version": 1, "command": ["true"], "after_ok": ["a"]}"#,
            "c",
            1001,
        );
        let (ida, idb, idc) = (a.id.clone(), b.id.clone(), c.id.clone());
        for r in [a, b, c] {
            live.queue_job(r);
            live.check().unwrap();
        }
        assert_eq!(live.queued_of(1000), 2);
        assert_eq!(live.constrained().iter().collect::<Vec<_>>(), [&idc]);
        // a launches on GPU 3: out of the queue, holding it.
        *live.get_mut(&ida).unwrap() = launching(&live, &ida, &[3]);
        live.launched(&ida);
        live.check().unwrap();
        assert_eq!(live.queued_of(1000), 1);
        assert_eq!(live.held().get(&3), Some(&ida));
        // Running changes nothing the indices see.
        live.get_mut(&ida).unwrap().state = JobState::Running;
        live.check().unwrap();
        // a ends: GPU 3 is free; c (queued, constrained) ends unrun.
        assert_eq!(live.ended(&ida).map(|r| r.id), Some(ida.clone()));
        live.check().unwrap();
        assert!(live.held().is_empty());
        assert!(live.ended(&idc).is_some());
        live.check().unwrap();
        assert!(live.constrained().is_empty());
        assert_eq!(live.queued_of(1001), 0);
        assert!(live.ended(&idc).is_none(), "ended twice");
        assert_eq!(live.len(), 1);
        assert_eq!(live.queue().iter().collect::<Vec<_>>(), [&idb]);
    }

    #[test]
    fn a_restart_restores_holders_and_the_queue() {
        let mut live = Live::default();
        let mut running = queued(GPU, "r", 1000);
        running.state = JobState::Running;
        running.gpus = vec![AssignedGpu {
            index: 0,
            uuid: "GPU-0".into(),
            device: "/dev/nvidia0".into(),
        }];
        live.restore_active(running);
        live.queue_job(queued(GPU, "q", 1000));
        live.check().unwrap();
        assert_eq!(live.held().len(), 1);
        assert_eq!(live.queue().len(), 1);
        assert_eq!(live.queued_of(1000), 1);
    }

    #[test]
    fn holding_and_releasing_keep_the_constrained_set_in_step() {
        let mut live = Live::default();
        live.queue_job(queued(PLAIN, "a", 1000));
        live.queue_job(queued(
            r#"{"version": 1, "command": ["true"], "hold": true}"#,
            "h",
            1000,
        ));
        live.check().unwrap();
        let (a, h) = (JobId::parse("a").unwrap(), JobId::parse("h").unwrap());
        assert_eq!(live.constrained().iter().collect::<Vec<_>>(), [&h]);
        assert!(live.set_held(&a, true));
        live.check().unwrap();
        assert!(live.constrained().contains(&a));
        assert!(live.set_held(&h, false) && live.set_held(&a, false));
        live.check().unwrap();
        assert!(live.constrained().is_empty());
        // Only a queued job is held.
        *live.get_mut(&a).unwrap() = launching(&live, &a, &[]);
        live.launched(&a);
        assert!(!live.set_held(&a, true));
        assert!(!live.get(&a).unwrap().held);
        live.check().unwrap();
    }

    #[test]
    fn begin_timers_fire_in_order_and_leave_with_their_job() {
        let mut live = Live::default();
        let begins = |at: u64, id: &str| {
            let mut r = queued(PLAIN, id, 1000);
            r.begin_at = Some(at);
            r
        };
        live.queue_job(begins(300, "late"));
        live.queue_job(begins(100, "early"));
        live.queue_job(begins(200, "gone"));
        live.queue_job(queued(PLAIN, "plain", 1000));
        live.check().unwrap();
        assert_eq!(live.constrained().len(), 3);
        assert_eq!(live.next_begin(), Some(100));
        assert!(!live.take_due_begins(99));
        assert!(live.take_due_begins(100));
        assert_eq!(live.next_begin(), Some(200));
        // A job that leaves the queue takes its timer with it.
        let gone = JobId::parse("gone").unwrap();
        assert!(live.ended(&gone).is_some());
        live.check().unwrap();
        assert_eq!(live.next_begin(), Some(300));
        // Due ones stay constrained (planning compares the time).
        assert!(live.constrained().contains(&JobId::parse("early").unwrap()));
        let late = JobId::parse("late").unwrap();
        *live.get_mut(&late).unwrap() = launching(&live, &late, &[]);
        live.launched(&late);
        live.check().unwrap();
        assert_eq!(live.next_begin(), None);
    }

    #[test]
    fn an_update_moves_a_job_by_its_priority_keeping_its_arrival_and_its_timer() {
        let mut live = Live::default();
        for id in ["a", "b", "c"] {
            live.queue_job(queued(GPU, id, 1000));
        }
        let order =
            |live: &Live| -> Vec<String> { live.queue().iter().map(|id| id.to_string()).collect() };
        let c = JobId::parse("c").unwrap();
        let mut urgent = live[&c].clone();
        urgent.spec.priority = 10;
        urgent.begin_at = Some(500);
        assert!(live.update_queued(urgent));
        assert_eq!(order(&live), ["c", "a", "b"]);
        assert_eq!(live.next_begin(), Some(500));
        live.check().unwrap();
        // Back to 0, it stands behind a and b again (it came after them).
        let mut back = live[&c].clone();
        back.spec.priority = 0;
        back.begin_at = None;
        assert!(live.update_queued(back));
        assert_eq!(order(&live), ["a", "b", "c"]);
        assert_eq!(live.next_begin(), None);
        live.check().unwrap();
    }

    #[test]
    fn check_names_an_index_out_of_step() {
        let mut live = Live::default();
        live.queue_job(queued(PLAIN, "a", 1000));
        let id = JobId::parse("a").unwrap();
        // A state changed behind the methods' back is caught.
        live.get_mut(&id).unwrap().state = JobState::Running;
        let broken = live.check().unwrap_err();
        assert!(
            broken.contains("0 queued records, 1 in the queue"),
            "{broken}"
        );
    }
}
