//! Faults against an EtcdCluster while a client writes and reads: a member's etcd process
//! killed, a member's pod deleted, the operator killed, in a random order. After every fault
//! the cluster must come back to Ready with the same three members; at the end no
//! acknowledged write may be missing and no read may have gone back in time.
//!
//! `make test` runs a few rounds (`NOOPS_CHAOS_ETCD_FAULTS`, 5 by default); `make chaos` runs
//! hundreds and prints how many of each fault it injected and what was lost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
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

/// A small deterministic random sequence (xorshift), printed so that a run can be repeated.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, sides: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % sides
    }
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
    let rounds: usize = std::env::var("NOOPS_CHAOS_ETCD_FAULTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let seed = std::env::var("NOOPS_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| jiff::Timestamp::now().as_nanosecond() as u64 | 1);
    println!("chaos: seed {seed} (NOOPS_CHAOS_SEED repeats this run)");
    let mut dice = Dice(seed);

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
