//! `sample crd` prints the CRD; `sample run` runs the controller (KUBECONFIG or in-cluster).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, CustomResourceExt, ResourceExt};
use noops_sample_operator::{MANAGER, Sample, desired_config_map, desired_status};

#[derive(Debug, thiserror::Error)]
#[error("Kubernetes API request failed: {0}")]
struct Error(#[from] kube::Error);

async fn reconcile(sample: Arc<Sample>, client: Arc<Client>) -> Result<Action, Error> {
    let namespace = sample.namespace().unwrap_or_else(|| "default".into());
    let params = PatchParams::apply(MANAGER).force();
    // 1. Make the world match the spec: apply the ConfigMap.
    let config_map = desired_config_map(&sample);
    let name = config_map.metadata.name.clone().unwrap_or_default();
    Api::<ConfigMap>::namespaced((*client).clone(), &namespace)
        .patch(&name, &params, &Patch::Apply(&config_map))
        .await?;
    // 2. Report it, but only if the report changed.
    let status = desired_status(&sample, jiff::Timestamp::now());
    if sample.status.as_ref() != Some(&status) {
        let body = serde_json::json!({ "apiVersion": "examples.noops.dev/v1", "kind": "Sample", "status": status });
        Api::<Sample>::namespaced((*client).clone(), &namespace)
            .patch_status(&sample.name_any(), &params, &Patch::Apply(&body))
            .await?;
    }
    // 3. Nothing more to do until something changes.
    Ok(Action::await_change())
}

fn error_policy(sample: Arc<Sample>, error: &Error, _client: Arc<Client>) -> Action {
    tracing::warn!(sample = %sample.name_any(), %error, "reconcile failed; retrying in 5s");
    Action::requeue(Duration::from_secs(5))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match std::env::args().nth(1).as_deref() {
        Some("crd") => {
            println!("{}", serde_json::to_string_pretty(&Sample::crd())?);
            Ok(())
        }
        Some("run") => {
            tracing_subscriber::fmt().with_env_filter("info").init();
            // kube speaks TLS with rustls; when a build links two of its crypto backends (this
            // workspace also has aws-lc-rs, for object_store), one must be chosen.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let client = Client::try_default().await?;
            let samples: Api<Sample> = Api::all(client.clone());
            let config_maps: Api<ConfigMap> = Api::all(client.clone());
            Controller::new(samples, watcher::Config::default())
                .owns(config_maps, watcher::Config::default())
                .shutdown_on_signal()
                .run(reconcile, error_policy, Arc::new(client))
                .for_each(|result| async move {
                    if let Ok((object, _)) = result {
                        tracing::info!(sample = %object.name, "reconciled");
                    }
                })
                .await;
            Ok(())
        }
        _ => anyhow::bail!("usage: sample (crd | run)"),
    }
}
