//! The Services clients connect to, port 5432, each in front of instances that are Ready
//! (only once their data directory is there and the server accepts connections). Pure.
//! - `<name>` (the name applications have always used) and `<name>-rw`: the primary, selected
//!   by its pod's name, which the StatefulSet puts on the pod: they reach the primary's pod
//!   again when it comes back, whether the operator runs or not;
//! - `<name>-ro`: replicas that stream within the lag bound (their role label, which the
//!   operator keeps);
//! - `<name>-r`: any instance.
//!
//! `spec.service` (a NodePort) applies to `<name>`; the others are inside the cluster.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use noops_api::PostgreSQL;
use noops_api::postgres::ServiceType;

use super::names::{Names, POD_NAME_LABEL, PORT, ROLE_LABEL};
use super::replication::REPLICA;

/// The Services of `pg`, whose primary is pod `primary`: `<name>` first.
pub fn build_all(pg: &PostgreSQL, names: &Names, owner: &OwnerReference, primary: &str) -> Vec<Service> {
    let with = |key: &str, value: &str| {
        let mut selector = names.selector();
        selector.insert(key.into(), value.into());
        selector
    };
    let exposure = &pg.spec.service;
    let node_port = exposure.node_port.filter(|_| exposure.type_ == ServiceType::NodePort);
    let type_ = match exposure.type_ {
        ServiceType::ClusterIP => "ClusterIP",
        ServiceType::NodePort => "NodePort",
    };
    vec![
        service(
            names,
            owner,
            names.service(),
            type_,
            node_port,
            with(POD_NAME_LABEL, primary),
        ),
        service(
            names,
            owner,
            names.service_rw(),
            "ClusterIP",
            None,
            with(POD_NAME_LABEL, primary),
        ),
        service(
            names,
            owner,
            names.service_ro(),
            "ClusterIP",
            None,
            with(ROLE_LABEL, REPLICA),
        ),
        service(names, owner, names.service_r(), "ClusterIP", None, names.selector()),
    ]
}

fn service(
    names: &Names,
    owner: &OwnerReference,
    name: String,
    type_: &str,
    node_port: Option<i32>,
    selector: BTreeMap<String, String>,
) -> Service {
    Service {
        metadata: names.child(name, owner),
        spec: Some(ServiceSpec {
            type_: Some(type_.into()),
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some("postgres".into()),
                port: PORT,
                target_port: Some(IntOrString::String("postgres".into())),
                protocol: Some("TCP".into()),
                node_port,
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
        let services = build_all(&pg, &Names::of(&pg), &owner(), "shop-0");
        let service = services[0].spec.clone().unwrap();
        assert_eq!(service.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(service.ports.unwrap()[0].node_port, None);
        pg.spec.service.type_ = ServiceType::NodePort;
        pg.spec.service.node_port = Some(30432);
        let services = build_all(&pg, &Names::of(&pg), &owner(), "shop-0");
        let service = services[0].spec.clone().unwrap();
        assert_eq!(service.type_.as_deref(), Some("NodePort"));
        assert_eq!(service.ports.unwrap()[0].node_port, Some(30432));
        assert!(
            services[1..]
                .iter()
                .all(|s| s.spec.as_ref().unwrap().type_.as_deref() == Some("ClusterIP")),
            "only <name> is exposed"
        );
    }

    #[test]
    fn the_primary_by_its_pod_name_replicas_by_their_role_and_any_instance() {
        let pg = postgres("shop");
        let services = build_all(&pg, &Names::of(&pg), &owner(), "shop-1");
        let selectors: Vec<(String, BTreeMap<String, String>)> = services
            .iter()
            .map(|s| {
                (
                    s.metadata.name.clone().unwrap(),
                    s.spec.clone().unwrap().selector.unwrap(),
                )
            })
            .collect();
        assert_eq!(selectors[0].0, "shop");
        assert_eq!(selectors[0].1[POD_NAME_LABEL], "shop-1");
        assert_eq!(selectors[1].0, "shop-rw");
        assert_eq!(selectors[1].1[POD_NAME_LABEL], "shop-1");
        assert_eq!(selectors[2].0, "shop-ro");
        assert_eq!(selectors[2].1[ROLE_LABEL], "replica");
        assert_eq!(selectors[3].0, "shop-r");
        assert_eq!(selectors[3].1, Names::of(&pg).selector());
    }
}
