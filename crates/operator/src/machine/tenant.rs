//! The tenant's API, as the Machine controller uses it: per cluster, a client made from the
//! control plane's admin kubeconfig Secret (kept while that Secret stays the same: a client
//! holds its connections) and a watch of the tenant's Nodes, whose every change wakes the
//! Machine of that name. A pass reads its Node from that cache; only a deletion, which acts on
//! the Node and must tell a tenant that does not answer, reads it from the API.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use noops_api::Machine;
use serde_json::json;
use tracing::debug;

use crate::core::Result;
use crate::core::tenant::{PerTenant, TIMEOUT};

/// The field manager of what the operator writes into a tenant.
const FIELD_MANAGER: &str = "noops";
/// What a machine's node agent needs beyond a kubelet's rights: every Node (to route their pod
/// ranges; the Node authorizer lets a node read only its own) and the Services and
/// EndpointSlices it answers cluster DNS from.
const MACHINE_ROLE: &str = "noops:machine";

/// What wakes a Machine: the reference its Node's change is sent as.
pub type Wake = ObjectRef<DeserializeGuard<Machine>>;

/// One tenant: its clients, the cache of its Nodes, the watch that fills it.
pub struct Tenant {
    /// For requests (`core::tenant`).
    pub client: Client,
    nodes: Store<Node>,
    watch: tokio::task::JoinHandle<()>,
    /// Whether the machines' role has been granted through this client.
    granted: AtomicBool,
}

impl Drop for Tenant {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

impl Tenant {
    /// The Node `name` from the watch cache (waiting a moment for its first list); an error
    /// when the tenant has not answered that list.
    pub async fn node(&self, name: &str) -> std::result::Result<Option<Node>, String> {
        tokio::time::timeout(TIMEOUT, self.nodes.wait_until_ready())
            .await
            .map_err(|_| "the tenant has not listed its Nodes yet".to_string())?
            .map_err(|e| e.to_string())?;
        Ok(self.nodes.get(&ObjectRef::new(name)).map(|n| (*n).clone()))
    }

    /// Grants machines' node agents what they need, once per client.
    pub async fn grant_machine_role(&self) -> Result<()> {
        if !self.granted.load(Ordering::Relaxed) {
            grant_machine_role(&self.client).await?;
            self.granted.store(true, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// The tenants, by `<namespace>/<control plane>`.
pub struct Tenants {
    tenants: PerTenant<Tenant>,
    wake: mpsc::UnboundedSender<Wake>,
}

impl Tenants {
    /// No tenant yet; the Machines their Nodes' changes wake come out of the stream.
    pub fn new() -> (Self, mpsc::UnboundedReceiver<Wake>) {
        let (wake, woken) = mpsc::unbounded();
        let tenants = Self {
            tenants: PerTenant::default(),
            wake,
        };
        (tenants, woken)
    }

    /// The tenant of control plane `cluster` in `namespace`, whose admin kubeconfig is `secret`.
    pub async fn get(&self, namespace: &str, cluster: &str, secret: &Secret) -> Result<Arc<Tenant>> {
        self.tenants
            .get(namespace, cluster, secret, |clients| {
                let (nodes, watch) = watch_nodes(clients.watches, namespace.to_string(), self.wake.clone());
                Tenant {
                    client: clients.requests,
                    nodes,
                    watch,
                    granted: AtomicBool::new(false),
                }
            })
            .await
    }

    /// Forgets the tenant of a control plane that is gone or going: its watch stops.
    pub fn forget(&self, namespace: &str, cluster: &str) {
        self.tenants.forget(namespace, cluster);
    }
}

/// Watches the tenant's Nodes into a cache; each change wakes the Machine of the Node's name in
/// `namespace` (a Node that is no Machine's wakes nothing: the controller has no such object).
fn watch_nodes(
    client: Client,
    namespace: String,
    wake: mpsc::UnboundedSender<Wake>,
) -> (Store<Node>, tokio::task::JoinHandle<()>) {
    let (reader, writer) = reflector::store();
    let events = watcher(Api::<Node>::all(client), watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    let store = reader.clone();
    let task = tokio::spawn(async move {
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            let changed: Vec<String> = match event {
                Ok(watcher::Event::Apply(node) | watcher::Event::Delete(node)) => vec![node.name_any()],
                Ok(watcher::Event::InitDone) => store.state().iter().map(|n| n.name_any()).collect(),
                Ok(_) => Vec::new(),
                // A tenant that does not answer: the cache keeps what it last knew.
                Err(e) => {
                    debug!(%namespace, error = %e, "the tenant's Node watch failed; retrying");
                    Vec::new()
                }
            };
            for name in changed {
                let _ = wake.unbounded_send(ObjectRef::new(&name).within(&namespace));
            }
        }
    });
    (reader, task)
}

/// Grants machines' node agents what they need in the tenant (idempotent).
pub async fn grant_machine_role(client: &Client) -> Result<()> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": { "name": MACHINE_ROLE, "labels": { "app.kubernetes.io/managed-by": "noops" } },
        "rules": [
            { "apiGroups": [""], "resources": ["nodes", "services"], "verbs": ["get", "list", "watch"] },
            { "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"] },
        ],
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": { "name": MACHINE_ROLE, "labels": { "app.kubernetes.io/managed-by": "noops" } },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": MACHINE_ROLE },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes" }],
    });
    Api::<ClusterRole>::all(client.clone())
        .patch(MACHINE_ROLE, &params, &Patch::Apply(role))
        .await?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(MACHINE_ROLE, &params, &Patch::Apply(binding))
        .await?;
    Ok(())
}

/// The tenant's Node `name`, if it has one.
pub async fn node(client: &Client, name: &str) -> Result<Option<Node>> {
    // (A tenant's Nodes are not watched: asked when a machine's is looked at.)
    let nodes = Api::<Node>::all(client.clone());
    Ok(crate::core::confirm::get(&nodes, name, "tenant-node").await?)
}

/// The taint that says a Node is about to go (KEP-3836): kube-proxy's `/healthz` answers 503
/// on such a Node, so a load balancer that checks it stops sending the machine traffic before
/// it is drained and removed.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// Marks the Node unschedulable and about to go (idempotent).
pub async fn cordon(client: &Client, node: &Node) -> Result<()> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    let tainted = taints.iter().any(|t| t.key == TO_BE_DELETED_TAINT);
    let unschedulable = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    if tainted && unschedulable {
        return Ok(());
    }
    if !tainted {
        taints.push(k8s_openapi::api::core::v1::Taint {
            key: TO_BE_DELETED_TAINT.into(),
            value: Some(jiff::Timestamp::now().as_second().to_string()),
            effect: "NoSchedule".into(),
            time_added: None,
        });
    }
    let body = json!({ "spec": { "unschedulable": true, "taints": taints } });
    match Api::<Node>::all(client.clone())
        .patch(&name, &PatchParams::default(), &Patch::Merge(body))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the Node; true once it is gone.
pub async fn delete_node(client: &Client, name: &str) -> Result<bool> {
    match Api::<Node>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await
    {
        // Nodes carry no finalizers: a deleted Node is gone.
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(true),
        Err(e) => Err(e.into()),
    }
}
