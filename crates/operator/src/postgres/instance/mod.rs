//! The instance manager: what runs in the instance's pod, as the image's `postgres` user, in
//! place of the image's entrypoint script (`noops pg-instance ...`, `cli.rs`), and in the pods
//! that take and delete backups. One file per job:
//! - `bootstrap.rs` (the pod's init container): a data directory that is not there yet is made
//!   by `initdb`, or restored from a base backup and the archived WAL, in a folder beside it,
//!   then renamed into place: a pod killed half-way leaves nothing that looks like a database.
//!   A folder at the data directory's path that holds files but no database is never touched.
//! - this file: the access rules (`pg_hba.conf`, written at every start: the operator owns
//!   them) and the settings the operator owns on the server's command line;
//! - `wal.rs`: `archive_command` and `restore_command`;
//! - `base_backup.rs`, `remove.rs`: the base backup pod's and the delete pod's work;
//! - `progress.rs`: how far a restore has got, answered to the operator while it runs;
//! - `replica.rs`: an instance that is not the primary: a copy of it, in standby, and a former
//!   primary rewound to follow the new one;
//! - `run.rs`: the PostgreSQL container: what the instance starts as, the server, and when the
//!   primary's lease (`keeper.rs`) says to stop it, or to step down for a switchover;
//! - `control.rs`: what the data directory's control file says.

pub mod base_backup;
pub mod bootstrap;
pub mod cli;
pub mod control;
pub mod init;
pub mod keeper;
pub mod progress;
pub mod remove;
pub mod replica;
pub mod run;
pub mod standby_backup;
pub mod wal;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use super::names::PORT;
use super::store::{self, STORE_ENV};

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
    #[error("{0}")]
    Restore(String),
    #[error("the backup store: {0}")]
    Store(#[from] store::OpenError),
    #[error("the backup store: {0}")]
    Object(#[from] object_store::Error),
    #[error("{0}")]
    Sql(#[from] super::sql::SqlError),
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
    /// The plan for an empty data directory (`restore.rs`).
    pub plan_file: PathBuf,
    /// WAL archiving, when the database has a backup destination.
    pub archive: Option<Archive>,
    /// The pod's name: which instance this is (`replica.rs`).
    pub pod_name: Option<String>,
    /// The pod's namespace, and the name of the primary's lease there (`keeper.rs`).
    pub namespace: Option<String>,
    pub lease: Option<String>,
}

/// Where and how often WAL is archived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archive {
    /// The database's root folder in its store (the store is in [`STORE_ENV`]).
    pub root: String,
    pub timeout_seconds: u32,
}

impl Archive {
    /// From the pod's environment: archiving is on when the operator told it a store.
    pub fn from_env(root: Option<String>, timeout_seconds: u32) -> Option<Self> {
        std::env::var_os(STORE_ENV)?;
        Some(Self {
            root: root?,
            timeout_seconds,
        })
    }

    /// The settings that archive every WAL segment of database `system_id`.
    fn settings(&self, system_id: &str) -> Vec<(&'static str, String)> {
        let me = std::env::current_exe().map_or_else(|_| "noops".into(), |p| p.display().to_string());
        let folder = store::wal_folder(&self.root, system_id);
        vec![
            ("archive_mode", "on".into()),
            (
                "archive_command",
                format!("{me} pg-instance wal-push --folder={folder} %p %f"),
            ),
            ("archive_timeout", self.timeout_seconds.to_string()),
        ]
    }
}

/// The access rules: the superuser through the socket as its own OS user; everyone else with a
/// SCRAM password; replication (base backups) for the superuser only, with its password.
pub fn hba_rules() -> String {
    [
        "# Written by the noops instance manager at every start: edits here are lost.",
        "local all postgres peer",
        "local all all scram-sha-256",
        "host all all 0.0.0.0/0 scram-sha-256",
        "host all all ::/0 scram-sha-256",
        "host replication postgres 0.0.0.0/0 scram-sha-256",
        "host replication postgres ::/0 scram-sha-256",
        "",
    ]
    .join("\n")
}

/// The server's command line for data directory `pgdata` (of database `system_id`): settings
/// the operator owns, given as `-c` so that neither `postgresql.conf` nor `ALTER SYSTEM` can
/// change them.
pub fn server_args(settings: &Settings, pgdata: &Path, system_id: &str) -> Vec<String> {
    let mut args = vec!["-D".to_string(), pgdata.display().to_string()];
    let mut owned: Vec<(&str, String)> = vec![
        ("listen_addresses", "*".to_string()),
        ("port", PORT.to_string()),
        ("unix_socket_directories", settings.socket_dir.display().to_string()),
        ("password_encryption", "scram-sha-256".to_string()),
        ("hba_file", pgdata.join("pg_hba.conf").display().to_string()),
        // WAL kept for a replica whose slot is not there yet (it is made as the replica is),
        // and the most a slot may hold back, so that a replica gone for good cannot fill the
        // primary's volume (it is copied anew instead).
        ("wal_keep_size", "64MB".to_string()),
        ("max_slot_wal_keep_size", "256MB".to_string()),
    ];
    if let Some(archive) = &settings.archive {
        owned.extend(archive.settings(system_id));
    }
    for (name, value) in owned {
        args.push("-c".into());
        args.push(format!("{name}={value}"));
    }
    args
}

/// The database system identifier of the data directory (the first field of
/// `global/pg_control`, as PostgreSQL prints it).
pub fn system_identifier(pgdata: &Path) -> Result<String, InstanceError> {
    let path = pgdata.join("global/pg_control");
    let control = std::fs::read(&path).map_err(io(format!("reading {}", path.display())))?;
    let id: [u8; 8] = control
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| InstanceError::Restore(format!("{} is too short", path.display())))?;
    Ok(u64::from_le_bytes(id).to_string())
}

/// Writes the access rules into `pgdata`.
pub(crate) fn write_hba(pgdata: &Path) -> Result<(), InstanceError> {
    std::fs::write(pgdata.join("pg_hba.conf"), hba_rules()).map_err(io("writing pg_hba.conf"))
}

/// Renames a whole `staged` data directory into place, durably.
pub fn put_in_place(staged: &Path, pgdata: &Path) -> Result<(), InstanceError> {
    // An empty folder at the path (a mount point's leftover) gives way to the new database.
    if pgdata.exists() {
        std::fs::remove_dir(pgdata).map_err(io(format!("removing the empty {}", pgdata.display())))?;
    }
    std::fs::rename(staged, pgdata).map_err(io(format!("renaming {} to {}", staged.display(), pgdata.display())))?;
    if let Some(parent) = pgdata.parent() {
        std::fs::File::open(parent)
            .and_then(|dir| dir.sync_all())
            .map_err(io(format!("syncing {}", parent.display())))?;
    }
    Ok(())
}

/// Removes what a server of this pod's earlier container left in a socket folder: its socket
/// and lock file. The folder is the pod's own (an emptyDir, which a node keeps across its
/// reboot) and the pod runs one server at a time, each started after the last one ended, so a
/// lock found before a start is stale; its PID may by now be another process of the new
/// container, which PostgreSQL would take for a server still running ("lock file … already
/// exists", seen on a real node started again).
pub fn clear_socket_folder(socket_dir: &Path) -> Result<(), InstanceError> {
    let entries = match std::fs::read_dir(socket_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(format!("reading {}", socket_dir.display()))(e)),
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(".s.PGSQL.") {
            let path = entry.path();
            std::fs::remove_file(&path).map_err(io(format!("removing the stale {}", path.display())))?;
        }
    }
    Ok(())
}

/// Sends `signal` to a server child: SIGINT is a fast shutdown, SIGQUIT an immediate one.
pub fn signal_server(server: &tokio::process::Child, signal: nix::sys::signal::Signal) {
    if let Some(pid) = server.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_of_an_earlier_container_leaves_no_lock_behind() {
        let dir = std::env::temp_dir().join(format!("noops-socket-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(clear_socket_folder(&dir).is_ok(), "no folder yet: nothing to clear");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(".s.PGSQL.5432.lock"), "9\n/var/lib/postgresql/data/data\n").unwrap();
        std::fs::write(dir.join(".s.PGSQL.5432"), "").unwrap();
        std::fs::write(dir.join("postgresql.auto.conf"), "kept").unwrap();
        clear_socket_folder(&dir).unwrap();
        let left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, ["postgresql.auto.conf"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

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

    fn settings(archive: Option<Archive>) -> Settings {
        Settings {
            pgdata: crate::postgres::names::PGDATA.into(),
            socket_dir: "/controller/run".into(),
            superuser_password_file: "/etc/noops/superuser/password".into(),
            plan_file: "/etc/noops/instance/plan.json".into(),
            archive,
            pod_name: None,
            namespace: None,
            lease: None,
        }
    }

    #[test]
    fn the_operator_owns_address_socket_and_access_rules() {
        let settings = settings(None);
        let args = server_args(&settings, &settings.pgdata, "7301").join(" ");
        assert!(args.contains("-c listen_addresses=*"), "{args}");
        assert!(args.contains("-c unix_socket_directories=/controller/run"), "{args}");
        assert!(!args.contains("archive_mode"), "no destination, no archiving: {args}");
        let rules = hba_rules();
        assert!(rules.contains("local all postgres peer"));
        assert!(rules.contains("host replication postgres 0.0.0.0/0 scram-sha-256"));
        assert!(!rules.contains("trust"), "no password-less access over the network");
    }

    #[test]
    fn with_a_destination_every_segment_of_this_database_is_archived_within_the_timeout() {
        let archive = Archive {
            root: "postgres/prod/shop".into(),
            timeout_seconds: 5,
        };
        let settings = settings(Some(archive));
        let args = server_args(&settings, &settings.pgdata, "7301");
        assert!(args.contains(&"archive_mode=on".to_string()), "{args:?}");
        assert!(args.contains(&"archive_timeout=5".to_string()), "{args:?}");
        let command = args.iter().find(|a| a.starts_with("archive_command=")).unwrap();
        assert!(
            command.ends_with("pg-instance wal-push --folder=postgres/prod/shop/wal/7301 %p %f"),
            "{command}"
        );
    }

    #[test]
    fn the_system_identifier_is_read_from_pg_control() {
        let dir = std::env::temp_dir().join(format!("noops-control-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("global")).unwrap();
        let mut control = 7_300_000_000_000_000_001u64.to_le_bytes().to_vec();
        control.resize(8192, 0);
        std::fs::write(dir.join("global/pg_control"), control).unwrap();
        assert_eq!(system_identifier(&dir).unwrap(), "7300000000000000001");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
