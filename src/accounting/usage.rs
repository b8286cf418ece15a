//! What a job used, read from its unit's cgroup v2 files at its end. The
//! parsers are pure; [`collect`] reads the files of the calling process's
//! own cgroup. It runs in the job's unit, as the job's user: in the
//! watcher that `ptraind exec-job` leaves behind before it becomes the
//! job's command ([`start_watcher`]), or, for units an older ptraind
//! started, as their `ExecStopPost=` (`ptraind job-usage`).
//!
//! Why a watcher and not `ExecStopPost=`: systemd sets up the job's
//! sandbox again for each command of a unit, and that mount namespace
//! cost the host about 50 ms of CPU per job (`make bench`, accounting on
//! against off: 1.48x the host's CPU per job), more than everything else
//! a short job costs. The watcher is forked inside the sandbox the
//! command runs in, so it costs a fork, not a second sandbox.

use std::path::{Path, PathBuf};

use crate::store::Usage;

/// The name of the figures' file in the job's result directory.
pub const USAGE_FILE: &str = "usage.json";

/// The most bytes of a usage file read back (a few numbers).
pub const MAX_USAGE_BYTES: usize = 4096;

/// The cgroup of this process from `/proc/self/cgroup` (the v2 line
/// `0::/PATH`).
pub fn own_cgroup(proc_self_cgroup: &str) -> Option<&str> {
    proc_self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::trim)
        .filter(|p| p.starts_with('/'))
}

/// This process's cgroup in the v1 memory hierarchy (`N:memory:/PATH`), on
/// a hybrid host whose unified hierarchy has no memory controller.
pub fn own_v1_memory_cgroup(proc_self_cgroup: &str) -> Option<&str> {
    proc_self_cgroup.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path.trim())
            .filter(|p| p.starts_with('/'))
    })
}

/// `usage_usec` of `cpu.stat`, as nanoseconds.
pub fn cpu_nsec(cpu_stat: &str) -> Option<u64> {
    cpu_stat.lines().find_map(|l| {
        let v = l.strip_prefix("usage_usec ")?;
        v.trim().parse::<u64>().ok()?.checked_mul(1000)
    })
}

/// One number alone in a file (`memory.peak`).
pub fn single_number(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// The bytes read and written over every device of `io.stat`
/// (`MAJ:MIN rbytes=N wbytes=N rios=N ...`, one line per device).
pub fn io_bytes(io_stat: &str) -> (Option<u64>, Option<u64>) {
    let (mut read, mut written) = (None::<u64>, None::<u64>);
    for line in io_stat.lines() {
        for field in line.split_whitespace().skip(1) {
            let Some((key, value)) = field.split_once('=') else {
                continue;
            };
            let Ok(n) = value.parse::<u64>() else {
                continue;
            };
            let slot = match key {
                "rbytes" => &mut read,
                "wbytes" => &mut written,
                _ => continue,
            };
            *slot = Some(slot.unwrap_or(0).saturating_add(n));
        }
    }
    // A cgroup that did no block I/O has an empty io.stat: zero bytes.
    if io_stat.trim().is_empty() {
        return (Some(0), Some(0));
    }
    (read, written)
}

/// The usage from the three files' text (each absent when unreadable).
pub fn usage_of(cpu_stat: Option<&str>, memory_peak: Option<&str>, io_stat: Option<&str>) -> Usage {
    let (io_read_bytes, io_write_bytes) = io_stat.map_or((None, None), io_bytes);
    Usage {
        cpu_nsec: cpu_stat.and_then(cpu_nsec),
        mem_peak_bytes: memory_peak.and_then(single_number),
        io_read_bytes,
        io_write_bytes,
    }
}

/// A usage file's bytes, strictly: the fields of [`Usage`] and nothing
/// else. It is written by a process of the job's user, so it is data.
pub fn parse_usage_file(bytes: &[u8]) -> Result<Usage, String> {
    if bytes.len() > MAX_USAGE_BYTES {
        return Err(format!("is over {MAX_USAGE_BYTES} bytes"));
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Raw {
        cpu_nsec: Option<u64>,
        mem_peak_bytes: Option<u64>,
        io_read_bytes: Option<u64>,
        io_write_bytes: Option<u64>,
    }
    let raw: Raw =
        serde_json::from_slice(bytes).map_err(|e| format!("is not a usage record: {e}"))?;
    Ok(Usage {
        cpu_nsec: raw.cpu_nsec,
        mem_peak_bytes: raw.mem_peak_bytes,
        io_read_bytes: raw.io_read_bytes,
        io_write_bytes: raw.io_write_bytes,
    })
}

/// Reads this process's cgroup's counters: `cgroup_root` is where cgroup2
/// is mounted (`/sys/fs/cgroup`).
pub fn collect(cgroup_root: &Path) -> Result<Usage, String> {
    let (own, dir) = own_cgroup_dir(cgroup_root)?;
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    // memory.peak needs the v2 memory controller (kernel 5.19); a hybrid
    // host counts memory in its v1 hierarchy instead.
    let peak = read("memory.peak").or_else(|| {
        let v1 = own_v1_memory_cgroup(&own)?;
        let path = cgroup_root
            .join("memory")
            .join(v1.trim_start_matches('/'))
            .join("memory.max_usage_in_bytes");
        std::fs::read_to_string(path).ok()
    });
    Ok(usage_of(
        read("cpu.stat").as_deref(),
        peak.as_deref(),
        read("io.stat").as_deref(),
    ))
}

/// Leaves a process behind that waits for this one's end (this process
/// then execs the job's command, and stays the unit's main process), reads
/// the unit's cgroup files while the cgroup is still there, and writes
/// them into `result_dir`. Call it single-threaded (`exec-job` is): the
/// watcher runs Rust after `fork`. An error leaves no watcher; the job
/// runs all the same, with no usage on record.
///
/// The watcher is the child of a child that exits at once, so it is no
/// child of the job's command: a command that waits for all its children
/// (a shell's `wait`, an init-like loop) never waits for it. Signals are
/// blocked from before the fork until the watcher has its own handlers,
/// so a stop that comes at once cannot kill it first.
pub fn start_watcher(result_dir: &Path) -> std::io::Result<()> {
    use std::io::Error;
    // SAFETY: getpid cannot fail; pidfd_open takes a pid and no flags and
    // returns a new fd (close-on-exec: the job's command does not get it).
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    if pidfd < 0 {
        return Err(Error::last_os_error());
    }
    let pidfd = pidfd as libc::c_int;
    // SAFETY: sigset and mask calls on local values; this process has one
    // thread (see above), so the children may run anything; each child
    // ends in `_exit`, never returning here. The old mask is back before
    // this returns, and so before the command's exec.
    unsafe {
        let (mut all, mut old) = (std::mem::zeroed(), std::mem::zeroed());
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_BLOCK, &all, &mut old);
        let result = match libc::fork() {
            -1 => Err(Error::last_os_error()),
            0 => match libc::fork() {
                0 => watch(pidfd, result_dir, &old),
                -1 => libc::_exit(1),
                _ => libc::_exit(0),
            },
            first => {
                let mut status = 0;
                while libc::waitpid(first, &mut status, 0) < 0
                    && Error::last_os_error().raw_os_error() == Some(libc::EINTR)
                {}
                match libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
                    true => Ok(()),
                    false => Err(Error::other("the watcher could not be forked")),
                }
            }
        };
        libc::close(pidfd);
        libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        result
    }
}

/// Set by the watcher's SIGTERM handler: a stop began.
static STOP_SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn note_stop(_: libc::c_int) {
    STOP_SEEN.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The watcher: until the job's main process ends, then its usage; again
/// once what the command left behind is gone.
fn watch(pidfd: libc::c_int, result_dir: &Path, mask: &libc::sigset_t) -> ! {
    let snapshot = || {
        let written =
            collect(Path::new("/sys/fs/cgroup")).and_then(|usage| write(result_dir, &usage));
        if let Err(e) = &written {
            eprintln!("ptrain: {e}; the job's usage is not recorded");
        }
        written.is_ok()
    };
    // SAFETY: plain syscalls on this process's own state and fds; the
    // handler only stores to an atomic.
    unsafe {
        // systemd's stop signals every process of the unit; the watcher
        // stays until the command's end, which comes after it. A SIGTERM
        // (a stop, which may end in SIGKILL for all) takes the figures so
        // far first, interrupting the wait (no SA_RESTART).
        let mut term: libc::sigaction = std::mem::zeroed();
        term.sa_sigaction = note_stop as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut term.sa_mask);
        libc::sigaction(libc::SIGTERM, &term, std::ptr::null_mut());
        for signal in [
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGUSR1,
            libc::SIGUSR2,
            libc::SIGPIPE,
        ] {
            libc::signal(signal, libc::SIG_IGN);
        }
        libc::sigprocmask(libc::SIG_SETMASK, mask, std::ptr::null_mut());
        libc::prctl(
            libc::PR_SET_NAME,
            c"ptrain-usage".as_ptr() as libc::c_ulong,
            0,
            0,
            0,
        );
        // Its own session: the job's terminal signals, were there any,
        // are not its. stdin and stdout are not its either; stderr stays,
        // the job's journal, for why no usage was kept.
        libc::setsid();
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            libc::close(null);
        }
        let mut end = libc::pollfd {
            fd: pidfd,
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            if libc::poll(&mut end, 1, -1) > 0 {
                break;
            }
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                // Figures taken now would be the start's, not the end's.
                eprintln!("ptrain: cannot wait for the job's end; its usage is not recorded");
                libc::_exit(1);
            }
            if STOP_SEEN.swap(false, std::sync::atomic::Ordering::Relaxed) {
                snapshot();
            }
        }
    }
    let mut ok = snapshot();
    // What the command left behind still runs until the stop has it gone
    // (within the job's stop grace): the figures again once only the
    // watcher is left. A job without such processes does not wait here.
    let mut left_behind = false;
    while others_in_own_cgroup() {
        left_behind = true;
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if left_behind {
        ok = snapshot();
    }
    // SAFETY: ends this process without running the parent's atexit
    // handlers or flushing buffers it shares with it.
    unsafe { libc::_exit(if ok { 0 } else { 1 }) }
}

/// Whether a process other than this one is in this process's cgroup
/// (false when that cannot be read: nothing to wait for then).
fn others_in_own_cgroup() -> bool {
    let Ok((_, dir)) = own_cgroup_dir(Path::new("/sys/fs/cgroup")) else {
        return false;
    };
    let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) else {
        return false;
    };
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() }.to_string();
    procs.lines().any(|p| p.trim() != me)
}

/// This process's `/proc/self/cgroup` and its cgroup v2 directory under
/// `cgroup_root` (a hybrid host mounts the unified hierarchy under
/// `unified/`).
fn own_cgroup_dir(cgroup_root: &Path) -> Result<(String, PathBuf), String> {
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let Some(path) = own_cgroup(&own) else {
        return Err(
            "/proc/self/cgroup names no cgroup v2 path; accounting needs the unified hierarchy"
                .into(),
        );
    };
    let unified = cgroup_root.join("unified");
    let v2_root = match unified.join("cgroup.procs").exists() {
        true => unified.as_path(),
        false => cgroup_root,
    };
    let dir = v2_root.join(path.trim_start_matches('/'));
    Ok((own, dir))
}

/// Writes the usage into the job's result directory (`DIR/usage.json`),
/// through a new temporary file renamed over it, following no link.
pub fn write(dir: &Path, usage: &Usage) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = dir.join(".usage.json.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
    let bytes = serde_json::to_vec(usage).expect("usage always serialises");
    file.write_all(&bytes)
        .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    let target = dir.join(USAGE_FILE);
    std::fs::rename(&tmp, &target).map_err(|e| {
        format!(
            "cannot rename {} to {}: {e}",
            tmp.display(),
            target.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_cgroup_is_the_v2_line() {
        let text = "0::/ptrain.slice/ptrain-job@a.service\n";
        assert_eq!(own_cgroup(text), Some("/ptrain.slice/ptrain-job@a.service"));
        assert_eq!(own_cgroup("1:name=systemd:/x\n"), None);
        assert_eq!(own_cgroup("0::relative\n"), None);
        let hybrid =
            "4:memory:/ptrain.slice/j.service\n3:cpu,cpuacct:/x\n0::/ptrain.slice/j.service\n";
        assert_eq!(
            own_v1_memory_cgroup(hybrid),
            Some("/ptrain.slice/j.service")
        );
        assert_eq!(own_v1_memory_cgroup(text), None);
    }

    #[test]
    fn cgroup_files_parse_into_usage() {
        let cpu = "usage_usec 2003411\nuser_usec 2000000\nsystem_usec 3411\n";
        let io = "8:0 rbytes=4096 wbytes=1048576 rios=1 wios=2 dbytes=0 dios=0\n\
                  259:0 rbytes=100 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n";
        let u = usage_of(Some(cpu), Some("209715200\n"), Some(io));
        assert_eq!(u.cpu_nsec, Some(2_003_411_000));
        assert_eq!(u.mem_peak_bytes, Some(209_715_200));
        assert_eq!(u.io_read_bytes, Some(4196));
        assert_eq!(u.io_write_bytes, Some(1_048_576));
        // No block I/O at all: an empty io.stat is zero, not unknown.
        assert_eq!(io_bytes(""), (Some(0), Some(0)));
        // Unreadable files are unknown, not zero.
        assert_eq!(usage_of(None, None, None), Usage::default());
        assert_eq!(usage_of(Some("garbage"), Some("max"), None).cpu_nsec, None);
    }

    #[test]
    fn a_usage_file_is_read_strictly() {
        let u = Usage {
            cpu_nsec: Some(5),
            mem_peak_bytes: Some(7),
            io_read_bytes: None,
            io_write_bytes: Some(0),
        };
        let bytes = serde_json::to_vec(&u).unwrap();
        assert_eq!(parse_usage_file(&bytes).unwrap(), u);
        assert!(parse_usage_file(br#"{"cpu_nsec": -1}"#).is_err());
        assert!(parse_usage_file(br#"{"gpu_seconds": 1e9}"#).is_err());
        assert!(parse_usage_file(&vec![b' '; MAX_USAGE_BYTES + 1]).is_err());
    }

    #[test]
    fn write_then_parse_round_trips_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let u = Usage {
            cpu_nsec: Some(1),
            ..Usage::default()
        };
        write(dir.path(), &u).unwrap();
        write(dir.path(), &u).unwrap();
        let bytes = std::fs::read(dir.path().join(USAGE_FILE)).unwrap();
        assert_eq!(parse_usage_file(&bytes).unwrap(), u);
    }
}
