//! The MachineSet of a deployment's current template. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use noops_api::machine_deployment::MachineDeployment;
use noops_api::machine_set::{MachineSelector, MachineSet, MachineSetSpec, MachineTemplate, TemplateMetadata};

use super::plan::{TEMPLATE_HASH_LABEL, template_hash};
use crate::core::labels;
use crate::machine::names::CLUSTER_LABEL;

/// The label naming the MachineDeployment a MachineSet belongs to.
pub const MACHINE_DEPLOYMENT_LABEL: &str = "noops.dev/machinedeployment";

/// MachineSet `name` of the deployment's current template, with `replicas`.
pub fn machine_set(md: &MachineDeployment, name: &str, replicas: i32, owner: &OwnerReference) -> MachineSet {
    let hash = template_hash(md);
    let mut selector = md.spec.selector.match_labels.clone();
    selector.insert(TEMPLATE_HASH_LABEL.into(), hash.clone());
    let mut template_labels = md.spec.template.metadata.labels.clone().unwrap_or_default();
    template_labels.insert(TEMPLATE_HASH_LABEL.into(), hash.clone());
    let mut set_labels = template_labels.clone();
    set_labels.insert(
        MACHINE_DEPLOYMENT_LABEL.into(),
        md.metadata.name.clone().unwrap_or_default(),
    );
    set_labels.insert(CLUSTER_LABEL.into(), md.spec.cluster_name.clone());
    set_labels.insert(labels::MANAGED_BY.into(), labels::MANAGER.into());
    MachineSet {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: md.metadata.namespace.clone(),
            labels: Some(set_labels),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        spec: MachineSetSpec {
            cluster_name: md.spec.cluster_name.clone(),
            replicas,
            selector: MachineSelector { match_labels: selector },
            template: MachineTemplate {
                metadata: TemplateMetadata {
                    labels: Some(template_labels),
                    annotations: md.spec.template.metadata.annotations.clone(),
                },
                spec: md.spec.template.spec.clone(),
            },
            delete_policy: md.spec.delete_policy,
            health_check: md.spec.health_check.clone(),
            paused: false,
        },
        status: None,
    }
}
