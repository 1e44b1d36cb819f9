//! How a new cluster starts, without ever starting twice.
//!
//! Members read `--initial-cluster-state` from the ConfigMap `<cluster>-state` each time their
//! process starts (an environment variable from a ConfigMap key, resolved at container start).
//! It says `new` only while the first member bootstraps the cluster, and `existing` from then
//! on. So a member whose data directory was wiped and whose process restarts never forms a
//! one-member cluster of its own. (With `existing` and an empty data directory etcd would
//! still start and rejoin under its old ID, having forgotten its log: the planner therefore
//! never starts a member that etcd lists on a volume that is not its own; it replaces it.)

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::names::Names;

/// The ConfigMap key members read their initial cluster state from.
pub const STATE_KEY: &str = "initial-cluster-state";

/// The ConfigMap with the initial cluster state: `new` while bootstrapping, else `existing`.
pub fn state_config_map(names: &Names, owner: &OwnerReference, bootstrapping: bool) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(names.state_config_map()),
            namespace: Some(names.namespace.clone()),
            labels: Some(names.cluster_labels()),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            STATE_KEY.to_string(),
            if bootstrapping { "new" } else { "existing" }.to_string(),
        )])),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fixtures::owner_reference;

    #[test]
    fn only_a_bootstrapping_cluster_says_new() {
        let names = Names {
            cluster: "main".into(),
            namespace: "db".into(),
            tls: true,
            user_secrets: None,
            image_repository: crate::etcd::names::ETCD_REPOSITORY.into(),
            refused_repository: None,
        };
        let owner = owner_reference("EtcdCluster", "main", "u1");
        let state = |b| state_config_map(&names, &owner, b).data.unwrap()[STATE_KEY].clone();
        assert_eq!(state(true), "new");
        assert_eq!(state(false), "existing");
        assert_eq!(
            state_config_map(&names, &owner, true).metadata.name.as_deref(),
            Some("main-state")
        );
    }
}
