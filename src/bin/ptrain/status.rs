//! `ptrain status`: one job, or a sweep, for people.

use std::time::Duration;

use ptrain::display::escape;
use ptrain::store::signal_name;
use ptrain::views::JobView;

use crate::human::{duration_of, format_duration, format_time};
use crate::{from_bus, parse, print_json, proxy, Failure, EXIT_FAILURE};

/// A sweep for people: how many of its jobs are in each state, then each
/// job with what it ran with and how it ended.
pub(crate) fn print_sweep(id: &str, members: &[JobView]) {
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for m in members {
        *counts.entry(m.status.as_str()).or_default() += 1;
    }
    let counts: Vec<String> = counts
        .iter()
        .map(|(s, n)| format!("{n} {}", escape(s)))
        .collect();
    outln!(
        "sweep:     {} ({} jobs: {})",
        escape(id),
        members.len(),
        counts.join(", ")
    );
    for m in members {
        let params: Vec<String> = m
            .params
            .iter()
            .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
            .collect();
        let how = if m.detail.is_empty() || m.detail == m.status {
            escape(&m.status).into_owned()
        } else {
            format!("{} — {}", escape(&m.status), escape(&m.detail))
        };
        outln!("  {:<24} {:<20} {}", escape(&m.id), params.join(" "), how);
    }
}

/// One job for people. Every field a user wrote (the command, its
/// workdir, a reason quoted in the detail) is [`escape`]d: the reader may
/// be anyone, root included.
pub(crate) fn print_status(j: &JobView) {
    outln!("job:       {}", escape(&j.id));
    if let Some(name) = &j.name {
        outln!("name:      {}", escape(name));
    }
    if let Some(comment) = &j.comment {
        outln!("comment:   {}", escape(comment));
    }
    // A detail that only repeats the status ("succeeded") says nothing more.
    if j.detail.is_empty() || j.detail == j.status {
        outln!("status:    {}", escape(&j.status));
    } else {
        outln!("status:    {} — {}", escape(&j.status), escape(&j.detail));
    }
    outln!("owner:     {} (uid {})", escape(&j.owner), j.uid);
    outln!("unit:      {}", escape(&j.unit));
    if j.private {
        outln!("command:   (private to its owner; the admin's [privacy] show_all_jobs shows it)");
    } else {
        let command: Vec<_> = j.command.iter().map(|a| escape(a)).collect();
        outln!("command:   {}", command.join(" "));
    }
    if let Some(image) = &j.image {
        match &j.image_digest {
            Some(digest) => outln!("image:     {} ({})", escape(image), escape(digest)),
            None => outln!("image:     {} (not pulled yet)", escape(image)),
        }
    }
    if let Some(w) = &j.workdir {
        outln!("workdir:   {}", escape(w));
    }
    if let Some(t) = j.timeout_secs {
        outln!(
            "timeout:   {}",
            humantime::format_duration(Duration::from_secs(t))
        );
    }
    if j.priority != 0 {
        outln!("priority:  {}", j.priority);
    }
    let gpus = if j.gpus.is_empty() {
        "none".to_string()
    } else {
        j.gpus
            .iter()
            .zip(&j.gpu_uuids)
            .map(|(i, u)| format!("{i} ({})", escape(u)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    outln!("gpus:      {gpus}");
    outln!("submitted: {}", format_time(j.submitted_at));
    if let Some(b) = j.begin_at {
        outln!("begin:     {}", format_time(b));
    }
    if let Some(s) = j.started_at {
        outln!("started:   {}", format_time(s));
    }
    if let Some(e) = j.ended_at {
        outln!("ended:     {}", format_time(e));
    }
    if let Some(d) = duration_of(j) {
        outln!("ran for:   {}", format_duration(d));
    }
    if let Some(code) = j.exit_code {
        outln!("exit code: {code}");
    }
    if let Some(sig) = j.signal {
        outln!("signal:    {}", signal_name(sig));
    }
    if let Some(usage) = &j.usage {
        outln!("usage:     {}", usage.describe());
    }
    for gpu in &j.gpu_usage {
        outln!("gpu usage: {}", gpu.describe());
    }
    for line in status_extras(j) {
        outln!("{line}");
    }
    for a in &j.attempts {
        let invocation = a
            .invocation_id
            .as_deref()
            .map(|inv| format!("; invocation {}", escape(inv)))
            .unwrap_or_default();
        outln!(
            "attempt {}: {} at {}{invocation}; then {}",
            a.attempt,
            a.outcome.describe(),
            format_time(a.ended_at),
            a.why
        );
    }
    if j.attempt > 1 {
        outln!("attempt:   {} (this one)", j.attempt);
    }
    if let Some(inv) = &j.invocation_id {
        outln!("logs:      ptrain logs {} (invocation {inv})", j.id);
    }
}

/// What `status` shows besides the times and the end: the sweep and its
/// parameters, what the job waits for, what it asked for and the limits
/// it runs with, and its result (or why the file it wrote was ignored).
fn status_extras(j: &JobView) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(group) = &j.group {
        let params: Vec<String> = j
            .params
            .iter()
            .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
            .collect();
        lines.push(match params.is_empty() {
            true => format!("sweep:     {}", escape(group)),
            false => format!("sweep:     {} ({})", escape(group), params.join(", ")),
        });
    }
    for (kind, parents) in [
        ("after_ok", &j.after_ok),
        ("after_fail", &j.after_fail),
        ("after_any", &j.after_any),
    ] {
        if !parents.is_empty() {
            let parents: Vec<_> = parents.iter().map(|p| escape(p)).collect();
            lines.push(format!("{kind:<10} {}", parents.join(", ")));
        }
    }
    if !j.waiting_for.is_empty() {
        let parents: Vec<_> = j.waiting_for.iter().map(|p| escape(p)).collect();
        lines.push(format!("waits for: {}", parents.join(", ")));
    }
    if !j.gpu_request.is_empty() {
        lines.push(format!("asked for: {}", escape(&j.gpu_request)));
    }
    if !j.resources.is_empty() {
        lines.push(format!("limits:    {}", j.resources));
    }
    if let Some(result) = &j.result {
        lines.push(format!("result:    {}", escape(&result.to_string())));
    }
    if let Some(why) = &j.result_error {
        lines.push(format!(
            "result:    none: what it wrote was ignored ({})",
            escape(why)
        ));
    }
    if let Some(warning) = &j.gpu_warning {
        lines.push(format!("GPU:       {}", escape(warning)));
    }
    lines
}

/// `ptrain status ID`: one job, or a sweep's members.
pub(crate) async fn status(id: String, json: bool) -> Result<u8, Failure> {
    let proxy = proxy().await?;
    let failure = match proxy.status(&id).await {
        Ok(job) => {
            let job: JobView = parse(&job)?;
            if json {
                print_json(&job);
            } else {
                print_status(&job);
            }
            return Ok(0);
        }
        Err(e) => from_bus(e),
    };
    // Not a job: a sweep id stands for its members (as for `wait`
    // and `stop`).
    if failure.code != EXIT_FAILURE {
        return Err(failure);
    }
    let jobs: Vec<JobView> = parse(&proxy.list().await.map_err(from_bus)?)?;
    let mut members: Vec<JobView> = jobs
        .into_iter()
        .filter(|j| j.group.as_deref() == Some(id.as_str()))
        .collect();
    if members.is_empty() {
        return Err(failure);
    }
    members.sort_by(|a, b| a.id.cmp(&b.id));
    if json {
        print_json(&members);
    } else {
        print_sweep(&id, &members);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_shows_the_sweep_parents_limits_and_result() {
        let job: JobView = serde_json::from_value(serde_json::json!({
            "id": "lr-1", "status": "succeeded", "owner": "alice", "uid": 1000,
            "unit": "ptrain-job@lr-1.service", "command": ["true"],
            "gpus": [], "gpu_uuids": [], "submitted_at": 1, "detail": "succeeded",
            "group": "lr", "params": {"lr": "0.1"}, "after_ok": ["prep", "data"],
            "gpu_request": "1 GPU", "resources": "4 CPUs, 12.0 GiB of memory",
            "result": {"acc": 0.9},
        }))
        .unwrap();
        assert_eq!(
            status_extras(&job),
            [
                "sweep:     lr (lr=0.1)",
                "after_ok   prep, data",
                "asked for: 1 GPU",
                "limits:    4 CPUs, 12.0 GiB of memory",
                "result:    {\"acc\":0.9}",
            ]
        );
        let ignored = JobView {
            result: None,
            result_error: Some("result.json must hold a JSON object".into()),
            ..job
        };
        assert!(status_extras(&ignored)
            .last()
            .unwrap()
            .starts_with("result:    none: what it wrote was ignored (result.json must"));
        let warned = JobView {
            gpu_warning: Some("GPU 1 (GPU-x) left the pool while this job ran on it: lost".into()),
            ..ignored
        };
        assert_eq!(
            status_extras(&warned).last().unwrap(),
            "GPU:       GPU 1 (GPU-x) left the pool while this job ran on it: lost"
        );
    }
}
