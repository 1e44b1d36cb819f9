//! The status of a MachineDeployment, from its MachineSets and the plan. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use noops_api::condition::{DEGRADED, PROGRESSING, READY};
use noops_api::machine_deployment::{MachineDeployment, MachineDeploymentStatus};
use noops_api::machine_set::MachineSet;

use super::plan::{DeploymentPlan, TEMPLATE_HASH_LABEL, template_hash};
use crate::core::conditions::{Decided, merge};
use crate::machine_set::health::scaled;

/// True while at least `replicas - maxUnavailable` machines are available.
pub const AVAILABLE: &str = "Available";

/// The status the deployment should have now; `sets` are the MachineSets it owns.
pub fn build(
    md: &MachineDeployment,
    sets: &[MachineSet],
    plan: &DeploymentPlan,
    now: jiff::Timestamp,
) -> MachineDeploymentStatus {
    let previous = md.status.clone().unwrap_or_default();
    let hash = template_hash(md);
    let is_current =
        |s: &&MachineSet| s.metadata.labels.as_ref().and_then(|l| l.get(TEMPLATE_HASH_LABEL)) == Some(&hash);
    let current = sets.iter().find(is_current);
    let sum = |f: fn(&MachineSet) -> Option<i32>| sets.iter().filter_map(f).sum::<i32>();
    let replicas = sum(|s| s.status.as_ref()?.replicas);
    let ready = sum(|s| s.status.as_ref()?.ready_replicas);
    let available = sum(|s| s.status.as_ref()?.available_replicas);
    let updated = current.and_then(|s| s.status.as_ref()?.replicas).unwrap_or(0);
    let wanted = md.spec.replicas;

    // Progress: anything moved since the last status, or a new spec.
    let moved = (Some(replicas), Some(ready), Some(updated), Some(available))
        != (
            previous.replicas,
            previous.ready_replicas,
            previous.updated_replicas,
            previous.available_replicas,
        )
        || previous.observed_generation != md.metadata.generation;
    let progress_at = if moved || previous.progress_at.is_none() {
        Time(now)
    } else {
        previous.progress_at.clone().unwrap_or(Time(now))
    };
    let deadline = jiff::SignedDuration::from_secs(md.spec.progress_deadline_seconds);
    let stalled = !plan.complete && !md.spec.paused && now >= progress_at.0 + deadline;
    let rolling = sets
        .iter()
        .any(|s| !is_current(&s) && s.status.as_ref().and_then(|st| st.replicas).unwrap_or(0) + s.spec.replicas > 0);
    let phase = if md.spec.paused && !plan.complete {
        "Paused"
    } else if stalled {
        "Stalled"
    } else if rolling {
        "Rolling"
    } else if replicas < wanted {
        "ScalingUp"
    } else if replicas > wanted {
        "ScalingDown"
    } else if plan.complete {
        "Running"
    } else {
        "ScalingUp"
    };
    let current_problem = current
        .and_then(|s| s.status.as_ref())
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == DEGRADED && c.status == "True"))
        .map(|c| format!("{}: {}", c.reason, c.message));

    let counts = format!("{available}/{wanted} available, {updated} of the current template");
    let mut decided = vec![if plan.complete {
        Decided::new(READY, true, "RolledOut", counts.clone())
    } else {
        Decided::new(
            READY,
            false,
            if rolling { "Rolling" } else { "Scaling" },
            counts.clone(),
        )
    }];
    let unavailable = md
        .spec
        .strategy
        .rolling_update
        .clone()
        .map_or(0, |r| scaled(&r.max_unavailable, wanted, false));
    decided.push(Decided::new(
        AVAILABLE,
        available >= wanted - unavailable,
        if available >= wanted - unavailable {
            "MinimumMachinesAvailable"
        } else {
            "MachinesUnavailable"
        },
        counts.clone(),
    ));
    decided.push(if stalled {
        Decided::new(
            PROGRESSING,
            false,
            "ProgressDeadlineExceeded",
            format!(
                "no progress for {}s; the old machines are left as they are until the template is fixed: {}",
                md.spec.progress_deadline_seconds,
                current_problem
                    .clone()
                    .unwrap_or_else(|| "the new machines do not become ready".into())
            ),
        )
    } else if plan.complete {
        Decided::new(PROGRESSING, true, "NewMachineSetAvailable", counts.clone())
    } else if md.spec.paused {
        Decided::new(PROGRESSING, false, "Paused", "the rollout is paused")
    } else {
        Decided::new(PROGRESSING, true, "MachineSetUpdated", counts.clone())
    });
    decided.push(match (stalled, &current_problem) {
        (true, _) => Decided::new(
            DEGRADED,
            true,
            "ProgressDeadlineExceeded",
            current_problem
                .clone()
                .unwrap_or_else(|| "the rollout makes no progress".into()),
        ),
        (false, Some(problem)) => Decided::new(DEGRADED, true, "MachinesDegraded", problem.clone()),
        (false, None) => Decided::new(DEGRADED, false, "AsExpected", "nothing is wrong"),
    });
    MachineDeploymentStatus {
        observed_generation: md.metadata.generation,
        conditions: merge(&previous.conditions, &decided, md.metadata.generation, now),
        phase: Some(phase.into()),
        replicas: Some(replicas),
        ready_replicas: Some(ready),
        updated_replicas: Some(updated),
        available_replicas: Some(available),
        selector: Some(
            md.spec
                .selector
                .match_labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(","),
        ),
        current_machine_set: plan.current.as_ref().map(|(n, _)| n.clone()),
        progress_at: Some(progress_at),
    }
}
