//! Faults against an EtcdCluster while a client writes and reads: a member's etcd process
//! killed, a member's pod deleted, the operator killed, in a random order. After every fault
//! the cluster must come back to Ready with the same three members; at the end no
//! acknowledged write may be missing and no read may have gone back in time. And a majority of
//! the member pods deleted at once, at a random moment of a scale up, a scale down or an
//! upgrade: the quorum goes, the members come back on their volumes, the change finishes.
//!
//! `make test` runs a few rounds (`NOOPS_CHAOS_ETCD_FAULTS`, 5 by default, and
//! `NOOPS_CHAOS_ETCD_MAJORITY_FAULTS`, 3 by default); `make chaos` runs hundreds and prints how
//! many of each fault it injected and what was lost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kube::api::DeleteParams;
use noops_e2e::etcd::*;
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);

/// The faults, drawn at random.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// SIGKILL to a member's etcd process (its container restarts it).
    KillMemberProcess,
    /// A member's pod deleted (the operator starts it again on its volume, as itself).
    DeleteMemberPod,
    /// The operator killed and started again (it carries on from status).
    KillOperator,
}

/// One run of a member's pod: which pod, how often its container restarted, and whether Ready.
struct Incarnation {
    uid: Option<String>,
    restarts: i32,
    ready: bool,
}

async fn incarnation(ns: &TestNamespace, member: &str) -> Incarnation {
    let pod = ns.pods().get_opt(member).await.ok().flatten();
    Incarnation {
        uid: pod.as_ref().and_then(|p| p.metadata.uid.clone()),
        restarts: pod
            .as_ref()
            .and_then(|p| {
                p.status
                    .as_ref()?
                    .container_statuses
                    .as_ref()?
                    .first()
                    .map(|c| c.restart_count)
            })
            .unwrap_or(0),
        ready: pod
            .as_ref()
            .is_some_and(|p| pod_ready(p) && p.metadata.deletion_timestamp.is_none()),
    }
}

#[tokio::test]
async fn repeated_member_and_operator_faults_lose_no_acknowledged_write() {
    let rounds = chaos::rounds("NOOPS_CHAOS_ETCD_FAULTS", 5);
    let mut dice = chaos::Dice::from_env();

    install_crds();
    let ns = TestNamespace::new("etcd-chaos").await;
    let mut operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    ns.apply(&cluster_manifest("main", 3, &etcd_version("3.5"), ""));
    wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
    let members = ["main-0", "main-1", "main-2"];
    // Through the client Service: member pods come back with new addresses.
    let writer = Writer::start(etcd_client(&ns, "main", &[service_endpoint(&ns, "main").await]).await);

    let (mut process_kills, mut pod_deletions, mut operator_kills) = (0, 0, 0);
    for round in 0..rounds {
        let fault = match dice.roll(3) {
            0 => Fault::KillMemberProcess,
            1 => Fault::DeleteMemberPod,
            _ => Fault::KillOperator,
        };
        let member = members[dice.roll(3) as usize];
        let before = incarnation(&ns, member).await;
        // A container killed again and again waits longer and longer before its restart (the
        // crash back-off): after two restarts its pod is deleted instead, which starts afresh.
        let fault = match fault {
            Fault::KillMemberProcess if before.restarts >= 2 => Fault::DeleteMemberPod,
            other => other,
        };
        match fault {
            Fault::KillMemberProcess => {
                kill_member_process(&ns, "main", member);
                process_kills += 1;
            }
            Fault::DeleteMemberPod => {
                ns.pods().delete(member, &DeleteParams::default()).await.unwrap();
                pod_deletions += 1;
            }
            Fault::KillOperator => {
                operator.kill();
                tokio::time::sleep(Duration::from_millis(500)).await;
                operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
                operator_kills += 1;
            }
        }
        // The fault has happened (a restarted container, a new pod, a new operator leading)
        // before Ready is asked for again: the status must not be the one from before it.
        match fault {
            Fault::KillMemberProcess | Fault::DeleteMemberPod => {
                wait_until(&format!("{member} to start again and be Ready"), 2 * MINUTE, || async {
                    let now = incarnation(&ns, member).await;
                    now.ready && (now.uid != before.uid || now.restarts > before.restarts)
                })
                .await;
            }
            Fault::KillOperator => {
                wait_until("the new operator to lead", MINUTE, || async {
                    operator.metric("noops_leader").await == Some(1.0)
                })
                .await;
            }
        }
        let back = wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
        let names: BTreeSet<String> = back.status.unwrap().members.into_iter().map(|m| m.name).collect();
        assert_eq!(
            names,
            members.iter().map(|m| m.to_string()).collect(),
            "round {round} ({fault:?} on {member}): the same members come back, none is replaced"
        );
    }
    let history = writer.stop().await;
    let mut checker = etcd_client(&ns, "main", &member_endpoints(&ns, &members).await).await;
    let lost = match history.lost_writes(&mut checker).await {
        Ok(lost) => lost.len().to_string(),
        Err(e) => format!("not known ({e})"),
    };
    println!(
        "chaos: injected {process_kills} member process kills, {pod_deletions} member pod deletions, \
         {operator_kills} operator kills; {} acknowledged writes, {} failed operations, lost: {lost}",
        history.acked_writes(),
        history.failed()
    );
    assert_no_write_lost(&history, &mut checker, 10).await;
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

/// A change a majority deletion falls into.
#[derive(Debug, Clone, Copy)]
enum Change {
    ScaleUp,
    Upgrade,
    ScaleDown,
}

#[tokio::test]
async fn a_majority_of_member_pods_deleted_during_scaling_and_upgrades_loses_no_acknowledged_write() {
    let rounds = chaos::rounds("NOOPS_CHAOS_ETCD_MAJORITY_FAULTS", 3);
    let mut dice = chaos::Dice::from_env();
    let (from, to) = (etcd_version("3.5"), etcd_version("3.6"));

    install_crds();
    let ns = TestNamespace::new("etcd-majority").await;
    let _operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    let (mut deleted, mut injected, mut lost_total) = (0usize, BTreeMap::<&str, usize>::new(), 0usize);
    // Each cluster goes through an upgrade, a scale up and a scale down (one upgrade per cluster:
    // etcd has no way back), a majority of its pods deleted in the middle of each.
    let mut round = 0;
    let mut generation = 0;
    while round < rounds {
        let name = format!("c{generation}");
        generation += 1;
        ns.apply(&cluster_manifest(&name, 3, &from, ""));
        wait_cluster_ready(&ns, &name, 3, 3 * MINUTE).await;
        let writer = Writer::start(etcd_client(&ns, &name, &[service_endpoint(&ns, &name).await]).await);
        let mut replicas_now = 3;
        for change in [Change::Upgrade, Change::ScaleUp, Change::ScaleDown] {
            if round >= rounds {
                break;
            }
            round += 1;
            let (replicas, spec) = match change {
                Change::Upgrade => (3, serde_json::json!({ "version": to })),
                Change::ScaleUp => (5, serde_json::json!({ "replicas": 5 })),
                Change::ScaleDown => (3, serde_json::json!({ "replicas": 3 })),
            };
            patch_spec(&ns, &name, spec).await;
            // A random moment of the change: once the operator has begun it (its operation in
            // the status), from at once to well into it (a scale down of two members takes
            // two seconds or so, an upgrade of three some ten).
            let api: kube::Api<noops_api::EtcdCluster> = ns.api();
            let begun = wait_for(&format!("round {round}: the {change:?} begun"), MINUTE, || async {
                let c = api.get(&name).await.ok()?;
                let status = c.status.as_ref()?;
                (status.operation.is_some() || cluster_ready(&c, replicas)).then_some(status.operation.is_some())
            })
            .await;
            let span = match change {
                Change::Upgrade => 10_000,
                Change::ScaleUp => 5_000,
                Change::ScaleDown => 1_500,
            };
            tokio::time::sleep(Duration::from_millis(dice.roll(span))).await;
            // A majority of the member pods there are (members being added or removed
            // included), whatever the status says yet.
            let members: Vec<String> = ns
                .pods()
                .list(&kube::api::ListParams::default().labels(&format!(
                    "noops.dev/etcdcluster={name},app.kubernetes.io/component=member"
                )))
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter_map(|p| p.metadata.name)
                .collect();
            let majority = members.len() / 2 + 1;
            let mut victims = members.clone();
            while victims.len() > majority {
                victims.remove(dice.roll(victims.len() as u64) as usize);
            }
            let mut gone = BTreeMap::new();
            for victim in &victims {
                gone.insert(victim.clone(), incarnation(&ns, victim).await.uid);
                let _ = ns.pods().delete(victim, &DeleteParams::default()).await;
            }
            deleted += victims.len();
            *injected
                .entry(match change {
                    Change::Upgrade => "an upgrade",
                    Change::ScaleUp => "a scale up",
                    Change::ScaleDown => "a scale down",
                })
                .or_default() += 1;
            let when = if begun { "during" } else { "after" };
            println!("chaos: round {round} ({change:?} of {name}): deleted {victims:?} of {members:?}, {when} it");
            replicas_now = replicas;
            // Ready as asked, every member in a Ready pod, none of them a pod deleted above (the
            // status may still say Ready from before the deletion).
            let back = wait_for(&format!("round {round}: {name} Ready again"), 5 * MINUTE, || async {
                let cluster = api.get(&name).await.ok().filter(|c| cluster_ready(c, replicas))?;
                for member in member_names(&cluster) {
                    let now = incarnation(&ns, &member).await;
                    if !now.ready || gone.get(&member).is_some_and(|uid| *uid == now.uid) {
                        return None;
                    }
                }
                Some(cluster)
            })
            .await;
            if matches!(change, Change::Upgrade) {
                wait_on_version(&ns, &name, replicas, &to).await;
            }
            let ids: Vec<_> = back.status.unwrap().members.iter().map(|m| m.id.clone()).collect();
            assert_eq!(ids.len(), replicas as usize, "round {round}: {ids:?}");
        }
        let history = writer.stop().await;
        let cluster = wait_cluster_ready(&ns, &name, replicas_now, MINUTE).await;
        let mut checker = members_client(&ns, &name, &cluster).await;
        let lost = history
            .lost_writes(&mut checker)
            .await
            .map(|l| l.len())
            .unwrap_or(usize::MAX);
        lost_total = lost_total.saturating_add(lost);
        assert_no_write_lost(&history, &mut checker, 10).await;
        ns.api::<noops_api::EtcdCluster>()
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
    }
    println!(
        "chaos: injected {} majority deletions of member pods ({deleted} pods; {}); lost: {lost_total}",
        injected.values().sum::<usize>(),
        injected
            .iter()
            .map(|(k, v)| format!("{v} during {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}
