//! A KubernetesCluster pass as the core's stages: observe (its control plane and pools) →
//! validate (no name taken by another owner) → plan (`plan.rs`, pure, with the autoscaler's
//! decision) → apply (the control plane, each pool, pools removed, built by `desired.rs`) →
//! status (`status.rs`), each once, in that order (`core::stages` drives them).

use noops_api::kubernetes_cluster::KubernetesClusterPhase;
use noops_api::machine_deployment::MachineDeploymentPhase;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use noops_api::kubernetes_cluster::{KubernetesCluster, KubernetesClusterReason, KubernetesClusterStatus};
use noops_api::machine::MachinePhase;
use noops_api::machine_set::DELETE_MACHINE_ANNOTATION;
use noops_api::{KubernetesControlPlane, Machine, MachineDeployment};
use serde_json::json;
use tracing::{debug, info};

use super::KubernetesClusters;
use super::autoscale;
use super::context::Context;
use super::desired;
use super::plan::{ControlPlaneView, PoolView, plan};
use super::status::{self, StatusFacts};
use super::tenant;
use crate::core::apply::{apply, controlled_by, controller_reference, delete_if_present};
use crate::core::cache::in_namespace;
use crate::core::events::Announcement;
use crate::core::stages::{Applied, Observed, Refusal, Report, Stages};
use crate::core::{DuringStage, Error, Result, Stage, crash};

/// Children wake a cluster when they change; this is only a safety net (and how soon a name
/// someone else holds is looked at again).
const LOOK_AGAIN: Duration = Duration::from_secs(60);

/// What a pass sees: its control plane and pools, a child's name someone else holds, the
/// machines, and the tenant's pods and Nodes once its control plane serves.
pub struct Observation {
    /// The control plane of the cluster's name, if it is this cluster's.
    control_plane: Option<KubernetesControlPlane>,
    deployments: Vec<MachineDeployment>,
    /// A child's name held by an object that is not this cluster's, said as a condition would.
    taken: Option<String>,
    /// The machines of its namespace (the cache's).
    machines: Vec<Machine>,
    tenant: Option<(Arc<tenant::TenantView>, tenant::Seen)>,
}

/// What a pass decides: the order of the children's versions with the pools that scale
/// themselves sized, the pools as the plan saw them, and the autoscaler's decision.
pub struct ClusterPlan {
    plan: super::plan::Plan,
    views: Vec<PoolView>,
    decision: Option<autoscale::Decision>,
}

/// What apply did: the children the API server refused, and why; the stale Nodes it removed,
/// as Events.
pub struct Done {
    rejected: Vec<String>,
    removed: Vec<Announcement>,
}

impl Stages for KubernetesClusters {
    type Observation = Observation;
    type Plan = ClusterPlan;
    type Applied = Done;
    /// Paused, the children it has are told so (`paused` passes down to them).
    const APPLIES_WHILE_PAUSED: bool = true;

    async fn observe(
        kc: Arc<KubernetesCluster>,
        ctx: &Context,
        now: jiff::Timestamp,
    ) -> Result<Observed<KubernetesCluster, Observation>> {
        let (namespace, name, uid) = (
            kc.namespace().unwrap_or_default(),
            kc.name_any(),
            kc.uid().unwrap_or_default(),
        );
        let control_plane = ctx
            .control_planes
            .get(&ObjectRef::new(&name).within(&namespace))
            .map(|cp| (*cp).clone());
        let deployments: Vec<MachineDeployment> = in_namespace(&ctx.deployments, &namespace)
            .into_iter()
            .filter(|d| controlled_by(&d.metadata, &uid))
            .collect();
        let taken = taken_names(&kc, control_plane.as_ref(), ctx, &namespace, &uid);
        let control_plane = control_plane.filter(|cp| controlled_by(&cp.metadata, &uid));
        let tenant = observe_tenant(&kc, control_plane.as_ref(), ctx, now).await;
        let seen = Observation {
            control_plane,
            deployments,
            taken,
            machines: in_namespace(&ctx.machines, &namespace),
            tenant,
        };
        Ok(Observed::new(kc, seen))
    }

    /// A child's name held by something else is never taken over: looked at again now and
    /// then, since the other object may go.
    fn validate(
        _: &KubernetesCluster,
        seen: &Observation,
    ) -> std::result::Result<(), Refusal<KubernetesClusterReason>> {
        match &seen.taken {
            Some(taken) => Err(Refusal::looked_at_again(
                KubernetesClusterReason::NameTaken,
                Error::InvalidSpec(taken.clone()),
                LOOK_AGAIN,
            )),
            None => Ok(()),
        }
    }

    fn refused(
        kc: &KubernetesCluster,
        seen: &Observation,
        _: &Refusal<KubernetesClusterReason>,
        now: jiff::Timestamp,
    ) -> Report<KubernetesClusterStatus> {
        let views = pool_views(kc, seen);
        let plan = plan(
            kc,
            seen.control_plane.as_ref().map(ControlPlaneView::of).as_ref(),
            &views,
        );
        let status = status::build(
            &StatusFacts {
                kc,
                control_plane: seen.control_plane.as_ref(),
                deployments: &seen.deployments,
                views: &views,
                plan: &plan,
                taken: seen.taken.clone(),
                autoscale: None,
                rejected: Vec::new(),
            },
            now,
        );
        // What its children did meanwhile (an upgrade's steps, a new phase) is still told;
        // nothing was removed.
        Report {
            news: announcements(kc.status.as_ref(), &status, &[]),
            ..Report::of(status)
        }
    }

    /// The order of the children's versions, then the pools that scale themselves (not while
    /// paused).
    fn plan(kc: &KubernetesCluster, seen: &Observation, now: jiff::Timestamp) -> Result<ClusterPlan> {
        let views = pool_views(kc, seen);
        let mut planned = plan(
            kc,
            seen.control_plane.as_ref().map(ControlPlaneView::of).as_ref(),
            &views,
        );
        let scales = kc.spec.workers.iter().any(|p| p.min_replicas.is_some());
        let decision = seen
            .tenant
            .as_ref()
            .filter(|_| scales && !kc.spec.paused)
            .map(|(_, tenant)| autoscale_decision(kc, &seen.deployments, &seen.machines, tenant, now));
        if let Some(decision) = &decision {
            planned.scale(kc, &decision.replicas);
        }
        Ok(ClusterPlan {
            plan: planned,
            views,
            decision,
        })
    }

    /// The children, and the tenant's Nodes whose machine is gone. Paused, only the children it
    /// has are told so; a cluster paused before it had any makes none (nor a control plane it
    /// lost: `apply_children`).
    async fn apply(
        kc: &KubernetesCluster,
        seen: &Observation,
        plan: &ClusterPlan,
        ctx: &Context,
    ) -> Result<Applied<Done>> {
        let paused = kc.spec.paused;
        if paused && seen.control_plane.is_none() && seen.deployments.is_empty() {
            return Ok(Applied::Done(Done {
                rejected: Vec::new(),
                removed: Vec::new(),
            }));
        }
        let owner =
            controller_reference(kc).ok_or_else(|| Error::Internal("the KubernetesCluster has no uid yet".into()))?;
        let children = Children {
            kc,
            owner: &owner,
            control_plane: seen.control_plane.as_ref(),
            deployments: &seen.deployments,
        };
        let rejected = apply_children(&children, &plan.plan, plan.decision.as_ref(), ctx).await?;
        let removed = match (&seen.tenant, paused) {
            (Some((view, tenant)), false) => remove_stale_nodes(kc, view, tenant, &seen.machines, ctx).await?,
            _ => Vec::new(),
        };
        Ok(Applied::Done(Done { rejected, removed }))
    }

    /// From the children as this pass left them (the caches catch up on the next).
    fn status(
        kc: &KubernetesCluster,
        seen: &Observation,
        plan: &ClusterPlan,
        applied: Option<&Done>,
        now: jiff::Timestamp,
    ) -> Report<KubernetesClusterStatus> {
        let facts = StatusFacts {
            kc,
            control_plane: seen.control_plane.as_ref(),
            deployments: &seen.deployments,
            views: &plan.views,
            plan: &plan.plan,
            taken: None,
            autoscale: plan.decision.as_ref(),
            rejected: applied.map(|a| a.rejected.clone()).unwrap_or_default(),
        };
        let status = status::build(&facts, now);
        let (mut done, news) = news(kc, &status, &plan.plan, plan.decision.as_ref());
        done.extend(applied.iter().flat_map(|a| a.removed.iter().cloned()));
        let next = plan
            .decision
            .as_ref()
            .and_then(|d| d.look_again)
            .map_or(LOOK_AGAIN, |d| d.min(LOOK_AGAIN));
        Report {
            status,
            done,
            news,
            next: Some(next),
        }
    }
}

/// The pools' deployments with their machines, as the plan sees them.
fn pool_views(kc: &KubernetesCluster, seen: &Observation) -> Vec<PoolView> {
    let name = kc.name_any();
    seen.deployments
        .iter()
        .map(|d| {
            let pool = label(&d.metadata, desired::POOL_LABEL).unwrap_or_default();
            PoolView::of(d, seen.machines.iter().filter(|m| of_pool(m, &name, pool)))
        })
        .collect()
}

/// What the autoscaler decides for the pools that scale themselves, from the pods waiting for
/// room and each machine's idle time the status kept.
fn autoscale_decision(
    kc: &KubernetesCluster,
    deployments: &[MachineDeployment],
    machines: &[Machine],
    seen: &tenant::Seen,
    now: jiff::Timestamp,
) -> autoscale::Decision {
    let pools = scaling_pools(kc, deployments, machines, seen);
    let idle_before = kc
        .status
        .iter()
        .flat_map(|s| &s.pools)
        .map(|p| {
            (
                p.name.clone(),
                p.idle_since.iter().map(|(n, t)| (n.clone(), t.0)).collect(),
            )
        })
        .collect();
    autoscale::decide(&pools, &seen.pending, &idle_before, now)
}

/// The Events of a pass: what it did (pools scaled or removed), told now whatever becomes of
/// the status write (the next pass does not do it again and would not tell it); and the rest,
/// told once the status is written.
fn news(
    kc: &KubernetesCluster,
    written: &KubernetesClusterStatus,
    plan: &super::plan::Plan,
    decision: Option<&autoscale::Decision>,
) -> (Vec<Announcement>, Vec<Announcement>) {
    let mut told = announcements(kc.status.as_ref(), written, &plan.remove);
    // A pod the autoscaler cannot help is said once, when the Scaling condition says it first.
    let scaling_said = |s: Option<&KubernetesClusterStatus>| {
        s.and_then(|s| s.conditions.iter().find(|c| c.type_ == status::SCALING))
            .map(|c| c.message.clone())
    };
    let first = scaling_said(kc.status.as_ref()) != scaling_said(Some(written));
    told.extend(decision.iter().flat_map(|d| scaling_announcements(d, first)));
    told.into_iter()
        .partition(|a| ["ScaledUp", "ScaledDown", "PoolRemoved"].contains(&a.reason.as_str()))
}

/// What the tenant shows of its pods and Nodes, once its control plane serves; `None`
/// otherwise (and its watches stop).
async fn observe_tenant(
    kc: &KubernetesCluster,
    control_plane: Option<&KubernetesControlPlane>,
    ctx: &Context,
    now: jiff::Timestamp,
) -> Option<(Arc<tenant::TenantView>, tenant::Seen)> {
    let (namespace, name) = (kc.namespace().unwrap_or_default(), kc.name_any());
    let admin = control_plane
        .and_then(|cp| cp.status.as_ref())
        .filter(|s| s.version.is_some())
        .and_then(|s| s.admin_kubeconfig_secret.clone());
    let (None, Some(admin)) = (&kc.metadata.deletion_timestamp, admin) else {
        ctx.tenants.forget(&namespace, &name);
        return None;
    };
    let secret = ctx.secrets.get(&ObjectRef::new(&admin).within(&namespace))?;
    let view = ctx.tenants.get(&namespace, &name, &secret).await.ok()?;
    match view.seen(now).await {
        Ok(seen) => Some((view, seen)),
        Err(why) => {
            debug!(%why, "the tenant cannot be read for autoscaling this pass");
            None
        }
    }
}

/// Deletes the tenant's Nodes whose machine is gone, and the pods bound to them, as a cloud's
/// node controller and the pod garbage collector do for instances that no longer exist, but at
/// once: a cluster restored from a backup remembers the Nodes of the old one (Ready, until
/// their heartbeats are missed) and their pods (until evicted, then collected), which kept its
/// apps from the new machines for two minutes. A Node goes only once the Machines are listed
/// from the API (a Machine the cache has not seen yet keeps its Node); its pods go without a
/// grace period, since nothing runs them any more. What it did, as Events.
async fn remove_stale_nodes(
    kc: &KubernetesCluster,
    view: &tenant::TenantView,
    seen: &tenant::Seen,
    cached: &[Machine],
    ctx: &Context,
) -> Result<Vec<Announcement>> {
    let namespace = kc.namespace().unwrap_or_default();
    let mut done = Vec::new();
    let known: std::collections::BTreeSet<String> = cached.iter().filter_map(|m| m.metadata.name.clone()).collect();
    if tenant::stale_nodes(&seen.providers, &namespace, &known).is_empty() {
        return Ok(done);
    }
    let machines: Api<Machine> = Api::namespaced(ctx.client.clone(), &namespace);
    let listed: std::collections::BTreeSet<String> =
        crate::core::confirm::list(&machines, &Default::default(), "machines-before-node-delete")
            .await?
            .items
            .into_iter()
            .filter_map(|m| m.metadata.name)
            .collect();
    let nodes: Api<Node> = Api::all(view.client.clone());
    let pods: Api<Pod> = Api::all(view.client.clone());
    for node in tenant::stale_nodes(&seen.providers, &namespace, &listed) {
        delete_if_present(&nodes, &node, &Default::default()).await?;
        let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let bound = crate::core::confirm::list(&pods, &on_node, "pods-of-a-stale-node").await?;
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        for pod in &bound.items {
            let (Some(pod_namespace), Some(pod_name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
                continue;
            };
            let api: Api<Pod> = Api::namespaced(view.client.clone(), pod_namespace);
            delete_if_present(&api, pod_name, &now).await?;
        }
        info!(%node, pods = bound.items.len(), "deleted a tenant Node whose machine is gone, and its pods");
        done.push(Announcement::normal(
            "StaleNodeRemoved",
            format!(
                "deleted Node {node} and its {} pods: the machine it names no longer exists, so they can run elsewhere",
                bound.items.len()
            ),
        ));
    }
    Ok(done)
}

/// The pools that scale themselves and have a MachineDeployment, as the autoscaler needs them.
fn label<'m>(meta: &'m kube::api::ObjectMeta, key: &str) -> Option<&'m str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// Whether machine `m` is of pool `pool` of cluster `cluster` (by its labels).
fn of_pool(m: &Machine, cluster: &str, pool: &str) -> bool {
    label(&m.metadata, desired::CLUSTER_LABEL) == Some(cluster) && label(&m.metadata, desired::POOL_LABEL) == Some(pool)
}

fn scaling_pools<'a>(
    kc: &'a KubernetesCluster,
    deployments: &[MachineDeployment],
    machines: &[Machine],
    seen: &tenant::Seen,
) -> Vec<autoscale::ScalingPool<'a>> {
    let cluster = kc.name_any();
    kc.spec
        .workers
        .iter()
        .filter(|p| p.min_replicas.is_some())
        .filter_map(|pool| {
            let name = desired::pool_deployment_name(&cluster, &pool.name);
            let md = deployments.iter().find(|d| d.metadata.name.as_ref() == Some(&name))?;
            let of_pool: Vec<&Machine> = machines
                .iter()
                .filter(|m| of_pool(m, &cluster, &pool.name) && m.metadata.deletion_timestamp.is_none())
                .collect();
            let ready: BTreeMap<_, _> = of_pool
                .iter()
                .filter_map(|m| {
                    let node = m.metadata.name.clone()?;
                    seen.ready.get(&node).map(|using| (node, *using))
                })
                .collect();
            // A machine whose VM failed, or whose Node's kubelet stopped reporting.
            let lost = of_pool
                .iter()
                .filter(|m| {
                    let failed = m.status.as_ref().and_then(|s| s.phase) == Some(MachinePhase::Failed);
                    failed || m.metadata.name.as_ref().is_some_and(|n| seen.lost.contains(n))
                })
                .count();
            Some(autoscale::ScalingPool {
                spec: pool,
                replicas: md.spec.replicas,
                ready,
                lost,
                rolling: md.status.as_ref().and_then(|s| s.phase) == Some(MachineDeploymentPhase::Rolling),
            })
        })
        .collect()
}

/// The autoscaler's decisions as Events: a pool grown or shrunk, a pod it could not help.
fn scaling_announcements(decision: &autoscale::Decision, news: bool) -> Vec<Announcement> {
    let mut out = Vec::new();
    for (pool, from, to, pods) in &decision.grew {
        out.push(Announcement::normal(
            "ScaledUp",
            format!(
                "pool {pool}: {from} → {to} machines for pods with no room: {}",
                pods.join(", ")
            ),
        ));
    }
    for (pool, from, to, machines) in &decision.shrank {
        out.push(Announcement::normal(
            "ScaledDown",
            format!(
                "pool {pool}: {from} → {to} machines, removing idle {}",
                machines.join(", ")
            ),
        ));
    }
    if !news {
        return out;
    }
    for (pod, pool) in &decision.at_max {
        out.push(Announcement::warning(
            "AtMaxReplicas",
            format!("pod {pod} has no room and pool {pool} is at its maxReplicas"),
        ));
    }
    for pod in &decision.unfit {
        out.push(Announcement::warning(
            "NoPoolFits",
            format!("pod {pod} asks for more than one machine of any pool holds: no machine is made for it"),
        ));
    }
    out
}

/// The cluster's children as this pass found them.
struct Children<'a> {
    kc: &'a KubernetesCluster,
    owner: &'a OwnerReference,
    control_plane: Option<&'a KubernetesControlPlane>,
    deployments: &'a [MachineDeployment],
}

/// What the API server says of a child this pass applies: `Ok(true)` applied, `Ok(false)`
/// refused by its schema (the reason added to `rejected`, for the status: a spec the cluster's
/// schema let through but the child's does not must show, not fail every pass unseen).
fn accepted<T>(result: kube::Result<T>, child: &str, rejected: &mut Vec<String>) -> Result<bool> {
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 422 => {
            tracing::warn!(%child, why = %e.message, "the API server refused a child as the cluster builds it");
            rejected.push(format!("{child} refused: {}", e.message));
            Ok(false)
        }
        Err(e) => Err(e).during(Stage::Apply),
    }
}

/// Apply: the control plane, idle machines marked to go, each pool, pools removed. The
/// children the API server refused, and why.
async fn apply_children(
    children: &Children<'_>,
    plan: &super::plan::Plan,
    decision: Option<&autoscale::Decision>,
    ctx: &Context,
) -> Result<Vec<String>> {
    let mut rejected = Vec::new();
    let Children {
        kc,
        owner,
        control_plane,
        deployments,
    } = *children;
    let (namespace, name) = (kc.namespace().unwrap_or_default(), kc.name_any());
    let control_planes: Api<KubernetesControlPlane> = Api::namespaced(ctx.client.clone(), &namespace);
    let wanted = desired::control_plane(kc, &plan.control_plane_version, owner);
    let child = format!("KubernetesControlPlane {name}");
    // (Paused, one that is not there is not made: only the pools it has are told.)
    let makes = control_plane.is_some() || !kc.spec.paused;
    if makes
        && control_plane.is_none_or(|cp| cp.spec != wanted.spec)
        && accepted(apply(&control_planes, &name, &wanted).await, &child, &mut rejected)?
    {
        match &control_plane {
            None => info!(version = %plan.control_plane_version, "made the control plane"),
            Some(cp) if cp.spec.version != wanted.spec.version => {
                info!(from = %cp.spec.version, to = %wanted.spec.version, "gave the control plane its new version");
                crash::point("kubernetescluster: control plane given a new version, status not written");
            }
            Some(_) => info!("brought the control plane's settings in line with the cluster"),
        }
    }
    // Idle machines are marked to go first before their pools shrink.
    let machines: Api<Machine> = Api::namespaced(ctx.client.clone(), &namespace);
    for machine in decision.iter().flat_map(|d| &d.remove) {
        let body = json!({ "metadata": { "annotations": { DELETE_MACHINE_ANNOTATION: "" } } });
        machines
            .patch(machine, &PatchParams::default(), &Patch::Merge(body))
            .await
            .during(Stage::Apply)?;
        info!(%machine, "marked an idle machine to go first");
    }
    let machine_deployments: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &namespace);
    for pool in &plan.pools {
        let Some(spec) = kc.spec.workers.iter().find(|p| p.name == pool.pool) else {
            continue;
        };
        let wanted = desired::machine_deployment(kc, spec, &pool.version, pool.replicas, owner);
        let live = deployments
            .iter()
            .find(|d| d.metadata.name.as_ref() == Some(&pool.name));
        // A rollout held on a pool (`rolloutPaused`) is a person's, never the cluster's: not
        // a difference to apply (the cluster's apply leaves that field alone).
        let in_line = live.is_some_and(|l| {
            let mut wanted = wanted.spec.clone();
            wanted.rollout_paused = l.spec.rollout_paused;
            l.spec == wanted
        });
        if in_line {
            continue;
        }
        let child = format!("MachineDeployment {}", pool.name);
        if !accepted(
            apply(&machine_deployments, &pool.name, &wanted).await,
            &child,
            &mut rejected,
        )? {
            continue;
        }
        match live {
            None => info!(pool = %pool.pool, version = %pool.version, replicas = pool.replicas, "made the pool"),
            Some(l) if l.spec.template.spec.version != pool.version => {
                info!(pool = %pool.pool, from = %l.spec.template.spec.version, to = %pool.version, "gave the pool its new version");
                // One point per pool: a crash between two pools' steps is where order could slip.
                crash::point(&format!(
                    "kubernetescluster: pool {} given a new version, status not written",
                    pool.pool
                ));
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
    Ok(rejected)
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
            out.push(if upgrade.step == status::SET_BACK {
                Announcement::normal(
                    "UpgradeSetBack",
                    format!(
                        "the upgrade to {} was set back before it finished: every part of the cluster runs {}",
                        upgrade.to, upgrade.from
                    ),
                )
            } else {
                Announcement::normal(
                    "UpgradeCompleted",
                    format!("every part of the cluster runs {}", upgrade.to),
                )
            });
        }
    }
    for gone in removed {
        out.push(Announcement::normal(
            "PoolRemoved",
            format!("removing MachineDeployment {gone}: its pool is no longer in the spec"),
        ));
    }
    let phase = |s: Option<&KubernetesClusterStatus>| s.and_then(|s| s.phase);
    if phase(Some(now)) != phase(previous)
        && let Some(p) = phase(Some(now))
    {
        let degraded = now
            .conditions
            .iter()
            .find(|c| c.type_ == noops_api::condition::DEGRADED && c.status == "True");
        out.push(match degraded {
            Some(c) if p == KubernetesClusterPhase::Degraded => {
                Announcement::warning(c.reason.clone(), c.message.clone())
            }
            _ => Announcement::normal(
                p.as_str(),
                format!(
                    "control plane {}, nodes {}",
                    now.control_plane.as_deref().unwrap_or("not serving yet"),
                    now.nodes.clone().unwrap_or_default()
                ),
            ),
        });
    }
    out
}
