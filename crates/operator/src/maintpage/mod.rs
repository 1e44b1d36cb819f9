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

use crate::core::controller::Runtime;
use crate::core::engine::{ControllerOf, Wiring, engine};
use crate::core::labels;
use context::State;

engine! {
    /// The MaintPage engine.
    MaintPages reconciles MaintPage with State, named "maintpage", 16 at once:
    "MaintPage: an app behind a Service that switches to a maintenance page and back"
}

/// Its caches, and its controller woken by what changes them.
async fn wire(runtime: &Runtime, controller: ControllerOf<MaintPage>) -> Wiring<MaintPages> {
    let ours = watcher::Config::default().labels(&labels::managed_by_noops());
    let (deployments, deployment_changes) = runtime.cache::<Deployment>(ours.clone()).await;
    let (services, service_changes) = runtime.cache::<Service>(ours.clone()).await;
    let (pods, pod_changes) = runtime.cache::<Pod>(ours).await;
    let state = State {
        deployments,
        services,
        pods,
        images: runtime.images.clone(),
    };
    let controller = controller
        // A child change wakes its MaintPage only after the cache holds it.
        .owns_shared_stream(deployment_changes)
        .owns_shared_stream(service_changes)
        // A pod of either side that starts, fails or recovers wakes its MaintPage (pods
        // belong to ReplicaSets, so the owner label says which MaintPage).
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
        });
    Wiring::new(state, controller)
}
