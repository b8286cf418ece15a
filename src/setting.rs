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
