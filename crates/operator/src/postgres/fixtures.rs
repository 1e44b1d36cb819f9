//! Objects for the unit tests of the PostgreSQL controller.
#![allow(clippy::unwrap_used)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use noops_api::PostgreSQL;

/// The original's manifest: `db`, `user` and `passwordSecret`, everything else defaulted.
pub fn postgres(name: &str) -> PostgreSQL {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "noops.dev/v1alpha1",
        "kind": "PostgreSQL",
        "metadata": { "name": name, "namespace": "prod", "uid": "uid-1", "generation": 1 },
        "spec": { "db": "shop", "user": "app", "passwordSecret": "shop-db" },
    }))
    .unwrap()
}

pub fn owner() -> OwnerReference {
    OwnerReference {
        api_version: "noops.dev/v1alpha1".into(),
        kind: "PostgreSQL".into(),
        name: "shop".into(),
        uid: "uid-1".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}
