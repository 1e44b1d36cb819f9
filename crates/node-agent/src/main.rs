//! `noops-node`: the node agent of the local Kubernetes.
//!
//! It plays kubelet for one node: registers the Node and keeps its Lease fresh, runs the pods
//! bound to it as local processes in per-pod network namespaces, provisions local-path
//! PersistentVolumes, answers cluster DNS, and serves container logs to the API server.
//!
//! On a real node (`--beside-kubelet`) the upstream kubelet and containerd run the pods; the
//! agent then serves only what the local Kubernetes adds to a node: cluster DNS at the node's
//! address, local-path volumes, the images built here as every registry's mirror
//! (`registry.rs`), and the refusal of any pull that would leave the machine (`pull_refusal.rs`).

mod atomic_dir;
mod cgroups;
mod credentials;
mod dns;
mod downward;
mod env;
mod images;
mod kubelet_api;
mod machine;
mod network;
mod node;
mod pods;
mod probe_tls;
mod probes;
mod process;
mod provisioner;
mod pull_refusal;
mod registry;
mod rootfs;
mod volumes;
mod watch_cache;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kube::runtime::events::{Recorder, Reporter};
use tracing::info;

use crate::images::ImageMapFileWatch;
use crate::network::{Ipv4Net, PodNetwork};
use crate::node::NodeInfo;

/// Where a machine answers `/healthz` (the kubelet's health port).
const HEALTH_PORT: u16 = 10248;
/// Where a real node's containerd pulls from (the mirror of every registry), on the node's address.
const REGISTRY_PORT: u16 = 5000;
/// Where a real node's containerd sends what the mirror did not have (its HTTPS_PROXY).
const PULL_REFUSAL_PORT: u16 = 5001;

/// Plays kubelet for one node of the local Kubernetes.
#[derive(Debug, Parser)]
#[command(name = "noops-node", version)]
struct Args {
    /// Kubeconfig with the node's client certificate (CN=system:node:<name>).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    #[arg(long, default_value = "noops-node-1")]
    node_name: String,
    /// The node's address: its kubelet API, and (on the shared bridge of the local Kubernetes)
    /// its pods' gateway and DNS server.
    #[arg(long, default_value = "10.244.1.1")]
    node_ip: Ipv4Addr,
    /// This node's pod addresses (inside the cluster network). A `--machine` takes the range
    /// the controller-manager gives its Node instead.
    #[arg(long, default_value = "10.244.1.0/24")]
    pod_cidr: Ipv4Net,
    /// The cluster's pod network, shared by every node on the bridge.
    #[arg(long, default_value = "10.244.0.0/16")]
    cluster_cidr: Ipv4Net,
    /// This agent is a whole machine (a Machine's VM) in a network namespace of its own: it
    /// makes its bridge, takes its pod range from its Node, routes the other Nodes' ranges to
    /// them and masquerades what its pods send elsewhere (`machine.rs`).
    #[arg(long)]
    machine: bool,
    /// The Node's providerID: which machine of which provider it is.
    #[arg(long)]
    provider_id: Option<String>,
    /// CPUs offered to pods (default: this machine's).
    #[arg(long)]
    cpu: Option<u32>,
    /// Memory offered to pods, in MiB (default: this machine's).
    #[arg(long)]
    memory_mib: Option<u64>,
    /// Pods this node takes at most.
    #[arg(long, default_value_t = 110)]
    max_pods: u32,
    #[arg(long, default_value = "noops0")]
    bridge: String,
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// Folder for pod state (pod folders, address allocations).
    #[arg(long, required_unless_present = "beside_kubelet")]
    state_dir: Option<PathBuf>,
    /// Folder where the local-path provisioner creates volumes.
    #[arg(long)]
    volumes_dir: PathBuf,
    /// The image map (image pattern → local program).
    #[arg(long, required_unless_present = "beside_kubelet")]
    images: Option<PathBuf>,
    /// Runs beside the upstream kubelet of a real node: serves cluster DNS, local-path volumes,
    /// the built images and the refusal of other pulls only (the kubelet registers the Node and
    /// runs the pods).
    #[arg(long)]
    beside_kubelet: bool,
    /// With `--beside-kubelet`: the folder of the images this machine built (OCI layout
    /// tarballs), served as every registry's mirror.
    #[arg(long, requires = "beside_kubelet")]
    images_dir: Option<PathBuf>,
    /// The Kubernetes version the node reports.
    #[arg(long, default_value = "v1.34.4")]
    kubernetes_version: String,
    /// The `kubernetes` Service (ClusterIP:port) that in-cluster clients use.
    #[arg(long, default_value = "10.96.0.1:443")]
    api_service: SocketAddr,
    /// Port of the kubelet API (container logs), on the node IP.
    #[arg(long, default_value_t = 10250)]
    kubelet_port: u16,
    #[arg(long, required_unless_present = "beside_kubelet")]
    tls_cert: Option<PathBuf>,
    #[arg(long, required_unless_present = "beside_kubelet")]
    tls_key: Option<PathBuf>,
    /// CA of the client certificates allowed to call the kubelet API (only the API server's).
    #[arg(long, required_unless_present = "beside_kubelet")]
    client_ca: Option<PathBuf>,
    /// How long the node Lease lasts; it is renewed every quarter of that (the kubelet's 40 s by
    /// default; the local Kubernetes uses less so that a dead node is noticed in seconds).
    #[arg(long, default_value = "40", value_name = "SECONDS")]
    node_lease_seconds: u32,
    /// First back-off before restarting a crashed container (doubles up to 5 minutes).
    #[arg(long, default_value = "10", value_name = "SECONDS")]
    crash_backoff_seconds: u64,
    /// How often a running pod's ConfigMap, Secret, downward API and token files are written
    /// again (the kubelet's `--sync-frequency`, 1 minute by default; the local Kubernetes uses
    /// less so that a renewed certificate reaches its pods in seconds).
    #[arg(long, default_value = "60", value_name = "SECONDS")]
    sync_frequency_seconds: u64,
    /// A path of this machine that containers must not read (the cluster's state, keys and
    /// kubeconfigs); repeatable. Containers see an empty folder (or file) there.
    #[arg(long = "private-path", value_name = "PATH")]
    private_paths: Vec<PathBuf>,
    /// On SIGTERM, go on serving this long before stopping the pods: a load balancer in front
    /// of a machine takes it out meanwhile (the API server's shutdown delay, for a VM).
    #[arg(long, default_value_t = 0, value_name = "SECONDS")]
    shutdown_delay_seconds: u64,
    /// Logs as JSON lines instead of text.
    #[arg(long)]
    log_json: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_logging(args.log_json);
    let _ = rustls::crypto::ring::default_provider().install_default();

    // Renewed certificates reach the agent through its kubeconfig file.
    let (client, follow_kubeconfig) = credentials::following(&args.kubeconfig).await?;
    let credentials_task = tokio::spawn(follow_kubeconfig);
    if args.beside_kubelet {
        let served = serve_beside_kubelet(client, args).await;
        credentials_task.abort();
        return served;
    }
    let (Some(state_dir), Some(image_map), Some(tls_cert), Some(tls_key), Some(client_ca)) = (
        args.state_dir.clone(),
        args.images.clone(),
        args.tls_cert.clone(),
        args.tls_key.clone(),
        args.client_ca.clone(),
    ) else {
        anyhow::bail!(
            "--state-dir, --images, --tls-cert, --tls-key and --client-ca are needed unless --beside-kubelet"
        );
    };

    // Image paths may name folders of this checkout through ${NOOPS_ROOT}, ${NOOPS_BIN}, ...
    let vars: BTreeMap<String, String> = std::env::vars().filter(|(k, _)| k.starts_with("NOOPS_")).collect();
    let images = ImageMapFileWatch::load(&image_map, vars)?;
    // A machine learns its range later, from its Node.
    let known_pod_cidr = if args.machine {
        None
    } else {
        anyhow::ensure!(
            args.pod_cidr.contains(args.node_ip),
            "--node-ip {} is outside --pod-cidr {}",
            args.node_ip,
            args.pod_cidr
        );
        anyhow::ensure!(
            args.cluster_cidr.contains(args.pod_cidr.network()) && args.cluster_cidr.prefix <= args.pod_cidr.prefix,
            "--pod-cidr {} is outside --cluster-cidr {}",
            args.pod_cidr,
            args.cluster_cidr
        );
        Some(args.pod_cidr)
    };

    process::self_check(&state_dir).await.with_context(|| {
        format!(
            "containers cannot get a root file system of their own here: it needs overlayfs with {} \
             on a file system that can hold its upper layer (not overlayfs), and open_tree, \
             move_mount and mount_setattr (Linux 5.12 or later)",
            state_dir.display()
        )
    })?;

    let cgroups = cgroups::Cgroups::detect(&state_dir);
    let agent_cgroups = cgroups.enabled();
    let (cpu, memory_bytes) = NodeInfo::detect_capacity();
    let node = NodeInfo {
        name: args.node_name.clone(),
        ip: args.node_ip,
        pod_cidr: known_pod_cidr.map(|c| c.to_string()),
        provider_id: args.provider_id.clone(),
        kubelet_port: args.kubelet_port,
        kubernetes_version: args.kubernetes_version.clone(),
        cpu: args.cpu.unwrap_or(cpu),
        memory_bytes: args.memory_mib.map_or(memory_bytes, |m| m * 1024 * 1024),
        max_pods: args.max_pods,
        lease_seconds: args.node_lease_seconds.max(4),
    };
    // A machine's Node is made first without a status: it is Ready only once its network is.
    node::create(&client, &node).await.context("registering the node")?;

    // On the shared bridge the node's address is its pods' gateway and the whole cluster network
    // is on their link; a machine learns its range from its Node, then makes its own network.
    let (pod_cidr, gateway, on_link) = match known_pod_cidr {
        Some(cidr) => (cidr, args.node_ip, args.cluster_cidr),
        None => {
            let cidr = machine::wait_for_pod_cidr(&client, &args.node_name).await;
            anyhow::ensure!(
                args.cluster_cidr.contains(cidr.network()),
                "the Node's pod range {cidr} is outside --cluster-cidr {}",
                args.cluster_cidr
            );
            let gateway = cidr.first_host();
            machine::set_up_network(&args.bridge, gateway, cidr)
                .await
                .context("making the machine's bridge")?;
            machine::masquerade(args.cluster_cidr)
                .await
                .context("masquerading what pods send outside the cluster network")?;
            info!(pod_cidr = %cidr, gateway = %gateway, "machine network ready");
            (cidr, gateway, cidr)
        }
    };
    let network = PodNetwork::new(
        args.bridge.clone(),
        args.node_name.clone(),
        pod_cidr,
        on_link,
        gateway,
        &state_dir,
    );
    network.check_bridge()?;
    node::register(&client, &node)
        .await
        .context("reporting the node's status")?;
    let routed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let routes_task = args.machine.then(|| {
        tokio::spawn(machine::route_to_nodes(
            client.clone(),
            args.node_name.clone(),
            args.cluster_cidr,
            routed.clone(),
        ))
    });
    let health_task = args.machine.then(|| {
        tokio::spawn(machine::serve_health(
            SocketAddr::from(([0, 0, 0, 0], HEALTH_PORT)),
            routed.clone(),
        ))
    });

    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let api_service = match args.api_service {
        SocketAddr::V4(a) => (*a.ip(), a.port()),
        SocketAddr::V6(_) => anyhow::bail!("--api-service must be an IPv4 address"),
    };
    let pods_dir = state_dir.join("pods");
    let agent = Arc::new(pods::Agent {
        client: client.clone(),
        node: node.clone(),
        images,
        network,
        pods_dir: pods_dir.clone(),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "noops-node".into(),
                instance: Some(args.node_name.clone()),
            },
        ),
        cluster_domain: args.cluster_domain.clone(),
        gateway,
        api_service,
        crash_backoff: Duration::from_secs(args.crash_backoff_seconds.max(1)),
        sync_frequency: Duration::from_secs(args.sync_frequency_seconds.max(1)),
        private_paths: args.private_paths.clone(),
        cgroups,
    });

    let dns = dns::ClusterDns::new(client.clone(), args.cluster_domain.clone());
    let dns_task = tokio::spawn(dns.serve(SocketAddr::from((gateway, 53))));
    // A machine's Node may not make PersistentVolumes in its cluster: local volumes are the
    // local Kubernetes' alone.
    let provisioner_task = (!args.machine).then(|| {
        tokio::spawn(provisioner::run(
            client.clone(),
            args.node_name.clone(),
            args.volumes_dir.clone(),
        ))
    });
    let kubelet_api = kubelet_api::KubeletApi {
        pods_dir,
        client: client.clone(),
    };
    let tls = kubelet_api::TlsFiles {
        cert: tls_cert,
        key: tls_key,
        client_ca,
    };
    let api_task = tokio::spawn(kubelet_api.serve(SocketAddr::from((args.node_ip, args.kubelet_port)), tls));
    let heartbeat_task = tokio::spawn(node::heartbeat(client.clone(), node));
    let pods_task = tokio::spawn(pods::run(agent, shutdown_rx));
    info!(node = %args.node_name, ip = %args.node_ip, cgroups = agent_cgroups, "node agent running");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: stopping pods"),
        _ = tokio::signal::ctrl_c() => info!("interrupted: stopping pods"),
        r = dns_task => anyhow::bail!("cluster DNS stopped: {r:?}"),
        r = api_task => anyhow::bail!("kubelet API stopped: {r:?}"),
    }
    if args.shutdown_delay_seconds > 0 {
        info!(
            seconds = args.shutdown_delay_seconds,
            "serving on a while before stopping pods"
        );
        tokio::time::sleep(Duration::from_secs(args.shutdown_delay_seconds)).await;
    }
    let _ = shutdown_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(12), pods_task).await;
    heartbeat_task.abort();
    credentials_task.abort();
    for task in [provisioner_task, routes_task].into_iter().flatten() {
        task.abort();
    }
    if let Some(task) = health_task {
        task.abort();
    }
    info!("node agent stopped");
    Ok(())
}

/// A real node's share: cluster DNS at the node's address (its pods' resolver), the local-path
/// volumes of claims bound to this node, the built images as every registry's mirror, and the
/// refusal of pulls that would leave this machine. Runs until SIGTERM.
async fn serve_beside_kubelet(client: kube::Client, args: Args) -> anyhow::Result<()> {
    let shelf = registry::Shelf::open(args.images_dir.as_deref())
        .with_context(|| format!("reading the built images in {:?}", args.images_dir))?;
    let shelf = Arc::new(shelf);
    let registry_task = tokio::spawn(registry::serve(
        SocketAddr::from((args.node_ip, REGISTRY_PORT)),
        shelf.clone(),
    ));
    let dns = dns::ClusterDns::new(client.clone(), args.cluster_domain.clone());
    let dns_task = tokio::spawn(dns.serve(SocketAddr::from((args.node_ip, 53))));
    let refusal_task = tokio::spawn(pull_refusal::serve(
        SocketAddr::from((args.node_ip, PULL_REFUSAL_PORT)),
        shelf,
    ));
    let provisioner_task = tokio::spawn(provisioner::run(client, args.node_name.clone(), args.volumes_dir));
    info!(node = %args.node_name, ip = %args.node_ip, "serving DNS, volumes and images beside the kubelet");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let outcome = tokio::select! {
        _ = term.recv() => Ok(()),
        _ = tokio::signal::ctrl_c() => Ok(()),
        r = dns_task => Err(anyhow::anyhow!("cluster DNS stopped: {r:?}")),
        r = refusal_task => Err(anyhow::anyhow!("the pull refusal stopped: {r:?}")),
        r = registry_task => Err(anyhow::anyhow!("the registry stopped: {r:?}")),
    };
    provisioner_task.abort();
    outcome
}

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::stdout().is_terminal());
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
