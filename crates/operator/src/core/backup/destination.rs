//! Where an engine's backups go: a bucket or a volume, and the folder of one resource's
//! backups in it. Pure.
//!
//! One layout for every engine: a resource's backups are under `<prefix>/<namespace>/<name>/`
//! in a bucket, and under `<prefix>/<name>/` in a volume (a claim is in the resource's
//! namespace already). What an engine keeps in that folder is its own.

use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, Volume, VolumeMount};
use noops_api::backup::{BackupDestination, Engine, S3Destination, VolumeDestination};

/// Where a backup goes, or went.
#[derive(Debug, Clone, PartialEq)]
pub enum Destination<E: Engine> {
    S3(S3Destination<E>),
    Volume(VolumeDestination<E>),
}

impl<E: Engine> Destination<E> {
    /// The one a spec or a status names: a bucket before a volume (the schema allows only one).
    pub fn of(s3: Option<&S3Destination<E>>, volume: Option<&VolumeDestination<E>>) -> Option<Self> {
        match (s3, volume) {
            (Some(s3), _) => Some(Self::S3(s3.clone())),
            (None, Some(volume)) => Some(Self::Volume(volume.clone())),
            (None, None) => None,
        }
    }

    /// The one a spec chose.
    pub fn chosen(destination: &BackupDestination<E>) -> Option<Self> {
        Self::of(destination.s3.as_ref(), destination.volume.as_ref())
    }

    /// As the two optional fields a spec or a status records it in.
    pub fn into_fields(self) -> (Option<S3Destination<E>>, Option<VolumeDestination<E>>) {
        match self {
            Self::S3(s3) => (Some(s3), None),
            Self::Volume(volume) => (None, Some(volume)),
        }
    }

    /// The folder of the backups of resource `name` in `namespace`.
    pub fn folder(&self, namespace: &str, name: &str) -> String {
        match self {
            Self::S3(s3) => join(&s3.prefix, &format!("{namespace}/{name}")),
            Self::Volume(volume) => join(&volume.prefix, name),
        }
    }

    /// `s3://<bucket>/<key>` or `pvc://<claim>/<path>`, for status and Events.
    pub fn url(&self, key: &str) -> String {
        match self {
            Self::S3(s3) => format!("s3://{}/{key}", s3.bucket),
            Self::Volume(volume) => format!("pvc://{}/{key}", volume.claim_name),
        }
    }

    /// The claim, for a volume.
    pub fn claim(&self) -> Option<&str> {
        match self {
            Self::S3(_) => None,
            Self::Volume(volume) => Some(&volume.claim_name),
        }
    }

    /// The claim as a pod's volume `name`, mounted at `path`: for a volume destination.
    pub fn pod_volume(&self, name: &str, path: &str, read_only: bool) -> Option<(Volume, VolumeMount)> {
        Some(claim_volume(self.claim()?, name, path, read_only))
    }
}

/// Claim `claim` as a pod's volume `name`, mounted at `path`.
pub fn claim_volume(claim: &str, name: &str, path: &str, read_only: bool) -> (Volume, VolumeMount) {
    let volume = Volume {
        name: name.to_string(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.to_string(),
            read_only: read_only.then_some(true),
        }),
        ..Default::default()
    };
    let mount = VolumeMount {
        name: name.to_string(),
        mount_path: path.to_string(),
        read_only: read_only.then_some(true),
        ..Default::default()
    };
    (volume, mount)
}

/// `rest` under `prefix`, whatever slashes the prefix has around it.
fn join(prefix: &str, rest: &str) -> String {
    let prefix = prefix.trim_matches('/');
    if prefix.is_empty() {
        rest.to_string()
    } else {
        format!("{prefix}/{rest}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::marker::PhantomData;

    #[derive(Clone, Debug, PartialEq)]
    struct Test;
    impl Engine for Test {
        const DEFAULT_PREFIX: &'static str = "test";
        const DEFAULT_MAX_BACKUPS: i32 = 3;
    }

    fn s3(prefix: &str) -> Destination<Test> {
        Destination::S3(S3Destination {
            endpoint: "http://versitygw.store.svc:7070".into(),
            bucket: "backups".into(),
            prefix: prefix.into(),
            region: "us-east-1".into(),
            credentials_secret: "keys".into(),
            engine: PhantomData,
        })
    }

    fn volume(prefix: &str) -> Destination<Test> {
        Destination::Volume(VolumeDestination {
            claim_name: "backups".into(),
            prefix: prefix.into(),
            engine: PhantomData,
        })
    }

    #[test]
    fn a_resource_has_one_folder_named_by_namespace_in_a_bucket_and_by_name_in_a_volume() {
        assert_eq!(s3("etcd").folder("prod", "main"), "etcd/prod/main");
        assert_eq!(s3("/a/b/").folder("prod", "main"), "a/b/prod/main");
        assert_eq!(s3("").folder("prod", "main"), "prod/main");
        assert_eq!(volume("etcd").folder("prod", "main"), "etcd/main");
        assert_eq!(volume("").folder("prod", "main"), "main");
        assert_eq!(s3("p").url("p/x"), "s3://backups/p/x");
        assert_eq!(volume("p").url("p/x"), "pvc://backups/p/x");
    }

    #[test]
    fn a_destination_is_recorded_in_two_fields_and_read_back_from_them() {
        for destination in [s3("a"), volume("b")] {
            let (bucket, claim) = destination.clone().into_fields();
            assert_eq!(Destination::of(bucket.as_ref(), claim.as_ref()), Some(destination));
        }
        assert_eq!(Destination::<Test>::of(None, None), None);
    }

    #[test]
    fn only_a_volume_is_mounted() {
        assert_eq!(s3("a").pod_volume("backup", "/backup", false), None);
        let (pod_volume, mount) = volume("a").pod_volume("backup", "/backup", true).unwrap();
        let source = pod_volume.persistent_volume_claim.unwrap();
        assert_eq!((source.claim_name.as_str(), source.read_only), ("backups", Some(true)));
        assert_eq!((mount.mount_path.as_str(), mount.read_only), ("/backup", Some(true)));
    }
}
