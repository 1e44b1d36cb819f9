//! `kubectl noops etcdctl etcd/<name> -- <args>`: etcdctl against the cluster, from a short-lived
//! pod of the members' own image with the cluster's client certificate mounted, through its
//! client Service; prints what etcdctl printed and exits with its exit code. A pod rather than
//! exec: the members hold only server and peer certificates, their image has no shell, and a
//! pod works on any node (no streaming needed).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use kube::runtime::wait::await_condition;
use noops_api::EtcdCluster;
use serde_json::json;

/// The label on the operator's member pods naming their cluster.
const CLUSTER_LABEL: &str = "noops.dev/etcdcluster";
/// Where the client certificate is mounted in the etcdctl pod.
const CERTS: &str = "/etc/etcdctl";

/// What the etcdctl pod is made from: the members' image and pull secrets, the client Secret
/// and where the cluster answers.
pub struct EtcdctlPod<'a> {
    pub name: &'a str,
    pub cluster: &'a str,
    pub image: &'a str,
    pub pull_secrets: serde_json::Value,
    pub client_secret: &'a str,
    pub endpoints: Vec<String>,
}

/// The etcdctl pod running etcdctl's arguments, ended by the API server after `timeout`.
pub fn etcdctl_pod(made_of: &EtcdctlPod, args: &[String], timeout: Duration) -> serde_json::Value {
    let EtcdctlPod {
        name: pod_name,
        cluster,
        image,
        pull_secrets,
        client_secret,
        endpoints,
    } = made_of;
    let mut command = vec![
        "etcdctl".to_string(),
        format!("--endpoints={}", endpoints.join(",")),
        format!("--cacert={CERTS}/ca.crt"),
        format!("--cert={CERTS}/tls.crt"),
        format!("--key={CERTS}/tls.key"),
    ];
    command.extend(args.iter().cloned());
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name,
            "labels": { "app.kubernetes.io/managed-by": "kubectl-noops", "noops.dev/etcdctl-for": cluster },
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": timeout.as_secs().max(1),
            "imagePullSecrets": pull_secrets,
            "securityContext": { "seccompProfile": { "type": "RuntimeDefault" } },
            "containers": [{
                "name": "etcdctl",
                "image": image,
                "command": command,
                "volumeMounts": [{ "name": "client-tls", "mountPath": CERTS, "readOnly": true }],
            }],
            "volumes": [{ "name": "client-tls", "secret": { "secretName": client_secret, "defaultMode": 0o400 } }],
        },
    })
}

/// Where etcdctl connects: the endpoints the status names, else the client Service.
pub fn endpoints(cluster: &EtcdCluster, namespace: &str) -> Vec<String> {
    let name = cluster.metadata.name.as_deref().unwrap_or_default();
    match cluster.status.as_ref().map(|s| s.endpoints.clone()) {
        Some(endpoints) if !endpoints.is_empty() => endpoints,
        _ => vec![format!("https://{name}-client.{namespace}.svc:2379")],
    }
}

pub async fn etcdctl(
    client: &Client,
    namespace: &str,
    name: &str,
    args: &[String],
    timeout: Duration,
) -> anyhow::Result<ExitCode> {
    let cluster = Api::<EtcdCluster>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .with_context(|| format!("reading etcd/{name}"))?;
    let Some(client_secret) = cluster.status.as_ref().and_then(|s| s.client_secret.clone()) else {
        bail!("etcd/{name} has no client certificate yet (see `kubectl noops status etcd/{name}`)");
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let members = pods
        .list(&ListParams::default().labels(&format!("{CLUSTER_LABEL}={name}")))
        .await
        .context("listing the members' pods")?;
    // The image a member runs: the cluster's version from wherever the operator pulls it.
    let Some(member) = members.items.iter().find_map(|p| p.spec.as_ref()) else {
        bail!("etcd/{name} has no member pods to take the etcd image from");
    };
    let image = member
        .containers
        .first()
        .and_then(|c| c.image.clone())
        .context("the member pod names no image")?;
    let pull_secrets = serde_json::to_value(member.image_pull_secrets.clone().unwrap_or_default())?;
    let suffix = format!(
        "{:x}",
        std::process::id() ^ jiff::Timestamp::now().subsec_nanosecond() as u32
    );
    let pod_name = format!("{name}-etcdctl-{suffix}");
    let made_of = EtcdctlPod {
        name: &pod_name,
        cluster: name,
        image: &image,
        pull_secrets,
        client_secret: &client_secret,
        endpoints: endpoints(&cluster, namespace),
    };
    let manifest = etcdctl_pod(&made_of, args, timeout);
    let pod: Pod = serde_json::from_value(manifest)?;
    pods.create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating the pod {pod_name}"))?;
    let outcome = wait_and_read(&pods, &pod_name, timeout).await;
    let _ = pods.delete(&pod_name, &DeleteParams::background()).await;
    let (code, output) = outcome?;
    print!("{output}");
    Ok(ExitCode::from(code))
}

/// How the etcdctl pod's container ended, if it has.
#[derive(Debug, PartialEq)]
enum Ended {
    /// etcdctl ran and exited with this code.
    Exited(i32),
    /// It cannot start: its image cannot be pulled, its Secret cannot be mounted.
    CannotStart(String),
}

fn ended(pod: Option<&Pod>) -> Option<Ended> {
    let container = pod?.status.as_ref()?.container_statuses.as_ref()?.first()?;
    let state = container.state.as_ref()?;
    if let Some(terminated) = &state.terminated {
        return Some(Ended::Exited(terminated.exit_code));
    }
    let waiting = state.waiting.as_ref()?;
    matches!(
        waiting.reason.as_deref(),
        Some("ErrImagePull" | "ImagePullBackOff" | "CreateContainerConfigError")
    )
    .then(|| Ended::CannotStart(waiting.message.clone().or(waiting.reason.clone()).unwrap_or_default()))
}

/// Watches the pod until its container ends; etcdctl's exit code (as a process exit code) and
/// its log.
async fn wait_and_read(pods: &Api<Pod>, pod_name: &str, timeout: Duration) -> anyhow::Result<(u8, String)> {
    let watched = await_condition(pods.clone(), pod_name, |pod: Option<&Pod>| ended(pod).is_some());
    let pod = tokio::time::timeout(timeout, watched)
        .await
        .map_err(|_| anyhow::anyhow!("etcdctl did not finish within {}s", timeout.as_secs()))?
        .with_context(|| format!("watching {pod_name}"))?;
    match ended(pod.as_ref()) {
        Some(Ended::Exited(code)) => {
            let log = pods
                .logs(pod_name, &LogParams::default())
                .await
                .with_context(|| format!("reading the log of {pod_name}"))?;
            Ok((u8::try_from(code).unwrap_or(1), log))
        }
        Some(Ended::CannotStart(why)) => bail!("{pod_name} cannot start: {why}"),
        None => bail!("{pod_name} was deleted before etcdctl ended"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_runs_etcdctl_with_the_client_certificate_through_the_endpoints() {
        let made_of = EtcdctlPod {
            name: "main-etcdctl-1",
            cluster: "main",
            image: "quay.io/coreos/etcd:v3.6.16",
            pull_secrets: json!([{ "name": "regcred" }]),
            client_secret: "main-client",
            endpoints: vec!["https://main-client.prod.svc:2379".into()],
        };
        let pod = etcdctl_pod(&made_of, &["get".into(), "foo".into()], Duration::from_secs(30));
        let container = &pod["spec"]["containers"][0];
        assert_eq!(container["image"], "quay.io/coreos/etcd:v3.6.16");
        let command: Vec<&str> = container["command"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
            .collect();
        assert_eq!(command[0], "etcdctl");
        assert_eq!(command[1], "--endpoints=https://main-client.prod.svc:2379");
        assert_eq!(&command[5..], ["get", "foo"]);
        assert!(command.contains(&"--cert=/etc/etcdctl/tls.crt"));
        assert_eq!(pod["spec"]["volumes"][0]["secret"]["secretName"], "main-client");
        assert_eq!(pod["spec"]["restartPolicy"], "Never");
        assert_eq!(pod["spec"]["activeDeadlineSeconds"], 30);
        assert_eq!(pod["spec"]["imagePullSecrets"][0]["name"], "regcred");
        // It parses as a Pod.
        assert!(serde_json::from_value::<Pod>(pod).is_ok());
    }

    #[test]
    fn the_pod_has_ended_once_etcdctl_exits_or_cannot_start() {
        let pod = |state: serde_json::Value| -> Pod {
            serde_json::from_value(json!({ "status": { "containerStatuses": [{
                "name": "etcdctl", "image": "etcd", "imageID": "", "ready": false, "restartCount": 0, "state": state
            }] } }))
            .unwrap_or_else(|e| panic!("{e}"))
        };
        assert_eq!(ended(None), None, "gone");
        assert_eq!(ended(Some(&pod(json!({ "running": {} })))), None);
        assert_eq!(
            ended(Some(&pod(json!({ "waiting": { "reason": "ContainerCreating" } })))),
            None
        );
        assert_eq!(
            ended(Some(&pod(json!({ "terminated": { "exitCode": 3 } })))),
            Some(Ended::Exited(3))
        );
        assert_eq!(
            ended(Some(&pod(
                json!({ "waiting": { "reason": "ErrImagePull", "message": "not built" } })
            ))),
            Some(Ended::CannotStart("not built".into()))
        );
    }
}
