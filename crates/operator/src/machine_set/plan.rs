//! What a MachineSet does next: which unhealthy machines it replaces (unless too many are
//! unhealthy at once), how many machines it makes, and which go when it shrinks. Pure: it is
//! read again from the machines as they are on every pass, so a restarted operator carries on.

use noops_api::machine::{Machine, MachinePhase};
use noops_api::machine_set::MachineSetReason;
use noops_api::machine_set::{DELETE_MACHINE_ANNOTATION, DeletePolicy, MachineSet};
use serde_json::json;

use super::health::{scaled, unhealthy};
use crate::core::conditions::is_true;
use crate::core::stamp::hash_of;

/// What the set does in this pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetPlan {
    /// Machines to make (their names).
    pub create: Vec<String>,
    /// Machines to delete, and why.
    pub delete: Vec<(String, String)>,
    /// Unhealthy machines (name, why).
    pub unhealthy: Vec<(String, String)>,
    /// Why unhealthy machines are left alone: too many are unhealthy at once, or repairs under
    /// way already take what `maxUnhealthy` allows.
    pub repair_held: Option<RepairHeld>,
    /// The index the next machine name comes from after this pass.
    pub next_index: i64,
}

/// Why a set repairs nothing this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairHeld {
    /// `TooManyUnhealthy` (the cause is probably not the machines) or `RepairsUnderWay`.
    pub reason: MachineSetReason,
    pub message: String,
}

fn name_of(m: &Machine) -> String {
    m.metadata.name.clone().unwrap_or_default()
}

/// Whether a machine counts as ready: Running with its Node Ready.
pub fn ready(m: &Machine) -> bool {
    m.status
        .as_ref()
        .is_some_and(|s| s.phase == Some(MachinePhase::Running) && is_true(&s.conditions, noops_api::condition::READY))
}

/// The name of the `index`th machine the set may make: stable for a set, so a pass that does
/// not see the machine the last one made yet asks for the same name (and is told it exists)
/// rather than making one more.
pub fn machine_name(set: &MachineSet, index: i64) -> String {
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let hash = hash_of(&json!([set.metadata.uid, index]));
    format!("{set_name}-{}", &hash[..5])
}

/// The order in which machines go when the set shrinks: those not ready, then those marked with
/// the annotation, then by `policy`. Not ready first, even before a marked machine, because a
/// MachineDeployment counts on it: it lets an older set give up its broken machines at no cost
/// to `maxUnavailable`, and a marked machine that is Ready would cost one.
pub fn deletion_order<'a>(machines: &[&'a Machine], policy: DeletePolicy) -> Vec<&'a Machine> {
    let mut ordered: Vec<&Machine> = machines.to_vec();
    let created = |m: &Machine| m.metadata.creation_timestamp.as_ref().map(|t| t.0);
    ordered.sort_by(|a, b| {
        let marked = |m: &Machine| {
            !m.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(DELETE_MACHINE_ANNOTATION))
        };
        let by_policy = match policy {
            DeletePolicy::Oldest => created(a).cmp(&created(b)),
            DeletePolicy::Newest => created(b).cmp(&created(a)),
            DeletePolicy::Random => hash_of(&json!(name_of(a))).cmp(&hash_of(&json!(name_of(b)))),
        };
        (ready(a), marked(a))
            .cmp(&(ready(b), marked(b)))
            .then(by_policy)
            .then(name_of(a).cmp(&name_of(b)))
    });
    ordered
}

/// The set's next step over `machines` (those it owns, being deleted or not).
pub fn plan(set: &MachineSet, machines: &[Machine], now: jiff::Timestamp) -> SetPlan {
    let spec = &set.spec;
    let active: Vec<&Machine> = machines
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .collect();
    let mut out = SetPlan {
        unhealthy: active
            .iter()
            .filter_map(|m| unhealthy(m, &spec.health_check, now).map(|why| (name_of(m), why)))
            .collect(),
        ..Default::default()
    };
    let allowed = scaled(
        &spec.health_check.max_unhealthy,
        spec.replicas.max(active.len() as i32),
        true,
    );
    // A machine still being deleted that is not ready is a repair under way (or a machine that
    // is unavailable anyway): until it is gone it counts against maxUnhealthy, so that repairs
    // one after another never have more machines out at once than it allows.
    let under_way = machines
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_some() && !ready(m))
        .count() as i32;
    let unhealthy = out.unhealthy.len() as i32;
    out.repair_held = if unhealthy > allowed {
        Some(RepairHeld {
            reason: MachineSetReason::TooManyUnhealthy,
            message: format!(
                "{unhealthy} of {} machines are unhealthy, more than maxUnhealthy allows ({allowed}): the cause is probably not the machines, so none is replaced",
                active.len()
            ),
        })
    } else if unhealthy > 0 && unhealthy + under_way > allowed {
        Some(RepairHeld {
            reason: MachineSetReason::RepairsUnderWay,
            message: format!(
                "{unhealthy} unhealthy machines wait: {under_way} being deleted are not gone yet, and maxUnhealthy allows {allowed} out at once"
            ),
        })
    } else {
        None
    };
    let repaired: Vec<String> = match out.repair_held {
        None => out.unhealthy.iter().map(|(n, _)| n.clone()).collect(),
        Some(_) => Vec::new(),
    };
    for (name, why) in &out.unhealthy {
        if repaired.contains(name) {
            out.delete.push((name.clone(), format!("unhealthy: {why}")));
        }
    }
    let remaining: Vec<&Machine> = active
        .iter()
        .copied()
        .filter(|m| !repaired.contains(&name_of(m)))
        .collect();
    let missing = spec.replicas - remaining.len() as i32;
    let taken: Vec<String> = machines.iter().map(name_of).collect();
    // The names a pass gave whose status write did not land (the set changed meanwhile) are
    // used too: the next index is past them, so that none is ever given again.
    let mut first = set.status.as_ref().and_then(|s| s.next_index).unwrap_or(0);
    while taken.contains(&machine_name(set, first)) {
        first += 1;
    }
    out.next_index = first;
    if missing > 0 {
        let fresh: Vec<(i64, String)> = (first..)
            .map(|i| (i, machine_name(set, i)))
            .filter(|(_, n)| !taken.contains(n))
            .take(missing as usize)
            .collect();
        out.next_index = fresh.last().map_or(first, |(i, _)| i + 1);
        out.create = fresh.into_iter().map(|(_, n)| n).collect();
    } else if missing < 0 {
        for m in deletion_order(&remaining, spec.delete_policy)
            .into_iter()
            .take((-missing) as usize)
        {
            out.delete.push((name_of(m), "the set shrinks".into()));
        }
    }
    if spec.paused {
        // Paused, nothing is made, deleted or repaired; the unhealthy are still told.
        out.create.clear();
        out.delete.clear();
        out.next_index = first;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::fixtures::machine;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use noops_api::machine::MachineStatus;

    fn set(replicas: i32) -> MachineSet {
        let spec = serde_json::from_value(json!({
            "clusterName": "c", "replicas": replicas,
            "selector": { "matchLabels": { "pool": "p" } },
            "template": { "metadata": { "labels": { "pool": "p" } }, "spec": { "version": "1.34" } },
            "healthCheck": { "unhealthyTimeoutSeconds": 60, "maxUnhealthy": "40%" },
        }))
        .unwrap();
        let mut s = MachineSet::new("pool", spec);
        s.metadata.uid = Some("set-uid".into());
        s
    }

    fn member(name: &str, age_seconds: i64, healthy: bool, now: jiff::Timestamp) -> Machine {
        let mut m = machine(name, "c", "1.34");
        m.metadata.creation_timestamp = Some(Time(now - jiff::SignedDuration::from_secs(age_seconds)));
        let condition = |type_: &str, ok: bool| Condition {
            type_: type_.into(),
            status: if ok { "True" } else { "False" }.into(),
            reason: if ok { "NodeReady" } else { "NodeNotReady" }.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(now - jiff::SignedDuration::from_secs(120)),
        };
        m.status = Some(MachineStatus {
            phase: Some(MachinePhase::Running),
            node_joined_at: Some(Time(now - jiff::SignedDuration::from_secs(age_seconds))),
            conditions: vec![condition("Ready", healthy), condition("NodeHealthy", healthy)],
            ..Default::default()
        });
        m
    }

    #[test]
    fn a_set_makes_what_is_missing_under_stable_names() {
        let now = jiff::Timestamp::now();
        let s = set(3);
        let first = plan(&s, &[], now);
        assert_eq!(first.create.len(), 3);
        assert!(
            first
                .create
                .iter()
                .all(|n| n.starts_with("pool-") && n.len() == "pool-".len() + 5)
        );
        // A pass that sees one of them made asks for the same others again.
        let made = member(&first.create[0], 1, true, now);
        let again = plan(&s, &[made], now);
        assert_eq!(again.create, first.create[1..].to_vec());
        // Once the status says 3 names were used, a machine made later gets a name never given.
        let mut recorded = s.clone();
        recorded.status = Some(noops_api::machine_set::MachineSetStatus {
            next_index: Some(first.next_index),
            ..Default::default()
        });
        assert_eq!(first.next_index, 3);
        let later = plan(&recorded, &[], now);
        assert!(later.create.iter().all(|n| !first.create.contains(n)), "{later:?}");
    }

    #[test]
    fn a_paused_set_makes_deletes_and_repairs_nothing() {
        let now = jiff::Timestamp::now();
        let mut s = set(2);
        s.spec.paused = true;
        assert_eq!(plan(&s, &[], now).create, Vec::<String>::new(), "nothing made");
        let sick = member("pool-sick", 900, false, now);
        let extra = [member("pool-a", 900, true, now), member("pool-b", 900, true, now), sick];
        let p = plan(&s, &extra, now);
        assert!(p.delete.is_empty(), "nothing shrunk or repaired: {p:?}");
        assert_eq!(p.unhealthy.len(), 1, "the unhealthy are still told");
        s.spec.paused = false;
        assert!(!plan(&s, &extra, now).delete.is_empty());
    }

    #[test]
    fn names_made_by_a_pass_whose_status_did_not_land_are_never_given_again() {
        let now = jiff::Timestamp::now();
        let s = set(2);
        // A pass made the first two machines; its status (nextIndex 2) was refused.
        let made = [
            member(&machine_name(&s, 0), 900, true, now),
            member(&machine_name(&s, 1), 900, true, now),
        ];
        let settled = plan(&s, &made, now);
        assert!(settled.create.is_empty());
        assert_eq!(settled.next_index, 2, "the status records both names as used");
        let mut grown = set(3);
        grown.metadata.uid = s.metadata.uid.clone();
        let p = plan(&grown, &made, now);
        assert_eq!(p.create, vec![machine_name(&grown, 2)]);
        assert_eq!(p.next_index, 3);
    }

    #[test]
    fn a_set_shrinks_unready_then_marked_then_by_policy() {
        let now = jiff::Timestamp::now();
        let mut s = set(1);
        let old = member("pool-old", 900, true, now);
        let new = member("pool-new", 100, true, now);
        let mut marked = member("pool-marked", 500, true, now);
        marked.metadata.annotations = Some([(DELETE_MACHINE_ANNOTATION.to_string(), String::new())].into());
        s.spec.delete_policy = DeletePolicy::Oldest;
        let p = plan(&s, &[old.clone(), new.clone(), marked.clone()], now);
        let gone: Vec<&str> = p.delete.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(gone, vec!["pool-marked", "pool-old"]);
        s.spec.delete_policy = DeletePolicy::Newest;
        let p = plan(&s, &[old.clone(), new.clone()], now);
        assert_eq!(p.delete[0].0, "pool-new");
        // Not ready goes before anything the policy prefers, and before a marked machine that
        // is ready (a deployment counts on losing no ready machine while an unready one stays).
        let mut starting = member("pool-starting", 5, true, now);
        starting.status.as_mut().unwrap().phase = Some(MachinePhase::Provisioning);
        starting.status.as_mut().unwrap().node_joined_at = None;
        s.spec.delete_policy = DeletePolicy::Oldest;
        let p = plan(&s, &[old, marked, starting], now);
        assert_eq!(p.delete[0].0, "pool-starting");
    }

    #[test]
    fn unhealthy_machines_are_replaced_unless_too_many_are_unhealthy() {
        let now = jiff::Timestamp::now();
        let s = set(3);
        let machines = [
            member("pool-a", 900, true, now),
            member("pool-b", 900, true, now),
            member("pool-c", 900, false, now),
        ];
        let p = plan(&s, &machines, now);
        assert_eq!(p.delete.len(), 1);
        assert!(p.delete[0].1.starts_with("unhealthy: NodeNotReady"), "{:?}", p.delete);
        assert_eq!(p.create.len(), 1, "its replacement is made at once");
        assert_eq!(p.repair_held, None);
        // 40% of 3, rounded up, lets 2 be repaired at once; 3 of 3 are more.
        let all_down = [
            member("pool-a", 900, false, now),
            member("pool-b", 900, false, now),
            member("pool-c", 900, false, now),
        ];
        let p = plan(&s, &all_down, now);
        assert!(p.delete.is_empty() && p.create.is_empty());
        let held = p.repair_held.unwrap();
        assert_eq!(held.reason, MachineSetReason::TooManyUnhealthy);
        assert!(held.message.contains("3 of 3 machines are unhealthy"), "{held:?}");
    }

    #[test]
    fn a_repair_still_being_deleted_counts_against_max_unhealthy_until_it_is_gone() {
        let now = jiff::Timestamp::now();
        let mut s = set(3);
        s.spec.health_check.max_unhealthy = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1);
        // a was repaired: it drains (its Node NotReady), its replacement d is starting. Then b
        // goes unhealthy too.
        let mut a = member("pool-a", 900, false, now);
        a.metadata.deletion_timestamp = Some(Time(now));
        let mut d = member("pool-d", 5, true, now);
        d.status.as_mut().unwrap().phase = Some(MachinePhase::Provisioning);
        d.status.as_mut().unwrap().node_joined_at = None;
        let b = member("pool-b", 900, false, now);
        let c = member("pool-c", 900, true, now);
        let p = plan(&s, &[a.clone(), b.clone(), c.clone(), d.clone()], now);
        assert!(p.delete.is_empty(), "b waits for a: {p:?}");
        assert!(p.create.is_empty(), "{p:?}");
        let held = p.repair_held.unwrap();
        assert_eq!(held.reason, MachineSetReason::RepairsUnderWay);
        assert!(held.message.contains("1 being deleted"), "{held:?}");
        // Once a is gone, b is repaired.
        let p = plan(&s, &[b, c, d], now);
        assert_eq!(p.delete.len(), 1, "{p:?}");
        assert_eq!(p.delete[0].0, "pool-b");
        assert_eq!(p.repair_held, None);
    }
}
