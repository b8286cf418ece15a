//! Issue 2: a dropped JSON file becomes a finished systemd unit.

use crate::daemon::{text, Opts, TestDaemon, ALICE, BOB};
use crate::harness::{ensure_user, wait_for};

#[test]
fn job_runs_as_file_owner_in_workdir_with_its_gpu() {
    let d = TestDaemon::start_with(
        "owner",
        Opts {
            extra_config: KEEP_BRIEFLY.into(),
            ..Opts::default()
        },
    );
    let work = d.workdir(ALICE);
    let job = format!(
        r#"{{"version": 1, "command": ["/bin/sh", "-c", "echo uid=$(id -u) pwd=$(pwd) cuda=$CUDA_VISIBLE_DEVICES order=$CUDA_DEVICE_ORDER job=$PTRAIN_JOB_ID lr=$LR > out.txt; echo training output line; exec sleep 30"],
            "workdir": "{}", "gpus": 1, "timeout": "12h", "env": {{"LR": "0.1"}}}}"#,
        work.display()
    );
    d.drop_job(ALICE, "resnet-lr01.json", &job);
    let status = d.wait_running("resnet-lr01");
    let (alice_uid, alice_gid) = ensure_user(ALICE);
    let unit = "ptrain-job@resnet-lr01.service";
    assert_eq!(status["owner"], ALICE);
    assert_eq!(status["unit"], unit);
    assert_eq!(status["gpus"].as_array().unwrap().len(), 1);

    // What `systemctl status/show` shows while it runs.
    assert_eq!(d.unit_property(unit, "ActiveState"), "active");
    assert_eq!(d.unit_property(unit, "User"), alice_uid.to_string());
    assert_eq!(d.unit_property(unit, "Group"), alice_gid.to_string());
    assert_eq!(
        d.unit_property(unit, "WorkingDirectory"),
        work.display().to_string()
    );
    assert_eq!(d.unit_property(unit, "Slice"), "ptrain.slice");
    assert_eq!(d.unit_property(unit, "RuntimeMaxUSec"), "12h");
    assert_eq!(d.unit_property(unit, "DevicePolicy"), "closed");
    let (ok, shown) = d.harness.systemctl(&["status", unit, "--no-pager"]);
    assert!(ok, "{shown}");
    assert!(shown.contains("active (running)"), "{shown}");

    let out = wait_for("the job's output file", crate::daemon::WAIT, || {
        std::fs::read_to_string(work.join("out.txt"))
            .ok()
            .filter(|s| s.ends_with('\n'))
    });
    let gpu_uuid = status["gpu_uuids"][0].as_str().unwrap();
    assert_eq!(
        out.trim(),
        format!(
            "uid={alice_uid} pwd={} cuda={gpu_uuid} order=PCI_BUS_ID job=resnet-lr01 lr=0.1",
            work.display()
        )
    );
    // The file the job wrote belongs to alice, not root.
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(work.join("out.txt")).unwrap().uid(),
        alice_uid
    );
    // Its output is in the journal under its unit.
    wait_for(
        "the job's output in the journal",
        crate::daemon::WAIT,
        || {
            d.harness
                .journal(&["-u", unit])
                .contains("training output line")
                .then_some(())
        },
    );
    for user in [ALICE, "root"] {
        let logs = d.ptrain(user, &["logs", "resnet-lr01"]);
        assert!(
            text(&logs).contains("training output line"),
            "{user}: {}",
            text(&logs)
        );
    }
    let denied = d.ptrain(BOB, &["logs", "resnet-lr01"]);
    assert_eq!(denied.status.code(), Some(1), "{}", text(&denied));

    let stop = d.ptrain(ALICE, &["stop", "resnet-lr01"]);
    assert!(stop.status.success(), "{}", text(&stop));
    let ended = d.wait_ended("resnet-lr01");
    assert_eq!(ended["status"], "stopped");
    assert!(ended["started_at"].as_u64().unwrap() <= ended["ended_at"].as_u64().unwrap());
    // The spool file was claimed: nothing is left behind to run twice.
    assert!(!d.spool.join("resnet-lr01.json").exists());
    // No unit is left behind once its keep_ended_units is over.
    wait_for("the unit to be collected", crate::daemon::WAIT, || {
        (d.unit_property(unit, "LoadState") == "not-found").then_some(())
    });
}

/// Kept this long in the tests that watch units go: the release on time.
const KEEP_BRIEFLY: &str = "[jobs]\nkeep_ended_units = \"1s\"\n";

#[test]
fn an_ended_unit_stays_for_systemctl_status_then_goes_oldest_first() {
    let d = TestDaemon::start_with(
        "kept",
        Opts {
            extra_config: "[jobs]\nkeep_ended_units = \"10m\"\nmax_kept_units = 2\n".into(),
            ..Opts::default()
        },
    );
    let job = |line: &str, code: u8| {
        format!(r#"{{"version": 1, "command": ["/bin/sh", "-c", "echo {line}; exit {code}"]}}"#)
    };
    d.drop_job(ALICE, "first.json", &job("first-output-line", 3));
    assert_eq!(d.wait_ended("first")["exit_code"], 3);
    // What an admin reads after the end: the result, the exit status and
    // the journal tail, as Slurm's MinJobAge keeps a job for scontrol.
    let unit = "ptrain-job@first.service";
    let (_, shown) = d.harness.systemctl(&["status", "--lines", "20", unit]);
    assert!(!shown.contains("could not be found"), "{shown}");
    assert!(
        shown.contains("Active: failed (Result: exit-code)"),
        "{shown}"
    );
    assert!(shown.contains("status=3"), "{shown}");
    assert!(shown.contains("first-output-line"), "{shown}");
    for id in ["second", "third"] {
        d.drop_job(ALICE, &format!("{id}.json"), &job("ok", 0));
        assert_eq!(d.wait_ended(id)["status"], "succeeded");
    }
    // Two are kept: the oldest goes first, the two newest stay.
    wait_for(
        "the oldest kept unit to be collected",
        crate::daemon::WAIT,
        || (d.unit_property(unit, "LoadState") == "not-found").then_some(()),
    );
    for id in ["second", "third"] {
        let unit = format!("ptrain-job@{id}.service");
        assert_eq!(d.unit_property(&unit, "LoadState"), "loaded", "{unit}");
        let (_, shown) = d.harness.systemctl(&["status", &unit]);
        assert!(shown.contains("status=0/SUCCESS"), "{shown}");
    }
    // The job's record outlives its unit.
    assert_eq!(d.status("first").unwrap()["exit_code"], 3);
}

#[test]
fn exits_are_recorded_success_failure_signal_timeout() {
    let d = TestDaemon::start_with(
        "exits",
        Opts {
            extra_config: KEEP_BRIEFLY.into(),
            ..Opts::default()
        },
    );
    let cases = [
        ("ok", r#"["true"]"#, None),
        ("fail3", r#"["/bin/sh", "-c", "exit 3"]"#, None),
        // `$$` reaches the shell as written: systemd must not expand it.
        ("segv", r#"["/bin/sh", "-c", "kill -SEGV $$"]"#, None),
        ("slow", r#"["sleep", "60"]"#, Some("1s")),
        ("nocmd", r#"["/nonexistent/train"]"#, None),
    ];
    for (id, cmd, timeout) in cases {
        let timeout = timeout
            .map(|t| format!(r#", "timeout": "{t}""#))
            .unwrap_or_default();
        d.drop_job(
            ALICE,
            &format!("{id}.json"),
            &format!(r#"{{"version": 1, "command": {cmd}{timeout}}}"#),
        );
    }
    let ok = d.wait_ended("ok");
    assert_eq!(ok["status"], "succeeded");
    assert_eq!(ok["exit_code"], 0);
    let fail = d.wait_ended("fail3");
    assert_eq!(fail["status"], "failed");
    assert_eq!(fail["exit_code"], 3);
    let segv = d.wait_ended("segv");
    assert_eq!(segv["status"], "killed");
    assert_eq!(segv["signal"], libc::SIGSEGV);
    let slow = d.wait_ended("slow");
    assert_eq!(slow["status"], "timeout");
    assert_eq!(slow["systemd_result"], "timeout");
    let nocmd = d.wait_ended("nocmd");
    assert_eq!(nocmd["status"], "failed");
    assert!(
        nocmd["detail"]
            .as_str()
            .unwrap()
            .contains("command was not found"),
        "{nocmd}"
    );
    for id in ["ok", "fail3", "segv", "slow", "nocmd"] {
        let s = d.status(id).unwrap();
        assert!(s["started_at"].is_u64() || id == "nocmd", "{s}");
        assert!(s["ended_at"].is_u64(), "{s}");
        // Failed units do not pile up in systemd.
        let unit = format!("ptrain-job@{id}.service");
        wait_for("failed units to be collected", crate::daemon::WAIT, || {
            (d.unit_property(&unit, "LoadState") == "not-found").then_some(())
        });
    }
    // Human output names the outcome, once.
    let shown = text(&d.ptrain(ALICE, &["status", "fail3"]));
    assert!(shown.contains("failed with exit code 3"), "{shown}");
    let shown = text(&d.ptrain(ALICE, &["status", "ok"]));
    assert!(shown.contains("status:    succeeded\n"), "{shown}");
    // `list --json` shows recent ends whole, as `status` does.
    let listed: Vec<serde_json::Value> =
        serde_json::from_slice(&d.ptrain(ALICE, &["list", "--json"]).stdout).unwrap();
    let fail3 = listed.iter().find(|j| j["id"] == "fail3").unwrap();
    assert_eq!(fail3["command"][2], "exit 3", "{fail3}");
    assert!(fail3["invocation_id"].is_string(), "{fail3}");
    assert!(fail3.get("summary").is_none(), "{fail3}");
    let slow = listed.iter().find(|j| j["id"] == "slow").unwrap();
    assert_eq!(slow["timeout_secs"], 1, "{slow}");
    let list = text(&d.ptrain(BOB, &["list"]));
    for id in ["ok", "fail3", "segv", "slow"] {
        assert!(list.contains(id), "{list}");
    }
}

#[test]
fn two_gpus_two_jobs_without_overlap_and_a_third_waits() {
    let d = TestDaemon::start_with(
        "gpus",
        Opts {
            gpus: 2,
            ..Opts::default()
        },
    );
    // Each job proves its isolation: its own /dev/nvidiaN opens with ENXIO
    // (allowed, no driver), the other one fails with EPERM (denied by the
    // device cgroup) even after it unsets CUDA_VISIBLE_DEVICES.
    let probe = r#"unset CUDA_VISIBLE_DEVICES; for n in 0 1; do if (exec 3</dev/nvidia$n) 2>/dev/null; then r=open; else r=$( (exec 3</dev/nvidia$n) 2>&1 | grep -q 'not permitted' && echo EPERM || echo ENXIO); fi; echo nvidia$n=$r; done > probe-$PTRAIN_JOB_ID.txt; exec sleep 60"#;
    let work = d.workdir(ALICE);
    for id in ["g1", "g2", "g3"] {
        let job = serde_json::json!({"version": 1, "command": ["/bin/sh", "-c", probe], "workdir": work, "gpus": 1});
        d.drop_job(ALICE, &format!("{id}.json"), &job.to_string());
    }
    let g1 = d.wait_running("g1");
    let g2 = d.wait_running("g2");
    let g3 = d.wait_claimed("g3");
    assert_eq!(g3["status"], "queued", "{g3}");
    let a = g1["gpus"][0].as_u64().unwrap();
    let b = g2["gpus"][0].as_u64().unwrap();
    assert_ne!(a, b, "two jobs share a GPU");
    for (id, gpu) in [("g1", a), ("g2", b)] {
        let probe = wait_for("probe output", crate::daemon::WAIT, || {
            std::fs::read_to_string(work.join(format!("probe-{id}.txt")))
                .ok()
                .filter(|s| s.lines().count() == 2)
        });
        let other = 1 - gpu;
        assert!(
            probe.contains(&format!("nvidia{gpu}=ENXIO")),
            "{id}: {probe}"
        );
        assert!(
            probe.contains(&format!("nvidia{other}=EPERM")),
            "{id}: {probe}"
        );
    }
    let gpus = text(&d.ptrain(BOB, &["gpus"]));
    assert!(gpus.contains("g1") && gpus.contains("g2"), "{gpus}");

    // Freeing a GPU starts the waiting job on exactly that GPU.
    assert!(d.ptrain(ALICE, &["stop", "g1"]).status.success());
    let g3 = d.wait_running("g3");
    assert_eq!(g3["gpus"][0].as_u64().unwrap(), a);
    assert_eq!(d.status("g2").unwrap()["status"], "running");
}

#[test]
fn only_the_owner_or_root_may_stop_a_job() {
    let d = TestDaemon::start("stop");
    let sleeper = |id: &str| {
        d.drop_job(
            ALICE,
            &format!("{id}.json"),
            r#"{"version": 1, "command": ["sleep", "60"]}"#,
        );
        d.wait_running(id);
    };
    sleeper("long");
    let denied = d.ptrain(BOB, &["stop", "long"]);
    assert_eq!(denied.status.code(), Some(1));
    assert!(text(&denied).contains("belongs to"), "{}", text(&denied));
    assert_eq!(d.status("long").unwrap()["status"], "running");
    let missing = d.ptrain(BOB, &["stop", "nope"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing).contains("no job"), "{}", text(&missing));
    let ok = d.ptrain("root", &["stop", "long"]);
    assert!(ok.status.success(), "{}", text(&ok));
    // Right after the stop: on its way out, or gone.
    let now = d.status("long").unwrap();
    assert!(
        now["status"] == "stopped"
            || now["detail"]
                .as_str()
                .is_some_and(|d| d.starts_with("stopping (asked by root)")),
        "{now}"
    );
    let ended = d.wait_ended("long");
    assert_eq!(ended["status"], "stopped");
    assert_eq!(ended["outcome"]["by_uid"], 0);
    assert_eq!(ended["detail"], "stopped by root", "{ended}");
    // The owner's own stop names her.
    sleeper("mine");
    let ok = d.ptrain(ALICE, &["stop", "mine"]);
    assert!(ok.status.success(), "{}", text(&ok));
    let ended = d.wait_ended("mine");
    assert_eq!(ended["detail"], format!("stopped by {ALICE}"), "{ended}");
}

#[test]
fn a_systemctl_stop_is_recorded_as_a_stop_and_a_sigterm_of_its_own_as_a_kill() {
    let d = TestDaemon::start("sysstop");
    for id in ["admin-stopped", "self-killed"] {
        let script = if id == "self-killed" {
            "while [ ! -e go ]; do sleep 0.05; done; kill -TERM $$"
        } else {
            "sleep 60"
        };
        let job = serde_json::json!({"version": 1, "command": ["/bin/sh", "-c", script], "workdir": d.workdir(ALICE)});
        d.drop_job(ALICE, &format!("{id}.json"), &job.to_string());
        d.wait_running(id);
    }
    // The admin stops the unit with systemd's own tool, not ptrain.
    let (ok, out) = d
        .harness
        .systemctl(&["stop", "ptrain-job@admin-stopped.service"]);
    assert!(ok, "{out}");
    let ended = d.wait_ended("admin-stopped");
    assert_eq!(ended["status"], "stopped", "{ended}");
    assert!(
        ended["detail"]
            .as_str()
            .unwrap()
            .starts_with("stopped by systemd (systemctl stop"),
        "{ended}"
    );
    // The same signal sent by the job itself is no stop.
    std::fs::write(d.workdir(ALICE).join("go"), "").unwrap();
    let ended = d.wait_ended("self-killed");
    assert_eq!(ended["status"], "killed", "{ended}");
    assert_eq!(ended["signal"], libc::SIGTERM, "{ended}");
}

#[test]
fn bad_files_are_rejected_with_a_reason_their_owner_can_read() {
    let d = TestDaemon::start("reject");
    d.drop_job(
        ALICE,
        "broken.json",
        r#"{"version": 1, "command": "python3 train.py"}"#,
    );
    let r = d.wait_rejected(ALICE, "broken.json");
    assert!(r["reason"].as_str().unwrap().contains("command"), "{r}");
    // Bob does not see alice's rejections; root does.
    assert!(d.rejected(BOB).iter().all(|r| r["file"] != "broken.json"));
    assert!(d
        .rejected("root")
        .iter()
        .any(|r| r["file"] == "broken.json"));
    assert!(
        !d.spool.join("broken.json").exists(),
        "rejected file left in the spool"
    );
    // The same id twice: the second is rejected, the first runs once.
    d.drop_job(ALICE, "dup.json", r#"{"version": 1, "command": ["true"]}"#);
    d.wait_ended("dup");
    d.drop_job(BOB, "dup.json", r#"{"version": 1, "command": ["true"]}"#);
    let r = d.wait_rejected(BOB, "dup.json");
    assert!(
        r["reason"].as_str().unwrap().contains("already exists"),
        "{r}"
    );
    assert_eq!(d.status("dup").unwrap()["owner"], ALICE);
    d.assert_alive();
}

#[test]
fn a_file_under_no_job_name_is_refused_after_its_grace_not_left_unseen() {
    let d = TestDaemon::start("stray");
    let publish = |name: &str| {
        let script = format!(
            "printf '%s' '{{\"version\": 1, \"command\": [\"true\"]}}' > {}",
            d.spool.join(name).display()
        );
        let out = d.as_user(ALICE, "/bin/sh", &["-c", &script]);
        assert!(out.status.success(), "{}", text(&out));
    };
    let dropped = std::time::Instant::now();
    publish("train.JSON");
    publish(".train.json.partial");
    // A temp name renamed to a job name within the grace is a job.
    publish("renamed.tmp");
    let out = d.as_user(
        ALICE,
        "mv",
        &[
            d.spool.join("renamed.tmp").to_str().unwrap(),
            d.spool.join("renamed.json").to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(d.wait_ended("renamed")["status"], "succeeded");
    let r = wait_for(
        "train.JSON to be refused",
        std::time::Duration::from_secs(90),
        || {
            d.rejected(ALICE)
                .into_iter()
                .find(|r| r["file"] == "train.JSON")
        },
    );
    assert!(
        dropped.elapsed() >= std::time::Duration::from_secs(25),
        "refused before its grace: {r}"
    );
    assert!(r["reason"].as_str().unwrap().contains("NAME.json"), "{r}");
    assert!(!d.spool.join("train.JSON").exists());
    // Dotfiles are a writer's business.
    assert!(d.spool.join(".train.json.partial").exists());
    assert!(d.rejected(ALICE).iter().all(|r| r["file"] != "renamed.tmp"));
    d.assert_alive();
}

#[test]
fn status_says_why_a_result_was_ignored_and_what_the_job_ran_with() {
    let d = TestDaemon::start("result");
    let job = serde_json::json!({"version": 1,
        "command": ["/bin/sh", "-c", "echo '[1, 2]' > \"$PTRAIN_RESULT_FILE\""],
        "resources": {"cpus": 2, "memory": "1G"}});
    d.drop_job(ALICE, "listy.json", &job.to_string());
    let ended = d.wait_ended("listy");
    assert_eq!(ended["status"], "succeeded", "{ended}");
    assert!(ended["result"].is_null(), "{ended}");
    assert!(
        ended["result_error"]
            .as_str()
            .is_some_and(|e| e.contains("must hold a JSON object")),
        "{ended}"
    );
    let shown = text(&d.ptrain(ALICE, &["status", "listy"]));
    assert!(
        shown.contains("result:    none: what it wrote was ignored ("),
        "{shown}"
    );
    assert!(
        shown.contains("limits:    2 CPUs, 1.0 GiB of memory"),
        "{shown}"
    );
    // Another user sees neither (the result is the owner's).
    let theirs = text(&d.ptrain(BOB, &["status", "listy"]));
    assert!(!theirs.contains("result:"), "{theirs}");
}

#[test]
fn submit_validates_locally_and_drops_safely() {
    let d = TestDaemon::start("submit");
    let work = d.workdir(ALICE);
    let bad = work.join("bad.json");
    std::fs::write(&bad, r#"{"version": 1, "command": ["true"], "gpu": 1}"#).unwrap();
    crate::daemon::chown(&bad, ALICE);
    let out = d.ptrain(ALICE, &["submit", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("gpu"), "{}", text(&out));
    let good = work.join("hello.json");
    std::fs::write(&good, r#"{"version": 1, "command": ["echo", "hi"]}"#).unwrap();
    crate::daemon::chown(&good, ALICE);
    let out = d.ptrain(ALICE, &["submit", good.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("accepted"), "{}", text(&out));
    let s = d.wait_ended("hello");
    assert_eq!(s["status"], "succeeded");
    assert_eq!(s["owner"], ALICE);
}

#[test]
fn a_workdir_its_owner_cannot_enter_is_refused_at_claim_with_the_reason() {
    let d = TestDaemon::start("workdir");
    // Bob's private directory: ptraind (root) could enter it, Alice cannot.
    let private = d.workdir(BOB).join("private");
    std::fs::create_dir(&private).unwrap();
    crate::daemon::chown(&private, BOB);
    std::fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let missing = d.workdir(ALICE).join("no-such-dir");
    let cases = [
        ("typo", missing.clone(), "it does not exist"),
        ("foreign", private.clone(), "may not enter it"),
        ("below", private.join("x"), "not searchable"),
    ];
    for (id, dir, _) in &cases {
        let job = serde_json::json!({"version": 1, "command": ["true"], "workdir": dir});
        d.drop_job(ALICE, &format!("{id}.json"), &job.to_string());
    }
    for (id, dir, why) in &cases {
        let r = d.wait_rejected(ALICE, &format!("{id}.json"));
        let reason = r["reason"].as_str().unwrap();
        assert!(reason.contains(&dir.display().to_string()), "{reason}");
        assert!(reason.contains(why), "{id}: {reason}");
        assert!(d.status(id).is_none(), "{id} must not be a job");
    }
    // `ptrain submit` waits for the decision and exits 2, as for any
    // file ptraind refuses as invalid.
    let file = d.workdir(ALICE).join("again.json");
    std::fs::write(
        &file,
        serde_json::json!({"version": 1, "command": ["true"], "workdir": missing}).to_string(),
    )
    .unwrap();
    crate::daemon::chown(&file, ALICE);
    let out = d.ptrain(ALICE, &["submit", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("does not exist"), "{}", text(&out));
    // Bob may use his own directory.
    let job = serde_json::json!({"version": 1, "command": ["true"], "workdir": private});
    d.drop_job(BOB, "own.json", &job.to_string());
    assert_eq!(d.wait_ended("own")["status"], "succeeded");
    d.assert_alive();
}

#[test]
fn a_job_written_in_place_is_taken_only_when_complete() {
    let d = TestDaemon::start("partial");
    // A writer that creates the file, writes half, pauses, then finishes.
    let half = r#"{"version": 1, "comm"#;
    let rest = r#"and": ["true"]}"#;
    let script = format!(
        "exec 3>{spool}/inplace.json; printf '%s' '{half}' >&3; sleep 0.5; printf '%s' '{rest}' >&3; exec 3>&-",
        spool = d.spool.display()
    );
    let out = d.as_user(ALICE, "/bin/sh", &["-c", &script]);
    assert!(out.status.success(), "{}", text(&out));
    let s = d.wait_ended("inplace");
    assert_eq!(s["status"], "succeeded");
    // And by rename: a temp dotfile renamed to its final name.
    let script = format!(
        "printf '%s' '{{\"version\": 1, \"command\": [\"true\"]}}' > {spool}/.renamed.json.tmp && mv {spool}/.renamed.json.tmp {spool}/renamed.json",
        spool = d.spool.display()
    );
    let out = d.as_user(ALICE, "/bin/sh", &["-c", &script]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(d.wait_ended("renamed")["status"], "succeeded");
    assert!(d.rejected("root").is_empty(), "{:?}", d.rejected("root"));
}

#[test]
fn restart_keeps_running_jobs_and_picks_up_files_dropped_while_down() {
    let d = TestDaemon::start("restart");
    d.drop_job(
        ALICE,
        "survivor.json",
        r#"{"version": 1, "command": ["sleep", "3"]}"#,
    );
    let before = d.wait_running("survivor");
    let (ok, out) = d.harness.systemctl(&["stop", "ptraind.service"]);
    assert!(ok, "{out}");
    // SIGTERM stopped ptraind cleanly, and the job kept running.
    assert_eq!(d.unit_property("ptraind.service", "Result"), "success");
    assert_eq!(
        d.unit_property("ptrain-job@survivor.service", "ActiveState"),
        "active"
    );
    d.drop_job(
        ALICE,
        "while-down.json",
        r#"{"version": 1, "command": ["true"]}"#,
    );
    d.start_service();
    let after = d.wait_ended("survivor");
    assert_eq!(after["status"], "succeeded", "{after}");
    assert_eq!(
        after["invocation_id"], before["invocation_id"],
        "the job ran twice"
    );
    assert_eq!(d.wait_ended("while-down")["status"], "succeeded");
}

#[test]
fn each_binary_names_itself_in_its_version() {
    for (bin, name) in [
        (crate::daemon::PTRAIND, "ptraind"),
        (crate::daemon::PTRAIN, "ptrain"),
    ] {
        let out = std::process::Command::new(bin)
            .arg("--version")
            .output()
            .unwrap();
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success()
                && shown.starts_with(&format!("{name} {}", env!("CARGO_PKG_VERSION"))),
            "{bin} --version printed {shown:?}"
        );
    }
}

/// zbus writes each method's doc comment into the introspection XML as a
/// comment, where `--` is not allowed: strict parsers (python-dbus) then
/// refuse the whole interface.
#[test]
fn introspection_is_well_formed_xml() {
    let d = TestDaemon::start("introspect");
    let out = d
        .harness
        .command("busctl")
        .args([
            "--system",
            "--xml-interface",
            "introspect",
            ptrain::DBUS_NAME,
            ptrain::DBUS_PATH,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "busctl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let xml = String::from_utf8(out.stdout).unwrap();
    assert!(xml.contains("org.ptrain.Daemon1"), "{xml}");
    let mut parse = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, xml.dom.minidom; xml.dom.minidom.parseString(sys.stdin.buffer.read())",
        ])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    parse
        .stdin
        .take()
        .unwrap()
        .write_all(xml.as_bytes())
        .unwrap();
    let parsed = parse.wait_with_output().unwrap();
    assert!(
        parsed.status.success(),
        "a strict XML parser refuses the introspection: {}\n{xml}",
        String::from_utf8_lossy(&parsed.stderr)
    );
}
