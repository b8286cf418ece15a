//! `make bench` (`cargo bench --bench ptrain`): what ptraind costs on top
//! of systemd, measured against the project's real-systemd harness. Prints
//! one table (each figure, its floor, the ratio, the target) and writes
//! `target/bench/results.json`; the previous results, if any, are kept as
//! `results.prev.json` and shown in the table's last column.
//!
//! `BENCH_SCALE=full` (default: the sizes), `ci` (about ten
//! minutes on two cores, 100,000 jobs of history included), `quick` (300
//! jobs per throughput case, for profiling one change) or `smoke`.
//! `BENCH_ONLY=throughput` or `history` runs one of the two harnesses
//! (`gpu`: only the GPU bursts and their floors, for profiling them;
//! `burst`: only the trivial bursts and the bystander's responsiveness;
//! `accounting`: accounting on against off; `images`: image jobs against
//! host jobs, and an image's pull against skopeo's; `events`: an AMQP
//! event stream on against off);
//! `BENCH_SIZES=1000,10000` replaces the scale's throughput sizes.
//! Needs root, like the integration tests.
//!
//! `BENCH_ENFORCE=1` (`make bench-ci`, which CI runs): exit 1 when a figure
//! with an enforced limit misses it or could not be measured. Only figures
//! robust on a shared machine are enforced (the table's `enforced` column);
//! the rest, wall-clock latency and throughput among them, are reported.

#[path = "../../tests/integration/daemon.rs"]
mod daemon;
#[path = "../../tests/integration/harness.rs"]
mod harness;
// The loopback registry and the test image of issue 21's tests, for the
// images part; its tests are not compiled here, so their helpers are unused.
#[allow(dead_code, unused_imports)]
#[path = "../../tests/integration/images.rs"]
mod images;
// The RabbitMQ of issue 25's test, for the events part.
#[allow(dead_code)]
#[path = "../../tests/integration/rabbit.rs"]
mod rabbit;
mod suite;
// The consumer reads with its own client; the harness's reader is the tests'.
#[allow(dead_code)]
#[path = "../../tests/integration/tansu.rs"]
mod tansu;
#[path = "../../tests/integration/test_server.rs"]
mod test_server;

use std::path::PathBuf;

use suite::report::Results;

fn main() {
    let name = std::env::var("BENCH_SCALE").unwrap_or_default();
    let sizes = std::env::var("BENCH_SIZES").unwrap_or_default();
    let scale = match suite::Scale::from_name(&name).and_then(|s| s.with_sizes(&sizes)) {
        Ok(scale) => scale,
        Err(e) => {
            eprintln!("ptrain bench: {e}");
            std::process::exit(2);
        }
    };
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("ptrain bench: must run as root: it boots a real systemd (tests/harness/boot.sh); run sudo make bench");
        std::process::exit(2);
    }
    let dir = results_dir();
    let path = dir.join("results.json");
    let previous: Option<Results> = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let enforce = match std::env::var("BENCH_ENFORCE").as_deref() {
        Err(_) | Ok("" | "0") => false,
        Ok("1") => true,
        Ok(other) => {
            eprintln!("ptrain bench: BENCH_ENFORCE={other:?} is not 0 or 1");
            std::process::exit(2);
        }
    };
    let results = suite::run(&scale);
    println!();
    print!("{}", results.table(previous.as_ref()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("ptrain bench: cannot create {}: {e}", dir.display());
        std::process::exit(1);
    }
    if previous.is_some() {
        let _ = std::fs::rename(&path, dir.join("results.prev.json"));
    }
    let json = serde_json::to_vec_pretty(&results).expect("results serialise");
    if let Err(e) = std::fs::write(&path, json) {
        eprintln!("ptrain bench: cannot write {}: {e}", path.display());
        std::process::exit(1);
    }
    println!("results: {}", path.display());
    let misses = results.enforced_misses();
    if enforce && !misses.is_empty() {
        eprintln!(
            "ptrain bench: {} enforced figure(s) missed their limit (BENCH_ENFORCE=1):",
            misses.len()
        );
        for m in &misses {
            eprintln!("  {m}");
        }
        eprintln!(
            "the table above has each figure beside its floor; details: {}",
            path.display()
        );
        std::process::exit(1);
    }
}

/// `target/bench`, wherever cargo's target dir is.
fn results_dir() -> PathBuf {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().map_or(tmp.clone(), |t| t.join("bench"))
}
