//! The names of everything a PostgreSQL owns, its labels, and the paths inside its pod. One
//! place, so that the builders, the instance manager and the client agree.

use std::collections::BTreeMap;

use noops_api::PostgreSQL;

use crate::core::images::Images;
use crate::core::labels;

/// The label naming the PostgreSQL an object belongs to.
pub const POSTGRES_LABEL: &str = "noops.dev/postgres";
/// The port the instance serves on, in the pod and behind the Service.
pub const PORT: i32 = 5432;
/// The superuser the operator connects as (the role `initdb` makes).
pub const SUPERUSER: &str = "postgres";
/// Where the volume is mounted, and the data directory in it (as the official image has it).
pub const VOLUME_MOUNT: &str = "/var/lib/postgresql";
pub const PGDATA: &str = "/var/lib/postgresql/data";
/// The folder shared by the init container and PostgreSQL: the instance manager binary, the
/// Unix socket, the configuration the instance manager writes.
pub const CONTROLLER_DIR: &str = "/controller";
pub const INSTANCE_MANAGER: &str = "/controller/noops";
pub const SOCKET_DIR: &str = "/controller/run";
/// Where the superuser's password file is mounted.
pub const SUPERUSER_DIR: &str = "/etc/noops/superuser";
/// The name of the volume claim template: the claim of the instance is `data-<name>-0`.
pub const DATA_VOLUME: &str = "data";
/// What a restore recovered, beside the data directory in the volume (the operator reads it
/// through the server, `pg_read_file`): it goes with the volume, and a new restore replaces it.
pub const RESTORE_RECORD: &str = "/var/lib/postgresql/noops-restore.json";
/// The environment variable with the root folder of the database's backups in its store.
pub const ROOT_ENV: &str = "NOOPS_PG_ROOT";

/// The official image's repository (the local Kubernetes maps its majors to Debian's builds).
pub const POSTGRES_REPOSITORY: &str = "postgres";

/// Names derived from one PostgreSQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub name: String,
    pub namespace: String,
    /// Where PostgreSQL is pulled from (`core::images`): the image is `<this>:<version>`.
    pub image_repository: String,
}

impl Names {
    /// The names of `pg`, PostgreSQL pulled from Docker Hub.
    pub fn of(pg: &PostgreSQL) -> Self {
        Self::pulling_from(pg, &Images::default())
    }

    /// The names of `pg`, PostgreSQL pulled as `images` says.
    pub fn pulling_from(pg: &PostgreSQL, images: &Images) -> Self {
        Self {
            name: pg.metadata.name.clone().unwrap_or_default(),
            namespace: pg.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            image_repository: images.repository(POSTGRES_REPOSITORY, pg.spec.image_repository.as_deref()),
        }
    }

    /// The StatefulSet, and the Service clients use: `<name>`.
    pub fn statefulset(&self) -> String {
        self.name.clone()
    }

    pub fn service(&self) -> String {
        self.name.clone()
    }

    /// The instance's pod (the StatefulSet's only one).
    pub fn instance(&self) -> String {
        format!("{}-0", self.name)
    }

    /// The instance's volume claim, made by the StatefulSet from its template.
    pub fn data_claim(&self) -> String {
        format!("{DATA_VOLUME}-{}-0", self.name)
    }

    /// The Secret with the superuser's password, made once by the operator.
    pub fn superuser_secret(&self) -> String {
        format!("{}-superuser", self.name)
    }

    /// The ConfigMap that tells the instance what an empty data directory becomes.
    pub fn instance_config(&self) -> String {
        format!("{}-instance", self.name)
    }

    /// The Secret applications read to connect.
    pub fn connection_secret(&self) -> String {
        format!("{}-connection", self.name)
    }

    /// The Service's DNS name inside the cluster.
    pub fn host(&self) -> String {
        format!("{}.{}.svc", self.service(), self.namespace)
    }

    /// The labels of every child.
    pub fn labels(&self) -> BTreeMap<String, String> {
        labels::child(&self.name, POSTGRES_LABEL, &self.name, Some("postgresql"))
    }

    /// The labels that select the instance's pod.
    pub fn selector(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(POSTGRES_LABEL.to_string(), self.name.clone())])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_are_named_after_the_database() {
        let names = Names {
            name: "shop".into(),
            namespace: "prod".into(),
            image_repository: "postgres".into(),
        };
        assert_eq!(names.instance(), "shop-0");
        assert_eq!(names.data_claim(), "data-shop-0");
        assert_eq!(names.host(), "shop.prod.svc");
        assert_eq!(names.labels()[POSTGRES_LABEL], "shop");
        assert!(PGDATA.starts_with(VOLUME_MOUNT));
        assert!(INSTANCE_MANAGER.starts_with(CONTROLLER_DIR) && SOCKET_DIR.starts_with(CONTROLLER_DIR));
    }
}
