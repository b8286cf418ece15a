//! The job: its lifecycle state, how it ended ([`Outcome`]) and what that
//! means (its status word, its sentence, the notification event it
//! raises), and the rules that make an outcome from a unit's end
//! ([`outcome_of_unit`], [`idle_outcome`]). Pure: values in, values out;
//! the store keeps these in records, the daemon applies them.

use serde::{Deserialize, Serialize};

/// Where a job is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobState {
    Queued,
    /// Recorded before `StartTransientUnit` is called (write-ahead).
    Launching,
    Running,
    Ended,
}

/// How a job ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Outcome {
    Succeeded,
    Failed {
        exit_code: i32,
    },
    Killed {
        signal: i32,
    },
    Timeout,
    /// Stopped by ptraind after writing no output for `idle_secs`
    /// (its `idle_timeout`).
    IdleTimeout {
        idle_secs: u64,
    },
    Stopped {
        by_uid: u32,
        /// Who that is, as ptraind recorded it (older records have none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by_name: Option<String>,
    },
    LaunchFailed {
        reason: String,
    },
    /// A dependency can never be satisfied: which parent, and why.
    DependencyFailed {
        parent: String,
        reason: String,
    },
    /// Never ran, and that is no failure: its dependencies say it is not
    /// needed (an `after_fail` parent succeeded). Which parent, and why.
    NotNeeded {
        parent: String,
        reason: String,
    },
}

impl Outcome {
    /// Stopped by `uid`; ptraind adds the name when it records the end.
    pub fn stopped_by(uid: u32) -> Outcome {
        Outcome::Stopped {
            by_uid: uid,
            by_name: None,
        }
    }

    /// The status words of a job not ended, in the order a job passes
    /// through them: `pulling` is a queued job whose image is not on disk
    /// yet (issue 21; it holds no GPU and is not planned).
    pub const ACTIVE: [&'static str; 4] = ["queued", "pulling", "launching", "running"];

    /// Whether `status` is one of a job not ended ([`Outcome::ACTIVE`]).
    pub fn is_active(status: &str) -> bool {
        Self::ACTIVE.contains(&status)
    }

    /// Every outcome's status word, in the order of the variants: the one
    /// list that [`Outcome::status`], the metrics' always-present series
    /// and the docs read.
    pub const STATUSES: [&'static str; 9] = [
        "succeeded",
        "failed",
        "killed",
        "timeout",
        "idle-timeout",
        "stopped",
        "launch-failed",
        "dependency-failed",
        "not-needed",
    ];

    /// The one-word status users see in `ptrain list`.
    pub fn status(&self) -> &'static str {
        Outcome::STATUSES[match self {
            Outcome::Succeeded => 0,
            Outcome::Failed { .. } => 1,
            Outcome::Killed { .. } => 2,
            Outcome::Timeout => 3,
            Outcome::IdleTimeout { .. } => 4,
            Outcome::Stopped { .. } => 5,
            Outcome::LaunchFailed { .. } => 6,
            Outcome::DependencyFailed { .. } => 7,
            Outcome::NotNeeded { .. } => 8,
        }]
    }

    pub fn describe(&self) -> String {
        match self {
            Outcome::Succeeded => "succeeded".into(),
            Outcome::Failed { exit_code } => format!("failed with exit code {exit_code}"),
            Outcome::Killed { signal } => format!("killed by signal {}", signal_name(*signal)),
            Outcome::Timeout => "timed out (stopped at its timeout)".into(),
            Outcome::IdleTimeout { idle_secs } => format!(
                "stopped after {} without output (its idle_timeout)",
                humantime::format_duration(std::time::Duration::from_secs(*idle_secs))
            ),
            Outcome::Stopped {
                by_name: Some(name),
                ..
            } => format!("stopped by {name}"),
            Outcome::Stopped { by_uid, .. } => format!("stopped by uid {by_uid}"),
            Outcome::LaunchFailed { reason } => format!("could not be launched: {reason}"),
            Outcome::DependencyFailed { reason, .. } => format!("never ran: {reason}"),
            Outcome::NotNeeded { reason, .. } => format!("not needed, never ran: {reason}"),
        }
    }
}

pub fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGXCPU => "SIGXCPU",
        _ => return signal.to_string(),
    };
    name.to_string()
}

/// A signal's number from its name, with or without "SIG".
pub fn signal_number(name: &str) -> Option<i32> {
    let name = name.strip_prefix("SIG").unwrap_or(name);
    (1..=31).find(|n| signal_name(*n).strip_prefix("SIG") == Some(name))
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
    // A stop asked for first is the end, even when the job ignored its
    // SIGTERM and systemd's stop timed out (Result=timeout) into SIGKILL.
    if let Some(by_uid) = stop_requested_by {
        return Outcome::Stopped {
            by_uid,
            by_name: None,
        };
    }
    if result == "timeout" {
        return Outcome::Timeout;
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

/// The end a job gets when ptraind stopped it for silence: whatever
/// systemd reports for the stop (a signal, an exit code, even success if
/// the job exits cleanly on SIGTERM) is the idle timeout. A runtime
/// `timeout` that struck first stays a timeout.
pub fn idle_outcome(idle_timeout_hit: Option<u64>, outcome: Outcome) -> Outcome {
    match (idle_timeout_hit, &outcome) {
        (
            Some(idle_secs),
            Outcome::Succeeded
            | Outcome::Failed { .. }
            | Outcome::Killed { .. }
            | Outcome::Stopped { .. },
        ) => Outcome::IdleTimeout { idle_secs },
        _ => outcome,
    }
}

/// What systemd's special exit statuses (set when it fails to set up the
/// process, before the command runs) mean for a user.
pub fn explain_exit_status(status: i32) -> Option<&'static str> {
    Some(match status {
        200 => "the working directory does not exist or is not accessible to the job's user",
        203 => "the command was not found or is not executable by the job's user",
        216 => "the job's group could not be set",
        217 => "the job's user could not be set",
        226 => "a path in ReadWritePaths (the workdir) does not exist",
        _ => return None,
    })
}

/// What happened to a job that a channel can be told about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NotifyEvent {
    /// Accepted from the spool into the queue (recorded with the claim):
    /// told only to streams and to jobs whose `notify_on` names it.
    Submitted,
    Started,
    Succeeded,
    Failed,
    Timeout,
    IdleTimeout,
    DependencyFailed,
    /// Never ran because its dependencies made it unnecessary (an
    /// `after_fail` job whose parents succeeded): not a failure.
    NotNeeded,
    Stopped,
    /// A GPU the running job holds left the pool (lost, uncorrected ECC
    /// errors): the job may fail or hang. Not an end; told once per
    /// attempt.
    GpuLost,
    /// An attempt ended and the job runs again (`retries`,
    /// `requeue_exit_code`): told only when `notify_on` names it.
    Retry,
    /// A spool file was refused (it never became a job): told only to
    /// stream channels, with the file's name and the reason.
    Refused,
    /// A GPU left the pool (lost from the bus, uncorrected ECC errors),
    /// whether or not a job holds it: a host event, told only to streams.
    GpuUnhealthy,
    /// A GPU that had left the pool is healthy and back: a host event.
    GpuHealthy,
}

impl NotifyEvent {
    pub const ALL: [NotifyEvent; 14] = [
        NotifyEvent::Submitted,
        NotifyEvent::Started,
        NotifyEvent::Succeeded,
        NotifyEvent::Failed,
        NotifyEvent::Timeout,
        NotifyEvent::IdleTimeout,
        NotifyEvent::DependencyFailed,
        NotifyEvent::NotNeeded,
        NotifyEvent::Stopped,
        NotifyEvent::GpuLost,
        NotifyEvent::Retry,
        NotifyEvent::Refused,
        NotifyEvent::GpuUnhealthy,
        NotifyEvent::GpuHealthy,
    ];

    /// Events of no job (a refused file never became one; a GPU's health
    /// is the host's): only stream channels hear them, and a job's
    /// `notify_on` cannot name them.
    pub const NOT_OF_A_JOB: [NotifyEvent; 3] = [
        NotifyEvent::Refused,
        NotifyEvent::GpuUnhealthy,
        NotifyEvent::GpuHealthy,
    ];

    pub fn is_of_a_job(self) -> bool {
        !NotifyEvent::NOT_OF_A_JOB.contains(&self)
    }

    /// Every end: what a job hears about when it names no `notify_on`.
    pub const ENDS: [NotifyEvent; 7] = [
        NotifyEvent::Succeeded,
        NotifyEvent::Failed,
        NotifyEvent::Timeout,
        NotifyEvent::IdleTimeout,
        NotifyEvent::DependencyFailed,
        NotifyEvent::NotNeeded,
        NotifyEvent::Stopped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NotifyEvent::Submitted => "submitted",
            NotifyEvent::Started => "started",
            NotifyEvent::Succeeded => "succeeded",
            NotifyEvent::Failed => "failed",
            NotifyEvent::Timeout => "timeout",
            NotifyEvent::IdleTimeout => "idle-timeout",
            NotifyEvent::DependencyFailed => "dependency-failed",
            NotifyEvent::NotNeeded => "not-needed",
            NotifyEvent::Stopped => "stopped",
            NotifyEvent::GpuLost => "gpu-lost",
            NotifyEvent::Retry => "retry",
            NotifyEvent::Refused => "refused",
            NotifyEvent::GpuUnhealthy => "gpu-unhealthy",
            NotifyEvent::GpuHealthy => "gpu-healthy",
        }
    }

    /// Where the event falls in an attempt's life, to order events
    /// recorded at the same instant (a start ptraind learns of with its end).
    pub fn lifecycle_rank(self) -> u8 {
        match self {
            NotifyEvent::Submitted | NotifyEvent::Refused => 0,
            NotifyEvent::Started => 1,
            NotifyEvent::GpuLost => 2,
            _ => 3,
        }
    }

    pub fn parse(s: &str) -> Option<NotifyEvent> {
        NotifyEvent::ALL.into_iter().find(|e| e.as_str() == s)
    }

    /// The event a job's end is announced as: a kill and a failed launch
    /// are failures like a non-zero exit.
    pub fn of_outcome(outcome: &Outcome) -> NotifyEvent {
        match outcome {
            Outcome::Succeeded => NotifyEvent::Succeeded,
            Outcome::Failed { .. } | Outcome::Killed { .. } | Outcome::LaunchFailed { .. } => {
                NotifyEvent::Failed
            }
            Outcome::Timeout => NotifyEvent::Timeout,
            Outcome::IdleTimeout { .. } => NotifyEvent::IdleTimeout,
            Outcome::Stopped { .. } => NotifyEvent::Stopped,
            Outcome::DependencyFailed { .. } => NotifyEvent::DependencyFailed,
            Outcome::NotNeeded { .. } => NotifyEvent::NotNeeded,
        }
    }
}

impl std::fmt::Display for NotifyEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            Outcome::Stopped {
                by_uid: 7,
                by_name: None
            }
        );
        assert!(matches!(
            outcome_of_unit("resources", 0, 0, None),
            Outcome::LaunchFailed { .. }
        ));
        // A stop whose SIGTERM was ignored ends in Result=timeout: stopped.
        assert_eq!(
            outcome_of_unit("timeout", 2, 9, Some(7)),
            Outcome::stopped_by(7)
        );
    }

    #[test]
    fn idle_stop_becomes_the_outcome_unless_a_timeout_came_first() {
        let idle = Outcome::IdleTimeout { idle_secs: 60 };
        for o in [
            Outcome::Killed { signal: 15 },
            Outcome::Failed { exit_code: 143 },
            Outcome::Succeeded,
            Outcome::Stopped {
                by_uid: 0,
                by_name: None,
            },
        ] {
            assert_eq!(idle_outcome(Some(60), o), idle);
        }
        assert_eq!(idle_outcome(Some(60), Outcome::Timeout), Outcome::Timeout);
        assert_eq!(idle_outcome(None, Outcome::Succeeded), Outcome::Succeeded);
        assert_eq!(idle.status(), "idle-timeout");
        assert!(idle.describe().contains("1m"), "{}", idle.describe());
    }

    #[test]
    fn events_round_trip_and_map_outcomes() {
        for e in NotifyEvent::ALL {
            assert_eq!(NotifyEvent::parse(e.as_str()), Some(e));
            let json = serde_json::to_string(&e).unwrap();
            assert_eq!(json, format!("\"{}\"", e.as_str()));
        }
        assert_eq!(NotifyEvent::parse("ended"), None);
        assert_eq!(
            NotifyEvent::of_outcome(&Outcome::Succeeded),
            NotifyEvent::Succeeded
        );
        assert_eq!(
            NotifyEvent::of_outcome(&Outcome::Killed { signal: 9 }),
            NotifyEvent::Failed
        );
        assert_eq!(
            NotifyEvent::of_outcome(&Outcome::LaunchFailed { reason: "x".into() }),
            NotifyEvent::Failed
        );
        assert_eq!(
            NotifyEvent::of_outcome(&Outcome::Timeout),
            NotifyEvent::Timeout
        );
        assert_eq!(
            NotifyEvent::of_outcome(&Outcome::Stopped {
                by_uid: 0,
                by_name: None,
            }),
            NotifyEvent::Stopped
        );
        // Not needed is its own event, not a failure, and an end.
        let skipped = Outcome::NotNeeded {
            parent: "train".into(),
            reason: "after_fail: train succeeded, so this job is not needed".into(),
        };
        assert_eq!(NotifyEvent::of_outcome(&skipped), NotifyEvent::NotNeeded);
        assert!(NotifyEvent::ENDS.contains(&NotifyEvent::NotNeeded));
        assert!(!NotifyEvent::ENDS.contains(&NotifyEvent::Started));
    }

    #[test]
    fn every_outcome_has_its_own_status_from_the_list() {
        let all = [
            Outcome::Succeeded,
            Outcome::Failed { exit_code: 1 },
            Outcome::Killed { signal: 9 },
            Outcome::Timeout,
            Outcome::IdleTimeout { idle_secs: 60 },
            Outcome::stopped_by(0),
            Outcome::LaunchFailed { reason: "x".into() },
            Outcome::DependencyFailed {
                parent: "p".into(),
                reason: "r".into(),
            },
            Outcome::NotNeeded {
                parent: "p".into(),
                reason: "r".into(),
            },
        ];
        let statuses: Vec<&str> = all.iter().map(Outcome::status).collect();
        assert_eq!(statuses, Outcome::STATUSES);
        // The serde tag is the status word too.
        for o in &all {
            let json = serde_json::to_value(o).unwrap();
            assert_eq!(json["kind"], o.status());
        }
    }

    #[test]
    fn signals_by_name_and_number() {
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(64), "64");
        assert_eq!(signal_number("SIGSEGV"), Some(11));
        assert_eq!(signal_number("TERM"), Some(15));
    }
}
