//! Issue 20: the NVML backend end to end without a GPU. ptraind runs with
//! `backend = "nvml"` and the real nvml-wrapper, which loads
//! `libnvidia-ml.so.1` by that name through the dynamic loader as on a GPU
//! host; inside the test's harness the loader finds the fake driver built
//! from tests/fake-nvml/fake_nvml.c, whose answers come from a state file
//! the test rewrites while ptraind runs.
//!
//! How the loader finds it: the harness's mount namespace gets its own
//! /etc/ld.so.cache (a bind mount over the host's file, which stays as it
//! is), made by ldconfig from the host's /etc/ld.so.conf plus the test's
//! driver directory. That is the path a real driver takes: its package
//! puts the library in a directory ldconfig knows and runs ldconfig, and
//! dlopen("libnvidia-ml.so.1") looks the name up in the cache. Nothing is
//! installed on the host, no unit gets an LD_LIBRARY_PATH, and ptraind's
//! unit runs with its shipped sandboxing. (Bind-mounting the library itself
//! into /usr/lib/x86_64-linux-gnu would need a file there to mount over,
//! that is, creating one on the host's root file system; an overlay over
//! that directory would work too, but needs overlayfs where the tests run.)
//! `Opts::fake_nvml` does all this (build_fake_driver, install_fake_driver
//! in tests/integration/daemon.rs).
//!
//! Jobs record the CUDA_VISIBLE_DEVICES they were given in `ID.gpus`;
//! "gated" jobs run until the test creates `ID.go` in their workdir.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::daemon::{text, write_fake_nvml_state, Opts, TestDaemon, ALICE, FAKE_NVML_DIR};
use crate::harness::wait_for;

/// How long a job waiting for a GPU that frees up without any event
/// ptraind could see (a foreign process ends, a GPU heals) may take to
/// start: ptraind plans again after any event (the test's own `ptrain`
/// calls are some) and, without any, every 30 s while GPU jobs wait on NVML
/// (GPU_REPLAN_INTERVAL in src/daemon.rs); plus a margin.
const REPLAN_WAIT: Duration = Duration::from_secs(50);

/// One GPU as the fake driver reports it.
#[derive(Clone)]
struct Gpu {
    name: &'static str,
    uuid: &'static str,
    pci: &'static str,
    total_mib: u64,
    used_mib: u64,
    util: u32,
    temp: u32,
    numa: u32,
    /// (pid, MiB) of compute processes.
    procs: Vec<(u32, u64)>,
    ecc_uncorrected: u64,
    lost: bool,
    /// (other index, NVML topology level): 10 one PCIe switch, 50 system.
    topo: Vec<(u32, u32)>,
}

impl Gpu {
    fn new(i: u32, name: &'static str, uuid: &'static str, total_mib: u64) -> Gpu {
        Gpu {
            name,
            uuid,
            pci: [
                "00000000:17:00.0",
                "00000000:65:00.0",
                "00000000:CA:00.0",
                "00000000:E3:00.0",
            ][i as usize],
            total_mib,
            used_mib: 300 + u64::from(i),
            util: 0,
            temp: 35,
            numa: i,
            procs: Vec::new(),
            ecc_uncorrected: 0,
            lost: false,
            topo: Vec::new(),
        }
    }
}

const UUID0: &str = "GPU-6f1c2a9e-0d3b-4c55-9a71-3e0f5b2c8d10";
const UUID1: &str = "GPU-b83e7d04-5a62-4f19-8c2d-71a9e6f03b22";
const UUID2: &str = "GPU-2c4d9e15-7b08-4a3f-b6e1-0d5c8f47a933";
const UUID3: &str = "GPU-d91a6b37-3e24-4c8b-a05f-9b2e7c16d844";

fn two_gpus() -> Vec<Gpu> {
    vec![
        Gpu::new(0, "NVIDIA H100 80GB HBM3", UUID0, 81559),
        Gpu::new(1, "NVIDIA A100-SXM4-40GB", UUID1, 40960),
    ]
}

fn render(gpus: &[Gpu]) -> String {
    let mut s = format!("driver 550.54.15\ncount {}\n", gpus.len());
    for (i, g) in gpus.iter().enumerate() {
        s.push_str(&format!(
            "{i} name {}\n{i} uuid {}\n{i} pci {}\n{i} minor {i}\n{i} memory {} {}\n\
             {i} util {} 0\n{i} temp {}\n{i} numa {}\n{i} ecc {}\n{i} lost {}\n",
            g.name,
            g.uuid,
            g.pci,
            g.total_mib,
            g.used_mib,
            g.util,
            g.temp,
            g.numa,
            g.ecc_uncorrected,
            u8::from(g.lost)
        ));
        for (pid, mib) in &g.procs {
            s.push_str(&format!("{i} proc {pid} {mib}\n"));
        }
        for (other, level) in &g.topo {
            s.push_str(&format!("{i} topo {other} {level}\n"));
        }
    }
    s
}

fn start(test: &str, gpus: &[Gpu], gpu_config: &str) -> TestDaemon {
    start_as(test, gpus, gpu_config, None)
}

fn start_as(
    test: &str,
    gpus: &[Gpu],
    gpu_config: &str,
    backend: Option<&'static str>,
) -> TestDaemon {
    TestDaemon::start_with(
        test,
        Opts {
            gpus: u32::try_from(gpus.len()).unwrap(),
            fake_nvml: Some(render(gpus)),
            gpu_config: gpu_config.to_owned(),
            gpu_backend: backend,
            ..Opts::default()
        },
    )
}

fn set_state(d: &TestDaemon, gpus: &[Gpu]) {
    write_fake_nvml_state(&d.root.join(FAKE_NVML_DIR), &render(gpus));
}

/// `ptrain gpus --json`: (backend, GPUs).
fn gpus_view(d: &TestDaemon) -> (String, Vec<Value>) {
    let out = d.ptrain(ALICE, &["gpus", "--json"]);
    assert!(out.status.success(), "ptrain gpus --json: {}", text(&out));
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        view["backend"].as_str().unwrap_or_default().to_owned(),
        view["gpus"].as_array().unwrap().clone(),
    )
}

/// A job asking for `gpus` (JSON text) that writes its CUDA_VISIBLE_DEVICES
/// to `ID.gpus`, then runs until `ID.go` exists when gated.
fn drop_job(d: &TestDaemon, id: &str, gpus: &str, gated: bool) {
    let wait = if gated {
        format!("while [ ! -e {id}.go ]; do sleep 0.05; done")
    } else {
        "true".to_owned()
    };
    let script = format!(
        "printf '%s' \"$CUDA_VISIBLE_DEVICES\" > {id}.gpus.tmp && mv {id}.gpus.tmp {id}.gpus; {wait}"
    );
    let job = serde_json::json!({
        "version": 1,
        "id": id,
        "command": ["/bin/sh", "-c", script],
        "workdir": d.workdir(ALICE),
        "gpus": serde_json::from_str::<Value>(gpus).unwrap(),
    });
    d.drop_job(ALICE, &format!("{id}.json"), &job.to_string());
}

/// The CUDA_VISIBLE_DEVICES job `id` recorded, once it has.
fn visible_devices(d: &TestDaemon, id: &str) -> String {
    let path: PathBuf = d.workdir(ALICE).join(format!("{id}.gpus"));
    wait_for(
        &format!("job {id} to write {}", path.display()),
        crate::daemon::WAIT,
        // The shell's redirect makes the file before printf fills it.
        || {
            std::fs::read_to_string(&path)
                .ok()
                .filter(|s| !s.is_empty())
        },
    )
}

/// A queued job the last plan looked at and left waiting.
fn wait_queued_with_reason(d: &TestDaemon, id: &str) -> String {
    wait_for(
        &format!("job {id} to be planned and left queued"),
        crate::daemon::WAIT,
        || {
            let s = d.status(id)?;
            assert_eq!(
                s["status"], "queued",
                "job {id} left the queue while its GPU should be unavailable: {s}"
            );
            s["detail"]
                .as_str()
                .filter(|why| !why.is_empty())
                .map(str::to_owned)
        },
    )
}

/// How many lines of ptraind's journal contain `needle`.
fn log_count(d: &TestDaemon, needle: &str) -> usize {
    d.daemon_log()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

#[test]
fn nvml_inventory_and_ptrain_gpus_match_the_driver() {
    let mut gpus = two_gpus();
    // Used memory under the 512 MiB foreign threshold: with no process
    // listed, used memory counts as other programs' use.
    gpus[0].used_mib = 211;
    gpus[0].util = 37;
    gpus[0].temp = 41;
    gpus[1].used_mib = 397;
    gpus[1].util = 5;
    gpus[1].temp = 33;
    let d = start("nvmlinv", &gpus, "");

    let (backend, view) = gpus_view(&d);
    assert_eq!(backend, "nvml", "{view:?}");
    assert_eq!(view.len(), 2, "{view:#?}");
    for (i, (g, want)) in view.iter().zip(&gpus).enumerate() {
        let ctx = format!("GPU {i} in ptrain gpus --json: {g:#}");
        assert_eq!(g["index"], i as u64, "{ctx}");
        assert_eq!(g["name"], want.name, "{ctx}");
        assert_eq!(g["uuid"], want.uuid, "{ctx}");
        assert_eq!(g["pci_bus_id"], want.pci, "{ctx}");
        assert_eq!(g["memory_total_mib"], want.total_mib, "{ctx}");
        assert_eq!(g["memory_used_mib"], want.used_mib, "{ctx}");
        assert_eq!(g["utilization_pct"], want.util, "{ctx}");
        assert_eq!(g["temperature_c"], want.temp, "{ctx}");
        assert_eq!(g["numa_node"], want.numa, "{ctx}");
        assert_eq!(g["device"], format!("/dev/nvidia{i}"), "{ctx}");
        assert_eq!(g["state"], "free", "{ctx}");
    }
    // The human table names the GPUs the driver reports.
    let out = d.ptrain(ALICE, &["gpus"]);
    let table = text(&out);
    assert!(
        out.status.success() && gpus.iter().all(|g| table.contains(g.uuid)),
        "{table}"
    );

    // Live: what the driver says now, not what it said at start.
    gpus[0].used_mib = 30000;
    gpus[0].util = 99;
    gpus[0].temp = 80;
    set_state(&d, &gpus);
    wait_for(
        "ptrain gpus to show GPU 0's new readings",
        crate::daemon::WAIT,
        || {
            let (_, view) = gpus_view(&d);
            (view[0]["memory_used_mib"] == 30000
                && view[0]["utilization_pct"] == 99
                && view[0]["temperature_c"] == 80)
                .then_some(())
        },
    );

    // Those 30000 MiB used, with no process listed, are other programs'
    // use: the job goes to GPU 1, by the UUID the driver reports, rather
    // than to the lowest index.
    let (_, view) = gpus_view(&d);
    assert_eq!(view[0]["state"], "busy-foreign", "{:#}", view[0]);
    drop_job(&d, "inv1", "1", false);
    assert_eq!(visible_devices(&d, "inv1"), UUID1);
    d.wait_ended("inv1");
}

#[test]
fn nvml_foreign_process_keeps_jobs_off_its_gpu_until_it_goes() {
    let mut gpus = two_gpus();
    gpus[0].total_mib = 16384;
    gpus[1].total_mib = 16384;
    // Another program (pid 4242, not a ptrain job) holds 8 GiB of GPU 1.
    gpus[1].procs = vec![(4242, 8192)];
    gpus[1].used_mib = 8192 + 301;
    let d = start("nvmlforeign", &gpus, "");

    let (_, view) = gpus_view(&d);
    assert_eq!(view[1]["state"], "busy-foreign", "{:#}", view[1]);
    assert_eq!(
        view[1]["processes"],
        serde_json::json!([{"pid": 4242, "used_memory_mib": 8192}]),
        "{:#}",
        view[1]
    );
    assert_eq!(view[0]["state"], "free", "{:#}", view[0]);

    // The first job goes to GPU 0 (GPU 1 is busy); the second has only
    // GPU 1 left, where others use 8 GiB, over the 512 MiB threshold: it
    // waits.
    drop_job(&d, "fg-a", "1", true);
    assert_eq!(visible_devices(&d, "fg-a"), UUID0);
    d.wait_running("fg-a");
    drop_job(&d, "fg-b", "1", false);
    let why = wait_queued_with_reason(&d, "fg-b");
    let (_, view) = gpus_view(&d);
    assert_eq!(view[1]["state"], "busy-foreign", "{:#}", view[1]);
    assert_eq!(
        d.status("fg-b").unwrap()["status"],
        "queued",
        "fg-b must wait while GPU 1 is in use by others ({why})"
    );

    // The foreign process ends: no event ptraind could wait on, so it finds
    // out at its next look, and fg-b starts on GPU 1.
    gpus[1].procs.clear();
    gpus[1].used_mib = 301;
    set_state(&d, &gpus);
    wait_for("fg-b to start once GPU 1 is free", REPLAN_WAIT, || {
        let s = d.status("fg-b")?;
        (s["status"] != "queued").then_some(())
    });
    assert_eq!(visible_devices(&d, "fg-b"), UUID1);
    std::fs::write(d.workdir(ALICE).join("fg-a.go"), "").unwrap();
    assert_eq!(d.wait_ended("fg-b")["status"], "succeeded");
    assert_eq!(d.wait_ended("fg-a")["status"], "succeeded");
}

#[test]
fn nvml_min_free_memory_counts_what_the_driver_says_is_used() {
    let mut gpus = two_gpus();
    gpus[0].total_mib = 16384;
    gpus[1].total_mib = 16384;
    // 8 GiB of GPU 0 in use by another program, under a raised foreign
    // threshold: GPU 0 may be shared, but has only about 7.7 GiB free.
    gpus[0].procs = vec![(4242, 8192)];
    gpus[0].used_mib = 8192 + 300;
    let d = start("nvmlminfree", &gpus, "foreign_memory_threshold_mib = 10240");
    let (_, view) = gpus_view(&d);
    assert_eq!(view[0]["state"], "free", "{:#}", view[0]);
    let big = r#"{"count": 1, "min_free_memory_mib": 12000}"#;

    // Needing 12 GiB free: GPU 1, not the lower index.
    drop_job(&d, "mf-big", big, true);
    assert_eq!(visible_devices(&d, "mf-big"), UUID1);
    d.wait_running("mf-big");
    // Needing no free memory: GPU 0, shared with the other program.
    drop_job(&d, "mf-small", "1", false);
    assert_eq!(visible_devices(&d, "mf-small"), UUID0);
    assert_eq!(d.wait_ended("mf-small")["status"], "succeeded");
    // Another 12 GiB job: GPU 1 is held, GPU 0 too full. It waits...
    drop_job(&d, "mf-big2", big, false);
    wait_queued_with_reason(&d, "mf-big2");
    // ...until the other program ends.
    gpus[0].procs.clear();
    gpus[0].used_mib = 300;
    set_state(&d, &gpus);
    wait_for("mf-big2 to start once GPU 0 has room", REPLAN_WAIT, || {
        let s = d.status("mf-big2")?;
        (s["status"] != "queued").then_some(())
    });
    assert_eq!(visible_devices(&d, "mf-big2"), UUID0);
    assert_eq!(d.wait_ended("mf-big2")["status"], "succeeded");
    std::fs::write(d.workdir(ALICE).join("mf-big.go"), "").unwrap();
    assert_eq!(d.wait_ended("mf-big")["status"], "succeeded");
}

#[test]
fn nvml_lost_or_ecc_gpu_leaves_the_pool_once_and_rejoins_when_healthy() {
    use crate::notifications::{HttpServer, Reply};
    let mut gpus = two_gpus();
    // Every job tells its owner's channel, by the admin's default.
    let hook = HttpServer::start(vec![], Reply::Status(200, "{}"));
    let d = TestDaemon::start_with(
        "nvmlhealth",
        Opts {
            gpus: 2,
            fake_nvml: Some(render(&gpus)),
            extra_config: format!(
                "[notify]\ninitial_backoff = \"200ms\"\ndefault_channels = [\"hook\"]\n\
                 [channels.hook]\nkind = \"webhook\"\nurl = \"{}\"\n",
                hook.url("/h")
            ),
            ..Opts::default()
        },
    );
    let gpu_lost = || -> Vec<Value> {
        hook.requests()
            .iter()
            .map(|r| r.json())
            .filter(|b| b["event"] == "gpu-lost")
            .collect()
    };
    let (_, view) = gpus_view(&d);
    assert!(view.iter().all(|g| g["state"] == "free"), "{view:#?}");
    let out_line = |i: u32, uuid: &str| format!("GPU {i} ({uuid}) taken out of the pool");
    let back_line =
        |i: u32, uuid: &str| format!("GPU {i} ({uuid}) is healthy again and back in the pool");

    // GPU 1 falls off the bus: every query answers NVML_ERROR_GPU_IS_LOST.
    gpus[1].lost = true;
    set_state(&d, &gpus);
    let detail = wait_for("GPU 1 to be shown unhealthy", crate::daemon::WAIT, || {
        let (_, view) = gpus_view(&d);
        (view[1]["state"] == "unhealthy").then(|| view[1]["detail"].as_str().unwrap().to_owned())
    });
    assert!(detail.contains("NVML cannot read"), "{detail}");
    // Still listed under the identity it had.
    let (_, view) = gpus_view(&d);
    assert_eq!(view[1]["uuid"], UUID1, "{:#}", view[1]);
    // A 2-GPU job cannot start while it is out.
    drop_job(&d, "hl-two", "2", false);
    wait_queued_with_reason(&d, "hl-two");
    for _ in 0..3 {
        gpus_view(&d);
    }
    wait_for(
        "the journal to say GPU 1 is out",
        crate::daemon::WAIT,
        || (log_count(&d, &out_line(1, UUID1)) > 0).then_some(()),
    );
    assert_eq!(
        log_count(&d, &out_line(1, UUID1)),
        1,
        "one entry however often the GPU is looked at:\n{}",
        d.daemon_log()
    );

    // Reset: it answers again, rejoins the pool, and the waiting job runs.
    gpus[1].lost = false;
    set_state(&d, &gpus);
    wait_for("GPU 1 to be free again", crate::daemon::WAIT, || {
        let (_, view) = gpus_view(&d);
        (view[1]["state"] == "free").then_some(())
    });
    gpus_view(&d);
    wait_for(
        "the journal to say GPU 1 is back",
        crate::daemon::WAIT,
        || (log_count(&d, &back_line(1, UUID1)) > 0).then_some(()),
    );
    assert_eq!(log_count(&d, &back_line(1, UUID1)), 1, "{}", d.daemon_log());
    wait_for("hl-two to start once GPU 1 is back", REPLAN_WAIT, || {
        let s = d.status("hl-two")?;
        (s["status"] != "queued").then_some(())
    });
    let visible = visible_devices(&d, "hl-two");
    assert_eq!(visible, format!("{UUID0},{UUID1}"));
    assert_eq!(d.wait_ended("hl-two")["status"], "succeeded");

    // GPU 0 reports uncorrected ECC errors under a running job: out with
    // the count, once, and the entry names the job (in its own journal
    // entries too), which ptraind leaves running.
    drop_job(&d, "hl-hold", "1", true);
    assert_eq!(visible_devices(&d, "hl-hold"), UUID0);
    d.wait_running("hl-hold");
    gpus[0].ecc_uncorrected = 2;
    set_state(&d, &gpus);
    let detail = wait_for("GPU 0 to be shown unhealthy", crate::daemon::WAIT, || {
        let (_, view) = gpus_view(&d);
        (view[0]["state"] == "unhealthy").then(|| view[0]["detail"].as_str().unwrap().to_owned())
    });
    assert!(detail.contains("2 uncorrected ECC error(s)"), "{detail}");
    let (_, view) = gpus_view(&d);
    assert_eq!(view[0]["held_by"], "hl-hold", "{:#}", view[0]);
    let reported = wait_for("the journal to name hl-hold", crate::daemon::WAIT, || {
        let log = d.harness.journal(&["PTRAIN_JOB=hl-hold"]);
        log.lines()
            .find(|l| l.contains(&out_line(0, UUID0)))
            .map(str::to_owned)
    });
    assert!(
        reported.contains("job hl-hold is running on it")
            && reported.contains("ptrain stop hl-hold"),
        "{reported}"
    );
    assert_eq!(d.status("hl-hold").unwrap()["status"], "running");
    // Its owner sees it where they look: the job's status, JSON and text.
    let said = format!(
        "GPU 0 ({UUID0}) left the pool while this job ran on it: 2 uncorrected ECC error(s)"
    );
    let warning = |who: &str| {
        let out = d.ptrain(who, &["status", "hl-hold", "--json"]);
        assert!(out.status.success(), "{}", text(&out));
        let s: Value = serde_json::from_slice(&out.stdout).unwrap();
        s["gpu_warning"].as_str().unwrap_or_default().to_owned()
    };
    let w = warning(ALICE);
    assert!(
        w.starts_with(&said) && w.contains("ptrain stop hl-hold"),
        "{w}"
    );
    let out = d.ptrain(ALICE, &["status", "hl-hold"]);
    assert!(
        text(&out).contains(&format!("GPU:       {said}")),
        "{}",
        text(&out)
    );
    std::fs::write(d.workdir(ALICE).join("hl-hold.go"), "").unwrap();
    assert_eq!(d.wait_ended("hl-hold")["status"], "succeeded");
    // Still said once it ended (it may be why a job failed)...
    assert!(warning(ALICE).starts_with(&said));
    // ...and only of the job that held the GPU: hl-two ran on GPU 1 only
    // after it was back.
    assert_eq!(d.status("hl-two").unwrap().get("gpu_warning"), None);
    // Its owner's channel heard of it once, with the same words.
    let posted = wait_for("the gpu-lost notification", crate::daemon::WAIT, || {
        let posted = gpu_lost();
        (!posted.is_empty()).then_some(posted)
    });
    assert_eq!(posted.len(), 1, "{posted:#?}");
    assert_eq!(posted[0]["job_id"], "hl-hold", "{:#}", posted[0]);
    assert_eq!(posted[0]["status"], "running", "{:#}", posted[0]);
    assert!(
        posted[0]["detail"].as_str().unwrap().starts_with(&said),
        "{:#}",
        posted[0]
    );
    let hold_end = wait_for(
        "the end of hl-hold to be posted",
        crate::daemon::WAIT,
        || {
            hook.requests()
                .iter()
                .map(|r| r.json())
                .find(|b| b["job_id"] == "hl-hold" && b["event"] == "succeeded")
        },
    );
    assert_eq!(hold_end["status"], "succeeded");
    // A 1-GPU job is placed on the healthy GPU 1, not the lower index.
    drop_job(&d, "hl-one", "1", false);
    assert_eq!(visible_devices(&d, "hl-one"), UUID1);
    assert_eq!(d.wait_ended("hl-one")["status"], "succeeded");
    for _ in 0..3 {
        gpus_view(&d);
    }
    wait_for(
        "the journal to say GPU 0 is out",
        crate::daemon::WAIT,
        || (log_count(&d, &out_line(0, UUID0)) > 0).then_some(()),
    );
    assert_eq!(log_count(&d, &out_line(0, UUID0)), 1, "{}", d.daemon_log());

    // The counter clears (the GPU was reset): back in, once.
    gpus[0].ecc_uncorrected = 0;
    set_state(&d, &gpus);
    wait_for("GPU 0 to be free again", crate::daemon::WAIT, || {
        let (_, view) = gpus_view(&d);
        (view[0]["state"] == "free").then_some(())
    });
    gpus_view(&d);
    wait_for(
        "the journal to say GPU 0 is back",
        crate::daemon::WAIT,
        || (log_count(&d, &back_line(0, UUID0)) > 0).then_some(()),
    );
    assert_eq!(log_count(&d, &back_line(0, UUID0)), 1, "{}", d.daemon_log());
    assert_eq!(log_count(&d, &out_line(1, UUID1)), 1, "{}", d.daemon_log());
    // However often GPU 0 was looked at since: still one.
    assert_eq!(gpu_lost().len(), 1, "{:#?}", gpu_lost());
    d.assert_alive();
}

#[test]
fn nvml_a_gpu_failing_under_a_job_is_noticed_with_nobody_asking() {
    use crate::notifications::{HttpServer, Reply};
    let mut gpus = two_gpus();
    let hook = HttpServer::start(vec![], Reply::Status(200, "{}"));
    let d = TestDaemon::start_with(
        "nvmlwatch",
        Opts {
            gpus: 2,
            fake_nvml: Some(render(&gpus)),
            extra_config: format!(
                "[notify]\ninitial_backoff = \"200ms\"\ndefault_channels = [\"hook\"]\n\
                 [channels.hook]\nkind = \"webhook\"\nurl = \"{}\"\n",
                hook.url("/h")
            ),
            ..Opts::default()
        },
    );
    drop_job(&d, "wt-hold", "1", true);
    assert_eq!(visible_devices(&d, "wt-hold"), UUID0);
    d.wait_running("wt-hold");
    // No job waits and nobody runs `ptrain gpus`: only ptraind's own look
    // at the GPUs its jobs hold can notice. Nothing here talks to ptraind
    // until the notification arrives.
    gpus[0].lost = true;
    set_state(&d, &gpus);
    let posted = wait_for(
        "the gpu-lost notification with nobody asking",
        REPLAN_WAIT,
        || {
            hook.requests()
                .iter()
                .map(|r| r.json())
                .find(|b| b["event"] == "gpu-lost")
        },
    );
    assert_eq!(posted["job_id"], "wt-hold", "{posted:#}");
    let detail = posted["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.starts_with(&format!(
            "GPU 0 ({UUID0}) left the pool while this job ran on it: NVML cannot read"
        )),
        "{detail}"
    );
    let line = format!("GPU 0 ({UUID0}) taken out of the pool");
    assert_eq!(log_count(&d, &line), 1, "{}", d.daemon_log());

    // A restart (once the notice is recorded as delivered): the warning is
    // in memory only, and comes back because GPU 0 is still out under the
    // job; the notification is in the job's record, and is not sent again.
    let key = "wt-hold.gpu-lost.hook";
    wait_for(
        &format!("{key} to be delivered"),
        crate::daemon::WAIT,
        || {
            let out = d.ptrain("root", &["notifications", "--json"]);
            let list: Vec<Value> = serde_json::from_slice(&out.stdout).ok()?;
            list.iter()
                .any(|n| n["key"] == key && n["state"] == "delivered")
                .then_some(())
        },
    );
    let (ok, out) = d.harness.systemctl(&["restart", "ptraind.service"]);
    assert!(ok, "restart: {out}");
    let again = wait_for(
        "wt-hold's GPU warning after the restart",
        crate::daemon::WAIT,
        || {
            let s = d.status("wt-hold")?;
            s["gpu_warning"].as_str().map(str::to_owned)
        },
    );
    // GPU 0 was unreadable before this ptraind ever saw it: it cannot say
    // which board, only which index and that NVML cannot identify it.
    assert!(
        again.starts_with(
            "GPU 0 (UUID unreadable) left the pool while this job ran on it: it is not in the inventory"
        ),
        "{again}"
    );
    assert_eq!(d.status("wt-hold").unwrap()["status"], "running");
    let lost: Vec<Value> = hook
        .requests()
        .iter()
        .map(|r| r.json())
        .filter(|b| b["event"] == "gpu-lost")
        .collect();
    assert_eq!(lost.len(), 1, "told once, restart or not: {lost:#?}");
    std::fs::write(d.workdir(ALICE).join("wt-hold.go"), "").unwrap();
    assert_eq!(d.wait_ended("wt-hold")["status"], "succeeded");
}

#[test]
fn nvml_gpu_health_reaches_a_stream_once_with_no_job_and_across_restarts() {
    use crate::notifications::{HttpServer, Reply};
    let mut gpus = two_gpus();
    let bus = HttpServer::start(vec![], Reply::Status(200, "{}"));
    let d = TestDaemon::start_with(
        "nvmlhostev",
        Opts {
            gpus: 2,
            fake_nvml: Some(render(&gpus)),
            extra_config: format!(
                "[notify]\ninitial_backoff = \"200ms\"\n\
                 [channels.bus]\nkind = \"webhook\"\nurl = \"{}\"\nformat = \"cloudevents\"\n\
                 events = [\"gpu-unhealthy\", \"gpu-healthy\"]\n",
                bus.url("/bus")
            ),
            ..Opts::default()
        },
    );
    let events = || -> Vec<Value> { bus.requests().iter().map(|r| r.json()).collect() };
    let wait_events = |n: usize, within: Duration| -> Vec<Value> {
        wait_for(&format!("{n} GPU health event(s)"), within, || {
            let e = events();
            (e.len() >= n).then_some(e)
        })
    };
    // No job runs and nobody asks: a stream that takes GPU health makes
    // ptraind look at an idle host's GPUs by itself.
    gpus[1].ecc_uncorrected = 2;
    set_state(&d, &gpus);
    let out = wait_events(1, REPLAN_WAIT);
    let e = &out[0];
    assert_eq!(e["type"], "org.ptrain.host.gpu-unhealthy", "{e:#}");
    assert_eq!(e["subject"], format!("gpu/{UUID1}"));
    assert_eq!(e["data"]["gpus"][0]["index"], 1);
    assert_eq!(e["data"]["owner"], "root");
    let detail = e["data"]["detail"].as_str().unwrap();
    assert!(detail.contains("ECC"), "{detail}");
    let id = e["id"].as_str().unwrap().to_owned();
    assert!(
        id.starts_with("gpu-unhealthy.") && id.ends_with(&format!("-{UUID1}.bus")),
        "{id}"
    );
    // Back: told at the next look (`ptrain gpus` is one).
    gpus[1].ecc_uncorrected = 0;
    set_state(&d, &gpus);
    wait_for("GPU 1 back in the pool", crate::daemon::WAIT, || {
        (gpus_view(&d).1[1]["state"] != "unhealthy").then_some(())
    });
    let out = wait_events(2, crate::daemon::WAIT);
    assert_eq!(
        out[1]["type"], "org.ptrain.host.gpu-healthy",
        "{:#}",
        out[1]
    );
    assert_eq!(out[1]["subject"], format!("gpu/{UUID1}"));

    // GPU 0 fails while ptraind is down; GPU 1 stays healthy. After the
    // start, GPU 0 is told once and GPU 1's earlier changes are not told
    // again (the ledger, not the fresh pool tracker, decides).
    let (ok, out) = d.harness.systemctl(&["stop", "ptraind.service"]);
    assert!(ok, "stop: {out}");
    gpus[0].ecc_uncorrected = 5;
    set_state(&d, &gpus);
    let (ok, out) = d.harness.systemctl(&["start", "ptraind.service"]);
    assert!(ok, "start: {out}");
    let out = wait_events(3, REPLAN_WAIT);
    assert_eq!(
        out[2]["type"], "org.ptrain.host.gpu-unhealthy",
        "{:#}",
        out[2]
    );
    assert_eq!(out[2]["subject"], format!("gpu/{UUID0}"));
    let ids: Vec<String> = wait_for("every event delivered", crate::daemon::WAIT, || {
        let list = crate::notifications::deliveries(&d);
        let ids: Vec<String> = list
            .iter()
            .filter(|v| v["state"] == "delivered")
            .map(|v| v["key"].as_str().unwrap().to_owned())
            .collect();
        (ids.len() == 3).then_some(ids)
    });
    // Delivered: a restart and more looks tell nothing again.
    let (ok, out) = d.harness.systemctl(&["restart", "ptraind.service"]);
    assert!(ok, "restart: {out}");
    for _ in 0..3 {
        gpus_view(&d);
    }
    d.assert_alive();
    // A sentinel after those looks: GPU 1 fails again. Anything they told
    // (wrongly) was handed to the sender before it, and comes first.
    gpus[1].ecc_uncorrected = 3;
    set_state(&d, &gpus);
    gpus_view(&d);
    let out = wait_events(4, REPLAN_WAIT);
    let last = &out[3];
    assert_eq!(
        last["type"], "org.ptrain.host.gpu-unhealthy",
        "told again before the sentinel: {out:#?}"
    );
    assert_eq!(last["subject"], format!("gpu/{UUID1}"), "{out:#?}");
    let posted: std::collections::BTreeSet<String> = out[..3]
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(posted.len(), 3, "told once each: {out:#?}");
    assert!(ids.iter().all(|k| posted.contains(k)), "{ids:?} {posted:?}");
    assert_ne!(last["id"], out[0]["id"], "a new change, a new id");
}

#[test]
fn nvml_topology_and_model_place_jobs() {
    // Four GPUs on one NUMA node; 0 and 2 share a PCIe switch, as do 1 and
    // 3; GPU 3 is the only A100.
    let mut gpus = vec![
        Gpu::new(0, "NVIDIA H100 80GB HBM3", UUID0, 81559),
        Gpu::new(1, "NVIDIA H100 80GB HBM3", UUID1, 81559),
        Gpu::new(2, "NVIDIA H100 80GB HBM3", UUID2, 81559),
        Gpu::new(3, "NVIDIA A100-SXM4-80GB", UUID3, 81920),
    ];
    for (i, g) in gpus.iter_mut().enumerate() {
        g.numa = 0;
        let i = u32::try_from(i).unwrap();
        g.topo = (i + 1..4)
            .map(|j| {
                (
                    j,
                    if (i, j) == (0, 2) || (i, j) == (1, 3) {
                        10
                    } else {
                        50
                    },
                )
            })
            .collect();
    }
    let d = start("nvmltopo", &gpus, "");
    let (_, view) = gpus_view(&d);
    let groups: Vec<&Value> = view.iter().map(|g| &g["topology_group"]).collect();
    assert_eq!(groups, [0, 1, 0, 1], "{view:#?}");

    // Two GPUs: the pair behind one switch, not the two lowest indices.
    drop_job(&d, "tp-pair", "2", true);
    assert_eq!(visible_devices(&d, "tp-pair"), format!("{UUID0},{UUID2}"));
    d.wait_running("tp-pair");
    // One A100: GPU 3, by the name the driver reports, not GPU 1.
    drop_job(&d, "tp-a100", r#"{"count": 1, "model": "A100"}"#, false);
    assert_eq!(visible_devices(&d, "tp-a100"), UUID3);
    assert_eq!(d.wait_ended("tp-a100")["status"], "succeeded");
    std::fs::write(d.workdir(ALICE).join("tp-pair.go"), "").unwrap();
    assert_eq!(d.wait_ended("tp-pair")["status"], "succeeded");
}

#[test]
fn nvml_numa_node_keeps_a_two_gpu_job_together_without_switch_topology() {
    // Four GPUs alternating between NUMA nodes 0 and 1, every pair joined
    // only through the system interconnect (NVML level 50): no PCIe switch
    // to go by, so the NUMA node is what keeps a job together. The two
    // lowest indices (0, 1) would straddle both nodes.
    let mut gpus = vec![
        Gpu::new(0, "NVIDIA H100 80GB HBM3", UUID0, 81559),
        Gpu::new(1, "NVIDIA H100 80GB HBM3", UUID1, 81559),
        Gpu::new(2, "NVIDIA H100 80GB HBM3", UUID2, 81559),
        Gpu::new(3, "NVIDIA H100 80GB HBM3", UUID3, 81559),
    ];
    for (i, g) in gpus.iter_mut().enumerate() {
        let i = u32::try_from(i).unwrap();
        g.numa = i % 2;
        g.topo = (i + 1..4).map(|j| (j, 50)).collect();
    }
    let d = start("nvmlnuma", &gpus, "");
    let (_, view) = gpus_view(&d);
    let nodes: Vec<&Value> = view.iter().map(|g| &g["numa_node"]).collect();
    assert_eq!(nodes, [0, 1, 0, 1], "{view:#?}");
    // No two GPUs share a switch: each is its own topology group.
    let groups: Vec<&Value> = view.iter().map(|g| &g["topology_group"]).collect();
    assert_eq!(groups, [0, 1, 2, 3], "{view:#?}");

    // Two GPUs on one node: 0 and 2.
    drop_job(&d, "nm-pair", "2", true);
    assert_eq!(visible_devices(&d, "nm-pair"), format!("{UUID0},{UUID2}"));
    d.wait_running("nm-pair");
    std::fs::write(d.workdir(ALICE).join("nm-pair.go"), "").unwrap();
    assert_eq!(d.wait_ended("nm-pair")["status"], "succeeded");

    // GPU 0 taken by a 1-GPU job: 1, 2 and 3 are free, and the lowest
    // pair (1, 2) would straddle the nodes again; node 1's 1 and 3 do not.
    drop_job(&d, "nm-one", "1", true);
    assert_eq!(visible_devices(&d, "nm-one"), UUID0);
    d.wait_running("nm-one");
    drop_job(&d, "nm-pair3", "2", false);
    assert_eq!(visible_devices(&d, "nm-pair3"), format!("{UUID1},{UUID3}"));
    assert_eq!(d.wait_ended("nm-pair3")["status"], "succeeded");
    std::fs::write(d.workdir(ALICE).join("nm-one.go"), "").unwrap();
    assert_eq!(d.wait_ended("nm-one")["status"], "succeeded");
}

#[test]
fn nvml_failing_to_initialise_with_backend_auto_falls_back_to_declared_once() {
    // The driver is there but answers NVML_ERROR_DRIVER_NOT_LOADED (9) to
    // nvmlInit_v2, as with the kernel module unloaded.
    let state = format!("init 9\n{}", render(&two_gpus()));
    let d = TestDaemon::start_with(
        "nvmlauto",
        Opts {
            gpus: 2,
            fake_nvml: Some(state),
            gpu_backend: Some("auto"),
            ..Opts::default()
        },
    );
    let (backend, view) = gpus_view(&d);
    assert_eq!(backend, "declared", "{view:#?}");
    // The declared GPUs (tests/integration/daemon.rs), not the driver's.
    assert_eq!(view.len(), 2, "{view:#?}");
    assert_eq!(view[0]["name"], "Test GPU", "{:#}", view[0]);
    drop_job(&d, "au-one", "1", false);
    assert_eq!(
        visible_devices(&d, "au-one"),
        "GPU-00000000-0000-4000-8000-000000000000"
    );
    assert_eq!(d.wait_ended("au-one")["status"], "succeeded");
    for _ in 0..3 {
        gpus_view(&d);
    }
    let said = "NVML is not available";
    wait_for(
        "the journal to say NVML is not available",
        crate::daemon::WAIT,
        || (log_count(&d, said) > 0).then_some(()),
    );
    let log = d.daemon_log();
    assert_eq!(log_count(&d, said), 1, "said once:\n{log}");
    let line = log.lines().find(|l| l.contains(said)).unwrap();
    assert!(
        line.contains("NVIDIA driver is not loaded"),
        "the warning gives NVML's answer: {line}"
    );
    assert!(
        line.contains("2 GPU(s) declared"),
        "and what it uses instead: {line}"
    );
}

#[test]
fn nvml_metrics_expose_memory_utilization_and_temperature() {
    let port = crate::test_server::free_port();
    let mut gpus = two_gpus();
    gpus[1].used_mib = 397;
    gpus[1].util = 64;
    gpus[1].temp = 58;
    let d = TestDaemon::start_with(
        "nvmlmetrics",
        Opts {
            gpus: 2,
            fake_nvml: Some(render(&gpus)),
            extra_config: format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
            ..Opts::default()
        },
    );
    let scrape = || {
        let (code, body) = crate::package::http_get(port, "/metrics").expect("scrape /metrics");
        assert_eq!(code, 200, "{body}");
        crate::package::samples(&body)
    };
    let series =
        |name: &str, i: usize, uuid: &str| format!("{name}{{gpu=\"{i}\",uuid=\"{uuid}\"}}");
    let s = scrape();
    let m = |name: &str| crate::package::metric(&s, &series(name, 1, UUID1));
    assert_eq!(m("ptrain_gpu_memory_total_bytes"), 40960.0 * 1048576.0);
    assert_eq!(m("ptrain_gpu_memory_used_bytes"), 397.0 * 1048576.0);
    assert_eq!(m("ptrain_gpu_utilization_ratio"), 0.64);
    assert_eq!(m("ptrain_gpu_temperature_celsius"), 58.0);

    // Read at scrape time: the next scrape has the driver's new readings.
    gpus[1].util = 3;
    gpus[1].temp = 71;
    set_state(&d, &gpus);
    let s = scrape();
    let m = |name: &str| crate::package::metric(&s, &series(name, 1, UUID1));
    assert_eq!(m("ptrain_gpu_utilization_ratio"), 0.03);
    assert_eq!(m("ptrain_gpu_temperature_celsius"), 71.0);
}

#[test]
fn nvml_driver_faults_leave_ptraind_alive_and_its_reports_sane() {
    // Three device nodes, two GPUs at first: the third appears later.
    let mut gpus = two_gpus();
    let mut state = render(&gpus);
    state.push_str("2 name NVIDIA H100 80GB HBM3\n2 memory 81559 300\n");
    let d = TestDaemon::start_with(
        "nvmlfaults",
        Opts {
            gpus: 3,
            fake_nvml: Some(state),
            ..Opts::default()
        },
    );
    let pid = d.unit_property("ptraind.service", "MainPID");
    let set = |gpus: &[Gpu], extra: &str, count: usize| {
        let mut state = render(gpus).replace(
            &format!("count {}\n", gpus.len()),
            &format!("count {count}\n"),
        );
        state.push_str(extra);
        write_fake_nvml_state(&d.root.join(FAKE_NVML_DIR), &state);
    };
    let view_until = |what: &str, pred: &dyn Fn(&[Value]) -> bool| -> Vec<Value> {
        wait_for(what, crate::daemon::WAIT, || {
            let (_, view) = gpus_view(&d);
            pred(&view).then_some(view)
        })
    };

    // Absurd values: more memory used than there is, 400 % utilization.
    gpus[0].used_mib = 100_000;
    gpus[0].util = 400;
    set(&gpus, "", 2);
    let view = view_until("GPU 0's absurd readings", &|v| {
        v[0]["state"] == "busy-foreign"
    });
    assert_eq!(
        view[0]["memory_used_mib"], 81559,
        "used capped at total: {:#}",
        view[0]
    );
    assert_eq!(view[0]["utilization_pct"], Value::Null, "{:#}", view[0]);
    gpus[0].used_mib = 300;
    gpus[0].util = 0;

    // One query fails on one device: an optional reading goes missing and
    // the GPU stays in the pool; its identity failing takes it out, until
    // it answers again.
    set(&gpus, "1 error temp 999\n", 2);
    let view = view_until("GPU 1 without a temperature", &|v| {
        v[1]["temperature_c"].is_null() && v[0]["state"] == "free"
    });
    assert_eq!(view[1]["state"], "free", "{:#}", view[1]);
    set(&gpus, "1 error uuid 999\n", 2);
    let view = view_until("GPU 1 out while its UUID is unreadable", &|v| {
        v[1]["state"] == "unhealthy"
    });
    assert_eq!(view[1]["uuid"], UUID1, "listed as it was: {:#}", view[1]);
    set(&gpus, "", 2);
    view_until("GPU 1 back", &|v| v[1]["state"] == "free");

    // The count changes between calls: a GPU appears, then goes away again
    // and stays listed, out of the pool.
    set(
        &gpus,
        "2 name NVIDIA H100 80GB HBM3\n2 memory 81559 300\n",
        3,
    );
    let view = view_until("GPU 2 to appear", &|v| {
        v.len() == 3 && v[2]["state"] == "free"
    });
    let uuid2 = view[2]["uuid"].as_str().unwrap().to_owned();
    set(&gpus, "", 2);
    let view = view_until("GPU 2 to be out", &|v| {
        v.len() == 3 && v[2]["state"] == "unhealthy"
    });
    assert_eq!(view[2]["uuid"], uuid2.as_str(), "{:#}", view[2]);
    assert!(
        view[2]["detail"]
            .as_str()
            .unwrap()
            .contains("no longer in the inventory"),
        "{:#}",
        view[2]
    );

    // GPU 1's UUID changes (another board answers at index 1): the new one
    // is listed and free; the old one is logged out once.
    gpus[1].uuid = "GPU-0e9d8c7b-6a59-4837-a261-5f4e3d2c1b0a";
    set(&gpus, "", 2);
    let view = view_until("the new GPU 1", &|v| v[1]["uuid"] == gpus[1].uuid);
    assert_eq!(view[1]["state"], "free", "{:#}", view[1]);
    assert!(
        view.iter().all(|g| g["uuid"] != UUID1),
        "the old board is not listed over it: {view:#?}"
    );
    gpus_view(&d);
    let gone = format!("GPU 1 ({UUID1}) taken out of the pool");
    wait_for(
        "the journal to say the old GPU 1 is out",
        crate::daemon::WAIT,
        || (log_count(&d, &gone) > 0).then_some(()),
    );
    // Once for the unreadable UUID above, once for the board that went.
    assert_eq!(log_count(&d, &gone), 2, "{}", d.daemon_log());

    // A job still runs, on a GPU the driver now reports.
    drop_job(&d, "ft-one", "1", false);
    assert_eq!(visible_devices(&d, "ft-one"), UUID0);
    assert_eq!(d.wait_ended("ft-one")["status"], "succeeded");
    d.assert_alive();
    assert_eq!(
        d.unit_property("ptraind.service", "MainPID"),
        pid,
        "ptraind did not restart"
    );
}

#[test]
fn nvml_idle_requires_gpu_idle_stops_a_silent_job_only_once_its_gpu_is_idle() {
    let mut gpus = two_gpus();
    gpus[0].util = 90;
    gpus[1].util = 1;
    let d = TestDaemon::start_with(
        "nvmlidle",
        Opts {
            gpus: 2,
            fake_nvml: Some(render(&gpus)),
            extra_config: "[jobs]\nidle_requires_gpu_idle = true\n".into(),
            ..Opts::default()
        },
    );
    let silent = |id: &str| {
        let job = serde_json::json!({
            "version": 1,
            "id": id,
            "command": ["/bin/sh", "-c",
                format!("printf '%s' \"$CUDA_VISIBLE_DEVICES\" > {id}.gpus; exec sleep 60")],
            "workdir": d.workdir(ALICE),
            "gpus": 1,
            "idle_timeout": "2s",
        });
        d.drop_job(ALICE, &format!("{id}.json"), &job.to_string());
    };
    // Both write nothing for their idle_timeout; GPU 0 (90 %) works, GPU 1
    // (1 %) does not.
    silent("id-busy");
    assert_eq!(visible_devices(&d, "id-busy"), UUID0);
    silent("id-idle");
    assert_eq!(visible_devices(&d, "id-idle"), UUID1);
    assert_eq!(d.wait_ended("id-idle")["status"], "idle-timeout");
    let let_run = "its GPUs are busy; letting it run";
    wait_for("ptraind to let id-busy run", crate::daemon::WAIT, || {
        d.harness
            .journal(&["PTRAIN_JOB=id-busy"])
            .contains(let_run)
            .then_some(())
    });
    assert_eq!(d.status("id-busy").unwrap()["status"], "running");
    // Its GPU goes quiet: the next idle window stops it.
    gpus[0].util = 2;
    set_state(&d, &gpus);
    assert_eq!(d.wait_ended("id-busy")["status"], "idle-timeout");
}

/// `make gpu-e2e` (packaging/gpu-e2e.sh), written for a machine with a
/// real GPU, run where CI can: against the fake driver (GPU_E2E_FAKE=1:
/// everything but PyTorch), so its harness, ptraind with `backend =
/// "nvml"`, the unprivileged job, the NVML process check, the waiting
/// second job and the report are exercised here. Every check it makes must
/// pass, or it exits 1.
#[test]
fn gpu_e2e_script_runs_against_the_fake_driver() {
    let script = crate::harness::repo_root().join("packaging/gpu-e2e.sh");
    let out = std::process::Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .unwrap();
    assert!(out.status.success(), "bash -n: {}", text(&out));
    // The script runs as root on a GPU host: shellcheck (installed by
    // tests/install-deps.sh) must find nothing in it.
    let out = std::process::Command::new("shellcheck")
        .arg(&script)
        .output()
        .expect("shellcheck (tests/install-deps.sh installs it)");
    assert!(out.status.success(), "shellcheck: {}", text(&out));

    let dir = PathBuf::from(format!("/srv/ptrain-tests/gpue2e-{}", std::process::id()));
    let bin = std::path::Path::new(crate::daemon::PTRAIN)
        .parent()
        .unwrap();
    let out = std::process::Command::new(&script)
        .env("GPU_E2E_FAKE", "1")
        .env("GPU_E2E_BIN", bin)
        .env("GPU_E2E_DIR", &dir)
        .env("GPU_E2E_TIMEOUT", "240")
        .env(
            "HARNESS_NAME",
            format!("ptrain-t-gpue2e-{}", std::process::id()),
        )
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let said = text(&out);
    assert!(out.status.success(), "gpu-e2e.sh failed:\n{said}");
    let report = &said[said
        .find("== gpu-e2e report")
        .unwrap_or_else(|| panic!("no report:\n{said}"))..];
    for check in [
        "PASS  ptraind started with backend = \"nvml\"",
        "PASS  inventory: ptrain gpus lists the driver's 1 GPU(s) by UUID",
        "PASS  e2e-train runs as ptrain-e2e on GPU 0",
        "PASS  NVML (ptrain gpus) shows the job's process on GPU 0: held by e2e-train; processes: pid ",
        "PASS  e2e-wait waits for the GPU: waiting for 1 GPU",
        "PASS  e2e-train succeeded; its result file: final loss 0.125 after 300 steps",
        "PASS  CUDA saw exactly 1 device, the assigned one",
        "PASS  e2e-wait ran after e2e-train",
        "result: ok",
    ] {
        assert!(
            report.contains(check),
            "the report lacks {check:?}:\n{said}"
        );
    }
    assert!(!report.contains("FAIL"), "{said}");
}

/// Without a driver (and without GPU_E2E_FAKE) it says so and exits 0, as
/// `make gpu-check` does, before it asks for root or touches anything.
#[test]
fn gpu_e2e_script_without_a_driver_says_so_and_exits_0() {
    if std::path::Path::new("/proc/driver/nvidia/version").exists() {
        eprintln!("this machine has an NVIDIA driver: nothing to check here");
        return;
    }
    let script = crate::harness::repo_root().join("packaging/gpu-e2e.sh");
    let out = std::process::Command::new(&script)
        .env_remove("GPU_E2E_FAKE")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let said = text(&out);
    if said.contains("libnvidia-ml") && !said.contains("no NVIDIA driver") {
        eprintln!("a libnvidia-ml.so.1 is in the loader cache: not a driverless machine");
        return;
    }
    assert!(
        out.status.success() && said.contains("gpu-e2e: no NVIDIA driver on this machine"),
        "{said}"
    );
}

#[test]
fn nvml_a_jobs_gpu_utilization_and_memory_are_sampled_while_it_runs_and_kept() {
    let mut gpus = two_gpus();
    // Both alike, so that whichever the job gets is at 80%; under
    // foreign_memory_threshold_mib (512), so that the job can have one.
    for gpu in &mut gpus {
        gpu.util = 80;
        gpu.used_mib = 400;
    }
    let d = TestDaemon::start_with(
        "nvmlsample",
        Opts {
            gpus: 2,
            fake_nvml: Some(render(&gpus)),
            extra_config: "[accounting]\ngpu_sample_interval = \"1s\"\n".into(),
            ..Opts::default()
        },
    );
    drop_job(&d, "busy", "1", true);
    let uuid = visible_devices(&d, "busy");
    let index = [UUID0, UUID1].iter().position(|u| *u == uuid).unwrap();
    d.wait_running("busy");
    // While it runs, its owner sees the figures so far.
    let samples_at_least = |n: u64, what: &str| {
        wait_for(what, crate::daemon::WAIT, || {
            let s = d.status("busy")?;
            let gpu = s["gpu_usage"].get(0)?.clone();
            (gpu["samples"].as_u64()? >= n).then_some(gpu)
        })
    };
    let first = samples_at_least(2, "two samples of busy's GPU at 80%");
    assert_eq!(first["index"], index, "{first}");
    assert_eq!(first["uuid"], uuid, "{first}");
    assert_eq!(first["util_avg_pct"], 80.0, "{first}");
    assert_eq!(first["mem_peak_mib"], 400, "{first}");
    // Another user does not.
    let out = d.ptrain(crate::daemon::BOB, &["status", "busy", "--json"]);
    let bobs: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(bobs.get("gpu_usage").is_none(), "{bobs}");
    // A restart of ptraind keeps them: the stop writes them to the record.
    let (ok, out) = d.harness.systemctl(&["restart", "ptraind.service"]);
    assert!(ok, "restart: {out}");
    // The restarted ptraind's first answer has them (its own sampling
    // could not have caught up yet: at most one look since its start).
    let back = wait_for(
        "ptraind back after the restart",
        crate::daemon::WAIT,
        || d.status("busy"),
    );
    let kept = &back["gpu_usage"][0];
    assert!(
        kept["samples"].as_u64() >= first["samples"].as_u64(),
        "{first} before the restart, {kept} after"
    );
    assert_eq!(kept["util_avg_pct"], 80.0, "{kept}");
    // The job gets quieter and uses more memory.
    gpus[index].util = 20;
    gpus[index].used_mib = 3000;
    set_state(&d, &gpus);
    let seen = first["samples"].as_u64().unwrap();
    let later = wait_for("samples at 20% and 3000 MiB", crate::daemon::WAIT, || {
        let s = d.status("busy")?;
        let gpu = s["gpu_usage"].get(0)?.clone();
        (gpu["samples"].as_u64()? >= seen + 2 && gpu["mem_peak_mib"] == 3000).then_some(gpu)
    });
    assert_eq!(later["util_peak_pct"], 80, "{later}");
    std::fs::write(d.workdir(ALICE).join("busy.go"), "").unwrap();
    let ended = d.wait_ended("busy");
    assert_eq!(ended["status"], "succeeded", "{ended}");
    let kept = &ended["gpu_usage"][0];
    let avg = kept["util_avg_pct"].as_f64().unwrap();
    assert!(avg > 20.0 && avg < 80.0, "{kept}");
    assert_eq!(kept["util_peak_pct"], 80, "{kept}");
    assert_eq!(kept["mem_peak_mib"], 3000, "{kept}");
    let mem_avg = kept["mem_avg_mib"].as_f64().unwrap();
    assert!(mem_avg > 400.0 && mem_avg < 3000.0, "{kept}");
    // The other GPU was not the job's: no figures of it.
    assert_eq!(ended["gpu_usage"].as_array().unwrap().len(), 1, "{ended}");
    let shown = text(&d.ptrain(ALICE, &["status", "busy"]));
    assert!(
        shown.contains(&format!("gpu usage: GPU {index}: utilization"))
            && shown.contains("peak 80%"),
        "{shown}"
    );
    // The accounting database has the run's average and peak.
    let row = wait_for("busy's accounting row", crate::daemon::WAIT, || {
        let out = d.ptrain(ALICE, &["history", "--json"]);
        let rows: Vec<Value> = serde_json::from_slice(&out.stdout).ok()?;
        rows.into_iter().find(|r| r["id"] == "busy")
    });
    assert_eq!(row["gpu_util_avg_pct"].as_f64(), Some(avg), "{row}");
    assert_eq!(row["gpu_mem_peak_mib"], 3000, "{row}");
    let out = d.ptrain(
        ALICE,
        &["history", "--format", "id,gpu_util,gpu_mem_peak", "--csv"],
    );
    let csv = text(&out);
    assert!(csv.contains(&format!("busy,{avg:.0}%,2.9 GiB")), "{csv}");
    // A job without GPUs is never sampled.
    let plain = serde_json::json!({"version": 1, "id": "plain", "command": ["true"],
                                   "workdir": d.workdir(ALICE)});
    d.drop_job(ALICE, "plain.json", &plain.to_string());
    let plain = d.wait_ended("plain");
    assert!(plain.get("gpu_usage").is_none(), "{plain}");
}
