//! `ptrain logs`: a job's output from ptraind's pipe, followed across a
//! restart of ptraind.

use std::io::{IsTerminal, Read, Write};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;

use ptrain::api::Daemon1Proxy;
use ptrain::views::JobView;

use crate::wait::{follow, is_final, Hint};
use crate::{fail, from_bus, parse, proxy, Failure, EXIT_FAILURE, EXIT_NO_DAEMON, EXIT_USAGE};

/// `ptrain logs`: ptraind hands over a pipe it fills from the journal (or
/// the job's archive) as root; users cannot read the system journal.
/// Following survives a restart of ptraind: the output is asked for again
/// once ptraind is back, and resumed where it stopped
/// ([`ptrain::logs::resume`]).
pub(crate) async fn logs(
    id: &str,
    follow: bool,
    lines: Option<u32>,
    since: Option<&str>,
    attempt: Option<u32>,
) -> Result<u8, Failure> {
    let since_usec = since
        .map(|s| ptrain::logs::parse_since(s, ptrain::now_micros()))
        .transpose()
        .map_err(|e| fail(EXIT_USAGE, e))?
        .unwrap_or(0);
    let proxy = proxy().await?;
    // Subscribed, and ptraind's owner noted, before the output is opened:
    // a restart after this is never missed.
    let mut restarts = match follow {
        true => Some(Restarts::watch(&proxy).await?),
        false => None,
    };
    // A job `[retention]` compacted has no status, but its archive may
    // still be served: then ptraind's answer to the status is kept for
    // when there is no output either.
    let job: Result<JobView, Failure> = match proxy.status(id).await.map_err(from_bus) {
        Ok(text) => Ok(parse(&text)?),
        Err(failure) if failure.code == EXIT_FAILURE => Err(failure),
        Err(failure) => return Err(failure),
    };
    if let Ok(job) = &job {
        if !follow && job.started_at.is_none() && !is_final(&job.status) {
            errln!("ptrain: job {id} has not started yet; `ptrain logs -f {id}` waits for it");
        }
    }
    let mut asked_at = ptrain::now_micros();
    let opened = match attempt {
        Some(n) => {
            proxy
                .open_attempt_logs(id, n, lines.unwrap_or(0), since_usec)
                .await
        }
        None => {
            proxy
                .open_logs(id, lines.unwrap_or(0), since_usec, follow)
                .await
        }
    };
    let fd = match opened {
        Ok(fd) => fd,
        Err(e) => return Err(job.err().unwrap_or_else(|| from_bus(e))),
    };
    let mut output = std::fs::File::from(std::os::fd::OwnedFd::from(fd));
    // Someone else's output on a terminal: escape sequences in it could
    // rewrite the screen, so control characters are shown escaped.
    // SAFETY: geteuid has no preconditions.
    let foreign = job
        .as_ref()
        .map_or(true, |job| job.uid != unsafe { libc::geteuid() });
    let escape = foreign && std::io::stdout().is_terminal();
    let Some(restarts) = restarts.as_mut() else {
        return match copy_output(&mut output, escape) {
            Ok(()) => Ok(0),
            // `ptrain logs ID | head`: the reader is done.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
            Err(e) => Err(fail(EXIT_FAILURE, format!("cannot copy the output: {e}"))),
        };
    };
    let mut printed = ptrain::logs::resume::Printed::default();
    let mut overlap = None;
    loop {
        match copy_following(&mut output, escape, &mut printed, &mut overlap) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(0),
            Err(e) => return Err(fail(EXIT_FAILURE, format!("cannot copy the output: {e}"))),
        }
        // The pipe closes when the job ended; earlier means ptraind went
        // away. A job already out of the records (compacted) ended long
        // ago; any other failure to answer (no reply from a ptraind that
        // is stopping) says nothing about the job.
        let ended = match proxy.status(id).await {
            Ok(json) => serde_json::from_str::<JobView>(&json).is_ok_and(|j| is_final(&j.status)),
            Err(_) => job.is_err(),
        };
        if ended {
            if let Some(rest) = overlap.take().map(ptrain::logs::resume::Overlap::finish) {
                match show(&mut std::io::stdout().lock(), &rest, escape) {
                    Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                        return Err(fail(EXIT_FAILURE, format!("cannot copy the output: {e}")))
                    }
                    _ => {}
                }
            }
            return Ok(0);
        }
        errln!("ptrain: ptraind restarted; following the output again");
        output = loop {
            restarts.wait(id).await?;
            let tail_asked_at = (lines.unwrap_or(0) > 0).then_some(asked_at);
            let (lines, since) = match printed.resume_from(since_usec, tail_asked_at) {
                Some(since) => (0, since),
                // Nothing printed yet: as if first asked now.
                None => {
                    asked_at = ptrain::now_micros();
                    (lines.unwrap_or(0), since_usec)
                }
            };
            let failure = match proxy.open_logs(id, lines, since, true).await {
                Ok(fd) => break std::fs::File::from(std::os::fd::OwnedFd::from(fd)),
                Err(e) => from_bus(e),
            };
            // Gone again before it answered (no owner, or no reply): wait
            // for the next one.
            if failure.code != EXIT_NO_DAEMON && !restarts.gone().await? {
                return Err(failure);
            }
        };
        overlap = (!printed.is_empty()).then(|| printed.overlap());
    }
}

/// How long a ptraind that closed a followed job's pipe may keep its bus
/// name (it is stopping) before the close is taken as an error of its own.
const RESTART_GRACE: Duration = Duration::from_secs(120);

/// Who owns ptraind's bus name, and the signal when that changes: a
/// follower reopens the output only once a new ptraind is there.
struct Restarts {
    dbus: zbus::fdo::DBusProxy<'static>,
    hints: UnboundedReceiver<Hint>,
    /// The owner that served the output last.
    owner: Option<String>,
}

impl Restarts {
    async fn watch(proxy: &Daemon1Proxy<'static>) -> Result<Restarts, Failure> {
        let hints = follow(proxy, false).await?;
        let dbus = zbus::fdo::DBusProxy::new(proxy.inner().connection())
            .await
            .map_err(from_bus)?;
        let mut this = Restarts {
            dbus,
            hints,
            owner: None,
        };
        this.owner = this.owner().await?;
        Ok(this)
    }

    async fn owner(&self) -> Result<Option<String>, Failure> {
        let name = zbus::names::BusName::try_from(ptrain::DBUS_NAME).expect("a valid bus name");
        match self.dbus.get_name_owner(name).await {
            Ok(owner) => Ok(Some(owner.to_string())),
            Err(zbus::fdo::Error::NameHasNoOwner(_)) => Ok(None),
            Err(e) => Err(from_bus(e.into())),
        }
    }

    /// Whether the owner that served the output last no longer does.
    async fn gone(&self) -> Result<bool, Failure> {
        Ok(self.owner().await? != self.owner)
    }

    /// Returns once ptraind's bus name has an owner other than the one
    /// that served the output last. No deadline while it has none (as
    /// `ptrain wait`); ends when the bus connection is lost, and when the
    /// old owner holds on to it past [`RESTART_GRACE`] (it closed the pipe
    /// without stopping: its journal says why).
    async fn wait(&mut self, id: &str) -> Result<(), Failure> {
        let deadline = tokio::time::Instant::now() + RESTART_GRACE;
        loop {
            let now = self.owner().await?;
            if now.is_some() && now != self.owner {
                self.owner = now;
                return Ok(());
            }
            let hint = if now.is_some() {
                match tokio::time::timeout_at(deadline, self.hints.recv()).await {
                    Ok(hint) => hint,
                    Err(_) => {
                        return Err(fail(
                            EXIT_FAILURE,
                            format!("ptraind closed the output of job {id} before it ended, without restarting (see `journalctl -u ptraind`); run `ptrain logs -f {id}` again"),
                        ))
                    }
                }
            } else {
                self.hints.recv().await
            };
            if matches!(hint, None | Some(Hint::Lost)) {
                return Err(fail(
                    EXIT_NO_DAEMON,
                    format!(
                        "lost the connection to the system bus; run `ptrain logs -f {id}` again"
                    ),
                ));
            }
        }
    }
}

/// Copies the pipe to stdout as it arrives; with `escape`, control
/// characters other than tab and newline are written as `\xNN`.
fn copy_output(input: &mut impl Read, escape: bool) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    each_chunk(input, |chunk| show(&mut stdout, chunk, escape))
}

/// [`copy_output`] for a follower: what is printed is noted in `printed`,
/// and while `overlap` is set (a reopened output), what was printed
/// before is skipped.
fn copy_following(
    input: &mut impl Read,
    escape: bool,
    printed: &mut ptrain::logs::resume::Printed,
    overlap: &mut Option<ptrain::logs::resume::Overlap>,
) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    each_chunk(input, |chunk| {
        // Taken before printing: journald stamped these lines earlier.
        let received = ptrain::now_micros();
        let new: std::borrow::Cow<'_, [u8]> = match overlap {
            None => chunk.into(),
            Some(o) => match o.push(chunk) {
                Some(rest) => {
                    *overlap = None;
                    rest.into()
                }
                None => return Ok(()),
            },
        };
        show(&mut stdout, &new, escape)?;
        printed.record(&new, received);
        Ok(())
    })
}

/// Reads `input` to its end, handing each chunk as it arrives to `each`.
fn each_chunk(
    input: &mut impl Read,
    mut each: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        each(&buf[..n])?;
    }
}

/// Writes output bytes to stdout, escaped if asked, and flushes:
/// followers want each line as it comes, not when a buffer fills.
fn show(stdout: &mut impl Write, bytes: &[u8], escape: bool) -> std::io::Result<()> {
    if escape {
        let mut shown = Vec::with_capacity(bytes.len());
        for &b in bytes {
            if (b < 0x20 && b != b'\t' && b != b'\n') || b == 0x7f {
                shown.extend_from_slice(format!("\\x{b:02x}").as_bytes());
            } else {
                shown.push(b);
            }
        }
        stdout.write_all(&shown)?;
    } else {
        stdout.write_all(bytes)?;
    }
    stdout.flush()
}
