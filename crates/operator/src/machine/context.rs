//! What every pass of the Machine controller shares: the core, the watch caches, the provider,
//! the tenants' clients and the certificate lifetime.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::Store;
use noops_api::KubernetesControlPlane;

use super::provider::PodProvider;
use super::tenant::Tenants;

/// What this controller keeps beside the core.
pub struct State {
    /// The control planes machines join (their version, their admin kubeconfig's name).
    pub control_planes: Store<KubernetesControlPlane>,
    /// Secrets noops manages: the bootstrap Secrets, the tenants' CAs and admin kubeconfigs.
    pub secrets: Store<Secret>,
    pub provider: PodProvider,
    pub tenants: Tenants,
    /// How long the certificates of a machine last.
    pub certificate_lifetime: Duration,
}

/// What every reconcile of this controller shares.
pub type Context = crate::core::controller::Context<State>;
