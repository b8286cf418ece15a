//! The sender task: owns every undelivered notification, its timers and
//! its status file. The state task hands intents over through a
//! [`Notifier`] and never waits for the network; the sender never blocks
//! on an attempt either, it runs each one as its own task (one at a time
//! per channel, so a robot is paced and an endpoint is not flooded) and
//! sleeps until the next one is due.

use std::collections::{BTreeSet, HashMap};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::outbox::{Delivery, DeliveryState, DeliveryView, Outbox};
use super::pacing::{self, Pacer};
use super::retry::{jitter, RetryPolicy, Verdict};
use super::tail::{self, TailReader};
use super::transport::{self, Transport};
use super::{Intent, Notice, NotificationsConfig, NotifyEvent};
use crate::now_micros;

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("cannot open the notification outbox {path}: {source}; check that the state directory is writable")]
    Outbox {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Why root's `ptrain notifications` (list or retry) could not be
/// answered; the D-Bus face turns it into an error for the CLI.
#[derive(Debug, thiserror::Error)]
pub enum DeliveriesError {
    #[error("the notification sender has stopped; restart ptraind")]
    Stopped,
    /// Not a key's shape (`ID.EVENT.CHANNEL`): said as of an unknown job,
    /// as the key's first part names one.
    #[error("no job {0:?}; `ptrain list` shows the jobs ptraind knows")]
    NotAKey(String),
    #[error("no notification {0:?}; `ptrain notifications` lists the keys")]
    NoSuchKey(String),
    #[error("{0} was already delivered; it is not sent twice")]
    AlreadyDelivered(String),
    #[error("cannot read {key}: {source}")]
    ReadDelivery { key: String, source: std::io::Error },
    #[error("cannot read the outbox {}: {source}", dir.display())]
    ListOutbox {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read the outbox: {0}")]
    ReadOutbox(std::io::Error),
}

/// What `ptrain notifications retry` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RetryTarget {
    Key(String),
    AllDead,
}

enum Command {
    Deliver(Vec<Intent>),
    List(oneshot::Sender<Result<Vec<DeliveryView>, DeliveriesError>>),
    Retry(
        RetryTarget,
        oneshot::Sender<Result<String, DeliveriesError>>,
    ),
    /// Their owners are gone: forget each key's status once it is final.
    Forget(Vec<String>),
    /// Dropped by a bound: forget each key now, sent or not.
    Discard(Vec<String>),
    /// ptraind is stopping: finish the attempts under way and send what is
    /// due now, then answer with how many stay pending and end.
    Drain(oneshot::Sender<Drained>),
}

/// What a drain left: deliveries still pending (a retry not yet due, or
/// paced), resumed from the outbox at the next start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    pub pending: usize,
}

/// The handle the daemon holds. Cheap to clone; the sender task ends when
/// the last handle is dropped (undelivered intents stay pending on disk and
/// are resumed at the next start).
#[derive(Clone)]
pub struct Notifier {
    tx: mpsc::UnboundedSender<Command>,
}

impl Notifier {
    /// Sets up every channel (reading its secrets) and starts the sender.
    /// Must be called inside a tokio runtime.
    pub fn start(config: &NotificationsConfig, state_dir: &Path) -> Result<Notifier, NotifyError> {
        let outbox = Outbox::open(state_dir).map_err(|source| NotifyError::Outbox {
            path: state_dir.join("outbox"),
            source,
        })?;
        Ok(Notifier::with_transports(
            config,
            outbox,
            transport::build_all(config),
            tail::journal_reader(),
        ))
    }

    /// Starts the sender with given transports and output reader (tests
    /// use fakes).
    pub fn with_transports(
        config: &NotificationsConfig,
        outbox: Outbox,
        transports: HashMap<String, Arc<dyn Transport>>,
        tails: TailReader,
    ) -> Notifier {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut channels = HashMap::new();
        for (name, t) in &transports {
            channels.insert(
                name.clone(),
                ChannelQueue {
                    due: BTreeSet::new(),
                    busy: false,
                    pacer: t.per_minute().map(Pacer::per_minute),
                    max_batch: t.max_batch().max(1),
                    ordered: config.channels.get(name).is_some_and(|c| c.ordered()),
                    held_until: None,
                    spilled: false,
                    reading: BTreeSet::new(),
                    backlog: 0,
                },
            );
        }
        let sender = Sender {
            policy: config.retry,
            origin: Instant::now(),
            next_seq: 0,
            max_backlog: config.max_backlog,
            attempt_timeout: config.attempt_timeout,
            outbox,
            transports,
            channels,
            entries: HashMap::new(),
            attempts: JoinSet::new(),
            tails,
            unread: Vec::new(),
            reads: JoinSet::new(),
            reading_keys: HashMap::new(),
            draining: None,
        };
        tokio::spawn(sender.run(rx));
        Notifier { tx }
    }

    /// Hands over intents that are now durable in their job's record: new
    /// ones, or all of them again after a restart (delivered and dead ones
    /// are skipped by their status file).
    pub fn deliver(&self, intents: Vec<Intent>) {
        if !intents.is_empty() {
            let _ = self.tx.send(Command::Deliver(intents));
        }
    }

    /// Forgets the status of `keys` once each is delivered or dead (at
    /// once for those that are): what they were kept for is gone. Sent
    /// after the [`Notifier::deliver`] of the same keys, if any.
    pub fn forget(&self, keys: Vec<String>) {
        if !keys.is_empty() {
            let _ = self.tx.send(Command::Forget(keys));
        }
    }

    /// Drops `keys` now, whether or not they were sent: their owners went
    /// past a bound (a user's quarantine is full), and what a bound drops
    /// must not stay on disk either. An attempt under way may still
    /// deliver one; nothing is recorded of it.
    pub fn discard(&self, keys: Vec<String>) {
        if !keys.is_empty() {
            let _ = self.tx.send(Command::Discard(keys));
        }
    }

    /// Every delivery on record; answered on `reply` without waiting for
    /// any attempt.
    pub fn list(&self, reply: oneshot::Sender<Result<Vec<DeliveryView>, DeliveriesError>>) {
        if let Err(mpsc::error::SendError(Command::List(reply))) =
            self.tx.send(Command::List(reply))
        {
            let _ = reply.send(Err(stopped()));
        }
    }

    /// Re-sends a dead letter (or hurries a retrying one), or all dead ones.
    pub fn retry(
        &self,
        target: RetryTarget,
        reply: oneshot::Sender<Result<String, DeliveriesError>>,
    ) {
        if let Err(mpsc::error::SendError(Command::Retry(_, reply))) =
            self.tx.send(Command::Retry(target, reply))
        {
            let _ = reply.send(Err(stopped()));
        }
    }

    /// At stop: waits until the attempts under way are over and what was
    /// due is sent (the unit's `TimeoutStopSec` bounds the wait; the
    /// caller sets a deadline under it). None when the sender is gone.
    pub async fn drain(&self) -> Option<Drained> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Command::Drain(tx)).ok()?;
        rx.await.ok()
    }

    pub async fn deliveries(&self) -> Result<Vec<DeliveryView>, DeliveriesError> {
        let (tx, rx) = oneshot::channel();
        self.list(tx);
        rx.await.unwrap_or_else(|_| Err(stopped()))
    }

    pub async fn retry_now(&self, target: RetryTarget) -> Result<String, DeliveriesError> {
        let (tx, rx) = oneshot::channel();
        self.retry(target, tx);
        rx.await.unwrap_or_else(|_| Err(stopped()))
    }
}

fn stopped() -> DeliveriesError {
    DeliveriesError::Stopped
}

struct ChannelQueue {
    /// (when due, admission order, key) of entries waiting for this
    /// channel. On an ordered channel every entry is due at the sender's
    /// start, so they go strictly in admission order.
    due: BTreeSet<(Instant, u64, String)>,
    /// An attempt is in flight: one at a time per channel.
    busy: bool,
    pacer: Option<Pacer>,
    max_batch: usize,
    /// One job's events go in the order they happened: a retry holds back
    /// the whole channel ([`ChannelQueue::held_until`]) instead of only
    /// the event that failed.
    ordered: bool,
    held_until: Option<Instant>,
    /// Some undelivered notifications wait on disk only, beyond
    /// `max_backlog`: taken back as the channel drains.
    spilled: bool,
    /// The places (`Entry::seq`) of entries whose output lines are being
    /// read: on an ordered channel nothing placed after them goes first.
    reading: BTreeSet<(u64, String)>,
    /// Undelivered notifications on this channel, in memory (waiting,
    /// reading their output, or in flight); bounded by `max_backlog`.
    backlog: usize,
}

impl ChannelQueue {
    /// Whether the entry placed at `seq` may be sent now: on an ordered
    /// channel, not before one placed earlier whose lines are still being
    /// read.
    fn may_go(&self, seq: u64) -> bool {
        !self.ordered || self.reading.first().is_none_or(|(first, _)| seq < *first)
    }

    /// When this channel can next start an attempt, if it has anything due.
    fn next_start(&self) -> Option<Instant> {
        let (at, seq, _) = self.due.first()?;
        if !self.may_go(*seq) {
            return None; // woken when the read it waits for is in
        }
        let mut at = *at;
        if let Some(held) = self.held_until {
            at = at.max(held);
        }
        Some(match &self.pacer {
            Some(p) => p.next_slot(at).max(at),
            None => at,
        })
    }
}

struct Entry {
    delivery: Delivery,
    deadline: Instant,
    /// Its place in its channel's queue: admission order (ties on the due
    /// time go first come, first served), or on an ordered channel when
    /// its event happened ([`order_of`]).
    seq: u64,
}

struct Attempt {
    channel: String,
    keys: Vec<String>,
    /// One per key, in order.
    verdicts: Vec<Verdict>,
}

struct Sender {
    policy: RetryPolicy,
    /// When the sender started: the due time of every entry on an ordered
    /// channel.
    origin: Instant,
    next_seq: u64,
    max_backlog: usize,
    attempt_timeout: Duration,
    outbox: Outbox,
    transports: HashMap<String, Arc<dyn Transport>>,
    channels: HashMap<String, ChannelQueue>,
    /// Every notification not yet delivered or dead, by key.
    entries: HashMap<String, Entry>,
    attempts: JoinSet<Attempt>,
    tails: TailReader,
    /// Deliveries admitted since the loop last looked that need their
    /// output lines; read as one group, so a burst stays one burst.
    unread: Vec<(String, Notice)>,
    /// Output reads in flight, each giving (key, lines) for its group.
    /// Their entries wait, off the channel queues, until the lines are in
    /// the outbox copy.
    reads: JoinSet<Vec<(String, Vec<String>)>>,
    /// The keys each read in flight is for, should it fail to answer.
    reading_keys: HashMap<tokio::task::Id, Vec<String>>,
    /// Set at stop ([`Notifier::drain`]): answered, and the task ends,
    /// once nothing is under way or due.
    draining: Option<oneshot::Sender<Drained>>,
}

/// Where a delivery goes on an ordered channel: by when its event was
/// recorded, and at the same instant by where it falls in an attempt's
/// life (a start ptraind learns of with its end). Events a restart, a
/// spill to disk or root's re-send bring back keep their place.
fn order_of(d: &Delivery) -> u64 {
    d.intent
        .created_at
        .saturating_mul(4)
        .saturating_add(u64::from(d.intent.notice.event.lifecycle_rank().min(3)))
}

/// The order deliveries are read back from the outbox in.
fn by_time(a: &Delivery, b: &Delivery) -> std::cmp::Ordering {
    (order_of(a), &a.intent.key).cmp(&(order_of(b), &b.intent.key))
}

/// Output reads of one group run at the same time.
const PARALLEL_READS: usize = 4;

/// Whether `d` still needs its output lines: an end that was never tried
/// (a dead letter re-sent by root after an attempt keeps what it had, so
/// the receiver sees the same bytes).
fn needs_tail(d: &Delivery) -> bool {
    d.intent.notice.output_tail.is_none()
        && d.state == DeliveryState::Pending
        && d.attempts == 0
        && d.last_attempt_at.is_none()
        && tail::wanted(&d.intent.notice)
}

/// The tokio instant of a wall-clock time in microseconds.
fn instant_of(wall: u64, now: Instant, now_wall: u64) -> Instant {
    if wall >= now_wall {
        now + Duration::from_micros(wall - now_wall)
    } else {
        now.checked_sub(Duration::from_micros(now_wall - wall))
            .unwrap_or(now)
    }
}

/// A key as the CLI may pass it: one safe file name.
fn is_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 256
        && !key.starts_with('.')
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}

impl Sender {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        self.resume_outbox();
        loop {
            self.start_reads();
            let now = Instant::now();
            self.dispatch(now);
            let wake = self.next_wake();
            if self.draining.is_some()
                && self.attempts.is_empty()
                && self.reads.is_empty()
                && self.unread.is_empty()
                && wake.is_none_or(|at| at > now)
            {
                let pending = self.entries.len();
                if let Some(reply) = self.draining.take() {
                    let _ = reply.send(Drained { pending });
                }
                return;
            }
            tokio::select! {
                command = rx.recv() => {
                    let Some(command) = command else { break };
                    self.command(command);
                    // Take in everything already sent, so a burst is
                    // planned (and merged) as one.
                    while let Ok(command) = rx.try_recv() {
                        self.command(command);
                    }
                }
                Some(done) = self.attempts.join_next(), if !self.attempts.is_empty() => {
                    if let Ok(attempt) = done {
                        self.finished(attempt, Instant::now());
                    }
                }
                Some(done) = self.reads.join_next_with_id(), if !self.reads.is_empty() => {
                    let read = match done {
                        Ok((id, read)) => {
                            self.reading_keys.remove(&id);
                            read
                        }
                        // Sent without lines rather than held for good.
                        Err(e) => self
                            .reading_keys
                            .remove(&e.id())
                            .unwrap_or_default()
                            .into_iter()
                            .map(|key| (key, Vec::new()))
                            .collect(),
                    };
                    self.tails_read(read);
                }
                _ = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {}
            }
        }
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Deliver(intents) => {
                for intent in intents {
                    self.admit_intent(intent);
                }
            }
            Command::List(reply) => {
                let list = self
                    .outbox
                    .list()
                    .map(|all| all.iter().map(DeliveryView::of).collect())
                    .map_err(|source| DeliveriesError::ListOutbox {
                        dir: self.outbox.dir().to_path_buf(),
                        source,
                    });
                let _ = reply.send(list);
            }
            Command::Retry(target, reply) => {
                let _ = reply.send(self.retry(target));
            }
            Command::Forget(keys) => {
                for key in keys {
                    self.forget(&key);
                }
            }
            Command::Discard(keys) => {
                for key in keys {
                    self.discard(&key);
                }
            }
            Command::Drain(reply) => self.draining = Some(reply),
        }
    }

    /// Marks `key` to be forgotten once final, or forgets it now if it is.
    /// Marked on disk too, so a restart before it is done still forgets it.
    fn forget(&mut self, key: &str) {
        if let Some(entry) = self.entries.get_mut(key) {
            entry.delivery.forget_once_final = true;
            let d = entry.delivery.clone();
            self.persist(&d);
            return;
        }
        match self.outbox.load(key) {
            Ok(Some(d)) if d.state.is_final() => self.remove(key),
            Ok(Some(mut d)) => {
                // Waiting on disk beyond max_backlog.
                d.forget_once_final = true;
                self.persist(&d);
            }
            Ok(None) => {}
            Err(e) => {
                error!(key, error = %e, "cannot read a notification's status to forget it; it stays in the outbox");
            }
        }
    }

    fn discard(&mut self, key: &str) {
        if let Some(entry) = self.entries.remove(key) {
            let channel = &entry.delivery.intent.channel;
            if let Some(queue) = self.channels.get_mut(channel) {
                queue.backlog = queue.backlog.saturating_sub(1);
                queue.reading.remove(&(entry.seq, key.to_owned()));
                // Left in `due`, it is skipped when reached (no entry).
            }
            warn!(key, PTRAIN_JOB = %entry.delivery.intent.notice.job_id, channel = %channel, "notification dropped before it was delivered: its record went past a bound of [retention]");
        }
        self.remove(key);
    }

    fn remove(&self, key: &str) {
        if let Err(e) = self.outbox.remove(key) {
            warn!(key, error = %e, "cannot remove a forgotten notification's status");
        }
    }

    /// Records a delivered or dead status, or forgets it if it was to be.
    fn persist_final(&self, d: &Delivery) {
        if d.forget_once_final {
            self.remove(&d.intent.key);
        } else {
            self.persist(d);
        }
    }

    /// Picks up every delivery a previous run left unfinished. The job
    /// records hand their intents over too (covering a crash before the
    /// first status file was written); this also covers jobs whose records
    /// were compacted into the history since.
    fn resume_outbox(&mut self) {
        match self.outbox.list() {
            Ok(all) => {
                let mut unfinished: Vec<Delivery> =
                    all.into_iter().filter(|d| !d.state.is_final()).collect();
                // In the order they happened, so an ordered channel sends
                // one job's events as before the restart.
                unfinished.sort_by(by_time);
                for d in unfinished {
                    self.admit(d);
                }
            }
            Err(e) => error!(
                outbox = %self.outbox.dir().display(),
                error = %e,
                "cannot read the outbox; unfinished notifications resume from the job records only"
            ),
        }
    }

    /// Takes back, in the order they happened, what a channel over its
    /// backlog left on disk, up to the bound again.
    fn refill(&mut self, channel: &str) {
        let all = match self.outbox.list() {
            Ok(all) => all,
            Err(e) => {
                error!(channel, outbox = %self.outbox.dir().display(), error = %e, "cannot read the outbox to take back the notifications waiting there; trying again as the channel drains");
                return;
            }
        };
        let mut waiting: Vec<Delivery> = all
            .into_iter()
            .filter(|d| {
                d.intent.channel == channel
                    && !d.state.is_final()
                    && !self.entries.contains_key(&d.intent.key)
            })
            .collect();
        waiting.sort_by(by_time);
        let Some(queue) = self.channels.get_mut(channel) else {
            return;
        };
        queue.spilled = false;
        let total = waiting.len();
        for (taken, d) in waiting.into_iter().enumerate() {
            self.admit(d);
            if self.channels[channel].spilled {
                info!(
                    channel,
                    taken,
                    left = total - taken,
                    "took back notifications that waited on disk"
                );
                return;
            }
        }
        info!(
            channel,
            taken = total,
            "took back every notification that waited on disk"
        );
    }

    fn persist(&self, d: &Delivery) {
        if let Err(e) = self.outbox.save(d) {
            // Delivery goes on; at worst it is sent again after a restart.
            error!(key = %d.intent.key, error = %e, "cannot record a notification's status; it may be sent again after a restart");
        }
    }

    fn admit_intent(&mut self, intent: Intent) {
        if self.entries.contains_key(&intent.key) {
            return;
        }
        let delivery = match self.outbox.load(&intent.key) {
            Ok(Some(d)) if d.state.is_final() => return,
            // Known from before a restart: the same key, its attempts kept.
            Ok(Some(d)) => d,
            Ok(None) => {
                // On disk at once, even one whose output lines are read
                // first (recorded again with them, tails_read): after a
                // restart the outbox alone gives every event its place, and
                // a channel over its backlog takes it back from there.
                let d = Delivery::new(intent);
                self.persist(&d);
                d
            }
            Err(e) => {
                error!(key = %intent.key, error = %e, "cannot read a notification's status; sending it");
                Delivery::new(intent)
            }
        };
        self.admit(delivery);
    }

    /// Queues a pending or retrying delivery on its channel.
    fn admit(&mut self, delivery: Delivery) {
        let now = Instant::now();
        let now_wall = now_micros();
        let key = delivery.intent.key.clone();
        let channel = delivery.intent.channel.clone();
        let Some(queue) = self.channels.get_mut(&channel) else {
            let why = format!(
                "channel {channel} is not configured; add [channels.{channel}] back, restart ptraind and `ptrain notifications retry {key}`"
            );
            self.bury(delivery, why);
            return;
        };
        if queue.backlog >= self.max_backlog || queue.spilled {
            // The bound on memory while a receiver is down: the rest wait
            // on disk (pending, as persisted) and are taken back in the
            // order they happened as the channel drains (refill). Once
            // one waits there, later ones do too, so none overtakes it.
            if !queue.spilled {
                warn!(
                    channel = %channel,
                    "channel {channel} holds {} undelivered notifications (notify.max_backlog); newer ones wait on disk and are taken back in order as it drains",
                    queue.backlog
                );
                queue.spilled = true;
            }
            return;
        }
        queue.backlog += 1;
        let seq = if queue.ordered {
            order_of(&delivery)
        } else {
            self.next_seq += 1;
            self.next_seq
        };
        let lifetime_end = delivery
            .lifetime_from
            .saturating_add(self.policy.lifetime.as_micros() as u64);
        let deadline = instant_of(lifetime_end, now, now_wall);
        let due = match (delivery.state, delivery.next_attempt_at) {
            (_, _) if queue.ordered => {
                if let (DeliveryState::Retrying, Some(at)) =
                    (delivery.state, delivery.next_attempt_at)
                {
                    let at = instant_of(at, now, now_wall);
                    queue.held_until = Some(queue.held_until.map_or(at, |h| h.max(at)));
                }
                self.origin
            }
            (DeliveryState::Retrying, Some(at)) => instant_of(at, now, now_wall).max(now),
            _ => now,
        };
        if needs_tail(&delivery) {
            // Read by the sender, not the state task, and only once: the
            // lines become part of the message before its first attempt.
            self.unread
                .push((key.clone(), delivery.intent.notice.clone()));
            queue.reading.insert((seq, key.clone()));
        } else {
            queue.due.insert((due, seq, key.clone()));
        }
        self.entries.insert(
            key,
            Entry {
                delivery,
                deadline,
                seq,
            },
        );
    }

    /// Reads the output lines of everything admitted since the last look,
    /// once per job and event (several channels share them).
    fn start_reads(&mut self) {
        if self.unread.is_empty() {
            return;
        }
        let unread = std::mem::take(&mut self.unread);
        let keys: Vec<String> = unread.iter().map(|(k, _)| k.clone()).collect();
        let mut runs: Vec<(String, NotifyEvent)> = Vec::new();
        let mut reads = Vec::new();
        for (_, n) in &unread {
            let run = (n.job_id.clone(), n.event);
            if !runs.contains(&run) {
                runs.push(run);
                reads.push(AssertUnwindSafe((self.tails)(n.clone())).catch_unwind());
            }
        }
        let read = self.reads.spawn(async move {
            let lines: Vec<Vec<String>> = futures_util::stream::iter(reads)
                .buffered(PARALLEL_READS)
                .map(|read| read.unwrap_or_default())
                .collect()
                .await;
            unread
                .into_iter()
                .map(|(key, n)| {
                    let at = runs
                        .iter()
                        .position(|r| r.0 == n.job_id && r.1 == n.event)
                        .expect("every notice has its run");
                    (key, lines[at].clone())
                })
                .collect()
        });
        self.reading_keys.insert(read.id(), keys);
    }

    /// Output lines are in: each recorded in its delivery's outbox copy,
    /// then the deliveries are queued for their first attempt, together.
    fn tails_read(&mut self, read: Vec<(String, Vec<String>)>) {
        let now = Instant::now();
        for (key, lines) in read {
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            entry.delivery.intent.notice.output_tail = Some(lines);
            let channel = entry.delivery.intent.channel.clone();
            let seq = entry.seq;
            self.persist(&self.entries[&key].delivery);
            if let Some(queue) = self.channels.get_mut(&channel) {
                queue.reading.remove(&(seq, key.clone()));
                let due = if queue.ordered { self.origin } else { now };
                queue.due.insert((due, seq, key));
            }
        }
    }

    fn bury(&mut self, mut delivery: Delivery, why: String) {
        warn!(
            key = %delivery.intent.key,
            PTRAIN_JOB = %delivery.intent.notice.job_id,
            channel = %delivery.intent.channel,
            attempts = delivery.attempts,
            "notification is a dead letter: {why}"
        );
        delivery.state = DeliveryState::Dead;
        delivery.next_attempt_at = None;
        delivery.last_error = Some(why);
        self.persist_final(&delivery);
    }

    /// Starts an attempt on every idle channel with something due.
    fn dispatch(&mut self, now: Instant) {
        for (name, queue) in self.channels.iter_mut() {
            if queue.busy || queue.next_start().is_none_or(|at| at > now) {
                continue;
            }
            queue.held_until = None;
            let waiting = queue
                .due
                .iter()
                .take_while(|(at, seq, _)| *at <= now && queue.may_go(*seq))
                .count();
            // A robot's digest merges at most a few; others take what
            // their transport can carry in one attempt.
            let take = match queue.pacer {
                Some(_) => pacing::batch_len(waiting),
                None => waiting,
            }
            .min(queue.max_batch);
            let mut keys = Vec::with_capacity(take);
            let mut batch: Vec<Intent> = Vec::with_capacity(take);
            while keys.len() < take {
                let Some((_, _, key)) = queue.due.first() else {
                    break;
                };
                let Some(entry) = self.entries.get(key) else {
                    queue.due.pop_first();
                    continue;
                };
                // One event per job in an ordered attempt: were the first
                // refused and the second taken, the job's order would break.
                let job = &entry.delivery.intent.notice.job_id;
                if queue.ordered && batch.iter().any(|i| &i.notice.job_id == job) {
                    break;
                }
                batch.push(entry.delivery.intent.clone());
                let (_, _, key) = queue.due.pop_first().expect("looked at above");
                keys.push(key);
            }
            queue.busy = true;
            if let Some(pacer) = &mut queue.pacer {
                pacer.record(now);
            }
            let transport = self.transports[name].clone();
            let timeout = self.attempt_timeout;
            let channel = name.clone();
            self.attempts.spawn(async move {
                let n = batch.len();
                let attempt =
                    AssertUnwindSafe(tokio::time::timeout(timeout, transport.send_each(batch)));
                let verdicts = match attempt.catch_unwind().await {
                    Ok(Ok(verdicts)) if verdicts.len() == n => verdicts,
                    Ok(Ok(_)) => vec![
                        Verdict::Retry(
                            "the transport answered for too few or too many (a bug in ptraind)"
                                .into()
                        );
                        n
                    ],
                    Ok(Err(_)) => {
                        vec![
                            Verdict::Retry(format!("no answer within {}", fmt_duration(timeout)));
                            n
                        ]
                    }
                    Err(_) => {
                        vec![Verdict::Retry("the attempt panicked (a bug in ptraind)".into()); n]
                    }
                };
                Attempt {
                    channel,
                    keys,
                    verdicts,
                }
            });
        }
    }

    /// When the sender must look again: the earliest due entry of an idle
    /// channel, or its robot's next slot if later.
    fn next_wake(&self) -> Option<Instant> {
        self.channels
            .values()
            .filter(|q| !q.busy)
            .filter_map(ChannelQueue::next_start)
            .min()
    }

    fn finished(&mut self, attempt: Attempt, now: Instant) {
        let channel = attempt.channel.clone();
        self.settle(attempt, now);
        if let Some(queue) = self.channels.get(&channel) {
            if queue.spilled && queue.backlog * 2 <= self.max_backlog {
                self.refill(&channel);
            }
        }
    }

    fn settle(&mut self, attempt: Attempt, now: Instant) {
        let now_wall = now_micros();
        if let Some(queue) = self.channels.get_mut(&attempt.channel) {
            queue.busy = false;
        }
        for (key, verdict) in attempt.keys.into_iter().zip(attempt.verdicts) {
            let Some(mut entry) = self.entries.remove(&key) else {
                continue;
            };
            let d = &mut entry.delivery;
            d.attempts += 1;
            d.last_attempt_at = Some(now_wall);
            let queue = self.channels.get_mut(&attempt.channel);
            match &verdict {
                Verdict::Retry(_) => {}
                _ => {
                    if let Some(queue) = queue {
                        queue.backlog = queue.backlog.saturating_sub(1);
                    }
                }
            }
            match &verdict {
                Verdict::Delivered => {
                    d.state = DeliveryState::Delivered;
                    d.delivered_at = Some(now_wall);
                    d.next_attempt_at = None;
                    info!(
                        key,
                        PTRAIN_JOB = %d.intent.notice.job_id,
                        channel = %attempt.channel,
                        attempts = d.attempts,
                        "notification delivered"
                    );
                    self.persist_final(d);
                }
                Verdict::Retry(why) => {
                    match self
                        .policy
                        .next_attempt(d.attempts, jitter(), now, entry.deadline)
                    {
                        Some(at) => {
                            d.state = DeliveryState::Retrying;
                            d.last_error = Some(why.clone());
                            d.next_attempt_at = Some(
                                now_wall + at.saturating_duration_since(now).as_micros() as u64,
                            );
                            warn!(
                                key,
                                PTRAIN_JOB = %d.intent.notice.job_id,
                                channel = %attempt.channel,
                                attempts = d.attempts,
                                retry_in = %fmt_duration(at.saturating_duration_since(now)),
                                "notification attempt failed: {why}"
                            );
                            self.persist(d);
                            if let Some(queue) = self.channels.get_mut(&attempt.channel) {
                                if queue.ordered {
                                    // Its job's later events wait behind it.
                                    queue.held_until =
                                        Some(queue.held_until.map_or(at, |h| h.max(at)));
                                    queue.due.insert((self.origin, entry.seq, key.clone()));
                                } else {
                                    queue.due.insert((at, entry.seq, key.clone()));
                                }
                            }
                            self.entries.insert(key, entry);
                        }
                        None => {
                            if let Some(queue) = self.channels.get_mut(&attempt.channel) {
                                queue.backlog = queue.backlog.saturating_sub(1);
                            }
                            let why = format!(
                                "still failing after {} (notify.lifetime): {why}",
                                fmt_duration(self.policy.lifetime)
                            );
                            self.bury(entry.delivery, why);
                        }
                    }
                }
                Verdict::Dead(why) => {
                    let why = why.clone();
                    self.bury(entry.delivery, why);
                }
            }
        }
    }

    fn retry(&mut self, target: RetryTarget) -> Result<String, DeliveriesError> {
        match target {
            RetryTarget::Key(key) => {
                if !is_key(&key) {
                    return Err(DeliveriesError::NotAKey(key));
                }
                let now = Instant::now();
                if let Some(entry) = self.entries.get(&key) {
                    let channel = entry.delivery.intent.channel.clone();
                    if let Some(queue) = self.channels.get_mut(&channel) {
                        if queue.ordered {
                            // It keeps its place; the hold is what made it wait.
                            queue.held_until = None;
                        } else if let Some(item) =
                            queue.due.iter().find(|(_, _, k)| *k == key).cloned()
                        {
                            queue.due.remove(&item);
                            queue.due.insert((now, item.1, key.clone()));
                        }
                    }
                    return Ok(format!(
                        "{key} is {}; trying it again now",
                        entry.delivery.state.as_str()
                    ));
                }
                match self.outbox.load(&key) {
                    Ok(None) => Err(DeliveriesError::NoSuchKey(key)),
                    Ok(Some(d)) if d.state == DeliveryState::Delivered => {
                        Err(DeliveriesError::AlreadyDelivered(key))
                    }
                    Ok(Some(d)) => {
                        self.revive(d);
                        Ok(format!("{key} will be sent again"))
                    }
                    Err(source) => Err(DeliveriesError::ReadDelivery { key, source }),
                }
            }
            RetryTarget::AllDead => {
                let all = self.outbox.list().map_err(DeliveriesError::ReadOutbox)?;
                let dead: Vec<Delivery> = all
                    .into_iter()
                    .filter(|d| {
                        d.state == DeliveryState::Dead && !self.entries.contains_key(&d.intent.key)
                    })
                    .collect();
                let n = dead.len();
                for d in dead {
                    self.revive(d);
                }
                Ok(format!("{n} dead notification(s) will be sent again"))
            }
        }
    }

    /// A dead letter gets a new lifetime and starts over.
    fn revive(&mut self, mut d: Delivery) {
        info!(key = %d.intent.key, "re-sending a dead notification on root's request");
        d.state = DeliveryState::Pending;
        d.attempts = 0;
        d.lifetime_from = now_micros();
        d.next_attempt_at = None;
        self.persist(&d);
        self.admit(d);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use futures_util::future::BoxFuture;

    use super::super::{Notice, NotifyEvent};
    use super::*;

    pub(crate) fn intent(job: &str, event: NotifyEvent, channel: &str) -> Intent {
        Intent {
            key: super::super::key_of(job, 1, event, channel),
            channel: channel.into(),
            created_at: now_micros(),
            notice: Notice {
                job_id: job.into(),
                owner: "alice".into(),
                uid: 1000,
                event,
                status: event.as_str().into(),
                detail: event.as_str().into(),
                exit_code: None,
                signal: None,
                submitted_at: 1,
                started_at: Some(2),
                ended_at: Some(3_000_002),
                gpus: Vec::new(),
                host: "gpu01".into(),
                unit: format!("ptrain-job@{job}.service"),
                results: None,
                invocation_id: None,
                output_tail: None,
            },
        }
    }

    /// A transport that answers from a script (then "delivered") and logs
    /// when each message went and what it carried.
    #[derive(Default)]
    struct Fake {
        script: Mutex<VecDeque<Verdict>>,
        log: Mutex<Vec<(Instant, Vec<String>)>>,
        hang: bool,
        max_batch: usize,
        per_minute: Option<u32>,
        sent: Option<mpsc::UnboundedSender<usize>>,
        /// (key, output lines) of every message sent.
        seen: Mutex<Vec<(String, Option<Vec<String>>)>>,
    }

    impl Transport for Arc<Fake> {
        fn send(&self, batch: Vec<Intent>) -> BoxFuture<'static, Verdict> {
            self.log.lock().unwrap().push((
                Instant::now(),
                batch.iter().map(|i| i.key.clone()).collect(),
            ));
            if let Some(tx) = &self.sent {
                let _ = tx.send(batch.len());
            }
            self.seen.lock().unwrap().extend(
                batch
                    .iter()
                    .map(|i| (i.key.clone(), i.notice.output_tail.clone())),
            );
            let verdict = self
                .script
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Verdict::Delivered);
            let hang = self.hang;
            Box::pin(async move {
                if hang {
                    std::future::pending::<()>().await;
                }
                verdict
            })
        }
        fn max_batch(&self) -> usize {
            self.max_batch.max(1)
        }
        fn per_minute(&self) -> Option<u32> {
            self.per_minute
        }
    }

    /// A transport that answers `verdicts` in turn, then "delivered".
    fn scripted<const N: usize>(verdicts: [Verdict; N]) -> Arc<Fake> {
        Arc::new(Fake {
            script: Mutex::new(verdicts.into()),
            ..Fake::default()
        })
    }

    fn config(initial: u64, max: u64, lifetime: u64) -> NotificationsConfig {
        NotificationsConfig {
            retry: RetryPolicy {
                initial_backoff: Duration::from_secs(initial),
                max_backoff: Duration::from_secs(max),
                lifetime: Duration::from_secs(lifetime),
            },
            ..NotificationsConfig::default()
        }
    }

    fn start(cfg: &NotificationsConfig, dir: &Path, fake: &Arc<Fake>) -> Notifier {
        start_reading(cfg, dir, fake, Arc::new(|_| async { Vec::new() }.boxed()))
    }

    fn start_reading(
        cfg: &NotificationsConfig,
        dir: &Path,
        fake: &Arc<Fake>,
        tails: TailReader,
    ) -> Notifier {
        let mut t: HashMap<String, Arc<dyn Transport>> = HashMap::new();
        t.insert("ch".into(), Arc::new(fake.clone()));
        Notifier::with_transports(cfg, Outbox::open(dir).unwrap(), t, tails)
    }

    async fn wait_state(n: &Notifier, key: &str, state: DeliveryState) -> DeliveryView {
        // Paused time: each sleep lets the sender run to its next timer.
        for _ in 0..100_000 {
            let all = n.deliveries().await.unwrap();
            if let Some(d) = all.into_iter().find(|d| d.key == key && d.state == state) {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{key} never became {state:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn retries_with_backoff_then_delivers_once() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Arc::new(Fake {
            script: Mutex::new((0..5).map(|_| Verdict::Retry("HTTP 503".into())).collect()),
            ..Fake::default()
        });
        let cfg = config(2, 20, 3600);
        let n = start(&cfg, dir.path(), &fake);
        let i = intent("j", NotifyEvent::Failed, "ch");
        n.deliver(vec![i.clone()]);
        let d = wait_state(&n, &i.key, DeliveryState::Delivered).await;
        assert_eq!(d.attempts, 6);
        let log = fake.log.lock().unwrap().clone();
        assert_eq!(log.len(), 6);
        for (n_failed, w) in log.windows(2).enumerate() {
            let gap = w[1].0 - w[0].0;
            let ceiling = cfg.retry.ceiling(n_failed as u32 + 1);
            assert!(
                gap >= ceiling / 2 && gap <= ceiling,
                "gap {gap:?} vs {ceiling:?}"
            );
        }
        // Handing it over again (a restart) sends nothing more.
        n.deliver(vec![i.clone()]);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(fake.log.lock().unwrap().len(), 6);
    }

    /// A sender whose first attempt finds the broker down (retried 5 s
    /// on), with its outbox to look into.
    fn down_once(dir: &Path) -> (Outbox, Arc<Fake>, NotificationsConfig, Notifier) {
        let fake = scripted([Verdict::Retry("broker down".into())]);
        let cfg = config(5, 5, 3600);
        let n = start(&cfg, dir, &fake);
        (Outbox::open(dir).unwrap(), fake, cfg, n)
    }

    #[tokio::test(start_paused = true)]
    async fn a_forgotten_key_is_still_sent_then_leaves_no_status_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (outbox, fake, cfg, n) = down_once(dir.path());
        let done = intent("a", NotifyEvent::Refused, "ch");
        n.deliver(vec![done.clone()]);
        let pending = intent("b", NotifyEvent::Refused, "ch");
        // Its first attempt fails: it is retrying when its owner goes.
        wait_state(&n, &done.key, DeliveryState::Delivered).await;
        assert!(outbox.load(&done.key).unwrap().is_some());
        fake.script
            .lock()
            .unwrap()
            .push_back(Verdict::Retry("broker down".into()));
        n.deliver(vec![pending.clone()]);
        wait_state(&n, &pending.key, DeliveryState::Retrying).await;
        n.forget(vec![done.key.clone(), pending.key.clone()]);
        // A final one goes at once; the other stays, marked, while on its way.
        let _ = n.deliveries().await.unwrap();
        assert!(outbox.load(&done.key).unwrap().is_none());
        let kept = outbox
            .load(&pending.key)
            .unwrap()
            .expect("still on its way");
        assert!(kept.forget_once_final && !kept.state.is_final());
        // A restart resumes it from the outbox alone, mark and all; sent, it goes.
        assert_eq!(n.drain().await, Some(Drained { pending: 1 }));
        fake.log.lock().unwrap().clear();
        let n = start(&cfg, dir.path(), &fake);
        for _ in 0..1000 {
            if outbox.load(&pending.key).unwrap().is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(outbox.load(&pending.key).unwrap().is_none());
        let sent = sent_keys(&fake);
        assert!(sent.contains(&pending.key), "{sent:?}");
        assert!(n.deliveries().await.unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_discarded_key_is_not_sent_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let (outbox, fake, _, n) = down_once(dir.path());
        let waiting = intent("a", NotifyEvent::Refused, "ch");
        let later = intent("b", NotifyEvent::Refused, "ch");
        n.deliver(vec![waiting.clone()]);
        wait_state(&n, &waiting.key, DeliveryState::Retrying).await;
        n.deliver(vec![later.clone()]);
        n.discard(vec![waiting.key.clone()]);
        wait_state(&n, &later.key, DeliveryState::Delivered).await;
        assert!(outbox.load(&waiting.key).unwrap().is_none());
        tokio::time::sleep(Duration::from_secs(60)).await;
        let sent = sent_keys(&fake);
        assert_eq!(
            sent,
            [waiting.key.clone(), later.key.clone()],
            "tried once, then dropped"
        );
        assert!(outbox.load(&waiting.key).unwrap().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_rejection_is_dead_at_once_and_root_can_resend_it() {
        let dir = tempfile::tempdir().unwrap();
        let fake = scripted([Verdict::Dead("HTTP 400".into())]);
        let n = start(&config(1, 10, 3600), dir.path(), &fake);
        let i = intent("j", NotifyEvent::Succeeded, "ch");
        n.deliver(vec![i.clone()]);
        let d = wait_state(&n, &i.key, DeliveryState::Dead).await;
        assert_eq!(d.attempts, 1);
        assert!(d.last_error.unwrap().contains("HTTP 400"));
        let said = n.retry_now(RetryTarget::Key(i.key.clone())).await.unwrap();
        assert!(said.contains("sent again"), "{said}");
        wait_state(&n, &i.key, DeliveryState::Delivered).await;
        let again = n
            .retry_now(RetryTarget::Key(i.key.clone()))
            .await
            .unwrap_err();
        assert!(again.to_string().contains("already delivered"), "{again}");
        let missing = n
            .retry_now(RetryTarget::Key("nope.failed.ch".into()))
            .await
            .unwrap_err();
        assert!(
            missing.to_string().contains("ptrain notifications"),
            "{missing}"
        );
        assert!(n.retry_now(RetryTarget::Key("../x".into())).await.is_err());
        assert_eq!(fake.log.lock().unwrap().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn down_for_the_whole_lifetime_is_a_dead_letter() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Arc::new(Fake {
            script: Mutex::new(
                (0..1000)
                    .map(|_| Verdict::Retry("connection refused".into()))
                    .collect(),
            ),
            ..Fake::default()
        });
        let n = start(&config(1, 8, 60), dir.path(), &fake);
        let i = intent("j", NotifyEvent::Failed, "ch");
        let t0 = Instant::now();
        n.deliver(vec![i.clone()]);
        let d = wait_state(&n, &i.key, DeliveryState::Dead).await;
        let log = fake.log.lock().unwrap().clone();
        let last = log.last().unwrap().0 - t0;
        // Tried until the lifetime ran out, the last try on its end.
        assert!(
            last <= Duration::from_secs(61) && last >= Duration::from_secs(59),
            "{last:?}"
        );
        assert!(log.len() >= 8 && log.len() <= 16, "{}", log.len());
        assert_eq!(d.attempts as usize, log.len());
        assert!(d.last_error.unwrap().contains("notify.lifetime"));
        // All dead ones come back on request.
        fake.script.lock().unwrap().clear();
        let said = n.retry_now(RetryTarget::AllDead).await.unwrap();
        assert!(said.starts_with("1 dead"), "{said}");
        wait_state(&n, &i.key, DeliveryState::Delivered).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_sends_what_is_due_and_leaves_retries_pending() {
        let dir = tempfile::tempdir().unwrap();
        // One delivery fails once (a retry 60 s on), the other goes through.
        let fake = scripted([Verdict::Retry("HTTP 503".into())]);
        let n = start(&config(60, 60, 3600), dir.path(), &fake);
        let first = intent("a", NotifyEvent::Failed, "ch");
        n.deliver(vec![first.clone()]);
        wait_state(&n, &first.key, DeliveryState::Retrying).await;
        // Handed over just before the stop: not tried yet when it comes.
        let last = intent("b", NotifyEvent::Succeeded, "ch");
        n.deliver(vec![last.clone()]);
        let t0 = Instant::now();
        assert_eq!(n.drain().await, Some(Drained { pending: 1 }));
        // It did not wait for the retry a minute away.
        assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
        let sent: Vec<Vec<String>> = fake
            .log
            .lock()
            .unwrap()
            .iter()
            .map(|(_, k)| k.clone())
            .collect();
        assert_eq!(sent, [vec![first.key.clone()], vec![last.key.clone()]]);
        // The sender is gone; the outbox has the truth for the next start.
        assert!(n.drain().await.is_none());
        let outbox = Outbox::open(dir.path()).unwrap().list().unwrap();
        let state = |key: &str| outbox.iter().find(|d| d.intent.key == key).map(|d| d.state);
        assert_eq!(state(&last.key), Some(DeliveryState::Delivered));
        assert_eq!(state(&first.key), Some(DeliveryState::Retrying));
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_waits_for_the_attempt_under_way() {
        let dir = tempfile::tempdir().unwrap();
        let (sent_tx, mut sent) = mpsc::unbounded_channel();
        let fake = Arc::new(Fake {
            hang: true,
            sent: Some(sent_tx),
            ..Fake::default()
        });
        let mut cfg = config(1, 1, 3600);
        cfg.attempt_timeout = Duration::from_secs(10);
        let n = start(&cfg, dir.path(), &fake);
        let i = intent("j", NotifyEvent::Failed, "ch");
        n.deliver(vec![i.clone()]);
        sent.recv().await.unwrap();
        let t0 = Instant::now();
        // The attempt hangs until its timeout; the drain ends with it.
        assert_eq!(n.drain().await, Some(Drained { pending: 1 }));
        assert!(t0.elapsed() >= Duration::from_secs(9), "{:?}", t0.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_attempt_times_out_and_is_retried() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Arc::new(Fake {
            hang: true,
            ..Fake::default()
        });
        let mut cfg = config(1, 1, 3600);
        cfg.attempt_timeout = Duration::from_secs(10);
        let n = start(&cfg, dir.path(), &fake);
        let i = intent("j", NotifyEvent::Failed, "ch");
        n.deliver(vec![i.clone()]);
        let d = wait_state(&n, &i.key, DeliveryState::Retrying).await;
        assert!(d.last_error.unwrap().contains("no answer within 10s"));
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_restart_pending_ones_go_again_with_the_same_key() {
        let dir = tempfile::tempdir().unwrap();
        let hung = Arc::new(Fake {
            hang: true,
            ..Fake::default()
        });
        let cfg = config(1, 10, 3600);
        let first = start(&cfg, dir.path(), &hung);
        let i = intent("j", NotifyEvent::Failed, "ch");
        first.deliver(vec![i.clone()]);
        wait_state(&first, &i.key, DeliveryState::Pending).await;
        while hung.log.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The "crash": the sender goes away mid-attempt.
        drop(first);
        let fine = Arc::new(Fake::default());
        let second = start(&cfg, dir.path(), &fine);
        second.deliver(vec![i.clone()]);
        wait_state(&second, &i.key, DeliveryState::Delivered).await;
        assert_eq!(fine.log.lock().unwrap()[0].1, vec![i.key.clone()]);
    }

    /// The output lines are read once, before the first attempt, and kept
    /// in the outbox: a retry and a restart mid-attempt send the same ones
    /// even though a second read would give others.
    #[tokio::test(start_paused = true)]
    async fn output_lines_are_read_once_and_kept_across_retries_and_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let reader: TailReader = {
            let reads = reads.clone();
            Arc::new(move |_| {
                let k = reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async move { vec![format!("read {k}")] }.boxed()
            })
        };
        let cfg = config(1, 10, 3600);
        let hung = Arc::new(Fake {
            hang: true,
            ..Fake::default()
        });
        let first = start_reading(&cfg, dir.path(), &hung, reader.clone());
        let i = intent("j", NotifyEvent::Failed, "ch");
        first.deliver(vec![i.clone()]);
        while hung.log.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(first);
        let flaky = Arc::new(Fake {
            script: Mutex::new([Verdict::Retry("HTTP 503".into())].into()),
            ..Fake::default()
        });
        let second = start_reading(&cfg, dir.path(), &flaky, reader);
        let started = intent("j", NotifyEvent::Started, "ch");
        // The job record's copy, without lines, as after a restart.
        second.deliver(vec![i.clone(), started.clone()]);
        wait_state(&second, &i.key, DeliveryState::Delivered).await;
        wait_state(&second, &started.key, DeliveryState::Delivered).await;
        let want = Some(vec!["read 0".to_owned()]);
        assert_eq!(
            *hung.seen.lock().unwrap(),
            vec![(i.key.clone(), want.clone())]
        );
        let seen = flaky.seen.lock().unwrap().clone();
        let ends: Vec<_> = seen.iter().filter(|(k, _)| *k == i.key).collect();
        assert_eq!(ends.len(), 2, "{seen:?}");
        assert!(ends.iter().all(|(_, t)| *t == want), "{seen:?}");
        // A start carries no lines and costs no read.
        assert!(seen.contains(&(started.key.clone(), None)), "{seen:?}");
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 1);
        let kept = Outbox::open(dir.path())
            .unwrap()
            .load(&i.key)
            .unwrap()
            .unwrap();
        assert_eq!(kept.intent.notice.output_tail, want);
    }

    #[tokio::test(start_paused = true)]
    async fn the_outbox_alone_resumes_unfinished_deliveries() {
        // A job whose record was compacted away: only its status file is left.
        let dir = tempfile::tempdir().unwrap();
        let i = intent("compacted", NotifyEvent::Failed, "ch");
        let mut d = Delivery::new(i.clone());
        d.state = DeliveryState::Retrying;
        d.attempts = 2;
        Outbox::open(dir.path()).unwrap().save(&d).unwrap();
        let mut done = Delivery::new(intent("done", NotifyEvent::Failed, "ch"));
        done.state = DeliveryState::Delivered;
        Outbox::open(dir.path()).unwrap().save(&done).unwrap();
        let fake = Arc::new(Fake::default());
        let n = start(&config(1, 10, 3600), dir.path(), &fake);
        let v = wait_state(&n, &i.key, DeliveryState::Delivered).await;
        assert_eq!(v.attempts, 3);
        assert_eq!(fake.log.lock().unwrap().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_channel_is_a_dead_letter_naming_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Arc::new(Fake::default());
        let n = start(&config(1, 10, 3600), dir.path(), &fake);
        let i = intent("j", NotifyEvent::Failed, "gone");
        n.deliver(vec![i.clone()]);
        let d = wait_state(&n, &i.key, DeliveryState::Dead).await;
        assert!(d.last_error.unwrap().contains("[channels.gone]"));
    }

    /// 100 events at once, then 100 more one a second, to a robot that
    /// takes 20 messages a minute and sometimes says "too fast" (45009).
    #[tokio::test(start_paused = true)]
    async fn a_robot_gets_at_most_20_a_minute_and_every_event() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let fake = Arc::new(Fake {
            script: Mutex::new(
                [
                    Verdict::Delivered,
                    Verdict::Retry("WeCom errcode 45009".into()),
                ]
                .into(),
            ),
            max_batch: pacing::MAX_DIGEST,
            per_minute: Some(20),
            sent: Some(tx),
            ..Fake::default()
        });
        let n = start(&config(5, 60, 24 * 3600), dir.path(), &fake);
        let burst: Vec<Intent> = (0..100)
            .map(|k| intent(&format!("burst{k:03}"), NotifyEvent::Succeeded, "ch"))
            .collect();
        n.deliver(burst.clone());
        let mut trickle = Vec::new();
        for k in 0..100 {
            let i = intent(&format!("drip{k:03}"), NotifyEvent::Failed, "ch");
            n.deliver(vec![i.clone()]);
            trickle.push(i);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let all: Vec<&Intent> = burst.iter().chain(&trickle).collect();
        for i in &all {
            wait_state(&n, &i.key, DeliveryState::Delivered).await;
        }
        while rx.try_recv().is_ok() {}
        let log = fake.log.lock().unwrap().clone();
        for w in 20..log.len() {
            assert!(
                log[w].0 - log[w - 20].0 >= Duration::from_secs(60),
                "21 messages within a minute"
            );
        }
        assert!(log.iter().all(|(_, keys)| keys.len() <= pacing::MAX_DIGEST));
        // Every event went out, and (but for the batch the robot refused)
        // exactly once.
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for (_, keys) in &log {
            for k in keys {
                *counts.entry(k.as_str()).or_default() += 1;
            }
        }
        let refused = &log[1].1;
        for i in &all {
            let want = if refused.contains(&i.key) { 2 } else { 1 };
            assert_eq!(counts.get(i.key.as_str()), Some(&want), "{}", i.key);
        }
        assert!(
            log.len() < 200 / 2,
            "events were not merged: {} messages",
            log.len()
        );
    }

    /// A config whose channel `ch` is a stream (ordered) or a webhook.
    fn config_with(kind: &str, extra: &str) -> NotificationsConfig {
        let channel = match kind {
            "amqp" => "kind = \"amqp\"\nurl = \"amqp://127.0.0.1:5672/%2f\"\nexchange = \"x\"",
            _ => "kind = \"webhook\"\nurl = \"http://127.0.0.1:9/hook\"",
        };
        let text = format!(
            "[notify]\ninitial_backoff = \"2s\"\nmax_backoff = \"20s\"\n{extra}\n[channels.ch]\n{channel}\n"
        );
        crate::config::Config::from_toml(Path::new("/etc/ptrain/ptrain.toml"), &text)
            .unwrap()
            .notifications
    }

    fn sent_keys(fake: &Fake) -> Vec<String> {
        let log = fake.log.lock().unwrap();
        log.iter().flat_map(|(_, keys)| keys.clone()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_holds_a_jobs_later_events_behind_one_that_failed() {
        for (kind, in_order) in [("amqp", true), ("webhook", false)] {
            let dir = tempfile::tempdir().unwrap();
            let fake = scripted([Verdict::Retry("broker down".into())]);
            let n = start(&config_with(kind, ""), dir.path(), &fake);
            let started = intent("a", NotifyEvent::Started, "ch");
            n.deliver(vec![started.clone()]);
            wait_state(&n, &started.key, DeliveryState::Retrying).await;
            // While the start waits for its retry, the job ends and
            // another job starts.
            let ended = intent("a", NotifyEvent::Succeeded, "ch");
            let other = intent("b", NotifyEvent::Started, "ch");
            n.deliver(vec![ended.clone(), other.clone()]);
            wait_state(&n, &ended.key, DeliveryState::Delivered).await;
            wait_state(&n, &other.key, DeliveryState::Delivered).await;
            wait_state(&n, &started.key, DeliveryState::Delivered).await;
            let sent = sent_keys(&fake);
            assert_eq!(sent.len(), 4, "{kind}: {sent:?}");
            if in_order {
                assert_eq!(
                    sent,
                    [&started.key, &started.key, &ended.key, &other.key].map(String::clone),
                    "{kind}"
                );
            } else {
                // A webhook is one receiver: the others do not wait.
                assert_eq!(sent[3], started.key, "{kind}: {sent:?}");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_sends_nothing_admitted_after_an_event_whose_lines_are_being_read() {
        let dir = tempfile::tempdir().unwrap();
        let fake = scripted([]);
        // Reading the output lines takes 5 s.
        let slow: TailReader = Arc::new(|_| {
            async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                vec!["last line".to_owned()]
            }
            .boxed()
        });
        let n = start_reading(&config_with("amqp", ""), dir.path(), &fake, slow);
        // Attempt 1 ended and runs again (its lines are read), then
        // attempt 2 starts at once.
        let retry = intent("a", NotifyEvent::Retry, "ch");
        let mut again = intent("a", NotifyEvent::Started, "ch");
        again.key = super::super::key_of("a", 2, NotifyEvent::Started, "ch");
        n.deliver(vec![retry.clone()]);
        n.deliver(vec![again.clone()]);
        wait_state(&n, &again.key, DeliveryState::Delivered).await;
        assert_eq!(sent_keys(&fake), [retry.key.clone(), again.key.clone()]);
    }

    /// A transport that refuses one key outright and delivers the rest:
    /// a broker's confirm per message.
    struct PerKey(String, Arc<Fake>);

    impl Transport for PerKey {
        fn send(&self, _batch: Vec<Intent>) -> BoxFuture<'static, Verdict> {
            unreachable!("the sender asks for each intent's verdict")
        }
        fn send_each(&self, batch: Vec<Intent>) -> BoxFuture<'static, Vec<Verdict>> {
            self.1.log.lock().unwrap().push((
                Instant::now(),
                batch.iter().map(|i| i.key.clone()).collect(),
            ));
            let verdicts = batch
                .iter()
                .map(|i| match i.key == self.0 {
                    true => Verdict::Dead("NO_ROUTE".into()),
                    false => Verdict::Delivered,
                })
                .collect();
            Box::pin(async move { verdicts })
        }
        fn max_batch(&self) -> usize {
            64
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_event_of_a_batch_gets_its_own_verdict() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(Fake::default());
        let all: Vec<Intent> = (0..5)
            .map(|k| intent(&format!("j{k}"), NotifyEvent::Started, "ch"))
            .collect();
        let mut t: HashMap<String, Arc<dyn Transport>> = HashMap::new();
        t.insert(
            "ch".into(),
            Arc::new(PerKey(all[2].key.clone(), log.clone())),
        );
        let n = Notifier::with_transports(
            &config_with("amqp", ""),
            Outbox::open(dir.path()).unwrap(),
            t,
            Arc::new(|_| async { Vec::new() }.boxed()),
        );
        n.deliver(all.clone());
        for (k, i) in all.iter().enumerate() {
            let want = if k == 2 {
                DeliveryState::Dead
            } else {
                DeliveryState::Delivered
            };
            let d = wait_state(&n, &i.key, want).await;
            assert_eq!(d.attempts, 1, "{}", i.key);
        }
        // One attempt carried them all, in the order they were handed over.
        let log = log.log.lock().unwrap().clone();
        assert_eq!(log.len(), 1);
        assert_eq!(
            log[0].1,
            all.iter().map(|i| i.key.clone()).collect::<Vec<_>>()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_channel_over_its_backlog_keeps_the_rest_on_disk_and_takes_them_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        // The broker is down for the first four attempts.
        let fake = scripted([
            Verdict::Retry("down".into()),
            Verdict::Retry("down".into()),
            Verdict::Retry("down".into()),
            Verdict::Retry("down".into()),
        ]);
        let n = start(&config_with("amqp", "max_backlog = 2"), dir.path(), &fake);
        let all: Vec<Intent> = (0..7)
            .map(|k| intent(&format!("j{k}"), NotifyEvent::Started, "ch"))
            .collect();
        for i in &all {
            n.deliver(vec![i.clone()]);
        }
        for i in &all {
            wait_state(&n, &i.key, DeliveryState::Delivered).await;
        }
        // Never more than the bound in one attempt (the rest were not in
        // memory), and each sent first in the order they happened.
        let log = fake.log.lock().unwrap().clone();
        assert!(log.iter().all(|(_, keys)| keys.len() <= 2), "{log:?}");
        let mut first_seen: Vec<String> = Vec::new();
        for key in sent_keys(&fake) {
            if !first_seen.contains(&key) {
                first_seen.push(key);
            }
        }
        let want: Vec<String> = all.iter().map(|i| i.key.clone()).collect();
        assert_eq!(first_seen, want);
        // Nothing became a dead letter for the bound's sake.
        let listed = n.deliveries().await.unwrap();
        assert!(
            listed.iter().all(|d| d.state == DeliveryState::Delivered),
            "{listed:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_ordered_attempt_carries_one_event_per_job() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(Fake::default());
        let a1 = intent("a", NotifyEvent::Submitted, "ch");
        let b1 = intent("b", NotifyEvent::Submitted, "ch");
        let a2 = intent("a", NotifyEvent::Started, "ch");
        let mut t: HashMap<String, Arc<dyn Transport>> = HashMap::new();
        t.insert("ch".into(), Arc::new(PerKey(String::new(), log.clone())));
        let n = Notifier::with_transports(
            &config_with("amqp", ""),
            Outbox::open(dir.path()).unwrap(),
            t,
            Arc::new(|_| async { Vec::new() }.boxed()),
        );
        n.deliver(vec![a1.clone(), b1.clone(), a2.clone()]);
        wait_state(&n, &a2.key, DeliveryState::Delivered).await;
        let log = log.log.lock().unwrap().clone();
        assert_eq!(log[0].1, [a1.key.clone(), b1.key.clone()]);
        assert_eq!(log[1].1, std::slice::from_ref(&a2.key));
    }

    #[test]
    fn keys_from_the_cli_are_one_file_name() {
        assert!(is_key("run-1.failed.hook"));
        for bad in ["", ".x", "a/b", "../x", "a b"] {
            assert!(!is_key(bad), "{bad}");
        }
    }
}
