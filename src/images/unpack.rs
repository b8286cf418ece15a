//! Unpacking one layer into a directory of its own: the security core.
//!
//! The layer is a tar (plain, gzip or zstd, told by its magic bytes) from
//! someone untrusted. Nothing of it is handed to a library's `unpack`:
//! every entry is written here, through directory fds walked one
//! component at a time with `O_NOFOLLOW` (`safe_fs.rs`), so:
//!
//! - a path that is absolute, has a `..` component, a NUL, more than
//!   [`MAX_DEPTH`] components or more than 4096 bytes is refused;
//! - an entry whose parent path goes through a symlink (`etc -> /` then
//!   `etc/passwd`) or through a file is refused; symlinks themselves are
//!   stored as they are (`RootDirectory=` resolves them inside the image
//!   at run time; nothing here ever follows one);
//! - a hard link must name an earlier regular file of the same layer by a
//!   path that passes the same checks; a link to a symlink, a directory or
//!   a missing file is refused;
//! - device nodes and FIFOs are refused (a job gets its own `/dev`);
//! - past `max_bytes` of file content, counted by apparent size (a sparse
//!   file counts its holes), or `max_entries` entries, the layer is
//!   refused before the entry is written; the decompressed stream itself
//!   is bounded too, and a tar metadata entry (long name, PAX header)
//!   over 1 MiB is refused before the tar reader buffers it in memory;
//! - modes keep only `0755` of the entry's bits: no setuid, setgid or
//!   sticky bit, nothing group- or world-writable (a world-writable
//!   `/tmp` included: the job gets `PrivateTmp=`); xattrs (file
//!   capabilities among them) and owners are never restored: everything
//!   is owned by the daemon, root;
//! - whiteouts (`.wh.NAME`) and opaque markers (`.wh..wh..opq`) are not
//!   written: they are returned in [`LayerChanges`] for the assembly.
//!
//! Refusals name the layer's digest and the entry's path. The caller
//! unpacks into a fresh temp directory and renames it into place only on
//! success ([`super::store`]); the uncompressed stream is hashed on the
//! way and must match the config's diff-id.

use std::collections::BTreeMap;
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::FileType;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::reference::Digest;
use super::safe_fs::{self, shown, Components, Walk};

/// Most path components of one entry.
pub const MAX_DEPTH: usize = 128;
/// Most bytes of one entry's path.
const MAX_PATH: usize = 4096;
/// Most bytes of a tar metadata entry (GNU long name or link, PAX header)
/// the tar reader may hold in memory.
const MAX_META: u64 = 1 << 20;

/// The bounds on one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnpackLimits {
    /// Most bytes of file content (apparent sizes) in the layer.
    pub max_bytes: u64,
    /// Most tar entries in the layer.
    pub max_entries: u64,
}

/// What a layer removes from the layers below it, applied when a tree is
/// assembled: paths (`/`-joined, relative) as bytes, since a name in a
/// tar need not be UTF-8.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerChanges {
    /// `dir/.wh.NAME`: `dir/NAME` of lower layers is gone.
    pub whiteouts: Vec<Vec<u8>>,
    /// `dir/.wh..wh..opq`: what lower layers had in `dir` is gone.
    pub opaque: Vec<Vec<u8>>,
}

/// One unpacked layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerSummary {
    /// sha256 of the uncompressed tar.
    pub diff_id: Digest,
    /// File content, by apparent size.
    pub bytes: u64,
    pub entries: u64,
    pub changes: LayerChanges,
}

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("layer {layer}: entry {path:?} refused: {reason}; the image is unsafe or damaged, use another image")]
    Refused {
        layer: Digest,
        path: String,
        reason: String,
    },
    #[error("layer {layer}: more than {limit} bytes of files (reached at entry {path:?}); raise the image size limit if the image is trusted and that large")]
    TooLarge {
        layer: Digest,
        path: String,
        limit: u64,
    },
    #[error("layer {layer}: more than {limit} entries; raise the entry limit if the image is trusted and that large")]
    TooManyEntries { layer: Digest, limit: u64 },
    #[error("layer {layer}: its uncompressed content hashes to {actual} but the image config says {expected}; the image is corrupt or tampered with, pull it again or use another")]
    DiffIdMismatch {
        layer: Digest,
        expected: Digest,
        actual: Digest,
    },
    #[error("layer {layer} is not a readable tar stream: {detail}; the blob is damaged or not a layer, pull it again")]
    Corrupt { layer: Digest, detail: String },
    #[error("layer {layer}: {path:?}: {source}")]
    Io {
        layer: Digest,
        path: String,
        #[source]
        source: io::Error,
    },
}

/// The error chain of an I/O error as one line (the tar reader wraps the
/// reason in its own error).
fn chain(e: &io::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The components of an entry path, or why it is refused.
fn normalize(raw: &[u8]) -> Result<Components, String> {
    if raw.first() == Some(&b'/') {
        return Err("absolute path".to_string());
    }
    if raw.contains(&0) {
        return Err("NUL in the path".to_string());
    }
    if raw.len() > MAX_PATH {
        return Err(format!("path longer than {MAX_PATH} bytes"));
    }
    let mut out = Vec::new();
    for c in raw.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err("`..` component".to_string()),
            c if c.len() > 255 => return Err("a name longer than 255 bytes".to_string()),
            c => out.push(c.to_vec()),
        }
    }
    if out.len() > MAX_DEPTH {
        return Err(format!("more than {MAX_DEPTH} directories deep"));
    }
    Ok(out)
}

/// Reads a whole stream through sha256 and a byte bound.
struct HashCount<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
    limit: u64,
    over: bool,
}

impl<R: Read> Read for HashCount<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        if self.count > self.limit {
            self.over = true;
            return Err(io::Error::other("the uncompressed layer is over its bound"));
        }
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Watches the tar stream on its way to the tar reader and stops it
/// before a metadata entry (GNU long name or link, local PAX header) over
/// [`MAX_META`]: the reader buffers those whole. It follows the stream
/// block by block as the reader does: a header, its GNU sparse extension
/// blocks, then the data padded to 512, whose length a preceding PAX
/// `size` record overrides.
struct TarGuard<R> {
    inner: R,
    block: [u8; 512],
    filled: usize,
    state: GuardState,
    /// Payload bytes left in the current entry, then its padding.
    payload: u64,
    padding: u64,
    pax: Option<Vec<u8>>,
    pax_size: Option<u64>,
    refused: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum GuardState {
    Header,
    SparseExtension,
    Data,
}

/// The `size` record of a PAX header's data, read exactly as the tar
/// reader reads it (its own record parser, the first `size` record, none
/// after a malformed record): a guard that read it any other way (the
/// last of two records, say) would fall out of step with the reader.
fn pax_size(data: &[u8]) -> Option<u64> {
    for record in tar::PaxExtensions::new(data) {
        let record = record.ok()?;
        if record.key() != Ok("size") {
            continue;
        }
        return record.value().ok()?.parse().ok();
    }
    None
}

impl<R: Read> TarGuard<R> {
    fn new(inner: R) -> TarGuard<R> {
        TarGuard {
            inner,
            block: [0; 512],
            filled: 0,
            state: GuardState::Header,
            payload: 0,
            padding: 0,
            pax: None,
            pax_size: None,
            refused: None,
        }
    }

    fn refuse(&mut self, why: String) -> io::Error {
        let e = io::Error::new(io::ErrorKind::InvalidData, why.clone());
        self.refused = Some(why);
        e
    }

    /// A header block, read with the tar reader's own `Header` so that
    /// the guard and the reader never disagree on a field: its size, its
    /// type, whether it is a GNU or ustar header (only those have their
    /// long names and PAX headers applied), whether a sparse header has
    /// extension blocks.
    fn on_header(&mut self) -> io::Result<()> {
        if self.block.iter().all(|x| *x == 0) {
            return Ok(());
        }
        let header = tar::Header::from_byte_slice(&self.block);
        let kind = header.entry_type();
        let Ok(size) = header.entry_size() else {
            // The tar reader fails on it too, and stops.
            return Ok(());
        };
        let flag = kind.as_byte();
        let extension = matches!(flag, b'x' | b'L' | b'K');
        if extension && size > MAX_META {
            return Err(self.refuse(format!(
                "a tar metadata entry (type {:?}) of {size} bytes, over the {MAX_META}-byte bound",
                flag as char
            )));
        }
        let recognized = header.as_gnu().is_some() || header.as_ustar().is_some();
        // The reader applies a pending PAX `size` to the next header that
        // is none of these four (global headers included), by type alone.
        let pax_sized = !matches!(flag, b'x' | b'L' | b'K' | b'g');
        let data = if pax_sized {
            self.pax_size.unwrap_or(size)
        } else {
            size
        };
        // A recognized long name or link keeps the PAX header pending
        // for the entry after it; any other header is the entry it
        // describes (an unrecognized `x`, `L` or `K` included).
        if !(recognized && matches!(flag, b'L' | b'K')) {
            self.pax_size = None;
        }
        self.pax = (flag == b'x' && recognized).then(Vec::new);
        self.payload = data;
        self.padding = (512 - data % 512) % 512;
        let extended = kind.is_gnu_sparse() && header.as_gnu().is_some_and(|g| g.is_extended());
        self.state = if extended {
            GuardState::SparseExtension
        } else {
            GuardState::Data
        };
        self.end_of_data_check();
        Ok(())
    }

    fn end_of_data_check(&mut self) {
        if self.state == GuardState::Data && self.payload == 0 && self.padding == 0 {
            if let Some(pax) = self.pax.take() {
                self.pax_size = pax_size(&pax);
            }
            self.state = GuardState::Header;
        }
    }

    fn observe(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            match self.state {
                GuardState::Header | GuardState::SparseExtension => {
                    let take = (512 - self.filled).min(bytes.len());
                    self.block[self.filled..self.filled + take].copy_from_slice(&bytes[..take]);
                    self.filled += take;
                    bytes = &bytes[take..];
                    if self.filled == 512 {
                        self.filled = 0;
                        if self.state == GuardState::Header {
                            self.on_header()?;
                        } else if self.block[504] != 1 {
                            // `isextended`, read as the tar reader does.
                            self.state = GuardState::Data;
                            self.end_of_data_check();
                        }
                    }
                }
                GuardState::Data => {
                    if self.payload > 0 {
                        let take = (self.payload.min(bytes.len() as u64)) as usize;
                        if let Some(pax) = &mut self.pax {
                            pax.extend_from_slice(&bytes[..take]);
                        }
                        self.payload -= take as u64;
                        bytes = &bytes[take..];
                    } else {
                        let take = (self.padding.min(bytes.len() as u64)) as usize;
                        self.padding -= take as u64;
                        bytes = &bytes[take..];
                    }
                    self.end_of_data_check();
                }
            }
        }
        Ok(())
    }
}

impl<R: Read> Read for TarGuard<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(why) = &self.refused {
            return Err(io::Error::new(io::ErrorKind::InvalidData, why.clone()));
        }
        let n = self.inner.read(buf)?;
        self.observe(&buf[..n])?;
        Ok(n)
    }
}

/// A reader that first gives back bytes already read from `inner`.
struct Rewind<R> {
    pending: Vec<u8>,
    at: usize,
    inner: R,
}

impl<R: Read> Read for Rewind<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at < self.pending.len() {
            let n = (self.pending.len() - self.at).min(buf.len());
            buf[..n].copy_from_slice(&self.pending[self.at..self.at + n]);
            self.at += n;
            return Ok(n);
        }
        self.inner.read(buf)
    }
}

impl<R: Read> Rewind<R> {
    /// Up to `n` bytes, fewer only at the end of the stream.
    fn peek(&mut self, n: usize) -> io::Result<Vec<u8>> {
        let mut head = vec![0u8; n];
        let mut got = 0;
        while got < n {
            match self.read(&mut head[got..]) {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        head.truncate(got);
        self.pending = head.clone();
        self.at = 0;
        Ok(head)
    }
}

/// zstd, all frames of it: a layer may hold several, and skippable
/// frames (zstd:chunked's metadata) between them.
struct ZstdFrames<R: Read> {
    decoder: Option<ruzstd::decoding::StreamingDecoder<Rewind<R>, ruzstd::decoding::FrameDecoder>>,
    source: Option<Rewind<R>>,
}

impl<R: Read> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some(decoder) = &mut self.decoder {
                let n = decoder.read(buf)?;
                if n > 0 || buf.is_empty() {
                    return Ok(n);
                }
                let decoder = self.decoder.take().expect("checked above");
                self.source = Some(decoder.into_inner());
            }
            let mut source = self.source.take().expect("a source when no decoder");
            let magic = source.peek(4)?;
            if magic.is_empty() {
                self.source = Some(source);
                return Ok(0);
            }
            if magic.len() == 4 && magic[0] & 0xf0 == 0x50 && magic[1..] == [0x2a, 0x4d, 0x18] {
                let mut header = [0u8; 8];
                source.read_exact(&mut header)?;
                let len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
                let skipped = io::copy(&mut (&mut source).take(u64::from(len)), &mut io::sink())?;
                if skipped != u64::from(len) {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "truncated zstd skippable frame",
                    ));
                }
                self.source = Some(source);
                continue;
            }
            self.decoder = Some(
                ruzstd::decoding::StreamingDecoder::new(source)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?,
            );
        }
    }
}

/// The uncompressed stream of a layer blob, by its magic bytes.
fn decompressed<'a>(blob: impl Read + 'a) -> io::Result<Box<dyn Read + 'a>> {
    let mut source = Rewind {
        pending: Vec::new(),
        at: 0,
        inner: BufReader::with_capacity(256 * 1024, blob),
    };
    let magic = source.peek(4)?;
    Ok(if magic.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::MultiGzDecoder::new(BufReader::new(source)))
    } else if magic == [0x28, 0xb5, 0x2f, 0xfd] {
        Box::new(ZstdFrames {
            decoder: None,
            source: Some(source),
        })
    } else {
        Box::new(source)
    })
}

/// Unpacks the layer `blob` (digest `layer`, for messages) into
/// `dest/root` (`dest` must exist and be empty; `root` is made here).
/// `expected_diff_id` is the config's diff-id for it; `None` only where
/// the digest of the blob is itself the diff-id (an uncompressed layer).
pub fn unpack_layer(
    layer: &Digest,
    blob: impl Read,
    expected_diff_id: Option<&Digest>,
    dest: &Path,
    limits: &UnpackLimits,
) -> Result<LayerSummary, UnpackError> {
    let io_err = |path: &str, source: io::Error| UnpackError::Io {
        layer: layer.clone(),
        path: path.to_string(),
        source,
    };
    let root_path = dest.join("root");
    std::fs::create_dir(&root_path).map_err(|e| io_err("", e))?;
    let root = safe_fs::open_dir_path(&root_path).map_err(|e| io_err("", e))?;
    let stream = decompressed(blob).map_err(|e| UnpackError::Corrupt {
        layer: layer.clone(),
        detail: chain(&e),
    })?;
    // The tar stream holds file content (bounded), a header or three per
    // entry (bounded by the entry count), metadata (bounded per entry)
    // and padding: more than this is not a layer of those bounds.
    let stream_limit = limits
        .max_bytes
        .saturating_add(limits.max_entries.saturating_mul(4 * 512))
        .saturating_add(64 << 20);
    let mut hashing = HashCount {
        inner: stream,
        hasher: Sha256::new(),
        count: 0,
        limit: stream_limit,
        over: false,
    };
    let mut unpacker = Unpacker {
        layer,
        root,
        limits,
        bytes: 0,
        entries: 0,
        dir_modes: BTreeMap::new(),
        changes: LayerChanges::default(),
    };
    let result = {
        let mut guard = TarGuard::new(&mut hashing);
        let result = {
            let mut archive = tar::Archive::new(&mut guard);
            unpacker.apply(&mut archive)
        };
        match (result, guard.refused.take()) {
            (Err(UnpackError::Corrupt { .. }), Some(why)) => Err(UnpackError::Refused {
                layer: layer.clone(),
                path: "(tar metadata)".to_string(),
                reason: why,
            }),
            (r, _) => r,
        }
    };
    let result = result.and_then(|()| {
        // The rest of the stream (the end blocks, any trailing bytes)
        // counts toward the diff-id too.
        io::copy(&mut hashing, &mut io::sink())
            .map(|_| ())
            .map_err(|e| UnpackError::Corrupt {
                layer: layer.clone(),
                detail: chain(&e),
            })
    });
    if let Err(e) = result {
        if hashing.over {
            return Err(UnpackError::TooLarge {
                layer: layer.clone(),
                path: "(the uncompressed stream)".to_string(),
                limit: stream_limit,
            });
        }
        return Err(e);
    }
    let actual = Digest::from_sha256(std::mem::take(&mut hashing.hasher).finalize().into());
    if let Some(expected) = expected_diff_id {
        if *expected != actual {
            return Err(UnpackError::DiffIdMismatch {
                layer: layer.clone(),
                expected: expected.clone(),
                actual,
            });
        }
    }
    unpacker.finish()?;
    safe_fs::chmod_fd(unpacker.root.as_fd(), 0o755).map_err(|e| io_err("", e))?;
    Ok(LayerSummary {
        diff_id: actual,
        bytes: unpacker.bytes,
        entries: unpacker.entries,
        changes: unpacker.changes,
    })
}

struct Unpacker<'a> {
    layer: &'a Digest,
    root: OwnedFd,
    limits: &'a UnpackLimits,
    bytes: u64,
    entries: u64,
    /// Each directory's final mode, set when all is written (a `0555`
    /// directory must stay writable until then).
    dir_modes: BTreeMap<Components, u32>,
    changes: LayerChanges,
}

/// Only the permission bits a job may be given: no setuid, setgid or
/// sticky bit, no group or world write.
pub(super) fn safe_mode(mode: u32) -> u32 {
    mode & 0o755
}

impl Unpacker<'_> {
    fn refused(&self, path: &str, reason: impl Into<String>) -> UnpackError {
        UnpackError::Refused {
            layer: self.layer.clone(),
            path: path.to_string(),
            reason: reason.into(),
        }
    }

    fn io(&self, path: &str, source: io::Error) -> UnpackError {
        UnpackError::Io {
            layer: self.layer.clone(),
            path: path.to_string(),
            source,
        }
    }

    fn corrupt(&self, e: &io::Error) -> UnpackError {
        UnpackError::Corrupt {
            layer: self.layer.clone(),
            detail: chain(e),
        }
    }

    fn apply<R: Read>(&mut self, archive: &mut tar::Archive<R>) -> Result<(), UnpackError> {
        for entry in archive.entries().map_err(|e| self.corrupt(&e))? {
            let mut entry = entry.map_err(|e| self.corrupt(&e))?;
            self.entries += 1;
            if self.entries > self.limits.max_entries {
                return Err(UnpackError::TooManyEntries {
                    layer: self.layer.clone(),
                    limit: self.limits.max_entries,
                });
            }
            self.entry(&mut entry)?;
        }
        Ok(())
    }

    /// Opens the parent of `components`, making missing directories when
    /// `create`; a symlink or file on the way is a refusal.
    fn parent(
        &mut self,
        path: &str,
        components: &[Vec<u8>],
        create: bool,
    ) -> Result<Option<OwnedFd>, UnpackError> {
        let mut made = Vec::new();
        let walked = safe_fs::walk(self.root.as_fd(), components, create, &mut |at| {
            made.push(at)
        })
        .map_err(|e| self.io(path, e))?;
        for at in made {
            self.dir_modes
                .entry(components[..=at].to_vec())
                .or_insert(0o755);
        }
        match walked {
            Walk::Dir(fd) => Ok(Some(fd)),
            Walk::Missing => Ok(None),
            Walk::Symlink(at) => Err(self.refused(
                path,
                format!(
                    "its parent path goes through the symlink {:?} (a layer may not write through a link)",
                    shown(&components[..=at])
                ),
            )),
            Walk::NotDir(at) => Err(self.refused(
                path,
                format!("its parent {:?} is not a directory", shown(&components[..=at])),
            )),
        }
    }

    /// Makes room for a new entry `name`: an existing directory stays when
    /// the new entry is one too (tar's rule), anything else goes.
    fn replace(
        &self,
        path: &str,
        dir: &OwnedFd,
        name: &[u8],
        new_is_dir: bool,
    ) -> Result<bool, UnpackError> {
        match safe_fs::kind_at(dir.as_fd(), name).map_err(|e| self.io(path, e))? {
            None => Ok(false),
            Some((FileType::Directory, _, _)) if new_is_dir => Ok(true),
            Some(_) => {
                safe_fs::remove_all_at(dir.as_fd(), name).map_err(|e| self.io(path, e))?;
                Ok(false)
            }
        }
    }

    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), UnpackError> {
        let raw = entry.path_bytes().into_owned();
        let path = String::from_utf8_lossy(&raw).into_owned();
        let components = normalize(&raw).map_err(|why| self.refused(&path, why))?;
        let kind = entry.header().entry_type();
        let mode = entry.header().mode().map_err(|e| self.corrupt(&e))?;

        if let Some(last) = components.last() {
            if let Some(rest) = last.strip_prefix(b".wh.") {
                let parent = &components[..components.len() - 1];
                if rest == b".wh..opq" {
                    self.changes.opaque.push(parent.join(&b'/'));
                } else if rest.starts_with(b".wh.") {
                    // Other aufs bookkeeping (.wh..wh.plnk, ...): not files.
                } else if rest.is_empty() || rest == b"." || rest == b".." {
                    return Err(self.refused(&path, "a whiteout that names nothing, `.` or `..`"));
                } else {
                    let mut target = parent.to_vec();
                    target.push(rest.to_vec());
                    self.changes.whiteouts.push(target.join(&b'/'));
                }
                return Ok(());
            }
        }
        // Old tars mark a directory by a trailing `/` on a regular entry.
        let is_dir = kind.is_dir() || (kind.is_file() && raw.ends_with(b"/"));
        let Some((name, parent_components)) = components.split_last() else {
            if is_dir {
                // `./` itself: the root's mode is ours.
                return Ok(());
            }
            return Err(self.refused(&path, "a non-directory entry for the root itself"));
        };
        if kind.is_character_special() || kind.is_block_special() || kind.is_fifo() {
            return Err(self.refused(
                &path,
                "device nodes and FIFOs are refused (a job gets its own /dev)",
            ));
        }
        if kind.is_pax_global_extensions() {
            return Ok(());
        }
        let known = is_dir
            || kind.is_file()
            || kind.is_contiguous()
            || kind.is_gnu_sparse()
            || kind.is_symlink()
            || kind.is_hard_link();
        if !known {
            return Err(self.refused(
                &path,
                format!("unsupported tar entry type {:?}", kind.as_byte() as char),
            ));
        }
        let parent = self
            .parent(&path, parent_components, true)?
            .expect("made when missing");
        if is_dir {
            if !self.replace(&path, &parent, name, true)? {
                safe_fs::mkdir_at(parent.as_fd(), name, 0o700).map_err(|e| self.io(&path, e))?;
            }
            self.dir_modes.insert(components.clone(), safe_mode(mode));
            return Ok(());
        }
        if kind.is_symlink() {
            let target = entry
                .link_name_bytes()
                .map(|t| t.into_owned())
                .unwrap_or_default();
            if target.is_empty() || target.contains(&0) {
                return Err(self.refused(&path, "a symlink with an empty target or a NUL in it"));
            }
            self.replace(&path, &parent, name, false)?;
            return safe_fs::symlink_at(&target, parent.as_fd(), name)
                .map_err(|e| self.io(&path, e));
        }
        if kind.is_hard_link() {
            return self.hard_link(&path, entry, &components, &parent, name);
        }
        // A regular file (plain, contiguous or GNU sparse).
        let size = entry.size();
        if self.bytes.saturating_add(size) > self.limits.max_bytes {
            return Err(UnpackError::TooLarge {
                layer: self.layer.clone(),
                path,
                limit: self.limits.max_bytes,
            });
        }
        self.bytes += size;
        self.replace(&path, &parent, name, false)?;
        let mut file =
            safe_fs::create_file_at(parent.as_fd(), name).map_err(|e| self.io(&path, e))?;
        copy_sparse(entry, &mut file, size).map_err(|e| self.corrupt(&e))?;
        safe_fs::chmod_fd(file.as_fd(), safe_mode(mode)).map_err(|e| self.io(&path, e))?;
        if let Ok(mtime) = entry.header().mtime() {
            safe_fs::set_mtime(file.as_fd(), mtime).map_err(|e| self.io(&path, e))?;
        }
        Ok(())
    }

    fn hard_link<R: Read>(
        &mut self,
        path: &str,
        entry: &tar::Entry<'_, R>,
        components: &[Vec<u8>],
        parent: &OwnedFd,
        name: &[u8],
    ) -> Result<(), UnpackError> {
        let raw = entry
            .link_name_bytes()
            .map(|t| t.into_owned())
            .unwrap_or_default();
        let shown_target = String::from_utf8_lossy(&raw).into_owned();
        let target = normalize(&raw).map_err(|why| {
            self.refused(path, format!("hard link target {shown_target:?}: {why}"))
        })?;
        let Some((target_name, target_parent)) = target.split_last() else {
            return Err(self.refused(path, "a hard link to the root"));
        };
        if target == components {
            return Err(self.refused(path, "a hard link to itself"));
        }
        let not_earlier =
            || format!("hard link target {shown_target:?} is not an earlier file of this layer");
        let Some(dir) = self.parent(path, target_parent, false)? else {
            return Err(self.refused(path, not_earlier()));
        };
        match safe_fs::kind_at(dir.as_fd(), target_name).map_err(|e| self.io(path, e))? {
            Some((FileType::RegularFile, _, _)) => {}
            None => return Err(self.refused(path, not_earlier())),
            Some((FileType::Symlink, _, _)) => {
                return Err(self.refused(
                    path,
                    format!("hard link target {shown_target:?} is a symlink"),
                ))
            }
            Some(_) => {
                return Err(self.refused(
                    path,
                    format!("hard link target {shown_target:?} is not a regular file"),
                ))
            }
        }
        self.replace(path, parent, name, false)?;
        safe_fs::link_at(dir.as_fd(), target_name, parent.as_fd(), name)
            .map_err(|e| self.io(path, e))
    }

    /// Sets the directories' final modes, deepest first.
    fn finish(&mut self) -> Result<(), UnpackError> {
        let mut dirs: Vec<(&Components, &u32)> = self.dir_modes.iter().collect();
        dirs.sort_by_key(|(c, _)| std::cmp::Reverse(c.len()));
        for (components, mode) in dirs {
            let walked = safe_fs::walk(self.root.as_fd(), components, false, &mut |_| {})
                .map_err(|e| self.io(&shown(components), e))?;
            // A directory later replaced by a file or link is not one now.
            if let Walk::Dir(fd) = walked {
                safe_fs::chmod_fd(fd.as_fd(), *mode).map_err(|e| self.io(&shown(components), e))?;
            }
        }
        Ok(())
    }
}

/// Copies `size` bytes, seeking over all-zero blocks so a sparse file
/// stays sparse on disk (it was counted by its apparent size).
fn copy_sparse(from: &mut impl Read, to: &mut std::fs::File, size: u64) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut done: u64 = 0;
    let mut hole = false;
    while done < size {
        let want = ((size - done).min(buf.len() as u64)) as usize;
        let n = from.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the archive ends inside a file",
            ));
        }
        if buf[..n].iter().all(|b| *b == 0) {
            to.seek(SeekFrom::Current(n as i64))?;
            hole = true;
        } else {
            to.write_all(&buf[..n])?;
            hole = false;
        }
        done += n as u64;
    }
    if hole {
        to.set_len(size)?;
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use tar::{EntryType, Header};

    /// One raw tar entry: written header field by header field, so a
    /// hostile path or link (which `tar::Builder` would refuse) goes in
    /// as is.
    pub struct Raw {
        pub path: Vec<u8>,
        pub kind: EntryType,
        pub mode: u32,
        pub data: Vec<u8>,
        pub link: Vec<u8>,
    }

    pub fn file(path: &str, data: &[u8], mode: u32) -> Raw {
        Raw {
            path: path.into(),
            kind: EntryType::Regular,
            mode,
            data: data.to_vec(),
            link: vec![],
        }
    }

    pub fn dir(path: &str, mode: u32) -> Raw {
        Raw {
            path: path.into(),
            kind: EntryType::Directory,
            mode,
            data: vec![],
            link: vec![],
        }
    }

    pub fn symlink(path: &str, target: &str) -> Raw {
        Raw {
            path: path.into(),
            kind: EntryType::Symlink,
            mode: 0o777,
            data: vec![],
            link: target.into(),
        }
    }

    pub fn hard(path: &str, target: &str) -> Raw {
        Raw {
            path: path.into(),
            kind: EntryType::Link,
            mode: 0o644,
            data: vec![],
            link: target.into(),
        }
    }

    fn special(path: &str, kind: EntryType) -> Raw {
        Raw {
            path: path.into(),
            kind,
            mode: 0o666,
            data: vec![],
            link: vec![],
        }
    }

    /// A PAX header entry with the given records.
    fn pax(records: &[(&str, &[u8])]) -> Raw {
        let mut data = Vec::new();
        for (key, value) in records {
            let body = [b" ", key.as_bytes(), b"=", value, b"\n"].concat();
            let mut len = body.len() + 1;
            while len.to_string().len() + body.len() != len {
                len += 1;
            }
            data.extend_from_slice(len.to_string().as_bytes());
            data.extend_from_slice(&body);
        }
        Raw {
            path: b"././@PaxHeader".to_vec(),
            kind: EntryType::XHeader,
            mode: 0o644,
            data,
            link: vec![],
        }
    }

    pub fn raw_tar(entries: &[Raw]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for e in entries {
            let mut h = Header::new_gnu();
            {
                let g = h.as_gnu_mut().unwrap();
                g.name[..e.path.len()].copy_from_slice(&e.path);
                g.linkname[..e.link.len()].copy_from_slice(&e.link);
            }
            h.set_entry_type(e.kind);
            h.set_mode(e.mode);
            h.set_size(e.data.len() as u64);
            h.set_mtime(1_700_000_000);
            h.set_cksum();
            b.append(&h, &e.data[..]).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// A GNU sparse file of `apparent` bytes whose last 512 are data.
    fn sparse_tar(path: &str, apparent: u64) -> Vec<u8> {
        let mut h = Header::new_gnu();
        {
            let g = h.as_gnu_mut().unwrap();
            g.name[..path.len()].copy_from_slice(path.as_bytes());
            let octal = |field: &mut [u8; 12], v: u64| {
                field.copy_from_slice(format!("{v:011o}\0").as_bytes());
            };
            octal(&mut g.sparse[0].offset, apparent - 512);
            octal(&mut g.sparse[0].numbytes, 512);
            octal(&mut g.realsize, apparent);
        }
        h.set_entry_type(EntryType::GNUSparse);
        h.set_mode(0o644);
        h.set_size(512);
        h.set_cksum();
        let mut b = tar::Builder::new(Vec::new());
        b.append(&h, &[b'x'; 512][..]).unwrap();
        b.into_inner().unwrap()
    }

    /// The permission bits of `path` itself (a symlink not followed).
    pub fn mode_of(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    }

    pub fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    pub const LIMITS: UnpackLimits = UnpackLimits {
        max_bytes: 1 << 30,
        max_entries: 10_000,
    };

    /// A sandbox: `work/` receives the layer, `outside/` must stay empty.
    struct Sandbox {
        dir: tempfile::TempDir,
    }

    impl Sandbox {
        fn new() -> Sandbox {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir(dir.path().join("work")).unwrap();
            std::fs::create_dir(dir.path().join("outside")).unwrap();
            Sandbox { dir }
        }

        fn outside(&self) -> PathBuf {
            self.dir.path().join("outside")
        }

        fn root(&self) -> PathBuf {
            self.dir.path().join("work/root")
        }

        fn unpack(&self, tar: &[u8]) -> Result<LayerSummary, UnpackError> {
            self.unpack_with(tar, &LIMITS)
        }

        fn unpack_with(
            &self,
            tar: &[u8],
            limits: &UnpackLimits,
        ) -> Result<LayerSummary, UnpackError> {
            unpack_layer(
                &Digest::of(tar),
                tar,
                None,
                &self.dir.path().join("work"),
                limits,
            )
        }

        /// Every name under the sandbox but `work/`.
        fn outside_names(&self) -> Vec<String> {
            let mut out = Vec::new();
            for e in std::fs::read_dir(self.dir.path()).unwrap() {
                let name = e.unwrap().file_name().to_string_lossy().into_owned();
                if name != "work" && name != "outside" {
                    out.push(name);
                }
            }
            for e in std::fs::read_dir(self.outside()).unwrap() {
                out.push(format!(
                    "outside/{}",
                    e.unwrap().file_name().to_string_lossy()
                ));
            }
            out
        }
    }

    use std::path::PathBuf;

    /// The refusal's path and reason, or a panic.
    fn refused(r: Result<LayerSummary, UnpackError>) -> (String, String) {
        match r {
            Err(UnpackError::Refused { path, reason, .. }) => (path, reason),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn dot_dot_and_absolute_paths_are_refused() {
        let s = Sandbox::new();
        let tar = raw_tar(&[file("ok", b"1", 0o644), file("../escape", b"x", 0o644)]);
        let err = s.unpack(&tar).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&Digest::of(&tar).to_string()) && text.contains("\"../escape\""),
            "{text}"
        );
        assert!(text.contains("`..`"), "{text}");

        let s2 = Sandbox::new();
        let tar = raw_tar(&[file("a/b/../../../escape", b"x", 0o644)]);
        assert!(refused(s2.unpack(&tar)).1.contains("`..`"));

        let s3 = Sandbox::new();
        let abs = format!("{}/abs", s3.outside().display());
        let (path, reason) = refused(s3.unpack(&raw_tar(&[file(&abs, b"x", 0o644)])));
        assert_eq!(
            (path.as_str(), reason.as_str()),
            (abs.as_str(), "absolute path")
        );
        for s in [&s, &s2, &s3] {
            assert_eq!(s.outside_names(), Vec::<String>::new());
        }
    }

    #[test]
    fn writing_through_a_symlink_is_refused() {
        let s = Sandbox::new();
        let outside = s.outside().display().to_string();
        let tar = raw_tar(&[
            symlink("etc", &outside),
            file("etc/passwd", b"root::0:0::/:/bin/sh\n", 0o644),
        ]);
        let (path, reason) = refused(s.unpack(&tar));
        assert_eq!(path, "etc/passwd");
        assert!(reason.contains("symlink \"etc\""), "{reason}");
        assert_eq!(s.outside_names(), Vec::<String>::new());

        // `etc -> /`: the same refusal, and nothing appears at /.
        let s = Sandbox::new();
        let name = format!("ptrain-unpack-test-{}", std::process::id());
        let tar = raw_tar(&[
            symlink("etc", "/"),
            file(&format!("etc/{name}"), b"x", 0o644),
        ]);
        refused(s.unpack(&tar));
        assert!(!Path::new("/").join(&name).exists());

        // A symlinked directory inside the layer, then a file under it.
        let s = Sandbox::new();
        let tar = raw_tar(&[
            dir("real", 0o755),
            symlink("link", "real"),
            file("link/x", b"x", 0o644),
        ]);
        let (path, _) = refused(s.unpack(&tar));
        assert_eq!(path, "link/x");
        // A directory entry through the link, and a deeper path.
        let s = Sandbox::new();
        let tar = raw_tar(&[symlink("l", "/tmp"), dir("l/sub", 0o755)]);
        refused(s.unpack(&tar));
        let s = Sandbox::new();
        let tar = raw_tar(&[
            dir("a", 0o755),
            symlink("a/l", "../.."),
            file("a/l/b/c", b"x", 0o644),
        ]);
        assert_eq!(refused(s.unpack(&tar)).0, "a/l/b/c");
        assert_eq!(s.outside_names(), Vec::<String>::new());
        // A file in the middle of a path.
        let s = Sandbox::new();
        let tar = raw_tar(&[file("f", b"x", 0o644), file("f/g", b"y", 0o644)]);
        assert!(refused(s.unpack(&tar)).1.contains("not a directory"));
    }

    #[test]
    fn symlinks_are_stored_as_they_are() {
        let s = Sandbox::new();
        let tar = raw_tar(&[
            symlink("abs", "/etc/shadow"),
            symlink("up", "../../../../etc"),
            dir("usr/lib", 0o755),
            symlink("lib", "usr/lib"),
        ]);
        s.unpack(&tar).unwrap();
        assert_eq!(
            std::fs::read_link(s.root().join("abs")).unwrap(),
            Path::new("/etc/shadow")
        );
        assert_eq!(
            std::fs::read_link(s.root().join("up")).unwrap(),
            Path::new("../../../../etc")
        );
        assert_eq!(
            std::fs::read_link(s.root().join("lib")).unwrap(),
            Path::new("usr/lib")
        );
    }

    #[test]
    fn hard_links_stay_inside_the_layer_and_off_symlinks() {
        let s = Sandbox::new();
        std::fs::write(s.outside().join("secret"), b"s").unwrap();
        let tar = raw_tar(&[file("a", b"x", 0o644), hard("h", "../outside/secret")]);
        assert!(refused(s.unpack(&tar)).1.contains("`..`"));
        let secret = format!("{}/secret", s.outside().display());
        let s2 = Sandbox::new();
        let tar = raw_tar(&[hard("h", &secret)]);
        assert!(refused(s2.unpack(&tar)).1.contains("absolute"));
        // To a symlink that points out: refused, not followed.
        let s3 = Sandbox::new();
        let tar = raw_tar(&[symlink("s", &secret), hard("h", "s")]);
        assert!(refused(s3.unpack(&tar)).1.contains("is a symlink"));
        // Through a symlinked directory.
        let s4 = Sandbox::new();
        let outside = s4.outside().display().to_string();
        std::fs::write(s4.outside().join("f"), b"s").unwrap();
        let tar = raw_tar(&[symlink("d", &outside), hard("h", "d/f")]);
        assert!(refused(s4.unpack(&tar)).1.contains("symlink"));
        // To nothing earlier, and to a directory.
        let s5 = Sandbox::new();
        assert!(
            refused(s5.unpack(&raw_tar(&[hard("h", "later"), file("later", b"", 0o644)])))
                .1
                .contains("not an earlier file")
        );
        let s6 = Sandbox::new();
        assert!(
            refused(s6.unpack(&raw_tar(&[dir("d", 0o755), hard("h", "d")])))
                .1
                .contains("not a regular file")
        );
        for s in [&s, &s2, &s3, &s4, &s5, &s6] {
            assert!(!s.root().join("h").exists());
        }
        assert_eq!(std::fs::read(s.outside().join("secret")).unwrap(), b"s");
        assert_eq!(
            std::fs::metadata(s.outside().join("secret"))
                .unwrap()
                .nlink(),
            1
        );

        // A good one: the same inode.
        let s = Sandbox::new();
        s.unpack(&raw_tar(&[
            file("bin/a", b"x", 0o755),
            hard("bin/b", "bin/a"),
        ]))
        .unwrap();
        let (a, b) = (
            std::fs::metadata(s.root().join("bin/a")).unwrap(),
            std::fs::metadata(s.root().join("bin/b")).unwrap(),
        );
        assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
    }

    #[test]
    fn devices_and_fifos_are_refused() {
        for kind in [EntryType::Char, EntryType::Block, EntryType::Fifo] {
            let s = Sandbox::new();
            let (path, reason) = refused(s.unpack(&raw_tar(&[special("dev/x", kind)])));
            assert_eq!(path, "dev/x");
            assert!(reason.contains("device nodes and FIFOs"), "{reason}");
            assert!(!s.root().join("dev/x").exists());
        }
    }

    #[test]
    fn privileges_and_write_bits_are_stripped() {
        let s = Sandbox::new();
        let tar = raw_tar(&[
            file("bin/su", b"\x7fELF", 0o4755),
            file("bin/wall", b"\x7fELF", 0o2755),
            file("etc/shared", b"x", 0o666),
            file("etc/shadow", b"x", 0o600),
            dir("tmp", 0o1777),
            dir("ro", 0o555),
            file("ro/f", b"x", 0o444),
        ]);
        let summary = s.unpack(&tar).unwrap();
        let mode = |p: &str| mode_of(&s.root().join(p));
        assert_eq!(mode("bin/su"), 0o755);
        assert_eq!(mode("bin/wall"), 0o755);
        assert_eq!(mode("etc/shared"), 0o644);
        assert_eq!(mode("etc/shadow"), 0o600);
        assert_eq!(mode("tmp"), 0o755);
        assert_eq!(mode("ro"), 0o555);
        assert_eq!(mode("ro/f"), 0o444);
        // Implicit parents get 0755, as does the root.
        assert_eq!(mode("bin"), 0o755);
        assert_eq!(mode(""), 0o755);
        assert_eq!(summary.bytes, 4 + 4 + 1 + 1 + 1);
        let mtime = std::fs::metadata(s.root().join("bin/su")).unwrap().mtime();
        assert_eq!(mtime, 1_700_000_000);
    }

    #[test]
    fn sizes_are_counted_by_apparent_size_against_the_limit() {
        let small = UnpackLimits {
            max_bytes: 1 << 20,
            max_entries: 100,
        };
        // 5 GiB sparse, 512 bytes stored: refused before any write.
        let s = Sandbox::new();
        let err = s
            .unpack_with(&sparse_tar("var/log/lastlog", 5 << 30), &small)
            .unwrap_err();
        assert!(
            matches!(&err, UnpackError::TooLarge { path, limit: 1048576, .. } if path == "var/log/lastlog"),
            "{err}"
        );
        assert!(!s.root().join("var/log/lastlog").exists());
        // A big plain file, and many small ones adding up.
        let s = Sandbox::new();
        let big = vec![1u8; (1 << 20) + 1];
        assert!(matches!(
            s.unpack_with(&raw_tar(&[file("big", &big, 0o644)]), &small),
            Err(UnpackError::TooLarge { .. })
        ));
        assert!(!s.root().join("big").exists());
        let s = Sandbox::new();
        let half = vec![1u8; 600 << 10];
        let err = s
            .unpack_with(
                &raw_tar(&[file("a", &half, 0o644), file("b", &half, 0o644)]),
                &small,
            )
            .unwrap_err();
        assert!(
            matches!(&err, UnpackError::TooLarge { path, .. } if path == "b"),
            "{err}"
        );
        // Too many entries.
        let s = Sandbox::new();
        let many: Vec<Raw> = (0..101)
            .map(|i| file(&format!("f{i}"), b"", 0o644))
            .collect();
        assert!(matches!(
            s.unpack_with(&raw_tar(&many), &small),
            Err(UnpackError::TooManyEntries { limit: 100, .. })
        ));

        // Under the limit: the sparse file has its apparent size and stays
        // sparse on disk.
        let s = Sandbox::new();
        let summary = s
            .unpack_with(
                &sparse_tar("sparse", 8 << 20),
                &UnpackLimits {
                    max_bytes: 16 << 20,
                    max_entries: 10,
                },
            )
            .unwrap();
        assert_eq!(summary.bytes, 8 << 20);
        let meta = std::fs::metadata(s.root().join("sparse")).unwrap();
        assert_eq!(meta.len(), 8 << 20);
        assert!(meta.blocks() * 512 < 1 << 20, "{} blocks", meta.blocks());
        let content = std::fs::read(s.root().join("sparse")).unwrap();
        assert!(content[..(8 << 20) - 512].iter().all(|b| *b == 0));
        assert!(content[(8 << 20) - 512..].iter().all(|b| *b == b'x'));
    }

    #[test]
    fn whiteouts_are_recorded_not_written() {
        let s = Sandbox::new();
        let tar = raw_tar(&[
            dir("etc", 0o755),
            file("etc/.wh.passwd", b"", 0o644),
            file("opt/x/.wh..wh..opq", b"", 0o644),
            file("opt/x/new", b"n", 0o644),
            file(".wh..wh.plnk", b"", 0o644),
            special("dev/.wh.null", EntryType::Char),
        ]);
        let summary = s.unpack(&tar).unwrap();
        assert_eq!(
            summary.changes.whiteouts,
            vec![b"etc/passwd".to_vec(), b"dev/null".to_vec()]
        );
        assert_eq!(summary.changes.opaque, vec![b"opt/x".to_vec()]);
        assert!(!s.root().join("etc/.wh.passwd").exists());
        assert!(!s.root().join("opt/x/.wh..wh..opq").exists());
        assert!(s.root().join("opt/x/new").exists());
        let s = Sandbox::new();
        assert!(refused(s.unpack(&raw_tar(&[file("a/.wh.", b"", 0o644)])))
            .1
            .contains("names nothing"));
        for bad in ["a/.wh...", "a/.wh..", ".wh.."] {
            let s = Sandbox::new();
            let (path, reason) = refused(s.unpack(&raw_tar(&[file(bad, b"", 0o644)])));
            assert_eq!(path, bad);
            assert!(reason.contains("`..`"), "{reason}");
        }
    }

    #[test]
    fn the_diff_id_is_checked_and_compression_is_detected() {
        let tar = raw_tar(&[file("a", b"hello", 0o644)]);
        let diff_id = Digest::of(&tar);
        for blob in [
            tar.clone(),
            gzip(&tar),
            ruzstd::encoding::compress_to_vec(
                &tar[..],
                ruzstd::encoding::CompressionLevel::Fastest,
            ),
        ] {
            let s = Sandbox::new();
            let summary = unpack_layer(
                &Digest::of(&blob),
                &blob[..],
                Some(&diff_id),
                &s.dir.path().join("work"),
                &LIMITS,
            )
            .unwrap();
            assert_eq!(summary.diff_id, diff_id);
            assert_eq!(std::fs::read(s.root().join("a")).unwrap(), b"hello");
        }
        let s = Sandbox::new();
        let wrong = Digest::of(b"other");
        let err = unpack_layer(
            &Digest::of(b"blob"),
            &tar[..],
            Some(&wrong),
            &s.dir.path().join("work"),
            &LIMITS,
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&wrong.to_string()) && text.contains(&diff_id.to_string()),
            "{text}"
        );
        // Two zstd frames with a skippable frame between them.
        let (first, second) = tar.split_at(700);
        let mut two =
            ruzstd::encoding::compress_to_vec(first, ruzstd::encoding::CompressionLevel::Fastest);
        two.extend_from_slice(&[0x50, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 9, 9, 9]);
        two.extend(ruzstd::encoding::compress_to_vec(
            second,
            ruzstd::encoding::CompressionLevel::Fastest,
        ));
        let s = Sandbox::new();
        unpack_layer(
            &Digest::of(&two),
            &two[..],
            Some(&diff_id),
            &s.dir.path().join("work"),
            &LIMITS,
        )
        .unwrap();
        // Garbage is corrupt, not a panic.
        let s = Sandbox::new();
        let junk = vec![0x1f, 0x8b, 1, 2, 3];
        assert!(matches!(s.unpack(&junk), Err(UnpackError::Corrupt { .. })));
    }

    #[test]
    fn long_names_pax_and_huge_metadata() {
        // A long path (GNU long name) and a PAX path, both in step with
        // the guard.
        let long = format!("{}/file", "d".repeat(200));
        let mut b = tar::Builder::new(Vec::new());
        let mut h = Header::new_gnu();
        h.set_size(3);
        h.set_mode(0o644);
        h.set_entry_type(EntryType::Regular);
        b.append_data(&mut h, &long, &b"abc"[..]).unwrap();
        let mut tar = b.into_inner().unwrap();
        tar.truncate(tar.len() - 1024);
        let pax_path = format!("{}/pax", "p".repeat(150));
        tar.extend(raw_tar(&[
            pax(&[("path", pax_path.as_bytes()), ("size", b"4")]),
            Raw {
                data: b"wxyz".to_vec(),
                ..file("short-name", b"", 0o644)
            },
            file("after", b"ok", 0o644),
        ]));
        let s = Sandbox::new();
        s.unpack(&tar).unwrap();
        assert_eq!(std::fs::read(s.root().join(&long)).unwrap(), b"abc");
        assert_eq!(std::fs::read(s.root().join(&pax_path)).unwrap(), b"wxyz");
        assert_eq!(std::fs::read(s.root().join("after")).unwrap(), b"ok");

        // A 2 MiB GNU long name: refused before it is buffered.
        let huge = Raw {
            path: b"././@LongLink".to_vec(),
            kind: EntryType::GNULongName,
            mode: 0o644,
            data: vec![b'a'; 2 << 20],
            link: vec![],
        };
        let s = Sandbox::new();
        let (_, reason) = refused(s.unpack(&raw_tar(&[huge, file("x", b"", 0o644)])));
        assert!(reason.contains("metadata entry"), "{reason}");
        // Two `size` records: the tar reader takes the first (0), so the
        // next header is a 2 MiB GNU long name; a guard that took the last
        // (1024) would read that header as file data, fall out of step and
        // let the reader buffer the long name whole.
        let huge = || Raw {
            path: b"././@LongLink".to_vec(),
            kind: EntryType::GNULongName,
            mode: 0o644,
            data: vec![b'a'; 2 << 20],
            link: vec![],
        };
        let s = Sandbox::new();
        let tar = raw_tar(&[
            pax(&[("size", b"0"), ("size", b"1024")]),
            file("f", b"", 0o644),
            huge(),
            file("x", b"", 0o644),
        ]);
        let (_, reason) = refused(s.unpack(&tar));
        assert!(reason.contains("metadata entry"), "{reason}");
        // A PAX header's `size` is not the size of a global header that
        // follows it (the tar reader reads that by its own size).
        let mut global = pax(&[("comment", b"c")]);
        global.kind = EntryType::XGlobalHeader;
        let s = Sandbox::new();
        let tar = raw_tar(&[
            pax(&[("size", b"1024")]),
            global,
            huge(),
            file("x", b"", 0o644),
        ]);
        let (_, reason) = refused(s.unpack(&tar));
        assert!(reason.contains("metadata entry"), "{reason}");
        // A GNU sparse header whose `isextended` is neither 0 nor 1: the
        // reader reads no extension block after it, so neither may the
        // guard.
        let mut sparse = sparse_tar("s", 1024);
        sparse.truncate(1024);
        sparse[482] = 2;
        let sum: u32 = sparse[..512]
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    u32::from(*b)
                }
            })
            .sum();
        sparse[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        let mut rest = raw_tar(&[huge(), file("x", b"", 0o644)]);
        sparse.append(&mut rest);
        let s = Sandbox::new();
        let (_, reason) = refused(s.unpack(&sparse));
        assert!(reason.contains("metadata entry"), "{reason}");

        // Too deep.
        let s = Sandbox::new();
        let deep = vec!["d"; MAX_DEPTH + 1].join("/");
        let tar = raw_tar(&[pax(&[("path", deep.as_bytes())]), dir("short", 0o755)]);
        assert!(refused(s.unpack(&tar)).1.contains("deep"));
    }

    #[test]
    fn later_entries_replace_earlier_ones() {
        let s = Sandbox::new();
        let tar = raw_tar(&[
            file("x", b"file", 0o644),
            dir("x", 0o700),
            file("x/in", b"1", 0o644),
            dir("x", 0o755),
            file("y", b"old", 0o644),
            file("y", b"new", 0o644),
            dir("z", 0o755),
            file("z/in", b"1", 0o644),
            symlink("z", "x"),
            dir("./", 0o777),
        ]);
        s.unpack(&tar).unwrap();
        assert_eq!(std::fs::read(s.root().join("x/in")).unwrap(), b"1");
        assert_eq!(std::fs::read(s.root().join("y")).unwrap(), b"new");
        assert_eq!(
            std::fs::read_link(s.root().join("z")).unwrap(),
            Path::new("x")
        );
        let mode = std::fs::metadata(s.root()).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755);
    }
}
