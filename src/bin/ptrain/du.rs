//! `ptrain du`: the log archive's retention policy and usage.

use std::time::Duration;

use ptrain::display::escape;

use crate::human::{format_time, humansize, truncate};
use crate::{from_bus, parse, print_json, proxy, Failure};

/// `ptrain du`: the archive's retention policy and what it uses.
pub(crate) async fn du(json: bool) -> Result<u8, Failure> {
    let usage: ptrain::logs::archive::LogUsage =
        parse(&proxy().await?.log_usage().await.map_err(from_bus)?)?;
    if json {
        print_json(&usage);
        return Ok(0);
    }
    let size = |b: u64| humansize(b);
    let p = &usage.policy;
    let limit =
        |v: Option<u64>, f: &dyn Fn(u64) -> String| v.map(f).unwrap_or_else(|| "none".into());
    outln!(
        "log archive: {} ({})",
        usage.log_dir,
        if usage.archive {
            "on"
        } else {
            "off: [logs] archive = false"
        }
    );
    outln!(
        "policy:      max_age {}, max_total_size {}, max_count {}, per user: max_total_size {}, max_count {}; min_free {}",
        limit(p.max_age_secs, &|s| humantime::format_duration(Duration::from_secs(s)).to_string()),
        limit(p.max_total_bytes, &size),
        limit(p.max_count, &|n| n.to_string()),
        limit(p.user_max_total_bytes, &size),
        limit(p.user_max_count, &|n| n.to_string()),
        match p.min_free {
            ptrain::logs::retention::MinFree::Bytes(b) => size(b),
            ptrain::logs::retention::MinFree::Percent(pct) => format!("{pct}%"),
            ptrain::logs::retention::MinFree::PercentAtMost(pct, cap) => {
                format!("{pct}% (at most {})", size(cap))
            }
        }
    );
    outln!("archives:    {} using {}", usage.count, size(usage.bytes));
    if let Some(d) = usage.disk {
        outln!(
            "disk:        {} free of {}",
            size(d.avail_bytes),
            size(d.total_bytes)
        );
    }
    if !usage.users.is_empty() {
        outln!("{:<16} {:>8} {:>10}  OLDEST", "USER", "ARCHIVES", "SIZE");
        for u in &usage.users {
            outln!(
                "{:<16} {:>8} {:>10}  {}",
                truncate(
                    &escape(&u.user.clone().unwrap_or_else(|| u.uid.to_string())),
                    16
                ),
                u.count,
                size(u.bytes),
                u.oldest.map(format_time).unwrap_or_else(|| "-".into())
            );
        }
    }
    Ok(0)
}
