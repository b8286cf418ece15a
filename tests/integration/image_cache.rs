//! Issue 21's image cache, end to end in the real systemd harness with a
//! real registry on loopback: `ptrain images` lists each image once with
//! the users whose jobs used it (root sees every name, a user only their
//! own), and `[images]` collects the store after an image job ends,
//! removing an image no live job needs (its tree and the unit roots cloned
//! from it) and keeping the image of a held job, which then runs.

use std::path::Path;

use serde_json::Value;

use crate::daemon::{text, Opts, TestDaemon, ALICE, BOB, WAIT};
use crate::harness::wait_for;
use crate::images::{Registry, TestImage};

/// An image job submitted held: queued (its image pulled), not run.
fn held_image_job(id: &str, image: &str, script: &str, workdir: &Path) -> String {
    let mut job: Value =
        serde_json::from_str(&crate::image_jobs::image_job(id, image, script, workdir, 0)).unwrap();
    job["hold"] = Value::Bool(true);
    job.to_string()
}

/// `ptrain images --json` as `user`.
fn images(d: &TestDaemon, user: &str) -> Vec<Value> {
    let out = d.ptrain(user, &["images", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn find<'a>(list: &'a [Value], reference: &str) -> &'a Value {
    list.iter()
        .find(|i| i["reference"] == reference)
        .unwrap_or_else(|| panic!("{reference} is not listed: {list:#?}"))
}

/// The names in a store directory (`trees/sha256`, `roots/sha256`).
fn entries(d: &TestDaemon, sub: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(d.state.join("images").join(sub))
        .map(|dir| {
            dir.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn images_are_listed_once_with_their_users_and_collected_when_no_live_job_needs_them() {
    let registry = Registry::start();
    let mut image = TestImage::build();
    image.add_tag_with_extra_layer("v2");
    let a_digest = registry.push(&image, "v1");
    let b_digest = registry.push(&image, "v2");
    let (a, b) = (registry.reference("v1"), registry.reference("v2"));
    // A store of at most one byte: every image no live job needs goes.
    let d = TestDaemon::start_with(
        "image-cache",
        Opts {
            extra_config: format!("[images]\nmax_size = \"1\"\n{}", registry.insecure_line()),
            ..Opts::default()
        },
    );
    let (alice_work, bob_work) = (d.workdir(ALICE), d.workdir(BOB));

    // Held jobs: queued, their images pulled, not planned.
    d.drop_job(
        ALICE,
        "a-alice.json",
        &held_image_job("a-alice", &a, "echo a-ran", &alice_work),
    );
    d.drop_job(
        BOB,
        "a-bob.json",
        &held_image_job("a-bob", &a, "echo a-ran", &bob_work),
    );
    d.drop_job(
        ALICE,
        "b-alice.json",
        &held_image_job("b-alice", &b, "busybox cat /opt/extra", &alice_work),
    );
    for id in ["a-alice", "a-bob", "b-alice"] {
        let status = d.wait_status(id, |s| s == "queued");
        let detail = status["detail"].as_str().unwrap_or_default();
        assert!(detail.starts_with("held"), "{status:#}");
    }

    // Root: each image once, both users of A named.
    let listed = images(&d, "root");
    assert_eq!(listed.len(), 2, "{listed:#?}");
    let image_a = find(&listed, &a);
    assert_eq!(image_a["digest"], a_digest.as_str(), "{image_a:#}");
    assert_eq!(
        image_a["users"],
        serde_json::json!([ALICE, BOB]),
        "{image_a:#}"
    );
    assert_eq!(image_a["other_users"], 0);
    assert!(image_a["bytes"].as_u64().unwrap() > 0, "{image_a:#}");
    assert!(image_a["last_used"].as_u64().unwrap() > 0, "{image_a:#}");
    let image_b = find(&listed, &b);
    assert_eq!(image_b["digest"], b_digest.as_str());
    assert_eq!(image_b["users"], serde_json::json!([ALICE]));
    // Both jobs of A share its tree: one tree per image.
    assert_eq!(entries(&d, "trees/sha256").len(), 2);

    // Bob sees every image, but of the users only himself, and the
    // reference only of the image his job uses.
    let seen = images(&d, BOB);
    assert_eq!(seen.len(), 2, "{seen:#?}");
    let a_seen = find(&seen, &a);
    assert_eq!(a_seen["users"], serde_json::json!([BOB]), "{a_seen:#}");
    assert_eq!(a_seen["other_users"], 1);
    let b_seen = seen
        .iter()
        .find(|i| i["digest"] == b_digest.as_str())
        .unwrap_or_else(|| panic!("B is not listed: {seen:#?}"));
    assert_eq!(b_seen["reference"], "", "{b_seen:#}");
    assert_eq!(b_seen["users"], serde_json::json!([]), "{b_seen:#}");
    assert_eq!(b_seen["other_users"], 1);
    let table = text(&d.ptrain(BOB, &["images"]));
    assert!(
        table.contains("REFERENCE")
            && table.contains(&a)
            && table.contains(&format!("{BOB} +1 other"))
            && table.contains("(other users')"),
        "{table}"
    );
    assert!(!table.contains(ALICE) && !table.contains(&b), "{table}");
    let table = text(&d.ptrain("root", &["images"]));
    assert!(
        table.contains(&format!("{ALICE}, {BOB}")) && table.contains(&a_digest[7..19]),
        "{table}"
    );

    // Both jobs of A run and end: A goes, with its tree and the roots
    // cloned from it; B stays for its held job, over max_size.
    let roots_before = entries(&d, "roots/sha256");
    assert_eq!(roots_before.len(), 3, "{roots_before:?}");
    for (user, id) in [(ALICE, "a-alice"), (BOB, "a-bob")] {
        let out = d.ptrain(user, &["release", id]);
        assert!(out.status.success(), "{}", text(&out));
    }
    for id in ["a-alice", "a-bob"] {
        let status = d.wait_ended(id);
        assert_eq!(status["status"], "succeeded", "{status:#}");
    }
    let left = wait_for("image A to be collected", WAIT, || {
        Some(images(&d, "root")).filter(|l| l.len() == 1)
    });
    assert_eq!(left[0]["reference"], b.as_str(), "{left:#?}");
    // The record goes first, then the tree and its roots, all in one
    // collection: its listing may show the record gone a moment before.
    let (trees, roots) = wait_for("A's tree and roots to be removed", WAIT, || {
        let trees = entries(&d, "trees/sha256");
        let roots = entries(&d, "roots/sha256");
        (trees.len() == 1 && roots.len() == 1).then_some((trees, roots))
    });
    assert!(
        roots[0].starts_with(&format!("{}-", trees[0])),
        "{roots:?} {trees:?}"
    );
    // The journal may show the collection's line a moment after the store.
    wait_for("the collection's log line", WAIT, || {
        d.daemon_log()
            .contains("image store collected")
            .then_some(())
    });

    // B's job runs in the kept image: its extra layer is there.
    let out = d.ptrain(ALICE, &["release", "b-alice"]);
    assert!(out.status.success(), "{}", text(&out));
    let status = d.wait_ended("b-alice");
    assert_eq!(status["status"], "succeeded", "{status:#}");
    assert!(
        text(&d.ptrain(ALICE, &["logs", "b-alice"])).contains("extra layer"),
        "{}",
        text(&d.ptrain(ALICE, &["logs", "b-alice"]))
    );
    // Now nothing needs it either.
    wait_for(
        "image B, its tree and its root to be collected",
        WAIT,
        || {
            (images(&d, BOB).is_empty()
                && entries(&d, "trees/sha256").is_empty()
                && entries(&d, "roots/sha256").is_empty())
            .then_some(())
        },
    );
    assert!(text(&d.ptrain(BOB, &["images"])).contains("no images"));
    d.assert_alive();
}
