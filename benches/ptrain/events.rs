//! Issue 25's benchmark (`BENCH_ONLY=events`): what an event stream costs,
//! for each broker. One ptraind in the harness, restarted in turn with and
//! without a stream channel (every job's submitted, started and succeeded
//! events): `amqp` to a RabbitMQ of the bench's own
//! (`tests/integration/rabbit.rs`), then `kafka` to a tansu of its own
//! (`tests/integration/tansu.rs`); bursts of trivial jobs each way:
//!
//! - ptraind's CPU per job with the stream against without, read from
//!   ptraind.service's cgroup around each burst once every event is in the
//!   consumer's hands, and what that makes per event;
//! - the end-to-end lag of each event: from the state change (the event's
//!   `time`, when ptraind recorded it) to a consumer on the broker holding
//!   it, p50 and p99 over every event.
//!
//! Reported, never enforced (the issue sets no target): CPU of a burst on
//! a shared 2-core machine moves with the broker's own work beside it, and
//! the lag is wall-clock.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use serde_json::json;

use super::report::{percentile, Figure};
use super::{
    median, on_off_order, ptraind_pid, restart_with_config, say, settle, summary, Bench, BlockCpu,
    Dropper, Tracker,
};
use crate::daemon::{Opts, TestDaemon};
use crate::harness::wait_for;
use crate::rabbit::Rabbit;
use crate::tansu::Tansu;

const EXCHANGE: &str = "ptrain.events";
const QUEUE: &str = "bench-events";
const TOPIC: &str = "bench.events";
/// The events of one trivial job: submitted, started, succeeded.
const EVENTS_PER_JOB: usize = 3;

/// What the consumer has taken: each event's lag, in ms.
#[derive(Default)]
struct Taken {
    lags_ms: Vec<f64>,
}

/// A broker the bench streams to, with the channel that reaches it.
enum Broker {
    Amqp(Rabbit),
    Kafka(Tansu),
}

impl Broker {
    /// The figures' prefix: `events.` for RabbitMQ (as before Kafka came),
    /// `events.kafka.` for Kafka.
    fn prefix(&self) -> &'static str {
        match self {
            Broker::Amqp(_) => "events.",
            Broker::Kafka(_) => "events.kafka.",
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Broker::Amqp(_) => "amqp",
            Broker::Kafka(_) => "kafka",
        }
    }
}

impl Bench<'_> {
    pub(super) fn events_on_vs_off(&mut self) {
        let (rounds, k) = (self.scale.events_rounds, self.scale.events_jobs);
        if rounds == 0 || k == 0 {
            return;
        }
        say("events: a RabbitMQ of the bench's own, and a harness for the stream on against off");
        let rabbit = Rabbit::start("bench-events");
        rabbit.bind_queue(EXCHANGE, QUEUE, "ptrain.#");
        self.stream_on_vs_off(Broker::Amqp(rabbit));
        say("events: a Kafka-protocol broker (tansu) of the bench's own, the same again");
        let tansu = Tansu::start("bench-kevents");
        tansu.create_topic(TOPIC, 3);
        self.stream_on_vs_off(Broker::Kafka(tansu));
    }

    fn stream_on_vs_off(&mut self, broker: Broker) {
        let (rounds, k) = (self.scale.events_rounds, self.scale.events_jobs);
        let (prefix, kind) = (broker.prefix(), broker.kind());
        let secrets = std::path::PathBuf::from(format!(
            "/srv/ptrain-tests/bench-events-secrets-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&secrets);
        std::fs::create_dir_all(&secrets).expect("the secrets' directory");
        let stream = match &broker {
            Broker::Amqp(rabbit) => {
                let password = secrets.join("rabbit.password");
                write_secret(&password, &rabbit.password);
                format!(
                    "[channels.bus]\nkind = \"amqp\"\nurl = \"amqp://127.0.0.1:{}/%2f\"\nusername = \"ptrain\"\npassword_file = \"{}\"\nexchange = \"{EXCHANGE}\"\n",
                    rabbit.port,
                    password.display()
                )
            }
            Broker::Kafka(tansu) => format!(
                "[channels.bus]\nkind = \"kafka\"\nbootstrap_servers = [\"{}\"]\ntopic = \"{TOPIC}\"\n",
                tansu.bootstrap()
            ),
        };
        let base = "max_queued_per_user = 1000000\n[jobs]\nkeep_ended_units = \"0s\"\n\
                    [logs]\nmin_free = \"1%\"\n";
        let config = |on: bool| {
            if on {
                format!("{base}{stream}")
            } else {
                base.to_owned()
            }
        };
        let d = TestDaemon::start_with(
            &format!("bench-{kind}"),
            Opts {
                extra_config: config(true),
                ..Opts::default()
            },
        );
        let dropper = Dropper::new(&d);
        let tracker = self.rt.block_on(Tracker::connect(&d.harness.bus_address()));
        let taken = Arc::new(Mutex::new(Taken::default()));
        let consumer = match &broker {
            Broker::Amqp(rabbit) => self.rt.spawn(consume(
                rabbit.url("ptrain", &rabbit.password),
                taken.clone(),
            )),
            Broker::Kafka(tansu) => self
                .rt
                .spawn(consume_kafka(tansu.bootstrap(), taken.clone())),
        };
        let written =
            std::fs::read_to_string(d.root.join("ptrain.toml")).expect("the harness's config");
        // [on, off]: ptraind's CPU per job of each burst.
        let mut cpu: [Vec<f64>; 2] = Default::default();
        let mut rates: [Vec<f64>; 2] = Default::default();
        for round in 0..rounds {
            for on in on_off_order(round) {
                let side = usize::from(!on);
                restart_with_config(&d, &written.replace(&config(true), &config(on)));
                let pid = ptraind_pid(&d);
                let had = taken.lock().unwrap().lags_ms.len();
                let before = BlockCpu::read(pid, d.harness.systemd_pid());
                let tag = format!("e{kind}{round}{}", ["on", "off"][side]);
                let burst = self.burst(&d, &tracker, &dropper, &tag, k, "");
                assert_eq!(burst.failed, 0, "events on={on}: jobs failed");
                if on {
                    wait_for(
                        "every event of the burst at the consumer",
                        Duration::from_secs(120),
                        || {
                            (taken.lock().unwrap().lags_ms.len() >= had + k * EVENTS_PER_JOB)
                                .then_some(())
                        },
                    );
                }
                settle();
                let after = BlockCpu::read(pid, d.harness.systemd_pid());
                if let (Some(b), Some(a)) = (before, after) {
                    let ns = a.service_ns.saturating_sub(b.service_ns);
                    cpu[side].push(ns as f64 / 1e6 / k as f64);
                }
                rates[side].extend(burst.jobs_per_s());
            }
        }
        consumer.abort();
        let lags = std::mem::take(&mut taken.lock().unwrap().lags_ms);
        say(&format!(
            "events: ptraind's CPU per job by burst, {kind} stream on {:?} ms, off {:?} ms",
            cpu[0], cpu[1]
        ));
        let (on_ms, off_ms) = (median(&cpu[0]), median(&cpu[1]));
        let per_event = on_ms
            .zip(off_ms)
            .map(|(on, off)| (on - off) / EVENTS_PER_JOB as f64);
        self.detail(
            &format!("events.{kind}"),
            json!({"jobs_per_burst": k, "rounds": rounds,
                   "on": {"cpu_ms_per_job": cpu[0], "jobs_per_s": rates[0]},
                   "off": {"cpu_ms_per_job": cpu[1], "jobs_per_s": rates[1]},
                   "cpu_ms_per_event": per_event,
                   "lag_ms": summary(&lags)}),
        );
        self.push(
            Figure::new(
                &format!("{prefix}cpu_vs_off"),
                &format!(
                    "ptraind CPU per job, a {kind} stream of its {EVENTS_PER_JOB} events on (median of {} bursts of {k})",
                    cpu[0].len()
                ),
                "ms",
                on_ms,
            )
            // The issue sets no target: the ratio is reported.
            .floor(off_ms, "no stream"),
        );
        self.push(Figure::new(
            &format!("{prefix}cpu_per_event"),
            "  ptraind CPU per event published (on less off, per event)",
            "ms",
            per_event,
        ));
        self.push(Figure::new(
            &format!("{prefix}lag.p50"),
            &format!(
                "{kind} event lag p50, state change to the consumer ({} events)",
                lags.len()
            ),
            "ms",
            percentile(&lags, 0.5),
        ));
        self.push(Figure::new(
            &format!("{prefix}lag.p99"),
            &format!("  event lag p99 ({} events)", lags.len()),
            "ms",
            percentile(&lags, 0.99),
        ));
        drop(tracker);
        let root = d.root.clone();
        drop(d);
        drop(broker);
        let _ = std::fs::remove_dir_all(root);
        let _ = std::fs::remove_dir_all(secrets);
    }
}

/// Writes a root-only secret file.
fn write_secret(path: &std::path::Path, secret: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .expect("the secret's file");
    f.write_all(secret.as_bytes()).unwrap();
}

/// An event's lag: its receipt now less its `time` (when ptraind recorded
/// the state change).
fn lag_ms(body: &[u8]) -> f64 {
    let now = SystemTime::now();
    let event: serde_json::Value = serde_json::from_slice(body).expect("a CloudEvent in JSON");
    let at = event["time"]
        .as_str()
        .and_then(|t| humantime::parse_rfc3339(t).ok())
        .expect("a CloudEvent with its time");
    // A clock step back reads as no lag, not as a failure.
    now.duration_since(at)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// Consumes the bench's topic for good, each partition long-polled by a
/// task of its own, noting each event's lag.
async fn consume_kafka(bootstrap: String, taken: Arc<Mutex<Taken>>) {
    use rskafka::client::partition::{OffsetAt, UnknownTopicHandling};
    let client = rskafka::client::ClientBuilder::new(vec![bootstrap])
        .build()
        .await
        .expect("the consumer's client");
    let topic = client
        .list_topics()
        .await
        .expect("the topics")
        .into_iter()
        .find(|t| t.name == TOPIC)
        .expect("the bench's topic");
    // A JoinSet: when the consumer is aborted its readers go with it.
    let mut readers = tokio::task::JoinSet::new();
    for partition in topic.partitions {
        let pc = client
            .partition_client(TOPIC, partition, UnknownTopicHandling::Retry)
            .await
            .expect("a partition's client");
        let taken = taken.clone();
        readers.spawn(async move {
            // The topic is the bench's own, made empty: from its start.
            let mut offset = pc.get_offset(OffsetAt::Earliest).await.expect("the offset");
            loop {
                // A short wait: tansu answers a fetch when its wait is up,
                // not when the first byte arrives as Kafka does, so a long
                // wait would be counted as the stream's lag.
                let Ok((records, _)) = pc.fetch_records(offset, 1..1_000_000, 20).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                for r in records {
                    offset = offset.max(r.offset + 1);
                    let lag = lag_ms(r.record.value.as_deref().unwrap_or_default());
                    taken.lock().unwrap().lags_ms.push(lag);
                }
            }
        });
    }
    while readers.join_next().await.is_some() {}
}

/// Consumes the bench's queue for good, noting each event's lag: its
/// receipt here less its `time` (when ptraind recorded the state change).
async fn consume(url: String, taken: Arc<Mutex<Taken>>) {
    let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
        .await
        .expect("the consumer's connection");
    let ch = conn.create_channel().await.expect("the consumer's channel");
    ch.basic_qos(1000, BasicQosOptions::default())
        .await
        .expect("basic.qos");
    let mut deliveries = ch
        .basic_consume(
            QUEUE.into(),
            "bench".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("basic.consume");
    while let Some(Ok(delivery)) = deliveries.next().await {
        let lag = lag_ms(&delivery.data);
        taken.lock().unwrap().lags_ms.push(lag);
    }
}
