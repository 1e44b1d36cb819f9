//! The tenant's API, as the Machine controller uses it: one client per cluster, made from the
//! control plane's admin kubeconfig Secret and kept while that Secret stays the same (a client
//! holds its connections; making one per pass would open new ones every time).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::core::{Error, Result};

/// The field manager of what the operator writes into a tenant.
const FIELD_MANAGER: &str = "noops";
/// What a machine's node agent needs beyond a kubelet's rights: every Node (to route their pod
/// ranges; the Node authorizer lets a node read only its own) and the Services and
/// EndpointSlices it answers cluster DNS from.
const MACHINE_ROLE: &str = "noops:machine";
/// A tenant that does not answer within this long is taken as unreachable for this pass.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Clients of tenants, by the uid and version of their admin kubeconfig Secret.
#[derive(Default)]
pub struct Tenants {
    clients: Mutex<HashMap<String, (String, Client)>>,
}

impl Tenants {
    /// The client of the tenant whose admin kubeconfig is `secret`.
    pub async fn client(&self, secret: &Secret) -> Result<Client> {
        let key = secret.uid().unwrap_or_default();
        let version = secret.resource_version().unwrap_or_default();
        if let Ok(clients) = self.clients.lock()
            && let Some((held, client)) = clients.get(&key)
            && *held == version
        {
            return Ok(client.clone());
        }
        let text = secret
            .data
            .as_ref()
            .and_then(|d| d.get("kubeconfig"))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .ok_or_else(|| Error::Blocked(format!("{} has no kubeconfig yet", secret.name_any())))?;
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&text)
            .map_err(|e| Error::Internal(format!("the tenant's admin kubeconfig cannot be read: {e}")))?;
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .map_err(|e| Error::Internal(format!("the tenant's admin kubeconfig cannot be used: {e}")))?;
        config.connect_timeout = Some(TIMEOUT);
        config.read_timeout = Some(TIMEOUT);
        config.write_timeout = Some(TIMEOUT);
        // An eviction a PodDisruptionBudget refuses answers 429: that is an answer for the drain
        // to act on, not a request to retry for minutes.
        config.default_retry = false;
        let client = Client::try_from(config).map_err(Error::Kube)?;
        if let Ok(mut clients) = self.clients.lock() {
            clients.insert(key, (version, client.clone()));
        }
        Ok(client)
    }
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
    Ok(Api::<Node>::all(client.clone()).get_opt(name).await?)
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
