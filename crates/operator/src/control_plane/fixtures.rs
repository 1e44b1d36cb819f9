//! The KubernetesControlPlane every test of this controller starts from, changed only where a
//! test says so: `fixtures::control_plane("team-a").replicas(3).build()`.

use noops_api::control_plane::{KubernetesControlPlane, KubernetesControlPlaneSpec, KubernetesControlPlaneStatus};

/// A KubernetesControlPlane under construction.
pub struct ControlPlaneFixture(KubernetesControlPlane);

/// Control plane `name` in namespace `tenants` (uid `uid-1`, generation 1): version `1.34`,
/// one API server, the default etcd (3 members), ranges and Service.
pub fn control_plane(name: &str) -> ControlPlaneFixture {
    let spec: KubernetesControlPlaneSpec =
        serde_json::from_value(serde_json::json!({ "version": "1.34" })).unwrap_or_else(|e| panic!("{e}"));
    let mut kcp = KubernetesControlPlane::new(name, spec);
    kcp.metadata.namespace = Some("tenants".into());
    kcp.metadata.uid = Some("uid-1".into());
    kcp.metadata.generation = Some(1);
    ControlPlaneFixture(kcp)
}

impl ControlPlaneFixture {
    pub fn replicas(mut self, replicas: i32) -> Self {
        self.0.spec.replicas = replicas;
        self
    }
    pub fn etcd_replicas(mut self, replicas: i32) -> Self {
        self.0.spec.etcd.replicas = replicas;
        self
    }
    pub fn extra_api_server_arg(mut self, arg: &str) -> Self {
        self.0.spec.extra_args.api_server.push(arg.into());
        self
    }
    pub fn status(mut self, status: KubernetesControlPlaneStatus) -> Self {
        self.0.status = Some(status);
        self
    }
    pub fn build(self) -> KubernetesControlPlane {
        self.0
    }
}
