//! `ptrain list`: which jobs (the filter, the recent ends), and the table or
//! the tree.

use std::io::IsTerminal;

use ptrain::api::Daemon1Proxy;
use ptrain::display::escape;
use ptrain::views::JobView;

use crate::human::{
    duration_of, format_duration, format_time, last_column, terminal_width, truncate,
};
use crate::wait::is_final;
use crate::{fail, from_bus, parse, print_json, proxy, Failure, EXIT_USAGE};

/// Every status word a job shows (`JobView::status`), in the order a job
/// passes through them: the live ones, every outcome's (the job model's
/// one list), and `ended`, a record kept without an outcome.
pub(crate) fn status_words() -> Vec<&'static str> {
    ptrain::job::Outcome::ACTIVE
        .into_iter()
        .chain(ptrain::job::Outcome::STATUSES)
        .chain(["ended"])
        .collect()
}

/// The uid of `user`, a login name or a number.
pub(crate) fn uid_of_user(user: &str) -> Result<u32, Failure> {
    if let Ok(uid) = user.parse() {
        return Ok(uid);
    }
    ptrain::users::uid_of_name(user).ok_or_else(|| {
        fail(
            EXIT_USAGE,
            format!("no user {user:?} on this system; give a login name (`id -un USER`) or a uid"),
        )
    })
}

/// What `ptrain list --user/--mine/--status` keeps. Applied here to what
/// ptraind lists: the listing already holds every job's owner and status,
/// also the ones [privacy] hides the details of.
#[derive(Default)]
pub(crate) struct ListFilter {
    pub(crate) uid: Option<u32>,
    /// Empty: every status.
    pub(crate) statuses: std::collections::BTreeSet<String>,
}

impl ListFilter {
    fn is_empty(&self) -> bool {
        self.uid.is_none() && self.statuses.is_empty()
    }

    fn keeps(&self, job: &JobView) -> bool {
        self.uid.is_none_or(|uid| job.uid == uid)
            && (self.statuses.is_empty() || self.statuses.contains(&job.status))
    }

    /// Would every job it keeps be queued, launching or running? Those
    /// are all in the short listing whatever `--recent` says.
    fn only_active(&self) -> bool {
        !self.statuses.is_empty() && self.statuses.iter().all(|s| !is_final(s))
    }
}

/// The jobs `ptrain list` shows: the active ones and the `recent` newest
/// ends (every job with `all`), of those the filter keeps. With a filter,
/// `--recent` counts the ends it keeps, so it reads the whole listing
/// unless only active jobs can match (they are always in the short one).
pub(crate) async fn list_jobs(
    proxy: &Daemon1Proxy<'_>,
    all: bool,
    recent: u32,
    filter: &ListFilter,
) -> Result<Vec<JobView>, Failure> {
    let reply = if filter.only_active() {
        proxy.list_recent(0).await
    } else if all || !filter.is_empty() {
        proxy.list().await
    } else {
        proxy.list_recent(recent).await
    };
    let jobs: Vec<JobView> = parse(&reply.map_err(from_bus)?)?;
    if filter.is_empty() {
        return Ok(jobs);
    }
    Ok(keep_recent(
        jobs.into_iter().filter(|j| filter.keeps(j)).collect(),
        if all { None } else { Some(recent as usize) },
    ))
}

/// The active jobs and the `recent` most recently ended (every one for
/// None), in the listing's order (by submission).
fn keep_recent(jobs: Vec<JobView>, recent: Option<usize>) -> Vec<JobView> {
    let Some(recent) = recent else {
        return jobs;
    };
    let mut ends: Vec<(u64, &str)> = jobs
        .iter()
        .filter(|j| is_final(&j.status))
        .map(|j| (j.ended_at.unwrap_or(0), j.id.as_str()))
        .collect();
    ends.sort_unstable_by(|a, b| b.cmp(a));
    let newest: std::collections::BTreeSet<String> = ends
        .into_iter()
        .take(recent)
        .map(|(_, id)| id.to_owned())
        .collect();
    jobs.into_iter()
        .filter(|j| !is_final(&j.status) || newest.contains(&j.id))
        .collect()
}

pub(crate) fn print_table(jobs: &[JobView]) {
    let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let width = terminal_width();
    // Every column keeps its width whatever is in it, so the next one
    // starts where its header does: STATUS fits the longest status
    // ("dependency-failed"), and the rest are cut with "…".
    outln!(
        "{:<24} {:<17} {:<12} {:<8} {:<20} {:<10} DETAIL",
        "ID",
        "STATUS",
        "OWNER",
        "GPUS",
        "SUBMITTED",
        "RAN"
    );
    for j in jobs {
        // GPU indices as `#0,#1`: a bare "1" read like a count.
        let gpus = if j.gpus.is_empty() {
            "-".to_string()
        } else {
            j.gpus
                .iter()
                .map(|i| format!("#{i}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let status = format!("{:<17}", truncate(&j.status, 17));
        let status = if color {
            let code = match j.status.as_str() {
                "succeeded" => "32",
                // Neither good nor bad news: the terminal's dim.
                "not-needed" => "2",
                "running" | "launching" => "36",
                "queued" | "pulling" => "33",
                _ => "31",
            };
            format!("\x1b[{code}m{status}\x1b[0m")
        } else {
            status
        };
        outln!(
            "{:<24} {} {:<12} {:<8} {:<20} {:<10} {}",
            truncate(&j.id, 24),
            status,
            truncate(&escape(&j.owner), 12),
            truncate(&gpus, 8),
            format_time(j.submitted_at),
            duration_of(j)
                .map(format_duration)
                .unwrap_or_else(|| "-".into()),
            // The columns before DETAIL and their separators.
            last_column(&list_detail(j), 24 + 17 + 12 + 8 + 20 + 10 + 6, width)
        );
    }
}

/// The DETAIL column: the job's `name` first (its people's handle for
/// it), then how it stands.
fn list_detail(j: &JobView) -> String {
    match &j.name {
        Some(name) => format!("[{}] {}", escape(name), escape(&j.detail)),
        None => escape(&j.detail).into_owned(),
    }
}

/// The jobs as a forest: a job appears under each job it waits for that is
/// in the list (a sweep's dependents under its last member); jobs waiting
/// for nothing listed are roots.
pub(crate) fn render_tree(jobs: &[JobView]) -> String {
    use std::collections::{BTreeMap, BTreeSet};
    // A sweep id stands for its last listed member.
    let mut last_member: BTreeMap<&str, &str> = BTreeMap::new();
    for job in jobs {
        if let Some(group) = job.group.as_deref() {
            last_member.insert(group, job.id.as_str());
        }
    }
    let ids: BTreeSet<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
    let mut children: BTreeMap<&str, Vec<&JobView>> = BTreeMap::new();
    let mut roots = Vec::new();
    for job in jobs {
        let parents: BTreeSet<&str> = job
            .after_ok
            .iter()
            .chain(&job.after_fail)
            .chain(&job.after_any)
            .filter_map(|p| {
                last_member
                    .get(p.as_str())
                    .copied()
                    .or(ids.get(p.as_str()).copied())
            })
            .collect();
        if parents.is_empty() {
            roots.push(job);
        }
        for p in parents {
            children.entry(p).or_default().push(job);
        }
    }
    struct Tree<'a> {
        children: BTreeMap<&'a str, Vec<&'a JobView>>,
        out: String,
        shown: BTreeSet<&'a str>,
    }
    impl<'a> Tree<'a> {
        fn walk(&mut self, job: &'a JobView, depth: usize) {
            let indent = "  ".repeat(depth);
            // A job under two parents is shown and expanded once; under
            // the others it is named.
            if !self.shown.insert(job.id.as_str()) {
                self.out
                    .push_str(&format!("{indent}{} (shown above)\n", escape(&job.id)));
                return;
            }
            let how = if job.after_fail.is_empty() {
                ""
            } else {
                " (after_fail)"
            };
            let detail = if job.detail.is_empty() || job.detail == job.status {
                String::new()
            } else {
                format!(" — {}", escape(&job.detail))
            };
            self.out.push_str(&format!(
                "{indent}{} {}{how}{detail}\n",
                escape(&job.id),
                escape(&job.status),
            ));
            for kid in self
                .children
                .get(job.id.as_str())
                .cloned()
                .unwrap_or_default()
            {
                self.walk(kid, depth + 1);
            }
        }
    }
    let mut tree = Tree {
        children,
        out: String::new(),
        shown: BTreeSet::new(),
    };
    for root in roots {
        tree.walk(root, 0);
    }
    tree.out
}

/// `ptrain list`: the jobs the filter keeps, as a table, a tree or JSON.
pub(crate) async fn list(
    filter: &ListFilter,
    all: bool,
    recent: u32,
    json: bool,
    tree: bool,
) -> Result<u8, Failure> {
    let proxy = proxy().await?;
    let jobs = list_jobs(&proxy, all, recent, filter).await?;
    if json {
        print_json(&jobs);
    } else if tree {
        out!("{}", render_tree(&jobs));
    } else {
        print_table(&jobs);
    }
    Ok(0)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{Cli, Command};
    use clap::Parser;

    #[test]
    fn list_names_a_job_before_its_detail() {
        let mut job: JobView = serde_json::from_value(serde_json::json!({
            "id": "a", "status": "running", "owner": "alice", "uid": 1000,
            "unit": "ptrain-job@a.service", "command": ["true"],
            "gpus": [], "gpu_uuids": [], "submitted_at": 1, "detail": "running",
            "name": "resnet baseline",
        }))
        .unwrap();
        assert_eq!(list_detail(&job), "[resnet baseline] running");
        job.name = None;
        assert_eq!(list_detail(&job), "running");
    }

    #[test]
    fn a_job_with_two_parents_is_shown_once_and_named_under_the_other() {
        let job = |id: &str, after: &[&str]| -> JobView {
            serde_json::from_value(serde_json::json!({
                "id": id, "status": "succeeded", "owner": "alice", "uid": 1000,
                "unit": format!("ptrain-job@{id}.service"), "command": ["true"],
                "gpus": [], "gpu_uuids": [], "submitted_at": 1, "detail": "succeeded",
                "after_ok": after,
            }))
            .unwrap()
        };
        let jobs = [
            job("a", &[]),
            job("b", &[]),
            job("ab", &["a", "b"]),
            job("next", &["ab"]),
        ];
        let tree = render_tree(&jobs);
        assert_eq!(
            tree.lines().collect::<Vec<_>>(),
            [
                "a succeeded",
                "  ab succeeded",
                "    next succeeded",
                "b succeeded",
                "  ab (shown above)",
            ],
            "{tree}"
        );
    }

    /// A listed job as `ptrain list` receives it.
    pub(crate) fn listed(id: &str, uid: u32, status: &str, ended_at: Option<u64>) -> JobView {
        serde_json::from_value(serde_json::json!({
            "id": id, "status": status, "owner": format!("u{uid}"), "uid": uid,
            "unit": format!("ptrain-job@{id}.service"), "command": ["true"],
            "gpus": [], "gpu_uuids": [], "submitted_at": 1, "detail": status,
            "ended_at": ended_at,
        }))
        .unwrap()
    }

    #[test]
    fn list_filters_keep_the_user_and_statuses_asked_for() {
        let jobs = [
            listed("a", 1000, "running", None),
            listed("b", 1001, "failed", Some(5)),
            listed("c", 1000, "succeeded", Some(6)),
            listed("d", 1000, "failed", Some(7)),
        ];
        let kept = |filter: &ListFilter| -> Vec<&str> {
            jobs.iter()
                .filter(|j| filter.keeps(j))
                .map(|j| j.id.as_str())
                .collect()
        };
        let mine = ListFilter {
            uid: Some(1000),
            ..Default::default()
        };
        assert_eq!(kept(&mine), ["a", "c", "d"]);
        let failed = ListFilter {
            statuses: ["failed".to_string()].into(),
            ..Default::default()
        };
        assert_eq!(kept(&failed), ["b", "d"]);
        let both = ListFilter {
            uid: Some(1000),
            statuses: ["failed".to_string(), "running".to_string()].into(),
        };
        assert_eq!(kept(&both), ["a", "d"]);
        assert!(
            !both.only_active(),
            "failed jobs are not in the short listing"
        );
        let active = ListFilter {
            statuses: ["queued".to_string(), "running".to_string()].into(),
            ..Default::default()
        };
        assert!(active.only_active());
        assert!(ListFilter::default().is_empty());
    }

    #[test]
    fn recent_counts_the_newest_ends_the_filter_kept() {
        let jobs = vec![
            listed("old", 1000, "failed", Some(1)),
            listed("live", 1000, "queued", None),
            listed("new", 1000, "failed", Some(9)),
            listed("mid", 1000, "succeeded", Some(5)),
        ];
        let ids = |jobs: Vec<JobView>| jobs.into_iter().map(|j| j.id).collect::<Vec<_>>();
        assert_eq!(
            ids(keep_recent(jobs.clone(), Some(2))),
            ["live", "new", "mid"]
        );
        assert_eq!(ids(keep_recent(jobs.clone(), Some(0))), ["live"]);
        assert_eq!(ids(keep_recent(jobs, None)).len(), 4);
    }

    #[test]
    fn the_status_words_hold_every_outcome_of_the_job_model() {
        assert_eq!(status_words()[..4], ptrain::job::Outcome::ACTIVE);
        assert_eq!(status_words()[4..13], ptrain::job::Outcome::STATUSES);
    }

    #[test]
    fn every_status_word_is_known_to_the_filter() {
        use clap::CommandFactory;
        let err = Cli::command()
            .try_get_matches_from(["ptrain", "list", "--status", "queued,bogus"])
            .unwrap_err();
        assert_eq!(err.exit_code(), i32::from(EXIT_USAGE));
        let said = err.to_string();
        for word in status_words() {
            assert!(said.contains(word), "{word} not named in: {said}");
        }
        let ok = Cli::try_parse_from([
            "ptrain",
            "list",
            "--status",
            "queued,failed",
            "--status",
            "stopped",
            "--mine",
            "--all",
        ]);
        match ok.map(|c| c.command) {
            Ok(Command::List {
                status, mine, all, ..
            }) => {
                assert_eq!(status, ["queued", "failed", "stopped"]);
                assert!(mine && all);
            }
            _ => panic!("list --status did not parse"),
        }
        assert!(
            Cli::try_parse_from(["ptrain", "stop"]).is_err(),
            "stop needs ids or --user"
        );
        assert!(Cli::try_parse_from(["ptrain", "stop", "--user", "alice"]).is_ok());
    }
}
