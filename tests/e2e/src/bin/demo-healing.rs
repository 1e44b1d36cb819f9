//! The demo's healing part (`make demo`, after the maintenance switch): an EtcdCluster of three
//! members and a PostgreSQL of three instances with synchronous replication, both backed up to
//! an object store, each under a client that writes without pause. The database's primary is
//! moved onto the node that will stop (`kubectl noops promote`, a switchover); then that node,
//! which also holds one etcd member, stops, as a machine that dies. The operator (deploy/, in
//! the cluster) replaces the member and promotes a replica once the primary's lease runs out,
//! without waiting for the node controller; the demo prints what it sees meanwhile, then, the
//! node back, the etcd members spread over three nodes again, and the acknowledged writes that
//! were lost: none for either. It exits non-zero if one was (or the members stay crowded), and
//! leaves namespace `demo-healing` to look at.
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
const PASSWORD: &str = "demo-Pa55";

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
    let etcd_phase = etcd.and_then(|c| c.status?.phase).map_or("?", |p| p.as_str());
    let pg = ns.api::<PostgreSQL>().get("shop").await.ok().and_then(|p| p.status);
    let pg_phase = pg.as_ref().and_then(|s| s.phase).map_or("?", |p| p.as_str());
    let primary = pg.as_ref().and_then(|s| s.current_primary.clone()).unwrap_or_default();
    let instances = pg
        .map(|s| {
            s.members
                .iter()
                .map(|m| {
                    let role = if m.name == primary { " primary" } else { "" };
                    let down = if m.ready { "" } else { " DOWN" };
                    format!("{}@{}{role}{down}", m.name, m.node.as_deref().unwrap_or("?"))
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    format!("etcd {etcd_phase} [{members}]; PostgreSQL {pg_phase} [{instances}]")
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

    log("an EtcdCluster of 3 members and a PostgreSQL of 3 instances, both backed up to the store");
    ns.apply(&etcd::cluster_manifest(
        "main",
        3,
        &etcd::etcd_version("3.5"),
        &etcd::backup_spec(&ns, Some("*/10 * * * *"), 3),
    ));
    // A commit is acknowledged once a replica has it too: a lost node costs none.
    ns.apply(&postgres::manifest(
        "shop",
        PASSWORD,
        &format!(
            "  instances: 3\n  synchronous: {{ number: 1 }}\n  backup:\n    schedule: \"0 * * * *\"\n    s3: {{ endpoint: \"{}\", bucket: backups, credentialsSecret: object-store-credentials }}\n",
            s3::service_url(&ns)
        ),
    ));
    let cluster = etcd::wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
    postgres::wait_ready(&ns, "shop", 3 * MINUTE).await;
    postgres::wait_reason(&ns, "shop", "ReplicasReady", "True", "Streaming").await;
    postgres::wait_condition(&ns, "shop", "BackupSucceeded", "True", 3 * MINUTE).await;
    log("kubectl noops backup etcd/main (the PostgreSQL took its first backup as it started)");
    let out = kubectl_noops(&["backup", "etcd/main", "-n", NAMESPACE]);
    print!("{}", stdout(&out));
    assert!(out.status.success(), "{out:?}");
    println!(
        "{}",
        kubectl_ok(&["get", "etcd,pg,etcdbackups,postgresbackups", "-n", NAMESPACE], None)
    );

    // The primary onto the node that will stop, by a switchover (its instance there is a
    // replica, or the primary already).
    let pods = ns.pods();
    let mut on_victim_instance = None;
    for instance in ["shop-0", "shop-1", "shop-2"] {
        if pods.get(instance).await.is_ok_and(|p| pod_node(&p) == victim) {
            on_victim_instance = Some(instance);
        }
    }
    let moved = on_victim_instance.expect("an instance on every node");
    log(&format!(
        "kubectl noops promote pg/shop {moved} (a switchover: the primary onto {victim})"
    ));
    let out = kubectl_noops(&["promote", "pg/shop", moved, "-n", NAMESPACE]);
    print!("{}", stdout(&out));
    let databases = ns.api::<PostgreSQL>();
    wait_until(&format!("{moved} the primary"), 2 * MINUTE, || async {
        databases
            .get("shop")
            .await
            .ok()
            .and_then(|p| p.status?.current_primary)
            .as_deref()
            == Some(moved)
    })
    .await;
    postgres::wait_reason(&ns, "shop", "ReplicasReady", "True", "Streaming").await;

    log(
        "a client on each: etcd writes a key and reads it back, PostgreSQL commits a row through shop-rw, without pause",
    );
    let names: Vec<String> = etcd::member_names(&cluster).into_iter().collect();
    let endpoints = etcd::member_endpoints(&ns, &names.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let etcd_writer = etcd::Writer::start(etcd::etcd_client(&ns, "main", &endpoints).await);
    let rw = postgres::service_ip(&ns, "shop-rw").await;
    postgres::psql(
        &rw,
        "app",
        PASSWORD,
        "shop",
        "CREATE TABLE items (id bigint PRIMARY KEY)",
    )
    .unwrap();
    let ledger = postgres::Ledger::start(&rw, "app", PASSWORD, "shop", Duration::from_millis(20));
    tokio::time::sleep(Duration::from_secs(10)).await;
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
        "stopping node {victim} (etcd member {}, the PostgreSQL primary {moved})",
        on_victim.join(", "),
    ));
    let _restore = RestoreNodesOnDrop;
    node_fault(&["stop", &victim]);
    let stopped = Instant::now();

    // Healed: etcd Ready with 3 members, none on the stopped node; PostgreSQL Ready with a
    // primary elsewhere.
    let mut last = String::new();
    let deadline = stopped + 6 * MINUTE;
    loop {
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
        let pg_healed = databases.get("shop").await.ok().is_some_and(|p| {
            postgres::condition(&p, "Ready").is_some_and(|c| c.0 == "True")
                && p.status.as_ref().and_then(|s| s.current_primary.as_deref()) != Some(moved)
                && p.status
                    .as_ref()
                    .and_then(|s| s.last_failover.as_ref())
                    .is_some_and(|f| f.from.as_deref() == Some(moved) && f.promoted_at.is_some())
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
    // PostgreSQL: the commits acknowledged that the new primary does not have.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = ledger.stop().await;
    let pg_lost = report.lost_in((&rw, "app", PASSWORD, "shop"), "synchronous");
    let failover = databases
        .get("shop")
        .await
        .unwrap()
        .status
        .unwrap()
        .last_failover
        .unwrap();

    log("kubectl noops status etcd/main");
    print!("{}", stdout(&kubectl_noops(&["status", "etcd/main", "-n", NAMESPACE])));
    log("kubectl noops status pg/shop");
    print!("{}", stdout(&kubectl_noops(&["status", "pg/shop", "-n", NAMESPACE])));

    log(&format!("node {victim} starts again"));
    node_fault(&["start", &victim]);
    ready_nodes(&ns.client, 3).await;

    // The member that replaced the lost one came to share a node: once the node is back, a
    // member is added on it and one of the shared node's goes, so that one node failure can
    // no longer take the quorum.
    log("etcd members spread over the nodes again");
    let clusters: Api<EtcdCluster> = Api::namespaced(ns.client.clone(), NAMESPACE);
    let spread = tokio::time::timeout(Duration::from_secs(180), async {
        loop {
            let status = clusters.get("main").await.ok().and_then(|c| c.status);
            if let Some(status) = status {
                let nodes: std::collections::BTreeSet<_> =
                    status.members.iter().filter_map(|m| m.node.clone()).collect();
                if nodes.len() == 3 && status.members.len() == 3 && status.operation.is_none() {
                    return status.members;
                }
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    })
    .await;
    match &spread {
        Ok(members) => {
            for m in members {
                println!("  {}  on {}", m.name, m.node.as_deref().unwrap_or("?"));
            }
        }
        Err(_) => println!("  they still share a node after 3 minutes (kubectl noops status etcd/main -n {NAMESPACE})"),
    }

    log("acknowledged writes lost");
    println!(
        "  etcd:       {} of {} acknowledged writes lost (bound: 0); {} reads, none stale: {}",
        etcd_lost.len(),
        history.acked_writes(),
        history.reads(),
        stale.is_none()
    );
    println!(
        "  PostgreSQL: {} of {} acknowledged commits lost (bound: 0, synchronous replication); {} promoted {:.1}s after {moved} last renewed its lease; writes waited at most {:.1}s",
        pg_lost.len(),
        report.acked.len(),
        failover.to,
        failover.write_gap_millis.unwrap_or_default() as f64 / 1000.0,
        report.longest_gap.as_secs_f64()
    );
    ns.keep();
    let mut failed = vec![];
    if !etcd_lost.is_empty() {
        failed.push(format!("etcd lost acknowledged writes {etcd_lost:?}"));
    }
    if let Some(stale) = stale {
        failed.push(format!("etcd returned a stale read: {stale}"));
    }
    if !pg_lost.is_empty() {
        failed.push(format!("PostgreSQL lost acknowledged commits {pg_lost:?}"));
    }
    if spread.is_err() {
        failed.push("etcd members still share a node".into());
    }
    if history.acked_writes() < 100 || report.acked.len() < 100 {
        failed.push("too few writes to judge by".into());
    }
    if !failed.is_empty() {
        eprintln!("demo failed: {}", failed.join("; "));
        std::process::exit(1);
    }
}
