//! Node drains. With replicas, two PodDisruptionBudgets: the primary's pod may not be evicted
//! at all, and the replicas' one at a time. A drain starts by cordoning its node; when the
//! node is the primary's, the primary switches over to a replica on a node that is not being
//! drained, and the drain, asking again, evicts it as a replica. A drain never costs more than
//! a switchover. Pure.
//!
//! The budgets say `minAvailable` as a number: the disruption controller works out
//! `maxUnavailable` from the StatefulSet's scale, which counts every instance, not the subset a
//! role selects (it would refuse every eviction).

use std::collections::BTreeSet;

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use noops_api::postgres::{MemberStatus, Role};

use super::names::{Names, ROLE_LABEL};
use super::replication::{PRIMARY, REPLICA, REPLICA_BEHIND, role_label};

/// The budgets `instances` instances get: none for one (its pod may go, as a single pod's
/// would), the primary's for two, and the replicas' too from three.
pub fn budgets(names: &Names, owner: &OwnerReference, instances: i32) -> Vec<PodDisruptionBudget> {
    let budget = |name: String, min_available: i32, roles: &[&str]| {
        PodDisruptionBudget {
            metadata: names.child(name, owner),
            spec: Some(PodDisruptionBudgetSpec {
                min_available: Some(IntOrString::Int(min_available)),
                selector: Some(LabelSelector {
                    match_labels: Some(names.selector()),
                    match_expressions: Some(vec![LabelSelectorRequirement {
                        key: ROLE_LABEL.into(),
                        operator: "In".into(),
                        values: Some(roles.iter().map(|r| r.to_string()).collect()),
                    }]),
                }),
                // A pod that is not Ready serves nothing: a drain may take it.
                unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
                ..Default::default()
            }),
            status: None,
        }
    };
    let mut wanted = Vec::new();
    if instances >= 2 {
        wanted.push(budget(names.primary_budget(), 1, &[PRIMARY]));
    }
    if instances >= 3 {
        wanted.push(budget(
            names.replicas_budget(),
            instances - 2,
            &[REPLICA, REPLICA_BEHIND],
        ));
    }
    wanted
}

/// What a drain asks of the primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drain {
    /// Its node is not being drained.
    Stay,
    /// Its node is: it steps down for this replica.
    StepDownFor { node: String, to: String },
    /// Its node is, and no replica on another node can take over now (why).
    Held { node: String, why: String },
}

/// What the drain of a node in `cordoned` asks of `primary`, as `members` stand.
pub fn primary_drain(names: &Names, primary: &str, members: &[MemberStatus], cordoned: &BTreeSet<String>) -> Drain {
    // One instance: no budget holds it, and no replica could take over.
    if members.len() < 2 {
        return Drain::Stay;
    }
    let Some(node) = members
        .iter()
        .find(|m| m.name == primary && m.role == Role::Primary)
        .and_then(|m| m.node.clone())
        .filter(|n| cordoned.contains(n))
    else {
        return Drain::Stay;
    };
    let candidates = members.iter().filter(|m| {
        m.role == Role::Replica && role_label(m) == REPLICA && m.node.as_ref().is_some_and(|n| !cordoned.contains(n))
    });
    match candidates.min_by_key(|m| (m.lag_bytes.unwrap_or(0), names.ordinal(&m.name))) {
        Some(to) => Drain::StepDownFor {
            node,
            to: to.name.clone(),
        },
        None => Drain::Held {
            node,
            why: "no replica on a node that is not being drained streams within the lag bound".into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::fixtures::{self, names};

    fn member(name: &str, node: &str, role: Role, lag: i64) -> MemberStatus {
        MemberStatus {
            node: Some(node.into()),
            ..fixtures::member(name, role, lag)
        }
    }

    fn three() -> Vec<MemberStatus> {
        vec![
            member("shop-0", "n1", Role::Primary, 0),
            member("shop-1", "n2", Role::Replica, 500),
            member("shop-2", "n3", Role::Replica, 100),
        ]
    }

    fn cordoned(nodes: &[&str]) -> BTreeSet<String> {
        nodes.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_drain_of_the_primarys_node_steps_it_down_for_the_replica_least_behind_elsewhere() {
        let names = names();
        assert_eq!(
            primary_drain(&names, "shop-0", &three(), &cordoned(&["n2"])),
            Drain::Stay
        );
        assert_eq!(
            primary_drain(&names, "shop-0", &three(), &cordoned(&["n1"])),
            Drain::StepDownFor {
                node: "n1".into(),
                to: "shop-2".into()
            }
        );
        // The one least behind is being drained too: the other.
        assert_eq!(
            primary_drain(&names, "shop-0", &three(), &cordoned(&["n1", "n3"])),
            Drain::StepDownFor {
                node: "n1".into(),
                to: "shop-1".into()
            }
        );
    }

    #[test]
    fn with_no_replica_to_take_over_the_primary_stays_and_the_drain_waits() {
        let names = names();
        let mut members = three();
        members[1].streaming = Some(false);
        members[2].lag_bytes = Some(super::super::replication::LAG_BOUND_BYTES + 1);
        assert!(matches!(
            primary_drain(&names, "shop-0", &members, &cordoned(&["n1"])),
            Drain::Held { node, .. } if node == "n1"
        ));
    }

    #[test]
    fn budgets_keep_the_primary_and_all_replicas_but_one() {
        let names = names();
        let owner = OwnerReference::default();
        assert!(budgets(&names, &owner, 1).is_empty(), "one instance: a drain takes it");
        assert_eq!(budgets(&names, &owner, 2).len(), 1);
        let three = budgets(&names, &owner, 3);
        let min = |b: &PodDisruptionBudget| b.spec.as_ref().unwrap().min_available.clone();
        assert_eq!(min(&three[0]), Some(IntOrString::Int(1)));
        assert_eq!(min(&three[1]), Some(IntOrString::Int(1)), "two replicas: one may go");
        assert_eq!(min(&budgets(&names, &owner, 5)[1]), Some(IntOrString::Int(3)));
        let roles = |b: &PodDisruptionBudget| {
            b.spec
                .as_ref()
                .unwrap()
                .selector
                .as_ref()
                .unwrap()
                .match_expressions
                .as_ref()
                .unwrap()[0]
                .values
                .clone()
                .unwrap()
        };
        assert_eq!(roles(&three[0]), vec!["primary"]);
        assert_eq!(roles(&three[1]), vec!["replica", "replica-behind"]);
    }
}
