//! Human-readable pieces of the tables and sentences: times, durations,
//! sizes, and cutting text to the terminal.

use std::io::IsTerminal;
use std::time::Duration;

use ptrain::views::JobView;

/// The terminal's width when stdout is one; tables are then cut to fit.
pub(crate) fn terminal_width() -> Option<usize> {
    if !std::io::stdout().is_terminal() {
        return None;
    }
    // SAFETY: TIOCGWINSZ fills a winsize; a zeroed one is a valid start.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) };
    if rc == 0 && size.ws_col > 0 {
        return Some(usize::from(size.ws_col));
    }
    std::env::var("COLUMNS").ok()?.parse().ok()
}

/// A table's last, free-length column, cut to what is left of the
/// terminal after `used` columns (never below 12 characters). Whole when
/// stdout is not a terminal, so pipes and scripts see everything.
pub(crate) fn last_column(text: &str, used: usize, width: Option<usize>) -> String {
    match width {
        Some(width) => truncate(text, width.saturating_sub(used).max(12)),
        None => text.to_owned(),
    }
}

/// MiB in human units: "512 MiB", "80 GiB", "1.5 GiB".
pub(crate) fn human_mib(mib: u64) -> String {
    if mib < 1024 {
        return format!("{mib} MiB");
    }
    let gib = mib as f64 / 1024.0;
    let text = format!("{gib:.1}");
    format!("{} GiB", text.strip_suffix(".0").unwrap_or(&text))
}

pub(crate) fn truncate(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(width.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

pub(crate) fn format_time(micros: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_micros(micros);
    humantime::format_rfc3339_seconds(t).to_string()
}

pub(crate) fn format_duration(micros: u64) -> String {
    humantime::format_duration(Duration::from_secs(micros / 1_000_000)).to_string()
}

pub(crate) fn duration_of(job: &JobView) -> Option<u64> {
    let start = job.started_at?;
    let end = job.ended_at.unwrap_or_else(ptrain::now_micros);
    Some(end.saturating_sub(start))
}

pub(crate) fn humansize(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_human_units() {
        assert_eq!(human_mib(512), "512 MiB");
        assert_eq!(human_mib(81920), "80 GiB");
        assert_eq!(human_mib(1536), "1.5 GiB");
    }

    #[test]
    fn last_column_fits_the_terminal_only_on_one() {
        let detail = "waiting for pipe-prep, pipe-train and pipe-eval to succeed";
        assert_eq!(last_column(detail, 92, None), detail, "pipes see it whole");
        let cut = last_column(detail, 92, Some(120));
        assert_eq!(cut.chars().count(), 28);
        assert!(cut.ends_with('…'), "{cut}");
        assert_eq!(last_column(detail, 92, Some(80)).chars().count(), 12);
    }
}
