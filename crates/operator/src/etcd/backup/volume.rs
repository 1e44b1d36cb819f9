//! Backups to a volume: the operator cannot mount a PersistentVolumeClaim itself (it may run
//! outside the cluster), so a short-lived pod of its own image mounts it and does the work:
//! `<backup>-save` streams a snapshot from a member into the volume, `<backup>-delete` deletes
//! it. Each reports through its termination message. Pure: the reconcile creates the pods and
//! reads how they ended.

use k8s_openapi::api::core::v1::{
    Container, Pod, PodSecurityContext, PodSpec, SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use noops_api::etcd::VolumeDestination;

use crate::core::backup::task_pod;
pub use crate::core::backup::task_pod::{Outcome, outcome};
use crate::core::images::Images;
use crate::core::labels;
use crate::etcd::names::Names;

use crate::core::backup::destination::claim_volume;
use crate::etcd::agent::save::Saved;
use crate::etcd::store::MOUNT;

/// Where the client certificate is mounted.
const TLS_MOUNT: &str = "/tls";
/// The component label of these pods: the controller watches them by it.
pub const COMPONENT: &str = "etcd-backup";

/// What a pod of a volume backup does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    Save,
    Delete,
}

impl Job {
    fn verb(self) -> &'static str {
        match self {
            Job::Save => "save",
            Job::Delete => "delete",
        }
    }
}

/// The pod name of `job` for backup `backup` (uid `uid`): `<backup>-save`, shortened with the
/// uid's start when the name is too long for a pod.
pub fn pod_name(backup: &str, uid: &str, job: Job) -> String {
    task_pod::name(backup, uid, job.verb())
}

/// The pod that saves a snapshot of the member at `endpoint` to `key` in the volume, within
/// `limit_seconds`; `images` gives its pull secrets.
#[allow(clippy::too_many_arguments)]
pub fn save_pod(
    name: &str,
    names: &Names,
    destination: &VolumeDestination,
    key: &str,
    endpoint: &str,
    limit_seconds: u64,
    image: &str,
    images: &Images,
    owner: &OwnerReference,
) -> Pod {
    let mut args = vec![
        "save-snapshot".to_string(),
        format!("--endpoint={endpoint}"),
        format!("--folder={MOUNT}"),
        format!("--key={key}"),
        format!("--limit-seconds={limit_seconds}"),
    ];
    let (volume, mount) = claim_volume(&destination.claim_name, "backup", MOUNT, false);
    let mut mounts = vec![mount];
    let mut volumes = vec![volume];
    if names.tls {
        args.push(format!("--tls-dir={TLS_MOUNT}"));
        args.push(format!("--server-name={}", names.tls_name()));
        mounts.push(VolumeMount {
            name: "tls".into(),
            mount_path: TLS_MOUNT.into(),
            read_only: Some(true),
            ..Default::default()
        });
        volumes.push(Volume {
            name: "tls".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(names.client_secret()),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let place = (names.namespace.as_str(), names.cluster.as_str());
    pod(name, place, Job::Save, args, mounts, volumes, image, images, owner)
}

/// The pod that deletes the snapshot at `key` in the volume; `place` is the namespace and the
/// cluster's name (the cluster may be gone).
pub fn delete_pod(
    name: &str,
    place: (&str, &str),
    destination: &VolumeDestination,
    key: &str,
    image: &str,
    images: &Images,
    owner: &OwnerReference,
) -> Pod {
    let args = vec![
        "delete-snapshot".to_string(),
        format!("--folder={MOUNT}"),
        format!("--key={key}"),
    ];
    let (volume, mount) = claim_volume(&destination.claim_name, "backup", MOUNT, false);
    pod(
        name,
        place,
        Job::Delete,
        args,
        vec![mount],
        vec![volume],
        image,
        images,
        owner,
    )
}

#[allow(clippy::too_many_arguments)]
fn pod(
    name: &str,
    (namespace, cluster): (&str, &str),
    job: Job,
    args: Vec<String>,
    mounts: Vec<VolumeMount>,
    volumes: Vec<Volume>,
    image: &str,
    images: &Images,
    owner: &OwnerReference,
) -> Pod {
    let owned = task_pod::Owned {
        name,
        namespace,
        labels: labels::child(cluster, "noops.dev/etcd-backup-job", job.verb(), Some(COMPONENT)),
        owner,
    };
    let spec = PodSpec {
        containers: vec![Container {
            name: job.verb().into(),
            image: Some(image.into()),
            args: Some(args),
            volume_mounts: Some(mounts),
            termination_message_policy: Some("File".into()),
            ..Default::default()
        }],
        volumes: Some(volumes),
        image_pull_secrets: images.image_pull_secrets(),
        // The operator's image runs as 65532: the volume's files are made its group's.
        security_context: Some(PodSecurityContext {
            fs_group: Some(OPERATOR_GROUP),
            ..Default::default()
        }),
        ..Default::default()
    };
    task_pod::build(owned, spec)
}

/// The group the operator's image runs as (`USER 65532:65532`).
const OPERATOR_GROUP: i64 = 65532;

/// What a save pod that succeeded says it saved.
pub fn saved(message: &str) -> Option<Saved> {
    serde_json::from_str(message).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::fixtures;

    fn destination() -> VolumeDestination {
        VolumeDestination {
            claim_name: "backups".into(),
            prefix: "etcd".into(),
            engine: std::marker::PhantomData,
        }
    }

    #[test]
    fn pod_names_fit_whatever_the_backup_name() {
        assert_eq!(pod_name("main-20261123", "0123456789", Job::Save), "main-20261123-save");
        let long = "b".repeat(253);
        let name = pod_name(&long, "0123456789", Job::Delete);
        assert!(name.len() <= 253, "{}", name.len());
        assert!(name.ends_with("-01234567-delete"), "{name}");
    }

    #[test]
    fn the_save_pod_mounts_the_claim_and_the_client_certificate() {
        let cluster = fixtures::cluster().build();
        let names = Names::of(&cluster);
        let pod = save_pod(
            "x-save",
            &names,
            &destination(),
            "etcd/main/x.db",
            "https://10.0.0.5:2379",
            590,
            "noops:test",
            &Images::default(),
            &fixtures::owner(),
        );
        let spec = pod.spec.unwrap();
        let container = &spec.containers[0];
        let args = container.args.clone().unwrap();
        for expected in [
            "save-snapshot",
            "--endpoint=https://10.0.0.5:2379",
            "--folder=/backup",
            "--key=etcd/main/x.db",
            "--limit-seconds=590",
            "--tls-dir=/tls",
        ] {
            assert!(args.contains(&expected.to_string()), "{expected} in {args:?}");
        }
        let volumes = spec.volumes.unwrap();
        assert_eq!(
            volumes[0].persistent_volume_claim.as_ref().unwrap().claim_name,
            "backups"
        );
        assert_eq!(
            volumes[1].secret.as_ref().unwrap().secret_name.as_deref(),
            Some("main-client")
        );
        assert_eq!(
            spec.restart_policy.as_deref(),
            Some("Never"),
            "a failed save is retried by the operator, with a fresh pod"
        );
        assert_eq!(pod.metadata.labels.unwrap()[labels::COMPONENT], COMPONENT);
    }

    fn finished(phase: &str, code: i32, message: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some("x-save".into());
        pod.status = Some(
            serde_json::from_value(serde_json::json!({
                "phase": phase,
                "containerStatuses": [{
                    "name": "save", "image": "noops", "imageID": "", "ready": false, "restartCount": 0,
                    "state": { "terminated": { "exitCode": code, "message": message } }
                }]
            }))
            .unwrap(),
        );
        pod
    }

    #[test]
    fn a_finished_pod_says_what_it_saved_or_why_it_failed() {
        let report = r#"{"size":20480,"sha256":"ab","revision":12,"version":"3.5.21","clusterId":"1f"}"#;
        let Outcome::Succeeded(message) = outcome(Some(&finished("Succeeded", 0, report)), jiff::Timestamp::UNIX_EPOCH)
        else {
            panic!("succeeded");
        };
        let saved = saved(&message).unwrap();
        assert_eq!((saved.size, saved.revision), (20480, 12));
        assert_eq!(saved.into_taken().unwrap().cluster_id, 0x1f);
        match outcome(
            Some(&finished("Failed", 1, "etcd: connection refused\n")),
            jiff::Timestamp::UNIX_EPOCH,
        ) {
            Outcome::Failed(m) => assert_eq!(m, "pod x-save exited with code 1: etcd: connection refused"),
            other => panic!("{other:?}"),
        }
        assert_eq!(outcome(None, jiff::Timestamp::UNIX_EPOCH), Outcome::NotStarted);
    }
}
