//! Objects for the unit tests of the PostgreSQL controller.
#![allow(clippy::unwrap_used)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use noops_api::{PostgreSQL, PostgresBackup};

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

/// The names of `postgres("shop")`'s objects.
pub fn names() -> crate::postgres::names::Names {
    crate::postgres::names::Names::of(&postgres("shop"))
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

/// `pg` with backups to the bucket `backups` of an S3-compatible store.
pub fn with_backups(mut pg: PostgreSQL) -> PostgreSQL {
    pg.spec.backup = Some(
        serde_json::from_value(serde_json::json!({
            "s3": { "endpoint": "http://versitygw.store.svc:7070", "bucket": "backups", "credentialsSecret": "keys" },
        }))
        .unwrap(),
    );
    pg
}

/// A PostgresBackup of `postgresql` in `phase`, taken from system `system_id` into the bucket of
/// [`with_backups`], completed at `completed` (seconds).
pub fn backup(name: &str, postgresql: &str, phase: &str, system_id: &str, completed: i64) -> PostgresBackup {
    let at = jiff::Timestamp::from_second(completed).unwrap();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "noops.dev/v1alpha1",
        "kind": "PostgresBackup",
        "metadata": { "name": name, "namespace": "prod", "uid": format!("uid-{name}"),
                      "creationTimestamp": at },
        "spec": { "postgresql": postgresql },
        "status": {
            "phase": phase,
            "systemIdentifier": system_id,
            "sha256": "ab",
            "startWal": "0/2000028",
            "endWal": "0/2000100",
            "completedAt": at,
            "destination": {
                "s3": { "endpoint": "http://versitygw.store.svc:7070", "bucket": "backups",
                        "prefix": "postgres", "region": "us-east-1", "credentialsSecret": "keys" },
                "base": format!("postgres/prod/{postgresql}/base/{name}"),
                "wal": format!("postgres/prod/{postgresql}/wal/{system_id}"),
            },
        },
    }))
    .unwrap()
}

/// A Ready instance as the primary reports it: a replica streaming with `lag` bytes to go.
pub fn member(name: &str, role: noops_api::postgres::Role, lag: i64) -> noops_api::postgres::MemberStatus {
    let replica = role == noops_api::postgres::Role::Replica;
    noops_api::postgres::MemberStatus {
        name: name.into(),
        role,
        node: None,
        ready: true,
        timeline: None,
        received_lsn: None,
        replayed_lsn: None,
        lag_bytes: replica.then_some(lag),
        lag_millis: None,
        streaming: replica.then_some(true),
        observed_at: None,
    }
}
