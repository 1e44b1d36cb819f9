//! The EtcdBackup controller: one snapshot of an EtcdCluster per EtcdBackup, in the cluster's
//! S3-compatible bucket or backup volume, with its size, revision and SHA-256 in status.
//!
//! Pipeline of one reconcile (`reconcile.rs`): read the backup and its cluster → check there is
//! somewhere to put it → stream a snapshot from a healthy follower into the bucket
//! (`crate::etcd::snapshot`, `crate::etcd::store`), or have a pod save it into the volume
//! (`volume.rs`, which runs `crate::etcd::agent::save`) → status and Event. The cluster
//! controller makes scheduled EtcdBackups and applies retention (`crate::etcd::backups`).
//! What every backup controller shares (context, finalizer, the end of a pass) is the backup
//! kit's (`crate::core::backup`).

mod reconcile;
pub mod volume;

use std::sync::Arc;

use kube::runtime::controller::Action;
use noops_api::EtcdBackup;

use crate::core::Result;
use crate::core::backup::controller::{BackupEngine, Backups, Begun};
use crate::core::controller::Registration;
use crate::core::engine::registration;
use reconcile::Context;

pub use reconcile::{BACKUP_DEADLINE, FINALIZER};

/// The controller's registration (`noops run --controllers etcdbackup`).
pub const CONTROLLER: Registration = registration::<Backups<EtcdBackups>>();

/// The EtcdBackup engine.
pub struct EtcdBackups;

impl BackupEngine for EtcdBackups {
    type Backup = EtcdBackup;
    type Source = noops_api::EtcdCluster;
    const NAME: &'static str = "etcdbackup";
    const ABOUT: &'static str = "EtcdBackup: snapshots of EtcdClusters in an S3-compatible store";
    const CONCURRENCY: u16 = 2;
    const COMPONENT: &'static str = volume::COMPONENT;
    const SOURCE_LABEL: &'static str = crate::etcd::names::CLUSTER_LABEL;
    const MAKER_JOB: &'static str = "save";

    async fn make(begun: Begun<EtcdBackup>, ctx: Arc<Context>) -> Result<Action> {
        reconcile::make(begun, ctx).await
    }

    async fn clean_up(backup: Arc<EtcdBackup>, ctx: Arc<Context>) -> Result<Action> {
        reconcile::clean_up(backup, ctx).await
    }
}
