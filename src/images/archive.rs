//! Local image sources into the blob store: `oci-archive:` (a tar of an
//! OCI layout), `docker-archive:` (`docker save`) and `oci:` (an OCI
//! layout directory).
//!
//! An archive is read twice, never unpacked: once to list its members
//! (name, offset, size; links resolved inside the archive by name only),
//! then each blob the image needs is read from its offset into the
//! [`BlobStore`], verified against its digest (OCI) or stored under the
//! digest its bytes have (`docker save`'s layer tars and config carry no
//! digest to check: the config's diff-ids are checked when the layers are
//! unpacked). A `docker save` image gets an OCI manifest written for it,
//! whose digest is then the image's. A layout directory is read through
//! its fd, member by member without following a symlink.
//!
//! The functions take an open file or directory: the caller opens it as
//! the user who named it, so no one imports what only root can read.
//! Blocking: run them on a blocking thread.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::{AsFd, OwnedFd};

use serde::Deserialize;

use super::blobs::{BlobError, BlobStore, FetchLimits, Fetched};
use super::manifest::{
    choose_manifest, parse_config, parse_manifest, Descriptor, ImageIndex, ImageManifest, Manifest,
    ManifestError, Platform, DOCKER_MANIFEST_LIST, OCI_CONFIG, OCI_INDEX, OCI_LAYER_TAR,
    OCI_MANIFEST,
};
use super::reference::{Digest, ImageSource};
use super::safe_fs::{self, Walk};

/// Most members an archive may list (names are kept in memory).
const MAX_MEMBERS: usize = 100_000;
/// Most symlinks followed to reach one member.
const MAX_HOPS: usize = 8;
/// The annotation that tags an entry of an OCI layout's index.
const REF_NAME: &str = "org.opencontainers.image.ref.name";

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{source_name}: {problem}; {fix}")]
    Invalid {
        source_name: String,
        problem: String,
        fix: &'static str,
    },
    #[error("{source_name}: {source}; check that the file is readable and complete")]
    Io {
        source_name: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Blob(#[from] BlobError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

const FIX_DAMAGED: &str =
    "the archive is damaged or not of this kind: write it again (skopeo copy, docker save)";

fn invalid(source_name: &str, problem: impl Into<String>, fix: &'static str) -> ArchiveError {
    ArchiveError::Invalid {
        source_name: source_name.to_string(),
        problem: problem.into(),
        fix,
    }
}

/// A member name inside an archive or layout: `/`-separated, no `..`,
/// no leading `/` or `./`.
fn member_name(raw: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for c in raw.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            c => parts.push(c),
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// Where blobs and metadata are read from.
trait Layout {
    /// The member `name`: a reader over it and its size; `None` when
    /// there is no such regular file.
    fn open(&mut self, name: &str) -> io::Result<Option<(Box<dyn Read + '_>, u64)>>;
}

enum Member {
    File { offset: u64, size: u64 },
    Link(String),
}

/// A tar archive, listed once.
struct TarLayout {
    file: File,
    members: BTreeMap<String, Member>,
}

impl TarLayout {
    fn scan(file: File, source_name: &str) -> Result<TarLayout, ArchiveError> {
        let io_err = |source| ArchiveError::Io {
            source_name: source_name.to_string(),
            source,
        };
        let mut members = BTreeMap::new();
        {
            let mut archive = tar::Archive::new(&file);
            for entry in archive.entries_with_seek().map_err(io_err)? {
                let entry = entry.map_err(io_err)?;
                if members.len() >= MAX_MEMBERS {
                    return Err(invalid(
                        source_name,
                        format!("more than {MAX_MEMBERS} members"),
                        FIX_DAMAGED,
                    ));
                }
                let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
                let Some(name) = member_name(&raw) else {
                    continue;
                };
                let kind = entry.header().entry_type();
                let member = if kind.is_file() || kind.is_contiguous() {
                    Member::File {
                        offset: entry.raw_file_position(),
                        size: entry.size(),
                    }
                } else if kind.is_symlink() || kind.is_hard_link() {
                    let target = entry
                        .link_name_bytes()
                        .map(|t| String::from_utf8_lossy(&t).into_owned())
                        .unwrap_or_default();
                    // A symlink is relative to its directory, a hard link
                    // to the archive's root; neither may leave it.
                    let joined = match (kind.is_symlink(), name.rsplit_once('/')) {
                        (true, Some((dir, _))) => format!("{dir}/{target}"),
                        _ => target,
                    };
                    match member_name(&joined) {
                        Some(t) => Member::Link(t),
                        None => continue,
                    }
                } else {
                    continue;
                };
                members.insert(name, member);
            }
        }
        Ok(TarLayout { file, members })
    }
}

impl Layout for TarLayout {
    fn open(&mut self, name: &str) -> io::Result<Option<(Box<dyn Read + '_>, u64)>> {
        let mut name = name.to_string();
        for _ in 0..=MAX_HOPS {
            match self.members.get(&name) {
                None => return Ok(None),
                Some(Member::Link(target)) => name = target.clone(),
                Some(Member::File { offset, size }) => {
                    let (offset, size) = (*offset, *size);
                    let mut file = &self.file;
                    file.seek(SeekFrom::Start(offset))?;
                    return Ok(Some((Box::new(file.take(size)), size)));
                }
            }
        }
        Ok(None)
    }
}

/// An OCI layout directory, read through its fd; with `reader`, every
/// member is opened with that user's rights (uid, gid, groups), as the
/// directory was: root never reads what the user could not.
struct DirLayout {
    dir: OwnedFd,
    reader: Option<(u32, u32, Vec<u32>)>,
}

impl Layout for DirLayout {
    fn open(&mut self, name: &str) -> io::Result<Option<(Box<dyn Read + '_>, u64)>> {
        let components: Vec<Vec<u8>> = name.split('/').map(|c| c.as_bytes().to_vec()).collect();
        let Some((file_name, parents)) = components.split_last() else {
            return Ok(None);
        };
        let open = || -> io::Result<Option<File>> {
            let Walk::Dir(dir) = safe_fs::walk(self.dir.as_fd(), parents, false, &mut |_| {})?
            else {
                return Ok(None);
            };
            safe_fs::open_file_at(dir.as_fd(), file_name).map(Some)
        };
        let opened = match &self.reader {
            Some((uid, gid, groups)) => crate::fsutil::as_user(*uid, *gid, groups, open)?,
            None => open(),
        };
        let file = match opened {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(None),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ELOOP)) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Ok(None);
        }
        Ok(Some((Box::new(file), meta.len())))
    }
}

fn read_member(
    layout: &mut dyn Layout,
    source_name: &str,
    name: &str,
    limit: u64,
) -> Result<Vec<u8>, ArchiveError> {
    let io_err = |source| ArchiveError::Io {
        source_name: source_name.to_string(),
        source,
    };
    let Some((reader, size)) = layout.open(name).map_err(io_err)? else {
        return Err(invalid(
            source_name,
            format!("it has no {name}"),
            FIX_DAMAGED,
        ));
    };
    if size > limit {
        return Err(invalid(
            source_name,
            format!("{name} is {size} bytes, over the {limit}-byte bound"),
            FIX_DAMAGED,
        ));
    }
    let mut out = Vec::new();
    reader.take(limit).read_to_end(&mut out).map_err(io_err)?;
    Ok(out)
}

/// Copies the member `name` into the store: under `expected` (verified)
/// when given, else under the digest of its bytes.
fn store_member(
    layout: &mut dyn Layout,
    blobs: &BlobStore,
    source_name: &str,
    name: &str,
    expected: Option<&Descriptor>,
    limit: u64,
) -> Result<(Digest, u64), ArchiveError> {
    if let Some(d) = expected {
        if let Some(size) = blobs.size(&d.digest) {
            return Ok((d.digest.clone(), size));
        }
    }
    let io_err = |source| ArchiveError::Io {
        source_name: source_name.to_string(),
        source,
    };
    let Some((mut reader, size)) = layout.open(name).map_err(io_err)? else {
        return Err(invalid(
            source_name,
            format!("it has no {name}"),
            FIX_DAMAGED,
        ));
    };
    let what = format!("{source_name}: {name}");
    let digest = blobs.store_from(
        what,
        &mut reader,
        expected.map(|d| d.digest.clone()),
        Some(expected.map_or(size, |d| d.size)),
        limit,
    )?;
    Ok((digest, size))
}

fn blob_name(digest: &Digest) -> String {
    format!("blobs/sha256/{}", digest.hex())
}

/// Stores the layout's blob `descriptor` names (verified against it) and
/// reads it back whole: an index, a manifest or a config.
fn store_and_read(
    layout: &mut dyn Layout,
    blobs: &BlobStore,
    source_name: &str,
    descriptor: &Descriptor,
    limit: u64,
) -> Result<Vec<u8>, ArchiveError> {
    store_member(
        layout,
        blobs,
        source_name,
        &blob_name(&descriptor.digest),
        Some(descriptor),
        limit,
    )?;
    Ok(blobs.read(&descriptor.digest, limit)?)
}

/// Reads an OCI layout (from a tar or a directory) into the store.
fn import_oci(
    layout: &mut dyn Layout,
    source_name: &str,
    tag: Option<&str>,
    blobs: &BlobStore,
    platform: &Platform,
    limits: &FetchLimits,
) -> Result<Fetched, ArchiveError> {
    let bytes = read_member(layout, source_name, "index.json", limits.max_manifest_bytes)?;
    let what = format!("{source_name}: index.json");
    let Manifest::Index(index) = parse_manifest(&what, &bytes, Some(OCI_INDEX))? else {
        return Err(invalid(
            source_name,
            "index.json is not an index",
            FIX_DAMAGED,
        ));
    };
    let entry = pick_entry(&index, source_name, tag, platform)?;
    let mut chosen = entry.clone();
    let mut nested = None;
    if matches!(chosen.media_type.as_str(), OCI_INDEX | DOCKER_MANIFEST_LIST) {
        let bytes = store_and_read(
            layout,
            blobs,
            source_name,
            &chosen,
            limits.max_manifest_bytes,
        )?;
        let what = format!("{source_name}: index {}", chosen.digest);
        let Manifest::Index(inner) = parse_manifest(&what, &bytes, Some(&chosen.media_type))?
        else {
            return Err(invalid(
                source_name,
                format!("{} is not an index", chosen.digest),
                FIX_DAMAGED,
            ));
        };
        nested = Some(chosen.digest.clone());
        chosen = choose_manifest(&what, &inner, platform)?.clone();
    }
    let bytes = store_and_read(
        layout,
        blobs,
        source_name,
        &chosen,
        limits.max_manifest_bytes,
    )?;
    let what = format!("{source_name}: manifest {}", chosen.digest);
    let Manifest::Image(manifest) = parse_manifest(&what, &bytes, Some(&chosen.media_type))? else {
        return Err(invalid(
            source_name,
            format!("{} is not an image manifest", chosen.digest),
            FIX_DAMAGED,
        ));
    };
    let config = store_and_read(
        layout,
        blobs,
        source_name,
        &manifest.config,
        limits.max_config_bytes,
    )?;
    parse_config(&format!("{source_name}: config"), &config, &manifest)?;
    for layer in &manifest.layers {
        store_member(
            layout,
            blobs,
            source_name,
            &blob_name(&layer.digest),
            Some(layer),
            limits.max_layer_bytes,
        )?;
    }
    Ok(Fetched {
        source: source_name.to_string(),
        index: nested,
        manifest: chosen.digest,
    })
}

/// The index entry a tag (or, without one, the platform) names.
fn pick_entry<'a>(
    index: &'a ImageIndex,
    source_name: &str,
    tag: Option<&str>,
    platform: &Platform,
) -> Result<&'a Descriptor, ArchiveError> {
    let tags: Vec<&str> = index
        .manifests
        .iter()
        .filter_map(|d| d.annotations.get(REF_NAME).map(String::as_str))
        .collect();
    if let Some(tag) = tag {
        return index
            .manifests
            .iter()
            .find(|d| d.annotations.get(REF_NAME).map(String::as_str) == Some(tag))
            .ok_or_else(|| {
                invalid(
                    source_name,
                    format!("no image is tagged {tag:?} (tags: {})", tags.join(", ")),
                    "name one of its tags after the path, e.g. oci:/srv/layout:latest",
                )
            });
    }
    if let [only] = index.manifests.as_slice() {
        return Ok(only);
    }
    let distinct: std::collections::BTreeSet<&str> = tags.iter().copied().collect();
    if distinct.len() > 1 {
        return Err(invalid(
            source_name,
            format!(
                "it holds {} images (tags: {})",
                index.manifests.len(),
                tags.join(", ")
            ),
            "name one of its tags after the path, e.g. oci-archive:/srv/img.tar:latest",
        ));
    }
    // One image for several platforms, listed at the top.
    Ok(choose_manifest(source_name, index, platform)?)
}

/// One image of a `docker save` `manifest.json`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SavedImage {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

/// The digest a `docker save` member's name promises (`blobs/sha256/HEX`
/// in the OCI-shaped output of docker 25 and later).
fn named_digest(name: &str) -> Option<Digest> {
    Digest::parse(&format!("sha256:{}", name.strip_prefix("blobs/sha256/")?)).ok()
}

fn import_docker(
    layout: &mut dyn Layout,
    source_name: &str,
    blobs: &BlobStore,
    limits: &FetchLimits,
) -> Result<Fetched, ArchiveError> {
    let bytes = read_member(
        layout,
        source_name,
        "manifest.json",
        limits.max_manifest_bytes,
    )?;
    let saved: Vec<SavedImage> = serde_json::from_slice(&bytes).map_err(|e| {
        invalid(
            source_name,
            format!("manifest.json is not docker save's: {e}"),
            FIX_DAMAGED,
        )
    })?;
    let image = match saved.as_slice() {
        [one] => one,
        many => {
            let names: Vec<String> = many
                .iter()
                .flat_map(|i| i.repo_tags.clone().unwrap_or_default())
                .collect();
            return Err(invalid(
                source_name,
                format!("it holds {} images ({})", many.len(), names.join(", ")),
                "save one image per archive: docker save IMAGE -o FILE",
            ));
        }
    };
    let member = |raw: &str| {
        member_name(raw)
            .ok_or_else(|| invalid(source_name, format!("bad member name {raw:?}"), FIX_DAMAGED))
    };
    let descriptor = |name: &str, media_type: &str, size| {
        named_digest(name).map(|digest| Descriptor {
            media_type: media_type.to_string(),
            digest,
            size,
            platform: None,
            annotations: BTreeMap::new(),
        })
    };
    let config_name = member(&image.config)?;
    let expected = descriptor(&config_name, OCI_CONFIG, 0);
    let (config_digest, config_size) = store_member(
        layout,
        blobs,
        source_name,
        &config_name,
        None,
        limits.max_config_bytes,
    )?;
    if let Some(d) = expected {
        if d.digest != config_digest {
            return Err(BlobError::DigestMismatch {
                what: format!("{source_name}: {config_name}"),
                expected: d.digest,
                actual: config_digest,
            }
            .into());
        }
    }
    let mut layers = Vec::new();
    for raw in &image.layers {
        let name = member(raw)?;
        let (digest, size) = store_member(
            layout,
            blobs,
            source_name,
            &name,
            None,
            limits.max_layer_bytes,
        )?;
        if let Some(d) = named_digest(&name) {
            if d != digest {
                return Err(BlobError::DigestMismatch {
                    what: format!("{source_name}: {name}"),
                    expected: d,
                    actual: digest,
                }
                .into());
            }
        }
        let mut head = [0u8; 4];
        let n = blobs.open(&digest)?.read(&mut head).unwrap_or(0);
        let media_type = match &head[..n] {
            [0x1f, 0x8b, ..] => format!("{OCI_LAYER_TAR}+gzip"),
            [0x28, 0xb5, 0x2f, 0xfd] => format!("{OCI_LAYER_TAR}+zstd"),
            _ => OCI_LAYER_TAR.to_string(),
        };
        layers.push(Descriptor {
            media_type,
            digest,
            size,
            platform: None,
            annotations: BTreeMap::new(),
        });
    }
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST.to_string()),
        config: Descriptor {
            media_type: OCI_CONFIG.to_string(),
            digest: config_digest,
            size: config_size,
            platform: None,
            annotations: BTreeMap::new(),
        },
        layers,
    };
    let config = blobs.read(&manifest.config.digest, limits.max_config_bytes)?;
    parse_config(&format!("{source_name}: {config_name}"), &config, &manifest)?;
    let bytes = serde_json::to_vec(&manifest).expect("a manifest serializes");
    let digest = blobs.store_from(
        format!("{source_name}: manifest"),
        &mut &bytes[..],
        None,
        None,
        limits.max_manifest_bytes,
    )?;
    Ok(Fetched {
        source: source_name.to_string(),
        index: None,
        manifest: digest,
    })
}

/// Imports an OCI archive (`file`, opened by the caller) into `blobs`.
pub fn import_oci_archive(
    file: File,
    source_name: &str,
    tag: Option<&str>,
    blobs: &BlobStore,
    platform: &Platform,
    limits: &FetchLimits,
) -> Result<Fetched, ArchiveError> {
    let mut layout = TarLayout::scan(file, source_name)?;
    import_oci(&mut layout, source_name, tag, blobs, platform, limits)
}

/// Imports `docker save` output (`file`, opened by the caller).
pub fn import_docker_archive(
    file: File,
    source_name: &str,
    blobs: &BlobStore,
    limits: &FetchLimits,
) -> Result<Fetched, ArchiveError> {
    let mut layout = TarLayout::scan(file, source_name)?;
    import_docker(&mut layout, source_name, blobs, limits)
}

/// Imports an OCI layout directory (`dir`, opened by the caller).
pub fn import_oci_layout(
    dir: OwnedFd,
    source_name: &str,
    tag: Option<&str>,
    blobs: &BlobStore,
    platform: &Platform,
    limits: &FetchLimits,
) -> Result<Fetched, ArchiveError> {
    import_oci_layout_as(dir, None, source_name, tag, blobs, platform, limits)
}

/// [`import_oci_layout`] with every member opened as `reader` (uid, gid,
/// groups): the user who named the layout.
pub fn import_oci_layout_as(
    dir: OwnedFd,
    reader: Option<(u32, u32, Vec<u32>)>,
    source_name: &str,
    tag: Option<&str>,
    blobs: &BlobStore,
    platform: &Platform,
    limits: &FetchLimits,
) -> Result<Fetched, ArchiveError> {
    let mut layout = DirLayout { dir, reader };
    import_oci(&mut layout, source_name, tag, blobs, platform, limits)
}

/// Opens a local source's `path` for reading with the caller's rights:
/// `O_NONBLOCK` so that a FIFO no one writes to (a user may name one)
/// cannot hold the thread forever, `O_NOCTTY` so that a terminal never
/// becomes ptraind's, and then the open file itself must be a regular
/// file (a directory for a layout): a device (`/dev/zero`, a tape) is
/// never read.
pub fn open_source(path: &std::path::Path, directory: bool) -> io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    let mut flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY;
    if directory {
        flags |= OFlags::DIRECTORY;
    }
    let fd = rustix::fs::open(path, flags, Mode::empty())
        .map_err(|e| io::Error::from_raw_os_error(e.raw_os_error()))?;
    let file = File::from(fd);
    let kind = file.metadata()?.file_type();
    let ok = if directory {
        kind.is_dir()
    } else {
        kind.is_file()
    };
    if !ok {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            if directory {
                "not a directory"
            } else {
                "not a regular file (a FIFO, device or directory is never read)"
            },
        ));
    }
    Ok(file)
}

/// Opens a local source with the caller's own rights and imports it.
/// Called as root, those rights are root's: the daemon must call it only
/// on a thread that has taken the job owner's identity, or open the
/// source itself that way and call the `import_*` functions.
pub fn import(
    source: &ImageSource,
    blobs: &BlobStore,
    platform: &Platform,
    limits: &FetchLimits,
) -> Result<Fetched, ArchiveError> {
    let name = source.to_string();
    let io_err = |source| ArchiveError::Io {
        source_name: name.clone(),
        source,
    };
    match source {
        ImageSource::Registry(_) => Err(invalid(
            &name,
            "is a registry reference",
            "pull it with the registry client",
        )),
        ImageSource::OciArchive { path, tag } => {
            let file = open_source(path, false).map_err(io_err)?;
            import_oci_archive(file, &name, tag.as_deref(), blobs, platform, limits)
        }
        ImageSource::DockerArchive { path } => {
            let file = open_source(path, false).map_err(io_err)?;
            import_docker_archive(file, &name, blobs, limits)
        }
        ImageSource::OciLayout { path, tag } => {
            let dir = match open_source(path, true) {
                Ok(dir) => dir,
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                    return Err(invalid(
                        &name,
                        "is not a directory",
                        "name an OCI layout directory",
                    ))
                }
                Err(e) => return Err(io_err(e)),
            };
            import_oci_layout(dir.into(), &name, tag.as_deref(), blobs, platform, limits)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::store::tests::{test_image, TestImage};
    use crate::images::store::{ImageLimits, ImageStore};
    use crate::images::unpack::tests::{file, raw_tar, symlink, Raw};

    fn layer() -> Vec<u8> {
        raw_tar(&[file("app/run.sh", b"echo hi\n", 0o755)])
    }

    fn index_json(image: &TestImage, tag: Option<&str>) -> Vec<u8> {
        let mut entry = serde_json::json!({
            "mediaType": OCI_MANIFEST,
            "digest": image.manifest_digest.to_string(),
            "size": image.manifest.len(),
        });
        if let Some(t) = tag {
            entry["annotations"] = serde_json::json!({ REF_NAME: t });
        }
        serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": [entry]})).unwrap()
    }

    /// The members of an OCI layout of `image`.
    fn layout_members(image: &TestImage, index: Vec<u8>) -> Vec<(String, Vec<u8>)> {
        let mut members = vec![
            (
                "oci-layout".to_string(),
                br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
            ),
            ("index.json".to_string(), index),
            (blob_name(&image.manifest_digest), image.manifest.clone()),
        ];
        members.extend(image.blobs.iter().map(|(d, b)| (blob_name(d), b.clone())));
        members
    }

    fn tar_file(dir: &std::path::Path, entries: &[Raw]) -> File {
        let path = dir.join("archive.tar");
        std::fs::write(&path, raw_tar(entries)).unwrap();
        File::open(path).unwrap()
    }

    /// [`import`] with the host's platform and the default limits.
    fn import_here(source: &ImageSource, store: &ImageStore) -> Result<Fetched, ArchiveError> {
        import(
            source,
            store.blobs(),
            &Platform::host(),
            &FetchLimits::default(),
        )
    }

    /// [`import_oci_archive`] of an archive of `entries`.
    fn oci_archive(
        dir: &std::path::Path,
        entries: &[Raw],
        source_name: &str,
        tag: Option<&str>,
        store: &ImageStore,
    ) -> Result<Fetched, ArchiveError> {
        import_oci_archive(
            tar_file(dir, entries),
            source_name,
            tag,
            store.blobs(),
            &Platform::host(),
            &FetchLimits::default(),
        )
    }

    /// [`import_docker_archive`] of an archive of `entries`.
    fn docker_archive(
        dir: &std::path::Path,
        entries: &[Raw],
        source_name: &str,
        store: &ImageStore,
    ) -> Result<Fetched, ArchiveError> {
        import_docker_archive(
            tar_file(dir, entries),
            source_name,
            store.blobs(),
            &FetchLimits::default(),
        )
    }

    fn store() -> (tempfile::TempDir, ImageStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(&dir.path().join("store")).unwrap();
        (dir, store)
    }

    #[test]
    fn an_oci_archive_imports_by_tag_and_prepares() {
        let (dir, store) = store();
        let image = test_image(&[layer()]);
        let entries: Vec<Raw> = layout_members(&image, index_json(&image, Some("v1")))
            .iter()
            .map(|(n, b)| file(&format!("./{n}"), b, 0o644))
            .collect();
        let fetched =
            oci_archive(dir.path(), &entries, "oci-archive:/x.tar", None, &store).unwrap();
        assert_eq!(fetched.manifest, image.manifest_digest);
        let fetched = oci_archive(
            dir.path(),
            &entries,
            "oci-archive:/x.tar:v1",
            Some("v1"),
            &store,
        )
        .unwrap();
        let prepared = store.prepare(&fetched, &ImageLimits::default(), 1).unwrap();
        assert_eq!(
            std::fs::read(prepared.rootfs.join("app/run.sh")).unwrap(),
            b"echo hi\n"
        );

        let err = oci_archive(
            dir.path(),
            &entries,
            "oci-archive:/x.tar:v2",
            Some("v2"),
            &store,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("oci-archive:/x.tar:v2") && err.contains("\"v2\"") && err.contains("v1"),
            "{err}"
        );
    }

    #[test]
    fn an_oci_layout_directory_is_verified_blob_by_blob() {
        let (dir, store) = store();
        let image = test_image(&[layer()]);
        let layout = dir.path().join("layout");
        for (name, bytes) in layout_members(&image, index_json(&image, None)) {
            let path = layout.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
        let source = ImageSource::parse(&format!("oci:{}", layout.display())).unwrap();
        let fetched = import_here(&source, &store).unwrap();
        assert_eq!(fetched.manifest, image.manifest_digest);
        assert_eq!(fetched.source, source.to_string());

        // A layer replaced on disk: a digest mismatch naming both.
        let (_dir2, store2) = store_pair();
        let layer_digest = Digest::of(&image.layers[0]);
        let tampered = crate::images::unpack::tests::gzip(&raw_tar(&[file("evil", b"x", 0o644)]));
        std::fs::write(layout.join(blob_name(&layer_digest)), &tampered).unwrap();
        let err = import_here(&source, &store2).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(
                err,
                ArchiveError::Blob(BlobError::SizeMismatch { .. })
                    | ArchiveError::Blob(BlobError::DigestMismatch { .. })
            ),
            "{text}"
        );
        // Same size, other bytes: the digest check.
        let mut same_size = image.layers[0].clone();
        let last = same_size.len() - 1;
        same_size[last] ^= 0xff;
        std::fs::write(layout.join(blob_name(&layer_digest)), &same_size).unwrap();
        let err = import_here(&source, &store2).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&layer_digest.to_string())
                && text.contains(&Digest::of(&same_size).to_string()),
            "{text}"
        );
        assert!(!store2.blobs().contains(&layer_digest));
        // A blob that is a symlink is not followed.
        std::fs::remove_file(layout.join(blob_name(&layer_digest))).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", layout.join(blob_name(&layer_digest))).unwrap();
        let err = import_here(&source, &store2).unwrap_err();
        assert!(err.to_string().contains("it has no blobs/sha256/"), "{err}");
    }

    #[test]
    fn a_named_fifo_or_device_is_refused_without_waiting() {
        // A user names a FIFO no one writes to (or a device): opening it
        // must neither hang the importing thread nor read a device.
        let (dir, store) = store();
        let fifo = dir.path().join("fifo.tar");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let root = dir.path().join("store");
        let sources = [
            format!("docker-archive:{}", fifo.display()),
            format!("oci-archive:{}", fifo.display()),
            "docker-archive:/dev/zero".to_string(),
        ];
        std::thread::spawn(move || {
            let store = ImageStore::open(&root).unwrap();
            for source in sources {
                let source = ImageSource::parse(&source).unwrap();
                let err = import_here(&source, &store).unwrap_err().to_string();
                tx.send(err).unwrap();
            }
        });
        for _ in 0..3 {
            let err = rx
                .recv_timeout(std::time::Duration::from_secs(20))
                .expect("import hung on a FIFO");
            assert!(err.contains("not a regular file"), "{err}");
        }
        drop(store);
    }

    fn store_pair() -> (tempfile::TempDir, ImageStore) {
        store()
    }

    #[test]
    fn docker_save_output_gets_a_manifest_and_shares_duplicate_layers() {
        let (dir, store) = store();
        let tar = layer();
        let diff = Digest::of(&tar).to_string();
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "config": {"Cmd": ["/app/run.sh"], "Env": ["A=1"]},
            "rootfs": {"type": "layers", "diff_ids": [diff, diff]},
        }))
        .unwrap();
        let config_name = format!("{}.json", Digest::of(&config).hex());
        let manifest = serde_json::to_vec(&serde_json::json!([{
            "Config": config_name,
            "RepoTags": ["app:1"],
            "Layers": ["aaa/layer.tar", "bbb/layer.tar"],
        }]))
        .unwrap();
        let entries = vec![
            file("aaa/layer.tar", &tar, 0o644),
            symlink("bbb/layer.tar", "../aaa/layer.tar"),
            file(&config_name, &config, 0o644),
            file("manifest.json", &manifest, 0o644),
            file("repositories", b"{}", 0o644),
        ];
        let fetched =
            docker_archive(dir.path(), &entries, "docker-archive:/a.tar", &store).unwrap();
        let prepared = store.prepare(&fetched, &ImageLimits::default(), 1).unwrap();
        assert_eq!(
            std::fs::read(prepared.rootfs.join("app/run.sh")).unwrap(),
            b"echo hi\n"
        );
        assert_eq!(prepared.record.layers.len(), 2);
        assert_eq!(
            prepared.config.config.cmd,
            Some(vec!["/app/run.sh".to_string()])
        );
        // Importing again gives the same manifest digest.
        let again = docker_archive(dir.path(), &entries, "docker-archive:/a.tar", &store).unwrap();
        assert_eq!(again.manifest, fetched.manifest);

        // Two images in one archive: refused with the fix.
        let two = serde_json::to_vec(&serde_json::json!([
            {"Config": config_name, "RepoTags": ["a:1"], "Layers": ["aaa/layer.tar"]},
            {"Config": config_name, "RepoTags": ["b:1"], "Layers": ["aaa/layer.tar"]},
        ]))
        .unwrap();
        let err = docker_archive(
            dir.path(),
            &[file("manifest.json", &two, 0o644)],
            "docker-archive:/two.tar",
            &store,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("holds 2 images") && err.contains("docker save IMAGE"),
            "{err}"
        );
        // A member that leaves the archive: refused by name.
        let bad = serde_json::to_vec(&serde_json::json!([
            {"Config": "../../etc/passwd", "Layers": []},
        ]))
        .unwrap();
        let bad = [file("manifest.json", &bad, 0o644)];
        assert!(docker_archive(dir.path(), &bad, "d", &store).is_err());
    }
}
