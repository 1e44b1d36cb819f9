//! A base backup read from a replica (`backup.target: PreferStandby`) is whole only with the
//! WAL it ends in, and only the primary archives WAL: a replica's server does not wait for
//! that archive as a primary's does when its backup ends. So the backup pod waits until the
//! store holds the segment the backup ends in before it writes the record that makes the
//! backup one, asking the primary (through `<name>-rw`) to switch to a new segment so that the
//! wait is seconds, not `archive_timeout`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use tracing::{info, warn};

use super::wal::segment_name;
use crate::postgres::position::lsn;
use crate::postgres::sql::Instance;
use crate::postgres::store::WAL_SUFFIX;

/// How long the backup waits for the primary's archive.
const PATIENCE: Duration = Duration::from_secs(600);
/// How often the primary is asked to switch segments while the backup waits.
const SWITCH_EVERY: Duration = Duration::from_secs(10);

/// Why the backup is not whole: the WAL it ends in was not archived.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotArchived(String);

/// Where the primary archives: the backup waits for its archive.
#[derive(Debug, Clone)]
pub struct ArchivedBy {
    /// The primary's address (`<name>-rw`).
    pub primary: String,
    /// The folder of the database's WAL in the store.
    pub wal_folder: String,
}

/// The segment that holds the last byte of WAL before `end` (an end on a segment's first byte
/// needs only the segment before it), on `timeline`. Pure.
pub fn last_segment(end: &str, timeline: i64) -> Option<String> {
    let before = lsn(end)?.checked_sub(1)?;
    segment_name(&format!("{:X}/{:X}", before >> 32, before & 0xffff_ffff), timeline)
}

/// Waits until the store holds the segment the backup ends in, at WAL `end` of `timeline`
/// (the timeline of its last WAL range): that one only, since an older timeline's segment of
/// the same number may hold WAL the new primary does not have.
pub async fn wait_archived(
    store: &Arc<dyn ObjectStore>,
    by: &ArchivedBy,
    end: &str,
    timeline: i64,
) -> Result<(), NotArchived> {
    let wanted = last_segment(end, timeline).ok_or_else(|| NotArchived(format!("no WAL segment ends at {end}")))?;
    info!(segment = %wanted, primary = %by.primary, "read from a replica: waiting for the primary to archive the WAL the backup ends in");
    let started = Instant::now();
    let mut asked: Option<Instant> = None;
    let key = Path::from(format!("{}/{wanted}{WAL_SUFFIX}", by.wal_folder));
    loop {
        match store.head(&key).await {
            Ok(_) => {
                info!(segment = %wanted, waited = ?started.elapsed(), "the primary archived the WAL the backup ends in");
                return Ok(());
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => warn!(error = %e, "cannot look for the archived segment yet"),
        }
        if started.elapsed() > PATIENCE {
            return Err(NotArchived(format!(
                "read from a replica, the backup ends in WAL segment {wanted}, which the primary at {} did not archive within {}s: the backup would not be whole",
                by.primary,
                PATIENCE.as_secs()
            )));
        }
        if asked.is_none_or(|at| at.elapsed() >= SWITCH_EVERY) {
            asked = Some(Instant::now());
            switch_segments(&by.primary).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Asks the primary at `host` to switch to a new WAL segment, so that the one being written is
/// archived now. The superuser's password is in the environment (`PGPASSWORD`), as for
/// `pg_basebackup`.
async fn switch_segments(host: &str) {
    let password = std::env::var("PGPASSWORD").unwrap_or_default();
    let asked = async { Instance::connect(host, &password).await?.switch_wal().await };
    if let Err(e) = asked.await {
        warn!(error = %e, "cannot ask the primary to switch WAL segments: waiting for its archive_timeout");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_needs_the_segment_of_its_last_byte() {
        assert_eq!(
            last_segment("0/5000100", 1).as_deref(),
            Some("000000010000000000000005")
        );
        assert_eq!(
            last_segment("0/5000000", 1).as_deref(),
            Some("000000010000000000000004"),
            "an end on a segment's first byte needs only the one before"
        );
        assert_eq!(last_segment("1/0", 3).as_deref(), Some("0000000300000000000000FF"));
        assert_eq!(last_segment("0/0", 1), None);
    }
}
