//! The cluster's Services. Pure.
//!
//! - `<cluster>` (headless, addresses published before Ready): the stable DNS names members
//!   reach each other at, `<member>.<cluster>.<ns>.svc`.
//! - `<cluster>-client`: what clients use; only Ready members answer behind it.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::names::{CLIENT_PORT, Names, PEER_PORT};

fn port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::String(name.into())),
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

fn service(name: String, names: &Names, owner: &OwnerReference, spec: ServiceSpec) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(names.namespace.clone()),
            labels: Some(names.cluster_labels()),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(names.selector()),
            ..spec
        }),
        status: None,
    }
}

/// The headless Service behind the members' DNS names.
pub fn peer_service(names: &Names, owner: &OwnerReference) -> Service {
    service(
        names.peer_service(),
        names,
        owner,
        ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            ports: Some(vec![port("client", CLIENT_PORT), port("peer", PEER_PORT)]),
            ..Default::default()
        },
    )
}

/// The Service clients use.
pub fn client_service(names: &Names, owner: &OwnerReference) -> Service {
    service(
        names.client_service(),
        names,
        owner,
        ServiceSpec {
            ports: Some(vec![port("client", CLIENT_PORT)]),
            ..Default::default()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::fixtures;

    #[test]
    fn peers_find_each_other_before_ready_and_clients_only_ready_members() {
        let names = Names::of(&fixtures::cluster().build());
        let peers = peer_service(&names, &fixtures::owner());
        let spec = peers.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        let client = client_service(&names, &fixtures::owner());
        assert_eq!(client.metadata.name.as_deref(), Some("main-client"));
        assert_eq!(client.spec.unwrap().publish_not_ready_addresses, None);
    }
}
