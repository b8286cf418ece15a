//! An image's root tree, assembled from its unpacked layers.
//!
//! Bottom layer first, each layer's whiteouts and opaque directories
//! remove what the layers below it put in the tree, then its own entries
//! go in: a directory is made in the tree (the topmost layer's mode
//! wins), a file is a hard link to the layer's copy (no bytes copied,
//! shared by every image with that layer, read-only to job users), a
//! symlink is made anew with the same target. A file of the tree is
//! never changed in place (it is the layer's inode): replacing one
//! unlinks the name first. Walks never follow a symlink, in the layer or
//! in the tree (`safe_fs.rs`).

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use rustix::fs::FileType;

use super::safe_fs::{self, Walk};
use super::unpack::LayerChanges;

/// Directories a unit with `RootDirectory=` mounts over (`/proc`, `/dev`,
/// `PrivateTmp=`'s `/tmp` and `/var/tmp`, ...): made empty when the image
/// lacks them, so systemd never has to write into the shared tree.
const MOUNT_POINTS: &[&[u8]] = &[b"proc", b"sys", b"dev", b"tmp", b"run", b"var/tmp"];

#[derive(Debug, thiserror::Error)]
#[error("assembling the image tree at layer {layer} ({path:?}): {source}; the store may be damaged: remove the image and pull it again")]
pub struct AssembleError {
    pub layer: String,
    pub path: String,
    #[source]
    pub source: io::Error,
}

/// One layer for the assembly: its unpacked `root` and its changes.
pub struct LayerTree<'a> {
    /// Names the layer in errors (its diff-id).
    pub name: String,
    pub root: &'a Path,
    pub changes: &'a LayerChanges,
}

/// A recorded path's components; `None` for one with `.` or `..` (the
/// unpacker records none: a damaged record must not reach outside the
/// path it names).
fn split(path: &[u8]) -> Option<Vec<Vec<u8>>> {
    let components: Vec<Vec<u8>> = path
        .split(|b| *b == b'/')
        .filter(|c| !c.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    let clean = components.iter().all(|c| c != b"." && c != b"..");
    clean.then_some(components)
}

/// Builds the tree of `layers` (bottom first) in `dest`, an existing
/// empty directory.
pub fn assemble(layers: &[LayerTree<'_>], dest: &Path) -> Result<(), AssembleError> {
    let fail = |layer: &str, path: &[u8], source: io::Error| AssembleError {
        layer: layer.to_string(),
        path: String::from_utf8_lossy(path).into_owned(),
        source,
    };
    let tree = safe_fs::open_dir_path(dest).map_err(|e| fail("-", b"", e))?;
    for layer in layers {
        let err = |path: &[u8], e| fail(&layer.name, path, e);
        for dir in &layer.changes.opaque {
            let Some(components) = split(dir) else {
                continue;
            };
            if let Walk::Dir(fd) = safe_fs::walk(tree.as_fd(), &components, false, &mut |_| {})
                .map_err(|e| err(dir, e))?
            {
                safe_fs::clear_dir(fd.as_fd()).map_err(|e| err(dir, e))?;
            }
        }
        for gone in &layer.changes.whiteouts {
            let Some(components) = split(gone) else {
                continue;
            };
            let Some((name, parent)) = components.split_last() else {
                continue;
            };
            if let Walk::Dir(fd) =
                safe_fs::walk(tree.as_fd(), parent, false, &mut |_| {}).map_err(|e| err(gone, e))?
            {
                safe_fs::remove_all_at(fd.as_fd(), name).map_err(|e| err(gone, e))?;
            }
        }
        let source = safe_fs::open_dir_path(layer.root).map_err(|e| err(b"", e))?;
        let mut path = Vec::new();
        link_dir(source.as_fd(), tree.as_fd(), &mut path).map_err(|e| err(&path, e))?;
    }
    for point in MOUNT_POINTS {
        let components = split(point).expect("a clean path");
        let (name, parent) = components.split_last().expect("not empty");
        if let Walk::Dir(fd) = safe_fs::walk(tree.as_fd(), parent, false, &mut |_| {})
            .map_err(|e| fail("-", point, e))?
        {
            if safe_fs::kind_at(fd.as_fd(), name)
                .map_err(|e| fail("-", point, e))?
                .is_none()
            {
                safe_fs::mkdir_at(fd.as_fd(), name, 0o755).map_err(|e| fail("-", point, e))?;
            }
        }
    }
    safe_fs::chmod_fd(tree.as_fd(), 0o755).map_err(|e| fail("-", b"", e))
}

/// Puts everything in `source` (a layer's directory) into `dest` (the
/// tree's). `path` tracks where, for the error.
fn link_dir(source: BorrowedFd<'_>, dest: BorrowedFd<'_>, path: &mut Vec<u8>) -> io::Result<()> {
    let base = path.len();
    for name in safe_fs::names(source)? {
        path.truncate(base);
        if base > 0 {
            path.push(b'/');
        }
        path.extend_from_slice(&name);
        let Some((kind, mode, _)) = safe_fs::kind_at(source, &name)? else {
            continue;
        };
        let existing = safe_fs::kind_at(dest, &name)?;
        match kind {
            FileType::Directory => {
                match existing {
                    Some((FileType::Directory, _, _)) => {}
                    Some(_) => {
                        safe_fs::remove_all_at(dest, &name)?;
                        safe_fs::mkdir_at(dest, &name, 0o700)?;
                    }
                    None => safe_fs::mkdir_at(dest, &name, 0o700)?,
                }
                let from = safe_fs::open_dir_at(source, &name)?;
                let to = safe_fs::open_dir_at(dest, &name)?;
                link_dir(from.as_fd(), to.as_fd(), path)?;
                safe_fs::chmod_fd(to.as_fd(), mode & 0o755)?;
                path.truncate(base);
            }
            FileType::RegularFile => {
                if existing.is_some() {
                    safe_fs::remove_all_at(dest, &name)?;
                }
                match safe_fs::link_at(source, &name, dest, &name) {
                    Ok(()) => {}
                    // Too many links to one inode (a file shared by very
                    // many trees): this tree gets a copy.
                    Err(e) if e.raw_os_error() == Some(libc::EMLINK) => {
                        let mut from = safe_fs::open_file_at(source, &name)?;
                        let mut to = safe_fs::create_file_at(dest, &name)?;
                        io::copy(&mut from, &mut to)?;
                        safe_fs::chmod_fd(to.as_fd(), mode & 0o755)?;
                    }
                    Err(e) => return Err(e),
                }
            }
            FileType::Symlink => {
                if existing.is_some() {
                    safe_fs::remove_all_at(dest, &name)?;
                }
                let target = safe_fs::read_link_at(source, &name)?;
                safe_fs::symlink_at(&target, dest, &name)?;
            }
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("a {other:?} in an unpacked layer (the unpacker never makes one)"),
                ))
            }
        }
    }
    path.truncate(base);
    Ok(())
}
