//! The start's read of every job record, in a child process:
//! `ptraind scan-records STATE_DIR`, the same binary, as root.
//!
//! A restart reads every record in `STATE/jobs/` (100,000 of them with
//! the default retention): the live ones to run on, the sweeps' members,
//! the newest ends to summarise and the end order of all. ptraind runs
//! with one malloc arena, so in the daemon that read's parses left its heap
//! fragmented, and whatever ptraind allocated after it (the newest ends'
//! summaries among them) landed in the holes and kept their pages
//! resident for its whole life: 2.7 MiB more idle heap with a long
//! history than with none (`make bench`, `idle.rss_vs_none`). A child's
//! pages go with it; the daemon gets back only what it keeps.
//!
//! The child writes `STATE/end-order` anew and answers on its stdout, one
//! JSON [`Line`] per line, the last one [`Line::Done`]: an answer without
//! it (the child died) is an error, never a shorter history. The child's
//! inputs are its argument (from ptraind, env cleared) and root's state
//! directory, which no user can write; its answer is read by ptraind only.
//! It does what the daemon's own read did to the state: an older layout's
//! record moved into place, a sweep member whose claim did not complete
//! removed (logged, to ptraind's journal).

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::history::{End, EndOrder, RECENT_ENDS};
use crate::notifications::outbox::Outbox;
use crate::spec::JobId;
use crate::store::{Intent, JobRecord, JobState, Store};

/// ptraind's subcommand for the child.
pub const SUBCOMMAND: &str = "scan-records";

/// One line of the child's answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Line {
    /// A job that has not ended, its record whole.
    Live(Box<JobRecord>),
    /// A sweep's member, ended or not.
    Member {
        submitted_at: u64,
        id: JobId,
        group: JobId,
    },
    /// A record's notifications whose outbox status is not final: they go
    /// out again with their keys, so nothing recorded is lost to a crash.
    Deliver(Vec<Intent>),
    /// The end: the newest ends' ids (oldest first) and how many ended
    /// jobs `STATE/end-order` now holds.
    Done { newest: Vec<JobId>, ends: usize },
}

/// What the daemon keeps of the scan.
pub struct Scanned {
    /// The records of jobs not ended, whole.
    pub live: Vec<JobRecord>,
    /// (submitted_at, member, sweep) of every sweep member.
    pub members: Vec<(u64, JobId, JobId)>,
    /// The newest ends' ids, oldest first.
    pub newest: Vec<JobId>,
    pub end_order: EndOrder,
}

/// The child's work: reads every record of `state_dir`, rewrites its end
/// order and writes the answer to `out`.
pub fn run_child(state_dir: &Path, out: impl Write) -> Result<(), String> {
    let store = Store::open(state_dir).map_err(|e| e.to_string())?;
    let outbox = Outbox::open(state_dir).map_err(|e| {
        format!(
            "{}: cannot open the notification outbox: {e}",
            state_dir.join("outbox").display()
        )
    })?;
    let mut out = std::io::BufWriter::new(out);
    // The first write that failed: the rest of the scan writes nothing.
    let mut failed: Option<std::io::Error> = None;
    let mut emit = |line: Line| {
        if failed.is_none() {
            if let Err(e) = write_line(&mut out, &line) {
                failed = Some(e);
            }
        }
    };
    let mut ends = Vec::new();
    let mut newest = std::collections::BinaryHeap::new();
    store
        .load_each(|record| {
            let pending: Vec<Intent> = record
                .notifications
                .iter()
                .filter(|intent| !outbox.is_final(&intent.key).unwrap_or(false))
                .cloned()
                .collect();
            if !pending.is_empty() {
                emit(Line::Deliver(pending));
            }
            if let Some(group) = &record.group {
                emit(Line::Member {
                    submitted_at: record.submitted_at,
                    id: record.id.clone(),
                    group: group.clone(),
                });
            }
            if record.state == JobState::Ended {
                let end = End {
                    ended_at: record.ended_at.unwrap_or(0),
                    id: record.id.clone(),
                };
                newest.push(std::cmp::Reverse(end.clone()));
                if newest.len() > RECENT_ENDS {
                    newest.pop();
                }
                ends.push(end);
            } else {
                emit(Line::Live(Box::new(record)));
            }
        })
        .map_err(|e| e.to_string())?;
    let answer_err = |e: std::io::Error| format!("cannot write the answer: {e}");
    if let Some(e) = failed {
        return Err(answer_err(e));
    }
    let ends_count = ends.len();
    EndOrder::rebuild(state_dir, ends).map_err(|e| e.to_string())?;
    let newest = newest
        .into_sorted_vec()
        .into_iter()
        .rev()
        .map(|e| e.0.id)
        .collect();
    let done = Line::Done {
        newest,
        ends: ends_count,
    };
    write_line(&mut out, &done).map_err(answer_err)?;
    out.flush().map_err(answer_err)
}

fn write_line(out: &mut impl Write, line: &Line) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, line)?;
    out.write_all(b"\n")
}

/// Folds the child's answer, line by line, into what the daemon keeps;
/// `deliver` gets each record's pending notifications.
pub struct Reader<'a> {
    live: Vec<JobRecord>,
    members: Vec<(u64, JobId, JobId)>,
    done: Option<(Vec<JobId>, usize)>,
    deliver: &'a mut dyn FnMut(Vec<Intent>),
}

impl<'a> Reader<'a> {
    pub fn new(deliver: &'a mut dyn FnMut(Vec<Intent>)) -> Reader<'a> {
        Reader {
            live: Vec::new(),
            members: Vec::new(),
            done: None,
            deliver,
        }
    }

    /// One line of the answer.
    pub fn line(&mut self, text: &str) -> Result<(), String> {
        if self.done.is_some() {
            return Err("a line after the end of the answer".into());
        }
        let line: Line = serde_json::from_str(text)
            .map_err(|e| format!("an unreadable line in the answer: {e}"))?;
        match line {
            Line::Live(record) => self.live.push(*record),
            Line::Member {
                submitted_at,
                id,
                group,
            } => self.members.push((submitted_at, id, group)),
            Line::Deliver(intents) => (self.deliver)(intents),
            Line::Done { newest, ends } => self.done = Some((newest, ends)),
        }
        Ok(())
    }

    /// The scan, once the answer ended; the end order the child wrote.
    pub fn finish(self, state_dir: &Path) -> Result<Scanned, String> {
        let Some((newest, ends)) = self.done else {
            return Err("the answer ended before its last line (the child died?)".into());
        };
        let end_order = EndOrder::open_rebuilt(state_dir, ends).map_err(|e| e.to_string())?;
        Ok(Scanned {
            live: self.live,
            members: self.members,
            newest,
            end_order,
        })
    }
}

/// ptraind's side: runs the child and reads its answer as it comes. The
/// child is ptraind's own binary (`/proc/self/exe`, the very version that
/// runs), spawned with an empty environment but the journal's stream (so
/// its log lines land in ptraind's journal, structured) and ptraind's
/// stderr; killed if ptraind gives up.
#[cfg(not(test))]
pub async fn scan(
    state_dir: &Path,
    deliver: &mut dyn FnMut(Vec<Intent>),
) -> Result<Scanned, String> {
    use std::process::Stdio;
    use tokio::io::AsyncBufReadExt;
    let mut command = tokio::process::Command::new("/proc/self/exe");
    command
        .arg(SUBCOMMAND)
        .arg(state_dir)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    if let Some(stream) = std::env::var_os("JOURNAL_STREAM") {
        command.env("JOURNAL_STREAM", stream);
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start `ptraind {SUBCOMMAND}`: {e}"))?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut reader = Reader::new(deliver);
    loop {
        match lines.next_line().await {
            Ok(Some(text)) => reader.line(&text)?,
            Ok(None) => break,
            Err(e) => return Err(format!("reading `ptraind {SUBCOMMAND}`'s answer: {e}")),
        }
    }
    let status = child
        .wait()
        .await
        .map_err(|e| format!("`ptraind {SUBCOMMAND}`: {e}"))?;
    if !status.success() {
        return Err(format!(
            "`ptraind {SUBCOMMAND}` failed ({status}); its error is in ptraind's journal"
        ));
    }
    reader.finish(state_dir)
}

/// [`scan`] in the crate's own unit tests, where /proc/self/exe is the
/// test binary: the child's work runs in-process, its answer read the
/// same way. The integration tests run the real child.
#[cfg(test)]
pub async fn scan(
    state_dir: &Path,
    deliver: &mut dyn FnMut(Vec<Intent>),
) -> Result<Scanned, String> {
    let mut answer = Vec::new();
    run_child(state_dir, &mut answer)?;
    let text = String::from_utf8(answer).map_err(|e| e.to_string())?;
    let mut reader = Reader::new(deliver);
    for line in text.lines() {
        reader.line(line)?;
    }
    reader.finish(state_dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_kit;

    fn record(id: &str, state: JobState, ended_at: Option<u64>) -> JobRecord {
        let json = format!(r#"{{"version": 1, "id": "{id}", "command": ["true"]}}"#);
        let mut r = test_kit::record(&json, id, test_kit::owner(1000, "alice"), 10);
        r.state = state;
        r.ended_at = ended_at;
        r
    }

    #[test]
    fn the_answer_gives_live_records_whole_and_the_newest_ends_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let live = record("live", JobState::Queued, None);
        store.claim(&live, b"{}").unwrap();
        for (id, at) in [("old", 5), ("new", 9), ("mid", 7)] {
            store
                .claim(&record(id, JobState::Ended, Some(at)), b"{}")
                .unwrap();
        }
        let mut answer = Vec::new();
        run_child(dir.path(), &mut answer).unwrap();
        let text = String::from_utf8(answer).unwrap();
        assert!(text.ends_with('\n') && text.lines().last().unwrap().contains("done"));
        let mut delivered = Vec::new();
        let mut deliver = |intents: Vec<Intent>| delivered.extend(intents);
        let mut reader = Reader::new(&mut deliver);
        for line in text.lines() {
            reader.line(line).unwrap();
        }
        let scanned = reader.finish(dir.path()).unwrap();
        assert_eq!(scanned.live, vec![live]);
        let newest: Vec<&str> = scanned.newest.iter().map(|id| id.as_str()).collect();
        assert_eq!(newest, ["old", "mid", "new"]);
        assert_eq!(scanned.end_order.len(), 3);
        assert!(delivered.is_empty());
    }

    #[test]
    fn an_answer_cut_short_is_an_error_not_a_shorter_history() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store
            .claim(&record("live", JobState::Queued, None), b"{}")
            .unwrap();
        let mut answer = Vec::new();
        run_child(dir.path(), &mut answer).unwrap();
        let text = String::from_utf8(answer).unwrap();
        let mut deliver = |_: Vec<Intent>| {};
        let mut reader = Reader::new(&mut deliver);
        for line in text.lines().filter(|l| !l.contains("\"done\"")) {
            reader.line(line).unwrap();
        }
        let err = reader.finish(dir.path()).err().unwrap();
        assert!(err.contains("ended before its last line"), "{err}");
        let mut reader = Reader::new(&mut deliver);
        assert!(reader.line("{\"live\":").is_err());
    }
}
