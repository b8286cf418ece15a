//! The AMQP 0-9-1 edge (RabbitMQ): every job event a stream channel is
//! sent, published as a CloudEvent to the admin's exchange with routing key
//! `ptrain.EVENT.OWNER`, persistent, mandatory, under publisher confirms.
//!
//! One connection and one confirm-mode channel per ptrain channel, opened
//! at the first attempt and again after any failure. An attempt publishes
//! its batch in order and then waits for the broker's confirms, so each
//! event gets its own verdict:
//! - confirmed: delivered (the broker holds it, on disk for a durable queue);
//! - returned as unroutable, or refused (an exchange that does not exist, a
//!   user the broker refuses): a dead letter with the broker's words, since
//!   the same message would meet the same answer;
//! - anything else (the broker down, a lost connection, a nack): retried,
//!   with the same `message_id`, so a consumer that drops ids it has seen
//!   sees each event once.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::tcp::OwnedTLSConfig;
use lapin::types::FieldTable;
use lapin::uri::AMQPUri;
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind};
use tokio::sync::Mutex;

use super::config::AmqpConfig;
use super::render;
use super::retry::Verdict;
use super::transport::{first_failure, read_secret_file, Redactor, Transport};
use super::Intent;

/// Most events one attempt publishes before it waits for their confirms.
const MAX_BATCH: usize = 256;

/// AMQP reply codes that mean the broker will answer the same again:
/// content too large, no route, access refused, not found, precondition
/// failed, not allowed.
const DEFINITE_REFUSALS: [u16; 6] = [311, 312, 403, 404, 406, 530];

pub struct Amqp {
    uri: AMQPUri,
    tls: OwnedTLSConfig,
    exchange: String,
    /// The open connection and its confirm-mode channel, if any.
    link: Arc<Mutex<Option<(Connection, Channel)>>>,
    redact: Redactor,
}

/// The routing key of an event: `ptrain.EVENT.OWNER`, so a consumer binds
/// `ptrain.#`, `ptrain.failed.*` or `ptrain.*.alice`.
pub fn routing_key(intent: &Intent) -> String {
    format!(
        "ptrain.{}.{}",
        intent.notice.event.as_str(),
        intent.notice.owner
    )
}

impl Amqp {
    pub fn new(name: &str, cfg: &AmqpConfig, attempt_timeout: Duration) -> Result<Amqp, String> {
        let mut uri: AMQPUri = cfg
            .url
            .parse()
            .map_err(|e| format!("channels.{name}.url: {e}"))?;
        let mut redact = Redactor::default();
        if let (Some(user), Some(path)) = (&cfg.username, &cfg.password_file) {
            let password = read_secret_file(&format!("channels.{name}.password_file"), path)?;
            redact.add(&password);
            uri.authority.userinfo.username.clone_from(user);
            uri.authority.userinfo.password = password.expose().to_owned();
        }
        // A broker that stops answering is found by its heartbeats.
        let heartbeat = attempt_timeout.as_secs().clamp(2, 60) as u16;
        uri.query.heartbeat.get_or_insert(heartbeat);
        uri.query
            .connection_timeout
            .get_or_insert(attempt_timeout.as_millis() as u64);
        let cert_chain = match &cfg.ca_file {
            None => None,
            Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
                format!(
                    "channels.{name}.ca_file: cannot read {}: {e}; point it at a PEM file of CA certificates",
                    path.display()
                )
            })?),
        };
        Ok(Amqp {
            uri,
            tls: OwnedTLSConfig {
                identity: None,
                cert_chain,
            },
            exchange: cfg.exchange.clone(),
            link: Arc::new(Mutex::new(None)),
            redact,
        })
    }
}

/// What a failed AMQP call means for the events it carried.
fn verdict_of(e: &lapin::Error, redact: &Redactor) -> Verdict {
    let text = redact.clean(&e.to_string());
    match e.kind() {
        ErrorKind::ProtocolError(amqp) if DEFINITE_REFUSALS.contains(&amqp.get_id()) => {
            Verdict::Dead(format!("the broker refused it: {text}"))
        }
        _ => Verdict::Retry(format!("AMQP: {text}")),
    }
}

/// Opens a confirm-mode channel and checks that the exchange exists (a
/// passive declare: ptrain never creates or changes the admin's topology).
async fn open(
    uri: AMQPUri,
    tls: OwnedTLSConfig,
    exchange: &str,
) -> Result<(Connection, Channel), lapin::Error> {
    let runtime = lapin::runtime::default_runtime()?;
    let properties = ConnectionProperties::default()
        .with_connection_name(concat!("ptraind ", env!("CARGO_PKG_VERSION")).into());
    let connection = Connection::connect_uri_with_config(uri, properties, tls, runtime).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    channel
        .exchange_declare(
            exchange.into(),
            lapin::ExchangeKind::Topic,
            ExchangeDeclareOptions {
                passive: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    Ok((connection, channel))
}

fn properties_of(intent: &Intent) -> BasicProperties {
    let event = render::cloudevent(intent);
    BasicProperties::default()
        .with_content_type(render::CLOUDEVENTS_CONTENT_TYPE.into())
        // Persistent: a durable queue keeps it across a broker restart.
        .with_delivery_mode(2)
        .with_message_id(intent.key.as_str().into())
        .with_timestamp(intent.created_at / 1_000_000)
        .with_app_id("ptrain".into())
        .with_type(event.kind.as_str().into())
}

async fn publish_all(
    channel: &Channel,
    exchange: &str,
    batch: &[Intent],
    redact: &Redactor,
) -> Vec<Verdict> {
    let mut confirms = Vec::with_capacity(batch.len());
    for intent in batch {
        let published = channel
            .basic_publish(
                exchange.into(),
                routing_key(intent).as_str().into(),
                BasicPublishOptions {
                    // Returned, not dropped, when no queue is bound for it.
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &render::cloudevent_body(intent),
                properties_of(intent),
            )
            .await;
        match published {
            Ok(confirm) => confirms.push(Ok(confirm)),
            // The channel is gone: this and the rest wait for the next link.
            Err(e) => {
                let failed = verdict_of(&e, redact);
                while confirms.len() < batch.len() {
                    confirms.push(Err(failed.clone()));
                }
                break;
            }
        }
    }
    let mut verdicts = Vec::with_capacity(batch.len());
    for confirm in confirms {
        verdicts.push(match confirm {
            Err(v) => v,
            Ok(confirm) => match confirm.await {
                Ok(Confirmation::Ack(None)) => Verdict::Delivered,
                Ok(Confirmation::Ack(Some(returned))) | Ok(Confirmation::Nack(Some(returned))) => {
                    Verdict::Dead(format!(
                        "the broker returned it: {} {}; bind a queue to exchange {exchange} for its routing key (ptrain.EVENT.OWNER)",
                        returned.reply_code,
                        returned.reply_text.as_str()
                    ))
                }
                Ok(Confirmation::Nack(None)) => {
                    Verdict::Retry("the broker could not take it (a nack)".into())
                }
                Ok(Confirmation::NotRequested) => {
                    Verdict::Retry("the channel lost confirm mode; reconnecting".into())
                }
                Err(e) => verdict_of(&e, redact),
            },
        });
    }
    verdicts
}

impl Transport for Amqp {
    fn send(&self, batch: Vec<Intent>) -> BoxFuture<'static, Verdict> {
        first_failure(self.send_each(batch))
    }

    fn send_each(&self, batch: Vec<Intent>) -> BoxFuture<'static, Vec<Verdict>> {
        let link = self.link.clone();
        let uri = self.uri.clone();
        let tls = self.tls.clone();
        let exchange = self.exchange.clone();
        let redact = self.redact.clone();
        Box::pin(async move {
            let mut link = link.lock().await;
            if link
                .as_ref()
                .is_some_and(|(conn, c)| !conn.status().connected() || !c.status().connected())
            {
                *link = None;
            }
            if link.is_none() {
                match open(uri, tls, &exchange).await {
                    Ok(opened) => *link = Some(opened),
                    Err(e) => return vec![verdict_of(&e, &redact); batch.len()],
                }
            }
            let (_, channel) = link.as_ref().expect("opened above");
            let verdicts = publish_all(channel, &exchange, &batch, &redact).await;
            if verdicts.iter().any(|v| matches!(v, Verdict::Retry(_))) {
                // The link may be at fault: the next attempt starts clean.
                // (A returned message leaves the channel as it was.)
                if let Some((connection, _)) = link.take() {
                    let _ = connection.close(200, "ptraind reconnects".into()).await;
                }
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
    fn the_routing_key_is_event_then_owner() {
        let i = intent("train-1", NotifyEvent::IdleTimeout, "bus");
        assert_eq!(
            routing_key(&i),
            format!("ptrain.idle-timeout.{}", i.notice.owner)
        );
    }

    #[test]
    fn refusals_the_broker_would_repeat_are_dead_and_the_rest_retried() {
        let redact = Redactor::default();
        let refused = lapin::Error::from(ErrorKind::ProtocolError(
            lapin::protocol::AMQPError::from_id(404, "NOT_FOUND - no exchange 'x'".into()).unwrap(),
        ));
        assert!(
            matches!(verdict_of(&refused, &redact), Verdict::Dead(why) if why.contains("no exchange 'x'"))
        );
        let busy = lapin::Error::from(ErrorKind::ProtocolError(
            lapin::protocol::AMQPError::from_id(320, "CONNECTION_FORCED - shutdown".into())
                .unwrap(),
        ));
        assert!(matches!(verdict_of(&busy, &redact), Verdict::Retry(_)));
        let io = lapin::Error::from(ErrorKind::IOError(Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        ))));
        assert!(matches!(verdict_of(&io, &redact), Verdict::Retry(_)));
    }

    #[test]
    fn every_message_names_its_event_and_is_persistent() {
        let i = intent("train-1", NotifyEvent::Succeeded, "bus");
        let p = properties_of(&i);
        assert_eq!(p.delivery_mode(), &Some(2));
        assert_eq!(
            p.message_id().as_ref().map(|s| s.as_str()),
            Some(i.key.as_str())
        );
        assert_eq!(
            p.kind().as_ref().map(|s| s.as_str()),
            Some("org.ptrain.job.succeeded")
        );
    }
}
