//! The objects a KubernetesControlPlane owns (its EtcdCluster, the API server's Service, the
//! Deployments of its three components), built from its spec and the release it runs, each
//! stamped with the hash of its desired state. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, HTTPGetAction, KeyToPath, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ProjectedVolumeSource, SecretProjection, Service, ServicePort, ServiceSpec, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use noops_api::control_plane::{ApiServerServiceType, KubernetesControlPlane};
use noops_api::etcd::{EtcdCluster, EtcdClusterSpec, TlsSpec};

use super::certificates::{Authority, Certificate, KUBECONFIG_KEY};
use super::names::{API_SERVER_PORT, Component, Names};
use super::versions::Release;
use crate::core::apart::prefer_apart;
use crate::core::images::Images;
use crate::core::pod_security::runtime_default_seccomp;
use crate::core::stamp::stamp;

/// Where every component finds its certificates and keys.
const PKI_DIR: &str = "/etc/kubernetes/pki";
/// How long an API server that is asked to stop keeps serving, so that it leaves the
/// Service's endpoints before it stops answering.
const SHUTDOWN_DELAY_SECONDS: i64 = 5;
/// The secure ports of the controller-manager and the scheduler.
const CONTROLLER_MANAGER_PORT: i32 = 10257;
const SCHEDULER_PORT: i32 = 10259;

fn meta(names: &Names, name: String, component: Option<&str>, owner: &OwnerReference) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(names.namespace.clone()),
        labels: Some(names.labels(component)),
        owner_references: Some(vec![owner.clone()]),
        ..Default::default()
    }
}

/// The tenant's EtcdCluster, at the etcd version of `release`.
pub fn etcd_cluster(
    kcp: &KubernetesControlPlane,
    names: &Names,
    etcd_version: &str,
    owner: &OwnerReference,
) -> EtcdCluster {
    let etcd = &kcp.spec.etcd;
    let mut cluster = EtcdCluster::new(
        &names.etcd(),
        EtcdClusterSpec {
            replicas: etcd.replicas,
            version: etcd_version.to_string(),
            image_repository: None,
            storage: etcd.storage.clone(),
            tls: TlsSpec {
                enabled: true,
                secrets: None,
            },
            paused: false,
            pod: Default::default(),
            backup: etcd.backup.clone(),
            bootstrap: kcp.spec.bootstrap.clone(),
            defragmentation: Default::default(),
        },
    );
    cluster.metadata = meta(names, names.etcd(), Some("etcd"), owner);
    stamp(&mut cluster);
    cluster
}

/// The fields of the tenant's EtcdCluster left to whoever runs it: pausing it, its pods'
/// resources and placement, its defragmentation. The control plane does not apply them, so an
/// edit of them on the EtcdCluster stays (the control plane's own `paused` stops it applying
/// anything).
const ETCD_FIELDS_LEFT_TO_USERS: [&str; 3] = ["paused", "pod", "defragmentation"];

/// The EtcdCluster as the control plane applies it: [`etcd_cluster`] without the fields it
/// leaves to users.
pub fn etcd_cluster_applied(etcd: &EtcdCluster) -> serde_json::Value {
    let mut value = serde_json::to_value(etcd).unwrap_or_default();
    if let Some(spec) = value.get_mut("spec").and_then(|s| s.as_object_mut()) {
        for field in ETCD_FIELDS_LEFT_TO_USERS {
            spec.remove(field);
        }
    }
    value
}

/// The Service in front of the API servers.
pub fn service(kcp: &KubernetesControlPlane, names: &Names, owner: &OwnerReference) -> Service {
    let node_port = matches!(kcp.spec.service.type_, ApiServerServiceType::NodePort);
    let type_ = match kcp.spec.service.type_ {
        ApiServerServiceType::ClusterIP => "ClusterIP",
        ApiServerServiceType::NodePort => "NodePort",
        ApiServerServiceType::LoadBalancer => "LoadBalancer",
    };
    let mut service = Service {
        metadata: meta(names, names.service(), Some(Component::ApiServer.part()), owner),
        spec: Some(ServiceSpec {
            type_: Some(type_.into()),
            selector: Some(names.selector(Component::ApiServer)),
            ports: Some(vec![ServicePort {
                name: Some("https".into()),
                port: API_SERVER_PORT,
                target_port: Some(IntOrString::Int(API_SERVER_PORT)),
                node_port: kcp.spec.service.node_port.filter(|_| node_port),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    stamp(&mut service);
    service
}

/// A file of a Secret projected into the PKI folder.
fn file(secret: String, key: &str, path: &str) -> VolumeProjection {
    VolumeProjection {
        secret: Some(SecretProjection {
            name: secret,
            items: Some(vec![KeyToPath {
                key: key.into(),
                path: path.into(),
                mode: Some(0o600),
            }]),
            optional: Some(false),
        }),
        ..Default::default()
    }
}

/// The PKI folder of `component`: only the files it needs, kubeadm's names.
fn pki_volume(names: &Names, component: Component) -> Volume {
    let ca = Authority::Cluster.secret(names);
    let front_ca = Authority::FrontProxy.secret(names);
    let sa = names.service_account_secret();
    let leaf = |certificate: Certificate, base: &str| {
        let secret = certificate.secret(names);
        [
            file(secret.clone(), "tls.crt", &format!("{base}.crt")),
            file(secret, "tls.key", &format!("{base}.key")),
        ]
    };
    let mut sources = vec![file(ca.clone(), "ca.crt", "ca.crt")];
    match component {
        Component::ApiServer => {
            sources.extend(leaf(Certificate::ApiServer, "apiserver"));
            sources.extend(leaf(Certificate::KubeletClient, "apiserver-kubelet-client"));
            sources.extend(leaf(Certificate::FrontProxyClient, "front-proxy-client"));
            sources.push(file(front_ca, "ca.crt", "front-proxy-ca.crt"));
            sources.push(file(sa.clone(), "sa.key", "sa.key"));
            sources.push(file(sa, "sa.pub", "sa.pub"));
            let etcd = names.etcd_client_secret();
            sources.push(file(etcd.clone(), "ca.crt", "etcd/ca.crt"));
            sources.push(file(etcd.clone(), "tls.crt", "apiserver-etcd-client.crt"));
            sources.push(file(etcd, "tls.key", "apiserver-etcd-client.key"));
        }
        Component::ControllerManager => {
            sources.push(file(ca, "ca.key", "ca.key"));
            sources.push(file(front_ca, "ca.crt", "front-proxy-ca.crt"));
            sources.push(file(sa, "sa.key", "sa.key"));
            sources.push(file(
                Certificate::ControllerManager.secret(names),
                KUBECONFIG_KEY,
                "controller-manager.conf",
            ));
        }
        Component::Scheduler => {
            sources.push(file(
                Certificate::Scheduler.secret(names),
                KUBECONFIG_KEY,
                "scheduler.conf",
            ));
        }
    }
    Volume {
        name: "pki".into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(sources),
            default_mode: Some(0o600),
        }),
        ..Default::default()
    }
}

fn flag(name: &str, value: impl std::fmt::Display) -> String {
    format!("--{name}={value}")
}

/// The API server's command line.
fn api_server_command(kcp: &KubernetesControlPlane, names: &Names) -> Vec<String> {
    let pki = |file: &str| format!("{PKI_DIR}/{file}");
    let networking = &kcp.spec.networking;
    let mut command = vec![
        Component::ApiServer.program().to_string(),
        flag("advertise-address", "$(POD_IP)"),
        flag("secure-port", API_SERVER_PORT),
        flag("etcd-servers", names.etcd_url()),
        flag("etcd-cafile", pki("etcd/ca.crt")),
        flag("etcd-certfile", pki("apiserver-etcd-client.crt")),
        flag("etcd-keyfile", pki("apiserver-etcd-client.key")),
        flag("client-ca-file", pki("ca.crt")),
        flag("tls-cert-file", pki("apiserver.crt")),
        flag("tls-private-key-file", pki("apiserver.key")),
        flag("kubelet-client-certificate", pki("apiserver-kubelet-client.crt")),
        flag("kubelet-client-key", pki("apiserver-kubelet-client.key")),
        flag("kubelet-preferred-address-types", "InternalIP,Hostname"),
        flag("proxy-client-cert-file", pki("front-proxy-client.crt")),
        flag("proxy-client-key-file", pki("front-proxy-client.key")),
        flag("requestheader-client-ca-file", pki("front-proxy-ca.crt")),
        flag("requestheader-allowed-names", "front-proxy-client"),
        flag("requestheader-extra-headers-prefix", "X-Remote-Extra-"),
        flag("requestheader-group-headers", "X-Remote-Group"),
        flag("requestheader-username-headers", "X-Remote-User"),
        flag(
            "service-account-issuer",
            format!("https://kubernetes.default.svc.{}", networking.dns_domain),
        ),
        flag("service-account-key-file", pki("sa.pub")),
        flag("service-account-signing-key-file", pki("sa.key")),
        flag("service-cluster-ip-range", &networking.service_cidr),
        flag("authorization-mode", "Node,RBAC"),
        flag("enable-admission-plugins", "NodeRestriction"),
        flag("allow-privileged", true),
        flag("shutdown-delay-duration", format!("{SHUTDOWN_DELAY_SECONDS}s")),
        flag("shutdown-send-retry-after", true),
        flag("profiling", false),
    ];
    command.extend(kcp.spec.extra_args.api_server.iter().cloned());
    command
}

/// The controller-manager's command line.
fn controller_manager_command(kcp: &KubernetesControlPlane, names: &Names) -> Vec<String> {
    let pki = |file: &str| format!("{PKI_DIR}/{file}");
    let kubeconfig = pki("controller-manager.conf");
    let networking = &kcp.spec.networking;
    let mut command = vec![
        Component::ControllerManager.program().to_string(),
        flag("kubeconfig", &kubeconfig),
        flag("authentication-kubeconfig", &kubeconfig),
        flag("authorization-kubeconfig", &kubeconfig),
        flag("secure-port", CONTROLLER_MANAGER_PORT),
        flag("leader-elect", true),
        flag("cluster-name", &names.control_plane),
        flag("cluster-signing-cert-file", pki("ca.crt")),
        flag("cluster-signing-key-file", pki("ca.key")),
        flag("root-ca-file", pki("ca.crt")),
        flag("requestheader-client-ca-file", pki("front-proxy-ca.crt")),
        flag("service-account-private-key-file", pki("sa.key")),
        flag("use-service-account-credentials", true),
        flag("service-cluster-ip-range", &networking.service_cidr),
        flag("cluster-cidr", &networking.pod_cidr),
        flag("allocate-node-cidrs", true),
        flag("controllers", "*,bootstrapsigner,tokencleaner"),
        flag("profiling", false),
    ];
    command.extend(kcp.spec.extra_args.controller_manager.iter().cloned());
    command
}

/// The scheduler's command line.
fn scheduler_command(kcp: &KubernetesControlPlane) -> Vec<String> {
    let kubeconfig = format!("{PKI_DIR}/scheduler.conf");
    let mut command = vec![
        Component::Scheduler.program().to_string(),
        flag("kubeconfig", &kubeconfig),
        flag("authentication-kubeconfig", &kubeconfig),
        flag("authorization-kubeconfig", &kubeconfig),
        flag("secure-port", SCHEDULER_PORT),
        flag("leader-elect", true),
        flag("profiling", false),
    ];
    command.extend(kcp.spec.extra_args.scheduler.iter().cloned());
    command
}

/// An HTTPS probe of `path` on `port`.
fn probe(path: &str, port: i32, period: i32, failures: i32, initial_delay: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(port),
            scheme: Some("HTTPS".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        // No delay is left out, not 0: the API server drops a zero initialDelaySeconds, and a
        // desired Deployment holding one never matches the live one (it was applied again on
        // every pass).
        initial_delay_seconds: (initial_delay > 0).then_some(initial_delay),
        timeout_seconds: Some(2),
        ..Default::default()
    }
}

/// Replicas of a component: the API servers as asked; the controller-manager and the scheduler
/// two (one leads) when there are three API servers.
pub fn replicas(kcp: &KubernetesControlPlane, component: Component) -> i32 {
    match component {
        Component::ApiServer => kcp.spec.replicas,
        _ if kcp.spec.replicas > 1 => 2,
        _ => 1,
    }
}

/// A component's command line, its port, and its readiness and liveness probes.
fn process(kcp: &KubernetesControlPlane, names: &Names, component: Component) -> (Vec<String>, i32, Probe, Probe) {
    match component {
        Component::ApiServer => (
            api_server_command(kcp, names),
            API_SERVER_PORT,
            probe("/readyz", API_SERVER_PORT, 1, 3, 0),
            probe("/livez", API_SERVER_PORT, 10, 8, 15),
        ),
        Component::ControllerManager => (
            controller_manager_command(kcp, names),
            CONTROLLER_MANAGER_PORT,
            probe("/healthz", CONTROLLER_MANAGER_PORT, 2, 3, 0),
            probe("/healthz", CONTROLLER_MANAGER_PORT, 10, 8, 15),
        ),
        Component::Scheduler => (
            scheduler_command(kcp),
            SCHEDULER_PORT,
            probe("/healthz", SCHEDULER_PORT, 2, 3, 0),
            probe("/healthz", SCHEDULER_PORT, 10, 8, 15),
        ),
    }
}

/// The annotation of a component's pods that says which certificates they were started with
/// (when each expires): a component reads some of them only when it starts (its kubeconfig,
/// its etcd client certificate), so a renewal rolls its pods, one at a time.
pub const CERTIFICATES_ANNOTATION: &str = "noops.dev/certificates-not-after";

/// The Secrets of the certificates `component` mounts.
pub fn mounted_certificates(names: &Names, component: Component) -> Vec<String> {
    match component {
        Component::ApiServer => vec![
            Certificate::ApiServer.secret(names),
            Certificate::KubeletClient.secret(names),
            Certificate::FrontProxyClient.secret(names),
            names.etcd_client_secret(),
        ],
        Component::ControllerManager => vec![Certificate::ControllerManager.secret(names)],
        Component::Scheduler => vec![Certificate::Scheduler.secret(names)],
    }
}

/// The Deployment of `component` at `release`; `certificates` is when the certificates its
/// pods mount expire (see [`CERTIFICATES_ANNOTATION`]); `images` gives the pull secrets.
pub fn deployment(
    kcp: &KubernetesControlPlane,
    names: &Names,
    component: Component,
    release: &Release,
    certificates: &str,
    images: &Images,
    owner: &OwnerReference,
) -> Deployment {
    let (command, port, readiness, liveness) = process(kcp, names, component);
    let pod_ip = crate::core::downward::pod_ip_env();
    let container = Container {
        name: component.part().into(),
        image: Some(release.image(component)),
        command: Some(command),
        env: Some(vec![pod_ip]),
        ports: Some(vec![ContainerPort {
            name: Some("https".into()),
            container_port: port,
            ..Default::default()
        }]),
        readiness_probe: Some(readiness),
        liveness_probe: Some(liveness),
        volume_mounts: Some(vec![VolumeMount {
            name: "pki".into(),
            mount_path: PKI_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let selector = names.selector(component);
    let mut pod_labels = names.labels(Some(component.part()));
    pod_labels.extend(selector.clone());
    let mut deployment = Deployment {
        metadata: meta(names, names.deployment(component), Some(component.part()), owner),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas(kcp, component)),
            selector: LabelSelector {
                match_labels: Some(selector.clone()),
                ..Default::default()
            },
            // One new pod at a time, and none of the old ones goes before it is Ready.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(BTreeMap::from([(
                        CERTIFICATES_ANNOTATION.to_string(),
                        certificates.to_string(),
                    )])),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    volumes: Some(vec![pki_volume(names, component)]),
                    affinity: Some(prefer_apart(None, selector)),
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    termination_grace_period_seconds: Some(SHUTDOWN_DELAY_SECONDS + 30),
                    image_pull_secrets: images.image_pull_secrets(),
                    security_context: Some(PodSecurityContext {
                        seccomp_profile: runtime_default_seccomp(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    stamp(&mut deployment);
    deployment
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control_plane::fixtures::control_plane;
    use crate::core::fixtures::owner_reference;

    fn command_of(d: &Deployment) -> Vec<String> {
        d.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0]
            .command
            .clone()
            .unwrap()
    }

    #[test]
    fn the_api_server_reaches_its_etcd_and_serves_the_tenants_ranges_rolling_one_at_a_time() {
        let kcp = control_plane("team-a")
            .replicas(3)
            .extra_api_server_arg("--audit-log-maxage=7")
            .build();
        let names = Names::of(&kcp);
        let owner = owner_reference("KubernetesControlPlane", "team-a", "u1");
        let release = Release::of("1.34").unwrap();
        let private = Images {
            pull_secrets: vec!["registry-creds".into()],
            ..Default::default()
        };
        let api = deployment(&kcp, &names, Component::ApiServer, &release, "", &private, &owner);
        let command = command_of(&api);
        assert_eq!(command[0], "kube-apiserver");
        assert!(command.contains(&"--etcd-servers=https://team-a-etcd-client.tenants.svc:2379".to_string()));
        assert!(command.contains(&"--service-cluster-ip-range=10.112.0.0/16".to_string()));
        assert_eq!(
            command.last().unwrap(),
            "--audit-log-maxage=7",
            "the user's flags come last"
        );
        let spec = api.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(3));
        let rolling = spec.strategy.as_ref().unwrap().rolling_update.as_ref().unwrap();
        assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)));
        let container = &spec.template.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            container.image.as_deref(),
            Some("registry.k8s.io/kube-apiserver:v1.34.4")
        );
        let readiness = container.readiness_probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(
            (readiness.path.as_deref(), readiness.scheme.as_deref()),
            (Some("/readyz"), Some("HTTPS"))
        );
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.image_pull_secrets, private.image_pull_secrets());
        let seccomp = pod.security_context.as_ref().and_then(|s| s.seccomp_profile.as_ref());
        assert_eq!(seccomp.map(|p| p.type_.as_str()), Some("RuntimeDefault"));
        // Two controller-managers and schedulers with three API servers; one with one.
        assert_eq!(replicas(&kcp, Component::Scheduler), 2);
        assert_eq!(replicas(&control_plane("b").build(), Component::ControllerManager), 1);
    }

    #[test]
    fn each_component_gets_only_the_keys_it_needs() {
        let kcp = control_plane("team-a").build();
        let names = Names::of(&kcp);
        let paths = |component| -> Vec<String> {
            let volume = pki_volume(&names, component);
            volume
                .projected
                .unwrap()
                .sources
                .unwrap()
                .iter()
                .flat_map(|s| s.secret.as_ref().unwrap().items.clone().unwrap())
                .map(|item| item.path)
                .collect()
        };
        let api = paths(Component::ApiServer);
        assert!(api.contains(&"sa.key".to_string()) && !api.contains(&"ca.key".to_string()));
        assert!(paths(Component::ControllerManager).contains(&"ca.key".to_string()));
        assert_eq!(paths(Component::Scheduler), vec!["ca.crt", "scheduler.conf"]);
    }

    #[test]
    fn the_etcd_runs_the_releases_version_with_the_spec_of_the_control_plane() {
        let kcp = control_plane("team-a").etcd_replicas(1).build();
        let names = Names::of(&kcp);
        let owner = owner_reference("KubernetesControlPlane", "team-a", "u1");
        let etcd = etcd_cluster(&kcp, &names, "3.5.35", &owner);
        assert_eq!(etcd.metadata.name.as_deref(), Some("team-a-etcd"));
        assert_eq!((etcd.spec.replicas, etcd.spec.version.as_str()), (1, "3.5.35"));
        assert!(etcd.spec.tls.enabled);
        // Applied without what is left to users (pausing it, pod settings, defragmentation).
        let applied = etcd_cluster_applied(&etcd);
        for left in ["paused", "pod", "defragmentation"] {
            assert!(applied["spec"].get(left).is_none(), "{left} applied");
        }
        assert_eq!(applied["spec"]["version"], "3.5.35");
        assert_eq!(applied["spec"]["tls"]["enabled"], true);
        let svc = service(&kcp, &names, &owner);
        assert_eq!(svc.spec.unwrap().selector, Some(names.selector(Component::ApiServer)));
    }
}
