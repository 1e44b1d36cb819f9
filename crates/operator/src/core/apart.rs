//! Pods of one group on different nodes where nodes allow: a preferred pod anti-affinity on
//! the hostname, so that one node lost takes as few of them as it can, and a group larger than
//! the nodes still schedules (each engine's `spread.rs` moves them apart later). Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, PodAffinityTerm, PodAntiAffinity, WeightedPodAffinityTerm};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// `affinity` (the user's, if any) with the pods that carry every label of `group` preferring
/// nodes none of the others run on.
pub fn prefer_apart(affinity: Option<Affinity>, group: BTreeMap<String, String>) -> Affinity {
    let mut affinity = affinity.unwrap_or_default();
    affinity
        .pod_anti_affinity
        .get_or_insert_with(PodAntiAffinity::default)
        .preferred_during_scheduling_ignored_during_execution
        .get_or_insert_with(Vec::new)
        .push(WeightedPodAffinityTerm {
            weight: 100,
            pod_affinity_term: PodAffinityTerm {
                topology_key: "kubernetes.io/hostname".into(),
                label_selector: Some(LabelSelector {
                    match_labels: Some(group),
                    match_expressions: None,
                }),
                ..Default::default()
            },
        });
    affinity
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeAffinity;

    fn group() -> BTreeMap<String, String> {
        BTreeMap::from([("app".to_string(), "shop".to_string())])
    }

    #[test]
    fn a_group_prefers_one_node_each() {
        let affinity = prefer_apart(None, group());
        let terms = affinity
            .pod_anti_affinity
            .and_then(|a| a.preferred_during_scheduling_ignored_during_execution)
            .unwrap_or_default();
        assert_eq!(terms.len(), 1);
        assert_eq!(terms[0].pod_affinity_term.topology_key, "kubernetes.io/hostname");
        let selector = terms[0].pod_affinity_term.label_selector.clone().unwrap_or_default();
        assert_eq!(selector.match_labels, Some(group()));
        assert!(affinity.node_affinity.is_none());
    }

    #[test]
    fn the_users_affinity_is_kept_beside_it() {
        let users = Affinity {
            node_affinity: Some(NodeAffinity::default()),
            pod_anti_affinity: Some(PodAntiAffinity {
                preferred_during_scheduling_ignored_during_execution: Some(vec![WeightedPodAffinityTerm {
                    weight: 7,
                    pod_affinity_term: PodAffinityTerm {
                        topology_key: "zone".into(),
                        ..Default::default()
                    },
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let affinity = prefer_apart(Some(users), group());
        assert!(affinity.node_affinity.is_some());
        let terms = affinity
            .pod_anti_affinity
            .and_then(|a| a.preferred_during_scheduling_ignored_during_execution)
            .unwrap_or_default();
        let weights: Vec<i32> = terms.iter().map(|t| t.weight).collect();
        assert_eq!(weights, vec![7, 100]);
    }
}
