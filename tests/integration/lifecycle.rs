//! Issue 22: a job held by its descriptor or by `ptrain hold` stays
//! queued, holding nothing, until its owner (or root) releases it; a job
//! with a `begin` stays queued until then and starts on time; both across
//! a kill -9 of ptraind; a checkpoint signal comes before a timeout and
//! before ptraind's own stops; a paused job stays frozen.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::daemon::{text, TestDaemon, ALICE, BOB, WAIT};
use crate::harness::wait_for;

/// Whether `id` is queued and says it is held.
fn is_held(d: &TestDaemon, id: &str) -> bool {
    let view = d.status(id).unwrap_or_default();
    view["status"] == "queued"
        && view["detail"]
            .as_str()
            .is_some_and(|s| s.contains(&format!("held; `ptrain release {id}`")))
}

/// kill -9 of ptraind, the test's first: waits for systemd's restart.
fn kill_9_once(d: &TestDaemon) {
    let (ok, out) = d
        .harness
        .systemctl(&["kill", "-s", "KILL", "ptraind.service"]);
    assert!(ok, "{out}");
    wait_for("ptraind to be restarted", WAIT, || {
        (d.unit_property("ptraind.service", "NRestarts") == "1"
            && d.unit_property("ptraind.service", "ActiveState") == "active")
            .then_some(())
    });
}

#[test]
fn a_held_job_starts_only_when_its_owner_releases_it_even_after_a_kill_9() {
    let d = TestDaemon::start("hold");
    let work = d.workdir(ALICE);
    // Submitted held.
    d.drop_job(
        ALICE,
        "h.json",
        r#"{"version": 1, "command": ["true"], "hold": true}"#,
    );
    d.wait_claimed("h");
    assert!(is_held(&d, "h"), "{}", d.status("h").unwrap());

    // Held by the CLI while it waits for a parent.
    let parent = serde_json::json!({"version": 1, "workdir": work,
        "command": ["/bin/sh", "-c", "while [ ! -e go ]; do sleep 0.05; done"]});
    d.drop_job(ALICE, "parent.json", &parent.to_string());
    d.wait_running("parent");
    d.drop_job(
        ALICE,
        "child.json",
        r#"{"version": 1, "command": ["true"], "after_ok": ["parent"]}"#,
    );
    d.wait_claimed("child");
    let out = d.ptrain(ALICE, &["hold", "child"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("job child held"), "{}", text(&out));
    assert!(is_held(&d, "child"));

    // Another user may neither release nor hold; a running job is not held.
    for verb in ["release", "hold"] {
        let out = d.ptrain(BOB, &[verb, "h"]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(
            text(&out).contains(&format!("only its owner or root may {verb} it")),
            "{}",
            text(&out)
        );
    }
    assert!(is_held(&d, "h"));
    let out = d.ptrain(ALICE, &["hold", "parent"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out)
            .contains("job parent is not queued (status: running); only a queued job can be held"),
        "{}",
        text(&out)
    );

    // The parent succeeds, and a job after it is planned and runs: the
    // held child was planned too, and stays.
    std::fs::write(work.join("go"), "").unwrap();
    assert_eq!(d.wait_ended("parent")["status"], "succeeded");
    let free = d.run_to_end(ALICE, "free", r#"{"version": 1, "command": ["true"]}"#);
    assert_eq!(free["status"], "succeeded");
    assert!(is_held(&d, "child"), "{}", d.status("child").unwrap());

    // kill -9: the holds are in the records.
    kill_9_once(&d);
    wait_for("ptraind to answer again", WAIT, || {
        d.status("h").map(|_| ())
    });
    assert!(is_held(&d, "h"), "{}", d.status("h").unwrap());
    assert!(is_held(&d, "child"), "{}", d.status("child").unwrap());

    // Released, both run once.
    let out = d.ptrain(ALICE, &["release", "h", "child"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for id in ["h", "child"] {
        let end = d.wait_ended(id);
        assert_eq!(end["status"], "succeeded", "{end}");
    }
    let out = d.ptrain(ALICE, &["release", "h"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("job h is not queued (status: succeeded)"),
        "{}",
        text(&out)
    );
}

/// Now plus `ahead`, as RFC 3339 in UTC+08:00 (the offset a user in
/// Beijing writes), and as µs since the epoch.
fn beijing_time_in(ahead: Duration) -> (String, u64) {
    let at = SystemTime::now() + ahead;
    let us = at.duration_since(UNIX_EPOCH).unwrap().as_micros() as u64;
    let local = humantime::format_rfc3339_seconds(at + Duration::from_secs(8 * 3600)).to_string();
    let whole_second_us = us / 1_000_000 * 1_000_000;
    (
        format!("{}+08:00", local.trim_end_matches('Z')),
        whole_second_us,
    )
}

/// A job started within a second of its `begin`, never before.
fn started_on_time(view: &serde_json::Value, begin_us: u64) {
    assert_eq!(view["begin_at"].as_u64(), Some(begin_us), "{view}");
    let started = view["started_at"].as_u64().expect("started_at");
    assert!(
        started >= begin_us && started - begin_us <= 1_000_000,
        "started {} ms after its begin: {view}",
        (started as i64 - begin_us as i64) / 1000
    );
}

#[test]
fn a_job_with_a_begin_waits_holding_nothing_and_starts_on_time_even_after_a_kill_9() {
    let d = TestDaemon::start("begin");
    // Bad begins are refused, naming the field and the fix.
    for (file, begin, says) in [
        (
            "past.json",
            "\"2020-01-01T00:00:00Z\"",
            "had passed when the file was written",
        ),
        (
            "zone.json",
            "\"2030-01-01T00:00:00\"",
            "carries no UTC offset",
        ),
        ("far.json", "\"400d\"", "365 days"),
    ] {
        d.drop_job(
            ALICE,
            file,
            &format!(r#"{{"version": 1, "command": ["true"], "begin": {begin}}}"#),
        );
        let r = d.wait_rejected(ALICE, file);
        let reason = r["reason"].as_str().unwrap();
        assert!(
            reason.contains("field `begin`") && reason.contains(says),
            "{r}"
        );
    }

    // A moment with its offset, and a delay; each waits, says so.
    let (moment, moment_us) = beijing_time_in(Duration::from_secs(8));
    d.drop_job(
        ALICE,
        "at.json",
        &serde_json::json!({"version": 1, "command": ["true"], "begin": moment}).to_string(),
    );
    let work = d.workdir(ALICE);
    d.drop_job(
        ALICE,
        "later.json",
        &serde_json::json!({"version": 1, "workdir": work, "begin": "25s",
            "command": ["/bin/sh", "-c", "echo ran >> later.runs"]})
        .to_string(),
    );
    for id in ["at", "later"] {
        let view = d.wait_claimed(id);
        assert_eq!(view["status"], "queued", "{view}");
        assert!(
            view["detail"].as_str().unwrap().contains("(its `begin`)"),
            "{view}"
        );
    }
    let later_us = d.status("later").unwrap()["begin_at"].as_u64().unwrap();
    // Not before its time: a job with none runs past them meanwhile.
    assert_eq!(
        d.run_to_end(ALICE, "now", r#"{"version": 1, "command": ["true"]}"#)["status"],
        "succeeded"
    );
    assert_eq!(d.status("at").unwrap()["status"], "queued");
    let out = d.ptrain(ALICE, &["status", "at"]);
    assert!(text(&out).contains("begin:"), "{}", text(&out));

    let at = d.wait_ended("at");
    assert_eq!(at["status"], "succeeded", "{at}");
    started_on_time(&at, moment_us);

    // kill -9 while the delay's timer is pending: the restarted ptraind
    // arms it again from the record.
    assert_eq!(d.status("later").unwrap()["status"], "queued");
    kill_9_once(&d);
    wait_for("ptraind to answer again", WAIT, || d.status("later"));
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    assert!(now_us < later_us, "the restart took past the begin time");
    assert_eq!(d.status("later").unwrap()["status"], "queued");
    let later = d.wait_ended("later");
    assert_eq!(later["status"], "succeeded", "{later}");
    started_on_time(&later, later_us);
    let runs = std::fs::read_to_string(work.join("later.runs")).unwrap();
    assert_eq!(runs, "ran\n", "ran once");
}

#[test]
fn a_failing_job_with_retries_runs_again_as_its_next_attempt_across_a_kill_9() {
    let d = TestDaemon::start("retry");
    let work = d.workdir(ALICE);
    // Fails twice, then succeeds; each attempt notes PTRAIN_ATTEMPT.
    let flaky = serde_json::json!({"version": 1, "workdir": work,
        "retries": 2, "retry_delay": "3s",
        "command": ["/bin/sh", "-c",
            "echo $PTRAIN_ATTEMPT >> flaky.attempts; echo output of attempt $PTRAIN_ATTEMPT; [ $PTRAIN_ATTEMPT -ge 3 ]"]});
    d.drop_job(ALICE, "flaky.json", &flaky.to_string());
    d.drop_job(
        ALICE,
        "after.json",
        r#"{"version": 1, "command": ["true"], "after_ok": ["flaky"]}"#,
    );
    // Asks to be requeued once by its exit code; fails on another code
    // that its retry_on does not name.
    let requeue = serde_json::json!({"version": 1, "workdir": work,
        "requeue_exit_code": 85,
        "command": ["/bin/sh", "-c", "[ $PTRAIN_ATTEMPT -ge 2 ] || exit 85"]});
    d.drop_job(ALICE, "requeue.json", &requeue.to_string());
    d.drop_job(
        ALICE,
        "other.json",
        r#"{"version": 1, "command": ["sh", "-c", "exit 4"], "retries": 3, "retry_on": [3]}"#,
    );

    // Attempt 1 failed: queued again as attempt 2, its dependent waiting.
    let waiting = wait_for("flaky's second attempt to be queued", WAIT, || {
        d.status("flaky")
            .filter(|v| v["status"] == "queued" && v["attempt"] == 2)
    });
    assert!(
        waiting["detail"].as_str().unwrap().contains("retry 1 of 2"),
        "{waiting}"
    );
    assert_eq!(
        waiting["attempts"][0]["outcome"]["exit_code"], 1,
        "{waiting}"
    );
    assert_eq!(d.status("after").unwrap()["status"], "queued");
    kill_9_once(&d);

    let end = d.wait_ended("flaky");
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(end["attempt"], 3, "{end}");
    assert_eq!(end["attempts"].as_array().unwrap().len(), 2, "{end}");
    let seen = std::fs::read_to_string(work.join("flaky.attempts")).unwrap();
    assert_eq!(
        seen, "1\n2\n3\n",
        "each attempt ran once, knowing its number"
    );
    assert_eq!(d.wait_ended("after")["status"], "succeeded");
    let out = d.ptrain(ALICE, &["status", "flaky"]);
    assert!(
        text(&out).contains("attempt 2: failed") && text(&out).contains("attempt:   3 (this one)"),
        "{}",
        text(&out)
    );

    // Each attempt's output, by its invocation.
    for n in 1..=3 {
        let out = d.ptrain(ALICE, &["logs", "flaky", "--attempt", &n.to_string()]);
        assert!(out.status.success(), "{}", text(&out));
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            said.contains(&format!("output of attempt {n}")),
            "attempt {n}: {said}"
        );
        assert_eq!(
            said.matches("output of attempt").count(),
            1,
            "attempt {n}: {said}"
        );
    }
    let out = d.ptrain(ALICE, &["logs", "flaky", "--attempt", "4"]);
    assert!(
        !out.status.success() && text(&out).contains("has no attempt 4"),
        "{}",
        text(&out)
    );
    let out = d.ptrain(BOB, &["logs", "flaky", "--attempt", "1"]);
    assert!(!out.status.success(), "{}", text(&out));

    let end = d.wait_ended("requeue");
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(end["attempt"], 2, "{end}");
    assert!(
        end["attempts"][0]["why"]
            .as_str()
            .unwrap()
            .contains("requeue_exit_code 85"),
        "{end}"
    );
    let end = d.wait_ended("other");
    assert_eq!(end["status"], "failed", "{end}");
    assert_eq!(end["attempt"], 1, "{end}");
}

/// Lines of a file the job writes, 0 before it exists.
fn lines_of(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

#[test]
fn a_checkpoint_signal_comes_before_the_timeout_and_before_a_stop_which_waits_its_lead_across_a_kill_9(
) {
    let d = TestDaemon::start("checkpoint");
    let work = d.workdir(ALICE);
    // Each traps its signal and notes it, once per signal, in a file.
    let trapping = |signal: &str, file: &str| {
        format!("trap 'echo {signal} >> {file}' {signal}; while :; do sleep 0.2; done")
    };
    let timed = serde_json::json!({"version": 1, "workdir": work,
        "timeout": "10s", "checkpoint_signal": "SIGUSR1", "checkpoint_lead": "6s",
        "command": ["/bin/sh", "-c", trapping("USR1", "timed.ckpt")]});
    let stopped = serde_json::json!({"version": 1, "workdir": work,
        "checkpoint_signal": "USR2", "checkpoint_lead": "4s", "stop_grace": "3s",
        "command": ["/bin/sh", "-c", trapping("USR2", "stopped.ckpt")]});
    let kept = serde_json::json!({"version": 1, "workdir": work,
        "checkpoint_signal": "SIGUSR1", "checkpoint_lead": "10m",
        "command": ["/bin/sh", "-c", trapping("USR1", "kept.ckpt")]});
    d.drop_job(ALICE, "timed.json", &timed.to_string());
    d.drop_job(ALICE, "stopped.json", &stopped.to_string());
    d.drop_job(ALICE, "kept.json", &kept.to_string());

    // The timeout: the signal is sent its lead before, then the timeout
    // ends the job.
    let end = d.wait_ended("timed");
    assert_eq!(end["status"], "timeout", "{end}");
    let (started, ended) = (
        end["started_at"].as_u64().unwrap(),
        end["ended_at"].as_u64().unwrap(),
    );
    let sent = end["checkpoint_sent_at"].as_u64().expect("signal recorded");
    assert!(
        sent >= started + 4_000_000 && sent < ended,
        "the signal came 10s - 6s after the start, before the end: {end}"
    );
    assert_eq!(
        std::fs::read_to_string(work.join("timed.ckpt")).unwrap(),
        "USR1\n",
        "the script got its signal once, before its timeout"
    );

    // A stop: the signal now, the stop its lead later, with the job's own
    // SIGTERM grace on its unit.
    d.wait_running("stopped");
    assert_eq!(
        d.unit_property("ptrain-job@stopped.service", "TimeoutStopUSec"),
        "3s"
    );
    let out = d.ptrain(BOB, &["stop", "stopped"]);
    assert!(!out.status.success(), "bob may not stop alice's job");
    let out = d.ptrain(ALICE, &["stop", "stopped"]);
    assert!(
        out.status.success()
            && text(&out).contains("SIGUSR2 sent")
            && text(&out).contains("stops at"),
        "{}",
        text(&out)
    );
    let end = d.wait_ended("stopped");
    assert_eq!(end["status"], "stopped", "{end}");
    let stop_at = end["stop_at"].as_u64().expect("stop moment recorded");
    assert_eq!(
        end["checkpoint_sent_at"].as_u64().unwrap() + 4_000_000,
        stop_at,
        "{end}"
    );
    assert!(
        end["ended_at"].as_u64().unwrap() >= stop_at,
        "ptraind waited the lead before it stopped the job: {end}"
    );
    assert_eq!(
        std::fs::read_to_string(work.join("stopped.ckpt")).unwrap(),
        "USR2\n"
    );

    // A stop whose lead outlasts a kill -9 of ptraind: the job still runs
    // after the restart, with the same stop moment, never signalled twice;
    // a second stop does not wait.
    d.wait_running("kept");
    let out = d.ptrain(ALICE, &["stop", "kept"]);
    assert!(text(&out).contains("SIGUSR1 sent"), "{}", text(&out));
    wait_for("kept's checkpoint", WAIT, || {
        (lines_of(&work.join("kept.ckpt")) == 1).then_some(())
    });
    let before = d.status("kept").unwrap();
    kill_9_once(&d);
    let after = d.wait_running("kept");
    assert_eq!(after["stop_at"], before["stop_at"], "{after}");
    assert!(
        after["detail"].as_str().unwrap().contains("stopping at"),
        "{after}"
    );
    let out = d.ptrain(ALICE, &["stop", "kept"]);
    assert!(text(&out).contains("is stopping"), "{}", text(&out));
    let end = d.wait_ended("kept");
    assert_eq!(end["status"], "stopped", "{end}");
    assert!(
        end["ended_at"].as_u64().unwrap() < end["stop_at"].as_u64().unwrap(),
        "the second stop did not wait the 10 minutes: {end}"
    );
    assert_eq!(lines_of(&work.join("kept.ckpt")), 1, "signalled once");
}

#[test]
fn a_paused_job_is_frozen_keeping_its_gpu_across_a_kill_9_and_runs_on_when_resumed() {
    let d = TestDaemon::start("pause");
    let work = d.workdir(ALICE);
    let ticking = serde_json::json!({"version": 1, "workdir": work, "gpus": 1,
        "command": ["/bin/sh", "-c", "while :; do echo tick >> ticks; sleep 0.1; done"]});
    d.drop_job(ALICE, "p.json", &ticking.to_string());
    let running = d.wait_running("p");
    let gpus = running["gpus"].clone();
    assert_eq!(gpus.as_array().unwrap().len(), 1, "{running}");
    wait_for("the job to tick", WAIT, || {
        (lines_of(&work.join("ticks")) > 0).then_some(())
    });

    let out = d.ptrain(BOB, &["pause", "p"]);
    assert!(
        !out.status.success() && text(&out).contains("only its owner or root"),
        "{}",
        text(&out)
    );
    let out = d.ptrain(ALICE, &["pause", "p"]);
    assert!(
        out.status.success() && text(&out).contains("job p paused"),
        "{}",
        text(&out)
    );
    assert_eq!(
        d.unit_property("ptrain-job@p.service", "FreezerState"),
        "frozen"
    );
    let paused = d.status("p").unwrap();
    assert_eq!(paused["paused"], true, "{paused}");
    assert!(
        paused["detail"]
            .as_str()
            .unwrap()
            .contains("ptrain resume p"),
        "{paused}"
    );
    let ticks = lines_of(&work.join("ticks"));
    let out = d.ptrain(ALICE, &["resume", "nonesuch"]);
    assert!(!out.status.success());
    // A kill -9 of ptraind: still paused, still frozen, still on its GPU,
    // and it ticked not once meanwhile (ten a second when it runs).
    kill_9_once(&d);
    let view = d.wait_running("p");
    assert_eq!(view["paused"], true, "{view}");
    assert_eq!(view["gpus"], gpus, "{view}");
    assert_eq!(
        d.unit_property("ptrain-job@p.service", "FreezerState"),
        "frozen"
    );
    assert_eq!(
        lines_of(&work.join("ticks")),
        ticks,
        "a frozen job runs nothing"
    );
    let out = d.ptrain(ALICE, &["pause", "p"]);
    assert!(text(&out).contains("already paused"), "{}", text(&out));

    let out = d.ptrain(ALICE, &["resume", "p"]);
    assert!(
        out.status.success() && text(&out).contains("job p resumed"),
        "{}",
        text(&out)
    );
    wait_for("the job to tick again", WAIT, || {
        (lines_of(&work.join("ticks")) > ticks).then_some(())
    });
    assert_eq!(d.status("p").unwrap()["paused"], serde_json::Value::Null);
    // Paused again, a stop thaws it first so that SIGTERM ends it.
    d.ptrain(ALICE, &["pause", "p"]);
    let out = d.ptrain(ALICE, &["stop", "p"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(d.wait_ended("p")["status"], "stopped");
    let out = d.ptrain(ALICE, &["pause", "p"]);
    assert!(text(&out).contains("is not running"), "{}", text(&out));
}

#[test]
fn each_retry_is_told_once_when_notify_on_names_it_and_the_end_under_its_attempts_key() {
    use crate::notifications::{HttpServer, Reply};
    let hook = HttpServer::start(vec![], Reply::Status(200, "{}"));
    let d = TestDaemon::start_with(
        "retry-notify",
        crate::daemon::Opts {
            extra_config: format!(
                "[notify]\ndefault_channels = [\"hook\"]\n\
                 [channels.hook]\nkind = \"webhook\"\nurl = \"{}\"\n",
                hook.url("/h")
            ),
            ..crate::daemon::Opts::default()
        },
    );
    let flaky = serde_json::json!({"version": 1, "retries": 2, "retry_delay": "1s",
        "notify_on": ["retry", "succeeded", "failed"],
        "command": ["/bin/sh", "-c", "[ $PTRAIN_ATTEMPT -ge 3 ]"]});
    d.drop_job(ALICE, "told.json", &flaky.to_string());
    assert_eq!(d.wait_ended("told")["status"], "succeeded");
    let told = wait_for("two retries and the end to be told", WAIT, || {
        let requests = hook.requests();
        (requests.len() >= 3).then_some(requests)
    });
    let keys: Vec<String> = told
        .iter()
        .map(|r| r.header("idempotency-key").unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        keys,
        [
            "told.retry.hook",
            "told.retry-2.hook",
            "told.succeeded-3.hook"
        ]
    );
    let first = told[0].json();
    assert_eq!(first["event"], "retry", "{first}");
    assert!(
        first["detail"]
            .as_str()
            .unwrap()
            .contains("attempt 1 failed"),
        "{first}"
    );
}

#[test]
fn update_and_restart_change_only_their_owners_queued_or_ended_jobs() {
    let d = TestDaemon::start("update");
    d.drop_job(
        ALICE,
        "u.json",
        r#"{"version": 1, "command": ["sh", "-c", "echo run $PTRAIN_ATTEMPT"], "hold": true}"#,
    );
    wait_for("u to be held", WAIT, || is_held(&d, "u").then_some(()));
    let out = d.ptrain(BOB, &["update", "u", "--priority", "50"]);
    assert!(
        !out.status.success() && text(&out).contains("only its owner or root may update"),
        "{}",
        text(&out)
    );
    let out = d.ptrain(ALICE, &["update", "u", "--priority", "500"]);
    assert!(
        !out.status.success() && text(&out).contains("field `priority`"),
        "{}",
        text(&out)
    );
    let out = d.ptrain(
        ALICE,
        &[
            "update",
            "u",
            "--priority",
            "50",
            "--timeout",
            "1h",
            "--begin",
            "1h",
        ],
    );
    assert!(
        out.status.success() && text(&out).contains("job u updated"),
        "{}",
        text(&out)
    );
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let view = d.status("u").unwrap();
    assert_eq!(
        (view["priority"].clone(), view["timeout_secs"].clone()),
        (50.into(), 3600.into()),
        "{view}"
    );
    let begin_at = view["begin_at"].as_u64().unwrap();
    assert!(begin_at > now + 3_500_000_000, "{view}");
    // Kept across a restart of ptraind.
    kill_9_once(&d);
    let view = wait_for("ptraind to know u again", WAIT, || d.status("u"));
    assert_eq!(view["begin_at"].as_u64(), Some(begin_at), "{view}");
    assert_eq!(view["priority"], 50, "{view}");
    // Sooner, then released: it starts at its new begin.
    d.ptrain(ALICE, &["update", "u", "--begin", "2s"]);
    let begin_at = d.status("u").unwrap()["begin_at"].as_u64().unwrap();
    d.ptrain(ALICE, &["release", "u"]);
    let end = d.wait_ended("u");
    assert_eq!(end["status"], "succeeded", "{end}");
    assert!(end["started_at"].as_u64().unwrap() >= begin_at, "{end}");
    let out = d.ptrain(ALICE, &["update", "u", "--priority", "1"]);
    assert!(text(&out).contains("is not queued"), "{}", text(&out));

    // Restarted: its next attempt under its id, then a new job.
    let out = d.ptrain(BOB, &["restart", "u"]);
    assert!(!out.status.success(), "{}", text(&out));
    let out = d.ptrain(ALICE, &["restart", "u"]);
    assert!(
        out.status.success() && text(&out).contains("queued again as attempt 2"),
        "{}",
        text(&out)
    );
    let end = wait_for("u's second attempt to end", WAIT, || {
        d.status("u")
            .filter(|v| v["status"] == "succeeded" && v["attempt"] == 2)
    });
    assert!(
        end["attempts"][0]["why"]
            .as_str()
            .unwrap()
            .contains("restarted by ptrain-alice"),
        "{end}"
    );
    let out = d.ptrain(ALICE, &["logs", "u", "--attempt", "2"]);
    assert!(text(&out).contains("run 2"), "{}", text(&out));
    let out = d.ptrain(ALICE, &["restart", "u", "--as", "u2"]);
    assert!(text(&out).contains("restarted as job u2"), "{}", text(&out));
    let end = d.wait_ended("u2");
    assert_eq!(
        (end["status"].clone(), end["attempt"].clone()),
        ("succeeded".into(), 1.into()),
        "{end}"
    );
    let out = d.ptrain(ALICE, &["restart", "u", "--as", "u2"]);
    assert!(text(&out).contains("already exists"), "{}", text(&out));
    d.drop_job(
        ALICE,
        "long.json",
        r#"{"version": 1, "command": ["sleep", "600"]}"#,
    );
    d.wait_running("long");
    let out = d.ptrain(ALICE, &["restart", "long"]);
    assert!(text(&out).contains("has not ended"), "{}", text(&out));
}

#[test]
fn preemption_stops_the_preemptible_job_with_its_checkpoint_signal_runs_the_urgent_one_and_requeues_it_in_its_place_across_a_kill_9(
) {
    let d = TestDaemon::start_with(
        "preempt",
        crate::daemon::Opts {
            gpus: 2,
            extra_config: "[policy]\npreempt = true\n".into(),
            ..crate::daemon::Opts::default()
        },
    );
    let work = d.workdir(ALICE);
    let keep = serde_json::json!({"version": 1, "gpus": 1, "command": ["sleep", "600"]});
    let low = serde_json::json!({"version": 1, "workdir": work, "gpus": 1,
        "preemptible": true, "checkpoint_signal": "SIGUSR1", "checkpoint_lead": "2s",
        "command": ["/bin/sh", "-c",
            "echo $PTRAIN_ATTEMPT >> low.attempts; trap 'echo saved >> low.ckpt' USR1; while :; do sleep 0.2; done"]});
    d.drop_job(ALICE, "keep.json", &keep.to_string());
    d.wait_running("keep");
    d.drop_job(ALICE, "low.json", &low.to_string());
    d.wait_running("low");
    // Arrived after low: behind it once it is queued again.
    d.drop_job(
        BOB,
        "later.json",
        r#"{"version": 1, "gpus": 1, "command": ["true"]}"#,
    );
    wait_for("later to be queued", WAIT, || {
        d.status("later").filter(|v| v["status"] == "queued")
    });
    d.drop_job(
        BOB,
        "urgent.json",
        r#"{"version": 1, "gpus": 1, "priority": 10, "command": ["sleep", "2"]}"#,
    );
    // Inside low's checkpoint lead, its stop planned but not yet made:
    // a kill -9 here must neither forget the stop nor make it twice,
    // nor lose that low goes back to the queue.
    wait_for("low's checkpoint signal", WAIT, || {
        std::fs::metadata(work.join("low.ckpt")).ok()
    });
    assert!(
        d.status("low").unwrap()["checkpoint_sent_at"].is_u64(),
        "the signal is recorded before it is sent"
    );
    kill_9_once(&d);
    let end = d.wait_ended("urgent");
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(
        std::fs::read_to_string(work.join("low.ckpt")).unwrap(),
        "saved\n",
        "low got its checkpoint signal before its stop"
    );
    // low runs again as its next attempt, before `later`, which arrived
    // after it; `keep`, not preemptible, was never touched.
    let again = wait_for("low's second attempt to run", WAIT, || {
        d.status("low")
            .filter(|v| v["status"] == "running" && v["attempt"] == 2)
    });
    assert!(
        again["attempts"][0]["why"]
            .as_str()
            .unwrap()
            .contains("preempted for job urgent"),
        "{again}"
    );
    assert_eq!(d.status("later").unwrap()["status"], "queued");
    let keep = d.status("keep").unwrap();
    assert_eq!(
        (keep["status"].clone(), keep["attempt"].clone()),
        ("running".into(), 1.into()),
        "{keep}"
    );
    wait_for("low's second attempt to note itself", WAIT, || {
        (std::fs::read_to_string(work.join("low.attempts")).ok()? == "1\n2\n").then_some(())
    });
    d.ptrain(ALICE, &["stop", "low", "keep"]);
    assert_eq!(d.wait_ended("later")["status"], "succeeded");
}
