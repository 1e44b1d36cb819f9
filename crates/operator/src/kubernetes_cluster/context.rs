//! What every pass of the KubernetesCluster controller shares: the core and the caches of its
//! children.

use kube::runtime::reflector::Store;
use noops_api::{KubernetesControlPlane, MachineDeployment};

/// What this controller keeps beside the core.
pub struct State {
    /// Control planes (of every cluster: a name may be taken by one that is not ours).
    pub control_planes: Store<KubernetesControlPlane>,
    /// MachineDeployments (likewise).
    pub deployments: Store<MachineDeployment>,
}

/// What every reconcile of this controller shares.
pub type Context = crate::core::controller::Context<State>;
