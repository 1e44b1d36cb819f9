//! One MaintPage reconcile, in stages: read → validate → plan and build (pure) → apply → status.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::ObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use noops_api::maintpage::{MaintPage, Side};
use serde_json::json;
use tracing::{debug, info, warn};

use super::desired::{self, published_side, rolled_out};
use super::switch::{self, Observed};
use super::{Context, status};
use crate::core::apply::{apply, apply_status, controlled_by, controller_reference, up_to_date};
use crate::core::{Error, Result};

/// The live children of a MaintPage (any of them may not exist yet).
struct Live {
    app: Option<Deployment>,
    maintenance: Option<Deployment>,
    service: Option<Service>,
}

/// Reads the children from the watch caches. The caches hold only objects labelled as ours, so
/// a child missing there is looked up directly: an object of that name that is not ours must
/// be found, not overwritten.
async fn read(
    mp: &MaintPage,
    namespace: &str,
    ctx: &Context,
    deployments: &Api<Deployment>,
    services: &Api<Service>,
) -> Result<Live> {
    let cached_deployment = |name: &str| {
        ctx.deployments
            .get(&ObjectRef::new(name).within(namespace))
            .map(|d| (*d).clone())
    };
    let app = match cached_deployment(&mp.spec.app.name) {
        Some(d) => Some(d),
        None => deployments.get_opt(&mp.spec.app.name).await?,
    };
    let maintenance = match cached_deployment(&mp.spec.maintenance_name()) {
        Some(d) => Some(d),
        None => deployments.get_opt(&mp.spec.maintenance_name()).await?,
    };
    let service = match ctx.services.get(&ObjectRef::new(&mp.spec.app.name).within(namespace)) {
        Some(s) => Some((*s).clone()),
        None => services.get_opt(&mp.spec.app.name).await?,
    };
    Ok(Live {
        app,
        maintenance,
        service,
    })
}

/// Refuses to take over objects that exist but belong to someone else: applying over them
/// would break whatever they serve.
fn validate(mp: &MaintPage, live: &Live) -> Result<()> {
    let uid = mp.uid().unwrap_or_default();
    let found: [(&'static str, Option<&ObjectMeta>); 3] = [
        ("Deployment", live.app.as_ref().map(|d| &d.metadata)),
        ("Deployment", live.maintenance.as_ref().map(|d| &d.metadata)),
        ("Service", live.service.as_ref().map(|s| &s.metadata)),
    ];
    for (kind, meta) in found {
        if let Some(meta) = meta.filter(|m| !controlled_by(m, &uid)) {
            return Err(Error::NameConflict {
                kind,
                name: meta.name.clone().unwrap_or_default(),
                owner: "MaintPage",
            });
        }
    }
    Ok(())
}

/// Reconciles one MaintPage.
pub async fn reconcile(mp: Arc<MaintPage>, ctx: &Context) -> Result<Action> {
    let namespace = mp.namespace().unwrap_or_else(|| "default".into());
    let name = mp.name_any();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    let maintpages: Api<MaintPage> = Api::namespaced(ctx.client.clone(), &namespace);
    let reference = mp.object_ref(&());
    let now = jiff::Timestamp::now();

    let live = read(&mp, &namespace, ctx, &deployments, &services).await?;
    if let Err(error) = validate(&mp, &live) {
        warn!(maintpage = %format!("{namespace}/{name}"), reason = error.reason(), %error, "cannot carry out the spec");
        let blocked = status::blocked(&mp, error.reason(), &error.to_string(), now);
        if mp.status.as_ref() != Some(&blocked) {
            ctx.events.warning(&reference, error.reason(), error.to_string()).await;
            apply_status(&maintpages, &name, &status_body(&blocked)).await?;
        }
        return Err(error);
    }

    let previous = mp.status.clone().unwrap_or_default();
    let observed = Observed {
        published: previous.published.or_else(|| published_side(live.service.as_ref())),
        switched_at: previous.switched_at.as_ref().map(|t| t.0),
        app_ready: rolled_out(live.app.as_ref(), mp.spec.app.replicas),
        maintenance_ready: rolled_out(live.maintenance.as_ref(), mp.spec.maintenance.replicas),
    };
    let plan = switch::plan(&mp.spec, &observed, now);
    let owner =
        controller_reference(mp.as_ref()).ok_or_else(|| Error::InvalidSpec("the MaintPage has no uid yet".into()))?;
    let mut children = desired::build(&mp, &plan, &owner);
    desired::stamp_all(&mut children);
    let drift = desired::drift(
        &children,
        live.app.as_ref(),
        live.maintenance.as_ref(),
        live.service.as_ref(),
    );

    // The maintenance pods start before the Service may point at them; the Service moves only
    // to pods that are Ready (the plan checked), and the app is never scaled down here.
    // Each child is applied on the condition that it is still as read: a hand edit made since
    // would otherwise be reverted without being noticed (and reported). On a conflict the
    // reconcile simply looks again.
    let (Some(maintenance), Some(app), Some(_)) = (
        apply_unchanged(&deployments, &children.maintenance, live.maintenance.as_ref()).await?,
        apply_unchanged(&deployments, &children.app, live.app.as_ref()).await?,
        apply_unchanged(&services, &children.service, live.service.as_ref()).await?,
    ) else {
        debug!(maintpage = %format!("{namespace}/{name}"), "a child changed while reconciling; looking again");
        return Ok(Action::requeue(std::time::Duration::from_millis(50)));
    };

    // Event reasons differ by what happened: the recorder folds events with the same reason
    // into one series, keeping the first note.
    for (reason, note) in drift {
        info!(maintpage = %format!("{namespace}/{name}"), "reverted a hand edit: {note}");
        ctx.events.warning(&reference, reason, note).await;
    }
    if plan.switched {
        let (reason, to) = match plan.publish {
            Side::App => ("SwitchedToApp", "the app"),
            Side::Maintenance => ("SwitchedToMaintenance", "the maintenance page"),
        };
        info!(maintpage = %format!("{namespace}/{name}"), published = ?plan.publish, "switched the Service");
        ctx.events
            .normal(
                &reference,
                reason,
                format!("Service {} now sends traffic to {to}", mp.spec.app.name),
            )
            .await;
    }
    if let Some(side) = plan.waiting_for
        && !is_waiting(&previous)
    {
        let (reason, pods) = match side {
            Side::App => ("WaitingForApp", "app"),
            Side::Maintenance => ("WaitingForMaintenance", "maintenance"),
        };
        info!(maintpage = %format!("{namespace}/{name}"), waiting_for = pods, "holding the switch until the pods are Ready");
        ctx.events
            .normal(
                &reference,
                reason,
                format!("the Service switches once the {pods} pods are Ready"),
            )
            .await;
    }

    let status = status::build(&mp, &plan, Some(&app), Some(&maintenance), now);
    if mp.status.as_ref() != Some(&status) {
        apply_status(&maintpages, &name, &status_body(&status)).await?;
    }
    Ok(plan
        .requeue_after
        .map(Action::requeue)
        .unwrap_or_else(Action::await_change))
}

/// Applies the stamped `desired` if the live object is still at the version read (`None` if it
/// changed); skips the request when the live object already is as desired.
async fn apply_unchanged<K>(api: &Api<K>, desired: &K, read: Option<&K>) -> Result<Option<K>>
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if up_to_date(desired, read) {
        return Ok(read.cloned());
    }
    let mut desired = desired.clone();
    desired.meta_mut().resource_version = read.and_then(|r| r.meta().resource_version.clone());
    let name = desired.meta().name.clone().unwrap_or_default();
    match apply(api, &name, &desired).await {
        Ok(applied) => Ok(Some(applied)),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn is_waiting(status: &noops_api::MaintPageStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == noops_api::condition::READY && c.reason == "Switching")
}

fn status_body(status: &noops_api::MaintPageStatus) -> serde_json::Value {
    json!({ "apiVersion": "noops.dev/v1alpha1", "kind": "MaintPage", "status": status })
}
