//! Manifests, indexes and image configs (pure serde), the platform choice,
//! and what a job runs: its argv and environment from the image's config
//! and the job's own `command` and `env`, as `docker run` computes them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::reference::Digest;

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
pub const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
const DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1";

/// The manifest media types a registry is asked for, best first.
pub const MANIFEST_ACCEPT: &[&str] = &[
    OCI_INDEX,
    OCI_MANIFEST,
    DOCKER_MANIFEST_LIST,
    DOCKER_MANIFEST,
];

/// The `PATH` docker gives a container whose image sets none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A pointer to a blob: what it is, its digest and its size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl Platform {
    /// linux on this machine's architecture, in Go's names.
    pub fn host() -> Platform {
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            "powerpc64" => "ppc64le",
            other => other,
        };
        Platform {
            architecture: architecture.to_string(),
            os: "linux".to_string(),
            variant: None,
        }
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        match &self.variant {
            Some(v) => write!(f, "/{v}"),
            None => Ok(()),
        }
    }
}

/// An OCI image index or a Docker manifest list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageIndex {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
}

/// An OCI image manifest or a Docker v2 schema 2 manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Manifest {
    Index(ImageIndex),
    Image(ImageManifest),
}

/// The parts of an image config a job uses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub config: RunConfig,
    pub rootfs: RootFs,
}

/// The image's defaults for a container (docker's `ContainerConfig`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    #[serde(default)]
    pub env: Option<Vec<String>>,
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootFs {
    #[serde(rename = "type")]
    pub kind: String,
    pub diff_ids: Vec<Digest>,
}

/// Why a manifest or config cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("{what} is not valid JSON of its kind: {detail}; the registry or archive is serving something else (check the reference)")]
    Malformed { what: String, detail: String },
    #[error("{what} is a Docker schema 1 manifest, which is not supported; push the image again with a current docker, podman or buildah")]
    Schema1 { what: String },
    #[error("{what} has media type {media_type:?}, which is not a container image; name an image, not another kind of artifact")]
    NotAnImage { what: String, media_type: String },
    #[error("{what} has no manifest for {wanted} (it has: {available}); pull an image built for {wanted}")]
    NoPlatform {
        what: String,
        wanted: String,
        available: String,
    },
    #[error("{what}: {problem}; rebuild or re-push the image")]
    Inconsistent { what: String, problem: String },
}

/// Reads a manifest or an index. `content_type` is the registry's
/// Content-Type, used when the JSON itself has no `mediaType` (the field
/// is optional in OCI); without either the shape decides. `what` names it
/// in errors (the reference or digest).
pub fn parse_manifest(
    what: &str,
    bytes: &[u8],
    content_type: Option<&str>,
) -> Result<Manifest, ManifestError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        #[serde(default)]
        schema_version: Option<u32>,
        #[serde(default)]
        media_type: Option<String>,
        #[serde(default)]
        manifests: Option<serde_json::Value>,
        #[serde(default)]
        layers: Option<serde_json::Value>,
    }
    let malformed = |e: serde_json::Error| ManifestError::Malformed {
        what: what.to_string(),
        detail: e.to_string(),
    };
    let probe: Probe = serde_json::from_slice(bytes).map_err(malformed)?;
    // A Content-Type may carry parameters (`; charset=utf-8`).
    let header = content_type.map(|c| c.split(';').next().unwrap_or("").trim());
    let media_type = probe.media_type.as_deref().or(header).unwrap_or("");
    if probe.schema_version == Some(1) || media_type.starts_with(DOCKER_SCHEMA1) {
        return Err(ManifestError::Schema1 {
            what: what.to_string(),
        });
    }
    let is_index = match media_type {
        OCI_INDEX | DOCKER_MANIFEST_LIST => true,
        OCI_MANIFEST | DOCKER_MANIFEST => false,
        "" | "application/json" => probe.manifests.is_some() && probe.layers.is_none(),
        other => {
            return Err(ManifestError::NotAnImage {
                what: what.to_string(),
                media_type: other.to_string(),
            })
        }
    };
    if probe.schema_version != Some(2) {
        return Err(ManifestError::Malformed {
            what: what.to_string(),
            detail: "schemaVersion is not 2".to_string(),
        });
    }
    if is_index {
        Ok(Manifest::Index(
            serde_json::from_slice(bytes).map_err(malformed)?,
        ))
    } else {
        let m: ImageManifest = serde_json::from_slice(bytes).map_err(malformed)?;
        check_image_manifest(what, &m)?;
        Ok(Manifest::Image(m))
    }
}

/// The config must be an image config and every layer a tar (plain,
/// gzip or zstd): an artifact (a Helm chart, a signature) or an encrypted
/// layer is refused here, before anything is fetched.
fn check_image_manifest(what: &str, m: &ImageManifest) -> Result<(), ManifestError> {
    if !matches!(m.config.media_type.as_str(), OCI_CONFIG | DOCKER_CONFIG) {
        return Err(ManifestError::NotAnImage {
            what: what.to_string(),
            media_type: m.config.media_type.clone(),
        });
    }
    for layer in &m.layers {
        let t = layer.media_type.as_str();
        let tar = t.starts_with("application/vnd.oci.image.layer.")
            || t.starts_with("application/vnd.docker.image.rootfs.");
        if !tar || t.contains("+encrypted") {
            return Err(ManifestError::NotAnImage {
                what: format!("{what} layer {}", layer.digest),
                media_type: t.to_string(),
            });
        }
    }
    Ok(())
}

/// The entry of an index for `platform`: same os and architecture, and
/// the same variant when both name one (an `arm64` host takes `v8` or
/// none). Attestation manifests (`unknown/unknown`) never match.
pub fn choose_manifest<'a>(
    what: &str,
    index: &'a ImageIndex,
    platform: &Platform,
) -> Result<&'a Descriptor, ManifestError> {
    let fits = |d: &&Descriptor| {
        d.platform.as_ref().is_some_and(|p| {
            p.os == platform.os
                && p.architecture == platform.architecture
                && match (&p.variant, &platform.variant) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                }
        }) && matches!(d.media_type.as_str(), OCI_MANIFEST | DOCKER_MANIFEST)
    };
    if let Some(d) = index.manifests.iter().find(fits) {
        return Ok(d);
    }
    // An index without platforms and with one image in it (an OCI layout
    // written by hand, a single-image archive) is that image.
    let images: Vec<&Descriptor> = index
        .manifests
        .iter()
        .filter(|d| matches!(d.media_type.as_str(), OCI_MANIFEST | DOCKER_MANIFEST))
        .collect();
    if let [only] = images.as_slice() {
        if only.platform.is_none() {
            return Ok(only);
        }
    }
    let available: Vec<String> = index
        .manifests
        .iter()
        .filter_map(|d| d.platform.as_ref().map(|p| p.to_string()))
        .collect();
    Err(ManifestError::NoPlatform {
        what: what.to_string(),
        wanted: platform.to_string(),
        available: if available.is_empty() {
            "none named".to_string()
        } else {
            available.join(", ")
        },
    })
}

/// Reads an image config and checks it against its manifest: one diff-id
/// per layer, `rootfs.type` `layers`, os linux.
pub fn parse_config(
    what: &str,
    bytes: &[u8],
    manifest: &ImageManifest,
) -> Result<ImageConfig, ManifestError> {
    let config: ImageConfig =
        serde_json::from_slice(bytes).map_err(|e| ManifestError::Malformed {
            what: what.to_string(),
            detail: e.to_string(),
        })?;
    let inconsistent = |problem: String| ManifestError::Inconsistent {
        what: what.to_string(),
        problem,
    };
    if config.rootfs.kind != "layers" {
        return Err(inconsistent(format!(
            "rootfs.type is {:?}, not \"layers\"",
            config.rootfs.kind
        )));
    }
    if config.rootfs.diff_ids.len() != manifest.layers.len() {
        return Err(inconsistent(format!(
            "the config lists {} layers and the manifest {}",
            config.rootfs.diff_ids.len(),
            manifest.layers.len()
        )));
    }
    if !config.os.is_empty() && config.os != "linux" {
        return Err(inconsistent(format!(
            "the image is for {:?}, not linux",
            config.os
        )));
    }
    Ok(config)
}

/// The OCI ChainID of a stack of layers (bottom first): the first layer's
/// diff-id, then sha256 of "PARENT DIFFID" for each layer above. Two
/// images with the same layers in the same order share it, and so their
/// assembled tree.
pub fn chain_id(diff_ids: &[Digest]) -> Option<Digest> {
    let mut iter = diff_ids.iter();
    let mut chain = iter.next()?.clone();
    for d in iter {
        chain = Digest::of(format!("{chain} {d}").as_bytes());
    }
    Some(chain)
}

/// Why a job cannot be started from an image.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    #[error("the image sets neither Entrypoint nor Cmd and the job has no command; give the job a command")]
    NoCommand,
}

/// The job's argv, `docker run`'s rule: the image's Entrypoint is always
/// kept; the job's command, when it has one, replaces the image's Cmd;
/// without one the argv is Entrypoint followed by Cmd.
pub fn launch_argv(config: &RunConfig, job_command: &[String]) -> Result<Vec<String>, LaunchError> {
    let mut argv: Vec<String> = config.entrypoint.clone().unwrap_or_default();
    if job_command.is_empty() {
        argv.extend(config.cmd.iter().flatten().cloned());
    } else {
        argv.extend(job_command.iter().cloned());
    }
    if argv.is_empty() {
        return Err(LaunchError::NoCommand);
    }
    Ok(argv)
}

/// The job's environment: the image's `Env` first, in its order, each
/// value replaced where the job sets the same name; then the job's other
/// variables in their order. An image entry without `=` (or with an empty
/// name) is dropped, as it names no value. `PATH` is docker's default when
/// neither sets it, so an image's binaries are found the way they are
/// under docker.
pub fn merge_env(
    image_env: &[String],
    job_env: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for entry in image_env {
        let Some((name, value)) = entry.split_once('=') else {
            continue;
        };
        if name.is_empty() {
            continue;
        }
        let value = job_env.get(name).map(String::as_str).unwrap_or(value);
        match out.iter_mut().find(|(n, _)| n == name) {
            // A name twice in the image: the later value wins, at the
            // first one's place.
            Some(slot) => slot.1 = value.to_string(),
            None => out.push((name.to_string(), value.to_string())),
        }
    }
    for (name, value) in job_env {
        if !out.iter().any(|(n, _)| n == name) {
            out.push((name.clone(), value.clone()));
        }
    }
    if !out.iter().any(|(n, _)| n == "PATH") {
        out.insert(0, ("PATH".to_string(), DEFAULT_PATH.to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(n: u8) -> Digest {
        Digest::of(&[n])
    }

    fn desc(
        media_type: &str,
        n: u8,
        platform: Option<(&str, &str, Option<&str>)>,
    ) -> serde_json::Value {
        let mut v =
            serde_json::json!({"mediaType": media_type, "digest": d(n).to_string(), "size": 10});
        if let Some((os, arch, variant)) = platform {
            v["platform"] = serde_json::json!({"os": os, "architecture": arch});
            if let Some(var) = variant {
                v["platform"]["variant"] = serde_json::json!(var);
            }
        }
        v
    }

    fn manifest_json(config_type: &str, layer_type: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": DOCKER_MANIFEST,
            "config": desc(config_type, 1, None),
            "layers": [desc(layer_type, 2, None), desc(layer_type, 3, None)],
        }))
        .unwrap()
    }

    #[test]
    fn manifests_and_indexes_are_told_apart_by_type_header_or_shape() {
        let m = manifest_json(
            DOCKER_CONFIG,
            "application/vnd.docker.image.rootfs.diff.tar.gzip",
        );
        let Manifest::Image(img) = parse_manifest("m", &m, None).unwrap() else {
            panic!("not an image");
        };
        assert_eq!(img.layers.len(), 2);
        assert_eq!(img.config.digest, d(1));

        // No mediaType in the JSON: the Content-Type decides, with params.
        let index = serde_json::json!({
            "schemaVersion": 2,
            "manifests": [desc(OCI_MANIFEST, 4, Some(("linux", "amd64", None)))],
        });
        let bytes = serde_json::to_vec(&index).unwrap();
        let ct = format!("{OCI_INDEX}; charset=utf-8");
        assert!(matches!(
            parse_manifest("i", &bytes, Some(&ct)).unwrap(),
            Manifest::Index(_)
        ));
        // Neither: the shape decides.
        assert!(matches!(
            parse_manifest("i", &bytes, None).unwrap(),
            Manifest::Index(_)
        ));
    }

    #[test]
    fn schema1_artifacts_and_encrypted_layers_are_refused() {
        let s1 = br#"{"schemaVersion":1,"name":"x","tag":"y","fsLayers":[]}"#;
        let e = parse_manifest("docker.io/library/x:y", s1, None).unwrap_err();
        assert!(matches!(e, ManifestError::Schema1 { .. }), "{e}");
        assert!(e.to_string().contains("push the image again"));

        let helm = manifest_json("application/vnd.cncf.helm.config.v1+json", OCI_LAYER_TAR);
        let e = parse_manifest("chart", &helm, None).unwrap_err();
        assert!(e.to_string().contains("helm"), "{e}");

        let enc = manifest_json(
            OCI_CONFIG,
            "application/vnd.oci.image.layer.v1.tar+gzip+encrypted",
        );
        assert!(parse_manifest("enc", &enc, None).is_err());

        let e = parse_manifest("junk", b"{not json", None).unwrap_err();
        assert!(matches!(e, ManifestError::Malformed { .. }));
        let e = parse_manifest(
            "other",
            br#"{"schemaVersion":2,"mediaType":"text/html"}"#,
            None,
        )
        .unwrap_err();
        assert!(matches!(e, ManifestError::NotAnImage { .. }));
    }

    #[test]
    fn the_index_entry_for_the_platform_is_chosen() {
        let index: ImageIndex = serde_json::from_value(serde_json::json!({
            "schemaVersion": 2,
            "manifests": [
                desc(OCI_MANIFEST, 1, Some(("linux", "arm64", Some("v8")))),
                desc(OCI_MANIFEST, 2, Some(("unknown", "unknown", None))),
                desc(OCI_MANIFEST, 3, Some(("linux", "amd64", None))),
                desc(OCI_MANIFEST, 4, Some(("windows", "amd64", None))),
            ],
        }))
        .unwrap();
        let amd = Platform {
            architecture: "amd64".into(),
            os: "linux".into(),
            variant: None,
        };
        assert_eq!(choose_manifest("i", &index, &amd).unwrap().digest, d(3));
        let arm = Platform {
            architecture: "arm64".into(),
            os: "linux".into(),
            variant: Some("v8".into()),
        };
        assert_eq!(choose_manifest("i", &index, &arm).unwrap().digest, d(1));
        let riscv = Platform {
            architecture: "riscv64".into(),
            os: "linux".into(),
            variant: None,
        };
        let e = choose_manifest("docker.io/library/x:1", &index, &riscv).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("linux/riscv64") && text.contains("linux/arm64/v8"),
            "{text}"
        );

        // One image and no platform: that image.
        let single: ImageIndex = serde_json::from_value(serde_json::json!({
            "schemaVersion": 2, "manifests": [desc(OCI_MANIFEST, 7, None)],
        }))
        .unwrap();
        assert_eq!(choose_manifest("i", &single, &riscv).unwrap().digest, d(7));
        assert!(!Platform::host().architecture.is_empty());
    }

    #[test]
    fn configs_must_match_their_manifest() {
        let m = manifest_json(OCI_CONFIG, OCI_LAYER_TAR);
        let Manifest::Image(img) = parse_manifest("m", &m, None).unwrap() else {
            panic!()
        };
        let config = serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "config": {"Env": ["PATH=/bin", "A=1"], "Entrypoint": ["/init"], "Cmd": ["run"],
                       "WorkingDir": "/app", "User": "1000"},
            "rootfs": {"type": "layers", "diff_ids": [d(8).to_string(), d(9).to_string()]},
            "history": [{"created_by": "x"}],
        });
        let c = parse_config("c", &serde_json::to_vec(&config).unwrap(), &img).unwrap();
        assert_eq!(c.config.working_dir.as_deref(), Some("/app"));
        assert_eq!(c.config.user.as_deref(), Some("1000"));
        assert_eq!(c.rootfs.diff_ids, vec![d(8), d(9)]);

        let mut short = config.clone();
        short["rootfs"]["diff_ids"] = serde_json::json!([d(8).to_string()]);
        let e = parse_config("c", &serde_json::to_vec(&short).unwrap(), &img).unwrap_err();
        assert!(e.to_string().contains("1 layers and the manifest 2"), "{e}");
        let mut win = config.clone();
        win["os"] = serde_json::json!("windows");
        assert!(parse_config("c", &serde_json::to_vec(&win).unwrap(), &img).is_err());
        // A null Entrypoint (docker writes it) reads as none.
        let mut nulls = config;
        nulls["config"]["Entrypoint"] = serde_json::Value::Null;
        let c = parse_config("c", &serde_json::to_vec(&nulls).unwrap(), &img).unwrap();
        assert_eq!(c.config.entrypoint, None);
    }

    #[test]
    fn chain_ids_follow_the_oci_formula() {
        assert_eq!(chain_id(&[]), None);
        assert_eq!(chain_id(&[d(1)]), Some(d(1)));
        let two = Digest::of(format!("{} {}", d(1), d(2)).as_bytes());
        assert_eq!(chain_id(&[d(1), d(2)]), Some(two.clone()));
        let three = Digest::of(format!("{two} {}", d(3)).as_bytes());
        assert_eq!(chain_id(&[d(1), d(2), d(3)]), Some(three));
        assert_ne!(chain_id(&[d(2), d(1)]), chain_id(&[d(1), d(2)]));
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn argv_follows_docker_run() {
        let both = RunConfig {
            entrypoint: Some(strings(&["/entry", "-x"])),
            cmd: Some(strings(&["serve", "--port=1"])),
            ..RunConfig::default()
        };
        assert_eq!(
            launch_argv(&both, &[]).unwrap(),
            strings(&["/entry", "-x", "serve", "--port=1"])
        );
        assert_eq!(
            launch_argv(&both, &strings(&["train.py"])).unwrap(),
            strings(&["/entry", "-x", "train.py"])
        );
        let cmd_only = RunConfig {
            cmd: Some(strings(&["bash"])),
            ..RunConfig::default()
        };
        assert_eq!(launch_argv(&cmd_only, &[]).unwrap(), strings(&["bash"]));
        assert_eq!(
            launch_argv(&cmd_only, &strings(&["python", "t.py"])).unwrap(),
            strings(&["python", "t.py"])
        );
        assert_eq!(
            launch_argv(&RunConfig::default(), &[]),
            Err(LaunchError::NoCommand)
        );
        assert_eq!(
            launch_argv(&RunConfig::default(), &strings(&["x"])).unwrap(),
            strings(&["x"])
        );
    }

    #[test]
    fn env_is_the_image_then_the_job_which_wins() {
        let image = strings(&[
            "PATH=/opt/bin:/usr/bin",
            "LANG=C",
            "BAD",
            "=x",
            "LANG=C.UTF-8",
            "EMPTY=",
        ]);
        let job: BTreeMap<String, String> = [("LANG", "en_US.UTF-8"), ("SEED", "1"), ("A", "2")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env = merge_env(&image, &job);
        let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            pairs,
            vec![
                ("PATH", "/opt/bin:/usr/bin"),
                ("LANG", "en_US.UTF-8"),
                ("EMPTY", ""),
                ("A", "2"),
                ("SEED", "1"),
            ]
        );
        let bare = merge_env(&[], &BTreeMap::new());
        assert_eq!(bare, vec![("PATH".to_string(), DEFAULT_PATH.to_string())]);
        let job_path: BTreeMap<String, String> = [("PATH".to_string(), "/x".to_string())].into();
        assert_eq!(
            merge_env(&[], &job_path),
            vec![("PATH".to_string(), "/x".to_string())]
        );
    }
}
