//! The WAL archive: what PostgreSQL's `archive_command` and `restore_command` run
//! (`noops pg-instance wal-push` and `wal-fetch`), one file per call.
//!
//! - A pushed file is stored compressed under its own name, in one write: it is in the archive
//!   whole or not at all. A file already archived is accepted again only with the same
//!   content (PostgreSQL retries a push whose answer it did not get); another content under
//!   the same name is refused, so a second server never overwrites the history of the first.
//! - A fetched file that is not in the archive is "not there" (exit 1), which is how recovery
//!   learns that the archive ends. But a segment missing while a later one of its timeline is
//!   archived, a corrupt file, or a store that does not answer, ends recovery with an error
//!   instead (exit 126, which PostgreSQL treats as fatal): a restore never stops early and
//!   passes a hole for the end of the WAL. (PostgreSQL asks for a segment of a timeline only
//!   from where that timeline begins, so a later segment of it means this one should be there.)

use std::io::{Read, Write};
use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::Duration;

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::postgres::store::WAL_SUFFIX;

/// Why a push or a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the archive: {0}")]
    Store(#[from] object_store::Error),
    #[error(
        "{0} is in the archive already with other content: refusing to overwrite it (another server archives here?)"
    )]
    Conflict(String),
    #[error("{0} is not in the archive")]
    NotThere(String),
    #[error(
        "{missing} is missing from the archive, but {after} is there: the WAL has a hole, and a restore would stop there"
    )]
    Gap { missing: String, after: String },
    #[error("{0} in the archive is corrupt: {1}")]
    Corrupt(String, std::io::Error),
}

impl WalError {
    /// The exit code for PostgreSQL: 1 for a file that is not there (the archive ends), 126
    /// for everything that must stop a recovery rather than end it.
    pub fn exit_code(&self) -> i32 {
        match self {
            WalError::NotThere(_) => 1,
            _ => 126,
        }
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> WalError {
    let what = what.into();
    move |source| WalError::Io { what, source }
}

/// How many times a store that does not answer is asked again, and how long apart.
const ATTEMPTS: u32 = 6;
const PAUSE: Duration = Duration::from_secs(2);

/// The key of `file` in the WAL folder `folder`.
pub fn key(folder: &str, file: &str) -> Path {
    Path::from(format!("{folder}/{file}{WAL_SUFFIX}"))
}

fn compress(data: &[u8]) -> Result<Vec<u8>, WalError> {
    // Level 1: a segment forced out by archive_timeout is mostly zeros, which any level
    // shrinks a thousandfold; the fastest keeps archiving off the critical path.
    let mut encoder = GzEncoder::new(Vec::with_capacity(data.len() / 8), Compression::fast());
    encoder.write_all(data).map_err(io("compressing"))?;
    encoder.finish().map_err(io("compressing"))
}

fn decompress(file: &str, data: &[u8]) -> Result<Vec<u8>, WalError> {
    let mut out = Vec::with_capacity(16 << 20);
    GzDecoder::new(data)
        .read_to_end(&mut out)
        .map_err(|e| WalError::Corrupt(file.to_string(), e))?;
    Ok(out)
}

/// Archives the file at `path` (relative to the data directory, PostgreSQL's `%p`) as `file`
/// (`%f`) into `folder`.
pub async fn push(store: Arc<dyn ObjectStore>, folder: &str, path: &FsPath, file: &str) -> Result<(), WalError> {
    let data = std::fs::read(path).map_err(io(format!("reading {}", path.display())))?;
    let key = key(folder, file);
    match with_retries(|| store.get(&key)).await {
        Ok(found) => {
            let archived = found.bytes().await?;
            return if decompress(file, &archived)? == data {
                Ok(())
            } else {
                Err(WalError::Conflict(file.to_string()))
            };
        }
        Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let compressed = PutPayload::from(compress(&data)?);
    with_retries(|| store.put(&key, compressed.clone())).await?;
    Ok(())
}

/// Restores `file` (`%f`) from `folder` to `path` (`%p`), or says why not.
pub async fn fetch(store: Arc<dyn ObjectStore>, folder: &str, file: &str, path: &FsPath) -> Result<(), WalError> {
    let key = key(folder, file);
    let archived = match with_retries(|| store.get(&key)).await {
        Ok(found) => found.bytes().await?,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(match later_segment(&store, folder, file).await? {
                Some(after) => WalError::Gap {
                    missing: file.to_string(),
                    after,
                },
                None => WalError::NotThere(file.to_string()),
            });
        }
        Err(e) => return Err(e.into()),
    };
    let data = decompress(file, &archived)?;
    // Written beside and renamed: recovery never reads half a segment.
    let staged = path.with_extension("noops-partial");
    std::fs::write(&staged, &data).map_err(io(format!("writing {}", staged.display())))?;
    std::fs::rename(&staged, path).map_err(io(format!("renaming {} to {}", staged.display(), path.display())))?;
    Ok(())
}

/// The size of a WAL segment (PostgreSQL's default, which `initdb` here keeps).
const SEGMENT_SIZE: u64 = 16 << 20;

/// The name of the segment that holds WAL position `lsn` (such as `0/2000028`) on `timeline`.
pub fn segment_name(lsn: &str, timeline: i64) -> Option<String> {
    let (high, low) = lsn.split_once('/')?;
    let position = (u64::from_str_radix(high, 16).ok()? << 32) | u64::from_str_radix(low, 16).ok()?;
    let number = position / SEGMENT_SIZE;
    let per_log = (1u64 << 32) / SEGMENT_SIZE;
    Some(format!(
        "{timeline:08X}{:08X}{:08X}",
        number / per_log,
        number % per_log
    ))
}

/// A WAL segment's name: (timeline, position), or None for another file (a history file).
pub fn segment(file: &str) -> Option<(u32, u64)> {
    if file.len() != 24 || !file.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let timeline = u32::from_str_radix(&file[..8], 16).ok()?;
    let log = u64::from_str_radix(&file[8..16], 16).ok()?;
    let seg = u64::from_str_radix(&file[16..], 16).ok()?;
    Some((timeline, (log << 32) | seg))
}

/// The nearest archived segment of `file`'s timeline after it, if `file` is a segment.
async fn later_segment(store: &Arc<dyn ObjectStore>, folder: &str, file: &str) -> Result<Option<String>, WalError> {
    let Some((timeline, position)) = segment(file) else {
        return Ok(None);
    };
    let names: Vec<String> = with_retries(|| async {
        store
            .list(Some(&Path::from(folder)))
            .map_ok(|meta| meta.location.filename().unwrap_or_default().to_string())
            .try_collect()
            .await
    })
    .await?;
    Ok(next_after(&names, timeline, position))
}

/// The nearest segment of `timeline` after `position` among archived `names` (with their
/// suffix). Pure.
pub fn next_after(names: &[String], timeline: u32, position: u64) -> Option<String> {
    names
        .iter()
        .filter_map(|n| n.strip_suffix(WAL_SUFFIX))
        .filter_map(|n| segment(n).map(|s| (s, n)))
        .filter(|((t, p), _)| *t == timeline && *p > position)
        .min_by_key(|((_, p), _)| *p)
        .map(|(_, n)| n.to_string())
}

/// Runs `call` until it answers something other than a failure to reach the store, a few
/// times: one blip of the store does not end a recovery or fail an archive run.
async fn with_retries<T, F, Fut>(mut call: F) -> Result<T, object_store::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, object_store::Error>>,
{
    let mut attempt = 1;
    loop {
        match call().await {
            Err(e) if attempt < ATTEMPTS && !matches!(e, object_store::Error::NotFound { .. }) => {
                eprintln!("the archive did not answer (attempt {attempt} of {ATTEMPTS}): {e}");
                attempt += 1;
                tokio::time::sleep(PAUSE).await;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    fn store() -> Arc<dyn ObjectStore> {
        Arc::new(InMemory::new())
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("noops-wal-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[tokio::test]
    async fn a_segment_comes_back_as_it_went_and_is_stored_compressed() {
        let dir = scratch("round");
        let store = store();
        let mut segment = vec![0u8; 16 << 20];
        segment[..11].copy_from_slice(b"transaction");
        std::fs::write(dir.join("seg"), &segment).unwrap();
        push(
            store.clone(),
            "root/wal/1",
            &dir.join("seg"),
            "000000010000000000000003",
        )
        .await
        .unwrap();
        let stored = store
            .head(&key("root/wal/1", "000000010000000000000003"))
            .await
            .unwrap();
        assert!(
            stored.size < 1 << 20,
            "a mostly empty segment is stored small: {}",
            stored.size
        );
        fetch(
            store.clone(),
            "root/wal/1",
            "000000010000000000000003",
            &dir.join("back"),
        )
        .await
        .unwrap();
        assert_eq!(std::fs::read(dir.join("back")).unwrap(), segment);
        // PostgreSQL pushing the same file again (it never heard the answer) is fine.
        push(
            store.clone(),
            "root/wal/1",
            &dir.join("seg"),
            "000000010000000000000003",
        )
        .await
        .unwrap();
        std::fs::write(dir.join("other"), b"another server's segment").unwrap();
        let refused = push(store, "root/wal/1", &dir.join("other"), "000000010000000000000003").await;
        assert!(matches!(refused, Err(WalError::Conflict(_))), "{refused:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn the_end_of_the_archive_is_not_there_but_a_hole_or_a_corrupt_file_stops_recovery() {
        let dir = scratch("hole");
        let store = store();
        std::fs::write(dir.join("seg"), b"wal").unwrap();
        for name in [
            "000000010000000000000001",
            "000000010000000000000002",
            "000000010000000000000004",
        ] {
            push(store.clone(), "w", &dir.join("seg"), name).await.unwrap();
        }
        let end = fetch(store.clone(), "w", "000000010000000000000005", &dir.join("x"))
            .await
            .unwrap_err();
        assert_eq!(end.exit_code(), 1, "{end}");
        let gap = fetch(store.clone(), "w", "000000010000000000000003", &dir.join("x"))
            .await
            .unwrap_err();
        assert!(
            matches!(&gap, WalError::Gap { after, .. } if after == "000000010000000000000004"),
            "{gap}"
        );
        assert_eq!(gap.exit_code(), 126);
        // The start of the archive pruned away is a hole too, not its end.
        let pruned = fetch(store.clone(), "w", "000000010000000000000000", &dir.join("x"))
            .await
            .unwrap_err();
        assert_eq!(pruned.exit_code(), 126, "{pruned}");
        // A timeline that starts later is asked for an earlier segment during recovery: not a hole.
        let other_timeline = fetch(store.clone(), "w", "000000020000000000000003", &dir.join("x"))
            .await
            .unwrap_err();
        assert_eq!(other_timeline.exit_code(), 1);
        let history = fetch(store.clone(), "w", "00000002.history", &dir.join("x"))
            .await
            .unwrap_err();
        assert_eq!(history.exit_code(), 1);
        store
            .put(
                &key("w", "000000010000000000000006"),
                PutPayload::from_static(b"not gzip"),
            )
            .await
            .unwrap();
        let corrupt = fetch(store, "w", "000000010000000000000006", &dir.join("x"))
            .await
            .unwrap_err();
        assert!(matches!(corrupt, WalError::Corrupt(..)), "{corrupt}");
        assert_eq!(corrupt.exit_code(), 126);
        assert!(
            !dir.join("x").exists(),
            "nothing half-written is left for recovery to read"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_wal_position_is_in_the_segment_postgresql_names_for_it() {
        assert_eq!(
            segment_name("0/2000028", 1).as_deref(),
            Some("000000010000000000000002")
        );
        assert_eq!(
            segment_name("1/FF000000", 3).as_deref(),
            Some("0000000300000001000000FF")
        );
        assert_eq!(segment_name("nonsense", 1), None);
    }

    #[test]
    fn segment_names_are_read_and_other_files_are_not_segments() {
        assert_eq!(segment("000000010000000A000000FF"), Some((1, (0xA << 32) | 0xFF)));
        assert_eq!(segment("00000002.history"), None);
        assert_eq!(segment("000000010000000000000002.00000028.backup"), None);
    }
}
