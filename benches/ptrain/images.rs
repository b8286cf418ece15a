//! Issue 21's benchmarks (`BENCH_ONLY=images`): what a container image
//! costs a job, against the loopback registry of the integration tests
//! (Debian's docker-registry, `tests/integration/images.rs`).
//!
//! - drop-to-active with an image against without: one ptraind in the
//!   harness, the image (the tests' busybox image) pulled by a first job,
//!   then image jobs and host jobs in turn, one at a time, measured as the
//!   latency scenario measures them ([`Bench::probe`]: the spool rename to
//!   the unit's ExecMainStartTimestamp). Warm cache: each image job still
//!   asks the registry for its tag's manifest and gets its own root
//!   (`runtime_root`), as every job does.
//! - pull throughput: a random (incompressible) image of [`IMAGE_LAYERS`]
//!   layers, written here as an OCI layout and pushed by skopeo (which
//!   gzips the layers, as for any image it pushes), pulled and unpacked
//!   by the library (the registry client and `ImageStore::prepare`, as
//!   `tests/integration/images.rs` calls them; not through ptraind, whose
//!   pull makes the same calls) into a fresh store, against `skopeo copy
//!   docker://… dir:…` of the same image into a fresh directory, in turn,
//!   each after a sync.
//!
//! Both are wall-clock ratios: reported, never enforced, like `latency.*`
//! and `throughput.*` (see the suite's module comment): on a shared CI
//! machine other work moves a 20 ms latency or a disk-bound copy by more
//! than the targets' margins.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use ptrain::images::registry::{RegistryClient, RegistryOptions};
use ptrain::images::{ImageLimits, ImageReference, ImageStore, Platform};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use super::report::{percentile, Figure, Target};
use super::{
    flush_disk, logged_at, median, say, summary, Bench, Dropper, Probe, Quiescence, Tracker, TRUE,
};
use crate::daemon::{Opts, TestDaemon, ALICE};
use crate::images::{Registry, TestImage};

/// Layers of the pulled image: the size is split evenly among them.
const IMAGE_LAYERS: u64 = 4;
/// Largest file in a layer of the random image.
const IMAGE_FILE_BYTES: u64 = 16 << 20;
/// The image job's target (issue 21): drop-to-active p50 at most this
/// many times the same job's without an image.
const IMAGE_LATENCY_TARGET: f64 = 1.2;

impl Bench<'_> {
    pub(super) fn images(&mut self) {
        say("images: docker-registry on loopback");
        let registry = Registry::start();
        // `127.0.0.1:PORT`, as references name it.
        let reference = registry.reference("v1");
        let host = reference
            .split_once('/')
            .map(|(h, _)| h.to_string())
            .unwrap_or_default();
        self.image_latency(&registry, &host);
        self.warm_pull_steps(&registry, &host);
        self.image_pull(&registry, &host);
    }

    /// Image jobs against host jobs, one at a time, in one ptraind.
    fn image_latency(&mut self, registry: &Registry, host: &str) {
        let image = TestImage::build();
        registry.push(&image, "v1");
        let reference = registry.reference("v1");
        // The latency scenario's daemon, and the loopback registry listed
        // as plain http (as an admin would).
        let extra = format!(
            "max_queued_per_user = 1000000\n\
             [jobs]\nkeep_ended_units = \"0s\"\n\
             [logs]\nmin_free = \"1%\"\n\
             [images]\ninsecure_registries = [{host:?}]\n"
        );
        say("images: booting the harness and ptraind");
        let d = TestDaemon::start_with(
            "bench-img",
            Opts {
                extra_config: extra,
                ..Opts::default()
            },
        );
        let dropper = Dropper::new(&d);
        let tracker = self.rt.block_on(Tracker::connect(&d.harness.bus_address()));
        let mut quiet = self.rt.block_on(Quiescence::connect(&d));
        // The same workdir for both: an image job binds it into its root.
        let work = d.workdir(ALICE);
        let host_job = |id: &str| {
            json!({"version": 1, "id": id, "command": [TRUE], "workdir": work}).to_string()
        };
        // The image's entrypoint is /bin/sh: `sh -c true`.
        let image_job = |id: &str| {
            json!({"version": 1, "id": id, "image": reference, "command": ["-c", "true"],
                   "workdir": work})
            .to_string()
        };
        let n = self.scale.image_jobs;
        say(&format!(
            "images: one job pulls {reference}, then {n} image and {n} host jobs in turn"
        ));
        let cold = self.probe_json(
            &tracker,
            &mut quiet,
            None,
            &dropper,
            "ip-0",
            &image_job("ip-0"),
        );
        flush_disk();
        let mut with: Vec<Probe> = Vec::new();
        let mut without: Vec<Probe> = Vec::new();
        for i in 0..n {
            // Each first every other round: both see the machine alike.
            for image_first in [i % 2 == 0, i % 2 != 0] {
                if image_first {
                    let id = format!("ii-{i}");
                    with.push(self.probe_json(
                        &tracker,
                        &mut quiet,
                        None,
                        &dropper,
                        &id,
                        &image_job(&id),
                    ));
                } else {
                    let id = format!("ih-{i}");
                    without.push(self.probe_json(
                        &tracker,
                        &mut quiet,
                        None,
                        &dropper,
                        &id,
                        &host_job(&id),
                    ));
                }
            }
        }
        let active = |probes: &[Probe]| -> Vec<f64> {
            probes.iter().filter_map(Probe::to_active_ms).collect()
        };
        let (image_ms, host_ms) = (active(&with), active(&without));
        // Where an image job's time goes: ptraind's log lines, by job
        // (journal realtime µs), against the drop and the unit's start.
        let logged = |message: &str| logged_at(&d, message);
        let (pulling, ready, replied) = (
            logged("pulling the job's image"),
            logged("the job's image is ready"),
            logged("unit started"),
        );
        let ms = |from: Option<u64>, to: Option<u64>| Some((to? as f64 - from? as f64) / 1e3);
        let between =
            |probes: &[Probe],
             from: &dyn Fn(&Probe) -> Option<u64>,
             to: &dyn Fn(&Probe) -> Option<u64>|
             -> Vec<f64> { probes.iter().filter_map(|p| ms(from(p), to(p))).collect() };
        let dropped = |p: &Probe| Some(p.dropped_at);
        fn at(log: &HashMap<String, u64>) -> impl Fn(&Probe) -> Option<u64> + '_ {
            move |p| log.get(&p.id).copied()
        }
        let started = |p: &Probe| p.started_at;
        let to_pulling = between(&with, &dropped, &at(&pulling));
        let warm_pull = between(&with, &at(&pulling), &at(&ready));
        let ready_to_reply = between(&with, &at(&ready), &at(&replied));
        let image_reply = between(&with, &dropped, &at(&replied));
        let host_reply = between(&without, &dropped, &at(&replied));
        let image_systemd = between(&with, &at(&replied), &started);
        let host_systemd = between(&without, &at(&replied), &started);
        let failed: Vec<String> = std::iter::once(&cold)
            .chain(&with)
            .chain(&without)
            .filter(|p| p.status != "succeeded")
            .map(|p| format!("{} {}", p.id, p.status))
            .collect();
        self.detail(
            "images.latency",
            json!({
                "image": reference,
                "first_job_drop_to_active_ms": cold.to_active_ms(),
                "image_drop_to_active_ms": summary(&image_ms),
                "host_drop_to_active_ms": summary(&host_ms),
                "image_drop_to_pull_start_ms": summary(&to_pulling),
                "image_pull_start_to_ready_ms": summary(&warm_pull),
                "image_ready_to_start_reply_ms": summary(&ready_to_reply),
                "image_drop_to_start_reply_ms": summary(&image_reply),
                "host_drop_to_start_reply_ms": summary(&host_reply),
                "image_start_reply_to_active_ms": summary(&image_systemd),
                "host_start_reply_to_active_ms": summary(&host_systemd),
                "not_succeeded": failed,
            }),
        );
        // A figure from failed jobs would measure the wrong thing: none.
        let ok = failed.is_empty();
        let measured = |v: Option<f64>| v.filter(|_| ok);
        let same = "same job, no image";
        // Wall clock, like `latency.*`: the target is reported, never
        // enforced (see the module comment).
        self.push(
            Figure::new(
                "images.drop_to_active_vs_host",
                &format!("image job drop-to-active p50, warm cache ({n} jobs)"),
                "ms",
                measured(percentile(&image_ms, 0.5)),
            )
            .floor(percentile(&host_ms, 0.5), same)
            .target(Target::MaxRatio(IMAGE_LATENCY_TARGET))
            .note(if ok {
                String::new()
            } else {
                format!("jobs that did not succeed: {}", failed.join(", "))
            }),
        );
        self.push(
            Figure::new(
                "images.drop_to_active_vs_host.p99",
                "  image job drop-to-active p99",
                "ms",
                measured(percentile(&image_ms, 0.99)),
            )
            .floor(percentile(&host_ms, 0.99), same),
        );
        self.push(
            Figure::new(
                "images.drop_to_start_reply.p50",
                "  drop to StartTransientUnit's reply (ptraind's part), p50",
                "ms",
                measured(percentile(&image_reply, 0.5)),
            )
            .floor(percentile(&host_reply, 0.5), same),
        );
        self.push(Figure::new(
            "images.warm_pull.p50",
            "    of which the warm pull (manifest asked, store noted, root found), p50",
            "ms",
            measured(percentile(&warm_pull, 0.5)),
        ));
        self.push(
            Figure::new(
                "images.start_reply_to_active.p50",
                "  StartTransientUnit's reply to active (systemd's part), p50",
                "ms",
                measured(percentile(&image_systemd, 0.5)),
            )
            .floor(percentile(&host_systemd, 0.5), same),
        );
        drop((quiet, tracker));
        let root = d.root.clone();
        drop(d);
        let _ = std::fs::remove_dir_all(root);
    }

    /// Where a warm image job's time goes before its unit is asked for,
    /// step by step, through the library calls ptraind's pull makes for
    /// each job (`src/daemon/images.rs`: the registry asked for the
    /// manifest, `prepare`, `note_use`, the job's root), on the image of
    /// the latency figures, already in the store: a detail, no figure.
    fn warm_pull_steps(&mut self, registry: &Registry, host: &str) {
        const STEPS: usize = 30;
        let dir = tempfile::Builder::new()
            .prefix("ptrain-bench-warm")
            .tempdir_in("/var/tmp")
            .expect("a temp dir in /var/tmp");
        let client = RegistryClient::new(RegistryOptions {
            insecure: [host.to_string()].into(),
            ..RegistryOptions::default()
        })
        .expect("a registry client");
        let reference = registry.reference("v1");
        let parsed = ImageReference::parse(&reference).expect("the image's reference parses");
        let store = ImageStore::open(&dir.path().join("store")).expect("a store");
        let points = [PathBuf::from("/srv/ptrain-bench/work")];
        let limits = ImageLimits::default();
        let mut steps: [Vec<f64>; 4] = Default::default();
        // For scale: one small file written and fsync'd beside the store.
        let mut fsync_ms = Vec::new();
        let mut error = None;
        for i in 0..=STEPS {
            let mut times = [0.0; 4];
            let mut t = Instant::now();
            let mut lap = |k: usize, t: &mut Instant| {
                times[k] = t.elapsed().as_secs_f64() * 1e3;
                *t = Instant::now();
            };
            let done = (|| -> Result<(), String> {
                let fetched = self
                    .rt
                    .block_on(client.pull(&parsed, store.blobs(), &|_| {}))
                    .map_err(|e| e.to_string())?;
                lap(0, &mut t);
                let prepared = store
                    .prepare(&fetched, &limits, ptrain::now_micros())
                    .map_err(|e| e.to_string())?;
                lap(1, &mut t);
                store
                    .note_use(&fetched.source, ALICE, ptrain::now_micros())
                    .map_err(|e| e.to_string())?;
                lap(2, &mut t);
                ptrain::images::runtime_root::runtime_root(store.root(), &prepared.rootfs, &points)
                    .map_err(|e| e.to_string())?;
                lap(3, &mut t);
                Ok(())
            })();
            if let Err(e) = done {
                error = Some(e);
                break;
            }
            let t = Instant::now();
            let probe = dir.path().join("fsync-probe");
            File::create(&probe)
                .and_then(|mut f| f.write_all(&[b'x'; 1024]).and_then(|()| f.sync_all()))
                .expect("write the fsync probe");
            fsync_ms.push(t.elapsed().as_secs_f64() * 1e3);
            let _ = std::fs::remove_file(&probe);
            // The first is the cold pull.
            if i > 0 {
                for (k, ms) in times.into_iter().enumerate() {
                    steps[k].push(ms);
                }
            }
        }
        if let Some(e) = &error {
            say(&format!("images: warm pull steps: {e}"));
        }
        let p50 = |v: &[f64]| percentile(v, 0.5);
        say(&format!(
            "images: warm pull steps, p50 ms: registry {:.2?}, prepare {:.2?}, note_use {:.2?}, root {:.2?}; a small file's fsync {:.2?}",
            p50(&steps[0]),
            p50(&steps[1]),
            p50(&steps[2]),
            p50(&steps[3]),
            p50(&fsync_ms)
        ));
        self.detail(
            "images.warm_pull_steps_ms",
            json!({
                "registry_pull": summary(&steps[0]),
                "prepare": summary(&steps[1]),
                "note_use": summary(&steps[2]),
                "runtime_root": summary(&steps[3]),
                "small_file_fsync": summary(&fsync_ms),
                "error": error,
            }),
        );
    }

    /// ptrain's pull and unpack of a random image against skopeo's copy.
    fn image_pull(&mut self, registry: &Registry, host: &str) {
        let mib = self.scale.image_pull_mib;
        let runs = self.scale.image_pull_runs.max(1);
        let dir = tempfile::Builder::new()
            .prefix("ptrain-bench-pull")
            .tempdir_in("/var/tmp")
            .expect("a temp dir in /var/tmp");
        let started = Instant::now();
        let layout = dir.path().join("layout");
        build_random_image(&layout, "big", mib << 20);
        say(&format!(
            "images: {mib} MiB random image written as uncompressed layers in {:.1} s",
            started.elapsed().as_secs_f64()
        ));
        let reference = registry.reference("big");
        let t = Instant::now();
        let pushed = push_and_inspect(&layout, "big", &reference);
        let _ = std::fs::remove_dir_all(&layout);
        let (blob_bytes, media_types) = match pushed {
            Ok(pushed) => pushed,
            Err(why) => {
                say(&format!("images: cannot push {reference}: {why}"));
                for key in [
                    "images.pull_vs_skopeo",
                    "images.pull_only_vs_skopeo",
                    "images.unpack",
                ] {
                    self.push(
                        Figure::new(key, key, "MiB/s", None)
                            .note(format!("skopeo cannot push the image: {why}")),
                    );
                }
                return;
            }
        };
        say(&format!(
            "images: gzip'd and pushed by skopeo in {:.1} s ({blob_bytes} bytes of blobs); \
             {runs} pulls each by ptrain and skopeo, in turn",
            t.elapsed().as_secs_f64()
        ));
        let client = RegistryClient::new(RegistryOptions {
            insecure: [host.to_string()].into(),
            ..RegistryOptions::default()
        })
        .expect("a registry client");
        let parsed = ImageReference::parse(&reference).expect("the image's reference parses");
        let mut skopeo_s = Vec::new();
        let mut pull_s = Vec::new();
        let mut unpack_s = Vec::new();
        let mut total_s = Vec::new();
        let mut errors = Vec::new();
        for run in 0..runs {
            for ptrain_first in [run % 2 == 1, run % 2 == 0] {
                flush_disk();
                if ptrain_first {
                    let store_dir = dir.path().join(format!("store-{run}"));
                    match self.ptrain_pull(&client, &parsed, &store_dir) {
                        Ok((pull, unpack)) => {
                            pull_s.push(pull);
                            unpack_s.push(unpack);
                            total_s.push(pull + unpack);
                        }
                        Err(e) => errors.push(format!("ptrain: {e}")),
                    }
                    remove_all(&store_dir);
                } else {
                    let dest = dir.path().join(format!("skopeo-{run}"));
                    match skopeo_copy(&reference, &dest) {
                        Ok(secs) => skopeo_s.push(secs),
                        Err(e) => errors.push(format!("skopeo: {e}")),
                    }
                    remove_all(&dest);
                }
            }
        }
        for e in &errors {
            say(&format!("images: {e}"));
        }
        let rate = |secs: &[f64]| -> Option<f64> {
            let s = median(secs)?;
            (s > 0.0 && errors.is_empty()).then(|| blob_bytes as f64 / (1 << 20) as f64 / s)
        };
        say(&format!(
            "images: pull {pull_s:.2?} s, unpack {unpack_s:.2?} s, skopeo {skopeo_s:.2?} s"
        ));
        self.detail(
            "images.pull",
            json!({
                "image_mib": mib,
                "layers": IMAGE_LAYERS,
                "blob_bytes": blob_bytes,
                "layer_media_types": media_types,
                "ptrain_pull_s": pull_s,
                "ptrain_unpack_s": unpack_s,
                "ptrain_pull_and_unpack_s": total_s,
                "skopeo_copy_s": skopeo_s,
                "errors": errors,
            }),
        );
        let size = if mib >= 1024 && mib.is_multiple_of(1024) {
            format!("{} GiB", mib / 1024)
        } else {
            format!("{mib} MiB")
        };
        let skopeo = "skopeo copy to dir:";
        // Wall clock on a shared machine: reported, never enforced.
        self.push(
            Figure::new(
                "images.pull_vs_skopeo",
                &format!("image pull+unpack, {size} random, loopback registry (median of {runs})"),
                "MiB/s",
                rate(&total_s),
            )
            .floor(rate(&skopeo_s), skopeo)
            .target(Target::MinRatio(1.0))
            .note(format!(
                "ptrain's pull measured by calling the library (RegistryClient::pull, then \
                 ImageStore::prepare into a fresh store), not through ptraind; skopeo's dir: copy \
                 verifies and writes the compressed layers only, ptrain also unpacks them; \
                 {IMAGE_LAYERS} layers of random bytes gzip'd by skopeo, 16 MiB at smoke scale, \
                 1 GiB at ci and full"
            )),
        );
        self.push(
            Figure::new(
                "images.pull_only_vs_skopeo",
                "  image pull alone (fetched and verified, not unpacked)",
                "MiB/s",
                rate(&pull_s),
            )
            .floor(rate(&skopeo_s), skopeo),
        );
        self.push(Figure::new(
            "images.unpack",
            "  image unpack alone (ImageStore::prepare)",
            "MiB/s",
            rate(&unpack_s),
        ));
    }

    /// One pull and prepare into a fresh store at `store_dir`: seconds of
    /// each.
    fn ptrain_pull(
        &mut self,
        client: &RegistryClient,
        reference: &ImageReference,
        store_dir: &Path,
    ) -> Result<(f64, f64), String> {
        let store = ImageStore::open(store_dir).map_err(|e| e.to_string())?;
        let t = Instant::now();
        let fetched = self
            .rt
            .block_on(client.pull(reference, store.blobs(), &|_| {}))
            .map_err(|e| e.to_string())?;
        let pulled = t.elapsed().as_secs_f64();
        let t = Instant::now();
        store
            .prepare(&fetched, &ImageLimits::default(), ptrain::now_micros())
            .map_err(|e| e.to_string())?;
        Ok((pulled, t.elapsed().as_secs_f64()))
    }
}

/// `skopeo copy docker://REFERENCE dir:DEST`: its seconds.
fn skopeo_copy(reference: &str, dest: &Path) -> Result<f64, String> {
    let t = Instant::now();
    let out = Command::new("skopeo")
        .args([
            "--insecure-policy",
            "copy",
            "--quiet",
            "--src-tls-verify=false",
        ])
        .arg(format!("docker://{reference}"))
        .arg(format!("dir:{}", dest.display()))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("skopeo: {e}"))?;
    let secs = t.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(secs)
}

fn remove_all(path: &Path) {
    if let Err(e) = std::fs::remove_dir_all(path) {
        if e.kind() != io::ErrorKind::NotFound {
            say(&format!("cannot remove {}: {e}", path.display()));
        }
    }
}

/// A writer that hashes (sha256) and counts what goes through it.
struct Hashing<W> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> Hashing<W> {
    fn new(inner: W) -> Hashing<W> {
        Hashing {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    /// `sha256:HEX`, the bytes, and the writer.
    fn finish(self) -> (String, u64, W) {
        let hex = hex::encode(self.hasher.finalize());
        (format!("sha256:{hex}"), self.bytes, self.inner)
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Writes an OCI layout at `layout` whose tag `tag` is an image of
/// [`IMAGE_LAYERS`] uncompressed layers holding `bytes` of random data in
/// all (files of at most [`IMAGE_FILE_BYTES`]); one thread per layer.
fn build_random_image(layout: &Path, tag: &str, bytes: u64) {
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).expect("create the layout");
    let per_layer = (bytes / IMAGE_LAYERS).max(1);
    // (blob digest, blob size, diff id) of each layer, bottom first.
    let layers: Vec<(String, u64, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..IMAGE_LAYERS)
            .map(|i| {
                let blobs = &blobs;
                s.spawn(move || random_layer(blobs, i, per_layer))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a layer thread"))
            .collect()
    });
    let platform = Platform::host();
    let config = serde_json::to_vec(&json!({
        "architecture": platform.architecture,
        "os": "linux",
        "config": {"Entrypoint": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| &l.2).collect::<Vec<_>>()},
    }))
    .expect("a config");
    let config_digest = write_blob(&blobs, &config);
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config.len(),
        },
        "layers": layers.iter().map(|(digest, size, _)| json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": digest,
            "size": size,
        })).collect::<Vec<_>>(),
    }))
    .expect("a manifest");
    let manifest_digest = write_blob(&blobs, &manifest);
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }],
    });
    std::fs::write(layout.join("index.json"), index.to_string()).expect("write index.json");
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .expect("write oci-layout");
}

/// Pushes tag `tag` of the OCI layout at `layout` to `reference` with
/// skopeo, which gzips the uncompressed layers on the way (with Go's
/// gzip, as it does for any image it pushes); the bytes a pull then
/// fetches after the manifest (the config and the layers, as the
/// registry's manifest says) and the layers' media types.
fn push_and_inspect(
    layout: &Path,
    tag: &str,
    reference: &str,
) -> Result<(u64, Vec<String>), String> {
    let docker = format!("docker://{reference}");
    let run = |args: &[&str]| -> Result<Vec<u8>, String> {
        let out = Command::new("skopeo")
            .arg("--insecure-policy")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("skopeo: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(out.stdout)
    };
    let source = format!("oci:{}:{tag}", layout.display());
    run(&[
        "copy",
        "--quiet",
        "--dest-tls-verify=false",
        &source,
        &docker,
    ])?;
    let raw = run(&["inspect", "--raw", "--tls-verify=false", &docker])?;
    let manifest: serde_json::Value =
        serde_json::from_slice(&raw).map_err(|e| format!("the pushed manifest: {e}"))?;
    let layers = manifest["layers"].as_array().cloned().unwrap_or_default();
    let bytes = manifest["config"]["size"].as_u64().unwrap_or(0)
        + layers
            .iter()
            .filter_map(|l| l["size"].as_u64())
            .sum::<u64>();
    let types = layers
        .iter()
        .map(|l| l["mediaType"].as_str().unwrap_or_default().to_string())
        .collect();
    Ok((bytes, types))
}

/// Writes a small blob; its digest.
fn write_blob(blobs: &Path, bytes: &[u8]) -> String {
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(bytes)));
    std::fs::write(blobs.join(&digest["sha256:".len()..]), bytes).expect("write a blob");
    digest
}

/// Layer `i`: `bytes` of random data in files under `data/`, as an
/// uncompressed tar in `blobs` (skopeo gzips it on its way to the
/// registry); its (blob digest, blob size, diff id): the digest is the
/// diff id.
fn random_layer(blobs: &Path, i: u64, bytes: u64) -> (String, u64, String) {
    let temp: PathBuf = blobs.join(format!("layer-{i}.tmp"));
    let file = File::create(&temp).expect("create a layer");
    let mut tar = tar::Builder::new(Hashing::new(io::BufWriter::new(file)));
    let mut rng = fastrand::Rng::with_seed(0x5eed + i);
    let mut buf = vec![0u8; IMAGE_FILE_BYTES.min(bytes) as usize];
    let mut left = bytes;
    let mut n = 0;
    while left > 0 {
        let len = left.min(IMAGE_FILE_BYTES) as usize;
        rng.fill(&mut buf[..len]);
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(len as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        tar.append_data(&mut header, format!("data/{i}/{n}"), &buf[..len])
            .expect("write a layer entry");
        left -= len as u64;
        n += 1;
    }
    let (digest, size, out) = tar.into_inner().expect("finish a layer's tar").finish();
    out.into_inner()
        .map_err(|e| e.into_error())
        .and_then(|f| f.sync_all())
        .expect("write a layer");
    std::fs::rename(&temp, blobs.join(&digest["sha256:".len()..])).expect("name a layer");
    (digest.clone(), size, digest)
}
