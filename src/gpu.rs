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

use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor, TopologyLevel};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};
use serde::{Deserialize, Serialize};

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
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("cannot initialise NVML: {0}; check that the NVIDIA driver is loaded (`nvidia-smi` works), or set `backend = \"declared\"` in [gpus] and list the GPUs")]
    NvmlInit(#[source] NvmlError),

    #[error("cannot count GPUs through NVML: {0}; check `nvidia-smi`, the driver may be wedged or mid-upgrade")]
    Enumerate(#[source] NvmlError),

    #[error("invalid [gpus] configuration: {0}")]
    Config(String),
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
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            backend: GpuBackend::Auto,
            foreign_memory_threshold_mib: 512,
            declared: Vec::new(),
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
    pub fn validate(&self) -> Result<(), String> {
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

/// The GPUs listed in `[[gpus.declared]]`, reported as idle and unobserved.
#[derive(Clone, Debug)]
pub struct DeclaredInventory {
    gpus: Vec<DeclaredGpu>,
}

impl DeclaredInventory {
    pub fn new(mut gpus: Vec<DeclaredGpu>) -> Self {
        gpus.sort_by_key(|g| g.index);
        DeclaredInventory { gpus }
    }
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
                unhealthy: None,
            })
            .collect())
    }
}

/// Live inventory through NVML.
pub struct NvmlInventory {
    nvml: Nvml,
    /// GPUs currently left out of snapshots, so each problem is logged once
    /// rather than on every poll.
    skipped: Mutex<BTreeSet<u32>>,
}

impl std::fmt::Debug for NvmlInventory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlInventory").finish_non_exhaustive()
    }
}

impl NvmlInventory {
    /// Loads libnvidia-ml.so.1 and initialises it; fails cleanly (no panic,
    /// no abort) where there is no driver.
    pub fn init() -> Result<Self, GpuError> {
        let nvml = Nvml::init().map_err(GpuError::NvmlInit)?;
        Ok(NvmlInventory {
            nvml,
            skipped: Mutex::new(BTreeSet::new()),
        })
    }

    fn note_skipped(&self, index: u32, what: &str, e: &NvmlError) {
        let mut skipped = self.skipped.lock().unwrap_or_else(|p| p.into_inner());
        if skipped.insert(index) {
            tracing::warn!(
                gpu = index,
                "leaving GPU {index} out of the inventory: cannot read its {what} through NVML: {e}; \
                 no job will be given it until this clears (check `nvidia-smi`)"
            );
        }
    }

    fn note_ok(&self, index: u32) {
        let mut skipped = self.skipped.lock().unwrap_or_else(|p| p.into_inner());
        if skipped.remove(&index) {
            tracing::info!(gpu = index, "GPU {index} is readable through NVML again");
        }
    }

    /// One GPU, or `None` when it cannot be identified or isolated. The UUID
    /// identifies it in job records and the minor number gives the device
    /// node a job is allowed to open; guessing either could hand a job
    /// someone else's GPU, so without them the GPU is left out. Every other
    /// field is best effort.
    fn read_device(&self, index: u32) -> Option<GpuInfo> {
        let device = match self.nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                self.note_skipped(index, "handle", &e);
                return None;
            }
        };
        let uuid = match device.uuid() {
            Ok(u) => u,
            Err(e) => {
                self.note_skipped(index, "UUID", &e);
                return None;
            }
        };
        let minor = match device.minor_number() {
            Ok(m) => m,
            Err(e) => {
                self.note_skipped(index, "minor number", &e);
                return None;
            }
        };
        self.note_ok(index);
        let memory = device.memory_info().ok();
        Some(GpuInfo {
            index,
            uuid,
            name: device.name().unwrap_or_else(|_| "unknown".to_owned()),
            pci_bus_id: device.pci_info().ok().map(|p| p.bus_id),
            memory_total_mib: memory.as_ref().map_or(0, |m| m.total / MIB),
            memory_used_mib: memory.map(|m| m.used / MIB),
            utilization_pct: device.utilization_rates().ok().map(|u| u.gpu),
            temperature_c: device.temperature(TemperatureSensor::Gpu).ok(),
            device: PathBuf::from(format!("/dev/nvidia{minor}")),
            processes: compute_processes(&device)
                .map(|ps| ps.into_iter().map(to_gpu_process).collect())
                .unwrap_or_default(),
        })
    }
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
        Ok((0..count).filter_map(|i| self.read_device(i)).collect())
    }
}

/// Builds the inventory `cfg` asks for. `auto` tries NVML and falls back to
/// the declared list (possibly empty: a CPU-only machine) with one warning.
pub fn open_inventory(cfg: &GpuConfig) -> Result<Box<dyn GpuInventory>, GpuError> {
    cfg.validate().map_err(GpuError::Config)?;
    let declared = || Box::new(DeclaredInventory::new(cfg.declared.clone()));
    match cfg.backend {
        GpuBackend::Declared => Ok(declared()),
        GpuBackend::Nvml => Ok(Box::new(NvmlInventory::init()?)),
        GpuBackend::Auto => match NvmlInventory::init() {
            Ok(inv) => Ok(Box::new(inv)),
            Err(e) => {
                tracing::warn!(
                    "GPU inventory: NVML is not available ({e}); using the {} GPU(s) declared in [gpus], \
                     whose use by other programs cannot be seen",
                    cfg.declared.len()
                );
                Ok(declared())
            }
        },
    }
}

/// Memory (MiB) that programs other than ptrain jobs use on a GPU no ptrain
/// job holds. Every process on such a GPU is foreign. The process list is
/// preferred (it excludes driver overhead); when it is empty or incomplete,
/// the device's used memory stands in. When nothing at all is known (declared
/// GPUs) the GPU counts as free, and when processes are present but
/// unmeasurable it counts as busy.
fn foreign_usage_mib(gpu: &GpuInfo) -> u64 {
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

/// Pure allocation: picks `count` GPUs (by index) from `snapshot` that no
/// ptrain job holds (`held`) and whose foreign memory use is below
/// `foreign_memory_threshold_mib`. Deterministic: lowest indices first. `None`
/// if there are not enough; `count == 0` gives `Some(vec![])`.
pub fn choose_gpus(
    snapshot: &[GpuInfo],
    held: &BTreeSet<u32>,
    count: u32,
    foreign_memory_threshold_mib: u64,
) -> Option<Vec<u32>> {
    // A BTreeSet sorts and also drops a (malformed) repeated index.
    let free: BTreeSet<u32> = snapshot
        .iter()
        .filter(|g| !held.contains(&g.index))
        .filter(|g| foreign_usage_mib(g) < foreign_memory_threshold_mib)
        .map(|g| g.index)
        .collect();
    let want = usize::try_from(count).ok()?;
    (free.len() >= want).then(|| free.into_iter().take(want).collect())
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
                assert!(msg.contains(n), "{msg:?} should contain {n:?}");
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
        let inv = DeclaredInventory::new(vec![declared(3), declared(1)]);
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
    fn open_rejects_invalid_config() {
        let cfg = GpuConfig {
            backend: GpuBackend::Declared,
            declared: vec![declared(0), declared(0)],
            ..GpuConfig::default()
        };
        let e = open_inventory(&cfg).err().unwrap();
        assert!(matches!(e, GpuError::Config(_)));
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
    }
}
