//! MachineSet: a number of identical Machines, kept in number and repaired.
//!
//! ```yaml
//! apiVersion: noops.dev/v1alpha1
//! kind: MachineSet
//! metadata: { name: team-a-workers }
//! spec:
//!   clusterName: team-a
//!   replicas: 2
//!   selector: { matchLabels: { pool: workers } }
//!   template:
//!     metadata: { labels: { pool: workers } }
//!     spec: { version: "1.34", flavor: { cpu: 2, memory: 2Gi } }
//! ```
//!
//! Too few machines: new ones are made from the template. Too many: the ones to go are chosen
//! unhealthy first, then those marked with the annotation `noops.dev/delete-machine`, then by
//! `deletePolicy`. A machine whose Node stays NotReady longer than
//! `healthCheck.unhealthyTimeoutSeconds`, or that has not joined within
//! `startupTimeoutSeconds`, or whose VM is gone, is replaced, unless more than
//! `healthCheck.maxUnhealthy` of the set are unhealthy at once: then the cause is probably not
//! the machines, nothing is deleted, and a condition says so. Usually made by a
//! MachineDeployment, one per template.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::machine::MachineTemplateSpec;

/// The annotation that marks a Machine to go first when its set shrinks.
pub const DELETE_MACHINE_ANNOTATION: &str = "noops.dev/delete-machine";

/// The desired state of a set of machines.
#[skip_serializing_none]
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "noops.dev",
    version = "v1alpha1",
    kind = "MachineSet",
    plural = "machinesets",
    shortname = "ms",
    category = "noops",
    namespaced,
    status = "MachineSetStatus",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    validation = Rule::new("self.metadata.name.size() <= 50").message("a MachineSet name is at most 50 characters: its machines add a suffix of their own and name Nodes"),
    validation = Rule::new("self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("a MachineSet name must be a DNS label (lower-case letters, digits and '-'): its machines' names start with it"),
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterName"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Available","type":"integer","jsonPath":".status.availableReplicas"}"#,
    printcolumn = r#"{"name":"Deleting","type":"integer","jsonPath":".status.deletingReplicas"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.template.spec.version"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("self.clusterName == oldSelf.clusterName").message("clusterName is immutable"))]
#[x_kube(validation = Rule::new("self.selector == oldSelf.selector").message("selector is immutable: it says which machines the set owns"))]
#[x_kube(validation = Rule::new("self.selector.matchLabels.all(k, has(self.template.metadata.labels) && k in self.template.metadata.labels && self.template.metadata.labels[k] == self.selector.matchLabels[k])").message("selector.matchLabels must be among template.metadata.labels: the set would not own the machines it makes"))]
#[serde(rename_all = "camelCase")]
pub struct MachineSetSpec {
    /// The KubernetesControlPlane (in this namespace) whose cluster the machines join.
    #[x_kube(validation = Rule::new("self.size() <= 35 && self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("clusterName must name a KubernetesControlPlane: a DNS label of at most 35 characters"))]
    pub cluster_name: String,
    /// How many machines.
    #[serde(default = "default_replicas")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 100").message("replicas must be between 0 and 100"))]
    pub replicas: i32,
    /// Which Machines belong to the set.
    pub selector: MachineSelector,
    /// What each machine is.
    pub template: MachineTemplate,
    /// Which machines go first when the set shrinks (after unhealthy and marked ones).
    #[serde(default)]
    pub delete_policy: DeletePolicy,
    /// When a machine counts as broken, and how many may be repaired at once.
    #[serde(default)]
    pub health_check: HealthCheckSpec,
    /// The operator changes nothing of the set while true: no machine made, deleted or
    /// repaired; its status is still reported.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// True while machines of the set (or of a deployment's sets) are being deleted; reason
/// `DrainHeld` when a PodDisruptionBudget holds one's drain, its message naming the machine,
/// the pods and the budgets.
pub const MACHINES_DELETING: &str = "MachinesDeleting";

pub(crate) fn default_replicas() -> i32 {
    1
}

/// Labels a Machine must have to belong.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineSelector {
    #[schemars(extend("minProperties" = 1, "maxProperties" = 16), inner(length(max = 63)))]
    pub match_labels: BTreeMap<String, String>,
}

/// A machine to make: its labels and annotations, and its spec.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineTemplate {
    #[serde(default)]
    pub metadata: TemplateMetadata,
    pub spec: MachineTemplateSpec,
}

/// Labels and annotations of a templated object.
#[skip_serializing_none]
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    #[schemars(extend("maxProperties" = 32), inner(length(max = 63)))]
    pub labels: Option<BTreeMap<String, String>>,
    #[schemars(extend("maxProperties" = 32), inner(length(max = 4096)))]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// The order in which machines go when a set shrinks.
#[derive(JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeletePolicy {
    /// Any of them (Cluster API's default).
    #[default]
    Random,
    /// The oldest first.
    Oldest,
    /// The newest first.
    Newest,
}

/// When a machine counts as broken and is replaced.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheckSpec {
    /// A machine whose Node is NotReady or Unknown this long is replaced.
    #[serde(default = "default_unhealthy_timeout")]
    #[x_kube(validation = Rule::new("self >= 10 && self <= 86400").message("healthCheck.unhealthyTimeoutSeconds must be between 10 and 86400"))]
    pub unhealthy_timeout_seconds: i64,
    /// A machine whose Node has not joined this long after it was made is replaced.
    #[serde(default = "default_startup_timeout")]
    #[x_kube(validation = Rule::new("self >= 30 && self <= 86400").message("healthCheck.startupTimeoutSeconds must be between 30 and 86400"))]
    pub startup_timeout_seconds: i64,
    /// Repair stops while more machines than this are unhealthy at once: a number, or a
    /// percentage of the set (rounded up).
    #[serde(default = "default_max_unhealthy")]
    #[schemars(extend("maxLength" = 4))]
    #[x_kube(validation = Rule::new("type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')").message("healthCheck.maxUnhealthy must be a number of machines (0 or more) or a percentage from 0% to 100%"))]
    pub max_unhealthy: IntOrString,
}

fn default_unhealthy_timeout() -> i64 {
    300
}
fn default_startup_timeout() -> i64 {
    600
}
fn default_max_unhealthy() -> IntOrString {
    IntOrString::String("40%".into())
}

impl Default for HealthCheckSpec {
    fn default() -> Self {
        Self {
            unhealthy_timeout_seconds: default_unhealthy_timeout(),
            startup_timeout_seconds: default_startup_timeout(),
            max_unhealthy: default_max_unhealthy(),
        }
    }
}

/// The observed state of a set of machines.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetStatus {
    pub observed_generation: Option<i64>,
    /// Ready, Progressing, Degraded, and Remediating (false with the reason repair is held).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "MachineSetReason::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Machines that exist (not being deleted).
    pub replicas: Option<i32>,
    /// Machines whose Node is Ready.
    pub ready_replicas: Option<i32>,
    /// Ready machines that are not being replaced.
    pub available_replicas: Option<i32>,
    /// Machines being deleted (drained, then removed): not counted above, and not gone yet.
    pub deleting_replicas: Option<i32>,
    /// The selector as a string, for the scale subresource.
    pub selector: Option<String>,
    /// How many machine names the set has used: new machines are named from here on, so that
    /// a name is not given twice.
    pub next_index: Option<i64>,
}

crate::reason::reasons! {
    /// Why a MachineSet's condition is as it is (`status.conditions[].reason`; the CRD schema
    /// lists them).
    MachineSetReason {
        AllMachinesReady,
        MachinesNotReady,
        AsExpected,
        WithinMaxUnhealthy,
        NoneDeleting,
        Deleting,
        TooManyUnhealthy,
        RepairsUnderWay,
        MachinesDegraded,
        Scaling,
        Steady,
        DrainHeld,
    }
}
