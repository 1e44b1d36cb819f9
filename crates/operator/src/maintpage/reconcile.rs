//! A MaintPage pass as the core's stages: observe → validate → plan → apply (build the
//! children, apply them) → status, each entered once, in that order (`core::stages` drives
//! them).

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use noops_api::maintpage::MaintPageReason;
use noops_api::maintpage::{MaintPage, MaintPageStatus, Side};

use super::MaintPages;
use super::context::Context;
use super::observe::Observation;
use super::{apply, desired, observe, status, switch, validate};
use crate::core::apply::controller_reference;
use crate::core::events::Announcement;
use crate::core::stages::{Applied, Observed, Refusal, Report, Stages};
use crate::core::{Error, Result};

/// How soon a pass that found a child changed while it applied looks again.
const CHILD_CHANGED: Duration = Duration::from_millis(50);

/// What a MaintPage's apply did: the Deployments as applied (their status feeds the
/// MaintPage's), and the hand edits it took back.
pub struct Done {
    children: apply::Applied,
    taken_back: Vec<Announcement>,
}

impl Stages for MaintPages {
    type Observation = Observation;
    type Plan = switch::Plan;
    type Applied = Done;

    async fn observe(
        mp: Arc<MaintPage>,
        ctx: &Context,
        now: jiff::Timestamp,
    ) -> Result<Observed<MaintPage, Observation>> {
        let namespace = mp.namespace().unwrap_or_else(|| "default".into());
        let seen = observe::observe(&mp, &namespace, ctx, now).await?;
        Ok(Observed::new(mp, seen))
    }

    fn validate(mp: &MaintPage, seen: &Observation) -> std::result::Result<(), Refusal<MaintPageReason>> {
        validate::validate(mp, &seen.live).map_err(|error| {
            let reason = MaintPageReason::from_name(error.reason()).unwrap_or(MaintPageReason::InvalidSpec);
            Refusal::new(reason, error)
        })
    }

    fn refused(
        mp: &MaintPage,
        _: &Observation,
        refusal: &Refusal<MaintPageReason>,
        now: jiff::Timestamp,
    ) -> Report<MaintPageStatus> {
        Report::of(status::blocked(mp, refusal.reason, &refusal.error.to_string(), now))
    }

    fn plan(mp: &MaintPage, seen: &Observation, now: jiff::Timestamp) -> Result<switch::Plan> {
        Ok(switch::plan(&mp.spec, &seen.facts, now))
    }

    async fn apply(mp: &MaintPage, seen: &Observation, plan: &switch::Plan, ctx: &Context) -> Result<Applied<Done>> {
        let owner = controller_reference(mp).ok_or_else(|| Error::Internal("the MaintPage has no uid yet".into()))?;
        let children = desired::build(mp, plan, &ctx.images, &owner);
        let hand_edits = apply::hand_edits(&children, &seen.live);
        let namespace = mp.namespace().unwrap_or_else(|| "default".into());
        let Some(applied) = apply::apply_children(&ctx.client, &namespace, &children, &seen.live).await? else {
            return Ok(Applied::Again {
                after: CHILD_CHANGED,
                why: "a child changed while reconciling",
            });
        };
        let taken_back = hand_edits
            .into_iter()
            .map(|(reason, note)| Announcement::warning(reason, note))
            .collect();
        Ok(Applied::Done(Done {
            children: applied,
            taken_back,
        }))
    }

    fn status(
        mp: &MaintPage,
        seen: &Observation,
        plan: &switch::Plan,
        applied: Option<&Done>,
        now: jiff::Timestamp,
    ) -> Report<MaintPageStatus> {
        let facts = |app, maintenance| status::StatusFacts {
            app,
            maintenance,
            app_stuck: seen.app_stuck.as_ref(),
            maintenance_stuck: seen.maintenance_stuck.as_ref(),
        };
        let Some(done) = applied else {
            // Paused: the Service stays where it is; the status says how the children stand.
            let facts = facts(seen.live.app.as_ref(), seen.live.maintenance.as_ref());
            return Report::of(status::paused(mp, &facts, now));
        };
        let facts = facts(Some(&done.children.app), Some(&done.children.maintenance));
        let status = status::build(mp, plan, &facts, now);
        let mut news = announcements(mp, plan);
        if let Some(degraded) = status::newly_degraded(mp.status.as_ref(), &status) {
            news.push(Announcement::warning(&degraded.reason, degraded.message.clone()));
        }
        // A pod that waits for a node is said to be stuck only after a while: look again then.
        let next = [plan.requeue_after, seen.recheck_after].into_iter().flatten().min();
        Report {
            status,
            done: done.taken_back.clone(),
            news,
            next,
        }
    }
}

/// What the pass did that is worth an Event: a switch, a switch held
/// until the pods are Ready, a side published for the first time. Event reasons differ by
/// what happened, so that each reads as its own kind of news. Pure.
fn announcements(mp: &MaintPage, plan: &switch::Plan) -> Vec<Announcement> {
    let mut out = Vec::new();
    let side = |side: Side| match side {
        Side::App => "the app",
        Side::Maintenance => "the maintenance page",
    };
    let service = &mp.spec.app.name;
    if plan.switched {
        let reason = match plan.publish {
            Side::App => "SwitchedToApp",
            Side::Maintenance => "SwitchedToMaintenance",
        };
        let note = format!("Service {service} now sends traffic to {}", side(plan.publish));
        out.push(Announcement::normal(reason, note));
    }
    if let Some(waiting) = plan.waiting_for.filter(|_| plan.started_waiting) {
        let (reason, pods) = match waiting {
            Side::App => ("WaitingForApp", "app"),
            Side::Maintenance => ("WaitingForMaintenance", "maintenance"),
        };
        let note = format!("the Service switches once the {pods} pods are Ready");
        out.push(Announcement::normal(reason, note));
    }
    if plan.first_publish {
        let note = format!("Service {service} sends traffic to {}", side(plan.publish));
        out.push(Announcement::normal("Published", note));
    }
    out
}
