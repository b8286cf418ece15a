//! What the CLI promises its user, on the real systemd: `wait` and
//! `submit --wait` follow any number of jobs to their end, `submit` reports
//! what ptraind decided about the very file it published, a closed pipe
//! ends a command quietly, and text other users control reaches a terminal
//! only escaped.

use std::process::{Output, Stdio};

use serde_json::{json, Value};

use crate::daemon::{chown, text, TestDaemon, ALICE, PTRAIN};

/// Writes a job file into the user's workdir, owned by them; returns its path.
fn job_file(d: &TestDaemon, user: &str, name: &str, spec: &Value) -> String {
    let path = d.workdir(user).join(name);
    std::fs::write(&path, spec.to_string()).unwrap();
    chown(&path, user);
    path.display().to_string()
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
