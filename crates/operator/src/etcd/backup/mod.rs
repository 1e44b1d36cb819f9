//! The EtcdBackup controller: one snapshot of an EtcdCluster per EtcdBackup, in the cluster's
//! S3-compatible bucket or backup volume, with its size, revision and SHA-256 in status.
//!
//! Pipeline of one reconcile (`reconcile.rs`): read the backup and its cluster → check there is
//! somewhere to put it → stream a snapshot from a healthy follower into the bucket
//! (`crate::etcd::snapshot`, `crate::etcd::store`), or have a pod save it into the volume
//! (`volume.rs`, which runs `crate::etcd::agent::save`) → status and Event. The cluster
//! controller makes scheduled EtcdBackups and applies retention (`crate::etcd::backups`,
//! `crate::core::backup::schedule`).

mod reconcile;
pub mod volume;

use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::core::DeserializeGuard;
use kube::runtime::controller::Controller;
use kube::runtime::watcher;
use noops_api::EtcdBackup;

use crate::core::controller::{ControllerCore, HasCore, Registration, Runtime, drive, scoped_api};
use crate::core::labels;

pub use reconcile::{BACKUP_DEADLINE, FINALIZER};

/// The controller's registration (`noops run --controllers etcdbackup`).
pub const CONTROLLER: Registration = Registration {
    name: "etcdbackup",
    about: "EtcdBackup: snapshots of EtcdClusters in an S3-compatible store",
    run: start,
};

/// At most this many backups are taken at once.
const MAX_CONCURRENT_RECONCILES: u16 = 2;

/// What every reconcile of this controller shares.
pub struct Context {
    pub core: ControllerCore,
    pub client: Client,
    /// The operator's own image, which the pods of volume backups run.
    pub image: String,
}

impl HasCore for Context {
    fn core(&self) -> &ControllerCore {
        &self.core
    }
}

fn start(runtime: Runtime) -> BoxFuture<'static, ()> {
    Box::pin(run(runtime))
}

/// Runs the controller in `runtime.namespace` (all namespaces if `None`) until shutdown.
pub async fn run(runtime: Runtime) {
    let Runtime {
        client,
        namespace,
        metrics,
        shutdown,
        image,
        ..
    } = runtime;
    let ctx = Arc::new(Context {
        core: ControllerCore::new(CONTROLLER.name, client.clone(), metrics),
        client: client.clone(),
        image,
    });
    let controller = Controller::new(
        scoped_api::<DeserializeGuard<EtcdBackup>>(&client, &namespace),
        watcher::Config::default().any_semantic(),
    )
    .owns(
        scoped_api::<Pod>(&client, &namespace),
        watcher::Config::default().labels(&format!("{}={}", labels::COMPONENT, volume::COMPONENT)),
    )
    .with_config(kube::runtime::controller::Config::default().concurrency(MAX_CONCURRENT_RECONCILES))
    .graceful_shutdown_on(shutdown.fired());
    drive(controller, ctx, |backup, ctx: Arc<Context>| async move {
        reconcile::reconcile(backup, &ctx).await
    })
    .await;
}
