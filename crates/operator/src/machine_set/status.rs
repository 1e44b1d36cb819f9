//! The status of a MachineSet, from its machines and its plan. Pure.

use noops_api::condition::{DEGRADED, PROGRESSING, READY};
use noops_api::machine::{Machine, MachinePhase};
use noops_api::machine_set::{MachineSet, MachineSetStatus};

use super::plan::{SetPlan, ready};
use crate::core::conditions::{Decided, merge};

/// Degraded's reason when machines of the set are (its message names them and why).
pub const MACHINES_DEGRADED: &str = "MachinesDegraded";

/// False while unhealthy machines are left alone because too many are unhealthy at once.
pub const REMEDIATION_ALLOWED: &str = "RemediationAllowed";

/// The status the set should have now.
pub fn build(set: &MachineSet, machines: &[Machine], plan: &SetPlan, now: jiff::Timestamp) -> MachineSetStatus {
    let active: Vec<&Machine> = machines
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .collect();
    let replicas = active.len() as i32;
    let deleting = machines.len() as i32 - replicas;
    let ready_count = active.iter().filter(|m| ready(m)).count() as i32;
    let repairing: Vec<&str> = plan
        .delete
        .iter()
        .filter(|(_, why)| why.starts_with("unhealthy"))
        .map(|(n, _)| n.as_str())
        .collect();
    let available = active
        .iter()
        .filter(|m| ready(m) && !repairing.contains(&m.metadata.name.as_deref().unwrap_or_default()))
        .count() as i32;
    let wanted = set.spec.replicas;
    let mut decided = vec![if ready_count >= wanted && replicas == wanted {
        Decided::new(
            READY,
            true,
            "AllMachinesReady",
            format!("{ready_count}/{wanted} machines ready"),
        )
    } else {
        Decided::new(
            READY,
            false,
            "MachinesNotReady",
            format!("{ready_count}/{wanted} machines ready"),
        )
    }];
    let scaling = !plan.create.is_empty() || !plan.delete.is_empty() || replicas != wanted || deleting > 0;
    decided.push(Decided::new(
        PROGRESSING,
        scaling,
        if scaling { "Scaling" } else { "Steady" },
        format!("{replicas} machines, {wanted} wanted, {deleting} being deleted"),
    ));
    // Why machines cannot start or join, as their own Ready conditions say.
    let stuck: Vec<String> = active
        .iter()
        .filter(|m| {
            m.status.as_ref().is_some_and(|s| {
                s.phase == Some(MachinePhase::Failed)
                    || s.conditions.iter().any(|c| c.type_ == DEGRADED && c.status == "True")
            })
        })
        .map(|m| {
            let why = m
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == DEGRADED))
                .map(|c| format!("{}: {}", c.reason, c.message))
                .unwrap_or_default();
            format!("{} ({why})", m.metadata.name.as_deref().unwrap_or_default())
        })
        .collect();
    decided.push(match (&plan.repair_held, stuck.is_empty()) {
        (Some(held), _) => Decided::new(DEGRADED, true, held.reason, held.message.clone()),
        (None, false) => Decided::new(DEGRADED, true, MACHINES_DEGRADED, stuck.join("; ")),
        (None, true) => Decided::new(DEGRADED, false, "AsExpected", "nothing is wrong"),
    });
    decided.push(match &plan.repair_held {
        Some(held) => Decided::new(REMEDIATION_ALLOWED, false, held.reason, held.message.clone()),
        None => Decided::new(
            REMEDIATION_ALLOWED,
            true,
            "WithinMaxUnhealthy",
            format!("{} unhealthy", plan.unhealthy.len()),
        ),
    });
    let previous = set.status.clone().unwrap_or_default();
    MachineSetStatus {
        observed_generation: set.metadata.generation,
        conditions: merge(&previous.conditions, &decided, set.metadata.generation, now),
        replicas: Some(replicas),
        ready_replicas: Some(ready_count),
        available_replicas: Some(available),
        deleting_replicas: Some(deleting),
        selector: Some(selector(set)),
        next_index: Some(plan.next_index.max(previous.next_index.unwrap_or(0))),
    }
}

/// The set's selector as a label query (`pool=workers`), for the scale subresource.
pub fn selector(set: &MachineSet) -> String {
    set.spec
        .selector
        .match_labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}
