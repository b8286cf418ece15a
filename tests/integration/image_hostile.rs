//! Issue 21's "hostile images", end to end: images crafted member by
//! member (hostile tar members `tar` and umoci would refuse to write),
//! laid out as OCI, pushed by skopeo to the real loopback registry
//! (Debian's docker-registry) and named by jobs of the real ptraind in
//! the real systemd harness. Each hostile image ends its job with the
//! unpacker's or the blob store's reason in `ptrain status`; nothing is
//! written outside the image store (every escape aims at one directory
//! beside the state, which ptraind, `ReadWritePaths=` its root, could
//! write); the setuid file and the symlink laid over by a later layer
//! are made harmless and their jobs run; and ptraind stays up, the same
//! process, running image jobs after them.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ptrain::images::{Digest, Platform};
use serde_json::{json, Value};
use tar::{EntryType, Header};

use crate::daemon::{text, Opts, TestDaemon, ALICE, WAIT};
use crate::harness::{ensure_user, wait_for};
use crate::image_jobs::image_job;
use crate::images::Registry;

/// `[images] max_image_size` of the test's daemon.
const MAX_IMAGE: u64 = 64 << 20;
/// The apparent size of the sparse file that must not get in.
const SPARSE: u64 = 10 << 30;

// ---------------------------------------------------------------------------
// Layers, member by member.

/// One tar member, written header field by header field so a hostile
/// path goes in as it is (a GNU long name entry before it when it is
/// longer than the header's field).
struct Member {
    path: Vec<u8>,
    kind: EntryType,
    mode: u32,
    data: Vec<u8>,
    link: Vec<u8>,
    device: (u32, u32),
}

fn member(path: &str, kind: EntryType, mode: u32) -> Member {
    Member {
        path: path.into(),
        kind,
        mode,
        data: Vec::new(),
        link: Vec::new(),
        device: (0, 0),
    }
}

fn file(path: &str, data: &[u8], mode: u32) -> Member {
    Member {
        data: data.to_vec(),
        ..member(path, EntryType::Regular, mode)
    }
}

fn symlink(path: &str, target: &str) -> Member {
    Member {
        link: target.into(),
        ..member(path, EntryType::Symlink, 0o777)
    }
}

fn hard_link(path: &str, target: &str) -> Member {
    Member {
        link: target.into(),
        ..member(path, EntryType::Link, 0o644)
    }
}

fn char_device(path: &str, major: u32, minor: u32) -> Member {
    Member {
        device: (major, minor),
        ..member(path, EntryType::Char, 0o666)
    }
}

fn tar_of(members: &[Member]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for m in members {
        if m.path.len() > 99 {
            let mut long = m.path.clone();
            long.push(0);
            let mut h = Header::new_gnu();
            h.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"././@LongLink");
            h.set_entry_type(EntryType::GNULongName);
            h.set_mode(0o644);
            h.set_size(long.len() as u64);
            h.set_cksum();
            b.append(&h, &long[..]).unwrap();
        }
        assert!(m.link.len() <= 100, "a link target fits its field");
        let mut h = Header::new_gnu();
        {
            let g = h.as_gnu_mut().unwrap();
            let n = m.path.len().min(99);
            g.name[..n].copy_from_slice(&m.path[..n]);
            g.linkname[..m.link.len()].copy_from_slice(&m.link);
        }
        h.set_entry_type(m.kind);
        h.set_mode(m.mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_size(m.data.len() as u64);
        h.set_mtime(1_700_000_000);
        if m.kind == EntryType::Char {
            h.set_device_major(m.device.0).unwrap();
            h.set_device_minor(m.device.1).unwrap();
        }
        h.set_cksum();
        b.append(&h, &m.data[..]).unwrap();
    }
    b.into_inner().unwrap()
}

/// A layer of one GNU sparse file of `apparent` bytes whose last 512 are
/// data: the tar holds 512 bytes of it.
fn sparse_tar(path: &str, apparent: u64) -> Vec<u8> {
    let mut h = Header::new_gnu();
    {
        let g = h.as_gnu_mut().unwrap();
        g.name[..path.len()].copy_from_slice(path.as_bytes());
        // Twelve octal digits, no terminator: 10 GiB needs all of them.
        let octal = |field: &mut [u8; 12], v: u64| {
            field.copy_from_slice(format!("{v:012o}").as_bytes());
        };
        octal(&mut g.sparse[0].offset, apparent - 512);
        octal(&mut g.sparse[0].numbytes, 512);
        octal(&mut g.realsize, apparent);
    }
    h.set_entry_type(EntryType::GNUSparse);
    h.set_mode(0o644);
    h.set_size(512);
    h.set_mtime(1_700_000_000);
    h.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&h, &[b'x'; 512][..]).unwrap();
    b.into_inner().unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

// ---------------------------------------------------------------------------
// An OCI layout of crafted images, for skopeo to push.

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

struct Layout {
    dir: tempfile::TempDir,
    index: Vec<Value>,
}

impl Layout {
    fn new() -> Layout {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("blobs/sha256")).unwrap();
        std::fs::write(
            dir.path().join("oci-layout"),
            r#"{"imageLayoutVersion":"1.0.0"}"#,
        )
        .unwrap();
        Layout {
            dir,
            index: Vec::new(),
        }
    }

    /// Stores `bytes` as a blob; its descriptor.
    fn blob(&self, media_type: &str, bytes: &[u8]) -> Value {
        let digest = Digest::of(bytes);
        std::fs::write(
            self.dir.path().join("blobs/sha256").join(digest.hex()),
            bytes,
        )
        .unwrap();
        json!({"mediaType": media_type, "digest": digest.to_string(), "size": bytes.len()})
    }

    /// Tag `tag`: the layers (uncompressed tars, bottom first) gzipped,
    /// run as the image's `/bin/sh`; each tag's config is its own (a
    /// label), so no two tags share a manifest. Its skopeo name.
    fn image(&mut self, tag: &str, layers: &[&[u8]]) -> String {
        let descriptors: Vec<Value> = layers
            .iter()
            .map(|l| self.blob("application/vnd.oci.image.layer.v1.tar+gzip", &gzip(l)))
            .collect();
        let diff_ids: Vec<String> = layers.iter().map(|l| Digest::of(l).to_string()).collect();
        let config = json!({
            "architecture": Platform::host().architecture,
            "os": "linux",
            "config": {
                "Env": ["PATH=/bin"],
                "Entrypoint": ["/bin/sh"],
                "Labels": {"org.ptrain.test.case": tag},
            },
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        let config = self.blob(
            "application/vnd.oci.image.config.v1+json",
            config.to_string().as_bytes(),
        );
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": config,
            "layers": descriptors,
        });
        let mut entry = self.blob(OCI_MANIFEST, manifest.to_string().as_bytes());
        entry["annotations"] = json!({"org.opencontainers.image.ref.name": tag});
        self.index.push(entry);
        let index = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": self.index,
        });
        std::fs::write(self.dir.path().join("index.json"), index.to_string()).unwrap();
        format!("oci:{}:{tag}", self.dir.path().display())
    }
}

/// A static program that prints its effective ids: setuid root, it would
/// print euid=0.
fn effective_ids_program(dir: &Path) -> Vec<u8> {
    let src = dir.join("ids.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <unistd.h>\nint main(void) { printf(\"euid=%d egid=%d\\n\", (int)geteuid(), (int)getegid()); return 0; }\n",
    )
    .unwrap();
    let bin = dir.join("ids");
    let out = Command::new("cc")
        .args(["-static", "-O2", "-o"])
        .arg(&bin)
        .arg(&src)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cc: {e}; install gcc and libc6-dev (tests/install-deps.sh)"));
    assert!(out.status.success(), "cc -static: {}", text(&out));
    std::fs::read(bin).unwrap()
}

// ---------------------------------------------------------------------------
// Looking at the result.

/// Every path under `root` (symlinks not followed) with its metadata; a
/// path the store's collector removes meanwhile is left out.
fn walk(root: &Path) -> Vec<(PathBuf, std::fs::Metadata)> {
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if gone(&e) => continue,
            Err(e) => panic!("{}: {e}", dir.display()),
        };
        for entry in entries {
            let path = match entry {
                Ok(entry) => entry.path(),
                Err(e) if gone(&e) => continue,
                Err(e) => panic!("{}: {e}", dir.display()),
            };
            let meta = match std::fs::symlink_metadata(&path) {
                Ok(meta) => meta,
                Err(e) if gone(&e) => continue,
                Err(e) => panic!("{}: {e}", path.display()),
            };
            if meta.is_dir() {
                todo.push(path.clone());
            }
            out.push((path, meta));
        }
    }
    out
}

fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// The job's output, once it holds `expected` (the journal may lag the
/// job's end).
fn logs_with(d: &TestDaemon, id: &str, expected: &[&str]) -> String {
    let mut last = String::new();
    wait_for(&format!("job {id}'s output"), WAIT, || {
        last = text(&d.ptrain(ALICE, &["logs", id]));
        expected.iter().all(|e| last.contains(e)).then_some(())
    });
    last
}

// ---------------------------------------------------------------------------

#[test]
fn hostile_images_are_refused_with_their_reason_and_nothing_escapes_the_image_store() {
    let registry = Registry::start();
    let d = TestDaemon::start_with(
        "image-hostile",
        Opts {
            extra_config: format!(
                "[images]\nmax_image_size = {MAX_IMAGE}\n{}",
                registry.insecure_line()
            ),
            ..Default::default()
        },
    );
    let work = d.workdir(ALICE);
    let (alice_uid, alice_gid) = ensure_user(ALICE);
    // What every escape aims at: a directory beside the state, on the
    // path ptraind may write (its unit's ReadWritePaths= is the test's
    // root), holding one file a hard link would like to take.
    let outside = d.root.join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o755)).unwrap();
    let keep = outside.join("keep");
    std::fs::write(&keep, "kept\n").unwrap();
    let outside_str = outside.display().to_string();
    let root_names = names(&d.root);

    // The images. A base layer with a static busybox as /bin/sh, shared
    // by all of them; over it one hostile layer each.
    let scratch = tempfile::tempdir().unwrap();
    let busybox = std::fs::read("/usr/bin/busybox").expect("busybox-static is installed");
    let base = tar_of(&[
        member("bin", EntryType::Directory, 0o755),
        file("bin/busybox", &busybox, 0o755),
        symlink("bin/sh", "busybox"),
    ]);
    // `../` far past `/`, then the absolute path of the outside
    // directory: from any depth the unpacker could be writing at, the
    // file would land there.
    let dotdot_path = format!("{}{}/dotdot-escape", "../".repeat(16), &outside_str[1..]);
    let dotdot = tar_of(&[file(&dotdot_path, b"escaped\n", 0o644)]);
    let absolute = tar_of(&[file(
        &format!("{outside_str}/absolute-escape"),
        b"escaped\n",
        0o644,
    )]);
    let hardlink = tar_of(&[hard_link("bin/stolen", &format!("{outside_str}/keep"))]);
    let through_link = tar_of(&[
        symlink("evil", &outside_str),
        file("evil/pwned", b"pwned\n", 0o644),
    ]);
    let link_only = tar_of(&[symlink("evil", &outside_str)]);
    let under_link = tar_of(&[
        member("evil", EntryType::Directory, 0o755),
        file("evil/pwned", b"laid over\n", 0o644),
    ]);
    let device = tar_of(&[
        member("dev", EntryType::Directory, 0o755),
        char_device("dev/mem", 1, 1),
    ]);
    let setuid = tar_of(&[file(
        "bin/ids",
        &effective_ids_program(scratch.path()),
        0o6755,
    )]);
    let sparse = sparse_tar("var/log/lastlog", SPARSE);

    let mut layout = Layout::new();
    let images: Vec<(&str, String)> = vec![
        ("plain", layout.image("plain", &[&base])),
        ("dotdot", layout.image("dotdot", &[&base, &dotdot])),
        ("absolute", layout.image("absolute", &[&base, &absolute])),
        ("hardlink", layout.image("hardlink", &[&base, &hardlink])),
        ("symlink", layout.image("symlink", &[&base, &through_link])),
        (
            "symlink-layers",
            layout.image("symlink-layers", &[&base, &link_only, &under_link]),
        ),
        ("device", layout.image("device", &[&base, &device])),
        ("setuid", layout.image("setuid", &[&base, &setuid])),
        ("sparse", layout.image("sparse", &[&base, &sparse])),
        ("tampered", layout.image("tampered", &[&base])),
    ];
    let digests: std::collections::BTreeMap<&str, String> = std::thread::scope(|s| {
        let pushes: Vec<_> = images
            .iter()
            .map(|(tag, source)| {
                let registry = &registry;
                (*tag, s.spawn(move || registry.push_source(source, tag)))
            })
            .collect();
        pushes
            .into_iter()
            .map(|(tag, push)| (tag, push.join().unwrap()))
            .collect()
    });

    // The manifest of `tampered` is changed in the registry's storage
    // after the push (its layer swapped for the `../` one); the job pins
    // the digest pushed.
    let pushed = Digest::parse(&digests["tampered"]).unwrap();
    let stored = registry.blob_data(&pushed);
    let mut manifest: Value = serde_json::from_slice(&std::fs::read(&stored).unwrap()).unwrap();
    let dotdot_blob = gzip(&dotdot);
    manifest["layers"][0]["digest"] = json!(Digest::of(&dotdot_blob).to_string());
    manifest["layers"][0]["size"] = json!(dotdot_blob.len());
    let swapped = manifest.to_string().into_bytes();
    std::fs::write(&stored, &swapped).unwrap();
    let served = Digest::of(&swapped);
    let pinned = format!(
        "{}@{pushed}",
        registry.reference("x").rsplit_once(':').unwrap().0
    );

    let main_pid = d.unit_property("ptraind.service", "MainPID");
    let reference = |tag: &str| registry.reference(tag);
    let layer = |tar: &[u8]| Digest::of(&gzip(tar)).to_string();
    // (job, image, script, what its refusal must say)
    let refusals: Vec<(&str, String, Vec<String>)> = vec![
        (
            "dotdot",
            reference("dotdot"),
            vec![
                layer(&dotdot),
                format!("entry {dotdot_path:?} refused: `..` component"),
                "the image is unsafe or damaged".into(),
            ],
        ),
        (
            "absolute",
            reference("absolute"),
            vec![
                layer(&absolute),
                format!("entry \"{outside_str}/absolute-escape\" refused: absolute path"),
            ],
        ),
        (
            "hardlink",
            reference("hardlink"),
            vec![
                layer(&hardlink),
                format!(
                    "entry \"bin/stolen\" refused: hard link target \"{outside_str}/keep\": absolute path"
                ),
            ],
        ),
        (
            "symlink",
            reference("symlink"),
            vec![
                layer(&through_link),
                "entry \"evil/pwned\" refused: its parent path goes through the symlink \"evil\" (a layer may not write through a link)".into(),
            ],
        ),
        (
            "device",
            reference("device"),
            vec![
                layer(&device),
                "entry \"dev/mem\" refused: device nodes and FIFOs are refused".into(),
            ],
        ),
        (
            "sparse",
            reference("sparse"),
            vec![
                layer(&sparse),
                // The budget left after the base layer's busybox.
                format!(
                    "more than {} bytes of files (reached at entry \"var/log/lastlog\")",
                    MAX_IMAGE - busybox.len() as u64
                ),
            ],
        ),
        (
            "tampered",
            pinned.clone(),
            vec![format!(
                "manifest of {pinned}: expected digest {pushed} but the bytes hash to {served}; the source is corrupt or tampered with"
            )],
        ),
    ];

    // Every job at once: a plain one, the hostile ones, the two that run.
    let job = |id: &str, image: &str, script: &str| {
        d.drop_job(
            ALICE,
            &format!("{id}.json"),
            &image_job(id, image, script, &work, 0),
        );
    };
    job("plain", &reference("plain"), "echo plain ran");
    for (id, image, _) in &refusals {
        job(id, image, "echo ran");
    }
    job(
        "setuid",
        &reference("setuid"),
        "test -u /bin/ids && echo setuid-kept; test -g /bin/ids && echo setgid-kept; \
         busybox stat -c 'mode=%a owner=%u' /bin/ids; /bin/ids",
    );
    job(
        "symlink-layers",
        &reference("symlink-layers"),
        "test -L /evil && echo evil-is-a-link; test -d /evil && echo evil-is-a-dir; \
         busybox cat /evil/pwned",
    );

    for (id, image, reasons) in &refusals {
        let status = d.wait_ended(id);
        assert_eq!(status["status"], "launch-failed", "{id}: {status:#}");
        let detail = status["detail"].as_str().unwrap_or_default();
        assert!(
            detail.starts_with(&format!("could not be launched: image {image}: ")),
            "{id}: {status:#}"
        );
        for reason in reasons {
            assert!(
                detail.contains(reason.as_str()),
                "{id}: {reason:?} not in {status:#}"
            );
        }
        assert!(status["image_digest"].is_null(), "{id}: {status:#}");
        assert!(status["started_at"].is_null(), "{id}: {status:#}");
    }

    let status = d.wait_ended("plain");
    assert_eq!(status["status"], "succeeded", "{status:#}");
    assert_eq!(status["image_digest"], digests["plain"].as_str());
    logs_with(&d, "plain", &["plain ran"]);

    // The setuid file runs, as its owner: its bits were stripped in the
    // tree (and would give nothing under NoNewPrivileges= anyway).
    let status = d.wait_ended("setuid");
    assert_eq!(status["status"], "succeeded", "{status:#}");
    let out = logs_with(&d, "setuid", &["euid="]);
    assert!(out.contains("mode=755 owner=0"), "{out}");
    assert!(
        out.contains(&format!("euid={alice_uid} egid={alice_gid}")),
        "{out}"
    );
    assert!(!out.contains("-kept"), "{out}");

    // A symlink out of the tree, then a later layer's file under its
    // name: the later layer's directory replaces the link in the tree,
    // nothing goes through it.
    let status = d.wait_ended("symlink-layers");
    assert_eq!(status["status"], "succeeded", "{status:#}");
    let out = logs_with(&d, "symlink-layers", &["laid over"]);
    assert!(out.contains("evil-is-a-dir"), "{out}");
    assert!(!out.contains("evil-is-a-link"), "{out}");

    // In the store's trees: no setuid or setgid bit, the link gone.
    let trees = d.state.join("images/trees/sha256");
    let mut ids_seen = 0;
    let mut evil_seen = 0;
    for tree in std::fs::read_dir(&trees).unwrap() {
        let tree = tree.unwrap().path();
        if let Ok(meta) = std::fs::symlink_metadata(tree.join("bin/ids")) {
            assert_eq!(meta.permissions().mode() & 0o7777, 0o755);
            assert_eq!(meta.uid(), 0);
            ids_seen += 1;
        }
        if let Ok(meta) = std::fs::symlink_metadata(tree.join("evil")) {
            assert!(meta.is_dir(), "{}/evil is not a directory", tree.display());
            assert_eq!(
                std::fs::read_to_string(tree.join("evil/pwned")).unwrap(),
                "laid over\n"
            );
            evil_seen += 1;
        }
    }
    assert_eq!((ids_seen, evil_seen), (1, 1), "{}", trees.display());

    // Nothing outside the store: the outside directory as it was, its
    // file with its one link; the test's root holds what it held.
    assert_eq!(names(&outside), BTreeSet::from(["keep".to_string()]));
    assert_eq!(std::fs::read_to_string(&keep).unwrap(), "kept\n");
    assert_eq!(std::fs::metadata(&keep).unwrap().nlink(), 1);
    assert_eq!(names(&d.root), root_names);
    // Inside it: no device node, no setuid or setgid bit, no file near
    // the sparse one's size, and no half-built layer or blob left over;
    // neither the swapped manifest nor the hostile layers are stored as
    // the image of anything.
    let store = d.state.join("images");
    for (path, meta) in walk(&store) {
        let kind = meta.file_type();
        assert!(
            !kind.is_char_device() && !kind.is_block_device() && !kind.is_fifo(),
            "{} is a device or FIFO",
            path.display()
        );
        if !kind.is_symlink() {
            assert_eq!(meta.mode() & 0o6000, 0, "{} keeps s-bits", path.display());
        }
        assert!(meta.len() < MAX_IMAGE, "{}: {}", path.display(), meta.len());
    }
    assert_eq!(names(&store.join("tmp")), BTreeSet::new());
    // Unpacked and kept: the layers of the images that ran, no other.
    assert_eq!(
        names(&store.join("layers/sha256")),
        [&base, &setuid, &link_only, &under_link]
            .iter()
            .map(|l| Digest::of(l).hex().to_string())
            .collect::<BTreeSet<_>>()
    );
    assert!(!names(&store.join("blobs/sha256")).contains(served.hex()));
    let listed = text(&d.ptrain("root", &["images", "--json"]));
    let listed: Vec<Value> = serde_json::from_str(&listed).unwrap_or_default();
    let listed: BTreeSet<&str> = listed
        .iter()
        .filter_map(|i| i["reference"].as_str())
        .collect();
    assert_eq!(
        listed,
        BTreeSet::from([
            reference("plain").as_str(),
            reference("setuid").as_str(),
            reference("symlink-layers").as_str(),
        ]),
        "ptrain images"
    );

    // ptraind is the same process, never restarted, and runs image jobs.
    assert_eq!(d.unit_property("ptraind.service", "MainPID"), main_pid);
    assert_eq!(d.unit_property("ptraind.service", "NRestarts"), "0");
    let status = d.run_to_end(
        ALICE,
        "after",
        &image_job("after", &reference("plain"), "echo after ran", &work, 0),
    );
    assert_eq!(status["status"], "succeeded", "{status:#}");
    logs_with(&d, "after", &["after ran"]);
    d.assert_alive();
}
