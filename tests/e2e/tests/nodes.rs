//! Several nodes: each a Node with its own name, address and pod range, and pods on different
//! nodes reaching each other by pod IP, ClusterIP and DNS name. Needs `NODES=3 make cluster-up`
//! (`make e2e` starts three).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{ListParams, LogParams};
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn every_node_has_its_own_name_address_and_pod_range() {
    let client = client().await;
    ready_nodes(&client, 3).await;
    let nodes = nodes(&client).await;
    let mut seen_ips = BTreeSet::new();
    let mut seen_cidrs = BTreeSet::new();
    for node in &nodes {
        let name = node.metadata.name.clone().unwrap();
        let k: u32 = name.strip_prefix("noops-node-").unwrap().parse().unwrap();
        let ip = node
            .status
            .as_ref()
            .unwrap()
            .addresses
            .as_ref()
            .unwrap()
            .iter()
            .find(|a| a.type_ == "InternalIP")
            .unwrap()
            .address
            .clone();
        let cidr = node.spec.as_ref().unwrap().pod_cidr.clone().unwrap();
        assert_eq!(ip, format!("10.244.{k}.1"), "{name}");
        assert_eq!(cidr, format!("10.244.{k}.0/24"), "{name}");
        assert!(seen_ips.insert(ip) && seen_cidrs.insert(cidr));
    }
}

/// Three replicas, one per node; each serves its name and node, and keeps calling every peer
/// (found through a headless Service's DNS), the Service by name and its ClusterIP.
fn mesh(cluster_ip: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{ name: mesh }}
spec:
  replicas: 3
  selector: {{ matchLabels: {{ app: mesh }} }}
  template:
    metadata: {{ labels: {{ app: mesh }} }}
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
        - {{ maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {{ matchLabels: {{ app: mesh }} }} }}
      containers:
        - name: mesh
          image: hashicorp/http-echo:1.0
          env:
            - {{ name: POD_NAME, valueFrom: {{ fieldRef: {{ fieldPath: metadata.name }} }} }}
            - {{ name: NODE_NAME, valueFrom: {{ fieldRef: {{ fieldPath: spec.nodeName }} }} }}
          command: ["sh", "-c"]
          args:
            - |
              http-echo -listen=:8080 -text="$POD_NAME@$NODE_NAME" &
              while true; do
                line="round"
                for ip in $(getent ahostsv4 mesh-peers | awk '{{ print $1 }}' | sort -u); do
                  line="$line peer:$(curl -sf --max-time 2 http://$ip:8080/ || echo FAILED@$ip)"
                done
                line="$line dns:$(curl -sf --max-time 2 http://mesh/ || echo FAILED)"
                line="$line clusterip:$(curl -sf --max-time 2 http://{cluster_ip}/ || echo FAILED)"
                echo "$line"
                sleep 1
              done
          ports: [{{ containerPort: 8080, name: http }}]
          readinessProbe: {{ httpGet: {{ path: /, port: http }}, periodSeconds: 1 }}
"#
    )
}

const SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: { name: mesh }
spec:
  type: NodePort
  selector: { app: mesh }
  ports: [{ port: 80, targetPort: 8080 }]
---
apiVersion: v1
kind: Service
metadata: { name: mesh-peers }
spec:
  clusterIP: None
  selector: { app: mesh }
  ports: [{ port: 8080 }]
"#;

#[tokio::test]
async fn pods_on_different_nodes_reach_each_other_by_pod_ip_cluster_ip_and_dns() {
    let ns = TestNamespace::new("mesh").await;
    ready_nodes(&ns.client, 3).await;
    ns.apply(SERVICES);
    let service = ns.api::<Service>().get("mesh").await.unwrap().spec.unwrap();
    let cluster_ip = service.cluster_ip.unwrap();
    let node_port = service.ports.unwrap()[0].node_port.unwrap();
    ns.apply(&mesh(&cluster_ip));

    let pods_api = ns.pods();
    let pods: Vec<Pod> = wait_for("three mesh pods Ready", 2 * MINUTE, || async {
        let pods = pods_api
            .list(&ListParams::default().labels("app=mesh"))
            .await
            .ok()?
            .items;
        (pods.len() == 3 && pods.iter().all(pod_ready)).then_some(pods)
    })
    .await;
    // One pod per node, each with an address from its node's range.
    let mut by_name = BTreeMap::new();
    for pod in &pods {
        let node = pod_node(pod);
        let k = node.strip_prefix("noops-node-").unwrap();
        let ip = pod_ip(pod).unwrap();
        assert!(ip.starts_with(&format!("10.244.{k}.")), "{ip} on {node}");
        by_name.insert(pod.metadata.name.clone().unwrap(), node);
    }
    let nodes: BTreeSet<&String> = by_name.values().collect();
    assert_eq!(nodes.len(), 3, "spread over three nodes: {by_name:?}");
    let everyone: BTreeSet<String> = by_name.iter().map(|(pod, node)| format!("{pod}@{node}")).collect();

    // Every pod reaches every pod (itself included) by IP, and the Service by DNS and ClusterIP.
    for name in by_name.keys() {
        wait_until(
            &format!("{name} to reach every peer, the Service name and the ClusterIP"),
            MINUTE,
            || async {
                let logs = pods_api.logs(name, &LogParams::default()).await.unwrap_or_default();
                logs.lines().rev().take(5).any(|line| {
                    let reached: BTreeSet<String> = line
                        .split_whitespace()
                        .filter_map(|w| w.strip_prefix("peer:"))
                        .map(str::to_string)
                        .collect();
                    reached == everyone && !line.contains("dns:FAILED") && !line.contains("clusterip:FAILED")
                })
            },
        )
        .await;
    }

    // The NodePort on 127.0.0.1 reaches the pods of every node.
    let mut answered = BTreeSet::new();
    let deadline = std::time::Instant::now() + MINUTE;
    while answered != everyone {
        assert!(
            std::time::Instant::now() < deadline,
            "the NodePort on 127.0.0.1:{node_port} reached only {answered:?} of {everyone:?}"
        );
        match http_get(&format!("127.0.0.1:{node_port}"), "/").await {
            Some(body) => {
                answered.insert(body.trim().to_string());
            }
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}
