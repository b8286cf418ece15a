//! Every job file in spool-examples/ runs on the real systemd and ends as
//! its README says.

use crate::daemon::{chown, text, Opts, TestDaemon, ALICE};
use crate::harness::repo_root;

fn submit(d: &TestDaemon, example: &str) {
    let src = repo_root().join("spool-examples").join(example);
    let dst = d.workdir(ALICE).join(example.replace('/', "-"));
    std::fs::copy(&src, &dst).unwrap();
    chown(&dst, ALICE);
    let out = d.ptrain(ALICE, &["submit", dst.to_str().unwrap()]);
    assert!(out.status.success(), "{example}: {}", text(&out));
}

#[test]
fn spool_examples_run_as_documented() {
    let d = TestDaemon::start_with(
        "examples",
        Opts {
            gpus: 2,
            ..Opts::default()
        },
    );
    for example in [
        "hello.json",
        "train-1gpu.json",
        "multi-gpu.json",
        "pipeline/1-prep.json",
        "pipeline/2-train.json",
        "pipeline/3-eval.json",
        "pipeline/4-alert.json",
        "sweep.json",
        "sweep-compare.json",
    ] {
        submit(&d, example);
    }
    for id in [
        "hello",
        "train-1gpu",
        "multi-gpu",
        "pipe-prep",
        "pipe-train",
        "pipe-eval",
    ] {
        let s = d.wait_ended(id);
        assert_eq!(s["status"], "succeeded", "{id}: {s}");
    }
    assert_eq!(d.status("train-1gpu").unwrap()["result"]["accuracy"], 0.967);
    assert_eq!(
        d.status("multi-gpu").unwrap()["gpus"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(d.wait_ended("pipe-alert")["status"], "not-needed");
    // Without the channels it names, notify.json is refused, and the
    // reason says which and how to fix it.
    let src = repo_root().join("spool-examples/notify.json");
    let dst = d.workdir(ALICE).join("notify.json");
    std::fs::copy(&src, &dst).unwrap();
    chown(&dst, ALICE);
    let out = d.ptrain(ALICE, &["submit", dst.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("names channel \"ops-wecom\", which the admin has not configured"),
        "{}",
        text(&out)
    );
    let compare = d.wait_ended("sweep-compare");
    assert_eq!(compare["status"], "succeeded", "{compare}");
    assert_eq!(
        compare["result"]["best"], "lr-sweep-lr0.01-bs32",
        "{compare}"
    );
    let sweep: Vec<serde_json::Value> =
        serde_json::from_slice(&d.ptrain("root", &["list", "--json"]).stdout).unwrap();
    assert_eq!(sweep.iter().filter(|j| j["group"] == "lr-sweep").count(), 6);
    let logs = text(&d.ptrain(ALICE, &["logs", "train-1gpu"]));
    assert!(logs.contains("epoch 2 loss"), "{logs}");
}
