//! What notifications say: the email subject and body, WeCom text and
//! markdown (single and digest), and the webhook's JSON. Pure.
//!
//! A title names the job, the outcome and how long it ran; a body adds the
//! exit status, the GPUs, the host and the command that shows the logs.

use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;

use super::{Intent, Notice, NotifyEvent};
use crate::display::escape;
use crate::job::signal_name;

/// Longest piece of free text (the outcome's detail) put in a message.
const MAX_DETAIL: usize = 160;
/// Output lines in a WeCom message, and the bytes of each: the facts and
/// these fit the robot's 2048 bytes of text with room to spare.
const WECOM_TAIL_LINES: usize = 5;
const WECOM_TAIL_LINE_MAX: usize = 120;
/// WeCom's limits on one message's content, in bytes.
pub const WECOM_TEXT_MAX: usize = 2048;
pub const WECOM_MARKDOWN_MAX: usize = 4096;

fn time(micros: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_micros(micros)).to_string()
}

fn duration(micros: u64) -> String {
    let secs = micros / 1_000_000;
    if secs == 0 {
        return "0s".to_owned();
    }
    humantime::format_duration(Duration::from_secs(secs)).to_string()
}

/// Cuts text to at most `max` bytes on a character boundary.
pub(crate) fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The outcome in a few words: "succeeded", "failed (exit code 3)".
pub fn outcome_words(n: &Notice) -> String {
    match n.event {
        NotifyEvent::Submitted => "was submitted".into(),
        NotifyEvent::Started => "started".into(),
        NotifyEvent::Succeeded => "succeeded".into(),
        NotifyEvent::Timeout => "timed out".into(),
        NotifyEvent::IdleTimeout => "was stopped for being idle".into(),
        NotifyEvent::DependencyFailed => "did not run: a dependency failed".into(),
        NotifyEvent::NotNeeded => "did not run: not needed".into(),
        NotifyEvent::Stopped => "was stopped".into(),
        NotifyEvent::GpuLost => "lost a GPU".into(),
        NotifyEvent::Refused => "was refused".into(),
        NotifyEvent::GpuUnhealthy => "left the pool".into(),
        NotifyEvent::GpuHealthy => "is back in the pool".into(),
        // The detail says which attempt ended how, and when the next runs.
        NotifyEvent::Retry => format!("runs again: {}", n.detail),
        NotifyEvent::Failed => match (n.exit_code, n.signal) {
            (Some(code), _) => format!("failed (exit code {code})"),
            (None, Some(sig)) => format!("failed (killed by {})", signal_name(sig)),
            _ if n.status == "launch-failed" => "could not be launched".into(),
            _ => "failed".into(),
        },
    }
}

/// One line: "job resnet-lr01 failed (exit code 3) after 6h 2m".
pub fn title(n: &Notice) -> String {
    match n.event {
        NotifyEvent::Refused => {
            return format!(
                "job file {} was refused: {}",
                n.job_id
                    .strip_prefix(super::REFUSED_SUBJECT_PREFIX)
                    .unwrap_or(&n.job_id),
                clip(&n.detail, 200)
            )
        }
        NotifyEvent::GpuUnhealthy | NotifyEvent::GpuHealthy => {
            let index = n
                .gpus
                .first()
                .map_or(String::new(), |g| format!(" {}", g.index));
            let mut t = format!(
                "GPU{index} ({}) on {} {}",
                n.job_id
                    .strip_prefix(super::GPU_SUBJECT_PREFIX)
                    .unwrap_or(&n.job_id),
                n.host,
                outcome_words(n)
            );
            if n.event == NotifyEvent::GpuUnhealthy {
                t.push_str(&format!(": {}", clip(&n.detail, 200)));
            }
            return t;
        }
        _ => {}
    }
    let mut t = format!("job {} {}", n.job_id, outcome_words(n));
    match (n.event, n.duration_micros()) {
        (NotifyEvent::Submitted | NotifyEvent::Started | NotifyEvent::GpuLost, _) => {
            t.push_str(&format!(" on {}", n.host))
        }
        (_, Some(d)) => t.push_str(&format!(" after {}", duration(d))),
        _ => {}
    }
    t
}

pub fn email_subject(n: &Notice) -> String {
    format!("[ptrain] {}", title(n))
}

fn gpus(n: &Notice) -> String {
    if n.gpus.is_empty() {
        return "none".into();
    }
    n.gpus
        .iter()
        .map(|g| format!("{} ({})", g.index, g.uuid))
        .collect::<Vec<_>>()
        .join(", ")
}

fn exit_status(n: &Notice) -> Option<String> {
    match (n.exit_code, n.signal) {
        (Some(code), _) => Some(format!("exit code {code}")),
        (None, Some(sig)) => Some(format!("killed by signal {}", signal_name(sig))),
        _ => None,
    }
}

/// The job's last output lines: the last `max_lines`, each cut to
/// `line_max` bytes. Already escaped when they were read ([`super::tail`]).
fn tail_lines(n: &Notice, max_lines: usize, line_max: usize) -> impl Iterator<Item = String> + '_ {
    let lines = n.output_tail.as_deref().unwrap_or(&[]);
    lines[lines.len().saturating_sub(max_lines)..]
        .iter()
        .map(move |l| clip(l, line_max))
}

/// The facts, one per line, then the last lines of output, for email.
pub fn body_text(n: &Notice) -> String {
    body_with_tail(n, usize::MAX, usize::MAX)
}

fn body_with_tail(n: &Notice, max_lines: usize, line_max: usize) -> String {
    let mut lines = vec![
        format!("Job {} of {} {}.", n.job_id, n.owner, outcome_words(n)),
        String::new(),
        // The detail may quote what the job's owner wrote (a workdir in a
        // launch error): escaped like every text form shows it. The
        // webhook's JSON keeps it exact.
        format!(
            "Status:    {} — {}",
            n.status,
            clip(&escape(&n.detail), MAX_DETAIL)
        ),
    ];
    if let Some(status) = exit_status(n) {
        lines.push(format!("Exit:      {status}"));
    }
    lines.push(format!("Host:      {}", n.host));
    lines.push(format!("GPUs:      {}", gpus(n)));
    lines.push(format!("Submitted: {}", time(n.submitted_at)));
    if let Some(t) = n.started_at {
        lines.push(format!("Started:   {}", time(t)));
    }
    if let Some(t) = n.ended_at {
        lines.push(format!("Ended:     {}", time(t)));
    }
    if let Some(d) = n.duration_micros() {
        lines.push(format!("Ran for:   {}", duration(d)));
    }
    lines.push(format!("Logs:      ptrain logs {}", n.job_id));
    let tail: Vec<String> = tail_lines(n, max_lines, line_max).collect();
    if !tail.is_empty() {
        lines.push(String::new());
        lines.push("Last lines of output:".into());
        lines.extend(tail.into_iter().map(|l| format!("  {l}")));
    }
    lines.join("\n") + "\n"
}

/// Markdown must not let job-supplied text (a path in a launch error)
/// turn into mentions or links.
fn md_safe(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '<' => '‹',
            '>' => '›',
            '[' => '(',
            ']' => ')',
            '`' => '\'',
            '\n' | '\r' => ' ',
            c => c,
        })
        .collect()
}

fn md_color(n: &Notice) -> &'static str {
    match n.event {
        NotifyEvent::Succeeded | NotifyEvent::Started | NotifyEvent::Submitted => "info",
        NotifyEvent::Stopped | NotifyEvent::NotNeeded => "comment",
        _ => "warning",
    }
}

pub fn wecom_markdown(n: &Notice) -> String {
    let mut s = format!(
        "**job {}** <font color=\"{}\">{}</font>\n",
        n.job_id,
        md_color(n),
        md_safe(&outcome_words(n))
    );
    s.push_str(&format!(
        "> {}\n",
        md_safe(&clip(&escape(&n.detail), MAX_DETAIL))
    ));
    s.push_str(&format!("> owner: {}  host: {}\n", n.owner, n.host));
    if let Some(status) = exit_status(n) {
        s.push_str(&format!("> {status}\n"));
    }
    s.push_str(&format!("> GPUs: {}\n", md_safe(&gpus(n))));
    if let Some(d) = n.duration_micros() {
        s.push_str(&format!("> ran for: {}\n", duration(d)));
    }
    s.push_str(&format!("> logs: `ptrain logs {}`", n.job_id));
    let tail: Vec<String> = tail_lines(n, WECOM_TAIL_LINES, WECOM_TAIL_LINE_MAX).collect();
    if !tail.is_empty() {
        s.push_str("\n> last output:");
        for line in tail {
            s.push_str(&format!(
                "\n> <font color=\"comment\">{}</font>",
                md_safe(&line)
            ));
        }
    }
    clip(&s, WECOM_MARKDOWN_MAX)
}

pub fn wecom_text(n: &Notice) -> String {
    clip(
        &format!(
            "[ptrain] {}\n{}",
            title(n),
            body_with_tail(n, WECOM_TAIL_LINES, WECOM_TAIL_LINE_MAX)
        ),
        WECOM_TEXT_MAX,
    )
}

/// One line of a digest, bounded so [`super::pacing::MAX_DIGEST`] lines fit.
fn digest_line(n: &Notice, markdown: bool) -> String {
    let mut line = title(n);
    if markdown {
        line = format!(
            "- <font color=\"{}\">{}</font>",
            md_color(n),
            md_safe(&line)
        );
    } else {
        line = format!("- {line}");
    }
    clip(&line, 250)
}

/// Several events in one message, oldest first.
pub fn wecom_digest(notices: &[&Notice], markdown: bool) -> String {
    let head = format!(
        "[ptrain] {} job events on {}",
        notices.len(),
        notices.first().map(|n| n.host.as_str()).unwrap_or("?")
    );
    let mut s = if markdown {
        format!("**{head}**\n")
    } else {
        format!("{head}\n")
    };
    for n in notices {
        s.push_str(&digest_line(n, markdown));
        s.push('\n');
    }
    s.push_str("`ptrain list` and `ptrain status ID` show details");
    let max = if markdown {
        WECOM_MARKDOWN_MAX
    } else {
        WECOM_TEXT_MAX
    };
    clip(&s, max)
}

/// The generic webhook's JSON body, schema `ptrain.notification/1`.
/// Fields are only ever added, never renamed or removed.
#[derive(Debug, Serialize)]
pub struct WebhookPayload<'a> {
    pub schema: &'static str,
    /// Also sent as the `Idempotency-Key` header.
    pub key: &'a str,
    pub event: NotifyEvent,
    pub job_id: &'a str,
    /// The job's name; jobs are named by their id.
    pub job_name: &'a str,
    pub owner: &'a str,
    pub uid: u32,
    pub status: &'a str,
    pub detail: &'a str,
    pub title: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub signal_name: Option<String>,
    /// RFC 3339, UTC.
    pub submitted_at: String,
    pub started_at: Option<String>,
    pub ended_at: Option<String>,
    pub duration_secs: Option<u64>,
    pub gpus: &'a [super::NoticeGpu],
    pub host: &'a str,
    pub unit: &'a str,
    pub logs_command: String,
    /// What the job wrote to its result file (`$PTRAIN_RESULT_FILE`), or null.
    pub results: Option<&'a serde_json::Value>,
    /// The last lines of the job's output, oldest first: at most 20, each
    /// at most 200 bytes with control characters escaped; empty for a
    /// start, a job that never ran, or when the journal could not be read.
    pub output_tail: &'a [String],
}

pub const WEBHOOK_SCHEMA: &str = "ptrain.notification/1";

pub fn webhook_payload(intent: &Intent) -> WebhookPayload<'_> {
    let n = &intent.notice;
    WebhookPayload {
        schema: WEBHOOK_SCHEMA,
        key: &intent.key,
        event: n.event,
        job_id: &n.job_id,
        job_name: &n.job_id,
        owner: &n.owner,
        uid: n.uid,
        status: &n.status,
        detail: &n.detail,
        title: title(n),
        exit_code: n.exit_code,
        signal: n.signal,
        signal_name: n.signal.map(signal_name),
        submitted_at: time(n.submitted_at),
        started_at: n.started_at.map(time),
        ended_at: n.ended_at.map(time),
        duration_secs: n.duration_micros().map(|d| d / 1_000_000),
        gpus: &n.gpus,
        host: &n.host,
        unit: &n.unit,
        logs_command: match n.event {
            NotifyEvent::Refused => "ptrain rejected".into(),
            NotifyEvent::GpuUnhealthy | NotifyEvent::GpuHealthy => "ptrain gpus".into(),
            _ => format!("ptrain logs {}", n.job_id),
        },
        results: n.results.as_ref(),
        output_tail: n.output_tail.as_deref().unwrap_or(&[]),
    }
}

/// The webhook body: the payload as compact JSON. The signature covers
/// exactly these bytes.
pub fn webhook_body(intent: &Intent) -> Vec<u8> {
    serde_json::to_vec(&webhook_payload(intent)).expect("payloads always serialise")
}

/// The CloudEvents spec version of [`cloudevent`].
pub const CLOUDEVENTS_VERSION: &str = "1.0";
/// The prefix of the `type` of a job's event (and a refused job file's):
/// `org.ptrain.job.succeeded`.
pub const CLOUDEVENT_TYPE_PREFIX: &str = "org.ptrain.job.";
/// The prefix of the `type` of a host's event: `org.ptrain.host.gpu-unhealthy`.
pub const CLOUDEVENT_HOST_TYPE_PREFIX: &str = "org.ptrain.host.";

/// An event's CloudEvents `type`.
pub fn cloudevent_type(event: NotifyEvent) -> String {
    match event {
        NotifyEvent::GpuUnhealthy | NotifyEvent::GpuHealthy => {
            format!("{CLOUDEVENT_HOST_TYPE_PREFIX}{}", event.as_str())
        }
        _ => format!("{CLOUDEVENT_TYPE_PREFIX}{}", event.as_str()),
    }
}
/// The media type of an event in structured mode.
pub const CLOUDEVENTS_CONTENT_TYPE: &str = "application/cloudevents+json; charset=utf-8";

/// A notification as a CloudEvents 1.0 event (structured mode): `id` is
/// the idempotency key, so a consumer that drops ids it has seen sees each
/// event once however often it is sent; `source` names the host,
/// `subject` the job, `time` when the state change was recorded, and
/// `data` is the webhook payload ([`webhook_payload`]). Described by
/// `packaging/schema/ptrain-cloudevent.schema.json`.
#[derive(Debug, Serialize)]
pub struct CloudEvent<'a> {
    pub specversion: &'static str,
    pub id: &'a str,
    pub source: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub subject: &'a str,
    pub time: String,
    pub datacontenttype: &'static str,
    pub data: WebhookPayload<'a>,
}

pub fn cloudevent(intent: &Intent) -> CloudEvent<'_> {
    let n = &intent.notice;
    CloudEvent {
        specversion: CLOUDEVENTS_VERSION,
        id: &intent.key,
        source: format!("ptrain://{}", n.host),
        kind: cloudevent_type(n.event),
        subject: &n.job_id,
        time: humantime::format_rfc3339_micros(
            UNIX_EPOCH + Duration::from_micros(intent.created_at),
        )
        .to_string(),
        datacontenttype: "application/json",
        data: webhook_payload(intent),
    }
}

/// [`cloudevent`] as compact JSON: the body a `format = "cloudevents"`
/// webhook posts and signs.
pub fn cloudevent_body(intent: &Intent) -> Vec<u8> {
    serde_json::to_vec(&cloudevent(intent)).expect("events always serialise")
}

/// The email's Message-ID: the key when it is a valid dot-atom (job ids
/// may hold "..", which is not), else its hex; either way deterministic,
/// so a message re-sent after a crash carries the same id.
pub fn message_id(key: &str, host: &str) -> String {
    let left = if key.contains("..") {
        format!("x{}", hex::encode(key))
    } else {
        key.to_owned()
    };
    let host: String = host
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
        .collect();
    let host = host.trim_matches('.');
    let host = if host.is_empty() { "localhost" } else { host };
    format!("<{left}@ptrain.{host}>")
}

#[cfg(test)]
mod tests {
    use super::super::{NoticeGpu, NotifyEvent};
    use super::*;

    const H: u64 = 3_600_000_000;

    pub(crate) fn notice(event: NotifyEvent) -> Notice {
        Notice {
            job_id: "resnet-lr01".into(),
            owner: "alice".into(),
            uid: 1000,
            event,
            status: match event {
                NotifyEvent::Failed => "failed".into(),
                NotifyEvent::Started => "running".into(),
                e => e.as_str().into(),
            },
            detail: match event {
                NotifyEvent::Failed => "failed with exit code 3".into(),
                _ => "succeeded".into(),
            },
            exit_code: match event {
                NotifyEvent::Failed => Some(3),
                NotifyEvent::Succeeded => Some(0),
                _ => None,
            },
            signal: None,
            submitted_at: 1_700_000_000_000_000,
            started_at: Some(1_700_000_000_000_000),
            ended_at: (event != NotifyEvent::Started)
                .then_some(1_700_000_000_000_000 + 6 * H + 2 * 60_000_000 + 3_000_000),
            gpus: vec![
                NoticeGpu {
                    index: 0,
                    uuid: "GPU-0".into(),
                },
                NoticeGpu {
                    index: 1,
                    uuid: "GPU-1".into(),
                },
            ],
            host: "gpu01".into(),
            unit: "ptrain-job@resnet-lr01.service".into(),
            results: Some(serde_json::json!({"accuracy": 0.93})),
            invocation_id: None,
            output_tail: None,
        }
    }

    #[test]
    fn titles_say_job_outcome_and_duration() {
        assert_eq!(
            title(&notice(NotifyEvent::Succeeded)),
            "job resnet-lr01 succeeded after 6h 2m 3s"
        );
        assert_eq!(
            title(&notice(NotifyEvent::Failed)),
            "job resnet-lr01 failed (exit code 3) after 6h 2m 3s"
        );
        assert_eq!(
            title(&notice(NotifyEvent::Started)),
            "job resnet-lr01 started on gpu01"
        );
        assert_eq!(
            title(&notice(NotifyEvent::GpuLost)),
            "job resnet-lr01 lost a GPU on gpu01"
        );
        let mut killed = notice(NotifyEvent::Failed);
        killed.exit_code = None;
        killed.signal = Some(libc::SIGSEGV);
        assert!(title(&killed).contains("killed by SIGSEGV"));
        assert_eq!(
            email_subject(&notice(NotifyEvent::Timeout)),
            "[ptrain] job resnet-lr01 timed out after 6h 2m 3s"
        );
        let mut skipped = notice(NotifyEvent::NotNeeded);
        skipped.started_at = None;
        assert_eq!(title(&skipped), "job resnet-lr01 did not run: not needed");
        assert_eq!(md_color(&skipped), "comment");
    }

    #[test]
    fn body_has_exit_status_gpus_and_logs_command() {
        let body = body_text(&notice(NotifyEvent::Failed));
        for want in [
            "Job resnet-lr01 of alice failed (exit code 3).",
            "Exit:      exit code 3",
            "GPUs:      0 (GPU-0), 1 (GPU-1)",
            "Host:      gpu01",
            "Started:   2023-11-14T22:13:20Z",
            "Ran for:   6h 2m 3s",
            "Logs:      ptrain logs resnet-lr01",
        ] {
            assert!(body.contains(want), "missing {want:?} in\n{body}");
        }
        let md = wecom_markdown(&notice(NotifyEvent::Failed));
        assert!(
            md.contains("<font color=\"warning\">failed (exit code 3)</font>"),
            "{md}"
        );
        assert!(md.contains("`ptrain logs resnet-lr01`"), "{md}");
    }

    #[test]
    fn user_text_in_the_detail_is_escaped_in_text_forms_only() {
        let mut n = notice(NotifyEvent::Failed);
        n.detail = "cannot enter /srv/\u{1b}]0;pwn\u{7}\u{202e}dir".into();
        let shown = r"cannot enter /srv/\x1b]0;pwn\x07\u{202e}dir";
        // Markdown then turns the `]` into `)`, as it does any bracket.
        let md_shown = shown.replace(']', ")");
        for (text, shown) in [
            (body_text(&n), shown),
            (wecom_text(&n), shown),
            (wecom_markdown(&n), md_shown.as_str()),
        ] {
            assert!(text.contains(shown), "{text}");
            assert!(!text.contains(['\u{1b}', '\u{7}', '\u{202e}']), "{text}");
        }
        let intent = Intent {
            key: "k".into(),
            channel: "c".into(),
            created_at: 0,
            notice: n.clone(),
        };
        assert_eq!(
            webhook_payload(&intent).detail,
            n.detail,
            "JSON stays exact"
        );
    }

    #[test]
    fn output_lines_are_shown_within_wecom_limits() {
        let mut n = notice(NotifyEvent::Failed);
        assert!(!body_text(&n).contains("Last lines of output"));
        assert!(!wecom_markdown(&n).contains("last output"));
        let mut lines: Vec<String> = (0..19)
            .map(|k| format!("line {k} {}", "x".repeat(190)))
            .collect();
        lines.push("Traceback: <@all> [x](http://evil) `rm`".into());
        n.output_tail = Some(lines);
        n.detail = "d".repeat(500);
        let body = body_text(&n);
        assert!(body.contains("Last lines of output:\n  line 0 "), "{body}");
        assert!(
            body.ends_with("  Traceback: <@all> [x](http://evil) `rm`\n"),
            "{body}"
        );
        let text = wecom_text(&n);
        assert!(text.len() <= WECOM_TEXT_MAX, "{}", text.len());
        // The last lines, not cut off by the limit; the older ones left out.
        assert!(
            text.ends_with("Traceback: <@all> [x](http://evil) `rm`\n"),
            "{text}"
        );
        assert!(
            text.contains("  line 15 ") && !text.contains("line 14 "),
            "{text}"
        );
        let md = wecom_markdown(&n);
        assert!(md.len() <= WECOM_MARKDOWN_MAX, "{}", md.len());
        assert!(
            md.ends_with("Traceback: ‹@all› (x)(http://evil) 'rm'</font>"),
            "{md}"
        );
        assert!(md.contains("line 15 ") && !md.contains("line 14 "), "{md}");
    }

    #[test]
    fn markdown_neutralises_mentions_from_job_text() {
        let mut n = notice(NotifyEvent::Failed);
        n.detail = "could not be launched: /home/a/<@all>[x](http://evil)".into();
        let md = wecom_markdown(&n);
        assert!(!md.contains("<@all>") && !md.contains("](http"), "{md}");
    }

    #[test]
    fn a_full_digest_fits_wecom_limits() {
        let mut n = notice(NotifyEvent::Failed);
        n.job_id = "x".repeat(64);
        n.host = "h".repeat(60);
        let all: Vec<&Notice> = std::iter::repeat_n(&n, super::super::pacing::MAX_DIGEST).collect();
        let md = wecom_digest(&all, true);
        assert!(md.len() <= WECOM_MARKDOWN_MAX, "{}", md.len());
        // Nothing is cut: every event has its line.
        assert_eq!(md.matches(&n.job_id).count(), all.len());
        assert!(md.ends_with("show details"));
        let text = wecom_digest(&all, false);
        assert!(text.len() <= WECOM_TEXT_MAX, "{}", text.len());
        assert_eq!(text.matches(&n.job_id).count(), all.len());
    }

    #[test]
    fn webhook_payload_has_the_stable_fields() {
        let intent = Intent {
            key: "resnet-lr01.failed.hook".into(),
            channel: "hook".into(),
            created_at: 1,
            notice: notice(NotifyEvent::Failed),
        };
        let v: serde_json::Value = serde_json::from_slice(&webhook_body(&intent)).unwrap();
        assert_eq!(v["schema"], WEBHOOK_SCHEMA);
        assert_eq!(v["key"], "resnet-lr01.failed.hook");
        assert_eq!(v["event"], "failed");
        assert_eq!(v["job_id"], "resnet-lr01");
        assert_eq!(v["owner"], "alice");
        assert_eq!(v["status"], "failed");
        assert_eq!(v["exit_code"], 3);
        assert_eq!(v["signal"], serde_json::Value::Null);
        assert_eq!(v["started_at"], "2023-11-14T22:13:20Z");
        assert_eq!(v["duration_secs"], 6 * 3600 + 2 * 60 + 3);
        assert_eq!(v["gpus"][1]["uuid"], "GPU-1");
        assert_eq!(v["host"], "gpu01");
        assert_eq!(v["logs_command"], "ptrain logs resnet-lr01");
        assert_eq!(v["output_tail"], serde_json::json!([]));
        assert_eq!(v["results"]["accuracy"], 0.93);
        // The same intent always gives the same bytes (and signature).
        assert_eq!(webhook_body(&intent), webhook_body(&intent.clone()));
        let mut with_tail = intent.clone();
        with_tail.notice.output_tail = Some(vec!["epoch 9".into(), "done".into()]);
        let v: serde_json::Value = serde_json::from_slice(&webhook_body(&with_tail)).unwrap();
        assert_eq!(v["output_tail"], serde_json::json!(["epoch 9", "done"]));
        assert!(v.get("invocation_id").is_none(), "{v}");
    }

    /// The checks of the shipped schema that ptrain's events must pass:
    /// required keys, `const`, `enum`, JSON types, nested `$ref`s and
    /// array items (what the schema uses; no validator crate for that).
    fn conforms(
        schema: &serde_json::Value,
        root: &serde_json::Value,
        v: &serde_json::Value,
        at: &str,
    ) {
        use serde_json::Value;
        if let Some(r) = schema["$ref"].as_str() {
            let name = r.strip_prefix("#/$defs/").expect("local $ref");
            return conforms(&root["$defs"][name], root, v, at);
        }
        if let Some(c) = schema.get("const") {
            assert_eq!(v, c, "{at}");
        }
        if let Some(e) = schema["enum"].as_array() {
            assert!(e.contains(v), "{at}: {v} not in {e:?}");
        }
        let types: Vec<&str> = match &schema["type"] {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        if !types.is_empty() {
            let ok = types.iter().any(|t| match *t {
                "null" => v.is_null(),
                "string" => v.is_string(),
                "integer" => v.is_i64() || v.is_u64(),
                "array" => v.is_array(),
                "object" => v.is_object(),
                other => panic!("{at}: type {other} unchecked"),
            });
            assert!(ok, "{at}: {v} is not {types:?}");
        }
        if let Some(required) = schema["required"].as_array() {
            for key in required {
                let key = key.as_str().unwrap();
                assert!(v.get(key).is_some(), "{at}: {key} missing in {v}");
            }
        }
        if let (Some(props), Some(obj)) = (schema["properties"].as_object(), v.as_object()) {
            for (key, sub) in props {
                if let Some(value) = obj.get(key) {
                    conforms(sub, root, value, &format!("{at}.{key}"));
                }
            }
            for key in obj.keys() {
                assert!(props.contains_key(key), "{at}.{key} is not in the schema");
            }
        }
        if let (Some(items), Some(array)) = (schema.get("items"), v.as_array()) {
            for (i, item) in array.iter().enumerate() {
                conforms(items, root, item, &format!("{at}[{i}]"));
            }
        }
    }

    #[test]
    fn every_event_as_a_cloudevent_conforms_to_the_shipped_schema() {
        let schema: serde_json::Value = serde_json::from_str(include_str!(
            "../../packaging/schema/ptrain-cloudevent.schema.json"
        ))
        .expect("the schema is JSON");
        // Every event ptrain tells is in the schema's list, and nothing else.
        let types: Vec<String> = NotifyEvent::ALL.into_iter().map(cloudevent_type).collect();
        let listed: Vec<String> = schema["properties"]["type"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(listed, types);
        let refusal = crate::store::RejectRecord {
            file: "bad job.json".into(),
            uid: Some(1000),
            owner: Some("alice".into()),
            rejected_at: 1_700_000_000_123_456,
            reason: "field `gpus` must be a number".into(),
            saved_as: None,
            dev: None,
            ino: None,
            ctime_ns: None,
            notifications: Vec::new(),
        };
        let gpu = || NoticeGpu {
            index: 1,
            uuid: "GPU-1".into(),
        };
        for event in NotifyEvent::ALL {
            let (notice, subject, kind) = match event {
                NotifyEvent::Refused => (
                    Notice::refused(&refusal, "bad_job.json", "gpu01").unwrap(),
                    "spool/bad_job.json",
                    "org.ptrain.job.refused",
                ),
                NotifyEvent::GpuUnhealthy => (
                    Notice::gpu_health(gpu(), Some("lost from the bus"), 1, "gpu01"),
                    "gpu/GPU-1",
                    "org.ptrain.host.gpu-unhealthy",
                ),
                NotifyEvent::GpuHealthy => (
                    Notice::gpu_health(gpu(), None, 1, "gpu01"),
                    "gpu/GPU-1",
                    "org.ptrain.host.gpu-healthy",
                ),
                e => (notice(e), "resnet-lr01", ""),
            };
            let mut intent = Intent {
                key: format!("resnet-lr01.{}.hook", event.as_str()),
                channel: "hook".into(),
                created_at: 1_700_000_000_123_456,
                notice,
            };
            intent.notice.output_tail = Some(vec!["epoch 9".into()]);
            let v: serde_json::Value = serde_json::from_slice(&cloudevent_body(&intent)).unwrap();
            conforms(&schema, &schema, &v, "event");
            assert_eq!(v["id"], intent.key);
            match kind {
                "" => assert_eq!(v["type"], format!("org.ptrain.job.{}", event.as_str())),
                kind => assert_eq!(v["type"], kind),
            }
            assert_eq!(v["subject"], subject);
            // An event of no job has a subject no job id can be.
            assert_eq!(
                crate::spec::JobId::parse(subject).is_ok(),
                event.is_of_a_job(),
                "{subject}"
            );
            assert_eq!(v["source"], "ptrain://gpu01");
            assert_eq!(v["time"], "2023-11-14T22:13:20.123456Z");
            // The data is the ptrain webhook's payload, byte for byte.
            let payload: serde_json::Value =
                serde_json::from_slice(&webhook_body(&intent)).unwrap();
            assert_eq!(v["data"], payload);
            conforms(
                &schema["$defs"]["notification"],
                &schema,
                &payload,
                "payload",
            );
            // Sent again after a crash: the same bytes, so the same id.
            assert_eq!(cloudevent_body(&intent), cloudevent_body(&intent.clone()));
        }
    }

    #[test]
    fn message_ids_are_deterministic_and_valid() {
        assert_eq!(
            message_id("run.succeeded.mail", "gpu01"),
            "<run.succeeded.mail@ptrain.gpu01>"
        );
        let odd = message_id("a..b.failed.mail", "gpu 01!");
        assert_eq!(
            odd,
            format!("<x{}@ptrain.gpu01>", hex::encode("a..b.failed.mail"))
        );
        assert_ne!(
            message_id("a.failed.mail", "h"),
            message_id("a.failed.mail2", "h")
        );
    }
}
