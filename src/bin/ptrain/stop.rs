//! `ptrain stop`, `hold`, `release`, `pause` and `resume`: verbs on jobs
//! by id, sweep or user.

use ptrain::api::Daemon1Proxy;
use ptrain::display::escape;
use ptrain::views::JobView;

use crate::list::uid_of_user;
use crate::wait::is_final;
use crate::{fail, from_bus, parse, proxy, Failure, EXIT_FAILURE, EXIT_NO_DAEMON, EXIT_USAGE};

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
            Verb::Hold | Verb::Release => matches!(job.status.as_str(), "queued" | "pulling"),
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

/// `ptrain update ID… [--priority N] [--begin T] [--timeout T]`: the
/// changes as one JSON object, checked by ptraind (a bare number is
/// seconds, as in a job file).
pub(crate) async fn update(
    ids: Vec<String>,
    priority: Option<i64>,
    begin: Option<String>,
    timeout: Option<String>,
) -> Result<u8, Failure> {
    let as_value = |text: String| match text.trim().parse::<u64>() {
        Ok(secs) => serde_json::Value::from(secs),
        Err(_) => serde_json::Value::from(text),
    };
    let mut changes = serde_json::Map::new();
    if let Some(priority) = priority {
        changes.insert("priority".into(), priority.into());
    }
    if let Some(begin) = begin {
        changes.insert("begin".into(), as_value(begin));
    }
    if let Some(timeout) = timeout {
        changes.insert("timeout".into(), as_value(timeout));
    }
    if changes.is_empty() {
        return Err(fail(
            EXIT_USAGE,
            "name what to change: --priority N, --begin T or --timeout T",
        ));
    }
    let changes = serde_json::Value::Object(changes).to_string();
    let proxy = proxy().await?;
    ask_each(&ids, "updated", |id| {
        let (proxy, changes) = (&proxy, &changes);
        async move { proxy.update(id, changes).await.map_err(from_bus) }
    })
    .await
}

/// `ptrain restart ID… [--as NEW]`.
pub(crate) async fn restart(ids: Vec<String>, as_id: Option<String>) -> Result<u8, Failure> {
    if as_id.is_some() && ids.len() > 1 {
        return Err(fail(
            EXIT_USAGE,
            "--as gives one job a new id; name one job with it",
        ));
    }
    let proxy = proxy().await?;
    let as_id = as_id.unwrap_or_default();
    ask_each(&ids, "restarted", |id| {
        let (proxy, as_id) = (&proxy, &as_id);
        async move { proxy.restart(id, as_id).await.map_err(from_bus) }
    })
    .await
}

/// Asks `ask` of each of `ids` in turn, each answer on a line of its own;
/// one that fails does not keep the others from being asked (but for a
/// single id, whose failure is the command's).
async fn ask_each<'a, F, Fut>(ids: &'a [String], done: &str, ask: F) -> Result<u8, Failure>
where
    F: Fn(&'a str) -> Fut,
    Fut: std::future::Future<Output = Result<String, Failure>>,
{
    if let [id] = ids {
        outln!("{}", escape(&ask(id).await?));
        return Ok(0);
    }
    let mut not_done = Vec::new();
    for id in ids {
        match ask(id).await {
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
            "{} of {} not {done}: {} (why: above)",
            not_done.len(),
            ids.len(),
            not_done.join(", ")
        ),
    ))
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
    let proxy = &proxy;
    ask_each(&ids, verb.done(), |id| verb.ask(proxy, id)).await
}
