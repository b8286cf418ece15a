//! SQLite runs in child processes of ptraind, never in the daemon itself:
//! `ptraind accounting write|stream|history|report|usage|window
//! STATE_DIR`, the same binary, as root: one per query, and for the rows of
//! ended runs one stream kept while ends keep coming ([`Stream`]). The daemon's idle RSS has a 20 MiB target (`make
//! bench-ci`); once SQLite had run in it (the start's back-fill, a row
//! written, a query) its code pages, page cache and the heap the back-fill
//! left fragmented stayed resident for the daemon's whole life, about
//! 2 MiB. A child's pages go with it.
//!
//! The child's inputs, and why it may trust them: its arguments and stdin
//! come from ptraind alone (its environment is cleared); the rows it is
//! sent were built by ptraind from root-owned end records, and a query was
//! parsed strictly by ptraind before it was passed on (the child parses it
//! strictly again); `--backfill` reads `STATE/jobs/` (root's) and nothing a
//! user can write. The usage figures in a row are numbers a job's user
//! reported ([`super::usage`], SECURITY.md): bound as SQL parameters, never
//! SQL, and never trusted for anything but the figures themselves.

use std::io::{Read, Write};
use std::path::Path;
#[cfg(not(test))]
use std::process::Stdio;

use serde::{Deserialize, Serialize};

use super::db;
use super::query::{HistoryQuery, HistoryRow, ReportQuery};

/// ptraind's subcommand for the child.
pub const SUBCOMMAND: &str = "accounting";

/// The most bytes of a query's answer ptraind takes from the child: a
/// D-Bus message holds at most 128 MiB, and an answer this large is a
/// query to narrow.
pub const MAX_ANSWER_BYTES: u64 = 64 << 20;

/// What a write reports on its stdout: the rows it was sent and the
/// back-fill's ended records seen, and how many rows were new.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteSummary {
    pub sent: usize,
    pub seen: usize,
    pub added: usize,
}

/// The child's job (its first argument).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    /// Insert the rows of stdin (JSON values, one after the other), then,
    /// with `--backfill`, every ended record of `STATE/jobs/` the database
    /// lacks.
    Write { backfill: bool },
    /// Insert each line of stdin, a JSON array of rows, in a transaction
    /// of its own, and answer each with a line, its [`WriteSummary`];
    /// until the end of stdin. ptraind keeps one open while ends keep
    /// coming ([`Stream`]).
    Stream,
    /// stdin: a [`HistoryQuery`]; stdout: the JSON array of rows.
    History { caller: u32 },
    /// stdin: a [`ReportQuery`]; stdout: the JSON array of report rows.
    Report { caller: u32 },
    /// stdin: nothing; stdout: the decayed GPU-seconds per user and group
    /// of the runs that ended before `until_us` ([`crate::fair_share::Usage`]).
    Usage { until_us: u64, half_life_secs: u64 },
    /// stdin: nothing; stdout: the GPU-seconds per user and bucket
    /// (`ended_us / bucket_us`) of the runs that ended in `[from_us,
    /// until_us)`, for the quotas ([`crate::quota::Quotas::read_back`]).
    Window {
        from_us: u64,
        until_us: u64,
        bucket_us: u64,
    },
}

impl Task {
    fn args(self) -> Vec<String> {
        match self {
            Task::Write { backfill: false } => vec!["write".into()],
            Task::Write { backfill: true } => vec!["write".into(), "--backfill".into()],
            Task::Stream => vec!["stream".into()],
            Task::History { caller } => vec!["history".into(), format!("--caller={caller}")],
            Task::Report { caller } => vec!["report".into(), format!("--caller={caller}")],
            Task::Usage {
                until_us,
                half_life_secs,
            } => vec![
                "usage".into(),
                format!("--until={until_us}"),
                format!("--half-life={half_life_secs}"),
            ],
            Task::Window {
                from_us,
                until_us,
                bucket_us,
            } => vec![
                "window".into(),
                format!("--from={from_us}"),
                format!("--until={until_us}"),
                format!("--bucket={bucket_us}"),
            ],
        }
    }

    /// The child's arguments after `accounting`, as [`Task::args`] makes
    /// them: `(task, state_dir)`.
    pub fn parse(args: &[String]) -> Result<(Task, &Path), String> {
        let usage = "usage: ptraind accounting write [--backfill] STATE_DIR | stream STATE_DIR | history --caller=UID STATE_DIR | report --caller=UID STATE_DIR | usage --until=US --half-life=SECS STATE_DIR | window --from=US --until=US --bucket=US STATE_DIR (ptraind runs it; it is no command for people)";
        let number = |flag: Option<&String>, name: &str| -> Result<u64, String> {
            flag.and_then(|f| f.strip_prefix(name))
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| usage.to_string())
        };
        let caller = |flag: Option<&String>| -> Result<u32, String> {
            flag.and_then(|f| f.strip_prefix("--caller="))
                .and_then(|uid| uid.parse().ok())
                .ok_or_else(|| usage.to_string())
        };
        let task = match args.first().map(String::as_str) {
            Some("write") if args.len() == 2 => Task::Write { backfill: false },
            Some("write") if args.len() == 3 && args[1] == "--backfill" => {
                Task::Write { backfill: true }
            }
            Some("stream") if args.len() == 2 => Task::Stream,
            Some("history") if args.len() == 3 => Task::History {
                caller: caller(args.get(1))?,
            },
            Some("report") if args.len() == 3 => Task::Report {
                caller: caller(args.get(1))?,
            },
            Some("usage") if args.len() == 4 => Task::Usage {
                until_us: number(args.get(1), "--until=")?,
                half_life_secs: number(args.get(2), "--half-life=")?.max(1),
            },
            Some("window") if args.len() == 5 => Task::Window {
                from_us: number(args.get(1), "--from=")?,
                until_us: number(args.get(2), "--until=")?,
                bucket_us: number(args.get(3), "--bucket=")?.max(1),
            },
            _ => return Err(usage.into()),
        };
        let dir = Path::new(args.last().map(String::as_str).unwrap_or_default());
        if !dir.is_absolute() {
            return Err(format!(
                "{}: the state directory must be an absolute path",
                dir.display()
            ));
        }
        Ok((task, dir))
    }
}

/// The child: runs `task` on `STATE_DIR/accounting.sqlite` with `input` as
/// its stdin and `output` as its stdout.
pub fn run_child(
    task: Task,
    state_dir: &Path,
    input: impl Read,
    mut output: impl Write,
) -> Result<(), String> {
    let path = db::db_path(state_dir);
    if task == Task::Stream {
        return stream_rows(&path, input, output);
    }
    let answer = match task {
        Task::Stream => unreachable!("answered above"),
        Task::Write { backfill } => {
            let mut rows = Vec::new();
            for row in serde_json::Deserializer::from_reader(input).into_iter::<HistoryRow>() {
                rows.push(row.map_err(|e| format!("a row from ptraind: {e}"))?);
            }
            let mut conn = db::open_for_writing(&path).map_err(|e| e.to_string())?;
            let mut summary = WriteSummary {
                sent: rows.len(),
                ..WriteSummary::default()
            };
            summary.added = db::insert_rows(&mut conn, &rows)
                .map_err(|e| format!("accounting database {}: {e}", path.display()))?;
            if backfill {
                let (seen, added) = db::backfill(&mut conn, state_dir)?;
                summary.seen = seen;
                summary.added += added;
            }
            serde_json::to_string(&summary)
        }
        Task::History { caller } => {
            let q: HistoryQuery = parse_query(input)?;
            serde_json::to_string(&db::history(&path, &q, caller).map_err(|e| e.to_string())?)
        }
        Task::Report { caller } => {
            let q: ReportQuery = parse_query(input)?;
            serde_json::to_string(&db::report(&path, &q, caller).map_err(|e| e.to_string())?)
        }
        Task::Usage {
            until_us,
            half_life_secs,
        } => {
            let half_life = std::time::Duration::from_secs(half_life_secs);
            serde_json::to_string(
                &db::usage(&path, until_us, half_life).map_err(|e| e.to_string())?,
            )
        }
        Task::Window {
            from_us,
            until_us,
            bucket_us,
        } => serde_json::to_string(
            &db::window(&path, from_us, until_us, bucket_us).map_err(|e| e.to_string())?,
        ),
    }
    .map_err(|e| format!("cannot write the answer: {e}"))?;
    output
        .write_all(answer.as_bytes())
        .and_then(|()| output.flush())
        .map_err(|e| format!("cannot write the answer to ptraind: {e}"))
}

/// [`Task::Stream`] in the child: a batch a line, an answer a line.
fn stream_rows(path: &Path, input: impl Read, mut output: impl Write) -> Result<(), String> {
    use std::io::BufRead;
    let mut conn = db::open_for_writing(path).map_err(|e| e.to_string())?;
    for line in std::io::BufReader::new(input).lines() {
        let line = line.map_err(|e| format!("reading rows from ptraind: {e}"))?;
        let rows: Vec<HistoryRow> = serde_json::from_str(&line)
            .map_err(|e| format!("a batch of rows from ptraind: {e}"))?;
        let added = db::insert_rows(&mut conn, &rows)
            .map_err(|e| format!("accounting database {}: {e}", path.display()))?;
        let summary = WriteSummary {
            sent: rows.len(),
            seen: 0,
            added,
        };
        let mut answer = serde_json::to_vec(&summary).expect("a summary always serialises");
        answer.push(b'\n');
        output
            .write_all(&answer)
            .and_then(|()| output.flush())
            .map_err(|e| format!("cannot answer ptraind: {e}"))?;
    }
    Ok(())
}

fn parse_query<T: serde::de::DeserializeOwned>(input: impl Read) -> Result<T, String> {
    serde_json::from_reader(input).map_err(|e| format!("the query from ptraind: {e}"))
}

/// ptraind's side: runs the child for `task` with `input` on its stdin and
/// returns its stdout (at most [`MAX_ANSWER_BYTES`]), from async code and
/// with tokio's process support, which ptraind's log archiving keeps in use
/// anyway: no thread of its own, none of whose stack or code would stay
/// resident. The child is ptraind's own binary (`/proc/self/exe`: the very
/// version that runs, even if the file was replaced since), spawned without
/// a `pre_exec` hook (so with posix_spawn, not a fork of the daemon's page
/// tables), with an empty environment and ptraind's stderr (the journal);
/// it is killed if the caller gives up.
#[cfg(not(test))]
pub async fn run(task: Task, state_dir: &Path, input: Vec<u8>) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut child = spawn(task, state_dir)?;
    // All of the input, then all of the answer: the child reads its whole
    // stdin before it writes a byte ([`run_child`]), so the two pipes
    // cannot deadlock.
    let fed = {
        let mut stdin = child.stdin.take().expect("piped");
        stdin.write_all(&input).await
        // Dropped here: the child sees the end of its input.
    };
    let mut answer = Vec::new();
    let read = child
        .stdout
        .take()
        .expect("piped")
        .take(MAX_ANSWER_BYTES + 1)
        .read_to_end(&mut answer)
        .await;
    if answer.len() as u64 > MAX_ANSWER_BYTES {
        let _ = child.start_kill();
    }
    let status = child
        .wait()
        .await
        .map_err(|e| format!("`ptraind {SUBCOMMAND}`: {e}"))?;
    if answer.len() as u64 > MAX_ANSWER_BYTES {
        return Err(format!(
            "the answer is over {} MiB; narrow the query (--since, --until, --user, -n)",
            MAX_ANSWER_BYTES >> 20
        ));
    }
    if !status.success() {
        return Err(format!(
            "`ptraind {SUBCOMMAND} {}` failed ({status}); its error is in ptraind's journal",
            task.args()[0]
        ));
    }
    fed.map_err(|e| format!("writing to `ptraind {SUBCOMMAND}`: {e}"))?;
    read.map_err(|e| format!("reading `ptraind {SUBCOMMAND}`'s answer: {e}"))?;
    String::from_utf8(answer).map_err(|e| format!("`ptraind {SUBCOMMAND}`'s answer: {e}"))
}

/// The child for `task`, its stdin and stdout piped to ptraind (see
/// [`run`] for how and why).
#[cfg(not(test))]
fn spawn(task: Task, state_dir: &Path) -> Result<tokio::process::Child, String> {
    tokio::process::Command::new("/proc/self/exe")
        .arg(SUBCOMMAND)
        .args(task.args())
        .arg(state_dir)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            format!(
                "cannot start `ptraind {SUBCOMMAND} {}`: {e}",
                task.args()[0]
            )
        })
}

/// [`run`] in the crate's own unit tests, where /proc/self/exe is the
/// test binary (which would take the arguments for test names): the
/// child's work runs in-process. The integration tests run the real child.
#[cfg(test)]
pub async fn run(task: Task, state_dir: &Path, input: Vec<u8>) -> Result<String, String> {
    let mut answer = Vec::new();
    run_child(task, state_dir, &input[..], &mut answer)?;
    String::from_utf8(answer).map_err(|e| e.to_string())
}

/// A `ptraind accounting stream` child, kept while ends keep coming: a
/// burst, a sweep or a run of jobs one after another costs one process
/// start and one database open, not one of each per end (about 5 ms of
/// CPU each on a 2-core host, most of what accounting cost a job). The
/// writer closes it once no row came for [`STREAM_IDLE`], so SQLite stays
/// out of memory between bursts. Its
/// stdin and stdout are pipes to ptraind alone; it dies with them (kill -9
/// of ptraind included: its stdin ends), and is killed if dropped.
#[cfg(not(test))]
pub struct Stream {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::BufReader<tokio::process::ChildStdout>,
}

/// How long a [`Stream`] waits for more rows before it is closed: longer
/// than the gap between the ends of jobs run one after another on a busy
/// host, for a child of about 3 MiB.
pub const STREAM_IDLE: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(not(test))]
impl Stream {
    /// Starts the child as [`run`] does.
    pub fn start(state_dir: &Path) -> Result<Stream, String> {
        let mut child = spawn(Task::Stream, state_dir)?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = tokio::io::BufReader::new(child.stdout.take().expect("piped"));
        Ok(Stream {
            child,
            stdin,
            stdout,
        })
    }

    /// Writes one batch in one transaction; its summary.
    pub async fn write(&mut self, rows: &[HistoryRow]) -> Result<WriteSummary, String> {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let mut batch = serde_json::to_vec(rows).map_err(|e| e.to_string())?;
        batch.push(b'\n');
        self.stdin
            .write_all(&batch)
            .await
            .map_err(|e| format!("writing to `ptraind {SUBCOMMAND} stream`: {e}"))?;
        let mut answer = String::new();
        self.stdout
            .read_line(&mut answer)
            .await
            .map_err(|e| format!("reading `ptraind {SUBCOMMAND} stream`'s answer: {e}"))?;
        if answer.is_empty() {
            return Err(format!(
                "`ptraind {SUBCOMMAND} stream` ended; its error is in ptraind's journal"
            ));
        }
        serde_json::from_str(&answer)
            .map_err(|e| format!("`ptraind {SUBCOMMAND} stream`'s summary {answer:?}: {e}"))
    }

    /// Ends its input and waits for it to exit.
    pub async fn close(self) {
        let Stream {
            mut child, stdin, ..
        } = self;
        drop(stdin);
        let _ = child.wait().await;
    }
}

/// [`Stream`] in the crate's own unit tests: each batch is a write of its
/// own, in-process, as [`run`] is there.
#[cfg(test)]
pub struct Stream {
    state_dir: std::path::PathBuf,
}

#[cfg(test)]
impl Stream {
    pub fn start(state_dir: &Path) -> Result<Stream, String> {
        Ok(Stream {
            state_dir: state_dir.to_owned(),
        })
    }

    pub async fn write(&mut self, rows: &[HistoryRow]) -> Result<WriteSummary, String> {
        write(&self.state_dir, rows, false).await
    }

    pub async fn close(self) {}
}

/// Writes rows (and back-fills, if asked) through the child.
pub async fn write(
    state_dir: &Path,
    rows: &[HistoryRow],
    backfill: bool,
) -> Result<WriteSummary, String> {
    let mut input = Vec::new();
    for row in rows {
        serde_json::to_writer(&mut input, row).map_err(|e| e.to_string())?;
        input.push(b'\n');
    }
    let answer = run(Task::Write { backfill }, state_dir, input).await?;
    serde_json::from_str(&answer)
        .map_err(|e| format!("`ptraind {SUBCOMMAND} write`'s summary {answer:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_child_parses_exactly_the_arguments_ptraind_gives_it() {
        for task in [
            Task::Write { backfill: false },
            Task::Write { backfill: true },
            Task::Stream,
            Task::History { caller: 1000 },
            Task::Report { caller: 0 },
            Task::Usage {
                until_us: 1_700_000_000_000_000,
                half_life_secs: 604_800,
            },
            Task::Window {
                from_us: 1,
                until_us: 2,
                bucket_us: 3,
            },
        ] {
            let mut a = task.args();
            a.push("/var/lib/ptrain".into());
            let (parsed, dir) = Task::parse(&a).unwrap();
            assert_eq!(parsed, task);
            assert_eq!(dir, Path::new("/var/lib/ptrain"));
        }
        for bad in [
            &["write"][..],
            &["write", "--backfill", "x", "/s"],
            &["history", "/s"],
            &["history", "--caller=bob", "/s"],
            &["report", "--caller=", "/s"],
            &["usage", "--until=x", "--half-life=60", "/s"],
            &["usage", "--until=1", "/s"],
            &["window", "--from=1", "--until=2", "/s"],
            &["window", "--from=1", "--until=2", "--bucket=-3", "/s"],
            &["drop", "/s"],
        ] {
            assert!(Task::parse(&args(bad)).is_err(), "{bad:?}");
        }
        let e = Task::parse(&args(&["write", "state"])).unwrap_err();
        assert!(e.contains("absolute"), "{e}");
    }

    /// A run of `uid` that ended at 4 s, 2 GPUs.
    fn row(id: &str, uid: u32) -> HistoryRow {
        db::tests::row(id, uid, &format!("u{uid}"), 4, "succeeded", 2)
    }

    #[test]
    fn the_stream_child_answers_each_batch_with_a_line_and_doubles_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        let mut input = Vec::new();
        for batch in [
            vec![row("a", 1000), row("b", 1001)],
            vec![],
            vec![row("a", 1000)],
        ] {
            serde_json::to_writer(&mut input, &batch).unwrap();
            input.push(b'\n');
        }
        let mut out = Vec::new();
        run_child(Task::Stream, state, &input[..], &mut out).unwrap();
        let answers: Vec<WriteSummary> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let counts: Vec<(usize, usize)> = answers.iter().map(|a| (a.sent, a.added)).collect();
        assert_eq!(counts, [(2, 2), (0, 0), (1, 0)]);
        // A line that is not a batch ends the child with the reason.
        let e = run_child(Task::Stream, state, &b"{}\n"[..], Vec::new()).unwrap_err();
        assert!(e.contains("a batch of rows from ptraind"), "{e}");
    }

    #[test]
    fn rows_written_by_the_child_are_what_its_queries_answer_and_none_is_doubled() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        std::fs::create_dir(state.join("jobs")).unwrap();
        let mut input = Vec::new();
        for r in [row("a", 1000), row("b", 1001), row("a", 1000)] {
            serde_json::to_writer(&mut input, &r).unwrap();
            input.push(b'\n');
        }
        let mut out = Vec::new();
        run_child(Task::Write { backfill: true }, state, &input[..], &mut out).unwrap();
        let summary: WriteSummary = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            summary,
            WriteSummary {
                sent: 3,
                seen: 0,
                added: 2
            }
        );

        // ptraind's side frames the rows as the child reads them.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let s = rt
            .block_on(write(state, &[row("c", 1000), row("b", 1001)], false))
            .unwrap();
        assert_eq!((s.sent, s.added), (2, 1));

        let mut out = Vec::new();
        let q = serde_json::to_vec(&HistoryQuery::default()).unwrap();
        run_child(Task::History { caller: 1000 }, state, &q[..], &mut out).unwrap();
        let mut rows: Vec<HistoryRow> = serde_json::from_slice(&out).unwrap();
        // All ended at the same time: their order is not the point.
        rows.sort_by(|a, b| a.id.cmp(&b.id));
        assert_eq!(
            rows,
            vec![row("a", 1000), row("c", 1000)],
            "a user sees only their runs"
        );

        let mut out = Vec::new();
        run_child(Task::History { caller: 0 }, state, &q[..], &mut out).unwrap();
        let rows: Vec<HistoryRow> = serde_json::from_slice(&out).unwrap();
        assert_eq!(rows.len(), 3, "root sees everyone's");
    }

    #[test]
    fn the_child_refuses_what_ptraind_would_never_send() {
        let dir = tempfile::tempdir().unwrap();
        let mut out = Vec::new();
        let e = run_child(
            Task::History { caller: 0 },
            dir.path(),
            &br#"{"user":"bob","drop":"table"}"#[..],
            &mut out,
        )
        .unwrap_err();
        assert!(e.contains("the query from ptraind"), "{e}");
        let e = run_child(
            Task::Write { backfill: false },
            dir.path(),
            &b"{\"id\": 1}"[..],
            &mut out,
        )
        .unwrap_err();
        assert!(e.contains("a row from ptraind"), "{e}");
        assert!(out.is_empty());
        // Nothing was made of a refused write.
        assert!(!db::db_path(dir.path()).exists());
    }
}
