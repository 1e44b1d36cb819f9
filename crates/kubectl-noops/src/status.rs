//! `kubectl noops status <kind>/<name>`: reads the resource and what lies around it (its
//! backups, sets or machines, the certificates the operator issued it, its Warning Events)
//! and makes its report (`kinds.rs`).

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, ListParams};
use kube::{Client, Resource, ResourceExt};
use noops_api::{
    EtcdBackup, EtcdCluster, KubernetesCluster, KubernetesControlPlane, Machine, MachineDeployment, MachineSet,
    MaintPage, PostgreSQL, PostgresBackup,
};

use crate::kinds::{self, Around};
use crate::report::Report;
use crate::resources::Kind;

/// The annotation on a certificate Secret the operator issued: when it expires.
pub const NOT_AFTER_ANNOTATION: &str = "noops.dev/not-after";

/// Reads what lies around the resource with `meta`: certificate Secrets it owns, its Warning
/// Events.
async fn around(client: &Client, namespace: &str, meta: &kube::api::ObjectMeta) -> anyhow::Result<Around> {
    let uid = meta.uid.clone().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut certificates: Vec<(String, jiff::Timestamp)> = secrets
        .list_metadata(&ListParams::default())
        .await
        .context("listing Secrets (their metadata only)")?
        .items
        .into_iter()
        .filter(|s| s.owner_references().iter().any(|o| o.uid == uid))
        .filter_map(|s| {
            let at = s.annotations().get(NOT_AFTER_ANNOTATION)?.parse().ok()?;
            Some((s.name_any(), at))
        })
        .collect();
    certificates.sort();
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let warnings = events
        .list(&ListParams::default().fields(&format!("involvedObject.uid={uid},type=Warning")))
        .await
        .context("listing Events")?
        .items
        .into_iter()
        .filter_map(|e| {
            let when = e
                .series
                .as_ref()
                .and_then(|s| s.last_observed_time.as_ref())
                .map(|t| t.0)
                .or(e.last_timestamp.as_ref().map(|t| t.0))
                .or(e.event_time.as_ref().map(|t| t.0))?;
            Some((when, e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        })
        .collect();
    Ok(Around {
        now: jiff::Timestamp::now(),
        certificates,
        warnings,
        ..Default::default()
    })
}

/// Reads `kind` `name` of `namespace`, saying which it could not.
async fn read<K>(client: &Client, namespace: &str, name: &str) -> anyhow::Result<K>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    Api::<K>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .with_context(|| format!("reading {} {namespace}/{name}", K::kind(&())))
}

/// Every `K` of `namespace` that `owner` owns.
async fn owned_by<K>(client: &Client, namespace: &str, owner: &kube::api::ObjectMeta) -> anyhow::Result<Vec<K>>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let uid = owner.uid.clone().unwrap_or_default();
    Ok(Api::<K>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing {}s", K::kind(&())))?
        .items
        .into_iter()
        .filter(|o| o.owner_references().iter().any(|r| r.uid == uid))
        .collect())
}

pub async fn status(client: &Client, namespace: &str, kind: Kind, name: &str) -> anyhow::Result<Report> {
    Ok(match kind {
        Kind::EtcdCluster => {
            let cluster: EtcdCluster = read(client, namespace, name).await?;
            let mut around = around(client, namespace, cluster.meta()).await?;
            around.backups = Api::<EtcdBackup>::namespaced(client.clone(), namespace)
                .list(&ListParams::default())
                .await
                .context("listing EtcdBackups")?
                .items
                .into_iter()
                .filter(|b| b.spec.cluster == name)
                .map(|b| (b.name_any(), b.status.map(|s| s.progress).unwrap_or_default()))
                .collect();
            kinds::etcd(&cluster, &around)
        }
        Kind::PostgreSQL => {
            let pg: PostgreSQL = read(client, namespace, name).await?;
            let mut around = around(client, namespace, pg.meta()).await?;
            around.backups = Api::<PostgresBackup>::namespaced(client.clone(), namespace)
                .list(&ListParams::default())
                .await
                .context("listing PostgresBackups")?
                .items
                .into_iter()
                .filter(|b| b.spec.postgresql == name)
                .map(|b| (b.name_any(), b.status.map(|s| s.progress).unwrap_or_default()))
                .collect();
            kinds::postgres(&pg, &around)
        }
        Kind::MaintPage => {
            let page: MaintPage = read(client, namespace, name).await?;
            let around = around(client, namespace, page.meta()).await?;
            kinds::maintpage(&page, &around)
        }
        Kind::KubernetesCluster => {
            let kc: KubernetesCluster = read(client, namespace, name).await?;
            let around = around(client, namespace, kc.meta()).await?;
            kinds::kubernetes_cluster(&kc, &around)
        }
        Kind::KubernetesControlPlane => {
            let kcp: KubernetesControlPlane = read(client, namespace, name).await?;
            let around = around(client, namespace, kcp.meta()).await?;
            kinds::control_plane(&kcp, &around)
        }
        Kind::EtcdBackup => {
            let backup: EtcdBackup = read(client, namespace, name).await?;
            let around = around(client, namespace, backup.meta()).await?;
            kinds::etcd_backup(&backup, &around)
        }
        Kind::PostgresBackup => {
            let backup: PostgresBackup = read(client, namespace, name).await?;
            let around = around(client, namespace, backup.meta()).await?;
            kinds::postgres_backup(&backup, &around)
        }
        Kind::Machine => {
            let machine: Machine = read(client, namespace, name).await?;
            let around = around(client, namespace, machine.meta()).await?;
            kinds::machine(&machine, &around)
        }
        Kind::MachineSet => {
            let set: MachineSet = read(client, namespace, name).await?;
            let machines: Vec<Machine> = owned_by(client, namespace, set.meta()).await?;
            let around = around(client, namespace, set.meta()).await?;
            kinds::machine_set(&set, &machines, &around)
        }
        Kind::MachineDeployment => {
            let md: MachineDeployment = read(client, namespace, name).await?;
            let sets: Vec<MachineSet> = owned_by(client, namespace, md.meta()).await?;
            let around = around(client, namespace, md.meta()).await?;
            kinds::machine_deployment(&md, &sets, &around)
        }
    })
}
