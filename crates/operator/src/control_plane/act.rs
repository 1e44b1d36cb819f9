//! Carrying out a pass: the children applied in order (the EtcdCluster and the Service, the
//! CAs and certificates, then the Deployments the plan gives a release), each apply skipped when
//! the live object already is as desired. CAs and the service-account key are only ever
//! created: a key in use is never replaced.

use std::net::IpAddr;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{EvictParams, Patch, PatchParams};
use kube::{Api, Resource};
use noops_api::{EtcdCluster, KubernetesControlPlane};

use super::certificates::{self, Addresses, Authority, Certificate, Servers};
use super::context::Context;
use super::desired;
use super::names::{Component, Names};
use super::observe::Live;
use super::plan::Plan;
use crate::core::apply::{FIELD_MANAGER, apply, create_if_missing};
use crate::core::crash;
use crate::core::pki::{self, Ca, NOT_AFTER_ANNOTATION, new_key_pair};
use crate::core::stamp::{is_subset, same_stamp, up_to_date};
use crate::core::{Error, Result};

/// Applies the stamped `desired` unless `live` already is as it asks; what is live after.
async fn apply_if_changed<K>(api: &Api<K>, desired: &K, live: Option<&K>) -> Result<K>
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if let Some(live) = live.filter(|l| up_to_date(desired, Some(*l))) {
        return Ok(live.clone());
    }
    let name = desired.meta().name.clone().unwrap_or_default();
    Ok(apply(api, &name, desired).await?)
}

/// The tenant's EtcdCluster and the API server's Service; the Service as it is after.
pub async fn apply_etcd_and_service(
    ctx: &Context,
    names: &Names,
    etcd: &EtcdCluster,
    service: &Service,
    live: &Live,
) -> Result<Service> {
    let etcd_clusters: Api<EtcdCluster> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let applied = desired::etcd_cluster_applied(etcd);
    let in_place = live
        .etcd
        .as_ref()
        .is_some_and(|l| same_stamp(etcd, l) && serde_json::to_value(l).is_ok_and(|l| is_subset(&applied, &l)));
    if !in_place {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        etcd_clusters
            .patch(&names.etcd(), &params, &Patch::Apply(&applied))
            .await?;
        crash::point("control plane: EtcdCluster applied");
    }
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &names.namespace);
    apply_if_changed(&services, service, live.service.as_ref()).await
}

/// The Service's ClusterIP, once the API server has given it one.
pub fn cluster_ip(service: &Service) -> Option<IpAddr> {
    service.spec.as_ref()?.cluster_ip.as_deref()?.parse().ok()
}

/// The two CAs, made (and the service-account key pair) if they are not there yet.
pub struct Authorities {
    pub cluster: Ca,
    pub front_proxy: Ca,
}

impl Authorities {
    pub fn of(&self, authority: Authority) -> &Ca {
        match authority {
            Authority::Cluster => &self.cluster,
            Authority::FrontProxy => &self.front_proxy,
        }
    }
}

/// Reads the CAs from their Secrets, or makes them, and makes the service-account key pair if
/// it is not there. A Secret the cache does not hold yet may still exist (made by the pass
/// before): it is created only if absent, and a CA is read back if it was there.
pub async fn ensure_authorities(
    ctx: &Context,
    names: &Names,
    live: &Live,
    owner: &OwnerReference,
    now: jiff::Timestamp,
) -> Result<Authorities> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let certificate = |e: crate::core::pki::PkiError| Error::Certificate(e.to_string());
    let read_or_make = async |authority: Authority| -> Result<Ca> {
        let (name, common_name) = (authority.secret(names), authority.common_name(names));
        let secret = match live.secrets.get(&name) {
            Some(secret) => secret.clone(),
            None => {
                let ca = Ca::new(&common_name, now).map_err(certificate)?;
                let made = certificates::ca_secret(names, authority, &ca, owner);
                if create_if_missing(&secrets, &made).await? {
                    crash::point("control plane: a CA made");
                    made
                } else {
                    // Made by another pass meanwhile: its CA is the one.
                    crate::core::confirm::read(&secrets, &name, "ca-made-meanwhile").await?
                }
            }
        };
        Ca::of(&secret, &common_name).map_err(certificate)
    };
    let cluster = read_or_make(Authority::Cluster).await?;
    let front_proxy = read_or_make(Authority::FrontProxy).await?;
    if !live.secrets.contains_key(&names.service_account_secret()) {
        let (private, public) = new_key_pair().map_err(certificate)?;
        let secret = certificates::service_account_secret(names, private, public, owner);
        create_if_missing(&secrets, &secret).await?;
    }
    Ok(Authorities { cluster, front_proxy })
}

/// Issues every certificate that is due (missing, a third of its life left, naming another
/// address, or signed by another CA) and applies its Secret; the certificates issued.
#[allow(clippy::too_many_arguments)]
pub async fn issue_due(
    ctx: &Context,
    names: &Names,
    live: &Live,
    authorities: &Authorities,
    addresses: &Addresses,
    servers: &Servers,
    owner: &OwnerReference,
    now: jiff::Timestamp,
) -> Result<Vec<Certificate>> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let mut issued = Vec::new();
    for certificate in Certificate::ALL {
        let leaf = certificate.leaf(names, addresses);
        let name = certificate.secret(names);
        let ca = authorities.of(certificate.authority());
        let expires = |at| {
            ctx.core.metrics.set_certificate_expiry(
                "KubernetesControlPlane",
                &names.namespace,
                &names.control_plane,
                &name,
                at,
            )
        };
        let live_secret = live.secrets.get(&name);
        let server = servers.said_for(certificate);
        if !certificates::due(live_secret, &leaf, ca, &server, now, ctx.certificate_lifetime) {
            if let Some(at) = live_secret.and_then(pki::not_after) {
                expires(at);
            }
            continue;
        }
        let made = ca
            .issue(&leaf, now, ctx.certificate_lifetime)
            .map_err(|e| Error::Certificate(e.to_string()))?;
        let secret = certificates::leaf_secret(names, certificate, &leaf, &made, ca, servers, owner);
        apply(&secrets, &name, &secret).await?;
        expires(made.not_after);
        crash::point("control plane: a certificate issued");
        issued.push(certificate);
    }
    Ok(issued)
}

/// When the certificates `component` mounts expire, as their Secrets say, in one string.
fn certificates_not_after(names: &Names, component: Component, live: &Live) -> String {
    let not_after = |name: &String| {
        live.secrets
            .get(name)
            .and_then(|s| s.metadata.annotations.as_ref()?.get(NOT_AFTER_ANNOTATION).cloned())
            .unwrap_or_default()
    };
    let all: Vec<String> = desired::mounted_certificates(names, component)
        .iter()
        .map(not_after)
        .collect();
    all.join(",")
}

/// Applies the Deployment of every component the plan gives a release, the API servers first.
pub async fn apply_deployments(
    ctx: &Context,
    kcp: &KubernetesControlPlane,
    names: &Names,
    plan: &Plan,
    live: &Live,
    owner: &OwnerReference,
) -> Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &names.namespace);
    for component in Component::ALL {
        let release = match component {
            Component::ApiServer => plan.api_server.as_ref(),
            _ => plan.controllers.as_ref(),
        };
        let Some(release) = release else { continue };
        let certificates = certificates_not_after(names, component, live);
        let desired = desired::deployment(kcp, names, component, release, &certificates, &ctx.images, owner);
        let live = live.deployments.get(&component);
        if !live.is_some_and(|l| up_to_date(&desired, Some(l))) {
            apply(&deployments, &names.deployment(component), &desired).await?;
            crash::point(match component {
                Component::ApiServer => "control plane: API server Deployment applied",
                _ => "control plane: controller-manager or scheduler Deployment applied",
            });
        }
    }
    Ok(())
}

/// Evicts `pod` of the control plane (a replica that shares its node with another; its
/// Deployment makes one that prefers a node without one). Whether it went: a budget that allows
/// no disruption now (429) or a pod already gone leaves it for a later pass.
pub async fn evict_to_spread(ctx: &Context, names: &Names, pod: &str) -> Result<bool> {
    let pods: Api<Pod> = Api::namespaced(ctx.evictions.clone(), &names.namespace);
    match pods.evict(pod, &EvictParams::default()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 429 || e.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}
