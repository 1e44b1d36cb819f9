//! The client, from the kubeconfig kubectl would read and the flags kubectl takes for it
//! (`--kubeconfig`, `--context`).

use std::path::PathBuf;

use anyhow::Context as _;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Which cluster, as the user said it.
#[derive(Debug, Clone, Default)]
pub struct Target {
    /// A kubeconfig file instead of KUBECONFIG's (or ~/.kube/config).
    pub kubeconfig: Option<PathBuf>,
    /// A context of it instead of its current-context.
    pub context: Option<String>,
}

impl Target {
    pub async fn client(&self) -> anyhow::Result<Client> {
        // kube links ring for TLS: say so once, as more than one provider may be linked.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let config = match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let file = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(file, &options)
                    .await
                    .with_context(|| format!("using {}", path.display()))?
            }
            (None, Some(context)) => kube::Config::from_kubeconfig(&options)
                .await
                .with_context(|| format!("using context {context} of the kubeconfig"))?,
            // Without flags, as kubectl: the kubeconfig, or the pod's service account.
            (None, None) => kube::Config::infer().await?,
        };
        Ok(Client::try_from(config)?)
    }

    /// The names of the contexts of the kubeconfig (for completion); none if it cannot be read.
    pub fn contexts(&self) -> Vec<String> {
        let file = match &self.kubeconfig {
            Some(path) => Kubeconfig::read_from(path),
            None => Kubeconfig::read(),
        };
        file.map(|k| k.contexts.into_iter().map(|c| c.name).collect())
            .unwrap_or_default()
    }
}
