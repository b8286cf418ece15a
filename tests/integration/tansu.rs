//! A Kafka-protocol broker of the test's own: tansu (crates.io's `tansu`,
//! built by `tests/install-deps.sh` with its SQLite storage engine, so
//! what it acknowledged survives its restart as with Apache Kafka) on a
//! loopback port nobody else uses, its data kept across a stop and a start:
//! the Kafka broker of the event-stream test (`brokers.rs`) and of the
//! benchmark's event figures. Topics are made and read with `rskafka`,
//! the client ptraind itself uses.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rskafka::client::partition::{OffsetAt, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};

use crate::rabbit::block_on;

/// Where `tests/install-deps.sh` installs the broker.
pub(crate) const TANSU: &str = "/opt/ptrain-tests/bin/tansu";
/// The broker opens its database and listener in well under a second;
/// a loaded 2-core host may take longer.
const BOOT: Duration = Duration::from_secs(60);
/// How long a stop may take before the broker is killed.
const STOP: Duration = Duration::from_secs(20);
/// How many times a broker that exits while booting is started again (a
/// port another test took in between).
const BOOT_TRIES: usize = 3;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One tansu broker, its SQLite database in `dir` across a stop and a start.
pub(crate) struct Tansu {
    dir: PathBuf,
    pub(crate) port: u16,
    child: Option<Child>,
}

impl Tansu {
    pub(crate) fn start(test: &str) -> Tansu {
        assert!(
            std::path::Path::new(TANSU).exists(),
            "{TANSU} is missing: bash tests/install-deps.sh builds it (cargo install tansu)"
        );
        let dir = PathBuf::from(format!(
            "/srv/ptrain-tests/{test}-tansu-{}",
            std::process::id()
        ));
        let mut tansu = Tansu {
            dir,
            port: 0,
            child: None,
        };
        for attempt in 1..=BOOT_TRIES {
            let _ = std::fs::remove_dir_all(&tansu.dir);
            std::fs::create_dir_all(&tansu.dir).unwrap();
            tansu.port = free_port();
            match tansu.try_boot() {
                Ok(()) => return tansu,
                Err(why) if attempt < BOOT_TRIES => {
                    eprintln!("tansu: first boot {attempt} of {BOOT_TRIES} failed, starting afresh: {why}");
                }
                Err(why) => panic!("{why}"),
            }
        }
        unreachable!("the last try returns or panics")
    }

    /// Starts the broker again on its port and data; returns once it
    /// answers a metadata request.
    pub(crate) fn boot(&mut self) {
        assert!(self.child.is_none(), "already running");
        for attempt in 1..=BOOT_TRIES {
            match self.try_boot() {
                Ok(()) => return,
                Err(why) if attempt < BOOT_TRIES => {
                    eprintln!("tansu: boot {attempt} of {BOOT_TRIES} failed, trying again: {why}");
                }
                Err(why) => panic!("{why}"),
            }
        }
    }

    fn try_boot(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("broker.log"))
            .unwrap();
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let child = Command::new(TANSU)
            .arg("broker")
            .args(["--listener-url", &url])
            .args(["--advertised-listener-url", &url])
            // Relative to its working directory: the test's data dir.
            .args(["--storage-engine", "sqlite://tansu.db"])
            .current_dir(&self.dir)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("start tansu");
        self.child = Some(child);
        let deadline = Instant::now() + BOOT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("tansu exited: {status}\n{}", self.log()));
                }
            }
            if block_on(self.try_client()).is_ok() {
                return Ok(());
            }
            assert!(
                Instant::now() < deadline,
                "tansu answered no metadata request within {BOOT:?}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    async fn try_client(&self) -> Result<Client, rskafka::client::error::Error> {
        ClientBuilder::new(vec![self.bootstrap()])
            .backoff_config(rskafka::BackoffConfig {
                deadline: Some(Duration::from_secs(2)),
                ..Default::default()
            })
            .build()
            .await
    }

    /// A client of the test's own.
    pub(crate) async fn client(&self) -> Client {
        self.try_client()
            .await
            .expect("a client of the running broker")
    }

    /// `host:port`, as a channel's `bootstrap_servers` names it.
    pub(crate) fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Stops the broker (SIGTERM to its process group, SIGKILL past
    /// [`STOP`]) and waits until none of it is left, so its port is free.
    pub(crate) fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let group = child.id() as i32;
        // SAFETY: kill has no memory preconditions; the group is the child's.
        unsafe { libc::kill(-group, libc::SIGTERM) };
        let graceful_until = Instant::now() + STOP;
        loop {
            let _ = child.try_wait();
            // SAFETY: signal 0 only asks whether the group has a member.
            if unsafe { libc::kill(-group, 0) } != 0 {
                break;
            }
            if Instant::now() > graceful_until {
                // SAFETY: as above.
                unsafe { libc::kill(-group, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Makes `topic` with `partitions` partitions.
    pub(crate) fn create_topic(&self, topic: &str, partitions: i32) {
        block_on(async {
            let client = self.client().await;
            client
                .controller_client()
                .unwrap()
                .create_topic(topic, partitions, 1, 10_000)
                .await
                .unwrap_or_else(|e| panic!("create topic {topic}: {e}"));
        });
    }

    /// Every record of `topic`, partition by partition, each partition's
    /// in offset order: (partition, value).
    pub(crate) fn read_all(&self, topic: &str) -> Vec<(i32, Vec<u8>, Option<Vec<u8>>)> {
        block_on(async {
            let client = self.client().await;
            let topics = client.list_topics().await.unwrap();
            let partitions = topics
                .into_iter()
                .find(|t| t.name == topic)
                .unwrap_or_else(|| panic!("no topic {topic}"))
                .partitions;
            let mut out = Vec::new();
            for partition in partitions {
                let pc = client
                    .partition_client(topic, partition, UnknownTopicHandling::Retry)
                    .await
                    .unwrap();
                let end = pc.get_offset(OffsetAt::Latest).await.unwrap();
                let mut offset = pc.get_offset(OffsetAt::Earliest).await.unwrap();
                while offset < end {
                    let (records, _) = pc.fetch_records(offset, 1..1_000_000, 1_000).await.unwrap();
                    if records.is_empty() {
                        break;
                    }
                    for r in records {
                        offset = offset.max(r.offset + 1);
                        out.push((partition, r.record.value.unwrap_or_default(), r.record.key));
                    }
                }
            }
            out
        })
    }

    fn log(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("broker.log")).unwrap_or_default();
        let start = log.len().saturating_sub(8_000);
        let start = (start..log.len())
            .find(|&i| log.is_char_boundary(i))
            .unwrap_or(log.len());
        format!("--- broker.log (its end) ---\n{}", &log[start..])
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        self.stop();
    }
}
