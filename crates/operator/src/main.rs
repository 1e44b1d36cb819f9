//! `noops`: the operator binary.
//!
//! - `noops run` runs the controllers (all, or those named), over all namespaces or the ones
//!   named, with leader election on a Lease, `/metrics`, `/healthz` and `/readyz`, and a graceful
//!   shutdown on SIGTERM.
//! - `noops crds` prints every CRD as YAML.
//! - `noops fetch-snapshot | save-snapshot | delete-snapshot | install-restored` are what the
//!   pods of etcd's backups and restores run (`noops::etcd::agent`), and `noops pg-instance`
//!   what a PostgreSQL's pods run (`noops::postgres::instance`).
//!
//! This file only parses the command line and hands each command to its place.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::Context as _;
use clap::builder::{PossibleValue, PossibleValuesParser};
use clap::{Parser, Subcommand, ValueEnum};
use noops::core::controller::Runtime;
use noops::core::metrics::Metrics;
use noops::leader::{Elector, Outcome, Timing};
use noops::server::{Health, serve};
use tokio::sync::watch;
use tracing::{error, info, warn};

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
    /// The programs of etcd's backup and restore pods.
    #[command(flatten)]
    EtcdAgent(noops::etcd::agent::cli::EtcdAgentCommand),
    /// The PostgreSQL instance manager, run in the pod of a PostgreSQL.
    #[command(subcommand)]
    PgInstance(noops::postgres::instance::cli::PgInstanceCommand),
}

/// The controllers `--controllers` accepts: every registered one.
fn controller_names() -> PossibleValuesParser {
    PossibleValuesParser::new(
        noops::CONTROLLERS
            .iter()
            .map(|c| PossibleValue::new(c.name).help(c.about)),
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Controllers to run (comma separated); all by default.
    #[arg(long, value_delimiter = ',', env = "NOOPS_CONTROLLERS", value_parser = controller_names())]
    controllers: Vec<String>,
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
    /// The operator's own image, which helper containers run (a restore pod fetching an etcd
    /// snapshot). Set it to the image the operator runs from.
    #[arg(long, env = "NOOPS_IMAGE", default_value = concat!("ghcr.io/noops-dev/noops:", env!("CARGO_PKG_VERSION")))]
    image: String,
    /// A registry (and path) holding the etcd and PostgreSQL images under their projects' paths
    /// (`<registry>/coreos/etcd`, `<registry>/library/postgres`), for a mirror or a cluster that
    /// cannot reach the public registries. A resource's `spec.imageRepository` wins over it.
    #[arg(long, env = "NOOPS_IMAGE_REGISTRY")]
    image_registry: Option<String>,
    /// Secrets to pull images with (comma separated), for a registry that asks for
    /// credentials: every pod the operator makes for etcd, PostgreSQL, a control plane, a
    /// MaintPage or a machine names them in `imagePullSecrets`. Each must exist in the
    /// namespaces of those pods.
    #[arg(long, value_delimiter = ',', env = "NOOPS_IMAGE_PULL_SECRETS")]
    image_pull_secrets: Vec<String>,
    /// Seconds the leaf certificates the operator issues are valid (etcd's peer, server and
    /// client certificates; a control plane's serving, client and kubeconfig certificates); each
    /// is issued again with a third of that left. Keep that third well above the time kubelets
    /// take to update a mounted Secret (about a minute).
    #[arg(
        long,
        alias = "etcd-certificate-lifetime-seconds",
        default_value_t = 365 * 24 * 3600,
        env = "NOOPS_CERTIFICATE_LIFETIME_SECONDS",
        value_parser = clap::value_parser!(u64).range(60..)
    )]
    certificate_lifetime_seconds: u64,
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
    // Every subcommand may speak TLS (the API server, etcd, S3): one provider for the process.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match cli.command {
        Command::Crds => {
            print!("{}", noops::crds_yaml().map_err(anyhow::Error::msg)?);
            Ok(())
        }
        Command::Run(args) => run(args).await,
        Command::EtcdAgent(command) => Ok(noops::etcd::agent::cli::run(command).await?),
        Command::PgInstance(command) => {
            init_logging(LogFormat::Text);
            noops::postgres::instance::cli::run(command).await
        }
    }
}

fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()))
        .unwrap_or_else(|_| "noops".into());
    format!("{host}-{}", std::process::id())
}

/// A flag that flips on SIGTERM or Ctrl-C.
fn stop_on_signal() -> watch::Receiver<bool> {
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
    stop_rx
}

/// The leader election `args` ask for.
fn elector(args: &RunArgs, client: &kube::Client) -> Elector {
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
    elector
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let metrics = Arc::new(Metrics::new());
    let config = kube::Config::infer()
        .await
        .context("no Kubernetes client configuration (KUBECONFIG or in-cluster)")?;
    // Every request is counted (noops_api_requests_total): a settled cluster should cost none.
    let client_of = |config: kube::Config| -> anyhow::Result<kube::Client> {
        Ok(kube::client::ClientBuilder::try_from(config)
            .context("cannot make a Kubernetes client")?
            .with_layer(&metrics.count_requests())
            .build())
    };
    let mut asking_once = config.clone();
    asking_once.default_retry = false;
    let client_asking_once = client_of(asking_once)?;
    let client = client_of(config)?;
    let version = client
        .apiserver_version()
        .await
        .context("cannot reach the API server")?;
    let controllers: Vec<_> = noops::CONTROLLERS
        .iter()
        .copied()
        .filter(|c| args.controllers.is_empty() || args.controllers.iter().any(|n| n == c.name))
        .collect();
    let names: Vec<&str> = controllers.iter().map(|c| c.name).collect();
    info!(server = %version.git_version, controllers = ?names, namespaces = ?args.namespaces, "noops operator starting");

    let health = Arc::new(Health {
        metrics: metrics.clone(),
        ready: Default::default(),
    });
    let server = tokio::spawn(serve(args.http_addr, health.clone()));

    let stop_rx = stop_on_signal();
    let elector = args.leader_elect.then(|| elector(&args, &client));
    health.ready.store(true, Ordering::Relaxed);

    let namespaces: Vec<Option<String>> = if args.namespaces.is_empty() {
        vec![None]
    } else {
        args.namespaces.iter().cloned().map(Some).collect()
    };
    let image = args.image.clone();
    let images = noops::core::images::Images {
        registry: args.image_registry.clone(),
        pull_secrets: args.image_pull_secrets.clone(),
    };
    let certificate_lifetime = std::time::Duration::from_secs(args.certificate_lifetime_seconds);
    let leader_metric = metrics.clone();
    let outcome = noops::leader::run_while_leading(
        elector,
        stop_rx,
        move |leading| leader_metric.set_leader(leading),
        |shutdown| async move {
            // A JoinSet aborts its tasks when dropped, as happens when the lease is lost.
            let mut tasks = tokio::task::JoinSet::new();
            for controller in &controllers {
                for namespace in &namespaces {
                    tasks.spawn((controller.run)(Runtime {
                        client: client.clone(),
                        client_asking_once: client_asking_once.clone(),
                        namespace: namespace.clone(),
                        metrics: metrics.clone(),
                        shutdown: shutdown.clone(),
                        image: image.clone(),
                        certificate_lifetime,
                        images: images.clone(),
                    }));
                }
            }
            while tasks.join_next().await.is_some() {}
        },
    )
    .await;
    server.abort();
    let why = match outcome {
        Outcome::Stopped | Outcome::NeverLed => {
            info!("noops operator stopped");
            return Ok(());
        }
        Outcome::LostLease => "lost leadership; exiting so that a fresh start campaigns again",
        Outcome::StuckStopping => "the controllers did not stop in time; exiting to end them",
        Outcome::WorkEnded => "the controllers stopped on their own; exiting so that a fresh start runs them",
        Outcome::ElectionFailed => "the leader election ended unexpectedly",
    };
    // Exit at once: no backtrace to capture, no runtime to wind down while a lease runs out.
    error!("{why}");
    std::process::exit(1)
}
