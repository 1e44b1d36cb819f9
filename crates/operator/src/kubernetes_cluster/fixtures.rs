//! The objects the KubernetesCluster controller's tests start from.

use noops_api::kubernetes_cluster::{KubernetesCluster, KubernetesClusterSpec};

/// Cluster `team-a` in namespace `tenants` at `version`, its `workers` given in YAML flow style.
pub fn cluster(version: &str, workers: &str) -> KubernetesCluster {
    let yaml = format!("version: \"{version}\"\nworkers: {workers}\n");
    let spec: KubernetesClusterSpec = serde_saphyr::from_str(&yaml).unwrap_or_else(|e| panic!("{e}"));
    let mut kc = KubernetesCluster::new("team-a", spec);
    kc.metadata.namespace = Some("tenants".into());
    kc.metadata.uid = Some("uid-team-a".into());
    kc.metadata.generation = Some(1);
    kc
}
