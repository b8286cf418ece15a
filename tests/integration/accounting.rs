//! Issue 23: accounting. Each run's usage is taken at its end, whether or
//! not ptraind runs, kept in its end record and in the accounting database,
//! and `ptrain history` / `ptrain report` answer from it.

use std::time::Duration;

use serde_json::Value;

use crate::daemon::{text, Opts, TestDaemon, ALICE, BOB, WAIT};
use crate::harness::wait_for;

/// A job that burns CPU for 2 s of its own CPU time, then holds 200 MiB it
/// wrote, and reports what it did (its CPU time and peak RSS, from the
/// kernel's own counters for the process) as its result.
const BURN: &str = r#"
import resource, time, json, os
while time.process_time() < 2.0:
    pass
block = b"x" * (200 << 20)
r = resource.getrusage(resource.RUSAGE_SELF)
with open(os.environ["PTRAIN_RESULT_FILE"], "w") as f:
    json.dump({"cpu": r.ru_utime + r.ru_stime, "maxrss": r.ru_maxrss * 1024}, f)
"#;

fn within(what: &str, got: f64, want: f64, share: f64) {
    assert!(
        (got - want).abs() <= want * share,
        "{what}: got {got}, want {want} within {}%",
        share * 100.0
    );
}

fn job(d: &TestDaemon, user: &str, extra: Value) -> Value {
    let mut job = serde_json::json!({"version": 1, "workdir": d.workdir(user)});
    for (k, v) in extra.as_object().unwrap() {
        job[k] = v.clone();
    }
    job
}

#[test]
fn a_jobs_cpu_time_and_peak_memory_are_recorded_at_its_end() {
    let d = TestDaemon::start("acct-usage");
    let spec = job(
        &d,
        ALICE,
        serde_json::json!({"command": ["/usr/bin/python3", "-c", BURN]}),
    );
    d.drop_job(ALICE, "burn.json", &spec.to_string());
    let status = d.wait_ended("burn");
    assert_eq!(status["status"], "succeeded", "{status}");
    let did = &status["result"];
    let usage = &status["usage"];
    assert!(
        usage["cpu_secs"].is_f64(),
        "{status}\n{}",
        d.harness.journal(&["-u", "ptrain-job@burn.service"])
    );
    within(
        "CPU seconds",
        usage["cpu_secs"].as_f64().unwrap(),
        did["cpu"].as_f64().unwrap(),
        0.10,
    );
    // memory.peak needs the cgroup v2 memory controller: a hybrid host
    // (v1 memory, as some CI hosts are) gives the harness none, and then the
    // peak must be absent, never a wrong number.
    let controllers = d
        .harness
        .command("cat")
        .arg("/sys/fs/cgroup/cgroup.controllers")
        .output()
        .unwrap();
    let controllers = text(&controllers);
    let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
    if has("memory") {
        within(
            "peak memory",
            usage["mem_peak_bytes"].as_f64().unwrap(),
            did["maxrss"].as_f64().unwrap(),
            0.10,
        );
    } else {
        eprintln!("no cgroup v2 memory controller in the harness: peak memory not checked");
        assert!(
            usage.get("mem_peak_bytes").is_none_or(Value::is_null),
            "{usage}"
        );
    }
    // Likewise the bytes read and written need the io controller.
    assert_eq!(usage["io_write_bytes"].is_u64(), has("io"), "{usage}");
    assert_eq!(usage["gpus"], 0, "{usage}");
    // For people too.
    let out = d.ptrain(ALICE, &["status", "burn"]);
    let shown = text(&out);
    assert!(
        shown.contains("usage:") && shown.contains("s CPU"),
        "{shown}"
    );
    // The owner's, like the exit: Bob does not see it.
    let out = d.ptrain(BOB, &["status", "burn", "--json"]);
    let bobs: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(bobs.get("usage").is_none(), "{bobs}");
}

/// "COMM USER" of each process in a unit's cgroup, one a line.
fn unit_processes(d: &TestDaemon, unit: &str) -> String {
    let cgroup = d.unit_property(unit, "ControlGroup");
    let listed = d
        .harness
        .command("sh")
        .args([
            "-c",
            &format!("for p in $(cat /sys/fs/cgroup{cgroup}/cgroup.procs); do echo $(cat /proc/$p/comm) $(stat -c %U /proc/$p); done"),
        ])
        .output()
        .unwrap();
    text(&listed)
}

/// Reaps every child it has until there are none, as an init-like loop or
/// a shell's `wait` does: it would never end if the usage watcher that
/// `exec-job` leaves behind were one of its children.
const REAP_ALL: &str = r#"
import os
if os.fork() == 0:
    os._exit(0)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
"#;

#[test]
fn the_usage_watcher_holds_up_no_end_and_changes_no_outcome() {
    let d = TestDaemon::start("acct-watch");
    for (id, command) in [
        (
            "reap",
            serde_json::json!(["/usr/bin/python3", "-c", REAP_ALL]),
        ),
        ("exit3", serde_json::json!(["sh", "-c", "exit 3"])),
        ("long", serde_json::json!(["sleep", "300"])),
    ] {
        let spec = job(&d, ALICE, serde_json::json!({"command": command}));
        d.drop_job(ALICE, &format!("{id}.json"), &spec.to_string());
    }
    d.wait_running("long");
    // The unit runs its command alone (no second, sandboxed command reads
    // the figures), and the watcher beside it, as the job's user.
    let unit = "ptrain-job@long.service";
    assert_eq!(d.unit_property(unit, "LoadState"), "loaded");
    assert_eq!(d.unit_property(unit, "ExecStopPost"), "");
    // "Running" may come before exec-job has forked it and exec'd.
    wait_for("the watcher beside sleep", WAIT, || {
        let listed = unit_processes(&d, unit);
        (listed.lines().any(|l| l == format!("ptrain-usage {ALICE}"))
            && listed.lines().any(|l| l == format!("sleep {ALICE}")))
        .then_some(())
    });
    let out = d.ptrain(ALICE, &["stop", "long"]);
    assert!(out.status.success(), "{}", text(&out));
    for (id, status, exit_code) in [
        ("reap", "succeeded", Some(0)),
        ("exit3", "failed", Some(3)),
        ("long", "stopped", None),
    ] {
        let got = d.wait_ended(id);
        assert_eq!(got["status"], status, "{id}: {got}");
        if let Some(code) = exit_code {
            assert_eq!(got["exit_code"], code, "{id}: {got}");
        }
        // Read by the watcher once the command ended, SIGTERM and all.
        assert!(
            got["usage"]["cpu_secs"].is_f64(),
            "{id}: {got}\n{}",
            d.harness
                .journal(&["-u", &format!("ptrain-job@{id}.service")])
        );
    }
}

#[test]
fn a_two_gpu_job_of_three_seconds_used_six_gpu_seconds() {
    let d = TestDaemon::start_with(
        "acct-gpus",
        Opts {
            gpus: 2,
            ..Opts::default()
        },
    );
    let spec = job(
        &d,
        ALICE,
        serde_json::json!({"command": ["sleep", "3"], "gpus": 2}),
    );
    d.drop_job(ALICE, "pair.json", &spec.to_string());
    let status = d.wait_ended("pair");
    assert_eq!(status["status"], "succeeded", "{status}");
    let usage = &status["usage"];
    assert_eq!(usage["gpus"], 2, "{usage}");
    within(
        "GPU-seconds",
        usage["gpu_seconds"].as_f64().unwrap(),
        6.0,
        0.05,
    );
}

#[test]
fn with_accounting_off_no_run_is_measured_or_kept_and_history_says_so() {
    let d = TestDaemon::start_with(
        "acct-off",
        Opts {
            extra_config: "[accounting]\nenabled = false\n".into(),
            ..Opts::default()
        },
    );
    let spec = job(&d, ALICE, serde_json::json!({"command": ["true"]}));
    d.drop_job(ALICE, "quiet.json", &spec.to_string());
    let status = d.wait_ended("quiet");
    assert_eq!(status["status"], "succeeded", "{status}");
    // Nothing read the cgroup: the record keeps only what its times and
    // GPUs say.
    let usage = &status["usage"];
    assert!(usage["cpu_secs"].is_null(), "{usage}");
    // No watcher beside a running command, and no task of its counted.
    let spec = job(&d, ALICE, serde_json::json!({"command": ["sleep", "300"]}));
    d.drop_job(ALICE, "idle.json", &spec.to_string());
    d.wait_running("idle");
    let listed = wait_for("the job's command", WAIT, || {
        let listed = unit_processes(&d, "ptrain-job@idle.service");
        listed.contains("sleep").then_some(listed)
    });
    assert!(!listed.contains("ptrain-usage"), "{listed}");
    let out = d.ptrain(ALICE, &["stop", "idle"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(d.wait_ended("idle")["status"], "stopped");
    for (user, args) in [
        (ALICE, vec!["history"]),
        ("root", vec!["report", "--since", "7d"]),
    ] {
        let out = d.ptrain(user, &args);
        assert!(!out.status.success(), "{args:?}: {}", text(&out));
        let said = text(&out);
        assert!(
            said.contains("accounting is off") && said.contains("enabled = true"),
            "{args:?}: {said}"
        );
    }
    assert!(!d.state.join("accounting.sqlite").exists());
}

fn history(d: &TestDaemon, user: &str, args: &[&str]) -> Vec<Value> {
    let mut full = vec!["history", "--json"];
    full.extend_from_slice(args);
    let out = d.ptrain(user, &full);
    assert!(out.status.success(), "ptrain history: {}", text(&out));
    serde_json::from_slice(&out.stdout).expect("history --json is JSON")
}

fn ids(rows: &[Value]) -> Vec<&str> {
    rows.iter().map(|r| r["id"].as_str().unwrap()).collect()
}

/// Waits until `ptrain history` (as root) lists every id in `want`: the
/// writer thread adds a row just after the end is recorded.
fn wait_history(d: &TestDaemon, want: &[&str]) -> Vec<Value> {
    wait_for(&format!("{want:?} in ptrain history"), WAIT, || {
        let rows = history(d, "root", &["--limit", "0"]);
        want.iter()
            .all(|id| ids(&rows).contains(id))
            .then_some(rows)
    })
}

/// A run is in `ptrain history` as soon as its end shows: the writer
/// commits rows in groups (up to a second apart), and a query is answered
/// only once the rows of every run that ended before it are written.
#[test]
fn a_run_is_in_history_as_soon_as_its_end_shows() {
    let d = TestDaemon::start("acct-at-once");
    for n in 0..3 {
        let name = format!("quick{n}");
        let spec = job(&d, ALICE, serde_json::json!({"command": ["/bin/true"]}));
        d.drop_job(ALICE, &format!("{name}.json"), &spec.to_string());
        let status = d.wait_ended(&name);
        assert_eq!(status["status"], "succeeded", "{status}");
        let rows = history(&d, ALICE, &["--limit", "0"]);
        assert!(
            ids(&rows).contains(&name.as_str()),
            "{name} ended but is not in its owner's history: {rows:?}"
        );
    }
}

#[test]
fn history_shows_each_user_their_own_runs_and_root_all_and_report_sums_them() {
    let d = TestDaemon::start_with(
        "acct-history",
        Opts {
            gpus: 3,
            ..Opts::default()
        },
    );
    let runs = [
        (
            ALICE,
            "a-ok",
            serde_json::json!({"command": ["sleep", "1"], "gpus": 2}),
        ),
        (
            ALICE,
            "a-bad",
            serde_json::json!({"command": ["sh", "-c", "exit 3"], "name": "x' OR 1=1 --"}),
        ),
        (
            BOB,
            "b-ok",
            serde_json::json!({"command": ["sleep", "1"], "gpus": 1}),
        ),
    ];
    for (user, id, extra) in &runs {
        d.drop_job(
            user,
            &format!("{id}.json"),
            &job(&d, user, extra.clone()).to_string(),
        );
    }
    for (_, id, _) in &runs {
        d.wait_ended(id);
    }
    let all = wait_history(&d, &["a-ok", "a-bad", "b-ok"]);
    assert_eq!(all.len(), 3, "{all:?}");
    // Each user sees their own runs only, whatever they ask for.
    let alices = history(&d, ALICE, &[]);
    let mut alices = ids(&alices);
    alices.sort();
    assert_eq!(alices, ["a-bad", "a-ok"]);
    assert_eq!(ids(&history(&d, BOB, &[])), ["b-ok"]);
    assert!(history(&d, BOB, &["--user", ALICE]).is_empty());
    // Root filters by user, status, GPUs and name (a job's name is data).
    assert_eq!(ids(&history(&d, "root", &["--user", BOB])), ["b-ok"]);
    let bobs_gid = crate::harness::ensure_user(BOB).1.to_string();
    assert_eq!(ids(&history(&d, "root", &["--group", &bobs_gid])), ["b-ok"]);
    assert_eq!(
        ids(&history(&d, "root", &["--status", "failed"])),
        ["a-bad"]
    );
    assert_eq!(ids(&history(&d, "root", &["--gpus", "2"])), ["a-ok"]);
    assert_eq!(
        ids(&history(&d, "root", &["--name", "x' OR 1=1 --"])),
        ["a-bad"]
    );
    assert_eq!(ids(&history(&d, "root", &["--name", "b-*"])), ["b-ok"]);
    assert!(history(&d, "root", &["--until", "1h"]).is_empty());
    assert_eq!(history(&d, "root", &["--since", "1h"]).len(), 3);
    let bad = all.iter().find(|r| r["id"] == "a-bad").unwrap();
    assert_eq!(
        (bad["status"].as_str(), bad["exit_code"].as_i64()),
        (Some("failed"), Some(3))
    );
    // The columns asked for, as CSV.
    let out = d.ptrain(
        BOB,
        &["history", "--csv", "--format", "id,user,gpus,status"],
    );
    assert_eq!(
        text(&out),
        format!("id,user,gpus,status\nb-ok,{BOB},1,succeeded\n")
    );
    let out = d.ptrain(BOB, &["history", "--format", "id,colour"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("unknown column \"colour\""),
        "{}",
        text(&out)
    );

    // The report sums the same rows: per user, GPU-hours are the sum of
    // each run's wall time times its GPUs.
    let out = d.ptrain("root", &["report", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let report: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report.len(), 2, "{report:?}");
    for (user, jobs, succeeded) in [(ALICE, 2, 1), (BOB, 1, 1)] {
        let line = report.iter().find(|l| l["key"] == user).unwrap();
        assert_eq!(
            (line["jobs"].as_u64(), line["succeeded"].as_u64()),
            (Some(jobs), Some(succeeded)),
            "{line}"
        );
        let want: f64 = all
            .iter()
            .filter(|r| r["user"] == user)
            .map(|r| r["wall_us"].as_f64().unwrap() / 1e6 * r["gpus"].as_f64().unwrap() / 3600.0)
            .sum();
        let got = line["gpu_hours"].as_f64().unwrap();
        assert!(
            (got - want).abs() < 1e-9 && got > 0.0,
            "{user}: {got} != {want}"
        );
        let cpu: f64 = all
            .iter()
            .filter(|r| r["user"] == user)
            .map(|r| r["cpu_nsec"].as_f64().unwrap_or(0.0) / 3.6e12)
            .sum();
        assert!(
            (line["cpu_hours"].as_f64().unwrap() - cpu).abs() < 1e-9,
            "{line}"
        );
    }
    // By GPU: a run counts for each GPU it held, its wall time as that
    // GPU's hours; the GPU-hours add up to the users'.
    let out = d.ptrain("root", &["report", "--by", "gpu", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let by_gpu: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let sum =
        |rows: &[Value], key: &str| rows.iter().map(|l| l[key].as_f64().unwrap()).sum::<f64>();
    assert_eq!(sum(&by_gpu, "jobs"), 3.0, "{by_gpu:?}");
    assert!(
        (sum(&by_gpu, "gpu_hours") - sum(&report, "gpu_hours")).abs() < 1e-9,
        "{by_gpu:?}"
    );
    // The top list: the heaviest GPU user (Alice's 2-GPU run).
    let out = d.ptrain("root", &["report", "--top", "1", "--json"]);
    let top: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(top.len(), 1, "{top:?}");
    assert_eq!(top[0]["key"], ALICE, "{top:?}");
    // A user's report is their own line.
    let out = d.ptrain(BOB, &["report", "--csv"]);
    let csv = text(&out);
    let lines: Vec<_> = csv.lines().collect();
    assert_eq!(lines.len(), 2, "{csv}");
    assert!(
        lines[0].starts_with("user,jobs,succeeded,success,gpu_hours"),
        "{csv}"
    );
    assert!(lines[1].starts_with(&format!("{BOB},1,1,100.0%,")), "{csv}");
    // The database is root's alone.
    let db = d.state.join("accounting.sqlite");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&db).unwrap().permissions());
    assert_eq!(mode & 0o077, 0, "{mode:o}");
}

#[test]
fn a_run_that_ended_while_ptraind_was_stopped_is_in_history_after_it_starts() {
    let d = TestDaemon::start("acct-down");
    let work = d.workdir(ALICE);
    let spec = job(
        &d,
        ALICE,
        serde_json::json!({"command": ["sh", "-c", "while [ ! -e go ]; do sleep 0.05; done"]}),
    );
    d.drop_job(ALICE, "late.json", &spec.to_string());
    d.wait_running("late");
    let (ok, out) = d.harness.systemctl(&["stop", "ptraind.service"]);
    assert!(ok, "{out}");
    std::fs::write(work.join("go"), "").unwrap();
    let unit = "ptrain-job@late.service";
    wait_for(&format!("{unit} to end and be collected"), WAIT, || {
        (d.unit_property(unit, "LoadState") == "not-found").then_some(())
    });
    d.start_service();
    let rows = wait_history(&d, &["late"]);
    let late = &rows[0];
    assert_eq!(late["status"], "succeeded", "{late}");
    assert!(late["cpu_nsec"].as_u64().is_some_and(|n| n > 0), "{late}");
    assert!(late["wall_us"].as_u64().is_some_and(|n| n > 0), "{late}");
    // One row, however many times the writer is fed it: a restart
    // back-fills again.
    let (ok, out) = d.harness.systemctl(&["restart", "ptraind.service"]);
    assert!(ok, "{out}");
    assert_eq!(wait_history(&d, &["late"]).len(), 1);
}

fn fair_share_of(d: &TestDaemon, user: &str) -> Value {
    let out = d.ptrain(user, &["report", "--fair-share", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn under_fair_share_the_user_who_used_less_starts_first_and_usage_survives_a_restart() {
    let d = TestDaemon::start_with(
        "fair-share",
        Opts {
            gpus: 1,
            extra_config: "[policy]\nfair_share = { half_life = \"7d\" }\n".into(),
            ..Opts::default()
        },
    );
    let one_gpu = |user: &str, command: &str| {
        job(
            &d,
            user,
            serde_json::json!({"gpus": 1, "command": ["/bin/sh", "-c", command]}),
        )
        .to_string()
    };
    // Alice has used the GPU lately; Bob has not.
    d.run_to_end(ALICE, "used", &one_gpu(ALICE, "sleep 2"));
    // Read back from the accounting database after a restart, not kept
    // in memory only.
    let (ok, out) = d.harness.systemctl(&["restart", "ptraind.service"]);
    assert!(ok, "{out}");
    let view = wait_for("the usage to be read back after the restart", WAIT, || {
        let v = fair_share_of(&d, "root");
        (v["read_back"] == true && !v["users"].as_array()?.is_empty()).then_some(v)
    });
    let alice = &view["users"][0];
    within(
        "Alice's GPU-seconds",
        alice["usage"].as_f64().unwrap(),
        2.0,
        0.25,
    );
    assert!(alice["factor"].as_f64().unwrap() < 1.0, "{view}");

    // The GPU busy with Alice's job; then Alice queues a job, and Bob
    // one after her.
    let work = d.workdir(ALICE);
    d.drop_job(
        ALICE,
        "blocker.json",
        &one_gpu(ALICE, "while [ ! -e go ]; do sleep 0.05; done"),
    );
    d.wait_running("blocker");
    d.drop_job(ALICE, "alice2.json", &one_gpu(ALICE, "true"));
    d.wait_claimed("alice2");
    d.drop_job(BOB, "bob1.json", &one_gpu(BOB, "sleep 1"));
    d.wait_claimed("bob1");
    let standing = fair_share_of(&d, "root");
    let factor = |uid: u64| {
        standing["users"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["uid"] == uid)
            .map(|s| s["factor"].as_f64().unwrap())
            .unwrap()
    };
    let alice_uid = d.status("alice2").unwrap()["uid"].as_u64().unwrap();
    let bob_uid = d.status("bob1").unwrap()["uid"].as_u64().unwrap();
    assert!(factor(bob_uid) > factor(alice_uid), "{standing}");
    // A user sees their own standing only.
    let own = fair_share_of(&d, BOB);
    assert_eq!(own["users"].as_array().unwrap().len(), 1, "{own}");
    assert_eq!(own["users"][0]["uid"], bob_uid);
    let table = d.ptrain(BOB, &["report", "--fair-share"]);
    assert!(text(&table).contains("factor"), "{}", text(&table));

    std::fs::write(work.join("go"), "").unwrap();
    // Bob arrived later but used less: his job takes the GPU first.
    let bob = d.wait_ended("bob1");
    let alice = d.wait_ended("alice2");
    assert_eq!(bob["status"], "succeeded", "{bob}");
    assert_eq!(alice["status"], "succeeded", "{alice}");
    assert!(
        alice["started_at"].as_u64().unwrap() >= bob["ended_at"].as_u64().unwrap(),
        "Alice's job ran before Bob's: {alice} {bob}"
    );
}

#[test]
fn a_user_over_the_gpu_hour_quota_waits_with_the_reason_until_the_window_passes_a_restart_included()
{
    // 0.001 GPU-hours (3.6 GPU-seconds) per 30 s, for Alice alone.
    let d = TestDaemon::start_with(
        "quota",
        Opts {
            gpus: 2,
            extra_config: format!(
                "[limits.users.{ALICE}]\ngpu_hours = {{ per = \"30s\", max = 0.001 }}\n"
            ),
            ..Opts::default()
        },
    );
    let spec = |user: &str, gpus: u32, command: &str| {
        job(
            &d,
            user,
            serde_json::json!({"gpus": gpus, "command": ["/bin/sh", "-c", command]}),
        )
        .to_string()
    };
    let used = d.run_to_end(ALICE, "used", &spec(ALICE, 1, "sleep 4"));
    assert_eq!(used["status"], "succeeded", "{used}");
    // The window is read back from the accounting database, not kept in
    // memory only.
    let (ok, out) = d.harness.systemctl(&["restart", "ptraind.service"]);
    assert!(ok, "{out}");
    wait_for("the quotas' window to be read back", WAIT, || {
        let reads = d
            .daemon_log()
            .matches("quotas: the GPU-hours before this start read back")
            .count();
        (reads >= 2).then_some(())
    });
    d.drop_job(ALICE, "again.json", &spec(ALICE, 1, "true"));
    d.drop_job(ALICE, "cpu.json", &spec(ALICE, 0, "true"));
    d.drop_job(BOB, "bobs.json", &spec(BOB, 1, "true"));
    // Bob has no quota and Alice's job without GPUs needs none.
    assert_eq!(d.wait_ended("bobs")["status"], "succeeded");
    assert_eq!(d.wait_ended("cpu")["status"], "succeeded");
    let waiting = d.status("again").unwrap();
    assert_eq!(waiting["status"], "queued", "{waiting}");
    let detail = waiting["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("limits.users.{ALICE}.gpu_hours"))
            && detail.contains("GPU-hours per 30s")
            && detail.contains("under it again at"),
        "{detail}"
    );
    // It starts by itself once the run has aged out of the window (30 s
    // plus a bucket of 0.25 s after its end), with no event to wake it.
    let again = wait_for(
        "Alice's job to start once under the quota",
        Duration::from_secs(60),
        || d.status("again").filter(|s| s["status"] == "succeeded"),
    );
    let aged_out = used["ended_at"].as_u64().unwrap() + 30_000_000;
    assert!(
        again["started_at"].as_u64().unwrap() >= aged_out,
        "{again} started before {aged_out}"
    );
}
