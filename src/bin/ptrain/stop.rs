//! `ptrain stop`, `hold`, `release`, `pause` and `resume`: verbs on jobs
//! by id, sweep or user.

use ptrain::api::Daemon1Proxy;
use ptrain::display::escape;
use ptrain::views::JobView;

use crate::list::uid_of_user;
use crate::wait::is_final;
use crate::{fail, from_bus, parse, proxy, Failure, EXIT_FAILURE, EXIT_NO_DAEMON};

/// What is asked of each job.
#[derive(Clone, Copy)]
pub(crate) enum Verb {
    Stop,
    Hold,
    Release,
    Pause,
    Resume,
}

impl Verb {
    fn word(self) -> &'static str {
        match self {
            Verb::Stop => "stop",
            Verb::Hold => "hold",
            Verb::Release => "release",
            Verb::Pause => "pause",
            Verb::Resume => "resume",
        }
    }

    fn done(self) -> &'static str {
        match self {
            Verb::Stop => "stopped",
            Verb::Hold => "held",
            Verb::Release => "released",
            Verb::Pause => "paused",
            Verb::Resume => "resumed",
        }
    }

    /// The jobs `--user` picks, in words.
    fn scope(self) -> &'static str {
        match self {
            Verb::Stop => "queued or running",
            Verb::Hold | Verb::Release => "queued",
            Verb::Pause => "running",
            Verb::Resume => "paused",
        }
    }

    /// What `--user` picks: every job of the user the verb applies to.
    fn applies_to(self, job: &JobView) -> bool {
        match self {
            Verb::Stop => !is_final(&job.status),
            Verb::Hold | Verb::Release => job.status == "queued",
            Verb::Pause => job.status == "running" && !job.paused,
            Verb::Resume => job.status == "running" && job.paused,
        }
    }

    async fn ask(self, proxy: &Daemon1Proxy<'_>, id: &str) -> Result<String, Failure> {
        match self {
            Verb::Stop => proxy.stop(id).await,
            Verb::Hold => proxy.hold(id).await,
            Verb::Release => proxy.release(id).await,
            Verb::Pause => proxy.pause(id).await,
            Verb::Resume => proxy.resume(id).await,
        }
        .map_err(from_bus)
    }
}

/// `ptrain stop|hold|release|pause|resume ID… [--user USER]`: each job asked for on
/// its own, each answer on a line of its own; one that fails does not
/// keep the others from being asked.
pub(crate) async fn steer(
    verb: Verb,
    mut ids: Vec<String>,
    user: Option<String>,
) -> Result<u8, Failure> {
    let proxy = proxy().await?;
    if let Some(user) = &user {
        let uid = uid_of_user(user)?;
        // SAFETY: geteuid has no preconditions.
        let caller = unsafe { libc::geteuid() };
        if caller != 0 && caller != uid {
            return Err(fail(
                EXIT_FAILURE,
                format!(
                    "only root or {user} may {} every job of {user}; name your own jobs, \
                     or run it with sudo",
                    verb.word()
                ),
            ));
        }
        let active: Vec<JobView> = parse(&proxy.list_recent(0).await.map_err(from_bus)?)?;
        let theirs: Vec<String> = active
            .into_iter()
            .filter(|j| j.uid == uid && verb.applies_to(j))
            .map(|j| j.id)
            .collect();
        if theirs.is_empty() && ids.is_empty() {
            outln!("{} has no {} jobs", escape(user), verb.scope());
            return Ok(0);
        }
        ids.extend(theirs);
    }
    let mut seen = std::collections::BTreeSet::new();
    ids.retain(|id| seen.insert(id.clone()));
    if let [id] = ids.as_slice() {
        outln!("{}", escape(&verb.ask(&proxy, id).await?));
        return Ok(0);
    }
    let mut not_done = Vec::new();
    for id in &ids {
        match verb.ask(&proxy, id).await {
            Ok(said) => outln!("{}", escape(&said)),
            // Nobody to ask about the rest either.
            Err(f) if f.code == EXIT_NO_DAEMON => return Err(f),
            Err(f) => {
                errln!("ptrain: {}", escape(&f.message));
                not_done.push(id.as_str());
            }
        }
    }
    if not_done.is_empty() {
        return Ok(0);
    }
    Err(fail(
        EXIT_FAILURE,
        format!(
            "{} of {} not {}: {} (why: above)",
            not_done.len(),
            ids.len(),
            verb.done(),
            not_done.join(", ")
        ),
    ))
}
