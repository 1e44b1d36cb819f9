//! One KubernetesCluster pass: observe (its control plane and pools) → validate (no name taken
//! by another owner) → plan (`plan.rs`, pure) → build (`desired.rs`) → apply (the control
//! plane, each pool, pools removed) → status (`status.rs`).

use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use noops_api::kubernetes_cluster::{KubernetesCluster, KubernetesClusterStatus};
use noops_api::{KubernetesControlPlane, MachineDeployment};
use serde_json::json;
use tracing::info;

use super::context::Context;
use super::desired;
use super::plan::{ControlPlaneView, PoolView, plan};
use super::status::{self, StatusFacts};
use crate::core::apply::{apply, apply_status, controlled_by, controller_reference, delete_if_present};
use crate::core::cache::in_namespace;
use crate::core::events::Announcement;
use crate::core::{DuringStage, Error, Result, Stage, crash};

/// Children wake a cluster when they change; this is only a safety net.
const LOOK_AGAIN: Duration = Duration::from_secs(60);

/// Reconciles one cluster (the caller's span names it).
pub async fn reconcile(kc: Arc<KubernetesCluster>, ctx: &Context) -> Result<Action> {
    let namespace = kc.namespace().unwrap_or_default();
    let name = kc.name_any();
    let now = jiff::Timestamp::now();
    let owner = controller_reference(kc.as_ref())
        .ok_or_else(|| Error::Internal("the KubernetesCluster has no uid yet".into()))
        .during(Stage::Validate)?;

    // Observe: the control plane of the cluster's name and the deployments it owns.
    let control_plane = ctx
        .control_planes
        .get(&ObjectRef::new(&name).within(&namespace))
        .map(|cp| (*cp).clone());
    let deployments: Vec<MachineDeployment> = in_namespace(&ctx.deployments, &namespace)
        .into_iter()
        .filter(|d| controlled_by(&d.metadata, &owner.uid))
        .collect();

    // Validate: a child's name held by something else is never taken over.
    let taken = taken_names(&kc, control_plane.as_ref(), ctx, &namespace, &owner.uid);
    let ours = control_plane.filter(|cp| controlled_by(&cp.metadata, &owner.uid));

    let views: Vec<PoolView> = deployments.iter().map(PoolView::of).collect();
    let plan = plan(&kc, ours.as_ref().map(ControlPlaneView::of).as_ref(), &views);

    if taken.is_none() {
        let control_planes: Api<KubernetesControlPlane> = Api::namespaced(ctx.client.clone(), &namespace);
        let wanted = desired::control_plane(&kc, &plan.control_plane_version, &owner);
        if ours.as_ref().is_none_or(|cp| cp.spec != wanted.spec) {
            apply(&control_planes, &name, &wanted).await.during(Stage::Apply)?;
            match &ours {
                None => info!(version = %plan.control_plane_version, "made the control plane"),
                Some(cp) if cp.spec.version != wanted.spec.version => {
                    info!(from = %cp.spec.version, to = %wanted.spec.version, "gave the control plane its new version");
                    crash::point("kubernetescluster: control plane given a new version, status not written");
                }
                Some(_) => info!("brought the control plane's settings in line with the cluster"),
            }
        }
        let machine_deployments: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &namespace);
        for pool in &plan.pools {
            let Some(spec) = kc.spec.workers.iter().find(|p| p.name == pool.pool) else {
                continue;
            };
            let wanted = desired::machine_deployment(&kc, spec, &pool.version, pool.replicas, &owner);
            let live = deployments
                .iter()
                .find(|d| d.metadata.name.as_ref() == Some(&pool.name));
            if live.is_some_and(|l| l.spec == wanted.spec) {
                continue;
            }
            apply(&machine_deployments, &pool.name, &wanted)
                .await
                .during(Stage::Apply)?;
            match live {
                None => info!(pool = %pool.pool, version = %pool.version, replicas = pool.replicas, "made the pool"),
                Some(l) if l.spec.template.spec.version != pool.version => {
                    info!(pool = %pool.pool, from = %l.spec.template.spec.version, to = %pool.version, "gave the pool its new version");
                    crash::point("kubernetescluster: a pool given a new version, status not written");
                }
                Some(_) => {
                    info!(pool = %pool.pool, replicas = pool.replicas, "brought the pool in line with the cluster")
                }
            }
        }
        for gone in &plan.remove {
            delete_if_present(&machine_deployments, gone, &Default::default())
                .await
                .during(Stage::Apply)?;
            info!(deployment = %gone, "removed a pool no longer in the spec: its machines are drained away");
        }
    }

    // Status, from the children as this pass left them (the caches catch up on the next).
    let facts = StatusFacts {
        kc: &kc,
        control_plane: ours.as_ref(),
        deployments: &deployments,
        plan: &plan,
        taken,
    };
    let status = status::build(&facts, now);
    let reference = kc.object_ref(&());
    for announcement in announcements(kc.status.as_ref(), &status, &plan.remove) {
        ctx.core.events.tell(&reference, announcement).await;
    }
    if kc.status.as_ref() != Some(&status) {
        let api: Api<KubernetesCluster> = Api::namespaced(ctx.client.clone(), &namespace);
        let body = json!({ "apiVersion": "noops.dev/v1alpha1", "kind": "KubernetesCluster", "status": status });
        apply_status(&api, &name, &body).await.during(Stage::Status)?;
    }
    Ok(Action::requeue(LOOK_AGAIN))
}

/// A child's name held by an object this cluster does not control, said as a condition would.
fn taken_names(
    kc: &KubernetesCluster,
    control_plane: Option<&KubernetesControlPlane>,
    ctx: &Context,
    namespace: &str,
    uid: &str,
) -> Option<String> {
    let name = kc.name_any();
    if control_plane.is_some_and(|cp| !controlled_by(&cp.metadata, uid)) {
        return Some(format!(
            "a KubernetesControlPlane {name} that is not this cluster's exists: delete or rename one of them"
        ));
    }
    kc.spec.workers.iter().find_map(|pool| {
        let md_name = desired::pool_deployment_name(&name, &pool.name);
        let live = ctx.deployments.get(&ObjectRef::new(&md_name).within(namespace))?;
        (!controlled_by(&live.metadata, uid)).then(|| {
            format!(
                "a MachineDeployment {md_name} that is not this cluster's exists: delete it or rename pool {}",
                pool.name
            )
        })
    })
}

/// A new phase, an upgrade's steps, a pool removed, a name taken, as Events.
fn announcements(
    previous: Option<&KubernetesClusterStatus>,
    now: &KubernetesClusterStatus,
    removed: &[String],
) -> Vec<Announcement> {
    let mut out = Vec::new();
    let before = previous.and_then(|p| p.upgrade.as_ref());
    if let Some(upgrade) = &now.upgrade {
        let same = before.filter(|b| b.to == upgrade.to && b.started_at == upgrade.started_at);
        if same.is_none() && upgrade.finished_at.is_none() {
            out.push(Announcement::normal(
                "UpgradeStarted",
                format!(
                    "upgrading from {} to {}: the control plane first, then each pool in turn",
                    upgrade.from, upgrade.to
                ),
            ));
        }
        let seen = same.map_or(0, |b| b.finished.len());
        for step in upgrade.finished.iter().skip(seen) {
            let reason = if step == "ControlPlane" {
                "ControlPlaneUpgraded"
            } else {
                "PoolUpgraded"
            };
            out.push(Announcement::normal(reason, format!("{step} runs {}", upgrade.to)));
        }
        if upgrade.finished_at.is_some() && same.is_some_and(|b| b.finished_at.is_none()) {
            out.push(Announcement::normal(
                "UpgradeCompleted",
                format!("every part of the cluster runs {}", upgrade.to),
            ));
        }
    }
    for gone in removed {
        out.push(Announcement::normal(
            "PoolRemoved",
            format!("removing MachineDeployment {gone}: its pool is no longer in the spec"),
        ));
    }
    let phase = |s: Option<&KubernetesClusterStatus>| s.and_then(|s| s.phase.clone());
    if phase(Some(now)) != phase(previous)
        && let Some(p) = phase(Some(now))
    {
        let degraded = now
            .conditions
            .iter()
            .find(|c| c.type_ == noops_api::condition::DEGRADED && c.status == "True");
        out.push(match degraded {
            Some(c) if p == "Degraded" => Announcement::warning(c.reason.clone(), c.message.clone()),
            _ => Announcement::normal(
                p,
                format!(
                    "control plane {}, nodes {}",
                    now.control_plane.clone().unwrap_or_default(),
                    now.nodes.clone().unwrap_or_default()
                ),
            ),
        });
    }
    out
}
