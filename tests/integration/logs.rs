//! Issue 8: following a job's output, the idle-output watchdog, archives
//! that outlive the journal, and their safe creation.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::daemon::{chown, text, Opts, TestDaemon, ALICE, BOB, PTRAIN, WAIT};
use crate::harness::{ensure_user, wait_for};

fn job(work: &Path, cmd: &str, extra: Value) -> String {
    let mut j = json!({"version": 1, "command": ["/bin/sh", "-c", cmd], "workdir": work});
    for (k, v) in extra.as_object().unwrap() {
        j[k] = v.clone();
    }
    j.to_string()
}

/// A FIFO in `user`'s workdir: the job blocks reading it until the test
/// opens it ([`release`]), so the test decides when the job goes on.
fn gate(d: &TestDaemon, user: &str, name: &str) -> PathBuf {
    let path = d.workdir(user).join(name);
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o600) },
        0,
        "mkfifo {path:?}"
    );
    chown(&path, user);
    path
}

/// Lets a job blocked on `gate` go on (waits until it is reading).
fn release(gate: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    let mut fifo = wait_for(&format!("a job to read {gate:?}"), WAIT, || {
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(gate)
            .ok()
    });
    fifo.write_all(b"go\n").unwrap();
}

/// `ptrain logs ARGS` as `user`, running, with its stdout lines on a channel.
fn spawn_logs(d: &TestDaemon, user: &str, args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut cmd = d.harness.command("runuser");
    cmd.args([
        "-u",
        user,
        "--",
        PTRAIN,
        "--config",
        d.config.to_str().unwrap(),
        "logs",
    ])
    .args(args)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

fn next_line(rx: &mpsc::Receiver<String>, what: &str) -> String {
    rx.recv_timeout(WAIT)
        .unwrap_or_else(|e| panic!("no line from `ptrain logs -f` while waiting for {what}: {e}"))
}

fn lines_of(out: &std::process::Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn log_dir(d: &TestDaemon) -> PathBuf {
    d.root.join("log")
}

fn uid(user: &str) -> u32 {
    ensure_user(user).0
}

/// The path of a job's archive once it exists (`NAME` or `NAME-N`).
/// The archives' floor for tests that need their output archived: the
/// default (10% of the disk, at most 4 GiB) can exceed what a CI machine
/// has free after its build, and the floor is not what they test.
pub const LOW_FLOOR: &str = "[logs]\nmin_free = \"1%\"\n";

fn wait_archive(d: &TestDaemon, user: &str, id: &str) -> PathBuf {
    let dir = log_dir(d).join(uid(user).to_string());
    wait_for(&format!("the archive of {id}"), WAIT, || {
        std::fs::read_dir(&dir).ok()?.flatten().find_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let ours = name.starts_with(&format!("{id}."))
                && name.ends_with(".log.gz")
                && e.file_type().ok()?.is_file();
            ours.then(|| e.path())
        })
    })
}

fn gunzip(path: &Path) -> String {
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    text
}

#[test]
fn owner_follows_a_queued_job_live_until_it_ends() {
    let d = TestDaemon::start("logs-follow");
    let work = d.workdir(ALICE);
    let (g0, g1, g2) = (
        gate(&d, ALICE, "gate0"),
        gate(&d, ALICE, "gate1"),
        gate(&d, ALICE, "gate2"),
    );
    d.drop_job(
        ALICE,
        "blocker.json",
        &job(&work, "read x < gate0", json!({})),
    );
    d.wait_running("blocker");
    d.drop_job(
        ALICE,
        "live.json",
        &job(
            &work,
            "echo first; read a < gate1; echo second; read b < gate2; echo last",
            json!({"after_ok": ["blocker"]}),
        ),
    );
    assert_eq!(d.wait_status("live", |s| s == "queued")["status"], "queued");
    // Followed by its owner (not root) while still queued.
    let (mut follower, lines) = spawn_logs(&d, ALICE, &["-f", "live"]);
    let denied = d.ptrain(BOB, &["logs", "-f", "live"]);
    assert_eq!(denied.status.code(), Some(1), "{}", text(&denied));
    release(&g0);
    assert_eq!(next_line(&lines, "first"), "first");
    // The job is blocked on gate1: "second" does not exist yet, so what
    // arrives next was written after the follower started.
    assert_eq!(d.status("live").unwrap()["status"], "running");
    release(&g1);
    assert_eq!(next_line(&lines, "second"), "second");
    release(&g2);
    assert_eq!(next_line(&lines, "last"), "last");
    let status = wait_for("`ptrain logs -f` to exit after the job", WAIT, || {
        follower.try_wait().unwrap()
    });
    let mut err = String::new();
    follower
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{status}: {err}");
    assert!(lines.recv_timeout(Duration::from_millis(1)).is_err());
    assert_eq!(d.status("live").unwrap()["status"], "succeeded");

    // The daemon's view of the job is in the journal under PTRAIN_JOB.
    let daemon_view = d.harness.journal(&["PTRAIN_JOB=live"]);
    for said in ["job accepted", "job running", "job ended"] {
        assert!(daemon_view.contains(said), "{said}: {daemon_view}");
    }
    // ...next to the job's own output (the unit's LogExtraFields).
    assert!(daemon_view.contains("second"), "{daemon_view}");
    let by_unit = d.harness.journal(&[
        "UNIT=ptrain-job@live.service",
        "_SYSTEMD_UNIT=ptraind.service",
    ]);
    assert!(by_unit.contains("job ended"), "{by_unit}");

    // Not following: everything at once, and -n tails.
    let all = d.ptrain(ALICE, &["logs", "live"]);
    assert_eq!(
        lines_of(&all),
        ["first", "second", "last"],
        "{}",
        text(&all)
    );
    let tail = d.ptrain(ALICE, &["logs", "-n", "1", "live"]);
    assert_eq!(lines_of(&tail), ["last"], "{}", text(&tail));
}

#[test]
fn silent_job_is_stopped_as_idle_timeout_and_chatty_job_is_not() {
    let d = TestDaemon::start_with(
        "logs-idle",
        Opts {
            gpus: 1,
            extra_config: "[jobs]\nidle_timeout = \"3s\"\n".into(),
            ..Opts::default()
        },
    );
    let work = d.workdir(ALICE);
    // The default idle_timeout (3s) applies to the silent job.
    d.drop_job(
        ALICE,
        "silent.json",
        &job(&work, "echo started; exec sleep 60", json!({"gpus": 1})),
    );
    d.drop_job(
        ALICE,
        "chatty.json",
        &job(
            &work,
            "for i in $(seq 1 20); do echo tick $i; sleep 0.3; done",
            json!({"idle_timeout": "3s"}),
        ),
    );
    d.drop_job(
        ALICE,
        "cleanup.json",
        &job(&work, "echo cleaning up", json!({"after_fail": ["silent"]})),
    );
    let silent = d.wait_ended("silent");
    assert_eq!(silent["status"], "idle-timeout", "{silent}");
    assert!(
        silent["detail"]
            .as_str()
            .unwrap()
            .contains("without output"),
        "{silent}"
    );
    let ran = silent["ended_at"].as_u64().unwrap() - silent["started_at"].as_u64().unwrap();
    assert!(
        ran >= 3_000_000,
        "stopped after {ran} µs, before its idle timeout"
    );
    let chatty = d.wait_ended("chatty");
    assert_eq!(chatty["status"], "succeeded", "{chatty}");
    let ran = chatty["ended_at"].as_u64().unwrap() - chatty["started_at"].as_u64().unwrap();
    assert!(ran > 3_000_000, "the chatty job ran only {ran} µs");
    // Its GPU is free again, its after_fail dependent ran.
    assert_eq!(d.wait_ended("cleanup")["status"], "succeeded");
    let gpus: Value =
        serde_json::from_slice(&d.ptrain("root", &["gpus", "--json"]).stdout).unwrap();
    assert!(gpus["gpus"][0]["held_by"].is_null(), "{gpus}");
    // `ptrain wait` reports a timeout (exit 5).
    let waited = d.ptrain(ALICE, &["wait", "silent"]);
    assert_eq!(waited.status.code(), Some(5), "{}", text(&waited));
    let said = d.harness.journal(&["PTRAIN_JOB=silent"]);
    assert!(said.contains("stopping it (idle_timeout)"), "{said}");
    assert!(!d
        .harness
        .journal(&["PTRAIN_JOB=chatty"])
        .contains("idle_timeout"));
}

#[test]
fn archives_outlive_the_journal_and_keep_to_the_policy() {
    let d = TestDaemon::start_with(
        "logs-archive",
        Opts {
            // A nearly full build disk must not skip the archives.
            extra_config: "[logs]\nuser_max_count = 1\nmin_free = \"1%\"\n".into(),
            ..Opts::default()
        },
    );
    let work = d.workdir(ALICE);
    d.drop_job(ALICE, "old.json", &job(&work, "echo old output", json!({})));
    assert_eq!(d.wait_ended("old")["status"], "succeeded");
    let old = wait_archive(&d, ALICE, "old");
    assert!(gunzip(&old).contains("old output"));
    d.drop_job(
        ALICE,
        "kept.json",
        &job(
            &work,
            "for i in 1 2 3 4 5; do echo archived line $i; done",
            json!({}),
        ),
    );
    assert_eq!(d.wait_ended("kept")["status"], "succeeded");
    let kept = wait_archive(&d, ALICE, "kept");
    // One archive per user: the older one is removed.
    wait_for("the older archive to be removed", WAIT, || {
        (!old.exists()).then_some(())
    });
    // Root-only all the way down.
    for (path, mode) in [
        (log_dir(&d), 0o700),
        (kept.parent().unwrap().to_owned(), 0o700),
        (kept.clone(), 0o600),
    ] {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, mode), "{path:?}");
    }

    // The journal forgets the job.
    wait_for("the journal to be vacuumed", WAIT, || {
        d.harness
            .command("journalctl")
            .arg("--rotate")
            .output()
            .unwrap();
        d.harness
            .command("journalctl")
            .args(["-D", "/run/log/journal", "--vacuum-time=1s"])
            .output()
            .unwrap();
        d.harness
            .journal(&["_SYSTEMD_UNIT=ptrain-job@kept.service"])
            .trim()
            .is_empty()
            .then_some(())
    });
    // The owner still reads it, from the archive.
    let expected: Vec<String> = (1..=5).map(|i| format!("archived line {i}")).collect();
    let out = d.ptrain(ALICE, &["logs", "kept"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(lines_of(&out), expected);
    let out = d.ptrain(ALICE, &["logs", "-n", "2", "kept"]);
    assert_eq!(lines_of(&out), expected[3..]);
    let out = d.ptrain(ALICE, &["logs", "--since", "1h", "-f", "kept"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(lines_of(&out), expected);
    let out = d.ptrain(ALICE, &["logs", "--since", "2099-01-01 00:00:00", "kept"]);
    assert!(
        out.status.success() && out.stdout.is_empty(),
        "{}",
        text(&out)
    );
    let out = d.ptrain(ALICE, &["logs", "--since", "whenever", "kept"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    // Gone from both the journal and the archive: no error, and the one
    // line says where it went.
    let out = d.ptrain(ALICE, &["logs", "old"]);
    let lines = lines_of(&out);
    assert!(
        out.status.success()
            && lines.len() == 1
            && lines[0].starts_with("[ptrain] this job's output before ")
            && lines[0].contains("is no longer in the journal"),
        "{}",
        text(&out)
    );
    let denied = d.ptrain(BOB, &["logs", "kept"]);
    assert_eq!(denied.status.code(), Some(1), "{}", text(&denied));

    // `ptrain du`: the policy and the caller's own usage.
    let du: Value = serde_json::from_slice(&d.ptrain(ALICE, &["du", "--json"]).stdout).unwrap();
    assert_eq!(du["policy"]["user_max_count"], 1, "{du}");
    assert_eq!(du["users"].as_array().unwrap().len(), 1, "{du}");
    assert_eq!(du["users"][0]["user"], ALICE, "{du}");
    assert_eq!(du["users"][0]["count"], 1, "{du}");
    let shown = text(&d.ptrain(ALICE, &["du"]));
    assert!(
        shown.contains("max_count 1") && shown.contains(ALICE),
        "{shown}"
    );
    let bob_du: Value = serde_json::from_slice(&d.ptrain(BOB, &["du", "--json"]).stdout).unwrap();
    assert!(bob_du["users"].as_array().unwrap().is_empty(), "{bob_du}");
    // Nor do the totals count Alice's archives for him.
    assert_eq!(
        (&bob_du["count"], &bob_du["bytes"]),
        (&json!(0), &json!(0)),
        "{bob_du}"
    );
    assert_eq!(du["count"], 1, "{du}");
}

#[test]
fn planted_symlinks_in_the_log_dir_are_not_followed() {
    let d = TestDaemon::start_with(
        "logs-symlink",
        Opts {
            extra_config: LOW_FLOOR.into(),
            ..Opts::default()
        },
    );
    let work = d.workdir(ALICE);
    let victim = d.root.join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let g = gate(&d, ALICE, "gate");
    d.drop_job(
        ALICE,
        "target.json",
        &job(&work, "echo before; read x < gate; echo after", json!({})),
    );
    let running = d.wait_running("target");
    let inv = running["invocation_id"].as_str().unwrap().to_owned();
    // Plant a link where the archive will be written.
    let dir = log_dir(&d).join(uid(ALICE).to_string());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let planted = dir.join(format!("target.{inv}.log.gz"));
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    release(&g);
    assert_eq!(d.wait_ended("target")["status"], "succeeded");
    let archive = wait_archive(&d, ALICE, "target");
    assert_eq!(archive, dir.join(format!("target.{inv}-1.log.gz")));
    assert!(gunzip(&archive).contains("after"));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(std::fs::symlink_metadata(&planted)
        .unwrap()
        .file_type()
        .is_symlink());
    let said = d.harness.journal(&["PTRAIN_JOB=target"]);
    assert!(said.contains("already taken by a symbolic link"), "{said}");

    // A user directory replaced by a link: archiving fails safely.
    let elsewhere = d.root.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, log_dir(&d).join(uid(BOB).to_string())).unwrap();
    let bob_work = d.workdir(BOB);
    d.drop_job(
        BOB,
        "bobs.json",
        &job(&bob_work, "echo bob output", json!({})),
    );
    assert_eq!(d.wait_ended("bobs")["status"], "succeeded");
    let said = wait_for("the daemon to refuse the linked directory", WAIT, || {
        let said = d.harness.journal(&["PTRAIN_JOB=bobs"]);
        said.contains("cannot archive").then_some(said)
    });
    assert!(said.contains("not a root-only directory"), "{said}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    // Bob still reads his output, from the journal.
    let out = d.ptrain(BOB, &["logs", "bobs"]);
    assert_eq!(lines_of(&out), ["bob output"], "{}", text(&out));
    d.assert_alive();
}

// ---------------------------------------------------------------------
// Issue 17.5: fast output is kept whole, and output the journal no longer
// has is reported where it was.

/// The messages of an archive, in order.
fn archived_messages(path: &Path) -> Vec<String> {
    gunzip(path)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["m"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[test]
fn two_hundred_thousand_lines_in_a_second_are_kept_whole() {
    let d = TestDaemon::start_with(
        "logs-flood",
        Opts {
            // Room for the flood (about 120 MB of entries) beside the
            // harness's own: only the rate limit is under test here.
            journal_max: Some("400M"),
            extra_config: LOW_FLOOR.into(),
            ..Opts::default()
        },
    );
    let work = d.workdir(ALICE);
    d.drop_job(
        ALICE,
        "flood.json",
        &job(&work, "seq -f 'line %g' 1 200000", json!({})),
    );
    assert_eq!(d.wait_ended("flood")["status"], "succeeded");
    let expected: Vec<String> = (1..=200_000).map(|i| format!("line {i}")).collect();
    // From the journal (or the archive, if it is written already)...
    let out = d.ptrain(ALICE, &["logs", "flood"]);
    let got = lines_of(&out);
    assert!(
        got == expected,
        "ptrain logs gave {} lines (first {:?}, last {:?}); {}",
        got.len(),
        got.first(),
        got.last(),
        String::from_utf8_lossy(&out.stderr)
    );
    // ...and from the archive, which outlives the journal.
    let archive = archived_messages(&wait_archive(&d, ALICE, "flood"));
    assert!(
        archive == expected,
        "the archive has {} lines (first {:?}, last {:?})",
        archive.len(),
        archive.first(),
        archive.last()
    );
    d.assert_alive();
}

#[test]
fn output_the_journal_rotated_away_is_reported_where_it_was() {
    let d = TestDaemon::start_with(
        "logs-rotated",
        Opts {
            // A journal far smaller than the job's output: journald
            // removes its oldest files while the job writes.
            journal_max: Some("8M"),
            extra_config: LOW_FLOOR.into(),
            ..Opts::default()
        },
    );
    let work = d.workdir(ALICE);
    let g = gate(&d, ALICE, "gate");
    d.drop_job(
        ALICE,
        "big.json",
        &job(&work, "seq -f 'line %g' 1 60000; read x < gate", json!({})),
    );
    // The notice, then an unbroken run of the job's last lines.
    let check = |lines: &[String], what: &str| {
        let notice = lines.first().unwrap_or_else(|| panic!("{what}: no output"));
        assert!(
            notice.starts_with("[ptrain] this job's output before ")
                && notice.contains("is no longer in the journal"),
            "{what}: the first line is {notice:?}"
        );
        let rest = &lines[1..];
        let first: u64 = rest
            .first()
            .and_then(|l| l.strip_prefix("line "))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{what}: {:?} follows the notice", rest.first()));
        assert!(first > 1, "{what}: the notice is there but line 1 too");
        let expected: Vec<String> = (first..=60_000).map(|i| format!("line {i}")).collect();
        assert!(
            rest == expected,
            "{what}: after the notice come {} lines, not the job's lines {first}..60000 in order",
            rest.len()
        );
    };
    // A running job, read from the journal, once journald has written its
    // last line (the oldest files go while the job writes).
    let live = wait_for("ptrain logs to show the job's last line", WAIT, || {
        let lines = lines_of(&d.ptrain(ALICE, &["logs", "big"]));
        (lines.last().map(String::as_str) == Some("line 60000")).then_some(lines)
    });
    check(&live, "ptrain logs of the running job");
    release(&g);
    assert_eq!(d.wait_ended("big")["status"], "succeeded");
    // The archive says so too, in the same place.
    let archive = archived_messages(&wait_archive(&d, ALICE, "big"));
    check(&archive, "the archive");
    d.assert_alive();
}

/// `ptrain logs -f` goes on across a restart of ptraind, as `ptrain wait`
/// does: one note on stderr, then the output resumes where it stopped,
/// with no line printed twice and none left out, and the follower ends
/// with the job (exit 0), not with "was ptraind restarted?" (exit 3).
#[test]
fn following_survives_a_ptraind_restart_without_repeats_or_gaps() {
    let seen = follow_across_restart("logs-restart", &[], false);
    assert_eq!(seen[0], "line 1");
}

/// With `-n`, the resume still starts where the output stopped: the lines
/// `-n` left out are not printed after the restart either.
#[test]
fn following_the_last_lines_survives_a_ptraind_restart() {
    let seen = follow_across_restart("logs-restart-tail", &["-n", "3"], false);
    assert_ne!(seen[0], "line 1", "{seen:?}");
}

/// A job that ends while ptraind is down: once ptraind is back the rest
/// of its output is printed and the follower ends as usual.
#[test]
fn following_a_job_that_ended_while_ptraind_was_down_prints_the_rest() {
    follow_across_restart("logs-down-end", &[], true);
}

/// Follows a job printing "line N" every 0.1 s with `ptrain logs -f
/// ARGS` (as its owner) across a restart of ptraind (with
/// `end_while_down`: a stop, the job's end, a start), checks the follower
/// ended well with one note, and that what it printed is a run of the
/// job's output to its end, each line once; returns those lines.
fn follow_across_restart(test: &str, args: &[&str], end_while_down: bool) -> Vec<String> {
    let d = TestDaemon::start(test);
    let work = d.workdir(ALICE);
    let go = work.join("go");
    // A numbered line every 0.1 s until the test says go, then five more.
    let script = format!(
        "i=0; while [ ! -e {go} ]; do i=$((i+1)); echo line $i; sleep 0.1; done; \
         for k in 1 2 3 4 5; do i=$((i+1)); echo line $i; done",
        go = go.display()
    );
    d.drop_job(ALICE, "numbered.json", &job(&work, &script, json!({})));
    d.wait_running("numbered");
    // Some output before the follower starts, for -n to leave out.
    wait_for("the job's first lines", WAIT, || {
        (lines_of(&d.ptrain(ALICE, &["logs", "numbered"])).len() >= 6).then_some(())
    });
    let mut full = vec!["-f"];
    full.extend_from_slice(args);
    full.push("numbered");
    let (mut follower, lines) = spawn_logs(&d, ALICE, &full);
    let mut seen: Vec<String> = (0..6)
        .map(|_| next_line(&lines, "lines before the restart"))
        .collect();
    if end_while_down {
        let (ok, out) = d.harness.systemctl(&["stop", "ptraind.service"]);
        assert!(ok, "{out}");
        std::fs::write(&go, "").unwrap();
        wait_for("the job to end while ptraind is down", WAIT, || {
            (d.unit_property("ptrain-job@numbered.service", "ActiveState") != "active")
                .then_some(())
        });
        d.start_service();
    } else {
        let (ok, out) = d.harness.systemctl(&["restart", "ptraind.service"]);
        assert!(ok, "{out}\n{}", d.daemon_log());
        // Lines written while ptraind was down arrive in a burst, then
        // live ones: twenty more are well past the restart.
        for _ in 0..20 {
            match lines.recv_timeout(WAIT) {
                Ok(line) => seen.push(line),
                Err(e) => {
                    let _ = follower.kill();
                    let status = follower.wait().unwrap();
                    let mut err = String::new();
                    let _ = follower.stderr.take().unwrap().read_to_string(&mut err);
                    panic!("no line from `ptrain logs -f` after the restart ({e}); {status}: {err}\n{seen:?}");
                }
            }
        }
        std::fs::write(&go, "").unwrap();
    }
    let status = wait_for("`ptrain logs -f` to exit after the job", WAIT, || {
        follower.try_wait().unwrap()
    });
    seen.extend(lines.iter());
    let mut err = String::new();
    follower
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{status}: {err}\n{seen:?}");
    assert_eq!(d.status("numbered").unwrap()["status"], "succeeded");
    assert_eq!(
        err.matches("ptraind restarted; following the output again")
            .count(),
        1,
        "{err}"
    );
    // A run of the job's whole output, to its very end.
    let all = lines_of(&d.ptrain(ALICE, &["logs", "numbered"]));
    let from = all
        .iter()
        .position(|l| *l == seen[0])
        .unwrap_or_else(|| panic!("{seen:?} is not in {all:?}"));
    assert_eq!(seen, all[from..], "{err}");
    seen
}
