//! Reaching a tenant's cluster (a KubernetesControlPlane's) through its admin kubeconfig
//! Secret: a client for requests, each of which gives up after [`TIMEOUT`] (a tenant that does
//! not answer is unreachable for this pass, and a 429 is an answer, not retried), and one for
//! watches, which keeps the default read timeout (a watch is a request that lasts minutes).
//! [`PerTenant`] keeps what a controller makes of each tenant (its clients, the watches that
//! fill its caches) while the Secret stays the same: a client holds its connections.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
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
fn made_from(secret: &Secret) -> String {
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

/// One `T` per tenant, by `<namespace>/<control plane>`, made from the tenant's clients and
/// made again when its admin kubeconfig Secret changes (the one replaced is dropped, which is
/// how a `T` stops its watches).
pub struct PerTenant<T> {
    entries: Mutex<HashMap<String, (String, Arc<T>)>>,
}

impl<T> Default for PerTenant<T> {
    fn default() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> PerTenant<T> {
    /// The `T` of control plane `cluster` in `namespace` whose admin kubeconfig is `secret`:
    /// the one kept, or one `make` makes now from new clients.
    pub async fn get(
        &self,
        namespace: &str,
        cluster: &str,
        secret: &Secret,
        make: impl FnOnce(TenantClients) -> T,
    ) -> Result<Arc<T>> {
        let key = format!("{namespace}/{cluster}");
        let from = made_from(secret);
        if let Ok(entries) = self.entries.lock()
            && let Some((kept_from, kept)) = entries.get(&key)
            && *kept_from == from
        {
            return Ok(kept.clone());
        }
        let made = Arc::new(make(TenantClients::of(secret).await?));
        if let Ok(mut entries) = self.entries.lock() {
            entries.insert(key, (from, made.clone()));
        }
        Ok(made)
    }

    /// Drops the `T` of a control plane that is gone or no longer needed (its watches stop).
    pub fn forget(&self, namespace: &str, cluster: &str) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.remove(&format!("{namespace}/{cluster}"));
        }
    }
}
