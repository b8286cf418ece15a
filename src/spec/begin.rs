//! The `begin` field: when a job may start at the earliest. Either a
//! moment (RFC 3339 with its UTC offset, `"2026-12-02T22:00:00+08:00"`)
//! or a delay after the file was written (`"2h"`, or whole seconds).
//! Until then the job is queued and holds nothing; the state task arms a
//! timer for the earliest such moment ([`super::super::daemon`]), it
//! never polls.
//!
//! A moment must carry its offset: ptraind's time zone need not be the
//! user's, and a time read in the wrong zone starts a job hours off.

use std::time::{Duration, UNIX_EPOCH};

use serde_json::Value;

/// The furthest ahead a job may be told to begin: a year, like the
/// longest `timeout`. Further is taken for a typo (a wrong year).
pub const MAX_BEGIN_AHEAD: Duration = super::MAX_TIMEOUT;

/// How far before the file was written a moment may lie and still be
/// taken (as "now"): a file written at 18:00:01 that says 18:00 means
/// 18:00, not a mistake.
pub const PAST_SLACK: Duration = Duration::from_secs(60);

/// A validated `begin`, as the job file gave it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Begin {
    /// Microseconds since the epoch.
    At(u64),
    /// After the file was written.
    After(Duration),
}

/// Parses a `begin`: a string (a moment with its offset, or a duration)
/// or whole seconds of delay. The message says what is wrong and how to
/// write it; bounds that need the clock are [`resolve`]'s.
pub fn validate_begin(v: &Value) -> Result<Begin, String> {
    let begin = match v {
        Value::String(s) => parse(s.trim())?,
        Value::Number(n) => n
            .as_u64()
            .map(|secs| Begin::After(Duration::from_secs(secs)))
            .ok_or_else(|| {
                format!("{n} is not a whole, non-negative number of seconds; write e.g. \"2h\" or 7200")
            })?,
        other => {
            return Err(format!(
                "must be a time, a delay or a number of seconds, not {}; write e.g. \"2026-12-02T22:00:00+08:00\" or \"2h\"",
                match other {
                    Value::Bool(_) => "a boolean",
                    Value::Array(_) => "an array",
                    Value::Object(_) => "an object",
                    _ => "null",
                }
            ))
        }
    };
    if let Begin::After(d) = begin {
        if d > MAX_BEGIN_AHEAD {
            return Err(format!(
                "{} is more than 365 days ahead; pick a delay within a year (e.g. \"2h\", \"3d\") or omit the field",
                super::shown(v)
            ));
        }
    }
    Ok(begin)
}

fn parse(s: &str) -> Result<Begin, String> {
    let looks_like_a_date = s.len() >= 10
        && s.as_bytes()[..4].iter().all(u8::is_ascii_digit)
        && s.as_bytes()[4] == b'-';
    if !looks_like_a_date {
        return humantime::parse_duration(s).map(Begin::After).map_err(|e| {
            format!(
                "{} is neither a time nor a delay ({e}); write e.g. \"2026-12-02T22:00:00+08:00\", \"2h\" or \"90m\"", super::quote(s)
            )
        });
    }
    let (local, offset_secs) = split_offset(s).ok_or_else(|| {
        format!(
            "{} carries no UTC offset; add one (e.g. \"2026-12-02T22:00:00+08:00\", or \"Z\" for UTC), since ptraind's time zone need not be yours", super::quote(s)
        )
    })?;
    let local = humantime::parse_rfc3339_weak(local).map_err(|e| {
        format!(
            "{} is not an RFC 3339 time ({e}); write e.g. \"2026-12-02T22:00:00+08:00\"",
            super::quote(s)
        )
    })?;
    let local_us = local
        .duration_since(UNIX_EPOCH)
        .map_err(|_| format!("{} lies before 1970; write a time to come", super::quote(s)))?
        .as_micros() as i128;
    let utc_us = local_us - i128::from(offset_secs) * 1_000_000;
    u64::try_from(utc_us)
        .map(Begin::At)
        .map_err(|_| format!("{} lies before 1970; write a time to come", super::quote(s)))
}

/// `"…Z"` or `"…±HH:MM"`: the time before the offset, and the offset in
/// seconds east of UTC.
fn split_offset(s: &str) -> Option<(&str, i32)> {
    if let Some(local) = s.strip_suffix(['Z', 'z']) {
        return Some((local, 0));
    }
    let at = s.len().checked_sub(6)?;
    let (local, offset) = (s.get(..at)?, s.get(at..)?.as_bytes());
    let sign = match offset[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let digits = |a: u8, b: u8| {
        (a.is_ascii_digit() && b.is_ascii_digit())
            .then(|| i32::from(a - b'0') * 10 + i32::from(b - b'0'))
    };
    let hours = digits(offset[1], offset[2])?;
    let minutes = digits(offset[4], offset[5])?;
    (offset[3] == b':' && hours <= 23 && minutes <= 59)
        .then_some((local, sign * (hours * 3600 + minutes * 60)))
}

/// The moment (µs) a job of this `begin` may start, for a file written
/// at `written` and claimed at `now` (µs): refused when it lies before
/// the file was written (beyond [`PAST_SLACK`]) or more than
/// [`MAX_BEGIN_AHEAD`] after now. A moment that passed while ptraind
/// was down or busy is kept: the job starts at once.
pub fn resolve(begin: Begin, written: u64, now: u64) -> Result<u64, String> {
    let written = written.min(now);
    let at = match begin {
        Begin::After(d) => written.saturating_add(d.as_micros() as u64),
        Begin::At(at) => at,
    };
    if at.saturating_add(PAST_SLACK.as_micros() as u64) < written {
        return Err(format!(
            "field `begin` says {}, which had passed when the file was written ({}); give a time to come, or a delay such as \"2h\"",
            format_moment(at),
            format_moment(written),
        ));
    }
    if at > now.saturating_add(MAX_BEGIN_AHEAD.as_micros() as u64) {
        return Err(format!(
            "field `begin` says {}, more than 365 days ahead; check the year, or omit the field",
            format_moment(at)
        ));
    }
    Ok(at)
}

/// A moment (µs since the epoch) as RFC 3339 UTC, to the second.
pub fn format_moment(us: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_micros(us)).to_string()
}

/// The stored form: a moment as RFC 3339 UTC, a delay as a duration.
pub(super) mod serde_form {
    use super::*;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Begin>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(Begin::At(us)) => s.collect_str(&humantime::format_rfc3339_micros(
                UNIX_EPOCH + Duration::from_micros(*us),
            )),
            Some(Begin::After(d)) => s.collect_str(&humantime::format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Begin>, D::Error> {
        match Option::<Value>::deserialize(d)? {
            None | Some(Value::Null) => Ok(None),
            Some(v) => validate_begin(&v)
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// Microseconds since the epoch of a file's ctime in nanoseconds (the
/// kernel's, which its owner cannot set back).
pub fn written_at(ctime_ns: i128) -> u64 {
    u64::try_from(ctime_ns / 1000).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const HOUR_US: u64 = 3_600_000_000;

    #[test]
    fn moments_carry_their_offset_and_delays_are_durations() {
        // 2026-12-02T14:00:00Z
        let utc = 1_796_220_000_000_000;
        for s in [
            "2026-12-02T14:00:00Z",
            "2026-12-02T22:00:00+08:00",
            "2026-12-02 22:00:00+08:00",
            "2026-12-02T09:30:00-04:30",
        ] {
            assert_eq!(validate_begin(&json!(s)), Ok(Begin::At(utc)), "{s}");
        }
        assert_eq!(
            validate_begin(&json!("2026-12-02T14:00:00.5Z")),
            Ok(Begin::At(utc + 500_000))
        );
        assert_eq!(
            validate_begin(&json!("2h")),
            Ok(Begin::After(Duration::from_secs(7200)))
        );
        assert_eq!(
            validate_begin(&json!(90)),
            Ok(Begin::After(Duration::from_secs(90)))
        );
    }

    #[test]
    fn bad_begins_say_how_to_write_one() {
        for (bad, says) in [
            (json!("2026-12-02T22:00:00"), "no UTC offset"),
            (json!("2026-12-02T22:00:00+8"), "no UTC offset"),
            (json!("2026-13-02T22:00:00Z"), "not an RFC 3339 time"),
            (json!("2026-12-02T22:00:00+24:00"), "no UTC offset"),
            (json!("tomorrow"), "neither a time nor a delay"),
            (json!("400d"), "365 days"),
            (json!(-5), "whole, non-negative"),
            (json!(1.5), "whole, non-negative"),
            (json!(true), "a boolean"),
            (json!("1960-01-01T00:00:00Z"), "not an RFC 3339 time"),
        ] {
            let e = validate_begin(&bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
            assert!(
                e.contains("write") || e.contains("add") || e.contains("pick"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_begin_resolves_against_when_the_file_was_written() {
        let written = 1_000 * HOUR_US;
        let now = written + HOUR_US;
        // A delay counts from the write, even when the claim came later.
        assert_eq!(
            resolve(Begin::After(Duration::from_secs(7200)), written, now),
            Ok(written + 2 * HOUR_US)
        );
        // A moment that passed while ptraind was busy starts at once.
        assert_eq!(
            resolve(Begin::At(written + 1), written, now),
            Ok(written + 1)
        );
        // Within the slack of the write it is "now"; beyond, a mistake.
        assert!(resolve(Begin::At(written - 59_000_000), written, now).is_ok());
        let e = resolve(Begin::At(written - HOUR_US), written, now).unwrap_err();
        assert!(
            e.contains("field `begin`") && e.contains("had passed"),
            "{e}"
        );
        // A year past now is a typo.
        let e = resolve(Begin::At(now + 366 * 24 * HOUR_US), written, now).unwrap_err();
        assert!(e.contains("365 days"), "{e}");
        // A ctime in the future (a clock set back) counts as now.
        assert_eq!(
            resolve(Begin::After(Duration::from_secs(1)), now + HOUR_US, now),
            Ok(now + 1_000_000)
        );
    }

    #[test]
    fn the_stored_form_reads_back() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct S {
            #[serde(default, with = "serde_form")]
            begin: Option<Begin>,
        }
        for begin in [
            None,
            Some(Begin::At(1_796_220_000_123_456)),
            Some(Begin::After(Duration::from_secs(5400))),
        ] {
            let json = serde_json::to_string(&S { begin }).unwrap();
            assert_eq!(
                serde_json::from_str::<S>(&json).unwrap(),
                S { begin },
                "{json}"
            );
        }
    }
}
