//! Issue 7 (first part): nothing lost, nothing run twice across daemon
//! stops, kill -9 at named points, and a full state disk.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::daemon::{text, Opts, TestDaemon, ALICE, BOB, WAIT};
use crate::harness::wait_for;

/// A job that appends its id to `runs.log` in its workdir, so a test can
/// count how often each job really ran.
fn counted_job(d: &TestDaemon, extra: &str) -> String {
    let work = d.workdir(ALICE);
    serde_json::json!({
        "version": 1,
        "command": ["/bin/sh", "-c", format!("echo $PTRAIN_JOB_ID >> runs.log{extra}")],
        "workdir": work,
    })
    .to_string()
}

fn run_counts(d: &TestDaemon) -> BTreeMap<String, usize> {
    let log = std::fs::read_to_string(d.workdir(ALICE).join("runs.log")).unwrap_or_default();
    let mut counts = BTreeMap::new();
    for line in log.lines() {
        *counts.entry(line.to_string()).or_default() += 1;
    }
    counts
}

fn main_pid(d: &TestDaemon) -> String {
    d.unit_property("ptraind.service", "MainPID")
}

#[test]
fn jobs_that_end_while_ptraind_is_down_get_their_true_result() {
    let d = TestDaemon::start("down");
    let work = d.workdir(ALICE);
    // Each job waits for a "go" file, so all of them end while ptraind is
    // stopped, whatever the machine's speed.
    let wait_go = "while [ ! -e go ]; do sleep 0.05; done";
    let jobs = [
        ("ok", format!("{wait_go}; exit 0"), None),
        ("one", format!("{wait_go}; exit 1"), None),
        ("killed", format!("{wait_go}; kill -KILL $$"), None),
        ("late", "sleep 60".to_string(), Some("2s")),
    ];
    for (id, script, timeout) in &jobs {
        let mut job = serde_json::json!({"version": 1, "command": ["/bin/sh", "-c", script], "workdir": work});
        if let Some(t) = timeout {
            job["timeout"] = (*t).into();
        }
        d.drop_job(ALICE, &format!("{id}.json"), &job.to_string());
    }
    for (id, _, _) in &jobs {
        d.wait_running(id);
    }
    let (ok, out) = d.harness.systemctl(&["stop", "ptraind.service"]);
    assert!(ok, "{out}");
    std::fs::write(work.join("go"), "").unwrap();
    // All units end and systemd collects them (ptraind holds no reference).
    for (id, _, _) in &jobs {
        let unit = format!("ptrain-job@{id}.service");
        wait_for(&format!("{unit} to end and be collected"), WAIT, || {
            (d.unit_property(&unit, "LoadState") == "not-found").then_some(())
        });
    }
    d.start_service();
    let ok = d.wait_ended("ok");
    assert_eq!(ok["status"], "succeeded", "{ok}");
    let one = d.wait_ended("one");
    assert_eq!(
        (one["status"].as_str(), one["exit_code"].as_i64()),
        (Some("failed"), Some(1)),
        "{one}"
    );
    let killed = d.wait_ended("killed");
    assert_eq!(
        (killed["status"].as_str(), killed["signal"].as_i64()),
        (Some("killed"), Some(9)),
        "{killed}"
    );
    let late = d.wait_ended("late");
    assert_eq!(late["status"], "timeout", "{late}");
    // The recorder's files are consumed once their results are recorded.
    let exits: Vec<_> = std::fs::read_dir(d.state.join("exits")).unwrap().collect();
    assert!(exits.is_empty(), "{exits:?}");
}

#[test]
fn kill_9_at_each_named_point_runs_every_job_exactly_once() {
    let d = TestDaemon::start("crash");
    let points = [
        "after-claim",
        "before-start-unit",
        "after-start-unit",
        "before-record-exit",
        "after-record-exit",
    ];
    let mut all_ids = Vec::new();
    for (round, point) in points.iter().enumerate() {
        let ids: Vec<String> = (0..8).map(|i| format!("r{round}-{i}")).collect();
        d.crash_at(&format!("{point}:3"), || {
            for id in &ids {
                d.drop_job(ALICE, &format!("{id}.json"), &counted_job(&d, ""));
            }
        });
        for id in &ids {
            let s = d.wait_ended(id);
            assert_eq!(s["status"], "succeeded", "after crash at {point}: {s}");
        }
        all_ids.extend(ids);
    }
    let counts = run_counts(&d);
    for id in &all_ids {
        assert_eq!(
            counts.get(id),
            Some(&1),
            "job {id} ran {:?} times",
            counts.get(id)
        );
    }
    assert_eq!(counts.len(), all_ids.len());
    assert!(
        std::fs::read_dir(&d.spool).unwrap().next().is_none(),
        "files left in the spool"
    );
}

#[test]
fn a_full_state_disk_keeps_files_in_the_spool_and_recovers_by_itself() {
    let d = TestDaemon::start_with(
        "enospc",
        Opts {
            state_tmpfs_kib: Some(1024),
            ..Opts::default()
        },
    );
    let work = d.workdir(ALICE);
    let wait_go = "while [ ! -e go ]; do sleep 0.05; done";
    let running =
        serde_json::json!({"version": 1, "command": ["/bin/sh", "-c", wait_go], "workdir": work});
    d.drop_job(ALICE, "before.json", &running.to_string());
    d.wait_running("before");
    // Fill the state file system.
    let filler = d.state.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    // Big chunks, then single pages, until not even a page is left.
    for size in [64 * 1024, 4096, 512] {
        let chunk = vec![0u8; size];
        loop {
            use std::io::Write;
            if f.write_all(&chunk).and_then(|()| f.sync_all()).is_err() {
                break;
            }
        }
    }
    drop(f);
    // The first may still be claimed into the blocks of the state
    // directory's spare (fsutil::SpareDir overwrites it in place); after
    // that nothing fits, and a file must wait in the spool.
    let during = ["during1", "during2"];
    for id in during {
        d.drop_job(ALICE, &format!("{id}.json"), &counted_job(&d, ""));
    }
    // The running job ends while nothing can be written.
    std::fs::write(work.join("go"), "").unwrap();
    wait_for("ptraind to report the full disk", WAIT, || {
        d.daemon_log().contains("stays in the spool").then_some(())
    });
    d.assert_alive();
    let waiting: Vec<&str> = during
        .into_iter()
        .filter(|id| d.spool.join(format!("{id}.json")).exists())
        .collect();
    assert!(!waiting.is_empty(), "a file must wait in the spool");
    for id in &waiting {
        assert!(
            d.status(id).is_none(),
            "{id} is both claimed and in the spool"
        );
    }
    // Its end is recorded now if the new record fits in the spare's
    // blocks, or once space comes back; never lost either way.
    let before = d.status("before").unwrap();
    assert!(
        ["running", "succeeded"].contains(&before["status"].as_str().unwrap()),
        "{before}"
    );
    // The status line is sent at most once a second.
    wait_for("the status line to tell", WAIT, || {
        d.unit_property("ptraind.service", "StatusText")
            .contains("not writable")
            .then_some(())
    });
    // Space comes back: everything proceeds without a restart.
    std::fs::remove_file(&filler).unwrap();
    for id in during {
        let ended = d.wait_ended(id);
        assert_eq!(ended["status"], "succeeded", "{ended}");
        assert_eq!(run_counts(&d).get(id), Some(&1), "{id} ran once");
        assert!(!d.spool.join(format!("{id}.json")).exists());
    }
    let before = d.wait_ended("before");
    assert_eq!(before["status"], "succeeded", "{before}");
    let log = text(&d.ptrain("root", &["list"]));
    assert!(log.contains("during1") && log.contains("during2"), "{log}");
}

#[test]
fn retention_compacts_the_oldest_finished_jobs() {
    use crate::notifications::{HttpServer, Reply};
    let hook = HttpServer::start(vec![], Reply::Status(200, "{}"));
    let d = TestDaemon::start_with(
        "retention",
        Opts {
            extra_config: format!(
                "{}[retention]\nmax_ended_jobs = 3\n\
                 [notify]\ndefault_channels = [\"hook\"]\n\
                 [channels.hook]\nkind = \"webhook\"\nurl = \"{}\"\n",
                crate::logs::LOW_FLOOR,
                hook.url("/h")
            ),
            ..Opts::default()
        },
    );
    for i in 0..6 {
        let id = format!("old{i}");
        let job = counted_job(&d, "; echo said-$PTRAIN_JOB_ID");
        d.drop_job(ALICE, &format!("{id}.json"), &job);
        assert_eq!(d.wait_ended(&id)["status"], "succeeded");
    }
    let outbox = |id: &str| {
        d.state
            .join("outbox")
            .join(format!("{id}.succeeded.hook.json"))
    };
    wait_for("every end to be notified", WAIT, || {
        (hook.requests().len() == 6).then_some(())
    });
    // A job whose notification is still on its way stays until a later
    // pass (the next event); then it leaves with its outbox entry.
    d.drop_job(ALICE, "last.json", &counted_job(&d, ""));
    assert_eq!(d.wait_ended("last")["status"], "succeeded");
    wait_for("the history to be compacted", WAIT, || {
        let records = std::fs::read_dir(d.state.join("jobs"))
            .unwrap()
            .filter(|e| {
                !e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.')
            })
            .count();
        (records == 3 && !outbox("old3").exists()).then_some(())
    });
    assert!(!outbox("old0").exists() && outbox("old4").exists());
    let history = std::fs::read_to_string(d.state.join("history.jsonl")).unwrap();
    let compacted: Vec<serde_json::Value> = history
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<&str> = compacted
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["old0", "old1", "old2", "old3"]);
    assert!(compacted.iter().all(|j| j["status"] == "succeeded"));
    assert!(d.status("old0").is_none());
    assert_eq!(d.status("old5").unwrap()["status"], "succeeded");
    // Compacted is not lost to its owner: `status` says where the job
    // went, `logs` still serves its archive; to others it is no job.
    let status = d.ptrain(ALICE, &["status", "old0"]);
    assert_eq!(status.status.code(), Some(1), "{}", text(&status));
    assert!(
        text(&status).contains("[retention] compacted it")
            && text(&status).contains("ptrain logs old0"),
        "{}",
        text(&status)
    );
    let logs = d.ptrain(ALICE, &["logs", "old0"]);
    assert!(logs.status.success(), "{}", text(&logs));
    assert_eq!(text(&logs).trim(), "said-old0");
    for args in [["status", "old0"], ["logs", "old0"]] {
        let other = d.ptrain(BOB, &args);
        assert!(text(&other).contains("no job"), "{}", text(&other));
    }
    let listed: Vec<serde_json::Value> = serde_json::from_slice(
        &d.ptrain("root", &["list", "--json", "--recent", "2"])
            .stdout,
    )
    .unwrap();
    let listed: Vec<&str> = listed.iter().map(|j| j["id"].as_str().unwrap()).collect();
    assert_eq!(listed, ["old5", "last"]);
    // Its id is free again: Bob's new job of that id runs and is reported
    // as itself, never as the old unit's end (kept loaded a while, ended).
    d.drop_job(
        BOB,
        "old0.json",
        r#"{"version": 1, "command": ["/bin/sh", "-c", "exit 3"]}"#,
    );
    let again = d.wait_ended("old0");
    assert_eq!(
        (again["owner"].as_str(), again["exit_code"].as_i64()),
        (Some(BOB), Some(3)),
        "{again}"
    );
}

#[test]
fn a_thousand_queued_jobs_hold_no_unit_or_process_each() {
    let d = TestDaemon::start_with(
        "queued",
        Opts {
            gpus: 1,
            extra_config: "max_queued_per_user = 5000\n".into(),
            ..Opts::default()
        },
    );
    let work = d.workdir(ALICE);
    let hold = serde_json::json!({"version": 1, "command": ["sleep", "600"], "gpus": 1});
    d.drop_job(ALICE, "holder.json", &hold.to_string());
    d.wait_running("holder");
    // 1,000 GPU jobs published by rename, as fast as one shell can.
    let template = work.join("tpl.json");
    std::fs::write(
        &template,
        r#"{"version": 1, "command": ["true"], "gpus": 1}"#,
    )
    .unwrap();
    crate::daemon::chown(&template, ALICE);
    let script = format!(
        "for i in $(seq 1 1000); do cp {tpl} {spool}/.q$i.tmp && mv {spool}/.q$i.tmp {spool}/q$i.json; done",
        tpl = template.display(),
        spool = d.spool.display()
    );
    let out = d.as_user(ALICE, "/bin/sh", &["-c", &script]);
    assert!(out.status.success(), "{}", text(&out));
    wait_for("1,000 jobs to be queued", Duration::from_secs(120), || {
        let listed: Vec<serde_json::Value> = serde_json::from_slice(
            &d.ptrain("root", &["list", "--json", "--recent", "0"])
                .stdout,
        )
        .ok()?;
        (listed.iter().filter(|j| j["status"] == "queued").count() == 1000).then_some(())
    });
    // systemd knows only the running job; ptraind did not grow a task per job.
    let (_, units) = d.harness.systemctl(&[
        "list-units",
        "--all",
        "--no-legend",
        "--plain",
        "ptrain-job@*",
    ]);
    assert_eq!(units.lines().count(), 1, "{units}");
    let pid = d.unit_property("ptraind.service", "MainPID");
    let out = d
        .harness
        .command("cat")
        .arg(format!("/proc/{pid}/status"))
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&out.stdout);
    let threads: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|t| t.trim().parse().ok())
        .unwrap();
    assert!(
        threads < 64,
        "ptraind runs {threads} threads with 1,000 jobs queued"
    );
    let (_, tasks) =
        d.harness
            .systemctl(&["show", "ptraind.service", "-p", "TasksCurrent", "--value"]);
    assert!(tasks.trim().parse::<usize>().unwrap_or(0) < 64, "{tasks}");
    assert!(
        std::fs::read_dir(&d.spool).unwrap().next().is_none(),
        "files left in the spool"
    );
}

/// Alice's `long` (a 600 s sleep), once it runs: its status.
fn a_long_job_running(d: &TestDaemon) -> serde_json::Value {
    d.drop_job(
        ALICE,
        "long.json",
        r#"{"version": 1, "command": ["sleep", "600"]}"#,
    );
    d.wait_running("long")
}

/// ptraind still sees ends: `long` stopped, and a new job's success.
fn still_hears_every_end(d: &TestDaemon) {
    let out = d.ptrain(ALICE, &["stop", "long"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(d.wait_ended("long")["status"], "stopped");
    let after = d.run_to_end(ALICE, "after", r#"{"version": 1, "command": ["true"]}"#);
    assert_eq!(after["status"], "succeeded");
}

#[test]
fn a_lost_bus_connection_restarts_ptraind_which_re_attaches() {
    let d = TestDaemon::start("bus-lost");
    let before = a_long_job_running(&d);
    let first_pid = main_pid(&d);
    // The system bus goes away under ptraind (an upgrade, a crash): its
    // signal streams end. It must not stay up deaf to every job's end.
    let (ok, out) = d.harness.systemctl(&["restart", "dbus.service"]);
    assert!(ok, "{out}");
    wait_for("ptraind restarted by systemd", WAIT, || {
        let pid = main_pid(&d);
        let active = d.unit_property("ptraind.service", "ActiveState") == "active";
        (active && pid != first_pid && pid != "0").then_some(())
    });
    let log = d.daemon_log();
    assert!(
        log.contains("lost systemd's signals"),
        "no word of the lost bus in:\n{log}"
    );
    // Re-attached: the same run is still tracked, and its end is seen.
    let again = d.wait_running("long");
    assert_eq!(again["invocation_id"], before["invocation_id"]);
    still_hears_every_end(&d);
}

#[test]
fn systemd_coming_back_on_the_bus_keeps_ptraind_subscribed_without_a_restart() {
    let d = TestDaemon::start("systemd-back");
    a_long_job_running(&d);
    let pid = main_pid(&d);
    // daemon-reexec: systemd's bus name gets a new owner, and ptraind
    // subscribes again. systemd kept its subscribers, so the answer is
    // "already subscribed": a success, not 30 s of retries and an exit.
    let (ok, out) = d.harness.systemctl(&["daemon-reexec"]);
    assert!(ok, "{out}");
    wait_for("ptraind to subscribe again", WAIT, || {
        d.daemon_log()
            .contains("subscribed to systemd's signals again")
            .then_some(())
    });
    let log = d.daemon_log();
    assert_eq!(main_pid(&d), pid, "ptraind was restarted:\n{log}");
    // And it still hears every end.
    still_hears_every_end(&d);
    assert_eq!(main_pid(&d), pid);
}

#[test]
fn kill_9_at_each_point_while_a_thousand_jobs_land_runs_each_exactly_once() {
    const N: usize = 1000;
    let d = TestDaemon::start_with(
        "crash-flood",
        Opts {
            extra_config: "max_queued_per_user = 5000".into(),
            ..Opts::default()
        },
    );
    let job = counted_job(&d, "");
    // Written in place by the user, all at once: ptraind claims them while
    // it is killed again and again.
    let script = format!(
        "cd {spool} && i=0; while [ $i -lt {N} ]; do printf '%s' '{job}' > fl$i.json; i=$((i+1)); done",
        spool = d.spool.display()
    );
    let points = [
        "after-claim:40",
        "before-start-unit:40",
        "after-start-unit:40",
        "before-record-exit:40",
        "after-record-exit:40",
    ];
    let mut crashes = 0;
    for (round, point) in points.iter().enumerate() {
        let (ok, out) = d
            .harness
            .systemctl(&["set-environment", &format!("PTRAIN_CRASH_AT={point}")]);
        assert!(ok, "{out}");
        d.harness.systemctl(&["reset-failed", "ptraind.service"]);
        // Mid-flood, the crash point may come before systemd has seen
        // READY=1: then the restart "fails", which is the point.
        d.harness.systemctl(&["restart", "ptraind.service"]);
        let pid = main_pid(&d);
        if round == 0 {
            let out = d.as_user(ALICE, "/bin/sh", &["-c", &script]);
            assert!(out.status.success(), "{}", text(&out));
        }
        // Killed at the point (or, late in the flood, past the last job).
        // Up to 256 units are re-attached at each start, and each job's end
        // is one more unit (its exit recorder) for systemd: on a loaded
        // 2-core host the 40th end can come later than WAIT.
        let crashed = wait_for(&format!("ptraind to crash at {point}"), WAIT * 3, || {
            let now = main_pid(&d);
            if now != pid {
                return Some(true);
            }
            let ran = run_counts(&d).len();
            (ran == N && d.status(&format!("fl{}", N - 1)).is_some()).then_some(false)
        });
        crashes += usize::from(crashed);
    }
    let (ok, out) = d
        .harness
        .systemctl(&["unset-environment", "PTRAIN_CRASH_AT"]);
    assert!(ok, "{out}");
    d.harness.systemctl(&["reset-failed", "ptraind.service"]);
    let (ok, out) = d.harness.systemctl(&["restart", "ptraind.service"]);
    assert!(ok, "{out}");
    assert!(
        crashes >= 4,
        "only {crashes} of 5 crash points were reached"
    );
    wait_for("every flooded job to end", Duration::from_secs(300), || {
        let listed: Vec<serde_json::Value> =
            serde_json::from_slice(&d.ptrain("root", &["list", "--all", "--json"]).stdout).ok()?;
        let ended = listed
            .iter()
            .filter(|j| j["id"].as_str().is_some_and(|id| id.starts_with("fl")))
            .filter(|j| j["status"] == "succeeded")
            .count();
        (ended == N).then_some(())
    });
    let counts = run_counts(&d);
    assert_eq!(counts.len(), N, "jobs that ran: {}", counts.len());
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "jobs that ran more than once: {twice:?}");
    assert!(
        std::fs::read_dir(&d.spool).unwrap().next().is_none(),
        "files left in the spool"
    );
}
