//! Startup, liveness and readiness probes (exec, httpGet over HTTP or HTTPS, tcpSocket), with the kubelet's
//! threshold rules. Network probes go only to the pod's own IP (or loopback for host-network
//! pods): a probe can never send a packet off this machine.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// Which probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeKind {
    Startup,
    Liveness,
    Readiness,
}

impl ProbeKind {
    pub fn name(self) -> &'static str {
        match self {
            ProbeKind::Startup => "Startup",
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
        }
    }
}

/// The timing of a probe, with Kubernetes defaults applied.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbeTiming {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

impl ProbeTiming {
    pub fn of(probe: &Probe) -> Self {
        let secs = |v: Option<i32>, default: i32| Duration::from_secs(v.unwrap_or(default).max(0) as u64);
        Self {
            initial_delay: secs(probe.initial_delay_seconds, 0),
            period: secs(probe.period_seconds, 10).max(Duration::from_secs(1)),
            timeout: secs(probe.timeout_seconds, 1).max(Duration::from_secs(1)),
            success_threshold: probe.success_threshold.unwrap_or(1).max(1) as u32,
            failure_threshold: probe.failure_threshold.unwrap_or(3).max(1) as u32,
        }
    }
}

/// Turns single probe results into a verdict, the way the kubelet counts them: the verdict
/// flips only after `success_threshold` successes or `failure_threshold` failures in a row.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeTracker {
    timing: ProbeTiming,
    successes: u32,
    failures: u32,
    /// `None` until the first verdict.
    pub verdict: Option<bool>,
}

impl ProbeTracker {
    pub fn new(timing: ProbeTiming) -> Self {
        Self {
            timing,
            successes: 0,
            failures: 0,
            verdict: None,
        }
    }

    /// Records one result; returns the verdict if it changed.
    pub fn record(&mut self, success: bool) -> Option<bool> {
        if success {
            self.successes += 1;
            self.failures = 0;
        } else {
            self.failures += 1;
            self.successes = 0;
        }
        let new = if self.successes >= self.timing.success_threshold {
            Some(true)
        } else if self.failures >= self.timing.failure_threshold {
            Some(false)
        } else {
            self.verdict
        };
        if new != self.verdict {
            self.verdict = new;
            new
        } else {
            None
        }
    }
}

/// Where and how to run a probe for one container instance.
#[derive(Debug, Clone)]
pub struct ProbeTarget {
    /// The node's address: network probes leave from it, as a kubelet's leave its node, so they
    /// still reach the pod while the node is cut off from the rest of the cluster.
    pub source: Ipv4Addr,
    pub pod_ip: Ipv4Addr,
    pub host_network: bool,
    pub pid: u32,
    pub env: Vec<(String, String)>,
}

/// What a container's probes tell its worker.
#[derive(Debug, Clone, PartialEq)]
pub enum ProbeReport {
    /// One run of a probe failed (an Event says why; the verdict may not have changed yet).
    Failed { kind: ProbeKind, message: String },
    /// A probe's verdict changed (or was reached for the first time).
    Verdict { kind: ProbeKind, healthy: bool },
}

/// How often a readiness probe runs until it first passes, instead of every period: a
/// container is Ready as soon as it answers, not up to a period later (a kubelet waits the
/// period; an etcd member made again was Ready a second after it answered).
const FIRST_PASS_POLL: Duration = Duration::from_millis(100);

/// How long to wait before running a probe again: its period, but [`FIRST_PASS_POLL`] for a
/// readiness probe that has not passed yet.
pub fn wait_before_next(kind: ProbeKind, passed_once: bool, period: Duration) -> Duration {
    if kind == ProbeKind::Readiness && !passed_once {
        period.min(FIRST_PASS_POLL)
    } else {
        period
    }
}

/// Runs a container instance's probes: the startup probe until it passes, then liveness and
/// readiness side by side (a container without a readiness probe is ready at once). Everything
/// they find goes to `report`, until the task is aborted.
pub fn spawn_probes<R>(container: Container, target: ProbeTarget, report: R) -> JoinHandle<()>
where
    R: Fn(ProbeReport) + Clone + Send + Sync + 'static,
{
    tokio::spawn(async move {
        let run = |kind: ProbeKind, probe: Probe, stop_on_success: bool| {
            let (container, target, report) = (container.clone(), target.clone(), report.clone());
            async move {
                let timing = ProbeTiming::of(&probe);
                let mut tracker = ProbeTracker::new(timing);
                let mut passed_once = false;
                // Failures are reported once a period, however often the probe runs.
                let mut failure_reported_at: Option<tokio::time::Instant> = None;
                tokio::time::sleep(timing.initial_delay).await;
                loop {
                    let result = run_once(&probe, &container, &target).await;
                    passed_once |= result.is_ok();
                    if let Err(message) = &result
                        && failure_reported_at.is_none_or(|at| at.elapsed() >= timing.period)
                    {
                        failure_reported_at = Some(tokio::time::Instant::now());
                        report(ProbeReport::Failed {
                            kind,
                            message: message.clone(),
                        });
                    }
                    if let Some(healthy) = tracker.record(result.is_ok()) {
                        report(ProbeReport::Verdict { kind, healthy });
                        if stop_on_success && healthy {
                            return;
                        }
                    }
                    tokio::time::sleep(wait_before_next(kind, passed_once, timing.period)).await;
                }
            }
        };
        if let Some(p) = container.startup_probe.clone() {
            run(ProbeKind::Startup, p, true).await;
        }
        let readiness = async {
            match container.readiness_probe.clone() {
                Some(p) => run(ProbeKind::Readiness, p, false).await,
                None => report(ProbeReport::Verdict {
                    kind: ProbeKind::Readiness,
                    healthy: true,
                }),
            }
        };
        let liveness = async {
            if let Some(p) = container.liveness_probe.clone() {
                run(ProbeKind::Liveness, p, false).await;
            }
        };
        tokio::join!(readiness, liveness);
    })
}

/// Runs one probe once. `Ok(())` is success; `Err` carries the failure message.
pub async fn run_once(probe: &Probe, container: &Container, target: &ProbeTarget) -> Result<(), String> {
    let timeout = ProbeTiming::of(probe).timeout;
    if let Some(exec) = &probe.exec {
        let command = exec.command.clone().unwrap_or_default();
        return match crate::process::exec_in(target.pid, &command, &target.env, timeout).await {
            Ok(Some(0)) => Ok(()),
            Ok(Some(code)) => Err(format!("command {command:?} exited with {code}")),
            Ok(None) => Err(format!("command {command:?} timed out after {timeout:?}")),
            Err(e) => Err(format!("command {command:?} could not run: {e}")),
        };
    }
    if let Some(http) = &probe.http_get {
        let port = resolve_port(&http.port, container)?;
        let addr = probe_address(http.host.as_deref(), target, port)?;
        let https = http.scheme.as_deref().unwrap_or("HTTP").eq_ignore_ascii_case("HTTPS");
        let path = http.path.clone().unwrap_or_else(|| "/".into());
        let headers: Vec<(String, String)> = http
            .http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        return tokio::time::timeout(timeout, http_get(target, addr, https, &path, &headers))
            .await
            .map_err(|_| format!("GET {path} on {addr} timed out after {timeout:?}"))?;
    }
    if let Some(tcp) = &probe.tcp_socket {
        let port = resolve_port(&tcp.port, container)?;
        let addr = probe_address(tcp.host.as_deref(), target, port)?;
        return match tokio::time::timeout(timeout, connect(target, addr)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("dial {addr}: {e}")),
            Err(_) => Err(format!("dial {addr} timed out after {timeout:?}")),
        };
    }
    if probe.grpc.is_some() {
        return Err("gRPC probes are not supported on the local Kubernetes".into());
    }
    Err("probe has no handler".into())
}

/// The address a network probe connects to. Only the pod itself is allowed.
fn probe_address(host: Option<&str>, target: &ProbeTarget, port: u16) -> Result<SocketAddr, String> {
    let default = if target.host_network {
        Ipv4Addr::LOCALHOST
    } else {
        target.pod_ip
    };
    let ip = match host {
        None | Some("") => default,
        Some(h) => {
            let ip: Ipv4Addr = h
                .parse()
                .map_err(|_| format!("probe host {h:?} must be an IP address"))?;
            if ip != target.pod_ip && !ip.is_loopback() {
                return Err(format!("probe host {h} is not this pod; probes stay on this machine"));
            }
            ip
        }
    };
    Ok(SocketAddr::new(IpAddr::V4(ip), port))
}

/// A probe port: a number, or the name of one of the container's ports.
pub fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("invalid port {n}")),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("container has no port named {name:?}")),
    }
}

/// Connects to the probed address from the node's address (from loopback for host-network pods).
async fn connect(target: &ProbeTarget, addr: SocketAddr) -> std::io::Result<TcpStream> {
    if target.host_network || addr.ip().is_loopback() {
        return TcpStream::connect(addr).await;
    }
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(IpAddr::V4(target.source), 0))?;
    socket.connect(addr).await
}

/// A minimal HTTP/1.1 GET (over TLS with `https`): success is a status from 200 to 399.
async fn http_get(
    target: &ProbeTarget,
    addr: SocketAddr,
    https: bool,
    path: &str,
    headers: &[(String, String)],
) -> Result<(), String> {
    let stream = connect(target, addr)
        .await
        .map_err(|e| format!("GET {path} on {addr}: {e}"))?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/noops\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("Accept: */*\r\nConnection: close\r\n\r\n");
    let status = if https {
        let connector = tokio_rustls::TlsConnector::from(crate::probe_tls::probe_client_config()?);
        let name = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
        let tls = connector
            .connect(name, stream)
            .await
            .map_err(|e| format!("GET {path} on {addr}: TLS handshake: {e}"))?;
        exchange(tls, &request, path).await?
    } else {
        exchange(stream, &request, path).await?
    };
    if (200..400).contains(&status) {
        Ok(())
    } else {
        Err(format!("HTTP probe failed with statuscode: {status}"))
    }
}

/// Sends `request` and reads the status code of the answer.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, request: &str, path: &str) -> Result<u16, String> {
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("GET {path}: {e}"))?;
    let mut head = [0u8; 64];
    let mut read = 0;
    while read < 12 {
        let n = stream
            .read(&mut head[read..])
            .await
            .map_err(|e| format!("GET {path}: {e}"))?;
        if n == 0 {
            break;
        }
        read += n;
    }
    parse_status(&head[..read]).ok_or_else(|| format!("GET {path}: malformed HTTP response"))
}

fn parse_status(head: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(head).ok()?;
    let mut parts = text.split_whitespace();
    parts.next().filter(|v| v.starts_with("HTTP/"))?;
    parts.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerPort;

    fn timing(success: u32, failure: u32) -> ProbeTiming {
        ProbeTiming {
            initial_delay: Duration::ZERO,
            period: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            success_threshold: success,
            failure_threshold: failure,
        }
    }

    #[test]
    fn verdict_needs_consecutive_results() {
        let mut t = ProbeTracker::new(timing(2, 3));
        assert_eq!(t.record(true), None);
        assert_eq!(t.record(true), Some(true));
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(true), None, "a success resets the failure run");
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(false), Some(false));
        assert_eq!(t.verdict, Some(false));
    }

    #[test]
    fn defaults_follow_kubernetes() {
        let t = ProbeTiming::of(&Probe::default());
        assert_eq!(t.period, Duration::from_secs(10));
        assert_eq!(t.timeout, Duration::from_secs(1));
        assert_eq!((t.success_threshold, t.failure_threshold), (1, 3));
    }

    #[test]
    fn named_ports_and_hosts() {
        let c = Container {
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert_eq!(resolve_port(&IntOrString::String("http".into()), &c), Ok(8080));
        assert!(resolve_port(&IntOrString::String("nope".into()), &c).is_err());
        let target = ProbeTarget {
            source: Ipv4Addr::new(10, 1, 0, 1),
            pod_ip: Ipv4Addr::new(10, 1, 0, 4),
            host_network: false,
            pid: 1,
            env: vec![],
        };
        assert_eq!(probe_address(None, &target, 80).unwrap().to_string(), "10.1.0.4:80");
        assert!(probe_address(Some("192.0.2.2"), &target, 80).is_err());
        assert!(probe_address(Some("example.com"), &target, 80).is_err());
    }

    #[test]
    fn status_line() {
        assert_eq!(parse_status(b"HTTP/1.1 204 No Content\r\n"), Some(204));
        assert_eq!(parse_status(b"garbage"), None);
    }

    /// A TLS server on loopback with a self-signed certificate that answers `200` on
    /// `/readyz` and `500` elsewhere; its port.
    async fn tls_server() -> u16 {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["somewhere.else".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let der = rustls_pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        let config =
            rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![cert.der().clone()], der)
                .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut buf = [0u8; 1024];
                    let n = tls.read(&mut buf).await.unwrap_or(0);
                    let ok = String::from_utf8_lossy(&buf[..n]).starts_with("GET /readyz ");
                    let status = if ok { "200 OK" } else { "500 Internal Server Error" };
                    let answer = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
                    let _ = tls.write_all(answer.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        port
    }

    fn http_probe(scheme: &str, path: &str, port: u16) -> Probe {
        Probe {
            http_get: Some(k8s_openapi::api::core::v1::HTTPGetAction {
                scheme: Some(scheme.into()),
                path: Some(path.into()),
                port: IntOrString::Int(port.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn an_https_probe_asks_whatever_certificate_the_pod_has_and_reads_the_status() {
        let port = tls_server().await;
        let target = ProbeTarget {
            source: Ipv4Addr::LOCALHOST,
            pod_ip: Ipv4Addr::LOCALHOST,
            host_network: true,
            pid: 0,
            env: Vec::new(),
        };
        let container = Container::default();
        let run = |scheme: &'static str, path: &'static str| {
            let (target, container) = (target.clone(), container.clone());
            async move { run_once(&http_probe(scheme, path, port), &container, &target).await }
        };
        assert_eq!(run("HTTPS", "/readyz").await, Ok(()));
        let failed = run("HTTPS", "/livez").await.unwrap_err();
        assert!(failed.contains("statuscode: 500"), "{failed}");
        assert!(run("HTTP", "/readyz").await.is_err(), "plain HTTP to a TLS port fails");
    }

    #[test]
    fn readiness_is_asked_often_until_it_first_passes_and_other_probes_keep_their_period() {
        let period = Duration::from_secs(10);
        assert_eq!(wait_before_next(ProbeKind::Readiness, false, period), FIRST_PASS_POLL);
        assert_eq!(wait_before_next(ProbeKind::Readiness, true, period), period);
        assert_eq!(
            wait_before_next(ProbeKind::Liveness, false, period),
            period,
            "a liveness failure kills: never faster"
        );
        assert_eq!(wait_before_next(ProbeKind::Startup, false, period), period);
    }
}
