//! Crash safety of the PostgreSQL operator: the operator kills itself (SIGKILL) at every point
//! where it has acted and not yet recorded it (its crash points, `NOOPS_CRASH_POINTS`), once
//! each, and is killed besides while a base backup pod runs and while a lost volume is being
//! restored; a supervisor starts it again each time. Through a first backup, scheduled
//! backups with retention, an on-demand backup and the restore of a lost volume, with a client
//! committing throughout: every phase converges, no backup is left half-made, and every row
//! committed before the last archived segment survives. Prints how many distinct crash points
//! it went through. Needs `make cluster-up`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use noops_api::backup::BackupPhase;
use std::time::Duration;

use noops_api::PostgresBackup;
use noops_e2e::postgres::*;
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);

fn phase(backup: &PostgresBackup) -> &str {
    backup
        .status
        .as_ref()
        .and_then(|s| s.progress.phase)
        .map_or("", BackupPhase::as_str)
}

#[tokio::test]
async fn the_operator_killed_during_backups_and_a_restore_converges_and_loses_no_data() {
    install_crds();
    let ns = TestNamespace::new("pg-crash").await;
    s3::deploy(&ns);
    s3::create_bucket(&ns, "pg-backups").await;
    let points = std::env::temp_dir().join(format!("noops-pg-crash-points-{}", ns.name));
    let _ = std::fs::remove_file(&points);
    let supervisor = Supervisor::start(&ns.name, &points);
    let schedule = "    schedule: \"*/10 * * * * *\"\n    maxBackups: 2\n";
    ns.apply(&manifest("shop", "pw", &backup_to_bucket(&ns, "pg-backups", schedule)));
    wait_ready(&ns, "shop", 4 * MINUTE).await;
    let pg = wait_condition(&ns, "shop", "BackupSucceeded", "True", 3 * MINUTE).await;
    let first = pg.status.unwrap().backups.last_backup.unwrap();
    let ip = instance_ip(&ns, "shop").await;
    let superuser = superuser_password(&ns, "shop").await;
    psql(&ip, "app", "pw", "shop", "CREATE TABLE items (id bigint PRIMARY KEY)").unwrap();
    let writer = Writer::start(&ip, "app", "pw", "shop", 0, Duration::from_millis(50)).await;

    // An on-demand backup, the operator killed while its pod runs.
    ns.apply("apiVersion: noops.dev/v1alpha1\nkind: PostgresBackup\nmetadata: { name: on-demand }\nspec: { postgresql: shop }\n");
    let pods = ns.pods();
    wait_until("the on-demand backup's pod", 2 * MINUTE, || async {
        pods.get_opt("on-demand-base").await.ok().flatten().is_some()
    })
    .await;
    supervisor.kill();
    // Waited for without blocking: the supervisor runs on this test's thread.
    let api = ns.api::<PostgresBackup>();
    wait_until("the on-demand backup Succeeded", 3 * MINUTE, || async {
        api.get_opt("on-demand")
            .await
            .ok()
            .flatten()
            .is_some_and(|b| phase(&b) == "Succeeded")
    })
    .await;
    // Retention goes on through the kills: scheduled backups come and go, two are kept.
    wait_until(
        "scheduled backups made and deleted by retention",
        4 * MINUTE,
        || async {
            let all = api.list(&Default::default()).await.unwrap().items;
            let scheduled: Vec<&PostgresBackup> = all
                .iter()
                .filter(|b| {
                    b.metadata
                        .labels
                        .as_ref()
                        .is_some_and(|l| l.contains_key("noops.dev/scheduled"))
                })
                .collect();
            let first_gone = !all.iter().any(|b| b.metadata.name.as_deref() == Some(first.as_str()));
            first_gone && scheduled.iter().filter(|b| phase(b) == "Succeeded").count() == 2
        },
    )
    .await;
    let marker = writer.acked();
    let segment = current_segment(&ip, &superuser);
    wait_archived(&ip, &superuser, &segment, MINUTE).await;

    // The volume is lost; the operator is killed while the instance restores.
    ns.apply(&manifest("shop", "pw", &backup_to_bucket(&ns, "pg-backups", "")));
    let old = lose_the_volume(&ns, "shop").await;
    let acked = writer.stop().await;
    wait_until("the new instance restoring", 3 * MINUTE, || async {
        pods.get_opt("shop-0").await.ok().flatten().is_some_and(|p| {
            p.metadata.uid != old
                && p.status
                    .as_ref()
                    .and_then(|s| s.init_container_statuses.as_ref())
                    .is_some_and(|c| {
                        c.iter()
                            .any(|c| c.name == "bootstrap" && c.state.as_ref().is_some_and(|s| s.running.is_some()))
                    })
        })
    })
    .await;
    supervisor.kill();
    let pg = wait_ready(&ns, "shop", 4 * MINUTE).await;
    let ip = instance_ip(&ns, "shop").await;
    let kept = contiguous_ids(&ip, "app", "pw", "shop");
    assert!(
        kept >= marker,
        "every row committed before the last archived segment is there: {kept} < {marker}"
    );
    assert!(kept <= acked + 1, "{kept} > {acked} + 1");
    assert!(pg.status.unwrap().restore.is_some());

    // Settled: every backup finished, no task pod left over.
    wait_until("every backup finished and its pod removed", 3 * MINUTE, || async {
        let all = api.list(&Default::default()).await.unwrap().items;
        let pods = pods.list(&Default::default()).await.unwrap().items;
        all.iter().all(|b| matches!(phase(b), "Succeeded" | "Failed"))
            && !pods.iter().any(|p| {
                let name = p.metadata.name.clone().unwrap_or_default();
                name.ends_with("-base") || name.ends_with("-delete")
            })
    })
    .await;
    let (restarts, logs) = supervisor.stop().await;
    let reached = std::fs::read_to_string(&points).unwrap_or_default();
    let distinct: Vec<&str> = reached.lines().collect();
    println!(
        "the operator was killed {restarts} times; {} distinct crash points: {distinct:?}; {kept} of {acked} rows restored",
        distinct.len()
    );
    assert!(distinct.len() >= 6, "the crash points were reached: {distinct:?}");
    assert!(!logs.contains("panicked"), "{logs}");
    let _ = std::fs::remove_file(&points);
}
