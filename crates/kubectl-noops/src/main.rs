//! `kubectl noops`: the state of a noops resource at a glance, with what lies around it (its
//! backups, its certificates, its last warnings), as text or JSON.
//!
//! `report` writes a tar.gz for a support request (`bundle.rs`); `backup` takes one
//! (`backup.rs`); `promote` asks for a PostgreSQL switchover (`promote.rs`).
//!
//! Install: put `kubectl-noops` on your PATH (`make setup` builds it into `.noops/bin`);
//! kubectl finds it as `kubectl noops`. It reads the kubeconfig kubectl would (`KUBECONFIG`,
//! `--kubeconfig`); `status` and `report` need only get/list on the resources, Events and
//! Secrets' metadata; `backup`, `promote`, `pause` and `resume` also write.
//!
//! Exit codes, for scripts: 0 the resource is Ready, 2 it is not (or is paused), 1 it could
//! not be read.

mod backup;
mod bundle;
mod kinds;
mod promote;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand, ValueEnum};
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, ListParams};
use kube::{Client, Resource, ResourceExt};
use noops_api::{
    EtcdBackup, EtcdCluster, KubernetesCluster, KubernetesControlPlane, MaintPage, PostgreSQL, PostgresBackup,
};

use kinds::Around;
use report::Report;

/// The annotation on a certificate Secret the operator issued: when it expires.
const NOT_AFTER_ANNOTATION: &str = "noops.dev/not-after";

#[derive(Parser)]
#[command(name = "kubectl-noops", version, about = "The state of noops resources at a glance")]
struct Cli {
    /// The namespace (default: the kubeconfig context's).
    #[arg(short, long, global = true)]
    namespace: Option<String>,
    /// The kubeconfig (default: KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A resource's state: `etcdcluster/<name>` (`etcd/`), `postgresql/<name>` (`pg/`),
    /// `maintpage/<name>` (`mp/`), `kubernetescluster/<name>` (`kc/`),
    /// `kubernetescontrolplane/<name>` (`kcp/`).
    Status {
        resource: String,
        #[arg(short, long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Takes a backup now (an EtcdBackup or a PostgresBackup) and waits for it, a line per
    /// change; exit code 0 once it is stored, 1 if it fails.
    Backup {
        resource: String,
        /// How long to wait, in seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Writes a tar.gz for a support request: the resource, what it owns and its backups,
    /// their Events, the logs of its pods and of the operator, and its status; no secret.
    Report {
        resource: String,
        /// Where to write it (default: `noops-report-<kind>-<name>-<time>.tar.gz` here).
        #[arg(short = 'f', long)]
        output: Option<PathBuf>,
        /// Where the operator's pods run.
        #[arg(long, default_value = "noops-system")]
        operator_namespace: String,
        /// The label selector of the operator's pods.
        #[arg(long, default_value = "app.kubernetes.io/name=noops-operator")]
        operator_selector: String,
        /// How many of the last lines of each log to take.
        #[arg(long, default_value_t = 5000)]
        log_lines: i64,
    },
    /// A switchover: makes `instance` the primary of `postgresql/<name>` (`pg/`), once the
    /// primary has stepped down cleanly and the instance has all of its WAL; waits for it.
    /// Refused for an instance that does not stream or lags too far behind.
    Promote {
        resource: String,
        instance: String,
        /// How long to wait, in seconds.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Stops the operator changing the resource (`spec.paused`).
    Pause { resource: String },
    /// Lets the operator change the resource again.
    Resume { resource: String },
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Text,
    Json,
}

/// The kinds the plugin reports on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    EtcdCluster,
    PostgreSQL,
    MaintPage,
    KubernetesCluster,
    KubernetesControlPlane,
}

/// `kind/name` as kubectl takes it (plural, singular or short name, any case).
fn parse_resource(text: &str) -> anyhow::Result<(Kind, String)> {
    let Some((kind, name)) = text.split_once('/').filter(|(_, n)| !n.is_empty()) else {
        bail!("name a resource as <kind>/<name>, such as etcdcluster/main or pg/shop");
    };
    let kind = match kind.to_lowercase().split('.').next().unwrap_or_default() {
        "etcdcluster" | "etcdclusters" | "etcd" => Kind::EtcdCluster,
        "postgresql" | "postgresqls" | "pg" => Kind::PostgreSQL,
        "maintpage" | "maintpages" | "mp" => Kind::MaintPage,
        "kubernetescluster" | "kubernetesclusters" | "kc" => Kind::KubernetesCluster,
        "kubernetescontrolplane" | "kubernetescontrolplanes" | "kcp" => Kind::KubernetesControlPlane,
        other => bail!(
            "kubectl noops knows etcdcluster, postgresql, maintpage, kubernetescluster and kubernetescontrolplane, not {other:?}"
        ),
    };
    Ok((kind, name.to_string()))
}

async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<Client> {
    // kube links ring for TLS: say so once, as more than one provider may be linked.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = match kubeconfig {
        Some(path) => {
            let file =
                kube::config::Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(Client::try_from(config)?)
}

/// Reads what lies around the resource with `meta`: certificate Secrets it owns, its Warning
/// Events.
async fn around(client: &Client, namespace: &str, meta: &kube::api::ObjectMeta) -> anyhow::Result<Around> {
    let uid = meta.uid.clone().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut certificates: Vec<(String, jiff::Timestamp)> = secrets
        .list_metadata(&ListParams::default())
        .await
        .context("listing Secrets (their metadata only)")?
        .items
        .into_iter()
        .filter(|s| s.owner_references().iter().any(|o| o.uid == uid))
        .filter_map(|s| {
            let at = s.annotations().get(NOT_AFTER_ANNOTATION)?.parse().ok()?;
            Some((s.name_any(), at))
        })
        .collect();
    certificates.sort();
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let warnings = events
        .list(&ListParams::default().fields(&format!("involvedObject.uid={uid},type=Warning")))
        .await
        .context("listing Events")?
        .items
        .into_iter()
        .filter_map(|e| {
            let when = e
                .series
                .as_ref()
                .and_then(|s| s.last_observed_time.as_ref())
                .map(|t| t.0)
                .or(e.last_timestamp.as_ref().map(|t| t.0))
                .or(e.event_time.as_ref().map(|t| t.0))?;
            Some((when, e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        })
        .collect();
    Ok(Around {
        now: jiff::Timestamp::now(),
        certificates,
        warnings,
        ..Default::default()
    })
}

async fn status(client: &Client, namespace: &str, kind: Kind, name: &str) -> anyhow::Result<Report> {
    let not_found = |what: &str| format!("reading {what} {namespace}/{name}");
    Ok(match kind {
        Kind::EtcdCluster => {
            let cluster = Api::<EtcdCluster>::namespaced(client.clone(), namespace)
                .get(name)
                .await
                .with_context(|| not_found("EtcdCluster"))?;
            let mut around = around(client, namespace, cluster.meta()).await?;
            around.backups = Api::<EtcdBackup>::namespaced(client.clone(), namespace)
                .list(&ListParams::default())
                .await
                .context("listing EtcdBackups")?
                .items
                .into_iter()
                .filter(|b| b.spec.cluster == name)
                .map(|b| (b.name_any(), b.status.map(|s| s.progress).unwrap_or_default()))
                .collect();
            kinds::etcd(&cluster, &around)
        }
        Kind::PostgreSQL => {
            let pg = Api::<PostgreSQL>::namespaced(client.clone(), namespace)
                .get(name)
                .await
                .with_context(|| not_found("PostgreSQL"))?;
            let mut around = around(client, namespace, pg.meta()).await?;
            around.backups = Api::<PostgresBackup>::namespaced(client.clone(), namespace)
                .list(&ListParams::default())
                .await
                .context("listing PostgresBackups")?
                .items
                .into_iter()
                .filter(|b| b.spec.postgresql == name)
                .map(|b| (b.name_any(), b.status.map(|s| s.progress).unwrap_or_default()))
                .collect();
            kinds::postgres(&pg, &around)
        }
        Kind::MaintPage => {
            let page = Api::<MaintPage>::namespaced(client.clone(), namespace)
                .get(name)
                .await
                .with_context(|| not_found("MaintPage"))?;
            let around = around(client, namespace, page.meta()).await?;
            kinds::maintpage(&page, &around)
        }
        Kind::KubernetesCluster => {
            let kc = Api::<KubernetesCluster>::namespaced(client.clone(), namespace)
                .get(name)
                .await
                .with_context(|| not_found("KubernetesCluster"))?;
            let around = around(client, namespace, kc.meta()).await?;
            kinds::kubernetes_cluster(&kc, &around)
        }
        Kind::KubernetesControlPlane => {
            let kcp = Api::<KubernetesControlPlane>::namespaced(client.clone(), namespace)
                .get(name)
                .await
                .with_context(|| not_found("KubernetesControlPlane"))?;
            let around = around(client, namespace, kcp.meta()).await?;
            kinds::control_plane(&kcp, &around)
        }
    })
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let client = client(cli.kubeconfig.as_ref()).await?;
    let namespace = cli
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    match cli.command {
        Command::Status { resource, output } => {
            let (kind, name) = parse_resource(&resource)?;
            let report = status(&client, &namespace, kind, &name).await?;
            match output {
                Output::Text => print!("{}", report.text()),
                Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
            Ok(if report.ready && !report.paused {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            })
        }
        Command::Backup { resource, timeout } => {
            let (kind, name) = parse_resource(&resource)?;
            let deadline = std::time::Duration::from_secs(timeout);
            backup::take(&client, &namespace, kind, &name, deadline).await
        }
        Command::Report {
            resource,
            output,
            operator_namespace,
            operator_selector,
            log_lines,
        } => {
            let (kind, name) = parse_resource(&resource)?;
            let options = bundle::Options {
                output,
                operator_namespace,
                operator_selector,
                log_lines,
            };
            let (path, summary) = bundle::write(&client, &namespace, kind, &name, &options).await?;
            println!("wrote {}: {summary}", path.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Promote {
            resource,
            instance,
            timeout,
        } => {
            let (kind, name) = parse_resource(&resource)?;
            if kind != Kind::PostgreSQL {
                bail!("only a PostgreSQL has instances to promote (pg/<name>)");
            }
            let deadline = std::time::Duration::from_secs(timeout);
            promote::promote(&client, &namespace, &name, &instance, deadline).await
        }
        Command::Pause { resource } => set_paused(&client, &namespace, &resource, true).await,
        Command::Resume { resource } => set_paused(&client, &namespace, &resource, false).await,
    }
}

/// Sets `spec.paused` of a resource that has it.
async fn set_paused(client: &Client, namespace: &str, resource: &str, paused: bool) -> anyhow::Result<ExitCode> {
    let (kind, name) = parse_resource(resource)?;
    let patch = kube::api::Patch::Merge(serde_json::json!({ "spec": { "paused": paused } }));
    let resource = bundle::resource_of(kind);
    let patched = Api::<kube::api::DynamicObject>::namespaced_with(client.clone(), namespace, &resource)
        .patch(&name, &kube::api::PatchParams::default(), &patch)
        .await
        .with_context(|| format!("patching {kind:?} {namespace}/{name}"))?;
    // An API server with older CRDs drops a field it does not know, and says nothing.
    if patched.data["spec"]["paused"].as_bool().unwrap_or(false) != paused {
        bail!(
            "{kind:?} {namespace}/{name} did not take spec.paused: its CRD is older than this plugin (apply deploy/crds/)"
        );
    }
    let what = if paused {
        "paused: the operator changes nothing until it is resumed"
    } else {
        "resumed"
    };
    println!("{kind:?} {namespace}/{name} {what}");
    Ok(ExitCode::SUCCESS)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_are_named_as_kubectl_names_them() {
        for (text, kind) in [
            ("etcdcluster/main", Kind::EtcdCluster),
            ("etcd/main", Kind::EtcdCluster),
            ("EtcdClusters.noops.dev/main", Kind::EtcdCluster),
            ("pg/main", Kind::PostgreSQL),
            ("postgresql/main", Kind::PostgreSQL),
            ("mp/main", Kind::MaintPage),
            ("kc/main", Kind::KubernetesCluster),
            ("kcp/main", Kind::KubernetesControlPlane),
        ] {
            assert_eq!(parse_resource(text).unwrap(), (kind, "main".to_string()), "{text}");
        }
        assert!(parse_resource("main").is_err());
        assert!(parse_resource("etcd/").is_err());
        assert!(parse_resource("deployment/main").is_err());
    }
}
