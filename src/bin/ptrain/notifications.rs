//! `ptrain notifications`: the deliveries, and `retry` (root only).

use ptrain::display::escape;

use crate::human::{format_time, last_column, terminal_width};
use crate::{from_bus, parse, print_json, proxy, Failure, NotificationsAction};

pub(crate) async fn notifications(
    json: bool,
    action: Option<NotificationsAction>,
) -> Result<u8, Failure> {
    let proxy = proxy().await?;
    if let Some(NotificationsAction::Retry { key, all_dead }) = action {
        let said = proxy
            .retry_notifications(key.as_deref().unwrap_or(""), all_dead)
            .await
            .map_err(from_bus)?;
        outln!("{}", escape(&said));
        return Ok(0);
    }
    let list: Vec<ptrain::notifications::DeliveryView> =
        parse(&proxy.notifications().await.map_err(from_bus)?)?;
    if json {
        print_json(&list);
        return Ok(0);
    }
    if list.is_empty() {
        outln!("no notifications");
        return Ok(0);
    }
    // The backlog first: what each channel still owes, and for how long.
    outln!(
        "{:<24} {:>8} {:>8} {:>6} {:>9}  OLDEST WAITING",
        "CHANNEL",
        "WAITING",
        "RETRYING",
        "DEAD",
        "DELIVERED"
    );
    for b in ptrain::notifications::Backlog::of(&list) {
        outln!(
            "{:<24} {:>8} {:>8} {:>6} {:>9}  {}",
            escape(&b.channel),
            b.waiting,
            b.retrying,
            b.dead,
            b.delivered,
            b.oldest_waiting
                .map(format_time)
                .unwrap_or_else(|| "-".into())
        );
    }
    outln!();
    outln!(
        "{:<40} {:<10} {:>8} {:<20} {:<20} LAST ERROR",
        "KEY",
        "STATE",
        "ATTEMPTS",
        "LAST ATTEMPT",
        "NEXT"
    );
    let width = terminal_width();
    for d in &list {
        let time = |t: Option<u64>| t.map(format_time).unwrap_or_else(|| "-".into());
        outln!(
            "{:<40} {:<10} {:>8} {:<20} {:<20} {}",
            escape(&d.key),
            d.state.as_str(),
            d.attempts,
            time(d.last_attempt_at),
            time(d.next_attempt_at),
            // A remote server's words, and job text quoted in them.
            last_column(
                &escape(d.last_error.as_deref().unwrap_or("-")),
                40 + 10 + 8 + 20 + 20 + 5,
                width
            )
        );
    }
    let dead = list
        .iter()
        .filter(|d| d.state == ptrain::notifications::DeliveryState::Dead)
        .count();
    if dead > 0 {
        outln!("{dead} dead: fix the cause, then `ptrain notifications retry KEY` or `--all-dead`");
    }
    Ok(0)
}
