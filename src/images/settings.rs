//! `[images]` of ptrain.toml: how big the image store may grow, how long
//! an unused image stays, which registries are reached over plain http,
//! and how big one image may be unpacked (pure: [`crate::config`] loads
//! it, the daemon applies it).

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Deserialize;

use super::catalog::GcPolicy;
use super::reference::{Digest, ImageReference};
use crate::setting::InvalidSetting;

/// `[images] max_size` by default: the store's whole size.
pub const DEFAULT_MAX_SIZE: u64 = 100 << 30;
/// `[images] max_unused` by default.
pub const DEFAULT_MAX_UNUSED: Duration = Duration::from_secs(30 * 86_400);
/// `[images] max_image_size` by default: files of one image, unpacked.
pub const DEFAULT_MAX_IMAGE_SIZE: u64 = 64 << 30;

/// `[images]` as written in ptrain.toml.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawImagesConfig {
    max_size: Option<SizeValue>,
    max_unused: Option<String>,
    insecure_registries: Option<Vec<String>>,
    max_image_size: Option<SizeValue>,
    auth_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

/// `[images]`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImagesConfig {
    /// The store is collected down to this many bytes, least recently
    /// used images first (`None`: "off", no size limit).
    pub max_size: Option<u64>,
    /// An image no job used for this long is removed (`None`: "off" or
    /// "0s", no age limit).
    pub max_unused: Option<Duration>,
    /// Registries (`host[:port]`, as image references name them) reached
    /// over plain http (loopback ones only when listed too).
    pub insecure_registries: BTreeSet<String>,
    /// The most bytes of files one image may unpack to, all its layers
    /// together.
    pub max_image_size: u64,
    /// The admin's registry credentials, lent to every job
    /// ([`super::auth`]; root's, mode 0600).
    pub auth_file: std::path::PathBuf,
}

impl Default for ImagesConfig {
    fn default() -> Self {
        ImagesConfig {
            max_size: Some(DEFAULT_MAX_SIZE),
            max_unused: Some(DEFAULT_MAX_UNUSED),
            insecure_registries: BTreeSet::new(),
            max_image_size: DEFAULT_MAX_IMAGE_SIZE,
            auth_file: super::auth::DEFAULT_ADMIN_FILE.into(),
        }
    }
}

fn bad(key: &str, message: String) -> InvalidSetting {
    InvalidSetting::new(format!("images.{key}"), message)
}

fn is_off(text: &str) -> bool {
    matches!(text.trim(), "off" | "none")
}

fn size(key: &str, value: SizeValue) -> Result<u64, InvalidSetting> {
    match value {
        SizeValue::Bytes(0) => Err(bad(
            key,
            "0 is not a size; give a positive size like \"200GiB\"".into(),
        )),
        SizeValue::Bytes(b) => Ok(b),
        SizeValue::Text(t) => crate::resources::parse_size(&t).map_err(|m| bad(key, m)),
    }
}

impl RawImagesConfig {
    pub fn validate(self) -> Result<ImagesConfig, InvalidSetting> {
        let defaults = ImagesConfig::default();
        let max_size = match self.max_size {
            None => defaults.max_size,
            Some(SizeValue::Text(t)) if is_off(&t) => None,
            Some(v) => Some(size("max_size", v)?),
        };
        let max_unused = match self.max_unused.as_deref() {
            None => defaults.max_unused,
            Some(t) if is_off(t) => None,
            Some(t) => {
                let d = humantime::parse_duration(t.trim()).map_err(|e| {
                    bad(
                        "max_unused",
                        format!("{t:?} is not a duration ({e}); write e.g. \"30d\", or \"off\""),
                    )
                })?;
                Some(d).filter(|d| !d.is_zero())
            }
        };
        let max_image_size = match self.max_image_size {
            None => defaults.max_image_size,
            Some(v) => size("max_image_size", v)?,
        };
        let mut insecure_registries = BTreeSet::new();
        for (i, entry) in self
            .insecure_registries
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let key = format!("insecure_registries[{i}]");
            let names_a_registry = !entry.is_empty()
                && !entry.contains(['/', '@'])
                && ImageReference::parse(&format!("{entry}/ptrain-check"))
                    .is_ok_and(|r| r.registry == entry);
            if !names_a_registry {
                return Err(bad(
                    &key,
                    format!(
                        "{entry:?} is not a registry as image references name it; write its host and port, like \"registry.lab:5000\" (a name with a dot or a port, or localhost), without http://"
                    ),
                ));
            }
            if !insecure_registries.insert(entry.clone()) {
                return Err(bad(
                    &key,
                    format!("{entry:?} is listed twice; list it once"),
                ));
            }
        }
        let auth_file = match self.auth_file {
            None => defaults.auth_file,
            Some(path) if path.is_absolute() => path,
            Some(path) => {
                return Err(bad(
                    "auth_file",
                    format!(
                        "{} is not an absolute path; write e.g. \"/etc/ptrain/registry-auth.json\"",
                        path.display()
                    ),
                ))
            }
        };
        Ok(ImagesConfig {
            max_size,
            max_unused,
            insecure_registries,
            max_image_size,
            auth_file,
        })
    }
}

impl ImagesConfig {
    /// The collection policy, keeping the images `keep` names.
    pub fn gc_policy(&self, keep: BTreeSet<Digest>) -> GcPolicy {
        GcPolicy {
            max_total_bytes: self.max_size,
            max_unused_micros: self
                .max_unused
                .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
            keep,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ImagesConfig, InvalidSetting> {
        toml::from_str::<RawImagesConfig>(text).unwrap().validate()
    }

    #[test]
    fn defaults_sizes_durations_and_off() {
        assert_eq!(parse("").unwrap(), ImagesConfig::default());
        let c = parse(
            "max_size = \"200GiB\"\nmax_unused = \"7d\"\nmax_image_size = \"10G\"\ninsecure_registries = [\"registry.lab:5000\", \"10.0.0.5:5000\", \"localhost:5001\"]\n",
        )
        .unwrap();
        assert_eq!(c.max_size, Some(200 << 30));
        assert_eq!(c.max_unused, Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(c.max_image_size, 10 << 30);
        assert_eq!(c.insecure_registries.len(), 3);
        assert!(c.insecure_registries.contains("registry.lab:5000"));
        let c = parse("max_size = 1\nmax_unused = \"0s\"\n").unwrap();
        assert_eq!((c.max_size, c.max_unused), (Some(1), None));
        let c = parse("max_size = \"off\"\nmax_unused = \"off\"\n").unwrap();
        assert_eq!((c.max_size, c.max_unused), (None, None));
        let policy = parse("max_unused = \"1h\"")
            .unwrap()
            .gc_policy(BTreeSet::new());
        assert_eq!(policy.max_unused_micros, Some(3_600_000_000));
        assert_eq!(policy.max_total_bytes, Some(DEFAULT_MAX_SIZE));
    }

    #[test]
    fn errors_name_the_key_and_the_fix() {
        for (text, key, says) in [
            ("max_size = \"lots\"", "images.max_size", "32G"),
            ("max_size = 0", "images.max_size", "positive"),
            (
                "max_image_size = \"0G\"",
                "images.max_image_size",
                "positive",
            ),
            ("max_unused = \"a while\"", "images.max_unused", "30d"),
            (
                "insecure_registries = [\"http://registry.lab:5000\"]",
                "images.insecure_registries[0]",
                "registry.lab:5000",
            ),
            (
                "insecure_registries = [\"a.lab\", \"myregistry\"]",
                "images.insecure_registries[1]",
                "host and port",
            ),
            (
                "insecure_registries = [\"a.lab\", \"a.lab\"]",
                "images.insecure_registries[1]",
                "twice",
            ),
            (
                "insecure_registries = [\"\"]",
                "images.insecure_registries[0]",
                "host and port",
            ),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.key, key, "{text}: {e}");
            assert!(e.message.contains(says), "{text}: {e}");
        }
        assert!(toml::from_str::<RawImagesConfig>("max_sise = 1").is_err());
    }
}
