//! One MachineSet pass: observe (its machines) → plan (`plan.rs`, pure) → build (`desired.rs`)
//! → apply (make and delete machines) → status (`status.rs`), each once, in that order.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use noops_api::machine::Machine;
use noops_api::machine_set::{MachineSet, MachineSetStatus};
use tracing::{debug, info};

use super::context::Context;
use super::plan::{SetPlan, plan, ready};
use super::{desired, status};
use crate::core::apply::{controlled_by, controller_reference, create_if_missing, delete_if_present};
use crate::core::cache::in_namespace;
use crate::core::events::Announcement;
use crate::core::{DuringStage, Error, Result, Stage, crash};
use kube::api::ListParams;

/// How soon a set is looked at again while a machine of it is not ready (a health timeout may
/// pass without any object changing), and when all are.
const WATCHING: Duration = Duration::from_secs(5);
const STEADY: Duration = Duration::from_secs(60);

/// Why a pass that would make or delete machines reads the set and its machines from the API.
const MACHINES_BEFORE_CHANGE: &str = "machines-before-change";

/// Reconciles one set (the caller's span names it).
pub async fn reconcile(mut set: Arc<MachineSet>, ctx: &Context) -> Result<Action> {
    let namespace = set.namespace().unwrap_or_default();
    let owner = controller_reference(set.as_ref())
        .ok_or_else(|| Error::Internal("the MachineSet has no uid yet".into()))
        .during(Stage::Validate)?;
    let mut machines: Vec<Machine> = in_namespace(&ctx.machines, &namespace)
        .into_iter()
        .filter(|m| controlled_by(&m.metadata, &owner.uid))
        .collect();
    let now = jiff::Timestamp::now();
    let api: Api<Machine> = Api::namespaced(ctx.client.clone(), &namespace);

    let sets: Api<MachineSet> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut plan = plan(&set, &machines, now);
    // The cache may not hold the machines the last pass made or deleted yet, nor the last
    // status it wrote: a pass that would make or delete a machine plans again from the API's
    // own word, so that it never makes or deletes one too many, and never gives again a name
    // the status already counts as used (the set's `nextIndex`).
    if !plan.create.is_empty() || !plan.delete.is_empty() {
        let fresh = crate::core::confirm::read(&sets, &set.name_any(), MACHINES_BEFORE_CHANGE).await;
        set = Arc::new(fresh.during(Stage::Observe)?);
        let selector = format!("{}={}", desired::MACHINE_SET_LABEL, set.name_any());
        machines = crate::core::confirm::list(&api, &ListParams::default().labels(&selector), MACHINES_BEFORE_CHANGE)
            .await
            .during(Stage::Observe)?
            .items
            .into_iter()
            .filter(|m| controlled_by(&m.metadata, &owner.uid))
            .collect();
        plan = super::plan::plan(&set, &machines, now);
    }

    for name in &plan.create {
        let machine = desired::machine(&set, name, &owner);
        if create_if_missing(&api, &machine).await.during(Stage::Apply)? {
            info!(machine = %name, "made a machine");
            crash::point("machineset: a machine made, the others and the status not yet");
        }
    }
    for (name, why) in &plan.delete {
        if delete_if_present(&api, name, &Default::default())
            .await
            .during(Stage::Apply)?
        {
            info!(machine = %name, why = %why, "deleting a machine");
            crash::point("machineset: a machine deleted, status not written");
        }
    }

    let status = status::build(&set, &machines, &plan, now);
    ctx.tell(set.as_ref(), done(&plan)).await;
    let told = news(set.status.as_ref(), &status);
    // Written only over the version this pass read: a status built from a set older than
    // the last write would take `nextIndex` back, and names would be given twice.
    let mut version = set.metadata.resource_version.clone();
    if !ctx
        .report_at(set.as_ref(), set.status.as_ref(), &mut version, &status, told)
        .await?
    {
        debug!("the set changed since this pass read it: the next pass writes its status");
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let all_ready = machines.iter().all(ready) && machines.len() as i32 == set.spec.replicas;
    Ok(Action::requeue(if all_ready { STEADY } else { WATCHING }))
}

/// What the pass did, as Events: told once done, whatever becomes of the status write (a
/// machine made or deleted is not made or deleted again by the next pass, which would not tell
/// it).
fn done(plan: &SetPlan) -> Vec<Announcement> {
    let mut out = Vec::new();
    if !plan.create.is_empty() {
        out.push(Announcement::normal(
            "MachinesCreated",
            format!("made {}", plan.create.join(", ")),
        ));
    }
    for (name, why) in &plan.delete {
        let announcement = if why.starts_with("unhealthy") {
            Announcement::warning("MachineRemediated", format!("replacing {name}: {why}"))
        } else {
            Announcement::normal("MachineDeleted", format!("deleting {name}: {why}"))
        };
        out.push(announcement);
    }
    out
}

/// What changed in the status, as Events: told once it is written.
fn news(previous: Option<&MachineSetStatus>, now: &MachineSetStatus) -> Vec<Announcement> {
    let mut out = Vec::new();
    let held = |s: Option<&MachineSetStatus>| {
        s.and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == status::REMEDIATION_ALLOWED && c.status == "False")
                .map(|c| (c.reason.clone(), c.message.clone()))
        })
    };
    if let Some((reason, message)) = held(Some(now))
        && held(previous).is_none_or(|(before, _)| before != reason)
    {
        // Too many unhealthy at once needs a person; a repair waiting for the last one does not.
        out.push(if reason == "TooManyUnhealthy" {
            Announcement::warning("RemediationHeld", message)
        } else {
            Announcement::normal("RemediationWaits", message)
        });
    }
    out
}
