//! The descriptor's `notify` and `notify_on` fields: which of the admin's
//! channels a job's notifications go to, and about which events. Only the
//! form is checked here; whether a channel exists is the notifications'
//! business at ingestion.

use crate::job::NotifyEvent;

/// Most channels one job may name in `notify`.
pub const MAX_JOB_CHANNELS: usize = 16;
/// Longest channel name.
pub const MAX_CHANNEL_NAME: usize = 64;

/// `^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`: safe in a file name and in a key,
/// and without dots, so the key `JOB.EVENT.CHANNEL` splits one way only.
pub fn is_valid_channel_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_CHANNEL_NAME
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
}

/// Descriptor field `notify`: channel names the admin configured. Whether
/// they exist is checked at ingestion
/// ([`crate::notifications::check_job`]); here only the form.
pub fn parse_notify(v: &serde_json::Value) -> Result<Vec<String>, String> {
    const HINT: &str = "write e.g. \"notify\": [\"ops-wecom\", \"alice-mail\"]";
    let Some(items) = v.as_array() else {
        return Err(format!(
            "field `notify` must be an array of channel names; {HINT}"
        ));
    };
    if items.len() > MAX_JOB_CHANNELS {
        return Err(format!(
            "field `notify` names {} channels, more than the limit of {MAX_JOB_CHANNELS}; name fewer",
            items.len()
        ));
    }
    let mut names: Vec<String> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Some(name) = item.as_str() else {
            return Err(format!("field `notify[{i}]` must be a string; {HINT}"));
        };
        if !is_valid_channel_name(name) {
            let shown: String = name.chars().take(MAX_CHANNEL_NAME).collect();
            return Err(format!(
                "field `notify[{i}]` {shown:?} is not a channel name (1 to {MAX_CHANNEL_NAME} of A-Z a-z 0-9 _ -); \
                 name a channel the admin configured, never a URL or an address"
            ));
        }
        if names.iter().any(|n| n == name) {
            return Err(format!(
                "field `notify` names channel {name:?} twice; list it once"
            ));
        }
        names.push(name.to_owned());
    }
    Ok(names)
}

/// Descriptor field `notify_on`: the events to be told about.
pub fn parse_notify_on(v: &serde_json::Value) -> Result<Vec<NotifyEvent>, String> {
    let known = NotifyEvent::ALL
        .iter()
        .filter(|e| e.is_of_a_job())
        .map(|e| format!("\"{e}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let Some(items) = v.as_array() else {
        return Err(format!(
            "field `notify_on` must be an array of events ({known}); write e.g. \"notify_on\": [\"failed\", \"timeout\"]"
        ));
    };
    let mut events = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let event = item
            .as_str()
            .and_then(NotifyEvent::parse)
            .ok_or_else(|| format!("field `notify_on[{i}]` must be one of {known}"))?;
        if !event.is_of_a_job() {
            return Err(format!(
                "field `notify_on[{i}]`: \"{event}\" is no event of a job, so a job cannot ask \
                 for it; the admin sends it to a stream channel (its `events`); remove it"
            ));
        }
        if events.contains(&event) {
            return Err(format!(
                "field `notify_on` lists \"{event}\" twice; list it once"
            ));
        }
        events.push(event);
    }
    Ok(events)
}
