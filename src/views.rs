//! The stable JSON shapes ptraind's API answers with and the CLI prints
//! with `--json`: a job ([`JobView`]), the GPUs ([`GpusView`]), and what
//! a caller may see of others' jobs ([`Privacy`]). Pure: values in, values
//! out.

use serde::{Deserialize, Serialize};

use crate::gpu::GpuInfo;
use crate::job::explain_exit_status;
use crate::store::{JobRecord, JobState, Outcome, SpoolSource};

/// `[privacy]` (Slurm's `PrivateData` is the anchor): what a user sees of
/// other users' jobs. By default only their id, owner, state and GPUs; the
/// command, workdir, result, exit and detail only with the admin's consent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Privacy {
    /// Show every job's details to every user.
    #[serde(default)]
    pub show_all_jobs: bool,
}

/// One job as `ptrain status --json` and `ptrain list --json` show it.
/// Fields are only ever added, never renamed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct JobView {
    pub id: String,
    /// The descriptor's `name` and `comment`: text for people, the
    /// owner's (hidden from others like the command, [`JobView::as_seen_by`]).
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub comment: Option<String>,
    pub status: String,
    pub owner: String,
    pub uid: u32,
    pub unit: String,
    pub command: Vec<String>,
    /// The image the job runs in, as its file named it (issue 21), and
    /// the manifest digest that ran (once pulled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
    pub workdir: Option<String>,
    pub gpus: Vec<u32>,
    pub gpu_uuids: Vec<String>,
    pub submitted_at: u64,
    /// Not started before this moment (the descriptor's `begin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begin_at: Option<u64>,
    /// Which attempt this is (1 first), and the attempts before it
    /// (the owner's, like the exit).
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<crate::store::Attempt>,
    /// Frozen by `ptrain pause`, its GPUs kept.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// When this attempt got its checkpoint signal, and when ptraind stops
    /// it after the signal of a stop of its own (µs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_sent_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_at: Option<u64>,
    pub started_at: Option<u64>,
    pub ended_at: Option<u64>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub outcome: Option<Outcome>,
    /// A sentence for people: what happened and, on failure, why.
    pub detail: String,
    pub invocation_id: Option<String>,
    pub systemd_result: Option<String>,
    pub timeout_secs: Option<u64>,
    /// The sweep this job belongs to and its parameter values.
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub params: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub after_ok: Vec<String>,
    #[serde(default)]
    pub after_fail: Vec<String>,
    #[serde(default)]
    pub after_any: Vec<String>,
    /// Jobs a queued job still waits for.
    #[serde(default)]
    pub waiting_for: Vec<String>,
    /// What the job wrote to $PTRAIN_RESULT_FILE.
    #[serde(default)]
    pub result: Option<serde_json::Value>,
    /// Why what it wrote there was not taken as its result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_error: Option<String>,
    /// Its memory, CPU and task limits in words ("4 CPUs, 12.0 GiB of
    /// memory"); empty when it has none.
    #[serde(default)]
    pub resources: String,
    /// The details are the owner's ([`JobView::as_seen_by`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub private: bool,
    /// Queue priority (higher first; 0 by default).
    #[serde(default)]
    pub priority: i32,
    /// What the job asked of its GPUs, in words ("2 GPUs (model \"A100\")").
    #[serde(default)]
    pub gpu_request: String,
    /// The spool file the job was made of, as ptraind read it (its
    /// fstat): how `ptrain submit` tells the job of the file it published
    /// from a namesake's. Only `Status` fills it in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SpoolSource>,
    /// A GPU the job held left the pool under it (lost, or uncorrected
    /// ECC errors): which, and why. Only `Status` fills it in, from
    /// ptraind's memory (`PoolMonitor`), so a restart forgets it unless
    /// the GPU is still out then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_warning: Option<String>,
    /// Only what ptraind keeps in memory of an older end: the command,
    /// result, invocation and timeout are not filled in (`ptrain status
    /// ID` reads them from the job's record).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub summary: bool,
    /// What an ended run used ([`crate::accounting::UsageView`]); the
    /// owner's, like the exit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::accounting::UsageView>,
    /// How busy the run keeps (or kept) each of its GPUs, from NVML
    /// samples ([`crate::accounting::gpu`]), while it runs and after; the
    /// owner's, like `usage`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_usage: Vec<crate::accounting::gpu::GpuUsageView>,
}

fn first_attempt() -> u32 {
    1
}

/// A job's exit code, signal and the sentence that says how it ended (or
/// its status word while it has no outcome).
pub fn outcome_fields(
    outcome: Option<&Outcome>,
    status: &str,
) -> (Option<i32>, Option<i32>, String) {
    let (exit_code, signal) = match outcome {
        Some(Outcome::Failed { exit_code }) => (Some(*exit_code), None),
        Some(Outcome::Succeeded) => (Some(0), None),
        Some(Outcome::Killed { signal }) => (None, Some(*signal)),
        _ => (None, None),
    };
    let detail = match outcome {
        Some(outcome) => {
            let mut s = outcome.describe();
            if let Some(why) = exit_code.and_then(explain_exit_status) {
                s.push_str(&format!(" ({why})"));
            }
            s
        }
        None => status.to_string(),
    };
    (exit_code, signal, detail)
}

impl JobView {
    /// The view as `caller_uid` may see it: whole for its owner and root
    /// (and for everyone under `[privacy] show_all_jobs`), else only the
    /// id, owner, state, GPUs and times.
    pub fn as_seen_by(self, caller_uid: u32, privacy: Privacy) -> JobView {
        if privacy.show_all_jobs || caller_uid == 0 || caller_uid == self.uid {
            return self;
        }
        JobView {
            name: None,
            comment: None,
            command: Vec::new(),
            image: None,
            image_digest: None,
            workdir: None,
            exit_code: None,
            signal: None,
            outcome: None,
            detail: String::new(),
            systemd_result: None,
            params: Default::default(),
            result: None,
            result_error: None,
            resources: String::new(),
            invocation_id: None,
            timeout_secs: None,
            after_ok: Vec::new(),
            after_fail: Vec::new(),
            after_any: Vec::new(),
            waiting_for: Vec::new(),
            attempts: Vec::new(),
            checkpoint_sent_at: None,
            stop_at: None,
            // The sweep's id stays: it names jobs, as their ids do, and
            // `ptrain wait SWEEP` by others needs it.
            priority: 0,
            gpu_request: String::new(),
            gpu_warning: None,
            usage: None,
            gpu_usage: Vec::new(),
            private: true,
            ..self
        }
    }

    pub fn of(record: &JobRecord) -> JobView {
        let (exit_code, signal, mut detail) =
            outcome_fields(record.outcome.as_ref(), record.status());
        if record.outcome.is_none()
            && record.state == JobState::Queued
            && record.spec.gpus.count() > 0
        {
            detail = format!("waiting for {}", record.spec.gpus.describe());
        }
        if record.state == JobState::Running {
            if let Some(at) = record.stop_at {
                detail = format!(
                    "stopping at {} (its checkpoint_lead after its checkpoint signal)",
                    crate::spec::begin::format_moment(at)
                );
            } else if record.paused {
                detail = format!("paused; `ptrain resume {}` lets it run on", record.id);
            }
        }
        JobView {
            id: record.id.to_string(),
            name: record.spec.name.clone(),
            comment: record.spec.comment.clone(),
            status: record.status().to_string(),
            owner: record.owner.name.clone(),
            uid: record.owner.uid,
            unit: record.unit.clone(),
            command: record.spec.command.clone(),
            image: record.spec.image.clone(),
            image_digest: record.image.as_ref().map(|i| i.digest.clone()),
            workdir: record
                .spec
                .workdir
                .as_ref()
                .map(|p| p.display().to_string()),
            gpus: record.gpus.iter().map(|g| g.index).collect(),
            gpu_uuids: record.gpus.iter().map(|g| g.uuid.clone()).collect(),
            submitted_at: record.submitted_at,
            begin_at: record.begin_at,
            attempt: record.attempt,
            attempts: record.attempts.clone(),
            paused: record.paused,
            checkpoint_sent_at: record.checkpoint_sent_at,
            stop_at: record.stop_at,
            started_at: record.started_at,
            ended_at: record.ended_at,
            exit_code,
            signal,
            outcome: record.outcome.clone(),
            detail,
            invocation_id: record.invocation_id.clone(),
            systemd_result: record.systemd_result.clone(),
            timeout_secs: record.spec.timeout.map(|t| t.as_secs()),
            group: record.group.as_ref().map(|g| g.to_string()),
            params: record.params.clone(),
            after_ok: record
                .spec
                .after
                .after_ok
                .iter()
                .map(|i| i.to_string())
                .collect(),
            after_fail: record
                .spec
                .after
                .after_fail
                .iter()
                .map(|i| i.to_string())
                .collect(),
            after_any: record
                .spec
                .after
                .after_any
                .iter()
                .map(|i| i.to_string())
                .collect(),
            waiting_for: Vec::new(),
            result: record.result.clone(),
            result_error: record.result_error.clone(),
            resources: record.limits.describe(),
            private: false,
            priority: record.spec.priority,
            gpu_request: record.spec.gpus.describe(),
            source: None,
            gpu_warning: None,
            summary: false,
            usage: crate::accounting::UsageView::of(record),
            gpu_usage: record
                .gpu_usage
                .iter()
                .map(crate::accounting::gpu::view)
                .collect(),
        }
    }
}

/// A GPU, its state and the job holding it, for `ptrain gpus`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GpuView {
    #[serde(flatten)]
    pub gpu: GpuInfo,
    pub held_by: Option<String>,
    /// `free`, `held`, `reserved`, `busy-foreign` or `unhealthy`
    /// ([`crate::gpu::GpuState::name`]).
    #[serde(default)]
    pub state: String,
    /// The waiting job the GPU is kept for (state `reserved`).
    #[serde(default)]
    pub reserved_for: Option<String>,
    /// The state in words: who holds it, how much others use, why unhealthy.
    #[serde(default)]
    pub detail: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GpusView {
    pub backend: String,
    pub gpus: Vec<GpuView>,
}

/// An image of ptraind's store, for `ptrain images`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageView {
    /// The source as jobs named it, normalized
    /// (`docker.io/library/ubuntu:latest`, `oci-archive:/srv/app.tar:v1`);
    /// empty for a user none of whose jobs used it (a reference can name
    /// another user's project or archive path).
    pub reference: String,
    /// The image manifest's digest (`sha256:...`).
    pub digest: String,
    /// Bytes it takes on disk alone: its unpacked layers, their blobs,
    /// its metadata (a layer shared with another image counts in both).
    pub bytes: u64,
    /// When it was last given to a job (made ready for it; µs since the
    /// epoch).
    pub last_used: u64,
    /// The users whose jobs used it, as the caller may see them: root
    /// sees every name, another user only their own.
    pub users: Vec<String>,
    /// How many other users' jobs used it, unnamed.
    #[serde(default)]
    pub other_users: usize,
}

impl ImageView {
    /// `image` as `caller` sees it: `None` sees every user's name (root,
    /// or `[privacy] show_all_jobs`); a user sees their own name and how
    /// many others there are, and the reference only of an image their
    /// jobs used too (its digest and size tell what the store holds).
    pub fn seen_by(image: crate::images::ImageListing, caller: Option<&str>) -> ImageView {
        let (users, other_users): (Vec<String>, usize) = match caller {
            None => (image.users, 0),
            Some(me) => {
                let others = image.users.iter().filter(|u| *u != me).count();
                let mine = image.users.into_iter().filter(|u| u == me).collect();
                (mine, others)
            }
        };
        let others_only = users.is_empty() && other_users > 0;
        ImageView {
            reference: if others_only {
                String::new()
            } else {
                image.reference
            },
            digest: image.digest.to_string(),
            bytes: image.bytes,
            last_used: image.last_used,
            users,
            other_users,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_kit;

    #[test]
    fn others_see_only_id_owner_state_and_gpus_unless_the_admin_shows_all() {
        let mut record = test_kit::record(
            r#"{"version":1,"command":["python3","train.py","--key","s3cret"],"workdir":"/home/alice/p","name":"project-x","comment":"for the grant"}"#,
            "j",
            test_kit::owner(1000, "alice"),
            0,
        );
        record.result = Some(serde_json::json!({"acc": 1}));
        let view = JobView::of(&record);
        let private = Privacy::default();
        let shown = serde_json::to_string(&view.clone().as_seen_by(2000, private)).unwrap();
        for secret in [
            "s3cret",
            "train.py",
            "/home/alice/p",
            "acc",
            "project-x",
            "grant",
        ] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        let seen = view.clone().as_seen_by(2000, private);
        assert_eq!(
            (seen.id.as_str(), seen.owner.as_str(), seen.private),
            ("j", "alice", true)
        );
        assert_eq!(seen.status, view.status);
        for (caller, privacy) in [
            (1000, private),
            (0, private),
            (
                2000,
                Privacy {
                    show_all_jobs: true,
                },
            ),
        ] {
            assert_eq!(view.clone().as_seen_by(caller, privacy), view);
        }
    }

    #[test]
    fn others_see_their_own_name_on_an_image_and_a_count_of_the_rest() {
        let image = crate::images::ImageListing {
            reference: "registry.lab:5000/paddle:2.6".into(),
            digest: crate::images::Digest::of(b"m"),
            bytes: 10,
            last_used: 5,
            users: vec!["alice".into(), "bob".into(), "carol".into()],
        };
        let all = ImageView::seen_by(image.clone(), None);
        assert_eq!(all.users, ["alice", "bob", "carol"]);
        assert_eq!(all.other_users, 0);
        assert!(all.digest.starts_with("sha256:"));
        let bob = ImageView::seen_by(image.clone(), Some("bob"));
        assert_eq!((bob.users, bob.other_users), (vec!["bob".to_string()], 2));
        let dave = ImageView::seen_by(image, Some("dave"));
        assert_eq!((dave.users.len(), dave.other_users), (0, 3));
    }

    #[test]
    fn a_job_not_needed_has_no_exit_status_and_says_why() {
        let outcome = Outcome::NotNeeded {
            parent: "train".into(),
            reason: "after_fail: train succeeded, so this job is not needed".into(),
        };
        assert_eq!(outcome.status(), "not-needed");
        let (exit_code, signal, detail) = outcome_fields(Some(&outcome), outcome.status());
        assert_eq!((exit_code, signal), (None, None));
        assert_eq!(
            detail,
            "not needed, never ran: after_fail: train succeeded, so this job is not needed"
        );
        // The JSON shape `ptrain status --json` shows, and reads back.
        let json = serde_json::to_value(&outcome).unwrap();
        assert_eq!(json["kind"], "not-needed");
        assert_eq!(json["parent"], "train");
        assert_eq!(serde_json::from_value::<Outcome>(json).unwrap(), outcome);
    }
}
