//! The names of everything a PostgreSQL owns, its labels, and the paths inside its pod. One
//! place, so that the builders, the instance manager and the client agree.

use std::collections::BTreeMap;

use noops_api::PostgreSQL;

use crate::core::images::Images;
use crate::core::labels;

/// The label naming the PostgreSQL an object belongs to.
pub const POSTGRES_LABEL: &str = "noops.dev/postgres";
/// The label the operator keeps on each instance's pod: `primary`, `replica` (streaming and
/// within the lag bound: behind `<name>-ro`), or `replica-behind`.
pub const ROLE_LABEL: &str = "noops.dev/role";
/// The label the StatefulSet controller puts on each of its pods (its name): `<name>` and
/// `<name>-rw` select the primary by it, so they follow it without the operator once set.
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
/// The environment variables that tell the instance manager its pod's name and namespace,
/// and the name of the primary's lease.
pub const POD_NAME_ENV: &str = "NOOPS_POD_NAME";
pub const POD_NAMESPACE_ENV: &str = "NOOPS_POD_NAMESPACE";
pub const LEASE_ENV: &str = "NOOPS_PG_LEASE";
/// The port the instance serves on, in the pod and behind the Service.
pub const PORT: i32 = 5432;
/// The superuser the operator connects as (the role `initdb` makes).
pub const SUPERUSER: &str = "postgres";
/// Where the volume is mounted: the path the official image declares a `VOLUME` (a container
/// runtime puts an anonymous volume on a declared path that no mount covers exactly, which would
/// hide the data directory below it; seen on real nodes). The data directory is the volume's
/// `data` folder, as it always was (a volume made before keeps working).
pub const VOLUME_MOUNT: &str = "/var/lib/postgresql/data";
pub const PGDATA: &str = "/var/lib/postgresql/data/data";
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
pub const RESTORE_RECORD: &str = "/var/lib/postgresql/data/noops-restore.json";
/// The same record as the server reads it, relative to its data directory: the same file
/// whichever path the pod mounts the volume at (a pod made before the claim moved to the
/// image's `VOLUME` path reads it too, while an upgrade rolls the pods).
pub const RESTORE_RECORD_BESIDE_DATA: &str = "../noops-restore.json";
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

    /// The first instance's pod: the primary of a new database.
    pub fn instance(&self) -> String {
        self.instance_at(0)
    }

    /// The pod of the instance with ordinal `i`.
    pub fn instance_at(&self, i: i32) -> String {
        format!("{}-{i}", self.name)
    }

    /// The ordinal of instance pod `pod`, if it is one of this database's.
    pub fn ordinal(&self, pod: &str) -> Option<i32> {
        pod.strip_prefix(&self.name)?.strip_prefix('-')?.parse().ok()
    }

    /// The first instance's volume claim, made by the StatefulSet from its template.
    pub fn data_claim(&self) -> String {
        self.data_claim_of(&self.instance())
    }

    /// The volume claim of instance pod `pod`.
    pub fn data_claim_of(&self, pod: &str) -> String {
        format!("{DATA_VOLUME}-{pod}")
    }

    /// The Services: the primary (`-rw`), replicas within the lag bound (`-ro`), any Ready
    /// instance (`-r`).
    pub fn service_rw(&self) -> String {
        format!("{}-rw", self.name)
    }

    pub fn service_ro(&self) -> String {
        format!("{}-ro", self.name)
    }

    pub fn service_r(&self) -> String {
        format!("{}-r", self.name)
    }

    /// Where replicas reach the primary: the `-rw` Service, which follows it.
    pub fn primary_host(&self) -> String {
        format!("{}.{}.svc", self.service_rw(), self.namespace)
    }

    /// Where readers connect: the `-ro` Service.
    pub fn read_only_host(&self) -> String {
        format!("{}.{}.svc", self.service_ro(), self.namespace)
    }

    /// The primary's lease (`lease.rs`).
    pub fn lease(&self) -> String {
        format!("{}-primary", self.name)
    }

    /// The metadata of child `name`: in the database's namespace, with its labels, owned by it.
    pub fn child(
        &self,
        name: String,
        owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    ) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(self.labels()),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        }
    }

    /// The PodDisruptionBudgets of the primary's pod and of the replicas' (`drain.rs`).
    pub fn primary_budget(&self) -> String {
        format!("{}-primary", self.name)
    }

    pub fn replicas_budget(&self) -> String {
        format!("{}-replicas", self.name)
    }

    /// The service account of the instances, and its Role and RoleBinding: read and renew the
    /// primary's lease, nothing else.
    pub fn instance_account(&self) -> String {
        format!("{}-instance", self.name)
    }

    /// The physical replication slot the primary keeps for instance pod `pod`.
    pub fn slot_of(pod: &str) -> String {
        format!("noops_{}", pod.replace('-', "_"))
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
    use std::path::Path;

    #[test]
    fn children_are_named_after_the_database() {
        let names = Names {
            name: "shop".into(),
            namespace: "prod".into(),
            image_repository: "postgres".into(),
        };
        assert_eq!(names.instance(), "shop-0");
        assert_eq!(names.data_claim(), "data-shop-0");
        assert_eq!(names.data_claim_of("shop-2"), "data-shop-2");
        assert_eq!(names.ordinal("shop-2"), Some(2));
        assert_eq!(names.ordinal("shopping-2"), None);
        assert_eq!(Names::slot_of("shop-db-1"), "noops_shop_db_1");
        assert_eq!(names.primary_host(), "shop-rw.prod.svc");
        assert_eq!(names.host(), "shop.prod.svc");
        assert_eq!(names.labels()[POSTGRES_LABEL], "shop");
        assert_eq!(
            Path::new(PGDATA).parent(),
            Some(Path::new(VOLUME_MOUNT)),
            "the data directory is the volume's `data`"
        );
        assert_eq!(Path::new(RESTORE_RECORD).parent(), Some(Path::new(VOLUME_MOUNT)));
        // The server, from its data directory, reads the file the instance manager writes.
        let beside = RESTORE_RECORD_BESIDE_DATA.strip_prefix("../").unwrap_or_default();
        assert_eq!(
            Path::new(PGDATA).parent().map(|p| p.join(beside)),
            Some(RESTORE_RECORD.into())
        );
        assert!(INSTANCE_MANAGER.starts_with(CONTROLLER_DIR) && SOCKET_DIR.starts_with(CONTROLLER_DIR));
    }
}
