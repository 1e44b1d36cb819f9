//! KubernetesCluster: a whole tenant cluster from one manifest.
//!
//! ```yaml
//! apiVersion: noops.dev/v1alpha1
//! kind: KubernetesCluster
//! metadata: { name: team-a }
//! spec:
//!   version: "1.34"
//!   controlPlane: { replicas: 1, etcd: { replicas: 3 } }
//!   workers:
//!     - { name: general, replicas: 2 }
//!     - { name: burst, minReplicas: 1, maxReplicas: 3, flavor: { cpu: 4, memory: 4Gi } }
//! ```
//!
//! The operator makes one KubernetesControlPlane (`<name>`) and one MachineDeployment per pool
//! (`<name>-<pool>`), and nothing else: each stays usable on its own. Workers start once the
//! control plane is Ready. A new `version` goes to the control plane first, then to the pools
//! one at a time in the order listed; a worker is never newer than its API server nor more than
//! one minor older. A pool removed from the list is drained away; one added joins.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

/// The condition types of a KubernetesCluster beside the shared ones
/// ([`crate::condition`]): its control plane serving, its workers Ready, an upgrade under way
/// (True while one runs), pools changing their number of machines (True while they do).
pub const CONTROL_PLANE_READY: &str = "ControlPlaneReady";
pub const WORKERS_READY: &str = "WorkersReady";
pub const UPGRADING: &str = "Upgrading";
pub const SCALING: &str = "Scaling";

use crate::control_plane::{ApiServerServiceSpec, ExtraArgsSpec, NetworkingSpec, TenantEtcdSpec};
use crate::etcd;
use crate::machine::FlavorSpec;
use crate::machine_deployment::RollingUpdateSpec;
use crate::machine_set::HealthCheckSpec;

/// The desired state of a tenant cluster.
#[skip_serializing_none]
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "noops.dev",
    version = "v1alpha1",
    kind = "KubernetesCluster",
    plural = "kubernetesclusters",
    shortname = "kc",
    category = "noops",
    namespaced,
    status = "KubernetesClusterStatus",
    validation = Rule::new("self.metadata.name.size() <= 35").message("a KubernetesCluster name is at most 35 characters: it names its KubernetesControlPlane"),
    validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("a KubernetesCluster name must be a DNS label: lower-case letters, digits and '-', starting with a letter"),
    validation = Rule::new("!has(self.spec.workers) || self.spec.workers.all(p, self.metadata.name.size() + 1 + p.name.size() <= 40)").message("spec.workers: a pool's MachineDeployment is <cluster>-<pool>, at most 40 characters; shorten the pool's name"),
    // Downgrades against what the API servers run; one minor at a time from what every part
    // runs (a pool still on the old minor holds the next).
    validation = crate::version_rules::no_downgrade(&["controlPlaneVersion", "version"]),
    validation = crate::version_rules::one_minor_at_a_time(&["version", "controlPlaneVersion"]),
    validation = Rule::new("self.spec.controlPlane.networking == oldSelf.spec.controlPlane.networking || !has(oldSelf.status) || !(has(oldSelf.status.version) || has(oldSelf.status.controlPlaneVersion))").message("spec.controlPlane.networking is immutable once the cluster has served: the tenant's addresses are handed out from these ranges"),
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.version"}"#,
    printcolumn = r#"{"name":"Control Plane","type":"string","jsonPath":".status.controlPlane"}"#,
    printcolumn = r#"{"name":"Nodes","type":"string","jsonPath":".status.nodes"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("has(self.bootstrap) == has(oldSelf.bootstrap) && (!has(self.bootstrap) || self.bootstrap == oldSelf.bootstrap)").message("bootstrap is immutable: it says how the cluster started"))]
#[x_kube(validation = Rule::new("!has(self.bootstrap) || !self.controlPlane.etcd.storage.ephemeral").message("bootstrap.fromBackup needs persistent etcd storage: the backup is restored into the first member's volume"))]
#[serde(rename_all = "camelCase")]
pub struct KubernetesClusterSpec {
    /// The Kubernetes version of the control plane and every pool: a minor such as `"1.34"` or
    /// an exact version such as `"1.34.4"`. A change moves one minor at a time: the control
    /// plane first, then each pool in turn.
    #[schemars(length(max = 16))]
    #[x_kube(validation = crate::version_rules::kubernetes_version())]
    #[x_kube(validation = crate::version_rules::supported_version())]
    pub version: String,
    /// The control plane: API servers, the tenant's etcd and its backups.
    #[serde(default)]
    pub control_plane: ClusterControlPlaneSpec,
    /// Pools of worker machines, each a MachineDeployment. Upgrades go through them in this
    /// order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    #[x_kube(validation = Rule::new("self.all(p, self.exists_one(q, q.name == p.name))").message("spec.workers: pool names must be unique"))]
    pub workers: Vec<WorkerPoolSpec>,
    /// How pools roll to a new version.
    #[serde(default)]
    pub upgrade: ClusterUpgradeSpec,
    /// How a new cluster starts: empty (the default), or with its etcd restored from an
    /// EtcdBackup (every tenant object back, the pools joining it). Immutable.
    pub bootstrap: Option<etcd::BootstrapSpec>,
    /// Stop reconciling: the control plane and pools are left as they are (an upgrade under way
    /// waits) until this is false.
    #[serde(default)]
    pub paused: bool,
}

/// The control plane of a cluster: what its KubernetesControlPlane gets.
#[skip_serializing_none]
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterControlPlaneSpec {
    /// API servers: 1, or 3 for a control plane that survives the loss of a node.
    #[serde(default = "default_control_plane_replicas")]
    #[x_kube(validation = Rule::new("self == 1 || self == 3").message("controlPlane.replicas must be 1 or 3 (API servers)"))]
    pub replicas: i32,
    /// The tenant's etcd (members, storage, scheduled backups).
    #[serde(default)]
    pub etcd: TenantEtcdSpec,
    /// How clients reach the API server.
    #[serde(default)]
    pub service: ApiServerServiceSpec,
    /// The tenant's address ranges. Immutable once the cluster has served.
    #[serde(default)]
    pub networking: NetworkingSpec,
    /// Extra flags per component.
    #[serde(default)]
    pub extra_args: ExtraArgsSpec,
}

fn default_control_plane_replicas() -> i32 {
    1
}

impl Default for ClusterControlPlaneSpec {
    fn default() -> Self {
        Self {
            replicas: default_control_plane_replicas(),
            etcd: TenantEtcdSpec::default(),
            service: ApiServerServiceSpec::default(),
            networking: NetworkingSpec::default(),
            extra_args: ExtraArgsSpec::default(),
        }
    }
}

/// A pool of worker machines: a fixed number, or between a minimum and a maximum that pending
/// pods and idle nodes move it within.
#[skip_serializing_none]
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("has(self.replicas) ? !has(self.minReplicas) && !has(self.maxReplicas) : has(self.minReplicas) && has(self.maxReplicas)").message("a pool has either replicas, or minReplicas and maxReplicas (it then scales itself between them)"))]
#[x_kube(validation = Rule::new("!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas").message("minReplicas must not be more than maxReplicas"))]
#[serde(rename_all = "camelCase")]
pub struct WorkerPoolSpec {
    /// The pool's name: its MachineDeployment is `<cluster>-<name>`. Renaming a pool replaces it.
    #[schemars(length(min = 1, max = 20))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("a pool name must be a DNS label: lower-case letters, digits and '-', starting with a letter"))]
    pub name: String,
    /// A fixed number of machines.
    #[x_kube(validation = Rule::new("self >= 0 && self <= 100").message("replicas must be between 0 and 100"))]
    pub replicas: Option<i32>,
    /// The fewest machines the pool scales down to.
    #[x_kube(validation = Rule::new("self >= 0 && self <= 100").message("minReplicas must be between 0 and 100"))]
    pub min_replicas: Option<i32>,
    /// The most machines the pool scales up to.
    #[x_kube(validation = Rule::new("self >= 1 && self <= 100").message("maxReplicas must be between 1 and 100"))]
    pub max_replicas: Option<i32>,
    /// The size of each machine.
    #[serde(default)]
    pub flavor: FlavorSpec,
    /// How long a machine of a scaling pool holds only DaemonSet pods (or none) before it is
    /// drained and removed.
    #[serde(default = "default_scale_down_delay")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 86400").message("scaleDownDelaySeconds must be between 0 and 86400 (a day)"))]
    pub scale_down_delay_seconds: i64,
    /// When a machine of the pool is repaired.
    #[serde(default)]
    pub health_check: HealthCheckSpec,
}

fn default_scale_down_delay() -> i64 {
    600
}

/// How pools roll to a new version (the control plane rolls its own way): a MachineDeployment's
/// rolling update, and how long a drain waits for a Node that cannot be reached.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterUpgradeSpec {
    /// `maxSurge` (default 1) and `maxUnavailable` (default 0) of each pool's rollout.
    #[serde(flatten)]
    pub rolling_update: RollingUpdateSpec,
    /// How long a drain waits for a Node that cannot be reached before its pods are deleted
    /// without eviction.
    #[serde(default = "default_drain_timeout")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 86400").message("upgrade.drainTimeoutSeconds must be between 0 and 86400 (a day)"))]
    pub drain_timeout_seconds: i64,
}

fn default_drain_timeout() -> i64 {
    300
}

impl Default for ClusterUpgradeSpec {
    fn default() -> Self {
        Self {
            rolling_update: RollingUpdateSpec::default(),
            drain_timeout_seconds: default_drain_timeout(),
        }
    }
}

crate::phase::phases! {
    /// Where a cluster is, in a word (`status.phase`).
    KubernetesClusterPhase {
        /// Its control plane is being made.
        Provisioning,
        /// Its control plane and every pool are Ready.
        Running,
        /// A pool is being scaled.
        Scaling,
        /// It is being upgraded: the control plane first, then each pool.
        Upgrading,
        /// Its control plane or a pool is not Ready.
        Degraded,
        /// `spec.paused`: the operator changes nothing.
        Paused,
        /// It is being deleted, its pools first.
        Deleting,
    }
}

/// The observed state of a tenant cluster.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesClusterStatus {
    pub observed_generation: Option<i64>,
    /// Ready, ControlPlaneReady, WorkersReady, Upgrading, Scaling, Degraded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "KubernetesClusterReason::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Where it is, in a word: Provisioning, Running, Scaling, Upgrading, Degraded, Paused, Deleting.
    #[serde(default, deserialize_with = "crate::phase::known_or_none")]
    #[schemars(with = "Option<KubernetesClusterPhase>")]
    pub phase: Option<KubernetesClusterPhase>,
    /// The version the whole cluster runs: the control plane and every pool.
    pub version: Option<String>,
    /// The control plane's version and API servers ready, such as `1.34.4 1/1`.
    pub control_plane: Option<String>,
    /// The version the control plane's API servers run, once they have served: `spec.version`
    /// may not go to an older minor than this.
    pub control_plane_version: Option<String>,
    /// Worker Nodes Ready of those asked for, such as `3/3`.
    pub nodes: Option<String>,
    /// Each pool as its MachineDeployment reports it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolStatus>,
    /// The Secret with the tenant's admin kubeconfig (key `kubeconfig`).
    pub kubeconfig_secret: Option<String>,
    /// The upgrade under way, or the last one.
    pub upgrade: Option<ClusterUpgradeStatus>,
}

/// A pool as its MachineDeployment reports it.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolStatus {
    pub name: String,
    /// Its MachineDeployment.
    pub machine_deployment: String,
    /// The machines the pool should have now (for a scaling pool, what it last scaled to).
    pub desired: i32,
    pub ready: i32,
    /// Machines of the pool's current version and flavor.
    pub updated: i32,
    /// The version its machines are being given.
    pub version: Option<String>,
    /// A scaling pool's machines that hold no pod but DaemonSet and static ones, and since
    /// when: each goes once that is `scaleDownDelaySeconds` ago.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub idle_since: std::collections::BTreeMap<String, Time>,
}

/// An upgrade of the cluster, step by step.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterUpgradeStatus {
    pub from: String,
    pub to: String,
    /// What it does now: `ControlPlane`, `Pool <name>`, or `Done`.
    pub step: String,
    /// The steps finished, in order (`ControlPlane`, then `Pool <name>` for each pool).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finished: Vec<String>,
    pub started_at: Time,
    pub finished_at: Option<Time>,
}

crate::reason::reasons! {
    /// Why a KubernetesCluster's condition is as it is (`status.conditions[].reason`; the CRD schema
    /// lists them).
    KubernetesClusterReason {
        ControlPlaneNotMade,
        ControlPlaneReady,
        ControlPlaneNotReady,
        NoWorkers,
        WorkersReady,
        WorkersNotReady,
        UpToDate,
        ScalingUp,
        ScalingDown,
        NoPoolFits,
        AtMaxReplicas,
        PoolRemovalWaits,
        Steady,
        PoolScaling,
        NameTaken,
        ChildRejected,
        VersionRefused,
        ControlPlaneDegraded,
        AsExpected,
        PoolDegraded,
        Ready,
        SetBack,
        UpgradingControlPlane,
        UpgradingPool,
    }
}
