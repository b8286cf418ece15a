//! Slurm's own commands, run as the job's owner: `sbatch` of a
//! [`Batch`], `scancel` of the owner's job. I/O.
//!
//! ptraind runs as root; Slurm must run each job under its owner's uid
//! with the owner's munge credential, and ptraind must never ask it to
//! run a job as someone else. So the command itself runs as the owner
//! (uid and gid set before exec, no supplementary groups: slurmd looks
//! the job's groups up on the node), and munge vouches for that uid
//! alone. Nothing of ptraind's environment reaches it: the environment is
//! emptied and given only `PATH`, `LANG=C` (sbatch's words are matched)
//! and the site's `SLURM_CONF`. The script goes on standard input, never
//! through a file another user could swap.
//!
//! The command runs as the owner, so the owner can reach its output
//! (`/proc/PID/fd/1` of their own process): what it prints is not
//! believed. The job id sbatch answers is checked as root with
//! `scontrol show job` (slurmctld's word): the job must be the owner's
//! and carry the submission's token (`--comment`), or the submission is
//! [`SlurmError::Unknown`]. Output is read up to [`MAX_OUTPUT`] bytes a
//! stream, and no descriptor of ptraind's but the three pipes reaches
//! the command.
//!
//! A command that does not answer within [`SlurmCommands::timeout`] is
//! killed and reported as [`SlurmError::Unreachable`]; one that failed in
//! words Slurm uses for a refusal is [`SlurmError::Refused`]; any other
//! failure is [`SlurmError::Unknown`]. After all but a refusal the job
//! may or may not have been made: the caller keeps the job and, before
//! it submits again, looks for a job of the owner's carrying the token,
//! so nothing is lost and nothing runs twice.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::Batch;
use crate::users::Owner;

/// Where Slurm's commands are and how they are run.
#[derive(Clone, Debug)]
pub struct SlurmCommands {
    /// The directory of `sbatch` and `scancel` (Debian: `/usr/bin`).
    pub bin_dir: PathBuf,
    /// `SLURM_CONF` for the commands; `None`: Slurm's default.
    pub slurm_conf: Option<PathBuf>,
    /// How long one command may take.
    pub timeout: Duration,
}

impl Default for SlurmCommands {
    fn default() -> Self {
        SlurmCommands {
            bin_dir: "/usr/bin".into(),
            slurm_conf: None,
            timeout: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    /// Slurm said no to this job: it will say no again.
    #[error("Slurm refused: {words}; {fix}")]
    Refused { words: String, fix: &'static str },
    /// The controller did not answer: try again later.
    #[error("Slurm's controller did not answer `{command}`: {words}; the job waits and is sent again (check slurmctld and SLURM_CONF)")]
    Unreachable {
        command: &'static str,
        words: String,
    },
    /// The command failed in words not known to be a refusal, or its
    /// answer could not be confirmed: whether it acted is unknown.
    #[error("`{command}` failed: {words}; whether Slurm took it is not known, so the job waits and is looked for by its token before it is sent again")]
    Unknown {
        command: &'static str,
        words: String,
    },
    #[error("cannot run {program}: {source}; install Slurm's client commands (Debian: slurm-client) or set [cluster] bin_dir")]
    Spawn {
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("talking to {program}: {source}; the job waits and is looked for by its token before it is sent again")]
    Io {
        program: PathBuf,
        source: std::io::Error,
    },
}

/// Most bytes of a command's output that are read, a stream.
pub const MAX_OUTPUT: u64 = 64 * 1024;

/// sbatch's refusals, by the words Slurm uses, with the fix to name.
const REFUSALS: &[(&str, &str)] = &[
    (
        "Requested node configuration is not available",
        "no node of the partition has what the job asks (GPUs, memory, CPUs); ask for less, or see `sinfo -N -o '%N %G %m %c'`",
    ),
    (
        "Invalid partition name specified",
        "the partition does not exist: fix [cluster] partition (`sinfo -s` lists them)",
    ),
    (
        "Invalid generic resource (gres) specification",
        "the cluster has no GPU of that model (gres type): `sinfo -o %G` lists them",
    ),
    (
        "Invalid account or account/partition combination specified",
        "fix [cluster] account, or ask the admin to add the user to it",
    ),
    (
        "Job violates accounting/QOS policy",
        "the job exceeds what the user's association or QOS allows: ask for less, or ask the admin",
    ),
    (
        "Access/permission denied",
        "only the job's owner (or Slurm's operators) may do that",
    ),
    (
        "Invalid job id specified",
        "Slurm no longer knows the job: it has ended",
    ),
    (
        "Requested time limit is invalid",
        "the timeout is more than the partition allows: shorten it (`sinfo -o '%P %l'`)",
    ),
];

/// sbatch's words when the controller is not there.
const UNREACHABLE: &[&str] = &[
    "Unable to contact slurm controller",
    "Socket timed out",
    "Zero Bytes were transmitted or received",
    "Connection refused",
    "Slurm temporarily unable to accept job",
];

impl SlurmCommands {
    /// Submits `batch` (whose `--comment` is `token`) as `owner`: the
    /// Slurm job id (an array's id for a sweep), confirmed by slurmctld.
    pub async fn submit_as(
        &self,
        owner: &Owner,
        batch: &Batch,
        token: &str,
    ) -> Result<u64, SlurmError> {
        let (ok, stdout, stderr) = self
            .run(Some(owner), "sbatch", &batch.args, Some(&batch.script))
            .await?;
        if !ok {
            return Err(classify("sbatch", &stderr));
        }
        // `--parsable`: `ID` or `ID;CLUSTER`.
        let id = stdout
            .trim()
            .split(';')
            .next()
            .and_then(|id| id.parse().ok())
            .ok_or_else(|| SlurmError::Unknown {
                command: "sbatch",
                words: format!("its answer {:?} is no job id", stdout.trim()),
            })?;
        self.confirm(id, owner, token).await?;
        Ok(id)
    }

    /// Whether Slurm job `id` (each task of an array) is `owner`'s and
    /// carries `token`, asked of slurmctld as root.
    async fn confirm(&self, id: u64, owner: &Owner, token: &str) -> Result<(), SlurmError> {
        let args = ["show", "job", "-o", &id.to_string()].map(str::to_owned);
        let (ok, stdout, stderr) = self.run(None, "scontrol", &args, None).await?;
        let unknown = |words: String| SlurmError::Unknown {
            command: "sbatch",
            words,
        };
        if !ok {
            return Err(unknown(format!(
                "the job {id} it named cannot be looked up: {stderr}"
            )));
        }
        let user = format!("UserId={}({})", owner.name, owner.uid);
        let comment = format!("Comment={token}");
        let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
        let theirs = |line: &&str| {
            let words: Vec<&str> = line.split_whitespace().collect();
            words.contains(&user.as_str()) && words.contains(&comment.as_str())
        };
        match !lines.is_empty() && lines.iter().all(theirs) {
            true => Ok(()),
            false => Err(unknown(format!(
                "the job {id} it named is not {}'s job of this submission",
                owner.name
            ))),
        }
    }

    /// Cancels Slurm job `job` as `owner` (Slurm refuses another user's).
    pub async fn cancel_as(&self, owner: &Owner, job: u64) -> Result<(), SlurmError> {
        let (ok, _, stderr) = self
            .run(Some(owner), "scancel", &[job.to_string()], None)
            .await?;
        match ok {
            true => Ok(()),
            false => Err(classify("scancel", &stderr)),
        }
    }

    /// Runs `program` with `args`, as `owner` (else as ptraind):
    /// (success, stdout, stderr).
    async fn run(
        &self,
        owner: Option<&Owner>,
        program: &'static str,
        args: &[String],
        stdin: Option<&str>,
    ) -> Result<(bool, String, String), SlurmError> {
        let path = self.bin_dir.join(program);
        let mut command = tokio::process::Command::new(&path);
        command
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("LANG", "C")
            .current_dir("/")
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(conf) = &self.slurm_conf {
            command.env("SLURM_CONF", conf);
        }
        if let Some(owner) = owner {
            // std sets no supplementary groups when root changes uid.
            command.uid(owner.uid).gid(owner.gid);
        }
        // SAFETY: close_range is async-signal-safe; it runs in the child
        // once its standard streams are in place, and closes every other
        // descriptor (a library's without close-on-exec among them).
        unsafe {
            command.pre_exec(|| {
                libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
                Ok(())
            });
        }
        let mut child = command.spawn().map_err(|source| SlurmError::Spawn {
            program: path.clone(),
            source,
        })?;
        let (out, err) = (child.stdout.take(), child.stderr.take());
        let io = async {
            let feed = async {
                if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
                    // A command that exits without reading is answered by its status.
                    let _ = pipe.write_all(text.as_bytes()).await;
                }
            };
            let ((), stdout, stderr) = tokio::join!(feed, read_bounded(out), read_bounded(err));
            let status = child.wait().await?;
            Ok::<_, std::io::Error>((status, stdout?, stderr?))
        };
        match tokio::time::timeout(self.timeout, io).await {
            Ok(Ok((status, stdout, stderr))) => {
                let stderr = String::from_utf8_lossy(&stderr).trim().to_owned();
                Ok((
                    status.success(),
                    String::from_utf8_lossy(&stdout).into_owned(),
                    // Killed by a signal: said, so it is no refusal.
                    match status.code() {
                        Some(_) => stderr,
                        None => format!("{status}; {stderr}"),
                    },
                ))
            }
            Ok(Err(source)) => Err(SlurmError::Io {
                program: path,
                source,
            }),
            // The child is killed as it is dropped.
            Err(_) => Err(SlurmError::Unreachable {
                command: program,
                words: format!("no answer within {:?}", self.timeout),
            }),
        }
    }
}

/// Up to [`MAX_OUTPUT`] bytes of `stream`; the rest is drained unread.
async fn read_bounded(stream: Option<impl AsyncRead + Unpin>) -> std::io::Result<Vec<u8>> {
    let mut kept = Vec::new();
    if let Some(mut stream) = stream {
        (&mut stream)
            .take(MAX_OUTPUT)
            .read_to_end(&mut kept)
            .await?;
        tokio::io::copy(&mut stream, &mut tokio::io::sink()).await?;
    }
    Ok(kept)
}

/// What a command's failure means, from its words: a refusal only in
/// words Slurm uses for one.
fn classify(command: &'static str, stderr: &str) -> SlurmError {
    let words = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    if UNREACHABLE.iter().any(|w| stderr.contains(w)) {
        return SlurmError::Unreachable { command, words };
    }
    match REFUSALS.iter().find(|(w, _)| stderr.contains(w)) {
        Some((_, fix)) => SlurmError::Refused { words, fix },
        None => SlurmError::Unknown { command, words },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurms_words_say_whether_to_try_again_and_what_to_fix() {
        let refused = classify(
            "sbatch",
            "sbatch: error: Batch job submission failed: Invalid partition name specified\n",
        );
        assert!(
            matches!(&refused, SlurmError::Refused { fix, .. } if fix.contains("[cluster] partition")),
            "{refused}"
        );
        assert!(refused
            .to_string()
            .contains("Invalid partition name specified"));
        let down = classify(
            "sbatch",
            "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
        );
        assert!(matches!(down, SlurmError::Unreachable { .. }), "{down}");
        // Words ptrain does not know are no refusal: the job is kept.
        let munge = classify(
            "sbatch",
            "sbatch: error: Batch job submission failed: Protocol authentication error",
        );
        assert!(matches!(munge, SlurmError::Unknown { .. }), "{munge}");
        let killed = classify("sbatch", "signal: 9 (SIGKILL); ");
        assert!(matches!(killed, SlurmError::Unknown { .. }), "{killed}");
        let denied = classify(
            "scancel",
            "scancel: error: Kill job error on job id 7: Access/permission denied",
        );
        assert!(matches!(denied, SlurmError::Refused { .. }), "{denied}");
    }
}
