//! Issue 4: GPUs are shared fairly and never collide, against the real
//! systemd with four declared GPUs.
//!
//! Jobs record what they were given and when: `ID.start` holds the start
//! time (ns) and CUDA_VISIBLE_DEVICES, `ID.end` the end time. "Gated" jobs
//! run until the test creates `ID.go` in their workdir, so the order of
//! events is set by the test rather than by timing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;

use crate::daemon::{text, Opts, TestDaemon, ALICE, BOB, WAIT};
use crate::harness::wait_for;

/// A job asking for `gpus` (a count or an object, as JSON text).
fn job_json(id: &str, gpus: &str, gated: bool, workdir: &Path) -> String {
    let body = if gated {
        format!("while [ ! -e {id}.go ]; do sleep 0.05; done")
    } else {
        "sleep 0.3".to_owned()
    };
    let script = format!(
        "printf '%s %s\\n' \"$(date +%s%N)\" \"$CUDA_VISIBLE_DEVICES\" > {id}.start.tmp && mv {id}.start.tmp {id}.start; \
         {body}; date +%s%N > {id}.end.tmp && mv {id}.end.tmp {id}.end"
    );
    serde_json::json!({
        "version": 1,
        "id": id,
        "command": ["/bin/sh", "-c", script],
        "workdir": workdir,
        "gpus": serde_json::from_str::<Value>(gpus).unwrap(),
    })
    .to_string()
}

/// What one job recorded.
#[derive(Debug)]
struct Run {
    id: String,
    start: u128,
    end: u128,
    uuids: BTreeSet<String>,
}

fn read_run(workdir: &Path, id: &str) -> Run {
    let start = std::fs::read_to_string(workdir.join(format!("{id}.start")))
        .unwrap_or_else(|e| panic!("{id}.start: {e}"));
    let (t, cuda) = start
        .trim_end()
        .split_once(' ')
        .unwrap_or((start.trim(), ""));
    let end = std::fs::read_to_string(workdir.join(format!("{id}.end")))
        .unwrap_or_else(|e| panic!("{id}.end: {e}"));
    Run {
        id: id.to_owned(),
        start: t.parse().unwrap(),
        end: end.trim().parse().unwrap(),
        uuids: cuda
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
    }
}

/// No two runs that share a GPU overlap in time.
fn assert_no_overlap(runs: &[Run]) {
    for (i, a) in runs.iter().enumerate() {
        assert!(a.start <= a.end, "{a:?}");
        for b in &runs[i + 1..] {
            if a.uuids.is_disjoint(&b.uuids) {
                continue;
            }
            assert!(
                a.end <= b.start || b.end <= a.start,
                "{} and {} ran on the same GPU at the same time:\n{a:?}\n{b:?}",
                a.id,
                b.id
            );
        }
    }
}

fn gpus_json(d: &TestDaemon) -> Vec<Value> {
    let out = d.ptrain("root", &["gpus", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    view["gpus"].as_array().unwrap().clone()
}

/// GPU index → (state, job) as `ptrain gpus --json` shows them.
fn gpu_states(d: &TestDaemon) -> BTreeMap<u64, (String, String)> {
    gpus_json(d)
        .iter()
        .map(|g| {
            let job = g["held_by"]
                .as_str()
                .or(g["reserved_for"].as_str())
                .unwrap_or("-");
            (
                g["index"].as_u64().unwrap(),
                (g["state"].as_str().unwrap().to_owned(), job.to_owned()),
            )
        })
        .collect()
}

fn release(workdir: &Path, id: &str) {
    std::fs::write(workdir.join(format!("{id}.go")), "").unwrap();
}

fn status_of(d: &TestDaemon, id: &str) -> String {
    d.status(id)
        .map(|s| s["status"].as_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[test]
fn mixed_stream_never_overlaps_and_big_job_is_not_starved() {
    let d = TestDaemon::start_with(
        "gpumix",
        Opts {
            gpus: 4,
            ..Opts::default()
        },
    );
    let work = d.workdir(ALICE);
    let drop = |id: &str, gpus: &str, gated: bool| {
        d.drop_job(
            ALICE,
            &format!("{id}.json"),
            &job_json(id, gpus, gated, &work),
        );
    };

    // Fill the four GPUs with gated jobs: 1 + 1 + 2.
    drop("a1", "1", true);
    drop("a2", "1", true);
    drop("b1", "2", true);
    for id in ["a1", "a2", "b1"] {
        d.wait_running(id);
    }
    let states = gpu_states(&d);
    assert!(states.values().all(|(s, _)| s == "held"), "{states:?}");

    // The 4-GPU job arrives, then a stream of small jobs behind it.
    drop("big", "4", false);
    d.wait_status("big", |s| s == "queued");
    // (id, `gpus` as written, GPUs it gets)
    let later = [
        ("s1", "1", 1),
        ("s2", "1", 1),
        ("m1", "2", 2),
        ("s3", r#"{"count": 1}"#, 1),
        ("m2", r#"{"count": 2, "model": "test gpu"}"#, 2),
        ("s4", "1", 1),
    ];
    for (id, gpus, _) in later {
        drop(id, gpus, false);
        d.wait_status(id, |s| s == "queued");
    }

    // Each GPU that frees up is kept for the big job, not given to the
    // small jobs that could use it at once.
    release(&work, "a1");
    d.wait_ended("a1");
    let states = wait_for("a freed GPU to be reserved for big", WAIT, || {
        let s = gpu_states(&d);
        (s.values().filter(|(st, _)| st == "reserved").count() == 1).then_some(s)
    });
    assert!(
        states
            .values()
            .any(|(s, job)| s == "reserved" && job == "big"),
        "{states:?}"
    );
    for (id, _, _) in later {
        assert_eq!(status_of(&d, id), "queued", "{id} overtook the 4-GPU job");
    }
    release(&work, "a2");
    d.wait_ended("a2");
    wait_for("two GPUs reserved for big", WAIT, || {
        let s = gpu_states(&d);
        (s.values()
            .filter(|(st, j)| st == "reserved" && j == "big")
            .count()
            == 2)
            .then_some(())
    });
    for (id, _, _) in later {
        assert_eq!(status_of(&d, id), "queued", "{id} overtook the 4-GPU job");
    }
    // The table says the same.
    let table = text(&d.ptrain(ALICE, &["gpus"]));
    assert!(table.contains("STATE"), "{table}");
    assert_eq!(
        table
            .lines()
            .filter(|l| l.contains("reserved") && l.contains("big"))
            .count(),
        2,
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.contains("held") && l.contains("b1")),
        "{table}"
    );
    let big = d.status("big").unwrap();
    assert_eq!(big["status"], "queued");
    assert!(big["detail"].as_str().unwrap().contains("4 GPUs"), "{big}");

    release(&work, "b1");
    // Everything finishes.
    let mut all: Vec<&str> = vec!["a1", "a2", "b1", "big"];
    all.extend(later.iter().map(|(id, _, _)| *id));
    for id in &all {
        let s = d.wait_ended(id);
        assert_eq!(s["status"], "succeeded", "{id}: {s}");
    }

    let runs: Vec<Run> = all.iter().map(|id| read_run(&work, id)).collect();
    assert_no_overlap(&runs);
    let uuids_of = |id: &str| -> BTreeSet<String> {
        d.status(id).unwrap()["gpu_uuids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u.as_str().unwrap().to_owned())
            .collect()
    };
    let wanted: BTreeMap<&str, usize> = [("a1", 1), ("a2", 1), ("b1", 2), ("big", 4)]
        .into_iter()
        .chain(later.iter().map(|(id, _, n)| (*id, *n)))
        .collect();
    for run in &runs {
        // Each job saw exactly the GPUs ptraind recorded for it, as many
        // as it asked for.
        assert_eq!(run.uuids, uuids_of(&run.id), "{}", run.id);
        assert_eq!(run.uuids.len(), wanted[run.id.as_str()], "{run:?}");
    }
    // Not starved: every job that arrived after the big one started only
    // once it had finished (it held all four GPUs).
    let big = runs.iter().find(|r| r.id == "big").unwrap();
    for run in runs
        .iter()
        .filter(|r| later.iter().any(|(id, _, _)| *id == r.id))
    {
        assert!(
            run.start >= big.end,
            "{} started before the 4-GPU job finished: {run:?} vs {big:?}",
            run.id
        );
    }
    // Nothing is left reserved or held.
    let states = wait_for("all GPUs free", WAIT, || {
        let s = gpu_states(&d);
        s.values().all(|(st, _)| st == "free").then_some(s)
    });
    assert_eq!(states.len(), 4);
    d.assert_alive();
}

#[test]
fn policy_limits_a_user_and_impossible_requests_are_rejected() {
    let d = TestDaemon::start_with(
        "gpupolicy",
        Opts {
            gpus: 4,
            extra_config: format!("[policy.users.{ALICE}]\nmax_gpus = 1\n"),
            ..Opts::default()
        },
    );
    let work_a = d.workdir(ALICE);
    let work_b = d.workdir(BOB);

    // Requests that can never be met are refused at once, with the reason.
    d.drop_job(ALICE, "two.json", &job_json("two", "2", false, &work_a));
    let r = d.wait_rejected(ALICE, "two.json");
    let reason = r["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("policy.users.{ALICE}.max_gpus")),
        "{reason}"
    );
    d.drop_job(BOB, "five.json", &job_json("five", "5", false, &work_b));
    let r = d.wait_rejected(BOB, "five.json");
    assert!(r["reason"].as_str().unwrap().contains("only 4"), "{r}");
    d.drop_job(
        BOB,
        "a100.json",
        &job_json("a100", r#"{"count": 1, "model": "A100"}"#, false, &work_b),
    );
    let r = d.wait_rejected(BOB, "a100.json");
    assert!(
        r["reason"].as_str().unwrap().contains("`gpus.model`"),
        "{r}"
    );
    assert!(d.status("two").is_none() && d.status("five").is_none());

    // Alice may hold one GPU at once; bob is not held back by her queue.
    for id in ["al1", "al2", "al3"] {
        d.drop_job(
            ALICE,
            &format!("{id}.json"),
            &job_json(id, "1", true, &work_a),
        );
        d.wait_status(id, |s| s == "queued" || s == "launching" || s == "running");
    }
    for id in ["bo1", "bo2"] {
        d.drop_job(
            BOB,
            &format!("{id}.json"),
            &job_json(id, "1", true, &work_b),
        );
    }
    d.wait_running("al1");
    d.wait_running("bo1");
    d.wait_running("bo2");
    assert_eq!(status_of(&d, "al2"), "queued");
    assert_eq!(status_of(&d, "al3"), "queued");
    // Her waiting jobs reserve nothing: the fourth GPU stays free for others.
    let states = gpu_states(&d);
    let count = |state: &str| states.values().filter(|(s, _)| s == state).count();
    assert_eq!(
        (count("held"), count("free"), count("reserved")),
        (3, 1, 0),
        "{states:?}"
    );
    d.drop_job(BOB, "bo3.json", &job_json("bo3", "1", false, &work_b));
    assert_eq!(d.wait_ended("bo3")["status"], "succeeded");

    for id in ["al1", "al2", "al3"] {
        d.wait_running(id);
        let others: Vec<String> = ["al1", "al2", "al3"]
            .iter()
            .filter(|o| **o != id)
            .map(|o| status_of(&d, o))
            .collect();
        assert!(
            !others.iter().any(|s| s == "running" || s == "launching"),
            "alice runs two jobs at once: {id} and {others:?}"
        );
        release(&work_a, id);
        assert_eq!(d.wait_ended(id)["status"], "succeeded");
    }
    for id in ["bo1", "bo2"] {
        release(&work_b, id);
        assert_eq!(d.wait_ended(id)["status"], "succeeded");
    }
    let alice_runs: Vec<Run> = ["al1", "al2", "al3"]
        .iter()
        .map(|id| read_run(&work_a, id))
        .collect();
    for (i, a) in alice_runs.iter().enumerate() {
        for b in &alice_runs[i + 1..] {
            assert!(
                a.end <= b.start || b.end <= a.start,
                "alice's jobs overlapped: {a:?} {b:?}"
            );
        }
    }
    let mut runs = alice_runs;
    runs.extend(["bo1", "bo2", "bo3"].iter().map(|id| read_run(&work_b, id)));
    assert_no_overlap(&runs);
    d.assert_alive();
}

#[test]
fn under_a_cap_her_small_jobs_do_not_starve_her_big_one_and_status_says_why() {
    let d = TestDaemon::start_with(
        "gpucap",
        Opts {
            gpus: 6,
            extra_config: format!("[policy.users.{ALICE}]\nmax_gpus = 3\n"),
            ..Opts::default()
        },
    );
    let work_a = d.workdir(ALICE);
    let work_b = d.workdir(BOB);
    // Empty until the file is claimed (a dropped file is not yet a job).
    let detail = |id: &str| {
        d.status(id)
            .and_then(|s| s["detail"].as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    // She holds 2 of her 3 GPUs; there are 6, so GPUs are never short:
    // only her cap is.
    for id in ["a1", "a2"] {
        d.drop_job(
            ALICE,
            &format!("{id}.json"),
            &job_json(id, "1", true, &work_a),
        );
        d.wait_running(id);
    }
    d.drop_job(ALICE, "big.json", &job_json("big", "3", false, &work_a));
    let cap = format!("{ALICE} holds 2 GPUs of max_gpus = 3 (policy.users.{ALICE})");
    wait_for("big to say it waits for the cap", WAIT, || {
        (detail("big") == format!("waiting for 3 GPUs: {cap}")).then_some(())
    });
    // Her later 1-GPU job would fit in the cap today, but takes what big
    // needs once a1 and a2 end: it waits, and says for whom.
    d.drop_job(ALICE, "t1.json", &job_json("t1", "1", false, &work_a));
    wait_for("t1 to say it waits behind big", WAIT, || {
        (detail("t1")
            == format!(
                "waiting for 1 GPU: {cap}, and big, queued ahead of it, waits for 3 of them"
            ))
        .then_some(())
    });
    let shown = text(&d.ptrain(ALICE, &["status", "t1"]));
    assert!(shown.contains("big, queued ahead of it"), "{shown}");
    // Nobody else is held back, and no GPU is kept idle for her.
    d.drop_job(BOB, "b1.json", &job_json("b1", "1", false, &work_b));
    assert_eq!(d.wait_ended("b1")["status"], "succeeded");
    let states = gpu_states(&d);
    assert!(!states.values().any(|(s, _)| s == "reserved"), "{states:?}");

    release(&work_a, "a1");
    assert_eq!(d.wait_ended("a1")["status"], "succeeded");
    wait_for("big and t1 to see a1's GPU freed", WAIT, || {
        detail("big").contains("holds 1 GPU of").then_some(())
    });
    assert_eq!(
        status_of(&d, "t1"),
        "queued",
        "t1 took big's share of the cap"
    );
    release(&work_a, "a2");
    for id in ["a2", "big", "t1"] {
        assert_eq!(d.wait_ended(id)["status"], "succeeded", "{id}");
    }
    let big = read_run(&work_a, "big");
    let t1 = read_run(&work_a, "t1");
    assert_eq!(big.uuids.len(), 3, "{big:?}");
    assert!(
        t1.start >= big.end,
        "t1 started before big ended: {t1:?} {big:?}"
    );

    // A sweep member held back by max_parallel says so.
    let gate = "while [ ! -e $PTRAIN_JOB_ID.go ]; do sleep 0.05; done";
    let sweep = serde_json::json!({
        "version": 1, "command": ["/bin/sh", "-c", gate], "workdir": work_b,
        "sweep": {"n": [1, 2]}, "max_parallel": 1,
    });
    d.drop_job(BOB, "sw.json", &sweep.to_string());
    d.wait_running("sw-n1");
    wait_for("sw-n2 to name max_parallel", WAIT, || {
        detail("sw-n2")
            .contains("sweep sw runs at most 1 job(s) at once (its max_parallel)")
            .then_some(())
    });
    release(&work_b, "sw-n1");
    d.wait_running("sw-n2");
    release(&work_b, "sw-n2");
    assert_eq!(d.wait_ended("sw-n2")["status"], "succeeded");
    d.assert_alive();
}

#[test]
fn a_declared_gpu_without_its_device_node_is_reported_and_never_given() {
    // The harness makes /dev/nvidia0 and 1; the config declares a third.
    let d = TestDaemon::start_with(
        "gpu-nonode",
        Opts {
            gpus: 2,
            extra_config: "[[gpus.declared]]\nindex = 2\nuuid = \"GPU-00000002-0000-4000-8000-00000000dead\"\n\
                           name = \"Test GPU\"\nmemory_mib = 16384\ndevice = \"/dev/nvidia2\"\n"
                .into(),
            ..Opts::default()
        },
    );
    let states = gpu_states(&d);
    assert_eq!(states[&2].0, "unhealthy", "{states:?}");
    assert_eq!((&states[&0].0[..], &states[&1].0[..]), ("free", "free"));
    let missing = gpus_json(&d).into_iter().find(|g| g["index"] == 2).unwrap();
    assert!(missing.to_string().contains("/dev/nvidia2"), "{missing}");
    // Said at start, under the key to fix, by the checks --check-config runs.
    wait_for("the start-up warning about /dev/nvidia2", WAIT, || {
        d.harness
            .journal(&["-u", "ptraind.service"])
            .contains("warning: config")
            .then_some(())
    });
    let journal = d.harness.journal(&["-u", "ptraind.service"]);
    assert!(
        journal.contains("key `gpus.declared[0].device`")
            && journal.contains("/dev/nvidia2 does not exist"),
        "{journal}"
    );
    // A job asking for all three cannot have them; two it gets, never GPU 2.
    let work = d.root.join("work").join(ALICE);
    d.drop_job(ALICE, "two.json", &job_json("two", "2", false, &work));
    let status = d.wait_ended("two");
    assert_eq!(status["status"], "succeeded", "{status}");
    let given: BTreeSet<u64> = status["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_u64().unwrap())
        .collect();
    assert_eq!(given, BTreeSet::from([0, 1]), "{status}");
}
