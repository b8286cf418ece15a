//! One job, or a sweep's members as one job array, as an `sbatch`
//! submission: its options and its batch script. Pure: the caller runs
//! `sbatch` (as the job's owner, never as root) with [`Batch::args`] and
//! the script on its standard input.
//!
//! Slurm's meanings are kept exactly, so a field is mapped only where
//! Slurm does the same thing; any other is refused with the field and
//! the reason ([`Unsupported`]), never dropped:
//!
//! | descriptor | sbatch |
//! |---|---|
//! | `gpus: N`, with `model` | `--gres=gpu:N`, `--gres=gpu:MODEL:N` (the site's gres type name, exact) |
//! | `resources.memory` | `--mem=KiB K` (rounded up to whole KiB) |
//! | `resources.cpus` | `--cpus-per-task=N` (whole CPUs only) |
//! | `timeout` | `--time=MINUTES` (whole minutes only: Slurm's limits are minutes) |
//! | `after_ok` / `after_fail` / `after_any` | `--dependency=afterok:ID/afternotok:ID/afterany:ID` (all must hold), `--kill-on-invalid-dep=yes` |
//! | a sweep, `max_parallel` | `--array=0-(N-1)%MAX`, one member per task |
//! | `priority` ≤ 0 | `--nice=-PRIORITY` (a user may only lower their own) |
//! | `hold` | `--hold` |
//! | `begin` | `--begin=now+SECONDS` |
//! | `workdir` | `--chdir`, and the script's `cd` (the owner's home by default): a workdir that cannot be entered fails the job with 200, as on the host, where Slurm would run it in `/tmp` |
//! | `env`, `command` | the batch script's `export` lines and `exec` |
//!
//! Every submission also carries `--no-requeue` (a job Slurm loses to a
//! node failure ends as such: it is never run twice behind ptrain's
//! back), `--comment=TOKEN` (the submission's own token: ptraind checks
//! as root that the job it was told of is the owner's and carries it,
//! and finds a submission again by it after a crash), `--export=ALL`
//! (of sbatch's own environment, which [`super::SlurmCommands`] empties:
//! `NONE` would make slurmd load the owner's login environment, and
//! make every `srun` inside the job drop the job's variables) and
//! `--parsable` (the answer is the job id). The script sets what a job
//! gets on the host: `HOME`, `USER`, `LOGNAME`, `PATH`, `PTRAIN_JOB_ID`,
//! `PTRAIN_ATTEMPT`, `PTRAIN_GPUS` (Slurm's GPU indices) and
//! `CUDA_DEVICE_ORDER=PCI_BUS_ID` for a GPU job (Slurm sets
//! `CUDA_VISIBLE_DEVICES`), then the descriptor's `env`.

use std::fmt::Write as _;
use std::time::Duration;

use crate::spec::JobSpec;
use crate::users::Owner;

/// The `PATH` a job starts with: systemd's default for units, which a
/// host job gets.
const JOB_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What one submission is made of. `members` is one job, or a sweep's
/// members in the sweep's order (array task `i` runs `members[i]`).
#[derive(Clone, Debug)]
pub struct Submission<'a> {
    pub members: &'a [&'a JobSpec],
    /// A sweep: a job array, even of one member.
    pub array: bool,
    /// The sweep's `max_parallel`: at most this many tasks at once.
    pub max_parallel: Option<u32>,
    /// The job's attempt (`PTRAIN_ATTEMPT`).
    pub attempt: u32,
    /// This submission's own token (`--comment`): letters, digits, `-`.
    pub token: &'a str,
    /// The name Slurm shows (`squeue`'s NAME): the job's or the sweep's id.
    pub name: &'a str,
    pub owner: &'a Owner,
    /// `sbatch --output`: where the job's output goes on the node, with
    /// Slurm's `%j`/`%A`/`%a` patterns.
    pub output: &'a str,
    /// The site's `[cluster]` settings.
    pub partition: Option<&'a str>,
    pub account: Option<&'a str>,
    /// The admin's own `sbatch` options, given before ptrain's: where both
    /// set one, ptrain's (the job's) wins, as the last of an option does.
    pub site_options: &'a [String],
    /// The parents still in Slurm's hands; a parent that has ended is
    /// settled by ptrain before the submission (its outcome known):
    /// Slurm counts a dependency on a job it no longer remembers (purged
    /// `MinJobAge` after its end) as satisfied, even a failed one.
    pub after: &'a [SlurmDependency],
    /// How long from now the job may start: its `begin`, resolved by the
    /// caller against its record and clock at each submission.
    pub begin_in: Option<Duration>,
}

/// A parent job in Slurm, and what of its end this job waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlurmDependency {
    pub kind: DependencyKind,
    /// Slurm's job id (an array's whole id for a sweep).
    pub job: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DependencyKind {
    /// `after_ok`: `afterok`.
    Ok,
    /// `after_fail`: `afternotok`.
    Fail,
    /// `after_any`: `afterany`.
    Any,
}

impl DependencyKind {
    fn slurm(self) -> &'static str {
        match self {
            DependencyKind::Ok => "afterok",
            DependencyKind::Fail => "afternotok",
            DependencyKind::Any => "afterany",
        }
    }
}

/// `sbatch`'s arguments (its program name not included) and the batch
/// script for its standard input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub args: Vec<String>,
    pub script: String,
}

/// A field Slurm cannot honour as the descriptor means it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}` cannot run on this host's Slurm cluster: {why}")]
pub struct Unsupported {
    pub field: &'static str,
    pub why: String,
}

fn refuse(field: &'static str, why: impl Into<String>) -> Unsupported {
    Unsupported {
        field,
        why: why.into(),
    }
}

/// Slurm's default `max_script_size`: a longer batch script is refused.
pub const MAX_SCRIPT_BYTES: usize = 4 << 20;

/// The submission of `s`, or the first field Slurm cannot honour.
pub fn prepare(s: &Submission) -> Result<Batch, Unsupported> {
    let Some(first) = s.members.first() else {
        return Err(refuse("sweep", "it has no members"));
    };
    for member in s.members {
        check_supported(member)?;
        if !same_but_command_and_env(first, member) {
            return Err(refuse(
                "sweep",
                "one job array runs members that differ only in `command` and `env`",
            ));
        }
    }
    if s.members.len() > 1 && !s.array {
        return Err(refuse("sweep", "its members go to Slurm as one job array"));
    }
    if first.begin.is_some() && s.begin_in.is_none() {
        return Err(refuse("begin", "it was not resolved to a delay"));
    }
    let token_ok = !s.token.is_empty()
        && s.token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if !token_ok {
        return Err(refuse(
            "id",
            "the submission's token is not letters, digits and `-`",
        ));
    }
    let mut args = vec!["--parsable".to_owned()];
    args.extend(s.site_options.iter().cloned());
    args.push(format!("--job-name={}", s.name));
    args.push(format!("--comment={}", s.token));
    if let Some(partition) = s.partition {
        args.push(format!("--partition={partition}"));
    }
    if let Some(account) = s.account {
        args.push(format!("--account={account}"));
    }
    let workdir = first
        .workdir
        .clone()
        .unwrap_or_else(|| s.owner.home.clone());
    args.push(format!("--chdir={}", workdir.display()));
    args.push(format!("--output={}", s.output));
    args.extend(["--no-requeue".to_owned(), "--export=ALL".to_owned()]);
    args.extend(resources(first));
    if first.priority < 0 {
        args.push(format!("--nice={}", -i64::from(first.priority)));
    }
    if first.hold {
        args.push("--hold".to_owned());
    }
    if let Some(delay) = s.begin_in {
        // Rounded up: a job never starts before its `begin`.
        let secs = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
        args.push(format!("--begin=now+{secs}"));
    }
    if !s.after.is_empty() {
        let all: Vec<String> = s
            .after
            .iter()
            .map(|d| format!("{}:{}", d.kind.slurm(), d.job))
            .collect();
        args.push(format!("--dependency={}", all.join(",")));
        // A parent whose end can no longer satisfy the dependency ends
        // this job at once, rather than leaving it pending for ever.
        args.push("--kill-on-invalid-dep=yes".to_owned());
    }
    if s.array {
        let last = s.members.len() - 1;
        args.push(match s.max_parallel {
            Some(max) => format!("--array=0-{last}%{max}"),
            None => format!("--array=0-{last}"),
        });
    }
    let script = script(s, &workdir);
    if script.len() > MAX_SCRIPT_BYTES {
        return Err(refuse(
            "sweep",
            format!(
                "its batch script would be {} bytes, over Slurm's max_script_size ({MAX_SCRIPT_BYTES}); split the sweep or shorten its `env`",
                script.len()
            ),
        ));
    }
    Ok(Batch { args, script })
}

/// Whether two members of a sweep are the same job but for what the
/// sweep substitutes (and their ids).
fn same_but_command_and_env(a: &JobSpec, b: &JobSpec) -> bool {
    let bare = |s: &JobSpec| JobSpec {
        id: a.id.clone(),
        command: Vec::new(),
        env: Default::default(),
        ..s.clone()
    };
    bare(a) == bare(b)
}

/// Refuses what Slurm cannot do as the descriptor means it.
fn check_supported(spec: &JobSpec) -> Result<(), Unsupported> {
    if spec.gpus.min_free_memory_mib.is_some() {
        return Err(refuse(
            "gpus.min_memory",
            "Slurm places jobs by its GPU count and type, not by free GPU memory; ask for a `model` instead",
        ));
    }
    if let Some(only) = &spec.gpus.only {
        let field = match only {
            crate::spec::GpuSelector::Indices(_) => "gpus.indices",
            crate::spec::GpuSelector::Uuids(_) => "gpus.uuids",
        };
        return Err(refuse(
            field,
            "Slurm chooses the GPUs on the node it picks; ask for a count (and a `model`)",
        ));
    }
    if let Some(model) = &spec.gpus.model {
        let token = !model.is_empty()
            && model
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if !token {
            return Err(refuse(
                "gpus.model",
                "on Slurm a model is the site's gres type name (letters, digits, `_`, `.`, `-`), e.g. \"a100\"; `sinfo -o %G` lists them",
            ));
        }
    }
    if spec.resources.tasks.is_some() {
        return Err(refuse(
            "resources.tasks",
            "sbatch has no per-job limit on processes; leave it out",
        ));
    }
    if spec.resources.millicpus.is_some_and(|m| m % 1000 != 0) {
        return Err(refuse(
            "resources.cpus",
            "Slurm gives whole CPUs (`--cpus-per-task`); give a whole number",
        ));
    }
    if spec
        .timeout
        .is_some_and(|t| t.is_zero() || t.as_secs() % 60 != 0 || t.subsec_nanos() != 0)
    {
        return Err(refuse(
            "timeout",
            "Slurm's time limits are whole minutes; give the timeout in whole minutes, e.g. \"90m\"",
        ));
    }
    if spec.priority > 0 {
        return Err(refuse(
            "priority",
            "on Slurm a user can only lower their own jobs' priority (`--nice`); give 0 or less, or ask the admin for a QOS",
        ));
    }
    let refused: [(&'static str, bool, &str); 7] = [
        (
            "idle_timeout",
            spec.idle_timeout.is_some(),
            "the job's output is written on the node Slurm picks, where ptraind does not watch it",
        ),
        (
            "retries",
            spec.retry.is_some(),
            "Slurm's requeue is not ptrain's retry (no count, no delay, no exit-code rule); leave it out",
        ),
        (
            "checkpoint_signal",
            spec.checkpoint.is_some(),
            "Slurm's `--signal` may come up to 60 s earlier than asked, so `checkpoint_lead` would not be kept; leave it out",
        ),
        (
            "stop_grace",
            spec.stop_grace.is_some(),
            "the time between SIGTERM and SIGKILL is the cluster's KillWait, not a job's",
        ),
        (
            "preemptible",
            spec.preemptible,
            "preemption on Slurm is the site's QOS and partition setting",
        ),
        (
            "image",
            spec.image.is_some(),
            "ptraind runs images on its own host only",
        ),
        (
            "credentials",
            !spec.credentials.is_empty(),
            "Slurm would carry the secrets in the job's environment or script, readable where ptraind's are not",
        ),
    ];
    if let Some((field, _, why)) = refused.into_iter().find(|(_, set, _)| *set) {
        return Err(refuse(field, why));
    }
    if let Some(name) = spec.env.keys().find(|k| k.starts_with("SLURM_")) {
        return Err(refuse(
            "env",
            format!("`{name}`: Slurm sets the SLURM_ variables of a job"),
        ));
    }
    // sbatch refuses a script with a carriage return before a line feed
    // ("DOS line breaks"), so none goes into one.
    let cr = |t: &String| t.contains('\r');
    if let Some(name) = spec.env.iter().find(|(_, v)| cr(v)).map(|(k, _)| k) {
        return Err(refuse(
            "env",
            format!("`{name}` holds a carriage return, which sbatch refuses in a batch script"),
        ));
    }
    if spec.command.iter().any(cr) {
        return Err(refuse(
            "command",
            "it holds a carriage return, which sbatch refuses in a batch script",
        ));
    }
    Ok(())
}

/// `--gres`, `--mem`, `--cpus-per-task`, `--time` of the job.
fn resources(spec: &JobSpec) -> Vec<String> {
    let mut args = Vec::new();
    if spec.gpus.count > 0 {
        args.push(match &spec.gpus.model {
            Some(model) => format!("--gres=gpu:{model}:{}", spec.gpus.count),
            None => format!("--gres=gpu:{}", spec.gpus.count),
        });
    }
    if let Some(bytes) = spec.resources.memory_bytes {
        args.push(format!("--mem={}K", bytes.div_ceil(1024)));
    }
    if let Some(millicpus) = spec.resources.millicpus {
        args.push(format!("--cpus-per-task={}", millicpus / 1000));
    }
    if let Some(timeout) = spec.timeout {
        args.push(format!("--time={}", timeout.as_secs() / 60));
    }
    args
}

/// The batch script: the owner's variables, then each member's own and
/// its command; a sweep picks its member by `SLURM_ARRAY_TASK_ID`.
fn script(s: &Submission, workdir: &std::path::Path) -> String {
    let mut out = String::from("#!/bin/sh\n");
    let _ = writeln!(
        out,
        "# ptrain: {}, submitted by ptraind",
        quote_comment(s.name)
    );
    let owner = s.owner;
    let _ = writeln!(
        out,
        "export HOME={} USER={} LOGNAME={} PATH={}",
        quote(&owner.home.display().to_string()),
        quote(&owner.name),
        quote(&owner.name),
        quote(JOB_PATH)
    );
    let _ = writeln!(out, "export PTRAIN_ATTEMPT={}", s.attempt);
    if s.members[0].gpus.count > 0 {
        out.push_str("export CUDA_DEVICE_ORDER=PCI_BUS_ID PTRAIN_GPUS=\"${SLURM_JOB_GPUS-}\"\n");
    }
    let dir = quote(&workdir.display().to_string());
    let _ = writeln!(
        out,
        "cd -- {dir} || {{ echo \"ptrain: cannot enter the workdir \"{dir} >&2; exit 200; }}"
    );
    match s.members {
        [one] if !s.array => out.push_str(&member(one)),
        members => {
            out.push_str("case \"${SLURM_ARRAY_TASK_ID-}\" in\n");
            for (i, spec) in members.iter().enumerate() {
                let _ = writeln!(out, "{i})");
                out.push_str(&member(spec));
                out.push_str(";;\n");
            }
            out.push_str(
                "*) echo \"ptrain: array task ${SLURM_ARRAY_TASK_ID-} is no member of this sweep\" >&2; exit 2;;\nesac\n",
            );
        }
    }
    out
}

/// One job's variables and its `exec`.
fn member(spec: &JobSpec) -> String {
    let mut out = format!("export PTRAIN_JOB_ID={}\n", quote(spec.id.as_str()));
    for (name, value) in &spec.env {
        // Names are checked by the descriptor: shell-safe as they are.
        let _ = writeln!(out, "export {name}={}", quote(value));
    }
    let argv: Vec<String> = spec.command.iter().map(|a| quote(a)).collect();
    let _ = writeln!(out, "exec {}", argv.join(" "));
    out
}

/// `text` as one single-quoted shell word.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// `text` made safe for a comment line: no line break can end it.
fn quote_comment(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse_spec as parse_job;

    fn owner() -> Owner {
        Owner {
            uid: 1001,
            gid: 1001,
            name: "alice".into(),
            home: "/home/alice".into(),
            groups: vec![],
        }
    }

    fn spec(json: &str) -> JobSpec {
        parse_job(json.as_bytes(), "job").unwrap()
    }

    fn submit(specs: &[&JobSpec], after: &[SlurmDependency]) -> Result<Batch, Unsupported> {
        let owner = owner();
        prepare(&Submission {
            members: specs,
            array: specs.len() > 1,
            max_parallel: None,
            attempt: 1,
            token: "t-1",
            name: "ptrain-train",
            owner: &owner,
            output: "/home/alice/ptrain-%j.out",
            partition: Some("gpu"),
            account: None,
            site_options: &["--qos=normal".to_owned()],
            after,
            begin_in: None,
        })
    }

    #[test]
    fn a_job_maps_to_slurms_options_with_the_same_meanings() {
        let s = spec(
            r#"{"version": 1, "id": "train", "command": ["python", "train.py"],
                "workdir": "/srv/work", "gpus": {"count": 2, "model": "a100"},
                "resources": {"memory": "1.5G", "cpus": 4}, "timeout": "90m",
                "priority": -5, "hold": true}"#,
        );
        let after = [
            SlurmDependency {
                kind: DependencyKind::Ok,
                job: 17,
            },
            SlurmDependency {
                kind: DependencyKind::Fail,
                job: 18,
            },
        ];
        let b = submit(&[&s], &after).unwrap();
        assert_eq!(
            b.args,
            [
                "--parsable",
                "--qos=normal",
                "--job-name=ptrain-train",
                "--comment=t-1",
                "--partition=gpu",
                "--chdir=/srv/work",
                "--output=/home/alice/ptrain-%j.out",
                "--no-requeue",
                "--export=ALL",
                "--gres=gpu:a100:2",
                "--mem=1572864K",
                "--cpus-per-task=4",
                "--time=90",
                "--nice=5",
                "--hold",
                "--dependency=afterok:17,afternotok:18",
                "--kill-on-invalid-dep=yes",
            ]
        );
        assert!(b.script.starts_with("#!/bin/sh\n"), "{}", b.script);
        assert!(
            b.script.contains("export PTRAIN_JOB_ID='train'\n"),
            "{}",
            b.script
        );
        assert!(
            b.script.ends_with("exec 'python' 'train.py'\n"),
            "{}",
            b.script
        );
    }

    #[test]
    fn the_script_quotes_what_the_user_wrote() {
        let s = spec(
            r#"{"version": 1, "id": "q", "command": ["sh", "-c", "echo '$HOME' `id`; x\ny"],
                "env": {"MSG": "it's $(rm -rf /)"}}"#,
        );
        let b = submit(&[&s], &[]).unwrap();
        assert!(
            b.script.contains("export MSG='it'\\''s $(rm -rf /)'\n"),
            "{}",
            b.script
        );
        assert!(
            b.script
                .contains("exec 'sh' '-c' 'echo '\\''$HOME'\\'' `id`; x\ny'\n"),
            "{}",
            b.script
        );
        // Run by a real shell, the words come back exactly.
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{}\nprintf '%s|' \"$MSG\"",
                b.script
                    .lines()
                    .filter(|l| l.starts_with("export"))
                    .collect::<Vec<_>>()
                    .join("\n")
            ))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "it's $(rm -rf /)|");
        // Without a workdir the job starts in its owner's home.
        assert!(b.args.contains(&"--chdir=/home/alice".to_owned()));
    }

    #[test]
    fn a_sweep_is_one_array_whose_tasks_run_its_members_in_order() {
        let base = spec(
            r#"{"version": 1, "id": "sw", "command": ["train", "--lr", "{lr}"],
                "sweep": {"lr": ["0.1", "0.01"]}, "max_parallel": 1, "gpus": 1, "workdir": "/"}"#,
        );
        let sweep = base.sweep.clone().unwrap();
        let members: Vec<JobSpec> = crate::chain::expand(&base, &sweep)
            .into_iter()
            .map(|m| m.spec)
            .collect();
        let refs: Vec<&JobSpec> = members.iter().collect();
        let owner = owner();
        let b = prepare(&Submission {
            members: &refs,
            array: true,
            max_parallel: sweep.max_parallel,
            attempt: 1,
            token: "t-2",
            name: "ptrain-sw",
            owner: &owner,
            output: "/home/alice/ptrain-%A_%a.out",
            partition: None,
            account: None,
            site_options: &[],
            after: &[],
            begin_in: Some(Duration::from_millis(1500)),
        })
        .unwrap();
        assert!(b.args.contains(&"--array=0-1%1".to_owned()), "{:?}", b.args);
        assert!(b.args.contains(&"--gres=gpu:1".to_owned()));
        assert!(b.args.contains(&"--begin=now+2".to_owned()));
        // Each task runs its own member, checked by a real shell.
        for (task, lr) in [("0", "0.1"), ("1", "0.01")] {
            let script = b
                .script
                .replace("exec ", "printf '%s ' \"$PTRAIN_JOB_ID\" ");
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(&script)
                .env("SLURM_ARRAY_TASK_ID", task)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.ends_with(&format!("train --lr {lr} ")), "{text}");
            assert!(
                text.starts_with(&format!(
                    "{} ",
                    members[task.parse::<usize>().unwrap()].id.as_str()
                )),
                "{text}"
            );
        }
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&b.script)
            .env("SLURM_ARRAY_TASK_ID", "7")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
    }

    #[test]
    fn a_workdir_that_cannot_be_entered_fails_the_job_as_on_the_host() {
        let s = spec(
            r#"{"version": 1, "id": "w", "command": ["true"], "workdir": "/nonexistent/ptrain-w"}"#,
        );
        let b = submit(&[&s], &[]).unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&b.script)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(200));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("cannot enter the workdir /nonexistent/ptrain-w"),
            "{err}"
        );
    }

    #[test]
    fn a_sweep_whose_members_differ_beyond_command_and_env_is_no_array() {
        let a = spec(r#"{"version": 1, "id": "a", "command": ["x"], "gpus": 1}"#);
        let b = spec(r#"{"version": 1, "id": "b", "command": ["y"], "gpus": 2}"#);
        let err = submit(&[&a, &b], &[]).unwrap_err();
        assert_eq!(err.field, "sweep", "{err}");
        let c =
            spec(r#"{"version": 1, "id": "c", "command": ["y"], "gpus": 1, "env": {"K": "v"}}"#);
        assert!(submit(&[&a, &c], &[]).is_ok());
        // A `begin` the caller did not resolve is not dropped.
        let later = spec(r#"{"version": 1, "id": "l", "command": ["x"], "begin": "1h"}"#);
        assert_eq!(submit(&[&later], &[]).unwrap_err().field, "begin");
    }

    #[test]
    fn what_slurm_cannot_honour_is_refused_naming_the_field() {
        let cases = [
            (r#""timeout": "90s""#, "timeout"),
            (r#""priority": 10"#, "priority"),
            (
                r#""gpus": {"count": 1, "min_memory": "10G"}"#,
                "gpus.min_memory",
            ),
            (r#""gpus": {"count": 1, "indices": [0]}"#, "gpus.indices"),
            (
                r#""gpus": {"count": 1, "model": "A100 80GB"}"#,
                "gpus.model",
            ),
            (r#""resources": {"cpus": 1.5}"#, "resources.cpus"),
            (r#""resources": {"tasks": 64}"#, "resources.tasks"),
            (r#""idle_timeout": "30m""#, "idle_timeout"),
            (r#""retries": 2"#, "retries"),
            (r#""stop_grace": "30s""#, "stop_grace"),
            (r#""preemptible": true"#, "preemptible"),
            (r#""image": "busybox:latest""#, "image"),
            (r#""env": {"SLURM_JOB_ID": "1"}"#, "env"),
            (r#""env": {"A": "x\r\ny"}"#, "env"),
            (
                r#""checkpoint_signal": "USR1", "checkpoint_lead": "60s""#,
                "checkpoint_signal",
            ),
        ];
        for (field, named) in cases {
            let json = format!(r#"{{"version": 1, "id": "x", "command": ["true"], {field}}}"#);
            let s = match parse_job(json.as_bytes(), "job") {
                Ok(s) => s,
                Err(e) => panic!("{json}: {e}"),
            };
            let err = submit(&[&s], &[]).unwrap_err();
            assert_eq!(err.field, named, "{json}: {err}");
            assert!(err.to_string().contains(named), "{err}");
        }
    }
}
