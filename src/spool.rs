//! The spool: where users drop job files, and the one place ptraind reads
//! data that untrusted users control. Everything here decides from `fstat` of
//! the open fd, never from a path looked up earlier.

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind, RenameMode};
use notify::{RecursiveMode, Watcher};

use crate::fsutil::{self, FileIdentity};
use crate::spec::{spool_file_stem, MAX_SPEC_BYTES};

/// What reading one spool entry gave.
#[derive(Debug)]
pub enum SpoolRead {
    /// A regular file with one link, read whole (at most `MAX_SPEC_BYTES`).
    File {
        name: String,
        stem: String,
        identity: FileIdentity,
        bytes: Vec<u8>,
        /// The open file, kept until the entry is claimed and removed: while
        /// it is open its inode cannot be freed, so no newer file the owner
        /// renames over the name can get the same inode number and be taken
        /// for it ([`same_entry`]).
        held: Option<std::fs::File>,
    },
    /// Refused before its content mattered. `identity` is from fstat when
    /// the file could be opened, else from an lstat used only to tell the
    /// owner.
    Refused {
        name: String,
        reason: String,
        identity: Option<FileIdentity>,
        /// The bytes, when they could be read, to keep in quarantine.
        bytes: Option<Vec<u8>>,
        is_dir: bool,
        /// The open file, when it could be opened; as for `File`.
        held: Option<std::fs::File>,
    },
    /// Not a job file (a dotfile, a temp name, an editor leftover) or gone.
    Ignored,
}

/// Is this a name users publish jobs under? Temp files and dotfiles are
/// not: a writer renames them to their final name when complete.
pub fn is_candidate_name(name: &str) -> bool {
    !name.starts_with('.') && name.ends_with(".json")
}

/// Is this a name that is no job file and no temp file either (`job.JSON`,
/// `job.yaml`, `notes`)? The spool is unlistable for users, so such an
/// entry would sit there unseen: it is refused once it has been left
/// alone for [`STRAY_GRACE`] (a writer's temp name is renamed by then).
pub fn is_stray_name(name: &str) -> bool {
    !name.starts_with('.') && !name.ends_with(".json")
}

/// How long an entry under a stray name may stay before it is refused.
pub const STRAY_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// Reads an entry left under a stray name, as a refusal that keeps its
/// bytes (when it is a regular file within the size limit) and tells its
/// owner what ptraind takes.
pub fn read_stray(spool: &OwnedFd, name: &str) -> SpoolRead {
    let reason = format!(
        "\"{}\" is no job file name, so ptraind never reads it: job files are named NAME.json \
         (dotfiles are left alone as temp files); submit it again under a .json name",
        crate::display::escape(name)
    );
    let mut file = match fsutil::open_at_nofollow(spool, name) {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return SpoolRead::Ignored,
        Err(_) => {
            let identity = fsutil::lstat_at(spool, name).ok();
            let is_dir = identity.is_some_and(|i| i.mode & libc::S_IFMT == libc::S_IFDIR);
            return refusal(name, reason, identity, None, is_dir);
        }
    };
    let mut read = match check_open(name, "", &mut file) {
        SpoolRead::File {
            identity, bytes, ..
        } => refusal(name, reason, Some(identity), Some(bytes), false),
        SpoolRead::Refused {
            identity, is_dir, ..
        } => refusal(name, reason, identity, None, is_dir),
        SpoolRead::Ignored => SpoolRead::Ignored,
    };
    if let SpoolRead::Refused { held, .. } = &mut read {
        *held = Some(file);
    }
    read
}

/// Opens and reads one spool entry safely.
pub fn read_spool_file(spool: &OwnedFd, name: &str) -> SpoolRead {
    if !is_candidate_name(name) {
        return SpoolRead::Ignored;
    }
    let refused = |reason, identity, bytes, is_dir| refusal(name, reason, identity, bytes, is_dir);
    let Some(stem) = spool_file_stem(name) else {
        let identity = match fsutil::lstat_at(spool, name) {
            // Gone already (refused at an earlier event for the same name):
            // a refusal without an owner would tell nobody anything.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return SpoolRead::Ignored,
            other => other.ok(),
        };
        let is_dir = identity.is_some_and(|i| i.mode & libc::S_IFMT == libc::S_IFDIR);
        // Escaped for display, not `{:?}`: a name that was not UTF-8 is
        // already spelled out once ([`entry_name`]: `r\xe9sum\xe9.json`),
        // and Debug would double its backslashes; [`escape`] spells out
        // only what a terminal would act on (a newline: the reason stays
        // one line) and keeps backslashes.
        //
        // [`escape`]: crate::display::escape
        return refused(
            format!(
                "file name \"{}\" is not allowed; name job files like `resnet-lr01.json` \
                 (letters, digits, '.', '_', '-'; at most 64 characters before .json)",
                crate::display::escape(name)
            ),
            identity,
            None,
            is_dir,
        );
    };
    let mut file = match fsutil::open_at_nofollow(spool, name) {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return SpoolRead::Ignored,
        Err(e) => {
            let identity = fsutil::lstat_at(spool, name).ok();
            let is_dir = identity.is_some_and(|i| i.mode & libc::S_IFMT == libc::S_IFDIR);
            let reason = if e.raw_os_error() == Some(libc::ELOOP) {
                "it is a symbolic link; copy the job file itself into the spool (ptrain submit FILE)"
                    .to_string()
            } else {
                format!("it cannot be opened ({e}); drop a readable regular file")
            };
            return refused(reason, identity, None, is_dir);
        }
    };
    let mut read = check_open(name, stem, &mut file);
    if let SpoolRead::File { held, .. } | SpoolRead::Refused { held, .. } = &mut read {
        *held = Some(file);
    }
    read
}

/// Whether the entry found under a name now is still the one claimed:
/// the same file system and inode (which cannot have been reused while
/// ptraind holds the claimed file open) and the same change time.
pub fn same_entry(now: &FileIdentity, claimed: &FileIdentity) -> bool {
    now.dev == claimed.dev && now.ino == claimed.ino && now.ctime_ns == claimed.ctime_ns
}

fn refusal(
    name: &str,
    reason: String,
    identity: Option<FileIdentity>,
    bytes: Option<Vec<u8>>,
    is_dir: bool,
) -> SpoolRead {
    SpoolRead::Refused {
        name: name.to_owned(),
        reason,
        identity,
        bytes,
        is_dir,
        held: None,
    }
}

/// The checks and the read of an opened spool file.
fn check_open(name: &str, stem: &str, file: &mut std::fs::File) -> SpoolRead {
    let refused = |reason, identity, bytes, is_dir| refusal(name, reason, identity, bytes, is_dir);
    let identity = match fsutil::fstat(&*file) {
        Ok(identity) => identity,
        Err(e) => return refused(format!("fstat failed: {e}"), None, None, false),
    };
    if !identity.is_regular() {
        let is_dir = identity.mode & libc::S_IFMT == libc::S_IFDIR;
        return refused(
            format!(
                "it is a {}, not a regular file; drop a regular JSON file",
                identity.kind()
            ),
            Some(identity),
            None,
            is_dir,
        );
    }
    if identity.nlink != 1 {
        return refused(
            format!(
                "it has {} hard links; a job file must have exactly one (copy it, do not link it)",
                identity.nlink
            ),
            Some(identity),
            None,
            false,
        );
    }
    if identity.size > MAX_SPEC_BYTES as u64 {
        return refused(
            format!(
                "it is {} bytes, over the limit of {MAX_SPEC_BYTES} bytes; keep large data in the workdir",
                identity.size
            ),
            Some(identity),
            None,
            false,
        );
    }
    let bytes = match fsutil::read_bounded(file, MAX_SPEC_BYTES) {
        Ok(bytes) => bytes,
        Err(e) => return refused(format!("read failed: {e}"), Some(identity), None, false),
    };
    if bytes.len() > MAX_SPEC_BYTES {
        return refused(
            format!("it grew past the limit of {MAX_SPEC_BYTES} bytes while being read"),
            Some(identity),
            None,
            false,
        );
    }
    SpoolRead::File {
        name: name.to_owned(),
        stem: stem.to_owned(),
        identity,
        bytes,
        held: None,
    }
}

/// What the spool holds, for the rescan at start and after an inotify
/// overflow: job file names, and stray names ([`is_stray_name`]).
#[derive(Debug, Default)]
pub struct Listing {
    pub candidates: Vec<String>,
    pub strays: Vec<String>,
}

pub fn scan(spool_dir: &Path) -> std::io::Result<Listing> {
    let mut listing = Listing::default();
    for name in std::fs::read_dir(spool_dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| entry_name(spool_dir, &e.file_name()))
    {
        if is_candidate_name(&name) {
            listing.candidates.push(name);
        } else if is_stray_name(&name) {
            listing.strays.push(name);
        }
    }
    listing.candidates.sort();
    listing.strays.sort();
    Ok(listing)
}

/// Longest escaped name [`entry_name`] renames to (a file name is at most
/// 255 bytes; room is left for a `~N` suffix).
const MAX_ESCAPED_NAME: usize = 240;

/// The name of a spool entry as text. A job file whose name is not UTF-8
/// could be neither named in a reason nor kept in quarantine, and would
/// sit in the spool unseen: it is renamed within the spool (never over
/// another entry) to its name with each invalid byte written `\xNN`,
/// which the name check then refuses, with its reason, to its owner.
/// None: not a job file's name, or the entry is gone.
pub fn entry_name(spool_dir: &Path, raw: &std::ffi::OsStr) -> Option<String> {
    use std::fmt::Write;
    use std::os::unix::ffi::OsStrExt;
    if let Some(name) = raw.to_str() {
        return Some(name.to_owned());
    }
    let bytes = raw.as_bytes();
    if bytes.starts_with(b".") || !bytes.ends_with(b".json") {
        return None;
    }
    let mut escaped = String::new();
    for chunk in bytes[..bytes.len() - ".json".len()].utf8_chunks() {
        escaped.push_str(chunk.valid());
        for b in chunk.invalid() {
            let _ = write!(escaped, "\\x{b:02x}");
        }
    }
    while escaped.len() > MAX_ESCAPED_NAME {
        escaped.pop();
    }
    let from = spool_dir.join(raw);
    for n in 0..100 {
        let name = match n {
            0 => format!("{escaped}.json"),
            n => format!("{escaped}~{n}.json"),
        };
        match fsutil::rename_noreplace(&from, &spool_dir.join(&name)) {
            Ok(()) => return Some(name),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(spool = %spool_dir.display(), name = %escaped, error = %e, "cannot rename a spool entry whose name is not UTF-8");
                return None;
            }
        }
    }
    None
}

/// Refuses a spool directory (or parent) that someone other than root
/// could tamper with.
pub fn check_spool_dir(spool_dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(spool_dir)
        .map_err(|e| format!("spool directory {}: {e}", spool_dir.display()))?;
    if !meta.is_dir() {
        return Err(format!(
            "spool directory {} is not a directory (a symlink?); make it a real directory owned by root with mode 1733",
            spool_dir.display()
        ));
    }
    let mode = meta.mode() & 0o7777;
    if meta.uid() != 0 || mode != 0o1733 {
        return Err(format!(
            "spool directory {} is owned by uid {} with mode {:o}; it must be root-owned with mode 1733 \
             (users drop files, cannot list or remove others'): chown root:root {0} && chmod 1733 {0}",
            spool_dir.display(),
            meta.uid(),
            mode
        ));
    }
    let mut parent: Option<PathBuf> = spool_dir.parent().map(Path::to_owned);
    while let Some(dir) = parent {
        let meta = std::fs::metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mode = meta.mode();
        let writable_by_others = mode & 0o022 != 0;
        let sticky = mode & 0o1000 != 0;
        if meta.uid() != 0 || (writable_by_others && !sticky) {
            return Err(format!(
                "parent directory {} of the spool is owned by uid {} with mode {:o}; every parent must be \
                 root-owned and not writable by others, or someone could swap the spool: fix its owner and mode",
                dir.display(),
                meta.uid(),
                mode & 0o7777
            ));
        }
        parent = dir.parent().map(Path::to_owned);
    }
    Ok(())
}

/// Creates the spool with the right owner and mode when it does not exist.
pub fn ensure_spool_dir(spool_dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if std::fs::symlink_metadata(spool_dir).is_err() {
        fsutil::ensure_dir(spool_dir, 0o1733)?;
        std::fs::set_permissions(spool_dir, std::fs::Permissions::from_mode(0o1733))?;
    }
    Ok(())
}

/// What the watcher reports.
#[derive(Debug)]
pub enum SpoolEvent {
    /// A file was completed under this name (close-write or moved in).
    File(String),
    /// An entry was completed under a stray name ([`is_stray_name`]).
    Stray(String),
    /// Events were lost (inotify overflow): read the whole directory again.
    Rescan,
}

/// Is an entry whose creation was just reported already complete? A new
/// regular file with one link is not: its writer has yet to write and close
/// it (close-write follows). Anything else is whole from the moment it
/// exists and gets no later event: a symlink, a FIFO, a device node, a
/// socket, a directory, or a hard link to an existing file.
pub fn created_entry_is_complete(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    !(meta.file_type().is_file() && meta.nlink() == 1)
}

/// Watches the spool with inotify and sends names of completed files.
/// Acts on close-write and moved-to; on create only for entries that cannot
/// be written to completion later ([`created_entry_is_complete`]): a
/// regular file being written is not a job yet.
pub fn watch(
    spool_dir: &Path,
    on_event: impl Fn(SpoolEvent) + Send + 'static,
) -> notify::Result<notify::RecommendedWatcher> {
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let event = match res {
            Ok(event) => event,
            Err(e) => {
                tracing::warn!(error = %e, "spool watcher error; rescanning");
                on_event(SpoolEvent::Rescan);
                return;
            }
        };
        if event.need_rescan() {
            on_event(SpoolEvent::Rescan);
            return;
        }
        let created = matches!(event.kind, EventKind::Create(_));
        let complete = matches!(
            event.kind,
            EventKind::Access(AccessKind::Close(AccessMode::Write))
                | EventKind::Modify(ModifyKind::Name(RenameMode::To))
        );
        if !complete && !created {
            return;
        }
        for path in event.paths {
            let (Some(dir), Some(raw)) = (path.parent(), path.file_name()) else {
                continue;
            };
            let Some(name) = entry_name(dir, raw) else {
                continue;
            };
            let stray = is_stray_name(&name);
            if !is_candidate_name(&name) && !stray {
                continue;
            }
            // A symlink, hard link, FIFO, device, socket or directory is
            // made whole by one call and never sends close-write: without
            // this it would sit in the spool unseen until the next rescan.
            // The lstat only decides whether to look; what to do with the
            // entry is decided from fstat of the opened fd, as always.
            let path = dir.join(&name);
            if created
                && !std::fs::symlink_metadata(&path).is_ok_and(|m| created_entry_is_complete(&m))
            {
                continue;
            }
            on_event(if stray {
                SpoolEvent::Stray(name)
            } else {
                SpoolEvent::File(name)
            });
        }
    })?;
    watcher.watch(spool_dir, RecursiveMode::NonRecursive)?;
    Ok(watcher)
}

/// Entries under stray names, each refused once it has been there for
/// [`STRAY_GRACE`]; in order of arrival, which is the order they are due.
/// At most [`MAX_STRAYS_PER_OWNER`] of one owner (the entry's lstat, a
/// hint: what is done is decided when it is read) and [`MAX_STRAYS`] in
/// all wait; beyond that a name waits for the next event or rescan, so no
/// user can make ptraind's memory grow or crowd out others' names.
#[derive(Debug, Default)]
pub struct Strays {
    due: std::collections::VecDeque<(tokio::time::Instant, String, Option<u32>)>,
    waiting: std::collections::HashSet<String>,
    per_owner: std::collections::HashMap<Option<u32>, usize>,
}

pub const MAX_STRAYS: usize = 4096;
pub const MAX_STRAYS_PER_OWNER: usize = 256;

impl Strays {
    pub fn note(&mut self, name: String, owner: Option<u32>, now: tokio::time::Instant) {
        let of_owner = self.per_owner.get(&owner).copied().unwrap_or(0);
        if self.waiting.len() >= MAX_STRAYS
            || of_owner >= MAX_STRAYS_PER_OWNER
            || !self.waiting.insert(name.clone())
        {
            return;
        }
        *self.per_owner.entry(owner).or_default() += 1;
        self.due.push_back((now + STRAY_GRACE, name, owner));
    }

    pub fn next_due(&self) -> Option<tokio::time::Instant> {
        self.due.front().map(|(at, _, _)| *at)
    }

    /// The oldest name whose grace is over at `now`; it stops waiting.
    pub fn pop_due(&mut self, now: tokio::time::Instant) -> Option<String> {
        if self.due.front().is_none_or(|(at, _, _)| *at > now) {
            return None;
        }
        let (_, name, owner) = self.due.pop_front()?;
        self.waiting.remove(&name);
        if let Some(count) = self.per_owner.get_mut(&owner) {
            *count -= 1;
            if *count == 0 {
                self.per_owner.remove(&owner);
            }
        }
        Some(name)
    }
}

/// Spool names waiting to be claimed, taken in turn by owner: one user's
/// burst of 10,000 files must not make another user's one file wait
/// behind it (`make bench`, `responsive.claim`). An owner who had nothing
/// waiting is fresh: their first name is taken before the owners already
/// taking turns (fresh owners among themselves in the order they came),
/// and the daemon claims it ahead of other work. The owner here is only
/// the entry's lstat, a hint for the order; what is done with a file is
/// decided from fstat of the open fd when it is read. A name already
/// waiting is not queued twice (a file sends several events).
#[derive(Debug, Default)]
pub struct FairIntake {
    by_owner: HashMap<u32, VecDeque<String>>,
    /// Owners with names waiting, in the order they get their next turn:
    /// the first `fresh` of them have not had a turn since they began
    /// waiting.
    turns: VecDeque<u32>,
    fresh: usize,
    waiting: HashSet<String>,
}

impl FairIntake {
    /// Queues `name` behind the other names of `owner` (None: its entry
    /// could not be looked at; such names share one turn).
    pub fn push(&mut self, name: String, owner: Option<u32>) {
        if !self.waiting.insert(name.clone()) {
            return;
        }
        let owner = owner.unwrap_or(u32::MAX);
        let queue = self.by_owner.entry(owner).or_default();
        if queue.is_empty() {
            self.turns.insert(self.fresh, owner);
            self.fresh += 1;
        }
        queue.push_back(name);
    }

    /// The next name: the oldest of the owner whose turn it is.
    pub fn pop(&mut self) -> Option<String> {
        let owner = self.turns.pop_front()?;
        self.fresh = self.fresh.saturating_sub(1);
        let queue = self.by_owner.get_mut(&owner)?;
        let name = queue.pop_front()?;
        if queue.is_empty() {
            self.by_owner.remove(&owner);
        } else {
            self.turns.push_back(owner);
        }
        self.waiting.remove(&name);
        Some(name)
    }

    pub fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }

    /// Whether an owner who had nothing waiting has a name here.
    pub fn has_fresh(&self) -> bool {
        self.fresh > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stray_name_is_listed_apart_and_refused_with_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("job.JSON"), b"{\"version\": 1}").unwrap();
        std::fs::write(p.join("ok.json"), b"{}").unwrap();
        std::fs::write(p.join(".ok.json.tmp"), b"{}").unwrap();
        std::fs::create_dir(p.join("folder")).unwrap();
        let listing = scan(p).unwrap();
        assert_eq!(listing.candidates, ["ok.json"]);
        assert_eq!(listing.strays, ["folder", "job.JSON"]);
        let fd = fsutil::open_dir(p).unwrap();
        match read_stray(&fd, "job.JSON") {
            SpoolRead::Refused { reason, bytes, .. } => {
                assert!(reason.contains("NAME.json"), "{reason}");
                assert_eq!(bytes.as_deref(), Some(&b"{\"version\": 1}"[..]));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            read_stray(&fd, "folder"),
            SpoolRead::Refused {
                is_dir: true,
                bytes: None,
                ..
            }
        ));
        std::fs::remove_file(p.join("job.JSON")).unwrap();
        assert!(matches!(read_stray(&fd, "job.JSON"), SpoolRead::Ignored));
    }

    #[test]
    fn owners_take_turns_and_a_name_waits_once() {
        let mut intake = FairIntake::default();
        for i in 0..5 {
            intake.push(format!("a{i}.json"), Some(1000));
        }
        intake.push("a0.json".into(), Some(1000));
        intake.push("b0.json".into(), Some(1001));
        intake.push("x.json".into(), None);
        let order: Vec<String> = std::iter::from_fn(|| intake.pop()).collect();
        assert_eq!(
            order,
            ["a0.json", "b0.json", "x.json", "a1.json", "a2.json", "a3.json", "a4.json"]
        );
        assert!(intake.is_empty());
        // Once taken, a name may come again (rewritten after a refusal).
        intake.push("a0.json".into(), Some(1000));
        assert_eq!(intake.pop().as_deref(), Some("a0.json"));
    }

    #[test]
    fn an_owner_with_nothing_waiting_goes_before_a_burst_in_the_order_owners_came() {
        let mut intake = FairIntake::default();
        for i in 0..4 {
            intake.push(format!("a{i}.json"), Some(1000));
        }
        assert!(intake.has_fresh());
        assert_eq!(intake.pop().as_deref(), Some("a0.json"));
        // Alice has had her turn: the burst's owner is no longer fresh.
        assert!(!intake.has_fresh());
        intake.push("b0.json".into(), Some(1001));
        intake.push("c0.json".into(), Some(1002));
        intake.push("b1.json".into(), Some(1001));
        assert!(intake.has_fresh());
        assert_eq!(intake.pop().as_deref(), Some("b0.json"));
        assert_eq!(intake.pop().as_deref(), Some("c0.json"));
        // Bob's second file waits for his next turn, behind Alice's.
        assert!(!intake.has_fresh());
        let rest: Vec<String> = std::iter::from_fn(|| intake.pop()).collect();
        assert_eq!(rest, ["a1.json", "b1.json", "a2.json", "a3.json"]);
        assert!(intake.is_empty() && !intake.has_fresh());
    }

    #[test]
    fn a_claimed_file_is_held_open_so_a_newer_one_is_never_taken_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(
            p.join("job.json"),
            br#"{"version": 1, "command": ["true"]}"#,
        )
        .unwrap();
        let fd = fsutil::open_dir(p).unwrap();
        let SpoolRead::File { identity, held, .. } = read_spool_file(&fd, "job.json") else {
            panic!("not read");
        };
        assert!(held.is_some(), "the claimed file stays open until removed");
        // The owner renames newer versions over the name, many times: while
        // the claimed inode is held, none of them can reuse its number.
        for i in 0..200 {
            std::fs::write(p.join(".next"), format!("v{i}")).unwrap();
            std::fs::rename(p.join(".next"), p.join("job.json")).unwrap();
            let now = fsutil::lstat_at(&fd, "job.json").unwrap();
            assert!(
                !same_entry(&now, &identity),
                "version {i} was taken for the claimed file"
            );
        }
        let mut touched = identity;
        touched.ctime_ns += 1;
        assert!(!same_entry(&touched, &identity));
        assert!(same_entry(&identity, &identity));
    }

    #[test]
    fn a_refused_name_is_quoted_escaped_once_on_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let fd = fsutil::open_dir(p).unwrap();
        for (name, shown) in [
            ("new\nline.json", r#""new\x0aline.json""#),
            (r"back\slash.json", r#""back\slash.json""#),
        ] {
            std::fs::write(p.join(name), b"{}").unwrap();
            match read_spool_file(&fd, name) {
                SpoolRead::Refused { reason, .. } => {
                    assert!(
                        reason.starts_with(&format!("file name {shown} is not allowed")),
                        "{reason}"
                    );
                    assert!(!reason.contains('\n'), "{reason}");
                }
                other => panic!("{name:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn reads_regular_files_and_refuses_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("ok.json"), b"{}").unwrap();
        std::os::unix::fs::symlink("/etc/shadow", p.join("link.json")).unwrap();
        std::fs::write(p.join("orig"), b"{}").unwrap();
        std::fs::hard_link(p.join("orig"), p.join("hard.json")).unwrap();
        std::fs::create_dir(p.join("dir.json")).unwrap();
        std::fs::write(p.join("bad name.json"), b"{}").unwrap();
        let f = std::fs::File::create(p.join("sparse.json")).unwrap();
        f.set_len(2 << 30).unwrap();
        let fd = fsutil::open_dir(p).unwrap();
        assert!(
            matches!(read_spool_file(&fd, "ok.json"), SpoolRead::File { stem, .. } if stem == "ok")
        );
        for (name, needle) in [
            ("link.json", "symbolic link"),
            ("hard.json", "hard links"),
            ("dir.json", "directory"),
            ("bad name.json", "file name"),
            ("sparse.json", "over the limit"),
        ] {
            match read_spool_file(&fd, name) {
                SpoolRead::Refused { reason, .. } => {
                    assert!(reason.contains(needle), "{name}: {reason}")
                }
                other => panic!("{name}: {other:?}"),
            }
        }
        assert!(matches!(
            read_spool_file(&fd, ".tmp.json"),
            SpoolRead::Ignored
        ));
        assert!(matches!(
            read_spool_file(&fd, "gone.json"),
            SpoolRead::Ignored
        ));
    }

    #[test]
    fn created_entries_that_are_already_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("new"), b"").unwrap();
        std::fs::write(p.join("orig"), b"").unwrap();
        std::fs::hard_link(p.join("orig"), p.join("linked")).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", p.join("sym")).unwrap();
        std::fs::create_dir(p.join("dir")).unwrap();
        let meta = |n: &str| std::fs::symlink_metadata(p.join(n)).unwrap();
        assert!(!created_entry_is_complete(&meta("new")));
        for whole in ["linked", "sym", "dir"] {
            assert!(created_entry_is_complete(&meta(whole)), "{whole}");
        }
    }

    /// The watcher reports an entry made whole by one call (symlink, FIFO,
    /// directory, hard link) at once, and a regular file only when its
    /// writer closes it.
    #[test]
    fn watcher_reports_links_and_fifos_at_once_and_files_when_closed() {
        use std::io::Write;
        use std::sync::mpsc;
        use std::time::Duration;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().to_owned();
        let (tx, rx) = mpsc::channel();
        let _watcher = watch(&p, move |e| {
            if let SpoolEvent::File(name) = e {
                let _ = tx.send(name);
            }
        })
        .unwrap();
        let next = || rx.recv_timeout(Duration::from_secs(5)).expect("an event");
        std::os::unix::fs::symlink("/etc/shadow", p.join("sym.json")).unwrap();
        assert_eq!(next(), "sym.json");
        let c = std::ffi::CString::new(p.join("fifo.json").to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(next(), "fifo.json");
        std::fs::create_dir(p.join("dir.json")).unwrap();
        assert_eq!(next(), "dir.json");
        std::fs::write(p.join("orig"), b"{}").unwrap();
        std::fs::hard_link(p.join("orig"), p.join("hard.json")).unwrap();
        assert_eq!(next(), "hard.json");
        // Ignored: not a job name.
        std::os::unix::fs::symlink("/", p.join(".hidden.json")).unwrap();
        let mut writing = std::fs::File::create(p.join("slow.json")).unwrap();
        writing.write_all(b"{").unwrap();
        // The marker proves the writer's create and write were seen and
        // passed over: events arrive in order.
        std::os::unix::fs::symlink("/", p.join("marker.json")).unwrap();
        assert_eq!(next(), "marker.json");
        writing.write_all(b"}").unwrap();
        drop(writing);
        assert_eq!(next(), "slow.json");
    }

    #[test]
    fn spool_dir_must_be_root_1733() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("spool");
        ensure_spool_dir(&spool).unwrap();
        // tempdir's parents are root-owned on the test machines (running as root).
        if unsafe { libc::geteuid() } == 0 {
            check_spool_dir(&spool).unwrap();
        }
        std::fs::set_permissions(&spool, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = check_spool_dir(&spool).unwrap_err();
        assert!(err.contains("1733"), "{err}");
    }

    #[test]
    fn a_name_that_is_not_utf8_is_renamed_to_one_the_name_check_refuses() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let raw = std::ffi::OsStr::from_bytes(b"r\xe9sum\xe9.json");
        std::fs::write(p.join(raw), b"{}").unwrap();
        // Taken already: the renamed entry must not replace it.
        std::fs::write(p.join("r\\xe9sum\\xe9.json"), b"taken").unwrap();
        // Not a job file's name: left alone.
        let hidden = std::ffi::OsStr::from_bytes(b".tmp\xff.json");
        std::fs::write(p.join(hidden), b"{}").unwrap();

        let names = scan(p).unwrap().candidates;
        assert_eq!(names, ["r\\xe9sum\\xe9.json", "r\\xe9sum\\xe9~1.json"]);
        assert_eq!(
            std::fs::read(p.join("r\\xe9sum\\xe9.json")).unwrap(),
            b"taken"
        );
        assert!(!p.join(raw).exists());
        assert!(p.join(hidden).exists());
        let fd = fsutil::open_dir(p).unwrap();
        match read_spool_file(&fd, "r\\xe9sum\\xe9~1.json") {
            // The name as it was escaped once, backslashes not doubled.
            SpoolRead::Refused { reason, .. } => assert!(
                reason.starts_with(r#"file name "r\xe9sum\xe9~1.json" is not allowed"#),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
        // Its second event, once it is gone, refuses nothing again.
        std::fs::remove_file(p.join("r\\xe9sum\\xe9~1.json")).unwrap();
        assert!(matches!(
            read_spool_file(&fd, "r\\xe9sum\\xe9~1.json"),
            SpoolRead::Ignored
        ));
        // A long one stays within the file name limit.
        let long: Vec<u8> = [vec![0xff; 200], b".json".to_vec()].concat();
        std::fs::write(p.join(std::ffi::OsStr::from_bytes(&long)), b"{}").unwrap();
        let names = scan(p).unwrap().candidates;
        assert!(
            names
                .iter()
                .any(|n| n.starts_with("\\xff") && n.len() <= 250),
            "{names:?}"
        );
    }
}
