//! Shell completion. `completion bash|zsh|fish` prints clap's script for `kubectl-noops` run
//! by its own name. `completion kubectl` prints `kubectl_complete-noops`, the executable
//! kubectl (1.26 and later) looks for on the PATH to complete `kubectl noops …`: kubectl runs
//! it with the words typed after `noops`, the one being typed last, and it asks
//! `kubectl-noops __complete`, which answers as Cobra programs do: a candidate per line, then
//! `:<directive>`. Subcommands, flags and their values come from the command line's own
//! definition; `<kind>/<name>` names, namespaces and contexts from the cluster and the
//! kubeconfig.

use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, ListParams};

use crate::connect::Target;
use crate::resources::Kind;

/// The hidden first argument that asks for completions.
pub const COMPLETE: &str = "__complete";

/// How long completion waits for the cluster: a shell waits while it does.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(5);

/// Cobra's directives: what the shell does beside the candidates.
const DEFAULT: u8 = 0;
const NO_SPACE: u8 = 2;
const NO_FILE_COMPLETION: u8 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
    /// `kubectl_complete-noops`, for `kubectl noops <TAB>`.
    Kubectl,
}

/// The completion script for `shell`.
pub fn script(shell: Shell, command: &mut clap::Command) -> String {
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
        Shell::Kubectl => {
            return format!(
                "#!/bin/sh\n\
                 # kubectl (1.26+) runs this to complete `kubectl noops ...`: install it on the PATH as\n\
                 # kubectl_complete-noops, executable.\n\
                 exec kubectl-noops {COMPLETE} \"$@\"\n"
            );
        }
    };
    let mut out = Vec::new();
    clap_complete::generate(shell, command, "kubectl-noops", &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// What the word being typed may be.
#[derive(Debug, Clone, PartialEq)]
enum Want {
    /// These words (subcommands, flags, a flag's values).
    Words(Vec<String>),
    /// The start of a resource, `<kind>/`, to go on typing after.
    Kinds(Vec<String>),
    /// The names of `kind` that start with `prefix`, written `<typed>/<name>`.
    Names {
        kind: Kind,
        typed: String,
        prefix: String,
    },
    Namespaces(String),
    Contexts(String),
    /// A file: the shell's own completion.
    Files,
}

/// The request in the words typed: what is wanted, and the cluster flags typed so far.
#[derive(Debug, Clone, PartialEq)]
struct Request {
    want: Want,
    namespace: Option<String>,
    kubeconfig: Option<PathBuf>,
    context: Option<String>,
}

/// Answers kubectl: the candidates, then the directive.
pub async fn answer(command: &clap::Command, words: &[String]) -> String {
    let request = request(command, words);
    let target = Target {
        kubeconfig: request.kubeconfig.clone(),
        context: request.context.clone(),
    };
    let (candidates, directive) = match request.want {
        Want::Words(words) => (words, NO_FILE_COMPLETION),
        Want::Kinds(kinds) => (kinds, NO_SPACE | NO_FILE_COMPLETION),
        Want::Names { kind, typed, prefix } => {
            let names = from_cluster(names(&target, request.namespace.as_deref(), kind)).await;
            let candidates = names
                .into_iter()
                .filter(|n| n.starts_with(&prefix))
                .map(|n| format!("{typed}/{n}"))
                .collect();
            (candidates, NO_FILE_COMPLETION)
        }
        Want::Namespaces(prefix) => {
            let names = from_cluster(namespaces(&target)).await;
            (starting_with(names, &prefix), NO_FILE_COMPLETION)
        }
        Want::Contexts(prefix) => (starting_with(target.contexts(), &prefix), NO_FILE_COMPLETION),
        Want::Files => (Vec::new(), DEFAULT),
    };
    let mut out: String = candidates.iter().map(|c| format!("{c}\n")).collect();
    out.push_str(&format!(":{directive}\n"));
    out
}

fn starting_with(words: Vec<String>, prefix: &str) -> Vec<String> {
    words.into_iter().filter(|w| w.starts_with(prefix)).collect()
}

/// What the cluster answers in time, or nothing: completion says no error.
async fn from_cluster(ask: impl Future<Output = anyhow::Result<Vec<String>>>) -> Vec<String> {
    match tokio::time::timeout(CLUSTER_TIMEOUT, ask).await {
        Ok(Ok(names)) => names,
        _ => Vec::new(),
    }
}

async fn names(target: &Target, namespace: Option<&str>, kind: Kind) -> anyhow::Result<Vec<String>> {
    let client = target.client().await?;
    let namespace = namespace.map_or_else(|| client.default_namespace().to_string(), str::to_string);
    let api: Api<DynamicObject> = Api::namespaced_with(client, &namespace, &kind.resource());
    let list = api.list_metadata(&ListParams::default()).await?;
    Ok(list.items.into_iter().filter_map(|o| o.metadata.name).collect())
}

async fn namespaces(target: &Target) -> anyhow::Result<Vec<String>> {
    let api: Api<Namespace> = Api::all(target.client().await?);
    let list = api.list_metadata(&ListParams::default()).await?;
    Ok(list.items.into_iter().filter_map(|o| o.metadata.name).collect())
}

/// Reads the words typed (the last one being typed) against the command line's definition.
fn request(command: &clap::Command, words: &[String]) -> Request {
    let (typing, typed) = match words.split_last() {
        Some((last, before)) => (last.as_str(), before),
        None => ("", &[][..]),
    };
    let mut request = Request {
        want: Want::Words(Vec::new()),
        namespace: None,
        kubeconfig: None,
        context: None,
    };
    let mut subcommand: Option<&clap::Command> = None;
    let mut positionals = 0;
    let mut value_of: Option<&clap::Arg> = None;
    for word in typed {
        if let Some(arg) = value_of.take() {
            remember(&mut request, arg, word);
            continue;
        }
        if let Some((arg, inline)) = flag(command, subcommand, word) {
            match inline {
                Some(value) => remember(&mut request, arg, &value),
                None if takes_value(arg) => value_of = Some(arg),
                None => {}
            }
            continue;
        }
        match subcommand {
            None => subcommand = command.find_subcommand(word),
            Some(_) => positionals += 1,
        }
    }
    request.want = match (value_of, subcommand) {
        (Some(arg), _) => value(arg, typing),
        (None, _) if typing.starts_with('-') => Want::Words(flags(command, subcommand, typing)),
        (None, None) => Want::Words(starting_with(
            command
                .get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(|s| s.get_name().to_string())
                .collect(),
            typing,
        )),
        (None, Some(sub)) => match sub.get_positionals().nth(positionals) {
            Some(arg) if arg.get_id() == "resource" => resource(sub.get_name(), typing),
            Some(arg) => value(arg, typing),
            None => Want::Words(Vec::new()),
        },
    };
    request
}

/// The argument `word` is, if it is a flag: `--name`, `--name=value`, `-n`; and its value
/// when given inline.
fn flag<'a>(
    command: &'a clap::Command,
    subcommand: Option<&'a clap::Command>,
    word: &str,
) -> Option<(&'a clap::Arg, Option<String>)> {
    let arguments = || {
        subcommand
            .into_iter()
            .flat_map(|s| s.get_arguments())
            .chain(command.get_arguments())
    };
    if let Some(long) = word.strip_prefix("--") {
        let (name, inline) = match long.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (long, None),
        };
        return arguments().find(|a| a.get_long() == Some(name)).map(|a| (a, inline));
    }
    let mut short = word.strip_prefix('-')?.chars();
    let letter = short.next()?;
    let rest: String = short.collect();
    let arg = arguments().find(|a| a.get_short() == Some(letter))?;
    let inline = (!rest.is_empty()).then(|| rest.trim_start_matches('=').to_string());
    Some((arg, inline))
}

fn takes_value(arg: &clap::Arg) -> bool {
    arg.get_action().takes_values()
}

/// Keeps what a cluster flag says, for the names asked of the cluster.
fn remember(request: &mut Request, arg: &clap::Arg, value: &str) {
    match arg.get_id().as_str() {
        "namespace" => request.namespace = Some(value.to_string()),
        "kubeconfig" => request.kubeconfig = Some(PathBuf::from(value)),
        "context" => request.context = Some(value.to_string()),
        _ => {}
    }
}

/// The values `arg` may take.
fn value(arg: &clap::Arg, typing: &str) -> Want {
    match arg.get_id().as_str() {
        "namespace" => return Want::Namespaces(typing.to_string()),
        "context" => return Want::Contexts(typing.to_string()),
        _ => {}
    }
    let possible: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| v.get_name().to_string())
        .collect();
    if !possible.is_empty() {
        return Want::Words(starting_with(possible, typing));
    }
    match arg.get_value_hint() {
        clap::ValueHint::FilePath | clap::ValueHint::AnyPath | clap::ValueHint::DirPath => Want::Files,
        _ => Want::Words(Vec::new()),
    }
}

/// The long flags of the subcommand (and the global ones) that start with `typing`.
fn flags(command: &clap::Command, subcommand: Option<&clap::Command>, typing: &str) -> Vec<String> {
    let mut flags: Vec<String> = subcommand
        .into_iter()
        .flat_map(|s| s.get_arguments())
        .chain(
            command
                .get_arguments()
                .filter(|a| subcommand.is_none() || a.is_global_set()),
        )
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .filter(|f| f.starts_with(typing))
        .collect();
    flags.sort();
    flags.dedup();
    flags
}

/// A resource being typed: its kind first, then its name once the kind is there.
fn resource(subcommand: &str, typing: &str) -> Want {
    let kinds: Vec<Kind> = match subcommand {
        "describe" => vec![Kind::KubernetesCluster],
        "kubeconfig" => vec![Kind::KubernetesCluster, Kind::KubernetesControlPlane],
        "backup" => vec![Kind::EtcdCluster, Kind::PostgreSQL],
        "promote" | "psql" => vec![Kind::PostgreSQL],
        "etcdctl" => vec![Kind::EtcdCluster],
        _ => Kind::ALL.to_vec(),
    };
    if let Some((typed, prefix)) = typing.split_once('/') {
        return match Kind::named(typed).filter(|k| kinds.contains(k)) {
            Some(kind) => Want::Names {
                kind,
                typed: typed.to_string(),
                prefix: prefix.to_string(),
            },
            None => Want::Words(Vec::new()),
        };
    }
    // The short names, unless what is typed is the start of a longer name only.
    let mut words: Vec<String> = kinds
        .iter()
        .map(|k| k.short_name().to_string())
        .filter(|n| n.starts_with(typing))
        .collect();
    if words.is_empty() {
        words = kinds
            .iter()
            .flat_map(|k| {
                let resource = k.resource();
                [resource.kind.to_lowercase(), resource.plural]
            })
            .filter(|n| n.starts_with(typing))
            .collect();
    }
    words.dedup();
    Want::Kinds(words.into_iter().map(|w| format!("{w}/")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    fn want(line: &str) -> Request {
        let mut words: Vec<String> = line.split(' ').map(str::to_string).collect();
        if line.is_empty() {
            words = vec![String::new()];
        }
        request(&crate::Cli::command(), &words)
    }

    fn words(list: &[&str]) -> Want {
        Want::Words(list.iter().map(|w| w.to_string()).collect())
    }

    #[test]
    fn subcommands_then_kinds_then_names_of_the_cluster() {
        let first = want("");
        let Want::Words(subcommands) = &first.want else {
            panic!("{first:?}")
        };
        for expected in ["status", "describe", "kubeconfig", "get", "completion"] {
            assert!(subcommands.iter().any(|s| s == expected), "{subcommands:?}");
        }
        assert_eq!(want("st").want, words(&["status"]));
        let Want::Kinds(kinds) = want("status ").want else {
            panic!()
        };
        assert_eq!(kinds.len(), 10);
        assert!(kinds.contains(&"ma/".to_string()) && kinds.contains(&"pgbackup/".to_string()));
        assert_eq!(want("describe ").want, Want::Kinds(vec!["kc/".into()]));
        assert_eq!(
            want("kubeconfig kc").want,
            Want::Kinds(vec!["kc/".into(), "kcp/".into()])
        );
        assert_eq!(
            want("status machined").want,
            Want::Kinds(vec!["machinedeployment/".into(), "machinedeployments/".into()])
        );
        assert_eq!(
            want("-n tenants status kc/ac"),
            Request {
                want: Want::Names {
                    kind: Kind::KubernetesCluster,
                    typed: "kc".into(),
                    prefix: "ac".into()
                },
                namespace: Some("tenants".into()),
                kubeconfig: None,
                context: None,
            }
        );
        assert_eq!(want("describe etcd/ma").want, words(&[]), "describe takes a kc only");
        assert_eq!(want("status kc/acme ").want, words(&[]), "one resource");
    }

    #[test]
    fn flags_and_their_values() {
        assert_eq!(want("get --all").want, words(&["--all-namespaces"]));
        let Want::Words(flags) = want("status --").want else {
            panic!()
        };
        for expected in ["--output", "--namespace", "--context", "--kubeconfig"] {
            assert!(flags.iter().any(|f| f == expected), "{flags:?}");
        }
        assert_eq!(want("status -o ").want, words(&["text", "json"]));
        assert_eq!(
            want("--namespace=db status --context ").want,
            Want::Contexts(String::new())
        );
        assert_eq!(want("--namespace=db status -n d").want, Want::Namespaces("d".into()));
        assert_eq!(want("--kubeconfig ").want, Want::Files);
        assert_eq!(want("kubeconfig kc/acme -f ").want, Want::Files);
        let request = want("--kubeconfig /tmp/k --context kind-noops get ");
        assert_eq!(
            (request.kubeconfig, request.context),
            (Some(PathBuf::from("/tmp/k")), Some("kind-noops".into()))
        );
        assert_eq!(want("completion ").want, words(&["bash", "zsh", "fish", "kubectl"]));
    }

    #[test]
    fn the_scripts_name_the_program() {
        let mut command = crate::Cli::command();
        assert!(script(Shell::Bash, &mut command).contains("kubectl-noops"));
        assert!(script(Shell::Zsh, &mut command).contains("#compdef kubectl-noops"));
        assert!(script(Shell::Fish, &mut command).contains("complete -c kubectl-noops"));
        let kubectl = script(Shell::Kubectl, &mut command);
        assert!(kubectl.starts_with("#!/bin/sh\n") && kubectl.contains("exec kubectl-noops __complete \"$@\""));
    }
}
