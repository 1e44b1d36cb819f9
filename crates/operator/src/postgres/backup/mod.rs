//! The PostgresBackup controller: one base backup of a PostgreSQL per PostgresBackup, in the
//! database's S3-compatible bucket or backup volume, with its size, SHA-256 and WAL range in
//! status; with the WAL the database archives continuously, it restores the database to any
//! moment from its end on.
//!
//! Pipeline of one reconcile (`reconcile.rs`): read the backup and its database → record where
//! it goes → have a pod take it (`pods.rs`; what the pod runs is
//! `crate::postgres::instance::base_backup`) → status and Event. Deleting a PostgresBackup
//! deletes its base backup and the WAL only it needed. The PostgreSQL controller makes the
//! first and the scheduled PostgresBackups and applies retention (`crate::postgres::backups`).

pub mod pods;
mod reconcile;

use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::core::DeserializeGuard;
use kube::runtime::controller::Controller;
use kube::runtime::watcher;
use noops_api::PostgresBackup;

use crate::core::controller::{ControllerCore, HasCore, Registration, Runtime, drive, scoped_api};
use crate::core::labels;

pub use reconcile::{FINALIZER, keep_wal_from};

/// The controller's registration (`noops run --controllers postgresbackup`).
pub const CONTROLLER: Registration = Registration {
    name: "postgresbackup",
    about: "PostgresBackup: base backups of PostgreSQLs in an S3-compatible store or a volume",
    run: start,
};

/// At most this many backups are looked at once.
const MAX_CONCURRENT_RECONCILES: u16 = 2;

/// What every reconcile of this controller shares.
pub struct Context {
    pub core: ControllerCore,
    pub client: Client,
    /// The operator's own image: the backup pods copy the instance manager from it.
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
        scoped_api::<DeserializeGuard<PostgresBackup>>(&client, &namespace),
        watcher::Config::default().any_semantic(),
    )
    .owns(
        scoped_api::<Pod>(&client, &namespace),
        watcher::Config::default().labels(&format!("{}={}", labels::COMPONENT, pods::COMPONENT)),
    )
    .with_config(kube::runtime::controller::Config::default().concurrency(MAX_CONCURRENT_RECONCILES))
    .graceful_shutdown_on(shutdown.fired());
    drive(controller, ctx, |backup, ctx: Arc<Context>| async move {
        reconcile::reconcile(backup, &ctx).await
    })
    .await;
}
