//! The GPUs' health as ptraind last told it (`gpu-unhealthy`,
//! `gpu-healthy`: events of the host, for stream channels).
//!
//! The [`crate::gpu::PoolMonitor`] notices a GPU leaving or rejoining the
//! pool at each look at the inventory, but it remembers nothing across a
//! restart: after one, a GPU still out would look newly out, and one that
//! came back while ptraind was down would never be told. So what was told
//! is kept in `STATE/gpu-health.json`, one entry per GPU ever seen (by
//! UUID), each with the intents of its last change: the file is their
//! outbox record, written (and synced) before they are handed to the
//! sender, as a job's record is for its events. A change is an event when
//! the health differs from the entry's, so every change is told once,
//! under one key, however often ptraind restarts.
//!
//! The ledger is pure ([`Ledger::observe`]); [`Ledger::load`] and
//! [`Ledger::save`] are its file.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::gpu::GpuInfo;
use crate::notifications::{Intent, NoticeGpu};

/// What ptraind last told of one GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Told {
    pub index: u32,
    /// Why it is out of the pool; `None` while healthy.
    pub unhealthy: Option<String>,
    /// When this health was first seen (µs since the epoch).
    pub since: u64,
    /// The intents of the change to this health (none for a GPU first
    /// seen healthy: that is no change).
    #[serde(default)]
    pub notifications: Vec<Intent>,
}

/// A change to tell: the GPU, and why it is out (`None`: back).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub gpu: NoticeGpu,
    pub unhealthy: Option<String>,
}

#[derive(Debug, Default)]
pub struct Ledger {
    told: BTreeMap<String, Told>,
    path: Option<PathBuf>,
}

/// What a GPU ptraind knew and the inventory no longer lists is marked
/// with.
pub const NOT_LISTED: &str = crate::gpu::VANISHED;

impl Ledger {
    /// The ledger in `STATE/gpu-health.json`; empty when there is none
    /// yet. A file that does not parse (it cannot, short of disk damage:
    /// writes are atomic) is set aside with a warning, and the GPUs are
    /// told afresh.
    pub fn load(state_dir: &Path) -> io::Result<Ledger> {
        let path = state_dir.join("gpu-health.json");
        let told = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(told) => told,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "unreadable GPU health ledger; GPUs are told afresh");
                    BTreeMap::new()
                }
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e),
        };
        Ok(Ledger {
            told,
            path: Some(path),
        })
    }

    /// Writes the ledger, synced: the intents it holds are then durable.
    pub fn save(&self) -> io::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let bytes = serde_json::to_vec_pretty(&self.told).expect("the ledger always serialises");
        let dir = path.parent().expect("the ledger is in the state directory");
        let name = path.file_name().expect("the ledger has a name");
        crate::fsutil::write_atomic(dir, &name.to_string_lossy(), &bytes)
    }

    /// Every intent on record, for the sender again after a restart (it
    /// skips those delivered or dead).
    pub fn intents(&self) -> impl Iterator<Item = &Intent> {
        self.told.values().flat_map(|t| t.notifications.iter())
    }

    /// Compares a look at the inventory with what was told. Returns the
    /// changes to tell, and whether the ledger changed at all (a GPU first
    /// seen healthy is recorded without an event). A GPU on record that
    /// the look does not list has left the pool. Pure.
    pub fn observe(&mut self, snapshot: &[GpuInfo], now: u64) -> (Vec<Change>, bool) {
        let mut changes = Vec::new();
        let mut changed = false;
        for g in snapshot {
            let gpu = NoticeGpu {
                index: g.index,
                uuid: g.uuid.clone(),
            };
            match self.told.get_mut(&g.uuid) {
                None => {
                    changed = true;
                    self.told.insert(
                        g.uuid.clone(),
                        Told {
                            index: g.index,
                            unhealthy: g.unhealthy.clone(),
                            since: now,
                            notifications: Vec::new(),
                        },
                    );
                    if g.unhealthy.is_some() {
                        changes.push(Change {
                            gpu,
                            unhealthy: g.unhealthy.clone(),
                        });
                    }
                }
                Some(told) if told.unhealthy.is_some() != g.unhealthy.is_some() => {
                    changed = true;
                    *told = Told {
                        index: g.index,
                        unhealthy: g.unhealthy.clone(),
                        since: now,
                        notifications: Vec::new(),
                    };
                    changes.push(Change {
                        gpu,
                        unhealthy: g.unhealthy.clone(),
                    });
                }
                Some(_) => {}
            }
        }
        for (uuid, told) in &mut self.told {
            if told.unhealthy.is_some() || snapshot.iter().any(|g| &g.uuid == uuid) {
                continue;
            }
            changed = true;
            *told = Told {
                index: told.index,
                unhealthy: Some(NOT_LISTED.to_owned()),
                since: now,
                notifications: Vec::new(),
            };
            changes.push(Change {
                gpu: NoticeGpu {
                    index: told.index,
                    uuid: uuid.clone(),
                },
                unhealthy: told.unhealthy.clone(),
            });
        }
        (changes, changed)
    }

    /// When the change to `uuid`'s present health was seen.
    pub fn since(&self, uuid: &str) -> Option<u64> {
        self.told.get(uuid).map(|t| t.since)
    }

    /// Records the intents of `uuid`'s last change, replacing those of
    /// the one before. Returns the replaced intents' keys (for the outbox
    /// to forget once they are final).
    pub fn record_intents(&mut self, uuid: &str, intents: Vec<Intent>) -> Vec<String> {
        match self.told.get_mut(uuid) {
            Some(told) => std::mem::replace(&mut told.notifications, intents)
                .into_iter()
                .map(|i| i.key)
                .collect(),
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, uuid: &str, unhealthy: Option<&str>) -> GpuInfo {
        GpuInfo {
            index,
            uuid: uuid.into(),
            name: "H200".into(),
            pci_bus_id: None,
            memory_total_mib: 1,
            memory_used_mib: None,
            utilization_pct: None,
            temperature_c: None,
            device: "/dev/nvidia0".into(),
            processes: Vec::new(),
            numa_node: None,
            topology_group: None,
            unhealthy: unhealthy.map(str::to_owned),
        }
    }

    #[test]
    fn each_change_is_told_once_and_first_sight_of_a_healthy_gpu_is_none() {
        let mut ledger = Ledger::default();
        let (changes, changed) = ledger.observe(&[gpu(0, "A", None), gpu(1, "B", None)], 1);
        assert!(changes.is_empty() && changed);
        let (changes, changed) = ledger.observe(&[gpu(0, "A", None), gpu(1, "B", None)], 2);
        assert!(changes.is_empty() && !changed);
        let out = [gpu(0, "A", None), gpu(1, "B", Some("ECC"))];
        let (changes, _) = ledger.observe(&out, 3);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].gpu.uuid, "B");
        assert_eq!(changes[0].unhealthy.as_deref(), Some("ECC"));
        assert_eq!(ledger.since("B"), Some(3));
        // Out for another reason now: still out, nothing new to tell.
        let (changes, changed) = ledger.observe(&[gpu(0, "A", None), gpu(1, "B", Some("lost"))], 4);
        assert!(changes.is_empty() && !changed);
        let (changes, _) = ledger.observe(&[gpu(0, "A", None), gpu(1, "B", None)], 5);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].unhealthy, None);
    }

    #[test]
    fn a_gpu_no_longer_listed_is_out_and_one_first_seen_out_is_told() {
        let mut ledger = Ledger::default();
        ledger.observe(&[gpu(0, "A", None), gpu(1, "B", None)], 1);
        // Gone while ptraind was down: the look after the restart lacks it.
        let (changes, _) = ledger.observe(&[gpu(0, "A", None)], 2);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].gpu.index, 1);
        assert_eq!(changes[0].unhealthy.as_deref(), Some(NOT_LISTED));
        let (changes, _) = ledger.observe(&[gpu(0, "A", None)], 3);
        assert!(changes.is_empty());
        let mut fresh = Ledger::default();
        let (changes, _) = fresh.observe(&[gpu(0, "C", Some("lost"))], 1);
        assert_eq!(changes.len(), 1);
    }

    #[test]
    fn the_ledger_survives_a_restart_with_its_intents() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::load(dir.path()).unwrap();
        ledger.observe(&[gpu(0, "A", Some("ECC"))], 7);
        let intent = crate::notifications::sender::tests::intent(
            "x",
            crate::notifications::NotifyEvent::GpuUnhealthy,
            "bus",
        );
        assert!(ledger.record_intents("A", vec![intent.clone()]).is_empty());
        ledger.save().unwrap();
        let mut again = Ledger::load(dir.path()).unwrap();
        assert_eq!(again.intents().cloned().collect::<Vec<_>>(), vec![intent]);
        let (changes, changed) = again.observe(&[gpu(0, "A", Some("ECC"))], 8);
        assert!(changes.is_empty() && !changed, "still out: nothing new");
    }
}
