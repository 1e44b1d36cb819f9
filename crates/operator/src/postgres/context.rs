//! What every pass of the PostgreSQL controller shares: the core, and the controller's own
//! watch caches and settings.

use kube::core::DeserializeGuard;
use kube::runtime::reflector::Store;
use noops_api::PostgreSQL;

use super::observe;
use crate::core::user_secrets::UserSecrets;

/// What this controller keeps beside the core: its watch caches and settings.
pub struct State {
    pub caches: observe::Caches,
    /// The password and bucket-key Secrets users name.
    pub user_secrets: UserSecrets,
    /// Every PostgreSQL, as the controller's own watch keeps them.
    pub databases: Store<DeserializeGuard<PostgreSQL>>,
    /// The operator's own image: the instance's init container copies the instance manager
    /// from it.
    pub image: String,
    /// Where PostgreSQL is pulled from.
    pub images: crate::core::images::Images,
    /// How long each primary's lease has gone unchanged.
    pub lease_clock: super::lease_clock::LeaseClock,
    /// When this process started: a handover made before it was made by an operator that
    /// may have stopped before it wrote the status.
    pub started: jiff::Timestamp,
}

/// What every reconcile of this controller shares.
pub type Context = crate::core::controller::Context<State>;
