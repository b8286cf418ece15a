//! CDI, the Container Device Interface: what a job running inside a
//! container image gets for its GPUs (device nodes, the driver's files,
//! variables), read from the host's CDI specs the way `podman run --device
//! nvidia.com/gpu=0` does, so the driver's own tool (`nvidia-ctk cdi
//! generate`) decides what a GPU needs, not ptrain.
//!
//! # Rooms
//!
//! - [`spec`](mod@spec): one spec file's bytes parsed (YAML or JSON, CDI
//!   0.3.0 to 0.8.0) and checked: its version, its `kind`
//!   (`vendor/class`), its device names, and no field ptrain would leave
//!   out. Pure.
//! - [`registry`]: the devices of all specs read, a later directory
//!   overriding an earlier one; ptrain's GPU to its CDI device (by UUID,
//!   else by index) and the merged edits of a job's GPUs (each spec's own
//!   edits once, then each device's). Pure.
//! - [`hooks`]: what nvidia's hooks would have done, as data; ptraind
//!   never runs one. Pure.
//! - [`translate`](mod@translate): the merged edits as what the job's unit needs
//!   ([`JobDevices`]: `DeviceAllow=`, `BindReadOnlyPaths=`,
//!   `Environment=`, symlinks, library folders). Pure.
//! - [`elf`]: a library's soname from its headers. Pure.
//! - [`load`]: the I/O: the spec directories read safely, the host paths
//!   of a job's edits checked, sonames read.
//!
//! For a job: [`load::host_job_devices`] with the record's GPUs, which is
//! [`load::load_host_registry`], [`job_devices`] (the GPUs' edits,
//! [`Registry::edits_for_gpus`], then [`translate()`]),
//! [`load::verify_host`], and [`JobDevices::add_soname_links`] with
//! [`load::read_soname`].
//!
//! # Threat model
//!
//! - **Who writes specs: root only.** ptraind runs as root and turns a
//!   spec into device access and binds of host paths for another user's
//!   job; whoever could write a spec could give their own jobs any device
//!   (`/dev/sda`) or any host file (`/etc/shadow`). So [`load`] reads only
//!   directories and files owned by root and writable by no one else
//!   (group-writable only for group root), under directories only root
//!   can rename (others may write only with the sticky bit), no symlink as
//!   the directory or as a spec file (a link's target may be anyone's; it
//!   is refused rather than chased, and nvidia-ctk writes plain files),
//!   each decision made from `fstat` of the open file (opened `O_NOFOLLOW`
//!   relative to the checked directory), at most [`load::MAX_SPEC_BYTES`]
//!   per file and [`load::MAX_SPEC_FILES`] per directory, YAML parsed
//!   within serde-saphyr's budgets (no alias bombs). A file that fails any
//!   check is an error for the whole read, naming the file and the fix:
//!   a set with a file skipped could give a device as an older file
//!   describes it.
//! - **What a job controls: nothing here.** Its GPUs are the scheduler's
//!   choice; the CDI device is found from their index and UUID; the
//!   descriptor has no field that reaches CDI. A job may unset or change
//!   the spec's variables in its own process (they are unit variables,
//!   like `CUDA_VISIBLE_DEVICES`): harmless, device access is the cgroup's
//!   (`DevicePolicy=closed`), not a variable's. A spec may not set
//!   ptraind's own variables.
//! - **What an image controls: its own tree, never the host paths.** A
//!   bind's source is a host path from the spec, resolved by systemd in
//!   the host's mount namespace, never through the image. Its destination
//!   is resolved by systemd inside `RootDirectory=` (chased with the root
//!   as prefix: an absolute symlink in the image resolves against the
//!   image's root and `..` stops there), so an image that puts a symlink
//!   at `/usr/lib/x86_64-linux-gnu/libcuda.so.1 -> /etc/shadow` only gets
//!   the bind onto its own `/etc/shadow`; an image can redirect a bind
//!   within its own tree, nothing more. The device nodes are the host's
//!   `/dev` (`MountAPIVFS=yes`), and the device cgroup checks every open
//!   by major:minor, so a node the image ships opens nothing that
//!   `DeviceAllow=` did not name. The hooks, which would run as root over
//!   the image's tree (its `/etc/ld.so.conf`, its symlinks) and write into
//!   it, are never run ([`hooks`]).
//!
//! # Realising it (for the unit's builder)
//!
//! systemd creates a missing bind destination (an empty file or
//! directory, and its parents) inside the root before it binds: in a
//! shared image tree that is a write into every other job's image, and on
//! a read-only tree a failed start. The driver's files are never in an
//! image, and the symlinks have to be made somewhere too. The plan this
//! room is built for: ptraind makes a small per-job directory holding an
//! empty file (or directory) at each [`JobDevices::mount_points`] path and
//! each [`JobDevices::symlinks`] link as a real symlink, and mounts a
//! read-only overlayfs with that directory as the upper of two lower
//! layers over the image (`lowerdir=JOBDIR:IMAGE`, no upperdir), which
//! becomes the unit's `RootDirectory=`; systemd's binds then land on
//! the stubs, nothing is written into the image, and the overlay goes
//! with the job. Without an overlay, the per-job directory can be bound
//! at one path (`/run/ptrain/cdi`, on the unit's own `/run` tmpfs) and
//! the binds pointed there, but then the driver's files are not where
//! the spec puts them and only `LD_LIBRARY_PATH` finds them.
//!
//! The library folders go on the job's `LD_LIBRARY_PATH`
//! ([`JobDevices::ld_library_path`]), with the soname links in the
//! overlay: this needs no write into the image and no program of the
//! image's. The closer match to the hook is an `ld.so.cache` per image and
//! driver: ptraind runs the host's `ldconfig -X -C CACHE -f CONF -r ROOT`
//! over the merged overlay (with the binds in place, in a mount namespace
//! of its own, CONF listing the image's folders and the driver's) and puts
//! CACHE in the per-job layer at `/etc/ld.so.cache`; the job's variables
//! stay as the image set them. It costs an `ldconfig` run (cacheable per
//! image and spec digest) and parses the image's `ld.so.conf` as root,
//! under `-r`; `LD_LIBRARY_PATH` is the first step.

pub mod elf;
pub mod hooks;
pub mod load;
pub mod registry;
pub mod spec;
pub mod translate;

use std::path::PathBuf;

pub use hooks::{HookEffects, Symlink};
pub use registry::{MergedEdits, Registry, Sourced, NVIDIA_GPU_KIND};
pub use spec::Spec;
pub use translate::{translate, BindMount, HostNode, JobDevices};

/// What a job in a container image gets for `gpus`, from `registry`:
/// their CDI devices' merged edits, translated. Pure; the host paths are
/// checked and the soname links added by [`load::host_job_devices`].
pub fn job_devices(
    registry: &Registry,
    gpus: &[crate::store::AssignedGpu],
) -> Result<JobDevices, CdiError> {
    translate(&registry.edits_for_gpus(gpus)?)
}

/// What can go wrong between the spec files and a job's unit; each names
/// the file (or device) and says how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// A file or directory ptraind will not read: its owner, its mode, a
    /// symlink, its size.
    #[error("refusing the CDI {what} {path}: {why}; {fix}", path = .path.display())]
    Untrusted {
        what: &'static str,
        path: PathBuf,
        why: String,
        fix: String,
    },

    #[error("cannot read the CDI {what} {path}: {source}; check that it is readable by root", path = .path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The spec's contents: its syntax, version, kind, names, or an edit
    /// ptrain cannot apply.
    #[error("CDI spec {path}: {problem}; {fix}", path = .path.display())]
    Invalid {
        path: PathBuf,
        problem: String,
        fix: String,
    },

    /// A hook ptrain does not run and does not know the effect of.
    #[error("CDI spec {spec}: ptrain never runs hooks and cannot apply the hook `{hook}`: {why}; remove the hook from the spec (ptrain applies nvidia's create-symlinks and update-ldcache itself)", spec = .spec.display())]
    Hook {
        spec: PathBuf,
        hook: String,
        why: String,
    },

    #[error("no CDI spec for {kind} in {dirs}: this GPU host needs one for jobs in container images; generate it with `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`")]
    NoSpec { kind: String, dirs: String },

    #[error("GPU {index} ({uuid}) has no CDI device: neither {kind}={uuid} nor {kind}={index} is in {dirs}; the spec predates this GPU, generate it anew with `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`")]
    DeviceMissing {
        index: u32,
        uuid: String,
        kind: String,
        dirs: String,
    },

    #[error("CDI device {device} is not in {dirs}; generate the spec anew with `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`")]
    UnknownDevice { device: String, dirs: String },

    #[error("CDI device {device} (in {spec}) gives {given}, not GPU {index}'s node {node}: the spec is stale (GPUs renumbered); generate it anew with `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`", spec = .spec.display(), node = .node.display())]
    WrongNode {
        device: String,
        spec: PathBuf,
        index: u32,
        node: PathBuf,
        given: String,
    },

    #[error("CDI device {device} is defined in both {first} and {second}, in one directory; remove one (only a later directory may override a device)", first = .first.display(), second = .second.display())]
    Conflict {
        device: String,
        first: PathBuf,
        second: PathBuf,
    },

    #[error("CDI specs disagree on {what}: {first} says {first_says}, {second} says {second_says}; make them agree or remove one", first = .first.display(), second = .second.display())]
    EditConflict {
        what: String,
        first: PathBuf,
        first_says: String,
        second: PathBuf,
        second_says: String,
    },

    /// A host path a job's edits name is missing or not what the spec
    /// says (the driver was upgraded after the spec was generated).
    #[error("CDI spec {spec} names {path}: {why}; generate the spec anew for the installed driver with `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`", spec = .spec.display(), path = .path.display())]
    HostPath {
        spec: PathBuf,
        path: PathBuf,
        why: String,
    },
}

#[cfg(test)]
mod tests;
