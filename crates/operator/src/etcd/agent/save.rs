//! What the pods of a volume backup run, inside the pod, with the backup volume mounted:
//! `noops save-snapshot` streams a snapshot from a member into the volume (the same stream,
//! hash and atomic publication as a bucket upload, `crate::etcd::snapshot`, plus an fsync), and
//! `noops delete-snapshot` deletes one. Each reports through its container's termination
//! message, which the operator reads (`crate::etcd::backup::volume`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::etcd::client::{Credentials, EtcdAccess};
use crate::etcd::snapshot::{self, TakeError, Taken};

/// One snapshot to save.
#[derive(Debug, Clone)]
pub struct Save {
    /// The member's client URL.
    pub endpoint: String,
    /// The client certificate, when the cluster serves TLS.
    pub credentials: Option<Credentials>,
    /// Where the volume is mounted.
    pub folder: PathBuf,
    /// The snapshot's path in the volume.
    pub key: String,
    pub limit: Duration,
}

/// What a save pod reports in its termination message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Saved {
    pub size: i64,
    pub sha256: String,
    pub revision: i64,
    pub version: String,
    /// Hex, as status shows it (a u64 does not survive every JSON reader).
    pub cluster_id: String,
}

impl Saved {
    pub fn from_taken(taken: &Taken) -> Self {
        Self {
            size: taken.size,
            sha256: taken.sha256.clone(),
            revision: taken.revision,
            version: taken.version.clone(),
            cluster_id: format!("{:x}", taken.cluster_id),
        }
    }

    pub fn into_taken(self) -> Option<Taken> {
        Some(Taken {
            size: self.size,
            sha256: self.sha256,
            revision: self.revision,
            version: self.version,
            cluster_id: u64::from_str_radix(&self.cluster_id, 16).ok()?,
        })
    }
}

/// Reads the client certificate from a mounted `<cluster>-client` Secret.
pub fn credentials_in(dir: &Path, server_name: &str) -> std::io::Result<Credentials> {
    let read = |file: &str| std::fs::read_to_string(dir.join(file));
    Ok(Credentials {
        ca: read("ca.crt")?,
        cert: read("tls.crt")?,
        key: read("tls.key")?,
        server_name: server_name.to_string(),
    })
}

/// Refuses a key that would lead out of the volume (absolute, or with `..`): keys come from
/// a status, which anyone allowed to write it could edit.
pub fn inside(key: &str) -> Result<(), object_store::Error> {
    let relative = Path::new(key)
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    if relative && !key.is_empty() {
        Ok(())
    } else {
        Err(object_store::Error::Generic {
            store: "volume",
            source: format!("the path {key:?} leads out of the backup volume").into(),
        })
    }
}

/// Saves the snapshot; the file appears at its path only once whole and synced. What an
/// earlier attempt that was cut short left beside it is removed first.
pub async fn save(s: &Save) -> Result<Saved, TakeError> {
    inside(&s.key)?;
    remove_unfinished(&s.folder.join(&s.key));
    let access = EtcdAccess::new(s.credentials.clone());
    let taken = snapshot::take(
        &access,
        &s.endpoint,
        crate::core::backup::stores::folder(&s.folder)?,
        &s.key,
        s.limit,
    )
    .await?;
    Ok(Saved::from_taken(&taken))
}

/// Deletes the snapshot at `key`; one already gone is fine.
pub async fn delete(folder: &Path, key: &str) -> Result<(), object_store::Error> {
    inside(key)?;
    remove_unfinished(&folder.join(key));
    snapshot::delete(crate::core::backup::stores::folder(folder)?, key).await
}

/// Removes `<file>#<n>`: the staged copies of uploads that never finished (a pod killed
/// mid-stream).
fn remove_unfinished(file: &Path) {
    let (Some(dir), Some(name)) = (file.parent(), file.file_name().and_then(|n| n.to_str())) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let staged = format!("{name}#");
    for entry in entries.flatten() {
        if entry.file_name().to_str().is_some_and(|n| n.starts_with(&staged)) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_pod_saved_survives_its_termination_message() {
        let taken = Taken {
            size: 42,
            sha256: "ab".repeat(32),
            revision: 7,
            version: "3.5.21".into(),
            cluster_id: u64::MAX - 3,
        };
        let message = serde_json::to_string(&Saved::from_taken(&taken)).unwrap();
        let read: Saved = serde_json::from_str(&message).unwrap();
        assert_eq!(read.into_taken(), Some(taken));
    }

    #[tokio::test]
    async fn unfinished_copies_are_removed_and_a_missing_snapshot_deletes_fine() {
        let dir = std::env::temp_dir().join(format!("noops-in-volume-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("etcd/main")).unwrap();
        std::fs::write(dir.join("etcd/main/x.db#1"), b"partial").unwrap();
        std::fs::write(dir.join("etcd/main/x.db"), b"whole").unwrap();
        std::fs::write(dir.join("etcd/main/y.db"), b"other").unwrap();
        delete(&dir, "etcd/main/x.db").await.unwrap();
        delete(&dir, "etcd/main/x.db").await.unwrap();
        assert!(!dir.join("etcd/main/x.db#1").exists());
        assert!(!dir.join("etcd/main/x.db").exists());
        assert!(dir.join("etcd/main/y.db").exists(), "another backup is left alone");
        for outside in ["../y.db", "/etc/passwd", "etcd/../../x", ""] {
            assert!(delete(&dir, outside).await.is_err(), "{outside}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
