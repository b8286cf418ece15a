//! Image references and digests, parsed the way docker and containerd
//! read them (pure).
//!
//! `ubuntu` is `docker.io/library/ubuntu:latest`; `ghcr.io/org/img:1.2`
//! names its registry because its first component has a `.`;
//! `localhost:5000/img` because of the `:`; `name@sha256:HEX` pins the
//! manifest (a tag beside a digest is kept for display, the digest wins).
//! Local sources name a transport first, as skopeo does:
//! `oci-archive:/abs/img.tar[:tag]`, `docker-archive:/abs/img.tar` (the
//! output of `docker save`), `oci:/abs/dir[:tag]`; `docker://` before a
//! registry reference is accepted and dropped.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// The registry a name without one lives on, and the host its API is on.
pub const DOCKER_HUB: &str = "docker.io";
const DOCKER_HUB_API: &str = "registry-1.docker.io";
/// docker's limit on the whole name (registry and repository).
const NAME_MAX: usize = 255;

/// A sha256 content digest (`sha256:` and 64 lowercase hex digits), the
/// only algorithm images use in practice and the only one accepted: a
/// store keyed by two algorithms could hold one blob twice.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest {
    hex: String,
}

/// Why a digest string is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    #[error("digest {0:?} is not sha256: only sha256 digests are accepted; pin the image by its sha256 digest")]
    Algorithm(String),
    #[error("digest {0:?} is malformed: write sha256: and 64 lowercase hex digits")]
    Malformed(String),
}

impl Digest {
    pub fn parse(text: &str) -> Result<Digest, DigestError> {
        let Some((algorithm, hex)) = text.split_once(':') else {
            return Err(DigestError::Malformed(text.to_string()));
        };
        if algorithm != "sha256" {
            return Err(DigestError::Algorithm(text.to_string()));
        }
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(DigestError::Malformed(text.to_string()));
        }
        Ok(Digest {
            hex: hex.to_string(),
        })
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest::from_sha256(Sha256::digest(bytes).into())
    }

    /// The digest whose sha256 output is `out`.
    pub fn from_sha256(out: [u8; 32]) -> Digest {
        Digest {
            hex: hex::encode(out),
        }
    }

    /// The 64 hex digits, the name of the blob, layer or tree on disk.
    pub fn hex(&self) -> &str {
        &self.hex
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

impl TryFrom<String> for Digest {
    type Error = DigestError;
    fn try_from(s: String) -> Result<Digest, DigestError> {
        Digest::parse(&s)
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.to_string()
    }
}

/// A parsed registry reference, normalized: `registry` is never empty
/// (`docker.io` by default), a one-component Docker Hub name has gained
/// `library/`, and `tag` is `latest` when neither tag nor digest was given.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ImageReference {
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

/// Where an image comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ImageSource {
    Registry(ImageReference),
    /// A tar of an OCI layout (`skopeo copy ... oci-archive:`, `podman
    /// save --format oci-archive`); `tag` picks the index entry whose
    /// `org.opencontainers.image.ref.name` it is.
    OciArchive {
        path: PathBuf,
        tag: Option<String>,
    },
    /// `docker save` output: `manifest.json`, the config and layer tars.
    DockerArchive {
        path: PathBuf,
    },
    /// An OCI layout directory (`oci-layout`, `index.json`, `blobs/`).
    OciLayout {
        path: PathBuf,
        tag: Option<String>,
    },
}

/// Why a reference cannot be used: the reference, what is wrong, the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("image reference {reference:?}: {problem}; {fix}")]
pub struct ReferenceError {
    pub reference: String,
    pub problem: String,
    pub fix: &'static str,
}

const FIX_NAME: &str =
    "write [REGISTRY/]NAME[:TAG][@sha256:HEX], e.g. ubuntu:24.04 or ghcr.io/org/image:1.0";

fn invalid(reference: &str, problem: impl Into<String>, fix: &'static str) -> ReferenceError {
    ReferenceError {
        reference: reference.to_string(),
        problem: problem.into(),
        fix,
    }
}

impl ImageSource {
    /// Parses a job's `image` value: a transport prefix picks a local
    /// source, anything else is a registry reference.
    pub fn parse(input: &str) -> Result<ImageSource, ReferenceError> {
        if let Some(rest) = input.strip_prefix("oci-archive:") {
            let (path, tag) = local_path_and_tag(input, rest)?;
            return Ok(ImageSource::OciArchive { path, tag });
        }
        if let Some(rest) = input.strip_prefix("docker-archive:") {
            let path = absolute_path(input, rest)?;
            return Ok(ImageSource::DockerArchive { path });
        }
        if let Some(rest) = input.strip_prefix("oci:") {
            let (path, tag) = local_path_and_tag(input, rest)?;
            return Ok(ImageSource::OciLayout { path, tag });
        }
        let registry = input.strip_prefix("docker://").unwrap_or(input);
        ImageReference::parse(registry)
            .map(ImageSource::Registry)
            .map_err(|mut e| {
                e.reference = input.to_string();
                e
            })
    }
}

impl fmt::Display for ImageSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tagged = |f: &mut fmt::Formatter<'_>, kind, path: &PathBuf, tag: &Option<String>| {
            write!(f, "{kind}:{}", path.display())?;
            match tag {
                Some(t) => write!(f, ":{t}"),
                None => Ok(()),
            }
        };
        match self {
            ImageSource::Registry(r) => r.fmt(f),
            ImageSource::OciArchive { path, tag } => tagged(f, "oci-archive", path, tag),
            ImageSource::DockerArchive { path } => write!(f, "docker-archive:{}", path.display()),
            ImageSource::OciLayout { path, tag } => tagged(f, "oci", path, tag),
        }
    }
}

fn absolute_path(input: &str, path: &str) -> Result<PathBuf, ReferenceError> {
    const FIX: &str =
        "give the absolute path of the file or directory, e.g. oci-archive:/srv/images/app.tar";
    if !path.starts_with('/') {
        return Err(invalid(input, "the path is not absolute", FIX));
    }
    if path.contains('\0') {
        return Err(invalid(input, "the path holds a NUL byte", FIX));
    }
    if path.split('/').any(|c| c == "..") {
        return Err(invalid(input, "the path goes through `..`", FIX));
    }
    Ok(PathBuf::from(path))
}

/// `/abs/path[:tag]`: a last `:` whose right side has no `/` starts a tag
/// (skopeo's rule; a file name holding `:` must then end with `:TAG` too).
fn local_path_and_tag(
    input: &str,
    rest: &str,
) -> Result<(PathBuf, Option<String>), ReferenceError> {
    match rest.rsplit_once(':') {
        Some((path, tag)) if !tag.contains('/') => {
            if !valid_tag(tag) {
                return Err(invalid(
                    input,
                    format!("{tag:?} is not a valid tag"),
                    "a tag is 1 to 128 of A-Z a-z 0-9 _ . - and does not start with . or -",
                ));
            }
            Ok((absolute_path(input, path)?, Some(tag.to_string())))
        }
        _ => Ok((absolute_path(input, rest)?, None)),
    }
}

fn valid_tag(tag: &str) -> bool {
    let b = tag.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// One path component of a repository: `[a-z0-9]+` runs joined by one
/// `.`, one `_`, `__`, or any number of `-`.
fn valid_component(c: &str) -> bool {
    let b = c.as_bytes();
    if b.is_empty() || !is_alnum_lower(b[0]) || !is_alnum_lower(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if is_alnum_lower(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !is_alnum_lower(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|s| s == b'-')) {
            return false;
        }
    }
    true
}

fn is_alnum_lower(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// `host[:port]`: DNS labels or a bracketed IPv6 address.
fn valid_domain(d: &str) -> bool {
    let (host, port) = if let Some(rest) = d.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return false;
        };
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return false;
        }
        match after {
            "" => return true,
            p => match p.strip_prefix(':') {
                Some(port) => ("", port),
                None => return false,
            },
        }
    } else {
        match d.rsplit_once(':') {
            Some((h, p)) => (h, p),
            None => (d, ""),
        }
    };
    if !port.is_empty() && (!port.bytes().all(|b| b.is_ascii_digit()) || port.len() > 5) {
        return false;
    }
    if d.contains(':') && port.is_empty() {
        return false;
    }
    if d.starts_with('[') {
        return true;
    }
    !host.is_empty()
        && host.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        })
}

impl ImageReference {
    pub fn parse(input: &str) -> Result<ImageReference, ReferenceError> {
        if input.is_empty() {
            return Err(invalid(input, "it is empty", FIX_NAME));
        }
        let (name_tag, digest) = match input.split_once('@') {
            Some((n, d)) => {
                let digest = Digest::parse(d).map_err(|e| {
                    invalid(
                        input,
                        e.to_string(),
                        "pin by sha256:HEX (64 lowercase hex digits), as `docker images --digests` shows",
                    )
                })?;
                (n, Some(digest))
            }
            None => (input, None),
        };
        let (name, tag) = match name_tag.rsplit_once(':') {
            Some((n, t)) if !t.contains('/') => {
                if !valid_tag(t) {
                    return Err(invalid(
                        input,
                        format!("{t:?} is not a valid tag"),
                        "a tag is 1 to 128 of A-Z a-z 0-9 _ . - and does not start with . or -",
                    ));
                }
                (n, Some(t.to_string()))
            }
            _ => (name_tag, None),
        };
        if name.is_empty() {
            return Err(invalid(input, "the name is empty", FIX_NAME));
        }
        // docker's splitDockerDomain: the first component names a registry
        // when it has a `.` or `:`, is `localhost`, or has an upper-case
        // letter (a repository cannot).
        let (registry, remainder) = match name.split_once('/') {
            Some((first, rest))
                if first.contains(['.', ':'])
                    || first == "localhost"
                    || first.bytes().any(|b| b.is_ascii_uppercase()) =>
            {
                (first.to_string(), rest.to_string())
            }
            _ => (DOCKER_HUB.to_string(), name.to_string()),
        };
        let registry = if registry == "index.docker.io" {
            DOCKER_HUB.to_string()
        } else {
            registry
        };
        if !valid_domain(&registry) {
            return Err(invalid(
                input,
                format!("{registry:?} is not a registry host"),
                "a registry is HOST[:PORT], e.g. ghcr.io or localhost:5000",
            ));
        }
        let repository = if registry == DOCKER_HUB && !remainder.contains('/') {
            format!("library/{remainder}")
        } else {
            remainder
        };
        for component in repository.split('/') {
            if component.bytes().any(|b| b.is_ascii_uppercase()) {
                return Err(invalid(
                    input,
                    "repository names are lower case",
                    "write the repository in lower case (a tag may hold upper case)",
                ));
            }
            if !valid_component(component) {
                return Err(invalid(
                    input,
                    format!("{component:?} is not a valid repository component"),
                    "a component is lower-case letters and digits, joined by one `.`, `_`, `__` or dashes",
                ));
            }
        }
        if registry.len() + 1 + repository.len() > NAME_MAX {
            return Err(invalid(
                input,
                format!("the name is longer than {NAME_MAX} characters"),
                "use a shorter repository name",
            ));
        }
        let tag = match (tag, &digest) {
            (None, None) => Some("latest".to_string()),
            (t, _) => t,
        };
        Ok(ImageReference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The host the registry's API answers on (Docker Hub's is not
    /// `docker.io`).
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// What goes after `/manifests/`: the digest when pinned, else the tag.
    pub fn manifest_reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".to_string(),
        }
    }
}

impl fmt::Display for ImageReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn reg(s: &str) -> ImageReference {
        ImageReference::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn docker_hub_names_gain_registry_library_and_latest() {
        let r = reg("ubuntu");
        assert_eq!(r.registry, "docker.io");
        assert_eq!(r.repository, "library/ubuntu");
        assert_eq!(r.tag.as_deref(), Some("latest"));
        assert_eq!(r.digest, None);
        assert_eq!(r.to_string(), "docker.io/library/ubuntu:latest");
        assert_eq!(r.api_host(), "registry-1.docker.io");
        assert_eq!(reg("pytorch/pytorch:2.3").repository, "pytorch/pytorch");
        assert_eq!(reg("docker.io/ubuntu").repository, "library/ubuntu");
        assert_eq!(reg("index.docker.io/ubuntu").registry, "docker.io");
        assert_eq!(
            reg("docker.io/library/ubuntu:24.04").tag.as_deref(),
            Some("24.04")
        );
    }

    #[test]
    fn the_first_component_names_a_registry_by_dot_colon_localhost_or_case() {
        let r = reg("ghcr.io/org/img:1.0");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("ghcr.io", "org/img")
        );
        assert_eq!(r.api_host(), "ghcr.io");
        let r = reg("localhost:5000/img");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("localhost:5000", "img")
        );
        assert_eq!(r.tag.as_deref(), Some("latest"));
        assert_eq!(reg("localhost/img").registry, "localhost");
        assert_eq!(reg("Registry/img").registry, "Registry");
        assert_eq!(reg("127.0.0.1:5000/a/b/c:t").repository, "a/b/c");
        assert_eq!(reg("[::1]:5000/img").registry, "[::1]:5000");
        // No dot, colon or capital: a Docker Hub user, not a host.
        let r = reg("myuser/img");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("docker.io", "myuser/img")
        );
    }

    #[test]
    fn digests_pin_and_keep_a_tag_beside_them() {
        let r = reg(&format!("alpine@sha256:{HEX}"));
        assert_eq!(r.tag, None);
        assert_eq!(r.digest.as_ref().unwrap().hex(), HEX);
        assert_eq!(r.manifest_reference(), format!("sha256:{HEX}"));
        let r = reg(&format!("localhost:5000/alpine:3@sha256:{HEX}"));
        assert_eq!(r.tag.as_deref(), Some("3"));
        assert_eq!(r.manifest_reference(), format!("sha256:{HEX}"));
        assert_eq!(
            r.to_string(),
            format!("localhost:5000/alpine:3@sha256:{HEX}")
        );
        assert_eq!(reg("alpine:3.19").manifest_reference(), "3.19");
    }

    #[test]
    fn bad_references_name_themselves_and_the_fix() {
        for (bad, words) in [
            ("", "empty"),
            ("Ubuntu", "lower case"),
            ("docker.io/Library/x", "lower case"),
            ("ubuntu:", "not a valid tag"),
            ("ubuntu:-x", "not a valid tag"),
            ("ubuntu:a/b", "not a registry host"),
            ("ubuntu@sha256:abc", "malformed"),
            ("ubuntu@md5:0123", "not sha256"),
            (
                &format!("ubuntu@sha256:{}", HEX.to_uppercase()),
                "malformed",
            ),
            ("a//b", "not a valid repository component"),
            ("a/-b", "not a valid repository component"),
            ("a/b_", "not a valid repository component"),
            ("a/b..c", "not a valid repository component"),
            ("a/b___c", "not a valid repository component"),
            ("host.io:port/x", "not a registry host"),
            ("-bad.io/x", "not a registry host"),
            ("ubuntu latest", "not a valid repository component"),
        ] {
            let err = ImageReference::parse(bad).expect_err(bad);
            let text = err.to_string();
            assert!(text.contains(&format!("{bad:?}")), "{text}");
            assert!(text.contains(words), "{bad}: {text}");
        }
        assert!(ImageReference::parse(&format!("{}/x", "a".repeat(260))).is_err());
        assert!(ImageReference::parse(&format!("x:{}", "t".repeat(129))).is_err());
        // Separators that the grammar allows.
        for good in ["a/b.c", "a/b_c", "a/b__c", "a/b---c", "a0/9b", "x:T_1.-a"] {
            reg(good);
        }
    }

    #[test]
    fn local_sources_need_an_absolute_path_and_take_an_optional_tag() {
        assert_eq!(
            ImageSource::parse("oci-archive:/srv/img.tar").unwrap(),
            ImageSource::OciArchive {
                path: "/srv/img.tar".into(),
                tag: None
            }
        );
        assert_eq!(
            ImageSource::parse("oci:/srv/layout:v2").unwrap(),
            ImageSource::OciLayout {
                path: "/srv/layout".into(),
                tag: Some("v2".into())
            }
        );
        assert_eq!(
            ImageSource::parse("docker-archive:/srv/saved.tar").unwrap(),
            ImageSource::DockerArchive {
                path: "/srv/saved.tar".into()
            }
        );
        assert_eq!(
            ImageSource::parse("oci:/srv/layout:v2")
                .unwrap()
                .to_string(),
            "oci:/srv/layout:v2"
        );
        for bad in [
            "oci-archive:img.tar",
            "oci:relative/dir",
            "docker-archive:",
            "oci:/srv/../etc",
            "oci:/srv/x:.bad",
        ] {
            let e = ImageSource::parse(bad).expect_err(bad);
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
        match ImageSource::parse("docker://ubuntu:22.04").unwrap() {
            ImageSource::Registry(r) => assert_eq!(r.to_string(), "docker.io/library/ubuntu:22.04"),
            other => panic!("{other:?}"),
        }
        let e = ImageSource::parse("docker://Bad").unwrap_err();
        assert_eq!(e.reference, "docker://Bad");
    }

    #[test]
    fn digests_parse_print_and_hash() {
        let d = Digest::parse(&format!("sha256:{HEX}")).unwrap();
        assert_eq!(d.to_string(), format!("sha256:{HEX}"));
        assert_eq!(
            Digest::of(b"").hex(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json, format!("\"sha256:{HEX}\""));
        assert_eq!(serde_json::from_str::<Digest>(&json).unwrap(), d);
        assert!(serde_json::from_str::<Digest>("\"sha512:00\"").is_err());
        assert!(Digest::parse(HEX).is_err());
    }
}
