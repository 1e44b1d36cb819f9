//! The EtcdCluster controller.
//!
//! Watches EtcdClusters and the pods and volumes they own, and reconciles each cluster in one
//! pass (`reconcile.rs`: the core's stages), a file per question:
//! - `observe.rs`: the children (from watch caches), what each member says of itself
//!   (`client.rs`, the only way the operator talks to etcd), and the facts the planner needs;
//! - `validate.rs`: what the schema cannot check (owned flags, the version against what runs);
//! - `membership.rs`: the next membership step, pure: bootstrap, learner join and promotion,
//!   scale up and down, removal of a lost member before its successor is added;
//! - `spread.rs`: members apart: which share a node, and which to move where, pure;
//! - `bootstrap.rs`, `tls.rs`, `pod.rs`, `volume.rs`, `services.rs`: the children, pure;
//! - `status.rs`: the status, pure, written only if it changed;
//! - `backups.rs`, `restore.rs`: scheduled backups and retention, and a restore's pods;
//!   `store.rs`, `snapshot.rs`: where snapshots live and how one is streamed there.
//!
//! Beside it, in this wing: `backup/`, the EtcdBackup controller, and `agent/`, the programs
//! the backup and restore pods run (`noops save-snapshot`, `fetch-snapshot`, ...).
//!
//! All progress of a membership change is in the status: a restarted operator carries it on.

mod act;
pub mod agent;
pub mod backup;
pub mod backups;
pub mod bootstrap;
pub mod client;
mod context;
pub mod defrag;
pub mod disruption;
mod empty_start;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod membership;
pub mod names;
pub mod observe;
pub mod pod;
mod reconcile;
pub mod restore;
pub mod services;
pub mod snapshot;
pub mod spread;
pub mod status;
pub mod store;
pub mod tls;
pub mod user_tls;
pub mod validate;
pub mod volume;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::core::{DeserializeGuard, PartialObjectMeta};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use noops_api::{EtcdBackup, EtcdCluster};

use crate::core::cache::{concerned, shared_cache};
use crate::core::controller::Runtime;
use crate::core::engine::{ControllerOf, Wiring, engine};
use crate::core::user_secrets::UserSecrets;
use context::State;

engine! {
    /// The EtcdCluster engine.
    EtcdClusters reconciles EtcdCluster with State, named "etcd", 8 at once:
    "EtcdCluster: etcd clusters that keep their quorum and their data"
}

/// Its caches, and its controller woken by what changes them.
async fn wire(runtime: &Runtime, controller: ControllerOf<EtcdCluster>) -> Wiring<EtcdClusters> {
    let ours = watcher::Config::default().labels(names::CLUSTER_LABEL);
    let (pods, pod_changes) = runtime.cache::<Pod>(ours.clone()).await;
    let (volumes, volume_changes) = runtime.cache::<PersistentVolumeClaim>(ours.clone()).await;
    let (secrets, _) = runtime.cache::<Secret>(ours.clone()).await;
    let (services, _) = runtime.cache::<Service>(ours.clone()).await;
    let (config_maps, _) = runtime.cache::<ConfigMap>(ours.clone()).await;
    let (budgets, _) = runtime.cache::<PodDisruptionBudget>(ours).await;
    // Which nodes could hold a member: members that share a node move to one that holds none.
    let (nodes, _) = shared_cache(
        kube::Api::<Node>::all(runtime.client.clone()),
        watcher::Config::default(),
    )
    .await;
    let (backups, backup_changes) = runtime.cache::<EtcdBackup>(watcher::Config::default()).await;
    let (user_secrets, secret_changes) = UserSecrets::watch(&runtime.client, &runtime.namespace).await;
    let controller = controller
        // A member's pod or volume that changes wakes its cluster once the cache holds it.
        .owns_shared_stream(pod_changes)
        .owns_shared_stream(volume_changes);
    let clusters = controller.store();
    let state = State {
        caches: observe::Caches {
            pods,
            volumes,
            secrets,
            services,
            config_maps,
            budgets,
            backups,
            nodes,
        },
        user_secrets,
        image: runtime.image.clone(),
        certificate_lifetime: runtime.certificate_lifetime,
        images: runtime.images.clone(),
        clusters: clusters.clone(),
    };
    let controller = controller
        // A backup wakes the cluster it is of, and one that starts from it.
        .watches_shared_stream(backup_changes, {
            let clusters = clusters.clone();
            move |backup: Arc<EtcdBackup>| {
                let name = backup.name_any();
                concerned(&clusters, &backup.namespace().unwrap_or_default(), |cluster| {
                    cluster.name_any() == backup.spec.cluster || backups::starting_from(cluster) == Some(&name)
                })
            }
        })
        // A user's certificate Secret wakes the clusters that name it.
        .watches_shared_stream(secret_changes, {
            let clusters = clusters.clone();
            move |secret: Arc<PartialObjectMeta<Secret>>| {
                let name = secret.name_any();
                concerned(&clusters, &secret.namespace().unwrap_or_default(), |cluster| {
                    names::Names::of(cluster).user_secret_names().contains(&name)
                })
            }
        });
    // The health series of a deleted cluster go with it (judged only in the namespace this
    // instance watches).
    let (scope, metrics) = (runtime.namespace.clone(), runtime.metrics.clone());
    let janitor = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(30)).await;
            metrics.retain_etcd_clusters(|ns, name| {
                scope.as_deref().is_some_and(|watched| watched != ns)
                    || clusters
                        .get(&ObjectRef::<DeserializeGuard<EtcdCluster>>::new(name).within(ns))
                        .is_some()
            });
        }
    });
    Wiring {
        state,
        controller,
        beside: vec![janitor],
    }
}
