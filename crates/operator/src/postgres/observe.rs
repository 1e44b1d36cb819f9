//! What a PostgreSQL reconcile sees of its children, from the watch caches.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::runtime::reflector::{ObjectRef, Store};

use super::names::Names;

/// The caches a reconcile reads children from (objects with the `noops.dev/postgres` label).
pub struct Caches {
    pub statefulsets: Store<StatefulSet>,
    pub pods: Store<Pod>,
    pub services: Store<Service>,
    pub secrets: Store<Secret>,
}

/// The children of one PostgreSQL.
#[derive(Debug, Clone, Default)]
pub struct Children {
    pub statefulset: Option<Arc<StatefulSet>>,
    pub instance: Option<Arc<Pod>>,
    pub service: Option<Arc<Service>>,
    pub superuser_secret: Option<Arc<Secret>>,
    pub connection_secret: Option<Arc<Secret>>,
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
        service: get(&caches.services, &names.service(), ns),
        superuser_secret: get(&caches.secrets, &names.superuser_secret(), ns),
        connection_secret: get(&caches.secrets, &names.connection_secret(), ns),
    }
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

/// The node a pod runs on.
pub fn node(pod: &Pod) -> Option<String> {
    pod.spec.as_ref()?.node_name.clone()
}
