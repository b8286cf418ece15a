//! `ptrain stop`: jobs by id, sweep or user.

use ptrain::display::escape;
use ptrain::views::JobView;

use crate::list::uid_of_user;
use crate::wait::is_final;
use crate::{fail, from_bus, parse, proxy, Failure, EXIT_FAILURE, EXIT_NO_DAEMON};

/// `ptrain stop ID… [--user USER]`: each job asked for on its own, each
/// answer on a line of its own; one that fails does not keep the others
/// from being stopped.
pub(crate) async fn stop(mut ids: Vec<String>, user: Option<String>) -> Result<u8, Failure> {
    let proxy = proxy().await?;
    if let Some(user) = &user {
        let uid = uid_of_user(user)?;
        // SAFETY: geteuid has no preconditions.
        let caller = unsafe { libc::geteuid() };
        if caller != 0 && caller != uid {
            return Err(fail(
                EXIT_FAILURE,
                format!(
                    "only root or {user} may stop every job of {user}; name your own jobs, \
                     or run it with sudo"
                ),
            ));
        }
        let active: Vec<JobView> = parse(&proxy.list_recent(0).await.map_err(from_bus)?)?;
        let theirs: Vec<String> = active
            .into_iter()
            .filter(|j| j.uid == uid && !is_final(&j.status))
            .map(|j| j.id)
            .collect();
        if theirs.is_empty() && ids.is_empty() {
            outln!("{} has no queued or running jobs", escape(user));
            return Ok(0);
        }
        ids.extend(theirs);
    }
    let mut seen = std::collections::BTreeSet::new();
    ids.retain(|id| seen.insert(id.clone()));
    if let [id] = ids.as_slice() {
        outln!("{}", escape(&proxy.stop(id).await.map_err(from_bus)?));
        return Ok(0);
    }
    let mut not_stopped = Vec::new();
    for id in &ids {
        match proxy.stop(id).await.map_err(from_bus) {
            Ok(said) => outln!("{}", escape(&said)),
            // Nobody to ask about the rest either.
            Err(f) if f.code == EXIT_NO_DAEMON => return Err(f),
            Err(f) => {
                errln!("ptrain: {}", escape(&f.message));
                not_stopped.push(id.as_str());
            }
        }
    }
    if not_stopped.is_empty() {
        return Ok(0);
    }
    Err(fail(
        EXIT_FAILURE,
        format!(
            "{} of {} not stopped: {} (why: above)",
            not_stopped.len(),
            ids.len(),
            not_stopped.join(", ")
        ),
    ))
}
