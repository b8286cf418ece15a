//! Running jobs on a Slurm cluster (issue 24): the same descriptor, with
//! Slurm doing placement and execution.
//!
//! What is here so far is the pure room that turns a job (or a sweep's
//! members) into one `sbatch` submission, keeping Slurm's meanings
//! exactly and refusing, with the field and the reason, what Slurm
//! cannot honour ([`prepare`]), and the room that runs Slurm's commands
//! as the job's owner ([`SlurmCommands`]: `sbatch`, `scancel`, with
//! Slurm's refusals told apart from a controller that is away). The
//! backend switch (`[cluster]`) and the tracking of Slurm's jobs in
//! ptraind build on them; the tests' cluster is `tests/harness/slurm/`.

pub mod batch;
pub mod sbatch;

pub use batch::{prepare, Batch, DependencyKind, SlurmDependency, Submission, Unsupported};
pub use sbatch::{SlurmCommands, SlurmError};
