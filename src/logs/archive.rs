//! Per-job output archives: when a job ends its output is copied from the
//! journal into `LOG_DIR/UID/ID.INVOCATION.log.gz` (gzip, one JSON object
//! `{"t": µs, "m": "line"}` per line), so `ptrain logs` still works after
//! journald rotated the job away.
//!
//! `LOG_DIR` and the per-user directories are ptraind's own (root, 0700);
//! nothing in them is ever followed: directories are opened with
//! O_NOFOLLOW and checked with fstat, archives are written to a temp file
//! created with O_CREAT|O_EXCL|O_NOFOLLOW and renamed into place without
//! replacing anything (renameat2 RENAME_NOREPLACE). A name that is taken
//! by something ptraind did not put there is left alone and the archive
//! gets the next free name.
//!
//! All of it runs on one archiver thread (`spawn_archiver`): writing and
//! the retention policy ([`super::retention`]). What it keeps is read
//! through an `ArchiveCatalog` without waiting for it.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{error, info, warn};

use super::journal::{self, lost_head_notice, Entry, RunFilter, Selection};
use super::retention::{self, ArchiveInfo, Disk, RetentionPolicy, UserUsage};
use super::sd_journal;
use crate::fsutil;

pub const SUFFIX: &str = ".log.gz";
/// Other names tried when an archive's name is taken.
const MAX_ALTERNATES: u32 = 9;
/// Archiving is skipped when less than this may be written.
const MIN_BUDGET: u64 = 512 << 10;
/// How long the archiver waits after a job's end for more ends to archive
/// with it; an archive appears this much later, nobody waits on it (the
/// journal serves the output meanwhile).
const BATCH_WINDOW: Duration = Duration::from_millis(250);
/// Room kept below the budget for what the compressor still holds.
const BUDGET_MARGIN: u64 = 256 << 10;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("cannot {action} {path}: {source}; the log directory must be a root-only directory (mode 0700) on a writable file system")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{path} is not a root-only directory ({found}); remove it, ptraind creates it again")]
    UnsafeDir { path: PathBuf, found: String },
    #[error("every archive name for job {id} in {dir} is taken by entries ptraind did not write; remove them")]
    NamesTaken { id: String, dir: PathBuf },
    #[error("cannot read the journal for job {id}: {source}")]
    Journal { id: String, source: io::Error },
}

/// A job whose output is to be archived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveJob {
    pub id: String,
    pub uid: u32,
    pub selection: Selection,
}

/// One line of an archive.
#[derive(Debug, Serialize, Deserialize)]
struct Line {
    t: u64,
    m: String,
}

/// The invocation id as it appears in a file name: lowercase hex only.
fn invocation_part(inv: Option<&str>) -> &str {
    match inv {
        Some(i) if !i.is_empty() && i.len() <= 64 && i.bytes().all(|b| b.is_ascii_hexdigit()) => i,
        _ => "unknown",
    }
}

/// The names an archive of this run may have, in the order they are tried
/// (and looked up). A job id is one safe path component ([`crate::spec::JobId`]).
pub fn candidate_names(id: &str, inv: Option<&str>) -> Vec<String> {
    let inv = invocation_part(inv);
    let mut names = vec![format!("{id}.{inv}{SUFFIX}")];
    names.extend((1..=MAX_ALTERNATES).map(|n| format!("{id}.{inv}-{n}{SUFFIX}")));
    names
}

/// The job id and the invocation part of an archive's name, as
/// [`candidate_names`] makes them: `ID.INVOCATION[-N].log.gz`.
fn parts_of_name(name: &str) -> Option<(&str, &str)> {
    let (id, inv) = name.strip_suffix(SUFFIX)?.rsplit_once('.')?;
    let inv = inv.split_once('-').map_or(inv, |(inv, _)| inv);
    Some((id, inv))
}

/// Whose archive `name` is: the job id.
pub fn job_of_name(name: &str) -> Option<&str> {
    parts_of_name(name).map(|(id, _)| id)
}

/// The invocation id in an archive's name, if it was known.
pub fn invocation_of_name(name: &str) -> Option<&str> {
    parts_of_name(name)
        .map(|(_, inv)| inv)
        .filter(|inv| *inv != "unknown")
}

fn cstr(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))
}

/// Opens `LOG_DIR/UID` (creating it if asked) and checks it is a real
/// directory, owned by root, that nobody else may enter.
fn user_dir(log_dir: &Path, uid: u32, create: bool) -> Result<OwnedFd, ArchiveError> {
    let path = log_dir.join(uid.to_string());
    let io_err = |action, source| ArchiveError::Io {
        action,
        path: path.clone(),
        source,
    };
    let base = fsutil::open_dir(log_dir).map_err(|e| ArchiveError::Io {
        action: "open",
        path: log_dir.to_owned(),
        source: e,
    })?;
    let name = cstr(&uid.to_string()).expect("digits");
    if create {
        // SAFETY: mkdirat with a valid dir fd and a NUL-terminated name.
        if unsafe { libc::mkdirat(base.as_raw_fd(), name.as_ptr(), 0o700) } != 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::AlreadyExists {
                return Err(io_err("create", e));
            }
        }
    }
    // SAFETY: openat with a valid dir fd; O_NOFOLLOW refuses a symlink.
    let fd = unsafe {
        libc::openat(
            base.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) {
            return Err(ArchiveError::UnsafeDir {
                path,
                found: "a symbolic link or not a directory".into(),
            });
        }
        return Err(io_err("open", e));
    }
    // SAFETY: fd is fresh and owned here.
    let dir = unsafe { OwnedFd::from_raw_fd(fd) };
    let id = fsutil::fstat(&dir).map_err(|e| io_err("stat", e))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if id.uid != me || id.mode & 0o077 != 0 {
        return Err(ArchiveError::UnsafeDir {
            path,
            found: format!("owner uid {}, mode {:o}", id.uid, id.mode & 0o7777),
        });
    }
    Ok(dir)
}

/// Counts what reaches the file, to stop at the budget.
struct Counting<W> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Creates `name` in `dir` for writing: O_CREAT|O_EXCL|O_NOFOLLOW, 0600.
fn create_excl(dir: &OwnedFd, name: &str) -> io::Result<File> {
    fsutil::create_at(dir, name, libc::O_EXCL)
}

fn unlink_at(dir: &OwnedFd, name: &str) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: unlinkat on a name inside a valid dir fd; removes a symlink
    // itself, never its target.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// renameat2(RENAME_NOREPLACE) inside one directory.
fn rename_noreplace(dir: &OwnedFd, from: &str, to: &str) -> io::Result<()> {
    let (f, t) = (cstr(from)?, cstr(to)?);
    // SAFETY: both names NUL-terminated, relative to a valid dir fd.
    let rc = unsafe {
        libc::renameat2(
            dir.as_raw_fd(),
            f.as_ptr(),
            dir.as_raw_fd(),
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes an archive of `lines` (time µs, text) for job `id` of `uid`,
/// at most `budget` bytes (a marker line says where it was cut).
/// Returns what was written.
pub fn write_lines(
    log_dir: &Path,
    uid: u32,
    id: &str,
    inv: Option<&str>,
    lines: impl IntoIterator<Item = (u64, String)>,
    budget: u64,
    now: u64,
) -> Result<ArchiveInfo, ArchiveError> {
    let dir = user_dir(log_dir, uid, true)?;
    let dir_path = log_dir.join(uid.to_string());
    let io_err = |action, name: &str, source| ArchiveError::Io {
        action,
        path: dir_path.join(name),
        source,
    };
    let tmp = format!(".{id}.{}.tmp", invocation_part(inv));
    let file = match create_excl(&dir, &tmp) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            // Left by a crash (or planted): removed, never written through.
            unlink_at(&dir, &tmp).map_err(|e| io_err("remove", &tmp, e))?;
            create_excl(&dir, &tmp)
        }
        other => other,
    }
    .map_err(|e| io_err("create", &tmp, e))?;
    let result = (|| -> io::Result<u64> {
        let mut gz = flate2::write::GzEncoder::new(
            Counting {
                inner: BufWriter::new(file),
                bytes: 0,
            },
            flate2::Compression::default(),
        );
        let limit = budget.saturating_sub(BUDGET_MARGIN);
        for (t, m) in lines {
            if gz.get_ref().bytes >= limit {
                let cut = Line {
                    t: now,
                    m: "[ptrain: output cut here: the archive reached its size limit ([logs] limits or min_free)]".into(),
                };
                serde_json::to_writer(&mut gz, &cut)?;
                gz.write_all(b"\n")?;
                break;
            }
            serde_json::to_writer(&mut gz, &Line { t, m })?;
            gz.write_all(b"\n")?;
        }
        let counting = gz.finish()?;
        let bytes = counting.bytes;
        let file = counting.inner.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok(bytes)
    })();
    let bytes = match result {
        Ok(bytes) => bytes,
        Err(e) => {
            let _ = unlink_at(&dir, &tmp);
            return Err(io_err("write", &tmp, e));
        }
    };
    for name in candidate_names(id, inv) {
        match rename_noreplace(&dir, &tmp, &name) {
            Ok(()) => {
                // SAFETY: fsync on a valid dir fd makes the rename durable.
                unsafe { libc::fsync(dir.as_raw_fd()) };
                return Ok(ArchiveInfo {
                    uid,
                    name,
                    bytes,
                    written_at: now,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let what = fsutil::lstat_at(&dir, &name)
                    .map(|i| i.kind())
                    .unwrap_or("entry");
                error!(
                    job = id,
                    PTRAIN_JOB = id,
                    path = %dir_path.join(&name).display(),
                    "an archive path is already taken by a {what} ptraind did not write; leaving it alone and using the next name"
                );
            }
            Err(e) => {
                let _ = unlink_at(&dir, &tmp);
                return Err(io_err("rename into place", &name, e));
            }
        }
    }
    let _ = unlink_at(&dir, &tmp);
    Err(ArchiveError::NamesTaken {
        id: id.to_owned(),
        dir: dir_path,
    })
}

/// Copies one run's output from the journal into its archive. Call
/// [`journal::sync_blocking`] first, once for a batch of jobs that ended,
/// and open `journal` once for the batch.
pub fn archive_from_journal(
    log_dir: &Path,
    journal: &mut sd_journal::Reader,
    job: &ArchiveJob,
    budget: u64,
    now: u64,
) -> Result<ArchiveInfo, ArchiveError> {
    let sel = &job.selection;
    let oldest = journal.oldest_entry_time().unwrap_or_else(|e| {
        warn!(job = %job.id, PTRAIN_JOB = %job.id, error = %e, "cannot tell whether the journal still holds the start of the job's output");
        None
    });
    let entries = journal
        .entries_since(&sel.unit, sel.started_at)
        .map_err(|source| ArchiveError::Journal {
            id: job.id.clone(),
            source,
        })?;
    let mut filter = RunFilter::new(sel);
    let lost_head = lost_head_notice(sel, 0, oldest);
    let lines = lost_head.into_iter().chain(
        entries
            .filter(|e: &Entry| filter.accept(e))
            .map(|e| (e.realtime, e.message)),
    );
    write_lines(
        log_dir,
        job.uid,
        &job.id,
        sel.invocation_id.as_deref(),
        lines,
        budget,
        now,
    )
}

/// Opens the archive of a run for reading, if there is one ptraind wrote:
/// a regular, root-owned file reached without following any link.
pub fn open(log_dir: &Path, uid: u32, id: &str, inv: Option<&str>) -> Option<File> {
    let dir = user_dir(log_dir, uid, false).ok()?;
    candidate_names(id, inv).into_iter().find_map(|name| {
        let file = fsutil::open_at_nofollow(&dir, &name).ok()?;
        let st = fsutil::fstat(&file).ok()?;
        (st.is_regular() && st.uid == 0).then_some(file)
    })
}

/// Writes an archive's lines to `out`: only those at or after `since`
/// (µs, 0 for all), only the last `lines` (0 for all).
pub fn copy_out(archive: File, since: u64, lines: u32, out: &mut impl Write) -> io::Result<()> {
    let reader = BufReader::new(flate2::read::GzDecoder::new(archive));
    let mut tail = super::Tail::new(lines);
    for line in reader.lines() {
        let line = line?;
        let Ok(Line { t, m }) = serde_json::from_str::<Line>(&line) else {
            continue;
        };
        if t < since {
            continue;
        }
        if let Some(m) = tail.push(m) {
            out.write_all(m.as_bytes())?;
            out.write_all(b"\n")?;
        }
    }
    for m in tail.drain() {
        out.write_all(m.as_bytes())?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// Every archive under `log_dir`; removes temp files a crash left.
pub fn scan(log_dir: &Path) -> Vec<ArchiveInfo> {
    let mut out = Vec::new();
    let Ok(users) = std::fs::read_dir(log_dir) else {
        return out;
    };
    for user in users.flatten() {
        let Some(uid) = user
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(dir) = user_dir(log_dir, uid, false) else {
            continue;
        };
        let Ok(entries) = std::fs::read_dir(user.path()) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let Ok(st) = fsutil::lstat_at(&dir, &name) else {
                continue;
            };
            if name.starts_with('.') && name.ends_with(".tmp") && st.is_regular() {
                let _ = unlink_at(&dir, &name);
                continue;
            }
            if name.starts_with('.') || !name.ends_with(SUFFIX) || !st.is_regular() {
                continue;
            }
            let written_at = entry
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_micros() as u64);
            out.push(ArchiveInfo {
                uid,
                name,
                bytes: st.size,
                written_at,
            });
        }
    }
    out
}

/// statvfs of the log directory's file system.
pub fn disk_of(path: &Path) -> Option<Disk> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs fills the zeroed struct or fails.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some(Disk {
        avail_bytes: st.f_bavail as u64 * frsize,
        total_bytes: st.f_blocks as u64 * frsize,
    })
}

/// `ptrain du`: the policy and what the archives use.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LogUsage {
    pub log_dir: String,
    /// Whether ended jobs are archived at all (`[logs] archive`).
    pub archive: bool,
    pub policy: RetentionPolicy,
    pub count: u64,
    pub bytes: u64,
    /// The log directory's file system.
    pub disk: Option<Disk>,
    /// Per user (only the caller's own unless root).
    pub users: Vec<UserUsage>,
}

/// What the archiver keeps of the log directory, shared with the lookups
/// (`ptrain status` of a compacted job, `ptrain du`): they read it under a
/// short lock. They never wait for the archiver thread, whose batch under
/// a burst of ends takes seconds (a journal sync, then each job's output):
/// a `Status` call of a job nobody has asks here too.
#[derive(Clone)]
pub(crate) struct ArchiveCatalog {
    index: Arc<Mutex<retention::ArchiveIndex>>,
    /// True once the start's scan of the log directory is in the index:
    /// before, "no archive" would be a guess.
    scanned: watch::Receiver<bool>,
    log_dir: PathBuf,
    policy: RetentionPolicy,
    enabled: bool,
}

/// How long a lookup waits for the start's scan of the log directory.
const SCAN_WAIT: Duration = Duration::from_secs(2);

fn lock(index: &Mutex<retention::ArchiveIndex>) -> MutexGuard<'_, retention::ArchiveIndex> {
    // The index is whole after every call on it: a panic mid-call in
    // another thread cannot leave it torn.
    index.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ArchiveCatalog {
    async fn scanned(&self) -> bool {
        let mut scanned = self.scanned.clone();
        let waited = tokio::time::timeout(SCAN_WAIT, scanned.wait_for(|done| *done)).await;
        matches!(waited, Ok(Ok(_)))
    }

    /// The archives of one job, oldest first; None while the log
    /// directory has not been scanned yet.
    pub(crate) async fn of_job(&self, id: &str) -> Option<Vec<ArchiveInfo>> {
        if !self.scanned().await {
            return None;
        }
        Some(lock(&self.index).of_job(id))
    }

    /// The policy and what is kept, per user; None while the log
    /// directory has not been scanned yet.
    pub(crate) async fn usage(&self) -> Option<LogUsage> {
        if !self.scanned().await {
            return None;
        }
        let (count, bytes, mut users) = {
            let index = lock(&self.index);
            (index.len() as u64, index.total_bytes(), index.usage())
        };
        let (log_dir, policy, archive) = (self.log_dir.clone(), self.policy.clone(), self.enabled);
        // User names (NSS) and the file system's figures are blocking calls.
        tokio::task::spawn_blocking(move || {
            for u in &mut users {
                u.user = crate::users::owner_of_uid(u.uid).map(|o| o.name);
            }
            LogUsage {
                disk: disk_of(&log_dir),
                log_dir: log_dir.display().to_string(),
                archive,
                policy,
                count,
                bytes,
                users,
            }
        })
        .await
        .ok()
    }
}

/// Starts the archiver thread, which archives each job sent and ends when
/// every sender is dropped, and returns what it catalogues.
pub(crate) fn spawn_archiver(
    log_dir: PathBuf,
    policy: RetentionPolicy,
    enabled: bool,
) -> (mpsc::Sender<ArchiveJob>, ArchiveCatalog) {
    let (tx, rx) = mpsc::channel();
    let (scanned_tx, scanned) = watch::channel(false);
    let catalog = ArchiveCatalog {
        index: Arc::default(),
        scanned,
        log_dir: log_dir.clone(),
        policy: policy.clone(),
        enabled,
    };
    let index = catalog.index.clone();
    let spawned = std::thread::Builder::new()
        .name("ptrain-archiver".into())
        .spawn(move || {
            // Archiving can wait; launching the next job cannot.
            journal::lower_this_thread_priority();
            *lock(&index) = retention::ArchiveIndex::new(scan(&log_dir));
            let _ = scanned_tx.send(true);
            let mut archiver = Archiver {
                index,
                log_dir,
                policy,
                enabled,
            };
            archiver.apply_retention();
            archiver.run(rx);
        });
    if let Err(e) = spawned {
        error!(error = %e, "cannot start the log archiver thread; job output is not archived");
    }
    (tx, catalog)
}

struct Archiver {
    log_dir: PathBuf,
    policy: RetentionPolicy,
    enabled: bool,
    index: Arc<Mutex<retention::ArchiveIndex>>,
}

impl Archiver {
    fn run(&mut self, rx: mpsc::Receiver<ArchiveJob>) {
        loop {
            // Sleep until the oldest archive expires, not periodically.
            let next_expiry = lock(&self.index).next_expiry(&self.policy);
            let first = match next_expiry {
                Some(at) => {
                    let wait = at.saturating_sub(crate::now_micros()) + 1;
                    match rx.recv_timeout(Duration::from_micros(wait)) {
                        Ok(job) => Some(job),
                        Err(mpsc::RecvTimeoutError::Timeout) => None,
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                }
                None => match rx.recv() {
                    Ok(job) => Some(job),
                    Err(_) => return,
                },
            };
            let Some(first) = first else {
                self.apply_retention();
                continue;
            };
            // Jobs that end within BATCH_WINDOW of each other are archived
            // as one batch: one journal sync, one opening of the journal,
            // one retention pass before and after. Jobs ending one by one
            // (each freeing a GPU for the next) otherwise pay all of it
            // each.
            let mut jobs = vec![first];
            let until = Instant::now() + BATCH_WINDOW;
            let mut disconnected = false;
            if self.enabled {
                while let Some(left) = until.checked_duration_since(Instant::now()) {
                    match rx.recv_timeout(left) {
                        Ok(job) => jobs.push(job),
                        Err(mpsc::RecvTimeoutError::Timeout) => break,
                        Err(mpsc::RecvTimeoutError::Disconnected) => {
                            disconnected = true;
                            break;
                        }
                    }
                }
            }
            jobs.extend(rx.try_iter());
            if self.enabled {
                self.archive_batch(&jobs);
            }
            if disconnected {
                return;
            }
        }
    }

    fn archive_batch(&mut self, jobs: &[ArchiveJob]) {
        journal::sync_blocking();
        // Room first: expired and over-limit archives go before the
        // disk is asked how much may be written.
        self.apply_retention();
        match sd_journal::Reader::open() {
            Ok(mut reader) => {
                for job in jobs {
                    self.archive(&mut reader, job);
                }
            }
            Err(e) => {
                for job in jobs {
                    error!(job = %job.id, PTRAIN_JOB = %job.id, error = %e, "cannot archive the job's output: cannot open the journal: {e}");
                }
            }
        }
        self.apply_retention();
    }

    fn archive(&mut self, reader: &mut sd_journal::Reader, job: &ArchiveJob) {
        // Archived already (its end seen again after a restart): the file
        // says so, at no cost per archive kept.
        if open(
            &self.log_dir,
            job.uid,
            &job.id,
            job.selection.invocation_id.as_deref(),
        )
        .is_some()
        {
            return;
        }
        let disk = disk_of(&self.log_dir);
        let budget = retention::write_budget(&self.policy, disk);
        if budget < MIN_BUDGET {
            let (avail, floor) = disk.map_or((0, 0), |d| {
                (d.avail_bytes, self.policy.min_free.bytes_of(&d))
            });
            warn!(
                job = %job.id,
                PTRAIN_JOB = %job.id,
                log_dir = %self.log_dir.display(),
                avail_bytes = avail,
                floor_bytes = floor,
                "not archiving the job's output: the log directory's file system has {avail} bytes free against a min_free floor of {floor} (or a [logs] size limit is tiny); free space or lower [logs] min_free"
            );
            return;
        }
        match archive_from_journal(&self.log_dir, reader, job, budget, crate::now_micros()) {
            Ok(info) => {
                info!(job = %job.id, PTRAIN_JOB = %job.id, archive = %info.name, bytes = info.bytes, "job output archived");
                lock(&self.index).insert(info);
            }
            Err(e) => {
                error!(job = %job.id, PTRAIN_JOB = %job.id, error = %e, "cannot archive the job's output: {e}");
            }
        }
    }

    fn apply_retention(&mut self) {
        let disk = disk_of(&self.log_dir);
        let due = lock(&self.index).take_due(crate::now_micros(), &self.policy, disk);
        for a in due {
            let gone = user_dir(&self.log_dir, a.uid, false)
                .map_err(|e| e.to_string())
                .and_then(|dir| match unlink_at(&dir, &a.name) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(e.to_string()),
                });
            match gone {
                Ok(()) => {
                    info!(uid = a.uid, archive = %a.name, "removed an old job output archive ([logs] retention)");
                }
                Err(e) => {
                    // Forgotten until the next start's scan: an archive
                    // that cannot go must not wake the archiver forever.
                    warn!(uid = a.uid, archive = %a.name, error = %e, "cannot remove an old archive");
                }
            }
        }
    }
}

/// Reads an archive back as (time, line) pairs, for tests and tools.
pub fn read_lines(archive: File) -> io::Result<Vec<(u64, String)>> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(archive).read_to_string(&mut text)?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<Line>(l).ok())
        .map(|l| (l.t, l.m))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn log_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    fn lines(n: u64) -> Vec<(u64, String)> {
        (1..=n).map(|i| (i * 10, format!("line {i}"))).collect()
    }

    const INV: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn an_archive_name_tells_its_job_and_run() {
        for (id, inv) in [("job-1", Some(INV)), ("a.b.c", Some(INV)), ("x", None)] {
            for name in candidate_names(id, inv) {
                assert_eq!(job_of_name(&name), Some(id), "{name}");
                assert_eq!(invocation_of_name(&name), inv, "{name}");
            }
        }
        assert_eq!(job_of_name("notes.txt"), None);
    }

    #[test]
    fn written_archive_reads_back_with_since_and_tail() {
        let d = log_dir();
        let info = write_lines(d.path(), 1000, "job-1", Some(INV), lines(5), u64::MAX, 7).unwrap();
        assert_eq!(info.name, format!("job-1.{INV}.log.gz"));
        let path = d.path().join("1000").join(&info.name);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), info.bytes);
        assert_eq!(
            std::fs::metadata(d.path().join("1000"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        let read = |since, tail| {
            let mut out = Vec::new();
            copy_out(
                open(d.path(), 1000, "job-1", Some(INV)).unwrap(),
                since,
                tail,
                &mut out,
            )
            .unwrap();
            String::from_utf8(out).unwrap()
        };
        assert_eq!(read(0, 0), "line 1\nline 2\nline 3\nline 4\nline 5\n");
        assert_eq!(read(0, 2), "line 4\nline 5\n");
        assert_eq!(read(30, 0), "line 3\nline 4\nline 5\n");
        assert_eq!(read(30, 1), "line 5\n");
        assert!(open(d.path(), 1000, "job-2", Some(INV)).is_none());
        assert!(open(d.path(), 1001, "job-1", Some(INV)).is_none());
        let all = scan(d.path());
        assert_eq!(all.len(), 1);
        assert_eq!((all[0].uid, all[0].bytes), (1000, info.bytes));
    }

    #[test]
    fn planted_symlink_is_not_followed_and_the_archive_takes_the_next_name() {
        let d = log_dir();
        let victim = d.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::fs::create_dir(d.path().join("1000")).unwrap();
        std::fs::set_permissions(
            d.path().join("1000"),
            std::fs::Permissions::from_mode(0o700),
        )
        .unwrap();
        let names = candidate_names("j", Some(INV));
        std::os::unix::fs::symlink(&victim, d.path().join("1000").join(&names[0])).unwrap();
        // A temp file name planted as a link is removed, not written through.
        std::os::unix::fs::symlink(&victim, d.path().join("1000").join(format!(".j.{INV}.tmp")))
            .unwrap();
        let info = write_lines(d.path(), 1000, "j", Some(INV), lines(2), u64::MAX, 1).unwrap();
        assert_eq!(info.name, names[1]);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(
            std::fs::symlink_metadata(d.path().join("1000").join(&names[0]))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        // Reading skips the link and finds the real archive.
        let file = open(d.path(), 1000, "j", Some(INV)).unwrap();
        assert_eq!(read_lines(file).unwrap(), lines(2));
        // scan lists only the real archive.
        let all = scan(d.path());
        assert_eq!(
            all.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(),
            [names[1].as_str()]
        );
    }

    #[test]
    fn unsafe_user_dir_is_refused() {
        let d = log_dir();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), d.path().join("1000")).unwrap();
        let e = write_lines(d.path(), 1000, "j", None, lines(1), u64::MAX, 1).unwrap_err();
        assert!(matches!(e, ArchiveError::UnsafeDir { .. }), "{e}");
        assert!(e.to_string().contains("root-only"), "{e}");
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
        std::fs::create_dir(d.path().join("1001")).unwrap();
        std::fs::set_permissions(
            d.path().join("1001"),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        let e = write_lines(d.path(), 1001, "j", None, lines(1), u64::MAX, 1).unwrap_err();
        assert!(e.to_string().contains("mode 777"), "{e}");
    }

    #[test]
    fn budget_cuts_the_archive_with_a_marker() {
        let d = log_dir();
        // Incompressible lines, far more than the budget.
        let mut rng = 0x1234_5678_u64;
        let noisy = (0..20_000u64).map(move |i| {
            let s: String = (0..64)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    char::from(b'!' + (rng % 90) as u8)
                })
                .collect();
            (i, s)
        });
        let budget = 600 << 10;
        let info = write_lines(d.path(), 7, "big", None, noisy, budget, 1).unwrap();
        assert!(info.bytes <= budget, "{} > {budget}", info.bytes);
        assert_eq!(info.name, "big.unknown.log.gz");
        let read = read_lines(open(d.path(), 7, "big", None).unwrap()).unwrap();
        assert!(read.len() < 20_000);
        assert!(read.last().unwrap().1.contains("output cut here"));
    }

    #[test]
    fn names_are_safe_components() {
        assert_eq!(
            candidate_names("a.b", Some("../x"))[0],
            "a.b.unknown.log.gz"
        );
        assert_eq!(
            candidate_names("a", Some(INV))[3],
            format!("a.{INV}-3.log.gz")
        );
        assert_eq!(
            candidate_names("a", None).len(),
            1 + MAX_ALTERNATES as usize
        );
    }
}
