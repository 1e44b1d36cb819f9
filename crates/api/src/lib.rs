//! The noops custom resources, group `noops.dev`, version `v1alpha1`.
//!
//! Each resource is a Rust type with `#[derive(CustomResource)]`; its CRD (schema, CEL rules,
//! printer columns) is generated from the type by `noops crds` and committed under `deploy/crds`.
//! Validation lives in the schema wherever the API server can enforce it, so a bad spec is
//! rejected at `kubectl apply` with a message that says what to fix.
//!
//! Structs with optional fields carry `#[skip_serializing_none]`: an unset field is left out
//! of what the operator writes rather than sent as `null`, so a server-side apply never takes
//! ownership of fields it does not set.
#![forbid(unsafe_code)]

pub mod backup;
pub mod condition;
pub mod control_plane;
pub mod etcd;
pub mod etcd_backup;
pub mod governed;
pub mod kubernetes_cluster;
pub mod machine;
pub mod machine_deployment;
pub mod machine_set;
pub mod maintpage;
mod phase;
pub mod postgres;
pub mod postgres_backup;
pub mod quantity;
pub mod reason;
pub mod uri;
pub mod version_rules;

pub use control_plane::{KubernetesControlPlane, KubernetesControlPlaneSpec, KubernetesControlPlaneStatus};
pub use etcd::{EtcdCluster, EtcdClusterSpec, EtcdClusterStatus};
pub use etcd_backup::{EtcdBackup, EtcdBackupSpec, EtcdBackupStatus};
pub use kubernetes_cluster::{KubernetesCluster, KubernetesClusterSpec, KubernetesClusterStatus};
pub use machine::{Machine, MachineSpec, MachineStatus};
pub use machine_deployment::{MachineDeployment, MachineDeploymentSpec, MachineDeploymentStatus};
pub use machine_set::{MachineSet, MachineSetSpec, MachineSetStatus};
pub use maintpage::{MaintPage, MaintPageSpec, MaintPageStatus};
pub use postgres::{PostgreSQL, PostgreSQLSpec, PostgreSQLStatus};
pub use postgres_backup::{PostgresBackup, PostgresBackupSpec, PostgresBackupStatus};

/// The API group of every noops resource.
pub const GROUP: &str = "noops.dev";
/// The API version of every noops resource.
pub const VERSION: &str = "v1alpha1";

/// Every CRD of the group, in a stable order.
pub fn crds() -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> {
    use kube::CustomResourceExt;
    vec![
        EtcdBackup::crd(),
        EtcdCluster::crd(),
        KubernetesCluster::crd(),
        KubernetesControlPlane::crd(),
        Machine::crd(),
        MachineDeployment::crd(),
        MachineSet::crd(),
        MaintPage::crd(),
        PostgreSQL::crd(),
        PostgresBackup::crd(),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_kind_is_listed_by_kubectl_get_noops() {
        for crd in super::crds() {
            let categories = crd.spec.names.categories.unwrap_or_default();
            assert!(
                categories.iter().any(|c| c == "noops"),
                "{} is not in category noops",
                crd.spec.names.kind
            );
        }
    }

    /// `kubectl explain <kind>.status.conditions.reason` and `.status.phase` list their values.
    #[test]
    fn every_kind_lists_its_condition_reasons_and_phases() {
        for crd in super::crds() {
            let kind = crd.spec.names.kind.clone();
            let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
            let status = &schema["openAPIV3Schema"]["properties"]["status"]["properties"];
            let reasons = &status["conditions"]["items"]["properties"]["reason"]["enum"];
            let reasons: Vec<&str> = reasons
                .as_array()
                .unwrap_or_else(|| panic!("{kind}: no reasons listed"))
                .iter()
                .filter_map(|r| r.as_str())
                .collect();
            assert!(
                reasons.contains(&"Paused") && reasons.contains(&"NotPaused"),
                "{kind}: {reasons:?}"
            );
            assert!(reasons.len() > 4, "{kind}: {reasons:?}");
            // A MachineSet has no phase (as in Cluster API); a MaintPage says the side it
            // publishes instead.
            if !["MachineSet", "MaintPage"].contains(&kind.as_str()) {
                let phases = status["phase"]["enum"].as_array().map_or(0, Vec::len);
                assert!(phases > 1, "{kind}: no phases listed");
            }
        }
    }
}
