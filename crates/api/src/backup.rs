//! The backup types every engine shares: where backups go (an S3-compatible bucket or a
//! PersistentVolumeClaim) and how one backup is doing. Each engine keeps its backups under its
//! own default prefix (`etcd/…`, `postgres/…`), so the destinations take the engine as a type
//! parameter: `etcd::S3Destination` is `S3Destination<Etcd>`, the same fields and rules with
//! another default.

use std::fmt::Debug;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An engine whose backups go to a destination: what it calls its default folder.
pub trait Engine: Clone + Debug + PartialEq + Send + Sync + 'static {
    /// The prefix (key prefix or folder) its backups go under unless the spec says another.
    const DEFAULT_PREFIX: &'static str;
}

/// The engine marker of etcd's backups: snapshots go under `etcd/` by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Etcd;
impl Engine for Etcd {
    const DEFAULT_PREFIX: &'static str = "etcd";
}

/// The engine marker of PostgreSQL's backups: they go under `postgres/` by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Postgres;
impl Engine for Postgres {
    const DEFAULT_PREFIX: &'static str = "postgres";
}

/// Where backups go: a bucket or a volume (the resource's schema asks for exactly one).
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", bound = "E: Engine")]
#[schemars(bound = "E: Engine")]
pub struct BackupDestination<E: Engine> {
    /// The S3-compatible bucket backups go to (or `volume`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Destination<E>>,
    /// The volume backups go to (or `s3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolumeDestination<E>>,
}

/// A bucket in an S3-compatible object store. An engine's backups are under
/// `<prefix>/<namespace>/<name>/`.
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(bound = "E: Engine")]
pub struct S3Destination<E: Engine> {
    /// The store's URL, such as `http://versitygw.object-store.svc:7070`. Path-style requests.
    /// Pods reach it too (WAL archiving, restores), so a Service name must resolve in pods.
    #[schemars(length(max = 512))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self.startsWith('http://') || self.startsWith('https://')", "message": "backup.s3.endpoint must be an http:// or https:// URL"}]))]
    pub endpoint: String,
    /// The bucket (it must exist).
    #[schemars(length(min = 3, max = 63))]
    pub bucket: String,
    /// The key prefix.
    #[serde(default = "default_prefix::<E>")]
    #[schemars(length(max = 256))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "!self.startsWith('/') && !self.split('/').exists(p, p == '..')", "message": "backup.s3.prefix must be a relative key prefix, without '..'"}]))]
    pub prefix: String,
    /// The region the store signs requests for.
    #[serde(default = "default_region")]
    #[schemars(length(max = 64))]
    pub region: String,
    /// A Secret in the resource's namespace with keys `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY`.
    #[schemars(length(min = 1, max = 253))]
    pub credentials_secret: String,
    #[serde(skip)]
    #[schemars(skip)]
    pub engine: PhantomData<E>,
}

/// A PersistentVolumeClaim backups are written into by pods that mount it, under
/// `<prefix>/<name>/` (the claim is in the resource's namespace already). A claim on one
/// node's disk (local-path) ties backups, and restores from them, to that node.
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(bound = "E: Engine")]
pub struct VolumeDestination<E: Engine> {
    /// The claim, in the resource's namespace (it must exist).
    #[schemars(length(min = 1, max = 253))]
    pub claim_name: String,
    /// The folder in the volume.
    #[serde(default = "default_prefix::<E>")]
    #[schemars(length(max = 256))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "!self.startsWith('/') && !self.split('/').exists(p, p == '..')", "message": "backup.volume.prefix must be a relative path inside the volume, without '..'"}]))]
    pub prefix: String,
    #[serde(skip)]
    #[schemars(skip)]
    pub engine: PhantomData<E>,
}

/// How one backup is doing, the part of a backup's status every engine has.
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackupProgress {
    /// Running, Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// `Succeeded`: True once the backup is stored; False with the reason while it is not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Where it is: `s3://<bucket>/<key>` or `pvc://<claim>/<path>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Its size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    /// Its SHA-256 (hex), checked again before a restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When it was stored (or failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
}

impl BackupProgress {
    /// Succeeded or Failed: a backup that is done is never taken again.
    pub fn is_done(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Succeeded" | "Failed"))
    }

    /// Succeeded: it is stored and can be restored.
    pub fn succeeded(&self) -> bool {
        self.phase.as_deref() == Some("Succeeded")
    }
}

fn default_prefix<E: Engine>() -> String {
    E::DEFAULT_PREFIX.into()
}

fn default_region() -> String {
    "us-east-1".into()
}
