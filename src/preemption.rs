//! Preemption, off unless the host sets `[policy] preempt = true`: which
//! running jobs a queued job that cannot start may stop. Pure: snapshots
//! in, a choice out; the state task stops the jobs chosen the way all of
//! ptraind's stops go (their checkpoint signal and lead first), and each
//! runs again as its next attempt.
//!
//! # The rule
//!
//! At each plan, the *urgent* job is the first GPU job in planning order
//! (priority, then arrival) that waits because the GPUs it may use are
//! busy: not for a `max_gpus` cap, not for GPUs other programs hold, not
//! behind GPUs kept for a job ahead of it. Its *candidates* are the
//! running jobs that are `"preemptible": true`, of a priority strictly
//! lower than its own, and not already being stopped. They are taken
//! lowest priority first, then the most recently started (the least work
//! lost), then by id, one at a time, until the urgent job would be placed
//! on the GPUs they free by the same placement rule as any job
//! ([`crate::scheduler::plan`], caps and selectors included); if even all
//! of them would not do, none is taken. While jobs stopped for it are on
//! their way out, no more are chosen for it.
//!
//! A preempted job is queued again as its next attempt (no retry used
//! up), under its own arrival, so it never loses its place to jobs that
//! arrived after it ([`crate::scheduler::Queue`]); one that ends with
//! success during its checkpoint lead has ended.

use std::collections::BTreeMap;

use crate::gpu::GpuInfo;
use crate::scheduler::{plan, Holder, Rules, Waiting};
use crate::spec::JobId;

/// A running job that may be stopped for the urgent one.
#[derive(Clone, Debug)]
pub struct Candidate<'a> {
    pub id: &'a JobId,
    pub priority: i32,
    pub started_at: u64,
    pub gpus: Vec<u32>,
}

/// The jobs to stop so that `urgent` can start (see the module's rule);
/// empty when `candidates` cannot free enough. `held` is every GPU a
/// ptrain job holds, the candidates' included.
pub fn victims(
    urgent: Waiting<'_>,
    candidates: &[Candidate<'_>],
    snapshot: &[GpuInfo],
    held: &BTreeMap<u32, Holder<'_>>,
    rules: Rules<'_>,
) -> Vec<JobId> {
    let mut order: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| c.priority < urgent.priority)
        .collect();
    order.sort_by(|a, b| {
        (a.priority, std::cmp::Reverse(a.started_at), a.id).cmp(&(
            b.priority,
            std::cmp::Reverse(b.started_at),
            b.id,
        ))
    });
    let mut freed = held.clone();
    let mut chosen = Vec::new();
    for candidate in order {
        for gpu in &candidate.gpus {
            freed.remove(gpu);
        }
        chosen.push(candidate.id.clone());
        if !plan(&[urgent], snapshot, &freed, rules)
            .placements
            .is_empty()
        {
            return chosen;
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::test_kit::gpu;
    use crate::policy::Policy;
    use crate::spec::GpuRequest;
    use crate::store::test_kit;

    fn id(s: &str) -> JobId {
        JobId::parse(s).unwrap()
    }

    struct Host {
        ids: Vec<JobId>,
        owner: crate::users::Owner,
        policy: Policy,
        snapshot: Vec<GpuInfo>,
    }

    impl Host {
        /// Four GPUs, each held by one of `r0`..`r3`.
        fn new() -> Host {
            Host {
                ids: (0..4).map(|i| id(&format!("r{i}"))).collect(),
                owner: test_kit::owner(1000, "alice"),
                policy: Policy::none(),
                snapshot: (0..4).map(gpu).collect(),
            }
        }

        fn held(&self) -> BTreeMap<u32, Holder<'_>> {
            self.ids
                .iter()
                .enumerate()
                .map(|(i, id)| {
                    (
                        i as u32,
                        Holder {
                            id,
                            owner: &self.owner,
                        },
                    )
                })
                .collect()
        }

        /// `r{i}` as a candidate of `priority`, started at `started`.
        fn candidate(&self, i: usize, priority: i32, started: u64) -> Candidate<'_> {
            Candidate {
                id: &self.ids[i],
                priority,
                started_at: started,
                gpus: vec![i as u32],
            }
        }

        fn victims(&self, urgent: &JobId, priority: i32, n: u32, c: &[Candidate]) -> Vec<String> {
            let request = GpuRequest::any(n);
            let waiting = Waiting {
                id: urgent,
                owner: &self.owner,
                priority,
                request: &request,
            };
            let rules = Rules {
                foreign_memory_threshold_mib: 1024,
                policy: &self.policy,
            };
            victims(waiting, c, &self.snapshot, &self.held(), rules)
                .iter()
                .map(|v| v.to_string())
                .collect()
        }
    }

    #[test]
    fn the_lowest_priority_then_the_newest_are_stopped_and_only_as_many_as_it_takes() {
        let host = Host::new();
        let urgent = id("urgent");
        let candidates = [
            host.candidate(0, 0, 100),
            host.candidate(1, -5, 100),
            host.candidate(2, 0, 300),
            host.candidate(3, 0, 200),
        ];
        assert_eq!(host.victims(&urgent, 10, 1, &candidates), ["r1"]);
        assert_eq!(host.victims(&urgent, 10, 2, &candidates), ["r1", "r2"]);
        assert_eq!(
            host.victims(&urgent, 10, 4, &candidates),
            ["r1", "r2", "r3", "r0"]
        );
    }

    #[test]
    fn nothing_is_stopped_for_a_job_of_equal_or_lower_priority_or_when_it_would_not_be_enough() {
        let host = Host::new();
        let urgent = id("urgent");
        let candidates = [host.candidate(0, 5, 100), host.candidate(1, 0, 100)];
        // Priority 5: only r1 (priority 0) is below it; one GPU is enough.
        assert_eq!(host.victims(&urgent, 5, 1, &candidates), ["r1"]);
        // Two GPUs would need r0 too, whose priority is not lower.
        assert!(host.victims(&urgent, 5, 2, &candidates).is_empty());
        assert!(host.victims(&urgent, 0, 1, &candidates).is_empty());
        // Jobs that are not candidates (r2, r3) are never chosen.
        assert!(host.victims(&urgent, 10, 3, &candidates).is_empty());
    }
}
