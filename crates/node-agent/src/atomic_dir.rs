//! Writes a set of files into a folder so that a reader never sees half an update.
//!
//! Same layout as the kubelet's: the files live in a timestamped folder `..<stamp>`, a symlink
//! `..data` points at the current one and is swapped with an atomic rename, and each top-level
//! name is a symlink through `..data`. Programs that watch a mounted Secret or ConfigMap see the
//! old set or the new set, never a mix.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

/// One file to write: contents and permission bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileContent {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// Relative path → file. Paths may contain folders but no `..` and no absolute parts.
pub type FileSet = BTreeMap<String, FileContent>;

const DATA_LINK: &str = "..data";

/// Rejects paths that could escape the folder.
pub fn check_relative(path: &str) -> io::Result<()> {
    let p = Path::new(path);
    let ok = !path.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_))) && !path.starts_with("..");
    if ok {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("invalid volume file path {path:?}"),
        ))
    }
}

/// Replaces the contents of `dir` with `files`, atomically for readers. Returns whether anything
/// changed (an identical set is not rewritten).
pub fn write(dir: &Path, files: &FileSet, group: Option<u32>) -> io::Result<bool> {
    for name in files.keys() {
        check_relative(name)?;
    }
    std::fs::create_dir_all(dir)?;
    if read_current(dir).as_ref() == Some(files) {
        return Ok(false);
    }
    let stamp = format!("..{}", jiff::Timestamp::now().as_nanosecond());
    let staged = dir.join(&stamp);
    std::fs::create_dir(&staged)?;
    for (name, file) in files {
        let path = staged.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, &file.data)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(file.mode))?;
        if let Some(gid) = group {
            std::os::unix::fs::chown(&path, None, Some(gid))?;
        }
    }
    let previous = std::fs::read_link(dir.join(DATA_LINK)).ok();
    let tmp_link = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp_link);
    symlink(&stamp, &tmp_link)?;
    std::fs::rename(&tmp_link, dir.join(DATA_LINK))?;

    let top_level: BTreeSet<String> = files.keys().map(|k| top_name(k)).collect();
    for name in &top_level {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            symlink(Path::new(DATA_LINK).join(name), &link)?;
        }
    }
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !name.starts_with("..") && !top_level.contains(&name) {
            std::fs::remove_file(entry.path())?;
        }
    }
    if let Some(old) = previous
        && old != Path::new(&stamp)
    {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
    Ok(true)
}

fn top_name(path: &str) -> String {
    path.split('/').next().unwrap_or(path).to_string()
}

/// The file set currently published in `dir`, if it can be read back completely.
fn read_current(dir: &Path) -> Option<FileSet> {
    let current = dir.join(std::fs::read_link(dir.join(DATA_LINK)).ok()?);
    let mut out = FileSet::new();
    collect(&current, &current, &mut out).ok()?;
    Some(out)
}

fn collect(root: &Path, here: &Path, out: &mut FileSet) -> io::Result<()> {
    for entry in std::fs::read_dir(here)? {
        let entry = entry?;
        let path: PathBuf = entry.path();
        let meta = entry.metadata()?;
        if meta.is_dir() {
            collect(root, &path, out)?;
        } else {
            let rel = path.strip_prefix(root).map_err(io::Error::other)?;
            out.insert(
                rel.to_string_lossy().to_string(),
                FileContent {
                    data: std::fs::read(&path)?,
                    mode: meta.permissions().mode() & 0o7777,
                },
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[(&str, &str)]) -> FileSet {
        items
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    FileContent {
                        data: v.as_bytes().to_vec(),
                        mode: 0o644,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn writes_swaps_and_prunes() {
        let dir = std::env::temp_dir().join(format!("noops-atomic-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(write(&dir, &set(&[("a", "1"), ("sub/b", "2")]), None).unwrap());
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "1");
        assert_eq!(std::fs::read_to_string(dir.join("sub/b")).unwrap(), "2");
        assert!(
            !write(&dir, &set(&[("a", "1"), ("sub/b", "2")]), None).unwrap(),
            "unchanged"
        );
        assert!(write(&dir, &set(&[("a", "3")]), None).unwrap());
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "3");
        assert!(!dir.join("sub").exists(), "names that left the set are removed");
        let stamps = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("..1"))
            .count();
        assert_eq!(stamps, 1, "old generations are removed");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_escaping_paths() {
        for bad in ["../x", "/etc/passwd", "a/../../b", "", "..data"] {
            assert!(check_relative(bad).is_err(), "{bad}");
        }
        assert!(check_relative("a/b.txt").is_ok());
    }
}
