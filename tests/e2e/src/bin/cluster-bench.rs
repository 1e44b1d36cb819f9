//! KubernetesCluster benchmark on the local Kubernetes (`make bench` runs it), each figure beside
//! what bounds it in the same run:
//! - one manifest (1 API server, 1 etcd member, a pool of 3 to 4 machines) applied → every Node
//!   Ready, beside its critical path: the control plane applied → Ready, then the slowest of its
//!   machines made → Ready;
//! - an upgrade 1.33 → 1.34 of the control plane and the 3 workers, beside its two steps as they
//!   ran: the control plane given the version → Ready on it, and the pool given it → rolled out
//!   (what the cluster adds is the time between them);
//! - a pod with no room (each machine full) → Running on a machine the pool grew for, beside the
//!   autoscaler's grace (5 s) plus a machine made → Ready.
//!
//! Usage: cluster-bench <noops binary> [runs]; prints a Markdown table.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kube::api::ListParams;
use noops_api::{KubernetesCluster, KubernetesControlPlane, Machine, MachineDeployment};
use noops_e2e::bench::{median, row};
use noops_e2e::tenant::{ForgetMachines, Tenant, wait_machines_gone};
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);
/// The autoscaler waits this long before it grows a pool for a pod (autoscale.rs).
const PENDING_GRACE: f64 = 5.0;
const OLD: &str = "1.33.13";
const NEW: &str = "1.34.4";

fn cluster(version: &str) -> String {
    format!(
        "apiVersion: noops.dev/v1alpha1\nkind: KubernetesCluster\nmetadata: {{ name: bench }}\nspec:\n  version: \"{version}\"\n  controlPlane: {{ etcd: {{ replicas: 1 }} }}\n  workers: [{{ name: pool, minReplicas: 3, maxReplicas: 4, scaleDownDelaySeconds: 600 }}]\n"
    )
}

fn ready(conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> bool {
    conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The cluster Ready with every part at `version`.
async fn cluster_at(ns: &TestNamespace, version: &str) -> bool {
    let Ok(kc) = ns.api::<KubernetesCluster>().get("bench").await else {
        return false;
    };
    kc.status.is_some_and(|s| {
        ready(&s.conditions) && s.version.as_deref() == Some(version) && s.nodes.as_deref() == Some("3/3")
    })
}

/// What one run measured (s).
struct Run {
    made: f64,
    made_path: f64,
    machine_joins: Vec<f64>,
    upgraded: f64,
    upgrade_steps: f64,
    pod_running: f64,
}

async fn run(binary: &std::path::Path) -> Run {
    let ns = TestNamespace::new("cluster-bench").await;
    let _forget = ForgetMachines(ns.name.clone());
    let operator = Operator::start_binary(binary, &ns.name, &[], &kubeconfig());
    let control_planes = ns.api::<KubernetesControlPlane>();
    let machines = ns.api::<Machine>();

    // Made: the control plane Ready, each machine made → Ready, the whole cluster.
    let applied = Instant::now();
    ns.apply(&cluster("1.33"));
    let mut cp_ready = None;
    // Per machine: first seen (made), then how long until first seen Ready.
    let mut seen: std::collections::BTreeMap<String, f64> = Default::default();
    let mut joined: std::collections::BTreeMap<String, f64> = Default::default();
    while !cluster_at(&ns, OLD).await {
        assert!(applied.elapsed() < 6 * MINUTE, "the cluster not Ready within 6 minutes");
        if cp_ready.is_none()
            && let Ok(cp) = control_planes.get("bench").await
            && cp.status.is_some_and(|s| ready(&s.conditions))
        {
            cp_ready = Some(applied.elapsed().as_secs_f64());
        }
        for m in machines.list(&ListParams::default()).await.unwrap().items {
            let name = m.metadata.name.clone().unwrap();
            let now = applied.elapsed().as_secs_f64();
            let made = *seen.entry(name.clone()).or_insert(now);
            if m.status.is_some_and(|s| ready(&s.conditions)) && !joined.contains_key(&name) {
                joined.insert(name, now - made);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let made = applied.elapsed().as_secs_f64();
    let slowest = joined.values().copied().fold(0.0, f64::max);
    let made_path = cp_ready.unwrap_or(made) + slowest;

    // Upgraded: when the control plane and the pool are given the version, when each is done.
    let deployments = ns.api::<MachineDeployment>();
    let started = Instant::now();
    ns.apply(&cluster("1.34"));
    let (mut cp_given, mut cp_done, mut pool_given) = (None, None, None);
    while !cluster_at(&ns, NEW).await {
        assert!(
            started.elapsed() < 10 * MINUTE,
            "the upgrade did not end within 10 minutes"
        );
        let now = started.elapsed().as_secs_f64();
        if let Ok(cp) = control_planes.get("bench").await {
            if cp.spec.version == NEW {
                cp_given.get_or_insert(now);
            }
            if cp
                .status
                .is_some_and(|s| s.version.as_deref() == Some(NEW) && s.upgrade.is_none() && ready(&s.conditions))
            {
                cp_done.get_or_insert(now);
            }
        }
        if let Ok(md) = deployments.get("bench-pool").await
            && md.spec.template.spec.version == NEW
        {
            pool_given.get_or_insert(now);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let upgraded = started.elapsed().as_secs_f64();
    let steps = (cp_done.unwrap_or(upgraded) - cp_given.unwrap_or(0.0)) + (upgraded - pool_given.unwrap_or(upgraded));

    // A pod with no room: each of the 3 machines holds a pod of 1.5 of its 2 CPUs, a fourth waits
    // (once the rollout's old machines are gone: only 3 Nodes).
    let tenant = Tenant::ready(&ns, "bench", MINUTE).await;
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(tenant.client.clone());
    let node_names = || async {
        nodes
            .list(&ListParams::default())
            .await
            .map(|l| l.items.into_iter().filter_map(|n| n.metadata.name).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    wait_until("only the 3 new machines' Nodes", 2 * MINUTE, || async {
        node_names().await.len() == 3
    })
    .await;
    let before = node_names().await;
    let echo = root().join("target/debug/http-echo");
    let pod = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{ name: {name}, namespace: default }}\nspec:\n  containers:\n  - {{ name: echo, image: busybox, command: [\"{}\", \"-listen=:8080\", \"-text=x\"], resources: {{ requests: {{ cpu: 1500m }} }} }}\n",
            echo.display()
        )
    };
    for name in ["full-1", "full-2", "full-3"] {
        tenant.apply(&pod(name));
    }
    tenant.kubectl_ok(
        &[
            "wait",
            "--for=condition=Ready",
            "pod/full-1",
            "pod/full-2",
            "pod/full-3",
            "--timeout=120s",
        ],
        None,
    );
    let asked = Instant::now();
    tenant.apply(&pod("waiting"));
    tenant.kubectl_ok(
        &["wait", "--for=condition=Ready", "pod/waiting", "--timeout=240s"],
        None,
    );
    let pod_running = asked.elapsed().as_secs_f64();
    let placed = tenant.kubectl_ok(&["get", "pod", "waiting", "-o", "jsonpath={.spec.nodeName}"], None);
    assert!(
        !before.contains(&placed),
        "the pod ran on {placed}, a machine that was there before: it had room"
    );

    ns.api::<KubernetesCluster>()
        .delete("bench", &Default::default())
        .await
        .unwrap();
    wait_machines_gone(&ns, 3 * MINUTE).await;
    drop(operator);
    Run {
        made,
        made_path,
        machine_joins: joined.into_values().collect(),
        upgraded,
        upgrade_steps: steps,
        pod_running,
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let binary = PathBuf::from(args.get(1).expect("usage: cluster-bench <noops binary> [runs]"));
    let runs: usize = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(3);
    install_crds();
    let (mut made, mut made_path, mut joins, mut upgraded, mut steps, mut pods) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..runs {
        let r = run(&binary).await;
        made.push(r.made);
        made_path.push(r.made_path);
        joins.extend(r.machine_joins);
        upgraded.push(r.upgraded);
        steps.push(r.upgrade_steps);
        pods.push(r.pod_running);
    }
    println!("| KubernetesCluster (release operator) | median of {runs} | what bounds it | bound | ratio | runs |");
    println!("|---|---|---|---|---|---|");
    row(
        "one manifest (control plane, 3 workers) → every Node Ready (s)",
        &made,
        "the control plane applied → Ready, then its slowest machine made → Ready (s)",
        median(made_path),
    );
    row(
        "upgrade 1.33 → 1.34: the control plane, then 3 workers (s)",
        &upgraded,
        "its steps as they ran: the control plane's upgrade + the pool's rollout (s)",
        median(steps),
    );
    row(
        "a pod with no room → Running on a machine the pool grew for (s)",
        &pods,
        "the autoscaler's 5 s grace + a machine made → Ready (s)",
        PENDING_GRACE + median(joins),
    );
}
