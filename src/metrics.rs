//! Prometheus metrics: an optional plain-HTTP endpoint (`[metrics] listen`),
//! off by default and loopback-only unless the admin sets `allow_remote`.
//!
//! The state task keeps [`Metrics`] current as jobs move: counters and
//! histograms it bumps where a job is claimed, rejected, launched or
//! finished, and gauges it sets after each batch of events. What only
//! matters when someone looks (per-GPU memory and utilization, the
//! notification outbox) is asked for at scrape time, from the state task
//! and the notification sender, each with a deadline so a slow source
//! leaves its metrics out instead of stalling the scrape.
//!
//! [`render`] (the text exposition format 0.0.4) and [`route`] (what a
//! request asks for) are pure; [`start`] binds the listener and serves
//! each connection with a tiny HTTP/1.1 responder (one request, then close).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::notifications::{DeliveryState, DeliveryView, Notifier};
use crate::requests::ApiRequest;
use crate::setting::InvalidSetting;
use crate::views::GpusView;

/// `[metrics]` as written in the config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    listen: Option<String>,
    allow_remote: Option<bool>,
}

/// The validated `[metrics]` section.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricsConfig {
    /// Where to serve `/metrics`; `None`: no endpoint (the default).
    pub listen: Option<SocketAddr>,
    /// Whether `listen` may be an address other machines can reach.
    pub allow_remote: bool,
}

impl MetricsConfig {
    /// Validates `[metrics]`; an error is (key, message) like the other
    /// sections'.
    pub fn from_raw(raw: Option<RawMetrics>) -> Result<MetricsConfig, InvalidSetting> {
        let raw = raw.unwrap_or_default();
        let allow_remote = raw.allow_remote.unwrap_or(false);
        let Some(text) = raw.listen else {
            return Ok(MetricsConfig {
                listen: None,
                allow_remote,
            });
        };
        let addr: SocketAddr = text.parse().map_err(|_| {
            InvalidSetting::new(
                "metrics.listen".to_owned(),
                format!("{text:?} is not an IP address and port; write it like \"127.0.0.1:9464\""),
            )
        })?;
        if !addr.ip().is_loopback() && !allow_remote {
            return Err(InvalidSetting::new(
                "metrics.listen".to_owned(),
                format!(
                    "{addr} can be reached from other machines and the endpoint has no \
                     authentication; listen on 127.0.0.1 (scrape through a local agent or an \
                     SSH tunnel), or set allow_remote = true in [metrics]"
                ),
            ));
        }
        Ok(MetricsConfig {
            listen: Some(addr),
            allow_remote,
        })
    }
}

/// Upper bounds (seconds) of the queue-wait histogram's buckets: from
/// "started at once" to "waited days for GPUs".
pub const QUEUE_WAIT_BUCKETS: &[f64] = &[
    1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 43200.0, 86400.0, 259200.0,
];
/// Upper bounds (seconds) of the run-duration histogram's buckets: from a
/// smoke test to a week-long training run.
pub const RUN_DURATION_BUCKETS: &[f64] = &[
    10.0, 60.0, 300.0, 900.0, 3600.0, 10800.0, 21600.0, 43200.0, 86400.0, 172800.0, 604800.0,
];

/// The statuses of jobs not ended, in `ptrain_jobs{status}`.
/// A job pulling its image is counted as queued: it waits to be planned.
const ACTIVE_STATUSES: [&str; 3] = ["queued", "launching", "running"];

/// Outcomes always in `ptrain_jobs_finished_total`, 0 until a job ends so,
/// so that a series does not appear out of nowhere.
pub const OUTCOMES: &[&str] = &crate::job::Outcome::STATUSES;

/// The most users with series of their own in `ptrain_gpu_seconds_total`,
/// `ptrain_cpu_seconds_total` and `ptrain_user_jobs_finished_total`; later
/// ones add to `user="other"`, so a host with many users cannot grow the
/// scrape without bound.
pub const MAX_USER_SERIES: usize = 100;

/// The label every user past [`MAX_USER_SERIES`] shares.
pub const OTHER_USERS: &str = "other";

/// A Prometheus histogram of durations, lock-free.
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative), the last one for +Inf.
    buckets: Vec<AtomicU64>,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, micros: u64) {
        let secs = micros as f64 / 1e6;
        let i = self
            .bounds
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(self.bounds.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }
}

/// What the state task keeps current. Shared with the HTTP server.
pub struct Metrics {
    started_at: u64,
    /// Queued, launching, running ([`ACTIVE_STATUSES`]).
    active: [AtomicU64; 3],
    finished: Mutex<BTreeMap<&'static str, u64>>,
    gpus_allocated: AtomicU64,
    rejected_files: AtomicU64,
    queue_wait: Histogram,
    run_duration: Histogram,
    /// Per user: what the jobs that ended since ptraind started used, and
    /// how they ended; at most [`MAX_USER_SERIES`] users and "other".
    usage: Mutex<BTreeMap<String, UserUsage>>,
}

/// One user's figures in [`Metrics`].
#[derive(Clone, Default)]
struct UserUsage {
    gpu_seconds: f64,
    cpu_seconds: f64,
    /// Jobs ended, by outcome (only outcomes seen: a user's series start
    /// with their first job, and each user adds at most one per outcome).
    finished: BTreeMap<&'static str, u64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            started_at: crate::now_micros(),
            active: Default::default(),
            finished: Mutex::default(),
            gpus_allocated: AtomicU64::new(0),
            rejected_files: AtomicU64::new(0),
            queue_wait: Histogram::new(QUEUE_WAIT_BUCKETS),
            run_duration: Histogram::new(RUN_DURATION_BUCKETS),
            usage: Mutex::default(),
        }
    }
}

impl Metrics {
    /// The gauges: jobs queued, launching and running, GPUs ptrain jobs
    /// hold. Called after every batch of events, with counts the daemon
    /// keeps anyway: its cost must not grow with the job history.
    pub fn set_active(&self, queued: usize, launching: usize, running: usize, gpus: usize) {
        for (gauge, n) in self.active.iter().zip([queued, launching, running]) {
            gauge.store(n as u64, Ordering::Relaxed);
        }
        self.gpus_allocated.store(gpus as u64, Ordering::Relaxed);
    }

    /// A job left the queue for its unit after waiting this long.
    pub fn job_launched(&self, waited_micros: u64) {
        self.queue_wait.observe(waited_micros);
    }

    /// A job ended with `status`, having run this long if it started.
    pub fn job_finished(&self, status: &'static str, ran_micros: Option<u64>) {
        *self
            .finished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(status)
            .or_default() += 1;
        if let Some(micros) = ran_micros {
            self.run_duration.observe(micros);
        }
    }

    /// A job of `user` ended with `status`, its run having used these
    /// GPU-seconds and CPU-seconds.
    pub fn job_usage(&self, user: &str, status: &'static str, gpu_seconds: f64, cpu_seconds: f64) {
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        // Room for MAX_USER_SERIES users besides "other".
        let key = match usage.contains_key(user) {
            true => user,
            false if usage.keys().filter(|k| *k != OTHER_USERS).count() < MAX_USER_SERIES => user,
            false => OTHER_USERS,
        };
        let entry = usage.entry(key.to_owned()).or_default();
        entry.gpu_seconds += gpu_seconds;
        entry.cpu_seconds += cpu_seconds;
        *entry.finished.entry(status).or_default() += 1;
    }

    /// A spool file was refused (and quarantined).
    pub fn file_rejected(&self) {
        self.rejected_files.fetch_add(1, Ordering::Relaxed);
    }
}

/// What is read only when scraped; `None` where the source did not answer.
#[derive(Default)]
pub struct Scrape<'a> {
    pub gpus: Option<&'a GpusView>,
    pub notifications: Option<&'a [DeliveryView]>,
}

/// GPU states exported as a state set (one series per state, 1 for the
/// current one).
const GPU_STATES: &[&str] = &["free", "held", "reserved", "busy-foreign", "unhealthy"];

/// The text exposition format (version 0.0.4) of everything.
pub fn render(m: &Metrics, scrape: &Scrape) -> String {
    let mut out = Exposition::default();

    out.family("ptrain_build_info", "gauge", "ptrain version; always 1.");
    out.sample(
        "ptrain_build_info",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1.0,
    );
    out.family(
        "ptrain_start_time_seconds",
        "gauge",
        "When ptraind started, in seconds since the Unix epoch.",
    );
    out.sample("ptrain_start_time_seconds", &[], m.started_at as f64 / 1e6);

    out.family(
        "ptrain_jobs",
        "gauge",
        "Jobs not ended, by status: waiting in the queue, being started, running.",
    );
    for (status, n) in ACTIVE_STATUSES.iter().zip(&m.active) {
        let n = n.load(Ordering::Relaxed) as f64;
        out.sample("ptrain_jobs", &[("status", status)], n);
    }
    let finished = m.finished.lock().unwrap_or_else(|e| e.into_inner()).clone();
    out.family(
        "ptrain_jobs_finished_total",
        "counter",
        "Jobs that ended since ptraind started, by outcome.",
    );
    for (status, n) in with_known_outcomes(&finished) {
        out.sample(
            "ptrain_jobs_finished_total",
            &[("status", status)],
            n as f64,
        );
    }
    out.histogram(
        "ptrain_job_queue_wait_seconds",
        "Time from a job's submission to its launch.",
        &m.queue_wait,
    );
    out.histogram(
        "ptrain_job_run_duration_seconds",
        "Time from a job's start to its end, for jobs that started.",
        &m.run_duration,
    );
    let usage = m.usage.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (name, help, pick) in [
        (
            "ptrain_gpu_seconds_total",
            "GPU-seconds (run time times GPUs held) of the runs that ended since ptraind started, by user \
             (past the first 100 users, the rest under user=\"other\").",
            0,
        ),
        (
            "ptrain_cpu_seconds_total",
            "CPU time of the runs that ended since ptraind started, by user (as for GPU-seconds).",
            1,
        ),
    ] {
        out.family(name, "counter", help);
        for (user, figures) in &usage {
            let value = if pick == 0 {
                figures.gpu_seconds
            } else {
                figures.cpu_seconds
            };
            out.sample(name, &[("user", user)], value);
        }
    }
    out.family(
        "ptrain_user_jobs_finished_total",
        "counter",
        "Jobs that ended since ptraind started, by user and outcome (users as for GPU-seconds).",
    );
    for (user, figures) in &usage {
        for (status, n) in &figures.finished {
            out.sample(
                "ptrain_user_jobs_finished_total",
                &[("user", user), ("status", status)],
                *n as f64,
            );
        }
    }
    out.family(
        "ptrain_rejected_files_total",
        "counter",
        "Spool files refused since ptraind started (`ptrain rejected` says why).",
    );
    out.sample(
        "ptrain_rejected_files_total",
        &[],
        m.rejected_files.load(Ordering::Relaxed) as f64,
    );
    out.family(
        "ptrain_gpus_allocated",
        "gauge",
        "GPUs held by ptrain jobs now.",
    );
    out.sample(
        "ptrain_gpus_allocated",
        &[],
        m.gpus_allocated.load(Ordering::Relaxed) as f64,
    );

    out.family(
        "ptrain_scrape_source_up",
        "gauge",
        "Whether a source answered this scrape (1) or its metrics are missing (0).",
    );
    out.sample(
        "ptrain_scrape_source_up",
        &[("source", "gpus")],
        f64::from(u8::from(scrape.gpus.is_some())),
    );
    out.sample(
        "ptrain_scrape_source_up",
        &[("source", "notifications")],
        f64::from(u8::from(scrape.notifications.is_some())),
    );

    if let Some(view) = scrape.gpus {
        render_gpus(&mut out, view);
    }
    if let Some(list) = scrape.notifications {
        let mut counts: BTreeMap<&str, u64> = [
            DeliveryState::Pending,
            DeliveryState::Retrying,
            DeliveryState::Delivered,
            DeliveryState::Dead,
        ]
        .iter()
        .map(|s| (s.as_str(), 0))
        .collect();
        for d in list {
            *counts.entry(d.state.as_str()).or_default() += 1;
        }
        out.family(
            "ptrain_notifications",
            "gauge",
            "Notification deliveries on record, by state: pending and retrying are the backlog, \
             dead the failures (`ptrain notifications`).",
        );
        for (state, n) in counts {
            out.sample("ptrain_notifications", &[("state", state)], n as f64);
        }
    }
    out.text
}

fn render_gpus(out: &mut Exposition, view: &GpusView) {
    out.family("ptrain_gpus", "gauge", "GPUs in the inventory, by backend.");
    out.sample(
        "ptrain_gpus",
        &[("backend", &view.backend)],
        view.gpus.len() as f64,
    );
    let ids: Vec<(String, &str)> = view
        .gpus
        .iter()
        .map(|g| (g.gpu.index.to_string(), g.gpu.uuid.as_str()))
        .collect();
    out.family("ptrain_gpu_info", "gauge", "A GPU's model name; always 1.");
    for (g, (index, uuid)) in view.gpus.iter().zip(&ids) {
        out.sample(
            "ptrain_gpu_info",
            &[("gpu", index), ("uuid", uuid), ("name", &g.gpu.name)],
            1.0,
        );
    }
    out.family(
        "ptrain_gpu_state",
        "gauge",
        "A GPU's state for ptrain (1 for the current one): free, held by a job, reserved \
         for a waiting job, busy with other programs, unhealthy.",
    );
    for (g, (index, uuid)) in view.gpus.iter().zip(&ids) {
        for state in GPU_STATES {
            out.sample(
                "ptrain_gpu_state",
                &[("gpu", index), ("uuid", uuid), ("state", state)],
                f64::from(u8::from(g.state == *state)),
            );
        }
    }
    type Field = fn(&crate::gpu::GpuInfo) -> Option<f64>;
    let per_gpu: [(&str, &str, Field); 4] = [
        ("ptrain_gpu_memory_total_bytes", "A GPU's memory.", |g| {
            (g.memory_total_mib > 0).then_some(g.memory_total_mib as f64 * 1048576.0)
        }),
        (
            "ptrain_gpu_memory_used_bytes",
            "A GPU's memory in use, by any program (NVML only).",
            |g| g.memory_used_mib.map(|m| m as f64 * 1048576.0),
        ),
        (
            "ptrain_gpu_utilization_ratio",
            "Fraction of the last sample period a GPU was busy (NVML only).",
            |g| g.utilization_pct.map(|p| f64::from(p) / 100.0),
        ),
        (
            "ptrain_gpu_temperature_celsius",
            "A GPU's temperature (NVML only).",
            |g| g.temperature_c.map(f64::from),
        ),
    ];
    for (name, help, field) in per_gpu {
        let values: Vec<_> = view
            .gpus
            .iter()
            .zip(&ids)
            .filter_map(|(g, id)| field(&g.gpu).map(|v| (id, v)))
            .collect();
        if values.is_empty() {
            continue;
        }
        out.family(name, "gauge", help);
        for ((index, uuid), v) in values {
            out.sample(name, &[("gpu", index), ("uuid", uuid)], v);
        }
    }
}

/// The known outcomes (0 where absent) and any other present ones.
fn with_known_outcomes(counts: &BTreeMap<&'static str, u64>) -> Vec<(&'static str, u64)> {
    let mut all: Vec<(&'static str, u64)> = OUTCOMES
        .iter()
        .map(|s| (*s, counts.get(s).copied().unwrap_or(0)))
        .collect();
    for (status, n) in counts {
        if !OUTCOMES.contains(status) {
            all.push((status, *n));
        }
    }
    all
}

#[derive(Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (key, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{key}=\"{}\"", escape_label(value));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {}", number(value));
    }

    fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        self.family(name, "histogram", help);
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0;
        for (i, count) in h.buckets.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            let le = h.bounds.get(i).map_or("+Inf".to_owned(), |b| number(*b));
            self.sample(&bucket, &[("le", &le)], cumulative as f64);
        }
        self.sample(
            &format!("{name}_sum"),
            &[],
            h.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
        );
        // The +Inf bucket, so that the two always agree.
        self.sample(&format!("{name}_count"), &[], cumulative as f64);
    }
}

fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        // Display never uses an exponent and prints whole numbers without
        // a fraction ("2", "0.75"), both valid in the text format.
        v.to_string()
    }
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET /metrics` (`head_only` for HEAD).
    Metrics { head_only: bool },
    /// `GET /`: a pointer to /metrics.
    Index { head_only: bool },
    /// Anything else: this status line and a one-line body.
    Error(u16, &'static str),
}

/// Decides from the request head (request line and headers) what to answer.
pub fn route(head: &[u8]) -> Route {
    let Some(line) = head.split(|b| *b == b'\n').next() else {
        return Route::Error(400, "Bad Request");
    };
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Route::Error(400, "Bad Request");
    };
    if !version.starts_with("HTTP/1.") {
        return Route::Error(505, "HTTP Version Not Supported");
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Route::Error(405, "Method Not Allowed"),
    };
    let path = target.split('?').next().unwrap_or(target);
    match path {
        "/metrics" => Route::Metrics { head_only },
        "/" => Route::Index { head_only },
        _ => Route::Error(404, "Not Found"),
    }
}

/// Where the scrape-time values come from.
pub struct Sources {
    /// The state task's request channel (the same one the D-Bus API uses).
    pub api: mpsc::UnboundedSender<ApiRequest>,
    pub notifier: Notifier,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot serve metrics on {addr}: {source}; choose a free port in [metrics] listen, or remove the [metrics] section")]
pub struct MetricsError {
    pub addr: SocketAddr,
    pub source: std::io::Error,
}

/// How long a scrape waits for the state task or the sender.
const SOURCE_DEADLINE: Duration = Duration::from_secs(5);
/// How long a client may take to send its request.
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// Largest request head read; scrapers send a few hundred bytes.
const MAX_HEAD: usize = 8192;
/// Connections served at once; more are closed at once (scrapers retry).
const MAX_CONNECTIONS: usize = 8;

/// Binds `[metrics] listen` (if set) and serves it until `cancel`. Returns
/// the address bound (with the real port when the config said 0).
pub async fn start(
    config: &MetricsConfig,
    metrics: Arc<Metrics>,
    sources: Sources,
    cancel: CancellationToken,
) -> Result<Option<SocketAddr>, MetricsError> {
    let Some(addr) = config.listen else {
        return Ok(None);
    };
    let error = |source| MetricsError { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(error)?;
    let bound = listener.local_addr().map_err(error)?;
    let sources = Arc::new(sources);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = cancel.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // EMFILE and the like: the next connection may work.
                    tracing::warn!(error = %e, "metrics: cannot accept a connection");
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                continue;
            };
            let (metrics, sources) = (metrics.clone(), sources.clone());
            tokio::spawn(async move {
                let _ = serve_one(stream, &metrics, &sources).await;
                drop(slot);
            });
        }
    });
    Ok(Some(bound))
}

async fn read_head(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        if head.len() >= MAX_HEAD {
            break;
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(head)
}

async fn serve_one(mut stream: TcpStream, m: &Metrics, sources: &Sources) -> std::io::Result<()> {
    let head = match tokio::time::timeout(REQUEST_DEADLINE, read_head(&mut stream)).await {
        Ok(head) => head?,
        Err(_) => return Ok(()),
    };
    let (status, content_type, body, head_only) = match route(&head) {
        Route::Metrics { head_only } => {
            let body = scrape(m, sources).await;
            (
                "200 OK".to_owned(),
                "text/plain; version=0.0.4; charset=utf-8",
                body,
                head_only,
            )
        }
        Route::Index { head_only } => (
            "200 OK".to_owned(),
            "text/plain; charset=utf-8",
            "ptraind: Prometheus metrics are at /metrics\n".to_owned(),
            head_only,
        ),
        Route::Error(code, reason) => (
            format!("{code} {reason}"),
            "text/plain; charset=utf-8",
            format!("{reason}: only GET /metrics is served here\n"),
            false,
        ),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        response.extend_from_slice(body.as_bytes());
    }
    stream.write_all(&response).await?;
    stream.shutdown().await
}

async fn scrape(m: &Metrics, sources: &Sources) -> String {
    let (tx, rx) = oneshot::channel();
    let gpus = match sources.api.send(ApiRequest::Gpus(tx)) {
        Ok(()) => match tokio::time::timeout(SOURCE_DEADLINE, rx).await {
            Ok(Ok(Ok(view))) => Some(view),
            _ => None,
        },
        Err(_) => None,
    };
    // The sender answers from its outbox without waiting on any attempt.
    let notifications = tokio::time::timeout(SOURCE_DEADLINE, sources.notifier.deliveries())
        .await
        .ok()
        .and_then(Result::ok);
    render(
        m,
        &Scrape {
            gpus: gpus.as_ref(),
            notifications: notifications.as_deref(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::GpuInfo;
    use crate::views::GpuView;

    fn config(text: &str) -> Result<MetricsConfig, InvalidSetting> {
        #[derive(Deserialize)]
        struct File {
            metrics: Option<RawMetrics>,
        }
        let file: File = toml::from_str(text).unwrap();
        MetricsConfig::from_raw(file.metrics)
    }

    #[test]
    fn config_is_off_by_default_and_loopback_only() {
        assert_eq!(config("").unwrap().listen, None);
        let c = config("[metrics]\nlisten = \"127.0.0.1:9464\"").unwrap();
        assert_eq!(c.listen, Some("127.0.0.1:9464".parse().unwrap()));
        assert!(config("[metrics]\nlisten = \"[::1]:9464\"").is_ok());
        for remote in ["0.0.0.0:9464", "192.0.2.7:9464", "[::]:9464"] {
            let InvalidSetting { key, message } =
                config(&format!("[metrics]\nlisten = \"{remote}\"")).unwrap_err();
            assert_eq!(key, "metrics.listen");
            assert!(message.contains("allow_remote = true"), "{message}");
        }
        let c = config("[metrics]\nlisten = \"0.0.0.0:9464\"\nallow_remote = true").unwrap();
        assert_eq!(c.listen, Some("0.0.0.0:9464".parse().unwrap()));
        let InvalidSetting { key, message } =
            config("[metrics]\nlisten = \"localhost\"").unwrap_err();
        assert_eq!(key, "metrics.listen");
        assert!(message.contains("127.0.0.1:9464"), "{message}");
        assert!(toml::from_str::<RawMetrics>("listn = \"x\"").is_err());
    }

    /// Every sample line of the exposition, name{labels} → value.
    fn samples(text: &str) -> BTreeMap<String, f64> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let (series, value) = l.rsplit_once(' ').expect("name value");
                (series.to_owned(), value.parse().expect("a number"))
            })
            .collect()
    }

    fn gpu(index: u32, state: &str, used: Option<u64>, util: Option<u32>) -> GpuView {
        GpuView {
            gpu: GpuInfo {
                index,
                uuid: format!("GPU-{index}"),
                name: "Test \"GPU\"".into(),
                pci_bus_id: None,
                memory_total_mib: 1024,
                memory_used_mib: used,
                utilization_pct: util,
                temperature_c: None,
                device: format!("/dev/nvidia{index}").into(),
                processes: Vec::new(),
                numa_node: None,
                topology_group: None,
                unhealthy: None,
            },
            held_by: None,
            state: state.into(),
            reserved_for: None,
            detail: String::new(),
        }
    }

    #[test]
    fn usage_is_summed_per_user_and_users_past_the_guard_share_other() {
        let m = Metrics::default();
        m.job_usage("alice", "succeeded", 6.0, 2.0);
        m.job_usage("alice", "failed", 1.5, 0.5);
        m.job_usage("bo\"b", "succeeded", 0.0, 1.0);
        for i in 0..MAX_USER_SERIES + 5 {
            m.job_usage(&format!("u{i}"), "succeeded", 1.0, 1.0);
        }
        // A user seen before the guard filled keeps their own series.
        m.job_usage("alice", "succeeded", 1.0, 0.0);
        let s = samples(&render(&m, &Scrape::default()));
        assert_eq!(s["ptrain_gpu_seconds_total{user=\"alice\"}"], 8.5);
        assert_eq!(s["ptrain_cpu_seconds_total{user=\"alice\"}"], 2.5);
        assert_eq!(s["ptrain_cpu_seconds_total{user=\"bo\\\"b\"}"], 1.0);
        let users = s
            .keys()
            .filter(|k| k.starts_with("ptrain_gpu_seconds_total{"))
            .count();
        assert_eq!(
            users,
            MAX_USER_SERIES + 1,
            "at most the guard's users and other"
        );
        // alice, bo"b and 98 of the u's have their own; 7 u's are "other".
        assert_eq!(s["ptrain_gpu_seconds_total{user=\"other\"}"], 7.0);
        let finished = |user: &str, status: &str| {
            s.get(&format!(
                "ptrain_user_jobs_finished_total{{user=\"{user}\",status=\"{status}\"}}"
            ))
            .copied()
        };
        assert_eq!(finished("alice", "succeeded"), Some(2.0));
        assert_eq!(finished("alice", "failed"), Some(1.0));
        assert_eq!(finished("other", "succeeded"), Some(7.0));
        // Only outcomes a user has had: the guard bounds users, this the
        // series per user.
        assert_eq!(finished("bo\\\"b", "failed"), None);
        let series = s
            .keys()
            .filter(|k| k.starts_with("ptrain_user_jobs_finished_total{"))
            .count();
        assert_eq!(series, MAX_USER_SERIES + 2, "alice has two outcomes");
    }

    #[test]
    fn exposition_has_every_family_well_formed() {
        let m = Metrics::default();
        m.set_active(1, 0, 2, 3);
        m.job_launched(2_000_000); // 2 s: the le="5" bucket
        m.job_launched(7_200_000_000); // 2 h: the le="14400" bucket
        m.job_finished("succeeded", Some(30_000_000));
        m.job_finished("dependency-failed", None);
        m.file_rejected();
        m.file_rejected();
        let gpus = GpusView {
            backend: "declared".into(),
            gpus: vec![
                gpu(0, "held", Some(512), Some(75)),
                gpu(1, "free", None, None),
            ],
        };
        let text = render(
            &m,
            &Scrape {
                gpus: Some(&gpus),
                notifications: Some(&[]),
            },
        );
        let s = samples(&text);
        assert_eq!(s["ptrain_jobs{status=\"running\"}"], 2.0);
        assert_eq!(s["ptrain_jobs{status=\"queued\"}"], 1.0);
        assert_eq!(s["ptrain_jobs{status=\"launching\"}"], 0.0);
        assert!(!s.contains_key("ptrain_jobs{status=\"succeeded\"}"));
        assert_eq!(
            s["ptrain_jobs_finished_total{status=\"failed\"}"], 0.0,
            "known outcomes are always there"
        );
        assert_eq!(s["ptrain_gpus_allocated"], 3.0);
        assert_eq!(s["ptrain_rejected_files_total"], 2.0);
        assert_eq!(s["ptrain_jobs_finished_total{status=\"succeeded\"}"], 1.0);
        assert_eq!(
            s["ptrain_jobs_finished_total{status=\"dependency-failed\"}"],
            1.0
        );
        assert_eq!(
            s["ptrain_jobs_finished_total{status=\"not-needed\"}"], 0.0,
            "a job not needed is an outcome of its own"
        );
        assert!(!s.contains_key("ptrain_jobs_finished_total{status=\"running\"}"));
        // Histograms: cumulative buckets, +Inf equal to _count.
        assert_eq!(s["ptrain_job_queue_wait_seconds_bucket{le=\"1\"}"], 0.0);
        assert_eq!(s["ptrain_job_queue_wait_seconds_bucket{le=\"5\"}"], 1.0);
        assert_eq!(s["ptrain_job_queue_wait_seconds_bucket{le=\"3600\"}"], 1.0);
        assert_eq!(s["ptrain_job_queue_wait_seconds_bucket{le=\"14400\"}"], 2.0);
        assert_eq!(s["ptrain_job_queue_wait_seconds_bucket{le=\"+Inf\"}"], 2.0);
        assert_eq!(s["ptrain_job_queue_wait_seconds_count"], 2.0);
        assert_eq!(s["ptrain_job_queue_wait_seconds_sum"], 7202.0);
        assert_eq!(s["ptrain_job_run_duration_seconds_count"], 1.0);
        assert_eq!(s["ptrain_job_run_duration_seconds_sum"], 30.0);
        // Per GPU, from the scrape-time inventory; label values escaped.
        assert_eq!(s["ptrain_gpus{backend=\"declared\"}"], 2.0);
        assert_eq!(
            s["ptrain_gpu_info{gpu=\"0\",uuid=\"GPU-0\",name=\"Test \\\"GPU\\\"\"}"],
            1.0
        );
        assert_eq!(
            s["ptrain_gpu_state{gpu=\"0\",uuid=\"GPU-0\",state=\"held\"}"],
            1.0
        );
        assert_eq!(
            s["ptrain_gpu_state{gpu=\"1\",uuid=\"GPU-1\",state=\"held\"}"],
            0.0
        );
        assert_eq!(
            s["ptrain_gpu_state{gpu=\"1\",uuid=\"GPU-1\",state=\"free\"}"],
            1.0
        );
        assert_eq!(
            s["ptrain_gpu_memory_total_bytes{gpu=\"1\",uuid=\"GPU-1\"}"],
            1073741824.0
        );
        assert_eq!(
            s["ptrain_gpu_memory_used_bytes{gpu=\"0\",uuid=\"GPU-0\"}"],
            536870912.0
        );
        assert!(!s.contains_key("ptrain_gpu_memory_used_bytes{gpu=\"1\",uuid=\"GPU-1\"}"));
        assert_eq!(
            s["ptrain_gpu_utilization_ratio{gpu=\"0\",uuid=\"GPU-0\"}"],
            0.75
        );
        assert!(
            !text.contains("ptrain_gpu_temperature_celsius"),
            "no family without samples"
        );
        assert_eq!(s["ptrain_notifications{state=\"dead\"}"], 0.0);
        assert_eq!(s["ptrain_scrape_source_up{source=\"gpus\"}"], 1.0);

        // The format's rules: each family's HELP and TYPE once, before its
        // samples, and every sample belongs to the family above it.
        let mut families = Vec::new();
        let mut current: Option<(String, String)> = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(["gauge", "counter", "histogram"].contains(&kind), "{line}");
                assert!(!families.contains(&name.to_owned()), "{name} twice");
                families.push(name.to_owned());
                current = Some((name.to_owned(), kind.to_owned()));
            } else if line.starts_with("# HELP ") {
                continue;
            } else {
                let (name, kind) = current.as_ref().expect("a sample before any TYPE");
                let series = line.split(['{', ' ']).next().unwrap();
                let ok = match kind.as_str() {
                    "histogram" => ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|suffix| series == format!("{name}{suffix}")),
                    _ => series == name,
                };
                assert!(ok, "{series} under family {name}");
                assert!(
                    series.starts_with("ptrain_")
                        && series.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                    "{series}"
                );
            }
        }
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn grafana_dashboard_uses_only_exported_metrics() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/packaging/grafana-dashboard.json"
        ))
        .expect("packaging/grafana-dashboard.json");
        let dashboard: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        let m = Metrics::default();
        m.job_usage("alice", "succeeded", 1.0, 1.0);
        let mut full = gpu(0, "held", Some(1), Some(1));
        full.gpu.temperature_c = Some(40);
        let gpus = GpusView {
            backend: "nvml".into(),
            gpus: vec![full],
        };
        let exposition = render(
            &m,
            &Scrape {
                gpus: Some(&gpus),
                notifications: Some(&[]),
            },
        );
        let exported: std::collections::BTreeSet<&str> = exposition
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .collect();
        let mut used = 0;
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().unwrap();
                for (i, _) in expr.match_indices("ptrain_") {
                    let name: String = expr[i..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    assert!(
                        exported.contains(name.as_str()),
                        "panel {:?} uses {name}, which ptraind does not export",
                        panel["title"]
                    );
                    used += 1;
                }
            }
        }
        assert!(used > 10, "the dashboard queries ptrain metrics");
    }

    #[test]
    fn missing_sources_are_said_not_faked() {
        let text = render(&Metrics::default(), &Scrape::default());
        let s = samples(&text);
        assert_eq!(s["ptrain_scrape_source_up{source=\"gpus\"}"], 0.0);
        assert_eq!(s["ptrain_scrape_source_up{source=\"notifications\"}"], 0.0);
        assert!(!text.contains("ptrain_gpu_state"));
        assert!(!text.contains("ptrain_notifications{"));
        assert_eq!(
            s["ptrain_job_run_duration_seconds_bucket{le=\"+Inf\"}"],
            0.0
        );
    }

    #[test]
    fn routes() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics { head_only: false }
        );
        assert_eq!(
            route(b"GET /metrics?name[]=x HTTP/1.0\r\n\r\n"),
            Route::Metrics { head_only: false }
        );
        assert_eq!(
            route(b"HEAD /metrics HTTP/1.1\r\n\r\n"),
            Route::Metrics { head_only: true }
        );
        assert_eq!(
            route(b"GET / HTTP/1.1\r\n\r\n"),
            Route::Index { head_only: false }
        );
        assert_eq!(
            route(b"GET /other HTTP/1.1\r\n\r\n"),
            Route::Error(404, "Not Found")
        );
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Route::Error(405, "Method Not Allowed")
        );
        assert_eq!(
            route(b"GET /metrics\r\n\r\n"),
            Route::Error(400, "Bad Request")
        );
        assert_eq!(route(b""), Route::Error(400, "Bad Request"));
        assert_eq!(
            route(b"GET /metrics SPDY/3\r\n\r\n"),
            Route::Error(505, "HTTP Version Not Supported")
        );
    }

    #[tokio::test]
    async fn serves_over_http() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (api, mut requests) = mpsc::unbounded_channel();
        // The state task's part: answer GPU requests.
        tokio::spawn(async move {
            while let Some(req) = requests.recv().await {
                if let ApiRequest::Gpus(reply) = req {
                    let _ = reply.send(Ok(GpusView {
                        backend: "declared".into(),
                        gpus: vec![gpu(0, "free", None, None)],
                    }));
                }
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let notifier = Notifier::start(
            &crate::config::Config::from_toml(std::path::Path::new("/x.toml"), "")
                .unwrap()
                .notifications,
            dir.path(),
        )
        .unwrap();
        let metrics = Arc::new(Metrics::default());
        metrics.file_rejected();
        let cancel = CancellationToken::new();
        let config = MetricsConfig {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            allow_remote: false,
        };
        let addr = start(&config, metrics, Sources { api, notifier }, cancel.clone())
            .await
            .unwrap()
            .unwrap();
        let get = |request: &'static str| async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(request.as_bytes()).await.unwrap();
            let mut reply = String::new();
            s.read_to_string(&mut reply).await.unwrap();
            reply
        };
        let reply = get("GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").await;
        let (head, body) = reply.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.contains("Content-Type: text/plain; version=0.0.4"),
            "{head}"
        );
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        assert!(body.contains("ptrain_rejected_files_total 1\n"), "{body}");
        assert!(body.contains("ptrain_gpu_state{gpu=\"0\",uuid=\"GPU-0\",state=\"free\"} 1\n"));
        assert!(body.contains("ptrain_scrape_source_up{source=\"notifications\"} 1\n"));
        let reply = get("HEAD /metrics HTTP/1.1\r\n\r\n").await;
        assert!(reply.ends_with("\r\n\r\n"), "HEAD has no body: {reply}");
        assert!(get("DELETE / HTTP/1.1\r\n\r\n")
            .await
            .starts_with("HTTP/1.1 405"));
        cancel.cancel();
    }

    #[tokio::test]
    async fn port_in_use_names_the_fix() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let (api, _requests) = mpsc::unbounded_channel();
        let dir = tempfile::tempdir().unwrap();
        let notifier = Notifier::start(
            &crate::config::Config::from_toml(std::path::Path::new("/x.toml"), "")
                .unwrap()
                .notifications,
            dir.path(),
        )
        .unwrap();
        let config = MetricsConfig {
            listen: Some(addr),
            allow_remote: false,
        };
        let e = start(
            &config,
            Arc::new(Metrics::default()),
            Sources { api, notifier },
            CancellationToken::new(),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(&addr.to_string()) && e.contains("[metrics] listen"),
            "{e}"
        );
    }
}
