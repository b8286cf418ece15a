//! Whether a spool file becomes jobs: every rule a claimed file must pass,
//! in the order that decides which refusal its owner reads, and the records
//! it becomes. Pure: what it must know of the jobs ptraind has comes
//! through [`Known`], the GPUs as a snapshot, so each rule has a unit test
//! without root. The checks that are I/O (the owner's passwd entry before,
//! the workdir as the owner after, the claim's writes) stay with the state
//! task ([`super::Daemon::claim`]).

use crate::gpu::GpuInfo;
use crate::notifications::NotificationsConfig;
use crate::policy::Policy;
use crate::resources::LimitsConfig;
use crate::spec::{parse_spec, JobId, JobSpec};
use crate::store::{JobRecord, SpoolSource};
use crate::users::Owner;

/// The host's rules for new jobs (`ptraind.toml`).
pub struct Rules<'a> {
    pub allow_root_jobs: bool,
    pub max_queued_per_user: usize,
    pub limits: &'a LimitsConfig,
    pub notifications: &'a NotificationsConfig,
    pub policy: &'a Policy,
    /// `[jobs] max_stop_grace`.
    pub max_stop_grace: std::time::Duration,
    /// `[jobs] max_retries`.
    pub max_retries: u32,
}

/// A job ptraind knows under some id, live or ended.
pub struct Namesake {
    pub source: SpoolSource,
    pub status: &'static str,
    pub owner_name: String,
}

/// What admission asks of the jobs ptraind knows.
pub trait Known {
    /// The job (or, for a sweep's id, its first member) known as `id`.
    fn namesake(&self, id: &JobId) -> Option<Namesake>;
    /// The members of sweep `id`, in expansion order, if it is one.
    fn sweep_members(&self, id: &JobId) -> Option<&[JobId]>;
    /// Whether `id` names a job or a sweep, live or ended.
    fn is_taken(&self, id: &JobId) -> bool;
    /// The uid and name of the owner of the job `id` names.
    fn owner_of(&self, id: &JobId) -> Option<(u32, String)>;
    /// How many of `uid`'s jobs are queued.
    fn queued_of(&self, uid: u32) -> usize;
    /// Whether job `id` was claimed from exactly these descriptor bytes
    /// (its stored copy; I/O in the daemon, a map in the tests).
    fn claimed_from(&self, id: &JobId, bytes: &[u8]) -> bool;
    /// The GPUs now, asked only of a job that wants some; None when the
    /// inventory cannot be read, which proves nothing, so the job is then
    /// accepted.
    fn gpus(&self) -> Option<Vec<GpuInfo>>;
}

/// A file to admit: its spool name, the stem that is its id when it names
/// none, its bytes, and the identity it was opened with.
pub struct Submitted<'a> {
    pub stem: &'a str,
    pub bytes: &'a [u8],
    pub source: SpoolSource,
}

/// What becomes of a file.
#[derive(Debug)]
pub enum Admission {
    /// New jobs: one, or a sweep's members under `group`, its id.
    Accept {
        records: Vec<JobRecord>,
        group: Option<JobId>,
    },
    /// This very file was claimed before a crash that came between the
    /// claim and the unlink: finish the unlink, never run it twice.
    ClaimedBefore(JobId),
    /// Refused, with the reason its owner reads.
    Refuse(String),
}

/// Decides what `file`, owned by `owner`, becomes at `now` (µs).
pub fn admit(
    file: &Submitted<'_>,
    owner: &Owner,
    rules: &Rules<'_>,
    known: &impl Known,
    now: u64,
) -> Admission {
    match check(file, owner, rules, known) {
        Ok(Checked::New(spec)) => {
            let begin_at = match spec.begin.map(|begin| {
                let written = crate::spec::begin::written_at(file.source.ctime_ns);
                crate::spec::begin::resolve(begin, written, now)
            }) {
                None => None,
                Some(Ok(at)) => Some(at),
                Some(Err(reason)) => return Admission::Refuse(reason),
            };
            let limits = match crate::resources::effective_limits(
                &spec.resources,
                &rules.limits.caps_for(&owner.name),
                &owner.name,
            ) {
                Ok(limits) => limits,
                Err(reason) => return Admission::Refuse(reason),
            };
            let group = spec.sweep.as_ref().map(|_| spec.id.clone());
            let max_parallel = spec.sweep.as_ref().and_then(|s| s.max_parallel);
            let records = members(&spec)
                .into_iter()
                .map(|member| {
                    let mut record =
                        JobRecord::new(member.spec, owner.clone(), file.source.clone(), now);
                    record.limits = limits;
                    record.group = group.clone();
                    record.params = member.params;
                    record.max_parallel = max_parallel;
                    record.begin_at = begin_at;
                    record
                })
                .collect();
            Admission::Accept { records, group }
        }
        Ok(Checked::ClaimedBefore(id)) => Admission::ClaimedBefore(id),
        Err(reason) => Admission::Refuse(reason),
    }
}

enum Checked {
    New(Box<JobSpec>),
    ClaimedBefore(JobId),
}

fn members(spec: &JobSpec) -> Vec<crate::chain::Member> {
    match &spec.sweep {
        Some(sweep) => crate::chain::expand(spec, sweep),
        None => vec![crate::chain::Member {
            spec: spec.clone(),
            params: Default::default(),
        }],
    }
}

/// The rules in order; the first that fails is the reason.
fn check(
    file: &Submitted<'_>,
    owner: &Owner,
    rules: &Rules<'_>,
    known: &impl Known,
) -> Result<Checked, String> {
    if owner.uid == 0 && !rules.allow_root_jobs {
        return Err("it is owned by root and allow_root_jobs is false; submit it as the user who should run it".into());
    }
    let spec = parse_spec(file.bytes, file.stem).map_err(|e| e.to_string())?;
    if let Some(user) = &spec.user {
        if *user != owner.name {
            return Err(format!(
                "field `user` says {user:?} but the file belongs to {:?}; jobs run as the file's owner, \
                 so drop the `user` field or submit as {user:?}",
                owner.name
            ));
        }
    }
    if spec.gpus.count() > 0 {
        if let Some(gpus) = known.gpus() {
            // GPUs the machine or the policy can never give would leave
            // the job waiting forever: say so now.
            if let Some(why) =
                crate::scheduler::never_reason(&spec.gpus, owner, &gpus, rules.policy)
            {
                return Err(why);
            }
        }
    }
    if let Some(grace) = spec.stop_grace.filter(|g| *g > rules.max_stop_grace) {
        return Err(format!(
            "field `stop_grace` ({}) is longer than this host allows (max_stop_grace {}); ask for at most that",
            humantime::format_duration(grace),
            humantime::format_duration(rules.max_stop_grace)
        ));
    }
    if let Some(retries) = spec
        .retry
        .as_ref()
        .map(|r| r.retries)
        .filter(|n| *n > rules.max_retries)
    {
        return Err(format!(
            "field `retries` is {retries}, more than this host allows (max_retries {}); ask for at most that",
            rules.max_retries
        ));
    }
    check_dependencies(&spec, owner, known)?;
    crate::notifications::check_job(rules.notifications, spec.notify.as_deref(), &owner.name)?;
    // A sweep is known by its first member's record.
    let existing_id = match known.sweep_members(&spec.id) {
        Some(members) => members.first().cloned(),
        None => Some(spec.id.clone()),
    };
    if let Some(id) = existing_id {
        if let Some(namesake) = known.namesake(&id) {
            if namesake.source == file.source && known.claimed_from(&id, file.bytes) {
                return Ok(Checked::ClaimedBefore(spec.id));
            }
            return Err(format!(
                "job id {:?} already exists ({}, owner {}); ids are unique: pick another `id` or file name",
                spec.id.as_str(),
                namesake.status,
                namesake.owner_name,
            ));
        }
    }
    let members = members(&spec);
    if let Some(taken) = members
        .iter()
        .map(|m| &m.spec.id)
        .find(|id| known.is_taken(id))
    {
        return Err(format!(
            "the sweep's job id {:?} already exists; give the sweep another `id`",
            taken.as_str()
        ));
    }
    let queued = known.queued_of(owner.uid);
    if queued + members.len() > rules.max_queued_per_user {
        return Err(format!(
            "{} already has {queued} queued jobs, the limit (max_queued_per_user); wait for some to start",
            owner.name
        ));
    }
    Ok(Checked::New(Box::new(spec)))
}

/// Every job named in `after` must be known and the owner's own.
fn check_dependencies(spec: &JobSpec, owner: &Owner, known: &impl Known) -> Result<(), String> {
    for dep in spec.after.all() {
        let first = match known.sweep_members(dep) {
            Some(members) => members.first(),
            None => Some(dep),
        };
        let Some((parent_uid, parent_owner)) = first.and_then(|id| known.owner_of(id)) else {
            return Err(format!(
                "it depends on {:?}, which ptraind does not know; submit the jobs it waits for first",
                dep.as_str()
            ));
        };
        if parent_uid != owner.uid {
            return Err(format!(
                "it depends on {:?}, which belongs to {parent_owner}; a job may only wait for its owner's own jobs",
                dep.as_str(),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;
    use crate::store::test_kit;

    /// Jobs ptraind knows, as maps.
    #[derive(Default)]
    struct Jobs {
        records: BTreeMap<JobId, JobRecord>,
        sweeps: BTreeMap<JobId, Vec<JobId>>,
        descriptors: HashMap<JobId, Vec<u8>>,
        queued: HashMap<u32, usize>,
        gpus: Option<Vec<GpuInfo>>,
    }

    impl Jobs {
        fn with(mut self, record: JobRecord, bytes: &str) -> Jobs {
            self.descriptors
                .insert(record.id.clone(), bytes.as_bytes().to_vec());
            self.records.insert(record.id.clone(), record);
            self
        }
    }

    impl Known for Jobs {
        fn namesake(&self, id: &JobId) -> Option<Namesake> {
            self.records.get(id).map(|r| Namesake {
                source: r.source.clone(),
                status: r.status(),
                owner_name: r.owner.name.clone(),
            })
        }
        fn sweep_members(&self, id: &JobId) -> Option<&[JobId]> {
            self.sweeps.get(id).map(Vec::as_slice)
        }
        fn is_taken(&self, id: &JobId) -> bool {
            self.records.contains_key(id) || self.sweeps.contains_key(id)
        }
        fn owner_of(&self, id: &JobId) -> Option<(u32, String)> {
            self.records
                .get(id)
                .map(|r| (r.owner.uid, r.owner.name.clone()))
        }
        fn queued_of(&self, uid: u32) -> usize {
            self.queued.get(&uid).copied().unwrap_or(0)
        }
        fn claimed_from(&self, id: &JobId, bytes: &[u8]) -> bool {
            self.descriptors.get(id).is_some_and(|d| d == bytes)
        }
        fn gpus(&self) -> Option<Vec<GpuInfo>> {
            self.gpus.clone()
        }
    }

    struct Host {
        limits: LimitsConfig,
        notifications: NotificationsConfig,
        policy: Policy,
        allow_root_jobs: bool,
        max_queued_per_user: usize,
    }

    impl Host {
        fn new() -> Host {
            Host {
                limits: LimitsConfig::default(),
                notifications: NotificationsConfig::default(),
                policy: Policy::none(),
                allow_root_jobs: false,
                max_queued_per_user: 10,
            }
        }

        fn rules(&self) -> Rules<'_> {
            Rules {
                allow_root_jobs: self.allow_root_jobs,
                max_queued_per_user: self.max_queued_per_user,
                limits: &self.limits,
                notifications: &self.notifications,
                policy: &self.policy,
                max_stop_grace: std::time::Duration::from_secs(120),
                max_retries: 3,
            }
        }

        fn admit(&self, json: &str, stem: &str, owner: &Owner, known: &Jobs) -> Admission {
            let file = Submitted {
                stem,
                bytes: json.as_bytes(),
                source: test_kit::source(stem),
            };
            admit(&file, owner, &self.rules(), known, 100)
        }
    }

    const TRUE: &str = r#"{"version": 1, "command": ["true"]}"#;

    fn refusal(admission: Admission) -> String {
        match admission {
            Admission::Refuse(reason) => reason,
            other => panic!("accepted: {other:?}"),
        }
    }

    fn alice() -> Owner {
        test_kit::owner(1000, "alice")
    }

    #[test]
    fn a_valid_file_becomes_one_queued_record_of_its_owner() {
        let Admission::Accept { records, group } =
            Host::new().admit(TRUE, "train", &alice(), &Jobs::default())
        else {
            panic!("refused")
        };
        assert!(group.is_none());
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].id.as_str(), "train");
        assert_eq!(records[0].owner.name, "alice");
        assert_eq!(records[0].submitted_at, 100);
        assert_eq!(records[0].source, test_kit::source("train"));
    }

    #[test]
    fn a_begin_resolves_from_the_files_ctime_for_every_member_and_a_past_one_is_refused() {
        let host = Host::new();
        let written_us = 1_796_220_000_000_000u64;
        let file = |json: &'static str| Submitted {
            stem: "b",
            bytes: json.as_bytes(),
            source: SpoolSource {
                ctime_ns: i128::from(written_us) * 1000,
                ..test_kit::source("b")
            },
        };
        let now = written_us + 30_000_000;
        let json = r#"{"version": 1, "command": ["true"], "begin": "2h", "sweep": {"lr": [1, 2]}}"#;
        let Admission::Accept { records, .. } =
            admit(&file(json), &alice(), &host.rules(), &Jobs::default(), now)
        else {
            panic!("refused")
        };
        assert_eq!(records.len(), 2);
        for r in &records {
            assert_eq!(r.begin_at, Some(written_us + 7_200_000_000), "{}", r.id);
        }
        let past = r#"{"version": 1, "command": ["true"], "begin": "1990-01-01T00:00:00Z"}"#;
        let reason = refusal(admit(
            &file(past),
            &alice(),
            &host.rules(),
            &Jobs::default(),
            now,
        ));
        assert!(
            reason.contains("field `begin`") && reason.contains("had passed"),
            "{reason}"
        );
        let no_begin = Host::new().admit(TRUE, "t", &alice(), &Jobs::default());
        assert!(
            matches!(no_begin, Admission::Accept { records, .. } if records[0].begin_at.is_none())
        );
    }

    #[test]
    fn a_stop_grace_beyond_the_hosts_maximum_is_refused_with_it() {
        let host = Host::new();
        let ok = host.admit(
            r#"{"version":1,"command":["x"],"stop_grace":"2m"}"#,
            "a",
            &alice(),
            &Jobs::default(),
        );
        assert!(matches!(ok, Admission::Accept { .. }), "{ok:?}");
        let why = refusal(host.admit(
            r#"{"version":1,"command":["x"],"stop_grace":"3m"}"#,
            "b",
            &alice(),
            &Jobs::default(),
        ));
        assert!(
            why.contains("field `stop_grace`") && why.contains("max_stop_grace 2m"),
            "{why}"
        );
    }

    #[test]
    fn retries_beyond_the_hosts_maximum_are_refused_with_it() {
        let host = Host::new();
        let ok = host.admit(
            r#"{"version":1,"command":["x"],"retries":3}"#,
            "a",
            &alice(),
            &Jobs::default(),
        );
        assert!(matches!(ok, Admission::Accept { .. }), "{ok:?}");
        let why = refusal(host.admit(
            r#"{"version":1,"command":["x"],"retries":4}"#,
            "b",
            &alice(),
            &Jobs::default(),
        ));
        assert!(
            why.contains("field `retries` is 4") && why.contains("max_retries 3"),
            "{why}"
        );
    }

    #[test]
    fn root_files_are_refused_unless_the_host_allows_root_jobs() {
        let mut host = Host::new();
        let root = test_kit::owner(0, "root");
        let reason = refusal(host.admit(TRUE, "r", &root, &Jobs::default()));
        assert!(reason.contains("allow_root_jobs is false"), "{reason}");
        host.allow_root_jobs = true;
        assert!(matches!(
            host.admit(TRUE, "r", &root, &Jobs::default()),
            Admission::Accept { .. }
        ));
    }

    #[test]
    fn a_user_field_that_is_not_the_owner_is_refused_with_the_fix() {
        let json = r#"{"version": 1, "command": ["true"], "user": "bob"}"#;
        let reason = refusal(Host::new().admit(json, "u", &alice(), &Jobs::default()));
        assert!(reason.contains("drop the `user` field"), "{reason}");
    }

    #[test]
    fn gpus_the_machine_never_has_are_refused_and_an_unread_inventory_proves_nothing() {
        let json = r#"{"version": 1, "command": ["true"], "gpus": 2}"#;
        let host = Host::new();
        let mut known = Jobs::default();
        assert!(matches!(
            host.admit(json, "g", &alice(), &known),
            Admission::Accept { .. }
        ));
        known.gpus = Some(Vec::new());
        let reason = refusal(host.admit(json, "g", &alice(), &known));
        assert!(reason.contains("has no GPUs"), "{reason}");
    }

    #[test]
    fn dependencies_must_be_known_and_the_owners_own() {
        let bob = test_kit::owner(1001, "bob");
        let known = Jobs::default()
            .with(test_kit::record(TRUE, "mine", alice(), 1), TRUE)
            .with(test_kit::record(TRUE, "his", bob, 1), TRUE);
        let host = Host::new();
        let after =
            |dep: &str| format!(r#"{{"version": 1, "command": ["true"], "after_ok": ["{dep}"]}}"#);
        assert!(matches!(
            host.admit(&after("mine"), "next", &alice(), &known),
            Admission::Accept { .. }
        ));
        let reason = refusal(host.admit(&after("nobody"), "next", &alice(), &known));
        assert!(reason.contains("does not know"), "{reason}");
        let reason = refusal(host.admit(&after("his"), "next", &alice(), &known));
        assert!(reason.contains("belongs to bob"), "{reason}");
    }

    #[test]
    fn an_id_in_use_is_refused_but_the_same_file_again_is_the_earlier_claim() {
        let record = test_kit::record(TRUE, "train", alice(), 1);
        let known = Jobs::default().with(record, TRUE);
        let host = Host::new();
        // Same name, same identity, same bytes: claimed before a crash.
        assert!(matches!(
            host.admit(TRUE, "train", &alice(), &known),
            Admission::ClaimedBefore(id) if id.as_str() == "train"
        ));
        // Another file under that id (other bytes): a namesake.
        let other = r#"{"version": 1, "command": ["false"]}"#;
        let reason = refusal(host.admit(other, "train", &alice(), &known));
        assert!(
            reason.contains("already exists (queued, owner alice)"),
            "{reason}"
        );
        // The same bytes from another file (another inode) too.
        let file = Submitted {
            stem: "train",
            bytes: TRUE.as_bytes(),
            source: SpoolSource {
                ino: 7,
                ..test_kit::source("train")
            },
        };
        let reason = refusal(admit(&file, &alice(), &host.rules(), &known, 100));
        assert!(reason.contains("already exists"), "{reason}");
    }

    #[test]
    fn a_sweep_becomes_its_members_under_its_id_unless_one_is_taken() {
        let json = r#"{"version": 1, "command": ["echo", "{lr}"],
            "sweep": {"lr": [1, 2, 3]}, "max_parallel": 2}"#;
        let host = Host::new();
        let Admission::Accept { records, group } =
            host.admit(json, "lr", &alice(), &Jobs::default())
        else {
            panic!("refused")
        };
        assert_eq!(group.as_ref().map(JobId::as_str), Some("lr"));
        assert_eq!(records.len(), 3);
        assert!(records
            .iter()
            .all(|r| r.group == group && r.max_parallel == Some(2)));
        let taken = records[1].id.clone();
        let known = Jobs::default().with(test_kit::record(TRUE, taken.as_str(), alice(), 1), TRUE);
        let reason = refusal(host.admit(json, "lr", &alice(), &known));
        assert!(
            reason.contains(&format!("{:?} already exists", taken.as_str())),
            "{reason}"
        );
    }

    #[test]
    fn the_queue_limit_counts_every_member_of_a_sweep() {
        let json = r#"{"version": 1, "command": ["echo", "{n}"], "sweep": {"n": [1, 2, 3]}}"#;
        let mut host = Host::new();
        host.max_queued_per_user = 4;
        let mut known = Jobs::default();
        known.queued.insert(1000, 1);
        assert!(matches!(
            host.admit(json, "s", &alice(), &known),
            Admission::Accept { .. }
        ));
        known.queued.insert(1000, 2);
        let reason = refusal(host.admit(json, "s", &alice(), &known));
        assert!(reason.contains("already has 2 queued jobs"), "{reason}");
    }
}
