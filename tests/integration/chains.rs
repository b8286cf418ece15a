//! Issue 5: dependencies, sweeps, results, and waiting from CI.

use crate::daemon::{text, TestDaemon, ALICE, BOB};
use serde_json::json;

#[test]
fn a_failed_stage_fails_its_descendants_and_runs_the_alert() {
    let d = TestDaemon::start("pipeline");
    let work = d.workdir(ALICE);
    let job = |cmd: &str, extra: serde_json::Value| {
        let mut j = json!({"version": 1, "command": ["/bin/sh", "-c", cmd], "workdir": work});
        for (k, v) in extra.as_object().unwrap() {
            j[k] = v.clone();
        }
        j.to_string()
    };
    // prep waits for a go file, so every later stage is submitted while
    // its parent is still queued or running.
    d.drop_job(
        ALICE,
        "prep.json",
        &job("while [ ! -e go ]; do sleep 0.05; done", json!({})),
    );
    d.drop_job(
        ALICE,
        "train.json",
        &job("exit 7", json!({"after_ok": ["prep"]})),
    );
    d.drop_job(
        ALICE,
        "eval.json",
        &job("echo eval > eval.txt", json!({"after_ok": ["train"]})),
    );
    d.drop_job(
        ALICE,
        "deploy.json",
        &job("echo deploy > deploy.txt", json!({"after_ok": ["eval"]})),
    );
    // after_fail on the last stage: a failure anywhere before it ends it
    // dependency-failed, which is not ok, so the alert runs.
    d.drop_job(
        ALICE,
        "alert.json",
        &job("echo alert > alert.txt", json!({"after_fail": ["eval"]})),
    );
    // Slurm's afternotok:prep:train: only if both failed. prep succeeded.
    d.drop_job(
        ALICE,
        "strict.json",
        &job(
            "echo strict > strict.txt",
            json!({"after_fail": ["prep", "train"]}),
        ),
    );
    d.drop_job(
        ALICE,
        "cleanup.json",
        &job("true", json!({"after_any": ["train"]})),
    );
    d.wait_running("prep");
    let waiting = d.wait_claimed("eval");
    assert_eq!(waiting["status"], "queued");
    assert_eq!(waiting["waiting_for"], json!(["train"]));
    let shown = text(&d.ptrain(ALICE, &["status", "eval"]));
    assert!(shown.contains("waiting for train"), "{shown}");
    std::fs::write(work.join("go"), "").unwrap();
    assert_eq!(d.wait_ended("prep")["status"], "succeeded");
    let train = d.wait_ended("train");
    assert_eq!(
        (train["status"].as_str(), train["exit_code"].as_i64()),
        (Some("failed"), Some(7))
    );
    let eval = d.wait_ended("eval");
    assert_eq!(eval["status"], "dependency-failed", "{eval}");
    assert_eq!(eval["outcome"]["parent"], "train");
    let deploy = d.wait_ended("deploy");
    assert_eq!(deploy["status"], "dependency-failed", "{deploy}");
    assert_eq!(deploy["outcome"]["parent"], "eval");
    assert_eq!(d.wait_ended("alert")["status"], "succeeded");
    assert_eq!(d.wait_ended("cleanup")["status"], "succeeded");
    let strict = d.wait_ended("strict");
    assert_eq!(strict["status"], "not-needed", "{strict}");
    assert_eq!(strict["outcome"]["parent"], "prep", "{strict}");
    assert!(strict["started_at"].is_null(), "{strict}");
    assert!(!work.join("strict.txt").exists());
    assert!(work.join("alert.txt").exists());
    assert!(!work.join("eval.txt").exists() && !work.join("deploy.txt").exists());
    // A dependency-failed job never got a unit.
    assert!(deploy["started_at"].is_null(), "{deploy}");
    // The chain as a tree: each stage under the one it waits for.
    let tree = text(&d.ptrain(ALICE, &["list", "--tree"]));
    for line in [
        "prep succeeded",
        "  train failed",
        "    eval dependency-failed",
        "      deploy dependency-failed",
        "      alert succeeded (after_fail)",
    ] {
        assert!(
            tree.lines().any(|l| l.starts_with(line)),
            "no line {line:?} in\n{tree}"
        );
    }
    // Under both of its parents: shown under the one walked first, named
    // under the other.
    let strict: Vec<&str> = tree
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("strict "))
        .collect();
    assert_eq!(strict.len(), 2, "{tree}");
    assert!(
        strict
            .iter()
            .any(|l| l.starts_with("strict not-needed (after_fail)"))
            && strict.contains(&"strict (shown above)"),
        "{tree}"
    );
}

#[test]
fn sweep_runs_bounded_and_a_final_job_gets_every_result() {
    let d = TestDaemon::start("sweep");
    let work = d.workdir(ALICE);
    let member = r#"date +%s%N > start-$PTRAIN_JOB_ID; sleep 0.3; printf '{"lr": %s, "bs": %s, "score": 1}' {lr} {bs} > $PTRAIN_RESULT_FILE; date +%s%N > end-$PTRAIN_JOB_ID"#;
    let sweep = json!({
        "version": 1,
        "command": ["/bin/sh", "-c", member],
        "workdir": work,
        "sweep": {"lr": [0.1, 0.01, 0.001], "bs": [16, 32, 64]},
        "max_parallel": 2,
    });
    d.drop_job(ALICE, "grid.json", &sweep.to_string());
    let compare = json!({
        "version": 1,
        "command": ["/bin/sh", "-c", "printf '%s' \"$PTRAIN_PARENT_RESULTS\" > compare.json"],
        "workdir": work,
        "after_ok": ["grid"],
    });
    d.drop_job(ALICE, "compare.json", &compare.to_string());
    assert_eq!(d.wait_ended("compare")["status"], "succeeded");
    let mut ids = Vec::new();
    for lr in ["0.1", "0.01", "0.001"] {
        for bs in ["16", "32", "64"] {
            let id = format!("grid-lr{lr}-bs{bs}");
            let s = d.status(&id).unwrap_or_else(|| panic!("no member {id}"));
            assert_eq!(s["status"], "succeeded", "{s}");
            assert_eq!(s["group"], "grid");
            assert_eq!(s["result"]["lr"].to_string(), lr, "{s}");
            ids.push(id);
        }
    }
    // Never more than max_parallel members at once.
    let read = |name: String| -> u128 {
        std::fs::read_to_string(work.join(name))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let intervals: Vec<(u128, u128)> = ids
        .iter()
        .map(|id| (read(format!("start-{id}")), read(format!("end-{id}"))))
        .collect();
    for (s, _) in &intervals {
        let overlapping = intervals.iter().filter(|(a, b)| a <= s && s < b).count();
        assert!(
            overlapping <= 2,
            "{overlapping} members ran at once: {intervals:?}"
        );
    }
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(work.join("compare.json")).unwrap()).unwrap();
    assert_eq!(results.as_object().unwrap().len(), 9, "{results}");
    assert_eq!(results["grid-lr0.01-bs32"]["bs"], 32);
    // The comparison job shows the results it got in its own status too.
    assert_eq!(d.status("compare").unwrap()["after_ok"], json!(["grid"]));
}

#[test]
fn unknown_cyclic_and_cross_user_dependencies_are_rejected() {
    let d = TestDaemon::start("deps");
    d.drop_job(
        BOB,
        "bobs.json",
        r#"{"version": 1, "command": ["sleep", "30"]}"#,
    );
    d.wait_running("bobs");
    d.drop_job(
        ALICE,
        "steal.json",
        r#"{"version": 1, "command": ["true"], "after_ok": ["bobs"]}"#,
    );
    let r = d.wait_rejected(ALICE, "steal.json");
    assert!(r["reason"].as_str().unwrap().contains("belongs to"), "{r}");
    d.drop_job(
        ALICE,
        "ghost.json",
        r#"{"version": 1, "command": ["true"], "after_any": ["nope"]}"#,
    );
    let r = d.wait_rejected(ALICE, "ghost.json");
    assert!(
        r["reason"].as_str().unwrap().contains("does not know"),
        "{r}"
    );
    d.drop_job(
        ALICE,
        "self.json",
        r#"{"version": 1, "command": ["true"], "after_ok": ["self"]}"#,
    );
    let r = d.wait_rejected(ALICE, "self.json");
    assert!(r["reason"].as_str().unwrap().contains("cycle"), "{r}");
    d.assert_alive();
}

#[test]
fn submit_wait_exit_codes_tell_what_happened() {
    let d = TestDaemon::start("wait");
    let work = d.workdir(ALICE);
    let write = |name: &str, json: serde_json::Value| {
        let p = work.join(name);
        std::fs::write(&p, json.to_string()).unwrap();
        crate::daemon::chown(&p, ALICE);
        p.display().to_string()
    };
    let ok = write("w-ok.json", json!({"version": 1, "command": ["true"]}));
    let out = d.ptrain(ALICE, &["submit", &ok, "--wait"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("w-ok: succeeded"), "{}", text(&out));
    let bad = write("w-bad.json", json!({"version": 1, "command": ["false"]}));
    let out = d.ptrain(ALICE, &["submit", &bad, "--wait"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("w-bad: failed with exit code 1"),
        "{}",
        text(&out)
    );
    let slow = write(
        "w-slow.json",
        json!({"version": 1, "command": ["sleep", "30"], "timeout": "1s"}),
    );
    let out = d.ptrain(ALICE, &["submit", &slow, "--wait"]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    let dep = write(
        "w-dep.json",
        json!({"version": 1, "command": ["true"], "after_ok": ["w-bad"]}),
    );
    let out = d.ptrain(ALICE, &["submit", &dep, "--wait"]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    // `ptrain list`: each column starts where its header does, the
    // longest status ("dependency-failed") included.
    let list = text(&d.ptrain(ALICE, &["list"]));
    let mut lines = list.lines();
    let header = lines.next().unwrap();
    let at = header.find("SUBMITTED").unwrap();
    let rows: Vec<&str> = lines.collect();
    assert!(
        rows.iter().any(|r| r.contains("dependency-failed")),
        "{list}"
    );
    for row in rows {
        let submitted: String = row.chars().skip(at).take(4).collect();
        assert!(
            submitted.starts_with("20"),
            "SUBMITTED is not under its header in {row:?}:\n{list}"
        );
    }
    let sweep = write(
        "w-sw.json",
        json!({"version": 1, "command": ["/bin/sh", "-c", "exit {code}"], "sweep": {"code": [0, 0]}}),
    );
    let out = d.ptrain(ALICE, &["submit", &sweep, "--wait"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = d.ptrain(BOB, &["wait", "w-sw", "w-ok"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // A sweep id is shown as its members, as `wait` and `stop` take it.
    let shown = d.ptrain(ALICE, &["status", "w-sw"]);
    assert!(
        shown.status.success() && text(&shown).contains("sweep:     w-sw (2 jobs: 2 succeeded)"),
        "{}",
        text(&shown)
    );
    let members: serde_json::Value =
        serde_json::from_slice(&d.ptrain(ALICE, &["status", "w-sw", "--json"]).stdout).unwrap();
    assert_eq!(members.as_array().map(Vec::len), Some(2), "{members}");
    let none = d.ptrain(ALICE, &["status", "w-none"]);
    assert_eq!(none.status.code(), Some(1), "{}", text(&none));
}

#[test]
fn after_fail_runs_only_when_every_parent_failed_and_not_needed_is_success() {
    let d = TestDaemon::start("notneeded");
    let work = d.workdir(ALICE);
    // Gated jobs run until the test creates ID.go, then exit with `code`.
    let drop = |id: &str, cmd: String, extra: serde_json::Value| {
        let mut j = json!({"version": 1, "command": ["/bin/sh", "-c", cmd], "workdir": work});
        for (k, v) in extra.as_object().unwrap() {
            j[k] = v.clone();
        }
        d.drop_job(ALICE, &format!("{id}.json"), &j.to_string());
    };
    let gated =
        |id: &str, code: u8| format!("while [ ! -e {id}.go ]; do sleep 0.05; done; exit {code}");
    let ran = |id: &str| format!("touch {id}.ran");
    let go = |id: &str| std::fs::write(work.join(format!("{id}.go")), "").unwrap();

    // A pipeline that goes well: its alert is not needed, and neither is
    // the job that would have paged about the alert.
    drop("a", gated("a", 0), json!({}));
    drop("alert", ran("alert"), json!({"after_fail": ["a"]}));
    drop("page", ran("page"), json!({"after_ok": ["alert"]}));
    drop("tidy", ran("tidy"), json!({"after_any": ["alert"]}));
    // afternotok:x:y where only x fails: waits for y, then not needed.
    drop("x", gated("x", 3), json!({}));
    drop("y", gated("y", 0), json!({}));
    drop("xy", ran("xy"), json!({"after_fail": ["x", "y"]}));
    // afternotok:p:q where both fail: runs.
    drop("p", gated("p", 1), json!({}));
    drop("q", gated("q", 2), json!({}));
    drop("pq", ran("pq"), json!({"after_fail": ["p", "q"]}));
    for id in ["a", "x", "y", "p", "q"] {
        d.wait_running(id);
    }

    // `ptrain wait` of the good pipeline, started while it runs.
    let waiter = std::thread::scope(|s| {
        let waiter = s.spawn(|| d.ptrain(ALICE, &["wait", "a", "alert", "page", "tidy"]));
        go("a");
        waiter.join().unwrap()
    });
    assert_eq!(waiter.status.code(), Some(0), "{}", text(&waiter));
    // "alert: not-needed" as it changes, or its detail if it already ended.
    assert!(text(&waiter).contains("alert: not"), "{}", text(&waiter));
    let alert = d.wait_ended("alert");
    assert_eq!(alert["status"], "not-needed", "{alert}");
    assert_eq!(alert["outcome"]["kind"], "not-needed", "{alert}");
    assert_eq!(alert["outcome"]["parent"], "a", "{alert}");
    let detail = alert["detail"].as_str().unwrap();
    assert!(detail.contains("a succeeded"), "{detail}");
    assert!(alert["started_at"].is_null() && alert["exit_code"].is_null());
    let page = d.wait_ended("page");
    assert_eq!(page["status"], "not-needed", "{page}");
    assert_eq!(page["outcome"]["parent"], "alert", "{page}");
    assert_eq!(d.wait_ended("tidy")["status"], "succeeded");
    // Shown as what it is, not as a failure.
    let shown = text(&d.ptrain(ALICE, &["status", "alert"]));
    assert!(shown.contains("not-needed"), "{shown}");

    go("x");
    assert_eq!(d.wait_ended("x")["status"], "failed");
    let xy = d.status("xy").unwrap();
    assert_eq!(xy["status"], "queued", "{xy}");
    assert_eq!(xy["waiting_for"], json!(["y"]), "{xy}");
    go("y");
    let xy = d.wait_ended("xy");
    assert_eq!(xy["status"], "not-needed", "{xy}");
    assert_eq!(xy["outcome"]["parent"], "y", "{xy}");
    // The worst end wins: x failed.
    let out = d.ptrain(ALICE, &["wait", "x", "y", "xy"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));

    go("p");
    assert_eq!(d.wait_ended("p")["status"], "failed");
    assert_eq!(d.status("pq").unwrap()["waiting_for"], json!(["q"]));
    go("q");
    assert_eq!(d.wait_ended("pq")["status"], "succeeded");

    for id in ["alert", "page", "xy"] {
        assert!(!work.join(format!("{id}.ran")).exists(), "{id} ran");
    }
    for id in ["tidy", "pq"] {
        assert!(work.join(format!("{id}.ran")).exists(), "{id} did not run");
    }
    let out = d.ptrain(ALICE, &["wait", "p", "q", "pq"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    d.assert_alive();
}
