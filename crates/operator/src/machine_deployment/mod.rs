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

use std::sync::Arc;

use kube::runtime::watcher;
use noops_api::{MachineDeployment, MachineSet};

use crate::core::cache::shared_cache;
use crate::core::controller::{Registration, Runtime, controller_of, drive, scoped_api};
use context::{Context, State};
use desired::MACHINE_DEPLOYMENT_LABEL;

/// The controller's registration (`noops run --controllers machinedeployment`).
pub const CONTROLLER: Registration = Registration {
    name: "machinedeployment",
    about: "MachineDeployment: worker machines rolled out like a Deployment's pods",
    run: |runtime| Box::pin(run(runtime)),
};

/// At most this many deployments are reconciled at once.
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
    let (sets, set_changes) = shared_cache(
        scoped_api::<MachineSet>(&client, &namespace),
        watcher::Config::default().labels(MACHINE_DEPLOYMENT_LABEL),
    )
    .await;
    let ctx = Context::new(CONTROLLER.name, &client, metrics, State { sets });
    let controller = controller_of::<MachineDeployment>(&client, &namespace, MAX_CONCURRENT_RECONCILES)
        .owns_shared_stream(set_changes)
        .graceful_shutdown_on(shutdown.fired());
    drive(controller, &namespace, ctx, |md, ctx: Arc<Context>| async move {
        reconcile::reconcile(md, &ctx).await
    })
    .await;
}
