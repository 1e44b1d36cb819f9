//! An instance that is not the primary is a hot-standby replica: its empty data directory is a
//! copy of the primary's, streamed by `pg_basebackup` over the replication protocol (through
//! the `<name>-rw` Service, which follows the primary), and it runs in standby, following the
//! primary's WAL through its own physical replication slot, answering reads.
//!
//! Which instance is the primary is the operator's word, in the plan (`restore.rs`); the pod
//! knows its own name from its environment.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;
use tracing::{info, warn};

use super::{InstanceError, Settings, control, io};
use crate::postgres::names::{Names, PORT, SUPERUSER};
use crate::postgres::restore::InstancePlan;
use crate::postgres::sql::Instance;

/// How long a new replica keeps trying to copy the primary (which may still be starting)
/// before its init container fails and says why.
const CLONE_PATIENCE: Duration = Duration::from_secs(600);
const CLONE_RETRY: Duration = Duration::from_secs(2);

/// What this instance is, as the plan says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// The primary (also every instance of a plan that names none: a single instance).
    Primary,
    /// A replica of the primary at `host`, under the name `pod`.
    Replica { host: String, pod: String },
}

/// The role of pod `pod` under `plan`.
pub fn role(plan: &InstancePlan, pod: Option<&str>) -> Role {
    match (&plan.primary, &plan.primary_host, pod) {
        (Some(primary), Some(host), Some(pod)) if primary != pod => Role::Replica {
            host: host.clone(),
            pod: pod.to_string(),
        },
        _ => Role::Primary,
    }
}

/// The password file replicas connect to the primary with (the superuser's password), in the
/// pod's own folder, readable by the server only.
fn passfile(settings: &Settings) -> PathBuf {
    settings
        .socket_dir
        .parent()
        .unwrap_or(&settings.socket_dir)
        .join("pgpass")
}

/// Writes the password file from the superuser's password file.
pub fn write_passfile(settings: &Settings) -> Result<PathBuf, InstanceError> {
    let password = std::fs::read_to_string(&settings.superuser_password_file)
        .map_err(io(format!("reading {}", settings.superuser_password_file.display())))?;
    let path = passfile(settings);
    // host:port:database:user:password, with ':' and '\' escaped.
    let escaped = password
        .trim_end_matches('\n')
        .replace('\\', "\\\\")
        .replace(':', "\\:");
    let staged = path.with_extension("new");
    std::fs::write(&staged, format!("*:*:*:{SUPERUSER}:{escaped}\n")).map_err(io("writing the password file"))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
            .map_err(io("setting the password file's mode"))?;
    }
    std::fs::rename(&staged, &path).map_err(io("writing the password file"))?;
    Ok(path)
}

/// The settings that make the server a standby of the primary at `host`, as `pod`.
pub fn standby_settings(settings: &Settings, host: &str, pod: &str) -> Vec<(&'static str, String)> {
    // `target_session_attrs=read-write`: only a primary is streamed from. Through `<name>-rw`
    // during a switchover, a replica could otherwise reach the old primary just restarted as a
    // replica and stream from it (cascading), out of the new primary's sight: a synchronous
    // primary would wait for it in vain.
    // `tcp_user_timeout`: the WAL receiver ignores `connect_timeout`. Right after the primary's
    // pod is replaced, a connection to the Service can still be sent to the gone pod's address,
    // and the kernel retries that SYN there (its conntrack entry keeps the old endpoint) for
    // over a minute while commits wait; with it the attempt ends in 3 s and the next one, a
    // second later, reaches the new primary. It also ends a stream whose primary went silent.
    let conninfo = format!(
        "host={host} port={PORT} user={SUPERUSER} passfile={} application_name={pod} sslmode=disable connect_timeout=5 tcp_user_timeout=3000 target_session_attrs=read-write",
        passfile(settings).display()
    );
    vec![
        ("primary_conninfo", conninfo),
        ("primary_slot_name", Names::slot_of(pod)),
        // Queries on the replica hold back the primary's vacuum rather than being cancelled.
        ("hot_standby_feedback", "on".into()),
        ("recovery_target_timeline", "latest".into()),
        // A reply every second: the primary sees at once a replica that stops (with
        // `synchronous.dataDurability: Preferred` it stops waiting for it: `synchronous.rs`).
        ("wal_receiver_status_interval", "1s".into()),
        // A primary that went silent (its node stopped, no reset ever comes) is given up in
        // 10 s rather than PostgreSQL's 60, and the next try comes a second later: the
        // replica follows a promoted one through the Service soon after the failover.
        ("wal_receiver_timeout", "10s".into()),
        ("wal_retrieve_retry_interval", "1s".into()),
    ]
}

/// Makes sure a replica's data directory starts in standby.
pub fn mark_standby(pgdata: &Path) -> Result<(), InstanceError> {
    let signal = pgdata.join("standby.signal");
    if !signal.exists() {
        std::fs::write(&signal, b"").map_err(io("writing standby.signal"))?;
    }
    Ok(())
}

/// Copies the primary at `host` into `staged` (a folder beside the data directory), trying
/// again while the primary cannot be reached yet.
pub async fn clone_primary(settings: &Settings, host: &str, staged: &Path) -> Result<(), InstanceError> {
    let passfile = write_passfile(settings)?;
    let started = std::time::Instant::now();
    loop {
        if staged.exists() {
            std::fs::remove_dir_all(staged).map_err(io(format!("removing the half-made {}", staged.display())))?;
        }
        let output = Command::new("pg_basebackup")
            .arg(format!("--host={host}"))
            .arg(format!("--port={PORT}"))
            .arg(format!("--username={SUPERUSER}"))
            .arg("--no-password")
            .arg("--pgdata")
            .arg(staged)
            .args(["--wal-method=stream", "--checkpoint=fast"])
            .env("PGPASSFILE", &passfile)
            .env("PGCONNECT_TIMEOUT", "5")
            .output()
            .await
            .map_err(io("running pg_basebackup"))?;
        if output.status.success() {
            info!(%host, "copied the primary");
            return Ok(());
        }
        let said = String::from_utf8_lossy(&output.stderr).trim().to_string();
        if started.elapsed() > CLONE_PATIENCE {
            return Err(InstanceError::Restore(format!(
                "could not copy the primary at {host} for {}s: pg_basebackup said: {said}",
                CLONE_PATIENCE.as_secs()
            )));
        }
        warn!(%host, %said, "cannot copy the primary yet; trying again");
        tokio::time::sleep(CLONE_RETRY).await;
    }
}

/// Prepares the data directory to run as a replica of the primary the plan names.
/// - A former primary (no `standby.signal`) is rewound to the primary's timeline, dropping
///   what it wrote after the two parted (never served again: the new primary's history is the
///   database's), or, if it cannot be rewound, copied anew.
/// - A replica is rewound too when the primary is on a later timeline: with asynchronous
///   replication another replica may have been promoted that had received a little less, and
///   this one, past the point where the timelines parted, could not follow it.
pub async fn prepare(settings: &Settings, plan: &InstancePlan) -> Result<(), InstanceError> {
    let Some(host) = &plan.primary_host else {
        return Ok(());
    };
    let passfile = write_passfile(settings)?;
    let former_primary = !settings.pgdata.join("standby.signal").exists();
    if former_primary {
        info!(primary = %host, "a former primary: rewinding it to follow the primary");
    }
    if let Err(why) = rewind(settings, host, &passfile, former_primary).await {
        warn!(%why, "cannot rewind this instance: copying the primary anew");
        copy_anew(settings, host).await?;
    }
    mark_standby(&settings.pgdata)
}

/// The timeline of the data directory's last checkpoint (or restartpoint), from its control
/// file.
async fn local_timeline(pgdata: &Path) -> Option<u32> {
    control::timeline(&control::read(pgdata).await?)
}

/// The timeline of the primary at `host`, if it answers as a primary.
async fn primary_timeline(settings: &Settings, host: &str) -> Option<u32> {
    let password = std::fs::read_to_string(&settings.superuser_password_file).ok()?;
    let instance = Instance::connect(host, password.trim_end_matches('\n')).await.ok()?;
    instance.primary_timeline().await.ok().flatten()
}

/// Whether the primary at `host` is on a later timeline than this data directory: it was
/// promoted since this instance last followed a primary. None: the primary does not answer.
pub async fn primary_moved_on(settings: &Settings, host: &str) -> Option<bool> {
    let primary = primary_timeline(settings, host).await?;
    let local = local_timeline(&settings.pgdata).await;
    Some(local.is_none_or(|l| primary > l))
}

/// `pg_rewind` against the primary at `host` once it is on a later timeline, tried again
/// while it cannot be reached (`must`: a former primary, which cannot start otherwise) or has
/// not written its new timeline yet. A replica on the primary's timeline needs nothing.
async fn rewind(settings: &Settings, host: &str, passfile: &Path, must: bool) -> Result<(), String> {
    let source = format!(
        "host={host} port={PORT} user={SUPERUSER} dbname=postgres passfile={} connect_timeout=5",
        passfile.display()
    );
    let started = std::time::Instant::now();
    loop {
        let patience_left = started.elapsed() < CLONE_PATIENCE;
        match primary_moved_on(settings, host).await {
            None if !must => {
                info!(%host, "the primary does not answer: starting as a replica as this instance is");
                return Ok(());
            }
            Some(false) if !must => return Ok(()),
            None if patience_left => {
                warn!(%host, "cannot reach the primary to rewind yet; trying again");
            }
            // A primary just promoted writes its new timeline into its control file only at
            // the checkpoint that ends its recovery: until then pg_rewind would see one
            // timeline, rewind nothing, and this instance would start ahead of it, diverged.
            Some(false) if patience_left => {
                info!(%host, "the primary has not finished its promotion checkpoint: rewinding in a moment");
            }
            None | Some(false) => {
                return Err(format!(
                    "the primary at {host} did not answer on a later timeline for {}s",
                    CLONE_PATIENCE.as_secs()
                ));
            }
            Some(true) => {
                // pg_rewind first completes a crash recovery in single-user mode, which
                // refuses standby mode: the instance is marked a standby again afterwards.
                for signal in ["standby.signal", "recovery.signal"] {
                    let _ = std::fs::remove_file(settings.pgdata.join(signal));
                }
                let output = Command::new("pg_rewind")
                    .arg("--target-pgdata")
                    .arg(&settings.pgdata)
                    .arg(format!("--source-server={source}"))
                    .output()
                    .await
                    .map_err(|e| format!("running pg_rewind: {e}"))?;
                let said = format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                );
                if output.status.success() {
                    info!(said = %last_line(&said), "rewound to the primary's timeline");
                    return Ok(());
                }
                let unreachable = said.contains("could not connect") || said.contains("connection to server");
                if !unreachable || !patience_left {
                    return Err(last_line(&said).to_string());
                }
                warn!(%host, said = %last_line(&said), "cannot reach the primary to rewind yet; trying again");
            }
        }
        tokio::time::sleep(CLONE_RETRY).await;
    }
}

/// The last line of what a tool said (the reason it gives up, or its summary).
fn last_line(said: &str) -> &str {
    said.lines().map(str::trim).rfind(|l| !l.is_empty()).unwrap_or_default()
}

/// Replaces the data directory with a new copy of the primary.
async fn copy_anew(settings: &Settings, host: &str) -> Result<(), InstanceError> {
    let staged = settings.pgdata.with_extension("clone");
    clone_primary(settings, host, &staged).await?;
    mark_standby(&staged)?;
    std::fs::remove_dir_all(&settings.pgdata)
        .map_err(io(format!("removing the data directory {}", settings.pgdata.display())))?;
    super::put_in_place(&staged, &settings.pgdata)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(primary: Option<&str>) -> InstancePlan {
        InstancePlan {
            primary: primary.map(str::to_string),
            primary_host: primary.map(|_| "shop-rw.prod.svc".to_string()),
            ..Default::default()
        }
    }

    #[test]
    fn every_instance_but_the_plans_primary_is_a_replica_of_it() {
        assert_eq!(role(&plan(Some("shop-0")), Some("shop-0")), Role::Primary);
        assert_eq!(
            role(&plan(Some("shop-0")), Some("shop-2")),
            Role::Replica {
                host: "shop-rw.prod.svc".into(),
                pod: "shop-2".into()
            }
        );
        // A plan or a pod that names no primary: one instance, as before replicas.
        assert_eq!(role(&plan(None), Some("shop-2")), Role::Primary);
        assert_eq!(role(&plan(Some("shop-0")), None), Role::Primary);
    }

    #[test]
    fn a_replica_follows_the_primary_through_its_own_slot_with_a_password_file() {
        let settings = Settings {
            pgdata: crate::postgres::names::PGDATA.into(),
            socket_dir: "/controller/run".into(),
            superuser_password_file: "/etc/noops/superuser/password".into(),
            plan_file: "/etc/noops/instance/plan.json".into(),
            archive: None,
            pod_name: Some("shop-1".into()),
            namespace: Some("prod".into()),
            lease: Some("shop-primary".into()),
        };
        let standby = standby_settings(&settings, "shop-rw.prod.svc", "shop-1");
        let conninfo = &standby.iter().find(|(k, _)| *k == "primary_conninfo").unwrap().1;
        assert!(
            conninfo.contains("host=shop-rw.prod.svc port=5432 user=postgres"),
            "{conninfo}"
        );
        assert!(
            conninfo.contains("passfile=/controller/pgpass application_name=shop-1"),
            "{conninfo}"
        );
        assert!(!conninfo.contains("password="), "{conninfo}");
        // The WAL receiver's connection attempts are bounded by the kernel, not libpq.
        assert!(conninfo.contains("tcp_user_timeout=3000"), "{conninfo}");
        assert!(
            conninfo.ends_with("target_session_attrs=read-write"),
            "only from a primary: {conninfo}"
        );
        assert!(standby.contains(&("primary_slot_name", "noops_shop_1".into())));
    }
}
