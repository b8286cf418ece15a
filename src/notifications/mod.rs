//! Notifications: when a job starts or ends, the admin-configured channels
//! (email, WeCom group robot, generic webhook; every job's events on an
//! AMQP exchange, [`amqp`], or a Kafka topic, [`kafka`]) hear about it at least once
//! and, as far as the receiver can tell, exactly once.
//!
//! # Path of a notification
//!
//! 1. The state task decides a job started or ended and calls
//!    [`intents_for`]: one [`Intent`] per channel the job asked for (or the
//!    admin's defaults), keyed `JOB.EVENT.CHANNEL`. The intents go into the
//!    job's record in the same durable write as the new state, so a crash
//!    can never record an end without its notifications (the outbox).
//! 2. The intents are handed to the [`Notifier`], whose sender task
//!    ([`sender`]) owns delivery. The state task never waits on the network.
//! 3. The sender keeps one small status file per key in the root-only
//!    `STATE/outbox/` ([`outbox`]): pending, retrying, delivered or dead,
//!    with the attempts and the last error. Per-job cost does not grow with
//!    history, and after a restart every intent whose file does not say
//!    delivered or dead is sent again with the same key.
//! 4. Each attempt goes through a [`transport::Transport`] with a timeout;
//!    its answer is classified ([`retry`]): delivered, retry later
//!    (exponential backoff with jitter, a cap and a lifetime) or dead at
//!    once (a definite rejection). WeCom robots are paced to their 20
//!    messages a minute, piled-up events merged into digests ([`pacing`]).
//!
//! The key travels as the webhook's `Idempotency-Key` header and as the
//! email's deterministic `Message-ID`, so a message re-sent after a crash
//! between the receiver's answer and our record of it can be recognised.
//!
//! Message rendering ([`render`]), retry timing, response classification
//! and pacing are pure and unit-tested without I/O.

pub mod amqp;
pub mod config;
pub mod kafka;
pub mod outbox;
pub mod pacing;
pub mod render;
pub mod retry;
pub mod sender;
pub mod tail;
pub mod transport;

pub use crate::job::NotifyEvent;
use crate::store::JobRecord;
pub use crate::store::{Intent, Notice, NoticeGpu};

pub use config::{ChannelKind, NotificationsConfig};
pub use outbox::{Backlog, Delivery, DeliveryState, DeliveryView};
pub use sender::{DeliveriesError, Notifier, NotifyError, RetryTarget};

pub use crate::spec::notify::{is_valid_channel_name, MAX_CHANNEL_NAME, MAX_JOB_CHANNELS};

/// The idempotency key of one notification: `JOB.EVENT.CHANNEL` for a
/// job's first attempt, `JOB.EVENT-N.CHANNEL` for its attempt N, so each
/// attempt's events are told once each (event words hold no digit, so no
/// two keys are alike).
pub fn key_of(job_id: &str, attempt: u32, event: NotifyEvent, channel: &str) -> String {
    match attempt {
        0 | 1 => format!("{job_id}.{}.{channel}", event.as_str()),
        n => format!("{job_id}.{}-{n}.{channel}", event.as_str()),
    }
}

/// A GPU as notifications show it.
impl Notice {
    pub fn of(record: &JobRecord, event: NotifyEvent, host: &str) -> Notice {
        let mut view = crate::views::JobView::of(record);
        if matches!(event, NotifyEvent::Started | NotifyEvent::GpuLost) {
            // A start tells of the job as it began, even when ptraind first
            // learns of it at its end (a job that ran before it was seen
            // active): no exit, no end, status running.
            view.status = "running".into();
            view.detail = "running".into();
            view.exit_code = None;
            view.signal = None;
            view.ended_at = None;
        }
        Notice {
            job_id: view.id,
            owner: view.owner,
            uid: view.uid,
            event,
            status: view.status,
            detail: view.detail,
            exit_code: view.exit_code,
            signal: view.signal,
            submitted_at: view.submitted_at,
            started_at: view.started_at,
            ended_at: view.ended_at,
            gpus: record
                .gpus
                .iter()
                .map(|g| NoticeGpu {
                    index: g.index,
                    uuid: g.uuid.clone(),
                })
                .collect(),
            host: host.to_owned(),
            unit: view.unit,
            results: (!matches!(
                event,
                NotifyEvent::Submitted | NotifyEvent::Started | NotifyEvent::GpuLost
            ))
            .then(|| record.result.clone())
            .flatten(),
            invocation_id: record.invocation_id.clone(),
            output_tail: None,
        }
    }

    /// How long the job ran, when it has both ends.
    pub fn duration_micros(&self) -> Option<u64> {
        Some(self.ended_at?.saturating_sub(self.started_at?))
    }
}

/// The channels a job's notifications go to: its own `notify`, or the
/// admin's defaults when it names none.
fn channels_of<'a>(config: &'a NotificationsConfig, record: &'a JobRecord) -> &'a [String] {
    match &record.spec.notify {
        Some(list) => list,
        None => &config.default_channels,
    }
}

fn wants(record: &JobRecord, event: NotifyEvent) -> bool {
    match &record.spec.notify_on {
        Some(events) => events.contains(&event),
        // A GPU failing under a job is news its owner wants as much as
        // the end it may cause.
        None => NotifyEvent::ENDS.contains(&event) || event == NotifyEvent::GpuLost,
    }
}

/// The intents to record with a job's transition to `event`, skipping keys
/// the record already holds (a save that failed and is tried again must
/// not add them twice). Pure.
///
/// The channels a job names (or the defaults) hear of the events it wants,
/// its start only once; every stream channel (a message bus) hears of
/// every job's events the admin chose for it, each attempt's start too.
pub fn intents_for(
    config: &NotificationsConfig,
    record: &JobRecord,
    event: NotifyEvent,
    now: u64,
) -> Vec<Intent> {
    let host = config.host();
    let mut out = Vec::new();
    let mut add = |channel: &String| {
        let key = key_of(record.id.as_str(), record.attempt, event, channel);
        if record.notifications.iter().any(|i| i.key == key) {
            return;
        }
        out.push(Intent {
            key,
            channel: channel.clone(),
            created_at: now,
            notice: Notice::of(record, event, &host),
        });
    };
    let told_once = event != NotifyEvent::Started || record.attempt <= 1;
    if told_once && wants(record, event) {
        for channel in channels_of(config, record) {
            let Some(cfg) = config.channels.get(channel) else {
                // Checked at ingestion; the admin removed it since.
                tracing::warn!(job = %record.id, PTRAIN_JOB = %record.id, channel, "job names a channel that is no longer configured; not notifying it");
                continue;
            };
            if cfg.streamed_events().is_some() {
                continue; // told below, with every other job's
            }
            if !cfg.reaches(&config.owner_email, &record.owner.name) {
                tracing::warn!(job = %record.id, PTRAIN_JOB = %record.id, channel, owner = %record.owner.name, "no email address for the job's owner; not notifying this channel");
                continue;
            }
            add(channel);
        }
    }
    for (name, cfg) in &config.channels {
        if cfg
            .streamed_events()
            .is_some_and(|events| events.contains(&event))
        {
            add(name);
        }
    }
    out
}

/// The intents of an event of no job (a refused file, a GPU's health):
/// one for each stream channel the admin sends `notice.event` to, keyed
/// `EVENT.WHICH.CHANNEL`. `which` tells this event from every other of its
/// kind (it starts with the event's time in µs, then names its subject),
/// and its second part, digits, can be no job's event word, so no key is
/// a job's. Pure.
pub fn intents_not_of_a_job(
    config: &NotificationsConfig,
    notice: &Notice,
    which: &str,
    created_at: u64,
) -> Vec<Intent> {
    config
        .channels
        .iter()
        .filter(|(_, cfg)| {
            cfg.streamed_events()
                .is_some_and(|events| events.contains(&notice.event))
        })
        .map(|(name, _)| Intent {
            key: format!("{}.{which}.{name}", notice.event.as_str()),
            channel: name.clone(),
            created_at,
            notice: notice.clone(),
        })
        .collect()
}

/// The subject of a refused file's event is `spool/FILE`, and a GPU's
/// `gpu/UUID`: no job id has a `/`, so no consumer, Kafka partition or
/// log line takes either for a job's (say, another user's job named
/// like the refused file).
pub const REFUSED_SUBJECT_PREFIX: &str = "spool/";
pub const GPU_SUBJECT_PREFIX: &str = "gpu/";

impl Notice {
    /// A refused spool file as an event: its subject is
    /// `spool/` and the file's name (made printable), its detail the
    /// reason its owner was given. `None` when the owner is unknown (the
    /// file went before it could be looked at): no one to name.
    pub fn refused(record: &crate::store::RejectRecord, file: &str, host: &str) -> Option<Notice> {
        let uid = record.uid?;
        Some(Notice {
            job_id: format!("{REFUSED_SUBJECT_PREFIX}{file}"),
            owner: record.owner.clone().unwrap_or_else(|| uid.to_string()),
            uid,
            event: NotifyEvent::Refused,
            status: "refused".into(),
            detail: record.reason.clone(),
            exit_code: None,
            signal: None,
            submitted_at: record.rejected_at,
            started_at: None,
            ended_at: None,
            gpus: Vec::new(),
            host: host.to_owned(),
            unit: String::new(),
            results: None,
            invocation_id: None,
            output_tail: None,
        })
    }

    /// A GPU's health change as an event of the host (owner root): its
    /// subject is `gpu/` and the GPU's UUID, its detail why it left the
    /// pool (or that it is back).
    pub fn gpu_health(gpu: NoticeGpu, unhealthy: Option<&str>, since: u64, host: &str) -> Notice {
        let (event, status, detail) = match unhealthy {
            Some(reason) => (NotifyEvent::GpuUnhealthy, "unhealthy", reason.to_owned()),
            None => (
                NotifyEvent::GpuHealthy,
                "healthy",
                "healthy again and back in the pool".to_owned(),
            ),
        };
        Notice {
            job_id: format!("{GPU_SUBJECT_PREFIX}{}", gpu.uuid),
            owner: "root".into(),
            uid: 0,
            event,
            status: status.into(),
            detail,
            exit_code: None,
            signal: None,
            submitted_at: since,
            started_at: None,
            ended_at: None,
            gpus: vec![gpu],
            host: host.to_owned(),
            unit: String::new(),
            results: None,
            invocation_id: None,
            output_tail: None,
        }
    }
}

/// The ingestion check: every channel a job names must be configured and
/// able to reach it. Returns the reason shown to the job's owner.
pub fn check_job(
    config: &NotificationsConfig,
    notify: Option<&[String]>,
    owner: &str,
) -> Result<(), String> {
    let Some(names) = notify else {
        return Ok(());
    };
    for name in names {
        let Some(channel) = config.channels.get(name) else {
            let known = if config.channels.is_empty() {
                "none are configured".to_owned()
            } else {
                format!(
                    "the configured ones are {}",
                    config
                        .channels
                        .keys()
                        .map(|k| format!("{k:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            return Err(format!(
                "field `notify` names channel {name:?}, which the admin has not configured ({known}); \
                 use a configured channel name or drop it"
            ));
        };
        if !channel.reaches(&config.owner_email, owner) {
            return Err(format!(
                "field `notify` names email channel {name:?}, which mails a job's owner, but no address \
                 is configured for user {owner:?}; ask the admin to add it under [notify.owner_email] or drop the channel"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Outcome;

    fn config() -> NotificationsConfig {
        let text = r#"
            [notify]
            host = "gpu01"
            default_channels = ["ops"]
            owner_email = { alice = "alice@example.com" }
            [channels.ops]
            kind = "webhook"
            url = "https://hooks.example.com/ops"
            [channels.hook]
            kind = "webhook"
            url = "https://hooks.example.com/x"
            [channels.mail]
            kind = "email"
            smtp_host = "smtp.example.com"
            from = "ptrain@example.com"
            to_owner = true
        "#;
        crate::config::Config::from_toml(std::path::Path::new("/etc/ptrain/ptrain.toml"), text)
            .unwrap()
            .notifications
    }

    fn record(json: &str, owner: &str) -> JobRecord {
        crate::store::test_kit::record(json, "job1", crate::store::test_kit::owner(1000, owner), 1)
    }

    fn keys(intents: &[Intent]) -> Vec<&str> {
        intents.iter().map(|i| i.key.as_str()).collect()
    }

    #[test]
    fn descriptor_fields_are_validated() {
        let parse = |extra: &str| {
            crate::spec::parse_spec(
                format!(r#"{{"version": 1, "command": ["true"]{extra}}}"#).as_bytes(),
                "j",
            )
        };
        let spec =
            parse(r#", "notify": ["ops", "alice_mail"], "notify_on": ["started", "idle-timeout"]"#)
                .unwrap();
        assert_eq!(
            spec.notify.as_deref(),
            Some(&["ops".to_owned(), "alice_mail".to_owned()][..])
        );
        assert_eq!(
            spec.notify_on.as_deref(),
            Some(&[NotifyEvent::Started, NotifyEvent::IdleTimeout][..])
        );
        assert_eq!(parse("").unwrap().notify, None);
        let cases = [
            (r#", "notify": "ops""#, "array of channel names"),
            (r#", "notify": [1]"#, "`notify[0]` must be a string"),
            (r#", "notify": ["https://evil.example/x"]"#, "never a URL"),
            (r#", "notify": ["a@b.c"]"#, "never a URL or an address"),
            (r#", "notify": ["ops", "ops"]"#, "twice"),
            (r#", "notify_on": ["ended"]"#, "\"dependency-failed\""),
            (r#", "notify_on": "failed""#, "array of events"),
            (r#", "notify_on": ["failed", "failed"]"#, "twice"),
        ];
        for (extra, want) in cases {
            let e = parse(extra).unwrap_err().to_string();
            assert!(e.contains(want), "{extra}: {e}");
        }
        let many: Vec<String> = (0..=MAX_JOB_CHANNELS)
            .map(|i| format!("\"c{i}\""))
            .collect();
        let e = parse(&format!(r#", "notify": [{}]"#, many.join(","))).unwrap_err();
        assert!(e.to_string().contains("limit of 16"), "{e}");
        // A record written before the fields existed still loads.
        let mut old =
            serde_json::to_value(record(r#"{"version": 1, "command": ["true"]}"#, "alice"))
                .unwrap();
        old.as_object_mut().unwrap().remove("notifications");
        old["spec"].as_object_mut().unwrap().remove("notify");
        let back: JobRecord = serde_json::from_value(old).unwrap();
        assert!(back.notifications.is_empty() && back.spec.notify_on.is_none());
    }

    #[test]
    fn a_start_first_seen_at_the_end_still_tells_of_the_start() {
        let c = config();
        let mut r = record(
            r#"{"version": 1, "command": ["true"], "notify_on": ["started"]}"#,
            "alice",
        );
        r.started_at = Some(10);
        r.ended_at = Some(20);
        r.outcome = Some(Outcome::Succeeded);
        r.result = Some(serde_json::json!({"loss": 0.1}));
        let i = intents_for(&c, &r, NotifyEvent::Started, 30);
        let n = &i[0].notice;
        assert_eq!(
            (n.status.as_str(), n.detail.as_str(), n.started_at),
            ("running", "running", Some(10))
        );
        assert_eq!((n.exit_code, n.ended_at, &n.results), (None, None, &None));
    }

    #[test]
    fn a_lost_gpu_is_told_by_default_once_and_as_running() {
        let c = config();
        let mut r = record(r#"{"version": 1, "command": ["true"]}"#, "alice");
        r.started_at = Some(10);
        r.result = Some(serde_json::json!({"loss": 0.1}));
        assert!(!NotifyEvent::ENDS.contains(&NotifyEvent::GpuLost));
        let i = intents_for(&c, &r, NotifyEvent::GpuLost, 30);
        assert_eq!(keys(&i), ["job1.gpu-lost.ops"]);
        let n = &i[0].notice;
        assert_eq!(
            (n.status.as_str(), n.ended_at, &n.results),
            ("running", None, &None)
        );
        r.notifications = i;
        assert!(
            intents_for(&c, &r, NotifyEvent::GpuLost, 31).is_empty(),
            "once"
        );
        // A job that names its events hears of it only if it names it.
        let r = record(
            r#"{"version": 1, "command": ["true"], "notify_on": ["failed"]}"#,
            "alice",
        );
        assert!(intents_for(&c, &r, NotifyEvent::GpuLost, 1).is_empty());
        let r = record(
            r#"{"version": 1, "command": ["true"], "notify_on": ["gpu-lost"]}"#,
            "alice",
        );
        assert_eq!(
            keys(&intents_for(&c, &r, NotifyEvent::GpuLost, 1)),
            ["job1.gpu-lost.ops"]
        );
    }

    #[test]
    fn intents_follow_the_job_choice_or_the_admin_default() {
        let c = config();
        // No `notify`: the default channel, on every end, not on start.
        let mut r = record(r#"{"version": 1, "command": ["true"]}"#, "alice");
        assert!(intents_for(&c, &r, NotifyEvent::Started, 5).is_empty());
        r.outcome = Some(Outcome::Failed { exit_code: 3 });
        let i = intents_for(&c, &r, NotifyEvent::Failed, 5);
        assert_eq!(keys(&i), ["job1.failed.ops"]);
        assert_eq!(i[0].created_at, 5);
        assert_eq!(i[0].notice.host, "gpu01");
        assert_eq!(i[0].notice.exit_code, Some(3));
        // Already recorded (a save tried again): not added twice.
        r.notifications = i;
        assert!(intents_for(&c, &r, NotifyEvent::Failed, 6).is_empty());

        let r = record(
            r#"{"version": 1, "command": ["true"], "notify": ["hook", "mail"], "notify_on": ["started", "timeout"]}"#,
            "alice",
        );
        assert_eq!(
            keys(&intents_for(&c, &r, NotifyEvent::Started, 1)),
            ["job1.started.hook", "job1.started.mail"]
        );
        assert!(intents_for(&c, &r, NotifyEvent::Succeeded, 1).is_empty());
        // An explicit empty list opts out of the defaults.
        let r = record(
            r#"{"version": 1, "command": ["true"], "notify": []}"#,
            "alice",
        );
        assert!(intents_for(&c, &r, NotifyEvent::Failed, 1).is_empty());
        // Bob has no address: the mail channel is skipped for him.
        let r = record(
            r#"{"version": 1, "command": ["true"], "notify": ["mail", "hook"]}"#,
            "bob",
        );
        assert_eq!(
            keys(&intents_for(&c, &r, NotifyEvent::Stopped, 1)),
            ["job1.stopped.hook"]
        );
    }

    #[test]
    fn ingestion_rejects_unknown_or_unreachable_channels() {
        let c = config();
        assert!(check_job(&c, None, "bob").is_ok());
        assert!(check_job(&c, Some(&["hook".into(), "mail".into()]), "alice").is_ok());
        let e = check_job(&c, Some(&["nope".into()]), "alice").unwrap_err();
        assert!(
            e.contains("\"nope\"") && e.contains("\"hook\", \"mail\", \"ops\""),
            "{e}"
        );
        let e = check_job(&c, Some(&["mail".into()]), "bob").unwrap_err();
        assert!(
            e.contains("[notify.owner_email]") && e.contains("\"bob\""),
            "{e}"
        );
        let none = NotificationsConfig::default();
        let e = check_job(&none, Some(&["hook".into()]), "alice").unwrap_err();
        assert!(e.contains("none are configured"), "{e}");
    }

    #[test]
    fn channel_names_are_one_dotless_component() {
        for ok in ["hook", "ops-wecom", "alice_mail", "A1"] {
            assert!(is_valid_channel_name(ok), "{ok}");
        }
        for bad in ["", "-x", "a.b", "a/b", "..", "ä", &"x".repeat(65)] {
            assert!(!is_valid_channel_name(bad), "{bad}");
        }
        assert_eq!(
            key_of("run.1", 1, NotifyEvent::IdleTimeout, "hook"),
            "run.1.idle-timeout.hook"
        );
    }

    fn with_bus(events: &str) -> NotificationsConfig {
        let text = format!(
            r#"
            [notify]
            default_channels = ["ops"]
            [channels.ops]
            kind = "webhook"
            url = "https://hooks.example.com/ops"
            [channels.bus]
            kind = "amqp"
            url = "amqp://rabbit.example.com/%2f"
            exchange = "ptrain.events"
            {events}
        "#
        );
        crate::config::Config::from_toml(std::path::Path::new("/etc/ptrain/ptrain.toml"), &text)
            .unwrap()
            .notifications
    }

    #[test]
    fn a_stream_hears_every_jobs_chosen_events_whatever_the_job_asked() {
        let c = with_bus("");
        // A job that wants no notification at all still reaches the bus.
        let mut r = record(r#"{"version":1,"command":["true"],"notify":[]}"#, "bob");
        assert_eq!(
            keys(&intents_for(&c, &r, NotifyEvent::Started, 1)),
            ["job1.started.bus"]
        );
        // Its submission too, which the job's own channels hear of only
        // when its notify_on names it.
        let told = record(r#"{"version":1,"command":["true"]}"#, "bob");
        assert_eq!(
            keys(&intents_for(&c, &told, NotifyEvent::Submitted, 1)),
            ["job1.submitted.bus"]
        );
        let asked = record(
            r#"{"version":1,"command":["true"],"notify_on":["submitted"]}"#,
            "bob",
        );
        assert_eq!(
            keys(&intents_for(&c, &asked, NotifyEvent::Submitted, 1)),
            ["job1.submitted.ops", "job1.submitted.bus"]
        );
        // Each attempt's start, where a job's own channels hear of the first.
        r.attempt = 2;
        assert_eq!(
            keys(&intents_for(&c, &r, NotifyEvent::Started, 2)),
            ["job1.started-2.bus"]
        );
        assert_eq!(
            keys(&intents_for(&c, &r, NotifyEvent::Retry, 2)),
            ["job1.retry-2.bus"]
        );
        // Defaults and the bus together; a job naming the bus is told once.
        let r = record(
            r#"{"version":1,"command":["true"],"notify":["bus","ops"]}"#,
            "bob",
        );
        assert_eq!(
            keys(&intents_for(&c, &r, NotifyEvent::Failed, 3)),
            ["job1.failed.ops", "job1.failed.bus"]
        );
        // The admin's choice of events.
        let c = with_bus(r#"events = ["failed"]"#);
        assert!(intents_for(&c, &r, NotifyEvent::Started, 4).is_empty());
        assert_eq!(
            keys(&intents_for(&c, &r, NotifyEvent::Failed, 4)),
            ["job1.failed.ops", "job1.failed.bus"]
        );
    }

    #[test]
    fn an_amqp_channel_is_checked_with_the_fix() {
        let bad = |extra: &str| {
            let text = format!("[channels.bus]\nkind = \"amqp\"\n{extra}\n");
            crate::config::Config::from_toml(std::path::Path::new("/etc/ptrain/ptrain.toml"), &text)
                .unwrap_err()
                .to_string()
        };
        let url = "url = \"amqp://rabbit/%2f\"";
        for (extra, says) in [
            ("exchange = \"x\"".to_owned(), "url"),
            (format!("{url}\n"), "must name the exchange"),
            (
                "url = \"http://rabbit/\"\nexchange = \"x\"".to_owned(),
                "not an AMQP URL",
            ),
            (
                "url = \"amqp://u:p@rabbit/%2f\"\nexchange = \"x\"".to_owned(),
                "password_file",
            ),
            (
                format!("{url}\nexchange = \"x\"\nusername = \"u\""),
                "go together",
            ),
            (
                format!("{url}\nexchange = \"x\"\nevents = [\"ended\"]"),
                "\"succeeded\"",
            ),
            (
                format!("{url}\nexchange = \"x\"\nevents = []"),
                "would get nothing",
            ),
            (
                format!("{url}\nexchange = \"x\"\nformat = \"ptrain\""),
                "does not apply",
            ),
        ] {
            let e = bad(&extra);
            assert!(e.contains(says), "{extra}: {e}");
        }
    }

    #[test]
    fn events_of_no_job_go_to_the_streams_that_take_them_only() {
        let text = r#"
            [notify]
            host = "gpu01"
            default_channels = ["ops"]
            [channels.ops]
            kind = "webhook"
            url = "https://hooks.example.com/ops"
            [channels.bus]
            kind = "webhook"
            url = "https://hooks.example.com/bus"
            format = "cloudevents"
            events = ["refused", "gpu-unhealthy"]
            [channels.all]
            kind = "amqp"
            url = "amqp://rabbit/%2f"
            exchange = "x"
            events = ["all"]
            [channels.legacy]
            kind = "amqp"
            url = "amqp://rabbit/%2f"
            exchange = "x"
        "#;
        let c =
            crate::config::Config::from_toml(std::path::Path::new("/etc/ptrain/ptrain.toml"), text)
                .unwrap()
                .notifications;
        // A webhook that lists events is a stream; one that does not is not.
        assert!(c.channels["bus"].ordered());
        assert!(!c.channels["ops"].ordered());
        let rejection = crate::store::RejectRecord {
            file: "x.json".into(),
            uid: Some(1000),
            owner: Some("alice".into()),
            rejected_at: 42,
            reason: "bad".into(),
            saved_as: None,
            dev: None,
            ino: None,
            ctime_ns: None,
            notifications: Vec::new(),
        };
        let notice = Notice::refused(&rejection, "x.json", "gpu01").unwrap();
        let i = intents_not_of_a_job(&c, &notice, "42-x.json", 42);
        assert_eq!(keys(&i), ["refused.42-x.json.all", "refused.42-x.json.bus"]);
        // Nobody to name: no event.
        let unknown = crate::store::RejectRecord {
            uid: None,
            ..rejection
        };
        assert!(Notice::refused(&unknown, "x.json", "gpu01").is_none());
        let gpu = NoticeGpu {
            index: 1,
            uuid: "GPU-1".into(),
        };
        let back = Notice::gpu_health(gpu.clone(), None, 7, "gpu01");
        assert_eq!(back.event, NotifyEvent::GpuHealthy);
        let i = intents_not_of_a_job(&c, &back, "7-GPU-1", 7);
        assert_eq!(keys(&i), ["gpu-healthy.7-GPU-1.all"]);
        let out = Notice::gpu_health(gpu, Some("ECC"), 7, "gpu01");
        assert_eq!(
            crate::notifications::render::title(&out),
            "GPU 1 (GPU-1) on gpu01 left the pool: ECC"
        );
        // A job's own events never reach a stream as a host's, and a job
        // naming no channel tells the job-named channels nothing here.
        let r = record(r#"{"version": 1, "command": ["true"]}"#, "alice");
        let i = intents_for(&c, &r, NotifyEvent::Succeeded, 1);
        assert_eq!(
            keys(&i),
            [
                "job1.succeeded.ops",
                "job1.succeeded.all",
                "job1.succeeded.legacy"
            ]
        );
        // A stream that names no events (one set up before events of no
        // job existed) gets every event of a job and none of the others.
        let legacy = c.channels["legacy"].streamed_events().unwrap();
        assert!(NotifyEvent::ALL
            .into_iter()
            .all(|e| legacy.contains(&e) == e.is_of_a_job()));
        // A webhook stream's `events` is checked like a bus's.
        let bad = crate::config::Config::from_toml(
            std::path::Path::new("/etc/ptrain/ptrain.toml"),
            "[channels.h]\nkind = \"webhook\"\nurl = \"https://h.example/\"\nevents = [\"ended\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            bad.contains("channels.h.events[0]") && bad.contains("\"refused\""),
            "{bad}"
        );
        // A job naming a stream is accepted; the stream hears what its
        // `events` lists, of every job, once (`notify_on` does not narrow
        // it, nor does naming it add to it).
        assert_eq!(check_job(&c, Some(&["bus".to_owned()]), "alice"), Ok(()));
        let named = record(
            r#"{"version": 1, "command": ["true"], "notify": ["bus"], "notify_on": ["failed"]}"#,
            "alice",
        );
        let i = intents_for(&c, &named, NotifyEvent::Submitted, 1);
        assert_eq!(keys(&i), ["job1.submitted.all", "job1.submitted.legacy"]);
        // "bus" takes refusals and GPU health only: naming it adds nothing.
        let i = intents_for(&c, &named, NotifyEvent::Failed, 1);
        assert_eq!(keys(&i), ["job1.failed.all", "job1.failed.legacy"]);
        // And a job cannot ask for an event of no job.
        let why =
            crate::spec::notify::parse_notify_on(&serde_json::json!(["gpu-healthy"])).unwrap_err();
        assert!(why.contains("no event of a job"), "{why}");
    }

    #[test]
    fn a_kafka_channel_is_checked_with_the_fix() {
        let parse = |extra: &str| {
            let text = format!("[channels.stream]\nkind = \"kafka\"\n{extra}\n");
            crate::config::Config::from_toml(std::path::Path::new("/etc/ptrain/ptrain.toml"), &text)
        };
        let servers = "bootstrap_servers = [\"kafka1:9093\", \"10.0.0.2:9092\"]";
        let good = parse(&format!(
            "{servers}\ntopic = \"ptrain.events\"\ntls = \"tls\"\nsasl_mechanism = \"scram-sha-512\"\nusername = \"ptrain\"\npassword_file = \"/etc/ptrain/kafka.password\"\nevents = [\"failed\"]"
        ))
        .unwrap();
        let channel = &good.notifications.channels["stream"];
        assert_eq!(channel.streamed_events(), Some(&[NotifyEvent::Failed][..]));
        assert!(channel.ordered());
        let super::config::ChannelKind::Kafka(k) = &channel.kind else {
            panic!("{channel:?}")
        };
        assert_eq!(k.bootstrap_servers, ["kafka1:9093", "10.0.0.2:9092"]);
        assert!(k.tls);
        assert_eq!(k.sasl, Some(super::config::KafkaSasl::ScramSha512));
        let topic = "topic = \"t\"";
        for (extra, says) in [
            (topic.to_owned(), "bootstrap_servers"),
            (
                format!("bootstrap_servers = [\"kafka://k:9092\"]\n{topic}"),
                "not host:port",
            ),
            (
                "bootstrap_servers = [\"k\"]\ntopic = \"t\"".to_owned(),
                "not host:port",
            ),
            (
                "bootstrap_servers = [\"k1:9092,k2:9092\"]\ntopic = \"t\"".to_owned(),
                "not host:port",
            ),
            (
                "bootstrap_servers = [\"::1:9092\"]\ntopic = \"t\"".to_owned(),
                "not host:port",
            ),
            (
                "bootstrap_servers = [\"[::1]:9093\"]\ntopic = \"t\"\ntls = \"tls\"".to_owned(),
                "IPv6",
            ),
            (servers.to_owned(), "must name the topic"),
            (format!("{servers}\ntopic = \"a/b\""), "must name the topic"),
            (format!("{servers}\n{topic}\ntls = \"starttls\""), "not a Kafka TLS mode"),
            (
                format!("{servers}\n{topic}\nca_file = \"/etc/ca.pem\""),
                "only with tls",
            ),
            (
                format!("{servers}\n{topic}\nusername = \"u\""),
                "is missing: sasl_mechanism, username",
            ),
            (
                format!("{servers}\n{topic}\nsasl_mechanism = \"gssapi\""),
                "not a SASL mechanism",
            ),
            (
                format!("{servers}\n{topic}\nsasl_mechanism = \"plain\"\nusername = \"u\"\npassword_file = \"/p\""),
                "sends the password as it is",
            ),
            (format!("{servers}\n{topic}\nexchange = \"x\""), "does not apply"),
            (format!("{servers}\n{topic}\nevents = []"), "would get nothing"),
        ] {
            let e = parse(&extra).unwrap_err().to_string();
            assert!(e.contains(says), "{extra}: {e}");
        }
    }
}
