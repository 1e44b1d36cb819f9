//! A member's pod. Pure.
//!
//! Its hostname and subdomain give it the stable name `<member>.<cluster>.<ns>.svc` through the
//! headless Service; its data is on its own volume; its initial cluster state comes from the
//! state ConfigMap (see `bootstrap.rs`); members spread over nodes when they can.

use k8s_openapi::api::core::v1::{
    Affinity, ConfigMapKeySelector, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, NodeAffinity,
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolumeClaimVolumeSource, Pod,
    PodSecurityContext, PodSpec, Probe, SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use noops_api::EtcdCluster;

use super::bootstrap::STATE_KEY;
use super::names::{CLIENT_PORT, METRICS_PORT, Names, PEER_PORT};
use crate::core::apart::prefer_apart;
use crate::core::images::Images;
use crate::core::pod_security::runtime_default_seccomp;

/// Where a member keeps its data, inside its volume.
pub const DATA_DIR: &str = "/var/lib/etcd/data";
const PEER_TLS_DIR: &str = "/etc/etcd/peer";
const SERVER_TLS_DIR: &str = "/etc/etcd/server";

/// Flags the operator sets itself; `pod.extraArgs` may not set them.
pub const OWN_FLAGS: [&str; 18] = [
    "--name",
    "--data-dir",
    "--wal-dir",
    "--listen-peer-urls",
    "--listen-client-urls",
    "--advertise-client-urls",
    "--initial-advertise-peer-urls",
    "--initial-cluster",
    "--initial-cluster-state",
    "--initial-cluster-token",
    "--listen-metrics-urls",
    "--cert-file",
    "--key-file",
    "--trusted-ca-file",
    "--client-cert-auth",
    "--peer-cert-file",
    "--peer-key-file",
    "--peer-trusted-ca-file",
];

/// The image of an etcd version in `repository` (the etcd project's tags: `v<version>`).
pub fn image(repository: &str, version: &str) -> String {
    format!("{repository}:v{version}")
}

/// `pod.extraArgs` that set a flag the operator owns.
pub fn forbidden_extra_args(cluster: &EtcdCluster) -> Vec<String> {
    cluster
        .spec
        .pod
        .extra_args
        .iter()
        .filter(|a| {
            let flag = a.split('=').next().unwrap_or_default();
            OWN_FLAGS.contains(&flag) || flag == "--peer-client-cert-auth"
        })
        .cloned()
        .collect()
}

/// The flags, mounts and volumes of a member's TLS: its serving and peer certificates.
fn tls(names: &Names) -> (Vec<String>, Vec<VolumeMount>, Vec<Volume>) {
    let args = vec![
        format!("--cert-file={SERVER_TLS_DIR}/tls.crt"),
        format!("--key-file={SERVER_TLS_DIR}/tls.key"),
        format!("--trusted-ca-file={SERVER_TLS_DIR}/ca.crt"),
        "--client-cert-auth=true".into(),
        format!("--peer-cert-file={PEER_TLS_DIR}/tls.crt"),
        format!("--peer-key-file={PEER_TLS_DIR}/tls.key"),
        format!("--peer-trusted-ca-file={PEER_TLS_DIR}/ca.crt"),
        "--peer-client-cert-auth=true".into(),
        // Peers share one certificate from the cluster's own CA: the CA check is what
        // authenticates them. Without this, etcd also matches the peer's address against
        // the certificate's names by reverse DNS, which not every cluster DNS answers.
        // (3.6 accepts the 3.5 name of the flag.)
        "--experimental-peer-skip-client-san-verification=true".into(),
    ];
    let (mut mounts, mut volumes) = (vec![], vec![]);
    for (volume, dir, secret) in [
        ("peer-tls", PEER_TLS_DIR, names.peer_secret()),
        ("server-tls", SERVER_TLS_DIR, names.server_secret()),
    ] {
        mounts.push(VolumeMount {
            name: volume.into(),
            mount_path: dir.into(),
            read_only: Some(true),
            ..Default::default()
        });
        volumes.push(Volume {
            name: volume.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret),
                default_mode: Some(0o400),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    (args, mounts, volumes)
}

/// Ready means it serves with a leader: only then does the client Service send to it.
fn readiness() -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/health".into()),
            port: IntOrString::String("metrics".into()),
            ..Default::default()
        }),
        // Each second: a member made again is in the Service a second after it serves, not
        // two (the first probe, at its start, finds etcd not listening yet).
        period_seconds: Some(1),
        failure_threshold: Some(3),
        timeout_seconds: Some(2),
        ..Default::default()
    }
}

/// The flags of member `member`'s etcd, but for TLS and the user's own.
fn member_args(
    cluster: &EtcdCluster,
    names: &Names,
    member: &str,
    initial_cluster: &[(String, String)],
) -> Vec<String> {
    let listen = |port: i32| {
        let scheme = if names.tls { "https" } else { "http" };
        format!("{scheme}://0.0.0.0:{port}")
    };
    let initial = initial_cluster
        .iter()
        .map(|(name, url)| format!("{name}={url}"))
        .collect::<Vec<_>>()
        .join(",");
    vec![
        format!("--name={member}"),
        format!("--data-dir={DATA_DIR}"),
        format!("--listen-peer-urls={}", listen(PEER_PORT)),
        format!("--listen-client-urls={}", listen(CLIENT_PORT)),
        format!("--advertise-client-urls={}", names.member_client_url(member)),
        format!("--initial-advertise-peer-urls={}", names.peer_url(member)),
        format!("--initial-cluster={initial}"),
        format!("--initial-cluster-token={}", token(cluster, names)),
        format!("--listen-metrics-urls=http://0.0.0.0:{METRICS_PORT}"),
    ]
}

/// The pod of `member`. `initial_cluster` lists every member etcd knows, this one included, as
/// (name, peer URL); a member that has data ignores it. `images` gives its pull secrets.
pub fn member_pod(
    cluster: &EtcdCluster,
    names: &Names,
    member: &str,
    version: &str,
    initial_cluster: &[(String, String)],
    images: &Images,
    owner: &OwnerReference,
) -> Pod {
    let mut args = member_args(cluster, names, member, initial_cluster);
    let mut mounts = vec![VolumeMount {
        name: "data".into(),
        mount_path: "/var/lib/etcd".into(),
        ..Default::default()
    }];
    let mut volumes = vec![Volume {
        name: "data".into(),
        persistent_volume_claim: (!cluster.spec.storage.ephemeral).then(|| PersistentVolumeClaimVolumeSource {
            claim_name: names.volume(member),
            read_only: None,
        }),
        empty_dir: cluster.spec.storage.ephemeral.then(Default::default),
        ..Default::default()
    }];
    if names.tls {
        let (tls_args, tls_mounts, tls_volumes) = tls(names);
        args.extend(tls_args);
        mounts.extend(tls_mounts);
        volumes.extend(tls_volumes);
    }
    args.extend(cluster.spec.pod.extra_args.iter().cloned());
    let port = |name: &str, port: i32| ContainerPort {
        name: Some(name.into()),
        container_port: port,
        ..Default::default()
    };
    let container = Container {
        name: "etcd".into(),
        image: Some(image(&names.image_repository, version)),
        command: Some(vec!["/usr/local/bin/etcd".into()]),
        args: Some(args),
        env: Some(vec![EnvVar {
            name: "ETCD_INITIAL_CLUSTER_STATE".into(),
            value_from: Some(EnvVarSource {
                config_map_key_ref: Some(ConfigMapKeySelector {
                    name: names.state_config_map(),
                    key: STATE_KEY.into(),
                    optional: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ports: Some(vec![
            port("client", CLIENT_PORT),
            port("peer", PEER_PORT),
            port("metrics", METRICS_PORT),
        ]),
        readiness_probe: Some(readiness()),
        resources: cluster.spec.pod.resources.clone(),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(member.into()),
            namespace: Some(names.namespace.clone()),
            labels: Some(names.member_labels(member)),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            hostname: Some(member.into()),
            subdomain: Some(names.peer_service()),
            containers: vec![container],
            volumes: Some(volumes),
            affinity: Some(prefer_apart(cluster.spec.pod.affinity.clone(), names.selector())),
            tolerations: (!cluster.spec.pod.tolerations.is_empty()).then(|| cluster.spec.pod.tolerations.clone()),
            termination_grace_period_seconds: Some(30),
            enable_service_links: Some(false),
            restart_policy: Some("Always".into()),
            image_pull_secrets: images.image_pull_secrets(),
            security_context: Some(PodSecurityContext {
                seccomp_profile: runtime_default_seccomp(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// `pod` made to run on `node` only (a member added to spread the members: the move's whole
/// point is that node), on top of whatever node affinity the cluster asks for.
pub fn pin_to_node(pod: &mut Pod, node: &str) {
    let on_node = NodeSelectorRequirement {
        key: "kubernetes.io/hostname".into(),
        operator: "In".into(),
        values: Some(vec![node.to_string()]),
    };
    let Some(spec) = pod.spec.as_mut() else { return };
    let required = spec
        .affinity
        .get_or_insert_with(Affinity::default)
        .node_affinity
        .get_or_insert_with(NodeAffinity::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(NodeSelector::default);
    // Terms are ORed: the node goes into each, or makes the only one.
    if required.node_selector_terms.is_empty() {
        required.node_selector_terms.push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .push(on_node.clone());
    }
}

/// The initial cluster token: the EtcdCluster's UID, so that every cluster (a restored one
/// too) gets a cluster ID of its own.
pub fn token(cluster: &EtcdCluster, names: &Names) -> String {
    cluster.metadata.uid.clone().unwrap_or_else(|| names.cluster.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::fixtures;

    #[test]
    fn a_member_runs_etcd_from_the_registry_or_the_clusters_own_repository() {
        let mut cluster = fixtures::cluster().build();
        let mirror = Images {
            registry: Some("mirror.example/m".into()),
            pull_secrets: vec!["mirror-creds".into()],
        };
        let image = |cluster: &EtcdCluster| {
            let names = Names::pulling_from(cluster, &mirror);
            let pod = member_pod(cluster, &names, "main-0", "3.5.21", &[], &mirror, &fixtures::owner());
            pod.spec.unwrap().containers[0].image.clone().unwrap()
        };
        assert_eq!(image(&cluster), "mirror.example/m/coreos/etcd:v3.5.21");
        let names = Names::pulling_from(&cluster, &mirror);
        let spec = member_pod(&cluster, &names, "main-0", "3.5.21", &[], &mirror, &fixtures::owner())
            .spec
            .unwrap();
        assert_eq!(spec.image_pull_secrets, mirror.image_pull_secrets());
        let seccomp = spec.security_context.and_then(|s| s.seccomp_profile).unwrap();
        assert_eq!(
            seccomp.type_, "RuntimeDefault",
            "Pod Security \"restricted\" asks for it"
        );
        cluster.spec.image_repository = Some("own.example/etcd".into());
        assert_eq!(image(&cluster), "own.example/etcd:v3.5.21");
    }

    #[test]
    fn a_member_pod_has_its_identity_urls_volume_and_certificates() {
        let cluster = fixtures::cluster().build();
        let names = Names::of(&cluster);
        let initial = vec![
            ("main-0".to_string(), names.peer_url("main-0")),
            ("main-1".to_string(), names.peer_url("main-1")),
        ];
        let pod = member_pod(
            &cluster,
            &names,
            "main-1",
            "3.5.21",
            &initial,
            &Images::default(),
            &fixtures::owner(),
        );
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(
            (spec.hostname.as_deref(), spec.subdomain.as_deref()),
            (Some("main-1"), Some("main"))
        );
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("quay.io/coreos/etcd:v3.5.21"));
        let args = c.args.as_ref().unwrap();
        for expected in [
            "--name=main-1",
            "--initial-advertise-peer-urls=https://main-1.main.db.svc:2380",
            "--initial-cluster=main-0=https://main-0.main.db.svc:2380,main-1=https://main-1.main.db.svc:2380",
            "--client-cert-auth=true",
            "--peer-client-cert-auth=true",
        ] {
            assert!(args.iter().any(|a| a == expected), "{expected} in {args:?}");
        }
        assert!(
            !args.iter().any(|a| a.starts_with("--initial-cluster-state")),
            "from the ConfigMap"
        );
        let env = &c.env.as_ref().unwrap()[0];
        assert_eq!(env.name, "ETCD_INITIAL_CLUSTER_STATE");
        let volumes = spec.volumes.as_ref().unwrap();
        assert_eq!(
            volumes[0].persistent_volume_claim.as_ref().unwrap().claim_name,
            "main-1-data"
        );
        assert!(
            volumes
                .iter()
                .any(|v| v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some("main-peer"))
        );
        let anti = spec.affinity.as_ref().unwrap().pod_anti_affinity.as_ref().unwrap();
        assert_eq!(
            anti.preferred_during_scheduling_ignored_during_execution
                .as_ref()
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn ephemeral_and_plain_clusters() {
        let cluster = fixtures::cluster().ephemeral().without_tls().build();
        let names = Names::of(&cluster);
        let pod = member_pod(
            &cluster,
            &names,
            "main-0",
            "3.6.4",
            &[],
            &Images::default(),
            &fixtures::owner(),
        );
        let spec = pod.spec.unwrap();
        assert!(spec.volumes.as_ref().unwrap()[0].empty_dir.is_some());
        assert_eq!(spec.volumes.unwrap().len(), 1, "no certificates");
        let args = spec.containers[0].args.clone().unwrap();
        assert!(args.iter().any(|a| a == "--listen-client-urls=http://0.0.0.0:2379"));
    }

    #[test]
    fn extra_args_may_not_set_what_the_operator_owns() {
        let cluster = fixtures::cluster()
            .extra_args(&["--quota-backend-bytes=1", "--name=evil", "--initial-cluster-state=new"])
            .build();
        assert_eq!(
            forbidden_extra_args(&cluster),
            vec!["--name=evil".to_string(), "--initial-cluster-state=new".to_string()]
        );
    }

    #[test]
    fn a_member_added_to_spread_the_members_must_run_on_its_node() {
        let cluster = fixtures::cluster().build();
        let names = Names::of(&cluster);
        let mut pod = member_pod(
            &cluster,
            &names,
            "main-3",
            "3.5.21",
            &[],
            &Images::default(),
            &fixtures::owner(),
        );
        pin_to_node(&mut pod, "n3");
        let required = pod.spec.unwrap().affinity.unwrap().node_affinity.unwrap();
        let terms = required
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 1);
        let on = &terms[0].match_expressions.as_ref().unwrap()[0];
        assert_eq!(
            (on.key.as_str(), on.operator.as_str()),
            ("kubernetes.io/hostname", "In")
        );
        assert_eq!(on.values.as_deref(), Some(&["n3".to_string()][..]));
    }
}
