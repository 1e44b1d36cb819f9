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

use crate::core::backup::controller::{self, BackupController};
use crate::core::controller::Registration;

pub use reconcile::{BACKUP_DEADLINE, FINALIZER};

/// The controller's registration (`noops run --controllers etcdbackup`).
pub const CONTROLLER: Registration = Registration {
    name: "etcdbackup",
    about: "EtcdBackup: snapshots of EtcdClusters in an S3-compatible store",
    concurrency: 2,
    run: |runtime| {
        Box::pin(controller::run(
            runtime,
            BackupController {
                name: CONTROLLER.name,
                concurrency: CONTROLLER.concurrency,
                component: volume::COMPONENT,
                maker_job: "save",
                make: reconcile::make,
                clean_up: reconcile::clean_up,
            },
        ))
    },
};
