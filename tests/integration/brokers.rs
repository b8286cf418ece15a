//! Issue 25: every job event on a message bus. Real brokers started by
//! the test on loopback ports of their own (RabbitMQ from Debian's
//! `rabbitmq-server`; tansu, a Kafka-protocol broker from crates.io) and
//! the real ptraind: a consumer reads every event of a pipeline and a
//! sweep as CloudEvents, in order per job and each id once after dedup,
//! through the broker stopped for 30 s mid-run and started again, and
//! ptraind killed with -9 while its events wait, a refused file's event
//! among them; misconfigured channels (an exchange that does not exist or
//! a wrong password, with the broker's words; a topic the cluster does not
//! list, named; a wrong SCRAM password against a tansu reached over TLS
//! that requires a SASL login) are dead letters and hold nothing else up.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use lapin::options::BasicGetOptions;
use serde_json::{json, Value};

use crate::daemon::{text, Opts, TestDaemon, ALICE};
use crate::harness::wait_for;
use crate::notifications::{deliveries, Secrets};
use crate::rabbit::{block_on, Rabbit};
use crate::tansu::Tansu;

const EXCHANGE: &str = "ptrain.events";
const QUEUE: &str = "ptrain-test-events";
const TOPIC: &str = "ptrain.events";
/// The bus channel: every event of a job, and refused files (an event of
/// no job, asked for by name).
const JOBS_AND_REFUSED: &str = "events = [\"jobs\", \"refused\"]";

/// A broker the scenario runs against, as its consumer sees it.
trait Bus {
    fn stop(&mut self);
    fn boot(&mut self);
    /// The channels' config: `bus`, which works, and the misconfigured
    /// ones (each sent only `succeeded`) with words their dead letter
    /// must hold.
    fn channels(&self, secrets: &Secrets) -> (String, Vec<(&'static str, Vec<&'static str>)>);
    /// Every event the consumer reads, in the order the broker keeps them
    /// for one job, each checked for what its transport promises.
    fn take_all(&self) -> Vec<Value>;
}

struct AmqpBus(Rabbit);

fn amqp_channel(
    name: &str,
    port: u16,
    exchange: &str,
    password_file: &Path,
    events: &str,
) -> String {
    format!(
        "[channels.{name}]\nkind = \"amqp\"\nurl = \"amqp://127.0.0.1:{port}/%2f\"\nusername = \"ptrain\"\npassword_file = \"{}\"\nexchange = \"{exchange}\"\n{events}\n",
        password_file.display()
    )
}

impl Bus for AmqpBus {
    fn stop(&mut self) {
        self.0.stop();
    }

    fn boot(&mut self) {
        self.0.boot();
    }

    fn channels(&self, secrets: &Secrets) -> (String, Vec<(&'static str, Vec<&'static str>)>) {
        let rabbit = &self.0;
        let password = secrets.file("rabbit.password", &rabbit.password);
        let wrong = secrets.file("wrong.password", "not-the-password");
        let only_ends = "events = [\"succeeded\"]";
        let config = [
            amqp_channel("bus", rabbit.port, EXCHANGE, &password, JOBS_AND_REFUSED),
            amqp_channel(
                "nowhere",
                rabbit.port,
                "no.such.exchange",
                &password,
                only_ends,
            ),
            amqp_channel("wrongpass", rabbit.port, EXCHANGE, &wrong, only_ends),
        ]
        .concat();
        (
            config,
            vec![
                ("nowhere", vec!["NOT_FOUND", "no.such.exchange"]),
                ("wrongpass", vec!["ACCESS_REFUSED"]),
            ],
        )
    }

    /// Takes every message waiting in the queue (acknowledged as taken):
    /// each persistent, its message id the event's, its routing key
    /// `ptrain.EVENT.OWNER`.
    fn take_all(&self) -> Vec<Value> {
        block_on(async {
            let (_conn, ch) = self.0.channel().await;
            let mut out = Vec::new();
            while let Some(msg) = ch
                .basic_get(QUEUE.into(), BasicGetOptions { no_ack: true })
                .await
                .unwrap()
            {
                let d = &msg.delivery;
                let event: Value = serde_json::from_slice(&d.data).expect("a CloudEvent in JSON");
                let id = d.properties.message_id().as_ref().map(|s| s.to_string());
                assert_eq!(event["id"].as_str(), id.as_deref());
                assert_eq!(d.properties.delivery_mode(), &Some(2), "{event}");
                let word = event["type"]
                    .as_str()
                    .unwrap()
                    .strip_prefix("org.ptrain.job.")
                    .unwrap();
                assert_eq!(d.routing_key.as_str(), format!("ptrain.{word}.{ALICE}"));
                out.push(event);
            }
            out
        })
    }
}

struct KafkaBus(Tansu);

/// The SCRAM user ptraind logs in to tansu as.
const KAFKA_USER: &str = "ptrain";
const KAFKA_PASSWORD: &str = "kafka-scram-secret-77";

fn kafka_channel(
    name: &str,
    bootstrap: &str,
    topic: &str,
    (password_file, ca_file): (&Path, &Path),
    events: &str,
) -> String {
    format!(
        "[channels.{name}]\nkind = \"kafka\"\nbootstrap_servers = [\"{bootstrap}\"]\ntopic = \"{topic}\"\n\
         tls = \"tls\"\nca_file = \"{}\"\n\
         sasl_mechanism = \"scram-sha-512\"\nusername = \"{KAFKA_USER}\"\npassword_file = \"{}\"\n{events}\n",
        ca_file.display(),
        password_file.display()
    )
}

impl Bus for KafkaBus {
    fn stop(&mut self) {
        self.0.stop();
    }

    fn boot(&mut self) {
        self.0.boot();
    }

    fn channels(&self, secrets: &Secrets) -> (String, Vec<(&'static str, Vec<&'static str>)>) {
        let bootstrap = self.0.bootstrap();
        let password = secrets.file("kafka.password", KAFKA_PASSWORD);
        let wrong = secrets.file("wrong.password", "not-the-password");
        let ca = secrets.file(
            "kafka-ca.pem",
            self.0.ca_pem().expect("a broker behind TLS"),
        );
        let only_ends = "events = [\"succeeded\"]";
        let config = [
            kafka_channel("bus", &bootstrap, TOPIC, (&password, &ca), JOBS_AND_REFUSED),
            kafka_channel(
                "nowhere",
                &bootstrap,
                "no.such.topic",
                (&password, &ca),
                only_ends,
            ),
            kafka_channel("wrongpass", &bootstrap, TOPIC, (&wrong, &ca), only_ends),
        ]
        .concat();
        (
            config,
            vec![
                ("nowhere", vec!["no topic", "no.such.topic"]),
                ("wrongpass", vec!["refused the login"]),
            ],
        )
    }

    /// Reads the topic from its start: each record keyed by its job, and
    /// every event of a job in one partition.
    fn take_all(&self) -> Vec<Value> {
        let mut partition_of: HashMap<String, i32> = HashMap::new();
        let mut out = Vec::new();
        for (partition, value, key) in self.0.read_all(TOPIC) {
            let event: Value = serde_json::from_slice(&value).expect("a CloudEvent in JSON");
            let subject = event["subject"].as_str().unwrap().to_owned();
            assert_eq!(key.as_deref(), Some(subject.as_bytes()), "{event}");
            let first = *partition_of.entry(subject.clone()).or_insert(partition);
            assert_eq!(first, partition, "{subject}'s events in two partitions");
            out.push(event);
        }
        out
    }
}

#[test]
fn a_consumer_reads_every_event_once_in_order_through_a_rabbitmq_outage_and_a_kill_9() {
    let rabbit = Rabbit::start("bus");
    rabbit.bind_queue(EXCHANGE, QUEUE, "ptrain.#");
    every_event_once_in_order("bus", AmqpBus(rabbit));
}

#[test]
fn a_consumer_reads_every_event_once_in_order_through_a_kafka_outage_and_a_kill_9() {
    // The broker is reached over TLS only (a private CA, the channels'
    // `ca_file`) and requires a SCRAM login: the working channels log
    // in, and one with a wrong password is a dead letter.
    let tansu = Tansu::start_with_login("kbus", KAFKA_USER, KAFKA_PASSWORD, true);
    tansu.create_topic(TOPIC, 3);
    every_event_once_in_order("kbus", KafkaBus(tansu));
}

fn every_event_once_in_order(test: &str, mut bus: impl Bus) {
    let secrets = Secrets::new(test);
    let (channels, misconfigured) = bus.channels(&secrets);
    let config = format!("[notify]\ninitial_backoff = \"300ms\"\nmax_backoff = \"2s\"\n{channels}");
    let d = TestDaemon::start_with(
        test,
        Opts {
            extra_config: config,
            ..Opts::default()
        },
    );
    let work = d.workdir(ALICE);
    // The later stages and the sweep wait for the gate, so their events
    // happen while the broker is down.
    let gated = |then: &str| {
        format!(
            "while [ ! -e {} ]; do sleep 0.05; done; {then}",
            work.join("gate").display()
        )
    };
    let job = |id: &str, command: String, extra: Value| {
        let mut v =
            json!({"version": 1, "id": id, "command": ["/bin/sh", "-c", command], "workdir": work});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v.to_string()
    };
    d.drop_job(
        ALICE,
        "prep.json",
        &job(
            "prep",
            "printf '{\"rows\": 3}' > $PTRAIN_RESULT_FILE".into(),
            json!({}),
        ),
    );
    d.drop_job(
        ALICE,
        "train.json",
        &job(
            "train",
            gated("echo trained"),
            json!({"gpus": 1, "after_ok": ["prep"]}),
        ),
    );
    d.drop_job(
        ALICE,
        "eval.json",
        &job(
            "eval",
            "echo evaluated".into(),
            json!({"after_ok": ["train"]}),
        ),
    );
    d.drop_job(
        ALICE,
        "grid.json",
        &job(
            "grid",
            gated("echo {lr} {bs}"),
            json!({"sweep": {"lr": [1, 2], "bs": [8, 16]}, "max_parallel": 2}),
        ),
    );
    // A file that is no job: its refusal is an event on the bus too.
    d.drop_job(ALICE, "broken.json", "{\"version\": 1, \"command\": ");
    d.wait_rejected(ALICE, "broken.json");
    let refused_key = wait_for(
        "the refusal's event recorded",
        Duration::from_secs(30),
        || {
            deliveries(&d).into_iter().find_map(|v| {
                let key = v["key"].as_str()?;
                (key.starts_with("refused.") && key.ends_with("-broken.json.bus"))
                    .then(|| key.to_owned())
            })
        },
    );
    // prep's events reach the bus; train is running.
    assert_eq!(d.wait_ended("prep")["status"], "succeeded");
    d.wait_running("train");
    let delivered = |key: &str| {
        deliveries(&d)
            .into_iter()
            .any(|v| v["key"] == key && v["state"] == "delivered")
    };
    wait_for("prep's end on the bus", Duration::from_secs(30), || {
        delivered("prep.succeeded.bus").then_some(())
    });

    // The misconfigured channels: dead letters with the broker's reason.
    // A wrong SCRAM password is known only once the client's own retries
    // give up (half an attempt's time), and an attempt that ran out its
    // time on a loaded host is tried again: allow a few attempts.
    let dead = |key: &str| {
        wait_for(
            &format!("{key} to be dead"),
            Duration::from_secs(90),
            || {
                deliveries(&d)
                    .into_iter()
                    .find(|v| v["key"] == key && v["state"] == "dead")
            },
        )
    };
    let mut attempts_when_dead = HashMap::new();
    for (name, words) in &misconfigured {
        let letter = dead(&format!("prep.succeeded.{name}"));
        attempts_when_dead.insert(*name, letter["attempts"].clone());
        let why = letter["last_error"].as_str().unwrap();
        for word in words {
            assert!(why.contains(word), "{name}: {why}");
        }
        assert!(
            !why.contains("not-the-password"),
            "the password leaked: {why}"
        );
    }

    // The broker goes away for 30 s; the jobs go on.
    bus.stop();
    let down_at = Instant::now();
    std::fs::write(work.join("gate"), "").unwrap();
    let jobs = [
        "prep",
        "train",
        "eval",
        "grid-lr1-bs8",
        "grid-lr1-bs16",
        "grid-lr2-bs8",
        "grid-lr2-bs16",
    ];
    for id in &jobs[1..] {
        assert_eq!(d.wait_ended(id)["status"], "succeeded", "{id}");
    }
    // Their events wait on disk: the backlog shows them.
    let out = d.ptrain("root", &["notifications"]);
    let listing = text(&out);
    let bus_line = listing
        .lines()
        .find(|l| l.starts_with("bus "))
        .unwrap_or_else(|| panic!("no backlog line for bus:\n{listing}"));
    let waiting: usize = bus_line.split_whitespace().nth(1).unwrap().parse().unwrap();
    // At least what happened after the stop: train's end, eval's start and
    // end, the last two members' starts and all four ends.
    assert!(waiting >= 9, "{bus_line}");
    // ptraind is killed while they wait; systemd starts it again.
    let (ok, out) = d
        .harness
        .systemctl(&["kill", "-s", "KILL", "ptraind.service"]);
    assert!(ok, "{out}");
    wait_for("ptraind back", Duration::from_secs(30), || {
        (d.unit_property("ptraind.service", "NRestarts") == "1"
            && d.unit_property("ptraind.service", "ActiveState") == "active")
            .then_some(())
    });
    // The outage itself lasts 30 s (the scenario, not a wait for a state).
    let outage = Duration::from_secs(30);
    std::thread::sleep(outage.saturating_sub(down_at.elapsed()));
    bus.boot();

    let mut expected: HashSet<String> = jobs
        .iter()
        .flat_map(|j| ["submitted", "started", "succeeded"].map(|e| format!("{j}.{e}.bus")))
        .collect();
    expected.insert(refused_key);
    wait_for(
        "every event delivered to the bus",
        Duration::from_secs(60),
        || {
            let all = deliveries(&d);
            expected
                .iter()
                .all(|k| {
                    all.iter()
                        .any(|v| v["key"] == *k && v["state"] == "delivered")
                })
                .then_some(())
        },
    );
    let received = bus.take_all();
    // Dedup by id, keeping first-seen order per job.
    let mut seen = HashSet::new();
    let mut per_job: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for event in &received {
        assert_eq!(event["specversion"], "1.0");
        let id = event["id"].as_str().unwrap().to_owned();
        let word = event["type"]
            .as_str()
            .unwrap()
            .strip_prefix("org.ptrain.job.")
            .unwrap();
        if seen.insert(id) {
            let subject = event["subject"].as_str().unwrap().to_owned();
            per_job.entry(subject).or_default().push(word.to_owned());
        }
    }
    assert_eq!(
        seen, expected,
        "each event once after dedup, and nothing else"
    );
    for j in jobs {
        assert_eq!(
            per_job[j],
            ["submitted", "started", "succeeded"],
            "{j}: out of order"
        );
    }
    assert_eq!(per_job["spool/broken.json"], ["refused"]);
    let prep_end = received
        .iter()
        .find(|e| e["id"] == "prep.succeeded.bus")
        .unwrap();
    assert_eq!(prep_end["data"]["results"]["rows"], 3, "{prep_end}");
    // The misconfigured channels held nothing up and, dead, were tried no
    // more. (Mostly dead at the first attempt; tansu under load may drop
    // a failed login's connection instead of answering, which reads as a
    // network error and is tried again until it answers.)
    let all = deliveries(&d);
    for (name, _) in &misconfigured {
        let key = format!("prep.succeeded.{name}");
        let v = all.iter().find(|v| v["key"] == key).unwrap();
        assert_eq!(v["state"], "dead");
        assert_eq!(v["attempts"], attempts_when_dead[name], "{v}");
    }
    d.assert_alive();
}
