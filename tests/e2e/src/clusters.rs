//! KubernetesClusters as tests use them: a manifest, waiting for one Ready at a version, and a
//! watch that checks every Node's kubelet against its API servers' version.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use noops_api::{KubernetesCluster, KubernetesControlPlane};

use crate::{TestNamespace, wait_for};

/// The controllers a cluster needs.
pub const CONTROLLERS: &str =
    "kubernetescluster,kubernetescontrolplane,etcd,etcdbackup,machine,machineset,machinedeployment";

pub fn minor(version: &str) -> Option<u32> {
    version.trim_start_matches('v').split('.').nth(1)?.parse().ok()
}

/// Waits until cluster `name` is Ready and runs `version` everywhere.
pub async fn wait_cluster(ns: &TestNamespace, name: &str, version: &str, timeout: Duration) -> KubernetesCluster {
    let api = ns.api::<KubernetesCluster>();
    wait_for(&format!("cluster {name} Ready at {version}"), timeout, || async {
        let kc = api.get(name).await.ok()?;
        let status = kc.status.as_ref()?;
        let ready = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        (ready && status.version.as_deref() == Some(version) && status.observed_generation == kc.metadata.generation)
            .then_some(kc)
    })
    .await
}

/// Every tenant Node's kubelet checked against the control plane's version at every change of a
/// Node, from a watch: the changes where a kubelet was newer than the API servers, or more than
/// one minor older.
pub struct SkewWatch {
    task: tokio::task::JoinHandle<()>,
    seen: Arc<Mutex<(usize, Vec<String>)>>,
}

impl SkewWatch {
    pub fn start(nodes: Api<Node>, control_planes: Api<KubernetesControlPlane>, name: String) -> Self {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        let seen = Arc::new(Mutex::new((0, Vec::new())));
        let record = seen.clone();
        let task = tokio::spawn(async move {
            // Backing off while the API servers restart in the upgrade.
            let stream = watcher(nodes, watcher::Config::default()).default_backoff();
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                let node = match event {
                    Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => n,
                    _ => continue,
                };
                let Some(kubelet) = node.status.and_then(|s| s.node_info).map(|i| i.kubelet_version) else {
                    continue;
                };
                let Ok(kcp) = control_planes.get(&name).await else {
                    continue;
                };
                let Some(serving) = kcp.status.and_then(|s| s.version) else {
                    continue;
                };
                let mut seen = record.lock().unwrap();
                seen.0 += 1;
                let (Some(k), Some(s)) = (minor(&kubelet), minor(&serving)) else {
                    continue;
                };
                if k > s || k + 1 < s {
                    seen.1.push(format!(
                        "node {} at {kubelet} with API servers at {serving}",
                        node.metadata.name.unwrap_or_default()
                    ));
                }
            }
        });
        Self { task, seen }
    }

    /// (Node changes checked, the skews seen).
    pub fn stop(self) -> (usize, Vec<String>) {
        self.task.abort();
        self.seen.lock().unwrap().clone()
    }
}

/// A KubernetesCluster `kc` whose spec is `spec` (YAML lines indented by two).
pub fn cluster(name: &str, spec: &str) -> String {
    format!("apiVersion: noops.dev/v1alpha1\nkind: KubernetesCluster\nmetadata: {{ name: {name} }}\nspec:\n{spec}")
}
