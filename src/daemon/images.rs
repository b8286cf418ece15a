//! A job's image made ready off the state task (issue 21): pulled or
//! imported, verified and unpacked into the store ([`crate::images`]),
//! then the job's own root made ([`crate::images::runtime_root`]). The
//! answer comes back to the state task as an [`Event::ImageReady`]; until
//! then the job is `pulling`: queued, never planned, holding no GPU.
//!
//! Jobs of one image share one pull: the first asks, the others wait on
//! the same cell, and every one of them gets the same digest. A pull that
//! ended (well or not) is forgotten, so a later job of a moving tag asks
//! the registry again (its blobs already stored are not fetched twice).
//!
//! Who controls what: the job's owner names the image. A registry
//! reference is fetched by ptraind as root over HTTPS (plain HTTP only to
//! a loopback registry) and believed only where its digests match. A
//! local archive or layout is *opened as the owner* (fsuid, this thread
//! only), so nobody imports a file they could not read; its content is
//! then verified and unpacked as any pulled image is.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, OnceCell};
use tracing::{info, warn};

use crate::fsutil;
use crate::images::registry::{PullProgress, RegistryClient, RegistryOptions};
use crate::images::{archive, runtime_root, ImageLimits, ImageSource, ImageStore, Platform};
use crate::store::{JobRecord, ReadyImage};
use crate::users::Owner;

use super::Event;

/// An image in the store: what every job of it shares.
#[derive(Clone, Debug)]
struct Pulled {
    digest: String,
    tree: PathBuf,
    run: crate::images::manifest::RunConfig,
}

type Cell = Arc<OnceCell<Result<Pulled, String>>>;

/// The image store and the pulls under way.
pub(super) struct Images {
    store: Arc<ImageStore>,
    client: Arc<RegistryClient>,
    limits: ImageLimits,
    /// Pulls under way, by what they fetch (a local source: and whose
    /// rights open it).
    pulls: Arc<Mutex<HashMap<String, Cell>>>,
    /// Bytes done and in all, by image reference, for `ptrain status`.
    progress: Arc<Mutex<HashMap<String, (u64, u64)>>>,
    events: mpsc::UnboundedSender<Event>,
}

impl Images {
    /// The store under `dir` (root's, 0700: job users never see it; its
    /// trees reach them only as their units' roots).
    pub(super) fn open(
        dir: &std::path::Path,
        events: mpsc::UnboundedSender<Event>,
    ) -> Result<Images, String> {
        let store = ImageStore::open(dir).map_err(|e| e.to_string())?;
        let client = RegistryClient::new(RegistryOptions::default()).map_err(|e| e.to_string())?;
        Ok(Images {
            store: Arc::new(store),
            client: Arc::new(client),
            limits: ImageLimits::default(),
            pulls: Default::default(),
            progress: Default::default(),
            events,
        })
    }

    /// How far the pull of `reference` is, in bytes: (done, in all).
    pub(super) fn progress(&self, reference: &str) -> Option<(u64, u64)> {
        self.progress.lock().ok()?.get(reference).copied()
    }

    /// Makes `record`'s image ready for it, with `mount_points` (its
    /// workdir) in its root; [`Event::ImageReady`] says how it went.
    pub(super) fn want(&self, record: &JobRecord, mount_points: Vec<PathBuf>) {
        let Some(reference) = record.spec.image.clone() else {
            return;
        };
        let id = record.id.clone();
        let owner = record.owner.clone();
        let store = self.store.clone();
        let client = self.client.clone();
        let limits = self.limits;
        let pulls = self.pulls.clone();
        let progress = self.progress.clone();
        let events = self.events.clone();
        info!(job = %id, PTRAIN_JOB = %id, image = %reference, "pulling the job's image");
        tokio::spawn(async move {
            let result = ready(
                &reference,
                &owner,
                mount_points,
                store,
                client,
                limits,
                pulls,
                progress,
            )
            .await;
            let _ = events.send(Event::ImageReady { id, result });
        });
    }
}

#[allow(clippy::too_many_arguments)]
async fn ready(
    reference: &str,
    owner: &Owner,
    mount_points: Vec<PathBuf>,
    store: Arc<ImageStore>,
    client: Arc<RegistryClient>,
    limits: ImageLimits,
    pulls: Arc<Mutex<HashMap<String, Cell>>>,
    progress: Arc<Mutex<HashMap<String, (u64, u64)>>>,
) -> Result<ReadyImage, String> {
    let source = ImageSource::parse(reference).map_err(|e| e.to_string())?;
    let key = match &source {
        ImageSource::Registry(_) => reference.to_owned(),
        _ => format!("{reference}\0{}", owner.uid),
    };
    let cell = pulls
        .lock()
        .map_err(|_| "the pulls' table is poisoned".to_owned())?
        .entry(key.clone())
        .or_default()
        .clone();
    let pulled = cell
        .get_or_init(|| {
            fetch(
                reference,
                source,
                owner.clone(),
                store.clone(),
                client,
                limits,
                progress.clone(),
            )
        })
        .await
        .clone();
    // The next job of this reference asks again (a tag moves).
    if let Ok(mut pulls) = pulls.lock() {
        if pulls.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            pulls.remove(&key);
        }
    }
    if let Ok(mut progress) = progress.lock() {
        progress.remove(reference);
    }
    let pulled = pulled?;
    let (store_root, tree, user) = (
        store.root().to_owned(),
        pulled.tree.clone(),
        owner.name.clone(),
    );
    let reference = reference.to_owned();
    let rootfs = tokio::task::spawn_blocking(move || {
        if let Err(e) = store.note_use(&reference, &user, crate::now_micros()) {
            warn!(image = %reference, error = %e, "cannot note the image's use");
        }
        runtime_root::runtime_root(&store_root, &tree, &mount_points)
    })
    .await
    .map_err(|e| format!("the job's root: {e}"))?
    .map_err(|e| e.to_string())?;
    Ok(ReadyImage {
        digest: pulled.digest,
        rootfs,
        run: pulled.run,
    })
}

/// The image fetched into the store and its tree assembled.
async fn fetch(
    reference: &str,
    source: ImageSource,
    owner: Owner,
    store: Arc<ImageStore>,
    client: Arc<RegistryClient>,
    limits: ImageLimits,
    progress: Arc<Mutex<HashMap<String, (u64, u64)>>>,
) -> Result<Pulled, String> {
    let fetched = match &source {
        ImageSource::Registry(image) => {
            let name = reference.to_owned();
            let report = move |p: &PullProgress| {
                if let Ok(mut progress) = progress.lock() {
                    progress.insert(name.clone(), (p.done, p.total));
                }
            };
            client
                .pull(image, store.blobs(), &report)
                .await
                .map_err(|e| e.to_string())?
        }
        _ => {
            let store = store.clone();
            tokio::task::spawn_blocking(move || import_as(&source, &owner, &store, &limits))
                .await
                .map_err(|e| format!("importing the image: {e}"))??
        }
    };
    let prepared =
        tokio::task::spawn_blocking(move || store.prepare(&fetched, &limits, crate::now_micros()))
            .await
            .map_err(|e| format!("unpacking the image: {e}"))?
            .map_err(|e| e.to_string())?;
    Ok(Pulled {
        digest: prepared.record.manifest.to_string(),
        tree: prepared.rootfs,
        run: prepared.config.config,
    })
}

/// A local source, opened with its owner's rights and imported as root.
fn import_as(
    source: &ImageSource,
    owner: &Owner,
    store: &ImageStore,
    limits: &ImageLimits,
) -> Result<crate::images::Fetched, String> {
    let name = source.to_string();
    let opened = |path: &std::path::Path, dir: bool| -> Result<std::fs::File, String> {
        fsutil::as_user(owner.uid, owner.gid, &owner.groups, || {
            let mut options = std::fs::OpenOptions::new();
            options.read(true);
            if dir {
                use std::os::unix::fs::OpenOptionsExt;
                options.custom_flags(libc::O_DIRECTORY);
            }
            options.open(path)
        })
        .map_err(|e| format!("{name}: cannot take the owner's identity: {e}"))?
        .map_err(|e| {
            format!(
                "{name}: {} cannot open {}: {e}; the file must be readable by the job's owner",
                owner.name,
                path.display()
            )
        })
    };
    let platform = Platform::host();
    let result = match source {
        ImageSource::OciArchive { path, tag } => archive::import_oci_archive(
            opened(path, false)?,
            &name,
            tag.as_deref(),
            store.blobs(),
            &platform,
            &limits.fetch,
        ),
        ImageSource::DockerArchive { path } => archive::import_docker_archive(
            opened(path, false)?,
            &name,
            store.blobs(),
            &limits.fetch,
        ),
        ImageSource::OciLayout { path, tag } => archive::import_oci_layout(
            opened(path, true)?.into(),
            &name,
            tag.as_deref(),
            store.blobs(),
            &platform,
            &limits.fetch,
        ),
        ImageSource::Registry(_) => {
            return Err(format!(
                "{name}: a registry reference is pulled, not imported"
            ))
        }
    };
    result.map_err(|e| e.to_string())
}
