//! The files a job has while it lives, under `runtime_dir` (`/run/ptrain`,
//! a tmpfs that ptraind.service keeps across its restarts):
//!
//! - `launch/ID/` (root's, 0711; its files the owner's, 0400): `ptrain.job`, the
//!   job's command and its whole environment as JSON, and one file per
//!   secret it named in `credentials`, copied there as its owner. The job
//!   finds the secrets in `$CREDENTIALS_DIRECTORY`, which names this
//!   directory, as systemd's credentials would (systemd's `LoadCredential=`
//!   left the files unreadable to the job's user in the test harness's
//!   systemd 252). Each file is created new by root in a directory nobody
//!   else can write, then given to the owner: no link is followed. So the
//!   command and the environment are never unit properties (which any user
//!   can read with `systemctl show`, and which systemd 252 cannot read back
//!   from its transient unit file after a `daemon-reload` when they hold
//!   `$` or `%`), and nothing the job sets is ever in the environment of a
//!   process that runs with more privilege than the job.
//! - `results/ID/` (the owner's, 0700): where the job writes its result
//!   (`PTRAIN_RESULT_FILE`). ptraind reads it as the owner when it records
//!   the end, then removes it.
//!
//! The unit's `ExecStart` is `ptraind exec-job PATH` ([`exec_job`]), which
//! runs as the job's user inside its sandbox, reads `ptrain.job` and `execvp`s
//! the command with that environment. It is a program of ptraind's, started
//! with the unit's own environment (fixed names and values ptraind chose),
//! so what the job sets reaches only the job's own program.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fsutil;
use crate::spec::JobId;
use crate::users::Owner;

/// The file that carries [`LaunchFile`]; the `ptrain.` prefix is not open
/// to users' own credential names.
pub const LAUNCH_FILE: &str = "ptrain.job";
/// Largest secret file copied for a job.
pub const MAX_SECRET_BYTES: usize = 256 * 1024;
/// The exit status `exec-job` ends with when the command cannot be run:
/// systemd's own for "could not exec", so the outcome reads the same.
pub const EXEC_FAILED: u8 = 203;

/// What `exec-job` runs: argv and the environment the job asked for (with
/// the daemon's own variables that must stay private, e.g. the parents'
/// results).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaunchFile {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// `[accounting] enabled`: the job's result directory, where the
    /// watcher `exec-job` leaves behind writes what the run used
    /// ([`crate::accounting::usage::start_watcher`]). Absent in launch
    /// files of older releases, whose units read it in `ExecStopPost=`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_dir: Option<PathBuf>,
}

/// What the unit needs from a prepared launch.
#[derive(Debug, Clone)]
pub struct PreparedLaunch {
    /// The launch file, for `ptraind exec-job`.
    pub launch_file: PathBuf,
    /// The job's result directory, made writable for it.
    pub result_dir: PathBuf,
}

/// Where an image job's unit finds `ptraind exec-job` (issue 21). Inside
/// the image's root the host's `ptraind` and the C library it links
/// against are absent (an image may have another libc, or none), so the
/// unit binds them, read-only, under [`HostExec::MOUNT`] (on the tmpfs
/// `MountAPIVFS=` puts on `/run`, never in the image) and runs the
/// host's dynamic loader on the host's `ptraind` with the host's library
/// directory: `ld.so --library-path DIR ptraind exec-job FILE`. The
/// loader's `--library-path` applies to `ptraind` alone; the program
/// `exec-job` then execs is loaded by the image's own loader, with the
/// image's libraries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostExec {
    pub ptraind: PathBuf,
    /// The dynamic loader `ptraind` was started by.
    pub loader: PathBuf,
    /// The directory of the C library `ptraind` links against.
    pub lib_dir: PathBuf,
}

impl HostExec {
    /// Where the host's files appear inside an image's root.
    pub const MOUNT: &'static str = "/run/ptrain-host";

    /// The loader and library directory of this process, from its own
    /// mappings (`/proc/self/maps`), so they are the ones `ptraind`
    /// really runs with; `None` where they cannot be told (a static
    /// build: then image jobs are refused with a reason).
    pub fn detect(ptraind: &Path) -> Option<HostExec> {
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        let (loader, lib_dir) = Self::from_maps(&maps)?;
        Some(HostExec {
            ptraind: ptraind.to_owned(),
            loader,
            lib_dir,
        })
    }

    /// The loader and libc's directory named in a `/proc/PID/maps` text.
    fn from_maps(maps: &str) -> Option<(PathBuf, PathBuf)> {
        let mut loader = None;
        let mut libc = None;
        for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
            let path = Path::new(path);
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if loader.is_none() && name.starts_with("ld-linux") && name.contains(".so") {
                loader = Some(path.to_owned());
            } else if libc.is_none() && name == "libc.so.6" {
                libc = path.parent().map(Path::to_owned);
            }
        }
        Some((loader?, libc?))
    }

    /// `(path, argv)` of a unit command running `ptraind ARGS` inside an
    /// image's root.
    pub fn command(&self, args: &[String]) -> (String, Vec<String>) {
        let loader = format!("{}/ld.so", Self::MOUNT);
        let mut argv = vec![
            loader.clone(),
            "--library-path".into(),
            format!("{}/lib", Self::MOUNT),
            format!("{}/ptraind", Self::MOUNT),
        ];
        argv.extend(args.iter().cloned());
        (loader, argv)
    }

    /// The read-only binds that bring the host's files in: `(source,
    /// destination)`.
    pub fn binds(&self) -> [(PathBuf, String); 3] {
        [
            (self.ptraind.clone(), format!("{}/ptraind", Self::MOUNT)),
            (self.loader.clone(), format!("{}/ld.so", Self::MOUNT)),
            (self.lib_dir.clone(), format!("{}/lib", Self::MOUNT)),
        ]
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot prepare {path}: {source}; check that {root} is a root-owned directory on a tmpfs (runtime_dir in ptrain.toml)", root = .root.display(), path = .path.display())]
    Io {
        root: PathBuf,
        path: PathBuf,
        source: io::Error,
    },
    #[error("cannot read the secret `{name}` from {path} as {user}: {message}; make it a regular file the job's owner can read")]
    Secret {
        name: String,
        path: PathBuf,
        user: String,
        message: String,
    },
}

/// The runtime directory of one ptraind.
#[derive(Debug, Clone)]
pub struct JobRuntime {
    root: PathBuf,
}

impl JobRuntime {
    /// Creates `root`, `root/launch` and `root/results` (0711: jobs reach
    /// their own directories, nobody lists the others).
    pub fn open(root: &Path) -> Result<JobRuntime, RuntimeError> {
        let this = JobRuntime {
            root: root.to_owned(),
        };
        for (path, mode) in [
            (root.to_owned(), 0o711),
            (this.launch_root(), 0o711),
            (this.results_root(), 0o711),
        ] {
            fsutil::ensure_dir(&path, mode).map_err(|source| this.io_err(&path, source))?;
        }
        Ok(this)
    }

    fn io_err(&self, path: &Path, source: io::Error) -> RuntimeError {
        RuntimeError::Io {
            root: self.root.clone(),
            path: path.to_owned(),
            source,
        }
    }

    fn launch_root(&self) -> PathBuf {
        self.root.join("launch")
    }

    fn results_root(&self) -> PathBuf {
        self.root.join("results")
    }

    pub fn launch_dir(&self, id: &JobId) -> PathBuf {
        self.launch_root().join(id.as_str())
    }

    pub fn result_dir(&self, id: &JobId) -> PathBuf {
        self.results_root().join(id.as_str())
    }

    pub fn result_file(&self, id: &JobId) -> PathBuf {
        self.result_dir(id).join("result.json")
    }

    /// Writes the launch file and the secrets, and makes the result
    /// directory, for a job about to start. Redone whole on a relaunch:
    /// whatever an earlier launch of this id left is moved aside first,
    /// never reused.
    pub fn prepare(
        &self,
        id: &JobId,
        owner: &Owner,
        launch: &LaunchFile,
        secrets: &BTreeMap<String, PathBuf>,
    ) -> Result<PreparedLaunch, RuntimeError> {
        let dir = self.launch_dir(id);
        // Root's, 0711: the job opens its files by name; nobody but root
        // can add, rename or chmod anything in it.
        let dir_fd = self
            .fresh_dir(&self.launch_root(), id, 0o711, None)
            .map_err(|e| self.io_err(&dir, e))?;
        let write = |name: &str, bytes: &[u8]| {
            let path = dir.join(name);
            write_owned(&dir_fd, name, bytes, owner).map_err(|e| self.io_err(&path, e))
        };
        let mut launch = launch.clone();
        launch
            .env
            .insert("CREDENTIALS_DIRECTORY".into(), dir.display().to_string());
        let json = serde_json::to_vec(&launch).expect("a launch file always serialises");
        write(LAUNCH_FILE, &json)?;
        let mut secret_bytes = 0;
        for (name, path) in secrets {
            let secret_err = |message: String| RuntimeError::Secret {
                name: name.clone(),
                path: path.clone(),
                user: owner.name.clone(),
                message,
            };
            let bytes =
                fsutil::read_user_file(path, owner.uid, owner.gid, &owner.groups, MAX_SECRET_BYTES)
                    .map_err(secret_err)?
                    .ok_or_else(|| secret_err("there is no such file".into()))?;
            secret_bytes += bytes.len();
            if secret_bytes > MAX_SECRET_BYTES {
                return Err(secret_err(format!(
                    "the job's secrets together pass {MAX_SECRET_BYTES} bytes"
                )));
            }
            write(name, &bytes)?;
        }
        let result_dir = self.result_dir(id);
        self.fresh_dir(&self.results_root(), id, 0o700, Some(owner))
            .map_err(|e| self.io_err(&result_dir, e))?;
        Ok(PreparedLaunch {
            launch_file: dir.join(LAUNCH_FILE),
            result_dir,
        })
    }

    /// A new, empty directory `root/ID` (the owner's when given): one that
    /// is there already is first renamed aside within `root` (root's, so
    /// nothing can stop it) and removed, so nothing a user left or planted
    /// in an earlier one is ever handed to a job.
    fn fresh_dir(
        &self,
        root: &Path,
        id: &JobId,
        mode: u32,
        owner: Option<&Owner>,
    ) -> io::Result<std::os::fd::OwnedFd> {
        let parent = fsutil::open_dir(root)?;
        set_aside(root, id.as_str());
        let c = std::ffi::CString::new(id.as_str())?;
        // SAFETY: mkdirat with a valid dir fd and a NUL-terminated name; it
        // fails if the name exists, so the directory is ours.
        if unsafe { libc::mkdirat(parent.as_raw_fd(), c.as_ptr(), 0o700) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let dir = fsutil::open_dir_at(&parent, id.as_str())?;
        let (uid, gid) = owner.map_or((0, 0), |o| (o.uid, o.gid));
        // SAFETY: fchown/fchmod on the fd of the directory just made.
        unsafe {
            if libc::fchown(dir.as_raw_fd(), uid, gid) != 0
                || libc::fchmod(dir.as_raw_fd(), mode) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(dir)
    }

    /// The job's result, read as its owner. `Ok(None)`: it wrote none.
    pub fn read_result(
        &self,
        id: &JobId,
        owner: &Owner,
    ) -> Result<Option<serde_json::Value>, String> {
        fsutil::read_user_json(&self.result_file(id), owner.uid, owner.gid, &owner.groups)
    }

    /// What the job used, as the usage watcher (or, in a unit an older
    /// release started, `ptraind job-usage`) wrote it into its result
    /// directory (read as its owner: the directory is theirs).
    /// `Ok(None)`: none was written (the unit never ran).
    pub fn read_usage(
        &self,
        id: &JobId,
        owner: &Owner,
    ) -> Result<Option<crate::store::Usage>, String> {
        use crate::accounting::usage::{parse_usage_file, MAX_USAGE_BYTES, USAGE_FILE};
        let path = self.result_dir(id).join(USAGE_FILE);
        let Some(bytes) = fsutil::read_user_file(
            &path,
            owner.uid,
            owner.gid,
            &owner.groups,
            MAX_USAGE_BYTES + 1,
        )?
        else {
            return Ok(None);
        };
        parse_usage_file(&bytes)
            .map(Some)
            .map_err(|e| format!("{} {e}", path.display()))
    }

    /// Everything the job had here: once its end is recorded.
    pub fn remove(&self, id: &JobId) {
        for root in [self.launch_root(), self.results_root()] {
            set_aside(&root, id.as_str());
        }
    }
}

/// Renames `root/name` aside (`.gone-NAME-NANOS`) and removes it as root.
/// `remove_dir_all` works through directory fds and never follows a link,
/// so what a job left in its result directory cannot redirect it; a tree it
/// cannot remove (too deep) stays aside, never reused.
fn set_aside(root: &Path, name: &str) {
    let from = root.join(name);
    let aside = root.join(format!(".gone-{name}-{}", crate::now_micros()));
    match std::fs::rename(&from, &aside) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return,
        Err(e) => {
            tracing::warn!(path = %from.display(), error = %e, "cannot move a job's old runtime directory aside");
            return;
        }
    }
    if let Err(e) = std::fs::remove_dir_all(&aside) {
        tracing::warn!(path = %aside.display(), error = %e, "cannot remove a job's old runtime directory; it stays aside");
    }
}

/// Creates `name` in the root-owned directory `dir` (never over anything,
/// never through a link), writes it whole, and gives it to the owner, 0400.
fn write_owned(
    dir: &std::os::fd::OwnedFd,
    name: &str,
    bytes: &[u8],
    owner: &Owner,
) -> io::Result<()> {
    use std::io::Write;
    let mut file = fsutil::create_at(dir, name, libc::O_EXCL)?;
    file.write_all(bytes)?;
    // SAFETY: fchown/fchmod on the fd of the file just created.
    unsafe {
        if libc::fchown(file.as_raw_fd(), owner.uid, owner.gid) != 0
            || libc::fchmod(file.as_raw_fd(), 0o400) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// `ptraind exec-job PATH`: the unit's ExecStart, as the job's user.
/// Replaces itself with the job's command; returns only when that cannot
/// be done.
pub fn exec_job(path: &Path) -> std::process::ExitCode {
    use std::os::unix::process::CommandExt;
    let fail = |message: String| {
        eprintln!("ptrain: {message}");
        std::process::ExitCode::from(EXEC_FAILED)
    };
    let launch: LaunchFile = match std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(launch) => launch,
        Err(e) => {
            return fail(format!(
                "cannot read the job's launch file {}: {e}",
                path.display()
            ))
        }
    };
    let Some((program, args)) = launch.argv.split_first() else {
        return fail("the job's launch file has an empty command".into());
    };
    if let Some(dir) = &launch.usage_dir {
        if let Err(e) = crate::accounting::usage::start_watcher(dir) {
            // The job runs all the same; its journal says what is missing.
            eprintln!("ptrain: cannot watch the job's usage ({e}); it is not recorded");
        }
    }
    let mut command = std::process::Command::new(program);
    command.args(args).envs(&launch.env);
    let error = command.exec();
    // Debug quoting: the name is the user's and may hold control bytes.
    fail(format!("cannot run {program:?}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner {
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Owner {
            uid,
            gid,
            name: "me".into(),
            home: "/".into(),
            groups: vec![gid],
        }
    }

    #[test]
    fn the_host_loader_and_libc_directory_are_read_from_the_mappings() {
        let maps = "\
55d0c0000000-55d0c0100000 r--p 00000000 fe:01 123 /usr/sbin/ptraind
7f0000000000-7f0000020000 r--p 00000000 fe:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000100000-7f0000120000 r--p 00000000 fe:01 457 /usr/lib/x86_64-linux-gnu/libm.so.6
7f0000200000-7f0000220000 r--p 00000000 fe:01 789 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0 [stack]
";
        let (loader, lib_dir) = HostExec::from_maps(maps).unwrap();
        assert_eq!(
            loader,
            Path::new("/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
        );
        assert_eq!(lib_dir, Path::new("/usr/lib/x86_64-linux-gnu"));
        assert!(HostExec::from_maps("7f00-7f01 r--p 0 fe:01 1 /usr/sbin/ptraind\n").is_none());
        // This very process: the test binary is dynamically linked.
        let here = HostExec::detect(Path::new("/usr/sbin/ptraind")).unwrap();
        assert!(here.loader.exists() && here.lib_dir.join("libc.so.6").exists());
        let (path, argv) = here.command(&["exec-job".into(), "/run/f".into()]);
        assert_eq!(path, "/run/ptrain-host/ld.so");
        assert_eq!(
            argv,
            [
                "/run/ptrain-host/ld.so",
                "--library-path",
                "/run/ptrain-host/lib",
                "/run/ptrain-host/ptraind",
                "exec-job",
                "/run/f"
            ]
        );
    }

    #[test]
    fn prepare_writes_the_launch_file_and_secrets_and_remove_clears_all() {
        let tmp = tempfile::tempdir().unwrap();
        let rt = JobRuntime::open(&tmp.path().join("rt")).unwrap();
        let id = JobId::parse("j1").unwrap();
        let secret = tmp.path().join("token");
        std::fs::write(&secret, "s3cret").unwrap();
        let launch = LaunchFile {
            argv: vec!["python3".into(), "$HOME %h".into()],
            env: BTreeMap::from([("A".into(), "x $y".into())]),
            usage_dir: Some("/run/ptrain/results/j1".into()),
        };
        let secrets = BTreeMap::from([("wandb".to_string(), secret)]);
        let prepared = rt.prepare(&id, &owner(), &launch, &secrets).unwrap();
        let back: LaunchFile =
            serde_json::from_slice(&std::fs::read(&prepared.launch_file).unwrap()).unwrap();
        assert_eq!(back.argv, launch.argv);
        assert_eq!(back.env["A"], "x $y");
        assert_eq!(back.usage_dir, launch.usage_dir);
        let dir = rt.launch_dir(&id);
        assert_eq!(back.env["CREDENTIALS_DIRECTORY"], dir.display().to_string());
        assert_eq!(std::fs::read(dir.join("wandb")).unwrap(), b"s3cret");
        std::fs::write(rt.result_file(&id), r#"{"acc": 1}"#).unwrap();
        std::fs::create_dir(prepared.result_dir.join("sub")).unwrap();
        std::os::unix::fs::symlink("/etc", prepared.result_dir.join("sub/etc")).unwrap();
        assert_eq!(
            rt.read_result(&id, &owner()).unwrap(),
            Some(serde_json::json!({"acc": 1}))
        );
        rt.remove(&id);
        assert!(!rt.launch_dir(&id).exists());
        assert!(!prepared.result_dir.exists());
        assert!(
            Path::new("/etc/passwd").exists(),
            "the symlink was not followed"
        );
        assert_eq!(rt.read_result(&id, &owner()).unwrap(), None);
    }

    #[test]
    fn a_missing_secret_names_the_file_and_the_fix() {
        let tmp = tempfile::tempdir().unwrap();
        let rt = JobRuntime::open(tmp.path()).unwrap();
        let id = JobId::parse("j2").unwrap();
        let launch = LaunchFile {
            argv: vec!["true".into()],
            env: BTreeMap::new(),
            usage_dir: None,
        };
        let secrets = BTreeMap::from([("key".to_string(), tmp.path().join("nope"))]);
        let err = rt
            .prepare(&id, &owner(), &launch, &secrets)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`key`") && err.contains("nope") && err.contains("no such file"),
            "{err}"
        );
    }
}
