//! The fields that let a failed attempt run again under the same job id:
//! `retries` (how many more attempts), `retry_on` (which ends count),
//! `retry_delay` (the first wait; each further one doubles, up to
//! [`MAX_BACKOFF`]) and `requeue_exit_code` (the job asks to run again,
//! outside its retries). The decision is [`next_attempt`]'s, pure; the
//! state task requeues the job with that delay as its `begin`.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::job::Outcome;

/// Most `retries` one job may ask for.
pub const MAX_RETRIES: u32 = 20;
/// Most attempts of one job in all, requeues by its exit code included:
/// a job that always asks to run again stops being run.
pub const MAX_ATTEMPTS: u32 = 100;
/// `retry_delay` when the job names none.
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_secs(10);
/// The longest wait between attempts, however many came before.
pub const MAX_BACKOFF: Duration = Duration::from_secs(6 * 3600);

/// Which ends of an attempt are retried.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RetryOn {
    ExitCode(i32),
    Word(RetryWord),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetryWord {
    /// Killed by a signal (other than the OOM killer's).
    Signal,
    /// Killed by the kernel's OOM killer (systemd's `oom-kill`).
    Oom,
    TimedOut,
    IdleTimeout,
    /// Any failure of the job's own: an exit code other than 0, a signal,
    /// an OOM kill, a timeout. Never a stop by a person or ptraind.
    Any,
}

/// A job's retry policy, as stored with its spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retry {
    #[serde(default)]
    pub retries: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retry_on: Vec<RetryOn>,
    #[serde(default = "default_delay", with = "humantime_serde_secs")]
    pub retry_delay: Duration,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue_exit_code: Option<i32>,
}

fn default_delay() -> Duration {
    DEFAULT_RETRY_DELAY
}

pub(super) mod humantime_serde_secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

/// What one attempt's end leads to.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// The job ends with this attempt.
    End,
    /// It runs again as attempt `attempt + 1` after `delay`.
    Again { delay: Duration, why: String },
}

/// Whether attempt `attempt` (1-based), ended by `outcome` (with
/// systemd's word for it, `oom-kill` and the like), runs again, and after
/// how long: a requeue exit code always (within [`MAX_ATTEMPTS`]) and at
/// once; a retried failure while retries are left, after `retry_delay`
/// doubled for each retry before it.
pub fn next_attempt(
    retry: Option<&Retry>,
    outcome: &Outcome,
    systemd_result: Option<&str>,
    attempt: u32,
) -> Next {
    let Some(retry) = retry else {
        return Next::End;
    };
    if attempt >= MAX_ATTEMPTS {
        return Next::End;
    }
    if let (Some(code), Outcome::Failed { exit_code }) = (retry.requeue_exit_code, outcome) {
        if code == *exit_code {
            return Next::Again {
                delay: Duration::ZERO,
                why: format!("it exited with its requeue_exit_code {code}"),
            };
        }
    }
    // Requeues by exit code do not use up retries.
    let retried_so_far = attempt.saturating_sub(1);
    if retried_so_far >= retry.retries || !retried(retry, outcome, systemd_result) {
        return Next::End;
    }
    let doubling = 2u32.saturating_pow(retried_so_far.min(31));
    let delay = retry
        .retry_delay
        .saturating_mul(doubling)
        .min(MAX_BACKOFF.max(retry.retry_delay));
    Next::Again {
        delay,
        why: format!(
            "retry {} of {} ({})",
            retried_so_far + 1,
            retry.retries,
            outcome.describe()
        ),
    }
}

fn retried(retry: &Retry, outcome: &Outcome, systemd_result: Option<&str>) -> bool {
    let oom = systemd_result == Some("oom-kill");
    let own_failure = matches!(
        outcome,
        Outcome::Failed { .. }
            | Outcome::Killed { .. }
            | Outcome::Timeout
            | Outcome::IdleTimeout { .. }
    );
    let on_any = [RetryOn::Word(RetryWord::Any)];
    let on = if retry.retry_on.is_empty() {
        &on_any[..]
    } else {
        &retry.retry_on
    };
    on.iter().any(|when| match (when, outcome) {
        (RetryOn::Word(RetryWord::Any), _) => own_failure,
        (RetryOn::ExitCode(code), Outcome::Failed { exit_code }) => code == exit_code,
        (RetryOn::Word(RetryWord::Oom), _) => oom && own_failure,
        (RetryOn::Word(RetryWord::Signal), Outcome::Killed { .. }) => !oom,
        (RetryOn::Word(RetryWord::TimedOut), Outcome::Timeout) => true,
        (RetryOn::Word(RetryWord::IdleTimeout), Outcome::IdleTimeout { .. }) => true,
        _ => false,
    })
}

/// The descriptor's retry fields, validated: `None` when it has none.
/// Messages name the field and how to write it.
pub fn validate(
    retries: Option<&Value>,
    retry_on: Option<&Value>,
    retry_delay: Option<&Value>,
    requeue_exit_code: Option<&Value>,
) -> Result<Option<Retry>, String> {
    if retries.is_none() && requeue_exit_code.is_none() {
        if retry_on.is_some() || retry_delay.is_some() {
            return Err("fields `retry_on` and `retry_delay` apply only with `retries`; add e.g. \"retries\": 2 or drop them".into());
        }
        return Ok(None);
    }
    let retries = match retries {
        None => 0,
        Some(v) => match v.as_u64() {
            Some(n) if n <= u64::from(MAX_RETRIES) => n as u32,
            Some(n) => {
                return Err(format!(
                    "field `retries` is {n}, more than the most ptraind allows ({MAX_RETRIES}); ask for at most {MAX_RETRIES}"
                ))
            }
            None => {
                return Err(format!(
                    "field `retries` must be a whole number from 0 to {MAX_RETRIES}, not {}; write e.g. \"retries\": 2",
                    super::shown(v)
                ))
            }
        },
    };
    let retry_on = match retry_on {
        None => Vec::new(),
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .map(retry_on_item)
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(format!(
                "field `retry_on` must be a non-empty list, not {}; write e.g. \"retry_on\": [1, \"oom\", \"timed-out\"]",
                super::shown(other)
            ))
        }
    };
    let retry_delay = match retry_delay {
        None => DEFAULT_RETRY_DELAY,
        Some(v) => {
            let d = match v {
                Value::String(s) => humantime::parse_duration(s.trim()).map_err(|e| {
                    format!("field `retry_delay` {} is not a duration ({e}); write e.g. \"30s\" or \"5m\"", super::quote(s))
                })?,
                Value::Number(n) => n.as_u64().map(Duration::from_secs).ok_or_else(|| {
                    format!("field `retry_delay` {n} is not a whole number of seconds; write e.g. \"30s\" or 30")
                })?,
                other => {
                    return Err(format!(
                        "field `retry_delay` must be a duration, not {}; write e.g. \"30s\"",
                        super::shown(other)
                    ))
                }
            };
            if d > MAX_BACKOFF {
                return Err(format!(
                    "field `retry_delay` {} is longer than 6 hours; pick a shorter first wait (each later one doubles, up to 6 hours)",
                    super::shown(v)
                ));
            }
            d
        }
    };
    let requeue_exit_code = requeue_exit_code
        .map(|v| match v.as_u64() {
            Some(n @ 1..=255) => Ok(n as i32),
            _ => Err(format!(
                "field `requeue_exit_code` must be an exit code from 1 to 255, not {}; write e.g. \"requeue_exit_code\": 85",
                super::shown(v)
            )),
        })
        .transpose()?;
    if let Some(code) = requeue_exit_code {
        if retry_on.contains(&RetryOn::ExitCode(code)) {
            return Err(format!(
                "exit code {code} is both the `requeue_exit_code` and in `retry_on`; it requeues anyway, so drop it from retry_on"
            ));
        }
    }
    Ok(Some(Retry {
        retries,
        retry_on,
        retry_delay,
        requeue_exit_code,
    }))
}

fn retry_on_item(v: &Value) -> Result<RetryOn, String> {
    const WORDS: &str =
        "an exit code (1-255), \"signal\", \"oom\", \"timed-out\", \"idle-timeout\" or \"any\"";
    match v {
        Value::Number(n) => match n.as_u64() {
            Some(code @ 1..=255) => Ok(RetryOn::ExitCode(code as i32)),
            _ => Err(format!(
                "field `retry_on` holds {n}, not an exit code; each item is {WORDS}"
            )),
        },
        Value::String(s) => serde_json::from_value::<RetryWord>(v.clone())
            .map(RetryOn::Word)
            .map_err(|_| {
                format!(
                    "field `retry_on` holds {}; each item is {WORDS}",
                    super::quote(s)
                )
            }),
        other => Err(format!(
            "field `retry_on` holds {}; each item is {WORDS}",
            super::shown(other)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(fields: Value) -> Retry {
        let get = |k: &str| fields.get(k);
        validate(
            get("retries"),
            get("retry_on"),
            get("retry_delay"),
            get("requeue_exit_code"),
        )
        .unwrap()
        .unwrap()
    }

    fn again(next: Next) -> Duration {
        match next {
            Next::Again { delay, .. } => delay,
            Next::End => panic!("ended"),
        }
    }

    #[test]
    fn retries_back_off_doubling_and_end_when_used_up() {
        let r = policy(json!({"retries": 3, "retry_delay": "10s"}));
        let failed = Outcome::Failed { exit_code: 1 };
        let delays: Vec<Duration> = (1..=3)
            .map(|attempt| again(next_attempt(Some(&r), &failed, Some("exit-code"), attempt)))
            .collect();
        assert_eq!(delays, [10, 20, 40].map(Duration::from_secs));
        assert_eq!(next_attempt(Some(&r), &failed, None, 4), Next::End);
        assert_eq!(next_attempt(None, &failed, None, 1), Next::End);
        // The backoff stops growing at six hours.
        let r = policy(json!({"retries": 20, "retry_delay": "1h"}));
        assert_eq!(
            again(next_attempt(Some(&r), &failed, None, 10)),
            MAX_BACKOFF
        );
    }

    #[test]
    fn only_the_named_ends_are_retried_and_never_a_stop_or_a_success() {
        let oom = Outcome::Killed { signal: 9 };
        let cases = [
            (json!(["any"]), Outcome::Failed { exit_code: 3 }, None, true),
            (json!(["any"]), Outcome::Timeout, None, true),
            (json!(["any"]), Outcome::Succeeded, None, false),
            (json!(["any"]), Outcome::stopped_by(1000), None, false),
            (
                json!(["any"]),
                Outcome::LaunchFailed { reason: "x".into() },
                None,
                false,
            ),
            (json!([3, 4]), Outcome::Failed { exit_code: 4 }, None, true),
            (json!([3, 4]), Outcome::Failed { exit_code: 5 }, None, false),
            (json!(["oom"]), oom.clone(), Some("oom-kill"), true),
            (json!(["oom"]), oom.clone(), Some("signal"), false),
            (json!(["signal"]), oom.clone(), Some("signal"), true),
            (json!(["signal"]), oom.clone(), Some("oom-kill"), false),
            (json!(["timed-out"]), Outcome::Timeout, None, true),
            (
                json!(["idle-timeout"]),
                Outcome::IdleTimeout { idle_secs: 60 },
                None,
                true,
            ),
            (json!(["idle-timeout"]), Outcome::Timeout, None, false),
        ];
        for (on, outcome, result, retried) in cases {
            let r = policy(json!({"retries": 1, "retry_on": on}));
            let next = next_attempt(Some(&r), &outcome, result, 1);
            assert_eq!(next != Next::End, retried, "{on} {outcome:?} {result:?}");
        }
    }

    #[test]
    fn a_requeue_exit_code_runs_again_at_once_without_using_retries_up_to_the_cap() {
        let r = policy(json!({"requeue_exit_code": 85}));
        let asked = Outcome::Failed { exit_code: 85 };
        assert_eq!(
            again(next_attempt(Some(&r), &asked, None, 7)),
            Duration::ZERO
        );
        assert_eq!(
            next_attempt(Some(&r), &asked, None, MAX_ATTEMPTS),
            Next::End
        );
        assert_eq!(
            next_attempt(Some(&r), &Outcome::Failed { exit_code: 1 }, None, 1),
            Next::End
        );
    }

    #[test]
    fn bad_retry_fields_name_the_field_and_the_fix() {
        for (fields, says) in [
            (json!({"retries": 21}), "field `retries` is 21"),
            (
                json!({"retries": -1}),
                "field `retries` must be a whole number",
            ),
            (
                json!({"retries": "2"}),
                "field `retries` must be a whole number",
            ),
            (json!({"retry_on": ["oom"]}), "apply only with `retries`"),
            (json!({"retries": 1, "retry_on": []}), "non-empty list"),
            (
                json!({"retries": 1, "retry_on": ["sometimes"]}),
                "holds \"sometimes\"",
            ),
            (json!({"retries": 1, "retry_on": [0]}), "not an exit code"),
            (
                json!({"retries": 1, "retry_delay": "7h"}),
                "longer than 6 hours",
            ),
            (
                json!({"retries": 1, "retry_delay": "soon"}),
                "not a duration",
            ),
            (json!({"requeue_exit_code": 0}), "from 1 to 255"),
            (
                json!({"retries": 1, "retry_on": [85], "requeue_exit_code": 85}),
                "both",
            ),
        ] {
            let get = |k: &str| fields.get(k);
            let e = validate(
                get("retries"),
                get("retry_on"),
                get("retry_delay"),
                get("requeue_exit_code"),
            )
            .unwrap_err();
            assert!(e.contains(says), "{fields}: {e}");
            assert!(
                e.contains("write")
                    || e.contains("ask")
                    || e.contains("pick")
                    || e.contains("drop")
                    || e.contains("add")
                    || e.contains("each item"),
                "{fields}: {e}"
            );
        }
    }

    #[test]
    fn the_stored_policy_reads_back() {
        let r = policy(
            json!({"retries": 2, "retry_on": [3, "oom"], "retry_delay": "90s", "requeue_exit_code": 85}),
        );
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Retry>(&json).unwrap(), r, "{json}");
    }
}
