//! What one plan decides, over the live jobs and a look at the GPUs: which
//! queued jobs start now and in what order, which can never start, and
//! what the rest wait for. Pure: [`crate::scheduler`] places the jobs; this
//! room reads them from [`Live`] (skipping those whose dependencies or
//! sweep hold them back), keeps within the units systemd can track, and
//! orders the launches. The look at the GPUs (NVML, or the declared list)
//! is the state task's, handed in as a function that is called only when a
//! GPU job may start and a unit may be started. The state task then
//! launches in the order given for as long as its pass's time allows, and
//! ends the never-startable.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::live::Live;
use crate::gpu::GpuInfo;
use crate::scheduler::{self, Holder, Placement, Rules, Wait, Waiting};
use crate::spec::JobId;

/// What a plan reads besides the live jobs.
pub(super) struct Situation<'a> {
    /// Queued jobs that may not start yet (dependencies, `max_parallel`).
    pub blocked: &'a HashSet<JobId>,
    /// Looks at the GPUs: `None` when the inventory could not be read
    /// (GPU jobs then wait, and none is judged impossible). Called at most
    /// once, and only when a queued job that is not blocked asks for GPUs.
    pub look_at_gpus: &'a mut dyn FnMut() -> Option<Vec<GpuInfo>>,
    pub rules: Rules<'a>,
    /// The GPUs (as [`scheduler::inventory_fingerprint`]) every queued job
    /// was last checked against for whether it can ever start.
    pub checked_against: Option<u64>,
    /// How many more jobs may be launched: the fewer of the references
    /// systemd can still track for ptraind ([`super::MAX_TRACKED_UNITS`])
    /// and the starts it may still have pending ([`super::MAX_STARTS_PENDING`]).
    pub room: usize,
    /// Launches per owner uid whose unit has not yet been seen running.
    pub starting_by_owner: &'a HashMap<u32, usize>,
    /// How many of those one owner may have: what one user's stuck starts
    /// (a workdir on a hung file system) can hold, so that the other
    /// users' jobs still start ([`super::MAX_STARTS_PER_OWNER`]).
    pub max_starts_per_owner: usize,
    /// `[policy] preempt`: the plan also chooses running jobs to stop for
    /// the urgent one ([`crate::preemption`]).
    pub preempt: bool,
    /// `[policy] fair_share`: each owner's factor ([`crate::fair_share`]);
    /// GPU jobs of equal priority are read highest factor first.
    pub fair_share: Option<&'a HashMap<u32, f64>>,
    /// Owners over their `gpu_hours` quota ([`crate::quota`]), with the
    /// reason: their GPU jobs wait, their other jobs do not.
    pub over_quota: &'a HashMap<u32, String>,
}

/// The queued GPU jobs in the order a plan reads them: planning order, or
/// fair-share order when it is on.
fn gpu_order<'a>(
    live: &'a Live,
    fair_share: Option<&'a HashMap<u32, f64>>,
) -> Box<dyn Iterator<Item = &'a JobId> + 'a> {
    match fair_share {
        Some(factors) => Box::new(live.queue().gpu_jobs_fair(factors)),
        None => Box::new(live.queue().gpu_jobs()),
    }
}

/// A plan's decisions, for the state task to carry out.
#[derive(Debug, Default)]
pub(super) struct Decision {
    /// Jobs to launch now, in planning order (priority, then arrival;
    /// with and without GPUs alike), at most the room there was.
    pub launches: Vec<Placement>,
    /// Jobs that can never start on these GPUs under this policy, with
    /// why: only judged on a readable inventory, and only when the GPUs
    /// differ from those last checked against.
    pub never: Vec<(JobId, String)>,
    /// Free GPUs kept for waiting jobs, for `ptrain gpus`.
    pub reserved: BTreeMap<u32, JobId>,
    /// What each GPU job read and not placed waits for, for `ptrain status`.
    pub waits: BTreeMap<JobId, Wait>,
    /// Some GPU job stays queued for GPUs (or for room, or for an
    /// unreadable inventory): an NVML inventory is looked at again later.
    pub gpu_jobs_wait: bool,
    /// What [`Situation::checked_against`] becomes.
    pub checked_against: Option<u64>,
    /// The GPUs as looked at, for naming the launches' GPUs (empty when
    /// not looked at or unreadable).
    pub gpus: Vec<GpuInfo>,
    /// The urgent job and the running jobs to stop for it
    /// ([`crate::preemption`]).
    pub preemption: Option<(JobId, Vec<JobId>)>,
}

/// Decides the plan; see the module documentation. `None` when no unit
/// may be started now: nothing is decided, and the last plan's
/// reservations and waits stand (the next unit's end plans again; a
/// flood that drains costs no pass over the queue per event).
pub(super) fn decide(live: &Live, situation: Situation<'_>) -> Option<Decision> {
    let Situation {
        blocked,
        look_at_gpus,
        rules,
        checked_against,
        room,
        starting_by_owner,
        max_starts_per_owner,
        preempt,
        fair_share,
        over_quota,
    } = situation;
    if live.queue().is_empty() {
        return Some(Decision {
            checked_against,
            ..Decision::default()
        });
    }
    if room == 0 {
        return None;
    }
    // Every job that asks for no GPUs starts; GPU jobs are read in
    // planning order only as far as GPUs are left to place or keep.
    let waiting = |id| {
        let r = &live[id];
        Waiting {
            id,
            owner: &r.owner,
            priority: r.spec.priority,
            request: &r.spec.gpus,
        }
    };
    let not_blocked = |id: &&JobId| !blocked.contains(*id);
    let may_use_gpus =
        |id: &&JobId| not_blocked(id) && !over_quota.contains_key(&live[*id].owner.uid);
    let mut gpu_jobs = gpu_order(live, fair_share)
        .filter(may_use_gpus)
        .map(waiting)
        .peekable();
    let wants_gpus = gpu_jobs.peek().is_some();
    let snapshot = if wants_gpus {
        look_at_gpus()
    } else {
        Some(Vec::new())
    };
    let fingerprint = snapshot
        .as_deref()
        .filter(|_| wants_gpus)
        .map(scheduler::inventory_fingerprint);
    let check_never = fingerprint.is_some() && fingerprint != checked_against;
    // Each GPU job placed takes a launch and may put its owner at their
    // share of starts ahead of one of their CPU jobs: the CPU jobs past
    // that many more than the room could not start in this plan anyway.
    let gpus_placeable = snapshot.as_deref().map_or(0, <[GpuInfo]>::len);
    let cpu_read = cpu_jobs_that_may_start(
        live,
        &not_blocked,
        starting_by_owner,
        max_starts_per_owner,
        room + gpus_placeable,
    );
    let cpu_jobs: Vec<Waiting> = cpu_read.ids.iter().map(|id| waiting(id)).collect();
    let held: BTreeMap<u32, Holder> = live
        .held()
        .iter()
        .filter_map(|(gpu, id)| {
            let r = live.get(id)?;
            Some((
                *gpu,
                Holder {
                    id,
                    owner: &r.owner,
                },
            ))
        })
        .collect();
    let plan = scheduler::plan_in_order(
        &cpu_jobs,
        gpu_jobs,
        snapshot.as_deref().unwrap_or(&[]),
        &held,
        rules,
        check_never,
    );
    let preemption = match (preempt, snapshot.as_deref()) {
        (true, Some(snapshot)) => preemption_of(
            live,
            &may_use_gpus,
            &plan,
            snapshot,
            &held,
            rules,
            fair_share,
        ),
        _ => None,
    };
    let mut launches = plan.placements;
    // Jobs with and without GPUs start in one planning order (by
    // priority alone under fair share: the plan's GPU order stands
    // within a priority).
    match fair_share {
        None => launches.sort_by_key(|p| live.queue().position(&p.id)),
        Some(_) => launches.sort_by_key(|p| live.queue().position(&p.id).map(|q| q.rank())),
    }
    // An owner at their share of pending starts waits for one of them to
    // run (each unit that runs or ends plans again).
    let mut starting = starting_by_owner.clone();
    let mut held_back = cpu_read.held_back;
    launches.retain(|p| {
        let count = starting.entry(live[&p.id].owner.uid).or_default();
        if *count >= max_starts_per_owner {
            held_back = true;
            return false;
        }
        *count += 1;
        true
    });
    // The rest start as these end (each end plans again).
    let over_room = launches.len() > room || cpu_read.more_left;
    launches.truncate(room);
    drop(cpu_jobs);
    Some(Decision {
        launches,
        // An unreadable inventory proves nothing impossible.
        never: if snapshot.is_some() {
            plan.never
        } else {
            Vec::new()
        },
        reserved: plan.reserved,
        waits: plan.waits,
        gpu_jobs_wait: plan.waiting_for_gpus || snapshot.is_none() || over_room || held_back,
        // An unreadable inventory checks everything again once it reads.
        checked_against: if wants_gpus {
            fingerprint
        } else {
            checked_against
        },
        gpus: snapshot.unwrap_or_default(),
        preemption,
    })
}

/// The CPU jobs a plan reads: see [`cpu_jobs_that_may_start`].
struct CpuJobsRead<'a> {
    /// In planning order.
    ids: Vec<&'a JobId>,
    /// Some job was passed over: its owner is at their share of starts.
    held_back: bool,
    /// Jobs past `most` were left unread.
    more_left: bool,
}

/// Up to `most` queued CPU jobs that are not blocked, in planning order,
/// passing over those whose owner is at their share of pending starts
/// (counting the jobs read before them). Every CPU job starts, so a plan
/// need read no further than it can launch: a burst of 10,000 queued jobs
/// cost each plan a pass, a sort and a lookup per job, most of ptraind's
/// time while it drained (`make bench`, `responsive.claim.10000`). A job
/// passed over costs a step of the queue, no lookup.
fn cpu_jobs_that_may_start<'a>(
    live: &'a Live,
    not_blocked: &dyn Fn(&&JobId) -> bool,
    starting_by_owner: &HashMap<u32, usize>,
    max_starts_per_owner: usize,
    most: usize,
) -> CpuJobsRead<'a> {
    let mut read = CpuJobsRead {
        ids: Vec::new(),
        held_back: false,
        more_left: false,
    };
    let mut starting: HashMap<u32, usize> = HashMap::new();
    for (id, uid) in live.queue().cpu_jobs_owned() {
        if !not_blocked(&id) {
            continue;
        }
        if read.ids.len() == most {
            read.more_left = true;
            break;
        }
        let count = starting
            .entry(uid)
            .or_insert_with(|| starting_by_owner.get(&uid).copied().unwrap_or(0));
        if *count >= max_starts_per_owner {
            read.held_back = true;
            continue;
        }
        *count += 1;
        read.ids.push(id);
    }
    read
}

/// The urgent job (the first waiting for busy GPUs, in planning order)
/// and the jobs to stop for it, by [`crate::preemption`]'s rule: none
/// while jobs stopped for it are still on their way out.
fn preemption_of(
    live: &Live,
    may_use_gpus: &dyn Fn(&&JobId) -> bool,
    plan: &scheduler::Plan,
    snapshot: &[GpuInfo],
    held: &BTreeMap<u32, Holder>,
    rules: Rules<'_>,
    fair_share: Option<&HashMap<u32, f64>>,
) -> Option<(JobId, Vec<JobId>)> {
    let waits = &plan.waits;
    let placed: HashSet<&JobId> = plan.placements.iter().map(|p| &p.id).collect();
    let never: HashSet<&JobId> = plan.never.iter().map(|(id, _)| id).collect();
    // The first GPU job not placed: it waits for busy GPUs (a wait of
    // its own, or none recorded because every GPU was taken before the
    // plan read it), for a cap, or for GPUs other programs hold.
    let urgent_id = gpu_order(live, fair_share)
        .filter(may_use_gpus)
        .find(|id| !placed.contains(*id) && !never.contains(*id))?;
    if !matches!(waits.get(urgent_id), None | Some(Wait::Busy { .. })) {
        return None;
    }
    let holders: HashSet<&JobId> = live.held().values().collect();
    let mut candidates = Vec::new();
    for holder in holders {
        let record = live.get(holder)?;
        if record.preempted_by.as_ref() == Some(urgent_id) {
            return None;
        }
        if record.state == crate::store::JobState::Running
            && record.spec.preemptible
            && record.stop_requested_by.is_none()
            && record.preempted_by.is_none()
        {
            candidates.push(crate::preemption::Candidate {
                id: holder,
                priority: record.spec.priority,
                started_at: record.started_at.unwrap_or(0),
                gpus: record.gpus.iter().map(|g| g.index).collect(),
            });
        }
    }
    let urgent = &live[urgent_id];
    let waiting = Waiting {
        id: urgent_id,
        owner: &urgent.owner,
        priority: urgent.spec.priority,
        request: &urgent.spec.gpus,
    };
    let victims = crate::preemption::victims(waiting, &candidates, snapshot, held, rules);
    (!victims.is_empty()).then(|| (urgent_id.clone(), victims))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::test_kit::gpu;
    use crate::policy::Policy;
    use crate::store::test_kit;

    /// Live jobs from `(id, descriptor extra, uid)`, queued in that order.
    fn live(jobs: &[(&str, &str, u32)]) -> Live {
        let mut live = Live::default();
        for (n, (id, extra, uid)) in jobs.iter().enumerate() {
            let json = format!(r#"{{"version": 1, "command": ["true"]{extra}}}"#);
            let owner = test_kit::owner(*uid, &format!("u{uid}"));
            live.queue_job(test_kit::record(&json, id, owner, n as u64 + 1));
        }
        live
    }

    /// `a` and `c` ask for no GPUs, `b` between them for one.
    fn a_gpu_job_between_two_cpu_jobs() -> Live {
        live(&[
            ("a", "", 1000),
            ("b", r#", "gpus": 1"#, 1000),
            ("c", "", 1000),
        ])
    }

    fn id(s: &str) -> JobId {
        JobId::parse(s).unwrap()
    }

    /// The plan over `live` with `blocked` held back, on `gpus` (`None`:
    /// unreadable), after `checked_against`, with `share`'s launches per
    /// owner pending of at most its limit each (`None`: none, no limit),
    /// under `fair_share`'s factors if any, with the owners `over_quota`;
    /// and how often it looked at the GPUs.
    #[allow(clippy::too_many_arguments)]
    fn plan(
        live: &Live,
        blocked: &[&str],
        gpus: Option<&[GpuInfo]>,
        checked_against: Option<u64>,
        room: usize,
        share: Option<(&HashMap<u32, usize>, usize)>,
        fair_share: Option<&HashMap<u32, f64>>,
        over_quota: &HashMap<u32, String>,
    ) -> (Option<Decision>, usize) {
        let none = HashMap::new();
        let (starting, max) = share.unwrap_or((&none, usize::MAX));
        let blocked: HashSet<JobId> = blocked.iter().map(|s| id(s)).collect();
        let policy = Policy::none();
        let mut looks = 0;
        let mut look = || {
            looks += 1;
            gpus.map(<[GpuInfo]>::to_vec)
        };
        let decision = decide(
            live,
            Situation {
                blocked: &blocked,
                look_at_gpus: &mut look,
                rules: Rules {
                    foreign_memory_threshold_mib: 512,
                    policy: &policy,
                },
                checked_against,
                room,
                starting_by_owner: starting,
                max_starts_per_owner: max,
                // No job is preemptible but where a test says so.
                preempt: true,
                fair_share,
                over_quota,
            },
        );
        (decision, looks)
    }

    /// `n` CPU jobs of `uid`, named `prefix0`, `prefix1`, …, for
    /// [`live_of`].
    fn many(prefix: &str, n: usize, uid: u32) -> Vec<(String, &'static str, u32)> {
        (0..n).map(|i| (format!("{prefix}{i}"), "", uid)).collect()
    }

    /// [`live`] over jobs whose ids were made at run time.
    fn live_of(jobs: &[(String, &'static str, u32)]) -> Live {
        let jobs: Vec<(&str, &str, u32)> =
            jobs.iter().map(|(i, e, u)| (i.as_str(), *e, *u)).collect();
        live(&jobs)
    }

    #[test]
    fn a_plan_reads_the_cpu_jobs_only_as_far_as_it_can_launch_and_skips_an_owner_at_their_share() {
        // Alice's GPU job, then 200 of her CPU jobs, then Bob's ten.
        let mut jobs = vec![("ag".to_string(), r#", "gpus": 1"#, 1000)];
        jobs.extend(many("a", 200, 1000));
        jobs.extend(many("b", 10, 1001));
        let live = live_of(&jobs);
        let gpus = [gpu(0)];
        let starting = HashMap::new();
        let no_quota = HashMap::new();
        let share = Some((&starting, 2));
        let (d, _) = plan(&live, &[], Some(&gpus), None, 3, share, None, &no_quota);
        let d = d.unwrap();
        // Her GPU job and one CPU job fill her share of two; Bob's first
        // job takes the last room, behind 199 of hers passed over.
        let ids: Vec<String> = started(&d).into_iter().map(|(id, _)| id).collect();
        assert_eq!(ids, ["ag", "a0", "b0"]);
        assert!(
            d.gpu_jobs_wait,
            "a plan is due again for the jobs held back"
        );
        // With one start of hers pending, her GPU job alone is hers.
        let starting = HashMap::from([(1000, 1)]);
        let (d, _) = plan(
            &live,
            &[],
            Some(&gpus),
            None,
            3,
            Some((&starting, 2)),
            None,
            &no_quota,
        );
        let ids: Vec<String> = started(&d.unwrap()).into_iter().map(|(id, _)| id).collect();
        assert_eq!(ids, ["ag", "b0", "b1"]);
        // No share limit: the first in the queue, as many as the room.
        let (d, _) = plan(&live, &[], Some(&gpus), None, 4, None, None, &no_quota);
        let ids: Vec<String> = started(&d.unwrap()).into_iter().map(|(id, _)| id).collect();
        assert_eq!(ids, ["ag", "a0", "a1", "a2"]);
        // Blocked jobs are passed over without counting.
        let (d, _) = plan(&live, &["a0", "a1"], None, None, 2, None, None, &no_quota);
        let ids: Vec<String> = started(&d.unwrap()).into_iter().map(|(id, _)| id).collect();
        assert_eq!(ids, ["a2", "a3"]);
        // What the plan read: as many as asked for, the rest left unread.
        let read = cpu_jobs_that_may_start(&live, &|_| true, &HashMap::new(), 2, 4);
        let ids: Vec<&str> = read.ids.iter().map(|id| id.as_str()).collect();
        assert_eq!(ids, ["a0", "a1", "b0", "b1"]);
        assert!(read.held_back && read.more_left);
    }

    /// Moves launched `job` on to running, started at `at`.
    fn run(live: &mut Live, job: &str, at: u64) {
        let record = live.get_mut(&id(job)).unwrap();
        record.state = crate::store::JobState::Running;
        record.started_at = Some(at);
    }

    #[test]
    fn preemption_stops_the_lowest_newest_preemptible_job_once_for_the_first_waiting_job() {
        let mut live = live(&[
            ("keep", r#", "gpus": 1"#, 1000),
            ("old", r#", "gpus": 1, "preemptible": true"#, 1000),
            ("new", r#", "gpus": 1, "preemptible": true"#, 1000),
            ("urgent", r#", "gpus": 1, "priority": 10"#, 1001),
            ("also", r#", "gpus": 1, "priority": 10"#, 1001),
        ]);
        for (n, job) in ["keep", "old", "new"].into_iter().enumerate() {
            launch(&mut live, job, &[n as u32]);
            run(&mut live, job, 100 + n as u64);
        }
        let gpus = [gpu(0), gpu(1), gpu(2)];
        let d = decide_on(&live, &[], Some(&gpus), 100);
        assert!(d.launches.is_empty());
        assert_eq!(d.preemption, Some((id("urgent"), vec![id("new")])));
        // Once `new` is on its way out for it, nothing more is chosen for
        // `urgent`, nor for `also` behind it.
        live.get_mut(&id("new")).unwrap().preempted_by = Some(id("urgent"));
        live.get_mut(&id("new")).unwrap().stop_requested_by = Some(0);
        assert_eq!(decide_on(&live, &[], Some(&gpus), 100).preemption, None);
        // A job held back by its dependencies is not the urgent one.
        live.get_mut(&id("new")).unwrap().preempted_by = None;
        live.get_mut(&id("new")).unwrap().stop_requested_by = None;
        let d = decide_on(&live, &["urgent"], Some(&gpus), 100);
        assert_eq!(d.preemption, Some((id("also"), vec![id("new")])));
    }

    fn decide_on(live: &Live, blocked: &[&str], gpus: Option<&[GpuInfo]>, room: usize) -> Decision {
        plan(live, blocked, gpus, None, room, None, None, &HashMap::new())
            .0
            .expect("room to start")
    }

    fn started(d: &Decision) -> Vec<(String, Vec<u32>)> {
        d.launches
            .iter()
            .map(|p| (p.id.to_string(), p.gpus.clone()))
            .collect()
    }

    /// Moves `job` to launching on `gpus`, as a launch does.
    fn launch(live: &mut Live, job: &str, gpus: &[u32]) {
        let job = id(job);
        let snapshot: Vec<GpuInfo> = gpus.iter().map(|&i| gpu(i)).collect();
        super::super::lifecycle::launching(live.get_mut(&job).unwrap(), gpus, &snapshot);
        live.launched(&job);
    }

    #[test]
    fn under_fair_share_the_owner_who_used_less_goes_first_among_equal_priorities() {
        let mut live = live(&[
            ("a1", r#", "gpus": 1"#, 1000),
            ("a2", r#", "gpus": 1"#, 1000),
            ("b1", r#", "gpus": 1"#, 1001),
            ("vip", r#", "gpus": 1, "priority": 3"#, 1000),
            ("cpu", "", 1000),
        ]);
        let gpus = [gpu(0), gpu(1)];
        let no_quota = HashMap::new();
        let decide_under = |live: &Live, factors: Option<&HashMap<u32, f64>>| {
            plan(live, &[], Some(&gpus), None, 100, None, factors, &no_quota)
                .0
                .unwrap()
        };
        let order = |live: &Live, factors: Option<&HashMap<u32, f64>>| -> Vec<String> {
            let d = decide_under(live, factors);
            started(&d).into_iter().map(|(id, _)| id).collect()
        };
        assert_eq!(order(&live, None), ["vip", "a1", "cpu"]);
        let alice_used_more: HashMap<u32, f64> = [(1000, 0.25), (1001, 0.9)].into();
        assert_eq!(order(&live, Some(&alice_used_more)), ["vip", "cpu", "b1"]);
        // The first waiting job in that order keeps the GPUs it waits for.
        launch(&mut live, "vip", &[0]);
        launch(&mut live, "cpu", &[]);
        let d = decide_under(&live, Some(&alice_used_more));
        assert_eq!(started(&d), [("b1".to_owned(), vec![1])]);
        live.check().unwrap();
    }

    #[test]
    fn an_owner_over_quota_waits_for_gpus_but_not_for_cpus_and_preempts_nobody() {
        let mut live = live(&[
            ("a1", r#", "gpus": 1, "priority": 5"#, 1000),
            ("acpu", "", 1000),
            ("b1", r#", "gpus": 1"#, 1001),
            (
                "low",
                r#", "gpus": 1, "priority": -5, "preemptible": true"#,
                1001,
            ),
        ]);
        let gpus = [gpu(0)];
        let over: HashMap<u32, String> = [(1000, "over".to_owned())].into();
        let decide_over = |live: &Live, over: &HashMap<u32, String>| {
            plan(live, &[], Some(&gpus), None, 100, None, None, over)
                .0
                .unwrap()
        };
        let urgent = |d: Decision| d.preemption.map(|(urgent, _)| urgent.to_string());
        let d = decide_over(&live, &over);
        assert_eq!(
            started(&d),
            [("acpu".to_owned(), vec![]), ("b1".to_owned(), vec![0])]
        );
        // With the GPU taken by a preemptible job, Alice's urgent job
        // stops nothing while she is over quota: Bob's, next, does.
        launch(&mut live, "low", &[0]);
        run(&mut live, "low", 100);
        assert_eq!(urgent(decide_over(&live, &over)).as_deref(), Some("b1"));
        assert_eq!(
            urgent(decide_over(&live, &HashMap::new())).as_deref(),
            Some("a1")
        );
    }

    #[test]
    fn jobs_with_and_without_gpus_start_in_one_order_of_priority_then_arrival() {
        let live = live(&[
            ("a", r#", "gpus": 1"#, 1000),
            ("b", "", 1000),
            ("c", r#", "gpus": 1, "priority": 5"#, 1001),
            ("d", "", 1001),
        ]);
        let gpus = [gpu(0), gpu(1)];
        let d = decide_on(&live, &[], Some(&gpus), 100);
        let order: Vec<String> = started(&d).into_iter().map(|(id, _)| id).collect();
        assert_eq!(order, ["c", "a", "b", "d"]);
        assert!(!d.gpu_jobs_wait && d.never.is_empty());
        live.check().unwrap();
    }

    #[test]
    fn a_blocked_job_is_passed_by_those_behind_it() {
        let live = a_gpu_job_between_two_cpu_jobs();
        let gpus = [gpu(0)];
        let (d, looks) = plan(
            &live,
            &["a", "b"],
            Some(&gpus),
            None,
            100,
            None,
            None,
            &HashMap::new(),
        );
        assert_eq!(started(&d.unwrap()), [("c".to_string(), vec![])]);
        // Only blocked GPU jobs: no look at the GPUs is needed.
        assert_eq!(looks, 0);
        assert_eq!(
            plan(
                &live,
                &[],
                Some(&gpus),
                None,
                100,
                None,
                None,
                &HashMap::new()
            )
            .1,
            1
        );
        let d = decide_on(&live, &["b"], None, 100);
        assert_eq!(
            started(&d).len(),
            2,
            "an unread inventory holds back no CPU job"
        );
        assert!(!d.gpu_jobs_wait);
    }

    #[test]
    fn an_unreadable_inventory_holds_gpu_jobs_and_proves_nothing_impossible() {
        let live = live(&[("big", r#", "gpus": 8"#, 1000), ("cpu", "", 1000)]);
        let d = decide_on(&live, &[], None, 100);
        assert_eq!(started(&d), [("cpu".to_string(), vec![])]);
        assert!(d.gpu_jobs_wait, "looked at again later");
        assert!(d.never.is_empty());
        assert_eq!(d.checked_against, None, "checked again once it reads");
        // Read, the same job is judged: 8 GPUs on a 2-GPU machine.
        let gpus = [gpu(0), gpu(1)];
        let d = decide_on(&live, &[], Some(&gpus), 100);
        assert_eq!(d.never.len(), 1, "{:?}", d.never);
        assert_eq!(d.never[0].0, id("big"));
        assert!(d.never[0].1.contains('8'), "{}", d.never[0].1);
        assert!(d.checked_against.is_some());
    }

    #[test]
    fn the_never_check_reads_the_whole_queue_once_per_set_of_gpus() {
        // `a` takes both GPUs: past it, only a never check reads the queue.
        let live = live(&[
            ("a", r#", "gpus": 2"#, 1000),
            ("big", r#", "gpus": 8"#, 1000),
        ]);
        let gpus = [gpu(0), gpu(1)];
        let first = decide_on(&live, &[], Some(&gpus), 100);
        assert_eq!(first.never.len(), 1);
        let again = |checked_against, gpus: &[GpuInfo]| {
            plan(
                &live,
                &[],
                Some(gpus),
                checked_against,
                100,
                None,
                None,
                &HashMap::new(),
            )
            .0
            .unwrap()
        };
        assert_eq!(started(&first), [("a".to_string(), vec![0, 1])]);
        // The same GPUs: the job was judged (and ended) already.
        assert!(again(first.checked_against, &gpus).never.is_empty());
        // Other GPUs: everything is checked again.
        let more = [gpu(0), gpu(1), gpu(2)];
        assert_eq!(again(first.checked_against, &more).never.len(), 1);
    }

    #[test]
    fn launches_stop_at_the_units_systemd_can_still_track() {
        let live = a_gpu_job_between_two_cpu_jobs();
        let gpus = [gpu(0)];
        let d = decide_on(&live, &[], Some(&gpus), 2);
        let order: Vec<String> = started(&d).into_iter().map(|(id, _)| id).collect();
        assert_eq!(order, ["a", "b"]);
        assert!(d.gpu_jobs_wait, "the rest wait for room");
        // No room: nothing decided, not even a look at the GPUs.
        let (d, looks) = plan(
            &live,
            &[],
            Some(&gpus),
            None,
            0,
            None,
            None,
            &HashMap::new(),
        );
        assert!(d.is_none());
        assert_eq!(looks, 0);
        // An empty queue: nothing kept, nothing waits.
        let (d, looks) = plan(
            &Live::default(),
            &[],
            Some(&gpus),
            Some(7),
            100,
            None,
            None,
            &HashMap::new(),
        );
        let d = d.unwrap();
        assert!(d.launches.is_empty() && d.reserved.is_empty() && d.waits.is_empty());
        assert_eq!((d.checked_against, looks), (Some(7), 0));
    }

    #[test]
    fn one_owners_pending_starts_leave_the_others_room() {
        let live = live(&[
            ("a1", "", 1000),
            ("a2", "", 1000),
            ("a3", "", 1000),
            ("b1", "", 1001),
        ]);
        let no_quota = HashMap::new();
        let with_pending = |pending: &HashMap<u32, usize>| {
            plan(
                &live,
                &[],
                None,
                None,
                100,
                Some((pending, 2)),
                None,
                &no_quota,
            )
            .0
            .unwrap()
        };
        // Nothing pending: each owner starts at most their share (2).
        let d = with_pending(&HashMap::new());
        let order: Vec<String> = started(&d).into_iter().map(|(id, _)| id).collect();
        assert_eq!(order, ["a1", "a2", "b1"]);
        assert!(d.gpu_jobs_wait, "a3 waits, and is planned again");
        // Alice's two starts hang: Bob's job still starts.
        let stuck: HashMap<u32, usize> = [(1000, 2)].into();
        assert_eq!(started(&with_pending(&stuck)), [("b1".to_string(), vec![])]);
    }

    #[test]
    fn gpus_held_by_running_jobs_are_not_given_again() {
        let mut live = live(&[
            ("run", r#", "gpus": 1"#, 1000),
            ("next", r#", "gpus": 1"#, 1001),
        ]);
        launch(&mut live, "run", &[0]);
        live.check().unwrap();
        let gpus = [gpu(0), gpu(1)];
        let d = decide_on(&live, &[], Some(&gpus), 100);
        assert_eq!(started(&d), [("next".to_string(), vec![1])]);
        // With both held, the next GPU job waits, and says for what.
        let mut live = live_with_two_running();
        let later = test_kit::record(
            r#"{"version": 1, "command": ["true"], "gpus": 1}"#,
            "later",
            test_kit::owner(1002, "u1002"),
            9,
        );
        live.queue_job(later);
        let d = decide_on(&live, &[], Some(&gpus), 100);
        assert!(d.launches.is_empty() && d.gpu_jobs_wait);
        // With every GPU taken, the queue is not read further.
        assert!(d.waits.is_empty() && d.reserved.is_empty(), "{:?}", d.waits);
    }

    fn live_with_two_running() -> Live {
        let mut l = live(&[
            ("r0", r#", "gpus": 1"#, 1000),
            ("r1", r#", "gpus": 1"#, 1001),
        ]);
        launch(&mut l, "r0", &[0]);
        launch(&mut l, "r1", &[1]);
        l
    }
}
