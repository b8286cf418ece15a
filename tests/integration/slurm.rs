//! The Slurm submission (issue 24, `ptrain::slurm::batch`) against a real
//! Slurm: Debian's slurm-wlm 22.05 in the multi-node harness
//! (`tests/harness/slurm/boot.sh`: one slurmctld and two slurmd hosts,
//! each in a network namespace of its own with its own hostname, two fake
//! GPUs each). What `prepare` builds is submitted by `SlurmCommands`
//! (`sbatch` run as the job's owner, its environment emptied but
//! `SLURM_CONF`), as the backend will; each job's end is read from the
//! cluster's completion records (`jobcomp/script`, written by slurmctld
//! as root).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use ptrain::slurm::{
    prepare, DependencyKind, SlurmCommands, SlurmDependency, SlurmError, Submission,
};
use ptrain::spec::{parse_spec, JobSpec};
use ptrain::users::Owner;

use crate::daemon::{chown, ALICE, BOB};
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
        // Root's, not /tmp: slurmctld runs the state dir's jobcomp script
        // as root.
        let state = PathBuf::from(format!("/srv/ptrain-tests/{name}-cluster"));
        std::fs::create_dir_all("/srv/ptrain-tests").unwrap();
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

    /// Slurm's commands as ptraind runs them, for this cluster.
    fn commands(&self) -> SlurmCommands {
        SlurmCommands {
            slurm_conf: Some(self.conf.clone().into()),
            timeout: Duration::from_secs(30),
            ..SlurmCommands::default()
        }
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
            // Every task names its array, the one whose id is the
            // array's own too.
            .filter(|r| r.get("ARRAYJOBID").map(String::as_str) == Some(&id.to_string()))
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
/// ptrain id, host, uid, GPUs, home, and its `MSG`; then it sleeps 2 s,
/// so that what runs at once overlaps by the records' whole seconds.
fn reporting(id: &str, work: &Path, extra: &str) -> JobSpec {
    let line = r#"echo "$PTRAIN_JOB_ID $(hostname) $(id -u) ${CUDA_VISIBLE_DEVICES-none} $HOME [$MSG]" >> out; sleep 2"#;
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let commands = cluster.commands();
    let tokens = std::cell::Cell::new(0);
    let submit_to = |partition: &str,
                     members: &[&JobSpec],
                     max_parallel: Option<u32>,
                     after: &[SlurmDependency]| {
        tokens.set(tokens.get() + 1);
        let token = format!("t{}-{}", std::process::id(), tokens.get());
        let b = prepare(&Submission {
            members,
            array: max_parallel.is_some(),
            max_parallel,
            attempt: 1,
            token: &token,
            name: &format!("ptrain-{}", members[0].id.as_str()),
            owner: &owner,
            output: &output,
            partition: Some(partition),
            account: None,
            site_options: &[],
            after,
            begin_in: None,
        })
        .unwrap_or_else(|e| panic!("{e}"));
        rt.block_on(commands.submit_as(&owner, &b, &token))
    };
    let submit = |members: &[&JobSpec], max_parallel, after: &[SlurmDependency]| {
        submit_to("gpu", members, max_parallel, after)
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
        r#", "gpus": 1, "resources": {"memory": "300M", "cpus": 2}, "timeout": "10m""#,
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

    // More GPUs than any node has, a partition that does not exist: Slurm
    // refuses each at submit time, told with the fix.
    let greedy = reporting("greedy", &work, r#", "gpus": 3"#);
    let refused = submit(&[&greedy], None, &[]).unwrap_err().to_string();
    assert!(
        refused.contains("Requested node configuration is not available")
            && refused.contains("ask for less"),
        "{refused}"
    );
    let nowhere = reporting("nowhere", &work, "");
    match submit_to("no-such-partition", &[&nowhere], None, &[]) {
        Err(e @ SlurmError::Refused { .. }) => {
            assert!(e.to_string().contains("[cluster] partition"), "{e}")
        }
        other => panic!("a missing partition: {other:?}"),
    }
    // sbatch's answer is believed only when slurmctld says the job is the
    // owner's and carries the submission's token.
    let unconfirmed = {
        let b = prepare(&Submission {
            members: &[&nowhere],
            array: false,
            max_parallel: None,
            attempt: 1,
            token: "token-a",
            name: "ptrain-nowhere",
            owner: &owner,
            output: &output,
            partition: Some("gpu"),
            account: None,
            site_options: &["--hold".to_owned()],
            after: &[],
            begin_in: None,
        })
        .unwrap();
        rt.block_on(commands.submit_as(&owner, &b, "token-b"))
    };
    assert!(
        matches!(&unconfirmed, Err(SlurmError::Unknown { words, .. }) if words.contains("not ptrain-alice's job of this submission")),
        "{unconfirmed:?}"
    );
    // A stop: the owner's scancel ends the job; another user's is refused.
    let long = spec(&format!(
        r#"{{"version": 1, "id": "long", "command": ["sleep", "300"], "workdir": {work:?}}}"#
    ));
    let long_id = submit(&[&long], None, &[]).unwrap();
    let (bob_uid, bob_gid) = ensure_user(BOB);
    let bob = Owner {
        uid: bob_uid,
        gid: bob_gid,
        name: BOB.into(),
        home: work.clone(),
        groups: vec![],
    };
    let denied = rt.block_on(commands.cancel_as(&bob, long_id)).unwrap_err();
    assert!(matches!(denied, SlurmError::Refused { .. }), "{denied}");
    rt.block_on(commands.cancel_as(&owner, long_id)).unwrap();
    assert_eq!(cluster.wait_record(long_id)["JOBSTATE"], "CANCELLED");

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
    // Each job runs 2 s: a stage that did not wait would start with its
    // parent, not 2 s later.
    let at = |name: &str, key: &str| ended[name][key].parse::<u64>().unwrap();
    assert!(at("train", "START") >= at("prep", "END"));
    assert!(at("train", "START") >= at("prep", "START") + 2);
    assert!(at("eval", "START") >= at("train", "START") + 2);
    // The mapped options reached Slurm.
    assert_eq!(ended["train"]["PARTITION"], "gpu");
    assert_eq!(ended["train"]["LIMIT"], "00:10:00", "{:?}", ended["train"]);
    assert_eq!(ended["train"]["PROCS"], "2", "{:?}", ended["train"]);
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
    // The array: at most `max_parallel` tasks at once, and two tasks at
    // once on one node never on the same GPU (each task runs 2 s).
    let span = |t: &BTreeMap<String, String>| {
        let at = |k: &str| t[k].parse::<u64>().unwrap();
        (at("START"), at("END"))
    };
    for a in &tasks {
        let (a_start, a_end) = span(a);
        let alongside = tasks.iter().filter(|b| {
            let (b_start, b_end) = span(b);
            b_start < a_end && a_start < b_end
        });
        assert!(alongside.clone().count() <= 2, "max_parallel 2: {tasks:?}");
        for b in alongside.filter(|b| b["JOBID"] != a["JOBID"] && b["NODES"] == a["NODES"]) {
            let member = |t: &BTreeMap<String, String>| {
                members[t["ARRAYTASKID"].parse::<usize>().unwrap()]
                    .id
                    .as_str()
                    .to_owned()
            };
            assert_ne!(
                gpus_of(&member(a)),
                gpus_of(&member(b)),
                "{} and {} ran at once on {} on one GPU",
                member(a),
                member(b),
                a["NODES"]
            );
        }
    }
    drop(cluster);
    let _ = std::fs::remove_dir_all(&root);
}
