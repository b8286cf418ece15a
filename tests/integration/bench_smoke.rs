//! The benchmark suite (`make bench`, benches/ptrain) at a tiny scale: every
//! scenario runs against the real harness and yields its figures. Proves the
//! bench code works; it never judges a speed (targets live in the bench).

#[path = "../../benches/ptrain/suite.rs"]
mod suite;

use suite::report::Results;

#[test]
fn every_benchmark_scenario_runs_and_reports() {
    let results = suite::run(&suite::Scale::smoke());
    let keys: Vec<&str> = results.figures.iter().map(|f| f.key.as_str()).collect();
    for key in [
        "latency.p50",
        "latency.p99",
        "latency.ptraind.p50",
        "floor.props.latency.p99",
        "latency.vs_props.p99",
        "floor.warm.latency.p50",
        "throughput.20.vs_props",
        "throughput.gpu.20.vs_props",
        "floor.props-gpus.throughput.20",
        "floor.props.throughput.20",
        "floor.props-norec.throughput.20",
        "throughput.20",
        "throughput.gpu.20",
        "queued.rss_per_job",
        "notify.throughput",
        "events.cpu_vs_off",
        "events.cpu_per_event",
        "events.lag.p50",
        "events.lag.p99",
        "events.kafka.cpu_vs_off",
        "events.kafka.cpu_per_event",
        "events.kafka.lag.p50",
        "events.kafka.lag.p99",
        "growth.latency.1",
        "growth.latency.200",
        "cli.list",
        "cli.list_all",
        "cli.status",
        "api.list",
        "api.status",
        "idle.rss",
        "idle.wakeups",
        "idle.rss_after_list_all",
        "history.rss_per_job",
        "idle.rss_vs_none",
        "accounting.cpu_vs_off",
        "accounting.host_cpu_vs_off",
        "accounting.latency_vs_off",
        "images.drop_to_active_vs_host",
        "images.drop_to_active_vs_host.p99",
        "images.drop_to_start_reply.p50",
        "images.warm_pull.p50",
        "images.start_reply_to_active.p50",
        "images.pull_vs_skopeo",
        "images.pull_only_vs_skopeo",
        "images.unpack",
    ] {
        let f = results
            .figure(key)
            .unwrap_or_else(|| panic!("no figure {key} among {keys:?}"));
        let value = f
            .value
            .unwrap_or_else(|| panic!("figure {key} has no value: {}", f.note));
        assert!(value.is_finite(), "figure {key} = {value}");
    }
    // Every job of every scenario ran to success: a figure from failed
    // jobs would measure the wrong thing. (The image pull's note says how
    // it was measured; its failures leave it without a value.)
    for f in &results.figures {
        assert!(
            f.note.is_empty() || f.key == "idle.wakeups" || f.key == "images.pull_vs_skopeo",
            "{}: {}",
            f.key,
            f.note
        );
    }
    // Floors were measured in the same run and ratios follow from them.
    let p99 = results.figure("latency.p99").unwrap();
    assert!(p99.floor.is_some_and(|f| f > 0.0) && p99.ratio.is_some() && p99.pass.is_some());
    let tp = results.figure("throughput.20").unwrap();
    assert!(tp.floor.is_some_and(|f| f > 0.0) && tp.pass.is_some());
    assert!(!results.machine.kernel.is_empty() && results.machine.nproc > 0);
    // The figures CI enforces (`make bench-ci`) carry their limit and were
    // judged against it; wall-clock latency and throughput are never enforced.
    for key in [
        "growth.cpu.200",
        "idle.rss_vs_none",
        "cli.status",
        "api.status",
        "idle.wakeups",
        "idle.rss",
        "throughput.20.restarts",
        "throughput.20.systemd_cut_off",
    ] {
        let f = results.figure(key).unwrap();
        let e = f
            .enforced
            .as_ref()
            .unwrap_or_else(|| panic!("figure {key} has no enforced limit"));
        assert!(
            e.pass.is_some(),
            "figure {key}: its enforced limit was not judged"
        );
    }
    for key in [
        "latency.p99",
        "throughput.20",
        "api.list",
        "images.drop_to_active_vs_host",
        "images.pull_vs_skopeo",
    ] {
        assert!(
            results.figure(key).unwrap().enforced.is_none(),
            "figure {key} is wall-clock and must not be enforced"
        );
    }
    // The JSON two runs are compared by round-trips, and the table shows
    // every figure.
    let json = serde_json::to_string(&results).unwrap();
    let back: Results = serde_json::from_str(&json).unwrap();
    assert_eq!(back.figures.len(), results.figures.len());
    let table = results.table(Some(&back));
    for f in &results.figures {
        assert!(
            table.contains(&f.label),
            "{} missing from\n{table}",
            f.label
        );
    }
}
