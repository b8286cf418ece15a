//! The accounting database's schema, its rows, and the SQL of `ptrain
//! history` and `ptrain report`, built from a query and the caller's uid.
//! Pure: every value a user gives (a name pattern, a status, a user) is a
//! bound parameter ([`Param`]), never text of the SQL.

use serde::{Deserialize, Serialize};

use crate::store::{JobRecord, JobState};

/// The schema, applied at every open (`IF NOT EXISTS`). One row per ended
/// run, keyed by the job's id, its submission time (a later job may reuse
/// an id) and its systemd invocation ('' for a job that never ran), so a
/// record fed twice (the end hook, then the back-fill after a crash) is
/// one row. `jobs_by_period` holds every column a report and fair share
/// read, so a period is read from the index alone: the rows of a month
/// are not in end order in the table (a back-fill writes them in the
/// state directory's order), and one table lookup per row cost a month
/// of a million rows 0.3 s in `make bench`.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT NOT NULL,
    submitted_us INTEGER NOT NULL,
    invocation TEXT NOT NULL,
    uid INTEGER NOT NULL,
    user TEXT NOT NULL,
    gid INTEGER NOT NULL,
    sweep TEXT,
    name TEXT,
    status TEXT NOT NULL,
    exit_code INTEGER,
    signal INTEGER,
    started_us INTEGER,
    ended_us INTEGER NOT NULL,
    wall_us INTEGER NOT NULL,
    gpus INTEGER NOT NULL,
    gpu_indices TEXT NOT NULL,
    gpu_uuids TEXT NOT NULL,
    gpu_seconds REAL NOT NULL,
    cpu_nsec INTEGER,
    mem_peak_bytes INTEGER,
    io_read_bytes INTEGER,
    io_write_bytes INTEGER,
    gpu_util_avg REAL,
    gpu_mem_peak_mib INTEGER,
    PRIMARY KEY (id, submitted_us, invocation)
);
CREATE INDEX IF NOT EXISTS jobs_by_uid_ended ON jobs (uid, ended_us);
DROP INDEX IF EXISTS jobs_by_ended;
CREATE INDEX IF NOT EXISTS jobs_by_period ON jobs
    (ended_us, uid, gid, status, gpus, gpu_seconds, cpu_nsec, wall_us, user, gpu_indices);
CREATE INDEX IF NOT EXISTS jobs_by_user_ended ON jobs (user, ended_us);
";

/// One ended run, as the database keeps it and `ptrain history --json`
/// prints it. Fields are only ever added.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryRow {
    pub id: String,
    pub submitted_us: u64,
    /// systemd's invocation id; empty for a job that never ran.
    pub invocation: String,
    pub uid: u32,
    pub user: String,
    pub gid: u32,
    pub sweep: Option<String>,
    pub name: Option<String>,
    pub status: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub started_us: Option<u64>,
    pub ended_us: u64,
    pub wall_us: u64,
    pub gpus: u32,
    pub gpu_indices: Vec<u32>,
    pub gpu_uuids: Vec<String>,
    pub gpu_seconds: f64,
    pub cpu_nsec: Option<u64>,
    pub mem_peak_bytes: Option<u64>,
    pub io_read_bytes: Option<u64>,
    pub io_write_bytes: Option<u64>,
    /// NVML's samples over the run ([`super::gpu::run_figures`]): the
    /// average utilization of its GPUs (percent), and the highest memory
    /// used on any one of them (MiB). Absent without samples.
    #[serde(default)]
    pub gpu_util_avg_pct: Option<f64>,
    #[serde(default)]
    pub gpu_mem_peak_mib: Option<u64>,
}

impl HistoryRow {
    /// The row of an ended record; None for a job that has not ended.
    pub fn of(record: &JobRecord) -> Option<HistoryRow> {
        if record.state != JobState::Ended {
            return None;
        }
        let ended_us = record.ended_at?;
        let (exit_code, signal) = match &record.outcome {
            Some(crate::job::Outcome::Failed { exit_code }) => (Some(*exit_code), None),
            Some(crate::job::Outcome::Killed { signal }) => (None, Some(*signal)),
            Some(crate::job::Outcome::Succeeded) => (Some(0), None),
            _ => (None, None),
        };
        let usage = record.usage.clone().unwrap_or_default();
        let (gpu_util_avg_pct, gpu_mem_peak_mib) = super::gpu::run_figures(&record.gpu_usage);
        Some(HistoryRow {
            id: record.id.to_string(),
            submitted_us: record.submitted_at,
            invocation: record.invocation_id.clone().unwrap_or_default(),
            uid: record.owner.uid,
            user: record.owner.name.clone(),
            gid: record.owner.gid,
            sweep: record.group.as_ref().map(|g| g.to_string()),
            name: record.spec.name.clone(),
            status: record.status().to_string(),
            exit_code,
            signal,
            started_us: record.started_at,
            ended_us,
            wall_us: record.wall_usec().unwrap_or(0),
            gpus: record.gpus.len() as u32,
            gpu_indices: record.gpus.iter().map(|g| g.index).collect(),
            gpu_uuids: record.gpus.iter().map(|g| g.uuid.clone()).collect(),
            gpu_seconds: record.gpu_seconds(),
            cpu_nsec: usage.cpu_nsec,
            mem_peak_bytes: usage.mem_peak_bytes,
            io_read_bytes: usage.io_read_bytes,
            io_write_bytes: usage.io_write_bytes,
            gpu_util_avg_pct,
            gpu_mem_peak_mib,
        })
    }
}

/// A value bound to a `?` of the SQL.
#[derive(Clone, Debug, PartialEq)]
pub enum Param {
    Int(i64),
    Text(String),
}

/// The columns of [`HistoryRow`] in the table's order, for SELECT and
/// INSERT alike.
pub const ROW_COLUMNS: &[&str] = &[
    "id",
    "submitted_us",
    "invocation",
    "uid",
    "user",
    "gid",
    "sweep",
    "name",
    "status",
    "exit_code",
    "signal",
    "started_us",
    "ended_us",
    "wall_us",
    "gpus",
    "gpu_indices",
    "gpu_uuids",
    "gpu_seconds",
    "cpu_nsec",
    "mem_peak_bytes",
    "io_read_bytes",
    "io_write_bytes",
    "gpu_util_avg",
    "gpu_mem_peak_mib",
];

/// The INSERT of one row: a row already there (same id, submission and
/// invocation) is left as it is, so feeding a record twice adds nothing.
pub fn insert_sql() -> String {
    let marks = vec!["?"; ROW_COLUMNS.len()].join(", ");
    format!(
        "INSERT OR IGNORE INTO jobs ({}) VALUES ({marks})",
        ROW_COLUMNS.join(", ")
    )
}

/// What `ptrain history` asks (the CLI's flags, checked), sent to ptraind
/// as JSON. Times are µs since the epoch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryQuery {
    /// A user name, or a uid in digits.
    #[serde(default)]
    pub user: Option<String>,
    /// Runs whose owner's primary group was this gid.
    #[serde(default)]
    pub gid: Option<u32>,
    /// Runs that ended at or after this time.
    #[serde(default)]
    pub since_us: Option<u64>,
    /// Runs that ended before this time.
    #[serde(default)]
    pub until_us: Option<u64>,
    /// Status words (`succeeded`, `failed`, ...): any of them.
    #[serde(default)]
    pub statuses: Vec<String>,
    /// A glob (`*`, `?`, `[...]`) over the job's name or id.
    #[serde(default)]
    pub name: Option<String>,
    /// Runs that held exactly this many GPUs.
    #[serde(default)]
    pub gpus: Option<u32>,
    /// The newest `limit` runs (0: all of them).
    #[serde(default)]
    pub limit: u32,
}

/// The WHERE clause of a query as `caller_uid` may ask it: a user other
/// than root sees only their own runs, whatever the query says. Columns
/// are named with their table: the report by GPU joins `json_each`, whose
/// own columns include `id`.
fn conditions(q: &HistoryQuery, caller_uid: u32) -> (String, Vec<Param>) {
    let mut clauses: Vec<String> = Vec::new();
    let mut params = Vec::new();
    if caller_uid != 0 {
        clauses.push("jobs.uid = ?".into());
        params.push(Param::Int(caller_uid.into()));
    }
    if let Some(user) = &q.user {
        match user.parse::<u32>() {
            Ok(uid) => {
                clauses.push("jobs.uid = ?".into());
                params.push(Param::Int(uid.into()));
            }
            Err(_) => {
                clauses.push("jobs.user = ?".into());
                params.push(Param::Text(user.clone()));
            }
        }
    }
    if let Some(gid) = q.gid {
        clauses.push("jobs.gid = ?".into());
        params.push(Param::Int(gid.into()));
    }
    if let Some(since) = q.since_us {
        clauses.push("jobs.ended_us >= ?".into());
        params.push(Param::Int(since.min(i64::MAX as u64) as i64));
    }
    if let Some(until) = q.until_us {
        clauses.push("jobs.ended_us < ?".into());
        params.push(Param::Int(until.min(i64::MAX as u64) as i64));
    }
    if !q.statuses.is_empty() {
        let marks = vec!["?"; q.statuses.len()].join(", ");
        clauses.push(format!("jobs.status IN ({marks})"));
        params.extend(q.statuses.iter().cloned().map(Param::Text));
    }
    if let Some(pattern) = &q.name {
        clauses.push("(jobs.name GLOB ? OR jobs.id GLOB ?)".into());
        params.push(Param::Text(pattern.clone()));
        params.push(Param::Text(pattern.clone()));
    }
    if let Some(gpus) = q.gpus {
        clauses.push("jobs.gpus = ?".into());
        params.push(Param::Int(gpus.into()));
    }
    let sql = match clauses.is_empty() {
        true => String::new(),
        false => format!(" WHERE {}", clauses.join(" AND ")),
    };
    (sql, params)
}

/// Fair share's runs: (uid, gid, ended_us, gpu_seconds) of the GPU runs
/// that ended in `[from_us, until_us)`, oldest first (so a user's last
/// group is their latest run's).
pub fn usage_sql(from_us: u64, until_us: u64) -> (String, Vec<Param>) {
    (
        "SELECT uid, gid, ended_us, gpu_seconds FROM jobs \
         WHERE ended_us >= ?1 AND ended_us < ?2 AND gpu_seconds > 0 ORDER BY ended_us"
            .to_owned(),
        vec![Param::Int(from_us as i64), Param::Int(until_us as i64)],
    )
}

/// The quotas' window: (uid, bucket, GPU-seconds) summed per user and
/// bucket (`ended_us / bucket_us`) of the runs that ended in `[from_us,
/// until_us)`, through the index by end time.
pub fn window_sql(from_us: u64, until_us: u64, bucket_us: u64) -> (String, Vec<Param>) {
    (
        "SELECT uid, ended_us / ?3 AS bucket, TOTAL(gpu_seconds) FROM jobs \
         WHERE ended_us >= ?1 AND ended_us < ?2 AND gpu_seconds > 0 GROUP BY uid, bucket"
            .to_owned(),
        vec![
            Param::Int(from_us as i64),
            Param::Int(until_us as i64),
            Param::Int(bucket_us.max(1) as i64),
        ],
    )
}

/// `ptrain history`: the newest `limit` runs that match, newest first
/// (the caller prints them oldest first).
pub fn history_sql(q: &HistoryQuery, caller_uid: u32) -> (String, Vec<Param>) {
    let (filter, mut params) = conditions(q, caller_uid);
    let mut sql = format!(
        "SELECT {} FROM jobs{filter} ORDER BY ended_us DESC, id DESC",
        ROW_COLUMNS.join(", ")
    );
    if q.limit > 0 {
        sql.push_str(" LIMIT ?");
        params.push(Param::Int(q.limit.into()));
    }
    (sql, params)
}

/// What `ptrain report` sums by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReportBy {
    #[default]
    User,
    Group,
    /// Per GPU index: each run counts once for every GPU it held, with
    /// its wall time as that GPU's hours.
    Gpu,
}

/// `ptrain report`: the same filters as history ([`HistoryQuery`], its
/// limit unused), summed by user or group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportQuery {
    #[serde(default)]
    pub filter: HistoryQuery,
    #[serde(default)]
    pub by: ReportBy,
    /// Only the `top` lines with the most GPU-hours (0: all).
    #[serde(default)]
    pub top: u32,
}

/// One line of `ptrain report`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReportRow {
    /// The user's name (by user), the gid in digits (by group) or the
    /// GPU's index in digits (by GPU).
    pub key: String,
    /// The uid (by user), gid (by group) or GPU index (by GPU).
    pub id: u32,
    pub jobs: u64,
    pub succeeded: u64,
    /// Runs that could have succeeded: all but `not-needed` ones.
    pub counted: u64,
    pub gpu_hours: f64,
    pub cpu_hours: f64,
    pub wall_hours: f64,
}

impl ReportRow {
    /// Succeeded ÷ runs that could have (`not-needed` ones do not count);
    /// None when there were none.
    pub fn success_rate(&self) -> Option<f64> {
        (self.counted > 0).then(|| self.succeeded as f64 / self.counted as f64)
    }
}

/// The SQL of a report, heaviest GPU users first.
pub fn report_sql(q: &ReportQuery, caller_uid: u32) -> (String, Vec<Param>) {
    let (filter, mut params) = conditions(&q.filter, caller_uid);
    // A period over everyone's runs is read by end time, from the
    // covering index. Left to itself, SQLite reads the whole table in uid
    // order to save the GROUP BY's sort (a million rows for a month's
    // tenth of them: 0.4 s in `make bench`); one user's runs are found by
    // uid or name as it would.
    let f = &q.filter;
    let jobs =
        match (f.since_us.is_some() || f.until_us.is_some()) && caller_uid == 0 && f.user.is_none()
        {
            true => "jobs INDEXED BY jobs_by_period",
            false => "jobs",
        };
    let (key, id, from, gpu_hours) = match q.by {
        ReportBy::User => (
            "MAX(user)",
            "uid",
            jobs.to_owned(),
            "TOTAL(gpu_seconds) / 3600.0",
        ),
        ReportBy::Group => (
            "CAST(gid AS TEXT)",
            "gid",
            jobs.to_owned(),
            "TOTAL(gpu_seconds) / 3600.0",
        ),
        // One row per (run, GPU it held): gpu_indices is "0,1".
        ReportBy::Gpu => (
            "CAST(g.value AS TEXT)",
            "g.value",
            format!("{jobs}, json_each('[' || jobs.gpu_indices || ']') AS g"),
            "TOTAL(wall_us) / 3.6e9",
        ),
    };
    let mut sql = format!(
        "SELECT {key}, {id}, COUNT(*), \
         SUM(status = 'succeeded'), SUM(status != 'not-needed'), \
         {gpu_hours}, TOTAL(cpu_nsec) / 3.6e12, TOTAL(wall_us) / 3.6e9 \
         FROM {from}{filter} GROUP BY {id} ORDER BY 6 DESC, 2"
    );
    if q.top > 0 {
        sql.push_str(" LIMIT ?");
        params.push(Param::Int(q.top.into()));
    }
    (sql, params)
}

/// The columns `ptrain history --format` knows, and what each shows.
pub const FORMAT_COLUMNS: &[(&str, &str)] = &[
    ("id", "the job's id"),
    ("name", "its name (the descriptor's name)"),
    ("user", "its owner"),
    ("uid", "its owner's uid"),
    ("sweep", "the sweep it belongs to"),
    ("status", "how it ended"),
    ("exit", "its exit code, or the signal that killed it"),
    ("submitted", "when it was submitted (UTC)"),
    ("started", "when its command started"),
    ("ended", "when it ended"),
    ("wall", "its run time"),
    ("gpus", "how many GPUs it held"),
    ("gpu_ids", "their indices"),
    ("gpu_uuids", "their UUIDs"),
    ("gpu_hours", "GPU-hours: run time times GPUs"),
    ("cpu", "its CPU time"),
    ("mem_peak", "its memory peak"),
    ("read", "bytes it read from block devices"),
    ("written", "bytes it wrote to block devices"),
    ("gpu_util", "its GPUs' average utilization (NVML samples)"),
    (
        "gpu_mem_peak",
        "the most memory it used on one GPU (NVML samples)",
    ),
    ("invocation", "its systemd invocation id"),
];

/// What `ptrain history` shows without `--format`.
pub const DEFAULT_FORMAT: &str = "id,user,status,exit,ended,wall,gpus,gpu_hours,cpu,mem_peak";

/// A `--format` list, checked: the names, or the one that is unknown.
pub fn parse_format(text: &str) -> Result<Vec<&'static str>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(|c| {
            FORMAT_COLUMNS
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(c))
                .map(|(name, _)| *name)
                .ok_or_else(|| {
                    let known: Vec<_> = FORMAT_COLUMNS.iter().map(|(n, _)| *n).collect();
                    format!(
                        "unknown column {c:?} in --format; the columns are {}",
                        known.join(",")
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(|cols| match cols.is_empty() {
            true => Err("--format names no column; e.g. --format id,user,gpu_hours".into()),
            false => Ok(cols),
        })
}

fn time(micros: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_micros(micros);
    humantime::format_rfc3339_seconds(t).to_string()
}

fn seconds(micros: u64) -> String {
    humantime::format_duration(std::time::Duration::from_secs(micros / 1_000_000)).to_string()
}

/// One cell of a row, as text (raw: the caller escapes it for a terminal
/// or quotes it for CSV). Unknown figures are empty.
pub fn cell(row: &HistoryRow, column: &str) -> String {
    let opt = |v: Option<String>| v.unwrap_or_default();
    let join = |v: &[String]| v.join(",");
    match column {
        "id" => row.id.clone(),
        "name" => opt(row.name.clone()),
        "user" => row.user.clone(),
        "uid" => row.uid.to_string(),
        "sweep" => opt(row.sweep.clone()),
        "status" => row.status.clone(),
        "exit" => match (row.exit_code, row.signal) {
            (Some(code), _) => code.to_string(),
            (None, Some(sig)) => crate::job::signal_name(sig),
            (None, None) => String::new(),
        },
        "submitted" => time(row.submitted_us),
        "started" => opt(row.started_us.map(time)),
        "ended" => time(row.ended_us),
        "wall" => seconds(row.wall_us),
        "gpus" => row.gpus.to_string(),
        "gpu_ids" => join(
            &row.gpu_indices
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>(),
        ),
        "gpu_uuids" => join(&row.gpu_uuids),
        "gpu_hours" => format!("{:.3}", row.gpu_seconds / 3600.0),
        "cpu" => opt(row.cpu_nsec.map(|n| format!("{:.1}s", n as f64 / 1e9))),
        "mem_peak" => opt(row.mem_peak_bytes.map(super::bytes)),
        "read" => opt(row.io_read_bytes.map(super::bytes)),
        "written" => opt(row.io_write_bytes.map(super::bytes)),
        "gpu_util" => opt(row.gpu_util_avg_pct.map(|p| format!("{p:.0}%"))),
        "gpu_mem_peak" => opt(row.gpu_mem_peak_mib.map(|m| super::bytes(m << 20))),
        "invocation" => row.invocation.clone(),
        _ => String::new(),
    }
}

/// A field of CSV (RFC 4180): quoted when it holds a comma, a quote or a
/// line break, its quotes doubled. A leading `=`, `+`, `-` or `@` gets a
/// `'` first, so a spreadsheet never runs a job's name as a formula.
pub fn csv_field(text: &str) -> String {
    let guarded = match text.chars().next() {
        Some('=' | '+' | '-' | '@') if text.parse::<f64>().is_err() => format!("'{text}"),
        _ => text.to_owned(),
    };
    if guarded.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", guarded.replace('"', "\"\""))
    } else {
        guarded
    }
}

/// Lines of CSV: a header and one line per row.
pub fn csv(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = String::new();
    let line = |cells: &mut dyn Iterator<Item = String>| cells.collect::<Vec<_>>().join(",") + "\n";
    out.push_str(&line(&mut header.iter().map(|h| csv_field(h))));
    for row in rows {
        out.push_str(&line(&mut row.iter().map(|c| csv_field(c))));
    }
    out
}

/// An aligned table for people: every cell passed through
/// [`crate::display::escape`] (a job's name is anyone's text).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let header: Vec<String> = header.iter().map(|h| h.to_uppercase()).collect();
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            r.iter()
                .map(|c| crate::display::escape(c).into_owned())
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for cells in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The cells of a report line, in [`REPORT_COLUMNS`]' order.
pub fn report_cells(row: &ReportRow) -> Vec<String> {
    vec![
        row.key.clone(),
        row.jobs.to_string(),
        row.succeeded.to_string(),
        row.success_rate()
            .map(|r| format!("{:.1}%", r * 100.0))
            .unwrap_or_default(),
        format!("{:.3}", row.gpu_hours),
        format!("{:.3}", row.cpu_hours),
        format!("{:.3}", row.wall_hours),
    ]
}

pub const REPORT_COLUMNS: &[&str] = &[
    "user",
    "jobs",
    "succeeded",
    "success",
    "gpu_hours",
    "cpu_hours",
    "wall_hours",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn q() -> HistoryQuery {
        HistoryQuery::default()
    }

    #[test]
    fn a_user_other_than_root_is_confined_to_their_own_rows_whatever_they_ask() {
        let (sql, params) = history_sql(&q(), 1000);
        assert!(sql.contains(" WHERE jobs.uid = ?"), "{sql}");
        assert_eq!(params, [Param::Int(1000)]);
        // Asking for Bob adds a condition; it never lifts the caller's.
        let ask = HistoryQuery {
            user: Some("bob".into()),
            ..q()
        };
        let (sql, params) = history_sql(&ask, 1000);
        assert!(sql.contains("jobs.uid = ? AND jobs.user = ?"), "{sql}");
        assert_eq!(params, [Param::Int(1000), Param::Text("bob".into())]);
        // Root sees everyone's.
        let (sql, params) = history_sql(&q(), 0);
        assert!(!sql.contains("WHERE"), "{sql}");
        assert!(params.is_empty());
        // The same holds for reports.
        for by in [ReportBy::User, ReportBy::Group, ReportBy::Gpu] {
            let (sql, _) = report_sql(
                &ReportQuery {
                    by,
                    ..ReportQuery::default()
                },
                1000,
            );
            assert!(sql.contains(" WHERE jobs.uid = ?"), "{sql}");
        }
    }

    #[test]
    fn every_filter_is_a_bound_parameter_never_sql_text() {
        let hostile = "x' OR 1=1; DROP TABLE jobs; --";
        let ask = HistoryQuery {
            user: Some(hostile.into()),
            gid: Some(7),
            since_us: Some(10),
            until_us: Some(20),
            statuses: vec!["failed".into(), hostile.into()],
            name: Some(hostile.into()),
            gpus: Some(2),
            limit: 100,
        };
        let (sql, params) = history_sql(&ask, 0);
        assert!(!sql.contains("DROP") && !sql.contains('\''), "{sql}");
        assert_eq!(sql.matches('?').count(), params.len(), "{sql}");
        assert_eq!(
            params,
            [
                Param::Text(hostile.into()),
                Param::Int(7),
                Param::Int(10),
                Param::Int(20),
                Param::Text("failed".into()),
                Param::Text(hostile.into()),
                Param::Text(hostile.into()),
                Param::Text(hostile.into()),
                Param::Int(2),
                Param::Int(100),
            ]
        );
        assert!(
            sql.ends_with("ORDER BY ended_us DESC, id DESC LIMIT ?"),
            "{sql}"
        );
        // A uid in digits is a uid.
        let (sql, params) = history_sql(
            &HistoryQuery {
                user: Some("1000".into()),
                ..q()
            },
            0,
        );
        assert!(sql.contains("WHERE jobs.uid = ?"), "{sql}");
        assert_eq!(params, [Param::Int(1000)]);
    }

    #[test]
    fn insert_names_every_column_once_and_ignores_a_row_already_there() {
        let sql = insert_sql();
        assert!(sql.starts_with("INSERT OR IGNORE INTO jobs"), "{sql}");
        assert_eq!(sql.matches('?').count(), ROW_COLUMNS.len());
        for c in ROW_COLUMNS {
            assert!(
                SCHEMA.contains(&format!("    {c} ")),
                "{c} is not in the schema"
            );
        }
    }

    #[test]
    fn format_lists_are_checked_with_the_known_columns_in_the_message() {
        assert_eq!(
            parse_format("id, USER,gpu_hours").unwrap(),
            ["id", "user", "gpu_hours"]
        );
        let e = parse_format("id,color").unwrap_err();
        assert!(e.contains("\"color\"") && e.contains("gpu_hours"), "{e}");
        assert!(parse_format(" , ").is_err());
        assert!(parse_format(DEFAULT_FORMAT).is_ok());
    }

    fn row() -> HistoryRow {
        HistoryRow {
            id: "j1".into(),
            submitted_us: 0,
            invocation: "abc".into(),
            uid: 1000,
            user: "alice".into(),
            gid: 1000,
            sweep: None,
            name: Some("=cmd|' /C calc'!A0".into()),
            status: "killed".into(),
            exit_code: None,
            signal: Some(9),
            started_us: Some(1_000_000),
            ended_us: 4_000_000,
            wall_us: 3_000_000,
            gpus: 2,
            gpu_indices: vec![0, 1],
            gpu_uuids: vec!["GPU-a".into(), "GPU-b".into()],
            gpu_seconds: 6.0,
            cpu_nsec: Some(2_500_000_000),
            mem_peak_bytes: Some(200 << 20),
            io_read_bytes: None,
            io_write_bytes: None,
            gpu_util_avg_pct: Some(72.6),
            gpu_mem_peak_mib: Some(2048),
        }
    }

    #[test]
    fn cells_show_each_figure_and_leave_unknown_ones_empty() {
        let r = row();
        assert_eq!(cell(&r, "exit"), "SIGKILL");
        assert_eq!(cell(&r, "wall"), "3s");
        assert_eq!(cell(&r, "gpu_ids"), "0,1");
        assert_eq!(cell(&r, "gpu_hours"), "0.002");
        assert_eq!(cell(&r, "cpu"), "2.5s");
        assert_eq!(cell(&r, "mem_peak"), "200.0 MiB");
        assert_eq!(cell(&r, "read"), "");
        assert_eq!(cell(&r, "ended"), "1970-01-01T00:00:04Z");
    }

    #[test]
    fn csv_quotes_and_defuses_what_a_user_wrote() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("=1+1"), "'=1+1");
        assert_eq!(csv_field("-3"), "-3");
        let out = csv(&["id", "name"], &[vec!["j1".into(), cell(&row(), "name")]]);
        assert_eq!(out, "id,name\nj1,'=cmd|' /C calc'!A0\n");
    }

    #[test]
    fn the_table_escapes_terminal_controls_and_aligns() {
        let out = table(
            &["id", "name"],
            &[
                vec!["j1".into(), "\x1b]0;owned\x07".into()],
                vec!["job-22".into(), "x".into()],
            ],
        );
        assert!(!out.contains('\x1b'), "{out:?}");
        let lines: Vec<_> = out.lines().collect();
        assert_eq!(lines[0], "ID      NAME");
        assert!(lines[1].starts_with("j1      \\x1b"), "{out}");
        assert_eq!(lines[2], "job-22  x");
    }

    #[test]
    fn a_report_row_leaves_not_needed_out_of_the_success_rate() {
        let r = ReportRow {
            key: "alice".into(),
            id: 1000,
            jobs: 5,
            succeeded: 3,
            counted: 4,
            gpu_hours: 1.5,
            cpu_hours: 0.25,
            wall_hours: 2.0,
        };
        assert_eq!(r.success_rate(), Some(0.75));
        assert_eq!(report_cells(&r)[3], "75.0%");
        let none = ReportRow { counted: 0, ..r };
        assert_eq!(none.success_rate(), None);
    }
}
