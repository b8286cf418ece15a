//! How busy a run kept its GPUs: utilization and memory used per GPU,
//! sampled from NVML while the run holds them (pure).
//!
//! The state task takes a sample every `[accounting] gpu_sample_interval`
//! while any job holds a GPU, and at no other time, so an idle ptraind does
//! not wake up for it; each sample is added to the holding job's record
//! ([`add`]), where it stays with the run: `ptrain status`
//! shows the figures so far, the end record keeps them, and the
//! accounting database has a run's average and peak. Sums are kept, not
//! averages, so that adding a sample is exact and cheap.
//!
//! A sample is NVML's utilization rate (the share of the driver's last
//! sample period in which a kernel ran) and the memory used on the GPU
//! at that moment: the GPU is the job's alone (its device cgroup), so
//! that is the job's memory. A figure the driver does not give is left
//! out, never counted as 0.

use serde::{Deserialize, Serialize};

use crate::gpu::GpuInfo;
pub use crate::store::GpuRunUsage;

/// Adds what `gpu` shows now to `usage`.
pub fn add(usage: &mut GpuRunUsage, gpu: &GpuInfo) {
    usage.samples = usage.samples.saturating_add(1);
    if usage.uuid.is_empty() {
        usage.uuid = gpu.uuid.clone();
    }
    if let Some(pct) = gpu.utilization_pct {
        usage.util_samples += 1;
        usage.util_sum_pct = usage.util_sum_pct.saturating_add(u64::from(pct));
        usage.util_peak_pct = usage.util_peak_pct.max(pct);
    }
    if let Some(mib) = gpu.memory_used_mib {
        usage.mem_samples += 1;
        usage.mem_sum_mib = usage.mem_sum_mib.saturating_add(mib);
        usage.mem_peak_mib = usage.mem_peak_mib.max(mib);
    }
}

pub fn util_avg_pct(usage: &GpuRunUsage) -> Option<f64> {
    (usage.util_samples > 0).then(|| usage.util_sum_pct as f64 / f64::from(usage.util_samples))
}

pub fn mem_avg_mib(usage: &GpuRunUsage) -> Option<f64> {
    (usage.mem_samples > 0).then(|| usage.mem_sum_mib as f64 / f64::from(usage.mem_samples))
}

/// The figures of `usage` as `ptrain status` shows them.
pub fn view(usage: &GpuRunUsage) -> GpuUsageView {
    GpuUsageView {
        index: usage.index,
        uuid: usage.uuid.clone(),
        samples: usage.samples,
        util_avg_pct: util_avg_pct(usage),
        util_peak_pct: (usage.util_samples > 0).then_some(usage.util_peak_pct),
        mem_avg_mib: mem_avg_mib(usage),
        mem_peak_mib: (usage.mem_samples > 0).then_some(usage.mem_peak_mib),
    }
}

/// Adds a sample of `snapshot` to each of the run's GPUs (`usage`, one
/// entry per GPU in `gpus`' order, made on the first sample). A GPU
/// missing from the snapshot (lost) gets no sample.
pub fn sample(usage: &mut Vec<GpuRunUsage>, gpus: &[u32], snapshot: &[GpuInfo]) {
    for &index in gpus {
        let Some(gpu) = snapshot.iter().find(|g| g.index == index) else {
            continue;
        };
        let at = match usage.iter().position(|u| u.index == index) {
            Some(at) => at,
            None => {
                usage.push(GpuRunUsage {
                    index,
                    ..GpuRunUsage::default()
                });
                usage.len() - 1
            }
        };
        add(&mut usage[at], gpu);
    }
}

/// One GPU's figures over a run, as `ptrain status --json` shows them
/// (`gpu_usage`). Fields are only added.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuUsageView {
    pub index: u32,
    pub uuid: String,
    pub samples: u32,
    #[serde(default)]
    pub util_avg_pct: Option<f64>,
    #[serde(default)]
    pub util_peak_pct: Option<u32>,
    #[serde(default)]
    pub mem_avg_mib: Option<f64>,
    #[serde(default)]
    pub mem_peak_mib: Option<u64>,
}

impl GpuUsageView {
    /// One line for people: "GPU 0: utilization 73% on average, peak 99%;
    /// memory 11.9 GiB on average, peak 15.2 GiB (12 samples)".
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let (Some(avg), Some(peak)) = (self.util_avg_pct, self.util_peak_pct) {
            parts.push(format!("utilization {avg:.0}% on average, peak {peak}%"));
        }
        if let (Some(avg), Some(peak)) = (self.mem_avg_mib, self.mem_peak_mib) {
            let mib = |m: f64| super::bytes((m * 1024.0 * 1024.0) as u64);
            parts.push(format!(
                "memory {} on average, peak {}",
                mib(avg),
                mib(peak as f64)
            ));
        }
        if parts.is_empty() {
            parts.push("the driver gave no utilization or memory figure".into());
        }
        let samples = match self.samples {
            1 => "1 sample".to_owned(),
            n => format!("{n} samples"),
        };
        format!("GPU {}: {} ({samples})", self.index, parts.join("; "))
    }
}

/// A run's GPUs together, for the accounting database: the average of
/// their average utilizations, and the highest memory peak of any one.
pub fn run_figures(usage: &[GpuRunUsage]) -> (Option<f64>, Option<u64>) {
    let avgs: Vec<f64> = usage.iter().filter_map(util_avg_pct).collect();
    let util = (!avgs.is_empty()).then(|| avgs.iter().sum::<f64>() / avgs.len() as f64);
    let mem = usage
        .iter()
        .filter(|u| u.mem_samples > 0)
        .map(|u| u.mem_peak_mib)
        .max();
    (util, mem)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, util: Option<u32>, mem: Option<u64>) -> GpuInfo {
        GpuInfo {
            utilization_pct: util,
            memory_used_mib: mem,
            ..crate::gpu::test_kit::gpu(index)
        }
    }

    #[test]
    fn samples_add_up_per_gpu_and_a_missing_figure_is_not_a_zero() {
        let mut usage = Vec::new();
        sample(
            &mut usage,
            &[1, 3],
            &[gpu(1, Some(80), Some(1000)), gpu(3, None, Some(10))],
        );
        sample(
            &mut usage,
            &[1, 3],
            &[gpu(1, Some(20), Some(3000)), gpu(3, None, Some(30))],
        );
        // GPU 3 lost: no sample for it, the others go on.
        sample(&mut usage, &[1, 3], &[gpu(1, Some(50), None)]);
        assert_eq!(usage.len(), 2);
        let one = view(&usage[0]);
        assert_eq!((one.index, one.samples), (1, 3));
        assert_eq!(one.util_avg_pct, Some(50.0));
        assert_eq!(one.util_peak_pct, Some(80));
        assert_eq!(
            (one.mem_avg_mib, one.mem_peak_mib),
            (Some(2000.0), Some(3000))
        );
        let three = view(&usage[1]);
        assert_eq!(three.samples, 2);
        assert_eq!((three.util_avg_pct, three.util_peak_pct), (None, None));
        assert_eq!(three.mem_peak_mib, Some(30));
        assert_eq!(run_figures(&usage), (Some(50.0), Some(3000)));
        assert_eq!(run_figures(&[]), (None, None));
        let said = one.describe();
        assert!(
            said.starts_with("GPU 1: utilization 50% on average, peak 80%; memory")
                && said.ends_with("(3 samples)"),
            "{said}"
        );
    }

    #[test]
    fn the_figures_survive_the_record_and_old_records_have_none() {
        let mut usage = Vec::new();
        sample(&mut usage, &[0], &[gpu(0, Some(73), Some(512))]);
        let json = serde_json::to_string(&usage).unwrap();
        let back: Vec<GpuRunUsage> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, usage);
        let old: GpuRunUsage = serde_json::from_str(r#"{"index":0,"samples":0}"#).unwrap();
        assert_eq!(view(&old).util_avg_pct, None);
    }
}
