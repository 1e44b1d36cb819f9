//! Nodes and the volumes that live on them: whether a node is Ready, whether a pod could be
//! placed on it, and which node a local volume is pinned to. Pure; shared by every engine that
//! must tell a dead node from a slow one, or place members apart.

use k8s_openapi::api::core::v1::{Affinity, Node, NodeSelectorRequirement, PersistentVolume, Taint, Toleration};

/// Whether `node` is Ready.
pub fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The one node volume `pv` lives on, if it is a local volume (every term of its node affinity
/// names that node and no other); `None` for a volume that can follow a pod.
pub fn pinned_node(pv: &PersistentVolume) -> Option<String> {
    let terms = pv
        .spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms
        .clone();
    let mut pinned: Option<String> = None;
    for term in &terms {
        let node = term.match_expressions.iter().flatten().find_map(|e| {
            let values = e.values.as_ref()?;
            (e.key == "kubernetes.io/hostname" && e.operator == "In" && values.len() == 1).then(|| values[0].clone())
        })?;
        if pinned.as_ref().is_some_and(|p| *p != node) {
            return None;
        }
        pinned = Some(node);
    }
    pinned
}

/// Whether a pod with `tolerations` and `affinity` could be placed on `node` now: it is Ready,
/// not cordoned, every taint that keeps pods off is tolerated, and the pod's required node
/// affinity (if any) admits it. Room (CPU, memory) is the scheduler's question, not this one.
pub fn could_hold(node: &Node, tolerations: &[Toleration], affinity: Option<&Affinity>) -> bool {
    let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
    let keeps_off = |t: &&Taint| t.effect == "NoSchedule" || t.effect == "NoExecute";
    ready(node)
        && !cordoned
        && taints
            .iter()
            .filter(keeps_off)
            .all(|t| tolerations.iter().any(|o| tolerates(o, t)))
        && admitted_by(node, affinity)
}

/// Whether `toleration` tolerates `taint`, as the scheduler reads it.
fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key = toleration.key.as_deref().unwrap_or_default();
    match toleration.operator.as_deref() {
        Some("Exists") => effect && (key.is_empty() || key == taint.key),
        _ => {
            effect
                && key == taint.key
                && toleration.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
        }
    }
}

/// Whether the required node affinity of `affinity` admits `node` (one of its terms matches).
fn admitted_by(node: &Node, affinity: Option<&Affinity>) -> bool {
    let Some(required) = affinity
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
    else {
        return true;
    };
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let name = node.metadata.name.clone().unwrap_or_default();
    let holds = |r: &NodeSelectorRequirement, value: Option<&String>| {
        let values = r.values.as_deref().unwrap_or_default();
        match r.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            // Gt and Lt compare numbers: not guessed at here, taken as admitting.
            _ => true,
        }
    };
    // A term that says nothing matches no node, as the scheduler reads it.
    let says_something = |term: &&k8s_openapi::api::core::v1::NodeSelectorTerm| {
        term.match_expressions.as_ref().is_some_and(|e| !e.is_empty())
            || term.match_fields.as_ref().is_some_and(|f| !f.is_empty())
    };
    required.node_selector_terms.iter().filter(says_something).any(|term| {
        term.match_expressions
            .iter()
            .flatten()
            .all(|r| holds(r, labels.get(&r.key)))
            && term
                .match_fields
                .iter()
                .flatten()
                .all(|r| r.key != "metadata.name" || holds(r, Some(&name)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(terms: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "pvc-1" },
            "spec": { "nodeAffinity": { "required": { "nodeSelectorTerms": terms } } },
        }))
        .unwrap_or_default()
    }

    fn on(node: &str) -> serde_json::Value {
        serde_json::json!({ "matchExpressions": [{ "key": "kubernetes.io/hostname", "operator": "In", "values": [node] }] })
    }

    #[test]
    fn a_local_volume_is_pinned_to_the_one_node_its_affinity_names() {
        assert_eq!(
            pinned_node(&volume(serde_json::json!([on("node-2")]))).as_deref(),
            Some("node-2")
        );
        assert_eq!(
            pinned_node(&volume(serde_json::json!([on("node-2"), on("node-2")]))).as_deref(),
            Some("node-2")
        );
        assert_eq!(
            pinned_node(&volume(serde_json::json!([on("node-1"), on("node-2")]))),
            None,
            "either node"
        );
        assert_eq!(pinned_node(&volume(serde_json::json!([]))), None);
        assert_eq!(
            pinned_node(&PersistentVolume::default()),
            None,
            "no affinity: it follows its pod"
        );
        let two_values = serde_json::json!([{ "matchExpressions": [
            { "key": "kubernetes.io/hostname", "operator": "In", "values": ["node-1", "node-2"] }
        ] }]);
        assert_eq!(pinned_node(&volume(two_values)), None);
    }

    #[test]
    fn a_node_is_ready_only_when_its_ready_condition_says_true() {
        let node = |status: &str| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "node-2" },
                "status": { "conditions": [{ "type": "Ready", "status": status }] },
            }))
            .unwrap_or_default()
        };
        assert!(ready(&node("True")));
        assert!(!ready(&node("Unknown")));
        assert!(!ready(&Node::default()));
    }

    #[test]
    fn a_node_could_hold_a_pod_only_ready_uncordoned_with_its_taints_tolerated_and_its_affinity_met() {
        let node = |name: &str, zone: &str, taint: Option<&str>, cordoned: bool| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": name, "labels": { "zone": zone } },
                "spec": {
                    "unschedulable": cordoned,
                    "taints": taint.map(|key| vec![serde_json::json!({ "key": key, "effect": "NoSchedule" })]).unwrap_or_default(),
                },
                "status": { "conditions": [{ "type": "Ready", "status": "True" }] },
            }))
            .unwrap()
        };
        let plain = node("a", "z1", None, false);
        assert!(could_hold(&plain, &[], None));
        assert!(!could_hold(&node("b", "z1", None, true), &[], None), "cordoned");
        let tainted = node("c", "z1", Some("dedicated"), false);
        assert!(!could_hold(&tainted, &[], None));
        let tolerate: Toleration =
            serde_json::from_value(serde_json::json!({ "key": "dedicated", "operator": "Exists" })).unwrap();
        assert!(could_hold(&tainted, std::slice::from_ref(&tolerate), None));
        let mut down = plain.clone();
        down.status = None;
        assert!(!could_hold(&down, &[], None), "not Ready");
        let in_z2: Affinity = serde_json::from_value(serde_json::json!({ "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": { "nodeSelectorTerms": [
                { "matchExpressions": [{ "key": "zone", "operator": "In", "values": ["z2"] }] }
            ]}
        }}))
        .unwrap();
        assert!(!could_hold(&plain, &[], Some(&in_z2)));
        assert!(could_hold(&node("d", "z2", None, false), &[], Some(&in_z2)));
    }
}
