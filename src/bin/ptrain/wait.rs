//! `ptrain wait` (and `submit --wait`): following jobs to their end; the exit
//! code says the worst outcome.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc::UnboundedReceiver;

use ptrain::api::Daemon1Proxy;
use ptrain::display::escape;
use ptrain::views::JobView;

use crate::{fail, from_bus, parse, proxy, Failure, EXIT_NO_DAEMON};

const EXIT_JOB_FAILED: u8 = 4;
const EXIT_JOB_TIMEOUT: u8 = 5;
const EXIT_JOB_STOPPED: u8 = 6;
const EXIT_JOB_DEPENDENCY: u8 = 7;

pub(crate) fn is_final(status: &str) -> bool {
    !ptrain::job::Outcome::is_active(status)
}

/// How often `wait` asks ptraind for the truth about the jobs it follows
/// even when no signal came: the safety net under a signal the bus dropped
/// (dbus-daemon discards messages for a reader that falls too far behind).
const RECHECK_EVERY: Duration = Duration::from_secs(15);

/// What the bus said while we wait: only hints of what to ask ptraind
/// about. The status in a signal is never taken as the truth: ptraind
/// emits each signal from its own task, so two changes of one job can
/// arrive in either order.
pub(crate) enum Hint {
    /// A job changed.
    Changed(String),
    /// ptraind's bus name has a new owner (it restarted): anything may
    /// have changed meanwhile, with no signal for it.
    NewOwner,
    /// ptraind's bus name has no owner (it stopped).
    NoOwner,
    /// The bus connection closed.
    Lost,
}

/// Subscribes to JobChanged and to changes of ptraind's bus name owner,
/// and reads both for as long as it lives, on a task of its own. zbus
/// queues at most 64 unread messages per subscription and then stops
/// reading the connection altogether, replies included: a stream left
/// unread while the caller awaits a method call's reply (one `Status` per
/// job in a burst of changes) hangs that call for ever. This task never
/// waits on the caller; the channel it fills is unbounded.
pub(crate) async fn follow(
    proxy: &Daemon1Proxy<'static>,
    jobs: bool,
) -> Result<UnboundedReceiver<Hint>, Failure> {
    // Without `jobs` (a follower of one job's output, which looks at
    // nothing else), no JobChanged: it would only pile up unread.
    let mut changes = match jobs {
        true => Some(proxy.receive_job_changed().await.map_err(from_bus)?),
        false => None,
    };
    let dbus = zbus::fdo::DBusProxy::new(proxy.inner().connection())
        .await
        .map_err(from_bus)?;
    let mut owners = dbus
        .receive_name_owner_changed_with_args(&[(0, ptrain::DBUS_NAME)])
        .await
        .map_err(from_bus)?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let hint = tokio::select! {
                signal = async { changes.as_mut()?.next().await }, if changes.is_some() => match signal {
                    Some(signal) => match signal.args() {
                        Ok(args) => Hint::Changed(args.id),
                        Err(_) => continue,
                    },
                    None => Hint::Lost,
                },
                signal = owners.next() => match signal {
                    Some(signal) => match signal.args() {
                        Ok(args) if args.new_owner().is_some() => Hint::NewOwner,
                        Ok(_) => Hint::NoOwner,
                        Err(_) => continue,
                    },
                    None => Hint::Lost,
                },
            };
            let lost = matches!(hint, Hint::Lost);
            if tx.send(hint).is_err() || lost {
                return;
            }
        }
    });
    Ok(rx)
}

/// Follows the jobs until all have ended; the exit code says the worst
/// that happened. Signals only say which jobs to look at again; each
/// job's state is what `Status` answers. Every job is looked at after
/// subscribing (so nothing falls in between), whenever a signal names it,
/// all of them after ptraind restarts, and all every [`RECHECK_EVERY`].
pub(crate) async fn wait_for_jobs(
    proxy: &Daemon1Proxy<'_>,
    mut hints: UnboundedReceiver<Hint>,
    ids: &[String],
) -> Result<u8, Failure> {
    use std::collections::{BTreeMap, BTreeSet};
    // None: not looked at yet.
    let mut status: BTreeMap<&str, Option<String>> =
        ids.iter().map(|id| (id.as_str(), None)).collect();
    let mut stale: BTreeSet<&str> = status.keys().copied().collect();
    let mut recheck = tokio::time::interval(RECHECK_EVERY);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    recheck.tick().await; // the first tick is now; the look below is it
    let mut daemon_gone = false;
    loop {
        for id in std::mem::take(&mut stale) {
            let known = status.get_mut(id).expect("only followed ids are stale");
            if known.as_deref().is_some_and(is_final) {
                continue;
            }
            let job: JobView = match proxy.status(id).await.map_err(from_bus) {
                Ok(json) => parse(&json)?,
                // ptraind is restarting: its new owner, or the next
                // recheck, makes us look again.
                Err(f) if f.code == EXIT_NO_DAEMON && known.is_some() => {
                    if !daemon_gone {
                        errln!("ptrain: ptraind is not running; waiting for it to come back");
                        daemon_gone = true;
                    }
                    continue;
                }
                Err(f) => return Err(f),
            };
            daemon_gone = false;
            match known {
                // Another user's job under [privacy] has no detail.
                None if job.detail.is_empty() => outln!("{id}: {}", escape(&job.status)),
                None => outln!("{id}: {}", escape(&job.detail)),
                // An end says how ("failed with exit code 3"), not only that.
                Some(old)
                    if *old != job.status && is_final(&job.status) && !job.detail.is_empty() =>
                {
                    outln!("{id}: {}", escape(&job.detail))
                }
                Some(old) if *old != job.status => outln!("{id}: {}", escape(&job.status)),
                Some(_) => {}
            }
            *known = Some(job.status);
        }
        let pending: BTreeSet<&str> = status
            .iter()
            .filter(|(_, s)| !s.as_deref().is_some_and(is_final))
            .map(|(id, _)| *id)
            .collect();
        if pending.is_empty() {
            break;
        }
        // Wait for something to look at, then take every hint already
        // queued too, so a burst costs one look per job.
        let mut next = Some(tokio::select! {
            hint = hints.recv() => hint.unwrap_or(Hint::Lost),
            _ = recheck.tick() => Hint::NewOwner,
        });
        while let Some(hint) = next.take().or_else(|| hints.try_recv().ok()) {
            match hint {
                Hint::Changed(id) => {
                    if let Some(id) = pending.get(id.as_str()) {
                        stale.insert(id);
                    }
                }
                Hint::NewOwner => stale.extend(&pending),
                Hint::NoOwner => {}
                Hint::Lost => {
                    return Err(fail(
                        EXIT_NO_DAEMON,
                        "lost the connection to the system bus; run `ptrain wait` again",
                    ))
                }
            }
        }
    }
    let worst = |word: &str| status.values().any(|s| s.as_deref() == Some(word));
    // A job that was not needed (an after_fail alert whose parents all
    // succeeded) is how a pipeline that went well ends: not a failure.
    let fine = |s: &Option<String>| matches!(s.as_deref(), Some("succeeded" | "not-needed"));
    Ok(if status.values().all(fine) {
        0
    } else if worst("failed") || worst("killed") || worst("launch-failed") {
        EXIT_JOB_FAILED
    } else if worst("timeout") || worst("idle-timeout") {
        EXIT_JOB_TIMEOUT
    } else if worst("stopped") {
        EXIT_JOB_STOPPED
    } else {
        EXIT_JOB_DEPENDENCY
    })
}

/// `ptrain wait ID…`: a sweep id stands for its members.
pub(crate) async fn wait(ids: Vec<String>) -> Result<u8, Failure> {
    let proxy = proxy().await?;
    // Subscribed before the first look, so no change falls in between.
    let hints = follow(&proxy, true).await?;
    // A sweep id stands for all of its members.
    let jobs: Vec<JobView> = parse(&proxy.list().await.map_err(from_bus)?)?;
    let mut expanded = Vec::new();
    for id in ids {
        let members: Vec<String> = jobs
            .iter()
            .filter(|j| j.group.as_deref() == Some(id.as_str()))
            .map(|j| j.id.clone())
            .collect();
        if members.is_empty() {
            expanded.push(id);
        } else {
            expanded.extend(members);
        }
    }
    wait_for_jobs(&proxy, hints, &expanded).await
}
