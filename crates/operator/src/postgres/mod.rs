//! The PostgreSQL controller.
//!
//! Watches PostgreSQLs, the StatefulSets, pods, Services and Secrets they own, and the
//! metadata of every Secret (so that a changed password Secret wakes the database that names
//! it), and reconciles each database in one pass (`reconcile.rs`), a file per question:
//! - `observe.rs`: the children, from the watch caches;
//! - `secrets.rs`: the user's password (and what is wrong with its Secret), the superuser's
//!   and the connection Secrets;
//! - `statefulset.rs`, `services.rs`: the children, pure;
//! - `sql.rs`: the only way the operator talks to PostgreSQL;
//! - `status.rs`: the status, pure, written only if it changed;
//! - `instance.rs`: the instance manager, which runs in the pod (`noops pg-instance`).

pub mod instance;
pub mod names;
pub mod observe;
mod reconcile;
pub mod secrets;
pub mod services;
pub mod sql;
pub mod statefulset;
pub mod status;
#[cfg(test)]
pub(crate) mod fixtures;

use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::ObjectRef;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use noops_api::PostgreSQL;
use tracing::warn;

use crate::core::cache::shared_cache;
use crate::core::controller::{ControllerCore, HasCore, Registration, Runtime, drive, scoped_api};

/// The controller's registration (`noops run --controllers postgres`).
pub const CONTROLLER: Registration = Registration {
    name: "postgres",
    about: "PostgreSQL: a database, its owner and password, behind a Service",
    run: start,
};

/// At most this many databases are reconciled at once.
const MAX_CONCURRENT_RECONCILES: u16 = 8;

/// What every reconcile of this controller shares.
pub struct Context {
    pub core: ControllerCore,
    pub client: Client,
    pub caches: observe::Caches,
    /// The operator's own image: the instance's init container copies the instance manager
    /// from it.
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
    let ours = watcher::Config::default().labels(names::POSTGRES_LABEL);
    let (statefulsets, statefulset_changes) =
        shared_cache(scoped_api::<StatefulSet>(&client, &namespace), ours.clone()).await;
    let (pods, pod_changes) = shared_cache(scoped_api::<Pod>(&client, &namespace), ours.clone()).await;
    let (services, _) = shared_cache(scoped_api::<Service>(&client, &namespace), ours.clone()).await;
    let (secrets, _) = shared_cache(scoped_api::<Secret>(&client, &namespace), ours).await;
    let (Some(statefulset_changes), Some(pod_changes)) = (statefulset_changes, pod_changes) else {
        warn!("shared caches without subscribers: the controller cannot watch its instances");
        return;
    };
    let ctx = Arc::new(Context {
        core: ControllerCore::new(CONTROLLER.name, client.clone(), metrics),
        client: client.clone(),
        caches: observe::Caches {
            statefulsets,
            pods,
            services,
            secrets,
        },
        image,
    });
    let controller = Controller::new(
        scoped_api::<DeserializeGuard<PostgreSQL>>(&client, &namespace),
        watcher::Config::default().any_semantic(),
    )
    .with_config(kube::runtime::controller::Config::default().concurrency(MAX_CONCURRENT_RECONCILES));
    let databases = controller.store();
    // Only the metadata of Secrets: enough to see that a password Secret changed, without
    // holding every Secret's data in memory.
    let secret_changes = watcher(scoped_api::<PartialObjectMeta<Secret>>(&client, &namespace), watcher::Config::default())
        .default_backoff()
        .touched_objects();
    let controller = controller
        .owns_shared_stream(statefulset_changes)
        // The instance's pod is the StatefulSet's: its label names the database.
        .watches_shared_stream(pod_changes, |pod: Arc<Pod>| {
            let database = pod.labels().get(names::POSTGRES_LABEL).cloned();
            database.map(|name| ObjectRef::new(&name).within(&pod.namespace().unwrap_or_default()))
        })
        .watches_stream(secret_changes, move |secret| {
            let namespace = secret.namespace().unwrap_or_default();
            let name = secret.name_any();
            databases
                .state()
                .into_iter()
                .filter_map(|guard| guard.0.as_ref().ok().cloned())
                .filter(|pg| pg.namespace().as_deref() == Some(namespace.as_str()) && pg.spec.password_secret == name)
                .map(|pg| ObjectRef::new(&pg.name_any()).within(&namespace))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(shutdown.fired());
    drive(controller, ctx, |pg, ctx: Arc<Context>| async move {
        reconcile::reconcile(pg, &ctx).await
    })
    .await;
}
