//! The image store on disk: blobs in, unpacked layers and assembled
//! trees out, one record per image; and its collection.
//!
//! ```text
//! ROOT/                  0700 root: no job user sees inside
//!   blobs/sha256/HEX     verified blobs (manifests, configs, layers as fetched)
//!   layers/sha256/DIFF/  one unpacked layer: root/ and layer.json
//!   trees/sha256/CHAIN/  one image's root tree (RootDirectory=), 0755
//!   images/KEY.json      one record per reference (KEY: sha256 of it)
//!   roots/sha256/TREE-KEY/  a unit's root, cloned from a tree (super::runtime_root)
//!   tmp/                 work in progress, emptied at open
//! ```
//!
//! A layer or tree is built in `tmp/` and renamed to its name whole
//! (`RENAME_NOREPLACE`): a name there is a finished one, a crash leaves
//! only `tmp/`, and two builders of the same layer race harmlessly (the
//! second sees the first's and drops its own). A job's unit reaches its
//! tree through a 0700 parent: `RootDirectory=` is entered by systemd as
//! root before the job's identity is taken.
//!
//! Everything here blocks (file system work, some of it long): call it
//! from `spawn_blocking`. A collection must not run while an image is
//! being fetched or prepared (it removes what no record names yet), and
//! the store is opened once per daemon (opening empties `tmp/`).

use std::collections::BTreeSet;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use super::assemble::{assemble, AssembleError, LayerTree};
use super::blobs::{temp_name, BlobError, BlobStore, FetchLimits, Fetched};
use super::catalog::{GcPlan, ImageListing, ImageRecord, LayerUse};
use super::manifest::{
    chain_id, parse_config, parse_manifest, ImageConfig, Manifest, ManifestError,
};
use super::reference::Digest;
use super::safe_fs;
use super::unpack::{unpack_layer, LayerSummary, UnpackError, UnpackLimits};

/// Bounds on one image made ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageLimits {
    pub fetch: FetchLimits,
    /// Bytes of files in all the image's layers together (apparent sizes).
    pub max_unpacked_bytes: u64,
    /// Tar entries in one layer.
    pub max_layer_entries: u64,
}

impl Default for ImageLimits {
    fn default() -> ImageLimits {
        ImageLimits {
            fetch: FetchLimits::default(),
            max_unpacked_bytes: 64 << 30,
            max_layer_entries: 1_000_000,
        }
    }
}

/// An image ready for a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedImage {
    pub record: ImageRecord,
    pub config: ImageConfig,
    /// The tree for `RootDirectory=`.
    pub rootfs: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("image store {path}: {source}; check the disk and the store directory's permissions")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("image {manifest}: {problem}; pull the image again")]
    Missing { manifest: Digest, problem: String },
    #[error("image {manifest}: more than {limit} bytes of files in its layers; raise the image size limit if the image is trusted and that large")]
    TooLarge { manifest: Digest, limit: u64 },
    #[error("image {manifest} has no layers, so no files to run; use an image that has")]
    NoLayers { manifest: Digest },
    #[error(
        "image record {path}: {detail}; remove the file, the image is pulled again when next used"
    )]
    BadRecord { path: PathBuf, detail: String },
    #[error(transparent)]
    Blob(#[from] BlobError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Unpack(#[from] UnpackError),
    #[error(transparent)]
    Assemble(#[from] AssembleError),
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The images under one root directory.
#[derive(Clone, Debug)]
pub struct ImageStore {
    root: PathBuf,
    blobs: BlobStore,
    /// Held while a record is read, changed and written back: two jobs
    /// of one image note their users at once.
    records_lock: std::sync::Arc<std::sync::Mutex<()>>,
}

impl ImageStore {
    /// Opens (making, 0700) the store at `root` and empties its `tmp/`:
    /// whatever is there is a crashed fetch or build.
    pub fn open(root: &Path) -> Result<ImageStore, StoreError> {
        for sub in [
            "",
            "blobs/sha256",
            "layers/sha256",
            "trees/sha256",
            "images",
            "tmp",
        ] {
            let dir = root.join(sub);
            crate::fsutil::ensure_dir(&dir, 0o700).map_err(io_at(&dir))?;
        }
        let tmp = root.join("tmp");
        let fd = safe_fs::open_dir_path(&tmp).map_err(io_at(&tmp))?;
        safe_fs::clear_dir(fd.as_fd()).map_err(io_at(&tmp))?;
        Ok(ImageStore {
            root: root.to_path_buf(),
            blobs: BlobStore::new(root.join("blobs/sha256"), tmp),
            records_lock: Default::default(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where fetches put their blobs.
    pub fn blobs(&self) -> &BlobStore {
        &self.blobs
    }

    fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }

    fn layer_dir(&self, diff_id: &Digest) -> PathBuf {
        self.root.join("layers/sha256").join(diff_id.hex())
    }

    /// The tree of the image whose layers chain to `chain_id`.
    pub fn tree_dir(&self, chain_id: &Digest) -> PathBuf {
        self.root.join("trees/sha256").join(chain_id.hex())
    }

    fn record_path(&self, reference: &str) -> PathBuf {
        self.root
            .join("images")
            .join(format!("{}.json", Digest::of(reference.as_bytes()).hex()))
    }

    /// Makes a fetched image ready: each layer unpacked once (or found
    /// unpacked), the tree assembled once (or found), and the record for
    /// `fetched.source` written, used at `now`.
    pub fn prepare(
        &self,
        fetched: &Fetched,
        limits: &ImageLimits,
        now: u64,
    ) -> Result<PreparedImage, StoreError> {
        let id = &fetched.manifest;
        let bytes = self.blobs.read(id, limits.fetch.max_manifest_bytes)?;
        let what = format!("manifest {id}");
        let Manifest::Image(manifest) = parse_manifest(&what, &bytes, None)? else {
            return Err(StoreError::Missing {
                manifest: id.clone(),
                problem: "it is an index, not an image manifest".to_string(),
            });
        };
        let config_bytes = self
            .blobs
            .read(&manifest.config.digest, limits.fetch.max_config_bytes)?;
        let config = parse_config(
            &format!("config {}", manifest.config.digest),
            &config_bytes,
            &manifest,
        )?;
        let diff_ids = &config.rootfs.diff_ids;
        let chain = chain_id(diff_ids).ok_or_else(|| StoreError::NoLayers {
            manifest: id.clone(),
        })?;

        let mut layers = Vec::new();
        let mut total: u64 = 0;
        for (descriptor, diff_id) in manifest.layers.iter().zip(diff_ids) {
            let budget = limits.max_unpacked_bytes.saturating_sub(total);
            let summary = self.layer(id, &descriptor.digest, diff_id, budget, limits)?;
            total = total.saturating_add(summary.bytes);
            if total > limits.max_unpacked_bytes {
                return Err(StoreError::TooLarge {
                    manifest: id.clone(),
                    limit: limits.max_unpacked_bytes,
                });
            }
            layers.push((
                LayerUse {
                    diff_id: diff_id.clone(),
                    bytes: summary.bytes,
                    blob: descriptor.digest.clone(),
                    blob_bytes: self
                        .blobs
                        .size(&descriptor.digest)
                        .unwrap_or(descriptor.size),
                },
                summary.changes,
            ));
        }

        let rootfs = self.tree_dir(&chain);
        if !rootfs.is_dir() {
            let roots: Vec<PathBuf> = layers
                .iter()
                .map(|(l, _)| self.layer_dir(&l.diff_id).join("root"))
                .collect();
            let trees: Vec<LayerTree<'_>> = layers
                .iter()
                .zip(&roots)
                .map(|((l, changes), root)| LayerTree {
                    name: l.diff_id.to_string(),
                    root,
                    changes,
                })
                .collect();
            self.build("tree", &rootfs, |work| {
                assemble(&trees, work).map_err(StoreError::from)
            })?;
        }

        let _records = self.lock_records();
        let previous = self.read_record(&fetched.source)?;
        if let Some(old) = previous.as_ref().filter(|p| p.manifest != *id) {
            // The reference now names another image (a tag moved). Jobs
            // may still run in the old one's tree, and the collection
            // keeps only what a record names: the old image stays under
            // a record of its own, `REFERENCE@DIGEST`, that a collection
            // removes once no job keeps its manifest.
            let mut superseded = old.clone();
            superseded.reference = format!("{}@{}", old.reference, old.manifest);
            self.write_record(&superseded)?;
        }
        let meta_bytes = [
            Some(id),
            Some(&manifest.config.digest),
            fetched.index.as_ref(),
        ]
        .into_iter()
        .flatten()
        .filter_map(|d| self.blobs.size(d))
        .sum();
        let record = ImageRecord {
            reference: fetched.source.clone(),
            manifest: id.clone(),
            index: fetched.index.clone(),
            config: manifest.config.digest.clone(),
            chain_id: chain,
            layers: layers.into_iter().map(|(l, _)| l).collect(),
            meta_bytes,
            prepared_at: previous
                .as_ref()
                .filter(|p| p.manifest == *id)
                .map_or(now, |p| p.prepared_at),
            last_used: previous.as_ref().map_or(now, |p| p.last_used.max(now)),
            users: previous
                .as_ref()
                .map(|p| p.users.clone())
                .unwrap_or_default(),
        };
        if record.needs_write_over(previous.as_ref()) {
            self.write_record(&record)?;
        }
        Ok(PreparedImage {
            record,
            config,
            rootfs,
        })
    }

    /// Renames a finished `work` directory to `dest`; when another
    /// builder got there first, theirs stays and `work` goes.
    fn publish(&self, work: &Path, dest: &Path) -> Result<(), StoreError> {
        match crate::fsutil::rename_noreplace(work, dest) {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = safe_fs::remove_tree(work);
                if e.kind() == io::ErrorKind::AlreadyExists
                    || e.raw_os_error() == Some(libc::ENOTEMPTY)
                {
                    Ok(())
                } else {
                    Err(io_at(dest)(e))
                }
            }
        }
    }

    /// Builds into a fresh `tmp/` directory with `build`, then publishes
    /// it as `dest`; a failed build leaves nothing.
    fn build<T>(
        &self,
        prefix: &str,
        dest: &Path,
        build: impl FnOnce(&Path) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let work = temp_name(&self.tmp(), prefix);
        std::fs::create_dir(&work).map_err(io_at(&work))?;
        match build(&work) {
            Ok(value) => {
                self.publish(&work, dest)?;
                Ok(value)
            }
            Err(e) => {
                let _ = safe_fs::remove_tree(&work);
                Err(e)
            }
        }
    }

    /// The unpacked layer `diff_id`, unpacking blob `blob` when missing.
    fn layer(
        &self,
        manifest: &Digest,
        blob: &Digest,
        diff_id: &Digest,
        budget: u64,
        limits: &ImageLimits,
    ) -> Result<LayerSummary, StoreError> {
        let dir = self.layer_dir(diff_id);
        let summary_path = dir.join("layer.json");
        if dir.is_dir() {
            let text = std::fs::read(&summary_path).map_err(io_at(&summary_path))?;
            return serde_json::from_slice(&text).map_err(|e| StoreError::BadRecord {
                path: summary_path,
                detail: e.to_string(),
            });
        }
        if !self.blobs.contains(blob) {
            return Err(StoreError::Missing {
                manifest: manifest.clone(),
                problem: format!("layer blob {blob} is not in the store"),
            });
        }
        let unpack_limits = UnpackLimits {
            max_bytes: budget,
            max_entries: limits.max_layer_entries,
        };
        self.build("layer", &dir, |work| {
            let file = self.blobs.open(blob)?;
            let summary = unpack_layer(blob, file, Some(diff_id), work, &unpack_limits)?;
            let path = work.join("layer.json");
            let text = serde_json::to_vec(&summary).expect("a summary serializes");
            std::fs::write(&path, text).map_err(io_at(&path))?;
            Ok(summary)
        })
    }

    fn lock_records(&self) -> std::sync::MutexGuard<'_, ()> {
        self.records_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn read_record(&self, reference: &str) -> Result<Option<ImageRecord>, StoreError> {
        let path = self.record_path(reference);
        match std::fs::read(&path) {
            Ok(text) => {
                serde_json::from_slice(&text)
                    .map(Some)
                    .map_err(|e| StoreError::BadRecord {
                        path,
                        detail: e.to_string(),
                    })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_at(&path)(e)),
        }
    }

    fn write_record(&self, record: &ImageRecord) -> Result<(), StoreError> {
        let path = self.record_path(&record.reference);
        let dir = self.root.join("images");
        let name = path
            .file_name()
            .expect("a file name")
            .to_string_lossy()
            .into_owned();
        let text = serde_json::to_vec_pretty(record).expect("a record serializes");
        crate::fsutil::write_atomic(&dir, &name, &text).map_err(io_at(&path))
    }

    /// Every image record. A damaged one is an error naming its file.
    pub fn records(&self) -> Result<Vec<ImageRecord>, StoreError> {
        let dir = self.root.join("images");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io_at(&dir))? {
            let entry = entry.map_err(io_at(&dir))?;
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let text = std::fs::read(&path).map_err(io_at(&path))?;
            out.push(
                serde_json::from_slice(&text).map_err(|e| StoreError::BadRecord {
                    path: path.clone(),
                    detail: e.to_string(),
                })?,
            );
        }
        out.sort_by(|a: &ImageRecord, b| a.reference.cmp(&b.reference));
        Ok(out)
    }

    /// The store's images for `ptrain images`.
    pub fn list(&self) -> Result<Vec<ImageListing>, StoreError> {
        Ok(super::catalog::listing(&self.records()?))
    }

    /// Notes that a job of `user` starts from the image `reference` now.
    pub fn note_use(&self, reference: &str, user: &str, now: u64) -> Result<(), StoreError> {
        let _records = self.lock_records();
        let Some(stored) = self.read_record(reference)? else {
            return Ok(());
        };
        let mut record = stored.clone();
        record.last_used = record.last_used.max(now);
        record.users.insert(user.to_string());
        if record.needs_write_over(Some(&stored)) {
            self.write_record(&record)?;
        }
        Ok(())
    }

    /// Notes that the image `reference` is still in use now (a job runs
    /// in it): its age for a collection counts from now.
    pub fn touch(&self, reference: &str, now: u64) -> Result<(), StoreError> {
        let _records = self.lock_records();
        let Some(stored) = self.read_record(reference)? else {
            return Ok(());
        };
        let record = ImageRecord {
            last_used: stored.last_used.max(now),
            ..stored.clone()
        };
        if record.needs_write_over(Some(&stored)) {
            self.write_record(&record)?;
        }
        Ok(())
    }

    /// Removes the plan's images, then every tree, layer and blob no
    /// remaining record names, and every unit root cloned from a tree
    /// that is gone. Directories are renamed into `tmp/` before they are
    /// removed, so none is ever half there under its name.
    pub fn collect(&self, plan: &GcPlan) -> Result<GcReport, StoreError> {
        let mut report = GcReport::default();
        for reference in &plan.remove {
            let path = self.record_path(reference);
            match std::fs::remove_file(&path) {
                Ok(()) => report.images += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_at(&path)(e)),
            }
        }
        let records = self.records()?;
        let trees: BTreeSet<String> = records
            .iter()
            .map(|r| r.chain_id.hex().to_string())
            .collect();
        let layers: BTreeSet<String> = records
            .iter()
            .flat_map(|r| r.layers.iter().map(|l| l.diff_id.hex().to_string()))
            .collect();
        let blobs: BTreeSet<String> = records
            .iter()
            .flat_map(|r| r.blobs().map(|d| d.hex().to_string()))
            .collect();
        report.roots = self.sweep_roots(&trees)?;
        report.trees = self.sweep("trees/sha256", &trees, true)?;
        report.layers = self.sweep("layers/sha256", &layers, true)?;
        report.blobs = self.sweep("blobs/sha256", &blobs, false)?;
        Ok(report)
    }

    /// Removes the unit roots (`roots/sha256/TREE-KEY`) whose tree is not
    /// in `trees`; a name of another kind is left alone.
    fn sweep_roots(&self, trees: &BTreeSet<String>) -> Result<usize, StoreError> {
        let dir = self.root.join("roots/sha256");
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io_at(&dir)(e)),
        };
        let mut removed = 0;
        for entry in entries {
            let entry = entry.map_err(io_at(&dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(tree) = super::runtime_root::tree_of_root(&name) else {
                continue;
            };
            if trees.contains(tree) {
                continue;
            }
            let path = entry.path();
            let doomed = temp_name(&self.tmp(), "gone");
            std::fs::rename(&path, &doomed).map_err(io_at(&path))?;
            safe_fs::remove_tree(&doomed).map_err(io_at(&doomed))?;
            removed += 1;
        }
        Ok(removed)
    }

    fn sweep(&self, sub: &str, keep: &BTreeSet<String>, dirs: bool) -> Result<usize, StoreError> {
        let dir = self.root.join(sub);
        let mut removed = 0;
        for entry in std::fs::read_dir(&dir).map_err(io_at(&dir))? {
            let entry = entry.map_err(io_at(&dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if keep.contains(&name) {
                continue;
            }
            let path = entry.path();
            if dirs {
                let doomed = temp_name(&self.tmp(), "gone");
                std::fs::rename(&path, &doomed).map_err(io_at(&path))?;
                safe_fs::remove_tree(&doomed).map_err(io_at(&doomed))?;
            } else {
                std::fs::remove_file(&path).map_err(io_at(&path))?;
            }
            removed += 1;
        }
        Ok(removed)
    }
}

/// What a collection removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    pub images: usize,
    /// Unit roots cloned from a removed tree.
    pub roots: usize,
    pub trees: usize,
    pub layers: usize,
    pub blobs: usize,
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::images::catalog::{plan_gc, GcPolicy, LAST_USED_GRAIN_US};
    use crate::images::manifest::Descriptor;
    use crate::images::manifest::{ImageManifest, OCI_CONFIG, OCI_LAYER_TAR, OCI_MANIFEST};
    use crate::images::unpack::tests::{dir, file, gzip, hard, mode_of, raw_tar, symlink};
    use std::os::unix::fs::MetadataExt;

    /// An image's blobs: gzip layers of `layers` (uncompressed tars), a
    /// config naming their diff-ids, and the manifest.
    pub struct TestImage {
        pub manifest: Vec<u8>,
        pub manifest_digest: Digest,
        pub layers: Vec<Vec<u8>>,
        /// Every blob but the manifest: (digest, bytes).
        pub blobs: Vec<(Digest, Vec<u8>)>,
    }

    pub fn test_image(layers: &[Vec<u8>]) -> TestImage {
        let diff_ids: Vec<String> = layers.iter().map(|l| Digest::of(l).to_string()).collect();
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": crate::images::Platform::host().architecture,
            "os": "linux",
            "config": {"Env": ["PATH=/usr/bin", "LANG=C"], "Entrypoint": ["/bin/tool"], "Cmd": ["--help"]},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }))
        .unwrap();
        let descriptor = |media_type: &str, bytes: &[u8]| Descriptor {
            media_type: media_type.to_string(),
            digest: Digest::of(bytes),
            size: bytes.len() as u64,
            platform: None,
            annotations: Default::default(),
        };
        let compressed: Vec<Vec<u8>> = layers.iter().map(|l| gzip(l)).collect();
        let manifest = ImageManifest {
            schema_version: 2,
            media_type: Some(OCI_MANIFEST.to_string()),
            config: descriptor(OCI_CONFIG, &config),
            layers: compressed
                .iter()
                .map(|l| descriptor(&format!("{OCI_LAYER_TAR}+gzip"), l))
                .collect(),
        };
        let manifest = serde_json::to_vec(&manifest).unwrap();
        let mut blobs = vec![(Digest::of(&config), config.clone())];
        blobs.extend(compressed.iter().map(|l| (Digest::of(l), l.clone())));
        TestImage {
            manifest_digest: Digest::of(&manifest),
            manifest,
            layers: compressed,
            blobs,
        }
    }

    /// Puts an image's blobs straight into the store, as a fetch would.
    pub fn put(store: &ImageStore, image: &TestImage, source: &str) -> Fetched {
        for (digest, bytes) in image
            .blobs
            .iter()
            .chain([&(image.manifest_digest.clone(), image.manifest.clone())])
        {
            store
                .blobs()
                .store_from("test", &mut &bytes[..], Some(digest.clone()), None, 1 << 30)
                .unwrap();
        }
        Fetched {
            source: source.to_string(),
            index: None,
            manifest: image.manifest_digest.clone(),
        }
    }

    fn base_layer() -> Vec<u8> {
        raw_tar(&[
            dir("bin", 0o755),
            file("bin/tool", b"#!/bin/sh\n", 0o4755),
            hard("bin/tool2", "bin/tool"),
            dir("etc", 0o755),
            file("etc/a", b"a", 0o644),
            file("etc/b", b"b", 0o644),
            file("opt/x/1", b"1", 0o644),
            file("opt/x/2", b"2", 0o644),
            dir("tmp", 0o1777),
            symlink("lib", "usr/lib"),
            file("usr/lib/libc.so", b"elf", 0o755),
        ])
    }

    fn top_layer() -> Vec<u8> {
        raw_tar(&[
            file("etc/.wh.a", b"", 0o644),
            file("opt/x/.wh..wh..opq", b"", 0o644),
            file("opt/x/3", b"3", 0o644),
            file("etc/b", b"b2", 0o640),
            dir("bin", 0o700),
        ])
    }

    const LIMITS: ImageLimits = ImageLimits {
        fetch: FetchLimits {
            max_manifest_bytes: 1 << 20,
            max_config_bytes: 1 << 20,
            max_layer_bytes: 1 << 30,
        },
        max_unpacked_bytes: 1 << 30,
        max_layer_entries: 10_000,
    };

    #[test]
    fn a_multi_layer_image_is_assembled_with_whiteouts_and_shared_layers() {
        let root = tempfile::tempdir().unwrap();
        let store = ImageStore::open(&root.path().join("images")).unwrap();
        let image = test_image(&[base_layer(), top_layer()]);
        let fetched = put(&store, &image, "localhost:5000/app:1");
        let prepared = store.prepare(&fetched, &LIMITS, 1000).unwrap();
        let tree = &prepared.rootfs;
        assert!(tree.starts_with(root.path().join("images/trees/sha256")));
        assert_eq!(
            prepared.config.config.entrypoint,
            Some(vec!["/bin/tool".to_string()])
        );

        // Whiteout and opaque directory applied, never written.
        assert!(!tree.join("etc/a").exists());
        assert!(!tree.join("etc/.wh.a").exists());
        assert_eq!(std::fs::read(tree.join("etc/b")).unwrap(), b"b2");
        let opt: Vec<String> = std::fs::read_dir(tree.join("opt/x"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(opt, vec!["3".to_string()]);
        // Modes: setuid gone, the top layer's directory mode wins, tmp
        // not world-writable, mount points made.
        let mode = |p: &str| mode_of(&tree.join(p));
        assert_eq!(mode("bin/tool"), 0o755);
        assert_eq!(mode("bin"), 0o700);
        assert_eq!(mode("tmp"), 0o755);
        assert_eq!(mode(""), 0o755);
        for point in ["proc", "sys", "dev", "run"] {
            assert!(tree.join(point).is_dir(), "{point}");
        }
        assert_eq!(
            std::fs::read_link(tree.join("lib")).unwrap(),
            Path::new("usr/lib")
        );

        // Files are the layers' inodes: the tree and the layer share them.
        let layer_root = root
            .path()
            .join("images/layers/sha256")
            .join(Digest::of(&base_layer()).hex())
            .join("root");
        let (t, l) = (
            std::fs::metadata(tree.join("bin/tool")).unwrap(),
            std::fs::metadata(layer_root.join("bin/tool")).unwrap(),
        );
        assert_eq!(t.ino(), l.ino());
        assert_eq!(
            t.ino(),
            std::fs::metadata(tree.join("bin/tool2")).unwrap().ino()
        );
        // The layer's own copy of the whited-out file is still there.
        assert!(layer_root.join("etc/a").exists());

        // A second image on the same base shares its layer.
        let other = test_image(&[base_layer(), raw_tar(&[file("extra", b"e", 0o644)])]);
        let fetched2 = put(&store, &other, "localhost:5000/other:1");
        let prepared2 = store.prepare(&fetched2, &LIMITS, 2000).unwrap();
        assert_ne!(prepared2.rootfs, prepared.rootfs);
        assert_eq!(
            std::fs::metadata(prepared2.rootfs.join("bin/tool"))
                .unwrap()
                .ino(),
            l.ino()
        );
        assert!(prepared2.rootfs.join("etc/a").exists());
        assert_eq!(
            std::fs::read_dir(root.path().join("images/layers/sha256"))
                .unwrap()
                .count(),
            3
        );

        // Preparing again finds everything done; the record keeps its
        // first preparation time and its users.
        store
            .note_use("localhost:5000/app:1", "alice", 1500)
            .unwrap();
        let again = store.prepare(&fetched, &LIMITS, 3000).unwrap();
        assert_eq!(again.rootfs, prepared.rootfs);
        assert_eq!(again.record.prepared_at, 1000);
        assert_eq!(again.record.last_used, 3000);
        assert!(again.record.users.contains("alice"));
        assert_eq!(
            std::fs::read_dir(root.path().join("images/tmp"))
                .unwrap()
                .count(),
            0
        );

        let list = store.list().unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].reference, "localhost:5000/app:1");
        assert_eq!(list[0].digest, image.manifest_digest);
        assert_eq!(list[0].users, vec!["alice".to_string()]);
        assert!(list[0].bytes > 0);

        // Collection: the old image goes; the shared layer and the other
        // image's tree stay.
        let records = store.records().unwrap();
        let policy = GcPolicy {
            max_total_bytes: Some(0),
            keep: [other.manifest_digest.clone()].into(),
            ..GcPolicy::default()
        };
        let plan = plan_gc(&records, &policy, 4000);
        assert_eq!(plan.remove, vec!["localhost:5000/app:1".to_string()]);
        // A unit root of each image: the removed one's goes with its tree.
        let point = [PathBuf::from("/home/alice/w")];
        let gone_root =
            crate::images::runtime_root::runtime_root(store.root(), &prepared.rootfs, &point)
                .unwrap();
        let kept_root =
            crate::images::runtime_root::runtime_root(store.root(), &prepared2.rootfs, &point)
                .unwrap();
        let report = store.collect(&plan).unwrap();
        assert_eq!(report.roots, 1);
        assert!(!gone_root.exists());
        assert!(kept_root.join("bin/tool").exists());
        assert_eq!(report.images, 1);
        assert_eq!(report.trees, 1);
        assert_eq!(report.layers, 1);
        assert_eq!(report.blobs, 3); // the top layer, the config, the manifest
        assert!(!prepared.rootfs.exists());
        assert!(prepared2.rootfs.join("bin/tool").exists());
        assert!(layer_root.join("bin/tool").exists());
        assert_eq!(store.records().unwrap().len(), 1);
        assert_eq!(
            std::fs::read_dir(root.path().join("images/tmp"))
                .unwrap()
                .count(),
            0
        );
    }

    #[test]
    fn a_tag_pulled_again_keeps_the_old_image_for_its_running_jobs() {
        // A job runs in image A of `app:1`; the tag moves and `app:1` is
        // prepared again as image B. A collection that keeps A (a job
        // still runs in it) must not remove A's tree from under the job.
        let root = tempfile::tempdir().unwrap();
        let store = ImageStore::open(&root.path().join("images")).unwrap();
        let a = test_image(&[raw_tar(&[file("v", b"1", 0o644)])]);
        let b = test_image(&[raw_tar(&[file("v", b"2", 0o644)])]);
        let old = store
            .prepare(&put(&store, &a, "localhost:5000/app:1"), &LIMITS, 10)
            .unwrap();
        store.note_use("localhost:5000/app:1", "alice", 20).unwrap();
        let new = store
            .prepare(&put(&store, &b, "localhost:5000/app:1"), &LIMITS, 30)
            .unwrap();
        assert_ne!(old.rootfs, new.rootfs);
        let policy = GcPolicy {
            max_total_bytes: Some(0),
            keep: [a.manifest_digest.clone(), b.manifest_digest.clone()].into(),
            ..GcPolicy::default()
        };
        let plan = plan_gc(&store.records().unwrap(), &policy, 40);
        store.collect(&plan).unwrap();
        assert_eq!(std::fs::read(old.rootfs.join("v")).unwrap(), b"1");
        assert_eq!(std::fs::read(new.rootfs.join("v")).unwrap(), b"2");
        // Once nothing keeps it, the old image goes like any other.
        let policy = GcPolicy {
            max_total_bytes: Some(0),
            keep: [b.manifest_digest.clone()].into(),
            ..GcPolicy::default()
        };
        let plan = plan_gc(&store.records().unwrap(), &policy, 50);
        store.collect(&plan).unwrap();
        assert!(!old.rootfs.exists());
        assert!(new.rootfs.join("v").exists());
    }

    #[test]
    fn users_noted_at_once_are_all_kept() {
        let root = tempfile::tempdir().unwrap();
        let store = ImageStore::open(&root.path().join("images")).unwrap();
        let image = test_image(&[raw_tar(&[file("v", b"1", 0o644)])]);
        store
            .prepare(&put(&store, &image, "localhost:5000/app:1"), &LIMITS, 10)
            .unwrap();
        std::thread::scope(|scope| {
            for n in 0..8 {
                let store = &store;
                scope.spawn(move || {
                    store
                        .note_use("localhost:5000/app:1", &format!("user{n}"), 20 + n)
                        .unwrap()
                });
            }
        });
        let record = &store.records().unwrap()[0];
        assert_eq!(record.users.len(), 8, "{record:?}");
        assert_eq!(record.last_used, 27);
        // A use within the grain of the last one on disk writes nothing;
        // one past it does; an older one changes nothing.
        store.touch("localhost:5000/app:1", 100).unwrap();
        assert_eq!(store.records().unwrap()[0].last_used, 27);
        let later = 27 + LAST_USED_GRAIN_US;
        store.touch("localhost:5000/app:1", later).unwrap();
        store.touch("localhost:5000/app:1", 50).unwrap();
        store.touch("not-here", 50).unwrap();
        assert_eq!(store.records().unwrap()[0].last_used, later);
        // A user new to the image is written at once.
        store
            .note_use("localhost:5000/app:1", "bob", later + 1)
            .unwrap();
        let record = &store.records().unwrap()[0];
        assert!(record.users.contains("bob"));
        assert_eq!(record.last_used, later + 1);
    }

    #[test]
    fn a_warm_prepare_writes_no_record_until_its_use_is_a_grain_old() {
        let root = tempfile::tempdir().unwrap();
        let store = ImageStore::open(&root.path().join("images")).unwrap();
        let image = test_image(&[raw_tar(&[file("v", b"1", 0o644)])]);
        let fetched = put(&store, &image, "localhost:5000/app:1");
        store.prepare(&fetched, &LIMITS, 10).unwrap();
        let path = store.record_path("localhost:5000/app:1");
        let inode = |p: &Path| std::fs::metadata(p).unwrap().ino();
        let first = inode(&path);
        let again = store.prepare(&fetched, &LIMITS, 20).unwrap();
        assert_eq!(again.record.last_used, 20, "the caller sees the use");
        assert_eq!(inode(&path), first, "nothing was rewritten");
        assert_eq!(store.records().unwrap()[0].last_used, 10);
        let later = 10 + LAST_USED_GRAIN_US;
        store.prepare(&fetched, &LIMITS, later).unwrap();
        assert_eq!(store.records().unwrap()[0].last_used, later);
    }

    #[test]
    fn a_hostile_layer_leaves_nothing_behind() {
        let root = tempfile::tempdir().unwrap();
        let store = ImageStore::open(&root.path().join("images")).unwrap();
        let outside = root.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        let evil = raw_tar(&[
            file("ok", b"fine", 0o644),
            symlink("etc", &outside.display().to_string()),
            file("etc/passwd", b"x", 0o644),
        ]);
        let image = test_image(&[base_layer(), evil]);
        let fetched = put(&store, &image, "evil");
        let err = store.prepare(&fetched, &LIMITS, 1).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("etc/passwd") && text.contains(&Digest::of(&image.layers[1]).to_string()),
            "{text}"
        );
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        // The good base layer is kept; the bad one and the tree are not.
        assert_eq!(
            std::fs::read_dir(root.path().join("images/layers/sha256"))
                .unwrap()
                .count(),
            1
        );
        assert_eq!(
            std::fs::read_dir(root.path().join("images/trees/sha256"))
                .unwrap()
                .count(),
            0
        );
        assert_eq!(
            std::fs::read_dir(root.path().join("images/tmp"))
                .unwrap()
                .count(),
            0
        );
        assert!(store.records().unwrap().is_empty());
    }

    #[test]
    fn the_size_limit_covers_the_whole_image() {
        let root = tempfile::tempdir().unwrap();
        let store = ImageStore::open(&root.path().join("images")).unwrap();
        let a = raw_tar(&[file("a", &vec![1u8; 600 << 10], 0o644)]);
        let b = raw_tar(&[file("b", &vec![2u8; 600 << 10], 0o644)]);
        let image = test_image(&[a, b]);
        let fetched = put(&store, &image, "big");
        let limits = ImageLimits {
            max_unpacked_bytes: 1 << 20,
            ..LIMITS
        };
        let err = store.prepare(&fetched, &limits, 1).unwrap_err();
        assert!(
            matches!(err, StoreError::Unpack(UnpackError::TooLarge { .. })),
            "{err}"
        );
        // A tampered layer blob (stored under the wrong name by hand) is
        // caught by its diff-id.
        let root = tempfile::tempdir().unwrap();
        let store = ImageStore::open(&root.path().join("images")).unwrap();
        let image = test_image(&[raw_tar(&[file("x", b"1", 0o644)])]);
        let fetched = put(&store, &image, "t");
        let layer = store.blobs().path(&Digest::of(&image.layers[0]));
        std::fs::write(&layer, gzip(&raw_tar(&[file("x", b"2", 0o644)]))).unwrap();
        let err = store.prepare(&fetched, &LIMITS, 1).unwrap_err();
        assert!(
            matches!(err, StoreError::Unpack(UnpackError::DiffIdMismatch { .. })),
            "{err}"
        );
    }
}
