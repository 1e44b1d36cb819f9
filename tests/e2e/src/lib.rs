//! Helpers for end-to-end tests against the running local Kubernetes (`make cluster-up`).
//!
//! Each test works in its own namespace, which is deleted when the test's [`TestNamespace`] is
//! dropped (also when the test fails). Manifests are applied with the real `kubectl`, objects are
//! read back with kube-rs, and waits poll with a deadline so a failure says what was awaited.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::PostParams;
use kube::{Api, Client};

pub mod bench;
pub mod certificates;
pub mod chaos;
pub mod chart;
pub mod clusters;
pub mod deletions;
pub mod etcd;
pub mod frozen;
pub mod plugin;
pub mod postgres;
pub mod s3;
pub mod tenant;
pub mod traffic;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// Whether the local Kubernetes runs real nodes (the kubelet with containerd, `NODE_KIND=kubelet`)
/// rather than the node agent: a pod there runs only what its image holds, not this machine's
/// programs.
pub fn on_real_nodes() -> bool {
    std::fs::read_to_string(root().join(".noops/cluster/run/node-kind")).is_ok_and(|kind| kind.trim() == "kubelet")
}

/// The admin kubeconfig of the local Kubernetes.
pub fn kubeconfig() -> PathBuf {
    root().join(".noops/kubeconfig")
}

/// A built upstream binary, e.g. `kubectl` or `etcd-3.5/etcdctl`.
pub fn upstream_bin(name: &str) -> PathBuf {
    root().join(".noops/bin").join(name)
}

/// The client configuration of the local Kubernetes (its admin kubeconfig).
pub async fn config() -> kube::Config {
    // Two TLS backends are linked (kube's ring, object_store's aws-lc-rs): choose one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config =
        kube::config::Kubeconfig::read_from(kubeconfig()).expect("no .noops/kubeconfig: run `make cluster-up` first");
    kube::Config::from_custom_kubeconfig(config, &Default::default())
        .await
        .expect("kubeconfig")
}

/// A kube client for the local Kubernetes.
pub async fn client() -> Client {
    Client::try_from(config().await).expect("client")
}

/// A kube client for the local Kubernetes that does not retry a 429 (kube's default does, for
/// minutes): an eviction a budget refuses answers 429, and a test wants that answer.
pub async fn client_without_retries() -> Client {
    let mut config = config().await;
    config.default_retry = false;
    Client::try_from(config).expect("client")
}

/// Runs kubectl with the admin kubeconfig; `stdin` is piped in if given.
pub fn kubectl(args: &[&str], stdin: Option<&str>) -> Output {
    kubectl_with(&kubeconfig(), args, stdin)
}

/// Runs kubectl with `kubeconfig` (a tenant's, say).
pub fn kubectl_with(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(upstream_bin("kubectl"));
    cmd.arg("--kubeconfig").arg(kubeconfig).args(args);
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("kubectl");
    if let Some(input) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    child.wait_with_output().expect("kubectl output")
}

/// Runs kubectl and panics with its stderr if it fails; returns stdout.
pub fn kubectl_ok(args: &[&str], stdin: Option<&str>) -> String {
    let out = kubectl(args, stdin);
    assert!(
        out.status.success(),
        "kubectl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl apply` of `yaml` in `ns`: the error it printed, or None if it was accepted.
pub fn apply_error(ns: &TestNamespace, yaml: &str) -> Option<String> {
    let out = kubectl(&["apply", "-n", &ns.name, "-f", "-"], Some(yaml));
    (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).to_string())
}

/// The zone this test process keeps its pods and node faults in (`NOOPS_E2E_ZONE`: hack/e2e.sh
/// runs node faults in one zone of the cluster while other tests run in another), or none:
/// every node is the test's.
pub fn zone() -> Option<String> {
    std::env::var("NOOPS_E2E_ZONE").ok().filter(|z| !z.is_empty())
}

/// The label a node's zone is in (hack/cluster-up.sh's NODE_ZONES).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Namespace `name` as the tests make it: in the test process's [`zone`], its pods go only to
/// that zone's nodes (the API server's PodNodeSelector admission plugin adds the selector).
pub fn namespace_object(name: &str) -> serde_json::Value {
    let mut namespace = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": { "name": name },
    });
    if let Some(zone) = zone() {
        namespace["metadata"]["annotations"] = serde_json::json!({
            "scheduler.alpha.kubernetes.io/node-selector": format!("{ZONE_LABEL}={zone}"),
        });
    }
    namespace
}

/// A namespace for one test, deleted on drop.
pub struct TestNamespace {
    pub name: String,
    pub client: Client,
}

impl TestNamespace {
    /// Creates `e2e-<prefix>-<suffix>`.
    pub async fn new(prefix: &str) -> Self {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let unique = nanos ^ (std::process::id() << 12) ^ COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self::create(client().await, format!("e2e-{prefix}-{unique:08x}")).await
    }

    /// Namespace `name` made anew, for a demo: one left by an earlier run is deleted first.
    /// [`TestNamespace::keep`] leaves it for the user to look at.
    pub async fn anew(name: &str) -> Self {
        kubectl_ok(
            &["delete", "namespace", name, "--ignore-not-found", "--timeout=300s"],
            None,
        );
        Self::create(client().await, name.to_string()).await
    }

    /// Leaves the namespace in place when dropped.
    pub fn keep(self) {
        std::mem::forget(self);
    }

    async fn create(client: Client, name: String) -> Self {
        let ns: Namespace = serde_json::from_value(namespace_object(&name)).unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("create namespace");
        // The ServiceAccount controller adds `default` shortly after; pods need it.
        let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), &name);
        wait_until(
            &format!("default ServiceAccount in {name}"),
            Duration::from_secs(30),
            || async { sa.get_opt("default").await.ok().flatten().is_some() },
        )
        .await;
        Self { name, client }
    }

    /// Applies a multi-document YAML manifest in this namespace.
    pub fn apply(&self, yaml: &str) {
        kubectl_ok(&["apply", "-n", &self.name, "-f", "-"], Some(yaml));
    }

    /// Merges `spec` into the spec of `resource` (`<kind>/<name>`), as `kubectl patch` does.
    pub fn merge_spec(&self, resource: &str, spec: serde_json::Value) {
        let patch = serde_json::json!({ "spec": spec }).to_string();
        kubectl_ok(
            &["patch", resource, "-n", &self.name, "--type", "merge", "-p", &patch],
            None,
        );
    }

    /// Pods of this namespace.
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Typed API for a namespaced kind in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Waits until pod `name` has condition Ready=True.
    pub async fn wait_pod_ready(&self, name: &str, timeout: Duration) -> Pod {
        let pods = self.pods();
        wait_for(&format!("pod {}/{name} Ready", self.name), timeout, || async {
            pods.get_opt(name).await.ok().flatten().filter(pod_ready)
        })
        .await
    }
}

impl TestNamespace {
    /// Every pod's log, whole, in `.noops/e2e-logs/<namespace>/`: the story of a failure is
    /// often told by an instance or a member, and goes with the namespace.
    fn keep_pod_logs(&self) {
        let dir = root().join(".noops/e2e-logs").join(&self.name);
        let listed = kubectl(&["get", "pods", "-n", &self.name, "-o", "name"], None);
        let pods = String::from_utf8_lossy(&listed.stdout).to_string();
        if pods.trim().is_empty() || std::fs::create_dir_all(&dir).is_err() {
            return;
        }
        for pod in pods.lines().take(40) {
            let log = kubectl(
                &[
                    "logs",
                    "-n",
                    &self.name,
                    pod,
                    "--all-containers",
                    "--prefix",
                    "--timestamps",
                ],
                None,
            );
            let file = dir.join(format!("{}.log", pod.trim_start_matches("pod/")));
            let _ = std::fs::write(file, [log.stdout, log.stderr].concat());
        }
        eprintln!("--- pod logs: {}", dir.display());
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // What CI shows of a failed test is its output: the objects and the last warnings.
            for args in [
                vec!["get", "noops,pods", "-n", &self.name, "-o", "wide"],
                vec![
                    "get",
                    "events",
                    "-n",
                    &self.name,
                    "--field-selector=type=Warning",
                    "--sort-by=.lastTimestamp",
                ],
            ] {
                let text = String::from_utf8_lossy(&kubectl(&args, None).stdout).to_string();
                let lines: Vec<&str> = text.lines().collect();
                eprintln!("--- kubectl {}:", args.join(" "));
                for line in &lines[lines.len().saturating_sub(30)..] {
                    eprintln!("{line}");
                }
            }
            self.keep_pod_logs();
        }
        let _ = kubectl(&["delete", "namespace", &self.name, "--wait=false"], None);
    }
}

/// Whether the pod has Ready=True.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The reasons of the Events about `kind` `name`.
pub async fn event_reasons(ns: &TestNamespace, kind: &str, name: &str) -> Vec<String> {
    let events = ns
        .api::<k8s_openapi::api::core::v1::Event>()
        .list(&Default::default())
        .await
        .unwrap();
    events
        .items
        .into_iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some(kind) && e.involved_object.name.as_deref() == Some(name))
        .filter_map(|e| e.reason)
        .collect()
}

/// Waits for an Event `reason` about `kind` `name`: an operator tells its Events once the
/// status that says the same is written, so a moment after it.
pub async fn wait_event(ns: &TestNamespace, kind: &str, name: &str, reason: &str) {
    wait_for(
        &format!("an Event {reason} about {kind} {name}"),
        Duration::from_secs(30),
        || async {
            event_reasons(ns, kind, name)
                .await
                .iter()
                .any(|r| r == reason)
                .then_some(())
        },
    )
    .await;
}

/// Polls `check` every 250 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    let deadline = started + timeout;
    loop {
        if let Some(v) = check().await {
            // Where a test's time goes, in its log (hack/e2e-run.sh keeps every test's output).
            let waited = started.elapsed();
            if waited >= Duration::from_secs(1) {
                eprintln!("{} waited {:.1}s for {what}", clock(), waited.as_secs_f64());
            }
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The time of day (UTC, `HH:MM:SS`), to set a test's lines beside the cluster's logs.
fn clock() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
        % 86_400;
    format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

/// Like [`wait_for`] for a yes/no condition.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_for(what, timeout, || {
        let fut = check();
        async move { fut.await.then_some(()) }
    })
    .await
}

/// A plain HTTP GET to an address on this machine (loopback, or an address of our own
/// namespaces); returns the body, or `None` on any failure.
pub async fn http_get(addr: &str, path: &str) -> Option<String> {
    http_get_within(addr, path, Duration::from_secs(2)).await
}

/// [`http_get`] with its own time limit for connecting and for the answer. Clients that count
/// failed requests use a generous one: on a loaded machine a live pod can take seconds to
/// answer, while a request sent nowhere fails at once (refused) or never answers at all.
pub async fn http_get_within(addr: &str, path: &str, limit: Duration) -> Option<String> {
    http_get_explained(addr, path, limit).await.ok()
}

/// [`http_get_within`], saying what went wrong (a refused or timed-out connection, no answer,
/// another status).
pub async fn http_get_explained(addr: &str, path: &str, limit: Duration) -> Result<String, String> {
    http_get_from_port(addr, path, limit).await.1
}

/// [`http_get_explained`], also telling the local port the request was sent from (when one was
/// taken): what a failed connection is found by in the kernel's connection tracking.
pub async fn http_get_from_port(addr: &str, path: &str, limit: Duration) -> (Option<u16>, Result<String, String>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let target = match tokio::net::lookup_host(addr).await.map(|mut a| a.next()) {
        Ok(Some(target)) => target,
        other => return (None, Err(format!("cannot resolve {addr}: {other:?}"))),
    };
    // Bound before connecting, so that the port is known even when the connection fails.
    let (socket, any_port) = match target {
        std::net::SocketAddr::V4(_) => (
            tokio::net::TcpSocket::new_v4(),
            std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
        ),
        std::net::SocketAddr::V6(_) => (
            tokio::net::TcpSocket::new_v6(),
            std::net::SocketAddr::from(([0u16; 8], 0)),
        ),
    };
    let socket = match socket.and_then(|s| s.bind(any_port).map(|()| s)) {
        Ok(socket) => socket,
        Err(e) => return (None, Err(format!("socket: {e}"))),
    };
    let port = socket.local_addr().ok().map(|a| a.port());
    let exchange = async {
        let mut stream = tokio::time::timeout(limit, socket.connect(target))
            .await
            .map_err(|_| "connect timed out".to_string())?
            .map_err(|e| format!("connect: {e}"))?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("send: {e}"))?;
        let mut response = String::new();
        tokio::time::timeout(limit, stream.read_to_string(&mut response))
            .await
            .map_err(|_| "no answer in time".to_string())?
            .map_err(|e| format!("read: {e}"))?;
        if !response.starts_with("HTTP/1.1 200") {
            return Err(format!("answered {:?}", response.lines().next().unwrap_or_default()));
        }
        response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_string())
            .ok_or_else(|| "no body".to_string())
    };
    (port, exchange.await)
}

/// The Kubernetes version the control plane is built from (`tools/k8s/go.mod`).
pub fn built_kubernetes_version() -> String {
    let gomod = std::fs::read_to_string(root().join("tools/k8s/go.mod")).unwrap();
    gomod
        .lines()
        .find_map(|l| l.strip_prefix("require k8s.io/kubernetes "))
        .map(|v| v.trim().to_string())
        .expect("k8s.io/kubernetes in tools/k8s/go.mod")
}

/// A loopback port free now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The operator of a test, killed when dropped: a `noops run` process outside the cluster
/// (admin kubeconfig), or, on real nodes, the operator installed by the Helm chart from its
/// image (`chart::Deployed`), as a user runs it.
pub struct Operator {
    child: Option<std::process::Child>,
    deployed: Option<chart::Deployed>,
    /// Address of a process's /metrics, /healthz and /readyz (a deployed one's is asked for
    /// each time: its pod changes).
    pub http: String,
    pub log: PathBuf,
}

/// Whether the operators of tests run from the chart: `NOOPS_E2E_OPERATOR=chart` or
/// `process`; by default on real nodes only (the node agent runs the image as this machine's
/// build anyway).
fn from_the_chart() -> bool {
    match std::env::var("NOOPS_E2E_OPERATOR").as_deref() {
        Ok("chart") => true,
        Ok("process") => false,
        _ => on_real_nodes(),
    }
}

/// The controllers `extra` asks for, if the chart can run the operator as `extra` asks
/// (`--controllers` and `--leader-elect=false` only: the chart's operator always elects a
/// leader, which one replica wins at once). `Some(None)`: all controllers.
fn chart_can_run(extra: &[&str]) -> Option<Option<String>> {
    let mut controllers = None;
    let mut args = extra.iter();
    while let Some(arg) = args.next() {
        match *arg {
            "--leader-elect=false" => {}
            "--controllers" => controllers = Some(args.next()?.to_string()),
            other => controllers = Some(other.strip_prefix("--controllers=")?.to_string()),
        }
    }
    Some(controllers)
}

impl Operator {
    /// Starts the operator watching only `namespace`, with its leader Lease there too.
    /// `extra` is appended to `noops run`. From the chart where the tests' operators run from
    /// it and it can run as `extra` asks; a process otherwise.
    pub fn start(namespace: &str, extra: &[&str]) -> Self {
        match chart_can_run(extra).filter(|_| from_the_chart()) {
            Some(controllers) => Self::deployed(namespace, controllers.as_deref()),
            None => Self::start_with_kubeconfig(namespace, extra, &kubeconfig()),
        }
    }

    /// The operator installed by the chart into `namespace` (watching it only), from its image.
    pub fn deployed(namespace: &str, controllers: Option<&str>) -> Self {
        let deployed = chart::Deployed::install(namespace, controllers);
        let log = std::env::temp_dir().join(format!("noops-operator-{namespace}-{}.log", deployed.release));
        Self {
            child: None,
            deployed: Some(deployed),
            http: String::new(),
            log,
        }
    }

    /// Like [`Operator::start`], reaching the API server through `kubeconfig`.
    pub fn start_with_kubeconfig(namespace: &str, extra: &[&str], kubeconfig: &Path) -> Self {
        Self::start_binary(&root().join("target/debug/noops"), namespace, extra, kubeconfig)
    }

    /// Like [`Operator::start`], with extra environment variables.
    pub fn start_with_env(namespace: &str, extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_process(&root().join("target/debug/noops"), namespace, extra, &kubeconfig(), env)
    }

    /// Like [`Operator::start_with_kubeconfig`], running `binary` (a release build, say).
    pub fn start_binary(binary: &Path, namespace: &str, extra: &[&str], kubeconfig: &Path) -> Self {
        Self::start_process(binary, namespace, extra, kubeconfig, &[])
    }

    fn start_process(binary: &Path, namespace: &str, extra: &[&str], kubeconfig: &Path, env: &[(&str, &str)]) -> Self {
        let binary = binary.to_path_buf();
        assert!(binary.exists(), "{} is missing: run `make setup`", binary.display());
        let port = free_port();
        let http = format!("127.0.0.1:{port}");
        let log = std::env::temp_dir().join(format!("noops-operator-{namespace}-{port}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(binary)
            .args([
                "run",
                "--namespaces",
                namespace,
                "--leader-election-namespace",
                namespace,
                "--http-addr",
                &http,
            ])
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,kube_runtime=warn")
            .envs(env.iter().copied())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start noops");
        Self {
            child: Some(child),
            deployed: None,
            http,
            log,
        }
    }

    /// The process id (a process only: a test that signals the operator runs it so).
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .expect("an operator process, not one the chart installed")
            .id()
    }

    /// Kills it at once (SIGKILL, or its pods deleted without grace): no lease release, no
    /// cleanup.
    pub fn kill(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(deployed) = &self.deployed {
            self.save_log();
            deployed.kill();
        }
    }

    /// Whether the process (or a pod of the deployed operator) is still running.
    pub fn running(&mut self) -> bool {
        match (self.child.as_mut(), &self.deployed) {
            (Some(child), _) => matches!(child.try_wait(), Ok(None)),
            (None, Some(deployed)) => deployed.running(),
            (None, None) => false,
        }
    }

    /// Where its /metrics answers now.
    async fn metrics_address(&self) -> Option<String> {
        match &self.deployed {
            Some(deployed) => deployed.wait_http(Duration::from_secs(30)).await,
            None => Some(self.http.clone()),
        }
    }

    /// A deployed operator's pod logs, kept in `log` (read before its pods go).
    fn save_log(&self) {
        // Pods gone (killed before, or by another handle of the same release): the log kept
        // then stays.
        if let Some(logs) = self
            .deployed
            .as_ref()
            .map(chart::Deployed::logs)
            .filter(|l| !l.trim().is_empty())
        {
            let _ = std::fs::write(&self.log, logs);
        }
    }

    /// The current value of a metric line starting with `prefix`, if present.
    pub async fn metric(&self, prefix: &str) -> Option<f64> {
        let text = http_get(&self.metrics_address().await?, "/metrics").await?;
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    /// The API requests the operator has sent so far (`noops_api_requests_total`), by
    /// (verb, resource).
    pub async fn api_requests(&self) -> std::collections::BTreeMap<(String, String), f64> {
        let http = self.metrics_address().await.unwrap_or_default();
        let text = http_get(&http, "/metrics").await.unwrap_or_default();
        text.lines()
            .filter_map(|l| l.strip_prefix("noops_api_requests_total{"))
            .filter_map(|l| {
                let (labels, value) = l.rsplit_once("} ")?;
                let label = |name: &str| {
                    let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
                    Some(labels[start..].split('"').next()?.to_string())
                };
                Some(((label("verb")?, label("resource")?), value.parse().ok()?))
            })
            .collect()
    }

    /// The requests of an idle `minute` (it waits that long): (those beyond the leader lease's
    /// renewals by verb and resource, the renewals).
    pub async fn idle_requests(&self, minute: Duration) -> (Vec<(String, f64)>, f64) {
        let before = self.api_requests().await;
        tokio::time::sleep(minute).await;
        beyond_lease(&before, &self.api_requests().await)
    }

    /// The API requests, beyond the lease's renewals, of `controller`'s passes over `object`
    /// (`kind/name`) when it has nothing to do: an annotation touched three times wakes a pass
    /// each, and what the operator sent meanwhile is counted. A settled object costs none.
    pub async fn requests_of_settled_passes(
        &self,
        ns: &TestNamespace,
        object: &str,
        controller: &str,
    ) -> Vec<(String, f64)> {
        let passes = format!("noops_reconciles_total{{controller=\"{controller}\",result=\"success\"}}");
        let before = self.api_requests().await;
        let passes_before = self.metric(&passes).await.unwrap_or(0.0);
        for touch in 0..3 {
            kubectl_ok(
                &[
                    "annotate",
                    "--overwrite",
                    "-n",
                    &ns.name,
                    object,
                    &format!("noops.dev/test-touch={touch}"),
                ],
                None,
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        wait_until("the passes the touches woke", Duration::from_secs(30), || async {
            self.metric(&passes).await.unwrap_or(0.0) >= passes_before + 2.0
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        beyond_lease(&before, &self.api_requests().await).0
    }

    /// [`Self::requests_of_settled_passes`] on `resources` only (plural names; a subresource
    /// counts as its resource's): what passes over `object` ask of those while the operator's
    /// other controllers go on with their own.
    pub async fn requests_of_settled_passes_on(
        &self,
        ns: &TestNamespace,
        object: &str,
        controller: &str,
        resources: &[&str],
    ) -> Vec<(String, f64)> {
        let on = |request: &str| {
            let resource = request.split(' ').nth(1).unwrap_or_default();
            resources.contains(&resource.split('/').next().unwrap_or_default())
        };
        let requests = self.requests_of_settled_passes(ns, object, controller).await;
        requests.into_iter().filter(|(request, _)| on(request)).collect()
    }

    /// The writes (create, update, patch, delete), beyond the lease's renewals, made while
    /// `controller` passes over each of `objects` (`kind/name`) with nothing to do, as
    /// [`Self::requests_of_settled_passes`] counts them: for an operator whose other
    /// controllers read on their own timers meanwhile, a settled object costs no write. An
    /// EtcdCluster's status is left out: it reports its members' database sizes, which a
    /// tenant's API server changes all the time.
    pub async fn writes_of_settled_passes(
        &self,
        ns: &TestNamespace,
        objects: &[(&str, &str)],
    ) -> Vec<(String, String, f64)> {
        let mut writes = Vec::new();
        for (object, controller) in objects {
            for (request, count) in self.requests_of_settled_passes(ns, object, controller).await {
                let verb = request.split(' ').next().unwrap_or_default();
                let sizes = request.ends_with(" etcdclusters/status");
                if ["create", "update", "patch", "delete", "deletecollection"].contains(&verb) && !sizes {
                    writes.push((object.to_string(), request, count));
                }
            }
        }
        writes
    }

    /// The operator's log so far (for failure messages).
    pub fn log_text(&self) -> String {
        self.save_log();
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let text = self.log_text();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!("--- the operator's last log lines ({}):", self.log.display());
            for line in &lines[lines.len().saturating_sub(40)..] {
                eprintln!("{line}");
            }
        }
        // A deployed operator goes with its release's last handle (`chart::Deployed`'s drop):
        // a test that started it again holds a newer one.
        if self.child.is_some() {
            self.kill();
        } else {
            self.save_log();
        }
    }
}

/// The requests made between two counts: (those beyond the leader lease's renewals, as
/// "verb resource" and how many, the renewals).
fn beyond_lease(
    before: &std::collections::BTreeMap<(String, String), f64>,
    after: &std::collections::BTreeMap<(String, String), f64>,
) -> (Vec<(String, f64)>, f64) {
    let mut beyond = Vec::new();
    let mut lease = 0.0;
    for ((verb, resource), count) in after {
        let made = count - before.get(&(verb.clone(), resource.clone())).copied().unwrap_or(0.0);
        if made <= 0.0 {
            continue;
        }
        if resource == "leases" {
            lease += made;
        } else {
            beyond.push((format!("{verb} {resource}"), made));
        }
    }
    (beyond, lease)
}

/// Installs (or updates) the noops CRDs from `deploy/crds`.
pub fn install_crds() {
    let crds = root().join("deploy/crds");
    kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            crds.to_str().unwrap(),
        ],
        None,
    );
    // A CRD created a moment ago may have no conditions yet, which `kubectl wait` takes for an
    // error rather than a reason to wait: it is asked again.
    let wait = [
        "wait",
        "--for=condition=Established",
        "crd/maintpages.noops.dev",
        "crd/etcdclusters.noops.dev",
        "crd/etcdbackups.noops.dev",
        "crd/postgresqls.noops.dev",
        "crd/postgresbackups.noops.dev",
        "crd/kubernetescontrolplanes.noops.dev",
        "crd/kubernetesclusters.noops.dev",
        "crd/machines.noops.dev",
        "crd/machinesets.noops.dev",
        "crd/machinedeployments.noops.dev",
        "--timeout=30s",
    ];
    for _ in 0..30 {
        if kubectl(&wait, None).status.success() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    kubectl_ok(&wait, None);
}

/// The Nodes of the cluster, by name: in a [`zone`], only that zone's (a tenant cluster's nodes
/// have no zone, and are all listed).
pub async fn nodes(client: &Client) -> Vec<k8s_openapi::api::core::v1::Node> {
    let zone = zone();
    let mut nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("list nodes")
        .items;
    let zone_of = |node: &k8s_openapi::api::core::v1::Node| node.metadata.labels.as_ref()?.get(ZONE_LABEL).cloned();
    // A cluster with zones: only this one's nodes (one left without a zone is no one's).
    if zone.is_some() && nodes.iter().any(|n| zone_of(n).is_some()) {
        nodes.retain(|n| zone_of(n) == zone);
    }
    nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    nodes
}

/// The status of a Node's Ready condition (`True`, `False` or `Unknown`).
pub fn node_ready_status(node: &k8s_openapi::api::core::v1::Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

/// The folder on this machine behind PersistentVolumeClaim `claim` (the local Kubernetes'
/// volumes are local folders); the claim must be bound.
pub async fn claim_folder(ns: &TestNamespace, claim: &str) -> PathBuf {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    let claim = ns.api::<PersistentVolumeClaim>().get(claim).await.unwrap();
    let volume = claim.spec.and_then(|s| s.volume_name).expect("a bound volume");
    let pv = Api::<PersistentVolume>::all(ns.client.clone())
        .get(&volume)
        .await
        .unwrap();
    let path = pv
        .spec
        .and_then(|s| s.host_path)
        .map(|h| h.path)
        .expect("a local-path volume");
    PathBuf::from(path)
}

/// The node a pod is bound to.
pub fn pod_node(pod: &Pod) -> String {
    pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default()
}

/// How often the pod's first container has been restarted.
pub fn restart_count(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map(|c| c.restart_count)
        .unwrap_or(0)
}

/// The pod IP, if it has one.
pub fn pod_ip(pod: &Pod) -> Option<String> {
    pod.status.as_ref()?.pod_ip.clone()
}

/// Runs `hack/node.sh` with `args` (a node fault), panicking with its output if it fails.
pub fn node_fault(args: &[&str]) -> String {
    let out = Command::new(root().join("hack/node.sh"))
        .args(args)
        .output()
        .expect("hack/node.sh");
    assert!(
        out.status.success(),
        "hack/node.sh {} failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until the cluster has at least `count` Ready nodes and returns their names.
pub async fn ready_nodes(client: &Client, count: usize) -> Vec<String> {
    wait_for(
        &format!("{count} Ready nodes (NODES={count} make cluster-up)"),
        Duration::from_secs(60),
        || async {
            let ready: Vec<String> = nodes(client)
                .await
                .iter()
                .filter(|n| node_ready_status(n).as_deref() == Some("True"))
                .filter_map(|n| n.metadata.name.clone())
                .collect();
            (ready.len() >= count).then_some(ready)
        },
    )
    .await
}

/// Undoes every node fault when dropped (`hack/node.sh restore`), also when the test holding it
/// fails: the next test gets every node running, connected and Ready.
pub struct RestoreNodesOnDrop;

impl Drop for RestoreNodesOnDrop {
    fn drop(&mut self) {
        let _ = Command::new(root().join("hack/node.sh")).arg("restore").output();
    }
}

/// The operator with crash points on (`NOOPS_CRASH_POINTS`), started again whenever it has
/// died, until stopped; it can also be killed on request, as an OOM kill would.
pub struct Supervisor {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    kill: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<(usize, String)>,
}

impl Supervisor {
    /// Every controller in one process.
    pub fn start(namespace: &str, crash_points: &Path) -> Self {
        Self::start_args(namespace, crash_points, &[])
    }

    /// Only `controllers` (as `--controllers` takes them): a test that counts one controller's
    /// crash points runs it apart, since another controller's kill can cut its request short
    /// after the server took it and before it recorded the point (which no later pass reaches).
    pub fn start_controllers(namespace: &str, crash_points: &Path, controllers: &str) -> Self {
        Self::start_args(namespace, crash_points, &["--controllers", controllers])
    }

    fn start_args(namespace: &str, crash_points: &Path, args: &[&str]) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let kill = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, kill_now, namespace, file) = (
            stop.clone(),
            kill.clone(),
            namespace.to_string(),
            crash_points.display().to_string(),
        );
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let task = tokio::spawn(async move {
            let begin = |file: &str| {
                let all: Vec<&str> = ["--leader-elect=false"]
                    .into_iter()
                    .chain(args.iter().map(String::as_str))
                    .collect();
                Operator::start_with_env(&namespace, &all, &[("NOOPS_CRASH_POINTS", file)])
            };
            let mut operator = begin(&file);
            let mut starts = 1;
            let mut logs = String::new();
            while !flag.load(Ordering::Relaxed) {
                if kill_now.swap(false, Ordering::Relaxed) {
                    operator.kill();
                }
                if !operator.running() {
                    logs.push_str(&operator.log_text());
                    operator = begin(&file);
                    starts += 1;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            logs.push_str(&operator.log_text());
            operator.kill();
            (starts - 1, logs)
        });
        Self { stop, kill, task }
    }

    /// Kills the operator now (SIGKILL); it is started again.
    pub fn kill(&self) {
        self.kill.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Stops the operator; returns how often it was started again, and all its logs.
    pub async fn stop(self) -> (usize, String) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await.unwrap()
    }
}
