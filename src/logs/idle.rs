//! The idle-output watchdog: a job that writes nothing for its
//! `idle_timeout` is reported to the state task, which stops it.
//!
//! Driven by the journal, not by looking at each job: one `journalctl -f`
//! child prints the unit name of every entry in the jobs' slice, each line
//! moves that unit's last-output time, and one timer waits for the earliest
//! deadline ([`IdleTracker`], pure). The child only runs while some job is
//! watched. While it is not running no deadline can pass: a job is never
//! stopped for silence ptraind could not have heard.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{info, warn};

/// Units watched for output and when each last wrote.
#[derive(Debug, Default)]
pub struct IdleTracker {
    units: HashMap<String, Watched>,
}

#[derive(Debug)]
struct Watched {
    timeout: Duration,
    last_output: Instant,
}

impl IdleTracker {
    /// Watches `unit` (again) as if it had just written.
    pub fn track(&mut self, unit: &str, timeout: Duration, now: Instant) {
        self.units.insert(
            unit.to_owned(),
            Watched {
                timeout,
                last_output: now,
            },
        );
    }

    pub fn untrack(&mut self, unit: &str) {
        self.units.remove(unit);
    }

    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    /// A journal entry from `unit`; other units are ignored.
    pub fn output(&mut self, unit: &str, now: Instant) {
        if let Some(w) = self.units.get_mut(unit) {
            w.last_output = w.last_output.max(now);
        }
    }

    /// Every watched unit counts as having written now (the journal
    /// reader restarted and may have missed lines).
    pub fn reset_all(&mut self, now: Instant) {
        for w in self.units.values_mut() {
            w.last_output = now;
        }
    }

    /// The earliest time a watched unit can become idle.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.units.values().map(|w| w.last_output + w.timeout).min()
    }

    /// Units silent for their whole timeout at `now`; they are no longer
    /// watched (the state task stops them, or tracks them again).
    pub fn expire(&mut self, now: Instant) -> Vec<String> {
        let mut idle: Vec<String> = self
            .units
            .iter()
            .filter(|(_, w)| w.last_output + w.timeout <= now)
            .map(|(u, _)| u.clone())
            .collect();
        idle.sort();
        for u in &idle {
            self.units.remove(u);
        }
        idle
    }
}

pub(crate) enum IdleCommand {
    Track { unit: String, timeout: Duration },
    Untrack { unit: String },
}

/// How long to wait before starting the journal reader again after it
/// exited, doubling up to the cap.
const RESPAWN_FIRST: Duration = Duration::from_secs(1);
const RESPAWN_MAX: Duration = Duration::from_secs(60);

/// Runs the watchdog until the command channel closes; calls `on_idle`
/// with each unit whose deadline passed.
pub(crate) async fn run(
    slice: String,
    mut commands: mpsc::UnboundedReceiver<IdleCommand>,
    on_idle: impl Fn(String) + Send + 'static,
) {
    let mut tracker = IdleTracker::default();
    let mut reader: Option<Reader> = None;
    let mut respawn_at: Option<Instant> = None;
    let mut backoff = RESPAWN_FIRST;
    loop {
        if tracker.is_empty() {
            // Nobody to watch: stop reading the journal.
            reader = None;
            respawn_at = None;
        } else if reader.is_none() && respawn_at.is_none_or(|t| t <= Instant::now()) {
            respawn_at = None;
            match Reader::spawn(&slice) {
                Ok(r) => {
                    reader = Some(r);
                    tracker.reset_all(Instant::now());
                }
                Err(e) => {
                    warn!(error = %e, "cannot run journalctl for the idle-output watchdog; idle jobs are not stopped until it runs");
                    respawn_at = Some(Instant::now() + backoff);
                    backoff = (backoff * 2).min(RESPAWN_MAX);
                }
            }
        }
        // No reader, no deadline: silence nobody heard is not idleness.
        let deadline = reader.as_ref().and(tracker.next_deadline());
        tokio::select! {
            command = commands.recv() => match command {
                None => return,
                Some(IdleCommand::Track { unit, timeout }) => tracker.track(&unit, timeout, Instant::now()),
                Some(IdleCommand::Untrack { unit }) => tracker.untrack(&unit),
            },
            line = async { reader.as_mut().expect("guarded").lines.next_line().await }, if reader.is_some() => {
                match line {
                    Ok(Some(unit)) => {
                        tracker.output(unit.trim(), Instant::now());
                        backoff = RESPAWN_FIRST;
                    }
                    Ok(None) | Err(_) => {
                        warn!("the idle-output watchdog's journalctl exited; starting it again");
                        reader = None;
                        respawn_at = Some(Instant::now() + backoff);
                        backoff = (backoff * 2).min(RESPAWN_MAX);
                    }
                }
            }
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                for unit in tracker.expire(Instant::now()) {
                    info!(unit, "no output for its idle_timeout");
                    on_idle(unit);
                }
            }
            _ = tokio::time::sleep_until(respawn_at.unwrap_or_else(Instant::now)), if respawn_at.is_some() && reader.is_none() => {}
        }
    }
}

/// `journalctl -f` printing the unit of each new entry in the slice.
struct Reader {
    _child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Reader {
    fn spawn(slice: &str) -> std::io::Result<Reader> {
        let mut cmd = super::journal::journalctl();
        cmd.args([
            "--follow",
            "--lines=0",
            "-o",
            "cat",
            "--output-fields=_SYSTEMD_UNIT",
        ])
        .arg(format!("_SYSTEMD_SLICE={slice}"))
        .stdout(Stdio::piped());
        let mut child = cmd.spawn()?;
        let stdout = child.stdout.take().expect("piped");
        Ok(Reader {
            _child: child,
            lines: BufReader::new(stdout).lines(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn silent_unit_expires_at_its_deadline_and_chatty_one_does_not() {
        let t0 = Instant::now();
        let mut t = IdleTracker::default();
        t.track("silent", 10 * S, t0);
        t.track("chatty", 10 * S, t0);
        assert_eq!(t.next_deadline(), Some(t0 + 10 * S));
        for k in 1..=12 {
            t.output("chatty", t0 + k * S);
        }
        t.output("unknown", t0 + 5 * S);
        assert!(t.expire(t0 + 9 * S).is_empty());
        assert_eq!(t.expire(t0 + 10 * S), ["silent"]);
        // Fired once, then no longer watched.
        assert!(t.expire(t0 + 11 * S).is_empty());
        assert_eq!(t.next_deadline(), Some(t0 + 22 * S));
        assert_eq!(t.expire(t0 + 22 * S), ["chatty"]);
        assert!(t.is_empty() && t.next_deadline().is_none());
    }

    #[test]
    fn untrack_and_reset_move_deadlines() {
        let t0 = Instant::now();
        let mut t = IdleTracker::default();
        t.track("a", 5 * S, t0);
        t.track("b", 3 * S, t0);
        t.untrack("b");
        assert_eq!(t.next_deadline(), Some(t0 + 5 * S));
        t.reset_all(t0 + 4 * S);
        assert!(t.expire(t0 + 8 * S).is_empty());
        assert_eq!(t.expire(t0 + 9 * S), ["a"]);
        // Tracking again (after a GPU-busy reprieve) starts a new window.
        t.track("a", 5 * S, t0 + 9 * S);
        assert_eq!(t.next_deadline(), Some(t0 + 14 * S));
        // An output stamped earlier than the last never moves it back.
        t.output("a", t0);
        assert_eq!(t.next_deadline(), Some(t0 + 14 * S));
    }
}
