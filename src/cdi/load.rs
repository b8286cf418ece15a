//! The I/O of the CDI room: reading the spec directories (only what root
//! alone could have written, see [`super`]'s threat model), checking that
//! the host paths a job's edits name are there, and reading a library's
//! soname.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::registry::Registry;
use super::spec::{self, Format, Spec};
use super::translate::JobDevices;
use super::CdiError;
use crate::fsutil;
use crate::store::AssignedGpu;

/// Where CDI specs live, in precedence order: a device in a later one
/// replaces the same device in an earlier one (`/var/run/cdi` is for specs
/// generated at boot, e.g. by `nvidia-cdi-refresh`).
pub const SPEC_DIRS: &[&str] = &["/etc/cdi", "/var/run/cdi"];

/// The largest spec file read. nvidia-ctk writes some 10 KiB per GPU plus
/// the driver's files (some 100 entries); 4 MiB is far beyond a real one.
pub const MAX_SPEC_BYTES: usize = 4 * 1024 * 1024;

/// The most spec files read from one directory.
pub const MAX_SPEC_FILES: usize = 256;

/// Who may own the spec directories and files: root in ptraind (a test
/// passes its own uid).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trust {
    pub owner: u32,
}

impl Trust {
    pub const ROOT: Trust = Trust { owner: 0 };
}

const FIX_OWNER: &str =
    "make it owned by root and writable by root alone (chown root:root; chmod go-w), or remove it";

/// Reads every spec of `dirs` (in precedence order; a missing directory
/// holds none). Any file ptraind will not trust, cannot read or cannot
/// parse is an error naming it: these files decide what a job gets, and
/// a device half-read from a broken set is worse than none.
pub fn load_registry(dirs: &[PathBuf], trust: Trust) -> Result<Registry, CdiError> {
    let mut specs = Vec::new();
    for (priority, dir) in dirs.iter().enumerate() {
        for spec in read_dir_specs(dir, trust)? {
            specs.push((priority, spec));
        }
    }
    Ok(Registry::new(dirs.to_vec(), specs))
}

/// [`load_registry`] over [`SPEC_DIRS`], trusting root.
pub fn load_host_registry() -> Result<Registry, CdiError> {
    let dirs: Vec<PathBuf> = SPEC_DIRS.iter().map(PathBuf::from).collect();
    load_registry(&dirs, Trust::ROOT)
}

/// The specs of one directory, by file name; `[]` when it does not exist.
pub fn read_dir_specs(dir: &Path, trust: Trust) -> Result<Vec<Spec>, CdiError> {
    let fd = match fsutil::open_dir(dir) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e)
            if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            return Err(untrusted(
                "directory",
                dir,
                "it is a symbolic link or not a directory".into(),
                "make it a real directory owned by root (nvidia-ctk writes into it as it is)",
            ))
        }
        Err(source) => return Err(read_error("directory", dir, source)),
    };
    let id = fsutil::fstat(&fd).map_err(|e| read_error("directory", dir, e))?;
    check_owner("directory", dir, id.uid, id.gid, id.mode, trust)?;
    check_ancestors(dir, trust)?;
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| read_error("directory", dir, e))? {
        let entry = entry.map_err(|e| read_error("directory", dir, e))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if Format::of(&name).is_some() {
            names.push(name);
        }
    }
    names.sort();
    if names.len() > MAX_SPEC_FILES {
        return Err(untrusted(
            "directory",
            dir,
            format!(
                "it holds {} spec files, more than {MAX_SPEC_FILES}",
                names.len()
            ),
            "remove the ones no runtime uses",
        ));
    }
    names
        .iter()
        .map(|name| read_spec_at(&fd, &dir.join(name), name, trust))
        .collect()
}

/// Opens `name` in the directory without following a symlink and decides
/// from the open file (no name is looked up twice).
fn read_spec_at(dir: &OwnedFd, path: &Path, name: &str, trust: Trust) -> Result<Spec, CdiError> {
    let mut file = match fsutil::open_at_nofollow(dir, name) {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(untrusted(
            "spec",
            path,
            "it is a symbolic link, which ptraind does not follow (its target could be anyone's)"
                .into(),
            "put the spec itself there (nvidia-ctk cdi generate --output=...)",
        )),
        Err(source) => return Err(read_error("spec", path, source)),
    };
    let id = fsutil::fstat(&file).map_err(|e| read_error("spec", path, e))?;
    if !id.is_regular() {
        return Err(untrusted(
            "spec",
            path,
            format!("it is a {}", id.kind()),
            "make it a regular file, or rename it to end in neither .yaml nor .json",
        ));
    }
    check_owner("spec", path, id.uid, id.gid, id.mode, trust)?;
    if id.size > MAX_SPEC_BYTES as u64 {
        return Err(too_large(path));
    }
    let bytes =
        fsutil::read_bounded(&mut file, MAX_SPEC_BYTES).map_err(|e| read_error("spec", path, e))?;
    if bytes.len() > MAX_SPEC_BYTES {
        return Err(too_large(path));
    }
    spec::parse(path, &bytes)
}

fn too_large(path: &Path) -> CdiError {
    untrusted(
        "spec",
        path,
        format!("it is larger than {} MiB", MAX_SPEC_BYTES >> 20),
        "no real spec is that large; regenerate it with `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`",
    )
}

/// Owned by the trusted user, writable by no one else: not by others, and
/// by the group only when it is root's.
fn check_owner(
    what: &'static str,
    path: &Path,
    uid: u32,
    gid: u32,
    mode: u32,
    trust: Trust,
) -> Result<(), CdiError> {
    let why = if uid != trust.owner {
        Some(format!("it is owned by uid {uid}, not {}", trust.owner))
    } else if mode & 0o002 != 0 {
        Some(format!(
            "it is writable by everyone (mode {:o})",
            mode & 0o7777
        ))
    } else if mode & 0o020 != 0 && gid != 0 {
        Some(format!(
            "it is writable by group {gid} (mode {:o})",
            mode & 0o7777
        ))
    } else {
        None
    };
    match why {
        Some(why) => Err(untrusted(what, path, why, FIX_OWNER)),
        None => Ok(()),
    }
}

/// Every directory above `dir` must be root's (or the trusted user's) and
/// writable by others only with the sticky bit (`/tmp`): otherwise
/// someone could rename the directory away and put their own in its
/// place between two reads.
fn check_ancestors(dir: &Path, trust: Trust) -> Result<(), CdiError> {
    // Both the path as named (`/var/run`, a symlink in `/var`) and as it
    // resolves (`/run`).
    let real = std::fs::canonicalize(dir).map_err(|e| read_error("directory", dir, e))?;
    for ancestor in dir.ancestors().skip(1).chain(real.ancestors().skip(1)) {
        if ancestor.as_os_str().is_empty() {
            continue;
        }
        let meta = std::fs::metadata(ancestor).map_err(|e| read_error("directory", ancestor, e))?;
        let mode = meta.mode();
        let owner_ok = meta.uid() == 0 || meta.uid() == trust.owner;
        let sticky = mode & 0o1000 != 0;
        let others_write = mode & 0o002 != 0 || (mode & 0o020 != 0 && meta.gid() != 0);
        if !owner_ok || (others_write && !sticky) {
            return Err(untrusted(
                "directory",
                dir,
                format!(
                    "{} above it is owned by uid {} with mode {:o}",
                    ancestor.display(),
                    meta.uid(),
                    mode & 0o7777
                ),
                "keep the CDI directories under root-owned directories only others cannot write",
            ));
        }
    }
    Ok(())
}

fn untrusted(what: &'static str, path: &Path, why: String, fix: &str) -> CdiError {
    CdiError::Untrusted {
        what,
        path: path.to_path_buf(),
        why,
        fix: fix.into(),
    }
}

fn read_error(what: &'static str, path: &Path, source: io::Error) -> CdiError {
    CdiError::Read {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Checks that the host side of `devices` is as its specs say: each bound
/// path exists, and each device node is a device of the given type and
/// number. A missing driver file (the driver was upgraded after the spec
/// was generated) is an error naming it, not a job that fails later.
pub fn verify_host(devices: &JobDevices) -> Result<(), CdiError> {
    for bind in &devices.binds {
        if let Err(e) = std::fs::metadata(&bind.source) {
            return Err(CdiError::HostPath {
                spec: bind.spec.clone(),
                path: bind.source.clone(),
                why: format!("it cannot be read ({e})"),
            });
        }
    }
    for node in &devices.host_nodes {
        let meta = std::fs::metadata(&node.path).map_err(|e| CdiError::HostPath {
            spec: node.spec.clone(),
            path: node.path.clone(),
            why: format!("it cannot be read ({e})"),
        })?;
        let kind = meta.mode() & libc::S_IFMT;
        let wanted = if node.block {
            libc::S_IFBLK
        } else {
            libc::S_IFCHR
        };
        if kind != wanted {
            return Err(CdiError::HostPath {
                spec: node.spec.clone(),
                path: node.path.clone(),
                why: format!(
                    "it is not a {} device",
                    if node.block { "block" } else { "character" }
                ),
            });
        }
        if let Some((major, minor)) = node.number {
            let rdev = meta.rdev();
            let found = (libc::major(rdev) as u64, libc::minor(rdev) as u64);
            if found != (major, minor) {
                return Err(CdiError::HostPath {
                    spec: node.spec.clone(),
                    path: node.path.clone(),
                    why: format!(
                        "it is device {}:{}, the spec says {major}:{minor}",
                        found.0, found.1
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Everything a job in a container image gets for `gpus` on this host:
/// the host's specs read ([`load_host_registry`]), the GPUs' devices
/// resolved and translated ([`super::job_devices`]), the host paths
/// checked ([`verify_host`]) and the soname links added ([`read_soname`]).
pub fn host_job_devices(dirs: &[PathBuf], gpus: &[AssignedGpu]) -> Result<JobDevices, CdiError> {
    let registry = load_registry(dirs, Trust::ROOT)?;
    let mut devices = super::job_devices(&registry, gpus)?;
    verify_host(&devices)?;
    devices.add_soname_links(read_soname);
    Ok(devices)
}

/// The `DT_SONAME` of the shared library at `path` on the host, `None`
/// when it is not a readable ELF library with one. Reads only the headers
/// and the few bytes they point at ([`super::elf::soname`]).
pub fn read_soname(path: &Path) -> Option<String> {
    let file = File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    super::elf::soname(len, |offset, size| {
        let mut buf = vec![0; size];
        file.read_exact_at(&mut buf, offset).ok().map(|()| buf)
    })
}
