//! The MachineDeployment controller: worker machines rolled out like a Deployment's pods, one
//! MachineSet per template.
//!
//! Watches the deployments and the MachineSets they made (labelled
//! `noops.dev/machinedeployment`). One pass (`reconcile.rs`): its sets from the cache; the plan
//! (`plan.rs`, pure): each set's replicas under `maxSurge`/`maxUnavailable` (or `OnDelete`),
//! sets left empty to remove; the current set from the template (`desired.rs`); the status
//! (`status.rs`), where a rollout that makes no progress within `progressDeadlineSeconds`
//! stalls with the reason its new machines give.

mod context;
pub(crate) mod desired;
pub(crate) mod plan;
#[cfg(test)]
mod plan_interleavings;
mod reconcile;
pub(crate) mod status;

use kube::runtime::watcher;
use noops_api::{MachineDeployment, MachineSet};

use crate::core::controller::Runtime;
use crate::core::engine::{ControllerOf, Wiring, engine};
use context::State;
use desired::MACHINE_DEPLOYMENT_LABEL;

engine! {
    /// The MachineDeployment engine.
    MachineDeployments reconciles MachineDeployment with State, named "machinedeployment", 8 at once:
    "MachineDeployment: worker machines rolled out like a Deployment's pods"
}

/// Its caches, and its controller woken by what changes them.
async fn wire(runtime: &Runtime, controller: ControllerOf<MachineDeployment>) -> Wiring<MachineDeployments> {
    let (sets, set_changes) = runtime
        .cache::<MachineSet>(watcher::Config::default().labels(MACHINE_DEPLOYMENT_LABEL))
        .await;
    let controller = controller.owns_shared_stream(set_changes);
    Wiring::new(State { sets }, controller)
}
