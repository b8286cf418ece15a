//! Issue 6: notifications that always arrive, once. The sender against a
//! real loopback HTTP server that fails on purpose and real loopback SMTP
//! servers (Debian's aiosmtpd, and a scripted one that refuses), then the
//! whole path through the real ptraind: a job's end posted exactly once,
//! a dead letter listed and re-sent with `ptrain notifications retry`, and a
//! delivery interrupted by kill -9 re-sent with the same Idempotency-Key.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ptrain::config::Config;
use ptrain::notifications::transport::signature;
use ptrain::notifications::{
    DeliveryState, DeliveryView, Intent, Notice, NoticeGpu, Notifier, NotifyEvent, RetryTarget,
};
use serde_json::Value;

use crate::daemon::{text, Opts, TestDaemon, ALICE, BOB, WAIT};
use crate::harness::wait_for;

// ---------------------------------------------------------------------------
// A loopback HTTP server that answers from a script.

#[derive(Clone, Debug)]
pub(crate) enum Reply {
    Status(u16, &'static str),
    /// Hold the request unanswered until [`HttpServer::release`].
    Hang,
}

#[derive(Clone, Debug)]
pub(crate) struct Request {
    at: Instant,
    path: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Request {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("the body is JSON")
    }
}

struct ServerState {
    script: Mutex<VecDeque<Reply>>,
    default: Reply,
    requests: Mutex<Vec<Request>>,
    released: (Mutex<bool>, Condvar),
}

pub(crate) struct HttpServer {
    port: u16,
    state: Arc<ServerState>,
}

impl HttpServer {
    pub(crate) fn start(script: Vec<Reply>, default: Reply) -> HttpServer {
        HttpServer::start_on(TcpListener::bind("127.0.0.1:0").unwrap(), script, default)
    }

    fn start_on(listener: TcpListener, script: Vec<Reply>, default: Reply) -> HttpServer {
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(ServerState {
            script: Mutex::new(script.into()),
            default,
            requests: Mutex::new(Vec::new()),
            released: (Mutex::new(false), Condvar::new()),
        });
        let shared = state.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let state = shared.clone();
                thread::spawn(move || serve(conn, &state));
            }
        });
        HttpServer { port, state }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub(crate) fn requests(&self) -> Vec<Request> {
        self.state.requests.lock().unwrap().clone()
    }

    fn wait_requests(&self, n: usize, timeout: Duration) -> Vec<Request> {
        wait_for(
            &format!("{n} request(s) at the test server"),
            timeout,
            || {
                let r = self.requests();
                (r.len() >= n).then_some(r)
            },
        )
    }

    fn release(&self) {
        let (lock, cv) = &self.state.released;
        *lock.lock().unwrap() = true;
        cv.notify_all();
    }
}

fn serve(conn: TcpStream, state: &ServerState) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    // Recorded before answering: "the server got it" even if the answer
    // never reaches the sender.
    state.requests.lock().unwrap().push(Request {
        at: Instant::now(),
        path,
        headers,
        body,
    });
    let reply = state
        .script
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(|| state.default.clone());
    let (status, text) = match reply {
        Reply::Status(s, t) => (s, t),
        Reply::Hang => {
            let (lock, cv) = &state.released;
            let mut released = lock.lock().unwrap();
            while !*released {
                released = cv.wait(released).unwrap();
            }
            (200, "")
        }
    };
    let mut conn = conn;
    let _ = write!(
        conn,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
}

/// A loopback port with nothing listening (bound, then released).
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

// ---------------------------------------------------------------------------
// SMTP: Debian's aiosmtpd writing a Maildir, and a scripted refuser.

struct AioSmtpd {
    child: Child,
    port: u16,
    maildir: PathBuf,
    _dir: tempfile::TempDir,
}

impl AioSmtpd {
    fn start() -> AioSmtpd {
        let python = "/usr/bin/python3";
        let probe = Command::new(python)
            .args(["-c", "import aiosmtpd"])
            .status()
            .expect("/usr/bin/python3");
        assert!(
            probe.success(),
            "python3-aiosmtpd is missing: apt-get install python3-aiosmtpd (.ci/run does)"
        );
        let dir = tempfile::tempdir().unwrap();
        let maildir = dir.path().join("mail");
        let port = closed_port();
        let child = Command::new(python)
            .args(["-m", "aiosmtpd", "-n", "-l"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["-c", "aiosmtpd.handlers.Mailbox"])
            .arg(&maildir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for("aiosmtpd to listen", WAIT, || {
            TcpStream::connect(("127.0.0.1", port)).ok()
        });
        AioSmtpd {
            child,
            port,
            maildir,
            _dir: dir,
        }
    }

    fn messages(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.maildir.join("new")) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .collect()
    }
}

impl Drop for AioSmtpd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Answers RCPT TO with the next scripted reply (then 250), and accepts
/// the message; counts what it accepted.
struct ScriptedSmtp {
    port: u16,
    accepted: Arc<Mutex<Vec<String>>>,
    rcpt_replies: Arc<Mutex<VecDeque<&'static str>>>,
}

impl ScriptedSmtp {
    fn start(rcpt_replies: Vec<&'static str>) -> ScriptedSmtp {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let replies = Arc::new(Mutex::new(VecDeque::from(rcpt_replies)));
        let (acc, rep) = (accepted.clone(), replies.clone());
        thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (acc, rep) = (acc.clone(), rep.clone());
                thread::spawn(move || smtp_session(conn, &acc, &rep));
            }
        });
        ScriptedSmtp {
            port,
            accepted,
            rcpt_replies: replies,
        }
    }
}

fn smtp_session(
    conn: TcpStream,
    accepted: &Mutex<Vec<String>>,
    replies: &Mutex<VecDeque<&'static str>>,
) {
    let mut out = conn.try_clone().unwrap();
    let mut reader = BufReader::new(conn);
    let _ = out.write_all(b"220 scripted ESMTP\r\n");
    let mut line = String::new();
    while {
        line.clear();
        reader.read_line(&mut line).unwrap_or(0) > 0
    } {
        let verb = line.get(..4).unwrap_or("").to_ascii_uppercase();
        let reply: String = match verb.as_str() {
            "EHLO" => "250-scripted\r\n250 8BITMIME\r\n".into(),
            "HELO" | "MAIL" | "RSET" | "NOOP" => "250 ok\r\n".into(),
            "RCPT" => {
                let scripted = replies.lock().unwrap().pop_front();
                format!("{}\r\n", scripted.unwrap_or("250 ok"))
            }
            "DATA" => {
                let _ = out.write_all(b"354 go ahead\r\n");
                let mut data = String::new();
                loop {
                    let mut l = String::new();
                    if reader.read_line(&mut l).unwrap_or(0) == 0 || l == ".\r\n" {
                        break;
                    }
                    data.push_str(&l);
                }
                accepted.lock().unwrap().push(data);
                "250 queued\r\n".into()
            }
            "QUIT" => {
                let _ = out.write_all(b"221 bye\r\n");
                return;
            }
            _ => "502 unknown\r\n".into(),
        };
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

// ---------------------------------------------------------------------------
// The sender, in process.

fn notice(job: &str, event: NotifyEvent) -> Notice {
    Notice {
        job_id: job.into(),
        owner: "alice".into(),
        uid: 1000,
        event,
        status: event.as_str().into(),
        detail: match event {
            NotifyEvent::Failed => "failed with exit code 3".into(),
            e => e.as_str().into(),
        },
        exit_code: (event == NotifyEvent::Failed).then_some(3),
        signal: None,
        submitted_at: 1_700_000_000_000_000,
        started_at: Some(1_700_000_000_000_000),
        ended_at: Some(1_700_000_000_000_000 + 125_000_000),
        gpus: vec![NoticeGpu {
            index: 0,
            uuid: "GPU-0".into(),
        }],
        host: "gpu01".into(),
        unit: format!("ptrain-job@{job}.service"),
        results: None,
        invocation_id: None,
        output_tail: None,
    }
}

fn intent(job: &str, event: NotifyEvent, channel: &str) -> Intent {
    Intent {
        key: ptrain::notifications::key_of(job, 1, event, channel),
        channel: channel.into(),
        created_at: ptrain::now_micros(),
        notice: notice(job, event),
    }
}

/// A root-only secret file.
fn secret_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{text}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// A sender for `channels` (TOML), with its outbox in a temp dir.
struct Sender {
    rt: tokio::runtime::Runtime,
    notifier: Notifier,
    _state: tempfile::TempDir,
}

impl Sender {
    fn start(toml: &str) -> Sender {
        let config = Config::from_toml(Path::new("/etc/ptrain/ptrain.toml"), toml)
            .unwrap_or_else(|e| panic!("{e}"));
        let state = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let notifier = rt
            .block_on(async { Notifier::start(&config.notifications, state.path()) })
            .unwrap();
        Sender {
            rt,
            notifier,
            _state: state,
        }
    }

    fn deliver(&self, intents: Vec<Intent>) {
        self.notifier.deliver(intents);
    }

    fn list(&self) -> Vec<DeliveryView> {
        self.rt.block_on(self.notifier.deliveries()).unwrap()
    }

    fn wait_state(&self, key: &str, state: DeliveryState, timeout: Duration) -> DeliveryView {
        wait_for(&format!("{key} to be {}", state.as_str()), timeout, || {
            self.list()
                .into_iter()
                .find(|d| d.key == key && d.state == state)
        })
    }
}

fn webhook_toml(url: &str, extra: &str, secret: &Path) -> String {
    format!(
        "[notify]\ninitial_backoff = \"200ms\"\nmax_backoff = \"2s\"\nlifetime = \"1h\"\n{extra}\n\
         [channels.hook]\nkind = \"webhook\"\nurl = \"{url}\"\nsecret_file = \"{}\"\n",
        secret.display()
    )
}

#[test]
fn webhook_503_five_times_then_200_is_delivered_once_within_backoff_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), "hook.secret", "hmac-key-1");
    let server = HttpServer::start(
        vec![Reply::Status(503, "{\"error\":\"maintenance\"}"); 5],
        Reply::Status(200, "{}"),
    );
    let sender = Sender::start(&webhook_toml(&server.url("/hook"), "", &secret));
    let i = intent("train-7", NotifyEvent::Failed, "hook");
    sender.deliver(vec![i.clone()]);
    let done = sender.wait_state(&i.key, DeliveryState::Delivered, Duration::from_secs(30));
    assert_eq!(done.attempts, 6);
    let requests = server.requests();
    assert_eq!(requests.len(), 6, "delivered more than once");
    // Equal jitter: each wait is between half the ceiling and the ceiling
    // (200ms, 400ms, 800ms, 1.6s, then the 2s cap), plus the round trip.
    let ceilings = [200, 400, 800, 1600, 2000].map(Duration::from_millis);
    for (k, pair) in requests.windows(2).enumerate() {
        let gap = pair[1].at - pair[0].at;
        assert!(
            gap >= ceilings[k] / 2 && gap <= ceilings[k] + Duration::from_millis(1000),
            "gap {k}: {gap:?}, ceiling {:?}",
            ceilings[k]
        );
    }
    // The same message every time: same key, same bytes, and a signature
    // the receiver can check with the shared secret.
    for r in &requests {
        assert_eq!(r.path, "/hook");
        assert_eq!(r.header("idempotency-key"), Some(i.key.as_str()));
        assert_eq!(r.body, requests[0].body);
        assert_eq!(
            r.header("x-ptrain-signature"),
            Some(signature(b"hmac-key-1", &r.body).as_str())
        );
        assert_ne!(
            r.header("x-ptrain-signature"),
            Some(signature(b"wrong-key", &r.body).as_str())
        );
        assert_eq!(r.header("content-type"), Some("application/json"));
    }
    let body = requests[0].json();
    // A job this host never ran: no lines, the same (empty) ones each time.
    assert_eq!(body["output_tail"], serde_json::json!([]));
    assert_eq!(body["event"], "failed");
    assert_eq!(body["job_id"], "train-7");
    assert_eq!(body["exit_code"], 3);
    assert_eq!(body["duration_secs"], 125);
}

#[test]
fn a_cloudevents_webhook_posts_each_event_once_as_a_signed_cloudevent() {
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), "hook.secret", "hmac-key-1");
    // One refusal first: the retry must carry the same event, id and all.
    let server = HttpServer::start(
        vec![Reply::Status(503, "{\"error\":\"maintenance\"}")],
        Reply::Status(200, "{}"),
    );
    let toml = webhook_toml(&server.url("/events"), "", &secret) + "format = \"cloudevents\"\n";
    let sender = Sender::start(&toml);
    let i = intent("train-7", NotifyEvent::Failed, "hook");
    sender.deliver(vec![i.clone()]);
    sender.wait_state(&i.key, DeliveryState::Delivered, Duration::from_secs(30));
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "one refusal, then delivered once");
    for r in &requests {
        assert_eq!(r.path, "/events");
        assert_eq!(
            r.header("content-type"),
            Some("application/cloudevents+json; charset=utf-8")
        );
        assert_eq!(r.header("idempotency-key"), Some(i.key.as_str()));
        assert_eq!(r.body, requests[0].body);
        assert_eq!(
            r.header("x-ptrain-signature"),
            Some(signature(b"hmac-key-1", &r.body).as_str())
        );
    }
    let event = requests[0].json();
    assert_eq!(event["specversion"], "1.0");
    assert_eq!(event["id"], i.key.as_str());
    assert_eq!(event["type"], "org.ptrain.job.failed");
    assert_eq!(event["subject"], "train-7");
    assert!(
        event["source"].as_str().unwrap().starts_with("ptrain://"),
        "{event}"
    );
    assert_eq!(event["datacontenttype"], "application/json");
    assert!(event["time"].as_str().unwrap().ends_with('Z'), "{event}");
    assert_eq!(event["data"]["schema"], "ptrain.notification/1");
    assert_eq!(event["data"]["job_id"], "train-7");
    assert_eq!(event["data"]["exit_code"], 3);
}

#[test]
fn webhook_400_is_a_dead_letter_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), "hook.secret", "k");
    let server = HttpServer::start(vec![], Reply::Status(400, "{\"error\":\"bad schema\"}"));
    let sender = Sender::start(&webhook_toml(&server.url("/hook"), "", &secret));
    let i = intent("bad", NotifyEvent::Succeeded, "hook");
    sender.deliver(vec![i.clone()]);
    let dead = sender.wait_state(&i.key, DeliveryState::Dead, WAIT);
    assert_eq!(dead.attempts, 1);
    let why = dead.last_error.unwrap();
    assert!(
        why.contains("HTTP 400") && why.contains("bad schema"),
        "{why}"
    );
    // Dead means no more tries.
    thread::sleep(Duration::from_millis(600));
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn endpoint_down_for_the_whole_lifetime_is_a_dead_letter_without_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), "hook.secret", "hook-secret-777");
    let key = secret_file(dir.path(), "robot.key", "robot-key-999");
    let port = closed_port();
    let toml = format!(
        "{}\n[channels.robot]\nkind = \"wecom\"\nurl = \"http://127.0.0.1:{port}/cgi-bin/webhook/send\"\nkey_file = \"{}\"\n",
        webhook_toml(
            &format!("http://127.0.0.1:{port}/hook"),
            "initial_backoff = \"100ms\"\nlifetime = \"1500ms\"",
            &secret
        )
        .replace("initial_backoff = \"200ms\"\n", "")
        .replace("lifetime = \"1h\"\n", ""),
        key.display()
    );
    let started = Instant::now();
    let sender = Sender::start(&toml);
    let hook = intent("lost", NotifyEvent::Failed, "hook");
    let robot = intent("lost", NotifyEvent::Failed, "robot");
    sender.deliver(vec![hook.clone(), robot.clone()]);
    for i in [&hook, &robot] {
        let dead = sender.wait_state(&i.key, DeliveryState::Dead, WAIT);
        // The webhook retries on its backoff; the robot also waits for
        // its pacing slot (3 s), so it gets fewer tries in 1.5 s.
        assert!(dead.attempts >= 2, "{dead:?}");
        let why = dead.last_error.unwrap();
        assert!(why.contains("notify.lifetime"), "{why}");
        // The robot's key sits in its URL: errors never show it.
        assert!(
            !why.contains("robot-key-999") && !why.contains("hook-secret-777"),
            "{why}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(15));
}

#[test]
fn wecom_rate_limit_is_retried_and_an_invalid_key_is_dead() {
    let dir = tempfile::tempdir().unwrap();
    let key = secret_file(dir.path(), "robot.key", "robot-key-1");
    let server = HttpServer::start(
        vec![Reply::Status(
            200,
            "{\"errcode\":45009,\"errmsg\":\"api freq out of limit\"}",
        )],
        Reply::Status(200, "{\"errcode\":0,\"errmsg\":\"ok\"}"),
    );
    let toml = format!(
        "[notify]\ninitial_backoff = \"200ms\"\nmax_backoff = \"1s\"\n\
         [channels.ops]\nkind = \"wecom\"\nurl = \"{}\"\nkey_file = \"{}\"\n",
        server.url("/cgi-bin/webhook/send"),
        key.display()
    );
    let sender = Sender::start(&toml);
    let i = intent("wc", NotifyEvent::Failed, "ops");
    sender.deliver(vec![i.clone()]);
    let done = sender.wait_state(&i.key, DeliveryState::Delivered, WAIT);
    assert_eq!(done.attempts, 2);
    let r = server.requests();
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].path, "/cgi-bin/webhook/send?key=robot-key-1");
    let body = r[1].json();
    assert_eq!(body["msgtype"], "markdown");
    let content = body["markdown"]["content"].as_str().unwrap();
    assert!(
        content.contains("**job wc**") && content.contains("failed (exit code 3)"),
        "{content}"
    );
    assert!(content.contains("`ptrain logs wc`"), "{content}");

    // 93000: the robot's URL is wrong; trying again cannot help.
    let bad = HttpServer::start(
        vec![],
        Reply::Status(
            200,
            "{\"errcode\":93000,\"errmsg\":\"invalid webhook url\"}",
        ),
    );
    let toml = toml.replace(
        &server.url("/cgi-bin/webhook/send"),
        &bad.url("/cgi-bin/webhook/send"),
    );
    let sender = Sender::start(&toml);
    sender.deliver(vec![i.clone()]);
    let dead = sender.wait_state(&i.key, DeliveryState::Dead, WAIT);
    assert_eq!(dead.attempts, 1);
    assert!(dead.last_error.unwrap().contains("93000"));
}

#[test]
fn a_burst_to_one_robot_is_merged_and_paced() {
    let dir = tempfile::tempdir().unwrap();
    let key = secret_file(dir.path(), "robot.key", "k");
    let server = HttpServer::start(vec![], Reply::Status(200, "{\"errcode\":0}"));
    let toml = format!(
        "[channels.ops]\nkind = \"wecom\"\nurl = \"{}\"\nkey_file = \"{}\"\nformat = \"text\"\n",
        server.url("/send"),
        key.display()
    );
    let sender = Sender::start(&toml);
    let burst: Vec<Intent> = (0..20)
        .map(|k| intent(&format!("b{k:02}"), NotifyEvent::Succeeded, "ops"))
        .collect();
    sender.deliver(burst.clone());
    for i in &burst {
        sender.wait_state(&i.key, DeliveryState::Delivered, WAIT);
    }
    let r = server.requests();
    // 15 in the first digest, 5 in the second, a robot slot (3.05 s)
    // apart. The slot is kept between our sends; the server sees them
    // later by the connection set-up of each (the first one's is the
    // slowest), so its gap may be shorter by that. Unpaced, the second
    // would come within milliseconds.
    assert_eq!(r.len(), 2, "{r:?}");
    let gap = r[1].at - r[0].at;
    assert!(gap >= Duration::from_millis(2500), "{gap:?}");
    let all: String = r
        .iter()
        .map(|r| r.json()["text"]["content"].as_str().unwrap().to_owned())
        .collect();
    for i in &burst {
        assert_eq!(
            all.matches(&format!("job {} ", i.notice.job_id)).count(),
            1,
            "{}",
            i.key
        );
    }
}

#[test]
fn email_reaches_a_real_smtp_server_with_a_deterministic_message_id() {
    let smtp = AioSmtpd::start();
    let toml = format!(
        "[notify]\nhost = \"gpu01\"\nowner_email = {{ alice = \"alice@example.com\" }}\n\
         [channels.mail]\nkind = \"email\"\nsmtp_host = \"127.0.0.1\"\nsmtp_port = {}\ntls = \"none\"\n\
         from = \"ptrain <ptrain@example.com>\"\nto = [\"ops@example.com\"]\nto_owner = true\n",
        smtp.port
    );
    let sender = Sender::start(&toml);
    let i = intent("mailjob", NotifyEvent::Failed, "mail");
    sender.deliver(vec![i.clone()]);
    sender.wait_state(&i.key, DeliveryState::Delivered, WAIT);
    let messages = wait_for("the mail in the Maildir", WAIT, || {
        let m = smtp.messages();
        (!m.is_empty()).then_some(m)
    });
    assert_eq!(messages.len(), 1);
    let m = &messages[0];
    for want in [
        "Subject: [ptrain] job mailjob failed (exit code 3) after 2m 5s",
        "Message-ID: <mailjob.failed.mail@ptrain.gpu01>",
        "X-Ptrain-Key: mailjob.failed.mail",
        "ops@example.com",
        "alice@example.com",
        "Logs:      ptrain logs mailjob",
        "GPUs:      0 (GPU-0)",
    ] {
        assert!(m.contains(want), "missing {want:?} in\n{m}");
    }
}

#[test]
fn smtp_permanent_refusal_is_dead_and_a_temporary_one_is_retried() {
    let smtp = ScriptedSmtp::start(vec!["550 5.1.1 no such user", "451 4.3.0 try again later"]);
    let toml = format!(
        "[notify]\ninitial_backoff = \"200ms\"\n\
         [channels.mail]\nkind = \"email\"\nsmtp_host = \"127.0.0.1\"\nsmtp_port = {}\ntls = \"none\"\n\
         from = \"ptrain@example.com\"\nto = [\"ops@example.com\"]\n",
        smtp.port
    );
    let sender = Sender::start(&toml);
    let refused = intent("m1", NotifyEvent::Failed, "mail");
    sender.deliver(vec![refused.clone()]);
    let dead = sender.wait_state(&refused.key, DeliveryState::Dead, WAIT);
    assert_eq!(dead.attempts, 1);
    assert!(dead.last_error.unwrap().contains("550"));
    let later = intent("m2", NotifyEvent::Failed, "mail");
    sender.deliver(vec![later.clone()]);
    let done = sender.wait_state(&later.key, DeliveryState::Delivered, WAIT);
    assert_eq!(done.attempts, 2);
    assert_eq!(smtp.accepted.lock().unwrap().len(), 1);
    assert!(smtp.rcpt_replies.lock().unwrap().is_empty());
}

#[test]
fn root_can_resend_a_dead_letter_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), "hook.secret", "k");
    let server = HttpServer::start(vec![Reply::Status(404, "")], Reply::Status(204, ""));
    let sender = Sender::start(&webhook_toml(&server.url("/x"), "", &secret));
    let i = intent("r", NotifyEvent::Stopped, "hook");
    sender.deliver(vec![i.clone()]);
    sender.wait_state(&i.key, DeliveryState::Dead, WAIT);
    let said = sender
        .rt
        .block_on(sender.notifier.retry_now(RetryTarget::AllDead))
        .unwrap();
    assert_eq!(said, "1 dead notification(s) will be sent again");
    sender.wait_state(&i.key, DeliveryState::Delivered, WAIT);
    assert_eq!(server.requests().len(), 2);
}

// ---------------------------------------------------------------------------
// Through the real ptraind.

/// Root-only secret files outside /tmp (ptraind has a private /tmp).
pub(crate) struct Secrets {
    dir: PathBuf,
}

impl Secrets {
    pub(crate) fn new(test: &str) -> Secrets {
        let dir = PathBuf::from(format!(
            "/srv/ptrain-tests/{test}-secrets-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        Secrets { dir }
    }

    pub(crate) fn file(&self, name: &str, text: &str) -> PathBuf {
        secret_file(&self.dir, name, text)
    }
}

impl Drop for Secrets {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn deliveries(d: &TestDaemon) -> Vec<Value> {
    let out = d.ptrain("root", &["notifications", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Waits for `key` to be `state`, through a restart of ptraind: its
/// sender is at work before its API answers.
fn wait_delivery(d: &TestDaemon, key: &str, state: &str) -> Value {
    wait_for(&format!("{key} to be {state}"), WAIT, || {
        let out = d.ptrain("root", &["notifications", "--json"]);
        let list: Vec<Value> = serde_json::from_slice(&out.stdout).ok()?;
        list.into_iter()
            .find(|v| v["key"] == key && v["state"] == state)
    })
}

#[test]
fn a_job_end_is_posted_once_with_the_right_fields() {
    let secrets = Secrets::new("notify-e2e");
    let secret = secrets.file("hook.secret", "e2e-hmac-secret-4242");
    let token = secrets.file("hook.token", "e2e-bearer-token-1717");
    let server = HttpServer::start(vec![], Reply::Status(200, "{}"));
    let d = TestDaemon::start_with(
        "notify-e2e",
        Opts {
            extra_config: format!(
                "[notify]\ninitial_backoff = \"200ms\"\n\
                 [channels.hook]\nkind = \"webhook\"\nurl = \"{}\"\nsecret_file = \"{}\"\ntoken_file = \"{}\"\n",
                server.url("/ptrain"),
                secret.display(),
                token.display()
            ),
            ..Opts::default()
        },
    );
    let work = d.workdir(ALICE);
    // Ends (the default): one POST when it succeeds, with its last lines.
    let job = serde_json::json!({"version": 1, "command": ["/bin/sh", "-c",
            "env > env.txt; for k in $(seq 1 30); do echo \"step $k\"; done; printf 'tail\\tend\\033[0m\\n'"],
        "workdir": work, "notify": ["hook"]});
    d.drop_job(ALICE, "note-ok.json", &job.to_string());
    // Only its start: one POST, none for its end. `true` usually ends
    // before ptraind sees it active; its start is announced all the same.
    let job = serde_json::json!({"version": 1, "command": ["true"],
        "notify": ["hook"], "notify_on": ["started", "failed"]});
    d.drop_job(ALICE, "note-start.json", &job.to_string());
    // No `notify` and no admin default: nothing.
    d.drop_job(
        ALICE,
        "quiet.json",
        r#"{"version": 1, "command": ["true"]}"#,
    );
    for id in ["note-ok", "note-start", "quiet"] {
        assert_eq!(d.wait_ended(id)["status"], "succeeded");
    }
    let ok = wait_delivery(&d, "note-ok.succeeded.hook", "delivered");
    assert_eq!(ok["attempts"], 1);
    wait_delivery(&d, "note-start.started.hook", "delivered");
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    let r = requests
        .iter()
        .find(|r| r.header("idempotency-key") == Some("note-ok.succeeded.hook"))
        .expect("the end of note-ok was posted");
    assert_eq!(r.path, "/ptrain");
    assert_eq!(
        r.header("x-ptrain-signature"),
        Some(signature(b"e2e-hmac-secret-4242", &r.body).as_str())
    );
    assert_eq!(
        r.header("authorization"),
        Some("Bearer e2e-bearer-token-1717")
    );
    let body = r.json();
    let status = d.status("note-ok").unwrap();
    assert_eq!(body["schema"], "ptrain.notification/1");
    assert_eq!(body["event"], "succeeded");
    assert_eq!(body["job_id"], "note-ok");
    assert_eq!(body["owner"], ALICE);
    assert_eq!(body["uid"], status["uid"]);
    assert_eq!(body["status"], "succeeded");
    assert_eq!(body["exit_code"], 0);
    assert_eq!(body["signal"], Value::Null);
    assert_eq!(body["gpus"], serde_json::json!([]));
    assert_eq!(body["unit"], "ptrain-job@note-ok.service");
    assert_eq!(body["logs_command"], "ptrain logs note-ok");
    assert!(
        body["started_at"].is_string() && body["ended_at"].is_string(),
        "{body}"
    );
    assert!(body["duration_secs"].is_u64(), "{body}");
    assert!(!body["host"].as_str().unwrap().is_empty());
    assert!(body["title"]
        .as_str()
        .unwrap()
        .starts_with("job note-ok succeeded"));
    // The last 20 lines, control characters escaped.
    let tail: Vec<&str> = body["output_tail"]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"))
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(tail.len(), 20, "{tail:?}");
    assert_eq!(tail[0], "step 12", "{tail:?}");
    assert_eq!(tail[18..], ["step 30", "tail\\tend\\u{1b}[0m"], "{tail:?}");
    let started = requests
        .iter()
        .find(|r| r.header("idempotency-key") == Some("note-start.started.hook"))
        .unwrap()
        .json();
    assert_eq!(started["status"], "running");
    assert_eq!(started["output_tail"], serde_json::json!([]));

    // Channels are the admin's names: anything else is refused at once.
    let job = serde_json::json!({"version": 1, "command": ["true"], "notify": ["nope"]});
    d.drop_job(BOB, "unknown-channel.json", &job.to_string());
    let r = d.wait_rejected(BOB, "unknown-channel.json");
    let reason = r["reason"].as_str().unwrap();
    assert!(
        reason.contains("\"nope\"")
            && reason.contains("not configured")
            && reason.contains("\"hook\""),
        "{reason}"
    );
    let job = serde_json::json!({"version": 1, "command": ["true"], "notify": ["https://evil.example/x"]});
    d.drop_job(BOB, "raw-url.json", &job.to_string());
    let r = d.wait_rejected(BOB, "raw-url.json");
    assert!(r["reason"].as_str().unwrap().contains("never a URL"), "{r}");

    // Secrets appear nowhere: not in the job's environment, the CLI's
    // output or ptraind's log.
    let env = std::fs::read_to_string(work.join("env.txt")).unwrap();
    let listing = text(&d.ptrain("root", &["notifications"]));
    assert!(
        listing.contains("note-ok.succeeded.hook") && listing.contains("delivered"),
        "{listing}"
    );
    let journal = d.daemon_log();
    assert!(journal.contains("notification delivered"), "{journal}");
    for (what, haystack) in [
        ("job env", &env),
        ("ptrain notifications", &listing),
        ("journal", &journal),
    ] {
        for secret in ["e2e-hmac-secret-4242", "e2e-bearer-token-1717"] {
            assert!(
                !haystack.contains(secret),
                "{secret} leaked into the {what}"
            );
        }
    }
    // Only root lists deliveries.
    let denied = d.ptrain(ALICE, &["notifications"]);
    assert_eq!(denied.status.code(), Some(1), "{}", text(&denied));
    assert!(text(&denied).contains("only root"), "{}", text(&denied));
    assert_eq!(server.requests().len(), 2, "a notification was sent twice");
}

#[test]
fn a_dead_letter_is_listed_and_resent_by_root() {
    let secrets = Secrets::new("notify-dead");
    let secret = secrets.file("hook.secret", "dead-hmac-secret");
    // Nothing listens yet: every attempt fails until the lifetime ends.
    let reserved = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = reserved.local_addr().unwrap().port();
    drop(reserved);
    let d = TestDaemon::start_with(
        "notify-dead",
        Opts {
            extra_config: format!(
                "[notify]\ninitial_backoff = \"100ms\"\nlifetime = \"2s\"\ndefault_channels = [\"later\"]\n\
                 [channels.later]\nkind = \"webhook\"\nurl = \"http://127.0.0.1:{port}/late\"\nsecret_file = \"{}\"\n",
                secret.display()
            ),
            ..Opts::default()
        },
    );
    // Names no channel: the admin's default applies.
    d.drop_job(
        ALICE,
        "dl.json",
        r#"{"version": 1, "command": ["/bin/sh", "-c", "exit 2"]}"#,
    );
    assert_eq!(d.wait_ended("dl")["status"], "failed");
    let dead = wait_delivery(&d, "dl.failed.later", "dead");
    assert!(
        dead["last_error"]
            .as_str()
            .unwrap()
            .contains("notify.lifetime"),
        "{dead}"
    );
    let listing = text(&d.ptrain("root", &["notifications"]));
    assert!(
        listing.contains("dl.failed.later") && listing.contains("dead"),
        "{listing}"
    );
    assert!(listing.contains("retry"), "{listing}");
    // The daemon is fine, and still runs jobs.
    d.assert_alive();
    d.drop_job(
        ALICE,
        "after.json",
        r#"{"version": 1, "command": ["true"], "notify": []}"#,
    );
    assert_eq!(d.wait_ended("after")["status"], "succeeded");

    // The endpoint is back: root re-sends the dead letter.
    let server = HttpServer::start_on(
        TcpListener::bind(("127.0.0.1", port)).unwrap(),
        vec![],
        Reply::Status(200, "{}"),
    );
    let denied = d.ptrain(ALICE, &["notifications", "retry", "dl.failed.later"]);
    assert_eq!(denied.status.code(), Some(1), "{}", text(&denied));
    let out = d.ptrain("root", &["notifications", "retry", "dl.failed.later"]);
    assert!(out.status.success(), "{}", text(&out));
    wait_delivery(&d, "dl.failed.later", "delivered");
    let r = server.wait_requests(1, WAIT);
    assert_eq!(r[0].header("idempotency-key"), Some("dl.failed.later"));
    let again = d.ptrain("root", &["notifications", "retry", "dl.failed.later"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again).contains("already delivered"),
        "{}",
        text(&again)
    );
    let none = d.ptrain("root", &["notifications", "retry", "--all-dead"]);
    assert!(text(&none).contains("0 dead"), "{}", text(&none));
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn kill_9_mid_delivery_resends_with_the_same_key() {
    let secrets = Secrets::new("notify-kill");
    let secret = secrets.file("hook.secret", "kill-hmac-secret");
    // The first POST reaches the server, which never answers it: ptraind is
    // killed after the server got it and before ptraind could record it.
    let server = HttpServer::start(vec![Reply::Hang], Reply::Status(200, "{}"));
    let d = TestDaemon::start_with(
        "notify-kill",
        Opts {
            extra_config: format!(
                "[notify]\nattempt_timeout = \"2m\"\n\
                 [channels.hook]\nkind = \"webhook\"\nurl = \"{}\"\nsecret_file = \"{}\"\n",
                server.url("/k"),
                secret.display()
            ),
            ..Opts::default()
        },
    );
    d.drop_job(
        ALICE,
        "killed.json",
        r#"{"version": 1, "command": ["/bin/sh", "-c", "echo last-words"], "notify": ["hook"]}"#,
    );
    let first = server.wait_requests(1, WAIT);
    let pending = deliveries(&d);
    assert!(
        pending
            .iter()
            .any(|v| v["key"] == "killed.succeeded.hook" && v["state"] == "pending"),
        "{pending:?}"
    );
    let (ok, out) = d
        .harness
        .systemctl(&["kill", "-s", "KILL", "ptraind.service"]);
    assert!(ok, "{out}");
    // Restart=on-failure brings it back; it re-sends what is not recorded
    // as delivered.
    let all = server.wait_requests(2, WAIT);
    server.release();
    assert_eq!(d.unit_property("ptraind.service", "NRestarts"), "1");
    wait_delivery(&d, "killed.succeeded.hook", "delivered");
    assert_eq!(
        all[1].header("idempotency-key"),
        Some("killed.succeeded.hook")
    );
    assert_eq!(
        all[0].header("idempotency-key"),
        all[1].header("idempotency-key")
    );
    assert_eq!(all[0].body, all[1].body, "the re-sent message differs");
    assert_eq!(first[0].body, all[1].body);
    // The lines read before the first attempt went out again as they were.
    assert_eq!(
        all[1].json()["output_tail"],
        serde_json::json!(["last-words"])
    );
    assert_eq!(
        all[1].header("x-ptrain-signature"),
        Some(signature(b"kill-hmac-secret", &all[1].body).as_str())
    );
    assert_eq!(d.status("killed").unwrap()["status"], "succeeded");
    assert_eq!(server.requests().len(), 2);
}

#[test]
fn a_stop_waits_for_the_notification_under_way_and_sends_it_once() {
    let secrets = Secrets::new("notify-stop");
    let secret = secrets.file("hook.secret", "stop-hmac-secret");
    // The POST hangs until the test releases it, while ptraind stops.
    let server = HttpServer::start(vec![Reply::Hang], Reply::Status(200, "{}"));
    let d = TestDaemon::start_with(
        "notify-stop",
        Opts {
            extra_config: format!(
                "[notify]\nattempt_timeout = \"2m\"\n\
                 [channels.hook]\nkind = \"webhook\"\nurl = \"{}\"\nsecret_file = \"{}\"\n",
                server.url("/s"),
                secret.display()
            ),
            ..Opts::default()
        },
    );
    d.drop_job(
        ALICE,
        "stopped.json",
        r#"{"version": 1, "command": ["true"], "notify": ["hook"]}"#,
    );
    server.wait_requests(1, WAIT);
    std::thread::scope(|scope| {
        let stop = scope.spawn(|| d.harness.systemctl(&["stop", "ptraind.service"]));
        // ptraind holds its stop open for the attempt (a ptraind that
        // exits at once is never seen deactivating, and this times out).
        wait_for("ptraind to wait in its stop", WAIT, || {
            (d.unit_property("ptraind.service", "ActiveState") == "deactivating").then_some(())
        });
        server.release();
        let (ok, out) = stop.join().unwrap();
        assert!(ok, "{out}");
    });
    assert_eq!(
        d.unit_property("ptraind.service", "ActiveState"),
        "inactive"
    );
    let said = d.harness.journal(&["-u", "ptraind.service", "-o", "cat"]);
    assert!(said.contains("every notification due was sent"), "{said}");
    let (ok, out) = d.harness.systemctl(&["start", "ptraind.service"]);
    assert!(ok, "{out}");
    // Recorded as delivered before the exit: the next start sends nothing.
    wait_delivery(&d, "stopped.succeeded.hook", "delivered");
    assert_eq!(server.requests().len(), 1, "{:?}", server.requests());
}

#[test]
fn a_refused_file_is_a_stream_event_once_through_a_kill_9() {
    // The first POST is held unanswered: ptraind is killed with the
    // refusal's event sent and not recorded as delivered.
    let server = HttpServer::start(vec![Reply::Hang], Reply::Status(200, "{}"));
    let d = TestDaemon::start_with(
        "notify-refused",
        Opts {
            extra_config: format!(
                "[notify]\nattempt_timeout = \"2m\"\n\
                 [retention]\nrejected_per_user = 2\n\
                 [channels.bus]\nkind = \"webhook\"\nurl = \"{}\"\nformat = \"cloudevents\"\n\
                 events = [\"refused\", \"submitted\"]\n",
                server.url("/bus")
            ),
            ..Opts::default()
        },
    );
    d.drop_job(BOB, "bad job.json", r#"{"version": 1, "gpus": 1}"#);
    let rejected = d.wait_rejected(BOB, "bad job.json");
    let first = server.wait_requests(1, WAIT);
    let (ok, out) = d
        .harness
        .systemctl(&["kill", "-s", "KILL", "ptraind.service"]);
    assert!(ok, "{out}");
    let all = server.wait_requests(2, WAIT);
    server.release();
    let id = first[0].header("idempotency-key").unwrap().to_owned();
    assert!(
        id.starts_with("refused.") && id.ends_with("-bad_job.json.bus"),
        "{id}"
    );
    wait_delivery(&d, &id, "delivered");
    assert_eq!(all[1].header("idempotency-key"), Some(id.as_str()));
    assert_eq!(all[0].body, all[1].body, "the re-sent event differs");
    let event = all[1].json();
    assert_eq!(event["type"], "org.ptrain.job.refused", "{event:#}");
    assert_eq!(event["id"], id.as_str());
    // No job id has a `/`: not even another user's job named like the file.
    assert_eq!(event["subject"], "spool/bad_job.json");
    let data = &event["data"];
    assert_eq!(data["event"], "refused");
    assert_eq!(data["owner"], BOB);
    assert_eq!(data["status"], "refused");
    assert_eq!(data["detail"], rejected["reason"], "{data:#}");
    assert_eq!(data["logs_command"], "ptrain rejected");
    assert!(
        data["title"]
            .as_str()
            .unwrap()
            .starts_with("job file bad_job.json was refused: "),
        "{data:#}"
    );
    // The owner's listing shows the refusal, not ptraind's intents.
    let listing = text(&d.ptrain(BOB, &["rejected", "--json"]));
    assert!(
        listing.contains("bad job.json") && !listing.contains("\"notifications\""),
        "{listing}"
    );

    // A job cannot ask for an event of no job; the refusal is itself an
    // event, and a good job's submission is one too: each told once.
    let job = serde_json::json!({"version": 1, "command": ["true"], "notify_on": ["refused"]});
    d.drop_job(ALICE, "asks-refused.json", &job.to_string());
    let r = d.wait_rejected(ALICE, "asks-refused.json");
    assert!(
        r["reason"].as_str().unwrap().contains("no event of a job"),
        "{r}"
    );
    d.drop_job(ALICE, "fine.json", r#"{"version": 1, "command": ["true"]}"#);
    assert_eq!(d.wait_ended("fine")["status"], "succeeded");
    wait_delivery(&d, "fine.submitted.bus", "delivered");
    let keys: Vec<String> = wait_for("the second refusal's event", WAIT, || {
        let keys: Vec<String> = server
            .requests()
            .iter()
            .filter_map(|r| r.header("idempotency-key").map(str::to_owned))
            .collect();
        keys.iter()
            .any(|k| k.ends_with("-asks-refused.json.bus"))
            .then_some(keys)
    });
    let unique: std::collections::BTreeSet<&String> = keys.iter().collect();
    assert_eq!(unique.len(), 3, "{keys:?}");
    assert_eq!(
        keys.len(),
        4,
        "only the interrupted one went twice: {keys:?}"
    );

    // Killed after the quarantine is written and before the spool entry
    // goes: the file is refused again after the restart as the same
    // refusal, one entry and one event id.
    d.crash_at("after-quarantine", || {
        d.drop_job(BOB, "crash.json", r#"{"version": 1, "gpus": "two"}"#);
    });
    d.wait_rejected(BOB, "crash.json");
    let crash_keys = || -> Vec<String> {
        server
            .requests()
            .iter()
            .filter_map(|r| r.header("idempotency-key").map(str::to_owned))
            .filter(|k| k.ends_with("-crash.json.bus"))
            .collect()
    };
    let key = wait_for("the crashed refusal's event", WAIT, || {
        crash_keys().first().cloned()
    });
    wait_delivery(&d, &key, "delivered");
    let listing = d.rejected(BOB);
    let entries = listing.iter().filter(|r| r["file"] == "crash.json").count();
    assert_eq!(entries, 1, "one refusal, one entry: {listing:#?}");
    let crash_keys = crash_keys();
    assert_eq!(crash_keys.len(), 1, "{crash_keys:?}");

    // Bob's third refusal is past `rejected_per_user = 2`: his oldest
    // entry goes, and its event's outbox entry with it.
    d.drop_job(BOB, "third.json", "[");
    d.wait_rejected(BOB, "third.json");
    wait_for("the oldest refusal's outbox entry to go", WAIT, || {
        let out = d.ptrain("root", &["notifications", "--json"]);
        let list: Vec<Value> = serde_json::from_slice(&out.stdout).ok()?;
        (!list.iter().any(|v| v["key"] == id.as_str())).then_some(())
    });
    let files: Vec<Value> = d.rejected(BOB);
    assert!(
        !files.iter().any(|r| r["file"] == "bad job.json") && files.len() == 2,
        "{files:#?}"
    );
}
