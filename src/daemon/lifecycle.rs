//! A job's steps after admission, as rules over values: what its launch,
//! its unit running and its end write into its record, and which
//! notifications each step raises. Pure: the state task reads the facts
//! (systemd's view of the unit, the job's result and usage files, the
//! clock), calls these, then saves the record, hands the intents to the
//! notifier and moves the job in [`super::live::Live`], in that order.
//!
//! A step changes a record in one of two ways, and the difference is the
//! durability rule: [`launching`] and [`running`] change the live record in
//! place (a failed save of a launch is undone by the caller from its copy;
//! a failed save of "running" is redone by the end, which writes it all),
//! while [`ended`] returns a new record, so that memory says "ended" only
//! once the disk does.

use crate::gpu::GpuInfo;
use crate::job::{outcome_of_unit, NotifyEvent};
use crate::notifications::{intents_for, Intent, NotificationsConfig};
use crate::spec::retry::{next_attempt, Next};
use crate::store::{AssignedGpu, Attempt, JobRecord, JobState, Outcome, Usage};
use crate::unit::UnitState;

/// The record's launch, written before `StartTransientUnit` is asked for
/// (write-ahead): the GPUs placed on, named by their index, uuid and device
/// as `snapshot` shows them (an index the snapshot lacks is left out).
pub(super) fn launching(record: &mut JobRecord, gpus: &[u32], snapshot: &[GpuInfo]) {
    record.gpus = gpus
        .iter()
        .filter_map(|i| snapshot.iter().find(|g| g.index == *i))
        .map(|g| AssignedGpu {
            index: g.index,
            uuid: g.uuid.clone(),
            device: g.device.clone(),
        })
        .collect();
    record.state = JobState::Launching;
}

/// How an ended unit ended for its job. A stop asked through ptrain is
/// that stop ([`outcome_of_unit`]); a unit systemd stopped without ptraind
/// asking (`systemctl stop`, a shutdown: `stopped_from_outside`) is
/// stopped by systemd, unless systemd stopped it for a cause of the job's
/// own: its time limit (`RuntimeMaxSec=`) or an OOM kill (`OOMPolicy=stop`).
pub(super) fn outcome_of_end(
    state: &UnitState,
    stop_requested_by: Option<u32>,
    stopped_from_outside: bool,
) -> Outcome {
    let outcome = outcome_of_unit(
        &state.result,
        state.exec_main_code,
        state.exec_main_status,
        stop_requested_by,
    );
    if stopped_from_outside && !matches!(state.result.as_str(), "timeout" | "oom-kill") {
        return Outcome::Stopped {
            by_uid: 0,
            by_name: Some(STOPPED_BY_SYSTEMD.into()),
        };
    }
    outcome
}

/// Who stopped a job whose unit systemd stopped without ptraind asking.
pub(super) const STOPPED_BY_SYSTEMD: &str =
    "systemd (systemctl stop or a shutdown, not through ptrain)";

/// A launching job's unit is active: it runs, from systemd's start time
/// (`now` when systemd has none), with its main process and invocation.
/// Returns the `started` intents to save and send with it, or `None` when
/// the job was not launching (a repeated signal, a running job's change):
/// nothing changed then.
pub(super) fn running(
    record: &mut JobRecord,
    state: &UnitState,
    notifications: &NotificationsConfig,
    now: u64,
) -> Option<Vec<Intent>> {
    if record.state != JobState::Launching {
        return None;
    }
    record.state = JobState::Running;
    record.started_at = Some(state.exec_main_start).filter(|t| *t > 0).or(Some(now));
    record.main_pid = Some(state.main_pid).filter(|p| *p > 0);
    record.invocation_id = state.invocation_id.clone();
    // Channels a job names hear of its first attempt's start only;
    // streams hear of each (intents_for).
    let intents = intents_for(notifications, record, NotifyEvent::Started, now);
    record.notifications.extend(intents.iter().cloned());
    Some(intents)
}

/// The uid whose name an end by `outcome` records: a stop by someone
/// other than root whose name is not known yet.
pub(super) fn stopper_to_name(outcome: &Outcome) -> Option<u32> {
    match outcome {
        Outcome::Stopped {
            by_uid,
            by_name: None,
        } if *by_uid != 0 => Some(*by_uid),
        _ => None,
    }
}

/// What the state task read for a job's end.
pub(super) struct EndFacts<'a> {
    /// How it ended, before the idle watchdog's relabelling.
    pub outcome: Outcome,
    /// The unit as systemd last showed it; `None` for an end ptraind
    /// decided without a unit (a launch that failed, a dependency).
    pub unit: Option<&'a UnitState>,
    /// The job's result file: `Ok(None)` when it wrote none, `Err` with why
    /// it was ignored.
    pub result: Result<Option<serde_json::Value>, String>,
    /// What the run used, from its usage file (`None`: none, or unreadable).
    pub usage: Option<Usage>,
    /// The name of the uid [`stopper_to_name`] asked for, as the user
    /// database has it now.
    pub stopper_name: Option<String>,
    pub now: u64,
}

/// A job's end, to be saved in one durable write.
pub(super) struct Ended {
    /// The ended record, the intents already in it.
    pub record: JobRecord,
    /// How it ended (also in the record).
    pub outcome: Outcome,
    /// The notifications it raises, for the notifier once the write
    /// succeeded.
    pub intents: Vec<Intent>,
}

/// The job's end, made from `current` (left as it is) and the facts.
///
/// The outcome is relabelled by the idle watchdog when it stopped the job
/// ([`crate::job::idle_outcome`]); a stop by a uid gets the stopper's name
/// as it is now, kept with the record ("stopped by alice"). The end time is
/// the main process's exit, else the unit's, else `now`; a start that
/// ptraind never saw (the job ran and ended between two looks) is taken
/// from the unit and announced as well, before the end.
pub(super) fn ended(
    current: &JobRecord,
    facts: EndFacts<'_>,
    notifications: &NotificationsConfig,
) -> Ended {
    let mut outcome = crate::job::idle_outcome(current.idle_timeout_hit, facts.outcome);
    if let Outcome::Stopped {
        by_uid,
        by_name: by_name @ None,
    } = &mut outcome
    {
        *by_name = match *by_uid {
            0 => Some("root".into()),
            _ => facts.stopper_name,
        };
    }
    let mut record = current.clone();
    record.state = JobState::Ended;
    let now = facts.now;
    match facts.unit {
        Some(state) => {
            if record.started_at.is_none() && state.exec_main_start > 0 {
                record.started_at = Some(state.exec_main_start);
            }
            if state.invocation_id.is_some() {
                record.invocation_id = state.invocation_id.clone();
            }
            record.systemd_result = Some(state.result.clone());
            let end = [state.exec_main_exit, state.inactive_enter]
                .into_iter()
                .find(|t| *t > 0);
            record.ended_at = Some(end.unwrap_or(now));
        }
        None => record.ended_at = Some(now),
    }
    match facts.result {
        Ok(Some(result)) => record.result = Some(result),
        Ok(None) => {}
        Err(e) => record.result_error = Some(e),
    }
    record.usage = facts.usage;
    // Before the intents: their notices are made from the ended record.
    record.outcome = Some(outcome.clone());
    let mut intents = Vec::new();
    let ran_unseen = current.state == JobState::Launching && record.started_at.is_some();
    if ran_unseen {
        intents.extend(intents_for(
            notifications,
            &record,
            NotifyEvent::Started,
            now,
        ));
    }
    intents.extend(intents_for(
        notifications,
        &record,
        NotifyEvent::of_outcome(&outcome),
        now,
    ));
    record.notifications.extend(intents.iter().cloned());
    Ended {
        record,
        outcome,
        intents,
    }
}

/// Whether the attempt `ended` ends runs again, by the job's retry
/// policy ([`crate::spec::retry`]): then the record of its next attempt,
/// made from `current` (left as it is): queued, holding nothing, this
/// attempt kept in `attempts` (its invocation names its output), its
/// backoff as its `begin`. The end's intents are not in it: dependents,
/// waiters and notifications see the last attempt's end only, but for the
/// `retry` intents a job whose `notify_on` names it gets (returned too,
/// recorded in the same save). `None`: the end stands.
pub(super) fn requeued(
    current: &JobRecord,
    ended: &Ended,
    notifications: &NotificationsConfig,
    now: u64,
) -> Option<(JobRecord, Vec<Intent>)> {
    let end = &ended.record;
    let next = match &current.preempted_by {
        // Preempted: it runs again, no retry used up, unless it finished
        // meanwhile (a script that saved and exited during its lead).
        Some(by)
            if ended.outcome != Outcome::Succeeded
                && current.attempt < crate::spec::retry::MAX_ATTEMPTS =>
        {
            Next::Again {
                delay: std::time::Duration::ZERO,
                why: format!("preempted for job {by}"),
            }
        }
        _ => next_attempt(
            current.spec.retry.as_ref(),
            &ended.outcome,
            end.systemd_result.as_deref(),
            current.attempt,
        ),
    };
    let Next::Again { delay, why } = next else {
        return None;
    };
    // A start first learned of at this end (the attempt ran unseen) is
    // told before the retry: streams hear of each attempt's start.
    let mut told: Vec<Intent> = ended
        .intents
        .iter()
        .filter(|i| i.notice.event == NotifyEvent::Started)
        .cloned()
        .collect();
    told.extend(intents_for(notifications, end, NotifyEvent::Retry, now));
    let mut record = next_attempt_of(current, end, &ended.outcome, why, now);
    // At least a second: the ended unit's release reaches systemd before
    // the next attempt's unit of that name is asked for.
    let delay = delay.max(UNIT_RELEASE_GAP);
    record.begin_at = Some(now.saturating_add(delay.as_micros() as u64));
    if let (Some(last), Some(at)) = (record.attempts.last(), record.begin_at) {
        let detail = format!(
            "attempt {} {}; {}: attempt {} from {}",
            last.attempt,
            last.outcome.describe(),
            last.why,
            record.attempt,
            crate::spec::begin::format_moment(at)
        );
        for intent in told
            .iter_mut()
            .filter(|i| i.notice.event == NotifyEvent::Retry)
        {
            intent.notice.detail = detail.clone();
        }
    }
    record.notifications.extend(told.iter().cloned());
    Some((record, told))
}

/// The wait before a job's next unit of the same name is asked for: the
/// ended unit's release reaches systemd first.
const UNIT_RELEASE_GAP: std::time::Duration = std::time::Duration::from_secs(1);

/// An ended job run again by `ptrain restart`, as its next attempt under
/// its id (`ended` is its record): queued, its run kept in `attempts`,
/// neither held nor waiting for its `begin`. `None` when it used up
/// [`crate::spec::retry::MAX_ATTEMPTS`].
pub(super) fn restarted(ended: &JobRecord, by: &str, now: u64) -> Option<JobRecord> {
    if ended.attempt >= crate::spec::retry::MAX_ATTEMPTS {
        return None;
    }
    let outcome = ended.outcome.clone()?;
    let mut record = next_attempt_of(ended, ended, &outcome, format!("restarted by {by}"), now);
    record.held = false;
    record.begin_at = Some(now.saturating_add(UNIT_RELEASE_GAP.as_micros() as u64));
    Some(record)
}

/// `current`'s next attempt, queued and holding nothing, with the run
/// that ended (`end`, by `outcome`) kept in its attempts.
fn next_attempt_of(
    current: &JobRecord,
    end: &JobRecord,
    outcome: &Outcome,
    why: String,
    now: u64,
) -> JobRecord {
    let mut record = current.clone();
    record.attempts.push(Attempt {
        attempt: current.attempt,
        invocation_id: end.invocation_id.clone(),
        started_at: end.started_at,
        ended_at: end.ended_at.unwrap_or(now),
        outcome: outcome.clone(),
        systemd_result: end.systemd_result.clone(),
        gpus: end.gpus.iter().map(|g| g.index).collect(),
        why,
    });
    record.attempt += 1;
    record.state = JobState::Queued;
    record.gpus.clear();
    record.invocation_id = None;
    record.main_pid = None;
    record.started_at = None;
    record.ended_at = None;
    record.outcome = None;
    record.systemd_result = None;
    record.stop_requested_by = None;
    record.idle_timeout_hit = None;
    record.checkpoint_sent_at = None;
    record.stop_at = None;
    record.preempted_by = None;
    record.paused = false;
    record.result = None;
    record.result_error = None;
    record.usage = None;
    record.gpu_usage = Vec::new();
    record
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::test_kit::gpu;
    use crate::store::test_kit;

    const CLD_EXITED: i32 = 1;
    const CLD_KILLED: i32 = 2;

    fn notifications() -> NotificationsConfig {
        let text = r#"
            [notify]
            host = "gpu01"
            default_channels = ["ops"]
            [channels.ops]
            kind = "webhook"
            url = "https://hooks.example.com/ops"
        "#;
        crate::config::Config::from_toml(std::path::Path::new("/etc/ptrain/ptrain.toml"), text)
            .unwrap()
            .notifications
    }

    fn job(json: &str) -> JobRecord {
        test_kit::record(json, "j1", test_kit::owner(1000, "alice"), 1_000)
    }

    /// A unit that ran from 2,000 to 9,000 µs and exited with `code`.
    fn exited(code: i32) -> UnitState {
        UnitState {
            active_state: if code == 0 { "inactive" } else { "failed" }.into(),
            result: if code == 0 { "success" } else { "exit-code" }.into(),
            exec_main_code: CLD_EXITED,
            exec_main_status: code,
            exec_main_start: 2_000,
            exec_main_exit: 9_000,
            inactive_enter: 9_500,
            invocation_id: Some("abc".into()),
            main_pid: 42,
            ..UnitState::default()
        }
    }

    fn facts<'a>(outcome: Outcome, unit: Option<&'a UnitState>) -> EndFacts<'a> {
        EndFacts {
            unit,
            result: Ok(None),
            usage: None,
            stopper_name: stopper_to_name(&outcome)
                .and_then(|uid| (uid == 1001).then(|| "bob".to_string())),
            outcome,
            now: 10_000,
        }
    }

    fn keys(intents: &[Intent]) -> Vec<&str> {
        intents.iter().map(|i| i.key.as_str()).collect()
    }

    #[test]
    fn a_launch_names_its_gpus_as_the_snapshot_shows_them() {
        let mut r = job(r#"{"version": 1, "command": ["true"], "gpus": 2}"#);
        launching(&mut r, &[3, 1, 7], &[gpu(1), gpu(3)]);
        assert_eq!(r.state, JobState::Launching);
        let named: Vec<(u32, &str)> = r.gpus.iter().map(|g| (g.index, g.uuid.as_str())).collect();
        // In the placement's order; 7 is not in the snapshot.
        assert_eq!(named, [(3, "GPU-3"), (1, "GPU-1")]);
    }

    #[test]
    fn a_units_end_is_the_stop_asked_for_first_else_what_systemd_says() {
        let ok = exited(0);
        assert_eq!(outcome_of_end(&ok, None, false), Outcome::Succeeded);
        assert_eq!(
            outcome_of_end(&exited(5), None, false),
            Outcome::Failed { exit_code: 5 }
        );
        let term = UnitState {
            result: "signal".into(),
            exec_main_code: CLD_KILLED,
            exec_main_status: 15,
            ..exited(1)
        };
        // ptrain stop by bob: his stop, whatever signal ended it.
        assert_eq!(
            outcome_of_end(&term, Some(1001), false),
            Outcome::stopped_by(1001)
        );
        // systemctl stop: systemd's stop, not a kill by SIGTERM.
        assert_eq!(
            outcome_of_end(&term, None, true),
            Outcome::Stopped {
                by_uid: 0,
                by_name: Some(STOPPED_BY_SYSTEMD.into())
            }
        );
        // ... unless systemd stopped it for the job's own limit or memory.
        let timed_out = UnitState {
            result: "timeout".into(),
            ..term.clone()
        };
        assert_eq!(outcome_of_end(&timed_out, None, true), Outcome::Timeout);
        let oom = UnitState {
            result: "oom-kill".into(),
            exec_main_status: 9,
            ..term
        };
        assert_eq!(
            outcome_of_end(&oom, None, true),
            Outcome::Killed { signal: 9 }
        );
    }

    #[test]
    fn a_launching_job_runs_once_with_systemds_start_and_one_started_notice() {
        let config = notifications();
        let mut r = job(r#"{"version": 1, "command": ["true"], "notify_on": ["started"]}"#);
        launching(&mut r, &[], &[]);
        let seen = exited(0);
        let active = UnitState {
            active_state: "active".into(),
            ..seen
        };
        let intents = running(&mut r, &active, &config, 5_000).expect("it was launching");
        assert_eq!(r.state, JobState::Running);
        assert_eq!(r.started_at, Some(2_000));
        assert_eq!(
            (r.main_pid, r.invocation_id.as_deref()),
            (Some(42), Some("abc"))
        );
        assert_eq!(keys(&intents), ["j1.started.ops"]);
        assert_eq!(keys(&r.notifications), ["j1.started.ops"]);
        // A second signal of the same start changes nothing.
        let again = r.clone();
        assert!(running(&mut r, &active, &config, 6_000).is_none());
        assert_eq!(r.notifications.len(), again.notifications.len());
        // Without systemd's start time, now; without a pid, none.
        let mut r = job(r#"{"version": 1, "command": ["true"]}"#);
        launching(&mut r, &[], &[]);
        let bare = UnitState {
            active_state: "active".into(),
            ..UnitState::default()
        };
        running(&mut r, &bare, &config, 5_000).unwrap();
        assert_eq!((r.started_at, r.main_pid), (Some(5_000), None));
    }

    #[test]
    fn an_end_takes_its_times_from_the_unit_and_leaves_the_live_record_alone() {
        let config = notifications();
        let mut current = job(r#"{"version": 1, "command": ["true"]}"#);
        launching(&mut current, &[], &[]);
        let state = UnitState {
            active_state: "active".into(),
            ..exited(0)
        };
        running(&mut current, &state, &config, 3_000).unwrap();
        let unit = exited(0);
        let mut f = facts(Outcome::Succeeded, Some(&unit));
        f.result = Ok(Some(serde_json::json!({"loss": 0.25})));
        let Ended {
            record, intents, ..
        } = ended(&current, f, &config);
        assert_eq!(current.state, JobState::Running, "the caller saves first");
        assert_eq!(record.state, JobState::Ended);
        assert_eq!(record.outcome, Some(Outcome::Succeeded));
        assert_eq!(
            (record.started_at, record.ended_at),
            (Some(2_000), Some(9_000))
        );
        assert_eq!(record.systemd_result.as_deref(), Some("success"));
        assert_eq!(record.result, Some(serde_json::json!({"loss": 0.25})));
        // Default notify_on: every end, never the start.
        assert_eq!(keys(&intents), ["j1.succeeded.ops"]);
        // The notice tells of the end it was made for.
        let notice = &intents[0].notice;
        assert_eq!(notice.status, "succeeded");
        assert_eq!(
            (notice.started_at, notice.ended_at),
            (Some(2_000), Some(9_000))
        );
        // No exit time: the unit's inactive time; neither: now.
        let unit = UnitState {
            exec_main_exit: 0,
            ..exited(0)
        };
        let Ended { record, .. } = ended(&current, facts(Outcome::Succeeded, Some(&unit)), &config);
        assert_eq!(record.ended_at, Some(9_500));
        let Ended { record, .. } = ended(&current, facts(Outcome::Succeeded, None), &config);
        assert_eq!(record.ended_at, Some(10_000));
    }

    #[test]
    fn a_retried_attempt_is_queued_as_the_next_holding_nothing_and_told_nowhere() {
        let config = notifications();
        let json = r#"{"version": 1, "command": ["true"], "gpus": 1, "retries": 1,
                       "retry_delay": "5s", "notify_on": ["started", "failed", "retry"]}"#;
        let mut current = job(json);
        launching(&mut current, &[0], &[gpu(0)]);
        let active = UnitState {
            active_state: "active".into(),
            ..exited(1)
        };
        let told = running(&mut current, &active, &config, 3_000).unwrap();
        assert_eq!(keys(&told), ["j1.started.ops"]);
        let unit = exited(1);
        let end = ended(
            &current,
            facts(Outcome::Failed { exit_code: 1 }, Some(&unit)),
            &config,
        );
        let (next, told) = requeued(&current, &end, &config, 10_000).expect("retried");
        // The retry is told, as the first attempt's, with what comes next.
        assert_eq!(keys(&told), ["j1.retry.ops"]);
        assert_eq!(told[0].notice.exit_code, Some(1));
        assert!(
            told[0].notice.detail.contains("attempt 1 failed")
                && told[0].notice.detail.contains("attempt 2 from"),
            "{}",
            told[0].notice.detail
        );
        assert_eq!(next.state, JobState::Queued);
        assert_eq!(next.attempt, 2);
        assert!(next.gpus.is_empty() && next.invocation_id.is_none() && next.outcome.is_none());
        assert_eq!(next.begin_at, Some(10_000 + 5_000_000));
        assert_eq!(next.attempts.len(), 1);
        let first = &next.attempts[0];
        assert_eq!(first.outcome, Outcome::Failed { exit_code: 1 });
        assert_eq!((first.started_at, first.ended_at), (Some(2_000), 9_000));
        assert_eq!(first.invocation_id.as_deref(), Some("abc"));
        assert_eq!(first.gpus, [0]);
        assert!(first.why.contains("retry 1 of 1"), "{}", first.why);
        // The failure's notice is not in it; the start's and the retry's
        // stay, and the second attempt's start is not told again.
        assert_eq!(
            keys(&next.notifications),
            ["j1.started.ops", "j1.retry.ops"]
        );
        let mut second = next.clone();
        launching(&mut second, &[0], &[gpu(0)]);
        let told = running(&mut second, &active, &config, 20_000).unwrap();
        assert!(told.is_empty());
        // Its retries used up, the second failure is the end.
        let end = ended(
            &second,
            facts(Outcome::Failed { exit_code: 1 }, Some(&unit)),
            &config,
        );
        assert!(requeued(&second, &end, &config, 30_000).is_none());
        // The end is told under the attempt's own key.
        assert_eq!(keys(&end.intents), ["j1.failed-2.ops"]);
    }

    #[test]
    fn a_run_ptraind_never_saw_start_is_announced_before_its_end() {
        let config = notifications();
        let mut current =
            job(r#"{"version": 1, "command": ["true"], "notify_on": ["started", "failed"]}"#);
        launching(&mut current, &[], &[]);
        let unit = exited(3);
        let Ended {
            record, intents, ..
        } = ended(
            &current,
            facts(Outcome::Failed { exit_code: 3 }, Some(&unit)),
            &config,
        );
        assert_eq!(record.started_at, Some(2_000));
        assert_eq!(keys(&intents), ["j1.started.ops", "j1.failed.ops"]);
        assert_eq!(
            keys(&record.notifications),
            ["j1.started.ops", "j1.failed.ops"]
        );
        // A launch that failed before anything ran: no start to tell of.
        let Ended {
            record, intents, ..
        } = ended(
            &current,
            facts(
                Outcome::LaunchFailed {
                    reason: "no such user".into(),
                },
                None,
            ),
            &config,
        );
        assert_eq!(record.started_at, None);
        assert_eq!(keys(&intents), ["j1.failed.ops"]);
    }

    #[test]
    fn an_end_written_again_after_a_failed_save_adds_no_second_notice() {
        let config = notifications();
        let current = job(r#"{"version": 1, "command": ["true"]}"#);
        let unit = exited(1);
        let Ended {
            record: first,
            intents,
            ..
        } = ended(
            &current,
            facts(Outcome::Failed { exit_code: 1 }, Some(&unit)),
            &config,
        );
        assert_eq!(keys(&intents), ["j1.failed.ops"]);
        // The save of `first` failed: the live record was left alone, so
        // the next try makes the same intents again, under the same keys
        // (the outbox sends a key once).
        let Ended {
            record: again,
            intents: intents_again,
            ..
        } = ended(
            &current,
            facts(Outcome::Failed { exit_code: 1 }, Some(&unit)),
            &config,
        );
        assert_eq!(keys(&intents_again), keys(&intents));
        assert_eq!(first.notifications.len(), again.notifications.len());
        // A record that holds the key already (restored after a crash
        // between the write and the send) raises it no more.
        let Ended { intents: none, .. } = ended(
            &first,
            facts(Outcome::Failed { exit_code: 1 }, Some(&unit)),
            &config,
        );
        assert!(none.is_empty());
    }

    #[test]
    fn the_idle_watchdogs_stop_and_a_users_stop_are_named_in_the_end() {
        let config = notifications();
        let mut current = job(r#"{"version": 1, "command": ["true"], "idle_timeout": "10m"}"#);
        current.idle_timeout_hit = Some(600);
        let unit = exited(0);
        // Whatever systemd saw of the stop, it was the silence.
        let Ended {
            record, intents, ..
        } = ended(&current, facts(Outcome::Succeeded, Some(&unit)), &config);
        assert_eq!(
            record.outcome,
            Some(Outcome::IdleTimeout { idle_secs: 600 })
        );
        assert_eq!(keys(&intents), ["j1.idle-timeout.ops"]);
        // A time limit that struck first stays a time limit.
        let Ended { record, .. } = ended(&current, facts(Outcome::Timeout, Some(&unit)), &config);
        assert_eq!(record.outcome, Some(Outcome::Timeout));
        // Stops carry their stopper's name as it is now.
        let current = job(r#"{"version": 1, "command": ["true"]}"#);
        let name = |outcome| {
            let Ended { record, .. } = ended(&current, facts(outcome, Some(&unit)), &config);
            match record.outcome {
                Some(Outcome::Stopped { by_name, .. }) => by_name,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(name(Outcome::stopped_by(0)).as_deref(), Some("root"));
        assert_eq!(name(Outcome::stopped_by(1001)).as_deref(), Some("bob"));
        assert_eq!(name(Outcome::stopped_by(4242)), None);
        let Ended { record, .. } = ended(
            &current,
            facts(
                Outcome::Stopped {
                    by_uid: 0,
                    by_name: Some(STOPPED_BY_SYSTEMD.into()),
                },
                Some(&unit),
            ),
            &config,
        );
        assert!(
            matches!(record.outcome, Some(Outcome::Stopped { by_name: Some(n), .. }) if n == STOPPED_BY_SYSTEMD)
        );
    }

    #[test]
    fn an_unreadable_result_is_kept_as_its_reason_and_usage_only_when_read() {
        let config = notifications();
        let mut current = job(r#"{"version": 1, "command": ["true"]}"#);
        current.usage = None;
        let unit = exited(0);
        let mut f = facts(Outcome::Succeeded, Some(&unit));
        f.result = Err("result.json is not JSON: expected value at line 1".into());
        f.usage = Some(Usage::default());
        let Ended { record, .. } = ended(&current, f, &config);
        assert_eq!(record.result, None);
        assert!(record.result_error.as_deref().unwrap().contains("not JSON"));
        assert!(record.usage.is_some());
    }
}
