//! Issue 22 (first part): a job held by its descriptor or by `ptrain
//! hold` stays queued, holding nothing, until its owner (or root) releases
//! it, across a kill -9 of ptraind.

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
    let (ok, out) = d
        .harness
        .systemctl(&["kill", "-s", "KILL", "ptraind.service"]);
    assert!(ok, "{out}");
    wait_for("ptraind to be restarted", WAIT, || {
        (d.unit_property("ptraind.service", "NRestarts") == "1"
            && d.unit_property("ptraind.service", "ActiveState") == "active")
            .then_some(())
    });
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
