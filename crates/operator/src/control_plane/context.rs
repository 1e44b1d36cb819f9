//! What every pass of the KubernetesControlPlane controller shares: the core, the watch caches
//! of the children, the certificate lifetime and the pull secrets.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Secret, Service};
use kube::runtime::reflector::Store;
use noops_api::EtcdCluster;

/// What this controller keeps beside the core: its watch caches and settings.
pub struct State {
    /// The children, kept by watches of what noops manages: a pass reads them from here.
    pub etcd_clusters: Store<EtcdCluster>,
    pub deployments: Store<Deployment>,
    pub services: Store<Service>,
    /// The certificates and kubeconfigs, and the etcd client certificate the EtcdCluster makes.
    pub secrets: Store<Secret>,
    /// The pods of the components (why a rollout cannot go on, where each runs).
    pub pods: Store<Pod>,
    /// The nodes, for which could take a pod of a component that shares one (spread.rs).
    pub nodes: Store<Node>,
    /// Evicts without retrying: a budget's 429 is "not now" for this pass.
    pub evictions: kube::Client,
    /// How long a leaf certificate lasts (issued again with a third of it left).
    pub certificate_lifetime: Duration,
    /// The Secrets the components' pods pull their images with (the registry setting is not
    /// theirs: their images are Kubernetes' own releases).
    pub images: crate::core::images::Images,
}

/// What every reconcile of this controller shares.
pub type Context = crate::core::controller::Context<State>;
