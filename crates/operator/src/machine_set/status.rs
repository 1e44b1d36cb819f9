//! The status of a MachineSet, from its machines and its plan. Pure.

use noops_api::condition::{DEGRADED, PROGRESSING, READY};
use noops_api::machine::{Machine, MachinePhase};
use noops_api::machine_set::MachineSetReason;
use noops_api::machine_set::{MachineSet, MachineSetStatus};

use super::plan::{SetPlan, ready};
use crate::core::conditions::{Decided, merge, with_paused};
use crate::machine::status::{DRAIN_HELD, DRAINING_SUCCEEDED};

/// True while machines of the set (or of a deployment's sets) are being deleted; reason
/// [`DRAIN_HELD`] when a PodDisruptionBudget holds one's drain. What holds a scale-down or a
/// rollout, told where it is watched.
pub use noops_api::machine_set::MACHINES_DELETING;

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
            MachineSetReason::AllMachinesReady,
            format!("{ready_count}/{wanted} machines ready"),
        )
    } else {
        Decided::new(
            READY,
            false,
            MachineSetReason::MachinesNotReady,
            format!("{ready_count}/{wanted} machines ready"),
        )
    }];
    let scaling = !plan.create.is_empty() || !plan.delete.is_empty() || replicas != wanted || deleting > 0;
    decided.push(Decided::new(
        PROGRESSING,
        scaling,
        if scaling {
            MachineSetReason::Scaling
        } else {
            MachineSetReason::Steady
        },
        format!("{replicas} machines, {wanted} wanted, {deleting} being deleted"),
    ));
    decided.push(machines_deleting(machines));
    // Why machines cannot start or join, as their own Ready conditions say; and drains held
    // past their bound (the machine says DrainHeld).
    let stuck: Vec<String> = machines
        .iter()
        .filter(|m| {
            m.status.as_ref().is_some_and(|s| {
                let degraded = s.conditions.iter().find(|c| c.type_ == DEGRADED && c.status == "True");
                match m.metadata.deletion_timestamp {
                    None => s.phase == Some(MachinePhase::Failed) || degraded.is_some(),
                    Some(_) => degraded.is_some_and(|c| c.reason == DRAIN_HELD),
                }
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
        (None, false) => Decided::new(DEGRADED, true, MachineSetReason::MachinesDegraded, stuck.join("; ")),
        (None, true) => Decided::new(DEGRADED, false, MachineSetReason::AsExpected, "nothing is wrong"),
    });
    decided.push(match &plan.repair_held {
        Some(held) => Decided::new(REMEDIATION_ALLOWED, false, held.reason, held.message.clone()),
        None => Decided::new(
            REMEDIATION_ALLOWED,
            true,
            MachineSetReason::WithinMaxUnhealthy,
            format!("{} unhealthy", plan.unhealthy.len()),
        ),
    });
    let previous = set.status.clone().unwrap_or_default();
    MachineSetStatus {
        observed_generation: set.metadata.generation,
        conditions: merge(
            &previous.conditions,
            &with_paused(&decided, set.spec.paused),
            set.metadata.generation,
            now,
        ),
        replicas: Some(replicas),
        ready_replicas: Some(ready_count),
        available_replicas: Some(available),
        deleting_replicas: Some(deleting),
        selector: Some(selector(set)),
        next_index: Some(plan.next_index.max(previous.next_index.unwrap_or(0))),
    }
}

/// [`MACHINES_DELETING`] of a set: which of its machines are being deleted, and what a
/// PodDisruptionBudget holds (from each machine's DrainingSucceeded condition).
fn machines_deleting(machines: &[Machine]) -> Decided<MachineSetReason> {
    let deleting: Vec<&Machine> = machines
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_some())
        .collect();
    let name = |m: &Machine| m.metadata.name.clone().unwrap_or_default();
    let held: Vec<String> = deleting
        .iter()
        .filter_map(|m| {
            let drain = m
                .status
                .as_ref()?
                .conditions
                .iter()
                .find(|c| c.type_ == DRAINING_SUCCEEDED && c.reason == "EvictionBlocked")?;
            Some(format!("machine {}: {}", name(m), drain.message))
        })
        .collect();
    match (deleting.is_empty(), held.is_empty()) {
        (true, _) => Decided::new(
            MACHINES_DELETING,
            false,
            MachineSetReason::NoneDeleting,
            "no machine is being deleted",
        ),
        (false, false) => Decided::new(MACHINES_DELETING, true, MachineSetReason::DrainHeld, held.join("; ")),
        (false, true) => Decided::new(
            MACHINES_DELETING,
            true,
            MachineSetReason::Deleting,
            format!(
                "draining or removing {}",
                deleting.iter().map(|m| name(m)).collect::<Vec<_>>().join(", ")
            ),
        ),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fixtures::condition;
    use crate::machine::fixtures::machine;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use noops_api::machine::MachineStatus;

    fn set() -> MachineSet {
        let spec = serde_json::from_value(serde_json::json!({
            "clusterName": "c", "replicas": 1,
            "selector": { "matchLabels": { "pool": "p" } },
            "template": { "metadata": { "labels": { "pool": "p" } }, "spec": { "version": "1.34" } },
        }))
        .unwrap();
        MachineSet::new("pool", spec)
    }

    fn leaving(name: &str, conditions: Vec<Condition>) -> Machine {
        let mut m = machine(name, "c", "1.34");
        m.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
        m.status = Some(MachineStatus {
            phase: Some(MachinePhase::Deleting),
            conditions,
            ..Default::default()
        });
        m
    }

    fn found<'a>(status: &'a MachineSetStatus, type_: &str) -> (&'a str, &'a str, &'a str) {
        let c = status.conditions.iter().find(|c| c.type_ == type_).unwrap();
        (c.status.as_str(), c.reason.as_str(), c.message.as_str())
    }

    #[test]
    fn a_drain_a_budget_holds_is_named_on_the_set_then_degrades_it_past_its_bound() {
        let now = jiff::Timestamp::now();
        let plan = SetPlan::default();
        let blocked = condition(
            DRAINING_SUCCEEDED,
            false,
            "EvictionBlocked",
            "a PodDisruptionBudget keeps shop/web-1 (budget web needs 1 healthy pods and has 1) on the Node for now",
        );
        let draining = leaving("pool-a", vec![blocked.clone()]);
        let status = build(&set(), &[draining], &plan, now);
        let (s, reason, message) = found(&status, MACHINES_DELETING);
        assert_eq!((s, reason), ("True", DRAIN_HELD));
        assert!(
            message.starts_with("machine pool-a: ") && message.contains("budget web"),
            "{message}"
        );
        assert_eq!(found(&status, DEGRADED).0, "False", "held, not yet for long");

        // The machine says its drain was held past its bound: the set is degraded.
        let long = condition(DEGRADED, true, DRAIN_HELD, "its drain has waited 6 min: ...");
        let status = build(&set(), &[leaving("pool-a", vec![blocked, long])], &plan, now);
        let (s, reason, message) = found(&status, DEGRADED);
        assert_eq!((s, reason), ("True", MachineSetReason::MachinesDegraded.as_str()));
        assert!(message.contains("pool-a (DrainHeld"), "{message}");

        // A machine going that nothing holds is said, not as held; none going, nothing said.
        let status = build(&set(), &[leaving("pool-b", vec![])], &plan, now);
        assert_eq!(
            found(&status, MACHINES_DELETING),
            ("True", "Deleting", "draining or removing pool-b")
        );
        let status = build(&set(), &[], &plan, now);
        assert_eq!(found(&status, MACHINES_DELETING).0, "False");
    }
}
