//! The devices of every spec read, and what a job's GPUs get from them.
//! Pure: the specs come in as values ([`super::load`] reads them).
//!
//! Precedence is the CDI cache's: a device defined in a later directory
//! (`/var/run/cdi`, written at boot by a root service) replaces the one of
//! the same name in an earlier one (`/etc/cdi`); two files of one
//! directory defining the same device is an error, raised when that
//! device is asked for (another device of the same files stays usable).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::spec::{ContainerEdits, DeviceNode, Hook, Mount, Spec};
use super::CdiError;
use crate::store::AssignedGpu;

/// The kind nvidia-ctk writes for whole GPUs.
pub const NVIDIA_GPU_KIND: &str = "nvidia.com/gpu";

/// All devices of all specs read, by qualified name (`kind=name`).
#[derive(Clone, Debug)]
pub struct Registry {
    /// The directories read, in order (for the messages).
    dirs: Vec<PathBuf>,
    specs: Vec<Spec>,
    /// Qualified name → (spec, device) indices.
    devices: BTreeMap<String, (usize, usize)>,
    /// Qualified name → the two files of one directory that both define it.
    conflicts: BTreeMap<String, (PathBuf, PathBuf)>,
}

/// One edit with the spec file it came from, so an error about it can
/// name the file.
#[derive(Clone, Debug, PartialEq)]
pub struct Sourced<T> {
    pub spec: PathBuf,
    pub item: T,
}

/// The edits a set of devices asks for, merged: each spec's own edits
/// once, then each device's, with duplicates dropped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MergedEdits {
    /// The CDI devices chosen, qualified (`nvidia.com/gpu=GPU-...`).
    pub devices: Vec<String>,
    pub env: Vec<Sourced<String>>,
    pub device_nodes: Vec<Sourced<DeviceNode>>,
    pub mounts: Vec<Sourced<Mount>>,
    pub hooks: Vec<Sourced<Hook>>,
}

impl Registry {
    /// The registry of `specs`, each with the index of its directory in
    /// `dirs` (a higher index overrides a lower one).
    pub fn new(dirs: Vec<PathBuf>, mut specs: Vec<(usize, Spec)>) -> Registry {
        // By directory, then by file name: the order the cache applies.
        specs.sort_by(|a, b| (a.0, &a.1.path).cmp(&(b.0, &b.1.path)));
        let mut devices: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        let mut priority_of: BTreeMap<String, usize> = BTreeMap::new();
        let mut conflicts = BTreeMap::new();
        let mut kept = Vec::with_capacity(specs.len());
        for (i, (priority, spec)) in specs.into_iter().enumerate() {
            for (d, device) in spec.devices.iter().enumerate() {
                let name = format!("{}={}", spec.kind, device.name);
                match priority_of.get(&name) {
                    Some(&p) if p == priority => {
                        let first = devices
                            .get(&name)
                            .map(|&(s, _)| kept_path(&kept, s))
                            .or_else(|| {
                                conflicts
                                    .get(&name)
                                    .map(|(a, _): &(PathBuf, PathBuf)| a.clone())
                            })
                            .unwrap_or_default();
                        devices.remove(&name);
                        conflicts.insert(name, (first, spec.path.clone()));
                    }
                    _ => {
                        conflicts.remove(&name);
                        priority_of.insert(name.clone(), priority);
                        devices.insert(name, (i, d));
                    }
                }
            }
            kept.push(spec);
        }
        Registry {
            dirs,
            specs: kept,
            devices,
            conflicts,
        }
    }

    pub fn specs(&self) -> &[Spec] {
        &self.specs
    }

    /// The qualified names of all usable devices.
    pub fn device_names(&self) -> impl Iterator<Item = &str> {
        self.devices.keys().map(String::as_str)
    }

    /// The CDI device of ptrain's GPU: the one named by its UUID
    /// (`nvidia.com/gpu=GPU-...`, the same GPU whatever the enumeration
    /// order), else by its index (`nvidia.com/gpu=0`). Its own device
    /// nodes must include the GPU's node, or the spec no longer matches
    /// the machine (an index that moved after a GPU was replaced).
    pub fn resolve_gpu(&self, gpu: &AssignedGpu) -> Result<String, CdiError> {
        let kind = NVIDIA_GPU_KIND;
        if !self
            .devices
            .keys()
            .any(|k| k.starts_with(&format!("{kind}=")))
            && !self
                .conflicts
                .keys()
                .any(|k| k.starts_with(&format!("{kind}=")))
        {
            return Err(CdiError::NoSpec {
                kind: kind.into(),
                dirs: self.dirs_text(),
            });
        }
        let by_uuid = format!("{kind}={}", gpu.uuid);
        let by_index = format!("{kind}={}", gpu.index);
        for name in [&by_uuid, &by_index] {
            if let Some((first, second)) = self.conflicts.get(name) {
                return Err(CdiError::Conflict {
                    device: name.clone(),
                    first: first.clone(),
                    second: second.clone(),
                });
            }
        }
        let name = if self.devices.contains_key(&by_uuid) {
            by_uuid
        } else if self.devices.contains_key(&by_index) {
            by_index
        } else {
            return Err(CdiError::DeviceMissing {
                index: gpu.index,
                uuid: gpu.uuid.clone(),
                kind: kind.into(),
                dirs: self.dirs_text(),
            });
        };
        let (s, d) = self.devices[&name];
        let spec = &self.specs[s];
        let nodes = &spec.devices[d].container_edits.device_nodes;
        let wanted = gpu.device.as_path();
        if !nodes
            .iter()
            .any(|n| Path::new(&n.path) == wanted || Path::new(n.host()) == wanted)
        {
            return Err(CdiError::WrongNode {
                device: name,
                spec: spec.path.clone(),
                index: gpu.index,
                node: gpu.device.clone(),
                given: nodes
                    .iter()
                    .map(|n| n.host().to_owned())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        Ok(name)
    }

    /// The merged edits of the CDI devices of `gpus`.
    pub fn edits_for_gpus(&self, gpus: &[AssignedGpu]) -> Result<MergedEdits, CdiError> {
        let names = gpus
            .iter()
            .map(|g| self.resolve_gpu(g))
            .collect::<Result<Vec<_>, _>>()?;
        self.edits_for(&names)
    }

    /// The merged edits of the devices named (qualified); each spec's own
    /// edits come first, once, in the order the devices name the specs.
    pub fn edits_for(&self, names: &[String]) -> Result<MergedEdits, CdiError> {
        let mut chosen: Vec<(usize, usize)> = Vec::new();
        for name in names {
            let Some(&at) = self.devices.get(name) else {
                return Err(CdiError::UnknownDevice {
                    device: name.clone(),
                    dirs: self.dirs_text(),
                });
            };
            if !chosen.contains(&at) {
                chosen.push(at);
            }
        }
        let mut spec_order: Vec<usize> = Vec::new();
        for &(s, _) in &chosen {
            if !spec_order.contains(&s) {
                spec_order.push(s);
            }
        }
        let mut merged = MergedEdits {
            devices: names.to_vec(),
            ..MergedEdits::default()
        };
        for &s in &spec_order {
            merge(&mut merged, &self.specs[s].path, &self.specs[s].edits)?;
        }
        for &(s, d) in &chosen {
            let spec = &self.specs[s];
            merge(&mut merged, &spec.path, &spec.devices[d].container_edits)?;
        }
        Ok(merged)
    }

    fn dirs_text(&self) -> String {
        self.dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(" and ")
    }
}

fn kept_path(kept: &[Spec], i: usize) -> PathBuf {
    kept.get(i).map(|s| s.path.clone()).unwrap_or_default()
}

/// Adds `edits` of `spec` to `merged`: an entry equal to one there is
/// dropped, one that contradicts it (the same variable, node or mount
/// point with another value) is an error naming both files.
fn merge(merged: &mut MergedEdits, spec: &Path, edits: &ContainerEdits) -> Result<(), CdiError> {
    let conflict = |what: String, first: &Path, a: String, b: String| CdiError::EditConflict {
        what,
        first: first.to_path_buf(),
        first_says: a,
        second: spec.to_path_buf(),
        second_says: b,
    };
    for entry in &edits.env {
        let key = entry.split_once('=').map_or(entry.as_str(), |(k, _)| k);
        match merged
            .env
            .iter()
            .find(|e| e.item.split_once('=').map(|(k, _)| k) == Some(key))
        {
            Some(old) if old.item == *entry => {}
            Some(old) => {
                return Err(conflict(
                    format!("the variable {key}"),
                    &old.spec,
                    old.item.clone(),
                    entry.clone(),
                ))
            }
            None => merged.env.push(Sourced {
                spec: spec.to_path_buf(),
                item: entry.clone(),
            }),
        }
    }
    for node in &edits.device_nodes {
        match merged
            .device_nodes
            .iter()
            .find(|n| n.item.path == node.path)
        {
            Some(old)
                if old.item.host() == node.host()
                    && old.item.major == node.major
                    && old.item.minor == node.minor => {}
            Some(old) => {
                return Err(conflict(
                    format!("the device node {}", node.path),
                    &old.spec,
                    describe_node(&old.item),
                    describe_node(node),
                ))
            }
            None => merged.device_nodes.push(Sourced {
                spec: spec.to_path_buf(),
                item: node.clone(),
            }),
        }
    }
    for mount in &edits.mounts {
        match merged
            .mounts
            .iter()
            .find(|m| m.item.container_path == mount.container_path)
        {
            Some(old) if old.item.host_path == mount.host_path => {}
            Some(old) => {
                return Err(conflict(
                    format!("the mount point {}", mount.container_path),
                    &old.spec,
                    old.item.host_path.clone(),
                    mount.host_path.clone(),
                ))
            }
            None => merged.mounts.push(Sourced {
                spec: spec.to_path_buf(),
                item: mount.clone(),
            }),
        }
    }
    for hook in &edits.hooks {
        if !merged.hooks.iter().any(|h| h.item == *hook) {
            merged.hooks.push(Sourced {
                spec: spec.to_path_buf(),
                item: hook.clone(),
            });
        }
    }
    Ok(())
}

fn describe_node(node: &DeviceNode) -> String {
    match (node.major, node.minor) {
        (Some(major), Some(minor)) => format!("{} ({major}:{minor})", node.host()),
        _ => node.host().to_owned(),
    }
}
