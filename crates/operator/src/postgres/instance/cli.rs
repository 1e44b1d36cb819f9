//! `noops pg-instance ...`: the instance manager's commands, as the instance's pod, PostgreSQL
//! (`archive_command`, `restore_command`) and the backup pods run them. A command that fails
//! says why on its last line and in its termination message, which the operator reads.

use std::path::PathBuf;

use clap::Subcommand;
use tracing::info;

use super::bootstrap::Bootstrapped;
use super::{Archive, Settings, base_backup, bootstrap, remove, standby_backup, wal};
use crate::postgres::names::{LEASE_ENV, POD_NAME_ENV, POD_NAMESPACE_ENV, ROOT_ENV};
use crate::postgres::store::{self, STORE_ENV};

/// Where a command's last words go for the operator to read.
const TERMINATION_LOG: &str = "/dev/termination-log";

#[derive(Debug, Subcommand)]
pub enum PgInstanceCommand {
    /// Copies this program to `--to` (the instance pod's first init container).
    Install {
        #[arg(long)]
        to: PathBuf,
    },
    /// Makes the data directory if there is none: a new database, or one restored from a
    /// backup, as the operator's plan says (the instance pod's second init container).
    Bootstrap(InstanceArgs),
    /// Runs PostgreSQL on the data directory (the instance pod's container).
    Run(InstanceArgs),
    /// Archives one WAL file (PostgreSQL's archive_command: `%p %f`).
    WalPush {
        #[arg(long)]
        folder: String,
        path: PathBuf,
        file: String,
    },
    /// Restores one WAL file (PostgreSQL's restore_command: `%f %p`). Exits 1 when the
    /// archive has no such file, 126 when recovery must stop instead (a hole, a corrupt file).
    WalFetch {
        #[arg(long, default_value = STORE_ENV)]
        store_env: String,
        #[arg(long)]
        folder: String,
        /// Where else timeline history files are looked for (in the database's own store): a
        /// restore of another database's backup then never picks a timeline an earlier
        /// attempt already archived here.
        #[arg(long)]
        own_history_folder: Option<String>,
        file: String,
        path: PathBuf,
    },
    /// Takes a base backup of the server at `--host` into `--folder` of the store (a backup
    /// pod); the superuser's password is in PGPASSWORD.
    BaseBackup {
        #[arg(long)]
        host: String,
        #[arg(long)]
        label: String,
        #[arg(long)]
        folder: String,
        /// The most it reads, in KiB per second.
        #[arg(long)]
        max_rate_kib: Option<u32>,
        /// Read from a replica: the primary's address, whose archive of the WAL the backup
        /// ends in it waits for (in `--wal-folder` of the store).
        #[arg(long, requires = "wal_folder")]
        archived_by: Option<String>,
        #[arg(long, requires = "archived_by")]
        wal_folder: Option<String>,
    },
    /// Deletes the base backup in `--base`, and the WAL in `--wal` before segment
    /// `--keep-wal-from` (a delete pod).
    RemoveBackup {
        #[arg(long)]
        base: String,
        #[arg(long, requires = "keep_wal_from")]
        wal: Option<String>,
        #[arg(long)]
        keep_wal_from: Option<String>,
    },
}

/// Where the instance runs, from the pod's environment.
#[derive(Debug, clap::Args)]
pub struct InstanceArgs {
    #[arg(long, env = "PGDATA")]
    pgdata: PathBuf,
    #[arg(long, env = "NOOPS_SOCKET_DIR")]
    socket_dir: PathBuf,
    #[arg(long, env = "NOOPS_SUPERUSER_PASSWORD_FILE")]
    superuser_password_file: PathBuf,
    #[arg(long, env = "NOOPS_PLAN_FILE", default_value = "/etc/noops/instance/plan.json")]
    plan_file: PathBuf,
    /// The database's root folder in its backup store (archiving is on when it is set).
    #[arg(long, env = ROOT_ENV)]
    backup_root: Option<String>,
    #[arg(long, env = "NOOPS_PG_ARCHIVE_TIMEOUT", default_value_t = 5)]
    archive_timeout_seconds: u32,
    /// The pod's name: which instance this is.
    #[arg(long, env = POD_NAME_ENV)]
    pod_name: Option<String>,
    /// The pod's namespace, and the primary's lease there.
    #[arg(long, env = POD_NAMESPACE_ENV)]
    namespace: Option<String>,
    #[arg(long, env = LEASE_ENV)]
    lease: Option<String>,
}

impl InstanceArgs {
    fn settings(self) -> Settings {
        Settings {
            pgdata: self.pgdata,
            socket_dir: self.socket_dir,
            superuser_password_file: self.superuser_password_file,
            plan_file: self.plan_file,
            archive: Archive::from_env(self.backup_root, self.archive_timeout_seconds),
            pod_name: self.pod_name,
            namespace: self.namespace,
            lease: self.lease,
        }
    }
}

/// Says `message` on the way out: printed, and in the termination message.
fn report(message: &str) {
    println!("{message}");
    if let Err(e) = std::fs::write(TERMINATION_LOG, message) {
        eprintln!("cannot write {TERMINATION_LOG}: {e}");
    }
}

/// Ends the process with `code`, having said `message`.
fn finish(code: i32, message: &str) -> ! {
    report(message);
    std::process::exit(code)
}

/// Fetches `file` from `folder` of the store `variable` names into `path`; exits with 126
/// if the store cannot be opened.
async fn fetch_from(variable: &str, folder: &str, file: &str, path: &std::path::Path) -> Result<(), wal::WalError> {
    match store::open_told(variable) {
        Ok(store) => wal::fetch(store, folder, file, path).await,
        Err(e) => {
            eprintln!("restoring {file}: {e}");
            std::process::exit(126)
        }
    }
}

/// `restore_command`: fetches WAL file `file` from `folder` of the store `store_env` names
/// into `path` (a history file missing there is looked for in `own_history_folder` of the
/// database's own store too); exits as PostgreSQL expects (126: the store cannot be opened).
async fn wal_fetch(
    store_env: &str,
    folder: &str,
    own_history_folder: Option<&str>,
    file: &str,
    path: &std::path::Path,
) -> ! {
    let mut fetched = fetch_from(store_env, folder, file, path).await;
    if let (Err(wal::WalError::NotThere(_)), Some(own)) = (&fetched, own_history_folder)
        && file.ends_with(".history")
    {
        fetched = fetch_from(STORE_ENV, own, file, path).await;
    }
    match fetched {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("restoring {file}: {e}");
            std::process::exit(e.exit_code())
        }
    }
}

/// Runs one command; never returns.
pub async fn run(command: PgInstanceCommand) -> ! {
    match command {
        PgInstanceCommand::Install { to } => match super::install(&to) {
            Ok(()) => finish(0, &format!("installed the instance manager as {}", to.display())),
            Err(e) => finish(1, &e.to_string()),
        },
        PgInstanceCommand::Bootstrap(args) => match bootstrap::bootstrap(&args.settings()).await {
            Ok(Bootstrapped::AlreadyThere) => finish(0, "the volume holds the database"),
            Ok(Bootstrapped::Initialised) => finish(0, "initialised a new database"),
            Ok(Bootstrapped::Cloned) => finish(0, "copied the primary: a replica"),
            Ok(Bootstrapped::Restored(record)) => {
                finish(0, &serde_json::to_string(&record).unwrap_or_else(|_| "restored".into()))
            }
            Err(e) => finish(1, &e.to_string()),
        },
        // As the container's PID 1, it stays the init and runs the instance manager as its child.
        PgInstanceCommand::Run(_) if let Some(code) = super::init::as_init().await => std::process::exit(code),
        PgInstanceCommand::Run(args) => match super::run::run(&args.settings()).await {
            Ok(status) => {
                info!(%status, "the server stopped");
                // The pod's restart policy decides what comes next; the exit code says how it ended.
                std::process::exit(status.code().unwrap_or(1))
            }
            Err(e) => finish(1, &e.to_string()),
        },
        PgInstanceCommand::WalPush { folder, path, file } => {
            let pushed = match store::open_told(STORE_ENV) {
                Ok(store) => wal::push(store, &folder, &path, &file).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match pushed {
                Ok(()) => std::process::exit(0),
                Err(e) => {
                    eprintln!("archiving {file}: {e}");
                    std::process::exit(1)
                }
            }
        }
        PgInstanceCommand::WalFetch {
            store_env,
            folder,
            own_history_folder,
            file,
            path,
        } => wal_fetch(&store_env, &folder, own_history_folder.as_deref(), &file, &path).await,
        PgInstanceCommand::BaseBackup {
            host,
            label,
            folder,
            max_rate_kib,
            archived_by,
            wal_folder,
        } => {
            let archived_by = archived_by
                .zip(wal_folder)
                .map(|(primary, wal_folder)| standby_backup::ArchivedBy { primary, wal_folder });
            let taken = match store::open_told(STORE_ENV) {
                Ok(store) => base_backup::take(&host, &label, store, &folder, max_rate_kib, archived_by.as_ref())
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match taken.and_then(|t| serde_json::to_string(&t).map_err(|e| e.to_string())) {
                Ok(report) => finish(0, &report),
                Err(e) => finish(1, &e),
            }
        }
        PgInstanceCommand::RemoveBackup {
            base,
            wal,
            keep_wal_from,
        } => {
            let removed = match store::open_told(STORE_ENV) {
                Ok(store) => {
                    let wal = wal.as_deref().zip(keep_wal_from.as_deref());
                    remove::remove(store, &base, wal).await.map_err(|e| e.to_string())
                }
                Err(e) => Err(e.to_string()),
            };
            match removed {
                Ok(r) => finish(
                    0,
                    &format!(
                        "deleted {} files of the backup and {} WAL files no backup needs",
                        r.backup_files, r.wal_files
                    ),
                ),
                Err(e) => finish(1, &e),
            }
        }
    }
}
