//! What only real nodes show (`NODE_KIND=kubelet`: the upstream kubelet with containerd, from
//! images built here): a platform engineer's first commands on a database the operator made —
//! `kubectl exec … psql`, `kubectl noops psql`, `kubectl cp`, `kubectl logs -f`,
//! `kubectl port-forward svc/…` with a psql from this machine, `kubectl noops etcdctl` — and a
//! pod asking for an image that is not built. Ignored in `make e2e` (the node agent has no
//! streaming); `make e2e-real` runs it on real nodes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::api::ListParams;
use noops_e2e::etcd::{cluster_manifest, etcd_version, wait_cluster_ready};
use noops_e2e::plugin::kubectl_noops;
use noops_e2e::postgres::{PSQL, manifest, wait_ready};
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);

/// A kubectl that runs until killed (logs -f, port-forward), with its standard output read
/// line by line.
struct Streaming {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Streaming {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(upstream_bin("kubectl"))
            .arg("--kubeconfig")
            .arg(kubeconfig())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// The first line that contains `text`, within `timeout`.
    fn line_with(&self, text: &str, timeout: Duration) -> Option<String> {
        let deadline = std::time::Instant::now() + timeout;
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(text) => return Some(line),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        None
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
#[ignore = "needs real nodes (NODE_KIND=kubelet): make e2e-real"]
async fn a_platform_engineers_first_commands_work_on_real_nodes() {
    let client = client().await;
    for node in nodes(&client).await {
        let info = node.status.unwrap().node_info.unwrap();
        assert!(
            info.container_runtime_version.starts_with("containerd://"),
            "{} runs {}: start the cluster with NODE_KIND=kubelet",
            node.metadata.name.unwrap_or_default(),
            info.container_runtime_version
        );
        assert_eq!(info.kubelet_version, built_kubernetes_version());
    }
    install_crds();
    let ns = TestNamespace::new("real-nodes").await;
    let _operator = Operator::start(&ns.name, &["--controllers", "postgres,etcd"]);
    ns.apply(&manifest("shop", "pw-real-nodes", ""));
    ns.apply(&cluster_manifest("main", 1, &etcd_version("3.6"), ""));
    wait_ready(&ns, "shop", 3 * MINUTE).await;

    // exec: psql in the instance's pod finds its server, as the superuser over the socket.
    let out = psql_in_pod(&ns, &["-d", "shop", "-tAc", "select 40 + 2"]);
    assert_eq!(out.trim(), "42");
    // The plugin's psql: the primary, on the PostgreSQL's database.
    let out = kubectl_noops(&[
        "-n",
        &ns.name,
        "psql",
        "pg/shop",
        "--",
        "-tAc",
        "select current_database()",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "shop");

    // cp: a file into the pod and back out, the same bytes.
    let dir = tempfile_dir();
    let sent = dir.join("sent.txt");
    std::fs::write(&sent, "copied through the kubelet\n").unwrap();
    let in_pod = format!("{}/shop-0:/tmp/sent.txt", ns.name);
    kubectl_ok(&["cp", "-c", "postgres", sent.to_str().unwrap(), &in_pod], None);
    let back = dir.join("back.txt");
    kubectl_ok(&["cp", "-c", "postgres", &in_pod, back.to_str().unwrap()], None);
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "copied through the kubelet\n");

    // logs -f follows: a line the server logs after the follow began arrives.
    let follow = Streaming::start(&["-n", &ns.name, "logs", "-f", "shop-0", "-c", "postgres", "--tail=1"]);
    std::thread::sleep(Duration::from_secs(1));
    psql_in_pod(
        &ns,
        &[
            "-tAc",
            "select pg_catalog.pg_log_backend_memory_contexts(pg_backend_pid())",
        ],
    );
    assert!(
        follow
            .line_with("logging memory contexts", Duration::from_secs(20))
            .is_some(),
        "kubectl logs -f did not show a line logged after it started"
    );
    drop(follow);

    // port-forward to the Service, then psql from this machine through it.
    let port = free_port();
    let forward = Streaming::start(&["-n", &ns.name, "port-forward", "svc/shop", &format!("{port}:5432")]);
    assert!(
        forward.line_with("Forwarding from", Duration::from_secs(20)).is_some(),
        "kubectl port-forward did not start"
    );
    let out = Command::new(PSQL)
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "app",
            "-d",
            "shop",
            "-tAc",
            "select 'through the forward'",
        ])
        .env("PGPASSWORD", "pw-real-nodes")
        .env("PGCONNECT_TIMEOUT", "5")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "through the forward",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(forward);

    // etcdctl through the plugin, with the cluster's client certificate.
    wait_cluster_ready(&ns, "main", 1, 3 * MINUTE).await;
    let put = kubectl_noops(&["-n", &ns.name, "etcdctl", "etcd/main", "--", "put", "greeting", "hello"]);
    assert!(put.status.success(), "{}", String::from_utf8_lossy(&put.stderr));
    assert_eq!(String::from_utf8_lossy(&put.stdout).trim(), "OK");
    let get = kubectl_noops(&[
        "-n",
        &ns.name,
        "etcdctl",
        "etcd/main",
        "--",
        "get",
        "greeting",
        "--print-value-only",
    ]);
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "hello");
    let failed = kubectl_noops(&["-n", &ns.name, "etcdctl", "etcd/main", "--", "no-such-command"]);
    assert!(!failed.status.success(), "etcdctl's failure is the plugin's exit code");

    // An image that is not built: ErrImagePull, saying what is.
    ns.apply("apiVersion: v1\nkind: Pod\nmetadata: { name: newer }\nspec:\n  containers: [{ name: db, image: \"postgres:16\" }]\n");
    let events: kube::Api<Event> = ns.api();
    let message = wait_for("a failed pull of postgres:16", MINUTE, || async {
        events
            .list(&ListParams::default().fields("involvedObject.name=newer,reason=Failed"))
            .await
            .ok()?
            .items
            .into_iter()
            .filter_map(|e| e.message)
            .find(|m| m.contains("postgres:16"))
    })
    .await;
    assert!(message.contains("only images built"), "{message}");
    assert!(
        message.contains("postgres:15"),
        "the message names what is built: {message}"
    );
}

/// `kubectl exec shop-0 -c postgres -- psql <args>`: its output.
fn psql_in_pod(ns: &TestNamespace, args: &[&str]) -> String {
    let mut command = vec!["-n", &ns.name, "exec", "shop-0", "-c", "postgres", "--", "psql"];
    command.extend_from_slice(args);
    kubectl_ok(&command, None)
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("noops-real-nodes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
