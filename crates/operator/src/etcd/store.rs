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

use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, Secret, Service, Volume, VolumeMount};
use kube::{Api, Client};
use noops_api::etcd::{BackupSpec, S3Destination, VolumeDestination};
use noops_api::etcd_backup::EtcdBackupStatus;
use object_store::ObjectStore;

use crate::core::stores::bucket;

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
#[derive(Debug, Clone, PartialEq)]
pub enum Destination {
    S3(S3Destination),
    Volume(VolumeDestination),
}

impl Destination {
    /// Where the cluster's backups go now.
    pub fn of_spec(spec: &BackupSpec) -> Option<Self> {
        match (&spec.s3, &spec.volume) {
            (Some(s3), _) => Some(Self::S3(s3.clone())),
            (None, Some(volume)) => Some(Self::Volume(volume.clone())),
            (None, None) => None,
        }
    }

    /// Where a backup went, as its status recorded.
    pub fn of_status(status: &EtcdBackupStatus) -> Option<Self> {
        match (&status.store, &status.volume) {
            (Some(s3), _) => Some(Self::S3(s3.clone())),
            (None, Some(volume)) => Some(Self::Volume(volume.clone())),
            (None, None) => None,
        }
    }

    /// Records it in `status`.
    pub fn record(&self, status: &mut EtcdBackupStatus) {
        match self {
            Self::S3(s3) => status.store = Some(s3.clone()),
            Self::Volume(volume) => status.volume = Some(volume.clone()),
        }
    }

    /// The key (or path in the volume) of backup `backup` of `cluster` in `namespace`.
    pub fn key(&self, namespace: &str, cluster: &str, backup: &str) -> String {
        match self {
            Self::S3(s3) => key(s3, namespace, cluster, backup),
            // The claim is in the cluster's namespace already.
            Self::Volume(volume) => join(&volume.prefix, &format!("{cluster}/{backup}.db")),
        }
    }

    /// `s3://<bucket>/<key>` or `pvc://<claim>/<path>`, for status and Events.
    pub fn location(&self, key: &str) -> String {
        match self {
            Self::S3(s3) => location(s3, key),
            Self::Volume(volume) => format!("pvc://{}/{key}", volume.claim_name),
        }
    }
}

fn join(prefix: &str, rest: &str) -> String {
    let prefix = prefix.trim_matches('/');
    if prefix.is_empty() {
        rest.to_string()
    } else {
        format!("{prefix}/{rest}")
    }
}

/// The key of backup `backup` of `cluster` in `namespace`.
pub fn key(destination: &S3Destination, namespace: &str, cluster: &str, backup: &str) -> String {
    join(&destination.prefix, &format!("{namespace}/{cluster}/{backup}.db"))
}

/// `s3://<bucket>/<key>`, for status and Events.
pub fn location(destination: &S3Destination, key: &str) -> String {
    format!("s3://{}/{key}", destination.bucket)
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
    let found = api.get(&service).await.map_err(|source| StoreError::Service {
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
    let secret = secrets.get(name).await.map_err(|source| StoreError::Credentials {
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

/// The claim as a pod volume named `backup`.
pub fn claim_volume(destination: &VolumeDestination, read_only: bool) -> Volume {
    Volume {
        name: "backup".into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: destination.claim_name.clone(),
            read_only: read_only.then_some(true),
        }),
        ..Default::default()
    }
}

/// The mount of [`claim_volume`] at [`MOUNT`].
pub fn claim_mount(read_only: bool) -> VolumeMount {
    VolumeMount {
        name: "backup".into(),
        mount_path: MOUNT.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn destination(prefix: &str) -> S3Destination {
        S3Destination {
            endpoint: "http://versitygw.object-store.svc:7070".into(),
            bucket: "backups".into(),
            prefix: prefix.into(),
            region: "us-east-1".into(),
            credentials_secret: "keys".into(),
        }
    }

    #[test]
    fn keys_name_the_namespace_cluster_and_backup() {
        assert_eq!(
            key(&destination("etcd"), "db", "main", "main-1"),
            "etcd/db/main/main-1.db"
        );
        assert_eq!(key(&destination("/a/b/"), "db", "main", "x"), "a/b/db/main/x.db");
        assert_eq!(key(&destination(""), "db", "main", "x"), "db/main/x.db");
        assert_eq!(
            location(&destination("etcd"), "etcd/db/main/x.db"),
            "s3://backups/etcd/db/main/x.db"
        );
    }

    #[test]
    fn volume_paths_name_the_cluster_and_backup() {
        let volume = |prefix: &str| {
            Destination::Volume(VolumeDestination {
                claim_name: "backups".into(),
                prefix: prefix.into(),
            })
        };
        assert_eq!(volume("etcd").key("db", "main", "main-1"), "etcd/main/main-1.db");
        assert_eq!(volume("").key("db", "main", "x"), "main/x.db");
        assert_eq!(
            volume("etcd").location("etcd/main/x.db"),
            "pvc://backups/etcd/main/x.db"
        );
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
