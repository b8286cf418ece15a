//! The descriptor's dependency lists (`after_ok`, `after_fail`,
//! `after_any`) and `sweep`: their types and parsers. What they mean for
//! a waiting job, and how a sweep expands, is [`crate::chain`]'s.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::JobId;

/// Most jobs one dependency list may name, and most members of a sweep.
pub const MAX_DEPENDENCIES: usize = 256;
pub const MAX_SWEEP_JOBS: usize = 1000;
pub const MAX_SWEEP_PARAMS: usize = 8;

/// `after_ok` / `after_fail` / `after_any` of a descriptor.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dependencies {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_ok: Vec<JobId>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_fail: Vec<JobId>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_any: Vec<JobId>,
}

impl Dependencies {
    pub fn is_empty(&self) -> bool {
        self.after_ok.is_empty() && self.after_fail.is_empty() && self.after_any.is_empty()
    }

    /// Every id named, once.
    pub fn all(&self) -> BTreeSet<&JobId> {
        self.after_ok
            .iter()
            .chain(&self.after_fail)
            .chain(&self.after_any)
            .collect()
    }
}

/// `"sweep": {"lr": [0.1, 0.01], "bs": [32, 64]}`, values as the text
/// substituted for `{lr}`, in the order the file gives them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sweep {
    pub params: Vec<(String, Vec<String>)>,
    #[serde(default)]
    pub max_parallel: Option<u32>,
}

/// Parses a dependency list field (an array of job or sweep ids).
pub fn parse_id_list(field: &str, v: &Value) -> Result<Vec<JobId>, String> {
    let Value::Array(items) = v else {
        return Err(format!(
            "field `{field}` must be an array of job ids, like [\"prep\"]"
        ));
    };
    if items.len() > MAX_DEPENDENCIES {
        return Err(format!(
            "field `{field}` names {} jobs; at most {MAX_DEPENDENCIES}",
            items.len()
        ));
    }
    let mut out: Vec<JobId> = Vec::new();
    for item in items {
        let Value::String(s) = item else {
            return Err(format!("field `{field}` must list job ids as strings"));
        };
        let id = JobId::parse(s).map_err(|e| format!("field `{field}`: {e}"))?;
        if !out.contains(&id) {
            out.push(id);
        }
    }
    Ok(out)
}

/// Parses `sweep` (and `max_parallel`).
pub fn parse_sweep(v: &Value, max_parallel: Option<&Value>) -> Result<Sweep, String> {
    let Value::Object(map) = v else {
        return Err(
            "field `sweep` must be an object of parameter lists, like {\"lr\": [0.1, 0.01]}".into(),
        );
    };
    if map.is_empty() || map.len() > MAX_SWEEP_PARAMS {
        return Err(format!(
            "field `sweep` must have 1 to {MAX_SWEEP_PARAMS} parameters"
        ));
    }
    let mut params = Vec::new();
    let mut total: usize = 1;
    for (name, values) in map {
        let valid_name = name.len() <= 32
            && name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_name {
            let shown: String = name.chars().take(40).collect();
            return Err(format!(
                "sweep parameter {shown:?} is not a valid name; use letters, digits and '_' (it becomes `{{name}}`)"
            ));
        }
        let Value::Array(values) = values else {
            return Err(format!(
                "sweep parameter `{name}` must be an array of values"
            ));
        };
        if values.is_empty() {
            return Err(format!("sweep parameter `{name}` has no values"));
        }
        let mut texts = Vec::new();
        for value in values {
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => {
                    return Err(format!(
                        "sweep parameter `{name}` values must be strings, numbers or booleans"
                    ))
                }
            };
            if text.is_empty() || text.len() > 256 {
                return Err(format!(
                    "sweep parameter `{name}` has an empty or over-long value"
                ));
            }
            texts.push(text);
        }
        total = total.saturating_mul(texts.len());
        if total > MAX_SWEEP_JOBS {
            return Err(format!(
                "field `sweep` expands to more than {MAX_SWEEP_JOBS} jobs; split it"
            ));
        }
        params.push((name.clone(), texts));
    }
    let max_parallel = match max_parallel {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|n| (1..=MAX_SWEEP_JOBS as u64).contains(n))
                .ok_or("field `max_parallel` must be a whole number from 1 up")? as u32,
        ),
    };
    Ok(Sweep {
        params,
        max_parallel,
    })
}
