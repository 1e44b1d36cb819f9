//! The demo's healing part (`make demo`, after the maintenance switch): an EtcdCluster of three
//! members and a PostgreSQL, both backed up to an object store, each under a client that
//! writes without pause. Then the node that holds the database and one etcd member stops, as
//! a machine that dies. The operator (deploy/, in the cluster) replaces the member and brings
//! the database back on another node from its backups; the demo prints what it sees meanwhile,
//! then the acknowledged writes that were lost: none for etcd; for PostgreSQL, only writes of
//! the last seconds before the stop, as `archiveTimeoutSeconds` bounds them. It exits non-zero
//! if a write is lost beyond that bound, and leaves namespace `demo-healing` to look at.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use noops_api::{EtcdCluster, PostgreSQL};
use noops_e2e::plugin::{kubectl_noops, stdout};
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);
const NAMESPACE: &str = "demo-healing";
/// PostgreSQL's `archive_timeout`: what a lost node may cost it.
const ARCHIVE_TIMEOUT_SECONDS: u64 = 5;
/// Beyond the archive timeout: the upload of the last segment on a busy machine.
const ARCHIVE_SLACK: Duration = Duration::from_secs(5);

fn log(what: &str) {
    println!("{} {what}", jiff::Zoned::now().strftime("%H:%M:%S"));
}

/// The node of the pod the operator's leader runs in (its Lease names the pod).
async fn operator_leader_node(client: &kube::Client) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), "noops-system")
        .get("noops-operator")
        .await
        .ok()?;
    let holder = lease.spec?.holder_identity?;
    let pods = Api::<Pod>::namespaced(client.clone(), "noops-system")
        .list(&ListParams::default().labels("app.kubernetes.io/name=noops-operator"))
        .await
        .ok()?;
    pods.items
        .iter()
        .find(|p| p.metadata.name.as_deref().is_some_and(|n| holder.starts_with(n)))
        .map(pod_node)
}

/// One line of what the cluster and the database say, for the progress shown while they heal.
async fn state_line(ns: &TestNamespace) -> String {
    let etcd = ns.api::<EtcdCluster>().get("main").await.ok();
    let members = etcd
        .as_ref()
        .and_then(|c| c.status.as_ref())
        .map(|s| {
            s.members
                .iter()
                .map(|m| {
                    let health = if m.healthy { "" } else { " DOWN" };
                    format!("{}@{}{health}", m.name, m.node.as_deref().unwrap_or("?"))
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    let etcd_phase = etcd.and_then(|c| c.status?.phase).unwrap_or_else(|| "?".into());
    let pg = ns.api::<PostgreSQL>().get("shop").await.ok().and_then(|p| p.status);
    let pg_phase = pg.as_ref().and_then(|s| s.phase.clone()).unwrap_or_else(|| "?".into());
    let pg_node = pg.and_then(|s| s.node).unwrap_or_else(|| "?".into());
    format!("etcd {etcd_phase} [{members}]; PostgreSQL {pg_phase} on {pg_node}")
}

#[tokio::main]
async fn main() {
    let ns = TestNamespace::anew(NAMESPACE).await;
    let nodes = ready_nodes(&ns.client, 3).await;

    log("an object store for the backups (examples/object-store)");
    s3::deploy(&ns);
    s3::create_bucket(&ns, "backups").await;
    let store = ns
        .pods()
        .list(&ListParams::default().labels("app.kubernetes.io/name=versitygw"))
        .await
        .unwrap();
    let store_node = pod_node(&store.items[0]);
    // The node to stop: not the store's (the backups must outlive it), and not the operator
    // leader's if there is a choice (its stand-by would take over, a few seconds later).
    let leader_node = operator_leader_node(&ns.client).await;
    let candidates: Vec<&String> = nodes.iter().filter(|n| **n != store_node).collect();
    let victim = candidates
        .iter()
        .find(|n| Some(n.as_str()) != leader_node.as_deref())
        .or(candidates.first())
        .map(|n| n.to_string())
        .unwrap();
    let others: Vec<&String> = nodes.iter().filter(|n| **n != victim).collect();

    log(&format!(
        "an EtcdCluster of 3 members and a PostgreSQL (on {victim}), both backed up to the store"
    ));
    ns.apply(&etcd::cluster_manifest(
        "main",
        3,
        &etcd::etcd_version("3.5"),
        &etcd::backup_spec(&ns, Some("*/10 * * * *"), 3),
    ));
    // The members spread over the nodes (one each) before any node is cordoned.
    etcd::wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
    // The database starts on the node that will stop: the others are cordoned meanwhile.
    for node in &others {
        kubectl_ok(&["cordon", node], None);
    }
    ns.apply(&postgres::manifest(
        "shop",
        "demo-Pa55",
        &format!(
            "  backup:\n    schedule: \"0 * * * *\"\n    archiveTimeoutSeconds: {ARCHIVE_TIMEOUT_SECONDS}\n    s3: {{ endpoint: \"{}\", bucket: backups, credentialsSecret: object-store-credentials }}\n",
            s3::service_url(&ns)
        ),
    ));
    postgres::wait_ready(&ns, "shop", 3 * MINUTE).await;
    for node in &others {
        kubectl_ok(&["uncordon", node], None);
    }
    let cluster = etcd::wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
    postgres::wait_condition(&ns, "shop", "BackupSucceeded", "True", 3 * MINUTE).await;
    log("kubectl noops backup etcd/main (the PostgreSQL took its first backup as it started)");
    let out = kubectl_noops(&["backup", "etcd/main", "-n", NAMESPACE]);
    print!("{}", stdout(&out));
    assert!(out.status.success(), "{out:?}");
    println!(
        "{}",
        kubectl_ok(&["get", "etcd,pg,etcdbackups,postgresbackups", "-n", NAMESPACE], None)
    );

    log("a client on each: etcd writes a key and reads it back, PostgreSQL commits a row, without pause");
    let names: Vec<String> = etcd::member_names(&cluster).into_iter().collect();
    let endpoints = etcd::member_endpoints(&ns, &names.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let etcd_writer = etcd::Writer::start(etcd::etcd_client(&ns, "main", &endpoints).await);
    let ip = postgres::instance_ip(&ns, "shop").await;
    postgres::make_items(&ip, "demo-Pa55", 0);
    let pg_writer = postgres::Writer::start(&ip, "app", "demo-Pa55", "shop", 0, Duration::from_millis(20)).await;
    // When each PostgreSQL write was acknowledged: what a loss is measured against.
    let mut acked_at: Vec<(Instant, i64)> = Vec::new();
    let sample_until = |until: Instant, acked_at: &mut Vec<(Instant, i64)>, writer: &postgres::Writer| {
        let now = Instant::now();
        if acked_at.last().is_none_or(|(_, id)| *id != writer.acked()) {
            acked_at.push((now, writer.acked()));
        }
        now < until
    };
    let until = Instant::now() + Duration::from_secs(10);
    while sample_until(until, &mut acked_at, &pg_writer) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let on_victim: Vec<String> = ns
        .api::<EtcdCluster>()
        .get("main")
        .await
        .unwrap()
        .status
        .unwrap()
        .members
        .iter()
        .filter(|m| m.node.as_deref() == Some(victim.as_str()))
        .map(|m| m.name.clone())
        .collect();
    assert_eq!(
        on_victim.len(),
        1,
        "the demo stops a node with exactly one etcd member on it: {on_victim:?} run on {victim}"
    );
    log(&format!(
        "stopping node {victim} (etcd member {}, the PostgreSQL instance); {} rows committed so far",
        on_victim.join(", "),
        pg_writer.acked()
    ));
    let _restore = RestoreNodesOnDrop;
    let _ = sample_until(Instant::now(), &mut acked_at, &pg_writer);
    node_fault(&["stop", &victim]);
    // From when the stop is done: a row acknowledged while it ran counts as before it (strict).
    let stopped = Instant::now();

    // Healed: etcd Ready with 3 members, none on the stopped node; PostgreSQL Ready elsewhere.
    let mut last = String::new();
    let deadline = stopped + 6 * MINUTE;
    loop {
        let _ = sample_until(Instant::now() + MINUTE, &mut acked_at, &pg_writer);
        let line = state_line(&ns).await;
        if line != last {
            println!("{:>5.1}s  {line}", stopped.elapsed().as_secs_f64());
            last = line.clone();
        }
        let etcd_healed = ns.api::<EtcdCluster>().get("main").await.ok().is_some_and(|c| {
            etcd::cluster_ready(&c, 3)
                && c.status
                    .as_ref()
                    .is_some_and(|s| s.members.iter().all(|m| m.node.as_deref() != Some(victim.as_str())))
        });
        let pg_healed = ns.api::<PostgreSQL>().get("shop").await.ok().is_some_and(|p| {
            postgres::condition(&p, "Ready").is_some_and(|c| c.0 == "True")
                && p.status.as_ref().and_then(|s| s.node.as_deref()) != Some(victim.as_str())
                && p.status.as_ref().and_then(|s| s.observed_generation) == p.metadata.generation
        });
        if etcd_healed && pg_healed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not healed within 6 minutes: {line} (kubectl get -n {NAMESPACE} etcd,pg,pods -o wide)"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    log(&format!(
        "both healed, {:.0}s after the node stopped",
        stopped.elapsed().as_secs_f64()
    ));

    // What was lost: etcd, none of its acknowledged writes.
    let history = etcd_writer.stop().await;
    let cluster = ns.api::<EtcdCluster>().get("main").await.unwrap();
    let mut checker = etcd::members_client(&ns, "main", &cluster).await;
    let etcd_lost = history.lost_writes(&mut checker).await.unwrap();
    let stale = history.check_reads().err();
    // PostgreSQL: the rows acknowledged before the stop that the database no longer has; each
    // must have been acknowledged within the archive timeout (and slack) before the stop.
    let pg_acked = pg_writer.stop().await;
    let ip = postgres::instance_ip(&ns, "shop").await;
    let pg_kept = postgres::contiguous_ids(&ip, "app", "demo-Pa55", "shop");
    let pg_lost = (pg_acked - pg_kept).max(0);
    let bound = Duration::from_secs(ARCHIVE_TIMEOUT_SECONDS) + ARCHIVE_SLACK;
    let first_lost_at = acked_at.iter().find(|(_, id)| *id > pg_kept).map(|(at, _)| *at);
    let lost_before_stop = first_lost_at.map(|at| stopped.saturating_duration_since(at));
    postgres::psql(
        &ip,
        "app",
        "demo-Pa55",
        "shop",
        &format!("INSERT INTO items VALUES ({})", pg_kept + 1),
    )
    .unwrap();

    log("kubectl noops status etcd/main");
    print!("{}", stdout(&kubectl_noops(&["status", "etcd/main", "-n", NAMESPACE])));
    log("kubectl noops status pg/shop");
    print!("{}", stdout(&kubectl_noops(&["status", "pg/shop", "-n", NAMESPACE])));

    log(&format!("node {victim} starts again"));
    node_fault(&["start", &victim]);
    ready_nodes(&ns.client, 3).await;

    log("acknowledged writes lost");
    println!(
        "  etcd:       {} of {} acknowledged writes lost (bound: 0); {} reads, none stale: {}",
        etcd_lost.len(),
        history.acked_writes(),
        history.reads(),
        stale.is_none()
    );
    let within = lost_before_stop.map_or_else(
        || "none".into(),
        |d| format!("all acknowledged in the last {:.1}s before the stop", d.as_secs_f64()),
    );
    println!(
        "  PostgreSQL: {pg_lost} of {pg_acked} committed rows lost, {within} (bound: archiveTimeoutSeconds {ARCHIVE_TIMEOUT_SECONDS}s + {}s); it takes writes again",
        ARCHIVE_SLACK.as_secs()
    );
    ns.keep();
    let mut failed = vec![];
    if !etcd_lost.is_empty() {
        failed.push(format!("etcd lost acknowledged writes {etcd_lost:?}"));
    }
    if let Some(stale) = stale {
        failed.push(format!("etcd returned a stale read: {stale}"));
    }
    if lost_before_stop.is_some_and(|d| d > bound) {
        failed.push(format!(
            "PostgreSQL lost rows acknowledged more than {}s before the stop",
            bound.as_secs()
        ));
    }
    if history.acked_writes() < 100 || pg_acked < 100 {
        failed.push("too few writes to judge by".into());
    }
    if !failed.is_empty() {
        eprintln!("demo failed: {}", failed.join("; "));
        std::process::exit(1);
    }
}
