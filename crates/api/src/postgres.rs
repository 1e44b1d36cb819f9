//! PostgreSQL: one database, with its user and password, run and kept by the operator.
//!
//! ```yaml
//! apiVersion: noops.dev/v1alpha1
//! kind: PostgreSQL
//! metadata: { name: shop }
//! spec:
//!   db: shop
//!   user: shop
//!   passwordSecret: shop-db   # key `password` (or `postgresql_password`)
//! ```
//!
//! The operator runs the instances in a StatefulSet, a pod and a persistent volume each (one
//! instance by default; `instances: 3` adds two hot-standby replicas streaming from it),
//! initialises the data directory, creates the database and its owner with the password from
//! the Secret (and changes it when the Secret changes), and publishes it behind a Service with
//! a connection Secret `<name>-connection`.
//!
//! With `backup`, every WAL segment is archived to an S3-compatible bucket or a volume as soon
//! as it is full or `archiveTimeoutSeconds` have passed, and base backups (`PostgresBackup`)
//! are taken on a schedule and on demand. An instance that starts on an empty volume while a
//! backup exists is restored from the newest base backup and the archived WAL before it
//! serves; `bootstrap.fromBackup` makes a new database from a backup, to its end or to a time.

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::backup::BackupsStatus;

/// The keys of the password Secret the password is read from: `password`, or the key of the
/// shell-script operator this one replaces.
pub const PASSWORD_KEYS: [&str; 2] = ["password", "postgresql_password"];
/// The annotation that asks for a switchover: its value names the instance to promote
/// (`kubectl noops promote pg/<name> <instance>` sets it). The operator removes it once it has
/// acted on it, or refused it with a `SwitchoverRefused` Event.
pub const PROMOTE_ANNOTATION: &str = "noops.dev/promote";
/// The condition that enough replicas acknowledge commits synchronously, and its reason when
/// fewer than asked do.
pub const SYNCHRONOUS_REPLICAS: &str = "SynchronousReplicas";
pub const TOO_FEW_REPLICAS: &str = PostgreSQLReason::TooFewReplicas.as_str();
/// The Event of a switchover request refused: the request goes, the primary stays.
pub const SWITCHOVER_REFUSED: &str = "SwitchoverRefused";
/// The Event of a switchover begun and given up: the old primary serves again.
pub const SWITCHOVER_GIVEN_BACK: &str = "SwitchoverGivenBack";
/// The most WAL a replica may lag behind the primary and still be switched to: about one WAL
/// segment, which a streaming replica receives in well under a second.
pub const SWITCHOVER_LAG_BOUND_BYTES: i64 = 16 * 1024 * 1024;

/// The desired state of one PostgreSQL database.
#[skip_serializing_none]
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "noops.dev",
    version = "v1alpha1",
    kind = "PostgreSQL",
    plural = "postgresqls",
    shortname = "pg",
    category = "noops",
    namespaced,
    status = "PostgreSQLStatus",
    scale(
        spec_replicas_path = ".spec.instances",
        status_replicas_path = ".status.readyInstances",
        label_selector_path = ".status.selector"
    ),
    validation = Rule::new("self.metadata.name.size() <= 45").message("a PostgreSQL name is at most 45 characters: its StatefulSet, pod and volume names add to it"),
    validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("a PostgreSQL name must be a DNS label: lower-case letters, digits and '-', starting with a letter"),
    validation = Rule::new("self.spec.version == oldSelf.spec.version || !has(oldSelf.status) || !has(oldSelf.status.systemIdentifier)").message("spec.version cannot change once the database has run: major upgrades (pg_upgrade) are not supported yet; restore a backup into a new PostgreSQL instead"),
    validation = Rule::new("!has(self.spec.synchronous) || self.spec.synchronous.number < self.spec.instances").message("spec.synchronous.number must be less than spec.instances: each synchronous replica is an instance beside the primary"),
    validation = Rule::new("has(self.spec.bootstrap) == has(oldSelf.spec.bootstrap) && (!has(self.spec.bootstrap) || self.spec.bootstrap == oldSelf.spec.bootstrap)").message("spec.bootstrap is immutable: it says how the database started"),
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Instances","type":"integer","jsonPath":".spec.instances"}"#,
    printcolumn = r#"{"name":"Ready Instances","type":"integer","jsonPath":".status.readyInstances","priority":1}"#,
    printcolumn = r#"{"name":"Primary","type":"string","jsonPath":".status.currentPrimary"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.serverVersion"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".status.endpoint"}"#,
    printcolumn = r#"{"name":"Last Backup","type":"date","jsonPath":".status.lastBackupTime"}"#,
    printcolumn = r#"{"name":"Restored To","type":"string","jsonPath":".status.restore.recoveredTo"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PostgreSQLSpec {
    /// The database to create, owned by `user`. Immutable.
    #[x_kube(validation = Rule::new("self.matches('^[a-z_][a-z0-9_]{0,62}$')").message("db must be a plain PostgreSQL name: lower-case letters, digits and '_', starting with a letter or '_', at most 63 characters"))]
    #[x_kube(validation = Rule::new("!(self in ['postgres', 'template0', 'template1'])").message("db cannot be postgres, template0 or template1: those databases belong to PostgreSQL itself"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("db is immutable: create another PostgreSQL (from a backup) for another database name"))]
    pub db: String,
    /// The role that owns the database and logs in with the password. Immutable.
    #[x_kube(validation = Rule::new("self.matches('^[a-z_][a-z0-9_]{0,62}$')").message("user must be a plain PostgreSQL name: lower-case letters, digits and '_', starting with a letter or '_', at most 63 characters"))]
    #[x_kube(validation = Rule::new("self != 'postgres' && !self.startsWith('pg_')").message("user cannot be postgres (the operator's superuser) or start with pg_ (reserved by PostgreSQL)"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("user is immutable: create another PostgreSQL (from a backup) for another owner"))]
    pub user: String,
    /// A Secret in the same namespace holding the user's password under `password` (or
    /// `postgresql_password`). Changing the password in it changes it in the database.
    #[schemars(length(min = 1, max = 253))]
    pub password_secret: String,
    /// The PostgreSQL major version (the `postgres:<major>` image). Fixed once the database has
    /// run: a major upgrade needs pg_upgrade, which the operator does not run yet.
    #[serde(default = "default_version")]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]{2}$') && int(self) >= 13 && int(self) <= 18").message("version must be a PostgreSQL major version from 13 to 18, such as \"15\""))]
    pub version: String,
    /// The repository to pull PostgreSQL from, without a tag (the tag is the version), laid
    /// out as the official `postgres` image. Default: `postgres`, in the operator's
    /// `--image-registry` if it has one.
    #[schemars(length(max = 255))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$') && !self.matches(':[0-9]+$')").message("imageRepository must be an image repository without a tag, such as registry.example.com/postgres: the tag is the version"))]
    pub image_repository: Option<String>,
    /// How many instances: one primary and `instances - 1` hot-standby replicas, each made by
    /// streaming a copy of the primary (`pg_basebackup`) and then following it through a
    /// physical replication slot of its own, spread over the nodes. Default 1: one instance.
    #[serde(default = "default_instances")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 9").message("instances must be between 1 and 9"))]
    pub instances: i32,
    /// Synchronous replication: a commit is acknowledged only once `number` replicas have it
    /// on disk, so that a failover loses none. Off by default (asynchronous: a failover may
    /// lose the last commits the lost primary acknowledged).
    pub synchronous: Option<SynchronousSpec>,
    /// Each instance's volume.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("storage is immutable: create a new PostgreSQL (from a backup) to change it"))]
    pub storage: StorageSpec,
    /// How the database is reached.
    #[serde(default)]
    pub service: ServiceSpec,
    /// CPU and memory of the PostgreSQL container.
    pub resources: Option<ResourceRequirements>,
    /// Backups: continuous WAL archiving and base backups (PostgresBackup), to an S3-compatible
    /// bucket or a volume. Without it, a lost volume loses the database.
    pub backup: Option<BackupSpec>,
    /// How a new database starts: empty (the default), or from a backup. Immutable.
    pub bootstrap: Option<BootstrapSpec>,
    /// Stop changing the database (its pod, StatefulSet and Service, the role, password and
    /// database inside it, the handling of a lost node) until set back to false: for work by
    /// hand. The status is kept current, and backups and WAL archiving go on; retention
    /// deletes no backup meanwhile.
    #[serde(default)]
    pub paused: bool,
}

/// Where backups go and when base backups are taken. WAL archiving is on whenever this is set.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// When scheduled base backups are made, how many are kept, and where backups and WAL go.
    #[serde(flatten)]
    pub plan: crate::backup::BackupPlan<Postgres>,
    /// The most seconds a committed transaction waits before its WAL segment is archived
    /// (PostgreSQL's `archive_timeout`): what a lost volume can cost. Each forced segment is
    /// stored compressed, so a short timeout costs little space.
    #[serde(default = "default_archive_timeout_seconds")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 3600").message("backup.archiveTimeoutSeconds must be between 1 and 3600"))]
    pub archive_timeout_seconds: i32,
    /// The most a base backup reads from the database, in KiB per second
    /// (`pg_basebackup --max-rate`): a large database's backup then does not take the disk
    /// from its clients. Default: no limit.
    #[x_kube(validation = Rule::new("self >= 32 && self <= 1048576").message("backup.baseBackupMaxRate is in KiB per second, between 32 and 1048576 (1 GiB/s)"))]
    pub base_backup_max_rate: Option<i32>,
    /// Which instance base backups read: `Primary` (the default), or `PreferStandby`, the
    /// streaming replica least behind when there is one (the primary when none is), so that
    /// a backup's reads do not compete with the primary's clients. WAL is archived by the
    /// primary alone either way; a backup read from a replica is recorded only once the
    /// primary has archived the WAL it ends in.
    #[serde(default)]
    pub target: BackupTarget,
}

/// Which instance base backups read (`backup.target`).
#[derive(JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BackupTarget {
    /// The primary.
    #[default]
    Primary,
    /// A streaming replica, the least behind; the primary when none streams.
    PreferStandby,
}

pub use crate::backup::Postgres;

pub type S3Destination = crate::backup::S3Destination<Postgres>;
/// A claim the instance archives WAL into and backup pods write base backups into, under
/// `<prefix>/<name>/`. The instance mounts it: with a claim on one node's disk, the instance
/// runs on that node, and a lost node cannot be recovered from it.
pub type VolumeDestination = crate::backup::VolumeDestination<Postgres>;

/// Synchronous replication (`synchronous_standby_names = 'ANY <number> (...)'`).
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SynchronousSpec {
    /// How many replicas must have a commit on disk before it is acknowledged; any of them.
    #[x_kube(validation = Rule::new("self >= 1 && self <= 8").message("synchronous.number must be between 1 and 8"))]
    pub number: i32,
    /// What happens while fewer than `number` replicas stream: `Required` (the default)
    /// keeps commits waiting until enough are back, so that no acknowledged commit can be
    /// lost; `Preferred` acknowledges them with the replicas there are (asynchronously when
    /// none is), with a Warning and the `SynchronousReplicas` condition False.
    #[serde(default)]
    pub data_durability: DataDurability,
}

/// Whether commits wait for replicas that are not there (`synchronous.dataDurability`).
#[derive(JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DataDurability {
    /// Commits wait until `number` replicas have them: none acknowledged can be lost.
    #[default]
    Required,
    /// Commits go on with fewer replicas (with none: asynchronous) rather than wait.
    Preferred,
}

/// How a new database starts.
#[skip_serializing_none]
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapSpec {
    /// Start from this backup (of this or another PostgreSQL in the namespace): its base
    /// backup and the WAL archived after it are restored, to their end or to `targetTime`.
    pub from_backup: Option<BackupSource>,
}

/// A PostgresBackup to start from, and how far to replay the WAL after it.
#[skip_serializing_none]
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackupSource {
    /// The PostgresBackup, in this namespace (it must have succeeded).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Recover to this moment (RFC 3339, such as `2026-11-24T10:00:00Z`): transactions that
    /// committed after it are not replayed. It must be after the end of the base backup.
    /// Without it, every archived transaction is replayed.
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\\\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$')").message("bootstrap.fromBackup.targetTime must be an RFC 3339 time such as 2026-11-24T10:00:00Z"))]
    pub target_time: Option<String>,
}

/// The instance's volume.
#[skip_serializing_none]
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// The size of the volume, such as `1Gi`.
    #[serde(default = "default_storage_size")]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+(\\\\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$')").message("storage.size must be a quantity such as 1Gi or 500Mi"))]
    pub size: String,
    /// The StorageClass of the volume; the cluster's default if unset.
    #[schemars(length(max = 253))]
    pub storage_class_name: Option<String>,
}

impl Default for StorageSpec {
    fn default() -> Self {
        Self {
            size: default_storage_size(),
            storage_class_name: None,
        }
    }
}

/// The Service clients connect to, `<name>` on port 5432.
#[skip_serializing_none]
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[x_kube(validation = Rule::new("!has(self.nodePort) || self.type == 'NodePort'").message("service.nodePort needs service.type: NodePort"))]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    /// ClusterIP (the default: inside the cluster only) or NodePort (also on every node).
    #[serde(default, rename = "type")]
    pub type_: ServiceType,
    /// The node port to use with NodePort; one is chosen if unset.
    #[x_kube(validation = Rule::new("self >= 30000 && self <= 32767").message("service.nodePort must be in the node port range, 30000 to 32767"))]
    pub node_port: Option<i32>,
}

/// How the Service is exposed.
#[derive(JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ServiceType {
    #[default]
    ClusterIP,
    NodePort,
}

crate::phase::phases! {
    /// Where a database is, in a word (`status.phase`).
    PostgreSQLPhase {
        /// Its first instance is being made.
        Creating,
        /// Its first instance is being restored from a backup.
        Restoring,
        /// It serves, and nothing needs attention.
        Running,
        /// It served and does not now, or it serves and something needs attention (a replica,
        /// archiving, a Secret, the spec).
        Degraded,
        /// It never served and cannot start as the spec is: the conditions say why.
        Failed,
        /// `spec.paused`: the operator changes nothing.
        Paused,
    }
}

/// The observed state of a PostgreSQL.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PostgreSQLStatus {
    /// The generation of the spec this status describes.
    pub observed_generation: Option<i64>,
    /// Ready, Progressing and Degraded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "PostgreSQLReason::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Where it is, in a word: Creating, Restoring, Running, Degraded, Failed, Paused.
    #[serde(default, deserialize_with = "crate::phase::known_or_none")]
    #[schemars(with = "Option<PostgreSQLPhase>")]
    pub phase: Option<PostgreSQLPhase>,
    /// Where clients connect: `<name>.<namespace>.svc:5432`.
    pub endpoint: Option<String>,
    /// The node port, with `service.type: NodePort`.
    pub node_port: Option<i32>,
    /// The Secret with `host`, `port`, `database`, `user`, `password` and `uri`.
    pub connection_secret: Option<String>,
    /// The pod running the primary instance, and its node.
    pub instance: Option<String>,
    pub node: Option<String>,
    /// The instance that takes writes (behind `<name>` and `<name>-rw`).
    pub current_primary: Option<String>,
    /// Instances that are Ready: the primary serving, replicas streaming from it.
    pub ready_instances: Option<i32>,
    /// The label query of the instances' pods, for the scale subresource.
    pub selector: Option<String>,
    /// Each instance as last looked at (at most every 10 s): its role, node, WAL positions,
    /// lag and timeline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberStatus>,
    /// What the primary's commits wait for (its `synchronous_standby_names`): empty while
    /// they are acknowledged without a replica.
    pub synchronous_standby_names: Option<String>,
    /// Why instances share a node, when they do (one node lost would take more than one).
    pub placement: Option<String>,
    /// The last failover: the primary lost, the replica promoted, why, and how long writes
    /// waited.
    pub last_failover: Option<FailoverStatus>,
    /// The version the server reports, such as `15.14`.
    pub server_version: Option<String>,
    /// The database system identifier (from `initdb`): a new one means a new data directory.
    pub system_identifier: Option<String>,
    /// The version (`<uid>/<resourceVersion>`) of the password Secret whose password the
    /// database has: when the Secret changes, the password is set again.
    pub password_secret_version: Option<String>,
    /// Its PostgresBackups (base backups): the schedule's bookmark, the newest, how many are
    /// kept.
    #[serde(flatten)]
    pub backups: BackupsStatus,
    /// The last WAL segment archived, and when (as the server reports it): a lost volume
    /// keeps every transaction up to the end of this segment.
    pub last_archived_wal: Option<String>,
    pub last_archived_time: Option<Time>,
    /// The last WAL segment whose archiving failed, and when.
    pub last_failed_wal: Option<String>,
    pub last_failed_time: Option<Time>,
    /// The restore the data directory came from, if it was restored from a backup.
    pub restore: Option<RestoreStatus>,
    /// A restore under way: how far it has got.
    pub restoring: Option<crate::backup::WorkProgress>,
    /// Where a `bootstrap.fromBackup` restore reads from, as the backup's status said when the
    /// database was first seen (recorded once: the instance's pod is built from it).
    pub bootstrap_source: Option<BackupLocation>,
}

/// What an instance does.
#[derive(JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Takes writes; the replicas stream from it.
    Primary,
    /// A hot standby: streams the primary's WAL and answers reads.
    Replica,
}

/// One instance, as the operator last looked at it.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    /// Its pod.
    pub name: String,
    pub role: Role,
    pub node: Option<String>,
    /// Its pod is Ready (the server accepts connections).
    pub ready: bool,
    /// The timeline it is on.
    pub timeline: Option<i64>,
    /// The primary: its current WAL position. A replica: the last position it received.
    pub received_lsn: Option<String>,
    /// A replica: the last position it replayed (what reads on it see).
    pub replayed_lsn: Option<String>,
    /// A replica: the bytes of WAL the primary has written that it has not received yet.
    pub lag_bytes: Option<i64>,
    /// A replica: how far behind the primary its replay is, in milliseconds, as the primary
    /// measures it.
    pub lag_millis: Option<i64>,
    /// A replica: it streams from the primary now.
    pub streaming: Option<bool>,
    /// When this was looked at.
    pub observed_at: Option<Time>,
}

/// A failover or a switchover: the primary's lease handed over to a replica.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FailoverStatus {
    /// The old primary (lost, or stepped down), and the replica promoted.
    pub from: Option<String>,
    pub to: String,
    /// Why: the lease ran out, the primary gave it up, a switchover was asked for, or a
    /// rolling change ended with one.
    pub reason: String,
    /// A switchover (asked for with `noops.dev/promote`, or the last step of a rolling change):
    /// the old primary stopped cleanly and the replica had received all of its WAL before it
    /// was promoted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub switchover: bool,
    /// The last WAL position the promoted replica had received: with asynchronous
    /// replication, commits the old primary acknowledged after it are lost.
    pub received_lsn: Option<String>,
    /// When the operator last saw the old primary renew its lease (writes stopped at the
    /// latest then, plus its fence deadline), when it handed the lease over, and when it saw
    /// the new primary take writes.
    pub primary_last_seen: Option<Time>,
    pub handed_over_at: Time,
    pub promoted_at: Option<Time>,
    /// From the old primary last seen to the new one taking writes: the most writes waited.
    pub write_gap_millis: Option<i64>,
}

/// What a restore recovered.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RestoreStatus {
    /// The PostgresBackup whose base backup was restored.
    pub backup: String,
    /// The commit time of the last transaction replayed: every transaction committed up to it
    /// is in the database, none after it.
    pub recovered_to: Option<String>,
    /// The last WAL position replayed, and the timeline the database continued on.
    pub end_wal: Option<String>,
    pub timeline: Option<i64>,
    /// When the restore finished.
    pub completed_at: Option<String>,
}

/// Where a base backup is, and the WAL archived with it.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackupLocation {
    /// The bucket (or `volume`).
    pub s3: Option<S3Destination>,
    /// The volume (or `s3`).
    pub volume: Option<VolumeDestination>,
    /// The base backup's folder (key prefix) in it.
    pub base: String,
    /// The folder of the WAL archived from the backed-up database.
    pub wal: String,
}

fn default_version() -> String {
    "15".into()
}

fn default_instances() -> i32 {
    1
}

fn default_storage_size() -> String {
    "1Gi".into()
}

fn default_archive_timeout_seconds() -> i32 {
    5
}

crate::reason::reasons! {
    /// Why a PostgreSQL's condition is as it is (`status.conditions[].reason`; the CRD schema
    /// lists them).
    PostgreSQLReason {
        Asynchronous,
        Synchronous,
        AsExpected,
        PasswordSecretMissing,
        PasswordKeyMissing,
        Serving,
        PrimaryLost,
        NodeLost,
        InstancePodStuck,
        CreatingDatabase,
        ServiceMissing,
        Restoring,
        Initialising,
        Starting,
        Unreachable,
        NoReplicas,
        Streaming,
        ReplicasBehind,
        ArchiveFailing,
        RestoreFailed,
        Restored,
        NotRestored,
        NoDestination,
        WalArchived,
        NotYetArchived,
        BackupStored,
        BackupFailed,
        BackupClaimNotFound,
        BackupCredentialsInvalid,
        BackupCredentialsMissing,
        BootstrapBackupFailed,
        BootstrapBackupNotFound,
        BootstrapBackupNotReady,
        BootstrapBackupUnusable,
        InvalidSchedule,
        InvalidTargetTime,
        NoNodeFits,
        PasswordAmbiguous,
        PasswordInvalid,
        SpecRejected,
        TargetBeforeBackup,
        TooFewReplicas,
        WaitingForReplicas,
        BootstrapFailed,
        InstancesShareNode,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn the_original_manifest_gets_the_defaults() {
        let pg: PostgreSQL = serde_json::from_value(serde_json::json!({
            "apiVersion": "noops.dev/v1alpha1",
            "kind": "PostgreSQL",
            "metadata": { "name": "shop" },
            "spec": { "db": "shop", "user": "shop", "passwordSecret": "shop-db" },
        }))
        .unwrap();
        assert_eq!(pg.spec.version, "15");
        assert_eq!(pg.spec.storage.size, "1Gi");
        assert_eq!(pg.spec.service.type_, ServiceType::ClusterIP);
        assert!(pg.spec.resources.is_none());
        assert_eq!(pg.spec.instances, 1, "one instance, as the seed's manifest always had");
    }

    #[test]
    fn the_crd_carries_validation_and_printer_columns() {
        let crd = serde_json::to_string(&PostgreSQL::crd()).unwrap();
        for needle in [
            "\"shortNames\":[\"pg\"]",
            "db cannot be postgres",
            "user cannot be postgres",
            "spec.version cannot change once the database has run",
            "service.nodePort needs service.type: NodePort",
            "\"name\":\"Endpoint\"",
        ] {
            assert!(crd.contains(needle), "CRD lacks {needle}");
        }
    }
}
