//! The root a job's unit runs in: the image's shared tree, cloned by hard
//! links, with the job's mount points made.
//!
//! systemd makes a missing mount point itself, inside `RootDirectory=`,
//! as root: the job's workdir (`/home/alice/ocr`), and `/root`, `/usr` or
//! `/home` for the baseline's `ProtectHome=` and `ProtectSystem=`. Made in
//! the image's tree, they would change the tree every job of every user
//! shares, naming one user's paths to the next. So the unit gets a tree of
//! its own kind instead: `roots/sha256/TREE-KEY/`, TREE the tree's name
//! (its chain id) and KEY the hash of the image's tree and the mount
//! points, built once (directories made, every file a
//! hard link to the tree's, so nothing is copied), the mount points made
//! in it, then renamed into place whole. Jobs of the same image and the
//! same mount points share it; whatever systemd adds there is what the
//! next such job needs too. The files are the tree's inodes: root's,
//! without write bits for anyone else, never changed in place. A root
//! goes when its tree is collected ([`tree_of_root`],
//! [`super::store::ImageStore::collect`]): its hard links would keep the
//! tree's files on disk.

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::assemble::{self, LayerTree};
use super::safe_fs::{self, Walk};
use super::unpack::LayerChanges;

/// Why a job's root could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeRootError {
    #[error("mount point {path} for the job: the image has a symlink or a file at {at}, where the job's path needs a directory; use a workdir outside it")]
    Blocked { path: String, at: String },
    #[error("mount point {0}: not an absolute, clean path")]
    BadPath(String),
    #[error("making the job's root from {tree}: {source}; the image store may be damaged: remove the image and pull it again")]
    Io {
        tree: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("making the job's root from {tree}: {source}")]
    Assemble {
        tree: PathBuf,
        #[source]
        source: assemble::AssembleError,
    },
}

/// Checks, with the job's user's rights (`uid`, `gid`, `groups`), that
/// `workdir` is a directory they can reach with no symlink on the way
/// (`openat2` with `RESOLVE_NO_SYMLINKS`), just before its unit starts:
/// systemd then binds it into the image's root resolving the path as
/// root, so a directory of the path swapped for a symlink earlier (while
/// the job was queued) would have root follow it where the user cannot
/// go. The reason, naming the workdir and the fix, when not.
pub fn check_workdir_as(workdir: &Path, uid: u32, gid: u32, groups: &[u32]) -> Result<(), String> {
    use rustix::fs::{Mode, OFlags};
    // Directory by directory (openat2's RESOLVE_NO_SYMLINKS is outside
    // ptraind's system call filter): `O_NOFOLLOW | O_DIRECTORY` fails on
    // a symlink, with the user's search rights on each directory.
    let walk = || -> Result<(), (String, rustix::io::Errno)> {
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mut dir =
            rustix::fs::open("/", flags, Mode::empty()).map_err(|e| ("/".to_owned(), e))?;
        let mut at = PathBuf::from("/");
        for part in workdir.components().skip(1) {
            at.push(part);
            dir = rustix::fs::openat(&dir, part.as_os_str(), flags, Mode::empty())
                .map_err(|e| (at.display().to_string(), e))?;
        }
        Ok(())
    };
    let walked = crate::fsutil::as_user(uid, gid, groups, walk)
        .map_err(|e| format!("cannot take the job owner's identity: {e}"))?;
    match walked {
        Ok(()) => Ok(()),
        Err((at, rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP)) => Err(format!(
            "its workdir {} has a symlink (or a file) on its path, at {at}; an image job's workdir is bound into the image by path, so give the real path",
            workdir.display()
        )),
        Err((at, e)) => Err(format!(
            "its workdir {} cannot be reached by its owner at {at}: {}",
            workdir.display(),
            std::io::Error::from_raw_os_error(e.raw_os_error())
        )),
    }
}

/// Top-level directories systemd mounts over in a unit's root.
const API_DIRECTORIES: &[&str] = &["proc", "sys", "dev", "run", "tmp"];

/// Directories the baseline's mounts need besides those every assembled
/// tree has (`ProtectHome=`'s `/home` and `/root`, `ProtectSystem=`'s
/// `/usr` and `/etc`, `PrivateTmp=`'s `/var/tmp` where the image has no
/// `/var`).
const BASELINE_MOUNT_POINTS: &[&str] = &["/home", "/root", "/usr", "/etc", "/var/tmp"];

/// The root for a job of the image whose tree is `tree` (in the store at
/// `store_root`) that needs `mount_points` (directories, absolute):
/// made if it is not there yet. Blocking: call it off the state task.
pub fn runtime_root(
    store_root: &Path,
    tree: &Path,
    mount_points: &[PathBuf],
) -> Result<PathBuf, RuntimeRootError> {
    let io_err = |source| RuntimeRootError::Io {
        tree: tree.to_owned(),
        source,
    };
    let mut points: Vec<Vec<Vec<u8>>> = Vec::new();
    for point in BASELINE_MOUNT_POINTS
        .iter()
        .map(PathBuf::from)
        .chain(mount_points.iter().cloned())
    {
        points.push(components(&point)?);
    }
    points.sort();
    points.dedup();
    let mut key = Sha256::new();
    key.update(tree.as_os_str().as_encoded_bytes());
    for point in &points {
        key.update(b"\0");
        key.update(point.join(&b'/'));
    }
    let key = hex::encode(key.finalize());
    let roots = store_root.join("roots/sha256");
    let tree_name = tree
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let root = roots.join(format!("{tree_name}-{key}"));
    if root.is_dir() {
        return Ok(root);
    }
    std::fs::create_dir_all(&roots).map_err(io_err)?;
    let work = store_root.join("tmp").join(format!(
        "root-{key}-{}-{}",
        std::process::id(),
        crate::now_micros()
    ));
    std::fs::create_dir_all(&work).map_err(io_err)?;
    let built = build(tree, &work, &points);
    if let Err(e) = built {
        let _ = safe_fs::remove_tree(&work);
        return Err(e);
    }
    match crate::fsutil::rename_noreplace(&work, &root) {
        Ok(()) => Ok(root),
        // Another builder got there first: its root is the same.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists || root.is_dir() => {
            let _ = safe_fs::remove_tree(&work);
            Ok(root)
        }
        Err(e) => {
            let _ = safe_fs::remove_tree(&work);
            Err(io_err(e))
        }
    }
}

/// The name of the tree (`trees/sha256/TREE`) a root named `name`
/// (`roots/sha256/TREE-KEY`) was cloned from; `None` for a name of
/// another kind.
pub fn tree_of_root(name: &str) -> Option<&str> {
    let (tree, key) = name.rsplit_once('-')?;
    let hex = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(key) && !tree.is_empty()).then_some(tree)
}

/// Clones `tree` into `work` and makes the mount points in it.
fn build(tree: &Path, work: &Path, points: &[Vec<Vec<u8>>]) -> Result<(), RuntimeRootError> {
    let no_changes = LayerChanges::default();
    let whole = LayerTree {
        name: "tree".into(),
        root: tree,
        changes: &no_changes,
    };
    assemble::assemble(&[whole], work).map_err(|source| RuntimeRootError::Assemble {
        tree: tree.to_owned(),
        source,
    })?;
    let io_err = |source| RuntimeRootError::Io {
        tree: tree.to_owned(),
        source,
    };
    let root = safe_fs::open_dir_path(work).map_err(io_err)?;
    // Where systemd mounts the API file systems (and `/run`'s tmpfs the
    // job's binds go on): real directories in the job's root, whatever
    // the image has there. An image's `/run -> /dev` would otherwise
    // have systemd make the job's mount points in the host's `/dev`.
    for name in API_DIRECTORIES {
        match safe_fs::kind_at(root.as_fd(), name.as_bytes()).map_err(io_err)? {
            Some((rustix::fs::FileType::Directory, _, _)) => continue,
            Some(_) => safe_fs::remove_all_at(root.as_fd(), name.as_bytes()).map_err(io_err)?,
            None => {}
        }
        safe_fs::mkdir_at(root.as_fd(), name.as_bytes(), 0o755).map_err(io_err)?;
    }
    for point in points {
        let mut made = Vec::new();
        let walk =
            safe_fs::walk(root.as_fd(), point, true, &mut |at| made.push(at)).map_err(io_err)?;
        let blocked = |at: usize| RuntimeRootError::Blocked {
            path: shown(point, point.len()),
            at: shown(point, at + 1),
        };
        match walk {
            Walk::Dir(_) => {}
            Walk::Symlink(at) | Walk::NotDir(at) => return Err(blocked(at)),
            Walk::Missing => return Err(blocked(point.len().saturating_sub(1))),
        }
        // Made 0700 by the walk: open to the job's user, as a directory
        // of the image would be.
        for depth in made {
            let Walk::Dir(fd) = safe_fs::walk(root.as_fd(), &point[..=depth], false, &mut |_| {})
                .map_err(io_err)?
            else {
                continue;
            };
            safe_fs::chmod_fd(fd.as_fd(), 0o755).map_err(io_err)?;
        }
    }
    Ok(())
}

/// Makes the mount points of binds at `(path, is_dir)` in the job's
/// `root` (a GPU driver's files from its CDI spec): parent directories
/// made (0755), an empty directory or file at the end, none of it through
/// a symlink or over a file of the image (refused, naming where), so
/// systemd never has to make one itself, where an image's symlink could
/// lead it out of the root.
pub fn add_mount_points(root: &Path, points: &[(PathBuf, bool)]) -> Result<(), RuntimeRootError> {
    let io_err = |source| RuntimeRootError::Io {
        tree: root.to_owned(),
        source,
    };
    let root_fd = safe_fs::open_dir_path(root).map_err(io_err)?;
    for (point, is_dir) in points {
        let parts = components(point)?;
        let (name, parent) = parts.split_last().expect("components are not empty");
        let blocked = |at: usize| RuntimeRootError::Blocked {
            path: shown(&parts, parts.len()),
            at: shown(&parts, at),
        };
        let mut made = Vec::new();
        let dir = match safe_fs::walk(root_fd.as_fd(), parent, true, &mut |at| made.push(at))
            .map_err(io_err)?
        {
            Walk::Dir(fd) => fd,
            Walk::Symlink(at) | Walk::NotDir(at) => return Err(blocked(at + 1)),
            Walk::Missing => return Err(blocked(parent.len())),
        };
        for depth in made {
            if let Walk::Dir(fd) =
                safe_fs::walk(root_fd.as_fd(), &parent[..=depth], false, &mut |_| {})
                    .map_err(io_err)?
            {
                safe_fs::chmod_fd(fd.as_fd(), 0o755).map_err(io_err)?;
            }
        }
        match safe_fs::kind_at(dir.as_fd(), name).map_err(io_err)? {
            Some((rustix::fs::FileType::Symlink, _, _)) => return Err(blocked(parts.len())),
            Some(_) => {}
            None if *is_dir => safe_fs::mkdir_at(dir.as_fd(), name, 0o755).map_err(io_err)?,
            None => {
                let file = safe_fs::create_file_at(dir.as_fd(), name).map_err(io_err)?;
                safe_fs::chmod_fd(file.as_fd(), 0o644).map_err(io_err)?;
            }
        }
    }
    Ok(())
}

/// Makes each `(link, target)` symlink in the job's `root` (made by
/// [`runtime_root`]): the links GPU drivers' CDI hooks would have made in
/// a container (`libcuda.so -> libcuda.so.1`), made in the job's root and
/// never in the image's shared tree. Missing parent directories are made
/// (0755); a parent that is a symlink or a file of the image refuses the
/// link; a link already there with another target is replaced; an
/// existing file or directory is left alone (the image's own wins).
pub fn add_symlinks(root: &Path, links: &[(PathBuf, PathBuf)]) -> Result<(), RuntimeRootError> {
    let io_err = |source| RuntimeRootError::Io {
        tree: root.to_owned(),
        source,
    };
    let root_fd = safe_fs::open_dir_path(root).map_err(io_err)?;
    for (link, target) in links {
        let parts = components(link)?;
        let Some((name, parent)) = parts.split_last() else {
            continue;
        };
        let mut made = Vec::new();
        let dir = match safe_fs::walk(root_fd.as_fd(), parent, true, &mut |at| made.push(at))
            .map_err(io_err)?
        {
            Walk::Dir(fd) => fd,
            Walk::Symlink(at) | Walk::NotDir(at) => {
                return Err(RuntimeRootError::Blocked {
                    path: shown(&parts, parts.len()),
                    at: shown(&parts, at + 1),
                })
            }
            Walk::Missing => {
                return Err(RuntimeRootError::Blocked {
                    path: shown(&parts, parts.len()),
                    at: shown(&parts, parent.len()),
                })
            }
        };
        for depth in made {
            if let Walk::Dir(fd) =
                safe_fs::walk(root_fd.as_fd(), &parent[..=depth], false, &mut |_| {})
                    .map_err(io_err)?
            {
                safe_fs::chmod_fd(fd.as_fd(), 0o755).map_err(io_err)?;
            }
        }
        let target = target.as_os_str().as_encoded_bytes();
        match safe_fs::kind_at(dir.as_fd(), name).map_err(io_err)? {
            None => {}
            Some((rustix::fs::FileType::Symlink, _, _)) => {
                if safe_fs::read_link_at(dir.as_fd(), name).map_err(io_err)? == target {
                    continue;
                }
                safe_fs::remove_all_at(dir.as_fd(), name).map_err(io_err)?;
            }
            Some(_) => continue,
        }
        safe_fs::symlink_at(target, dir.as_fd(), name).map_err(io_err)?;
    }
    Ok(())
}

fn components(path: &Path) -> Result<Vec<Vec<u8>>, RuntimeRootError> {
    let bytes = path.as_os_str().as_encoded_bytes();
    let parts: Vec<Vec<u8>> = bytes
        .split(|b| *b == b'/')
        .filter(|c| !c.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    if !bytes.starts_with(b"/") || parts.is_empty() || parts.iter().any(|c| c == b"." || c == b"..")
    {
        return Err(RuntimeRootError::BadPath(path.display().to_string()));
    }
    Ok(parts)
}

fn shown(components: &[Vec<u8>], depth: usize) -> String {
    let mut out = String::new();
    for c in &components[..depth.min(components.len())] {
        out.push('/');
        out.push_str(&String::from_utf8_lossy(c));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn tree(dir: &Path) -> PathBuf {
        let tree = dir.join("trees/sha256/abc");
        std::fs::create_dir_all(tree.join("bin")).unwrap();
        std::fs::create_dir_all(tree.join("srv")).unwrap();
        std::fs::write(tree.join("bin/tool"), b"#!tool").unwrap();
        std::fs::set_permissions(
            tree.join("bin/tool"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("/etc/passwd", tree.join("srv/link")).unwrap();
        std::os::unix::fs::symlink("bin", tree.join("sbin")).unwrap();
        std::fs::create_dir_all(dir.join("tmp")).unwrap();
        tree
    }

    #[test]
    fn a_jobs_root_shares_the_trees_files_and_makes_its_mount_points_outside_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let tree = tree(dir.path());
        let before: Vec<_> = walkdir(&tree);
        let root = runtime_root(
            dir.path(),
            &tree,
            &[PathBuf::from("/home/alice/ocr"), PathBuf::from("/data/x")],
        )
        .unwrap();
        assert!(root.starts_with(dir.path().join("roots/sha256")));
        let name = root.file_name().unwrap().to_str().unwrap();
        assert_eq!(tree_of_root(name), Some("abc"));
        assert_eq!(tree_of_root("abc"), None);
        assert_eq!(tree_of_root(&format!("-{}", "0".repeat(64))), None);
        // The same file, not a copy; the symlink as it was, not followed.
        assert_eq!(
            std::fs::metadata(root.join("bin/tool")).unwrap().ino(),
            std::fs::metadata(tree.join("bin/tool")).unwrap().ino()
        );
        assert_eq!(
            std::fs::read_link(root.join("srv/link")).unwrap(),
            Path::new("/etc/passwd")
        );
        for point in ["home/alice/ocr", "data/x", "root", "usr", "proc", "var/tmp"] {
            let meta = std::fs::symlink_metadata(root.join(point)).unwrap();
            assert!(meta.is_dir(), "{point}");
            assert_eq!(meta.mode() & 0o7777, 0o755, "{point}");
        }
        // The shared tree is as it was.
        assert_eq!(walkdir(&tree), before);
        // Asked again: the same root, not rebuilt; other mount points:
        // another root.
        let again = runtime_root(
            dir.path(),
            &tree,
            &[PathBuf::from("/data/x"), PathBuf::from("/home/alice/ocr")],
        )
        .unwrap();
        assert_eq!(again, root);
        let other = runtime_root(dir.path(), &tree, &[PathBuf::from("/home/bob")]).unwrap();
        assert_ne!(other, root);
        assert!(!other.join("home/alice").exists());
        assert!(std::fs::read_dir(dir.path().join("tmp"))
            .unwrap()
            .next()
            .is_none());
    }

    #[test]
    fn a_mount_point_through_a_symlink_of_the_image_is_refused_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let tree = tree(dir.path());
        let err = runtime_root(dir.path(), &tree, &[PathBuf::from("/sbin/x")]).unwrap_err();
        assert!(
            matches!(&err, RuntimeRootError::Blocked { at, .. } if at == "/sbin"),
            "{err}"
        );
        let err = runtime_root(dir.path(), &tree, &[PathBuf::from("/bin/tool/x")]).unwrap_err();
        assert!(matches!(err, RuntimeRootError::Blocked { .. }), "{err}");
        let err = runtime_root(dir.path(), &tree, &[PathBuf::from("/a/../b")]).unwrap_err();
        assert!(matches!(err, RuntimeRootError::BadPath(_)), "{err}");
        assert!(std::fs::read_dir(dir.path().join("tmp"))
            .unwrap()
            .next()
            .is_none());
        assert!(!dir.path().join("bin").exists() && !tree.join("sbin/x").exists());
    }

    #[test]
    fn driver_links_are_made_in_the_jobs_root_never_through_the_images_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let tree = tree(dir.path());
        let before = walkdir(&tree);
        let root = runtime_root(dir.path(), &tree, &[]).unwrap();
        let links = [
            (
                PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so"),
                PathBuf::from("libcuda.so.1"),
            ),
            (PathBuf::from("/bin/tool"), PathBuf::from("/elsewhere")),
        ];
        add_symlinks(&root, &links).unwrap();
        assert_eq!(
            std::fs::read_link(root.join("usr/lib/x86_64-linux-gnu/libcuda.so")).unwrap(),
            Path::new("libcuda.so.1")
        );
        // The image's own file wins; the tree is untouched.
        assert!(std::fs::symlink_metadata(root.join("bin/tool"))
            .unwrap()
            .is_file());
        assert_eq!(walkdir(&tree), before);
        // Again, and with another target: replaced, not duplicated.
        add_symlinks(&root, &links[..1]).unwrap();
        let moved = [(links[0].0.clone(), PathBuf::from("libcuda.so.2"))];
        add_symlinks(&root, &moved).unwrap();
        assert_eq!(
            std::fs::read_link(root.join("usr/lib/x86_64-linux-gnu/libcuda.so")).unwrap(),
            Path::new("libcuda.so.2")
        );
        // Through the image's `sbin -> bin`: refused, nothing made in bin.
        let err =
            add_symlinks(&root, &[(PathBuf::from("/sbin/x"), PathBuf::from("y"))]).unwrap_err();
        assert!(matches!(err, RuntimeRootError::Blocked { .. }), "{err}");
        assert!(!root.join("bin/x").exists() && !tree.join("bin/x").exists());
    }

    #[test]
    fn the_api_directories_are_real_in_a_jobs_root_and_driver_mount_points_never_leave_it() {
        let dir = tempfile::tempdir().unwrap();
        let tree = tree(dir.path());
        // A hostile image: `/run -> /dev`, `/tmp` a file, `/usr/lib -> /etc`.
        std::os::unix::fs::symlink("/dev", tree.join("run")).unwrap();
        std::fs::write(tree.join("tmp"), b"not a dir").unwrap();
        std::fs::create_dir_all(tree.join("usr")).unwrap();
        std::os::unix::fs::symlink("/etc", tree.join("usr/lib")).unwrap();
        let before = walkdir(&tree);
        let root = runtime_root(dir.path(), &tree, &[]).unwrap();
        for name in API_DIRECTORIES {
            let meta = std::fs::symlink_metadata(root.join(name)).unwrap();
            assert!(meta.is_dir(), "{name}");
        }
        assert_eq!(walkdir(&tree), before);
        add_mount_points(
            &root,
            &[
                (PathBuf::from("/opt/driver/lib/libfake.so.1"), false),
                (PathBuf::from("/opt/driver/firmware"), true),
            ],
        )
        .unwrap();
        assert!(root.join("opt/driver/lib/libfake.so.1").is_file());
        assert!(root.join("opt/driver/firmware").is_dir());
        let err = add_mount_points(&root, &[(PathBuf::from("/usr/lib/libcuda.so.1"), false)])
            .unwrap_err();
        assert!(
            matches!(&err, RuntimeRootError::Blocked { at, .. } if at == "/usr/lib"),
            "{err}"
        );
        assert!(!Path::new("/etc/libcuda.so.1").exists());
    }

    fn walkdir(root: &Path) -> Vec<(PathBuf, u32)> {
        let mut out = Vec::new();
        let mut stack = vec![root.to_owned()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let entry = entry.unwrap();
                let meta = std::fs::symlink_metadata(entry.path()).unwrap();
                out.push((entry.path(), meta.mode()));
                if meta.is_dir() {
                    stack.push(entry.path());
                }
            }
        }
        out.sort();
        out
    }
}
