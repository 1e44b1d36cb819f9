//! Nodes and the volumes that live on them: whether a node is Ready, and which node a local
//! volume is pinned to. Pure; shared by every engine that must tell a dead node from a slow one.

use k8s_openapi::api::core::v1::{Node, PersistentVolume};

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
}
