//! Where a database's backups live, and how the pods that read and write them are told. Pure,
//! but for [`open`], which the pods run.
//!
//! One layout in a bucket and in a volume, under the database's root folder (`<prefix>/<namespace>/<name>`
//! in a bucket, `<prefix>/<name>` in a volume, which is the namespace's already):
//! - `base/<backup>/base.tar`: a base backup (pg_basebackup's tar, with `backup_label` and
//!   `backup_manifest`), and `base/<backup>/backup.json`, written last, which describes it;
//! - `wal/<system identifier>/<segment>.gz`: every WAL segment (and history file) the database
//!   archived, compressed. A database made anew (another system identifier) never mixes its
//!   WAL with the one before it.
//!
//! Pods are told a store in an environment variable holding [`StoreAccess`] as JSON; the keys
//! of a bucket come from the pod's environment (from the credentials Secret), never from the
//! operator's words.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, SecretKeySelector, Volume, VolumeMount};
use noops_api::postgres::{BackupLocation, BackupSpec, Postgres};
use object_store::ObjectStore;
use serde::{Deserialize, Serialize};

/// The variable that tells a pod the database's own store.
pub const STORE_ENV: &str = "NOOPS_PG_STORE";
/// The variable that tells a restore the store it reads from (the one a bootstrap backup is in).
pub const SOURCE_STORE_ENV: &str = "NOOPS_PG_SOURCE_STORE";
/// Where a backup volume is mounted, and a bootstrap backup's volume.
pub const BACKUP_MOUNT: &str = "/backup";
pub const SOURCE_MOUNT: &str = "/backup-source";
/// The base backup and its description, in a backup's folder.
pub const BASE_TAR: &str = "base.tar";
pub const RECORD: &str = "backup.json";
/// The suffix of archived WAL files (gzip).
pub const WAL_SUFFIX: &str = ".gz";

/// Where backups go.
pub type Destination = crate::core::backup::Destination<Postgres>;

/// PostgreSQL's words for a destination: where the spec and a backup's location keep it, and
/// the location of one base backup in it.
pub trait BaseBackupDestination: Sized {
    /// Where a database's backups go now.
    fn of_spec(spec: &BackupSpec) -> Option<Self>;
    /// Where a backup went, as its status recorded it.
    fn of_location(location: &BackupLocation) -> Option<Self>;
    /// The location of backup `backup` of a database whose folder is `root` and whose system
    /// identifier is `system_id`.
    fn location(&self, root: &str, backup: &str, system_id: &str) -> BackupLocation;
}

impl BaseBackupDestination for Destination {
    fn of_spec(spec: &BackupSpec) -> Option<Self> {
        Self::chosen(&spec.plan.destination)
    }

    fn of_location(location: &BackupLocation) -> Option<Self> {
        Self::of(location.s3.as_ref(), location.volume.as_ref())
    }

    fn location(&self, root: &str, backup: &str, system_id: &str) -> BackupLocation {
        let (s3, volume) = self.clone().into_fields();
        BackupLocation {
            s3,
            volume,
            base: base_folder(root, backup),
            wal: wal_folder(root, system_id),
        }
    }
}

/// The folder of base backup `backup`.
pub fn base_folder(root: &str, backup: &str) -> String {
    format!("{root}/base/{backup}")
}

/// The folder of the WAL of the database with system identifier `system_id`.
pub fn wal_folder(root: &str, system_id: &str) -> String {
    format!("{root}/wal/{system_id}")
}

/// A store as a pod is told it: no secrets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StoreAccess {
    /// A bucket, whose keys are in the pod's environment as `<keys>AWS_ACCESS_KEY_ID` and
    /// `<keys>AWS_SECRET_ACCESS_KEY`.
    #[serde(rename_all = "camelCase")]
    S3 {
        endpoint: String,
        bucket: String,
        region: String,
        keys: String,
    },
    /// A volume mounted at `path`.
    Folder { path: String },
}

/// What a pod needs to reach a store: its environment and, for a volume, the volume.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodAccess {
    pub env: Vec<EnvVar>,
    pub volumes: Vec<Volume>,
    pub mounts: Vec<VolumeMount>,
}

impl PodAccess {
    /// Adds another store's access.
    pub fn and(mut self, other: PodAccess) -> Self {
        self.env.extend(other.env);
        self.volumes.extend(other.volumes);
        self.mounts.extend(other.mounts);
        self
    }
}

/// Which of a pod's stores: the database's own (where it archives and backs up to) or the one
/// a bootstrap restore reads from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Own,
    Source,
}

impl Role {
    fn variable(self) -> &'static str {
        match self {
            Role::Own => STORE_ENV,
            Role::Source => SOURCE_STORE_ENV,
        }
    }

    fn keys(self) -> &'static str {
        match self {
            Role::Own => "",
            Role::Source => "NOOPS_SOURCE_",
        }
    }

    fn volume(self) -> (&'static str, &'static str) {
        match self {
            Role::Own => ("backup", BACKUP_MOUNT),
            Role::Source => ("backup-source", SOURCE_MOUNT),
        }
    }
}

/// How a pod reaches `destination` as its `role` store; `read_only` for a restore's source.
pub fn pod_access(destination: &Destination, role: Role, read_only: bool) -> PodAccess {
    // A bootstrap source is read once; its Secret gone later must not keep the pod from
    // starting.
    let optional = (role == Role::Source).then_some(true);
    let secret_env = |name: String, secret: &str, key: &str| EnvVar {
        name,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_string(),
                key: key.to_string(),
                optional,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let plain_env = |access: &StoreAccess| EnvVar {
        name: role.variable().to_string(),
        value: serde_json::to_string(access).ok(),
        ..Default::default()
    };
    match destination {
        Destination::S3(s3) => {
            let access = StoreAccess::S3 {
                endpoint: s3.endpoint.clone(),
                bucket: s3.bucket.clone(),
                region: s3.region.clone(),
                keys: role.keys().to_string(),
            };
            PodAccess {
                env: vec![
                    plain_env(&access),
                    secret_env(
                        format!("{}AWS_ACCESS_KEY_ID", role.keys()),
                        &s3.credentials_secret,
                        "AWS_ACCESS_KEY_ID",
                    ),
                    secret_env(
                        format!("{}AWS_SECRET_ACCESS_KEY", role.keys()),
                        &s3.credentials_secret,
                        "AWS_SECRET_ACCESS_KEY",
                    ),
                ],
                ..Default::default()
            }
        }
        Destination::Volume(_) => {
            let (name, path) = role.volume();
            let (volume, mount) = destination.pod_volume(name, path, read_only).into_iter().unzip();
            PodAccess {
                env: vec![plain_env(&StoreAccess::Folder { path: path.to_string() })],
                volumes: volume,
                mounts: mount,
            }
        }
    }
}

/// Why a store cannot be opened in a pod.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{0} is not set: the pod was not told where backups are")]
    NotTold(String),
    #[error("{variable} is not a store description: {source}")]
    Unreadable {
        variable: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{0} is not set: the credentials Secret has no such key")]
    NoKey(String),
    #[error("the store: {0}")]
    Store(#[from] object_store::Error),
}

/// Opens the store the pod's environment names under `variable` ([`STORE_ENV`] or
/// [`SOURCE_STORE_ENV`]), or `None` if it names none.
pub fn open_from_env(variable: &str) -> Result<Option<Arc<dyn ObjectStore>>, OpenError> {
    let Ok(text) = std::env::var(variable) else {
        return Ok(None);
    };
    let access: StoreAccess = serde_json::from_str(&text).map_err(|source| OpenError::Unreadable {
        variable: variable.to_string(),
        source,
    })?;
    open(&access).map(Some)
}

/// Opens a store as a pod is told it.
pub fn open(access: &StoreAccess) -> Result<Arc<dyn ObjectStore>, OpenError> {
    match access {
        StoreAccess::S3 {
            endpoint,
            bucket,
            region,
            keys,
        } => {
            let read = |name: &str| {
                let variable = format!("{keys}{name}");
                std::env::var(&variable).map_err(|_| OpenError::NoKey(variable))
            };
            let credentials = (read("AWS_ACCESS_KEY_ID")?, read("AWS_SECRET_ACCESS_KEY")?);
            Ok(crate::core::backup::stores::bucket(
                endpoint,
                region,
                bucket,
                &credentials,
            )?)
        }
        StoreAccess::Folder { path } => {
            std::fs::create_dir_all(path).map_err(|e| object_store::Error::Generic {
                store: "volume",
                source: Box::new(e),
            })?;
            Ok(crate::core::backup::stores::folder(std::path::Path::new(path))?)
        }
    }
}

/// Opens the store the environment names, or says it was not told one.
pub fn open_told(variable: &str) -> Result<Arc<dyn ObjectStore>, OpenError> {
    open_from_env(variable)?.ok_or_else(|| OpenError::NotTold(variable.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(prefix: &str) -> Destination {
        Destination::S3(noops_api::postgres::S3Destination {
            endpoint: "http://versitygw.store.svc:7070".into(),
            bucket: "backups".into(),
            prefix: prefix.into(),
            region: "us-east-1".into(),
            credentials_secret: "keys".into(),
            engine: std::marker::PhantomData,
        })
    }

    fn volume() -> Destination {
        Destination::Volume(noops_api::postgres::VolumeDestination {
            claim_name: "pg-backups".into(),
            prefix: "postgres".into(),
            engine: std::marker::PhantomData,
        })
    }

    #[test]
    fn a_database_has_one_root_with_its_base_backups_and_its_wal_by_system_identifier() {
        assert_eq!(s3("postgres").folder("prod", "shop"), "postgres/prod/shop");
        assert_eq!(s3("/a/b/").folder("prod", "shop"), "a/b/prod/shop");
        assert_eq!(s3("").folder("prod", "shop"), "prod/shop");
        assert_eq!(volume().folder("prod", "shop"), "postgres/shop");
        let location = s3("postgres").location("postgres/prod/shop", "shop-1", "7301");
        assert_eq!(location.base, "postgres/prod/shop/base/shop-1");
        assert_eq!(location.wal, "postgres/prod/shop/wal/7301");
        assert_eq!(Destination::of_location(&location), Some(s3("postgres")));
        assert_eq!(s3("p").url("p/x"), "s3://backups/p/x");
        assert_eq!(volume().url("postgres/shop"), "pvc://pg-backups/postgres/shop");
    }

    #[test]
    fn a_pod_gets_a_bucket_by_its_keys_from_the_secret_and_a_volume_by_mounting_it() {
        let access = pod_access(&s3("p"), Role::Source, true);
        let names: Vec<&str> = access.env.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                SOURCE_STORE_ENV,
                "NOOPS_SOURCE_AWS_ACCESS_KEY_ID",
                "NOOPS_SOURCE_AWS_SECRET_ACCESS_KEY"
            ]
        );
        let told: StoreAccess = serde_json::from_str(access.env[0].value.as_deref().unwrap()).unwrap();
        assert_eq!(
            told,
            StoreAccess::S3 {
                endpoint: "http://versitygw.store.svc:7070".into(),
                bucket: "backups".into(),
                region: "us-east-1".into(),
                keys: "NOOPS_SOURCE_".into()
            }
        );
        assert_eq!(
            access.env[1]
                .value_from
                .as_ref()
                .unwrap()
                .secret_key_ref
                .as_ref()
                .unwrap()
                .name,
            "keys"
        );
        assert!(access.volumes.is_empty());

        let access = pod_access(&volume(), Role::Own, false);
        assert_eq!(
            access.volumes[0].persistent_volume_claim.as_ref().unwrap().claim_name,
            "pg-backups"
        );
        assert_eq!(access.mounts[0].mount_path, BACKUP_MOUNT);
        let told: StoreAccess = serde_json::from_str(access.env[0].value.as_deref().unwrap()).unwrap();
        assert_eq!(
            told,
            StoreAccess::Folder {
                path: BACKUP_MOUNT.into()
            }
        );
    }
}
