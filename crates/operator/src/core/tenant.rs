//! Reaching a tenant's cluster (a KubernetesControlPlane's) through its admin kubeconfig
//! Secret: a client for requests, each of which gives up after [`TIMEOUT`] (a tenant that does
//! not answer is unreachable for this pass, and a 429 is an answer, not retried), and one for
//! watches, which keeps the default read timeout (a watch is a request that lasts minutes).
//! Whoever keeps them keeps them while the Secret stays the same ([`made_from`]): a client
//! holds its connections.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::{Client, ResourceExt};

use super::{Error, Result};

/// A tenant that does not answer within this long is taken as unreachable for this pass.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// The clients of one tenant.
pub struct TenantClients {
    /// For requests.
    pub requests: Client,
    /// For watches.
    pub watches: Client,
}

/// What the clients were made from: the Secret's uid and version.
pub fn made_from(secret: &Secret) -> String {
    format!(
        "{}/{}",
        secret.uid().unwrap_or_default(),
        secret.resource_version().unwrap_or_default()
    )
}

impl TenantClients {
    /// The clients of the admin kubeconfig in `secret` (key `kubeconfig`).
    pub async fn of(secret: &Secret) -> Result<Self> {
        let text = secret
            .data
            .as_ref()
            .and_then(|d| d.get("kubeconfig"))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .ok_or_else(|| Error::Blocked(format!("{} has no kubeconfig yet", secret.name_any())))?;
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&text)
            .map_err(|e| Error::Internal(format!("the tenant's admin kubeconfig cannot be read: {e}")))?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .map_err(|e| Error::Internal(format!("the tenant's admin kubeconfig cannot be used: {e}")))?;
        let watches = Client::try_from(config.clone()).map_err(Error::Kube)?;
        let mut config = config;
        config.connect_timeout = Some(TIMEOUT);
        config.read_timeout = Some(TIMEOUT);
        config.write_timeout = Some(TIMEOUT);
        // An eviction a PodDisruptionBudget refuses answers 429: that is an answer for a drain
        // to act on, not a request to retry for minutes.
        config.default_retry = false;
        let requests = Client::try_from(config).map_err(Error::Kube)?;
        Ok(Self { requests, watches })
    }
}
