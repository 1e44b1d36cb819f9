//! The instance and the database in it, as one pass sees them: where the instance stands (from
//! its pod), and, once it serves, what the operator makes in it as the superuser (the owner,
//! its password, the database) and what it learns from it (WAL archiving, what a restore
//! recovered).

use noops_api::PostgreSQL;
use noops_api::postgres::{PostgreSQLStatus, RestoreStatus};

use super::instance::progress;
use super::names::{Names, RESTORE_RECORD_BESIDE_DATA};
use super::observe::{self, Bootstrap};
use super::replication;
use super::secrets::{self, Password, PasswordProblem};
use super::sql::{Archiver, Instance, InstanceFacts, Replication, SqlError};
use super::status::InstanceState;
use super::synchronous;
use crate::core::stuck::stuck;

/// What a pass did in the database, and what it learnt there.
#[derive(Debug, Default)]
pub struct InDatabase {
    /// The database and its owner are there.
    pub database_ready: bool,
    pub user_created: bool,
    pub database_created: bool,
    pub password_set: bool,
    /// The password Secret version the database has now.
    pub password_version: Option<String>,
    /// The WAL archiver's report (with a backup destination).
    pub archiver: Option<Archiver>,
    /// What the restore that made the data directory recovered, if it was restored.
    pub restore: Option<RestoreStatus>,
    /// How far a restore under way has got.
    pub restoring: Option<noops_api::backup::WorkProgress>,
    /// What the primary says of its replicas (once it serves).
    pub replication: Option<Replication>,
    /// Replication slots made and dropped this pass.
    pub slots_made: Vec<String>,
    pub slots_dropped: Vec<String>,
    /// The primary's synchronous replication, and the list it was given this pass (if
    /// changed).
    pub synchronous: Option<synchronous::Seen>,
    pub synchronous_set: Option<String>,
}

/// Where the instance stands and, if it serves, what this pass made in it.
pub async fn instance_and_database(
    pg: &PostgreSQL,
    (names, primary): (&Names, &str),
    previous: &PostgreSQLStatus,
    pod: Option<&k8s_openapi::api::core::v1::Pod>,
    superuser_password: &str,
    password: &Result<Password, PasswordProblem>,
    may_change: bool,
) -> (InstanceState, InDatabase) {
    match pod.map(observe::bootstrap) {
        Some(Bootstrap::Failed(message)) => return (InstanceState::BootstrapFailed(message), InDatabase::default()),
        Some(Bootstrap::Working) => {
            // A restore says how far it has got; a new database's initdb says nothing.
            let address = pod.and_then(|p| p.status.as_ref()?.pod_ip.clone());
            let restoring = match address {
                Some(ip) => progress::read(&ip).await,
                None => None,
            };
            return (
                InstanceState::Bootstrapping,
                InDatabase {
                    restoring,
                    ..Default::default()
                },
            );
        }
        _ => {}
    }
    if let Some(stuck) = pod.and_then(|p| stuck([p], jiff::Timestamp::now())) {
        return (InstanceState::Stuck(stuck), InDatabase::default());
    }
    let Some(ip) = pod.and_then(observe::ready_address) else {
        let why = match pod {
            None => format!("waiting for pod {primary} (StatefulSet {})", names.statefulset()),
            Some(_) => format!("pod {primary} is starting: recovering its database"),
        };
        return (InstanceState::Starting(why), InDatabase::default());
    };
    let served = async {
        let instance = Instance::connect(&ip, superuser_password).await?;
        // Chosen by a failover and not promoted yet: it takes no writes so far.
        if instance.in_recovery().await? {
            return Ok(None);
        }
        let facts = instance.facts().await?;
        let restore = match instance.read_file(RESTORE_RECORD_BESIDE_DATA).await? {
            Some(text) => serde_json::from_str::<RestoreStatus>(&text).ok(),
            None => None,
        };
        let mut made = make_database(pg, previous, &instance, &facts, password, restore.as_ref(), may_change).await?;
        made.restore = restore;
        if pg.spec.backup.is_some() {
            made.archiver = Some(instance.archiver().await?);
        }
        keep_replication(pg, (names, primary), &instance, &mut made, may_change).await?;
        Ok::<_, SqlError>(Some((facts, made)))
    };
    match served.await {
        Ok(Some((facts, made))) => (InstanceState::Serving(facts), made),
        Ok(None) => (
            InstanceState::Starting(format!("{primary} is being promoted: it takes writes once it has")),
            InDatabase::default(),
        ),
        Err(e) => (InstanceState::Unreachable(e.to_string()), InDatabase::default()),
    }
}

/// The primary's replication slots, one per replica the spec asks for (made before the
/// replica copies the primary, or soon after: `wal_keep_size` bridges the gap), a slot of an
/// instance scaled away dropped once unused; its synchronous replication as the spec asks
/// (`synchronous.rs`); and what the primary says of its replicas.
async fn keep_replication(
    pg: &PostgreSQL,
    (names, primary): (&Names, &str),
    instance: &Instance,
    made: &mut InDatabase,
    may_change: bool,
) -> Result<(), SqlError> {
    let mut replication = instance.replication().await?;
    if may_change {
        let wanted = replication::wanted_slots(names, pg.spec.instances, primary);
        let (make, drop) = replication::slot_changes(&wanted, &replication.slots);
        for slot in &make {
            instance.ensure_slot(slot).await?;
            replication.slots.push((slot.clone(), false));
        }
        for slot in &drop {
            instance.drop_slot(slot).await?;
            replication.slots.retain(|(s, _)| s != slot);
        }
        made.slots_made = make;
        made.slots_dropped = drop;
    }
    let streaming = synchronous::streaming(&replication.standbys, names, pg.spec.instances);
    let sync = pg.spec.synchronous.as_ref();
    let wanted = synchronous::standby_names(sync, names, pg.spec.instances, primary, &streaming);
    if may_change && wanted != replication.synchronous_standby_names {
        instance.set_synchronous_standby_names(&wanted).await?;
        replication.synchronous_standby_names = wanted.clone();
        made.synchronous_set = Some(wanted);
    }
    made.synchronous = Some(synchronous::Seen {
        synchronous: synchronous::named(&replication.synchronous_standby_names, &streaming),
        setting: replication.synchronous_standby_names.clone(),
    });
    made.replication = Some(replication);
    Ok(())
}

/// Makes the owner, sets the password when the Secret has a new one (or the data directory is
/// a new one, or restored anew), and makes the database; unless it `may_change` nothing
/// (paused), when it only looks.
async fn make_database(
    pg: &PostgreSQL,
    previous: &PostgreSQLStatus,
    instance: &Instance,
    facts: &InstanceFacts,
    password: &Result<Password, PasswordProblem>,
    restore: Option<&RestoreStatus>,
    may_change: bool,
) -> Result<InDatabase, SqlError> {
    let (db, user) = (&pg.spec.db, &pg.spec.user);
    let restored_anew =
        restore.is_some_and(|r| previous.restore.as_ref().map(|p| &p.completed_at) != Some(&r.completed_at));
    let (true, Ok(password)) = (may_change, password) else {
        // Paused, or the password cannot be read: nothing is changed; the database may still
        // be there.
        let database_ready = instance.has_database_and_user(db, user).await?;
        let same_database =
            previous.system_identifier.as_deref() == Some(facts.system_identifier.as_str()) && !restored_anew;
        return Ok(InDatabase {
            database_ready,
            password_version: previous.password_secret_version.clone().filter(|_| same_database),
            ..Default::default()
        });
    };
    let user_created = instance.ensure_user(user, &password.value).await?;
    let password_set =
        !user_created && (restored_anew || secrets::needs_setting(previous, password, &facts.system_identifier));
    if password_set {
        instance.set_password(user, &password.value).await?;
    }
    let database_created = instance.ensure_database(db, user).await?;
    Ok(InDatabase {
        database_ready: true,
        user_created,
        database_created,
        password_set,
        password_version: Some(password.version.clone()),
        ..Default::default()
    })
}
