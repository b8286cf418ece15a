//! `make gpu-check`: on a machine with NVIDIA GPUs, shows what ptraind's
//! NVML inventory sees, plans jobs on it with ptraind's own allocator, and
//! makes one real allocation: a child process started the way a job unit
//! starts (CUDA_VISIBLE_DEVICES=<UUID>, CUDA_DEVICE_ORDER=PCI_BUS_ID) opens
//! CUDA through libcuda, must see exactly the chosen GPU, allocates memory
//! on it, and the inventory must then see that GPU as busy (and only it).
//!
//! Without the NVIDIA driver it says so and exits 0. Exits 1 when a check
//! fails; what it saw is printed either way.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use ptrain::gpu::{choose_gpus, foreign_usage_mib, GpuInfo, GpuInventory, GpuState, NvmlInventory};
use ptrain::policy::Policy;
use ptrain::scheduler::{plan, Rules, Waiting};
use ptrain::spec::{GpuRequest, JobId};
use ptrain::users::Owner;

/// Memory the probe allocates: above the default foreign threshold (512
/// MiB), so the allocator must then treat the GPU as busy.
const PROBE_MIB: u64 = 1024;
const THRESHOLD_MIB: u64 = 512;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--cuda-probe") {
        return cuda_probe(
            args.get(2)
                .and_then(|s| s.parse().ok())
                .unwrap_or(PROBE_MIB),
        );
    }
    let inv = match NvmlInventory::init() {
        Ok(inv) => inv,
        Err(e) => {
            println!("gpu-check: NVML is not available here ({e}).");
            println!("gpu-check: no NVIDIA driver on this machine; nothing to check.");
            return ExitCode::SUCCESS;
        }
    };
    let mut failures: Vec<String> = Vec::new();
    let mut check = |ok: bool, what: String| {
        println!("  [{}] {what}", if ok { " ok " } else { "FAIL" });
        if !ok {
            failures.push(what);
        }
    };

    println!(
        "== NVML inventory (driver {})",
        inv.driver_version().unwrap_or_else(|| "?".into())
    );
    let snap = match inv.snapshot() {
        Ok(s) => s,
        Err(e) => {
            println!("gpu-check: FAIL: cannot read the inventory: {e}");
            return ExitCode::FAILURE;
        }
    };
    for g in &snap {
        print_gpu(g);
    }
    if snap.is_empty() {
        println!("gpu-check: NVML works but lists no GPU; nothing more to check.");
        return ExitCode::SUCCESS;
    }

    println!("== consistency");
    let uuids: BTreeSet<&str> = snap.iter().map(|g| g.uuid.as_str()).collect();
    check(
        uuids.len() == snap.len(),
        format!("{} GPUs, each with its own UUID", snap.len()),
    );
    for g in &snap {
        use std::os::unix::fs::FileTypeExt;
        let node = std::fs::metadata(&g.device);
        check(
            node.as_ref().is_ok_and(|m| m.file_type().is_char_device()),
            format!(
                "GPU {} device node {} is a character device",
                g.index,
                g.device.display()
            ),
        );
    }
    // CUDA_DEVICE_ORDER=PCI_BUS_ID numbers GPUs by bus id; NVML numbers them
    // the same way, which is what makes ptrain's indices match CUDA's.
    let by_bus: Vec<u32> = {
        let mut v: Vec<(Option<BusId>, u32)> = snap
            .iter()
            .map(|g| (g.pci_bus_id.as_deref().and_then(parse_bus_id), g.index))
            .collect();
        v.sort();
        v.into_iter().map(|(_, i)| i).collect()
    };
    let by_index: Vec<u32> = snap.iter().map(|g| g.index).collect();
    check(
        by_bus == by_index,
        format!("NVML index order {by_index:?} is PCI bus order {by_bus:?}"),
    );

    println!("== allocation plans (ptraind's allocator, nothing held)");
    let n = snap.len() as u32;
    for count in [1, 2, n]
        .into_iter()
        .filter(|c| *c <= n)
        .collect::<BTreeSet<_>>()
    {
        let chosen = choose_gpus(&snap, &BTreeSet::new(), count, THRESHOLD_MIB);
        println!("  {count} GPU(s): {chosen:?}");
    }
    let owner = Owner {
        uid: 0,
        gid: 0,
        name: "root".into(),
        home: "/root".into(),
        groups: vec![],
    };
    let ids: Vec<JobId> = ["all", "one-a", "one-b"]
        .iter()
        .map(|s| JobId::parse(s).unwrap())
        .collect();
    let reqs = [GpuRequest::any(n), GpuRequest::any(1), GpuRequest::any(1)];
    let queue: Vec<Waiting> = ids
        .iter()
        .zip(&reqs)
        .map(|(id, request)| Waiting {
            id,
            owner: &owner,
            priority: 0,
            request,
        })
        .collect();
    let policy = Policy::none();
    let rules = Rules {
        foreign_memory_threshold_mib: THRESHOLD_MIB,
        policy: &policy,
    };
    let p = plan(&queue, &snap, &BTreeMap::new(), rules);
    println!(
        "  queue [all:{n}, one-a:1, one-b:1] -> start {:?}, reserved {:?}",
        p.placements
            .iter()
            .map(|pl| format!("{}={:?}", pl.id, pl.gpus))
            .collect::<Vec<_>>(),
        p.reserved
    );

    println!("== real allocation");
    let Some(target) = choose_gpus(&snap, &BTreeSet::new(), 1, THRESHOLD_MIB)
        .and_then(|v| v.first().copied())
        .and_then(|i| snap.iter().find(|g| g.index == i))
    else {
        println!("  no GPU is free now (all busy or unhealthy); skipping the real allocation");
        return finish(failures);
    };
    println!(
        "  chose GPU {} ({}); starting a CUDA probe with CUDA_VISIBLE_DEVICES={} CUDA_DEVICE_ORDER=PCI_BUS_ID",
        target.index, target.name, target.uuid
    );
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            println!("gpu-check: FAIL: cannot find my own binary: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut child = match Command::new(exe)
        .args(["--cuda-probe", &PROBE_MIB.to_string()])
        .env("CUDA_VISIBLE_DEVICES", &target.uuid)
        .env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            println!("gpu-check: FAIL: cannot start the probe: {e}");
            return ExitCode::FAILURE;
        }
    };
    let pid = child.id();
    let mut lines = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    let _ = lines.read_line(&mut line);
    let probe: BTreeMap<String, String> = line
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    println!("  probe (pid {pid}) says: {}", line.trim());
    match probe.get("status").map(String::as_str) {
        Some("ready") => {
            check(
                probe.get("devices").map(String::as_str) == Some("1"),
                "CUDA sees exactly one GPU".to_owned(),
            );
            check(
                probe
                    .get("uuid")
                    .is_some_and(|u| u.eq_ignore_ascii_case(&target.uuid)),
                format!("CUDA device 0 is {}", target.uuid),
            );
            check(
                probe.get("bus").and_then(|b| parse_bus_id(b))
                    == target.pci_bus_id.as_deref().and_then(parse_bus_id),
                format!(
                    "CUDA's PCI bus id matches NVML's ({})",
                    target.pci_bus_id.as_deref().unwrap_or("?")
                ),
            );
            // NVML's process accounting lags a little behind the allocation.
            let before = target.memory_used_mib.unwrap_or(0);
            let deadline = Instant::now() + Duration::from_secs(5);
            let after = loop {
                let now = inv.snapshot().unwrap_or_default();
                let seen = now.iter().any(|g| g.processes.iter().any(|p| p.pid == pid));
                let grew = now
                    .iter()
                    .find(|g| g.uuid == target.uuid)
                    .is_some_and(|g| g.memory_used_mib.unwrap_or(0) >= before + PROBE_MIB * 8 / 10);
                if seen || grew || Instant::now() >= deadline {
                    break now;
                }
                std::thread::sleep(Duration::from_millis(200));
            };
            let on: Vec<u32> = after
                .iter()
                .filter(|g| g.processes.iter().any(|p| p.pid == pid))
                .map(|g| g.index)
                .collect();
            let target_now = after.iter().find(|g| g.uuid == target.uuid);
            if let Some(g) = target_now {
                print_gpu(g);
            }
            if on.is_empty() {
                // In a container NVML reports host pids; the memory says it.
                println!(
                    "  (the probe's pid is not in NVML's process lists; judging by used memory)"
                );
                check(
                    target_now.is_some_and(|g| {
                        g.memory_used_mib.unwrap_or(0) >= before + PROBE_MIB * 8 / 10
                    }),
                    format!(
                        "GPU {}'s used memory grew by the probe's {PROBE_MIB} MiB",
                        target.index
                    ),
                );
            } else {
                check(
                    on == [target.index],
                    format!(
                        "the probe runs on GPU {} only (NVML lists it on {on:?})",
                        target.index
                    ),
                );
            }
            if let Some(g) = target_now {
                let state = GpuState::of(g, None, None, THRESHOLD_MIB);
                println!("  GPU {} is now: {}", g.index, state.describe());
                check(
                    foreign_usage_mib(g) >= THRESHOLD_MIB,
                    format!(
                        "the allocator counts the probe as foreign use on GPU {}",
                        g.index
                    ),
                );
                let again = choose_gpus(&after, &BTreeSet::new(), 1, THRESHOLD_MIB);
                check(
                    again.as_ref().is_none_or(|v| !v.contains(&g.index)),
                    format!("a new 1-GPU job is not placed on the busy GPU (it gets {again:?})"),
                );
            }
        }
        _ => {
            let mut rest = String::new();
            let _ = lines.read_to_string(&mut rest);
            check(
                false,
                format!("the CUDA probe failed: {} {}", line.trim(), rest.trim()),
            );
        }
    }
    // Closing its stdin ends the probe, which frees its memory.
    drop(child.stdin.take());
    let _ = child.wait();
    finish(failures)
}

fn finish(failures: Vec<String>) -> ExitCode {
    if failures.is_empty() {
        println!("gpu-check: all checks passed");
        ExitCode::SUCCESS
    } else {
        println!("gpu-check: {} check(s) FAILED:", failures.len());
        for f in failures {
            println!("  - {f}");
        }
        ExitCode::FAILURE
    }
}

fn print_gpu(g: &GpuInfo) {
    let opt = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
    println!(
        "  GPU {} {} {} bus={} numa={} switch-group={} mem={}/{} MiB util={}% temp={}C node={}",
        g.index,
        g.uuid,
        g.name,
        g.pci_bus_id.as_deref().unwrap_or("-"),
        opt(g.numa_node.map(u64::from)),
        opt(g.topology_group.map(u64::from)),
        opt(g.memory_used_mib),
        g.memory_total_mib,
        opt(g.utilization_pct.map(u64::from)),
        opt(g.temperature_c.map(u64::from)),
        g.device.display()
    );
    for p in &g.processes {
        println!(
            "      process pid {} using {} MiB",
            p.pid,
            opt(p.used_memory_mib)
        );
    }
    if let Some(why) = &g.unhealthy {
        println!("      UNHEALTHY: {why}");
    }
}

/// PCI domain, bus, device, function.
type BusId = (u32, u32, u32, u32);

/// "00000000:3B:00.0" (NVML) or "0000:3b:00.0" (CUDA) → numbers.
fn parse_bus_id(s: &str) -> Option<BusId> {
    let (domain, rest) = s.trim().split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.')?;
    let hex = |t: &str| u32::from_str_radix(t, 16).ok();
    Some((hex(domain)?, hex(bus)?, hex(dev)?, hex(func)?))
}

/// The child: open CUDA as a job would, report what it sees on one line,
/// hold `mib` MiB on device 0 until stdin closes.
fn cuda_probe(mib: u64) -> ExitCode {
    match probe(mib) {
        Ok(report) => {
            println!("status=ready {report}");
            let _ = std::io::stdout().flush();
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("status=error {e}");
            ExitCode::FAILURE
        }
    }
}

type CuResult = c_int;

struct Cuda {
    lib: *mut c_void,
}

impl Cuda {
    fn open() -> Result<Cuda, String> {
        // SAFETY: dlopen with a constant name; a null result is handled.
        let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
        if lib.is_null() {
            return Err(
                "libcuda.so.1 cannot be loaded (is the CUDA driver library installed?)".into(),
            );
        }
        Ok(Cuda { lib })
    }

    /// The function `name` as type `F`, which must be its C signature.
    unsafe fn get<F: Copy>(&self, names: &[&str]) -> Result<F, String> {
        for name in names {
            let c = CString::new(*name).expect("constant names");
            let p = libc::dlsym(self.lib, c.as_ptr());
            if !p.is_null() {
                return Ok(std::mem::transmute_copy::<*mut c_void, F>(&p));
            }
        }
        Err(format!("libcuda has no {}", names.join(" or ")))
    }
}

fn call(what: &str, rc: CuResult) -> Result<(), String> {
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("{what}=CUresult({rc})"))
    }
}

fn probe(mib: u64) -> Result<String, String> {
    let cuda = Cuda::open()?;
    // SAFETY: each type below is the documented C signature of the CUDA
    // driver API function it is looked up as (cuda.h, CUDA 11 and later);
    // every pointer passed is to a live local of the right size.
    unsafe {
        let cu_init: unsafe extern "C" fn(c_uint) -> CuResult = cuda.get(&["cuInit"])?;
        let get_count: unsafe extern "C" fn(*mut c_int) -> CuResult =
            cuda.get(&["cuDeviceGetCount"])?;
        let get_device: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult =
            cuda.get(&["cuDeviceGet"])?;
        let get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult =
            cuda.get(&["cuDeviceGetName"])?;
        let get_bus: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult =
            cuda.get(&["cuDeviceGetPCIBusId"])?;
        let get_uuid: unsafe extern "C" fn(*mut [u8; 16], c_int) -> CuResult =
            cuda.get(&["cuDeviceGetUuid_v2", "cuDeviceGetUuid"])?;
        let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult =
            cuda.get(&["cuDevicePrimaryCtxRetain"])?;
        let set_current: unsafe extern "C" fn(*mut c_void) -> CuResult =
            cuda.get(&["cuCtxSetCurrent"])?;
        let mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> CuResult =
            cuda.get(&["cuMemAlloc_v2"])?;
        let memset: unsafe extern "C" fn(u64, u8, usize) -> CuResult =
            cuda.get(&["cuMemsetD8_v2"])?;

        call("cuInit", cu_init(0))?;
        let mut count: c_int = 0;
        call("cuDeviceGetCount", get_count(&mut count))?;
        if count < 1 {
            return Err(format!("devices={count}"));
        }
        let mut dev: c_int = 0;
        call("cuDeviceGet", get_device(&mut dev, 0))?;
        let mut name = [0 as c_char; 256];
        call("cuDeviceGetName", get_name(name.as_mut_ptr(), 256, dev))?;
        let mut bus = [0 as c_char; 64];
        call("cuDeviceGetPCIBusId", get_bus(bus.as_mut_ptr(), 64, dev))?;
        let mut uuid = [0u8; 16];
        call("cuDeviceGetUuid", get_uuid(&mut uuid, dev))?;
        let mut ctx: *mut c_void = std::ptr::null_mut();
        call("cuDevicePrimaryCtxRetain", retain(&mut ctx, dev))?;
        call("cuCtxSetCurrent", set_current(ctx))?;
        let bytes = (mib * 1024 * 1024) as usize;
        let mut ptr: u64 = 0;
        call("cuMemAlloc", mem_alloc(&mut ptr, bytes))?;
        // Touch it, so the memory is really committed on the GPU.
        call("cuMemsetD8", memset(ptr, 0x5a, bytes))?;
        let h: Vec<String> = uuid.iter().map(|b| format!("{b:02x}")).collect();
        let uuid = format!(
            "GPU-{}-{}-{}-{}-{}",
            h[0..4].concat(),
            h[4..6].concat(),
            h[6..8].concat(),
            h[8..10].concat(),
            h[10..16].concat()
        );
        let name = CStr::from_ptr(name.as_ptr())
            .to_string_lossy()
            .replace(' ', "_");
        let bus = CStr::from_ptr(bus.as_ptr()).to_string_lossy().into_owned();
        Ok(format!(
            "devices={count} uuid={uuid} bus={bus} name={name} allocated_mib={mib}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_compare_across_spellings() {
        assert_eq!(
            parse_bus_id("00000000:3B:00.0"),
            parse_bus_id("0000:3b:00.0")
        );
        assert_eq!(parse_bus_id("0000:3b:00.0"), Some((0, 0x3b, 0, 0)));
        assert_ne!(parse_bus_id("0000:3b:00.0"), parse_bus_id("0000:3c:00.0"));
        assert_eq!(parse_bus_id("garbage"), None);
    }
}
