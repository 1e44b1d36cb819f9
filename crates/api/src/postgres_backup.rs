//! PostgresBackup: one base backup of a PostgreSQL, taken on demand (apply one) or by the
//! database's backup schedule, into the database's backup destination. With the WAL archived
//! after it, it restores the database to any moment from its end on.

use kube::CustomResource;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::backup::BackupProgress;

/// One base backup of a PostgreSQL.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "noops.dev",
    version = "v1alpha1",
    kind = "PostgresBackup",
    plural = "postgresbackups",
    shortname = "pgbackup",
    category = "noops",
    namespaced,
    status = "PostgresBackupStatus",
    printcolumn = r#"{"name":"PostgreSQL","type":"string","jsonPath":".spec.postgresql"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".status.size"}"#,
    printcolumn = r#"{"name":"End WAL","type":"string","jsonPath":".status.endWal"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("self.postgresql == oldSelf.postgresql").message("a PostgresBackup's postgresql cannot be changed: create another"))]
#[serde(rename_all = "camelCase")]
pub struct PostgresBackupSpec {
    /// The PostgreSQL (in the same namespace) to back up. Its `spec.backup` says where the
    /// backup goes.
    #[schemars(length(min = 1, max = 63))]
    pub postgresql: String,
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
pub struct PostgresBackupStatus {
    /// Phase, conditions, location, size, SHA-256 and times. `completedAt` is when the base
    /// backup ended: a restore from it recovers to this moment or later.
    #[serde(flatten)]
    pub progress: BackupProgress,
    /// The store and folders it went to, as the database said when the backup began: a
    /// restore reads it from there, and deleting this PostgresBackup deletes it there, even
    /// once the PostgreSQL is gone.
    pub destination: Option<crate::postgres::BackupLocation>,
    /// The WAL positions the backup starts and ends at: a restore replays at least to the end
    /// one, and can stop at any later moment the archive holds.
    pub start_wal: Option<String>,
    pub end_wal: Option<String>,
    /// The timeline it was taken on.
    pub timeline: Option<i64>,
    /// The database system identifier it was taken from.
    pub system_identifier: Option<String>,
    /// The PostgreSQL major version of the server it was taken from.
    pub server_version: Option<String>,
    /// The pod that takes it.
    pub pod: Option<String>,
    /// The instance it reads (a replica with `backup.target: PreferStandby`).
    pub instance: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn the_crd_keeps_what_it_backs_up_and_has_columns() {
        let crd = serde_json::to_string(&PostgresBackup::crd()).unwrap();
        for needle in [
            "a PostgresBackup's postgresql cannot be changed",
            "\"shortNames\":[\"pgbackup\"]",
            "\"name\":\"End WAL\"",
        ] {
            assert!(crd.contains(needle), "CRD lacks {needle}");
        }
    }
}
