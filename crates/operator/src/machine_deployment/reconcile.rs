//! A MachineDeployment pass as the core's stages: observe (its sets) → plan (`plan.rs`, pure)
//! → apply (make, scale and remove sets, built by `desired.rs`) → status (`status.rs`), each
//! once, in that order (`core::stages` drives them).

use noops_api::machine_deployment::MachineDeploymentPhase;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use noops_api::machine_deployment::{MachineDeployment, MachineDeploymentStatus};
use noops_api::machine_set::MachineSet;
use serde_json::json;
use tracing::info;

use super::MachineDeployments;
use super::context::Context;
use super::desired;
use super::plan::{DeploymentPlan, SetView, plan};
use super::status;
use crate::core::apply::{apply, controlled_by, controller_reference, create_if_missing, delete_if_present};
use crate::core::cache::in_namespace;
use crate::core::events::Announcement;
use crate::core::stages::{Applied, Observed, Report, Stages};
use crate::core::{DuringStage, Error, Result, Stage, crash};

/// How soon a deployment is looked at again while it rolls (its progress deadline is a time,
/// not a change), and when it is steady.
const ROLLING: Duration = Duration::from_secs(5);
const STEADY: Duration = Duration::from_secs(120);

impl Stages for MachineDeployments {
    /// The deployment's sets.
    type Observation = Vec<MachineSet>;
    type Plan = DeploymentPlan;
    type Applied = ();

    /// Its sets from the cache. A pass that would change a set reads them from the API: the
    /// cache may not hold the last pass's changes yet, and a set's status counted from an old
    /// view could let an older set shrink further than maxUnavailable allows.
    async fn observe(
        md: Arc<MachineDeployment>,
        ctx: &Context,
        _: jiff::Timestamp,
    ) -> Result<Observed<MachineDeployment, Vec<MachineSet>>> {
        let namespace = md.namespace().unwrap_or_default();
        let uid = md.uid().unwrap_or_default();
        let sets: Vec<MachineSet> = in_namespace(&ctx.sets, &namespace)
            .into_iter()
            .filter(|s| controlled_by(&s.metadata, &uid))
            .collect();
        if md.spec.paused || !changes_anything(&plan_of(&md, &sets), &sets) {
            return Ok(Observed::new(md, sets));
        }
        let api: Api<MachineSet> = Api::namespaced(ctx.client.clone(), &namespace);
        let selector = format!("{}={}", desired::MACHINE_DEPLOYMENT_LABEL, md.name_any());
        let sets = crate::core::confirm::list(&api, &ListParams::default().labels(&selector), "sets-before-change")
            .await?
            .items
            .into_iter()
            .filter(|s| controlled_by(&s.metadata, &uid))
            .collect();
        Ok(Observed::new(md, sets))
    }

    fn plan(md: &MachineDeployment, sets: &Vec<MachineSet>, _: jiff::Timestamp) -> Result<DeploymentPlan> {
        Ok(plan_of(md, sets))
    }

    async fn apply(
        md: &MachineDeployment,
        sets: &Vec<MachineSet>,
        plan: &DeploymentPlan,
        ctx: &Context,
    ) -> Result<Applied<()>> {
        let owner =
            controller_reference(md).ok_or_else(|| Error::Internal("the MachineDeployment has no uid yet".into()))?;
        let api: Api<MachineSet> = Api::namespaced(ctx.client.clone(), &md.namespace().unwrap_or_default());
        apply_plan(md, plan, sets, &api, &owner).await?;
        Ok(Applied::Done(()))
    }

    fn status(
        md: &MachineDeployment,
        sets: &Vec<MachineSet>,
        plan: &DeploymentPlan,
        _: Option<&()>,
        now: jiff::Timestamp,
    ) -> Report<MachineDeploymentStatus> {
        let status = status::build(md, sets, plan, now);
        let news = announcements(md.status.as_ref(), &status);
        Report {
            status,
            done: Vec::new(),
            news,
            next: Some(if plan.complete { STEADY } else { ROLLING }),
        }
    }
}

/// The plan of `md` over `sets` (pure).
fn plan_of(md: &MachineDeployment, sets: &[MachineSet]) -> DeploymentPlan {
    plan(md, &sets.iter().map(SetView::of).collect::<Vec<_>>())
}

/// Makes, scales and removes the sets as `plan` says.
async fn apply_plan(
    md: &MachineDeployment,
    plan: &DeploymentPlan,
    sets: &[MachineSet],
    api: &Api<MachineSet>,
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
) -> Result<()> {
    if let Some((name, replicas)) = &plan.current {
        let live = sets.iter().find(|s| s.metadata.name.as_ref() == Some(name));
        let desired = desired::machine_set(md, name, *replicas, owner);
        // The current set follows the deployment's settings; its template never changes.
        let changed = live.is_none_or(|l| {
            l.spec.replicas != desired.spec.replicas
                || l.spec.delete_policy != desired.spec.delete_policy
                || l.spec.health_check != desired.spec.health_check
        });
        match live {
            // Made, never overwritten: a view that has not seen the set yet must not set its
            // replicas from nothing.
            None => {
                if create_if_missing(api, &desired).await.during(Stage::Apply)? {
                    info!(set = %name, replicas, "made the MachineSet of the current template");
                    crash::point("machinedeployment: new set made, older sets not scaled");
                }
            }
            Some(_) if changed => {
                apply(api, name, &desired).await.during(Stage::Apply)?;
            }
            Some(_) => {}
        }
    }
    for (name, replicas) in &plan.older {
        let live = sets.iter().find(|s| s.metadata.name.as_ref() == Some(name));
        if live.is_some_and(|l| l.spec.replicas != *replicas) {
            let body = json!({ "spec": { "replicas": replicas } });
            api.patch(name, &PatchParams::default(), &Patch::Merge(body))
                .await
                .during(Stage::Apply)?;
            info!(set = %name, replicas, "scaled an older MachineSet");
            crash::point("machinedeployment: an older set scaled down, status not written");
        }
    }
    for name in &plan.remove {
        delete_if_present(api, name, &Default::default())
            .await
            .during(Stage::Apply)?;
        info!(set = %name, "removed an older MachineSet with no machine left");
    }
    Ok(())
}

/// Whether carrying out `plan` changes any of `sets`.
fn changes_anything(plan: &DeploymentPlan, sets: &[MachineSet]) -> bool {
    let replicas_of = |name: &str| {
        sets.iter()
            .find(|s| s.metadata.name.as_deref() == Some(name))
            .map(|s| s.spec.replicas)
    };
    plan.make_current
        || !plan.remove.is_empty()
        || plan
            .current
            .iter()
            .chain(plan.older.iter())
            .any(|(name, replicas)| replicas_of(name) != Some(*replicas))
}

/// A new phase, a stall, as Events.
fn announcements(previous: Option<&MachineDeploymentStatus>, now: &MachineDeploymentStatus) -> Vec<Announcement> {
    let mut out = Vec::new();
    let phase = |s: Option<&MachineDeploymentStatus>| s.and_then(|s| s.phase);
    if phase(Some(now)) != phase(previous)
        && let Some(p) = phase(Some(now))
    {
        let note = format!(
            "{}/{} machines available, {} of the current template ({}), {} being deleted",
            now.available_replicas.unwrap_or(0),
            now.replicas.unwrap_or(0),
            now.updated_replicas.unwrap_or(0),
            now.current_machine_set.clone().unwrap_or_default(),
            now.deleting_replicas.unwrap_or(0)
        );
        let stalled = now
            .conditions
            .iter()
            .find(|c| c.type_ == noops_api::condition::PROGRESSING && c.reason == "ProgressDeadlineExceeded");
        out.push(match stalled {
            Some(c) if p == MachineDeploymentPhase::Stalled => {
                Announcement::warning("ProgressDeadlineExceeded", c.message.clone())
            }
            _ => Announcement::normal(p.as_str(), note),
        });
    }
    out
}
