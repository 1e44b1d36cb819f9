//! The instance pod's init container (`noops pg-instance bootstrap`): a data directory that
//! is there is left alone; an empty one becomes what the operator's plan says
//! (`postgres/restore.rs`), a new database (`initdb`) or a restored one. Either is made in a
//! folder beside the data directory and renamed into place only once whole, so a pod killed
//! half-way leaves nothing that looks like a database, and the next attempt starts afresh.
//!
//! A restore: the base backup is read from the store and unpacked, its SHA-256 checked; the
//! server then runs on it privately (no TCP, a socket of its own) and replays the archived WAL
//! (`restore_command` runs `wal.rs`) to the end of the archive or to the target time, and is
//! promoted. The superuser gets this database's password, the server stops cleanly, and what
//! was recovered is written beside the data directory (`RESTORE_RECORD`), which the operator
//! reads into status. Any failure (a corrupt or missing backup, a hole in the WAL, a target
//! the archive does not reach) fails the container with the reason: the pod is never Ready,
//! and is not put behind the Service.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use noops_api::postgres::RestoreStatus;
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tracing::info;

use super::base_backup::ChannelReader;
use super::keeper::Keeper;
use super::progress::Reporter;
use super::replica::{Role, clone_primary, mark_standby, role};
use super::{DataDir, InstanceError, Settings, io, put_in_place, server_args, write_hba};
use crate::postgres::lease::Seen;
use crate::postgres::names::{RESTORE_RECORD, SUPERUSER};
use crate::postgres::restore::{From, InstancePlan, RestorePlan};
use crate::postgres::sql::Instance;
use crate::postgres::store::{self, BASE_TAR, SOURCE_STORE_ENV, STORE_ENV};

/// What the init container found or made.
#[derive(Debug, Clone, PartialEq)]
pub enum Bootstrapped {
    /// The volume holds a database already.
    AlreadyThere,
    /// A new, empty database.
    Initialised,
    /// A database restored from a backup.
    Restored(RestoreStatus),
    /// A replica's copy of the primary.
    Cloned,
}

/// How long a restored server has to stop cleanly before it is told to stop at once.
const STOP_GRACE: Duration = Duration::from_secs(120);

/// Makes the data directory if there is none, as the plan says.
pub async fn bootstrap(settings: &Settings) -> Result<Bootstrapped, InstanceError> {
    match DataDir::at(&settings.pgdata)? {
        DataDir::Database => return Ok(Bootstrapped::AlreadyThere),
        DataDir::Foreign => return Err(InstanceError::Foreign(settings.pgdata.clone())),
        DataDir::Empty => {}
    }
    // A record of an earlier restore went with that database.
    remove_if_there(Path::new(RESTORE_RECORD))?;
    let plan = read_plan(&settings.plan_file)?;
    if let Role::Replica { host, .. } = bootstrap_role(settings, &plan).await {
        info!(primary = %host, "no database in the volume, and this instance is a replica: copying the primary");
        let staged = staging(&settings.pgdata, "clone")?;
        clone_primary(settings, &host, &staged).await?;
        mark_standby(&staged)?;
        put_in_place(&staged, &settings.pgdata)?;
        return Ok(Bootstrapped::Cloned);
    }
    match (plan.restore, plan.initdb_refused) {
        // A database that ran and can still be restored from elsewhere is not made anew.
        (None, Some(why)) => Err(InstanceError::Restore(why)),
        (None, None) => {
            info!(pgdata = %settings.pgdata.display(), "no database in the volume and none to restore: initialising one");
            initdb(settings).await?;
            Ok(Bootstrapped::Initialised)
        }
        (Some(restore), _) => {
            info!(backup = %restore.backup, base = %restore.base, target = ?restore.target_time, "no database in the volume: restoring it from a backup");
            let record = restore_from(settings, &restore).await?;
            info!(recovered_to = ?record.recovered_to, end_wal = ?record.end_wal, timeline = ?record.timeline, "restored the database");
            Ok(Bootstrapped::Restored(record))
        }
    }
}

/// What an instance with an empty data directory is: as the primary's lease says when the
/// database has one (the plan, a file the pod mounts, may trail a failover by a minute), else
/// as the plan says.
async fn bootstrap_role(settings: &Settings, plan: &InstancePlan) -> Role {
    if let (Some(lease), Some(me), Some(host)) = (&plan.lease, &settings.pod_name, &plan.primary_host) {
        let keeper = Keeper::new(settings.namespace.as_deref(), lease, Some(me)).await;
        if let (Seen::HeldBy(Some(holder)), _) = keeper.read().await {
            return if &holder == me {
                Role::Primary
            } else {
                Role::Replica {
                    host: host.clone(),
                    pod: me.clone(),
                }
            };
        }
    }
    role(plan, settings.pod_name.as_deref())
}

pub fn read_plan(path: &Path) -> Result<InstancePlan, InstanceError> {
    let text = std::fs::read_to_string(path).map_err(io(format!("reading the plan {}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| InstanceError::Restore(format!("the plan {} cannot be read: {e}", path.display())))
}

fn remove_if_there(path: &Path) -> Result<(), InstanceError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(format!("removing {}", path.display()))(e)),
        _ => Ok(()),
    }
}

/// A folder beside the data directory, emptied.
fn staging(pgdata: &Path, extension: &str) -> Result<PathBuf, InstanceError> {
    let staged = pgdata.with_extension(extension);
    if staged.exists() {
        std::fs::remove_dir_all(&staged).map_err(io(format!("removing the half-made {}", staged.display())))?;
    }
    Ok(staged)
}

/// Makes a new database in a folder beside the data directory, then renames it into place.
async fn initdb(settings: &Settings) -> Result<(), InstanceError> {
    let staged = staging(&settings.pgdata, "initdb")?;
    let status = Command::new("initdb")
        .arg("--pgdata")
        .arg(&staged)
        .arg(format!("--username={SUPERUSER}"))
        .arg("--pwfile")
        .arg(&settings.superuser_password_file)
        .args([
            "--auth-local=peer",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C.UTF-8",
        ])
        .arg("--data-checksums")
        .status()
        .await
        .map_err(io("running initdb"))?;
    if !status.success() {
        return Err(InstanceError::Program("initdb", status));
    }
    put_in_place(&staged, &settings.pgdata)?;
    info!("initialised the database");
    Ok(())
}

/// Restores the plan's backup into a folder beside the data directory, recovers it, and puts
/// it in place; returns what was recovered.
async fn restore_from(settings: &Settings, plan: &RestorePlan) -> Result<RestoreStatus, InstanceError> {
    let variable = match plan.from {
        From::Own => STORE_ENV,
        From::Source => SOURCE_STORE_ENV,
    };
    let source = store::open_told(variable)?;
    // How far it has got, for the operator to read into status while it runs.
    let reporter = Reporter::default();
    reporter.update(|p| {
        p.step = "downloading the base backup".into();
        p.source = Some(plan.backup.clone());
    });
    reporter.serve().await;
    let staged = staging(&settings.pgdata, "restore")?;
    std::fs::create_dir_all(&staged).map_err(io(format!("making {}", staged.display())))?;
    set_mode(&staged, 0o700)?;
    let size = unpack(
        source,
        &format!("{}/{BASE_TAR}", plan.base),
        &plan.sha256,
        &staged,
        &reporter,
    )
    .await?;
    info!(size, "unpacked the base backup");
    if !staged.join("backup_label").exists() || !staged.join("PG_VERSION").exists() {
        return Err(InstanceError::Restore(format!(
            "{}/{BASE_TAR} is not a base backup (no backup_label or PG_VERSION)",
            plan.base
        )));
    }
    std::fs::write(staged.join("recovery.signal"), b"").map_err(io("writing recovery.signal"))?;
    remove_if_there(&staged.join("standby.signal"))?;
    write_hba(&staged)?;
    reporter.update(|p| p.step = "replaying WAL".into());
    let record = recover(settings, plan, variable, &staged, &reporter).await?;
    // The record first: a database in place always has its record beside it (a pod killed in
    // between leaves an empty data directory, whose bootstrap removes the record and restores
    // again).
    let text = serde_json::to_vec_pretty(&record).map_err(|e| InstanceError::Restore(e.to_string()))?;
    let staged_record = Path::new(RESTORE_RECORD).with_extension("new");
    std::fs::write(&staged_record, text).map_err(io(format!("writing {}", staged_record.display())))?;
    std::fs::rename(&staged_record, RESTORE_RECORD).map_err(io(format!("writing {RESTORE_RECORD}")))?;
    put_in_place(&staged, &settings.pgdata)?;
    Ok(record)
}

fn set_mode(path: &Path, mode: u32) -> Result<(), InstanceError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io(format!("setting the mode of {}", path.display())))
}

/// Streams the tar at `key` into `into`, checking its SHA-256 and reporting the bytes read;
/// returns its size.
async fn unpack(
    store: Arc<dyn ObjectStore>,
    key: &str,
    sha256: &str,
    into: &Path,
    reporter: &Reporter,
) -> Result<u64, InstanceError> {
    let found = match store.get(&Key::from(key)).await {
        Ok(found) => found,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(InstanceError::Restore(format!(
                "the base backup {key} is not in the store: it was deleted or never finished"
            )));
        }
        Err(e) => return Err(e.into()),
    };
    let total = i64::try_from(found.meta.size).ok();
    reporter.update(|p| {
        p.bytes_total = total;
        p.bytes_done = Some(0);
    });
    let (send, receive) = tokio::sync::mpsc::channel::<bytes::Bytes>(16);
    let folder = into.to_path_buf();
    let unpacker = tokio::task::spawn_blocking(move || {
        let mut archive = tar::Archive::new(ChannelReader::new(receive));
        archive.set_preserve_permissions(true);
        archive.set_overwrite(true);
        let unpacked = archive.unpack(&folder);
        // Read to the end whatever happened, so the stream is whole for the hash.
        let _ = std::io::copy(&mut archive.into_inner(), &mut std::io::sink());
        unpacked
    });
    let mut hash = Sha256::new();
    let mut size: u64 = 0;
    let mut stream = found.into_stream();
    let mut streamed = Ok(());
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) => {
                hash.update(&chunk);
                size += chunk.len() as u64;
                reporter.update(|p| p.bytes_done = i64::try_from(size).ok());
                let _ = send.send(chunk).await;
            }
            Err(e) => {
                streamed = Err(e);
                break;
            }
        }
    }
    drop(send);
    let unpacked = unpacker
        .await
        .map_err(|e| InstanceError::Restore(format!("unpacking stopped: {e}")))?;
    streamed?;
    let actual: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if actual != sha256 {
        return Err(InstanceError::Restore(format!(
            "the base backup {key} is corrupt: its SHA-256 is {actual}, the backup recorded {sha256}"
        )));
    }
    unpacked.map_err(|e| InstanceError::Restore(format!("the base backup {key} cannot be unpacked: {e}")))?;
    Ok(size)
}

/// Runs the server on the restored folder until it has replayed the WAL and is promoted; then
/// gives the superuser its password, stops it cleanly, and says what was recovered.
async fn recover(
    settings: &Settings,
    plan: &RestorePlan,
    variable: &str,
    staged: &Path,
    reporter: &Reporter,
) -> Result<RestoreStatus, InstanceError> {
    let private = settings.socket_dir.with_file_name("restore-socket");
    std::fs::create_dir_all(&private).map_err(io(format!("making {}", private.display())))?;
    super::clear_socket_folder(&private)?;
    let private_settings = Settings {
        socket_dir: private.clone(),
        ..settings.clone()
    };
    let mut args = server_args(&private_settings, staged, &plan.system_identifier);
    for (name, value) in recovery_settings(settings, plan, variable)? {
        args.push("-c".into());
        args.push(format!("{name}={value}"));
    }
    let mut server = Command::new("postgres")
        .args(&args)
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(io("starting postgres to recover"))?;
    let said = tokio::spawn(last_words(server.stderr.take()));
    let promoted = loop {
        tokio::select! {
            status = server.wait() => {
                let status = status.map_err(io("waiting for postgres"))?;
                let said = said.await.unwrap_or_default();
                return Err(InstanceError::Restore(format!("recovery from backup {} failed ({status}): {said}", plan.backup)));
            }
            () = tokio::time::sleep(Duration::from_secs(1)) => {
                // Connections are taken once the replay has reached a consistent state.
                let Ok(instance) = Instance::local(&private).await else { continue };
                match instance.in_recovery().await {
                    Ok(false) => break instance,
                    Ok(true) => {
                        if let Ok(replayed) = instance.recovered().await {
                            reporter.update(|p| {
                                p.replayed_wal = replayed.end_wal;
                                p.replayed_to = replayed.last_transaction;
                            });
                        }
                    }
                    Err(_) => continue,
                }
            }
        }
    };
    let facts = promoted.recovered().await?;
    reporter.update(|p| {
        p.step = "finishing: a checkpoint and a clean stop".into();
        p.replayed_wal = facts.end_wal.clone();
        p.replayed_to = facts.last_transaction.clone();
    });
    let password = std::fs::read_to_string(&settings.superuser_password_file)
        .map_err(io(format!("reading {}", settings.superuser_password_file.display())))?;
    promoted
        .set_password(SUPERUSER, password.trim_end_matches('\n'))
        .await?;
    promoted.checkpoint().await?;
    let timeline = promoted.timeline().await?;
    drop(promoted);
    stop_cleanly(&mut server).await?;
    let _ = std::fs::remove_dir_all(&private);
    Ok(RestoreStatus {
        backup: plan.backup.clone(),
        recovered_to: facts.last_transaction,
        end_wal: facts.end_wal,
        timeline: Some(timeline),
        completed_at: Some(jiff::Timestamp::now().to_string()),
    })
}

/// The server settings of a recovery: WAL fetched by this program from the store, replayed to
/// the latest timeline (or to the target time) and promoted, with no client but this program.
fn recovery_settings(
    settings: &Settings,
    plan: &RestorePlan,
    variable: &str,
) -> Result<Vec<(&'static str, String)>, InstanceError> {
    let me = std::env::current_exe().map_err(io("finding this program"))?;
    let mut restore_command = format!(
        "{} pg-instance wal-fetch --store-env={variable} --folder={}",
        me.display(),
        plan.wal
    );
    // Another database's backup: timelines an earlier attempt of this one archived in its own
    // store are seen too, so that a new one is chosen (its files would clash otherwise).
    if let (From::Source, Some(archive)) = (plan.from, &settings.archive) {
        let own = store::wal_folder(&archive.root, &plan.system_identifier);
        restore_command.push_str(&format!(" --own-history-folder={own}"));
    }
    restore_command.push_str(" %f %p");
    let mut recovery = vec![
        ("listen_addresses", String::new()),
        ("restore_command", restore_command),
        ("recovery_target_action", "promote".into()),
        ("recovery_target_timeline", "latest".into()),
    ];
    if let Some(target) = &plan.target_time {
        recovery.push(("recovery_target_time", server_time(target)?));
    }
    Ok(recovery)
}

/// Stops the recovered server cleanly (a fast shutdown, within the grace), so that it starts
/// again from a shutdown checkpoint.
async fn stop_cleanly(server: &mut tokio::process::Child) -> Result<(), InstanceError> {
    super::signal_server(server, nix::sys::signal::Signal::SIGINT);
    match tokio::time::timeout(STOP_GRACE, server.wait()).await {
        Ok(Ok(status)) if status.success() => {}
        Ok(Ok(status)) => {
            return Err(InstanceError::Restore(format!(
                "the recovered server did not stop cleanly ({status})"
            )));
        }
        Ok(Err(e)) => return Err(io("waiting for postgres")(e)),
        Err(_) => {
            let _ = server.kill().await;
            return Err(InstanceError::Restore(format!(
                "the recovered server did not stop within {}s",
                STOP_GRACE.as_secs()
            )));
        }
    }
    Ok(())
}

/// An RFC 3339 time as `recovery_target_time` reads it (it refuses the `T` and the `Z`).
fn server_time(rfc3339: &str) -> Result<String, InstanceError> {
    let time: jiff::Timestamp = rfc3339
        .parse()
        .map_err(|e| InstanceError::Restore(format!("the target time {rfc3339:?} is not a time: {e}")))?;
    Ok(time.strftime("%Y-%m-%d %H:%M:%S%.6f+00").to_string())
}

/// Forwards the server's log to ours, and keeps the last lines that explain a failure.
async fn last_words(stderr: Option<tokio::process::ChildStderr>) -> String {
    let Some(stderr) = stderr else { return String::new() };
    let mut lines = BufReader::new(stderr).lines();
    let mut kept: Vec<String> = Vec::new();
    while let Ok(Some(line)) = lines.next_line().await {
        eprintln!("{line}");
        if ["FATAL", "PANIC", "ERROR", "DETAIL", "HINT"]
            .iter()
            .any(|level| line.contains(&format!("{level}:")))
        {
            kept.push(
                line.split_once(": ")
                    .map_or(line.as_str(), |(_, rest)| rest)
                    .trim()
                    .to_string(),
            );
            if kept.len() > 4 {
                kept.remove(0);
            }
        }
    }
    kept.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::PutPayload;
    use object_store::memory::InMemory;

    fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        for (name, content) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(content.len() as u64);
            header.set_mode(0o600);
            header.set_cksum();
            tar.append_data(&mut header, name, *content).unwrap();
        }
        tar.into_inner().unwrap()
    }

    fn sha(bytes: &[u8]) -> String {
        Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
    }

    #[tokio::test]
    async fn a_base_backup_is_unpacked_only_with_the_hash_it_was_stored_with() {
        let dir = std::env::temp_dir().join(format!("noops-unpack-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let tar = tar_of(&[("PG_VERSION", b"15\n"), ("base/1/1259", b"rows")]);
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        store
            .put(&Key::from("b/base.tar"), PutPayload::from(tar.clone()))
            .await
            .unwrap();
        let reporter = Reporter::default();
        let size = unpack(store.clone(), "b/base.tar", &sha(&tar), &dir, &reporter)
            .await
            .unwrap();
        assert_eq!(size, tar.len() as u64);
        // What it reported: every byte of the whole.
        let mut reported = noops_api::backup::WorkProgress::default();
        reporter.update(|p| reported = p.clone());
        assert_eq!(reported.bytes_done, Some(tar.len() as i64));
        assert_eq!(reported.bytes_total, Some(tar.len() as i64));
        assert_eq!(std::fs::read(dir.join("base/1/1259")).unwrap(), b"rows");

        let mut corrupt = tar.clone();
        corrupt[600] ^= 1;
        store
            .put(&Key::from("c/base.tar"), PutPayload::from(corrupt))
            .await
            .unwrap();
        let refused = unpack(store.clone(), "c/base.tar", &sha(&tar), &dir, &reporter)
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("is corrupt"), "{refused}");
        let missing = unpack(store, "gone/base.tar", &sha(&tar), &dir, &reporter)
            .await
            .unwrap_err();
        assert!(missing.to_string().contains("is not in the store"), "{missing}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_target_time_is_given_to_the_server_in_its_own_words() {
        assert_eq!(
            server_time("2026-11-24T17:09:07.150275Z").unwrap(),
            "2026-11-24 17:09:07.150275+00"
        );
        assert_eq!(
            server_time("2026-11-24T19:09:07+02:00").unwrap(),
            "2026-11-24 17:09:07.000000+00"
        );
        assert!(server_time("yesterday").is_err());
    }

    #[test]
    fn a_new_database_is_made_beside_the_empty_folder_and_renamed_into_place() {
        let root = std::env::temp_dir().join(format!("noops-place-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (pgdata, staged) = (root.join("data"), root.join("data.initdb"));
        std::fs::create_dir_all(&pgdata).unwrap();
        std::fs::create_dir_all(&staged).unwrap();
        std::fs::write(staged.join("PG_VERSION"), "15").unwrap();
        put_in_place(&staged, &pgdata).unwrap();
        assert_eq!(DataDir::at(&pgdata).unwrap(), DataDir::Database);
        assert!(!staged.exists());
        // A half-made one from an earlier attempt is cleared before the next.
        std::fs::create_dir_all(root.join("data.restore/base")).unwrap();
        let again = staging(&pgdata, "restore").unwrap();
        assert!(!again.exists());
        let _ = std::fs::remove_dir_all(&root);
    }
}
