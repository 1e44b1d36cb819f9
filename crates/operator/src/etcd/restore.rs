//! A new cluster from a backup (`spec.bootstrap.fromBackup`): before the first member starts,
//! a restore pod prepares its volume in three steps, each safe to run again:
//! 1. `fetch` (the operator's image, `noops fetch-snapshot`) fetches the snapshot (from its
//!    bucket, or from the backup volume, mounted read-only) into a scratch emptyDir and checks
//!    it against the SHA-256 its EtcdBackup recorded;
//! 2. `restore` (the cluster's etcd image) runs etcd's own `etcdutl snapshot restore` into the
//!    scratch dir, as a one-member cluster whose token is this cluster's UID (a cluster ID of
//!    its own);
//! 3. `install` (`noops install-restored`) copies the restored data into the member's volume
//!    under a temporary name and renames it into place; data already there is left alone.
//!
//! So the member's volume holds either nothing or a whole restored data directory, the
//! snapshot never takes room on it, and a restore pod run again (evicted, or an operator
//! restarted between steps) does no harm. Pure: the reconcile creates the pod and reads how
//! it ended.

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext,
    PodSpec, SecretKeySelector, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use noops_api::EtcdCluster;
use noops_api::backup::BackupPhase;
use noops_api::etcd::EtcdClusterReason;
use noops_api::etcd_backup::{EtcdBackup, EtcdBackupStatus};

use super::names::Names;
use super::pod::{DATA_DIR, image, token};
use super::store::{self, Destination, SnapshotDestination};
use crate::core::apart::prefer_apart;
use crate::core::backup::destination::claim_volume;
use crate::core::images::Images;
use crate::core::pod_security::runtime_default_seccomp;
use crate::core::stuck::stuck;

/// The scratch space of a restore pod (an emptyDir): the snapshot and the restored data.
const SCRATCH: &str = "/restore";
const SNAPSHOT: &str = "/restore/snapshot.db";
const RESTORED: &str = "/restore/data";

/// How the restore stands, as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restore {
    /// The backup cannot be restored (yet): missing, not finished, or failed. Reason, message.
    Blocked {
        reason: EtcdClusterReason,
        message: String,
    },
    /// No restore pod yet.
    NotStarted,
    Running,
    /// The restore pod cannot start (a missing Secret key, an image that cannot be pulled):
    /// it carries on once that is fixed.
    Stuck {
        message: String,
    },
    Succeeded,
    /// The restore pod failed: the snapshot did not match, or etcdutl refused it.
    Failed {
        message: String,
    },
}

/// The restore pod of `member`'s name.
pub fn pod_name(member: &str) -> String {
    format!("{member}-restore")
}

/// The minor version of `3.5.21`: 5.
fn minor(version: &str) -> Option<u64> {
    version.split('.').nth(1)?.parse().ok()
}

/// Whether `backup` can be restored into a cluster of `version`, and if not, why.
pub fn usable(backup: Option<&EtcdBackup>, name: &str, version: &str) -> Result<(), Restore> {
    let Some(backup) = backup else {
        return Err(Restore::Blocked {
            reason: EtcdClusterReason::BackupNotFound,
            message: format!("EtcdBackup {name:?} (bootstrap.fromBackup) does not exist in this namespace"),
        });
    };
    let status = backup.status.clone().unwrap_or_default();
    if let (Some(taken), Some(want)) = (status.etcd_version.as_deref().and_then(minor), minor(version))
        && taken > want
    {
        return Err(Restore::Blocked {
            reason: EtcdClusterReason::RestoreWouldDowngrade,
            message: format!(
                "EtcdBackup {name:?} was taken from etcd {}; a {version} cluster cannot read it (etcd does not go back a minor version)",
                status.etcd_version.as_deref().unwrap_or_default()
            ),
        });
    }
    match status.progress.phase {
        Some(BackupPhase::Succeeded)
            if Destination::of_status(&status).is_some()
                && status.key.is_some()
                && status.progress.sha256.is_some() =>
        {
            Ok(())
        }
        Some(BackupPhase::Failed) => Err(Restore::Blocked {
            reason: EtcdClusterReason::BackupFailed,
            message: format!("EtcdBackup {name:?} failed: there is nothing to restore"),
        }),
        phase => Err(Restore::Blocked {
            reason: EtcdClusterReason::BackupNotReady,
            message: format!(
                "EtcdBackup {name:?} is {}: the cluster starts once it has succeeded",
                phase.map_or("not started", BackupPhase::as_str)
            ),
        }),
    }
}

/// How the restore stands, from the restore pod (if any).
pub fn state(pod: Option<&Pod>, now: jiff::Timestamp) -> Restore {
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
                .find(|c| {
                    c.state
                        .as_ref()
                        .and_then(|s| s.terminated.as_ref())
                        .is_some_and(|t| t.exit_code != 0)
                });
            let message = match failed {
                Some(c) => format!(
                    "restore pod {name}: {} exited with code {}; `kubectl logs {name} -c {}` says why",
                    c.name,
                    c.state
                        .as_ref()
                        .and_then(|s| s.terminated.as_ref())
                        .map_or(0, |t| t.exit_code),
                    c.name
                ),
                None => format!("restore pod {name} failed"),
            };
            Restore::Failed { message }
        }
        _ => match stuck([pod], now) {
            Some(stuck) => Restore::Stuck {
                message: format!("{}: {}", stuck.reason, stuck.message),
            },
            None => Restore::Running,
        },
    }
}

/// The container that fetches snapshot `key` (checked against `sha256`) from where backup
/// `status` went into the scratch volume, and the backup volume it mounts, for a volume.
fn fetch_container(
    status: &EtcdBackupStatus,
    key: &str,
    sha256: &str,
    noops_image: &str,
    scratch: &VolumeMount,
) -> Option<(Container, Option<Volume>)> {
    let mut fetch_args = vec!["fetch-snapshot".to_string()];
    let mut fetch_env = vec![];
    let mut fetch_mounts = vec![scratch.clone()];
    let mut backup_volume = None;
    match Destination::of_status(status)? {
        Destination::S3(store) => {
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
            fetch_args.extend([
                format!("--endpoint={}", store.endpoint),
                format!("--bucket={}", store.bucket),
                format!("--region={}", store.region),
            ]);
            fetch_env = vec![secret("AWS_ACCESS_KEY_ID"), secret("AWS_SECRET_ACCESS_KEY")];
        }
        Destination::Volume(destination) => {
            fetch_args.push(format!("--folder={}", store::MOUNT));
            let (volume, mount) = claim_volume(&destination.claim_name, "backup", store::MOUNT, true);
            fetch_mounts.push(mount);
            backup_volume = Some(volume);
        }
    }
    fetch_args.extend([
        format!("--key={key}"),
        format!("--sha256={sha256}"),
        format!("--out={SNAPSHOT}"),
    ]);
    let fetch = Container {
        name: "fetch".into(),
        image: Some(noops_image.into()),
        args: Some(fetch_args),
        env: (!fetch_env.is_empty()).then_some(fetch_env),
        volume_mounts: Some(fetch_mounts),
        ..Default::default()
    };
    Some((fetch, backup_volume))
}

/// The restore pod for `member`, restoring `backup` (which [`usable`] accepted) with the etcd
/// of `version`; `noops_image` is the operator's own image, `images` gives the pull secrets.
#[allow(clippy::too_many_arguments)]
pub fn restore_pod(
    cluster: &EtcdCluster,
    names: &Names,
    member: &str,
    version: &str,
    backup: &EtcdBackup,
    noops_image: &str,
    images: &Images,
    owner: &OwnerReference,
) -> Option<Pod> {
    let status = backup.status.as_ref()?;
    let (key, sha256) = (status.key.as_ref()?, status.progress.sha256.as_ref()?);
    let data = VolumeMount {
        name: "data".into(),
        mount_path: "/var/lib/etcd".into(),
        ..Default::default()
    };
    let scratch = VolumeMount {
        name: "scratch".into(),
        mount_path: SCRATCH.into(),
        ..Default::default()
    };
    let (fetch, backup_volume) = fetch_container(status, key, sha256, noops_image, &scratch)?;
    let peer_url = names.peer_url(member);
    let restore = Container {
        name: "restore".into(),
        image: Some(image(&names.image_repository, version)),
        command: Some(vec!["/usr/local/bin/etcdutl".into()]),
        args: Some(vec![
            "snapshot".into(),
            "restore".into(),
            SNAPSHOT.into(),
            format!("--name={member}"),
            format!("--initial-cluster={member}={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster-token={}", token(cluster, names)),
            format!("--data-dir={RESTORED}"),
        ]),
        volume_mounts: Some(vec![scratch.clone()]),
        ..Default::default()
    };
    let install = Container {
        name: "install".into(),
        image: Some(noops_image.into()),
        args: Some(vec![
            "install-restored".into(),
            format!("--from={RESTORED}"),
            format!("--to={DATA_DIR}"),
        ]),
        volume_mounts: Some(vec![scratch, data]),
        // As the member that will own the data: root, as etcd's image runs. The operator's image
        // runs as 65532, which can neither read what etcdutl restored (root, 0700) nor write a
        // volume owned by root (seen on real nodes: "reading /restore/data: Permission denied").
        security_context: Some(SecurityContext {
            run_as_user: Some(0),
            run_as_non_root: Some(false),
            allow_privilege_escalation: Some(false),
            ..Default::default()
        }),
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
            init_containers: Some(vec![fetch, restore]),
            containers: vec![install],
            volumes: Some(
                vec![
                    Volume {
                        name: "data".into(),
                        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                            claim_name: names.volume(member),
                            read_only: None,
                        }),
                        ..Default::default()
                    },
                    Volume {
                        name: "scratch".into(),
                        empty_dir: Some(EmptyDirVolumeSource::default()),
                        ..Default::default()
                    },
                ]
                .into_iter()
                .chain(backup_volume)
                .collect(),
            ),
            restart_policy: Some("Never".into()),
            enable_service_links: Some(false),
            // Where the restore pod runs, the volume is made: only where the member may run.
            affinity: Some(prefer_apart(cluster.spec.pod.affinity.clone(), names.selector())),
            tolerations: (!cluster.spec.pod.tolerations.is_empty()).then(|| cluster.spec.pod.tolerations.clone()),
            image_pull_secrets: images.image_pull_secrets(),
            security_context: Some(PodSecurityContext {
                seccomp_profile: runtime_default_seccomp(),
                ..Default::default()
            }),
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

    fn backup(phase: BackupPhase) -> EtcdBackup {
        let mut b = EtcdBackup::new(
            "nightly",
            EtcdBackupSpec {
                cluster: "old".into(),
                paused: false,
            },
        );
        b.status = Some(EtcdBackupStatus {
            progress: noops_api::backup::BackupProgress {
                phase: Some(phase),
                sha256: Some("ab".repeat(32)),
                ..Default::default()
            },
            store: Some(S3Destination {
                endpoint: "http://store.db.svc:7070".into(),
                bucket: "backups".into(),
                prefix: "etcd".into(),
                region: "us-east-1".into(),
                credentials_secret: "keys".into(),
                engine: std::marker::PhantomData,
            }),
            key: Some("etcd/db/old/nightly.db".into()),
            ..Default::default()
        });
        b
    }

    #[test]
    fn only_a_backup_that_succeeded_is_restored() {
        assert_eq!(
            usable(Some(&backup(BackupPhase::Succeeded)), "nightly", "3.5.21"),
            Ok(())
        );
        let reason = |r: Result<(), Restore>| match r {
            Err(Restore::Blocked { reason, .. }) => reason,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            reason(usable(None, "nightly", "3.5.21")),
            EtcdClusterReason::BackupNotFound
        );
        assert_eq!(
            reason(usable(Some(&backup(BackupPhase::Running)), "nightly", "3.5.21")),
            EtcdClusterReason::BackupNotReady
        );
        assert_eq!(
            reason(usable(Some(&backup(BackupPhase::Failed)), "nightly", "3.5.21")),
            EtcdClusterReason::BackupFailed
        );
        let mut newer = backup(BackupPhase::Succeeded);
        newer.status.as_mut().unwrap().etcd_version = Some("3.6.16".into());
        assert_eq!(
            reason(usable(Some(&newer), "nightly", "3.5.21")),
            EtcdClusterReason::RestoreWouldDowngrade
        );
        assert_eq!(usable(Some(&newer), "nightly", "3.6.0"), Ok(()));
    }

    #[test]
    fn the_restore_pod_fetches_checks_and_restores_into_the_members_volume() {
        let cluster = fixtures::cluster().build();
        let names = Names::of(&cluster);
        let pod = restore_pod(
            &cluster,
            &names,
            "main-0",
            "3.5.21",
            &backup(BackupPhase::Succeeded),
            "noops:test",
            &Images::default(),
            &fixtures::owner(),
        )
        .unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("main-0-restore"));
        let spec = pod.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let init = spec.init_containers.unwrap();
        let fetch_args = init[0].args.clone().unwrap();
        assert!(fetch_args.contains(&format!("--sha256={}", "ab".repeat(32))));
        assert!(fetch_args.contains(&"--key=etcd/db/old/nightly.db".to_string()));
        assert!(
            init[0]
                .volume_mounts
                .as_ref()
                .unwrap()
                .iter()
                .all(|m| m.name == "scratch"),
            "the snapshot never lands on the member's volume"
        );
        let restore = &init[1];
        assert_eq!(restore.image.as_deref(), Some("quay.io/coreos/etcd:v3.5.21"));
        let args = restore.args.clone().unwrap();
        for expected in [
            "--name=main-0",
            "--initial-cluster=main-0=https://main-0.main.db.svc:2380",
            "--initial-cluster-token=uid-1",
            "--data-dir=/restore/data",
        ] {
            assert!(args.contains(&expected.to_string()), "{expected} in {args:?}");
        }
        let install = spec.containers[0].args.clone().unwrap();
        assert_eq!(
            install,
            ["install-restored", "--from=/restore/data", "--to=/var/lib/etcd/data"]
        );
        let runs_as = spec.containers[0].security_context.as_ref().and_then(|c| c.run_as_user);
        assert_eq!(
            runs_as,
            Some(0),
            "install runs as the member (root), not as the operator's image user"
        );
        assert!(spec.affinity.is_some(), "the restore pod goes where the member may run");
        let volume = &spec.volumes.unwrap()[0];
        assert_eq!(
            volume.persistent_volume_claim.as_ref().unwrap().claim_name,
            "main-0-data"
        );
    }

    #[test]
    fn a_backup_in_a_volume_is_read_from_the_claim_mounted_read_only() {
        let cluster = fixtures::cluster().build();
        let names = Names::of(&cluster);
        let mut from_volume = backup(BackupPhase::Succeeded);
        let status = from_volume.status.as_mut().unwrap();
        status.store = None;
        status.volume = Some(noops_api::etcd::VolumeDestination {
            claim_name: "etcd-backups".into(),
            prefix: "etcd".into(),
            engine: std::marker::PhantomData,
        });
        status.key = Some("etcd/old/nightly.db".into());
        assert_eq!(usable(Some(&from_volume), "nightly", "3.5.21"), Ok(()));
        let pod = restore_pod(
            &cluster,
            &names,
            "main-0",
            "3.5.21",
            &from_volume,
            "noops:test",
            &Images::default(),
            &fixtures::owner(),
        )
        .unwrap();
        let spec = pod.spec.unwrap();
        let fetch = &spec.init_containers.unwrap()[0];
        let args = fetch.args.clone().unwrap();
        assert!(args.contains(&"--folder=/backup".to_string()), "{args:?}");
        assert!(args.contains(&"--key=etcd/old/nightly.db".to_string()), "{args:?}");
        assert!(fetch.env.is_none(), "no bucket keys");
        let claim = spec.volumes.unwrap().into_iter().find(|v| v.name == "backup").unwrap();
        let claim = claim.persistent_volume_claim.unwrap();
        assert_eq!(
            (claim.claim_name.as_str(), claim.read_only),
            ("etcd-backups", Some(true))
        );
    }

    #[test]
    fn a_failed_restore_says_which_container_failed() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("main-0-restore".into());
        pod.status = Some(
            serde_json::from_value(serde_json::json!({
                "phase": "Failed",
                "initContainerStatuses": [{
                    "name": "fetch", "image": "noops", "imageID": "", "ready": false, "restartCount": 0,
                    "state": { "terminated": { "exitCode": 1 } }
                }]
            }))
            .unwrap(),
        );
        match state(Some(&pod), jiff::Timestamp::UNIX_EPOCH) {
            Restore::Failed { message } => assert!(message.contains("fetch exited with code 1"), "{message}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(state(None, jiff::Timestamp::UNIX_EPOCH), Restore::NotStarted);
    }
}
