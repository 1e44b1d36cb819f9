//! A new cluster from a backup (`spec.bootstrap.fromBackup`): before the first member starts,
//! a restore pod on its volume fetches the snapshot, checks it against the SHA-256 its
//! EtcdBackup recorded (`noops fetch-snapshot`, the operator's own image), and restores it
//! with etcd's own `etcdutl snapshot restore` (the cluster's etcd image) into the member's
//! data directory, as a one-member cluster with a new cluster ID (the token is this cluster's
//! UID). The first member then starts on that data; the others join as learners as usual.
//! Pure: the reconcile creates the pod and reads how it ended.

use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, PersistentVolumeClaimVolumeSource, Pod, PodSpec, SecretKeySelector, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use noops_api::EtcdCluster;
use noops_api::etcd_backup::EtcdBackup;

use super::names::Names;
use super::pod::{DATA_DIR, image, token};

/// Where the snapshot is put in the member's volume.
const SNAPSHOT: &str = "/var/lib/etcd/restore/snapshot.db";

/// How the restore stands, as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restore {
    /// The backup cannot be restored (yet): missing, not finished, or failed. Reason, message.
    Blocked { reason: &'static str, message: String },
    /// No restore pod yet.
    NotStarted,
    Running,
    Succeeded,
    /// The restore pod failed: the snapshot did not match, or etcdutl refused it.
    Failed { message: String },
}

/// The restore pod of `member`'s name.
pub fn pod_name(member: &str) -> String {
    format!("{member}-restore")
}

/// Whether `backup` can be restored, and if not, why.
pub fn usable(backup: Option<&EtcdBackup>, name: &str) -> Result<(), Restore> {
    let Some(backup) = backup else {
        return Err(Restore::Blocked {
            reason: "BackupNotFound",
            message: format!("EtcdBackup {name:?} (bootstrap.fromBackup) does not exist in this namespace"),
        });
    };
    let status = backup.status.clone().unwrap_or_default();
    match status.phase.as_deref() {
        Some("Succeeded") if status.store.is_some() && status.key.is_some() && status.sha256.is_some() => Ok(()),
        Some("Failed") => Err(Restore::Blocked {
            reason: "BackupFailed",
            message: format!("EtcdBackup {name:?} failed: there is nothing to restore"),
        }),
        phase => Err(Restore::Blocked {
            reason: "BackupNotReady",
            message: format!(
                "EtcdBackup {name:?} is {}: the cluster starts once it has succeeded",
                phase.unwrap_or("not started")
            ),
        }),
    }
}

/// How the restore stands, from the restore pod (if any).
pub fn state(pod: Option<&Pod>) -> Restore {
    let Some(pod) = pod else { return Restore::NotStarted };
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Succeeded") => Restore::Succeeded,
        Some("Failed") => {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let status = pod.status.clone().unwrap_or_default();
            let failed = status
                .init_container_statuses
                .iter()
                .flatten()
                .chain(status.container_statuses.iter().flatten())
                .find(|c| c.state.as_ref().and_then(|s| s.terminated.as_ref()).is_some_and(|t| t.exit_code != 0));
            let message = match failed {
                Some(c) => format!(
                    "restore pod {name}: {} exited with code {}; `kubectl logs {name} -c {}` says why",
                    c.name,
                    c.state.as_ref().and_then(|s| s.terminated.as_ref()).map_or(0, |t| t.exit_code),
                    c.name
                ),
                None => format!("restore pod {name} failed"),
            };
            Restore::Failed { message }
        }
        _ => Restore::Running,
    }
}

/// The restore pod for `member`, restoring `backup` (which [`usable`] accepted) with the etcd
/// of `version`; `noops_image` is the operator's own image.
pub fn restore_pod(
    cluster: &EtcdCluster,
    names: &Names,
    member: &str,
    version: &str,
    backup: &EtcdBackup,
    noops_image: &str,
    owner: &OwnerReference,
) -> Option<Pod> {
    let status = backup.status.as_ref()?;
    let (store, key, sha256) = (status.store.as_ref()?, status.key.as_ref()?, status.sha256.as_ref()?);
    let mount = vec![VolumeMount {
        name: "data".into(),
        mount_path: "/var/lib/etcd".into(),
        ..Default::default()
    }];
    let secret = |key: &str| EnvVar {
        name: key.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: store.credentials_secret.clone(),
                key: key.into(),
                optional: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let fetch = Container {
        name: "fetch".into(),
        image: Some(noops_image.into()),
        args: Some(vec![
            "fetch-snapshot".into(),
            format!("--endpoint={}", store.endpoint),
            format!("--bucket={}", store.bucket),
            format!("--key={key}"),
            format!("--region={}", store.region),
            format!("--sha256={sha256}"),
            format!("--out={SNAPSHOT}"),
        ]),
        env: Some(vec![secret("AWS_ACCESS_KEY_ID"), secret("AWS_SECRET_ACCESS_KEY")]),
        volume_mounts: Some(mount.clone()),
        ..Default::default()
    };
    let peer_url = names.peer_url(member);
    let restore = Container {
        name: "restore".into(),
        image: Some(image(version)),
        command: Some(vec!["/usr/local/bin/etcdutl".into()]),
        args: Some(vec![
            "snapshot".into(),
            "restore".into(),
            SNAPSHOT.into(),
            format!("--name={member}"),
            format!("--initial-cluster={member}={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster-token={}", token(cluster, names)),
            format!("--data-dir={DATA_DIR}"),
        ]),
        volume_mounts: Some(mount),
        ..Default::default()
    };
    let mut labels = names.cluster_labels();
    labels.insert(crate::core::labels::COMPONENT.into(), "restore".into());
    Some(Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(member)),
            namespace: Some(names.namespace.clone()),
            labels: Some(labels),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            init_containers: Some(vec![fetch]),
            containers: vec![restore],
            volumes: Some(vec![Volume {
                name: "data".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: names.volume(member),
                    read_only: None,
                }),
                ..Default::default()
            }]),
            restart_policy: Some("Never".into()),
            enable_service_links: Some(false),
            tolerations: (!cluster.spec.pod.tolerations.is_empty()).then(|| cluster.spec.pod.tolerations.clone()),
            ..Default::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::fixtures;
    use noops_api::etcd::S3Destination;
    use noops_api::etcd_backup::{EtcdBackupSpec, EtcdBackupStatus};

    fn backup(phase: &str) -> EtcdBackup {
        let mut b = EtcdBackup::new("nightly", EtcdBackupSpec { cluster: "old".into() });
        b.status = Some(EtcdBackupStatus {
            phase: Some(phase.into()),
            store: Some(S3Destination {
                endpoint: "http://store.db.svc:7070".into(),
                bucket: "backups".into(),
                prefix: "etcd".into(),
                region: "us-east-1".into(),
                credentials_secret: "keys".into(),
            }),
            key: Some("etcd/db/old/nightly.db".into()),
            sha256: Some("ab".repeat(32)),
            ..Default::default()
        });
        b
    }

    #[test]
    fn only_a_backup_that_succeeded_is_restored() {
        assert_eq!(usable(Some(&backup("Succeeded")), "nightly"), Ok(()));
        let reason = |r: Result<(), Restore>| match r {
            Err(Restore::Blocked { reason, .. }) => reason,
            other => panic!("{other:?}"),
        };
        assert_eq!(reason(usable(None, "nightly")), "BackupNotFound");
        assert_eq!(reason(usable(Some(&backup("Running")), "nightly")), "BackupNotReady");
        assert_eq!(reason(usable(Some(&backup("Failed")), "nightly")), "BackupFailed");
    }

    #[test]
    fn the_restore_pod_fetches_checks_and_restores_into_the_members_volume() {
        let cluster = fixtures::cluster().build();
        let names = Names::of(&cluster);
        let pod = restore_pod(&cluster, &names, "main-0", "3.5.21", &backup("Succeeded"), "noops:test", &fixtures::owner()).unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("main-0-restore"));
        let spec = pod.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let fetch = &spec.init_containers.unwrap()[0];
        let fetch_args = fetch.args.clone().unwrap();
        assert!(fetch_args.contains(&format!("--sha256={}", "ab".repeat(32))));
        assert!(fetch_args.contains(&"--key=etcd/db/old/nightly.db".to_string()));
        let restore = &spec.containers[0];
        assert_eq!(restore.image.as_deref(), Some("quay.io/coreos/etcd:v3.5.21"));
        let args = restore.args.clone().unwrap();
        for expected in [
            "--name=main-0",
            "--initial-cluster=main-0=https://main-0.main.db.svc:2380",
            "--initial-cluster-token=uid-1",
            "--data-dir=/var/lib/etcd/data",
        ] {
            assert!(args.contains(&expected.to_string()), "{expected} in {args:?}");
        }
        let volume = &spec.volumes.unwrap()[0];
        assert_eq!(volume.persistent_volume_claim.as_ref().unwrap().claim_name, "main-0-data");
    }

    #[test]
    fn a_failed_restore_says_which_container_failed() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("main-0-restore".into());
        pod.status = Some(serde_json::from_value(serde_json::json!({
            "phase": "Failed",
            "initContainerStatuses": [{
                "name": "fetch", "image": "noops", "imageID": "", "ready": false, "restartCount": 0,
                "state": { "terminated": { "exitCode": 1 } }
            }]
        })).unwrap());
        match state(Some(&pod)) {
            Restore::Failed { message } => assert!(message.contains("fetch exited with code 1"), "{message}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(state(None), Restore::NotStarted);
    }
}
