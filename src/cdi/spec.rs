//! One CDI spec file: its bytes parsed (YAML or JSON, by the file's
//! extension, as the CDI reference library does) and checked. Pure.
//!
//! Unknown fields are refused rather than ignored: a field a later CDI
//! version adds is an edit ptraind would otherwise silently leave out of
//! the job (or, worse, a restriction it would not apply). Fields CDI
//! defines that ptrain does not implement (`intelRdt`, `additionalGids`,
//! `netDevices`) are refused when they ask for anything, for the same
//! reason.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::de::IgnoredAny;
use serde::Deserialize;

use super::CdiError;

/// The CDI spec versions ptrain reads: 0.3.0 (the first with
/// `containerEdits`) to 0.8.0. Older files use another layout; a newer one
/// may carry edits ptrain does not know.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0"];

/// What the error messages tell an admin to run when a spec is missing,
/// stale or unreadable.
pub const GENERATE_HINT: &str =
    "generate it anew with `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`";

/// How a spec file is written, from its name (`.yaml` or `.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

impl Format {
    /// The format of a file named `name`, `None` for a file that is not a
    /// spec (the CDI directories may hold other files, e.g. a README).
    pub fn of(name: &str) -> Option<Format> {
        if name.starts_with('.') {
            return None;
        }
        if name.ends_with(".yaml") {
            Some(Format::Yaml)
        } else if name.ends_with(".json") {
            Some(Format::Json)
        } else {
            None
        }
    }
}

/// A checked spec: one vendor/class (`kind`) and its devices.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    /// The file it was read from; every error about its edits names it.
    pub path: PathBuf,
    pub version: String,
    /// `vendor/class`, e.g. `nvidia.com/gpu`.
    pub kind: String,
    pub devices: Vec<Device>,
    /// Applied once when any of its devices is chosen.
    pub edits: ContainerEdits,
}

impl Spec {
    pub fn device(&self, name: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.name == name)
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    /// Unique within its kind: `0`, `GPU-<uuid>`, `all` for nvidia.
    pub name: String,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

/// The changes to a container a spec or a device asks for.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    /// `KEY=VALUE`.
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default)]
    pub mounts: Vec<Mount>,
    #[serde(default)]
    pub hooks: Vec<Hook>,
    /// Not implemented: refused when present.
    #[serde(default)]
    pub intel_rdt: Option<IgnoredAny>,
    /// Not implemented: refused when not empty.
    #[serde(default)]
    pub additional_gids: Vec<u32>,
    /// Not implemented: refused when not empty.
    #[serde(default)]
    pub net_devices: Vec<IgnoredAny>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    /// Where the node is in the container.
    pub path: String,
    /// Where it is on the host, when not at `path`.
    #[serde(default)]
    pub host_path: Option<String>,
    /// `c` (char), `b` (block), `u`, `p`.
    #[serde(default, rename = "type")]
    pub node_type: Option<String>,
    #[serde(default)]
    pub major: Option<i64>,
    #[serde(default)]
    pub minor: Option<i64>,
    #[serde(default)]
    pub file_mode: Option<u32>,
    /// The cgroup access: some of `r`, `w`, `m`.
    #[serde(default)]
    pub permissions: Option<String>,
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
}

impl DeviceNode {
    /// The node on the host.
    pub fn host(&self) -> &str {
        self.host_path.as_deref().unwrap_or(&self.path)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, rename = "type")]
    pub mount_type: Option<String>,
    #[serde(default)]
    pub options: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hook {
    /// The OCI hook point: `createContainer`, `prestart`, ...
    pub hook_name: String,
    pub path: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub timeout: Option<i64>,
}

/// The file's top level, as written.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawSpec {
    cdi_version: String,
    kind: String,
    #[serde(default)]
    #[allow(dead_code)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    devices: Vec<Device>,
    #[serde(default)]
    container_edits: ContainerEdits,
}

/// Parses and checks the spec file `path` (the name decides the format;
/// only the name is used, no I/O).
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Spec, CdiError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let format = Format::of(&name).ok_or_else(|| {
        invalid(
            path,
            "the file name ends neither in .yaml nor in .json".into(),
            "name it NAME.yaml or NAME.json".into(),
        )
    })?;
    let raw: RawSpec = match format {
        Format::Json => serde_json::from_slice(bytes).map_err(|e| syntax(path, "JSON", e))?,
        Format::Yaml => {
            let text = std::str::from_utf8(bytes).map_err(|_| {
                invalid(
                    path,
                    "it is not UTF-8 text".into(),
                    GENERATE_HINT.to_string(),
                )
            })?;
            serde_saphyr::from_str(text).map_err(|e| syntax(path, "YAML", e))?
        }
    };
    check(path, raw)
}

fn syntax(path: &Path, format: &str, e: impl std::fmt::Display) -> CdiError {
    invalid(
        path,
        format!("it is not a CDI spec in {format}: {e}"),
        format!("fix the file, or {GENERATE_HINT}"),
    )
}

pub(super) fn invalid(path: &Path, problem: String, fix: String) -> CdiError {
    CdiError::Invalid {
        path: path.to_path_buf(),
        problem,
        fix,
    }
}

fn check(path: &Path, raw: RawSpec) -> Result<Spec, CdiError> {
    if !SUPPORTED_VERSIONS.contains(&raw.cdi_version.as_str()) {
        return Err(invalid(
            path,
            format!(
                "cdiVersion {:?} is not one ptrain reads ({})",
                raw.cdi_version,
                SUPPORTED_VERSIONS.join(", ")
            ),
            format!("write it in one of those versions, or {GENERATE_HINT}"),
        ));
    }
    check_kind(&raw.kind).map_err(|why| {
        invalid(
            path,
            format!("kind {:?} {why}", raw.kind),
            "write it as vendor/class, e.g. nvidia.com/gpu".into(),
        )
    })?;
    if raw.devices.is_empty() {
        return Err(invalid(
            path,
            "it lists no devices".into(),
            format!("list at least one device, or {GENERATE_HINT}"),
        ));
    }
    let mut seen = BTreeSet::new();
    for device in &raw.devices {
        check_device_name(&device.name).map_err(|why| {
            invalid(
                path,
                format!("device name {:?} {why}", device.name),
                "name devices with letters, digits and - _ . : (starting and ending with a letter or digit)".into(),
            )
        })?;
        if !seen.insert(device.name.as_str()) {
            return Err(invalid(
                path,
                format!("device {:?} is listed twice", device.name),
                "keep one of them".into(),
            ));
        }
        check_edits(
            path,
            &format!("device {:?}", device.name),
            &device.container_edits,
        )?;
    }
    check_edits(path, "the spec's containerEdits", &raw.container_edits)?;
    Ok(Spec {
        path: path.to_path_buf(),
        version: raw.cdi_version,
        kind: raw.kind,
        devices: raw.devices,
        edits: raw.container_edits,
    })
}

/// What ptrain does not implement is refused, not skipped: the job would
/// run without what the vendor said the device needs.
fn check_edits(path: &Path, whose: &str, edits: &ContainerEdits) -> Result<(), CdiError> {
    let unsupported = if edits.intel_rdt.is_some() {
        Some("intelRdt")
    } else if !edits.additional_gids.is_empty() {
        Some("additionalGids")
    } else if !edits.net_devices.is_empty() {
        Some("netDevices")
    } else {
        None
    };
    if let Some(field) = unsupported {
        return Err(invalid(
            path,
            format!("{whose} asks for {field}, which ptrain does not apply"),
            format!("remove {field} from the spec or move the device to a spec of its own"),
        ));
    }
    for entry in &edits.env {
        match entry.split_once('=') {
            Some((key, _)) if !key.is_empty() && !entry.contains('\0') => {}
            _ => {
                return Err(invalid(
                    path,
                    format!("{whose} has the environment entry {entry:?}, not KEY=VALUE"),
                    "write it as KEY=VALUE".into(),
                ))
            }
        }
    }
    for node in &edits.device_nodes {
        if node.path.is_empty() {
            return Err(invalid(
                path,
                format!("{whose} has a device node without a path"),
                "give each deviceNodes entry its path".into(),
            ));
        }
    }
    for mount in &edits.mounts {
        if mount.host_path.is_empty() || mount.container_path.is_empty() {
            return Err(invalid(
                path,
                format!("{whose} has a mount without hostPath or containerPath"),
                "give each mounts entry both".into(),
            ));
        }
    }
    for hook in &edits.hooks {
        if !hook.path.starts_with('/') {
            return Err(invalid(
                path,
                format!(
                    "{whose} has a hook whose path {:?} is not absolute",
                    hook.path
                ),
                "CDI hooks name their program by absolute path".into(),
            ));
        }
    }
    Ok(())
}

/// `vendor/class`: the vendor a DNS subdomain-like name, the class a name
/// of at most 63 characters; each begins and ends with a letter or digit
/// (the CDI spec's rule).
pub fn check_kind(kind: &str) -> Result<(), &'static str> {
    let Some((vendor, class)) = kind.split_once('/') else {
        return Err("has no '/' between vendor and class");
    };
    if vendor.is_empty() || vendor.len() > 253 {
        return Err("has an empty or over-long vendor");
    }
    if !vendor.split('.').all(|label| {
        edge_alnum(label)
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    }) {
        return Err("has a vendor that is not a dotted DNS-like name");
    }
    if class.is_empty() || class.len() > 63 || !edge_alnum(class) {
        return Err("has a class that is empty, over 63 characters, or does not begin and end with a letter or digit");
    }
    if !class
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err("has a class with characters other than letters, digits and - _ .");
    }
    Ok(())
}

/// Letters, digits and `- _ . :`, beginning and ending with a letter or
/// digit (the CDI reference library's rule; nvidia names `0`, `all`,
/// `GPU-<uuid>`, `0:1` for a MIG device).
pub fn check_device_name(name: &str) -> Result<(), &'static str> {
    if !edge_alnum(name) {
        return Err("is empty or does not begin and end with a letter or digit");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
    {
        return Err("has characters other than letters, digits and - _ . :");
    }
    Ok(())
}

fn edge_alnum(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty() && b[0].is_ascii_alphanumeric() && b[b.len() - 1].is_ascii_alphanumeric()
}
