//! What every pass of the KubernetesCluster controller shares: the core and the caches of its
//! children.

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::Store;
use noops_api::{KubernetesControlPlane, Machine, MachineDeployment};

use super::tenant::TenantViews;

/// What this controller keeps beside the core.
pub struct State {
    /// Control planes (of every cluster: a name may be taken by one that is not ours).
    pub control_planes: Store<KubernetesControlPlane>,
    /// MachineDeployments (likewise).
    pub deployments: Store<MachineDeployment>,
    /// The clusters' machines (labelled with their cluster and pool).
    pub machines: Store<Machine>,
    /// Secrets the operator made (a control plane's admin kubeconfig among them).
    pub secrets: Store<Secret>,
    /// The tenants of clusters with a pool that scales itself: their Pods and Nodes.
    pub tenants: TenantViews,
}

/// What every reconcile of this controller shares.
pub type Context = crate::core::controller::Context<State>;
