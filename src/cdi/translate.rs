//! The merged edits as what the job's unit needs: `DeviceAllow=` entries,
//! read-only binds, variables, and the symlinks and library folders of
//! the hooks. Pure; [`crate::systemd`] turns them into D-Bus values.
//!
//! - Device nodes: the unit's `/dev` is the host's (`MountAPIVFS=yes`
//!   binds it into the root), so a node needs no mount, only its
//!   `DeviceAllow=` entry (by host path: systemd resolves it to the
//!   major:minor at start, and the cgroup checks every open, whatever path
//!   the job uses). A node the spec puts at another container path than
//!   the host's is refused: binding it would create a mount point in the
//!   host's `/dev`. The access is the spec's `permissions` less `m`
//!   (creating nodes, which a job never may).
//! - Mounts: each is a read-only bind (`BindReadOnlyPaths=`) of its host
//!   path onto its container path, recursive only with `rbind`. A mount
//!   that asks to be writable is still bound read-only: nothing from a CDI
//!   spec is a job's to change. `nosuid`, `nodev`, `noexec` need no flag:
//!   the unit has `NoNewPrivileges=yes` and `DevicePolicy=closed`.
//!   Mount points under `/dev`, `/proc` and `/sys` (the host's API file
//!   systems in the unit) are refused.
//! - Paths and variables carry no `%`, `$`, `:`, `\`, quotes, white space
//!   or control characters: systemd writes a transient unit to a file on
//!   `daemon-reload` and reads it back, and those would be read as
//!   specifiers, separators or quoting (see [`crate::unit`]).

use std::path::{Path, PathBuf};

use super::hooks::{self, container_path, Symlink};
use super::registry::{MergedEdits, Sourced};
use super::CdiError;

/// `MS_REC` for `BindReadOnlyPaths=`'s flags over D-Bus.
const MS_REC: u64 = 16384;

/// What a job's unit gets from its GPUs' CDI devices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobDevices {
    /// The CDI devices, qualified (`nvidia.com/gpu=GPU-...`), for the log.
    pub devices: Vec<String>,
    /// `DeviceAllow=` entries: (host node path, `rw`/`r`/`w`).
    pub device_allow: Vec<(String, String)>,
    /// The nodes as the spec describes them, for [`super::load::verify_host`].
    pub host_nodes: Vec<HostNode>,
    /// `BindReadOnlyPaths=`.
    pub binds: Vec<BindMount>,
    /// `Environment=` entries (`KEY=VALUE`).
    pub environment: Vec<String>,
    /// Symlinks the job's root must show (create-symlinks, soname links).
    pub symlinks: Vec<Symlink>,
    /// The library folders of `update-ldcache`
    /// ([`hooks::ld_library_path`]).
    pub library_dirs: Vec<PathBuf>,
}

/// A device node on the host as its spec describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostNode {
    pub spec: PathBuf,
    pub path: PathBuf,
    /// `true` for a block device (`b`), else a character device.
    pub block: bool,
    /// Major and minor, when the spec gives them.
    pub number: Option<(u64, u64)>,
}

/// One read-only bind of a host path into the job's root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindMount {
    /// The spec that asked for it.
    pub spec: PathBuf,
    /// On the host.
    pub source: PathBuf,
    /// In the container (resolved by systemd inside the root).
    pub destination: PathBuf,
    pub recursive: bool,
}

impl BindMount {
    /// `BindReadOnlyPaths=` over D-Bus (`a(ssbt)`): source, destination,
    /// ignore a missing source (never: a missing driver file is an error),
    /// mount flags.
    pub fn dbus(&self) -> (String, String, bool, u64) {
        (
            self.source.display().to_string(),
            self.destination.display().to_string(),
            false,
            if self.recursive { MS_REC } else { 0 },
        )
    }
}

impl JobDevices {
    /// The container paths systemd binds onto: each must exist in the root
    /// the unit gets, or systemd creates it there, inside the image. (One
    /// under `/run` lands on the unit's own `/run` tmpfs, which
    /// `MountAPIVFS=yes` mounts first: systemd creates it there.)
    pub fn mount_points(&self) -> impl Iterator<Item = &Path> {
        self.binds.iter().map(|b| b.destination.as_path())
    }

    /// Adds the soname links of the libraries bound into the library
    /// folders ([`hooks::soname_links`]); `soname_of` reads a host file's
    /// soname ([`super::load::read_soname`]).
    pub fn add_soname_links(&mut self, soname_of: impl FnMut(&Path) -> Option<String>) {
        let files: Vec<(PathBuf, PathBuf)> = self
            .binds
            .iter()
            .map(|b| (b.destination.clone(), b.source.clone()))
            .collect();
        let links = hooks::soname_links(&files, &self.library_dirs, &self.symlinks, soname_of);
        self.symlinks.extend(links);
    }

    /// The `LD_LIBRARY_PATH` the job runs with: `existing` (the image's or
    /// the job's) and then the driver's folders.
    pub fn ld_library_path(&self, existing: Option<&str>) -> Option<String> {
        hooks::ld_library_path(existing, &self.library_dirs)
    }
}

/// Variables the daemon sets for every job ([`crate::unit`]): a spec may
/// not change what they say.
const DAEMON_VARIABLES: &[&str] = &["CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"];

/// The unit's share of `edits`.
pub fn translate(edits: &MergedEdits) -> Result<JobDevices, CdiError> {
    let mut out = JobDevices {
        devices: edits.devices.clone(),
        ..JobDevices::default()
    };
    for Sourced { spec, item: node } in &edits.device_nodes {
        let bad = |problem: String, fix: &str| super::spec::invalid(spec, problem, fix.into());
        let path = container_path(&node.path).map_err(|why| {
            bad(
                format!("the device node {:?} {why}", node.path),
                "write the node's path as /dev/NAME",
            )
        })?;
        if !path.starts_with("/dev") {
            return Err(bad(
                format!("the device node {} is not under /dev", node.path),
                "ptrain gives jobs the host's /dev; put device nodes there",
            ));
        }
        if node.host() != node.path {
            return Err(bad(
                format!(
                    "the device node {} is the host's {}, at another path",
                    node.path,
                    node.host()
                ),
                "ptrain gives jobs the host's /dev as it is; drop hostPath or make it the same as path",
            ));
        }
        unit_safe(&node.path).map_err(|why| {
            bad(
                format!("the device node {:?} {why}", node.path),
                "rename the node",
            )
        })?;
        let block = match node.node_type.as_deref() {
            None | Some("c") | Some("u") => false,
            Some("b") => true,
            Some(other) => {
                return Err(bad(
                    format!("the device node {} has type {other:?}", node.path),
                    "ptrain allows character (c) and block (b) devices only",
                ))
            }
        };
        let permissions = node.permissions.as_deref().unwrap_or("rwm");
        if permissions.is_empty() || !permissions.chars().all(|c| "rwm".contains(c)) {
            return Err(bad(
                format!(
                    "the device node {} has permissions {permissions:?}",
                    node.path
                ),
                "write some of r, w and m",
            ));
        }
        let access: String = ['r', 'w']
            .into_iter()
            .filter(|c| permissions.contains(*c))
            .collect();
        if access.is_empty() {
            return Err(bad(
                format!(
                    "the device node {} may be neither read nor written ({permissions:?})",
                    node.path
                ),
                "give it r, w or both",
            ));
        }
        let number = match (node.major, node.minor) {
            (Some(major), Some(minor)) if major >= 0 && minor >= 0 => {
                Some((major as u64, minor as u64))
            }
            (None, None) => None,
            _ => {
                return Err(bad(
                    format!(
                        "the device node {} has a partial or negative major:minor",
                        node.path
                    ),
                    "give both major and minor, or neither",
                ))
            }
        };
        out.device_allow.push((node.path.clone(), access));
        out.host_nodes.push(HostNode {
            spec: spec.clone(),
            path: path.clone(),
            block,
            number,
        });
    }
    for Sourced { spec, item: mount } in &edits.mounts {
        let bad = |problem: String, fix: &str| super::spec::invalid(spec, problem, fix.into());
        let fix_paths =
            "write both paths absolute and plain (no . or .., no % $ : \\ quotes or spaces)";
        match mount.mount_type.as_deref() {
            None | Some("bind") | Some("") => {}
            Some(other) => {
                return Err(bad(
                    format!("the mount of {} is of type {other:?}", mount.container_path),
                    "ptrain applies bind mounts only",
                ))
            }
        }
        let source = container_path(&mount.host_path).map_err(|why| {
            bad(
                format!("the mount's hostPath {:?} {why}", mount.host_path),
                fix_paths,
            )
        })?;
        let destination = container_path(&mount.container_path).map_err(|why| {
            bad(
                format!("the mount's containerPath {:?} {why}", mount.container_path),
                fix_paths,
            )
        })?;
        for text in [&mount.host_path, &mount.container_path] {
            unit_safe(text)
                .map_err(|why| bad(format!("the mount path {text:?} {why}"), fix_paths))?;
        }
        if destination == Path::new("/")
            || ["/dev", "/proc", "/sys"]
                .iter()
                .any(|api| destination.starts_with(api))
        {
            return Err(bad(
                format!(
                    "the mount point {} is the host's API file system in the job",
                    mount.container_path
                ),
                "mount driver files elsewhere (the job's /dev, /proc and /sys are the host's)",
            ));
        }
        let mut recursive = false;
        for option in &mount.options {
            match option.as_str() {
                "rbind" => recursive = true,
                "bind" | "ro" | "rw" | "nosuid" | "nodev" | "noexec" | "private" | "rprivate"
                | "slave" | "rslave" => {}
                other => {
                    return Err(bad(
                        format!("the mount of {} has the option {other:?}", mount.container_path),
                        "ptrain knows bind, rbind, ro, rw, nosuid, nodev, noexec and the propagation options; remove the others",
                    ))
                }
            }
        }
        out.binds.push(BindMount {
            spec: spec.clone(),
            source,
            destination,
            recursive,
        });
    }
    for Sourced { spec, item: entry } in &edits.env {
        let key = entry.split_once('=').map_or(entry.as_str(), |(k, _)| k);
        if DAEMON_VARIABLES.contains(&key) || key.starts_with("PTRAIN_") {
            return Err(super::spec::invalid(
                spec,
                format!("it sets {key}, which ptraind sets for every job"),
                format!("remove {key} from the spec's env"),
            ));
        }
        if entry.contains(['%', '$']) || entry.chars().any(char::is_control) {
            return Err(super::spec::invalid(
                spec,
                format!("the variable {key} has %, $ or a control character"),
                "write its value without them".into(),
            ));
        }
        out.environment.push(entry.clone());
    }
    let effects = hooks::interpret(&edits.hooks)?;
    for link in &effects.symlinks {
        if let Some(bind) = out.binds.iter().find(|b| b.destination == link.link) {
            return Err(CdiError::Hook {
                spec: bind.spec.clone(),
                hook: format!(
                    "create-symlinks --link {}::{}",
                    link.target.display(),
                    link.link.display()
                ),
                why: format!("{} is also a mount point", link.link.display()),
            });
        }
    }
    out.symlinks = effects.symlinks;
    out.library_dirs = effects.library_dirs;
    Ok(out)
}

/// Characters systemd's unit file syntax would read as something else.
fn unit_safe(text: &str) -> Result<(), &'static str> {
    if text
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || "%$:\\\"'".contains(c))
    {
        Err("has a character systemd's unit syntax gives a meaning (% $ : \\ quotes, space or control)")
    } else {
        Ok(())
    }
}
