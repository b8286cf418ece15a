//! The `idle_timeout` field, of a descriptor or of `[jobs]` in the
//! config: how long a job may write no output before ptraind stops it
//! (the watchdog is [`crate::logs`]'s).

use std::time::Duration;

use serde_json::Value;

/// Longest accepted `idle_timeout` (as for `timeout`).
pub const MAX_IDLE_TIMEOUT: Duration = super::MAX_TIMEOUT;

/// Parses an `idle_timeout` (descriptor or `[jobs]`): a duration string
/// or whole seconds, more than 0 and at most [`MAX_IDLE_TIMEOUT`]. The
/// message says what is wrong and how to write it.
pub fn validate_idle_timeout(v: &Value) -> Result<Duration, String> {
    let d = match v {
        Value::String(s) => humantime::parse_duration(s.trim()).map_err(|e| {
            format!("{s:?} is not a duration ({e}); write e.g. \"30m\", \"2h\" or a whole number of seconds")
        })?,
        Value::Number(n) => n.as_u64().map(Duration::from_secs).ok_or_else(|| {
            format!("{n} is not a whole, non-negative number of seconds; write e.g. \"30m\" or 1800")
        })?,
        other => {
            return Err(format!(
                "must be a duration string or a number of seconds, not {}; write e.g. \"30m\"",
                match other {
                    Value::Bool(_) => "a boolean",
                    Value::Array(_) => "an array",
                    Value::Object(_) => "an object",
                    _ => "null",
                }
            ))
        }
    };
    if d.is_zero() || d > MAX_IDLE_TIMEOUT {
        return Err(format!(
            "must be more than 0 and at most 365 days, not {v}; pick a duration in that range or omit the field"
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn idle_timeout_values() {
        assert_eq!(
            validate_idle_timeout(&json!("30m")),
            Ok(Duration::from_secs(1800))
        );
        assert_eq!(
            validate_idle_timeout(&json!(90)),
            Ok(Duration::from_secs(90))
        );
        for bad in [
            json!("0s"),
            json!(0),
            json!("400d"),
            json!(-1),
            json!(1.5),
            json!("soon"),
            json!(true),
        ] {
            let e = validate_idle_timeout(&bad).unwrap_err();
            assert!(e.contains("write") || e.contains("pick"), "{bad}: {e}");
        }
    }
}
