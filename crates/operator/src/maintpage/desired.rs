//! The objects a MaintPage owns, built from its spec and the switch plan, each stamped with the
//! hash of its desired state. Pure.

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
use crate::core::images::Images;
use crate::core::labels;
use crate::core::stamp::stamp;

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

fn child_labels(mp: &MaintPage, side: Option<Side>) -> BTreeMap<String, String> {
    labels::child(
        &mp.spec.app.name,
        OWNER_LABEL,
        mp.metadata.name.as_deref().unwrap_or_default(),
        side.map(Side::component),
    )
}

/// The pods of one side.
pub fn selector(mp: &MaintPage, side: Side) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::NAME.to_string(), mp.spec.app.name.clone()),
        (labels::COMPONENT.to_string(), side.component().to_string()),
    ])
}

fn meta(mp: &MaintPage, name: String, side: Option<Side>, owner: &OwnerReference) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: mp.metadata.namespace.clone(),
        labels: Some(child_labels(mp, side)),
        owner_references: Some(vec![owner.clone()]),
        ..Default::default()
    }
}

#[allow(clippy::too_many_arguments)]
fn deployment(
    mp: &MaintPage,
    side: Side,
    owner: &OwnerReference,
    image: &str,
    args: &Option<Vec<String>>,
    port: i32,
    replicas: i32,
    images: &Images,
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
                    labels: Some(child_labels(mp, Some(side))),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    // The user's own images: what they need of seccomp is theirs to say.
                    image_pull_secrets: images.image_pull_secrets(),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// Builds every child of `mp` for `plan`, stamped. `owner` is the controller reference to `mp`;
/// `images` gives the pods' pull secrets.
pub fn build(mp: &MaintPage, plan: &Plan, images: &Images, owner: &OwnerReference) -> Children {
    let spec = &mp.spec;
    let app = deployment(
        mp,
        Side::App,
        owner,
        &spec.app.image,
        &spec.app.args,
        spec.app.port,
        spec.app.replicas,
        images,
    );
    let maintenance = deployment(
        mp,
        Side::Maintenance,
        owner,
        &spec.maintenance.image,
        &spec.maintenance.args,
        spec.maintenance.port,
        plan.maintenance_replicas,
        images,
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
    let mut children = Children {
        app,
        maintenance,
        service,
    };
    stamp(&mut children.app);
    stamp(&mut children.maintenance);
    stamp(&mut children.service);
    children
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::stamp::DESIRED_HASH_ANNOTATION;
    use crate::maintpage::fixtures::{self, plan};

    #[test]
    fn children_are_named_labelled_owned_selected_and_stamped() {
        let c = build(
            &fixtures::maintpage().build(),
            &plan(Side::Maintenance, 1),
            &Images::default(),
            &fixtures::owner(),
        );
        assert_eq!(c.app.metadata.name.as_deref(), Some("shop"));
        assert_eq!(c.maintenance.metadata.name.as_deref(), Some("shop-maintenance"));
        assert_eq!(c.app.spec.as_ref().unwrap().replicas, Some(2));
        let container = &c.app.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0];
        assert_eq!(container.image.as_deref(), Some("app:1"));
        assert_eq!(container.ports.as_ref().unwrap()[0].container_port, 5678);
        let selector = c.service.spec.as_ref().unwrap().selector.clone().unwrap();
        assert_eq!(selector[labels::COMPONENT], "maintenance");
        assert_eq!(c.service.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-1");
        assert_eq!(c.service.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port, 80);
        let labels = c.app.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[labels::MANAGED_BY], "noops");
        assert_eq!(labels[OWNER_LABEL], "shop");
        for annotations in [&c.app.metadata.annotations, &c.service.metadata.annotations] {
            assert!(annotations.as_ref().unwrap().contains_key(DESIRED_HASH_ANNOTATION));
        }
    }
}
