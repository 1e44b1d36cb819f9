//! The children of a KubernetesCluster: its KubernetesControlPlane and a MachineDeployment per
//! pool, as this pass wants them. Pure.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use noops_api::control_plane::{KubernetesControlPlane, KubernetesControlPlaneSpec};
use noops_api::kubernetes_cluster::{KubernetesCluster, WorkerPoolSpec};
use noops_api::machine::MachineTemplateSpec;
use noops_api::machine_deployment::{
    MachineDeployment, MachineDeploymentSpec, StrategySpec, default_progress_deadline,
};
use noops_api::machine_set::{MachineSelector, MachineTemplate, TemplateMetadata};

use crate::core::labels;

/// The label naming the KubernetesCluster a child belongs to.
pub const CLUSTER_LABEL: &str = "noops.dev/kubernetescluster";
/// The label naming the pool a MachineDeployment (and its machines) is.
pub const POOL_LABEL: &str = "noops.dev/pool";

/// The MachineDeployment of pool `pool` of cluster `cluster`.
pub fn pool_deployment_name(cluster: &str, pool: &str) -> String {
    format!("{cluster}-{pool}")
}

fn metadata(kc: &KubernetesCluster, name: String, extra: &[(&str, &str)], owner: &OwnerReference) -> ObjectMeta {
    let cluster = kc.metadata.name.clone().unwrap_or_default();
    let mut labels = BTreeMap::from([
        (CLUSTER_LABEL.to_string(), cluster),
        (labels::MANAGED_BY.to_string(), labels::MANAGER.to_string()),
    ]);
    labels.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    ObjectMeta {
        name: Some(name),
        namespace: kc.metadata.namespace.clone(),
        labels: Some(labels),
        owner_references: Some(vec![owner.clone()]),
        ..Default::default()
    }
}

/// The cluster's control plane at `version` (exact).
pub fn control_plane(kc: &KubernetesCluster, version: &str, owner: &OwnerReference) -> KubernetesControlPlane {
    let name = kc.metadata.name.clone().unwrap_or_default();
    let cp = &kc.spec.control_plane;
    KubernetesControlPlane {
        metadata: metadata(kc, name, &[], owner),
        spec: KubernetesControlPlaneSpec {
            version: version.into(),
            replicas: cp.replicas,
            etcd: cp.etcd.clone(),
            service: cp.service.clone(),
            networking: cp.networking.clone(),
            extra_args: cp.extra_args.clone(),
            paused: kc.spec.paused,
            bootstrap: kc.spec.bootstrap.clone(),
        },
        status: None,
    }
}

/// Pool `pool`'s MachineDeployment: `replicas` machines at `version` (exact).
pub fn machine_deployment(
    kc: &KubernetesCluster,
    pool: &WorkerPoolSpec,
    version: &str,
    replicas: i32,
    owner: &OwnerReference,
) -> MachineDeployment {
    let cluster = kc.metadata.name.clone().unwrap_or_default();
    let selector = BTreeMap::from([
        (CLUSTER_LABEL.to_string(), cluster.clone()),
        (POOL_LABEL.to_string(), pool.name.clone()),
    ]);
    let name = pool_deployment_name(&cluster, &pool.name);
    MachineDeployment {
        metadata: metadata(kc, name, &[(POOL_LABEL, &pool.name)], owner),
        spec: MachineDeploymentSpec {
            cluster_name: cluster,
            replicas,
            selector: MachineSelector {
                match_labels: selector.clone(),
            },
            template: MachineTemplate {
                metadata: TemplateMetadata {
                    labels: Some(selector),
                    annotations: None,
                },
                spec: MachineTemplateSpec {
                    version: version.into(),
                    flavor: pool.flavor.clone(),
                    image: None,
                    node_drain_timeout_seconds: kc.spec.upgrade.drain_timeout_seconds,
                },
            },
            strategy: StrategySpec {
                type_: Default::default(),
                rolling_update: Some(kc.spec.upgrade.rolling_update.clone()),
            },
            progress_deadline_seconds: default_progress_deadline(),
            rollout_paused: false,
            paused: kc.spec.paused,
            delete_policy: Default::default(),
            health_check: pool.health_check.clone(),
        },
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes_cluster::fixtures::cluster;

    #[test]
    fn the_control_plane_and_each_pool_are_named_labelled_and_owned_by_the_cluster() {
        let kc = cluster("1.34", "[{ name: general, replicas: 2 }]");
        let owner = OwnerReference {
            uid: "kc-uid".into(),
            ..Default::default()
        };
        let kcp = control_plane(&kc, "1.34.4", &owner);
        assert_eq!(kcp.metadata.name.as_deref(), Some("team-a"));
        assert_eq!(kcp.spec.version, "1.34.4");
        assert_eq!(kcp.spec.etcd.replicas, 3);
        assert_eq!(kcp.metadata.owner_references.unwrap()[0].uid, "kc-uid");
        let md = machine_deployment(&kc, &kc.spec.workers[0], "1.33.13", 2, &owner);
        assert_eq!(md.metadata.name.as_deref(), Some("team-a-general"));
        assert_eq!(md.spec.cluster_name, "team-a");
        assert_eq!(md.spec.replicas, 2);
        assert_eq!(md.spec.template.spec.version, "1.33.13");
        let labels = md.metadata.labels.unwrap();
        assert_eq!(labels[POOL_LABEL], "general");
        assert_eq!(labels[CLUSTER_LABEL], "team-a");
        assert_eq!(
            md.spec.template.metadata.labels.unwrap(),
            md.spec.selector.match_labels,
            "the deployment owns the machines it makes"
        );
        let rolling = md.spec.strategy.rolling_update.unwrap();
        assert_eq!(rolling, kc.spec.upgrade.rolling_update);
    }
}
