//! The pure core of scheduling: which queued jobs start now and on which
//! GPUs, and what a unit's end means. Values in, decisions out; no I/O.
//!
//! # The allocation rule
//!
//! GPUs are whole and exclusive: a GPU is given to a job only if no ptrain
//! job holds it, it is healthy, and other programs use less of its memory
//! than `gpus.foreign_memory_threshold_mib`. [`plan`] walks the queue in
//! order of priority (higher first), then arrival, and for each GPU job:
//!
//! 1. A job that can never start (more GPUs than the machine has that match
//!    its request, a model no GPU has, more than its policy allows) is
//!    reported in [`Plan::never`]; it holds nothing back.
//! 2. A job whose owner (or group) would exceed its `max_gpus` waits. GPUs
//!    held count against a cap, and so do the GPUs of every job ahead in
//!    the order that waits under the same cap (rules 2 and 5): a stream of
//!    a user's small jobs cannot take, one by one, the share of the cap her
//!    waiting big job needs once her running jobs end. It reserves no GPU,
//!    so one user's backlog never blocks anyone the cap does not cover.
//! 3. A job whose GPUs would not be enough even once every ptrain job has
//!    ended (other programs or unhealthy GPUs take the rest) waits without
//!    reserving: ptrain cannot tell when that changes, and holding GPUs
//!    for it could idle them for days. The daemon re-plans periodically
//!    while such jobs wait.
//! 4. Otherwise its candidates are the GPUs it could use now (matching its
//!    request and policy, free, not reserved by a job earlier in the
//!    order). With enough candidates it starts, on GPUs chosen close
//!    together ([`crate::gpu::pick_near`]).
//! 5. Without enough it *reserves* all its candidates: jobs later in the
//!    order may not take them. As GPUs free up, they go to the earliest
//!    waiting job that can use them, so a stream of small jobs cannot
//!    starve a big one: once a job waits, a job behind it starts only on
//!    GPUs the waiting job cannot use (another model, GPUs its policy or
//!    `indices` exclude, not enough free memory): that is backfill.
//!
//! Without run-time estimates, a reservation may leave GPUs idle until the
//! job that holds it starts; that is the price of never starving it.
//! Reservations are recomputed from scratch at every plan, so they follow
//! priorities and cancellations without any state of their own.

use std::collections::{BTreeMap, BTreeSet};

use crate::gpu::{free_memory_mib, is_usable, pick_near, GpuInfo};
use crate::policy::{Policy, Rule, Scope};
use crate::spec::{GpuRequest, GpuSelector, JobId};
use crate::users::Owner;

/// A queued job as the planner sees it. The queue is given in arrival order.
#[derive(Clone, Copy, Debug)]
pub struct Waiting<'a> {
    pub id: &'a JobId,
    pub owner: &'a Owner,
    pub priority: i32,
    pub request: &'a GpuRequest,
}

/// The job holding a GPU (launching or running).
#[derive(Clone, Copy, Debug)]
pub struct Holder<'a> {
    pub id: &'a JobId,
    pub owner: &'a Owner,
}

/// The settings allocation depends on.
#[derive(Clone, Copy, Debug)]
pub struct Rules<'a> {
    pub foreign_memory_threshold_mib: u64,
    pub policy: &'a Policy,
}

/// A decision to start `id` on the GPUs with these indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub id: JobId,
    pub gpus: Vec<u32>,
}

/// What [`plan`] decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Jobs to start now: those that ask for no GPUs, then the others in
    /// the order they were chosen.
    pub placements: Vec<Placement>,
    /// Free GPUs kept for a waiting job (rule 5).
    pub reserved: BTreeMap<u32, JobId>,
    /// Jobs that can never start here, with the reason (rule 1).
    pub never: Vec<(JobId, String)>,
    /// Some job that asks for GPUs stays queued.
    pub waiting_for_gpus: bool,
    /// What each GPU job the plan read and did not place waits for; jobs
    /// past the point where every GPU is spoken for are not read.
    pub waits: BTreeMap<JobId, Wait>,
}

/// Why a GPU job stays queued, for people (`ptrain status`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A `max_gpus` cap (config key `key`, counting `who`) is in use:
    /// `held` GPUs by jobs running or starting, and `kept` by `ahead` jobs
    /// queued ahead of this one under the same cap (the first is `first`).
    Cap {
        key: String,
        who: String,
        max: u32,
        held: usize,
        kept: usize,
        ahead: usize,
        first: Option<JobId>,
    },
    /// Too few GPUs it may use are free; `kept` of the free ones are kept
    /// for `for_job`, queued ahead of it.
    KeptFor {
        free: usize,
        kept: Vec<u32>,
        for_job: JobId,
    },
    /// Too few GPUs it may use are free: it keeps the `free` ones.
    Busy { free: usize, eligible: usize },
    /// Other programs or unhealthy GPUs leave only `usable` of the GPUs it
    /// may use, even once every ptrain job has ended.
    Unusable { usable: usize },
}

impl Wait {
    /// "waiting for 4 GPUs: ptrain-alice holds 3 GPUs of max_gpus = 4 (policy.users.ptrain-alice)".
    pub fn describe(&self, request: &GpuRequest) -> String {
        let gpus = |n: usize| {
            if n == 1 {
                "1 GPU".to_owned()
            } else {
                format!("{n} GPUs")
            }
        };
        let why = match self {
            Wait::Cap {
                key,
                who,
                max,
                held,
                kept,
                ahead,
                first,
            } => {
                let mut s = format!("{who} holds {} of max_gpus = {max} ({key})", gpus(*held));
                if let Some(first) = first {
                    s.push_str(&match ahead {
                        1 => format!(", and {first}, queued ahead of it, waits for {kept} of them"),
                        n => format!(
                            ", and {first} and {} other job(s) queued ahead of it wait for {kept} of them",
                            n - 1
                        ),
                    });
                }
                s
            }
            Wait::KeptFor {
                free,
                kept,
                for_job,
            } => format!(
                "{free} free for it; GPU{} {} kept for {for_job}, queued ahead of it; the others are held",
                if kept.len() == 1 { "" } else { "s" },
                kept.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
            ),
            Wait::Busy { free, eligible } => format!(
                "{free} of the {eligible} GPUs it may use free (kept for it meanwhile); the others are held by running jobs"
            ),
            Wait::Unusable { usable } => format!(
                "other programs' memory use or unhealthy GPUs leave only {usable} of the GPUs it may use; \
                 it starts when they free up"
            ),
        };
        format!("waiting for {}: {why}", request.describe())
    }
}

/// Whether `gpu` has the properties `request` asks for, whatever its state
/// now.
fn has_properties(request: &GpuRequest, gpu: &GpuInfo) -> bool {
    request.selects(gpu.index, &gpu.uuid)
        && request.model_matches(&gpu.name)
        && request
            .min_free_memory_mib
            .is_none_or(|m| gpu.memory_total_mib >= m)
}

fn index_list<'a>(gpus: impl IntoIterator<Item = &'a GpuInfo>) -> String {
    let v: Vec<String> = gpus.into_iter().map(|g| g.index.to_string()).collect();
    if v.is_empty() {
        "none".to_owned()
    } else {
        v.join(",")
    }
}

/// Why a job asking `request` for `owner` can never start on the GPUs in
/// `snapshot` under `policy`, or `None` if it could some day. Unhealthy
/// GPUs count as existing (they may recover). The message names the field
/// or config key at fault and says what to do; the daemon rejects a job
/// with it at submission.
pub fn never_reason(
    request: &GpuRequest,
    owner: &Owner,
    snapshot: &[GpuInfo],
    policy: &Policy,
) -> Option<String> {
    let n = request.count() as usize;
    if n == 0 {
        return None;
    }
    if snapshot.is_empty() {
        return Some(format!(
            "field `gpus` asks for {} but this machine has no GPUs (NVML finds none and none are \
             declared in [gpus]); drop `gpus` to run on the CPU",
            request.describe()
        ));
    }
    match &request.only {
        Some(GpuSelector::Indices(v)) => {
            if let Some(i) = v.iter().find(|i| !snapshot.iter().any(|g| g.index == **i)) {
                return Some(format!(
                    "field `gpus.indices` names GPU {i}, which this machine does not have (its GPUs: {}); \
                     name GPUs that `ptrain gpus` lists",
                    index_list(snapshot)
                ));
            }
        }
        Some(GpuSelector::Uuids(v)) => {
            if let Some(u) = v
                .iter()
                .find(|u| !snapshot.iter().any(|g| g.uuid.eq_ignore_ascii_case(u)))
            {
                return Some(format!(
                    "field `gpus.uuids` names {u:?}, which is not a GPU of this machine; \
                     copy UUIDs from `ptrain gpus`"
                ));
            }
        }
        None => {}
    }
    if let Some(model) = &request.model {
        if !snapshot.iter().any(|g| request.model_matches(&g.name)) {
            let mut names: Vec<&str> = snapshot.iter().map(|g| g.name.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            let names = if names.is_empty() {
                "it has no GPUs".to_owned()
            } else {
                format!("it has {}", names.join(", "))
            };
            return Some(format!(
                "field `gpus.model` {model:?} matches no GPU of this machine ({names}); \
                 ask for a model it has, or drop `model`"
            ));
        }
    }
    // Checked for every queued job in every plan: nothing is allocated
    // unless there is something to say.
    let matching = || snapshot.iter().filter(|g| has_properties(request, g));
    if matching().count() < n {
        let have = matching().count();
        return Some(match request.min_free_memory_mib {
            Some(mib) => {
                let largest = snapshot
                    .iter()
                    .filter(|g| request.selects(g.index, &g.uuid) && request.model_matches(&g.name))
                    .map(|g| g.memory_total_mib)
                    .max()
                    .unwrap_or(0);
                format!(
                    "field `gpus` asks for {} but only {have} GPU(s) here have {mib} MiB of memory \
                     (the largest has {largest} MiB); lower `gpus.min_memory` or the count",
                    request.describe()
                )
            }
            None => format!(
                "field `gpus` asks for {} but this machine has only {have} such GPU(s); \
                 ask for at most {have}",
                request.describe()
            ),
        });
    }
    let rules = policy.rules_for(owner);
    for rule in &rules {
        if let Some(max) = rule.limits.max_gpus {
            if n > max as usize {
                return Some(format!(
                    "field `gpus` asks for {n} GPU(s) but `{}.max_gpus` lets {} hold at most {max} at once; \
                     ask for at most {max}, or ask the admin to raise the limit",
                    rule.key, owner.name
                ));
            }
        }
    }
    let allowed = || matching().filter(|g| rules.iter().all(|r| r.allows(g.index)));
    if allowed().count() < n {
        let allowed: Vec<&GpuInfo> = allowed().collect();
        let keys: Vec<String> = rules
            .iter()
            .filter(|r| r.limits.allowed_gpus.is_some())
            .map(|r| format!("`{}.allowed_gpus`", r.key))
            .collect();
        let policy = keys.join(", ");
        if allowed.is_empty() {
            return Some(format!(
                "field `gpus` asks for {} but the policy ({policy}) lets {} use none of the matching GPUs; \
                 run it without GPUs, or ask the admin for some",
                request.describe(),
                owner.name,
            ));
        }
        return Some(format!(
            "field `gpus` asks for {} but the policy ({policy}) lets {} use only {} of the matching GPUs ({}); \
             ask for at most {}, or ask the admin",
            request.describe(),
            owner.name,
            allowed.len(),
            index_list(allowed.iter().copied()),
            allowed.len()
        ));
    }
    None
}

/// GPUs counted against caps: held by a job (running, starting, placed in
/// this plan), or wanted by jobs that wait ahead in the order.
#[derive(Default)]
struct CapUse<'a> {
    held: Vec<(&'a Owner, usize)>,
    /// Per owner, summed: a long queue of one user's capped jobs costs
    /// each plan what her number of jobs does, not its square.
    kept: Vec<Kept<'a>>,
}

/// What one owner's waiting jobs ahead keep of the caps covering them.
struct Kept<'a> {
    owner: &'a Owner,
    gpus: usize,
    jobs: usize,
    first: &'a JobId,
}

impl<'a> CapUse<'a> {
    fn keep(&mut self, owner: &'a Owner, gpus: usize, id: &'a JobId) {
        match self.kept.iter_mut().find(|k| k.owner.uid == owner.uid) {
            Some(k) => {
                k.gpus += gpus;
                k.jobs += 1;
            }
            None => self.kept.push(Kept {
                owner,
                gpus,
                jobs: 1,
                first: id,
            }),
        }
    }

    /// The first `max_gpus` of `rules` that taking `n` more GPUs for
    /// `owner` would exceed, as a [`Wait`].
    fn blocks(&self, rules: &[Rule<'_>], owner: &Owner, n: usize) -> Option<Wait> {
        rules.iter().find_map(|rule| {
            let max = rule.limits.max_gpus?;
            let held: usize = self
                .held
                .iter()
                .filter(|(o, _)| rule.scope.covers(o))
                .map(|(_, k)| k)
                .sum();
            let ahead = || self.kept.iter().filter(|k| rule.scope.covers(k.owner));
            let kept: usize = ahead().map(|k| k.gpus).sum();
            (held + kept + n > max as usize).then(|| Wait::Cap {
                key: rule.key.clone(),
                who: match &rule.scope {
                    Scope::User(_) => owner.name.clone(),
                    Scope::Group(_) => format!(
                        "group {}",
                        rule.key.strip_prefix("policy.groups.").unwrap_or(&rule.key)
                    ),
                },
                max,
                held,
                kept,
                ahead: ahead().map(|k| k.jobs).sum(),
                // Owners are listed in the order of their first job ahead,
                // so this is the earliest job ahead under this cap.
                first: ahead().next().map(|k| k.first.clone()),
            })
        })
    }
}

/// Decides which queued jobs start now and which free GPUs are kept for
/// waiting jobs; see the module documentation for the rule. `queue` is in
/// arrival order; `held` maps each GPU a ptrain job holds to that job.
pub fn plan(
    queue: &[Waiting<'_>],
    snapshot: &[GpuInfo],
    held: &BTreeMap<u32, Holder<'_>>,
    rules: Rules<'_>,
) -> Plan {
    let mut order: Vec<Waiting<'_>> = queue.to_vec();
    // Stable: equal priorities keep arrival order.
    order.sort_by_key(|w| std::cmp::Reverse(w.priority));
    let (cpu_jobs, gpu_jobs): (Vec<_>, Vec<_>) =
        order.into_iter().partition(|w| w.request.count() == 0);
    plan_in_order(&cpu_jobs, gpu_jobs, snapshot, held, rules, true)
}

/// [`plan`] for a queue kept in planning order (a [`Queue`]): the jobs
/// that ask for no GPUs (all start), and those that do, each in order of
/// priority, then arrival. Once every GPU is taken or kept for a job
/// ahead, no later GPU job can start or keep anything, so the rest of
/// `gpu_jobs` is not read unless `check_never` asks for every job to be
/// checked against the machine (the first plan, and after the GPUs
/// changed); each job is checked at submission too. So planning costs
/// what it places, not the length of the queue.
pub fn plan_in_order<'a>(
    cpu_jobs: &[Waiting<'a>],
    gpu_jobs: impl IntoIterator<Item = Waiting<'a>>,
    snapshot: &[GpuInfo],
    held: &BTreeMap<u32, Holder<'_>>,
    rules: Rules<'_>,
    check_never: bool,
) -> Plan {
    let mut plan = Plan {
        placements: cpu_jobs
            .iter()
            .map(|job| Placement {
                id: job.id.clone(),
                gpus: Vec::new(),
            })
            .collect(),
        ..Plan::default()
    };
    let mut taken: BTreeSet<u32> = held.keys().copied().collect();
    let mut caps = CapUse {
        held: held.values().map(|h| (h.owner, 1)).collect(),
        kept: Vec::new(),
    };
    // Once every GPU is taken or kept for a job ahead, a GPU job can
    // neither start nor keep anything: the rest of the queue is not read,
    // or only checked against the machine (`check_never`).
    let all_spoken_for = |taken: &BTreeSet<u32>, plan: &Plan| {
        snapshot
            .iter()
            .all(|g| taken.contains(&g.index) || plan.reserved.contains_key(&g.index))
    };
    let mut spoken_for = all_spoken_for(&taken, &plan);
    for job in gpu_jobs {
        let request = job.request;
        let n = request.count() as usize;
        if spoken_for && !check_never {
            plan.waiting_for_gpus = true;
            break;
        }
        if let Some(why) = never_reason(request, job.owner, snapshot, rules.policy) {
            plan.never.push((job.id.clone(), why));
            continue;
        }
        if spoken_for {
            plan.waiting_for_gpus = true;
            continue;
        }
        let job_rules = rules.policy.rules_for(job.owner);
        if let Some(wait) = caps.blocks(&job_rules, job.owner, n) {
            plan.waiting_for_gpus = true;
            // Its share of the cap is kept, as GPUs are for rule 5.
            caps.keep(job.owner, n, job.id);
            plan.waits.insert(job.id.clone(), wait);
            continue;
        }
        let eligible: Vec<&GpuInfo> = snapshot
            .iter()
            .filter(|g| g.unhealthy.is_none())
            .filter(|g| has_properties(request, g))
            .filter(|g| job_rules.iter().all(|r| r.allows(g.index)))
            .collect();
        let usable_now = |g: &GpuInfo| {
            !taken.contains(&g.index)
                && is_usable(g, rules.foreign_memory_threshold_mib)
                && request
                    .min_free_memory_mib
                    .is_none_or(|m| free_memory_mib(g) >= m)
        };
        let eventually = eligible
            .iter()
            .filter(|g| taken.contains(&g.index) || usable_now(g))
            .count();
        if eventually < n {
            plan.waiting_for_gpus = true;
            plan.waits
                .insert(job.id.clone(), Wait::Unusable { usable: eventually });
            continue;
        }
        let candidates: Vec<&GpuInfo> = eligible
            .iter()
            .copied()
            .filter(|g| usable_now(g) && !plan.reserved.contains_key(&g.index))
            .collect();
        match pick_near(&candidates, n) {
            Some(gpus) => {
                taken.extend(gpus.iter().copied());
                caps.held.push((job.owner, n));
                plan.placements.push(Placement {
                    id: job.id.clone(),
                    gpus,
                });
            }
            None => {
                plan.waiting_for_gpus = true;
                // Kept for a job ahead: the first such job is named.
                let mut kept_for: Option<&JobId> = None;
                let kept: Vec<u32> = eligible
                    .iter()
                    .filter(|g| usable_now(g))
                    .filter_map(|g| {
                        let holder = plan.reserved.get(&g.index)?;
                        kept_for.get_or_insert(holder);
                        Some(g.index)
                    })
                    .collect();
                let wait = match kept_for {
                    Some(for_job) => Wait::KeptFor {
                        free: candidates.len(),
                        kept,
                        for_job: for_job.clone(),
                    },
                    None => Wait::Busy {
                        free: candidates.len(),
                        eligible: eligible.len(),
                    },
                };
                plan.waits.insert(job.id.clone(), wait);
                for g in candidates {
                    plan.reserved.insert(g.index, job.id.clone());
                }
                caps.keep(job.owner, n, job.id);
            }
        }
        spoken_for = all_spoken_for(&taken, &plan);
    }
    plan
}

/// Where a queued job stands in planning order: priority (higher first),
/// then arrival (its submission, µs), then the order it was queued in.
/// A job queued again (a retry, a preemption) keeps its submission, so
/// it never loses its place to jobs that arrived after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct QueuePosition {
    rank: std::cmp::Reverse<i32>,
    arrival: u64,
    seq: u64,
}

impl QueuePosition {
    /// The priority part alone, ordered as the position is (higher
    /// priority first).
    pub fn rank(&self) -> std::cmp::Reverse<i32> {
        self.rank
    }
}

/// The queued jobs in planning order, those that ask for GPUs apart from
/// those that do not, so that a plan reads only as far into a long GPU
/// queue as it can place ([`plan_in_order`]). Adding and removing a job
/// costs O(log n): nothing walks the queue per event.
#[derive(Debug, Default)]
pub struct Queue {
    /// Each job with its owner's uid, which a plan reads for every job it
    /// passes over (an owner at their share of pending starts).
    cpu: BTreeMap<QueuePosition, (JobId, u32)>,
    gpu: BTreeMap<QueuePosition, (JobId, u32)>,
    /// The GPU jobs by priority, then owner, then arrival: what
    /// [`Queue::gpu_jobs_fair`] reads.
    gpu_by_owner: BTreeSet<OwnerPosition>,
    /// Each owner (uid) of a queued GPU job: their primary gid and how
    /// many such jobs they have, for [`crate::fair_share::standings`].
    gpu_owners: BTreeMap<u32, (u32, usize)>,
    positions: std::collections::HashMap<JobId, (QueuePosition, bool, (u32, u32))>,
    arrivals: u64,
}

/// A GPU job's place among its owner's jobs of its priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct OwnerPosition {
    rank: std::cmp::Reverse<i32>,
    uid: u32,
    arrival: u64,
    seq: u64,
}

impl OwnerPosition {
    fn of(position: QueuePosition, uid: u32) -> OwnerPosition {
        OwnerPosition {
            rank: position.rank,
            uid,
            arrival: position.arrival,
            seq: position.seq,
        }
    }

    fn position(self) -> QueuePosition {
        QueuePosition {
            rank: self.rank,
            arrival: self.arrival,
            seq: self.seq,
        }
    }

    /// The first and last places `uid` may have at `rank`.
    fn first_of(rank: std::cmp::Reverse<i32>, uid: u32) -> OwnerPosition {
        OwnerPosition {
            rank,
            uid,
            arrival: 0,
            seq: 0,
        }
    }

    fn last_of(rank: std::cmp::Reverse<i32>, uid: u32) -> OwnerPosition {
        OwnerPosition {
            rank,
            uid,
            arrival: u64::MAX,
            seq: u64::MAX,
        }
    }
}

impl Queue {
    /// Queues `id` (owned by `owner`, its uid and primary gid) among the
    /// jobs of its priority by its `arrival` (its submission), behind
    /// those of the same arrival; one already queued keeps its place.
    pub fn push(
        &mut self,
        id: JobId,
        priority: i32,
        wants_gpus: bool,
        arrival: u64,
        owner: (u32, u32),
    ) {
        if self.positions.contains_key(&id) {
            return;
        }
        let position = QueuePosition {
            rank: std::cmp::Reverse(priority),
            arrival,
            seq: self.arrivals,
        };
        self.arrivals += 1;
        self.place(id, position, wants_gpus, owner);
    }

    fn place(&mut self, id: JobId, position: QueuePosition, wants_gpus: bool, owner: (u32, u32)) {
        if wants_gpus {
            self.gpu_by_owner
                .insert(OwnerPosition::of(position, owner.0));
            let entry = self.gpu_owners.entry(owner.0).or_insert((owner.1, 0));
            *entry = (owner.1, entry.1 + 1);
        }
        self.list(wants_gpus)
            .insert(position, (id.clone(), owner.0));
        self.positions.insert(id, (position, wants_gpus, owner));
    }

    /// Moves `id` to its new priority, keeping its arrival: among the jobs
    /// of that priority it stands where its arrival puts it, never behind
    /// jobs that came after it (`ptrain update --priority`).
    pub fn reprioritize(&mut self, id: &JobId, priority: i32) {
        let Some((position, wants_gpus, owner)) = self.positions.get(id).copied() else {
            return;
        };
        let moved = QueuePosition {
            rank: std::cmp::Reverse(priority),
            ..position
        };
        self.remove(id);
        self.place(id.clone(), moved, wants_gpus, owner);
    }

    /// Takes `id` out; false if it was not queued.
    pub fn remove(&mut self, id: &JobId) -> bool {
        let Some((position, wants_gpus, (uid, _))) = self.positions.remove(id) else {
            return false;
        };
        if wants_gpus {
            self.gpu_by_owner.remove(&OwnerPosition::of(position, uid));
            if let Some(entry) = self.gpu_owners.get_mut(&uid) {
                entry.1 -= 1;
                if entry.1 == 0 {
                    self.gpu_owners.remove(&uid);
                }
            }
        }
        self.list(wants_gpus).remove(&position);
        true
    }

    fn list(&mut self, wants_gpus: bool) -> &mut BTreeMap<QueuePosition, (JobId, u32)> {
        if wants_gpus {
            &mut self.gpu
        } else {
            &mut self.cpu
        }
    }

    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    pub fn position(&self, id: &JobId) -> Option<QueuePosition> {
        self.positions.get(id).map(|(position, _, _)| *position)
    }

    /// Jobs that ask for no GPUs, in planning order.
    pub fn cpu_jobs(&self) -> impl Iterator<Item = &JobId> {
        self.cpu.values().map(|(id, _)| id)
    }

    /// Jobs that ask for no GPUs, in planning order, each with its
    /// owner's uid.
    pub fn cpu_jobs_owned(&self) -> impl Iterator<Item = (&JobId, u32)> {
        self.cpu.values().map(|(id, uid)| (id, *uid))
    }

    /// Jobs that ask for GPUs, in planning order.
    pub fn gpu_jobs(&self) -> impl Iterator<Item = &JobId> {
        self.gpu.values().map(|(id, _)| id)
    }

    /// The owners of queued GPU jobs, as (uid, primary gid).
    pub fn gpu_owners(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.gpu_owners.iter().map(|(uid, (gid, _))| (*uid, *gid))
    }

    /// Jobs that ask for GPUs in fair-share order ([`crate::fair_share`]):
    /// priority first; within a priority, owners by their `factor`
    /// (higher first; an owner missing from it counts 1, and equal factors
    /// go by the owner's first arrival), each owner's jobs in arrival
    /// order. Lazy, like [`Queue::gpu_jobs`]: a priority's owners are
    /// sorted only when the reader gets to it, so a plan still costs what
    /// it reads plus the owners of the priorities it reads.
    pub fn gpu_jobs_fair<'a>(
        &'a self,
        factor: &'a std::collections::HashMap<u32, f64>,
    ) -> impl Iterator<Item = &'a JobId> + 'a {
        use std::ops::Bound::{Excluded, Unbounded};
        let mut next_rank = self.gpu_by_owner.first().map(|p| p.rank);
        let mut band: std::vec::IntoIter<(std::cmp::Reverse<i32>, u32)> = Vec::new().into_iter();
        let mut jobs: Option<std::collections::btree_set::Range<'a, OwnerPosition>> = None;
        std::iter::from_fn(move || loop {
            if let Some(p) = jobs.as_mut().and_then(|r| r.next()) {
                return self.gpu.get(&p.position()).map(|(id, _)| id);
            }
            if let Some((rank, uid)) = band.next() {
                jobs =
                    Some(self.gpu_by_owner.range(
                        OwnerPosition::first_of(rank, uid)..=OwnerPosition::last_of(rank, uid),
                    ));
                continue;
            }
            let rank = next_rank.take()?;
            // The owners of this priority, each found by one step past
            // the last.
            let mut owners: Vec<(f64, OwnerPosition)> = Vec::new();
            let mut from = OwnerPosition::first_of(rank, 0);
            while let Some(first) = self
                .gpu_by_owner
                .range(from..)
                .next()
                .filter(|p| p.rank == rank)
            {
                owners.push((factor.get(&first.uid).copied().unwrap_or(1.0), *first));
                match first.uid.checked_add(1) {
                    Some(uid) => from = OwnerPosition::first_of(rank, uid),
                    None => break,
                }
            }
            owners.sort_by(|a, b| {
                b.0.total_cmp(&a.0)
                    .then((a.1.arrival, a.1.seq).cmp(&(b.1.arrival, b.1.seq)))
            });
            next_rank = self
                .gpu_by_owner
                .range((Excluded(OwnerPosition::last_of(rank, u32::MAX)), Unbounded))
                .next()
                .map(|p| p.rank);
            band = owners
                .into_iter()
                .map(|(_, p)| (p.rank, p.uid))
                .collect::<Vec<_>>()
                .into_iter();
        })
    }

    /// Every queued job: those that ask for no GPUs, then the others.
    pub fn iter(&self) -> impl Iterator<Item = &JobId> {
        self.cpu_jobs().chain(self.gpu_jobs())
    }
}

/// What of the GPU inventory decides whether a job can ever start
/// ([`never_reason`]): which GPUs exist, with what model and memory.
/// A plan checks every queued job again when it changes.
pub fn inventory_fingerprint(snapshot: &[GpuInfo]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for g in snapshot {
        (g.index, &g.uuid, &g.name, g.memory_total_mib).hash(&mut hasher);
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::test_kit::gpu;
    use crate::policy::PolicyConfig;

    fn gpus(n: u32) -> Vec<GpuInfo> {
        (0..n).map(gpu).collect()
    }

    fn foreign(mut g: GpuInfo, mib: u64) -> GpuInfo {
        g.processes = vec![crate::gpu::GpuProcess {
            pid: 4242,
            used_memory_mib: Some(mib),
        }];
        g.memory_used_mib = Some(mib);
        g
    }

    fn owner(name: &str, gid: u32) -> Owner {
        Owner {
            uid: 1000 + gid,
            gid,
            name: name.into(),
            home: "/home/x".into(),
            groups: vec![],
        }
    }

    /// A queued job, owning what a [`Waiting`] borrows.
    #[derive(Clone)]
    struct Job {
        id: JobId,
        owner: Owner,
        priority: i32,
        request: GpuRequest,
    }

    fn job(id: &str, n: u32) -> Job {
        Job {
            id: JobId::parse(id).unwrap(),
            owner: owner("alice", 100),
            priority: 0,
            request: GpuRequest::any(n),
        }
    }

    impl Job {
        fn by(mut self, user: &str, gid: u32) -> Job {
            self.owner = owner(user, gid);
            self
        }
        fn prio(mut self, p: i32) -> Job {
            self.priority = p;
            self
        }
        fn asking(mut self, r: serde_json::Value) -> Job {
            let spec = crate::spec::parse_spec(
                serde_json::json!({"version": 1, "command": ["x"], "gpus": r})
                    .to_string()
                    .as_bytes(),
                "x",
            )
            .unwrap();
            self.request = spec.gpus;
            self
        }
        fn waiting(&self) -> Waiting<'_> {
            Waiting {
                id: &self.id,
                owner: &self.owner,
                priority: self.priority,
                request: &self.request,
            }
        }
    }

    fn plan_with(queue: &[Job], snap: &[GpuInfo], held: &[(u32, &Job)], policy: &Policy) -> Plan {
        let waiting: Vec<Waiting<'_>> = queue.iter().map(Job::waiting).collect();
        let held: BTreeMap<u32, Holder<'_>> = held
            .iter()
            .map(|(g, j)| {
                (
                    *g,
                    Holder {
                        id: &j.id,
                        owner: &j.owner,
                    },
                )
            })
            .collect();
        plan(
            &waiting,
            snap,
            &held,
            Rules {
                foreign_memory_threshold_mib: 512,
                policy,
            },
        )
    }

    fn run(queue: &[Job], snap: &[GpuInfo], held: &[(u32, &Job)]) -> Plan {
        plan_with(queue, snap, held, &Policy::none())
    }

    fn placed(p: &Plan) -> Vec<(&str, Vec<u32>)> {
        p.placements
            .iter()
            .map(|pl| (pl.id.as_str(), pl.gpus.clone()))
            .collect()
    }

    fn reserved(p: &Plan) -> Vec<(u32, &str)> {
        p.reserved.iter().map(|(g, j)| (*g, j.as_str())).collect()
    }

    fn policy(text: &str) -> Policy {
        let cfg: PolicyConfig = toml::from_str(text).unwrap();
        cfg.validate().unwrap();
        Policy::resolve(&cfg, |name| match name {
            "lab" => Some(500),
            _ => None,
        })
        .0
    }

    #[test]
    fn exclusive_two_gpus_two_jobs_third_waits() {
        let snap = gpus(2);
        let queue = [job("a", 1), job("b", 1), job("c", 1)];
        let p = run(&queue, &snap, &[]);
        assert_eq!(placed(&p), [("a", vec![0]), ("b", vec![1])]);
        // c waits, and there is nothing free to reserve.
        assert!(p.reserved.is_empty());
        let a = &queue[0];
        let p = run(&queue[2..], &snap, &[(0, a)]);
        assert_eq!(placed(&p), [("c", vec![1])]);
        let p = run(&queue[2..], &snap, &[(0, a), (1, a)]);
        assert!(p.placements.is_empty());
    }

    #[test]
    fn exclusive_whatever_the_mix() {
        // Every subset of held GPUs and a mixed queue: no GPU is given twice
        // or given while held, and no job gets fewer GPUs than it asked for.
        let snap = gpus(4);
        let holder = job("h", 1);
        let queue = [
            job("a", 2),
            job("b", 1),
            job("c", 4),
            job("d", 1),
            job("e", 3),
        ];
        for mask in 0u32..16 {
            let held: Vec<(u32, &Job)> = (0..4)
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| (i, &holder))
                .collect();
            let p = run(&queue, &snap, &held);
            let mut seen: BTreeSet<u32> = held.iter().map(|(g, _)| *g).collect();
            for pl in &p.placements {
                let want = queue
                    .iter()
                    .find(|j| j.id == pl.id)
                    .unwrap()
                    .request
                    .count();
                assert_eq!(pl.gpus.len(), want as usize, "mask {mask}: {pl:?}");
                for g in &pl.gpus {
                    assert!(seen.insert(*g), "mask {mask}: GPU {g} given twice");
                }
            }
            for g in p.reserved.keys() {
                assert!(!seen.contains(g), "mask {mask}: reserved GPU {g} is in use");
            }
        }
    }

    #[test]
    fn cpu_jobs_start_even_when_gpus_are_busy() {
        let snap = gpus(1);
        let h = job("h", 1);
        let p = run(&[job("g", 1), job("cpu", 0)], &snap, &[(0, &h)]);
        assert_eq!(placed(&p), [("cpu", vec![])]);
        // With no GPUs at all, CPU jobs still start.
        let p = run(&[job("cpu", 0)], &[], &[]);
        assert_eq!(placed(&p), [("cpu", vec![])]);
    }

    #[test]
    fn foreign_processes_make_a_gpu_unavailable() {
        // GPU 0: a colleague's notebook with 4 GiB. GPU 1: a small process
        // under the threshold.
        let snap = vec![foreign(gpu(0), 4096), foreign(gpu(1), 100), gpu(2)];
        let p = run(&[job("a", 1), job("b", 1), job("c", 1)], &snap, &[]);
        assert_eq!(placed(&p), [("a", vec![1]), ("b", vec![2])]);
        // A job that needs the busy GPU waits without reserving the others:
        // nobody knows when the notebook ends.
        let p = run(&[job("big", 3), job("small", 1)], &snap, &[]);
        assert_eq!(placed(&p), [("small", vec![1])]);
        assert!(p.reserved.is_empty());
        assert!(p.never.is_empty(), "busy is not never");
    }

    #[test]
    fn priority_then_arrival() {
        let snap = gpus(1);
        let queue = [
            job("old", 1),
            job("urgent", 1).prio(10),
            job("low", 1).prio(-5),
        ];
        assert_eq!(placed(&run(&queue, &snap, &[])), [("urgent", vec![0])]);
        let queue = [job("first", 1), job("second", 1)];
        assert_eq!(placed(&run(&queue, &snap, &[])), [("first", vec![0])]);
        let queue = [job("low", 1).prio(-5), job("zero", 1)];
        assert_eq!(placed(&run(&queue, &snap, &[])), [("zero", vec![0])]);
    }

    #[test]
    fn waiting_big_job_reserves_free_gpus() {
        // Two of four GPUs busy with a long job; a 4-GPU job waits and the
        // two free GPUs are kept for it, not given to the small jobs behind.
        let snap = gpus(4);
        let long = job("long", 2);
        let queue = [job("big", 4), job("s1", 1), job("s2", 1)];
        let p = run(&queue, &snap, &[(0, &long), (1, &long)]);
        assert!(p.placements.is_empty(), "{p:?}");
        assert_eq!(reserved(&p), [(2, "big"), (3, "big")]);
        // The long job ends: the big job starts first.
        let p = run(&queue, &snap, &[]);
        assert_eq!(placed(&p), [("big", vec![0, 1, 2, 3])]);
        // A higher-priority small job is ahead of the big one: it is served
        // first and the big job reserves what is left.
        let queue = [job("big", 4), job("vip", 1).prio(5), job("s1", 1)];
        let p = run(&queue, &snap, &[(0, &long), (1, &long)]);
        assert_eq!(placed(&p), [("vip", vec![2])]);
        assert_eq!(reserved(&p), [(3, "big")]);
    }

    #[test]
    fn stream_of_small_jobs_cannot_starve_a_big_one() {
        // Discrete time. Two 1-GPU jobs (3 ticks each) arrive every tick;
        // a 4-GPU job arrives at tick 2. First fit would keep at least one
        // GPU busy forever; the reservation gets the big job started as
        // soon as the small jobs ahead of it end.
        let snap = gpus(4);
        let mut queue: Vec<Job> = Vec::new();
        let mut running: Vec<(Job, Vec<u32>, u32)> = Vec::new();
        let mut started: BTreeMap<String, u32> = BTreeMap::new();
        let mut arrived: BTreeMap<String, u32> = BTreeMap::new();
        for t in 0..40u32 {
            running.retain(|(_, _, end)| *end > t);
            for k in 0..2 {
                let j = job(&format!("s{t}-{k}"), 1);
                arrived.insert(j.id.to_string(), t);
                queue.push(j);
            }
            if t == 2 {
                let j = job("big", 4);
                arrived.insert("big".into(), t);
                queue.push(j);
            }
            let held: Vec<(u32, &Job)> = running
                .iter()
                .flat_map(|(j, g, _)| g.iter().map(move |i| (*i, j)))
                .collect();
            let p = run(&queue, &snap, &held);
            let mut in_use: BTreeSet<u32> = held.iter().map(|(g, _)| *g).collect();
            for pl in p.placements {
                for g in &pl.gpus {
                    assert!(in_use.insert(*g), "t={t}: GPU {g} double-booked");
                }
                let pos = queue.iter().position(|j| j.id == pl.id).unwrap();
                let j = queue.remove(pos);
                started.insert(j.id.to_string(), t);
                running.push((j, pl.gpus, t + 3));
            }
        }
        let big = *started.get("big").expect("the 4-GPU job must start");
        // It waited only for the jobs already running or ahead of it.
        assert!(big <= 2 + 3 + 3, "big started at {big}");
        // No small job that arrived after it started before it.
        for (id, t) in &started {
            if arrived[id] > 2 {
                assert!(
                    *t >= big,
                    "{id} arrived after big but started at {t} < {big}"
                );
            }
        }
        // Small jobs keep flowing once it is done.
        assert!(started.values().filter(|t| **t > big + 3).count() > 10);
    }

    #[test]
    fn a_long_queue_behind_busy_gpus_still_starts_cpu_jobs_and_reports_the_impossible() {
        let snap = gpus(2);
        let long = job("long", 1);
        let mut queue: Vec<Job> = (0..5000).map(|i| job(&format!("g{i}"), 1)).collect();
        queue.push(job("cpu", 0));
        queue.push(job("huge", 3));
        // Both GPUs busy: nothing starts or is kept, yet the CPU job at
        // the back starts and the impossible one is reported.
        let p = run(&queue, &snap, &[(0, &long), (1, &long)]);
        assert_eq!(placed(&p), [("cpu", vec![])]);
        assert!(p.reserved.is_empty());
        assert_eq!(p.never.len(), 1);
        assert_eq!(p.never[0].0.as_str(), "huge");
        assert!(p.waiting_for_gpus);
        // One GPU frees: the first in line takes it, the rest wait.
        let p = run(&queue, &snap, &[(1, &long)]);
        assert_eq!(placed(&p), [("cpu", vec![]), ("g0", vec![0])]);
        assert!(p.waiting_for_gpus);
        // Nothing left that wants a GPU.
        let p = run(&queue[5000..5001], &snap, &[]);
        assert!(!p.waiting_for_gpus);
    }

    #[test]
    fn fair_share_order_is_priority_then_owner_factor_then_arrival_and_follows_every_change() {
        let mut queue = Queue::default();
        let id = |s: &str| JobId::parse(s).unwrap();
        // (id, priority, arrival, uid)
        for (name, prio, arrival, uid) in [
            ("a1", 0, 1, 1000),
            ("b1", 0, 2, 1001),
            ("a2", 0, 3, 1000),
            ("c1", 0, 4, 1002),
            ("b2", 0, 5, 1001),
            ("vip", 5, 9, 1000),
            ("low", -1, 0, 1001),
        ] {
            queue.push(id(name), prio, true, arrival, (uid, 100));
        }
        queue.push(id("cpu"), 0, false, 0, (1000, 100));
        let order = |q: &Queue, f: &[(u32, f64)]| -> Vec<String> {
            let factors = f.iter().copied().collect();
            q.gpu_jobs_fair(&factors).map(|j| j.to_string()).collect()
        };
        // Equal factors: owners by their first arrival, each owner's jobs together.
        assert_eq!(
            order(&queue, &[]),
            ["vip", "a1", "a2", "b1", "b2", "c1", "low"]
        );
        // Bob used least, then Carol, then Alice; priority still comes first.
        assert_eq!(
            order(&queue, &[(1000, 0.2), (1001, 0.9), (1002, 0.5)]),
            ["vip", "b1", "b2", "c1", "a1", "a2", "low"]
        );
        assert_eq!(
            queue.gpu_owners().collect::<Vec<_>>(),
            [(1000, 100), (1001, 100), (1002, 100)]
        );
        queue.remove(&id("b1"));
        queue.remove(&id("c1"));
        queue.reprioritize(&id("a2"), 5);
        assert_eq!(
            queue.gpu_owners().collect::<Vec<_>>(),
            [(1000, 100), (1001, 100)],
            "Carol has no queued job left"
        );
        assert_eq!(
            order(&queue, &[(1000, 0.2), (1001, 0.9), (1002, 0.5)]),
            // a2 is Alice's too and arrived before vip.
            ["a2", "vip", "b2", "a1", "low"]
        );
        // The same jobs as planning order reads them, and it is lazy.
        assert_eq!(
            queue.gpu_jobs_fair(&Default::default()).count(),
            queue.gpu_jobs().count()
        );
        let mut big = Queue::default();
        for i in 0..10_000u32 {
            big.push(
                id(&format!("j{i}")),
                0,
                true,
                i as u64,
                (1000 + i % 50, 100),
            );
        }
        let factors = (0..50).map(|u| (1000 + u, f64::from(u))).collect();
        let first: Vec<String> = big
            .gpu_jobs_fair(&factors)
            .take(2)
            .map(|j| j.to_string())
            .collect();
        assert_eq!(first, ["j49", "j99"], "user 1049 has the highest factor");
    }

    #[test]
    fn a_queue_in_planning_order_is_read_only_as_far_as_gpus_are_left() {
        let snap = gpus(2);
        let long = job("long", 1);
        let jobs: Vec<Job> = (0..10_000)
            .map(|i| job(&format!("g{i:05}"), 1).prio(i % 3))
            .chain([job("huge", 3), job("cpu", 0)])
            .collect();
        let mut queue = Queue::default();
        for j in &jobs {
            queue.push(
                j.id.clone(),
                j.priority,
                j.request.count() > 0,
                0,
                (1000, 1000),
            );
        }
        queue.push(jobs[0].id.clone(), 7, true, 0, (1000, 1000));
        assert_eq!(queue.len(), 10_002);
        let by_id: std::collections::HashMap<&JobId, &Job> =
            jobs.iter().map(|j| (&j.id, j)).collect();
        let held: BTreeMap<u32, Holder<'_>> = [(
            1,
            Holder {
                id: &long.id,
                owner: &long.owner,
            },
        )]
        .into();
        let policy = Policy::none();
        let rules = Rules {
            foreign_memory_threshold_mib: 512,
            policy: &policy,
        };
        let plan_reading = |queue: &Queue, check_never: bool| {
            let read = std::cell::Cell::new(0);
            let cpu: Vec<Waiting<'_>> = queue.cpu_jobs().map(|id| by_id[id].waiting()).collect();
            let gpu = queue.gpu_jobs().map(|id| {
                read.set(read.get() + 1);
                by_id[id].waiting()
            });
            let p = plan_in_order(&cpu, gpu, &snap, &held, rules, check_never);
            (p, read.get())
        };
        // One GPU is free: the first job of the highest priority (then
        // arrival) takes it, and the plan stops reading right after.
        let (p, read) = plan_reading(&queue, false);
        assert_eq!(placed(&p), [("cpu", vec![]), ("g00002", vec![0])]);
        assert!(p.waiting_for_gpus && p.never.is_empty());
        assert_eq!(read, 2);
        // After the GPUs changed, every job is checked again.
        let (p, read) = plan_reading(&queue, true);
        assert_eq!(placed(&p), [("cpu", vec![]), ("g00002", vec![0])]);
        assert_eq!(p.never.len(), 1);
        assert_eq!(p.never[0].0.as_str(), "huge");
        assert_eq!(read, 10_001);
        // The same decisions as planning the whole queue at once.
        assert_eq!(placed(&run(&jobs, &snap, &[(1, &long)])), placed(&p));
        assert!(queue.remove(&jobs[2].id) && !queue.remove(&jobs[2].id));
        let (p, _) = plan_reading(&queue, false);
        assert_eq!(placed(&p), [("cpu", vec![]), ("g00005", vec![0])]);
        assert_eq!(queue.len(), 10_001);
        assert_eq!(
            inventory_fingerprint(&snap),
            inventory_fingerprint(&gpus(2))
        );
        assert_ne!(
            inventory_fingerprint(&snap),
            inventory_fingerprint(&gpus(3))
        );
    }

    #[test]
    fn small_jobs_backfill_gpus_the_big_job_cannot_use() {
        // GPUs 0-1 are A100s (held), 2-3 H100s (free). The big job wants
        // two A100s: it reserves nothing it cannot use, so a small job
        // takes an H100.
        let mut snap = gpus(4);
        for g in &mut snap[..2] {
            g.name = "NVIDIA A100-SXM4-80GB".into();
        }
        let long = job("long", 2);
        let queue = [
            job("big", 2).asking(serde_json::json!({"count": 2, "model": "a100"})),
            job("small", 1),
        ];
        let p = run(&queue, &snap, &[(0, &long), (1, &long)]);
        assert_eq!(placed(&p), [("small", vec![2])]);
        assert!(p.reserved.is_empty());

        // Named GPUs: the big job may only use 0-2; GPU 3 is free for others.
        let snap = gpus(4);
        let queue = [
            job("big", 3).asking(serde_json::json!({"indices": [0, 1, 2]})),
            job("s1", 1),
            job("s2", 1),
        ];
        let p = run(&queue, &snap, &[(0, &long)]);
        assert_eq!(placed(&p), [("s1", vec![3])]);
        assert_eq!(reserved(&p), [(1, "big"), (2, "big")]);

        // Free memory: GPU 1 has a small foreign process (under the
        // threshold) leaving too little for the big job, so it is not
        // reserved and a small job may take it.
        let mut snap = gpus(3);
        snap[1] = foreign(gpu(1), 400);
        let queue = [
            job("big", 2).asking(serde_json::json!({"count": 2, "min_free_memory_mib": 700})),
            job("small", 1),
        ];
        let p = run(&queue, &snap, &[(0, &long)]);
        assert_eq!(placed(&p), [("small", vec![1])]);
        assert_eq!(reserved(&p), [(2, "big")]);
    }

    #[test]
    fn policy_caps_users_and_groups() {
        let pol = policy(
            r#"
            [users.alice]
            max_gpus = 1
            [groups.lab]
            max_gpus = 2
            "#,
        );
        let snap = gpus(4);
        // Alice may hold one GPU at once; her second job waits without
        // holding anything back from bob.
        let queue = [job("a1", 1), job("a2", 1), job("b1", 1).by("bob", 7)];
        let p = plan_with(&queue, &snap, &[], &pol);
        assert_eq!(placed(&p), [("a1", vec![0]), ("b1", vec![1])]);
        assert!(p.reserved.is_empty());
        // Her running job counts against the cap.
        let p = plan_with(&queue[1..], &snap, &[(3, &queue[0])], &pol);
        assert_eq!(placed(&p), [("b1", vec![0])]);

        // The lab group shares 2 GPUs among its members (primary or
        // supplementary membership).
        let mut c = job("c1", 1).by("carol", 500);
        let mut d = job("d1", 2).by("dave", 9);
        d.owner.groups = vec![500];
        let e = job("e1", 1).by("erin", 500);
        c.priority = 1;
        let p = plan_with(&[c.clone(), d.clone(), e.clone()], &snap, &[], &pol);
        // d1 waits for carol's GPU to count against lab's cap no more; e1,
        // behind it, may not take the share of the cap d1 needs.
        assert_eq!(placed(&p), [("c1", vec![0])]);
        assert!(p.reserved.is_empty());
        assert_eq!(
            p.waits[&e.id].describe(&e.request),
            "waiting for 1 GPU: group lab holds 1 GPU of max_gpus = 2 (policy.groups.lab), \
             and d1, queued ahead of it, waits for 2 of them"
        );
        let p = plan_with(&[d.clone(), e.clone()], &snap, &[], &pol);
        assert_eq!(placed(&p), [("d1", vec![0, 1])]);
        // Someone outside the group is not held back.
        let f = job("f1", 1).by("frank", 9);
        let p = plan_with(&[d.clone(), f], &snap, &[(0, &c)], &pol);
        assert_eq!(placed(&p), [("f1", vec![1])]);
    }

    #[test]
    fn a_capped_users_big_job_is_not_starved_by_her_own_small_ones() {
        let pol = policy("[users.alice]\nmax_gpus = 4\n");
        let snap = gpus(8);
        let s: Vec<Job> = (0..3).map(|i| job(&format!("s{i}"), 1)).collect();
        let held = [(0, &s[0]), (1, &s[1]), (2, &s[2])];
        let queue = [
            job("big", 4),
            job("t1", 1),
            job("t2", 1),
            job("b1", 1).by("bob", 7),
        ];
        // She holds 3 of her 4: big waits for the cap; t1 and t2 would fit
        // in it but take what big needs, so they wait too. Bob is not held
        // back, and nothing is reserved (the free GPUs are not what big
        // waits for).
        let p = plan_with(&queue, &snap, &held, &pol);
        assert_eq!(placed(&p), [("b1", vec![3])]);
        assert!(p.reserved.is_empty());
        let said = |p: &Plan, j: &Job| p.waits[&j.id].describe(&j.request);
        assert_eq!(
            said(&p, &queue[0]),
            "waiting for 4 GPUs: alice holds 3 GPUs of max_gpus = 4 (policy.users.alice)"
        );
        assert_eq!(
            said(&p, &queue[1]),
            "waiting for 1 GPU: alice holds 3 GPUs of max_gpus = 4 (policy.users.alice), \
             and big, queued ahead of it, waits for 4 of them"
        );
        assert!(
            said(&p, &queue[2])
                .ends_with("and big and 1 other job(s) queued ahead of it wait for 5 of them"),
            "{}",
            said(&p, &queue[2])
        );
        // As her jobs end, none of her later ones takes the freed share.
        let p = plan_with(&queue[..3], &snap, &held[..1], &pol);
        assert!(p.placements.is_empty(), "{p:?}");
        // Once they have all ended, big starts first; t1 waits for it.
        let p = plan_with(&queue[..3], &snap, &[], &pol);
        assert_eq!(placed(&p), [("big", vec![0, 1, 2, 3])]);
        assert!(said(&p, &queue[1]).contains("alice holds 4 GPUs of max_gpus = 4"));
        // A higher priority says which of her jobs is ahead.
        let urgent = [job("big", 4), job("t1", 1).prio(1)];
        let p = plan_with(&urgent, &snap, &held, &pol);
        assert_eq!(placed(&p), [("t1", vec![3])]);
    }

    #[test]
    fn under_a_cap_a_stream_of_her_small_jobs_cannot_starve_her_big_one() {
        // Discrete time, 8 GPUs, alice capped at 4: two of her 1-GPU jobs
        // (3 ticks each) arrive every tick, her 4-GPU job at tick 2. The
        // GPUs are never short; her cap is. Without her big job's share of
        // the cap kept, a small job would always be at hand to take it.
        let pol = policy("[users.alice]\nmax_gpus = 4\n");
        let snap = gpus(8);
        let mut queue: Vec<Job> = Vec::new();
        let mut running: Vec<(Job, Vec<u32>, u32)> = Vec::new();
        let mut started: BTreeMap<String, u32> = BTreeMap::new();
        let mut arrived: BTreeMap<String, u32> = BTreeMap::new();
        for t in 0..40u32 {
            running.retain(|(_, _, end)| *end > t);
            for k in 0..2 {
                let j = job(&format!("s{t}-{k}"), 1);
                arrived.insert(j.id.to_string(), t);
                queue.push(j);
            }
            if t == 2 {
                arrived.insert("big".into(), t);
                queue.push(job("big", 4));
            }
            let held: Vec<(u32, &Job)> = running
                .iter()
                .flat_map(|(j, g, _)| g.iter().map(move |i| (*i, j)))
                .collect();
            let p = plan_with(&queue, &snap, &held, &pol);
            let in_use = held.len() + p.placements.iter().map(|pl| pl.gpus.len()).sum::<usize>();
            assert!(in_use <= 4, "t={t}: alice holds {in_use} GPUs");
            for pl in p.placements {
                let pos = queue.iter().position(|j| j.id == pl.id).unwrap();
                let j = queue.remove(pos);
                started.insert(j.id.to_string(), t);
                running.push((j, pl.gpus, t + 3));
            }
        }
        let big = *started.get("big").expect("her 4-GPU job must start");
        // It waited only for her jobs running or queued ahead of it.
        assert!(big <= 2 + 3 + 3, "big started at {big}");
        for (id, t) in &started {
            if arrived[id] > 2 {
                assert!(
                    *t >= big,
                    "{id} arrived after big but started at {t} < {big}"
                );
            }
        }
        assert!(started.values().filter(|t| **t > big + 3).count() > 10);
    }

    #[test]
    fn a_waiting_job_says_what_it_waits_for() {
        let snap = gpus(4);
        let long = job("long", 2);
        let p = run(&[job("big", 4)], &snap, &[(0, &long), (1, &long)]);
        assert_eq!(
            p.waits[&JobId::parse("big").unwrap()].describe(&GpuRequest::any(4)),
            "waiting for 4 GPUs: 2 of the 4 GPUs it may use free (kept for it meanwhile); \
             the others are held by running jobs"
        );
        // big may use GPUs 0-2 and keeps 1 and 2; pair finds GPU 3 alone.
        let queue = [
            job("big", 3).asking(serde_json::json!({"indices": [0, 1, 2]})),
            job("pair", 2),
        ];
        let p = run(&queue, &snap, &[(0, &long)]);
        assert_eq!(
            p.waits[&queue[1].id].describe(&queue[1].request),
            "waiting for 2 GPUs: 1 free for it; GPUs 1,2 kept for big, queued ahead of it; \
             the others are held"
        );
        // Once every GPU is spoken for, the jobs behind are not read.
        let p = run(&[job("big", 4), job("one", 1)], &snap, &[(0, &long)]);
        assert!(!p.waits.contains_key(&JobId::parse("one").unwrap()));
        // Busy GPUs from other programs: it reserves nothing, and says so.
        let snap = vec![foreign(gpu(0), 4096), gpu(1)];
        let j = job("both", 2);
        let p = run(std::slice::from_ref(&j), &snap, &[]);
        assert!(p.reserved.is_empty());
        assert!(
            p.waits[&j.id]
                .describe(&j.request)
                .contains("leave only 1 of the GPUs it may use"),
            "{p:?}"
        );
        // A job placed has nothing to wait for.
        let p = run(&[job("a", 1)], &gpus(1), &[]);
        assert!(p.waits.is_empty());
    }

    #[test]
    fn policy_allowed_gpus_and_default() {
        let pol = policy(
            r#"
            [default]
            allowed_gpus = [2, 3]
            [users.alice]
            allowed_gpus = [0]
            "#,
        );
        let snap = gpus(4);
        let queue = [job("a", 1), job("b", 2).by("bob", 7), job("a2", 1)];
        let p = plan_with(&queue, &snap, &[], &pol);
        assert_eq!(placed(&p), [("a", vec![0]), ("b", vec![2, 3])]);
        // a2 can only ever use GPU 0, which a holds: it waits, reserving nothing.
        assert!(p.reserved.is_empty());
        assert!(p.never.is_empty());
    }

    #[test]
    fn jobs_that_can_never_start_are_reported_not_reserved_for() {
        let pol = policy("[users.alice]\nmax_gpus = 2\nallowed_gpus = [0, 1, 2]\n");
        let snap = gpus(4);
        let o = owner("alice", 100);
        let bob = owner("bob", 7);
        let never = |r: serde_json::Value, who: &Owner| {
            let j = job("x", 1).asking(r);
            never_reason(&j.request, who, &snap, &pol)
        };
        let too_many = never(serde_json::json!(5), &bob).unwrap();
        assert!(
            too_many.contains("only 4") && too_many.contains("at most 4"),
            "{too_many}"
        );
        let model = never(serde_json::json!({"count": 1, "model": "A100"}), &bob).unwrap();
        assert!(
            model.contains("`gpus.model`") && model.contains("H100"),
            "{model}"
        );
        let index = never(serde_json::json!({"indices": [7]}), &bob).unwrap();
        assert!(
            index.contains("`gpus.indices`") && index.contains("GPU 7"),
            "{index}"
        );
        let uuid = never(serde_json::json!({"uuids": ["GPU-77"]}), &bob).unwrap();
        assert!(uuid.contains("`gpus.uuids`"), "{uuid}");
        let mem = never(serde_json::json!({"count": 1, "min_memory": "2G"}), &bob).unwrap();
        assert!(
            mem.contains("1000 MiB") && mem.contains("min_memory"),
            "{mem}"
        );
        let cap = never(serde_json::json!(3), &o).unwrap();
        assert!(
            cap.contains("`policy.users.alice.max_gpus`") && cap.contains("at most 2"),
            "{cap}"
        );
        let allowed = never(serde_json::json!({"count": 1, "indices": [3]}), &o).unwrap();
        assert!(
            allowed.contains("`policy.users.alice.allowed_gpus`")
                && allowed.contains("lets alice use none of the matching GPUs;")
                && !allowed.contains("at most 0"),
            "{allowed}"
        );
        assert_eq!(never(serde_json::json!(2), &o), None);
        assert_eq!(never(serde_json::json!(4), &bob), None);
        assert_eq!(never(serde_json::json!(0), &bob), None);
        let none = never_reason(&GpuRequest::any(1), &bob, &[], &pol).unwrap();
        assert!(
            none.contains("no GPUs") && none.contains("drop `gpus`"),
            "{none}"
        );
        let lower = never(serde_json::json!({"count": 4, "model": "h100"}), &bob);
        assert_eq!(lower, None, "model matching ignores case");

        // In a plan: reported, and the job behind it is not held back.
        let queue = [job("huge", 8), job("small", 1)];
        let p = plan_with(&queue, &snap, &[], &pol);
        assert_eq!(placed(&p), [("small", vec![0])]);
        assert_eq!(p.never.len(), 1);
        assert_eq!(p.never[0].0.as_str(), "huge");
        assert!(p.reserved.is_empty());
    }

    #[test]
    fn a_vanished_or_unhealthy_gpu_is_not_used() {
        // GPU 1 vanished from the snapshot altogether.
        let snap = vec![gpu(0), gpu(2), gpu(3)];
        let p = run(&[job("a", 2), job("b", 1)], &snap, &[]);
        assert_eq!(placed(&p), [("a", vec![0, 2]), ("b", vec![3])]);
        // As the pool monitor reports it: listed, unhealthy.
        let mut tracker = crate::gpu::PoolTracker::default();
        tracker.observe(&mut gpus(4));
        let mut snap = vec![gpu(0), gpu(2), gpu(3)];
        tracker.observe(&mut snap);
        assert_eq!(snap.len(), 4);
        let p = run(&[job("all", 4), job("b", 1)], &snap, &[]);
        // The 4-GPU job cannot start until GPU 1 is back; it does not
        // block others meanwhile and is not rejected (it may come back).
        assert_eq!(placed(&p), [("b", vec![0])]);
        assert!(p.reserved.is_empty() && p.never.is_empty());
        let p = run(&[job("all", 4)], &gpus(4), &[]);
        assert_eq!(placed(&p), [("all", vec![0, 1, 2, 3])]);
    }

    #[test]
    fn multi_gpu_jobs_stay_close() {
        // Two NUMA nodes with two GPUs each; GPU 0 is taken.
        let snap: Vec<GpuInfo> = (0..4)
            .map(|i| GpuInfo {
                numa_node: Some(i / 2),
                topology_group: Some(i / 2 * 2),
                ..gpu(i)
            })
            .collect();
        let h = job("h", 1);
        let p = run(&[job("pair", 2)], &snap, &[(0, &h)]);
        assert_eq!(placed(&p), [("pair", vec![2, 3])]);
        // A single GPU goes where it breaks no pair up.
        let p = run(&[job("one", 1), job("pair", 2)], &snap, &[(0, &h)]);
        assert_eq!(placed(&p), [("one", vec![1]), ("pair", vec![2, 3])]);
    }
}
