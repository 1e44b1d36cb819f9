//! The KubernetesCluster controller: a whole tenant cluster from one manifest, made of one
//! KubernetesControlPlane and a MachineDeployment per pool, upgraded in order.
//!
//! Watches the clusters, the control planes and the MachineDeployments they own. One pass
//! (`reconcile.rs`): the children from the caches; the plan (`plan.rs`, pure): the control
//! plane's version, each pool's version and size, pools to remove, the step of an upgrade; the
//! children as wanted (`desired.rs`); the status (`status.rs`), where an upgrade records its
//! steps in the order they finished. Pools with `minReplicas`/`maxReplicas` scale to the
//! tenant's pods (`autoscale.rs`, pure), read from watches of the tenant (`tenant.rs`).

pub(crate) mod autoscale;
mod context;
pub(crate) mod desired;
#[cfg(test)]
mod fixtures;
pub(crate) mod plan;
mod reconcile;
pub(crate) mod status;
mod tenant;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use noops_api::{KubernetesCluster, KubernetesControlPlane, Machine, MachineDeployment};

use crate::core::controller::Runtime;
use crate::core::engine::{ControllerOf, Wiring, engine};
use crate::core::labels;
use context::State;
use desired::CLUSTER_LABEL;

engine! {
    /// The KubernetesCluster engine.
    KubernetesClusters reconciles KubernetesCluster with State, named "kubernetescluster", 8 at once:
    "KubernetesCluster: a tenant cluster from one manifest, its control plane upgraded before its pools"
}

/// Its caches, and its controller woken by what changes them.
async fn wire(runtime: &Runtime, controller: ControllerOf<KubernetesCluster>) -> Wiring<KubernetesClusters> {
    let (control_planes, control_plane_changes) = runtime
        .cache::<KubernetesControlPlane>(watcher::Config::default())
        .await;
    let (deployments, deployment_changes) = runtime.cache::<MachineDeployment>(watcher::Config::default()).await;
    // The control planes' admin kubeconfigs, for reaching the tenants.
    let (secrets, _) = runtime
        .cache::<Secret>(watcher::Config::default().labels(&labels::managed_by_noops()))
        .await;
    let (machines, machine_changes) = runtime
        .cache::<Machine>(watcher::Config::default().labels(CLUSTER_LABEL))
        .await;
    // A scaling pool's tenant Pods and Nodes wake its cluster when they change.
    let (tenants, tenant_changes) = tenant::TenantViews::new();
    let state = State {
        control_planes,
        deployments,
        machines,
        secrets,
        tenants,
    };
    let controller = controller
        .owns_shared_stream(control_plane_changes)
        .owns_shared_stream(deployment_changes)
        // A pool has rolled out only once its last old machine is gone, which its
        // MachineDeployment's status does not show (it leaves out machines being deleted).
        .watches_shared_stream(machine_changes, |machine: Arc<Machine>| {
            let cluster = machine.labels().get(CLUSTER_LABEL).cloned();
            cluster.map(|name| ObjectRef::new(&name).within(&machine.namespace().unwrap_or_default()))
        })
        .reconcile_on(tenant_changes);
    Wiring::new(state, controller)
}
