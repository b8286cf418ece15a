//! The accounting database, `STATE/accounting.sqlite` (root's, 0600, WAL):
//! its writer task, fed the ended records, and the queries. The SQLite
//! side runs only in ptraind's short-lived children ([`super::helper`]).
//!
//! The end record on disk comes first ([`crate::store::Store::save`]); the
//! row follows it, from a task of its own, so the state task never waits
//! on SQLite. A crash between the two loses no row: at every start the
//! writer back-fills the ended records the database lacks, and a row that
//! is already there is ignored ([`super::query::insert_sql`]), so none is
//! doubled either.

use std::path::{Path, PathBuf};

use rusqlite::{params_from_iter, Connection, OpenFlags};
use tracing::{info, warn};

use super::query::{
    history_sql, insert_sql, report_sql, HistoryQuery, HistoryRow, Param, ReportQuery, ReportRow,
    SCHEMA,
};
use crate::store::JobRecord;

/// The database's file in the state directory.
pub const DB_FILE: &str = "accounting.sqlite";

/// How long a query or a write waits for the other side's lock.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum AccountingError {
    #[error("accounting database {path}: {source}; move it aside and restart ptraind to rebuild it from the job records in STATE/jobs (runs already compacted into history.jsonl are not rebuilt)")]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("cannot create the accounting database {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub fn db_path(state_dir: &Path) -> PathBuf {
    state_dir.join(DB_FILE)
}

fn sqlite_err(path: &Path) -> impl FnOnce(rusqlite::Error) -> AccountingError + '_ {
    move |source| AccountingError::Sqlite {
        path: path.to_owned(),
        source,
    }
}

/// Opens (creating, root-only) the database for writing, in WAL mode with
/// its schema.
pub fn open_for_writing(path: &Path) -> Result<Connection, AccountingError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    // Made 0600 before SQLite ever opens it; its -wal and -shm files take
    // the same mode from it.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .and_then(|f| f.set_permissions(std::fs::Permissions::from_mode(0o600)))
        .map_err(|source| AccountingError::Create {
            path: path.to_owned(),
            source,
        })?;
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sqlite_err(path))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(sqlite_err(path))?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(sqlite_err(path))?;
    // WAL with NORMAL is durable at each checkpoint, and a row lost to a
    // power cut is back-filled from its record at the next start.
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(sqlite_err(path))?;
    conn.execute_batch(SCHEMA).map_err(sqlite_err(path))?;
    add_missing_columns(&conn).map_err(sqlite_err(path))?;
    bound_cache(&conn, path)?;
    Ok(conn)
}

/// Columns added to the table after its first release, with their types:
/// a database made by an older ptraind gets them at its first open for
/// writing (its rows have them NULL: unknown, never 0).
const ADDED_COLUMNS: &[(&str, &str)] = &[("gpu_util_avg", "REAL"), ("gpu_mem_peak_mib", "INTEGER")];

fn add_missing_columns(conn: &Connection) -> rusqlite::Result<()> {
    let mut have = Vec::new();
    {
        let mut stmt = conn.prepare("SELECT name FROM pragma_table_info('jobs')")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            have.push(row.get::<_, String>(0)?);
        }
    }
    for (name, kind) in ADDED_COLUMNS {
        if !have.iter().any(|h| h == name) {
            conn.execute_batch(&format!("ALTER TABLE jobs ADD COLUMN {name} {kind}"))?;
        }
    }
    Ok(())
}

/// The page cache of a connection: SQLite's default (2 MiB) held by the
/// writer for ptraind's whole life would be a tenth of its idle RSS
/// target; the queries read a few index pages each.
fn bound_cache(conn: &Connection, path: &Path) -> Result<(), AccountingError> {
    conn.pragma_update(None, "cache_size", CACHE_KIB)
        .map_err(sqlite_err(path))
}

/// [`bound_cache`]'s size: negative is KiB in SQLite's terms.
const CACHE_KIB: i64 = -256;

fn bind(params: &[Param]) -> Vec<rusqlite::types::Value> {
    params
        .iter()
        .map(|p| match p {
            Param::Int(i) => rusqlite::types::Value::Integer(*i),
            Param::Text(t) => rusqlite::types::Value::Text(t.clone()),
        })
        .collect()
}

fn int(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

/// Inserts the rows in one transaction; rows already there are left
/// alone. Returns how many were new.
pub fn insert_rows(conn: &mut Connection, rows: &[HistoryRow]) -> rusqlite::Result<usize> {
    let tx = conn.transaction()?;
    let mut added = 0;
    {
        let mut stmt = tx.prepare_cached(&insert_sql())?;
        for r in rows {
            added += stmt.execute(rusqlite::params![
                r.id,
                int(r.submitted_us),
                r.invocation,
                r.uid,
                r.user,
                r.gid,
                r.sweep,
                r.name,
                r.status,
                r.exit_code,
                r.signal,
                r.started_us.map(int),
                int(r.ended_us),
                int(r.wall_us),
                r.gpus,
                r.gpu_indices
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
                r.gpu_uuids.join(","),
                r.gpu_seconds,
                r.cpu_nsec.map(int),
                r.mem_peak_bytes.map(int),
                r.io_read_bytes.map(int),
                r.io_write_bytes.map(int),
                r.gpu_util_avg_pct,
                r.gpu_mem_peak_mib.map(int),
            ])?;
        }
    }
    tx.commit()?;
    Ok(added)
}

fn row_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<HistoryRow> {
    let u = |i: usize| -> rusqlite::Result<u64> { Ok(r.get::<_, i64>(i)?.max(0) as u64) };
    let ou = |i: usize| -> rusqlite::Result<Option<u64>> {
        Ok(r.get::<_, Option<i64>>(i)?.map(|v| v.max(0) as u64))
    };
    let list = |i: usize| -> rusqlite::Result<Vec<String>> {
        let text: String = r.get(i)?;
        Ok(text
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect())
    };
    Ok(HistoryRow {
        id: r.get(0)?,
        submitted_us: u(1)?,
        invocation: r.get(2)?,
        uid: r.get(3)?,
        user: r.get(4)?,
        gid: r.get(5)?,
        sweep: r.get(6)?,
        name: r.get(7)?,
        status: r.get(8)?,
        exit_code: r.get(9)?,
        signal: r.get(10)?,
        started_us: ou(11)?,
        ended_us: u(12)?,
        wall_us: u(13)?,
        gpus: r.get(14)?,
        gpu_indices: list(15)?.iter().filter_map(|s| s.parse().ok()).collect(),
        gpu_uuids: list(16)?,
        gpu_seconds: r.get(17)?,
        cpu_nsec: ou(18)?,
        mem_peak_bytes: ou(19)?,
        io_read_bytes: ou(20)?,
        io_write_bytes: ou(21)?,
        gpu_util_avg_pct: r.get(22)?,
        gpu_mem_peak_mib: ou(23)?,
    })
}

/// Opens the database read-only for one query; a database not made yet
/// (no job has ended) is an empty history.
fn open_for_reading(path: &Path) -> Result<Option<Connection>, AccountingError> {
    if !path.exists() {
        return Ok(None);
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sqlite_err(path))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(sqlite_err(path))?;
    bound_cache(&conn, path)?;
    Ok(Some(conn))
}

/// The rows of one query, each made by `row`; a database not made yet is
/// no rows.
fn query_rows<T>(
    path: &Path,
    (sql, params): (String, Vec<Param>),
    row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> Result<Vec<T>, AccountingError> {
    let Some(conn) = open_for_reading(path)? else {
        return Ok(Vec::new());
    };
    let run = || -> rusqlite::Result<Vec<T>> {
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map(params_from_iter(bind(&params)), row)?;
        rows.collect()
    };
    run().map_err(sqlite_err(path))
}

/// `ptrain history`, as `caller_uid` may see it: oldest first.
pub fn history(
    path: &Path,
    q: &HistoryQuery,
    caller_uid: u32,
) -> Result<Vec<HistoryRow>, AccountingError> {
    let mut rows = query_rows(path, history_sql(q, caller_uid), row_of)?;
    rows.reverse();
    Ok(rows)
}

/// `ptrain report`, as `caller_uid` may see it.
pub fn report(
    path: &Path,
    q: &ReportQuery,
    caller_uid: u32,
) -> Result<Vec<ReportRow>, AccountingError> {
    query_rows(path, report_sql(q, caller_uid), |r| {
        Ok(ReportRow {
            key: r.get(0)?,
            id: r.get(1)?,
            jobs: r.get::<_, i64>(2)?.max(0) as u64,
            succeeded: r.get::<_, i64>(3)?.max(0) as u64,
            counted: r.get::<_, i64>(4)?.max(0) as u64,
            gpu_hours: r.get(5)?,
            cpu_hours: r.get(6)?,
            wall_hours: r.get(7)?,
        })
    })
}

/// Fair share's figures ([`crate::fair_share`]): each user's and group's
/// GPU-seconds of the runs that ended before `until_us` and within
/// [`crate::fair_share::HORIZON_HALF_LIVES`] half-lives of it, each
/// weighed by its age, through the index by end time.
pub fn usage(
    path: &Path,
    until_us: u64,
    half_life: std::time::Duration,
) -> Result<crate::fair_share::Usage, AccountingError> {
    let horizon = half_life.as_micros() as u64 * u64::from(crate::fair_share::HORIZON_HALF_LIVES);
    let (sql, params) = super::query::usage_sql(until_us.saturating_sub(horizon), until_us);
    let runs = query_rows(path, (sql, params), |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
            r.get::<_, f64>(3)?,
        ))
    })?;
    let mut usage = crate::fair_share::Usage::new(until_us);
    for (uid, gid, ended_us, gpu_seconds) in runs {
        let (Ok(uid), Ok(gid), Ok(ended_us)) = (
            u32::try_from(uid),
            u32::try_from(gid),
            u64::try_from(ended_us),
        ) else {
            continue;
        };
        usage.add(uid, gid, gpu_seconds, ended_us, half_life);
    }
    Ok(usage)
}

/// The quotas' sums ([`super::query::window_sql`]): (uid, bucket,
/// GPU-seconds).
pub fn window(
    path: &Path,
    from_us: u64,
    until_us: u64,
    bucket_us: u64,
) -> Result<Vec<(u32, u64, f64)>, AccountingError> {
    let sums = query_rows(
        path,
        super::query::window_sql(from_us, until_us, bucket_us),
        |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, f64>(2)?,
            ))
        },
    )?;
    Ok(sums
        .into_iter()
        .filter_map(|(uid, bucket, s)| {
            Some((u32::try_from(uid).ok()?, u64::try_from(bucket).ok()?, s))
        })
        .collect())
}

/// The writer: a task of ptraind that takes ended records from a channel
/// and hands them to a `ptraind accounting stream` child
/// ([`super::helper`]): SQLite never runs in ptraind itself, and the state
/// task never waits on it. Sending never blocks.
///
/// Rows are committed in groups: a row waits up to [`GROUP_COMMIT`] for
/// others, so a steady run of ends costs one transaction (and one wake-up
/// of the child) per group, not per job. Nothing waits on the delay: every
/// read (`ptrain history`, `report`, fair share's and the quotas' figures)
/// goes through this task and is answered only after every row sent before
/// it is written. A row a crash loses in the delay is on disk in its job's
/// end record, which the next start's back-fill adds; a retried attempt's
/// run, whose record becomes the next attempt's, has no such record, so
/// its row is written at once; a stop of ptraind writes what waits
/// ([`Writer::flush`]).
#[derive(Clone)]
pub struct Writer {
    tx: tokio::sync::mpsc::UnboundedSender<ToWriter>,
}

/// How long a row waits for more before they are written together.
pub const GROUP_COMMIT: std::time::Duration = std::time::Duration::from_millis(1000);

/// How long a group's write may take before its child is killed and the
/// group tried once more on a new one: a hung child must not hold every
/// query that waits behind it.
const STREAM_WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A group this large is written at once.
const MAX_GROUP: usize = 1000;

/// What the writer task is handed, in order.
enum ToWriter {
    /// A row; `at_once`: written now, not grouped.
    Row { row: Box<HistoryRow>, at_once: bool },
    /// Every row sent before is written; then the sender is told.
    Flush(tokio::sync::oneshot::Sender<()>),
    /// A read-only task run once every row sent before is written, with
    /// `input` as its child's stdin; its answer as JSON.
    Read {
        task: super::helper::Task,
        input: Vec<u8>,
        reply: tokio::sync::oneshot::Sender<Result<String, String>>,
    },
}

/// A [`ToWriter::Read`]'s answer to come, parsed.
async fn answer<T: serde::de::DeserializeOwned>(
    answer: tokio::sync::oneshot::Receiver<Result<String, String>>,
) -> Result<T, String> {
    let json = answer
        .await
        .map_err(|_| "the accounting writer stopped".to_owned())??;
    serde_json::from_str(&json).map_err(|e| format!("the accounting helper's answer: {e}"))
}

impl Writer {
    /// Starts the writer task (in the current tokio runtime): its first
    /// child back-fills every ended record of `STATE/jobs/` the database
    /// lacks (jobs that ended while ptraind was down, or whose row a crash
    /// lost), then the stream writes the rows that waited. Call it after
    /// the state is restored.
    pub fn start(state_dir: &Path) -> Writer {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<ToWriter>();
        let state_dir = state_dir.to_owned();
        tokio::spawn(async move { writer_task(&state_dir, rx).await });
        Writer { tx }
    }

    /// Hands an ended run's row to the writer. `only_here`: no end record
    /// on disk holds the run (a retried attempt, whose record is the next
    /// attempt's now), so no back-fill could add a row a crash lost: it is
    /// written at once.
    pub fn record(&self, record: &JobRecord, only_here: bool) {
        if let Some(row) = HistoryRow::of(record) {
            let _ = self.tx.send(ToWriter::Row {
                row: Box::new(row),
                at_once: only_here,
            });
        }
    }

    /// Returns once every row sent before is written (or could not be).
    pub async fn flush(&self) {
        let (done, written) = tokio::sync::oneshot::channel();
        if self.tx.send(ToWriter::Flush(done)).is_ok() {
            let _ = written.await;
        }
    }

    /// Fair share's figures of the runs that ended before `until_us`
    /// ([`usage`]), read after the back-fill and every row sent before
    /// this call.
    pub fn usage(
        &self,
        until_us: u64,
        half_life: std::time::Duration,
    ) -> impl std::future::Future<Output = Result<crate::fair_share::Usage, String>> {
        answer(self.read(
            super::helper::Task::Usage {
                until_us,
                half_life_secs: half_life.as_secs().max(1),
            },
            Vec::new(),
        ))
    }

    /// The quotas' sums of the runs that ended in `[from_us, until_us)`
    /// ([`window`]), read as [`Writer::usage`] is.
    pub fn window(
        &self,
        from_us: u64,
        until_us: u64,
        bucket_us: u64,
    ) -> impl std::future::Future<Output = Result<Vec<(u32, u64, f64)>, String>> {
        answer(self.read(
            super::helper::Task::Window {
                from_us,
                until_us,
                bucket_us,
            },
            Vec::new(),
        ))
    }

    /// A caller's query (`History`, `Report`: `input` is the query as
    /// JSON), answered as [`Writer::usage`] is: every run that ended
    /// before the call is in it.
    pub async fn query(&self, task: super::helper::Task, input: Vec<u8>) -> Result<String, String> {
        self.read(task, input)
            .await
            .map_err(|_| "the accounting writer stopped".to_owned())?
    }

    fn read(
        &self,
        task: super::helper::Task,
        input: Vec<u8>,
    ) -> tokio::sync::oneshot::Receiver<Result<String, String>> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let _ = self.tx.send(ToWriter::Read { task, input, reply });
        answer
    }
}

async fn writer_task(state_dir: &Path, mut rx: tokio::sync::mpsc::UnboundedReceiver<ToWriter>) {
    let path = db_path(state_dir);
    match super::helper::write(state_dir, &[], true).await {
        Ok(s) => info!(
            seen = s.seen,
            added = s.added,
            "accounting database back-filled from the job records"
        ),
        Err(e) => {
            warn!(error = %e, path = %path.display(), "cannot back-fill the accounting database; the next start tries again")
        }
    }
    // Rows go to one child kept while ends keep coming (a burst, a
    // sweep, one job after another), closed after a pause so that SQLite
    // is out of memory between them; reads run in children of their own,
    // side by side, each once the rows before it are written.
    let mut group = Group::default();
    loop {
        let waited = match (group.due, &group.stream) {
            (Some(due), _) => tokio::time::timeout_at(due, rx.recv()).await,
            (None, Some(_)) => tokio::time::timeout(super::helper::STREAM_IDLE, rx.recv()).await,
            (None, None) => Ok(rx.recv().await),
        };
        match waited {
            Err(_elapsed) if group.due.is_some() => group.commit(state_dir).await,
            Err(_elapsed) => {
                if let Some(idle) = group.stream.take() {
                    idle.close().await;
                }
            }
            Ok(None) => break,
            Ok(Some(ToWriter::Row { row, at_once })) => {
                group.add(*row);
                if at_once || group.rows.len() >= MAX_GROUP {
                    group.commit(state_dir).await;
                }
            }
            Ok(Some(ToWriter::Flush(done))) => {
                group.commit(state_dir).await;
                let _ = done.send(());
            }
            Ok(Some(ToWriter::Read {
                task,
                input,
                mut reply,
            })) => {
                group.commit(state_dir).await;
                let state_dir = state_dir.to_owned();
                tokio::spawn(async move {
                    // A caller gone (a D-Bus call given up) kills the
                    // child: the run is dropped.
                    tokio::select! {
                        answer = super::helper::run(task, &state_dir, input) => {
                            let _ = reply.send(answer);
                        }
                        () = reply.closed() => {}
                    }
                });
            }
        }
    }
    group.commit(state_dir).await;
    if let Some(stream) = group.stream {
        stream.close().await;
    }
}

/// The rows waiting to be committed together, and the stream they go to.
#[derive(Default)]
struct Group {
    rows: Vec<HistoryRow>,
    /// When the oldest waiting row is to be written.
    due: Option<tokio::time::Instant>,
    stream: Option<super::helper::Stream>,
}

impl Group {
    fn add(&mut self, row: HistoryRow) {
        self.due
            .get_or_insert_with(|| tokio::time::Instant::now() + GROUP_COMMIT);
        self.rows.push(row);
    }

    /// Writes the waiting rows in one transaction, if any.
    async fn commit(&mut self, state_dir: &Path) {
        self.due = None;
        if self.rows.is_empty() {
            return;
        }
        let rows = std::mem::take(&mut self.rows);
        if let Err(e) = write_rows(state_dir, &mut self.stream, &rows).await {
            // The records are on disk: the next start's back-fill adds them.
            warn!(error = %e, path = %db_path(state_dir).display(), rows = rows.len(), "cannot write to the accounting database; the rows are added at the next start");
        }
    }
}

/// Writes a batch through the open stream, or a new one; a stream that
/// fails is dropped (killed) and the batch tried once more on a new one.
async fn write_rows(
    state_dir: &Path,
    stream: &mut Option<super::helper::Stream>,
    rows: &[HistoryRow],
) -> Result<(), String> {
    let mut failed = String::new();
    for _ in 0..2 {
        let open = match stream {
            Some(open) => open,
            None => stream.insert(super::helper::Stream::start(state_dir)?),
        };
        match tokio::time::timeout(STREAM_WRITE_TIMEOUT, open.write(rows)).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => failed = e,
            Err(_) => {
                failed = format!(
                    "`ptraind accounting stream` did not answer in {STREAM_WRITE_TIMEOUT:?}; killed"
                )
            }
        }
        // Dropped: killed.
        *stream = None;
    }
    Err(failed)
}

/// How many rows the back-fill inserts per transaction.
const BACKFILL_BATCH: usize = 1000;

/// Inserts a row for every ended record in `STATE/jobs/`; those already
/// there are ignored. Returns (ended records seen, rows added).
pub fn backfill(conn: &mut Connection, state_dir: &Path) -> Result<(usize, usize), String> {
    let mut batch = Vec::with_capacity(BACKFILL_BATCH);
    let (mut seen, mut added) = (0, 0);
    let mut flush = |batch: &mut Vec<HistoryRow>, added: &mut usize| -> Result<(), String> {
        *added += insert_rows(conn, batch).map_err(|e| e.to_string())?;
        batch.clear();
        Ok(())
    };
    let mut failed = None;
    crate::store::each_ended_record(state_dir, |record| {
        if failed.is_some() {
            return;
        }
        if let Some(row) = HistoryRow::of(&record) {
            seen += 1;
            batch.push(row);
            if batch.len() >= BACKFILL_BATCH {
                if let Err(e) = flush(&mut batch, &mut added) {
                    failed = Some(e);
                }
            }
        }
    })
    .map_err(|e| e.to_string())?;
    if let Some(e) = failed {
        return Err(e);
    }
    flush(&mut batch, &mut added)?;
    Ok((seen, added))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::accounting::query::ReportBy;

    pub(crate) fn row(
        id: &str,
        uid: u32,
        user: &str,
        ended_s: u64,
        status: &str,
        gpus: u32,
    ) -> HistoryRow {
        HistoryRow {
            id: id.into(),
            submitted_us: 1,
            invocation: format!("inv-{id}"),
            uid,
            user: user.into(),
            gid: uid,
            sweep: None,
            name: Some(format!("name of {id}")),
            status: status.into(),
            exit_code: Some(0),
            signal: None,
            started_us: Some(ended_s * 1_000_000 - 3_000_000),
            ended_us: ended_s * 1_000_000,
            wall_us: 3_000_000,
            gpus,
            gpu_indices: (0..gpus).collect(),
            gpu_uuids: (0..gpus).map(|i| format!("GPU-{i}")).collect(),
            gpu_seconds: 3.0 * gpus as f64,
            cpu_nsec: Some(1_800_000_000_000),
            mem_peak_bytes: Some(1 << 20),
            io_read_bytes: None,
            io_write_bytes: Some(0),
            gpu_util_avg_pct: (gpus > 0).then_some(50.5),
            gpu_mem_peak_mib: (gpus > 0).then_some(1024),
        }
    }

    #[test]
    fn a_database_of_the_release_before_gpu_samples_gets_their_columns() {
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(dir.path());
        // The table as the release before made it, with a row of its own.
        let old_schema = SCHEMA
            .replace("    gpu_util_avg REAL,\n", "")
            .replace("    gpu_mem_peak_mib INTEGER,\n", "");
        assert_ne!(old_schema, SCHEMA);
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(&old_schema).unwrap();
            conn.execute(
                "INSERT INTO jobs (id, submitted_us, invocation, uid, user, gid, status, ended_us, wall_us, gpus, gpu_indices, gpu_uuids, gpu_seconds) VALUES ('old', 1, 'i', 1000, 'alice', 1000, 'succeeded', 5000000, 1, 0, '', '', 0.0)",
                [],
            )
            .unwrap();
        }
        let mut conn = open_for_writing(&path).unwrap();
        let new = row("new", 1000, "alice", 10, "succeeded", 1);
        assert_eq!(
            insert_rows(&mut conn, std::slice::from_ref(&new)).unwrap(),
            1
        );
        drop(conn);
        // Opened again: the columns are there once.
        drop(open_for_writing(&path).unwrap());
        let rows = history(&path, &HistoryQuery::default(), 0).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (
                rows[0].id.as_str(),
                rows[0].gpu_util_avg_pct,
                rows[0].gpu_mem_peak_mib
            ),
            ("old", None, None)
        );
        assert_eq!(rows[1], new);
    }

    #[test]
    fn rows_are_written_once_and_read_back_whole_and_filtered() {
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(dir.path());
        let mut conn = open_for_writing(&path).unwrap();
        let rows = vec![
            row("a", 1000, "alice", 10, "succeeded", 2),
            row("b", 1001, "bob", 20, "failed", 0),
            row("c", 1000, "alice", 30, "not-needed", 1),
        ];
        assert_eq!(insert_rows(&mut conn, &rows).unwrap(), 3);
        // Fed again (the end hook, then the back-fill): nothing doubles.
        assert_eq!(insert_rows(&mut conn, &rows).unwrap(), 0);
        // A namesake submitted later is a row of its own.
        let again = HistoryRow {
            submitted_us: 2,
            ..rows[0].clone()
        };
        assert_eq!(insert_rows(&mut conn, &[again]).unwrap(), 1);
        let mode = std::fs::metadata(&path).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );

        let all = history(&path, &HistoryQuery::default(), 0).unwrap();
        assert_eq!(all.len(), 4);
        assert_eq!(all[0], rows[0], "oldest first, every field back");
        let alices = history(&path, &HistoryQuery::default(), 1000).unwrap();
        assert!(alices.iter().all(|r| r.uid == 1000) && alices.len() == 3);
        let ids = |q: HistoryQuery| -> Vec<String> {
            let rows = history(&path, &q, 0).unwrap();
            rows.into_iter().map(|r| r.id).collect()
        };
        let period = HistoryQuery {
            since_us: Some(15_000_000),
            until_us: Some(30_000_000),
            ..HistoryQuery::default()
        };
        assert_eq!(ids(period), ["b"]);
        let named = HistoryQuery {
            name: Some("name of [bc]".into()),
            statuses: vec!["not-needed".into()],
            ..HistoryQuery::default()
        };
        assert_eq!(ids(named), ["c"]);
        let q = HistoryQuery {
            gpus: Some(2),
            limit: 1,
            ..HistoryQuery::default()
        };
        let got = history(&path, &q, 0).unwrap();
        assert_eq!(got.len(), 1);
        // A hostile pattern is only a pattern.
        let q = HistoryQuery {
            name: Some("' OR 1=1 --".into()),
            ..HistoryQuery::default()
        };
        assert!(history(&path, &q, 0).unwrap().is_empty());
        assert_eq!(
            history(&path, &HistoryQuery::default(), 0).unwrap().len(),
            4
        );
    }

    #[test]
    fn a_report_sums_per_user_and_per_group() {
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(dir.path());
        let mut conn = open_for_writing(&path).unwrap();
        insert_rows(
            &mut conn,
            &[
                row("a", 1000, "alice", 10, "succeeded", 2),
                row("b", 1000, "alice", 20, "failed", 2),
                row("c", 1000, "alice", 30, "not-needed", 0),
                row("d", 1001, "bob", 40, "succeeded", 1),
            ],
        )
        .unwrap();
        let rows = report(&path, &ReportQuery::default(), 0).unwrap();
        assert_eq!(rows.len(), 2);
        let alice = &rows[0];
        assert_eq!(
            (
                alice.key.as_str(),
                alice.jobs,
                alice.succeeded,
                alice.counted
            ),
            ("alice", 3, 1, 2)
        );
        assert!((alice.gpu_hours - 12.0 / 3600.0).abs() < 1e-9, "{alice:?}");
        assert!((alice.cpu_hours - 1.5).abs() < 1e-9, "{alice:?}");
        assert_eq!(alice.success_rate(), Some(0.5));
        // Bob sees only his own line.
        let bobs = report(&path, &ReportQuery::default(), 1001).unwrap();
        assert_eq!(bobs.len(), 1);
        assert_eq!(bobs[0].key, "bob");
        let by_group = ReportQuery {
            by: ReportBy::Group,
            ..ReportQuery::default()
        };
        let rows = report(&path, &by_group, 0).unwrap();
        assert_eq!(rows[0].key, "1000");
        // The top list: the heaviest GPU user only.
        let top = ReportQuery {
            top: 1,
            ..ReportQuery::default()
        };
        let rows = report(&path, &top, 0).unwrap();
        assert_eq!(
            rows.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
            ["alice"]
        );
        // A group filter.
        let bobs_group = ReportQuery {
            filter: HistoryQuery {
                gid: Some(1001),
                ..HistoryQuery::default()
            },
            ..ReportQuery::default()
        };
        let rows = report(&path, &bobs_group, 0).unwrap();
        assert_eq!(
            rows.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
            ["bob"]
        );
        // By GPU: a and b held GPUs 0 and 1, d held GPU 0; c held none.
        let by_gpu = ReportQuery {
            by: ReportBy::Gpu,
            ..ReportQuery::default()
        };
        let rows = report(&path, &by_gpu, 0).unwrap();
        let lines: Vec<_> = rows
            .iter()
            .map(|r| (r.key.as_str(), r.jobs, r.succeeded))
            .collect();
        assert_eq!(lines, [("0", 3, 2), ("1", 2, 1)]);
        assert!((rows[0].gpu_hours - 9.0 / 3600.0).abs() < 1e-9, "{rows:?}");
        // Still only the caller's own runs.
        let bobs = report(&path, &by_gpu, 1001).unwrap();
        assert_eq!(bobs.len(), 1);
        assert_eq!((bobs[0].key.as_str(), bobs[0].jobs), ("0", 1));
        // Every filter works on the join too (json_each has an `id` of its own).
        let named = ReportQuery {
            by: ReportBy::Gpu,
            filter: HistoryQuery {
                name: Some("[ab]".into()),
                user: Some("alice".into()),
                statuses: vec!["succeeded".into()],
                since_us: Some(1),
                gpus: Some(2),
                gid: Some(1000),
                ..HistoryQuery::default()
            },
            top: 0,
        };
        let rows = report(&path, &named, 0).unwrap();
        let lines: Vec<_> = rows.iter().map(|r| (r.key.as_str(), r.jobs)).collect();
        assert_eq!(lines, [("0", 1), ("1", 1)]);
    }

    fn job(id: &str, ended: bool) -> JobRecord {
        use crate::store::{JobState, Outcome, SpoolSource, Usage};
        let spec = crate::spec::parse_spec(br#"{"version": 1, "command": ["true"]}"#, id).unwrap();
        let owner = crate::users::Owner {
            uid: 1000,
            gid: 1000,
            name: "alice".into(),
            home: "/home/alice".into(),
            groups: vec![],
        };
        let source = SpoolSource {
            file: format!("{id}.json"),
            dev: 1,
            ino: 2,
            ctime_ns: 3,
            size: 4,
        };
        let mut r = JobRecord::new(spec, owner, source, 10);
        if ended {
            r.state = JobState::Ended;
            r.outcome = Some(Outcome::Succeeded);
            r.invocation_id = Some(format!("inv-{id}"));
            r.started_at = Some(1_000_000);
            r.ended_at = Some(4_000_000);
            r.usage = Some(Usage {
                cpu_nsec: Some(7),
                ..Usage::default()
            });
        }
        r
    }

    #[test]
    fn the_back_fill_adds_each_ended_record_once_whatever_the_feed_did_before() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path()).unwrap();
        for (id, ended) in [("a", true), ("b", true), ("q", false)] {
            let r = job(id, ended);
            store.claim(&r, b"{}").unwrap();
        }
        let mut conn = open_for_writing(&db_path(dir.path())).unwrap();
        // "a" was written by the end hook before a crash; "b" was not.
        insert_rows(&mut conn, &[HistoryRow::of(&job("a", true)).unwrap()]).unwrap();
        assert_eq!(backfill(&mut conn, dir.path()).unwrap(), (2, 1));
        // Every start back-fills again: nothing doubles.
        assert_eq!(backfill(&mut conn, dir.path()).unwrap(), (2, 0));
        let rows = history(&db_path(dir.path()), &HistoryQuery::default(), 0).unwrap();
        let ids: Vec<_> = rows.iter().map(|r| r.id.as_str()).collect();
        // Oldest first; equal ends by id.
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(rows[0].cpu_nsec, Some(7));
        assert_eq!(rows[0].wall_us, 3_000_000);
        // A queued job is no row.
        assert!(HistoryRow::of(&job("q", false)).is_none());
    }

    #[test]
    fn a_state_directory_of_the_release_of_2026_12_01_is_back_filled_on_first_start() {
        // Its records have no usage: the row has its times and GPUs, and
        // no figure it never counted.
        let dir = tempfile::tempdir().unwrap();
        let _store = crate::store::Store::open(dir.path()).unwrap();
        std::fs::write(
            dir.path().join("jobs/resnet-1.json"),
            include_bytes!("../../tests/fixtures/record-2026-12-01.json"),
        )
        .unwrap();
        let mut conn = open_for_writing(&db_path(dir.path())).unwrap();
        assert_eq!(backfill(&mut conn, dir.path()).unwrap(), (1, 1));
        let rows = history(&db_path(dir.path()), &HistoryQuery::default(), 0).unwrap();
        let r = &rows[0];
        assert_eq!(
            (r.id.as_str(), r.user.as_str(), r.status.as_str()),
            ("resnet-1", "alice", "stopped")
        );
        assert_eq!(r.name.as_deref(), Some("resnet lr 0.1"));
        assert_eq!(r.gpus as usize, r.gpu_indices.len());
        assert!(r.gpus > 0 && r.wall_us > 0, "{r:?}");
        assert!((r.gpu_seconds - r.wall_us as f64 / 1e6 * r.gpus as f64).abs() < 1e-6);
        assert_eq!((r.cpu_nsec, r.mem_peak_bytes), (None, None));
    }

    #[tokio::test]
    async fn a_usage_query_sees_every_row_sent_before_it_and_weighs_them_by_age() {
        let dir = tempfile::tempdir().unwrap();
        let _store = crate::store::Store::open(dir.path()).unwrap();
        let writer = Writer::start(dir.path());
        let mut gpu_job = job("g", true);
        gpu_job.gpus = (0..2)
            .map(|index| crate::store::AssignedGpu {
                index,
                uuid: format!("GPU-{index}"),
                device: format!("/dev/nvidia{index}").into(),
            })
            .collect();
        // Grouped: the query itself has the group written first.
        writer.record(&gpu_job, false);
        writer.record(&job("cpu", true), false);
        let day = std::time::Duration::from_secs(24 * 3600);
        // One day after the end (4 s): half of 2 GPUs × 3 s.
        let usage = writer
            .usage(4_000_000 + 24 * 3600 * 1_000_000, day)
            .await
            .unwrap();
        assert_eq!(usage.users.len(), 1, "{usage:?}");
        assert!(
            (usage.users[&1000].gpu_seconds - 3.0).abs() < 1e-9,
            "{usage:?}"
        );
        assert!((usage.groups[&1000] - 3.0).abs() < 1e-9);
        // Runs that ended at `until` or later are not the database's to count.
        let none = writer.usage(4_000_000, day).await.unwrap();
        // The quotas' window: 6 GPU-seconds of uid 1000, in bucket 0.
        let sums = writer.window(0, 10_000_000, 3_600_000_000).await.unwrap();
        assert_eq!(sums, [(1000, 0, 6.0)]);
        let none_yet = writer.window(0, 4_000_000, 1).await.unwrap();
        assert!(none_yet.is_empty(), "{none_yet:?}");
        assert!(none.users.is_empty(), "{none:?}");
    }

    #[tokio::test]
    async fn the_writer_task_writes_what_it_is_sent() {
        let dir = tempfile::tempdir().unwrap();
        let _store = crate::store::Store::open(dir.path()).unwrap();
        let writer = Writer::start(dir.path());
        let path = db_path(dir.path());
        // A flush (a stop of ptraind) writes the group that waits.
        writer.record(&job("w", true), false);
        writer.flush().await;
        assert_eq!(
            history(&path, &HistoryQuery::default(), 0).unwrap().len(),
            1
        );
        // A retried attempt's row is written without a flush or a query.
        writer.record(&job("again", true), true);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if history(&path, &HistoryQuery::default(), 0).is_ok_and(|r| r.len() == 2) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the row never came");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// The plan SQLite picks for a query, one detail a line.
    fn plan(conn: &Connection, sql: &str, params: &[Param]) -> String {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows = stmt
            .query_map(params_from_iter(bind(params)), |r| r.get::<_, String>(3))
            .unwrap();
        rows.map(Result::unwrap).collect::<Vec<_>>().join("\n")
    }

    /// The plans behind the query budget; the times over a million rows
    /// are `make bench`'s (`accounting.*`).
    #[test]
    fn a_users_last_runs_and_a_period_are_read_through_their_indices() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_for_writing(&db_path(dir.path())).unwrap();
        // One user's last 100: by (uid, ended), newest first, no full sort.
        let (sql, params) = history_sql(
            &HistoryQuery {
                limit: 100,
                ..HistoryQuery::default()
            },
            1000,
        );
        let p = plan(&conn, &sql, &params);
        assert!(p.contains("USING INDEX jobs_by_uid_ended (uid=?)"), "{p}");
        assert!(!p.contains("USE TEMP B-TREE FOR ORDER BY"), "{p}");
        // A month's report as root: by end time.
        let month = ReportQuery {
            filter: HistoryQuery {
                since_us: Some(1),
                until_us: Some(2),
                ..HistoryQuery::default()
            },
            ..ReportQuery::default()
        };
        let (sql, params) = report_sql(&month, 0);
        let p = plan(&conn, &sql, &params);
        assert!(
            p.contains("USING COVERING INDEX jobs_by_period (ended_us>? AND ended_us<?)"),
            "{p}"
        );
        // The last 30 days (no end), by user, group or GPU: by end time
        // too, not the whole table in uid order.
        for by in [ReportBy::User, ReportBy::Group, ReportBy::Gpu] {
            let recent = ReportQuery {
                filter: HistoryQuery {
                    since_us: Some(1),
                    ..HistoryQuery::default()
                },
                by,
                ..ReportQuery::default()
            };
            let (sql, params) = report_sql(&recent, 0);
            let p = plan(&conn, &sql, &params);
            assert!(
                p.contains("USING COVERING INDEX jobs_by_period (ended_us>?)"),
                "{p}"
            );
        }
        // A user's period, asked by themselves: by (uid, ended).
        let (sql, params) = report_sql(&month, 1000);
        let p = plan(&conn, &sql, &params);
        assert!(
            p.contains("USING INDEX jobs_by_uid_ended (uid=? AND ended_us>? AND ended_us<?)"),
            "{p}"
        );
        // Root asking for a user by name: by (user, ended), newest first.
        let (sql, params) = history_sql(
            &HistoryQuery {
                user: Some("alice".into()),
                limit: 100,
                ..HistoryQuery::default()
            },
            0,
        );
        let p = plan(&conn, &sql, &params);
        assert!(p.contains("USING INDEX jobs_by_user_ended (user=?)"), "{p}");
        assert!(!p.contains("USE TEMP B-TREE FOR ORDER BY"), "{p}");
    }

    #[test]
    fn no_database_yet_is_an_empty_history() {
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(dir.path());
        assert!(history(&path, &HistoryQuery::default(), 0)
            .unwrap()
            .is_empty());
        assert!(report(&path, &ReportQuery::default(), 0)
            .unwrap()
            .is_empty());
    }
}
