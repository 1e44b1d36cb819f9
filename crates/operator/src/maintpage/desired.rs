//! The objects a MaintPage owns, built from its spec and the switch plan. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, PodSpec, PodTemplateSpec, Probe, Service, ServicePort, ServiceSpec as CoreServiceSpec,
    TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use noops_api::maintpage::{MaintPage, ServiceType, Side};

use super::switch::Plan;
use crate::core::apply::{same_stamp, stamp};

/// Label keys (the recommended `app.kubernetes.io` set).
pub const NAME_LABEL: &str = "app.kubernetes.io/name";
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "noops";
/// The MaintPage an object belongs to.
pub const OWNER_LABEL: &str = "noops.dev/maintpage";
/// The name of the container port both sides serve on; the Service targets it by name.
const PORT_NAME: &str = "http";

/// Everything a MaintPage owns.
#[derive(Debug, Clone, PartialEq)]
pub struct Children {
    pub app: Deployment,
    pub maintenance: Deployment,
    pub service: Service,
}

fn labels(mp: &MaintPage, side: Option<Side>) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (NAME_LABEL.to_string(), mp.spec.app.name.clone()),
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
        (OWNER_LABEL.to_string(), mp.metadata.name.clone().unwrap_or_default()),
    ]);
    if let Some(side) = side {
        labels.insert(COMPONENT_LABEL.to_string(), side.component().to_string());
    }
    labels
}

/// The pods of one side.
pub fn selector(mp: &MaintPage, side: Side) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME_LABEL.to_string(), mp.spec.app.name.clone()),
        (COMPONENT_LABEL.to_string(), side.component().to_string()),
    ])
}

fn meta(mp: &MaintPage, name: String, side: Option<Side>, owner: &OwnerReference) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: mp.metadata.namespace.clone(),
        labels: Some(labels(mp, side)),
        owner_references: Some(vec![owner.clone()]),
        ..Default::default()
    }
}

fn deployment(
    mp: &MaintPage,
    side: Side,
    owner: &OwnerReference,
    image: &str,
    args: &Option<Vec<String>>,
    port: i32,
    replicas: i32,
) -> Deployment {
    let name = match side {
        Side::App => mp.spec.app.name.clone(),
        Side::Maintenance => mp.spec.maintenance_name(),
    };
    let container = Container {
        name: side.component().to_string(),
        image: Some(image.to_string()),
        args: args.clone(),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.into()),
            container_port: port,
            ..Default::default()
        }]),
        // Ready means accepting connections: the Service only switches to pods that are.
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::String(PORT_NAME.into()),
                host: None,
            }),
            period_seconds: Some(1),
            failure_threshold: Some(3),
            ..Default::default()
        }),
        ..Default::default()
    };
    Deployment {
        metadata: meta(mp, name, Some(side), owner),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector(mp, side)),
                match_expressions: None,
            },
            // Never fewer serving pods than asked for during a rollout.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(mp, Some(side))),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// Builds every child of `mp` for `plan`. `owner` is the controller reference to `mp`.
pub fn build(mp: &MaintPage, plan: &Plan, owner: &OwnerReference) -> Children {
    let spec = &mp.spec;
    let app = deployment(
        mp,
        Side::App,
        owner,
        &spec.app.image,
        &spec.app.args,
        spec.app.port,
        spec.app.replicas,
    );
    let maintenance = deployment(
        mp,
        Side::Maintenance,
        owner,
        &spec.maintenance.image,
        &spec.maintenance.args,
        spec.maintenance.port,
        plan.maintenance_replicas,
    );
    let node_port = match spec.service.type_ {
        ServiceType::NodePort => spec.service.node_port,
        ServiceType::ClusterIP => None,
    };
    let service = Service {
        metadata: meta(mp, spec.app.name.clone(), None, owner),
        spec: Some(CoreServiceSpec {
            type_: Some(match spec.service.type_ {
                ServiceType::ClusterIP => "ClusterIP".into(),
                ServiceType::NodePort => "NodePort".into(),
            }),
            selector: Some(selector(mp, plan.publish)),
            ports: Some(vec![ServicePort {
                name: Some(PORT_NAME.into()),
                port: spec.service.port,
                target_port: Some(IntOrString::String(PORT_NAME.into())),
                node_port,
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    };
    Children {
        app,
        maintenance,
        service,
    }
}

/// Whether a Deployment has rolled out `replicas` pods that are all Ready.
pub fn rolled_out(deployment: Option<&Deployment>, replicas: i32) -> bool {
    let Some(d) = deployment else { return false };
    let Some(status) = &d.status else { return false };
    let spec_replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let current = status.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0);
    replicas > 0
        && spec_replicas == replicas
        && current
        && status.updated_replicas.unwrap_or(0) == replicas
        && status.ready_replicas.unwrap_or(0) >= replicas
        && status.available_replicas.unwrap_or(0) >= replicas
        && status.unavailable_replicas.unwrap_or(0) == 0
}

/// Ready pods of a Deployment.
pub fn ready_replicas(deployment: Option<&Deployment>) -> i32 {
    deployment
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
}

/// The side a live Service selects, if it selects one of ours.
pub fn published_side(service: Option<&Service>) -> Option<Side> {
    let selector = service?.spec.as_ref()?.selector.as_ref()?;
    match selector.get(COMPONENT_LABEL).map(String::as_str) {
        Some("app") => Some(Side::App),
        Some("maintenance") => Some(Side::Maintenance),
        _ => None,
    }
}

fn image_of(d: &Deployment) -> Option<&str> {
    d.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .image
        .as_deref()
}

/// Hand-made changes to fields the operator owns, as (Event reason, words). Only a child whose
/// live copy was applied from the same desired state counts: if what the operator wants has
/// changed (a spec edit, a switch), a difference is that change, not a hand edit. `desired`
/// must be stamped. The apply that follows reverts them.
pub fn drift(
    desired: &Children,
    app: Option<&Deployment>,
    maintenance: Option<&Deployment>,
    service: Option<&Service>,
) -> Vec<(&'static str, String)> {
    let mut notes = vec![];
    for (live, want, what) in [
        (app, &desired.app, "app"),
        (maintenance, &desired.maintenance, "maintenance"),
    ] {
        let Some(live) = live.filter(|l| same_stamp(want, *l)) else {
            continue;
        };
        let Some(wanted) = image_of(want) else { continue };
        if let Some(found) = image_of(live).filter(|found| *found != wanted) {
            let name = live.metadata.name.as_deref().unwrap_or_default();
            let note = format!("image of the {what} Deployment {name} was changed to {found}; set back to {wanted}");
            notes.push(("ImageReverted", note));
        }
    }
    if let Some(live) = service.filter(|l| same_stamp(&desired.service, *l)) {
        let wanted = desired.service.spec.as_ref().and_then(|s| s.selector.clone());
        let found = live.spec.as_ref().and_then(|s| s.selector.clone());
        if found != wanted {
            let name = live.metadata.name.as_deref().unwrap_or_default();
            let note = format!("selector of the Service {name} was changed to {found:?}; set back to {wanted:?}");
            notes.push(("SelectorReverted", note));
        }
    }
    notes
}

/// Stamps every child with the hash of its desired state.
pub fn stamp_all(children: &mut Children) {
    stamp(&mut children.app);
    stamp(&mut children.maintenance);
    stamp(&mut children.service);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maintpage::switch::Plan;
    use k8s_openapi::api::apps::v1::DeploymentStatus;
    use noops_api::maintpage::{AppSpec, MaintPageSpec, MaintenanceSpec, ServiceSpec};

    fn mp() -> MaintPage {
        let mut mp = MaintPage::new(
            "shop",
            MaintPageSpec {
                app: AppSpec {
                    name: "shop".into(),
                    image: "app:1".into(),
                    args: Some(vec!["-text=hi".into()]),
                    port: 5678,
                    replicas: 2,
                },
                maintenance: MaintenanceSpec {
                    image: "page:1".into(),
                    args: None,
                    port: 8080,
                    replicas: 1,
                    enabled: false,
                },
                service: ServiceSpec::default(),
            },
        );
        mp.metadata.namespace = Some("web".into());
        mp.metadata.uid = Some("uid-1".into());
        mp
    }

    fn plan(publish: Side, maintenance_replicas: i32) -> Plan {
        Plan {
            publish,
            switched: false,
            switched_at: None,
            waiting_for: None,
            maintenance_replicas,
            requeue_after: None,
        }
    }

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "noops.dev/v1alpha1".into(),
            kind: "MaintPage".into(),
            name: "shop".into(),
            uid: "uid-1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    #[test]
    fn children_are_named_labelled_owned_and_selected() {
        let c = build(&mp(), &plan(Side::Maintenance, 1), &owner());
        assert_eq!(c.app.metadata.name.as_deref(), Some("shop"));
        assert_eq!(c.maintenance.metadata.name.as_deref(), Some("shop-maintenance"));
        assert_eq!(c.app.spec.as_ref().unwrap().replicas, Some(2));
        let container = &c.app.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0];
        assert_eq!(container.image.as_deref(), Some("app:1"));
        assert_eq!(container.ports.as_ref().unwrap()[0].container_port, 5678);
        assert_eq!(published_side(Some(&c.service)), Some(Side::Maintenance));
        assert_eq!(c.service.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-1");
        assert_eq!(c.service.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port, 80);
    }

    #[test]
    fn readiness_needs_a_complete_rollout() {
        let mut d = build(&mp(), &plan(Side::App, 0), &owner()).app;
        d.metadata.generation = Some(3);
        assert!(!rolled_out(Some(&d), 2), "no status yet");
        d.status = Some(DeploymentStatus {
            observed_generation: Some(3),
            replicas: Some(2),
            updated_replicas: Some(2),
            ready_replicas: Some(2),
            available_replicas: Some(2),
            ..Default::default()
        });
        assert!(rolled_out(Some(&d), 2));
        assert!(!rolled_out(Some(&d), 3), "spec replicas differ from what is asked");
        d.status.as_mut().unwrap().observed_generation = Some(2);
        assert!(!rolled_out(Some(&d), 2), "controller has not seen the latest spec");
        assert!(!rolled_out(None, 1));
    }

    #[test]
    fn hand_edits_are_described_but_spec_changes_are_not() {
        let mut desired = build(&mp(), &plan(Side::App, 0), &owner());
        stamp_all(&mut desired);
        let mut edited = desired.app.clone();
        edited.spec.as_mut().unwrap().template.spec.as_mut().unwrap().containers[0].image = Some("evil:2".into());
        let mut service = desired.service.clone();
        service.spec.as_mut().unwrap().selector = Some(selector(&mp(), Side::Maintenance));
        let notes = drift(&desired, Some(&edited), Some(&desired.maintenance), Some(&service));
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert_eq!(notes[0].0, "ImageReverted");
        assert!(notes[0].1.contains("changed to evil:2; set back to app:1"));
        assert_eq!(notes[1].0, "SelectorReverted");

        // The user changes the image in the spec, and a switch moves the selector: both make
        // the live children differ from the new desired ones, and neither is a hand edit.
        let mut changed = mp();
        changed.spec.app.image = "app:2".into();
        let mut next = build(&changed, &plan(Side::Maintenance, 1), &owner());
        stamp_all(&mut next);
        assert!(
            drift(
                &next,
                Some(&desired.app),
                Some(&desired.maintenance),
                Some(&desired.service)
            )
            .is_empty()
        );
    }
}
