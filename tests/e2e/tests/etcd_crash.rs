//! Crash safety: the operator kills itself (SIGKILL) at every point where it has acted and not
//! yet recorded it in status (its crash points, `NOOPS_CRASH_POINTS`), once each, through a
//! bootstrap, a scale up and down, the replacement of a member that lost its volume, a minor
//! upgrade, a backup and a restore into a new cluster, while a client writes. A supervisor
//! starts it again each time. After each phase the cluster must converge; at the end no
//! acknowledged write may be missing, no read may have gone back in time, the quorum was never
//! lost, and the test prints how many distinct crash points it went through. Needs
//! `make cluster-up` (3 nodes).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use noops_e2e::etcd::*;
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);

/// The writer's keys in the cluster, now or at `revision`.
async fn written_keys(client: &mut etcd_client::Client, revision: Option<i64>) -> BTreeSet<String> {
    let mut options = etcd_client::GetOptions::new().with_prefix().with_keys_only();
    if let Some(revision) = revision {
        options = options.with_revision(revision);
    }
    let answer = client.get(WRITTEN, Some(options)).await.unwrap();
    answer
        .kvs()
        .iter()
        .filter_map(|kv| kv.key_str().ok().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn the_operator_killed_at_each_crash_point_always_converges_and_loses_nothing() {
    install_crds();
    let ns = TestNamespace::new("etcd-crash").await;
    s3::deploy(&ns);
    s3::create_bucket(&ns, "backups").await;
    let crash_points = std::env::temp_dir().join(format!("noops-crash-points-{}", ns.name));
    let _ = std::fs::remove_file(&crash_points);
    let supervisor = Supervisor::start(&ns.name, &crash_points);
    let (from, to) = (etcd_version("3.5"), etcd_version("3.6"));

    // Bootstrap.
    ns.apply(&cluster_manifest("main", 3, &from, &backup_spec(&ns, None, 3)));
    wait_cluster_ready(&ns, "main", 3, 4 * MINUTE).await;
    let writer = Writer::start(etcd_client(&ns, "main", &[service_endpoint(&ns, "main").await]).await);

    // Scale up and down.
    patch_spec(&ns, "main", serde_json::json!({ "replicas": 5 })).await;
    wait_cluster_ready(&ns, "main", 5, 5 * MINUTE).await;
    patch_spec(&ns, "main", serde_json::json!({ "replicas": 3 })).await;
    let settled = wait_cluster_ready(&ns, "main", 3, 5 * MINUTE).await;

    // A member loses its pod and volume: removed, then replaced under a new name.
    let before = member_names(&settled);
    let lost = before.iter().next().unwrap().clone();
    lose_pod_and_volume(&ns, &lost);
    wait_replaced(&ns, "main", 3, &lost).await;

    // A minor upgrade.
    patch_spec(&ns, "main", serde_json::json!({ "version": to })).await;
    wait_on_version(&ns, "main", 3, &to).await;

    // A backup, taken while the client still writes.
    let snap = back_up(&ns, "snap", "main").await;
    let history = writer.stop().await;
    let names: Vec<String> = member_names(&wait_cluster_ready(&ns, "main", 3, MINUTE).await)
        .into_iter()
        .collect();
    let endpoints = member_endpoints(&ns, &names.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let mut checker = etcd_client(&ns, "main", &endpoints).await;
    assert_no_write_lost(&history, &mut checker, 100).await;

    // A restore into a new cluster: it holds what the main cluster held at the backup's
    // revision (the snapshot was taken at or after it), and nothing main never had.
    let backup_revision = snap.status.as_ref().and_then(|s| s.revision).unwrap();
    let at_backup = written_keys(&mut checker, Some(backup_revision)).await;
    let main_now = written_keys(&mut checker, None).await;
    ns.apply(&restore_manifest("copy", 3, &to, "snap"));
    let copy = wait_cluster_ready(&ns, "copy", 3, 5 * MINUTE).await;
    let copy_names: Vec<String> = member_names(&copy).into_iter().collect();
    let copy_endpoints = member_endpoints(&ns, &copy_names.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let restored = written_keys(&mut etcd_client(&ns, "copy", &copy_endpoints).await, None).await;
    assert!(
        !at_backup.is_empty(),
        "the backup was taken while writes were acknowledged"
    );
    assert!(
        restored.is_superset(&at_backup),
        "{} keys at the backup's revision missing",
        at_backup.difference(&restored).count()
    );
    assert!(
        restored.is_subset(&main_now),
        "the restored cluster holds keys main never had"
    );

    let (restarts, logs) = supervisor.stop().await;
    let points: BTreeSet<String> = std::fs::read_to_string(&crash_points)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    println!(
        "crash safety: {} distinct crash points, {restarts} operator restarts:\n  {}",
        points.len(),
        points.iter().cloned().collect::<Vec<_>>().join("\n  ")
    );
    assert!(!logs.contains("panicked"), "an operator panicked:\n{logs}");
    for cluster in ["main", "copy"] {
        let events = cluster_events(&ns, cluster).await;
        assert!(
            !events.iter().any(|(reason, _)| reason == "QuorumLost"),
            "{cluster} lost its quorum: {events:?}"
        );
    }
    // Every phase above has its points; fewer means a phase stopped reaching them.
    for expected in [
        "bootstrap: first member started",
        "add: learner added to etcd, its ID not recorded",
        "add: learner's pod made",
        "add: learner promoted, not recorded",
        "remove: member removed from etcd, not recorded",
        "remove: pod deleted, volume not yet",
        "upgrade: member stopped for its restart",
        "backup: snapshot stored, status not written",
        "restore: restore pod made",
        "bootstrap: state set to existing, cluster ID not recorded",
    ] {
        assert!(
            points.contains(expected),
            "crash point {expected:?} never reached: {points:?}"
        );
    }
    assert_eq!(
        restarts,
        points.len(),
        "one restart per crash point, no crash of another kind"
    );
}

/// Makes `dir` what a first member leaves when its node dies a few milliseconds into its very
/// first start: etcd (3.6, started here on loopback ports) made the data directory, then was
/// killed before it wrote the member into it. Tries kills a little earlier or later until a
/// start on what is left waits for voters it never recorded.
fn cut_short_first_start(dir: &std::path::Path) {
    let etcd = upstream_bin("etcd-3.6/etcd");
    let (peer, client) = (free_port(), free_port());
    let args = [
        "--name=cut-0".to_string(),
        format!("--data-dir={}", dir.display()),
        format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
        format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
        format!("--listen-client-urls=http://127.0.0.1:{client}"),
        format!("--advertise-client-urls=http://127.0.0.1:{client}"),
        format!("--initial-cluster=cut-0=http://127.0.0.1:{peer}"),
        "--initial-cluster-state=new".to_string(),
    ];
    let start = || {
        std::process::Command::new(&etcd)
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    for attempt in 0..200u64 {
        let _ = std::fs::remove_dir_all(dir);
        let mut first = start();
        std::thread::sleep(Duration::from_millis(5 + attempt % 30));
        let _ = first.kill();
        let _ = first.wait();
        if !dir.join("member/wal").exists() {
            continue;
        }
        let mut again = start();
        std::thread::sleep(Duration::from_secs(2));
        let _ = again.kill();
        let output = again.wait_with_output().unwrap();
        let log = String::from_utf8_lossy(&output.stderr);
        if log.contains("voters=()") && !log.contains("became leader") {
            return;
        }
    }
    panic!("could not cut a first start short in 200 tries");
}

#[tokio::test]
async fn a_first_member_whose_start_was_cut_short_starts_again_and_the_cluster_forms() {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    install_crds();
    let ns = TestNamespace::new("etcd-cut").await;
    // The volume the first member will get, already holding what a node that died a few
    // milliseconds into the member's first start leaves: provisioned by a pod that mounts it
    // (an etcd of its own in another folder), then filled here.
    ns.apply(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: { name: cut-0-data }\nspec: { accessModes: [ReadWriteOnce], resources: { requests: { storage: 1Gi } } }\n",
    );
    let image = format!("quay.io/coreos/etcd:v{}", etcd_version("3.6"));
    ns.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{ name: provision }}\nspec:\n  containers:\n    - name: etcd\n      image: {image}\n      command: [/usr/local/bin/etcd, --data-dir=/var/lib/etcd/elsewhere]\n      volumeMounts: [{{ name: data, mountPath: /var/lib/etcd }}]\n  volumes: [{{ name: data, persistentVolumeClaim: {{ claimName: cut-0-data }} }}]\n"
    ));
    ns.wait_pod_ready("provision", 2 * MINUTE).await;
    ns.pods()
        .delete("provision", &kube::api::DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let folder = claim_folder(&ns, "cut-0-data").await;
    let cut = tokio::task::spawn_blocking(move || cut_short_first_start(&folder.join("data")));
    cut.await.unwrap();
    let claims = ns.api::<PersistentVolumeClaim>();
    let first_claim = claims.get("cut-0-data").await.unwrap().metadata.uid;

    // The cluster is made on it: its first member waits for voters it never recorded, and is
    // started again on a new volume.
    let _operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    ns.apply(&cluster_manifest("cut", 1, &etcd_version("3.6"), ""));
    let ready = wait_cluster_ready(&ns, "cut", 1, 4 * MINUTE).await;
    assert!(ready.status.unwrap().cluster_id.is_some());
    let events = cluster_events(&ns, "cut").await;
    assert!(
        events.iter().any(|(reason, _)| reason == "BootstrapRestarted"),
        "{events:?}"
    );
    assert_ne!(
        claims.get("cut-0-data").await.unwrap().metadata.uid,
        first_claim,
        "a new volume"
    );
    let pod = ns.pods().get("cut-0").await.unwrap();
    assert!(pod_ready(&pod));
}
