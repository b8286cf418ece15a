//! ptraind: the root daemon that turns spool files into systemd units.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::prelude::*;

use ptrain::config::checks::{self, Severity};
use ptrain::config::{Config, DEFAULT_CONFIG_PATH};

/// Runs GPU training jobs dropped into the spool as supervised systemd units.
#[derive(Parser)]
#[command(
    name = "ptraind",
    version,
    about,
    after_help = "Examples:\n  ptraind --check-config\n  ptraind --config /etc/ptrain/ptrain.toml"
)]
struct Args {
    /// Configuration file.
    #[arg(long, default_value = DEFAULT_CONFIG_PATH, env = "PTRAIN_CONFIG")]
    config: PathBuf,
    /// Validate the configuration, print the result and exit.
    #[arg(long)]
    check_config: bool,
    #[command(subcommand)]
    command: Option<Sub>,
}

#[derive(clap::Subcommand)]
enum Sub {
    /// Write the man page ptraind.8 into DIR (`make docs`).
    #[command(hide = true)]
    Generate {
        #[arg(long)]
        man: PathBuf,
    },
    /// Record how a job unit ended: the ExecStart of ptrain-exit@.service,
    /// which the job unit's OnSuccess=/OnFailure= start. The facts come from
    /// systemd alone ($MONITOR_UNIT, $MONITOR_SERVICE_RESULT,
    /// $MONITOR_EXIT_CODE, $MONITOR_EXIT_STATUS, $MONITOR_INVOCATION_ID).
    #[command(hide = true)]
    RecordExit {
        /// The recorder unit's instance: ok-ID or failed-ID.
        instance: String,
    },
    /// Run a job's command (the job unit's ExecStart, as the job's user):
    /// reads the command and environment from its launch file.
    #[command(hide = true)]
    ExecJob { launch_file: PathBuf },
    /// Write what the job used (its cgroup's CPU time, memory peak and
    /// I/O bytes) into its result directory DIR: the ExecStopPost= of job
    /// units that a release before the usage watcher started (kept so
    /// that their runs are measured across an upgrade).
    #[command(hide = true)]
    JobUsage { result_dir: PathBuf },
    /// The accounting database's side (writing the rows of ended jobs,
    /// back-filling them, `ptrain history` and `ptrain report`): ptraind
    /// runs it as its own short-lived child, as root, so that SQLite never
    /// stays in the daemon's memory. ARGS are as ptraind gives them.
    #[command(hide = true)]
    Accounting {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Read every job record of STATE_DIR for ptraind's start and answer
    /// on stdout (`ptrain::daemon::scan`): ptraind runs it as its own
    /// child, as root, so that a long history's parses never fragment the
    /// daemon's heap.
    #[command(hide = true)]
    ScanRecords { state_dir: PathBuf },
}

/// `ptraind scan-records STATE_DIR`: the child of
/// [`ptrain::daemon::scan`]; its log lines go to ptraind's journal, its
/// errors also to its exit status.
fn scan_records(state_dir: &std::path::Path) -> ExitCode {
    init_logging();
    match ptrain::daemon::scan::run_child(state_dir, std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("ptraind {}: {e}", ptrain::daemon::scan::SUBCOMMAND);
            ExitCode::FAILURE
        }
    }
}

/// `ptraind accounting ARGS`: the child of [`ptrain::accounting::helper`];
/// its errors go to stderr (ptraind's journal) and its exit status.
fn accounting(args: &[String]) -> ExitCode {
    use ptrain::accounting::helper;
    let ran = helper::Task::parse(args).and_then(|(task, state_dir)| {
        helper::run_child(
            task,
            state_dir,
            std::io::stdin().lock(),
            std::io::stdout().lock(),
        )
    });
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ptraind accounting: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `ptraind job-usage DIR`: never fails the unit (its ExecStopPost is
/// "-"), but says on stderr (the job's journal) why no figures were kept.
fn job_usage(dir: &std::path::Path) -> ExitCode {
    let written = ptrain::accounting::usage::collect(std::path::Path::new("/sys/fs/cgroup"))
        .and_then(|usage| ptrain::accounting::usage::write(dir, &usage));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ptraind job-usage: {e}; the job's usage is not recorded");
            ExitCode::FAILURE
        }
    }
}

/// `ptraind record-exit`: runs as root in its own unit, whose environment
/// PID 1 builds (the static unit's settings and the MONITOR_* facts), so
/// nothing the job set reaches this process or its loader.
fn record_exit(config_path: &std::path::Path, instance: &str) -> ExitCode {
    let fail = |message: String| {
        eprintln!("ptraind record-exit {instance}: {message}");
        ExitCode::FAILURE
    };
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let unit = var("MONITOR_UNIT");
    let Some(id) = ptrain::spec::JobId::from_unit_name(&unit) else {
        return fail(format!(
            "$MONITOR_UNIT is {unit:?}, not a ptrain job unit; this runs only from a job unit's OnSuccess=/OnFailure="
        ));
    };
    let this = format!("{}{instance}.service", ptrain::spec::RECORDER_PREFIX);
    if !id.recorder_units().contains(&this) {
        return fail(format!(
            "was triggered by {unit}, whose recorders are {:?}",
            id.recorder_units()
        ));
    }
    let config = match Config::load(config_path) {
        Ok(config) => config,
        Err(e) => return fail(e.to_string()),
    };
    let record = ptrain::store::ExitRecord {
        invocation_id: Some(var("MONITOR_INVOCATION_ID")).filter(|s| !s.is_empty()),
        service_result: var("MONITOR_SERVICE_RESULT"),
        exit_code: var("MONITOR_EXIT_CODE"),
        exit_status: var("MONITOR_EXIT_STATUS"),
        recorded_at: ptrain::now_micros(),
        result: None,
    };
    match ptrain::store::record_exit(&config.state_dir, &id, &record) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e.to_string()),
    }
}

fn generate_man(dir: &std::path::Path) -> ExitCode {
    let extra = ptrain::docgen::ManExtra {
        section: "8",
        files: &[
            (DEFAULT_CONFIG_PATH, "The configuration, every key commented; check a change with ptraind --check-config."),
            ("/var/spool/ptrain", "The spool: users drop job files here (root-owned, mode 1733)."),
            ("/var/lib/ptrain", "Job records, quarantined files and the notification outbox (root only)."),
            ("/var/log/ptrain", "log_dir: each ended job's output, copied from the journal into LOG_DIR/UID/ID.INVOCATION.log.gz (root only; owners read theirs with `ptrain logs`, which falls back to it once the journal has rotated the output away). ptraind's own log is the journal."),
            ("/lib/systemd/system/ptraind.service", "The service; override with systemctl edit ptraind."),
            ("/lib/systemd/system/ptrain.slice", "The parent of every job unit; set limits for all jobs here."),
            ("/usr/share/dbus-1/system.d/org.ptrain.Daemon1.conf", "Who may own and call the D-Bus API."),
        ],
        see_also: &["ptrain(1)", "ptrain.toml(5)", "ptrain-job(5)", "systemctl(1)", "journalctl(1)", "systemd.resource-control(5)"],
    };
    // The crate's name otherwise: the page is ptraind.8.
    let cmd = <Args as clap::CommandFactory>::command().name("ptraind");
    let version = format!("ptrain {}", env!("CARGO_PKG_VERSION"));
    // The file-format pages, ptrain-job(5) and ptrain.toml(5), go with
    // ptraind's: it is what reads both files.
    let pages = ptrain::docgen::write_man_pages(cmd, &extra, dir).and_then(|mut written| {
        written.extend(ptrain::docgen::write_format_pages(dir, &version)?);
        Ok(written)
    });
    match pages {
        Ok(written) => {
            for path in written {
                println!("{}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "ptraind: cannot write the man page into {}: {e}",
                dir.display()
            );
            ExitCode::FAILURE
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PTRAIN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Under systemd (stderr connected to the journal) log structured
    // entries to journald, so `journalctl PTRAIN_JOB=ID` works; elsewhere
    // to stderr. Fields land under their own upper-cased names
    // (`PTRAIN_JOB`, `JOB`, `UNIT`, `ERROR`): the layer's default "F_"
    // prefix would make that `F_PTRAIN_JOB`. So no field may be named like
    // a journal field with a meaning (`message_id`, `priority`, `code_*`).
    let under_journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let journald = under_journal
        .then(|| {
            tracing_journald::layer()
                .ok()
                .map(|l| l.with_field_prefix(None))
        })
        .flatten();
    let stderr = journald.is_none().then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_ansi(
                std::io::IsTerminal::is_terminal(&std::io::stderr())
                    && std::env::var_os("NO_COLOR").is_none(),
            )
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(journald)
        .with(stderr)
        .init();
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Sub::Generate { man }) = &args.command {
        return generate_man(man);
    }
    match &args.command {
        Some(Sub::RecordExit { instance }) => return record_exit(&args.config, instance),
        Some(Sub::ExecJob { launch_file }) => return ptrain::runtime::exec_job(launch_file),
        Some(Sub::JobUsage { result_dir }) => return job_usage(result_dir),
        Some(Sub::Accounting { args }) => return accounting(args),
        Some(Sub::ScanRecords { state_dir }) => return scan_records(state_dir),
        _ => {}
    }
    let config = match Config::load(&args.config) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("ptraind: {e}");
            return ExitCode::from(2);
        }
    };
    let findings = checks::check(&config, &checks::Host::this_host(&config));
    let errors = findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .count();
    if args.check_config {
        for finding in &findings {
            println!("{}", finding.render(&args.config));
        }
        if findings.is_empty() {
            println!("{}: ok", args.config.display());
        } else {
            let warnings = findings.len() - errors;
            let verdict = if errors > 0 {
                "ptraind would refuse to start"
            } else {
                "ptraind would start"
            };
            println!(
                "{}: {errors} error(s), {warnings} warning(s); {verdict}",
                args.config.display()
            );
        }
        println!("  spool_dir = {}", config.spool_dir.display());
        println!("  state_dir = {}", config.state_dir.display());
        println!("  log_dir   = {}", config.log_dir.display());
        println!("  slice     = {}", config.slice);
        println!("  gpus      = backend {:?}", config.gpus.backend);
        println!(
            "  policy    = {} user rule(s){}, {} group rule(s)",
            config.policy.users.len(),
            if config.policy.default.is_some() {
                " and a default"
            } else {
                ""
            },
            config.policy.groups.len()
        );
        return if errors > 0 {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        };
    }
    // Large one-off buffers (the reply to `ptrain list --all`, the whole
    // history as JSON) are mmapped and go back to the kernel when freed.
    // By default glibc raises this threshold after such a free, and later
    // ones stay in the heap for good: one `list --all` over 10,000 jobs
    // left the idle daemon at 78 MiB instead of 35 (`make bench`).
    // SAFETY: mallopt only tunes the allocator; no other thread runs yet.
    // One arena for all threads: each thread that allocates (the tokio
    // workers, the archiver, the notifier, the sd-notify sender, the
    // accounting writer) would otherwise keep an arena of its own with its
    // free pages (`make bench`: idle RSS 19.9 MiB with two arenas, 19.6 with one, against
    // the 20 MiB target; ptraind allocates little at a time, so the one
    // lock costs nothing measurable).
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    };
    init_logging();
    // The same findings --check-config prints: errors refuse the start.
    // (The logger writes to the journal under systemd, else to stderr.)
    for finding in &findings {
        let line = finding.render(&args.config);
        match finding.severity {
            Severity::Error => tracing::error!("{line}"),
            Severity::Warning => tracing::warn!("{line}"),
        }
    }
    if errors > 0 {
        tracing::error!(
            "refusing to start: {errors} error(s) in {}; fix them, then check with `ptraind --check-config`",
            args.config.display()
        );
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ptraind: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let cancel = CancellationToken::new();
        let on_signal = cancel.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            on_signal.cancel();
        });
        match ptrain::daemon::run(config, cancel).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e}");
                eprintln!("ptraind: {e}");
                ExitCode::FAILURE
            }
        }
    })
}
