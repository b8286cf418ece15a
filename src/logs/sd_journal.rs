//! The journal read in-process with libsystemd's sd-journal API, and
//! journald synced over its varlink socket: what `journalctl` and
//! `journalctl --sync` do, without a process per ended job.
//!
//! Why: `make bench` found two journalctl runs per ended job (the archive's
//! sync and its read, and again for a notification's last lines) to be a
//! quarter of all CPU on a 2-core host starting trivial jobs: almost all of
//! it the dynamic linking of each new journalctl, not the reading.
//!
//! libsystemd.so.0 is loaded at run time (like NVML), so the binaries link
//! against nothing new; every host with systemd has it (Debian: libsystemd0,
//! which systemd depends on). A journal is opened per read and closed after
//! it (well under a millisecond): a handle kept open would keep journal
//! files mapped into ptraind's memory and follow rotations for nothing.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use super::journal::Entry;

/// sd_journal_open(3): files of the local machine only.
const SD_JOURNAL_LOCAL_ONLY: c_int = 1;

/// journald's varlink socket (systemd >= 245): `journalctl --sync` asks it.
const JOURNALD_VARLINK: &str = "/run/systemd/journal/io.systemd.journal";

type Handle = *mut c_void;

/// The sd-journal functions ptraind uses.
struct Api {
    open: unsafe extern "C" fn(*mut Handle, c_int) -> c_int,
    close: unsafe extern "C" fn(Handle),
    add_match: unsafe extern "C" fn(Handle, *const c_void, usize) -> c_int,
    flush_matches: unsafe extern "C" fn(Handle),
    set_data_threshold: unsafe extern "C" fn(Handle, usize) -> c_int,
    seek_realtime_usec: unsafe extern "C" fn(Handle, u64) -> c_int,
    seek_tail: unsafe extern "C" fn(Handle) -> c_int,
    get_cutoff_realtime_usec: unsafe extern "C" fn(Handle, *mut u64, *mut u64) -> c_int,
    next: unsafe extern "C" fn(Handle) -> c_int,
    previous: unsafe extern "C" fn(Handle) -> c_int,
    get_realtime_usec: unsafe extern "C" fn(Handle, *mut u64) -> c_int,
    get_data: unsafe extern "C" fn(Handle, *const c_char, *mut *const c_void, *mut usize) -> c_int,
    get_cursor: unsafe extern "C" fn(Handle, *mut *mut c_char) -> c_int,
    /// Kept loaded for the life of the process: the pointers above point
    /// into it.
    _lib: libloading::Library,
}

fn api() -> io::Result<&'static Api> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        load().map_err(|e| {
            format!("cannot load libsystemd.so.0 to read the journal ({e}); install libsystemd0")
        })
    })
    .as_ref()
    .map_err(|e| io::Error::other(e.clone()))
}

fn load() -> Result<Api, libloading::Error> {
    // SAFETY: libsystemd's initialisers have no preconditions; each symbol
    // is given the C signature documented in sd-journal(3).
    unsafe {
        let lib = libloading::Library::new("libsystemd.so.0")?;
        Ok(Api {
            open: *lib.get(b"sd_journal_open\0")?,
            close: *lib.get(b"sd_journal_close\0")?,
            add_match: *lib.get(b"sd_journal_add_match\0")?,
            flush_matches: *lib.get(b"sd_journal_flush_matches\0")?,
            set_data_threshold: *lib.get(b"sd_journal_set_data_threshold\0")?,
            seek_realtime_usec: *lib.get(b"sd_journal_seek_realtime_usec\0")?,
            seek_tail: *lib.get(b"sd_journal_seek_tail\0")?,
            get_cutoff_realtime_usec: *lib.get(b"sd_journal_get_cutoff_realtime_usec\0")?,
            next: *lib.get(b"sd_journal_next\0")?,
            previous: *lib.get(b"sd_journal_previous\0")?,
            get_realtime_usec: *lib.get(b"sd_journal_get_realtime_usec\0")?,
            get_data: *lib.get(b"sd_journal_get_data\0")?,
            get_cursor: *lib.get(b"sd_journal_get_cursor\0")?,
            _lib: lib,
        })
    }
}

/// sd-journal's negative errno returns as io errors naming the call.
fn check(call: &str, r: c_int) -> io::Result<c_int> {
    if r < 0 {
        let e = io::Error::from_raw_os_error(-r);
        Err(io::Error::new(e.kind(), format!("{call}: {e}")))
    } else {
        Ok(r)
    }
}

/// One open view of the journal, the entries of one unit.
struct Journal {
    api: &'static Api,
    handle: Handle,
}

impl Drop for Journal {
    fn drop(&mut self) {
        // SAFETY: handle came from sd_journal_open and is closed once.
        unsafe { (self.api.close)(self.handle) }
    }
}

impl Journal {
    /// The local journal (system and per-user files, as journalctl as root
    /// reads it).
    fn open() -> io::Result<Journal> {
        let api = api()?;
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: handle is a valid out pointer.
        check("sd_journal_open", unsafe {
            (api.open)(&mut handle, SD_JOURNAL_LOCAL_ONLY)
        })?;
        let journal = Journal { api, handle };
        // Long messages in full (journalctl --all).
        // SAFETY: handle is open.
        check("sd_journal_set_data_threshold", unsafe {
            (api.set_data_threshold)(handle, 0)
        })?;
        Ok(journal)
    }

    /// From now on, only `unit`'s entries.
    fn show_only(&mut self, unit: &str) -> io::Result<()> {
        let data = format!("_SYSTEMD_UNIT={unit}");
        // SAFETY: handle is open; data outlives the call (sd-journal copies it).
        unsafe { (self.api.flush_matches)(self.handle) };
        check("sd_journal_add_match", unsafe {
            (self.api.add_match)(self.handle, data.as_ptr().cast(), data.len())
        })?;
        Ok(())
    }

    fn of_unit(unit: &str) -> io::Result<Journal> {
        let mut journal = Journal::open()?;
        journal.show_only(unit)?;
        Ok(journal)
    }

    fn field(&self, name: &CStr) -> Option<&[u8]> {
        let mut data: *const c_void = std::ptr::null();
        let mut len = 0usize;
        // SAFETY: handle is open and positioned on an entry; the returned
        // buffer stays valid until the next move, and `&self` ties it to
        // this borrow (every move takes `&mut self`).
        let r = unsafe { (self.api.get_data)(self.handle, name.as_ptr(), &mut data, &mut len) };
        if r < 0 || data.is_null() {
            return None;
        }
        // SAFETY: sd_journal_get_data returned `len` readable bytes.
        let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
        // "NAME=value"
        bytes.get(name.to_bytes().len() + 1..)
    }

    fn text(&self, name: &CStr) -> Option<String> {
        self.field(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// The entry the journal is positioned on.
    fn entry(&self) -> io::Result<Entry> {
        let mut realtime = 0u64;
        // SAFETY: handle is open and positioned on an entry.
        check("sd_journal_get_realtime_usec", unsafe {
            (self.api.get_realtime_usec)(self.handle, &mut realtime)
        })?;
        let mut raw: *mut c_char = std::ptr::null_mut();
        // SAFETY: as above; the cursor is malloc'ed and ours to free.
        check("sd_journal_get_cursor", unsafe {
            (self.api.get_cursor)(self.handle, &mut raw)
        })?;
        // SAFETY: raw is a NUL-terminated string from libsystemd, freed once.
        let cursor = unsafe {
            let cursor = CStr::from_ptr(raw).to_string_lossy().into_owned();
            libc::free(raw.cast());
            cursor
        };
        Ok(Entry {
            cursor,
            realtime,
            message: self.text(c"MESSAGE").unwrap_or_default(),
            invocation: self.text(c"_SYSTEMD_INVOCATION_ID"),
            stream: self.text(c"_STREAM_ID"),
        })
    }

    /// When the oldest entry still in any journal file was received (µs);
    /// None for an empty journal. Read from the files' headers.
    fn oldest(&self) -> io::Result<Option<u64>> {
        let (mut from, mut to) = (0u64, 0u64);
        // SAFETY: handle is open; both are valid out pointers.
        let r = check("sd_journal_get_cutoff_realtime_usec", unsafe {
            (self.api.get_cutoff_realtime_usec)(self.handle, &mut from, &mut to)
        })?;
        Ok((r > 0).then_some(from))
    }

    fn step(&mut self, forward: bool) -> io::Result<bool> {
        // SAFETY: handle is open.
        let r = unsafe {
            if forward {
                (self.api.next)(self.handle)
            } else {
                (self.api.previous)(self.handle)
            }
        };
        let call = if forward {
            "sd_journal_next"
        } else {
            "sd_journal_previous"
        };
        Ok(check(call, r)? > 0)
    }
}

/// The journal opened once for reading several units in turn: the
/// archiver's batch of ended jobs. Opening maps every journal file, which
/// `make bench` found costing more than reading a short job's lines; it is
/// closed with the batch, so nothing stays mapped while ptraind idles.
pub struct Reader {
    journal: Journal,
}

impl Reader {
    pub fn open() -> io::Result<Reader> {
        Ok(Reader {
            journal: Journal::open()?,
        })
    }

    /// See [`oldest_entry_time`].
    pub fn oldest_entry_time(&self) -> io::Result<Option<u64>> {
        self.journal.oldest()
    }

    /// Every entry of `unit` received at or after `since` (µs).
    pub fn entries_since(&mut self, unit: &str, since: u64) -> io::Result<EntriesSince<'_>> {
        let journal = &mut self.journal;
        journal.show_only(unit)?;
        // SAFETY: handle is open.
        check("sd_journal_seek_realtime_usec", unsafe {
            (journal.api.seek_realtime_usec)(journal.handle, since)
        })?;
        Ok(EntriesSince {
            journal,
            since,
            done: false,
        })
    }
}

/// The entries of one unit received at or after a time, in journal order
/// (`journalctl --since`). A read error ends it, logged.
pub struct EntriesSince<'a> {
    journal: &'a mut Journal,
    since: u64,
    done: bool,
}

impl Iterator for EntriesSince<'_> {
    type Item = Entry;

    fn next(&mut self) -> Option<Entry> {
        while !self.done {
            let entry = self
                .journal
                .step(true)
                .and_then(|more| more.then(|| self.journal.entry()).transpose());
            match entry {
                // A seek lands near `since`; entries of other files may
                // interleave.
                Ok(Some(entry)) if entry.realtime < self.since => {}
                Ok(Some(entry)) => return Some(entry),
                Ok(None) => self.done = true,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the journal stopped early");
                    self.done = true;
                }
            }
        }
        None
    }
}

/// When the oldest entry journald still keeps was received (µs): output
/// from before it may have been removed to keep the journal within its
/// size limits ([`super::journal::lost_head_notice`]).
pub fn oldest_entry_time() -> io::Result<Option<u64>> {
    Journal::open()?.oldest()
}

/// The last `n` entries of `unit` received at or after `since` (µs), oldest
/// first (`journalctl --lines=N --since`).
pub fn last_since(unit: &str, since: u64, n: usize) -> io::Result<Vec<Entry>> {
    let mut journal = Journal::of_unit(unit)?;
    // SAFETY: handle is open.
    check("sd_journal_seek_tail", unsafe {
        (journal.api.seek_tail)(journal.handle)
    })?;
    let mut out = Vec::new();
    while out.len() < n && journal.step(false)? {
        let entry = journal.entry()?;
        if entry.realtime < since {
            break;
        }
        out.push(entry);
    }
    out.reverse();
    Ok(out)
}

/// Asks journald to write out everything it received so far, stream lines
/// still queued in its sockets included, and waits for it: the varlink call
/// `journalctl --sync` makes. Err when the socket cannot be reached (an
/// old systemd): the caller falls back to `journalctl --sync`.
pub fn sync_over_varlink(timeout: Duration) -> io::Result<()> {
    sync_at(Path::new(JOURNALD_VARLINK), timeout)
}

fn sync_at(socket: &Path, timeout: Duration) -> io::Result<()> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(b"{\"method\":\"io.systemd.Journal.Synchronize\",\"parameters\":{}}\0")?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 512];
    while !reply.ends_with(b"\0") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "journald closed the varlink connection without a reply",
            ));
        }
        reply.extend_from_slice(&buf[..n]);
        if reply.len() > 64 << 10 {
            return Err(io::Error::other("journald's varlink reply is too long"));
        }
    }
    reply.pop();
    let value: serde_json::Value = serde_json::from_slice(&reply)
        .map_err(|e| io::Error::other(format!("journald's varlink reply: {e}")))?;
    match value.get("error") {
        None => Ok(()),
        Some(error) => Err(io::Error::other(format!(
            "journald refused Synchronize: {error}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn serve_once(reply: &'static [u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("io.systemd.journal");
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 256];
            while !got.ends_with(b"\0") {
                let n = conn.read(&mut buf).unwrap();
                if n == 0 {
                    return;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert_eq!(
                &got[..],
                b"{\"method\":\"io.systemd.Journal.Synchronize\",\"parameters\":{}}\0"
            );
            if !reply.is_empty() {
                conn.write_all(reply).unwrap();
            }
        });
        (dir, path)
    }

    #[test]
    fn sync_sends_synchronize_and_accepts_the_empty_reply() {
        let (_dir, path) = serve_once(b"{\"parameters\":{}}\0");
        sync_at(&path, Duration::from_secs(5)).unwrap();
    }

    #[test]
    fn sync_reports_a_varlink_error_and_a_closed_connection() {
        let (_dir, path) = serve_once(
            b"{\"error\":\"io.systemd.Journal.NotSupportedByNamespaces\",\"parameters\":{}}\0",
        );
        let e = sync_at(&path, Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("NotSupportedByNamespaces"), "{e}");
        let (_dir, path) = serve_once(b"");
        let e = sync_at(&path, Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    }

    #[test]
    fn sync_without_a_socket_fails_so_the_caller_falls_back() {
        let dir = tempfile::tempdir().unwrap();
        assert!(sync_at(&dir.path().join("missing"), Duration::from_secs(1)).is_err());
    }
}
