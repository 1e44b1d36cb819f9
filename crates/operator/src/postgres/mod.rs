//! The PostgreSQL controller.
//!
//! Watches PostgreSQLs, the StatefulSets, pods, Services, Secrets and ConfigMaps they own,
//! every PostgresBackup, and the metadata of every Secret (so that a changed password or
//! backup credentials Secret wakes the database that names it), and reconciles each database in
//! one pass on the core's stages (`reconcile.rs`), a file per question:
//! - `observe.rs`: the children and backups, from the watch caches;
//! - `secrets.rs`: the user's password (and what is wrong with its Secret), the superuser's
//!   and the connection Secrets;
//! - `restore.rs`: what an empty data directory becomes (a new database, or a restore from
//!   which backup), pure; `destination.rs`: whether the instance can be given its backup
//!   destination (a bad one leaves the StatefulSet as it is), pure;
//! - `statefulset.rs`, `services.rs`: the children, pure; `store.rs`: where backups live;
//! - `database.rs`, `sql.rs`: what the operator does and learns in the database;
//! - `backups.rs`: the first and the scheduled backups, and retention;
//! - `node_loss.rs`: a node that died with the instance (and its volume) on it, pure;
//! - `lease.rs`: the primary's lease: when its holder stops, when it may be handed over;
//!   `failover.rs`: which replica is promoted, pure; `switchover.rs`: a primary that steps
//!   down for a replica a user names, pure; `position.rs`: WAL positions they compare;
//! - `drain.rs`: the PodDisruptionBudgets, and a primary whose node is drained, pure;
//! - `rollout.rs`: a change of the pod rolled out replicas first, then one switchover, pure;
//! - `replication.rs`: replicas: the primary's slots for them, the members of the status,
//!   the pods' role labels, pure;
//! - `status.rs`, `events.rs`: the status and the Events, pure, written only on change;
//! - `image.rs`: the image and user of the instance and of the backup pods; `problem.rs`: why
//!   the spec cannot be carried out, as the status says it;
//! - `instance/`: the instance manager, which runs in the pods (`noops pg-instance`);
//! - `backup/`: the PostgresBackup controller.

pub mod account;
pub mod backup;
pub mod backups;
mod context;
pub mod database;
pub mod destination;
pub mod drain;
pub mod events;
pub mod failover;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod image;
pub mod instance;
pub mod lease;
pub mod lease_clock;
pub mod names;
pub mod node_loss;
pub mod observe;
pub mod placement;
pub mod position;
pub mod problem;
mod reconcile;
pub mod replication;
pub mod restore;
pub mod rollout;
#[cfg(test)]
mod rollout_interleavings;
pub mod secrets;
pub mod services;
pub mod spread;
pub mod sql;
pub mod statefulset;
pub mod status;
pub mod store;
pub mod switchover;
pub mod synchronous;

use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use noops_api::{PostgreSQL, PostgresBackup};

use crate::core::cache::{concerned, shared_cache};
use crate::core::controller::Runtime;
use crate::core::engine::{ControllerOf, Wiring, engine};
use crate::core::user_secrets::UserSecrets;
use context::State;

engine! {
    /// The PostgreSQL engine.
    PostgreSQLs reconciles PostgreSQL with State, named "postgres", 8 at once:
    "PostgreSQL: a database, its owner and password, behind a Service; WAL archiving, backups and restores"
}

/// Its caches, and its controller woken by what changes them.
async fn wire(runtime: &Runtime, controller: ControllerOf<PostgreSQL>) -> Wiring<PostgreSQLs> {
    let ours = watcher::Config::default().labels(names::POSTGRES_LABEL);
    let (statefulsets, statefulset_changes) = runtime.cache::<StatefulSet>(ours.clone()).await;
    let (pods, pod_changes) = runtime.cache::<Pod>(ours.clone()).await;
    let (services, service_changes) = runtime.cache::<Service>(ours.clone()).await;
    let (secrets, _) = runtime.cache::<Secret>(ours.clone()).await;
    let (config_maps, _) = runtime.cache::<ConfigMap>(ours.clone()).await;
    let (claims, claim_changes) = runtime.cache::<PersistentVolumeClaim>(ours.clone()).await;
    let (backups, backup_changes) = runtime.cache::<PostgresBackup>(watcher::Config::default()).await;
    let (service_accounts, _) = runtime.cache::<ServiceAccount>(ours.clone()).await;
    let (roles, _) = runtime.cache::<Role>(ours.clone()).await;
    let (role_bindings, _) = runtime.cache::<RoleBinding>(ours.clone()).await;
    let (leases, lease_changes) = runtime.cache::<Lease>(ours.clone()).await;
    let (budgets, _) = runtime.cache::<PodDisruptionBudget>(ours).await;
    let (nodes, node_changes) = shared_cache(
        kube::Api::<Node>::all(runtime.client.clone()),
        watcher::Config::default(),
    )
    .await;
    // A renewal every second wakes nobody: the clock wakes a database when its lease runs out
    // or is given up.
    let (lease_clock, lease_wakes) = lease_clock::LeaseClock::start(lease_changes);
    let (user_secrets, secret_changes) = UserSecrets::watch(&runtime.client, &runtime.namespace).await;
    let pods_of_nodes = pods.clone();
    let databases = controller.store();
    let state = State {
        user_secrets,
        caches: observe::Caches {
            statefulsets,
            pods,
            services,
            secrets,
            config_maps,
            claims,
            backups,
            service_accounts,
            roles,
            role_bindings,
            leases,
            budgets,
            nodes,
        },
        lease_clock,
        started: jiff::Timestamp::now(),
        databases: databases.clone(),
        image: runtime.image.clone(),
        images: runtime.images.clone(),
    };
    let controller = controller
        .owns_shared_stream(statefulset_changes)
        // The instance's pod is the StatefulSet's: its label names the database.
        .watches_shared_stream(pod_changes, |pod: Arc<Pod>| {
            let database = pod.labels().get(names::POSTGRES_LABEL).cloned();
            database.map(|name| ObjectRef::new(&name).within(&pod.namespace().unwrap_or_default()))
        })
        // So does a Service of it (one deleted is made again at once, or, paused, said
        // missing).
        .watches_shared_stream(service_changes, |service: Arc<Service>| {
            let database = service.labels().get(names::POSTGRES_LABEL).cloned();
            database.map(|name| ObjectRef::new(&name).within(&service.namespace().unwrap_or_default()))
        })
        // So does its volume claim (a claim gone lets a pod that waited for it be replaced).
        .watches_shared_stream(claim_changes, |claim: Arc<PersistentVolumeClaim>| {
            let database = claim.labels().get(names::POSTGRES_LABEL).cloned();
            database.map(|name| ObjectRef::new(&name).within(&claim.namespace().unwrap_or_default()))
        })
        // A backup wakes the database it is of, and one that starts from it.
        .watches_shared_stream(backup_changes, {
            let databases = databases.clone();
            move |backup: Arc<PostgresBackup>| {
                let name = backup.name_any();
                concerned(&databases, &backup.namespace().unwrap_or_default(), |pg| {
                    pg.name_any() == backup.spec.postgresql || backups::starting_from(pg) == Some(&name)
                })
            }
        })
        // So does a password or bucket-key Secret the databases that name it.
        .watches_shared_stream(secret_changes, move |secret: Arc<PartialObjectMeta<Secret>>| {
            let name = secret.name_any();
            concerned(&databases, &secret.namespace().unwrap_or_default(), |pg| {
                let credentials = pg
                    .spec
                    .backup
                    .as_ref()
                    .and_then(|b| b.plan.destination.s3.as_ref())
                    .map(|s3| &s3.credentials_secret);
                pg.spec.password_secret == name || credentials == Some(&name)
            })
        })
        // A node cordoned (a drain begins) wakes the databases with an instance on it: a
        // primary there switches over before the drain asks again. A node that can take pods
        // again wakes those whose instances share a node: one may move apart now.
        .watches_shared_stream(node_changes, node_wakes(pods_of_nodes))
        .reconcile_on(lease_wakes);
    Wiring::new(state, controller)
}

/// Maps a node's changes to the databases to wake: those with an instance on it, once, when it
/// is cordoned; those with two instances on one node, once, when it could take a pod again
/// (uncordoned, Ready again, or new). Its status changes every few seconds and wakes nobody.
fn node_wakes(
    pods: kube::runtime::reflector::Store<Pod>,
) -> impl Fn(Arc<Node>) -> Vec<lease_clock::Wake> + Send + Sync + 'static {
    let seen = std::sync::Mutex::new(NodesSeen::default());
    move |node: Arc<Node>| {
        let name = node.name_any();
        let mut seen = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let newly_cordoned = if observe::cordoned(&node) {
            seen.cordoned.insert(name.clone())
        } else {
            seen.cordoned.remove(&name);
            false
        };
        let newly_open = if crate::core::nodes::could_hold(&node, &[], None, &Default::default()) {
            seen.open.insert(name.clone())
        } else {
            seen.open.remove(&name);
            false
        };
        if !newly_cordoned && !newly_open {
            return Vec::new();
        }
        let instances = pods.state();
        let instances = instances.iter().filter_map(|p| {
            let database = p.labels().get(names::POSTGRES_LABEL)?;
            let at = ObjectRef::new(database).within(&p.namespace().unwrap_or_default());
            Some((at, observe::node(p)?))
        });
        let mut databases: Vec<lease_clock::Wake> = if newly_cordoned {
            instances.filter(|(_, on)| *on == name).map(|(at, _)| at).collect()
        } else if newly_open {
            let mut sharing = std::collections::HashSet::new();
            let mut placed = std::collections::HashSet::new();
            for (at, on) in instances {
                if !placed.insert((at.clone(), on)) {
                    sharing.insert(at);
                }
            }
            sharing.into_iter().collect()
        } else {
            Vec::new()
        };
        databases.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        databases.dedup();
        databases
    }
}

/// The nodes a node watch has seen cordoned, and able to take a pod.
#[derive(Default)]
struct NodesSeen {
    cordoned: std::collections::BTreeSet<String>,
    open: std::collections::BTreeSet<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus, PodSpec};
    use kube::runtime::watcher::Event;

    fn node(name: &str, cordoned: bool) -> Arc<Node> {
        Arc::new(Node {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                unschedulable: Some(cordoned),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        })
    }

    fn instance(database: &str, name: &str, on: &str) -> Pod {
        Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                labels: Some([(names::POSTGRES_LABEL.to_string(), database.to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(on.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_node_that_can_take_pods_again_wakes_the_databases_whose_instances_share_a_node() {
        let (pods, mut writer) = kube::runtime::reflector::store::<Pod>();
        for pod in [
            instance("shop", "shop-0", "n1"),
            instance("shop", "shop-1", "n1"),
            instance("apart", "apart-0", "n1"),
            instance("apart", "apart-1", "n2"),
        ] {
            writer.apply_watcher_event(&Event::Apply(pod));
        }
        let wakes = node_wakes(pods);
        let names = |w: Vec<lease_clock::Wake>| w.into_iter().map(|w| w.name).collect::<Vec<_>>();
        // Cordoned: it wakes the databases with an instance on it, once.
        assert_eq!(names(wakes(node("n2", true))), vec!["apart"]);
        assert!(wakes(node("n2", true)).is_empty());
        // Open again: the database whose two instances share n1, once.
        assert_eq!(names(wakes(node("n2", false))), vec!["shop"]);
        assert!(wakes(node("n2", false)).is_empty(), "a status change wakes nobody");
        // A node first seen open (a new one, or the operator's start) counts as open again.
        assert_eq!(names(wakes(node("n3", false))), vec!["shop"]);
    }
}
