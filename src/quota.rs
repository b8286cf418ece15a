//! GPU-hour quotas (`[limits] gpu_hours = { per = "7d", max = 100 }`, and
//! `[limits.users.NAME] gpu_hours` for one user; off by default): a user
//! whose GPU-hours over the last `per` reached `max` has their new GPU
//! jobs kept queued, with the reason and the moment they are under it
//! again in `ptrain status`; jobs already running go on. Pure: the runs
//! and the clock are handed in.
//!
//! # The rule
//!
//! - A user's use is the GPU-seconds (run time times GPUs held, from
//!   systemd's timestamps) of their runs that ended within the last `per`,
//!   plus those of their running jobs so far. Over quota means use ≥ max.
//! - Runs are summed into [`BUCKETS`] buckets of `per` each: a run counts
//!   until its bucket's end is `per` old, so it may count up to
//!   `per / BUCKETS` longer than exactly `per` (the quota errs toward
//!   keeping a job queued, never toward letting one more start).
//! - Memory and cost are the users with runs in the window times the
//!   buckets, never the history's length; the window is read back from
//!   the accounting database at each start ([`Quotas::read_back`]).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Deserialize;

use crate::setting::InvalidSetting;

/// Buckets per window: the quota's time resolution is `per / BUCKETS`.
pub const BUCKETS: u64 = 120;

/// The shortest and longest `per` ptraind accepts.
pub const MIN_PER: Duration = Duration::from_secs(10);
pub const MAX_PER: Duration = Duration::from_secs(365 * 24 * 3600);

/// `gpu_hours = { per = "7d", max = 100 }` as written.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuHoursQuota {
    /// The window: "7d", "12h", or seconds as text.
    pub per: String,
    /// GPU-hours allowed in any window.
    pub max: f64,
}

impl GpuHoursQuota {
    /// Checks both values; the error names `key` (`limits.gpu_hours`,
    /// `limits.users.NAME.gpu_hours`) and the fix.
    pub fn validate(&self, key: &str) -> Result<(), InvalidSetting> {
        self.per_checked(key)?;
        if !(self.max.is_finite() && self.max > 0.0 && self.max <= 1e9) {
            return Err(InvalidSetting::new(
                format!("{key}.max"),
                format!(
                    "{} is not a number of GPU-hours between 0 and 1e9; leave gpu_hours out for no quota",
                    self.max
                ),
            ));
        }
        Ok(())
    }

    fn per_checked(&self, key: &str) -> Result<Duration, InvalidSetting> {
        crate::setting::span(
            &format!("{key}.per"),
            &self.per,
            MIN_PER..=MAX_PER,
            "the quota counts the GPU-hours of this last span",
        )
    }

    /// The window (checked at the config's load; a wrong one is never used).
    pub fn per(&self) -> Duration {
        self.per_checked("").unwrap_or(MAX_PER)
    }
}

/// One window length's buckets: for each user, GPU-seconds by bucket
/// (the bucket's index is its start / `bucket_us`).
#[derive(Clone, Debug)]
struct Window {
    per_us: u64,
    bucket_us: u64,
    users: HashMap<u32, BTreeMap<u64, f64>>,
}

impl Window {
    fn new(per: Duration) -> Window {
        let per_us = per.as_micros() as u64;
        Window {
            per_us,
            bucket_us: (per_us / BUCKETS).max(1),
            users: HashMap::new(),
        }
    }

    fn add(&mut self, uid: u32, ended_us: u64, gpu_seconds: f64) {
        *self
            .users
            .entry(uid)
            .or_default()
            .entry(ended_us / self.bucket_us)
            .or_default() += gpu_seconds;
    }

    /// `uid`'s buckets that still count at `now`, oldest first, the older
    /// ones forgotten.
    fn current(&mut self, uid: u32, now: u64) -> Option<&BTreeMap<u64, f64>> {
        let buckets = self.users.get_mut(&uid)?;
        // A bucket counts while its end is less than `per` old.
        let first_counted = now.saturating_sub(self.per_us) / self.bucket_us;
        *buckets = buckets.split_off(&first_counted);
        if buckets.is_empty() {
            self.users.remove(&uid);
            return None;
        }
        self.users.get(&uid)
    }
}

/// Where a user over quota stands, for the reason `ptrain status` shows.
#[derive(Clone, Debug, PartialEq)]
pub struct OverQuota {
    /// GPU-hours in the window, running jobs included.
    pub used_hours: f64,
    pub max_hours: f64,
    pub per: Duration,
    /// When the user is under it again as things stand (µs since the
    /// epoch); `None` while their running jobs alone keep them over (their
    /// end plans again).
    pub under_at: Option<u64>,
}

impl OverQuota {
    /// "waiting: alice used 101.20 of the 100 GPU-hours per 7d allowed
    /// (limits.users.alice.gpu_hours); under it again at ...", with the
    /// moment written by `moment`.
    pub fn describe(&self, who: &str, key: &str, moment: impl Fn(u64) -> String) -> String {
        let when = match self.under_at {
            Some(at) => format!("; under it again at {}", moment(at)),
            None => "; under it again once running jobs end and their hours age out".to_owned(),
        };
        format!(
            "waiting: {who} used {:.2} of the {} GPU-hours per {} allowed ({key}){when}",
            self.used_hours,
            self.max_hours,
            crate::setting::span_text(self.per)
        )
    }
}

/// Every window the config names, fed by the runs that end.
#[derive(Clone, Debug)]
pub struct Quotas {
    windows: BTreeMap<Duration, Window>,
    /// Runs that ended before this moment come from the database
    /// ([`Quotas::read_back`]); later ones from [`Quotas::ended`].
    since: u64,
}

impl Quotas {
    /// The windows of every `per` in `quotas` (none: quotas are off).
    pub fn new<'a>(quotas: impl IntoIterator<Item = &'a GpuHoursQuota>, since: u64) -> Quotas {
        let windows = quotas
            .into_iter()
            .map(|q| (q.per(), Window::new(q.per())))
            .collect();
        Quotas { windows, since }
    }

    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    pub fn since(&self) -> u64 {
        self.since
    }

    /// Each window's length and bucket width, for the read-back query.
    pub fn periods(&self) -> Vec<(Duration, u64)> {
        self.windows
            .iter()
            .map(|(per, w)| (*per, w.bucket_us))
            .collect()
    }

    /// A run of `uid` ended: counted if it ended at or after `since`.
    pub fn ended(&mut self, uid: u32, gpu_seconds: f64, ended_us: u64) {
        if ended_us < self.since || !gpu_seconds.is_finite() || gpu_seconds <= 0.0 {
            return;
        }
        for window in self.windows.values_mut() {
            window.add(uid, ended_us, gpu_seconds);
        }
    }

    /// The database's sums for the window of `per`: (uid, bucket index,
    /// GPU-seconds) of the runs that ended before `since`.
    pub fn read_back(&mut self, per: Duration, sums: &[(u32, u64, f64)]) {
        let Some(window) = self.windows.get_mut(&per) else {
            return;
        };
        for (uid, bucket, gpu_seconds) in sums {
            if gpu_seconds.is_finite() && *gpu_seconds > 0.0 {
                *window
                    .users
                    .entry(*uid)
                    .or_default()
                    .entry(*bucket)
                    .or_default() += gpu_seconds;
            }
        }
    }

    /// Whether `uid` is over `quota` at `now`, with `running` GPU-seconds
    /// of their running jobs so far.
    pub fn over(
        &mut self,
        uid: u32,
        quota: &GpuHoursQuota,
        now: u64,
        running: f64,
    ) -> Option<OverQuota> {
        let per = quota.per();
        let max = quota.max * 3600.0;
        let window = self.windows.get_mut(&per)?;
        let (per_us, bucket_us) = (window.per_us, window.bucket_us);
        let buckets: Vec<(u64, f64)> = window
            .current(uid, now)
            .map(|b| b.iter().map(|(i, s)| (*i, *s)).collect())
            .unwrap_or_default();
        let used = buckets.iter().map(|(_, s)| s).sum::<f64>() + running.max(0.0);
        if used < max {
            return None;
        }
        // As the oldest buckets age out, one by one.
        let mut left = used;
        let mut under_at = None;
        for (index, gpu_seconds) in buckets {
            left -= gpu_seconds;
            if left < max {
                under_at = Some((index + 1) * bucket_us + per_us);
                break;
            }
        }
        Some(OverQuota {
            used_hours: used / 3600.0,
            max_hours: quota.max,
            per,
            under_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR_US: u64 = 3600 * 1_000_000;

    fn quota(per: &str, max: f64) -> GpuHoursQuota {
        GpuHoursQuota {
            per: per.into(),
            max,
        }
    }

    #[test]
    fn a_quota_is_checked_with_the_key_and_the_fix() {
        assert!(quota("7d", 100.0).validate("limits.gpu_hours").is_ok());
        let e = quota("soon", 1.0).validate("limits.users.bob.gpu_hours");
        assert_eq!(e.unwrap_err().key, "limits.users.bob.gpu_hours.per");
        let e = quota("1s", 1.0).validate("limits.gpu_hours").unwrap_err();
        assert!(e.message.contains("10s..365d"), "{e}");
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = quota("7d", bad).validate("limits.gpu_hours").unwrap_err();
            assert_eq!(e.key, "limits.gpu_hours.max");
        }
    }

    #[test]
    fn use_in_the_window_keeps_a_user_over_until_it_ages_out() {
        let q = quota("120h", 10.0);
        let mut quotas = Quotas::new([&q], 0);
        // Buckets of 1 h. 6 GPU-hours ending at 1:30, 5 at 3:30.
        quotas.ended(1000, 6.0 * 3600.0, HOUR_US + HOUR_US / 2);
        quotas.ended(1000, 5.0 * 3600.0, 3 * HOUR_US + HOUR_US / 2);
        let now = 4 * HOUR_US;
        let over = quotas.over(1000, &q, now, 0.0).unwrap();
        assert!((over.used_hours - 11.0).abs() < 1e-9, "{over:?}");
        // The 6 hours' bucket (1:00-2:00) ages out 120 h after its end.
        assert_eq!(over.under_at, Some(2 * HOUR_US + 120 * HOUR_US));
        assert!(over
            .describe("alice", "limits.gpu_hours", |at| at.to_string())
            .contains("11.00 of the 10 GPU-hours per 5d"));
        // Another user, and the same one after that moment.
        assert_eq!(quotas.over(1001, &q, now, 0.0), None);
        assert_eq!(quotas.over(1000, &q, 122 * HOUR_US, 0.0), None);
        // What is left (5 h) plus running jobs' 5 h so far: over again,
        // and the running ones alone would not age out.
        let over = quotas.over(1000, &q, 122 * HOUR_US, 5.0 * 3600.0).unwrap();
        assert_eq!(over.under_at, Some(4 * HOUR_US + 120 * HOUR_US));
        let over = quotas.over(1000, &q, 125 * HOUR_US, 10.0 * 3600.0).unwrap();
        assert_eq!(over.under_at, None);
        assert!(over
            .describe("alice", "k", |at| at.to_string())
            .contains("once running jobs end"));
    }

    #[test]
    fn the_database_counts_before_the_start_and_the_ends_after_it() {
        let q = quota("120h", 10.0);
        let since = 10 * HOUR_US;
        let mut quotas = Quotas::new([&q, &q], since);
        assert_eq!(
            quotas.periods(),
            [(Duration::from_secs(120 * 3600), HOUR_US)]
        );
        // A run the database has (ended before the start) told again as
        // it is collected after the start: counted once.
        quotas.read_back(Duration::from_secs(120 * 3600), &[(1000, 9, 8.0 * 3600.0)]);
        quotas.ended(1000, 8.0 * 3600.0, 9 * HOUR_US + 1);
        quotas.ended(1000, 1.0 * 3600.0, since);
        let over = quotas.over(1000, &q, since + 1, 0.0);
        assert_eq!(over, None, "8 + 1 hours are under 10");
        quotas.ended(1000, 1.0 * 3600.0, since + 2);
        assert!(quotas.over(1000, &q, since + 3, 0.0).is_some());
        // A window no quota names is not read back.
        quotas.read_back(Duration::from_secs(60), &[(1000, 1, 1e9)]);
        assert!((quotas.over(1000, &q, since + 3, 0.0).unwrap().used_hours - 10.0).abs() < 1e-9);
    }

    #[test]
    fn forgotten_buckets_free_their_memory() {
        let q = quota("10s", 0.001);
        let mut quotas = Quotas::new([&q], 0);
        for i in 0..10_000u64 {
            quotas.ended(1000 + (i % 50) as u32, 1.0, i * 1_000_000);
        }
        for uid in 1000..1050 {
            quotas.over(uid, &q, 20_000 * 1_000_000, 0.0);
        }
        let window = quotas.windows.values().next().unwrap();
        assert!(window.users.is_empty(), "{:?}", window.users.len());
    }
}
