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
use std::sync::Arc;
use std::time::{Duration, Instant};

use rskafka::client::partition::{OffsetAt, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};

use crate::rabbit::block_on;
use crate::test_server::{boot_with_tries, free_port, stop_group};

const WHAT: &str = "tansu";

/// Where `tests/install-deps.sh` installs the broker.
pub(crate) const TANSU: &str = "/opt/ptrain-tests/bin/tansu";
/// The broker opens its database and listener in well under a second;
/// a loaded 2-core host may take longer.
const BOOT: Duration = Duration::from_secs(60);
/// How long a stop may take before the broker is killed.
const STOP: Duration = Duration::from_secs(20);

/// One tansu broker, its SQLite database in `dir` across a stop and a start.
pub(crate) struct Tansu {
    dir: PathBuf,
    pub(crate) port: u16,
    child: Option<Child>,
    /// Set: the broker requires a SASL login (SCRAM-SHA-512), and the
    /// test's own client logs in as this user.
    login: Option<(String, String)>,
    /// Set: clients reach the broker through TLS only ([`TlsFront`]).
    tls: Option<TlsFront>,
}

/// TLS in front of the broker: tansu 0.6 takes `--cert` but still
/// speaks plain TCP on its listener, so the test ends TLS itself (rustls,
/// a private CA's certificate for 127.0.0.1) on a port of its own and
/// relays each connection to the broker, which advertises that port in
/// its metadata: every connection a client makes, bootstrap or leader,
/// is TLS. It outlives the broker's stops: while the broker is down a
/// client's handshake succeeds and its connection is then closed, as
/// with a broker that is going away.
struct TlsFront {
    port: u16,
    /// The CA's certificate, PEM: a channel's `ca_file`.
    ca_pem: String,
    client: Arc<rustls::ClientConfig>,
    /// Dropped with the front: its runtime, and every relay, end.
    _runtime: tokio::runtime::Runtime,
}

impl TlsFront {
    fn start(broker_port: u16) -> TlsFront {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "ptrain test Kafka CA");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let server_key = rcgen::KeyPair::generate().unwrap();
        let server = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&server_key, &ca_cert, &ca_key)
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into());
        let server_config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![server.der().clone()], key)
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca_cert.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config));
        runtime.spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut broker) =
                        tokio::net::TcpStream::connect(("127.0.0.1", broker_port)).await
                    else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut broker).await;
                });
            }
        });
        TlsFront {
            port,
            ca_pem: ca_cert.pem(),
            client: Arc::new(client),
            _runtime: runtime,
        }
    }
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
            login: None,
            tls: None,
        };
        // A first boot that fails starts afresh on a new port: one another
        // test took in between is the likeliest cause.
        boot_with_tries(WHAT, |_| {
            let _ = std::fs::remove_dir_all(&tansu.dir);
            std::fs::create_dir_all(&tansu.dir).unwrap();
            tansu.port = free_port();
            tansu.try_boot()
        });
        tansu
    }

    /// A broker that requires a SASL login, with one SCRAM-SHA-512 user.
    /// tansu adds users through the Kafka protocol only, so the user is
    /// made while the broker still lets anyone in; it then boots again, on
    /// the same data, with `--authentication`.
    pub(crate) fn start_with_login(test: &str, user: &str, password: &str, tls: bool) -> Tansu {
        let mut tansu = Tansu::start(test);
        let out = Command::new(TANSU)
            .args(["user", "create", user, password, "--mechanism", "scram512"])
            .args(["--broker", &format!("tcp://127.0.0.1:{}", tansu.port)])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .expect("run tansu user create");
        assert!(
            out.status.success(),
            "tansu user create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        tansu.stop();
        tansu.login = Some((user.to_owned(), password.to_owned()));
        if tls {
            tansu.tls = Some(TlsFront::start(tansu.port));
        }
        tansu.boot();
        tansu
    }

    /// The CA certificate (PEM) a client must trust, with TLS.
    pub(crate) fn ca_pem(&self) -> Option<&str> {
        self.tls.as_ref().map(|t| t.ca_pem.as_str())
    }

    /// Starts the broker again on its port and data; returns once it
    /// answers a metadata request.
    pub(crate) fn boot(&mut self) {
        assert!(self.child.is_none(), "already running");
        boot_with_tries(WHAT, |_| self.try_boot());
    }

    fn try_boot(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("broker.log"))
            .unwrap();
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let advertised = format!("tcp://{}", self.bootstrap());
        let child = Command::new(TANSU)
            .arg("broker")
            .args(["--listener-url", &url])
            .args(["--advertised-listener-url", &advertised])
            // Relative to its working directory: the test's data dir.
            .args(["--storage-engine", "sqlite://tansu.db"])
            .args(self.login.as_ref().map(|_| "--authentication"))
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
        let mut builder =
            ClientBuilder::new(vec![self.bootstrap()]).backoff_config(rskafka::BackoffConfig {
                deadline: Some(Duration::from_secs(2)),
                ..Default::default()
            });
        if let Some(tls) = &self.tls {
            builder = builder.tls_config(tls.client.clone());
        }
        if let Some((user, password)) = &self.login {
            builder = builder.sasl_config(rskafka::client::SaslConfig::ScramSha512(
                rskafka::client::Credentials::new(user.clone(), password.clone()),
            ));
        }
        builder.build().await
    }

    /// A client of the test's own.
    pub(crate) async fn client(&self) -> Client {
        self.try_client()
            .await
            .expect("a client of the running broker")
    }

    /// `host:port`, as a channel's `bootstrap_servers` names it.
    pub(crate) fn bootstrap(&self) -> String {
        let port = self.tls.as_ref().map_or(self.port, |t| t.port);
        format!("127.0.0.1:{port}")
    }

    /// Stops the broker (SIGTERM to its process group, SIGKILL past
    /// [`STOP`]) and waits until none of it is left, so its port is free.
    pub(crate) fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            stop_group(child, STOP);
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
