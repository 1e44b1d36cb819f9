//! The Machine a MachineSet makes from its template. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use noops_api::machine::{Machine, MachineSpec};
use noops_api::machine_set::MachineSet;

use crate::core::labels;
use crate::machine::names::CLUSTER_LABEL;

/// The label naming the MachineSet a Machine belongs to.
pub const MACHINE_SET_LABEL: &str = "noops.dev/machineset";

/// Machine `name` of `set`, owned by it.
pub fn machine(set: &MachineSet, name: &str, owner: &OwnerReference) -> Machine {
    let template = &set.spec.template;
    let mut machine_labels = template.metadata.labels.clone().unwrap_or_default();
    machine_labels.insert(MACHINE_SET_LABEL.into(), set.metadata.name.clone().unwrap_or_default());
    machine_labels.insert(CLUSTER_LABEL.into(), set.spec.cluster_name.clone());
    machine_labels.insert(labels::MANAGED_BY.into(), labels::MANAGER.into());
    Machine {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: set.metadata.namespace.clone(),
            labels: Some(machine_labels),
            annotations: template.metadata.annotations.clone(),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        spec: MachineSpec {
            cluster_name: set.spec.cluster_name.clone(),
            template: template.spec.clone(),
            provider_id: None,
            paused: false,
        },
        status: None,
    }
}
