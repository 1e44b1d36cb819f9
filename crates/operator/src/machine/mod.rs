//! The Machine controller: a tenant's worker node, its VM made by a provider (`provider.rs`; the
//! one noops has makes it a pod of this cluster), joined to the tenant's control plane with
//! certificates the operator issues (`bootstrap.rs`), drained before it goes (`drain.rs`).
//!
//! Watches the Machines, their VM pods, the Secrets noops manages (bootstrap Secrets, the
//! tenants' CAs and admin kubeconfigs), the KubernetesControlPlanes (a control plane that
//! starts serving or changes version wakes its machines) and each tenant's Nodes (`tenant.rs`:
//! a Node that changes wakes its machine). One pass (`reconcile.rs`), a file per stage:
//! 1. observe: the control plane, the VM, the bootstrap Secret, the tenant's Node;
//! 2. validate (`plan.rs`): the control plane exists and serves, the version skew holds;
//! 3. plan (`plan.rs`): the phase, and whether to make the VM (pure);
//! 4. build (`bootstrap.rs`, `provider.rs`): the bootstrap Secret and the VM (pure);
//! 5. apply: make them, set `providerID`; on deletion cordon, drain, delete the Node, the VM;
//! 6. `status.rs`: the status (pure), written only if it changed, with Events.

mod bootstrap;
mod context;
pub(crate) mod drain;
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

use crate::core::cache::{concerned, shared_cache};
use crate::core::controller::{Registration, Runtime, controller_of, drive, scoped_api};
use crate::core::labels;
use context::{Context, State};
use names::MACHINE_LABEL;

/// The controller's registration (`noops run --controllers machine`).
pub const CONTROLLER: Registration = Registration {
    name: "machine",
    about: "Machine: a tenant's worker node, its VM a pod of this cluster",
    run: |runtime| Box::pin(run(runtime)),
};

/// At most this many machines are reconciled at once.
const MAX_CONCURRENT_RECONCILES: u16 = 16;

/// Runs the controller in `runtime.namespace` (all namespaces if `None`) until shutdown.
pub async fn run(runtime: Runtime) {
    let Runtime {
        client,
        namespace,
        metrics,
        shutdown,
        certificate_lifetime,
        images,
        ..
    } = runtime;
    let (pods, pod_changes) = shared_cache(
        scoped_api::<Pod>(&client, &namespace),
        watcher::Config::default().labels(MACHINE_LABEL),
    )
    .await;
    let noops = watcher::Config::default().labels(&labels::managed_by_noops());
    let (secrets, secret_changes) = shared_cache(scoped_api::<Secret>(&client, &namespace), noops).await;
    let (control_planes, control_plane_changes) = shared_cache(
        scoped_api::<KubernetesControlPlane>(&client, &namespace),
        watcher::Config::default(),
    )
    .await;
    let controller = controller_of::<Machine>(&client, &namespace, MAX_CONCURRENT_RECONCILES);
    let machines = controller.store();
    // Each tenant's Node watch wakes the Machine of the Node that changed.
    let (tenants, node_changes) = tenant::Tenants::new();
    let ctx = Context::new(
        CONTROLLER.name,
        &client,
        metrics,
        State {
            control_planes,
            secrets,
            provider: provider::PodProvider {
                client: client.clone(),
                pods,
                images,
            },
            tenants,
            certificate_lifetime,
        },
    );
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
        })
        .graceful_shutdown_on(shutdown.fired());
    drive(controller, &namespace, ctx, |machine, ctx: Arc<Context>| async move {
        reconcile::reconcile(machine, &ctx).await
    })
    .await;
}
