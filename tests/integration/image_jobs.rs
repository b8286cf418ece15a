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

/// Drops image job `id` (`echo ran` in `workdir`) as `user` and checks
/// that it ends `launch-failed`, its detail naming each of `reasons`, and
/// that nothing ran.
fn refused(
    d: &TestDaemon,
    user: &str,
    id: &str,
    image: &str,
    workdir: &Path,
    gpus: u32,
    reasons: &[&str],
) {
    let status = d.run_to_end(user, id, &image_job(id, image, "echo ran", workdir, gpus));
    assert_eq!(status["status"], "launch-failed", "{status:#}");
    let detail = status["detail"].as_str().unwrap_or_default();
    for reason in reasons {
        assert!(detail.contains(reason), "{reason:?} not in {status:#}");
    }
    assert!(!text(&d.ptrain("root", &["logs", id])).contains("ran\n"));
}

/// The job's own output, as its owner reads it.
fn logs(d: &TestDaemon, id: &str) -> String {
    text(&d.ptrain(ALICE, &["logs", id]))
}

pub(crate) fn image_job(id: &str, image: &str, script: &str, workdir: &Path, gpus: u32) -> String {
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
    // A GPU host without CDI specs (an empty spec directory).
    let d = TestDaemon::start_with(
        "image-job",
        crate::daemon::Opts {
            gpu_config: "cdi_spec_dirs = [\"/srv/ptrain-tests/no-cdi-specs\"]".into(),
            extra_config: format!("[images]\n{}", registry.insecure_line()),
            ..Default::default()
        },
    );
    let work = d.workdir(ALICE);
    let bob_work = d.workdir(BOB);
    std::fs::write(bob_work.join("secret"), "bob's").unwrap();
    // The job sees the host's directories around its workdir as a host
    // job does (read-only), with its own rights: Bob's 0700 is closed.
    std::fs::set_permissions(&bob_work, std::fs::Permissions::from_mode(0o700)).unwrap();
    let uid = std::fs::metadata(&work).unwrap().uid();
    // Her own directory beside the workdir: read-only to the job, as on
    // the host.
    let other = work.with_file_name("ptrain-alice-other");
    std::fs::create_dir_all(&other).unwrap();
    crate::daemon::chown(&other, ALICE);
    let script = format!(
        "busybox id -u; busybox cat /etc/image-release /etc/second; pwd; \
         echo from-image > out.txt; \
         echo x > ../ptrain-alice-other/x 2>/dev/null || echo sibling-read-only; \
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
        "sibling-read-only".into(),
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
    assert_eq!(
        std::fs::read_to_string(&written).unwrap_or_default(),
        "from-image\n",
        "{out}"
    );
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

    // A workdir with a symlink on its path (as if swapped in while the
    // job was queued): refused at the launch, never followed by root.
    let link = work.with_file_name("alice-link");
    std::os::unix::fs::symlink(&work, &link).unwrap();
    refused(
        &d,
        ALICE,
        "linked",
        &registry.reference("v1"),
        &link,
        0,
        &["has a symlink"],
    );

    // A GPU job in an image on a host with no CDI spec: told how to make one.
    refused(
        &d,
        ALICE,
        "no-spec",
        &registry.reference("v1"),
        &work,
        1,
        &["nvidia-ctk cdi generate"],
    );
    d.assert_alive();
}

#[test]
fn a_pulling_job_holds_no_gpu_and_an_image_that_cannot_be_had_ends_it_with_the_reason() {
    let registry = Registry::start();
    let image = TestImage::build();
    registry.push(&image, "v1");
    let cdi = CdiHost::new();
    let d = TestDaemon::start_with("image-pull", cdi.opts(&registry));
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
    let nope = registry.reference("nope");
    refused(&d, ALICE, "no-tag", &nope, &work, 1, &[&nope, "404"]);

    // A layer the registry serves tampered with: refused naming both
    // digests, nothing run, ptraind alive.
    let mut image = image;
    image.add_tag_with_extra_layer("v9");
    registry.push(&image, "v9");
    let (extra, size) = image.layers("v9").last().cloned().unwrap();
    std::fs::write(registry.blob_data(&extra), vec![b'x'; size as usize]).unwrap();
    refused(
        &d,
        ALICE,
        "tampered",
        &registry.reference("v9"),
        &work,
        0,
        &[&extra.to_string()],
    );
    assert!(!logs(&d, "tampered").contains("ran"));

    // A local archive is opened as the job's owner: one she cannot read
    // is refused with the reason, one she can runs.
    let archive = image.archive("oci-archive");
    let private = d.root.join("private.tar");
    std::fs::copy(&archive, &private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    let source = format!("oci-archive:{}:v1", private.display());
    refused(&d, ALICE, "unreadable", &source, &work, 0, &["cannot open"]);
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

/// A CDI spec for the harness's two fake GPUs as the test daemon declares
/// them (UUIDs `GPU-0000000N-0000-4000-8000-000000000000`, nodes
/// `/dev/nvidiaN`, 195:N), shaped like `nvidia-ctk cdi generate`'s: the
/// control node, a driver library, a variable and its two hooks shared.
fn fake_gpu_spec(driver: &Path) -> String {
    let mut devices = String::new();
    for i in 0..2 {
        for name in [
            format!("\"{i}\""),
            format!("GPU-{i:08x}-0000-4000-8000-000000000000"),
        ] {
            devices.push_str(&format!(
                "- name: {name}\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia{i}\n      type: c\n      major: 195\n      minor: {i}\n"
            ));
        }
    }
    format!(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n{devices}containerEdits:\n  env:\n  - FAKE_DRIVER_VERSION=1.0.0\n  deviceNodes:\n  - path: /dev/nvidiactl\n    type: c\n    major: 195\n    minor: 255\n  mounts:\n  - hostPath: {lib}\n    containerPath: /usr/lib/ptrain-fake-driver/libfakecuda.so.1.0.0\n    options: [ro, nosuid, nodev, bind]\n  hooks:\n  - hookName: createContainer\n    path: /usr/bin/nvidia-ctk\n    args: [nvidia-ctk, hook, create-symlinks, --link, \"libfakecuda.so.1.0.0::/usr/lib/ptrain-fake-driver/libfakecuda.so.1\"]\n  - hookName: createContainer\n    path: /usr/bin/nvidia-ctk\n    args: [nvidia-ctk, hook, update-ldcache, --folder, /usr/lib/ptrain-fake-driver]\n",
        lib = driver.join("libfakecuda.so.1.0.0").display()
    )
}

#[test]
fn a_gpu_job_in_an_image_gets_its_gpus_cdi_nodes_and_driver_files_and_no_other_gpu() {
    let registry = Registry::start();
    let image = TestImage::build();
    let digest = registry.push(&image, "v1");
    let cdi = CdiHost::new();
    let d = TestDaemon::start_with("image-gpu", cdi.opts(&registry));
    let work = d.workdir(ALICE);
    let script = "mine=$PTRAIN_GPUS; other=$((1 - mine)); \
        busybox cat /dev/nvidia$mine 2>&1; busybox cat /dev/nvidia$other 2>&1; \
        busybox cat /dev/nvidiactl 2>&1; \
        busybox cat /usr/lib/ptrain-fake-driver/libfakecuda.so.1.0.0; \
        echo link=$(busybox readlink /usr/lib/ptrain-fake-driver/libfakecuda.so.1); \
        echo FAKE=$FAKE_DRIVER_VERSION LD=$LD_LIBRARY_PATH GPUS=$PTRAIN_GPUS";
    let json = image_job("on-gpu", &registry.reference("v1"), script, &work, 1);
    let status = d.run_to_end(ALICE, "on-gpu", &json);
    let out = logs(&d, "on-gpu");
    assert_eq!(
        status["status"],
        "succeeded",
        "{status:#}\n{out}\n{}",
        d.daemon_log()
    );
    assert_eq!(status["image_digest"], digest.as_str());
    let mine = status["gpus"][0].as_u64().unwrap();
    let other = 1 - mine;
    for expected in [
        // Its node opens as far as the (absent) driver: the device cgroup
        // let it through; the other GPU's is refused by the cgroup.
        format!("'/dev/nvidia{mine}': No such device or address"),
        format!("'/dev/nvidia{other}': Operation not permitted"),
        "'/dev/nvidiactl': No such device or address".into(),
        "fake cuda 1.0.0".into(),
        "link=libfakecuda.so.1.0.0".into(),
        format!("FAKE=1.0.0 LD=/usr/lib/ptrain-fake-driver GPUS={mine}"),
    ] {
        assert!(out.contains(&expected), "{expected:?} missing from:\n{out}");
    }
    // The link and the mount point are the job's root's, not the image's
    // shared tree.
    let trees = d.state.join("images/trees/sha256");
    for tree in std::fs::read_dir(&trees).unwrap() {
        let tree = tree.unwrap().path();
        assert!(
            !tree.join("usr/lib/ptrain-fake-driver").exists(),
            "{}",
            tree.display()
        );
    }
    d.assert_alive();
}

/// The host's CDI spec and fake driver file, root's, outside any image,
/// and the `[gpus] cdi_spec_dirs` that points ptraind at them.
struct CdiHost {
    dir: std::path::PathBuf,
}

impl CdiHost {
    fn new() -> CdiHost {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::path::PathBuf::from(format!("/srv/ptrain-tests/cdi-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (specs, driver) = (dir.join("cdi"), dir.join("driver"));
        std::fs::create_dir_all(&specs).unwrap();
        std::fs::create_dir_all(&driver).unwrap();
        for d in [&dir, &specs, &driver] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::write(driver.join("libfakecuda.so.1.0.0"), "fake cuda 1.0.0\n").unwrap();
        std::fs::write(specs.join("fake-gpu.yaml"), fake_gpu_spec(&driver)).unwrap();
        CdiHost { dir }
    }

    /// ptraind's options: these CDI specs, and `registry` trusted over
    /// plain http.
    fn opts(&self, registry: &Registry) -> crate::daemon::Opts {
        crate::daemon::Opts {
            gpu_config: format!("cdi_spec_dirs = [{:?}]", self.dir.join("cdi")),
            extra_config: format!("[images]\n{}", registry.insecure_line()),
            ..Default::default()
        }
    }
}

impl Drop for CdiHost {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn registry_credentials_are_the_admins_root_only_file_or_the_owners_own_for_their_jobs_alone() {
    let registry = Registry::start_with_auth("puller", "s3cret-pw");
    let image = TestImage::build();
    let digest = registry.push(&image, "v1");
    let admin_file = std::path::PathBuf::from(format!(
        "/srv/ptrain-tests/registry-auth-{}.json",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&admin_file);
    let d = TestDaemon::start_with(
        "image-auth",
        crate::daemon::Opts {
            extra_config: format!(
                "[images]\nauth_file = {admin_file:?}\n{}",
                registry.insecure_line()
            ),
            ..Default::default()
        },
    );
    let reference = registry.reference("v1");
    let work = d.workdir(ALICE);
    let auth_json = |user: &str, password: &str| {
        use std::io::Write;
        let mut enc = Vec::new();
        // base64 of user:password, as `skopeo login` writes it.
        let raw = format!("{user}:{password}");
        let table = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        for chunk in raw.as_bytes().chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    enc.write_all(&[table[(n >> (18 - 6 * i) & 63) as usize]])
                        .unwrap();
                } else {
                    enc.write_all(b"=").unwrap();
                }
            }
        }
        serde_json::json!({"auths": {registry.reference("x").split('/').next().unwrap():
            {"auth": String::from_utf8(enc).unwrap()}}})
        .to_string()
    };
    // No credentials anywhere: refused by the registry, its reason shown.
    refused(&d, ALICE, "anon", &reference, &work, 0, &["credentials"]);

    // The admin's file, readable by others: refused, saying how to fix it.
    std::fs::write(&admin_file, auth_json("puller", "s3cret-pw")).unwrap();
    std::fs::set_permissions(&admin_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let admin_path = admin_file.display().to_string();
    refused(
        &d,
        ALICE,
        "leaky",
        &reference,
        &work,
        0,
        &["chmod 600", &admin_path],
    );

    // Root's alone: every user's jobs pull with it.
    std::fs::set_permissions(&admin_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let status = d.run_to_end(
        ALICE,
        "admins",
        &image_job("admins", &reference, "echo ran", &work, 0),
    );
    assert_eq!(status["status"], "succeeded", "{status:#}");
    assert_eq!(status["image_digest"], digest.as_str());

    // Carol's own file wins over the admin's for her jobs: with a wrong
    // password her pull is refused (the admin's access is not used for
    // her); Alice's jobs still pull with the admin's.
    let carol_home = user_with_home(CAROL);
    // Where the test stages her job files before she copies them in.
    std::fs::create_dir_all(d.workdir(CAROL)).unwrap();
    crate::daemon::chown(&d.workdir(CAROL), CAROL);
    let carol_auth = carol_home.join(".config/containers/auth.json");
    std::fs::create_dir_all(carol_auth.parent().unwrap()).unwrap();
    std::fs::write(&carol_auth, auth_json("puller", "wrong")).unwrap();
    for path in [
        carol_home.join(".config"),
        carol_home.join(".config/containers"),
        carol_auth.clone(),
    ] {
        crate::daemon::chown(&path, CAROL);
    }
    std::fs::set_permissions(&carol_auth, std::fs::Permissions::from_mode(0o600)).unwrap();
    refused(
        &d,
        CAROL,
        "carols",
        &reference,
        &carol_home,
        0,
        &["credentials"],
    );
    let json = image_job("alices", &reference, "echo ran", &work, 0);
    let status = d.run_to_end(ALICE, "alices", &json);
    assert_eq!(status["status"], "succeeded", "{status:#}");
    // With her right password, her own pull works.
    std::fs::write(&carol_auth, auth_json("puller", "s3cret-pw")).unwrap();
    let json = image_job("carols-2", &reference, "echo ran", &carol_home, 0);
    let status = d.run_to_end(CAROL, "carols-2", &json);
    assert_eq!(status["status"], "succeeded", "{status:#}");
    d.assert_alive();
    let _ = std::fs::remove_file(&admin_file);
}

/// A user of the credentials test alone, whose home (where a user's own
/// registry credentials live) exists, made fresh for the test.
const CAROL: &str = "ptrain-carol";

fn user_with_home(name: &str) -> std::path::PathBuf {
    let home = std::path::PathBuf::from(format!("/srv/ptrain-tests/home-{name}"));
    if crate::harness::lookup_user(name).is_none() {
        let out = std::process::Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                "--home-dir",
            ])
            .arg(&home)
            .arg(name)
            .output()
            .unwrap();
        assert!(
            out.status.success() || crate::harness::lookup_user(name).is_some(),
            "useradd {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    crate::daemon::chown(&home, name);
    home
}
