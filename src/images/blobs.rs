//! The content-addressed blob store: `blobs/sha256/HEX`, each file there
//! verified before it got its name.
//!
//! A blob is written to a temp file under the store's `tmp/` (same file
//! system), hashed and counted as it streams; past its limit the write
//! stops at once (a hostile registry or archive cannot fill the disk);
//! at the end its digest is compared with the one expected and only then
//! is the file renamed to its digest. A name in `blobs/sha256/` is thus a
//! promise that the bytes hash to it; a crash leaves only a temp file,
//! which [`super::store::ImageStore::open`] clears.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest as _, Sha256};

use super::reference::Digest;

/// Bounds on what one image may bring into the blob store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetchLimits {
    /// A manifest or index (read into memory).
    pub max_manifest_bytes: u64,
    /// An image config (read into memory).
    pub max_config_bytes: u64,
    /// One layer blob, as stored (compressed).
    pub max_layer_bytes: u64,
}

impl Default for FetchLimits {
    fn default() -> FetchLimits {
        FetchLimits {
            max_manifest_bytes: 4 << 20,
            max_config_bytes: 16 << 20,
            max_layer_bytes: 32 << 30,
        }
    }
}

/// An image whose blobs are all in the store: where it came from, and
/// the digests that name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    /// The source as written back ([`super::ImageSource`]'s display).
    pub source: String,
    /// The index or manifest list it was chosen from, if any.
    pub index: Option<Digest>,
    /// The image manifest: the image's identity in the store.
    pub manifest: Digest,
}

/// Why a blob was not stored.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("{what}: expected digest {expected} but the bytes hash to {actual}; the source is corrupt or tampered with, nothing was stored")]
    DigestMismatch {
        what: String,
        expected: Digest,
        actual: Digest,
    },
    #[error("{what}: {written} bytes, but its descriptor says {declared}; the source is corrupt, nothing was stored")]
    SizeMismatch {
        what: String,
        declared: u64,
        written: u64,
    },
    #[error("{what} is larger than the limit of {limit} bytes; raise the limit if the image is trusted and that large")]
    TooLarge { what: String, limit: u64 },
    #[error("{what}: {path}: {source}")]
    Io {
        what: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The blobs of one store.
#[derive(Clone, Debug)]
pub struct BlobStore {
    dir: PathBuf,
    tmp: PathBuf,
}

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// A fresh name under `tmp` no other writer of this process or another
/// uses: pid, a counter, and the time.
pub(super) fn temp_name(tmp: &Path, prefix: &str) -> PathBuf {
    let n = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    tmp.join(format!("{prefix}-{}-{n}-{nanos}", std::process::id()))
}

impl BlobStore {
    /// The store over `dir` (`ROOT/blobs/sha256`), with temp files in
    /// `tmp` (`ROOT/tmp`, on the same file system for the rename).
    pub fn new(dir: PathBuf, tmp: PathBuf) -> BlobStore {
        BlobStore { dir, tmp }
    }

    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join(digest.hex())
    }

    /// Whether the blob is stored (and so verified).
    pub fn contains(&self, digest: &Digest) -> bool {
        std::fs::symlink_metadata(self.path(digest)).is_ok_and(|m| m.is_file())
    }

    /// The size of a stored blob.
    pub fn size(&self, digest: &Digest) -> Option<u64> {
        std::fs::symlink_metadata(self.path(digest))
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len())
    }

    /// Opens a stored blob for reading.
    pub fn open(&self, digest: &Digest) -> Result<File, BlobError> {
        let path = self.path(digest);
        File::open(&path).map_err(|source| BlobError::Io {
            what: format!("blob {digest}"),
            path,
            source,
        })
    }

    /// Reads a stored blob whole, refusing one over `limit` bytes
    /// (manifests and configs, read into memory).
    pub fn read(&self, digest: &Digest, limit: u64) -> Result<Vec<u8>, BlobError> {
        let mut file = self.open(digest)?;
        let mut buf = Vec::new();
        (&mut file)
            .take(limit + 1)
            .read_to_end(&mut buf)
            .map_err(|source| BlobError::Io {
                what: format!("blob {digest}"),
                path: self.path(digest),
                source,
            })?;
        if buf.len() as u64 > limit {
            return Err(BlobError::TooLarge {
                what: format!("blob {digest}"),
                limit,
            });
        }
        Ok(buf)
    }

    /// A writer for one blob. `what` names it in errors (`layer
    /// sha256:… of docker.io/library/x:1`); `expected` is its digest when
    /// known (a registry blob, a manifest pulled by digest), or `None` to
    /// store it under whatever its bytes hash to (a `docker save` layer);
    /// `declared_size` is its descriptor's size when one is known.
    pub fn writer(
        &self,
        what: impl Into<String>,
        expected: Option<Digest>,
        declared_size: Option<u64>,
        max_bytes: u64,
    ) -> Result<BlobWriter, BlobError> {
        let what = what.into();
        if let Some(size) = declared_size {
            if size > max_bytes {
                return Err(BlobError::TooLarge {
                    what,
                    limit: max_bytes,
                });
            }
        }
        let path = temp_name(&self.tmp, "blob");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|source| BlobError::Io {
                what: what.clone(),
                path: path.clone(),
                source,
            })?;
        Ok(BlobWriter {
            store: self.clone(),
            what,
            file: Some(file),
            temp: path,
            hasher: Sha256::new(),
            written: 0,
            max_bytes,
            expected,
            declared_size,
        })
    }

    /// Stores `bytes`, held whole in memory (a manifest as fetched), as
    /// [`BlobStore::store_from`] would, checked the same way (`max_bytes`,
    /// `expected`); when a blob of their digest is already stored, nothing
    /// is written: that name was verified and synced when it was given (a
    /// warm pull fetches its tag's manifest again each time, and would
    /// otherwise make, write and remove a temp file for it each time).
    pub fn store_bytes(
        &self,
        what: impl Into<String>,
        bytes: &[u8],
        expected: Option<Digest>,
        max_bytes: u64,
    ) -> Result<Digest, BlobError> {
        let what = what.into();
        if bytes.len() as u64 > max_bytes {
            return Err(BlobError::TooLarge {
                what,
                limit: max_bytes,
            });
        }
        let actual = Digest::from_sha256(Sha256::digest(bytes).into());
        if let Some(expected) = expected {
            if expected != actual {
                return Err(BlobError::DigestMismatch {
                    what,
                    expected,
                    actual,
                });
            }
        }
        if self.contains(&actual) {
            return Ok(actual);
        }
        self.store_from(what, &mut &bytes[..], Some(actual), None, max_bytes)
    }

    /// Copies `reader` into the store through [`BlobStore::writer`].
    pub fn store_from(
        &self,
        what: impl Into<String>,
        reader: &mut dyn Read,
        expected: Option<Digest>,
        declared_size: Option<u64>,
        max_bytes: u64,
    ) -> Result<Digest, BlobError> {
        let mut w = self.writer(what, expected, declared_size, max_bytes)?;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(BlobError::Io {
                        what: w.what.clone(),
                        path: w.temp.clone(),
                        source,
                    })
                }
            };
            w.write_chunk(&buf[..n])?;
        }
        w.finish()
    }
}

/// One blob being written; dropped unfinished, its temp file goes.
pub struct BlobWriter {
    store: BlobStore,
    what: String,
    file: Option<File>,
    temp: PathBuf,
    hasher: Sha256,
    written: u64,
    max_bytes: u64,
    expected: Option<Digest>,
    declared_size: Option<u64>,
}

impl BlobWriter {
    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    pub fn write_chunk(&mut self, chunk: &[u8]) -> Result<(), BlobError> {
        let after = self.written.saturating_add(chunk.len() as u64);
        if after > self.max_bytes {
            return Err(BlobError::TooLarge {
                what: self.what.clone(),
                limit: self.max_bytes,
            });
        }
        if let Some(declared) = self.declared_size {
            if after > declared {
                return Err(BlobError::SizeMismatch {
                    what: self.what.clone(),
                    declared,
                    written: after,
                });
            }
        }
        self.hasher.update(chunk);
        let file = self.file.as_mut().expect("a writer writes until finished");
        file.write_all(chunk).map_err(|source| BlobError::Io {
            what: self.what.clone(),
            path: self.temp.clone(),
            source,
        })?;
        self.written = after;
        Ok(())
    }

    /// Checks size and digest, then renames the temp file to its digest
    /// (a blob already there is the same bytes: kept, the temp removed).
    pub fn finish(mut self) -> Result<Digest, BlobError> {
        let actual = Digest::from_sha256(std::mem::take(&mut self.hasher).finalize().into());
        if let Some(declared) = self.declared_size {
            if declared != self.written {
                return Err(BlobError::SizeMismatch {
                    what: self.what.clone(),
                    declared,
                    written: self.written,
                });
            }
        }
        if let Some(expected) = &self.expected {
            if *expected != actual {
                return Err(BlobError::DigestMismatch {
                    what: self.what.clone(),
                    expected: expected.clone(),
                    actual,
                });
            }
        }
        let io_err = |what: &str, path: &Path, source| BlobError::Io {
            what: what.to_string(),
            path: path.to_path_buf(),
            source,
        };
        let file = self.file.take().expect("finished once");
        let dest = self.store.path(&actual);
        // A blob at its digest's path was verified, and fsynced before its
        // rename: these bytes are the same and need no fsync of their own
        // (a warm pull fetches its manifest again every time).
        if self.store.contains(&actual) {
            drop(file);
            let _ = std::fs::remove_file(&self.temp);
            return Ok(actual);
        }
        file.sync_all()
            .map_err(|e| io_err(&self.what, &self.temp, e))?;
        drop(file);
        match crate::fsutil::rename_noreplace(&self.temp, &dest) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let _ = std::fs::remove_file(&self.temp);
            }
            Err(e) => return Err(io_err(&self.what, &dest, e)),
        }
        Ok(actual)
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        if self.file.is_some() {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, BlobStore) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("blobs/sha256")).unwrap();
        std::fs::create_dir_all(dir.path().join("tmp")).unwrap();
        let s = BlobStore::new(dir.path().join("blobs/sha256"), dir.path().join("tmp"));
        (dir, s)
    }

    fn tmp_is_empty(dir: &tempfile::TempDir) -> bool {
        std::fs::read_dir(dir.path().join("tmp"))
            .unwrap()
            .next()
            .is_none()
    }

    #[test]
    fn a_verified_blob_is_stored_under_its_digest() {
        let (dir, s) = store();
        let want = Digest::of(b"hello");
        let got = s
            .store_from("b", &mut &b"hello"[..], Some(want.clone()), Some(5), 100)
            .unwrap();
        assert_eq!(got, want);
        assert!(s.contains(&want));
        assert_eq!(s.read(&want, 5).unwrap(), b"hello");
        assert!(matches!(s.read(&want, 4), Err(BlobError::TooLarge { .. })));
        // The same bytes again: no error, one file.
        s.store_from("b", &mut &b"hello"[..], None, None, 100)
            .unwrap();
        assert!(tmp_is_empty(&dir));
    }

    #[test]
    fn bytes_in_memory_are_checked_and_stored_once() {
        let (dir, s) = store();
        let want = Digest::of(b"manifest");
        let got = s
            .store_bytes("m", b"manifest", Some(want.clone()), 100)
            .unwrap();
        assert_eq!(got, want);
        assert_eq!(s.read(&want, 100).unwrap(), b"manifest");
        // Already stored: the same digest, nothing written, no temp file.
        let before = std::fs::metadata(s.path(&want))
            .unwrap()
            .modified()
            .unwrap();
        assert_eq!(s.store_bytes("m", b"manifest", None, 100).unwrap(), want);
        let after = std::fs::metadata(s.path(&want))
            .unwrap()
            .modified()
            .unwrap();
        assert_eq!(before, after);
        assert!(tmp_is_empty(&dir));
        // A stored blob never vouches for other bytes: a mismatch is one
        // still, and too many bytes are too many.
        let err = s
            .store_bytes("m", b"tampered", Some(want.clone()), 100)
            .unwrap_err();
        assert!(matches!(err, BlobError::DigestMismatch { .. }), "{err}");
        let err = s.store_bytes("m", b"manifest", None, 7).unwrap_err();
        assert!(matches!(err, BlobError::TooLarge { limit: 7, .. }), "{err}");
        assert!(tmp_is_empty(&dir));
    }

    #[test]
    fn a_digest_mismatch_names_both_digests_and_stores_nothing() {
        let (dir, s) = store();
        let want = Digest::of(b"expected");
        let err = s
            .store_from(
                "layer X",
                &mut &b"tampered"[..],
                Some(want.clone()),
                None,
                100,
            )
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&want.to_string()), "{text}");
        assert!(
            text.contains(&Digest::of(b"tampered").to_string()),
            "{text}"
        );
        assert!(text.contains("layer X"), "{text}");
        assert!(!s.contains(&Digest::of(b"tampered")) && !s.contains(&want));
        assert!(tmp_is_empty(&dir));
    }

    #[test]
    fn limits_and_declared_sizes_stop_the_write() {
        let (dir, s) = store();
        let big = vec![7u8; 1000];
        let err = s
            .store_from("big", &mut &big[..], None, None, 999)
            .unwrap_err();
        assert!(
            matches!(err, BlobError::TooLarge { limit: 999, .. }),
            "{err}"
        );
        let err = s.writer("declared", None, Some(2000), 999).err().unwrap();
        assert!(matches!(err, BlobError::TooLarge { .. }));
        let err = s
            .store_from("short", &mut &big[..], None, Some(10), 5000)
            .unwrap_err();
        assert!(matches!(err, BlobError::SizeMismatch { .. }), "{err}");
        let err = s
            .store_from("long", &mut &big[..], None, Some(2000), 5000)
            .unwrap_err();
        assert!(
            matches!(err, BlobError::SizeMismatch { written: 1000, .. }),
            "{err}"
        );
        assert!(tmp_is_empty(&dir));
        assert_eq!(
            std::fs::read_dir(dir.path().join("blobs/sha256"))
                .unwrap()
                .count(),
            0
        );
    }
}
