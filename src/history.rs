//! Finished jobs: on disk, with the newest few summarised in memory.
//!
//! A host keeps tens of thousands of finished jobs (until `[retention]`
//! compacts them), and what ptraind asks of them (what a listing shows,
//! what a dependent asks: did it succeed? whose is it?, what recognises
//! a spool file claimed before a crash) is in each one's record on disk
//! (`STATE/jobs/ID.json`). Memory keeps nothing per finished job, so an
//! idle ptraind is as small with a million of them as with none:
//! - [`Recent`]: the summaries of the last [`RECENT_ENDS`] ends, so that
//!   a sweep's dependents and `ptrain list` read memory, not files;
//! - [`EndOrder`]: the order in which they ended, for retention (the
//!   oldest) and listings (the newest), in `STATE/end-order`: one line
//!   per end, appended, and rebuilt from the records at each start (so
//!   it needs no fsync: a crash loses nothing the records do not hold).
//!   A line whose job was since restarted or compacted is stale: its
//!   record no longer says it ended then, and readers skip it.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::chain::Dependencies;
use crate::spec::JobId;
use crate::store::{JobRecord, JobState, Outcome, SpoolSource};
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
    /// The summary of an ended job's record.
    pub fn of(record: &JobRecord, owner_name: Arc<str>) -> EndedJob {
        let mut source = record.source.clone();
        source.file.shrink_to_fit();
        EndedJob {
            id: record.id.own_copy(),
            owner_uid: record.owner.uid,
            owner_name,
            submitted_at: record.submitted_at,
            started_at: record.started_at,
            ended_at: record.ended_at.unwrap_or(0),
            outcome: record.outcome.clone(),
            group: record.group.clone(),
            params: (!record.params.is_empty()).then(|| Box::new(record.params.clone())),
            after: (!record.spec.after.is_empty()).then(|| Box::new(record.spec.after.clone())),
            gpus: record.gpus.iter().map(|g| g.index).collect(),
            priority: record.spec.priority,
            has_result: record.result.is_some(),
            source,
        }
    }

    /// The summary of a record read from disk if it is an ended job's
    /// (a live job's record, or a later job's of the same id, is not).
    pub fn of_ended(record: &JobRecord) -> Option<EndedJob> {
        (record.state == JobState::Ended)
            .then(|| EndedJob::of(record, Arc::from(record.owner.name.as_str())))
    }

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
            image: None,
            image_digest: None,
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
            gpu_usage: Vec::new(),
        }
    }
}

/// How many of the newest ends [`Recent`] keeps summarised: a sweep's
/// members as its dependents wait, and what `ptrain list` shows, without
/// a file read each. A few hundred KiB, whatever the history's size.
pub const RECENT_ENDS: usize = 1000;

/// The summaries of the newest ends, by id; the oldest goes first.
#[derive(Default)]
pub struct Recent {
    /// Boxed: the table keeps a power of two of slots, and an empty slot
    /// then costs a pointer, not a whole summary.
    jobs: HashMap<JobId, Box<EndedJob>>,
    /// Ids in the order their ends came in; an id removed since (or
    /// ended again: then it is here twice) is dropped when reached.
    arrival: VecDeque<(u64, JobId)>,
    owner_names: HashMap<u32, Arc<str>>,
}

impl Recent {
    /// Keeps the summary of a job that just ended; the oldest summary
    /// beyond [`RECENT_ENDS`] goes.
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
        let job = EndedJob::of(record, owner_name);
        self.arrival.push_back((job.ended_at, job.id.clone()));
        self.jobs.insert(job.id.clone(), Box::new(job));
        while self.jobs.len() > RECENT_ENDS {
            let Some((ended_at, id)) = self.arrival.pop_front() else {
                break;
            };
            if self.jobs.get(&id).is_some_and(|j| j.ended_at == ended_at) {
                self.jobs.remove(&id);
            }
        }
        // Stale arrivals (removed ids) must not pile up either.
        if self.arrival.len() > 2 * RECENT_ENDS {
            let jobs = &self.jobs;
            self.arrival
                .retain(|(at, id)| jobs.get(id).is_some_and(|j| j.ended_at == *at));
        }
        if self.owner_names.len() > RECENT_ENDS {
            self.owner_names.clear();
        }
    }

    pub fn get(&self, id: &JobId) -> Option<&EndedJob> {
        self.jobs.get(id).map(|job| &**job)
    }

    pub fn remove(&mut self, id: &JobId) {
        self.jobs.remove(id);
    }

    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}

/// One end in [`EndOrder`]: when, and whose.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct End {
    pub ended_at: u64,
    pub id: JobId,
}

impl End {
    /// Whether `record` is still this end's (not restarted, not a later
    /// job of the same id).
    pub fn is_of(&self, record: &JobRecord) -> bool {
        record.state == JobState::Ended && record.ended_at.unwrap_or(0) == self.ended_at
    }
}

/// The order in which the jobs in history ended, in a file: the oldest
/// line first. Its memory is a count and two offsets.
pub struct EndOrder {
    path: PathBuf,
    file: File,
    /// Where the oldest line not yet compacted starts.
    front: u64,
    /// Where the next line goes.
    back: u64,
    /// How many ended jobs the history holds (stale lines not counted).
    len: usize,
}

/// The error of the order's file, with its path.
#[derive(Debug, thiserror::Error)]
#[error("{path}: cannot {action} the history's end order: {source} (is the state directory writable and not full?)")]
pub struct EndOrderError {
    path: PathBuf,
    action: &'static str,
    source: std::io::Error,
}

/// The file is rewritten without its compacted head once that is this
/// big and at least half of it.
const COMPACT_HEAD_BYTES: u64 = 1 << 20;

impl EndOrder {
    /// `STATE/end-order`, written anew from every ended job's end.
    pub fn rebuild(state_dir: &Path, mut ends: Vec<End>) -> Result<EndOrder, EndOrderError> {
        ends.sort();
        let path = state_dir.join("end-order");
        let err = |action| {
            let path = path.clone();
            move |source| EndOrderError {
                path,
                action,
                source,
            }
        };
        let mut text = String::with_capacity(ends.len() * 32);
        for end in &ends {
            line(&mut text, end);
        }
        let len = ends.len();
        drop(ends);
        let file = write_whole(&path, text.as_bytes()).map_err(err("write"))?;
        Ok(EndOrder {
            path,
            file,
            front: 0,
            back: text.len() as u64,
            len,
        })
    }

    /// `STATE/end-order` as [`EndOrder::rebuild`] just wrote it (in
    /// another process: `ptraind scan-records`), holding `len` ends.
    pub fn open_rebuilt(state_dir: &Path, len: usize) -> Result<EndOrder, EndOrderError> {
        let path = state_dir.join("end-order");
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .and_then(|file| Ok((file.metadata()?.len(), file)));
        match opened {
            Ok((back, file)) => Ok(EndOrder {
                path,
                file,
                front: 0,
                back,
                len,
            }),
            Err(source) => Err(EndOrderError {
                path,
                action: "open",
                source,
            }),
        }
    }

    fn err(&self, action: &'static str) -> impl FnOnce(std::io::Error) -> EndOrderError + '_ {
        move |source| EndOrderError {
            path: self.path.clone(),
            action,
            source,
        }
    }

    /// A job ended: its line goes last.
    pub fn push(&mut self, end: &End) -> Result<(), EndOrderError> {
        let mut text = String::with_capacity(32);
        line(&mut text, end);
        self.file
            .write_all_at(text.as_bytes(), self.back)
            .map_err(self.err("append to"))?;
        self.back += text.len() as u64;
        self.len += 1;
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The oldest line: an end, or a stale one (see [`End::is_of`]).
    pub fn oldest(&self) -> Result<Option<End>, EndOrderError> {
        let mut chunk = vec![0; 256];
        let mut at = self.front;
        let mut text = Vec::new();
        while at < self.back {
            let want = chunk.len().min((self.back - at) as usize);
            let n = self
                .file
                .read_at(&mut chunk[..want], at)
                .map_err(self.err("read"))?;
            if n == 0 {
                break;
            }
            text.extend_from_slice(&chunk[..n]);
            at += n as u64;
            if let Some(nl) = text.iter().position(|&b| b == b'\n') {
                return Ok(parse_line(&text[..nl]));
            }
        }
        Ok(None)
    }

    /// Drops the oldest line: its job was compacted (`counted`: it was
    /// one of [`EndOrder::len`]) or the line was stale.
    pub fn pop_oldest(&mut self, counted: bool) -> Result<(), EndOrderError> {
        let Some(end) = self.oldest()? else {
            return Ok(());
        };
        let mut text = String::new();
        line(&mut text, &end);
        self.front += text.len() as u64;
        if counted {
            self.len = self.len.saturating_sub(1);
        }
        if self.front >= COMPACT_HEAD_BYTES && self.front * 2 >= self.back {
            self.drop_head()?;
        }
        Ok(())
    }

    /// A job left the history other than from the front (restarted): its
    /// line, now stale, stays until it is reached.
    pub fn forget_one(&mut self) {
        self.len = self.len.saturating_sub(1);
    }

    /// Up to `n` of the newest lines, the newest first, one per id: ends,
    /// or stale lines the reader skips.
    pub fn newest(&self, n: usize) -> Result<Vec<End>, EndOrderError> {
        const CHUNK: u64 = 64 * 1024;
        let mut found = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut end = self.back;
        // The bytes of a line cut by a chunk's start, kept for the next.
        let mut carry: Option<Vec<u8>> = None;
        while end > self.front && found.len() < n {
            let start = end.saturating_sub(CHUNK).max(self.front);
            let mut buf = vec![0; (end - start) as usize];
            self.file
                .read_exact_at(&mut buf, start)
                .map_err(self.err("read"))?;
            if let Some(cut) = carry.take() {
                buf.extend_from_slice(&cut);
                buf.push(b'\n');
            }
            // The first line is whole only at the front.
            let mut lines: Vec<&[u8]> = buf.split(|&b| b == b'\n').collect();
            lines.pop(); // after the last newline: empty
            let cut = (start > self.front).then(|| lines.remove(0).to_vec());
            for text in lines.into_iter().rev() {
                if found.len() >= n {
                    break;
                }
                if let Some(e) = parse_line(text) {
                    if seen.insert(e.id.clone()) {
                        found.push(e);
                    }
                }
            }
            carry = cut;
            end = start;
        }
        Ok(found)
    }

    /// Rewrites the file without the compacted head.
    fn drop_head(&mut self) -> Result<(), EndOrderError> {
        let mut rest = vec![0; (self.back - self.front) as usize];
        self.file
            .read_exact_at(&mut rest, self.front)
            .map_err(self.err("read"))?;
        self.file = write_whole(&self.path, &rest).map_err(self.err("rewrite"))?;
        self.front = 0;
        self.back = rest.len() as u64;
        Ok(())
    }
}

fn line(text: &mut String, end: &End) {
    use std::fmt::Write as _;
    let _ = writeln!(text, "{} {}", end.ended_at, end.id);
}

fn parse_line(text: &[u8]) -> Option<End> {
    let text = std::str::from_utf8(text).ok()?;
    let (at, id) = text.split_once(' ')?;
    Some(End {
        ended_at: at.parse().ok()?,
        id: JobId::parse(id).ok()?,
    })
}

/// Writes `bytes` to a new file beside `path` and renames it over
/// `path` (root-only); the file, opened for reading and writing.
fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let temp = path.with_extension("new");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temp)?;
    file.write_all(bytes)?;
    std::fs::rename(&temp, path)?;
    Ok(file)
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

    fn end(ended_at: u64, id: &str) -> End {
        End {
            ended_at,
            id: JobId::parse(id).unwrap(),
        }
    }

    #[test]
    fn a_summary_lists_like_the_full_record() {
        let mut r = record("a", "alice", 1000, 20, Outcome::Failed { exit_code: 3 });
        r.params.insert("lr".into(), "0.1".into());
        let mut recent = Recent::default();
        recent.insert(&r);
        let summary = recent.get(&r.id).unwrap();
        assert_eq!(Some(summary), EndedJob::of_ended(&r).as_ref());
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
        // A live job's record is no summary.
        r.state = crate::store::JobState::Running;
        assert_eq!(EndedJob::of_ended(&r), None);
    }

    #[test]
    fn recent_keeps_the_newest_ends_only_and_shares_owner_names() {
        let mut recent = Recent::default();
        for n in 0..RECENT_ENDS as u64 + 10 {
            recent.insert(&record(
                &format!("j{n}"),
                "alice",
                1000,
                n,
                Outcome::Succeeded,
            ));
        }
        assert_eq!(recent.len(), RECENT_ENDS);
        assert!(recent.get(&JobId::parse("j9").unwrap()).is_none());
        let (a, b) = (
            recent.get(&JobId::parse("j10").unwrap()).unwrap(),
            recent.get(&JobId::parse("j11").unwrap()).unwrap(),
        );
        assert!(Arc::ptr_eq(&a.owner_name, &b.owner_name));
        // Removed and ended again, many times: the arrivals stay bounded.
        for n in 0..5 * RECENT_ENDS as u64 {
            let id = JobId::parse("again").unwrap();
            recent.remove(&id);
            recent.insert(&record(
                "again",
                "bob",
                1001,
                10_000 + n,
                Outcome::Succeeded,
            ));
        }
        assert!(recent.arrival.len() <= 2 * RECENT_ENDS + 1);
        assert_eq!(recent.len(), RECENT_ENDS);
        let again = recent.get(&JobId::parse("again").unwrap()).unwrap();
        assert_eq!(again.ended_at, 10_000 + 5 * RECENT_ENDS as u64 - 1);
    }

    #[test]
    fn the_end_order_gives_the_oldest_and_the_newest_across_chunks() {
        let dir = tempfile::tempdir().unwrap();
        // Out of order at the rebuild: sorted by end.
        let mut order =
            EndOrder::rebuild(dir.path(), vec![end(30, "late"), end(10, "early")]).unwrap();
        assert_eq!(order.len(), 2);
        assert_eq!(order.oldest().unwrap(), Some(end(10, "early")));
        order.push(&end(40, "last")).unwrap();
        assert_eq!(order.newest(2).unwrap(), [end(40, "last"), end(30, "late")]);
        order.pop_oldest(true).unwrap();
        assert_eq!(order.len(), 2);
        assert_eq!(order.oldest().unwrap(), Some(end(30, "late")));
        assert_eq!(
            order.newest(10).unwrap(),
            [end(40, "last"), end(30, "late")]
        );
        // Many lines, long ids: lines cut by the 64 KiB chunks are read
        // whole; an id ended twice is listed once, at its newest end.
        let long = "x".repeat(50);
        for n in 0..20_000u64 {
            order
                .push(&end(100 + n, &format!("{long}{}", n % 15_000)))
                .unwrap();
        }
        let newest = order.newest(usize::MAX).unwrap();
        assert_eq!(newest.len(), 15_002);
        assert_eq!(newest[0], end(100 + 19_999, &format!("{long}4999")));
        assert!(newest.contains(&end(100 + 5_000, &format!("{long}5000"))));
        assert!(!newest.contains(&end(100 + 4_999, &format!("{long}4999"))));
        assert_eq!(*newest.last().unwrap(), end(30, "late"));
        // Compacting the head past a MiB rewrites the file without it.
        for _ in 0..19_000 {
            order.pop_oldest(true).unwrap();
        }
        assert!(
            order.front < COMPACT_HEAD_BYTES,
            "head kept: {}",
            order.front
        );
        let on_disk = std::fs::metadata(dir.path().join("end-order"))
            .unwrap()
            .len();
        assert!(on_disk < 2 * COMPACT_HEAD_BYTES, "{on_disk}");
        assert_eq!(order.len(), 20_002 - 19_000);
        assert_eq!(
            order.newest(1).unwrap(),
            [end(100 + 19_999, &format!("{long}4999"))]
        );
        // A restarted job's line is stale: its record says otherwise.
        let r = record("late", "alice", 1000, 30, Outcome::Succeeded);
        assert!(end(30, "late").is_of(&r));
        assert!(!end(31, "late").is_of(&r));
    }
}
