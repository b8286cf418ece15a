//! Fair share (`[policy] fair_share = { half_life = "7d" }`, off by
//! default): among waiting jobs of equal priority, the jobs of owners who
//! used the GPUs least lately go first. Pure: the usage is handed in, the
//! factors come out; [`crate::scheduler::Queue::gpu_jobs_fair`] orders by them.
//!
//! # The rule (Slurm's classic fair-share formula, two levels)
//!
//! - **Usage** `u` of a user (and of a group) is GPU-seconds, each run's
//!   weighed by its age: a run that ended `t` ago counts
//!   `2^(-t / half_life)` of its GPU-seconds. A running job counts its
//!   GPU-seconds so far, undecayed. A job's group is its owner's primary
//!   group when it ran.
//! - **Normalized usage** `U = u / Σu` over every user (every group);
//!   with no usage at all, every factor is 1.
//! - **Shares** are equal: the account tree is root → groups → users, and
//!   the groups that count are those of users who have usage or a queued
//!   job. A group's normalized share is `S_g = 1 / groups`, a user's
//!   `S_u = S_g / users of that group`.
//! - **Effective usage** of a user mixes in the group's:
//!   `UE_u = U_u + (U_g − U_u) · S_u / S_g`, so a user of a group that
//!   used much gets less even if they used little (Slurm's
//!   `PriorityFlags` default, the "classic" algorithm).
//! - **Factor** `F = 2^(−UE_u / S_u)`: 1 for no usage, ½ for a user who
//!   used exactly their share, toward 0 beyond.
//!
//! Jobs of equal priority are then read highest factor first, and in
//! arrival order within one owner; ties between owners go to the one
//! whose first waiting job arrived earlier. Priority still comes first,
//! and reservations (rule 5 of [`crate::scheduler`]) still keep GPUs for
//! the first waiting job in this order, so no job starves: the factor of
//! an owner whose jobs run falls as they run, and that of one who waits
//! rises as the usage decays.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::setting::InvalidSetting;

/// The shortest and longest `half_life` ptraind accepts.
pub const MIN_HALF_LIFE: Duration = Duration::from_secs(60);
pub const MAX_HALF_LIFE: Duration = Duration::from_secs(365 * 24 * 3600);

/// Runs older than this many half-lives weigh less than 2^-30 of their
/// GPU-seconds: they are not read back at a start.
pub const HORIZON_HALF_LIVES: u32 = 30;

/// Usage under this many GPU-seconds is forgotten (it no longer orders
/// anyone), so the table holds only users of the last few weeks.
const NEGLIGIBLE: f64 = 1e-3;

/// `[policy] fair_share` as written.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FairShareConfig {
    /// "7d", "12h", or seconds as text.
    pub half_life: String,
}

impl FairShareConfig {
    /// The half-life, checked; the error names the key and the fix.
    pub fn half_life(&self) -> Result<Duration, InvalidSetting> {
        crate::setting::span(
            "policy.fair_share.half_life",
            &self.half_life,
            MIN_HALF_LIFE..=MAX_HALF_LIFE,
            "usage this long ago counts half",
        )
    }
}

/// How much a run's GPU-seconds count `age_us` microseconds later.
pub fn weight(age_us: u64, half_life: Duration) -> f64 {
    let half_life_us = half_life.as_micros().max(1) as f64;
    (-(age_us as f64) / half_life_us).exp2()
}

/// Decayed GPU-seconds per user (uid) and per group (gid) as of a moment.
/// Adding a run and reading it back cost the number of users and groups
/// with usage in the last weeks, never the length of the history.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// The moment the figures are decayed to (µs since the epoch).
    pub as_of: u64,
    pub users: BTreeMap<u32, UserUsage>,
    pub groups: BTreeMap<u32, f64>,
}

/// One user's decayed GPU-seconds, and the group of their latest run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UserUsage {
    pub gid: u32,
    pub gpu_seconds: f64,
}

impl Usage {
    pub fn new(as_of: u64) -> Usage {
        Usage {
            as_of,
            ..Usage::default()
        }
    }

    /// Decays every figure to `now` (a moment before `as_of` changes
    /// nothing), forgetting those that became negligible.
    pub fn decay_to(&mut self, now: u64, half_life: Duration) {
        if now <= self.as_of {
            return;
        }
        let w = weight(now - self.as_of, half_life);
        self.users.retain(|_, u| {
            u.gpu_seconds *= w;
            u.gpu_seconds >= NEGLIGIBLE
        });
        self.groups.retain(|_, u| {
            *u *= w;
            *u >= NEGLIGIBLE
        });
        self.as_of = now;
    }

    /// Adds a run of `uid` (group `gid`) that ended at `ended_us`.
    pub fn add(
        &mut self,
        uid: u32,
        gid: u32,
        gpu_seconds: f64,
        ended_us: u64,
        half_life: Duration,
    ) {
        if !gpu_seconds.is_finite() || gpu_seconds <= 0.0 {
            return;
        }
        // A run that ended after `as_of` (the clock, or a late answer)
        // moves the table forward to it.
        self.decay_to(ended_us, half_life);
        let u = gpu_seconds * weight(self.as_of.saturating_sub(ended_us), half_life);
        self.add_decayed(uid, gid, u);
        *self.groups.entry(gid).or_default() += u;
    }

    fn add_decayed(&mut self, uid: u32, gid: u32, u: f64) {
        let user = self.users.entry(uid).or_default();
        user.gid = gid;
        user.gpu_seconds += u;
    }

    /// Adds another table's figures (decayed to the later of the two).
    pub fn merge(&mut self, other: &Usage, half_life: Duration) {
        let mut other = other.clone();
        let now = self.as_of.max(other.as_of);
        self.decay_to(now, half_life);
        other.decay_to(now, half_life);
        for (uid, u) in other.users {
            // `other` is the newer table when it was read back later.
            self.add_decayed(uid, u.gid, u.gpu_seconds);
        }
        for (gid, u) in other.groups {
            *self.groups.entry(gid).or_default() += u;
        }
    }
}

/// A user in the fair-share computation: their primary group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Account {
    pub uid: u32,
    pub gid: u32,
}

/// A running job's GPU-seconds so far.
#[derive(Clone, Copy, Debug)]
pub struct Running {
    pub account: Account,
    pub gpu_seconds: f64,
}

/// One user's standing, for `ptrain report --fair-share` and the order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Standing {
    pub uid: u32,
    pub gid: u32,
    /// Decayed GPU-seconds, running jobs included.
    pub usage: f64,
    /// `U_u`, of everyone's usage.
    pub normalized_usage: f64,
    /// `S_u`.
    pub share: f64,
    /// `UE_u`.
    pub effective_usage: f64,
    /// `F`: higher goes first among equal priorities.
    pub factor: f64,
}

/// Each account's standing: `usage` (decayed to now), the running jobs,
/// and the accounts with a queued job (who count for the shares even
/// without usage). Accounts with usage but neither a queued nor a running
/// job are shown too; a user's group is their queued or running job's,
/// or that of their latest run.
pub fn standings(usage: &Usage, running: &[Running], queued: &[Account]) -> Vec<Standing> {
    let mut users: BTreeMap<u32, (u32, f64)> = BTreeMap::new();
    let mut groups: HashMap<u32, f64> = usage.groups.iter().map(|(g, u)| (*g, *u)).collect();
    for (uid, u) in &usage.users {
        users.insert(*uid, (u.gid, u.gpu_seconds));
    }
    for r in running {
        let e = users.entry(r.account.uid).or_insert((r.account.gid, 0.0));
        e.0 = r.account.gid;
        e.1 += r.gpu_seconds.max(0.0);
        *groups.entry(r.account.gid).or_default() += r.gpu_seconds.max(0.0);
    }
    for a in queued {
        users.entry(a.uid).or_insert((a.gid, 0.0)).0 = a.gid;
    }
    let total_users: f64 = users.values().map(|(_, u)| *u).sum();
    let member_groups: BTreeSet<u32> = users.values().map(|(g, _)| *g).collect();
    let total_groups: f64 = groups.values().sum();
    let mut members: HashMap<u32, usize> = HashMap::new();
    for (gid, _) in users.values() {
        *members.entry(*gid).or_default() += 1;
    }
    let group_share = 1.0 / member_groups.len().max(1) as f64;
    users
        .iter()
        .map(|(uid, (gid, u))| {
            let share = group_share / members[gid] as f64;
            let normalized = if total_users > 0.0 {
                u / total_users
            } else {
                0.0
            };
            let group_normalized = if total_groups > 0.0 {
                groups.get(gid).copied().unwrap_or(0.0) / total_groups
            } else {
                0.0
            };
            let effective = normalized + (group_normalized - normalized) * (share / group_share);
            Standing {
                uid: *uid,
                gid: *gid,
                usage: *u,
                normalized_usage: normalized,
                share,
                effective_usage: effective,
                factor: (-effective.max(0.0) / share).exp2(),
            }
        })
        .collect()
}

/// `ptrain report --fair-share --json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FairShareView {
    pub half_life_secs: u64,
    /// False until the usage before ptraind's start is read back from
    /// the accounting database: the figures count only runs since.
    pub read_back: bool,
    pub users: Vec<Standing>,
}

/// The factor of each uid, as [`crate::scheduler::Queue::gpu_jobs_fair`]
/// reads it.
pub fn factors(standings: &[Standing]) -> HashMap<u32, f64> {
    standings.iter().map(|s| (s.uid, s.factor)).collect()
}

/// The daemon's fair-share figures: the usage read back from the
/// accounting database at the start (every run that ended before
/// [`Ledger::since`]), and each run that ends from then on. The partition
/// by end time is what keeps a run from counting twice, whichever of the
/// two comes first.
#[derive(Clone, Debug)]
pub struct Ledger {
    half_life: Duration,
    since: u64,
    usage: Usage,
    read_back: bool,
}

impl Ledger {
    pub fn new(half_life: Duration, since: u64) -> Ledger {
        Ledger {
            half_life,
            since,
            usage: Usage::new(since),
            read_back: false,
        }
    }

    pub fn half_life(&self) -> Duration {
        self.half_life
    }

    /// Runs that ended before this moment come from the database.
    pub fn since(&self) -> u64 {
        self.since
    }

    /// Whether the database's figures have been added.
    pub fn is_read_back(&self) -> bool {
        self.read_back
    }

    /// A run ended: counted here if it ended at or after [`Ledger::since`].
    pub fn ended(&mut self, account: Account, gpu_seconds: f64, ended_us: u64) {
        if ended_us >= self.since {
            self.usage.add(
                account.uid,
                account.gid,
                gpu_seconds,
                ended_us,
                self.half_life,
            );
        }
    }

    /// Adds the database's figures (runs that ended before `since`), once.
    pub fn read_back(&mut self, from_database: &Usage) {
        if !self.read_back {
            self.usage.merge(from_database, self.half_life);
            self.read_back = true;
        }
    }

    /// Everyone's standing at `now` ([`standings`]).
    pub fn standings(
        &mut self,
        now: u64,
        running: &[Running],
        queued: &[Account],
    ) -> Vec<Standing> {
        self.usage.decay_to(now, self.half_life);
        standings(&self.usage, running, queued)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);
    const DAY_US: u64 = 24 * 3600 * 1_000_000;

    fn acct(uid: u32, gid: u32) -> Account {
        Account { uid, gid }
    }

    fn factor_of(s: &[Standing], uid: u32) -> f64 {
        s.iter().find(|s| s.uid == uid).unwrap().factor
    }

    #[test]
    fn usage_halves_every_half_life_and_is_forgotten_when_negligible() {
        let mut u = Usage::new(0);
        u.add(1000, 100, 3600.0, 0, DAY);
        u.decay_to(DAY_US, DAY);
        assert!((u.users[&1000].gpu_seconds - 1800.0).abs() < 1e-6, "{u:?}");
        // A run that ended a day before `as_of` counts half on arrival.
        u.add(1001, 100, 100.0, 0, DAY);
        assert!((u.users[&1001].gpu_seconds - 50.0).abs() < 1e-9);
        assert!((u.groups[&100] - 1850.0).abs() < 1e-6);
        u.decay_to(40 * DAY_US, DAY);
        assert!(u.users.is_empty() && u.groups.is_empty(), "{u:?}");
        // Nothing, NaN or a negative figure adds nothing.
        for bad in [0.0, -5.0, f64::NAN, f64::INFINITY] {
            u.add(7, 7, bad, 40 * DAY_US, DAY);
        }
        assert!(u.users.is_empty());
    }

    #[test]
    fn tables_read_back_at_different_moments_merge_as_if_kept_as_one() {
        let mut one = Usage::new(0);
        one.add(1, 1, 100.0, 0, DAY);
        one.add(2, 1, 40.0, DAY_US, DAY);
        let mut first = Usage::new(0);
        first.add(1, 1, 100.0, 0, DAY);
        let mut later = Usage::new(DAY_US);
        later.add(2, 1, 40.0, DAY_US, DAY);
        first.merge(&later, DAY);
        assert_eq!(first.as_of, one.as_of);
        for (a, b) in first.users.values().zip(one.users.values()) {
            assert!((a.gpu_seconds - b.gpu_seconds).abs() < 1e-9);
        }
    }

    #[test]
    fn without_usage_everyone_is_equal_and_more_usage_means_a_lower_factor() {
        let none = standings(&Usage::new(0), &[], &[acct(1, 1), acct(2, 1)]);
        assert!(none.iter().all(|s| s.factor == 1.0), "{none:?}");

        let mut u = Usage::new(0);
        u.add(1, 1, 300.0, 0, DAY);
        u.add(2, 1, 100.0, 0, DAY);
        let s = standings(&u, &[], &[acct(1, 1), acct(2, 1), acct(3, 1)]);
        let (f1, f2, f3) = (factor_of(&s, 1), factor_of(&s, 2), factor_of(&s, 3));
        assert!(f3 > f2 && f2 > f1, "{s:?}");
        // One group, which has all the usage (U_g = 1), shares 1/3 each:
        // UE_1 = 0.75 + (1 - 0.75) / 3, F_1 = 2^(-UE_1 * 3); and one who
        // used nothing in a group that used all it had stands at ½.
        assert!(
            (f1 - (-(0.75_f64 + 0.25 / 3.0) * 3.0).exp2()).abs() < 1e-9,
            "{s:?}"
        );
        assert!((f3 - 0.5).abs() < 1e-9);
    }

    #[test]
    fn a_user_of_a_heavy_group_ranks_below_an_equal_user_of_a_light_one() {
        // Users 1 and 2 used nothing; 1's colleague 3 used a lot.
        let mut u = Usage::new(0);
        u.add(3, 10, 1000.0, 0, DAY);
        u.add(4, 20, 10.0, 0, DAY);
        let s = standings(
            &u,
            &[],
            &[acct(1, 10), acct(2, 20), acct(3, 10), acct(4, 20)],
        );
        assert!(factor_of(&s, 2) > factor_of(&s, 1), "{s:?}");
        assert!(factor_of(&s, 1) > factor_of(&s, 3), "{s:?}");
        // Shares: two groups of two.
        assert!(s.iter().all(|s| (s.share - 0.25).abs() < 1e-12));
    }

    #[test]
    fn a_running_job_counts_its_gpu_seconds_so_far() {
        let mut u = Usage::new(0);
        u.add(2, 1, 50.0, 0, DAY);
        let quiet = standings(&u, &[], &[acct(1, 1), acct(2, 1)]);
        assert!(factor_of(&quiet, 1) > factor_of(&quiet, 2));
        let busy = standings(
            &u,
            &[Running {
                account: acct(1, 1),
                gpu_seconds: 500.0,
            }],
            &[acct(1, 1), acct(2, 1)],
        );
        assert!(factor_of(&busy, 1) < factor_of(&busy, 2), "{busy:?}");
    }

    #[test]
    fn a_run_counts_once_whether_the_database_or_the_ledger_has_it() {
        let mut ledger = Ledger::new(DAY, 10 * DAY_US);
        // Before `since`: the database's; after: the ledger's own.
        ledger.ended(acct(1, 1), 100.0, 9 * DAY_US);
        ledger.ended(acct(1, 1), 100.0, 10 * DAY_US);
        let mut db = Usage::new(10 * DAY_US);
        db.add(1, 1, 200.0, 9 * DAY_US, DAY);
        ledger.read_back(&db);
        ledger.read_back(&db);
        assert!(ledger.is_read_back());
        let s = ledger.standings(10 * DAY_US, &[], &[]);
        assert!((s[0].usage - 200.0).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn the_half_life_is_checked_with_the_key_and_the_fix() {
        let ok = |s: &str| {
            FairShareConfig {
                half_life: s.into(),
            }
            .half_life()
        };
        assert_eq!(ok("7d").unwrap(), 7 * DAY);
        assert_eq!(ok("3600").unwrap(), Duration::from_secs(3600));
        for bad in ["soon", "10s", "2y"] {
            let e = ok(bad).unwrap_err();
            assert_eq!(e.key, "policy.fair_share.half_life", "{bad}");
        }
    }
}
