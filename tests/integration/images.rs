//! Issue 21: container images against real parts. An image built with
//! Debian's umoci (a static busybox, a hard link, a symlink, a setuid file
//! and a file the second layer deletes, so a real whiteout), pushed by
//! skopeo to a real registry (Debian's docker-registry, the distribution
//! project's server) on loopback and written by skopeo as `oci-archive:`
//! and `docker-archive:` files. Shown: a pull verifies the manifest digest
//! the registry reports and gives a root-owned, read-only tree with the
//! whiteout applied and no setuid bit, that a job's argv (docker run's
//! rule) really runs in under chroot; the archives, the OCI layout, a
//! Docker-format manifest, zstd layers and a pull pinned by digest all
//! share the pull's layers and tree in one store; a blob tampered with
//! inside the registry's storage is refused naming both digests and
//! leaves nothing; a collection keeps the pinned image usable and removes
//! only what the other image alone used.
//!
//! Needs root (umoci unpacks as root, chroot) and the packages
//! docker-registry, skopeo, umoci and busybox-static
//! (tests/install-deps.sh installs them).

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use ptrain::images::archive;
use ptrain::images::catalog::plan_gc;
use ptrain::images::manifest::launch_argv;
use ptrain::images::registry::{PullError, PullProgress, RegistryClient, RegistryOptions};
use ptrain::images::{
    Digest, FetchLimits, Fetched, GcPolicy, ImageLimits, ImageReference, ImageSource, ImageStore,
    Platform, PreparedImage,
};
use serde_json::Value;

use crate::harness::wait_for;
use crate::test_server::free_port;

const WAIT: Duration = Duration::from_secs(20);
const REPO: &str = "ptrain/test";

// ---------------------------------------------------------------------------
// Tools.

/// Fails with the package to install when `tool` does not run.
fn need(tool: &str, package: &str) {
    let runs = Command::new(tool)
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    assert!(
        runs,
        "{tool} is missing: apt-get install {package} (tests/install-deps.sh does)"
    );
}

/// Runs `cmd`, failing the test with its stderr when it fails; its stdout.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn skopeo() -> Command {
    let mut cmd = Command::new("skopeo");
    // No dependence on the machine's /etc/containers/policy.json.
    cmd.arg("--insecure-policy");
    cmd
}

// ---------------------------------------------------------------------------
// A real registry on loopback.

pub(crate) struct Registry {
    child: Child,
    port: u16,
    storage: PathBuf,
    /// `user:password` the registry asks for (htpasswd), if any.
    creds: Option<String>,
    _dir: tempfile::TempDir,
}

/// Whether `GET /v2/` on the port answers (200, or 401 where it asks for
/// credentials).
fn v2_answers(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET /v2/ HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    if s.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    let status = reply.split_whitespace().nth(1).unwrap_or_default();
    reply.starts_with("HTTP/1.") && matches!(status, "200" | "401")
}

impl Registry {
    pub(crate) fn start() -> Registry {
        Registry::start_with(None)
    }

    /// A registry that lets only `user` with `password` pull or push
    /// (basic auth from an htpasswd file, as its docs deploy it).
    pub(crate) fn start_with_auth(user: &str, password: &str) -> Registry {
        Registry::start_with(Some((user, password)))
    }

    fn start_with(auth: Option<(&str, &str)>) -> Registry {
        need("docker-registry", "docker-registry");
        let dir = tempfile::tempdir().unwrap();
        let storage = dir.path().join("storage");
        fs::create_dir(&storage).unwrap();
        let port = free_port();
        let config = dir.path().join("config.yml");
        let mut auth_config = String::new();
        if let Some((user, password)) = auth {
            need("htpasswd", "apache2-utils");
            let htpasswd = dir.path().join("htpasswd");
            let line = run(Command::new("htpasswd").args(["-Bbn", user, password]));
            fs::write(&htpasswd, line.trim()).unwrap();
            auth_config = format!(
                "auth:\n  htpasswd:\n    realm: ptrain-test\n    path: {}\n",
                htpasswd.display()
            );
        }
        fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n{auth_config}",
                storage.display()
            ),
        )
        .unwrap();
        let log_path = dir.path().join("registry.log");
        let log = File::create(&log_path).unwrap();
        let mut child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("docker-registry (apt-get install docker-registry)");
        wait_for("docker-registry to answer GET /v2/", WAIT, || {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "docker-registry exited ({status}): {}",
                    fs::read_to_string(&log_path).unwrap_or_default()
                );
            }
            v2_answers(port).then_some(())
        });
        Registry {
            child,
            port,
            storage,
            creds: auth.map(|(user, password)| format!("{user}:{password}")),
            _dir: dir,
        }
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// ptraind's `[images]` line that lets it speak plain http to this
    /// registry (a loopback one is not trusted unless listed).
    pub(crate) fn insecure_line(&self) -> String {
        format!("insecure_registries = [{:?}]\n", self.host())
    }

    /// The reference of `REPO:tag` here.
    pub(crate) fn reference(&self, tag: &str) -> String {
        format!("{}/{REPO}:{tag}", self.host())
    }

    /// Pushes tag `tag` of the image's layout here with skopeo; the
    /// manifest digest the registry then reports (skopeo inspect).
    pub(crate) fn push(&self, image: &TestImage, tag: &str) -> String {
        let docker = format!("docker://{}", self.reference(tag));
        let (dest_creds, creds) = match &self.creds {
            Some(c) => (
                vec![format!("--dest-creds={c}")],
                vec![format!("--creds={c}")],
            ),
            None => (Vec::new(), Vec::new()),
        };
        run(skopeo()
            .args(["copy", "--quiet", "--dest-tls-verify=false"])
            .args(&dest_creds)
            .arg(image.oci(tag))
            .arg(&docker));
        let inspect = run(skopeo()
            .args(["inspect", "--tls-verify=false"])
            .args(&creds)
            .arg(&docker));
        let inspect: Value = serde_json::from_str(&inspect).unwrap();
        inspect["Digest"]
            .as_str()
            .expect("skopeo inspect gives a Digest")
            .to_string()
    }

    /// Stops the registry (SIGSTOP): connections are still accepted by
    /// the kernel, but nothing is answered until [`Registry::resume`].
    pub(crate) fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    pub(crate) fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) on our own child, which is not yet reaped.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill {pid}: {}", std::io::Error::last_os_error());
    }

    /// Pushes `source` (a skopeo name) as `dest_tag` with skopeo's
    /// extra `flags`; the registry's digest and its raw manifest.
    fn push_as(&self, source: &str, dest_tag: &str, flags: &[&str]) -> (String, Value) {
        let docker = format!("docker://{}", self.reference(dest_tag));
        run(skopeo()
            .args(["copy", "--quiet", "--dest-tls-verify=false"])
            .args(flags)
            .arg(source)
            .arg(&docker));
        let inspect = run(skopeo().args(["inspect", "--tls-verify=false", &docker]));
        let inspect: Value = serde_json::from_str(&inspect).unwrap();
        let raw = run(skopeo().args(["inspect", "--raw", "--tls-verify=false", &docker]));
        (
            inspect["Digest"].as_str().unwrap().to_string(),
            serde_json::from_str(&raw).unwrap(),
        )
    }

    /// Pushes `source` (a skopeo name, e.g. `oci:LAYOUT:tag`) as tag
    /// `tag`; the manifest digest the registry then reports.
    pub(crate) fn push_source(&self, source: &str, tag: &str) -> String {
        self.push_as(source, tag, &[]).0
    }

    /// Where the registry keeps a blob's bytes.
    pub(crate) fn blob_data(&self, digest: &Digest) -> PathBuf {
        let hex = digest.hex();
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------
// A two-layer image built with umoci.

pub(crate) struct TestImage {
    dir: tempfile::TempDir,
    layout: PathBuf,
    bundles: usize,
}

const RELEASE: &str = "busybox-image\n";
const SECOND: &str = "second\n";
const EXTRA: &str = "extra layer\n";

fn umoci() -> Command {
    Command::new("umoci")
}

impl TestImage {
    /// Tag v1: layer 1 has bin/busybox (static), bin/sh -> busybox,
    /// etc/image-release, etc/remove-me and a setuid bin/suid; layer 2
    /// deletes etc/remove-me (a whiteout) and adds etc/second; the config
    /// says PATH=/bin, Entrypoint /bin/sh, Cmd -c "echo default".
    pub(crate) fn build() -> TestImage {
        need("umoci", "umoci");
        need("skopeo", "skopeo");
        assert!(
            Path::new("/usr/bin/busybox").is_file(),
            "/usr/bin/busybox is missing: apt-get install busybox-static (tests/install-deps.sh does)"
        );
        let dir = tempfile::tempdir().unwrap();
        let layout = dir.path().join("layout");
        let mut image = TestImage {
            dir,
            layout,
            bundles: 0,
        };
        run(umoci().arg("init").arg("--layout").arg(&image.layout));
        run(umoci().args(["new", "--image"]).arg(image.tag("v1")));

        let bundle = image.unpack("v1");
        let rootfs = bundle.join("rootfs");
        for d in ["bin", "etc"] {
            fs::create_dir(rootfs.join(d)).unwrap();
            fs::set_permissions(rootfs.join(d), fs::Permissions::from_mode(0o755)).unwrap();
        }
        fs::copy("/usr/bin/busybox", rootfs.join("bin/busybox")).unwrap();
        // A hard link (a tar link entry): busybox runs as `cat` by name.
        fs::hard_link(rootfs.join("bin/busybox"), rootfs.join("bin/cat")).unwrap();
        std::os::unix::fs::symlink("busybox", rootfs.join("bin/sh")).unwrap();
        fs::write(rootfs.join("etc/image-release"), RELEASE).unwrap();
        fs::write(rootfs.join("etc/remove-me"), "gone in layer 2\n").unwrap();
        fs::copy("/usr/bin/busybox", rootfs.join("bin/suid")).unwrap();
        fs::set_permissions(rootfs.join("bin/suid"), fs::Permissions::from_mode(0o4755)).unwrap();
        image.repack(&bundle, "v1");

        let bundle = image.unpack("v1");
        fs::remove_file(bundle.join("rootfs/etc/remove-me")).unwrap();
        fs::write(bundle.join("rootfs/etc/second"), SECOND).unwrap();
        image.repack(&bundle, "v1");

        run(umoci()
            .args(["config", "--image"])
            .arg(image.tag("v1"))
            .args([
                "--config.env=PATH=/bin",
                "--config.entrypoint=/bin/sh",
                "--config.cmd=-c",
                "--config.cmd=echo default",
            ]));
        image
    }

    /// Tag `tag`: v1 and a third layer adding opt/extra.
    pub(crate) fn add_tag_with_extra_layer(&mut self, tag: &str) {
        let bundle = self.unpack("v1");
        let opt = bundle.join("rootfs/opt");
        fs::create_dir(&opt).unwrap();
        fs::set_permissions(&opt, fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(opt.join("extra"), EXTRA).unwrap();
        self.repack(&bundle, tag);
    }

    /// `LAYOUT:tag`, as umoci names an image.
    fn tag(&self, tag: &str) -> String {
        format!("{}:{tag}", self.layout.display())
    }

    /// `oci:LAYOUT:tag`, as skopeo names it.
    fn oci(&self, tag: &str) -> String {
        format!("oci:{}", self.tag(tag))
    }

    fn unpack(&mut self, tag: &str) -> PathBuf {
        self.bundles += 1;
        let bundle = self.dir.path().join(format!("bundle{}", self.bundles));
        run(umoci()
            .args(["unpack", "--image"])
            .arg(self.tag(tag))
            .arg(&bundle));
        bundle
    }

    fn repack(&self, bundle: &Path, tag: &str) {
        run(umoci()
            .args(["repack", "--image"])
            .arg(self.tag(tag))
            .arg(bundle));
    }

    /// The image manifest of `tag` in the layout, as JSON.
    fn manifest(&self, tag: &str) -> Value {
        let index: Value =
            serde_json::from_slice(&fs::read(self.layout.join("index.json")).unwrap()).unwrap();
        let entry = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
            .unwrap_or_else(|| panic!("tag {tag} in {index}"));
        let digest = Digest::parse(entry["digest"].as_str().unwrap()).unwrap();
        let path = self.layout.join("blobs/sha256").join(digest.hex());
        serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
    }

    /// The layer blob digests of `tag`, bottom first.
    pub(crate) fn layers(&self, tag: &str) -> Vec<(Digest, u64)> {
        self.manifest(tag)["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    Digest::parse(l["digest"].as_str().unwrap()).unwrap(),
                    l["size"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    /// The bytes a pull of `tag` fetches after its manifest: the config
    /// and every layer.
    fn pulled_bytes(&self, tag: &str) -> u64 {
        let m = self.manifest(tag);
        m["config"]["size"].as_u64().unwrap() + self.layers(tag).iter().map(|l| l.1).sum::<u64>()
    }

    /// Copies tag v1 with skopeo into a second OCI layout with zstd
    /// layers; its skopeo name (`oci:PATH:v1`).
    fn zstd_layout(&self) -> String {
        let name = format!("oci:{}:v1", self.dir.path().join("zstd").display());
        run(skopeo()
            .args(["copy", "--quiet", "--dest-compress-format", "zstd"])
            .arg(self.oci("v1"))
            .arg(&name));
        name
    }

    /// Writes `kind:PATH` with skopeo (`oci-archive` or `docker-archive`)
    /// from tag v1; its path.
    pub(crate) fn archive(&self, kind: &str) -> PathBuf {
        let path = self.dir.path().join(format!("{kind}.tar"));
        let dest = match kind {
            "oci-archive" => format!("oci-archive:{}:v1", path.display()),
            _ => format!("docker-archive:{}:{REPO}:v1", path.display()),
        };
        run(skopeo()
            .args(["copy", "--quiet"])
            .arg(self.oci("v1"))
            .arg(dest));
        path
    }
}

// ---------------------------------------------------------------------------
// Pulling and looking.

/// Pulls `reference` with the real client; the result and every progress
/// report.
fn pull(store: &ImageStore, reference: &str) -> (Result<Fetched, PullError>, Vec<PullProgress>) {
    let reference = ImageReference::parse(reference).unwrap();
    // The test's loopback registry speaks plain http: listed, as an admin would.
    let client = RegistryClient::new(RegistryOptions {
        insecure: [reference.registry.clone()].into(),
        ..RegistryOptions::default()
    })
    .unwrap();
    let seen = Mutex::new(Vec::new());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let result = rt.block_on(client.pull(&reference, store.blobs(), &|p: &PullProgress| {
        seen.lock().unwrap().push(p.clone())
    }));
    (result, seen.into_inner().unwrap())
}

fn pull_and_prepare(store: &ImageStore, reference: &str, now: u64) -> PreparedImage {
    let (fetched, _) = pull(store, reference);
    let fetched = fetched.unwrap_or_else(|e| panic!("pull {reference}: {e}"));
    store
        .prepare(&fetched, &ImageLimits::default(), now)
        .unwrap_or_else(|e| panic!("prepare {reference}: {e}"))
}

/// Every path under `root` (not following symlinks), relative, with its
/// metadata; `root` itself as "".
fn walk(root: &Path) -> Vec<(PathBuf, fs::Metadata)> {
    let mut out = vec![(PathBuf::new(), fs::symlink_metadata(root).unwrap())];
    let mut i = 0;
    while i < out.len() {
        if out[i].1.is_dir() {
            let rel = out[i].0.clone();
            let mut children: Vec<_> = fs::read_dir(root.join(&rel))
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            children.sort();
            for name in children {
                let path = rel.join(name);
                let meta = fs::symlink_metadata(root.join(&path)).unwrap();
                out.push((path, meta));
            }
        }
        i += 1;
    }
    out
}

fn names(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Runs `argv` chrooted into `rootfs` with PATH=/bin (the image's); its
/// stdout. chroot by its path: the child's PATH is the one searched.
fn run_in(rootfs: &Path, argv: &[String]) -> String {
    let out = Command::new("/usr/sbin/chroot")
        .arg(rootfs)
        .args(argv)
        .env_clear()
        .env("PATH", "/bin")
        .stdin(Stdio::null())
        .output()
        .expect("chroot (coreutils)");
    assert!(
        out.status.success(),
        "chroot {} {argv:?}: {}: {} (a dynamically linked busybox cannot run in the image: \
         apt-get install busybox-static, tests/install-deps.sh does)",
        rootfs.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The job command the tests run: the image's Entrypoint (/bin/sh) gets
/// it in place of the image's Cmd.
fn job_command() -> Vec<String> {
    strings(&["-c", "cat /etc/image-release && echo job ran"])
}

// ---------------------------------------------------------------------------
// Tests.

#[test]
fn a_registry_pull_is_verified_and_gives_a_root_owned_tree_a_job_runs_in() {
    let registry = Registry::start();
    let image = TestImage::build();
    let registry_digest = registry.push(&image, "v1");
    let work = tempfile::tempdir().unwrap();
    let store = ImageStore::open(&work.path().join("store")).unwrap();

    let (fetched, progress) = pull(&store, &registry.reference("v1"));
    let fetched = fetched.unwrap_or_else(|e| panic!("pull: {e}"));
    assert_eq!(fetched.manifest.to_string(), registry_digest);
    assert_eq!(fetched.source, registry.reference("v1"));
    assert_eq!(fetched.index, None);

    // Progress: one total (the config and both layers), reaching it.
    let total = image.pulled_bytes("v1");
    assert!(total > 1_000_000, "busybox is in a layer: {total}");
    let last = progress.last().expect("progress was reported");
    assert_eq!((last.done, last.total), (total, total));
    assert!(progress.iter().all(|p| p.total == total && p.done <= total));
    assert!(progress.windows(2).all(|w| w[0].done <= w[1].done));

    let prepared = store
        .prepare(&fetched, &ImageLimits::default(), 1000)
        .unwrap_or_else(|e| panic!("prepare: {e}"));
    let rootfs = &prepared.rootfs;
    assert!(
        rootfs.starts_with(work.path().join("store/trees/sha256")),
        "{}",
        rootfs.display()
    );
    assert_eq!(
        rootfs.file_name().unwrap().to_str().unwrap(),
        prepared.record.chain_id.hex()
    );

    // The files of both layers, the whiteout applied.
    assert_eq!(
        fs::read(rootfs.join("bin/busybox")).unwrap(),
        fs::read("/usr/bin/busybox").unwrap()
    );
    let ino = |p: &str| fs::symlink_metadata(rootfs.join(p)).unwrap().ino();
    assert_eq!(ino("bin/cat"), ino("bin/busybox"), "the hard link is kept");
    assert_ne!(ino("bin/suid"), ino("bin/busybox"));
    let sh = fs::symlink_metadata(rootfs.join("bin/sh")).unwrap();
    assert!(sh.file_type().is_symlink(), "bin/sh is a symlink");
    assert_eq!(
        fs::read_link(rootfs.join("bin/sh")).unwrap(),
        Path::new("busybox")
    );
    assert_eq!(
        fs::read_to_string(rootfs.join("etc/image-release")).unwrap(),
        RELEASE
    );
    assert_eq!(
        fs::read_to_string(rootfs.join("etc/second")).unwrap(),
        SECOND
    );
    assert_eq!(
        fs::symlink_metadata(rootfs.join("etc/remove-me"))
            .unwrap_err()
            .kind(),
        std::io::ErrorKind::NotFound
    );
    assert_eq!(
        names(&rootfs.join("etc")),
        BTreeSet::from(["image-release".to_string(), "second".to_string()])
    );

    // Modes and owners: setuid gone, everything root's, nothing writable
    // but by root.
    let suid = fs::metadata(rootfs.join("bin/suid")).unwrap();
    assert_eq!(suid.permissions().mode() & 0o7777, 0o755);
    let entries = walk(rootfs);
    assert!(entries.len() >= 8, "{entries:?}");
    for (path, meta) in &entries {
        let name = path.display().to_string();
        assert!(
            !name.contains(".wh."),
            "a whiteout reached the tree: {name}"
        );
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "{name} is not root's");
        if !meta.file_type().is_symlink() {
            let mode = meta.permissions().mode() & 0o7777;
            assert_eq!(mode & 0o7022, 0, "{name} has mode {mode:o}");
        }
    }
    assert_eq!(
        fs::metadata(rootfs).unwrap().permissions().mode() & 0o7777,
        0o755
    );

    // The config as umoci wrote it, and docker run's argv rule.
    let run_config = &prepared.config.config;
    assert_eq!(run_config.entrypoint, Some(strings(&["/bin/sh"])));
    assert_eq!(run_config.cmd, Some(strings(&["-c", "echo default"])));
    assert_eq!(run_config.env, Some(strings(&["PATH=/bin"])));
    let argv = launch_argv(run_config, &job_command()).unwrap();
    let mut expected = strings(&["/bin/sh"]);
    expected.extend(job_command());
    assert_eq!(argv, expected);
    let default = launch_argv(run_config, &[]).unwrap();
    assert_eq!(default, strings(&["/bin/sh", "-c", "echo default"]));

    // The tree really runs them.
    assert_eq!(run_in(rootfs, &argv), format!("{RELEASE}job ran\n"));
    assert_eq!(run_in(rootfs, &default), "default\n");

    let list = store.list().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].reference, registry.reference("v1"));
    assert_eq!(list[0].digest.to_string(), registry_digest);
    assert_eq!(names(&work.path().join("store/tmp")), BTreeSet::new());
}

#[test]
fn archives_of_the_image_share_the_registry_pulls_layers_and_tree() {
    let registry = Registry::start();
    let image = TestImage::build();
    let registry_digest = registry.push(&image, "v1");
    let oci_archive = image.archive("oci-archive");
    let docker_archive = image.archive("docker-archive");
    let work = tempfile::tempdir().unwrap();
    let store = ImageStore::open(&work.path().join("store")).unwrap();

    let pulled = pull_and_prepare(&store, &registry.reference("v1"), 1000);
    let import = |source: &str, now: u64| {
        let source = ImageSource::parse(source).unwrap();
        let fetched = archive::import(
            &source,
            store.blobs(),
            &Platform::host(),
            &FetchLimits::default(),
        )
        .unwrap_or_else(|e| panic!("import {source}: {e}"));
        assert_eq!(fetched.source, source.to_string());
        store
            .prepare(&fetched, &ImageLimits::default(), now)
            .unwrap_or_else(|e| panic!("prepare {source}: {e}"))
    };
    let oci_name = format!("oci-archive:{}:v1", oci_archive.display());
    let docker_name = format!("docker-archive:{}", docker_archive.display());
    let from_oci = import(&oci_name, 2000);
    let from_docker = import(&docker_name, 3000);

    // skopeo copies the OCI manifest as it is: the same image by digest.
    assert_eq!(from_oci.record.manifest.to_string(), registry_digest);
    // docker save's layout has no manifest blob; ptrain writes one, so
    // the digest differs, but the layers (by diff-id) are the same.
    assert_ne!(from_docker.record.manifest.to_string(), registry_digest);
    let diff_ids = |p: &PreparedImage| -> Vec<Digest> {
        p.record.layers.iter().map(|l| l.diff_id.clone()).collect()
    };
    assert_eq!(diff_ids(&pulled).len(), 2);
    assert_eq!(diff_ids(&from_oci), diff_ids(&pulled));
    assert_eq!(diff_ids(&from_docker), diff_ids(&pulled));
    assert_eq!(diff_ids(&pulled), pulled.config.rootfs.diff_ids);

    // One tree (by chain id) and two layer directories for all three.
    assert_eq!(from_oci.rootfs, pulled.rootfs);
    assert_eq!(from_docker.rootfs, pulled.rootfs);
    let store_root = work.path().join("store");
    assert_eq!(
        names(&store_root.join("trees/sha256")),
        BTreeSet::from([pulled.record.chain_id.hex().to_string()])
    );
    assert_eq!(
        names(&store_root.join("layers/sha256")),
        diff_ids(&pulled)
            .iter()
            .map(|d| d.hex().to_string())
            .collect::<BTreeSet<_>>()
    );
    // The tree's file is the base layer's inode: shared, not copied.
    let base_layer = store_root
        .join("layers/sha256")
        .join(diff_ids(&pulled)[0].hex())
        .join("root");
    let ino = |p: &Path| fs::metadata(p).unwrap().ino();
    assert_eq!(
        ino(&pulled.rootfs.join("bin/busybox")),
        ino(&base_layer.join("bin/busybox"))
    );
    assert_eq!(
        fs::read_to_string(from_docker.rootfs.join("etc/second")).unwrap(),
        SECOND
    );
    assert!(!from_docker.rootfs.join("etc/remove-me").exists());

    let list = store.list().unwrap();
    let listed: Vec<(String, String)> = list
        .iter()
        .map(|l| (l.reference.clone(), l.digest.to_string()))
        .collect();
    let mut expected = vec![
        (registry.reference("v1"), registry_digest.clone()),
        (oci_name, registry_digest.clone()),
        (docker_name, from_docker.record.manifest.to_string()),
    ];
    expected.sort();
    assert_eq!(listed, expected);
    assert_eq!(
        list.iter().map(|l| l.last_used).collect::<BTreeSet<_>>(),
        BTreeSet::from([1000, 2000, 3000])
    );
}

#[test]
fn a_blob_tampered_with_in_the_registry_is_refused_naming_both_digests() {
    let registry = Registry::start();
    let image = TestImage::build();
    registry.push(&image, "v1");
    let (layer, size) = image.layers("v1")[0].clone();
    let data = registry.blob_data(&layer);
    assert_eq!(fs::metadata(&data).unwrap().len(), size);
    let tampered = vec![b'x'; size as usize];
    fs::write(&data, &tampered).unwrap();
    let actual = Digest::of(&tampered);

    let work = tempfile::tempdir().unwrap();
    let store_root = work.path().join("store");
    let store = ImageStore::open(&store_root).unwrap();
    let (result, _) = pull(&store, &registry.reference("v1"));
    let err = result.expect_err("a tampered layer must not be accepted");
    let text = err.to_string();
    assert!(
        text.contains(&layer.to_string()) && text.contains(&actual.to_string()),
        "the error names neither or one digest: {text}"
    );

    // Nothing of the layer in the store, no half-written file, nothing
    // built, no record; nothing written beside the store.
    assert!(!store.blobs().contains(&layer));
    assert!(!names(&store_root.join("blobs/sha256")).contains(layer.hex()));
    assert!(!names(&store_root.join("blobs/sha256")).contains(actual.hex()));
    for sub in ["tmp", "layers/sha256", "trees/sha256", "images"] {
        assert_eq!(names(&store_root.join(sub)), BTreeSet::new(), "{sub}");
    }
    assert!(store.list().unwrap().is_empty());
    assert_eq!(names(work.path()), BTreeSet::from(["store".to_string()]));
}

#[test]
fn gc_keeps_the_pinned_image_usable_and_removes_only_what_the_other_used_alone() {
    let registry = Registry::start();
    let mut image = TestImage::build();
    image.add_tag_with_extra_layer("v2");
    let v1_digest = registry.push(&image, "v1");
    let v2_digest = registry.push(&image, "v2");
    assert_ne!(v1_digest, v2_digest);
    let work = tempfile::tempdir().unwrap();
    let store_root = work.path().join("store");
    let store = ImageStore::open(&store_root).unwrap();

    // v1 is the least recently used: only keeping it by digest saves it.
    let v1 = pull_and_prepare(&store, &registry.reference("v1"), 1000);
    let v2 = pull_and_prepare(&store, &registry.reference("v2"), 2000);
    assert_eq!(
        fs::read_to_string(v2.rootfs.join("opt/extra")).unwrap(),
        EXTRA
    );
    assert_eq!(v2.record.layers.len(), 3);
    assert_eq!(v2.record.layers[..2], v1.record.layers[..]);
    assert_eq!(names(&store_root.join("layers/sha256")).len(), 3);
    assert_eq!(names(&store_root.join("trees/sha256")).len(), 2);
    let blobs_before = names(&store_root.join("blobs/sha256"));
    assert_eq!(blobs_before.len(), 2 + 2 + 3); // two manifests, two configs, three layers

    let records = store.records().unwrap();
    let policy = GcPolicy {
        max_total_bytes: Some(1),
        keep: BTreeSet::from([v1.record.manifest.clone()]),
        ..GcPolicy::default()
    };
    let plan = plan_gc(&records, &policy, 3000);
    assert_eq!(plan.remove, vec![registry.reference("v2")]);
    assert!(plan.bytes_after < plan.bytes_before);
    let report = store.collect(&plan).unwrap();
    assert_eq!(
        (report.images, report.trees, report.layers, report.blobs),
        (1, 1, 1, 3) // v2's manifest, config and extra layer blob
    );

    // v2's tree and extra layer are gone; the shared layers and v1 stay.
    assert!(!v2.rootfs.exists());
    let extra = &v2.record.layers[2];
    assert!(!store_root
        .join("layers/sha256")
        .join(extra.diff_id.hex())
        .exists());
    assert!(!store.blobs().contains(&extra.blob));
    assert_eq!(
        names(&store_root.join("layers/sha256")),
        v1.record
            .layers
            .iter()
            .map(|l| l.diff_id.hex().to_string())
            .collect::<BTreeSet<_>>()
    );
    assert_eq!(
        names(&store_root.join("trees/sha256")),
        BTreeSet::from([v1.record.chain_id.hex().to_string()])
    );
    let v1_blobs: BTreeSet<String> = v1.record.blobs().map(|d| d.hex().to_string()).collect();
    assert_eq!(v1_blobs.len(), 4);
    assert_eq!(names(&store_root.join("blobs/sha256")), v1_blobs);
    let list = store.list().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].reference, registry.reference("v1"));
    assert_eq!(list[0].digest.to_string(), v1_digest);

    // v1 still runs, and prepares again from what is left (no pull).
    let argv = launch_argv(&v1.config.config, &job_command()).unwrap();
    assert_eq!(run_in(&v1.rootfs, &argv), format!("{RELEASE}job ran\n"));
    let fetched = Fetched {
        source: registry.reference("v1"),
        index: None,
        manifest: v1.record.manifest.clone(),
    };
    let again = store
        .prepare(&fetched, &ImageLimits::default(), 4000)
        .unwrap();
    assert_eq!(again.rootfs, v1.rootfs);
    assert_eq!(again.record.prepared_at, 1000);
    assert_eq!(names(&store_root.join("tmp")), BTreeSet::new());
}

#[test]
fn docker_manifests_zstd_layers_digest_pins_and_layouts_give_the_same_tree() {
    let registry = Registry::start();
    let image = TestImage::build();
    let oci_digest = registry.push(&image, "v1");
    let (docker_digest, docker_manifest) =
        registry.push_as(&image.oci("v1"), "docker", &["--format", "v2s2"]);
    // Pushed from a zstd layout: skopeo reuses the registry's gzip blobs
    // when asked to recompress on the way.
    let (zstd_digest, zstd_manifest) = registry.push_as(&image.zstd_layout(), "zstd", &[]);
    assert_eq!(
        docker_manifest["mediaType"],
        "application/vnd.docker.distribution.manifest.v2+json"
    );
    for layer in docker_manifest["layers"].as_array().unwrap() {
        assert_eq!(
            layer["mediaType"],
            "application/vnd.docker.image.rootfs.diff.tar.gzip"
        );
    }
    for layer in zstd_manifest["layers"].as_array().unwrap() {
        assert_eq!(
            layer["mediaType"],
            "application/vnd.oci.image.layer.v1.tar+zstd"
        );
    }
    let work = tempfile::tempdir().unwrap();
    let store = ImageStore::open(&work.path().join("store")).unwrap();

    let oci = pull_and_prepare(&store, &registry.reference("v1"), 1000);
    let docker = pull_and_prepare(&store, &registry.reference("docker"), 2000);
    let zstd = pull_and_prepare(&store, &registry.reference("zstd"), 3000);
    let pinned_name = format!("{}/{REPO}@{oci_digest}", registry.host());
    let pinned = pull_and_prepare(&store, &pinned_name, 4000);
    let layout = ImageSource::parse(&image.oci("v1")).unwrap();
    let fetched = archive::import(
        &layout,
        store.blobs(),
        &Platform::host(),
        &FetchLimits::default(),
    )
    .unwrap_or_else(|e| panic!("import {layout}: {e}"));
    let from_layout = store
        .prepare(&fetched, &ImageLimits::default(), 5000)
        .unwrap();

    assert_eq!(oci.record.manifest.to_string(), oci_digest);
    assert_eq!(docker.record.manifest.to_string(), docker_digest);
    assert_eq!(zstd.record.manifest.to_string(), zstd_digest);
    assert_eq!(pinned.record.manifest.to_string(), oci_digest);
    assert_eq!(from_layout.record.manifest.to_string(), oci_digest);
    assert_ne!(docker_digest, oci_digest);
    assert_ne!(zstd_digest, oci_digest);
    // The zstd layers are other blobs with the same contents.
    assert_ne!(zstd.record.layers[0].blob, oci.record.layers[0].blob);
    for p in [&docker, &zstd, &pinned, &from_layout] {
        assert_eq!(p.record.layers.len(), 2);
        assert_eq!(
            p.record
                .layers
                .iter()
                .map(|l| &l.diff_id)
                .collect::<Vec<_>>(),
            oci.record
                .layers
                .iter()
                .map(|l| &l.diff_id)
                .collect::<Vec<_>>()
        );
        assert_eq!(p.rootfs, oci.rootfs);
        assert_eq!(p.config.config, oci.config.config);
    }
    let store_root = work.path().join("store");
    assert_eq!(names(&store_root.join("trees/sha256")).len(), 1);
    assert_eq!(names(&store_root.join("layers/sha256")).len(), 2);
    assert_eq!(
        store
            .list()
            .unwrap()
            .iter()
            .map(|l| l.reference.clone())
            .collect::<BTreeSet<_>>(),
        BTreeSet::from([
            registry.reference("v1"),
            registry.reference("docker"),
            registry.reference("zstd"),
            pinned_name,
            image.oci("v1"),
        ])
    );
    let argv = launch_argv(&docker.config.config, &job_command()).unwrap();
    assert_eq!(run_in(&docker.rootfs, &argv), format!("{RELEASE}job ran\n"));
}
