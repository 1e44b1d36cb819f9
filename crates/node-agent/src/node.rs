//! The Node object: registration, status with capacity and addresses, and the Lease heartbeat
//! that tells the node lifecycle controller this node is alive.

use std::net::Ipv4Addr;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tracing::{info, warn};

/// The field manager of everything the agent writes.
pub const FIELD_MANAGER: &str = "noops-node";

/// How often the Node status is re-sent even when nothing changed.
const STATUS_REFRESH: Duration = Duration::from_secs(60);

/// What the agent says about its node.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub name: String,
    /// The node's internal address (the kubelet API listens there).
    pub ip: Ipv4Addr,
    /// The pod range, when the agent knows it at registration; otherwise the controller-manager
    /// allocates one.
    pub pod_cidr: Option<String>,
    /// The machine this node is, as its cloud names it (`noops://<namespace>/<machine>`).
    pub provider_id: Option<String>,
    pub kubelet_port: u16,
    pub kubernetes_version: String,
    /// CPU cores and memory bytes offered to pods.
    pub cpu: u32,
    pub memory_bytes: u64,
    pub max_pods: u32,
    /// How long the node Lease lasts; it is renewed every quarter of that, as the kubelet does.
    pub lease_seconds: u32,
}

impl NodeInfo {
    /// Reads this machine's size from /proc.
    pub fn detect_capacity() -> (u32, u64) {
        let cpu = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        let memory_kib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.split_whitespace().next())
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .unwrap_or(1024 * 1024);
        (cpu, memory_kib * 1024)
    }

    /// The Node object as registered (metadata and spec only; status is a subresource).
    pub fn node_object(&self) -> Node {
        let mut spec = json!({});
        if let Some(cidr) = &self.pod_cidr {
            spec["podCIDR"] = json!(cidr);
            spec["podCIDRs"] = json!([cidr]);
        }
        if let Some(id) = &self.provider_id {
            spec["providerID"] = json!(id);
        }
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
                    "noops.dev/local": "true",
                },
            },
            "spec": spec,
        }))
        .unwrap_or_default()
    }

    /// The Node status, applied with server-side apply.
    pub fn status_patch(&self, now: jiff::Timestamp, since: jiff::Timestamp) -> serde_json::Value {
        let resources = json!({
            "cpu": self.cpu.to_string(),
            "memory": format!("{}Ki", self.memory_bytes / 1024),
            "pods": self.max_pods.to_string(),
            "ephemeral-storage": "100Gi",
        });
        let condition = |type_: &str, status: &str, reason: &str, message: &str| {
            json!({
                "type": type_, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": now.to_string(), "lastTransitionTime": since.to_string(),
            })
        };
        let read = |path: &str| {
            std::fs::read_to_string(path)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "noops node agent has sufficient memory available"),
                    condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "noops node agent has no disk pressure"),
                    condition("PIDPressure", "False", "KubeletHasSufficientPID", "noops node agent has sufficient PID available"),
                    condition("Ready", "True", "KubeletReady", "noops node agent is posting ready status"),
                ],
                "addresses": [
                    { "type": "InternalIP", "address": self.ip.to_string() },
                    { "type": "Hostname", "address": self.name },
                ],
                "daemonEndpoints": { "kubeletEndpoint": { "Port": self.kubelet_port } },
                "nodeInfo": {
                    "machineID": read("/etc/machine-id"),
                    "systemUUID": read("/etc/machine-id"),
                    "bootID": read("/proc/sys/kernel/random/boot_id"),
                    "kernelVersion": read("/proc/sys/kernel/osrelease"),
                    "osImage": os_image(),
                    "containerRuntimeVersion": format!("noops://{}", env!("CARGO_PKG_VERSION")),
                    "kubeletVersion": self.kubernetes_version,
                    "kubeProxyVersion": self.kubernetes_version,
                    "operatingSystem": "linux",
                    "architecture": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
                },
            },
        })
    }
}

fn os_image() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_else(|| "Linux".into())
}

/// Creates the Node object if it does not exist yet, with no status: not Ready until the
/// agent says so.
pub async fn create(client: &Client, info: &NodeInfo) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.create(&PostParams::default(), &info.node_object()).await {
        Ok(_) => info!(node = %info.name, "registered node"),
        Err(kube::Error::Api(e)) if e.code == 409 => info!(node = %info.name, "node already registered"),
        Err(e) => return Err(e),
    }
    Ok(())
}

/// Registers the node (creating it if needed) and applies its status (Ready) once.
pub async fn register(client: &Client, info: &NodeInfo) -> Result<(), kube::Error> {
    create(client, info).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let now = jiff::Timestamp::now();
    apply_status(&nodes, info, now, now).await
}

async fn apply_status(
    nodes: &Api<Node>,
    info: &NodeInfo,
    now: jiff::Timestamp,
    since: jiff::Timestamp,
) -> Result<(), kube::Error> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    nodes
        .patch_status(&info.name, &params, &Patch::Apply(info.status_patch(now, since)))
        .await?;
    Ok(())
}

/// Renews the node Lease every quarter of its duration and re-sends the status every minute,
/// until cancelled.
pub async fn heartbeat(client: Client, info: NodeInfo) {
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let since = jiff::Timestamp::now();
    let mut last_status = tokio::time::Instant::now();
    let mut node_uid: Option<String> = None;
    let renew_every = Duration::from_millis(u64::from(info.lease_seconds) * 250);
    // A request that hangs (a partitioned network drops its packets) is given up after one
    // renewal period, so that the next one goes out on a fresh connection, as the kubelet does.
    let limit = renew_every.max(Duration::from_secs(2));
    loop {
        if node_uid.is_none() {
            node_uid = tokio::time::timeout(limit, nodes.get_opt(&info.name))
                .await
                .ok()
                .and_then(Result::ok)
                .flatten()
                .and_then(|n| n.metadata.uid);
        }
        let lease = lease_patch(
            &info.name,
            node_uid.as_deref(),
            info.lease_seconds,
            jiff::Timestamp::now(),
        );
        let params = PatchParams::apply(FIELD_MANAGER).force();
        match tokio::time::timeout(limit, leases.patch(&info.name, &params, &Patch::Apply(lease))).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => warn!(error = %e, "failed to renew the node lease"),
            Err(_) => warn!(timeout = ?limit, "renewing the node lease timed out"),
        }
        if last_status.elapsed() >= STATUS_REFRESH {
            match tokio::time::timeout(limit, apply_status(&nodes, &info, jiff::Timestamp::now(), since)).await {
                Ok(Ok(())) => last_status = tokio::time::Instant::now(),
                Ok(Err(e)) => warn!(error = %e, "failed to update the node status"),
                Err(_) => warn!(timeout = ?limit, "updating the node status timed out"),
            }
        }
        tokio::time::sleep(renew_every).await;
    }
}

fn lease_patch(node: &str, node_uid: Option<&str>, lease_seconds: u32, now: jiff::Timestamp) -> serde_json::Value {
    let mut metadata = json!({ "name": node, "namespace": "kube-node-lease" });
    if let Some(uid) = node_uid {
        metadata["ownerReferences"] = json!([{ "apiVersion": "v1", "kind": "Node", "name": node, "uid": uid }]);
    }
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": lease_seconds,
            "renewTime": now.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> NodeInfo {
        NodeInfo {
            name: "n1".into(),
            ip: Ipv4Addr::new(10, 244, 0, 1),
            pod_cidr: Some("10.244.0.0/16".into()),
            provider_id: None,
            kubelet_port: 10250,
            kubernetes_version: "v1.34.4".into(),
            cpu: 2,
            memory_bytes: 4 * 1024 * 1024 * 1024,
            max_pods: 110,
            lease_seconds: 40,
        }
    }

    #[test]
    fn status_reports_ready_capacity_and_address() {
        let t = jiff::Timestamp::UNIX_EPOCH;
        let s = info().status_patch(t, t);
        assert_eq!(s["status"]["capacity"]["memory"], "4194304Ki");
        assert_eq!(s["status"]["addresses"][0]["address"], "10.244.0.1");
        assert_eq!(s["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"], 10250);
        let ready = s["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap();
        assert_eq!(ready["status"], "True");
        assert_eq!(s["status"]["nodeInfo"]["kubeletVersion"], "v1.34.4");
    }

    #[test]
    fn node_object_has_name_labels_and_cidr() {
        let n = info().node_object();
        assert_eq!(n.metadata.name.as_deref(), Some("n1"));
        assert_eq!(n.metadata.labels.unwrap()["kubernetes.io/hostname"], "n1");
        assert_eq!(n.spec.unwrap().pod_cidr.as_deref(), Some("10.244.0.0/16"));
        let machine = NodeInfo {
            pod_cidr: None,
            provider_id: Some("noops://tenants/pool-a-x7k2p".into()),
            ..info()
        };
        let spec = machine.node_object().spec.unwrap();
        assert_eq!(spec.pod_cidr, None, "the controller-manager gives it one");
        assert_eq!(spec.provider_id.as_deref(), Some("noops://tenants/pool-a-x7k2p"));
    }

    #[test]
    fn lease_renew_time_has_microseconds() {
        let l = lease_patch("n1", Some("u"), 40, jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(l["spec"]["renewTime"], "1970-01-01T00:00:00.000000Z");
        assert_eq!(l["metadata"]["ownerReferences"][0]["uid"], "u");
    }
}
