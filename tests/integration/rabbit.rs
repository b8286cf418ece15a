//! A RabbitMQ node of the test's own (Debian's `rabbitmq-server`) on
//! loopback ports nobody else uses, its data kept across a stop and a
//! start: the broker of the event-stream test (`brokers.rs`) and of the
//! benchmark's event figures.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties, ExchangeKind};

use crate::harness::wait_for;
use crate::test_server::{boot_with_tries, free_port, stop_group};

const WHAT: &str = "rabbitmq-server";

const RABBITMQ_SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";
/// RabbitMQ takes a few seconds to boot (more on a loaded 2-core host).
const BOOT: Duration = Duration::from_secs(90);
/// How long a stop may take before the node is killed (a loaded host
/// slows the VM's orderly shutdown).
const STOP: Duration = Duration::from_secs(20);

/// One RabbitMQ node, its data kept in `dir` across a stop and a start.
pub(crate) struct Rabbit {
    dir: PathBuf,
    pub(crate) port: u16,
    dist_port: u16,
    node: String,
    pub(crate) password: String,
    child: Option<Child>,
    /// The node's own port mapper on a port of its own: a shared one
    /// that `erl` starts on demand races the node's first registration
    /// on a loaded host, and outlives the test.
    epmd: Option<(Child, u16)>,
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
        let mut rabbit = Rabbit {
            dir,
            port: 0,
            dist_port: 0,
            node: format!("ptrain-{test}-{}@localhost", std::process::id()),
            password: format!("pw-{}", std::process::id()),
            child: None,
            epmd: None,
        };
        // A first boot that fails starts afresh on new ports: one another
        // test took in between is the likeliest cause.
        boot_with_tries(WHAT, |_| {
            rabbit.fresh_node();
            rabbit.try_boot()
        });
        rabbit
    }

    /// An empty data dir and a config on ports nobody uses now.
    fn fresh_node(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        std::fs::create_dir_all(&self.dir).unwrap();
        self.port = free_port();
        self.dist_port = free_port();
        std::fs::write(
            self.dir.join("rabbitmq.conf"),
            format!(
                "listeners.tcp.default = 127.0.0.1:{}\ndefault_user = ptrain\ndefault_pass = {}\n",
                self.port, self.password
            ),
        )
        .unwrap();
        std::fs::write(self.dir.join("enabled_plugins"), "[].\n").unwrap();
    }

    /// Starts the node and returns once it takes logins, trying again
    /// (on the same ports: ptraind's config names them) if it exits
    /// while booting; the last try's failure is the test's, with the
    /// node's words.
    pub(crate) fn boot(&mut self) {
        assert!(self.child.is_none(), "already running");
        boot_with_tries(WHAT, |_| self.try_boot());
    }

    /// Starts the port mapper once, on a port of the node's own, and
    /// returns that port once it answers.
    fn epmd_port(&mut self) -> u16 {
        if let Some((child, port)) = self.epmd.as_mut() {
            if matches!(child.try_wait(), Ok(None)) {
                return *port;
            }
        }
        let port = free_port();
        let child = Command::new("epmd")
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .args(["-port", &port.to_string(), "-address", "127.0.0.1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start epmd (erlang-base)");
        self.epmd = Some((child, port));
        wait_for("epmd to answer", BOOT, || {
            std::net::TcpStream::connect(("127.0.0.1", port))
                .ok()
                .map(|_| ())
        });
        port
    }

    /// One boot: the node's last words if it exits before taking logins.
    fn try_boot(&mut self) -> Result<(), String> {
        let epmd_port = self.epmd_port();
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
            .env("ERL_EPMD_PORT", epmd_port.to_string())
            .env("ERL_CRASH_DUMP", dir.join("erl_crash.dump"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            // Its own process group: a stop reaches the Erlang VM too.
            .process_group(0)
            .spawn()
            .expect("start rabbitmq-server");
        self.child = Some(child);
        let url = self.url("ptrain", &self.password.clone());
        let deadline = Instant::now() + BOOT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!(
                        "rabbitmq-server exited: {status}\n{}",
                        self.last_words()
                    ));
                }
            }
            if block_on(Connection::connect(&url, ConnectionProperties::default())).is_ok() {
                return Ok(());
            }
            assert!(
                Instant::now() < deadline,
                "RabbitMQ took no login within {BOOT:?}\n{}",
                self.last_words()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops the node (SIGTERM to its process group, SIGKILL if it takes
    /// longer than [`STOP`]) and waits until no process of the group is
    /// left, the Erlang VM included, so its port is free.
    pub(crate) fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            stop_group(child, STOP);
        }
    }

    pub(crate) fn url(&self, user: &str, password: &str) -> String {
        format!("amqp://{user}:{password}@127.0.0.1:{}/%2f", self.port)
    }

    /// A channel on a connection of the test's own, as ptrain's user.
    pub(crate) async fn channel(&self) -> (Connection, lapin::Channel) {
        let conn = Connection::connect(
            &self.url("ptrain", &self.password),
            ConnectionProperties::default(),
        )
        .await
        .unwrap();
        let ch = conn.create_channel().await.unwrap();
        (conn, ch)
    }

    /// The node's log, its lines that say what went wrong, and the crash
    /// dump's slogan: last, where a cut test log still shows them.
    fn last_words(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let telling: Vec<&str> = log
            .lines()
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                l.contains("error") || l.contains("failed") || l.contains("terminated")
            })
            .collect();
        let dump = std::fs::read_to_string(self.dir.join("erl_crash.dump")).unwrap_or_default();
        let slogan = dump
            .lines()
            .find(|l| l.starts_with("Slogan:"))
            .unwrap_or("no crash dump");
        format!(
            "--- server.log ---\n{log}\n--- what it said went wrong ---\n{}\n{slogan}",
            telling.join("\n")
        )
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        self.stop();
        if let Some((mut epmd, _)) = self.epmd.take() {
            let _ = epmd.kill();
            let _ = epmd.wait();
        }
    }
}

pub(crate) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

impl Rabbit {
    /// What a consumer of the admin's would set up: a durable topic
    /// exchange and a durable queue bound to it by `pattern`.
    pub(crate) fn bind_queue(&self, exchange: &str, queue: &str, pattern: &str) {
        block_on(async {
            let (_conn, ch) = self.channel().await;
            let durable = ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            };
            ch.exchange_declare(
                exchange.into(),
                ExchangeKind::Topic,
                durable,
                FieldTable::default(),
            )
            .await
            .unwrap();
            let durable_queue = QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            };
            ch.queue_declare(queue.into(), durable_queue, FieldTable::default())
                .await
                .unwrap();
            ch.queue_bind(
                queue.into(),
                exchange.into(),
                pattern.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        });
    }
}
