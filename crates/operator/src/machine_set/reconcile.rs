//! A MachineSet pass as the core's stages: observe (its machines) → plan (`plan.rs`, pure) →
//! apply (make and delete machines, built by `desired.rs`) → status (`status.rs`), each once,
//! in that order (`core::stages` drives them).

use std::sync::Arc;
use std::time::Duration;

use kube::api::ListParams;
use kube::{Api, ResourceExt};
use noops_api::machine::Machine;
use noops_api::machine_set::{MachineSet, MachineSetStatus};
use tracing::info;

use super::MachineSets;
use super::context::Context;
use super::plan::{SetPlan, plan, ready};
use super::{desired, status};
use crate::core::apply::{controlled_by, controller_reference, create_if_missing, delete_if_present};
use crate::core::cache::in_namespace;
use crate::core::events::Announcement;
use crate::core::stages::{Applied, Observed, Report, Stages};
use crate::core::{Error, Result, crash};

/// How soon a set is looked at again while a machine of it is not ready (a health timeout may
/// pass without any object changing), and when all are.
const WATCHING: Duration = Duration::from_secs(5);
const STEADY: Duration = Duration::from_secs(60);

/// Why a pass that would make or delete machines reads the set and its machines from the API.
const MACHINES_BEFORE_CHANGE: &str = "machines-before-change";

impl Stages for MachineSets {
    /// The set's machines.
    type Observation = Vec<Machine>;
    type Plan = SetPlan;
    type Applied = ();

    /// Written only over the version the pass read: a status built from a set older than the
    /// last write would take `nextIndex` back, and names would be given twice.
    const GUARDED: bool = true;

    /// Its machines from the cache. The cache may not hold the machines the last pass made or
    /// deleted yet, nor the last status it wrote: a pass that would make or delete a machine
    /// reads the set and its machines from the API, so that it never makes or deletes one too
    /// many, and never gives again a name the status already counts as used (`nextIndex`).
    async fn observe(
        set: Arc<MachineSet>,
        ctx: &Context,
        now: jiff::Timestamp,
    ) -> Result<Observed<MachineSet, Vec<Machine>>> {
        let namespace = set.namespace().unwrap_or_default();
        let uid = set.uid().unwrap_or_default();
        let machines: Vec<Machine> = in_namespace(&ctx.machines, &namespace)
            .into_iter()
            .filter(|m| controlled_by(&m.metadata, &uid))
            .collect();
        let planned = plan(&set, &machines, now);
        if planned.create.is_empty() && planned.delete.is_empty() {
            return Ok(Observed::new(set, machines));
        }
        let sets: Api<MachineSet> = Api::namespaced(ctx.client.clone(), &namespace);
        let fresh = Arc::new(crate::core::confirm::read(&sets, &set.name_any(), MACHINES_BEFORE_CHANGE).await?);
        let api: Api<Machine> = Api::namespaced(ctx.client.clone(), &namespace);
        let selector = format!("{}={}", desired::MACHINE_SET_LABEL, set.name_any());
        let machines =
            crate::core::confirm::list(&api, &ListParams::default().labels(&selector), MACHINES_BEFORE_CHANGE)
                .await?
                .items
                .into_iter()
                .filter(|m| controlled_by(&m.metadata, &uid))
                .collect();
        Ok(Observed::new(fresh, machines))
    }

    fn plan(set: &MachineSet, machines: &Vec<Machine>, now: jiff::Timestamp) -> Result<SetPlan> {
        Ok(plan(set, machines, now))
    }

    async fn apply(set: &MachineSet, _: &Vec<Machine>, plan: &SetPlan, ctx: &Context) -> Result<Applied<()>> {
        let owner = controller_reference(set).ok_or_else(|| Error::Internal("the MachineSet has no uid yet".into()))?;
        let api: Api<Machine> = Api::namespaced(ctx.client.clone(), &set.namespace().unwrap_or_default());
        for name in &plan.create {
            let machine = desired::machine(set, name, &owner);
            if create_if_missing(&api, &machine).await? {
                info!(machine = %name, "made a machine");
                crash::point("machineset: a machine made, the others and the status not yet");
            }
        }
        for (name, why) in &plan.delete {
            if delete_if_present(&api, name, &Default::default()).await? {
                info!(machine = %name, why = %why, "deleting a machine");
                crash::point("machineset: a machine deleted, status not written");
            }
        }
        Ok(Applied::Done(()))
    }

    fn status(
        set: &MachineSet,
        machines: &Vec<Machine>,
        plan: &SetPlan,
        applied: Option<&()>,
        now: jiff::Timestamp,
    ) -> Report<MachineSetStatus> {
        let status = status::build(set, machines, plan, now);
        let news = news(set.status.as_ref(), &status);
        let all_ready = machines.iter().all(ready) && machines.len() as i32 == set.spec.replicas;
        Report {
            status,
            done: applied.map(|()| done(plan)).unwrap_or_default(),
            news,
            next: Some(if all_ready { STEADY } else { WATCHING }),
        }
    }
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
