//! The pods of a PostgresBackup: `<backup>-base` takes the base backup (`pg_basebackup` from
//! the instance, streamed into the store), `<backup>-delete` deletes it with the WAL only it
//! needed. Both run the `postgres:<major>` image (its programs, as its `postgres` user, who
//! owns the files of a backup volume) with the instance manager copied in from the operator's
//! image, as the instance's pod does, and report through their termination message. Pure.

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, Pod, PodSecurityContext, PodSpec, SecretKeySelector, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::core::backup::task_pod;
use noops_api::postgres::BackupLocation;

use crate::core::images::Images;
use crate::core::labels;
use crate::postgres::image::{POSTGRES_UID, image, install_container};
use crate::postgres::names::{CONTROLLER_DIR, INSTANCE_MANAGER, Names};
use crate::postgres::store::{self, BaseBackupDestination, Destination, Role};

/// The component label of these pods: the controller watches them by it.
pub const COMPONENT: &str = "postgres-backup";
/// The label that says which job a pod does.
pub const JOB_LABEL: &str = "noops.dev/postgres-backup-job";

/// What a pod of a PostgresBackup does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    /// Take the base backup.
    Base,
    /// Delete it.
    Delete,
}

impl Job {
    pub fn verb(self) -> &'static str {
        match self {
            Job::Base => "base",
            Job::Delete => "delete",
        }
    }
}

/// The instance a base backup reads, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading<'a> {
    /// Its address.
    pub host: &'a str,
    /// A replica: where the primary is, whose archive the backup waits for.
    pub primary: Option<String>,
    /// The most it reads, in KiB per second.
    pub max_rate_kib: Option<i32>,
}

/// The pod that takes a base backup of the instance `from` reads into `location` (the
/// database's names in `names`, its major version `version`); `images` gives its pull secrets.
#[allow(clippy::too_many_arguments)]
pub fn base_pod(
    name: &str,
    backup: &str,
    names: &Names,
    version: &str,
    from: &Reading,
    location: &BackupLocation,
    operator_image: &str,
    images: &Images,
    owner: &OwnerReference,
) -> Option<Pod> {
    let mut args = vec![
        "base-backup".to_string(),
        format!("--host={}", from.host),
        format!("--label={backup}"),
        format!("--folder={}", location.base),
    ];
    args.extend(from.max_rate_kib.map(|kib| format!("--max-rate-kib={kib}")));
    if let Some(primary) = &from.primary {
        args.push(format!("--archived-by={primary}"));
        args.push(format!("--wal-folder={}", location.wal));
    }
    let password = EnvVar {
        name: "PGPASSWORD".into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: names.superuser_secret(),
                key: crate::postgres::secrets::PASSWORD.into(),
                optional: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let place = BackupOf {
        namespace: &names.namespace,
        postgresql: &names.name,
        repository: &names.image_repository,
        version,
    };
    pod(
        name,
        place,
        Job::Base,
        args,
        vec![password],
        location,
        operator_image,
        images,
        owner,
    )
}

/// The pod that deletes the backup at `location`, and the WAL before segment `keep_wal_from`.
pub fn delete_pod(
    name: &str,
    place: BackupOf,
    location: &BackupLocation,
    keep_wal_from: Option<&str>,
    operator_image: &str,
    images: &Images,
    owner: &OwnerReference,
) -> Option<Pod> {
    let mut args = vec!["remove-backup".to_string(), format!("--base={}", location.base)];
    if let Some(segment) = keep_wal_from {
        args.push(format!("--wal={}", location.wal));
        args.push(format!("--keep-wal-from={segment}"));
    }
    pod(
        name,
        place,
        Job::Delete,
        args,
        vec![],
        location,
        operator_image,
        images,
        owner,
    )
}

/// Where a backup's pods run: the namespace, the PostgreSQL (which may be gone) and the
/// major version whose programs they use.
#[derive(Debug, Clone, Copy)]
pub struct BackupOf<'a> {
    pub namespace: &'a str,
    pub postgresql: &'a str,
    /// Where PostgreSQL is pulled from.
    pub repository: &'a str,
    pub version: &'a str,
}

#[allow(clippy::too_many_arguments)]
fn pod(
    name: &str,
    place: BackupOf,
    job: Job,
    args: Vec<String>,
    mut env: Vec<EnvVar>,
    location: &BackupLocation,
    operator_image: &str,
    images: &Images,
    owner: &OwnerReference,
) -> Option<Pod> {
    let destination = Destination::of_location(location)?;
    let access = store::pod_access(&destination, Role::Own, false);
    env.extend(access.env);
    let controller = VolumeMount {
        name: "controller".into(),
        mount_path: CONTROLLER_DIR.into(),
        ..Default::default()
    };
    let mut mounts = vec![controller.clone()];
    mounts.extend(access.mounts);
    let mut volumes = vec![Volume {
        name: "controller".into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }];
    volumes.extend(access.volumes);
    let mut all_args = vec!["pg-instance".to_string()];
    all_args.extend(args);
    let labels = labels::child(place.postgresql, JOB_LABEL, job.verb(), Some(COMPONENT));
    let owned = task_pod::Owned {
        name,
        namespace: place.namespace,
        labels,
        owner,
    };
    let spec = PodSpec {
        init_containers: Some(vec![install_container(operator_image)]),
        containers: vec![Container {
            name: job.verb().into(),
            image: Some(image(place.repository, place.version)),
            command: Some(vec![INSTANCE_MANAGER.into()]),
            args: Some(all_args),
            env: Some(env),
            volume_mounts: Some(mounts),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            ..Default::default()
        }],
        volumes: Some(volumes),
        image_pull_secrets: images.image_pull_secrets(),
        security_context: Some(PodSecurityContext {
            run_as_user: Some(POSTGRES_UID),
            run_as_group: Some(POSTGRES_UID),
            fs_group: Some(POSTGRES_UID),
            run_as_non_root: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    Some(task_pod::build(owned, spec))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::fixtures::{backup, owner};

    fn location() -> BackupLocation {
        backup("shop-1", "shop", "Running", "7301", 100)
            .status
            .unwrap()
            .destination
            .unwrap()
    }

    #[test]
    fn the_base_pod_streams_from_the_instance_into_the_store_with_the_superusers_password() {
        let names = Names {
            name: "shop".into(),
            namespace: "prod".into(),
            image_repository: "postgres".into(),
        };
        let private = Images {
            pull_secrets: vec!["registry-creds".into()],
            ..Default::default()
        };
        let pod_reading = |from: &Reading| {
            base_pod(
                "shop-1-base",
                "shop-1",
                &names,
                "15",
                from,
                &location(),
                "noops:dev",
                &private,
                &owner(),
            )
            .unwrap()
        };
        let pod = pod_reading(&Reading {
            host: "10.0.0.7",
            primary: None,
            max_rate_kib: Some(4096),
        });
        let spec = pod.spec.unwrap();
        let container = &spec.containers[0];
        assert_eq!(container.image.as_deref(), Some("postgres:15"));
        let args = container.args.clone().unwrap();
        assert_eq!(
            args,
            [
                "pg-instance",
                "base-backup",
                "--host=10.0.0.7",
                "--label=shop-1",
                "--folder=postgres/prod/shop/base/shop-1",
                "--max-rate-kib=4096"
            ]
        );
        let env = container.env.clone().unwrap();
        let password = env.iter().find(|e| e.name == "PGPASSWORD").unwrap();
        assert_eq!(password.value, None, "never in the pod's spec");
        assert_eq!(
            password
                .value_from
                .as_ref()
                .unwrap()
                .secret_key_ref
                .as_ref()
                .unwrap()
                .name,
            "shop-superuser"
        );
        assert!(env.iter().any(|e| e.name == store::STORE_ENV));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(pod.metadata.labels.unwrap()[labels::COMPONENT], COMPONENT);
        assert_eq!(spec.image_pull_secrets, private.image_pull_secrets());
        let security = spec.security_context.unwrap();
        assert_eq!(security.run_as_user, Some(POSTGRES_UID));
        assert_eq!(security.seccomp_profile.unwrap().type_, "RuntimeDefault");

        // From a replica: it waits for the primary to archive the WAL the backup ends in.
        let pod = pod_reading(&Reading {
            host: "10.0.0.8",
            primary: Some("shop-rw.prod.svc".into()),
            max_rate_kib: None,
        });
        let args = pod.spec.unwrap().containers[0].args.clone().unwrap();
        assert_eq!(
            args[2..],
            [
                "--host=10.0.0.8",
                "--label=shop-1",
                "--folder=postgres/prod/shop/base/shop-1",
                "--archived-by=shop-rw.prod.svc",
                format!("--wal-folder={}", location().wal).as_str(),
            ]
        );
    }

    #[test]
    fn the_delete_pod_prunes_wal_only_when_told_where_the_kept_backups_start() {
        let place = BackupOf {
            namespace: "prod",
            postgresql: "shop",
            repository: "postgres",
            version: "15",
        };
        let args = |keep| {
            delete_pod(
                "x-delete",
                place,
                &location(),
                keep,
                "noops:dev",
                &Images::default(),
                &owner(),
            )
            .unwrap()
            .spec
            .unwrap()
            .containers[0]
                .args
                .clone()
                .unwrap()
        };
        assert_eq!(
            args(None),
            ["pg-instance", "remove-backup", "--base=postgres/prod/shop/base/shop-1"]
        );
        let pruning = args(Some("000000010000000000000007"));
        assert!(
            pruning.contains(&"--wal=postgres/prod/shop/wal/7301".to_string()),
            "{pruning:?}"
        );
        assert!(
            pruning.contains(&"--keep-wal-from=000000010000000000000007".to_string()),
            "{pruning:?}"
        );
    }
}
