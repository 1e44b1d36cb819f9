//! Whether any node could ever hold the instance's pod. A `resources` edit that asks for more
//! than every node has (64 CPUs for 2, `100Gi` meant as `100Mi`) would give a serving database
//! a pod that is never scheduled, and take it down until the spec is corrected: such a spec is
//! told (`NoNodeFits`) and the StatefulSet is left as it is. Whether a node has the room free
//! now is the scheduler's question; this only catches what no node could give at all. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use noops_api::postgres::PostgreSQLReason;
use noops_api::quantity;

use super::problem::PlanProblem;

/// What the pod asks for: its requests, and its limits where a request is not set (the API
/// server makes such a limit the request).
pub fn requests(resources: &ResourceRequirements) -> BTreeMap<String, Quantity> {
    let mut asked = resources.limits.clone().unwrap_or_default();
    asked.extend(resources.requests.clone().unwrap_or_default());
    asked
}

/// Why no node can hold a pod asking for `resources`, if none can. Nothing is said without
/// nodes to compare with, or of a quantity that cannot be read (the API server refuses it).
pub fn no_node_fits(resources: Option<&ResourceRequirements>, nodes: &[Node]) -> Option<PlanProblem> {
    let asked = resources.map(requests).unwrap_or_default();
    let asked: Vec<(&String, &Quantity, f64)> = asked
        .iter()
        .filter_map(|(name, q)| Some((name, q, quantity::parse(&q.0)?)))
        .collect();
    if asked.is_empty() || nodes.is_empty() {
        return None;
    }
    let has = |node: &Node| {
        let status = node.status.as_ref();
        status
            .and_then(|s| s.allocatable.clone())
            .or_else(|| status.and_then(|s| s.capacity.clone()))
            .unwrap_or_default()
    };
    let fits = |node: &Node| {
        let has = has(node);
        asked.iter().all(|(name, _, value)| {
            has.get(name.as_str())
                .and_then(|q| quantity::parse(&q.0))
                .is_some_and(|available| available >= *value)
        })
    };
    if nodes.iter().any(fits) {
        return None;
    }
    let wanted: Vec<String> = asked.iter().map(|(name, q, _)| format!("{name} {}", q.0)).collect();
    let offered: Vec<String> = nodes
        .iter()
        .take(3)
        .map(|node| {
            let has = has(node);
            let amounts: Vec<String> = asked
                .iter()
                .map(|(name, _, _)| format!("{name} {}", has.get(name.as_str()).map_or("none", |q| q.0.as_str())))
                .collect();
            format!(
                "{} has {}",
                node.metadata.name.as_deref().unwrap_or_default(),
                amounts.join(", ")
            )
        })
        .collect();
    Some(PlanProblem {
        reason: PostgreSQLReason::NoNodeFits,
        message: format!(
            "the pod would ask for {} and no node has that much ({}): it could never be scheduled, so the StatefulSet is left as it is; lower spec.resources",
            wanted.join(", "),
            offered.join("; ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeStatus;

    fn node(name: &str, cpu: &str, memory: &str) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        node.status = Some(NodeStatus {
            allocatable: Some(
                [
                    ("cpu".to_string(), Quantity(cpu.into())),
                    ("memory".to_string(), Quantity(memory.into())),
                ]
                .into(),
            ),
            ..Default::default()
        });
        node
    }

    fn asking(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> ResourceRequirements {
        let map = |pairs: &[(&str, &str)]| {
            (!pairs.is_empty()).then(|| {
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect()
            })
        };
        ResourceRequirements {
            requests: map(requests),
            limits: map(limits),
            ..Default::default()
        }
    }

    #[test]
    fn a_pod_that_some_node_can_hold_is_fine() {
        let nodes = [node("small", "2", "4Gi"), node("big", "8", "32Gi")];
        assert_eq!(no_node_fits(None, &nodes), None);
        assert_eq!(
            no_node_fits(Some(&asking(&[("cpu", "6"), ("memory", "16Gi")], &[])), &nodes),
            None
        );
        assert_eq!(
            no_node_fits(Some(&asking(&[], &[("memory", "30Gi")])), &nodes),
            None,
            "a limit as request"
        );
        assert_eq!(
            no_node_fits(Some(&asking(&[("cpu", "500m")], &[])), &[]),
            None,
            "no nodes to tell"
        );
        assert_eq!(
            no_node_fits(Some(&asking(&[("cpu", "lots")], &[])), &nodes),
            None,
            "the API server says"
        );
    }

    #[test]
    fn what_no_node_has_is_told_with_what_the_nodes_have() {
        let nodes = [node("small", "2", "4Gi"), node("big", "8", "32Gi")];
        let problem = no_node_fits(Some(&asking(&[("cpu", "64")], &[])), &nodes).unwrap();
        assert_eq!(problem.reason, PostgreSQLReason::NoNodeFits);
        assert!(
            problem.message.contains("cpu 64") && problem.message.contains("big has cpu 8"),
            "{}",
            problem.message
        );
        // Each resource fits some node, but no node holds both.
        let split = asking(&[("cpu", "6"), ("memory", "8Gi")], &[]);
        let nodes = [node("cpus", "8", "4Gi"), node("memory", "2", "32Gi")];
        assert!(no_node_fits(Some(&split), &nodes).is_some());
        // A request smaller than its limit: the request counts.
        let bounded = asking(&[("memory", "1Gi")], &[("memory", "64Gi")]);
        assert_eq!(no_node_fits(Some(&bounded), &nodes), None);
        // A resource no node offers.
        let gpu = asking(&[("nvidia.com/gpu", "1")], &[]);
        assert!(
            no_node_fits(Some(&gpu), &nodes)
                .unwrap()
                .message
                .contains("nvidia.com/gpu 1")
        );
    }
}
