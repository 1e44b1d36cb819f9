//! What an instance that finds its data directory empty does: initialise a new database, or
//! restore one from a base backup and the WAL archived after it. Decided<PostgreSQLReason> here, pure, from the
//! PostgreSQL and its backups, and written into the ConfigMap `<name>-instance` that the
//! instance's pod mounts (kept current as backups come and go, without restarting the pod);
//! the pod's `bootstrap` init container does what it says (`instance/bootstrap.rs`).
//!
//! - A database that has run is restored from its newest successful base backup in its
//!   current backup destination (one taken from this PostgreSQL, not from an earlier one of the
//!   same name), and every WAL segment archived after it. A database restored once stays the
//!   same database (the same system identifier): its later backups count.
//! - A new database with `bootstrap.fromBackup` is restored from that backup, to its end or to
//!   `targetTime`. Once it has run it is another database: it never goes back to its source
//!   (that would drop its own commits and replay the source's).
//! - A database that has run and has base backups, none of them in its current destination
//!   (the destination was changed, or removed, since), is **held**: restoring would need a
//!   store the pod is no longer given, and `initdb` would silently replace a database that can
//!   still be recovered with an empty one. Its bootstrap fails with what to do instead.
//! - Anything else is a new, empty database.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use noops_api::backup::BackupPhase;
use noops_api::postgres::PostgreSQLReason;
use noops_api::postgres::{BackupLocation, PostgreSQL};
use noops_api::postgres_backup::PostgresBackup;
use serde::{Deserialize, Serialize};

use super::names::Names;
use super::problem::PlanProblem;
use super::store::{BaseBackupDestination, Destination};

/// Where the pod mounts the ConfigMap, and the file of the plan in it.
pub const PLAN_DIR: &str = "/etc/noops/instance";
pub const PLAN_FILE: &str = "plan.json";

/// What an empty data directory becomes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstancePlan {
    /// Restored from a backup; without it, initialised empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestorePlan>,
    /// Without a restore: why the data directory must not be made anew either (what the
    /// bootstrap fails with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initdb_refused: Option<String>,
    /// The instance (pod) that is the primary: the empty data directory of any other is a
    /// copy of it, and runs as its replica (`instance/replica.rs`). None: a single instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<String>,
    /// Where replicas reach the primary (the `-rw` Service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_host: Option<String>,
    /// The primary's lease (a database with replicas): an instance then starts only as the
    /// lease says (`postgres/lease.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
}

/// A restore: which base backup, where it and its WAL are, and how far to replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestorePlan {
    /// The PostgresBackup.
    pub backup: String,
    /// Which of the pod's stores holds it.
    pub from: From,
    /// The base backup's folder, and the WAL's.
    pub base: String,
    pub wal: String,
    /// The base backup's SHA-256, checked as it is read.
    pub sha256: String,
    /// The database it is a backup of.
    pub system_identifier: String,
    /// Replay no transaction that committed after this (RFC 3339); all of them without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_time: Option<String>,
}

/// Which store of the pod a restore reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum From {
    /// The database's own backup destination.
    Own,
    /// The destination of the `bootstrap.fromBackup` backup.
    Source,
}

fn succeeded(backup: &PostgresBackup) -> bool {
    backup.status.as_ref().and_then(|s| s.progress.phase) == Some(BackupPhase::Succeeded)
}

/// The newest successful base backup of `pg` (the same database, in its current destination).
pub fn newest_own<'a>(pg: &PostgreSQL, backups: &'a [PostgresBackup]) -> Option<&'a PostgresBackup> {
    let destination = pg.spec.backup.as_ref().and_then(Destination::of_spec)?;
    newest_restorable(pg, backups, |location| {
        Destination::of_location(location).as_ref() == Some(&destination)
    })
}

/// The newest successful base backup of this database (its system identifier) whose
/// destination passes `in_place`.
fn newest_restorable<'a>(
    pg: &PostgreSQL,
    backups: &'a [PostgresBackup],
    in_place: impl Fn(&BackupLocation) -> bool,
) -> Option<&'a PostgresBackup> {
    let system_id = pg.status.as_ref()?.system_identifier.as_deref()?;
    super::backups::of_database(pg, backups)
        .into_iter()
        .filter(|b| succeeded(b) && b.metadata.deletion_timestamp.is_none())
        .filter(|b| {
            let status = b.status.as_ref();
            status.and_then(|s| s.system_identifier.as_deref()) == Some(system_id)
                && status.and_then(|s| s.destination.as_ref()).is_some_and(&in_place)
        })
        .max_by_key(|b| {
            (
                b.status
                    .as_ref()
                    .and_then(|s| s.progress.completed_at.clone())
                    .map(|t| t.0),
                b.name_any(),
            )
        })
}

/// What an empty data directory of `pg` becomes, given the backups in its namespace: the
/// primary's, as below; any other instance's, a copy of the primary.
pub fn plan(pg: &PostgreSQL, backups: &[PostgresBackup]) -> Result<InstancePlan, PlanProblem> {
    let names = Names::of(pg);
    let mut plan = for_primary(primary_plan(pg, backups)?, &names, &names.instance(), pg.spec.instances);
    // With replicas, the primary's empty volume is neither restored (the replicas could not
    // follow it onto a new timeline) nor made anew (that would replace the database they
    // hold).
    let has_run = pg.status.as_ref().and_then(|s| s.system_identifier.as_ref()).is_some();
    if pg.spec.instances > 1 && has_run {
        plan.restore = None;
        plan.initdb_refused = Some(
            "the primary's data directory is empty and its replicas hold the database: the operator does not fail over to a replica yet. Promote one by hand, or set instances to 1 to restore the primary from its backups (the replicas' volumes are kept)".into(),
        );
    }
    Ok(plan)
}

/// `plan` for a database whose primary is `primary`: an instance's empty data directory is a
/// copy of it, and with replicas an instance starts as the primary's lease says.
pub fn for_primary(mut plan: InstancePlan, names: &Names, primary: &str, instances: i32) -> InstancePlan {
    plan.primary = Some(primary.to_string());
    plan.primary_host = Some(names.primary_host());
    plan.lease = (instances > 1).then(|| names.lease());
    plan
}

/// What an empty data directory of the primary becomes.
fn primary_plan(pg: &PostgreSQL, backups: &[PostgresBackup]) -> Result<InstancePlan, PlanProblem> {
    if let Some(own) = newest_own(pg, backups) {
        return Ok(InstancePlan {
            restore: restore_from(own, From::Own, None),
            ..Default::default()
        });
    }
    if let Some(why) = backed_up_elsewhere(pg, backups) {
        return Ok(InstancePlan {
            initdb_refused: Some(why),
            ..Default::default()
        });
    }
    let Some(source) = pg.spec.bootstrap.as_ref().and_then(|b| b.from_backup.as_ref()) else {
        return Ok(InstancePlan::default());
    };
    // A database that has run is no longer its source: without a backup of its own, a lost
    // volume leaves nothing to restore.
    if pg.status.as_ref().and_then(|s| s.system_identifier.as_ref()).is_some() {
        return Ok(InstancePlan::default());
    }
    let backup = bootstrap_backup(pg, backups)?;
    if let Some(target) = &source.target_time {
        let target: jiff::Timestamp = target.parse().map_err(|e| PlanProblem {
            reason: PostgreSQLReason::InvalidTargetTime,
            message: format!("bootstrap.fromBackup.targetTime {target:?} is not a time: {e}"),
        })?;
        let ended = backup
            .status
            .as_ref()
            .and_then(|s| s.progress.completed_at.as_ref())
            .map(|t| t.0);
        if let Some(ended) = ended.filter(|ended| target < *ended) {
            return Err(PlanProblem {
                reason: PostgreSQLReason::TargetBeforeBackup,
                message: format!(
                    "bootstrap.fromBackup.targetTime {target} is before PostgresBackup {} ended ({ended}): a base backup restores to its end or later; choose a later time or an earlier backup",
                    source.name
                ),
            });
        }
    }
    let restore = restore_from(backup, From::Source, source.target_time.clone()).ok_or_else(|| PlanProblem {
        reason: PostgreSQLReason::BootstrapBackupUnusable,
        message: format!("PostgresBackup {} does not say where it is", source.name),
    })?;
    Ok(InstancePlan {
        restore: Some(restore),
        ..Default::default()
    })
}

/// Why a database that ran must not be made anew although none of its backups is in its
/// current destination: it has some elsewhere (the newest named), from which it can still be
/// restored.
fn backed_up_elsewhere(pg: &PostgreSQL, backups: &[PostgresBackup]) -> Option<String> {
    let system_id = pg.status.as_ref()?.system_identifier.as_deref()?;
    let newest = newest_restorable(pg, backups, |_| true)?;
    let location = newest.status.as_ref()?.destination.as_ref()?;
    let at = Destination::of_location(location)?.url(&location.base);
    let now = match pg.spec.backup.as_ref().and_then(Destination::of_spec) {
        Some(destination) => format!("none is in its current destination ({})", destination.url("")),
        None => "spec.backup is not set".to_string(),
    };
    Some(format!(
        "the database ran (system identifier {system_id}) and its data directory is empty, but {now}: its newest base backup, {}, is at {at}. It is neither restored nor made a new, empty database: set spec.backup back to that destination to restore it from there (or, to give those backups up, delete them: it is then made anew)",
        newest.name_any()
    ))
}

/// The successful PostgresBackup `bootstrap.fromBackup` names, or why it cannot be used.
pub fn bootstrap_backup<'a>(pg: &PostgreSQL, backups: &'a [PostgresBackup]) -> Result<&'a PostgresBackup, PlanProblem> {
    let name = pg
        .spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.from_backup.as_ref())
        .map(|b| b.name.as_str())
        .unwrap_or_default();
    let backup = backups
        .iter()
        .find(|b| b.name_any() == name)
        .ok_or_else(|| PlanProblem {
            reason: PostgreSQLReason::BootstrapBackupNotFound,
            message: format!("PostgresBackup {name:?} (bootstrap.fromBackup) does not exist in this namespace"),
        })?;
    match backup.status.as_ref().and_then(|s| s.progress.phase) {
        Some(BackupPhase::Succeeded) => Ok(backup),
        Some(BackupPhase::Failed) => Err(PlanProblem {
            reason: PostgreSQLReason::BootstrapBackupFailed,
            message: format!("PostgresBackup {name} failed: there is nothing to restore from it"),
        }),
        _ => Err(PlanProblem {
            reason: PostgreSQLReason::BootstrapBackupNotReady,
            message: format!("PostgresBackup {name} has not finished yet"),
        }),
    }
}

/// Where the bootstrap backup is, once it can be used: the pod is built to reach it.
pub fn bootstrap_location(pg: &PostgreSQL, backups: &[PostgresBackup]) -> Option<BackupLocation> {
    bootstrap_backup(pg, backups).ok()?.status.as_ref()?.destination.clone()
}

fn restore_from(backup: &PostgresBackup, from: From, target_time: Option<String>) -> Option<RestorePlan> {
    let status = backup.status.as_ref()?;
    let location = status.destination.as_ref()?;
    Some(RestorePlan {
        backup: backup.name_any(),
        from,
        base: location.base.clone(),
        wal: location.wal.clone(),
        sha256: status.progress.sha256.clone()?,
        system_identifier: status.system_identifier.clone()?,
        target_time,
    })
}

/// The ConfigMap that carries the plan to the pod.
pub fn config_map(names: &Names, owner: &OwnerReference, plan: &InstancePlan) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(names.instance_config()),
            namespace: Some(names.namespace.clone()),
            labels: Some(names.labels()),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        data: Some(
            [(
                PLAN_FILE.to_string(),
                serde_json::to_string_pretty(plan).unwrap_or_else(|_| "{}".into()),
            )]
            .into(),
        ),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An empty data directory of the primary is initialised, neither restored nor held.
    fn made_anew(plan: InstancePlan) -> bool {
        plan.restore.is_none() && plan.initdb_refused.is_none()
    }
    use crate::postgres::fixtures::{backup, postgres, with_backups};
    use noops_api::postgres::{BackupSource, BootstrapSpec};

    fn ran(mut pg: PostgreSQL, system_id: &str) -> PostgreSQL {
        pg.status = Some(noops_api::postgres::PostgreSQLStatus {
            system_identifier: Some(system_id.into()),
            ..Default::default()
        });
        pg
    }

    #[test]
    fn backups_of_an_earlier_postgresql_of_the_same_name_and_data_are_not_restored() {
        // InDatabase again from one of its own old backups: the same system identifier.
        let mut pg = ran(with_backups(postgres("shop")), "111");
        pg.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::from_second(1000).unwrap(),
        ));
        let mut old = backup("shop-1", "shop", "Succeeded", "111", 500);
        old.metadata.labels = Some(
            [(
                super::super::backups::POSTGRES_UID_LABEL.to_string(),
                "uid-0".to_string(),
            )]
            .into(),
        );
        let mut old_unlabelled = backup("shop-2", "shop", "Succeeded", "111", 600);
        old_unlabelled.metadata.labels = None;
        assert!(made_anew(plan(&pg, &[old, old_unlabelled]).unwrap()));
    }

    #[test]
    fn a_new_database_without_backups_is_initialised() {
        let pg = with_backups(postgres("shop"));
        assert!(made_anew(plan(&pg, &[]).unwrap()));
        // Backups of another database of the same name (an earlier one) are not its own.
        let old = backup("shop-old", "shop", "Succeeded", "111", 100);
        assert!(made_anew(plan(&ran(pg, "222"), &[old]).unwrap()));
    }

    #[test]
    fn a_database_that_ran_is_restored_from_its_newest_successful_backup() {
        let pg = ran(with_backups(postgres("shop")), "111");
        let backups = [
            backup("shop-1", "shop", "Succeeded", "111", 100),
            backup("shop-2", "shop", "Succeeded", "111", 200),
            backup("shop-3", "shop", "Failed", "111", 300),
            backup("shop-4", "shop", "Running", "111", 400),
            backup("other-9", "other", "Succeeded", "111", 900),
        ];
        let restore = plan(&pg, &backups).unwrap().restore.unwrap();
        assert_eq!(restore.backup, "shop-2");
        assert_eq!(restore.from, From::Own);
        assert_eq!(restore.base, "postgres/prod/shop/base/shop-2");
        assert_eq!(restore.wal, "postgres/prod/shop/wal/111");
        assert_eq!(restore.target_time, None, "to the end of the archive");
    }

    #[test]
    fn a_backup_in_another_destination_is_not_restored_with_this_ones_wal() {
        let pg = ran(with_backups(postgres("shop")), "111");
        let mut moved = backup("shop-1", "shop", "Succeeded", "111", 100);
        if let Some(d) = moved.status.as_mut().and_then(|s| s.destination.as_mut()) {
            d.s3.as_mut().unwrap().bucket = "old-bucket".into();
        }
        let held = plan(&pg, std::slice::from_ref(&moved)).unwrap();
        assert_eq!(held.restore, None);
        let why = held
            .initdb_refused
            .expect("a database with backups elsewhere is not made anew");
        assert!(why.contains("shop-1") && why.contains("s3://old-bucket/"), "{why}");
        // Without a destination at all, the same.
        let mut unset = pg.clone();
        unset.spec.backup = None;
        let why = plan(&unset, std::slice::from_ref(&moved))
            .unwrap()
            .initdb_refused
            .unwrap();
        assert!(why.contains("spec.backup is not set"), "{why}");
        // Backups of another database (another system identifier) do not hold it back.
        assert!(made_anew(plan(&ran(pg, "222"), &[moved]).unwrap()));
    }

    fn bootstrapped(name: &str, target: Option<&str>) -> PostgreSQL {
        let mut pg = with_backups(postgres("copy"));
        pg.spec.bootstrap = Some(BootstrapSpec {
            from_backup: Some(BackupSource {
                name: name.into(),
                target_time: target.map(str::to_string),
            }),
        });
        pg
    }

    #[test]
    fn a_bootstrap_restores_the_named_backup_to_a_time_after_its_end() {
        let source = backup("shop-1", "shop", "Succeeded", "111", 100);
        let at = |s: i64| jiff::Timestamp::from_second(s).unwrap().to_string();
        let restore = plan(&bootstrapped("shop-1", Some(&at(150))), std::slice::from_ref(&source))
            .unwrap()
            .restore
            .unwrap();
        assert_eq!((restore.backup.as_str(), restore.from), ("shop-1", From::Source));
        assert_eq!(restore.target_time, Some(at(150)));
        let early = plan(&bootstrapped("shop-1", Some(&at(50))), std::slice::from_ref(&source)).unwrap_err();
        assert_eq!(early.reason, PostgreSQLReason::TargetBeforeBackup);
        let reason = |backups: &[PostgresBackup]| plan(&bootstrapped("shop-1", None), backups).unwrap_err().reason;
        assert_eq!(reason(&[]), PostgreSQLReason::BootstrapBackupNotFound);
        assert_eq!(
            reason(&[backup("shop-1", "shop", "Failed", "111", 100)]),
            PostgreSQLReason::BootstrapBackupFailed
        );
        assert_eq!(
            reason(&[backup("shop-1", "shop", "Running", "111", 100)]),
            PostgreSQLReason::BootstrapBackupNotReady
        );
    }

    #[test]
    fn a_bootstrapped_database_with_backups_of_its_own_restores_those() {
        let pg = ran(bootstrapped("shop-1", None), "111");
        let backups = [
            backup("shop-1", "shop", "Succeeded", "111", 100),
            backup("copy-1", "copy", "Succeeded", "111", 300),
        ];
        let restore = plan(&pg, &backups).unwrap().restore.unwrap();
        assert_eq!((restore.backup.as_str(), restore.from), ("copy-1", From::Own));
        // Before its own first backup it has nothing to restore: never its source again, which
        // would drop its own commits.
        assert!(made_anew(plan(&pg, &backups[..1]).unwrap()));
    }

    #[test]
    fn with_replicas_the_plan_names_the_primary_and_an_empty_primary_that_ran_is_held() {
        let mut pg = with_backups(postgres("shop"));
        pg.spec.instances = 3;
        let new = plan(&pg, &[]).unwrap();
        assert_eq!(new.primary.as_deref(), Some("shop-0"));
        assert_eq!(new.primary_host.as_deref(), Some("shop-rw.prod.svc"));
        assert!(
            made_anew(new),
            "a new database: the primary is initialised, the replicas copy it"
        );
        let ran = ran(pg, "111");
        let backups = [backup("shop-1", "shop", "Succeeded", "111", 100)];
        let held = plan(&ran, &backups).unwrap();
        assert_eq!(
            held.restore, None,
            "a restore would leave the replicas on another timeline"
        );
        assert!(held.initdb_refused.unwrap().contains("its replicas hold the database"));
    }
}
