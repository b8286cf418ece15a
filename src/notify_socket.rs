//! What ptraind tells systemd over its notify socket (`sd_notify`): the
//! status line and the watchdog pings, sent from a thread of their own.
//!
//! A datagram to `NOTIFY_SOCKET` blocks while systemd's receive queue is
//! full, which is exactly when systemd is busiest: in a 500-job burst on
//! two cores one `STATUS=` send held the state task for 3.5 s (`make
//! bench`, the bystander's `Status()` p99). So the state task only leaves
//! the newest line and a ping request here and goes on; the thread sends
//! them, newest status first coalescing the ones it never got to. A state
//! task that hangs still stops the pings: it is the one that asks for them.

use std::sync::{Arc, Condvar, Mutex};

#[derive(Default)]
struct Pending {
    status: Option<String>,
    watchdog: bool,
    closed: bool,
}

/// The sending half the state task holds. Dropping it ends the thread once
/// what is pending went out.
pub struct NotifySocket {
    shared: Arc<(Mutex<Pending>, Condvar)>,
}

impl NotifySocket {
    /// Starts the sender thread (a no-op sender when `NOTIFY_SOCKET` is
    /// unset: sd_notify ignores the calls then).
    pub fn start() -> NotifySocket {
        NotifySocket::start_with(|message| {
            let _ = sd_notify::notify(&[message]);
        })
    }

    /// Starts the sender thread with its own way of sending a message.
    fn start_with(send: impl FnMut(sd_notify::NotifyState) + Send + 'static) -> NotifySocket {
        let shared = Arc::new((Mutex::new(Pending::default()), Condvar::new()));
        let theirs = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("sd-notify".into())
            .spawn(move || send_loop(&theirs, send));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the sd-notify thread; the status line and watchdog pings are not sent");
        }
        NotifySocket { shared }
    }

    /// The status line systemd shows (`systemctl status ptraind`); a line
    /// not sent yet is replaced.
    pub fn status(&self, line: String) {
        self.update(|p| p.status = Some(line));
    }

    /// A watchdog ping (`WATCHDOG=1`).
    pub fn watchdog(&self) {
        self.update(|p| p.watchdog = true);
    }

    fn update(&self, change: impl FnOnce(&mut Pending)) {
        let (lock, wake) = &*self.shared;
        if let Ok(mut pending) = lock.lock() {
            change(&mut pending);
            wake.notify_one();
        }
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        self.update(|p| p.closed = true);
    }
}

fn send_loop(shared: &(Mutex<Pending>, Condvar), mut send: impl FnMut(sd_notify::NotifyState)) {
    let (lock, wake) = shared;
    loop {
        let taken = {
            let Ok(mut pending) = lock.lock() else { return };
            while pending.status.is_none() && !pending.watchdog && !pending.closed {
                pending = match wake.wait(pending) {
                    Ok(p) => p,
                    Err(_) => return,
                };
            }
            if pending.status.is_none() && !pending.watchdog {
                return;
            }
            std::mem::take(&mut *pending)
        };
        if let Some(line) = &taken.status {
            send(sd_notify::NotifyState::Status(line));
        }
        if taken.watchdog {
            send(sd_notify::NotifyState::Watchdog);
        }
        if taken.closed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    /// The thread sends what is pending, the newest status line replacing
    /// an unsent one, and the state task's calls never wait on the socket.
    #[test]
    fn lines_reach_the_socket_and_a_full_socket_never_blocks_the_caller() {
        let dir = std::env::temp_dir().join(format!("ptrain-notify-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        let client = UnixDatagram::unbound().unwrap();
        client.connect(&path).unwrap();
        // As sd_notify writes: one blocking datagram per message.
        let notify = NotifySocket::start_with(move |message| {
            let _ = client.send(message.to_string().as_bytes());
        });
        // Nobody reads for a while: the queue fills, the sender blocks,
        // and the caller's updates still return at once.
        let started = std::time::Instant::now();
        for i in 0..20_000 {
            notify.status(format!("{i} queued"));
            notify.watchdog();
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        // Reading drains it; the last line comes through.
        socket
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut buf = [0u8; 256];
        let mut last_status = String::new();
        let mut pings = 0;
        while last_status != "STATUS=19999 queued" {
            let n = socket
                .recv(&mut buf)
                .expect("the newest status line arrives");
            let msg = String::from_utf8_lossy(&buf[..n]).to_string();
            if msg.starts_with("STATUS=") {
                last_status = msg;
            } else if msg == "WATCHDOG=1" {
                pings += 1;
            }
        }
        assert!(pings >= 1);
        drop(notify);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
