//! The StatefulSet that runs the instances: a pod and a volume each, `<name>-0` the primary of
//! a new database, the others its replicas (`instance/replica.rs`). Pure.
//!
//! The pod follows the layout of CloudNativePG's: an init container of the operator's image
//! copies the instance manager (`noops pg-instance`) into a folder shared with the PostgreSQL
//! containers, whose image (`postgres:<major>`) gives the server programs. A second init
//! container (`bootstrap`) makes the data directory if the volume has none: a new database, or
//! a restore from a backup, as the plan in the ConfigMap `<name>-instance` says; the pod shows
//! `Init` while it works and is not Ready, so nothing reaches it through the Service. The
//! PostgreSQL container writes the access rules and runs the server, archiving WAL to the
//! backup destination, and turns the pod's SIGTERM into a fast shutdown.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, ExecAction,
    ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, SecretVolumeSource, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use noops_api::PostgreSQL;
use noops_api::postgres::BackupLocation;

use super::image::{POSTGRES_UID, image, install_container};
use super::names::{
    CONTROLLER_DIR, DATA_VOLUME, INSTANCE_MANAGER, LEASE_ENV, Names, PGDATA, POD_NAME_ENV, POD_NAMESPACE_ENV, PORT,
    ROOT_ENV, SOCKET_DIR, SUPERUSER_DIR, VOLUME_MOUNT,
};
use super::restore::{PLAN_DIR, PLAN_FILE};
use super::store::{self, BaseBackupDestination, Destination, PodAccess, Role};
use crate::core::apart::prefer_apart;
use crate::core::images::Images;
use crate::core::pod_security::runtime_default_seccomp;

/// How long PostgreSQL has to shut down (fast: open transactions are rolled back) before it is
/// killed (and recovers from its WAL at the next start).
const SHUTDOWN_GRACE_SECONDS: i64 = 60;

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

/// How the pod reaches its backup stores: its own destination (WAL archiving) and, for a
/// `bootstrap.fromBackup`, where that backup is (`bootstrap_source`, as status recorded it).
pub fn store_access(pg: &PostgreSQL, names: &Names, bootstrap_source: Option<&BackupLocation>) -> PodAccess {
    let mut access = PodAccess::default();
    if let Some(spec) = &pg.spec.backup
        && let Some(own) = Destination::of_spec(spec)
    {
        access = access.and(store::pod_access(&own, Role::Own, false));
        access
            .env
            .push(env(ROOT_ENV, &own.folder(&names.namespace, &names.name)));
        access.env.push(env(
            "NOOPS_PG_ARCHIVE_TIMEOUT",
            &spec.archive_timeout_seconds.to_string(),
        ));
    }
    if let Some(source) = bootstrap_source.and_then(Destination::of_location) {
        access = access.and(store::pod_access(&source, Role::Source, true));
    }
    access
}

/// How many pods the StatefulSet keeps: the instances asked for, and never fewer than keep the
/// primary (`primary`: a StatefulSet shrinks from its last pod; the primary is not given up by
/// a scale-down).
pub fn pods_kept(pg: &PostgreSQL, names: &Names, primary: &str) -> i32 {
    pg.spec.instances.max(names.ordinal(primary).map_or(0, |o| o + 1))
}

/// The StatefulSet of `pg`, whose primary is pod `primary`. `operator_image` runs the init
/// container that installs the instance manager; `bootstrap_source` is where a
/// `bootstrap.fromBackup` backup is; `images` gives the pull secrets.
pub fn build(
    pg: &PostgreSQL,
    names: &Names,
    owner: &OwnerReference,
    operator_image: &str,
    bootstrap_source: Option<&BackupLocation>,
    primary: &str,
    images: &Images,
) -> StatefulSet {
    let labels = names.labels();
    let mut pod_labels: BTreeMap<String, String> = labels.clone();
    pod_labels.extend(names.selector());
    let access = store_access(pg, names, bootstrap_source);
    let (instance_env, instance_mounts) = instance_env_and_mounts(names, &access);
    // Makes the data directory if the volume has none (initdb, or a restore): while it works
    // the pod is not Ready, and its failure is the container's, with the reason.
    let bootstrap = Container {
        name: "bootstrap".into(),
        image: Some(image(&names.image_repository, &pg.spec.version)),
        command: Some(vec![INSTANCE_MANAGER.into(), "pg-instance".into(), "bootstrap".into()]),
        env: Some(instance_env.clone()),
        resources: pg.spec.resources.clone(),
        volume_mounts: Some(instance_mounts.clone()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    let postgres = Container {
        name: "postgres".into(),
        image: Some(image(&names.image_repository, &pg.spec.version)),
        command: Some(vec![INSTANCE_MANAGER.into(), "pg-instance".into(), "run".into()]),
        env: Some(instance_env),
        ports: Some(vec![ContainerPort {
            name: Some("postgres".into()),
            container_port: PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(readiness()),
        resources: pg.spec.resources.clone(),
        volume_mounts: Some(instance_mounts),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    let mut volumes = pod_volumes(names);
    volumes.extend(access.volumes);
    StatefulSet {
        metadata: ObjectMeta {
            name: Some(names.statefulset()),
            namespace: Some(names.namespace.clone()),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        spec: Some(StatefulSetSpec {
            replicas: Some(pods_kept(pg, names, primary)),
            service_name: Some(names.service()),
            selector: LabelSelector {
                match_labels: Some(names.selector()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    init_containers: Some(vec![install_container(operator_image), bootstrap]),
                    containers: vec![postgres],
                    volumes: Some(volumes),
                    // Instances apart (the status says when two share a node anyway).
                    affinity: Some(prefer_apart(None, names.selector())),
                    // The instances read and renew the primary's lease, nothing else.
                    service_account_name: Some(names.instance_account()),
                    automount_service_account_token: Some(true),
                    enable_service_links: Some(false),
                    termination_grace_period_seconds: Some(SHUTDOWN_GRACE_SECONDS),
                    image_pull_secrets: images.image_pull_secrets(),
                    security_context: Some(PodSecurityContext {
                        run_as_user: Some(POSTGRES_UID),
                        run_as_group: Some(POSTGRES_UID),
                        fs_group: Some(POSTGRES_UID),
                        run_as_non_root: Some(true),
                        seccomp_profile: runtime_default_seccomp(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            },
            // The operator restarts the pods for a new template itself, replicas first and the
            // primary after a switchover (`rollout.rs`): the StatefulSet's own rolling update
            // goes by ordinal and would restart the primary wherever it stands.
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("OnDelete".into()),
                rolling_update: None,
            }),
            volume_claim_templates: Some(vec![data_claim(pg, &labels)]),
            // The volumes go with the PostgreSQL (backups stay). A replica scaled away takes
            // its volume: scaled up again, it is copied anew from the primary rather than
            // resumed from a position the primary may no longer keep (its slot is dropped).
            persistent_volume_claim_retention_policy: Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
                when_deleted: Some("Delete".into()),
                when_scaled: Some("Delete".into()),
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// What the instance manager's containers (bootstrap, postgres) are given: where the data
/// directory, the socket, the password and the plan are, and how to reach the stores.
fn instance_env_and_mounts(names: &Names, access: &PodAccess) -> (Vec<EnvVar>, Vec<VolumeMount>) {
    let field = |name: &str, path: &str| EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut env_vars = vec![
        field(POD_NAME_ENV, "metadata.name"),
        field(POD_NAMESPACE_ENV, "metadata.namespace"),
        env(LEASE_ENV, &names.lease()),
        env("PGDATA", PGDATA),
        env("NOOPS_SOCKET_DIR", SOCKET_DIR),
        // `kubectl exec <pod> -- psql` finds the server's socket, not the image's default folder.
        env("PGHOST", SOCKET_DIR),
        env("NOOPS_SUPERUSER_PASSWORD_FILE", &format!("{SUPERUSER_DIR}/password")),
        env("NOOPS_PLAN_FILE", &format!("{PLAN_DIR}/{PLAN_FILE}")),
    ];
    env_vars.extend(access.env.iter().cloned());
    let mut mounts = vec![
        mount(DATA_VOLUME, VOLUME_MOUNT, false),
        mount("controller", CONTROLLER_DIR, false),
        mount("superuser", SUPERUSER_DIR, true),
        mount("plan", PLAN_DIR, true),
    ];
    mounts.extend(access.mounts.iter().cloned());
    (env_vars, mounts)
}

/// Ready: the server accepts connections.
fn readiness() -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec![
                "pg_isready".into(),
                "--quiet".into(),
                format!("--host={SOCKET_DIR}"),
                format!("--port={PORT}"),
            ]),
        }),
        period_seconds: Some(2),
        timeout_seconds: Some(5),
        failure_threshold: Some(3),
        ..Default::default()
    }
}

/// The instance's data volume, asked for by the StatefulSet.
fn data_claim(pg: &PostgreSQL, labels: &BTreeMap<String, String>) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(DATA_VOLUME.into()),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: pg.spec.storage.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(pg.spec.storage.size.clone()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// The pod's own volumes: where the instance manager is installed, the superuser's password,
/// the plan.
fn pod_volumes(names: &Names) -> Vec<Volume> {
    vec![
        Volume {
            name: "controller".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
        Volume {
            name: "superuser".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(names.superuser_secret()),
                default_mode: Some(0o440),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "plan".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: names.instance_config(),
                ..Default::default()
            }),
            ..Default::default()
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::fixtures::{owner, postgres};

    /// The StatefulSet of `pg` with `primary` as its primary, with the project's images.
    fn built(pg: &PostgreSQL, primary: &str) -> StatefulSet {
        build(
            pg,
            &Names::of(pg),
            &owner(),
            "noops:dev",
            None,
            primary,
            &Images::default(),
        )
    }

    #[test]
    fn postgres_comes_from_the_registry_or_the_databases_own_repository() {
        let mut pg = postgres("shop");
        let mirror = Images {
            registry: Some("mirror.example/m".into()),
            ..Default::default()
        };
        let images = |pg: &PostgreSQL| {
            let sts = build(
                pg,
                &Names::pulling_from(pg, &mirror),
                &owner(),
                "noops:dev",
                None,
                "shop-0",
                &mirror,
            );
            let pod = sts.spec.unwrap().template.spec.unwrap();
            let bootstrap = pod.init_containers.unwrap()[1].image.clone().unwrap();
            (bootstrap, pod.containers[0].image.clone().unwrap())
        };
        let mirrored = "mirror.example/m/library/postgres:15".to_string();
        assert_eq!(images(&pg), (mirrored.clone(), mirrored));
        pg.spec.image_repository = Some("own.example/pg".into());
        let own = "own.example/pg:15".to_string();
        assert_eq!(images(&pg), (own.clone(), own));
    }

    #[test]
    fn the_instance_runs_the_instance_manager_from_the_operator_image_on_its_own_volume() {
        let pg = postgres("shop");
        let names = Names::of(&pg);
        let sts = build(&pg, &names, &owner(), "noops:dev", None, "shop-0", &Images::default());
        let spec = sts.spec.unwrap();
        assert_eq!(spec.replicas, Some(1), "one instance unless asked");
        let pod = spec.template.spec.unwrap();
        let install = &pod.init_containers.unwrap()[0];
        assert_eq!(install.image.as_deref(), Some("noops:dev"));
        let postgres = &pod.containers[0];
        assert_eq!(postgres.image.as_deref(), Some("postgres:15"));
        assert_eq!(postgres.command.as_ref().unwrap()[0], INSTANCE_MANAGER);
        assert!(
            install
                .args
                .as_ref()
                .unwrap()
                .contains(&format!("--to={INSTANCE_MANAGER}"))
        );
        // The volume covers the official image's declared VOLUME exactly (a runtime would hide
        // the data below an anonymous volume otherwise), and `psql` in the container finds the
        // server without being told where.
        let mounts = postgres.volume_mounts.as_ref().unwrap();
        let data = mounts.iter().find(|m| m.name == DATA_VOLUME).unwrap();
        assert_eq!(data.mount_path, "/var/lib/postgresql/data");
        let env = postgres.env.as_ref().unwrap();
        let value = |name: &str| env.iter().find(|e| e.name == name).and_then(|e| e.value.clone());
        assert_eq!(value("PGDATA").as_deref(), Some("/var/lib/postgresql/data/data"));
        assert_eq!(value("PGHOST").as_deref(), Some(SOCKET_DIR));
        assert_eq!(pod.service_account_name.as_deref(), Some("shop-instance"));
        assert_eq!(pod.image_pull_secrets, None, "none configured: no empty field applied");
        let security = pod.security_context.as_ref().unwrap();
        assert_eq!(security.run_as_user, Some(POSTGRES_UID));
        assert_eq!(security.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
        let claim = &spec.volume_claim_templates.unwrap()[0];
        assert_eq!(claim.metadata.name.as_deref(), Some(DATA_VOLUME));
        let size = &claim
            .spec
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()["storage"];
        assert_eq!(size.0, "1Gi");
        let selector = spec.selector.match_labels.unwrap();
        let pod_labels = spec.template.metadata.unwrap().labels.unwrap();
        assert!(selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
    }

    #[test]
    fn instances_are_pods_of_the_statefulset_that_know_their_names_and_keep_apart() {
        let mut pg = postgres("shop");
        pg.spec.instances = 3;
        let sts = built(&pg, "shop-0");
        let spec = sts.spec.unwrap();
        assert_eq!(spec.replicas, Some(3));
        pg.spec.instances = 2;
        let keeps_its_primary = built(&pg, "shop-2");
        assert_eq!(
            keeps_its_primary.spec.unwrap().replicas,
            Some(3),
            "shop-2 is the primary"
        );
        let pod = spec.template.spec.unwrap();
        let env = pod.containers[0].env.clone().unwrap();
        let name = env.iter().find(|e| e.name == POD_NAME_ENV).unwrap();
        let field = name.value_from.clone().unwrap().field_ref.unwrap().field_path;
        assert_eq!(field, "metadata.name");
        let apart = pod.affinity.unwrap().pod_anti_affinity.unwrap();
        let term = &apart.preferred_during_scheduling_ignored_during_execution.unwrap()[0];
        assert_eq!(term.pod_affinity_term.topology_key, "kubernetes.io/hostname");
    }

    #[test]
    fn resources_go_to_the_postgres_container() {
        let mut pg = postgres("shop");
        pg.spec.resources = Some(serde_json::from_value(serde_json::json!({ "limits": { "memory": "1Gi" } })).unwrap());
        let sts = built(&pg, "shop-0");
        let pod = sts.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.containers[0].resources, pg.spec.resources);
    }

    #[test]
    fn with_backups_the_instance_archives_to_its_store_and_a_bootstrap_reads_the_source() {
        use crate::postgres::fixtures::with_backups;
        let pg = with_backups(postgres("shop"));
        let names = Names::of(&pg);
        let source = BackupLocation {
            volume: Some(noops_api::postgres::VolumeDestination {
                claim_name: "old-backups".into(),
                prefix: "postgres".into(),
                engine: std::marker::PhantomData,
            }),
            base: "postgres/old/base/old-1".into(),
            wal: "postgres/old/wal/1".into(),
            ..Default::default()
        };
        let sts = build(
            &pg,
            &names,
            &owner(),
            "noops:dev",
            Some(&source),
            "shop-0",
            &Images::default(),
        );
        let pod = sts.spec.unwrap().template.spec.unwrap();
        let inits = pod.init_containers.unwrap();
        assert_eq!(
            inits.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["install", "bootstrap"]
        );
        for container in [&inits[1], &pod.containers[0]] {
            let env: Vec<&str> = container
                .env
                .as_ref()
                .unwrap()
                .iter()
                .map(|e| e.name.as_str())
                .collect();
            for wanted in [
                store::STORE_ENV,
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
                ROOT_ENV,
                "NOOPS_PG_ARCHIVE_TIMEOUT",
                store::SOURCE_STORE_ENV,
                "NOOPS_PLAN_FILE",
            ] {
                assert!(env.contains(&wanted), "{} lacks {wanted}: {env:?}", container.name);
            }
            let mounts: Vec<&str> = container
                .volume_mounts
                .as_ref()
                .unwrap()
                .iter()
                .map(|m| m.mount_path.as_str())
                .collect();
            assert!(
                mounts.contains(&PLAN_DIR) && mounts.contains(&store::SOURCE_MOUNT),
                "{mounts:?}"
            );
        }
        let root = pod.containers[0]
            .env
            .as_ref()
            .unwrap()
            .iter()
            .find(|e| e.name == ROOT_ENV)
            .unwrap();
        assert_eq!(root.value.as_deref(), Some("postgres/prod/shop"));
        let volumes = pod.volumes.unwrap();
        assert!(
            volumes
                .iter()
                .any(|v| v.config_map.as_ref().is_some_and(|c| c.name == "shop-instance"))
        );
        let claim = volumes.iter().find_map(|v| v.persistent_volume_claim.as_ref()).unwrap();
        assert_eq!(
            (claim.claim_name.as_str(), claim.read_only),
            ("old-backups", Some(true))
        );

        let without = build(
            &postgres("shop"),
            &names,
            &owner(),
            "noops:dev",
            None,
            "shop-0",
            &Images::default(),
        );
        let env = without.spec.unwrap().template.spec.unwrap().containers[0]
            .env
            .clone()
            .unwrap();
        assert!(
            !env.iter().any(|e| e.name == store::STORE_ENV),
            "no destination, no archiving"
        );
    }
}
