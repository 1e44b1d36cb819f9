//! What a data directory's control file says (`pg_controldata`, in the C locale): the timeline
//! of its last checkpoint, and whether a server stopped cleanly and where its WAL ends then.

use std::path::Path;

use tokio::process::Command;
use tracing::warn;

use crate::postgres::position::Position;
use crate::postgres::switchover::Stopped;

/// The control file of `pgdata` as `pg_controldata` prints it (none: it could not be read).
pub async fn read(pgdata: &Path) -> Option<String> {
    let output = Command::new("pg_controldata")
        .arg(pgdata)
        .env("LC_ALL", "C")
        .output()
        .await;
    match output {
        Ok(output) if output.status.success() => Some(String::from_utf8_lossy(&output.stdout).into_owned()),
        Ok(output) => {
            warn!(stderr = %String::from_utf8_lossy(&output.stderr).trim(), "pg_controldata failed");
            None
        }
        Err(e) => {
            warn!(error = %e, "could not run pg_controldata");
            None
        }
    }
}

/// The value of line `name` (without its colon).
pub fn field<'a>(control: &'a str, name: &str) -> Option<&'a str> {
    control.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == name).then(|| value.trim())
    })
}

/// The timeline of the last checkpoint (or restartpoint).
pub fn timeline(control: &str) -> Option<u32> {
    field(control, "Latest checkpoint's TimeLineID")?.parse().ok()
}

/// How the server of a data directory whose control file says `control` stopped: after a
/// clean shutdown, its last record is the shutdown checkpoint, its latest checkpoint.
pub fn stopped(control: &str) -> Stopped {
    let clean = field(control, "Database cluster state") == Some("shut down");
    let end = field(control, "Latest checkpoint location");
    match (clean, end, timeline(control)) {
        (true, Some(lsn), Some(timeline)) => Stopped::Clean(Position {
            timeline,
            lsn: lsn.to_string(),
        }),
        _ => Stopped::Unclean,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHUT_DOWN: &str = "pg_control version number:            1300
Database cluster state:               shut down
pg_control last modified:             Fri 27 Nov 2026 15:10:02 UTC
Latest checkpoint location:           0/5000028
Latest checkpoint's REDO location:    0/5000028
Latest checkpoint's REDO WAL file:    000000030000000000000005
Latest checkpoint's TimeLineID:       3
";

    #[test]
    fn a_clean_shutdown_ends_at_its_checkpoint_and_anything_else_is_unclean() {
        assert_eq!(
            stopped(SHUT_DOWN),
            Stopped::Clean(Position {
                timeline: 3,
                lsn: "0/5000028".into()
            })
        );
        assert_eq!(timeline(SHUT_DOWN), Some(3));
        let crashed = SHUT_DOWN.replace("shut down", "in production");
        assert_eq!(stopped(&crashed), Stopped::Unclean);
        assert_eq!(stopped(""), Stopped::Unclean);
        // A standby shut down is not a primary's end.
        let standby = SHUT_DOWN.replace("shut down", "shut down in recovery");
        assert_eq!(stopped(&standby), Stopped::Unclean);
    }
}
