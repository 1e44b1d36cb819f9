//! MaintPage benchmark on the local Kubernetes (`make bench` runs it).
//!
//! For N MaintPages (app replicas 0, so the benchmark measures the operator, not pods): the time
//! until all have converged (status written for their generation), p50/p99 latency from create
//! to status, the operator's peak RSS, and the API requests the operator makes in one idle
//! minute, counted from the API server's audit log. The operator runs as its own
//! ServiceAccount so its requests can be told apart in that log.
//!
//! Usage: maintpage-bench <noops binary> <count>... ; prints one Markdown table row per count.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Seek};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use noops_api::MaintPage;
use noops_e2e::bench::peak_rss_mib;
use noops_e2e::*;

const NAMESPACE: &str = "bench-maintpage";
const OPERATOR_USER: &str = "system:serviceaccount:bench-maintpage:noops-bench";

fn manifest(i: usize) -> MaintPage {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "noops.dev/v1alpha1",
        "kind": "MaintPage",
        "metadata": { "name": format!("mp-{i}") },
        "spec": {
            "app": { "name": format!("app-{i}"), "image": "hashicorp/http-echo", "replicas": 0 },
            "maintenance": { "image": "hashicorp/http-echo" },
        },
    }))
    .unwrap()
}

/// A kubeconfig for the operator with a token of its own ServiceAccount, bound to the
/// operator's ClusterRole: requests it makes show up under its own user in the audit log.
async fn operator_kubeconfig(client: &kube::Client) -> std::path::PathBuf {
    for file in ["deploy/00-namespace.yaml", "deploy/10-rbac.yaml"] {
        kubectl_ok(&["apply", "-f", root().join(file).to_str().unwrap()], None);
    }
    let rbac = format!(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{ name: noops-bench, namespace: {NAMESPACE} }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{ name: noops-bench }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: noops-operator }}
subjects: [{{ kind: ServiceAccount, name: noops-bench, namespace: {NAMESPACE} }}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{ name: noops-bench-leases, namespace: {NAMESPACE} }}
rules: [{{ apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, create, update] }}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{ name: noops-bench-leases, namespace: {NAMESPACE} }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: noops-bench-leases }}
subjects: [{{ kind: ServiceAccount, name: noops-bench, namespace: {NAMESPACE} }}]
"#
    );
    kubectl_ok(&["apply", "-f", "-"], Some(&rbac));
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    let request = k8s_openapi::api::authentication::v1::TokenRequest {
        spec: k8s_openapi::api::authentication::v1::TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = sas
        .create_token_request("noops-bench", &PostParams::default(), &request)
        .await
        .unwrap();
    let token = token.status.unwrap().token;
    let admin = std::fs::read_to_string(kubeconfig()).unwrap();
    let ca = admin
        .lines()
        .find_map(|l| l.trim().strip_prefix("certificate-authority-data: "))
        .unwrap()
        .to_string();
    let server = admin
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .unwrap()
        .to_string();
    let path = std::env::temp_dir().join("noops-bench-kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{ name: c, cluster: {{ server: {server}, certificate-authority-data: {ca} }} }}]\nusers: [{{ name: u, user: {{ token: {token} }} }}]\ncontexts: [{{ name: c, context: {{ cluster: c, user: u }} }}]\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    path
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

/// Requests by the operator's user that started in the audit log from `offset` on, by verb.
fn audit_requests(offset: u64) -> BTreeMap<String, usize> {
    let path = root().join(".noops/logs/audit.log");
    let mut file = std::fs::File::open(path).unwrap();
    file.seek(std::io::SeekFrom::Start(offset)).unwrap();
    let mut counts = BTreeMap::new();
    for line in std::io::BufReader::new(file).lines().map_while(Result::ok) {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if event["user"]["username"] != OPERATOR_USER || event["stage"] != "ResponseComplete" {
            continue;
        }
        let verb = event["verb"].as_str().unwrap_or("?");
        let resource = event["objectRef"]["resource"].as_str().unwrap_or("?");
        *counts.entry(format!("{verb} {resource}")).or_insert(0) += 1;
    }
    counts
}

fn audit_size() -> u64 {
    std::fs::metadata(root().join(".noops/logs/audit.log"))
        .map(|m| m.len())
        .unwrap_or(0)
}

async fn run(noops: &str, count: usize, idle: Duration) -> String {
    let client = client().await;
    let _ = kubectl(
        &["delete", "namespace", NAMESPACE, "--wait=true", "--timeout=300s"],
        None,
    );
    kubectl_ok(&["create", "namespace", NAMESPACE], None);
    install_crds();
    let config = operator_kubeconfig(&client).await;
    let log = std::fs::File::create(std::env::temp_dir().join("noops-bench-operator.log")).unwrap();
    let mut operator = std::process::Command::new(noops)
        .args([
            "run",
            "--namespaces",
            NAMESPACE,
            "--leader-election-namespace",
            NAMESPACE,
            "--http-addr",
            "127.0.0.1:0",
        ])
        .env("KUBECONFIG", &config)
        .env("RUST_LOG", "warn")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let pid = operator.id();

    let api: Api<MaintPage> = Api::namespaced(client.clone(), NAMESPACE);
    // Watch for statuses before creating anything, so no first status is missed.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let watch = tokio::spawn({
        let api = api.clone();
        async move {
            let stream = watcher(api, watcher::Config::default()).applied_objects();
            futures::pin_mut!(stream);
            while let Some(Ok(mp)) = stream.next().await {
                let converged = mp
                    .status
                    .as_ref()
                    // Status written for the generation. Nothing is published: with no app
                    // replicas no side is ever Ready, and a new MaintPage publishes only a
                    // Ready side.
                    .is_some_and(|s| s.observed_generation == mp.metadata.generation && !s.conditions.is_empty());
                if converged {
                    let _ = tx.send((mp.metadata.name.clone().unwrap_or_default(), Instant::now()));
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;

    let started = Instant::now();
    let mut created: HashMap<String, Instant> = HashMap::new();
    let results = futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            async move {
                let mp = manifest(i);
                let name = mp.metadata.name.clone().unwrap();
                let at = Instant::now();
                api.create(&PostParams::default(), &mp).await.map(|_| (name, at))
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    for r in results {
        let (name, at) = r.expect("create MaintPage");
        created.insert(name, at);
    }
    // The run's own baseline: how long the API server took just to accept the objects.
    let creating = started.elapsed();
    let mut converged: HashMap<String, Instant> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(1800);
    while converged.len() < count && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
            Ok(Some((name, at))) => {
                converged.entry(name).or_insert(at);
            }
            _ => eprintln!("bench: {} of {count} converged so far", converged.len()),
        }
    }
    let total = started.elapsed();
    let mut latencies: Vec<f64> = converged
        .iter()
        .filter_map(|(name, at)| {
            created
                .get(name)
                .map(|c| at.saturating_duration_since(*c).as_secs_f64())
        })
        .collect();
    latencies.sort_by(|a, b| a.total_cmp(b));

    // Let the dust settle (Deployment and Service status updates), then count an idle minute.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let offset = audit_size();
    tokio::time::sleep(idle).await;
    let idle_requests = audit_requests(offset);
    let rss = peak_rss_mib(pid);
    let _ = operator.kill();
    let _ = operator.wait();
    watch.abort();
    let non_watch: usize = idle_requests
        .iter()
        .filter(|(k, _)| !k.starts_with("watch "))
        .map(|(_, v)| v)
        .sum();
    let leases: usize = idle_requests
        .iter()
        .filter(|(k, _)| k.ends_with(" leases"))
        .map(|(_, v)| v)
        .sum();
    let _ = kubectl(&["delete", "namespace", NAMESPACE, "--wait=false"], None);
    format!(
        "| {count} | {:.1} | {}/{count} | {:.1} | {:.2} | {:.2} | {:.0} | {} ({} of them lease renewals) |",
        creating.as_secs_f64(),
        converged.len(),
        total.as_secs_f64(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        rss,
        non_watch,
        leases
    )
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let noops = args.next().expect("usage: maintpage-bench <noops binary> <count>...");
    let idle = Duration::from_secs(
        std::env::var("BENCH_IDLE_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    );
    println!(
        "| MaintPages | creating them took (s, baseline) | converged | all converged (s) | create→status p50 (s) | p99 (s) | operator peak RSS (MiB) | API requests in {}s idle, besides watches |",
        idle.as_secs()
    );
    println!("|---|---|---|---|---|---|---|---|");
    for count in args.map(|c| c.parse::<usize>().expect("count")) {
        println!("{}", run(&noops, count, idle).await);
    }
}
