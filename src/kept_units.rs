//! Ended job units that stay loaded in systemd for a while, so that
//! `systemctl status ptrain-job@ID` still shows the result, the exit
//! status and the journal tail of a recent job (Slurm's `MinJobAge` is the
//! anchor). ptraind holds a reference on each (`AddRef`); this room decides
//! when to drop it: oldest first, once a unit is older than `[jobs]
//! keep_ended_units` or more than `[jobs] max_kept_units` are kept.
//!
//! Pure: it takes `now` and answers which units to release; the daemon
//! does the D-Bus calls.
//!
//! A reference belongs to ptraind's bus connection, so when ptraind
//! restarts systemd collects the units it kept. Nothing is lost with them:
//! the job's record, `ptrain status` and `ptrain logs` keep the end.

use std::collections::VecDeque;
use std::time::Duration;

/// `[jobs] keep_ended_units` by default: Slurm's `MinJobAge`.
pub const DEFAULT_KEEP: Duration = Duration::from_secs(300);
/// `[jobs] max_kept_units` by default and at most. Each reference costs
/// systemd a match rule on its bus connection, and dbus-daemon cuts a
/// connection past 512 (see the daemon's `MAX_TRACKED_UNITS`): kept units
/// only use the references that running jobs leave free.
pub const DEFAULT_MAX_KEPT: usize = 128;
pub const MAX_KEPT: usize = 256;
/// Releases due within this much of each other go together, so a burst of
/// ends wakes ptraind once when their time comes, not once per job.
const COALESCE: Duration = Duration::from_secs(1);

/// How long and how many ended units are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeepPolicy {
    pub keep: Duration,
    pub max_kept: usize,
}

impl Default for KeepPolicy {
    fn default() -> Self {
        KeepPolicy {
            keep: DEFAULT_KEEP,
            max_kept: DEFAULT_MAX_KEPT,
        }
    }
}

impl KeepPolicy {
    /// Whether ended units are kept at all (`keep_ended_units = "0s"` or
    /// `max_kept_units = 0` release each unit as soon as its end is
    /// recorded).
    pub fn keeps(&self) -> bool {
        !self.keep.is_zero() && self.max_kept > 0
    }
}

/// The kept units, oldest first. Ends are recorded in the order they
/// happen, so pushing at the back keeps the queue sorted by end time.
#[derive(Debug, Default)]
pub struct KeptUnits {
    policy: KeepPolicy,
    /// (release due at, microseconds since the epoch; unit name)
    units: VecDeque<(u64, String)>,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl KeptUnits {
    pub fn new(policy: KeepPolicy) -> KeptUnits {
        KeptUnits {
            policy,
            units: VecDeque::new(),
        }
    }

    /// Keeps `unit`, which ended at `ended_at` (µs). Returns the units to
    /// release now: this one when nothing is kept, else the oldest beyond
    /// the count or the `room` left (see [`KeptUnits::due`]).
    #[must_use]
    pub fn keep(&mut self, unit: String, ended_at: u64, now: u64, room: usize) -> Vec<String> {
        if !self.policy.keeps() {
            return vec![unit];
        }
        let due = ended_at.saturating_add(micros(self.policy.keep));
        // A clock step back must not put a unit before older ones.
        let due = self.units.back().map_or(due, |(last, _)| due.max(*last));
        self.units.push_back((due, unit));
        self.due(now, room)
    }

    /// The units whose time is up at `now`, or that exceed the count or
    /// the `room` (references the running jobs leave free), oldest first;
    /// they leave the queue.
    #[must_use]
    pub fn due(&mut self, now: u64, room: usize) -> Vec<String> {
        let mut released = Vec::new();
        let horizon = now.saturating_add(micros(COALESCE));
        let most = self.policy.max_kept.min(room);
        while let Some((due, _)) = self.units.front() {
            if self.units.len() <= most && *due > horizon {
                break;
            }
            let (_, unit) = self.units.pop_front().expect("front exists");
            released.push(unit);
        }
        released
    }

    /// When the oldest kept unit is due (µs), if any is kept.
    pub fn next_due(&self) -> Option<u64> {
        self.units.front().map(|(due, _)| *due)
    }

    /// Forgets `unit` if it is kept (its job's id was reused: a new unit
    /// of that name is about to start). Returns whether it was.
    pub fn forget(&mut self, unit: &str) -> bool {
        let before = self.units.len();
        self.units.retain(|(_, kept)| kept != unit);
        self.units.len() != before
    }

    pub fn len(&self) -> usize {
        self.units.len()
    }

    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    fn kept(keep_secs: u64, max_kept: usize) -> KeptUnits {
        KeptUnits::new(KeepPolicy {
            keep: Duration::from_secs(keep_secs),
            max_kept,
        })
    }

    #[test]
    fn a_unit_is_kept_for_its_time_then_released() {
        let mut units = kept(300, 10);
        assert!(units.keep("a".into(), 100 * S, 100 * S, 10).is_empty());
        assert_eq!(units.next_due(), Some(400 * S));
        assert!(units.due(398 * S, 10).is_empty());
        assert_eq!(units.due(400 * S, 10), vec!["a".to_string()]);
        assert!(units.is_empty());
        assert_eq!(units.next_due(), None);
    }

    #[test]
    fn beyond_the_count_the_oldest_go_first() {
        let mut units = kept(300, 2);
        assert!(units.keep("a".into(), 10 * S, 10 * S, 10).is_empty());
        assert!(units.keep("b".into(), 20 * S, 20 * S, 10).is_empty());
        assert_eq!(
            units.keep("c".into(), 30 * S, 30 * S, 10),
            vec!["a".to_string()]
        );
        assert_eq!(units.len(), 2);
        assert_eq!(units.next_due(), Some(320 * S));
    }

    #[test]
    fn ends_close_together_are_released_together() {
        let mut units = kept(300, 10);
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            let at = 10 * S + i as u64 * 300_000;
            let _ = units.keep((*name).into(), at, at, 10);
        }
        assert_eq!(units.due(310 * S, 10).len(), 3, "one wake-up for the three");
    }

    #[test]
    fn keeping_nothing_releases_at_once() {
        for mut units in [kept(0, 10), kept(300, 0)] {
            assert_eq!(units.keep("a".into(), S, S, 10), vec!["a".to_string()]);
            assert!(units.is_empty());
        }
    }

    #[test]
    fn a_clock_step_back_keeps_the_order() {
        let mut units = kept(300, 10);
        let _ = units.keep("late".into(), 500 * S, 500 * S, 10);
        let _ = units.keep("stepped".into(), 100 * S, 100 * S, 10);
        assert!(
            units.due(700 * S, 10).is_empty(),
            "nothing is due before the first"
        );
        assert_eq!(units.due(800 * S, 10), vec!["late", "stepped"]);
    }

    #[test]
    fn running_jobs_take_the_references_first() {
        let mut units = kept(300, 10);
        for name in ["a", "b", "c"] {
            assert!(units.keep(name.into(), S, S, 10).is_empty());
        }
        assert_eq!(units.due(2 * S, 1), vec!["a", "b"], "one reference left");
        assert_eq!(units.due(2 * S, 0), vec!["c"]);
    }

    #[test]
    fn a_reused_name_is_forgotten() {
        let mut units = kept(300, 10);
        let _ = units.keep("a".into(), S, S, 10);
        let _ = units.keep("b".into(), S, S, 10);
        assert!(units.forget("a"));
        assert!(!units.forget("a"));
        assert_eq!(units.len(), 1);
    }
}
