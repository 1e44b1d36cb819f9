//! The objects the Machine controller's tests start from.

use noops_api::control_plane::{KubernetesControlPlane, KubernetesControlPlaneSpec, KubernetesControlPlaneStatus};
use noops_api::machine::{Machine, MachineSpec};

/// Control plane `name` in namespace `tenants`, serving `version` (with its admin kubeconfig)
/// or not served yet (`None`).
pub fn control_plane(name: &str, version: Option<&str>) -> KubernetesControlPlane {
    let spec: KubernetesControlPlaneSpec =
        serde_json::from_value(serde_json::json!({ "version": "1.34" })).unwrap_or_else(|e| panic!("{e}"));
    let mut kcp = KubernetesControlPlane::new(name, spec);
    kcp.metadata.namespace = Some("tenants".into());
    kcp.status = version.map(|v| KubernetesControlPlaneStatus {
        version: Some(v.into()),
        admin_kubeconfig_secret: Some(format!("{name}-admin-kubeconfig")),
        ..Default::default()
    });
    kcp
}

/// Machine `name` of `cluster` in namespace `tenants` at `version`, made a minute ago.
pub fn machine(name: &str, cluster: &str, version: &str) -> Machine {
    let spec: MachineSpec = serde_json::from_value(serde_json::json!({ "clusterName": cluster, "version": version }))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut m = Machine::new(name, spec);
    m.metadata.namespace = Some("tenants".into());
    m.metadata.uid = Some(format!("uid-{name}"));
    m.metadata.generation = Some(1);
    m.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60),
    ));
    m
}
