//! EtcdCluster: an etcd cluster that the operator creates, scales, repairs and keeps safe.
//!
//! ```yaml
//! apiVersion: noops.dev/v1alpha1
//! kind: EtcdCluster
//! metadata: { name: main }
//! spec:
//!   replicas: 3
//!   version: 3.5.21
//! ```
//!
//! Each member is a Pod with a PersistentVolumeClaim of its own, reached by its stable name
//! `<member>.<cluster>.<namespace>.svc`. Members join as learners and are promoted once caught
//! up, one change at a time and only while the cluster is healthy; a dead member is removed
//! before its successor is added. TLS is on by default, with certificates from the operator's
//! own CA in Secrets. All progress of a membership change is in the status.

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::backup::BackupsStatus;

/// The desired state of an etcd cluster.
#[skip_serializing_none]
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "noops.dev",
    version = "v1alpha1",
    kind = "EtcdCluster",
    plural = "etcdclusters",
    shortname = "etcd",
    category = "noops",
    namespaced,
    status = "EtcdClusterStatus",
    validation = Rule::new("self.metadata.name.size() <= 40").message("an EtcdCluster name is at most 40 characters: member names and Services add to it"),
    validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("an EtcdCluster name must be a DNS label: lower-case letters, digits and '-', starting with a letter"),
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.ready"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.currentVersion"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Leader","type":"string","jsonPath":".status.leader"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("int(self.version.split('.')[1]) >= int(oldSelf.version.split('.')[1])").message("version: downgrades are refused; etcd cannot go back to an older minor version"))]
#[x_kube(validation = Rule::new("int(self.version.split('.')[1]) <= int(oldSelf.version.split('.')[1]) + 1").message("version: upgrade one minor version at a time (3.5 to 3.6), as etcd requires"))]
#[x_kube(validation = Rule::new("has(self.bootstrap) == has(oldSelf.bootstrap) && (!has(self.bootstrap) || self.bootstrap == oldSelf.bootstrap)").message("bootstrap is immutable: it says how the cluster started"))]
#[x_kube(validation = Rule::new("!has(self.bootstrap) || !has(self.bootstrap.fromBackup) || !self.storage.ephemeral").message("bootstrap.fromBackup needs persistent storage: the backup is restored into the first member's volume"))]
#[serde(rename_all = "camelCase")]
pub struct EtcdClusterSpec {
    /// How many voting members: 1, 3, 5 or 7. A cluster of n members keeps working with
    /// n/2 of them lost (rounded down).
    #[serde(default = "default_replicas")]
    #[x_kube(validation = Rule::new("self in [1, 3, 5, 7]").message("replicas must be 1, 3, 5 or 7: an odd number of members, since an even number tolerates no more lost members than the odd number below it"))]
    pub replicas: i32,
    /// The etcd version, such as `3.5.21` or `3.6.4`. Upgrades go one minor version at a time,
    /// one member at a time; downgrades are refused.
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^3\\\\.[56]\\\\.[0-9]+$')").message("version must be an etcd version this operator runs: 3.5.x or 3.6.x"))]
    pub version: String,
    /// The repository to pull etcd from, without a tag (the tag is `v<version>`), such as a
    /// mirror of `quay.io/coreos/etcd`. Default: that one, in the operator's
    /// `--image-registry` if it has one.
    #[schemars(length(max = 255))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$') && !self.matches(':[0-9]+$')").message("imageRepository must be an image repository without a tag, such as registry.example.com/etcd: the tag is the version"))]
    pub image_repository: Option<String>,
    /// Where members keep their data. Immutable.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("storage is immutable: create a new cluster (from a backup) to change it"))]
    pub storage: StorageSpec,
    /// TLS between members and for clients. Immutable.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("tls is immutable: create a new cluster (from a backup) to change it"))]
    pub tls: TlsSpec,
    /// Stop changing the cluster (no membership change, no repair) until set back to false.
    #[serde(default)]
    pub paused: bool,
    /// What every member pod gets.
    #[serde(default)]
    pub pod: PodSpec,
    /// Where backups go, and when the scheduled ones are made. Without it, EtcdBackups of this
    /// cluster fail (they have nowhere to go).
    pub backup: Option<BackupSpec>,
    /// How a new cluster starts: empty (the default), or from a backup. Immutable.
    pub bootstrap: Option<BootstrapSpec>,
    /// When members are defragmented (on by default).
    #[serde(default)]
    pub defragmentation: DefragmentationSpec,
}

/// Defragmentation: a member whose database file has grown far past what it holds (after
/// compactions and deletions) is defragmented, one member at a time, the leader last.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DefragmentationSpec {
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Defragment a member once this share of its database file is free space, in percent.
    #[serde(default = "default_fragmented_percent")]
    #[x_kube(validation = Rule::new("self >= 10 && self <= 90").message("defragmentation.fragmentedPercent must be between 10 and 90"))]
    pub fragmented_percent: i32,
    /// ... and once its database file is at least this large (a quantity such as 64Mi).
    #[serde(default = "default_min_database_size")]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+(Ki|Mi|Gi)?$')").message("defragmentation.minDatabaseSize must be a size such as 512Ki, 64Mi or 1Gi"))]
    pub min_database_size: String,
}

impl Default for DefragmentationSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            fragmented_percent: default_fragmented_percent(),
            min_database_size: default_min_database_size(),
        }
    }
}

/// How a new cluster starts.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapSpec {
    /// Start from this backup: its snapshot, checked against its SHA-256, is restored into
    /// the first member (a new cluster, with a cluster ID of its own); the others join it.
    pub from_backup: Option<BackupReference>,
}

/// An EtcdBackup in the cluster's namespace.
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackupReference {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Backups of a cluster: when scheduled ones are made, how many are kept, where they go.
pub type BackupSpec = crate::backup::BackupPlan<Etcd>;

pub use crate::backup::Etcd;

pub type S3Destination = crate::backup::S3Destination<Etcd>;
/// A claim snapshots are saved into, at `<prefix>/<cluster>/<backup>.db`, by a short-lived pod
/// of the operator's image.
pub type VolumeDestination = crate::backup::VolumeDestination<Etcd>;

/// Where members keep their data.
#[skip_serializing_none]
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// The size of each member's volume, such as `1Gi`.
    #[serde(default = "default_storage_size")]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+(\\\\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$')").message("storage.size must be a quantity such as 1Gi or 500Mi"))]
    pub size: String,
    /// The StorageClass of the volumes; the cluster's default if unset.
    #[schemars(length(max = 253))]
    pub storage_class_name: Option<String>,
    /// Keep data in the pod only (emptyDir): a member whose pod goes loses its data and is
    /// replaced. For tests and caches, not for data you keep.
    #[serde(default)]
    pub ephemeral: bool,
}

impl Default for StorageSpec {
    fn default() -> Self {
        Self {
            size: default_storage_size(),
            storage_class_name: None,
            ephemeral: false,
        }
    }
}

/// TLS between members and for clients.
#[skip_serializing_none]
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.secrets) || self.enabled").message("tls.secrets needs tls.enabled: true"))]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// Serve peers and clients over TLS (on by default), with certificates from the
    /// operator's own CA unless `secrets` names your own. The client certificate is in Secret
    /// `<cluster>-client` (or `secrets.client`).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Your own certificates instead of the operator's CA: it issues and renews nothing, and
    /// members read the Secrets again when you renew them.
    pub secrets: Option<TlsSecrets>,
}

impl Default for TlsSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            secrets: None,
        }
    }
}

/// Secrets in the cluster's namespace, each with `tls.crt`, `tls.key` and `ca.crt` (as
/// cert-manager makes them).
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TlsSecrets {
    /// Members to each other: valid for `*.<cluster>.<namespace>.svc` (a wildcard: a replaced
    /// member gets a new name), for server and client auth; its `ca.crt` is the CA members
    /// trust from each other.
    #[schemars(length(min = 1, max = 253))]
    pub peer: String,
    /// Members to clients: valid for `*.<cluster>.<namespace>.svc` and
    /// `<cluster>-client.<namespace>.svc`, issued by the CA in the client Secret's `ca.crt`;
    /// its own `ca.crt` is the CA client certificates must chain to.
    #[schemars(length(min = 1, max = 253))]
    pub server: String,
    /// A client certificate the operator (and the backup pods) use, issued by the server
    /// Secret's CA.
    #[schemars(length(min = 1, max = 253))]
    pub client: String,
}

/// What every member pod gets.
#[skip_serializing_none]
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    /// CPU and memory of the etcd container.
    pub resources: Option<ResourceRequirements>,
    /// Scheduling constraints, added to the operator's own spreading of members over nodes.
    pub affinity: Option<Affinity>,
    /// Taints the member pods tolerate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Extra etcd flags, such as `--quota-backend-bytes=4294967296`. Flags the operator sets
    /// (names, URLs, data dir, certificates, cluster state) are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 1024)))]
    #[x_kube(validation = Rule::new("self.all(a, a.startsWith('--'))").message("pod.extraArgs must be etcd flags such as --quota-backend-bytes=4294967296"))]
    pub extra_args: Vec<String>,
}

crate::phase::phases! {
    /// Where an etcd cluster is, in a word (`status.phase`).
    EtcdClusterPhase {
        /// Its first members are being made and the cluster formed.
        Creating,
        /// Every member is healthy and nothing is under way.
        Running,
        /// Members are being added or removed to the size asked for.
        Scaling,
        /// Members are being moved to the version asked for, one at a time.
        Upgrading,
        /// A member is being replaced or brought back.
        Repairing,
        /// A member is unhealthy and nothing can repair it yet.
        Degraded,
        /// Too few members are healthy to agree on a write: the cluster serves nothing until a
        /// majority is back or it is restored from a backup.
        QuorumLost,
        /// `spec.paused`: the operator changes nothing.
        Paused,
    }
}

/// The observed state of an etcd cluster.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EtcdClusterStatus {
    /// The generation of the spec this status describes.
    pub observed_generation: Option<i64>,
    /// Ready, Available, Progressing and Degraded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "EtcdClusterReason::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Where it is, in a word: Creating, Running, Scaling, Upgrading, Repairing, Degraded, QuorumLost, Paused.
    #[serde(default, deserialize_with = "crate::phase::known_or_none")]
    #[schemars(with = "Option<EtcdClusterPhase>")]
    pub phase: Option<EtcdClusterPhase>,
    /// Healthy voting members out of those asked for, as `3/3`.
    pub ready: Option<String>,
    /// Healthy voting members.
    #[serde(default)]
    pub ready_members: i32,
    /// Every member etcd knows, as last seen.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberStatus>,
    /// The member that leads.
    pub leader: Option<String>,
    /// The version the members run (the lowest, during an upgrade).
    pub current_version: Option<String>,
    /// The etcd cluster ID (hex), set once it is bootstrapped: from then on the operator never
    /// bootstraps again, whatever it finds.
    pub cluster_id: Option<String>,
    /// Where clients connect.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<String>,
    /// The Secret with the client certificate, key and CA (`tls.crt`, `tls.key`, `ca.crt`).
    pub client_secret: Option<String>,
    /// The membership change in progress: a restarted operator finishes it from here.
    pub operation: Option<Operation>,
    /// The index the next new member's name gets (`<cluster>-<index>`); names are never
    /// reused, so a member's old volume is never taken for a new member's.
    #[serde(default)]
    pub next_member_index: i64,
    /// Its EtcdBackups: the schedule's bookmark, the newest, how many are kept.
    #[serde(flatten)]
    pub backups: BackupsStatus,
    /// The EtcdBackup the cluster was started from (`bootstrap.fromBackup`, or the backup a
    /// recovery from quorum loss was asked to use).
    pub restored_from: Option<String>,
    /// A version whose image could not be pulled when a member was upgraded to it: the member
    /// went back to the version it ran, and the version is refused while `spec.version` names
    /// it.
    pub unavailable_version: Option<String>,
    /// The repository the members run etcd from, recorded whenever each runs the image asked
    /// for: where a member goes back to if a new repository has no image for it.
    pub image_repository: Option<String>,
    /// A repository whose image could not be pulled when a member was moved to it: the member
    /// went back to `imageRepository`, and this one is refused while it is the one asked for
    /// (by `spec.imageRepository` or the operator's registry).
    pub unavailable_repository: Option<String>,
}

/// One member, as last seen.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    /// The member's name, also its pod's.
    pub name: String,
    /// The etcd member ID (hex).
    pub id: Option<String>,
    /// The etcd version it runs (while it does not answer, the last it said: a member whose
    /// pod is made again starts on it).
    pub version: Option<String>,
    /// It answered, and is part of a cluster with a leader.
    #[serde(default)]
    pub healthy: bool,
    /// A learner: it receives the log but does not vote yet.
    #[serde(default)]
    pub learner: bool,
    /// It leads.
    #[serde(default)]
    pub leader: bool,
    /// The node its pod runs on.
    pub node: Option<String>,
    /// Since when it has not been healthy (a member unhealthy for too long is replaced).
    pub unhealthy_since: Option<Time>,
    /// Its database file's size, and how much of it is in use (bytes, rounded up to the MiB
    /// so that the status does not change with every write).
    pub db_size: Option<i64>,
    pub db_size_in_use: Option<i64>,
    /// When it was last defragmented.
    pub defragmented_at: Option<Time>,
}

/// A change in progress (membership or version).
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    pub kind: OperationKind,
    /// The member it is about.
    pub member: String,
    /// The member's etcd ID (hex), once etcd has given it one.
    pub member_id: Option<String>,
    /// Why (scale up, a dead member's replacement, ...).
    pub reason: String,
    /// The version the member moves to (upgrades).
    pub version: Option<String>,
    /// The node the member is made on: a member added to spread the members over nodes
    /// again, before one on a crowded node goes.
    pub node: Option<String>,
    /// When it started.
    pub started_at: Time,
}

/// The kinds of change, one member at a time.
#[derive(JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperationKind {
    /// The first member is starting a new cluster.
    Bootstrap,
    /// A member is being added: as a learner first, promoted once caught up.
    AddMember,
    /// A member is being removed from etcd, then its pod and volume.
    RemoveMember,
    /// A member is restarted on another version, on its own volume, as itself (leadership
    /// moved away first if it leads).
    Upgrade,
}

fn default_replicas() -> i32 {
    3
}

fn default_fragmented_percent() -> i32 {
    50
}

fn default_min_database_size() -> String {
    "64Mi".into()
}

fn default_storage_size() -> String {
    "1Gi".into()
}

fn default_true() -> bool {
    true
}

crate::reason::reasons! {
    /// Why an EtcdCluster's condition is as it is (`status.conditions[].reason`; the CRD schema
    /// lists them).
    EtcdClusterReason {
        Upgrading,
        PodsNotReady,
        MembersHealthy,
        QuorumLost,
        Bootstrapping,
        MembershipChanging,
        MembersUnhealthy,
        QuorumHealthy,
        Stable,
        AsExpected,
        BackupFailed,
        BackupNotFound,
        BackupNotReady,
        DowngradeRefused,
        ForbiddenFlags,
        ImageRepositoryUnavailable,
        InvalidSchedule,
        RestoreFailed,
        RestorePodStuck,
        RestoreWouldDowngrade,
        SkippedMinorVersion,
        TlsSecretInvalid,
        TlsSecretMissing,
        UpgradeNeedsNewerPatch,
        UpgradeNeedsPersistentStorage,
        VersionUnavailable,
        MemberPodStuck,
        MembersShareNode,
        RestartingMembers,
        AddingMember,
        RemovingMember,
        UpgradingMember,
        BackupStored,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn a_short_manifest_gets_the_defaults() {
        let cluster: EtcdCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "noops.dev/v1alpha1",
            "kind": "EtcdCluster",
            "metadata": { "name": "main" },
            "spec": { "version": "3.5.21" },
        }))
        .unwrap();
        assert_eq!(cluster.spec.replicas, 3);
        assert_eq!(cluster.spec.storage.size, "1Gi");
        assert!(!cluster.spec.storage.ephemeral);
        assert!(cluster.spec.tls.enabled);
        assert!(!cluster.spec.paused);
    }

    #[test]
    fn the_crd_carries_validation_and_printer_columns() {
        let crd = serde_json::to_string(&EtcdCluster::crd()).unwrap();
        for needle in [
            "replicas must be 1, 3, 5 or 7",
            "downgrades are refused",
            "one minor version at a time",
            "storage is immutable",
            "\"name\":\"Leader\"",
            "\"shortNames\":[\"etcd\"]",
        ] {
            assert!(crd.contains(needle), "CRD lacks {needle}");
        }
    }
}
