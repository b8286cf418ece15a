//! The Slurm submission (issue 24, `ptrain::slurm::batch`) against a real
//! Slurm: Debian's slurm-wlm 22.05 in the multi-node harness
//! (`tests/harness/slurm/boot.sh`: one slurmctld and two slurmd hosts,
//! each in a network namespace of its own with its own hostname, two fake
//! GPUs each). What `batch` builds is submitted by `sbatch` run as the
//! job's owner (`setpriv`, an empty environment but `SLURM_CONF`), as the
//! backend will; each job's end is read from the cluster's completion
//! records (`jobcomp/script`, written by slurmctld as root).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use ptrain::slurm::{prepare, Batch, DependencyKind, SlurmDependency, Submission};
use ptrain::spec::{parse_spec, JobSpec};
use ptrain::users::Owner;

use crate::daemon::{chown, ALICE};
use crate::harness::{ensure_user, wait_for};

const HARNESS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/harness/slurm");

/// A booted cluster, torn down when dropped.
struct Cluster {
    name: String,
    state: PathBuf,
    conf: String,
}

impl Cluster {
    fn boot(name: &str) -> Cluster {
        assert!(
            Path::new("/usr/sbin/slurmctld").exists() && Path::new("/usr/sbin/munged").exists(),
            "slurm-wlm and munge are missing: bash tests/install-deps.sh installs them"
        );
        let state = PathBuf::from(format!("/tmp/{name}"));
        let teardown = || {
            Command::new(format!("{HARNESS}/teardown.sh"))
                .env("SLURM_HARNESS_NAME", name)
                .env("SLURM_HARNESS_STATE", &state)
                .stdin(Stdio::null())
                .output()
        };
        // A cluster a killed run left behind.
        let _ = teardown();
        let out = Command::new(format!("{HARNESS}/boot.sh"))
            .env("SLURM_HARNESS_NAME", name)
            .env("SLURM_HARNESS_STATE", &state)
            .stdin(Stdio::null())
            .output()
            .expect("run tests/harness/slurm/boot.sh");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "boot.sh failed ({}): {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let conf = stdout
            .lines()
            .find_map(|l| l.strip_prefix("export SLURM_CONF="))
            .map(|v| v.trim_matches(|c| c == '\'' || c == '"').to_owned())
            .unwrap_or_else(|| panic!("boot.sh printed no SLURM_CONF: {stdout}"));
        Cluster {
            name: name.to_owned(),
            state,
            conf,
        }
    }

    /// `sbatch` of `batch` as `user`, as the backend runs it: the id, or
    /// sbatch's words.
    fn sbatch_as(&self, user: &str, batch: &Batch) -> Result<u64, String> {
        let mut child = Command::new("setpriv")
            .args(["--reuid", user, "--regid", user, "--init-groups", "--"])
            .arg("sbatch")
            .args(&batch.args)
            .env_clear()
            .env("SLURM_CONF", &self.conf)
            .env("PATH", "/usr/bin:/bin")
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run sbatch");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(batch.script.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!("{text}{}", String::from_utf8_lossy(&out.stderr)));
        }
        // `--parsable`: `ID` or `ID;CLUSTER`.
        text.trim()
            .split(';')
            .next()
            .and_then(|id| id.parse().ok())
            .ok_or_else(|| format!("sbatch's answer is no job id: {text:?}"))
    }

    /// The completion record of Slurm job `id` once slurmctld wrote it.
    fn record(&self, id: u64) -> Option<BTreeMap<String, String>> {
        let text =
            std::fs::read_to_string(self.state.join(format!("jobcomp/records/{id}"))).ok()?;
        Some(
            text.lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }

    /// The records of every task of array `id`, once there are `n`.
    fn array_records(&self, id: u64, n: usize) -> Option<Vec<BTreeMap<String, String>>> {
        let dir = std::fs::read_dir(self.state.join("jobcomp/records")).ok()?;
        let tasks: Vec<_> = dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
            .filter_map(|job| self.record(job))
            .filter(|r| {
                r.get("ARRAYJOBID").map(String::as_str) == Some(&id.to_string())
                    || (r.get("JOBID").map(String::as_str) == Some(&id.to_string())
                        && r.get("ARRAYJOBID").is_some_and(|a| a != "0"))
            })
            .collect();
        (tasks.len() == n).then_some(tasks)
    }

    fn wait_record(&self, id: u64) -> BTreeMap<String, String> {
        wait_for(
            &format!("the completion record of Slurm job {id}"),
            Duration::from_secs(60),
            || self.record(id),
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(format!("{HARNESS}/teardown.sh"))
            .env("SLURM_HARNESS_NAME", &self.name)
            .env("SLURM_HARNESS_STATE", &self.state)
            .stdin(Stdio::null())
            .output();
    }
}

fn spec(json: &str) -> JobSpec {
    parse_spec(json.as_bytes(), "job").unwrap_or_else(|e| panic!("{json}: {e}"))
}

/// What each job of the test writes, one line per job into `out`: its
/// ptrain id, host, uid, GPUs, and its `MSG`.
fn reporting(id: &str, work: &Path, extra: &str) -> JobSpec {
    let line = r#"echo "$PTRAIN_JOB $(hostname) $(id -u) ${CUDA_VISIBLE_DEVICES-none} $HOME [$MSG]" >> out"#;
    spec(&format!(
        r#"{{"version": 1, "id": "{id}", "command": ["sh", "-c", {line:?}],
            "workdir": {work:?}, "env": {{"MSG": "it's {id}"}} {extra}}}"#
    ))
}

#[test]
fn jobs_chains_and_a_sweep_run_on_slurm_as_their_owner_with_the_mapped_options() {
    let cluster = Cluster::boot("pt-slurm-batch");
    let (uid, gid) = ensure_user(ALICE);
    let root = PathBuf::from(format!(
        "/srv/ptrain-tests/slurm-batch-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    std::fs::set_permissions("/srv/ptrain-tests", std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let work = root.join("work");
    std::fs::create_dir_all(&work).unwrap();
    chown(&work, ALICE);
    let owner = Owner {
        uid,
        gid,
        name: ALICE.into(),
        home: work.clone(),
        groups: vec![],
    };
    let output = format!("{}/slurm-%j.out", work.display());
    let submit = |members: &[&JobSpec], max_parallel, after: &[SlurmDependency]| {
        let b = prepare(&Submission {
            members,
            max_parallel,
            name: &format!("ptrain-{}", members[0].id.as_str()),
            owner: &owner,
            output: &output,
            partition: Some("gpu"),
            account: None,
            site_options: &[],
            after,
            begin_in: None,
        })
        .unwrap_or_else(|e| panic!("{e}"));
        cluster.sbatch_as(ALICE, &b)
    };
    let after_ok = |job| {
        [SlurmDependency {
            kind: DependencyKind::Ok,
            job,
        }]
    };

    // A pipeline: preprocess, train on a GPU once it succeeded, evaluate.
    let prep = reporting("prep", &work, "");
    let train = reporting(
        "train",
        &work,
        r#", "gpus": 1, "resources": {"memory": "300M", "cpus": 1}, "timeout": "10m""#,
    );
    let eval = reporting("eval", &work, "");
    let prep_id = submit(&[&prep], None, &[]).unwrap();
    let train_id = submit(&[&train], None, &after_ok(prep_id)).unwrap();
    let eval_id = submit(&[&eval], None, &after_ok(train_id)).unwrap();
    // A failing stage fails its dependent: Slurm cancels it.
    let broken = spec(&format!(
        r#"{{"version": 1, "id": "broken", "command": ["sh", "-c", "exit 3"], "workdir": {work:?}}}"#
    ));
    let broken_id = submit(&[&broken], None, &[]).unwrap();
    let orphan = reporting("orphan", &work, "");
    let orphan_id = submit(&[&orphan], None, &after_ok(broken_id)).unwrap();
    // A 2x2 sweep, two at a time, a GPU each: one array.
    let base = reporting(
        "sw",
        &work,
        r#", "gpus": 1, "sweep": {"lr": ["0.1", "0.01"], "bs": ["32", "64"]}, "max_parallel": 2"#,
    );
    let sweep = base.sweep.clone().unwrap();
    let members: Vec<JobSpec> = ptrain::chain::expand(&base, &sweep)
        .into_iter()
        .map(|m| m.spec)
        .collect();
    let refs: Vec<&JobSpec> = members.iter().collect();
    let array_id = submit(&refs, sweep.max_parallel, &[]).unwrap();

    // More GPUs than any node has: Slurm refuses it at submit time.
    let greedy = reporting("greedy", &work, r#", "gpus": 3"#);
    let refused = submit(&[&greedy], None, &[]).unwrap_err();
    assert!(
        refused.contains("Requested node configuration is not available"),
        "{refused}"
    );

    let ended: BTreeMap<&str, BTreeMap<String, String>> = [
        ("prep", prep_id),
        ("train", train_id),
        ("eval", eval_id),
        ("broken", broken_id),
        ("orphan", orphan_id),
    ]
    .into_iter()
    .map(|(name, id)| (name, cluster.wait_record(id)))
    .collect();
    let tasks = wait_for(
        "the sweep's four array tasks' completion records",
        Duration::from_secs(60),
        || cluster.array_records(array_id, members.len()),
    );
    let state = |r: &BTreeMap<String, String>| r["JOBSTATE"].clone();
    for name in ["prep", "train", "eval"] {
        assert_eq!(
            state(&ended[name]),
            "COMPLETED",
            "{name}: {:?}",
            ended[name]
        );
        assert_eq!(
            ended[name]["UID"],
            uid.to_string(),
            "{name} ran as its owner"
        );
    }
    assert_eq!(state(&ended["broken"]), "FAILED");
    assert_eq!(ended["broken"]["EXITCODE"], "3:0");
    assert_eq!(
        state(&ended["orphan"]),
        "CANCELLED",
        "{:?}",
        ended["orphan"]
    );
    // Each stage started once its parent had ended (epoch seconds).
    let at = |name: &str, key: &str| ended[name][key].parse::<u64>().unwrap();
    assert!(at("train", "START") >= at("prep", "END"));
    assert!(at("eval", "START") >= at("train", "END"));
    // The mapped options reached Slurm.
    assert_eq!(ended["train"]["PARTITION"], "gpu");
    assert_eq!(ended["train"]["LIMIT"], "00:10:00", "{:?}", ended["train"]);
    for task in &tasks {
        assert_eq!(state(task), "COMPLETED", "{task:?}");
        assert_eq!(task["UID"], uid.to_string());
    }

    // What the jobs wrote: each member ran once, as its owner, on a node
    // of the cluster, a GPU job with the GPU Slurm gave it, the script's
    // variables and quoting intact.
    let out = std::fs::read_to_string(work.join("out")).unwrap();
    let mut ran: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in out.lines() {
        let words: Vec<String> = line.split(' ').map(str::to_owned).collect();
        ran.entry(words[0].clone())
            .or_default()
            .push(line.to_owned());
        assert_eq!(words[2], uid.to_string(), "{line}");
        assert!(
            words[1].starts_with("node"),
            "ran on a cluster node: {line}"
        );
        assert_eq!(words[4], work.display().to_string(), "{line}");
        // A sweep's members share its `env`.
        let msg = if words[0].starts_with("sw-") {
            "sw"
        } else {
            &words[0]
        };
        assert_eq!(words[5..].join(" "), format!("[it's {msg}]"), "{line}");
    }
    let expected: BTreeSet<String> = ["prep", "train", "eval"]
        .into_iter()
        .map(str::to_owned)
        .chain(members.iter().map(|m| m.id.as_str().to_owned()))
        .collect();
    assert_eq!(
        ran.keys().cloned().collect::<BTreeSet<_>>(),
        expected,
        "{out}"
    );
    assert!(
        ran.values().all(|lines| lines.len() == 1),
        "each ran once: {out}"
    );
    let gpus_of = |id: &str| ran[id][0].split(' ').nth(3).unwrap().to_owned();
    assert_eq!(gpus_of("prep"), "none", "a job without GPUs sees none");
    for id in std::iter::once("train").chain(members.iter().map(|m| m.id.as_str())) {
        let gpus = gpus_of(id);
        assert!(
            gpus == "0" || gpus == "1",
            "{id} got one of its node's two GPUs: {gpus}"
        );
    }
    drop(cluster);
    let _ = std::fs::remove_dir_all(&root);
}
