//! Crash points, for the crash-safety tests. The operator keeps all progress in status so that
//! a process killed anywhere resumes where it stopped; a test proves it by killing it at each
//! point where an action is done and not yet recorded.
//!
//! With `NOOPS_CRASH_POINTS` naming a file, the process kills itself with SIGKILL (no cleanup,
//! as an OOM kill or a lost node would) the first time it reaches each point, after appending
//! the point's name to that file; a point already in the file is passed. The test restarts
//! the operator each time and reads the file to count the distinct points it exercised.
//! Without the variable (always, outside those tests) a point does nothing.

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The variable naming the file of points already crashed at.
pub const CRASH_POINTS_VAR: &str = "NOOPS_CRASH_POINTS";

fn record_file() -> Option<&'static PathBuf> {
    static FILE: OnceLock<Option<PathBuf>> = OnceLock::new();
    FILE.get_or_init(|| std::env::var_os(CRASH_POINTS_VAR).map(PathBuf::from))
        .as_ref()
}

/// Kills this process here, once per `name`, when crash points are on.
pub fn point(name: &str) {
    let Some(file) = record_file() else {
        return;
    };
    let seen = std::fs::read_to_string(file).unwrap_or_default();
    if seen.lines().any(|line| line == name) {
        return;
    }
    let recorded = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .and_then(|mut f| writeln!(f, "{name}").and_then(|()| f.sync_all()));
    if let Err(e) = recorded {
        // Crashing without a record would crash here again on every start.
        tracing::error!(point = name, error = %e, "crash point not recorded; not crashing");
        return;
    }
    tracing::warn!(point = name, "crash point reached: the process kills itself");
    let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
    // SIGKILL cannot be caught; should sending it fail, end as abruptly anyway.
    std::process::abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_do_nothing_without_the_variable() {
        // The test process never sets the variable: reaching a point must return.
        assert!(std::env::var_os(CRASH_POINTS_VAR).is_none());
        point("any point");
    }
}
