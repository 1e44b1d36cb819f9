//! What every pass of the MachineDeployment controller shares: the core and the MachineSets'
//! cache.

use kube::runtime::reflector::Store;
use noops_api::MachineSet;

/// What this controller keeps beside the core.
pub struct State {
    /// The MachineSets that deployments made (labelled with their deployment).
    pub sets: Store<MachineSet>,
}

/// What every reconcile of this controller shares.
pub type Context = crate::core::controller::Context<State>;
