//! ptrain: the user's command line for ptraind.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::{Parser, Subcommand};

use ptrain::api::Daemon1Proxy;
use ptrain::config::DEFAULT_CONFIG_PATH;
use ptrain::display::escape;

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
    () => { $crate::write_stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::write_stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` through [`write_stdout`].
macro_rules! out {
    ($($arg:tt)*) => { $crate::write_stdout(format_args!($($arg)*)) };
}

/// `eprintln!` through [`write_stderr`].
macro_rules! errln {
    ($($arg:tt)*) => { $crate::write_stderr(format_args!("{}\n", format_args!($($arg)*))) };
}

mod accounting;
mod du;
mod generate;
mod gpus;
mod human;
mod images;
mod list;
mod logs;
mod notifications;
mod rejected;
mod status;
mod stop;
mod submit;
mod wait;

use accounting::{history, report, HistoryArgs, ReportArgs};
use du::du;
use generate::{complete_ids, generate};
use gpus::gpus;
use images::images;
use list::{list, status_words, uid_of_user, ListFilter};
use logs::logs;
use notifications::notifications;
use rejected::rejected;
use status::status;
use stop::{steer, Verb};
use submit::{submit, Export};
use wait::wait;

/// The jobs `stop`, `hold`, `release`, `pause` and `resume` act on.
#[derive(clap::Args)]
struct Targets {
    /// Job or sweep ids.
    #[arg(required_unless_present = "user")]
    ids: Vec<String>,
    /// Every job of USER (a login name or a uid) the command applies to
    /// (stop: queued or running; hold, release: queued; pause: running;
    /// resume: paused): root, or USER
    /// themself.
    #[arg(long, value_name = "USER")]
    user: Option<String>,
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
  ptrain hold resnet-lr01           keep a queued job from starting
  ptrain release resnet-lr01        let a held job start
  ptrain update resnet-lr01 --priority 50 --begin 2h
                                    reorder or retime a queued job
  ptrain restart resnet-lr01        run an ended job again (--as NEW: a new id)
  ptrain pause resnet-lr01          freeze a running job, its GPUs kept
  ptrain resume resnet-lr01         let a paused job run on

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
    Stop(Targets),
    /// Hold queued jobs (or sweeps): they stay queued, holding nothing,
    /// until released; exit 1 if any was not held.
    Hold(Targets),
    /// Release held jobs (or sweeps): they are planned again in their
    /// place in the queue; exit 1 if any was not released.
    Release(Targets),
    /// Change queued jobs (or sweeps): their priority, begin or timeout,
    /// by the job file's rules (a `--begin` delay counts from now); exit 1
    /// if any was not updated.
    Update {
        /// Job or sweep ids.
        #[arg(required = true)]
        ids: Vec<String>,
        /// From -100 to 100; higher starts first (its arrival kept).
        #[arg(long, allow_hyphen_values = true)]
        priority: Option<i64>,
        /// Not before then: an RFC 3339 time with its offset, or a delay
        /// from now ("2h").
        #[arg(long)]
        begin: Option<String>,
        /// "12h", "90m" or seconds.
        #[arg(long)]
        timeout: Option<String>,
    },
    /// Run ended jobs (or sweeps) again, their job files unchanged: each
    /// as its next attempt under its id, or one as a new job (`--as`);
    /// exit 1 if any was not restarted.
    Restart {
        /// Job or sweep ids.
        #[arg(required = true)]
        ids: Vec<String>,
        /// Run it as a new job of this id instead (one job only).
        #[arg(long = "as", value_name = "NEW")]
        as_id: Option<String>,
    },
    /// Pause running jobs (or sweeps): systemd freezes their processes,
    /// which keep their memory and GPUs; exit 1 if any was not paused.
    Pause(Targets),
    /// Resume paused jobs (or sweeps); exit 1 if any was not resumed.
    Resume(Targets),
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
        /// The output of attempt N (1 first) of a job that ran again
        /// (`retries`); `ptrain status ID` lists its attempts.
        #[arg(long, value_name = "N", conflicts_with = "follow")]
        attempt: Option<u32>,
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
    /// Container images in ptraind's store: reference, digest, size, when
    /// last used and by whom (your name; root sees every user's).
    Images {
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
    /// Ended runs and what they used, from the accounting database (like
    /// sacct): yours; root sees everyone's.
    #[command(after_help = "Examples:
  ptrain history                           your last 100 ended runs
  ptrain history --since 7d --status failed
  ptrain history --user alice --gpus 2 --format id,ended,gpu_hours,cpu,mem_peak
  ptrain history --name 'resnet-*' --csv   (name globs: * ? [..])")]
    History(HistoryArgs),
    /// GPU-hours, CPU-hours, job counts and success rate per user or group
    /// over a period (like sreport): your own line; root sees everyone's.
    #[command(after_help = "Examples:
  ptrain report --since 30d                every user's last 30 days
  ptrain report --since 2026-11-01 --until 2026-12-01 --by group --csv")]
    Report(ReportArgs),
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
        Command::Wait { ids } => wait(ids).await,
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
            list(&filter, all, recent, json, tree).await
        }
        Command::Status { id, json } => status(id, json).await,
        Command::Stop(t) => steer(Verb::Stop, t.ids, t.user).await,
        Command::Hold(t) => steer(Verb::Hold, t.ids, t.user).await,
        Command::Release(t) => steer(Verb::Release, t.ids, t.user).await,
        Command::Update {
            ids,
            priority,
            begin,
            timeout,
        } => stop::update(ids, priority, begin, timeout).await,
        Command::Restart { ids, as_id } => stop::restart(ids, as_id).await,
        Command::Pause(t) => steer(Verb::Pause, t.ids, t.user).await,
        Command::Resume(t) => steer(Verb::Resume, t.ids, t.user).await,
        Command::Logs {
            id,
            follow,
            lines,
            since,
            attempt,
        } => logs(&id, follow, lines, since.as_deref(), attempt).await,
        Command::Du { json } => du(json).await,
        Command::History(args) => history(args).await,
        Command::Report(args) => report(args).await,
        Command::Rejected { json } => rejected(json).await,
        Command::Gpus { json } => gpus(json).await,
        Command::Images { json } => images(json).await,
        Command::Notifications { json, action } => notifications(json, action).await,
        Command::Generate { man, completions } => generate(man, completions),
        Command::CompleteIds => complete_ids().await,
    }
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
