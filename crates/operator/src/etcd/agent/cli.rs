//! `noops fetch-snapshot | save-snapshot | delete-snapshot | install-restored`: the commands
//! the pods of an EtcdCluster's backups and restores run. A command that fails says why on
//! standard error and, where the operator reads it, in its termination message.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Subcommand;

use super::fetch::{Fetch, FetchError, Source, fetch};
use super::install::{InstallError, Installed, install};
use super::save::{Save, credentials_in, delete, save};
use crate::etcd::snapshot::TakeError;

#[derive(Debug, Subcommand)]
pub enum EtcdAgentCommand {
    /// Fetch an etcd snapshot from an S3-compatible bucket into a file, checked against its
    /// SHA-256 (the first step of a restore, run in the restore pod).
    FetchSnapshot(FetchArgs),
    /// Save an etcd snapshot into a mounted backup volume, all or nothing, and report what was
    /// saved in the termination message (run by the pod of a volume backup).
    SaveSnapshot(SaveArgs),
    /// Delete an etcd snapshot from a mounted backup volume (run by the pod that deletes a
    /// volume backup).
    DeleteSnapshot {
        /// Where the volume is mounted.
        #[arg(long)]
        folder: PathBuf,
        /// The snapshot's path in the volume.
        #[arg(long)]
        key: String,
        #[arg(long, default_value = "/dev/termination-log")]
        termination_log: PathBuf,
    },
    /// Install a restored etcd data directory into a member's volume, all or nothing (the
    /// last step of a restore; a volume that has one already is left alone).
    InstallRestored {
        #[arg(long)]
        from: PathBuf,
        #[arg(long)]
        to: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
pub struct FetchArgs {
    /// The store's URL (or `--folder`).
    #[arg(long, required_unless_present = "folder")]
    endpoint: Option<String>,
    #[arg(long, required_unless_present = "folder")]
    bucket: Option<String>,
    /// A mounted backup volume holding the snapshot, instead of a bucket.
    #[arg(long, conflicts_with_all = ["endpoint", "bucket"])]
    folder: Option<PathBuf>,
    /// The snapshot's key (its path in the folder).
    #[arg(long)]
    key: String,
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// The SHA-256 (hex) the snapshot must have.
    #[arg(long)]
    sha256: String,
    /// The file to write.
    #[arg(long)]
    out: PathBuf,
    #[arg(long, env = "AWS_ACCESS_KEY_ID", hide_env_values = true)]
    access_key_id: Option<String>,
    #[arg(long, env = "AWS_SECRET_ACCESS_KEY", hide_env_values = true)]
    secret_access_key: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct SaveArgs {
    /// The member's client URL.
    #[arg(long)]
    endpoint: String,
    /// Where the volume is mounted.
    #[arg(long)]
    folder: PathBuf,
    /// The snapshot's path in the volume.
    #[arg(long)]
    key: String,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    limit_seconds: u64,
    /// A mounted client-certificate Secret (`ca.crt`, `tls.crt`, `tls.key`), when the cluster
    /// serves TLS.
    #[arg(long, requires = "server_name")]
    tls_dir: Option<PathBuf>,
    /// The name the members' server certificate carries.
    #[arg(long)]
    server_name: Option<String>,
    #[arg(long, default_value = "/dev/termination-log")]
    termination_log: PathBuf,
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{0}")]
    Usage(&'static str),
    #[error("reading the client certificate in {dir}: {source}")]
    Certificate {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error(transparent)]
    Save(#[from] TakeError),
    #[error(transparent)]
    Delete(#[from] object_store::Error),
    #[error(transparent)]
    Install(#[from] InstallError),
    #[error("writing the report: {0}")]
    Report(#[from] serde_json::Error),
}

/// Runs one command.
pub async fn run(command: EtcdAgentCommand) -> Result<(), AgentError> {
    match command {
        EtcdAgentCommand::FetchSnapshot(args) => fetch_snapshot(args).await,
        EtcdAgentCommand::SaveSnapshot(args) => save_snapshot(args).await,
        EtcdAgentCommand::DeleteSnapshot {
            folder,
            key,
            termination_log,
        } => {
            let deleted = delete(&folder, &key).await;
            let message = match &deleted {
                Ok(()) => format!("deleted {key}"),
                Err(e) => e.to_string(),
            };
            report(&termination_log, &message);
            Ok(deleted?)
        }
        EtcdAgentCommand::InstallRestored { from, to } => {
            match install(&from, &to)? {
                Installed::Installed => println!("installed {} as {}", from.display(), to.display()),
                Installed::AlreadyThere => println!("{} is there already: left alone", to.display()),
            }
            Ok(())
        }
    }
}

async fn fetch_snapshot(args: FetchArgs) -> Result<(), AgentError> {
    let source = match (args.folder, args.endpoint, args.bucket) {
        (Some(folder), _, _) => Source::Folder(folder),
        (None, Some(endpoint), Some(bucket)) => Source::S3 {
            endpoint,
            bucket,
            region: args.region,
            access_key_id: args
                .access_key_id
                .ok_or(AgentError::Usage("AWS_ACCESS_KEY_ID is not set"))?,
            secret_access_key: args
                .secret_access_key
                .ok_or(AgentError::Usage("AWS_SECRET_ACCESS_KEY is not set"))?,
        },
        _ => {
            return Err(AgentError::Usage(
                "say where the snapshot is: --endpoint and --bucket, or --folder",
            ));
        }
    };
    let to_fetch = Fetch {
        source,
        key: args.key,
        sha256: args.sha256,
        out: args.out,
    };
    let size = fetch(&to_fetch).await?;
    println!(
        "fetched {size} bytes to {}, SHA-256 {}",
        to_fetch.out.display(),
        to_fetch.sha256
    );
    Ok(())
}

async fn save_snapshot(args: SaveArgs) -> Result<(), AgentError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let credentials = match (&args.tls_dir, &args.server_name) {
        (Some(dir), Some(name)) => Some(credentials_in(dir, name).map_err(|source| AgentError::Certificate {
            dir: dir.clone(),
            source,
        })?),
        _ => None,
    };
    let to_save = Save {
        endpoint: args.endpoint,
        credentials,
        folder: args.folder,
        key: args.key,
        limit: Duration::from_secs(args.limit_seconds),
    };
    match save(&to_save).await {
        Ok(saved) => {
            report(&args.termination_log, &serde_json::to_string(&saved)?);
            Ok(())
        }
        Err(e) => {
            report(&args.termination_log, &e.to_string());
            Err(e.into())
        }
    }
}

/// Writes what a helper pod has to say where the kubelet reads it; a failure to write it is
/// only logged (the pod's exit code still tells).
fn report(termination_log: &Path, message: &str) {
    println!("{message}");
    if let Err(e) = std::fs::write(termination_log, message) {
        eprintln!("cannot write {}: {e}", termination_log.display());
    }
}
