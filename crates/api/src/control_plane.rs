//! KubernetesControlPlane: a tenant's Kubernetes control plane, run as pods of this cluster.
//!
//! ```yaml
//! apiVersion: noops.dev/v1alpha1
//! kind: KubernetesControlPlane
//! metadata: { name: team-a }
//! spec:
//!   version: "1.34"        # a minor (its newest patch the operator knows) or an exact 1.34.4
//!   replicas: 3            # API servers: 1 or 3
//!   etcd: { replicas: 3 }  # the tenant's datastore, an EtcdCluster of this operator
//! ```
//!
//! The operator keeps the tenant's etcd in an EtcdCluster (`<name>-etcd`), issues the tenant's
//! certificates from CAs of its own, runs `kube-apiserver`, `kube-controller-manager` and
//! `kube-scheduler` as Deployments behind a Service (`<name>`), and writes kubeconfigs into
//! Secrets (`<name>-admin-kubeconfig` for you). A new `version` is rolled out one minor at a
//! time: etcd first when its version must change, then the API servers one by one, then the
//! controller-manager and the scheduler.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::etcd;

/// The desired state of a tenant's control plane.
#[skip_serializing_none]
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "noops.dev",
    version = "v1alpha1",
    kind = "KubernetesControlPlane",
    plural = "kubernetescontrolplanes",
    shortname = "kcp",
    category = "noops",
    namespaced,
    status = "KubernetesControlPlaneStatus",
    validation = Rule::new("self.metadata.name.size() <= 35").message("a KubernetesControlPlane name is at most 35 characters: its EtcdCluster is <name>-etcd, and the names of its Deployments and Secrets add to it"),
    validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("a KubernetesControlPlane name must be a DNS label: lower-case letters, digits and '-', starting with a letter"),
    // Against the version that runs (the status's), not the spec's: an upgrade that stalls can
    // be set back to the version still running.
    // Editable until the control plane has served, so that a range found taken can be fixed.
    validation = Rule::new("self.spec.networking == oldSelf.spec.networking || !has(oldSelf.status) || !has(oldSelf.status.version)").message("spec.networking is immutable once the control plane has served: the tenant's addresses are handed out from these ranges"),
    validation = crate::version_rules::no_downgrade(&["version"]),
    validation = crate::version_rules::one_minor_at_a_time(&["version"]),
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.version"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".status.endpoint"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.ready"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Etcd","type":"string","priority":1,"jsonPath":".status.etcd"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("has(self.bootstrap) == has(oldSelf.bootstrap) && (!has(self.bootstrap) || self.bootstrap == oldSelf.bootstrap)").message("bootstrap is immutable: it says how the control plane started"))]
#[x_kube(validation = Rule::new("!has(self.bootstrap) || !self.etcd.storage.ephemeral").message("bootstrap.fromBackup needs persistent etcd storage: the backup is restored into the first member's volume"))]
#[serde(rename_all = "camelCase")]
pub struct KubernetesControlPlaneSpec {
    /// The Kubernetes version: a minor such as `"1.34"` (the newest patch of it the operator
    /// knows) or an exact version such as `"1.34.4"`. A change moves one minor at a time.
    #[schemars(length(max = 16))]
    #[x_kube(validation = crate::version_rules::kubernetes_version())]
    #[x_kube(validation = crate::version_rules::supported_version())]
    pub version: String,
    /// How many API servers run: 1, or 3 for a control plane that survives the loss of a node.
    /// The controller-manager and the scheduler run 2 replicas (with leader election) when
    /// this is 3.
    #[serde(default = "default_replicas")]
    #[x_kube(validation = Rule::new("self == 1 || self == 3").message("replicas must be 1 or 3 (API servers)"))]
    pub replicas: i32,
    /// The tenant's etcd, an EtcdCluster `<name>-etcd` run by this operator.
    #[serde(default)]
    pub etcd: TenantEtcdSpec,
    /// How clients reach the API server.
    #[serde(default)]
    pub service: ApiServerServiceSpec,
    /// The tenant's address ranges; they must not overlap this cluster's (its nodes' pod ranges,
    /// its Service ranges). Immutable once the control plane has served.
    #[serde(default)]
    pub networking: NetworkingSpec,
    /// Extra flags per component. Flags the operator sets (addresses, certificates, etcd,
    /// service ranges, kubeconfigs, leader election) are refused.
    #[serde(default)]
    pub extra_args: ExtraArgsSpec,
    /// Stop reconciling: nothing is changed (an upgrade under way waits) until this is false.
    #[serde(default)]
    pub paused: bool,
    /// How a new control plane starts: empty (the default), or with its etcd restored from an
    /// EtcdBackup (every tenant object back). Immutable.
    pub bootstrap: Option<etcd::BootstrapSpec>,
}

fn default_replicas() -> i32 {
    1
}

/// The tenant's etcd cluster.
#[skip_serializing_none]
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TenantEtcdSpec {
    /// Members: 1, 3 or 5.
    #[serde(default = "default_etcd_replicas")]
    #[x_kube(validation = Rule::new("self in [1, 3, 5]").message("etcd.replicas must be 1, 3 or 5"))]
    pub replicas: i32,
    /// Where members keep their data. Immutable.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("etcd.storage is immutable: create a new control plane (from a backup) to change it"))]
    pub storage: etcd::StorageSpec,
    /// Scheduled backups of the tenant's etcd, with retention, as an EtcdCluster has them.
    pub backup: Option<etcd::BackupSpec>,
}

fn default_etcd_replicas() -> i32 {
    3
}

impl Default for TenantEtcdSpec {
    fn default() -> Self {
        Self {
            replicas: default_etcd_replicas(),
            storage: etcd::StorageSpec::default(),
            backup: None,
        }
    }
}

/// The Service in front of the API servers, `<name>` on port 6443.
#[skip_serializing_none]
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[x_kube(validation = Rule::new("!has(self.nodePort) || self.type == 'NodePort'").message("service.nodePort needs service.type: NodePort"))]
#[x_kube(validation = Rule::new("!has(self.externalEndpoint) || has(self.externalEndpoint.host) || self.type == 'LoadBalancer'").message("service.externalEndpoint.host is needed unless service.type is LoadBalancer"))]
#[serde(rename_all = "camelCase")]
pub struct ApiServerServiceSpec {
    /// `ClusterIP` (the default): reached from pods and from this cluster's nodes; `NodePort`:
    /// also on every node's address; `LoadBalancer`: also at the address a load balancer
    /// gives it.
    #[serde(default, rename = "type")]
    pub type_: ApiServerServiceType,
    /// The node port with `NodePort`; one is chosen if unset.
    #[x_kube(validation = Rule::new("self >= 30000 && self <= 32767").message("service.nodePort must be in the node port range, 30000 to 32767"))]
    pub node_port: Option<i32>,
    /// Where clients outside this cluster reach the API servers. Named in the serving
    /// certificate, and in the admin Secret's `external-kubeconfig`. With `LoadBalancer` and
    /// no host, the load balancer's address once it has one.
    pub external_endpoint: Option<ExternalEndpoint>,
    /// More names and addresses the serving certificate holds (a DNS name in front of the
    /// endpoint, another address of it).
    #[serde(default, rename = "extraSANs", skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.all(n, n.size() > 0 && n.size() <= 253)").message("service.extraSANs must be names or addresses of at most 253 characters"))]
    pub extra_sans: Vec<String>,
}

/// An address and port of the API servers outside this cluster.
#[skip_serializing_none]
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ExternalEndpoint {
    /// A DNS name or an IP address; with `LoadBalancer`, the load balancer's if unset.
    #[schemars(length(min = 1, max = 253))]
    pub host: Option<String>,
    /// Default: the node port with `NodePort`, else 6443.
    #[x_kube(validation = Rule::new("self >= 1 && self <= 65535").message("service.externalEndpoint.port must be a port, 1 to 65535"))]
    pub port: Option<i32>,
}

/// How the API server's Service is published.
#[derive(JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ApiServerServiceType {
    #[default]
    ClusterIP,
    NodePort,
    LoadBalancer,
}

/// The tenant's address ranges (IPv4). Checked here, so a KubernetesCluster refuses what its
/// control plane would.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("!isCIDR(self.podCIDR) || !isCIDR(self.serviceCIDR) || (!cidr(self.podCIDR).containsCIDR(self.serviceCIDR) && !cidr(self.serviceCIDR).containsCIDR(self.podCIDR))").message("networking.podCIDR and networking.serviceCIDR must not overlap"))]
#[serde(rename_all = "camelCase")]
pub struct NetworkingSpec {
    /// The range tenant pods get their addresses from (each node a /24 of it).
    #[serde(default = "default_pod_cidr", rename = "podCIDR")]
    #[schemars(length(max = 18))]
    #[x_kube(validation = Rule::new("isCIDR(self) && cidr(self).ip().family() == 4 && cidr(self).prefixLength() >= 8 && cidr(self).prefixLength() <= 20").message("networking.podCIDR must be an IPv4 range from /8 to /20, such as 10.200.0.0/16"))]
    #[x_kube(validation = Rule::new("!isCIDR(self) || cidr(self) == cidr(self).masked()").message("networking.podCIDR must be a range's first address, such as 10.200.0.0/16"))]
    pub pod_cidr: String,
    /// The range tenant Services get their ClusterIPs from; its first address is the tenant's
    /// `kubernetes` Service.
    #[serde(default = "default_service_cidr", rename = "serviceCIDR")]
    #[schemars(length(max = 18))]
    #[x_kube(validation = Rule::new("isCIDR(self) && cidr(self).ip().family() == 4 && cidr(self).prefixLength() >= 12 && cidr(self).prefixLength() <= 24").message("networking.serviceCIDR must be an IPv4 range from /12 to /24, such as 10.112.0.0/16"))]
    #[x_kube(validation = Rule::new("!isCIDR(self) || cidr(self) == cidr(self).masked()").message("networking.serviceCIDR must be a range's first address, such as 10.112.0.0/16"))]
    pub service_cidr: String,
    /// The tenant's DNS domain.
    #[serde(default = "default_dns_domain")]
    #[schemars(length(max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("networking.dnsDomain must be a DNS name such as cluster.local"))]
    pub dns_domain: String,
}

fn default_pod_cidr() -> String {
    "10.200.0.0/16".into()
}

/// Outside the Service ranges most clusters use (kubeadm's 10.96.0.0/12) and the pod ranges
/// (flannel's 10.244.0.0/16), which the tenant's must not overlap.
fn default_service_cidr() -> String {
    "10.112.0.0/16".into()
}

fn default_dns_domain() -> String {
    "cluster.local".into()
}

impl Default for NetworkingSpec {
    fn default() -> Self {
        Self {
            pod_cidr: default_pod_cidr(),
            service_cidr: default_service_cidr(),
            dns_domain: default_dns_domain(),
        }
    }
}

/// Extra flags of each component, as `--flag=value`.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ExtraArgsSpec {
    /// Flags of `kube-apiserver`, such as `--audit-log-maxage=7`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 1024)))]
    #[x_kube(validation = Rule::new("self.all(a, a.matches('^--[a-z0-9][-a-z0-9]*(=.*)?$'))").message("extraArgs.apiServer must be flags such as --audit-log-maxage=7"))]
    #[x_kube(validation = Rule::new("self.all(a, !(a.split('=')[0] in ['--advertise-address', '--bind-address', '--secure-port', '--etcd-servers', '--etcd-cafile', '--etcd-certfile', '--etcd-keyfile', '--tls-cert-file', '--tls-private-key-file', '--client-ca-file', '--service-account-issuer', '--service-account-key-file', '--service-account-signing-key-file', '--service-cluster-ip-range', '--kubelet-client-certificate', '--kubelet-client-key', '--proxy-client-cert-file', '--proxy-client-key-file', '--requestheader-client-ca-file', '--requestheader-allowed-names', '--authorization-mode', '--shutdown-delay-duration']))").message("extraArgs.apiServer cannot set a flag the operator sets (addresses, certificates, etcd, service accounts, the service range, authorization, shutdown delay)"))]
    pub api_server: Vec<String>,
    /// Flags of `kube-controller-manager`, such as `--node-monitor-grace-period=20s`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 1024)))]
    #[x_kube(validation = Rule::new("self.all(a, a.matches('^--[a-z0-9][-a-z0-9]*(=.*)?$'))").message("extraArgs.controllerManager must be flags such as --node-monitor-grace-period=20s"))]
    #[x_kube(validation = Rule::new("self.all(a, !(a.split('=')[0] in ['--kubeconfig', '--authentication-kubeconfig', '--authorization-kubeconfig', '--bind-address', '--secure-port', '--leader-elect', '--cluster-signing-cert-file', '--cluster-signing-key-file', '--root-ca-file', '--service-account-private-key-file', '--service-cluster-ip-range', '--cluster-cidr', '--cluster-name', '--use-service-account-credentials']))").message("extraArgs.controllerManager cannot set a flag the operator sets (kubeconfigs, addresses, leader election, signing keys, ranges)"))]
    pub controller_manager: Vec<String>,
    /// Flags of `kube-scheduler`, such as `--v=2`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 1024)))]
    #[x_kube(validation = Rule::new("self.all(a, a.matches('^--[a-z0-9][-a-z0-9]*(=.*)?$'))").message("extraArgs.scheduler must be flags such as --v=2"))]
    #[x_kube(validation = Rule::new("self.all(a, !(a.split('=')[0] in ['--kubeconfig', '--authentication-kubeconfig', '--authorization-kubeconfig', '--bind-address', '--secure-port', '--leader-elect']))").message("extraArgs.scheduler cannot set a flag the operator sets (kubeconfigs, addresses, leader election)"))]
    pub scheduler: Vec<String>,
}

crate::phase::phases! {
    /// Where a control plane is, in a word (`status.phase`).
    KubernetesControlPlanePhase {
        /// Its etcd, certificates and components are being made.
        Creating,
        /// Every component is Ready.
        Running,
        /// Its components are being moved to the version asked for.
        Upgrading,
        /// An upgrade has not progressed within its deadline.
        Stalled,
        /// A component is not Ready.
        Degraded,
        /// `spec.paused`: the operator changes nothing.
        Paused,
    }
}

/// The observed state of a tenant's control plane.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesControlPlaneStatus {
    /// The generation of the spec this status describes.
    pub observed_generation: Option<i64>,
    /// Ready, Available, Progressing and Degraded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "KubernetesControlPlaneReason::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Where it is, in a word: Creating, Running, Upgrading, Stalled, Degraded, Paused.
    #[serde(default, deserialize_with = "crate::phase::known_or_none")]
    #[schemars(with = "Option<KubernetesControlPlanePhase>")]
    pub phase: Option<KubernetesControlPlanePhase>,
    /// The Kubernetes version every API server runs (the lowest, during an upgrade).
    pub version: Option<String>,
    /// Ready API servers out of those asked for, as `3/3`.
    pub ready: Option<String>,
    /// Where clients connect: `https://<address>:6443`.
    pub endpoint: Option<String>,
    /// Where clients outside this cluster connect, when `service.externalEndpoint` says (and,
    /// with a load balancer, once it has an address).
    pub external_endpoint: Option<String>,
    /// The Secret with the admin kubeconfig (key `kubeconfig`).
    pub admin_kubeconfig_secret: Option<String>,
    /// The tenant's etcd in one line: ready members, version, phase.
    pub etcd: Option<String>,
    /// The upgrade under way: a restarted operator finishes it from here.
    pub upgrade: Option<UpgradeStatus>,
}

/// A version change in progress.
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeStatus {
    /// The version it moves from, and to (exact versions).
    pub from: String,
    pub to: String,
    /// The component being moved now: `Etcd`, `APIServer`, `ControllerManager`, `Scheduler`.
    pub step: String,
    /// When it started.
    pub started_at: Time,
}

crate::reason::reasons! {
    /// Why a KubernetesControlPlane's condition is as it is (`status.conditions[].reason`; the CRD schema
    /// lists them).
    KubernetesControlPlaneReason {
        Ready,
        UpgradeStalled,
        PodsCannotStart,
        EtcdNotReady,
        Upgrading,
        APIServerNotReady,
        APIServerAvailable,
        Settled,
        Creating,
        EtcdDegraded,
        AsExpected,
        RangeTaken,
        UnsupportedVersion,
        ReplicasShareNode,
    }
}
