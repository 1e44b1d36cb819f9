//! The EtcdBackup controller: one snapshot of an EtcdCluster per EtcdBackup, in the cluster's
//! S3-compatible bucket or backup volume, with its size, revision and SHA-256 in status.
//!
//! One pass, on the backup kit's stages (`reconcile.rs`): observe its cluster → check there
//! is somewhere to put it → stream a snapshot from a healthy follower into the bucket
//! (`crate::etcd::snapshot`, `crate::etcd::store`), or have a pod save it into the volume
//! (`volume.rs`, which runs `crate::etcd::agent::save`) → status and Event. The cluster
//! controller makes scheduled EtcdBackups and applies retention (`crate::etcd::backups`).
//! What every backup controller shares (context, finalizer, the end of a pass) is the backup
//! kit's (`crate::core::backup`).

mod reconcile;
pub mod volume;

use std::sync::Arc;

use kube::runtime::controller::Action;
use noops_api::{EtcdBackup, EtcdCluster};

use crate::core::Result;
use crate::core::backup::controller::{BackupEngine, Backups, Begun, Made};
use crate::core::backup::progress::Timing;
use crate::core::controller::Registration;
use crate::core::stages::registration;
use reconcile::Context;

pub use reconcile::{BACKUP_DEADLINE, FINALIZER};

/// The controller's registration (`noops run --controllers etcdbackup`).
pub const CONTROLLER: Registration = registration::<Backups<EtcdBackups>>();

/// The EtcdBackup engine.
pub struct EtcdBackups;

impl BackupEngine for EtcdBackups {
    type Backup = EtcdBackup;
    type Source = EtcdCluster;
    const NAME: &'static str = "etcdbackup";
    const ABOUT: &'static str = "EtcdBackup: snapshots of EtcdClusters in an S3-compatible store";
    const CONCURRENCY: u16 = 2;
    const COMPONENT: &'static str = volume::COMPONENT;
    const SOURCE_LABEL: &'static str = crate::etcd::names::CLUSTER_LABEL;
    const MAKER_JOB: &'static str = "save";
    const TIMING: Timing = reconcile::TIMING;

    async fn observe(backup: &EtcdBackup, ctx: &Context) -> Result<Option<EtcdCluster>> {
        reconcile::observe(backup, ctx).await
    }

    async fn make(
        backup: &EtcdBackup,
        cluster: Option<&EtcdCluster>,
        begun: Begun<EtcdBackup>,
        ctx: &Context,
    ) -> Result<Option<Made<EtcdBackup>>> {
        reconcile::make(backup, cluster, begun, ctx).await
    }

    async fn clean_up(backup: Arc<EtcdBackup>, ctx: &Context) -> Result<Action> {
        reconcile::clean_up(backup, ctx).await
    }
}

#[cfg(test)]
mod tests {
    use noops_api::backup::BackupPhase;
    use noops_api::etcd_backup::{EtcdBackupSpec, EtcdBackupStatus};

    use super::*;
    use crate::core::backup::controller::{BackupApplied, BackupPlan};
    use crate::core::backup::progress::Verdict;
    use crate::core::stages::Stages;

    type Kit = Backups<EtcdBackups>;

    fn at(seconds: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000 + seconds).unwrap_or_default()
    }

    fn backup(paused: bool, status: Option<EtcdBackupStatus>) -> EtcdBackup {
        let mut backup = EtcdBackup::new(
            "b",
            EtcdBackupSpec {
                cluster: "c".into(),
                paused,
            },
        );
        backup.metadata.uid = Some("u".into());
        backup.status = status;
        backup
    }

    fn reasons(told: &[crate::core::events::Announcement]) -> Vec<&str> {
        told.iter().map(|a| a.reason.as_str()).collect()
    }

    #[test]
    fn a_backup_stored_says_so_once_written_and_its_pod_goes_on_the_next_pass() {
        let running = backup(false, None);
        let plan = Kit::plan(&running, &None, at(0)).unwrap();
        let BackupPlan::Make { started, .. } = &plan else {
            panic!("a backup not begun is made");
        };
        assert_eq!(*started, at(0));
        let made = |verdict| {
            BackupApplied::Made(crate::core::backup::controller::Made {
                status: EtcdBackupStatus::default(),
                verdict,
                under_way: None,
                written_ahead: Some("7".into()),
            })
        };
        let stored = made(Verdict::Succeeded("stored".to_string()));
        let report = Kit::status(&running, &None, &plan, Some(&stored), at(3));
        assert_eq!(report.status.progress.phase, Some(BackupPhase::Succeeded));
        assert_eq!(reasons(&report.news), ["BackupSucceeded"]);
        assert!(report.done.is_empty(), "told only once the status says it");
        assert_eq!(
            report.next, None,
            "its status write wakes the pass that removes its pod"
        );
        // Its status is written over the version its record ahead left.
        assert_eq!(Kit::written_ahead(&stored).as_deref(), Some("7"));

        // Done: the next pass only removes its task pod.
        let done = backup(false, Some(report.status));
        assert!(matches!(
            Kit::plan(&done, &None, at(4)).unwrap(),
            BackupPlan::RemovePod { pod } if pod.ends_with("-save")
        ));

        // Waiting: looked at again soon, nothing told.
        let waiting = made(Verdict::Wait {
            reason: noops_api::backup::BackupReason::NoHealthyMember,
            message: "none".into(),
        });
        let report = Kit::status(&running, &None, &plan, Some(&waiting), at(3));
        assert_eq!(report.status.progress.phase, Some(BackupPhase::Running));
        assert!(report.news.is_empty());
        assert!(report.next.is_some());
    }

    #[test]
    fn a_backup_carries_paused_from_its_first_pass_without_restarting_its_deadlines() {
        let paused_condition = |status: &EtcdBackupStatus| {
            status
                .progress
                .conditions
                .iter()
                .find(|c| c.type_ == noops_api::condition::PAUSED)
                .map(|c| (c.status.clone(), c.last_transition_time.0))
        };
        let mut running = backup(false, None);
        running.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(-100)));
        let plan = Kit::plan(&running, &None, at(0)).unwrap();
        let waiting = BackupApplied::Made(crate::core::backup::controller::Made {
            status: EtcdBackupStatus::default(),
            verdict: Verdict::Wait {
                reason: noops_api::backup::BackupReason::NoHealthyMember,
                message: "none".into(),
            },
            under_way: None,
            written_ahead: None,
        });
        let first = Kit::status(&running, &None, &plan, Some(&waiting), at(0)).status;
        // Not paused since it was made: its deadlines still count from its start.
        assert_eq!(paused_condition(&first), Some(("False".into(), at(-100))));
        let again = backup(false, Some(first.clone()));
        assert!(matches!(
            Kit::plan(&again, &None, at(10)).unwrap(),
            BackupPlan::Make { started, .. } if started == at(0)
        ));

        // Paused: only its condition turns (the core tells the turn, as for every kind).
        let paused = backup(true, Some(first));
        let plan = Kit::plan(&paused, &None, at(20)).unwrap();
        let report = Kit::status(&paused, &None, &plan, None, at(20));
        assert_eq!(paused_condition(&report.status), Some(("True".into(), at(20))));
        assert!(report.news.is_empty());
        // Resumed: its deadlines count from the resume.
        let mut resumed = backup(false, Some(report.status));
        let plan = Kit::plan(&resumed, &None, at(30)).unwrap();
        assert!(matches!(plan, BackupPlan::Make { started, .. } if started == at(30)));
        resumed.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(-100)));
        // Its look begins from its status as written (`Begun`).
        let BackupApplied::Made(mut made) = waiting else {
            unreachable!()
        };
        made.status = resumed.status.clone().unwrap_or_default();
        let report = Kit::status(&resumed, &None, &plan, Some(&BackupApplied::Made(made)), at(30));
        assert_eq!(paused_condition(&report.status), Some(("False".into(), at(30))));
    }
}
