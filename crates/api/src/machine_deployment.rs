//! MachineDeployment: worker machines rolled out like a Deployment's pods.
//!
//! ```yaml
//! apiVersion: noops.dev/v1alpha1
//! kind: MachineDeployment
//! metadata: { name: team-a-workers }
//! spec:
//!   clusterName: team-a
//!   replicas: 3
//!   selector: { matchLabels: { pool: workers } }
//!   template:
//!     metadata: { labels: { pool: workers } }
//!     spec: { version: "1.34", flavor: { cpu: 2, memory: 2Gi } }
//! ```
//!
//! Each template gets a MachineSet of its own. A new template rolls out with `RollingUpdate`
//! (by default one machine more, none fewer: a new machine is Running before an old one is
//! drained and deleted) or waits for machines to be deleted by hand (`OnDelete`). A rollout
//! whose new machines do not become Running within `progressDeadlineSeconds` stalls with a
//! reason and leaves the old machines alone; it never rolls back by itself. `kubectl scale`
//! works on it, as an autoscaler would.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::machine_set::{DeletePolicy, HealthCheckSpec, MachineSelector, MachineTemplate, default_replicas};

/// The desired state of a pool of machines.
#[skip_serializing_none]
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "noops.dev",
    version = "v1alpha1",
    kind = "MachineDeployment",
    plural = "machinedeployments",
    shortname = "md",
    category = "noops",
    namespaced,
    status = "MachineDeploymentStatus",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    validation = Rule::new("self.metadata.name.size() <= 40").message("a MachineDeployment name is at most 40 characters: its MachineSets and machines add suffixes and name Nodes"),
    validation = Rule::new("self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("a MachineDeployment name must be a DNS label (lower-case letters, digits and '-')"),
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterName"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Updated","type":"integer","jsonPath":".status.updatedReplicas"}"#,
    printcolumn = r#"{"name":"Deleting","type":"integer","jsonPath":".status.deletingReplicas"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.template.spec.version"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("self.clusterName == oldSelf.clusterName").message("clusterName is immutable"))]
#[x_kube(validation = Rule::new("self.selector == oldSelf.selector").message("selector is immutable: it says which machines the deployment owns"))]
#[x_kube(validation = Rule::new("self.selector.matchLabels.all(k, has(self.template.metadata.labels) && k in self.template.metadata.labels && self.template.metadata.labels[k] == self.selector.matchLabels[k])").message("selector.matchLabels must be among template.metadata.labels: the deployment would not own the machines it makes"))]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentSpec {
    /// The KubernetesControlPlane (in this namespace) whose cluster the machines join.
    #[x_kube(validation = Rule::new("self.size() <= 35 && self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("clusterName must name a KubernetesControlPlane: a DNS label of at most 35 characters"))]
    pub cluster_name: String,
    /// How many machines.
    #[serde(default = "default_replicas")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 100").message("replicas must be between 0 and 100"))]
    pub replicas: i32,
    /// Which Machines belong to the deployment.
    pub selector: MachineSelector,
    /// What each machine is; a change rolls out new machines.
    pub template: MachineTemplate,
    /// How a new template replaces the machines.
    #[serde(default)]
    pub strategy: StrategySpec,
    /// A rollout whose new machines are not all Running this long after it last made progress
    /// stalls (condition Progressing False, reason ProgressDeadlineExceeded).
    #[serde(default = "default_progress_deadline")]
    #[x_kube(validation = Rule::new("self >= 30 && self <= 86400").message("progressDeadlineSeconds must be between 30 and 86400"))]
    pub progress_deadline_seconds: i64,
    /// No rollout while true: no new MachineSet is made and none is scaled (a deployment with
    /// one MachineSet still follows `replicas`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rollout_paused: bool,
    /// The operator changes nothing of the deployment while true: no MachineSet made, scaled
    /// or removed; its status is still reported. (A rollout held while the rest goes on is
    /// `rolloutPaused`.)
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// Which machines go first when the deployment shrinks.
    #[serde(default)]
    pub delete_policy: DeletePolicy,
    /// When a machine counts as broken, and how many may be repaired at once.
    #[serde(default)]
    pub health_check: HealthCheckSpec,
}

pub fn default_progress_deadline() -> i64 {
    600
}

/// How a new template replaces the machines.
#[skip_serializing_none]
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[x_kube(validation = Rule::new("self.type != 'OnDelete' || !has(self.rollingUpdate)").message("strategy.rollingUpdate is only for type RollingUpdate"))]
#[serde(rename_all = "camelCase")]
pub struct StrategySpec {
    #[serde(default, rename = "type")]
    pub type_: StrategyType,
    pub rolling_update: Option<RollingUpdateSpec>,
}

/// `RollingUpdate`, or `OnDelete` (new machines only replace machines deleted by someone).
#[derive(JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StrategyType {
    #[default]
    RollingUpdate,
    OnDelete,
}

/// How far a rolling update may go above and below `replicas`.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("!(type(self.maxSurge) == int ? self.maxSurge == 0 : self.maxSurge == '0%') || !(type(self.maxUnavailable) == int ? self.maxUnavailable == 0 : self.maxUnavailable == '0%')").message("maxSurge and maxUnavailable cannot both be 0, or the rollout could never replace a machine"))]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdateSpec {
    /// Machines above `replicas` while rolling: a number or a percentage (rounded up).
    #[serde(default = "default_max_surge")]
    #[x_kube(validation = Rule::new("type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')").message("maxSurge must be a number of machines (0 or more) or a percentage from 0% to 100%"))]
    pub max_surge: IntOrString,
    /// Machines below `replicas` while rolling: a number or a percentage (rounded down).
    #[serde(default = "default_max_unavailable")]
    #[x_kube(validation = Rule::new("type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')").message("maxUnavailable must be a number of machines (0 or more) or a percentage from 0% to 100%"))]
    pub max_unavailable: IntOrString,
}

fn default_max_surge() -> IntOrString {
    IntOrString::Int(1)
}
fn default_max_unavailable() -> IntOrString {
    IntOrString::Int(0)
}

impl Default for RollingUpdateSpec {
    fn default() -> Self {
        Self {
            max_surge: default_max_surge(),
            max_unavailable: default_max_unavailable(),
        }
    }
}

crate::phase::phases! {
    /// Where a machine deployment is, in a word (`status.phase`).
    MachineDeploymentPhase {
        /// Machines are being added to the number asked for.
        ScalingUp,
        /// Machines are being removed to the number asked for.
        ScalingDown,
        /// Machines of an older template are being replaced by machines of the current one.
        Rolling,
        /// Every machine is of the current template, and there are as many as asked for.
        Running,
        /// A rollout has not progressed within its deadline.
        Stalled,
        /// `spec.paused`, or `spec.rolloutPaused` with a rollout to make: nothing is changed.
        Paused,
    }
}

/// The observed state of a pool of machines.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentStatus {
    pub observed_generation: Option<i64>,
    /// Ready, Available, Progressing (False with ProgressDeadlineExceeded when a rollout
    /// stalls), Degraded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "MachineDeploymentReason::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Where it is, in a word: ScalingUp, ScalingDown, Rolling, Running, Stalled, Paused.
    #[serde(default, deserialize_with = "crate::phase::known_or_none")]
    #[schemars(with = "Option<MachineDeploymentPhase>")]
    pub phase: Option<MachineDeploymentPhase>,
    /// Machines that exist (not being deleted), of every template.
    pub replicas: Option<i32>,
    /// Machines whose Node is Ready.
    pub ready_replicas: Option<i32>,
    /// Machines of the current template.
    pub updated_replicas: Option<i32>,
    /// Ready machines that are not being replaced.
    pub available_replicas: Option<i32>,
    /// Machines being deleted (drained, then removed), of every template: not counted above.
    /// A rollout or a scale-down is done only once they are gone.
    pub deleting_replicas: Option<i32>,
    /// The selector as a string, for the scale subresource.
    pub selector: Option<String>,
    /// The MachineSet of the current template.
    pub current_machine_set: Option<String>,
    /// When the rollout last made progress (a machine made, ready or removed): the progress
    /// deadline counts from here, across operator restarts.
    pub progress_at: Option<Time>,
}

crate::reason::reasons! {
    /// Why a MachineDeployment's condition is as it is (`status.conditions[].reason`; the CRD schema
    /// lists them).
    MachineDeploymentReason {
        NoneDeleting,
        Deleting,
        RolledOut,
        ProgressDeadlineExceeded,
        NewMachineSetAvailable,
        MachineSetUpdated,
        AsExpected,
        MachinesDegraded,
        DrainHeld,
        Rolling,
        Scaling,
        MinimumMachinesAvailable,
        MachinesUnavailable,
    }
}
