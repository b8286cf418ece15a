//! One job's output in the journal: which entries are one run, and
//! `journalctl -o json` for `ptrain logs --follow` (archives and
//! notification tails read in-process, [`super::sd_journal`]).
//!
//! journald adds `_SYSTEMD_INVOCATION_ID` (and `_SYSTEMD_SLICE`) by looking
//! at the writing process's cgroup; lines it reads after that process
//! exited (the last lines of a short job, a traceback) carry only
//! `_SYSTEMD_UNIT` from the stream's header. So a run's output is selected
//! by unit from the run's start on, and an entry is dropped only when it
//! provably belongs to another run ([`RunFilter`]): it names another
//! invocation, or came on a stream that did.

use std::collections::HashSet;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

/// The fields read besides the cursor and timestamps journalctl always
/// prints.
const OUTPUT_FIELDS: &str = "--output-fields=MESSAGE,_SYSTEMD_INVOCATION_ID,_STREAM_ID";

/// How long `journalctl --sync` may take before ptraind goes on without it.
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);

/// Which journal entries are one run of a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    pub unit: String,
    pub invocation_id: Option<String>,
    /// When the run's process started, µs since the epoch.
    pub started_at: u64,
}

/// The line a reader gets in place of a run's output the journal no
/// longer has, with the time it is filed under: journald's oldest entry
/// is newer than where the read begins (the run's start, or `since`), so
/// whatever the run wrote before it went when journald removed its
/// oldest files to keep within its size limits. None when the journal
/// reaches back far enough (or is empty).
pub fn lost_head_notice(
    sel: &Selection,
    since: u64,
    journal_oldest: Option<u64>,
) -> Option<(u64, String)> {
    let oldest = journal_oldest?;
    if oldest <= sel.started_at.max(since) {
        return None;
    }
    let when =
        humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_micros(oldest));
    Some((
        oldest - 1,
        format!(
            "[ptrain] this job's output before {when} is no longer in the journal: journald \
             removed its oldest entries to keep within its size limit (SystemMaxUse= or \
             RuntimeMaxUse= in journald.conf); what follows is what remains"
        ),
    ))
}

/// Where a read begins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// Entries at or after this time (µs); the run's start at the earliest.
    Since(u64),
    /// Entries after the one with this cursor.
    AfterCursor(String),
}

/// journalctl arguments reading `sel` from `start`.
pub fn args(sel: &Selection, start: &Start, follow: bool) -> Vec<String> {
    let mut args = vec![
        "-o".to_owned(),
        "json".to_owned(),
        // Long messages in full instead of null.
        "--all".to_owned(),
        OUTPUT_FIELDS.to_owned(),
    ];
    match start {
        Start::Since(t) => {
            // Whole seconds: entries of the second the run started in are
            // read and [`RunFilter`] drops those before the start.
            args.push(format!("--since=@{}", t.max(&sel.started_at) / 1_000_000));
        }
        Start::AfterCursor(c) => args.push(format!("--after-cursor={c}")),
    }
    if follow {
        args.push("--follow".to_owned());
        // With --follow journalctl shows only the last 10 unless told.
        args.push("--no-tail".to_owned());
    }
    args.push(format!("_SYSTEMD_UNIT={}", sel.unit));
    args
}

/// `journalctl -q --no-pager`, killed with ptraind: a reader that outlived
/// the daemon would hold a client's pipe open forever.
pub fn journalctl() -> tokio::process::Command {
    let mut cmd = journalctl_oneshot();
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork
    // and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// The blocking twin of [`journalctl`], for `--sync` where journald has
/// no varlink socket: it ends by itself, so no PR_SET_PDEATHSIG. Without a
/// `pre_exec` hook std spawns with posix_spawn (vfork) instead of fork: a
/// fork copies the page tables of the whole daemon, whose memory grows
/// with the history (`make bench`: at 100,000 jobs of history, fork and
/// unmap of those copies were half of ptraind's CPU per job when this ran
/// twice per ended job).
pub fn journalctl_blocking() -> std::process::Command {
    let mut cmd = std::process::Command::new("journalctl");
    cmd.args(["-q", "--no-pager"]).stdin(Stdio::null());
    cmd
}

/// `journalctl -q --no-pager` for a read that ends by itself (`--sync`,
/// no `--follow`), from async code: no `pre_exec`, so it is spawned
/// without copying the daemon's page tables (see [`journalctl_blocking`]);
/// `kill_on_drop` ends it if its reader gives up.
pub fn journalctl_oneshot() -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("journalctl");
    cmd.args(["-q", "--no-pager"])
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// The nice value of the archiver thread: it yields the CPU to systemd
/// starting the next job and to ptraind.
pub const BACKGROUND_NICE: libc::c_int = 10;

/// Lowers the calling thread (and what it spawns, which inherits it) to
/// [`BACKGROUND_NICE`]: on Linux the nice value is per thread.
pub fn lower_this_thread_priority() {
    // SAFETY: gettid has no preconditions; setpriority changes only this
    // thread's scheduling.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, BACKGROUND_NICE);
    }
}

/// Makes journald write out everything it has received so far, stream
/// lines still queued in its sockets included (it handles the request
/// after pending input). Without it the last lines of a job that just
/// ended may not be readable yet.
pub async fn sync() {
    if tokio::task::spawn_blocking(sync_blocking).await.is_err() {
        tracing::warn!("the journal sync task failed; the last lines of a job may be missing");
    }
}

/// The blocking twin of [`sync`]: over journald's varlink socket, or with
/// `journalctl --sync` where there is none (systemd before 245).
pub fn sync_blocking() {
    let e = match super::sd_journal::sync_over_varlink(SYNC_TIMEOUT) {
        Ok(()) => return,
        Err(e) => e,
    };
    if !matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
    ) {
        tracing::warn!(error = %e, "cannot sync the journal; the last lines of a job may be missing");
        return;
    }
    let status = journalctl_blocking()
        .arg("--sync")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !status.is_ok_and(|s| s.success()) {
        tracing::warn!("journalctl --sync failed; the last lines of a job may be missing");
    }
}

/// One journal entry as far as output goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub cursor: String,
    /// µs since the epoch, when journald received it.
    pub realtime: u64,
    pub message: String,
    pub invocation: Option<String>,
    pub stream: Option<String>,
}

/// Parses one line of `journalctl -o json`; None for anything else.
pub fn parse_entry(line: &str) -> Option<Entry> {
    let Value::Object(map) = serde_json::from_str::<Value>(line).ok()? else {
        return None;
    };
    let cursor = map.get("__CURSOR")?.as_str()?.to_owned();
    let realtime = map.get("__REALTIME_TIMESTAMP")?.as_str()?.parse().ok()?;
    Some(Entry {
        cursor,
        realtime,
        message: map.get("MESSAGE").and_then(text).unwrap_or_default(),
        invocation: map.get("_SYSTEMD_INVOCATION_ID").and_then(text),
        stream: map.get("_STREAM_ID").and_then(text),
    })
}

/// A journal JSON field value as text: a string; bytes (non-UTF-8 or with
/// control characters) as an array of numbers; several values as an array.
fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) if items.iter().all(Value::is_u64) => {
            let bytes: Vec<u8> = items
                .iter()
                .filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
                .collect();
            Some(String::from_utf8_lossy(&bytes).into_owned())
        }
        Value::Array(items) => items.first().and_then(text),
        _ => None,
    }
}

/// Decides, entry by entry in journal order, which belong to one run.
#[derive(Debug)]
pub struct RunFilter {
    invocation: Option<String>,
    started_at: u64,
    ours: HashSet<String>,
    theirs: HashSet<String>,
}

impl RunFilter {
    pub fn new(sel: &Selection) -> RunFilter {
        RunFilter {
            invocation: sel.invocation_id.clone(),
            started_at: sel.started_at,
            ours: HashSet::new(),
            theirs: HashSet::new(),
        }
    }

    pub fn accept(&mut self, e: &Entry) -> bool {
        if e.realtime < self.started_at {
            return false;
        }
        match (&e.invocation, &self.invocation) {
            (Some(theirs), Some(ours)) => {
                let mine = theirs == ours;
                if let Some(stream) = &e.stream {
                    if mine {
                        self.ours.insert(stream.clone());
                    } else if !self.ours.contains(stream) {
                        self.theirs.insert(stream.clone());
                    }
                }
                mine
            }
            (_, None) => true,
            (None, Some(_)) => e.stream.as_ref().is_none_or(|s| !self.theirs.contains(s)),
        }
    }
}

/// Accepted entries of a running journalctl, in order.
pub struct EntryStream {
    _child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl EntryStream {
    pub fn spawn(sel: &Selection, start: &Start, follow: bool) -> std::io::Result<EntryStream> {
        use tokio::io::AsyncBufReadExt;
        let mut cmd = journalctl();
        cmd.args(args(sel, start, follow)).stdout(Stdio::piped());
        let mut child = cmd.spawn()?;
        let stdout = child.stdout.take().expect("piped");
        Ok(EntryStream {
            _child: child,
            lines: tokio::io::BufReader::new(stdout).lines(),
        })
    }

    /// The next entry (any run's; filter them), None at the end.
    pub async fn next(&mut self) -> std::io::Result<Option<Entry>> {
        loop {
            match self.lines.next_line().await? {
                None => return Ok(None),
                Some(line) => {
                    if let Some(e) = parse_entry(&line) {
                        return Ok(Some(e));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(inv: Option<&str>) -> Selection {
        Selection {
            unit: "ptrain-job@a.service".into(),
            invocation_id: inv.map(str::to_owned),
            started_at: 1_000_000_000,
        }
    }

    #[test]
    fn a_journal_newer_than_the_read_says_where_output_is_missing() {
        let run = sel(None);
        // The journal reaches back past the start: nothing to say.
        assert_eq!(lost_head_notice(&run, 0, Some(999_000_000)), None);
        assert_eq!(lost_head_notice(&run, 0, Some(1_000_000_000)), None);
        assert_eq!(lost_head_notice(&run, 0, None), None);
        // Its oldest entry came after the run started: the head is gone,
        // and the notice is filed just before what remains.
        let (t, text) = lost_head_notice(&run, 0, Some(1_000_000_000 + 5_000_000)).unwrap();
        assert_eq!(t, 1_005_000_000 - 1);
        assert!(text.contains("before 1970-01-01T00:16:45Z"), "{text}");
        assert!(text.contains("SystemMaxUse="), "{text}");
        // A read that begins after the oldest entry lost nothing it asked for.
        assert_eq!(
            lost_head_notice(&run, 1_006_000_000, Some(1_005_000_000)),
            None
        );
        assert!(lost_head_notice(&run, 1_004_000_000, Some(1_005_000_000)).is_some());
    }

    fn entry(t: u64, inv: Option<&str>, stream: Option<&str>) -> Entry {
        Entry {
            cursor: format!("c{t}"),
            realtime: t,
            message: "m".into(),
            invocation: inv.map(str::to_owned),
            stream: stream.map(str::to_owned),
        }
    }

    #[test]
    fn parses_text_binary_and_multi_valued_messages() {
        let e = parse_entry(
            r#"{"__CURSOR":"s=1","__REALTIME_TIMESTAMP":"1795969940951398","MESSAGE":"hello","_SYSTEMD_INVOCATION_ID":"abc","_STREAM_ID":"s1"}"#,
        )
        .unwrap();
        assert_eq!(
            (
                e.realtime,
                e.message.as_str(),
                e.invocation.as_deref(),
                e.stream.as_deref()
            ),
            (1795969940951398, "hello", Some("abc"), Some("s1"))
        );
        let e = parse_entry(
            r#"{"__CURSOR":"s=2","__REALTIME_TIMESTAMP":"5","MESSAGE":[98,105,110,1,255,120]}"#,
        )
        .unwrap();
        assert_eq!(e.message, "bin\u{1}\u{fffd}x");
        assert_eq!(e.invocation, None);
        let e = parse_entry(r#"{"__CURSOR":"s=3","__REALTIME_TIMESTAMP":"5","MESSAGE":["a","b"]}"#)
            .unwrap();
        assert_eq!(e.message, "a");
        let e =
            parse_entry(r#"{"__CURSOR":"s=4","__REALTIME_TIMESTAMP":"5","MESSAGE":null}"#).unwrap();
        assert_eq!(e.message, "");
        for bad in [
            "",
            "nope",
            "[]",
            r#"{"MESSAGE":"x"}"#,
            r#"{"__CURSOR":"c","__REALTIME_TIMESTAMP":"x"}"#,
        ] {
            assert!(parse_entry(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn filter_keeps_late_lines_without_invocation_and_drops_other_runs() {
        let mut f = RunFilter::new(&sel(Some("ours")));
        let t = 1_000_000_000;
        // Before this run started: an earlier run of the same unit name.
        assert!(!f.accept(&entry(t - 1, Some("ours"), Some("s1"))));
        assert!(f.accept(&entry(t, Some("ours"), Some("s1"))));
        // Another run's stream, then its late lines without invocation id.
        assert!(!f.accept(&entry(t + 1, Some("old"), Some("s0"))));
        assert!(!f.accept(&entry(t + 2, None, Some("s0"))));
        // Our late lines (the process already exited) are kept, whether
        // their stream was seen with our id or never seen at all.
        assert!(f.accept(&entry(t + 3, None, Some("s1"))));
        assert!(f.accept(&entry(t + 4, None, Some("s9"))));
        assert!(f.accept(&entry(t + 5, None, None)));
        // A stream known to be ours never turns theirs.
        assert!(!f.accept(&entry(t + 6, Some("old"), Some("s1"))));
        assert!(f.accept(&entry(t + 7, None, Some("s1"))));
        // Without a known invocation id, everything since the start.
        let mut f = RunFilter::new(&sel(None));
        assert!(f.accept(&entry(t, Some("x"), None)) && !f.accept(&entry(t - 1, None, None)));
    }

    #[test]
    fn args_select_by_unit_from_start_or_cursor() {
        let s = sel(Some("ours"));
        let a = args(&s, &Start::Since(0), false);
        assert!(a.contains(&"--since=@1000".to_owned()), "{a:?}");
        assert_eq!(a.last().unwrap(), "_SYSTEMD_UNIT=ptrain-job@a.service");
        assert!(!a.iter().any(|x| x == "--follow"));
        let a = args(&s, &Start::Since(2_500_000_000), true);
        assert!(a.contains(&"--since=@2500".to_owned()), "{a:?}");
        assert!(a.contains(&"--follow".to_owned()) && a.contains(&"--no-tail".to_owned()));
        let a = args(&s, &Start::AfterCursor("s=1;i=2".into()), true);
        assert!(a.contains(&"--after-cursor=s=1;i=2".to_owned()), "{a:?}");
        assert!(!a.iter().any(|x| x.starts_with("--since")));
    }
}
