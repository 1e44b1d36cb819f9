//! A cluster's backups, from its side: the scheduled EtcdBackup that is due is created, the
//! scheduled ones beyond `maxBackups` are deleted (their snapshots go with them), and the
//! status counts what is kept and says how the newest finished backup went (`BackupSucceeded`). The EtcdBackup controller takes the snapshots.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client, ResourceExt};
use noops_api::EtcdCluster;
use noops_api::etcd_backup::{EtcdBackup, EtcdBackupSpec};
use tracing::info;

use super::names::{CLUSTER_LABEL, Names};
use crate::core::Result;
use crate::core::apply::{create_if_missing, delete_if_present};
use crate::core::backup::schedule::{self, Kept, SCHEDULED_LABEL};
use crate::core::conditions::Decided;

/// The UID of the EtcdCluster a scheduled backup was made for (a cluster deleted and made
/// again under the same name is another cluster).
pub const CLUSTER_UID_LABEL: &str = "noops.dev/etcdcluster-uid";

/// The cluster's condition that says how its newest finished backup went.
pub const BACKUP_SUCCEEDED: &str = "BackupSucceeded";

/// The backup bookkeeping kept in the cluster's status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Book {
    pub last_scheduled_time: Option<Time>,
    pub last_backup_time: Option<Time>,
    pub stored_backups: Option<i32>,
    /// [`BACKUP_SUCCEEDED`]: the newest finished backup succeeded, or why it failed.
    pub condition: Option<Decided>,
}

impl Book {
    /// As the last status left it.
    pub fn of(cluster: &EtcdCluster) -> Self {
        let status = cluster.status.clone().unwrap_or_default();
        let condition = status.conditions.iter().find(|c| c.type_ == BACKUP_SUCCEEDED).map(|c| {
            let stored = c.status == "True";
            Decided::new(BACKUP_SUCCEEDED, stored, reason(stored), c.message.clone())
        });
        Self {
            last_scheduled_time: status.last_scheduled_time,
            last_backup_time: status.last_backup_time,
            stored_backups: status.stored_backups,
            condition,
        }
    }
}

fn reason(stored: bool) -> &'static str {
    if stored { "BackupStored" } else { "BackupFailed" }
}

fn succeeded(backup: &EtcdBackup) -> bool {
    backup.status.as_ref().and_then(|s| s.progress.phase.as_deref()) == Some("Succeeded")
}

/// Whether this pass looks at the backups. While a membership operation is in progress passes
/// come every half second; the backups (two LISTs) are looked at then only when a scheduled
/// backup is due, and otherwise once the cluster is settled. Pure.
pub fn worth_a_look(cluster: &EtcdCluster, book: &Book, busy: bool, now: jiff::Timestamp) -> bool {
    let Some(spec) = cluster.spec.backup.as_ref() else {
        return false;
    };
    if !busy {
        return true;
    }
    let Some(cron) = spec.schedule.as_deref().and_then(|s| schedule::parse(s).ok()) else {
        return false;
    };
    let last = book.last_scheduled_time.as_ref().map_or(now, |t| t.0);
    schedule::due(&cron, last, now).is_ok_and(|due| due.now.is_some())
}

/// Makes the backup that is due, applies retention and counts the backups kept; returns when
/// the next scheduled backup is due, if there is a schedule. Nothing for a cluster without
/// `spec.backup`. A schedule that cannot be read is
/// reported by validation and makes nothing here.
pub async fn keep(
    cluster: &EtcdCluster,
    names: &Names,
    client: &Client,
    book: &mut Book,
    now: jiff::Timestamp,
) -> Result<Option<Duration>> {
    let Some(spec) = cluster.spec.backup.as_ref() else {
        return Ok(None);
    };
    let api: Api<EtcdBackup> = Api::namespaced(client.clone(), &names.namespace);
    let all = api.list(&ListParams::default()).await?.items;
    // This cluster's, not those of an earlier cluster of the same name: by the etcd cluster
    // they were taken from, or (scheduled ones not taken yet) by the EtcdCluster's UID.
    let uid = cluster.metadata.uid.clone().unwrap_or_default();
    let cluster_id = cluster.status.as_ref().and_then(|s| s.cluster_id.clone());
    let mine: Vec<&EtcdBackup> = all
        .iter()
        .filter(|b| b.spec.cluster == names.cluster)
        .filter(|b| {
            let taken_from = b.status.as_ref().and_then(|s| s.cluster_id.clone());
            let made_for = b.labels().get(CLUSTER_UID_LABEL).cloned();
            match (taken_from, made_for) {
                (Some(id), _) => Some(id) == cluster_id,
                (None, Some(made_for)) => made_for == uid,
                (None, None) => true,
            }
        })
        .collect();
    // Backups a new cluster is being restored from are never deleted under it.
    let clusters: Api<EtcdCluster> = Api::namespaced(client.clone(), &names.namespace);
    let restoring: Vec<EtcdCluster> = clusters.list(&ListParams::default()).await?.items;
    let in_use = |name: &str| restoring.iter().any(|c| restores_from(c, name));

    let mut look_again = None;
    if let Some(cron) = spec.schedule.as_deref().and_then(|s| schedule::parse(s).ok()) {
        // A schedule first seen now makes its first backup at its next time.
        let last = book.last_scheduled_time.as_ref().map_or(now, |t| t.0);
        let due = schedule::due(&cron, last, now).map_err(|e| crate::core::Error::InvalidSpec(e.to_string()))?;
        if let Some(at) = due.now {
            let name = schedule::backup_name(&names.cluster, at);
            let backup = EtcdBackup {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(names.namespace.clone()),
                    // Not owned by the cluster: backups outlive it (to restore from).
                    labels: Some(
                        [
                            (CLUSTER_LABEL.to_string(), names.cluster.clone()),
                            (CLUSTER_UID_LABEL.to_string(), uid.clone()),
                            (SCHEDULED_LABEL.to_string(), "true".to_string()),
                        ]
                        .into(),
                    ),
                    ..Default::default()
                },
                spec: EtcdBackupSpec {
                    cluster: names.cluster.clone(),
                },
                status: None,
            };
            if create_if_missing(&api, &backup).await? {
                info!(backup = %name, "made the scheduled backup");
            }
        }
        book.last_scheduled_time = Some(Time(due.now.unwrap_or(last)));
        look_again = Some(Duration::try_from(due.next.duration_since(now)).unwrap_or_default());
    }

    let scheduled: Vec<Kept> = mine
        .iter()
        .filter(|b| b.labels().get(SCHEDULED_LABEL).map(String::as_str) == Some("true"))
        .filter(|b| b.metadata.deletion_timestamp.is_none() && !in_use(&b.name_any()))
        .map(|b| Kept {
            name: b.name_any(),
            created: b.creation_timestamp().map_or(now, |t| t.0),
            succeeded: succeeded(b),
        })
        .collect();
    let max = usize::try_from(spec.max_backups).unwrap_or(1).max(1);
    let gone = schedule::to_delete(&scheduled, max);
    for name in &gone {
        if delete_if_present(&api, name, &DeleteParams::default()).await? {
            info!(backup = %name, max_backups = max, "deleted a scheduled backup beyond maxBackups");
        }
    }
    let kept: Vec<&EtcdBackup> = mine.into_iter().filter(|b| !gone.contains(&b.name_any())).collect();
    count(book, &kept);
    Ok(look_again)
}

/// Counts the successful backups, the time of the newest, and how the newest finished one
/// went.
fn count(book: &mut Book, backups: &[&EtcdBackup]) {
    let counted: Vec<schedule::Counted> = backups
        .iter()
        .map(|b| {
            let status = b.status.as_ref();
            schedule::Counted {
                name: b.name_any(),
                phase: status.and_then(|s| s.progress.phase.clone()),
                completed: status.and_then(|s| s.progress.completed_at.as_ref()).map(|t| t.0),
                deleting: b.metadata.deletion_timestamp.is_some(),
            }
        })
        .collect();
    let tally = schedule::tally(&counted);
    book.stored_backups = Some(tally.stored);
    book.last_backup_time = tally
        .newest_stored
        .map(|(_, at)| Time(at))
        .or(book.last_backup_time.clone());
    if let Some((index, stored)) = tally.newest_finished {
        let backup = backups[index];
        let status = backup.status.clone().unwrap_or_default();
        let message = if stored {
            format!(
                "EtcdBackup {} stored revision {} at {}",
                backup.name_any(),
                status.revision.unwrap_or_default(),
                status.progress.location.unwrap_or_default()
            )
        } else {
            schedule::failure("EtcdBackup", &backup.name_any(), &status.progress.conditions)
        };
        book.condition = Some(Decided::new(BACKUP_SUCCEEDED, stored, reason(stored), message));
    }
}

/// Whether `cluster` is a new cluster still starting from backup `name`.
pub fn restores_from(cluster: &EtcdCluster, name: &str) -> bool {
    cluster.status.as_ref().and_then(|s| s.cluster_id.as_ref()).is_none()
        && cluster
            .spec
            .bootstrap
            .as_ref()
            .and_then(|b| b.from_backup.as_ref())
            .is_some_and(|b| b.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::fixtures;
    use noops_api::etcd::{BackupSpec, VolumeDestination};

    fn at(seconds: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(seconds).unwrap_or_default()
    }

    fn hourly() -> EtcdCluster {
        let mut cluster = fixtures::cluster().build();
        cluster.spec.backup = Some(BackupSpec {
            schedule: Some("0 * * * *".into()),
            max_backups: 3,
            s3: None,
            volume: Some(VolumeDestination {
                claim_name: "etcd-backups".into(),
                prefix: "etcd".into(),
                engine: std::marker::PhantomData,
            }),
        });
        cluster
    }

    #[test]
    fn a_busy_cluster_looks_at_its_backups_only_when_one_is_due() {
        let book = Book {
            last_scheduled_time: Some(Time(at(3600))),
            ..Default::default()
        };
        let cluster = hourly();
        assert!(worth_a_look(&cluster, &book, false, at(3700)), "settled: always");
        assert!(!worth_a_look(&cluster, &book, true, at(3700)), "busy, nothing due");
        assert!(
            worth_a_look(&cluster, &book, true, at(7201)),
            "busy, the 02:00 backup is due"
        );
        let without = fixtures::cluster().build();
        assert!(!worth_a_look(&without, &book, false, at(3700)), "no spec.backup");
    }

    fn finished(name: &str, phase: &str, completed: i64) -> EtcdBackup {
        let mut backup = EtcdBackup::new(name, EtcdBackupSpec { cluster: "main".into() });
        backup.status = Some(
            serde_json::from_value(serde_json::json!({
                "phase": phase,
                "revision": 42,
                "location": format!("pvc://etcd-backups/etcd/main/{name}.db"),
                "completedAt": at(completed),
                "conditions": [{
                    "type": "Succeeded", "status": if phase == "Succeeded" { "True" } else { "False" },
                    "reason": if phase == "Succeeded" { "Stored" } else { "ClaimNotFound" },
                    "message": "why", "lastTransitionTime": at(completed)
                }]
            }))
            .unwrap(),
        );
        backup
    }

    #[test]
    fn the_condition_follows_the_newest_finished_backup() {
        let (old, failed, running) = (
            finished("old", "Succeeded", 100),
            finished("new", "Failed", 200),
            finished("running", "Running", 300),
        );
        let mut book = Book::default();
        count(&mut book, &[&old, &failed, &running]);
        let condition = book.condition.clone().unwrap();
        assert_eq!((condition.status, condition.reason), (false, "BackupFailed"));
        assert_eq!(condition.message, "EtcdBackup new failed: ClaimNotFound: why");
        assert_eq!(book.stored_backups, Some(1), "a failure still leaves the older backup");
        let newer = finished("newer", "Succeeded", 250);
        count(&mut book, &[&old, &failed, &newer]);
        let condition = book.condition.unwrap();
        assert_eq!((condition.status, condition.reason), (true, "BackupStored"));
        assert!(
            condition.message.contains("newer stored revision 42 at pvc://"),
            "{}",
            condition.message
        );
    }
}
