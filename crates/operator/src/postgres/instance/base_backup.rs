//! Taking a base backup, in a backup pod (`noops pg-instance base-backup`): `pg_basebackup`
//! over the replication protocol, its tar streamed straight into the store, hashed and read on
//! the way (for the WAL positions in `backup_label` and `backup_manifest`, and the system
//! identifier in `global/pg_control`). Memory stays bounded whatever the database's size.
//!
//! The WAL is not in the tar (`--wal-method=none`): from the primary, `pg_basebackup` returns
//! only once the server has archived every segment the backup needs, so the backup is whole
//! with the archive; from a replica, which archives nothing, the pod waits for the primary's
//! archive itself (`standby_backup.rs`). The tar appears in the store only once its upload completes, and `backup.json`,
//! which describes it, only after that: a backup cut short leaves nothing that looks like one.

use std::collections::BTreeMap;
use std::io::Read;
use std::process::Stdio;
use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Command;

use super::standby_backup::{ArchivedBy, wait_archived};
use crate::postgres::names::{PORT, SUPERUSER};
use crate::postgres::store::{BASE_TAR, RECORD};

/// What a base backup is, as its pod reports it and `backup.json` records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Taken {
    pub size: i64,
    pub sha256: String,
    /// The WAL positions it starts and ends at (`0/2000028`).
    pub start_wal: String,
    pub end_wal: String,
    pub timeline: i64,
    /// Decimal, as PostgreSQL prints it.
    pub system_identifier: String,
    /// The major version (`PG_VERSION`).
    pub server_version: String,
    /// When the server started it (from `backup_label`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    /// The timeline its WAL ends on (the last of `backup_manifest`'s WAL ranges): another than
    /// `timeline` if a replica it was read from followed a promotion meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_timeline: Option<i64>,
}

/// Why a base backup failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("running pg_basebackup: {0}")]
    Spawn(std::io::Error),
    #[error("pg_basebackup failed ({status}): {said}")]
    Failed {
        status: std::process::ExitStatus,
        said: String,
    },
    #[error("reading pg_basebackup's output: {0}")]
    Read(std::io::Error),
    #[error("the store: {0}")]
    Store(#[from] object_store::Error),
    #[error("the base backup is not as expected: {0}")]
    Unexpected(String),
}

/// How many parts may be uploading at once (5 MiB each).
const UPLOADS_IN_FLIGHT: usize = 4;
/// The files of the tar that say what the backup is.
const WANTED: [&str; 4] = ["backup_label", "backup_manifest", "global/pg_control", "PG_VERSION"];

/// Takes a base backup of the server at `host` into `folder` of `store`, labelled `label`,
/// reading at most `max_rate_kib` KiB per second if given. The superuser's password is in the
/// environment (`PGPASSWORD`). A replica's backup (`archived_by`) is recorded only once the
/// primary has archived the WAL it ends in (`standby_backup.rs`).
pub async fn take(
    host: &str,
    label: &str,
    store: Arc<dyn ObjectStore>,
    folder: &str,
    max_rate_kib: Option<u32>,
    archived_by: Option<&ArchivedBy>,
) -> Result<Taken, BackupError> {
    let mut child = Command::new("pg_basebackup")
        .args(["--host", host, "--port", &PORT.to_string(), "--username", SUPERUSER])
        .args([
            "--pgdata=-",
            "--format=tar",
            "--wal-method=none",
            "--checkpoint=fast",
            "--no-password",
        ])
        .arg(format!("--label={label}"))
        .args(max_rate_kib.map(|kib| format!("--max-rate={kib}k")))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(BackupError::Spawn)?;
    let (Some(mut stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(BackupError::Unexpected("pg_basebackup has no output pipes".into()));
    };
    // What pg_basebackup says goes to the pod's log, and its last words into an error.
    let said = tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        let mut last = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("{line}");
            last.push(line);
            if last.len() > 5 {
                last.remove(0);
            }
        }
        last.join("; ")
    });

    let key = Path::from(format!("{folder}/{BASE_TAR}"));
    let mut writer = WriteMultipart::new(store.put_multipart(&key).await?);
    let (to_reader, from_stream) = tokio::sync::mpsc::channel::<bytes::Bytes>(16);
    let reader = tokio::task::spawn_blocking(move || read_wanted(ChannelReader::new(from_stream)));
    let mut hash = Sha256::new();
    let mut size: i64 = 0;
    let mut buffer = vec![0u8; 1 << 20];
    let streamed: Result<(), BackupError> = async {
        loop {
            let n = stdout.read(&mut buffer).await.map_err(BackupError::Read)?;
            if n == 0 {
                return Ok(());
            }
            let chunk = bytes::Bytes::copy_from_slice(&buffer[..n]);
            hash.update(&chunk);
            size += i64::try_from(n).unwrap_or(i64::MAX);
            // The reader reads every byte (it drains the tar to its end): a send fails only if
            // it stopped on a malformed tar, which its result says.
            let _ = to_reader.send(chunk.clone()).await;
            writer.wait_for_capacity(UPLOADS_IN_FLIGHT).await?;
            writer.write(&chunk);
        }
    }
    .await;
    drop(to_reader);
    let status = child.wait().await.map_err(BackupError::Spawn)?;
    let said = said.await.unwrap_or_default();
    let files = reader
        .await
        .map_err(|e| BackupError::Unexpected(format!("the tar reader stopped: {e}")))?;
    let checked = streamed
        .and_then(|()| {
            if status.success() {
                Ok(())
            } else {
                Err(BackupError::Failed { status, said })
            }
        })
        .and_then(|()| files.map_err(|e| BackupError::Unexpected(format!("pg_basebackup's tar cannot be read: {e}"))))
        .and_then(|files| describe(&files, size, hex(&hash.finalize())));
    let taken = match checked {
        Ok(taken) => taken,
        Err(e) => {
            let _ = writer.abort().await;
            return Err(e);
        }
    };
    writer.finish().await?;
    if let Some(by) = archived_by {
        wait_archived(&store, by, &taken.end_wal, taken.end_timeline.unwrap_or(taken.timeline))
            .await
            .map_err(|e| BackupError::Unexpected(e.to_string()))?;
    }
    let record = serde_json::to_vec_pretty(&taken).map_err(|e| BackupError::Unexpected(e.to_string()))?;
    store
        .put(&Path::from(format!("{folder}/{RECORD}")), PutPayload::from(record))
        .await?;
    Ok(taken)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the wanted files of a base backup say it is. Pure.
pub fn describe(files: &BTreeMap<String, Vec<u8>>, size: i64, sha256: String) -> Result<Taken, BackupError> {
    let text = |name: &str| {
        files
            .get(name)
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .ok_or_else(|| BackupError::Unexpected(format!("it has no {name}")))
    };
    let label = text("backup_label")?;
    let field = |name: &str| {
        label
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    };
    let start_wal = field("START WAL LOCATION")
        .and_then(|v| v.split_whitespace().next().map(str::to_string))
        .ok_or_else(|| BackupError::Unexpected("backup_label has no START WAL LOCATION".into()))?;
    let timeline = field("START TIMELINE")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| BackupError::Unexpected("backup_label has no START TIMELINE".into()))?;
    let manifest: serde_json::Value = serde_json::from_str(&text("backup_manifest")?)
        .map_err(|e| BackupError::Unexpected(format!("backup_manifest is not JSON: {e}")))?;
    let last_range = manifest["WAL-Ranges"].as_array().and_then(|ranges| ranges.last());
    let end_wal = last_range
        .and_then(|range| range["End-LSN"].as_str())
        .map(str::to_string)
        .ok_or_else(|| BackupError::Unexpected("backup_manifest has no WAL range".into()))?;
    let end_timeline = last_range.and_then(|range| range["Timeline"].as_i64());
    let control = files
        .get("global/pg_control")
        .filter(|c| c.len() >= 8)
        .ok_or_else(|| BackupError::Unexpected("it has no global/pg_control".into()))?;
    let mut id = [0u8; 8];
    id.copy_from_slice(&control[..8]);
    Ok(Taken {
        size,
        sha256,
        start_wal,
        end_wal,
        timeline,
        system_identifier: u64::from_le_bytes(id).to_string(),
        server_version: text("PG_VERSION")?.trim().to_string(),
        start_time: field("START TIME"),
        end_timeline,
    })
}

/// Reads a base backup's tar to its end, keeping the files that say what it is.
fn read_wanted(reader: impl Read) -> std::io::Result<BTreeMap<String, Vec<u8>>> {
    let mut archive = tar::Archive::new(reader);
    let mut files = BTreeMap::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.to_string_lossy().trim_start_matches("./").to_string();
        if WANTED.contains(&path.as_str()) {
            let mut content = Vec::new();
            entry.read_to_end(&mut content)?;
            files.insert(path, content);
        }
    }
    // The blocks after the end-of-archive marker: the stream is read whole.
    std::io::copy(&mut archive.into_inner(), &mut std::io::sink())?;
    Ok(files)
}

/// A blocking reader over chunks sent from async code.
pub struct ChannelReader {
    chunks: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    current: bytes::Bytes,
}

impl ChannelReader {
    pub fn new(chunks: tokio::sync::mpsc::Receiver<bytes::Bytes>) -> Self {
        Self {
            chunks,
            current: bytes::Bytes::new(),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.chunks.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.current.len());
        out[..n].copy_from_slice(&self.current[..n]);
        self.current = self.current.split_off(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> BTreeMap<String, Vec<u8>> {
        let label = "START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\nCHECKPOINT LOCATION: 0/2000060\nBACKUP METHOD: streamed\nSTART TIME: 2026-11-24 16:35:24 UTC\nLABEL: shop-1\nSTART TIMELINE: 1\n";
        let manifest = r#"{ "PostgreSQL-Backup-Manifest-Version": 1, "Files": [], "WAL-Ranges": [ { "Timeline": 1, "Start-LSN": "0/2000028", "End-LSN": "0/2000100" } ] }"#;
        let mut control = 7_300_000_000_000_000_001u64.to_le_bytes().to_vec();
        control.resize(8192, 0);
        BTreeMap::from([
            ("backup_label".to_string(), label.as_bytes().to_vec()),
            ("backup_manifest".to_string(), manifest.as_bytes().to_vec()),
            ("global/pg_control".to_string(), control),
            ("PG_VERSION".to_string(), b"15\n".to_vec()),
        ])
    }

    #[test]
    fn a_base_backup_says_its_wal_range_timeline_and_database() {
        let taken = describe(&files(), 1234, "ab".into()).unwrap();
        assert_eq!(taken.start_wal, "0/2000028");
        assert_eq!(taken.end_wal, "0/2000100");
        assert_eq!(taken.timeline, 1);
        assert_eq!(taken.end_timeline, Some(1));
        assert_eq!(taken.system_identifier, "7300000000000000001");
        assert_eq!(taken.server_version, "15");
        assert_eq!(taken.start_time.as_deref(), Some("2026-11-24 16:35:24 UTC"));
        let mut without = files();
        without.remove("backup_manifest");
        assert!(
            describe(&without, 1, "ab".into()).is_err(),
            "no end position, no backup"
        );
    }

    #[test]
    fn the_tar_is_read_to_its_end_keeping_only_the_files_that_describe_it() {
        let mut tar = tar::Builder::new(Vec::new());
        for (name, content) in [
            ("base/1/1259", &b"table"[..]),
            ("./backup_label", b"label"),
            ("PG_VERSION", b"15\n"),
        ] {
            let mut header = tar::Header::new_gnu();
            header.set_size(content.len() as u64);
            header.set_mode(0o600);
            header.set_cksum();
            tar.append_data(&mut header, name, content).unwrap();
        }
        let bytes = tar.into_inner().unwrap();
        let (send, receive) = tokio::sync::mpsc::channel(4);
        let reader = std::thread::spawn(move || read_wanted(ChannelReader::new(receive)));
        for chunk in bytes.chunks(100) {
            send.blocking_send(bytes::Bytes::copy_from_slice(chunk)).unwrap();
        }
        drop(send);
        let files = reader.join().unwrap().unwrap();
        assert_eq!(files.keys().collect::<Vec<_>>(), ["PG_VERSION", "backup_label"]);
        assert_eq!(files["backup_label"], b"label");
    }
}
