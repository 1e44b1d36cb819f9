//! Members whose pods are gone come back on their own volumes, with or without a quorum: two of
//! three pods deleted at once, then all three, then all three while the operator is away, then
//! one pod and another's pod and volume (the second replaced once the first brings the quorum
//! back), with a client writing throughout; the operator killed while it makes the pods again;
//! and the case waiting cannot mend (two volumes of three gone), which is reported and left
//! alone. Needs `make cluster-up` (3 nodes).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use noops_api::etcd::EtcdClusterPhase;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use noops_api::EtcdCluster;
use noops_e2e::etcd::*;
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);
/// How soon a cluster whose member pods were deleted must be Ready again (the bound).
const BACK_WITHIN: Duration = Duration::from_secs(30);

/// The members' etcd IDs, by name, from the status.
fn member_ids(cluster: &EtcdCluster) -> BTreeMap<String, Option<String>> {
    cluster
        .status
        .as_ref()
        .map(|s| s.members.iter().map(|m| (m.name.clone(), m.id.clone())).collect())
        .unwrap_or_default()
}

/// The member pods of cluster `name` that exist, by name, with their UIDs.
async fn member_pods(ns: &TestNamespace, name: &str) -> BTreeMap<String, Pod> {
    ns.pods()
        .list(&ListParams::default().labels(&format!(
            "noops.dev/etcdcluster={name},app.kubernetes.io/component=member"
        )))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| (p.metadata.name.clone().unwrap(), p))
        .collect()
}

/// Deletes the pods of `victims` at once (their volumes stay) and waits until each has a new,
/// Ready pod and the cluster is Ready with the members it had (`ids`); returns how long that
/// took from the deletion.
async fn delete_pods_and_wait_back(
    ns: &TestNamespace,
    victims: &[&str],
    ids: &BTreeMap<String, Option<String>>,
) -> Duration {
    let before = member_pods(ns, "main").await;
    let started = Instant::now();
    for victim in victims {
        ns.pods().delete(victim, &DeleteParams::default()).await.unwrap();
    }
    wait_back(ns, victims, &before, ids, 2 * MINUTE).await;
    started.elapsed()
}

/// Waits until `victims` run in new, Ready pods (other than in `before`) and the cluster is
/// Ready with exactly the members of `ids`.
async fn wait_back(
    ns: &TestNamespace,
    victims: &[&str],
    before: &BTreeMap<String, Pod>,
    ids: &BTreeMap<String, Option<String>>,
    timeout: Duration,
) -> EtcdCluster {
    let api: Api<EtcdCluster> = ns.api();
    wait_for(
        &format!("{victims:?} back in new pods, the cluster Ready as before"),
        timeout,
        || async {
            let pods = member_pods(ns, "main").await;
            let renewed = victims.iter().all(|v| {
                pods.get(*v).is_some_and(|p| {
                    pod_ready(p)
                        && p.metadata.deletion_timestamp.is_none()
                        && p.metadata.uid != before.get(*v).and_then(|b| b.metadata.uid.clone())
                })
            });
            let cluster = api.get("main").await.ok()?;
            (renewed && cluster_ready(&cluster, 3) && member_ids(&cluster) == *ids).then_some(cluster)
        },
    )
    .await
}

#[tokio::test]
async fn member_pods_deleted_together_come_back_on_their_volumes_with_every_write() {
    install_crds();
    let ns = TestNamespace::new("etcd-back").await;
    let mut operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    ns.apply(&cluster_manifest("main", 3, &etcd_version("3.5"), ""));
    let ready = wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
    let ids = member_ids(&ready);
    let status = ready.status.clone().unwrap();
    let writer = Writer::start(etcd_client(&ns, "main", &[service_endpoint(&ns, "main").await]).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let told_before = cluster_events(&ns, "main").await.len();

    // Two of three at once, the leader among them: the quorum goes with them.
    let leader = status.leader.clone().unwrap();
    let other = follower(&ready).name;
    let took = delete_pods_and_wait_back(&ns, &[leader.as_str(), other.as_str()], &ids).await;
    println!("two of three member pods deleted: Ready again after {took:?}");
    assert!(took <= BACK_WITHIN, "two of three pods deleted: Ready after {took:?}");
    let events = cluster_events(&ns, "main").await;
    assert!(
        [&leader, &other].iter().all(|member| events
            .iter()
            .any(|(r, m)| r == "RestartingMembers" && m.starts_with(&format!("{member} ")))),
        "the restart is told, naming the members: {events:?}"
    );

    // All three at once.
    let took = delete_pods_and_wait_back(&ns, &["main-0", "main-1", "main-2"], &ids).await;
    println!("all three member pods deleted: Ready again after {took:?}");
    assert!(took <= BACK_WITHIN, "all three pods deleted: Ready after {took:?}");

    // All three while the operator is away: nothing makes them until it is back.
    operator.kill();
    let before = member_pods(&ns, "main").await;
    for member in ["main-0", "main-1", "main-2"] {
        ns.pods().delete(member, &DeleteParams::default()).await.unwrap();
    }
    wait_until("every member pod gone", MINUTE, || async {
        member_pods(&ns, "main").await.is_empty()
    })
    .await;
    let operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    wait_back(&ns, &["main-0", "main-1", "main-2"], &before, &ids, 2 * MINUTE).await;

    let back = wait_cluster_ready(&ns, "main", 3, MINUTE).await;
    assert_eq!(
        back.status.as_ref().unwrap().cluster_id,
        status.cluster_id,
        "the same cluster"
    );
    let events = cluster_events(&ns, "main").await;
    let since = &events[told_before.min(events.len())..];
    assert!(
        !since
            .iter()
            .any(|(r, _)| ["RemovingMember", "AddingMember", "Bootstrapping", "MemberPodStuck"].contains(&r.as_str())),
        "pods that come back replace no member, and none is stuck: {since:?}"
    );

    // One member loses its pod and volume, another its pod only, at once: the quorum goes;
    // the one with its volume comes back, and with the quorum back the other is removed, then
    // replaced under a new name, as any member that lost its data.
    lose_pod_and_volume(&ns, "main-2");
    ns.pods().delete("main-1", &DeleteParams::default()).await.unwrap();
    let replaced = wait_replaced(&ns, "main", 3, "main-2").await;
    let kept = member_ids(&replaced);
    assert_eq!(kept.get("main-0"), ids.get("main-0"));
    assert_eq!(kept.get("main-1"), ids.get("main-1"), "main-1 came back as itself");
    assert!(kept.contains_key("main-3"), "{kept:?}");
    assert_eq!(replaced.status.as_ref().unwrap().cluster_id, status.cluster_id);

    let history = writer.stop().await;
    let mut checker = members_client(&ns, "main", &replaced).await;
    // A member promoted a moment ago may not have applied its own promotion yet, and refuses
    // the request as a learner: asked again.
    let listed = wait_for("the member list", MINUTE, || {
        let mut checker = checker.clone();
        async move { checker.member_list().await.ok() }
    })
    .await;
    assert_eq!(listed.members().len(), 3, "no member left behind, none added twice");
    assert_no_write_lost(&history, &mut checker, 50).await;

    // Two volumes of three deleted with their pods, both before the operator can act (with
    // the quorum still there, it removes a member whose volume is going at once): too few
    // members keep their data for a quorum. Waiting cannot mend that; it is said, with the way
    // out, and nothing is made.
    let ids = kept;
    let lost = ["main-1", "main-3"];
    let mut operator = operator;
    operator.kill();
    for member in lost {
        lose_pod_and_volume(&ns, member);
    }
    let claims: Api<PersistentVolumeClaim> = ns.api();
    wait_until("both pods and volumes gone", 2 * MINUTE, || async {
        let pods = member_pods(&ns, "main").await;
        let mut gone = true;
        for member in lost {
            gone &= !pods.contains_key(member) && claims.get_opt(&format!("{member}-data")).await.unwrap().is_none();
        }
        gone
    })
    .await;
    let operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    let api: Api<EtcdCluster> = ns.api();
    let told = wait_for("QuorumLost saying waiting cannot help", 2 * MINUTE, || async {
        api.get("main").await.ok().filter(|c| {
            condition(c, "Ready").is_some_and(|(s, r, m)| {
                s == "False" && r == "QuorumLost" && m.contains("Waiting cannot bring it back")
            })
        })
    })
    .await;
    let (_, _, message) = condition(&told, "Ready").unwrap();
    assert!(
        message.contains("main-1 and main-3") && message.contains("noops.dev/recover-from-backup=latest"),
        "names the members without data and the recovery annotation: {message}"
    );
    assert_eq!(told.status.as_ref().unwrap().phase, Some(EtcdClusterPhase::QuorumLost));
    tokio::time::sleep(Duration::from_secs(15)).await;
    let pods: BTreeSet<String> = member_pods(&ns, "main").await.into_keys().collect();
    assert_eq!(
        pods,
        BTreeSet::from(["main-0".to_string()]),
        "no pod made for a member without its data"
    );
    for member in lost {
        assert!(
            claims.get_opt(&format!("{member}-data")).await.unwrap().is_none(),
            "no volume made again for {member}"
        );
    }
    let after = api.get("main").await.unwrap();
    assert_eq!(
        after.status.as_ref().unwrap().cluster_id,
        status.cluster_id,
        "nothing bootstrapped"
    );
    assert_eq!(member_ids(&after), ids, "no membership change without a quorum");
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

#[tokio::test]
async fn the_operator_killed_while_it_starts_members_again_finishes_with_no_duplicate_member() {
    install_crds();
    let ns = TestNamespace::new("etcd-back-crash").await;
    let crash_points = std::env::temp_dir().join(format!("noops-crash-points-{}", ns.name));
    let _ = std::fs::remove_file(&crash_points);
    let supervisor = Supervisor::start(&ns.name, &crash_points);
    ns.apply(&cluster_manifest("main", 3, &etcd_version("3.5"), ""));
    let ready = wait_cluster_ready(&ns, "main", 3, 4 * MINUTE).await;
    let ids = member_ids(&ready);
    let writer = Writer::start(etcd_client(&ns, "main", &[service_endpoint(&ns, "main").await]).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let told_before = cluster_events(&ns, "main").await.len();

    // The operator kills itself once the first pod is made again, before the others.
    delete_pods_and_wait_back(&ns, &["main-0", "main-1", "main-2"], &ids).await;

    let history = writer.stop().await;
    let back = wait_cluster_ready(&ns, "main", 3, MINUTE).await;
    let mut checker = members_client(&ns, "main", &back).await;
    let listed: BTreeSet<String> = checker
        .member_list()
        .await
        .unwrap()
        .members()
        .iter()
        .map(|m| format!("{:x}", m.id()))
        .collect();
    let recorded: BTreeSet<String> = ids.values().flatten().cloned().collect();
    assert_eq!(
        listed, recorded,
        "etcd lists exactly the members it had: no duplicate, none lost"
    );
    assert_no_write_lost(&history, &mut checker, 20).await;
    let events = cluster_events(&ns, "main").await;
    let since = &events[told_before.min(events.len())..];
    assert!(
        !since
            .iter()
            .any(|(r, _)| ["RemovingMember", "AddingMember"].contains(&r.as_str())),
        "{since:?}"
    );
    let (restarts, logs) = supervisor.stop().await;
    let points = std::fs::read_to_string(&crash_points).unwrap_or_default();
    assert!(
        points.lines().any(|p| p == "restart: a member's pod made again"),
        "the operator died between two of the pods it made again: {points}"
    );
    assert!(
        restarts >= 1 && !logs.contains("panicked"),
        "{restarts} restarts:\n{logs}"
    );
}
