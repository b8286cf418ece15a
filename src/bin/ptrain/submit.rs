//! `ptrain submit`: the job file checked, its `--export`ed environment added,
//! published into the spool, and ptraind's decision about it awaited.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ptrain::api::Daemon1Proxy;
use ptrain::config::Config;
use ptrain::display::escape;
use ptrain::spec::{parse_spec, spool_file_stem, MAX_SPEC_BYTES};
use ptrain::store::RejectRecord;
use ptrain::views::JobView;

use crate::wait::{follow, wait_for_jobs};
use crate::{fail, from_bus, parse, proxy, Failure, EXIT_FAILURE, EXIT_NO_DAEMON, EXIT_USAGE};

/// Where job files go when neither the config nor ptraind tells.
const DEFAULT_SPOOL_DIR: &str = "/var/spool/ptrain";

/// The spool directory: from the config (normally world-readable); when
/// this user cannot read it, from ptraind (its SpoolDir property); only
/// when ptraind does not answer either, the default, with a note naming
/// both, as the file may then wait where no ptraind looks.
pub(crate) async fn spool_dir(config: &Path, proxy: Option<&Daemon1Proxy<'_>>) -> PathBuf {
    let unreadable = match Config::load(config) {
        Ok(c) => return c.spool_dir,
        Err(e) => e,
    };
    let asked = match proxy {
        Some(proxy) => proxy.spool_dir().await.map_err(|e| from_bus(e).message),
        None => Err("cannot reach it on the system bus".to_string()),
    };
    match asked {
        Ok(dir) if Path::new(&dir).is_absolute() => PathBuf::from(dir),
        Ok(dir) => {
            errln!("ptrain: ptraind named the spool {dir:?}, not an absolute path; using the default {DEFAULT_SPOOL_DIR}");
            PathBuf::from(DEFAULT_SPOOL_DIR)
        }
        Err(why) => {
            errln!(
                "ptrain: cannot read the config ({}) and cannot ask ptraind ({}); \
                 dropping the job into the default spool {DEFAULT_SPOOL_DIR}",
                escape(&unreadable.to_string()),
                escape(&why)
            );
            PathBuf::from(DEFAULT_SPOOL_DIR)
        }
    }
}

/// What `--export` takes from the environment: (name, value) pairs, and
/// the names it left out.
type Picked = (Vec<(String, String)>, Vec<String>);

/// `ptrain submit --export`: which of the submitter's variables go into
/// the job's `env`.
#[derive(Debug, PartialEq)]
pub(crate) enum Export {
    /// Every variable the descriptor lets a job set; the others (`USER`,
    /// `LD_PRELOAD`, …, names `env` does not accept) are left out, with a
    /// note.
    All,
    /// Exactly these; one the job may not set is refused.
    Names(Vec<String>),
}

/// What `--export ALL` leaves out besides what a job may not set: what
/// systemd or a login gives one process (its invocation, journal stream,
/// notify socket, sockets, agent and display), which would be wrong in
/// the job's own process.
const PER_PROCESS_ENV: &[&str] = &[
    "INVOCATION_ID",
    "JOURNAL_STREAM",
    "NOTIFY_SOCKET",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "WATCHDOG_PID",
    "WATCHDOG_USEC",
    "SYSTEMD_EXEC_PID",
    "MANAGERPID",
    "SSH_AUTH_SOCK",
    "SSH_AGENT_PID",
    "SSH_CONNECTION",
    "SSH_CLIENT",
    "SSH_TTY",
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "XDG_RUNTIME_DIR",
    "XDG_SESSION_ID",
    "DBUS_SESSION_BUS_ADDRESS",
    "TERM",
    "OLDPWD",
    "PWD",
    "SHLVL",
    "_",
];

impl Export {
    /// NAMES|ALL|NONE; None for NONE.
    pub(crate) fn parse(text: &str) -> Result<Option<Export>, Failure> {
        match text {
            "ALL" => return Ok(Some(Export::All)),
            "NONE" => return Ok(None),
            _ => {}
        }
        let names: Vec<String> = text.split(',').map(str::to_owned).collect();
        if let Some(bad) = names.iter().find(|n| !ptrain::spec::is_env_name(n)) {
            return Err(fail(
                EXIT_USAGE,
                format!(
                    "--export {text:?}: {bad:?} is not a variable name; give NAME[,NAME…] \
                     (letters, digits, _), ALL or NONE"
                ),
            ));
        }
        if let Some((name, why)) = names
            .iter()
            .find_map(|n| ptrain::spec::reserved_env(n).map(|why| (n, why)))
        {
            return Err(fail(
                EXIT_USAGE,
                format!("--export: a job may not set {name}: {why}; leave it out of --export"),
            ));
        }
        Ok(Some(Export::Names(names)))
    }

    /// The variables to copy, from `environment`: (name, value) pairs, and
    /// the names left out (ALL only). A named variable that is not set, or
    /// not UTF-8, is an error naming it.
    fn pick(
        &self,
        environment: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    ) -> Result<Picked, Failure> {
        let mut environment: std::collections::BTreeMap<_, _> = environment.collect();
        match self {
            Export::Names(names) => {
                let mut picked = Vec::new();
                for name in names {
                    let value = environment.remove(std::ffi::OsStr::new(name)).ok_or_else(|| {
                        fail(
                            EXIT_USAGE,
                            format!("--export: {name} is not set in your environment; set it or leave it out"),
                        )
                    })?;
                    let value = value.into_string().map_err(|_| {
                        fail(
                            EXIT_USAGE,
                            format!("--export: the value of {name} is not UTF-8, which a job file cannot hold; leave it out"),
                        )
                    })?;
                    picked.push((name.clone(), value));
                }
                Ok((picked, Vec::new()))
            }
            Export::All => {
                let (mut picked, mut left_out) = (Vec::new(), Vec::new());
                for (name, value) in environment {
                    match (name.into_string(), value.into_string()) {
                        // Silently: they were never the job's to have.
                        (Ok(name), _) if PER_PROCESS_ENV.contains(&name.as_str()) => {}
                        (Ok(name), Ok(value))
                            if ptrain::spec::is_env_name(&name)
                                && ptrain::spec::reserved_env(&name).is_none() =>
                        {
                            picked.push((name, value))
                        }
                        (name, _) => {
                            left_out.push(name.unwrap_or_else(|n| n.to_string_lossy().into_owned()))
                        }
                    }
                }
                Ok((picked, left_out))
            }
        }
    }
}

/// The job file with `exported` added to its `env`; a variable the file
/// sets itself keeps the file's value (as sbatch: what the job says wins).
fn with_exported_env(bytes: &[u8], exported: Vec<(String, String)>) -> Result<Vec<u8>, Failure> {
    // Already checked by parse_spec: one JSON object, no duplicate keys.
    let mut job: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(bytes)
        .map_err(|e| {
            fail(
                EXIT_USAGE,
                format!("cannot add --export to the job file: {e}"),
            )
        })?;
    let env = job
        .entry("env")
        .or_insert_with(|| serde_json::Value::Object(Default::default()));
    if env.is_null() {
        *env = serde_json::Value::Object(Default::default());
    }
    let Some(env) = env.as_object_mut() else {
        return Err(fail(
            EXIT_USAGE,
            "field `env` must be an object to add --export to it",
        ));
    };
    for (name, value) in exported {
        env.entry(name).or_insert(serde_json::Value::String(value));
    }
    Ok(serde_json::to_vec(&job).expect("a JSON object serialises"))
}

pub(crate) async fn submit(
    config: &Path,
    file: &Path,
    id: Option<String>,
    no_confirm: bool,
    wait: bool,
    export: Option<Export>,
) -> Result<u8, Failure> {
    let (bytes, default_id) = if file == Path::new("-") {
        let mut buf = Vec::new();
        std::io::stdin()
            .take(MAX_SPEC_BYTES as u64 + 1)
            .read_to_end(&mut buf)
            .map_err(|e| fail(EXIT_FAILURE, format!("cannot read stdin: {e}")))?;
        let id = id.ok_or_else(|| {
            fail(
                EXIT_USAGE,
                "reading a job from stdin needs --id ID (or an \"id\" field)",
            )
        })?;
        (buf, id)
    } else {
        let bytes = std::fs::read(file)
            .map_err(|e| fail(EXIT_USAGE, format!("cannot read {}: {e}", file.display())))?;
        let stem = file
            .file_stem()
            .and_then(|s| s.to_str())
            .map(str::to_owned)
            .unwrap_or_default();
        (bytes, id.unwrap_or(stem))
    };
    // The same checks ptraind makes, so mistakes show up here, not later.
    let mut spec = parse_spec(&bytes, &default_id)
        .map_err(|e| fail(EXIT_USAGE, format!("{}: {e}", file.display())))?;
    let bytes = match export {
        None => bytes,
        Some(export) => {
            let (exported, left_out) = export.pick(std::env::vars_os())?;
            if !left_out.is_empty() {
                errln!(
                    "ptrain: --export ALL leaves out what a job may not set (ptraind's own, \
                     or not a variable name the job file can hold): {}",
                    escape(&left_out.join(", "))
                );
            }
            let bytes = with_exported_env(&bytes, exported)?;
            spec = parse_spec(&bytes, &default_id)
                .map_err(|e| fail(EXIT_USAGE, format!("{} with --export: {e}", file.display())))?;
            bytes
        }
    };
    let name = format!("{}.json", spec.id);
    debug_assert!(spool_file_stem(&name).is_some());
    let connected = proxy().await;
    let spool = spool_dir(config, connected.as_ref().ok()).await;

    // Subscribed before dropping, so no change of the job is missed.
    let listener = match connected {
        Ok(p) if !no_confirm => {
            let hints = if wait {
                Some(follow(&p, true).await?)
            } else {
                None
            };
            Some((p, hints))
        }
        _ => None,
    };
    let published = drop_into_spool(&spool, &name, &bytes)?;
    outln!("submitted {} as {}", spec.id, spool.join(&name).display());
    let Some((proxy, hints)) = listener else {
        return Ok(0);
    };
    // The jobs this file becomes: one, or every member of a sweep.
    let ids: Vec<String> = match &spec.sweep {
        Some(sweep) => ptrain::chain::expand(&spec, sweep)
            .into_iter()
            .map(|m| m.spec.id.to_string())
            .collect(),
        None => vec![spec.id.to_string()],
    };
    // ptraind decides within milliseconds unless it is down or its state
    // disk stalls; --wait, asked to block, allows longer.
    let within = Duration::from_secs(if wait { 60 } else { 10 });
    let decision =
        tokio::time::timeout(within, decision(&proxy, &spool, &name, &published, &ids[0])).await;
    match decision {
        Ok(Ok(Decision::Accepted(status))) => {
            if ids.len() > 1 {
                outln!("ptraind accepted sweep {} as {} jobs", spec.id, ids.len());
            } else {
                outln!(
                    "ptraind accepted job {} ({}); `ptrain status {}` shows it",
                    spec.id,
                    escape(&status),
                    spec.id
                );
            }
            match hints {
                Some(hints) => wait_for_jobs(&proxy, hints, &ids).await,
                None => Ok(0),
            }
        }
        Ok(Ok(Decision::Refused(r))) => Err(fail(
            EXIT_USAGE,
            format!(
                "ptraind refused {name}: {}; `ptrain rejected` lists your refused files",
                r.reason
            ),
        )),
        Ok(Err(f)) if f.code == EXIT_NO_DAEMON => Err(fail(
            EXIT_NO_DAEMON,
            format!(
                "ptraind is not running, so nothing has checked {name} yet: it waits in the spool \
                 and ptraind claims it when it starts (systemctl start ptraind); `ptrain status {}` \
                 tells then",
                spec.id
            ),
        )),
        Ok(Err(f)) => Err(f),
        Err(_) if wait => Err(fail(
            EXIT_NO_DAEMON,
            format!(
                "ptraind has not taken {name} within {} s (is it running? systemctl status ptraind); `ptrain wait {}` follows the job once it has",
                within.as_secs(),
                spec.id
            ),
        )),
        Err(_) => {
            outln!(
                "ptraind has not decided about {name} yet; `ptrain status {}` or `ptrain rejected` will tell",
                spec.id
            );
            Ok(0)
        }
    }
}

/// The file `ptrain submit` published, as ptraind will see it.
struct Published {
    dev: u64,
    ino: u64,
    size: u64,
    /// A time (µs since the epoch) after the file came to exist.
    created_by: u64,
}

impl Published {
    /// Is this ptraind's record of our file, rather than of a namesake's
    /// (another user's job with this id, or our own earlier one)? The
    /// file's (dev, ino) alone could be an earlier file's: a namesake's
    /// spool file was removed before ours was created, and a file system
    /// may give a freed inode number to the next file. A record of our
    /// file was made after it was created, one of an earlier file before
    /// (ptraind decides before it removes a spool file).
    fn is(&self, dev: Option<u64>, ino: Option<u64>, decided_at: u64) -> bool {
        // A ptraind that records no identity: the time alone tells.
        let same_file = match (dev, ino) {
            (Some(dev), Some(ino)) => (dev, ino) == (self.dev, self.ino),
            _ => true,
        };
        same_file && decided_at >= self.created_by
    }
}

enum Decision {
    /// The job (a sweep's first member) made of our file, and its status.
    Accepted(String),
    Refused(RejectRecord),
}

/// What ptraind decided about the file we published as `name`: a job whose
/// source is that file, or a refusal of it. Never a namesake's job or
/// refusal: both are matched on the file's identity ([`Published::is`]).
/// Looks once the file has left the spool (ptraind records its decision
/// before it removes the file), polling a stat of it, which is cheap.
async fn decision(
    proxy: &Daemon1Proxy<'_>,
    spool: &Path,
    name: &str,
    published: &Published,
    first: &str,
) -> Result<Decision, Failure> {
    use std::os::unix::fs::MetadataExt;
    let path = spool.join(name);
    let mut pause = Duration::from_millis(5);
    loop {
        let waiting = std::fs::symlink_metadata(&path)
            .is_ok_and(|m| (m.dev(), m.ino()) == (published.dev, published.ino));
        if waiting {
            // Nobody claims it while ptraind is down: say so now, not
            // after the timeout.
            if let Err(e) = proxy.status(first).await {
                let failure = from_bus(e);
                if failure.code == EXIT_NO_DAEMON {
                    return Err(failure);
                }
            }
        } else {
            if let Ok(json) = proxy.status(first).await {
                let job: JobView = parse(&json)?;
                let source = job.source.as_ref();
                if published.is(
                    source.map(|s| s.dev),
                    source.map(|s| s.ino),
                    job.submitted_at,
                ) && source.is_none_or(|s| s.size == published.size)
                {
                    return Ok(Decision::Accepted(job.status));
                }
            }
            let rejected: Vec<RejectRecord> = parse(&proxy.rejected().await.map_err(from_bus)?)?;
            if let Some(r) = rejected
                .into_iter()
                .rev()
                .find(|r| r.file == name && published.is(r.dev, r.ino, r.rejected_at))
            {
                return Ok(Decision::Refused(r));
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// Writes the job under a dot-name the daemon ignores, then renames it to
/// its final name, so ptraind never sees a half-written file. Refuses to
/// replace a pending file of the same name.
fn drop_into_spool(spool: &Path, name: &str, bytes: &[u8]) -> Result<Published, Failure> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let tmp = spool.join(format!(".{name}.{}.tmp", std::process::id()));
    let io = |what: &str, e: std::io::Error| {
        fail(
            EXIT_FAILURE,
            format!("cannot {what} in {}: {e}", spool.display()),
        )
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(|e| io("create a file", e))?;
    let created_by = ptrain::now_micros();
    let written = f
        .write_all(bytes)
        .and_then(|()| f.sync_all())
        .and_then(|()| f.metadata());
    let meta = match written {
        Ok(meta) => meta,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(io("write the job file", e));
        }
    };
    drop(f);
    if let Err(e) = ptrain::fsutil::rename_noreplace(&tmp, &spool.join(name)) {
        let _ = std::fs::remove_file(&tmp);
        if e.raw_os_error() == Some(libc::EEXIST) {
            return Err(fail(
                EXIT_FAILURE,
                format!("{name} is already waiting in the spool; give the job another id"),
            ));
        }
        return Err(io("publish the job file", e));
    }
    Ok(Published {
        dev: meta.dev(),
        ino: meta.ino(),
        size: meta.size(),
        created_by,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namesake_on_a_reused_inode_is_not_our_file() {
        let ours = Published {
            dev: 1,
            ino: 7,
            size: 10,
            created_by: 1_000,
        };
        assert!(ours.is(Some(1), Some(7), 1_000));
        assert!(
            !ours.is(Some(1), Some(7), 999),
            "decided before our file existed: an earlier file on the same inode"
        );
        assert!(!ours.is(Some(1), Some(8), 2_000), "another file");
        assert!(!ours.is(Some(2), Some(7), 2_000), "another file system");
        assert!(
            ours.is(None, None, 2_000),
            "a ptraind that records no identity"
        );
    }

    fn environment(vars: &[(&str, &str)]) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
        vars.iter().map(|(k, v)| (k.into(), v.into())).collect()
    }

    #[test]
    fn export_names_all_or_none() {
        assert_eq!(Export::parse("NONE").unwrap(), None);
        assert_eq!(Export::parse("ALL").unwrap(), Some(Export::All));
        assert_eq!(
            Export::parse("PATH,VIRTUAL_ENV").unwrap(),
            Some(Export::Names(vec!["PATH".into(), "VIRTUAL_ENV".into()]))
        );
        let bad = Export::parse("PATH,,X").unwrap_err();
        assert_eq!(bad.code, EXIT_USAGE);
        assert!(
            bad.message.contains("\"\" is not a variable name"),
            "{}",
            bad.message
        );
        let reserved = Export::parse("PATH,LD_PRELOAD").unwrap_err();
        assert_eq!(reserved.code, EXIT_USAGE);
        assert!(
            reserved.message.contains("a job may not set LD_PRELOAD"),
            "{}",
            reserved.message
        );

        let env = environment(&[
            ("PATH", "/venv/bin:/usr/bin"),
            ("USER", "alice"),
            ("PTRAIN_CONFIG", "/etc/x"),
            ("BASH_FUNC_f%%", "() { :; }"),
            ("HOME", "/home/alice"),
            ("INVOCATION_ID", "0123"),
            ("NOTIFY_SOCKET", "/run/systemd/notify"),
        ]);
        let (picked, left_out) = Export::All.pick(env.clone().into_iter()).unwrap();
        assert_eq!(
            picked,
            [
                ("HOME".to_string(), "/home/alice".to_string()),
                ("PATH".to_string(), "/venv/bin:/usr/bin".to_string())
            ]
        );
        assert_eq!(left_out, ["BASH_FUNC_f%%", "PTRAIN_CONFIG", "USER"]);
        let (picked, _) = Export::Names(vec!["PATH".into()])
            .pick(env.clone().into_iter())
            .unwrap();
        assert_eq!(
            picked,
            [("PATH".to_string(), "/venv/bin:/usr/bin".to_string())]
        );
        let unset = Export::Names(vec!["NOPE".into()])
            .pick(env.into_iter())
            .unwrap_err();
        assert!(
            unset.message.contains("NOPE is not set"),
            "{}",
            unset.message
        );
    }

    #[test]
    fn the_job_files_own_env_wins_over_exported() {
        let exported = vec![
            ("PATH".to_string(), "/venv/bin".to_string()),
            ("MODE".to_string(), "shell".to_string()),
        ];
        let bytes = with_exported_env(
            br#"{"version": 1, "command": ["x"], "env": {"MODE": "file"}}"#,
            exported.clone(),
        )
        .unwrap();
        let spec = parse_spec(&bytes, "j").unwrap();
        assert_eq!(spec.env["MODE"], "file");
        assert_eq!(spec.env["PATH"], "/venv/bin");
        // No `env`, or a null one: made.
        for file in [
            &br#"{"version": 1, "command": ["x"]}"#[..],
            br#"{"version": 1, "command": ["x"], "env": null}"#,
        ] {
            let spec =
                parse_spec(&with_exported_env(file, exported.clone()).unwrap(), "j").unwrap();
            assert_eq!(spec.env["MODE"], "shell");
        }
    }
}
