//! Container images for jobs (issue 21): an OCI or Docker image fetched,
//! verified, unpacked once and assembled into a read-only tree that
//! systemd runs the job in with `RootDirectory=`.
//!
//! # The path of an image
//!
//! 1. [`reference`] (pure): the job's `image` is parsed into an
//!    [`ImageSource`]: a registry reference, normalized as docker does
//!    (`ubuntu` is `docker.io/library/ubuntu:latest`; the first component
//!    is a registry when it has a `.` or `:` or is `localhost`; `@sha256:`
//!    pins the manifest), or a local `oci-archive:`, `docker-archive:` or
//!    `oci:` source by absolute path.
//! 2. [`registry`] (I/O, async) or [`archive`] (I/O, blocking) brings the
//!    image's manifest, config and layer blobs into the [`blobs`] store:
//!    each one hashed and counted while it streams to a temp file, over
//!    its limit stopped at once, renamed to `blobs/sha256/HEX` only when
//!    its digest is the one expected (a mismatch names both digests).
//!    The answer is a [`Fetched`]: the manifest's digest is the image.
//! 3. [`store::ImageStore::prepare`] (I/O, blocking) unpacks each layer
//!    not yet unpacked ([`unpack`], the security core: see there what is
//!    refused) into `layers/sha256/DIFF_ID/`, checking the uncompressed
//!    stream against the config's diff-id, then assembles the image's
//!    tree into `trees/sha256/CHAIN_ID/` ([`assemble`]): directories made,
//!    files hard-linked from the layers (shared, never copied), whiteouts
//!    and opaque directories applied. Every job of the image shares the
//!    tree, every image with a layer shares the layer. All of it is built
//!    in `tmp/` and renamed into place whole. The record
//!    (`images/*.json`, [`catalog::ImageRecord`]) says what the image
//!    uses and when it was last used.
//! 4. [`manifest`] (pure) says what the job runs, as `docker run` would:
//!    [`manifest::launch_argv`] keeps the image's `Entrypoint` and puts
//!    the job's `command` in place of the image's `Cmd` (no command: the
//!    `Cmd`); [`manifest::merge_env`] starts from the image's `Env` and
//!    lets the job's `env` override it name by name, adding docker's
//!    default `PATH` when neither sets one. The image's `WorkingDir` and
//!    `User` are read, not applied here: the job runs as its owner
//!    (never the image's `User`), and where it starts is the daemon's
//!    choice.
//! 5. [`catalog`] (pure) lists the images and decides which to remove
//!    ([`catalog::plan_gc`]: unused past an age, then least recently used
//!    until the store fits, never one a queued or running job needs);
//!    [`store::ImageStore::collect`] removes them and then every tree,
//!    layer and blob no remaining record names, and the unit roots
//!    cloned from a removed tree. The limits are `[images]` of
//!    ptrain.toml ([`settings`]); the daemon collects at start and
//!    after each image job ends, never beside a pull.
//!
//! # Trust
//!
//! An image is untrusted input handled by root. Everything is verified
//! by digest before it is named; everything has a size bound; a layer
//! is written entry by entry through directory fds that never follow a
//! symlink; owners, setuid/setgid bits, xattrs (file capabilities) and
//! device nodes never reach the disk; modes keep only `0755` of their
//! bits, so the tree is root's and read-only to every job. The store
//! root is 0700.
//!
//! A local source is opened by whoever calls the import: the daemon must
//! open it as the job's owner (or check the owner may read it) so no one
//! imports a file only root can read ([`archive`] takes open files).
//!
//! # The registry client
//!
//! Hand-rolled over the crate's `reqwest` (rustls, ring), not
//! `oci-client`: that crate (0.18) does use reqwest 0.13, but brings
//! `oci-spec`, `chrono`, `regex`, `jwt` and a second `sha2` (0.11), and
//! its blob pulls write to a caller's writer without the digest check
//! into a content-addressed store and the streaming size bound this store
//! needs; the Docker Registry HTTP API v2 subset an image pull uses is a
//! few hundred lines: manifests with OCI and Docker `Accept` types, the
//! `WWW-Authenticate: Bearer` token flow (and Basic) with the supplied
//! [`registry::Credentials`], blobs streamed through the blob writer.
//! Plain http is used only for a registry listed as insecure (a loopback
//! one too); a token realm must be https under the same rule.
//!
//! Layers: tar, gzip (`flate2`) or zstd (`ruzstd`, pure Rust), told by
//! their magic bytes.

pub mod archive;
pub mod assemble;
pub mod auth;
pub mod blobs;
pub mod catalog;
pub mod manifest;
pub mod reference;
pub mod registry;
pub mod runtime_root;
mod safe_fs;
pub mod settings;
pub mod store;
pub mod unpack;

pub use blobs::{BlobError, BlobStore, FetchLimits, Fetched};
pub use catalog::{GcPlan, GcPolicy, ImageListing, ImageRecord};
pub use manifest::{ImageConfig, Platform};
pub use reference::{Digest, ImageReference, ImageSource, ReferenceError};
pub use settings::{ImagesConfig, RawImagesConfig};
pub use store::{ImageLimits, ImageStore, PreparedImage, StoreError};
