//! The machine provider: what makes, reads and removes a machine's VM. The Machine controller
//! speaks to it through [`Provider`] only (four calls), so a cloud's VMs could be another
//! provider; the one noops has is [`PodProvider`]: the VM is a privileged pod of this cluster
//! (Cluster API's Docker provider makes it a container) running the node agent as a whole
//! machine in the pod's network namespace, and the tenant's kube-proxy beside it.
//!
//! A VM is made once. One that is gone afterwards (its pod deleted, its node lost) is not made
//! again under the same Machine: its disk and its Node's pods went with it, so the Machine
//! is Failed and its MachineSet replaces it.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    Container, HTTPGetAction, Lifecycle, LifecycleHandler, Pod, PodSpec, Probe, SecretVolumeSource, SecurityContext,
    SleepAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams};
use kube::runtime::reflector::{ObjectRef, Store};
use noops_api::machine::FlavorSpec;

use super::bootstrap::{KUBE_PROXY_KUBECONFIG, NODE_KUBECONFIG, SERVING_CERT, SERVING_KEY, TENANT_CA};
use super::names::{CLUSTER_LABEL, Names};
use crate::core::Result;
use crate::core::apart::prefer_apart;
use crate::core::apply::{create_if_missing, delete_if_present};
use crate::core::downward::pod_ip_env;
use crate::core::images::Images;

/// Where the VM's agent finds its bootstrap Secret.
const BOOTSTRAP_DIR: &str = "/etc/noops/machine";
/// The VM's disk: the agent's state and its pods' volumes (an emptyDir of the pod).
const STATE_DIR: &str = "/var/lib/noops-node";
/// The node agent's health port (the kubelet's): ready once it routes to the other machines.
const AGENT_HEALTH_PORT: i32 = 10248;
/// kube-proxy's health port: ready once it has synced the tenant's Services.
const KUBE_PROXY_HEALTH_PORT: i32 = 10256;
/// How long a stopping VM goes on serving before it stops its pods (and its network goes): a
/// load balancer in front of the machines needs this long to stop sending it new connections.
/// The deleted pod leaves the Service's endpoints at once, but the controller-manager and every
/// kube-proxy take a while to act on it on a loaded machine; 5 s was seen to be too short once
/// in many rollouts (a connection to the gone address: "No route to host").
const SHUTDOWN_DELAY_SECONDS: i64 = 10;

/// What a provider says about a machine's VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmState {
    /// There is none.
    Missing,
    /// Being made or started, not running yet; what keeps it, if anything says (reason,
    /// message), such as an image that cannot be pulled.
    Starting { problem: Option<(String, String)> },
    /// Running, at this address of this cluster's network.
    Running { address: Option<String> },
    /// Stopped for good (reason, message).
    Failed { reason: String, message: String },
    /// Being removed.
    Deleting,
}

/// What a VM is made with.
#[derive(Debug, Clone, PartialEq)]
pub struct VmSpec {
    pub names: Names,
    /// The exact Kubernetes version (`1.34.4`) of its kubelet and kube-proxy.
    pub kubernetes_version: String,
    /// The machine image, if the Machine names one.
    pub image: Option<String>,
    pub flavor: FlavorSpec,
    /// The tenant's pod network, Service address of `kubernetes`, and DNS domain.
    pub cluster_cidr: String,
    pub api_service_ip: IpAddr,
    pub dns_domain: String,
    pub owner: OwnerReference,
}

/// A maker of VMs.
pub trait Provider {
    /// What the machine's VM is now, as the provider's cache says.
    fn observe(&self, names: &Names) -> VmState;
    /// What the machine's VM is now, as the provider itself says: read before a VM the cache
    /// no longer holds fails its machine (the cache may not hold one made a moment ago).
    fn confirm(&self, names: &Names) -> impl std::future::Future<Output = Result<VmState>> + Send;
    /// Makes the VM (its bootstrap Secret exists).
    fn create(&self, spec: &VmSpec) -> impl std::future::Future<Output = Result<()>> + Send;
    /// Removes the VM; true once it is gone.
    fn delete(&self, names: &Names) -> impl std::future::Future<Output = Result<bool>> + Send;
}

/// VMs as privileged pods of this cluster.
pub struct PodProvider {
    pub client: kube::Client,
    /// The VM pods (labelled with their machine), from a watch.
    pub pods: Store<Pod>,
    /// The Secrets VM pods pull their images with (the registry setting is not theirs).
    pub images: Images,
}

impl Provider for PodProvider {
    fn observe(&self, names: &Names) -> VmState {
        let pod = self.pods.get(&ObjectRef::new(&names.vm_pod()).within(&names.namespace));
        vm_state(pod.as_deref())
    }

    async fn confirm(&self, names: &Names) -> Result<VmState> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &names.namespace);
        Ok(vm_state(
            crate::core::confirm::get(&api, &names.vm_pod(), "vm-before-create")
                .await?
                .as_ref(),
        ))
    }

    async fn create(&self, spec: &VmSpec) -> Result<()> {
        // Made once and never changed (a new version is a new machine): created, not applied.
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &spec.names.namespace);
        create_if_missing(&api, &vm_pod(spec, &self.images)).await?;
        Ok(())
    }

    async fn delete(&self, names: &Names) -> Result<bool> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &names.namespace);
        // From the watch cache: a pod it does not hold yet was made a moment ago, and is owned
        // by its Machine, so the garbage collector removes it should the Machine go first.
        let pod = self.pods.get(&ObjectRef::new(&names.vm_pod()).within(&names.namespace));
        match pod.as_deref() {
            None => Ok(true),
            Some(pod) if pod.metadata.deletion_timestamp.is_some() => {
                // A pod whose node is lost never finishes its graceful deletion: past its
                // grace period and a margin, it is removed outright (that node's agent kills
                // what is left of it should the node come back).
                if deletion_overdue(pod, jiff::Timestamp::now()) {
                    tracing::warn!(pod = %names.vm_pod(), "the VM's pod outlived its grace period (its node is probably lost): removing it outright");
                    delete_if_present(&api, &names.vm_pod(), &DeleteParams::default().grace_period(0)).await?;
                }
                Ok(false)
            }
            Some(_) => {
                delete_if_present(&api, &names.vm_pod(), &DeleteParams::default()).await?;
                Ok(false)
            }
        }
    }
}

/// How long past its grace period a VM pod may take to go before it is removed outright.
const DELETION_MARGIN: jiff::SignedDuration = jiff::SignedDuration::from_secs(15);

/// Whether a pod being deleted has outlived its grace period and the margin. Pure.
pub fn deletion_overdue(pod: &Pod, now: jiff::Timestamp) -> bool {
    let Some(since) = pod.metadata.deletion_timestamp.as_ref() else {
        return false;
    };
    // The deletion timestamp is when the grace period ends.
    now >= since.0 + DELETION_MARGIN
}

/// The image of a VM: the Machine's, or the provider's for the version. Pure.
pub fn image(spec: &VmSpec) -> String {
    spec.image
        .clone()
        .unwrap_or_else(|| format!("noops/node:v{}", spec.kubernetes_version))
}

fn file(name: &str) -> String {
    format!("{BOOTSTRAP_DIR}/{name}")
}

fn flag(name: &str, value: impl std::fmt::Display) -> String {
    format!("--{name}={value}")
}

fn bootstrap_mount() -> VolumeMount {
    VolumeMount {
        name: "bootstrap".into(),
        mount_path: BOOTSTRAP_DIR.into(),
        read_only: Some(true),
        ..Default::default()
    }
}

fn privileged() -> Option<SecurityContext> {
    Some(SecurityContext {
        privileged: Some(true),
        ..Default::default()
    })
}

/// The node agent as a whole machine.
fn agent_container(spec: &VmSpec) -> Container {
    let names = &spec.names;
    let args = vec![
        flag("kubeconfig", file(NODE_KUBECONFIG)),
        flag("node-name", names.node()),
        // The pod's address is the machine's: the agent reads it from the downward API.
        flag("node-ip", "$(POD_IP)"),
        flag("provider-id", names.provider_id()),
        flag("cluster-cidr", &spec.cluster_cidr),
        flag("cluster-domain", &spec.dns_domain),
        flag("api-service", format!("{}:443", spec.api_service_ip)),
        flag("kubernetes-version", format!("v{}", spec.kubernetes_version)),
        flag("state-dir", format!("{STATE_DIR}/state")),
        flag("volumes-dir", format!("{STATE_DIR}/volumes")),
        flag("tls-cert", file(SERVING_CERT)),
        flag("tls-key", file(SERVING_KEY)),
        flag("client-ca", file(TENANT_CA)),
        flag("cpu", spec.flavor.cpu),
        flag("memory-mib", spec.flavor.memory_mib().unwrap_or(2048)),
        flag("max-pods", spec.flavor.pods),
    ];
    Container {
        name: "node".into(),
        image: Some(image(spec)),
        args: Some(args),
        env: Some(vec![pod_ip_env()]),
        security_context: privileged(),
        lifecycle: Some(serve_on_while_leaving()),
        // Ready once it routes to the other machines' pods: a load balancer sends it nothing
        // before.
        readiness_probe: Some(http_probe("/healthz", AGENT_HEALTH_PORT)),
        volume_mounts: Some(vec![
            bootstrap_mount(),
            VolumeMount {
                name: "state".into(),
                mount_path: STATE_DIR.into(),
                ..Default::default()
            },
        ]),
        ..Default::default()
    }
}

/// A stopping VM goes on serving, both its agent and its kube-proxy (which keeps following the
/// tenant's Services meanwhile), until a load balancer has taken it out: a `preStop` sleep on
/// both, which the kubelet runs before it signals either.
fn serve_on_while_leaving() -> Lifecycle {
    Lifecycle {
        pre_stop: Some(LifecycleHandler {
            sleep: Some(SleepAction {
                seconds: SHUTDOWN_DELAY_SECONDS,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The tenant's kube-proxy of the machine's version.
fn proxy_container(spec: &VmSpec) -> Container {
    let command = vec![
        "kube-proxy".to_string(),
        flag("kubeconfig", file(KUBE_PROXY_KUBECONFIG)),
        flag("hostname-override", spec.names.node()),
        flag("proxy-mode", "iptables"),
        flag("cluster-cidr", &spec.cluster_cidr),
        // Conntrack's table size is this whole machine's setting, not the VM's.
        flag("conntrack-max-per-core", 0),
        flag("metrics-bind-address", "127.0.0.1:10249"),
        flag("healthz-bind-address", format!("0.0.0.0:{KUBE_PROXY_HEALTH_PORT}")),
    ];
    Container {
        name: "kube-proxy".into(),
        image: Some(format!("registry.k8s.io/kube-proxy:v{}", spec.kubernetes_version)),
        command: Some(command),
        // Ready once it has programmed the Services (and not while its Node is about to go):
        // only then does a load balancer send the machine traffic for a NodePort.
        readiness_probe: Some(http_probe("/healthz", KUBE_PROXY_HEALTH_PORT)),
        security_context: privileged(),
        lifecycle: Some(serve_on_while_leaving()),
        volume_mounts: Some(vec![bootstrap_mount()]),
        ..Default::default()
    }
}

/// The VM pod, pulled with the Secrets `images` names. Privileged (it is a whole machine), it
/// goes without the seccomp profile the operator's other pods declare. Pure.
pub fn vm_pod(spec: &VmSpec, images: &Images) -> Pod {
    let names = &spec.names;
    Pod {
        metadata: ObjectMeta {
            name: Some(names.vm_pod()),
            namespace: Some(names.namespace.clone()),
            labels: Some(names.labels("vm")),
            owner_references: Some(vec![spec.owner.clone()]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            hostname: Some(names.node()),
            containers: vec![agent_container(spec), proxy_container(spec)],
            volumes: Some(vec![
                Volume {
                    name: "bootstrap".into(),
                    secret: Some(SecretVolumeSource {
                        secret_name: Some(names.bootstrap_secret()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "state".into(),
                    empty_dir: Some(Default::default()),
                    ..Default::default()
                },
            ]),
            enable_service_links: Some(false),
            automount_service_account_token: Some(false),
            // Its tenant pods stop with it: give them time to end.
            termination_grace_period_seconds: Some(30),
            // Machines of one cluster apart: one node lost takes as few of them as it can.
            affinity: Some(prefer_apart(
                None,
                BTreeMap::from([(CLUSTER_LABEL.to_string(), names.cluster.clone())]),
            )),
            image_pull_secrets: images.image_pull_secrets(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A readiness probe of `path` on `port`, every second.
fn http_probe(path: &str, port: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(port),
            ..Default::default()
        }),
        period_seconds: Some(1),
        ..Default::default()
    }
}

/// Container waiting reasons that say the VM cannot start as it is.
const CANNOT_START: [&str; 6] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "ImageNotMapped",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "RunContainerError",
];

/// What a VM pod says about the VM. Pure.
pub fn vm_state(pod: Option<&Pod>) -> VmState {
    let Some(pod) = pod else { return VmState::Missing };
    if pod.metadata.deletion_timestamp.is_some() {
        return VmState::Deleting;
    }
    let status = pod.status.clone().unwrap_or_default();
    if matches!(status.phase.as_deref(), Some("Failed") | Some("Succeeded")) {
        return VmState::Failed {
            reason: status.reason.unwrap_or_else(|| "VmStopped".into()),
            message: status
                .message
                .unwrap_or_else(|| "the VM's pod ended; its disk went with it".into()),
        };
    }
    let statuses = status.container_statuses.unwrap_or_default();
    let problem = statuses.iter().find_map(|c| {
        let waiting = c.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.clone()?;
        CANNOT_START.contains(&reason.as_str()).then(|| {
            let message = waiting.message.clone().unwrap_or_default();
            (reason, format!("container {}: {message}", c.name))
        })
    });
    let all_running = !statuses.is_empty()
        && statuses
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
    if status.phase.as_deref() == Some("Running") && all_running {
        VmState::Running { address: status.pod_ip }
    } else {
        VmState::Starting { problem }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateWaiting, ContainerStatus, PodStatus,
    };

    fn spec() -> VmSpec {
        VmSpec {
            names: Names {
                machine: "pool-a-x7k2p".into(),
                namespace: "tenants".into(),
                cluster: "team-a".into(),
            },
            kubernetes_version: "1.34.4".into(),
            image: None,
            flavor: FlavorSpec {
                cpu: 4,
                memory: "3Gi".into(),
                pods: 50,
            },
            cluster_cidr: "10.200.0.0/16".into(),
            api_service_ip: "10.112.0.1".parse().unwrap(),
            dns_domain: "cluster.local".into(),
            owner: OwnerReference {
                api_version: "noops.dev/v1alpha1".into(),
                kind: "Machine".into(),
                name: "pool-a-x7k2p".into(),
                uid: "u".into(),
                controller: Some(true),
                ..Default::default()
            },
        }
    }

    #[test]
    fn the_vm_runs_the_agent_of_its_version_with_its_flavor_and_kube_proxy_beside_it() {
        let pod = vm_pod(&spec(), &Images::default());
        let pod_spec = pod.spec.unwrap();
        let node = &pod_spec.containers[0];
        assert_eq!(node.image.as_deref(), Some("noops/node:v1.34.4"));
        let args = node.args.clone().unwrap();
        for wanted in [
            "--node-name=pool-a-x7k2p",
            "--provider-id=noops://tenants/pool-a-x7k2p",
            "--cluster-cidr=10.200.0.0/16",
            "--api-service=10.112.0.1:443",
            "--kubernetes-version=v1.34.4",
            "--cpu=4",
            "--memory-mib=3072",
            "--max-pods=50",
        ] {
            assert!(args.contains(&wanted.to_string()), "{wanted} in {args:?}");
        }
        assert_eq!(node.security_context.as_ref().unwrap().privileged, Some(true));
        let proxy = &pod_spec.containers[1];
        assert_eq!(proxy.image.as_deref(), Some("registry.k8s.io/kube-proxy:v1.34.4"));
        assert!(
            proxy
                .command
                .as_ref()
                .unwrap()
                .contains(&"--hostname-override=pool-a-x7k2p".to_string())
        );
        assert_eq!(pod.metadata.labels.unwrap()[CLUSTER_LABEL], "team-a");
        // Both go on serving while a load balancer takes the machine out, within the grace.
        for container in [node, proxy] {
            let sleep = container
                .lifecycle
                .as_ref()
                .unwrap()
                .pre_stop
                .as_ref()
                .unwrap()
                .sleep
                .as_ref();
            assert_eq!(sleep.map(|s| s.seconds), Some(SHUTDOWN_DELAY_SECONDS));
        }
        assert!(pod_spec.termination_grace_period_seconds.unwrap() >= SHUTDOWN_DELAY_SECONDS + 15);
        let custom = VmSpec {
            image: Some("registry.example/node:v1.34.4-fips".into()),
            ..spec()
        };
        assert_eq!(image(&custom), "registry.example/node:v1.34.4-fips");
    }

    fn pod(phase: &str, states: &[(&str, ContainerState)]) -> Pod {
        Pod {
            status: Some(PodStatus {
                phase: Some(phase.into()),
                pod_ip: Some("10.244.2.9".into()),
                container_statuses: Some(
                    states
                        .iter()
                        .map(|(name, state)| ContainerStatus {
                            name: (*name).into(),
                            state: Some(state.clone()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_pod_says_whether_the_vm_runs_and_why_it_cannot_start() {
        let running = ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        };
        let pull_failed = ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ImagePullBackOff".into()),
                message: Some("manifest unknown".into()),
            }),
            ..Default::default()
        };
        assert_eq!(vm_state(None), VmState::Missing);
        assert_eq!(
            vm_state(Some(&pod(
                "Running",
                &[("node", running.clone()), ("kube-proxy", running.clone())]
            ))),
            VmState::Running {
                address: Some("10.244.2.9".into())
            }
        );
        let VmState::Starting {
            problem: Some((reason, message)),
        } = vm_state(Some(&pod("Pending", &[("node", pull_failed), ("kube-proxy", running)])))
        else {
            panic!("a VM whose image cannot be pulled is starting, with the reason");
        };
        assert_eq!(reason, "ImagePullBackOff");
        assert!(message.contains("container node: manifest unknown"));
        assert!(matches!(vm_state(Some(&pod("Failed", &[]))), VmState::Failed { .. }));
        let now = jiff::Timestamp::now();
        let mut leaving = pod("Running", &[]);
        leaving.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
        assert_eq!(vm_state(Some(&leaving)), VmState::Deleting);
        assert!(!deletion_overdue(&leaving, now + jiff::SignedDuration::from_secs(10)));
        assert!(
            deletion_overdue(&leaving, now + jiff::SignedDuration::from_secs(16)),
            "its node is lost"
        );
        assert_eq!(
            vm_state(Some(&pod("Pending", &[]))),
            VmState::Starting { problem: None }
        );
    }
}
