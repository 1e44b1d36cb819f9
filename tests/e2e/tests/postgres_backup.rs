//! PostgreSQL backups on the local Kubernetes, with real PostgreSQL 15, a real S3-compatible
//! store (versitygw) and real volumes: continuous WAL archiving and base backups; a lost
//! volume restored while a client commits; a restore to a point in time into a new database;
//! schedules and retention to a volume; a corrupt or missing backup that fails visibly and
//! replaces nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use noops_api::backup::BackupPhase;
use noops_api::postgres::PostgreSQLPhase;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use noops_api::{PostgreSQL, PostgresBackup};
use noops_e2e::etcd::claim_manifest;
use noops_e2e::postgres::*;
use noops_e2e::{
    Operator, TestNamespace, claim_folder, event_reasons, install_crds, kubectl_ok, pod_ready, s3, wait_event,
    wait_for, wait_until,
};
use object_store::path::Path as Key;
use object_store::{ObjectStoreExt, PutPayload};

const MINUTE: Duration = Duration::from_secs(60);
const CONTROLLERS: [&str; 2] = ["--controllers", "postgres,postgresbackup"];

#[tokio::test]
async fn a_lost_volume_is_restored_from_the_base_backup_and_the_archived_wal_while_a_client_commits() {
    install_crds();
    let ns = TestNamespace::new("pg-restore").await;
    s3::deploy(&ns);
    s3::create_bucket(&ns, "pg-backups").await;
    let operator = Operator::start(&ns.name, &CONTROLLERS);
    ns.apply(&manifest("shop", "Pa55-word", &backup_to_bucket(&ns, "pg-backups", "")));
    wait_ready(&ns, "shop", 3 * MINUTE).await;
    // A first base backup is taken as soon as the database serves: archived WAL alone
    // restores nothing.
    let pg = wait_condition(&ns, "shop", "BackupSucceeded", "True", 2 * MINUTE).await;
    let first = pg
        .status
        .clone()
        .unwrap()
        .backups
        .last_backup
        .expect("the first backup is named in status");
    let backup = ns.api::<PostgresBackup>().get(&first).await.unwrap();
    let stored = backup.status.clone().unwrap();
    assert_eq!(stored.progress.phase, Some(BackupPhase::Succeeded));
    assert!(
        stored.progress.size.unwrap() > 1 << 20 && stored.progress.sha256.is_some() && stored.end_wal.is_some(),
        "{stored:?}"
    );
    assert_eq!(stored.system_identifier, pg.status.clone().unwrap().system_identifier);
    // Done, a backup's passes read it and its task pod from the caches: no request for either.
    let requests = operator
        .requests_of_settled_passes_on(
            &ns,
            &format!("postgresbackup/{first}"),
            "postgresbackup",
            &["postgresbackups", "pods"],
        )
        .await;
    assert!(
        requests.is_empty(),
        "a finished backup's passes made API requests: {requests:?}"
    );

    let ip = instance_ip(&ns, "shop").await;
    let superuser = superuser_password(&ns, "shop").await;
    psql(
        &ip,
        "app",
        "Pa55-word",
        "shop",
        "CREATE TABLE items (id bigint PRIMARY KEY, at timestamptz DEFAULT clock_timestamp())",
    )
    .unwrap();
    let writer = Writer::start(&ip, "app", "Pa55-word", "shop", 0, Duration::from_millis(20)).await;
    wait_until("the client has committed 50 rows", MINUTE, || async {
        writer.acked() >= 50
    })
    .await;
    // Everything committed up to here is in the segment being written; once it is archived,
    // a lost volume cannot take those rows.
    let marker = writer.acked();
    let segment = current_segment(&ip, &superuser);
    wait_archived(&ip, &superuser, &segment, MINUTE).await;
    let pg = wait_condition(&ns, "shop", "ContinuousArchiving", "True", MINUTE).await;
    assert!(pg.status.unwrap().last_archived_wal.is_some());
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The disk is lost while the client commits.
    let old = lose_the_volume(&ns, "shop").await;
    let acked = writer.stop().await;
    wait_new_instance(&ns, "shop", &old, 3 * MINUTE).await;
    let pg = wait_ready(&ns, "shop", 2 * MINUTE).await;
    let ip = instance_ip(&ns, "shop").await;
    let kept = contiguous_ids(&ip, "app", "Pa55-word", "shop");
    assert!(
        kept >= marker,
        "every row committed before the last archived segment is there: {kept} < {marker}"
    );
    // (The one insert in flight when the pod went may have committed without its answer.)
    assert!(
        kept <= acked + 1,
        "no row appears that was never sent: {kept} > {acked} + 1"
    );
    println!(
        "restored {kept} of {acked} acknowledged rows; {} were committed after the last archived segment",
        acked - kept
    );

    // It says it was restored, from which backup, and to when.
    let restore = pg
        .status
        .clone()
        .unwrap()
        .restore
        .expect("status says what was restored");
    assert_eq!(restore.backup, first);
    assert_eq!(
        restore.timeline,
        Some(2),
        "the restored database continues on a new timeline"
    );
    let recovered_to = restore.recovered_to.expect("the last transaction replayed");
    let (status, reason, message) = condition(&pg, "Restored").unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Restored"));
    assert!(message.contains(&recovered_to), "{message}");
    let listed = kubectl_get(&ns);
    assert!(
        listed.contains("RESTORED TO") && listed.contains(&recovered_to),
        "{listed}"
    );
    wait_event(&ns, "PostgreSQL", "shop", "Restored").await;
    let committed_last = psql(
        &ip,
        "app",
        "Pa55-word",
        "shop",
        "SELECT to_char(max(at) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') FROM items",
    )
    .unwrap();
    assert!(
        committed_last <= recovered_to,
        "the last row kept ({committed_last}) is at or before {recovered_to}"
    );
    assert_eq!(
        psql(&ip, "postgres", &superuser, "postgres", "SELECT 1").unwrap(),
        "1",
        "the superuser's password works"
    );

    // The restored database goes on archiving, and backs up, on its new timeline.
    psql(
        &ip,
        "app",
        "Pa55-word",
        "shop",
        &format!("INSERT INTO items (id) VALUES ({})", kept + 1),
    )
    .unwrap();
    ns.apply("apiVersion: noops.dev/v1alpha1\nkind: PostgresBackup\nmetadata: { name: after-restore }\nspec: { postgresql: shop }\n");
    kubectl_ok(
        &[
            "wait",
            "-n",
            &ns.name,
            "--for=jsonpath={.status.phase}=Succeeded",
            "pgbackup/after-restore",
            "--timeout=120s",
        ],
        None,
    );
    let after = ns
        .api::<PostgresBackup>()
        .get("after-restore")
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(after.timeline, Some(2));
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

/// Samples `sample` every 200 ms until `done` says so (or `timeout`); returns what it found.
async fn sample_until<T, F, Fut>(what: &str, timeout: Duration, mut sample: F) -> Vec<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = (Option<T>, bool)>,
{
    let started = std::time::Instant::now();
    let mut seen = Vec::new();
    loop {
        let (found, done) = sample().await;
        seen.extend(found);
        if done {
            return seen;
        }
        assert!(started.elapsed() < timeout, "{what} did not happen within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_base_backup_and_a_restore_say_how_far_they_have_got() {
    install_crds();
    let ns = TestNamespace::new("pg-progress").await;
    s3::deploy(&ns);
    s3::create_bucket(&ns, "pg-backups").await;
    let _operator = Operator::start(&ns.name, &CONTROLLERS);
    // The first base backup (about 30 MB) read at 2 MiB/s: long enough to be watched.
    ns.apply(&manifest(
        "shop",
        "Pa55-word",
        &backup_to_bucket(&ns, "pg-backups", "    baseBackupMaxRate: 2048\n"),
    ));
    let backups = ns.api::<PostgresBackup>();
    let streaming = sample_until("the first base backup", 3 * MINUTE, || async {
        let all = backups.list(&Default::default()).await.unwrap().items;
        let Some(first) = all.first().and_then(|b| b.status.clone()) else {
            return (None, false);
        };
        let done = first.progress.phase == Some(BackupPhase::Succeeded);
        (first.progress.under_way.clone().filter(|_| !done), done)
    })
    .await;
    let backup = backups.list(&Default::default()).await.unwrap().items.remove(0);
    let stored = backup.status.unwrap().progress;
    assert!(
        stored.under_way.is_none(),
        "a finished backup says nothing under way: {stored:?}"
    );
    let size = stored.size.unwrap();
    let moving: Vec<_> = streaming
        .iter()
        .filter(|w| w.bytes_done.unwrap_or(0) > 0 && w.bytes_total.unwrap_or(0) > 0)
        .collect();
    assert!(!moving.is_empty(), "no progress with bytes while it ran: {streaming:?}");
    for work in &moving {
        assert!(!work.step.is_empty());
        // The server's estimate of the total is near the size stored.
        let total = work.bytes_total.unwrap();
        assert!(total > size / 2 && total < size * 2, "estimated {total}, stored {size}");
    }

    // A lost volume: the restore says what it does, from which backup, and how far it got.
    let ip = instance_ip(&ns, "shop").await;
    make_items(&ip, "Pa55-word", 200_000);
    let superuser = superuser_password(&ns, "shop").await;
    let segment = current_segment(&ip, &superuser);
    wait_archived(&ip, &superuser, &segment, MINUTE).await;
    let old = lose_the_volume(&ns, "shop").await;
    let databases = ns.api::<PostgreSQL>();
    let restoring = sample_until("the restore", 3 * MINUTE, || async {
        let pg = databases.get("shop").await.unwrap();
        let status = pg.status.clone().unwrap_or_default();
        let ready = condition(&pg, "Ready").is_some_and(|c| c.0 == "True")
            && status.restore.as_ref().is_some_and(|r| r.completed_at.is_some())
            && pg.metadata.generation == status.observed_generation;
        (status.restoring.clone(), ready)
    })
    .await;
    wait_new_instance(&ns, "shop", &old, MINUTE).await;
    let pg = wait_ready(&ns, "shop", MINUTE).await;
    assert!(
        pg.status.clone().unwrap().restoring.is_none(),
        "nothing under way once it serves"
    );
    assert!(!restoring.is_empty(), "the restore never said how far it had got");
    for work in &restoring {
        assert_eq!(
            work.source.as_deref(),
            Some(backup.metadata.name.as_deref().unwrap()),
            "{work:?}"
        );
        // (The size is known once the store answers: a first report may come before.)
        if work.step.starts_with("downloading") && work.bytes_total.is_some() {
            assert_eq!(work.bytes_total, Some(size), "{work:?}");
        }
    }
    println!("the restore said: {restoring:?}");
    let ip = instance_ip(&ns, "shop").await;
    assert_eq!(contiguous_ids(&ip, "app", "Pa55-word", "shop"), 200_000);
}

#[tokio::test]
async fn a_new_database_is_restored_to_a_point_in_time_between_two_batches() {
    install_crds();
    let ns = TestNamespace::new("pg-pitr").await;
    s3::deploy(&ns);
    s3::create_bucket(&ns, "pg-backups").await;
    let operator = Operator::start(&ns.name, &CONTROLLERS);
    ns.apply(&manifest("shop", "first-pw", &backup_to_bucket(&ns, "pg-backups", "")));
    wait_ready(&ns, "shop", 3 * MINUTE).await;
    let pg = wait_condition(&ns, "shop", "BackupSucceeded", "True", 2 * MINUTE).await;
    let base = pg.status.unwrap().backups.last_backup.unwrap();
    let ip = instance_ip(&ns, "shop").await;
    let superuser = superuser_password(&ns, "shop").await;
    make_items(&ip, "first-pw", 100);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let between = psql(
        &ip,
        "app",
        "first-pw",
        "shop",
        "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    psql(
        &ip,
        "app",
        "first-pw",
        "shop",
        "INSERT INTO items SELECT generate_series(101, 200)",
    )
    .unwrap();
    let segment = current_segment(&ip, &superuser);
    wait_archived(&ip, &superuser, &segment, MINUTE).await;

    // A new database from that backup, to the moment between the batches, with backups of
    // its own in the same bucket.
    let copy = format!(
        "{}  bootstrap:\n    fromBackup: {{ name: {base}, targetTime: \"{between}\" }}\n",
        backup_to_bucket(&ns, "pg-backups", "")
    );
    ns.apply(&manifest("copy", "copy-pw", &copy));
    let restored = wait_ready(&ns, "copy", 3 * MINUTE).await;
    let copy_ip = instance_ip(&ns, "copy").await;
    assert_eq!(
        psql(&copy_ip, "app", "copy-pw", "shop", "SELECT count(*) FROM items").unwrap(),
        "100",
        "only the first batch"
    );
    let restore = restored.status.clone().unwrap().restore.unwrap();
    assert_eq!(restore.backup, base);
    assert!(restore.recovered_to.unwrap() <= between);
    assert_eq!(
        psql(&ip, "app", "first-pw", "shop", "SELECT count(*) FROM items").unwrap(),
        "200",
        "the source is untouched"
    );
    // It archives and backs up on its own, under its own name in the bucket.
    let copy = wait_condition(&ns, "copy", "BackupSucceeded", "True", 2 * MINUTE).await;
    let own = ns
        .api::<PostgresBackup>()
        .get(&copy.status.unwrap().backups.last_backup.unwrap())
        .await
        .unwrap();
    assert!(
        own.status
            .unwrap()
            .progress
            .location
            .unwrap()
            .contains(&format!("/{}/copy/base/", ns.name))
    );

    // A time before the backup ended, and a backup that does not exist, are refused with the
    // reason; neither gets a pod.
    let source = ns.api::<PostgresBackup>().get(&base).await.unwrap();
    let ended = source.status.unwrap().progress.completed_at.unwrap().0;
    let too_early = (ended - jiff::SignedDuration::from_secs(3600)).to_string();
    ns.apply(&manifest(
        "early",
        "pw",
        &format!("  bootstrap:\n    fromBackup: {{ name: {base}, targetTime: \"{too_early}\" }}\n"),
    ));
    let early = wait_not_ready(&ns, "early", "TargetBeforeBackup", MINUTE).await;
    assert!(
        condition(&early, "Ready").unwrap().2.contains("choose a later time"),
        "{early:?}"
    );
    ns.apply(&manifest(
        "ghost",
        "pw",
        "  bootstrap:\n    fromBackup: { name: no-such-backup }\n",
    ));
    wait_not_ready(&ns, "ghost", "BootstrapBackupNotFound", MINUTE).await;
    let statefulsets = ns.api::<StatefulSet>();
    assert!(
        statefulsets.get_opt("early").await.unwrap().is_none()
            && statefulsets.get_opt("ghost").await.unwrap().is_none()
    );
    wait_event(&ns, "PostgreSQL", "ghost", "BootstrapBackupNotFound").await;
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

#[tokio::test]
async fn backups_to_a_volume_run_on_schedule_keep_max_backups_and_restore_a_lost_volume() {
    install_crds();
    let ns = TestNamespace::new("pg-volume").await;
    let operator = Operator::start(&ns.name, &CONTROLLERS);
    ns.apply(&claim_manifest("pg-backups", "5Gi"));
    let backup = "  backup:\n    schedule: \"*/5 * * * * *\"\n    maxBackups: 2\n    archiveTimeoutSeconds: 1\n    volume: { claimName: pg-backups }\n";
    ns.apply(&manifest("shop", "pw", backup));
    wait_ready(&ns, "shop", 3 * MINUTE).await;
    let ip = instance_ip(&ns, "shop").await;
    make_items(&ip, "pw", 10);

    // Scheduled backups come every 5 s; once more than two have succeeded, the oldest go,
    // with their files and the WAL only they needed.
    let api = ns.api::<PostgresBackup>();
    let first_seen = wait_for("a successful backup", 2 * MINUTE, || async {
        let all = api.list(&Default::default()).await.ok()?.items;
        backups_of(&all, "shop").into_iter().find(|b| phase(b) == "Succeeded")
    })
    .await;
    // Monitoring sees the backups (every 5 s) and the archive (a segment a second at most).
    let resource = format!("{{kind=\"PostgreSQL\",namespace=\"{}\",name=\"shop\"}}", ns.name);
    let metric = |name: &str| {
        let series = format!("{name}{resource}");
        let operator = &operator;
        async move { operator.metric(&series).await }
    };
    wait_until("the backups and the archive in /metrics", MINUTE, || async {
        let now = jiff::Timestamp::now().as_second() as f64;
        let recent = |t: Option<f64>| t.is_some_and(|t| now - t < 120.0);
        recent(metric("noops_backup_last_success_timestamp_seconds").await)
            && metric("noops_backup_schedule_interval_seconds").await == Some(5.0)
            && recent(metric("noops_postgres_wal_last_archived_timestamp_seconds").await)
            && metric("noops_postgres_wal_archiving_failing").await == Some(0.0)
    })
    .await;
    let folder = claim_folder(&ns, "pg-backups").await.join("postgres/shop");
    wait_until("the first backup deleted by retention", 3 * MINUTE, || async {
        api.get_opt(&first_seen.metadata.name.clone().unwrap())
            .await
            .unwrap()
            .is_none()
    })
    .await;
    // A schedule the parser refuses (the schema only counts its fields) is said, and makes no
    // backup; the database serves on.
    ns.apply(&manifest("shop", "pw", &backup.replace("*/5 * * * * *", "99 * * * *")));
    let pg = wait_reason(&ns, "shop", "Degraded", "True", "InvalidSchedule").await;
    assert!(condition(&pg, "Ready").is_some_and(|(s, _, _)| s == "True"));
    let (_, _, message) = condition(&pg, "Degraded").unwrap();
    assert!(message.contains("99 * * * *"), "{message}");
    wait_event(&ns, "PostgreSQL", "shop", "InvalidSchedule").await;
    // The schedule off, what is left settles: two backups, and their folders.
    ns.apply(&manifest(
        "shop",
        "pw",
        &backup.replace("    schedule: \"*/5 * * * * *\"\n", ""),
    ));
    wait_ready(&ns, "shop", MINUTE).await;
    wait_backups_finished(&ns, "shop", MINUTE).await;
    let pg = wait_for("two backups kept", MINUTE, || async {
        let pg = ns.api::<PostgreSQL>().get("shop").await.ok()?;
        (pg.status.as_ref()?.backups.stored_backups == Some(2)).then_some(pg)
    })
    .await;
    assert!(condition(&pg, "BackupSucceeded").is_some_and(|(s, _, _)| s == "True"));
    wait_until("the folders in the volume are the backups kept", MINUTE, || async {
        let all = api.list(&Default::default()).await.unwrap().items;
        let mut kept: Vec<String> = backups_of(&all, "shop")
            .iter()
            .filter(|b| phase(b) == "Succeeded" && b.metadata.deletion_timestamp.is_none())
            .map(|b| b.metadata.name.clone().unwrap())
            .collect();
        let mut folders: Vec<String> = std::fs::read_dir(folder.join("base"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().join("backup.json").exists())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        kept.sort();
        folders.sort();
        kept.len() == 2 && kept == folders
    })
    .await;
    let system_id = pg.status.unwrap().system_identifier.unwrap();
    let wal = folder.join("wal").join(&system_id);
    assert!(
        !wal.join("000000010000000000000001.gz").exists(),
        "the WAL from before the oldest kept backup is deleted"
    );
    assert!(
        std::fs::read_dir(&wal).unwrap().count() > 0,
        "the WAL the kept backups need stays"
    );

    // The volume of the instance is lost: it comes back from the backup volume.
    let superuser = superuser_password(&ns, "shop").await;
    psql(
        &ip,
        "app",
        "pw",
        "shop",
        "INSERT INTO items SELECT generate_series(11, 20)",
    )
    .unwrap();
    let segment = current_segment(&ip, &superuser);
    wait_archived(&ip, &superuser, &segment, MINUTE).await;
    let old = lose_the_volume(&ns, "shop").await;
    wait_new_instance(&ns, "shop", &old, 3 * MINUTE).await;
    let pg = wait_ready(&ns, "shop", 2 * MINUTE).await;
    let ip = instance_ip(&ns, "shop").await;
    assert_eq!(contiguous_ids(&ip, "app", "pw", "shop"), 20);
    assert!(pg.status.unwrap().restore.is_some());
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

#[tokio::test]
async fn a_corrupt_or_missing_backup_fails_the_restore_visibly_and_replaces_no_good_backup() {
    install_crds();
    let ns = TestNamespace::new("pg-corrupt").await;
    s3::deploy(&ns);
    s3::create_bucket(&ns, "pg-backups").await;
    let operator = Operator::start(&ns.name, &CONTROLLERS);
    // Many kept: retention has nothing to do in this test.
    let schedule = "    schedule: \"*/5 * * * * *\"\n    maxBackups: 100\n";
    ns.apply(&manifest("shop", "pw", &backup_to_bucket(&ns, "pg-backups", schedule)));
    wait_ready(&ns, "shop", 3 * MINUTE).await;
    let ip = instance_ip(&ns, "shop").await;
    let superuser = superuser_password(&ns, "shop").await;
    make_items(&ip, "pw", 10);
    let segment = current_segment(&ip, &superuser);
    wait_archived(&ip, &superuser, &segment, MINUTE).await;
    wait_until("a scheduled backup newer than the table", 2 * MINUTE, || async {
        let pg = ns.api::<PostgreSQL>().get("shop").await.unwrap();
        pg.status.is_some_and(|s| s.backups.stored_backups >= Some(2))
    })
    .await;
    // The schedule is turned off now, so that the backups are the ones there are.
    ns.apply(&manifest(
        "shop",
        "pw",
        &backup_to_bucket(&ns, "pg-backups", "    maxBackups: 100\n"),
    ));
    // Once the operator has seen the new spec (Ready for its generation), every backup the
    // old schedule made exists: wait for them to end.
    wait_ready(&ns, "shop", MINUTE).await;
    let api = ns.api::<PostgresBackup>();
    wait_backups_finished(&ns, "shop", MINUTE).await;
    let before: Vec<PostgresBackup> = backups_of(&api.list(&Default::default()).await.unwrap().items, "shop");
    // The one a restore starts from.
    let newest_backup = before
        .iter()
        .filter(|b| phase(b) == "Succeeded")
        .max_by_key(|b| {
            (
                b.status.as_ref().unwrap().progress.completed_at.clone().map(|t| t.0),
                b.metadata.name.clone(),
            )
        })
        .unwrap();
    let base = newest_backup.status.as_ref().unwrap().destination.clone().unwrap().base;
    let bucket = s3::bucket(&ns, "pg-backups").await;
    let key = Key::from(format!("{base}/base.tar"));
    let good = bucket.get(&key).await.unwrap().bytes().await.unwrap();
    let mut bad = good.to_vec();
    bad[4096] ^= 0xff;
    bucket.put(&key, PutPayload::from(bad)).await.unwrap();

    // The volume is lost: the restore refuses the corrupt backup, and says so.
    let old = lose_the_volume(&ns, "shop").await;
    let failed = wait_not_ready(&ns, "shop", "RestoreFailed", 3 * MINUTE).await;
    let (_, _, message) = condition(&failed, "Ready").unwrap();
    assert!(message.contains("corrupt"), "{message}");
    assert_eq!(condition(&failed, "Restored").unwrap().1, "RestoreFailed");
    assert_eq!(condition(&failed, "Degraded").unwrap().1, "RestoreFailed");
    wait_event(&ns, "PostgreSQL", "shop", "RestoreFailed").await;
    let pod = ns.pods().get("shop-0").await.unwrap();
    assert!(
        pod.metadata.uid != old && !pod_ready(&pod),
        "the instance stays out of the Service"
    );

    // Its base backup gone instead: said as well.
    bucket.delete(&key).await.unwrap();
    wait_for("the restore failing on a missing backup", 3 * MINUTE, || async {
        let pg = ns.api::<PostgreSQL>().get("shop").await.ok()?;
        condition(&pg, "Ready").filter(|(_, r, m)| r == "RestoreFailed" && m.contains("not in the store"))
    })
    .await;
    // Meanwhile no backup was made of anything, and none was deleted.
    let after: Vec<PostgresBackup> = backups_of(&api.list(&Default::default()).await.unwrap().items, "shop");
    let names = |list: &[PostgresBackup]| {
        list.iter()
            .map(|b| (b.metadata.name.clone(), phase(b).to_string()))
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&after), names(&before));

    // The backup put back, the restore goes through (deleting the pod restarts it at once).
    bucket.put(&key, PutPayload::from(good)).await.unwrap();
    kubectl_ok(&["delete", "pod", "-n", &ns.name, "shop-0", "--wait=false"], None);
    let pg = wait_ready(&ns, "shop", 3 * MINUTE).await;
    assert_eq!(condition(&pg, "Restored").unwrap().0, "True");
    let ip = instance_ip(&ns, "shop").await;
    assert_eq!(contiguous_ids(&ip, "app", "pw", "shop"), 10);
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

#[tokio::test]
async fn a_bad_backup_destination_never_stops_a_serving_database_and_a_missing_bucket_is_reported() {
    install_crds();
    let ns = TestNamespace::new("pg-bad-dest").await;
    s3::deploy(&ns);
    let operator = Operator::start(&ns.name, &CONTROLLERS);
    ns.apply(&manifest("shop", "pw", ""));
    wait_ready(&ns, "shop", 3 * MINUTE).await;
    let ip = instance_ip(&ns, "shop").await;
    psql(
        &ip,
        "app",
        "pw",
        "shop",
        "CREATE TABLE items (id bigint PRIMARY KEY); INSERT INTO items VALUES (1)",
    )
    .unwrap();
    let serving_pod = ns.pods().get("shop-0").await.unwrap().metadata.uid;
    let to_bucket = |credentials: &str| {
        format!(
            "  backup:\n    archiveTimeoutSeconds: 1\n    s3: {{ endpoint: \"{}\", bucket: pg-backups, credentialsSecret: {credentials} }}\n",
            s3::service_url(&ns)
        )
    };
    let still_serving = |pg: &PostgreSQL| {
        assert_eq!(
            condition(pg, "Ready").unwrap().0,
            "True",
            "a bad edit never stops a serving database"
        );
        assert_eq!(pg.status.as_ref().unwrap().phase, Some(PostgreSQLPhase::Degraded));
    };

    // Backups to a bucket whose credentials Secret does not exist: the pod would not start
    // with it, so the serving one is left alone, and the status says what to fix.
    ns.apply(&manifest("shop", "pw", &to_bucket("no-such-keys")));
    let pg = wait_reason(&ns, "shop", "Degraded", "True", "BackupCredentialsMissing").await;
    still_serving(&pg);
    assert!(condition(&pg, "Degraded").unwrap().2.contains("no-such-keys"));
    wait_event(&ns, "PostgreSQL", "shop", "BackupCredentialsMissing").await;
    // A Secret with one key of two: also refused.
    ns.apply(
        "apiVersion: v1\nkind: Secret\nmetadata: { name: half-keys }\nstringData: { AWS_ACCESS_KEY_ID: someone }\n",
    );
    ns.apply(&manifest("shop", "pw", &to_bucket("half-keys")));
    let pg = wait_reason(&ns, "shop", "Degraded", "True", "BackupCredentialsInvalid").await;
    still_serving(&pg);
    assert!(condition(&pg, "Degraded").unwrap().2.contains("AWS_SECRET_ACCESS_KEY"));
    let pod = ns.pods().get("shop-0").await.unwrap();
    assert_eq!(pod.metadata.uid, serving_pod, "the instance's pod was never replaced");
    assert_eq!(
        psql(&ip, "app", "pw", "shop", "SELECT count(*) FROM items").unwrap(),
        "1"
    );

    // Good keys, but a bucket that does not exist yet: the instance restarts with archiving
    // on, serves, and says that its WAL cannot be archived.
    ns.apply(&manifest("shop", "pw", &to_bucket("object-store-credentials")));
    wait_new_instance(&ns, "shop", &serving_pod, 2 * MINUTE).await;
    wait_ready(&ns, "shop", 2 * MINUTE).await;
    let ip = instance_ip(&ns, "shop").await;
    psql(&ip, "app", "pw", "shop", "INSERT INTO items VALUES (2)").unwrap();
    let pg = wait_reason(&ns, "shop", "ContinuousArchiving", "False", "ArchiveFailing").await;
    assert_eq!(condition(&pg, "Degraded").unwrap().1, "ArchiveFailing");
    assert_eq!(condition(&pg, "Ready").unwrap().0, "True", "it serves meanwhile");
    // The bucket made, the archive catches up and a first base backup is stored.
    s3::create_bucket(&ns, "pg-backups").await;
    let superuser = superuser_password(&ns, "shop").await;
    let segment = current_segment(&ip, &superuser);
    wait_archived(&ip, &superuser, &segment, 2 * MINUTE).await;
    wait_reason(&ns, "shop", "BackupSucceeded", "True", "BackupStored").await;
    let pg = wait_reason(&ns, "shop", "Degraded", "False", "AsExpected").await;
    assert_eq!(condition(&pg, "ContinuousArchiving").unwrap().0, "True");
    assert_eq!(
        psql(&ip, "app", "pw", "shop", "SELECT count(*) FROM items").unwrap(),
        "2"
    );
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

#[tokio::test]
async fn a_lost_volume_whose_backups_are_not_in_the_new_destination_is_held_not_made_anew() {
    install_crds();
    let ns = TestNamespace::new("pg-moved").await;
    s3::deploy(&ns);
    s3::create_bucket(&ns, "pg-backups").await;
    let operator = Operator::start(&ns.name, &CONTROLLERS);
    // Two buckets, not a volume and a bucket: a backup volume on a node's disk would pin the
    // instance to that node, and its new data volume may be made on another.
    let to_backups = backup_to_bucket(&ns, "pg-backups", "");
    ns.apply(&manifest("shop", "pw", &to_backups));
    wait_ready(&ns, "shop", 3 * MINUTE).await;
    let pg = wait_condition(&ns, "shop", "BackupSucceeded", "True", 2 * MINUTE).await;
    let system_id = pg.status.unwrap().system_identifier.unwrap();
    let ip = instance_ip(&ns, "shop").await;
    make_items(&ip, "pw", 10);
    let superuser = superuser_password(&ns, "shop").await;
    let segment = current_segment(&ip, &superuser);
    wait_archived(&ip, &superuser, &segment, MINUTE).await;

    // The destination moved to a bucket that is not there yet: no backup can be taken in it,
    // so every backup of the database is still in the first one when the instance's volume is
    // lost.
    let serving_pod = ns.pods().get("shop-0").await.unwrap().metadata.uid;
    ns.apply(&manifest("shop", "pw", &backup_to_bucket(&ns, "not-made-yet", "")));
    wait_new_instance(&ns, "shop", &serving_pod, 2 * MINUTE).await;
    wait_reason(&ns, "shop", "ContinuousArchiving", "False", "ArchiveFailing").await;
    let old = lose_the_volume(&ns, "shop").await;
    // Neither restored (its pod is given no access to the first bucket any more) nor made a
    // new, empty database: held, saying where its backups are.
    let pg = wait_not_ready(&ns, "shop", "RestoreFailed", 3 * MINUTE).await;
    let (_, _, message) = condition(&pg, "Ready").unwrap();
    assert!(message.contains("s3://pg-backups/"), "{message}");
    assert_eq!(
        pg.status.as_ref().unwrap().system_identifier.as_deref(),
        Some(system_id.as_str())
    );
    assert!(
        !event_reasons(&ns, "PostgreSQL", "shop")
            .await
            .iter()
            .any(|r| r == "DatabaseReplaced"),
        "no new, empty database was made"
    );
    // The destination set back, it is restored from there with every archived row.
    ns.apply(&manifest("shop", "pw", &to_backups));
    wait_new_instance(&ns, "shop", &old, 3 * MINUTE).await;
    let pg = wait_ready(&ns, "shop", 2 * MINUTE).await;
    let ip = instance_ip(&ns, "shop").await;
    assert_eq!(contiguous_ids(&ip, "app", "pw", "shop"), 10);
    let status = pg.status.unwrap();
    assert_eq!(status.system_identifier, Some(system_id));
    assert!(status.restore.is_some(), "it says it was restored");
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

/// The WAL segment that holds the last byte before `end` on `timeline`.
fn segment_of_last_byte(end: &str, timeline: i64) -> String {
    let (high, low) = end.split_once('/').unwrap();
    let last = ((u64::from_str_radix(high, 16).unwrap() << 32) | u64::from_str_radix(low, 16).unwrap()) - 1;
    let number = last / (16 << 20);
    format!("{timeline:08X}{:08X}{:08X}", number >> 8, number & 0xff)
}

#[tokio::test]
async fn a_base_backup_read_from_a_replica_waits_for_the_primarys_archive_and_restores_every_commit() {
    install_crds();
    let ns = TestNamespace::new("pg-standby-backup").await;
    s3::deploy(&ns);
    s3::create_bucket(&ns, "pg-backups").await;
    let _operator = Operator::start(&ns.name, &CONTROLLERS);
    // archive_timeout long (5 min): the segment a backup ends in is archived at once only if
    // the backup's pod asks the primary to switch segments, as it must.
    let backup = format!(
        "  backup:\n    archiveTimeoutSeconds: 300\n    target: PreferStandby\n    s3: {{ endpoint: \"{}\", bucket: pg-backups, credentialsSecret: object-store-credentials }}\n",
        s3::service_url(&ns)
    );
    let (_, rw, ledger) = three_instances_under_a_ledger(&ns, &backup).await;
    let primary = ns
        .api::<PostgreSQL>()
        .get("shop")
        .await
        .unwrap()
        .status
        .unwrap()
        .current_primary
        .unwrap();

    // Taken while the client commits: from a streaming replica, not the primary.
    ns.apply(
        "apiVersion: noops.dev/v1alpha1\nkind: PostgresBackup\nmetadata: { name: from-a-replica }\nspec: { postgresql: shop }\n",
    );
    let backups = ns.api::<PostgresBackup>();
    let taken = wait_for("the backup read from a replica stored", 3 * MINUTE, || async {
        let backup = backups.get_opt("from-a-replica").await.ok()??;
        (phase(&backup) == "Succeeded").then_some(backup)
    })
    .await;
    let status = taken.status.unwrap();
    let instance = status.instance.clone().unwrap();
    assert!(
        instance != primary && instance.starts_with("shop-"),
        "read {instance}, the primary is {primary}"
    );
    // Recorded only once the primary had archived the segment it ends in: whole from the
    // moment it says Succeeded.
    let segment = segment_of_last_byte(status.end_wal.as_deref().unwrap(), status.timeline.unwrap());
    let store = s3::bucket(&ns, "pg-backups").await;
    let key = Key::from(format!("{}/{segment}.gz", status.destination.unwrap().wal));
    assert!(
        store.head(&key).await.is_ok(),
        "{key} not archived when the backup was recorded"
    );

    // A new database from it holds every commit acknowledged until the client stopped (all of
    // them archived since).
    let report = ledger.stop().await;
    let superuser = superuser_password(&ns, "shop").await;
    let last = current_segment(&rw, &superuser);
    psql(&rw, "postgres", &superuser, "postgres", "SELECT pg_switch_wal()").unwrap();
    wait_archived(&rw, &superuser, &last, MINUTE).await;
    ns.apply(&manifest(
        "copy",
        "copy-pw",
        "  bootstrap:\n    fromBackup: { name: from-a-replica }\n",
    ));
    wait_ready(&ns, "copy", 3 * MINUTE).await;
    let copy_ip = instance_ip(&ns, "copy").await;
    let missing = report.lost_in((&copy_ip, "app", "copy-pw", "shop"), "restored from a replica's backup");
    assert!(missing.is_empty(), "acknowledged and not restored: {missing:?}");
}
