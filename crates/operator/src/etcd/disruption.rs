//! The cluster's PodDisruptionBudget: an eviction (a node drained, say) takes down at most one
//! member at a time, so never the quorum. Pure.
//!
//! It says `minAvailable` as a number, not `maxUnavailable`: the members' pods belong to the
//! EtcdCluster, which has no scale subresource, and the disruption controller works out
//! `maxUnavailable` only for pods of a workload it knows (it would refuse every eviction).

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use noops_api::EtcdCluster;

use super::names::Names;

/// The members that must stay up: all but one of those the cluster has or is to have (while
/// it shrinks, the members still to be removed count: they still vote).
pub fn min_available(cluster: &EtcdCluster) -> i32 {
    let members = cluster.status.as_ref().map_or(0, |s| s.members.len()) as i32;
    (cluster.spec.replicas.max(members) - 1).max(0)
}

/// The budget of `cluster`'s member pods.
pub fn budget(cluster: &EtcdCluster, names: &Names, owner: &OwnerReference) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(names.cluster.clone()),
            namespace: Some(names.namespace.clone()),
            labels: Some(names.cluster_labels()),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(min_available(cluster))),
            selector: Some(LabelSelector {
                match_labels: Some(names.selector()),
                match_expressions: None,
            }),
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::fixtures;
    use noops_api::etcd::{EtcdClusterStatus, MemberStatus};

    fn with_replicas(replicas: i32) -> EtcdCluster {
        let mut cluster = fixtures::cluster().build();
        cluster.spec.replicas = replicas;
        cluster
    }

    #[test]
    fn all_members_but_one_must_stay_up() {
        for (replicas, wanted) in [(1, 0), (3, 2), (5, 4)] {
            assert_eq!(min_available(&with_replicas(replicas)), wanted, "{replicas} members");
        }
    }

    #[test]
    fn members_still_to_be_removed_count_while_the_cluster_shrinks() {
        let mut cluster = with_replicas(3);
        cluster.status = Some(EtcdClusterStatus {
            members: (0..5)
                .map(|i| MemberStatus {
                    name: format!("main-{i}"),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        });
        assert_eq!(min_available(&cluster), 4);
    }

    #[test]
    fn the_budget_selects_the_member_pods_only() {
        let cluster = fixtures::cluster().build();
        let names = Names::of(&cluster);
        let pdb = budget(&cluster, &names, &fixtures::owner());
        let spec = pdb.spec.unwrap();
        assert_eq!(spec.min_available, Some(IntOrString::Int(2)));
        assert_eq!(spec.selector.unwrap().match_labels, Some(names.selector()));
        assert_eq!(pdb.metadata.name.as_deref(), Some(names.cluster.as_str()));
    }
}
