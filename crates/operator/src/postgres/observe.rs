//! What a PostgreSQL reconcile sees of its children, from the watch caches.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::runtime::reflector::{ObjectRef, Store};
use noops_api::PostgresBackup;

use super::names::Names;

/// The caches a reconcile reads children from (objects with the `noops.dev/postgres` label).
pub struct Caches {
    pub statefulsets: Store<StatefulSet>,
    pub pods: Store<Pod>,
    pub services: Store<Service>,
    pub secrets: Store<Secret>,
    pub config_maps: Store<ConfigMap>,
    pub claims: Store<PersistentVolumeClaim>,
    /// Every PostgresBackup (they carry no label of ours when a user makes one).
    pub backups: Store<PostgresBackup>,
    /// The instances' service accounts, Roles and RoleBindings, and the primaries' leases.
    pub service_accounts: Store<ServiceAccount>,
    pub roles: Store<Role>,
    pub role_bindings: Store<RoleBinding>,
    pub leases: Store<Lease>,
    pub budgets: Store<PodDisruptionBudget>,
    /// Every node: which are being drained.
    pub nodes: Store<Node>,
}

/// The children of one PostgreSQL.
#[derive(Debug, Clone, Default)]
pub struct Children {
    pub statefulset: Option<Arc<StatefulSet>>,
    /// The first instance's pod (the primary).
    pub instance: Option<Arc<Pod>>,
    /// Every pod of the database's label: its instances (`replication::instance_pods`).
    pub pods: Vec<Arc<Pod>>,
    pub service: Option<Arc<Service>>,
    /// The Services by name: `<name>`, `-rw`, `-ro`, `-r`.
    pub services: std::collections::BTreeMap<String, Arc<Service>>,
    pub superuser_secret: Option<Arc<Secret>>,
    pub connection_secret: Option<Arc<Secret>>,
    pub instance_config: Option<Arc<ConfigMap>>,
    /// The instance's volume claim (made by the StatefulSet from its template).
    pub data_claim: Option<Arc<PersistentVolumeClaim>>,
    pub service_account: Option<Arc<ServiceAccount>>,
    pub role: Option<Arc<Role>>,
    pub role_binding: Option<Arc<RoleBinding>>,
    /// The primary's lease (with replicas).
    pub lease: Option<Arc<Lease>>,
    /// The PodDisruptionBudgets by name (`drain.rs`).
    pub budgets: std::collections::BTreeMap<String, Arc<PodDisruptionBudget>>,
    /// The nodes being drained (cordoned).
    pub cordoned: std::collections::BTreeSet<String>,
}

impl Children {
    /// The children with the primary `primary`: its pod and volume claim are the instance's.
    pub fn with_primary(mut self, caches: &Caches, names: &Names, primary: &str) -> Self {
        self.instance = get(&caches.pods, primary, &names.namespace);
        self.data_claim = get(&caches.claims, &names.data_claim_of(primary), &names.namespace);
        self
    }
}

fn get<K>(store: &Store<K>, name: &str, namespace: &str) -> Option<Arc<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    store.get(&ObjectRef::new(name).within(namespace))
}

pub fn children(caches: &Caches, names: &Names) -> Children {
    let ns = &names.namespace;
    Children {
        statefulset: get(&caches.statefulsets, &names.statefulset(), ns),
        instance: get(&caches.pods, &names.instance(), ns),
        pods: caches
            .pods
            .state()
            .into_iter()
            .filter(|p| {
                p.metadata.namespace.as_deref() == Some(ns.as_str())
                    && p.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(super::names::POSTGRES_LABEL))
                        == Some(&names.name)
            })
            .collect(),
        service: get(&caches.services, &names.service(), ns),
        services: [
            names.service(),
            names.service_rw(),
            names.service_ro(),
            names.service_r(),
        ]
        .into_iter()
        .filter_map(|n| Some((n.clone(), get(&caches.services, &n, ns)?)))
        .collect(),
        superuser_secret: get(&caches.secrets, &names.superuser_secret(), ns),
        connection_secret: get(&caches.secrets, &names.connection_secret(), ns),
        instance_config: get(&caches.config_maps, &names.instance_config(), ns),
        data_claim: get(&caches.claims, &names.data_claim(), ns),
        service_account: get(&caches.service_accounts, &names.instance_account(), ns),
        role: get(&caches.roles, &names.instance_account(), ns),
        role_binding: get(&caches.role_bindings, &names.instance_account(), ns),
        lease: get(&caches.leases, &names.lease(), ns),
        budgets: [names.primary_budget(), names.replicas_budget()]
            .into_iter()
            .filter_map(|n| Some((n.clone(), get(&caches.budgets, &n, ns)?)))
            .collect(),
        cordoned: caches
            .nodes
            .state()
            .iter()
            .filter(|n| cordoned(n))
            .filter_map(|n| n.metadata.name.clone())
            .collect(),
    }
}

/// How the pod's `bootstrap` init container (which makes the data directory) stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bootstrap {
    /// It works (an initdb, or a restore).
    Working,
    /// It failed, and says why (its last termination message).
    Failed(String),
    /// Done, or not started.
    Idle,
}

/// How the bootstrap init container of `pod` stands.
pub fn bootstrap(pod: &Pod) -> Bootstrap {
    let Some(container) = pod
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|all| all.iter().find(|c| c.name == "bootstrap"))
    else {
        return Bootstrap::Idle;
    };
    let state = container.state.clone().unwrap_or_default();
    let failed = |t: &k8s_openapi::api::core::v1::ContainerStateTerminated| {
        (t.exit_code != 0).then(|| {
            let said = t.message.as_deref().map(str::trim).filter(|m| !m.is_empty());
            said.map_or_else(
                || format!("exited with code {}", t.exit_code),
                // The last line that says something: a panic ends with a note on backtraces.
                |m| {
                    m.lines()
                        .map(str::trim)
                        .rfind(|l| !l.is_empty() && !l.starts_with("note: run with"))
                        .unwrap_or(m)
                        .to_string()
                },
            )
        })
    };
    if state.running.is_some() {
        return Bootstrap::Working;
    }
    if let Some(message) = state.terminated.as_ref().and_then(failed) {
        return Bootstrap::Failed(message);
    }
    if state.waiting.is_some()
        && let Some(message) = container
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .and_then(failed)
    {
        return Bootstrap::Failed(message);
    }
    Bootstrap::Idle
}

/// The pod's address, if it is Ready (the server accepts connections).
pub fn ready_address(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready || pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    status.pod_ip.clone().filter(|ip| !ip.is_empty())
}

/// The instance's pod, if it can never start: it is not Ready and its volume claim is gone or
/// going (a volume deleted with its pod can leave a new pod that the StatefulSet made while
/// the old claim was still there, and that waits for it forever). Deleting it lets the
/// StatefulSet make the pod and a new claim together.
pub fn pod_without_its_claim(children: &Children) -> Option<String> {
    let pod = children.instance.as_deref()?;
    if pod.metadata.deletion_timestamp.is_some() || ready_address(pod).is_some() {
        return None;
    }
    let claim_gone = children
        .data_claim
        .as_deref()
        .is_none_or(|c| c.metadata.deletion_timestamp.is_some());
    claim_gone.then(|| pod.metadata.name.clone()).flatten()
}

/// Whether `node` is being drained (cordoned: nothing new is scheduled on it).
pub fn cordoned(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

/// The node a pod runs on.
pub fn node(pod: &Pod) -> Option<String> {
    pod.spec.as_ref()?.node_name.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ready: bool, deleting: bool) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "shop-0", "deletionTimestamp": deleting.then_some("2026-11-24T10:00:00Z") },
                "status": { "podIP": "10.0.0.5", "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }] },
            }))
            .unwrap(),
        )
    }

    fn claim(deleting: bool) -> Arc<PersistentVolumeClaim> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "data-shop-0", "deletionTimestamp": deleting.then_some("2026-11-24T10:00:00Z") },
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_pod_waiting_for_a_claim_that_is_gone_is_deleted_and_no_other() {
        let with = |pod: Arc<Pod>, claim: Option<Arc<PersistentVolumeClaim>>| Children {
            instance: Some(pod),
            data_claim: claim,
            ..Default::default()
        };
        assert_eq!(
            pod_without_its_claim(&with(pod(false, false), None)).as_deref(),
            Some("shop-0")
        );
        assert_eq!(
            pod_without_its_claim(&with(pod(false, false), Some(claim(true)))).as_deref(),
            Some("shop-0")
        );
        assert_eq!(
            pod_without_its_claim(&with(pod(false, false), Some(claim(false)))),
            None,
            "it waits for its claim"
        );
        assert_eq!(
            pod_without_its_claim(&with(pod(true, false), Some(claim(true)))),
            None,
            "it serves on its volume still"
        );
        assert_eq!(
            pod_without_its_claim(&with(pod(false, true), None)),
            None,
            "it is going already"
        );
    }
}
