//! Which archives to remove: the retention policy (`[logs]`) applied to
//! the archives at an injected time. Pure: the archiver keeps an
//! [`ArchiveIndex`], takes from it what is due, and unlinks.
//!
//! `to_delete` (in the tests) states the rule over a plain list;
//! [`ArchiveIndex`] applies the same rule incrementally, held to it by a
//! randomised test, so a pass after each job costs what it removes, not the
//! number of archives kept: sorting every archive twice per ended job was
//! a quarter of ptraind's CPU per GPU job with 15,000 archives.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// One archive on disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveInfo {
    /// The owner of the job (the archive's directory is named after it).
    pub uid: u32,
    /// File name inside `LOG_DIR/UID/`.
    pub name: String,
    pub bytes: u64,
    /// When it was written, µs since the epoch (the job's end, give or take).
    pub written_at: u64,
}

/// The space an archive may never eat into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MinFree {
    Bytes(u64),
    /// Percent of the file system's size.
    Percent(u8),
    /// Percent of the file system's size, but never more than the bytes:
    /// the default (journald's `SystemKeepFree=` rule), so a big, busy
    /// disk is not held to tens of gigabytes it will never need for logs.
    PercentAtMost(u8, u64),
}

/// The default floor: 10% of the log directory's file system, at most 4 GiB.
pub const DEFAULT_MIN_FREE: MinFree = MinFree::PercentAtMost(10, 4 << 30);

impl MinFree {
    pub fn bytes_of(self, disk: &Disk) -> u64 {
        match self {
            MinFree::Bytes(b) => b,
            MinFree::Percent(p) => disk.total_bytes / 100 * u64::from(p),
            MinFree::PercentAtMost(p, cap) => MinFree::Percent(p).bytes_of(disk).min(cap),
        }
    }
}

/// `[logs]`: limits on the archives. `None` is no limit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionPolicy {
    pub max_age_secs: Option<u64>,
    pub max_total_bytes: Option<u64>,
    pub max_count: Option<u64>,
    pub user_max_total_bytes: Option<u64>,
    pub user_max_count: Option<u64>,
    pub min_free: MinFree,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        RetentionPolicy {
            max_age_secs: Some(30 * 24 * 3600),
            max_total_bytes: None,
            max_count: None,
            user_max_total_bytes: None,
            user_max_count: None,
            min_free: DEFAULT_MIN_FREE,
        }
    }
}

/// What `statvfs` says about the log directory's file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disk {
    /// Free to unprivileged writers (f_bavail): what stays for the rest of
    /// the system once ptraind stops at its floor.
    pub avail_bytes: u64,
    pub total_bytes: u64,
}

/// The rule, over a plain list: indexes into `archives` to remove, oldest
/// first: past `max_age`, then the oldest of each user over their count or
/// size, then the oldest of all over the totals, then the oldest until
/// `min_free` is free again. [`ArchiveIndex::take_due`] is held to it.
#[cfg(test)]
pub fn to_delete(
    now: u64,
    archives: &[ArchiveInfo],
    policy: &RetentionPolicy,
    disk: Option<Disk>,
) -> Vec<usize> {
    let mut order: Vec<usize> = (0..archives.len()).collect();
    order.sort_by_key(|&i| (archives[i].written_at, archives[i].uid, &archives[i].name));
    let mut gone = vec![false; archives.len()];
    if let Some(max_age) = policy.max_age_secs {
        let cutoff = now.saturating_sub(max_age.saturating_mul(1_000_000));
        for &i in &order {
            if archives[i].written_at < cutoff {
                gone[i] = true;
            }
        }
    }
    // Per user: walk each user's archives newest first, keep while within
    // the limits; everything older than the first that does not fit goes.
    let mut by_user: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for &i in order.iter().rev() {
        if !gone[i] {
            by_user.entry(archives[i].uid).or_default().push(i);
        }
    }
    for newest_first in by_user.values() {
        evict_beyond(
            newest_first,
            archives,
            policy.user_max_count,
            policy.user_max_total_bytes,
            &mut gone,
        );
    }
    let newest_first: Vec<usize> = order.iter().rev().copied().filter(|&i| !gone[i]).collect();
    evict_beyond(
        &newest_first,
        archives,
        policy.max_count,
        policy.max_total_bytes,
        &mut gone,
    );
    if let Some(disk) = disk {
        let floor = policy.min_free.bytes_of(&disk);
        let mut avail = disk.avail_bytes;
        for &i in &order {
            if avail >= floor {
                break;
            }
            if !gone[i] {
                gone[i] = true;
                avail = avail.saturating_add(archives[i].bytes);
            }
        }
        // What was already going frees space too, but deciding that first
        // would only ever remove more.
    }
    order.into_iter().filter(|&i| gone[i]).collect()
}

/// Marks as gone every archive after the first (newest first) that would
/// take the kept ones past `max_count` or `max_bytes`.
#[cfg(test)]
fn evict_beyond(
    newest_first: &[usize],
    archives: &[ArchiveInfo],
    max_count: Option<u64>,
    max_bytes: Option<u64>,
    gone: &mut [bool],
) {
    let (mut count, mut bytes) = (0u64, 0u64);
    let mut full = false;
    for &i in newest_first {
        if !full {
            let fits_count = max_count.is_none_or(|m| count < m);
            let fits_bytes = max_bytes.is_none_or(|m| bytes + archives[i].bytes <= m);
            if fits_count && fits_bytes {
                count += 1;
                bytes += archives[i].bytes;
                continue;
            }
            full = true;
        }
        gone[i] = true;
    }
}

/// The largest archive that may be written now: what the disk has above
/// its floor, and no more than one archive may ever keep (the totals).
pub fn write_budget(policy: &RetentionPolicy, disk: Option<Disk>) -> u64 {
    let mut budget = u64::MAX;
    if let Some(disk) = disk {
        budget = disk
            .avail_bytes
            .saturating_sub(policy.min_free.bytes_of(&disk));
    }
    for cap in [policy.max_total_bytes, policy.user_max_total_bytes]
        .into_iter()
        .flatten()
    {
        budget = budget.min(cap);
    }
    budget
}

/// The archives kept, in age order overall and per user, with running
/// totals: adding one and taking what the policy lets go cost O(log n)
/// each.
#[derive(Debug, Default)]
pub struct ArchiveIndex {
    /// (written_at, uid, name) → bytes: the order archives go in.
    by_age: BTreeMap<(u64, u32, Arc<str>), u64>,
    users: HashMap<u32, UserArchives>,
    bytes: u64,
}

#[derive(Debug, Default)]
struct UserArchives {
    by_age: BTreeSet<(u64, Arc<str>)>,
    bytes: u64,
}

impl ArchiveIndex {
    pub fn new(archives: impl IntoIterator<Item = ArchiveInfo>) -> ArchiveIndex {
        let mut index = ArchiveIndex::default();
        for a in archives {
            index.insert(a);
        }
        index
    }

    pub fn insert(&mut self, a: ArchiveInfo) {
        let name: Arc<str> = a.name.into();
        let key = (a.written_at, a.uid, name.clone());
        if let Some(old) = self.by_age.insert(key, a.bytes) {
            // The same file again: counted once.
            self.bytes -= old;
            self.users.entry(a.uid).or_default().bytes -= old;
        }
        self.bytes += a.bytes;
        let user = self.users.entry(a.uid).or_default();
        user.by_age.insert((a.written_at, name));
        user.bytes += a.bytes;
    }

    fn remove(&mut self, written_at: u64, uid: u32, name: Arc<str>) -> Option<ArchiveInfo> {
        let bytes = self.by_age.remove(&(written_at, uid, name.clone()))?;
        self.bytes -= bytes;
        if let Some(user) = self.users.get_mut(&uid) {
            user.by_age.remove(&(written_at, name.clone()));
            user.bytes -= bytes;
            if user.by_age.is_empty() {
                self.users.remove(&uid);
            }
        }
        Some(ArchiveInfo {
            uid,
            name: name.to_string(),
            bytes,
            written_at,
        })
    }

    fn remove_oldest(&mut self) -> Option<ArchiveInfo> {
        let (written_at, uid, name) = self.by_age.keys().next()?.clone();
        self.remove(written_at, uid, name)
    }

    /// The archives of job `id` (one per run that was archived), oldest
    /// first. A walk over the index, bounded by `[logs] max_count`: for
    /// jobs `[retention]` compacted, which ptraind knows no other way.
    pub fn of_job(&self, id: &str) -> Vec<ArchiveInfo> {
        self.by_age
            .iter()
            .filter(|((_, _, name), _)| super::archive::job_of_name(name) == Some(id))
            .map(|((written_at, uid, name), bytes)| ArchiveInfo {
                uid: *uid,
                name: name.to_string(),
                bytes: *bytes,
                written_at: *written_at,
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.by_age.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_age.is_empty()
    }

    pub fn total_bytes(&self) -> u64 {
        self.bytes
    }

    /// Takes out the archives `policy` lets go now (past `max_age`, then
    /// the oldest of each user over their count or size, then the oldest
    /// of all over the totals, then the oldest until `min_free` is free
    /// again), oldest first, and returns them for unlinking.
    pub fn take_due(
        &mut self,
        now: u64,
        policy: &RetentionPolicy,
        disk: Option<Disk>,
    ) -> Vec<ArchiveInfo> {
        let mut gone = Vec::new();
        if let Some(max_age) = policy.max_age_secs {
            let cutoff = now.saturating_sub(max_age.saturating_mul(1_000_000));
            while self.by_age.keys().next().is_some_and(|k| k.0 < cutoff) {
                gone.extend(self.remove_oldest());
            }
        }
        // Keeping the newest while they fit is dropping the oldest until
        // the rest fits.
        let over = |count: usize, bytes: u64, max_count: Option<u64>, max_bytes: Option<u64>| {
            max_count.is_some_and(|m| count as u64 > m) || max_bytes.is_some_and(|m| bytes > m)
        };
        let (user_count, user_bytes) = (policy.user_max_count, policy.user_max_total_bytes);
        if user_count.is_some() || user_bytes.is_some() {
            let mut over_users: Vec<u32> = self
                .users
                .iter()
                .filter(|(_, u)| over(u.by_age.len(), u.bytes, user_count, user_bytes))
                .map(|(uid, _)| *uid)
                .collect();
            over_users.sort_unstable();
            for uid in over_users {
                while let Some(user) = self.users.get(&uid) {
                    if !over(user.by_age.len(), user.bytes, user_count, user_bytes) {
                        break;
                    }
                    let Some((written_at, name)) = user.by_age.first().cloned() else {
                        break;
                    };
                    gone.extend(self.remove(written_at, uid, name));
                }
            }
        }
        while over(
            self.len(),
            self.bytes,
            policy.max_count,
            policy.max_total_bytes,
        ) {
            gone.extend(self.remove_oldest());
        }
        if let Some(disk) = disk {
            let floor = policy.min_free.bytes_of(&disk);
            let mut avail = disk.avail_bytes;
            while avail < floor {
                let Some(a) = self.remove_oldest() else { break };
                avail = avail.saturating_add(a.bytes);
                gone.push(a);
            }
        }
        // Oldest first overall, whichever limit took them.
        gone.sort_by(|a, b| (a.written_at, a.uid, &a.name).cmp(&(b.written_at, b.uid, &b.name)));
        gone
    }

    /// When the oldest archive passes `max_age` (µs), so the archiver can
    /// sleep until exactly then instead of looking periodically.
    pub fn next_expiry(&self, policy: &RetentionPolicy) -> Option<u64> {
        let max_age = policy.max_age_secs?;
        let oldest = self.by_age.keys().next()?.0;
        Some(oldest.saturating_add(max_age.saturating_mul(1_000_000)))
    }

    /// Count, size and oldest archive per user, by uid.
    pub fn usage(&self) -> Vec<UserUsage> {
        let mut out: Vec<UserUsage> = self
            .users
            .iter()
            .map(|(uid, u)| UserUsage {
                uid: *uid,
                user: None,
                count: u.by_age.len() as u64,
                bytes: u.bytes,
                oldest: u.by_age.first().map(|(at, _)| *at),
            })
            .collect();
        out.sort_by_key(|u| u.uid);
        out
    }
}

/// One user's archives, for `ptrain du`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserUsage {
    pub uid: u32,
    #[serde(default)]
    pub user: Option<String>,
    pub count: u64,
    pub bytes: u64,
    /// The oldest archive's time, µs.
    pub oldest: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 24 * 3600 * 1_000_000;

    fn a(uid: u32, name: &str, bytes: u64, written_at: u64) -> ArchiveInfo {
        ArchiveInfo {
            uid,
            name: name.into(),
            bytes,
            written_at,
        }
    }

    fn none() -> RetentionPolicy {
        RetentionPolicy {
            max_age_secs: None,
            max_total_bytes: None,
            max_count: None,
            user_max_total_bytes: None,
            user_max_count: None,
            min_free: MinFree::Bytes(0),
        }
    }

    fn names(archives: &[ArchiveInfo], idx: Vec<usize>) -> Vec<&str> {
        idx.into_iter().map(|i| archives[i].name.as_str()).collect()
    }

    #[test]
    fn nothing_goes_without_limits() {
        let list = vec![a(1, "x", 10, 0), a(2, "y", 10, DAY)];
        assert!(to_delete(100 * DAY, &list, &none(), None).is_empty());
    }

    #[test]
    fn age_removes_only_the_expired_at_the_injected_time() {
        let policy = RetentionPolicy {
            max_age_secs: Some(7 * 24 * 3600),
            ..none()
        };
        let list = vec![
            a(1, "new", 1, 10 * DAY),
            a(1, "old", 1, 2 * DAY),
            a(2, "edge", 1, 3 * DAY),
        ];
        // 7 days after "edge": it is exactly at the limit and stays.
        assert_eq!(
            names(&list, to_delete(10 * DAY, &list, &policy, None)),
            ["old"]
        );
        assert_eq!(
            names(&list, to_delete(10 * DAY + 1, &list, &policy, None)),
            ["old", "edge"]
        );
        assert!(to_delete(9 * DAY, &list, &policy, None).is_empty());
        assert_eq!(
            ArchiveIndex::new(list.clone()).next_expiry(&policy),
            Some(9 * DAY)
        );
        assert_eq!(ArchiveIndex::new(list.clone()).next_expiry(&none()), None);
    }

    #[test]
    fn per_user_count_and_size_remove_that_users_oldest() {
        let list = vec![
            a(1, "a1", 100, 1),
            a(1, "a2", 100, 2),
            a(1, "a3", 100, 3),
            a(2, "b1", 100, 0),
        ];
        let by_count = RetentionPolicy {
            user_max_count: Some(2),
            ..none()
        };
        assert_eq!(names(&list, to_delete(10, &list, &by_count, None)), ["a1"]);
        let by_size = RetentionPolicy {
            user_max_total_bytes: Some(150),
            ..none()
        };
        // bob's single archive fits; alice keeps only her newest.
        assert_eq!(
            names(&list, to_delete(10, &list, &by_size, None)),
            ["a1", "a2"]
        );
    }

    #[test]
    fn totals_remove_the_oldest_of_everyone() {
        let list = vec![
            a(1, "a1", 100, 1),
            a(2, "b1", 100, 0),
            a(1, "a2", 100, 5),
            a(2, "b2", 100, 4),
        ];
        let by_count = RetentionPolicy {
            max_count: Some(3),
            ..none()
        };
        assert_eq!(names(&list, to_delete(10, &list, &by_count, None)), ["b1"]);
        let by_size = RetentionPolicy {
            max_total_bytes: Some(250),
            ..none()
        };
        assert_eq!(
            names(&list, to_delete(10, &list, &by_size, None)),
            ["b1", "a1"]
        );
    }

    #[test]
    fn an_archive_larger_than_a_limit_goes_with_everything_older() {
        let list = vec![
            a(1, "small-old", 10, 1),
            a(1, "huge", 1000, 2),
            a(1, "new", 10, 3),
        ];
        let policy = RetentionPolicy {
            user_max_total_bytes: Some(500),
            ..none()
        };
        assert_eq!(
            names(&list, to_delete(10, &list, &policy, None)),
            ["small-old", "huge"]
        );
    }

    #[test]
    fn low_disk_removes_oldest_until_the_floor_is_free() {
        let list = vec![a(1, "a1", 30, 1), a(1, "a2", 30, 2), a(2, "b1", 30, 3)];
        let policy = RetentionPolicy {
            min_free: MinFree::Percent(10),
            ..none()
        };
        let disk = |avail| Disk {
            avail_bytes: avail,
            total_bytes: 1000,
        };
        assert!(to_delete(10, &list, &policy, Some(disk(100))).is_empty());
        assert_eq!(
            names(&list, to_delete(10, &list, &policy, Some(disk(50)))),
            ["a1", "a2"]
        );
        // Even removing everything cannot reach the floor: all go.
        assert_eq!(to_delete(10, &list, &policy, Some(disk(0))).len(), 3);
    }

    #[test]
    fn the_default_floor_is_a_tenth_of_the_disk_but_never_over_4_gib() {
        let disk = |total_bytes| Disk {
            avail_bytes: 0,
            total_bytes,
        };
        assert_eq!(
            DEFAULT_MIN_FREE.bytes_of(&disk(10 << 30)),
            (10 << 30) / 100 * 10
        );
        assert_eq!(DEFAULT_MIN_FREE.bytes_of(&disk(250 << 30)), 4 << 30);
        // Written as a percentage, it is that percentage, however big.
        assert_eq!(MinFree::Percent(10).bytes_of(&disk(250 << 30)), 25 << 30);
    }

    #[test]
    fn write_budget_keeps_the_floor_and_the_caps() {
        let disk = Disk {
            avail_bytes: 1000,
            total_bytes: 2000,
        };
        let policy = RetentionPolicy {
            min_free: MinFree::Percent(10),
            ..none()
        };
        assert_eq!(write_budget(&policy, Some(disk)), 800);
        assert_eq!(write_budget(&policy, None), u64::MAX);
        let capped = RetentionPolicy {
            user_max_total_bytes: Some(300),
            max_total_bytes: Some(500),
            ..policy
        };
        assert_eq!(write_budget(&capped, Some(disk)), 300);
        let full = Disk {
            avail_bytes: 100,
            total_bytes: 2000,
        };
        assert_eq!(write_budget(&capped, Some(full)), 0);
    }

    #[test]
    fn usage_sums_per_user() {
        let list = vec![a(2, "b", 5, 9), a(1, "a1", 10, 4), a(1, "a2", 20, 3)];
        let u = ArchiveIndex::new(list).usage();
        assert_eq!(u.len(), 2);
        assert_eq!(
            (u[0].uid, u[0].count, u[0].bytes, u[0].oldest),
            (1, 2, 30, Some(3))
        );
        assert_eq!((u[1].uid, u[1].count, u[1].bytes), (2, 1, 5));
    }

    #[test]
    fn the_index_takes_what_the_rule_says_in_its_order() {
        let mut rng = fastrand::Rng::with_seed(10);
        for round in 0..400 {
            let n = rng.usize(0..60);
            let list: Vec<ArchiveInfo> = (0..n)
                .map(|i| {
                    a(
                        rng.u32(1..4),
                        &format!("j{i}.log.gz"),
                        rng.u64(1..100),
                        rng.u64(0..20) * DAY / 2,
                    )
                })
                .collect();
            let maybe = |rng: &mut fastrand::Rng, range: std::ops::Range<u64>| {
                let v = rng.u64(range);
                rng.bool().then_some(v)
            };
            let policy = RetentionPolicy {
                max_age_secs: maybe(&mut rng, 1..10).map(|d| d * 24 * 3600),
                max_total_bytes: maybe(&mut rng, 0..2000),
                max_count: maybe(&mut rng, 0..40),
                user_max_total_bytes: maybe(&mut rng, 0..800),
                user_max_count: maybe(&mut rng, 0..20),
                min_free: MinFree::Bytes(rng.u64(0..3000)),
            };
            let disk = rng.bool().then(|| Disk {
                avail_bytes: rng.u64(0..3000),
                total_bytes: 10_000,
            });
            let now = 12 * DAY;
            let expected = names(&list, to_delete(now, &list, &policy, disk));
            let mut index = ArchiveIndex::new(list.clone());
            let taken = index.take_due(now, &policy, disk);
            let got: Vec<&str> = taken.iter().map(|a| a.name.as_str()).collect();
            assert_eq!(got, expected, "round {round}: {policy:?} {disk:?}");
            assert_eq!(index.len() + taken.len(), list.len());
            let kept: u64 = list.iter().map(|a| a.bytes).sum::<u64>()
                - taken.iter().map(|a| a.bytes).sum::<u64>();
            assert_eq!(index.total_bytes(), kept);
            // A second pass at the same time has nothing more to take,
            // unless the disk floor still is not met.
            if disk.is_none() {
                assert!(index.take_due(now, &policy, None).is_empty());
            }
        }
    }

    #[test]
    fn the_index_wakes_for_its_oldest_and_counts_each_file_once() {
        let policy = RetentionPolicy {
            max_age_secs: Some(24 * 3600),
            ..none()
        };
        let mut index = ArchiveIndex::new([a(1, "x", 10, 5 * DAY), a(2, "y", 7, 3 * DAY)]);
        assert_eq!(index.next_expiry(&policy), Some(4 * DAY));
        index.insert(a(2, "y", 9, 3 * DAY));
        assert_eq!((index.len(), index.total_bytes()), (2, 19));
        assert_eq!(index.usage()[1].bytes, 9);
        let taken = index.take_due(4 * DAY + 1, &policy, None);
        assert_eq!(taken, vec![a(2, "y", 9, 3 * DAY)]);
        assert_eq!(index.next_expiry(&policy), Some(6 * DAY));
        assert_eq!(index.usage().len(), 1);
        assert!(index.next_expiry(&none()).is_none());
    }
}
