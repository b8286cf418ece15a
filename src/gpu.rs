//! GPU inventory (what the machine has, and who is using it) and the pure
//! allocation rule that picks GPUs for a job.
//!
//! Two backends: NVML, loaded at runtime with dlopen so the daemon starts (and
//! its tests run) on machines without the NVIDIA driver, and a list declared
//! in the config for machines where NVML is unavailable or unwanted. Either
//! is wrapped in a [`PoolMonitor`], which keeps GPUs that vanish or turn
//! unhealthy in the snapshot, marked unhealthy, and logs each change once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, TemperatureSensor, TopologyLevel,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};
use serde::{Deserialize, Serialize};

use crate::setting::InvalidSetting;

const MIB: u64 = 1024 * 1024;
/// Largest NUMA node number accepted in the config (Linux's MAX_NUMNODES).
const MAX_NUMA_NODE: u32 = 1023;

/// Device nodes every CUDA process needs besides its GPUs' own nodes.
pub const NVIDIA_CONTROL_NODES: &[&str] = &[
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GpuProcess {
    pub pid: u32,
    pub used_memory_mib: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub pci_bus_id: Option<String>,
    /// 0 when the backend could not read it.
    pub memory_total_mib: u64,
    pub memory_used_mib: Option<u64>,
    pub utilization_pct: Option<u32>,
    pub temperature_c: Option<u32>,
    /// The GPU's own device node, `/dev/nvidiaN`.
    pub device: PathBuf,
    /// Compute processes on the GPU; empty when none or when unknown.
    pub processes: Vec<GpuProcess>,
    /// NUMA node the GPU hangs off, when known.
    #[serde(default)]
    pub numa_node: Option<u32>,
    /// GPUs with the same value reach each other through PCIe switches
    /// without crossing a host bridge (NVML topology level SINGLE or
    /// MULTIPLE, or one board); the value is the group's lowest index.
    /// `None` when unknown.
    #[serde(default)]
    pub topology_group: Option<u32>,
    /// Why the GPU must not be given to jobs now (uncorrected ECC errors,
    /// lost from the bus...); `None` when healthy.
    #[serde(default)]
    pub unhealthy: Option<String>,
}

pub trait GpuInventory: Send + Sync {
    /// `"nvml"` or `"declared"`.
    fn backend(&self) -> &'static str;
    fn snapshot(&self) -> Result<Vec<GpuInfo>, GpuError>;
    /// Which job holds each GPU (index → job id), for log entries; only
    /// the [`PoolMonitor`] keeps it.
    fn set_holders(&self, _holders: BTreeMap<u32, String>) {}
    /// What happened to the GPUs under job `job` while it held them (one
    /// left the pool), for its `ptrain status`; only the [`PoolMonitor`]
    /// keeps it.
    fn job_warning(&self, _job: &str) -> Option<String> {
        None
    }
    /// The jobs whose warning grew since the last call, each with its
    /// warning now: ptraind tells their owners (`gpu-lost`).
    fn take_new_warnings(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// The last look at the GPUs, when some GPU's health (in the pool or
    /// out) differs from the look last taken: for the health ledger
    /// ([`crate::gpu_health`]); only the [`PoolMonitor`] keeps it.
    fn take_health(&self) -> Option<Vec<GpuInfo>> {
        None
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("cannot initialise NVML: {0}; check that the NVIDIA driver is loaded (`nvidia-smi` works), or set `backend = \"declared\"` in [gpus] and list the GPUs")]
    NvmlInit(#[source] NvmlError),

    #[error("cannot count GPUs through NVML: {0}; check `nvidia-smi`, the driver may be wedged or mid-upgrade")]
    Enumerate(#[source] NvmlError),
}

/// Which inventory backend to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuBackend {
    /// NVML if it initialises, else the declared list.
    #[default]
    Auto,
    Nvml,
    Declared,
}

/// The config file's `[gpus]` table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    pub backend: GpuBackend,
    /// A GPU that no ptrain job holds is still skipped while other programs use
    /// at least this much of its memory.
    pub foreign_memory_threshold_mib: u64,
    /// `[[gpus.declared]]`
    pub declared: Vec<DeclaredGpu>,
    /// Where the CDI specs that put GPUs into container images are read
    /// from ([`crate::cdi`]; `nvidia-ctk cdi generate` writes them):
    /// later directories override earlier ones.
    pub cdi_spec_dirs: Vec<PathBuf>,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            backend: GpuBackend::Auto,
            foreign_memory_threshold_mib: 512,
            declared: Vec::new(),
            cdi_spec_dirs: crate::cdi::load::SPEC_DIRS
                .iter()
                .map(PathBuf::from)
                .collect(),
        }
    }
}

/// One `[[gpus.declared]]` entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeclaredGpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_mib: u64,
    pub device: PathBuf,
    /// NUMA node, so multi-GPU jobs are kept on one node when they can
    /// (`cat /sys/bus/pci/devices/<bus id>/numa_node`).
    #[serde(default)]
    pub numa_node: Option<u32>,
}

impl GpuConfig {
    /// Checks what serde cannot. The message names the key
    /// (`gpus.declared[i].field`) and says how to fix it.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        self.check()
            .map_err(|message| InvalidSetting::new("gpus".into(), message))
    }

    fn check(&self) -> Result<(), String> {
        if self.foreign_memory_threshold_mib == 0 {
            return Err(
                "`gpus.foreign_memory_threshold_mib` is 0, so no GPU could ever be \
                        chosen (the driver itself uses some memory); use the default 512 or \
                        another positive number of MiB"
                    .to_owned(),
            );
        }
        let mut indices = BTreeSet::new();
        let mut uuids = BTreeSet::new();
        let mut devices = BTreeSet::new();
        for (i, g) in self.declared.iter().enumerate() {
            let key = |field: &str| format!("`gpus.declared[{i}].{field}`");
            if !indices.insert(g.index) {
                return Err(format!(
                    "{} = {} is used by an earlier entry; give each GPU its own index",
                    key("index"),
                    g.index
                ));
            }
            if g.uuid.is_empty() || g.uuid.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(format!(
                    "{} = {:?} must be non-empty without spaces; copy it from `nvidia-smi -L` (e.g. \"GPU-8f2c...\")",
                    key("uuid"),
                    g.uuid
                ));
            }
            if !uuids.insert(g.uuid.as_str()) {
                return Err(format!(
                    "{} = {:?} is used by an earlier entry; each GPU has its own UUID, see `nvidia-smi -L`",
                    key("uuid"),
                    g.uuid
                ));
            }
            if g.name.trim().is_empty() || g.name.chars().any(char::is_control) {
                return Err(format!(
                    "{} must be a non-empty single-line name; write e.g. \"NVIDIA H100 80GB HBM3\"",
                    key("name")
                ));
            }
            if g.memory_mib == 0 {
                return Err(format!(
                    "{} is 0; give the GPU's memory in MiB as `nvidia-smi --query-gpu=memory.total --format=csv` shows",
                    key("memory_mib")
                ));
            }
            check_device_path(&g.device).map_err(|why| {
                format!(
                    "{} = {:?} {why}; write the GPU's own node, e.g. \"/dev/nvidia{}\"",
                    key("device"),
                    g.device,
                    g.index
                )
            })?;
            if g.numa_node.is_some_and(|n| n > MAX_NUMA_NODE) {
                return Err(format!(
                    "{} = {} is not a NUMA node number; write the value of \
                     /sys/bus/pci/devices/<bus id>/numa_node, or leave it out",
                    key("numa_node"),
                    g.numa_node.unwrap_or_default()
                ));
            }
            if !devices.insert(g.device.as_path()) {
                return Err(format!(
                    "{} = {:?} is used by an earlier entry; each GPU has its own /dev/nvidiaN node",
                    key("device"),
                    g.device
                ));
            }
        }
        Ok(())
    }
}

/// A declared device path is later granted to jobs in their device allow-list,
/// so it must name one node under /dev and not a shared control node.
fn check_device_path(p: &Path) -> Result<(), &'static str> {
    let mut comps = p.components();
    if comps.next() != Some(Component::RootDir)
        || comps.next() != Some(Component::Normal("dev".as_ref()))
    {
        return Err("is not under /dev");
    }
    let rest: Vec<_> = comps.collect();
    if rest.is_empty() || !rest.iter().all(|c| matches!(c, Component::Normal(_))) {
        return Err("is not a plain path to a device node under /dev");
    }
    // `Path::components` hides "." and repeated slashes; insist on the
    // canonical spelling so the allow-list entry is exactly what the kernel
    // path lookup will see.
    let canonical: PathBuf = p.components().collect();
    if canonical.as_os_str() != p.as_os_str() {
        return Err("is not written in normal form (no `.`, `//` or trailing `/`)");
    }
    if NVIDIA_CONTROL_NODES.iter().any(|n| p == Path::new(n)) {
        return Err("is a shared NVIDIA control node, not a GPU");
    }
    Ok(())
}

/// The GPUs listed in `[[gpus.declared]]`, reported as idle and unobserved,
/// except one whose device node is missing: nothing else would notice that
/// the driver is not loaded, and a job given it would fail at its first
/// CUDA call, so it is marked unhealthy (out of the pool, shown by
/// `ptrain gpus`, logged once by the [`PoolMonitor`]).
#[derive(Clone, Debug)]
pub struct DeclaredInventory {
    gpus: Vec<DeclaredGpu>,
    /// Whether a device node is there; a parameter so tests need no /dev.
    node_exists: fn(&Path) -> bool,
}

impl DeclaredInventory {
    pub fn new(gpus: Vec<DeclaredGpu>) -> Self {
        DeclaredInventory::with_node_check(gpus, |p| p.exists())
    }

    pub fn with_node_check(mut gpus: Vec<DeclaredGpu>, node_exists: fn(&Path) -> bool) -> Self {
        gpus.sort_by_key(|g| g.index);
        DeclaredInventory { gpus, node_exists }
    }
}

/// Why a declared GPU whose node is missing is out of the pool.
pub fn missing_node_reason(device: &Path) -> String {
    format!(
        "its device node {} does not exist; load the NVIDIA driver (`nvidia-smi` creates \
         the nodes) or correct `device` in its [[gpus.declared]] entry",
        device.display()
    )
}

impl GpuInventory for DeclaredInventory {
    fn backend(&self) -> &'static str {
        "declared"
    }

    fn snapshot(&self) -> Result<Vec<GpuInfo>, GpuError> {
        Ok(self
            .gpus
            .iter()
            .map(|g| GpuInfo {
                index: g.index,
                uuid: g.uuid.clone(),
                name: g.name.clone(),
                pci_bus_id: None,
                memory_total_mib: g.memory_mib,
                memory_used_mib: None,
                utilization_pct: None,
                temperature_c: None,
                device: g.device.clone(),
                processes: Vec::new(),
                numa_node: g.numa_node,
                topology_group: None,
                unhealthy: (!(self.node_exists)(&g.device)).then(|| missing_node_reason(&g.device)),
            })
            .collect())
    }
}

/// Live inventory through NVML.
pub struct NvmlInventory {
    nvml: Nvml,
    /// GPUs never read successfully and left out of snapshots, so each
    /// problem is logged once rather than on every look.
    skipped: Mutex<BTreeSet<u32>>,
    /// The last good reading of each index: a GPU that becomes unreadable
    /// (fallen off the bus, Xid 79) is reported under its known identity,
    /// marked unhealthy, rather than silently dropped.
    last_seen: Mutex<BTreeMap<u32, GpuInfo>>,
    /// Topology groups for the set of (index, UUID) they were computed for;
    /// the PCIe tree does not change while the driver is loaded.
    topology: Mutex<Option<TopologyCache>>,
}

type TopologyCache = (Vec<(u32, String)>, BTreeMap<u32, u32>);

impl std::fmt::Debug for NvmlInventory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlInventory").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl NvmlInventory {
    /// Loads libnvidia-ml.so.1 and initialises it; fails cleanly (no panic,
    /// no abort) where there is no driver.
    pub fn init() -> Result<Self, GpuError> {
        let nvml = Nvml::init().map_err(GpuError::NvmlInit)?;
        Ok(NvmlInventory {
            nvml,
            skipped: Mutex::new(BTreeSet::new()),
            last_seen: Mutex::new(BTreeMap::new()),
            topology: Mutex::new(None),
        })
    }

    /// The driver version, for reports such as `make gpu-check`.
    pub fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    /// A GPU that cannot be read now: its last good reading marked
    /// unhealthy, or (never read) left out with one warning.
    fn unreadable(&self, index: u32, what: &str, e: &NvmlError) -> Option<GpuInfo> {
        if let Some(last) = lock(&self.last_seen).get(&index) {
            return Some(GpuInfo {
                memory_used_mib: None,
                utilization_pct: None,
                temperature_c: None,
                processes: Vec::new(),
                unhealthy: Some(format!(
                    "NVML cannot read its {what}: {e}; check `nvidia-smi` and the kernel log (Xid); \
                     a GPU that fell off the bus needs a reset or a reboot"
                )),
                ..last.clone()
            });
        }
        if lock(&self.skipped).insert(index) {
            tracing::warn!(
                gpu = index,
                "leaving GPU {index} out of the inventory: cannot read its {what} through NVML: {e}; \
                 no job will be given it until this clears (check `nvidia-smi`)"
            );
        }
        None
    }

    /// One GPU, or `None` when it was never identified. The UUID identifies
    /// it in job records and the minor number gives the device node a job
    /// is allowed to open; guessing either could hand a job someone else's
    /// GPU, so without them the GPU is not offered. Every other field is
    /// best effort.
    fn read_device(&self, index: u32) -> Option<GpuInfo> {
        let device = match self.nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => return self.unreadable(index, "handle", &e),
        };
        let uuid = match device.uuid() {
            Ok(u) => u,
            Err(e) => return self.unreadable(index, "UUID", &e),
        };
        let minor = match device.minor_number() {
            Ok(m) => m,
            Err(e) => return self.unreadable(index, "minor number", &e),
        };
        if lock(&self.skipped).remove(&index) {
            tracing::info!(gpu = index, "GPU {index} is readable through NVML again");
        }
        let memory = device.memory_info().ok();
        let pci = device.pci_info().ok();
        let info = GpuInfo {
            index,
            uuid,
            name: device.name().unwrap_or_else(|_| "unknown".to_owned()),
            pci_bus_id: pci.as_ref().map(|p| p.bus_id.clone()),
            memory_total_mib: memory.as_ref().map_or(0, |m| m.total / MIB),
            memory_used_mib: memory.map(|m| sane_used_bytes(m.total, m.used) / MIB),
            utilization_pct: device
                .utilization_rates()
                .ok()
                .and_then(|u| sane_utilization(u.gpu)),
            temperature_c: device.temperature(TemperatureSensor::Gpu).ok(),
            device: PathBuf::from(format!("/dev/nvidia{minor}")),
            processes: compute_processes(&device)
                .map(|ps| ps.into_iter().map(to_gpu_process).collect())
                .unwrap_or_default(),
            numa_node: device.numa_node_id().ok().or_else(|| {
                pci.as_ref()
                    .and_then(|p| sysfs_numa_node(p.domain, p.bus, p.device))
            }),
            topology_group: None,
            unhealthy: self.health(&device, index),
        };
        lock(&self.last_seen).insert(index, info.clone());
        Some(info)
    }

    /// Why the GPU should not take new work, from the counters NVML keeps.
    /// Each reading is optional: consumer GPUs and ECC-off boards answer
    /// NotSupported, which says nothing about health.
    fn health(&self, device: &Device<'_>, index: u32) -> Option<String> {
        let reset = format!(
            "drain it and reset it (`nvidia-smi -r -i {index}`) or reboot; it rejoins the pool once healthy"
        );
        if let Ok(n) = device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile) {
            if n > 0 {
                return Some(format!(
                    "{n} uncorrected ECC error(s) since the driver loaded (Xid 48/63/94 class); {reset}"
                ));
            }
        }
        if let Some((pending, failed)) = self.remapped_rows(device) {
            if failed {
                return Some(format!(
                    "a memory row remapping failed, the GPU needs service (RMA); {reset}"
                ));
            }
            if pending {
                return Some(format!(
                    "a memory row remapping is pending after an uncorrectable error; {reset}"
                ));
            }
        }
        if matches!(device.are_pages_pending_retired(), Ok(true)) {
            return Some(format!(
                "memory pages are pending retirement after ECC errors; {reset}"
            ));
        }
        None
    }

    /// `nvmlDeviceGetRemappedRows` (Ampere and later, where page retirement
    /// gave way to row remapping): (remapping pending, remapping failed).
    /// nvml-wrapper 0.13 loads the symbol but has no safe wrapper for it.
    fn remapped_rows(&self, device: &Device<'_>) -> Option<(bool, bool)> {
        let sym = self.nvml.lib().nvmlDeviceGetRemappedRows.as_ref().ok()?;
        let (mut corr, mut unc, mut pending, mut failure) = (0u32, 0u32, 0u32, 0u32);
        // SAFETY: the signature is nvml-wrapper-sys's binding of
        // nvmlDeviceGetRemappedRows(device, uint*, uint*, uint*, uint*); the
        // handle belongs to this live Nvml and each pointer is to a local.
        let rc = unsafe {
            (*sym)(
                device.handle(),
                &mut corr,
                &mut unc,
                &mut pending,
                &mut failure,
            )
        };
        // NVML_SUCCESS; anything else (NotSupported on older GPUs) says nothing.
        (rc == 0).then_some((pending != 0, failure != 0))
    }

    /// Fills `topology_group` from NVML's common-ancestor levels, computed
    /// once per set of GPUs.
    fn fill_topology(&self, gpus: &mut [GpuInfo]) {
        let key: Vec<(u32, String)> = gpus.iter().map(|g| (g.index, g.uuid.clone())).collect();
        let mut cache = lock(&self.topology);
        let groups = match &*cache {
            Some((k, groups)) if *k == key => groups.clone(),
            _ => {
                let groups = self.topology_groups(&key);
                *cache = Some((key, groups.clone()));
                groups
            }
        };
        for g in gpus {
            g.topology_group = groups.get(&g.index).copied();
        }
    }

    fn topology_groups(&self, gpus: &[(u32, String)]) -> BTreeMap<u32, u32> {
        let mut pairs = Vec::new();
        let mut known = false;
        for (i, (a, _)) in gpus.iter().enumerate() {
            for (b, _) in &gpus[i + 1..] {
                let level = self.nvml.device_by_index(*a).and_then(|da| {
                    let db = self.nvml.device_by_index(*b)?;
                    da.topology_common_ancestor(db)
                });
                if let Ok(level) = level {
                    known = true;
                    if matches!(
                        level,
                        TopologyLevel::Internal | TopologyLevel::Single | TopologyLevel::Multiple
                    ) {
                        pairs.push((*a, *b));
                    }
                }
            }
        }
        if !known {
            return BTreeMap::new();
        }
        group_pairs(gpus.iter().map(|(i, _)| *i), &pairs)
    }
}

/// Connected components of `pairs` over `indices`, each named by its lowest
/// index.
fn group_pairs(indices: impl Iterator<Item = u32>, pairs: &[(u32, u32)]) -> BTreeMap<u32, u32> {
    let mut group: BTreeMap<u32, u32> = indices.map(|i| (i, i)).collect();
    // Few GPUs: relabel until stable rather than keep a union-find.
    loop {
        let mut changed = false;
        for (a, b) in pairs {
            let (Some(&ga), Some(&gb)) = (group.get(a), group.get(b)) else {
                continue;
            };
            let low = ga.min(gb);
            for g in group.values_mut() {
                if (*g == ga || *g == gb) && *g != low {
                    *g = low;
                    changed = true;
                }
            }
        }
        if !changed {
            return group;
        }
    }
}

/// Memory in use as ptraind keeps it: a driver that says more is used than
/// the GPU has (a wedged or mid-upgrade driver) is taken to mean "full",
/// which keeps jobs off the GPU without showing an impossible number in
/// `ptrain gpus` and the metrics.
fn sane_used_bytes(total: u64, used: u64) -> u64 {
    used.min(total)
}

/// A utilization above 100 % is no reading at all: unknown (which
/// `idle_requires_gpu_idle` takes as no proof of work), rather than a
/// number that would keep an idle job alive and skew the metrics.
fn sane_utilization(pct: u32) -> Option<u32> {
    (pct <= 100).then_some(pct)
}

/// The kernel's view, for drivers whose NVML lacks nvmlDeviceGetNumaNodeId.
fn sysfs_numa_node(domain: u32, bus: u32, device: u32) -> Option<u32> {
    let path = format!("/sys/bus/pci/devices/{domain:04x}:{bus:02x}:{device:02x}.0/numa_node");
    // "-1" (no NUMA) fails the parse, which is what it means.
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Uses the v3 call (drivers from R510 on). Older drivers lack its symbol and
/// the v2 fallback sits behind nvml-wrapper's `legacy-functions` feature, so
/// there the list stays empty and the device's used memory stands in.
fn compute_processes(device: &Device<'_>) -> Result<Vec<ProcessInfo>, NvmlError> {
    device.running_compute_processes()
}

fn to_gpu_process(p: ProcessInfo) -> GpuProcess {
    GpuProcess {
        pid: p.pid,
        used_memory_mib: match p.used_gpu_memory {
            UsedGpuMemory::Used(bytes) => Some(bytes / MIB),
            UsedGpuMemory::Unavailable => None,
        },
    }
}

impl GpuInventory for NvmlInventory {
    fn backend(&self) -> &'static str {
        "nvml"
    }

    fn snapshot(&self) -> Result<Vec<GpuInfo>, GpuError> {
        let count = self.nvml.device_count().map_err(GpuError::Enumerate)?;
        let mut gpus: Vec<GpuInfo> = (0..count).filter_map(|i| self.read_device(i)).collect();
        self.fill_topology(&mut gpus);
        Ok(gpus)
    }
}

/// A change in which GPUs may be given to jobs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolChange {
    /// Taken out of the pool: unhealthy, or no longer in the inventory.
    Out {
        index: u32,
        uuid: String,
        reason: String,
    },
    /// Healthy and present again.
    Back { index: u32, uuid: String },
}

/// What a GPU that left the inventory is marked with.
pub const VANISHED: &str =
    "no longer in the inventory (it fell off the bus, or the driver lost it); \
     check `nvidia-smi` and the kernel log, a reset or reboot brings it back";

/// What a held GPU that NVML does not list at all is marked with.
pub const UNLISTED: &str = "it is not in the inventory, NVML cannot identify it (it fell off the bus, \
     or the driver lost it); check `nvidia-smi` and the kernel log, a reset or reboot brings it back";

/// Remembers every GPU seen (by UUID) so that one which vanishes or turns
/// unhealthy is noticed once and stays visible, marked unhealthy. Pure: the
/// caller logs the changes.
#[derive(Debug, Default)]
pub struct PoolTracker {
    known: BTreeMap<String, (GpuInfo, bool)>,
}

impl PoolTracker {
    /// Updates what is known from `snapshot` and adds to it, marked
    /// unhealthy, each GPU seen before but missing now (unless its index
    /// is taken by another GPU). Returns the changes since the last call;
    /// at the first call only unhealthy GPUs count as changes.
    pub fn observe(&mut self, snapshot: &mut Vec<GpuInfo>) -> Vec<PoolChange> {
        let mut changes = Vec::new();
        let present: BTreeSet<String> = snapshot.iter().map(|g| g.uuid.clone()).collect();
        for g in snapshot.iter() {
            let out = g.unhealthy.is_some();
            let was_out = self.known.get(&g.uuid).map(|(_, o)| *o);
            match (was_out, out) {
                (None | Some(false), true) => changes.push(PoolChange::Out {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    reason: g.unhealthy.clone().unwrap_or_default(),
                }),
                (Some(true), false) => changes.push(PoolChange::Back {
                    index: g.index,
                    uuid: g.uuid.clone(),
                }),
                _ => {}
            }
            self.known.insert(g.uuid.clone(), (g.clone(), out));
        }
        let indices: BTreeSet<u32> = snapshot.iter().map(|g| g.index).collect();
        for (uuid, (last, out)) in self.known.iter_mut() {
            if present.contains(uuid) {
                continue;
            }
            if !*out {
                *out = true;
                changes.push(PoolChange::Out {
                    index: last.index,
                    uuid: uuid.clone(),
                    reason: VANISHED.to_owned(),
                });
            }
            if !indices.contains(&last.index) {
                snapshot.push(GpuInfo {
                    memory_used_mib: None,
                    utilization_pct: None,
                    temperature_c: None,
                    processes: Vec::new(),
                    unhealthy: Some(VANISHED.to_owned()),
                    ..last.clone()
                });
            }
        }
        snapshot.sort_by_key(|g| g.index);
        changes
    }

    /// The GPU at `index` if it is out of the pool now: (UUID, why).
    pub fn out_at(&self, index: u32) -> Option<(String, String)> {
        self.known
            .iter()
            .find(|(_, (g, out))| *out && g.index == index)
            .map(|(uuid, (g, _))| {
                let why = g.unhealthy.clone().unwrap_or_else(|| VANISHED.to_owned());
                (uuid.clone(), why)
            })
    }
}

/// How many jobs' GPU warnings a [`JobWarnings`] keeps; the oldest go
/// first. Far more than the jobs one sick GPU can have run under it.
const MAX_JOB_WARNINGS: usize = 1024;

/// Job → what happened to its GPUs ("GPU 1 (UUID) left the pool while
/// this job ran on it: why"), each GPU noted once per job. Pure.
#[derive(Debug, Default)]
pub struct JobWarnings {
    /// (job, GPU index, sentence), oldest first.
    entries: std::collections::VecDeque<(String, u32, String)>,
    /// Jobs noted since the last [`JobWarnings::take_new`].
    fresh: BTreeSet<String>,
}

impl JobWarnings {
    /// Notes that GPU `index` (`uuid`) left the pool under `job` for
    /// `reason`, unless that is already noted.
    pub fn note(&mut self, job: &str, index: u32, uuid: &str, reason: &str) {
        if self.entries.iter().any(|(j, i, _)| j == job && *i == index) {
            return;
        }
        if self.entries.len() >= MAX_JOB_WARNINGS {
            self.entries.pop_front();
        }
        self.entries.push_back((
            job.to_owned(),
            index,
            format!("GPU {index} ({uuid}) left the pool while this job ran on it: {reason}"),
        ));
        self.fresh.insert(job.to_owned());
    }

    /// The jobs noted since the last call, with their warnings now.
    pub fn take_new(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut self.fresh)
            .into_iter()
            .filter_map(|job| {
                let warning = self.of(&job)?;
                Some((job, warning))
            })
            .collect()
    }

    /// The job's warnings in one sentence per GPU, or `None`.
    pub fn of(&self, job: &str) -> Option<String> {
        let lines: Vec<&str> = self
            .entries
            .iter()
            .filter(|(j, _, _)| j == job)
            .map(|(_, _, s)| s.as_str())
            .collect();
        (!lines.is_empty()).then(|| {
            format!(
                "{}. It may fail or hang: check its output, and `ptrain stop {job}` if it no \
                 longer makes progress",
                lines.join(". ")
            )
        })
    }
}

/// An inventory whose snapshots go through a [`PoolTracker`]; each change
/// is logged once, whoever asked for the snapshot.
pub struct PoolMonitor {
    inner: Box<dyn GpuInventory>,
    tracker: Mutex<PoolTracker>,
    /// GPU index → the job holding it, so a GPU leaving the pool under a
    /// running job says which job may fail.
    holders: Mutex<BTreeMap<u32, String>>,
    /// What the jobs' `ptrain status` says about their GPUs. In memory
    /// only: after a restart, a GPU still out under a job it is given
    /// again (see `set_holders`) is noted again; one that came back, or
    /// went from the inventory, before the restart is not.
    warnings: Mutex<JobWarnings>,
    health: Mutex<HealthSeen>,
}

/// Each GPU's health at the last look, and that look when it differs
/// from the one last taken ([`GpuInventory::take_health`]).
#[derive(Default)]
struct HealthSeen {
    taken: Option<Vec<(String, bool)>>,
    pending: Option<Vec<GpuInfo>>,
}

impl PoolMonitor {
    pub fn new(inner: Box<dyn GpuInventory>) -> PoolMonitor {
        PoolMonitor {
            inner,
            tracker: Mutex::new(PoolTracker::default()),
            holders: Mutex::new(BTreeMap::new()),
            warnings: Mutex::new(JobWarnings::default()),
            health: Mutex::new(HealthSeen::default()),
        }
    }
}

impl GpuInventory for PoolMonitor {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn set_holders(&self, holders: BTreeMap<u32, String>) {
        // A job given (back, after a restart) a GPU that is out already
        // hears of it too: the tracker noticed it before the job was known.
        for (index, job) in &holders {
            let out = lock(&self.tracker).out_at(*index);
            if let Some((uuid, reason)) = out {
                lock(&self.warnings).note(job, *index, &uuid, &reason);
            }
        }
        *lock(&self.holders) = holders;
    }

    fn job_warning(&self, job: &str) -> Option<String> {
        lock(&self.warnings).of(job)
    }

    fn take_new_warnings(&self) -> Vec<(String, String)> {
        lock(&self.warnings).take_new()
    }

    fn take_health(&self) -> Option<Vec<GpuInfo>> {
        let mut seen = lock(&self.health);
        let snapshot = seen.pending.take()?;
        seen.taken = Some(health_of(&snapshot));
        Some(snapshot)
    }

    fn snapshot(&self) -> Result<Vec<GpuInfo>, GpuError> {
        let mut snapshot = self.inner.snapshot()?;
        let changes = lock(&self.tracker).observe(&mut snapshot);
        for change in changes {
            match change {
                PoolChange::Out {
                    index,
                    uuid,
                    reason,
                } => match lock(&self.holders).get(&index) {
                    // Tagged with the job, so its owner finds it with the
                    // job's own journal entries, and kept for its status.
                    Some(job) => {
                        lock(&self.warnings).note(job, index, &uuid, &reason);
                        tracing::warn!(
                        gpu = index,
                        uuid,
                        job = %job,
                        PTRAIN_JOB = %job,
                        "GPU {index} ({uuid}) taken out of the pool, no job will be placed on it: {reason}; \
                         job {job} is running on it and may fail or hang: check its output, and \
                         `ptrain stop {job}` if it no longer makes progress"
                        )
                    }
                    None => tracing::warn!(
                        gpu = index,
                        uuid,
                        "GPU {index} ({uuid}) taken out of the pool, no job will be placed on it: {reason}"
                    ),
                },
                PoolChange::Back { index, uuid } => tracing::info!(
                    gpu = index,
                    uuid,
                    "GPU {index} ({uuid}) is healthy again and back in the pool"
                ),
            }
        }
        // A GPU a job holds that is not listed at all was unreadable
        // before ptraind ever knew it (lost across a restart of ptraind),
        // so the tracker could not keep it: its job hears of it all the
        // same.
        let holders = lock(&self.holders).clone();
        for (index, job) in holders {
            if !snapshot.iter().any(|g| g.index == index) {
                lock(&self.warnings).note(&job, index, "UUID unreadable", UNLISTED);
            }
        }
        let mut seen = lock(&self.health);
        // The newest look only: one back where the last taken left off
        // clears an older one not yet taken, which is no longer true.
        seen.pending =
            (seen.taken.as_ref() != Some(&health_of(&snapshot))).then(|| snapshot.clone());
        drop(seen);
        Ok(snapshot)
    }
}

/// Each GPU's UUID and whether it is out of the pool.
fn health_of(snapshot: &[GpuInfo]) -> Vec<(String, bool)> {
    snapshot
        .iter()
        .map(|g| (g.uuid.clone(), g.unhealthy.is_some()))
        .collect()
}

/// Builds the inventory `cfg` asks for. `auto` tries NVML and falls back to
/// the declared list (possibly empty: a CPU-only machine) with one warning.
/// `cfg` is a loaded [`crate::config::Config`]'s, which
/// [`GpuConfig::validate`] checked once, when it loaded.
pub fn open_inventory(cfg: &GpuConfig) -> Result<Box<dyn GpuInventory>, GpuError> {
    let declared =
        || -> Box<dyn GpuInventory> { Box::new(DeclaredInventory::new(cfg.declared.clone())) };
    let inner: Box<dyn GpuInventory> = match cfg.backend {
        GpuBackend::Declared => declared(),
        GpuBackend::Nvml => Box::new(NvmlInventory::init()?),
        GpuBackend::Auto => match NvmlInventory::init() {
            Ok(inv) => Box::new(inv),
            Err(e) => {
                tracing::warn!(
                    "GPU inventory: NVML is not available ({e}); using the {} GPU(s) declared in [gpus], \
                     whose use by other programs cannot be seen",
                    cfg.declared.len()
                );
                declared()
            }
        },
    };
    Ok(Box::new(PoolMonitor::new(inner)))
}

/// Memory (MiB) that programs other than ptrain jobs use on a GPU no ptrain
/// job holds. Every process on such a GPU is foreign. The process list is
/// preferred (it excludes driver overhead); when it is empty or incomplete,
/// the device's used memory stands in. When nothing at all is known (declared
/// GPUs) the GPU counts as free, and when processes are present but
/// unmeasurable it counts as busy.
pub fn foreign_usage_mib(gpu: &GpuInfo) -> u64 {
    let measured: Option<u64> = gpu
        .processes
        .iter()
        .try_fold(0u64, |sum, p| Some(sum.saturating_add(p.used_memory_mib?)));
    match (gpu.processes.is_empty(), measured, gpu.memory_used_mib) {
        (false, Some(sum), _) => sum,
        (_, _, Some(used)) => used,
        (true, _, None) => 0,
        (false, None, None) => u64::MAX,
    }
}

/// Memory a job given this (unheld) GPU now would find free.
pub fn free_memory_mib(gpu: &GpuInfo) -> u64 {
    gpu.memory_total_mib
        .saturating_sub(gpu.memory_used_mib.unwrap_or(0))
}

/// Whether a GPU no ptrain job holds can be given to a job now: healthy
/// and not used by other programs beyond the threshold.
pub fn is_usable(gpu: &GpuInfo, foreign_memory_threshold_mib: u64) -> bool {
    gpu.unhealthy.is_none() && foreign_usage_mib(gpu) < foreign_memory_threshold_mib
}

/// Picks `n` of `candidates` (all acceptable), preferring GPUs close to
/// each other: first one PCIe switch group, else one NUMA node, else as few
/// nodes and groups as possible. Among groups that fit, the smallest is
/// used (best fit), which keeps larger groups whole for larger jobs. Ties
/// go to the lowest index; without topology information this is simply the
/// `n` lowest indices. `None` if there are fewer than `n`.
pub fn pick_near(candidates: &[&GpuInfo], n: usize) -> Option<Vec<u32>> {
    let mut cands: Vec<&GpuInfo> = candidates.to_vec();
    cands.sort_by_key(|g| g.index);
    cands.dedup_by_key(|g| g.index);
    if cands.len() < n {
        return None;
    }
    if n == 0 {
        return Some(Vec::new());
    }
    // NUMA node → switch group → indices, all in index order.
    let mut nodes: BTreeMap<Option<u32>, BTreeMap<Option<u32>, Vec<u32>>> = BTreeMap::new();
    for g in &cands {
        nodes
            .entry(g.numa_node)
            .or_default()
            .entry(g.topology_group)
            .or_default()
            .push(g.index);
    }
    let fit = |len: usize, first: u32| (len, first);
    // One switch group.
    let best_group = nodes
        .values()
        .flat_map(|groups| groups.values())
        .filter(|v| v.len() >= n)
        .min_by_key(|v| fit(v.len(), v[0]));
    if let Some(v) = best_group {
        return Some(v[..n].to_vec());
    }
    // Whole groups, largest first, so the job spans as few as possible.
    let take = |groups: Vec<&Vec<u32>>| {
        let mut groups = groups;
        groups.sort_by_key(|v| (std::cmp::Reverse(v.len()), v[0]));
        let mut out: Vec<u32> = groups.into_iter().flatten().copied().take(n).collect();
        out.sort_unstable();
        out
    };
    let size =
        |groups: &BTreeMap<Option<u32>, Vec<u32>>| groups.values().map(Vec::len).sum::<usize>();
    let first = |groups: &BTreeMap<Option<u32>, Vec<u32>>| {
        groups.values().map(|v| v[0]).min().unwrap_or(u32::MAX)
    };
    // One NUMA node.
    let best_node = nodes
        .values()
        .filter(|groups| size(groups) >= n)
        .min_by_key(|groups| fit(size(groups), first(groups)));
    if let Some(groups) = best_node {
        return Some(take(groups.values().collect()));
    }
    // Across nodes: the fullest nodes first, each contributing its groups.
    let mut ordered: Vec<&BTreeMap<Option<u32>, Vec<u32>>> = nodes.values().collect();
    ordered.sort_by_key(|groups| (std::cmp::Reverse(size(groups)), first(groups)));
    let mut out = Vec::with_capacity(n);
    for groups in ordered {
        let want = n - out.len();
        let mut part = take(groups.values().collect());
        part.truncate(want);
        out.extend(part);
        if out.len() == n {
            break;
        }
    }
    out.sort_unstable();
    Some(out)
}

/// Picks `count` GPUs from `snapshot` that no ptrain job holds (`held`),
/// that are healthy and whose foreign memory use is below
/// `foreign_memory_threshold_mib`, close together (see [`pick_near`]).
/// `None` if there are not enough; `count == 0` gives `Some(vec![])`. The
/// scheduler adds requests, priorities, reservations and policy on top.
pub fn choose_gpus(
    snapshot: &[GpuInfo],
    held: &BTreeSet<u32>,
    count: u32,
    foreign_memory_threshold_mib: u64,
) -> Option<Vec<u32>> {
    let free: Vec<&GpuInfo> = snapshot
        .iter()
        .filter(|g| !held.contains(&g.index))
        .filter(|g| is_usable(g, foreign_memory_threshold_mib))
        .collect();
    pick_near(&free, usize::try_from(count).ok()?)
}

/// What `ptrain gpus` says about a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuState {
    Free,
    /// A ptrain job holds it.
    Held(String),
    /// Free, but kept for a waiting job that needs more GPUs than are free.
    Reserved(String),
    /// Other programs use this much of its memory (MiB), at or above the
    /// threshold.
    BusyForeign(u64),
    Unhealthy(String),
}

impl GpuState {
    /// Unhealthy first (it needs an admin), then held, busy, reserved.
    pub fn of(
        gpu: &GpuInfo,
        held_by: Option<&str>,
        reserved_for: Option<&str>,
        foreign_memory_threshold_mib: u64,
    ) -> GpuState {
        if let Some(why) = &gpu.unhealthy {
            return GpuState::Unhealthy(why.clone());
        }
        if let Some(job) = held_by {
            return GpuState::Held(job.to_owned());
        }
        let foreign = foreign_usage_mib(gpu);
        if foreign >= foreign_memory_threshold_mib {
            return GpuState::BusyForeign(foreign);
        }
        match reserved_for {
            Some(job) => GpuState::Reserved(job.to_owned()),
            None => GpuState::Free,
        }
    }

    /// One word: `free`, `held`, `reserved`, `busy-foreign`, `unhealthy`.
    pub fn name(&self) -> &'static str {
        match self {
            GpuState::Free => "free",
            GpuState::Held(_) => "held",
            GpuState::Reserved(_) => "reserved",
            GpuState::BusyForeign(_) => "busy-foreign",
            GpuState::Unhealthy(_) => "unhealthy",
        }
    }

    /// For people: "held by job X", "used by other programs (2048 MiB)"...
    pub fn describe(&self) -> String {
        match self {
            GpuState::Free => "free".to_owned(),
            GpuState::Held(job) => format!("held by job {job}"),
            GpuState::Reserved(job) => format!("reserved for job {job}"),
            GpuState::BusyForeign(u64::MAX) => "used by other programs (amount unknown)".to_owned(),
            GpuState::BusyForeign(mib) => format!("used by other programs ({mib} MiB)"),
            GpuState::Unhealthy(why) => format!("unhealthy: {why}"),
        }
    }
}

/// The device nodes a job holding `gpus` may open: the shared NVIDIA control
/// nodes and each allocated GPU's own node. An index missing from `snapshot`
/// adds nothing: the job is denied that GPU rather than given a guessed node.
pub fn allowed_device_nodes(snapshot: &[GpuInfo], gpus: &[u32]) -> Vec<PathBuf> {
    let mut nodes: Vec<PathBuf> = NVIDIA_CONTROL_NODES.iter().map(PathBuf::from).collect();
    for index in gpus {
        if let Some(g) = snapshot.iter().find(|g| g.index == *index) {
            if !nodes.contains(&g.device) {
                nodes.push(g.device.clone());
            }
        }
    }
    nodes
}

#[cfg(test)]
pub(crate) mod test_kit {
    use super::GpuInfo;

    /// A healthy, idle GPU: `GPU-index`, 1,000 MiB, `/dev/nvidiaN`, no
    /// topology known (change the fields a test is about).
    pub(crate) fn gpu(index: u32) -> GpuInfo {
        GpuInfo {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA H100 80GB HBM3".into(),
            pci_bus_id: None,
            memory_total_mib: 1000,
            memory_used_mib: Some(0),
            utilization_pct: None,
            temperature_c: None,
            device: format!("/dev/nvidia{index}").into(),
            processes: vec![],
            numa_node: None,
            topology_group: None,
            unhealthy: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32) -> GpuInfo {
        GpuInfo {
            index,
            uuid: format!("GPU-{index:04}"),
            name: "Test GPU".into(),
            pci_bus_id: None,
            memory_total_mib: 81_920,
            memory_used_mib: Some(0),
            utilization_pct: Some(0),
            temperature_c: Some(30),
            device: PathBuf::from(format!("/dev/nvidia{index}")),
            processes: vec![],
            numa_node: None,
            topology_group: None,
            unhealthy: None,
        }
    }

    /// A GPU on NUMA node `numa` behind PCIe switch group `group`.
    fn at(index: u32, numa: u32, group: u32) -> GpuInfo {
        GpuInfo {
            numa_node: Some(numa),
            topology_group: Some(group),
            ..gpu(index)
        }
    }

    fn procs(mut g: GpuInfo, mem: &[Option<u64>]) -> GpuInfo {
        g.processes = mem
            .iter()
            .enumerate()
            .map(|(i, m)| GpuProcess {
                pid: 1000 + i as u32,
                used_memory_mib: *m,
            })
            .collect();
        g
    }

    fn declared(index: u32) -> DeclaredGpu {
        DeclaredGpu {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA H100".into(),
            memory_mib: 81_559,
            device: PathBuf::from(format!("/dev/nvidia{index}")),
            numa_node: None,
        }
    }

    fn held(v: &[u32]) -> BTreeSet<u32> {
        v.iter().copied().collect()
    }

    #[test]
    fn config_defaults_from_empty_table() {
        let cfg: GpuConfig = toml::from_str("").unwrap();
        assert_eq!(cfg, GpuConfig::default());
        assert_eq!(cfg.backend, GpuBackend::Auto);
        assert_eq!(cfg.foreign_memory_threshold_mib, 512);
        assert!(cfg.declared.is_empty());
        cfg.validate().unwrap();
    }

    #[test]
    fn config_parses_declared_list() {
        let cfg: GpuConfig = toml::from_str(
            r#"
            backend = "declared"
            foreign_memory_threshold_mib = 1024
            [[declared]]
            index = 0
            uuid = "GPU-a"
            name = "NVIDIA A100"
            memory_mib = 40960
            device = "/dev/nvidia0"
            [[declared]]
            index = 1
            uuid = "GPU-b"
            name = "NVIDIA A100"
            memory_mib = 40960
            device = "/dev/nvidia1"
            "#,
        )
        .unwrap();
        assert_eq!(cfg.backend, GpuBackend::Declared);
        assert_eq!(cfg.foreign_memory_threshold_mib, 1024);
        assert_eq!(cfg.declared.len(), 2);
        cfg.validate().unwrap();
    }

    #[test]
    fn config_rejects_unknown_keys_and_backends() {
        assert!(toml::from_str::<GpuConfig>("backend = \"cuda\"").is_err());
        assert!(toml::from_str::<GpuConfig>("foreign_memory_threshold = 5").is_err());
        let e = toml::from_str::<GpuConfig>(
            "[[declared]]\nindex = 0\nuuid = \"a\"\nname = \"x\"\nmemory_mib = 1\ndevice = \"/dev/nvidia0\"\nminor = 0\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("minor"), "{e}");
        // A declared entry must be complete.
        assert!(toml::from_str::<GpuConfig>("[[declared]]\nindex = 0\n").is_err());
    }

    #[test]
    fn validate_messages_name_the_key() {
        let check = |cfg: GpuConfig, needles: &[&str]| {
            let msg = cfg.validate().unwrap_err();
            for n in needles {
                assert!(msg.message.contains(n), "{msg:?} should contain {n:?}");
            }
        };
        let with = |gs: Vec<DeclaredGpu>| GpuConfig {
            declared: gs,
            ..GpuConfig::default()
        };

        check(
            with(vec![declared(0), declared(0)]),
            &["`gpus.declared[1].index`"],
        );

        let mut b = declared(1);
        b.uuid = "GPU-0".into();
        check(
            with(vec![declared(0), b]),
            &["`gpus.declared[1].uuid`", "nvidia-smi -L"],
        );

        let mut b = declared(1);
        b.uuid = String::new();
        check(with(vec![declared(0), b]), &["`gpus.declared[1].uuid`"]);
        let mut b = declared(1);
        b.uuid = "GPU 1".into();
        check(with(vec![b]), &["`gpus.declared[0].uuid`"]);

        let mut b = declared(0);
        b.name = " ".into();
        check(with(vec![b]), &["`gpus.declared[0].name`"]);

        let mut b = declared(0);
        b.memory_mib = 0;
        check(with(vec![b]), &["`gpus.declared[0].memory_mib`"]);

        for bad in [
            "/tmp/nvidia0",
            "nvidia0",
            "/dev",
            "/dev/",
            "/dev/../etc/shadow",
            "/dev/./nvidia0",
            "/dev//nvidia0",
            "/dev/nvidia0/",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "",
        ] {
            let mut b = declared(0);
            b.device = PathBuf::from(bad);
            check(
                with(vec![b]),
                &["`gpus.declared[0].device`", "/dev/nvidia0"],
            );
        }

        let mut b = declared(1);
        b.device = PathBuf::from("/dev/nvidia0");
        check(with(vec![declared(0), b]), &["`gpus.declared[1].device`"]);

        check(
            GpuConfig {
                foreign_memory_threshold_mib: 0,
                ..GpuConfig::default()
            },
            &["`gpus.foreign_memory_threshold_mib`"],
        );

        // Nested device paths such as /dev/dri/... style layouts are fine.
        let mut b = declared(0);
        b.device = PathBuf::from("/dev/gpus/nvidia0");
        with(vec![b]).validate().unwrap();
    }

    #[test]
    fn declared_inventory_snapshot() {
        let inv = DeclaredInventory::with_node_check(vec![declared(3), declared(1)], |_| true);
        assert_eq!(inv.backend(), "declared");
        let snap = inv.snapshot().unwrap();
        assert_eq!(snap.iter().map(|g| g.index).collect::<Vec<_>>(), [1, 3]);
        let g = &snap[0];
        assert_eq!(g.uuid, "GPU-1");
        assert_eq!(g.name, "NVIDIA H100");
        assert_eq!(g.memory_total_mib, 81_559);
        assert_eq!(g.memory_used_mib, None);
        assert_eq!(g.device, PathBuf::from("/dev/nvidia1"));
        assert!(g.processes.is_empty());
        // Declared GPUs are unobserved, hence allocatable.
        assert_eq!(choose_gpus(&snap, &held(&[]), 2, 512), Some(vec![1, 3]));
    }

    #[test]
    fn declared_gpu_without_its_device_node_is_unhealthy_and_not_chosen() {
        let inv = DeclaredInventory::with_node_check(vec![declared(0), declared(1)], |p| {
            p != Path::new("/dev/nvidia1")
        });
        let snap = inv.snapshot().unwrap();
        assert_eq!(snap[0].unhealthy, None);
        let why = snap[1].unhealthy.as_deref().unwrap();
        assert!(
            why.contains("/dev/nvidia1") && why.contains("does not exist"),
            "{why}"
        );
        assert_eq!(choose_gpus(&snap, &held(&[]), 1, 512), Some(vec![0]));
        assert_eq!(choose_gpus(&snap, &held(&[]), 2, 512), None);
        assert_eq!(GpuState::of(&snap[1], None, None, 512).name(), "unhealthy");
        // With the real check: /dev/null is there, a made-up node is not.
        let mut present = declared(0);
        present.device = PathBuf::from("/dev/null");
        let mut absent = declared(1);
        absent.device = PathBuf::from("/dev/ptrain-test-no-such-node");
        let snap = DeclaredInventory::new(vec![present, absent])
            .snapshot()
            .unwrap();
        assert!(snap[0].unhealthy.is_none() && snap[1].unhealthy.is_some());
    }

    #[test]
    fn open_declared_backend() {
        let cfg = GpuConfig {
            backend: GpuBackend::Declared,
            declared: vec![declared(0)],
            ..GpuConfig::default()
        };
        let inv = open_inventory(&cfg).unwrap();
        assert_eq!(inv.backend(), "declared");
        assert_eq!(inv.snapshot().unwrap().len(), 1);
    }

    #[test]
    fn an_invalid_gpus_section_is_refused_when_the_config_loads() {
        let text = "[gpus]\nbackend = \"declared\"\n\
                    [[gpus.declared]]\nindex = 0\nuuid = \"GPU-a\"\nname = \"A100\"\nmemory_mib = 1\ndevice = \"/dev/nvidia0\"\n\
                    [[gpus.declared]]\nindex = 0\nuuid = \"GPU-b\"\nname = \"A100\"\nmemory_mib = 1\ndevice = \"/dev/nvidia1\"\n";
        let e = crate::config::Config::from_toml(Path::new("/etc/ptrain/ptrain.toml"), text)
            .err()
            .unwrap();
        assert!(e.to_string().contains("gpus.declared[1].index"), "{e}");
    }

    #[test]
    fn auto_falls_back_to_declared_without_driver() {
        let cfg = GpuConfig {
            declared: vec![declared(0), declared(1)],
            ..GpuConfig::default()
        };
        let inv = open_inventory(&cfg).unwrap();
        match Nvml::init() {
            // No driver here: init failed cleanly and auto fell back.
            Err(_) => {
                assert_eq!(inv.backend(), "declared");
                assert_eq!(inv.snapshot().unwrap().len(), 2);
            }
            // On a GPU machine the live inventory is used instead.
            Ok(_) => {
                assert_eq!(inv.backend(), "nvml");
                inv.snapshot().unwrap();
            }
        }
    }

    #[test]
    fn nvml_backend_errors_cleanly_without_driver() {
        let cfg = GpuConfig {
            backend: GpuBackend::Nvml,
            ..GpuConfig::default()
        };
        match open_inventory(&cfg) {
            Ok(inv) => assert_eq!(inv.backend(), "nvml"),
            Err(e) => {
                assert!(matches!(e, GpuError::NvmlInit(_)), "{e}");
                let msg = e.to_string();
                assert!(msg.contains("NVML") && msg.contains("declared"), "{msg}");
            }
        }
    }

    #[test]
    fn nvml_snapshot_when_available() {
        // Only meaningful on a machine with the driver; a no-op elsewhere.
        let Ok(inv) = NvmlInventory::init() else {
            return;
        };
        let snap = inv.snapshot().unwrap();
        for g in &snap {
            assert!(!g.uuid.is_empty());
            assert!(g.device.starts_with("/dev"));
            assert!(g.device.to_string_lossy().starts_with("/dev/nvidia"));
            assert!(g.memory_total_mib > 0);
        }
        let indices: Vec<u32> = snap.iter().map(|g| g.index).collect();
        let mut sorted = indices.clone();
        sorted.sort_unstable();
        assert_eq!(indices, sorted);
    }

    #[test]
    fn choose_lowest_free_first() {
        let snap = vec![gpu(2), gpu(0), gpu(3), gpu(1)];
        assert_eq!(choose_gpus(&snap, &held(&[]), 2, 512), Some(vec![0, 1]));
        assert_eq!(
            choose_gpus(&snap, &held(&[]), 4, 512),
            Some(vec![0, 1, 2, 3])
        );
    }

    #[test]
    fn choose_excludes_held() {
        let snap = vec![gpu(0), gpu(1), gpu(2), gpu(3)];
        assert_eq!(choose_gpus(&snap, &held(&[0, 2]), 2, 512), Some(vec![1, 3]));
        assert_eq!(choose_gpus(&snap, &held(&[0, 2]), 3, 512), None);
        assert_eq!(choose_gpus(&snap, &held(&[0, 1, 2, 3]), 1, 512), None);
        // Held indices that are not in the snapshot change nothing.
        assert_eq!(
            choose_gpus(&snap, &held(&[9]), 4, 512),
            Some(vec![0, 1, 2, 3])
        );
    }

    #[test]
    fn choose_count_zero() {
        assert_eq!(choose_gpus(&[], &held(&[]), 0, 512), Some(vec![]));
        let snap = vec![gpu(0)];
        assert_eq!(choose_gpus(&snap, &held(&[0]), 0, 512), Some(vec![]));
    }

    #[test]
    fn choose_not_enough() {
        assert_eq!(choose_gpus(&[], &held(&[]), 1, 512), None);
        let snap = vec![gpu(0), gpu(1)];
        assert_eq!(choose_gpus(&snap, &held(&[]), 3, 512), None);
        assert_eq!(choose_gpus(&snap, &held(&[]), u32::MAX, 512), None);
        // A repeated index is one GPU, not two.
        let dup = vec![gpu(0), gpu(0)];
        assert_eq!(choose_gpus(&dup, &held(&[]), 2, 512), None);
    }

    #[test]
    fn choose_foreign_process_threshold() {
        // Process list known: its sum is the foreign use, not memory_used.
        let mut below = procs(gpu(0), &[Some(300), Some(211)]);
        below.memory_used_mib = Some(40_000);
        let at = procs(gpu(1), &[Some(512)]);
        let above = procs(gpu(2), &[Some(10_000)]);
        let snap = vec![below, at, above, gpu(3)];
        assert_eq!(choose_gpus(&snap, &held(&[]), 2, 512), Some(vec![0, 3]));
        assert_eq!(choose_gpus(&snap, &held(&[]), 3, 512), None);
        assert_eq!(choose_gpus(&snap, &held(&[]), 3, 513), Some(vec![0, 1, 3]));
        assert_eq!(
            choose_gpus(&snap, &held(&[]), 4, 20_000),
            Some(vec![0, 1, 2, 3])
        );
    }

    #[test]
    fn choose_falls_back_to_memory_used() {
        // No process list: the device's used memory decides.
        let mut busy = gpu(0);
        busy.memory_used_mib = Some(30_000);
        let mut idle = gpu(1);
        idle.memory_used_mib = Some(5);
        // A process of unknown size: used memory decides.
        let mut unknown_small = procs(gpu(2), &[Some(10), None]);
        unknown_small.memory_used_mib = Some(100);
        let mut unknown_big = procs(gpu(3), &[None]);
        unknown_big.memory_used_mib = Some(9_000);
        // Processes of unknown size and no used memory: assume busy.
        let mut blind = procs(gpu(4), &[None]);
        blind.memory_used_mib = None;
        // Nothing known at all (declared backend): free.
        let mut unobserved = gpu(5);
        unobserved.memory_used_mib = None;
        let snap = vec![busy, idle, unknown_small, unknown_big, blind, unobserved];
        assert_eq!(choose_gpus(&snap, &held(&[]), 3, 512), Some(vec![1, 2, 5]));
        assert_eq!(choose_gpus(&snap, &held(&[]), 4, 512), None);
        assert_eq!(
            choose_gpus(&snap, &held(&[]), 5, u64::MAX),
            Some(vec![0, 1, 2, 3, 5])
        );
    }

    #[test]
    fn held_gpu_with_own_processes_is_not_rechosen() {
        // The job's own processes on a held GPU never make it look free.
        let snap = vec![procs(gpu(0), &[Some(70_000)]), gpu(1)];
        assert_eq!(choose_gpus(&snap, &held(&[0]), 1, 512), Some(vec![1]));
    }

    #[test]
    fn device_nodes() {
        let mut g7 = gpu(1);
        g7.device = PathBuf::from("/dev/nvidia7");
        let snap = vec![gpu(0), g7, gpu(2)];
        let nodes = allowed_device_nodes(&snap, &[2, 1]);
        let want: Vec<PathBuf> = [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-modeset",
            "/dev/nvidia2",
            "/dev/nvidia7",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(nodes, want);

        // No GPUs: control nodes only. Unknown index: not guessed.
        assert_eq!(allowed_device_nodes(&snap, &[]), want[..4]);
        assert_eq!(allowed_device_nodes(&snap, &[9]), want[..4]);
        // Repeats collapse.
        assert_eq!(allowed_device_nodes(&snap, &[2, 2]).len(), 5);
    }

    #[test]
    fn gpu_info_serde_round_trip() {
        let g = procs(gpu(0), &[Some(1), None]);
        let back: GpuInfo = serde_json::from_str(&serde_json::to_string(&g).unwrap()).unwrap();
        assert_eq!(back, g);
    }

    #[test]
    fn inventory_is_object_safe_and_shareable() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<NvmlInventory>();
        assert_send_sync::<DeclaredInventory>();
        assert_send_sync::<Box<dyn GpuInventory>>();
        assert_send_sync::<PoolMonitor>();
    }

    #[test]
    fn declared_numa_node() {
        let cfg: GpuConfig = toml::from_str(
            "[[declared]]\nindex = 0\nuuid = \"a\"\nname = \"x\"\nmemory_mib = 1\ndevice = \"/dev/nvidia0\"\nnuma_node = 1\n",
        )
        .unwrap();
        cfg.validate().unwrap();
        let snap = DeclaredInventory::new(cfg.declared).snapshot().unwrap();
        assert_eq!(snap[0].numa_node, Some(1));
        let mut g = declared(0);
        g.numa_node = Some(5000);
        let msg = GpuConfig {
            declared: vec![g],
            ..GpuConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(
            msg.message.contains("`gpus.declared[0].numa_node`"),
            "{msg}"
        );
    }

    #[test]
    fn unhealthy_gpus_are_not_chosen() {
        let mut sick = gpu(0);
        sick.unhealthy = Some("2 uncorrected ECC errors".into());
        let snap = vec![sick, gpu(1)];
        assert_eq!(choose_gpus(&snap, &held(&[]), 1, 512), Some(vec![1]));
        assert_eq!(choose_gpus(&snap, &held(&[]), 2, 512), None);
        assert!(!is_usable(&snap[0], 512) && is_usable(&snap[1], 512));
    }

    #[test]
    fn pick_near_prefers_one_switch_then_one_node() {
        // Node 0: switch 0 = {0,1}, switch 2 = {2,3}; node 1: switch 4 = {4,5,6,7}.
        let all: Vec<GpuInfo> = (0..8)
            .map(|i| {
                at(
                    i,
                    u32::from(i >= 4),
                    if i < 2 {
                        0
                    } else if i < 4 {
                        2
                    } else {
                        4
                    },
                )
            })
            .collect();
        let refs = |idx: &[u32]| -> Vec<&GpuInfo> {
            all.iter().filter(|g| idx.contains(&g.index)).collect()
        };
        // Two GPUs: a pair on one switch, not 0 and 2 (lowest indices).
        assert_eq!(pick_near(&refs(&[0, 2, 3, 5]), 2), Some(vec![2, 3]));
        // Best fit: the 2-GPU switch rather than breaking up the 4-GPU one.
        assert_eq!(pick_near(&refs(&[2, 3, 4, 5, 6, 7]), 2), Some(vec![2, 3]));
        assert_eq!(pick_near(&refs(&[1, 4, 5, 6, 7]), 1), Some(vec![1]));
        // Four: the whole switch group on node 1.
        assert_eq!(
            pick_near(&refs(&[0, 1, 2, 4, 5, 6, 7]), 4),
            Some(vec![4, 5, 6, 7])
        );
        // Three with no switch holding three: stay on one NUMA node.
        assert_eq!(pick_near(&refs(&[0, 1, 2, 4, 5]), 3), Some(vec![0, 1, 2]));
        // Five: must cross nodes; the fuller node first, whole.
        assert_eq!(
            pick_near(&refs(&[0, 2, 4, 5, 6, 7]), 5),
            Some(vec![0, 4, 5, 6, 7])
        );
        assert_eq!(pick_near(&refs(&[0, 1]), 3), None);
        assert_eq!(pick_near(&refs(&[0, 1]), 0), Some(vec![]));
    }

    #[test]
    fn pick_near_without_topology_is_lowest_first() {
        let snap = [gpu(3), gpu(1), gpu(2), gpu(0)];
        let refs: Vec<&GpuInfo> = snap.iter().collect();
        assert_eq!(pick_near(&refs, 2), Some(vec![0, 1]));
        // Declared NUMA nodes alone also keep jobs together.
        let numa: Vec<GpuInfo> = (0..4)
            .map(|i| GpuInfo {
                numa_node: Some(i % 2),
                ..gpu(i)
            })
            .collect();
        let refs: Vec<&GpuInfo> = numa.iter().collect();
        assert_eq!(pick_near(&refs, 2), Some(vec![0, 2]));
    }

    #[test]
    fn topology_groups_from_pairs() {
        let g = group_pairs([0, 1, 2, 3, 4].into_iter(), &[(3, 4), (1, 2), (2, 3)]);
        assert_eq!(
            g.into_iter().collect::<Vec<_>>(),
            [(0, 0), (1, 1), (2, 1), (3, 1), (4, 1)]
        );
        let g = group_pairs([0, 1].into_iter(), &[]);
        assert_eq!(g.into_iter().collect::<Vec<_>>(), [(0, 0), (1, 1)]);
    }

    #[test]
    fn tracker_takes_unhealthy_and_vanished_gpus_out_once() {
        let mut t = PoolTracker::default();
        let mut snap = vec![gpu(0), gpu(1), gpu(2)];
        assert!(t.observe(&mut snap).is_empty(), "healthy GPUs are no news");
        assert_eq!(snap.len(), 3);

        // GPU 1 reports ECC errors: out, once.
        let mut sick = gpu(1);
        sick.unhealthy = Some("3 uncorrected ECC error(s)".into());
        for round in 0..2 {
            let mut snap = vec![gpu(0), sick.clone(), gpu(2)];
            let changes = t.observe(&mut snap);
            if round == 0 {
                assert_eq!(
                    changes,
                    [PoolChange::Out {
                        index: 1,
                        uuid: "GPU-0001".into(),
                        reason: "3 uncorrected ECC error(s)".into()
                    }]
                );
            } else {
                assert!(changes.is_empty(), "{changes:?}");
            }
        }

        // GPU 2 vanishes: out once, and still listed, marked unhealthy.
        for round in 0..2 {
            let mut snap = vec![gpu(0), sick.clone()];
            let changes = t.observe(&mut snap);
            assert_eq!(changes.len(), usize::from(round == 0), "{changes:?}");
            assert_eq!(snap.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 1, 2]);
            assert_eq!(snap[2].uuid, "GPU-0002");
            assert_eq!(snap[2].unhealthy.as_deref(), Some(VANISHED));
            assert_eq!(choose_gpus(&snap, &held(&[]), 1, 512), Some(vec![0]));
            assert_eq!(choose_gpus(&snap, &held(&[]), 2, 512), None);
        }

        // Both come back.
        let mut snap = vec![gpu(0), gpu(1), gpu(2)];
        let changes = t.observe(&mut snap);
        assert_eq!(
            changes,
            [
                PoolChange::Back {
                    index: 1,
                    uuid: "GPU-0001".into()
                },
                PoolChange::Back {
                    index: 2,
                    uuid: "GPU-0002".into()
                }
            ]
        );
        assert_eq!(choose_gpus(&snap, &held(&[]), 3, 512), Some(vec![0, 1, 2]));
    }

    #[test]
    fn job_warnings_note_each_gpu_once_per_job() {
        let mut w = JobWarnings::default();
        assert_eq!(w.of("a"), None);
        w.note("a", 1, "GPU-0001", "2 uncorrected ECC error(s)");
        w.note("a", 1, "GPU-0001", "lost");
        w.note("b", 0, "GPU-0000", "lost");
        let a = w.of("a").unwrap();
        assert_eq!(
            a,
            "GPU 1 (GPU-0001) left the pool while this job ran on it: 2 uncorrected ECC \
             error(s). It may fail or hang: check its output, and `ptrain stop a` if it no \
             longer makes progress"
        );
        let new: Vec<String> = w.take_new().into_iter().map(|(j, _)| j).collect();
        assert_eq!(new, ["a", "b"], "each job once");
        assert!(w.take_new().is_empty(), "taken");
        w.note("a", 1, "GPU-0001", "lost");
        assert!(w.take_new().is_empty(), "the same GPU again is no news");
        w.note("a", 3, "GPU-0003", "lost");
        assert_eq!(w.take_new(), [("a".to_owned(), w.of("a").unwrap())]);
        assert!(w
            .of("a")
            .unwrap()
            .contains("error(s). GPU 3 (GPU-0003) left"));
        // Bounded: the oldest go first.
        for i in 0..MAX_JOB_WARNINGS {
            w.note(&format!("j{i}"), 0, "GPU-0000", "lost");
        }
        assert_eq!(w.of("a"), None);
        assert!(w.of(&format!("j{}", MAX_JOB_WARNINGS - 1)).is_some());
    }

    /// An inventory answering what the test last put in it.
    struct Shared(std::sync::Arc<Mutex<Vec<GpuInfo>>>);

    impl GpuInventory for Shared {
        fn backend(&self) -> &'static str {
            "nvml"
        }
        fn snapshot(&self) -> Result<Vec<GpuInfo>, GpuError> {
            Ok(lock(&self.0).clone())
        }
    }

    #[test]
    fn pool_monitor_warns_the_job_holding_a_gpu_that_leaves() {
        let fixed = std::sync::Arc::new(Mutex::new(vec![gpu(0), gpu(1)]));
        let set = |snap: Vec<GpuInfo>| *lock(&fixed) = snap;
        let mon = PoolMonitor::new(Box::new(Shared(fixed.clone())));
        mon.snapshot().unwrap();
        mon.set_holders(BTreeMap::from([(1, "train".to_owned())]));
        assert_eq!(mon.job_warning("train"), None, "healthy: nothing to say");

        // GPU 1 reports ECC errors under "train"; GPU 0, held by nobody,
        // is lost: only "train" hears, of its own GPU.
        let mut sick = gpu(1);
        sick.unhealthy = Some("2 uncorrected ECC error(s)".into());
        let mut lost = gpu(0);
        lost.unhealthy = Some("lost".into());
        set(vec![lost, sick]);
        mon.snapshot().unwrap();
        let w = mon.job_warning("train").unwrap();
        assert!(
            w.starts_with("GPU 1 (GPU-0001) left the pool while this job ran on it: 2 uncorrected"),
            "{w}"
        );
        assert!(!w.contains("GPU 0"), "{w}");
        // It stays said after the GPU heals (the job may have been hurt).
        set(vec![gpu(0), gpu(1)]);
        mon.snapshot().unwrap();
        assert_eq!(mon.job_warning("train").as_deref(), Some(w.as_str()));

        // After a restart: a fresh monitor sees GPU 1 out before it learns
        // that "train" holds it, and notes it then.
        let mut sick = gpu(1);
        sick.unhealthy = Some("lost".into());
        set(vec![gpu(0), sick]);
        let mon = PoolMonitor::new(Box::new(Shared(fixed.clone())));
        mon.snapshot().unwrap();
        assert_eq!(mon.job_warning("train"), None);
        mon.set_holders(BTreeMap::from([(1, "train".to_owned())]));
        let w = mon.job_warning("train").unwrap();
        assert!(
            w.contains("GPU 1 (GPU-0001) left the pool while this job ran on it: lost"),
            "{w}"
        );
        // A vanished GPU counts too.
        set(vec![gpu(1)]);
        mon.snapshot().unwrap();
        mon.set_holders(BTreeMap::from([(0, "other".to_owned())]));
        assert!(
            mon.job_warning("other").unwrap().contains(VANISHED),
            "noted at set_holders"
        );
        // Held but never seen (unreadable since before a restart).
        let mon = PoolMonitor::new(Box::new(Shared(fixed.clone())));
        mon.set_holders(BTreeMap::from([(0, "blind".to_owned())]));
        mon.snapshot().unwrap();
        let w = mon.job_warning("blind").unwrap();
        assert!(
            w.starts_with("GPU 0 (UUID unreadable) left the pool"),
            "{w}"
        );
        assert_eq!(mon.take_new_warnings().len(), 1);
    }

    #[test]
    fn the_health_taken_is_the_newest_look_that_differs() {
        let fixed = std::sync::Arc::new(Mutex::new(vec![gpu(0)]));
        let mon = PoolMonitor::new(Box::new(Shared(fixed.clone())));
        mon.snapshot().unwrap();
        assert!(mon.take_health().is_some(), "the first look is news");
        assert!(mon.take_health().is_none());
        // Out and back before anyone took the look: nothing stale is left.
        let mut sick = gpu(0);
        sick.unhealthy = Some("lost".into());
        *lock(&fixed) = vec![sick.clone()];
        mon.snapshot().unwrap();
        *lock(&fixed) = vec![gpu(0)];
        mon.snapshot().unwrap();
        assert!(mon.take_health().is_none(), "healthy as last taken");
        // Out, taken: out is what the ledger hears.
        *lock(&fixed) = vec![sick];
        mon.snapshot().unwrap();
        let taken = mon.take_health().unwrap();
        assert!(taken[0].unhealthy.is_some());
        mon.snapshot().unwrap();
        assert!(mon.take_health().is_none(), "the same again is no news");
    }

    #[test]
    fn tracker_first_look_and_index_reuse() {
        let mut t = PoolTracker::default();
        let mut sick = gpu(0);
        sick.unhealthy = Some("lost".into());
        let mut snap = vec![sick, gpu(1)];
        let changes = t.observe(&mut snap);
        assert!(matches!(&changes[..], [PoolChange::Out { index: 0, .. }]));
        // A different GPU now answers at index 1 (the old one is gone): the
        // old one is reported once but not listed over the new one.
        let mut other = gpu(1);
        other.uuid = "GPU-new".into();
        let mut snap = vec![gpu(0), other];
        let changes = t.observe(&mut snap);
        assert!(changes.contains(&PoolChange::Back {
            index: 0,
            uuid: "GPU-0000".into()
        }));
        assert!(changes
            .iter()
            .any(|c| matches!(c, PoolChange::Out { uuid, .. } if uuid == "GPU-0001")));
        assert_eq!(snap.len(), 2);
        assert_eq!(snap[1].uuid, "GPU-new");
    }

    #[test]
    fn monitor_wraps_any_backend() {
        let inv = PoolMonitor::new(Box::new(DeclaredInventory::new(vec![declared(0)])));
        assert_eq!(inv.backend(), "declared");
        assert_eq!(inv.snapshot().unwrap().len(), 1);
    }

    #[test]
    fn gpu_states() {
        let t = 512;
        assert_eq!(GpuState::of(&gpu(0), None, None, t), GpuState::Free);
        assert_eq!(
            GpuState::of(&gpu(0), Some("a"), Some("b"), t),
            GpuState::Held("a".into())
        );
        assert_eq!(
            GpuState::of(&gpu(0), None, Some("b"), t),
            GpuState::Reserved("b".into())
        );
        let busy = procs(gpu(0), &[Some(4096)]);
        assert_eq!(
            GpuState::of(&busy, None, None, t),
            GpuState::BusyForeign(4096)
        );
        assert_eq!(GpuState::of(&busy, Some("a"), None, t).name(), "held");
        let mut sick = gpu(0);
        sick.unhealthy = Some("ECC".into());
        let s = GpuState::of(&sick, Some("a"), None, t);
        assert_eq!(s.name(), "unhealthy");
        assert_eq!(s.describe(), "unhealthy: ECC");
        assert_eq!(
            GpuState::BusyForeign(7).describe(),
            "used by other programs (7 MiB)"
        );
        assert_eq!(
            GpuState::Reserved("x".into()).describe(),
            "reserved for job x"
        );
    }

    #[test]
    fn gpu_info_reads_records_without_new_fields() {
        let old = r#"{"index":0,"uuid":"GPU-a","name":"x","pci_bus_id":null,"memory_total_mib":1,
            "memory_used_mib":null,"utilization_pct":null,"temperature_c":null,
            "device":"/dev/nvidia0","processes":[]}"#;
        let g: GpuInfo = serde_json::from_str(old).unwrap();
        assert_eq!(
            (g.numa_node, g.topology_group, g.unhealthy),
            (None, None, None)
        );
    }

    #[test]
    fn absurd_nvml_readings_are_tamed() {
        assert_eq!(sane_used_bytes(80 * MIB, 100 * MIB), 80 * MIB);
        assert_eq!(sane_used_bytes(80 * MIB, 3 * MIB), 3 * MIB);
        assert_eq!(sane_used_bytes(0, 5), 0);
        assert_eq!(sane_utilization(100), Some(100));
        assert_eq!(sane_utilization(0), Some(0));
        assert_eq!(sane_utilization(400), None);
    }

    #[test]
    fn free_memory() {
        let mut g = gpu(0);
        g.memory_used_mib = Some(1_920);
        assert_eq!(free_memory_mib(&g), 80_000);
        g.memory_used_mib = None;
        assert_eq!(free_memory_mib(&g), 81_920);
    }
}
