//! The Machine controller: a tenant's worker node, its VM made by a provider (`provider.rs`; the
//! one noops has makes it a pod of this cluster), joined to the tenant's control plane with
//! certificates the operator issues (`bootstrap.rs`), drained before it goes (`drain.rs`).
//!
//! Watches the Machines, their VM pods, the Secrets noops manages (bootstrap Secrets, the
//! tenants' CAs and admin kubeconfigs), the KubernetesControlPlanes (a control plane that
//! starts serving or changes version wakes its machines) and each tenant's Nodes (`tenant.rs`:
//! a Node that changes wakes its machine). One pass (`reconcile.rs`: the core's stages):
//! 1. observe: the control plane, the VM, the bootstrap Secret, the tenant's Node;
//! 2. plan (`plan.rs`, pure): whether the control plane admits it (it exists and serves, the
//!    version skew holds; one that does not says so in the status), and whether to make the VM;
//! 3. build (`bootstrap.rs`, `provider.rs`): the bootstrap Secret and the VM (pure);
//! 4. apply: make them, set `providerID`; on deletion (`clean_up`) cordon, drain, delete the
//!    Node, the VM;
//! 5. `status.rs`: the status (pure), written only if it changed, with Events.

mod bootstrap;
mod context;
pub mod drain;
#[cfg(test)]
pub(crate) mod fixtures;
pub(crate) mod names;
mod plan;
mod provider;
mod reconcile;
pub(crate) mod status;
mod tenant;

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use noops_api::{KubernetesControlPlane, Machine};

use crate::core::cache::concerned;
use crate::core::controller::Runtime;
use crate::core::engine::{ControllerOf, Wiring, engine};
use crate::core::labels;
use context::State;
use names::MACHINE_LABEL;

engine! {
    /// The Machine engine.
    Machines reconciles Machine with State, named "machine", 16 at once:
    "Machine: a tenant's worker node, its VM a pod of this cluster"
}

/// Its caches, and its controller woken by what changes them.
async fn wire(runtime: &Runtime, controller: ControllerOf<Machine>) -> Wiring<Machines> {
    let (pods, pod_changes) = runtime
        .cache::<Pod>(watcher::Config::default().labels(MACHINE_LABEL))
        .await;
    let noops = watcher::Config::default().labels(&labels::managed_by_noops());
    let (secrets, secret_changes) = runtime.cache::<Secret>(noops).await;
    let (control_planes, control_plane_changes) = runtime
        .cache::<KubernetesControlPlane>(watcher::Config::default())
        .await;
    let machines = controller.store();
    // Each tenant's Node watch wakes the Machine of the Node that changed.
    let (tenants, node_changes) = tenant::Tenants::new();
    let state = State {
        control_planes,
        secrets,
        provider: provider::PodProvider {
            client: runtime.client.clone(),
            pods,
            images: runtime.images.clone(),
        },
        tenants,
        certificate_lifetime: runtime.certificate_lifetime,
    };
    let controller = controller
        .owns_shared_stream(pod_changes)
        .reconcile_on(node_changes)
        .watches_shared_stream(secret_changes, |secret: Arc<Secret>| {
            let machine = secret.labels().get(MACHINE_LABEL)?;
            Some(ObjectRef::new(machine).within(&secret.namespace()?))
        })
        .watches_shared_stream(control_plane_changes, move |kcp: Arc<KubernetesControlPlane>| {
            let name = kcp.name_any();
            concerned(&machines, &kcp.namespace().unwrap_or_default(), |m: &Machine| {
                m.spec.cluster_name == name
            })
        });
    Wiring::new(state, controller)
}
