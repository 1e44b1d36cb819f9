//! Where snapshots go: an S3-compatible bucket, with the keys from a Secret, or a volume (a
//! PersistentVolumeClaim that pods of the operator's image mount: `backup/volume.rs` saves
//! and deletes through them, `restore.rs` fetches through one). Both the backup controller
//! and the cluster's restore read it.
//!
//! An http endpoint whose host is a Service of this cluster (`<service>.<namespace>.svc`, with
//! or without `.cluster.local`) is reached at that Service's ClusterIP, read through the API:
//! the same address cluster DNS gives, and one an operator running outside the cluster (`make
//! run`, the tests) can reach too. An https endpoint is used as written (its certificate names
//! the host).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Secret, Service};
use kube::{Api, Client};
use noops_api::etcd::{BackupSpec, Etcd, S3Destination};
use noops_api::etcd_backup::EtcdBackupStatus;
use object_store::ObjectStore;

use crate::core::backup::stores::bucket;

/// Where the backup volume is mounted in the pods that read or write it (save, delete, restore).
pub const MOUNT: &str = "/backup";
/// Why the store cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("Secret {secret:?} (backup.s3.credentialsSecret) cannot be read: {source}")]
    Credentials {
        secret: String,
        #[source]
        source: kube::Error,
    },
    #[error("Secret {secret:?} has no {key} key")]
    MissingKey { secret: String, key: &'static str },
    #[error("Service {service:?} of endpoint {endpoint} cannot be read: {source}")]
    Service {
        service: String,
        endpoint: String,
        #[source]
        source: kube::Error,
    },
    #[error("the object store: {0}")]
    Store(#[from] object_store::Error),
}

/// Where a backup goes, or went.
pub type Destination = crate::core::backup::Destination<Etcd>;

/// etcd's words for a destination: where the spec and a backup's status keep it, and the key
/// of a snapshot in it.
pub trait SnapshotDestination: Sized {
    /// Where the cluster's backups go now.
    fn of_spec(spec: &BackupSpec) -> Option<Self>;
    /// Where a backup went, as its status recorded.
    fn of_status(status: &EtcdBackupStatus) -> Option<Self>;
    /// Records it in `status`.
    fn record(&self, status: &mut EtcdBackupStatus);
    /// The key (or path in the volume) of backup `backup` of `cluster` in `namespace`.
    fn key(&self, namespace: &str, cluster: &str, backup: &str) -> String;
}

impl SnapshotDestination for Destination {
    fn of_spec(spec: &BackupSpec) -> Option<Self> {
        Self::chosen(&spec.destination)
    }

    fn of_status(status: &EtcdBackupStatus) -> Option<Self> {
        Self::of(status.store.as_ref(), status.volume.as_ref())
    }

    fn record(&self, status: &mut EtcdBackupStatus) {
        (status.store, status.volume) = self.clone().into_fields();
    }

    fn key(&self, namespace: &str, cluster: &str, backup: &str) -> String {
        format!("{}/{backup}.db", self.folder(namespace, cluster))
    }
}

/// The Service a URL's host names, as (service, namespace), if it names one.
pub fn service_of(endpoint: &str) -> Option<(String, String)> {
    let host = endpoint.split("://").nth(1)?.split(['/', ':']).next()?;
    let host = host.strip_suffix(".cluster.local").unwrap_or(host);
    let mut parts = host.strip_suffix(".svc")?.split('.');
    let (service, namespace) = (parts.next()?, parts.next()?);
    parts
        .next()
        .is_none()
        .then(|| (service.to_string(), namespace.to_string()))
}

/// `endpoint` with a Service host replaced by the Service's ClusterIP. Not for https: the
/// store's certificate names the host, not the address.
async fn resolve(client: &Client, endpoint: &str) -> Result<String, StoreError> {
    let Some((service, namespace)) = service_of(endpoint).filter(|_| endpoint.starts_with("http://")) else {
        return Ok(endpoint.to_string());
    };
    let api: Api<Service> = Api::namespaced(client.clone(), &namespace);
    let found = crate::core::confirm::read(&api, &service, "store-endpoint")
        .await
        .map_err(|source| StoreError::Service {
            service: format!("{namespace}/{service}"),
            endpoint: endpoint.to_string(),
            source,
        })?;
    let Some(ip) = found.spec.and_then(|s| s.cluster_ip).filter(|ip| ip != "None") else {
        return Ok(endpoint.to_string());
    };
    let (scheme, rest) = endpoint.split_once("://").unwrap_or(("http", endpoint));
    let (host_port, path) = rest.split_once('/').map_or((rest, ""), |(h, p)| (h, p));
    let port = host_port
        .rsplit_once(':')
        .map(|(_, p)| format!(":{p}"))
        .unwrap_or_default();
    let path = if path.is_empty() {
        String::new()
    } else {
        format!("/{path}")
    };
    Ok(format!("{scheme}://{ip}{port}{path}"))
}

/// Opens the bucket of `destination`, with the keys from its Secret in `namespace`.
pub async fn open(
    client: &Client,
    namespace: &str,
    destination: &S3Destination,
) -> Result<Arc<dyn ObjectStore>, StoreError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let name = &destination.credentials_secret;
    // (Users' Secrets are not watched: read when a store is opened.)
    let secret = crate::core::confirm::read(&secrets, name, "secret-content")
        .await
        .map_err(|source| StoreError::Credentials {
            secret: name.clone(),
            source,
        })?;
    let data = secret.data.unwrap_or_default();
    let read = |key: &'static str| {
        data.get(key)
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .map(|v| v.trim().to_string())
            .ok_or_else(|| StoreError::MissingKey {
                secret: name.clone(),
                key,
            })
    };
    let endpoint = resolve(client, &destination.endpoint).await?;
    let keys = (read("AWS_ACCESS_KEY_ID")?, read("AWS_SECRET_ACCESS_KEY")?);
    Ok(bucket(&endpoint, &destination.region, &destination.bucket, &keys)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(prefix: &str) -> Destination {
        Destination::S3(S3Destination {
            endpoint: "http://versitygw.object-store.svc:7070".into(),
            bucket: "backups".into(),
            prefix: prefix.into(),
            region: "us-east-1".into(),
            credentials_secret: "keys".into(),
            engine: std::marker::PhantomData,
        })
    }

    #[test]
    fn keys_name_the_namespace_cluster_and_backup_in_a_bucket_and_the_cluster_in_a_volume() {
        assert_eq!(bucket("etcd").key("db", "main", "main-1"), "etcd/db/main/main-1.db");
        assert_eq!(bucket("/a/b/").key("db", "main", "x"), "a/b/db/main/x.db");
        assert_eq!(bucket("").key("db", "main", "x"), "db/main/x.db");
        let volume = Destination::Volume(noops_api::etcd::VolumeDestination {
            claim_name: "backups".into(),
            prefix: "etcd".into(),
            engine: std::marker::PhantomData,
        });
        assert_eq!(volume.key("db", "main", "main-1"), "etcd/main/main-1.db");
    }

    #[test]
    fn service_hosts_are_recognised() {
        let s = |svc: &str, ns: &str| Some((svc.to_string(), ns.to_string()));
        assert_eq!(
            service_of("http://versitygw.object-store.svc:7070"),
            s("versitygw", "object-store")
        );
        assert_eq!(
            service_of("https://minio.storage.svc.cluster.local/"),
            s("minio", "storage")
        );
        assert_eq!(service_of("https://s3.amazonaws.com"), None);
        assert_eq!(service_of("http://10.96.0.5:7070"), None);
        assert_eq!(service_of("http://a.b.c.svc:1"), None);
    }
}
