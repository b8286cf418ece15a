//! Serving one job's output into a pipe whose read end the caller got
//! over D-Bus (`OpenLogs`): users cannot read the system journal, so
//! ptraind reads it as root for the job's owner.
//!
//! A finished job is read from its archive when there is one, else from
//! the journal. Following a running job reads what is there, then a
//! `journalctl --follow` from the last cursor seen, until the job's end
//! arrives on the change broadcast; then journald is synced and whatever
//! came after the last cursor is read once more, so the last lines of the
//! job are never cut off. A queued job is waited for until it starts.

use std::os::fd::OwnedFd;

use tokio::io::{AsyncWriteExt, Interest};
use tokio::sync::broadcast;

use super::journal::{self, EntryStream, RunFilter, Start};
use super::{archive, JobLookup, JobOutput, ReadOptions, Tail};

/// How often a live `journalctl --follow` that exited on its own is
/// started again before the reader gives up.
const MAX_RESTARTS: u32 = 3;

pub(crate) async fn serve(
    log_dir: std::path::PathBuf,
    job: JobOutput,
    opts: ReadOptions,
    mut changes: broadcast::Receiver<JobOutput>,
    lookup: JobLookup,
    out: OwnedFd,
) {
    let id = job.id.clone();
    if let Err(e) = serve_inner(&log_dir, job, opts, &mut changes, &lookup, out).await {
        // A reader that went away (EPIPE) is the usual end of `ptrain logs | head`.
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            tracing::warn!(job = %id, PTRAIN_JOB = %id, error = %e, "stopped serving a job's output");
        }
    }
}

async fn serve_inner(
    log_dir: &std::path::Path,
    mut job: JobOutput,
    opts: ReadOptions,
    changes: &mut broadcast::Receiver<JobOutput>,
    lookup: &JobLookup,
    out: OwnedFd,
) -> std::io::Result<()> {
    if opts.follow && job.selection().is_none() && !job.ended {
        job = wait_for(changes, lookup, &job.id, |j| {
            j.selection().is_some() || j.ended
        })
        .await?;
    }
    // Never ran: no output.
    let Some(sel) = job.selection() else {
        return Ok(());
    };
    if job.ended {
        if let Some(file) = archive::open(log_dir, job.uid, &job.id, job.invocation_id.as_deref()) {
            return tokio::task::spawn_blocking(move || {
                let mut out = std::io::BufWriter::new(std::fs::File::from(out));
                archive::copy_out(file, opts.since_us, opts.lines, &mut out)
            })
            .await
            .map_err(std::io::Error::other)?;
        }
        if job.archive_only {
            // Its archive went between the lookup and now ([logs]
            // retention): the journal may hold only others' runs of the id.
            return Ok(());
        }
        // Just ended: make sure its last lines are in the journal.
        journal::sync().await;
    }
    let mut out = tokio::net::unix::pipe::Sender::from_owned_fd(out)?;
    let mut filter = RunFilter::new(&sel);
    let mut last: Option<String> = None;
    let wanted = |e: &journal::Entry, filter: &mut RunFilter| {
        filter.accept(e) && e.realtime >= opts.since_us
    };

    let mut tail = Tail::new(opts.lines);
    let oldest = tokio::task::spawn_blocking(super::sd_journal::oldest_entry_time)
        .await
        .map_err(std::io::Error::other)?
        .unwrap_or_else(|e| {
            tracing::warn!(job = %job.id, PTRAIN_JOB = %job.id, error = %e, "cannot tell whether the journal still holds the start of the job's output");
            None
        });
    if let Some((_, notice)) = journal::lost_head_notice(&sel, opts.since_us, oldest) {
        if let Some(m) = tail.push(notice) {
            write_line(&mut out, &m).await?;
        }
    }
    let mut history = EntryStream::spawn(&sel, &Start::Since(opts.since_us), false)?;
    while let Some(e) = history.next().await? {
        last = Some(e.cursor.clone());
        if wanted(&e, &mut filter) {
            if let Some(m) = tail.push(e.message) {
                write_line(&mut out, &m).await?;
            }
        }
    }
    for m in tail.drain() {
        write_line(&mut out, &m).await?;
    }
    if job.ended || !opts.follow {
        return Ok(());
    }

    let from = |last: &Option<String>| match last {
        Some(c) => Start::AfterCursor(c.clone()),
        None => Start::Since(opts.since_us),
    };
    let mut live = EntryStream::spawn(&sel, &from(&last), true)?;
    let mut restarts = 0;
    let ended = wait_for(changes, lookup, &job.id, |j| j.ended);
    tokio::pin!(ended);
    loop {
        tokio::select! {
            entry = live.next() => match entry? {
                Some(e) => {
                    last = Some(e.cursor.clone());
                    if wanted(&e, &mut filter) {
                        write_line(&mut out, &e.message).await?;
                    }
                }
                None => {
                    // journalctl exited while the job runs (journald
                    // restarted?): go on from where it stopped.
                    restarts += 1;
                    if restarts > MAX_RESTARTS {
                        return Err(std::io::Error::other("journalctl --follow keeps exiting"));
                    }
                    live = EntryStream::spawn(&sel, &from(&last), true)?;
                }
            },
            ended = &mut ended => {
                ended?;
                break;
            }
            // The reader closed its end while the job is silent.
            _ = out.ready(Interest::ERROR) => return Ok(()),
        }
    }
    drop(live);
    journal::sync().await;
    let mut rest = EntryStream::spawn(&sel, &from(&last), false)?;
    while let Some(e) = rest.next().await? {
        if wanted(&e, &mut filter) {
            write_line(&mut out, &e.message).await?;
        }
    }
    Ok(())
}

async fn write_line(out: &mut tokio::net::unix::pipe::Sender, m: &str) -> std::io::Result<()> {
    let mut line = Vec::with_capacity(m.len() + 1);
    line.extend_from_slice(m.as_bytes());
    line.push(b'\n');
    out.write_all(&line).await
}

/// Waits until a change of job `id` satisfies `pred`. After missing
/// changes (a slow reader), looks the job up instead.
async fn wait_for(
    changes: &mut broadcast::Receiver<JobOutput>,
    lookup: &JobLookup,
    id: &str,
    pred: impl Fn(&JobOutput) -> bool,
) -> std::io::Result<JobOutput> {
    let gone = || std::io::Error::other("ptraind is shutting down");
    loop {
        match changes.recv().await {
            Ok(j) if j.id == id && pred(&j) => return Ok(j),
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => {
                let j = lookup(id.to_owned()).await?;
                if pred(&j) {
                    return Ok(j);
                }
            }
            Err(broadcast::error::RecvError::Closed) => return Err(gone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    /// The reader-gone check must wait, not spin, while the reader is
    /// there, and wake once it closed its end.
    #[tokio::test]
    async fn closed_reader_is_noticed_without_spinning() {
        let (tx, rx) = tokio::net::unix::pipe::pipe().unwrap();
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
        assert!(tx.ready(Interest::ERROR).now_or_never().is_none());
        drop(rx);
        let ready = tx.ready(Interest::ERROR).await.unwrap();
        assert!(ready.is_error());
    }
}
