//! PID 1 of the PostgreSQL container. A container runtime starts the container's command as
//! PID 1 of the pod's PID namespace, and every process orphaned in the container becomes its
//! child: a server's children once its postmaster was killed (a fence, a hung server), the
//! stray child of a probe. Only PID 1 can reap them; unreaped, they stay zombies for the pod's
//! life (and a test looking for the server among the instance manager's children found one).
//! The instance manager cannot reap what it did not start: a `waitpid(-1)` would take the exit
//! statuses of its own children (the server, initdb, pg_rewind) from under tokio. So, found to
//! be PID 1, it starts itself again as its child and stays a small init, as tini does: it
//! passes the stop signals on to it, reaps every orphan, and exits as its child did.

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::oneshot;
use tracing::{info, warn};

/// Set on the instance manager the init starts, so that it does not start another.
const STARTED_BY_INIT: &str = "NOOPS_STARTED_BY_INIT";

/// The signals passed on to the instance manager: the pod's stop (SIGTERM, or SIGINT, the
/// image's STOPSIGNAL), and what a user may send PID 1.
const PASSED_ON: [(SignalKind, Signal); 4] = [
    (SignalKind::terminate(), Signal::SIGTERM),
    (SignalKind::interrupt(), Signal::SIGINT),
    (SignalKind::hangup(), Signal::SIGHUP),
    (SignalKind::quit(), Signal::SIGQUIT),
];

/// If this process is the container's PID 1 (and not the instance manager an init started),
/// stays the container's init and returns the exit code of the instance manager it ran as its
/// child. None: carry on as the instance manager.
pub async fn as_init() -> Option<i32> {
    if std::process::id() != 1 || std::env::var_os(STARTED_BY_INIT).is_some() {
        return None;
    }
    // Listening before the child exists: a stop asked meanwhile is passed on, not lost.
    let mut listeners = Vec::new();
    for (kind, passed) in PASSED_ON {
        match signal(kind) {
            Ok(listener) => listeners.push((listener, passed)),
            Err(e) => warn!(error = %e, ?passed, "cannot listen for a signal to pass on"),
        }
    }
    let started = std::env::current_exe().and_then(|exe| {
        std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env(STARTED_BY_INIT, "1")
            .spawn()
    });
    let manager = match started {
        Ok(child) => Pid::from_raw(child.id() as i32),
        Err(e) => {
            warn!(error = %e, "cannot start the instance manager as PID 1's child: running it as PID 1 (orphans are not reaped)");
            return None;
        }
    };
    info!(
        pid = manager.as_raw(),
        "the container's PID 1: the instance manager runs as its child; orphans are reaped here"
    );
    for (mut listener, passed) in listeners {
        tokio::spawn(async move {
            while listener.recv().await.is_some() {
                if let Err(e) = kill(manager, passed) {
                    warn!(error = %e, ?passed, "cannot pass a signal on to the instance manager");
                }
            }
        });
    }
    let (ended_tx, ended) = oneshot::channel();
    std::thread::spawn(move || reap(manager, ended_tx));
    Some(ended.await.unwrap_or(1))
}

/// Reaps every child until `manager` ends; says its exit code (128 + signal if killed).
fn reap(manager: Pid, ended: oneshot::Sender<i32>) {
    loop {
        match waitpid(None::<Pid>, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == manager => {
                let _ = ended.send(code);
                return;
            }
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == manager => {
                let _ = ended.send(128 + signal as i32);
                return;
            }
            // An orphan, reaped.
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                warn!(error = %e, "cannot wait for the container's processes");
                let _ = ended.send(1);
                return;
            }
        }
    }
}
