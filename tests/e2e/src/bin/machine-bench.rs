//! Machine benchmark on the local Kubernetes (`make bench` runs it), each figure beside what
//! bounds it in the same run:
//! - a MachineDeployment of 3 applied → each machine's Node Ready, beside its VM pod applied →
//!   Running (what this cluster alone takes to start the pod) and beside a node agent of this
//!   cluster started by hand (`hack/node.sh start`) → its Node Ready;
//! - a rolling replacement of those 3 machines (a new flavor), beside its critical path: each
//!   new machine made → Ready, one after another (surge 1, unavailable 0 makes the next one only
//!   once the last is Ready; the old machines' drains and deletions overlap with it), and beside
//!   Cluster API's Docker provider's e2e budget for a MachineDeployment upgrade (10 minutes);
//! - a management node holding a machine stopped → a replacement machine Ready, beside what any
//!   repair waits for (the tenant's node monitor grace period, `unhealthyTimeoutSeconds`) plus
//!   a machine made;
//! - the memory of one machine (its node agent and kube-proxy), beside a node agent and the
//!   kube-proxy of this cluster.
//!
//! Usage: machine-bench <noops binary> [runs]; prints a Markdown table.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kube::api::ListParams;
use noops_api::{Machine, MachineDeployment};
use noops_e2e::bench::{median, row, rss_mib};
use noops_e2e::tenant::{ForgetMachines, Tenant, machine_on, wait_machines_gone};
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);
/// Cluster API's Docker provider e2e budgets: workers up in 5 minutes, a MachineDeployment
/// upgraded in 10.
const CAPD_WORKERS: f64 = 300.0;
const CAPD_UPGRADE: f64 = 600.0;

fn pool(cpu: i32) -> String {
    format!(
        "apiVersion: noops.dev/v1alpha1\nkind: MachineDeployment\nmetadata: {{ name: pool }}\nspec:\n  clusterName: c\n  replicas: 3\n  selector: {{ matchLabels: {{ pool: p }} }}\n  template:\n    metadata: {{ labels: {{ pool: p }} }}\n    spec: {{ version: \"1.34\", flavor: {{ cpu: {cpu} }} }}\n"
    )
}

fn ready(m: &Machine) -> bool {
    m.status
        .as_ref()
        .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The pids of processes whose command line contains `marker`.
fn pids_with(marker: &str) -> Vec<u32> {
    let mut out = vec![];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).replace('\0', " ").contains(marker)
        {
            out.push(pid);
        }
    }
    out
}

/// What one run measured.
struct Run {
    /// Per machine: applied → Node Ready, applied → VM pod Running (s).
    joined: Vec<f64>,
    vm_running: Vec<f64>,
    /// The rolling replacement (s), and its critical path (s).
    rolled: f64,
    rolled_waits: f64,
    /// Per machine: its node agent and kube-proxy (MiB); a node agent and kube-proxy of this
    /// cluster (MiB).
    machine_mib: Vec<f64>,
    node_agent_mib: f64,
}

async fn run(binary: &std::path::Path) -> Run {
    let ns = TestNamespace::new("machine-bench").await;
    let _forget = ForgetMachines(ns.name.clone());
    let operator = Operator::start_binary(binary, &ns.name, &[], &kubeconfig());
    ns.apply("apiVersion: noops.dev/v1alpha1\nkind: KubernetesControlPlane\nmetadata: { name: c }\nspec: { version: \"1.34\", replicas: 1, etcd: { replicas: 1 } }\n");
    let _tenant = Tenant::ready(&ns, "c", 4 * MINUTE).await;
    let machines = ns.api::<Machine>();
    let pods = ns.pods();

    // Made: when each machine is first seen Ready, and its VM pod first seen Running.
    let applied = Instant::now();
    ns.apply(&pool(2));
    let (mut joined, mut vm_running) = (BTreeMap::new(), BTreeMap::new());
    while joined.len() < 3 {
        assert!(applied.elapsed() < 4 * MINUTE, "3 machines not Ready within 4 minutes");
        for m in machines.list(&ListParams::default()).await.unwrap().items {
            let name = m.metadata.name.clone().unwrap();
            if ready(&m) {
                joined.entry(name.clone()).or_insert(applied.elapsed().as_secs_f64());
            }
            if let Some(pod) = pods.get_opt(&name).await.unwrap()
                && pod_ready(&pod)
            {
                vm_running.entry(name).or_insert(applied.elapsed().as_secs_f64());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Settled: the machines past their start.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let machine_mib = joined
        .keys()
        .map(|name| {
            pids_with(&format!("--node-name={name} "))
                .into_iter()
                .chain(pids_with(&format!("--hostname-override={name} ")))
                .map(rss_mib)
                .sum()
        })
        .collect();
    let node_agent_mib = pids_with("--node-name noops-node-1 ")
        .into_iter()
        .chain(pids_with("--hostname-override noops-node-1 "))
        .map(rss_mib)
        .sum();

    // Rolled: each new machine made → Ready and each old one deleted → gone, as seen.
    let old: Vec<String> = joined.keys().cloned().collect();
    let started = Instant::now();
    ns.apply(&pool(3));
    let (mut made, mut became_ready, mut deleting, mut gone) =
        (BTreeMap::new(), BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    loop {
        assert!(
            started.elapsed() < 10 * MINUTE,
            "the rollout did not end within 10 minutes"
        );
        let listed = machines.list(&ListParams::default()).await.unwrap().items;
        let now = started.elapsed().as_secs_f64();
        for m in &listed {
            let name = m.metadata.name.clone().unwrap();
            if old.contains(&name) {
                if m.metadata.deletion_timestamp.is_some() {
                    deleting.entry(name).or_insert(now);
                }
            } else {
                made.entry(name.clone()).or_insert(now);
                if ready(m) {
                    became_ready.entry(name).or_insert(now);
                }
            }
        }
        for name in &old {
            if !listed.iter().any(|m| m.metadata.name.as_ref() == Some(name)) {
                gone.entry(name.clone()).or_insert(now);
            }
        }
        if gone.len() == 3 && became_ready.len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rolled = started.elapsed().as_secs_f64();
    let waits: f64 = became_ready.iter().map(|(n, r)| r - made[n]).sum::<f64>();
    let deletions: Vec<f64> = gone
        .iter()
        .map(|(n, g)| g - deleting.get(n).copied().unwrap_or(*g))
        .collect();
    eprintln!("old machines deleted → gone: {deletions:?} s");
    let md = ns.api::<MachineDeployment>();
    md.delete("pool", &Default::default()).await.unwrap();
    wait_machines_gone(&ns, 3 * MINUTE).await;
    drop(operator);
    Run {
        joined: joined.into_values().collect(),
        vm_running: vm_running.into_values().collect(),
        rolled,
        rolled_waits: waits,
        machine_mib,
        node_agent_mib,
    }
}

/// The tenant's node monitor grace period and the health check's unhealthy timeout in the
/// node-loss run: no repair can start before both have passed.
const NODE_MONITOR_GRACE: u64 = 10;
const UNHEALTHY_TIMEOUT: u64 = 15;

/// A management node holding a machine stopped: seconds until a replacement machine is Ready.
async fn replacement_after_node_loss(binary: &std::path::Path) -> f64 {
    let ns = TestNamespace::new("machine-bench-loss").await;
    let _forget = ForgetMachines(ns.name.clone());
    let client = client().await;
    let victim = ready_nodes(&client, 3).await.last().unwrap().clone();
    // The control plane away from the node to stop: only a machine is lost.
    kubectl_ok(&["cordon", &victim], None);
    let operator = Operator::start_binary(binary, &ns.name, &[], &kubeconfig());
    ns.apply(&format!(
        "apiVersion: noops.dev/v1alpha1\nkind: KubernetesControlPlane\nmetadata: {{ name: c }}\nspec:\n  version: \"1.34\"\n  replicas: 1\n  etcd: {{ replicas: 1 }}\n  extraArgs: {{ controllerManager: [\"--node-monitor-grace-period={NODE_MONITOR_GRACE}s\"] }}\n"
    ));
    let _tenant = Tenant::ready(&ns, "c", 4 * MINUTE).await;
    kubectl_ok(&["uncordon", &victim], None);
    ns.apply(&format!(
        "apiVersion: noops.dev/v1alpha1\nkind: MachineDeployment\nmetadata: {{ name: pool }}\nspec:\n  clusterName: c\n  replicas: 3\n  selector: {{ matchLabels: {{ pool: p }} }}\n  template:\n    metadata: {{ labels: {{ pool: p }} }}\n    spec: {{ version: \"1.34\", nodeDrainTimeoutSeconds: 20 }}\n  healthCheck: {{ unhealthyTimeoutSeconds: {UNHEALTHY_TIMEOUT}, maxUnhealthy: 1 }}\n"
    ));
    let machines = ns.api::<Machine>();
    wait_until("3 machines Ready", 4 * MINUTE, || async {
        machines
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|m| ready(m))
            .count()
            == 3
    })
    .await;
    let lost = machine_on(&ns, &victim).await.expect("a machine on each node");
    let stopped = Instant::now();
    node_fault(&["stop", &victim]);
    wait_until("a replacement Ready", 5 * MINUTE, || async {
        let listed = machines.list(&ListParams::default()).await.unwrap().items;
        listed
            .iter()
            .filter(|m| m.metadata.name.as_deref() != Some(lost.as_str()) && ready(m))
            .count()
            == 3
    })
    .await;
    let replaced = stopped.elapsed().as_secs_f64();
    node_fault(&["start", &victim]);
    ns.api::<MachineDeployment>()
        .delete("pool", &Default::default())
        .await
        .unwrap();
    wait_machines_gone(&ns, 3 * MINUTE).await;
    drop(operator);
    replaced
}

/// A stopped node of this cluster, its Node NotReady, started by hand: seconds until its Node is
/// Ready again (the node agent alone, with no VM, operator or tenant in between).
async fn node_agent_started_by_hand(node: &str) -> f64 {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client().await);
    node_fault(&["stop", node]);
    wait_until("the stopped node NotReady", MINUTE, || async {
        nodes
            .get(node)
            .await
            .is_ok_and(|n| node_ready_status(&n).as_deref() != Some("True"))
    })
    .await;
    let started = Instant::now();
    let mut start = std::process::Command::new(root().join("hack/node.sh"))
        .args(["start", node])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the node started by hand Ready", MINUTE, || async {
        nodes
            .get(node)
            .await
            .is_ok_and(|n| node_ready_status(&n).as_deref() == Some("True"))
    })
    .await;
    let ready = started.elapsed().as_secs_f64();
    assert!(start.wait().unwrap().success(), "hack/node.sh start {node}");
    ready
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let binary = PathBuf::from(args.get(1).expect("usage: machine-bench <noops binary> [runs]"));
    let runs: usize = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(3);
    install_crds();
    let (mut joined, mut vm_running, mut rolled, mut waits, mut memory, mut agent) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let last_node = ready_nodes(&client().await, 3).await.last().unwrap().clone();
    let mut by_hand = vec![];
    for _ in 0..runs {
        by_hand.push(node_agent_started_by_hand(&last_node).await);
        let r = run(&binary).await;
        joined.extend(r.joined);
        vm_running.extend(r.vm_running);
        rolled.push(r.rolled);
        waits.push(r.rolled_waits);
        memory.extend(r.machine_mib);
        agent.push(r.node_agent_mib);
    }
    let mut replaced = vec![];
    for _ in 0..runs {
        replaced.push(replacement_after_node_loss(&binary).await);
    }
    println!("| Machines (release operator) | median of {runs} | what bounds it | bound | ratio | runs |");
    println!("|---|---|---|---|---|---|");
    row(
        "MachineDeployment of 3 applied → a machine's Node Ready (s)",
        &joined,
        "its VM pod applied → Running (s)",
        median(vm_running.clone()),
    );
    row(
        "MachineDeployment of 3 applied → a machine's Node Ready (s)",
        &joined,
        "a stopped node of this cluster started by hand → its Node Ready (s)",
        median(by_hand),
    );
    row(
        "MachineDeployment of 3 applied → a machine's Node Ready (s)",
        &joined,
        "CAPD's e2e budget for workers (s)",
        CAPD_WORKERS,
    );
    row(
        "rolling replacement of 3 machines (s)",
        &rolled,
        "its critical path: 3 machines made → Ready in turn (s)",
        median(waits.clone()),
    );
    row(
        "rolling replacement of 3 machines (s)",
        &rolled,
        "CAPD's e2e budget for a MachineDeployment upgrade (s)",
        CAPD_UPGRADE,
    );
    row(
        "management node of a machine stopped → a replacement Ready (s)",
        &replaced,
        "node monitor grace + unhealthyTimeout + a machine made (s)",
        (NODE_MONITOR_GRACE + UNHEALTHY_TIMEOUT) as f64 + median(joined.clone()),
    );
    row(
        "memory of one machine: node agent + kube-proxy (MiB)",
        &memory,
        "a node agent and kube-proxy of this cluster (MiB)",
        median(agent),
    );
}
