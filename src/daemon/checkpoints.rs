//! A running job's timed steps: its checkpoint signal `checkpoint_lead`
//! before its timeout, and the stop that comes `checkpoint_lead` after
//! the signal of a stop that ptraind makes (a user's `ptrain stop`, an
//! idle timeout, a preemption). Pure: [`next_step`] and [`plan_stop`]
//! read and write records; [`Timers`] is the set the state task arms one
//! `sleep_until` for, so nothing polls.
//!
//! Both moments live in the record (`checkpoint_sent_at`, `stop_at`), so
//! a ptraind killed in between does the rest when it comes back: a signal
//! that fell due meanwhile is sent then, and a stop whose moment passed is
//! made at once. The signal is sent at most once per attempt: it is
//! recorded before it goes out, so a kill -9 in that instant loses it
//! rather than sending it twice (a script that saved twice would lose
//! nothing, but one killed by a second SIGUSR1 would).

use std::collections::{BTreeSet, HashMap};

use crate::spec::checkpoint::CheckpointSignal;
use crate::spec::JobId;
use crate::store::{JobRecord, JobState};

/// What falls due for a running job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Step {
    /// Send its checkpoint signal: its timeout is `checkpoint_lead` away.
    Signal,
    /// Stop it: the lead after the signal of ptraind's own stop is over.
    Stop,
}

/// The job's next timed step, and when (µs), from its record alone.
pub(super) fn next_step(record: &JobRecord) -> Option<(u64, Step)> {
    if record.state != JobState::Running {
        return None;
    }
    if let Some(at) = record.stop_at {
        return Some((at, Step::Stop));
    }
    let checkpoint = record.spec.checkpoint?;
    let timeout = record.spec.timeout?;
    if record.checkpoint_sent_at.is_some() {
        return None;
    }
    let started = record.started_at?;
    let at = started
        .saturating_add(timeout.as_micros() as u64)
        .saturating_sub(checkpoint.lead.as_micros() as u64);
    Some((at, Step::Signal))
}

/// How a stop that ptraind makes goes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum StopPlan {
    /// StopUnit now: the job asks for no checkpoint signal, has no process
    /// yet, or is already in its lead (a second stop does not wait).
    Now,
    /// Send `signal` now (none when this attempt got it already), and stop
    /// the job at `at`.
    Later {
        signal: Option<CheckpointSignal>,
        at: u64,
    },
}

/// Decides how ptraind's own stop of `record` goes at `now`, and writes
/// the moments it sets into the record (saved by the caller before
/// anything is sent, so a restart carries the stop on).
pub(super) fn plan_stop(record: &mut JobRecord, now: u64) -> StopPlan {
    let Some(checkpoint) = record.spec.checkpoint else {
        return StopPlan::Now;
    };
    if record.state != JobState::Running || record.stop_at.is_some() {
        return StopPlan::Now;
    }
    let lead = checkpoint.lead.as_micros() as u64;
    let plan = match record.checkpoint_sent_at {
        // Signalled for its timeout already, its lead still running: the
        // stop comes when that lead ends, with no second signal.
        Some(sent) if sent.saturating_add(lead) > now => StopPlan::Later {
            signal: None,
            at: sent.saturating_add(lead),
        },
        Some(_) => return StopPlan::Now,
        None => {
            record.checkpoint_sent_at = Some(now);
            StopPlan::Later {
                signal: Some(checkpoint.signal),
                at: now.saturating_add(lead),
            }
        }
    };
    if let StopPlan::Later { at, .. } = plan {
        record.stop_at = Some(at);
    }
    plan
}

/// What a stop changes in a record, kept to put back when the record
/// cannot be saved (memory says what disk says).
pub(super) struct StopMarks {
    stop_requested_by: Option<u32>,
    idle_timeout_hit: Option<u64>,
    checkpoint_sent_at: Option<u64>,
    stop_at: Option<u64>,
}

impl StopMarks {
    pub(super) fn of(record: &JobRecord) -> StopMarks {
        StopMarks {
            stop_requested_by: record.stop_requested_by,
            idle_timeout_hit: record.idle_timeout_hit,
            checkpoint_sent_at: record.checkpoint_sent_at,
            stop_at: record.stop_at,
        }
    }

    pub(super) fn put_back(self, record: &mut JobRecord) {
        record.stop_requested_by = self.stop_requested_by;
        record.idle_timeout_hit = self.idle_timeout_hit;
        record.checkpoint_sent_at = self.checkpoint_sent_at;
        record.stop_at = self.stop_at;
    }
}

/// The running jobs' next steps, earliest first.
#[derive(Default)]
pub(super) struct Timers {
    due: BTreeSet<(u64, JobId, Step)>,
    by_job: HashMap<JobId, (u64, Step)>,
}

impl Timers {
    /// Arms the record's next step in place of the one it had.
    pub(super) fn rearm(&mut self, record: &JobRecord) {
        self.remove(&record.id);
        if let Some((at, step)) = next_step(record) {
            self.arm(&record.id, at, step);
        }
    }

    /// Arms `step` for `id` at `at`, in place of what it had (a stop
    /// that systemd refused, asked again later).
    pub(super) fn arm(&mut self, id: &JobId, at: u64, step: Step) {
        self.remove(id);
        self.due.insert((at, id.clone(), step));
        self.by_job.insert(id.clone(), (at, step));
    }

    pub(super) fn remove(&mut self, id: &JobId) {
        if let Some((at, step)) = self.by_job.remove(id) {
            self.due.remove(&(at, id.clone(), step));
        }
    }

    pub(super) fn next_due(&self) -> Option<u64> {
        self.due.first().map(|(at, ..)| *at)
    }

    /// The steps due at `now`, taken out (the caller rearms each job once
    /// it has done the step).
    pub(super) fn take_due(&mut self, now: u64) -> Vec<(JobId, Step)> {
        let mut taken = Vec::new();
        while let Some((at, ..)) = self.due.first() {
            if *at > now {
                break;
            }
            let (_, id, step) = self.due.pop_first().expect("first exists");
            self.by_job.remove(&id);
            taken.push((id, step));
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_kit;

    const SECOND: u64 = 1_000_000;

    fn running(json: &str, started: u64) -> JobRecord {
        let mut record = test_kit::record(json, "cp", test_kit::owner(1000, "alice"), 1);
        record.state = JobState::Running;
        record.started_at = Some(started);
        record
    }

    const CHECKPOINTED: &str = r#"{"version":1,"command":["train"],"timeout":"1h","checkpoint_signal":"SIGUSR1","checkpoint_lead":"5m"}"#;

    #[test]
    fn the_signal_falls_due_its_lead_before_the_timeout_and_only_once() {
        let mut record = running(CHECKPOINTED, 1_000 * SECOND);
        assert_eq!(
            next_step(&record),
            Some(((1_000 + 3_600 - 300) * SECOND, Step::Signal))
        );
        record.checkpoint_sent_at = Some(4_300 * SECOND);
        assert_eq!(next_step(&record), None);
        // No timeout, no signal of its own; queued jobs have no steps.
        let plain = running(
            r#"{"version":1,"command":["train"],"checkpoint_signal":"SIGUSR1"}"#,
            0,
        );
        assert_eq!(next_step(&plain), None);
        let mut queued = running(CHECKPOINTED, 0);
        queued.state = JobState::Queued;
        assert_eq!(next_step(&queued), None);
    }

    #[test]
    fn a_stop_signals_first_then_stops_after_the_lead_and_a_second_stop_is_at_once() {
        let mut record = running(CHECKPOINTED, 0);
        let now = 100 * SECOND;
        assert_eq!(
            plan_stop(&mut record, now),
            StopPlan::Later {
                signal: Some(CheckpointSignal::Usr1),
                at: now + 300 * SECOND
            }
        );
        assert_eq!(record.checkpoint_sent_at, Some(now));
        assert_eq!(next_step(&record), Some((now + 300 * SECOND, Step::Stop)));
        assert_eq!(plan_stop(&mut record, now + SECOND), StopPlan::Now);
    }

    #[test]
    fn a_stop_inside_the_timeouts_lead_waits_for_that_lead_without_a_second_signal() {
        let mut record = running(CHECKPOINTED, 0);
        record.checkpoint_sent_at = Some(3_300 * SECOND);
        assert_eq!(
            plan_stop(&mut record, 3_400 * SECOND),
            StopPlan::Later {
                signal: None,
                at: 3_600 * SECOND
            }
        );
        // Its lead over, a stop is at once.
        let mut late = running(CHECKPOINTED, 0);
        late.checkpoint_sent_at = Some(3_300 * SECOND);
        assert_eq!(plan_stop(&mut late, 3_700 * SECOND), StopPlan::Now);
    }

    #[test]
    fn jobs_without_a_signal_or_not_yet_running_stop_at_once() {
        let mut plain = running(r#"{"version":1,"command":["train"]}"#, 0);
        assert_eq!(plan_stop(&mut plain, SECOND), StopPlan::Now);
        assert_eq!(plain.stop_at, None);
        let mut launching = running(CHECKPOINTED, 0);
        launching.state = JobState::Launching;
        assert_eq!(plan_stop(&mut launching, SECOND), StopPlan::Now);
        assert_eq!(launching.checkpoint_sent_at, None);
    }

    #[test]
    fn timers_fire_in_order_and_rearm_in_place() {
        let mut timers = Timers::default();
        let mut a = running(CHECKPOINTED, 0);
        a.id = JobId::parse("a").unwrap();
        let mut b = running(CHECKPOINTED, 10 * SECOND);
        b.id = JobId::parse("b").unwrap();
        assert_eq!(next_step(&b), Some((3_310 * SECOND, Step::Signal)));
        timers.rearm(&b);
        timers.rearm(&a);
        assert_eq!(timers.next_due(), Some(3_300 * SECOND));
        // a is stopped: its step becomes the stop, in place of the signal.
        plan_stop(&mut a, 50 * SECOND);
        timers.rearm(&a);
        assert_eq!(timers.next_due(), Some(350 * SECOND));
        assert!(timers.take_due(349 * SECOND).is_empty());
        assert_eq!(
            timers.take_due(3_400 * SECOND),
            vec![(a.id.clone(), Step::Stop), (b.id.clone(), Step::Signal)]
        );
        assert_eq!(timers.next_due(), None);
        timers.rearm(&b);
        timers.remove(&b.id);
        assert_eq!(timers.next_due(), None);
    }
}
