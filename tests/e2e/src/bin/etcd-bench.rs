//! EtcdCluster benchmark on the local Kubernetes (`make bench` runs it), each figure beside what
//! bounds it, so that the operator's own share shows as a ratio:
//! - create, resize, recover a member and upgrade, against the budgets CoreOS's etcd-operator
//!   gave itself in its own end-to-end tests (60 s, 60 s, 60 s, 100 s);
//! - a member's process killed until it is healthy again, against etcd's own start;
//! - a follower's pod deleted (5 times in the first run), and two of three members' pods
//!   deleted at once (the quorum lost), until the cluster is Ready again on the pods made
//!   again, against a process kill; and how long the cluster takes to say Ready once those
//!   pods are Ready, against 2 s;
//! - a member's node stopped until a successor is Ready, against the grace period a member
//!   gets before it counts as lost;
//! - a backup and a restore of a 100 MiB database, against `etcdctl snapshot save` alone and
//!   `etcdutl snapshot restore` plus an etcd start;
//! - the operator's memory with 20 clusters, against its memory with none, and the API
//!   requests it makes in an idle minute beyond its leader lease's renewals (its own count),
//!   against those renewals.
//!
//! Usage: etcd-bench <noops binary> [runs]; prints a Markdown table. The node-stop row needs 3
//! nodes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use noops_api::EtcdCluster;
use noops_e2e::bench::{free_port, median, row, rss_mib, scratch};
use noops_e2e::etcd::*;
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);
/// The database size of the backup and restore rows.
const BIG_DATABASE_MIB: usize = 100;
/// How many times the first run deletes a follower's pod.
const FOLLOWER_DELETIONS: usize = 5;
/// The clusters of the memory and idle-requests rows.
const MANY_CLUSTERS: usize = 20;

/// An etcd of `version` alone on this machine (loopback only), on `dir`.
struct LoneEtcd {
    child: Child,
    client: String,
}

impl LoneEtcd {
    /// Starts it and waits until it answers /health; returns it and how long that took.
    async fn start(version: &str, dir: &Path, peer: u16) -> (Self, f64) {
        let client = format!("127.0.0.1:{}", free_port());
        let peer_url = format!("http://127.0.0.1:{peer}");
        let t = Instant::now();
        let child = Command::new(upstream_bin(&format!("etcd-{}/etcd", minor(version))))
            .args([
                "--name=lone".to_string(),
                format!("--data-dir={}", dir.display()),
                format!("--listen-client-urls=http://{client}"),
                format!("--advertise-client-urls=http://{client}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=lone={peer_url}"),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let lone = Self { child, client };
        wait_until("a lone etcd to answer", MINUTE, || async {
            http_get(&lone.client, "/health")
                .await
                .is_some_and(|b| b.contains("true"))
        })
        .await;
        (lone, t.elapsed().as_secs_f64())
    }
}

impl Drop for LoneEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn minor(version: &str) -> String {
    version.split('.').take(2).collect::<Vec<_>>().join(".")
}

/// etcd's own start on an empty data folder (median of 3).
async fn etcd_start(version: &str) -> f64 {
    let mut times = vec![];
    for i in 0..3 {
        let dir = scratch("etcd-bench", &format!("start-{i}"));
        let (_lone, took) = LoneEtcd::start(version, &dir.join("data"), free_port()).await;
        times.push(took);
        drop(_lone);
        let _ = std::fs::remove_dir_all(&dir);
    }
    median(times)
}

/// Writes `mib` MiB of incompressible values to cluster `name` (1 MiB per key).
async fn fill(ns: &TestNamespace, name: &str, members: &[&str], mib: usize) {
    let mut client = etcd_client(ns, name, &member_endpoints(ns, members).await).await;
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..mib {
        let value: Vec<u8> = (0..1 << 20)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        client.put(format!("big/{i:04}"), value, None).await.unwrap();
    }
}

/// Time for `etcdctl snapshot save` alone against `member` of cluster `name`, and the file.
async fn etcdctl_snapshot(ns: &TestNamespace, name: &str, member: &str, version: &str, dir: &Path) -> (f64, PathBuf) {
    let secret = ns.api::<Secret>().get(&format!("{name}-client")).await.unwrap();
    let data = secret.data.unwrap();
    for key in ["ca.crt", "tls.crt", "tls.key"] {
        std::fs::write(dir.join(key), &data[key].0).unwrap();
    }
    let endpoint = member_endpoints(ns, &[member]).await.remove(0);
    let file = dir.join("snapshot.db");
    let t = Instant::now();
    let out = Command::new(upstream_bin(&format!("etcd-{}/etcdctl", minor(version))))
        .args([
            format!("--endpoints={endpoint}"),
            format!("--cacert={}", dir.join("ca.crt").display()),
            format!("--cert={}", dir.join("tls.crt").display()),
            format!("--key={}", dir.join("tls.key").display()),
            // The member's certificate names its DNS names, not the pod address used here.
            "--insecure-skip-tls-verify".into(),
            "snapshot".into(),
            "save".into(),
            file.display().to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "etcdctl snapshot save: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (t.elapsed().as_secs_f64(), file)
}

/// Time for `etcdutl snapshot restore` of `file` plus an etcd start on what it restored.
async fn etcdutl_restore_and_start(file: &Path, version: &str, dir: &Path) -> f64 {
    let peer = free_port();
    let restored = dir.join("restored");
    let t = Instant::now();
    let out = Command::new(upstream_bin(&format!("etcd-{}/etcdutl", minor(version))))
        .args([
            "snapshot".to_string(),
            "restore".into(),
            file.display().to_string(),
            format!("--data-dir={}", restored.display()),
            "--name=lone".into(),
            format!("--initial-cluster=lone=http://127.0.0.1:{peer}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "etcdutl snapshot restore: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_lone, _) = LoneEtcd::start(version, &restored, peer).await;
    t.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let binary = PathBuf::from(args.get(1).expect("usage: etcd-bench <noops binary> [runs]"));
    let runs: usize = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(3);
    install_crds();
    let (v35, v36) = (etcd_version("3.5"), etcd_version("3.6"));
    let lone_start = etcd_start(&v35).await;
    let mut create = vec![];
    let mut resize = vec![];
    let mut recover = vec![];
    let mut upgrade = vec![];
    let mut heal = vec![];
    let mut pod_gone = vec![];
    let mut ready_after_pods = vec![];
    let mut majority_gone = vec![];
    let mut node_stop = None;
    for run in 0..runs {
        let ns = TestNamespace::new("etcd-bench").await;
        let _operator = Operator::start_binary(&binary, &ns.name, &["--controllers", "etcd"], &kubeconfig());
        let api: Api<EtcdCluster> = ns.api();
        let t = Instant::now();
        ns.apply(&cluster_manifest("main", 3, &v35, ""));
        let ready = wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
        create.push(t.elapsed().as_secs_f64());

        // A member's process killed: its container restarts it, as the same member.
        let victim = follower(&ready).name;
        let before = restart_count(&ns.pods().get(&victim).await.unwrap());
        let t = Instant::now();
        kill_member_process(&ns, "main", &victim);
        wait_until("the killed member restarted, Ready and healthy", 3 * MINUTE, || async {
            let pod = ns.pods().get(&victim).await.ok();
            let back = pod.is_some_and(|p| restart_count(&p) > before && pod_ready(&p));
            back && api.get("main").await.ok().is_some_and(|c| {
                cluster_ready(&c, 3) && c.status.as_ref().is_some_and(|s| s.members.iter().all(|m| m.healthy))
            })
        })
        .await;
        heal.push(t.elapsed().as_secs_f64());

        // A follower's pod deleted ([`FOLLOWER_DELETIONS`] times in the first run), then two
        // of three: made again on their volumes, as the same members.
        for _ in 0..if run == 0 { FOLLOWER_DELETIONS } else { 1 } {
            let victim = follower(&wait_cluster_ready(&ns, "main", 3, MINUTE).await).name;
            let (took, ready_lag) = delete_pods_until_ready(&ns, &[victim.as_str()]).await;
            pod_gone.push(took);
            ready_after_pods.push(ready_lag);
        }
        let leader = wait_cluster_ready(&ns, "main", 3, MINUTE)
            .await
            .status
            .and_then(|s| s.leader)
            .unwrap();
        let other = if leader == "main-0" { "main-1" } else { "main-0" };
        majority_gone.push(delete_pods_until_ready(&ns, &[leader.as_str(), other]).await.0);

        let t = Instant::now();
        patch_spec(&ns, "main", serde_json::json!({ "replicas": 5 })).await;
        wait_cluster_ready(&ns, "main", 5, 3 * MINUTE).await;
        resize.push(t.elapsed().as_secs_f64());
        patch_spec(&ns, "main", serde_json::json!({ "replicas": 3 })).await;
        let three = wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;

        // A member loses its pod and volume: removed, then replaced.
        let lost = follower(&three).name;
        let t = Instant::now();
        lose_pod_and_volume(&ns, &lost);
        let three = wait_replaced(&ns, "main", 3, &lost).await;
        recover.push(t.elapsed().as_secs_f64());

        let t = Instant::now();
        patch_spec(&ns, "main", serde_json::json!({ "version": v36 })).await;
        wait_on_version(&ns, "main", 3, &v36).await;
        upgrade.push(t.elapsed().as_secs_f64());

        // Once: a follower's machine dies; its member is replaced on another node.
        let nodes = nodes(&ns.client).await.len();
        if run + 1 == runs && nodes >= 3 {
            let member = follower(&three);
            let node = member.node.clone().unwrap();
            let t = Instant::now();
            node_fault(&["stop", &node]);
            wait_replaced(&ns, "main", 3, &member.name).await;
            node_stop = Some(t.elapsed().as_secs_f64());
            node_fault(&["start", &node]);
            ready_nodes(&ns.client, nodes).await;
        }
    }
    let (backup, etcdctl_save, restore, etcdutl_restore) = backup_and_restore(&binary, &v35).await;
    let (rss_none, rss_many, requests_beyond_lease, lease_renewals) = many_clusters(&binary, &v35).await;

    println!("| EtcdCluster (release operator) | median of {runs} | what bounds it | bound | ratio | runs |");
    println!("|---|---|---|---|---|---|");
    row(
        "create 3 members → Ready (s)",
        &create,
        "CoreOS etcd-operator's budget (s)",
        60.0,
    );
    row(
        "resize 3 → 5 → Ready (s)",
        &resize,
        "CoreOS etcd-operator's budget (s)",
        60.0,
    );
    row(
        "replace a member that lost its volume (s)",
        &recover,
        "CoreOS etcd-operator's budget (s)",
        60.0,
    );
    row(
        "upgrade 3 members 3.5 → 3.6 (s)",
        &upgrade,
        "CoreOS etcd-operator's budget (s)",
        100.0,
    );
    row(
        "member process killed → healthy (s)",
        &heal,
        "etcd's own start, alone (s)",
        lone_start,
    );
    let heal_median = median(heal.clone());
    row(
        "a follower's pod deleted → Ready again (s)",
        &pod_gone,
        "member process killed → healthy (s)",
        heal_median,
    );
    row(
        "…of which: the cluster Ready after its pods were (s)",
        &ready_after_pods,
        "the most it may take (s)",
        2.0,
    );
    row(
        "two of three pods deleted (quorum lost) → Ready again (s)",
        &majority_gone,
        "member process killed → healthy (s)",
        heal_median,
    );
    match node_stop {
        Some(t) => row(
            "member's node stopped → successor Ready (s)",
            &[t],
            "grace before a member counts as lost (s)",
            30.0,
        ),
        None => println!("| member's node stopped → successor Ready (s) | n/a (needs 3 nodes) | | | | |"),
    }
    row(
        &format!("backup of a {BIG_DATABASE_MIB} MiB database → Succeeded (s)"),
        &[backup],
        "`etcdctl snapshot save` alone (s)",
        etcdctl_save,
    );
    row(
        "restore of it into a new cluster → Ready (s)",
        &[restore],
        "`etcdutl snapshot restore` + etcd start (s)",
        etcdutl_restore,
    );
    row(
        &format!("operator RSS with {MANY_CLUSTERS} clusters (MiB)"),
        &[rss_many],
        "operator RSS with none (MiB)",
        rss_none,
    );
    row(
        &format!("operator API requests per idle minute beyond lease renewals, {MANY_CLUSTERS} clusters"),
        &[requests_beyond_lease],
        "lease renewals that minute",
        lease_renewals,
    );
}

/// Deletes the pods of `victims` of cluster `main` at once; returns how long until each runs in
/// a new, Ready pod and the cluster is Ready with every member healthy, and how long of that
/// the cluster took to say Ready after the last of those pods was Ready (polled every 50 ms).
async fn delete_pods_until_ready(ns: &TestNamespace, victims: &[&str]) -> (f64, f64) {
    let api: Api<EtcdCluster> = ns.api();
    let mut before = Vec::new();
    for victim in victims {
        before.push(ns.pods().get(victim).await.unwrap().metadata.uid);
    }
    let t = Instant::now();
    for victim in victims {
        ns.pods().delete(victim, &Default::default()).await.unwrap();
    }
    let mut pods_ready_at = None;
    loop {
        assert!(
            t.elapsed() < 3 * MINUTE,
            "the deleted pods made again, the cluster Ready: timed out"
        );
        let mut renewed = true;
        for (victim, uid) in victims.iter().zip(&before) {
            let pod = ns.pods().get_opt(victim).await.ok().flatten();
            renewed &=
                pod.is_some_and(|p| pod_ready(&p) && p.metadata.deletion_timestamp.is_none() && p.metadata.uid != *uid);
        }
        if renewed {
            let pods_ready = *pods_ready_at.get_or_insert_with(|| t.elapsed());
            let cluster_ready_now = api.get("main").await.ok().is_some_and(|c| {
                cluster_ready(&c, 3) && c.status.as_ref().is_some_and(|s| s.members.iter().all(|m| m.healthy))
            });
            if cluster_ready_now {
                let total = t.elapsed();
                return (total.as_secs_f64(), (total - pods_ready).as_secs_f64());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A 1-member cluster filled with 100 MiB: an EtcdBackup of it, and a new cluster restored
/// from that, each against etcd's own tools doing the same.
async fn backup_and_restore(binary: &Path, version: &str) -> (f64, f64, f64, f64) {
    let ns = TestNamespace::new("etcd-bench-big").await;
    let _operator = Operator::start_binary(binary, &ns.name, &["--controllers", "etcd,etcdbackup"], &kubeconfig());
    s3::deploy(&ns);
    s3::create_bucket(&ns, "backups").await;
    ns.apply(&cluster_manifest("big", 1, version, &backup_spec(&ns, None, 3)));
    wait_cluster_ready(&ns, "big", 1, 3 * MINUTE).await;
    fill(&ns, "big", &["big-0"], BIG_DATABASE_MIB).await;
    let dir = scratch("etcd-bench", "big");
    let (etcdctl_save, file) = etcdctl_snapshot(&ns, "big", "big-0", version, &dir).await;

    let t = Instant::now();
    back_up(&ns, "snap", "big").await;
    let backup = t.elapsed().as_secs_f64();

    let etcdutl_restore = etcdutl_restore_and_start(&file, version, &dir).await;
    let t = Instant::now();
    ns.apply(&restore_manifest("copy", 1, version, "snap"));
    wait_cluster_ready(&ns, "copy", 1, 5 * MINUTE).await;
    let restore = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    (backup, etcdctl_save, restore, etcdutl_restore)
}

/// The operator's memory with no cluster and with many, and its API requests over an idle
/// minute with many: (those beyond the leader lease's renewals, the renewals), by its own count
/// (`noops_api_requests_total`). What they were is printed to standard error.
async fn many_clusters(binary: &Path, version: &str) -> (f64, f64, f64, f64) {
    let ns = TestNamespace::new("etcd-bench-many").await;
    let operator = Operator::start_binary(binary, &ns.name, &["--controllers", "etcd"], &kubeconfig());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_none = rss_mib(operator.pid());
    for i in 0..MANY_CLUSTERS {
        ns.apply(&cluster_manifest(&format!("c{i:02}"), 1, version, ""));
    }
    for i in 0..MANY_CLUSTERS {
        wait_cluster_ready(&ns, &format!("c{i:02}"), 1, 5 * MINUTE).await;
    }
    // Settled: every status written, nothing in progress.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let rss_many = rss_mib(operator.pid());
    let (beyond, lease) = operator.idle_requests(MINUTE).await;
    for (what, count) in &beyond {
        eprintln!("idle minute, {MANY_CLUSTERS} clusters: {count} {what}");
    }
    (
        rss_none,
        rss_many,
        beyond.iter().map(|(_, c)| c).sum::<f64>() + 0.0,
        lease,
    )
}
