//! One MaintPage reconcile, one pass: observe → validate → plan → build → apply → status, each
//! stage entered once, in that order.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use noops_api::maintpage::MaintPageReason;
use noops_api::maintpage::{MaintPage, Side};
use tracing::debug;

use super::context::Context;
use super::{apply, desired, observe, status, switch, validate};
use crate::core::apply::controller_reference;
use crate::core::events::Announcement;
use crate::core::{DuringStage, Error, Result, Stage};

/// Reconciles one MaintPage (the caller's span names it).
pub async fn reconcile(mp: Arc<MaintPage>, ctx: &Context) -> Result<Action> {
    let namespace = mp.namespace().unwrap_or_else(|| "default".into());
    let now = jiff::Timestamp::now();

    let observation = observe::observe(&mp, &namespace, ctx, now)
        .await
        .during(Stage::Observe)?;

    if let Err(error) = validate::validate(&mp, &observation.live) {
        let reason = MaintPageReason::from_name(error.reason()).unwrap_or(MaintPageReason::InvalidSpec);
        let blocked = status::blocked(&mp, reason, &error.to_string(), now);
        // Told once, when the status first says so.
        let told =
            (mp.status.as_ref() != Some(&blocked)).then(|| Announcement::warning(error.reason(), error.to_string()));
        ctx.report(mp.as_ref(), mp.status.as_ref(), &blocked, told).await?;
        return Err(error).during(Stage::Validate);
    }

    if mp.spec.paused {
        let seen = status::StatusFacts {
            app: observation.live.app.as_ref(),
            maintenance: observation.live.maintenance.as_ref(),
            app_stuck: observation.app_stuck.as_ref(),
            maintenance_stuck: observation.maintenance_stuck.as_ref(),
        };
        let status = status::paused(&mp, &seen, now);
        let note = "spec.paused: the operator changes nothing (no switch, no hand edit reverted) until it is false";
        let told = (!is_paused(mp.status.as_ref())).then(|| Announcement::normal("Paused", note));
        ctx.report(mp.as_ref(), mp.status.as_ref(), &status, told).await?;
        debug!("paused: the app's objects are left as they are");
        return Ok(Action::await_change());
    }

    let plan = switch::plan(&mp.spec, &observation.facts, now);
    let owner = controller_reference(mp.as_ref())
        .ok_or_else(|| Error::Internal("the MaintPage has no uid yet".into()))
        .during(Stage::Validate)?;
    let children = desired::build(&mp, &plan, &ctx.images, &owner);
    let hand_edits = apply::hand_edits(&children, &observation.live);

    let Some(applied) = apply::apply_children(&ctx.client, &namespace, &children, &observation.live)
        .await
        .during(Stage::Apply)?
    else {
        debug!("a child changed while reconciling; looking again");
        return Ok(Action::requeue(Duration::from_millis(50)));
    };
    // Hand edits taken back are told now, whatever becomes of the status write: the next pass
    // finds nothing to take back and would not tell them.
    let taken_back: Vec<Announcement> = hand_edits
        .into_iter()
        .map(|(reason, note)| Announcement::warning(reason, note))
        .collect();
    ctx.tell(mp.as_ref(), taken_back).await;
    let mut told = announcements(&mp, &plan, Vec::new());
    let seen = status::StatusFacts {
        app: Some(&applied.app),
        maintenance: Some(&applied.maintenance),
        app_stuck: observation.app_stuck.as_ref(),
        maintenance_stuck: observation.maintenance_stuck.as_ref(),
    };
    let status = status::build(&mp, &plan, &seen, now);
    if let Some(degraded) = status::newly_degraded(mp.status.as_ref(), &status) {
        told.push(Announcement::warning(&degraded.reason, degraded.message.clone()));
    }
    if is_paused(mp.status.as_ref()) {
        let note = "spec.paused is false: the operator manages the app's objects again";
        told.push(Announcement::normal("Resumed", note));
    }
    ctx.report(mp.as_ref(), mp.status.as_ref(), &status, told).await?;
    // A pod that waits for a node is said to be stuck only after a while: look again then.
    let requeue = [plan.requeue_after, observation.recheck_after]
        .into_iter()
        .flatten()
        .min();
    Ok(requeue.map(Action::requeue).unwrap_or_else(Action::await_change))
}

/// Whether the status was written by a paused pass.
fn is_paused(status: Option<&noops_api::maintpage::MaintPageStatus>) -> bool {
    status.is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == noops_api::condition::PROGRESSING && c.reason == "Paused")
    })
}

/// What the pass did that is worth an Event: hand edits reverted, a switch, a switch held
/// until the pods are Ready, a side published for the first time. Event reasons differ by
/// what happened, so that each reads as its own kind of news. Pure.
fn announcements(mp: &MaintPage, plan: &switch::Plan, hand_edits: Vec<(&'static str, String)>) -> Vec<Announcement> {
    let mut out: Vec<Announcement> = hand_edits
        .into_iter()
        .map(|(reason, note)| Announcement::warning(reason, note))
        .collect();
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
