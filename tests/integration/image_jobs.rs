//! Issue 21, end to end: jobs in a container image, run by the real
//! ptraind in the real systemd harness, the image pushed to Debian's
//! docker-registry on loopback (and written as an archive) by skopeo
//! (`images.rs` builds it with umoci: busybox-static, a whiteout, a
//! setuid file). The job runs as its owner in the image's root, sees the
//! image and its workdir and nothing of the host, cannot write the image,
//! logs to the journal and records the digest that ran; while the image
//! is pulled the job is `pulling` and holds no GPU; an image that cannot
//! be had ends the job with the registry's reason.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::daemon::{text, TestDaemon, ALICE, BOB};
use crate::images::{Registry, TestImage};

/// The job's own output, as its owner reads it.
fn logs(d: &TestDaemon, id: &str) -> String {
    text(&d.ptrain(ALICE, &["logs", id]))
}

fn image_job(id: &str, image: &str, script: &str, workdir: &Path, gpus: u32) -> String {
    serde_json::json!({
        "version": 1,
        "id": id,
        "image": image,
        // The image's entrypoint is /bin/sh: the command replaces its Cmd.
        "command": ["-c", script],
        "workdir": workdir,
        "gpus": gpus,
    })
    .to_string()
}

#[test]
fn a_job_in_an_image_runs_as_its_owner_in_the_images_root_and_records_the_digest() {
    let registry = Registry::start();
    let image = TestImage::build();
    let digest = registry.push(&image, "v1");
    let d = TestDaemon::start("image-job");
    let work = d.workdir(ALICE);
    let bob_work = d.workdir(BOB);
    std::fs::write(bob_work.join("secret"), "bob's").unwrap();
    let uid = std::fs::metadata(&work).unwrap().uid();
    let script = format!(
        "busybox id -u; busybox cat /etc/image-release /etc/second; pwd; \
         echo from-image > out.txt; \
         test -e /etc/remove-me && echo whiteout-ignored; \
         echo x > /etc/x 2>/dev/null || echo image-read-only; \
         echo x > /bin/busybox 2>/dev/null || echo binary-read-only; \
         busybox ls -l /bin/suid; \
         test -e /etc/os-release && echo host-visible; \
         busybox cat {}/secret 2>/dev/null || echo bob-invisible; \
         echo PATH=$PATH",
        bob_work.display()
    );
    let json = image_job("in-image", &registry.reference("v1"), &script, &work, 0);
    let status = d.run_to_end(ALICE, "in-image", &json);
    let out = logs(&d, "in-image");
    assert_eq!(status["status"], "succeeded", "{status:#}\n{out}");
    assert_eq!(status["image"], registry.reference("v1"), "{status:#}");
    assert_eq!(status["image_digest"], digest.as_str(), "{status:#}");
    for expected in [
        uid.to_string(),
        "busybox-image".into(),
        "second".into(),
        work.display().to_string(),
        "image-read-only".into(),
        "binary-read-only".into(),
        "-rwxr-xr-x".into(),
        "bob-invisible".into(),
        "PATH=/bin".into(),
    ] {
        assert!(out.contains(&expected), "{expected:?} missing from:\n{out}");
    }
    for unexpected in ["whiteout-ignored", "host-visible", "bob's"] {
        assert!(!out.contains(unexpected), "{unexpected:?} in:\n{out}");
    }
    // Written as its owner, in its workdir on the host.
    let written = work.join("out.txt");
    assert_eq!(std::fs::read_to_string(&written).unwrap(), "from-image\n");
    assert_eq!(std::fs::metadata(&written).unwrap().uid(), uid);
    // The unit ran in the image's root: systemd's own record of it.
    let journal = d
        .harness
        .journal(&["-u", "ptrain-job@in-image.service", "-o", "cat"]);
    assert!(journal.contains("busybox-image"), "{journal}");

    // A second job of the image runs the same digest, from the store.
    let json = serde_json::json!({
        "version": 1, "id": "default-cmd", "image": registry.reference("v1"),
        "command": ["-c", "echo default"], "workdir": work,
    })
    .to_string();
    let status = d.run_to_end(ALICE, "default-cmd", &json);
    assert_eq!(status["status"], "succeeded", "{status:#}");
    assert_eq!(status["image_digest"], digest.as_str());
    d.assert_alive();
}

#[test]
fn a_pulling_job_holds_no_gpu_and_an_image_that_cannot_be_had_ends_it_with_the_reason() {
    let registry = Registry::start();
    let image = TestImage::build();
    registry.push(&image, "v1");
    let d = TestDaemon::start("image-pull");
    let work = d.workdir(ALICE);
    // The registry stops answering: the pull waits, the job is `pulling`.
    registry.pause();
    let json = image_job("waits", &registry.reference("v1"), "echo ran", &work, 1);
    d.drop_job(ALICE, "waits.json", &json);
    let status = d.wait_status("waits", |s| s == "pulling");
    let detail = status["detail"].as_str().unwrap_or_default();
    assert!(detail.starts_with("pulling image "), "{status:#}");
    assert_eq!(status["gpus"], serde_json::json!([]), "{status:#}");
    // Meanwhile a job that needs every GPU runs: the pulling one holds none.
    let all = serde_json::json!({
        "version": 1, "command": ["true"], "gpus": 2, "workdir": work,
    })
    .to_string();
    let ran = d.run_to_end(ALICE, "all-gpus", &all);
    assert_eq!(ran["status"], "succeeded", "{ran:#}");
    assert_eq!(d.status("waits").unwrap()["status"], "pulling");
    registry.resume();
    let status = d.wait_ended("waits");
    assert_eq!(status["status"], "succeeded", "{status:#}");
    assert!(logs(&d, "waits").contains("ran"));

    // A tag the registry does not have: the job ends with its reason,
    // nothing ran, ptraind is alive.
    let json = image_job("no-tag", &registry.reference("nope"), "echo ran", &work, 1);
    let status = d.run_to_end(ALICE, "no-tag", &json);
    assert_eq!(status["status"], "launch-failed", "{status:#}");
    let detail = status["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains(&registry.reference("nope")) && detail.contains("404"),
        "{status:#}"
    );

    // A local archive is opened as the job's owner: one she cannot read
    // is refused with the reason, one she can runs.
    let archive = image.archive("oci-archive");
    let private = d.root.join("private.tar");
    std::fs::copy(&archive, &private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    let source = format!("oci-archive:{}:v1", private.display());
    let status = d.run_to_end(
        ALICE,
        "unreadable",
        &image_job("unreadable", &source, "echo ran", &work, 0),
    );
    assert_eq!(status["status"], "launch-failed", "{status:#}");
    assert!(
        status["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("cannot open"),
        "{status:#}"
    );
    let mine = work.join("image.tar");
    std::fs::copy(&archive, &mine).unwrap();
    crate::daemon::chown(&mine, ALICE);
    let source = format!("oci-archive:{}:v1", mine.display());
    let status = d.run_to_end(
        ALICE,
        "archived",
        &image_job(
            "archived",
            &source,
            "busybox cat /etc/image-release",
            &work,
            0,
        ),
    );
    assert_eq!(status["status"], "succeeded", "{status:#}");
    assert!(logs(&d, "archived").contains("busybox-image"));
    d.assert_alive();
}
