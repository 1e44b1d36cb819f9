//! `kubectl noops describe kc/<name>`: reads the cluster and the objects of its namespace a
//! tree may show, and prints the tree (`tree.rs`).

use anyhow::{Context as _, bail};
use kube::api::{Api, ListParams};
use kube::{Client, Resource};
use noops_api::KubernetesCluster;

use crate::resources::Kind;
use crate::tree::{self, Parts};

pub async fn describe(client: &Client, namespace: &str, kind: Kind, name: &str) -> anyhow::Result<String> {
    if kind != Kind::KubernetesCluster {
        bail!(
            "describe shows the tree of a KubernetesCluster (kc/<name>); for a {kind}, kubectl noops status {}/{name}",
            kind.short_name()
        );
    }
    let kc = Api::<KubernetesCluster>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .with_context(|| format!("reading KubernetesCluster {namespace}/{name}"))?;
    let parts = Parts {
        control_planes: all(client, namespace).await?,
        etcds: all(client, namespace).await?,
        deployments: all(client, namespace).await?,
        sets: all(client, namespace).await?,
        machines: all(client, namespace).await?,
    };
    Ok(tree::render(&kc, &parts))
}

/// Every `K` of `namespace`.
async fn all<K>(client: &Client, namespace: &str) -> anyhow::Result<Vec<K>>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    Ok(Api::<K>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing the {}s of {namespace}", K::kind(&())))?
        .items)
}
