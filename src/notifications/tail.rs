//! The last lines of a job's output, for the messages about its end.
//!
//! Read from the journal by the sender, once per notification, before its
//! first attempt ([`read`]); a failed read gives no lines rather than a
//! late or lost message. Shaping the lines is pure ([`shape`]).

use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use super::{Notice, NotifyEvent};
use crate::logs::journal::{self, RunFilter, Selection};
use crate::logs::sd_journal;

/// Most lines kept.
pub const TAIL_LINES: usize = 20;
/// Longest line kept, in bytes, after escaping.
pub const TAIL_LINE_MAX: usize = 200;
/// Most bytes of all lines together.
pub const TAIL_MAX: usize = 4096;

/// Journal entries read back: a margin over [`TAIL_LINES`] for entries of
/// another run of the same unit, which the filter drops.
const READ_ENTRIES: usize = 200;
/// The whole read, `journalctl --sync` included, after which the message
/// goes without lines.
const READ_TIMEOUT: Duration = Duration::from_secs(15);

/// How the sender gets a notice's lines; tests pass their own.
pub type TailReader =
    std::sync::Arc<dyn Fn(Notice) -> BoxFuture<'static, Vec<String>> + Send + Sync>;

/// The reader ptraind uses: the journal.
pub fn journal_reader() -> TailReader {
    std::sync::Arc::new(|notice: Notice| async move { read(&notice).await }.boxed())
}

/// Whether messages about this event carry output lines: ends of jobs
/// that ran.
pub fn wanted(n: &Notice) -> bool {
    n.event != NotifyEvent::Started && n.started_at.is_some()
}

/// One line as messages show it: what a terminal would show last of a
/// line rewritten with carriage returns (a progress bar), control
/// characters escaped so a receiver's log or chat is not garbled, cut to
/// [`TAIL_LINE_MAX`] bytes.
fn shape_line(message: &str) -> String {
    let shown = message
        .split('\r')
        .rfind(|part| !part.is_empty())
        .unwrap_or("");
    let mut out = String::with_capacity(shown.len());
    for c in shown.trim_end().chars() {
        // Bidi overrides too: a chat shows them as silently as a terminal.
        if crate::display::is_unsafe(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
        if out.len() > TAIL_LINE_MAX {
            break;
        }
    }
    super::render::clip(&out, TAIL_LINE_MAX)
}

/// The last [`TAIL_LINES`] of `messages` (oldest first), each shaped, all
/// within [`TAIL_MAX`] bytes (older lines dropped first). Pure.
pub fn shape(messages: &[String]) -> Vec<String> {
    let start = messages.len().saturating_sub(TAIL_LINES);
    let mut lines: Vec<String> = messages[start..].iter().map(|m| shape_line(m)).collect();
    let mut total: usize = lines.iter().map(String::len).sum();
    let mut drop = 0;
    while total > TAIL_MAX {
        total -= lines[drop].len();
        drop += 1;
    }
    lines.drain(..drop);
    lines
}

/// The last lines of the run `n` is about; empty when it never ran or the
/// journal cannot be read (logged).
pub async fn read(n: &Notice) -> Vec<String> {
    let Some(started_at) = n.started_at.filter(|_| wanted(n)) else {
        return Vec::new();
    };
    let sel = Selection {
        unit: n.unit.clone(),
        invocation_id: n.invocation_id.clone(),
        started_at,
    };
    let ended_at = n.ended_at.unwrap_or_else(crate::now_micros);
    match tokio::time::timeout(READ_TIMEOUT, read_journal(&sel, ended_at)).await {
        Ok(Ok(messages)) => shape(&messages),
        Ok(Err(e)) => {
            tracing::warn!(PTRAIN_JOB = %n.job_id, error = %e, "cannot read the job's last lines of output; notifying without them");
            Vec::new()
        }
        Err(_) => {
            tracing::warn!(PTRAIN_JOB = %n.job_id, "reading the job's last lines of output took too long; notifying without them");
            Vec::new()
        }
    }
}

/// When the last `journalctl --sync` that completed was started (µs).
static LAST_SYNC: tokio::sync::Mutex<u64> = tokio::sync::Mutex::const_new(0);

/// Makes sure journald has written out everything a job wrote before
/// `ended_at`: one `journalctl --sync` covers every job that ended before
/// it started, so a burst of ends costs a few syncs, not one each (they
/// wait for the one in progress, then find themselves covered).
async fn sync_covering(ended_at: u64) {
    let mut last = LAST_SYNC.lock().await;
    if *last > ended_at {
        return;
    }
    let started = crate::now_micros();
    journal::sync().await;
    *last = started;
}

async fn read_journal(sel: &Selection, ended_at: u64) -> std::io::Result<Vec<String>> {
    // The job's last lines may still sit in journald's sockets.
    sync_covering(ended_at).await;
    let read = {
        let sel = sel.clone();
        tokio::task::spawn_blocking(move || {
            sd_journal::last_since(&sel.unit, sel.started_at, READ_ENTRIES)
        })
    };
    let entries = read.await.map_err(std::io::Error::other)??;
    let mut filter = RunFilter::new(sel);
    Ok(entries
        .into_iter()
        .filter(|e| filter.accept(e))
        .map(|e| e.message)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn keeps_the_last_lines_in_order() {
        let many: Vec<String> = (0..50).map(|k| format!("step {k}")).collect();
        let tail = shape(&many);
        assert_eq!(tail.len(), TAIL_LINES);
        assert_eq!(tail.first().unwrap(), "step 30");
        assert_eq!(tail.last().unwrap(), "step 49");
        assert_eq!(shape(&strings(&["a", "b"])), strings(&["a", "b"]));
        assert!(shape(&[]).is_empty());
    }

    #[test]
    fn escapes_control_characters_and_shows_the_last_progress() {
        let tail = shape(&strings(&[
            "\u{1b}[31mred\u{1b}[0m\tdone\u{7}",
            "epoch 1: 10%\repoch 1: 55%\repoch 1: 100%\r",
            "bell\u{85}next",
            "trailing   ",
        ]));
        assert_eq!(
            tail,
            strings(&[
                "\\u{1b}[31mred\\u{1b}[0m\\tdone\\u{7}",
                "epoch 1: 100%",
                "bell\\u{85}next",
                "trailing",
            ])
        );
        assert!(tail.iter().all(|l| !l.chars().any(char::is_control)));
    }

    #[test]
    fn clips_long_lines_and_the_total() {
        let long = "é".repeat(10_000);
        let tail = shape(&[long.clone(), "\u{1}".repeat(10_000)]);
        assert!(tail.iter().all(|l| l.len() <= TAIL_LINE_MAX), "{tail:?}");
        assert!(tail[0].ends_with('…') && tail[0].starts_with("éé"));
        assert!(tail[1].starts_with("\\u{1}\\u{1}") && tail[1].ends_with('…'));
        let wide: Vec<String> = (0..TAIL_LINES).map(|_| long.clone()).collect();
        let tail = shape(&wide);
        assert!(tail.iter().map(String::len).sum::<usize>() <= TAIL_MAX);
        assert!(!tail.is_empty());
    }

    #[test]
    fn only_ends_of_jobs_that_ran_carry_lines() {
        let mut n = super::super::sender::tests::intent("j", NotifyEvent::Failed, "c").notice;
        assert!(wanted(&n));
        n.event = NotifyEvent::Started;
        assert!(!wanted(&n));
        n.event = NotifyEvent::DependencyFailed;
        n.started_at = None;
        assert!(!wanted(&n));
    }
}
