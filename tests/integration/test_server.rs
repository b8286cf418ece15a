//! What the tests' own servers (RabbitMQ, tansu, the registry, ...) share: a port
//! nobody uses now, a boot tried again when the server exits while
//! booting, and a stop that leaves none of the server's processes.

use std::process::Child;
use std::time::{Duration, Instant};

/// How many times a server that exits while booting is started again: a
/// port another test took in between ends a boot without saying anything
/// about ptrain.
pub(crate) const BOOT_TRIES: usize = 3;

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `boot` (given the try's number) up to [`BOOT_TRIES`] times until
/// it succeeds; the last failure is the test's, with the server's words.
pub(crate) fn boot_with_tries(what: &str, mut boot: impl FnMut(usize) -> Result<(), String>) {
    for attempt in 1..=BOOT_TRIES {
        match boot(attempt) {
            Ok(()) => return,
            Err(why) if attempt < BOOT_TRIES => {
                eprintln!("{what}: boot {attempt} of {BOOT_TRIES} failed, trying again: {why}");
            }
            Err(why) => panic!("{why}"),
        }
    }
}

/// Stops a server started in a process group of its own: SIGTERM to the
/// group, SIGKILL past `grace`, and waits until no process of the group
/// is left, so its port is free.
pub(crate) fn stop_group(mut child: Child, grace: Duration) {
    let group = child.id() as i32;
    // SAFETY: kill has no memory preconditions; the group is the child's.
    unsafe { libc::kill(-group, libc::SIGTERM) };
    let graceful_until = Instant::now() + grace;
    loop {
        // Reaped, or the group's leader would linger as a zombie.
        let _ = child.try_wait();
        // SAFETY: signal 0 only asks whether the group has a member.
        if unsafe { libc::kill(-group, 0) } != 0 {
            break;
        }
        if Instant::now() > graceful_until {
            // SAFETY: as above. What a broker confirmed is on disk already:
            // a kill loses none of it.
            unsafe { libc::kill(-group, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
