//! A real systemd for each test: `tests/harness/boot.sh` boots systemd as
//! PID 1 of new pid/mount/uts/ipc/cgroup namespaces over the host root
//! filesystem, with journald and the system D-Bus (policy from
//! `packaging/dbus`), and `tests/harness/teardown.sh` removes it again.
//!
//! Inside (see [`Harness::command`]) every path is the default one:
//! `systemctl`, `journalctl`, the system bus at /run/dbus/system_bus_socket.
//! From the host, the bus is at [`Harness::bus_address`].
//!
//! Things to know when writing tests:
//! - Needs root (the integration tests run as root).
//! - `/tmp` and `/var/tmp` are the host's, but a unit with `PrivateTmp=yes`
//!   sees a fresh, empty /tmp: a working directory, script or
//!   `ReadWritePaths=` under /tmp then fails with 226/NAMESPACE. Keep files
//!   that units must see elsewhere, e.g. under `env!("CARGO_TARGET_TMPDIR")`.
//! - Only root can read the harness journal (volatile storage, one
//!   root-only file); use [`Harness::journal`].
//! - A failing test prints the tail of its harness journal; set
//!   `PTRAIN_KEEP_HARNESS=1` to keep the harness for a look inside.
#![allow(dead_code)]

use std::fs::File;
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

/// Where state dirs live. Fixed (not `$TMPDIR`) so leftovers of crashed runs
/// can be found, and short enough for the 107-byte unix socket path limit.
const STATE_BASE: &str = "/tmp";
/// Prefix of every test harness name; [`reap_orphans`] relies on it.
const NAME_PREFIX: &str = "ptrain-t-";
/// Marker a kept harness carries so that later runs do not reap it.
const KEEP_MARKER: &str = ".keep";

static BOOT_SEQ: AtomicU32 = AtomicU32::new(0);

/// A booted harness; dropping it tears it down.
pub struct Harness {
    name: String,
    state: PathBuf,
    systemd_pid: u32,
}

impl Harness {
    /// Boots tests/harness/boot.sh with HARNESS_NAME derived from `test_name`
    /// and the pid (unique, short), HARNESS_FAKE_GPUS=`fake_gpus`, and
    /// HARNESS_UNITS_DIR=`units_dir` if Some. Panics with boot.sh's output on
    /// failure. `env` adds boot.sh settings (HARNESS_JOURNAL_MAX).
    pub fn boot(
        test_name: &str,
        fake_gpus: u32,
        units_dir: Option<&Path>,
        env: &[(&str, &str)],
    ) -> Harness {
        reap_orphans();
        let name = harness_name(
            test_name,
            std::process::id(),
            BOOT_SEQ.fetch_add(1, Ordering::Relaxed),
        );
        let state = Path::new(STATE_BASE).join(&name);
        if state.exists() {
            // left by a crashed process that had our pid
            run_teardown(&name, &state);
        }

        let mut cmd = Command::new("bash");
        cmd.arg(repo_root().join("tests/harness/boot.sh"))
            .env("HARNESS_NAME", &name)
            .env("HARNESS_STATE", &state)
            .env("HARNESS_FAKE_GPUS", fake_gpus.to_string())
            .envs(env.iter().copied())
            .stdin(Stdio::null());
        match units_dir {
            Some(dir) => cmd.env("HARNESS_UNITS_DIR", dir),
            None => cmd.env_remove("HARNESS_UNITS_DIR"),
        };
        let started = Instant::now();
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run tests/harness/boot.sh: {e}"));
        if !out.status.success() {
            panic!(
                "harness {name} failed to boot after {:.1?} ({}):\n{}{}",
                started.elapsed(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let pid_file = state.join("systemd.pid");
        let systemd_pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("harness {name} booted but {pid_file:?} is unreadable"));
        Harness {
            name,
            state,
            systemd_pid,
        }
    }

    /// The harness's state dir; its `run/` is the harness's /run.
    pub fn state_dir(&self) -> &Path {
        &self.state
    }

    /// HARNESS_NAME: cgroup name and hostname inside.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Host pid of the harness's systemd (PID 1 inside).
    pub fn systemd_pid(&self) -> u32 {
        self.systemd_pid
    }

    /// The harness's system bus, for clients on the host
    /// (`DBUS_SYSTEM_BUS_ADDRESS`, `zbus::connection::Builder::address`).
    pub fn bus_address(&self) -> String {
        format!(
            "unix:path={}",
            self.state.join("run/dbus/system_bus_socket").display()
        )
    }

    /// A Command that runs `program` inside all the harness namespaces
    /// (nsenter into systemd's pid/mount/uts/ipc/cgroup ns, like enter.sh),
    /// in the current directory of the test process at the time of this call
    /// (`/` if that is under /run or /dev, which differ inside); a later
    /// `current_dir()` on the Command has no effect inside. The environment
    /// is inherited as usual.
    ///
    /// nsenter forks `program` into the harness pid namespace and waits for
    /// it: the child's `id()` is nsenter's, and signals sent to it are not
    /// forwarded. Signal [`inner_pid`] instead.
    pub fn command(&self, program: &str) -> Command {
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let cwd = if cwd.starts_with("/run") || cwd.starts_with("/dev") {
            PathBuf::from("/")
        } else {
            cwd
        };
        let mut wdns = std::ffi::OsString::from("--wdns=");
        wdns.push(cwd.as_os_str());
        let mut cmd = Command::new("nsenter");
        cmd.arg("--target")
            .arg(self.systemd_pid.to_string())
            .args(["--mount", "--pid", "--uts", "--ipc", "--cgroup"])
            .arg(wdns)
            .arg("--")
            .arg(program);
        cmd
    }

    /// Runs systemctl inside; returns (exit status success, stdout+stderr).
    pub fn systemctl(&self, args: &[&str]) -> (bool, String) {
        let out = self
            .command("systemctl")
            .arg("--no-pager")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run systemctl in harness {}: {e}", self.name));
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }

    /// `journalctl --no-pager -o cat` inside with the given extra args;
    /// returns stdout. Lines may reach the journal a few ms after a unit
    /// wrote them: poll with [`wait_for`].
    pub fn journal(&self, args: &[&str]) -> String {
        let out = self
            .command("journalctl")
            .args(["--no-pager", "-o", "cat"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run journalctl in harness {}: {e}", self.name));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let tail = self
                .command("journalctl")
                .args(["--no-pager", "-n", "150", "-o", "short-monotonic"])
                .stdin(Stdio::null())
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            note(&format!(
                "---- journal of harness {} (last 150 lines) ----\n{tail}----\n",
                self.name
            ));
        }
        if std::env::var_os("PTRAIN_KEEP_HARNESS").is_some_and(|v| v == "1") {
            let _ = File::create(self.state.join(KEEP_MARKER));
            note(&format!(
                "PTRAIN_KEEP_HARNESS=1: kept harness {name}\n  enter:    {state}/enter.sh\n  \
                 teardown: HARNESS_NAME={name} HARNESS_STATE={state} {teardown}\n",
                name = self.name,
                state = self.state.display(),
                teardown = repo_root().join("tests/harness/teardown.sh").display(),
            ));
            return;
        }
        run_teardown(&self.name, &self.state);
    }
}

/// Host pid of the program a [`Harness::command`] child runs (nsenter's
/// only child, inside the harness pid namespace). Panics if nsenter has not
/// forked within 5 s or has already exited.
pub fn inner_pid(child: &Child) -> u32 {
    let nsenter = child.id();
    let children = format!("/proc/{nsenter}/task/{nsenter}/children");
    wait_for(
        &format!("nsenter (pid {nsenter}) to start its program"),
        Duration::from_secs(5),
        || {
            std::fs::read_to_string(&children)
                .ok()?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        },
    )
}

/// Polls `cond` every 20 ms until it returns Some, panics with `what` and
/// elapsed time after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut cond: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = cond() {
            return v;
        }
        if start.elapsed() >= timeout {
            panic!(
                "timed out after {:.2?} (limit {timeout:?}) waiting for {what}",
                start.elapsed()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Ensures a local test user exists (useradd --system --no-create-home
/// --shell /usr/sbin/nologin when missing), returns (uid, gid). Concurrent
/// calls from threads and processes are serialised by a lock file, since
/// concurrent useradd runs fail on /etc/passwd's lock.
pub fn ensure_user(name: &str) -> (u32, u32) {
    if let Some(ids) = lookup_user(name) {
        return ids;
    }
    let lock_path = "/tmp/ptrain-test-useradd.lock";
    let lock = File::options()
        .create(true)
        .append(true)
        .open(lock_path)
        .unwrap_or_else(|e| panic!("cannot open {lock_path}: {e}"));
    // SAFETY: flock on an fd we own; released when `lock` is closed.
    while unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            panic!("cannot lock {lock_path}: {err}");
        }
    }
    if let Some(ids) = lookup_user(name) {
        return ids;
    }
    let useradd = if Path::new("/usr/sbin/useradd").exists() {
        "/usr/sbin/useradd"
    } else {
        "useradd"
    };
    let out = Command::new(useradd)
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {useradd}: {e}"));
    assert!(
        out.status.success(),
        "useradd {name} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    drop(lock);
    lookup_user(name).unwrap_or_else(|| panic!("useradd {name} succeeded but the user is unknown"))
}

/// Repository root (env!("CARGO_MANIFEST_DIR")).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `ptrain-t-<test name, at most 20 of [a-z0-9-]>-<pid>-<seq>`: unique per
/// process and boot, at most 48 chars (hostname limit 64; the bus socket path
/// under /tmp stays far below 107 bytes).
fn harness_name(test_name: &str, pid: u32, seq: u32) -> String {
    let mut short = String::new();
    for c in test_name.chars() {
        let c = if c.is_ascii_alphanumeric() {
            c.to_ascii_lowercase()
        } else {
            '-'
        };
        if !(c == '-' && (short.is_empty() || short.ends_with('-'))) {
            short.push(c);
        }
        if short.len() == 20 {
            break;
        }
    }
    let short = short.trim_end_matches('-');
    let short = if short.is_empty() { "x" } else { short };
    format!("{NAME_PREFIX}{short}-{pid}-{seq}")
}

/// Tears down, once per process, the harnesses of test processes that died
/// without running their Drop (killed, aborted), unless kept on purpose.
fn reap_orphans() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Ok(entries) = std::fs::read_dir(STATE_BASE) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with(NAME_PREFIX) {
                continue;
            }
            let Some(pid) = name.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            let state = entry.path();
            if Path::new(&format!("/proc/{pid}")).exists()
                || !state.join(".ptrain-harness").exists()
                || state.join(KEEP_MARKER).exists()
            {
                continue;
            }
            run_teardown(&name, &state);
        }
    });
}

fn run_teardown(name: &str, state: &Path) {
    let script = repo_root().join("tests/harness/teardown.sh");
    match Command::new("bash")
        .arg(&script)
        .env("HARNESS_NAME", name)
        .env("HARNESS_STATE", state)
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => {}
        Ok(out) => note(&format!(
            "teardown of harness {name} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )),
        Err(e) => note(&format!("cannot run {}: {e}", script.display())),
    }
}

/// getpwnam_r: (uid, gid) of `name`, None if there is no such user.
pub fn lookup_user(name: &str) -> Option<(u32, u32)> {
    let cname = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: zeroed passwd is a valid out-parameter; buf outlives the call
    // and we copy the ids out before it is dropped.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    let rc = unsafe {
        libc::getpwnam_r(
            cname.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    (rc == 0 && !result.is_null()).then_some((pwd.pw_uid, pwd.pw_gid))
}

/// Writes to the real stderr: never panics (Drop must not) and is not held
/// back by the test output capture.
fn note(msg: &str) {
    let _ = std::io::stderr().write_all(msg.as_bytes());
}
