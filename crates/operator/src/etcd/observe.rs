//! What an EtcdCluster reconcile sees: its children (from watch caches), what each member says
//! of itself, and etcd's member list; and, from those, the facts the membership planner needs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::reflector::Store;
use noops_api::EtcdCluster;

use super::client::{Credentials, EtcdAccess, ListedMember, MemberHealth};
use super::defrag;
use super::membership::{ClusterFacts, EMPTY_START_PATIENCE, MemberFacts, PodState};
use super::names::{CLUSTER_LABEL, MEMBER_LABEL, Names};

/// The children of an EtcdCluster, from the watch caches.
#[derive(Debug, Clone, Default)]
pub struct Children {
    /// Member pods, by member name.
    pub pods: BTreeMap<String, Arc<Pod>>,
    /// Member volumes, by member name.
    pub volumes: BTreeMap<String, Arc<PersistentVolumeClaim>>,
    pub secrets: BTreeMap<String, Arc<Secret>>,
    pub services: BTreeMap<String, Arc<Service>>,
    pub config_maps: BTreeMap<String, Arc<ConfigMap>>,
    pub budgets: BTreeMap<String, Arc<PodDisruptionBudget>>,
    /// Restore pods (of a cluster made from a backup), by pod name.
    pub restore_pods: BTreeMap<String, Arc<Pod>>,
}

/// The caches a reconcile reads children from.
pub struct Caches {
    pub pods: Store<Pod>,
    pub volumes: Store<PersistentVolumeClaim>,
    pub secrets: Store<Secret>,
    pub services: Store<Service>,
    pub config_maps: Store<ConfigMap>,
    pub budgets: Store<PodDisruptionBudget>,
    /// Every EtcdBackup (they carry no cluster label until scheduled, and outlive clusters).
    pub backups: Store<noops_api::etcd_backup::EtcdBackup>,
    /// Every Node: where members could be.
    pub nodes: Store<Node>,
}

fn of_cluster<K: kube::Resource>(objects: Vec<Arc<K>>, names: &Names) -> impl Iterator<Item = Arc<K>> {
    let (cluster, namespace) = (names.cluster.clone(), names.namespace.clone());
    objects.into_iter().filter(move |o| {
        o.meta().namespace.as_deref() == Some(namespace.as_str())
            && o.meta().labels.as_ref().and_then(|l| l.get(CLUSTER_LABEL)) == Some(&cluster)
    })
}

fn by_label<K: kube::Resource>(objects: impl Iterator<Item = Arc<K>>, label: &str) -> BTreeMap<String, Arc<K>> {
    objects
        .filter_map(|o| {
            let key = o.meta().labels.as_ref()?.get(label)?.clone();
            Some((key, o))
        })
        .collect()
}

fn by_name<K: kube::Resource>(objects: impl Iterator<Item = Arc<K>>) -> BTreeMap<String, Arc<K>> {
    objects.filter_map(|o| Some((o.meta().name.clone()?, o))).collect()
}

/// Why a pod cannot get its image.
const IMAGE_UNAVAILABLE: [&str; 4] = ["ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ImageNotMapped"];

/// How long `pod` has been unable to get its image (zero if it is not), from its creation:
/// a member's pod is made once per start, with the image it is to run.
fn image_missing_for(pod: &Pod, now: jiff::Timestamp) -> Duration {
    let missing = crate::core::stuck::stuck([pod], now).is_some_and(|s| IMAGE_UNAVAILABLE.contains(&s.reason));
    match pod.metadata.creation_timestamp.as_ref() {
        Some(created) if missing => Duration::try_from(now.duration_since(created.0)).unwrap_or_default(),
        _ => Duration::ZERO,
    }
}

/// Reads the children of one cluster from the caches.
pub fn children(caches: &Caches, names: &Names) -> Children {
    Children {
        pods: by_label(of_cluster(caches.pods.state(), names), MEMBER_LABEL),
        volumes: by_label(of_cluster(caches.volumes.state(), names), MEMBER_LABEL),
        secrets: by_name(of_cluster(caches.secrets.state(), names)),
        services: by_name(of_cluster(caches.services.state(), names)),
        config_maps: by_name(of_cluster(caches.config_maps.state(), names)),
        budgets: by_name(of_cluster(caches.budgets.state(), names)),
        restore_pods: by_name(of_cluster(caches.pods.state(), names).filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(crate::core::labels::COMPONENT))
                .map(String::as_str)
                == Some("restore")
        })),
    }
}

/// The credentials the client certificate Secret holds, if it is there.
pub fn credentials(children: &Children, names: &Names) -> Option<Credentials> {
    credentials_from(children.secrets.get(&names.client_secret())?, names)
}

/// The client certificate of a cluster, from its client Secret.
pub fn credentials_from(secret: &Secret, names: &Names) -> Option<Credentials> {
    let get = |key: &str| {
        secret
            .data
            .as_ref()?
            .get(key)
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
    };
    Some(Credentials {
        ca: get("ca.crt")?,
        cert: get("tls.crt")?,
        key: get("tls.key")?,
        server_name: names.tls_name(),
    })
}

/// What etcd says: each reachable member's own account, and the member list.
#[derive(Debug, Clone, Default)]
pub struct EtcdView {
    /// Members that answered, by member name (as the pod names them).
    pub health: BTreeMap<String, MemberHealth>,
    /// The member list; `None` when no member answered.
    pub listed: Option<Vec<ListedMember>>,
    /// The list came from the leader (another member's may lag behind).
    pub listed_by_leader: bool,
    /// Members of a cluster not started yet whose pods have been there for
    /// [`EMPTY_START_PATIENCE`] and that say they have no leader and have committed nothing
    /// (`empty_start.rs`).
    pub committed_nothing: BTreeSet<String>,
}

/// Asks the members of a cluster that has not started yet (no cluster ID recorded) that do not
/// answer as healthy, once their pods have been there for [`EMPTY_START_PATIENCE`], whether
/// they have committed anything at all.
pub async fn ask_empty_starts(etcd: &mut EtcdView, cluster: &EtcdCluster, children: &Children, now: jiff::Timestamp) {
    if cluster.status.as_ref().is_some_and(|s| s.cluster_id.is_some()) {
        return;
    }
    for (member, pod) in &children.pods {
        let healthy = etcd.health.get(member).is_some_and(MemberHealth::healthy);
        let made = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let waited = made.is_some_and(|made| {
            Duration::try_from(now.duration_since(made)).unwrap_or_default() >= EMPTY_START_PATIENCE
        });
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref());
        if let (false, true, Some(ip)) = (healthy, waited, ip)
            && super::empty_start::committed_nothing(ip).await
        {
            etcd.committed_nothing.insert(member.clone());
        }
    }
}

/// The URL the operator reaches a member's pod at, if it has an address and is not going.
pub fn pod_endpoint(pod: &Pod, names: &Names) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let ip = pod.status.as_ref()?.pod_ip.as_deref()?;
    Some(names.pod_url(ip))
}

/// Endpoints of the voting members that answered: a learner answers for itself only, and
/// refuses member list and membership calls.
pub fn voter_endpoints(etcd: &EtcdView, children: &Children, names: &Names) -> Vec<String> {
    etcd.health
        .iter()
        .filter(|(_, h)| !h.learner)
        .filter_map(|(m, _)| pod_endpoint(children.pods.get(m)?, names))
        .collect()
}

/// Asks every member pod how it is (at once), then the member list through the voting members
/// that answered.
pub async fn ask_etcd(access: &EtcdAccess, children: &Children, names: &Names) -> EtcdView {
    let targets: Vec<(String, String)> = children
        .pods
        .iter()
        .filter_map(|(member, pod)| Some((member.clone(), pod_endpoint(pod, names)?)))
        .collect();
    let answers = futures::future::join_all(targets.iter().map(|(_, endpoint)| access.health(endpoint))).await;
    let mut view = EtcdView::default();
    for ((member, _), answer) in targets.into_iter().zip(answers) {
        if let Ok(h) = answer {
            view.health.insert(member, h);
        }
    }
    // The leader's list holds every committed change; another member's may lag behind.
    let leader = view
        .health
        .iter()
        .find(|(_, h)| h.id != 0 && h.id == h.leader)
        .and_then(|(m, _)| pod_endpoint(children.pods.get(m)?, names));
    if let Some(leader) = leader
        && let Ok(list) = access.members(&[leader]).await
    {
        view.listed = Some(list);
        view.listed_by_leader = true;
        return view;
    }
    let voters = voter_endpoints(&view, children, names);
    if !voters.is_empty() {
        view.listed = access.members(&voters).await.ok();
    }
    view
}

/// The name of a listed member: its own once it has started, else the one its peer URL holds.
pub fn listed_name(member: &ListedMember, names: &Names) -> Option<String> {
    if !member.name.is_empty() {
        return Some(member.name.clone());
    }
    member.peer_urls.iter().find_map(|u| names.member_of_peer_url(u))
}

/// How long past its deletion deadline (deletion time plus grace period) a pod counts as
/// stuck: its node did not confirm that the process stopped.
pub const STUCK_AFTER: Duration = Duration::from_secs(15);

fn pod_state(pod: Option<&Arc<Pod>>, now: jiff::Timestamp) -> PodState {
    let Some(pod) = pod else { return PodState::Missing };
    if let Some(deadline) = &pod.metadata.deletion_timestamp {
        let past = Duration::try_from(now.duration_since(deadline.0)).unwrap_or_default();
        return if now > deadline.0 && past >= STUCK_AFTER {
            PodState::Stuck
        } else {
            PodState::Terminating
        };
    }
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if ready { PodState::Ready } else { PodState::Starting }
}

/// The image a member pod runs.
fn pod_image(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.containers.first()?.image.as_deref()
}

/// Members that are not healthy and the node that holds them, where that node is not Ready
/// (or its Node object is gone): the node its pod is bound to or, for a pod not placed yet or
/// none, the node its local volume is pinned to. Asked only about members that do not answer
/// healthy, so a healthy cluster reads no volume. Nodes come from the cache (`nodes`).
pub async fn nodes_down(
    client: &kube::Client,
    children: &Children,
    etcd: &EtcdView,
    nodes: &Store<Node>,
) -> Result<BTreeMap<String, String>, kube::Error> {
    let volume_api: kube::Api<PersistentVolume> = kube::Api::all(client.clone());
    let mut down = BTreeMap::new();
    let unhealthy: BTreeSet<&String> = children
        .pods
        .keys()
        .chain(children.volumes.keys())
        .filter(|m| !etcd.health.get(*m).is_some_and(MemberHealth::healthy))
        .collect();
    for member in unhealthy {
        let bound = children
            .pods
            .get(member)
            .and_then(|p| p.spec.as_ref()?.node_name.clone());
        let node = match bound {
            Some(node) => Some(node),
            None => match children
                .volumes
                .get(member)
                .and_then(|v| v.spec.as_ref()?.volume_name.clone())
            {
                // (Volumes are not watched: read only for a member whose pod is gone.)
                Some(pv) => crate::core::confirm::get(&volume_api, &pv, "volume-node-of-lost-member")
                    .await?
                    .as_ref()
                    .and_then(crate::core::nodes::pinned_node),
                None => None,
            },
        };
        let Some(node) = node else { continue };
        let is_ready = nodes
            .get(&kube::runtime::reflector::ObjectRef::new(&node))
            .is_some_and(|n| crate::core::nodes::ready(&n));
        if !is_ready {
            down.insert(member.clone(), node);
        }
    }
    Ok(down)
}

/// The pods of members etcd lists, and of the member an add or an upgrade is about: the pods
/// whose trouble is news. A member removed from etcd (being removed, or a leftover) stops and
/// restarts in its pod until that pod is deleted.
pub fn pods_that_serve<'a>(children: &'a Children, facts: &ClusterFacts) -> Vec<&'a Pod> {
    let joining = facts
        .operation
        .as_ref()
        .filter(|op| op.kind != noops_api::etcd::OperationKind::RemoveMember)
        .map(|op| op.member.as_str());
    children
        .pods
        .iter()
        .filter(|(member, _)| {
            Some(member.as_str()) == joining || facts.members.iter().any(|m| m.name == **member && m.id.is_some())
        })
        .map(|(_, pod)| pod.as_ref())
        .collect()
}

/// Whether `pod` is being deleted by a node that is Ready (`node_down`: its node is not), for
/// at most `LEAVING_PATIENCE` past its deadline.
fn leaving_live_node(pod: &Pod, node_down: bool, now: jiff::Timestamp) -> bool {
    let placed = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
    let Some(deadline) = pod.metadata.deletion_timestamp.as_ref() else {
        return false;
    };
    let past = Duration::try_from(now.duration_since(deadline.0)).unwrap_or_default();
    placed && !node_down && past < super::membership::LEAVING_PATIENCE
}

/// How long `member` has been unhealthy: since the status first said so, or since its pod was
/// made, whichever is later (a pod made again gets the whole grace period to start).
fn unhealthy_time(since: Option<&jiff::Timestamp>, pod: Option<&Arc<Pod>>, now: jiff::Timestamp) -> Duration {
    let made = pod.and_then(|p| p.metadata.creation_timestamp.as_ref()).map(|t| t.0);
    let from = match (since.copied(), made) {
        (Some(since), Some(made)) => since.max(made),
        (Some(since), None) => since,
        (None, _) => return Duration::ZERO,
    };
    Duration::try_from(now.duration_since(from)).unwrap_or_default()
}

/// The facts the membership planner needs: from the children, etcd's answers and the nodes
/// that are down (`nodes_down`). Pure.
pub fn facts(
    cluster: &EtcdCluster,
    names: &Names,
    children: &Children,
    etcd: &EtcdView,
    nodes_down: &BTreeMap<String, String>,
    nodes: &[Arc<Node>],
    now: jiff::Timestamp,
) -> ClusterFacts {
    let status = cluster.status.clone().unwrap_or_default();
    let listed: BTreeMap<String, &ListedMember> = etcd
        .listed
        .iter()
        .flatten()
        .filter_map(|m| Some((listed_name(m, names)?, m)))
        .collect();
    let mut member_names: BTreeSet<String> = listed.keys().cloned().collect();
    member_names.extend(children.pods.keys().cloned());
    member_names.extend(children.volumes.keys().cloned());
    if let Some(op) = &status.operation {
        member_names.insert(op.member.clone());
    }
    // Members of the last status that etcd could not be asked about are still members.
    if etcd.listed.is_none() {
        member_names.extend(status.members.iter().map(|m| m.name.clone()));
    }
    let seen = ClusterView {
        cluster,
        children,
        etcd,
        nodes_down,
        now,
        // The leader is the member that says it leads; another member's view may be behind.
        leader_id: etcd
            .health
            .values()
            .find(|h| h.leader != 0 && h.id == h.leader)
            .or_else(|| etcd.health.values().find(|h| h.leader != 0))
            .map(|h| h.leader),
        previous: status.members.iter().map(|m| (m.name.as_str(), m)).collect(),
        listed,
        wanted_image: super::pod::image(&names.image_repository, &cluster.spec.version),
        defrag_policy: defrag::policy(&cluster.spec.defragmentation),
    };
    let members = member_names
        .into_iter()
        .filter(|n| names.member_index(n).is_some())
        .map(|name| member_facts(name, &seen))
        .collect();
    let operation_age = status
        .operation
        .as_ref()
        .map(|op| Duration::try_from(now.duration_since(op.started_at.0)).unwrap_or_default())
        .unwrap_or_default();
    ClusterFacts {
        replicas: usize::try_from(cluster.spec.replicas).unwrap_or(1),
        bootstrapped: status.cluster_id.is_some(),
        reachable: etcd.listed.is_some(),
        listed_by_leader: etcd.listed_by_leader,
        image_repository: names.image_repository.clone(),
        members,
        operation: status.operation.clone(),
        operation_age,
        next_member: names.member(status.next_member_index),
        ephemeral: cluster.spec.storage.ephemeral,
        upgrade_to: Some(cluster.spec.version.clone()),
        // Known only to the reconcile, which reads the backup.
        restore: None,
        spread: super::spread::Spread::of(cluster, &children.pods, nodes, now),
        now,
    }
}

/// What [`facts`] has seen of the whole cluster, for the facts of each member.
struct ClusterView<'a> {
    cluster: &'a EtcdCluster,
    children: &'a Children,
    etcd: &'a EtcdView,
    nodes_down: &'a BTreeMap<String, String>,
    now: jiff::Timestamp,
    leader_id: Option<u64>,
    /// The members etcd lists, by name, and those the last status recorded.
    listed: BTreeMap<String, &'a ListedMember>,
    previous: BTreeMap<&'a str, &'a noops_api::etcd::MemberStatus>,
    wanted_image: String,
    defrag_policy: Option<defrag::Policy>,
}

/// The facts of member `name`. Pure.
fn member_facts(name: String, seen: &ClusterView) -> MemberFacts {
    let now = seen.now;
    let pod = seen.children.pods.get(&name);
    let listed_member = seen.listed.get(&name);
    let known = seen.previous.get(name.as_str());
    let id = listed_member.map(|m| m.id).or_else(|| {
        // Unreachable etcd: keep the ID the last status recorded.
        let recorded = known
            .and_then(|k| k.id.as_deref())
            .and_then(|i| u64::from_str_radix(i, 16).ok());
        seen.etcd.listed.is_none().then_some(recorded).flatten()
    });
    let health = seen.etcd.health.get(&name);
    let healthy = health.is_some_and(MemberHealth::healthy);
    let unhealthy_since = known.and_then(|k| k.unhealthy_since.as_ref()).map(|t| &t.0);
    let pod_made = pod.and_then(|p| p.metadata.creation_timestamp.as_ref()).map(|t| &t.0);
    let defragmented_lately = known
        .and_then(|k| k.defragmented_at.as_ref())
        .is_some_and(|t| Duration::try_from(now.duration_since(t.0)).unwrap_or_default() < defrag::AGAIN_AFTER);
    MemberFacts {
        learner: listed_member
            .map(|m| m.learner)
            .unwrap_or_else(|| known.is_some_and(|k| k.learner)),
        leader: id.is_some() && id == seen.leader_id,
        pod: pod_state(pod, now),
        volume: if seen.cluster.spec.storage.ephemeral {
            pod.is_some()
        } else {
            seen.children
                .volumes
                .get(&name)
                .is_some_and(|v| v.metadata.deletion_timestamp.is_none())
        },
        healthy,
        unhealthy_for: (!healthy).then(|| unhealthy_time(unhealthy_since, pod, now)),
        outdated: pod.is_some_and(|p| pod_image(p) != Some(seen.wanted_image.as_str())),
        node_down: seen.nodes_down.get(&name).cloned(),
        fresh_pod: matches!((pod_made, unhealthy_since), (Some(made), Some(since)) if made >= since),
        holds_nothing: seen.etcd.committed_nothing.contains(&name),
        volume_leaving: seen
            .children
            .volumes
            .get(&name)
            .is_some_and(|v| v.metadata.deletion_timestamp.is_some()),
        leaving_live_node: pod.is_some_and(|p| leaving_live_node(p, seen.nodes_down.contains_key(&name), now)),
        image_unavailable: pod
            .filter(|p| image_missing_for(p, now) >= super::membership::IMAGE_PULL_PATIENCE)
            .and_then(|p| pod_image(p).map(String::from)),
        fragmented: health.is_some_and(|h| {
            let policy = seen.defrag_policy.as_ref();
            policy.is_some_and(|p| defrag::fragmented(*p, h.db_size, h.db_size_in_use)) && !defragmented_lately
        }),
        id,
        name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::fixtures;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use noops_api::etcd::{EtcdClusterStatus, MemberStatus};

    fn ready_pod(member: &str, ip: &str) -> Arc<Pod> {
        let mut pod = Pod::default();
        pod.metadata.name = Some(member.into());
        pod.status = Some(PodStatus {
            pod_ip: Some(ip.into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        Arc::new(pod)
    }

    fn health(id: u64, leader: u64) -> MemberHealth {
        MemberHealth {
            id,
            cluster_id: 7,
            leader,
            version: "3.5.21".into(),
            learner: false,
            raft_index: 10,
            db_size: 1,
            db_size_in_use: 1,
            errors: vec![],
        }
    }

    #[test]
    fn members_come_from_etcd_the_pods_and_the_volumes() {
        let cluster = fixtures::cluster()
            .status(EtcdClusterStatus {
                cluster_id: Some("7".into()),
                next_member_index: 3,
                ..Default::default()
            })
            .build();
        let names = Names::of(&cluster);
        let mut children = Children::default();
        children.pods.insert("main-0".into(), ready_pod("main-0", "10.244.1.2"));
        children.pods.insert("main-1".into(), ready_pod("main-1", "10.244.2.2"));
        let etcd = EtcdView {
            health: BTreeMap::from([
                ("main-0".to_string(), health(1, 1)),
                ("main-1".to_string(), health(2, 1)),
            ]),
            listed: Some(vec![
                ListedMember {
                    id: 1,
                    name: "main-0".into(),
                    peer_urls: vec![names.peer_url("main-0")],
                    learner: false,
                },
                ListedMember {
                    id: 2,
                    name: "main-1".into(),
                    peer_urls: vec![names.peer_url("main-1")],
                    learner: false,
                },
                ListedMember {
                    id: 3,
                    name: String::new(),
                    peer_urls: vec![names.peer_url("main-2")],
                    learner: true,
                },
            ]),
            listed_by_leader: true,
            ..Default::default()
        };
        let f = facts(
            &cluster,
            &names,
            &children,
            &etcd,
            &BTreeMap::new(),
            &[],
            jiff::Timestamp::UNIX_EPOCH,
        );
        assert!(f.bootstrapped && f.reachable);
        assert_eq!(f.next_member, "main-3");
        let names_seen: Vec<&str> = f.members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names_seen,
            vec!["main-0", "main-1", "main-2"],
            "an unstarted learner named by its URL"
        );
        assert!(f.members[0].leader && f.members[0].healthy && !f.members[0].volume);
        assert!(f.members[2].learner && f.members[2].pod == PodState::Missing);
        assert_eq!(f.members[2].unhealthy_for, Some(Duration::ZERO));
    }

    #[test]
    fn a_pod_long_past_its_deletion_deadline_is_stuck() {
        let deadline = jiff::Timestamp::from_second(1000).unwrap();
        let mut pod = Pod::default();
        pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(deadline));
        let pod = Arc::new(pod);
        let at = |s: i64| pod_state(Some(&pod), jiff::Timestamp::from_second(s).unwrap());
        assert_eq!(at(990), PodState::Terminating, "within its grace period");
        assert_eq!(at(1010), PodState::Terminating, "its node may be a little late");
        assert_eq!(at(1000 + STUCK_AFTER.as_secs() as i64), PodState::Stuck);
    }

    #[test]
    fn only_pods_of_members_and_of_the_one_joining_can_be_stuck() {
        let cluster = fixtures::cluster().build();
        let names = Names::of(&cluster);
        let mut children = Children::default();
        for (member, ip) in [("main-0", "10.0.0.1"), ("main-3", "10.0.0.4"), ("main-4", "10.0.0.5")] {
            children.pods.insert(member.into(), ready_pod(member, ip));
        }
        let etcd = EtcdView {
            listed: Some(vec![ListedMember {
                id: 1,
                name: "main-0".into(),
                peer_urls: vec![names.peer_url("main-0")],
                learner: false,
            }]),
            ..Default::default()
        };
        let mut f = facts(
            &cluster,
            &names,
            &children,
            &etcd,
            &BTreeMap::new(),
            &[],
            jiff::Timestamp::UNIX_EPOCH,
        );
        let named = |f: &ClusterFacts| -> Vec<String> {
            pods_that_serve(&children, f)
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .collect()
        };
        assert_eq!(named(&f), vec!["main-0"], "main-3 and main-4 were removed from etcd");
        f.operation = Some(noops_api::etcd::Operation {
            kind: noops_api::etcd::OperationKind::AddMember,
            member: "main-4".into(),
            member_id: None,
            reason: "scale up".into(),
            version: None,
            node: None,
            started_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        });
        assert_eq!(named(&f), vec!["main-0", "main-4"], "the learner being added");
    }

    #[test]
    fn a_pod_ended_by_a_node_that_is_back_is_leaving_for_a_while() {
        let at = |s: i64| jiff::Timestamp::from_second(s).unwrap();
        let mut pod = Pod {
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                node_name: Some("node-2".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(!leaving_live_node(&pod, false, at(100)), "not being deleted");
        pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(100)));
        assert!(leaving_live_node(&pod, false, at(160)));
        assert!(!leaving_live_node(&pod, true, at(160)), "its node is down");
        assert!(!leaving_live_node(&pod, false, at(100 + 300)), "too long");
    }

    #[test]
    fn a_pod_made_again_gets_the_whole_grace_period_afresh() {
        let at = |s: i64| jiff::Timestamp::from_second(s).unwrap();
        let mut pod = Pod::default();
        pod.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(1100)));
        let pod = Arc::new(pod);
        assert_eq!(
            unhealthy_time(Some(&at(1000)), Some(&pod), at(1110)),
            Duration::from_secs(10),
            "its new pod"
        );
        assert_eq!(
            unhealthy_time(Some(&at(1000)), None, at(1110)),
            Duration::from_secs(110),
            "no pod"
        );
        assert_eq!(
            unhealthy_time(Some(&at(1200)), Some(&pod), at(1210)),
            Duration::from_secs(10),
            "unhealthy on that pod"
        );
        assert_eq!(unhealthy_time(None, Some(&pod), at(1210)), Duration::ZERO, "just now");
    }

    #[test]
    fn unhealthy_time_counts_from_the_status() {
        let since = jiff::Timestamp::from_second(1000).unwrap();
        let cluster = fixtures::cluster()
            .status(EtcdClusterStatus {
                members: vec![MemberStatus {
                    name: "main-0".into(),
                    id: Some("a".into()),
                    unhealthy_since: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(since)),
                    ..Default::default()
                }],
                ..Default::default()
            })
            .build();
        let names = Names::of(&cluster);
        let f = facts(
            &cluster,
            &names,
            &Children::default(),
            &EtcdView::default(),
            &BTreeMap::new(),
            &[],
            jiff::Timestamp::from_second(1040).unwrap(),
        );
        assert!(!f.reachable);
        assert_eq!(
            f.members[0].id,
            Some(10),
            "the last known ID, while etcd cannot be asked"
        );
        assert_eq!(f.members[0].unhealthy_for, Some(Duration::from_secs(40)));
    }
}
