//! What every pass of the EtcdCluster controller shares: the core, and the controller's own
//! watch caches and settings.

use kube::core::DeserializeGuard;
use kube::runtime::reflector::Store;
use noops_api::EtcdCluster;

use super::observe;
use crate::core::user_secrets::UserSecrets;

/// What this controller keeps beside the core: its watch caches and settings.
pub struct State {
    /// The children of every cluster, kept by watches.
    pub caches: observe::Caches,
    /// The certificate Secrets users name.
    pub user_secrets: UserSecrets,
    /// The operator's own image, for the container of a restore pod that fetches a snapshot.
    pub image: String,
    /// How long the member and client certificates it issues are valid.
    pub certificate_lifetime: std::time::Duration,
    /// Where etcd is pulled from.
    pub images: crate::core::images::Images,
    /// Every EtcdCluster, as the controller's own watch keeps them.
    pub clusters: Store<DeserializeGuard<EtcdCluster>>,
}

/// What every reconcile of this controller shares.
pub type Context = crate::core::controller::Context<State>;
