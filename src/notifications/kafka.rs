//! The Kafka edge: every job event a stream channel is sent, produced as a
//! CloudEvent (structured mode: the JSON document is the value, its
//! content type a header) to the admin's topic, keyed by the job id.
//!
//! The key picks the partition the way Kafka's own producers do (murmur2
//! of the key, modulo the topic's partitions), so one job's events land in
//! one partition, in order, next to what other producers key the same way.
//!
//! One client per ptrain channel, made at the first attempt and again
//! after any failure. An attempt sends each partition's share of its batch
//! as one produce request (acks from every in-sync replica, the default of
//! the client) and each event gets that request's verdict:
//! - acknowledged: delivered;
//! - a topic the broker does not have, a topic or cluster the user may not
//!   write, a refused login or an event too large: a dead letter with the
//!   broker's words, since the same request would meet the same answer;
//! - anything else (the broker down, a lost connection, a leader moving):
//!   retried, with the same CloudEvent id. The client has no idempotent
//!   producer (`rskafka` does not implement one), so a request acknowledged
//!   too late for ptraind to hear can be written twice: a consumer that
//!   drops ids it has seen sees each event once.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use rskafka::client::error::{Error as KafkaError, ProtocolError};
use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder, Credentials, SaslConfig};
use rskafka::record::Record;
use rskafka::BackoffConfig;
use tokio::sync::Mutex;

use super::config::{KafkaConfig, KafkaSasl};
use super::render;
use super::retry::Verdict;
use super::transport::{read_secret_file, Redactor, Transport};
use super::Intent;

/// Most events one attempt produces.
const MAX_BATCH: usize = 256;

/// Kafka's answers that the broker would give again to the same request.
const DEFINITE_REFUSALS: [ProtocolError; 7] = [
    ProtocolError::UnknownTopicOrPartition,
    ProtocolError::TopicAuthorizationFailed,
    ProtocolError::ClusterAuthorizationFailed,
    ProtocolError::SaslAuthenticationFailed,
    ProtocolError::MessageTooLarge,
    ProtocolError::RecordListTooLarge,
    ProtocolError::InvalidRecord,
];

/// A ptrain channel's link to its brokers; cheap to clone into an attempt.
#[derive(Clone)]
pub struct Kafka(Arc<Inner>);

struct Inner {
    bootstrap: Vec<String>,
    topic: String,
    tls: Option<Arc<rustls::ClientConfig>>,
    sasl: Option<SaslConfig>,
    attempt_timeout: Duration,
    /// The client and the topic's partitions, once connected.
    link: Arc<Mutex<Option<Link>>>,
    redact: Redactor,
}

struct Link {
    client: Client,
    /// The topic's partition ids, ascending (Kafka's partitioner indexes
    /// them in that order).
    partitions: Vec<i32>,
    /// A client per partition, made at its first event: it knows the
    /// partition's leader, so a produce is one request.
    producers: HashMap<i32, Arc<PartitionClient>>,
}

impl Kafka {
    pub fn new(name: &str, cfg: &KafkaConfig, attempt_timeout: Duration) -> Result<Kafka, String> {
        let mut redact = Redactor::default();
        let sasl = match (&cfg.sasl, &cfg.username, &cfg.password_file) {
            (Some(mechanism), Some(username), Some(path)) => {
                let password = read_secret_file(&format!("channels.{name}.password_file"), path)?;
                redact.add(&password);
                let credentials = Credentials::new(username.clone(), password.expose().to_owned());
                Some(match mechanism {
                    KafkaSasl::Plain => SaslConfig::Plain(credentials),
                    KafkaSasl::ScramSha256 => SaslConfig::ScramSha256(credentials),
                    KafkaSasl::ScramSha512 => SaslConfig::ScramSha512(credentials),
                })
            }
            _ => None,
        };
        let tls = if cfg.tls {
            Some(Arc::new(tls_config(name, cfg.ca_file.as_deref())?))
        } else {
            None
        };
        Ok(Kafka(Arc::new(Inner {
            bootstrap: cfg.bootstrap_servers.clone(),
            topic: cfg.topic.clone(),
            tls,
            sasl,
            attempt_timeout,
            link: Arc::new(Mutex::new(None)),
            redact,
        })))
    }
}

/// TLS to the brokers: the admin's CA file, or the system's roots.
fn tls_config(
    name: &str,
    ca_file: Option<&std::path::Path>,
) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("channels.{name}: TLS: {e}"))?;
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect())
                .map_err(|e| {
                    format!(
                        "channels.{name}.ca_file: cannot read PEM certificates from {}: {e}; point it at a PEM file of CA certificates",
                        path.display()
                    )
                })?;
            if certs.is_empty() {
                return Err(format!(
                    "channels.{name}.ca_file: {} holds no certificate; put the CA's PEM certificate in it",
                    path.display()
                ));
            }
            roots.add_parsable_certificates(certs);
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(format!(
                    "channels.{name}: TLS: the system has no CA certificates; install ca-certificates or set ca_file"
                ));
            }
        }
    }
    Ok(builder.with_root_certificates(roots).with_no_client_auth())
}

/// Kafka's default partitioner: murmur2 (seed 0x9747b28c) of the key, as
/// `org.apache.kafka.common.utils.Utils.murmur2` computes it.
fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let chunks = data.chunks_exact(4);
    let tail = chunks.remainder();
    for chunk in chunks {
        let mut k = u32::from_le_bytes(chunk.try_into().expect("4 bytes"));
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition a job's events go to, among `partitions` (ascending).
fn partition_of(job_id: &str, partitions: &[i32]) -> i32 {
    let positive = (murmur2(job_id.as_bytes()) & 0x7fff_ffff) as usize;
    partitions[positive % partitions.len()]
}

fn record_of(intent: &Intent) -> Record {
    let micros = i64::try_from(intent.created_at).unwrap_or(i64::MAX);
    Record {
        key: Some(intent.notice.job_id.as_bytes().to_vec()),
        value: Some(render::cloudevent_body(intent)),
        headers: BTreeMap::from([(
            "content-type".to_owned(),
            render::CLOUDEVENTS_CONTENT_TYPE.as_bytes().to_vec(),
        )]),
        timestamp: chrono::DateTime::from_timestamp_micros(micros).unwrap_or_default(),
    }
}

/// What a failed Kafka call means for the events it carried: the first
/// definite refusal found in its chain of causes, else a retry.
fn verdict_of(e: &(dyn std::error::Error + 'static), redact: &Redactor) -> Verdict {
    let text = redact.clean(&chain(e));
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cause {
        if let Some(KafkaError::ServerError { protocol_error, .. }) =
            err.downcast_ref::<KafkaError>()
        {
            if DEFINITE_REFUSALS.contains(protocol_error) {
                return Verdict::Dead(format!("the broker refused it: {text}"));
            }
        }
        if err.downcast_ref::<rskafka::SaslError>().is_some() {
            return Verdict::Dead(format!("the broker refused the login: {text}"));
        }
        cause = err.source();
    }
    Verdict::Retry(format!("Kafka: {text}"))
}

/// An error and its causes, as one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(err) = cause {
        let more = err.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = err.source();
    }
    text
}

impl Inner {
    /// Connects and finds the topic's partitions. A topic the brokers do
    /// not list is the admin's to create: ptrain never creates topics (a
    /// broker's auto-creation would pick partitions and retention for it).
    async fn connect(&self) -> Result<Link, Verdict> {
        let mut builder = ClientBuilder::new(self.bootstrap.clone())
            .client_id(concat!("ptraind-", env!("CARGO_PKG_VERSION")))
            // The client's own retries end within half the attempt's time
            // (the sender cancels an attempt at its end), so the error
            // kept is the broker's or the network's, not a timeout.
            .backoff_config(BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(1),
                base: 2.,
                deadline: Some(self.attempt_timeout / 2),
            });
        if let Some(tls) = &self.tls {
            builder = builder.tls_config(tls.clone());
        }
        if let Some(sasl) = &self.sasl {
            builder = builder.sasl_config(sasl.clone());
        }
        let client = builder
            .build()
            .await
            .map_err(|e| verdict_of(&e, &self.redact))?;
        let topics = client
            .list_topics()
            .await
            .map_err(|e| verdict_of(&e, &self.redact))?;
        let Some(topic) = topics.into_iter().find(|t| t.name == self.topic) else {
            return Err(Verdict::Dead(format!(
                "the brokers have no topic {:?}; create it (e.g. kafka-topics.sh --create --topic {}), or name an existing one in topic",
                self.topic, self.topic
            )));
        };
        if topic.partitions.is_empty() {
            return Err(Verdict::Retry(format!(
                "topic {:?} has no partitions yet",
                self.topic
            )));
        }
        Ok(Link {
            client,
            partitions: topic.partitions.into_iter().collect(),
            producers: HashMap::new(),
        })
    }

    /// One attempt: each partition's share of `batch` as one request.
    async fn produce(&self, link: &mut Link, batch: &[Intent]) -> Vec<Verdict> {
        let mut shares: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
        for (i, intent) in batch.iter().enumerate() {
            shares
                .entry(partition_of(&intent.notice.job_id, &link.partitions))
                .or_default()
                .push(i);
        }
        let mut verdicts = vec![Verdict::Delivered; batch.len()];
        for (partition, members) in shares {
            let verdict = match self.producer(link, partition).await {
                Err(e) => verdict_of(&e, &self.redact),
                Ok(producer) => {
                    let records = members.iter().map(|&i| record_of(&batch[i])).collect();
                    match producer.produce(records, Compression::NoCompression).await {
                        Ok(_) => Verdict::Delivered,
                        Err(e) => verdict_of(&e, &self.redact),
                    }
                }
            };
            for i in members {
                verdicts[i] = verdict.clone();
            }
        }
        verdicts
    }

    async fn producer(
        &self,
        link: &mut Link,
        partition: i32,
    ) -> Result<Arc<PartitionClient>, KafkaError> {
        if let Some(made) = link.producers.get(&partition) {
            return Ok(made.clone());
        }
        let made = Arc::new(
            link.client
                .partition_client(self.topic.clone(), partition, UnknownTopicHandling::Error)
                .await?,
        );
        link.producers.insert(partition, made.clone());
        Ok(made)
    }
}

impl Transport for Kafka {
    fn send(&self, batch: Vec<Intent>) -> BoxFuture<'static, Verdict> {
        let each = self.send_each(batch);
        Box::pin(async move {
            each.await
                .into_iter()
                .find(|v| *v != Verdict::Delivered)
                .unwrap_or(Verdict::Delivered)
        })
    }

    fn send_each(&self, batch: Vec<Intent>) -> BoxFuture<'static, Vec<Verdict>> {
        let this = self.0.clone();
        Box::pin(async move {
            // The sender bounds the whole attempt by its timeout.
            let mut link = this.link.lock().await;
            if link.is_none() {
                match this.connect().await {
                    Ok(made) => *link = Some(made),
                    Err(verdict) => return vec![verdict; batch.len()],
                }
            }
            let made = link.as_mut().expect("connected above");
            let verdicts = this.produce(made, &batch).await;
            if verdicts.iter().any(|v| matches!(v, Verdict::Retry(_))) {
                // The client or the partitions may be stale: start clean.
                *link = None;
            }
            verdicts
        })
    }

    fn max_batch(&self) -> usize {
        MAX_BATCH
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notifications::sender::tests::intent;
    use crate::notifications::NotifyEvent;

    #[test]
    fn the_partitioner_is_kafkas_murmur2() {
        // org.apache.kafka.common.utils.UtilsTest#testMurmur2.
        for (key, want) in [
            ("21", -973_932_308),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
            ("a-little-bit-longer-string", -1_486_304_829),
            (
                "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            ("abc", 479_470_107),
        ] {
            assert_eq!(murmur2(key.as_bytes()), want, "{key}");
        }
        // One job, one partition, whatever else is in the batch.
        let partitions = [0, 1, 2, 3, 4, 5];
        let p = partition_of("train-1", &partitions);
        assert!(partitions.contains(&p));
        assert_eq!(partition_of("train-1", &partitions), p);
    }

    #[test]
    fn a_record_is_keyed_by_its_job_and_holds_the_cloudevent() {
        let i = intent("train-1", NotifyEvent::Succeeded, "bus");
        let r = record_of(&i);
        assert_eq!(r.key.as_deref(), Some(i.notice.job_id.as_bytes()));
        let event: serde_json::Value = serde_json::from_slice(r.value.as_ref().unwrap()).unwrap();
        assert_eq!(event["id"], i.key.as_str());
        assert_eq!(event["type"], "org.ptrain.job.succeeded");
        assert_eq!(
            r.headers["content-type"],
            render::CLOUDEVENTS_CONTENT_TYPE.as_bytes()
        );
        assert_eq!(r.timestamp.timestamp_micros() as u64, i.created_at);
    }

    #[test]
    fn refusals_the_broker_would_repeat_are_dead_and_the_rest_retried() {
        let redact = Redactor::default();
        let refused = KafkaError::ServerError {
            protocol_error: ProtocolError::TopicAuthorizationFailed,
            error_message: Some("not yours".into()),
            request: rskafka::client::error::RequestContext::Topic("t".into()),
            response: None,
            is_virtual: false,
        };
        assert!(
            matches!(verdict_of(&refused, &redact), Verdict::Dead(why) if why.contains("not yours"))
        );
        let moving = KafkaError::ServerError {
            protocol_error: ProtocolError::NotLeaderOrFollower,
            error_message: None,
            request: rskafka::client::error::RequestContext::Topic("t".into()),
            response: None,
            is_virtual: false,
        };
        assert!(matches!(verdict_of(&moving, &redact), Verdict::Retry(_)));
        assert!(matches!(
            verdict_of(&KafkaError::Timeout, &redact),
            Verdict::Retry(_)
        ));
    }
}
