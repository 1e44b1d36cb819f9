//! The MachineSet controller: a number of identical Machines, kept in number and repaired.
//!
//! Watches the sets and the Machines they made (labelled `noops.dev/machineset`). One pass
//! (`reconcile.rs`): its machines from the cache; the plan (`plan.rs`, pure): unhealthy
//! machines (`health.rs`) to replace unless more than `maxUnhealthy` are, machines to make
//! under stable names, machines to delete in the deletion order; the machines from the
//! template (`desired.rs`); the status (`status.rs`). Machines drain themselves when deleted
//! (the Machine controller), so a set only deletes them.

mod context;
pub(crate) mod desired;
pub(crate) mod health;
pub(crate) mod plan;
mod reconcile;
pub(crate) mod status;

use kube::runtime::watcher;
use noops_api::{Machine, MachineSet};

use crate::core::controller::Runtime;
use crate::core::engine::{ControllerOf, Wiring, engine};
use context::State;
use desired::MACHINE_SET_LABEL;

engine! {
    /// The MachineSet engine.
    MachineSets reconciles MachineSet with State, named "machineset", 8 at once:
    "MachineSet: a number of identical Machines, kept in number and repaired"
}

/// Its caches, and its controller woken by what changes them.
async fn wire(runtime: &Runtime, controller: ControllerOf<MachineSet>) -> Wiring<MachineSets> {
    let (machines, machine_changes) = runtime
        .cache::<Machine>(watcher::Config::default().labels(MACHINE_SET_LABEL))
        .await;
    let controller = controller.owns_shared_stream(machine_changes);
    Wiring::new(State { machines }, controller)
}
