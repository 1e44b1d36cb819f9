//! EtcdCluster benchmark on the local Kubernetes (`make bench` runs it): how long the operator
//! takes for what CoreOS's etcd-operator gave itself a budget for in its own end-to-end tests
//! (create 3 members: 60 s; resize: 60 s; recover a member: 60 s; upgrade: 100 s), each as the
//! median of a few runs and as a share of that budget.
//!
//! Usage: etcd-bench <noops binary> [runs]; prints a Markdown table.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use kube::Api;
use kube::api::{Patch, PatchParams};
use noops_api::EtcdCluster;
use noops_e2e::etcd::*;
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let binary = std::path::PathBuf::from(args.get(1).expect("usage: etcd-bench <noops binary> [runs]"));
    let runs: usize = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(3);
    install_crds();
    let (v35, v36) = (etcd_version("3.5"), etcd_version("3.6"));
    let mut create = vec![];
    let mut resize = vec![];
    let mut recover = vec![];
    let mut upgrade = vec![];
    for _ in 0..runs {
        let ns = TestNamespace::new("etcd-bench").await;
        let _operator = Operator::start_binary(&binary, &ns.name, &["--controllers", "etcd"], &kubeconfig());
        let api: Api<EtcdCluster> = ns.api();
        let patch = |spec: serde_json::Value| {
            let api = api.clone();
            async move {
                api.patch(
                    "main",
                    &PatchParams::default(),
                    &Patch::Merge(&serde_json::json!({ "spec": spec })),
                )
                .await
                .unwrap();
            }
        };

        let t = Instant::now();
        ns.apply(&cluster_manifest("main", 3, &v35, ""));
        wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
        create.push(t.elapsed().as_secs_f64());

        let t = Instant::now();
        patch(serde_json::json!({ "replicas": 5 })).await;
        wait_cluster_ready(&ns, "main", 5, 3 * MINUTE).await;
        resize.push(t.elapsed().as_secs_f64());
        patch(serde_json::json!({ "replicas": 3 })).await;
        let three = wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;

        // A member loses its pod and volume: removed, then replaced.
        let status = three.status.unwrap();
        let lost = status.members.iter().find(|m| !m.leader).unwrap().name.clone();
        let t = Instant::now();
        kubectl_ok(
            &["delete", "-n", &ns.name, "pvc", &format!("{lost}-data"), "--wait=false"],
            None,
        );
        kubectl_ok(&["delete", "-n", &ns.name, "pod", &lost, "--wait=false"], None);
        wait_for("the member replaced", 3 * MINUTE, || async {
            api.get("main")
                .await
                .ok()
                .filter(|c| cluster_ready(c, 3) && !c.status.as_ref().unwrap().members.iter().any(|m| m.name == lost))
        })
        .await;
        recover.push(t.elapsed().as_secs_f64());

        let t = Instant::now();
        patch(serde_json::json!({ "version": v36 })).await;
        wait_for("the upgrade", 5 * MINUTE, || async {
            api.get("main").await.ok().filter(|c| {
                cluster_ready(c, 3) && c.status.as_ref().unwrap().current_version.as_deref() == Some(v36.as_str())
            })
        })
        .await;
        upgrade.push(t.elapsed().as_secs_f64());
    }
    println!("| EtcdCluster (release operator) | median of {runs} (s) | share of CoreOS's budget | runs (s) |");
    println!("|---|---|---|---|");
    for (what, budget, times) in [
        ("create 3 members → Ready", 60.0, &create),
        ("resize 3 → 5 → Ready", 60.0, &resize),
        ("replace a member that lost its volume", 60.0, &recover),
        ("upgrade 3 members 3.5 → 3.6", 100.0, &upgrade),
    ] {
        let m = median(times.clone());
        let all: Vec<String> = times.iter().map(|t| format!("{t:.1}")).collect();
        println!("| {what} | {m:.1} | {:.0}% | {} |", m / budget * 100.0, all.join(" "));
    }
}
