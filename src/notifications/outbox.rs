//! Delivery status, one small root-only file per key under `STATE/outbox/`,
//! each replaced atomically: pending, retrying, delivered or dead, with the
//! attempts and the last error. The intent itself lives in the job's record
//! (written with the state change); a copy here lets `ptrain notifications
//! retry` re-send a dead letter without the job.

use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{Intent, NotifyEvent};
use crate::fsutil::{ensure_dir, SpareDir};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeliveryState {
    /// Not tried yet.
    Pending,
    /// Tried and failed; another attempt is scheduled.
    Retrying,
    Delivered,
    /// Refused for good, or still failing when its lifetime ran out.
    Dead,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Retrying => "retrying",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Dead => "dead",
        }
    }

    /// Delivered and dead letters are not sent again unless root asks.
    pub fn is_final(self) -> bool {
        matches!(self, DeliveryState::Delivered | DeliveryState::Dead)
    }
}

/// The status of one key, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub state: DeliveryState,
    /// Attempts since the intent was recorded or last re-sent by root.
    pub attempts: u32,
    /// Start of the retry lifetime: the intent's creation, or root's retry.
    pub lifetime_from: u64,
    #[serde(default)]
    pub last_attempt_at: Option<u64>,
    #[serde(default)]
    pub next_attempt_at: Option<u64>,
    #[serde(default)]
    pub delivered_at: Option<u64>,
    /// Why the last attempt failed; secrets are redacted before it is kept.
    #[serde(default)]
    pub last_error: Option<String>,
    /// What it was kept for is gone (a quarantine entry past
    /// `[retention]`, a GPU's change told again since): the file goes as
    /// soon as it is delivered or dead, not before, so the event is
    /// still sent and no status is left behind for nobody.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forget_once_final: bool,
    pub intent: Intent,
}

impl Delivery {
    pub fn new(intent: Intent) -> Delivery {
        Delivery {
            state: DeliveryState::Pending,
            attempts: 0,
            lifetime_from: intent.created_at,
            last_attempt_at: None,
            next_attempt_at: None,
            delivered_at: None,
            last_error: None,
            forget_once_final: false,
            intent,
        }
    }
}

/// One delivery as `ptrain notifications --json` shows it. Fields are only
/// ever added.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryView {
    pub key: String,
    pub job_id: String,
    pub event: NotifyEvent,
    pub channel: String,
    pub state: DeliveryState,
    pub attempts: u32,
    pub created_at: u64,
    pub last_attempt_at: Option<u64>,
    pub next_attempt_at: Option<u64>,
    pub delivered_at: Option<u64>,
    pub last_error: Option<String>,
}

impl DeliveryView {
    pub fn of(d: &Delivery) -> DeliveryView {
        DeliveryView {
            key: d.intent.key.clone(),
            job_id: d.intent.notice.job_id.clone(),
            event: d.intent.notice.event,
            channel: d.intent.channel.clone(),
            state: d.state,
            attempts: d.attempts,
            created_at: d.intent.created_at,
            last_attempt_at: d.last_attempt_at,
            next_attempt_at: d.next_attempt_at,
            delivered_at: d.delivered_at,
            last_error: d.last_error.clone(),
        }
    }
}

/// One channel's backlog, as `ptrain notifications` heads its list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Backlog {
    pub channel: String,
    /// Not yet delivered: pending or retrying.
    pub waiting: usize,
    pub retrying: usize,
    pub dead: usize,
    pub delivered: usize,
    /// When the oldest waiting one was recorded.
    pub oldest_waiting: Option<u64>,
}

impl Backlog {
    /// Per channel, in name order. Pure.
    pub fn of(list: &[DeliveryView]) -> Vec<Backlog> {
        let mut by_channel: std::collections::BTreeMap<&str, Backlog> = Default::default();
        for d in list {
            let b = by_channel
                .entry(d.channel.as_str())
                .or_insert_with(|| Backlog {
                    channel: d.channel.clone(),
                    ..Backlog::default()
                });
            match d.state {
                DeliveryState::Pending | DeliveryState::Retrying => {
                    b.waiting += 1;
                    if d.state == DeliveryState::Retrying {
                        b.retrying += 1;
                    }
                    b.oldest_waiting = Some(
                        b.oldest_waiting
                            .map_or(d.created_at, |t| t.min(d.created_at)),
                    );
                }
                DeliveryState::Dead => b.dead += 1,
                DeliveryState::Delivered => b.delivered += 1,
            }
        }
        by_channel.into_values().collect()
    }
}

pub struct Outbox {
    files: SpareDir,
}

impl Outbox {
    pub fn open(state_dir: &Path) -> io::Result<Outbox> {
        let dir = state_dir.join("outbox");
        ensure_dir(&dir, 0o700)?;
        let files = SpareDir::open(&dir)?;
        forget_own_spares(&dir);
        Ok(Outbox { files })
    }

    pub fn dir(&self) -> &Path {
        self.files.path()
    }

    /// A key is `JOB.EVENT.CHANNEL` of validated parts: one safe file name
    /// that never starts with a dot.
    fn file_name(key: &str) -> String {
        format!("{key}.json")
    }

    /// The stored status of `key`, if any. A corrupt file (it cannot be,
    /// short of disk damage: writes are atomic) reads as absent, so the
    /// notification is sent again rather than lost.
    pub fn load(&self, key: &str) -> io::Result<Option<Delivery>> {
        match std::fs::read(self.dir().join(Self::file_name(key))) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(d) => Ok(Some(d)),
                Err(e) => {
                    tracing::warn!(key, error = %e, "unreadable outbox entry; treating it as not yet sent");
                    Ok(None)
                }
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn save(&self, d: &Delivery) -> io::Result<()> {
        let bytes = serde_json::to_vec_pretty(d).expect("deliveries always serialise");
        // Rewritten as the delivery goes on: by exchange with the
        // directory's spare, no inode made or freed per update. Not
        // synced: the intent is durable in its job's record, and a status
        // a power cut takes back only sends the message again under the
        // same key (a kill -9 loses nothing: the page cache keeps it).
        // Four disk flushes per event were most of what a stream cost.
        self.files
            .replace_cached(&Self::file_name(&d.intent.key), &bytes)
    }

    /// Whether `key` is done with: delivered or dead. A key with no status
    /// yet has not been tried.
    pub fn is_final(&self, key: &str) -> io::Result<bool> {
        Ok(self.load(key)?.is_some_and(|d| d.state.is_final()))
    }

    /// Forgets `key` (its job is being compacted away).
    pub fn remove(&self, key: &str) -> io::Result<()> {
        self.files.remove(&Self::file_name(key))
    }

    /// Every stored delivery, oldest first.
    pub fn list(&self) -> io::Result<Vec<Delivery>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(self.dir())? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            if let Ok(bytes) = std::fs::read(entry.path()) {
                if let Ok(d) = serde_json::from_slice::<Delivery>(&bytes) {
                    out.push(d);
                }
            }
        }
        out.sort_by(|a, b| {
            (a.intent.created_at, &a.intent.key).cmp(&(b.intent.created_at, &b.intent.key))
        });
        Ok(out)
    }
}

/// An older ptraind kept a spare beside each entry (`.KEY.json.spare`);
/// the directory's one spare replaces them.
fn forget_own_spares(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') && name.ends_with(".json.spare") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_backlog_counts_each_channels_waiting_and_its_oldest() {
        let view = |channel: &str, state: DeliveryState, created_at: u64| DeliveryView {
            key: format!("j{created_at}.started.{channel}"),
            job_id: format!("j{created_at}"),
            event: NotifyEvent::Started,
            channel: channel.into(),
            state,
            attempts: 0,
            created_at,
            last_attempt_at: None,
            next_attempt_at: None,
            delivered_at: None,
            last_error: None,
        };
        let list = [
            view("bus", DeliveryState::Retrying, 30),
            view("bus", DeliveryState::Pending, 20),
            view("bus", DeliveryState::Delivered, 10),
            view("hook", DeliveryState::Dead, 5),
        ];
        let b = Backlog::of(&list);
        assert_eq!(
            b,
            [
                Backlog {
                    channel: "bus".into(),
                    waiting: 2,
                    retrying: 1,
                    dead: 0,
                    delivered: 1,
                    oldest_waiting: Some(20),
                },
                Backlog {
                    channel: "hook".into(),
                    dead: 1,
                    ..Backlog::default()
                },
            ]
        );
    }

    #[test]
    fn save_load_list_root_only() {
        let dir = tempfile::tempdir().unwrap();
        let outbox = Outbox::open(dir.path()).unwrap();
        let mode = std::fs::metadata(outbox.dir())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        let intent = super::super::sender::tests::intent("j", NotifyEvent::Failed, "hook");
        assert_eq!(outbox.load(&intent.key).unwrap(), None);
        assert!(!outbox.is_final(&intent.key).unwrap());
        let mut d = Delivery::new(intent.clone());
        outbox.save(&d).unwrap();
        assert!(!outbox.is_final(&intent.key).unwrap());
        d.state = DeliveryState::Dead;
        d.last_error = Some("HTTP 400".into());
        outbox.save(&d).unwrap();
        assert_eq!(outbox.load(&intent.key).unwrap(), Some(d.clone()));
        let file = outbox.dir().join("j.failed.hook.json");
        let mode = std::fs::metadata(file).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0);
        let listed = outbox.list().unwrap();
        assert_eq!(listed, vec![d.clone()]);
        let view = DeliveryView::of(&d);
        assert_eq!(
            (view.state, view.channel.as_str()),
            (DeliveryState::Dead, "hook")
        );
        assert!(outbox.is_final(&intent.key).unwrap());
        outbox.remove(&intent.key).unwrap();
        outbox.remove(&intent.key).unwrap();
        assert!(outbox.list().unwrap().is_empty());
    }
}
