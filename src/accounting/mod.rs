//! Accounting: what each ended job used, and the history queries over it.
//!
//! The figures are taken at the job's end ([`usage`]: the unit's cgroup
//! counters, read by the watcher `ptraind exec-job` leaves beside the
//! job's command, and kept in the job's end record). The end records feed a SQLite database, `STATE/accounting.sqlite`
//! (root-only, WAL), one row per ended run, from a writer task of its own
//! ([`db`]), never from the state task; `ptrain history` and `ptrain
//! report` query it ([`query`] builds their SQL, pure, with every value a
//! bound parameter). SQLite itself runs only in
//! short-lived children, `ptraind accounting ...` ([`helper`]), so none of
//! it stays in the daemon's memory.

pub mod db;
pub mod gpu;
pub mod helper;
pub mod query;
pub mod usage;

use serde::{Deserialize, Serialize};

use crate::setting::InvalidSetting;

use crate::store::JobRecord;

/// `[accounting]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAccounting {
    enabled: Option<bool>,
    gpu_sample_interval: Option<String>,
}

/// `[accounting]`: whether each run's usage is measured (the watcher
/// beside the job's command, [`usage::start_watcher`]) and kept in the accounting database. On by default;
/// off, `ptrain history` and `ptrain report` say so, and fair share and
/// quotas, which are computed from that database, cannot be configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountingConfig {
    pub enabled: bool,
    /// How often the GPUs jobs hold are sampled through NVML ([`gpu`]).
    pub gpu_sample_interval: std::time::Duration,
}

/// `[accounting] gpu_sample_interval` by default: Slurm's
/// `JobAcctGatherFrequency`.
pub const DEFAULT_GPU_SAMPLE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

impl Default for AccountingConfig {
    fn default() -> Self {
        AccountingConfig {
            enabled: true,
            gpu_sample_interval: DEFAULT_GPU_SAMPLE_INTERVAL,
        }
    }
}

/// What `ptrain history` and `ptrain report` answer while accounting is
/// off.
pub const ACCOUNTING_OFF: &str = "accounting is off on this host ([accounting] enabled = false in ptraind's config): no run is measured or kept; an admin sets enabled = true and restarts ptraind to keep them from then on";

impl AccountingConfig {
    /// The section, checked against the settings that read the accounting
    /// database (`policy.fair_share`, `gpu_hours` quotas): those name the
    /// key and the fix when accounting is off.
    pub fn from_raw(
        raw: Option<RawAccounting>,
        policy: &crate::policy::PolicyConfig,
        limits: &crate::resources::LimitsConfig,
    ) -> Result<AccountingConfig, InvalidSetting> {
        let raw = raw.unwrap_or_default();
        let gpu_sample_interval = match raw.gpu_sample_interval {
            None => DEFAULT_GPU_SAMPLE_INTERVAL,
            Some(text) => humantime::parse_duration(&text)
                .ok()
                .filter(|d| (1..=3600).contains(&d.as_secs()))
                .ok_or_else(|| {
                    InvalidSetting::new(
                        "accounting.gpu_sample_interval".into(),
                        format!("{text:?} is not a duration from 1s to 1h; write e.g. \"30s\""),
                    )
                })?,
        };
        let config = AccountingConfig {
            enabled: raw.enabled.unwrap_or(true),
            gpu_sample_interval,
        };
        if config.enabled {
            return Ok(config);
        }
        let needs_it = |key: String, what: &str| {
            InvalidSetting::new(
                key,
                format!(
                    "{what} is computed from the accounting database, which [accounting] enabled = false turns off; remove this setting or set enabled = true"
                ),
            )
        };
        if policy.fair_share_half_life().is_some() {
            return Err(needs_it("policy.fair_share".into(), "fair share"));
        }
        if limits.gpu_hours.is_some() {
            return Err(needs_it("limits.gpu_hours".into(), "a GPU-hour quota"));
        }
        if let Some(user) = limits.users.iter().find(|(_, u)| u.gpu_hours.is_some()) {
            return Err(needs_it(
                format!("limits.users.{}.gpu_hours", user.0),
                "a GPU-hour quota",
            ));
        }
        Ok(config)
    }
}

/// A run's usage as `ptrain status --json` shows it (`usage`): wall time
/// and GPU-seconds from the record's times and GPUs, the rest from the
/// cgroup's counters ([`crate::store::Usage`]). Fields are only added.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageView {
    pub wall_secs: f64,
    pub gpus: u32,
    pub gpu_seconds: f64,
    #[serde(default)]
    pub cpu_secs: Option<f64>,
    #[serde(default)]
    pub mem_peak_bytes: Option<u64>,
    #[serde(default)]
    pub io_read_bytes: Option<u64>,
    #[serde(default)]
    pub io_write_bytes: Option<u64>,
}

impl UsageView {
    /// The usage of an ended run; None while it runs or if it never ran.
    pub fn of(record: &JobRecord) -> Option<UsageView> {
        let wall = record.wall_usec()?;
        let usage = record.usage.clone().unwrap_or_default();
        Some(UsageView {
            wall_secs: wall as f64 / 1e6,
            gpus: record.gpus.len() as u32,
            gpu_seconds: record.gpu_seconds(),
            cpu_secs: usage.cpu_nsec.map(|n| n as f64 / 1e9),
            mem_peak_bytes: usage.mem_peak_bytes,
            io_read_bytes: usage.io_read_bytes,
            io_write_bytes: usage.io_write_bytes,
        })
    }

    /// One line for people: "2.0 s wall, 6.0 GPU-s, 1.98 s CPU, peak 210.3 MiB, read 0 B, wrote 4.0 KiB".
    pub fn describe(&self) -> String {
        let mut parts = vec![format!("{:.1} s wall", self.wall_secs)];
        if self.gpus > 0 {
            parts.push(format!(
                "{:.1} GPU-s on {} GPU(s)",
                self.gpu_seconds, self.gpus
            ));
        }
        if let Some(cpu) = self.cpu_secs {
            parts.push(format!("{cpu:.2} s CPU"));
        }
        if let Some(mem) = self.mem_peak_bytes {
            parts.push(format!("peak memory {}", bytes(mem)));
        }
        if let (Some(r), Some(w)) = (self.io_read_bytes, self.io_write_bytes) {
            parts.push(format!("read {}, wrote {}", bytes(r), bytes(w)));
        }
        parts.join(", ")
    }
}

/// Bytes in binary units for people: "512 B", "4.0 KiB", "210.3 MiB".
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}
