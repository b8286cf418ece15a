//! The fields that let a script save its work before ptrain or its
//! timeout ends it: `checkpoint_signal` (what to send), `checkpoint_lead`
//! (how long before the end) and `stop_grace` (SIGTERM to SIGKILL). Pure
//! validation; the state task sends the signal ([`crate::daemon`]'s
//! checkpoint timers) and the unit carries the grace.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `checkpoint_lead` when the job names a signal but no lead: Slurm's
/// default for `--signal`.
pub const DEFAULT_CHECKPOINT_LEAD: Duration = Duration::from_secs(60);
/// Longest `checkpoint_lead`: a stop that ptrain makes waits this long
/// for the checkpoint while the job keeps its GPUs.
pub const MAX_CHECKPOINT_LEAD: Duration = Duration::from_secs(3600);
/// Longest `stop_grace` any job may have (an admin may allow less,
/// `[jobs] max_stop_grace`): a job that ignores SIGTERM keeps its GPUs
/// this long.
pub const MAX_STOP_GRACE: Duration = Duration::from_secs(600);

/// The signals a script may ask for: those a process can catch and that
/// mean nothing else to systemd or the kernel's job control. SIGKILL and
/// SIGSTOP cannot be caught; SIGCHLD, SIGPIPE, SIGSEGV and the like mean
/// something else to the process that gets them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckpointSignal {
    #[serde(rename = "SIGHUP")]
    Hup,
    #[serde(rename = "SIGINT")]
    Int,
    #[serde(rename = "SIGQUIT")]
    Quit,
    #[serde(rename = "SIGUSR1")]
    Usr1,
    #[serde(rename = "SIGUSR2")]
    Usr2,
    #[serde(rename = "SIGALRM")]
    Alrm,
    #[serde(rename = "SIGTERM")]
    Term,
    #[serde(rename = "SIGWINCH")]
    Winch,
}

const SIGNALS: [(CheckpointSignal, &str, i32); 8] = [
    (CheckpointSignal::Hup, "SIGHUP", libc::SIGHUP),
    (CheckpointSignal::Int, "SIGINT", libc::SIGINT),
    (CheckpointSignal::Quit, "SIGQUIT", libc::SIGQUIT),
    (CheckpointSignal::Usr1, "SIGUSR1", libc::SIGUSR1),
    (CheckpointSignal::Usr2, "SIGUSR2", libc::SIGUSR2),
    (CheckpointSignal::Alrm, "SIGALRM", libc::SIGALRM),
    (CheckpointSignal::Term, "SIGTERM", libc::SIGTERM),
    (CheckpointSignal::Winch, "SIGWINCH", libc::SIGWINCH),
];

impl CheckpointSignal {
    pub fn name(self) -> &'static str {
        SIGNALS.iter().find(|(s, ..)| *s == self).expect("listed").1
    }

    /// The number `KillUnit` takes.
    pub fn number(self) -> i32 {
        SIGNALS.iter().find(|(s, ..)| *s == self).expect("listed").2
    }

    /// "SIGUSR1", "USR1" or "usr1".
    fn parse(s: &str) -> Option<CheckpointSignal> {
        let upper = s.trim().to_ascii_uppercase();
        let name = upper.strip_prefix("SIG").unwrap_or(&upper);
        SIGNALS
            .iter()
            .find(|(_, full, _)| full[3..] == *name)
            .map(|(s, ..)| *s)
    }
}

/// A job's checkpoint request, as stored with its spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub signal: CheckpointSignal,
    #[serde(with = "super::retry::humantime_serde_secs")]
    pub lead: Duration,
}

/// A duration field: a humantime string or whole seconds, more than 0
/// and at most `max`. The message names the field and how to write it.
fn duration_field(field: &str, v: &Value, max: Duration) -> Result<Duration, String> {
    let d = match v {
        Value::String(s) => humantime::parse_duration(s.trim()).map_err(|e| {
            format!(
                "field `{field}` {} is not a duration ({e}); write e.g. \"5m\" or a whole number of seconds",
                super::quote(s)
            )
        })?,
        Value::Number(n) => n.as_u64().map(Duration::from_secs).ok_or_else(|| {
            format!("field `{field}` {n} is not a whole, non-negative number of seconds; write e.g. \"5m\" or 300")
        })?,
        other => {
            return Err(format!(
                "field `{field}` must be a duration, not {}; write e.g. \"5m\"",
                super::shown(other)
            ))
        }
    };
    if d.is_zero() || d > max {
        return Err(format!(
            "field `{field}` must be more than 0 and at most {}, not {}; pick a duration in that range",
            humantime::format_duration(max),
            super::shown(v)
        ));
    }
    Ok(d)
}

/// `checkpoint_signal` and `checkpoint_lead`, validated against the job's
/// `timeout`: `None` when the job asks for no signal.
pub fn validate(
    signal: Option<&Value>,
    lead: Option<&Value>,
    timeout: Option<Duration>,
) -> Result<Option<Checkpoint>, String> {
    let Some(signal) = signal else {
        if lead.is_some() {
            return Err("field `checkpoint_lead` applies only with a `checkpoint_signal`; add e.g. \"checkpoint_signal\": \"SIGUSR1\" or drop it".into());
        }
        return Ok(None);
    };
    let names = || {
        SIGNALS
            .iter()
            .map(|(_, name, _)| *name)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let signal = match signal {
        Value::String(s) => CheckpointSignal::parse(s).ok_or_else(|| {
            format!(
                "field `checkpoint_signal` {} is not a signal a job can catch and ptrain sends; write one of {}",
                super::quote(s),
                names()
            )
        })?,
        other => {
            return Err(format!(
                "field `checkpoint_signal` must be a signal name, not {}; write one of {}",
                super::shown(other),
                names()
            ))
        }
    };
    let lead = match lead {
        None => DEFAULT_CHECKPOINT_LEAD,
        Some(v) => duration_field("checkpoint_lead", v, MAX_CHECKPOINT_LEAD)?,
    };
    if let Some(timeout) = timeout {
        if lead >= timeout {
            return Err(format!(
                "field `checkpoint_lead` ({}) is not shorter than the `timeout` ({}): the signal would come before the job starts; pick a shorter lead",
                humantime::format_duration(lead),
                humantime::format_duration(timeout)
            ));
        }
    }
    Ok(Some(Checkpoint { signal, lead }))
}

/// `stop_grace`: more than 0, at most [`MAX_STOP_GRACE`] (admission
/// holds it to the host's `[jobs] max_stop_grace`).
pub fn validate_stop_grace(v: &Value) -> Result<Duration, String> {
    duration_field("stop_grace", v, MAX_STOP_GRACE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn signals_are_named_with_or_without_sig_and_only_catchable_ones() {
        for (written, signal) in [
            ("SIGUSR1", CheckpointSignal::Usr1),
            ("USR2", CheckpointSignal::Usr2),
            ("sigterm", CheckpointSignal::Term),
            (" SIGINT ", CheckpointSignal::Int),
        ] {
            let c = validate(Some(&json!(written)), None, None)
                .unwrap()
                .unwrap();
            assert_eq!(c.signal, signal, "{written}");
            assert_eq!(c.lead, DEFAULT_CHECKPOINT_LEAD);
        }
        assert_eq!(CheckpointSignal::Usr1.number(), libc::SIGUSR1);
        assert_eq!(CheckpointSignal::Usr1.name(), "SIGUSR1");
        for bad in [
            json!("SIGKILL"),
            json!("SIGSTOP"),
            json!("SIGSEGV"),
            json!("SIG"),
            json!(""),
            json!(10),
            json!("SIGUSR1\u{7f}"),
        ] {
            let e = validate(Some(&bad), None, None).unwrap_err();
            assert!(
                e.contains("field `checkpoint_signal`") && e.contains("SIGUSR1"),
                "{bad}: {e}"
            );
            assert!(!e.contains('\u{7f}'), "{e}");
        }
    }

    #[test]
    fn a_lead_is_bounded_shorter_than_the_timeout_and_needs_a_signal() {
        let sig = json!("SIGUSR1");
        let lead = |v: Value, timeout: Option<u64>| {
            validate(Some(&sig), Some(&v), timeout.map(Duration::from_secs))
        };
        assert_eq!(
            lead(json!("5m"), Some(3600)).unwrap().unwrap().lead,
            Duration::from_secs(300)
        );
        assert_eq!(
            lead(json!(30), None).unwrap().unwrap().lead,
            Duration::from_secs(30)
        );
        for (bad, timeout, says) in [
            (json!("0s"), None, "more than 0"),
            (json!(-5), None, "whole"),
            (json!("2h"), None, "at most 1h"),
            (json!("soon"), None, "not a duration"),
            (json!("10m"), Some(600), "not shorter than the `timeout`"),
        ] {
            let e = lead(bad.clone(), timeout).unwrap_err();
            assert!(
                e.contains("field `checkpoint_lead`") && e.contains(says),
                "{bad}: {e}"
            );
        }
        let e = validate(None, Some(&json!("5m")), None).unwrap_err();
        assert!(e.contains("add e.g. \"checkpoint_signal\""), "{e}");
    }

    #[test]
    fn a_stop_grace_is_bounded() {
        assert_eq!(
            validate_stop_grace(&json!("2m")),
            Ok(Duration::from_secs(120))
        );
        for bad in [json!("0s"), json!("11m"), json!(true)] {
            let e = validate_stop_grace(&bad).unwrap_err();
            assert!(e.contains("field `stop_grace`"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_stored_form_reads_back() {
        let c = Checkpoint {
            signal: CheckpointSignal::Usr1,
            lead: Duration::from_secs(300),
        };
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(json, r#"{"signal":"SIGUSR1","lead":"5m"}"#);
        assert_eq!(serde_json::from_str::<Checkpoint>(&json).unwrap(), c);
    }
}
