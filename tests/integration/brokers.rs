//! Issue 25: every job event on a message bus. A real RabbitMQ (Debian's
//! `rabbitmq-server`, started by the test on loopback ports of its own)
//! and the real ptraind: a consumer reads every event of a pipeline and a
//! sweep as CloudEvents, in order per job and each id once after dedup,
//! through the broker stopped for 30 s mid-run and started again, and
//! ptraind killed with -9 while its events wait; two misconfigured
//! channels (an exchange that does not exist, a wrong password) are dead
//! letters with the broker's words and hold nothing else up.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use lapin::options::BasicGetOptions;
use serde_json::{json, Value};

use crate::daemon::{text, Opts, TestDaemon, ALICE};
use crate::harness::wait_for;
use crate::notifications::{deliveries, Secrets};
use crate::rabbit::{block_on, Rabbit};

const EXCHANGE: &str = "ptrain.events";
const QUEUE: &str = "ptrain-test-events";

/// One message as the consumer got it.
struct Received {
    message_id: String,
    routing_key: String,
    persistent: bool,
    event: Value,
}

/// Takes every message waiting in the queue (acknowledged as taken).
fn take_all(rabbit: &Rabbit) -> Vec<Received> {
    block_on(async {
        let (_conn, ch) = rabbit.channel().await;
        let mut out = Vec::new();
        while let Some(msg) = ch
            .basic_get(QUEUE.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            let d = &msg.delivery;
            out.push(Received {
                message_id: d
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
                routing_key: d.routing_key.to_string(),
                persistent: d.properties.delivery_mode() == &Some(2),
                event: serde_json::from_slice(&d.data).expect("a CloudEvent in JSON"),
            });
        }
        out
    })
}

fn channel_toml(
    name: &str,
    port: u16,
    exchange: &str,
    password_file: &std::path::Path,
    events: &str,
) -> String {
    format!(
        "[channels.{name}]\nkind = \"amqp\"\nurl = \"amqp://127.0.0.1:{port}/%2f\"\nusername = \"ptrain\"\npassword_file = \"{}\"\nexchange = \"{exchange}\"\n{events}\n",
        password_file.display()
    )
}

#[test]
fn a_consumer_reads_every_event_once_in_order_through_a_broker_outage_and_a_kill_9() {
    let mut rabbit = Rabbit::start("bus");
    rabbit.bind_queue(EXCHANGE, QUEUE, "ptrain.#");
    let secrets = Secrets::new("bus");
    let password = secrets.file("rabbit.password", &rabbit.password);
    let wrong = secrets.file("wrong.password", "not-the-password");
    let config = format!(
        "[notify]\ninitial_backoff = \"300ms\"\nmax_backoff = \"2s\"\n{}{}{}",
        channel_toml("bus", rabbit.port, EXCHANGE, &password, ""),
        channel_toml(
            "nowhere",
            rabbit.port,
            "no.such.exchange",
            &password,
            "events = [\"succeeded\"]"
        ),
        channel_toml(
            "wrongpass",
            rabbit.port,
            EXCHANGE,
            &wrong,
            "events = [\"succeeded\"]"
        ),
    );
    let d = TestDaemon::start_with(
        "bus",
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
    let dead = |key: &str| {
        wait_for(
            &format!("{key} to be dead"),
            Duration::from_secs(30),
            || {
                deliveries(&d)
                    .into_iter()
                    .find(|v| v["key"] == key && v["state"] == "dead")
            },
        )
    };
    let nowhere = dead("prep.succeeded.nowhere");
    let why = nowhere["last_error"].as_str().unwrap();
    assert!(
        why.contains("NOT_FOUND") && why.contains("no.such.exchange"),
        "{why}"
    );
    let refused = dead("prep.succeeded.wrongpass");
    let why = refused["last_error"].as_str().unwrap();
    assert!(
        why.contains("ACCESS_REFUSED") || why.contains("403"),
        "{why}"
    );
    assert!(
        !why.contains("not-the-password"),
        "the password leaked: {why}"
    );

    // The broker goes away for 30 s; the jobs go on.
    rabbit.stop();
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
    rabbit.boot();

    let expected: HashSet<String> = jobs
        .iter()
        .flat_map(|j| ["submitted", "started", "succeeded"].map(|e| format!("{j}.{e}.bus")))
        .collect();
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
    let received = take_all(&rabbit);
    // Dedup by id, keeping first-seen order per job.
    let mut seen = HashSet::new();
    let mut per_job: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in &received {
        assert_eq!(r.event["id"], r.message_id.as_str());
        assert_eq!(r.event["specversion"], "1.0");
        assert!(r.persistent, "{}", r.message_id);
        let kind = r.event["type"].as_str().unwrap();
        let word = kind.strip_prefix("org.ptrain.job.").unwrap();
        assert_eq!(r.routing_key, format!("ptrain.{word}.{ALICE}"));
        if seen.insert(r.message_id.clone()) {
            let subject = r.event["subject"].as_str().unwrap().to_owned();
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
    let prep_end = received
        .iter()
        .find(|r| r.message_id == "prep.succeeded.bus")
        .unwrap();
    assert_eq!(
        prep_end.event["data"]["results"]["rows"], 3,
        "{}",
        prep_end.event
    );
    // The misconfigured channels held nothing up and were tried no more.
    let all = deliveries(&d);
    for key in ["prep.succeeded.nowhere", "prep.succeeded.wrongpass"] {
        let v = all.iter().find(|v| v["key"] == key).unwrap();
        assert_eq!(v["state"], "dead");
        assert_eq!(v["attempts"], 1, "{v}");
    }
    d.assert_alive();
}
