//! Installing a restored etcd data directory into a member's volume, all or nothing: copied
//! under a temporary name, synced, then renamed into place. A volume that already holds the
//! data directory is left alone, so a restore pod that runs again does no harm. What the last
//! container of a restore pod runs (`noops install-restored`).

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// What the install did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// The data directory is now in place.
    Installed,
    /// It was there already (a restore run before): nothing was touched.
    AlreadyThere,
}

/// Why the data could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {source}")]
pub struct InstallError {
    what: &'static str,
    path: PathBuf,
    #[source]
    source: io::Error,
}

fn at(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> InstallError {
    let path = path.to_path_buf();
    move |source| InstallError { what, path, source }
}

/// Copies `from` (a restored data directory) to `to`, unless `to` exists.
pub fn install(from: &Path, to: &Path) -> Result<Installed, InstallError> {
    if to.exists() {
        return Ok(Installed::AlreadyThere);
    }
    let partial = to.with_extension("partial");
    if partial.exists() {
        fs::remove_dir_all(&partial).map_err(at("removing", &partial))?;
    }
    copy_dir(from, &partial)?;
    fs::rename(&partial, to).map_err(at("renaming into place", to))?;
    if let Some(parent) = to.parent() {
        fs::File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(at("syncing", parent))?;
    }
    Ok(Installed::Installed)
}

/// Copies a directory tree, files synced, directories private (etcd wants 0700).
fn copy_dir(from: &Path, to: &Path) -> Result<(), InstallError> {
    fs::create_dir_all(to).map_err(at("creating", to))?;
    fs::set_permissions(to, fs::Permissions::from_mode(0o700)).map_err(at("setting the mode of", to))?;
    for entry in fs::read_dir(from).map_err(at("reading", from))? {
        let entry = entry.map_err(at("reading", from))?;
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().map_err(at("reading", &source))?;
        if kind.is_dir() {
            copy_dir(&source, &target)?;
        } else if kind.is_file() {
            fs::copy(&source, &target).map_err(at("copying", &source))?;
            fs::File::open(&target)
                .and_then(|f| f.sync_all())
                .map_err(at("syncing", &target))?;
        }
    }
    fs::File::open(to).and_then(|d| d.sync_all()).map_err(at("syncing", to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_is_installed_whole_once_and_then_left_alone() {
        let root = std::env::temp_dir().join(format!("noops-install-test-{}", std::process::id()));
        let from = root.join("restored");
        fs::create_dir_all(from.join("member/snap")).unwrap();
        fs::write(from.join("member/snap/db"), b"data").unwrap();
        let to = root.join("volume/data");
        fs::create_dir_all(root.join("volume")).unwrap();
        // A copy cut short earlier is replaced.
        fs::create_dir_all(to.with_extension("partial").join("junk")).unwrap();
        assert_eq!(install(&from, &to).unwrap(), Installed::Installed);
        assert_eq!(fs::read(to.join("member/snap/db")).unwrap(), b"data");
        assert!(!to.with_extension("partial").exists());
        assert_eq!(fs::metadata(&to).unwrap().permissions().mode() & 0o777, 0o700);
        fs::write(from.join("member/snap/db"), b"other").unwrap();
        assert_eq!(install(&from, &to).unwrap(), Installed::AlreadyThere);
        assert_eq!(
            fs::read(to.join("member/snap/db")).unwrap(),
            b"data",
            "existing data is never replaced"
        );
        fs::remove_dir_all(root).unwrap();
    }
}
