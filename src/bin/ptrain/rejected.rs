//! `ptrain rejected`: the job files ptraind refused, and why.

use ptrain::display::escape;
use ptrain::store::RejectRecord;

use crate::human::format_time;
use crate::{from_bus, parse, print_json, proxy, Failure};

/// `ptrain rejected`: the caller's refused job files and why (root: all).
pub(crate) async fn rejected(json: bool) -> Result<u8, Failure> {
    let list: Vec<RejectRecord> = parse(&proxy().await?.rejected().await.map_err(from_bus)?)?;
    if json {
        print_json(&list);
    } else if list.is_empty() {
        outln!("no rejected job files");
    } else {
        for r in &list {
            outln!(
                "{}  {}  {}: {}",
                format_time(r.rejected_at),
                escape(r.owner.as_deref().unwrap_or("?")),
                escape(&r.file),
                escape(&r.reason)
            );
        }
    }
    Ok(0)
}
