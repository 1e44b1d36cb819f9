//! Names and labels derived from one Machine.

use std::collections::BTreeMap;

use noops_api::Machine;

use crate::control_plane::names::API_SERVER_PORT;
use crate::core::labels;

/// The label that names the Machine a VM pod or bootstrap Secret belongs to.
pub const MACHINE_LABEL: &str = "noops.dev/machine";
/// The label that names the cluster (its KubernetesControlPlane) of a machine's objects, and of
/// the Machines a MachineSet makes. Not the control plane's own label: its controller does not
/// watch machines.
pub const CLUSTER_LABEL: &str = "noops.dev/cluster";
/// Held on a Machine until its Node is drained and its VM deleted.
pub const FINALIZER: &str = "noops.dev/machine";
/// The provider's scheme in a providerID.
pub const PROVIDER_SCHEME: &str = "noops";

/// Names derived from one machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub machine: String,
    pub namespace: String,
    pub cluster: String,
}

impl Names {
    pub fn of(machine: &Machine) -> Self {
        Self {
            machine: machine.metadata.name.clone().unwrap_or_default(),
            namespace: machine.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            cluster: machine.spec.cluster_name.clone(),
        }
    }

    /// The tenant's Node, and the VM's hostname.
    pub fn node(&self) -> String {
        self.machine.clone()
    }

    /// The VM: a pod of this cluster.
    pub fn vm_pod(&self) -> String {
        self.machine.clone()
    }

    /// The Secret with what the VM joins the tenant with (its certificates and kubeconfigs).
    pub fn bootstrap_secret(&self) -> String {
        format!("{}-bootstrap", self.machine)
    }

    /// Which VM the machine is, as the provider and the tenant's Node name it.
    pub fn provider_id(&self) -> String {
        format!("{PROVIDER_SCHEME}://{}/{}", self.namespace, self.machine)
    }

    /// The control plane's API as the VM reaches it: its Service's DNS name (which the API
    /// server's certificate names).
    pub fn api_server_url(&self) -> String {
        format!("https://{}.{}.svc:{API_SERVER_PORT}", self.cluster, self.namespace)
    }

    /// The labels of the VM pod and the bootstrap Secret: managed by noops, of this machine and
    /// of its cluster.
    pub fn labels(&self, component: &str) -> BTreeMap<String, String> {
        let mut labels = labels::child(&self.cluster, MACHINE_LABEL, &self.machine, Some(component));
        labels.insert(CLUSTER_LABEL.into(), self.cluster.clone());
        labels
    }
}
