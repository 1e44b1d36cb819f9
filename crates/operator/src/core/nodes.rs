//! Nodes and the volumes that live on them: whether a node is Ready, whether a pod could be
//! placed on it, and which node a local volume is pinned to. Pure; shared by every engine that
//! must tell a dead node from a slow one, or place members apart.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, Node, NodeSelectorRequirement, PersistentVolume, Pod, Taint, Toleration};

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

/// The node selector a workload's pods carry once admitted: the youngest pod's (a spec edited
/// since reaches new pods first). It holds what the spec asked and what admission added on the
/// way (a namespace's `scheduler.alpha.kubernetes.io/node-selector`, a webhook): a node it does
/// not match can never run a new pod of theirs, so it is no place to move one to. Moving there
/// anyway left a member pinned to a node it could not run on, or a replica made anew again and
/// again on the node it left.
pub fn admitted_selector<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> BTreeMap<String, String> {
    pods.into_iter()
        .max_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .and_then(|p| p.spec.as_ref()?.node_selector.clone())
        .unwrap_or_default()
}

/// Whether a pod with `tolerations`, `affinity` and node `selector` could be placed on `node`
/// now: it is Ready, not cordoned, every taint that keeps pods off is tolerated, its labels
/// hold the selector, and the pod's required node affinity (if any) admits it. Room (CPU,
/// memory) is the scheduler's question, not this one.
pub fn could_hold(
    node: &Node,
    tolerations: &[Toleration],
    affinity: Option<&Affinity>,
    selector: &BTreeMap<String, String>,
) -> bool {
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
        && selected_by(node, selector)
}

/// Whether `node`'s labels hold every pair of `selector`.
fn selected_by(node: &Node, selector: &BTreeMap<String, String>) -> bool {
    let labels = node.metadata.labels.as_ref();
    selector
        .iter()
        .all(|(key, value)| labels.and_then(|l| l.get(key)) == Some(value))
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
    fn a_node_could_hold_a_pod_only_ready_uncordoned_with_its_taints_tolerated_its_selector_and_affinity_met() {
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
        let none = BTreeMap::new();
        let plain = node("a", "z1", None, false);
        assert!(could_hold(&plain, &[], None, &none));
        assert!(!could_hold(&node("b", "z1", None, true), &[], None, &none), "cordoned");
        let tainted = node("c", "z1", Some("dedicated"), false);
        assert!(!could_hold(&tainted, &[], None, &none));
        let tolerate: Toleration =
            serde_json::from_value(serde_json::json!({ "key": "dedicated", "operator": "Exists" })).unwrap();
        assert!(could_hold(&tainted, std::slice::from_ref(&tolerate), None, &none));
        let mut down = plain.clone();
        down.status = None;
        assert!(!could_hold(&down, &[], None, &none), "not Ready");
        let in_z2: Affinity = serde_json::from_value(serde_json::json!({ "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": { "nodeSelectorTerms": [
                { "matchExpressions": [{ "key": "zone", "operator": "In", "values": ["z2"] }] }
            ]}
        }}))
        .unwrap();
        assert!(!could_hold(&plain, &[], Some(&in_z2), &none));
        assert!(could_hold(&node("d", "z2", None, false), &[], Some(&in_z2), &none));
        let in_z1 = BTreeMap::from([("zone".to_string(), "z1".to_string())]);
        assert!(could_hold(&plain, &[], None, &in_z1));
        assert!(
            !could_hold(&node("e", "z2", None, false), &[], None, &in_z1),
            "another zone"
        );
    }

    #[test]
    fn the_selector_pods_were_admitted_with_is_the_youngest_pods() {
        let pod = |made: i64, zone: Option<&str>| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "p", "creationTimestamp": jiff::Timestamp::from_second(made).unwrap() },
                "spec": { "containers": [], "nodeSelector": zone.map(|z| serde_json::json!({ "zone": z })) },
            }))
            .unwrap()
        };
        let pods = [pod(100, Some("z1")), pod(300, Some("z2")), pod(200, None)];
        assert_eq!(
            admitted_selector(&pods),
            BTreeMap::from([("zone".to_string(), "z2".to_string())])
        );
        assert!(admitted_selector(&pods[2..]).is_empty());
        assert!(
            admitted_selector(std::iter::empty()).is_empty(),
            "no pod yet: no selector known"
        );
    }
}
