//! Issue 25: every job event on a message bus. A real RabbitMQ (Debian's
//! `rabbitmq-server`, started by the test on loopback ports of its own)
//! and the real ptraind: a consumer reads every event of a pipeline and a
//! sweep as CloudEvents, in order per job and each id once after dedup,
//! through the broker stopped for 30 s mid-run and started again, and
//! ptraind killed with -9 while its events wait; two misconfigured
//! channels (an exchange that does not exist, a wrong password) are dead
//! letters with the broker's words and hold nothing else up.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use serde_json::{json, Value};

use crate::daemon::{text, Opts, TestDaemon, ALICE};
use crate::harness::wait_for;
use crate::notifications::{deliveries, Secrets};

const RABBITMQ_SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";
const EXCHANGE: &str = "ptrain.events";
const QUEUE: &str = "ptrain-test-events";
/// RabbitMQ takes a few seconds to boot (more on a loaded 2-core host).
const BOOT: Duration = Duration::from_secs(90);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One RabbitMQ node, its data kept in `dir` across a stop and a start.
pub(crate) struct Rabbit {
    dir: PathBuf,
    pub(crate) port: u16,
    dist_port: u16,
    node: String,
    pub(crate) password: String,
    child: Option<Child>,
}

impl Rabbit {
    pub(crate) fn start(test: &str) -> Rabbit {
        assert!(
            std::path::Path::new(RABBITMQ_SERVER).exists(),
            "{RABBITMQ_SERVER} is missing: apt-get install rabbitmq-server (tests/install-deps.sh does)"
        );
        let dir = PathBuf::from(format!(
            "/srv/ptrain-tests/{test}-rabbit-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let password = format!("pw-{}-{}", std::process::id(), port);
        std::fs::write(
            dir.join("rabbitmq.conf"),
            format!(
                "listeners.tcp.default = 127.0.0.1:{port}\ndefault_user = ptrain\ndefault_pass = {password}\n"
            ),
        )
        .unwrap();
        std::fs::write(dir.join("enabled_plugins"), "[].\n").unwrap();
        let mut rabbit = Rabbit {
            dir,
            port,
            dist_port: free_port(),
            node: format!("ptrain-{test}-{}@localhost", std::process::id()),
            password,
            child: None,
        };
        rabbit.boot();
        rabbit
    }

    /// Starts the node and returns once it takes logins.
    pub(crate) fn boot(&mut self) {
        assert!(self.child.is_none(), "already running");
        let dir = &self.dir;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("server.log"))
            .unwrap();
        let child = Command::new(RABBITMQ_SERVER)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("HOME", dir)
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq.conf"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_LOGS", "-")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            // Its own process group: a stop reaches the Erlang VM too.
            .process_group(0)
            .spawn()
            .expect("start rabbitmq-server");
        self.child = Some(child);
        let url = self.url("ptrain", &self.password.clone());
        wait_for("RabbitMQ to take logins", BOOT, || {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("rabbitmq-server exited: {status}\n{}", self.log());
                }
            }
            block_on(Connection::connect(&url, ConnectionProperties::default()))
                .ok()
                .map(|_| ())
        });
    }

    /// Stops the node (SIGTERM to its process group) and waits for it.
    pub(crate) fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: kill has no memory preconditions; the group is the child's.
        unsafe { libc::kill(-(child.id() as i32), libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                // SAFETY: as above.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The VM may outlive the script by a moment: wait for the port.
        wait_for("RabbitMQ's port to close", Duration::from_secs(60), || {
            std::net::TcpStream::connect(("127.0.0.1", self.port))
                .is_err()
                .then_some(())
        });
    }

    pub(crate) fn url(&self, user: &str, password: &str) -> String {
        format!("amqp://{user}:{password}@127.0.0.1:{}/%2f", self.port)
    }

    /// A channel on a connection of the test's own, as ptrain's user.
    async fn channel(&self) -> (Connection, lapin::Channel) {
        let conn = Connection::connect(
            &self.url("ptrain", &self.password),
            ConnectionProperties::default(),
        )
        .await
        .unwrap();
        let ch = conn.create_channel().await.unwrap();
        (conn, ch)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        self.stop();
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// What a consumer of the admin's would set up: a durable topic exchange
/// and a durable queue bound to every ptrain event.
fn declare_topology(rabbit: &Rabbit) {
    block_on(async {
        let (_conn, ch) = rabbit.channel().await;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        ch.exchange_declare(
            EXCHANGE.into(),
            ExchangeKind::Topic,
            durable,
            FieldTable::default(),
        )
        .await
        .unwrap();
        let queue = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        ch.queue_declare(QUEUE.into(), queue, FieldTable::default())
            .await
            .unwrap();
        ch.queue_bind(
            QUEUE.into(),
            EXCHANGE.into(),
            "ptrain.#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    });
}

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
    declare_topology(&rabbit);
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
