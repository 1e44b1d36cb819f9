//! What every pass of the MaintPage controller shares: the core, the watch caches of the
//! children, and the pull secrets.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::runtime::reflector::Store;

/// What this controller keeps beside the core: its watch caches and settings.
pub struct State {
    /// The Deployments and Services the operator manages, kept by watches: reconciles read
    /// children from here, not from the API server.
    pub deployments: Store<Deployment>,
    pub services: Store<Service>,
    /// The pods of both sides (to tell pods that cannot start, before the Deployment does).
    pub pods: Store<Pod>,
    /// The Secrets both sides' pods pull their images with (the registry setting is not
    /// theirs: their images are the user's).
    pub images: crate::core::images::Images,
}

/// What every reconcile of this controller shares.
pub type Context = crate::core::controller::Context<State>;
