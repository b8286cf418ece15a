//! The descriptor's `gpus` field: a count, or an object that asks for GPUs
//! with properties. Kept apart from the rest of the descriptor because it is
//! the one field with structure of its own.
//!
//! ```json
//! "gpus": 2
//! "gpus": {"count": 2, "model": "A100", "min_memory": "40GiB"}
//! "gpus": {"count": 1, "min_free_memory_mib": 20000, "indices": [2, 3]}
//! "gpus": {"uuids": ["GPU-8f2c...", "GPU-11ab..."]}
//! ```

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::{quote, SpecError, MAX_GPUS};

/// Highest GPU index a job may name (NVML counts from 0; no machine has
/// this many).
pub const MAX_GPU_INDEX: u32 = 1023;
/// Largest memory figure accepted (16 TiB), so arithmetic never overflows.
pub const MAX_MEMORY_MIB: u64 = 1 << 24;
const MAX_MODEL_LEN: usize = 96;
const MAX_UUID_LEN: usize = 96;

/// The keys the object form accepts, in documentation order.
pub const GPUS_FIELDS: &[&str] = &[
    "count",
    "min_free_memory_mib",
    "min_memory",
    "model",
    "indices",
    "uuids",
];

/// What a job asks of its GPUs. `count == 0` is a CPU job; the other fields
/// are only ever set with `count > 0`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuRequest {
    pub count: u32,
    /// Each chosen GPU has at least this much free memory when the job
    /// starts (its total memory less what other programs use).
    pub min_free_memory_mib: Option<u64>,
    /// A case-insensitive substring of the GPU's name, e.g. "A100".
    pub model: Option<String>,
    /// Choose only among these GPUs.
    pub only: Option<GpuSelector>,
}

/// GPUs named explicitly, by NVML index or by UUID.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuSelector {
    Indices(Vec<u32>),
    Uuids(Vec<String>),
}

impl GpuRequest {
    /// A plain count: any `n` GPUs.
    pub fn any(n: u32) -> GpuRequest {
        GpuRequest {
            count: n,
            ..GpuRequest::default()
        }
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// Only a count: no property asked for.
    pub fn is_plain(&self) -> bool {
        self.min_free_memory_mib.is_none() && self.model.is_none() && self.only.is_none()
    }

    /// Whether `uuid` is one this job may be given, as far as the selector
    /// says (GPU UUIDs compare case-insensitively).
    pub fn selects(&self, index: u32, uuid: &str) -> bool {
        match &self.only {
            None => true,
            Some(GpuSelector::Indices(v)) => v.contains(&index),
            Some(GpuSelector::Uuids(v)) => v.iter().any(|u| u.eq_ignore_ascii_case(uuid)),
        }
    }

    /// Whether a GPU named `name` is of the asked model.
    pub fn model_matches(&self, name: &str) -> bool {
        self.model
            .as_ref()
            .is_none_or(|m| name.to_lowercase().contains(&m.to_lowercase()))
    }

    /// For people: "2 GPUs (model \"A100\", ≥ 40960 MiB free, among 0,1,2)".
    pub fn describe(&self) -> String {
        let mut s = match self.count {
            1 => "1 GPU".to_owned(),
            n => format!("{n} GPUs"),
        };
        let mut props = Vec::new();
        if let Some(m) = &self.model {
            props.push(format!("model {m:?}"));
        }
        if let Some(mib) = self.min_free_memory_mib {
            props.push(format!("at least {mib} MiB free"));
        }
        match &self.only {
            Some(GpuSelector::Indices(v)) => props.push(format!(
                "among GPUs {}",
                v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
            )),
            Some(GpuSelector::Uuids(v)) => props.push(format!("among {}", v.join(","))),
            None => {}
        }
        if !props.is_empty() {
            s.push_str(&format!(" ({})", props.join(", ")));
        }
        s
    }
}

/// Stored form: a bare number when only a count was asked for, so records
/// of plain jobs read the same as before the object form existed.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Stored {
    Count(u32),
    Full(StoredFull),
}

#[derive(Serialize, Deserialize)]
struct StoredFull {
    count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min_free_memory_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    only: Option<GpuSelector>,
}

impl Serialize for GpuRequest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.is_plain() {
            return Stored::Count(self.count).serialize(s);
        }
        Stored::Full(StoredFull {
            count: self.count,
            min_free_memory_mib: self.min_free_memory_mib,
            model: self.model.clone(),
            only: self.only.clone(),
        })
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for GpuRequest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Stored::deserialize(d)? {
            Stored::Count(n) => GpuRequest::any(n),
            Stored::Full(f) => GpuRequest {
                count: f.count,
                min_free_memory_mib: f.min_free_memory_mib,
                model: f.model,
                only: f.only,
            },
        })
    }
}

fn bad(field: &str, message: impl Into<String>) -> SpecError {
    SpecError::GpusRequest {
        field: field.to_owned(),
        message: message.into(),
    }
}

fn describe_value(v: &Value) -> String {
    match v {
        Value::String(s) => quote(s),
        Value::Number(n) => n.to_string(),
        other => super::kind(other).to_owned(),
    }
}

/// Validates the raw `gpus` value (never `null`: that means absent).
pub(super) fn validate_gpus(v: &Value) -> Result<GpuRequest, SpecError> {
    match v {
        Value::Number(n) => match n.as_u64() {
            Some(k) if k <= u64::from(MAX_GPUS) => Ok(GpuRequest::any(k as u32)),
            _ => Err(SpecError::GpusInvalid {
                found: n.to_string(),
            }),
        },
        Value::Object(map) => validate_object(map),
        Value::String(s) => Err(SpecError::GpusInvalid { found: quote(s) }),
        other => Err(SpecError::GpusInvalid {
            found: super::kind(other).to_owned(),
        }),
    }
}

fn validate_object(map: &Map<String, Value>) -> Result<GpuRequest, SpecError> {
    if let Some(key) = map.keys().find(|k| !GPUS_FIELDS.contains(&k.as_str())) {
        return Err(bad(
            "gpus",
            format!(
                "has an unknown key {}; it accepts {}; check the spelling or remove it",
                quote(key),
                GPUS_FIELDS
                    .iter()
                    .map(|f| format!("`{f}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let get = |k: &str| map.get(k).filter(|v| !v.is_null());

    let count = get("count")
        .map(|v| match v.as_u64() {
            Some(k) if (1..=u64::from(MAX_GPUS)).contains(&k) => Ok(k as u32),
            _ => Err(bad(
                "gpus.count",
                format!(
                    "must be a whole number from 1 to {MAX_GPUS}, not {}; write e.g. \"count\": 2 \
                     (a job without GPUs omits `gpus`)",
                    describe_value(v)
                ),
            )),
        })
        .transpose()?;

    let min_mib = get("min_free_memory_mib")
        .map(|v| match v.as_u64() {
            Some(m) if (1..=MAX_MEMORY_MIB).contains(&m) => Ok(m),
            _ => Err(bad(
                "gpus.min_free_memory_mib",
                format!(
                    "must be a whole number of MiB from 1 to {MAX_MEMORY_MIB}, not {}; write e.g. 40960",
                    describe_value(v)
                ),
            )),
        })
        .transpose()?;
    let min_memory = get("min_memory").map(parse_memory).transpose()?;
    let min_free_memory_mib = match (min_mib, min_memory) {
        (Some(_), Some(_)) => {
            return Err(bad(
                "gpus.min_memory",
                "and `gpus.min_free_memory_mib` say the same thing; keep one of them",
            ))
        }
        (a, b) => a.or(b),
    };

    let model = get("model")
        .map(|v| match v {
            Value::String(s)
                if !s.trim().is_empty()
                    && s.chars().count() <= MAX_MODEL_LEN
                    && !s.chars().any(char::is_control) =>
            {
                Ok(s.trim().to_owned())
            }
            other => Err(bad(
                "gpus.model",
                format!(
                    "must be part of a GPU name as `ptrain gpus` shows it (1 to {MAX_MODEL_LEN} characters), \
                     not {}; write e.g. \"model\": \"A100\"",
                    describe_value(other)
                ),
            )),
        })
        .transpose()?;

    let only = match (get("indices"), get("uuids")) {
        (Some(_), Some(_)) => {
            return Err(bad(
                "gpus.indices",
                "and `gpus.uuids` both name GPUs; name them one way, by index or by UUID",
            ))
        }
        (Some(v), None) => Some(GpuSelector::Indices(validate_indices(v)?)),
        (None, Some(v)) => Some(GpuSelector::Uuids(validate_uuids(v)?)),
        (None, None) => None,
    };
    let listed = match &only {
        Some(GpuSelector::Indices(v)) => Some(v.len()),
        Some(GpuSelector::Uuids(v)) => Some(v.len()),
        None => None,
    };
    let count = match (count, listed) {
        (Some(c), Some(n)) if c as usize > n => {
            return Err(bad(
                "gpus.count",
                format!("is {c} but only {n} GPU(s) are listed; list more GPUs or lower the count"),
            ))
        }
        (Some(c), _) => c,
        // Naming GPUs without a count asks for all of them.
        (None, Some(n)) => n as u32,
        (None, None) => {
            return Err(bad(
                "gpus.count",
                "is missing; say how many GPUs, e.g. {\"count\": 2, \"model\": \"A100\"}",
            ))
        }
    };
    Ok(GpuRequest {
        count,
        min_free_memory_mib,
        model,
        only,
    })
}

fn validate_indices(v: &Value) -> Result<Vec<u32>, SpecError> {
    let hint = "write e.g. \"indices\": [0, 1] as `ptrain gpus` numbers them";
    let Value::Array(items) = v else {
        return Err(bad(
            "gpus.indices",
            format!(
                "must be an array of GPU indices, not {}; {hint}",
                describe_value(v)
            ),
        ));
    };
    if items.is_empty() || items.len() > MAX_GPUS as usize {
        return Err(bad(
            "gpus.indices",
            format!("must list 1 to {MAX_GPUS} GPUs; {hint}"),
        ));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let index = match item.as_u64() {
            Some(k) if k <= u64::from(MAX_GPU_INDEX) => k as u32,
            _ => {
                return Err(bad(
                    &format!("gpus.indices[{i}]"),
                    format!(
                        "must be a GPU index from 0 to {MAX_GPU_INDEX}, not {}; {hint}",
                        describe_value(item)
                    ),
                ))
            }
        };
        if out.contains(&index) {
            return Err(bad(
                &format!("gpus.indices[{i}]"),
                format!("repeats GPU {index}; list each GPU once"),
            ));
        }
        out.push(index);
    }
    Ok(out)
}

fn validate_uuids(v: &Value) -> Result<Vec<String>, SpecError> {
    let hint =
        "write e.g. \"uuids\": [\"GPU-8f2c...\"] as `nvidia-smi -L` or `ptrain gpus` shows them";
    let Value::Array(items) = v else {
        return Err(bad(
            "gpus.uuids",
            format!(
                "must be an array of GPU UUIDs, not {}; {hint}",
                describe_value(v)
            ),
        ));
    };
    if items.is_empty() || items.len() > MAX_GPUS as usize {
        return Err(bad(
            "gpus.uuids",
            format!("must list 1 to {MAX_GPUS} GPUs; {hint}"),
        ));
    }
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let uuid = match item {
            Value::String(s)
                if !s.is_empty()
                    && s.len() <= MAX_UUID_LEN
                    && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') =>
            {
                s.clone()
            }
            other => {
                return Err(bad(
                    &format!("gpus.uuids[{i}]"),
                    format!(
                        "must be a GPU UUID (letters, digits and `-`), not {}; {hint}",
                        describe_value(other)
                    ),
                ))
            }
        };
        if out.iter().any(|u| u.eq_ignore_ascii_case(&uuid)) {
            return Err(bad(
                &format!("gpus.uuids[{i}]"),
                format!("repeats {}; list each GPU once", quote(&uuid)),
            ));
        }
        out.push(uuid);
    }
    Ok(out)
}

/// `min_memory`: a number of MiB, or a size with a unit ("40GiB", "40G",
/// "512MiB", "1.5T"). Units are binary whatever their spelling, as GPU
/// memory is.
fn parse_memory(v: &Value) -> Result<u64, SpecError> {
    let hint = "write e.g. \"min_memory\": \"40GiB\" or a number of MiB";
    let mib = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => {
            let t = s.trim();
            let split = t
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(t.len());
            let (num, unit) = t.split_at(split);
            let factor: Option<u64> = match unit.trim().to_ascii_lowercase().as_str() {
                "" | "m" | "mb" | "mib" => Some(1),
                "g" | "gb" | "gib" => Some(1024),
                "t" | "tb" | "tib" => Some(1024 * 1024),
                _ => None,
            };
            let value = num
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && !num.is_empty());
            match (value, factor) {
                (Some(x), Some(f)) => {
                    let m = (x * f as f64).ceil();
                    (m <= MAX_MEMORY_MIB as f64).then_some(m as u64)
                }
                _ => None,
            }
        }
        _ => None,
    };
    match mib {
        Some(m) if (1..=MAX_MEMORY_MIB).contains(&m) => Ok(m),
        _ => Err(bad(
            "gpus.min_memory",
            format!(
                "must be a size from 1 MiB to 16 TiB, not {}; {hint}",
                describe_value(v)
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(v: Value) -> GpuRequest {
        validate_gpus(&v).unwrap_or_else(|e| panic!("{v}: {e}"))
    }

    fn err(v: Value) -> String {
        match validate_gpus(&v) {
            Ok(r) => panic!("{v} was accepted as {r:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn count_form() {
        assert_eq!(ok(json!(0)), GpuRequest::any(0));
        assert_eq!(ok(json!(3)).count(), 3);
        assert!(ok(json!(3)).is_plain());
        assert!(err(json!(65)).contains("field `gpus`"));
    }

    #[test]
    fn object_form() {
        let r = ok(json!({"count": 2, "model": " A100 ", "min_memory": "40GiB"}));
        assert_eq!(r.count(), 2);
        assert_eq!(r.model.as_deref(), Some("A100"));
        assert_eq!(r.min_free_memory_mib, Some(40 * 1024));
        assert!(!r.is_plain());
        assert!(r.model_matches("NVIDIA A100-SXM4-80GB"));
        assert!(r.model_matches("nvidia a100"));
        assert!(!r.model_matches("NVIDIA H100 80GB HBM3"));

        let r = ok(json!({"count": 1, "min_free_memory_mib": 20000, "indices": [3, 1]}));
        assert_eq!(r.min_free_memory_mib, Some(20000));
        assert_eq!(r.only, Some(GpuSelector::Indices(vec![3, 1])));
        assert!(r.selects(1, "x") && r.selects(3, "x") && !r.selects(0, "x"));

        // Listing GPUs without a count asks for all of them.
        let r = ok(json!({"uuids": ["GPU-aa", "GPU-BB"]}));
        assert_eq!(r.count(), 2);
        assert!(r.selects(9, "gpu-bb") && !r.selects(0, "GPU-cc"));
        assert_eq!(ok(json!({"indices": [0]})).count(), 1);

        for (text, mib) in [
            ("512", 512),
            ("512MiB", 512),
            ("512 M", 512),
            ("1.5G", 1536),
            ("2T", 2 * 1024 * 1024),
            ("80gb", 80 * 1024),
        ] {
            assert_eq!(
                ok(json!({"count": 1, "min_memory": text})).min_free_memory_mib,
                Some(mib),
                "{text}"
            );
        }
        assert_eq!(
            ok(json!({"count": 1, "min_memory": 100})).min_free_memory_mib,
            Some(100)
        );
        // null members mean absent, as at the top level.
        assert_eq!(ok(json!({"count": 1, "model": null})), GpuRequest::any(1));
    }

    #[test]
    fn object_errors_name_the_key_and_fix() {
        let cases = [
            (json!({}), "`gpus.count`"),
            (json!({"count": 0}), "`gpus.count`"),
            (json!({"count": 65}), "`gpus.count`"),
            (json!({"count": "2"}), "`gpus.count`"),
            (json!({"count": 1, "colour": 1}), "\"colour\""),
            (json!({"count": 1, "modle": "A100"}), "`model`"),
            (json!({"count": 1, "model": ""}), "`gpus.model`"),
            (json!({"count": 1, "model": 100}), "`gpus.model`"),
            (json!({"count": 1, "model": "a\nb"}), "`gpus.model`"),
            (
                json!({"count": 1, "min_memory": "lots"}),
                "`gpus.min_memory`",
            ),
            (
                json!({"count": 1, "min_memory": "40 PB"}),
                "`gpus.min_memory`",
            ),
            (json!({"count": 1, "min_memory": "0G"}), "`gpus.min_memory`"),
            (json!({"count": 1, "min_memory": "."}), "`gpus.min_memory`"),
            (json!({"count": 1, "min_memory": -1}), "`gpus.min_memory`"),
            (
                json!({"count": 1, "min_memory": "99999T"}),
                "`gpus.min_memory`",
            ),
            (
                json!({"count": 1, "min_memory": "1G", "min_free_memory_mib": 1}),
                "`gpus.min_memory`",
            ),
            (
                json!({"count": 1, "min_free_memory_mib": 0}),
                "`gpus.min_free_memory_mib`",
            ),
            (
                json!({"count": 1, "min_free_memory_mib": 1.5}),
                "`gpus.min_free_memory_mib`",
            ),
            (json!({"indices": []}), "`gpus.indices`"),
            (json!({"indices": 1}), "`gpus.indices`"),
            (json!({"indices": [0, 0]}), "`gpus.indices[1]`"),
            (json!({"indices": [0, -1]}), "`gpus.indices[1]`"),
            (json!({"indices": [5000]}), "`gpus.indices[0]`"),
            (json!({"count": 3, "indices": [0, 1]}), "`gpus.count`"),
            (json!({"uuids": ["GPU a"]}), "`gpus.uuids[0]`"),
            (json!({"uuids": ["GPU-a", "gpu-A"]}), "`gpus.uuids[1]`"),
            (json!({"uuids": "GPU-a"}), "`gpus.uuids`"),
            (
                json!({"indices": [0], "uuids": ["GPU-a"]}),
                "`gpus.indices`",
            ),
        ];
        for (v, needle) in cases {
            let msg = err(v.clone());
            assert!(msg.contains(needle), "{v}: {msg:?} should name {needle}");
            assert!(msg.contains(';'), "{v}: {msg:?} should say how to fix it");
        }
    }

    #[test]
    fn stored_form_round_trips_and_reads_old_records() {
        // Records written when `gpus` was a bare count still load.
        let old: GpuRequest = serde_json::from_str("2").unwrap();
        assert_eq!(old, GpuRequest::any(2));
        assert_eq!(serde_json::to_string(&GpuRequest::any(2)).unwrap(), "2");
        for r in [
            GpuRequest::any(0),
            ok(json!({"count": 2, "model": "A100", "min_memory": "40G"})),
            ok(json!({"indices": [1, 2]})),
            ok(json!({"uuids": ["GPU-a"]})),
        ] {
            let text = serde_json::to_string(&r).unwrap();
            assert_eq!(
                serde_json::from_str::<GpuRequest>(&text).unwrap(),
                r,
                "{text}"
            );
        }
    }

    #[test]
    fn describe_for_people() {
        assert_eq!(GpuRequest::any(1).describe(), "1 GPU");
        assert_eq!(
            ok(json!({"count": 2, "model": "A100", "min_free_memory_mib": 100, "indices": [0, 1, 2]}))
                .describe(),
            "2 GPUs (model \"A100\", at least 100 MiB free, among GPUs 0,1,2)"
        );
    }
}
