//! Fetching a snapshot from its bucket (or backup volume) into a file, checked against the SHA-256 its
//! EtcdBackup recorded: what the first container of a restore pod runs (`noops
//! fetch-snapshot`), before etcd's own `etcdutl snapshot restore` reads the file. The file
//! appears under its name only once it is whole and checked.

use std::path::PathBuf;

use std::sync::Arc;

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

/// Where the snapshot is, and where it goes.
#[derive(Debug, Clone)]
pub struct Fetch {
    pub source: Source,
    /// The snapshot's key in the bucket, or its path in the folder.
    pub key: String,
    /// The SHA-256 (hex) the snapshot must have.
    pub sha256: String,
    pub out: PathBuf,
}

/// What holds the snapshot.
#[derive(Clone)]
pub enum Source {
    /// An S3-compatible bucket.
    S3 {
        endpoint: String,
        bucket: String,
        region: String,
        access_key_id: String,
        secret_access_key: String,
    },
    /// A folder: a backup volume, mounted.
    Folder(PathBuf),
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::S3 { endpoint, bucket, .. } => write!(f, "S3 {{ endpoint: {endpoint:?}, bucket: {bucket:?} }}"),
            Source::Folder(path) => write!(f, "Folder({path:?})"),
        }
    }
}

impl Source {
    fn open(&self) -> Result<Arc<dyn ObjectStore>, object_store::Error> {
        match self {
            Source::S3 {
                endpoint,
                bucket,
                region,
                access_key_id,
                secret_access_key,
            } => crate::core::backup::stores::bucket(
                endpoint,
                region,
                bucket,
                &(access_key_id.clone(), secret_access_key.clone()),
            ),
            Source::Folder(path) => Ok(crate::core::backup::stores::folder(path)?),
        }
    }
}

/// Why a snapshot could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("the object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the snapshot's SHA-256 is {found}, not the {expected} its backup recorded: it is refused")]
    HashMismatch { expected: String, found: String },
}

/// How many times a fetch that failed on the way (the store away for a moment) is tried.
const ATTEMPTS: u32 = 5;

/// Fetches the snapshot; returns its size. A snapshot that does not match is refused at once;
/// other failures are tried again a few times.
pub async fn fetch(f: &Fetch) -> Result<u64, FetchError> {
    let mut attempt = 1;
    loop {
        match fetch_once(f).await {
            Err(e @ (FetchError::Store(_) | FetchError::Write { .. })) if attempt < ATTEMPTS => {
                eprintln!("fetch attempt {attempt} of {ATTEMPTS} failed: {e}; trying again");
                tokio::time::sleep(std::time::Duration::from_secs(2u64.pow(attempt))).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

async fn fetch_once(f: &Fetch) -> Result<u64, FetchError> {
    if let Source::Folder(_) = f.source {
        super::save::inside(&f.key)?;
    }
    let store = f.source.open()?;
    let partial = f.out.with_extension("partial");
    let write_err = |path: &PathBuf| {
        let path = path.clone();
        move |source| FetchError::Write { path, source }
    };
    if let Some(dir) = f.out.parent() {
        tokio::fs::create_dir_all(dir).await.map_err(write_err(&f.out))?;
    }
    let mut file = tokio::fs::File::create(&partial).await.map_err(write_err(&partial))?;
    let mut hash = Sha256::new();
    let mut size = 0u64;
    let mut stream = store.get(&Path::from(f.key.as_str())).await?.into_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        hash.update(&chunk);
        size += chunk.len() as u64;
        file.write_all(&chunk).await.map_err(write_err(&partial))?;
    }
    file.sync_all().await.map_err(write_err(&partial))?;
    let found: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if !found.eq_ignore_ascii_case(&f.sha256) {
        let _ = tokio::fs::remove_file(&partial).await;
        return Err(FetchError::HashMismatch {
            expected: f.sha256.clone(),
            found,
        });
    }
    tokio::fs::rename(&partial, &f.out).await.map_err(write_err(&f.out))?;
    Ok(size)
}
