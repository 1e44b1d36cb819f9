//! Faults against a PostgreSQL with backups while a client commits: the operator killed, the
//! instance's pod deleted, its volume lost (the claim and the pod deleted), in a random order.
//! After every fault it must serve again with its rows running without a hole: all of them
//! when the volume stayed, and at least every row committed before the last archived segment
//! when the volume was lost (it is restored from the base backup and the archived WAL).
//!
//! `make test` runs a few rounds (`NOOPS_CHAOS_PG_FAULTS`, 3 by default); `make chaos` runs
//! hundreds and prints how many of each fault it injected and what was lost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use noops_e2e::postgres::*;
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);
const CONTROLLERS: [&str; 2] = ["--controllers", "postgres,postgresbackup"];

/// The faults, drawn at random.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// The operator killed and started again.
    KillOperator,
    /// The instance's pod deleted: it comes back on its volume.
    DeletePod,
    /// The instance's volume claim and pod deleted: it comes back restored.
    LoseVolume,
}

#[tokio::test]
async fn repeated_operator_pod_and_volume_faults_lose_no_archived_commit() {
    let rounds = chaos::rounds("NOOPS_CHAOS_PG_FAULTS", 3);
    let mut dice = chaos::Dice::from_env();

    install_crds();
    let ns = TestNamespace::new("pg-chaos").await;
    s3::deploy(&ns);
    s3::create_bucket(&ns, "pg-backups").await;
    let mut operator = Operator::start(&ns.name, &CONTROLLERS);
    ns.apply(&manifest("shop", "pw", &backup_to_bucket(&ns, "pg-backups", "")));
    wait_ready(&ns, "shop", 3 * MINUTE).await;
    wait_condition(&ns, "shop", "BackupSucceeded", "True", 2 * MINUTE).await;
    let mut ip = instance_ip(&ns, "shop").await;
    psql(&ip, "app", "pw", "shop", "CREATE TABLE items (id bigint PRIMARY KEY)").unwrap();
    let superuser = superuser_password(&ns, "shop").await;

    let (mut operator_kills, mut pod_deletions, mut volume_losses) = (0, 0, 0);
    let (mut committed, mut lost) = (0i64, 0i64);
    let mut kept = 0i64;
    for round in 0..rounds {
        let writer = Writer::start(&ip, "app", "pw", "shop", kept, Duration::from_millis(20)).await;
        wait_until("the client commits", MINUTE, || async { writer.acked() >= kept + 20 }).await;
        // The first rounds inject one fault of each kind; the rest are drawn.
        let draw = if round < 3 { round as u64 } else { dice.roll(3) };
        let fault = match draw {
            0 => Fault::KillOperator,
            1 => Fault::DeletePod,
            _ => Fault::LoseVolume,
        };
        // What must survive: everything, unless the volume goes; then what is archived.
        let archived = writer.acked();
        let segment = current_segment(&ip, &superuser);
        wait_archived(&ip, &superuser, &segment, MINUTE).await;
        let old = ns.pods().get("shop-0").await.unwrap().metadata.uid;
        match fault {
            Fault::KillOperator => {
                operator.kill();
                operator = Operator::start(&ns.name, &CONTROLLERS);
                operator_kills += 1;
            }
            Fault::DeletePod => {
                kubectl_ok(&["delete", "pod", "-n", &ns.name, "shop-0", "--wait=false"], None);
                pod_deletions += 1;
            }
            Fault::LoseVolume => {
                lose_the_volume(&ns, "shop").await;
                volume_losses += 1;
            }
        }
        if matches!(fault, Fault::KillOperator) {
            tokio::time::sleep(Duration::from_secs(1)).await;
        } else {
            wait_new_instance(&ns, "shop", &old, 3 * MINUTE).await;
        }
        let acked = writer.stop().await;
        wait_ready(&ns, "shop", 3 * MINUTE).await;
        ip = instance_ip(&ns, "shop").await;
        let now = contiguous_ids(&ip, "app", "pw", "shop");
        let must_keep = match fault {
            Fault::LoseVolume => archived,
            Fault::KillOperator | Fault::DeletePod => acked,
        };
        assert!(
            now >= must_keep,
            "round {round} ({fault:?}): {now} rows, but {must_keep} were committed {}",
            if matches!(fault, Fault::LoseVolume) {
                "and archived"
            } else {
                "on a volume that stayed"
            }
        );
        committed += acked - kept;
        lost += (acked - now).max(0);
        kept = now;
    }
    println!(
        "chaos: injected {operator_kills} operator kills, {pod_deletions} pod deletions, {volume_losses} volume losses; \
         {committed} rows committed, {lost} lost (all committed after the last archived segment before a volume loss), \
         none archived lost"
    );
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}
