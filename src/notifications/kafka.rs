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
//! in produce requests of at most 512 KiB (acks from every in-sync
//! replica, the client's setting) and each event gets its request's
//! verdict:
//! - acknowledged: delivered;
//! - a topic the cluster does not list, a topic or cluster the user may not
//!   write, a refused login or an event too large on its own: a dead letter
//!   with the broker's words, since the same request would meet the same
//!   answer;
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
use super::transport::{first_failure, read_secret_file, Redactor, Transport};
use super::Intent;

/// Most events one attempt produces.
const MAX_BATCH: usize = 256;

/// Kafka's answers that the broker would give again to the same request.
/// (`UnknownTopicOrPartition` is not one: brokers give it while their
/// metadata lags, and Java's producer retries it; a topic the cluster does
/// not list at all is refused when the link is made.)
const DEFINITE_REFUSALS: [ProtocolError; 10] = [
    ProtocolError::TopicAuthorizationFailed,
    ProtocolError::ClusterAuthorizationFailed,
    ProtocolError::MessageTooLarge,
    ProtocolError::RecordListTooLarge,
    ProtocolError::InvalidRecord,
    ProtocolError::InvalidTopicException,
    ProtocolError::InvalidRequiredAcks,
    ProtocolError::InvalidTimestamp,
    ProtocolError::UnsupportedForMessageFormat,
    ProtocolError::PolicyViolation,
];

/// Answers about a produce request's whole record batch: a batch of more
/// than one record that gets one is tried again record by record, so only
/// the record at fault is refused.
const BATCH_REFUSALS: [ProtocolError; 3] = [
    ProtocolError::MessageTooLarge,
    ProtocolError::RecordListTooLarge,
    ProtocolError::InvalidRecord,
];

/// Most bytes of records one produce request carries, under Kafka's
/// default `message.max.bytes` (1 MiB) with room for the batch's framing.
const MAX_REQUEST_BYTES: usize = 512 * 1024;

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
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(format!(
                    "channels.{name}.ca_file: {} holds no usable certificate; put the CA's PEM certificate in it",
                    path.display()
                ));
            }
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

/// A SCRAM server's final answers that are no verdict on the login.
const SCRAM_PASSING_OUTCOMES: [&str; 2] = ["no resources", "other error"];

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
        if let Some(sasl) = err.downcast_ref::<rskafka::SaslError>() {
            // A lost connection mid-handshake is not a refusal.
            if matches!(
                sasl,
                rskafka::SaslError::ApiError(_)
                    | rskafka::SaslError::UnsupportedSaslMechanism
                    | rskafka::SaslError::InvalidConfig(_)
                    | rskafka::SaslError::InvalidSaslMechanism(_)
            ) {
                return Verdict::Dead(format!("the broker refused the login: {text}"));
            }
        }
        cause = err.source();
    }
    // rskafka folds the bootstrap brokers' errors into one message without
    // a source: a refused login is then known by its words only. A SCRAM
    // server refuses a wrong password or user in its final message (RFC
    // 5802's `e=`), which the SASL library words as an outcome error; of
    // those, only a server short of resources or failing otherwise may
    // answer differently next time.
    if let Some((_, outcome)) = text.split_once("SCRAM outcome error: ") {
        if !SCRAM_PASSING_OUTCOMES
            .iter()
            .any(|o| outcome.starts_with(o))
        {
            return Verdict::Dead(format!("the broker refused the login: {text}"));
        }
    }
    if text.contains("Sasl handshake failed: API error")
        || text.contains("Sasl handshake failed: unsupported sasl mechanism")
    {
        return Verdict::Dead(format!("the broker refused the login: {text}"));
    }
    Verdict::Retry(format!("Kafka: {text}"))
}

/// Whether `verdict` came of an answer about a whole record batch.
fn refused_the_batch(e: &KafkaError) -> bool {
    matches!(e, KafkaError::ServerError { protocol_error, .. } if BATCH_REFUSALS.contains(protocol_error))
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
            // The client's own retries sleep at most half the attempt's
            // time per call (the sender cancels an attempt at its end), so
            // the error kept is mostly the broker's or the network's.
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

    /// One attempt: each partition's share of `batch` in requests of at
    /// most [`MAX_REQUEST_BYTES`], the partitions side by side.
    async fn produce(&self, link: &mut Link, batch: &[Intent]) -> Vec<Verdict> {
        let mut shares: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
        for (i, intent) in batch.iter().enumerate() {
            shares
                .entry(partition_of(&intent.notice.job_id, &link.partitions))
                .or_default()
                .push(i);
        }
        let mut verdicts = vec![Verdict::Delivered; batch.len()];
        let mut sends = Vec::new();
        for (partition, members) in shares {
            match self.producer(link, partition).await {
                Err(e) => {
                    let verdict = verdict_of(&e, &self.redact);
                    for i in members {
                        verdicts[i] = verdict.clone();
                    }
                }
                Ok(producer) => sends.push(self.produce_share(producer, batch, members)),
            }
        }
        for share in futures_util::future::join_all(sends).await {
            for (i, verdict) in share {
                verdicts[i] = verdict;
            }
        }
        verdicts
    }

    /// One partition's events, in order, each with its verdict. After a
    /// failed request the rest of the share waits too (they may be later
    /// events of the same jobs' partition).
    async fn produce_share(
        &self,
        producer: Arc<PartitionClient>,
        batch: &[Intent],
        members: Vec<usize>,
    ) -> Vec<(usize, Verdict)> {
        let mut out = Vec::with_capacity(members.len());
        let mut request: Vec<(usize, Record)> = Vec::new();
        let mut bytes = 0;
        let mut failed: Option<Verdict> = None;
        let mut pending = members.into_iter().peekable();
        while let Some(i) = pending.next() {
            let record = record_of(&batch[i]);
            bytes += record.approximate_size();
            request.push((i, record));
            let full = pending
                .peek()
                .is_none_or(|_| bytes >= MAX_REQUEST_BYTES || request.len() >= MAX_BATCH);
            if !full {
                continue;
            }
            let sent = std::mem::take(&mut request);
            bytes = 0;
            if let Some(verdict) = &failed {
                out.extend(sent.into_iter().map(|(i, _)| (i, verdict.clone())));
                continue;
            }
            let ids: Vec<usize> = sent.iter().map(|(i, _)| *i).collect();
            let records: Vec<Record> = sent.into_iter().map(|(_, r)| r).collect();
            match producer.produce(records, Compression::NoCompression).await {
                Ok(_) => out.extend(ids.into_iter().map(|i| (i, Verdict::Delivered))),
                Err(e) if ids.len() > 1 && refused_the_batch(&e) => {
                    // Record by record: only the one at fault is refused.
                    for i in ids {
                        let verdict = match &failed {
                            Some(v) => v.clone(),
                            None => match producer
                                .produce(vec![record_of(&batch[i])], Compression::NoCompression)
                                .await
                            {
                                Ok(_) => Verdict::Delivered,
                                Err(e) => {
                                    let v = verdict_of(&e, &self.redact);
                                    if matches!(v, Verdict::Retry(_)) {
                                        failed = Some(v.clone());
                                    }
                                    v
                                }
                            },
                        };
                        out.push((i, verdict));
                    }
                }
                Err(e) => {
                    let verdict = verdict_of(&e, &self.redact);
                    if matches!(verdict, Verdict::Retry(_)) {
                        failed = Some(verdict.clone());
                    }
                    out.extend(ids.into_iter().map(|i| (i, verdict.clone())));
                }
            }
        }
        out
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
        first_failure(self.send_each(batch))
    }

    fn send_each(&self, batch: Vec<Intent>) -> BoxFuture<'static, Vec<Verdict>> {
        let this = self.0.clone();
        Box::pin(async move {
            // The sender bounds the whole attempt by its timeout. The link
            // is taken for the attempt and put back only after one that
            // completed without a retry: a cancelled attempt (a broker
            // that stopped answering) leaves none to reuse.
            let mut slot = this.link.lock().await;
            let mut link = match slot.take() {
                Some(link) => link,
                None => match this.connect().await {
                    Ok(made) => made,
                    Err(verdict) => return vec![verdict; batch.len()],
                },
            };
            let verdicts = this.produce(&mut link, &batch).await;
            if !verdicts.iter().any(|v| matches!(v, Verdict::Retry(_))) {
                *slot = Some(link);
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
        // Kafka's toPositive(murmur2(key)) % n, over the partitions in order.
        assert_eq!(
            partition_of("21", &[0, 1, 2]),
            (-973_932_308i32 & 0x7fff_ffff) % 3
        );
        assert_eq!(partition_of("abc", &[10, 11, 12, 13]), 10 + 479_470_107 % 4);
        // And jobs spread over every partition.
        let partitions = [0, 1, 2, 3, 4, 5];
        let used: std::collections::BTreeSet<i32> = (0..100)
            .map(|n| partition_of(&format!("job-{n}"), &partitions))
            .collect();
        assert_eq!(used.len(), partitions.len(), "{used:?}");
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
        // A wrong SCRAM password, as rskafka folds it (the words tansu's
        // refusal gave in `brokers::…kafka…`): dead; a server short of
        // resources: retried.
        let folded = |outcome: &str| {
            std::io::Error::other(format!(
                "Connection error: all retries failed: Retry exceeded deadline. Source: Sasl \
                 handshake failed: Sasl session error: internal mechanism error: SCRAM outcome \
                 error: {outcome}"
            ))
        };
        for outcome in ["invalid proof", "unknown user"] {
            assert!(
                matches!(verdict_of(&folded(outcome), &redact), Verdict::Dead(why) if why.contains("refused the login")),
                "{outcome}"
            );
        }
        assert!(matches!(
            verdict_of(&folded("no resources"), &redact),
            Verdict::Retry(_)
        ));
    }
}
