//! What every pass of the MachineSet controller shares: the core and the Machines' cache.

use kube::runtime::reflector::Store;
use noops_api::Machine;

/// What this controller keeps beside the core.
pub struct State {
    /// The Machines that MachineSets made (labelled with their set).
    pub machines: Store<Machine>,
}

/// What every reconcile of this controller shares.
pub type Context = crate::core::controller::Context<State>;
