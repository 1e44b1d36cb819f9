//! The tenant as the KubernetesCluster controller sees it: per cluster whose control plane
//! serves, watches of the tenant's Pods and Nodes (made from its admin kubeconfig Secret,
//! `core::tenant`), whose changes wake the cluster. The pools that scale themselves read them,
//! and so does the removal of Nodes whose machine is gone.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use noops_api::KubernetesCluster;
use tracing::debug;

use super::autoscale::{NodeUse, PendingPod, Resources};
use crate::core::Result;
use crate::core::tenant::{PerTenant, TIMEOUT};
use crate::machine::drain::stays_with_its_node;

/// What wakes a cluster.
pub type Wake = ObjectRef<DeserializeGuard<KubernetesCluster>>;

/// One tenant's Pods and Nodes, and the watches that fill them.
pub struct TenantView {
    /// For requests (`core::tenant`).
    pub client: kube::Client,
    pods: Store<Pod>,
    nodes: Store<Node>,
    watches: [tokio::task::JoinHandle<()>; 2],
}

impl Drop for TenantView {
    fn drop(&mut self) {
        for watch in &self.watches {
            watch.abort();
        }
    }
}

/// What the autoscaler reads of a tenant.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Pods the scheduler found no room for.
    pub pending: Vec<PendingPod>,
    /// Ready Nodes, with what runs on each.
    pub ready: BTreeMap<String, NodeUse>,
    /// Every Node, with its providerID (`noops://<namespace>/<machine>` names a machine).
    pub providers: Vec<(String, Option<String>)>,
    /// Nodes whose kubelet stopped reporting (Ready `Unknown`): lost, unlike a Node that has
    /// just joined and is not Ready yet (`False`).
    pub lost: BTreeSet<String>,
}

impl TenantView {
    /// What the caches hold, once both have listed (an error if they have not yet).
    pub async fn seen(&self, now: jiff::Timestamp) -> std::result::Result<Seen, String> {
        let listed = async {
            self.pods.wait_until_ready().await?;
            self.nodes.wait_until_ready().await
        };
        tokio::time::timeout(TIMEOUT, listed)
            .await
            .map_err(|_| "the tenant has not listed its Pods and Nodes yet".to_string())?
            .map_err(|e| e.to_string())?;
        let pods = self.pods.state();
        let nodes = self.nodes.state();
        let providers = nodes
            .iter()
            .filter_map(|n| {
                let provider = n.spec.as_ref().and_then(|s| s.provider_id.clone());
                Some((n.metadata.name.clone()?, provider))
            })
            .collect();
        let lost = nodes
            .iter()
            .filter(|n| {
                let conditions = n.status.as_ref().and_then(|s| s.conditions.as_ref());
                conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "Unknown"))
            })
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        let mut ready: BTreeMap<String, NodeUse> = nodes
            .iter()
            .filter(|n| crate::core::nodes::ready(n))
            .filter_map(|n| Some((n.metadata.name.clone()?, NodeUse::default())))
            .collect();
        let mut pending = Vec::new();
        for pod in pods.iter() {
            let Some(spec) = &pod.spec else { continue };
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            if matches!(phase, Some("Succeeded" | "Failed")) {
                continue;
            }
            match &spec.node_name {
                Some(node) => {
                    if let Some(using) = ready.get_mut(node) {
                        using.busy |= !stays_with_its_node(pod);
                        let asked = requests(pod);
                        using.used.cpu_millis += asked.cpu_millis;
                        using.used.memory_bytes += asked.memory_bytes;
                        using.used.pods += asked.pods;
                    }
                }
                None => {
                    if let Some(since) = unschedulable_since(pod) {
                        pending.push(PendingPod {
                            name: format!(
                                "{}/{}",
                                pod.metadata.namespace.clone().unwrap_or_default(),
                                pod.metadata.name.clone().unwrap_or_default()
                            ),
                            requests: requests(pod),
                            pending_for: Duration::try_from(now - since).unwrap_or(Duration::ZERO),
                        });
                    }
                }
            }
        }
        Ok(Seen {
            pending,
            ready,
            providers,
            lost,
        })
    }
}

/// Nodes whose providerID names a machine of `namespace` that is not among `machines`: the
/// machine is gone, so nothing runs on the Node whatever its status says. A cluster restored
/// from a backup remembers the Nodes of the old one as Ready until their heartbeats are
/// missed, and their pods until those are evicted: minutes an app waits for nothing. Pure.
pub fn stale_nodes(
    providers: &[(String, Option<String>)],
    namespace: &str,
    machines: &std::collections::BTreeSet<String>,
) -> Vec<String> {
    let prefix = format!("noops://{namespace}/");
    providers
        .iter()
        .filter_map(|(node, provider)| {
            let machine = provider.as_deref()?.strip_prefix(&prefix)?;
            (!machines.contains(machine)).then(|| node.clone())
        })
        .collect()
}

/// When the scheduler last found no room for the pod, if that is where it stands.
fn unschedulable_since(pod: &Pod) -> Option<jiff::Timestamp> {
    let condition = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled")?;
    (condition.status == "False" && condition.reason.as_deref() == Some("Unschedulable"))
        .then(|| condition.last_transition_time.as_ref().map(|t| t.0))
        .flatten()
}

/// What a pod asks for: its containers' requests (the larger of their sum and each init
/// container's), one pod slot.
pub fn requests(pod: &Pod) -> Resources {
    fn amount(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity, scale: f64) -> i64 {
        noops_api::quantity::parse(&q.0).map_or(0, |v| (v * scale).ceil() as i64)
    }
    let Some(spec) = &pod.spec else {
        return Resources::default();
    };
    let of = |c: &k8s_openapi::api::core::v1::Container| {
        let r = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        (
            r.and_then(|r| r.get("cpu")).map_or(0, |q| amount(q, 1000.0)),
            r.and_then(|r| r.get("memory")).map_or(0, |q| amount(q, 1.0)),
        )
    };
    let (cpu, memory) = spec
        .containers
        .iter()
        .map(of)
        .fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
    let (init_cpu, init_memory) = spec
        .init_containers
        .iter()
        .flatten()
        .map(of)
        .fold((0, 0), |(a, b), (c, d)| (a.max(c), b.max(d)));
    Resources {
        cpu_millis: cpu.max(init_cpu),
        memory_bytes: memory.max(init_memory),
        pods: 1,
    }
}

/// The tenants watched, by `<namespace>/<cluster>`.
pub struct TenantViews {
    views: PerTenant<TenantView>,
    wake: mpsc::UnboundedSender<Wake>,
}

impl TenantViews {
    /// None yet; the clusters their changes wake come out of the stream.
    pub fn new() -> (Self, mpsc::UnboundedReceiver<Wake>) {
        let (wake, woken) = mpsc::unbounded();
        (
            Self {
                views: PerTenant::default(),
                wake,
            },
            woken,
        )
    }

    /// The view of cluster `cluster` in `namespace`, whose admin kubeconfig is `secret`.
    pub async fn get(&self, namespace: &str, cluster: &str, secret: &Secret) -> Result<Arc<TenantView>> {
        self.views
            .get(namespace, cluster, secret, |clients| {
                let wake: Wake = ObjectRef::new(cluster).within(namespace);
                let (pods, pod_watch) = watch(
                    Api::<Pod>::all(clients.watches.clone()),
                    wake.clone(),
                    self.wake.clone(),
                );
                let (nodes, node_watch) = watch(Api::<Node>::all(clients.watches), wake, self.wake.clone());
                TenantView {
                    client: clients.requests,
                    pods,
                    nodes,
                    watches: [pod_watch, node_watch],
                }
            })
            .await
    }

    /// Stops watching a cluster that is gone or whose control plane does not serve.
    pub fn forget(&self, namespace: &str, cluster: &str) {
        self.views.forget(namespace, cluster);
    }
}

/// Watches `api` into a cache; every change wakes `cluster`.
fn watch<K>(api: Api<K>, cluster: Wake, wake: mpsc::UnboundedSender<Wake>) -> (Store<K>, tokio::task::JoinHandle<()>)
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let events = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    let task = tokio::spawn(async move {
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => {
                    let _ = wake.unbounded_send(cluster.clone());
                }
                Ok(_) => {}
                // A tenant that does not answer: the cache keeps what it last knew.
                Err(e) => debug!(error = %e, "a tenant watch failed; retrying"),
            }
        }
    });
    (reader, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_node_that_names_a_machine_of_ours_that_is_gone_is_stale() {
        let providers = vec![
            ("old-1".to_string(), Some("noops://tenants/old-1".to_string())),
            ("live-2".to_string(), Some("noops://tenants/live-2".to_string())),
            ("other".to_string(), Some("noops://elsewhere/old-3".to_string())),
            ("by-hand".to_string(), None),
        ];
        let machines = std::collections::BTreeSet::from(["live-2".to_string()]);
        assert_eq!(stale_nodes(&providers, "tenants", &machines), vec!["old-1".to_string()]);
    }
}
