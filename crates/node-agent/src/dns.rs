//! Cluster DNS for pods, served on the node IP (the pods' nameserver).
//!
//! Answers from watched Services and EndpointSlices, as CoreDNS's kubernetes plugin does:
//! - `<svc>.<ns>.svc.<domain>`: the ClusterIP, or the endpoint addresses of a headless Service;
//! - `<hostname>.<svc>.<ns>.svc.<domain>`: one endpoint by hostname (StatefulSet pods);
//! - `<a-b-c-d>.<ns>.pod.<domain>`: that address.
//!
//! Names outside the cluster domain are refused: pods have no way off this machine, so there is
//! nowhere to forward them to.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{Name, RData, Record, RecordType, rdata::A};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::runtime::reflector::Store;

use crate::watch_cache;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tracing::{debug, info};

const TTL: u32 = 5;

/// What a name resolves to.
#[derive(Debug, PartialEq)]
pub enum Lookup {
    /// The name exists; these are its addresses (possibly none).
    Found(Vec<Ipv4Addr>),
    /// In the cluster domain, but no such name.
    NoSuchName,
    /// Not ours to answer.
    Refused,
}

/// Resolves `name` (lower case, no trailing dot) against Services and EndpointSlices.
pub fn lookup(name: &str, domain: &str, services: &[Arc<Service>], slices: &[Arc<EndpointSlice>]) -> Lookup {
    let Some(local) = name.strip_suffix(domain).and_then(|n| n.strip_suffix('.')) else {
        return if name == domain {
            Lookup::Found(vec![])
        } else {
            Lookup::Refused
        };
    };
    let labels: Vec<&str> = local.split('.').collect();
    match labels.as_slice() {
        [svc, ns, "svc"] => service_addresses(svc, ns, None, services, slices),
        [host, svc, ns, "svc"] => service_addresses(svc, ns, Some(host), services, slices),
        [ip, _ns, "pod"] => match ip.replace('-', ".").parse::<Ipv4Addr>() {
            Ok(addr) => Lookup::Found(vec![addr]),
            Err(_) => Lookup::NoSuchName,
        },
        // Names that are only a suffix of real names exist, with no addresses of their own.
        [_, "svc"] | ["svc"] | [_, "pod"] | ["pod"] => Lookup::Found(vec![]),
        _ => Lookup::NoSuchName,
    }
}

fn service_addresses(
    svc: &str,
    ns: &str,
    host: Option<&str>,
    services: &[Arc<Service>],
    slices: &[Arc<EndpointSlice>],
) -> Lookup {
    let Some(service) = services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(svc) && s.metadata.namespace.as_deref() == Some(ns))
    else {
        return Lookup::NoSuchName;
    };
    let spec = service.spec.clone().unwrap_or_default();
    let headless = spec.cluster_ip.as_deref() == Some("None");
    if host.is_none() && !headless {
        return match spec.cluster_ip.as_deref().and_then(|ip| ip.parse().ok()) {
            Some(ip) => Lookup::Found(vec![ip]),
            None => Lookup::Found(vec![]),
        };
    }
    let publish_not_ready = spec.publish_not_ready_addresses.unwrap_or(false);
    let mut addresses = vec![];
    for slice in slices.iter().filter(|s| {
        s.metadata.namespace.as_deref() == Some(ns)
            && s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("kubernetes.io/service-name"))
                .map(String::as_str)
                == Some(svc)
            && s.address_type == "IPv4"
    }) {
        for endpoint in &slice.endpoints {
            let ready = endpoint.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            if !(ready || publish_not_ready) {
                continue;
            }
            if let Some(h) = host
                && endpoint.hostname.as_deref() != Some(h)
            {
                continue;
            }
            addresses.extend(endpoint.addresses.iter().filter_map(|a| a.parse::<Ipv4Addr>().ok()));
        }
    }
    addresses.sort();
    addresses.dedup();
    if host.is_some() && addresses.is_empty() {
        return Lookup::NoSuchName;
    }
    Lookup::Found(addresses)
}

/// The DNS server with its caches of Services and EndpointSlices.
pub struct ClusterDns {
    client: Client,
    domain: String,
}

impl ClusterDns {
    pub fn new(client: Client, domain: String) -> Self {
        Self {
            client,
            domain: domain.trim_end_matches('.').to_lowercase(),
        }
    }

    /// Watches Services and EndpointSlices and serves DNS on `addr` (UDP and TCP).
    pub async fn serve(self, addr: SocketAddr) -> std::io::Result<()> {
        let services = watch_cache::cache::<Service>(self.client.clone(), None);
        let slices = watch_cache::cache::<EndpointSlice>(self.client.clone(), None);
        let udp = Arc::new(UdpSocket::bind(addr).await?);
        let tcp = TcpListener::bind(addr).await?;
        info!(%addr, domain = %self.domain, "cluster DNS listening");
        let resolver = Arc::new(Resolver {
            domain: self.domain,
            services,
            slices,
        });
        let tcp_resolver = resolver.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = tcp.accept().await else {
                    continue;
                };
                let resolver = tcp_resolver.clone();
                tokio::spawn(async move {
                    let mut len = [0u8; 2];
                    while stream.read_exact(&mut len).await.is_ok() {
                        let mut query = vec![0u8; u16::from_be_bytes(len) as usize];
                        if stream.read_exact(&mut query).await.is_err() {
                            return;
                        }
                        let Some(reply) = resolver.respond(&query, u16::MAX as usize) else {
                            return;
                        };
                        let mut framed = (reply.len() as u16).to_be_bytes().to_vec();
                        framed.extend(reply);
                        if stream.write_all(&framed).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let mut buf = vec![0u8; 4096];
        loop {
            let (n, peer) = udp.recv_from(&mut buf).await?;
            if let Some(reply) = resolver.respond(&buf[..n], 1232)
                && let Err(e) = udp.send_to(&reply, peer).await
            {
                debug!(%peer, error = %e, "failed to send DNS reply");
            }
        }
    }
}

struct Resolver {
    domain: String,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
}

impl Resolver {
    /// The reply to one query message, or `None` for garbage.
    fn respond(&self, query: &[u8], max_len: usize) -> Option<Vec<u8>> {
        let request = Message::from_vec(query).ok()?;
        if request.metadata.message_type != MessageType::Query {
            return None;
        }
        let id = request.metadata.id;
        let mut reply = Message::response(id, request.metadata.op_code);
        reply.metadata.recursion_desired = request.metadata.recursion_desired;
        reply.metadata.authoritative = true;
        if request.metadata.op_code != OpCode::Query || request.queries.len() != 1 {
            reply.metadata.response_code = ResponseCode::NotImp;
            return reply.to_vec().ok();
        }
        let question = request.queries[0].clone();
        let name = question.name().to_ascii().to_lowercase();
        let name = name.trim_end_matches('.');
        let answer = lookup(name, &self.domain, &self.services.state(), &self.slices.state());
        reply.add_query(question.clone());
        match answer {
            Lookup::Found(addrs) => {
                if matches!(question.query_type(), RecordType::A | RecordType::ANY) {
                    let owner: Name = question.name().clone();
                    for ip in addrs {
                        reply.add_answer(Record::from_rdata(owner.clone(), TTL, RData::A(A(ip))));
                    }
                }
            }
            Lookup::NoSuchName => reply.metadata.response_code = ResponseCode::NXDomain,
            Lookup::Refused => {
                reply.metadata.authoritative = false;
                reply.metadata.response_code = ResponseCode::Refused;
            }
        }
        let bytes = reply.to_vec().ok()?;
        if bytes.len() > max_len {
            let mut truncated = reply.truncate();
            truncated.metadata.id = id;
            return truncated.to_vec().ok();
        }
        Some(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ServiceSpec;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};
    use std::collections::BTreeMap;

    fn service(name: &str, cluster_ip: &str, publish_not_ready: bool) -> Arc<Service> {
        let mut s = Service::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some("db".into());
        s.spec = Some(ServiceSpec {
            cluster_ip: Some(cluster_ip.into()),
            publish_not_ready_addresses: Some(publish_not_ready),
            ..Default::default()
        });
        Arc::new(s)
    }

    fn endpoint(ip: &str, host: &str, ready: bool) -> Endpoint {
        Endpoint {
            addresses: vec![ip.into()],
            hostname: Some(host.into()),
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn slice(svc: &str, endpoints: Vec<Endpoint>) -> Arc<EndpointSlice> {
        let mut s = EndpointSlice {
            address_type: "IPv4".into(),
            endpoints,
            ..Default::default()
        };
        s.metadata.namespace = Some("db".into());
        s.metadata.labels = Some(BTreeMap::from([("kubernetes.io/service-name".into(), svc.into())]));
        Arc::new(s)
    }

    #[test]
    fn cluster_ip_headless_and_pod_names() {
        let services = vec![service("web", "10.96.4.5", false), service("etcd", "None", true)];
        let slices = vec![slice(
            "etcd",
            vec![
                endpoint("10.244.0.3", "etcd-0", true),
                endpoint("10.244.0.4", "etcd-1", false),
            ],
        )];
        let d = "cluster.local";
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(
            lookup("web.db.svc.cluster.local", d, &services, &slices),
            Lookup::Found(vec![ip("10.96.4.5")])
        );
        assert_eq!(
            lookup("etcd.db.svc.cluster.local", d, &services, &slices),
            Lookup::Found(vec![ip("10.244.0.3"), ip("10.244.0.4")]),
            "publishNotReadyAddresses includes unready endpoints"
        );
        assert_eq!(
            lookup("etcd-1.etcd.db.svc.cluster.local", d, &services, &slices),
            Lookup::Found(vec![ip("10.244.0.4")])
        );
        assert_eq!(
            lookup("etcd-9.etcd.db.svc.cluster.local", d, &services, &slices),
            Lookup::NoSuchName
        );
        assert_eq!(
            lookup("nope.db.svc.cluster.local", d, &services, &slices),
            Lookup::NoSuchName
        );
        assert_eq!(
            lookup("10-244-0-9.db.pod.cluster.local", d, &services, &slices),
            Lookup::Found(vec![ip("10.244.0.9")])
        );
        assert_eq!(lookup("example.com", d, &services, &slices), Lookup::Refused);
        assert_eq!(
            lookup("db.svc.cluster.local", d, &services, &slices),
            Lookup::Found(vec![])
        );
    }

    #[test]
    fn unready_endpoints_hidden_without_publish_not_ready() {
        let services = vec![service("etcd", "None", false)];
        let slices = vec![slice(
            "etcd",
            vec![
                endpoint("10.244.0.3", "etcd-0", true),
                endpoint("10.244.0.4", "etcd-1", false),
            ],
        )];
        let got = lookup("etcd.db.svc.cluster.local", "cluster.local", &services, &slices);
        assert_eq!(got, Lookup::Found(vec!["10.244.0.3".parse().unwrap()]));
    }
}
