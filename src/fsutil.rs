//! Durable writes and safe opens: the primitives every record and every
//! spool file goes through.
//!
//! A record is durable only after: write to a temp file in the same
//! directory, fsync it, rename it over the final name (or exchange it with
//! the final name through a [`SpareDir`]), fsync the directory.
//! Any error on that path (ENOSPC, EIO) is returned, never assumed done.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

fn cstr(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))
}

/// Opens a directory for use as the base of `*at` calls.
pub fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    // SAFETY: plain open(2) of a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// fsync of a directory, so a rename or unlink inside it survives a crash.
pub fn fsync_dir(path: &Path) -> io::Result<()> {
    let dir = open_dir(path)?;
    File::from(dir).sync_all()
}

/// Writes `bytes` to `dir/name` atomically and durably.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    // A stale temp file from a crash is ours to replace (the dir is root-only).
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags_nofollow()
        .open(&tmp)?;
    let result = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&tmp, dir.join(name)))
        .and_then(|()| fsync_dir(dir));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The one spare file of a [`SpareDir`].
const SPARE: &str = ".spare";

/// A directory of files that are written whole and rewritten many times
/// (job records, outbox entries). Every write goes into the directory's one
/// spare file, which is then swapped with the file's name in one atomic
/// step (renameat2 RENAME_EXCHANGE) and, holding the old bytes, is
/// overwritten by the next write to any file here. So a rewrite allocates
/// and frees no inode: on ext4 without a journal every new inode is found
/// by scanning past the inodes freed in the last minutes, which `make
/// bench` showed costing ptraind a third of its CPU. A crash at any point
/// leaves every name whole, old or new; the spare is garbage by design.
/// Falls back to a plain rename where the file system cannot exchange.
pub struct SpareDir {
    path: PathBuf,
    fd: OwnedFd,
    /// Writers take turns, as they share the spare: threads through this
    /// mutex, other `SpareDir`s of the same directory (in this process or
    /// another) through a `flock` of the directory.
    writer: Mutex<()>,
}

/// An exclusive `flock` of a directory, released when dropped.
struct DirLock<'a>(&'a OwnedFd);

impl<'a> DirLock<'a> {
    fn take(dir: &'a OwnedFd) -> io::Result<DirLock<'a>> {
        loop {
            // SAFETY: flock on a valid fd.
            if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(DirLock(dir));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Drop for DirLock<'_> {
    fn drop(&mut self) {
        // SAFETY: flock on a valid fd.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Placing {
    Replace,
    CreateNew,
}

/// Whether a write waits for the disk.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flush {
    Durable,
    /// Left to the page cache: a process crash (kill -9) keeps it, a power
    /// loss may leave the old bytes, or none.
    Cached,
}

impl SpareDir {
    pub fn open(path: &Path) -> io::Result<SpareDir> {
        Ok(SpareDir {
            path: path.to_owned(),
            fd: open_dir(path)?,
            writer: Mutex::new(()),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Durably writes `bytes` as `name`, replacing what was there.
    pub fn replace(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.write(name, bytes, Placing::Replace, Flush::Durable)
    }

    /// Writes `bytes` as `name`, replacing what was there, without waiting
    /// for the disk: for a file whose loss in a power cut only repeats work
    /// (a notification's status: it is sent again, under the same key).
    /// Readers still see the old bytes or the new, never a mix.
    pub fn replace_cached(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.write(name, bytes, Placing::Replace, Flush::Cached)
    }

    /// Durably writes `bytes` as `name`, which must not exist yet
    /// (`AlreadyExists` otherwise, and nothing changes).
    pub fn create(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.write(name, bytes, Placing::CreateNew, Flush::Durable)
    }

    /// Removes `name`; one already gone is fine.
    pub fn remove(&self, name: &str) -> io::Result<()> {
        let c = cstr(name)?;
        // SAFETY: unlinkat with a valid dir fd and a NUL-terminated name.
        if unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) } != 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::NotFound {
                return Err(e);
            }
        }
        Ok(())
    }

    pub fn exists(&self, name: &str) -> bool {
        let Ok(c) = cstr(name) else { return false };
        // SAFETY: stat is plain old data; fstatat fills it or fails.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            ) == 0
        }
    }

    fn write(&self, name: &str, bytes: &[u8], placing: Placing, flush: Flush) -> io::Result<()> {
        let _turn = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let _locked = DirLock::take(&self.fd)?;
        let c_name = cstr(name)?;
        if placing == Placing::CreateNew && self.exists(name) {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        // Overwritten in place, then cut to length: its blocks are reused.
        let mut spare = create_at(&self.fd, SPARE, 0)?;
        spare.write_all(bytes)?;
        spare.set_len(bytes.len() as u64)?;
        if flush == Flush::Durable {
            spare.sync_data()?;
        }
        drop(spare);
        let c_spare = cstr(SPARE)?;
        let dir = self.fd.as_raw_fd();
        let renameat2 = |flags| {
            // SAFETY: both names NUL-terminated, relative to a valid dir fd.
            let r = unsafe { libc::renameat2(dir, c_spare.as_ptr(), dir, c_name.as_ptr(), flags) };
            if r == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        };
        let placed = match placing {
            Placing::Replace => match renameat2(libc::RENAME_EXCHANGE) {
                // ENOENT: the first write, nothing to exchange with yet.
                // EINVAL: the file system cannot exchange.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EINVAL)) => {
                    renameat2(0)
                }
                other => other,
            },
            // The existence check above stands in where NOREPLACE is not
            // supported: writers here take turns.
            Placing::CreateNew => match renameat2(libc::RENAME_NOREPLACE) {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => renameat2(0),
                other => other,
            },
        };
        placed?;
        // SAFETY: fsync on a valid dir fd makes the exchange durable.
        if flush == Flush::Durable && unsafe { libc::fsync(dir) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Opens `name` in `dir` for writing, creating it (mode 0600) without
/// following a symlink planted there; `flags` adds O_EXCL or O_TRUNC.
/// Renames `from` to `to` unless `to` exists (renameat2 RENAME_NOREPLACE):
/// AlreadyExists then.
pub fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: both are NUL-terminated paths that outlive the call.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

pub fn create_at(dir: &OwnedFd, name: &str, flags: libc::c_int) -> io::Result<File> {
    let c = cstr(name)?;
    // SAFETY: openat with a valid dir fd and a NUL-terminated name.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_CLOEXEC | flags,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by openat and is owned by nobody else.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

trait NoFollow {
    fn custom_flags_nofollow(&mut self) -> &mut Self;
}

impl NoFollow for std::fs::OpenOptions {
    fn custom_flags_nofollow(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .mode(0o600)
    }
}

/// Creates a directory with `mode` if missing; an existing one must be a
/// real directory (not a symlink).
pub fn ensure_dir(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a directory", path.display()),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(path)?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        }
        Err(e) => Err(e),
    }
}

/// What `fstat` says about an open file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub nlink: u64,
    pub size: u64,
    pub ctime_ns: i128,
}

impl FileIdentity {
    pub fn is_regular(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }

    pub fn kind(&self) -> &'static str {
        match self.mode & libc::S_IFMT {
            libc::S_IFREG => "regular file",
            libc::S_IFDIR => "directory",
            libc::S_IFLNK => "symbolic link",
            libc::S_IFIFO => "FIFO",
            libc::S_IFSOCK => "socket",
            libc::S_IFCHR => "character device",
            libc::S_IFBLK => "block device",
            _ => "unknown file type",
        }
    }

    fn from_stat(st: &libc::stat) -> Self {
        FileIdentity {
            dev: st.st_dev,
            ino: st.st_ino,
            uid: st.st_uid,
            gid: st.st_gid,
            mode: st.st_mode,
            nlink: st.st_nlink,
            size: st.st_size as u64,
            ctime_ns: st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128,
        }
    }
}

pub fn fstat(fd: &impl AsRawFd) -> io::Result<FileIdentity> {
    // SAFETY: stat is plain old data; fstat fills it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(FileIdentity::from_stat(&st))
}

/// `lstat` relative to a directory fd. Only for reporting who dropped a file
/// we refused to open; never for a decision.
pub fn lstat_at(dir: &impl AsRawFd, name: &str) -> io::Result<FileIdentity> {
    let c = cstr(name)?;
    // SAFETY: as in fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(FileIdentity::from_stat(&st))
}

/// Opens `name` inside `dir` read-only without following a symlink and
/// without blocking on a FIFO.
pub fn open_at_nofollow(dir: &impl AsRawFd, name: &str) -> io::Result<File> {
    let c = cstr(name)?;
    // SAFETY: openat(2) with a NUL-terminated name relative to a valid dir fd.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is fresh and owned here.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Removes `name` from `dir` (a file, or an empty directory).
pub fn unlink_at(dir: &impl AsRawFd, name: &str, is_dir: bool) -> io::Result<()> {
    let c = cstr(name)?;
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: unlinkat(2) with a NUL-terminated name relative to a valid dir fd.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads at most `limit + 1` bytes, so the caller can tell "exactly at the
/// limit" from "over it" without ever reading an unbounded file.
pub fn read_bounded(file: &mut File, limit: usize) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(limit.min(64 * 1024) + 1);
    file.take(limit as u64 + 1).read_to_end(&mut buf)?;
    Ok(buf)
}

/// Most bytes of a job's result file that are read.
pub const MAX_RESULT_BYTES: usize = 64 * 1024;

/// Runs `f` with the file-system identity of a user: fsuid, fsgid and the
/// supplementary groups `groups`, on this thread only (the raw syscalls, not
/// glibc's wrappers, which would change every thread of ptraind). A fsuid
/// other than 0 also drops CAP_DAC_OVERRIDE and friends from the effective
/// set, so `f` can open exactly what the user could open.
pub fn as_user<T>(uid: u32, gid: u32, groups: &[u32], f: impl FnOnce() -> T) -> io::Result<T> {
    let mut saved = vec![0 as libc::gid_t; 256];
    // SAFETY: getgroups fills at most `saved.len()` entries.
    let n = unsafe { libc::getgroups(saved.len() as libc::c_int, saved.as_mut_ptr()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    saved.truncate(n as usize);
    // Restores the old identity however `f` ends.
    struct Restore(u32, u32, Vec<libc::gid_t>);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: per-thread syscalls restoring the saved identity.
            unsafe {
                libc::setfsuid(self.0);
                libc::setfsgid(self.1);
                libc::syscall(libc::SYS_setgroups, self.2.len(), self.2.as_ptr());
            }
        }
    }
    // SAFETY: per-thread syscalls with valid pointers and lengths. An
    // invalid id (-1) changes nothing and returns the current one, which
    // is how a change is checked: setfsuid reports no error itself.
    let restore = unsafe {
        let restore = Restore(
            libc::setfsuid(u32::MAX) as u32,
            libc::setfsgid(u32::MAX) as u32,
            saved,
        );
        let set_groups = libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr());
        libc::setfsgid(gid);
        libc::setfsuid(uid);
        let now = (
            libc::setfsuid(u32::MAX) as u32,
            libc::setfsgid(u32::MAX) as u32,
        );
        if set_groups != 0 || now != (uid, gid) {
            drop(restore);
            return Err(io::Error::other(format!(
                "cannot take the identity of uid {uid} gid {gid} to open its files (CAP_SETUID, CAP_SETGID)"
            )));
        }
        restore
    };
    let result = f();
    drop(restore);
    Ok(result)
}

/// How long [`check_enterable`] waits for the file system: a directory on
/// a hung network mount (or a user's FUSE mount that never answers) must
/// not hold up the claim of every other job.
pub const ENTER_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(200);

/// Whether a user can make a directory its working directory.
#[derive(Debug, PartialEq, Eq)]
pub enum Enterable {
    Yes,
    /// Why not.
    No(String),
    /// The file system did not answer within [`ENTER_CHECK_TIMEOUT`].
    Unknown,
}

/// Whether the user (uid, gid, groups) could make `dir` its working
/// directory, as systemd would for the job: it must exist, be a directory
/// (symlinks followed, as `chdir` does) and be searchable for the user all
/// the way down. Checked on a thread of its own, which takes the user's
/// identity ([`as_user`]) and is left behind if the file system hangs.
pub fn check_enterable(dir: &Path, uid: u32, gid: u32, groups: &[u32]) -> Enterable {
    // Threads left blocked by a hung file system are few, whoever asks.
    static IN_FLIGHT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    use std::sync::atomic::Ordering;
    if IN_FLIGHT.fetch_add(1, Ordering::AcqRel) >= MAX_ENTER_CHECKS {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
        return Enterable::Unknown;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let (path, groups) = (dir.to_owned(), groups.to_vec());
    let spawned = std::thread::Builder::new()
        .name("workdir-check".into())
        .spawn(move || {
            let seen = as_user(uid, gid, &groups, || enter_problem(&path))
                .unwrap_or_else(|e| Enterable::No(e.to_string()));
            IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
            let _ = tx.send(seen);
        });
    if spawned.is_err() {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
        return Enterable::Unknown;
    }
    rx.recv_timeout(ENTER_CHECK_TIMEOUT)
        .unwrap_or(Enterable::Unknown)
}

/// Most workdir checks at once (each a thread that may hang).
const MAX_ENTER_CHECKS: usize = 8;

/// Looks as the owner (this thread's identity): `DIR/.` resolves only if
/// the walk may search every directory down to DIR itself, ACLs included,
/// which is what `chdir` needs; no access(2) emulation is involved.
fn enter_problem(dir: &Path) -> Enterable {
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Enterable::No("it does not exist".into());
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            return denied(
                dir,
                "a directory above it is not searchable (x) for the owner",
            );
        }
        Err(e) => return Enterable::No(format!("it cannot be looked up: {e}")),
        Ok(meta) if !meta.is_dir() => return Enterable::No("it is not a directory".into()),
        Ok(_) => {}
    }
    match std::fs::metadata(dir.join(".")) {
        Ok(_) => Enterable::Yes,
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            denied(dir, "the owner may not enter it (no search permission, x)")
        }
        // EPERM from a seccomp filter, or anything else odd: not a no.
        Err(_) => Enterable::Unknown,
    }
}

/// A refusal, unless `dir` is on a FUSE file system: one mounted without
/// `allow_other` refuses any process but its owner's by real uid, which
/// this root thread never has, though the job will.
fn denied(dir: &Path, why: &str) -> Enterable {
    if on_fuse(dir) {
        Enterable::Unknown
    } else {
        Enterable::No(why.into())
    }
}

/// Whether the longest mount point above `path` is a FUSE mount
/// (`/proc/self/mountinfo`: field 5 the mount point, octal-escaped; the
/// type after the ` - ` separator).
fn on_fuse(path: &Path) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let unescape = |field: &str| -> String {
        let mut out = String::new();
        let mut rest = field;
        while let Some(at) = rest.find('\\') {
            out.push_str(&rest[..at]);
            let code = rest
                .get(at + 1..at + 4)
                .and_then(|o| u8::from_str_radix(o, 8).ok());
            match code {
                Some(byte) => {
                    out.push(byte as char);
                    rest = &rest[at + 4..];
                }
                None => {
                    out.push('\\');
                    rest = &rest[at + 1..];
                }
            }
        }
        out.push_str(rest);
        out
    };
    table
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = unescape(left.split(' ').nth(4)?);
            let fstype = right.split(' ').next()?;
            path.starts_with(&mount_point)
                .then(|| (mount_point.len(), fstype.starts_with("fuse")))
        })
        .max_by_key(|(len, _)| *len)
        .is_some_and(|(_, fuse)| fuse)
}

/// Reads a file a job's owner controls, as that owner ([`as_user`]), never
/// following a symlink in its last component, never blocking on a FIFO,
/// bounded to `limit` bytes. `Ok(None)`: there is no such file.
pub fn read_user_file(
    path: &Path,
    uid: u32,
    gid: u32,
    groups: &[u32],
    limit: usize,
) -> Result<Option<Vec<u8>>, String> {
    as_user(uid, gid, groups, || {
        let dir = path.parent().ok_or("no directory")?;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or("no file name")?;
        let dir_fd = match open_dir(dir) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", dir.display())),
        };
        let mut file = match open_at_nofollow(&dir_fd, name) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let id = fstat(&file).map_err(|e| e.to_string())?;
        if !id.is_regular() {
            return Err(format!(
                "{} is a {}, not a regular file",
                path.display(),
                id.kind()
            ));
        }
        let bytes = read_bounded(&mut file, limit).map_err(|e| e.to_string())?;
        if bytes.len() > limit {
            return Err(format!("{} is larger than {limit} bytes", path.display()));
        }
        Ok(Some(bytes))
    })
    .map_err(|e| e.to_string())?
}

/// A job's result file: a JSON object, read as its owner. `Ok(None)`: the
/// job wrote none.
pub fn read_user_json(
    path: &Path,
    uid: u32,
    gid: u32,
    groups: &[u32],
) -> Result<Option<serde_json::Value>, String> {
    let Some(bytes) = read_user_file(path, uid, gid, groups, MAX_RESULT_BYTES)? else {
        return Ok(None);
    };
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    if !value.is_object() {
        return Err(format!(
            "{} must hold a JSON object like {{\"accuracy\": 0.9}}",
            path.display()
        ));
    }
    Ok(Some(value))
}

/// Opens the directory `name` inside `dir`, never following a symlink.
pub fn open_dir_at(dir: &impl AsRawFd, name: &str) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: openat(2) with a NUL-terminated name relative to a valid dir fd.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is fresh and owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workdir_is_checked_with_the_owners_rights_not_roots() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: taking another identity needs root");
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let private = dir.path().join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        let nobody = (65534, 65534, &[][..]);
        let check = |p: &Path| check_enterable(p, nobody.0, nobody.1, nobody.2);
        assert_eq!(check(dir.path()), Enterable::Yes);
        assert!(matches!(check(&private), Enterable::No(why) if why.contains("may not enter")));
        assert!(
            matches!(check(&private.join("x")), Enterable::No(why) if why.contains("not searchable"))
        );
        assert!(
            matches!(check(&dir.path().join("none")), Enterable::No(why) if why.contains("does not exist"))
        );
        // Root itself may enter it: the check is the owner's.
        assert_eq!(check_enterable(&private, 0, 0, &[]), Enterable::Yes);
        assert!(!on_fuse(dir.path()));
    }

    #[test]
    fn write_atomic_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        write_atomic(dir.path(), "r.json", b"one").unwrap();
        write_atomic(dir.path(), "r.json", b"two").unwrap();
        assert_eq!(std::fs::read(dir.path().join("r.json")).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn spare_dir_swaps_inodes_through_one_shared_spare() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let files = SpareDir::open(dir.path()).unwrap();
        let ino = |name: &str| std::fs::metadata(dir.path().join(name)).unwrap().ino();
        let read = |name: &str| std::fs::read(dir.path().join(name)).unwrap();
        files.create("a.json", b"a1").unwrap();
        files.create("b.json", b"b1").unwrap();
        let err = files.create("a.json", b"again").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(read("a.json"), b"a1");
        files.replace("a.json", b"a2, longer").unwrap();
        assert_eq!(read("a.json"), b"a2, longer");
        assert_eq!(read(SPARE), b"a1");
        let inodes = [ino("a.json"), ino("b.json"), ino(SPARE)];
        // Rewrites of any file reuse the same three inodes, and a shorter
        // write leaves nothing of the longer one behind.
        files.replace("b.json", b"b2").unwrap();
        files.replace("a.json", b"a").unwrap();
        assert_eq!(
            (read("a.json"), read("b.json")),
            (b"a".to_vec(), b"b2".to_vec())
        );
        let mut now = [ino("a.json"), ino("b.json"), ino(SPARE)];
        now.sort();
        let mut before = inodes;
        before.sort();
        assert_eq!(now, before);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);
        files.remove("b.json").unwrap();
        files.remove("b.json").unwrap();
        assert!(!files.exists("b.json") && files.exists("a.json"));
    }

    #[test]
    fn spare_dir_refuses_a_planted_spare_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"keep").unwrap();
        let files = SpareDir::open(dir.path()).unwrap();
        files.create("r.json", b"one").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(SPARE)).unwrap();
        let err = files.replace("r.json", b"two").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert_eq!(std::fs::read(dir.path().join("r.json")).unwrap(), b"one");
    }

    #[test]
    fn open_at_nofollow_refuses_symlink_and_does_not_block_on_fifo() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("link.json")).unwrap();
        let c = CString::new(dir.path().join("fifo.json").as_os_str().as_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let dfd = open_dir(dir.path()).unwrap();
        let err = open_at_nofollow(&dfd, "link.json").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
        let fifo = open_at_nofollow(&dfd, "fifo.json").unwrap();
        assert_eq!(fstat(&fifo).unwrap().kind(), "FIFO");
    }

    #[test]
    fn read_bounded_stops_after_limit_plus_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("big"), vec![b'x'; 1000]).unwrap();
        let mut f = File::open(dir.path().join("big")).unwrap();
        assert_eq!(read_bounded(&mut f, 10).unwrap().len(), 11);
    }
}
