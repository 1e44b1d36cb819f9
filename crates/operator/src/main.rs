//! `noops`: the operator binary.
//!
//! - `noops run` runs the controllers (all, or those named), over all namespaces or the ones
//!   named, with leader election on a Lease, `/metrics`, `/healthz` and `/readyz`, and a graceful
//!   shutdown on SIGTERM.
//! - `noops crds` prints every CRD as YAML.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use noops::core::metrics::Metrics;
use noops::leader::{Elector, Timing};
use noops::server::{Health, serve};
use tokio::sync::watch;
use tracing::{info, warn};

#[derive(Debug, Parser)]
#[command(name = "noops", version, about = "Kubernetes operators for stateful services")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the controllers.
    Run(RunArgs),
    /// Print every CRD as YAML.
    Crds,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ControllerName {
    Maintpage,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Controllers to run (comma separated); all by default.
    #[arg(long, value_delimiter = ',', env = "NOOPS_CONTROLLERS")]
    controllers: Vec<ControllerName>,
    /// Namespaces to watch (comma separated); all namespaces by default.
    #[arg(long, value_delimiter = ',', env = "NOOPS_NAMESPACES")]
    namespaces: Vec<String>,
    /// Elect a leader among replicas through a Lease, so only one reconciles.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "NOOPS_LEADER_ELECT")]
    leader_elect: bool,
    /// Namespace of the leader Lease (defaults to the pod's namespace, else `default`).
    #[arg(long, env = "NOOPS_LEADER_ELECTION_NAMESPACE")]
    leader_election_namespace: Option<String>,
    #[arg(long, default_value = "noops-operator")]
    lease_name: String,
    /// Seconds a leader lease lasts without renewal.
    #[arg(long, default_value_t = 15)]
    lease_duration_seconds: u64,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "127.0.0.1:8080", env = "NOOPS_HTTP_ADDR")]
    http_addr: SocketAddr,
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "NOOPS_LOG_FORMAT")]
    log_format: LogFormat,
}

fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube_runtime=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crds => {
            print!("{}", noops::crds_yaml().map_err(anyhow::Error::msg)?);
            Ok(())
        }
        Command::Run(args) => run(args).await,
    }
}

fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()))
        .unwrap_or_else(|_| "noops".into());
    format!("{host}-{}", std::process::id())
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = kube::Client::try_default()
        .await
        .context("no Kubernetes client configuration (KUBECONFIG or in-cluster)")?;
    let version = client
        .apiserver_version()
        .await
        .context("cannot reach the API server")?;
    let controllers = if args.controllers.is_empty() {
        vec![ControllerName::Maintpage]
    } else {
        args.controllers.clone()
    };
    info!(server = %version.git_version, ?controllers, namespaces = ?args.namespaces, "noops operator starting");

    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health {
        metrics: metrics.clone(),
        ready: Default::default(),
    });
    let server = tokio::spawn(serve(args.http_addr, health.clone()));

    // `stop` flips on SIGTERM or Ctrl-C; `halt` flips when controllers must end (stop, or the
    // lease is lost).
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM");
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => info!("SIGTERM: shutting down"),
            _ = tokio::signal::ctrl_c() => info!("interrupted: shutting down"),
        }
        let _ = stop_tx.send(true);
    });

    let (leading_tx, mut leading) = watch::channel(!args.leader_elect);
    // Flipped once the controllers have stopped: only then may the leader give the lease up.
    let (release_tx, release_rx) = watch::channel(false);
    let mut elector_task = None;
    if args.leader_elect {
        let namespace = args
            .leader_election_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "default".into());
        let timing = Timing {
            lease_duration: std::time::Duration::from_secs(args.lease_duration_seconds.max(2)),
            ..Timing::default()
        };
        let elector = Elector::new(client.clone(), &namespace, &args.lease_name, identity(), timing);
        info!(lease = %format!("{namespace}/{}", args.lease_name), identity = %elector.identity(), "campaigning for leadership");
        elector_task = Some(tokio::spawn(elector.run(leading_tx, release_rx)));
    }
    health.ready.store(true, Ordering::Relaxed);

    let mut stop = stop_rx.clone();
    loop {
        if *leading.borrow_and_update() {
            break;
        }
        tokio::select! {
            changed = leading.changed() => if changed.is_err() { anyhow::bail!("leader election ended") },
            _ = stop.changed() => return Ok(()),
        }
    }
    metrics.set_leader(true);

    let (halt_tx, halt_rx) = watch::channel(false);
    let lost = {
        let mut leading = leading.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let lost = tokio::select! {
                _ = leading.wait_for(|l| !*l) => true,
                _ = stop.changed() => false,
            };
            let _ = halt_tx.send(true);
            lost
        })
    };
    let namespaces: Vec<Option<String>> = if args.namespaces.is_empty() {
        vec![None]
    } else {
        args.namespaces.iter().cloned().map(Some).collect()
    };
    let mut tasks = vec![];
    for controller in &controllers {
        for namespace in &namespaces {
            let mut halt = halt_rx.clone();
            let shutdown = async move {
                let _ = halt.wait_for(|h| *h).await;
            };
            tasks.push(match controller {
                ControllerName::Maintpage => tokio::spawn(noops::maintpage::run(
                    client.clone(),
                    namespace.clone(),
                    metrics.clone(),
                    shutdown,
                )),
            });
        }
    }
    futures::future::join_all(tasks).await;
    metrics.set_leader(false);
    server.abort();
    if lost.await.unwrap_or(false) {
        anyhow::bail!("lost leadership; exiting so that a fresh start campaigns again");
    }
    let _ = release_tx.send(true);
    if let Some(task) = elector_task {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), task).await;
    }
    info!("noops operator stopped");
    Ok(())
}
