//! What the store holds, image by image, and what to remove when it is
//! too big or too old (pure: the store reads and removes,
//! [`super::store::ImageStore::collect`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::reference::Digest;

/// One layer of an image, as the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerUse {
    /// The uncompressed tar's digest: names the unpacked layer directory.
    pub diff_id: Digest,
    /// Bytes of files in the unpacked layer.
    pub bytes: u64,
    /// The blob it was unpacked from, and its size.
    pub blob: Digest,
    pub blob_bytes: u64,
}

/// How far an image record's `last_used` on disk may lag behind its last
/// use (µs): a collection's ages are hours or days, and so a warm job
/// start, one after another, writes and fsyncs no record at all.
pub const LAST_USED_GRAIN_US: u64 = 60_000_000;

/// One image of the store, under one reference (`STORE/images/*.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// The source as the job named it, normalized.
    pub reference: String,
    /// The image manifest's digest.
    pub manifest: Digest,
    /// The index it was chosen from, when there was one.
    #[serde(default)]
    pub index: Option<Digest>,
    pub config: Digest,
    /// The assembled tree's name (the layers' chain id).
    pub chain_id: Digest,
    pub layers: Vec<LayerUse>,
    /// Bytes of the manifest, index and config blobs.
    pub meta_bytes: u64,
    /// When it was first made ready, and last given to a job (µs).
    pub prepared_at: u64,
    pub last_used: u64,
    /// The users whose jobs used it.
    #[serde(default)]
    pub users: BTreeSet<String>,
}

impl ImageRecord {
    /// Every blob the image needs kept.
    pub fn blobs(&self) -> impl Iterator<Item = &Digest> {
        [&self.manifest, &self.config]
            .into_iter()
            .chain(self.index.iter())
            .chain(self.layers.iter().map(|l| &l.blob))
    }

    /// Whether `self`, the record as it should now be, must be written
    /// over `stored`, the one on disk: not when only its `last_used`
    /// moved, by less than [`LAST_USED_GRAIN_US`].
    pub fn needs_write_over(&self, stored: Option<&ImageRecord>) -> bool {
        let Some(stored) = stored else {
            return true;
        };
        let moved = self.last_used.saturating_sub(stored.last_used);
        let same_but_use = ImageRecord {
            last_used: self.last_used,
            ..stored.clone()
        };
        same_but_use != *self || moved >= LAST_USED_GRAIN_US
    }

    /// What it costs alone: unpacked layers, their blobs, its metadata.
    pub fn bytes(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| l.bytes + l.blob_bytes)
            .sum::<u64>()
            + self.meta_bytes
    }
}

/// What `ptrain images` shows of one image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageListing {
    pub reference: String,
    pub digest: Digest,
    pub bytes: u64,
    pub last_used: u64,
    pub users: Vec<String>,
}

/// The store's images for a listing, by reference.
pub fn listing(records: &[ImageRecord]) -> Vec<ImageListing> {
    let mut out: Vec<ImageListing> = records
        .iter()
        .map(|r| ImageListing {
            reference: r.reference.clone(),
            digest: r.manifest.clone(),
            bytes: r.bytes(),
            last_used: r.last_used,
            users: r.users.iter().cloned().collect(),
        })
        .collect();
    out.sort_by(|a, b| a.reference.cmp(&b.reference));
    out
}

/// The bytes the records take together: a layer or blob shared by
/// several images counts once.
pub fn total_bytes<'a>(records: impl IntoIterator<Item = &'a ImageRecord>) -> u64 {
    let mut layers: BTreeMap<&Digest, u64> = BTreeMap::new();
    let mut blobs: BTreeMap<&Digest, u64> = BTreeMap::new();
    let mut meta = 0;
    for r in records {
        for l in &r.layers {
            layers.insert(&l.diff_id, l.bytes);
            blobs.insert(&l.blob, l.blob_bytes);
        }
        meta += r.meta_bytes;
    }
    layers.values().sum::<u64>() + blobs.values().sum::<u64>() + meta
}

/// When images go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcPolicy {
    /// Remove the least recently used images until the store is at most
    /// this big.
    pub max_total_bytes: Option<u64>,
    /// Remove images not used for this long (µs).
    pub max_unused_micros: Option<u64>,
    /// Manifest digests that stay whatever the rest says: the images of
    /// queued and running jobs.
    pub keep: BTreeSet<Digest>,
}

/// What a collection removes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcPlan {
    /// References of the records to remove, least recently used first.
    pub remove: Vec<String>,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// Which images to remove: every one unused past the age limit, then the
/// least recently used until the store fits the size limit; never one in
/// `keep` (the store may stay over its size then).
pub fn plan_gc(records: &[ImageRecord], policy: &GcPolicy, now: u64) -> GcPlan {
    let bytes_before = total_bytes(records);
    let mut candidates: Vec<&ImageRecord> = records
        .iter()
        .filter(|r| !policy.keep.contains(&r.manifest))
        .collect();
    candidates.sort_by(|a, b| {
        a.last_used
            .cmp(&b.last_used)
            .then_with(|| a.reference.cmp(&b.reference))
    });
    let mut removed: BTreeSet<&str> = BTreeSet::new();
    if let Some(age) = policy.max_unused_micros {
        for r in &candidates {
            if now.saturating_sub(r.last_used) > age {
                removed.insert(&r.reference);
            }
        }
    }
    let remaining = |removed: &BTreeSet<&str>| {
        total_bytes(
            records
                .iter()
                .filter(|r| !removed.contains(r.reference.as_str())),
        )
    };
    if let Some(max) = policy.max_total_bytes {
        for r in &candidates {
            if remaining(&removed) <= max {
                break;
            }
            removed.insert(&r.reference);
        }
    }
    GcPlan {
        remove: candidates
            .iter()
            .filter(|r| removed.contains(r.reference.as_str()))
            .map(|r| r.reference.clone())
            .collect(),
        bytes_before,
        bytes_after: remaining(&removed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(n: u8) -> Digest {
        Digest::of(&[n])
    }

    /// An image named `reference`, with layers `(n, bytes)` whose blobs
    /// are a tenth of their size, last used at `used`.
    fn image(reference: &str, manifest: u8, layers: &[(u8, u64)], used: u64) -> ImageRecord {
        ImageRecord {
            reference: reference.to_string(),
            manifest: d(manifest),
            index: None,
            config: d(manifest + 100),
            chain_id: d(manifest + 50),
            layers: layers
                .iter()
                .map(|(n, bytes)| LayerUse {
                    diff_id: d(*n),
                    bytes: *bytes,
                    blob: d(n + 200),
                    blob_bytes: bytes / 10,
                })
                .collect(),
            meta_bytes: 0,
            prepared_at: used,
            last_used: used,
            users: ["alice".to_string()].into(),
        }
    }

    #[test]
    fn shared_layers_count_once() {
        let a = image("a", 1, &[(10, 1000), (11, 100)], 5);
        let b = image("b", 2, &[(10, 1000), (12, 50)], 6);
        assert_eq!(a.bytes(), 1100 + 110);
        assert_eq!(total_bytes([&a, &b]), 1000 + 100 + 50 + 100 + 10 + 5);
        let l = listing(&[b.clone(), a.clone()]);
        assert_eq!(l[0].reference, "a");
        assert_eq!(l[1].digest, d(2));
        assert_eq!(l[0].users, vec!["alice".to_string()]);
        assert_eq!(a.blobs().count(), 4);
    }

    #[test]
    fn the_least_recently_used_go_first_until_the_store_fits() {
        let records = vec![
            image("new", 1, &[(1, 1000)], 300),
            image("old", 2, &[(2, 1000)], 100),
            image("mid", 3, &[(3, 1000)], 200),
        ];
        let policy = GcPolicy {
            max_total_bytes: Some(2500),
            ..GcPolicy::default()
        };
        let plan = plan_gc(&records, &policy, 400);
        assert_eq!(plan.remove, vec!["old".to_string()]);
        assert_eq!((plan.bytes_before, plan.bytes_after), (3300, 2200));

        let tight = GcPolicy {
            max_total_bytes: Some(1000),
            ..GcPolicy::default()
        };
        assert_eq!(
            plan_gc(&records, &tight, 400).remove,
            vec!["old", "mid", "new"]
        );
    }

    #[test]
    fn kept_images_stay_even_over_the_limit() {
        let records = vec![
            image("running", 1, &[(1, 1000)], 100),
            image("idle", 2, &[(2, 1000)], 200),
        ];
        let policy = GcPolicy {
            max_total_bytes: Some(0),
            max_unused_micros: Some(1),
            keep: [d(1)].into(),
        };
        let plan = plan_gc(&records, &policy, 1000);
        assert_eq!(plan.remove, vec!["idle".to_string()]);
        assert_eq!(plan.bytes_after, 1100);
    }

    #[test]
    fn old_images_go_whatever_the_size_and_shared_layers_free_nothing() {
        let records = vec![
            image("stale", 1, &[(1, 1000), (9, 10)], 100),
            image("fresh", 2, &[(1, 1000)], 900),
        ];
        let policy = GcPolicy {
            max_unused_micros: Some(500),
            ..GcPolicy::default()
        };
        let plan = plan_gc(&records, &policy, 1000);
        assert_eq!(plan.remove, vec!["stale".to_string()]);
        // Layer 1 stays with "fresh": only layer 9 and its blob are freed.
        assert_eq!(plan.bytes_before - plan.bytes_after, 10 + 1);
        assert!(plan_gc(&records, &GcPolicy::default(), 1000)
            .remove
            .is_empty());
    }
}
