//! KubernetesControlPlane benchmark on the local Kubernetes (`make bench` runs it), each figure
//! beside what bounds it:
//! - apply → Ready of a control plane as the defaults make it (1 API server, 3 etcd members),
//!   against the same binaries with the same certificates started by hand on this machine (3
//!   etcd members at once, the API server, the controller-manager and the scheduler, until each
//!   answers), and against Kamaji's published 16 s;
//! - an upgrade 1.33 → 1.34 of a control plane of 3 API servers and 3 etcd members, against the
//!   same steps by hand (each etcd member stopped and started again on the new binary, each API
//!   server replaced by a new one that answers before the old one stops, the controller-manager
//!   and the scheduler started again), and against Kamaji's published 10 s (which moves no etcd);
//! - how many control planes of 1 API server and 1 etcd member this machine holds: made one
//!   after another until one is not Ready within 3 minutes, less than a fifth of the memory is
//!   left, or `KCP_BENCH_MAX` (80) are Ready; the memory of each (its processes' RSS) and of
//!   the operator.
//!
//! Usage: kcp-bench <noops binary> [runs]; prints a Markdown table.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use noops_api::control_plane::KubernetesControlPlanePhase;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use noops_api::{KubernetesControlPlane, KubernetesControlPlaneStatus};
use noops_e2e::bench::{free_port, median, row, rss_mib, scratch};
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);
/// Kamaji's README: a tenant control plane ready in about 16 s, upgraded in about 10 s.
const KAMAJI_READY: f64 = 16.0;
const KAMAJI_UPGRADE: f64 = 10.0;

fn control_plane(name: &str, spec: &str) -> String {
    format!("apiVersion: noops.dev/v1alpha1\nkind: KubernetesControlPlane\nmetadata: {{ name: {name} }}\nspec:\n{spec}")
}

/// Waits until the control plane's status satisfies `check`; `None` after `timeout`.
async fn wait_status(
    ns: &TestNamespace,
    name: &str,
    timeout: Duration,
    check: impl Fn(&KubernetesControlPlaneStatus) -> bool,
) -> Option<KubernetesControlPlaneStatus> {
    let api = ns.api::<KubernetesControlPlane>();
    let t = Instant::now();
    while t.elapsed() < timeout {
        if let Some(status) = api.get(name).await.ok().and_then(|k| k.status)
            && check(&status)
        {
            return Some(status);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

fn is_ready(status: &KubernetesControlPlaneStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Whether `https://127.0.0.1:<port><path>` answers 200 (certificates not checked).
fn answers(port: u16, path: &str) -> bool {
    let out = Command::new("curl")
        .args(["-sk", "-m", "2", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output();
    out.is_ok_and(|o| o.stdout == b"200")
}

fn etcd_healthy(port: u16) -> bool {
    let out = Command::new("curl")
        .args(["-s", "-m", "2"])
        .arg(format!("http://127.0.0.1:{port}/health"))
        .output();
    out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("\"true\""))
}

async fn wait_true(what: &str, check: impl Fn() -> bool) {
    let t = Instant::now();
    while !check() {
        assert!(
            t.elapsed() < 2 * MINUTE,
            "by hand: {what} did not answer within 2 minutes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A process started by hand, stopped (SIGTERM, then waited for) when dropped.
struct Process(Child);

impl Process {
    fn start(binary: &Path, args: &[String], log: &Path) -> Self {
        let out = std::fs::File::create(log).unwrap();
        let child = Command::new(binary)
            .args(args)
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
        Self(child)
    }

    /// Asks it to stop (SIGTERM) and waits until it has.
    fn stop(mut self) {
        self.ask_to_stop();
        let _ = self.0.wait();
    }

    fn ask_to_stop(&mut self) {
        let _ = Command::new("kill").arg(self.0.id().to_string()).status();
    }

    fn rss_mib(&self) -> f64 {
        rss_mib(self.0.id())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The files a control plane started by hand needs, taken from the Secrets of one the operator
/// made (the same certificates), in `dir`.
async fn certificates_of(ns: &TestNamespace, name: &str, dir: &Path) {
    let secrets = ns.api::<Secret>();
    let take = |secret: &str, key: &str, file: &str| {
        let (secrets, secret, key, file) = (secrets.clone(), secret.to_string(), key.to_string(), dir.join(file));
        async move {
            let found = secrets.get(&secret).await.unwrap();
            std::fs::write(file, &found.data.unwrap()[&key].0).unwrap();
        }
    };
    take(&format!("{name}-ca"), "ca.crt", "ca.crt").await;
    take(&format!("{name}-ca"), "ca.key", "ca.key").await;
    take(&format!("{name}-apiserver-tls"), "tls.crt", "apiserver.crt").await;
    take(&format!("{name}-apiserver-tls"), "tls.key", "apiserver.key").await;
    take(&format!("{name}-service-account"), "sa.key", "sa.key").await;
    take(&format!("{name}-service-account"), "sa.pub", "sa.pub").await;
    for who in ["controller-manager", "scheduler"] {
        let secret = secrets.get(&format!("{name}-{who}-kubeconfig")).await.unwrap();
        std::fs::write(
            dir.join(format!("{who}.kubeconfig")),
            &secret.data.unwrap()["kubeconfig"].0,
        )
        .unwrap();
    }
}

/// `kubeconfig` with its `server:` line pointing at `server`.
fn with_server(kubeconfig: &str, server: &str) -> String {
    kubeconfig
        .lines()
        .map(|l| match l.split_once("server: ") {
            Some((indent, _)) => format!("{indent}server: {server}"),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A control plane started by hand on this machine from the same binaries: etcd members, API
/// servers, a controller-manager and a scheduler.
struct ByHand {
    dir: PathBuf,
    etcd_ports: Vec<(u16, u16)>,
    etcd: Vec<Option<Process>>,
    api: Vec<(u16, Process)>,
    controllers: Vec<Process>,
    /// Old API servers asked to stop: nothing waits for them, as a Deployment's rollout does
    /// not wait for a terminating pod.
    stopping: Vec<Process>,
}

/// The folder of a Kubernetes minor's binaries: 1.34 is the local Kubernetes's own.
fn kubernetes_bin(minor: &str, program: &str) -> PathBuf {
    if built_kubernetes_version().starts_with(&format!("v{minor}.")) {
        upstream_bin(program)
    } else {
        upstream_bin(&format!("k8s-{minor}/{program}"))
    }
}

impl ByHand {
    fn etcd_args(&self, member: usize) -> Vec<String> {
        let (client, peer) = self.etcd_ports[member];
        let cluster: Vec<String> = self
            .etcd_ports
            .iter()
            .enumerate()
            .map(|(i, (_, p))| format!("m{i}=http://127.0.0.1:{p}"))
            .collect();
        vec![
            format!("--name=m{member}"),
            format!("--data-dir={}", self.dir.join(format!("etcd-{member}")).display()),
            format!("--listen-client-urls=http://127.0.0.1:{client}"),
            format!("--advertise-client-urls=http://127.0.0.1:{client}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-cluster={}", cluster.join(",")),
        ]
    }

    fn start_etcd(&mut self, member: usize, etcd_minor: &str) {
        let binary = upstream_bin(&format!("etcd-{etcd_minor}/etcd"));
        let log = self.dir.join(format!("etcd-{member}.log"));
        self.etcd[member] = Some(Process::start(&binary, &self.etcd_args(member), &log));
    }

    fn api_args(&self, port: u16) -> Vec<String> {
        let d = |f: &str| self.dir.join(f).display().to_string();
        let servers: Vec<String> = self
            .etcd_ports
            .iter()
            .map(|(c, _)| format!("http://127.0.0.1:{c}"))
            .collect();
        vec![
            format!("--etcd-servers={}", servers.join(",")),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            "--endpoint-reconciler-type=none".into(),
            format!("--tls-cert-file={}", d("apiserver.crt")),
            format!("--tls-private-key-file={}", d("apiserver.key")),
            format!("--client-ca-file={}", d("ca.crt")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", d("sa.pub")),
            format!("--service-account-signing-key-file={}", d("sa.key")),
            "--service-cluster-ip-range=10.112.0.0/16".into(),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
        ]
    }

    fn start_api(&mut self, minor: &str) -> u16 {
        let port = free_port();
        let log = self.dir.join(format!("apiserver-{port}.log"));
        let process = Process::start(&kubernetes_bin(minor, "kube-apiserver"), &self.api_args(port), &log);
        self.api.push((port, process));
        port
    }

    /// Starts the controller-manager and the scheduler of `minor`; their health ports.
    fn start_controllers(&mut self, minor: &str) -> [u16; 2] {
        // Their kubeconfigs name the first API server (its serving certificate names
        // 127.0.0.1 too).
        let server = format!("https://127.0.0.1:{}", self.api[0].0);
        for who in ["controller-manager", "scheduler"] {
            let text = std::fs::read_to_string(self.dir.join(format!("{who}.kubeconfig"))).unwrap();
            std::fs::write(self.dir.join(format!("{who}.conf")), with_server(&text, &server)).unwrap();
        }
        let d = |f: &str| self.dir.join(f).display().to_string();
        let (cm, sched) = (free_port(), free_port());
        let cm_args = vec![
            format!("--kubeconfig={}", d("controller-manager.conf")),
            format!("--authentication-kubeconfig={}", d("controller-manager.conf")),
            format!("--authorization-kubeconfig={}", d("controller-manager.conf")),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={cm}"),
            "--leader-elect=false".into(),
            format!("--cluster-signing-cert-file={}", d("ca.crt")),
            format!("--cluster-signing-key-file={}", d("ca.key")),
            format!("--root-ca-file={}", d("ca.crt")),
            format!("--service-account-private-key-file={}", d("sa.key")),
            "--use-service-account-credentials=true".into(),
            "--service-cluster-ip-range=10.112.0.0/16".into(),
            "--profiling=false".into(),
        ];
        let sched_args = vec![
            format!("--kubeconfig={}", d("scheduler.conf")),
            format!("--authentication-kubeconfig={}", d("scheduler.conf")),
            format!("--authorization-kubeconfig={}", d("scheduler.conf")),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={sched}"),
            "--leader-elect=false".into(),
            "--profiling=false".into(),
        ];
        let cm_log = self.dir.join(format!("controller-manager-{cm}.log"));
        let sched_log = self.dir.join(format!("scheduler-{sched}.log"));
        let binary = kubernetes_bin(minor, "kube-controller-manager");
        self.controllers.push(Process::start(&binary, &cm_args, &cm_log));
        let binary = kubernetes_bin(minor, "kube-scheduler");
        self.controllers.push(Process::start(&binary, &sched_args, &sched_log));
        [cm, sched]
    }

    /// Starts `members` etcd members and an API server of `minor` at once, then any other API
    /// servers, then the controller-manager and the scheduler; returns once each answers, and
    /// how long that took.
    async fn start(dir: &Path, minor: &str, etcd_minor: &str, members: usize, api_servers: usize) -> (Self, f64) {
        let etcd_ports = (0..members).map(|_| (free_port(), free_port())).collect();
        let mut by_hand = Self {
            dir: dir.to_path_buf(),
            etcd_ports,
            etcd: (0..members).map(|_| None).collect(),
            api: vec![],
            controllers: vec![],
            stopping: vec![],
        };
        let t = Instant::now();
        for member in 0..members {
            by_hand.start_etcd(member, etcd_minor);
        }
        let first = by_hand.start_api(minor);
        for (client, _) in by_hand.etcd_ports.clone() {
            wait_true("etcd", || etcd_healthy(client)).await;
        }
        wait_true("kube-apiserver", || answers(first, "/readyz")).await;
        // The others once the first has written what a fresh etcd lacks: started together on
        // an empty etcd, all but one exit ("another caller has already initialized" the
        // Service IP allocator) and, here, no one would start them again.
        let others: Vec<u16> = (1..api_servers).map(|_| by_hand.start_api(minor)).collect();
        for port in others {
            wait_true("kube-apiserver", || answers(port, "/readyz")).await;
        }
        // Started once the API answers: started before, they exit when they cannot read
        // what they need (no one would restart them here, as a kubelet does).
        let [cm, sched] = by_hand.start_controllers(minor);
        wait_true("kube-controller-manager", || answers(cm, "/healthz")).await;
        wait_true("kube-scheduler", || answers(sched, "/healthz")).await;
        (by_hand, t.elapsed().as_secs_f64())
    }

    /// The upgrade by hand, in the operator's order: each etcd member stopped and started on
    /// `etcd_minor`'s binary; each API server replaced by one of `minor` that answers before the
    /// old one stops; the controller-manager and the scheduler stopped and started on `minor`.
    async fn upgrade(&mut self, minor: &str, etcd_minor: &str) -> f64 {
        let t = Instant::now();
        for member in 0..self.etcd.len() {
            if let Some(old) = self.etcd[member].take() {
                old.stop();
            }
            self.start_etcd(member, etcd_minor);
            let (client, _) = self.etcd_ports[member];
            wait_true("etcd on its new version", || etcd_healthy(client)).await;
        }
        eprintln!("by hand: etcd moved in {:.1} s", t.elapsed().as_secs_f64());
        let old: Vec<(u16, Process)> = std::mem::take(&mut self.api);
        for (_, mut process) in old {
            let port = self.start_api(minor);
            wait_true("the new kube-apiserver", || answers(port, "/readyz")).await;
            process.ask_to_stop();
            self.stopping.push(process);
        }
        eprintln!(
            "by hand: etcd and API servers moved in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        for process in std::mem::take(&mut self.controllers) {
            process.stop();
        }
        let [cm, sched] = self.start_controllers(minor);
        wait_true("the new kube-controller-manager", || answers(cm, "/healthz")).await;
        wait_true("the new kube-scheduler", || answers(sched, "/healthz")).await;
        t.elapsed().as_secs_f64()
    }
}

impl ByHand {
    /// The RSS of every process it runs, in MiB.
    fn rss_mib(&self) -> f64 {
        let etcd = self.etcd.iter().flatten();
        let api = self.api.iter().map(|(_, p)| p);
        etcd.chain(api).chain(&self.controllers).map(Process::rss_mib).sum()
    }
}

/// The RSS of every process of control plane `name` (its pods' processes carry their pod's
/// name, which starts with the control plane's, as HOSTNAME), in MiB.
fn control_plane_rss_mib(name: &str) -> f64 {
    let prefix = format!("HOSTNAME={name}-");
    let mut total = 0.0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        if environ.split(|b| *b == 0).any(|v| v.starts_with(prefix.as_bytes())) {
            total += rss_mib(pid);
        }
    }
    total
}

/// MemAvailable and MemTotal of this machine, in MiB.
fn memory_mib() -> (f64, f64) {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (field("MemAvailable:"), field("MemTotal:"))
}

/// Apply → Ready of the default shape, then the same by hand with its certificates.
async fn create(binary: &Path) -> (f64, f64) {
    let ns = TestNamespace::new("kcp-bench").await;
    let _operator = Operator::start_binary(
        binary,
        &ns.name,
        &["--controllers", "kubernetescontrolplane,etcd"],
        &kubeconfig(),
    );
    let t = Instant::now();
    ns.apply(&control_plane("made", "  version: \"1.34\"\n"));
    wait_status(&ns, "made", 5 * MINUTE, is_ready)
        .await
        .expect("the control plane Ready within 5 minutes");
    let made = t.elapsed().as_secs_f64();
    let dir = scratch("kcp-bench", "create");
    certificates_of(&ns, "made", &dir).await;
    let (by_hand, took) = ByHand::start(&dir, "1.34", "3.6", 3, 1).await;
    drop(by_hand);
    let _ = std::fs::remove_dir_all(&dir);
    (made, took)
}

/// An upgrade 1.33 → 1.34 of 3 API servers and 3 etcd members: (the whole, of which etcd), and
/// the same by hand.
async fn upgrade(binary: &Path) -> (f64, f64, f64) {
    let ns = TestNamespace::new("kcp-bench-up").await;
    let _operator = Operator::start_binary(
        binary,
        &ns.name,
        &["--controllers", "kubernetescontrolplane,etcd"],
        &kubeconfig(),
    );
    let spec = |v: &str| format!("  version: \"{v}\"\n  replicas: 3\n");
    ns.apply(&control_plane("up", &spec("1.33")));
    wait_status(&ns, "up", 5 * MINUTE, is_ready)
        .await
        .expect("the control plane Ready at 1.33 within 5 minutes");
    let t = Instant::now();
    ns.apply(&control_plane("up", &spec("1.34")));
    let past_etcd = wait_status(&ns, "up", 5 * MINUTE, |s| {
        s.upgrade.as_ref().is_some_and(|u| u.step != "Etcd") || s.version.as_deref() == Some("1.34.4")
    })
    .await;
    assert!(past_etcd.is_some(), "etcd upgraded within 5 minutes");
    let etcd = t.elapsed().as_secs_f64();
    wait_status(&ns, "up", 5 * MINUTE, |s| {
        s.version.as_deref() == Some("1.34.4") && s.phase == Some(KubernetesControlPlanePhase::Running)
    })
    .await
    .expect("upgraded within 5 minutes");
    let whole = t.elapsed().as_secs_f64();

    let dir = scratch("kcp-bench", "upgrade");
    certificates_of(&ns, "up", &dir).await;
    let (mut by_hand, _) = ByHand::start(&dir, "1.33", "3.5", 3, 3).await;
    let took = by_hand.upgrade("1.34", "3.6").await;
    drop(by_hand);
    let _ = std::fs::remove_dir_all(&dir);
    (whole, etcd, took)
}

/// The memory of one control plane of 1 API server and 1 etcd member started by hand, settled,
/// with the certificates of control plane `name`.
async fn by_hand_memory(ns: &TestNamespace, name: &str) -> f64 {
    let dir = scratch("kcp-bench", "memory");
    certificates_of(ns, name, &dir).await;
    let (by_hand, _) = ByHand::start(&dir, "1.34", "3.6", 1, 1).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let rss = by_hand.rss_mib();
    drop(by_hand);
    let _ = std::fs::remove_dir_all(&dir);
    rss
}

/// How many control planes fit, and why no more were made.
struct Capacity {
    made: usize,
    stopped: String,
    per_control_plane_mib: Vec<f64>,
    operator_none_mib: f64,
    operator_all_mib: f64,
    by_hand_mib: f64,
    ready_first: f64,
    ready_last: f64,
}

async fn capacity(binary: &Path) -> Capacity {
    let max: usize = std::env::var("KCP_BENCH_MAX")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(80);
    let ns = TestNamespace::new("kcp-bench-many").await;
    let operator = Operator::start_binary(
        binary,
        &ns.name,
        &["--controllers", "kubernetescontrolplane,etcd"],
        &kubeconfig(),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let operator_none_mib = rss_mib(operator.pid());
    let mut times = vec![];
    let mut per = vec![];
    let stopped = loop {
        let (available, total) = memory_mib();
        if available < total / 5.0 {
            break format!("less than a fifth of the memory left ({available:.0} of {total:.0} MiB)");
        }
        if times.len() == max {
            break format!("KCP_BENCH_MAX ({max}) reached");
        }
        let name = format!("t{:02}", times.len());
        let t = Instant::now();
        ns.apply(&control_plane(&name, "  version: \"1.34\"\n  etcd: { replicas: 1 }\n"));
        if wait_status(&ns, &name, 3 * MINUTE, is_ready).await.is_none() {
            break format!("control plane {} not Ready within 3 minutes", times.len() + 1);
        }
        times.push(t.elapsed().as_secs_f64());
        eprintln!(
            "control plane {} Ready in {:.1} s",
            times.len(),
            t.elapsed().as_secs_f64()
        );
    };
    // Settled: the last pods past their start.
    tokio::time::sleep(Duration::from_secs(20)).await;
    for i in 0..times.len() {
        per.push(control_plane_rss_mib(&format!("t{i:02}")));
    }
    let operator_all_mib = rss_mib(operator.pid());
    let by_hand_mib = by_hand_memory(&ns, "t00").await;
    Capacity {
        made: times.len(),
        stopped,
        per_control_plane_mib: per,
        operator_none_mib,
        operator_all_mib,
        by_hand_mib,
        ready_first: times.first().copied().unwrap_or(0.0),
        ready_last: times.last().copied().unwrap_or(0.0),
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let binary = PathBuf::from(args.get(1).expect("usage: kcp-bench <noops binary> [runs]"));
    let runs: usize = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(3);
    install_crds();
    let (mut made, mut made_by_hand) = (vec![], vec![]);
    let (mut upgraded, mut upgraded_etcd, mut upgraded_by_hand) = (vec![], vec![], vec![]);
    for _ in 0..runs {
        let (m, h) = create(&binary).await;
        made.push(m);
        made_by_hand.push(h);
        let (whole, etcd, by_hand) = upgrade(&binary).await;
        upgraded.push(whole);
        upgraded_etcd.push(etcd);
        upgraded_by_hand.push(by_hand);
    }
    let capacity = capacity(&binary).await;

    println!(
        "| KubernetesControlPlane (release operator) | median of {runs} | what bounds it | bound | ratio | runs |"
    );
    println!("|---|---|---|---|---|---|");
    let by_hand_made = median(made_by_hand.clone());
    row(
        "apply → Ready, 1 API server, 3 etcd members (s)",
        &made,
        "the same binaries and certificates started by hand (s)",
        by_hand_made,
    );
    row(
        "apply → Ready, 1 API server, 3 etcd members (s)",
        &made,
        "Kamaji's published figure (s)",
        KAMAJI_READY,
    );
    row(
        "upgrade 1.33 → 1.34, 3 API servers, 3 etcd members (s)",
        &upgraded,
        "the same steps by hand (s)",
        median(upgraded_by_hand.clone()),
    );
    row(
        "…of which etcd 3.5 → 3.6, member by member (s)",
        &upgraded_etcd,
        "the whole upgrade (s)",
        median(upgraded.clone()),
    );
    let api_part: Vec<f64> = upgraded.iter().zip(&upgraded_etcd).map(|(w, e)| w - e).collect();
    row(
        "…the API servers, controller-manager and scheduler (s)",
        &api_part,
        "Kamaji's published upgrade, no etcd (s)",
        KAMAJI_UPGRADE,
    );
    let per = &capacity.per_control_plane_mib;
    println!(
        "| control planes held at once (1 API server, 1 etcd member) | {} | stopped: {} | | | apply → Ready {:.1} s for the first, {:.1} s for the last |",
        capacity.made, capacity.stopped, capacity.ready_first, capacity.ready_last
    );
    if !per.is_empty() {
        row(
            "memory of one control plane, all its processes (MiB)",
            per,
            "the same processes started by hand (MiB)",
            capacity.by_hand_mib,
        );
    }
    row(
        &format!("operator RSS with {} control planes (MiB)", capacity.made),
        &[capacity.operator_all_mib],
        "operator RSS with none (MiB)",
        capacity.operator_none_mib,
    );
}
