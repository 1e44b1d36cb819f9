//! What a KubernetesControlPlane pass sees, all from watch caches: its EtcdCluster, Service,
//! Deployments and Secrets, the facts the plan needs (the version each part runs and whether it
//! has rolled out), and why the pods of a component cannot start.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::runtime::reflector::{ObjectRef, Store};
use noops_api::{EtcdCluster, KubernetesControlPlane};

use super::certificates::{Authority, Certificate};
use super::context::Context;
use super::desired::replicas;
use super::names::{Component, Names};
use super::spread::Spread;
use super::versions::Release;
use crate::core::conditions::is_true;
use crate::core::rollout::{deployment_ready_replicas, deployment_rolled_out, image_of};
use crate::core::stuck::{Stuck, stuck};

/// A component's Deployment as the plan needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployed {
    /// The Kubernetes version of its pod template's image.
    pub version: String,
    /// Every replica of that template runs and is Ready.
    pub rolled_out: bool,
    /// Ready pods, of any template.
    pub ready: i32,
}

/// What the plan needs to know.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// The etcd version the EtcdCluster is asked for, and the version it runs.
    pub etcd_spec_version: Option<String>,
    pub etcd_version: Option<String>,
    /// The EtcdCluster is Ready.
    pub etcd_ready: bool,
    /// Its client certificate's Secret exists (the API servers mount it).
    pub etcd_client_secret: bool,
    pub deployed: BTreeMap<Component, Deployed>,
}

impl Facts {
    /// The release a component's Deployment runs, if it exists.
    pub fn release_of(&self, component: Component) -> Option<Release> {
        self.deployed.get(&component).and_then(|d| Release::of(&d.version))
    }

    /// Whether a component runs `release` everywhere, Ready.
    pub fn rolled_out(&self, component: Component, release: &Release) -> bool {
        self.deployed
            .get(&component)
            .is_some_and(|d| d.rolled_out && d.version == release.kubernetes)
    }

    /// An etcd at `version`, Ready, with its client certificate, and nothing deployed.
    #[cfg(test)]
    pub fn etcd_ready(version: &str) -> Self {
        Self {
            etcd_spec_version: Some(version.into()),
            etcd_version: Some(version.into()),
            etcd_ready: true,
            etcd_client_secret: true,
            ..Default::default()
        }
    }

    #[cfg(test)]
    pub fn deployed(&mut self, component: Component, version: &str, rolled_out: bool) {
        let deployed = Deployed {
            version: version.into(),
            rolled_out,
            ready: i32::from(rolled_out),
        };
        self.deployed.insert(component, deployed);
    }
}

/// The live children of a control plane (any may not exist yet).
#[derive(Debug, Clone, Default)]
pub struct Live {
    pub etcd: Option<EtcdCluster>,
    pub service: Option<Service>,
    pub deployments: BTreeMap<Component, Deployment>,
    /// Its Secrets by name: CAs, certificates, kubeconfigs, the etcd client certificate.
    pub secrets: BTreeMap<String, Secret>,
}

/// Everything one pass knows.
#[derive(Debug, Clone)]
pub struct Observation {
    pub live: Live,
    pub facts: Facts,
    /// Why the pods of a component cannot start, if they cannot.
    pub stuck: BTreeMap<Component, Stuck>,
    /// When a pod that waits would count as stuck, if one does (look again then).
    pub recheck_after: Option<std::time::Duration>,
    /// Where the components' pods run, and which nodes could take one.
    pub spread: Spread,
}

/// The Kubernetes version of a Deployment's image (`…/kube-apiserver:v1.34.4` → `1.34.4`).
pub fn version_of(deployment: &Deployment) -> Option<String> {
    Some(image_of(deployment)?.rsplit_once(":v")?.1.to_string())
}

/// The object `name` of `namespace` in `store`, if the cache holds it.
fn cached<K>(store: &Store<K>, name: &str, namespace: &str) -> Option<K>
where
    K: kube::Resource<DynamicType = ()> + Clone,
{
    store.get(&ObjectRef::new(name).within(namespace)).map(|o| (*o).clone())
}

/// Reads the children from the watch caches and derives the facts.
pub fn observe(kcp: &KubernetesControlPlane, names: &Names, ctx: &Context, now: jiff::Timestamp) -> Observation {
    let ns = &names.namespace;
    let etcd = cached(&ctx.etcd_clusters, &names.etcd(), ns);
    let service = cached(&ctx.services, &names.service(), ns);
    let deployments: BTreeMap<Component, Deployment> = Component::ALL
        .into_iter()
        .filter_map(|c| Some((c, cached(&ctx.deployments, &names.deployment(c), ns)?)))
        .collect();
    let secret_names = [
        Authority::Cluster.secret(names),
        Authority::FrontProxy.secret(names),
        names.service_account_secret(),
        names.etcd_client_secret(),
    ]
    .into_iter()
    .chain(Certificate::ALL.iter().map(|c| c.secret(names)));
    let secrets: BTreeMap<String, Secret> = secret_names
        .filter_map(|name| Some((name.clone(), cached(&ctx.secrets, &name, ns)?)))
        .collect();
    let facts = Facts {
        etcd_spec_version: etcd.as_ref().map(|e| e.spec.version.clone()),
        etcd_version: etcd.as_ref().and_then(|e| e.status.as_ref()?.current_version.clone()),
        etcd_ready: etcd
            .as_ref()
            .and_then(|e| e.status.as_ref())
            .is_some_and(|s| is_true(&s.conditions, "Ready")),
        etcd_client_secret: secrets.contains_key(&names.etcd_client_secret()),
        deployed: deployments
            .iter()
            .filter_map(|(c, d)| {
                let deployed = Deployed {
                    version: version_of(d)?,
                    rolled_out: deployment_rolled_out(Some(d), replicas(kcp, *c)),
                    ready: deployment_ready_replicas(Some(d)),
                };
                Some((*c, deployed))
            })
            .collect(),
    };
    let pods: Vec<Pod> = ctx
        .pods
        .state()
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(names.namespace.as_str()))
        .map(|p| (**p).clone())
        .collect();
    let mut stuck_components = BTreeMap::new();
    let mut recheck_after = None;
    let mut by_component = BTreeMap::new();
    for component in Component::ALL {
        let selector = names.selector(component);
        let mine: Vec<&Pod> = pods
            .iter()
            .filter(|p| {
                let labels = p.metadata.labels.clone().unwrap_or_default();
                selector.iter().all(|(k, v)| labels.get(k) == Some(v))
            })
            .collect();
        if let Some(found) = stuck(mine.iter().copied(), now) {
            stuck_components.insert(component, found);
        }
        let again = crate::core::stuck::recheck_after(mine.iter().copied(), now);
        recheck_after = [recheck_after, again].into_iter().flatten().min();
        by_component.insert(component, mine);
    }
    let spread = Spread::of(&by_component, &ctx.nodes.state(), now);
    Observation {
        live: Live {
            etcd,
            service,
            deployments,
            secrets,
        },
        facts,
        stuck: stuck_components,
        recheck_after,
        spread,
    }
}
