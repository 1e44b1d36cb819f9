//! The EtcdCluster every test of this controller starts from, changed only where a test says
//! so: `fixtures::cluster().replicas(5).build()`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use noops_api::EtcdCluster;
use noops_api::etcd::{EtcdClusterSpec, EtcdClusterStatus, PodSpec, StorageSpec, TlsSpec};

use crate::core::fixtures::owner_reference;

/// An EtcdCluster under construction.
pub struct ClusterFixture(EtcdCluster);

/// EtcdCluster `main` in namespace `db` (uid `uid-1`, generation 1): 3 members of etcd 3.5.21,
/// persistent 1Gi volumes, TLS on.
pub fn cluster() -> ClusterFixture {
    let mut cluster = EtcdCluster::new(
        "main",
        EtcdClusterSpec {
            replicas: 3,
            version: "3.5.21".into(),
            image_repository: None,
            storage: StorageSpec::default(),
            tls: TlsSpec::default(),
            paused: false,
            pod: PodSpec::default(),
            backup: None,
            bootstrap: None,
            defragmentation: Default::default(),
        },
    );
    cluster.metadata.namespace = Some("db".into());
    cluster.metadata.uid = Some("uid-1".into());
    cluster.metadata.generation = Some(1);
    ClusterFixture(cluster)
}

impl ClusterFixture {
    pub fn ephemeral(mut self) -> Self {
        self.0.spec.storage.ephemeral = true;
        self
    }

    pub fn without_tls(mut self) -> Self {
        self.0.spec.tls.enabled = false;
        self
    }

    pub fn extra_args(mut self, args: &[&str]) -> Self {
        self.0.spec.pod.extra_args = args.iter().map(|a| a.to_string()).collect();
        self
    }

    pub fn status(mut self, status: EtcdClusterStatus) -> Self {
        self.0.status = Some(status);
        self
    }

    pub fn build(self) -> EtcdCluster {
        self.0
    }
}

/// The controller reference of the fixture's children.
pub fn owner() -> OwnerReference {
    owner_reference("EtcdCluster", "main", "uid-1")
}
