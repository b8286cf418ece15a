//! Retry timing and the classification of answers. Pure: values in,
//! decisions out; the sender supplies `now` and the jitter.

use std::time::Duration;

use tokio::time::Instant;

/// Exponential backoff with jitter, a cap and a total lifetime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// How long after an intent is recorded (or re-sent by root) the sender
    /// keeps trying before it gives the notification up as dead.
    pub lifetime: Duration,
}

impl RetryPolicy {
    /// The longest wait after `failures` failed attempts (1 or more):
    /// `initial * 2^(failures-1)`, capped.
    pub fn ceiling(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(32);
        self.initial_backoff
            .checked_mul(1u32 << doublings.min(31))
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff)
    }

    /// The wait after `failures` failures, with "equal jitter": between half
    /// the ceiling and the ceiling, so retries of many notifications spread
    /// out but never come sooner than half the nominal backoff.
    /// `jitter` is in [0, 1).
    pub fn delay(&self, failures: u32, jitter: f64) -> Duration {
        let ceiling = self.ceiling(failures);
        let jitter = jitter.clamp(0.0, 1.0);
        ceiling / 2 + ceiling.mul_f64(jitter * 0.5)
    }

    /// When to try again after `failures` failures, or `None` to give up:
    /// the lifetime ends at `deadline`. The last try is made at the
    /// deadline itself rather than dropped when the backoff overshoots it.
    pub fn next_attempt(
        &self,
        failures: u32,
        jitter: f64,
        now: Instant,
        deadline: Instant,
    ) -> Option<Instant> {
        if now >= deadline {
            return None;
        }
        Some((now + self.delay(failures, jitter)).min(deadline))
    }
}

/// A random number in [0, 1) for jitter. Std's hasher is seeded randomly
/// per `RandomState`, which is all the randomness jitter needs.
pub fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(crate::now_micros());
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// What one attempt came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Delivered,
    /// Worth trying again: the endpoint may recover (the reason).
    Retry(String),
    /// A definite rejection: trying again would get the same (the reason).
    Dead(String),
}

/// An HTTP status from a webhook. 2xx is delivered; 408, 425, 429 and 5xx
/// may pass; other 4xx are the endpoint saying no.
pub fn classify_http(status: u16) -> Verdict {
    match status {
        200..=299 => Verdict::Delivered,
        408 | 425 | 429 => Verdict::Retry(format!("HTTP {status} (try later)")),
        500..=599 => Verdict::Retry(format!("HTTP {status} (server error)")),
        300..=399 => Verdict::Dead(format!(
            "HTTP {status}: the endpoint redirects; configure the final URL"
        )),
        _ => Verdict::Dead(format!(
            "HTTP {status}: the endpoint refused the request; check the channel's url, token and secret"
        )),
    }
}

/// WeCom codes that mean "too fast" or "busy": try again later.
const WECOM_RETRY: &[i64] = &[-1, 45009, 45033];
/// "invalid webhook url": the key is wrong or the robot was removed.
const WECOM_BAD_URL: i64 = 93000;

/// A WeCom robot's answer: HTTP 200 with `{"errcode": N, "errmsg": "..."}`.
pub fn classify_wecom(status: u16, body: &[u8]) -> Verdict {
    if !(200..=299).contains(&status) {
        return classify_http(status);
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        errcode: i64,
        #[serde(default)]
        errmsg: String,
    }
    let Ok(answer) = serde_json::from_slice::<Answer>(body) else {
        // Not the robot (a proxy's page?): it may come back.
        return Verdict::Retry("HTTP 200 without a WeCom errcode".into());
    };
    let msg: String = answer.errmsg.chars().take(200).collect();
    match answer.errcode {
        0 => Verdict::Delivered,
        code if WECOM_RETRY.contains(&code) => Verdict::Retry(format!(
            "WeCom errcode {code} (rate limited or busy): {msg}"
        )),
        WECOM_BAD_URL => Verdict::Dead(format!(
            "WeCom errcode {WECOM_BAD_URL} (invalid webhook url): check the robot's key"
        )),
        code => Verdict::Dead(format!("WeCom errcode {code}: {msg}")),
    }
}

/// An SMTP failure: permanent (5xx replies) is dead, the rest (4xx replies,
/// connection and TLS trouble, timeouts) is retried.
pub fn classify_smtp(permanent: bool, reason: String) -> Verdict {
    if permanent {
        Verdict::Dead(reason)
    } else {
        Verdict::Retry(reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            initial_backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(60),
            lifetime: Duration::from_secs(3600),
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p = policy();
        let ceilings: Vec<u64> = (1..=6).map(|n| p.ceiling(n).as_secs()).collect();
        assert_eq!(ceilings, [5, 10, 20, 40, 60, 60]);
        assert_eq!(p.ceiling(1000), Duration::from_secs(60));
        assert_eq!(p.ceiling(0), Duration::from_secs(5));
    }

    #[test]
    fn jitter_keeps_the_delay_between_half_and_full_ceiling() {
        let p = policy();
        for n in 1..10 {
            let c = p.ceiling(n);
            assert_eq!(p.delay(n, 0.0), c / 2);
            assert!(p.delay(n, 0.999_999) <= c);
            assert!(p.delay(n, 0.5) > c / 2);
        }
        for _ in 0..1000 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j), "{j}");
        }
    }

    #[test]
    fn gives_up_at_the_deadline_with_one_last_try_on_it() {
        let p = policy();
        let now = Instant::now();
        let deadline = now + Duration::from_secs(7);
        assert_eq!(
            p.next_attempt(1, 0.0, now, deadline),
            Some(now + Duration::from_millis(2500))
        );
        // The backoff overshoots: the last try is at the deadline.
        assert_eq!(p.next_attempt(3, 0.0, now, deadline), Some(deadline));
        assert_eq!(p.next_attempt(3, 0.0, deadline, deadline), None);
        assert_eq!(
            p.next_attempt(1, 0.0, deadline + Duration::from_secs(1), deadline),
            None
        );
    }

    #[test]
    fn http_statuses() {
        assert_eq!(classify_http(200), Verdict::Delivered);
        assert_eq!(classify_http(204), Verdict::Delivered);
        for s in [408, 425, 429, 500, 502, 503, 504] {
            assert!(matches!(classify_http(s), Verdict::Retry(_)), "{s}");
        }
        for s in [301, 400, 401, 403, 404, 410, 422] {
            assert!(matches!(classify_http(s), Verdict::Dead(_)), "{s}");
        }
        let Verdict::Dead(why) = classify_http(400) else {
            panic!()
        };
        assert!(why.contains("400") && why.contains("check"), "{why}");
    }

    #[test]
    fn wecom_answers() {
        assert_eq!(
            classify_wecom(200, br#"{"errcode":0,"errmsg":"ok"}"#),
            Verdict::Delivered
        );
        assert!(matches!(
            classify_wecom(200, br#"{"errcode":45009,"errmsg":"api freq out of limit"}"#),
            Verdict::Retry(m) if m.contains("45009")
        ));
        assert!(matches!(
            classify_wecom(200, br#"{"errcode":93000,"errmsg":"invalid webhook url"}"#),
            Verdict::Dead(m) if m.contains("93000")
        ));
        assert!(matches!(
            classify_wecom(200, br#"{"errcode":40008,"errmsg":"invalid message type"}"#),
            Verdict::Dead(_)
        ));
        assert!(matches!(classify_wecom(200, b"<html>"), Verdict::Retry(_)));
        assert!(matches!(classify_wecom(502, b""), Verdict::Retry(_)));
        assert!(matches!(classify_wecom(404, b""), Verdict::Dead(_)));
    }

    #[test]
    fn smtp() {
        assert!(matches!(
            classify_smtp(true, "550".into()),
            Verdict::Dead(_)
        ));
        assert!(matches!(
            classify_smtp(false, "421".into()),
            Verdict::Retry(_)
        ));
    }
}
