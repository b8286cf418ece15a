//! A real ptraind, run as a Type=notify service inside a real systemd
//! harness, with its own spool, state and declared GPUs.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::harness::{ensure_user, repo_root, wait_for, Harness};

pub const PTRAIND: &str = env!("CARGO_BIN_EXE_ptraind");
pub const PTRAIN: &str = env!("CARGO_BIN_EXE_ptrain");
pub const WAIT: Duration = Duration::from_secs(20);

/// ptraind where every test user can run it: a job unit's ExecStart is
/// `ptraind exec-job`, run as the job's owner, and a checkout may sit where
/// those users cannot reach (under /root). A hard link (a copy across file
/// systems) under /srv/ptrain-tests, made once per test process; the ones
/// of earlier processes are removed.
pub fn ptraind_bin() -> &'static Path {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let base = Path::new("/srv/ptrain-tests");
        std::fs::create_dir_all(base).unwrap();
        std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mine = format!("bin-{}", std::process::id());
        for entry in std::fs::read_dir(base).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("bin-") {
                if name != mine && !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        let dir = base.join(mine);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = dir.join("ptraind");
        let _ = std::fs::remove_file(&bin);
        if std::fs::hard_link(PTRAIND, &bin).is_err() {
            std::fs::copy(PTRAIND, &bin).unwrap();
        }
        bin
    })
}

/// Local users the tests drop files as.
pub const ALICE: &str = "ptrain-alice";
pub const BOB: &str = "ptrain-bob";

pub struct TestDaemon {
    pub harness: Harness,
    pub root: PathBuf,
    pub config: PathBuf,
    pub spool: PathBuf,
    pub state: PathBuf,
}

pub struct Opts {
    pub gpus: u32,
    pub extra_config: String,
    /// Put the state directory on a tmpfs of this many KiB (disk-full tests).
    pub state_tmpfs_kib: Option<u64>,
    /// The harness journal's size limit (RuntimeMaxUse=; default 64M).
    pub journal_max: Option<&'static str>,
    /// `Some(state)`: `backend = "nvml"`, and the NVML ptraind loads is the
    /// fake driver (tests/fake-nvml), built into the test's root and
    /// answering from this state (tests/integration/nvml.rs); `gpus` fake
    /// /dev/nvidiaN nodes are made, no GPUs are declared.
    pub fake_nvml: Option<String>,
    /// More lines for the `[gpus]` table (foreign_memory_threshold_mib...).
    pub gpu_config: String,
    /// `[gpus] backend`; default "nvml" with `fake_nvml`, else "declared".
    /// Unless it is "nvml", `gpus` GPUs are declared.
    pub gpu_backend: Option<&'static str>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            gpus: 2,
            extra_config: String::new(),
            state_tmpfs_kib: None,
            journal_max: None,
            fake_nvml: None,
            gpu_config: String::new(),
            gpu_backend: None,
        }
    }
}

impl TestDaemon {
    pub fn start(test: &str) -> TestDaemon {
        TestDaemon::start_with(test, Opts::default())
    }

    pub fn start_with(test: &str, opts: Opts) -> TestDaemon {
        ensure_user(ALICE);
        ensure_user(BOB);
        // Outside /tmp: job units get PrivateTmp, so a workdir under /tmp
        // would be hidden from the job.
        let root = PathBuf::from(format!("/srv/ptrain-tests/{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::set_permissions("/srv/ptrain-tests", std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let spool = root.join("spool");
        let state = root.join("state");
        if let Some(kib) = opts.state_tmpfs_kib {
            // Mounted before the harness boots, so its mount namespace (a
            // private copy) shares this very file system.
            std::fs::create_dir_all(&state).unwrap();
            let out = std::process::Command::new("mount")
                .args([
                    "-t",
                    "tmpfs",
                    "-o",
                    &format!("size={kib}k,mode=0700"),
                    "ptrain-test-state",
                ])
                .arg(&state)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "mount tmpfs: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for user in [ALICE, BOB] {
            let home = root.join("work").join(user);
            std::fs::create_dir_all(&home).unwrap();
            chown(&home, user);
        }
        let mut gpus = String::new();
        if let Some(state) = &opts.fake_nvml {
            build_fake_driver(&root.join(FAKE_NVML_DIR), state);
        }
        let backend = opts.gpu_backend.unwrap_or(if opts.fake_nvml.is_some() {
            "nvml"
        } else {
            "declared"
        });
        for i in (0..opts.gpus).filter(|_| backend != "nvml") {
            gpus.push_str(&format!(
                "[[gpus.declared]]\nindex = {i}\nuuid = \"GPU-{i:08x}-0000-4000-8000-000000000000\"\nname = \"Test GPU\"\nmemory_mib = 16384\ndevice = \"/dev/nvidia{i}\"\n"
            ));
        }
        let config = root.join("ptrain.toml");
        std::fs::write(
            &config,
            format!(
                "spool_dir = {spool:?}\nstate_dir = {state:?}\nlog_dir = {log:?}\n{extra}\n[gpus]\nbackend = \"{backend}\"\n{gpu_config}\n{gpus}",
                log = root.join("log"),
                extra = opts.extra_config,
                gpu_config = opts.gpu_config,
            ),
        )
        .unwrap();
        let units = root.join("units");
        std::fs::create_dir_all(&units).unwrap();
        let bin = ptraind_bin().display();
        let config_arg = format!("--config {}", config.display());
        let rw = format!("ReadWritePaths={}", root.display());
        // The shipped units, pointed at this test's binary, config and dirs
        // (the binary is under /srv: no private /tmp hides it).
        shipped_unit(
            &units,
            "ptraind.service",
            &[
                (
                    "ExecStart=/usr/sbin/ptraind",
                    &format!("ExecStart={bin} {config_arg}"),
                ),
                ("ReadWritePaths=/var/spool/ptrain", &rw),
                // The test's state and log dirs live under its root; do not
                // create /var/lib/ptrain on the host that the harness shares.
                ("StateDirectory=ptrain", "#StateDirectory=ptrain"),
                ("LogsDirectory=ptrain", "#LogsDirectory=ptrain"),
            ],
        );
        // The exit recorder, run from the same binary with the same config.
        shipped_unit(
            &units,
            "ptrain-exit@.service",
            &[(
                "ExecStart=/usr/sbin/ptraind record-exit",
                &format!("ExecStart={bin} {config_arg} record-exit"),
            )],
        );
        let journal_max = opts.journal_max.map(|max| ("HARNESS_JOURNAL_MAX", max));
        let harness = Harness::boot(test, opts.gpus, Some(&units), journal_max.as_slice());
        if opts.fake_nvml.is_some() {
            install_fake_driver(&harness, &root.join(FAKE_NVML_DIR));
        }
        let daemon = TestDaemon {
            harness,
            root,
            config,
            spool,
            state,
        };
        daemon.start_service();
        daemon
    }

    /// `systemctl start ptraind`: returns once ptraind said READY=1.
    pub fn start_service(&self) {
        let (ok, out) = self.harness.systemctl(&["start", "ptraind.service"]);
        assert!(ok, "ptraind failed to start: {out}\n{}", self.daemon_log());
    }

    pub fn daemon_log(&self) -> String {
        self.harness.journal(&["-u", "ptraind.service"])
    }

    pub fn workdir(&self, user: &str) -> PathBuf {
        self.root.join("work").join(user)
    }

    /// Writes a job file in the user's workdir and publishes it into the
    /// spool the way a user would: `cp` as that user.
    pub fn drop_job(&self, user: &str, name: &str, json: &str) {
        let src = self.workdir(user).join(format!(".src-{name}"));
        std::fs::write(&src, json).unwrap();
        chown(&src, user);
        let out = self.as_user(
            user,
            "cp",
            &[
                src.to_str().unwrap(),
                self.spool.join(name).to_str().unwrap(),
            ],
        );
        assert!(
            out.status.success(),
            "cp into spool failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs a program inside the harness as `user`.
    pub fn as_user(&self, user: &str, program: &str, args: &[&str]) -> Output {
        let mut cmd = self.harness.command("runuser");
        cmd.args(["-u", user, "--", program]).args(args);
        cmd.output().unwrap()
    }

    /// Runs the ptrain CLI inside the harness as `user`.
    pub fn ptrain(&self, user: &str, args: &[&str]) -> Output {
        let mut full = vec!["--config", self.config.to_str().unwrap()];
        full.extend_from_slice(args);
        if user == "root" {
            let mut cmd = self.harness.command(PTRAIN);
            cmd.args(&full);
            return cmd.output().unwrap();
        }
        self.as_user(user, PTRAIN, &full)
    }

    /// `ptrain status ID --json`, or None if ptraind does not know the job.
    pub fn status(&self, id: &str) -> Option<Value> {
        let out = self.ptrain("root", &["status", id, "--json"]);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).expect("status --json is JSON"))
    }

    pub fn wait_status(&self, id: &str, pred: impl Fn(&str) -> bool) -> Value {
        wait_for(
            &format!("job {id} to reach the expected status"),
            WAIT,
            || {
                self.status(id)
                    .filter(|s| pred(s["status"].as_str().unwrap_or("")))
            },
        )
    }

    /// The job's status once its dropped file is claimed (until then
    /// ptraind knows no such job).
    pub fn wait_claimed(&self, id: &str) -> Value {
        self.wait_status(id, |_| true)
    }

    pub fn wait_ended(&self, id: &str) -> Value {
        self.wait_status(id, |s| !ptrain::job::Outcome::is_active(s))
    }

    /// Drops `ID.json` as `user` and waits for the job to end: its status.
    pub fn run_to_end(&self, user: &str, id: &str, json: &str) -> Value {
        self.drop_job(user, &format!("{id}.json"), json);
        self.wait_ended(id)
    }

    pub fn wait_running(&self, id: &str) -> Value {
        self.wait_status(id, |s| s == "running")
    }

    /// Restarts ptraind with `PTRAIN_CRASH_AT=point` (`POINT` or
    /// `POINT:N`, the daemon's `crash_point`), runs `trigger`, waits until
    /// ptraind has killed itself there, and starts it again without it.
    pub fn crash_at(&self, point: &str, trigger: impl FnOnce()) {
        let pid = || self.unit_property("ptraind.service", "MainPID");
        let before = pid();
        // systemd passes its manager environment to the services it starts.
        let (ok, out) = self
            .harness
            .systemctl(&["set-environment", &format!("PTRAIN_CRASH_AT={point}")]);
        assert!(ok, "{out}");
        let (ok, out) = self.harness.systemctl(&["restart", "ptraind.service"]);
        assert!(ok, "{out}");
        let crashed = pid();
        assert_ne!(before, crashed);
        trigger();
        wait_for(&format!("ptraind to crash at {point}"), WAIT, || {
            (pid() != crashed).then_some(())
        });
        let (ok, out) = self
            .harness
            .systemctl(&["unset-environment", "PTRAIN_CRASH_AT"]);
        assert!(ok, "{out}");
        // Restart=on-failure brings it back; start now rather than wait,
        // past systemd's start rate limit that crash rounds add up to.
        self.harness.systemctl(&["reset-failed", "ptraind.service"]);
        let (ok, out) = self.harness.systemctl(&["start", "ptraind.service"]);
        assert!(ok, "{out}\n{}", self.daemon_log());
        assert!(
            self.daemon_log().contains("PTRAIN_CRASH_AT"),
            "the crash point {point} was never reached"
        );
    }

    /// A property of a unit, from `systemctl show`.
    pub fn unit_property(&self, unit: &str, prop: &str) -> String {
        let (_, out) = self
            .harness
            .systemctl(&["show", unit, "-p", prop, "--value"]);
        out.trim().to_string()
    }

    pub fn rejected(&self, user: &str) -> Vec<Value> {
        let out = self.ptrain(user, &["rejected", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()
    }

    pub fn wait_rejected(&self, user: &str, file: &str) -> Value {
        wait_for(&format!("{file} to be rejected"), WAIT, || {
            self.rejected(user).into_iter().find(|r| r["file"] == file)
        })
    }

    /// The daemon is up and answering.
    pub fn assert_alive(&self) {
        let out = self.ptrain("root", &["list", "--json"]);
        assert!(
            out.status.success(),
            "ptraind is not answering: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.daemon_log()
        );
        assert_eq!(
            self.unit_property("ptraind.service", "ActiveState"),
            "active"
        );
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- ptraind journal ---\n{}", self.daemon_log());
        }
        // Harness drops after this and tears systemd down with every unit;
        // a tmpfs state dir is unmounted lazily from the host.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.state)
            .output();
    }
}

/// Writes `units/NAME` from the repository into `dir` with each
/// (from, to) replaced; each `from` must be there.
fn shipped_unit(dir: &Path, name: &str, replacements: &[(&str, &str)]) {
    let path = crate::harness::repo_root().join("units").join(name);
    let mut unit =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for (from, to) in replacements {
        assert!(unit.contains(from), "units/{name} has no {from:?}");
        unit = unit.replace(from, to);
    }
    std::fs::write(dir.join(name), unit).unwrap();
}

// --- the fake NVIDIA driver (tests/fake-nvml), for `Opts::fake_nvml` ---

/// The fake driver's directory under a test's root: the library, its state
/// file and the loader cache that names it.
pub const FAKE_NVML_DIR: &str = "nvml";
const FAKE_NVML_LIB: &str = "libnvidia-ml.so.1";

/// Builds the fake libnvidia-ml.so.1 into `dir` with the compiler the
/// tests already need (tests/install-deps.sh installs gcc), and writes its
/// first state.
pub fn build_fake_driver(dir: &Path, state: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let src = repo_root().join("tests/fake-nvml/fake_nvml.c");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror"])
        .arg(format!("-Wl,-soname,{FAKE_NVML_LIB}"))
        .arg("-o")
        .arg(dir.join(FAKE_NVML_LIB))
        .arg(&src)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run cc to build the fake NVML driver: {e}; install gcc (tests/install-deps.sh)")
        });
    assert!(
        out.status.success(),
        "building the fake NVML driver from {} failed:\n{}",
        src.display(),
        text(&out)
    );
    write_fake_nvml_state(dir, state);
}

/// Makes the harness's dynamic loader resolve libnvidia-ml.so.1 to the fake
/// driver in `dir` (tests/integration/nvml.rs says why this way). Run
/// before ptraind starts.
pub fn install_fake_driver(harness: &Harness, dir: &Path) {
    let conf = dir.join("ld.so.conf");
    let cache = dir.join("ld.so.cache");
    std::fs::write(
        &conf,
        // First, so that on a host with a real driver too the fake one is
        // the first entry of its name, the one the loader takes.
        format!("{}\ninclude /etc/ld.so.conf\n", dir.display()),
    )
    .unwrap();
    // ldconfig also rewrites /var/cache/ldconfig/aux-cache, even with -C:
    // run it in a mount namespace of its own where /var/cache is a tmpfs,
    // so the host's is not touched. -X: make no symlinks.
    let script = format!(
        "set -e; mount -t tmpfs tmpfs /var/cache; \
         ldconfig -X -C '{cache}' -f '{conf}'; chmod 0644 '{cache}'; \
         exec ldconfig -C '{cache}' -p",
        cache = cache.display(),
        conf = conf.display()
    );
    let out = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    // `ldconfig -p` lines: "\tNAME (libc6,ARCH) => PATH", in cache order;
    // the loader takes the first entry of a name.
    let target = format!("=> {}", dir.join(FAKE_NVML_LIB).display());
    let names_it = |listing: &str| {
        listing
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{FAKE_NVML_LIB} ")))
            .is_some_and(|l| l.ends_with(&target))
    };
    let want = format!("{FAKE_NVML_LIB} {target}");
    assert!(
        out.status.success() && names_it(&listing),
        "ldconfig did not make a loader cache naming the fake driver ({want}):\n{}",
        text(&out)
    );
    // Every process in the harness reads the cache, so it must be as
    // readable as the host's; bound read-only over it, in the harness's
    // mount namespace only.
    let out = harness
        .command("sh")
        .args([
            "-c",
            &format!(
                "mount --bind '{}' /etc/ld.so.cache && mount -o remount,bind,ro /etc/ld.so.cache",
                cache.display()
            ),
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cannot bind the fake driver's loader cache over /etc/ld.so.cache in harness {}: {}",
        harness.name(),
        text(&out)
    );
    let out = harness.command("ldconfig").arg("-p").output().unwrap();
    assert!(
        names_it(&String::from_utf8_lossy(&out.stdout)),
        "inside harness {} the loader does not see the fake driver: {}",
        harness.name(),
        text(&out)
    );
}

/// Replaces the fake driver's state in one rename, so no NVML call reads
/// half a file.
pub fn write_fake_nvml_state(dir: &Path, state: &str) {
    let tmp = dir.join("state.tmp");
    std::fs::write(&tmp, state).unwrap();
    std::fs::rename(&tmp, dir.join("state")).unwrap();
}

pub fn chown(path: &Path, user: &str) {
    let (uid, gid) = ensure_user(user);
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
}

pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
