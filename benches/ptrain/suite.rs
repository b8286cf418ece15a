//! The benchmark suite of issue 10: what ptraind costs on top of systemd.
//!
//! Every figure is measured against the project's real-systemd harness
//! (`tests/harness/boot.sh`), with ptraind run as the Type=notify service of
//! the integration tests' fixture (`tests/integration/daemon.rs`), and set
//! beside a floor measured in the same run:
//!
//! - drop-to-active: the spool file's rename (CLOCK_REALTIME just before
//!   rename(2)) to the unit's ExecMainStartTimestamp as ptraind recorded it
//!   (`started_at`; ptraind releases the unit at the end, so its own record
//!   is read rather than racing systemd's garbage collection). Floor: the
//!   same command started by a bare StartTransientUnit loop, the call's
//!   time to the same timestamp, one unit at a time. Both loops start the
//!   next unit only once the last is quiet: gone from systemd (UnitRemoved),
//!   and for ptraind also its post-end work done (the output archive).
//! - throughput: N files renamed into the spool at once, to the last
//!   JobChanged signal with a final status (sent after the end is recorded
//!   durably). Floor: N units from the bare loop (one call in flight, as
//!   the harness README measured), to the last UnitRemoved.
//! - cost growth: the state dir is pre-populated with finished-job records
//!   written with the `ptrain::store` types (far faster than running them),
//!   ptraind restarted, and a few jobs probed one at a time. Floor: a
//!   control ptraind in its own harness whose only history is its own
//!   probes, probed in turn with it, job for job (and the CLI, run for
//!   run), so that both see the machine in the same state.
//! - footprint: /proc of ptraind's MainPID (found on the host through the
//!   harness's pid namespace): RSS, CPU (schedstat, ns), context switches.
//!
//! The suite is shared by the `make bench` target (`benches/ptrain/main.rs`)
//! and the integration smoke test (`tests/integration/bench_smoke.rs`), both
//! of which have the fixture modules `daemon` and `harness` at their root.
//! It never asserts a speed itself: figures carry targets, and the robust
//! ones an enforced limit ([`report::Enforced`]) that the bench binary
//! checks under `BENCH_ENFORCE=1` (`make bench-ci`, run by CI). Wall-clock
//! latency and throughput ratios are reported, never enforced: on a shared
//! CI machine other work moves them by more than any target's margin.
#![allow(dead_code)]

#[path = "events.rs"]
mod events_bench;
#[path = "images.rs"]
mod images_bench;
#[path = "report.rs"]
pub mod report;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::num::NonZeroUsize;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use ptrain::api::Daemon1Proxy;
use ptrain::store::{JobRecord, JobState, Outcome, SpoolSource};
use ptrain::unit::PropValue;
use ptrain::users::Owner;
use ptrain::views::JobView;
use serde_json::json;
use tokio::runtime::Runtime;
use tokio::sync::watch;
use zbus::{Connection, OwnedVariant};
use zbus_systemd::systemd1::ManagerProxy;

use crate::daemon::{Opts, TestDaemon, ALICE, BOB};
use crate::harness::{ensure_user, wait_for, Harness};
use report::{percentile, Figure, Machine, Results, Target};

/// Declared GPUs of the throughput daemon; GPU jobs ask one each.
const GPUS: u32 = 4;
/// Alternating floor/ptraind pairs behind the GPU throughput figure.
const GPU_PAIRS: usize = 3;
/// The trivial job.
const TRUE: &str = "/bin/true";
/// Most StartTransientUnit jobs the bare loop leaves waiting inside
/// systemd: past ~512, dbus-daemon's match-rule limit stops the replies.
const BARE_MAX_PENDING: usize = 256;
/// How long the host sits idle before each job of the one-at-a-time loops,
/// ptraind's and the bare floor's alike: a job dropped on an idle host.
/// It matters because moving a process into a new cgroup (systemd does it
/// for every unit, between fork and ExecMainStartTimestamp) waits for an
/// RCU grace period unless another migration happened within roughly the
/// last 10-20 ms: 5 to 20 ms on the 2-core VM the README quotes, against
/// 0.1-0.3 ms back to back. A loop that starts the next unit at once would
/// measure a warm kernel no dropped job meets; both loops wait this long.
const IDLE_GAP: Duration = Duration::from_millis(50);
/// A wait for jobs gives up when none of them moved on for this long.
const STALL: Duration = Duration::from_secs(60);
/// How long the slow notification endpoint holds each request.
const SLOW_ENDPOINT_DELAY: Duration = Duration::from_secs(2);
/// How long an ended job may take to go quiet (unit gone, output archived)
/// before the next drop goes ahead anyway, with a message.
const QUIET_TIMEOUT: Duration = Duration::from_secs(30);
/// Growth of ptraind's CPU per job with history that CI enforces: the
/// issue's target. Measured against the control, job for job, CPU time per
/// job holds still to a few percent; measured against job #1 alone, it
/// drifted by up to 1.7x with the machine's other work.
const CPU_GROWTH_LIMIT: f64 = 1.25;
const CPU_GROWTH_WHY: &str = "the issue's target, against a control ptraind without history probed in turn, job for job (the job #1 row compares two equal daemons); 0.93x to 1.09x over 15 marks in 3 runs on a loaded 2-core machine";
/// Why the idle RSS with a long history against none is enforced at 1.3x
/// rather than the issue's 1.1x.
const IDLE_VS_NONE_WHY: &str = "the issue's target: 1.02x measured (15.0 against 14.7 MiB) since the start's read of every record runs in a child process (`ptraind scan-records`); it was 1.18x with the read in the daemon, whose heap it left fragmented";
/// `Status` with a long history against the control: a guard against
/// gross O(history) regressions, wide enough for a loaded machine's noise.
const STATUS_GUARD: f64 = 2.0;
/// D-Bus calls timed for each run of a CLI command.
const API_RUNS_PER_CLI_RUN: usize = 20;
/// Context switches allowed in the idle window ([`IDLE_WINDOW`]): the
/// shipped unit's WatchdogSec=30s means one ping every 15 s, so the window
/// holds one or two, up to four switches each (tokio's timer, the
/// notify socket); a loop polling once a second would show 16 or more.
const IDLE_WAKEUPS_LIMIT: f64 = 12.0;
/// Longer than the watchdog interval, so the ping is counted every time
/// and anything else stands out against it.
const IDLE_WINDOW: Duration = Duration::from_secs(16);

/// How much to run. `full` has the issue's sizes; `ci` finishes in about
/// three minutes on two cores (the history's 100,000 jobs included: they
/// are written directly, not run); `smoke` only proves the code works.
#[derive(Clone, Debug)]
pub struct Scale {
    pub name: String,
    /// Jobs dropped one at a time for the latency figures (and as many
    /// units from the bare loop).
    pub latency_jobs: usize,
    /// Sizes of the "dropped at once" runs, with and without GPUs.
    pub throughput_sizes: Vec<usize>,
    /// The job numbers whose cost is probed ("the 1st, the 10,000th"); the
    /// history holds number - 1 finished jobs when the probe starts.
    pub history_marks: Vec<usize>,
    /// Jobs probed one at a time at each mark (and as many on the control).
    pub probe_jobs: usize,
    /// The mark at which the idle footprint is taken.
    pub idle_mark: usize,
    pub idle_window: Duration,
    /// Jobs queued behind busy GPUs for the per-queued-job footprint.
    pub queued_jobs: usize,
    /// Jobs with a notification to the slow endpoint (0: skipped).
    pub notify_jobs: usize,
    /// Runs of each CLI command; the median is reported.
    pub cli_runs: usize,
    /// Accounting on against off: rounds of one block each, and the jobs
    /// of a block.
    pub accounting_rounds: usize,
    pub accounting_jobs: usize,
    /// Image jobs (and as many host jobs, in turn) dropped one at a time
    /// for the image's drop-to-active, once the image is pulled.
    pub image_jobs: usize,
    /// Size of the random image pulled by ptrain and by skopeo (MiB, in
    /// [`IMAGE_LAYERS`] gzip layers), and the runs of each.
    pub image_pull_mib: u64,
    pub image_pull_runs: usize,
    /// The event stream on against off: rounds of one burst each way, and
    /// the jobs of a burst.
    pub events_rounds: usize,
    pub events_jobs: usize,
}

impl Scale {
    pub fn full() -> Scale {
        Scale {
            name: "full".into(),
            latency_jobs: 1000,
            throughput_sizes: vec![1000, 10_000],
            history_marks: vec![1, 10_000, 100_000],
            probe_jobs: 30,
            idle_mark: 10_000,
            idle_window: IDLE_WINDOW,
            queued_jobs: 1000,
            notify_jobs: 1000,
            cli_runs: 5,
            accounting_rounds: 6,
            accounting_jobs: 30,
            image_jobs: 200,
            image_pull_mib: 1024,
            image_pull_runs: 3,
            events_rounds: 2,
            events_jobs: 5000,
        }
    }

    pub fn ci() -> Scale {
        Scale {
            name: "ci".into(),
            // The p99 of 500 is their 5th worst: one stall of a shared
            // disk or CPU does not decide it (of 200, two did).
            latency_jobs: 500,
            throughput_sizes: vec![500],
            history_marks: vec![1, 10_000, 100_000],
            // Enough that CPU per job, the enforced figure, holds still.
            probe_jobs: 50,
            idle_mark: 10_000,
            idle_window: IDLE_WINDOW,
            queued_jobs: 200,
            // Runs of a few seconds moved the ratio by 10 % and more.
            notify_jobs: 500,
            cli_runs: 5,
            accounting_rounds: 6,
            accounting_jobs: 30,
            image_jobs: 60,
            // The issue's 1 GiB: the whole images part took 89 s on the
            // 2-core machine (the pulls, the image's build and push 45 s).
            image_pull_mib: 1024,
            image_pull_runs: 3,
            events_rounds: 4,
            events_jobs: 100,
        }
    }

    /// Tiny: every scenario runs, no figure means anything.
    pub fn smoke() -> Scale {
        Scale {
            name: "smoke".into(),
            latency_jobs: 10,
            throughput_sizes: vec![20],
            history_marks: vec![1, 200],
            probe_jobs: 3,
            idle_mark: 200,
            idle_window: Duration::from_secs(1),
            queued_jobs: 20,
            notify_jobs: 10,
            cli_runs: 1,
            accounting_rounds: 1,
            accounting_jobs: 2,
            image_jobs: 3,
            image_pull_mib: 16,
            image_pull_runs: 1,
            events_rounds: 1,
            events_jobs: 3,
        }
    }

    /// The scale with `sizes` (`BENCH_SIZES`, comma-separated; empty
    /// keeps the scale's own) as its throughput sizes.
    pub fn with_sizes(mut self, sizes: &str) -> Result<Scale, String> {
        if sizes.trim().is_empty() {
            return Ok(self);
        }
        self.throughput_sizes = sizes
            .split(',')
            .map(|n| n.trim().parse::<usize>().ok().filter(|n| *n > 0))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                format!("BENCH_SIZES={sizes:?} is not a list of job counts like 1000,10000")
            })?;
        Ok(self)
    }

    /// `BENCH_SCALE`: full (default), ci, quick or smoke.
    pub fn from_name(name: &str) -> Result<Scale, String> {
        match name {
            "" | "full" => Ok(Scale::full()),
            "ci" => Ok(Scale::ci()),
            "smoke" => Ok(Scale::smoke()),
            // For profiling one change: the throughput cases big enough
            // to see, the rest as small as smoke.
            "quick" => Ok(Scale {
                name: "quick".into(),
                latency_jobs: 10,
                throughput_sizes: vec![300],
                queued_jobs: 20,
                notify_jobs: 300,
                ..Scale::smoke()
            }),
            other => Err(format!(
                "BENCH_SCALE={other:?} is not a scale; use full, ci, quick or smoke"
            )),
        }
    }
}

/// Runs every scenario and returns the figures. Panics only when the
/// harness or ptraind cannot be set up at all; a scenario that fails is
/// reported as a figure without a value.
pub fn run(scale: &Scale) -> Results {
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut results = Results::new(&scale.name, machine());
    let mut bench = Bench {
        rt,
        scale: scale.clone(),
        results: &mut results,
    };
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    if only.is_empty() || only == "throughput" || only == "gpu" || only == "burst" {
        bench.throughput_daemon(match only.as_str() {
            "gpu" => Part::Gpu,
            "burst" => Part::Burst,
            _ => Part::All,
        });
    }
    if only.is_empty() || only == "history" {
        bench.history_daemon();
    }
    if only.is_empty() || only == "accounting" {
        bench.accounting_on_vs_off();
    }
    if only.is_empty() || only == "images" {
        bench.images();
    }
    if only.is_empty() || only == "events" {
        bench.events_on_vs_off();
    }
    results.wall_secs = started.elapsed().as_secs_f64();
    results.machine.load_end = load_average();
    results
}

/// Progress, on stderr: the table alone goes to stdout.
fn say(msg: &str) {
    eprintln!("[bench] {msg}");
}

/// Which part of the throughput daemon's scenarios runs (`BENCH_ONLY`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    All,
    /// The GPU bursts and their floors alone, for profiling them.
    Gpu,
    /// The trivial bursts with the bystander's responsiveness, no floors.
    Burst,
}

struct Bench<'a> {
    rt: Runtime,
    scale: Scale,
    results: &'a mut Results,
}

impl Bench<'_> {
    fn push(&mut self, figure: Figure) {
        self.results.push(figure);
    }

    fn detail(&mut self, key: &str, value: serde_json::Value) {
        self.results.details.insert(key.into(), value);
    }

    // -----------------------------------------------------------------
    // The throughput daemon: floors, latency, throughput, queued jobs,
    // notifications.

    fn throughput_daemon(&mut self, part: Part) {
        let endpoint = SlowEndpoint::start(SLOW_ENDPOINT_DELAY);
        // Ended units are released at once ([jobs] keep_ended_units =
        // "0s"): each loop waits for its job's unit to be gone from
        // systemd, as the bare floor loop does, before the next drop.
        // The archives' floor is low: the default (10%, at most 4 GiB) can
        // be more than a CI machine has free after its build, and the
        // archiving is part of what is measured.
        let extra = format!(
            "max_queued_per_user = 1000000\n\
             [jobs]\nkeep_ended_units = \"0s\"\n\
             [logs]\nmin_free = \"1%\"\n\
             [channels.hook]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{}/hook\"\n",
            endpoint.port
        );
        say("booting the harness and ptraind");
        let d = TestDaemon::start_with(
            "bench",
            Opts {
                gpus: GPUS,
                extra_config: extra,
                ..Opts::default()
            },
        );
        let dropper = Dropper::new(&d);
        let (tracker, bare_floors) = match part {
            Part::All => self.trivial_jobs(&d, &dropper),
            Part::Gpu | Part::Burst => {
                let tracker = self.rt.block_on(Tracker::connect(&d.harness.bus_address()));
                (tracker, HashMap::new())
            }
        };
        if part == Part::Burst {
            for &n in &self.scale.throughput_sizes.clone() {
                self.throughput(&d, &tracker, &dropper, n, None, None);
            }
        } else {
            for &n in &self.scale.throughput_sizes.clone() {
                let floor = bare_floors.get(&n).copied();
                self.gpu_throughput(&d, &tracker, &dropper, n, floor);
            }
        }
        if part == Part::All {
            self.notifications(&d, &tracker, &dropper, &endpoint);
        }
        drop(tracker);
        let root = d.root.clone();
        drop(d);
        let _ = std::fs::remove_dir_all(root);
    }

    /// The floors, drop-to-active latency, the queued footprint and the
    /// trivial bursts; returns the tracker of ptraind's job signals and
    /// the bare loop's throughput by burst size.
    fn trivial_jobs(
        &mut self,
        d: &TestDaemon,
        dropper: &Dropper,
    ) -> (Tracker, HashMap<usize, f64>) {
        // The floors first, with ptraind stopped: systemd alone.
        let (ok, out) = d.harness.systemctl(&["stop", "ptraind.service"]);
        assert!(ok, "cannot stop ptraind for the floors: {out}");
        let floors = self.floors(d, dropper);
        d.start_service();
        let tracker = self.rt.block_on(Tracker::connect(&d.harness.bus_address()));

        self.latency(d, &tracker, dropper, &floors);
        // Before the bursts: a heap grown by them hides new allocations.
        self.queued_footprint(d, &tracker, dropper);
        for &n in &self.scale.throughput_sizes.clone() {
            let floor = floors.throughput.get(&n).copied();
            let props = floors.props_throughput(n);
            self.throughput(d, &tracker, dropper, n, floor, props);
            for (key, label, rate) in floors
                .variants
                .iter()
                .filter(|v| v.0.ends_with(&format!(".{n}")))
            {
                self.push(Figure::new(key, label, "jobs/s", Some(*rate)).floor(floor, "bare"));
            }
        }
        (tracker, floors.throughput)
    }

    fn floors(&mut self, d: &TestDaemon, dropper: &Dropper) -> Floors {
        let bus = d.harness.bus_address();
        let bare = self.rt.block_on(Bare::connect(&bus));
        let procs = Procs::find(&d.harness);
        let minimal = |add_ref| bare_properties(dropper.uid, add_ref);
        let ptrain_props = PtrainProps::new(d);
        let n = self.scale.latency_jobs;

        flush_disk();
        say(&format!("floor: {n} units one at a time (bare)"));
        let lat = self
            .rt
            .block_on(bare.latency("bench-lat", n, IDLE_GAP, |_| minimal(true)));
        say(&format!(
            "floor: {} units one at a time, back to back (bare)",
            n / 2
        ));
        let lat_warm = self
            .rt
            .block_on(bare.latency("bench-wlat", n / 2, Duration::ZERO, |_| minimal(true)));
        say(&format!(
            "floor: {} units one at a time (ptrain's unit properties)",
            n / 2
        ));
        let lat_props = self
            .rt
            .block_on(bare.latency("bench-plat", n / 2, IDLE_GAP, |i| {
                ptrain_props.properties(&format!("plat-{i}"), true, true)
            }));
        let mut throughput = HashMap::new();
        let mut variants = Vec::new();
        let mut cpu = serde_json::Map::new();
        for (v, &size) in self.scale.throughput_sizes.iter().enumerate() {
            say(&format!("floor: {size} units at once (bare)"));
            let cpu0 = procs.cpu();
            let secs =
                self.rt.block_on(
                    bare.throughput(&format!("bench-tp{size}"), size, None, |_| minimal(false)),
                );
            cpu.insert(
                format!("bare.{size}"),
                procs.cpu().since(&cpu0).per_job_all(size),
            );
            throughput.insert(size, size as f64 / secs);
            if v > 0 {
                continue;
            }
            // Where the gap to the bare floor is: the unit ptraind asks
            // for, with and without its exit recorder (ExecStopPost). The
            // GPU jobs' floor runs beside them ([`Bench::gpu_throughput`]).
            for (key, label, recorder) in [
                ("props", "bare loop with ptrain's unit properties", true),
                (
                    "props-norec",
                    "  the same without the exit recorder (ExecStopPost)",
                    false,
                ),
            ] {
                say(&format!("floor: {size} units at once ({key})"));
                let cpu0 = procs.cpu();
                let secs = self.rt.block_on(bare.throughput(
                    &format!("bench-{key}{size}"),
                    size,
                    None,
                    |i| ptrain_props.properties(&format!("{key}-{i}"), false, recorder),
                ));
                cpu.insert(
                    format!("{key}.{size}"),
                    procs.cpu().since(&cpu0).per_job_all(size),
                );
                variants.push((
                    format!("floor.{key}.throughput.{size}"),
                    label,
                    size as f64 / secs,
                ));
            }
        }
        self.detail(
            "floor",
            json!({
                "latency_ms": summary(&lat),
                "latency_back_to_back_ms": summary(&lat_warm),
                "latency_ptrain_props_ms": summary(&lat_props),
                "throughput_jobs_per_s": throughput.iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>(),
                "throughput_variants": variants.iter().map(|(k, _, v)| (k.clone(), *v)).collect::<BTreeMap<_, _>>(),
                "cpu_ms_per_job": cpu,
            }),
        );
        Floors {
            latency: lat,
            latency_warm: lat_warm,
            latency_props: lat_props,
            throughput,
            variants,
        }
    }

    fn latency(&mut self, d: &TestDaemon, tracker: &Tracker, dropper: &Dropper, floors: &Floors) {
        let n = self.scale.latency_jobs;
        flush_disk();
        say(&format!("ptraind: {n} jobs dropped one at a time"));
        // Only for this loop: its signal match rules would cost dbus-daemon
        // a copy of every unit signal in the bursts.
        let mut quiet = self.rt.block_on(Quiescence::connect(d));
        let samples = self.sequential(tracker, &mut quiet, None, dropper, "lat", n, "");
        drop(quiet);
        let active: Vec<f64> = samples.iter().filter_map(|s| s.to_active_ms()).collect();
        let claim: Vec<f64> = samples.iter().filter_map(|s| s.to_claim_ms()).collect();
        // ptraind's own part: until StartTransientUnit has answered (its
        // "unit started" line); the rest is systemd's.
        let replied = logged_at(d, "unit started");
        let own: Vec<f64> = samples
            .iter()
            .filter_map(|s| {
                let at = replied.get(&s.id)?;
                Some(*at as f64 / 1e3 - s.dropped_at as f64 / 1e3)
            })
            .collect();
        let quiet: Vec<f64> = samples.iter().map(|s| s.quiet_ms).collect();
        let failed = samples.iter().filter(|s| s.status != "succeeded").count();
        let note = if failed > 0 {
            format!("{failed} of {n} jobs did not succeed")
        } else {
            String::new()
        };
        let bare = "bare StartTransientUnit loop";
        for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
            let mut f = Figure::new(
                &format!("latency.{name}"),
                &format!("drop-to-active {name}, {n} jobs one at a time"),
                "ms",
                percentile(&active, q),
            )
            .floor(percentile(&floors.latency, q), bare)
            .note(note.clone());
            if name == "p99" {
                f = f.target(Target::MaxRatio(1.5));
            }
            self.push(f);
        }
        self.push(Figure::new(
            "latency.claim.p50",
            "  drop to the start of the claim, p50",
            "ms",
            percentile(&claim, 0.5),
        ));
        for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
            self.push(Figure::new(
                &format!("latency.ptraind.{name}"),
                &format!("  drop to StartTransientUnit's reply, {name}"),
                "ms",
                percentile(&own, q),
            ));
        }
        for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
            // Like for like: the units ptraind asks for carry the hardening
            // baseline and the exit recorder, which systemd sets up before
            // the job's process starts.
            let mut f = Figure::new(
                &format!("latency.vs_props.{name}"),
                &format!("  drop-to-active {name} against the bare loop with ptrain's units"),
                "ms",
                percentile(&active, q),
            )
            .floor(
                percentile(&floors.latency_props, q),
                "bare loop, ptrain's units",
            );
            if name == "p99" {
                f = f.target(Target::MaxRatio(1.5));
            }
            self.push(f);
        }
        for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
            self.push(Figure::new(
                &format!("floor.warm.latency.{name}"),
                &format!("  bare loop back to back (no idle gap: cgroup attach warm), {name}"),
                "ms",
                percentile(&floors.latency_warm, q),
            ));
        }
        for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
            self.push(
                Figure::new(
                    &format!("floor.props.latency.{name}"),
                    &format!("  bare loop with ptrain's unit properties, {name}"),
                    "ms",
                    percentile(&floors.latency_props, q),
                )
                .floor(percentile(&floors.latency, q), "bare"),
            );
        }
        self.detail(
            "latency",
            json!({"drop_to_active_ms": summary(&active), "drop_to_claim_ms": summary(&claim),
                   "drop_to_start_reply_ms": summary(&own), "final_to_quiet_ms": summary(&quiet),
                   "failed": failed}),
        );
    }

    /// Drops `n` jobs one at a time, each after the previous one ended and
    /// went quiet ([`Quiescence`]), as the bare floor loop does. With
    /// `ptraind` (its host pid), each probe also has ptraind's CPU time once
    /// the job was quiet: every job's work, one job at a time.
    #[allow(clippy::too_many_arguments)]
    fn sequential(
        &mut self,
        tracker: &Tracker,
        quiet: &mut Quiescence,
        ptraind: Option<u32>,
        dropper: &Dropper,
        prefix: &str,
        n: usize,
        extra: &str,
    ) -> Vec<Probe> {
        (0..n)
            .map(|i| {
                let id = format!("{prefix}-{i}");
                self.probe(tracker, quiet, ptraind, dropper, &id, extra)
            })
            .collect()
    }

    /// Drops one job, follows it to its end and waits until it is quiet.
    fn probe(
        &mut self,
        tracker: &Tracker,
        quiet: &mut Quiescence,
        ptraind: Option<u32>,
        dropper: &Dropper,
        id: &str,
        extra: &str,
    ) -> Probe {
        self.probe_json(tracker, quiet, ptraind, dropper, id, &job_json(extra))
    }

    /// [`Bench::probe`] of the job file `json`.
    fn probe_json(
        &mut self,
        tracker: &Tracker,
        quiet: &mut Quiescence,
        ptraind: Option<u32>,
        dropper: &Dropper,
        id: &str,
        json: &str,
    ) -> Probe {
        dropper.stage(id, json);
        // A job dropped on an idle host, as the bare floor loop starts its
        // units (see IDLE_GAP).
        std::thread::sleep(IDLE_GAP);
        let mark = tracker.mark();
        let dropped_at = dropper.publish(id);
        let ids = [id.to_string()];
        let waited = self
            .rt
            .block_on(tracker.wait(mark, &ids, is_final, Duration::from_secs(60)));
        if let Err(e) = waited {
            say(&format!("job {id}: {e}"));
        }
        let view = self.rt.block_on(tracker.status(id));
        let t0 = Instant::now();
        if let Some(v) = &view {
            if let Err(e) = self.rt.block_on(quiet.wait(v)) {
                say(&format!("job {id}: {e}"));
            }
        }
        let quiet_ms = t0.elapsed().as_secs_f64() * 1e3;
        let cpu_ns = ptraind.and_then(ProcSample::read).map(|s| s.cpu_ns);
        Probe {
            id: id.to_string(),
            dropped_at,
            submitted_at: view.as_ref().map(|v| v.submitted_at),
            started_at: view.as_ref().and_then(|v| v.started_at),
            status: view.map(|v| v.status).unwrap_or_else(|| "unknown".into()),
            quiet_ms,
            cpu_ns,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn throughput(
        &mut self,
        d: &TestDaemon,
        tracker: &Tracker,
        dropper: &Dropper,
        n: usize,
        floor: Option<f64>,
        props_floor: Option<f64>,
    ) {
        let label = format!("throughput, {n} trivial jobs at once");
        say(&format!("ptraind: {label}"));
        // Meanwhile another user asks for a status and drops a file of his
        // own now and then: the burst must not freeze ptraind for him.
        let bystander = Bystander::start(self, d, tracker, &format!("tp{n}"));
        let run = self.burst(d, tracker, dropper, &format!("tp{n}"), n, "");
        let (status_ms, ping_ms, claim_ms) = bystander.finish(self, tracker);
        for (key, what, samples) in [
            ("api", "another user's Status() over D-Bus", &status_ms),
            (
                "ping",
                "  the bus's own round trip to ptraind (Peer.Ping, no state task)",
                &ping_ms,
            ),
            ("claim", "another user's file, drop to claimed", &claim_ms),
        ] {
            let figure = Figure::new(
                &format!("responsive.{key}.{n}"),
                &format!("  {what}, p99 during the burst"),
                "ms",
                percentile(samples, 0.99),
            );
            // The ping is what the host's load alone costs a call.
            self.push(match key {
                "ping" => figure,
                _ => figure.target(Target::MaxValue(50.0)),
            });
            self.detail(
                &format!("responsive.{key}.{n}"),
                json!({"samples": samples.len(), "ms": summary(samples)}),
            );
        }
        let key = format!("throughput.{n}");
        self.push(
            Figure::new(&key, &label, "jobs/s", run.jobs_per_s())
                .floor(floor, "bare loop")
                .target(Target::MinRatio(0.8))
                .note(run.note()),
        );
        if props_floor.is_some() {
            // The same units systemd is asked for: the hardening baseline
            // and the exit recorder are part of every job (README).
            self.push(
                Figure::new(
                    &format!("{key}.vs_props"),
                    "  … against the bare loop with ptrain's unit properties",
                    "jobs/s",
                    run.jobs_per_s(),
                )
                .floor(props_floor, "bare loop, ptrain's units")
                .target(Target::MinRatio(0.8)),
            );
        }
        // What a burst must never cost: systemd cut off the bus (it then
        // forgets every reference) or ptraind restarted (its callers get
        // errors meanwhile). Counts, not timings: enforced.
        for (what, label, count) in [
            (
                "restarts",
                "  ptraind restarts during the burst",
                run.restarts,
            ),
            (
                "systemd_cut_off",
                "  systemd cut off the bus during the burst",
                run.systemd_cut_off,
            ),
        ] {
            self.push(
                Figure::new(&format!("{key}.{what}"), label, "", Some(f64::from(count))).enforce(
                    Target::MaxValue(0.0),
                    "a burst must cost no restart and no lost bus",
                ),
            );
        }
        self.push(Figure::new(
            &format!("cpu.ptraind.tp{n}"),
            "  ptraind CPU per job",
            "ms",
            // A restart loses the CPU of the process that died.
            run.cpu.per_job("ptraind", n).filter(|_| run.restarts == 0),
        ));
        self.detail(&key, run.to_json(n));
    }

    /// GPU jobs (1 of [`GPUS`] each) against their floor: the bare loop
    /// starting ptraind's units for them, at most [`GPUS`] alive. Their
    /// ratio is the one most sensitive to what else runs on the host, so
    /// floor and ptraind alternate, each run right after the other, and
    /// the medians are compared ([`GPU_PAIRS`] pairs up to 1,000 jobs).
    fn gpu_throughput(
        &mut self,
        d: &TestDaemon,
        tracker: &Tracker,
        dropper: &Dropper,
        n: usize,
        bare_floor: Option<f64>,
    ) {
        let pairs = if n <= 1000 { GPU_PAIRS } else { 1 };
        let ptrain_props = PtrainProps::new(d);
        let mut floors = Vec::new();
        let mut floor_cpu = Vec::new();
        let mut runs = Vec::new();
        for pair in 0..pairs {
            say(&format!(
                "floor: {n} units, at most {GPUS} alive (ptrain's GPU units), pair {} of {pairs}",
                pair + 1
            ));
            let (ok, out) = d.harness.systemctl(&["stop", "ptraind.service"]);
            assert!(ok, "cannot stop ptraind for the floor: {out}");
            let bare = self.rt.block_on(Bare::connect(&d.harness.bus_address()));
            let prefix = format!("bench-gpu{n}p{pair}");
            let procs = Procs::find(&d.harness);
            let cpu0 = procs.cpu();
            let secs = self
                .rt
                .block_on(bare.throughput(&prefix, n, Some(GPUS as usize), |i| {
                    ptrain_props.properties_on(
                        &format!("gpu{n}p{pair}-{i}"),
                        false,
                        true,
                        Some(i as u32 % GPUS),
                    )
                }));
            drop(bare);
            floor_cpu.push(procs.cpu().since(&cpu0).per_job_all(n));
            floors.push(n as f64 / secs);
            d.start_service();
            say(&format!(
                "ptraind: throughput, {n} jobs at once, 1 of {GPUS} GPUs each, pair {} of {pairs}",
                pair + 1
            ));
            let run = self.burst(
                d,
                tracker,
                dropper,
                &format!("tpg{n}p{pair}"),
                n,
                ",\"gpus\":1",
            );
            runs.push(run);
        }
        let floor = median(&floors);
        // The run with the median rate stands for all (its CPU, its note).
        runs.sort_by(|a, b| {
            let rate = |r: &Burst| r.jobs_per_s().unwrap_or(0.0);
            rate(a).total_cmp(&rate(b))
        });
        let run = runs.swap_remove(runs.len() / 2);
        let key = format!("throughput.gpu.{n}");
        let label = format!("throughput, {n} jobs at once, 1 of {GPUS} GPUs each");
        self.push(
            Figure::new(&key, &label, "jobs/s", run.jobs_per_s())
                .floor(bare_floor, "bare loop")
                .target(Target::MinRatio(0.8))
                .note(run.note()),
        );
        self.push(
            Figure::new(
                &format!("{key}.vs_props"),
                "  … against the bare loop with ptrain's units, as many alive as GPUs",
                "jobs/s",
                run.jobs_per_s(),
            )
            .floor(floor, "bare loop, ptrain's units")
            .target(Target::MinRatio(0.8)),
        );
        self.push(
            Figure::new(
                &format!("floor.props-gpus.throughput.{n}"),
                &format!(
                    "bare loop with ptrain's GPU units, at most {GPUS} alive (median of {pairs})"
                ),
                "jobs/s",
                floor,
            )
            .floor(bare_floor, "bare"),
        );
        self.push(Figure::new(
            &format!("cpu.ptraind.tpg{n}"),
            "  ptraind CPU per job",
            "ms",
            run.cpu.per_job("ptraind", n).filter(|_| run.restarts == 0),
        ));
        let mut detail = run.to_json(n);
        detail["floor_jobs_per_s"] = json!(floors);
        // Where the CPU of a job goes, floor beside ptraind: on 2 cores
        // the host is saturated, so any CPU a job adds lowers the rate.
        detail["floor_cpu_ms_per_job"] = json!(floor_cpu);
        detail["pairs"] = json!(pairs);
        self.detail(&key, detail);
    }

    /// Renames `n` staged files into the spool at once and waits until
    /// every job has ended and been recorded.
    fn burst(
        &mut self,
        d: &TestDaemon,
        tracker: &Tracker,
        dropper: &Dropper,
        tag: &str,
        n: usize,
        extra: &str,
    ) -> Burst {
        let ids: Vec<String> = (0..n).map(|i| format!("{tag}-{i}")).collect();
        for id in &ids {
            dropper.stage(id, &job_json(extra));
        }
        let procs = Procs::find(&d.harness);
        let restarts0 = restarts(d);
        let journal_at = journal_cursor(d);
        let cpu0 = procs.cpu();
        let mark = tracker.mark();
        let t0 = Instant::now();
        for id in &ids {
            dropper.publish(id);
        }
        let waited = self
            .rt
            .block_on(tracker.wait(mark, &ids, is_final, deadline(n)));
        let cpu = procs.cpu().since(&cpu0);
        let (secs, error) = match waited {
            Ok(last) => (Some(last.duration_since(t0).as_secs_f64()), None),
            Err(e) => (None, Some(e)),
        };
        let failed = tracker.count_since(mark, &ids, |s| is_final(s) && s != "succeeded");
        Burst {
            jobs: n,
            secs,
            error,
            failed,
            restarts: restarts(d).saturating_sub(restarts0),
            systemd_cut_off: systemd_cut_off(d, &journal_at),
            cpu,
        }
    }

    fn queued_footprint(&mut self, d: &TestDaemon, tracker: &Tracker, dropper: &Dropper) {
        let q = self.scale.queued_jobs;
        say(&format!(
            "ptraind: footprint of {q} jobs queued behind busy GPUs"
        ));
        let pid = ptraind_pid(d);
        let blockers: Vec<String> = (0..GPUS).map(|i| format!("hold-{i}")).collect();
        for id in &blockers {
            dropper.stage(
                id,
                &json!({"version": 1, "command": ["/bin/sleep", "3600"], "gpus": 1}).to_string(),
            );
        }
        let mark = tracker.mark();
        for id in &blockers {
            dropper.publish(id);
        }
        let running = self.rt.block_on(tracker.wait(
            mark,
            &blockers,
            |s| s == "running",
            Duration::from_secs(60),
        ));
        if let Err(e) = running {
            self.push(
                Figure::new(
                    "queued.rss_per_job",
                    "ptraind RSS per queued job",
                    "KiB",
                    None,
                )
                .note(format!("the GPU holders did not start: {e}")),
            );
            return;
        }
        settle();
        let before = ProcSample::read(pid);
        let ids: Vec<String> = (0..q).map(|i| format!("queued-{i}")).collect();
        for id in &ids {
            dropper.stage(id, &job_json(",\"gpus\":1"));
        }
        let mark = tracker.mark();
        for id in &ids {
            dropper.publish(id);
        }
        let queued = self
            .rt
            .block_on(tracker.wait(mark, &ids, |s| s == "queued", deadline(q)));
        settle();
        let after = ProcSample::read(pid);
        let per_job = match (&queued, before, after) {
            (Ok(_), Some(b), Some(a)) => Some((a.rss_kib as f64 - b.rss_kib as f64) / q as f64),
            _ => None,
        };
        let cpu_claim = match (before, after) {
            (Some(b), Some(a)) => Some(a.cpu_ns.saturating_sub(b.cpu_ns) as f64 / 1e6 / q as f64),
            _ => None,
        };
        self.push(
            Figure::new(
                "queued.rss_per_job",
                &format!("ptraind RSS per queued job ({q} queued)"),
                "KiB",
                per_job,
            )
            .note(queued.err().unwrap_or_default()),
        );
        self.push(Figure::new(
            "queued.cpu_per_claim",
            "  ptraind CPU per job claimed into a busy queue",
            "ms",
            cpu_claim,
        ));
        // Free the GPUs: the queue drains, and this run ends clean.
        let mark = tracker.mark();
        let t0 = Instant::now();
        for id in &blockers {
            let _ = self.rt.block_on(tracker.stop(id));
        }
        let drained = self
            .rt
            .block_on(tracker.wait(mark, &ids, is_final, deadline(q)));
        let drain_rate = drained
            .as_ref()
            .ok()
            .map(|last| q as f64 / last.duration_since(t0).as_secs_f64());
        self.detail(
            "queued",
            json!({
                "jobs": q,
                "rss_kib_before": before.map(|s| s.rss_kib),
                "rss_kib_after": after.map(|s| s.rss_kib),
                "drain_jobs_per_s": drain_rate,
            }),
        );
    }

    fn notifications(
        &mut self,
        d: &TestDaemon,
        tracker: &Tracker,
        dropper: &Dropper,
        endpoint: &SlowEndpoint,
    ) {
        let n = self.scale.notify_jobs;
        if n == 0 {
            return;
        }
        say(&format!(
            "ptraind: {n} jobs without, then with a notification to a {}-s endpoint",
            SLOW_ENDPOINT_DELAY.as_secs()
        ));
        let without = self.burst(d, tracker, dropper, &format!("nn{n}"), n, "");
        let with = self.burst(
            d,
            tracker,
            dropper,
            &format!("ny{n}"),
            n,
            ",\"notify\":[\"hook\"]",
        );
        let requests = endpoint.requests.load(Ordering::Relaxed);
        self.push(
            Figure::new(
                "notify.throughput",
                &format!(
                    "throughput, {n} jobs notifying a {}-s endpoint",
                    SLOW_ENDPOINT_DELAY.as_secs()
                ),
                "jobs/s",
                with.jobs_per_s(),
            )
            .floor(without.jobs_per_s(), "same, no notify")
            .target(Target::MinRatio(0.9))
            .note(with.note()),
        );
        self.detail(
            "notify",
            json!({"without": without.to_json(n), "with": with.to_json(n), "endpoint_requests_by_then": requests}),
        );
    }

    // -----------------------------------------------------------------
    // The history daemon: cost growth, the CLI, the idle footprint.

    fn history_daemon(&mut self) {
        // Ended units are released at once here ([jobs] keep_ended_units
        // = "0s"), as before they were kept: each job's release then falls
        // in its own probe's window, not 5 minutes later into another
        // mark's CPU figure or the idle window.
        let opts = || Opts {
            // The archives' floor is low, as in the throughput daemon.
            extra_config: "max_queued_per_user = 1000000\n[jobs]\nkeep_ended_units = \"0s\"\n\
                           [logs]\nmin_free = \"1%\"\n"
                .into(),
            ..Opts::default()
        };
        say("booting a second harness for the history figures, and a third for their control");
        let d = TestDaemon::start_with("bench-hist", opts());
        let dropper = Dropper::new(&d);
        let tracker = self.rt.block_on(Tracker::connect(&d.harness.bus_address()));
        let mut quiet = self.rt.block_on(Quiescence::connect(&d));
        // The control: the same ptraind with (almost) no history, probed in
        // turn with the history daemon, job for job, so that both see the
        // machine in the same state. CPU time per job drifts with other
        // work on a shared machine by more than the target's margin; the
        // ratio of two daemons measured together does not.
        let control = TestDaemon::start_with("bench-ctrl", opts());
        let control_dropper = Dropper::new(&control);
        let control_tracker = self
            .rt
            .block_on(Tracker::connect(&control.harness.bus_address()));
        let mut control_quiet = self.rt.block_on(Quiescence::connect(&control));
        let owner = ptrain::users::owner_of_uid(dropper.uid).expect("the bench user exists");
        // Finished jobs on record (written here or run by the probes).
        let mut history = 0usize;
        let mut first: Option<Growth> = None;
        let mut last: Option<(usize, Growth)> = None;
        let mut growth_detail = serde_json::Map::new();
        for &mark in &self.scale.history_marks.clone() {
            let want = mark.saturating_sub(1);
            let (ok, out) = d.harness.systemctl(&["stop", "ptraind.service"]);
            assert!(ok, "cannot stop ptraind: {out}");
            if want > history {
                say(&format!("writing {} finished-job records", want - history));
                populate_history(&d.state, &owner, history..want);
                history = want;
            }
            say(&format!("ptraind: starting with {history} jobs in history"));
            let t0 = Instant::now();
            d.start_service();
            let start_secs = t0.elapsed().as_secs_f64();
            let pid = ptraind_pid(&d);
            let control_pid = ptraind_pid(&control);
            let k = self.scale.probe_jobs;
            say(&format!(
                "ptraind: job #{mark}: {k} jobs one at a time, in turn with the control"
            ));
            let before = ProcSample::read(pid);
            let control_before = ProcSample::read(control_pid);
            let mut probes = Vec::with_capacity(k);
            let mut control_probes = Vec::with_capacity(k);
            for i in 0..k {
                // Each goes first every other time: neither always runs
                // right after the other's job.
                for history_side in [i % 2 == 1, i % 2 == 0] {
                    if history_side {
                        let id = format!("m{mark}-{i}");
                        probes.push(self.probe(&tracker, &mut quiet, Some(pid), &dropper, &id, ""));
                    } else {
                        let id = format!("c{mark}-{i}");
                        control_probes.push(self.probe(
                            &control_tracker,
                            &mut control_quiet,
                            Some(control_pid),
                            &control_dropper,
                            &id,
                            "",
                        ));
                    }
                }
            }
            let after = ProcSample::read(pid);
            history += k;
            let active: Vec<f64> = probes.iter().filter_map(|p| p.to_active_ms()).collect();
            let control_active: Vec<f64> = control_probes
                .iter()
                .filter_map(|p| p.to_active_ms())
                .collect();
            let job_cpu_ms = cpu_per_job(before, &probes);
            let control_job_cpu_ms = cpu_per_job(control_before, &control_probes);
            // The median job: a burst of other work on the machine (which
            // inflates CPU time too) moves only a few jobs.
            let cpu = (job_cpu_ms.len() == k)
                .then(|| percentile(&job_cpu_ms, 0.5))
                .flatten();
            let control_cpu = (control_job_cpu_ms.len() == k)
                .then(|| percentile(&control_job_cpu_ms, 0.5))
                .flatten();
            let cpu_mean = match (before, after) {
                (Some(b), Some(a)) => {
                    Some(a.cpu_ns.saturating_sub(b.cpu_ns) as f64 / 1e6 / k as f64)
                }
                _ => None,
            };
            if mark == self.scale.idle_mark {
                self.idle_footprint(&d, history);
            }
            let (id, control_id) = (format!("m{mark}-0"), format!("c{mark}-0"));
            let mut clis = self.cli(&[
                (&d, &tracker, &id),
                (&control, &control_tracker, &control_id),
            ]);
            let control_cli = clis.pop().unwrap_or_default();
            let cli = clis.pop().unwrap_or_default();
            if mark == self.scale.idle_mark {
                // What one look at the whole history leaves behind.
                settle();
                self.push(
                    Figure::new(
                        "idle.rss_after_list_all",
                        "  ptraind RSS after `ptrain list --all`",
                        "MiB",
                        ProcSample::read(pid).map(|s| s.rss_kib as f64 / 1024.0),
                    )
                    .target(Target::MaxValue(20.0))
                    .enforce(
                        Target::MaxValue(20.0),
                        "the issue's idle target: an idle ptraind keeps nothing of a long listing",
                    ),
                );
            }
            let growth = Growth {
                latency: percentile(&active, 0.5),
                cpu,
                rss_kib: after.map(|a| a.rss_kib),
                history,
                cli,
                control_cli,
            };
            growth_detail.insert(
                mark.to_string(),
                json!({"history_at_start": history - k, "probe_jobs": k, "start_s": start_secs,
                       "cpu_ms_per_job": summary(&job_cpu_ms), "cpu_ms_per_job_mean": cpu_mean,
                       "drop_to_active_ms": summary(&active),
                       "control": {"cpu_ms_per_job": summary(&control_job_cpu_ms),
                                   "drop_to_active_ms": summary(&control_active)},
                       "rss_kib_after": growth.rss_kib}),
            );
            let is_first = first.is_none();
            let floor_label = "control";
            let lat = Figure::new(
                &format!("growth.latency.{mark}"),
                &format!("drop-to-active p50, job #{mark}"),
                "ms",
                growth.latency,
            )
            .floor(percentile(&control_active, 0.5), floor_label);
            let cpu_fig = Figure::new(
                &format!("growth.cpu.{mark}"),
                &format!("  ptraind CPU per job (median of {k}), job #{mark}"),
                "ms",
                growth.cpu,
            )
            .floor(control_cpu, floor_label);
            if is_first {
                // Both daemons without history: how far apart two equal
                // daemons measure.
                self.push(lat);
                self.push(cpu_fig);
            } else {
                self.push(lat.target(Target::MaxRatio(1.25)));
                // CPU time, not wall time, and against the control measured
                // alongside: other work on the machine moves both alike, so
                // CI enforces it.
                self.push(
                    cpu_fig
                        .target(Target::MaxRatio(1.25))
                        .enforce(Target::MaxRatio(CPU_GROWTH_LIMIT), CPU_GROWTH_WHY),
                );
            }
            self.push(Figure::new(
                &format!("growth.start.{mark}"),
                &format!(
                    "  ptraind start with {history} jobs in history",
                    history = history - k
                ),
                "s",
                Some(start_secs),
            ));
            if is_first {
                first = Some(growth);
            } else {
                last = Some((history, growth));
            }
        }
        self.detail("growth", serde_json::Value::Object(growth_detail));
        if let (Some(first), Some((history, last))) = (first, last) {
            let per_job = match (first.rss_kib, last.rss_kib) {
                (Some(a), Some(b)) if last.history > first.history => {
                    Some((b as f64 - a as f64) / (last.history - first.history) as f64)
                }
                _ => None,
            };
            self.push(Figure::new(
                "history.rss_per_job",
                "ptraind RSS per finished job in history",
                "KiB",
                per_job,
            ));
            // The API calls carry the targets: the CLI's wall time adds a
            // constant (a process, nsenter, a bus connection) and its noise.
            // Each against the control, measured run for run in turn.
            // Status, one job's lookup, must not depend on the history at
            // all: CI enforces a wide guard on it (wall time, so wide), which
            // a lookup that scans the history misses many times over.
            let status_guard = (
                Target::MaxRatio(STATUS_GUARD),
                "a guard against lookups that grow with the history (wider than the 1.5x target: even the fastest run's wall time moves on a shared machine)",
            );
            let cmds = [
                ("list", "ptrain list", None, None),
                (
                    "api.list",
                    "  ListRecent(50) over D-Bus",
                    Some(Target::MaxRatio(1.5)),
                    None,
                ),
                ("status", "ptrain status ID", None, Some(status_guard)),
                (
                    "api.status",
                    "  Status(ID) over D-Bus",
                    Some(Target::MaxRatio(1.5)),
                    Some(status_guard),
                ),
                ("list_all", "ptrain list --all", None, None),
            ];
            let cli_runs = self.scale.cli_runs.max(1);
            let api_runs = API_RUNS_PER_CLI_RUN * cli_runs;
            let mut cli_detail = serde_json::Map::new();
            for (key, label, target, enforced) in cmds {
                let now = last.cli.get(key).cloned().unwrap_or_default();
                let control = last.control_cli.get(key).cloned().unwrap_or_default();
                let early = first.cli.get(key).cloned().unwrap_or_default();
                cli_detail.insert(
                    key.to_string(),
                    json!({"late": now.to_json(), "control": control.to_json(),
                           "early": early.to_json()}),
                );
                let label = if key.starts_with("api.") {
                    format!("{label}, fastest of {api_runs}")
                } else {
                    format!("{label}, {history} jobs in history, fastest of {cli_runs}")
                };
                let key = match key.strip_prefix("api.") {
                    Some(k) => format!("api.{k}"),
                    None => format!("cli.{key}"),
                };
                let note = match (now.error.is_empty(), control.error.is_empty()) {
                    (_, true) => now.error,
                    (true, false) => format!("on the control: {}", control.error),
                    (false, false) => format!("{}; on the control: {}", now.error, control.error),
                };
                let mut f = Figure::new(&key, &label, "ms", now.ms)
                    .floor(control.ms, "control")
                    .note(note);
                if let Some(t) = target {
                    f = f.target(t);
                }
                if let Some((limit, why)) = enforced {
                    f = f.enforce(limit, why);
                }
                self.push(f);
            }
            self.detail("cli", serde_json::Value::Object(cli_detail));
        }
        self.accounting_queries(&d, &control);
        drop((control_quiet, control_tracker));
        let control_root = control.root.clone();
        drop(control);
        let _ = std::fs::remove_dir_all(control_root);
        drop(quiet);
        drop(tracker);
        let root = d.root.clone();
        drop(d);
        say("removing the history");
        let _ = std::fs::remove_dir_all(root);
    }

    /// `ptrain report` for the last 30 days and `ptrain history` of one
    /// user's last 100 runs, as root, with a million rows in the history
    /// daemon's accounting database (written here straight into it, runs
    /// of 200 users over a year: issue 23's proof; the month also holds
    /// the history's own 100,000 runs), against the same
    /// commands on the control (a few hundred rows): the control's time is
    /// the CLI's and the bus's, the difference SQLite's.
    fn accounting_queries(&mut self, d: &TestDaemon, control: &TestDaemon) {
        let rows = ACCOUNTING_ROWS;
        let (ok, out) = d.harness.systemctl(&["stop", "ptraind.service"]);
        assert!(ok, "cannot stop ptraind: {out}");
        say(&format!("writing {rows} accounting rows"));
        let t0 = Instant::now();
        let path = ptrain::accounting::db::db_path(&d.state);
        let written = write_accounting_rows(&path, rows);
        let write_secs = t0.elapsed().as_secs_f64();
        let since = format!("@{}", ptrain::now_micros() / 1_000_000);
        d.start_service();
        // Each start back-fills the database from the job records (the
        // history's 100,000 here, each read from disk) before the writer
        // answers queries: the figures are those of a settled daemon.
        wait_for(
            "ptraind's back-fill of the accounting database",
            Duration::from_secs(300),
            || {
                d.harness
                    .journal(&["-u", "ptraind.service", "--since", &since])
                    .contains("accounting database back-filled")
                    .then_some(())
            },
        );
        let commands: [(&str, &str, &[&str], f64); 2] = [
            (
                "accounting.report_month",
                "ptrain report --since 30d",
                &["report", "--since", "30d"],
                200.0,
            ),
            (
                "accounting.history_user",
                "ptrain history --user U -n 100",
                &["history", "--user", "acct-user-42", "-n", "100"],
                50.0,
            ),
        ];
        let mut detail = serde_json::Map::new();
        for (key, label, args, target_ms) in commands {
            let mut times = [Vec::new(), Vec::new()];
            let mut errors = [String::new(), String::new()];
            let mut bytes = [0; 2];
            // The first run of each warms SQLite's pages and the page cache.
            for run in 0..=self.scale.cli_runs.max(1) {
                for (side, daemon) in [d, control].into_iter().enumerate() {
                    let t0 = Instant::now();
                    let o = daemon.ptrain("root", args);
                    let ms = t0.elapsed().as_secs_f64() * 1e3;
                    if !o.status.success() {
                        errors[side] = first_line(&crate::daemon::text(&o));
                    } else if run > 0 {
                        times[side].push(ms);
                        bytes[side] = o.stdout.len();
                    }
                }
            }
            let [mut now, control] =
                [0, 1].map(|side| CliTime::of(&times[side], bytes[side], errors[side].clone()));
            if let Err(e) = &written {
                now.ms = None;
                now.error = format!("cannot write the rows: {e}");
            }
            detail.insert(
                key.into(),
                json!({"late": now.to_json(), "control": control.to_json()}),
            );
            let note = match control.error.is_empty() {
                true => now.error,
                false => format!("{}; on the control: {}", now.error, control.error),
            };
            self.push(
                Figure::new(
                    key,
                    &format!("{label}, {rows} accounting rows, fastest of {}", now.runs),
                    "ms",
                    now.ms,
                )
                .floor(control.ms, "control")
                .target(Target::MaxValue(target_ms))
                .note(note),
            );
        }
        detail.insert("write_s".into(), json!(write_secs));
        self.detail("accounting", serde_json::Value::Object(detail));
        self.idle_against_none(d, control, rows);
    }

    /// The issue's memory target: an idle ptraind with the history's
    /// records (the retention's 100,000 at the ci scale) and a million
    /// runs on record, against the control with (almost) none, both
    /// started afresh and settled.
    fn idle_against_none(&mut self, d: &TestDaemon, control: &TestDaemon, rows: u64) {
        let since = format!("@{}", ptrain::now_micros() / 1_000_000);
        for daemon in [d, control] {
            let (ok, out) = daemon.harness.systemctl(&["restart", "ptraind.service"]);
            assert!(ok, "cannot restart ptraind: {out}");
        }
        for daemon in [d, control] {
            wait_for(
                "ptraind's back-fill of the accounting database",
                Duration::from_secs(300),
                || {
                    daemon
                        .harness
                        .journal(&["-u", "ptraind.service", "--since", &since])
                        .contains("accounting database back-filled")
                        .then_some(())
                },
            );
        }
        settle();
        let [history, none] = [d, control].map(|daemon| ProcSample::read(ptraind_pid(daemon)));
        let mib = |s: &Option<ProcSample>| s.as_ref().map(|s| s.rss_kib as f64 / 1024.0);
        say(&format!(
            "ptraind: idle RSS {:?} MiB with the history and {rows} runs on record, {:?} MiB without",
            mib(&history),
            mib(&none)
        ));
        for (side, daemon) in [("history", d), ("none", control)] {
            let pid = ptraind_pid(daemon);
            say(&format!(
                "ptraind ({side}): largest mappings: {}",
                largest_mappings(pid, 8)
            ));
        }
        self.push(
            Figure::new(
                "idle.rss_vs_none",
                &format!("ptraind RSS, idle, restarted with the history's records and {rows} runs on record"),
                "MiB",
                mib(&history),
            )
            .floor(mib(&none), "none")
            .target(Target::MaxRatio(1.10))
            .enforce(Target::MaxRatio(1.10), IDLE_VS_NONE_WHY),
        );
    }

    // -----------------------------------------------------------------
    // Accounting on against off (issue 23).

    /// What accounting costs per job: ptraind.service's CPU time (by its
    /// cgroup: ptraind, its helpers, threads that exited), the whole
    /// harness's, and drop-to-active with
    /// `[accounting] enabled = true`, against the same daemon restarted
    /// with it false. The two alternate in blocks of jobs on one harness,
    /// each block first every other round, so that both see the machine
    /// alike.
    fn accounting_on_vs_off(&mut self) {
        let config = |enabled: bool| {
            format!(
                "max_queued_per_user = 1000000\n[jobs]\nkeep_ended_units = \"0s\"\n\
                 [logs]\nmin_free = \"1%\"\n[accounting]\nenabled = {enabled}\n"
            )
        };
        say("booting a harness for accounting on against off");
        let d = TestDaemon::start_with(
            "bench-acct",
            Opts {
                extra_config: config(true),
                ..Opts::default()
            },
        );
        let dropper = Dropper::new(&d);
        let tracker = self.rt.block_on(Tracker::connect(&d.harness.bus_address()));
        let mut quiet = self.rt.block_on(Quiescence::connect(&d));
        let written =
            std::fs::read_to_string(d.root.join("ptrain.toml")).expect("the harness's config");
        let (rounds, k) = (self.scale.accounting_rounds, self.scale.accounting_jobs);
        // [on, off]: ptraind's CPU per job of each block, and each job's
        // drop-to-active.
        let mut cpu: [Vec<f64>; 2] = Default::default();
        // The whole harness's (systemd and the job units it runs, the bus,
        // journald, ptraind): what a job costs the host.
        let mut host_cpu: [Vec<f64>; 2] = Default::default();
        let mut active: [Vec<f64>; 2] = Default::default();
        for round in 0..rounds {
            for on in on_off_order(round) {
                let side = usize::from(!on);
                let since = format!("@{}", ptrain::now_micros() / 1_000_000);
                restart_with_config(&d, &written.replace(&config(true), &config(on)));
                let settled = if on {
                    "accounting database back-filled"
                } else {
                    "accounting is off"
                };
                wait_for("ptraind's start", Duration::from_secs(120), || {
                    d.harness
                        .journal(&["-u", "ptraind.service", "--since", &since])
                        .contains(settled)
                        .then_some(())
                });
                let pid = ptraind_pid(&d);
                let before = BlockCpu::read(pid, d.harness.systemd_pid());
                let probes: Vec<Probe> = (0..k)
                    .map(|i| {
                        let id = format!("a{round}-{}-{i}", ["on", "off"][side]);
                        self.probe(&tracker, &mut quiet, Some(pid), &dropper, &id, "")
                    })
                    .collect();
                // The block's rows are written by a child after their
                // ends, in groups (counted whether it has exited or not):
                // the block ends once all of them are in the database.
                if on {
                    let prefix = format!("a{round}-on-");
                    wait_for(
                        "the block's rows in the accounting database",
                        Duration::from_secs(60),
                        || (accounting_rows(&d.state, &prefix) >= k).then_some(()),
                    );
                }
                settle();
                let after = BlockCpu::read(pid, d.harness.systemd_pid());
                if let (Some(b), Some(a)) = (before, after) {
                    let per_job = |ns: u64| ns as f64 / 1e6 / k as f64;
                    cpu[side].push(per_job(a.service_ns.saturating_sub(b.service_ns)));
                    host_cpu[side].push(per_job(a.harness_ns.saturating_sub(b.harness_ns)));
                }
                let failed = probes.iter().filter(|p| p.status != "succeeded").count();
                assert!(
                    failed == 0,
                    "accounting on={on}: {failed} of {k} jobs did not succeed"
                );
                active[side].extend(probes.iter().filter_map(|p| p.to_active_ms()));
            }
        }
        say(&format!(
            "accounting: ptraind's CPU per job by block on {:?} ms, off {:?} ms; the host's on {:?} ms, off {:?} ms",
            cpu[0], cpu[1], host_cpu[0], host_cpu[1]
        ));
        self.detail(
            "accounting",
            json!({"on": {"cpu_ms_per_job": cpu[0], "host_cpu_ms_per_job": host_cpu[0],
                          "drop_to_active_ms": summary(&active[0])},
                   "off": {"cpu_ms_per_job": cpu[1], "host_cpu_ms_per_job": host_cpu[1],
                           "drop_to_active_ms": summary(&active[1])}}),
        );
        let blocks = cpu[0].len();
        self.push(
            Figure::new(
                "accounting.cpu_vs_off",
                &format!("ptraind CPU per job, accounting on (median of {blocks} blocks of {k})"),
                "ms",
                median(&cpu[0]),
            )
            .floor(median(&cpu[1]), "off")
            // ptraind.service's cgroup: ptraind, its threads that exited
            // within the block and its helpers (the accounting stream).
            // Summing the live threads' schedstat, as before, lost the
            // CPU of blocking-pool threads that exited idle within the
            // block, more of them with accounting off: 1.07-1.15x then,
            // where perf saw ptraind's threads spend the same on and off.
            .target(Target::MaxRatio(1.10)),
        );
        self.push(
            Figure::new(
                "accounting.host_cpu_vs_off",
                &format!(
                    "  the host's CPU per job, accounting on (systemd, its units, the bus, journald, ptraind; median of {blocks})"
                ),
                "ms",
                median(&host_cpu[0]),
            )
            .floor(median(&host_cpu[1]), "off")
            // Reported (wall-clock CPU of the whole harness moves with the
            // machine). With the unit's `ExecStopPost=` (`ptraind
            // job-usage`) reading the cgroup it was 1.48x: systemd set the
            // job's sandbox up a second time for it. The usage watcher
            // that exec-job forks measured 0.99x.
            .target(Target::MaxRatio(1.10)),
        );
        self.push(
            Figure::new(
                "accounting.latency_vs_off",
                &format!(
                    "  drop-to-active p50, accounting on ({} jobs)",
                    active[0].len()
                ),
                "ms",
                percentile(&active[0], 0.5),
            )
            .floor(percentile(&active[1], 0.5), "off")
            .target(Target::MaxRatio(1.10)),
        );
        drop((quiet, tracker));
        let root = d.root.clone();
        drop(d);
        let _ = std::fs::remove_dir_all(root);
    }

    /// `ptrain list`, `ptrain list --all`, `ptrain status ID` as root,
    /// inside the harness, and the D-Bus calls behind the first two: the
    /// fastest and the median wall time of each, for each of `sides`
    /// (daemon, its tracker, a job id of it), run for run in turn, so that
    /// all sides see the machine in the same state.
    fn cli(
        &mut self,
        sides: &[(&TestDaemon, &Tracker, &str)],
    ) -> Vec<HashMap<&'static str, CliTime>> {
        let mut out: Vec<HashMap<&'static str, CliTime>> = vec![HashMap::new(); sides.len()];
        // Sub-millisecond calls: many runs, cheap.
        let runs = API_RUNS_PER_CLI_RUN * self.scale.cli_runs.max(1);
        for key in ["api.list", "api.status"] {
            let mut times = vec![Vec::new(); sides.len()];
            let mut errors = vec![String::new(); sides.len()];
            for _ in 0..runs {
                for (s, (_, tracker, id)) in sides.iter().enumerate() {
                    let t0 = Instant::now();
                    let reply = match key {
                        "api.list" => self.rt.block_on(tracker.proxy.list_recent(50)),
                        _ => self.rt.block_on(tracker.proxy.status(id)),
                    };
                    match reply {
                        Ok(_) => times[s].push(t0.elapsed().as_secs_f64() * 1e3),
                        Err(e) => errors[s] = e.to_string(),
                    }
                }
            }
            for (s, error) in errors.into_iter().enumerate() {
                out[s].insert(key, CliTime::of(&times[s], 0, error));
            }
        }
        // `list --all` last: a reply too big for the bus may cut ptraind
        // off it (checked below).
        for key in ["list", "status", "list_all"] {
            let mut times = vec![Vec::new(); sides.len()];
            let mut errors = vec![String::new(); sides.len()];
            let mut bytes = vec![0; sides.len()];
            for _ in 0..self.scale.cli_runs.max(1) {
                for (s, (d, _, id)) in sides.iter().enumerate() {
                    let args: &[&str] = match key {
                        "list" => &["list"],
                        "status" => &["status", id],
                        _ => &["list", "--all"],
                    };
                    let t0 = Instant::now();
                    let o = d.ptrain("root", args);
                    let ms = t0.elapsed().as_secs_f64() * 1e3;
                    if o.status.success() {
                        times[s].push(ms);
                        bytes[s] = o.stdout.len();
                    } else {
                        errors[s] = first_line(&crate::daemon::text(&o));
                    }
                }
            }
            for (s, error) in errors.into_iter().enumerate() {
                out[s].insert(key, CliTime::of(&times[s], bytes[s], error));
            }
        }
        for (s, (d, _, _)) in sides.iter().enumerate() {
            let alive = d.ptrain("root", &["list"]);
            if !alive.status.success() {
                if let Some(t) = out[s].get_mut("list_all") {
                    t.error = format!(
                        "{}; afterwards ptraind no longer answers: {}",
                        t.error,
                        first_line(&crate::daemon::text(&alive))
                    );
                }
            }
        }
        out
    }

    fn idle_footprint(&mut self, d: &TestDaemon, history: usize) {
        let window = self.scale.idle_window;
        say(&format!(
            "ptraind: idle footprint over {:.0} s with {history} jobs in history",
            window.as_secs_f64()
        ));
        let pid = ptraind_pid(d);
        // Past the accounting writer's last group and its stream's pause,
        // which end the last burst's work: idle begins after them.
        std::thread::sleep(
            ptrain::accounting::db::GROUP_COMMIT + ptrain::accounting::helper::STREAM_IDLE,
        );
        settle();
        let a = ProcSample::read(pid);
        std::thread::sleep(window);
        let b = ProcSample::read(pid);
        let (Some(a), Some(b)) = (a, b) else {
            self.push(
                Figure::new("idle.rss", "ptraind RSS, idle", "MiB", None)
                    .note(format!("cannot read /proc/{pid}")),
            );
            return;
        };
        let secs = window.as_secs_f64();
        say(&format!(
            "ptraind: idle RSS {} KiB: {} KiB anonymous, {} KiB file-backed, {} threads",
            b.rss_kib, b.rss_anon_kib, b.rss_file_kib, b.threads
        ));
        self.push(
            Figure::new(
                "idle.rss",
                &format!("ptraind RSS, idle, {history} jobs in history"),
                "MiB",
                Some(b.rss_kib as f64 / 1024.0),
            )
            .target(Target::MaxValue(20.0))
            // Memory, unlike time, holds still on a busy machine.
            .enforce(Target::MaxValue(20.0), "the issue's target"),
        );
        // WatchdogSec=30s: one ping every 15 s, a couple of switches each.
        self.push(
            Figure::new(
                "idle.wakeups",
                &format!("  ptraind context switches in {secs:.0} s idle"),
                "",
                Some((b.switches() - a.switches()) as f64),
            )
            .target(Target::MaxValue(IDLE_WAKEUPS_LIMIT))
            .enforce(Target::MaxValue(IDLE_WAKEUPS_LIMIT), "")
            .note("one or two watchdog pings (every 15 s) fall in the window, a few switches each"),
        );
        self.push(Figure::new(
            "idle.cpu",
            &format!("  ptraind CPU in {secs:.0} s idle"),
            "ms",
            Some(b.cpu_ns.saturating_sub(a.cpu_ns) as f64 / 1e6),
        ));
        self.detail(
            "idle",
            json!({"history": history, "rss_kib": b.rss_kib, "rss_anon_kib": b.rss_anon_kib,
                   "rss_file_kib": b.rss_file_kib, "threads": b.threads,
                   "voluntary": b.voluntary - a.voluntary, "involuntary": b.involuntary - a.involuntary,
                   "cpu_ns": b.cpu_ns - a.cpu_ns, "window_s": secs}),
        );
    }
}

/// The `n` mappings of `pid` with the most resident KiB, "KiB path" each.
fn largest_mappings(pid: u32, n: usize) -> String {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut maps: Vec<(u64, String)> = Vec::new();
    let mut name = String::new();
    for line in smaps.lines() {
        if let Some(kib) = line.strip_prefix("Rss:") {
            let kib: u64 = kib
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .unwrap_or(0);
            maps.push((kib, name.clone()));
        } else if line
            .split_whitespace()
            .next()
            .is_some_and(|f| f.contains('-') && !f.ends_with(':'))
        {
            name = line
                .split_whitespace()
                .nth(5)
                .unwrap_or("[anon]")
                .to_owned();
        }
    }
    let mut by_name: HashMap<String, u64> = HashMap::new();
    for (kib, name) in maps {
        *by_name.entry(name).or_default() += kib;
    }
    let mut sorted: Vec<_> = by_name.into_iter().collect();
    sorted.sort_by_key(|m| std::cmp::Reverse(m.1));
    sorted.truncate(n);
    sorted
        .iter()
        .map(|(name, kib)| format!("{kib} {name}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// ptraind's CPU time (ms) for each of `probes`, run one at a time since
/// `before`: the difference between one probe's reading and the last.
fn cpu_per_job(before: Option<ProcSample>, probes: &[Probe]) -> Vec<f64> {
    let mut out = Vec::with_capacity(probes.len());
    let mut prev = before.map(|b| b.cpu_ns);
    for p in probes {
        if let (Some(a), Some(b)) = (prev, p.cpu_ns) {
            out.push(b.saturating_sub(a) as f64 / 1e6);
        }
        prev = p.cpu_ns;
    }
    out
}

fn first_line(s: &str) -> String {
    s.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .to_string()
}

/// When ptraind logged `message` for each job: the journal's realtime µs,
/// by the entry's PTRAIN_JOB field.
fn logged_at(d: &TestDaemon, message: &str) -> HashMap<String, u64> {
    let out = d
        .harness
        .command("journalctl")
        .args([
            "--no-pager",
            "-u",
            "ptraind.service",
            "-o",
            "json",
            "--output-fields=MESSAGE,PTRAIN_JOB",
        ])
        .stdin(std::process::Stdio::null())
        .output();
    let mut at = HashMap::new();
    let Ok(out) = out else { return at };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if entry["MESSAGE"] != message {
            continue;
        }
        let (Some(job), Some(t)) = (
            entry["PTRAIN_JOB"].as_str(),
            entry["__REALTIME_TIMESTAMP"]
                .as_str()
                .and_then(|t| t.parse::<u64>().ok()),
        ) else {
            continue;
        };
        at.insert(job.to_string(), t);
    }
    at
}

/// Lets ptraind finish what an event started (GC, releases, signals)
/// before a footprint reading.
/// Writes back what earlier steps left dirty (in CI: the release build,
/// the tests) before a latency loop. ptraind fsyncs its claims and launch
/// records and the floor loop writes nothing to disk, so a disk still busy
/// with writeback would stall only ptraind's side (two CI runs had its
/// drop-to-active p99 at 58 and 86 ms against a floor of 30; a run on a
/// quiet machine had 36 against 32).
fn flush_disk() {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
}

fn settle() {
    std::thread::sleep(Duration::from_secs(1));
}

/// How long a run of `n` jobs may take before it counts as stuck.
fn deadline(n: usize) -> Duration {
    Duration::from_secs(120) + Duration::from_millis(100) * n as u32
}

fn is_final(status: &str) -> bool {
    !ptrain::job::Outcome::is_active(status)
}

fn job_json(extra: &str) -> String {
    format!("{{\"version\":1,\"command\":[\"{TRUE}\"]{extra}}}")
}

/// The middle value (the upper of the two middle ones); None when empty.
fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

fn summary(ms: &[f64]) -> serde_json::Value {
    json!({
        "n": ms.len(),
        "p50": percentile(ms, 0.5),
        "p90": percentile(ms, 0.9),
        "p99": percentile(ms, 0.99),
        "max": percentile(ms, 1.0),
    })
}

impl Floors {
    /// The bare loop given ptraind's own unit properties, `n` at once.
    fn props_throughput(&self, n: usize) -> Option<f64> {
        let key = format!("floor.props.throughput.{n}");
        self.variants.iter().find(|v| v.0 == key).map(|v| v.2)
    }
}

struct Floors {
    latency: Vec<f64>,
    /// The bare loop without the idle gap (see [`IDLE_GAP`]).
    latency_warm: Vec<f64>,
    latency_props: Vec<f64>,
    throughput: HashMap<usize, f64>,
    /// (key, label, jobs/s) of the diagnostic variants of the bare loop.
    variants: Vec<(String, &'static str, f64)>,
}

/// One job dropped and followed to its end.
struct Probe {
    id: String,
    /// Realtime µs just before the rename into the spool.
    dropped_at: u64,
    submitted_at: Option<u64>,
    started_at: Option<u64>,
    status: String,
    /// From the final status until the job was quiet ([`Quiescence`]).
    quiet_ms: f64,
    /// ptraind's CPU time (ns) once the job was quiet, when asked for.
    cpu_ns: Option<u64>,
}

impl Probe {
    fn to_active_ms(&self) -> Option<f64> {
        let started = self.started_at?;
        Some(started as f64 / 1e3 - self.dropped_at as f64 / 1e3)
    }

    fn to_claim_ms(&self) -> Option<f64> {
        let claimed = self.submitted_at?;
        Some(claimed as f64 / 1e3 - self.dropped_at as f64 / 1e3)
    }
}

struct Burst {
    jobs: usize,
    secs: Option<f64>,
    error: Option<String>,
    failed: usize,
    /// Times systemd restarted ptraind during the run (its CPU is then
    /// counted only since the last start).
    restarts: u32,
    /// Times systemd lost its connection to the bus during the run.
    systemd_cut_off: u32,
    cpu: CpuDelta,
}

impl Burst {
    fn jobs_per_s(&self) -> Option<f64> {
        let secs = self.secs?;
        (secs > 0.0).then(|| self.jobs as f64 / secs)
    }

    fn note(&self) -> String {
        let mut notes = Vec::new();
        if let Some(e) = &self.error {
            notes.push(e.clone());
        }
        if self.failed > 0 {
            notes.push(format!("{} jobs did not succeed", self.failed));
        }
        if self.systemd_cut_off > 0 {
            notes.push(format!(
                "systemd was cut off the bus {} times",
                self.systemd_cut_off
            ));
        }
        if self.restarts > 0 {
            notes.push(format!("ptraind was restarted {} times", self.restarts));
        }
        notes.join("; ")
    }

    fn to_json(&self, n: usize) -> serde_json::Value {
        json!({
            "jobs": n,
            "secs": self.secs,
            "error": self.error,
            "failed": self.failed,
            "restarts": self.restarts,
            "systemd_cut_off": self.systemd_cut_off,
            "cpu_ms_per_job": self.cpu.per_job_all(n),
        })
    }
}

#[derive(Clone, Debug, Default)]
struct Growth {
    latency: Option<f64>,
    cpu: Option<f64>,
    /// ptraind's RSS after the probes, and the finished jobs it held.
    rss_kib: Option<u64>,
    history: usize,
    cli: HashMap<&'static str, CliTime>,
    /// The same commands on the control, run for run in turn.
    control_cli: HashMap<&'static str, CliTime>,
}

/// Wall times of one command's runs.
#[derive(Clone, Debug, Default)]
struct CliTime {
    /// The fastest run: the command's own cost, which a burst of other work
    /// on the machine cannot raise (a lookup that scans the history does).
    ms: Option<f64>,
    median_ms: Option<f64>,
    runs: usize,
    bytes: usize,
    error: String,
}

impl CliTime {
    fn of(times: &[f64], bytes: usize, error: String) -> CliTime {
        CliTime {
            ms: percentile(times, 0.0),
            median_ms: percentile(times, 0.5),
            runs: times.len(),
            bytes,
            error,
        }
    }

    fn to_json(&self) -> serde_json::Value {
        json!({"fastest_ms": self.ms, "median_ms": self.median_ms, "runs": self.runs,
               "bytes": self.bytes, "error": self.error})
    }
}

// ---------------------------------------------------------------------
// Dropping files into the spool as a user would: written elsewhere on the
// same file system, owned by the user, renamed in.

/// Another user beside a burst: a `Status` call every [`BYSTANDER_GAP`]
/// and one job file of his every fifth, each timed.
struct Bystander {
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// Status latencies (ms), and each file dropped with when.
    task: tokio::task::JoinHandle<BystanderSeen>,
}

/// Status latencies, Peer.Ping latencies (ms), and each file dropped with when.
type BystanderSeen = (Vec<f64>, Vec<f64>, Vec<(String, u64)>);

const BYSTANDER_GAP: Duration = Duration::from_millis(25);
const BYSTANDER_FILES: usize = 200;

impl Bystander {
    fn start(bench: &Bench<'_>, d: &TestDaemon, tracker: &Tracker, tag: &str) -> Bystander {
        let dropper = Dropper::for_user(d, BOB);
        let ids: Vec<String> = (0..BYSTANDER_FILES)
            .map(|i| format!("{tag}-bob-{i}"))
            .collect();
        for id in &ids {
            dropper.stage(id, &job_json(""));
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let proxy = tracker.proxy.clone();
        let peer = tracker.peer.clone();
        let task = bench.rt.spawn(async move {
            let (mut status_ms, mut ping_ms, mut dropped) = (Vec::new(), Vec::new(), Vec::new());
            let mut files = ids.into_iter();
            let mut round = 0usize;
            while !stopped.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                // A job nobody has: the answer comes from the state task and the
                // archive catalogue (a compacted job is known by its archive).
                let _ = proxy.status("bystander-none").await;
                status_ms.push(t0.elapsed().as_secs_f64() * 1e3);
                let t0 = Instant::now();
                let _ = peer.ping().await;
                ping_ms.push(t0.elapsed().as_secs_f64() * 1e3);
                if round.is_multiple_of(5) {
                    if let Some(id) = files.next() {
                        let at = dropper.publish(&id);
                        dropped.push((id, at));
                    }
                }
                round += 1;
                tokio::time::sleep(BYSTANDER_GAP).await;
            }
            (status_ms, ping_ms, dropped)
        });
        Bystander { stop, task }
    }

    /// Status, Peer.Ping and drop-to-claim latencies, in ms.
    fn finish(self, bench: &Bench<'_>, tracker: &Tracker) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        self.stop.store(true, Ordering::Relaxed);
        let (status_ms, ping_ms, dropped) = bench.rt.block_on(self.task).unwrap_or_default();
        let ids: Vec<String> = dropped.iter().map(|(id, _)| id.clone()).collect();
        let mark = 0;
        if let Err(e) =
            bench
                .rt
                .block_on(tracker.wait(mark, &ids, is_final, Duration::from_secs(120)))
        {
            say(&format!("bystander's jobs: {e}"));
        }
        let claim_ms = dropped
            .iter()
            .filter_map(|(id, at)| {
                let view = bench.rt.block_on(tracker.status(id))?;
                Some(view.submitted_at as f64 / 1e3 - *at as f64 / 1e3)
            })
            .collect();
        (status_ms, ping_ms, claim_ms)
    }
}

struct Dropper {
    stage: PathBuf,
    spool: PathBuf,
    uid: u32,
    gid: u32,
}

impl Dropper {
    fn new(d: &TestDaemon) -> Dropper {
        Dropper::for_user(d, ALICE)
    }

    fn for_user(d: &TestDaemon, user: &str) -> Dropper {
        let (uid, gid) = ensure_user(user);
        let stage = d.root.join("stage");
        std::fs::create_dir_all(&stage).expect("create the staging dir");
        std::fs::set_permissions(&stage, std::fs::Permissions::from_mode(0o755))
            .expect("chmod the staging dir");
        Dropper {
            stage,
            spool: d.spool.clone(),
            uid,
            gid,
        }
    }

    fn stage(&self, id: &str, json: &str) {
        let path = self.stage.join(format!("{id}.json"));
        std::fs::write(&path, json).expect("write a staged job file");
        std::os::unix::fs::chown(&path, Some(self.uid), Some(self.gid))
            .expect("chown a staged job file");
    }

    /// Renames the staged file into the spool; returns the realtime µs
    /// just before the rename.
    fn publish(&self, id: &str) -> u64 {
        let name = format!("{id}.json");
        let at = ptrain::now_micros();
        std::fs::rename(self.stage.join(&name), self.spool.join(&name))
            .expect("rename a job file into the spool");
        at
    }
}

// ---------------------------------------------------------------------
// Following ptraind: its JobChanged signals and its API.

#[derive(Default)]
struct Seen {
    /// Every JobChanged (id, status) in arrival order, with when.
    log: Vec<(String, String, Instant)>,
}

struct Tracker {
    seen: Arc<Mutex<Seen>>,
    changed: watch::Receiver<usize>,
    proxy: Daemon1Proxy<'static>,
    /// org.freedesktop.DBus.Peer at ptraind: answered by its bus
    /// connection without the state task, the floor of any call.
    peer: zbus::fdo::PeerProxy<'static>,
    _conn: Connection,
}

impl Tracker {
    async fn connect(bus: &str) -> Tracker {
        let conn = zbus::connection::Builder::address(bus)
            .max_queued(NonZeroUsize::new(1 << 20).unwrap())
            .build()
            .await
            .expect("connect to the harness bus");
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .interface(ptrain::DBUS_NAME)
            .member("JobChanged")
            .build()
            .expect("a JobChanged match rule");
        let mut stream =
            zbus::MessageStream::for_match_rule(rule, &conn, NonZeroUsize::new(1 << 20))
                .await
                .expect("subscribe to JobChanged");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (tx, changed) = watch::channel(0usize);
        let sink = seen.clone();
        tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                let Ok(msg) = msg else { continue };
                let Ok((id, status)) = msg.body().deserialize::<(String, String)>() else {
                    continue;
                };
                let len = {
                    let mut s = sink.lock().unwrap();
                    s.log.push((id, status, Instant::now()));
                    s.log.len()
                };
                let _ = tx.send(len);
            }
        });
        let proxy = Daemon1Proxy::new(&conn).await.expect("a ptraind proxy");
        let peer = zbus::fdo::PeerProxy::builder(&conn)
            .destination(ptrain::DBUS_NAME)
            .path(ptrain::DBUS_PATH)
            .build()
            .await
            .expect("a Peer proxy at ptraind");
        Tracker {
            seen,
            changed,
            proxy,
            peer,
            _conn: conn,
        }
    }

    /// A position in the signal log: take it before dropping files, then
    /// wait from it, so no signal is missed in between.
    fn mark(&self) -> usize {
        self.seen.lock().unwrap().log.len()
    }

    /// Waits until every id had a status `pred` accepts, after `mark`;
    /// returns when the last of them arrived.
    async fn wait(
        &self,
        mark: usize,
        ids: &[String],
        pred: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Result<Instant, String> {
        let mut pending: HashSet<&str> = ids.iter().map(String::as_str).collect();
        let mut cursor = mark;
        let mut last = Instant::now();
        let mut changed = self.changed.clone();
        let started = tokio::time::Instant::now();
        let deadline = started + timeout;
        let mut progress = started;
        loop {
            {
                let seen = self.seen.lock().unwrap();
                for (id, status, at) in &seen.log[cursor..] {
                    if pred(status) && pending.remove(id.as_str()) {
                        last = *at;
                        progress = tokio::time::Instant::now();
                    }
                }
                cursor = seen.log.len();
            }
            if pending.is_empty() {
                return Ok(last);
            }
            // Stuck jobs (a launch that never resolves) end the wait early.
            let until = deadline.min(progress + STALL);
            match tokio::time::timeout_at(until, changed.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err("the JobChanged stream ended".into()),
                Err(_) => {
                    return Err(format!(
                        "{} of {} jobs not there after {:.0} s ({:.0} s without progress)",
                        pending.len(),
                        ids.len(),
                        started.elapsed().as_secs_f64(),
                        progress.elapsed().as_secs_f64(),
                    ))
                }
            }
        }
    }

    /// How many of `ids` had a status `pred` accepts after `mark`.
    fn count_since(&self, mark: usize, ids: &[String], pred: impl Fn(&str) -> bool) -> usize {
        let wanted: HashSet<&str> = ids.iter().map(String::as_str).collect();
        let seen = self.seen.lock().unwrap();
        seen.log[mark..]
            .iter()
            .filter(|(id, status, _)| wanted.contains(id.as_str()) && pred(status))
            .map(|(id, _, _)| id.as_str())
            .collect::<HashSet<_>>()
            .len()
    }

    async fn status(&self, id: &str) -> Option<JobView> {
        let json = self.proxy.status(id).await.ok()?;
        serde_json::from_str(&json).ok()
    }

    async fn stop(&self, id: &str) -> zbus::Result<String> {
        self.proxy.stop(id).await
    }
}

// ---------------------------------------------------------------------
// The floor: a small client that starts units itself.

#[derive(Default)]
struct BareSeen {
    job_removed: HashSet<String>,
    unit_removed: HashSet<String>,
    /// Units gone per name prefix (`PREFIX-N.service`), and when the last
    /// went: what a throughput run waits on, without a scan per signal.
    gone_by_prefix: HashMap<String, (usize, Instant)>,
}

struct Bare {
    conn: Connection,
    manager: ManagerProxy<'static>,
    seen: Arc<Mutex<BareSeen>>,
    changed: watch::Receiver<usize>,
}

impl Bare {
    async fn connect(bus: &str) -> Bare {
        let conn = zbus::connection::Builder::address(bus)
            .max_queued(NonZeroUsize::new(1 << 20).unwrap())
            .build()
            .await
            .expect("connect to the harness bus");
        let manager = ManagerProxy::new(&conn).await.expect("a systemd proxy");
        manager.subscribe().await.expect("Subscribe");
        let seen = Arc::new(Mutex::new(BareSeen::default()));
        let (tx, changed) = watch::channel(0usize);
        let tx = Arc::new(tx);
        let mut removed = manager.receive_job_removed().await.expect("JobRemoved");
        let (sink, tx1) = (seen.clone(), tx.clone());
        tokio::spawn(async move {
            while let Some(signal) = removed.next().await {
                if let Ok(args) = signal.args() {
                    sink.lock().unwrap().job_removed.insert(args.unit.clone());
                    tx1.send_modify(|n| *n += 1);
                }
            }
        });
        let mut gone = manager.receive_unit_removed().await.expect("UnitRemoved");
        let sink = seen.clone();
        tokio::spawn(async move {
            while let Some(signal) = gone.next().await {
                if let Ok(args) = signal.args() {
                    let now = Instant::now();
                    let mut s = sink.lock().unwrap();
                    if let Some((prefix, _)) = args.id.rsplit_once('-') {
                        let e = s
                            .gone_by_prefix
                            .entry(prefix.to_string())
                            .or_insert((0, now));
                        *e = (e.0 + 1, now);
                    }
                    s.unit_removed.insert(args.id.clone());
                    drop(s);
                    tx.send_modify(|n| *n += 1);
                }
            }
        });
        Bare {
            conn,
            manager,
            seen,
            changed,
        }
    }

    async fn wait_until(&self, cond: impl FnMut(&BareSeen) -> bool) {
        let limit = Duration::from_secs(120);
        if !self.wait_for(cond, limit).await {
            panic!("the bare systemd client waited {limit:?} for a unit signal");
        }
    }

    /// Whether `cond` held within `timeout`.
    async fn wait_for(&self, mut cond: impl FnMut(&BareSeen) -> bool, timeout: Duration) -> bool {
        let mut changed = self.changed.clone();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if cond(&self.seen.lock().unwrap()) {
                return true;
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                _ => return cond(&self.seen.lock().unwrap()),
            }
        }
    }

    /// Starts `n` units one at a time, each after the last one is gone;
    /// returns call-to-ExecMainStartTimestamp in ms.
    async fn latency(
        &self,
        prefix: &str,
        n: usize,
        gap: Duration,
        props: impl Fn(usize) -> Vec<(String, OwnedVariant)>,
    ) -> Vec<f64> {
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            tokio::time::sleep(gap).await;
            let unit = format!("{prefix}-{i}.service");
            let called_at = ptrain::now_micros();
            self.manager
                .start_transient_unit(unit.clone(), "fail".into(), props(i), Vec::new())
                .await
                .unwrap_or_else(|e| panic!("StartTransientUnit {unit}: {e}"));
            self.wait_until(|s| s.job_removed.contains(&unit)).await;
            match self.exec_main_start(&unit).await {
                Some(started) => out.push(started as f64 / 1e3 - called_at as f64 / 1e3),
                None => say(&format!("floor unit {unit} never started")),
            }
            let _ = self.manager.unref_unit(unit.clone()).await;
            let _ = self.manager.reset_failed_unit(unit.clone()).await;
            self.wait_until(|s| s.unit_removed.contains(&unit)).await;
        }
        out
    }

    /// Starts `n` units, one call in flight, and returns the seconds until
    /// the last is gone.
    async fn throughput(
        &self,
        prefix: &str,
        n: usize,
        alive: Option<usize>,
        props: impl Fn(usize) -> Vec<(String, OwnedVariant)>,
    ) -> f64 {
        let units: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}.service")).collect();
        let t0 = Instant::now();
        for (i, unit) in units.iter().enumerate() {
            if i >= BARE_MAX_PENDING {
                let behind = &units[i - BARE_MAX_PENDING];
                self.wait_until(|s| s.job_removed.contains(behind)).await;
            }
            if let Some(alive) = alive.filter(|a| i >= *a) {
                // Only `alive` units at a time: wait until enough are gone.
                let gone_needed = i + 1 - alive;
                self.wait_until(|s| {
                    s.gone_by_prefix
                        .get(prefix)
                        .is_some_and(|(gone, _)| *gone >= gone_needed)
                })
                .await;
            }
            self.manager
                .start_transient_unit(unit.clone(), "fail".into(), props(i), Vec::new())
                .await
                .unwrap_or_else(|e| panic!("StartTransientUnit {unit}: {e}"));
        }
        let mut last = t0;
        self.wait_until(|s| match s.gone_by_prefix.get(prefix) {
            Some((gone, at)) if *gone >= n => {
                last = *at;
                true
            }
            _ => false,
        })
        .await;
        last.duration_since(t0).as_secs_f64()
    }

    async fn exec_main_start(&self, unit: &str) -> Option<u64> {
        let path = ptrain::systemd::unit_object_path(unit);
        let reply = self
            .conn
            .call_method(
                Some("org.freedesktop.systemd1"),
                path.as_str(),
                Some("org.freedesktop.DBus.Properties"),
                "Get",
                &("org.freedesktop.systemd1.Service", "ExecMainStartTimestamp"),
            )
            .await
            .ok()?;
        let value: OwnedVariant = reply.body().deserialize().ok()?;
        u64::try_from(value).ok().filter(|t| *t > 0)
    }
}

/// What the ptraind loops wait for after a job ended, before the next
/// drop, so that it does not compete with the last job's cleanup (the bare
/// floor loop waits for its unit's UnitRemoved the same way): the job's unit
/// gone from systemd, and ptraind's post-end work done, observed as its
/// output archive in the log directory (the archiver syncs the journal and
/// runs journalctl; it renames the archive into place last).
struct Quiescence {
    units: Bare,
    log_dir: PathBuf,
    /// Cleared when an archive never came (archiving off, the log dir
    /// unusable): later jobs then wait for their unit only, not 30 s each.
    archives: bool,
}

impl Quiescence {
    async fn connect(d: &TestDaemon) -> Quiescence {
        let config = ptrain::config::Config::load(&d.config).expect("the bench config loads");
        Quiescence {
            units: Bare::connect(&d.harness.bus_address()).await,
            log_dir: config.log_dir,
            archives: config.logs.archive,
        }
    }

    async fn wait(&mut self, job: &JobView) -> Result<(), String> {
        // A launch that failed left no unit; a unit that never started
        // leaves no output to archive.
        if job.invocation_id.is_none() && job.started_at.is_none() {
            return Ok(());
        }
        let unit = job.unit.as_str();
        if !self
            .units
            .wait_for(|s| s.unit_removed.contains(unit), QUIET_TIMEOUT)
            .await
        {
            return Err(format!(
                "unit {unit} still loaded in systemd {QUIET_TIMEOUT:?} after the job ended; the next job goes ahead"
            ));
        }
        if !self.archives || job.started_at.is_none() {
            return Ok(());
        }
        let dir = self.log_dir.join(job.uid.to_string());
        let names = ptrain::logs::archive::candidate_names(&job.id, job.invocation_id.as_deref());
        let deadline = Instant::now() + QUIET_TIMEOUT;
        // Polled: the archive is a file in a root-only dir, with no signal.
        while !names.iter().any(|n| dir.join(n).exists()) {
            if Instant::now() >= deadline {
                self.archives = false;
                return Err(format!(
                    "no output archive {} after {QUIET_TIMEOUT:?} (see `job output archived` in ptraind's journal); later jobs wait for their unit only",
                    dir.join(&names[0]).display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }
}

/// The least a unit needs: the same command, as the same user.
fn bare_properties(uid: u32, add_ref: bool) -> Vec<(String, OwnedVariant)> {
    let exec = vec![(TRUE.to_string(), vec![TRUE.to_string()], false)];
    vec![
        ("Type".into(), variant(zbus::Variant::from("exec"))),
        ("ExecStart".into(), variant(zbus::Variant::from(exec))),
        ("User".into(), variant(zbus::Variant::from(uid.to_string()))),
        ("AddRef".into(), variant(zbus::Variant::from(add_ref))),
    ]
}

fn variant(value: zbus::Variant<'_>) -> OwnedVariant {
    OwnedVariant::try_from(value).expect("plain values convert")
}

/// The properties ptraind gives a job's unit (confinement, the exit
/// recorder), from `ptrain::unit` itself: how much of a gap is the unit's.
struct PtrainProps {
    config: ptrain::config::Config,
    owner: Owner,
    ptraind: PathBuf,
    /// Launch files and result directories, as ptraind makes them.
    runtime: ptrain::runtime::JobRuntime,
    /// The harness's declared GPUs, as ptraind sees them.
    gpus: Vec<ptrain::gpu::GpuInfo>,
}

impl PtrainProps {
    fn new(d: &TestDaemon) -> PtrainProps {
        let mut config = ptrain::config::Config::load(&d.config).expect("the bench config loads");
        // The recorder writes its exit files here, not into ptraind's state.
        config.state_dir = d.root.join("floor-state");
        ptrain::store::Store::open(&config.state_dir).expect("a state dir for the floor");
        let (uid, _) = ensure_user(ALICE);
        let gpus = ptrain::gpu::open_inventory(&config.gpus)
            .and_then(|inventory| inventory.snapshot())
            .expect("the bench's declared GPUs");
        PtrainProps {
            config,
            owner: ptrain::users::owner_of_uid(uid).expect("the bench user exists"),
            ptraind: crate::daemon::ptraind_bin().to_owned(),
            runtime: ptrain::runtime::JobRuntime::open(&d.root.join("floor-runtime"))
                .expect("a runtime dir for the floor"),
            gpus,
        }
    }

    /// Without `recorder`, the unit lacks its OnSuccess=/OnFailure= exit
    /// recorders.
    fn properties(&self, id: &str, add_ref: bool, recorder: bool) -> Vec<(String, OwnedVariant)> {
        self.properties_on(id, add_ref, recorder, None)
    }

    /// The unit of a job on GPU `gpu` (its device allowed, its variables).
    fn properties_on(
        &self,
        id: &str,
        add_ref: bool,
        recorder: bool,
        gpu: Option<u32>,
    ) -> Vec<(String, OwnedVariant)> {
        let mut record = history_record(id, &self.owner, 0, JobState::Queued);
        record.gpus = self
            .gpus
            .iter()
            .filter(|g| Some(g.index) == gpu)
            .map(|g| ptrain::store::AssignedGpu {
                index: g.index,
                uuid: g.uuid.clone(),
                device: g.device.clone(),
            })
            .collect();
        let launch = ptrain::unit::launch_file(&record, None);
        let prepared = self
            .runtime
            .prepare(&record.id, &record.owner, &launch, &Default::default())
            .expect("the floor's launch files");
        let result_file = self.runtime.result_file(&record.id);
        let ctx = ptrain::unit::LaunchContext {
            home_exists: record.owner.home.is_dir(),
            ptraind: &self.ptraind,
            prepared: &prepared,
            result_file: &result_file,
            host_exec: None,
            devices: None,
            workdir_bind: None,
        };
        let mut props: Vec<(String, OwnedVariant)> =
            ptrain::unit::job_unit_properties(&record, (&self.config).into(), &ctx)
                .into_iter()
                .filter(|(k, _)| recorder || !matches!(*k, "OnSuccess" | "OnFailure"))
                .map(|(k, v)| (k.to_string(), prop_variant(&v)))
                .collect();
        props.push(("AddRef".into(), variant(zbus::Variant::from(add_ref))));
        props
    }
}

fn prop_variant(value: &PropValue) -> OwnedVariant {
    ptrain::systemd::to_variant(value)
}

// ---------------------------------------------------------------------
// History written directly: the records ptraind would have written.

fn history_record(id: &str, owner: &Owner, at: u64, state: JobState) -> JobRecord {
    let descriptor = job_json("");
    let spec = ptrain::spec::parse_spec(descriptor.as_bytes(), id).expect("the job file parses");
    let source = SpoolSource {
        file: format!("{id}.json"),
        dev: 0,
        ino: 0,
        ctime_ns: 0,
        size: descriptor.len() as u64,
    };
    let mut record = JobRecord::new(spec, owner.clone(), source, at);
    record.state = state;
    record
}

/// Writes finished jobs `hist-N` for N in `range`, one second apart,
/// ending well before now, as `STATE/jobs/ID.json`.
/// How many runs of jobs whose id starts with `prefix` the accounting
/// database of `state_dir` holds (0 while it cannot be read).
fn accounting_rows(state_dir: &Path, prefix: &str) -> usize {
    let path = ptrain::accounting::db::db_path(state_dir);
    let Ok(conn) =
        rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
    else {
        return 0;
    };
    conn.query_row(
        "SELECT count(*) FROM jobs WHERE substr(id, 1, length(?1)) = ?1",
        [prefix],
        |row| row.get::<_, i64>(0),
    )
    .map_or(0, |n| n as usize)
}

fn populate_history(state_dir: &Path, owner: &Owner, range: std::ops::Range<usize>) {
    ptrain::store::Store::open(state_dir).expect("the state dir opens");
    let jobs = state_dir.join("jobs");
    let descriptor = job_json("");
    // Ends before any probe: history sorts before the jobs run now.
    let base = ptrain::now_micros() - 30 * 24 * 3600 * 1_000_000;
    for i in range {
        let id = format!("hist-{i:06}");
        let at = base + i as u64 * 1_000_000;
        let mut record = history_record(&id, owner, at, JobState::Ended);
        record.started_at = Some(at + 20_000);
        record.ended_at = Some(at + 40_000);
        record.outcome = Some(Outcome::Succeeded);
        record.systemd_result = Some("success".into());
        record.invocation_id = Some(format!("{:032x}", i as u128 * 0x9e37_79b9_7f4a_7c15));
        record.main_pid = Some(1000 + i as u32);
        let bytes = ptrain::store::job_file_bytes(&record, descriptor.as_bytes());
        std::fs::write(jobs.join(ptrain::store::job_file_name(&record.id)), bytes)
            .expect("write a history record");
    }
}

// ---------------------------------------------------------------------
// Processes of the harness, seen from the host.

/// The pid namespace of a process, as the link text `pid:[N]`.
fn pid_ns(pid: u32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()
}

/// Host pids of the processes in the harness's pid namespace, with their
/// pid inside it and their comm.
fn harness_processes(h: &Harness) -> Vec<(u32, u32, String)> {
    let Some(ns) = pid_ns(h.systemd_pid()) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid_ns(pid).as_ref() != Some(&ns) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
        };
        let inner = field("NSpid:")
            .and_then(|v| v.split_whitespace().last().and_then(|p| p.parse().ok()))
            .unwrap_or(0);
        out.push((pid, inner, field("Name:").unwrap_or_default()));
    }
    out
}

/// How often systemd restarted ptraind (NRestarts).
/// Where PID 1's journal is now, to count from ([`systemd_cut_off`]).
fn journal_cursor(d: &TestDaemon) -> String {
    d.harness.command("journalctl").arg("--sync").status().ok();
    let out = d.harness.journal(&["_PID=1", "-n", "1", "--show-cursor"]);
    out.lines()
        .find_map(|l| l.strip_prefix("-- cursor: "))
        .unwrap_or_default()
        .to_string()
}

/// How often systemd lost its bus connection since `cursor` (dbus-daemon
/// cuts off a connection past its match rule limit).
fn systemd_cut_off(d: &TestDaemon, cursor: &str) -> u32 {
    d.harness.command("journalctl").arg("--sync").status().ok();
    let after = format!("--after-cursor={cursor}");
    let mut args = vec!["-b", "_PID=1"];
    if !cursor.is_empty() {
        args.push(&after);
    }
    d.harness
        .journal(&args)
        .lines()
        .filter(|l| l.contains("Got disconnect on API bus"))
        .count() as u32
}

fn restarts(d: &TestDaemon) -> u32 {
    d.unit_property("ptraind.service", "NRestarts")
        .parse()
        .unwrap_or(0)
}

/// ptraind's host pid, from the MainPID systemd reports inside.
/// On against off in each round, on first in even rounds: neither side
/// always runs on a machine the other has just warmed.
fn on_off_order(round: usize) -> [bool; 2] {
    if round.is_multiple_of(2) {
        [true, false]
    } else {
        [false, true]
    }
}

/// Rewrites the harness's config to `text` and restarts ptraind with it
/// (returns once it said READY=1).
fn restart_with_config(d: &TestDaemon, text: &str) {
    std::fs::write(d.root.join("ptrain.toml"), text).expect("cannot rewrite the harness's config");
    let (ok, out) = d.harness.systemctl(&["restart", "ptraind.service"]);
    assert!(ok, "cannot restart ptraind: {out}");
}

fn ptraind_pid(d: &TestDaemon) -> u32 {
    let inner: u32 = d
        .unit_property("ptraind.service", "MainPID")
        .parse()
        .expect("MainPID is a number");
    wait_for("ptraind's host pid", Duration::from_secs(5), || {
        harness_processes(&d.harness)
            .into_iter()
            .find(|(_, p, _)| *p == inner)
            .map(|(host, _, _)| host)
    })
}

#[derive(Clone, Copy, Debug, Default)]
struct ProcSample {
    rss_kib: u64,
    /// The anonymous part of the RSS (heap, stacks) and the file-backed
    /// part (the binary's and libraries' pages), from status.
    rss_anon_kib: u64,
    rss_file_kib: u64,
    /// On-CPU time of every thread, from schedstat (ns).
    cpu_ns: u64,
    /// Children reaped (systemd: the job processes), from stat (ns).
    children_ns: u64,
    voluntary: u64,
    involuntary: u64,
    threads: u64,
}

impl ProcSample {
    fn read(pid: u32) -> Option<ProcSample> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let num = |text: &str, name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let mut s = ProcSample {
            rss_kib: num(&status, "VmRSS:"),
            rss_anon_kib: num(&status, "RssAnon:"),
            rss_file_kib: num(&status, "RssFile:"),
            threads: num(&status, "Threads:"),
            ..ProcSample::default()
        };
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))
            .ok()?
            .flatten()
        {
            let dir = task.path();
            if let Ok(t) = std::fs::read_to_string(dir.join("status")) {
                s.voluntary += num(&t, "voluntary_ctxt_switches:");
                s.involuntary += num(&t, "nonvoluntary_ctxt_switches:");
            }
            if let Ok(t) = std::fs::read_to_string(dir.join("schedstat")) {
                s.cpu_ns += t
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            // Fields after the command's closing parenthesis; cutime and
            // cstime are the 16th and 17th of the line.
            let after = stat.rsplit_once(')').map(|(_, a)| a).unwrap_or("");
            let fields: Vec<&str> = after.split_whitespace().collect();
            let ticks = |i: usize| {
                fields
                    .get(i)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            // SAFETY: sysconf has no preconditions.
            let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
            s.children_ns = (ticks(13) + ticks(14)) * 1_000_000_000 / hz;
        }
        Some(s)
    }

    fn switches(&self) -> u64 {
        self.voluntary + self.involuntary
    }
}

/// CPU spent, by cgroup (µs precision, exited threads and processes
/// included): ptraind.service's, and the whole harness's.
struct BlockCpu {
    service_ns: u64,
    harness_ns: u64,
}

impl BlockCpu {
    /// By ptraind's host pid and the harness's systemd's.
    fn read(ptraind: u32, systemd: u32) -> Option<BlockCpu> {
        let service = cgroup_dir_of(ptraind)?;
        // systemd itself sits in the harness root's init.scope.
        let harness = cgroup_dir_of(systemd)?.parent()?.to_owned();
        Some(BlockCpu {
            service_ns: cgroup_usage_ns(&service)?,
            harness_ns: cgroup_usage_ns(&harness)?,
        })
    }
}

/// The cgroup v2 directory of a host pid (on a pure v2 host or a hybrid
/// one, as tests/harness/boot.sh finds the hierarchy).
fn cgroup_dir_of(pid: u32) -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let root = mounts.lines().find_map(|l| {
        let mut fields = l.split_whitespace();
        let (_, dir, kind) = (fields.next()?, fields.next()?, fields.next()?);
        (kind == "cgroup2").then_some(dir)
    })?;
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(Path::new(root).join(path.trim_start_matches('/')))
}

/// A cgroup's `usage_usec` (its own and its descendants', live or gone), in ns.
fn cgroup_usage_ns(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join("cpu.stat")).ok()?;
    let usec = text
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec "))?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(usec * 1000)
}

/// The long-lived processes of the harness whose CPU a job costs.
struct Procs {
    pids: Vec<(&'static str, u32)>,
}

impl Procs {
    fn find(h: &Harness) -> Procs {
        let all = harness_processes(h);
        let mut pids = Vec::new();
        for (name, comm) in [
            ("ptraind", "ptraind"),
            ("dbus-daemon", "dbus-daemon"),
            ("journald", "systemd-journal"),
        ] {
            if let Some((pid, _, _)) = all.iter().find(|(_, _, c)| c == comm) {
                pids.push((name, *pid));
            }
        }
        pids.push(("systemd", h.systemd_pid()));
        Procs { pids }
    }

    fn cpu(&self) -> CpuSnapshot {
        CpuSnapshot {
            at: Instant::now(),
            procs: self
                .pids
                .iter()
                .map(|(name, pid)| (*name, ProcSample::read(*pid).unwrap_or_default()))
                .collect(),
            bench_ns: self_cpu_ns(),
        }
    }
}

fn self_cpu_ns() -> u64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

struct CpuSnapshot {
    at: Instant,
    procs: Vec<(&'static str, ProcSample)>,
    bench_ns: u64,
}

impl CpuSnapshot {
    fn since(&self, before: &CpuSnapshot) -> CpuDelta {
        let mut ns = BTreeMap::new();
        for ((name, a), (_, b)) in self.procs.iter().zip(&before.procs) {
            ns.insert(name.to_string(), a.cpu_ns.saturating_sub(b.cpu_ns));
            if *name == "systemd" {
                ns.insert(
                    "systemd children (the jobs)".into(),
                    a.children_ns.saturating_sub(b.children_ns),
                );
            }
        }
        ns.insert(
            "bench".into(),
            self.bench_ns.saturating_sub(before.bench_ns),
        );
        CpuDelta {
            ns,
            wall: self.at.duration_since(before.at),
        }
    }
}

#[derive(Clone, Debug, Default)]
struct CpuDelta {
    ns: BTreeMap<String, u64>,
    wall: Duration,
}

impl CpuDelta {
    fn per_job(&self, name: &str, n: usize) -> Option<f64> {
        let ns = *self.ns.get(name)?;
        (n > 0).then(|| ns as f64 / 1e6 / n as f64)
    }

    fn per_job_all(&self, n: usize) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for (name, ns) in &self.ns {
            m.insert(name.clone(), json!(*ns as f64 / 1e6 / n.max(1) as f64));
        }
        m.insert("wall_s".into(), json!(self.wall.as_secs_f64()));
        serde_json::Value::Object(m)
    }
}

// ---------------------------------------------------------------------
// A notification endpoint that takes its time.

struct SlowEndpoint {
    port: u16,
    requests: Arc<AtomicUsize>,
}

impl SlowEndpoint {
    fn start(delay: Duration) -> SlowEndpoint {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let requests = Arc::new(AtomicUsize::new(0));
        let count = requests.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let count = count.clone();
                std::thread::spawn(move || {
                    if serve_slowly(conn, delay).is_ok() {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        SlowEndpoint { port, requests }
    }
}

/// Reads one request (headers and a Content-Length body), waits, answers
/// 200 and closes.
fn serve_slowly(conn: TcpStream, delay: Duration) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body)?;
    std::thread::sleep(delay);
    let mut conn = conn;
    conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
}

// ---------------------------------------------------------------------
// The machine.

fn machine() -> Machine {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let meminfo = read("/proc/meminfo");
    let command = |program: &str, args: &[&str]| {
        std::process::Command::new(program)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let repo = crate::harness::repo_root();
    let repo = repo.to_str().unwrap_or(".");
    let mut commit = command("git", &["-C", repo, "rev-parse", "--short", "HEAD"]);
    if !command("git", &["-C", repo, "status", "--porcelain"]).is_empty() {
        commit.push_str("-dirty");
    }
    Machine {
        nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model: cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default(),
        mem_total_mib: meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            / 1024,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        systemd: command("systemctl", &["--version"])
            .lines()
            .next()
            .unwrap_or("")
            .to_string(),
        date: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        git_commit: commit,
        load_start: load_average(),
        load_end: 0.0,
    }
}

/// The 1-minute load average.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Rows in the accounting database for the query figures (issue 23: "over
/// 1,000,000 records").
const ACCOUNTING_ROWS: u64 = 1_000_000;

/// `rows` ended runs of 200 users (`acct-user-N`) spread evenly over the
/// year up to now, a third of them on GPUs, a tenth failed, in chunks of
/// one transaction each.
fn write_accounting_rows(path: &std::path::Path, rows: u64) -> Result<(), String> {
    use ptrain::accounting::{db, query::HistoryRow};
    const USERS: u64 = 200;
    let now_us = ptrain::now_micros();
    let year_us = 365 * 86_400 * 1_000_000u64;
    let mut conn = db::open_for_writing(path).map_err(|e| e.to_string())?;
    let row = |i: u64| {
        let gpus = (i % 3) as u32;
        let ended_us = now_us - year_us + i * (year_us / rows);
        let wall_us = 600_000_000;
        let failed = i % 10 == 9;
        HistoryRow {
            id: format!("acct-{i}"),
            submitted_us: ended_us - wall_us - 1_000_000,
            invocation: format!("{i:032x}"),
            uid: 20_000 + (i % USERS) as u32,
            user: format!("acct-user-{}", i % USERS),
            gid: 20_000 + (i % 7) as u32,
            sweep: None,
            name: Some(format!("train-{}", i % 50)),
            status: if failed { "failed" } else { "succeeded" }.into(),
            exit_code: Some(if failed { 1 } else { 0 }),
            signal: None,
            started_us: Some(ended_us - wall_us),
            ended_us,
            wall_us,
            gpus,
            gpu_indices: (0..gpus).collect(),
            gpu_uuids: (0..gpus).map(|g| format!("GPU-{g}")).collect(),
            gpu_seconds: 600.0 * f64::from(gpus),
            cpu_nsec: Some(550_000_000_000),
            mem_peak_bytes: Some(2 << 30),
            io_read_bytes: Some(1 << 30),
            io_write_bytes: Some(1 << 20),
            gpu_util_avg_pct: (gpus > 0).then_some(71.5),
            gpu_mem_peak_mib: (gpus > 0).then_some(30_000),
        }
    };
    let mut chunk = Vec::with_capacity(50_000);
    for i in 0..rows {
        chunk.push(row(i));
        if chunk.len() == chunk.capacity() || i + 1 == rows {
            db::insert_rows(&mut conn, &chunk).map_err(|e| e.to_string())?;
            chunk.clear();
        }
    }
    Ok(())
}
