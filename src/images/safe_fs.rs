//! File-system calls relative to a directory fd that never follow a
//! symlink: the unpacker, the tree assembler and the store's removals
//! reach every path one component at a time with `O_NOFOLLOW`, so a
//! symlink an image planted is a name like any other, never a way out.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// A path inside a tree, as its components (each non-empty, not `.` or
/// `..`, no `/` or NUL).
pub(super) type Components = Vec<Vec<u8>>;

/// The path for messages: `/`-joined, lossy UTF-8.
pub(super) fn shown(components: &[Vec<u8>]) -> String {
    let joined: Vec<u8> = components.join(&b'/');
    String::from_utf8_lossy(&joined).into_owned()
}

fn to_io(e: rustix::io::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

/// Opens the directory `path` itself (no symlink as its last component).
pub(super) fn open_dir_path(path: &Path) -> io::Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(to_io)
}

/// Opens the directory `name` in `dir`, refusing a symlink.
pub(super) fn open_dir_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(to_io)
}

/// What `lstat` says about `name` in `dir`: its type, permission bits and
/// size; `None` when there is nothing by that name.
pub(super) fn kind_at(
    dir: BorrowedFd<'_>,
    name: &[u8],
) -> io::Result<Option<(FileType, u32, u64)>> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some((
            FileType::from_raw_mode(st.st_mode),
            st.st_mode & 0o7777,
            st.st_size as u64,
        ))),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(to_io(e)),
    }
}

/// How a walk down a path ended.
pub(super) enum Walk {
    /// Every component is a real directory: the last one, open.
    Dir(OwnedFd),
    /// Component `at` (0-based) does not exist (and was not to be made).
    Missing,
    /// Component `at` is a symlink.
    Symlink(usize),
    /// Component `at` is neither a directory nor a symlink.
    NotDir(usize),
}

/// Walks from `root` down `components`, each a real directory. With
/// `create`, a missing one is made (mode 0700: the caller sets the final
/// mode) and `made` is told its depth.
pub(super) fn walk(
    root: BorrowedFd<'_>,
    components: &[Vec<u8>],
    create: bool,
    made: &mut dyn FnMut(usize),
) -> io::Result<Walk> {
    let mut current: Option<OwnedFd> = None;
    for (at, name) in components.iter().enumerate() {
        let dir = current.as_ref().map_or(root, |fd| fd.as_fd());
        let next = match open_dir_at(dir, name) {
            Ok(fd) => fd,
            Err(e) => match kind_at(dir, name)? {
                None if create => {
                    rustix::fs::mkdirat(dir, name.as_slice(), Mode::from_raw_mode(0o700))
                        .map_err(to_io)?;
                    made(at);
                    open_dir_at(dir, name)?
                }
                None => return Ok(Walk::Missing),
                Some((FileType::Symlink, _, _)) => return Ok(Walk::Symlink(at)),
                Some((FileType::Directory, _, _)) => return Err(e),
                Some(_) => return Ok(Walk::NotDir(at)),
            },
        };
        current = Some(next);
    }
    match current {
        Some(fd) => Ok(Walk::Dir(fd)),
        None => Ok(Walk::Dir(rustix::io::dup(root).map_err(to_io)?)),
    }
}

/// The names in a directory, `.` and `..` left out.
pub(super) fn names(dir: BorrowedFd<'_>) -> io::Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir).map_err(to_io)? {
        let entry = entry.map_err(to_io)?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push(name.to_vec());
        }
    }
    Ok(out)
}

/// Removes everything inside `dir`, following no symlink.
pub(super) fn clear_dir(dir: BorrowedFd<'_>) -> io::Result<()> {
    for name in names(dir)? {
        remove_all_at(dir, &name)?;
    }
    Ok(())
}

/// Removes `name` in `dir`, a directory with all it holds; a symlink is
/// removed, never followed. Nothing there is not an error.
pub(super) fn remove_all_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    match kind_at(dir, name)? {
        None => Ok(()),
        Some((FileType::Directory, mode, _)) => {
            let child = open_dir_at(dir, name)?;
            // A directory without owner write (an image's 0555) cannot
            // be emptied by a caller without CAP_DAC_OVERRIDE.
            if mode & 0o700 != 0o700 {
                let _ = rustix::fs::fchmod(&child, Mode::from_raw_mode(0o700));
            }
            clear_dir(child.as_fd())?;
            drop(child);
            rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR).map_err(to_io)
        }
        Some(_) => rustix::fs::unlinkat(dir, name, AtFlags::empty()).map_err(to_io),
    }
}

/// Removes a whole directory tree by path (the path's last component
/// must be the directory itself, not a symlink to one).
pub(super) fn remove_tree(path: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no parent"));
    };
    let parent = open_dir_path(parent)?;
    use std::os::unix::ffi::OsStrExt;
    remove_all_at(parent.as_fd(), name.as_bytes())
}

pub(super) fn mkdir_at(dir: BorrowedFd<'_>, name: &[u8], mode: u32) -> io::Result<()> {
    rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(mode)).map_err(to_io)
}

pub(super) fn chmod_fd(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    rustix::fs::fchmod(fd, Mode::from_raw_mode(mode)).map_err(to_io)
}

/// A new file `name` in `dir`, for writing; never through a symlink,
/// never over an existing name.
pub(super) fn create_file_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<std::fs::File> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(to_io)?;
    Ok(std::fs::File::from(fd))
}

/// Opens the regular file `name` in `dir` for reading, never a symlink.
pub(super) fn open_file_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<std::fs::File> {
    let fd = rustix::fs::openat(
        dir,
        name,
        // NONBLOCK and NOCTTY: a FIFO or a terminal a user put in a
        // layout is never waited on nor made ptraind's terminal (the
        // caller refuses anything but a regular file by fstat).
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(to_io)?;
    Ok(std::fs::File::from(fd))
}

pub(super) fn symlink_at(target: &[u8], dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    rustix::fs::symlinkat(target, dir, name).map_err(to_io)
}

pub(super) fn read_link_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Vec<u8>> {
    rustix::fs::readlinkat(dir, name, Vec::new())
        .map(|c| c.into_bytes())
        .map_err(to_io)
}

/// A hard link: `new_name` in `new_dir` for `old_name` in `old_dir`,
/// which is never followed if it is a symlink (flags 0).
pub(super) fn link_at(
    old_dir: BorrowedFd<'_>,
    old_name: &[u8],
    new_dir: BorrowedFd<'_>,
    new_name: &[u8],
) -> io::Result<()> {
    rustix::fs::linkat(old_dir, old_name, new_dir, new_name, AtFlags::empty()).map_err(to_io)
}

/// Sets a file's modification (and access) time, in seconds.
pub(super) fn set_mtime(fd: BorrowedFd<'_>, seconds: u64) -> io::Result<()> {
    let t = rustix::fs::Timespec {
        tv_sec: seconds.min(i64::MAX as u64) as i64,
        tv_nsec: 0,
    };
    rustix::fs::futimens(
        fd,
        &rustix::fs::Timestamps {
            last_access: t,
            last_modification: t,
        },
    )
    .map_err(to_io)
}
