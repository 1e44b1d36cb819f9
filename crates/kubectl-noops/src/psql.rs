//! `kubectl noops psql pg/<name>`: psql in the primary's pod (or an instance's), on the
//! database the PostgreSQL serves, as the superuser over the pod's own socket: no password, no
//! port-forward. It is `kubectl exec` underneath, so it needs what exec needs (a kubelet that
//! streams; the node agent does not) and the right to exec into pods.

use std::io::IsTerminal as _;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use kube::Client;
use kube::api::Api;
use noops_api::PostgreSQL;

use crate::connect::Target;

/// The container of an instance's pod that runs PostgreSQL.
const POSTGRES_CONTAINER: &str = "postgres";

/// What to run `kubectl` with: the pod, the database and the user's own psql arguments.
pub fn kubectl_args(
    target: &Target,
    namespace: &str,
    pod: &str,
    db: &str,
    terminal: bool,
    psql_args: &[String],
) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(kubeconfig) = &target.kubeconfig {
        args.push(format!("--kubeconfig={}", kubeconfig.display()));
    }
    if let Some(context) = &target.context {
        args.push(format!("--context={context}"));
    }
    args.extend([
        format!("--namespace={namespace}"),
        "exec".into(),
        // Standard input always (so a script can be piped in); a terminal only when there is one.
        if terminal { "-it".into() } else { "-i".into() },
        pod.into(),
        format!("--container={POSTGRES_CONTAINER}"),
        "--".into(),
        "psql".into(),
        format!("--dbname={db}"),
    ]);
    args.extend(psql_args.iter().cloned());
    args
}

/// The pod to open psql in: the instance asked for, else the primary the status names.
pub fn instance_to_use(pg: &PostgreSQL, instance: Option<&str>) -> anyhow::Result<String> {
    let name = pg.metadata.name.as_deref().unwrap_or_default();
    if let Some(instance) = instance {
        let known = pg
            .status
            .as_ref()
            .is_some_and(|s| s.members.iter().any(|m| m.name == instance));
        if !known && !instance.starts_with(&format!("{name}-")) {
            bail!("{instance} is not an instance of pg/{name}");
        }
        return Ok(instance.to_string());
    }
    match pg.status.as_ref().and_then(|s| s.current_primary.clone()) {
        Some(primary) => Ok(primary),
        None => bail!("pg/{name} has no primary yet (see `kubectl noops status pg/{name}`)"),
    }
}

pub async fn psql(
    client: &Client,
    target: &Target,
    namespace: &str,
    name: &str,
    instance: Option<&str>,
    psql_args: &[String],
) -> anyhow::Result<ExitCode> {
    let pg = Api::<PostgreSQL>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .with_context(|| format!("reading pg/{name}"))?;
    let pod = instance_to_use(&pg, instance)?;
    let args = kubectl_args(
        target,
        namespace,
        &pod,
        &pg.spec.db,
        std::io::stdin().is_terminal(),
        psql_args,
    );
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let status = tokio::process::Command::new(&kubectl)
        .args(&args)
        .status()
        .await
        .with_context(|| format!("running {kubectl} exec (is kubectl on the PATH? KUBECTL names another)"))?;
    Ok(status
        .code()
        .and_then(|c| u8::try_from(c).ok())
        .map_or(ExitCode::FAILURE, ExitCode::from))
}

#[cfg(test)]
mod tests {
    use super::*;
    use noops_api::{PostgreSQLSpec, PostgreSQLStatus};

    fn pg(primary: Option<&str>) -> PostgreSQL {
        let mut pg = PostgreSQL::new(
            "shop",
            serde_json::from_value::<PostgreSQLSpec>(serde_json::json!({
                "db": "orders", "user": "app", "passwordSecret": "pw"
            }))
            .unwrap_or_else(|e| panic!("{e}")),
        );
        pg.status = Some(PostgreSQLStatus {
            current_primary: primary.map(String::from),
            ..Default::default()
        });
        pg
    }

    #[test]
    fn psql_runs_in_the_primary_on_the_database_with_the_users_arguments() {
        let pod = instance_to_use(&pg(Some("shop-1")), None).unwrap_or_default();
        assert_eq!(pod, "shop-1");
        let target = Target {
            kubeconfig: Some("/tmp/k".into()),
            context: None,
        };
        let args = kubectl_args(
            &target,
            "prod",
            &pod,
            "orders",
            false,
            &["-c".into(), "select 1".into()],
        );
        assert_eq!(
            args,
            [
                "--kubeconfig=/tmp/k",
                "--namespace=prod",
                "exec",
                "-i",
                "shop-1",
                "--container=postgres",
                "--",
                "psql",
                "--dbname=orders",
                "-c",
                "select 1"
            ]
        );
        assert!(kubectl_args(&target, "prod", &pod, "orders", true, &[]).contains(&"-it".to_string()));
    }

    #[test]
    fn an_instance_is_chosen_by_name_and_a_missing_primary_is_said() {
        assert_eq!(
            instance_to_use(&pg(Some("shop-0")), Some("shop-2")).unwrap_or_default(),
            "shop-2"
        );
        let other = instance_to_use(&pg(Some("shop-0")), Some("cart-0"))
            .unwrap_err()
            .to_string();
        assert!(other.contains("not an instance of pg/shop"), "{other}");
        let none = instance_to_use(&pg(None), None).unwrap_err().to_string();
        assert!(none.contains("no primary yet"), "{none}");
    }
}
