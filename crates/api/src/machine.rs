//! Machine: one worker node of a tenant's cluster (a KubernetesControlPlane of this operator).
//!
//! ```yaml
//! apiVersion: noops.dev/v1alpha1
//! kind: Machine
//! metadata: { name: team-a-worker-1 }
//! spec:
//!   clusterName: team-a            # the KubernetesControlPlane it joins (same namespace)
//!   version: "1.34"                # its kubelet and kube-proxy; never newer than the API server
//!   flavor: { cpu: 2, memory: 2Gi, pods: 110 }
//! ```
//!
//! The machine's "VM" is made by a provider: the one noops has makes it a privileged pod of this
//! cluster (`<name>`) running the node agent as a whole machine and the tenant's kube-proxy,
//! with a kubelet certificate the operator issues. It registers Node `<name>` in the tenant with
//! `providerID` `noops://<namespace>/<name>`. Deleting a Machine cordons and drains its Node
//! through the Eviction API (PodDisruptionBudgets hold), deletes the Node, then the VM.
//! Machines are usually made by a MachineSet, itself made by a MachineDeployment.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

/// Degraded's reason for a drain a PodDisruptionBudget has held for minutes (and, higher up,
/// the reason of a MachineSet's or MachineDeployment's `MachinesDeleting` while one holds a
/// drain).
pub const DRAIN_HELD: &str = MachineReason::DrainHeld.as_str();

/// The desired state of one worker machine.
#[skip_serializing_none]
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "noops.dev",
    version = "v1alpha1",
    kind = "Machine",
    plural = "machines",
    shortname = "ma",
    category = "noops",
    namespaced,
    status = "MachineStatus",
    validation = Rule::new("self.metadata.name.size() <= 63").message("a Machine name is at most 63 characters: it names the tenant's Node"),
    validation = Rule::new("self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("a Machine name must be a DNS label (lower-case letters, digits and '-'): it names the tenant's Node and the machine's pod"),
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterName"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.nodeName"}"#,
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".status.address"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.version"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("self.clusterName == oldSelf.clusterName").message("clusterName is immutable: a machine joins one cluster for its whole life"))]
#[x_kube(validation = Rule::new("self.version == oldSelf.version && self.flavor == oldSelf.flavor && (has(self.image) == has(oldSelf.image)) && (!has(self.image) || self.image == oldSelf.image)").message("version, flavor and image are immutable: machines are replaced, not changed (edit the MachineDeployment's template)"))]
#[x_kube(validation = Rule::new("!has(oldSelf.providerID) || (has(self.providerID) && self.providerID == oldSelf.providerID)").message("providerID is immutable once the provider set it"))]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    /// The KubernetesControlPlane (in this namespace) whose cluster the machine joins.
    #[x_kube(validation = Rule::new("self.size() <= 35 && self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("clusterName must name a KubernetesControlPlane: a DNS label of at most 35 characters"))]
    pub cluster_name: String,
    #[serde(flatten)]
    pub template: MachineTemplateSpec,
    /// Which VM of the provider this machine is (`noops://<namespace>/<name>`), set by the
    /// operator once the VM exists; the Node reports the same.
    #[serde(rename = "providerID")]
    #[schemars(length(max = 253))]
    pub provider_id: Option<String>,
    /// The operator changes nothing of the machine while true: no VM made, replaced or
    /// removed, no Node drained (a deletion waits); its status is still reported.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// What a machine is made of: the part of a Machine that a MachineSet's template gives.
#[skip_serializing_none]
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineTemplateSpec {
    /// The Kubernetes version of its kubelet and kube-proxy: a minor such as `"1.34"` (the
    /// newest patch of it the operator knows) or an exact version such as `"1.34.4"`. Never
    /// newer than the control plane, nor more than one minor older.
    #[schemars(length(max = 16))]
    #[x_kube(validation = crate::version_rules::kubernetes_version())]
    #[x_kube(validation = crate::version_rules::supported_version())]
    pub version: String,
    /// The machine's size, as its Node reports it to the scheduler.
    #[serde(default)]
    pub flavor: FlavorSpec,
    /// The machine image, instead of the provider's for the version (`noops/node:v<version>`).
    #[schemars(length(min = 1, max = 255))]
    #[x_kube(validation = Rule::new("!self.contains(' ')").message("image must be an image reference such as noops/node:v1.34.4"))]
    pub image: Option<String>,
    /// How long a drain may wait for a Node that cannot be reached (its agent silent) before
    /// its pods are deleted without eviction. A reachable Node is drained only by evictions,
    /// however long PodDisruptionBudgets make it wait.
    #[serde(default = "default_drain_timeout_seconds")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 86400").message("nodeDrainTimeoutSeconds must be between 0 and 86400 (a day)"))]
    pub node_drain_timeout_seconds: i64,
}

fn default_drain_timeout_seconds() -> i64 {
    300
}

/// A machine's size.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FlavorSpec {
    /// CPUs.
    #[serde(default = "default_cpu")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 64").message("flavor.cpu must be between 1 and 64"))]
    pub cpu: i32,
    /// Memory, a quantity such as `2Gi` or `512Mi`.
    #[serde(default = "default_memory")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+(Mi|Gi)$')").message("flavor.memory must be a whole number of Mi or Gi, such as 2Gi or 512Mi"))]
    #[x_kube(validation = Rule::new("!self.matches('^[0-9]+(Mi|Gi)$') || quantity(self).compareTo(quantity('256Mi')) >= 0").message("flavor.memory must be at least 256Mi"))]
    #[x_kube(validation = Rule::new("!self.matches('^[0-9]+(Mi|Gi)$') || quantity(self).compareTo(quantity('1024Gi')) <= 0").message("flavor.memory must be at most 1024Gi"))]
    pub memory: String,
    /// Pods the machine takes at most.
    #[serde(default = "default_pods")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 250").message("flavor.pods must be between 1 and 250 (a /24 of pod addresses)"))]
    pub pods: i32,
}

fn default_cpu() -> i32 {
    2
}
fn default_memory() -> String {
    "2Gi".into()
}
fn default_pods() -> i32 {
    110
}

impl Default for FlavorSpec {
    fn default() -> Self {
        Self {
            cpu: default_cpu(),
            memory: default_memory(),
            pods: default_pods(),
        }
    }
}

impl FlavorSpec {
    /// The memory in MiB (the schema allows only whole Mi or Gi).
    pub fn memory_mib(&self) -> Option<u64> {
        if let Some(gi) = self.memory.strip_suffix("Gi") {
            gi.parse::<u64>().ok().map(|g| g * 1024)
        } else {
            self.memory.strip_suffix("Mi").and_then(|m| m.parse().ok())
        }
    }
}

crate::phase::phases! {
    /// Where a machine is in its life.
    MachinePhase {
        /// Waiting for what it needs (its control plane, a version it may run).
        Pending,
        /// Its VM is being made.
        Provisioning,
        /// Its VM runs; its Node has not joined yet.
        Provisioned,
        /// Its Node has joined.
        Running,
        /// Being drained and removed.
        Deleting,
        /// Its VM is gone or cannot start; a MachineSet replaces it.
        Failed,
    }
}

/// The observed state of a machine.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// The generation of the spec this status describes.
    pub observed_generation: Option<i64>,
    /// Ready (its Node is Ready), NodeHealthy, DrainingSucceeded (with the pods that block
    /// a drain), Progressing, Degraded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "MachineReason::conditions_schema")]
    pub conditions: Vec<Condition>,
    pub phase: Option<MachinePhase>,
    /// The tenant's Node.
    pub node_name: Option<String>,
    /// The machine's address (its Node's InternalIP).
    pub address: Option<String>,
    /// The kubelet version its Node reports.
    pub version: Option<String>,
    /// Why the machine failed, in a word, and what happened.
    pub failure_reason: Option<String>,
    pub failure_message: Option<String>,
    /// When its drain started: a restarted operator goes on with the same deadline.
    pub drain_started_at: Option<Time>,
    /// When its Node first joined.
    pub node_joined_at: Option<Time>,
}

crate::reason::reasons! {
    /// Why a Machine's condition is as it is (`status.conditions[].reason`; the CRD schema
    /// lists them).
    MachineReason {
        NodeReady,
        AsExpected,
        NodeNotReady,
        NodeGone,
        NodeNotJoined,
        EvictionBlocked,
        Draining,
        ClusterUnreachable,
        DrainedWithoutEviction,
        Drained,
        DrainHeld,
        NodeStarting,
        Deleting,
        Provisioning,
        Provisioned,
        MachineFailed,
        Pending,
        VmCannotStart,
        ClusterNotFound,
        InvalidVersion,
        ControlPlaneNotReady,
        VersionTooNew,
        VersionTooOld,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_read_in_mebibytes() {
        let mut f = FlavorSpec::default();
        assert_eq!(f.memory_mib(), Some(2048));
        f.memory = "512Mi".into();
        assert_eq!(f.memory_mib(), Some(512));
        f.memory = "2GB".into();
        assert_eq!(f.memory_mib(), None);
    }
}
