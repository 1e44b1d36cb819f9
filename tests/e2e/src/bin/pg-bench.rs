//! PostgreSQL benchmark on the local Kubernetes (`make bench` runs it), each figure beside
//! what the PostgreSQL tools alone take for the same work on this machine, so that the
//! operator's own share shows as a ratio:
//! - apply → Ready, against `initdb` plus a server start;
//! - the pod deleted → serving again, against a fast stop and a start of a server;
//! - the volume lost while a client commits → serving again, and how many seconds of commits
//!   were lost, against `archiveTimeoutSeconds`;
//! - a base backup of a database of at least 200 MB into the object store, against
//!   `pg_basebackup` to a local folder, and its restore into a lost volume → serving again,
//!   against unpacking that local backup and starting a server on it;
//! - the API requests the operator makes in an idle minute with 20 settled, backed-up
//!   databases, beyond its leader lease's renewals (its own count, `noops_api_requests_total`).
//!
//! Usage: pg-bench <noops binary> [runs]; prints a Markdown table.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use noops_api::backup::BackupPhase;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use noops_api::{PostgreSQL, PostgresBackup};
use noops_e2e::bench::row;
use noops_e2e::postgres::*;
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);
const BIN: &str = "/usr/lib/postgresql/15/bin";
/// pgbench's scale for the big database: 15 × 100 000 accounts, about 220 MB.
const BIG_SCALE: &str = "15";
/// The databases of the idle-requests row.
const MANY_DATABASES: usize = 20;

/// Runs a PostgreSQL program as this machine's `postgres` user; panics with its output if it
/// fails.
fn as_postgres(program: &str, args: &[&str]) {
    let out = Command::new("runuser")
        .args(["-u", "postgres", "--", &format!("{BIN}/{program}")])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{program} {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A scratch folder the `postgres` user owns.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("noops-pg-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ok = Command::new("chown")
        .args(["postgres:postgres", &dir.display().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    dir
}

fn port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string()
}

/// Starts a server on `data` (loopback only) and waits until it accepts connections.
fn start(data: &Path, port: &str) {
    let options = format!(
        "-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={}",
        data.display()
    );
    as_postgres(
        "pg_ctl",
        &[
            "-D",
            &data.display().to_string(),
            "-o",
            &options,
            "-w",
            "-t",
            "300",
            "-l",
            &data.join("log").display().to_string(),
            "start",
        ],
    );
}

fn stop(data: &Path) {
    as_postgres(
        "pg_ctl",
        &["-D", &data.display().to_string(), "-m", "fast", "-w", "stop"],
    );
}

/// `initdb` and a start, alone; then a fast stop and a start: the two bounds of the first rows.
fn lone_server() -> (f64, f64) {
    let dir = scratch("lone");
    let data = dir.join("data");
    let port = port();
    let t = Instant::now();
    as_postgres(
        "initdb",
        &[
            "-D",
            &data.display().to_string(),
            "-U",
            "postgres",
            "--auth=peer",
            "--data-checksums",
        ],
    );
    start(&data, &port);
    let create = t.elapsed().as_secs_f64();
    let t = Instant::now();
    stop(&data);
    start(&data, &port);
    let restart = t.elapsed().as_secs_f64();
    stop(&data);
    let _ = std::fs::remove_dir_all(&dir);
    (create, restart)
}

async fn wait_serving(ns: &TestNamespace, name: &str, old: &Option<String>) {
    let pods = ns.pods();
    wait_until(&format!("a new {name}-0 serving"), 10 * MINUTE, || async {
        pods.get_opt(&format!("{name}-0"))
            .await
            .ok()
            .flatten()
            .is_some_and(|p| &p.metadata.uid != old && pod_ready(&p))
    })
    .await;
    wait_ready(ns, name, 5 * MINUTE).await;
}

async fn delete_pod(ns: &TestNamespace, name: &str, with_volume: bool) -> Option<String> {
    let old = ns.pods().get(&format!("{name}-0")).await.unwrap().metadata.uid;
    if with_volume {
        kubectl_ok(
            &[
                "delete",
                "pvc",
                "-n",
                &ns.name,
                &format!("data-{name}-0"),
                "--wait=false",
            ],
            None,
        );
    }
    kubectl_ok(
        &["delete", "pod", "-n", &ns.name, &format!("{name}-0"), "--wait=false"],
        None,
    );
    old
}

/// The seconds between two RFC 3339 times PostgreSQL printed.
fn seconds_between(earlier: &str, later: &str) -> f64 {
    let (a, b): (jiff::Timestamp, jiff::Timestamp) = (earlier.parse().unwrap(), later.parse().unwrap());
    b.duration_since(a).as_secs_f64()
}

/// A database with backups on a node away from the store, a client committing every 20 ms,
/// and its node stopped: how long until it serves on another node, and how many seconds of
/// commits were lost (from the last row kept to the moment the node stopped).
async fn node_stopped(ns: &TestNamespace, nodes: &[String]) -> (f64, f64) {
    let store = ns
        .pods()
        .list(&kube::api::ListParams::default().labels("app.kubernetes.io/name=versitygw"))
        .await
        .unwrap();
    let store_node = pod_node(&store.items[0]);
    let victim = nodes.iter().find(|n| **n != store_node).unwrap().clone();
    let others: Vec<&String> = nodes.iter().filter(|n| **n != victim).collect();
    for node in &others {
        kubectl_ok(&["cordon", node], None);
    }
    ns.apply(&manifest(
        "far",
        "pw",
        &backup_to_bucket(ns, "pg-backups", "").replace("archiveTimeoutSeconds: 1", "archiveTimeoutSeconds: 5"),
    ));
    wait_ready(ns, "far", 5 * MINUTE).await;
    for node in &others {
        kubectl_ok(&["uncordon", node], None);
    }
    wait_condition(ns, "far", "BackupSucceeded", "True", 5 * MINUTE).await;
    let ip = instance_ip(ns, "far").await;
    psql(
        &ip,
        "app",
        "pw",
        "shop",
        "CREATE TABLE items (id bigint PRIMARY KEY, at timestamptz DEFAULT clock_timestamp())",
    )
    .unwrap();
    let writer = Writer::start(&ip, "app", "pw", "shop", 0, Duration::from_millis(20)).await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let old = ns.pods().get("far-0").await.unwrap().metadata.uid;
    let t = Instant::now();
    let stopped_at = jiff::Timestamp::now().to_string();
    node_fault(&["stop", &victim]);
    let acked = writer.stop().await;
    wait_serving(ns, "far", &old).await;
    let serving = t.elapsed().as_secs_f64();
    let ip = instance_ip(ns, "far").await;
    let kept = contiguous_ids(&ip, "app", "pw", "shop");
    let last_kept = psql(
        &ip,
        "app",
        "pw",
        "shop",
        &format!(
            "SELECT to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') FROM items WHERE id = {kept}"
        ),
    )
    .unwrap();
    node_fault(&["start", &victim]);
    ready_nodes(&ns.client, nodes.len()).await;
    println!("node stop: {kept} of {acked} rows kept");
    (serving, seconds_between(&last_kept, &stopped_at).max(0.0))
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let binary = PathBuf::from(args.get(1).expect("usage: pg-bench <noops binary> [runs]"));
    let runs: usize = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(3);
    install_crds();
    let (lone_create, lone_restart) = lone_server();
    let ns = TestNamespace::new("pg-bench").await;
    s3::deploy(&ns);
    s3::create_bucket(&ns, "pg-backups").await;
    // Its pods (the instance manager, the backup pods) run the same build as the operator.
    let image = if binary.components().any(|c| c.as_os_str() == "release") {
        "noops:release"
    } else {
        "noops:dev"
    };
    let operator = Operator::start_binary(
        &binary,
        &ns.name,
        &["--controllers", "postgres,postgresbackup", "--image", image],
        &kubeconfig(),
    );

    // Apply → Ready, and the pod deleted → serving again, on the original's manifest.
    let (mut create, mut restart) = (vec![], vec![]);
    for run in 0..runs {
        let name = format!("db{run}");
        let t = Instant::now();
        ns.apply(&manifest(&name, "pw", ""));
        wait_ready(&ns, &name, 5 * MINUTE).await;
        create.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let old = delete_pod(&ns, &name, false).await;
        wait_serving(&ns, &name, &old).await;
        restart.push(t.elapsed().as_secs_f64());
        kubectl_ok(&["delete", "pg", "-n", &ns.name, &name, "--wait=false"], None);
    }

    // The volume lost while a client commits, with the default archive timeout.
    ns.apply(&manifest(
        "shop",
        "pw",
        &backup_to_bucket(&ns, "pg-backups", "").replace("archiveTimeoutSeconds: 1", "archiveTimeoutSeconds: 5"),
    ));
    wait_ready(&ns, "shop", 5 * MINUTE).await;
    wait_condition(&ns, "shop", "BackupSucceeded", "True", 5 * MINUTE).await;
    let ip = instance_ip(&ns, "shop").await;
    psql(
        &ip,
        "app",
        "pw",
        "shop",
        "CREATE TABLE items (id bigint PRIMARY KEY, at timestamptz DEFAULT clock_timestamp())",
    )
    .unwrap();
    let writer = Writer::start(&ip, "app", "pw", "shop", 0, Duration::from_millis(20)).await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let t = Instant::now();
    // The pods run on this machine: its clock is theirs.
    let lost_at = jiff::Timestamp::now().to_string();
    let old = delete_pod(&ns, "shop", true).await;
    let acked = writer.stop().await;
    wait_serving(&ns, "shop", &old).await;
    let lost_volume = t.elapsed().as_secs_f64();
    let ip = instance_ip(&ns, "shop").await;
    let kept = contiguous_ids(&ip, "app", "pw", "shop");
    // What was lost: the commits from the last row kept to the moment the volume went.
    let last_kept = psql(
        &ip,
        "app",
        "pw",
        "shop",
        &format!(
            "SELECT to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') FROM items WHERE id = {kept}"
        ),
    )
    .unwrap();
    // A clean shutdown (the pod was deleted) archives what it has: nothing may be lost.
    let lost_with_volume = seconds_between(&last_kept, &lost_at).max(0.0);

    // The node dies under the instance and its volume: restored on another node, losing what
    // was not archived yet. The store stays on a node of its own.
    let nodes = ready_nodes(&ns.client, 1).await;
    let node_stop = if nodes.len() >= 3 {
        Some(node_stopped(&ns, &nodes).await)
    } else {
        None
    };

    // A database of 200 MB or more: a base backup, then its restore into a lost volume.
    ns.apply(&manifest("big", "pw", &backup_to_bucket(&ns, "pg-backups", "")));
    wait_ready(&ns, "big", 5 * MINUTE).await;
    wait_condition(&ns, "big", "BackupSucceeded", "True", 5 * MINUTE).await;
    let big_ip = instance_ip(&ns, "big").await;
    let superuser = superuser_password(&ns, "big").await;
    let out = Command::new(format!("{BIN}/pgbench"))
        .args(["-i", "-q", "-s", BIG_SCALE, "-h", &big_ip, "-U", "postgres", "shop"])
        .env("PGPASSWORD", &superuser)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pgbench -i: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let size_mb: f64 = psql(
        &big_ip,
        "postgres",
        &superuser,
        "postgres",
        "SELECT sum(pg_database_size(datname)) / 1e6 FROM pg_database",
    )
    .unwrap()
    .parse()
    .unwrap();
    let t = Instant::now();
    ns.apply("apiVersion: noops.dev/v1alpha1\nkind: PostgresBackup\nmetadata: { name: big-bench }\nspec: { postgresql: big }\n");
    let api = ns.api::<PostgresBackup>();
    wait_until("the big base backup", 10 * MINUTE, || async {
        api.get_opt("big-bench")
            .await
            .ok()
            .flatten()
            .and_then(|b| b.status?.progress.phase)
            == Some(BackupPhase::Succeeded)
    })
    .await;
    let backup = t.elapsed().as_secs_f64();
    let local = scratch("basebackup");
    let t = Instant::now();
    let out = Command::new(format!("{BIN}/pg_basebackup"))
        .args([
            "-h",
            &big_ip,
            "-U",
            "postgres",
            "-D",
            &local.join("b").display().to_string(),
            "-Ft",
            "-X",
            "stream",
            "--checkpoint=fast",
            "--no-password",
        ])
        .env("PGPASSWORD", &superuser)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pg_basebackup: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pg_basebackup = t.elapsed().as_secs_f64();
    let _ = Command::new("chown")
        .args(["-R", "postgres:postgres", &local.display().to_string()])
        .status();
    // Restore alone: unpack the local backup and its WAL, and start a server on it.
    let data = local.join("data");
    let t = Instant::now();
    let untar = |tar: &str, into: &Path| {
        std::fs::create_dir_all(into).unwrap();
        let ok = Command::new("tar")
            .args([
                "-xf",
                &local.join("b").join(tar).display().to_string(),
                "-C",
                &into.display().to_string(),
            ])
            .status()
            .unwrap();
        assert!(ok.success(), "tar -xf {tar}");
    };
    untar("base.tar", &data);
    untar("pg_wal.tar", &data.join("pg_wal"));
    let _ = Command::new("chown")
        .args(["-R", "postgres:postgres", &data.display().to_string()])
        .status();
    let _ = Command::new("chmod")
        .args(["700", &data.display().to_string()])
        .status();
    start(&data, &port());
    let tools_restore = t.elapsed().as_secs_f64();
    stop(&data);
    let _ = std::fs::remove_dir_all(&local);
    let t = Instant::now();
    let old = delete_pod(&ns, "big", true).await;
    wait_serving(&ns, "big", &old).await;
    let restore = t.elapsed().as_secs_f64();
    let restored: PostgreSQL = ns.api::<PostgreSQL>().get("big").await.unwrap();
    assert!(
        restored.status.unwrap().restore.is_some(),
        "the big database was restored"
    );

    // Many settled databases, backed up (so a pass looks at each every minute): the API
    // requests of an idle minute beyond the leader lease's renewals.
    let (idle_beyond, idle_lease) = idle_minute(&ns, &operator).await;

    println!(
        "| PostgreSQL (release operator) | median of {runs} | what the PostgreSQL tools alone take | bound | ratio | runs |"
    );
    println!("|---|---|---|---|---|---|");
    row("apply → Ready (s)", &create, "`initdb` + server start (s)", lone_create);
    row(
        "pod deleted → serving again (s)",
        &restart,
        "fast stop + start of a server (s)",
        lone_restart,
    );
    row(
        "volume lost → serving again, restored (s)",
        &[lost_volume],
        "fast stop + start of a server (s)",
        lone_restart,
    );
    row(
        "commits lost with the volume, pod deleted (s)",
        &[lost_with_volume],
        "`archiveTimeoutSeconds` (s)",
        5.0,
    );
    match node_stop {
        Some((serving, lost)) => {
            row(
                "node stopped → serving elsewhere, restored (s)",
                &[serving],
                "eviction: node grace + toleration (s)",
                20.0,
            );
            row(
                "commits lost with the node (s)",
                &[lost],
                "`archiveTimeoutSeconds` (s)",
                5.0,
            );
        }
        None => println!("| node stopped → serving elsewhere (s) | n/a (needs 3 nodes) | | | | |"),
    }
    row(
        &format!("base backup of {size_mb:.0} MB → Succeeded (s)"),
        &[backup],
        "`pg_basebackup -Ft` to a local folder (s)",
        pg_basebackup,
    );
    row(
        &format!("restore of {size_mb:.0} MB into a lost volume → serving (s)"),
        &[restore],
        "untar that backup + server start (s)",
        tools_restore,
    );
    row(
        &format!("operator API requests per idle minute beyond lease renewals, {MANY_DATABASES} backed-up databases"),
        &[idle_beyond],
        "lease renewals that minute",
        idle_lease,
    );
    println!();
    println!("{kept} of {acked} rows kept when the volume was lost; the client committed one every 20 ms.");
}

/// Makes [`MANY_DATABASES`] databases backed up to the bucket, waits until each is Ready with a
/// first backup, then counts the operator's API requests over an idle minute: (those beyond
/// the lease renewals, the renewals). What they were is printed to standard error.
async fn idle_minute(ns: &TestNamespace, operator: &Operator) -> (f64, f64) {
    // The databases of the rows above had writes a moment ago: their archived WAL moves on
    // (a real change of their status) and is not what this row measures. They go first.
    kubectl_ok(
        &["delete", "pg", "--all", "-n", &ns.name, "--wait=true", "--timeout=300s"],
        None,
    );
    let names: Vec<String> = (0..MANY_DATABASES).map(|i| format!("idle{i:02}")).collect();
    for name in &names {
        ns.apply(&manifest(name, "pw", &backup_to_bucket(ns, "pg-backups", "")));
    }
    for name in &names {
        wait_ready(ns, name, 10 * MINUTE).await;
        wait_condition(ns, name, "BackupSucceeded", "True", 10 * MINUTE).await;
    }
    // Settled: every status written, every first backup recorded.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let (beyond, lease) = operator.idle_requests(MINUTE).await;
    for (what, count) in &beyond {
        eprintln!("idle minute, {MANY_DATABASES} databases: {count} {what}");
    }
    for name in &names {
        kubectl_ok(&["delete", "pg", "-n", &ns.name, name, "--wait=false"], None);
    }
    (beyond.iter().map(|(_, c)| c).sum::<f64>() + 0.0, lease)
}
