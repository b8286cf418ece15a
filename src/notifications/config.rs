//! The `[notify]` and `[channels.NAME]` sections of ptrain.toml: a raw serde
//! layer (unknown keys are errors) and the validated [`NotificationsConfig`].
//!
//! Parsing reads no file: the `ptrain` CLI loads the same config as an
//! ordinary user. Secret files (`key_file`, `secret_file`, `token_file`,
//! `password_file`) are read by ptraind when the notifier starts
//! ([`super::transport`]), and must be root-only. Debug output of every
//! type here shows URLs without their query or credentials.
//!
//! ```toml
//! [notify]
//! initial_backoff = "5s"      # first retry after 2.5 to 5 s, doubling...
//! max_backoff = "10m"         # ...up to this
//! lifetime = "24h"            # then dead-lettered (`ptrain notifications`)
//! attempt_timeout = "10s"
//! default_channels = ["ops-wecom"]   # for jobs without "notify"
//! owner_email = { alice = "alice@example.com" }
//!
//! [channels.ops-wecom]
//! kind = "wecom"
//! url = "https://qyapi.weixin.qq.com/cgi-bin/webhook/send"
//! key_file = "/etc/ptrain/ops-wecom.key"   # root-only, mode 600
//! format = "markdown"                       # or "text"
//!
//! [channels.hook]
//! kind = "webhook"
//! url = "https://hooks.example.com/ptrain"
//! secret_file = "/etc/ptrain/hook.secret"   # X-Ptrain-Signature: sha256=HMAC
//! token_file = "/etc/ptrain/hook.token"     # Authorization: Bearer
//! ca_file = "/etc/ptrain/internal-ca.pem"
//! format = "cloudevents"                    # or "ptrain" (the default)
//!
//! [channels.owner-mail]
//! kind = "email"
//! smtp_host = "smtp.example.com"
//! tls = "starttls"                          # or "tls", "none"
//! username = "ptrain"
//! password_file = "/etc/ptrain/smtp.password"
//! from = "ptrain <ptrain@example.com>"
//! to_owner = true                           # via [notify] owner_email
//! to = ["ml-ops@example.com"]
//!
//! [channels.bus]                            # every job's events, as CloudEvents
//! kind = "amqp"
//! url = "amqps://rabbit.example.com:5671/%2f"   # no credentials in it
//! username = "ptrain"
//! password_file = "/etc/ptrain/rabbit.password"
//! exchange = "ptrain.events"                # routing key ptrain.EVENT.OWNER
//! events = ["started", "succeeded", "failed"]   # "jobs" (every job event) when unset;
//!                                           # "all" adds refused, gpu-unhealthy, gpu-healthy
//!
//! [channels.stream]                         # the same events on Kafka
//! kind = "kafka"
//! bootstrap_servers = ["kafka1.example.com:9093", "kafka2.example.com:9093"]
//! topic = "ptrain.events"                   # key = job id (spool/FILE, gpu/UUID)
//! tls = "tls"                               # or "none" (the default)
//! sasl_mechanism = "scram-sha-512"          # or "plain", "scram-sha-256"
//! username = "ptrain"
//! password_file = "/etc/ptrain/kafka.password"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;

use super::retry::RetryPolicy;
use super::{is_valid_channel_name, NotifyEvent, MAX_CHANNEL_NAME};
use crate::setting::InvalidSetting;

/// `[notify]`: retry timing, default channels, the owner address map.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNotify {
    initial_backoff: Option<String>,
    max_backoff: Option<String>,
    lifetime: Option<String>,
    attempt_timeout: Option<String>,
    default_channels: Option<Vec<String>>,
    host: Option<String>,
    owner_email: Option<BTreeMap<String, String>>,
    max_backlog: Option<usize>,
}

/// `[channels.NAME]`, every key of every kind; which apply is checked per kind.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawChannel {
    kind: Option<String>,
    url: Option<String>,
    key_file: Option<PathBuf>,
    secret_file: Option<PathBuf>,
    token_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    format: Option<String>,
    per_minute: Option<u32>,
    smtp_host: Option<String>,
    smtp_port: Option<u16>,
    tls: Option<String>,
    username: Option<String>,
    password_file: Option<PathBuf>,
    from: Option<String>,
    to: Option<Vec<String>>,
    to_owner: Option<bool>,
    exchange: Option<String>,
    events: Option<Vec<String>>,
    bootstrap_servers: Option<Vec<String>>,
    topic: Option<String>,
    sasl_mechanism: Option<String>,
}

impl std::fmt::Debug for RawChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The url may hold a WeCom key: never print it.
        f.debug_struct("RawChannel")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

pub const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_secs(5);
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(10 * 60);
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest accepted attempt timeout: an attempt holds its channel's slot.
pub const MAX_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// A WeCom group robot takes 20 messages a minute.
pub const WECOM_PER_MINUTE: u32 = 20;
/// Undelivered notifications a channel holds in memory (about 2 KiB
/// each); beyond it the rest wait in the outbox on disk and are taken back
/// in order as the channel drains: what bounds ptraind's memory while a
/// receiver is down.
pub const DEFAULT_MAX_BACKLOG: usize = 20_000;

/// The validated notification settings.
#[derive(Clone, Debug)]
pub struct NotificationsConfig {
    pub retry: RetryPolicy,
    pub attempt_timeout: Duration,
    /// Channels for jobs that name none.
    pub default_channels: Vec<String>,
    /// Host name shown in messages; the system's when unset.
    pub host: Option<String>,
    /// User name → the address their jobs' mail goes to.
    pub owner_email: BTreeMap<String, String>,
    pub channels: BTreeMap<String, ChannelConfig>,
    /// Undelivered notifications one channel may hold (`notify.max_backlog`).
    pub max_backlog: usize,
    /// The config file: a secret may sit in it only if it is root-only.
    pub config_path: PathBuf,
}

impl Default for NotificationsConfig {
    fn default() -> Self {
        NotificationsConfig::from_raw(Path::new(""), None, None).expect("the defaults are valid")
    }
}

#[derive(Clone, Debug)]
pub struct ChannelConfig {
    pub name: String,
    pub kind: ChannelKind,
}

#[derive(Clone, Debug)]
pub enum ChannelKind {
    Email(EmailConfig),
    WeCom(WeComConfig),
    Webhook(WebhookConfig),
    Amqp(AmqpConfig),
    Kafka(KafkaConfig),
}

/// A Kafka topic that hears every job's events, keyed by job id.
#[derive(Clone)]
pub struct KafkaConfig {
    /// `host:port` of the brokers first asked for the cluster's metadata.
    pub bootstrap_servers: Vec<String>,
    pub topic: String,
    pub tls: bool,
    pub ca_file: Option<PathBuf>,
    /// How the login is made; `None` for no login.
    pub sasl: Option<KafkaSasl>,
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    /// The events it is sent: every event of a job when the admin names
    /// none.
    pub events: Vec<NotifyEvent>,
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("topic", &self.topic)
            .field("tls", &self.tls)
            .field("sasl", &self.sasl)
            .field("username", &self.username)
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KafkaSasl {
    Plain,
    ScramSha256,
    ScramSha512,
}

/// An AMQP 0-9-1 exchange (RabbitMQ) that hears every job's events.
#[derive(Clone)]
pub struct AmqpConfig {
    /// `amqp://` or `amqps://` host, port and vhost, without credentials.
    pub url: String,
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    pub exchange: String,
    pub ca_file: Option<PathBuf>,
    /// The events it is sent: every event of a job when the admin names
    /// none.
    pub events: Vec<NotifyEvent>,
}

impl std::fmt::Debug for AmqpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpConfig")
            .field("url", &self.url)
            .field("username", &self.username)
            .field("exchange", &self.exchange)
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

#[derive(Clone)]
pub struct WebhookConfig {
    pub url: reqwest::Url,
    pub secret_file: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub format: WebhookFormat,
    /// Set: a stream, told every job's events it lists (and the host's),
    /// whatever the jobs name; unset: told the events of the jobs that
    /// name it (or have it by default).
    pub events: Option<Vec<NotifyEvent>>,
}

/// What a webhook's body is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WebhookFormat {
    /// ptrain's own JSON (`ptrain.notification/1`).
    #[default]
    Ptrain,
    /// A CloudEvents 1.0 event in structured mode, the same JSON as its
    /// `data` (`render::cloudevent`).
    CloudEvents,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeComFormat {
    Text,
    Markdown,
}

#[derive(Clone)]
pub struct WeComConfig {
    /// The robot's URL; holds `key=` unless `key_file` is set.
    pub url: reqwest::Url,
    pub key_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub format: WeComFormat,
    pub per_minute: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmtpTls {
    None,
    StartTls,
    Tls,
}

#[derive(Clone, Debug)]
pub struct EmailConfig {
    pub smtp_host: String,
    pub smtp_port: u16,
    pub tls: SmtpTls,
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub from: String,
    pub to: Vec<String>,
    /// Also mail the job's owner at their `[notify.owner_email]` address.
    pub to_owner: bool,
}

/// `scheme://host:port/path`, without credentials or query.
pub fn redacted_url(url: &reqwest::Url) -> String {
    let mut s = format!("{}://{}", url.scheme(), url.host_str().unwrap_or(""));
    if let Some(port) = url.port() {
        s.push_str(&format!(":{port}"));
    }
    s.push_str(url.path());
    if url.query().is_some() {
        s.push_str("?…");
    }
    s
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("url", &redacted_url(&self.url))
            .field("secret_file", &self.secret_file)
            .field("token_file", &self.token_file)
            .field("ca_file", &self.ca_file)
            .field("format", &self.format)
            .field("events", &self.events)
            .finish()
    }
}

impl std::fmt::Debug for WeComConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeComConfig")
            .field("url", &redacted_url(&self.url))
            .field("key_file", &self.key_file)
            .field("format", &self.format)
            .field("per_minute", &self.per_minute)
            .finish()
    }
}

impl ChannelConfig {
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            ChannelKind::Email(_) => "email",
            ChannelKind::WeCom(_) => "wecom",
            ChannelKind::Webhook(_) => "webhook",
            ChannelKind::Amqp(_) => "amqp",
            ChannelKind::Kafka(_) => "kafka",
        }
    }

    /// The events a stream channel (a message bus) is sent for every job,
    /// whatever the job's own `notify`; `None` for a channel that jobs
    /// name themselves.
    pub fn streamed_events(&self) -> Option<&[NotifyEvent]> {
        match &self.kind {
            ChannelKind::Amqp(cfg) => Some(&cfg.events),
            ChannelKind::Kafka(cfg) => Some(&cfg.events),
            ChannelKind::Webhook(cfg) => cfg.events.as_deref(),
            _ => None,
        }
    }

    /// Whether one job's events must reach it in the order they happened
    /// (a stream's consumers replay them): one failing holds back the rest.
    pub fn ordered(&self) -> bool {
        self.streamed_events().is_some()
    }

    /// The addresses a job of `owner` is mailed at (empty for other kinds).
    pub fn email_recipients(
        &self,
        owner_email: &BTreeMap<String, String>,
        owner: &str,
    ) -> Vec<String> {
        let ChannelKind::Email(email) = &self.kind else {
            return Vec::new();
        };
        let mut to = email.to.clone();
        if email.to_owner {
            if let Some(addr) = owner_email.get(owner) {
                if !to.contains(addr) {
                    to.push(addr.clone());
                }
            }
        }
        to
    }

    /// Whether a notification for a job of `owner` has anyone to go to.
    pub fn reaches(&self, owner_email: &BTreeMap<String, String>, owner: &str) -> bool {
        match self.kind {
            ChannelKind::Email(_) => !self.email_recipients(owner_email, owner).is_empty(),
            _ => true,
        }
    }
}

impl NotificationsConfig {
    /// The host name messages name.
    pub fn host(&self) -> String {
        self.host.clone().unwrap_or_else(system_host_name)
    }

    /// Validates the raw sections. Errors are (key, message).
    pub fn from_raw(
        config_path: &Path,
        notify: Option<RawNotify>,
        channels: Option<BTreeMap<String, RawChannel>>,
    ) -> Result<NotificationsConfig, InvalidSetting> {
        let notify = notify.unwrap_or_default();
        let duration = |key: &str, value: &Option<String>, default: Duration| match value {
            None => Ok(default),
            Some(text) => match humantime::parse_duration(text) {
                Ok(d) if !d.is_zero() => Ok(d),
                Ok(_) => Err(InvalidSetting::new(
                    format!("notify.{key}"),
                    "must be more than zero; write e.g. \"5s\"".to_owned(),
                )),
                Err(e) => Err(InvalidSetting::new(
                    format!("notify.{key}"),
                    format!(
                        "{text:?} is not a duration ({e}); write e.g. \"5s\", \"10m\" or \"24h\""
                    ),
                )),
            },
        };
        let initial_backoff = duration(
            "initial_backoff",
            &notify.initial_backoff,
            DEFAULT_INITIAL_BACKOFF,
        )?;
        let max_backoff = duration(
            "max_backoff",
            &notify.max_backoff,
            DEFAULT_MAX_BACKOFF.max(initial_backoff),
        )?;
        let lifetime = duration("lifetime", &notify.lifetime, DEFAULT_LIFETIME)?;
        let attempt_timeout = duration(
            "attempt_timeout",
            &notify.attempt_timeout,
            DEFAULT_ATTEMPT_TIMEOUT,
        )?;
        if max_backoff < initial_backoff {
            return Err(InvalidSetting::new(
                "notify.max_backoff".into(),
                "is shorter than notify.initial_backoff; raise it or lower initial_backoff".into(),
            ));
        }
        if attempt_timeout > MAX_ATTEMPT_TIMEOUT {
            return Err(InvalidSetting::new(
                "notify.attempt_timeout".into(),
                "is longer than 5m; an endpoint that slow should fail and be retried, lower it"
                    .into(),
            ));
        }
        let mut owner_email = BTreeMap::new();
        for (user, addr) in notify.owner_email.unwrap_or_default() {
            let key = format!("notify.owner_email.{user}");
            check_address(&key, &addr)?;
            owner_email.insert(user, addr);
        }
        if let Some(host) = &notify.host {
            if host.is_empty() || host.len() > 253 || !host.bytes().all(is_host_byte) {
                return Err(InvalidSetting::new(
                    "notify.host".into(),
                    format!("{host:?} is not a host name; use letters, digits, '-' and '.'"),
                ));
            }
        }

        let max_backlog = notify.max_backlog.unwrap_or(DEFAULT_MAX_BACKLOG);
        if max_backlog == 0 {
            return Err(InvalidSetting::new(
                "notify.max_backlog".into(),
                "must be at least 1; it is how many undelivered notifications a channel may hold"
                    .into(),
            ));
        }
        let mut parsed = BTreeMap::new();
        for (name, raw) in channels.unwrap_or_default() {
            if !is_valid_channel_name(&name) {
                return Err(InvalidSetting::new(
                    format!("channels.{name}"),
                    format!("channel names are 1 to {MAX_CHANNEL_NAME} characters of A-Z a-z 0-9 _ - starting with a letter or digit; rename it"),
                ));
            }
            let channel = parse_channel(&name, raw)?;
            parsed.insert(name, channel);
        }
        let default_channels = notify.default_channels.unwrap_or_default();
        for (i, name) in default_channels.iter().enumerate() {
            if !parsed.contains_key(name) {
                return Err(InvalidSetting::new(
                    format!("notify.default_channels[{i}]"),
                    format!("{name:?} is not a configured channel; add a [channels.{name}] table or remove it"),
                ));
            }
        }
        Ok(NotificationsConfig {
            retry: RetryPolicy {
                initial_backoff,
                max_backoff,
                lifetime,
            },
            attempt_timeout,
            default_channels,
            host: notify.host,
            owner_email,
            channels: parsed,
            max_backlog,
            config_path: config_path.to_owned(),
        })
    }
}

fn is_host_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'.'
}

fn check_address(key: &str, addr: &str) -> Result<(), InvalidSetting> {
    lettre::Address::from_str(addr).map(|_| ()).map_err(|e| {
        InvalidSetting::new(
            key.to_owned(),
            format!("{addr:?} is not an email address ({e}); write e.g. \"alice@example.com\""),
        )
    })
}

fn absolute(key: &str, path: Option<PathBuf>) -> Result<Option<PathBuf>, InvalidSetting> {
    match path {
        Some(p) if !p.is_absolute() => Err(InvalidSetting::new(
            key.to_owned(),
            format!(
                "{} is relative; give an absolute path to a root-only file",
                p.display()
            ),
        )),
        other => Ok(other),
    }
}

fn parse_url(
    key: &str,
    text: Option<String>,
    example: &str,
) -> Result<reqwest::Url, InvalidSetting> {
    let Some(text) = text else {
        return Err(InvalidSetting::new(
            key.to_owned(),
            format!("is missing; add e.g. url = {example:?}"),
        ));
    };
    let url = reqwest::Url::parse(&text).map_err(|e| {
        InvalidSetting::new(
            key.to_owned(),
            // The text may hold a key: name the problem, not the value.
            format!("is not a URL ({e}); write e.g. {example:?}"),
        )
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(InvalidSetting::new(
            key.to_owned(),
            format!("must be an http:// or https:// URL with a host; write e.g. {example:?}"),
        ));
    }
    Ok(url)
}

fn parse_channel(name: &str, raw: RawChannel) -> Result<ChannelConfig, InvalidSetting> {
    let key = |k: &str| format!("channels.{name}.{k}");
    let kind = raw.kind.as_deref().ok_or_else(|| {
        InvalidSetting::new(
            key("kind"),
            "is missing; add kind = \"email\", \"wecom\", \"webhook\", \"amqp\" or \"kafka\""
                .to_owned(),
        )
    })?;
    // Keys that belong to another kind are mistakes, not silently ignored.
    let present: Vec<(&str, bool)> = vec![
        ("url", raw.url.is_some()),
        ("key_file", raw.key_file.is_some()),
        ("secret_file", raw.secret_file.is_some()),
        ("token_file", raw.token_file.is_some()),
        ("format", raw.format.is_some()),
        ("per_minute", raw.per_minute.is_some()),
        ("smtp_host", raw.smtp_host.is_some()),
        ("smtp_port", raw.smtp_port.is_some()),
        ("tls", raw.tls.is_some()),
        ("username", raw.username.is_some()),
        ("password_file", raw.password_file.is_some()),
        ("from", raw.from.is_some()),
        ("to", raw.to.is_some()),
        ("to_owner", raw.to_owner.is_some()),
        ("exchange", raw.exchange.is_some()),
        ("events", raw.events.is_some()),
        ("bootstrap_servers", raw.bootstrap_servers.is_some()),
        ("topic", raw.topic.is_some()),
        ("sasl_mechanism", raw.sasl_mechanism.is_some()),
    ];
    let allowed: &[&str] = match kind {
        "webhook" => &["url", "secret_file", "token_file", "format", "events"],
        "wecom" => &["url", "key_file", "format", "per_minute"],
        "amqp" => &["url", "username", "password_file", "exchange", "events"],
        "kafka" => &[
            "bootstrap_servers",
            "topic",
            "tls",
            "sasl_mechanism",
            "username",
            "password_file",
            "events",
        ],
        "email" => &[
            "smtp_host",
            "smtp_port",
            "tls",
            "username",
            "password_file",
            "from",
            "to",
            "to_owner",
        ],
        other => {
            return Err(InvalidSetting::new(
                key("kind"),
                format!("{other:?} is not a channel kind; use \"email\", \"wecom\", \"webhook\", \"amqp\" or \"kafka\""),
            ))
        }
    };
    if let Some((k, _)) = present.iter().find(|(k, set)| *set && !allowed.contains(k)) {
        return Err(InvalidSetting::new(
            key(k),
            format!(
                "does not apply to a {kind} channel (it takes {}, ca_file); remove it",
                allowed.join(", ")
            ),
        ));
    }
    let ca_file = absolute(&key("ca_file"), raw.ca_file.clone())?;
    let kind = match kind {
        "amqp" => ChannelKind::Amqp(parse_amqp(&key, raw, ca_file)?),
        "kafka" => ChannelKind::Kafka(parse_kafka(&key, raw, ca_file)?),
        "webhook" => ChannelKind::Webhook(WebhookConfig {
            events: match raw.events {
                Some(words) => Some(parse_stream_events(&key, Some(words))?),
                None => None,
            },
            url: parse_url(&key("url"), raw.url, "https://hooks.example.com/ptrain")?,
            secret_file: absolute(&key("secret_file"), raw.secret_file)?,
            token_file: absolute(&key("token_file"), raw.token_file)?,
            ca_file,
            format: match raw.format.as_deref() {
                None | Some("ptrain") => WebhookFormat::Ptrain,
                Some("cloudevents") => WebhookFormat::CloudEvents,
                Some(other) => {
                    return Err(InvalidSetting::new(
                        key("format"),
                        format!(
                            "{other:?} is not a webhook format; use \"ptrain\" (ptrain's own JSON) or \"cloudevents\" (CloudEvents 1.0)"
                        ),
                    ))
                }
            },
        }),
        "wecom" => {
            let url = parse_url(
                &key("url"),
                raw.url,
                "https://qyapi.weixin.qq.com/cgi-bin/webhook/send",
            )?;
            let key_in_url = url.query_pairs().any(|(k, _)| k == "key");
            let key_file = absolute(&key("key_file"), raw.key_file)?;
            match (key_in_url, key_file.is_some()) {
                (true, true) => {
                    return Err(InvalidSetting::new(
                        key("key_file"),
                        "is set but the url already has key=...; keep the key in one place (key_file is safer)".into(),
                    ))
                }
                (false, false) => {
                    return Err(InvalidSetting::new(
                        key("key_file"),
                        "is missing and the url has no key=...; put the robot's key in a root-only file and name it here".into(),
                    ))
                }
                _ => {}
            }
            let format = match raw.format.as_deref() {
                None | Some("markdown") => WeComFormat::Markdown,
                Some("text") => WeComFormat::Text,
                Some(other) => {
                    return Err(InvalidSetting::new(
                        key("format"),
                        format!(
                            "{other:?} is not a WeCom message type; use \"markdown\" or \"text\""
                        ),
                    ))
                }
            };
            let per_minute = raw.per_minute.unwrap_or(WECOM_PER_MINUTE);
            if per_minute == 0 || per_minute > WECOM_PER_MINUTE {
                return Err(InvalidSetting::new(
                    key("per_minute"),
                    format!(
                        "must be 1 to {WECOM_PER_MINUTE}; a robot blocks senders above 20 a minute"
                    ),
                ));
            }
            ChannelKind::WeCom(WeComConfig {
                url,
                key_file,
                ca_file,
                format,
                per_minute,
            })
        }
        _ => {
            let smtp_host = raw.smtp_host.filter(|h| !h.is_empty()).ok_or_else(|| {
                InvalidSetting::new(
                    key("smtp_host"),
                    "is missing; add e.g. smtp_host = \"smtp.example.com\"".to_owned(),
                )
            })?;
            let tls = match raw.tls.as_deref() {
                None | Some("starttls") => SmtpTls::StartTls,
                Some("tls") => SmtpTls::Tls,
                Some("none") => SmtpTls::None,
                Some(other) => {
                    return Err(InvalidSetting::new(
                        key("tls"),
                        format!(
                            "{other:?} is not a TLS mode; use \"starttls\", \"tls\" or \"none\""
                        ),
                    ))
                }
            };
            let smtp_port = raw.smtp_port.unwrap_or(match tls {
                SmtpTls::StartTls => 587,
                SmtpTls::Tls => 465,
                SmtpTls::None => 25,
            });
            if raw.password_file.is_some() && raw.username.is_none() {
                return Err(InvalidSetting::new(
                    key("username"),
                    "is missing while password_file is set; add the SMTP user name".into(),
                ));
            }
            if tls == SmtpTls::None && raw.username.is_some() {
                return Err(InvalidSetting::new(
                    key("tls"),
                    "is \"none\" but credentials are set; they would cross the network in clear, use \"starttls\" or \"tls\"".into(),
                ));
            }
            let from = raw.from.ok_or_else(|| {
                InvalidSetting::new(
                    key("from"),
                    "is missing; add e.g. from = \"ptrain <ptrain@example.com>\"".to_owned(),
                )
            })?;
            lettre::message::Mailbox::from_str(&from).map_err(|e| {
                InvalidSetting::new(
                    key("from"),
                    format!("{from:?} is not a mailbox ({e}); write e.g. \"ptrain <ptrain@example.com>\""),
                )
            })?;
            let to = raw.to.unwrap_or_default();
            for (i, addr) in to.iter().enumerate() {
                check_address(&format!("{}[{i}]", key("to")), addr)?;
            }
            let to_owner = raw.to_owner.unwrap_or(false);
            if to.is_empty() && !to_owner {
                return Err(InvalidSetting::new(
                    key("to"),
                    "is empty and to_owner is false, so nobody would get mail; list addresses or set to_owner = true".into(),
                ));
            }
            ChannelKind::Email(EmailConfig {
                smtp_host,
                smtp_port,
                tls,
                username: raw.username,
                password_file: absolute(&key("password_file"), raw.password_file)?,
                ca_file,
                from,
                to,
                to_owner,
            })
        }
    };
    Ok(ChannelConfig {
        name: name.to_owned(),
        kind,
    })
}

/// Longest AMQP exchange name (a short string).
const MAX_EXCHANGE: usize = 127;

fn parse_amqp(
    key: &dyn Fn(&str) -> String,
    raw: RawChannel,
    ca_file: Option<PathBuf>,
) -> Result<AmqpConfig, InvalidSetting> {
    const EXAMPLE: &str = "amqps://rabbit.example.com:5671/%2f";
    let text = raw.url.ok_or_else(|| {
        InvalidSetting::new(
            key("url"),
            format!("is missing; add e.g. url = {EXAMPLE:?}"),
        )
    })?;
    let uri: lapin::uri::AMQPUri = text.parse().map_err(|e| {
        InvalidSetting::new(
            key("url"),
            format!("is not an AMQP URL ({e}); write e.g. {EXAMPLE:?}"),
        )
    })?;
    // The parser fills in guest:guest when the URL names no user.
    let names_user = text
        .split_once("://")
        .is_some_and(|(_, rest)| rest.split('/').next().unwrap_or("").contains('@'));
    if names_user {
        return Err(InvalidSetting::new(
            key("url"),
            "holds credentials; move the user to username and the password to a root-only password_file".into(),
        ));
    }
    if uri.authority.host.is_empty() {
        return Err(InvalidSetting::new(
            key("url"),
            format!("names no host; write e.g. {EXAMPLE:?}"),
        ));
    }
    if raw.password_file.is_some() != raw.username.is_some() {
        return Err(InvalidSetting::new(
            key("password_file"),
            "and username go together: set both (the broker's user and a root-only file holding its password), or neither for guest on localhost".into(),
        ));
    }
    let exchange = raw.exchange.unwrap_or_default();
    let exchange_ok = !exchange.is_empty()
        && exchange.len() <= MAX_EXCHANGE
        && exchange
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
    if !exchange_ok {
        return Err(InvalidSetting::new(
            key("exchange"),
            format!("must name the exchange: 1 to {MAX_EXCHANGE} of A-Z a-z 0-9 - _ . : (the default exchange cannot route ptrain.EVENT.OWNER); e.g. exchange = \"ptrain.events\""),
        ));
    }
    let events = parse_stream_events(key, raw.events)?;
    Ok(AmqpConfig {
        url: text,
        username: raw.username,
        password_file: absolute(&key("password_file"), raw.password_file)?,
        exchange,
        ca_file,
        events,
    })
}

/// What a stream channel's `events` may name besides each event: every
/// event of a job, and every event at all.
const EVENTS_OF_JOBS: &str = "jobs";
const EVENTS_ALL: &str = "all";

/// A stream channel's `events`: the admin's choice, or every event of a
/// job. The events of no job (refused, gpu-unhealthy, gpu-healthy) are
/// asked for by name or by "all", so a consumer written for a job's
/// events never gets one it did not ask for (a stream set up before
/// they existed included).
fn parse_stream_events(
    key: &dyn Fn(&str) -> String,
    words: Option<Vec<String>>,
) -> Result<Vec<NotifyEvent>, InvalidSetting> {
    let of_jobs = || NotifyEvent::ALL.into_iter().filter(|e| e.is_of_a_job());
    match words {
        None => Ok(of_jobs().collect()),
        Some(words) if words.is_empty() => Err(InvalidSetting::new(
            key("events"),
            "is empty, so the channel would get nothing; list events, or remove the key for every event of a job"
                .into(),
        )),
        Some(words) => {
            let mut events = Vec::new();
            for (i, word) in words.iter().enumerate() {
                let named: Vec<NotifyEvent> = match word.as_str() {
                    EVENTS_OF_JOBS => of_jobs().collect(),
                    EVENTS_ALL => NotifyEvent::ALL.to_vec(),
                    word => vec![NotifyEvent::parse(word).ok_or_else(|| {
                        InvalidSetting::new(
                            format!("{}[{i}]", key("events")),
                            format!(
                                "{word:?} is not an event; use {:?} (every event of a job), {:?} (every event), or {}",
                                EVENTS_OF_JOBS,
                                EVENTS_ALL,
                                NotifyEvent::ALL
                                    .map(|e| format!("{:?}", e.as_str()))
                                    .join(", ")
                            ),
                        )
                    })?],
                };
                for event in named {
                    if !events.contains(&event) {
                        events.push(event);
                    }
                }
            }
            Ok(events)
        }
    }
}

/// Longest topic name Kafka accepts.
const MAX_TOPIC: usize = 249;

fn parse_kafka(
    key: &dyn Fn(&str) -> String,
    raw: RawChannel,
    ca_file: Option<PathBuf>,
) -> Result<KafkaConfig, InvalidSetting> {
    const EXAMPLE: &str = "bootstrap_servers = [\"kafka1.example.com:9093\"]";
    let servers = raw.bootstrap_servers.unwrap_or_default();
    if servers.is_empty() {
        return Err(InvalidSetting::new(
            key("bootstrap_servers"),
            format!("is missing or empty; list the brokers' host:port, e.g. {EXAMPLE}"),
        ));
    }
    for (i, server) in servers.iter().enumerate() {
        // A name or an IPv4 address; an IPv6 one in brackets.
        let ok = server.rsplit_once(':').is_some_and(|(host, port)| {
            let bare = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host);
            !bare.is_empty()
                && (bare == host || bare.parse::<std::net::Ipv6Addr>().is_ok())
                && (bare != host
                    || host
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_')))
                && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !ok {
            return Err(InvalidSetting::new(
                format!("{}[{i}]", key("bootstrap_servers")),
                format!(
                    "{server:?} is not host:port (no scheme, no credentials); write e.g. {EXAMPLE}"
                ),
            ));
        }
    }
    let topic = raw.topic.unwrap_or_default();
    let topic_ok = !topic.is_empty()
        && topic != "."
        && topic != ".."
        && topic.len() <= MAX_TOPIC
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !topic_ok {
        return Err(InvalidSetting::new(
            key("topic"),
            format!("must name the topic: 1 to {MAX_TOPIC} of A-Z a-z 0-9 - _ . (Kafka's rule); e.g. topic = \"ptrain.events\""),
        ));
    }
    let tls = match raw.tls.as_deref() {
        None | Some("none") => false,
        Some("tls") => true,
        Some(other) => {
            return Err(InvalidSetting::new(
                key("tls"),
                format!("{other:?} is not a Kafka TLS mode; use \"tls\" (SSL or SASL_SSL listeners) or \"none\""),
            ))
        }
    };
    if tls && servers.iter().any(|s| s.starts_with('[')) {
        // The client takes a TLS server name up to the first ':'.
        return Err(InvalidSetting::new(
            key("bootstrap_servers"),
            "names an IPv6 address, which ptrain cannot verify a certificate for; name the brokers by their DNS names".into(),
        ));
    }
    if ca_file.is_some() && !tls {
        return Err(InvalidSetting::new(
            key("ca_file"),
            "applies only with tls = \"tls\"; set it, or remove ca_file".into(),
        ));
    }
    let sasl = match raw.sasl_mechanism.as_deref() {
        None => None,
        Some("plain") => Some(KafkaSasl::Plain),
        Some("scram-sha-256") => Some(KafkaSasl::ScramSha256),
        Some("scram-sha-512") => Some(KafkaSasl::ScramSha512),
        Some(other) => {
            return Err(InvalidSetting::new(
                key("sasl_mechanism"),
                format!("{other:?} is not a SASL mechanism ptrain speaks; use \"plain\", \"scram-sha-256\" or \"scram-sha-512\""),
            ))
        }
    };
    let login = raw.username.is_some() || raw.password_file.is_some();
    if sasl.is_some() != login || raw.username.is_some() != raw.password_file.is_some() {
        let missing = if sasl.is_none() {
            "sasl_mechanism"
        } else if raw.username.is_none() {
            "username"
        } else {
            "password_file"
        };
        return Err(InvalidSetting::new(
            key(missing),
            "is missing: sasl_mechanism, username and password_file go together: set all three (the mechanism, the broker's user and a root-only file holding its password), or none for a listener without login".into(),
        ));
    }
    if sasl == Some(KafkaSasl::Plain) && !tls {
        return Err(InvalidSetting::new(
            key("sasl_mechanism"),
            "\"plain\" sends the password as it is: use it with tls = \"tls\", or use \"scram-sha-512\"".into(),
        ));
    }
    let events = parse_stream_events(key, raw.events)?;
    Ok(KafkaConfig {
        bootstrap_servers: servers,
        topic,
        tls,
        ca_file,
        sasl,
        username: raw.username,
        password_file: absolute(&key("password_file"), raw.password_file)?,
        events,
    })
}

/// The kernel's host name (the UTS name), or "localhost".
pub fn system_host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Doc {
        notify: Option<RawNotify>,
        channels: Option<BTreeMap<String, RawChannel>>,
    }

    fn load(text: &str) -> Result<NotificationsConfig, InvalidSetting> {
        let doc: Doc = toml::from_str(text)
            .map_err(|e| InvalidSetting::new("toml".to_owned(), e.to_string()))?;
        NotificationsConfig::from_raw(
            Path::new("/etc/ptrain/ptrain.toml"),
            doc.notify,
            doc.channels,
        )
    }

    #[test]
    fn defaults_without_sections() {
        let c = load("").unwrap();
        assert_eq!(c.retry.initial_backoff, DEFAULT_INITIAL_BACKOFF);
        assert_eq!(c.retry.lifetime, DEFAULT_LIFETIME);
        assert!(c.attempt_timeout <= Duration::from_secs(10));
        assert!(c.channels.is_empty() && c.default_channels.is_empty());
    }

    #[test]
    fn all_three_kinds_parse() {
        let c = load(
            r#"
            [notify]
            initial_backoff = "1s"
            max_backoff = "1m"
            lifetime = "2h"
            default_channels = ["ops"]
            owner_email = { alice = "alice@example.com" }
            [channels.ops]
            kind = "wecom"
            url = "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=SECRETKEY"
            format = "text"
            [channels.hook]
            kind = "webhook"
            url = "https://hooks.example.com/x"
            secret_file = "/etc/ptrain/hook.secret"
            ca_file = "/etc/ptrain/ca.pem"
            [channels.mail]
            kind = "email"
            smtp_host = "smtp.example.com"
            username = "ptrain"
            password_file = "/etc/ptrain/smtp.pass"
            from = "ptrain <ptrain@example.com>"
            to_owner = true
            "#,
        )
        .unwrap();
        assert_eq!(c.retry.initial_backoff, Duration::from_secs(1));
        assert_eq!(c.default_channels, ["ops"]);
        let ChannelKind::Email(mail) = &c.channels["mail"].kind else {
            panic!()
        };
        assert_eq!((mail.smtp_port, mail.tls), (587, SmtpTls::StartTls));
        assert_eq!(
            c.channels["mail"].email_recipients(&c.owner_email, "alice"),
            ["alice@example.com"]
        );
        assert!(!c.channels["mail"].reaches(&c.owner_email, "bob"));
        assert!(c.channels["hook"].reaches(&c.owner_email, "bob"));
        // The key in the url never shows in Debug output.
        let debug = format!("{c:?}");
        assert!(!debug.contains("SECRETKEY"), "{debug}");
        assert!(debug.contains("qyapi.weixin.qq.com"), "{debug}");
    }

    #[test]
    fn errors_name_the_key_and_fix() {
        let cases = [
            ("[notify]\ninitial_backoff = \"soon\"", "notify.initial_backoff", "duration"),
            ("[notify]\ninitial_backoff = \"1m\"\nmax_backoff = \"1s\"", "notify.max_backoff", "raise"),
            ("[notify]\nattempt_timeout = \"1h\"", "notify.attempt_timeout", "lower"),
            ("[notify]\ndefault_channels = [\"nope\"]", "notify.default_channels[0]", "[channels.nope]"),
            ("[notify]\nowner_email = { alice = \"not-an-address\" }", "notify.owner_email.alice", "email address"),
            ("[channels.\"a.b\"]\nkind = \"webhook\"", "channels.a.b", "rename"),
            ("[channels.x]\nurl = \"https://h/\"", "channels.x.kind", "kind ="),
            ("[channels.x]\nkind = \"sms\"", "channels.x.kind", "\"webhook\""),
            ("[channels.x]\nkind = \"webhook\"", "channels.x.url", "url ="),
            ("[channels.x]\nkind = \"webhook\"\nurl = \"ftp://h/\"", "channels.x.url", "http"),
            ("[channels.x]\nkind = \"webhook\"\nurl = \"https://h/\"\nsmtp_host = \"h\"", "channels.x.smtp_host", "remove it"),
            ("[channels.x]\nkind = \"webhook\"\nurl = \"https://h/\"\nsecret_file = \"s\"", "channels.x.secret_file", "absolute"),
            ("[channels.x]\nkind = \"webhook\"\nurl = \"https://h/\"\nformat = \"xml\"", "channels.x.format", "\"cloudevents\""),
            ("[channels.x]\nkind = \"wecom\"\nurl = \"https://h/send\"", "channels.x.key_file", "root-only file"),
            ("[channels.x]\nkind = \"wecom\"\nurl = \"https://h/send?key=k\"\nkey_file = \"/k\"", "channels.x.key_file", "one place"),
            ("[channels.x]\nkind = \"wecom\"\nurl = \"https://h/send?key=k\"\nper_minute = 30", "channels.x.per_minute", "1 to 20"),
            ("[channels.x]\nkind = \"email\"\nfrom = \"a@b.c\"\nto = [\"a@b.c\"]", "channels.x.smtp_host", "smtp_host ="),
            ("[channels.x]\nkind = \"email\"\nsmtp_host = \"h\"\nto = [\"a@b.c\"]", "channels.x.from", "from ="),
            ("[channels.x]\nkind = \"email\"\nsmtp_host = \"h\"\nfrom = \"a@b.c\"", "channels.x.to", "to_owner"),
            ("[channels.x]\nkind = \"email\"\nsmtp_host = \"h\"\nfrom = \"a@b.c\"\nto = [\"x\"]", "channels.x.to[0]", "email address"),
            ("[channels.x]\nkind = \"email\"\nsmtp_host = \"h\"\nfrom = \"a@b.c\"\nto = [\"a@b.c\"]\ntls = \"none\"\nusername = \"u\"", "channels.x.tls", "starttls"),
        ];
        for (text, key, fix) in cases {
            let InvalidSetting { key: k, message } = load(text).unwrap_err();
            assert_eq!(k, key, "{text}: {message}");
            assert!(message.contains(fix), "{text}: {message}");
        }
        // A bad URL's message never repeats the value, which may be a key.
        let InvalidSetting { message, .. } =
            load("[channels.x]\nkind = \"wecom\"\nurl = \"SECRET not a url\"").unwrap_err();
        assert!(!message.contains("SECRET"), "{message}");
    }
}
