//! Chains of jobs: dependencies with Slurm's meanings, sweeps that expand
//! one descriptor into many jobs, and whether a waiting job may start.
//! Pure: the daemon supplies what it knows about other jobs.

use std::collections::{BTreeMap, BTreeSet};

use crate::spec::{JobId, JobSpec};

pub use crate::spec::dependencies::{
    parse_id_list, parse_sweep, Dependencies, Sweep, MAX_DEPENDENCIES, MAX_SWEEP_JOBS,
    MAX_SWEEP_PARAMS,
};

/// One job of an expanded sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    pub spec: JobSpec,
    pub params: BTreeMap<String, String>,
}

/// Expands a sweep into its members (grid product, in file order): each
/// gets a derived id like `base-lr0.1-bs32` and `{name}` substituted in its
/// command and env values.
pub fn expand(spec: &JobSpec, sweep: &Sweep) -> Vec<Member> {
    let mut combos: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for (name, values) in &sweep.params {
        combos = combos
            .into_iter()
            .flat_map(|combo| {
                values.iter().map(move |v| {
                    let mut c = combo.clone();
                    c.push((name.clone(), v.clone()));
                    c
                })
            })
            .collect();
    }
    let derived: Vec<Option<JobId>> = combos
        .iter()
        .map(|combo| {
            let mut id = spec.id.as_str().to_string();
            for (name, value) in combo {
                id.push('-');
                id.push_str(name);
                id.extend(value.chars().map(|c| {
                    if c.is_ascii_alphanumeric() || "._-".contains(c) {
                        c
                    } else {
                        '_'
                    }
                }));
            }
            JobId::parse(&id).ok()
        })
        .collect();
    let unique: BTreeSet<&JobId> = derived.iter().flatten().collect();
    let use_derived = unique.len() == combos.len();
    combos
        .into_iter()
        .enumerate()
        .map(|(i, combo)| {
            let id = match (&derived[i], use_derived) {
                (Some(id), true) => id.clone(),
                // Values that do not make a valid, unique id: number them.
                _ => JobId::parse(&format!("{}-{}", truncate_id(spec.id.as_str(), 56), i + 1))
                    .expect("a valid id plus a number is valid"),
            };
            let substitute = |text: &str| {
                let mut out = text.to_string();
                for (name, value) in &combo {
                    out = out.replace(&format!("{{{name}}}"), value);
                }
                out
            };
            let mut member = spec.clone();
            member.id = id;
            member.command = spec.command.iter().map(|a| substitute(a)).collect();
            member.env = spec
                .env
                .iter()
                .map(|(k, v)| (k.clone(), substitute(v)))
                .collect();
            member.sweep = None;
            Member {
                spec: member,
                params: combo.into_iter().collect(),
            }
        })
        .collect()
}

fn truncate_id(id: &str, max: usize) -> &str {
    &id[..id.len().min(max)]
}

/// How a job named in a dependency list ended, as far as it matters here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParentState {
    Pending,
    Succeeded,
    /// Ended without running because it was not needed (`not-needed`):
    /// neither a success nor a failure, so a branch that waits on it is
    /// not needed either.
    NotNeeded,
    /// Ended any other way; the status word says how.
    NotOk(String),
}

/// Whether a waiting job may start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// Still waiting for these jobs.
    Waiting(Vec<String>),
    /// Can never run because a parent failed (`dependency-failed`): which
    /// parent and why.
    Never {
        parent: String,
        reason: String,
    },
    /// Will never run, and that is no failure (`not-needed`): an
    /// `after_fail` parent succeeded, or a parent was itself not needed.
    NotNeeded {
        parent: String,
        reason: String,
    },
}

/// Decides from the parents' states, with Slurm's meanings: `after_ok`
/// (afterok) runs once every listed job succeeded, `after_fail`
/// (afternotok) once every listed job ended not ok, `after_any` (afterany)
/// once every listed job ended; all lists must hold. A list that can no
/// longer hold is decided at once, as Slurm does, without waiting for the
/// other parents: a failed `after_ok` parent makes the job
/// `dependency-failed`; an `after_fail` parent that succeeded makes it
/// `not-needed`, as does a not-needed parent in `after_ok` or `after_fail`
/// (its branch was not taken). A not-needed parent counts as ended for
/// `after_any`. When both apply, the failure is reported.
///
/// `resolve` expands an id (a job, or a sweep into its members) to the
/// jobs and their states.
pub fn readiness(
    deps: &Dependencies,
    resolve: impl Fn(&JobId) -> Vec<(JobId, ParentState)>,
) -> Readiness {
    let mut waiting = BTreeSet::new();
    let mut not_needed: Option<(String, String)> = None;
    let mut skip = |id: &JobId, reason: String| {
        not_needed.get_or_insert_with(|| (id.to_string(), reason));
    };
    for named in &deps.after_ok {
        for (id, state) in resolve(named) {
            match state {
                ParentState::Pending => {
                    waiting.insert(id.to_string());
                }
                ParentState::Succeeded => {}
                ParentState::NotNeeded => skip(
                    &id,
                    format!("after_ok: {id} was not needed, so neither is this job"),
                ),
                ParentState::NotOk(status) => {
                    return Readiness::Never {
                        parent: id.to_string(),
                        reason: format!("after_ok: {id} ended {status}"),
                    }
                }
            }
        }
    }
    for named in &deps.after_any {
        for (id, state) in resolve(named) {
            if state == ParentState::Pending {
                waiting.insert(id.to_string());
            }
        }
    }
    for named in &deps.after_fail {
        for (id, state) in resolve(named) {
            match state {
                ParentState::Pending => {
                    waiting.insert(id.to_string());
                }
                ParentState::NotOk(_) => {}
                ParentState::Succeeded => skip(
                    &id,
                    format!("after_fail: {id} succeeded, so this job is not needed"),
                ),
                ParentState::NotNeeded => skip(
                    &id,
                    format!("after_fail: {id} did not run (not needed), so this job is not needed"),
                ),
            }
        }
    }
    if let Some((parent, reason)) = not_needed {
        Readiness::NotNeeded { parent, reason }
    } else if waiting.is_empty() {
        Readiness::Ready
    } else {
        Readiness::Waiting(waiting.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse_spec;

    fn id(s: &str) -> JobId {
        JobId::parse(s).unwrap()
    }

    fn deps(ok: &[&str], fail: &[&str], any: &[&str]) -> Dependencies {
        Dependencies {
            after_ok: ok.iter().map(|s| id(s)).collect(),
            after_fail: fail.iter().map(|s| id(s)).collect(),
            after_any: any.iter().map(|s| id(s)).collect(),
        }
    }

    fn resolver<'a>(
        states: &'a [(&'a str, ParentState)],
    ) -> impl Fn(&JobId) -> Vec<(JobId, ParentState)> + 'a {
        move |named| {
            states
                .iter()
                .filter(|(n, _)| n.starts_with(named.as_str()))
                .map(|(n, s)| (id(n), s.clone()))
                .collect()
        }
    }

    #[test]
    fn after_ok_waits_then_runs_or_never() {
        use ParentState::*;
        let d = deps(&["a"], &[], &[]);
        assert_eq!(
            readiness(&d, resolver(&[("a", Pending)])),
            Readiness::Waiting(vec!["a".into()])
        );
        assert_eq!(
            readiness(&d, resolver(&[("a", Succeeded)])),
            Readiness::Ready
        );
        assert!(
            matches!(readiness(&d, resolver(&[("a", NotOk("failed".into()))])), Readiness::Never { parent, .. } if parent == "a")
        );
    }

    #[test]
    fn after_fail_runs_only_when_every_parent_failed() {
        use ParentState::*;
        let failed = || NotOk("failed".into());
        let d = deps(&[], &["a", "b"], &[]);
        // One failed, one still running: wait for it.
        assert_eq!(
            readiness(&d, resolver(&[("a", failed()), ("b", Pending)])),
            Readiness::Waiting(vec!["b".into()])
        );
        // Every parent ended not ok (any way): run.
        assert_eq!(
            readiness(
                &d,
                resolver(&[("a", failed()), ("b", NotOk("timeout".into()))])
            ),
            Readiness::Ready
        );
        // Only a failed: afternotok:a:b can never hold, so not needed,
        // naming the parent that succeeded.
        let r = readiness(&d, resolver(&[("a", failed()), ("b", Succeeded)]));
        assert!(
            matches!(&r, Readiness::NotNeeded { parent, reason } if parent == "b" && reason.contains("b succeeded")),
            "{r:?}"
        );
        // Decided as soon as one succeeded, as Slurm does.
        assert!(matches!(
            readiness(&d, resolver(&[("a", Succeeded), ("b", Pending)])),
            Readiness::NotNeeded { parent, .. } if parent == "a"
        ));
        assert!(matches!(
            readiness(&d, resolver(&[("a", Succeeded), ("b", Succeeded)])),
            Readiness::NotNeeded { .. }
        ));
        // A sweep named in after_fail: every member must fail.
        let d = deps(&[], &["sw"], &[]);
        assert_eq!(
            readiness(&d, resolver(&[("sw-1", failed()), ("sw-2", failed())])),
            Readiness::Ready
        );
        assert!(matches!(
            readiness(&d, resolver(&[("sw-1", failed()), ("sw-2", Succeeded)])),
            Readiness::NotNeeded { parent, .. } if parent == "sw-2"
        ));
    }

    #[test]
    fn not_needed_is_not_a_failure_and_follows_the_branch() {
        use ParentState::*;
        // after_ok of a job that was not needed: not needed either.
        let d = deps(&["alert"], &[], &[]);
        assert!(matches!(
            readiness(&d, resolver(&[("alert", NotNeeded)])),
            Readiness::NotNeeded { parent, .. } if parent == "alert"
        ));
        // after_fail of it: it did not fail, so not needed.
        let d = deps(&[], &["alert"], &[]);
        assert!(matches!(
            readiness(&d, resolver(&[("alert", NotNeeded)])),
            Readiness::NotNeeded { .. }
        ));
        // after_any: it ended, so run.
        let d = deps(&[], &[], &["alert"]);
        assert_eq!(
            readiness(&d, resolver(&[("alert", NotNeeded)])),
            Readiness::Ready
        );
        // A failure elsewhere wins: the job is dependency-failed.
        let d = deps(&["train"], &["alert"], &[]);
        let states = [("train", NotOk("failed".into())), ("alert", Succeeded)];
        assert!(matches!(
            readiness(&d, resolver(&states)),
            Readiness::Never { parent, .. } if parent == "train"
        ));
        // Not needed is decided even while other lists still wait.
        let states = [("train", Pending), ("alert", Succeeded)];
        assert!(matches!(
            readiness(&d, resolver(&states)),
            Readiness::NotNeeded { parent, .. } if parent == "alert"
        ));
    }

    #[test]
    fn after_any_waits_for_every_member_of_a_group() {
        use ParentState::*;
        let d = deps(&[], &[], &["sw"]);
        let states = [("sw-1", Succeeded), ("sw-2", Pending)];
        assert_eq!(
            readiness(&d, resolver(&states)),
            Readiness::Waiting(vec!["sw-2".into()])
        );
        let states = [("sw-1", Succeeded), ("sw-2", NotOk("timeout".into()))];
        assert_eq!(readiness(&d, resolver(&states)), Readiness::Ready);
    }

    #[test]
    fn sweep_expands_grid_in_file_order_with_substitution() {
        let spec = parse_spec(
            br#"{"version":1,"command":["train","--lr","{lr}","--bs={bs}","{other}"],"env":{"LR":"{lr}"},
                "sweep":{"lr":[0.1,0.01],"bs":[32,64]},"max_parallel":2}"#,
            "base",
        )
        .unwrap();
        let sweep = spec.sweep.clone().unwrap();
        assert_eq!(sweep.max_parallel, Some(2));
        let members = expand(&spec, &sweep);
        let ids: Vec<&str> = members.iter().map(|m| m.spec.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "base-lr0.1-bs32",
                "base-lr0.1-bs64",
                "base-lr0.01-bs32",
                "base-lr0.01-bs64"
            ]
        );
        assert_eq!(
            members[1].spec.command,
            ["train", "--lr", "0.1", "--bs=64", "{other}"]
        );
        assert_eq!(members[2].spec.env["LR"], "0.01");
        assert!(members.iter().all(|m| m.spec.sweep.is_none()));
    }

    #[test]
    fn sweep_values_that_make_bad_ids_are_numbered() {
        let spec = parse_spec(
            br#"{"version":1,"command":["x"],"sweep":{"p":["a/b","a b"]}}"#,
            "s",
        )
        .unwrap();
        let members = expand(&spec, spec.sweep.as_ref().unwrap());
        let ids: Vec<&str> = members.iter().map(|m| m.spec.id.as_str()).collect();
        assert_eq!(ids, ["s-1", "s-2"]);
    }

    #[test]
    fn sweep_and_dependency_fields_are_validated() {
        for (json, needle) in [
            (
                r#"{"version":1,"command":["x"],"sweep":{"lr":[]}}"#,
                "no values",
            ),
            (
                r#"{"version":1,"command":["x"],"sweep":{"l r":[1]}}"#,
                "valid name",
            ),
            (r#"{"version":1,"command":["x"],"sweep":[1]}"#, "object"),
            (r#"{"version":1,"command":["x"],"after_ok":"a"}"#, "array"),
            (
                r#"{"version":1,"command":["x"],"after_ok":["../a"]}"#,
                "after_ok",
            ),
            (r#"{"version":1,"command":["x"],"max_parallel":2}"#, "sweep"),
            (
                r#"{"version":1,"command":["x"],"sweep":{"a":[1,2,3,4,5,6,7,8,9,10],"b":[1,2,3,4,5,6,7,8,9,10],"c":[1,2,3,4,5,6,7,8,9,10],"d":[1,2]}}"#,
                "more than",
            ),
        ] {
            let e = parse_spec(json.as_bytes(), "j").unwrap_err().to_string();
            assert!(e.contains(needle), "{json}: {e}");
        }
    }
}
