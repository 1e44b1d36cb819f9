//! The MaintPage controller.
//!
//! Watches MaintPages and the Deployments and Services they own (so hand edits are seen and
//! reverted at once), and reconciles each MaintPage in one pass (`reconcile.rs`), a file per
//! stage:
//! 1. `observe.rs`: the live children (from watch caches), the facts the plan needs, and
//!    (`stuck.rs`) whether the pods of a side cannot start;
//! 2. `validate.rs`: refuse to take over objects that are not ours;
//! 3. `switch.rs`: plan the switch (pure; all its progress is in the status, so a restarted
//!    operator carries on where the last one stopped);
//! 4. `desired.rs`: build the desired children (pure, stamped);
//! 5. `apply.rs`: apply them with server-side apply, and tell hand edits from spec changes;
//! 6. `status.rs`: the status (pure), written only if it changed.

mod apply;
mod context;
mod desired;
#[cfg(test)]
mod fixtures;
mod observe;
mod reconcile;
mod status;
mod switch;
mod validate;

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use noops_api::MaintPage;

use crate::core::cache::shared_cache;
use crate::core::controller::{Registration, Runtime, controller_of, drive, scoped_api};
use crate::core::labels;
use context::{Context, State};

/// The controller's registration (`noops run --controllers maintpage`).
pub const CONTROLLER: Registration = Registration {
    name: "maintpage",
    about: "MaintPage: an app behind a Service that switches to a maintenance page and back",
    run: |runtime| Box::pin(run(runtime)),
};

/// At most this many MaintPages are reconciled at once.
const MAX_CONCURRENT_RECONCILES: u16 = 16;

/// Runs the controller in `runtime.namespace` (all namespaces if `None`) until shutdown.
pub async fn run(runtime: Runtime) {
    let Runtime {
        client,
        namespace,
        metrics,
        shutdown,
        images,
        ..
    } = runtime;
    let deployments = scoped_api::<Deployment>(&client, &namespace);
    let services = scoped_api::<Service>(&client, &namespace);
    let pods = scoped_api::<Pod>(&client, &namespace);
    let ours = watcher::Config::default().labels(&labels::managed_by_noops());
    let (deployment_store, deployment_changes) = shared_cache(deployments, ours.clone()).await;
    let (service_store, service_changes) = shared_cache(services, ours.clone()).await;
    let (pod_store, pod_changes) = shared_cache(pods, ours).await;
    let ctx = Context::new(
        CONTROLLER.name,
        &client,
        metrics,
        State {
            deployments: deployment_store,
            services: service_store,
            pods: pod_store,
            images,
        },
    );
    let controller = controller_of::<MaintPage>(&client, &namespace, MAX_CONCURRENT_RECONCILES)
        // A child change wakes its MaintPage only after the cache holds it.
        .owns_shared_stream(deployment_changes)
        .owns_shared_stream(service_changes)
        // A pod of either side that starts, fails or recovers wakes its MaintPage (pods belong
        // to ReplicaSets, so the owner label says which MaintPage).
        .watches_shared_stream(pod_changes, |pod: Arc<Pod>| {
            let namespace = pod.metadata.namespace.clone();
            pod.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(desired::OWNER_LABEL))
                .map(|name| {
                    let object = ObjectRef::new(name);
                    match &namespace {
                        Some(ns) => object.within(ns),
                        None => object,
                    }
                })
        })
        .graceful_shutdown_on(shutdown.fired());
    drive(controller, &namespace, ctx, |mp, ctx: Arc<Context>| async move {
        reconcile::reconcile(mp, &ctx).await
    })
    .await;
}
