//! What the CLI promises its user, on the real systemd: `wait` and
//! `submit --wait` follow any number of jobs to their end, `submit` reports
//! what ptraind decided about the very file it published, a closed pipe
//! ends a command quietly, and text other users control reaches a terminal
//! only escaped.

use std::io::BufRead;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::daemon::{chown, text, TestDaemon, ALICE, BOB, PTRAIN, WAIT};
use crate::harness::wait_for;

/// How long a `ptrain` run may take before it counts as hung: it runs under
/// timeout(1), so a hang fails the test (exit 124) instead of hanging it.
const HANG_LIMIT_SECS: u32 = 120;

/// `timeout HANG_LIMIT_SECS ptrain --config … ARGS` inside the harness as
/// `user`.
fn ptrain_bounded(d: &TestDaemon, user: &str, args: &[&str]) -> Output {
    let limit = HANG_LIMIT_SECS.to_string();
    let mut full = vec![
        limit.as_str(),
        PTRAIN,
        "--config",
        d.config.to_str().unwrap(),
    ];
    full.extend_from_slice(args);
    let out = if user == "root" {
        d.harness.command("timeout").args(&full).output().unwrap()
    } else {
        d.as_user(user, "timeout", &full)
    };
    assert_ne!(
        out.status.code(),
        Some(124),
        "ptrain {args:?} hung for {HANG_LIMIT_SECS} s: {}",
        text(&out)
    );
    out
}

/// Writes a job file into the user's workdir, owned by them; returns its path.
fn job_file(d: &TestDaemon, user: &str, name: &str, spec: &Value) -> String {
    let path = d.workdir(user).join(name);
    std::fs::write(&path, spec.to_string()).unwrap();
    chown(&path, user);
    path.display().to_string()
}

/// 150 jobs that each change state three or four times within a few
/// seconds: the CLI used to stop reading D-Bus while it queried each job,
/// zbus's queue of 64 signals filled, and the replies it waited for queued
/// behind them for ever.
#[test]
fn wait_follows_a_burst_of_150_jobs_to_their_end() {
    let d = TestDaemon::start("wait-burst");
    let n = 150;
    let values: Vec<usize> = (0..n).collect();
    let sweep = job_file(
        &d,
        ALICE,
        "burst.json",
        &json!({"version": 1, "command": ["true"], "sweep": {"i": values}}),
    );
    let out = ptrain_bounded(&d, ALICE, &["submit", &sweep, "--wait"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("burst-i149: succeeded"),
        "{}",
        text(&out)
    );

    // `ptrain wait` on 150 named ids, started while they are launching,
    // and one with a failure among them: the worst outcome decides.
    let sweep = job_file(
        &d,
        ALICE,
        "storm.json",
        &json!({"version": 1, "command": ["/bin/sh", "-c", "exit {code}"],
                "sweep": {"code": [0, 0, 0, 0, 0, 0, 0, 0, 0, 3], "k": (0..15).collect::<Vec<_>>()}}),
    );
    let out = d.ptrain(ALICE, &["submit", &sweep]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let list: Vec<Value> =
        serde_json::from_slice(&d.ptrain("root", &["list", "--all", "--json"]).stdout).unwrap();
    let ids: Vec<String> = list
        .iter()
        .filter(|j| j["group"] == "storm")
        .map(|j| j["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 150, "{list:?}");
    let mut args = vec!["wait"];
    args.extend(ids.iter().map(String::as_str));
    let out = ptrain_bounded(&d, BOB, &args);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    for id in &ids {
        let s = d.status(id).unwrap();
        assert!(
            matches!(s["status"].as_str(), Some("succeeded" | "failed")),
            "{id}: {s}"
        );
    }

    // Everything ended: a second wait returns at once, by the sweep's id.
    let out = ptrain_bounded(&d, "root", &["wait", "burst", "storm"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
}

/// Every listener sees one job's changes in the order they happened:
/// ptraind used to emit each JobChanged from a task of its own, so on its
/// multi-threaded runtime a job's "running" could arrive after its
/// "succeeded".
#[test]
fn job_changed_signals_arrive_in_order() {
    use futures_util::StreamExt;
    let d = TestDaemon::start("signal-order");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let address = d.harness.bus_address();
    let mut changes = rt.block_on(async {
        let conn = zbus::connection::Builder::address(address.as_str())
            .build()
            .await
            .unwrap();
        let proxy = ptrain::api::Daemon1Proxy::new(&conn).await.unwrap();
        let changes = proxy.receive_job_changed().await.unwrap();
        (conn, changes)
    });
    let n = 150;
    let sweep = job_file(
        &d,
        ALICE,
        "order.json",
        &json!({"version": 1, "command": ["true"], "sweep": {"i": (0..n).collect::<Vec<_>>()}}),
    );
    let out = d.ptrain(ALICE, &["submit", &sweep]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rank = |s: &str| match s {
        "queued" => 0,
        "launching" => 1,
        "running" => 2,
        _ => 3,
    };
    let seen = rt.block_on(async {
        let mut seen: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        let mut ended = 0;
        while ended < n {
            let next = tokio::time::timeout(Duration::from_secs(60), changes.1.next());
            let signal = next.await.expect("JobChanged signals stopped").unwrap();
            let args = signal.args().unwrap();
            if rank(&args.status) == 3 {
                ended += 1;
            }
            seen.entry(args.id.clone())
                .or_default()
                .push(args.status.clone());
        }
        seen
    });
    for (id, statuses) in &seen {
        assert!(
            statuses.windows(2).all(|w| rank(&w[0]) <= rank(&w[1])),
            "{id}: {statuses:?}"
        );
    }
}

/// A job that ends while ptraind is down: no JobChanged signal may ever
/// tell of it, so `wait` must look again once ptraind's bus name has a new
/// owner, well before its periodic recheck (15 s).
#[test]
fn wait_looks_again_when_ptraind_comes_back() {
    let d = TestDaemon::start("wait-restart");
    let gate = d.workdir(ALICE).join("gate");
    let job = job_file(
        &d,
        ALICE,
        "held.json",
        &json!({"version": 1, "workdir": d.workdir(ALICE),
                "command": ["/bin/sh", "-c",
                    format!("while [ ! -e {} ]; do sleep 0.1; done; exit 3", gate.display())]}),
    );
    let out = d.ptrain(ALICE, &["submit", &job]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    d.wait_running("held");
    let limit = HANG_LIMIT_SECS.to_string();
    let config = d.config.display().to_string();
    let mut waiter = d
        .harness
        .command("runuser")
        .args([
            "-u", BOB, "--", "timeout", &limit, PTRAIN, "--config", &config,
        ])
        .args(["wait", "held"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its first look is done once it printed the job's state.
    let mut first = String::new();
    std::io::BufReader::new(waiter.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert_eq!(first.trim(), "held: running");

    let (ok, out) = d.harness.systemctl(&["stop", "ptraind.service"]);
    assert!(ok, "{out}");
    // A file submitted meanwhile: `submit` says ptraind is down and that
    // the file waits; it is claimed once ptraind is back.
    let late = job_file(
        &d,
        ALICE,
        "late.json",
        &json!({"version": 1, "command": ["true"]}),
    );
    let out = d.ptrain(ALICE, &["submit", &late]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        text(&out).contains(
            "ptraind is not running, so nothing has checked late.json yet: it waits in the spool"
        ),
        "{}",
        text(&out)
    );
    std::fs::write(&gate, "").unwrap();
    wait_for("the job to end while ptraind is down", WAIT, || {
        (d.unit_property("ptrain-job@held.service", "ActiveState") != "active").then_some(())
    });
    d.start_service();
    let started = Instant::now();
    let status = wait_for(
        "ptrain wait to see the job ended",
        Duration::from_secs(10),
        || waiter.try_wait().unwrap(),
    );
    let out = waiter.wait_with_output().unwrap();
    let said = format!("{first}{}", text(&out));
    assert_eq!(
        status.code(),
        Some(4),
        "after {:.1?}: {said}",
        started.elapsed()
    );
    // Bob waits on Alice's job: he sees its status, not its detail
    // ([privacy]).
    assert!(said.contains("held: failed"), "{said}");
    assert_eq!(d.wait_ended("late")["status"], "succeeded");
}

/// Bob's file named like Alice's running job is refused; `submit` must say
/// so, not report Alice's job as his.
#[test]
fn submit_reports_the_refusal_of_its_own_file_not_a_namesake() {
    let d = TestDaemon::start("submit-namesake");
    // Alice's job ends within the CLI's 10 s confirmation window: its state
    // changes are what the CLI used to take for Bob's acceptance.
    let alice = job_file(
        &d,
        ALICE,
        "same.json",
        &json!({"version": 1, "command": ["sleep", "3"]}),
    );
    let out = d.ptrain(ALICE, &["submit", &alice]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("accepted"), "{}", text(&out));

    let bob = job_file(
        &d,
        BOB,
        "same.json",
        &json!({"version": 1, "command": ["echo", "bob"]}),
    );
    let out = ptrain_bounded(&d, BOB, &["submit", &bob, "--wait"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(!said.contains("accepted"), "{said}");
    assert!(
        said.contains("refused") && said.contains("already exists"),
        "{said}"
    );
    let job = d.wait_ended("same");
    assert_eq!(job["owner"], ALICE, "{job}");

    // Alice submits the same file twice while the first one runs: the
    // second is refused, and her first job is not reported as it.
    let first = job_file(
        &d,
        ALICE,
        "twice.json",
        &json!({"version": 1, "command": ["sleep", "3"]}),
    );
    let out = d.ptrain(ALICE, &["submit", &first]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = ptrain_bounded(&d, ALICE, &["submit", &first, "--wait"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(!said.contains("accepted"), "{said}");
    assert!(said.contains("already exists"), "{said}");
    // Without --wait too.
    let out = ptrain_bounded(&d, ALICE, &["submit", &first]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(!text(&out).contains("accepted"), "{}", text(&out));
    // And a file that is accepted is still reported as accepted.
    let fresh = job_file(
        &d,
        ALICE,
        "fresh.json",
        &json!({"version": 1, "command": ["true"]}),
    );
    let out = ptrain_bounded(&d, ALICE, &["submit", &fresh, "--wait"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("accepted job fresh"), "{}", text(&out));
}

/// Runs `ptrain ARGS` as root with stdout a pipe whose reader is already
/// gone, so its first write fails with EPIPE.
fn ptrain_into_closed_pipe(d: &TestDaemon, args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    d.harness
        .command(PTRAIN)
        .arg("--config")
        .arg(&d.config)
        .args(args)
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn a_closed_pipe_ends_every_command_quietly() {
    let d = TestDaemon::start("epipe");
    let job = job_file(
        &d,
        ALICE,
        "piped.json",
        &json!({"version": 1, "command": ["echo", "hello"]}),
    );
    let out = d.ptrain(ALICE, &["submit", &job]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    d.wait_ended("piped");
    for args in [
        &["list", "--all"][..],
        &["list", "--json"],
        &["list", "--tree"],
        &["status", "piped"],
        &["status", "piped", "--json"],
        &["rejected"],
        &["gpus"],
        &["du"],
        &["logs", "piped"],
        &["logs", "-f", "piped"],
        &["notifications"],
        &["wait", "piped"],
        &["--help"],
    ] {
        let out = ptrain_into_closed_pipe(&d, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
            "ptrain {args:?} on a closed pipe: {stderr}"
        );
        // `wait` still tells how the job ended.
        if args[0] == "wait" {
            assert_eq!(out.status.code(), Some(0), "{stderr}");
        }
    }
    // The common case, through a shell.
    let script = format!(
        "{PTRAIN} --config {} list --all | head -c 1 >/dev/null",
        d.config.display()
    );
    let out = d
        .harness
        .command("/bin/sh")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(!text(&out).contains("panicked"), "{}", text(&out));
}

/// A job whose command sets the terminal's title and clears the screen;
/// whoever looks at it (another user, root) sees the escapes spelled out.
#[test]
fn other_users_text_reaches_the_terminal_escaped() {
    // Others see a job's command only with the admin's consent.
    let d = TestDaemon::start_with(
        "escapes",
        crate::daemon::Opts {
            extra_config: "[privacy]\nshow_all_jobs = true\n".into(),
            ..Default::default()
        },
    );
    let evil = json!({
        "version": 1,
        "command": ["/bin/sh", "-c", "exit 3", "\u{1b}]0;pwn\u{7}", "\u{1b}[2J", "\u{202e}txt.exe"],
        "env": {"NOTE": "\u{1b}[31mred"},
    });
    let file = job_file(&d, ALICE, "evil.json", &evil);
    let out = d.ptrain(ALICE, &["submit", &file]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    d.wait_ended("evil");
    for user in [BOB, "root", ALICE] {
        for args in [
            &["status", "evil"][..],
            &["list"],
            &["list", "--all"],
            &["list", "--tree"],
        ] {
            let out = d.ptrain(user, args);
            assert_eq!(out.status.code(), Some(0), "{}", text(&out));
            let shown = &out.stdout;
            assert!(
                !shown.iter().any(|&b| b == 0x1b || b == 0x07),
                "{user} ptrain {args:?} printed raw control bytes: {:?}",
                String::from_utf8_lossy(shown)
            );
            assert!(
                !String::from_utf8_lossy(shown).contains('\u{202e}'),
                "{user} ptrain {args:?} printed a raw bidi override"
            );
            if args[0] == "status" {
                let shown = String::from_utf8_lossy(shown);
                assert!(shown.contains(r"\x1b]0;pwn\x07"), "{shown}");
                assert!(shown.contains(r"\x1b[2J"), "{shown}");
                assert!(shown.contains(r"\u{202e}txt.exe"), "{shown}");
            }
        }
    }
    // JSON stays exact: the command as submitted, once decoded.
    let s = d.status("evil").unwrap();
    assert_eq!(s["command"], evil["command"], "{s}");

    // A refused file's reason quotes what its owner wrote; as its owner
    // and root see it.
    d.drop_job(
        ALICE,
        "raw.json",
        "{\"version\": 1, \"command\": [\"true\"], \"bogus\u{1b}[2J\": 1}",
    );
    d.wait_rejected(ALICE, "raw.json");
    for user in [ALICE, "root"] {
        let out = d.ptrain(user, &["rejected"]);
        assert!(
            !out.stdout.contains(&0x1b),
            "{user} ptrain rejected printed a raw ESC: {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// The ids `ptrain list ARGS --json` shows to `user`, sorted.
fn listed_ids(d: &TestDaemon, user: &str, args: &[&str]) -> Vec<String> {
    let mut full = vec!["list", "--json"];
    full.extend_from_slice(args);
    let out = d.ptrain(user, &full);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
    let jobs: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let mut ids: Vec<String> = jobs
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

/// Submits `spec` as `user`'s `ID.json`; returns once ptraind accepted it.
fn submit(d: &TestDaemon, user: &str, id: &str, spec: Value) {
    let file = job_file(d, user, &format!("{id}.json"), &spec);
    let out = d.ptrain(user, &["submit", &file]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn list_filters_by_user_status_and_mine() {
    let d = TestDaemon::start("list-filters");
    submit(
        &d,
        ALICE,
        "a-ok",
        json!({"version": 1, "command": ["true"]}),
    );
    submit(
        &d,
        ALICE,
        "a-fail",
        json!({"version": 1, "command": ["/bin/sh", "-c", "exit 3"]}),
    );
    submit(
        &d,
        BOB,
        "b-run",
        json!({"version": 1, "command": ["sleep", "300"]}),
    );
    d.wait_ended("a-ok");
    d.wait_ended("a-fail");
    d.wait_running("b-run");
    let (alice_uid, _) = crate::harness::ensure_user(ALICE);
    let alice_uid = alice_uid.to_string();

    assert_eq!(listed_ids(&d, ALICE, &["--mine"]), ["a-fail", "a-ok"]);
    assert_eq!(listed_ids(&d, ALICE, &["--user", BOB]), ["b-run"]);
    assert_eq!(
        listed_ids(&d, BOB, &["--user", &alice_uid, "--status", "failed"]),
        ["a-fail"]
    );
    assert_eq!(
        listed_ids(&d, "root", &["--status", "running,succeeded"]),
        ["a-ok", "b-run"]
    );
    assert_eq!(
        listed_ids(&d, "root", &["--status", "running", "--status", "failed"]),
        ["a-fail", "b-run"]
    );
    assert_eq!(
        listed_ids(&d, ALICE, &["--all", "--mine", "--status", "failed"]),
        ["a-fail"]
    );
    // --recent counts the ends the filter keeps; active jobs always show.
    assert_eq!(
        listed_ids(&d, ALICE, &["--mine", "--recent", "0"]),
        Vec::<String>::new()
    );
    assert_eq!(listed_ids(&d, ALICE, &["--mine", "--recent", "1"]).len(), 1);
    assert_eq!(
        listed_ids(&d, ALICE, &["--user", BOB, "--recent", "0"]),
        ["b-run"]
    );

    // The table and the tree filter alike.
    for args in [&["list", "--mine"][..], &["list", "--mine", "--tree"]] {
        let out = d.ptrain(ALICE, args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            shown.contains("a-fail") && shown.contains("a-ok"),
            "{args:?}: {shown}"
        );
        assert!(!shown.contains("b-run"), "{args:?}: {shown}");
    }

    // An unknown status word is bad usage and names the valid ones.
    let out = d.ptrain(ALICE, &["list", "--status", "finished"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    for word in [
        "queued",
        "running",
        "succeeded",
        "failed",
        "dependency-failed",
    ] {
        assert!(text(&out).contains(word), "{word}: {}", text(&out));
    }
    // What the shell completions offer for a job id: the hidden command.
    let out = d.ptrain(BOB, &["__complete-ids"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .collect::<Vec<_>>(),
        ["a-fail", "a-ok", "b-run"]
    );

    let out = d.ptrain(ALICE, &["list", "--user", "ptrain-nosuch"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("no user"), "{}", text(&out));
}

#[test]
fn stop_takes_many_ids_and_a_user() {
    let d = TestDaemon::start("stop-many");
    let sleeper = json!({"version": 1, "command": ["sleep", "300"]});
    for id in ["s1", "s2"] {
        submit(&d, ALICE, id, sleeper.clone());
    }
    submit(&d, BOB, "b1", sleeper.clone());
    for id in ["s1", "s2", "b1"] {
        d.wait_running(id);
    }

    // One of three is Alice's: it is stopped, the others are named with why.
    let out = d.ptrain(ALICE, &["stop", "s1", "b1", "nosuch"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.contains("s1"), "{stdout}");
    assert!(stderr.contains("job b1 belongs to ptrain-bob"), "{stderr}");
    assert!(stderr.contains("no job \"nosuch\""), "{stderr}");
    assert!(
        stderr.contains("2 of 3 not stopped: b1, nosuch"),
        "{stderr}"
    );
    assert_eq!(d.wait_ended("s1")["status"], "stopped");
    assert_eq!(d.status("b1").unwrap()["status"], "running");

    // Only root or the user themself stops all of a user's jobs.
    let out = d.ptrain(ALICE, &["stop", "--user", BOB]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("only root or ptrain-bob"),
        "{}",
        text(&out)
    );
    assert_eq!(d.status("b1").unwrap()["status"], "running");

    let out = d.ptrain(ALICE, &["stop", "--user", ALICE]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("s2"), "{}", text(&out));
    assert_eq!(d.wait_ended("s2")["status"], "stopped");
    let out = d.ptrain("root", &["stop", "--user", BOB]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(d.wait_ended("b1")["status"], "stopped");

    let out = d.ptrain(ALICE, &["stop", "--user", ALICE]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("ptrain-alice has no queued or running jobs"),
        "{}",
        text(&out)
    );
}

/// A job's `name` and `comment` reach `status` (text and JSON) and `list
/// --json`, also once it ended; others see them only as they see the
/// command.
#[test]
fn status_and_list_show_a_jobs_name_and_comment() {
    let d = TestDaemon::start("name-comment");
    submit(
        &d,
        ALICE,
        "named",
        json!({"version": 1, "command": ["true"],
               "name": "ResNet-50 baseline", "comment": "lr 0.1, for the ablation"}),
    );
    submit(
        &d,
        ALICE,
        "plain",
        json!({"version": 1, "command": ["true"]}),
    );
    d.wait_ended("named");
    d.wait_ended("plain");

    let out = d.ptrain(ALICE, &["status", "named"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let shown = text(&out);
    assert!(shown.contains("name:      ResNet-50 baseline\n"), "{shown}");
    assert!(
        shown.contains("comment:   lr 0.1, for the ablation\n"),
        "{shown}"
    );
    let out = d.ptrain(ALICE, &["status", "plain"]);
    assert!(!text(&out).contains("name:"), "{}", text(&out));

    let s = d.status("named").unwrap();
    assert_eq!(s["name"], "ResNet-50 baseline", "{s}");
    assert_eq!(s["comment"], "lr 0.1, for the ablation", "{s}");
    let out = d.ptrain(ALICE, &["list", "--json"]);
    let list: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let named = list.iter().find(|j| j["id"] == "named").expect("listed");
    assert_eq!(named["name"], "ResNet-50 baseline", "{named}");
    assert!(list
        .iter()
        .any(|j| j["id"] == "plain" && j["name"].is_null()));

    let table = text(&d.ptrain(ALICE, &["list"]));
    assert!(table.contains("[ResNet-50 baseline]"), "{table}");
    // Bob sees neither, as he does not see the command.
    let table = text(&d.ptrain(BOB, &["list"]));
    assert!(!table.contains("ResNet"), "{table}");
    let out = d.ptrain(BOB, &["status", "named", "--json"]);
    assert!(!text(&out).contains("ResNet"), "{}", text(&out));
    let out = d.ptrain(BOB, &["list", "--json"]);
    assert!(!text(&out).contains("ResNet"), "{}", text(&out));

    // An invalid one is refused at submit with the field and the fix.
    let file = job_file(
        &d,
        ALICE,
        "badname.json",
        &json!({"version": 1, "command": ["true"], "name": "two\nlines"}),
    );
    let out = d.ptrain(ALICE, &["submit", &file]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("field `name` holds U+000A"),
        "{}",
        text(&out)
    );
}

/// `submit --export`: the job runs with the submitter's variables (a
/// venv's PATH finds its programs), its own `env` winning; a variable the
/// job may not set is refused before anything is dropped.
#[test]
fn submit_export_copies_the_submitters_variables() {
    use std::os::unix::fs::PermissionsExt;
    let d = TestDaemon::start("submit-export");
    let venv_bin = d.workdir(ALICE).join("venv/bin");
    std::fs::create_dir_all(&venv_bin).unwrap();
    let program = venv_bin.join("hello-venv");
    std::fs::write(&program, "#!/bin/sh\necho \"venv says $MYVAR $MODE\"\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", venv_bin.display());
    let file = job_file(
        &d,
        ALICE,
        "exported.json",
        &json!({"version": 1, "command": ["hello-venv"], "workdir": d.workdir(ALICE),
                "env": {"MODE": "from-the-file"}}),
    );
    let submit_with = |export: &str, file: &str| {
        let config = d.config.display().to_string();
        d.as_user(
            ALICE,
            "env",
            &[
                &format!("PATH={path}"),
                "MYVAR=from-the-shell",
                "MODE=from-the-shell",
                "PTRAIN_NOT_FOR_JOBS=1",
                PTRAIN,
                "--config",
                &config,
                "submit",
                "--export",
                export,
                file,
            ],
        )
    };
    let out = submit_with("PATH,MYVAR,MODE", &file);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(d.wait_ended("exported")["status"], "succeeded");
    let said = wait_for("the job's output in the journal", WAIT, || {
        let out = d.ptrain(ALICE, &["logs", "exported"]);
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        said.contains("venv says").then_some(said)
    });
    assert!(
        said.contains("venv says from-the-shell from-the-file"),
        "{said}"
    );

    // A name the descriptor forbids is refused, nothing dropped.
    let out = submit_with("PATH,LD_PRELOAD", &file);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("a job may not set LD_PRELOAD"),
        "{}",
        text(&out)
    );
    // ALL leaves out what the job may not set (PTRAIN_*, USER) and says so.
    let all = job_file(
        &d,
        ALICE,
        "all.json",
        &json!({"version": 1, "command": ["hello-venv"], "workdir": d.workdir(ALICE)}),
    );
    let out = submit_with("ALL", &all);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("--export ALL leaves out"),
        "{}",
        text(&out)
    );
    assert!(text(&out).contains("PTRAIN_NOT_FOR_JOBS"), "{}", text(&out));
    assert_eq!(d.wait_ended("all")["status"], "succeeded");
}

/// A user who cannot read the config (root-only, a spool elsewhere than
/// the default) still submits: ptraind tells where its spool is. With
/// ptraind down too, `submit` says it falls back to the default, naming
/// both reasons.
#[test]
fn submit_asks_ptraind_for_the_spool_when_the_config_is_unreadable() {
    use std::os::unix::fs::PermissionsExt;
    let d = TestDaemon::start("spool-from-bus");
    std::fs::set_permissions(&d.config, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = d.as_user(ALICE, "cat", &[d.config.to_str().unwrap()]);
    assert!(
        !out.status.success(),
        "the config is still readable to Alice"
    );
    assert_ne!(d.spool, std::path::Path::new("/var/spool/ptrain"));

    let out = d
        .harness
        .command("busctl")
        .args([
            "--system",
            "get-property",
            ptrain::DBUS_NAME,
            ptrain::DBUS_PATH,
            ptrain::DBUS_NAME,
            "SpoolDir",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("s {:?}", d.spool.display().to_string()),
        "{}",
        text(&out)
    );

    let file = job_file(
        &d,
        ALICE,
        "hidden-config.json",
        &json!({"version": 1, "command": ["true"]}),
    );
    let out = d.ptrain(ALICE, &["submit", &file]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("as {}/hidden-config.json", d.spool.display())),
        "{}",
        text(&out)
    );
    assert_eq!(d.wait_ended("hidden-config")["status"], "succeeded");

    // Neither the config nor ptraind: the default, and a note naming both.
    // (Only where no real spool is at the default, so nothing lands there.)
    if !std::path::Path::new("/var/spool/ptrain").exists() {
        let (ok, said) = d.harness.systemctl(&["stop", "ptraind.service"]);
        assert!(ok, "{said}");
        let out = d.ptrain(ALICE, &["submit", &file]);
        assert_ne!(out.status.code(), Some(0), "{}", text(&out));
        let said = text(&out);
        assert!(said.contains("cannot read the config"), "{said}");
        assert!(said.contains("cannot ask ptraind"), "{said}");
        assert!(
            said.contains("dropping the job into the default spool /var/spool/ptrain"),
            "{said}"
        );
    }
}
