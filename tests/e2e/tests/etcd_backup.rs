//! EtcdBackups on the local Kubernetes, against real etcd and a real S3-compatible store
//! (versitygw, started from its example manifest): an on-demand backup whose snapshot is
//! checked with etcd's own tool, scheduled backups with retention, deletion of snapshots, and
//! backups that cannot be made. Needs `make cluster-up`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use noops_api::backup::BackupPhase;
use noops_api::etcd::EtcdClusterPhase;
use std::collections::BTreeSet;
use std::time::Duration;

use futures::TryStreamExt;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use noops_api::{EtcdBackup, EtcdCluster};
use noops_e2e::etcd::*;
use noops_e2e::*;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};

const MINUTE: Duration = Duration::from_secs(60);

/// The keys under the cluster's prefix in the bucket.
async fn stored_keys(store: &object_store::aws::AmazonS3, ns: &TestNamespace) -> BTreeSet<String> {
    store
        .list(Some(&Path::from(format!("etcd/{}/main", ns.name))))
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .unwrap()
}

#[tokio::test]
async fn backups_are_stored_checked_scheduled_kept_and_deleted() {
    install_crds();
    let ns = TestNamespace::new("etcd-backup").await;
    let operator = Operator::start(&ns.name, &["--controllers", "etcd,etcdbackup"]);
    s3::deploy(&ns);
    s3::create_bucket(&ns, "backups").await;
    let store = s3::bucket(&ns, "backups").await;

    let version = etcd_version("3.5");
    ns.apply(&cluster_manifest("main", 1, &version, &backup_spec(&ns, None, 2)));
    wait_cluster_ready(&ns, "main", 1, 2 * MINUTE).await;
    let mut client = etcd_client(&ns, "main", &member_endpoints(&ns, &["main-0"]).await).await;
    let put = client.put("greeting", "hello", None).await.unwrap();
    let written_at = put.header().unwrap().revision();

    // On demand.
    ns.apply(&backup_manifest("manual", "main"));
    kubectl_ok(
        &[
            "wait",
            "-n",
            &ns.name,
            "--for=condition=Succeeded",
            "etcdbackup/manual",
            "--timeout=120s",
        ],
        None,
    );
    let manual = wait_backup_done(&ns, "manual").await;
    let status = manual.status.clone().unwrap();
    let key = format!("etcd/{}/main/manual.db", ns.name);
    assert_eq!(
        status.progress.location.as_deref(),
        Some(format!("s3://backups/{key}").as_str())
    );
    assert!(status.revision.unwrap() >= written_at, "{status:?}");
    // The stored snapshot is the one described, and etcd's own tool reads it.
    let bytes = store
        .get(&Path::from(key.clone()))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(i64::try_from(bytes.len()).unwrap(), status.progress.size.unwrap());
    assert_eq!(Some(sha256_of(&bytes)), status.progress.sha256);
    let file = std::env::temp_dir().join(format!("{}-manual.db", ns.name));
    std::fs::write(&file, &bytes).unwrap();
    let checked = std::process::Command::new(upstream_bin("etcd-3.5/etcdutl"))
        .args(["snapshot", "status", "-w", "json"])
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
    let report: serde_json::Value = serde_json::from_slice(&checked.stdout).unwrap();
    assert!(report["revision"].as_i64().unwrap() >= written_at, "{report}");
    // Done, a backup's passes read it and its task pods from the caches: no request for either.
    let requests = operator
        .requests_of_settled_passes_on(&ns, "etcdbackup/manual", "etcdbackup", &["etcdbackups", "pods"])
        .await;
    assert!(
        requests.is_empty(),
        "a finished backup's passes made API requests: {requests:?}"
    );
    // Monitoring sees it: when the last backup succeeded, and when the certificates expire.
    let resource = format!("{{kind=\"EtcdCluster\",namespace=\"{}\",name=\"main\"", ns.name);
    let completed = manual.status.as_ref().unwrap().progress.completed_at.clone().unwrap();
    wait_until("the last backup's time in /metrics", MINUTE, || async {
        operator
            .metric(&format!("noops_backup_last_success_timestamp_seconds{resource}}}"))
            .await
            .is_some_and(|t| (t - completed.0.as_second() as f64).abs() < 1.0)
    })
    .await;
    let expires = operator
        .metric(&format!(
            "noops_certificate_expiry_timestamp_seconds{resource},secret=\"main-server\"}}"
        ))
        .await
        .expect("the server certificate's expiry in /metrics");
    let now = jiff::Timestamp::now().as_second() as f64;
    assert!(expires > now + 86400.0, "expires at {expires}, now {now}");
    wait_until("a BackupSucceeded Event", MINUTE, || async {
        let events: Api<k8s_openapi::api::core::v1::Event> = ns.api();
        events
            .list(&kube::api::ListParams::default().fields("involvedObject.name=manual"))
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("BackupSucceeded"))
    })
    .await;

    // On a schedule (every 3 s), keeping 2: older scheduled backups go, snapshots and all;
    // the on-demand one stays.
    let clusters: Api<EtcdCluster> = ns.api();
    let schedule = serde_json::json!({ "spec": { "backup": { "schedule": "*/3 * * * * *", "maxBackups": 2 } } });
    clusters
        .patch("main", &PatchParams::default(), &Patch::Merge(&schedule))
        .await
        .unwrap();
    let backups: Api<EtcdBackup> = ns.api();
    let mut seen = BTreeSet::new();
    let deadline = std::time::Instant::now() + 2 * MINUTE;
    while seen.len() < 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "only {seen:?} scheduled backups in 2 minutes"
        );
        for b in backups.list(&Default::default()).await.unwrap().items {
            if b.metadata
                .labels
                .unwrap_or_default()
                .contains_key("noops.dev/scheduled")
            {
                seen.insert(b.metadata.name.unwrap());
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let unschedule = serde_json::json!({ "spec": { "backup": { "schedule": null } } });
    clusters
        .patch("main", &PatchParams::default(), &Patch::Merge(&unschedule))
        .await
        .unwrap();
    let (kept, keys) = wait_for("retention to settle at two scheduled backups", 2 * MINUTE, || async {
        let list = backups.list(&Default::default()).await.unwrap().items;
        let done = list.iter().all(|b| {
            matches!(
                b.status.as_ref().and_then(|s| s.progress.phase),
                Some(BackupPhase::Succeeded | BackupPhase::Failed)
            )
        });
        let names: BTreeSet<String> = list.iter().filter_map(|b| b.metadata.name.clone()).collect();
        let keys = stored_keys(&store, &ns).await;
        let expected: BTreeSet<String> = names.iter().map(|n| format!("etcd/{}/main/{n}.db", ns.name)).collect();
        (done && names.len() == 3 && keys == expected).then_some((names, keys))
    })
    .await;
    assert!(kept.contains("manual"), "{kept:?}");
    assert_eq!(keys.len(), 3);
    let cluster = clusters.get("main").await.unwrap();
    let status = cluster.status.unwrap();
    assert_eq!(status.backups.stored_backups, Some(3));
    assert!(status.backups.last_backup_time.is_some());

    // Deleting a backup deletes its snapshot.
    backups.delete("manual", &DeleteParams::default()).await.unwrap();
    wait_until("the manual snapshot to be deleted", MINUTE, || async {
        !stored_keys(&store, &ns).await.contains(&key) && backups.get_opt("manual").await.unwrap().is_none()
    })
    .await;
}

#[tokio::test]
async fn backups_that_cannot_be_made_fail_with_a_reason() {
    install_crds();
    let ns = TestNamespace::new("etcd-backup-bad").await;
    let _operator = Operator::start(&ns.name, &["--controllers", "etcd,etcdbackup"]);
    let version = etcd_version("3.6");

    // No such cluster; a cluster that says nowhere to put backups.
    ns.apply(&backup_manifest("orphan", "nowhere"));
    ns.apply(&cluster_manifest("plain", 1, &version, "  paused: true\n"));
    ns.apply(&backup_manifest("homeless", "plain"));
    for (name, reason) in [("orphan", "ClusterNotFound"), ("homeless", "NoDestination")] {
        let done = wait_backup_done(&ns, name).await;
        let status = done.status.unwrap();
        assert_eq!(status.progress.phase, Some(BackupPhase::Failed));
        let condition = status
            .progress
            .conditions
            .iter()
            .find(|c| c.type_ == "Succeeded")
            .unwrap();
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("False", reason)
        );
    }

    // A schedule that is not cron is refused by the API server, or by the operator when it
    // has the right number of fields but is still wrong.
    let wrong = cluster_manifest(
        "plain",
        1,
        &version,
        &format!("  paused: true\n{}", backup_spec(&ns, Some("every hour"), 2)),
    );
    let out = kubectl(&["apply", "-n", &ns.name, "-f", "-"], Some(&wrong));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("backup.schedule must be a cron expression"));
    let out_of_range = cluster_manifest("plain", 1, &version, &backup_spec(&ns, Some("61 * * * *"), 2));
    ns.apply(&out_of_range);
    let api: Api<EtcdCluster> = ns.api();
    wait_until("Ready=False InvalidSchedule", 2 * MINUTE, || async {
        api.get("plain")
            .await
            .ok()
            .is_some_and(|c| condition(&c, "Degraded").is_some_and(|(s, r, _)| s == "True" && r == "InvalidSchedule"))
    })
    .await;
    // A destination whose credentials Secret is missing: the backup waits with the reason
    // (and fails after its deadline), the cluster runs on.
    let keyless = "  backup:\n    s3:\n      endpoint: http://nowhere.invalid:7070\n      bucket: backups\n      credentialsSecret: no-such-secret\n";
    ns.apply(&cluster_manifest("keyless", 1, &version, keyless));
    wait_cluster_ready(&ns, "keyless", 1, 2 * MINUTE).await;
    ns.apply(&backup_manifest("keyless-1", "keyless"));
    let backups: Api<EtcdBackup> = ns.api();
    wait_until("StoreUnavailable naming the missing Secret", MINUTE, || async {
        backups.get("keyless-1").await.ok().is_some_and(|b| {
            let status = b.status.unwrap_or_default();
            status.progress.phase == Some(BackupPhase::Running)
                && status.progress.conditions.iter().any(|c| {
                    c.type_ == "Succeeded"
                        && c.status == "False"
                        && c.reason == "StoreUnavailable"
                        && c.message.contains("no-such-secret")
                })
        })
    })
    .await;
    wait_cluster_ready(&ns, "keyless", 1, MINUTE).await;

    // Deleting a backup that never stored anything just deletes it.
    backups.delete("orphan", &DeleteParams::default()).await.unwrap();
    wait_until("the orphan backup to go", MINUTE, || async {
        backups.get_opt("orphan").await.unwrap().is_none()
    })
    .await;
}

#[tokio::test]
async fn a_new_cluster_starts_from_a_backup_and_a_tampered_backup_is_refused() {
    install_crds();
    let ns = TestNamespace::new("etcd-restore").await;
    let _operator = Operator::start(&ns.name, &["--controllers", "etcd,etcdbackup"]);
    s3::deploy(&ns);
    s3::create_bucket(&ns, "backups").await;
    let store = s3::bucket(&ns, "backups").await;
    let version = etcd_version("3.5");

    // A cluster with data, and a backup of it.
    ns.apply(&cluster_manifest("source", 1, &version, &backup_spec(&ns, None, 2)));
    let source = wait_cluster_ready(&ns, "source", 1, 2 * MINUTE).await;
    let mut client = etcd_client(&ns, "source", &member_endpoints(&ns, &["source-0"]).await).await;
    for i in 0..100 {
        client
            .put(format!("data/{i:03}"), format!("value {i}"), None)
            .await
            .unwrap();
    }
    ns.apply(&backup_manifest("snap", "source"));
    let snap = wait_backup_done(&ns, "snap").await;
    assert_eq!(
        snap.status.as_ref().unwrap().progress.phase,
        Some(BackupPhase::Succeeded)
    );

    // A new three-member cluster from it: the data is there, under a cluster ID of its own.
    ns.apply(&restore_manifest("copy", 3, &version, "snap"));
    let copy = wait_cluster_ready(&ns, "copy", 3, 4 * MINUTE).await;
    assert_ne!(
        copy.status.as_ref().unwrap().cluster_id,
        source.status.as_ref().unwrap().cluster_id
    );
    let names: Vec<String> = copy
        .status
        .as_ref()
        .unwrap()
        .members
        .iter()
        .map(|m| m.name.clone())
        .collect();
    let mut restored = etcd_client(
        &ns,
        "copy",
        &member_endpoints(&ns, &names.iter().map(String::as_str).collect::<Vec<_>>()).await,
    )
    .await;
    let data = restored
        .get("data/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(data.kvs().len(), 100);
    assert_eq!(data.kvs()[42].value_str().unwrap(), "value 42");
    wait_until("a Restored Event and the restore pod gone", MINUTE, || async {
        cluster_events(&ns, "copy")
            .await
            .iter()
            .any(|(r, m)| r == "Restored" && m.contains("snap"))
            && ns.pods().get_opt("copy-0-restore").await.unwrap().is_none()
    })
    .await;
    // How it started cannot be changed afterwards.
    let edit = cluster_manifest("copy", 3, &version, "");
    let out = kubectl(&["apply", "-n", &ns.name, "-f", "-"], Some(&edit));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("bootstrap is immutable"),
        "{out:?}"
    );

    // A backup whose stored snapshot was altered is refused before anything starts.
    ns.apply(&backup_manifest("altered", "source"));
    let altered = wait_backup_done(&ns, "altered").await;
    let key = altered.status.unwrap().key.unwrap();
    let mut bytes = store
        .get(&Path::from(key.clone()))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    bytes[100] ^= 0xff;
    store.put(&Path::from(key), bytes.into()).await.unwrap();
    ns.apply(&restore_manifest("broken", 1, &version, "altered"));
    let broken = wait_ready_false(&ns, "broken", "RestoreFailed").await;
    let (_, _, message) = condition(&broken, "Ready").unwrap();
    assert!(message.contains("fetch"), "{message}");
    let logs = kubectl_ok(&["logs", "-n", &ns.name, "broken-0-restore", "-c", "fetch"], None);
    assert!(logs.contains("SHA-256"), "{logs}");
    assert!(
        ns.pods().get_opt("broken-0").await.unwrap().is_none(),
        "no member started on it"
    );

    // A backup that does not exist: said so, nothing started.
    ns.apply(&restore_manifest("hopeful", 1, &version, "no-such-backup"));
    wait_ready_false(&ns, "hopeful", "BackupNotFound").await;
    assert!(ns.pods().get_opt("hopeful-0").await.unwrap().is_none());
}

/// Asks for a recovery of cluster `main` from its latest backup.
fn ask_recovery(ns: &TestNamespace) {
    kubectl_ok(
        &[
            "annotate",
            "-n",
            &ns.name,
            "etcdcluster/main",
            "noops.dev/recover-from-backup=latest",
        ],
        None,
    );
}

/// Waits until the operator reports `value` for `main`'s quorum-lost metric.
async fn wait_quorum_metric(operator: &Operator, ns: &TestNamespace, value: f64) {
    let series = format!("noops_etcd_quorum_lost{{namespace=\"{}\",cluster=\"main\"}}", ns.name);
    wait_until(&format!("{series} = {value}"), MINUTE, || async {
        operator.metric(&series).await == Some(value)
    })
    .await;
}

#[tokio::test]
async fn a_cluster_that_lost_its_quorum_is_recovered_from_a_backup_only_when_asked() {
    install_crds();
    let ns = TestNamespace::new("etcd-recover").await;
    let operator = Operator::start(&ns.name, &["--controllers", "etcd,etcdbackup"]);
    s3::deploy(&ns);
    s3::create_bucket(&ns, "backups").await;
    let version = etcd_version("3.5");
    ns.apply(&cluster_manifest("main", 3, &version, &backup_spec(&ns, None, 2)));
    let before = wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
    let status = before.status.clone().unwrap();
    let mut client = etcd_client(
        &ns,
        "main",
        &member_endpoints(&ns, &["main-0", "main-1", "main-2"]).await,
    )
    .await;
    client.put("kept", "in the backup", None).await.unwrap();
    ns.apply(&backup_manifest("good", "main"));
    assert_eq!(
        wait_backup_done(&ns, "good").await.status.unwrap().progress.phase,
        Some(BackupPhase::Succeeded)
    );
    client.put("lost", "after the backup", None).await.unwrap();

    // Two of three members lose their disks: no quorum, reported, and nothing is changed.
    let leader = status.leader.clone().unwrap();
    let lost: Vec<String> = ["main-0", "main-1", "main-2"]
        .iter()
        .filter(|m| **m != leader)
        .map(|m| m.to_string())
        .collect();
    for member in &lost {
        lose_pod_and_volume(&ns, member);
    }
    let api: Api<EtcdCluster> = ns.api();
    wait_until("QuorumLost reported", 2 * MINUTE, || async {
        api.get("main").await.ok().is_some_and(|c| {
            condition(&c, "Available").is_some_and(|(s, r, _)| s == "False" && r == "QuorumLost")
                && c.status.as_ref().and_then(|s| s.phase) == Some(EtcdClusterPhase::QuorumLost)
        })
    })
    .await;
    wait_quorum_metric(&operator, &ns, 1.0).await;
    assert!(
        ns.pods().get_opt(&leader).await.unwrap().is_some(),
        "the surviving member is left alone"
    );
    // Told after the status write that says it: waited for.
    cluster_events_when(&ns, "main", "a QuorumLost Event", |events| {
        events.iter().any(|(r, _)| r == "QuorumLost")
    })
    .await;

    // Asked for: the cluster starts again from the backup, under a new cluster ID.
    ask_recovery(&ns);
    let recovered = wait_for("the cluster recovered from the backup", 4 * MINUTE, || async {
        api.get("main").await.ok().filter(|c| {
            cluster_ready(c, 3) && c.status.as_ref().and_then(|s| s.cluster_id.clone()) != status.cluster_id
        })
    })
    .await;
    let after = recovered.status.clone().unwrap();
    assert_eq!(after.restored_from.as_deref(), Some("good"));
    assert!(
        after
            .members
            .iter()
            .all(|m| !["main-0", "main-1", "main-2"].contains(&m.name.as_str())),
        "new members, new names: {:?}",
        after.members
    );
    assert!(
        !recovered
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("noops.dev/recover-from-backup"),
        "one request, one recovery"
    );
    let names: Vec<String> = after.members.iter().map(|m| m.name.clone()).collect();
    let mut client = etcd_client(
        &ns,
        "main",
        &member_endpoints(&ns, &names.iter().map(String::as_str).collect::<Vec<_>>()).await,
    )
    .await;
    let kept = client.get("kept", None).await.unwrap();
    assert_eq!(kept.kvs()[0].value_str().unwrap(), "in the backup");
    assert!(
        client.get("lost", None).await.unwrap().kvs().is_empty(),
        "writes after the backup are gone, as said"
    );
    assert!(
        cluster_events(&ns, "main")
            .await
            .iter()
            .any(|(r, m)| r == "RecoveringFromBackup" && m.contains("good"))
    );
    wait_quorum_metric(&operator, &ns, 0.0).await;

    // Asked for while the quorum is fine: nothing happens, and the request is dropped.
    ask_recovery(&ns);
    wait_until("RecoveryNotNeeded and the request dropped", MINUTE, || async {
        let c = api.get("main").await.unwrap();
        cluster_events(&ns, "main")
            .await
            .iter()
            .any(|(r, _)| r == "RecoveryNotNeeded")
            && !c
                .metadata
                .annotations
                .unwrap_or_default()
                .contains_key("noops.dev/recover-from-backup")
    })
    .await;
    let same = wait_cluster_ready(&ns, "main", 3, MINUTE).await;
    assert_eq!(same.status.unwrap().cluster_id, after.cluster_id);
}

/// The snapshot files of cluster `main` in a backup volume's folder (names only).
fn files_in(folder: &std::path::Path) -> BTreeSet<String> {
    std::fs::read_dir(folder.join("etcd/main"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn sha256_of(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn backups_to_a_volume_are_saved_scheduled_kept_restored_and_deleted() {
    install_crds();
    let ns = TestNamespace::new("etcd-backup-volume").await;
    let _operator = Operator::start(&ns.name, &["--controllers", "etcd,etcdbackup"]);
    let version = etcd_version("3.5");
    ns.apply(&claim_manifest("etcd-backups", "1Gi"));

    // Both destinations at once is refused by the API server.
    let both = backup_spec(&ns, None, 2).replace("    s3:\n", "    volume:\n      claimName: etcd-backups\n    s3:\n");
    let out = kubectl(
        &["apply", "-n", &ns.name, "-f", "-"],
        Some(&cluster_manifest("both", 1, &version, &both)),
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("backup needs exactly one destination"),
        "{out:?}"
    );

    let escaping = format!(
        "{}      prefix: ../elsewhere\n",
        volume_backup_spec("etcd-backups", None, 2)
    );
    let out = kubectl(
        &["apply", "-n", &ns.name, "-f", "-"],
        Some(&cluster_manifest("escaping", 1, &version, &escaping)),
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("must be a relative path inside the volume"),
        "{out:?}"
    );

    ns.apply(&cluster_manifest(
        "main",
        1,
        &version,
        &volume_backup_spec("etcd-backups", None, 2),
    ));
    wait_cluster_ready(&ns, "main", 1, 2 * MINUTE).await;
    let mut client = etcd_client(&ns, "main", &member_endpoints(&ns, &["main-0"]).await).await;
    for i in 0..50 {
        client
            .put(format!("data/{i:02}"), format!("value {i}"), None)
            .await
            .unwrap();
    }
    let written_at = client.get("data/49", None).await.unwrap().header().unwrap().revision();

    // On demand: the snapshot is in the volume, as described, and etcd's own tool reads it.
    ns.apply(&backup_manifest("manual", "main"));
    let manual = wait_backup_done(&ns, "manual").await;
    let status = manual.status.clone().unwrap();
    assert_eq!(status.progress.phase, Some(BackupPhase::Succeeded), "{status:?}");
    assert_eq!(
        status.progress.location.as_deref(),
        Some("pvc://etcd-backups/etcd/main/manual.db")
    );
    assert!(status.revision.unwrap() >= written_at, "{status:?}");
    let folder = claim_folder(&ns, "etcd-backups").await;
    let bytes = std::fs::read(folder.join("etcd/main/manual.db")).unwrap();
    assert_eq!(i64::try_from(bytes.len()).unwrap(), status.progress.size.unwrap());
    assert_eq!(Some(sha256_of(&bytes)), status.progress.sha256);
    let checked = std::process::Command::new(upstream_bin("etcd-3.5/etcdutl"))
        .args(["snapshot", "status", "-w", "json"])
        .arg(folder.join("etcd/main/manual.db"))
        .output()
        .unwrap();
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
    wait_until("the save pod to be gone", MINUTE, || async {
        ns.pods().get_opt("manual-save").await.unwrap().is_none()
    })
    .await;
    // The cluster says how its latest backup went.
    kubectl_ok(
        &[
            "wait",
            "-n",
            &ns.name,
            "--for=condition=BackupSucceeded",
            "etcdcluster/main",
            "--timeout=60s",
        ],
        None,
    );
    let main = ns.api::<EtcdCluster>().get("main").await.unwrap();
    let (_, reason, message) = condition(&main, "BackupSucceeded").unwrap();
    assert_eq!(reason, "BackupStored");
    assert!(
        message.contains("manual") && message.contains("pvc://etcd-backups/"),
        "{message}"
    );

    // On a schedule (every 3 s), keeping 2: older scheduled backups go, files and all.
    patch_spec(
        &ns,
        "main",
        serde_json::json!({ "backup": { "schedule": "*/3 * * * * *" } }),
    )
    .await;
    let backups: Api<EtcdBackup> = ns.api();
    let scheduled = |list: &[EtcdBackup]| -> BTreeSet<String> {
        list.iter()
            .filter(|b| {
                b.metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key("noops.dev/scheduled"))
            })
            .filter_map(|b| b.metadata.name.clone())
            .collect()
    };
    let mut seen = BTreeSet::new();
    let deadline = std::time::Instant::now() + 2 * MINUTE;
    while seen.len() < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "only {seen:?} scheduled backups in 2 minutes"
        );
        seen.extend(scheduled(&backups.list(&Default::default()).await.unwrap().items));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    patch_spec(&ns, "main", serde_json::json!({ "backup": { "schedule": null } })).await;
    let kept = wait_for("retention to settle at two scheduled backups", 2 * MINUTE, || async {
        let list = backups.list(&Default::default()).await.unwrap().items;
        let done = list.iter().all(|b| {
            b.status.as_ref().and_then(|s| s.progress.phase) == Some(BackupPhase::Succeeded)
                && b.metadata.deletion_timestamp.is_none()
        });
        let names: BTreeSet<String> = list.iter().filter_map(|b| b.metadata.name.clone()).collect();
        let expected: BTreeSet<String> = names.iter().map(|n| format!("{n}.db")).collect();
        (done && names.len() == 3 && files_in(&folder) == expected).then_some(names)
    })
    .await;
    assert!(kept.contains("manual"), "{kept:?}");
    let pods = ns.pods().list(&Default::default()).await.unwrap().items;
    let helpers: Vec<_> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .filter(|n| n.ends_with("-save") || n.ends_with("-delete"))
        .collect();
    assert!(helpers.is_empty(), "helper pods left behind: {helpers:?}");

    // A new cluster from the on-demand backup holds the data, under a cluster ID of its own.
    ns.apply(&restore_manifest("copy", 1, &version, "manual"));
    let copy = wait_cluster_ready(&ns, "copy", 1, 3 * MINUTE).await;
    let mut restored = etcd_client(&ns, "copy", &member_endpoints(&ns, &["copy-0"]).await).await;
    let data = restored
        .get("data/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(data.kvs().len(), 50);
    assert_eq!(data.kvs()[7].value_str().unwrap(), "value 7");
    assert_ne!(copy.status.unwrap().cluster_id, manual.status.unwrap().cluster_id);

    // A backup whose file was altered in the volume is refused before anything starts.
    let victim = kept.iter().find(|n| *n != "manual").unwrap().clone();
    let path = folder.join(format!("etcd/main/{victim}.db"));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    ns.apply(&restore_manifest("broken", 1, &version, &victim));
    let broken = wait_ready_false(&ns, "broken", "RestoreFailed").await;
    let (_, _, message) = condition(&broken, "Ready").unwrap();
    assert!(message.contains("fetch"), "{message}");
    assert!(
        ns.pods().get_opt("broken-0").await.unwrap().is_none(),
        "no member started on it"
    );

    // Deleting a backup deletes its file.
    backups.delete("manual", &DeleteParams::default()).await.unwrap();
    wait_until("the manual snapshot file to be deleted", 2 * MINUTE, || async {
        !files_in(&folder).contains("manual.db") && backups.get_opt("manual").await.unwrap().is_none()
    })
    .await;

    // A claim that does not exist: the backup waits and says why; the cluster runs on.
    ns.apply(&cluster_manifest(
        "claimless",
        1,
        &version,
        &volume_backup_spec("no-such-claim", None, 2),
    ));
    wait_cluster_ready(&ns, "claimless", 1, 2 * MINUTE).await;
    ns.apply(&backup_manifest("claimless-1", "claimless"));
    wait_until("ClaimNotFound naming the claim", MINUTE, || async {
        backups.get("claimless-1").await.ok().is_some_and(|b| {
            b.status.unwrap_or_default().progress.conditions.iter().any(|c| {
                c.type_ == "Succeeded"
                    && c.status == "False"
                    && c.reason == "ClaimNotFound"
                    && c.message.contains("no-such-claim")
            })
        })
    })
    .await;
}
