//! Per-job resource limits: what a job may ask for (`"resources"` in the
//! descriptor), what the admin allows (`[limits]`, per user), and the
//! cgroup limits its unit gets. Pure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::setting::InvalidSetting;

/// What a job asked for: `"resources": {"memory": "32G", "cpus": 4, "tasks": 512}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceRequest {
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    /// Thousandths of a CPU (1500 = 1.5 CPUs).
    #[serde(default)]
    pub millicpus: Option<u64>,
    #[serde(default)]
    pub tasks: Option<u64>,
}

/// The limits a job's unit carries (MemoryMax=, CPUQuota=, TasksMax=).
pub type EffectiveLimits = ResourceRequest;

const MAX_CPUS: f64 = 4096.0;
const MAX_TASKS: u64 = 4_194_304;

/// Parses a size: bytes as a number, or a string with a binary suffix
/// (K, M, G, T; "32G", "512M", "1.5G").
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (num, mult) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = t[i..]
                .trim_end_matches(['B', 'b', 'i'])
                .to_ascii_uppercase();
            let mult: u64 = match unit.as_str() {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                _ => {
                    return Err(format!(
                        "unknown size unit in {text:?}; use K, M, G or T, like \"32G\""
                    ))
                }
            };
            (t[..i].trim(), mult)
        }
        None => (t, 1),
    };
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{text:?} is not a size; write e.g. \"32G\" or \"512M\""))?;
    if !value.is_finite() || value <= 0.0 || value * mult as f64 > u64::MAX as f64 / 2.0 {
        return Err(format!(
            "{text:?} is out of range; give a positive size like \"32G\""
        ));
    }
    Ok((value * mult as f64) as u64)
}

/// Validates the descriptor's `resources` object.
pub fn validate_request(v: &Value) -> Result<ResourceRequest, String> {
    let Value::Object(map) = v else {
        return Err(
            "must be an object like {\"memory\": \"32G\", \"cpus\": 4, \"tasks\": 512}".into(),
        );
    };
    let mut req = ResourceRequest::default();
    for (key, value) in map {
        match key.as_str() {
            "memory" => {
                req.memory_bytes = Some(match value {
                    Value::String(s) => parse_size(s)?,
                    Value::Number(n) => n
                        .as_u64()
                        .filter(|b| *b > 0)
                        .ok_or("`memory` in bytes must be a positive whole number")?,
                    _ => return Err("`memory` must be a size like \"32G\"".into()),
                })
            }
            "cpus" => {
                let cpus = value
                    .as_f64()
                    .filter(|c| *c > 0.0 && *c <= MAX_CPUS)
                    .ok_or(format!(
                        "`cpus` must be a number of CPUs between 0.001 and {MAX_CPUS}"
                    ))?;
                req.millicpus = Some(((cpus * 1000.0).round() as u64).max(1));
            }
            "tasks" => {
                req.tasks = Some(value.as_u64().filter(|t| *t > 0 && *t <= MAX_TASKS).ok_or(
                    format!("`tasks` must be a whole number between 1 and {MAX_TASKS}"),
                )?)
            }
            other => {
                let other: String = other.chars().take(40).collect();
                return Err(format!(
                    "unknown key {other:?}; accepted: `memory`, `cpus`, `tasks`"
                ));
            }
        }
    }
    Ok(req)
}

/// `[limits]` in the config: the most a job may use (and what it gets when
/// it asks for nothing), with per-user overrides under `[limits.users.NAME]`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    #[serde(default)]
    pub memory_max: Option<String>,
    #[serde(default)]
    pub cpus_max: Option<f64>,
    #[serde(default)]
    pub tasks_max: Option<u64>,
    /// A GPU-hour quota for every user without one of their own
    /// ([`crate::quota`]).
    #[serde(default)]
    pub gpu_hours: Option<crate::quota::GpuHoursQuota>,
    #[serde(default)]
    pub users: BTreeMap<String, UserLimits>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserLimits {
    #[serde(default)]
    pub memory_max: Option<String>,
    #[serde(default)]
    pub cpus_max: Option<f64>,
    #[serde(default)]
    pub tasks_max: Option<u64>,
    #[serde(default)]
    pub gpu_hours: Option<crate::quota::GpuHoursQuota>,
}

impl UserLimits {
    /// Checks every value; the error names the key under `prefix`.
    fn validate(&self, prefix: &str) -> Result<(), InvalidSetting> {
        if let Some(m) = &self.memory_max {
            parse_size(m).map_err(|e| InvalidSetting::new(format!("{prefix}memory_max"), e))?;
        }
        if let Some(c) = self.cpus_max {
            if !(c > 0.0 && c <= MAX_CPUS) {
                return Err(InvalidSetting::new(
                    format!("{prefix}cpus_max"),
                    format!("must be between 0.001 and {MAX_CPUS}"),
                ));
            }
        }
        if self.tasks_max == Some(0) {
            return Err(InvalidSetting::new(
                format!("{prefix}tasks_max"),
                "must be at least 1".into(),
            ));
        }
        if let Some(q) = &self.gpu_hours {
            q.validate(&format!("{prefix}gpu_hours"))?;
        }
        Ok(())
    }
}

impl LimitsConfig {
    /// Checks every value; the error names the key.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        let global = UserLimits {
            memory_max: self.memory_max.clone(),
            cpus_max: self.cpus_max,
            tasks_max: self.tasks_max,
            gpu_hours: self.gpu_hours.clone(),
        };
        global.validate("limits.")?;
        for (user, limits) in &self.users {
            limits.validate(&format!("limits.users.{user}."))?;
        }
        Ok(())
    }

    /// The GPU-hour quota of `user` and its key: their own where set,
    /// else the global one.
    pub fn quota_for(&self, user: &str) -> Option<(&crate::quota::GpuHoursQuota, String)> {
        match self.users.get(user).and_then(|u| u.gpu_hours.as_ref()) {
            Some(own) => Some((own, format!("limits.users.{user}.gpu_hours"))),
            None => self
                .gpu_hours
                .as_ref()
                .map(|q| (q, "limits.gpu_hours".to_owned())),
        }
    }

    /// Every quota the config names.
    pub fn quotas(&self) -> impl Iterator<Item = &crate::quota::GpuHoursQuota> {
        self.gpu_hours
            .iter()
            .chain(self.users.values().filter_map(|u| u.gpu_hours.as_ref()))
    }

    /// The caps that apply to `user`: their own where set, else the global.
    pub fn caps_for(&self, user: &str) -> ResourceRequest {
        let own = self.users.get(user);
        let memory = own
            .and_then(|u| u.memory_max.clone())
            .or(self.memory_max.clone());
        let cpus = own.and_then(|u| u.cpus_max).or(self.cpus_max);
        ResourceRequest {
            memory_bytes: memory.and_then(|m| parse_size(&m).ok()),
            millicpus: cpus.map(|c| ((c * 1000.0).round() as u64).max(1)),
            tasks: own.and_then(|u| u.tasks_max).or(self.tasks_max),
        }
    }
}

/// The limits a job runs with: what it asked for, which must be within its
/// owner's caps, else the caps themselves.
pub fn effective_limits(
    request: &ResourceRequest,
    caps: &ResourceRequest,
    user: &str,
) -> Result<EffectiveLimits, String> {
    fn pick(
        asked: Option<u64>,
        cap: Option<u64>,
        user: &str,
        show: fn(u64) -> String,
    ) -> Result<Option<u64>, String> {
        match (asked, cap) {
            (Some(a), Some(c)) if a > c => Err(format!(
                "it asks for {}, more than the {} allowed to {user}; ask for less or have the admin raise [limits]",
                show(a),
                show(c)
            )),
            (Some(a), _) => Ok(Some(a)),
            (None, cap) => Ok(cap),
        }
    }
    Ok(ResourceRequest {
        memory_bytes: pick(request.memory_bytes, caps.memory_bytes, user, memory_phrase)?,
        millicpus: pick(request.millicpus, caps.millicpus, user, cpus_phrase)?,
        tasks: pick(request.tasks, caps.tasks, user, tasks_phrase)?,
    })
}

fn memory_phrase(bytes: u64) -> String {
    format!("{:.1} GiB of memory", bytes as f64 / (1u64 << 30) as f64)
}

fn cpus_phrase(millicpus: u64) -> String {
    match millicpus {
        1000 => "1 CPU".to_string(),
        m => format!("{} CPUs", m as f64 / 1000.0),
    }
}

fn tasks_phrase(tasks: u64) -> String {
    match tasks {
        1 => "1 task".to_string(),
        t => format!("{t} tasks"),
    }
}

impl ResourceRequest {
    /// The limits in words ("4 CPUs, 12.0 GiB of memory, 100 tasks"),
    /// empty when there are none.
    pub fn describe(&self) -> String {
        [
            self.millicpus.map(cpus_phrase),
            self.memory_bytes.map(memory_phrase),
            self.tasks.map(tasks_phrase),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_as_words() {
        let limits = ResourceRequest {
            memory_bytes: Some(12 << 30),
            millicpus: Some(4000),
            tasks: Some(1),
        };
        assert_eq!(limits.describe(), "4 CPUs, 12.0 GiB of memory, 1 task");
        assert_eq!(ResourceRequest::default().describe(), "");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("32G").unwrap(), 32 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("12X").unwrap_err().contains("unit"));
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn requests_are_validated() {
        let r = validate_request(&serde_json::json!({"memory": "2G", "cpus": 1.5, "tasks": 64}))
            .unwrap();
        assert_eq!(r.memory_bytes, Some(2 << 30));
        assert_eq!(r.millicpus, Some(1500));
        assert_eq!(r.tasks, Some(64));
        assert!(validate_request(&serde_json::json!({"gpu": 1}))
            .unwrap_err()
            .contains("accepted"));
        assert!(validate_request(&serde_json::json!({"cpus": 0})).is_err());
        assert!(validate_request(&serde_json::json!("big")).is_err());
    }

    #[test]
    fn caps_apply_per_user_and_reject_larger_requests() {
        let limits: LimitsConfig = toml::from_str(
            "memory_max = \"8G\"\ntasks_max = 100\n[users.alice]\nmemory_max = \"16G\"\n",
        )
        .unwrap();
        limits.validate().unwrap();
        let alice = limits.caps_for("alice");
        let bob = limits.caps_for("bob");
        assert_eq!(alice.memory_bytes, Some(16 << 30));
        assert_eq!(bob.memory_bytes, Some(8 << 30));
        assert_eq!(bob.tasks, Some(100));
        let ask = ResourceRequest {
            memory_bytes: Some(12 << 30),
            ..Default::default()
        };
        assert_eq!(
            effective_limits(&ask, &alice, "alice")
                .unwrap()
                .memory_bytes,
            Some(12 << 30)
        );
        let e = effective_limits(&ask, &bob, "bob").unwrap_err();
        assert!(
            e.starts_with(
                "it asks for 12.0 GiB of memory, more than the 8.0 GiB of memory allowed to bob;"
            ),
            "{e}"
        );
        // Each kind of limit reads as a phrase of its own.
        let greedy = ResourceRequest {
            millicpus: Some(4000),
            tasks: Some(10_000),
            ..Default::default()
        };
        let capped = ResourceRequest {
            millicpus: Some(1000),
            tasks: Some(1),
            ..Default::default()
        };
        let e = effective_limits(&greedy, &capped, "carol").unwrap_err();
        assert!(
            e.starts_with("it asks for 4 CPUs, more than the 1 CPU allowed"),
            "{e}"
        );
        let e = effective_limits(
            &ResourceRequest {
                tasks: Some(10_000),
                ..Default::default()
            },
            &capped,
            "carol",
        )
        .unwrap_err();
        assert!(
            e.starts_with("it asks for 10000 tasks, more than the 1 task allowed"),
            "{e}"
        );
        // Asking nothing gets the caps.
        assert_eq!(
            effective_limits(&Default::default(), &bob, "bob").unwrap(),
            bob
        );
        let bad: LimitsConfig = toml::from_str("[users.x]\nmemory_max = \"lots\"\n").unwrap();
        assert_eq!(bad.validate().unwrap_err().key, "limits.users.x.memory_max");
    }
}
