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

use std::sync::Arc;

use kube::runtime::watcher;
use noops_api::{Machine, MachineSet};

use crate::core::controller::{Registration, Runtime};
use context::{Context, State};
use desired::MACHINE_SET_LABEL;

/// The controller's registration (`noops run --controllers machineset`).
pub const CONTROLLER: Registration = Registration {
    name: "machineset",
    about: "MachineSet: a number of identical Machines, kept in number and repaired",
    concurrency: 8,
    run: |runtime| Box::pin(run(runtime)),
};

/// Runs the controller in `runtime.namespace` (all namespaces if `None`) until shutdown.
pub async fn run(runtime: Runtime) {
    let (machines, machine_changes) = runtime
        .cache::<Machine>(watcher::Config::default().labels(MACHINE_SET_LABEL))
        .await;
    let controller = runtime
        .controller::<MachineSet>(CONTROLLER.concurrency)
        .owns_shared_stream(machine_changes);
    runtime
        .serve(
            CONTROLLER.name,
            controller,
            State { machines },
            |set, ctx: Arc<Context>| async move { reconcile::reconcile(set, &ctx).await },
        )
        .await;
}
