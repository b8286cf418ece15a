//! The pure core of scheduling: which queued jobs start now and on which
//! GPUs, and what a unit's end means. Values in, decisions out; no I/O.

use std::collections::BTreeSet;

use crate::gpu::{choose_gpus, GpuInfo};
use crate::spec::JobId;
use crate::store::Outcome;

/// A queued job as the planner sees it, in queue order.
#[derive(Clone, Debug)]
pub struct Waiting {
    pub id: JobId,
    pub gpus: u32,
}

/// A decision to start `id` on the GPUs with these indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub id: JobId,
    pub gpus: Vec<u32>,
}

/// Chooses the queued jobs that can start now, in queue order. A job whose
/// GPUs are not free waits; jobs behind it that fit may start (first fit).
/// `held` are the GPUs running ptrain jobs hold.
pub fn plan(
    queue: &[Waiting],
    snapshot: &[GpuInfo],
    held: &BTreeSet<u32>,
    foreign_memory_threshold_mib: u64,
) -> Vec<Placement> {
    let mut taken = held.clone();
    let mut placements = Vec::new();
    for job in queue {
        if job.gpus > 0 && taken.len() >= snapshot.len() {
            continue;
        }
        if let Some(gpus) = choose_gpus(snapshot, &taken, job.gpus, foreign_memory_threshold_mib) {
            taken.extend(gpus.iter().copied());
            placements.push(Placement {
                id: job.id.clone(),
                gpus,
            });
        }
    }
    placements
}

/// CLD_* codes systemd reports in ExecMainCode.
const CLD_EXITED: i32 = 1;
const CLD_KILLED: i32 = 2;
const CLD_DUMPED: i32 = 3;

/// What a unit's end means for the job. `stop_requested_by` is set when a
/// user asked to stop it (systemd then reports a clean SIGTERM).
pub fn outcome_of_unit(
    result: &str,
    exec_main_code: i32,
    exec_main_status: i32,
    stop_requested_by: Option<u32>,
) -> Outcome {
    if result == "timeout" {
        return Outcome::Timeout;
    }
    if let Some(by_uid) = stop_requested_by {
        return Outcome::Stopped { by_uid };
    }
    match exec_main_code {
        CLD_EXITED if exec_main_status == 0 && result == "success" => Outcome::Succeeded,
        CLD_EXITED => Outcome::Failed {
            exit_code: exec_main_status,
        },
        CLD_KILLED | CLD_DUMPED => Outcome::Killed {
            signal: exec_main_status,
        },
        _ => Outcome::LaunchFailed {
            reason: format!("systemd reports result {result:?} before the command ran"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32) -> GpuInfo {
        GpuInfo {
            index,
            uuid: format!("GPU-{index}"),
            name: "Test".into(),
            pci_bus_id: None,
            memory_total_mib: 1000,
            memory_used_mib: Some(0),
            utilization_pct: None,
            temperature_c: None,
            device: format!("/dev/nvidia{index}").into(),
            processes: vec![],
        }
    }

    fn waiting(id: &str, gpus: u32) -> Waiting {
        Waiting {
            id: JobId::parse(id).unwrap(),
            gpus,
        }
    }

    #[test]
    fn two_gpus_two_jobs_third_waits() {
        let snap = vec![gpu(0), gpu(1)];
        let queue = vec![waiting("a", 1), waiting("b", 1), waiting("c", 1)];
        let p = plan(&queue, &snap, &BTreeSet::new(), 512);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].gpus, vec![0]);
        assert_eq!(p[1].gpus, vec![1]);
        let held: BTreeSet<u32> = [0].into();
        let p = plan(&queue[2..], &snap, &held, 512);
        assert_eq!(
            p,
            vec![Placement {
                id: JobId::parse("c").unwrap(),
                gpus: vec![1]
            }]
        );
    }

    #[test]
    fn cpu_jobs_start_even_when_gpus_are_busy() {
        let snap = vec![gpu(0)];
        let held: BTreeSet<u32> = [0].into();
        let p = plan(&[waiting("g", 1), waiting("cpu", 0)], &snap, &held, 512);
        assert_eq!(
            p,
            vec![Placement {
                id: JobId::parse("cpu").unwrap(),
                gpus: vec![]
            }]
        );
    }

    #[test]
    fn outcomes() {
        assert_eq!(outcome_of_unit("success", 1, 0, None), Outcome::Succeeded);
        assert_eq!(
            outcome_of_unit("exit-code", 1, 3, None),
            Outcome::Failed { exit_code: 3 }
        );
        assert_eq!(
            outcome_of_unit("signal", 2, 9, None),
            Outcome::Killed { signal: 9 }
        );
        assert_eq!(
            outcome_of_unit("core-dump", 3, 11, None),
            Outcome::Killed { signal: 11 }
        );
        assert_eq!(outcome_of_unit("timeout", 2, 15, None), Outcome::Timeout);
        assert_eq!(
            outcome_of_unit("success", 2, 15, Some(7)),
            Outcome::Stopped { by_uid: 7 }
        );
        assert!(matches!(
            outcome_of_unit("resources", 0, 0, None),
            Outcome::LaunchFailed { .. }
        ));
    }
}
