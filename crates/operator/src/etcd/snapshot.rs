//! Taking one snapshot (by the operator into a bucket, or by a backup pod into its volume:
//! `agent/save.rs`): streamed from a member straight into a multipart upload, hashed on
//! the way, so memory stays bounded whatever the database size. The object appears in the
//! bucket only once the upload completes: a backup cut short leaves no partial snapshot
//! under its key (an upload that fails or stalls is aborted; one cut by an operator crash
//! leaves only unfinished parts, which never become an object).

use std::sync::Arc;
use std::time::Duration;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, WriteMultipart};
use sha2::{Digest, Sha256};

use crate::etcd::client::{EtcdAccess, EtcdError};

/// What was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    pub size: i64,
    pub sha256: String,
    pub revision: i64,
    pub version: String,
    pub cluster_id: u64,
}

/// Why a snapshot could not be stored.
#[derive(Debug, thiserror::Error)]
pub enum TakeError {
    #[error("etcd: {0}")]
    Etcd(#[from] EtcdError),
    #[error("etcd snapshot stream: {0}")]
    Stream(#[from] etcd_client::Error),
    #[error("the object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("the member sent an empty snapshot")]
    Empty,
    #[error("the snapshot was not stored within {}s", .0.as_secs())]
    Stalled(Duration),
}

/// How many parts may be uploading at once (5 MiB each).
const UPLOADS_IN_FLIGHT: usize = 4;

/// Streams a snapshot of the member at `endpoint` to `key` in `store`, within `limit` (a
/// stream that stalls is given up, and its upload aborted).
pub async fn take(
    access: &EtcdAccess,
    endpoint: &str,
    store: Arc<dyn ObjectStore>,
    key: &str,
    limit: Duration,
) -> Result<Taken, TakeError> {
    // A linearizable read first: the member has caught up with the leader (a member that
    // lags would hand out an old snapshot).
    access.read_through(endpoint).await?;
    let mut snapshot = access.snapshot(endpoint).await?;
    let upload = store.put_multipart(&Path::from(key)).await?;
    let mut writer = WriteMultipart::new(upload);
    let mut hash = Sha256::new();
    let mut size: i64 = 0;
    let stream = async {
        while let Some(chunk) = snapshot.stream.message().await? {
            let blob = chunk.blob();
            hash.update(blob);
            size += i64::try_from(blob.len()).unwrap_or(i64::MAX);
            writer.wait_for_capacity(UPLOADS_IN_FLIGHT).await?;
            writer.write(blob);
        }
        Ok(())
    };
    let streamed: Result<(), TakeError> = tokio::time::timeout(limit, stream)
        .await
        .unwrap_or(Err(TakeError::Stalled(limit)));
    if let Err(e) = streamed.and_then(|()| if size == 0 { Err(TakeError::Empty) } else { Ok(()) }) {
        let _ = writer.abort().await;
        return Err(e);
    }
    writer.finish().await?;
    Ok(Taken {
        size,
        sha256: hash.finalize().iter().map(|b| format!("{b:02x}")).collect(),
        revision: snapshot.revision,
        version: snapshot.version,
        cluster_id: snapshot.cluster_id,
    })
}

/// Deletes the snapshot at `key`; one already gone is fine.
pub async fn delete(store: Arc<dyn ObjectStore>, key: &str) -> Result<(), object_store::Error> {
    match store.delete(&Path::from(key)).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}
