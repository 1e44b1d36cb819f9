//! `kubectl noops`: the state of noops resources at a glance, with what lies around them (their
//! backups, certificates, last warnings), as text or JSON.
//!
//! `status` reads and reports (`status.rs`, `kinds.rs`); `get` lists every noops resource
//! (`get.rs`); `describe` draws a KubernetesCluster's tree (`describe.rs`, `tree.rs`);
//! `kubeconfig` gives a tenant's admin kubeconfig (`kubeconfig.rs`); `report` writes a tar.gz
//! for a support request (`bundle.rs`); `backup` takes one (`backup.rs`); `promote` asks for a
//! PostgreSQL switchover (`promote.rs`); `completion` prints shell completion (`completion.rs`).
//!
//! Install: put `kubectl-noops` on your PATH (`make setup` builds it into `.noops/bin`);
//! kubectl finds it as `kubectl noops`. It reads the kubeconfig kubectl would (`KUBECONFIG`,
//! `--kubeconfig`, `--context`); `status`, `get` and `describe` need only get/list on the
//! resources, Events and Secrets' metadata; `kubeconfig` reads one Secret; `backup`,
//! `promote`, `pause` and `resume` also write.
//!
//! Exit codes, for scripts: 0 the resource is Ready, 2 it is not (or is paused), 1 it could
//! not be read.

mod backup;
mod bundle;
mod completion;
mod connect;
mod describe;
mod etcdctl;
mod get;
mod kinds;
mod kubeconfig;
mod promote;
mod psql;
mod report;
mod resources;
mod status;
mod tree;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::{CommandFactory as _, Parser, Subcommand, ValueEnum, ValueHint};
use kube::Client;
use kube::api::Api;

use connect::Target;
use resources::{Kind, parse_resource};

#[derive(Parser)]
#[command(name = "kubectl-noops", version, about = "The state of noops resources at a glance")]
struct Cli {
    /// The namespace (default: the kubeconfig context's).
    #[arg(short, long, global = true)]
    namespace: Option<String>,
    /// The kubeconfig (default: KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true, value_hint = ValueHint::FilePath)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current-context).
    #[arg(long, global = true)]
    context: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A resource's state: `etcdcluster/<name>` (`etcd/`), `etcdbackup/<name>`,
    /// `postgresql/<name>` (`pg/`), `postgresbackup/<name>` (`pgbackup/`), `maintpage/<name>`
    /// (`mp/`), `kubernetescluster/<name>` (`kc/`), `kubernetescontrolplane/<name>` (`kcp/`),
    /// `machinedeployment/<name>` (`md/`), `machineset/<name>` (`ms/`), `machine/<name>`
    /// (`ma/`).
    Status {
        resource: String,
        #[arg(short, long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Every noops resource of the namespace: kind, name, Ready (a backup's Succeeded), phase,
    /// age and the reason. Kinds whose CRD is not installed are left out; kinds you may not
    /// list are named below the table.
    Get {
        /// Every namespace, with a NAMESPACE column.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
    /// The tree of a KubernetesCluster (`kc/<name>`): its control plane, that one's
    /// EtcdCluster, each pool's MachineDeployment, their MachineSets and Machines, each with
    /// its Ready condition and reason, and each machine's node.
    Describe { resource: String },
    /// The admin kubeconfig of a tenant cluster, `kc/<name>` or `kcp/<name>`: the key
    /// `kubeconfig` of the Secret its status names (`<name>-admin-kubeconfig`). Its server is
    /// the ClusterIP of the API servers' Service, which works from pods and from the machine
    /// the local Kubernetes runs on; the operator writes no other variant.
    Kubeconfig {
        resource: String,
        /// Write it to this file (mode 0600) instead of standard output.
        #[arg(short = 'f', long, value_hint = ValueHint::FilePath)]
        output: Option<PathBuf>,
        /// The kubeconfig for the API servers' Service (from pods and this cluster's nodes),
        /// even when the control plane has an external endpoint.
        #[arg(long)]
        internal: bool,
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
        #[arg(short = 'f', long, value_hint = ValueHint::FilePath)]
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
    /// psql in the primary's pod of `postgresql/<name>` (`pg/`), on its database, as the
    /// superuser over the pod's socket (`kubectl exec`: needs a kubelet that streams, not the
    /// node agent). Arguments after `--` go to psql.
    Psql {
        resource: String,
        /// An instance's pod instead of the primary's.
        #[arg(long)]
        instance: Option<String>,
        #[arg(last = true)]
        psql_args: Vec<String>,
    },
    /// etcdctl against `etcdcluster/<name>` (`etcd/`) with its client certificate, from a
    /// short-lived pod of the members' image; arguments after `--` go to etcdctl. Prints its
    /// output and exits with its exit code.
    Etcdctl {
        resource: String,
        /// How long to wait, in seconds.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
        #[arg(last = true)]
        etcdctl_args: Vec<String>,
    },
    /// Stops the operator changing the resource (`spec.paused`).
    Pause { resource: String },
    /// Lets the operator change the resource again.
    Resume { resource: String },
    /// Prints a shell completion script: for `kubectl-noops` in bash, zsh or fish, or
    /// `kubectl` for the `kubectl_complete-noops` executable that completes `kubectl noops`.
    Completion {
        #[arg(value_enum)]
        shell: completion::Shell,
    },
}

impl Command {
    /// The `<kind>/<name>` it names, if it names one.
    fn resource(&self) -> Option<&str> {
        match self {
            Command::Status { resource, .. }
            | Command::Describe { resource }
            | Command::Kubeconfig { resource, .. }
            | Command::Backup { resource, .. }
            | Command::Report { resource, .. }
            | Command::Promote { resource, .. }
            | Command::Psql { resource, .. }
            | Command::Etcdctl { resource, .. }
            | Command::Pause { resource }
            | Command::Resume { resource } => Some(resource),
            Command::Get { .. } | Command::Completion { .. } => None,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Text,
    Json,
}

/// The name in `resource` if it is of `kind`; else `refusal`.
fn name_of(resource: &str, kind: Kind, refusal: &str) -> anyhow::Result<String> {
    match parse_resource(resource)? {
        (named, name) if named == kind => Ok(name),
        _ => bail!("{refusal}"),
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Command::Completion { shell } = cli.command {
        print!("{}", completion::script(shell, &mut Cli::command()));
        return Ok(ExitCode::SUCCESS);
    }
    // A resource misnamed is said as such, not as a cluster that cannot be reached.
    if let Some(resource) = cli.command.resource() {
        parse_resource(resource)?;
    }
    let target = Target {
        kubeconfig: cli.kubeconfig.clone(),
        context: cli.context.clone(),
    };
    let client = target.client().await?;
    let namespace = cli
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    match cli.command {
        Command::Status { resource, output } => {
            let (kind, name) = parse_resource(&resource)?;
            let report = status::status(&client, &namespace, kind, &name).await?;
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
        Command::Get { all_namespaces } => {
            let only = (!all_namespaces).then_some(namespace.as_str());
            print!("{}", get::get(&client, only).await?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Describe { resource } => {
            let (kind, name) = parse_resource(&resource)?;
            print!("{}", describe::describe(&client, &namespace, kind, &name).await?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Kubeconfig {
            resource,
            output,
            internal,
        } => {
            let (kind, name) = parse_resource(&resource)?;
            let text = kubeconfig::read(&client, &namespace, kind, &name, internal).await?;
            match output {
                None => print!("{text}"),
                Some(path) => {
                    kubeconfig::write(&path, &text)?;
                    let server = kubeconfig::server_of(&text).unwrap_or_else(|| "a server it names".into());
                    println!(
                        "wrote {}: the admin of {kind} {namespace}/{name} at {server}",
                        path.display()
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
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
            let name = name_of(
                &resource,
                Kind::PostgreSQL,
                "only a PostgreSQL has instances to promote (pg/<name>)",
            )?;
            let deadline = std::time::Duration::from_secs(timeout);
            promote::promote(&client, &namespace, &name, &instance, deadline).await
        }
        Command::Psql {
            resource,
            instance,
            psql_args,
        } => {
            let name = name_of(&resource, Kind::PostgreSQL, "psql opens on a PostgreSQL (pg/<name>)")?;
            psql::psql(&client, &target, &namespace, &name, instance.as_deref(), &psql_args).await
        }
        Command::Etcdctl {
            resource,
            timeout,
            etcdctl_args,
        } => {
            let name = name_of(
                &resource,
                Kind::EtcdCluster,
                "etcdctl runs against an EtcdCluster (etcd/<name>)",
            )?;
            let timeout = std::time::Duration::from_secs(timeout);
            etcdctl::etcdctl(&client, &namespace, &name, &etcdctl_args, timeout).await
        }
        Command::Pause { resource } => set_paused(&client, &namespace, &resource, true).await,
        Command::Resume { resource } => set_paused(&client, &namespace, &resource, false).await,
        // Printed above, before any client.
        Command::Completion { .. } => Ok(ExitCode::SUCCESS),
    }
}

/// Sets `spec.paused` of a resource that has it.
async fn set_paused(client: &Client, namespace: &str, resource: &str, paused: bool) -> anyhow::Result<ExitCode> {
    let (kind, name) = parse_resource(resource)?;
    let patch = kube::api::Patch::Merge(serde_json::json!({ "spec": { "paused": paused } }));
    let resource = kind.resource();
    let patched = Api::<kube::api::DynamicObject>::namespaced_with(client.clone(), namespace, &resource)
        .patch(&name, &kube::api::PatchParams::default(), &patch)
        .await
        .with_context(|| format!("patching {kind} {namespace}/{name}"))?;
    // An API server with older CRDs drops a field it does not know, and says nothing.
    if patched.data["spec"]["paused"].as_bool().unwrap_or(false) != paused {
        bail!(
            "{kind} {namespace}/{name} did not take spec.paused: its CRD is older than this plugin (apply deploy/crds/)"
        );
    }
    let what = if paused {
        "paused: the operator changes nothing until it is resumed"
    } else {
        "resumed"
    };
    println!("{kind} {namespace}/{name} {what}");
    Ok(ExitCode::SUCCESS)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    // kubectl's completion asks with words that are not a whole command line: not parsed.
    if args.get(1).map(String::as_str) == Some(completion::COMPLETE) {
        print!("{}", completion::answer(&Cli::command(), &args[2..]).await);
        return ExitCode::SUCCESS;
    }
    match run(Cli::parse()).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
