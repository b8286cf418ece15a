//! ptrain: the user's command line for ptraind.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Parser, Subcommand};
use futures_util::StreamExt;
use tokio::sync::mpsc::UnboundedReceiver;

use ptrain::api::Daemon1Proxy;
use ptrain::config::{Config, DEFAULT_CONFIG_PATH};
use ptrain::display::escape;
use ptrain::spec::{parse_spec, spool_file_stem, MAX_SPEC_BYTES};
use ptrain::store::{signal_name, RejectRecord};
use ptrain::views::{GpusView, JobView};

const EXIT_FAILURE: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_NO_DAEMON: u8 = 3;

/// Set once stdout's reader has gone (EPIPE, `ptrain list | head`): what
/// is left to print is dropped, and the command still ends as its work
/// decides (`ptrain wait ID | head -1` keeps waiting and exits with the
/// job's outcome).
static STDOUT_GONE: AtomicBool = AtomicBool::new(false);

/// `print!`, except that a closed pipe ends the output quietly instead of
/// panicking (std's `print!` panics on any write error). Any other write
/// error (a full disk) is a failure: reported, exit 1.
fn write_stdout(args: std::fmt::Arguments<'_>) {
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            STDOUT_GONE.store(true, Ordering::Relaxed);
        } else {
            write_stderr(format_args!("ptrain: cannot write the output: {e}\n"));
            std::process::exit(i32::from(EXIT_FAILURE));
        }
    }
}

/// `eprint!` that never panics: with stderr gone there is no one to tell.
fn write_stderr(args: std::fmt::Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

/// `println!` through [`write_stdout`].
macro_rules! outln {
    () => { write_stdout(format_args!("\n")) };
    ($($arg:tt)*) => { write_stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` through [`write_stdout`].
macro_rules! out {
    ($($arg:tt)*) => { write_stdout(format_args!($($arg)*)) };
}

/// `eprintln!` through [`write_stderr`].
macro_rules! errln {
    ($($arg:tt)*) => { write_stderr(format_args!("{}\n", format_args!($($arg)*))) };
}

#[derive(Parser)]
#[command(
    version,
    about = "Submit and follow GPU training jobs run by ptraind as systemd units",
    after_help = "Examples:
  ptrain submit train.json          drop a job file into the spool
  ptrain list                       every job and its state
  ptrain list --status failed       failed jobs (--mine: yours, --user NAME)
  ptrain status resnet-lr01         one job's outcome, times and GPUs
  ptrain logs -f resnet-lr01        follow a job's output
  ptrain stop resnet-lr01           stop a queued or running job
  ptrain stop --user alice          stop all of alice's (as alice or root)

Exit codes: 0 success, 1 the request failed (unknown job, not yours),
2 bad usage or a job file invalid or refused, 3 ptraind is not reachable.
With --wait and `ptrain wait`: 0 every job succeeded or was not needed,
4 a job failed (exit code, signal, launch), 5 a job timed out, 6 a job was
stopped, 7 a job's dependency failed."
)]
struct Cli {
    /// Configuration file (for the spool directory).
    #[arg(long, global = true, default_value = DEFAULT_CONFIG_PATH, env = "PTRAIN_CONFIG")]
    config: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a job file and drop it into the spool (FILE or - for stdin).
    Submit {
        file: PathBuf,
        /// Job id when reading stdin (default: the file's stem).
        #[arg(long)]
        id: Option<String>,
        /// Return once the file is dropped, without waiting for ptraind to accept it.
        #[arg(long, conflicts_with = "wait")]
        no_confirm: bool,
        /// Block until the job (every job of a sweep) ends, printing its state
        /// changes; exit 0 only if all succeeded or were not needed (see exit
        /// codes below).
        #[arg(long)]
        wait: bool,
        /// Copy these variables of your environment into the job's `env`
        /// (NAME,NAME…; ALL: every one the job may set; NONE: none, the
        /// default), as sbatch --export. The job file's own `env` wins.
        #[arg(long, value_name = "NAMES|ALL|NONE")]
        export: Option<String>,
    },
    /// Block until these jobs (or sweeps) end; exit 0 only if all succeeded
    /// or were not needed.
    Wait {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// List the active jobs and the most recent ends (--all: every job
    /// ptraind remembers).
    List {
        #[arg(long)]
        json: bool,
        /// Every job ptraind remembers (the newest 20,000), not only the active
        /// ones and the recent ends; older ones: STATE/history.jsonl.
        #[arg(long)]
        all: bool,
        /// How many recently ended jobs to show besides the active ones.
        #[arg(long, default_value_t = 50)]
        recent: u32,
        /// Show chains as a tree: each job under the jobs it waits for.
        #[arg(long, conflicts_with = "json")]
        tree: bool,
        /// Only the jobs of USER (a login name or a uid).
        #[arg(long, value_name = "USER", conflicts_with = "mine")]
        user: Option<String>,
        /// Only your own jobs.
        #[arg(long)]
        mine: bool,
        /// Only jobs in these states (repeat it or separate them by commas:
        /// `--status queued,running`).
        #[arg(
            long,
            value_name = "STATUS",
            value_delimiter = ',',
            value_parser = clap::builder::PossibleValuesParser::new(status_words())
        )]
        status: Vec<String>,
    },
    /// Show one job.
    Status {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Stop queued or running jobs (or sweeps); each is reported on a line
    /// of its own, exit 1 if any was not stopped.
    Stop {
        #[arg(required_unless_present = "user")]
        ids: Vec<String>,
        /// Every queued or running job of USER (a login name or a uid):
        /// root, or USER themself.
        #[arg(long, value_name = "USER")]
        user: Option<String>,
    },
    /// Show a job's output (from the journal, or its archive once the
    /// journal rotated it away).
    Logs {
        id: String,
        /// Follow the output until the job ends, across restarts of
        /// ptraind (resumed where it stopped).
        #[arg(short, long)]
        follow: bool,
        /// Show only the last N lines.
        #[arg(short = 'n', long)]
        lines: Option<u32>,
        /// Only output written since then: a duration ago ("10m", "2h") or
        /// a UTC time ("2026-05-01 12:00:00").
        #[arg(long)]
        since: Option<String>,
    },
    /// The log archive: its retention policy and what it uses (yours; root
    /// sees every user).
    Du {
        #[arg(long)]
        json: bool,
    },
    /// Job files ptraind refused, and why (yours; root sees all).
    Rejected {
        #[arg(long)]
        json: bool,
    },
    /// GPUs and the jobs holding them.
    Gpus {
        #[arg(long)]
        json: bool,
    },
    /// Notification deliveries: pending, retrying, delivered and dead,
    /// with the last error (root).
    Notifications {
        /// Print the deliveries as a JSON array.
        #[arg(long)]
        json: bool,
        #[command(subcommand)]
        action: Option<NotificationsAction>,
    },
    /// The ids of the active and recently ended jobs and sweeps, one a
    /// line: what the shell completions offer for a job id.
    #[command(name = "__complete-ids", hide = true)]
    CompleteIds,
    /// Write the man pages and shell completions (`make docs`).
    #[command(hide = true)]
    Generate {
        /// Directory for ptrain.1 and ptrain-COMMAND.1.
        #[arg(long)]
        man: Option<PathBuf>,
        /// Directory for ptrain.bash, _ptrain (zsh) and ptrain.fish.
        #[arg(long)]
        completions: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum NotificationsAction {
    /// Send a dead notification again (or a retrying one now).
    Retry {
        /// The notification's key, JOB.EVENT.CHANNEL, as listed.
        #[arg(required_unless_present = "all_dead", conflicts_with = "all_dead")]
        key: Option<String>,
        /// Every dead notification.
        #[arg(long)]
        all_dead: bool,
    },
}

#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

fn fail(code: u8, message: impl Into<String>) -> Failure {
    Failure {
        code,
        message: message.into(),
    }
}

fn from_bus(e: zbus::Error) -> Failure {
    match &e {
        zbus::Error::MethodError(name, msg, _) => {
            let text = msg.clone().unwrap_or_else(|| name.to_string());
            if name.as_str() == "org.freedesktop.DBus.Error.ServiceUnknown"
                || name.as_str() == "org.freedesktop.DBus.Error.NameHasNoOwner"
            {
                fail(
                    EXIT_NO_DAEMON,
                    "ptraind is not running (systemctl start ptraind)",
                )
            } else {
                fail(EXIT_FAILURE, text)
            }
        }
        zbus::Error::FDO(fdo) => match fdo.as_ref() {
            zbus::fdo::Error::ServiceUnknown(_) | zbus::fdo::Error::NameHasNoOwner(_) => fail(
                EXIT_NO_DAEMON,
                "ptraind is not running (systemctl start ptraind)",
            ),
            other => fail(EXIT_FAILURE, fdo_message(other)),
        },
        _ => fail(
            EXIT_NO_DAEMON,
            format!("cannot reach ptraind on the system bus: {e}"),
        ),
    }
}

fn fdo_message(e: &zbus::fdo::Error) -> String {
    let text = e.to_string();
    // "org.freedesktop.DBus.Error.X: message" → "message"
    text.split_once(": ")
        .map(|(_, m)| m.to_string())
        .unwrap_or(text)
}

async fn proxy() -> Result<Daemon1Proxy<'static>, Failure> {
    let conn = zbus::Connection::system().await.map_err(|e| {
        fail(
            EXIT_NO_DAEMON,
            format!("cannot connect to the system bus: {e}"),
        )
    })?;
    // A command reads a property once at most (SpoolDir): no cache, and so
    // no PropertiesChanged subscription to keep reading.
    Daemon1Proxy::builder(&conn)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
        .map_err(from_bus)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            // Messages quote what users wrote (ids, file names, reasons).
            errln!("ptrain: {}", escape(&f.message));
            ExitCode::from(f.code)
        }
    }
}

async fn run(cli: Cli) -> Result<u8, Failure> {
    match cli.command {
        Command::Submit {
            file,
            id,
            no_confirm,
            wait,
            export,
        } => {
            let export = export.as_deref().map(Export::parse).transpose()?.flatten();
            submit(&cli.config, &file, id, no_confirm, wait, export).await
        }
        Command::Wait { ids } => {
            let proxy = proxy().await?;
            // Subscribed before the first look, so no change falls in between.
            let hints = follow(&proxy, true).await?;
            // A sweep id stands for all of its members.
            let jobs: Vec<JobView> = parse(&proxy.list().await.map_err(from_bus)?)?;
            let mut expanded = Vec::new();
            for id in ids {
                let members: Vec<String> = jobs
                    .iter()
                    .filter(|j| j.group.as_deref() == Some(id.as_str()))
                    .map(|j| j.id.clone())
                    .collect();
                if members.is_empty() {
                    expanded.push(id);
                } else {
                    expanded.extend(members);
                }
            }
            wait_for_jobs(&proxy, hints, &expanded).await
        }
        Command::List {
            json,
            all,
            recent,
            tree,
            user,
            mine,
            status,
        } => {
            let filter = ListFilter {
                uid: match (user, mine) {
                    (Some(user), _) => Some(uid_of_user(&user)?),
                    // SAFETY: geteuid has no preconditions. The bus knows
                    // us by this uid too.
                    (None, true) => Some(unsafe { libc::geteuid() }),
                    (None, false) => None,
                },
                statuses: status.into_iter().collect(),
            };
            let proxy = proxy().await?;
            let jobs = list_jobs(&proxy, all, recent, &filter).await?;
            if json {
                print_json(&jobs);
            } else if tree {
                out!("{}", render_tree(&jobs));
            } else {
                print_table(&jobs);
            }
            Ok(0)
        }
        Command::Status { id, json } => {
            let proxy = proxy().await?;
            let failure = match proxy.status(&id).await {
                Ok(job) => {
                    let job: JobView = parse(&job)?;
                    if json {
                        print_json(&job);
                    } else {
                        print_status(&job);
                    }
                    return Ok(0);
                }
                Err(e) => from_bus(e),
            };
            // Not a job: a sweep id stands for its members (as for `wait`
            // and `stop`).
            if failure.code != EXIT_FAILURE {
                return Err(failure);
            }
            let jobs: Vec<JobView> = parse(&proxy.list().await.map_err(from_bus)?)?;
            let mut members: Vec<JobView> = jobs
                .into_iter()
                .filter(|j| j.group.as_deref() == Some(id.as_str()))
                .collect();
            if members.is_empty() {
                return Err(failure);
            }
            members.sort_by(|a, b| a.id.cmp(&b.id));
            if json {
                print_json(&members);
            } else {
                print_sweep(&id, &members);
            }
            Ok(0)
        }
        Command::Stop { ids, user } => stop(ids, user).await,
        Command::Logs {
            id,
            follow,
            lines,
            since,
        } => logs(&id, follow, lines, since.as_deref()).await,
        Command::Du { json } => du(json).await,
        Command::Rejected { json } => {
            let list: Vec<RejectRecord> =
                parse(&proxy().await?.rejected().await.map_err(from_bus)?)?;
            if json {
                print_json(&list);
            } else if list.is_empty() {
                outln!("no rejected job files");
            } else {
                for r in &list {
                    outln!(
                        "{}  {}  {}: {}",
                        format_time(r.rejected_at),
                        escape(r.owner.as_deref().unwrap_or("?")),
                        escape(&r.file),
                        escape(&r.reason)
                    );
                }
            }
            Ok(0)
        }
        Command::Gpus { json } => {
            let view: GpusView = parse(&proxy().await?.gpus().await.map_err(from_bus)?)?;
            if json {
                print_json(&view);
            } else {
                outln!("backend: {}", view.backend);
                outln!(
                    "{:<5} {:<24} {:>9} {:>9} {:<12} {:<16} UUID",
                    "INDEX",
                    "NAME",
                    "MEMORY",
                    "USED",
                    "STATE",
                    "JOB"
                );
                for g in &view.gpus {
                    outln!(
                        "{:<5} {:<24} {:>9} {:>9} {:<12} {:<16} {}",
                        g.gpu.index,
                        truncate(&g.gpu.name, 24),
                        human_mib(g.gpu.memory_total_mib),
                        g.gpu.memory_used_mib.map(human_mib).unwrap_or("-".into()),
                        if g.state.is_empty() { "-" } else { &g.state },
                        g.held_by
                            .as_deref()
                            .or(g.reserved_for.as_deref())
                            .unwrap_or("-"),
                        g.gpu.uuid
                    );
                }
                // What the STATE column cannot hold: why a GPU is out.
                for g in &view.gpus {
                    if matches!(g.state.as_str(), "unhealthy" | "busy-foreign") {
                        outln!("GPU {}: {}", g.gpu.index, escape(&g.detail));
                    }
                }
            }
            Ok(0)
        }
        Command::Notifications { json, action } => notifications(json, action).await,
        Command::Generate { man, completions } => generate(man, completions),
        Command::CompleteIds => {
            let jobs: Vec<JobView> = parse(
                &proxy()
                    .await?
                    .list_recent(COMPLETE_RECENT)
                    .await
                    .map_err(from_bus)?,
            )?;
            for id in completion_ids(&jobs) {
                outln!("{id}");
            }
            Ok(0)
        }
    }
}

/// Every status word a job shows (`JobView::status`), in the order a job
/// passes through them: the live ones, every outcome's (the job model's
/// one list), and `ended`, a record kept without an outcome.
fn status_words() -> Vec<&'static str> {
    ["queued", "launching", "running"]
        .into_iter()
        .chain(ptrain::job::Outcome::STATUSES)
        .chain(["ended"])
        .collect()
}

/// The uid of `user`, a login name or a number.
fn uid_of_user(user: &str) -> Result<u32, Failure> {
    if let Ok(uid) = user.parse() {
        return Ok(uid);
    }
    ptrain::users::uid_of_name(user).ok_or_else(|| {
        fail(
            EXIT_USAGE,
            format!("no user {user:?} on this system; give a login name (`id -un USER`) or a uid"),
        )
    })
}

/// What `ptrain list --user/--mine/--status` keeps. Applied here to what
/// ptraind lists: the listing already holds every job's owner and status,
/// also the ones [privacy] hides the details of.
#[derive(Default)]
struct ListFilter {
    uid: Option<u32>,
    /// Empty: every status.
    statuses: std::collections::BTreeSet<String>,
}

impl ListFilter {
    fn is_empty(&self) -> bool {
        self.uid.is_none() && self.statuses.is_empty()
    }

    fn keeps(&self, job: &JobView) -> bool {
        self.uid.is_none_or(|uid| job.uid == uid)
            && (self.statuses.is_empty() || self.statuses.contains(&job.status))
    }

    /// Would every job it keeps be queued, launching or running? Those
    /// are all in the short listing whatever `--recent` says.
    fn only_active(&self) -> bool {
        !self.statuses.is_empty() && self.statuses.iter().all(|s| !is_final(s))
    }
}

/// The jobs `ptrain list` shows: the active ones and the `recent` newest
/// ends (every job with `all`), of those the filter keeps. With a filter,
/// `--recent` counts the ends it keeps, so it reads the whole listing
/// unless only active jobs can match (they are always in the short one).
async fn list_jobs(
    proxy: &Daemon1Proxy<'_>,
    all: bool,
    recent: u32,
    filter: &ListFilter,
) -> Result<Vec<JobView>, Failure> {
    let reply = if filter.only_active() {
        proxy.list_recent(0).await
    } else if all || !filter.is_empty() {
        proxy.list().await
    } else {
        proxy.list_recent(recent).await
    };
    let jobs: Vec<JobView> = parse(&reply.map_err(from_bus)?)?;
    if filter.is_empty() {
        return Ok(jobs);
    }
    Ok(keep_recent(
        jobs.into_iter().filter(|j| filter.keeps(j)).collect(),
        if all { None } else { Some(recent as usize) },
    ))
}

/// The active jobs and the `recent` most recently ended (every one for
/// None), in the listing's order (by submission).
fn keep_recent(jobs: Vec<JobView>, recent: Option<usize>) -> Vec<JobView> {
    let Some(recent) = recent else {
        return jobs;
    };
    let mut ends: Vec<(u64, &str)> = jobs
        .iter()
        .filter(|j| is_final(&j.status))
        .map(|j| (j.ended_at.unwrap_or(0), j.id.as_str()))
        .collect();
    ends.sort_unstable_by(|a, b| b.cmp(a));
    let newest: std::collections::BTreeSet<String> = ends
        .into_iter()
        .take(recent)
        .map(|(_, id)| id.to_owned())
        .collect();
    jobs.into_iter()
        .filter(|j| !is_final(&j.status) || newest.contains(&j.id))
        .collect()
}

/// `ptrain stop ID… [--user USER]`: each job asked for on its own, each
/// answer on a line of its own; one that fails does not keep the others
/// from being stopped.
async fn stop(mut ids: Vec<String>, user: Option<String>) -> Result<u8, Failure> {
    let proxy = proxy().await?;
    if let Some(user) = &user {
        let uid = uid_of_user(user)?;
        // SAFETY: geteuid has no preconditions.
        let caller = unsafe { libc::geteuid() };
        if caller != 0 && caller != uid {
            return Err(fail(
                EXIT_FAILURE,
                format!(
                    "only root or {user} may stop every job of {user}; name your own jobs, \
                     or run it with sudo"
                ),
            ));
        }
        let active: Vec<JobView> = parse(&proxy.list_recent(0).await.map_err(from_bus)?)?;
        let theirs: Vec<String> = active
            .into_iter()
            .filter(|j| j.uid == uid && !is_final(&j.status))
            .map(|j| j.id)
            .collect();
        if theirs.is_empty() && ids.is_empty() {
            outln!("{} has no queued or running jobs", escape(user));
            return Ok(0);
        }
        ids.extend(theirs);
    }
    let mut seen = std::collections::BTreeSet::new();
    ids.retain(|id| seen.insert(id.clone()));
    if let [id] = ids.as_slice() {
        outln!("{}", escape(&proxy.stop(id).await.map_err(from_bus)?));
        return Ok(0);
    }
    let mut not_stopped = Vec::new();
    for id in &ids {
        match proxy.stop(id).await.map_err(from_bus) {
            Ok(said) => outln!("{}", escape(&said)),
            // Nobody to ask about the rest either.
            Err(f) if f.code == EXIT_NO_DAEMON => return Err(f),
            Err(f) => {
                errln!("ptrain: {}", escape(&f.message));
                not_stopped.push(id.as_str());
            }
        }
    }
    if not_stopped.is_empty() {
        return Ok(0);
    }
    Err(fail(
        EXIT_FAILURE,
        format!(
            "{} of {} not stopped: {} (why: above)",
            not_stopped.len(),
            ids.len(),
            not_stopped.join(", ")
        ),
    ))
}

fn parse<T: serde::de::DeserializeOwned>(json: &str) -> Result<T, Failure> {
    serde_json::from_str(json)
        .map_err(|e| fail(EXIT_FAILURE, format!("unexpected reply from ptraind: {e}")))
}

fn print_json<T: serde::Serialize>(value: &T) {
    outln!(
        "{}",
        serde_json::to_string_pretty(value).expect("serialisable")
    );
}

/// The terminal's width when stdout is one; tables are then cut to fit.
fn terminal_width() -> Option<usize> {
    if !std::io::stdout().is_terminal() {
        return None;
    }
    // SAFETY: TIOCGWINSZ fills a winsize; a zeroed one is a valid start.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) };
    if rc == 0 && size.ws_col > 0 {
        return Some(usize::from(size.ws_col));
    }
    std::env::var("COLUMNS").ok()?.parse().ok()
}

/// A table's last, free-length column, cut to what is left of the
/// terminal after `used` columns (never below 12 characters). Whole when
/// stdout is not a terminal, so pipes and scripts see everything.
fn last_column(text: &str, used: usize, width: Option<usize>) -> String {
    match width {
        Some(width) => truncate(text, width.saturating_sub(used).max(12)),
        None => text.to_owned(),
    }
}

/// MiB in human units: "512 MiB", "80 GiB", "1.5 GiB".
fn human_mib(mib: u64) -> String {
    if mib < 1024 {
        return format!("{mib} MiB");
    }
    let gib = mib as f64 / 1024.0;
    let text = format!("{gib:.1}");
    format!("{} GiB", text.strip_suffix(".0").unwrap_or(&text))
}

fn truncate(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(width.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

fn format_time(micros: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_micros(micros);
    humantime::format_rfc3339_seconds(t).to_string()
}

fn format_duration(micros: u64) -> String {
    humantime::format_duration(Duration::from_secs(micros / 1_000_000)).to_string()
}

fn duration_of(job: &JobView) -> Option<u64> {
    let start = job.started_at?;
    let end = job.ended_at.unwrap_or_else(ptrain::now_micros);
    Some(end.saturating_sub(start))
}

fn print_table(jobs: &[JobView]) {
    let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let width = terminal_width();
    // Every column keeps its width whatever is in it, so the next one
    // starts where its header does: STATUS fits the longest status
    // ("dependency-failed"), and the rest are cut with "…".
    outln!(
        "{:<24} {:<17} {:<12} {:<8} {:<20} {:<10} DETAIL",
        "ID",
        "STATUS",
        "OWNER",
        "GPUS",
        "SUBMITTED",
        "RAN"
    );
    for j in jobs {
        // GPU indices as `#0,#1`: a bare "1" read like a count.
        let gpus = if j.gpus.is_empty() {
            "-".to_string()
        } else {
            j.gpus
                .iter()
                .map(|i| format!("#{i}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let status = format!("{:<17}", truncate(&j.status, 17));
        let status = if color {
            let code = match j.status.as_str() {
                "succeeded" => "32",
                // Neither good nor bad news: the terminal's dim.
                "not-needed" => "2",
                "running" | "launching" => "36",
                "queued" => "33",
                _ => "31",
            };
            format!("\x1b[{code}m{status}\x1b[0m")
        } else {
            status
        };
        outln!(
            "{:<24} {} {:<12} {:<8} {:<20} {:<10} {}",
            truncate(&j.id, 24),
            status,
            truncate(&escape(&j.owner), 12),
            truncate(&gpus, 8),
            format_time(j.submitted_at),
            duration_of(j)
                .map(format_duration)
                .unwrap_or_else(|| "-".into()),
            // The columns before DETAIL and their separators.
            last_column(&list_detail(j), 24 + 17 + 12 + 8 + 20 + 10 + 6, width)
        );
    }
}

/// The DETAIL column: the job's `name` first (its people's handle for
/// it), then how it stands.
fn list_detail(j: &JobView) -> String {
    match &j.name {
        Some(name) => format!("[{}] {}", escape(name), escape(&j.detail)),
        None => escape(&j.detail).into_owned(),
    }
}

/// A sweep for people: how many of its jobs are in each state, then each
/// job with what it ran with and how it ended.
fn print_sweep(id: &str, members: &[JobView]) {
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for m in members {
        *counts.entry(m.status.as_str()).or_default() += 1;
    }
    let counts: Vec<String> = counts
        .iter()
        .map(|(s, n)| format!("{n} {}", escape(s)))
        .collect();
    outln!(
        "sweep:     {} ({} jobs: {})",
        escape(id),
        members.len(),
        counts.join(", ")
    );
    for m in members {
        let params: Vec<String> = m
            .params
            .iter()
            .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
            .collect();
        let how = if m.detail.is_empty() || m.detail == m.status {
            escape(&m.status).into_owned()
        } else {
            format!("{} — {}", escape(&m.status), escape(&m.detail))
        };
        outln!("  {:<24} {:<20} {}", escape(&m.id), params.join(" "), how);
    }
}

/// One job for people. Every field a user wrote (the command, its
/// workdir, a reason quoted in the detail) is [`escape`]d: the reader may
/// be anyone, root included.
fn print_status(j: &JobView) {
    outln!("job:       {}", escape(&j.id));
    if let Some(name) = &j.name {
        outln!("name:      {}", escape(name));
    }
    if let Some(comment) = &j.comment {
        outln!("comment:   {}", escape(comment));
    }
    // A detail that only repeats the status ("succeeded") says nothing more.
    if j.detail.is_empty() || j.detail == j.status {
        outln!("status:    {}", escape(&j.status));
    } else {
        outln!("status:    {} — {}", escape(&j.status), escape(&j.detail));
    }
    outln!("owner:     {} (uid {})", escape(&j.owner), j.uid);
    outln!("unit:      {}", escape(&j.unit));
    if j.private {
        outln!("command:   (private to its owner; the admin's [privacy] show_all_jobs shows it)");
    } else {
        let command: Vec<_> = j.command.iter().map(|a| escape(a)).collect();
        outln!("command:   {}", command.join(" "));
    }
    if let Some(w) = &j.workdir {
        outln!("workdir:   {}", escape(w));
    }
    if let Some(t) = j.timeout_secs {
        outln!(
            "timeout:   {}",
            humantime::format_duration(Duration::from_secs(t))
        );
    }
    if j.priority != 0 {
        outln!("priority:  {}", j.priority);
    }
    let gpus = if j.gpus.is_empty() {
        "none".to_string()
    } else {
        j.gpus
            .iter()
            .zip(&j.gpu_uuids)
            .map(|(i, u)| format!("{i} ({})", escape(u)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    outln!("gpus:      {gpus}");
    outln!("submitted: {}", format_time(j.submitted_at));
    if let Some(s) = j.started_at {
        outln!("started:   {}", format_time(s));
    }
    if let Some(e) = j.ended_at {
        outln!("ended:     {}", format_time(e));
    }
    if let Some(d) = duration_of(j) {
        outln!("ran for:   {}", format_duration(d));
    }
    if let Some(code) = j.exit_code {
        outln!("exit code: {code}");
    }
    if let Some(sig) = j.signal {
        outln!("signal:    {}", signal_name(sig));
    }
    for line in status_extras(j) {
        outln!("{line}");
    }
    if let Some(inv) = &j.invocation_id {
        outln!("logs:      ptrain logs {} (invocation {inv})", j.id);
    }
}

/// What `status` shows besides the times and the end: the sweep and its
/// parameters, what the job waits for, what it asked for and the limits
/// it runs with, and its result (or why the file it wrote was ignored).
fn status_extras(j: &JobView) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(group) = &j.group {
        let params: Vec<String> = j
            .params
            .iter()
            .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
            .collect();
        lines.push(match params.is_empty() {
            true => format!("sweep:     {}", escape(group)),
            false => format!("sweep:     {} ({})", escape(group), params.join(", ")),
        });
    }
    for (kind, parents) in [
        ("after_ok", &j.after_ok),
        ("after_fail", &j.after_fail),
        ("after_any", &j.after_any),
    ] {
        if !parents.is_empty() {
            let parents: Vec<_> = parents.iter().map(|p| escape(p)).collect();
            lines.push(format!("{kind:<10} {}", parents.join(", ")));
        }
    }
    if !j.waiting_for.is_empty() {
        let parents: Vec<_> = j.waiting_for.iter().map(|p| escape(p)).collect();
        lines.push(format!("waits for: {}", parents.join(", ")));
    }
    if !j.gpu_request.is_empty() {
        lines.push(format!("asked for: {}", escape(&j.gpu_request)));
    }
    if !j.resources.is_empty() {
        lines.push(format!("limits:    {}", j.resources));
    }
    if let Some(result) = &j.result {
        lines.push(format!("result:    {}", escape(&result.to_string())));
    }
    if let Some(why) = &j.result_error {
        lines.push(format!(
            "result:    none: what it wrote was ignored ({})",
            escape(why)
        ));
    }
    if let Some(warning) = &j.gpu_warning {
        lines.push(format!("GPU:       {}", escape(warning)));
    }
    lines
}

/// Where job files go when neither the config nor ptraind tells.
const DEFAULT_SPOOL_DIR: &str = "/var/spool/ptrain";

/// The spool directory: from the config (normally world-readable); when
/// this user cannot read it, from ptraind (its SpoolDir property); only
/// when ptraind does not answer either, the default, with a note naming
/// both, as the file may then wait where no ptraind looks.
async fn spool_dir(config: &Path, proxy: Option<&Daemon1Proxy<'_>>) -> PathBuf {
    let unreadable = match Config::load(config) {
        Ok(c) => return c.spool_dir,
        Err(e) => e,
    };
    let asked = match proxy {
        Some(proxy) => proxy.spool_dir().await.map_err(|e| from_bus(e).message),
        None => Err("cannot reach it on the system bus".to_string()),
    };
    match asked {
        Ok(dir) if Path::new(&dir).is_absolute() => PathBuf::from(dir),
        Ok(dir) => {
            errln!("ptrain: ptraind named the spool {dir:?}, not an absolute path; using the default {DEFAULT_SPOOL_DIR}");
            PathBuf::from(DEFAULT_SPOOL_DIR)
        }
        Err(why) => {
            errln!(
                "ptrain: cannot read the config ({}) and cannot ask ptraind ({}); \
                 dropping the job into the default spool {DEFAULT_SPOOL_DIR}",
                escape(&unreadable.to_string()),
                escape(&why)
            );
            PathBuf::from(DEFAULT_SPOOL_DIR)
        }
    }
}

/// What `--export` takes from the environment: (name, value) pairs, and
/// the names it left out.
type Picked = (Vec<(String, String)>, Vec<String>);

/// `ptrain submit --export`: which of the submitter's variables go into
/// the job's `env`.
#[derive(Debug, PartialEq)]
enum Export {
    /// Every variable the descriptor lets a job set; the others (`USER`,
    /// `LD_PRELOAD`, …, names `env` does not accept) are left out, with a
    /// note.
    All,
    /// Exactly these; one the job may not set is refused.
    Names(Vec<String>),
}

/// What `--export ALL` leaves out besides what a job may not set: what
/// systemd or a login gives one process (its invocation, journal stream,
/// notify socket, sockets, agent and display), which would be wrong in
/// the job's own process.
const PER_PROCESS_ENV: &[&str] = &[
    "INVOCATION_ID",
    "JOURNAL_STREAM",
    "NOTIFY_SOCKET",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "WATCHDOG_PID",
    "WATCHDOG_USEC",
    "SYSTEMD_EXEC_PID",
    "MANAGERPID",
    "SSH_AUTH_SOCK",
    "SSH_AGENT_PID",
    "SSH_CONNECTION",
    "SSH_CLIENT",
    "SSH_TTY",
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "XDG_RUNTIME_DIR",
    "XDG_SESSION_ID",
    "DBUS_SESSION_BUS_ADDRESS",
    "TERM",
    "OLDPWD",
    "PWD",
    "SHLVL",
    "_",
];

impl Export {
    /// NAMES|ALL|NONE; None for NONE.
    fn parse(text: &str) -> Result<Option<Export>, Failure> {
        match text {
            "ALL" => return Ok(Some(Export::All)),
            "NONE" => return Ok(None),
            _ => {}
        }
        let names: Vec<String> = text.split(',').map(str::to_owned).collect();
        if let Some(bad) = names.iter().find(|n| !ptrain::spec::is_env_name(n)) {
            return Err(fail(
                EXIT_USAGE,
                format!(
                    "--export {text:?}: {bad:?} is not a variable name; give NAME[,NAME…] \
                     (letters, digits, _), ALL or NONE"
                ),
            ));
        }
        if let Some((name, why)) = names
            .iter()
            .find_map(|n| ptrain::spec::reserved_env(n).map(|why| (n, why)))
        {
            return Err(fail(
                EXIT_USAGE,
                format!("--export: a job may not set {name}: {why}; leave it out of --export"),
            ));
        }
        Ok(Some(Export::Names(names)))
    }

    /// The variables to copy, from `environment`: (name, value) pairs, and
    /// the names left out (ALL only). A named variable that is not set, or
    /// not UTF-8, is an error naming it.
    fn pick(
        &self,
        environment: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    ) -> Result<Picked, Failure> {
        let mut environment: std::collections::BTreeMap<_, _> = environment.collect();
        match self {
            Export::Names(names) => {
                let mut picked = Vec::new();
                for name in names {
                    let value = environment.remove(std::ffi::OsStr::new(name)).ok_or_else(|| {
                        fail(
                            EXIT_USAGE,
                            format!("--export: {name} is not set in your environment; set it or leave it out"),
                        )
                    })?;
                    let value = value.into_string().map_err(|_| {
                        fail(
                            EXIT_USAGE,
                            format!("--export: the value of {name} is not UTF-8, which a job file cannot hold; leave it out"),
                        )
                    })?;
                    picked.push((name.clone(), value));
                }
                Ok((picked, Vec::new()))
            }
            Export::All => {
                let (mut picked, mut left_out) = (Vec::new(), Vec::new());
                for (name, value) in environment {
                    match (name.into_string(), value.into_string()) {
                        // Silently: they were never the job's to have.
                        (Ok(name), _) if PER_PROCESS_ENV.contains(&name.as_str()) => {}
                        (Ok(name), Ok(value))
                            if ptrain::spec::is_env_name(&name)
                                && ptrain::spec::reserved_env(&name).is_none() =>
                        {
                            picked.push((name, value))
                        }
                        (name, _) => {
                            left_out.push(name.unwrap_or_else(|n| n.to_string_lossy().into_owned()))
                        }
                    }
                }
                Ok((picked, left_out))
            }
        }
    }
}

/// The job file with `exported` added to its `env`; a variable the file
/// sets itself keeps the file's value (as sbatch: what the job says wins).
fn with_exported_env(bytes: &[u8], exported: Vec<(String, String)>) -> Result<Vec<u8>, Failure> {
    // Already checked by parse_spec: one JSON object, no duplicate keys.
    let mut job: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(bytes)
        .map_err(|e| {
            fail(
                EXIT_USAGE,
                format!("cannot add --export to the job file: {e}"),
            )
        })?;
    let env = job
        .entry("env")
        .or_insert_with(|| serde_json::Value::Object(Default::default()));
    if env.is_null() {
        *env = serde_json::Value::Object(Default::default());
    }
    let Some(env) = env.as_object_mut() else {
        return Err(fail(
            EXIT_USAGE,
            "field `env` must be an object to add --export to it",
        ));
    };
    for (name, value) in exported {
        env.entry(name).or_insert(serde_json::Value::String(value));
    }
    Ok(serde_json::to_vec(&job).expect("a JSON object serialises"))
}

async fn submit(
    config: &Path,
    file: &Path,
    id: Option<String>,
    no_confirm: bool,
    wait: bool,
    export: Option<Export>,
) -> Result<u8, Failure> {
    let (bytes, default_id) = if file == Path::new("-") {
        let mut buf = Vec::new();
        std::io::stdin()
            .take(MAX_SPEC_BYTES as u64 + 1)
            .read_to_end(&mut buf)
            .map_err(|e| fail(EXIT_FAILURE, format!("cannot read stdin: {e}")))?;
        let id = id.ok_or_else(|| {
            fail(
                EXIT_USAGE,
                "reading a job from stdin needs --id ID (or an \"id\" field)",
            )
        })?;
        (buf, id)
    } else {
        let bytes = std::fs::read(file)
            .map_err(|e| fail(EXIT_USAGE, format!("cannot read {}: {e}", file.display())))?;
        let stem = file
            .file_stem()
            .and_then(|s| s.to_str())
            .map(str::to_owned)
            .unwrap_or_default();
        (bytes, id.unwrap_or(stem))
    };
    // The same checks ptraind makes, so mistakes show up here, not later.
    let mut spec = parse_spec(&bytes, &default_id)
        .map_err(|e| fail(EXIT_USAGE, format!("{}: {e}", file.display())))?;
    let bytes = match export {
        None => bytes,
        Some(export) => {
            let (exported, left_out) = export.pick(std::env::vars_os())?;
            if !left_out.is_empty() {
                errln!(
                    "ptrain: --export ALL leaves out what a job may not set (ptraind's own, \
                     or not a variable name the job file can hold): {}",
                    escape(&left_out.join(", "))
                );
            }
            let bytes = with_exported_env(&bytes, exported)?;
            spec = parse_spec(&bytes, &default_id)
                .map_err(|e| fail(EXIT_USAGE, format!("{} with --export: {e}", file.display())))?;
            bytes
        }
    };
    let name = format!("{}.json", spec.id);
    debug_assert!(spool_file_stem(&name).is_some());
    let connected = proxy().await;
    let spool = spool_dir(config, connected.as_ref().ok()).await;

    // Subscribed before dropping, so no change of the job is missed.
    let listener = match connected {
        Ok(p) if !no_confirm => {
            let hints = if wait {
                Some(follow(&p, true).await?)
            } else {
                None
            };
            Some((p, hints))
        }
        _ => None,
    };
    let published = drop_into_spool(&spool, &name, &bytes)?;
    outln!("submitted {} as {}", spec.id, spool.join(&name).display());
    let Some((proxy, hints)) = listener else {
        return Ok(0);
    };
    // The jobs this file becomes: one, or every member of a sweep.
    let ids: Vec<String> = match &spec.sweep {
        Some(sweep) => ptrain::chain::expand(&spec, sweep)
            .into_iter()
            .map(|m| m.spec.id.to_string())
            .collect(),
        None => vec![spec.id.to_string()],
    };
    // ptraind decides within milliseconds unless it is down or its state
    // disk stalls; --wait, asked to block, allows longer.
    let within = Duration::from_secs(if wait { 60 } else { 10 });
    let decision =
        tokio::time::timeout(within, decision(&proxy, &spool, &name, &published, &ids[0])).await;
    match decision {
        Ok(Ok(Decision::Accepted(status))) => {
            if ids.len() > 1 {
                outln!("ptraind accepted sweep {} as {} jobs", spec.id, ids.len());
            } else {
                outln!(
                    "ptraind accepted job {} ({}); `ptrain status {}` shows it",
                    spec.id,
                    escape(&status),
                    spec.id
                );
            }
            match hints {
                Some(hints) => wait_for_jobs(&proxy, hints, &ids).await,
                None => Ok(0),
            }
        }
        Ok(Ok(Decision::Refused(r))) => Err(fail(
            EXIT_USAGE,
            format!(
                "ptraind refused {name}: {}; `ptrain rejected` lists your refused files",
                r.reason
            ),
        )),
        Ok(Err(f)) if f.code == EXIT_NO_DAEMON => Err(fail(
            EXIT_NO_DAEMON,
            format!(
                "ptraind is not running, so nothing has checked {name} yet: it waits in the spool \
                 and ptraind claims it when it starts (systemctl start ptraind); `ptrain status {}` \
                 tells then",
                spec.id
            ),
        )),
        Ok(Err(f)) => Err(f),
        Err(_) if wait => Err(fail(
            EXIT_NO_DAEMON,
            format!(
                "ptraind has not taken {name} within {} s (is it running? systemctl status ptraind); `ptrain wait {}` follows the job once it has",
                within.as_secs(),
                spec.id
            ),
        )),
        Err(_) => {
            outln!(
                "ptraind has not decided about {name} yet; `ptrain status {}` or `ptrain rejected` will tell",
                spec.id
            );
            Ok(0)
        }
    }
}

/// The file `ptrain submit` published, as ptraind will see it.
struct Published {
    dev: u64,
    ino: u64,
    size: u64,
    /// A time (µs since the epoch) after the file came to exist.
    created_by: u64,
}

impl Published {
    /// Is this ptraind's record of our file, rather than of a namesake's
    /// (another user's job with this id, or our own earlier one)? The
    /// file's (dev, ino) alone could be an earlier file's: a namesake's
    /// spool file was removed before ours was created, and a file system
    /// may give a freed inode number to the next file. A record of our
    /// file was made after it was created, one of an earlier file before
    /// (ptraind decides before it removes a spool file).
    fn is(&self, dev: Option<u64>, ino: Option<u64>, decided_at: u64) -> bool {
        // A ptraind that records no identity: the time alone tells.
        let same_file = match (dev, ino) {
            (Some(dev), Some(ino)) => (dev, ino) == (self.dev, self.ino),
            _ => true,
        };
        same_file && decided_at >= self.created_by
    }
}

enum Decision {
    /// The job (a sweep's first member) made of our file, and its status.
    Accepted(String),
    Refused(RejectRecord),
}

/// What ptraind decided about the file we published as `name`: a job whose
/// source is that file, or a refusal of it. Never a namesake's job or
/// refusal: both are matched on the file's identity ([`Published::is`]).
/// Looks once the file has left the spool (ptraind records its decision
/// before it removes the file), polling a stat of it, which is cheap.
async fn decision(
    proxy: &Daemon1Proxy<'_>,
    spool: &Path,
    name: &str,
    published: &Published,
    first: &str,
) -> Result<Decision, Failure> {
    use std::os::unix::fs::MetadataExt;
    let path = spool.join(name);
    let mut pause = Duration::from_millis(5);
    loop {
        let waiting = std::fs::symlink_metadata(&path)
            .is_ok_and(|m| (m.dev(), m.ino()) == (published.dev, published.ino));
        if waiting {
            // Nobody claims it while ptraind is down: say so now, not
            // after the timeout.
            if let Err(e) = proxy.status(first).await {
                let failure = from_bus(e);
                if failure.code == EXIT_NO_DAEMON {
                    return Err(failure);
                }
            }
        } else {
            if let Ok(json) = proxy.status(first).await {
                let job: JobView = parse(&json)?;
                let source = job.source.as_ref();
                if published.is(
                    source.map(|s| s.dev),
                    source.map(|s| s.ino),
                    job.submitted_at,
                ) && source.is_none_or(|s| s.size == published.size)
                {
                    return Ok(Decision::Accepted(job.status));
                }
            }
            let rejected: Vec<RejectRecord> = parse(&proxy.rejected().await.map_err(from_bus)?)?;
            if let Some(r) = rejected
                .into_iter()
                .rev()
                .find(|r| r.file == name && published.is(r.dev, r.ino, r.rejected_at))
            {
                return Ok(Decision::Refused(r));
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// Writes the job under a dot-name the daemon ignores, then renames it to
/// its final name, so ptraind never sees a half-written file. Refuses to
/// replace a pending file of the same name.
fn drop_into_spool(spool: &Path, name: &str, bytes: &[u8]) -> Result<Published, Failure> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let tmp = spool.join(format!(".{name}.{}.tmp", std::process::id()));
    let io = |what: &str, e: std::io::Error| {
        fail(
            EXIT_FAILURE,
            format!("cannot {what} in {}: {e}", spool.display()),
        )
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(|e| io("create a file", e))?;
    let created_by = ptrain::now_micros();
    let written = f
        .write_all(bytes)
        .and_then(|()| f.sync_all())
        .and_then(|()| f.metadata());
    let meta = match written {
        Ok(meta) => meta,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(io("write the job file", e));
        }
    };
    drop(f);
    if let Err(e) = ptrain::fsutil::rename_noreplace(&tmp, &spool.join(name)) {
        let _ = std::fs::remove_file(&tmp);
        if e.raw_os_error() == Some(libc::EEXIST) {
            return Err(fail(
                EXIT_FAILURE,
                format!("{name} is already waiting in the spool; give the job another id"),
            ));
        }
        return Err(io("publish the job file", e));
    }
    Ok(Published {
        dev: meta.dev(),
        ino: meta.ino(),
        size: meta.size(),
        created_by,
    })
}

/// `ptrain logs`: ptraind hands over a pipe it fills from the journal (or
/// the job's archive) as root; users cannot read the system journal.
/// Following survives a restart of ptraind: the output is asked for again
/// once ptraind is back, and resumed where it stopped
/// ([`ptrain::logs::resume`]).
async fn logs(
    id: &str,
    follow: bool,
    lines: Option<u32>,
    since: Option<&str>,
) -> Result<u8, Failure> {
    let since_usec = since
        .map(|s| ptrain::logs::parse_since(s, ptrain::now_micros()))
        .transpose()
        .map_err(|e| fail(EXIT_USAGE, e))?
        .unwrap_or(0);
    let proxy = proxy().await?;
    // Subscribed, and ptraind's owner noted, before the output is opened:
    // a restart after this is never missed.
    let mut restarts = match follow {
        true => Some(Restarts::watch(&proxy).await?),
        false => None,
    };
    // A job `[retention]` compacted has no status, but its archive may
    // still be served: then ptraind's answer to the status is kept for
    // when there is no output either.
    let job: Result<JobView, Failure> = match proxy.status(id).await.map_err(from_bus) {
        Ok(text) => Ok(parse(&text)?),
        Err(failure) if failure.code == EXIT_FAILURE => Err(failure),
        Err(failure) => return Err(failure),
    };
    if let Ok(job) = &job {
        if !follow && job.started_at.is_none() && !is_final(&job.status) {
            errln!("ptrain: job {id} has not started yet; `ptrain logs -f {id}` waits for it");
        }
    }
    let mut asked_at = ptrain::now_micros();
    let fd = match proxy
        .open_logs(id, lines.unwrap_or(0), since_usec, follow)
        .await
    {
        Ok(fd) => fd,
        Err(e) => return Err(job.err().unwrap_or_else(|| from_bus(e))),
    };
    let mut output = std::fs::File::from(std::os::fd::OwnedFd::from(fd));
    // Someone else's output on a terminal: escape sequences in it could
    // rewrite the screen, so control characters are shown escaped.
    // SAFETY: geteuid has no preconditions.
    let foreign = job
        .as_ref()
        .map_or(true, |job| job.uid != unsafe { libc::geteuid() });
    let escape = foreign && std::io::stdout().is_terminal();
    let Some(restarts) = restarts.as_mut() else {
        return match copy_output(&mut output, escape) {
            Ok(()) => Ok(0),
            // `ptrain logs ID | head`: the reader is done.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
            Err(e) => Err(fail(EXIT_FAILURE, format!("cannot copy the output: {e}"))),
        };
    };
    let mut printed = ptrain::logs::resume::Printed::default();
    let mut overlap = None;
    loop {
        match copy_following(&mut output, escape, &mut printed, &mut overlap) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(0),
            Err(e) => return Err(fail(EXIT_FAILURE, format!("cannot copy the output: {e}"))),
        }
        // The pipe closes when the job ended; earlier means ptraind went
        // away. A job already out of the records (compacted) ended long
        // ago; any other failure to answer (no reply from a ptraind that
        // is stopping) says nothing about the job.
        let ended = match proxy.status(id).await {
            Ok(json) => serde_json::from_str::<JobView>(&json).is_ok_and(|j| is_final(&j.status)),
            Err(_) => job.is_err(),
        };
        if ended {
            if let Some(rest) = overlap.take().map(ptrain::logs::resume::Overlap::finish) {
                match show(&mut std::io::stdout().lock(), &rest, escape) {
                    Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                        return Err(fail(EXIT_FAILURE, format!("cannot copy the output: {e}")))
                    }
                    _ => {}
                }
            }
            return Ok(0);
        }
        errln!("ptrain: ptraind restarted; following the output again");
        output = loop {
            restarts.wait(id).await?;
            let tail_asked_at = (lines.unwrap_or(0) > 0).then_some(asked_at);
            let (lines, since) = match printed.resume_from(since_usec, tail_asked_at) {
                Some(since) => (0, since),
                // Nothing printed yet: as if first asked now.
                None => {
                    asked_at = ptrain::now_micros();
                    (lines.unwrap_or(0), since_usec)
                }
            };
            let failure = match proxy.open_logs(id, lines, since, true).await {
                Ok(fd) => break std::fs::File::from(std::os::fd::OwnedFd::from(fd)),
                Err(e) => from_bus(e),
            };
            // Gone again before it answered (no owner, or no reply): wait
            // for the next one.
            if failure.code != EXIT_NO_DAEMON && !restarts.gone().await? {
                return Err(failure);
            }
        };
        overlap = (!printed.is_empty()).then(|| printed.overlap());
    }
}

/// How long a ptraind that closed a followed job's pipe may keep its bus
/// name (it is stopping) before the close is taken as an error of its own.
const RESTART_GRACE: Duration = Duration::from_secs(120);

/// Who owns ptraind's bus name, and the signal when that changes: a
/// follower reopens the output only once a new ptraind is there.
struct Restarts {
    dbus: zbus::fdo::DBusProxy<'static>,
    hints: UnboundedReceiver<Hint>,
    /// The owner that served the output last.
    owner: Option<String>,
}

impl Restarts {
    async fn watch(proxy: &Daemon1Proxy<'static>) -> Result<Restarts, Failure> {
        let hints = follow(proxy, false).await?;
        let dbus = zbus::fdo::DBusProxy::new(proxy.inner().connection())
            .await
            .map_err(from_bus)?;
        let mut this = Restarts {
            dbus,
            hints,
            owner: None,
        };
        this.owner = this.owner().await?;
        Ok(this)
    }

    async fn owner(&self) -> Result<Option<String>, Failure> {
        let name = zbus::names::BusName::try_from(ptrain::DBUS_NAME).expect("a valid bus name");
        match self.dbus.get_name_owner(name).await {
            Ok(owner) => Ok(Some(owner.to_string())),
            Err(zbus::fdo::Error::NameHasNoOwner(_)) => Ok(None),
            Err(e) => Err(from_bus(e.into())),
        }
    }

    /// Whether the owner that served the output last no longer does.
    async fn gone(&self) -> Result<bool, Failure> {
        Ok(self.owner().await? != self.owner)
    }

    /// Returns once ptraind's bus name has an owner other than the one
    /// that served the output last. No deadline while it has none (as
    /// `ptrain wait`); ends when the bus connection is lost, and when the
    /// old owner holds on to it past [`RESTART_GRACE`] (it closed the pipe
    /// without stopping: its journal says why).
    async fn wait(&mut self, id: &str) -> Result<(), Failure> {
        let deadline = tokio::time::Instant::now() + RESTART_GRACE;
        loop {
            let now = self.owner().await?;
            if now.is_some() && now != self.owner {
                self.owner = now;
                return Ok(());
            }
            let hint = if now.is_some() {
                match tokio::time::timeout_at(deadline, self.hints.recv()).await {
                    Ok(hint) => hint,
                    Err(_) => {
                        return Err(fail(
                            EXIT_FAILURE,
                            format!("ptraind closed the output of job {id} before it ended, without restarting (see `journalctl -u ptraind`); run `ptrain logs -f {id}` again"),
                        ))
                    }
                }
            } else {
                self.hints.recv().await
            };
            if matches!(hint, None | Some(Hint::Lost)) {
                return Err(fail(
                    EXIT_NO_DAEMON,
                    format!(
                        "lost the connection to the system bus; run `ptrain logs -f {id}` again"
                    ),
                ));
            }
        }
    }
}

/// Copies the pipe to stdout as it arrives; with `escape`, control
/// characters other than tab and newline are written as `\xNN`.
fn copy_output(input: &mut impl Read, escape: bool) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    each_chunk(input, |chunk| show(&mut stdout, chunk, escape))
}

/// [`copy_output`] for a follower: what is printed is noted in `printed`,
/// and while `overlap` is set (a reopened output), what was printed
/// before is skipped.
fn copy_following(
    input: &mut impl Read,
    escape: bool,
    printed: &mut ptrain::logs::resume::Printed,
    overlap: &mut Option<ptrain::logs::resume::Overlap>,
) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    each_chunk(input, |chunk| {
        // Taken before printing: journald stamped these lines earlier.
        let received = ptrain::now_micros();
        let new: std::borrow::Cow<'_, [u8]> = match overlap {
            None => chunk.into(),
            Some(o) => match o.push(chunk) {
                Some(rest) => {
                    *overlap = None;
                    rest.into()
                }
                None => return Ok(()),
            },
        };
        show(&mut stdout, &new, escape)?;
        printed.record(&new, received);
        Ok(())
    })
}

/// Reads `input` to its end, handing each chunk as it arrives to `each`.
fn each_chunk(
    input: &mut impl Read,
    mut each: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        each(&buf[..n])?;
    }
}

/// Writes output bytes to stdout, escaped if asked, and flushes:
/// followers want each line as it comes, not when a buffer fills.
fn show(stdout: &mut impl Write, bytes: &[u8], escape: bool) -> std::io::Result<()> {
    if escape {
        let mut shown = Vec::with_capacity(bytes.len());
        for &b in bytes {
            if (b < 0x20 && b != b'\t' && b != b'\n') || b == 0x7f {
                shown.extend_from_slice(format!("\\x{b:02x}").as_bytes());
            } else {
                shown.push(b);
            }
        }
        stdout.write_all(&shown)?;
    } else {
        stdout.write_all(bytes)?;
    }
    stdout.flush()
}

/// `ptrain du`: the archive's retention policy and what it uses.
async fn du(json: bool) -> Result<u8, Failure> {
    let usage: ptrain::logs::archive::LogUsage =
        parse(&proxy().await?.log_usage().await.map_err(from_bus)?)?;
    if json {
        print_json(&usage);
        return Ok(0);
    }
    let size = |b: u64| humansize(b);
    let p = &usage.policy;
    let limit =
        |v: Option<u64>, f: &dyn Fn(u64) -> String| v.map(f).unwrap_or_else(|| "none".into());
    outln!(
        "log archive: {} ({})",
        usage.log_dir,
        if usage.archive {
            "on"
        } else {
            "off: [logs] archive = false"
        }
    );
    outln!(
        "policy:      max_age {}, max_total_size {}, max_count {}, per user: max_total_size {}, max_count {}; min_free {}",
        limit(p.max_age_secs, &|s| humantime::format_duration(Duration::from_secs(s)).to_string()),
        limit(p.max_total_bytes, &size),
        limit(p.max_count, &|n| n.to_string()),
        limit(p.user_max_total_bytes, &size),
        limit(p.user_max_count, &|n| n.to_string()),
        match p.min_free {
            ptrain::logs::retention::MinFree::Bytes(b) => size(b),
            ptrain::logs::retention::MinFree::Percent(pct) => format!("{pct}%"),
            ptrain::logs::retention::MinFree::PercentAtMost(pct, cap) => {
                format!("{pct}% (at most {})", size(cap))
            }
        }
    );
    outln!("archives:    {} using {}", usage.count, size(usage.bytes));
    if let Some(d) = usage.disk {
        outln!(
            "disk:        {} free of {}",
            size(d.avail_bytes),
            size(d.total_bytes)
        );
    }
    if !usage.users.is_empty() {
        outln!("{:<16} {:>8} {:>10}  OLDEST", "USER", "ARCHIVES", "SIZE");
        for u in &usage.users {
            outln!(
                "{:<16} {:>8} {:>10}  {}",
                truncate(
                    &escape(&u.user.clone().unwrap_or_else(|| u.uid.to_string())),
                    16
                ),
                u.count,
                size(u.bytes),
                u.oldest.map(format_time).unwrap_or_else(|| "-".into())
            );
        }
    }
    Ok(0)
}

fn humansize(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

const EXIT_JOB_FAILED: u8 = 4;
const EXIT_JOB_TIMEOUT: u8 = 5;
const EXIT_JOB_STOPPED: u8 = 6;
const EXIT_JOB_DEPENDENCY: u8 = 7;

fn is_final(status: &str) -> bool {
    !matches!(status, "queued" | "launching" | "running")
}

/// How often `wait` asks ptraind for the truth about the jobs it follows
/// even when no signal came: the safety net under a signal the bus dropped
/// (dbus-daemon discards messages for a reader that falls too far behind).
const RECHECK_EVERY: Duration = Duration::from_secs(15);

/// What the bus said while we wait: only hints of what to ask ptraind
/// about. The status in a signal is never taken as the truth: ptraind
/// emits each signal from its own task, so two changes of one job can
/// arrive in either order.
enum Hint {
    /// A job changed.
    Changed(String),
    /// ptraind's bus name has a new owner (it restarted): anything may
    /// have changed meanwhile, with no signal for it.
    NewOwner,
    /// ptraind's bus name has no owner (it stopped).
    NoOwner,
    /// The bus connection closed.
    Lost,
}

/// Subscribes to JobChanged and to changes of ptraind's bus name owner,
/// and reads both for as long as it lives, on a task of its own. zbus
/// queues at most 64 unread messages per subscription and then stops
/// reading the connection altogether, replies included: a stream left
/// unread while the caller awaits a method call's reply (one `Status` per
/// job in a burst of changes) hangs that call for ever. This task never
/// waits on the caller; the channel it fills is unbounded.
async fn follow(
    proxy: &Daemon1Proxy<'static>,
    jobs: bool,
) -> Result<UnboundedReceiver<Hint>, Failure> {
    // Without `jobs` (a follower of one job's output, which looks at
    // nothing else), no JobChanged: it would only pile up unread.
    let mut changes = match jobs {
        true => Some(proxy.receive_job_changed().await.map_err(from_bus)?),
        false => None,
    };
    let dbus = zbus::fdo::DBusProxy::new(proxy.inner().connection())
        .await
        .map_err(from_bus)?;
    let mut owners = dbus
        .receive_name_owner_changed_with_args(&[(0, ptrain::DBUS_NAME)])
        .await
        .map_err(from_bus)?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let hint = tokio::select! {
                signal = async { changes.as_mut()?.next().await }, if changes.is_some() => match signal {
                    Some(signal) => match signal.args() {
                        Ok(args) => Hint::Changed(args.id),
                        Err(_) => continue,
                    },
                    None => Hint::Lost,
                },
                signal = owners.next() => match signal {
                    Some(signal) => match signal.args() {
                        Ok(args) if args.new_owner().is_some() => Hint::NewOwner,
                        Ok(_) => Hint::NoOwner,
                        Err(_) => continue,
                    },
                    None => Hint::Lost,
                },
            };
            let lost = matches!(hint, Hint::Lost);
            if tx.send(hint).is_err() || lost {
                return;
            }
        }
    });
    Ok(rx)
}

/// Follows the jobs until all have ended; the exit code says the worst
/// that happened. Signals only say which jobs to look at again; each
/// job's state is what `Status` answers. Every job is looked at after
/// subscribing (so nothing falls in between), whenever a signal names it,
/// all of them after ptraind restarts, and all every [`RECHECK_EVERY`].
async fn wait_for_jobs(
    proxy: &Daemon1Proxy<'_>,
    mut hints: UnboundedReceiver<Hint>,
    ids: &[String],
) -> Result<u8, Failure> {
    use std::collections::{BTreeMap, BTreeSet};
    // None: not looked at yet.
    let mut status: BTreeMap<&str, Option<String>> =
        ids.iter().map(|id| (id.as_str(), None)).collect();
    let mut stale: BTreeSet<&str> = status.keys().copied().collect();
    let mut recheck = tokio::time::interval(RECHECK_EVERY);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    recheck.tick().await; // the first tick is now; the look below is it
    let mut daemon_gone = false;
    loop {
        for id in std::mem::take(&mut stale) {
            let known = status.get_mut(id).expect("only followed ids are stale");
            if known.as_deref().is_some_and(is_final) {
                continue;
            }
            let job: JobView = match proxy.status(id).await.map_err(from_bus) {
                Ok(json) => parse(&json)?,
                // ptraind is restarting: its new owner, or the next
                // recheck, makes us look again.
                Err(f) if f.code == EXIT_NO_DAEMON && known.is_some() => {
                    if !daemon_gone {
                        errln!("ptrain: ptraind is not running; waiting for it to come back");
                        daemon_gone = true;
                    }
                    continue;
                }
                Err(f) => return Err(f),
            };
            daemon_gone = false;
            match known {
                // Another user's job under [privacy] has no detail.
                None if job.detail.is_empty() => outln!("{id}: {}", escape(&job.status)),
                None => outln!("{id}: {}", escape(&job.detail)),
                // An end says how ("failed with exit code 3"), not only that.
                Some(old)
                    if *old != job.status && is_final(&job.status) && !job.detail.is_empty() =>
                {
                    outln!("{id}: {}", escape(&job.detail))
                }
                Some(old) if *old != job.status => outln!("{id}: {}", escape(&job.status)),
                Some(_) => {}
            }
            *known = Some(job.status);
        }
        let pending: BTreeSet<&str> = status
            .iter()
            .filter(|(_, s)| !s.as_deref().is_some_and(is_final))
            .map(|(id, _)| *id)
            .collect();
        if pending.is_empty() {
            break;
        }
        // Wait for something to look at, then take every hint already
        // queued too, so a burst costs one look per job.
        let mut next = Some(tokio::select! {
            hint = hints.recv() => hint.unwrap_or(Hint::Lost),
            _ = recheck.tick() => Hint::NewOwner,
        });
        while let Some(hint) = next.take().or_else(|| hints.try_recv().ok()) {
            match hint {
                Hint::Changed(id) => {
                    if let Some(id) = pending.get(id.as_str()) {
                        stale.insert(id);
                    }
                }
                Hint::NewOwner => stale.extend(&pending),
                Hint::NoOwner => {}
                Hint::Lost => {
                    return Err(fail(
                        EXIT_NO_DAEMON,
                        "lost the connection to the system bus; run `ptrain wait` again",
                    ))
                }
            }
        }
    }
    let worst = |word: &str| status.values().any(|s| s.as_deref() == Some(word));
    // A job that was not needed (an after_fail alert whose parents all
    // succeeded) is how a pipeline that went well ends: not a failure.
    let fine = |s: &Option<String>| matches!(s.as_deref(), Some("succeeded" | "not-needed"));
    Ok(if status.values().all(fine) {
        0
    } else if worst("failed") || worst("killed") || worst("launch-failed") {
        EXIT_JOB_FAILED
    } else if worst("timeout") || worst("idle-timeout") {
        EXIT_JOB_TIMEOUT
    } else if worst("stopped") {
        EXIT_JOB_STOPPED
    } else {
        EXIT_JOB_DEPENDENCY
    })
}

async fn notifications(json: bool, action: Option<NotificationsAction>) -> Result<u8, Failure> {
    let proxy = proxy().await?;
    if let Some(NotificationsAction::Retry { key, all_dead }) = action {
        let said = proxy
            .retry_notifications(key.as_deref().unwrap_or(""), all_dead)
            .await
            .map_err(from_bus)?;
        outln!("{}", escape(&said));
        return Ok(0);
    }
    let list: Vec<ptrain::notifications::DeliveryView> =
        parse(&proxy.notifications().await.map_err(from_bus)?)?;
    if json {
        print_json(&list);
        return Ok(0);
    }
    if list.is_empty() {
        outln!("no notifications");
        return Ok(0);
    }
    outln!(
        "{:<40} {:<10} {:>8} {:<20} {:<20} LAST ERROR",
        "KEY",
        "STATE",
        "ATTEMPTS",
        "LAST ATTEMPT",
        "NEXT"
    );
    let width = terminal_width();
    for d in &list {
        let time = |t: Option<u64>| t.map(format_time).unwrap_or_else(|| "-".into());
        outln!(
            "{:<40} {:<10} {:>8} {:<20} {:<20} {}",
            escape(&d.key),
            d.state.as_str(),
            d.attempts,
            time(d.last_attempt_at),
            time(d.next_attempt_at),
            // A remote server's words, and job text quoted in them.
            last_column(
                &escape(d.last_error.as_deref().unwrap_or("-")),
                40 + 10 + 8 + 20 + 20 + 5,
                width
            )
        );
    }
    let dead = list
        .iter()
        .filter(|d| d.state == ptrain::notifications::DeliveryState::Dead)
        .count();
    if dead > 0 {
        outln!("{dead} dead: fix the cause, then `ptrain notifications retry KEY` or `--all-dead`");
    }
    Ok(0)
}

/// How many recent ends `ptrain __complete-ids` offers besides the active
/// jobs: what `ptrain list` shows by default.
const COMPLETE_RECENT: u32 = 50;

/// The ids a job-id argument completes to: every listed job's, and each
/// sweep's once (status, stop and wait take them too), sorted.
fn completion_ids(jobs: &[JobView]) -> std::collections::BTreeSet<&str> {
    jobs.iter()
        .flat_map(|j| std::iter::once(j.id.as_str()).chain(j.group.as_deref()))
        .collect()
}

/// What the static completions clap_complete writes cannot know: job ids.
/// Each shell's script gets them from `ptrain __complete-ids` when the
/// argument being completed is a job id of `status`, `stop`, `logs` or
/// `wait`.
fn add_job_id_completion(path: &Path) -> std::io::Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let script = std::fs::read_to_string(path)?;
    let script = match name {
        "ptrain.bash" => format!("{script}{BASH_JOB_IDS}"),
        "ptrain.fish" => format!("{script}{FISH_JOB_IDS}"),
        "_ptrain" => {
            let call = "if [ \"$funcstack[1]\" = \"_ptrain\" ]; then";
            if !script.contains(call) || !script.contains("':id:_default'") {
                return Err(std::io::Error::other(
                    "clap_complete's zsh script changed shape; update add_job_id_completion",
                ));
            }
            script
                .replace("':id:_default'", "':id:_ptrain_job_ids'")
                .replace("'*::ids:_default'", "'*::ids:_ptrain_job_ids'")
                .replacen(call, &format!("{ZSH_JOB_IDS}{call}"), 1)
        }
        _ => return Ok(()),
    };
    std::fs::write(path, script)
}

/// Wraps clap's `_ptrain`: after the subcommand (skipping global options
/// and `--config`'s value), a word that is neither an option nor an
/// option's value is a job id.
const BASH_JOB_IDS: &str = r#"
# Job ids for status, stop, logs and wait, asked of ptraind.
_ptrain_with_job_ids() {
    _ptrain "$@"
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    local word sub="" skip=0
    for word in "${COMP_WORDS[@]:1:COMP_CWORD-1}"; do
        if ((skip)); then skip=0; continue; fi
        case "$word" in
            --config) skip=1 ;;
            -*) ;;
            *) sub="$word"; break ;;
        esac
    done
    case "$sub" in status|stop|logs|wait) ;; *) return 0 ;; esac
    case "$cur" in -*) return 0 ;; esac
    case "$prev" in --config|--user|--lines|-n|--since) return 0 ;; esac
    COMPREPLY=($(compgen -W "$(ptrain __complete-ids 2>/dev/null)" -- "$cur"))
}
if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _ptrain_with_job_ids -o nosort -o bashdefault -o default ptrain
else
    complete -F _ptrain_with_job_ids -o bashdefault -o default ptrain
fi
"#;

const FISH_JOB_IDS: &str = r#"
# Job ids for status, stop, logs and wait, asked of ptraind.
complete -c ptrain -n "__fish_seen_subcommand_from status stop logs wait" -f -a "(ptrain __complete-ids 2>/dev/null)"
"#;

const ZSH_JOB_IDS: &str = r#"# Job ids for status, stop, logs and wait, asked of ptraind.
(( $+functions[_ptrain_job_ids] )) ||
_ptrain_job_ids() {
    local -a ids
    ids=(${(f)"$(ptrain __complete-ids 2>/dev/null)"})
    _describe -t job-ids 'job id' ids
}

"#;

fn generate(man: Option<PathBuf>, completions: Option<PathBuf>) -> Result<u8, Failure> {
    let io = |what: &str, dir: &Path, e: std::io::Error| {
        fail(
            EXIT_FAILURE,
            format!("cannot write {what} into {}: {e}", dir.display()),
        )
    };
    let cmd = <Cli as clap::CommandFactory>::command();
    if let Some(dir) = &man {
        let extra = ptrain::docgen::ManExtra {
            section: "1",
            files: &[
                (
                    DEFAULT_CONFIG_PATH,
                    "ptraind's configuration; ptrain reads spool_dir from it (or, when it cannot, asks ptraind).",
                ),
                (
                    "/var/spool/ptrain",
                    "The spool: ptrain submit drops job files here (mode 1733).",
                ),
            ],
            see_also: &["ptraind(8)", "systemctl(1)", "journalctl(1)"],
        };
        for path in ptrain::docgen::write_man_pages(cmd.clone(), &extra, dir)
            .map_err(|e| io("man pages", dir, e))?
        {
            outln!("{}", path.display());
        }
    }
    if let Some(dir) = &completions {
        for path in
            ptrain::docgen::write_completions(cmd, dir).map_err(|e| io("completions", dir, e))?
        {
            add_job_id_completion(&path).map_err(|e| io("completions", dir, e))?;
            outln!("{}", path.display());
        }
    }
    Ok(0)
}

/// The jobs as a forest: a job appears under each job it waits for that is
/// in the list (a sweep's dependents under its last member); jobs waiting
/// for nothing listed are roots.
fn render_tree(jobs: &[JobView]) -> String {
    use std::collections::{BTreeMap, BTreeSet};
    // A sweep id stands for its last listed member.
    let mut last_member: BTreeMap<&str, &str> = BTreeMap::new();
    for job in jobs {
        if let Some(group) = job.group.as_deref() {
            last_member.insert(group, job.id.as_str());
        }
    }
    let ids: BTreeSet<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
    let mut children: BTreeMap<&str, Vec<&JobView>> = BTreeMap::new();
    let mut roots = Vec::new();
    for job in jobs {
        let parents: BTreeSet<&str> = job
            .after_ok
            .iter()
            .chain(&job.after_fail)
            .chain(&job.after_any)
            .filter_map(|p| {
                last_member
                    .get(p.as_str())
                    .copied()
                    .or(ids.get(p.as_str()).copied())
            })
            .collect();
        if parents.is_empty() {
            roots.push(job);
        }
        for p in parents {
            children.entry(p).or_default().push(job);
        }
    }
    struct Tree<'a> {
        children: BTreeMap<&'a str, Vec<&'a JobView>>,
        out: String,
        shown: BTreeSet<&'a str>,
    }
    impl<'a> Tree<'a> {
        fn walk(&mut self, job: &'a JobView, depth: usize) {
            let indent = "  ".repeat(depth);
            // A job under two parents is shown and expanded once; under
            // the others it is named.
            if !self.shown.insert(job.id.as_str()) {
                self.out
                    .push_str(&format!("{indent}{} (shown above)\n", escape(&job.id)));
                return;
            }
            let how = if job.after_fail.is_empty() {
                ""
            } else {
                " (after_fail)"
            };
            let detail = if job.detail.is_empty() || job.detail == job.status {
                String::new()
            } else {
                format!(" — {}", escape(&job.detail))
            };
            self.out.push_str(&format!(
                "{indent}{} {}{how}{detail}\n",
                escape(&job.id),
                escape(&job.status),
            ));
            for kid in self
                .children
                .get(job.id.as_str())
                .cloned()
                .unwrap_or_default()
            {
                self.walk(kid, depth + 1);
            }
        }
    }
    let mut tree = Tree {
        children,
        out: String::new(),
        shown: BTreeSet::new(),
    };
    for root in roots {
        tree.walk(root, 0);
    }
    tree.out
}

#[cfg(test)]
mod table_tests {
    use super::*;

    #[test]
    fn list_names_a_job_before_its_detail() {
        let mut job: JobView = serde_json::from_value(serde_json::json!({
            "id": "a", "status": "running", "owner": "alice", "uid": 1000,
            "unit": "ptrain-job@a.service", "command": ["true"],
            "gpus": [], "gpu_uuids": [], "submitted_at": 1, "detail": "running",
            "name": "resnet baseline",
        }))
        .unwrap();
        assert_eq!(list_detail(&job), "[resnet baseline] running");
        job.name = None;
        assert_eq!(list_detail(&job), "running");
    }

    #[test]
    fn status_shows_the_sweep_parents_limits_and_result() {
        let job: JobView = serde_json::from_value(serde_json::json!({
            "id": "lr-1", "status": "succeeded", "owner": "alice", "uid": 1000,
            "unit": "ptrain-job@lr-1.service", "command": ["true"],
            "gpus": [], "gpu_uuids": [], "submitted_at": 1, "detail": "succeeded",
            "group": "lr", "params": {"lr": "0.1"}, "after_ok": ["prep", "data"],
            "gpu_request": "1 GPU", "resources": "4 CPUs, 12.0 GiB of memory",
            "result": {"acc": 0.9},
        }))
        .unwrap();
        assert_eq!(
            status_extras(&job),
            [
                "sweep:     lr (lr=0.1)",
                "after_ok   prep, data",
                "asked for: 1 GPU",
                "limits:    4 CPUs, 12.0 GiB of memory",
                "result:    {\"acc\":0.9}",
            ]
        );
        let ignored = JobView {
            result: None,
            result_error: Some("result.json must hold a JSON object".into()),
            ..job
        };
        assert!(status_extras(&ignored)
            .last()
            .unwrap()
            .starts_with("result:    none: what it wrote was ignored (result.json must"));
        let warned = JobView {
            gpu_warning: Some("GPU 1 (GPU-x) left the pool while this job ran on it: lost".into()),
            ..ignored
        };
        assert_eq!(
            status_extras(&warned).last().unwrap(),
            "GPU:       GPU 1 (GPU-x) left the pool while this job ran on it: lost"
        );
    }

    #[test]
    fn sizes_in_human_units() {
        assert_eq!(human_mib(512), "512 MiB");
        assert_eq!(human_mib(81920), "80 GiB");
        assert_eq!(human_mib(1536), "1.5 GiB");
    }

    #[test]
    fn a_namesake_on_a_reused_inode_is_not_our_file() {
        let ours = Published {
            dev: 1,
            ino: 7,
            size: 10,
            created_by: 1_000,
        };
        assert!(ours.is(Some(1), Some(7), 1_000));
        assert!(
            !ours.is(Some(1), Some(7), 999),
            "decided before our file existed: an earlier file on the same inode"
        );
        assert!(!ours.is(Some(1), Some(8), 2_000), "another file");
        assert!(!ours.is(Some(2), Some(7), 2_000), "another file system");
        assert!(
            ours.is(None, None, 2_000),
            "a ptraind that records no identity"
        );
    }

    #[test]
    fn a_job_with_two_parents_is_shown_once_and_named_under_the_other() {
        let job = |id: &str, after: &[&str]| -> JobView {
            serde_json::from_value(serde_json::json!({
                "id": id, "status": "succeeded", "owner": "alice", "uid": 1000,
                "unit": format!("ptrain-job@{id}.service"), "command": ["true"],
                "gpus": [], "gpu_uuids": [], "submitted_at": 1, "detail": "succeeded",
                "after_ok": after,
            }))
            .unwrap()
        };
        let jobs = [
            job("a", &[]),
            job("b", &[]),
            job("ab", &["a", "b"]),
            job("next", &["ab"]),
        ];
        let tree = render_tree(&jobs);
        assert_eq!(
            tree.lines().collect::<Vec<_>>(),
            [
                "a succeeded",
                "  ab succeeded",
                "    next succeeded",
                "b succeeded",
                "  ab (shown above)",
            ],
            "{tree}"
        );
    }

    fn listed(id: &str, uid: u32, status: &str, ended_at: Option<u64>) -> JobView {
        serde_json::from_value(serde_json::json!({
            "id": id, "status": status, "owner": format!("u{uid}"), "uid": uid,
            "unit": format!("ptrain-job@{id}.service"), "command": ["true"],
            "gpus": [], "gpu_uuids": [], "submitted_at": 1, "detail": status,
            "ended_at": ended_at,
        }))
        .unwrap()
    }

    #[test]
    fn list_filters_keep_the_user_and_statuses_asked_for() {
        let jobs = [
            listed("a", 1000, "running", None),
            listed("b", 1001, "failed", Some(5)),
            listed("c", 1000, "succeeded", Some(6)),
            listed("d", 1000, "failed", Some(7)),
        ];
        let kept = |filter: &ListFilter| -> Vec<&str> {
            jobs.iter()
                .filter(|j| filter.keeps(j))
                .map(|j| j.id.as_str())
                .collect()
        };
        let mine = ListFilter {
            uid: Some(1000),
            ..Default::default()
        };
        assert_eq!(kept(&mine), ["a", "c", "d"]);
        let failed = ListFilter {
            statuses: ["failed".to_string()].into(),
            ..Default::default()
        };
        assert_eq!(kept(&failed), ["b", "d"]);
        let both = ListFilter {
            uid: Some(1000),
            statuses: ["failed".to_string(), "running".to_string()].into(),
        };
        assert_eq!(kept(&both), ["a", "d"]);
        assert!(
            !both.only_active(),
            "failed jobs are not in the short listing"
        );
        let active = ListFilter {
            statuses: ["queued".to_string(), "running".to_string()].into(),
            ..Default::default()
        };
        assert!(active.only_active());
        assert!(ListFilter::default().is_empty());
    }

    #[test]
    fn recent_counts_the_newest_ends_the_filter_kept() {
        let jobs = vec![
            listed("old", 1000, "failed", Some(1)),
            listed("live", 1000, "queued", None),
            listed("new", 1000, "failed", Some(9)),
            listed("mid", 1000, "succeeded", Some(5)),
        ];
        let ids = |jobs: Vec<JobView>| jobs.into_iter().map(|j| j.id).collect::<Vec<_>>();
        assert_eq!(
            ids(keep_recent(jobs.clone(), Some(2))),
            ["live", "new", "mid"]
        );
        assert_eq!(ids(keep_recent(jobs.clone(), Some(0))), ["live"]);
        assert_eq!(ids(keep_recent(jobs, None)).len(), 4);
    }

    #[test]
    fn the_status_words_hold_every_outcome_of_the_job_model() {
        assert_eq!(status_words()[3..12], ptrain::job::Outcome::STATUSES);
    }

    #[test]
    fn every_status_word_is_known_to_the_filter() {
        use clap::CommandFactory;
        let err = Cli::command()
            .try_get_matches_from(["ptrain", "list", "--status", "queued,bogus"])
            .unwrap_err();
        assert_eq!(err.exit_code(), i32::from(EXIT_USAGE));
        let said = err.to_string();
        for word in status_words() {
            assert!(said.contains(word), "{word} not named in: {said}");
        }
        let ok = Cli::try_parse_from([
            "ptrain",
            "list",
            "--status",
            "queued,failed",
            "--status",
            "stopped",
            "--mine",
            "--all",
        ]);
        match ok.map(|c| c.command) {
            Ok(Command::List {
                status, mine, all, ..
            }) => {
                assert_eq!(status, ["queued", "failed", "stopped"]);
                assert!(mine && all);
            }
            _ => panic!("list --status did not parse"),
        }
        assert!(
            Cli::try_parse_from(["ptrain", "stop"]).is_err(),
            "stop needs ids or --user"
        );
        assert!(Cli::try_parse_from(["ptrain", "stop", "--user", "alice"]).is_ok());
    }

    fn environment(vars: &[(&str, &str)]) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
        vars.iter().map(|(k, v)| (k.into(), v.into())).collect()
    }

    #[test]
    fn export_names_all_or_none() {
        assert_eq!(Export::parse("NONE").unwrap(), None);
        assert_eq!(Export::parse("ALL").unwrap(), Some(Export::All));
        assert_eq!(
            Export::parse("PATH,VIRTUAL_ENV").unwrap(),
            Some(Export::Names(vec!["PATH".into(), "VIRTUAL_ENV".into()]))
        );
        let bad = Export::parse("PATH,,X").unwrap_err();
        assert_eq!(bad.code, EXIT_USAGE);
        assert!(
            bad.message.contains("\"\" is not a variable name"),
            "{}",
            bad.message
        );
        let reserved = Export::parse("PATH,LD_PRELOAD").unwrap_err();
        assert_eq!(reserved.code, EXIT_USAGE);
        assert!(
            reserved.message.contains("a job may not set LD_PRELOAD"),
            "{}",
            reserved.message
        );

        let env = environment(&[
            ("PATH", "/venv/bin:/usr/bin"),
            ("USER", "alice"),
            ("PTRAIN_CONFIG", "/etc/x"),
            ("BASH_FUNC_f%%", "() { :; }"),
            ("HOME", "/home/alice"),
            ("INVOCATION_ID", "0123"),
            ("NOTIFY_SOCKET", "/run/systemd/notify"),
        ]);
        let (picked, left_out) = Export::All.pick(env.clone().into_iter()).unwrap();
        assert_eq!(
            picked,
            [
                ("HOME".to_string(), "/home/alice".to_string()),
                ("PATH".to_string(), "/venv/bin:/usr/bin".to_string())
            ]
        );
        assert_eq!(left_out, ["BASH_FUNC_f%%", "PTRAIN_CONFIG", "USER"]);
        let (picked, _) = Export::Names(vec!["PATH".into()])
            .pick(env.clone().into_iter())
            .unwrap();
        assert_eq!(
            picked,
            [("PATH".to_string(), "/venv/bin:/usr/bin".to_string())]
        );
        let unset = Export::Names(vec!["NOPE".into()])
            .pick(env.into_iter())
            .unwrap_err();
        assert!(
            unset.message.contains("NOPE is not set"),
            "{}",
            unset.message
        );
    }

    #[test]
    fn the_job_files_own_env_wins_over_exported() {
        let exported = vec![
            ("PATH".to_string(), "/venv/bin".to_string()),
            ("MODE".to_string(), "shell".to_string()),
        ];
        let bytes = with_exported_env(
            br#"{"version": 1, "command": ["x"], "env": {"MODE": "file"}}"#,
            exported.clone(),
        )
        .unwrap();
        let spec = parse_spec(&bytes, "j").unwrap();
        assert_eq!(spec.env["MODE"], "file");
        assert_eq!(spec.env["PATH"], "/venv/bin");
        // No `env`, or a null one: made.
        for file in [
            &br#"{"version": 1, "command": ["x"]}"#[..],
            br#"{"version": 1, "command": ["x"], "env": null}"#,
        ] {
            let spec =
                parse_spec(&with_exported_env(file, exported.clone()).unwrap(), "j").unwrap();
            assert_eq!(spec.env["MODE"], "shell");
        }
    }

    #[test]
    fn completion_ids_name_each_job_and_each_sweep_once() {
        let mut member = listed("sw-lr1", 1000, "running", None);
        member.group = Some("sw".into());
        let mut other = listed("sw-lr2", 1000, "queued", None);
        other.group = Some("sw".into());
        let jobs = [listed("b", 1000, "failed", Some(1)), member, other];
        assert_eq!(
            completion_ids(&jobs).into_iter().collect::<Vec<_>>(),
            ["b", "sw", "sw-lr1", "sw-lr2"]
        );
    }

    /// Completes `words` (the last one being completed) with the generated
    /// bash script, `ptrain __complete-ids` answering `ids`.
    fn bash_completes(script: &Path, words: &[&str]) -> Vec<String> {
        let words: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
        let program = format!(
            "source {script}
             ptrain() {{ [ \"$1\" = __complete-ids ] && printf 'alpha\\nbeta\\nsw\\n'; }}
             COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))
             _ptrain_with_job_ids ptrain \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script = script.display(),
            words = words.join(" ")
        );
        let out = std::process::Command::new("bash")
            .args(["--norc", "-c", &program])
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn bash_completes_job_ids_from_the_hidden_command() {
        let dir = tempfile::tempdir().unwrap();
        generate(None, Some(dir.path().to_owned())).unwrap();
        let bash = dir.path().join("ptrain.bash");
        let script = std::fs::read_to_string(&bash).unwrap();
        assert!(script.contains("ptrain __complete-ids"), "{script}");
        let generated = script.split("# Job ids for").next().unwrap();
        assert!(
            !generated.contains("__complete-ids") && !generated.contains("generate"),
            "hidden commands are not offered"
        );
        for words in [
            &["ptrain", "status", ""][..],
            &["ptrain", "stop", "alpha", ""],
            &["ptrain", "--config", "/etc/x.toml", "logs", ""],
            &["ptrain", "wait", ""],
        ] {
            assert_eq!(
                bash_completes(&bash, words),
                ["alpha", "beta", "sw"],
                "{words:?}"
            );
        }
        assert_eq!(bash_completes(&bash, &["ptrain", "status", "a"]), ["alpha"]);
        // Not a job id: an option, an option's value, another command.
        for words in [
            &["ptrain", "logs", "--since", ""][..],
            &["ptrain", "stop", "--user", ""],
            &["ptrain", "status", "--"],
        ] {
            let offered = bash_completes(&bash, words);
            assert!(
                !offered.contains(&"alpha".to_string()),
                "{words:?}: {offered:?}"
            );
        }
        let offered = bash_completes(&bash, &["ptrain", "list", ""]);
        assert!(!offered.contains(&"alpha".to_string()), "{offered:?}");

        let zsh = std::fs::read_to_string(dir.path().join("_ptrain")).unwrap();
        assert!(zsh.contains("_ptrain_job_ids() {") && zsh.contains("':id:_ptrain_job_ids'"));
        assert!(!zsh.contains("':id:_default'"), "{zsh}");
        let fish = std::fs::read_to_string(dir.path().join("ptrain.fish")).unwrap();
        assert!(
            fish.contains("(ptrain __complete-ids 2>/dev/null)"),
            "{fish}"
        );
    }

    #[test]
    fn last_column_fits_the_terminal_only_on_one() {
        let detail = "waiting for pipe-prep, pipe-train and pipe-eval to succeed";
        assert_eq!(last_column(detail, 92, None), detail, "pipes see it whole");
        let cut = last_column(detail, 92, Some(120));
        assert_eq!(cut.chars().count(), 28);
        assert!(cut.ends_with('…'), "{cut}");
        assert_eq!(last_column(detail, 92, Some(80)).chars().count(), 12);
    }
}
