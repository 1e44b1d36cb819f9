//! Leader election when the network fails: a leader cut off from the API server stops its
//! controllers before its lease can expire, so two replicas never reconcile at once. This is
//! the behaviour `kube-lease-manager` lacks (its leader keeps saying it leads while the API
//! server is out of reach), and why `crates/operator/src/leader.rs` is our own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use noops_e2e::*;
use tokio::net::{TcpListener, TcpStream};

const MINUTE: Duration = Duration::from_secs(60);

/// A TCP proxy to the API server that can be cut: from then on it forwards nothing in either
/// direction and closes nothing, as a network partition does (no reset, no end of stream).
struct CuttableProxy {
    addr: String,
    cut: Arc<AtomicBool>,
}

impl CuttableProxy {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let flag = cut.clone();
        tokio::spawn(async move {
            let mut held = vec![];
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                if flag.load(Ordering::SeqCst) {
                    held.push(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect("127.0.0.1:6443").await else {
                    continue;
                };
                tokio::spawn(forward(client, server, flag.clone()));
            }
        });
        Self { addr, cut }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

/// Copies bytes both ways until the proxy is cut; from then on swallows them and keeps both
/// connections open, silent.
async fn forward(client: TcpStream, server: TcpStream, cut: Arc<AtomicBool>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
    let pump = |mut from: OwnedReadHalf, mut to: OwnedWriteHalf, cut: Arc<AtomicBool>| async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) if cut.load(Ordering::SeqCst) => std::future::pending::<()>().await,
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return;
                }
                Ok(_) if cut.load(Ordering::SeqCst) => {}
                Ok(n) => {
                    if to.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pump(client_read, server_write, cut.clone()),
        pump(server_read, client_write, cut)
    );
}

#[tokio::test]
async fn a_leader_cut_off_from_the_api_server_steps_down_before_its_lease_expires() {
    install_crds();
    let ns = TestNamespace::new("leader-cut").await;
    let proxy = CuttableProxy::start().await;
    let original = std::fs::read_to_string(kubeconfig()).unwrap();
    let through_proxy = original.replace("https://127.0.0.1:6443", &format!("https://{}", proxy.addr));
    assert_ne!(
        original, through_proxy,
        "the admin kubeconfig names https://127.0.0.1:6443"
    );
    let proxied_kubeconfig = std::env::temp_dir().join(format!("noops-e2e-{}-kubeconfig", ns.name));
    std::fs::write(&proxied_kubeconfig, through_proxy).unwrap();

    let args = ["--lease-duration-seconds", "6"];
    let mut cut_off = Operator::start_with_kubeconfig(&ns.name, &args, &proxied_kubeconfig);
    wait_until("the first replica to lead", MINUTE, || async {
        cut_off.metric("noops_leader").await == Some(1.0)
    })
    .await;
    let leases: kube::Api<Lease> = ns.api();
    let holder = |lease: &Lease| lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
    let first = holder(&leases.get("noops-operator").await.unwrap());

    proxy.cut();
    // It stops leading, and exits to campaign afresh, while its lease is still valid: the
    // lease it could not renew expires `leaseDurationSeconds` after its last renewal.
    let deadline = std::time::Instant::now() + MINUTE;
    while cut_off.running() {
        assert!(
            std::time::Instant::now() < deadline,
            "the cut-off leader never stepped down"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stepped_down = jiff::Timestamp::now();
    let lease = leases.get("noops-operator").await.unwrap();
    let spec = lease.spec.clone().unwrap();
    assert_eq!(holder(&lease), first, "it could not give the lease up");
    let expires =
        spec.renew_time.unwrap().0 + jiff::SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap()));
    assert!(
        stepped_down < expires,
        "stepped down at {stepped_down}, after its lease expired at {expires}: two leaders at once\n{}",
        cut_off.log_text()
    );
    assert!(
        cut_off
            .log_text()
            .contains("could not renew the lease in time; stepping down"),
        "{}",
        cut_off.log_text()
    );

    // A replica that can reach the API server takes over once the lease has expired.
    let standby = Operator::start(&ns.name, &args);
    wait_until("the standby to lead", MINUTE, || async {
        standby.metric("noops_leader").await == Some(1.0)
    })
    .await;
    let taken = leases.get("noops-operator").await.unwrap();
    assert_ne!(holder(&taken), first);
    assert!(
        taken.spec.unwrap().acquire_time.unwrap().0 >= expires,
        "taken over only after the old lease expired"
    );
    let _ = std::fs::remove_file(&proxied_kubeconfig);
}
