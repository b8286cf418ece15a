//! What a settings section's check says when a value is wrong: the dotted
//! key and the fix. Each wing checks its own section of ptrain.toml
//! ([`crate::policy`], [`crate::resources`], [`crate::gpu`],
//! [`crate::logs`], [`crate::metrics`], [`crate::notifications`]);
//! [`crate::config`] adds the file's path
//! ([`crate::config::ConfigError::Invalid`]). Pure.

/// A value of ptrain.toml that its section refuses: `key` is dotted
/// (`limits.users.alice.memory_max`), `message` says what is wrong and how
/// to fix it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("key `{key}`: {message}")]
pub struct InvalidSetting {
    pub key: String,
    pub message: String,
}

impl InvalidSetting {
    pub fn new(key: String, message: String) -> InvalidSetting {
        InvalidSetting { key, message }
    }
}

/// A span of time written as "7d", "12h" (or seconds as text), within
/// `range`; the error names `key` and says what the span is for (`what`).
pub fn span(
    key: &str,
    text: &str,
    range: std::ops::RangeInclusive<std::time::Duration>,
    what: &str,
) -> Result<std::time::Duration, InvalidSetting> {
    let d = humantime::parse_duration(text.trim())
        .or_else(|_| {
            text.trim()
                .parse::<u64>()
                .map(std::time::Duration::from_secs)
        })
        .map_err(|_| {
            InvalidSetting::new(
                key.to_owned(),
                format!("{text:?} is not a duration; write e.g. \"7d\" or \"12h\""),
            )
        })?;
    if !range.contains(&d) {
        return Err(InvalidSetting::new(
            key.to_owned(),
            format!(
                "{} is outside {}..{}; {what}",
                span_text(d),
                span_text(*range.start()),
                span_text(*range.end())
            ),
        ));
    }
    Ok(d)
}

/// "7d", "12h", "90m", "45s": the largest unit that divides the span.
pub fn span_text(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match s {
        s if s > 0 && s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s > 0 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s > 0 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}
