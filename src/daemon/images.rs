//! A job's image made ready off the state task (issue 21): pulled or
//! imported, verified and unpacked into the store ([`crate::images`]),
//! then the job's own root made ([`crate::images::runtime_root`]). The
//! answer comes back to the state task as an [`Event::ImageReady`]; until
//! then the job is `pulling`: queued, never planned, holding no GPU.
//!
//! The store is collected by `[images]` ([`crate::images::ImagesConfig`])
//! from a task of its own: once at start, after each image job ends, and
//! every [`COLLECT_EVERY`] (so `max_unused` holds on an idle host).
//! A collection removes what no record names, so it never runs beside a
//! pull: every pull holds [`Images::lock`] shared from before its fetch
//! until its [`Event::ImageReady`] is sent, a collection holds it alone.
//! Only then does the collection ask the state task which images its
//! jobs need ([`Event::ImagesInUse`]): every ready answer sent before is
//! already applied there (one channel, in order), so an image a job just
//! got is among them.
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

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot, Notify, OnceCell, RwLock};
use tracing::{debug, info, warn};

use crate::fsutil;
use crate::images::auth::{self, AdminAuth};
use crate::images::registry::{Credentials, PullProgress, RegistryClient, RegistryOptions};
use crate::images::{
    archive, runtime_root, Digest, ImageLimits, ImageSource, ImageStore, ImagesConfig, Platform,
};
use crate::requests::ApiError;
use crate::store::{JobRecord, ReadyImage};
use crate::users::Owner;
use crate::views::ImageView;

use super::Event;

/// An image in the store: what every job of it shares.
#[derive(Clone, Debug)]
struct Pulled {
    digest: String,
    tree: PathBuf,
    run: crate::images::manifest::RunConfig,
}

type Cell = Arc<OnceCell<Result<Pulled, String>>>;

/// How often the store is collected when no image job ends.
const COLLECT_EVERY: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// The image store and the pulls under way.
pub(super) struct Images {
    /// What each job's pull works with (shared).
    pull: Pull,
    events: mpsc::UnboundedSender<Event>,
    /// Shared by each pull (fetch, unpack, the job's root, its answer
    /// sent), held alone by a collection.
    lock: Arc<RwLock<()>>,
    /// Wakes the collector; wakes while it works coalesce into one more.
    collect: Arc<Notify>,
}

/// What the state task's jobs need of the store, for a collection: the
/// digests live jobs recorded (queued, launching, running), and the
/// images (as the jobs name them) of jobs still pulling.
#[derive(Debug, Default)]
pub struct InUse {
    pub(super) digests: BTreeSet<String>,
    pub(super) pulling: BTreeSet<String>,
}

impl InUse {
    /// What `records` (the live jobs) need.
    pub(super) fn of<'a>(records: impl IntoIterator<Item = &'a JobRecord>) -> InUse {
        let mut in_use = InUse::default();
        for record in records {
            match (&record.image, &record.spec.image) {
                (Some(ready), _) => {
                    in_use.digests.insert(ready.digest.clone());
                }
                (None, Some(reference)) => {
                    in_use.pulling.insert(reference.clone());
                }
                (None, None) => {}
            }
        }
        in_use
    }
}

/// The job a pull was started for, as its record was then: the image
/// as named, the digest it is pinned to, its owner and its claim's time.
/// A job's pull starts before its claim is written ([`super::Daemon`]'s
/// `claim`); when that write fails the file is claimed again later, as a
/// job of the same id but a later claim (or, the file replaced, another
/// image or owner): the first pull's answer must not be taken for its.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    image: Option<String>,
    pin: Option<String>,
    uid: u32,
    submitted_at: u64,
}

impl Wanted {
    pub(super) fn of(record: &JobRecord) -> Wanted {
        Wanted {
            image: record.spec.image.clone(),
            pin: record.image_pin.clone(),
            uid: record.owner.uid,
            submitted_at: record.submitted_at,
        }
    }
}

impl Images {
    /// The store under `dir` (root's, 0700: job users never see it; its
    /// trees reach them only as their units' roots), pulled into and
    /// collected as `config` says. Starts the collector, which runs a
    /// first collection at once.
    pub(super) fn open(
        dir: &std::path::Path,
        config: &ImagesConfig,
        events: mpsc::UnboundedSender<Event>,
    ) -> Result<Images, String> {
        let store = Arc::new(ImageStore::open(dir).map_err(|e| e.to_string())?);
        let client = RegistryClient::new(RegistryOptions {
            insecure: config.insecure_registries.clone(),
            ..RegistryOptions::default()
        })
        .map_err(|e| e.to_string())?;
        let lock = Arc::new(RwLock::new(()));
        let collect = Arc::new(Notify::new());
        tokio::spawn(collector(
            store.clone(),
            config.clone(),
            lock.clone(),
            collect.clone(),
            events.clone(),
        ));
        collect.notify_one();
        Ok(Images {
            pull: Pull {
                store,
                client: Arc::new(client),
                limits: ImageLimits {
                    max_unpacked_bytes: config.max_image_size,
                    ..ImageLimits::default()
                },
                pulls: Default::default(),
                progress: Default::default(),
                admin_auth: AdminAuth {
                    path: config.auth_file.clone(),
                },
            },
            events,
            lock,
            collect,
        })
    }

    /// Collects the store soon (an image job ended), off the state task.
    pub(super) fn collect_soon(&self) {
        self.collect.notify_one();
    }

    /// `ptrain images`: the store's images as `caller_uid` sees them,
    /// read off the state task and sent to `reply`.
    pub(super) fn list(
        &self,
        caller_uid: u32,
        see_all: bool,
        reply: oneshot::Sender<Result<Vec<ImageView>, ApiError>>,
    ) {
        let store = self.pull.store.clone();
        tokio::task::spawn_blocking(move || {
            let listing = store.list().map_err(|e| ApiError::Images(e.to_string()));
            let caller = if see_all || caller_uid == 0 {
                None
            } else {
                // A caller with no name sees no one's.
                Some(
                    crate::users::owner_of_uid(caller_uid)
                        .map(|o| o.name)
                        .unwrap_or_default(),
                )
            };
            let views = listing.map(|listing| {
                listing
                    .into_iter()
                    .map(|image| ImageView::seen_by(image, caller.as_deref()))
                    .collect()
            });
            let _ = reply.send(views);
        });
    }

    /// How far the pull of `reference` is, in bytes: (done, in all).
    pub(super) fn progress(&self, reference: &str) -> Option<(u64, u64)> {
        self.pull.progress.lock().ok()?.get(reference).copied()
    }

    /// Makes `record`'s image ready for it, with `mount_points` (its
    /// workdir) in its root; [`Event::ImageReady`] says how it went.
    pub(super) fn want(&self, record: &JobRecord, mount_points: Vec<PathBuf>) {
        let Some(mut reference) = record.spec.image.clone() else {
            return;
        };
        // An attempt restarted after its image was collected runs the
        // digest it ran before: a registry is asked for that digest.
        let pin = record.image_pin.clone();
        if let (Some(pin), Ok(ImageSource::Registry(image))) =
            (&pin, ImageSource::parse(&reference))
        {
            if image.digest.is_none() {
                reference = format!("{reference}@{pin}");
            }
        }
        let id = record.id.clone();
        let wanted = Wanted::of(record);
        let owner = record.owner.clone();
        let pull = self.pull.clone();
        let events = self.events.clone();
        let lock = self.lock.clone();
        info!(job = %id, PTRAIN_JOB = %id, image = %reference, "pulling the job's image");
        tokio::spawn(async move {
            // Held until the answer is sent: see the module's comment.
            let _pulling = lock.read().await;
            let result = ready(&reference, &owner, mount_points, pull)
            .await
            .and_then(|ready| match pin {
                Some(pin) if pin != ready.digest => Err(format!(
                    "{reference} is now image {} but this job ran {pin}; submit it as a new job to run the new image",
                    ready.digest
                )),
                _ => Ok(ready),
            });
            let _ = events.send(Event::ImageReady { id, wanted, result });
        });
    }
}

/// What a job's pull works with: the store and the client, and the
/// tables every pull shares.
#[derive(Clone)]
struct Pull {
    store: Arc<ImageStore>,
    client: Arc<RegistryClient>,
    limits: ImageLimits,
    /// Pulls under way, by what they fetch (a local source, or a pull
    /// with its owner's own credentials: and whose).
    pulls: Arc<Mutex<HashMap<String, Cell>>>,
    /// Bytes done and in all, by image reference, for `ptrain status`.
    progress: Arc<Mutex<HashMap<String, (u64, u64)>>>,
    /// The admin's registry credentials (`[images] auth_file`).
    admin_auth: AdminAuth,
}

/// The credentials `owner`'s pull from `registry` uses, and whether they
/// are the owner's own: the owner's own file first (read as them), else
/// the admin's (read as root, refused unless root's alone).
async fn credentials_for(
    owner: &Owner,
    registry: &str,
    admin: &AdminAuth,
) -> Result<(Option<Credentials>, bool), String> {
    let (owner, registry, admin) = (owner.clone(), registry.to_owned(), admin.clone());
    tokio::task::spawn_blocking(move || {
        let own = auth::read_user(&owner.home, owner.uid, owner.gid, &owner.groups, &registry)
            .map_err(|e| e.to_string())?;
        if own.is_some() {
            return Ok((own, true));
        }
        let admins = admin.read().map_err(|e| e.to_string())?;
        Ok((admins.get(&registry).cloned(), false))
    })
    .await
    .map_err(|e| format!("reading registry credentials: {e}"))?
}

async fn ready(
    reference: &str,
    owner: &Owner,
    mount_points: Vec<PathBuf>,
    pull: Pull,
) -> Result<ReadyImage, String> {
    let Pull {
        store,
        client,
        limits,
        pulls,
        progress,
        admin_auth,
    } = pull;
    let source = ImageSource::parse(reference).map_err(|e| e.to_string())?;
    // The store's record names the image as the source normalized
    // (`ubuntu` is `docker.io/library/ubuntu:latest`).
    let job = JobRoot {
        reference: source.to_string(),
        user: owner.name.clone(),
        mount_points,
    };
    // A pull with its owner's own credentials (or of a file opened with
    // their rights) is theirs alone: no other user's job joins it.
    let (key, credentials) = match &source {
        ImageSource::Registry(image) => {
            let (credentials, own) = credentials_for(owner, &image.registry, &admin_auth).await?;
            let key = match own {
                true => format!("{reference}\0{}", owner.uid),
                false => reference.to_owned(),
            };
            (key, credentials)
        }
        _ => (format!("{reference}\0{}", owner.uid), None),
    };
    let cell = pulls
        .lock()
        .map_err(|_| "the pulls' table is poisoned".to_owned())?
        .entry(key.clone())
        .or_default()
        .clone();
    // The job whose pull this is gets its root from the pull's own
    // blocking call (`fetch`); a job that joined another's pull makes
    // its own after.
    let mut made = None;
    let pulled = cell
        .get_or_init(|| {
            fetch(
                reference,
                source,
                owner.clone(),
                credentials,
                store.clone(),
                client,
                limits,
                progress.clone(),
                job.clone(),
                &mut made,
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
    let rootfs = match made {
        Some(made) => made?,
        None => {
            let tree = pulled.tree.clone();
            tokio::task::spawn_blocking(move || job.make(&store, &tree))
                .await
                .map_err(|e| format!("the job's root: {e}"))??
        }
    };
    Ok(ReadyImage {
        digest: pulled.digest,
        rootfs,
        run: pulled.run,
    })
}

/// What one job needs of its image once the image is prepared: its use
/// noted in the store's record, and its own root.
#[derive(Clone)]
struct JobRoot {
    /// The image's reference as the store's record names it.
    reference: String,
    /// The job's owner, noted among the image's users.
    user: String,
    mount_points: Vec<PathBuf>,
}

impl JobRoot {
    /// The job's root, cloned from `tree` (found, on a warm pull of
    /// these mount points). Blocking.
    fn make(&self, store: &ImageStore, tree: &std::path::Path) -> Result<PathBuf, String> {
        if let Err(e) = store.note_use(&self.reference, &self.user, crate::now_micros()) {
            warn!(image = %self.reference, error = %e, "cannot note the image's use");
        }
        runtime_root::runtime_root(store.root(), tree, &self.mount_points)
            .map_err(|e| e.to_string())
    }
}

/// The image fetched into the store and its tree assembled; and, in the
/// same blocking call as the tree (a warm pull makes one hop off the
/// runtime, not three), `job`'s root, put in `made`.
#[allow(clippy::too_many_arguments)]
async fn fetch(
    reference: &str,
    source: ImageSource,
    owner: Owner,
    credentials: Option<Credentials>,
    store: Arc<ImageStore>,
    client: Arc<RegistryClient>,
    limits: ImageLimits,
    progress: Arc<Mutex<HashMap<String, (u64, u64)>>>,
    job: JobRoot,
    made: &mut Option<Result<PathBuf, String>>,
) -> Result<Pulled, String> {
    // Blocking: the image prepared (unpacked once, found on a warm
    // pull), then the job's root.
    let finish = move |store: &ImageStore, fetched: &crate::images::Fetched| {
        let prepared = store
            .prepare(fetched, &limits, crate::now_micros())
            .map_err(|e| e.to_string())?;
        let root = job.make(store, &prepared.rootfs);
        Ok::<_, String>((prepared, root))
    };
    let (prepared, root) = match &source {
        ImageSource::Registry(image) => {
            let name = reference.to_owned();
            let report = move |p: &PullProgress| {
                if let Ok(mut progress) = progress.lock() {
                    progress.insert(name.clone(), (p.done, p.total));
                }
            };
            let fetched = client
                .pull_as(image, store.blobs(), &report, credentials)
                .await
                .map_err(|e| e.to_string())?;
            tokio::task::spawn_blocking(move || finish(&store, &fetched))
                .await
                .map_err(|e| format!("unpacking the image: {e}"))??
        }
        _ => tokio::task::spawn_blocking(move || {
            let fetched = import_as(&source, &owner, &store, &limits)?;
            finish(&store, &fetched)
        })
        .await
        .map_err(|e| format!("importing the image: {e}"))??,
    };
    *made = Some(root);
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
        // Never blocking, never a terminal, only a regular file (or the
        // layout's directory): a FIFO, a tty or a device a user names can
        // neither hang the pull nor become ptraind's controlling terminal.
        fsutil::as_user(owner.uid, owner.gid, &owner.groups, || {
            archive::open_source(path, dir)
        })
        .map_err(|e| format!("{name}: cannot take the owner's identity: {e}"))?
        .map_err(|e| {
            format!(
                "{name}: {} cannot open {}: {e}; name a regular file the job's owner can read (ptraind has a /tmp of its own: keep archives elsewhere)",
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
        ImageSource::OciLayout { path, tag } => archive::import_oci_layout_as(
            opened(path, true)?.into(),
            Some((owner.uid, owner.gid, owner.groups.clone())),
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

/// Collects the store each time it is woken (or [`COLLECT_EVERY`]),
/// holding [`Images::lock`] alone; ends with the state task.
async fn collector(
    store: Arc<ImageStore>,
    config: ImagesConfig,
    lock: Arc<RwLock<()>>,
    wake: Arc<Notify>,
    events: mpsc::UnboundedSender<Event>,
) {
    loop {
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(COLLECT_EVERY) => {}
        }
        let _alone = lock.write().await;
        let (reply, answer) = oneshot::channel();
        if events.send(Event::ImagesInUse(reply)).is_err() {
            return;
        }
        let Ok(in_use) = answer.await else {
            return;
        };
        let store = store.clone();
        let config = config.clone();
        let done = tokio::task::spawn_blocking(move || {
            collect(&store, &config, &in_use, crate::now_micros())
        })
        .await;
        match done {
            Ok(Ok((plan, report))) => {
                let removed =
                    report.images + report.roots + report.trees + report.layers + report.blobs;
                if removed > 0 {
                    info!(
                        images = ?plan.remove,
                        roots = report.roots,
                        trees = report.trees,
                        layers = report.layers,
                        blobs = report.blobs,
                        bytes_before = plan.bytes_before,
                        bytes_after = plan.bytes_after,
                        "image store collected ([images] max_size, max_unused): removed {} image(s)",
                        report.images
                    );
                } else {
                    debug!(
                        bytes = plan.bytes_after,
                        "image store collected: nothing to remove"
                    );
                }
            }
            Ok(Err(e)) => {
                warn!(error = %e, "cannot collect the image store; it is tried again after the next image job ends, or in 6 hours")
            }
            Err(e) => warn!(error = %e, "the image store's collection failed"),
        }
    }
}

/// One collection: the plan of `[images]` over the store's records,
/// keeping every image `in_use` names, then removed. An image in use is
/// used now: its `max_unused` counts from the end of its last job.
/// Blocking.
fn collect(
    store: &ImageStore,
    config: &ImagesConfig,
    in_use: &InUse,
    now: u64,
) -> Result<(crate::images::GcPlan, crate::images::store::GcReport), crate::images::StoreError> {
    let mut records = store.records()?;
    let pulling: BTreeSet<String> = in_use
        .pulling
        .iter()
        .filter_map(|r| ImageSource::parse(r).ok())
        .map(|s| s.to_string())
        .collect();
    let mut keep: BTreeSet<Digest> = in_use
        .digests
        .iter()
        .filter_map(|d| Digest::parse(d).ok())
        .collect();
    keep.extend(
        records
            .iter()
            .filter(|r| pulling.contains(&r.reference))
            .map(|r| r.manifest.clone()),
    );
    for record in records.iter_mut().filter(|r| keep.contains(&r.manifest)) {
        store.touch(&record.reference, now)?;
        record.last_used = record.last_used.max(now);
    }
    let plan = crate::images::catalog::plan_gc(&records, &config.gc_policy(keep), now);
    let report = store.collect(&plan)?;
    Ok((plan, report))
}
