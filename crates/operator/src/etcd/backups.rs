//! A cluster's backups, from its side: the scheduled EtcdBackup that is due is created, the
//! scheduled ones beyond `maxBackups` are deleted (their snapshots go with them), and the
//! status counts what is kept and says how the newest finished backup went (`BackupSucceeded`).
//! The EtcdBackup controller takes the snapshots. The backups are read from a watch cache, so
//! a settled pass costs the API server nothing.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::api::DeleteParams;
use kube::{Api, Client, ResourceExt};
use noops_api::EtcdCluster;
use noops_api::etcd::EtcdClusterReason;
use noops_api::etcd_backup::{EtcdBackup, EtcdBackupSpec};
use tracing::info;

use super::names::{CLUSTER_LABEL, Names};
use crate::core::Result;
use crate::core::apply::{create_if_missing, delete_if_present};
use crate::core::backup::retention::{self, BackupsReason, BackupsSummary};
use crate::core::backup::schedule;

/// The UID of the EtcdCluster a scheduled backup was made for (a cluster deleted and made
/// again under the same name is another cluster).
pub const CLUSTER_UID_LABEL: &str = "noops.dev/etcdcluster-uid";

impl BackupsReason for EtcdClusterReason {
    const BACKUP_STORED: Self = EtcdClusterReason::BackupStored;
    const BACKUP_FAILED: Self = EtcdClusterReason::BackupFailed;
}

/// What the cluster's last status said of its backups.
pub fn summary(cluster: &EtcdCluster) -> BackupsSummary<EtcdClusterReason> {
    let status = cluster.status.clone().unwrap_or_default();
    BackupsSummary::of(&status.conditions, &status.backups)
}

/// The backups of this cluster, not those of an earlier cluster of the same name: by the etcd
/// cluster they were taken from, or (scheduled ones not taken yet) by the EtcdCluster's UID.
/// Pure.
pub fn of_cluster<'a>(cluster: &EtcdCluster, backups: &'a [EtcdBackup]) -> Vec<&'a EtcdBackup> {
    let name = cluster.name_any();
    let uid = cluster.metadata.uid.clone().unwrap_or_default();
    let cluster_id = cluster.status.as_ref().and_then(|s| s.cluster_id.clone());
    backups
        .iter()
        .filter(|b| b.spec.cluster == name)
        .filter(|b| {
            let taken_from = b.status.as_ref().and_then(|s| s.cluster_id.clone());
            let made_for = b.labels().get(CLUSTER_UID_LABEL).cloned();
            match (taken_from, made_for) {
                (Some(id), _) => Some(id) == cluster_id,
                (None, Some(made_for)) => made_for == uid,
                (None, None) => true,
            }
        })
        .collect()
}

/// Makes the scheduled backup that is due, applies retention and counts the backups kept;
/// returns when the next scheduled backup is due, if there is a schedule. Nothing for a
/// cluster without `spec.backup`. A schedule that cannot be read is reported by validation and
/// makes nothing here. `backups` are the namespace's, `being_restored` those a new cluster is
/// still starting from (never deleted under it).
pub async fn keep(
    cluster: &EtcdCluster,
    names: &Names,
    client: &Client,
    (backups, being_restored): (&[EtcdBackup], &BTreeSet<String>),
    summary: &mut BackupsSummary<EtcdClusterReason>,
    now: jiff::Timestamp,
) -> Result<Option<Duration>> {
    let Some(spec) = cluster.spec.backup.as_ref() else {
        return Ok(None);
    };
    let api: Api<EtcdBackup> = Api::namespaced(client.clone(), &names.namespace);
    let mut look_again = None;
    if let Some(pattern) = spec.schedule.as_deref() {
        let due = summary
            .follow_schedule(pattern, now)
            .map_err(|e| crate::core::Error::InvalidSpec(e.to_string()))?;
        if let Some(at) = due.now {
            let name = schedule::backup_name(&names.cluster, at);
            let uid = cluster.metadata.uid.clone().unwrap_or_default();
            let backup = EtcdBackup {
                metadata: retention::scheduled_metadata(
                    name.clone(),
                    &names.namespace,
                    (CLUSTER_LABEL, &names.cluster),
                    (CLUSTER_UID_LABEL, &uid),
                ),
                spec: EtcdBackupSpec {
                    cluster: names.cluster.clone(),
                    paused: false,
                },
                status: None,
            };
            if create_if_missing(&api, &backup).await? {
                info!(backup = %name, "made the scheduled backup");
            }
        }
        look_again = Some(due.next_in);
    } else {
        summary.no_schedule();
    }
    let ours = of_cluster(cluster, backups);
    let gone = retention::beyond_max(&ours, |name| being_restored.contains(name), spec.max_backups, now);
    for name in &gone {
        if delete_if_present(&api, name, &DeleteParams::default()).await? {
            info!(backup = %name, max_backups = spec.max_backups, "deleted a scheduled backup beyond maxBackups");
        }
    }
    let kept: Vec<&EtcdBackup> = ours.into_iter().filter(|b| !gone.contains(&b.name_any())).collect();
    summary.count(&kept, stored);
    Ok(look_again)
}

/// What a successful backup stored, for the cluster's condition.
fn stored(backup: &EtcdBackup) -> String {
    let status = backup.status.clone().unwrap_or_default();
    format!(
        "EtcdBackup {} stored revision {} at {}",
        backup.name_any(),
        status.revision.unwrap_or_default(),
        status.progress.location.unwrap_or_default()
    )
}

/// The backup `cluster` is a new cluster still starting from, if it is one.
pub fn starting_from(cluster: &EtcdCluster) -> Option<&str> {
    if cluster.status.as_ref().and_then(|s| s.cluster_id.as_ref()).is_some() {
        return None;
    }
    Some(cluster.spec.bootstrap.as_ref()?.from_backup.as_ref()?.name.as_str())
}

/// Whether `cluster` is a new cluster still starting from backup `name`.
pub fn restores_from(cluster: &EtcdCluster, name: &str) -> bool {
    starting_from(cluster) == Some(name)
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
            destination: noops_api::backup::BackupDestination {
                s3: None,
                volume: Some(VolumeDestination {
                    claim_name: "etcd-backups".into(),
                    prefix: "etcd".into(),
                    engine: std::marker::PhantomData,
                }),
            },
        });
        cluster
    }

    #[test]
    fn the_schedule_says_what_is_due_and_moves_its_bookmark() {
        let mut summary = BackupsSummary::<EtcdClusterReason>::default();
        summary.status.last_scheduled_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(3600)));
        let pattern = hourly().spec.backup.unwrap().schedule.unwrap();
        let due = summary.follow_schedule(&pattern, at(3700)).unwrap();
        assert_eq!(due.now, None);
        assert_eq!(due.next_in, Duration::from_secs(3500));
        let due = summary.follow_schedule(&pattern, at(7201)).unwrap();
        assert_eq!(due.now, Some(at(7200)), "the 02:00 backup is due");
        assert_eq!(summary.status.last_scheduled_time.as_ref().map(|t| t.0), Some(at(7200)));
        assert!(summary.follow_schedule("99 * * * *", at(7201)).is_err());
    }

    #[test]
    fn backups_of_an_earlier_cluster_of_the_same_name_are_not_this_ones() {
        let mut cluster = hourly();
        cluster.metadata.uid = Some("uid-now".into());
        cluster.status = Some(noops_api::etcd::EtcdClusterStatus {
            cluster_id: Some("c0ffee".into()),
            ..Default::default()
        });
        let taken_from = |name: &str, id: &str| {
            let mut b = finished(name, "Succeeded", 100);
            if let Some(s) = b.status.as_mut() {
                s.cluster_id = Some(id.into());
            }
            b
        };
        let mut made_for_earlier = EtcdBackup::new(
            "main-3",
            EtcdBackupSpec {
                cluster: "main".into(),
                paused: false,
            },
        );
        made_for_earlier.metadata.labels = Some([(CLUSTER_UID_LABEL.to_string(), "uid-before".to_string())].into());
        let all = [
            taken_from("main-1", "c0ffee"),
            taken_from("main-2", "dead"),
            made_for_earlier,
            EtcdBackup::new(
                "other-1",
                EtcdBackupSpec {
                    cluster: "other".into(),
                    paused: false,
                },
            ),
        ];
        let names: Vec<String> = of_cluster(&cluster, &all).iter().map(|b| b.name_any()).collect();
        assert_eq!(names, ["main-1"]);
    }

    fn finished(name: &str, phase: &str, completed: i64) -> EtcdBackup {
        let mut backup = EtcdBackup::new(
            name,
            EtcdBackupSpec {
                cluster: "main".into(),
                paused: false,
            },
        );
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
        let mut summary = BackupsSummary::<EtcdClusterReason>::default();
        summary.count(&[&old, &failed, &running], stored);
        let condition = summary.condition.clone().unwrap();
        assert_eq!(
            (condition.status, condition.reason),
            (false, EtcdClusterReason::BackupFailed)
        );
        assert_eq!(condition.message, "EtcdBackup new failed: ClaimNotFound: why");
        assert_eq!(
            summary.status.stored_backups,
            Some(1),
            "a failure still leaves the older backup"
        );
        let newer = finished("newer", "Succeeded", 250);
        summary.count(&[&old, &failed, &newer], stored);
        let condition = summary.condition.unwrap();
        assert_eq!(
            (condition.status, condition.reason),
            (true, EtcdClusterReason::BackupStored)
        );
        assert!(
            condition.message.contains("newer stored revision 42 at pvc://"),
            "{}",
            condition.message
        );
    }
}
