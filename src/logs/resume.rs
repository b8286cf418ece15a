//! Resuming `ptrain logs -f` after ptraind restarted, without repeating
//! or losing a line. The pipe carries no timestamps, so the client
//! remembers what it printed lately ([`Printed`]), reopens the output from
//! a time that no printed line outside that memory can be at or after
//! ([`Printed::resume_from`]), and skips the reopened stream's lines that
//! it already printed ([`Overlap`]).
//!
//! Why it is exact: a line's journal time is never later than when the
//! client received it (journald stamps it before ptraind relays it). So a
//! line printed before the remembered ones, received at or before R, has a
//! journal time at most R, and reopening with `since_usec` = R + 1 leaves
//! it out: the reopened stream starts with a suffix of the remembered
//! lines (maybe none), then the lines never printed. A line is forgotten
//! only once a newer one was received [`MARGIN_US`] later: a line not yet
//! relayed when ptraind stopped was stamped at most that long before we
//! received the last printed one, so it is at or after R + 1 too. The
//! only ambiguity left is output that repeats itself: then the longest
//! overlap is taken (see [`Overlap`]).
//!
//! Where it is not: a reader more than [`MARGIN_US`] behind journald (a
//! pager left paused while ptraind restarts) may miss lines at the resume
//! point; so may one whose memory hit [`MAX_BYTES`] within the margin (a
//! flood of output); after `-n`, so may one whose ptraind stopped before
//! the last N lines all arrived, or whose job wrote more than N lines
//! while ptraind was being asked. Without `-n`, until the first line is
//! forgotten ([`MARGIN_US`] after it), the output is asked for from the
//! same start again, which is exact whatever the delays. Exact
//! in every case would take ptraind's journal cursor, which the pipe does
//! not carry.

use std::collections::VecDeque;

/// How much older than the newest line a remembered line must be before
/// it may be forgotten: far longer than journald → ptraind → client takes
/// while the client keeps up.
pub const MARGIN_US: u64 = 60_000_000;

/// At most this many bytes of lines are remembered (a job printing
/// faster than this per [`MARGIN_US`] has older lines forgotten sooner).
pub const MAX_BYTES: usize = 32 << 20;

/// Bookkeeping per remembered line, counted against [`MAX_BYTES`].
const LINE_OVERHEAD: usize = 40;

/// What was printed lately, with when each line started to arrive (µs
/// since the epoch).
#[derive(Default, Debug)]
pub struct Printed {
    lines: VecDeque<(Vec<u8>, u64)>,
    bytes: usize,
    /// The last line's bytes so far, when it did not end yet.
    partial: Vec<u8>,
    partial_at: u64,
    /// When the newest forgotten line arrived.
    forgotten_at: Option<u64>,
}

impl Printed {
    /// Notes `bytes` as printed, received at `now`.
    pub fn record(&mut self, mut bytes: &[u8], now: u64) {
        while !bytes.is_empty() {
            if self.partial.is_empty() {
                self.partial_at = now;
            }
            match bytes.iter().position(|&b| b == b'\n') {
                Some(end) => {
                    self.partial.extend_from_slice(&bytes[..end]);
                    let line = std::mem::take(&mut self.partial);
                    self.bytes += line.len() + LINE_OVERHEAD;
                    self.lines.push_back((line, self.partial_at));
                    bytes = &bytes[end + 1..];
                }
                None => {
                    self.partial.extend_from_slice(bytes);
                    bytes = &[];
                }
            }
        }
        let newest = self.lines.back().map_or(now, |l| l.1);
        while let Some((line, at)) = self.lines.front() {
            let old = at.saturating_add(MARGIN_US) < newest;
            if !old && self.bytes <= MAX_BYTES {
                break;
            }
            self.bytes -= line.len() + LINE_OVERHEAD;
            self.forgotten_at = Some(*at);
            self.lines.pop_front();
        }
    }

    /// Nothing was printed yet: the output can simply be asked for again.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty() && self.partial.is_empty() && self.forgotten_at.is_none()
    }

    /// The `since_usec` to reopen the output with, given the user's own
    /// `since` and, after `-n`, when the output was asked for (once
    /// something was printed, the reopened stream is asked for all lines
    /// since then). `None`: nothing printed, reopen as first asked.
    pub fn resume_from(&self, since: u64, tail_asked_at: Option<u64>) -> Option<u64> {
        if self.is_empty() {
            return None;
        }
        let from = match (self.forgotten_at, tail_asked_at) {
            (Some(at), _) => at + 1,
            // All printed lines are remembered: all of them may come again,
            // but not the older ones `-n` left out: ptraind read those
            // after it was asked, and they were written before.
            (None, Some(asked_at)) => asked_at,
            (None, None) => since,
        };
        Some(from.max(since))
    }

    /// The matcher for the stream reopened with [`Self::resume_from`].
    pub fn overlap(&self) -> Overlap {
        Overlap {
            printed: self.lines.iter().map(|l| l.0.clone()).collect(),
            partial: self.partial.clone(),
            alive: Vec::new(),
            best: 0,
            read: Vec::new(),
            pending: Vec::new(),
        }
    }
}

/// Finds where a reopened stream goes past what was printed: it starts
/// with a suffix of the remembered lines (maybe empty), and the longest
/// such suffix that is a prefix of it is taken as printed, so output that
/// repeats itself ("loss: nan" over and over) is not printed twice. A
/// line cut off by the restart counts as printed when the reopened line
/// starts with it; only its rest is printed.
///
/// Lines are held back only while a longer overlap could still match;
/// [`Overlap::push`] answers what to print once it is decided, and from
/// then on the caller prints the stream as it comes.
#[derive(Debug)]
pub struct Overlap {
    printed: Vec<Vec<u8>>,
    partial: Vec<u8>,
    /// Where in the printed lines (the cut-off one last) each overlap that
    /// still matches every line read starts.
    alive: Vec<usize>,
    /// The longest overlap matched to its end, in lines of the new stream.
    best: usize,
    read: Vec<Vec<u8>>,
    /// The new stream's line that did not end yet.
    pending: Vec<u8>,
}

impl Overlap {
    fn len(&self) -> usize {
        self.printed.len() + usize::from(!self.partial.is_empty())
    }

    fn matches(&self, i: usize, line: &[u8]) -> bool {
        match self.printed.get(i) {
            Some(p) => p == line,
            None => line.starts_with(&self.partial),
        }
    }

    /// Takes the next bytes of the reopened stream. `Some`: decided, the
    /// bytes to print now (the rest of `bytes` included); the caller
    /// prints whatever comes after as is. `None`: still held back.
    pub fn push(&mut self, mut bytes: &[u8]) -> Option<Vec<u8>> {
        while let Some(end) = bytes.iter().position(|&b| b == b'\n') {
            self.pending.extend_from_slice(&bytes[..end]);
            bytes = &bytes[end + 1..];
            let line = std::mem::take(&mut self.pending);
            if self.line(line) {
                let mut out = self.decide();
                out.extend_from_slice(bytes);
                return Some(out);
            }
        }
        self.pending.extend_from_slice(bytes);
        None
    }

    /// The reopened stream ended (the job is over) before the overlap was
    /// decided: what is left to print.
    pub fn finish(mut self) -> Vec<u8> {
        let pending = std::mem::take(&mut self.pending);
        let mut out = self.decide();
        out.extend_from_slice(&pending);
        out
    }

    /// Reads one whole line; true once no longer overlap can match.
    fn line(&mut self, line: Vec<u8>) -> bool {
        let m = self.read.len();
        let len = self.len();
        if m == 0 {
            self.alive = (0..len).collect();
        }
        let mut alive = std::mem::take(&mut self.alive);
        alive.retain(|&s| s + m < len && self.matches(s + m, &line));
        // The one starting m lines before the end has matched to its end.
        if let Some(i) = alive.iter().position(|&s| s + m + 1 == len) {
            alive.swap_remove(i);
            self.best = m + 1;
        }
        self.alive = alive;
        self.read.push(line);
        self.alive.is_empty()
    }

    fn decide(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        if !self.partial.is_empty() {
            // Without an overlap the cut-off line is not in the new
            // stream: it is ended, so what follows starts a line of its own.
            if let Some(cut) = self.best.checked_sub(1) {
                out.extend_from_slice(&self.read[cut][self.partial.len()..]);
            }
            out.push(b'\n');
        }
        for line in &self.read[self.best..] {
            out.extend_from_slice(line);
            out.push(b'\n');
        }
        self.read.clear();
        self.alive.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn printed(text: &str) -> Printed {
        let mut p = Printed::default();
        p.record(text.as_bytes(), 1_000);
        p
    }

    /// Feeds `stream` to the overlap of `before` in chunks of `chunk`
    /// bytes, as a pipe may cut it; what gets printed after `before`.
    fn resumed(before: &str, stream: &str, chunk: usize) -> String {
        let mut o = printed(before).overlap();
        let mut out = Vec::new();
        let mut decided = false;
        for piece in stream.as_bytes().chunks(chunk.max(1)) {
            if decided {
                out.extend_from_slice(piece);
            } else if let Some(now) = o.push(piece) {
                out.extend(now);
                decided = true;
            }
        }
        if !decided {
            out.extend(o.finish());
        }
        String::from_utf8(out).unwrap()
    }

    fn all_chunkings(before: &str, stream: &str, want: &str) {
        for chunk in [1, 2, 3, 7, 1000] {
            assert_eq!(
                resumed(before, stream, chunk),
                want,
                "{before:?} then {stream:?} in chunks of {chunk}"
            );
        }
    }

    #[test]
    fn a_stream_that_starts_anywhere_in_what_was_printed_goes_on_after_it() {
        all_chunkings("1\n2\n3\n", "1\n2\n3\n4\n5\n", "4\n5\n");
        all_chunkings("1\n2\n3\n", "2\n3\n4\n", "4\n");
        all_chunkings("1\n2\n3\n", "3\n4\n", "4\n");
        all_chunkings("1\n2\n3\n", "4\n5\n", "4\n5\n");
        all_chunkings("1\n2\n3\n", "", "");
        all_chunkings("1\n2\n3\n", "2\n3\n", "");
    }

    #[test]
    fn repeated_lines_are_taken_as_printed_as_far_as_they_match() {
        all_chunkings("a\na\na\n", "a\na\na\nb\n", "b\n");
        all_chunkings("a\na\na\n", "a\na\nb\n", "b\n");
        all_chunkings("x\na\na\n", "a\na\nb\n", "b\n");
        all_chunkings("a\nb\na\nb\n", "a\nb\na\nb\nc\n", "c\n");
        all_chunkings("a\nb\na\nb\n", "b\na\nb\nc\n", "c\n");
        // A stream that begins like the remembered lines but goes on
        // differently: only the suffix that matches is skipped.
        all_chunkings("1\n2\n1\n", "1\n2\n3\n", "2\n3\n");
    }

    #[test]
    fn lines_are_held_back_only_while_a_longer_overlap_may_match() {
        let mut o = printed("1\n2\n3\n").overlap();
        assert_eq!(o.push(b"2\n"), None);
        assert_eq!(o.push(b"3\n"), Some(Vec::new()));
        let mut o = printed("1\n2\n3\n").overlap();
        // Not among the printed lines: printed at once.
        assert_eq!(o.push(b"9\n"), Some(b"9\n".to_vec()));
        let mut o = printed("1\n2\n3\n").overlap();
        assert_eq!(o.push(b"2\n4\npart"), Some(b"2\n4\npart".to_vec()));
    }

    #[test]
    fn a_line_cut_off_by_the_restart_is_completed_not_repeated() {
        all_chunkings("1\n2\nhal", "1\n2\nhalf\n3\n", "f\n3\n");
        all_chunkings("1\n2\nhal", "half\n3\n", "f\n3\n");
        all_chunkings("1\n2\nhal", "2\nhalf\n", "f\n");
        // Not there: the cut-off line is ended, the rest printed.
        all_chunkings("1\n2\nhal", "3\n", "\n3\n");
    }

    #[test]
    fn resume_time_leaves_out_every_forgotten_line() {
        let mut p = Printed::default();
        assert!(p.is_empty());
        assert_eq!(p.resume_from(5, None), None);
        p.record(b"old\n", 1_000);
        p.record(b"mid\n", 2_000);
        // All remembered: asked again from the user's own since...
        assert_eq!(p.resume_from(5, None), Some(5));
        // ...except after -n: from when the output was asked for.
        assert_eq!(p.resume_from(5, Some(900)), Some(900));
        assert_eq!(p.resume_from(3_000, Some(900)), Some(3_000));
        // Lines older than the margin are forgotten once newer ones come.
        p.record(b"new\n", 2_000 + MARGIN_US + 1);
        assert_eq!(p.overlap().printed, [b"new".to_vec()]);
        assert_eq!(p.resume_from(5, None), Some(2_001));
        assert_eq!(p.resume_from(5, Some(900)), Some(2_001));
        // A line within the margin of the newest is kept.
        p.record(b"newer\n", 2_000 + 2 * MARGIN_US);
        assert_eq!(p.overlap().printed.len(), 2);
    }

    #[test]
    fn memory_is_bounded_by_bytes() {
        let mut p = Printed::default();
        let line = vec![b'x'; 1 << 20];
        for _ in 0..40 {
            p.record(&line, 1_000);
            p.record(b"\n", 1_000);
        }
        assert!(p.bytes <= MAX_BYTES);
        assert!(p.lines.len() < 40);
        assert_eq!(p.resume_from(0, None), Some(1_001));
    }

    /// A journal of stamped lines; a client that asks for them at some
    /// point, gets what was there at once and the rest late (within the
    /// margin), all in pieces; a restart anywhere, also mid-line: the
    /// client prints each line once, none left out, with or without `-n`
    /// and `--since`.
    #[test]
    fn every_restart_point_resumes_exactly() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut rand = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..2000 {
            let count = 1 + rand(400) as usize;
            // Journal times: bursts (the same µs) and gaps up to 2 s.
            let mut t = 1_000_000_000u64;
            let mut stamped = Vec::new();
            for i in 0..count {
                if rand(3) > 0 {
                    t += rand(2_000_000);
                }
                stamped.push((format!("line {i}"), t));
            }
            // Asked for when the first `history` lines were there; the
            // rest comes as it is written, late.
            let opened = match stamped.get(rand(count as u64 + 1) as usize) {
                Some(line) => line.1,
                None => t + 1,
            };
            let history = stamped.iter().filter(|l| l.1 < opened).count();
            let mut got_at = Vec::new();
            let mut last_got = opened;
            for (i, (_, t)) in stamped.iter().enumerate() {
                if i >= history {
                    last_got = (t + rand(MARGIN_US / 2)).max(last_got);
                }
                got_at.push(last_got);
            }
            let since = match rand(4) {
                0 => stamped[rand(count as u64) as usize].1,
                _ => 0,
            };
            let tail = match rand(3) {
                0 => 1 + rand(20) as usize,
                _ => 0,
            };
            let lines = |from: u64, upto: usize, tail: usize| -> Vec<usize> {
                let all: Vec<usize> = (0..upto).filter(|&i| stamped[i].1 >= from).collect();
                let keep = if tail == 0 { all.len() } else { tail };
                all[all.len().saturating_sub(keep)..].to_vec()
            };
            let mut first = lines(since, history, tail);
            let shown_at_once = first.len();
            first.extend((history..count).filter(|&i| stamped[i].1 >= since));
            let text = |ids: &[usize]| -> Vec<u8> {
                ids.iter()
                    .flat_map(|&i| format!("{}\n", stamped[i].0).into_bytes())
                    .collect()
            };
            let wire = text(&first);
            // After `-n`, a restart before its lines all arrived is the
            // one case left out (see the module's doc).
            let at_once = text(&first[..shown_at_once]).len();
            let cut = match tail {
                0 => rand(wire.len() as u64 + 1) as usize,
                _ => at_once + rand((wire.len() - at_once) as u64 + 1) as usize,
            };
            // What reached the client before ptraind stopped, in pieces,
            // each noted when its last byte came.
            let mut p = Printed::default();
            let mut sent = 0;
            while sent < cut {
                let n = (1 + rand(30) as usize).min(cut - sent);
                let done = wire[..sent + n].iter().filter(|&&b| b == b'\n').count();
                p.record(
                    &wire[sent..sent + n],
                    got_at[first[done.min(first.len() - 1)]],
                );
                sent += n;
            }
            let mut out = wire[..cut].to_vec();
            let asked_at = (tail > 0).then_some(opened);
            let stream = text(&match p.resume_from(since, asked_at) {
                None => lines(since, count, tail),
                Some(from) => lines(from, count, 0),
            });
            if p.is_empty() {
                out.extend(stream);
            } else {
                let mut o = p.overlap();
                let mut decided = false;
                for piece in stream.chunks(1 + rand(50) as usize) {
                    if decided {
                        out.extend_from_slice(piece);
                    } else if let Some(now) = o.push(piece) {
                        out.extend(now);
                        decided = true;
                    }
                }
                if !decided {
                    out.extend(o.finish());
                }
            }
            assert_eq!(
                String::from_utf8(out).unwrap(),
                String::from_utf8(wire).unwrap(),
                "round {round}: {count} lines, {history} there when asked, \
                 since {since}, tail {tail}, cut at byte {cut}"
            );
        }
    }
}
