//! The Service clients connect to: `<name>`, port 5432, in front of the instance once it is
//! Ready (which it is only once its data directory is there and the server accepts
//! connections). Pure.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use noops_api::PostgreSQL;
use noops_api::postgres::ServiceType;

use super::names::{Names, PORT};

pub fn build(pg: &PostgreSQL, names: &Names, owner: &OwnerReference) -> Service {
    let exposure = &pg.spec.service;
    let type_ = match exposure.type_ {
        ServiceType::ClusterIP => "ClusterIP",
        ServiceType::NodePort => "NodePort",
    };
    Service {
        metadata: ObjectMeta {
            name: Some(names.service()),
            namespace: Some(names.namespace.clone()),
            labels: Some(names.labels()),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some(type_.into()),
            selector: Some(names.selector()),
            ports: Some(vec![ServicePort {
                name: Some("postgres".into()),
                port: PORT,
                target_port: Some(IntOrString::String("postgres".into())),
                protocol: Some("TCP".into()),
                node_port: exposure.node_port.filter(|_| exposure.type_ == ServiceType::NodePort),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::fixtures::{owner, postgres};

    #[test]
    fn cluster_ip_by_default_and_node_port_on_request() {
        let mut pg = postgres("shop");
        let service = build(&pg, &Names::of(&pg), &owner()).spec.unwrap();
        assert_eq!(service.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(service.ports.unwrap()[0].node_port, None);
        pg.spec.service.type_ = ServiceType::NodePort;
        pg.spec.service.node_port = Some(30432);
        let service = build(&pg, &Names::of(&pg), &owner()).spec.unwrap();
        assert_eq!(service.type_.as_deref(), Some("NodePort"));
        assert_eq!(service.ports.unwrap()[0].node_port, Some(30432));
    }
}
