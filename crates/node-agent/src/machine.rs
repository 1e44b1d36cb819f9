//! Running as a whole machine (a Machine's VM, `--machine`): the agent is alone in a network
//! namespace (its pod's, in the management cluster), with no `make cluster-up` to prepare it.
//!
//! So it prepares its own network, as a host-gateway CNI would on a real node:
//! - it takes its pod range from its Node (the tenant's controller-manager allocates it, as for
//!   any kubelet) and makes a bridge with the range's first address, the pods' gateway;
//! - it routes every other Node's pod range to that Node's address, learned from the Nodes, so
//!   pods on different machines reach each other without a tunnel;
//! - it masquerades what its pods send outside the cluster's pod network (the API server, the
//!   management cluster's addresses), so that answers find their way back to this machine;
//! - it answers `/healthz` (the kubelet's port, 10248) once its routes are in place: the VM's
//!   readiness.
//!
//! Everything here acts inside the machine's own network namespace only.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::network::{Ipv4Net, NetworkError, run_ip, run_ip_batch};

/// The machine's interface to the rest of the world (its pod's eth0).
const UPLINK: &str = "eth0";

/// Waits until the Node has a pod range (allocated by the controller-manager right after the
/// Node is registered) and returns it.
pub async fn wait_for_pod_cidr(client: &Client, node: &str) -> Ipv4Net {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut waited = Duration::ZERO;
    loop {
        match nodes.get_opt(node).await {
            Ok(Some(n)) => {
                if let Some(cidr) = n.spec.and_then(|s| s.pod_cidr).and_then(|c| c.parse().ok()) {
                    return cidr;
                }
            }
            Ok(None) => warn!(node, "the Node is gone while waiting for its pod range"),
            Err(e) => warn!(node, error = %e, "cannot read the Node for its pod range"),
        }
        if waited.as_secs().is_multiple_of(30) {
            info!(node, "waiting for the controller-manager to give the Node a pod range");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        waited += Duration::from_secs(1);
    }
}

/// Makes the bridge with `gateway` (idempotently: an agent that restarts finds it made), lets
/// the machine forward, and masquerades what leaves `cluster` from the pods.
pub async fn set_up_network(bridge: &str, gateway: Ipv4Addr, pod_cidr: Ipv4Net) -> Result<(), NetworkError> {
    if !std::path::Path::new("/sys/class/net").join(bridge).exists() {
        run_ip(&["link", "add", bridge, "type", "bridge"]).await?;
    }
    // A bridge without an address of its own takes the lowest one of its ports, and changes it
    // when that pod goes: the other pods would then send to a gateway address nobody answers
    // for until their neighbour entry runs out (as on this machine's own bridge, cluster-up.sh).
    let script = format!(
        "link set {bridge} address {mac}\naddr replace {gateway}/{prefix} dev {bridge}\nlink set {bridge} up\n",
        mac = bridge_address(gateway),
        prefix = pod_cidr.prefix
    );
    run_ip_batch(&[], &script).await?;
    // Per network namespace: this affects the machine only.
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").map_err(|e| NetworkError::Ip {
        args: "sysctl net.ipv4.ip_forward=1".into(),
        message: e.to_string(),
    })?;
    Ok(())
}

/// The bridge's own hardware address: locally administered, from its gateway address (unique
/// on the machine's link, which is the bridge itself). Pure.
fn bridge_address(gateway: Ipv4Addr) -> String {
    let [a, b, c, d] = gateway.octets();
    format!("02:00:{a:02x}:{b:02x}:{c:02x}:{d:02x}")
}

/// Masquerades what the pods send outside the cluster's pod network.
pub async fn masquerade(cluster: Ipv4Net) -> Result<(), NetworkError> {
    let cluster = cluster.to_string();
    let rule = ["-s", &cluster, "!", "-d", &cluster, "-j", "MASQUERADE"];
    let exists = iptables(&[&["-t", "nat", "-C", "POSTROUTING"][..], &rule[..]].concat())
        .await
        .is_ok();
    if !exists {
        iptables(&[&["-t", "nat", "-A", "POSTROUTING"][..], &rule[..]].concat()).await?;
    }
    Ok(())
}

async fn iptables(args: &[&str]) -> Result<(), NetworkError> {
    let out = tokio::process::Command::new("iptables")
        .arg("-w")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| NetworkError::Ip {
            args: format!("iptables {}", args.join(" ")),
            message: e.to_string(),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetworkError::Ip {
            args: format!("iptables {}", args.join(" ")),
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// The routes this machine needs: every other Node's pod range, via that Node's internal
/// address. Ranges outside the cluster's pod network, and Nodes without both, are left out.
/// Pure.
pub fn desired_routes(nodes: &[Arc<Node>], own: &str, cluster: Ipv4Net) -> BTreeMap<String, Ipv4Addr> {
    let mut routes = BTreeMap::new();
    for node in nodes {
        if node.metadata.name.as_deref() == Some(own) {
            continue;
        }
        let Some(range) = node
            .spec
            .as_ref()
            .and_then(|s| s.pod_cidr.as_deref())
            .and_then(|c| c.parse::<Ipv4Net>().ok())
        else {
            continue;
        };
        if !cluster.contains(range.network()) || range.prefix < cluster.prefix {
            continue;
        }
        let address = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
            .and_then(|a| a.address.parse::<Ipv4Addr>().ok());
        if let Some(address) = address {
            routes.insert(range.to_string(), address);
        }
    }
    routes
}

/// Keeps a route to every other Node's pod range, for as long as the agent runs. `routed` is
/// set once the routes to the Nodes of the first full list are in place.
pub async fn route_to_nodes(client: Client, own: String, cluster: Ipv4Net, routed: Arc<AtomicBool>) {
    let changed = Arc::new(Notify::new());
    let nodes = crate::watch_cache::cache::<Node>(client, Some(changed.clone()));
    let _ = nodes.wait_until_ready().await;
    let mut installed: BTreeMap<String, Ipv4Addr> = BTreeMap::new();
    loop {
        let desired = desired_routes(&nodes.state(), &own, cluster);
        for (range, via) in &desired {
            if installed.get(range) == Some(via) {
                continue;
            }
            let via_text = via.to_string();
            match run_ip(&["route", "replace", range, "via", &via_text, "dev", UPLINK]).await {
                Ok(()) => {
                    info!(range = %range, via = %via, "routing a node's pod range to it");
                    installed.insert(range.clone(), *via);
                }
                Err(e) => warn!(range = %range, error = %e, "cannot route a node's pod range"),
            }
        }
        let gone: Vec<String> = installed
            .keys()
            .filter(|r| !desired.contains_key(*r))
            .cloned()
            .collect();
        for range in gone {
            let _ = run_ip(&["route", "del", &range]).await;
            info!(range = %range, "a node with this pod range is gone; route removed");
            installed.remove(&range);
        }
        if installed.len() == desired.len() {
            routed.store(true, Ordering::Relaxed);
        }
        // A failed route is tried again a little later even if no Node changes.
        let _ = tokio::time::timeout(Duration::from_secs(10), changed.notified()).await;
    }
}

/// kube-proxy's metrics on the machine (the VM's own network namespace).
const KUBE_PROXY_METRICS: &str = "127.0.0.1:10249";
/// Set by kube-proxy once it has programmed the rules of every Service and endpoint: its
/// `/healthz` answers 200 already while it starts, before any rule is in place.
const KUBE_PROXY_SYNCED_METRIC: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";

/// Whether kube-proxy's metrics say it has synced its rules at least once. Pure.
pub fn kube_proxy_synced(metrics: &str) -> bool {
    metrics.lines().any(|line| {
        line.strip_prefix(KUBE_PROXY_SYNCED_METRIC)
            .and_then(|rest| rest.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .is_some_and(|v| v > 0.0)
    })
}

async fn ask_kube_proxy() -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let asked = async {
        let mut stream = tokio::net::TcpStream::connect(KUBE_PROXY_METRICS).await.ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await
            .ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await.ok()?;
        Some(kube_proxy_synced(&text))
    };
    tokio::time::timeout(Duration::from_secs(1), asked)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// Answers `GET /healthz` on `addr` with 200 once `routed` is set and kube-proxy has programmed
/// the tenant's Services (503 before): the VM's readiness, so that a load balancer sends it
/// nothing it cannot forward yet.
pub async fn serve_health(addr: SocketAddr, routed: Arc<AtomicBool>) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let proxy_synced = Arc::new(AtomicBool::new(false));
    loop {
        let (mut stream, _) = listener.accept().await?;
        let (routed, proxy_synced) = (routed.clone(), proxy_synced.clone());
        tokio::spawn(async move {
            let mut request = [0u8; 512];
            let _ = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut request)).await;
            // Once synced, kube-proxy stays so: it is asked until it says it is.
            if !proxy_synced.load(Ordering::Relaxed) && ask_kube_proxy().await {
                proxy_synced.store(true, Ordering::Relaxed);
            }
            let (status, body) = match (routed.load(Ordering::Relaxed), proxy_synced.load(Ordering::Relaxed)) {
                (true, true) => ("200 OK", "ok"),
                (false, _) => (
                    "503 Service Unavailable",
                    "routes to the other machines not in place yet",
                ),
                (true, false) => (
                    "503 Service Unavailable",
                    "kube-proxy has not programmed the Services yet",
                ),
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeSpec, NodeStatus};

    fn node(name: &str, range: Option<&str>, address: Option<&str>) -> Arc<Node> {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.spec = Some(NodeSpec {
            pod_cidr: range.map(str::to_string),
            ..Default::default()
        });
        n.status = Some(NodeStatus {
            addresses: address.map(|a| {
                vec![
                    NodeAddress {
                        type_: "Hostname".into(),
                        address: name.into(),
                    },
                    NodeAddress {
                        type_: "InternalIP".into(),
                        address: a.into(),
                    },
                ]
            }),
            ..Default::default()
        });
        Arc::new(n)
    }

    #[test]
    fn the_bridge_keeps_one_local_unicast_address_of_its_own_gateway() {
        let address = bridge_address(Ipv4Addr::new(10, 200, 3, 1));
        assert_eq!(address, "02:00:0a:c8:03:01");
        assert_ne!(address, bridge_address(Ipv4Addr::new(10, 200, 4, 1)));
    }

    #[test]
    fn kube_proxy_is_synced_once_it_says_when_it_last_programmed_its_rules() {
        let before = "# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds x\nkubeproxy_sync_proxy_rules_last_timestamp_seconds 0\n";
        assert!(!kube_proxy_synced(before));
        assert!(!kube_proxy_synced("up 1\n"));
        let after = "kubeproxy_sync_proxy_rules_last_timestamp_seconds 1.7644e+09\n";
        assert!(kube_proxy_synced(after));
    }

    #[test]
    fn every_other_nodes_range_goes_to_its_address() {
        let cluster: Ipv4Net = "10.200.0.0/16".parse().unwrap();
        let nodes = [
            node("me", Some("10.200.0.0/24"), Some("10.244.1.5")),
            node("b", Some("10.200.1.0/24"), Some("10.244.2.7")),
            node("no-range-yet", None, Some("10.244.2.8")),
            node("no-address-yet", Some("10.200.3.0/24"), None),
            node("outside", Some("10.9.0.0/24"), Some("10.244.2.9")),
            node("wider-than-the-network", Some("10.0.0.0/8"), Some("10.244.2.10")),
        ];
        let routes = desired_routes(&nodes, "me", cluster);
        assert_eq!(
            routes.into_iter().collect::<Vec<_>>(),
            vec![("10.200.1.0/24".to_string(), Ipv4Addr::new(10, 244, 2, 7))]
        );
    }
}
