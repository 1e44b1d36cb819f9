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

use crate::core::cache::shared_cache;
use crate::core::controller::{Registration, Runtime, controller_of, drive, scoped_api};
use context::{Context, State};
use desired::MACHINE_SET_LABEL;

/// The controller's registration (`noops run --controllers machineset`).
pub const CONTROLLER: Registration = Registration {
    name: "machineset",
    about: "MachineSet: a number of identical Machines, kept in number and repaired",
    run: |runtime| Box::pin(run(runtime)),
};

/// At most this many sets are reconciled at once.
const MAX_CONCURRENT_RECONCILES: u16 = 8;

/// Runs the controller in `runtime.namespace` (all namespaces if `None`) until shutdown.
pub async fn run(runtime: Runtime) {
    let Runtime {
        client,
        namespace,
        metrics,
        shutdown,
        ..
    } = runtime;
    let (machines, machine_changes) = shared_cache(
        scoped_api::<Machine>(&client, &namespace),
        watcher::Config::default().labels(MACHINE_SET_LABEL),
    )
    .await;
    let ctx = Context::new(CONTROLLER.name, &client, metrics, State { machines });
    let controller = controller_of::<MachineSet>(&client, &namespace, MAX_CONCURRENT_RECONCILES)
        .owns_shared_stream(machine_changes)
        .graceful_shutdown_on(shutdown.fired());
    drive(controller, &namespace, ctx, |set, ctx: Arc<Context>| async move {
        reconcile::reconcile(set, &ctx).await
    })
    .await;
}
