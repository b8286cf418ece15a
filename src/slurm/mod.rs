//! Running jobs on a Slurm cluster (issue 24): the same descriptor, with
//! Slurm doing placement and execution.
//!
//! What is here so far is the pure room that turns a job (or a sweep's
//! members) into one `sbatch` submission, keeping Slurm's meanings
//! exactly and refusing, with the field and the reason, what Slurm
//! cannot honour ([`prepare`]). ptraind's backend switch (`[cluster]`),
//! the submission as the owner, the tracking of Slurm's jobs and its
//! tests' cluster (`tests/harness/slurm/`) build on it.

pub mod batch;

pub use batch::{prepare, Batch, DependencyKind, SlurmDependency, Submission, Unsupported};
