//! EtcdBackup: one snapshot of an etcd cluster in an object store, made on demand (apply one)
//! or by the cluster's backup schedule.

use kube::CustomResource;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::backup::BackupProgress;

/// One backup of an EtcdCluster.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "noops.dev",
    version = "v1alpha1",
    kind = "EtcdBackup",
    plural = "etcdbackups",
    shortname = "etcdbackup",
    category = "noops",
    namespaced,
    status = "EtcdBackupStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.cluster"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Revision","type":"integer","jsonPath":".status.revision"}"#,
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".status.size"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("self.cluster == oldSelf.cluster").message("an EtcdBackup's cluster cannot be changed: create another"))]
#[serde(rename_all = "camelCase")]
pub struct EtcdBackupSpec {
    /// The EtcdCluster (in the same namespace) to back up. Its `spec.backup.destination` says
    /// where the snapshot goes.
    #[schemars(length(min = 1, max = 63))]
    pub cluster: String,
    /// The operator changes nothing of the backup while true: one not begun is not begun, one
    /// running is neither recorded nor stopped, a deletion keeps its files (and the object)
    /// until set back to false; its status says Paused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// What happened to a backup.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBackupStatus {
    /// Phase, conditions, location, size, SHA-256 and times.
    #[serde(flatten)]
    pub progress: BackupProgress,
    /// The store it went to, as the cluster said when the backup began: deleting this
    /// EtcdBackup deletes the snapshot there, even once the cluster is gone.
    pub store: Option<crate::etcd::S3Destination>,
    /// The volume it went to (instead of `store`), as the cluster said when the backup began.
    pub volume: Option<crate::etcd::VolumeDestination>,
    /// The snapshot's key in the bucket, or its path in the volume.
    pub key: Option<String>,
    /// The etcd revision the snapshot holds.
    pub revision: Option<i64>,
    /// The etcd version of the member it was taken from.
    pub etcd_version: Option<String>,
    /// The cluster's ID, so that a restore can tell where the data came from.
    pub cluster_id: Option<String>,
}
