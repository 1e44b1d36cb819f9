//! The instance manager: what runs in the PostgreSQL container (`noops pg-instance run`), as
//! the image's `postgres` user, in place of the image's entrypoint script.
//!
//! - A data directory that is not there yet is made by `initdb` in a folder beside it, then
//!   renamed into place: a pod killed half-way leaves no half-made data directory that would
//!   look like a database.
//! - A folder at the data directory's path that holds files but no database is never touched:
//!   the instance refuses to start, and says why.
//! - The access rules (`pg_hba.conf`) are written at every start: the operator owns them.
//! - The server runs as a child; the pod's SIGTERM becomes a fast shutdown (SIGINT: sessions
//!   are ended, open transactions rolled back), not the smart one that waits for every client
//!   to leave and ends in a SIGKILL and crash recovery.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};
use tracing::info;

use super::names::{PORT, SUPERUSER};

#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} failed: {1}")]
    Program(&'static str, ExitStatus),
    #[error(
        "{0} holds files but no PostgreSQL database (no PG_VERSION): the instance does not start on it; move them away"
    )]
    Foreign(PathBuf),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> InstanceError {
    let what = what.into();
    move |source| InstanceError::Io { what, source }
}

/// What is at the data directory's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDir {
    /// A database (`PG_VERSION` is there).
    Database,
    /// Nothing, or an empty folder.
    Empty,
    /// Files, but no database.
    Foreign,
}

impl DataDir {
    pub fn at(pgdata: &Path) -> Result<Self, InstanceError> {
        if pgdata.join("PG_VERSION").exists() {
            return Ok(DataDir::Database);
        }
        match std::fs::read_dir(pgdata) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(DataDir::Empty),
            Err(e) => Err(io(format!("reading {}", pgdata.display()))(e)),
            Ok(mut entries) => Ok(if entries.next().is_none() {
                DataDir::Empty
            } else {
                DataDir::Foreign
            }),
        }
    }
}

/// Copies this program to `to` (made executable, renamed into place): the init container of
/// the instance's pod puts the instance manager where the PostgreSQL container finds it.
pub fn install(to: &Path) -> Result<(), InstanceError> {
    let me = std::env::current_exe().map_err(io("finding this program"))?;
    let staged = to.with_extension("new");
    std::fs::copy(&me, &staged).map_err(io(format!("copying {} to {}", me.display(), staged.display())))?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755))
        .map_err(io(format!("making {} executable", staged.display())))?;
    std::fs::rename(&staged, to).map_err(io(format!("renaming {} to {}", staged.display(), to.display())))?;
    Ok(())
}

/// Where the instance runs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub pgdata: PathBuf,
    pub socket_dir: PathBuf,
    pub superuser_password_file: PathBuf,
}

/// The access rules: the superuser through the socket as its own OS user; everyone else with a
/// SCRAM password.
pub fn hba_rules() -> String {
    [
        "# Written by the noops instance manager at every start: edits here are lost.",
        "local all postgres peer",
        "local all all scram-sha-256",
        "host all all 0.0.0.0/0 scram-sha-256",
        "host all all ::/0 scram-sha-256",
        "",
    ]
    .join("\n")
}

/// The server's command line: settings the operator owns, given as `-c` so that neither
/// `postgresql.conf` nor `ALTER SYSTEM` can change them.
pub fn server_args(settings: &Settings) -> Vec<String> {
    let mut args = vec!["-D".to_string(), settings.pgdata.display().to_string()];
    for (name, value) in [
        ("listen_addresses", "*".to_string()),
        ("port", PORT.to_string()),
        ("unix_socket_directories", settings.socket_dir.display().to_string()),
        ("password_encryption", "scram-sha-256".to_string()),
        ("hba_file", settings.pgdata.join("pg_hba.conf").display().to_string()),
    ] {
        args.push("-c".into());
        args.push(format!("{name}={value}"));
    }
    args
}

/// Runs the instance until the server stops; returns its exit status.
pub async fn run(settings: &Settings) -> Result<ExitStatus, InstanceError> {
    match DataDir::at(&settings.pgdata)? {
        DataDir::Database => info!(pgdata = %settings.pgdata.display(), "starting on the database in the volume"),
        DataDir::Foreign => return Err(InstanceError::Foreign(settings.pgdata.clone())),
        DataDir::Empty => {
            info!(pgdata = %settings.pgdata.display(), "no database in the volume: initialising one");
            initdb(settings).await?;
        }
    }
    std::fs::write(settings.pgdata.join("pg_hba.conf"), hba_rules()).map_err(io("writing pg_hba.conf"))?;
    std::fs::create_dir_all(&settings.socket_dir).map_err(io(format!("making {}", settings.socket_dir.display())))?;
    serve(settings).await
}

/// Makes a new database in a folder beside the data directory, then renames it into place.
async fn initdb(settings: &Settings) -> Result<(), InstanceError> {
    let staged = settings.pgdata.with_extension("initdb");
    if staged.exists() {
        std::fs::remove_dir_all(&staged).map_err(io(format!("removing the half-made {}", staged.display())))?;
    }
    let status = Command::new("initdb")
        .arg("--pgdata")
        .arg(&staged)
        .arg(format!("--username={SUPERUSER}"))
        .arg("--pwfile")
        .arg(&settings.superuser_password_file)
        .args(["--auth-local=peer", "--auth-host=scram-sha-256", "--encoding=UTF8", "--locale=C.UTF-8"])
        .arg("--data-checksums")
        .status()
        .await
        .map_err(io("running initdb"))?;
    if !status.success() {
        return Err(InstanceError::Program("initdb", status));
    }
    // An empty folder at the path (a mount point's leftover) gives way to the new database.
    if settings.pgdata.exists() {
        std::fs::remove_dir(&settings.pgdata).map_err(io(format!("removing the empty {}", settings.pgdata.display())))?;
    }
    std::fs::rename(&staged, &settings.pgdata)
        .map_err(io(format!("renaming {} to {}", staged.display(), settings.pgdata.display())))?;
    if let Some(parent) = settings.pgdata.parent() {
        std::fs::File::open(parent)
            .and_then(|dir| dir.sync_all())
            .map_err(io(format!("syncing {}", parent.display())))?;
    }
    info!("initialised the database");
    Ok(())
}

/// Runs the server, turning SIGTERM into a fast shutdown.
async fn serve(settings: &Settings) -> Result<ExitStatus, InstanceError> {
    let mut terminate = signal(SignalKind::terminate()).map_err(io("listening for SIGTERM"))?;
    let mut server = Command::new("postgres")
        .args(server_args(settings))
        .spawn()
        .map_err(io("starting postgres"))?;
    loop {
        tokio::select! {
            status = server.wait() => return status.map_err(io("waiting for postgres")),
            _ = terminate.recv() => {
                info!("SIGTERM: shutting the server down (fast)");
                if let Some(pid) = server.id().and_then(|p| i32::try_from(p).ok()) {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGINT);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_directory_is_a_database_nothing_or_someone_elses_files() {
        let dir = std::env::temp_dir().join(format!("noops-pgdata-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(DataDir::at(&dir).unwrap(), DataDir::Empty);
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(DataDir::at(&dir).unwrap(), DataDir::Empty);
        std::fs::write(dir.join("notes.txt"), "x").unwrap();
        assert_eq!(DataDir::at(&dir).unwrap(), DataDir::Foreign);
        std::fs::write(dir.join("PG_VERSION"), "15").unwrap();
        assert_eq!(DataDir::at(&dir).unwrap(), DataDir::Database);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_operator_owns_address_socket_and_access_rules() {
        let settings = Settings {
            pgdata: "/var/lib/postgresql/data".into(),
            socket_dir: "/controller/run".into(),
            superuser_password_file: "/etc/noops/superuser/password".into(),
        };
        let args = server_args(&settings).join(" ");
        assert!(args.contains("-c listen_addresses=*"), "{args}");
        assert!(args.contains("-c unix_socket_directories=/controller/run"), "{args}");
        let rules = hba_rules();
        assert!(rules.contains("local all postgres peer"));
        assert!(!rules.contains("trust"), "no password-less access over the network");
    }
}
