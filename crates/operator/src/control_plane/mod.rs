//! The KubernetesControlPlane controller: a tenant's Kubernetes control plane as pods of this
//! cluster, its etcd an EtcdCluster of this operator.
//!
//! Watches the control planes and what they own (the EtcdCluster, the Service, the Deployments,
//! the certificate Secrets, the components' pods) and the etcd client certificate the
//! EtcdCluster makes, and reconciles each control plane in one pass (`reconcile.rs`: the core's
//! stages), a file per stage:
//! 1. `observe.rs`: the children from watch caches, the version each part runs;
//! 2. validate: the version must name a release (`versions.rs`), and until it has served the
//!    tenant's ranges must not overlap this cluster's (`ranges.rs`; observe reads them from the
//!    API, the one read of the API here: nodes and ServiceCIDRs are not watched for a check
//!    made only at the start);
//! 3. `plan.rs`: which part moves to which release, in upgrade order (pure; the progress is
//!    read back from the children, so a restarted operator carries on);
//! 4. `desired.rs`, `certificates.rs`: the children and the certificates (pure);
//! 5. `act.rs`: apply them, make the CAs and issue what is due;
//! 6. `status.rs`: the status (pure), written only if it changed, with Events for what changed.

mod act;
pub(crate) mod certificates;
mod context;
mod desired;
mod endpoint;
#[cfg(test)]
mod fixtures;
pub(crate) mod names;
mod observe;
mod plan;
mod ranges;
mod reconcile;
mod spread;
mod status;
pub(crate) mod versions;

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Secret, Service};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use noops_api::{EtcdCluster, KubernetesControlPlane};

use crate::core::cache::shared_cache;
use crate::core::controller::Runtime;
use crate::core::engine::{ControllerOf, Wiring, engine};
use crate::core::labels;
use context::State;
use names::CONTROL_PLANE_LABEL;

engine! {
    /// The KubernetesControlPlane engine.
    KubernetesControlPlanes reconciles KubernetesControlPlane with State, named "kubernetescontrolplane", 8 at once:
    "KubernetesControlPlane: a tenant's Kubernetes control plane on an EtcdCluster"
}

/// The label the etcd controller puts on what an EtcdCluster owns (its client certificate).
const ETCD_CLUSTER_LABEL: &str = "noops.dev/etcdcluster";

/// The control plane an object labelled with `key` = `value` belongs to (`strip`: the suffix
/// its name adds, such as `-etcd`).
fn owner_of(
    object: &impl ResourceExt,
    key: &str,
    strip: &str,
) -> Option<ObjectRef<kube::core::DeserializeGuard<KubernetesControlPlane>>> {
    let value = object.labels().get(key)?;
    let name = value.strip_suffix(strip)?;
    Some(ObjectRef::new(name).within(&object.namespace()?))
}

/// Its caches, and its controller woken by what changes them.
async fn wire(runtime: &Runtime, controller: ControllerOf<KubernetesControlPlane>) -> Wiring<KubernetesControlPlanes> {
    let ours = watcher::Config::default().labels(CONTROL_PLANE_LABEL);
    let (etcd_clusters, etcd_changes) = runtime.cache::<EtcdCluster>(ours.clone()).await;
    let (deployments, deployment_changes) = runtime.cache::<Deployment>(ours.clone()).await;
    let (services, service_changes) = runtime.cache::<Service>(ours.clone()).await;
    let (pods, pod_changes) = runtime.cache::<Pod>(ours).await;
    // Which nodes could take a component's pod that shares a node with another (spread.rs).
    let (nodes, _) = shared_cache(
        kube::Api::<Node>::all(runtime.client.clone()),
        watcher::Config::default(),
    )
    .await;
    // Its own certificates, and the etcd client certificate its EtcdCluster makes.
    let noops = watcher::Config::default().labels(&labels::managed_by_noops());
    let (secrets, secret_changes) = runtime.cache::<Secret>(noops).await;
    let state = State {
        etcd_clusters,
        deployments,
        services,
        secrets,
        pods,
        nodes,
        evictions: runtime.client_asking_once.clone(),
        certificate_lifetime: runtime.certificate_lifetime,
        images: runtime.images.clone(),
    };
    let controller = controller
        // A child change wakes its control plane only after the cache holds it.
        .owns_shared_stream(etcd_changes)
        .owns_shared_stream(deployment_changes)
        .owns_shared_stream(service_changes)
        .watches_shared_stream(secret_changes, |secret: Arc<Secret>| {
            owner_of(secret.as_ref(), CONTROL_PLANE_LABEL, "")
                .or_else(|| owner_of(secret.as_ref(), ETCD_CLUSTER_LABEL, "-etcd"))
        })
        // A component's pod that starts, fails or recovers wakes its control plane.
        .watches_shared_stream(pod_changes, |pod: Arc<Pod>| {
            owner_of(pod.as_ref(), CONTROL_PLANE_LABEL, "")
        });
    Wiring::new(state, controller)
}
