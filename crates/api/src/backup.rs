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
use serde_with::skip_serializing_none;

/// An engine whose backups go to a destination: what it calls its default folder.
pub trait Engine: Clone + Debug + PartialEq + Send + Sync + 'static {
    /// The prefix (key prefix or folder) its backups go under unless the spec says another.
    const DEFAULT_PREFIX: &'static str;
    /// How many scheduled backups retention keeps unless the spec says another.
    const DEFAULT_MAX_BACKUPS: i32;
}

/// The engine marker of etcd's backups: snapshots go under `etcd/` by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Etcd;
impl Engine for Etcd {
    const DEFAULT_PREFIX: &'static str = "etcd";
    const DEFAULT_MAX_BACKUPS: i32 = 5;
}

/// The engine marker of PostgreSQL's backups: they go under `postgres/` by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Postgres;
impl Engine for Postgres {
    const DEFAULT_PREFIX: &'static str = "postgres";
    const DEFAULT_MAX_BACKUPS: i32 = 7;
}

/// When scheduled backups are made, how many are kept, and where every backup goes: a
/// resource's `backup` (PostgreSQL's adds WAL archiving).
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", bound = "E: Engine")]
#[schemars(bound = "E: Engine")]
#[schemars(extend("x-kubernetes-validations" = [{"rule": "has(self.s3) != has(self.volume)", "message": "backup needs exactly one destination: s3 (an S3-compatible bucket) or volume (a PersistentVolumeClaim)"}]))]
pub struct BackupPlan<E: Engine> {
    /// When to make a scheduled backup, as a cron expression in UTC: five fields (minute hour
    /// day month weekday, such as `0 3 * * *`), or six with seconds first. Without it, backups
    /// are made on demand (apply an EtcdBackup or a PostgresBackup; a PostgreSQL also takes a
    /// first base backup as soon as it serves).
    #[schemars(length(max = 128))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self.trim().split(' ').filter(f, f != '').size() in [5, 6]", "message": "backup.schedule must be a cron expression of five fields (minute hour day month weekday, such as \"0 3 * * *\") or six (seconds first)"}]))]
    pub schedule: Option<String>,
    /// How many scheduled backups to keep: once a new one has succeeded, the oldest beyond
    /// this many are deleted with what only they need (a snapshot; a base backup and the WAL
    /// only it needed). On-demand backups are never deleted by it.
    #[serde(default = "default_max_backups::<E>")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self >= 1 && self <= 1000", "message": "backup.maxBackups must be between 1 and 1000"}]))]
    pub max_backups: i32,
    /// Where backups go: `s3` (an S3-compatible bucket) or `volume` (a PersistentVolumeClaim).
    #[serde(flatten)]
    pub destination: BackupDestination<E>,
}

/// Where backups go: a bucket or a volume (the resource's schema asks for exactly one).
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", bound = "E: Engine")]
#[schemars(bound = "E: Engine")]
pub struct BackupDestination<E: Engine> {
    /// The S3-compatible bucket backups go to (or `volume`).
    pub s3: Option<S3Destination<E>>,
    /// The volume backups go to (or `s3`).
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

/// What a resource's status says of its backups (an EtcdCluster's, a PostgreSQL's), the part
/// every engine has.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackupsStatus {
    /// The schedule's bookmark: the scheduled time of the last scheduled backup made.
    pub last_scheduled_time: Option<Time>,
    /// When the schedule was first followed: one with no successful backup twice its interval
    /// after this has never worked (the NoopsBackupNeverSucceeded alert).
    pub schedule_since: Option<Time>,
    /// The newest successful backup.
    pub last_backup: Option<String>,
    /// When the newest successful backup completed.
    pub last_backup_time: Option<Time>,
    /// How many successful backups are kept.
    pub stored_backups: Option<i32>,
}

crate::phase::phases! {
    /// Where a backup is, in a word (`status.phase`).
    BackupPhase {
        /// It is being taken, or waits for what it needs (within its deadline).
        Running,
        /// It is stored and can be restored.
        Succeeded,
        /// It could not be taken: its `Succeeded` condition says why. It is never taken again.
        Failed,
    }
}

/// How one backup is doing, the part of a backup's status every engine has.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackupProgress {
    /// Where it is, in a word: Running, Succeeded, Failed.
    #[serde(default, deserialize_with = "crate::phase::known_or_none")]
    #[schemars(with = "Option<BackupPhase>")]
    pub phase: Option<BackupPhase>,
    /// `Succeeded`: True once the backup is stored; False with the reason while it is not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "BackupReason::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Where it is: `s3://<bucket>/<key>` or `pvc://<claim>/<path>`.
    pub location: Option<String>,
    /// Its size in bytes.
    pub size: Option<i64>,
    /// Its SHA-256 (hex), checked again before a restore.
    pub sha256: Option<String>,
    pub started_at: Option<Time>,
    /// When it was stored (or failed).
    pub completed_at: Option<Time>,
    /// How far it has got, while it runs (not all engines say).
    pub under_way: Option<WorkProgress>,
}

/// How far long work (a base backup, a restore) has got while it runs, as the work itself
/// reports it.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WorkProgress {
    /// What it does now, in words: "streaming database files", "downloading the base backup",
    /// "replaying WAL".
    pub step: String,
    /// What it works from: the backup a restore restores.
    pub source: Option<String>,
    /// Bytes done so far, and how many in all (an estimate for a base backup; none when it
    /// is not known).
    pub bytes_done: Option<i64>,
    pub bytes_total: Option<i64>,
    /// For a WAL replay: the position replayed so far, and the commit time of the last
    /// transaction replayed (once the server can say).
    pub replayed_wal: Option<String>,
    pub replayed_to: Option<String>,
    /// When the operator last wrote it: it is written at most every few seconds.
    pub updated_at: Option<Time>,
}

impl BackupProgress {
    /// Succeeded or Failed: a backup that is done is never taken again.
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Some(BackupPhase::Succeeded | BackupPhase::Failed))
    }

    /// Succeeded: it is stored and can be restored.
    pub fn succeeded(&self) -> bool {
        self.phase == Some(BackupPhase::Succeeded)
    }
}

fn default_max_backups<E: Engine>() -> i32 {
    E::DEFAULT_MAX_BACKUPS
}

fn default_prefix<E: Engine>() -> String {
    E::DEFAULT_PREFIX.into()
}

fn default_region() -> String {
    "us-east-1".into()
}

crate::reason::reasons! {
    /// Why an EtcdBackup's or PostgresBackup's condition is as it is
    /// (`status.conditions[].reason`; the CRD schema lists them).
    BackupReason {
        Stored,
        InProgress,
        NoDestination,
        StoreUnavailable,
        UploadFailed,
        NotStored,
        BackupTooLong,
        BackupPodStuck,
        ClaimNotFound,
        ClusterNotFound,
        NoHealthyMember,
        NoClientCertificate,
        SnapshotFailed,
        SnapshotStalled,
        PostgreSQLNotFound,
        NotServing,
        InstanceNotReady,
        BaseBackupFailed,
    }
}
