//! Where the API servers are reached from outside this cluster. The admin kubeconfig names the
//! Service's ClusterIP, which only pods and this cluster's nodes reach; `service.
//! externalEndpoint` names an address outside clients use (a node's with a NodePort, a load
//! balancer's, a DNS name in front of them): the serving certificate holds it, and the admin
//! Secret gets a second kubeconfig, `external-kubeconfig`, that names it. Pure.

use k8s_openapi::api::core::v1::Service;
use noops_api::control_plane::{ApiServerServiceSpec, ApiServerServiceType};

use super::names::API_SERVER_PORT;

/// The admin Secret's key of the kubeconfig for clients outside this cluster.
pub const EXTERNAL_KUBECONFIG_KEY: &str = "external-kubeconfig";

/// The external endpoint as far as it is known: its host and its URL. None without
/// `externalEndpoint`, or with a load balancer that has never had an address. `previous`:
/// the URL the status holds, kept while a load balancer reports no address for a moment
/// (a flap must not issue the serving certificate again and roll the API servers).
pub fn external(
    spec: &ApiServerServiceSpec,
    service: Option<&Service>,
    previous: Option<&str>,
) -> Option<(String, String)> {
    let endpoint = spec.external_endpoint.as_ref()?;
    let balanced = spec.type_ == ApiServerServiceType::LoadBalancer;
    let host = endpoint.host.clone().filter(|h| !h.is_empty()).or_else(|| {
        balanced
            .then(|| {
                service
                    .and_then(load_balancer_address)
                    .or_else(|| previous.and_then(host_of))
            })
            .flatten()
    })?;
    let node_port = service
        .and_then(|s| s.spec.as_ref()?.ports.as_ref()?.first()?.node_port)
        .filter(|_| spec.type_ == ApiServerServiceType::NodePort);
    let port = endpoint.port.or(node_port).unwrap_or(API_SERVER_PORT);
    // An IPv6 address is bracketed in a URL.
    let in_url = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.clone()
    };
    Some((host, format!("https://{in_url}:{port}")))
}

/// The address a load balancer gave the Service, if it has: the least in order, so that a
/// list that comes back reordered names the same one.
fn load_balancer_address(service: &Service) -> Option<String> {
    let ingress = service.status.as_ref()?.load_balancer.as_ref()?.ingress.as_ref()?;
    ingress
        .iter()
        .filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone()))
        .filter(|a| !a.is_empty())
        .min()
}

/// The host of a URL this module made (`https://<host>:<port>`, an IPv6 host bracketed).
fn host_of(url: &str) -> Option<String> {
    let (host, _port) = url.strip_prefix("https://")?.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| host.to_string())
}

/// The names and addresses the serving certificate holds beside the Service's own: the
/// external endpoint's host and `extraSANs`.
pub fn extra_names(spec: &ApiServerServiceSpec, service: Option<&Service>, previous: Option<&str>) -> Vec<String> {
    let mut names: Vec<String> = external(spec, service, previous)
        .map(|(host, _)| host)
        .into_iter()
        .collect();
    names.extend(spec.extra_sans.iter().cloned());
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: serde_json::Value) -> ApiServerServiceSpec {
        serde_json::from_value(yaml).unwrap()
    }

    fn service(node_port: Option<i32>, load_balancer: Option<&str>) -> Service {
        serde_json::from_value(serde_json::json!({
            "spec": { "ports": [{ "port": 6443, "nodePort": node_port }] },
            "status": { "loadBalancer": { "ingress": load_balancer.map(|ip| vec![serde_json::json!({ "ip": ip })]).unwrap_or_default() } },
        }))
        .unwrap()
    }

    #[test]
    fn the_external_endpoint_is_the_host_given_at_the_node_port_or_the_load_balancers_address() {
        let none = spec(serde_json::json!({}));
        assert_eq!(external(&none, Some(&service(None, None)), None), None);
        let node_port = spec(serde_json::json!({ "type": "NodePort", "externalEndpoint": { "host": "127.0.0.1" } }));
        assert_eq!(
            external(&node_port, Some(&service(Some(31443), None)), None),
            Some(("127.0.0.1".into(), "https://127.0.0.1:31443".into()))
        );
        let named = spec(serde_json::json!({
            "type": "NodePort", "externalEndpoint": { "host": "api.acme.example", "port": 443 }, "extraSANs": ["10.0.0.7"]
        }));
        assert_eq!(
            external(&named, Some(&service(Some(31443), None)), None)
                .map(|(_, url)| url)
                .as_deref(),
            Some("https://api.acme.example:443")
        );
        assert_eq!(extra_names(&named, None, None), ["10.0.0.7", "api.acme.example"]);
        // A load balancer without an address yet: not known, nothing named for it.
        let balanced = spec(serde_json::json!({ "type": "LoadBalancer", "externalEndpoint": {} }));
        assert_eq!(external(&balanced, Some(&service(Some(31443), None)), None), None);
        // The balancer reporting no address for a moment keeps the one the status holds.
        assert_eq!(
            external(
                &balanced,
                Some(&service(Some(31443), None)),
                Some("https://203.0.113.5:6443")
            ),
            Some(("203.0.113.5".into(), "https://203.0.113.5:6443".into()))
        );
        assert_eq!(
            external(&balanced, Some(&service(Some(31443), Some("203.0.113.5"))), None),
            Some(("203.0.113.5".into(), "https://203.0.113.5:6443".into()))
        );
        let v6 = spec(serde_json::json!({ "externalEndpoint": { "host": "fd00::5" } }));
        assert_eq!(
            external(&v6, None, None).map(|(_, url)| url).as_deref(),
            Some("https://[fd00::5]:6443")
        );
    }
}
