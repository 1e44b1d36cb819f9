//! Deleting a base backup, in a delete pod (`noops pg-instance remove-backup`): every object in
//! its folder, the description (`backup.json`) first so that a backup half-deleted never looks
//! whole; then, if told, the archived WAL that no backup kept needs any more (segments before
//! the start of the oldest backup kept). History files stay: they are small, and a restore to
//! any timeline needs them.

use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use super::wal::segment;
use crate::postgres::store::{RECORD, WAL_SUFFIX};

/// What a removal deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    pub backup_files: usize,
    pub wal_files: usize,
}

/// Deletes the backup in folder `base`, then the WAL in folder `wal` before segment `keep_from`
/// (a segment name; its timeline does not matter, only its position).
pub async fn remove(
    store: Arc<dyn ObjectStore>,
    base: &str,
    wal: Option<(&str, &str)>,
) -> Result<Removed, object_store::Error> {
    let mut removed = Removed::default();
    match store.delete(&Path::from(format!("{base}/{RECORD}"))).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    for key in list(&store, base).await? {
        delete(&store, &key).await?;
        removed.backup_files += 1;
    }
    if let Some((folder, keep_from)) = wal {
        let Some((_, boundary)) = segment(keep_from) else {
            return Ok(removed);
        };
        for key in list(&store, folder).await? {
            if before(key.filename().unwrap_or_default(), boundary) {
                delete(&store, &key).await?;
                removed.wal_files += 1;
            }
        }
    }
    Ok(removed)
}

/// Whether the archived file `name` holds only WAL before position `boundary`: segments,
/// partial segments and backup history files; never timeline history files.
pub fn before(name: &str, boundary: u64) -> bool {
    let name = name.strip_suffix(WAL_SUFFIX).unwrap_or(name);
    name.get(..24)
        .and_then(segment)
        .is_some_and(|(_, position)| position < boundary)
}

async fn list(store: &Arc<dyn ObjectStore>, folder: &str) -> Result<Vec<Path>, object_store::Error> {
    store
        .list(Some(&Path::from(folder)))
        .map_ok(|meta| meta.location)
        .try_collect()
        .await
}

async fn delete(store: &Arc<dyn ObjectStore>, key: &Path) -> Result<(), object_store::Error> {
    match store.delete(key).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::PutPayload;
    use object_store::memory::InMemory;

    #[tokio::test]
    async fn a_backup_goes_with_the_wal_only_it_needed() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let keys = [
            "r/base/old/base.tar",
            "r/base/old/backup.json",
            "r/base/new/base.tar",
            "r/base/new/backup.json",
            "r/wal/7/000000010000000000000001.gz",
            "r/wal/7/000000010000000000000002.00000028.backup.gz",
            "r/wal/7/000000010000000000000004.gz",
            "r/wal/7/000000020000000000000005.gz",
            "r/wal/7/00000002.history.gz",
        ];
        for key in keys {
            store
                .put(&Path::from(key), PutPayload::from_static(b"x"))
                .await
                .unwrap();
        }
        let removed = remove(
            store.clone(),
            "r/base/old",
            Some(("r/wal/7", "000000020000000000000004")),
        )
        .await
        .unwrap();
        assert_eq!(
            removed,
            Removed {
                backup_files: 1,
                wal_files: 2
            }
        );
        let left: Vec<String> = store
            .list(None)
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap();
        let mut left = left;
        left.sort();
        assert_eq!(
            left,
            [
                "r/base/new/backup.json",
                "r/base/new/base.tar",
                "r/wal/7/000000010000000000000004.gz",
                "r/wal/7/00000002.history.gz",
                "r/wal/7/000000020000000000000005.gz",
            ]
        );
        // Again: nothing left to delete is fine.
        assert_eq!(remove(store, "r/base/old", None).await.unwrap(), Removed::default());
    }
}
