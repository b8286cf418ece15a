//! Pacing for WeCom group robots: at most N messages in any minute (20 by
//! default, the robot's limit; exceeding it blocks the robot for minutes),
//! spread evenly. Events that pile up while a robot waits for its next
//! slot go out together as one digest. Pure: the caller passes `now`.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Most events merged into one digest message; with each line bounded by
/// [`super::render`] this keeps a digest under WeCom's 4096-byte limit.
pub const MAX_DIGEST: usize = 15;

/// The robot's minute, plus a second so that network jitter between our
/// send and the robot's receipt can never put one message too many into
/// the minute the robot counts.
const WINDOW: Duration = Duration::from_secs(61);

#[derive(Clone, Debug)]
pub struct Pacer {
    per_window: usize,
    min_gap: Duration,
    /// Send times within the last window, oldest first.
    sent: VecDeque<Instant>,
}

impl Pacer {
    /// `per_minute` messages a minute, evenly spaced (3.05 s for 20).
    pub fn per_minute(per_minute: u32) -> Pacer {
        let per_minute = per_minute.max(1);
        Pacer {
            per_window: per_minute as usize,
            min_gap: WINDOW / per_minute,
            sent: VecDeque::new(),
        }
    }

    /// The earliest time the next message may go.
    pub fn next_slot(&self, now: Instant) -> Instant {
        let mut at = now;
        if let Some(last) = self.sent.back() {
            at = at.max(*last + self.min_gap);
        }
        if self.sent.len() >= self.per_window {
            // Any window of a minute holds at most `per_window` sends.
            at = at.max(self.sent[self.sent.len() - self.per_window] + WINDOW);
        }
        at
    }

    /// A message went (or was tried: the robot counts requests) at `at`.
    pub fn record(&mut self, at: Instant) {
        self.sent.push_back(at);
        while self.sent.len() > self.per_window {
            self.sent.pop_front();
        }
    }
}

/// How many of `waiting` due events the next message carries: one alone,
/// or every piled-up one (up to [`MAX_DIGEST`]) as a digest.
pub fn batch_len(waiting: usize) -> usize {
    waiting.min(MAX_DIGEST)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a pacer the way the sender does: whenever events wait and a
    /// slot is open, one message takes up to MAX_DIGEST of them.
    fn simulate(arrivals: &[Duration]) -> Vec<(Duration, usize)> {
        let start = Instant::now();
        let mut pacer = Pacer::per_minute(20);
        let mut waiting = 0usize;
        let mut next_arrival = 0;
        let mut sent = Vec::new();
        let mut now = start;
        while next_arrival < arrivals.len() || waiting > 0 {
            while next_arrival < arrivals.len() && start + arrivals[next_arrival] <= now {
                waiting += 1;
                next_arrival += 1;
            }
            if waiting > 0 && pacer.next_slot(now) <= now {
                let n = batch_len(waiting);
                waiting -= n;
                pacer.record(now);
                sent.push((now - start, n));
                continue;
            }
            let mut wake = pacer.next_slot(now);
            if waiting == 0 {
                wake = start + arrivals[next_arrival];
            } else if next_arrival < arrivals.len() {
                wake = wake.min(start + arrivals[next_arrival]);
            }
            now = wake.max(now);
        }
        sent
    }

    fn assert_at_most_20_a_minute(sent: &[(Duration, usize)]) {
        for i in 20..sent.len() {
            assert!(
                sent[i].0 - sent[i - 20].0 >= Duration::from_secs(60),
                "21 messages within a minute: {sent:?}"
            );
        }
        for w in sent.windows(2) {
            assert!(w[1].0 - w[0].0 >= Duration::from_secs(3), "{sent:?}");
        }
    }

    #[test]
    fn a_burst_of_100_goes_as_digests_nothing_lost() {
        let sent = simulate(&[Duration::ZERO; 100]);
        assert_eq!(sent.iter().map(|s| s.1).sum::<usize>(), 100);
        assert!(sent.iter().all(|s| s.1 <= MAX_DIGEST));
        assert_eq!(sent.len(), 100usize.div_ceil(MAX_DIGEST));
        assert_at_most_20_a_minute(&sent);
    }

    #[test]
    fn a_steady_stream_faster_than_the_limit_is_merged() {
        // One event a second for five minutes: 300 events, at most 20
        // messages a minute, each carrying the ones that waited.
        let arrivals: Vec<Duration> = (0..300).map(Duration::from_secs).collect();
        let sent = simulate(&arrivals);
        assert_eq!(sent.iter().map(|s| s.1).sum::<usize>(), 300);
        assert_at_most_20_a_minute(&sent);
        assert!(sent.len() <= 20 * 5 + 1, "{}", sent.len());
        // The first goes alone and at once; later ones wait at most a slot.
        assert_eq!(sent[0], (Duration::ZERO, 1));
    }

    #[test]
    fn sparse_events_go_alone_and_at_once() {
        let arrivals: Vec<Duration> = (0..5).map(|i| Duration::from_secs(10 * i)).collect();
        let sent = simulate(&arrivals);
        assert_eq!(sent, arrivals.iter().map(|a| (*a, 1)).collect::<Vec<_>>());
    }

    #[test]
    fn the_window_holds_even_with_a_smaller_gap() {
        let mut p = Pacer::per_minute(20);
        p.min_gap = Duration::ZERO;
        let t0 = Instant::now();
        for _ in 0..20 {
            assert_eq!(p.next_slot(t0), t0);
            p.record(t0);
        }
        assert_eq!(p.next_slot(t0), t0 + WINDOW);
    }
}
