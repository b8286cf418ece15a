//! The I/O edge of notifications: one [`Transport`] per configured channel
//! (webhook and WeCom over reqwest, email over lettre, both on rustls with
//! the ring provider; AMQP in [`super::amqp`], Kafka in [`super::kafka`]).
//! Each call makes one attempt and classifies the answer; retrying and
//! pacing belong to the sender.
//!
//! Secrets are read here, once, when ptraind starts: only from files owned
//! by root and closed to group and others, or from the config file when it
//! is itself root-only. Every error text a transport returns has its
//! secrets replaced by `[redacted]` (and URLs dropped: a WeCom URL holds the
//! robot's key), because it is logged and shown by `ptrain notifications`.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use hmac::{Hmac, Mac};
use lettre::message::header::{ContentType, Header, HeaderName, HeaderValue};
use lettre::message::Mailbox;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use sha2::Sha256;

use super::config::{
    ChannelConfig, ChannelKind, EmailConfig, SmtpTls, WeComConfig, WeComFormat, WebhookConfig,
    WebhookFormat,
};
use super::render;
use super::retry::{classify_http, classify_smtp, classify_wecom, Verdict};
use super::{Intent, NotificationsConfig};

/// One channel's way out.
pub trait Transport: Send + Sync {
    /// Makes one attempt to deliver `batch` (one intent, or several merged
    /// into a digest where [`Transport::max_batch`] allows).
    fn send(&self, batch: Vec<Intent>) -> BoxFuture<'static, Verdict>;

    /// Makes one attempt at `batch` and says how each intent fared, in
    /// order. A transport that sends each intent as its own message (a
    /// broker's publishes, each confirmed) tells them apart; the others
    /// give the one message's verdict to all.
    fn send_each(&self, batch: Vec<Intent>) -> BoxFuture<'static, Vec<Verdict>> {
        let n = batch.len();
        let sent = self.send(batch);
        Box::pin(async move { vec![sent.await; n] })
    }

    /// Most intents one attempt may carry.
    fn max_batch(&self) -> usize {
        1
    }

    /// Messages a minute the endpoint accepts, if it limits them.
    fn per_minute(&self) -> Option<u32> {
        None
    }
}

/// A secret's text; Debug never shows it.
#[derive(Clone)]
pub struct Secret(Arc<str>);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// Replaces every secret in a text before it is logged or stored.
#[derive(Clone, Default)]
pub(super) struct Redactor(Vec<Secret>);

impl Redactor {
    pub(super) fn add(&mut self, s: &Secret) {
        if !s.expose().is_empty() {
            self.0.push(s.clone());
        }
    }

    pub(super) fn clean(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for s in &self.0 {
            out = out.replace(s.expose(), "[redacted]");
        }
        out
    }
}

/// The one verdict of a batch whose events each got their own (a
/// broker's transport, [`Transport::send_each`]): its first failure, or
/// delivered.
pub(super) fn first_failure(each: BoxFuture<'static, Vec<Verdict>>) -> BoxFuture<'static, Verdict> {
    Box::pin(async move {
        each.await
            .into_iter()
            .find(|v| *v != Verdict::Delivered)
            .unwrap_or(Verdict::Delivered)
    })
}

/// Reads a secret from a root-only file: owned by root (or this process's
/// user), no access for group or others, not a symlink. Surrounding
/// whitespace (the trailing newline of `echo KEY > file`) is dropped.
pub fn read_secret_file(key: &str, path: &Path) -> Result<Secret, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("{key}: cannot read {}: {e}; create it as a root-only file (install -m 600 /dev/null FILE, then write the secret)", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("{key}: cannot stat {}: {e}", path.display()))?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if !meta.is_file() {
        return Err(format!(
            "{key}: {} is not a regular file; point it at a file holding only the secret",
            path.display()
        ));
    }
    if meta.uid() != 0 && meta.uid() != euid {
        return Err(format!(
            "{key}: {} belongs to uid {}, not root; chown root it (a secret must not be changeable by a user)",
            path.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{key}: {} is readable by group or others (mode {:04o}); chmod 600 it",
            path.display(),
            meta.mode() & 0o7777
        ));
    }
    let mut text = String::new();
    file.by_ref()
        .take(64 * 1024)
        .read_to_string(&mut text)
        .map_err(|e| {
            format!(
                "{key}: cannot read {}: {e}; it must hold UTF-8 text",
                path.display()
            )
        })?;
    let text = text.trim();
    if text.is_empty() {
        return Err(format!(
            "{key}: {} is empty; write the secret into it",
            path.display()
        ));
    }
    Ok(Secret(text.into()))
}

/// A secret may sit in the config file only if only root can read it.
fn config_is_root_only(path: &Path) -> Result<(), String> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot stat {}: {e}", path.display()))?;
    if meta.mode() & 0o077 != 0 || meta.uid() != 0 {
        return Err(format!(
            "{} is readable by users other than root (mode {:04o}, owner uid {})",
            path.display(),
            meta.mode() & 0o7777,
            meta.uid()
        ));
    }
    Ok(())
}

/// `sha256=HEX`: HMAC-SHA256 of the exact body bytes with the channel's
/// secret, sent as `X-Ptrain-Signature`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// An error and its causes on one line, without URLs.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = cause.source();
    }
    s
}

fn reqwest_error(e: reqwest::Error, redact: &Redactor) -> Verdict {
    let timeout = e.is_timeout();
    let e = e.without_url();
    let text = redact.clean(&chain(&e));
    if timeout {
        Verdict::Retry(format!("timed out: {text}"))
    } else {
        Verdict::Retry(text)
    }
}

/// Reads at most `max` bytes of a response body.
async fn body_prefix(mut resp: reqwest::Response, max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < max {
        match resp.chunk().await {
            Ok(Some(chunk)) => out.extend_from_slice(&chunk[..chunk.len().min(max - out.len())]),
            _ => break,
        }
    }
    out
}

/// Adds what the endpoint said to a failure, cleaned for the log.
fn with_answer(verdict: Verdict, body: &[u8], redact: &Redactor) -> Verdict {
    let said: String = String::from_utf8_lossy(body)
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    if said.trim().is_empty() {
        return verdict;
    }
    let said = redact.clean(said.trim());
    match verdict {
        Verdict::Retry(why) => Verdict::Retry(format!("{why}; endpoint said: {said}")),
        Verdict::Dead(why) => Verdict::Dead(format!("{why}; endpoint said: {said}")),
        v => v,
    }
}

fn http_client(
    attempt_timeout: Duration,
    ca_file: Option<&Path>,
) -> Result<reqwest::Client, String> {
    // reqwest is built without a default crypto provider (lettre brings its
    // own): install ring's. Installing twice is harmless (the second call
    // returns Err).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .timeout(attempt_timeout)
        .connect_timeout(attempt_timeout)
        .user_agent(concat!("ptrain/", env!("CARGO_PKG_VERSION")))
        // A redirect is reported, not followed: a notification (and its
        // bearer token) goes only where the admin pointed it.
        .redirect(reqwest::redirect::Policy::none());
    if let Some(ca) = ca_file {
        let pem = std::fs::read(ca).map_err(|e| {
            format!(
                "ca_file: cannot read {}: {e}; point it at a PEM file of CA certificates",
                ca.display()
            )
        })?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("ca_file: {} is not PEM certificates: {e}", ca.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "ca_file: {} holds no certificate; put the CA's PEM certificate in it",
                ca.display()
            ));
        }
        builder = builder.tls_certs_only(certs);
    }
    builder
        .build()
        .map_err(|e| format!("cannot set up the HTTP client: {}", chain(&e)))
}

struct Webhook {
    client: reqwest::Client,
    url: reqwest::Url,
    format: WebhookFormat,
    secret: Option<Secret>,
    token: Option<Secret>,
    redact: Redactor,
}

impl Webhook {
    fn new(name: &str, cfg: &WebhookConfig, attempt_timeout: Duration) -> Result<Webhook, String> {
        let key = |k: &str| format!("channels.{name}.{k}");
        let mut redact = Redactor::default();
        let secret = cfg
            .secret_file
            .as_deref()
            .map(|p| read_secret_file(&key("secret_file"), p))
            .transpose()?;
        let token = cfg
            .token_file
            .as_deref()
            .map(|p| read_secret_file(&key("token_file"), p))
            .transpose()?;
        for s in secret.iter().chain(token.iter()) {
            redact.add(s);
        }
        Ok(Webhook {
            client: http_client(attempt_timeout, cfg.ca_file.as_deref())
                .map_err(|e| format!("channels.{name}.{e}"))?,
            url: cfg.url.clone(),
            format: cfg.format,
            secret,
            token,
            redact,
        })
    }
}

impl Transport for Webhook {
    fn send(&self, batch: Vec<Intent>) -> BoxFuture<'static, Verdict> {
        let Some(intent) = batch.into_iter().next() else {
            return Box::pin(async { Verdict::Delivered });
        };
        let (body, content_type) = match self.format {
            WebhookFormat::Ptrain => (render::webhook_body(&intent), "application/json"),
            WebhookFormat::CloudEvents => (
                render::cloudevent_body(&intent),
                render::CLOUDEVENTS_CONTENT_TYPE,
            ),
        };
        let mut req = self
            .client
            .post(self.url.clone())
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .header("Idempotency-Key", &intent.key)
            .header("X-Ptrain-Event", intent.notice.event.as_str());
        if let Some(secret) = &self.secret {
            req = req.header(
                "X-Ptrain-Signature",
                signature(secret.expose().as_bytes(), &body),
            );
        }
        if let Some(token) = &self.token {
            req = req.bearer_auth(token.expose());
        }
        let req = req.body(body);
        let redact = self.redact.clone();
        Box::pin(async move {
            match req.send().await {
                Err(e) => reqwest_error(e, &redact),
                Ok(resp) => {
                    let verdict = classify_http(resp.status().as_u16());
                    if verdict == Verdict::Delivered {
                        return verdict;
                    }
                    let body = body_prefix(resp, 1024).await;
                    with_answer(verdict, &body, &redact)
                }
            }
        })
    }
}

struct WeCom {
    client: reqwest::Client,
    /// With `key=`: never logged.
    url: reqwest::Url,
    format: WeComFormat,
    per_minute: u32,
    redact: Redactor,
}

impl WeCom {
    fn new(
        name: &str,
        cfg: &WeComConfig,
        attempt_timeout: Duration,
        config_path: &Path,
    ) -> Result<WeCom, String> {
        let mut url = cfg.url.clone();
        let mut redact = Redactor::default();
        match &cfg.key_file {
            Some(path) => {
                let key = read_secret_file(&format!("channels.{name}.key_file"), path)?;
                url.query_pairs_mut().append_pair("key", key.expose());
                redact.add(&key);
            }
            None => {
                config_is_root_only(config_path).map_err(|e| {
                    format!("channels.{name}.url holds the robot's key but {e}; chmod 600 the config or move the key to key_file")
                })?;
                for (k, v) in url.query_pairs() {
                    if k == "key" {
                        redact.add(&Secret(v.as_ref().into()));
                    }
                }
            }
        }
        Ok(WeCom {
            client: http_client(attempt_timeout, cfg.ca_file.as_deref())
                .map_err(|e| format!("channels.{name}.{e}"))?,
            url,
            format: cfg.format,
            per_minute: cfg.per_minute,
            redact,
        })
    }
}

/// The robot's JSON for one or several events.
pub fn wecom_message(batch: &[Intent], format: WeComFormat) -> serde_json::Value {
    let markdown = format == WeComFormat::Markdown;
    let content = match batch {
        [one] if markdown => render::wecom_markdown(&one.notice),
        [one] => render::wecom_text(&one.notice),
        many => render::wecom_digest(
            &many.iter().map(|i| &i.notice).collect::<Vec<_>>(),
            markdown,
        ),
    };
    if markdown {
        serde_json::json!({"msgtype": "markdown", "markdown": {"content": content}})
    } else {
        serde_json::json!({"msgtype": "text", "text": {"content": content}})
    }
}

impl Transport for WeCom {
    fn send(&self, batch: Vec<Intent>) -> BoxFuture<'static, Verdict> {
        let message = wecom_message(&batch, self.format);
        let req = self.client.post(self.url.clone()).json(&message);
        let redact = self.redact.clone();
        Box::pin(async move {
            match req.send().await {
                Err(e) => reqwest_error(e, &redact),
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let body = body_prefix(resp, 64 * 1024).await;
                    match classify_wecom(status, &body) {
                        v @ Verdict::Retry(_) if !(200..300).contains(&status) => {
                            with_answer(v, &body, &redact)
                        }
                        v => v,
                    }
                }
            }
        })
    }

    fn max_batch(&self) -> usize {
        super::pacing::MAX_DIGEST
    }

    fn per_minute(&self) -> Option<u32> {
        Some(self.per_minute)
    }
}

/// `X-Ptrain-Key: KEY` on every mail, for filters and for matching a
/// re-sent message to the first.
#[derive(Clone)]
struct PtrainKey(String);

impl Header for PtrainKey {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("X-Ptrain-Key")
    }

    fn parse(s: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(PtrainKey(s.to_owned()))
    }

    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), self.0.clone())
    }
}

struct Email {
    mailer: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    owner_email: BTreeMap<String, String>,
    channel: ChannelConfig,
    host: String,
    redact: Redactor,
}

impl Email {
    fn new(
        channel: &ChannelConfig,
        cfg: &EmailConfig,
        config: &NotificationsConfig,
    ) -> Result<Email, String> {
        let key = |k: &str| format!("channels.{}.{k}", channel.name);
        let mut redact = Redactor::default();
        let tls_params = || -> Result<TlsParameters, String> {
            let mut b = TlsParameters::builder(cfg.smtp_host.clone());
            if let Some(ca) = &cfg.ca_file {
                let pem = std::fs::read(ca).map_err(|e| {
                    format!("{}: cannot read {}: {e}", key("ca_file"), ca.display())
                })?;
                let cert = Certificate::from_pem(&pem).map_err(|e| {
                    format!(
                        "{}: {} is not a PEM certificate: {e}",
                        key("ca_file"),
                        ca.display()
                    )
                })?;
                b = b.add_root_certificate(cert);
            }
            b.build_rustls()
                .map_err(|e| format!("{}: cannot set up TLS: {e}", key("tls")))
        };
        let tls = match cfg.tls {
            SmtpTls::None => Tls::None,
            SmtpTls::StartTls => Tls::Required(tls_params()?),
            SmtpTls::Tls => Tls::Wrapper(tls_params()?),
        };
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&cfg.smtp_host)
            .port(cfg.smtp_port)
            .tls(tls)
            .timeout(Some(config.attempt_timeout));
        if let Some(user) = &cfg.username {
            let password = match &cfg.password_file {
                Some(path) => read_secret_file(&key("password_file"), path)?,
                None => Secret("".into()),
            };
            redact.add(&password);
            builder =
                builder.credentials(Credentials::new(user.clone(), password.expose().to_owned()));
        }
        let from = Mailbox::from_str(&cfg.from).map_err(|e| format!("{}: {e}", key("from")))?;
        Ok(Email {
            mailer: builder.build(),
            from,
            owner_email: config.owner_email.clone(),
            channel: channel.clone(),
            host: config.host(),
            redact,
        })
    }

    fn message(&self, intent: &Intent) -> Result<Message, String> {
        let to = self
            .channel
            .email_recipients(&self.owner_email, &intent.notice.owner);
        if to.is_empty() {
            return Err(format!(
                "no address for user {:?}: add it under [notify.owner_email]",
                intent.notice.owner
            ));
        }
        let mut builder = Message::builder()
            .from(self.from.clone())
            .subject(render::email_subject(&intent.notice))
            .message_id(Some(render::message_id(&intent.key, &self.host)))
            .header(PtrainKey(intent.key.clone()))
            .header(ContentType::TEXT_PLAIN);
        for addr in &to {
            let mailbox =
                Mailbox::from_str(addr).map_err(|e| format!("bad address {addr:?}: {e}"))?;
            builder = builder.to(mailbox);
        }
        builder
            .body(render::body_text(&intent.notice))
            .map_err(|e| format!("cannot build the message: {e}"))
    }
}

impl Transport for Email {
    fn send(&self, batch: Vec<Intent>) -> BoxFuture<'static, Verdict> {
        let Some(intent) = batch.first() else {
            return Box::pin(async { Verdict::Delivered });
        };
        let message = self.message(intent);
        let mailer = self.mailer.clone();
        let redact = self.redact.clone();
        Box::pin(async move {
            let message = match message {
                Ok(m) => m,
                Err(why) => return Verdict::Dead(why),
            };
            match mailer.send(message).await {
                Ok(_) => Verdict::Delivered,
                Err(e) => {
                    let text = redact.clean(&chain(&e));
                    classify_smtp(e.is_permanent(), format!("SMTP: {text}"))
                }
            }
        })
    }
}

/// A channel that could not be set up (a missing or unsafe secret file):
/// its notifications become dead letters naming the problem, so the rest
/// of ptraind keeps running and root sees why.
struct Broken(String);

impl Transport for Broken {
    fn send(&self, _batch: Vec<Intent>) -> BoxFuture<'static, Verdict> {
        let why = format!(
            "{}; fix it, restart ptraind, then `ptrain notifications retry --all-dead`",
            self.0
        );
        Box::pin(async move { Verdict::Dead(why) })
    }
}

/// One transport per configured channel. Problems are logged and the
/// channel's notifications dead-lettered with the reason.
pub fn build_all(config: &NotificationsConfig) -> HashMap<String, Arc<dyn Transport>> {
    let mut out: HashMap<String, Arc<dyn Transport>> = HashMap::new();
    for (name, channel) in &config.channels {
        let built: Result<Arc<dyn Transport>, String> = match &channel.kind {
            ChannelKind::Webhook(cfg) => {
                Webhook::new(name, cfg, config.attempt_timeout).map(|t| Arc::new(t) as _)
            }
            ChannelKind::WeCom(cfg) => {
                WeCom::new(name, cfg, config.attempt_timeout, &config.config_path)
                    .map(|t| Arc::new(t) as _)
            }
            ChannelKind::Email(cfg) => Email::new(channel, cfg, config).map(|t| Arc::new(t) as _),
            ChannelKind::Amqp(cfg) => {
                super::amqp::Amqp::new(name, cfg, config.attempt_timeout).map(|t| Arc::new(t) as _)
            }
            ChannelKind::Kafka(cfg) => super::kafka::Kafka::new(name, cfg, config.attempt_timeout)
                .map(|t| Arc::new(t) as _),
        };
        let transport = built.unwrap_or_else(|why| {
            tracing::error!(channel = %name, "notification channel unusable: {why}");
            Arc::new(Broken(format!("channel {name} is unusable: {why}")))
        });
        out.insert(name.clone(), transport);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn signature_is_hmac_sha256_hex() {
        // RFC 4231 test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn secret_files_must_be_root_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        std::fs::write(&path, "  s3cret\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_secret_file("channels.x.secret_file", &path).unwrap_err();
        assert!(
            e.contains("channels.x.secret_file") && e.contains("chmod 600"),
            "{e}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = read_secret_file("k", &path).unwrap();
        assert_eq!(s.expose(), "s3cret");
        assert!(!format!("{s:?}").contains("s3cret"));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(read_secret_file("k", &link).is_err());
        let e = read_secret_file("k", &dir.path().join("missing")).unwrap_err();
        assert!(e.contains("root-only file"), "{e}");
        std::fs::write(&path, "\n").unwrap();
        assert!(read_secret_file("k", &path).unwrap_err().contains("empty"));
    }

    #[test]
    fn a_key_in_the_url_needs_a_root_only_config() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("ptrain.toml");
        std::fs::write(&config, "").unwrap();
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
        let cfg = WeComConfig {
            url: "https://qyapi.example.com/send?key=topsecret"
                .parse()
                .unwrap(),
            key_file: None,
            ca_file: None,
            format: WeComFormat::Markdown,
            per_minute: 20,
        };
        let e = WeCom::new("ops", &cfg, Duration::from_secs(1), &config)
            .err()
            .unwrap();
        assert!(
            e.contains("channels.ops.url") && e.contains("key_file"),
            "{e}"
        );
        assert!(!e.contains("topsecret"), "{e}");
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let ok = WeCom::new("ops", &cfg, Duration::from_secs(1), &config).unwrap();
            assert_eq!(ok.redact.clean("key=topsecret"), "key=[redacted]");
        }
    }

    #[test]
    fn redactor_hides_every_secret() {
        let mut r = Redactor::default();
        r.add(&Secret("abc123".into()));
        r.add(&Secret("".into()));
        assert_eq!(
            r.clean("key=abc123 and abc123"),
            "key=[redacted] and [redacted]"
        );
    }

    #[test]
    fn wecom_single_and_digest_bodies() {
        let one =
            super::super::sender::tests::intent("a", super::super::NotifyEvent::Failed, "ops");
        let two =
            super::super::sender::tests::intent("b", super::super::NotifyEvent::Succeeded, "ops");
        let m = wecom_message(std::slice::from_ref(&one), WeComFormat::Markdown);
        assert_eq!(m["msgtype"], "markdown");
        assert!(m["markdown"]["content"].as_str().unwrap().contains("job a"));
        let t = wecom_message(&[one.clone(), two], WeComFormat::Text);
        assert_eq!(t["msgtype"], "text");
        let content = t["text"]["content"].as_str().unwrap();
        assert!(
            content.contains("2 job events")
                && content.contains("job a")
                && content.contains("job b"),
            "{content}"
        );
    }

    /// A CA and a server certificate for 127.0.0.1 signed by it: (CA PEM,
    /// server TLS config).
    fn private_ca(name: &str) -> (String, Arc<rustls::ServerConfig>) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} CA"));
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let server_key = rcgen::KeyPair::generate().unwrap();
        let server = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&server_key, &ca_cert, &ca_key)
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into());
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![server.der().clone()], key)
            .unwrap();
        (ca_cert.pem(), Arc::new(config))
    }

    /// An HTTPS endpoint on loopback that answers every request 200 and
    /// counts the requests it read whole.
    async fn https_endpoint(config: Arc<rustls::ServerConfig>) -> (u16, Arc<AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let served = Arc::new(AtomicUsize::new(0));
        let count = served.clone();
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, count) = (acceptor.clone(), count.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    count.fetch_add(1, Ordering::SeqCst);
                    let _ = tls
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        (port, served)
    }

    #[tokio::test]
    async fn a_webhook_behind_a_private_ca_is_trusted_only_through_ca_file() {
        let (ca_pem, server_config) = private_ca("ptrain test");
        let (other_ca_pem, _) = private_ca("someone else's");
        let (port, served) = https_endpoint(server_config).await;
        let dir = tempfile::tempdir().unwrap();
        let webhook = |ca: Option<&str>| {
            let ca_file = ca.map(|pem| {
                let path = dir.path().join("ca.pem");
                std::fs::write(&path, pem).unwrap();
                path
            });
            let cfg = WebhookConfig {
                url: format!("https://127.0.0.1:{port}/hook").parse().unwrap(),
                secret_file: None,
                token_file: None,
                ca_file,
                format: Default::default(),
                events: None,
            };
            Webhook::new("hook", &cfg, Duration::from_secs(5)).unwrap()
        };
        let intent =
            || super::super::sender::tests::intent("a", super::super::NotifyEvent::Failed, "hook");
        // Not trusted by the system's roots, nor by another CA: a retry
        // that says why, and nothing reaches the endpoint.
        for ca in [None, Some(other_ca_pem.as_str())] {
            match webhook(ca).send(vec![intent()]).await {
                Verdict::Retry(why) => assert!(
                    why.to_lowercase().contains("certificate"),
                    "ca {:?}: {why}",
                    ca.map(|_| "other")
                ),
                other => panic!("ca {:?}: {other:?}", ca.map(|_| "other")),
            }
        }
        assert_eq!(served.load(Ordering::SeqCst), 0);
        // Trusted through ca_file: delivered.
        assert_eq!(
            webhook(Some(&ca_pem)).send(vec![intent()]).await,
            Verdict::Delivered
        );
        assert_eq!(served.load(Ordering::SeqCst), 1);
    }
}
