//! The status of a KubernetesCluster, from its children and the plan. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use noops_api::condition::{DEGRADED, READY};
use noops_api::control_plane::KubernetesControlPlane;
use noops_api::kubernetes_cluster::KubernetesClusterPhase;
use noops_api::kubernetes_cluster::KubernetesClusterReason;
use noops_api::kubernetes_cluster::{ClusterUpgradeStatus, KubernetesCluster, KubernetesClusterStatus, PoolStatus};
use noops_api::machine_deployment::MachineDeployment;
use noops_api::machine_deployment::MachineDeploymentPhase;

use super::autoscale::Decision;
use super::desired::POOL_LABEL;
use super::plan::{Plan, PoolView, Step};
use crate::core::conditions::{Decided, merge, passed_on, with_paused};
use crate::machine::status::DRAIN_HELD;
use crate::machine_set::status::MACHINES_DELETING;

pub use noops_api::kubernetes_cluster::{CONTROL_PLANE_READY, SCALING, UPGRADING, WORKERS_READY};
/// The step of an upgrade whose version was set back to the one running before it finished.
pub const SET_BACK: &str = KubernetesClusterReason::SetBack.as_str();

/// What the status is built from.
pub struct StatusFacts<'a> {
    pub kc: &'a KubernetesCluster,
    pub control_plane: Option<&'a KubernetesControlPlane>,
    /// The pools' MachineDeployments (this cluster's, live).
    pub deployments: &'a [MachineDeployment],
    /// The same deployments as the plan saw them (with their machines).
    pub views: &'a [PoolView],
    pub plan: &'a Plan,
    /// A child's name held by an object that is not this cluster's.
    pub taken: Option<String>,
    /// What the autoscaler decided this pass (for a cluster with a pool that scales itself).
    pub autoscale: Option<&'a Decision>,
    /// Children the API server refused as this pass built them, and why.
    pub rejected: Vec<String>,
}

fn condition<'c>(
    conditions: &'c [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> Option<&'c k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

impl StatusFacts<'_> {
    fn deployment(&self, pool: &str) -> Option<&MachineDeployment> {
        self.deployments.iter().find(|d| {
            d.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(POOL_LABEL))
                .map(String::as_str)
                == Some(pool)
        })
    }

    fn control_plane_condition(
        &self,
        type_: &str,
    ) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
        condition(&self.control_plane?.status.as_ref()?.conditions, type_)
    }

    /// The version the whole cluster runs: the control plane's, once every pool runs it too.
    fn version(&self) -> Option<String> {
        let previous = self.kc.status.as_ref().and_then(|s| s.version.clone());
        let running = self
            .control_plane
            .and_then(|cp| cp.status.as_ref())
            .and_then(|s| s.version.clone());
        let Some(running) = running else {
            return previous;
        };
        let every_pool = self.kc.spec.workers.iter().all(|p| {
            self.views
                .iter()
                .any(|v| v.pool == p.name && v.version == running && v.rolled_out)
        });
        if every_pool { Some(running) } else { previous }
    }

    /// Pools with their machines asked, ready and updated.
    fn pools(&self) -> Vec<PoolStatus> {
        let cluster = self.kc.metadata.name.clone().unwrap_or_default();
        self.kc
            .spec
            .workers
            .iter()
            .map(|pool| {
                let planned = self.plan.pools.iter().find(|p| p.pool == pool.name);
                let status = self.deployment(&pool.name).and_then(|d| d.status.clone());
                PoolStatus {
                    name: pool.name.clone(),
                    machine_deployment: super::desired::pool_deployment_name(&cluster, &pool.name),
                    desired: planned.map_or_else(|| pool.replicas.or(pool.min_replicas).unwrap_or(0), |p| p.replicas),
                    ready: status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0),
                    updated: status.as_ref().and_then(|s| s.updated_replicas).unwrap_or(0),
                    version: planned.map(|p| p.version.clone()),
                    idle_since: self
                        .autoscale
                        .and_then(|d| d.idle_since.get(&pool.name))
                        .map(|idle| idle.iter().map(|(n, t)| (n.clone(), Time(*t))).collect())
                        .unwrap_or_default(),
                }
            })
            .collect()
    }
}

fn control_plane_ready(f: &StatusFacts) -> Decided<KubernetesClusterReason> {
    let Some(cp) = f.control_plane else {
        let message = if f.kc.spec.paused {
            "no control plane: none is made while the cluster is paused"
        } else {
            "making the control plane"
        };
        return Decided::new(
            CONTROL_PLANE_READY,
            false,
            KubernetesClusterReason::ControlPlaneNotMade,
            message,
        );
    };
    let name = cp.metadata.name.clone().unwrap_or_default();
    match f.control_plane_condition(READY) {
        Some(c) if c.status == "True" => Decided::new(
            CONTROL_PLANE_READY,
            true,
            KubernetesClusterReason::ControlPlaneReady,
            format!("control plane {name} is Ready"),
        ),
        Some(c) => Decided::new(
            CONTROL_PLANE_READY,
            false,
            KubernetesClusterReason::ControlPlaneNotReady,
            format!("control plane {name}: {}: {}", c.reason, c.message),
        ),
        None => Decided::new(
            CONTROL_PLANE_READY,
            false,
            KubernetesClusterReason::ControlPlaneNotReady,
            format!("control plane {name} has not reported yet"),
        ),
    }
}

fn workers_ready(f: &StatusFacts, pools: &[PoolStatus]) -> Decided<KubernetesClusterReason> {
    if pools.is_empty() {
        return Decided::new(
            WORKERS_READY,
            true,
            KubernetesClusterReason::NoWorkers,
            "the cluster has no worker pools",
        );
    }
    let waiting = &f.plan.waiting_for_control_plane;
    let short: Vec<String> = pools
        .iter()
        .filter(|p| waiting.contains(&p.name) || p.ready < p.desired)
        .map(|p| match waiting.contains(&p.name) {
            true => format!("pool {} waits for the control plane", p.name),
            false => format!("pool {}: {}/{} machines ready", p.name, p.ready, p.desired),
        })
        .collect();
    if short.is_empty() {
        Decided::new(
            WORKERS_READY,
            true,
            KubernetesClusterReason::WorkersReady,
            "every pool has its machines ready",
        )
    } else {
        Decided::new(
            WORKERS_READY,
            false,
            KubernetesClusterReason::WorkersNotReady,
            short.join("; "),
        )
    }
}

/// Drains that PodDisruptionBudgets hold in the pools, as their MachineDeployments say
/// (`MachinesDeleting`, reason DrainHeld): "pool workers: machine m1: a PodDisruptionBudget
/// keeps shop/web-1 (budget web needs 1 healthy pods and has 1) on the Node for now; ...".
fn held_drains(f: &StatusFacts) -> Vec<String> {
    f.kc.spec
        .workers
        .iter()
        .filter_map(|p| {
            let status = f.deployment(&p.name)?.status.as_ref()?;
            let c = condition(&status.conditions, MACHINES_DELETING)
                .filter(|c| c.status == "True" && c.reason == DRAIN_HELD)?;
            Some(format!("pool {}: {}", p.name, c.message))
        })
        .collect()
}

fn upgrading(upgrade: Option<&ClusterUpgradeStatus>, held: &[String]) -> Decided<KubernetesClusterReason> {
    // What holds the upgrade, told where a user watching it looks.
    let held = if held.is_empty() {
        String::new()
    } else {
        format!("; held: {}", held.join("; "))
    };
    match upgrade {
        Some(u) if u.step == SET_BACK => Decided::new(
            UPGRADING,
            false,
            KubernetesClusterReason::SetBack,
            format!("the upgrade to {} was set back: everything runs {}", u.to, u.from),
        ),
        Some(u) if u.finished_at.is_none() => Decided::new(
            UPGRADING,
            true,
            if u.step == Step::ControlPlane.name() {
                KubernetesClusterReason::UpgradingControlPlane
            } else {
                KubernetesClusterReason::UpgradingPool
            },
            format!("from {} to {}: {}{held}", u.from, u.to, u.step),
        ),
        _ => Decided::new(
            UPGRADING,
            false,
            KubernetesClusterReason::UpToDate,
            "no upgrade under way",
        ),
    }
}

fn scaling(f: &StatusFacts) -> Decided<KubernetesClusterReason> {
    if let Some(d) = f.autoscale {
        let said = |items: &[(String, i32, i32, Vec<String>)]| {
            items
                .iter()
                .map(|(pool, from, to, why)| format!("pool {pool}: {from} → {to} ({})", why.join(", ")))
                .collect::<Vec<_>>()
                .join("; ")
        };
        if !d.grew.is_empty() {
            return Decided::new(SCALING, true, KubernetesClusterReason::ScalingUp, said(&d.grew));
        }
        if !d.shrank.is_empty() {
            return Decided::new(SCALING, true, KubernetesClusterReason::ScalingDown, said(&d.shrank));
        }
        if !d.unfit.is_empty() {
            return Decided::new(
                SCALING,
                false,
                KubernetesClusterReason::NoPoolFits,
                format!(
                    "no pool's machine can hold pods {}: none is made for them",
                    d.unfit.join(", ")
                ),
            );
        }
        if let Some((pod, pool)) = d.at_max.first() {
            return Decided::new(
                SCALING,
                false,
                KubernetesClusterReason::AtMaxReplicas,
                format!("pod {pod} has no room and pool {pool} is at its maxReplicas"),
            );
        }
    }
    // After the autoscaler's word, which says more of what a user waits for.
    if !f.plan.removal_waits.is_empty() {
        return Decided::new(
            SCALING,
            true,
            KubernetesClusterReason::PoolRemovalWaits,
            format!(
                "{} no longer in the spec: removed once every pool that stays has its machines ready",
                f.plan.removal_waits.join(", ")
            ),
        );
    }
    let moving: Vec<String> =
        f.kc.spec
            .workers
            .iter()
            .filter_map(|p| {
                let phase = f.deployment(&p.name)?.status.as_ref()?.phase?;
                matches!(
                    phase,
                    MachineDeploymentPhase::ScalingUp | MachineDeploymentPhase::ScalingDown
                )
                .then(|| format!("pool {}: {phase}", p.name))
            })
            .collect();
    if moving.is_empty() {
        Decided::new(
            SCALING,
            false,
            KubernetesClusterReason::Steady,
            "no pool is changing its number of machines",
        )
    } else {
        Decided::new(SCALING, true, KubernetesClusterReason::PoolScaling, moving.join("; "))
    }
}

fn degraded(f: &StatusFacts) -> Decided<KubernetesClusterReason> {
    if let Some(taken) = &f.taken {
        return Decided::new(DEGRADED, true, KubernetesClusterReason::NameTaken, taken.clone());
    }
    if !f.rejected.is_empty() {
        return Decided::new(
            DEGRADED,
            true,
            KubernetesClusterReason::ChildRejected,
            f.rejected.join("; "),
        );
    }
    if let Some(refused) = &f.plan.refused {
        return Decided::new(DEGRADED, true, KubernetesClusterReason::VersionRefused, refused.clone());
    }
    if let Some(c) = f.control_plane_condition(DEGRADED).filter(|c| c.status == "True") {
        return Decided::new(
            DEGRADED,
            true,
            KubernetesClusterReason::ControlPlaneDegraded,
            passed_on(KubernetesClusterReason::ControlPlaneDegraded, c),
        );
    }
    let pools: Vec<String> =
        f.kc.spec
            .workers
            .iter()
            .filter_map(|p| {
                let status = f.deployment(&p.name)?.status.clone()?;
                let stalled = status.phase == Some(MachineDeploymentPhase::Stalled);
                let c = condition(&status.conditions, DEGRADED).filter(|c| c.status == "True");
                match (stalled, c) {
                    (_, Some(c)) => Some(format!(
                        "pool {}: {}",
                        p.name,
                        passed_on(KubernetesClusterReason::PoolDegraded, c)
                    )),
                    (true, None) => Some(format!("pool {}: its rollout stalled", p.name)),
                    _ => None,
                }
            })
            .collect();
    if pools.is_empty() {
        Decided::new(
            DEGRADED,
            false,
            KubernetesClusterReason::AsExpected,
            "nothing needs attention",
        )
    } else {
        Decided::new(DEGRADED, true, KubernetesClusterReason::PoolDegraded, pools.join("; "))
    }
}

/// The upgrade under way (the whole cluster ran another version before), or the last one,
/// its finished steps recorded in the order they finished.
fn upgrade(f: &StatusFacts, version: Option<&String>, now: jiff::Timestamp) -> Option<ClusterUpgradeStatus> {
    let previous = f.kc.status.as_ref().and_then(|s| s.upgrade.clone());
    let target = &f.plan.target;
    let from = f.kc.status.as_ref().and_then(|s| s.version.clone());
    // An upgrade set back and then asked for again is a new one.
    let this_one = previous.filter(|u| u.to == *target && u.step != SET_BACK);
    // A finished upgrade is a record: a later fault that puts the plan back a step (a control
    // plane degraded for a while) is not the upgrade going back.
    if let Some(finished) = this_one.as_ref().filter(|u| u.finished_at.is_some()) {
        return Some(finished.clone());
    }
    let mut upgrade = match (this_one, from) {
        (Some(u), _) => u,
        (None, Some(from)) if from != *target => ClusterUpgradeStatus {
            from,
            to: target.clone(),
            step: String::new(),
            finished: vec![],
            started_at: Time(now),
            finished_at: None,
        },
        // No upgrade now: the last one, if any, as it was; one set back before it finished
        // (the version it went to was put back) ends once everything runs the version again.
        _ => {
            let mut last = f.kc.status.as_ref().and_then(|s| s.upgrade.clone())?;
            if last.finished_at.is_none() && version == Some(target) && f.plan.step == Step::Done {
                last.step = SET_BACK.into();
                last.finished_at = Some(Time(now));
            }
            return Some(last);
        }
    };
    // Steps done by now, in the order the plan takes them.
    let mut done = Vec::new();
    // Pools catching up with the control plane's version come before it moves on.
    let control_plane_moved = f.plan.control_plane_version == *target && f.plan.step != Step::ControlPlane;
    if control_plane_moved {
        done.push(Step::ControlPlane.name());
    }
    for pool in &f.kc.spec.workers {
        if !control_plane_moved || f.plan.step == Step::Pool(pool.name.clone()) {
            break;
        }
        done.push(Step::Pool(pool.name.clone()).name());
    }
    for step in done {
        if !upgrade.finished.contains(&step) {
            upgrade.finished.push(step);
        }
    }
    upgrade.step = f.plan.step.name();
    if version == Some(target) && f.plan.step == Step::Done {
        upgrade.finished_at.get_or_insert(Time(now));
    }
    Some(upgrade)
}

fn phase(
    f: &StatusFacts,
    decided: &[Decided<KubernetesClusterReason>],
    version: Option<&String>,
    upgrade: Option<&ClusterUpgradeStatus>,
) -> KubernetesClusterPhase {
    let is = |type_: &str| decided.iter().any(|c| c.type_ == type_ && c.status);
    if f.kc.metadata.deletion_timestamp.is_some() {
        KubernetesClusterPhase::Deleting
    } else if f.kc.spec.paused {
        KubernetesClusterPhase::Paused
    } else if upgrade.is_some_and(|u| u.finished_at.is_none()) {
        KubernetesClusterPhase::Upgrading
    } else if is(DEGRADED) {
        KubernetesClusterPhase::Degraded
    } else if version.is_none() {
        KubernetesClusterPhase::Provisioning
    } else if is(SCALING) {
        KubernetesClusterPhase::Scaling
    } else if is(READY) {
        KubernetesClusterPhase::Running
    } else {
        KubernetesClusterPhase::Degraded
    }
}

/// The status of this pass.
pub fn build(f: &StatusFacts, now: jiff::Timestamp) -> KubernetesClusterStatus {
    let previous = f.kc.status.clone().unwrap_or_default();
    let pools = f.pools();
    let version = f.version();
    let upgrade = upgrade(f, version.as_ref(), now);
    let control_plane_ready = control_plane_ready(f);
    let workers_ready = workers_ready(f, &pools);
    let degraded = degraded(f);
    let ready = match (&control_plane_ready, &workers_ready, &f.taken) {
        (_, _, Some(taken)) => Decided::new(READY, false, KubernetesClusterReason::NameTaken, taken.clone()),
        (c, _, _) if !c.status => Decided::new(READY, false, c.reason, c.message.clone()),
        (_, w, _) if !w.status => Decided::new(READY, false, w.reason, w.message.clone()),
        _ => Decided::new(
            READY,
            true,
            KubernetesClusterReason::Ready,
            "the control plane and every pool are ready",
        ),
    };
    let decided = [
        ready,
        control_plane_ready,
        workers_ready,
        upgrading(upgrade.as_ref(), &held_drains(f)),
        scaling(f),
        degraded,
    ];
    let generation = f.kc.metadata.generation;
    let control_plane = f
        .control_plane
        .and_then(|cp| cp.status.as_ref())
        .map(|s| {
            [s.version.as_deref(), s.ready.as_deref()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|s| !s.is_empty());
    let (ready_nodes, desired_nodes) = pools.iter().fold((0, 0), |(r, d), p| (r + p.ready, d + p.desired));
    KubernetesClusterStatus {
        observed_generation: generation,
        conditions: merge(
            &previous.conditions,
            &with_paused(&decided, f.kc.spec.paused),
            generation,
            now,
        ),
        phase: Some(phase(f, &decided, version.as_ref(), upgrade.as_ref())),
        version,
        control_plane,
        control_plane_version: f
            .control_plane
            .and_then(|cp| cp.status.as_ref())
            .and_then(|s| s.version.clone())
            .or(previous.control_plane_version),
        nodes: Some(format!("{ready_nodes}/{desired_nodes}")),
        pools,
        kubeconfig_secret: f
            .control_plane
            .and_then(|cp| cp.status.as_ref())
            .and_then(|s| s.admin_kubeconfig_secret.clone()),
        upgrade,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes_cluster::fixtures::cluster;
    use crate::kubernetes_cluster::plan::PoolPlan;

    fn plan_at(step: Step, control_plane_version: &str) -> Plan {
        Plan {
            target: "1.34.4".into(),
            control_plane_version: control_plane_version.into(),
            pools: vec![],
            remove: vec![],
            removal_waits: vec![],
            step,
            waiting_for_control_plane: vec![],
            refused: None,
        }
    }

    fn pass(kc: &mut KubernetesCluster, plan: &Plan, now: jiff::Timestamp) -> KubernetesClusterStatus {
        let status = build(
            &StatusFacts {
                kc,
                control_plane: None,
                deployments: &[],
                views: &[],
                plan,
                taken: None,
                autoscale: None,
                rejected: vec![],
            },
            now,
        );
        kc.status = Some(status.clone());
        status
    }

    #[test]
    fn an_upgrade_records_its_steps_in_the_order_they_finished() {
        let mut kc = cluster("1.34", "[{ name: a, replicas: 1 }, { name: b, replicas: 1 }]");
        kc.status = Some(KubernetesClusterStatus {
            version: Some("1.33.13".into()),
            ..Default::default()
        });
        let now = jiff::Timestamp::now();
        let started = pass(&mut kc, &plan_at(Step::ControlPlane, "1.34.4"), now);
        let upgrade = started.upgrade.clone().unwrap();
        assert_eq!((upgrade.from.as_str(), upgrade.to.as_str()), ("1.33.13", "1.34.4"));
        assert!(upgrade.finished.is_empty());
        assert_eq!(started.phase, Some(KubernetesClusterPhase::Upgrading));
        let upgrading = started.conditions.iter().find(|c| c.type_ == UPGRADING).unwrap();
        assert_eq!(
            (upgrading.status.as_str(), upgrading.reason.as_str()),
            ("True", "UpgradingControlPlane")
        );

        let later = now + jiff::SignedDuration::from_secs(60);
        let pool_a = pass(&mut kc, &plan_at(Step::Pool("a".into()), "1.34.4"), later);
        assert_eq!(pool_a.upgrade.clone().unwrap().finished, vec!["ControlPlane"]);
        assert_eq!(
            pool_a.upgrade.clone().unwrap().started_at,
            Time(now),
            "kept across passes"
        );
        let pool_b = pass(&mut kc, &plan_at(Step::Pool("b".into()), "1.34.4"), later);
        assert_eq!(pool_b.upgrade.unwrap().finished, vec!["ControlPlane", "Pool a"]);
        let done = pass(&mut kc, &plan_at(Step::Done, "1.34.4"), later);
        let upgrade = done.upgrade.unwrap();
        assert_eq!(upgrade.finished, vec!["ControlPlane", "Pool a", "Pool b"]);
        assert_eq!(upgrade.step, "Done");
    }

    #[test]
    fn an_upgrade_a_budget_holds_names_the_machine_the_pod_and_the_budget() {
        let mut kc = cluster("1.34", "[{ name: a, replicas: 1 }]");
        kc.status = Some(KubernetesClusterStatus {
            version: Some("1.33.13".into()),
            ..Default::default()
        });
        let held = "machine acme-a-1: a PodDisruptionBudget keeps shop/web-1 (budget web needs 1 healthy pods and has 1) on the Node for now";
        let spec = serde_json::from_value(serde_json::json!({
            "clusterName": "acme", "replicas": 1,
            "selector": { "matchLabels": { "pool": "a" } },
            "template": { "metadata": { "labels": { "pool": "a" } }, "spec": { "version": "1.34" } },
        }))
        .unwrap();
        let mut pool = MachineDeployment::new("acme-a", spec);
        pool.metadata.labels = Some([(POOL_LABEL.to_string(), "a".to_string())].into());
        pool.status = Some(noops_api::machine_deployment::MachineDeploymentStatus {
            conditions: vec![crate::core::fixtures::condition(
                MACHINES_DELETING,
                true,
                DRAIN_HELD,
                held,
            )],
            ..Default::default()
        });
        let plan = plan_at(Step::Pool("a".into()), "1.34.4");
        let status = build(
            &StatusFacts {
                kc: &kc,
                control_plane: None,
                deployments: std::slice::from_ref(&pool),
                views: &[],
                plan: &plan,
                taken: None,
                autoscale: None,
                rejected: vec![],
            },
            jiff::Timestamp::now(),
        );
        let upgrading = status.conditions.iter().find(|c| c.type_ == UPGRADING).unwrap();
        assert_eq!(upgrading.reason, "UpgradingPool");
        assert!(
            upgrading.message.contains(&format!("held: pool a: {held}")),
            "{}",
            upgrading.message
        );
    }

    #[test]
    fn an_upgrade_set_back_before_it_finished_ends_once_everything_runs_the_old_version() {
        let mut kc = cluster("1.35", "[{ name: a, replicas: 1 }]");
        kc.status = Some(KubernetesClusterStatus {
            version: Some("1.34.4".into()),
            ..Default::default()
        });
        let mut to_new = plan_at(Step::ControlPlane, "1.35.0");
        to_new.target = "1.35.0".into();
        let now = jiff::Timestamp::now();
        assert_eq!(
            pass(&mut kc, &to_new, now).phase,
            Some(KubernetesClusterPhase::Upgrading)
        );
        // Its images are not there; the version is set back to the one running.
        kc.spec.version = "1.34".into();
        let moving_back = pass(&mut kc, &plan_at(Step::ControlPlane, "1.34.4"), now);
        assert_eq!(
            moving_back.phase,
            Some(KubernetesClusterPhase::Upgrading),
            "not back yet"
        );
        let back = pass(&mut kc, &plan_at(Step::Done, "1.34.4"), now);
        let upgrade = back.upgrade.unwrap();
        assert_eq!((upgrade.to.as_str(), upgrade.step.as_str()), ("1.35.0", SET_BACK));
        assert!(upgrade.finished_at.is_some());
        assert_ne!(back.phase, Some(KubernetesClusterPhase::Upgrading));
        let upgrading = back.conditions.iter().find(|c| c.type_ == UPGRADING).unwrap();
        assert_eq!(
            (upgrading.status.as_str(), upgrading.reason.as_str()),
            ("False", SET_BACK)
        );
    }

    #[test]
    fn a_finished_upgrade_stays_as_it_finished_through_a_control_plane_fault() {
        let mut kc = cluster("1.34", "[{ name: a, replicas: 1 }]");
        kc.status = Some(KubernetesClusterStatus {
            version: Some("1.34.4".into()),
            upgrade: Some(ClusterUpgradeStatus {
                from: "1.33.13".into(),
                to: "1.34.4".into(),
                step: "Done".into(),
                finished: vec!["ControlPlane".into(), "Pool a".into()],
                started_at: Time(jiff::Timestamp::UNIX_EPOCH),
                finished_at: Some(Time(jiff::Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(600))),
            }),
            ..Default::default()
        });
        let finished = kc.status.as_ref().unwrap().upgrade.clone();
        let now = jiff::Timestamp::now();
        // A management node lost: the control plane is degraded, and the plan says its step.
        for step in [Step::ControlPlane, Step::Pool("a".into()), Step::Done] {
            let status = pass(&mut kc, &plan_at(step.clone(), "1.34.4"), now);
            assert_eq!(status.upgrade, finished, "at {step:?}");
            assert_ne!(status.phase, Some(KubernetesClusterPhase::Upgrading), "at {step:?}");
        }
    }

    #[test]
    fn an_upgrade_set_back_and_asked_for_again_starts_anew() {
        let mut kc = cluster("1.35", "[{ name: a, replicas: 1 }]");
        kc.status = Some(KubernetesClusterStatus {
            version: Some("1.34.4".into()),
            upgrade: Some(ClusterUpgradeStatus {
                from: "1.34.4".into(),
                to: "1.35.0".into(),
                step: SET_BACK.into(),
                finished: vec![],
                started_at: Time(jiff::Timestamp::UNIX_EPOCH),
                finished_at: Some(Time(jiff::Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(60))),
            }),
            ..Default::default()
        });
        let mut again = plan_at(Step::ControlPlane, "1.35.0");
        again.target = "1.35.0".into();
        let now = jiff::Timestamp::now();
        let status = pass(&mut kc, &again, now);
        let upgrade = status.upgrade.unwrap();
        assert_eq!(
            (upgrade.step.as_str(), upgrade.started_at.clone()),
            ("ControlPlane", Time(now))
        );
        assert_eq!(upgrade.finished_at, None);
        assert_eq!(status.phase, Some(KubernetesClusterPhase::Upgrading));
    }

    #[test]
    fn a_refused_version_makes_the_cluster_degraded_with_the_reason() {
        let mut kc = cluster("1.33", "[{ name: a, replicas: 1 }]");
        kc.status = Some(KubernetesClusterStatus {
            version: Some("1.34.4".into()),
            ..Default::default()
        });
        let mut plan = plan_at(Step::ControlPlane, "1.34.4");
        plan.target = "1.33.13".into();
        plan.refused = Some("version 1.33.13 is older than 1.34.4".into());
        let status = pass(&mut kc, &plan, jiff::Timestamp::now());
        let degraded = status.conditions.iter().find(|c| c.type_ == DEGRADED).unwrap();
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "VersionRefused")
        );
    }

    #[test]
    fn pools_catching_up_before_the_control_plane_moves_are_not_its_steps() {
        let mut kc = cluster("1.35", "[{ name: a, replicas: 1 }]");
        kc.status = Some(KubernetesClusterStatus {
            version: Some("1.34.4".into()),
            ..Default::default()
        });
        let mut plan = plan_at(Step::Pool("a".into()), "1.34.4");
        plan.target = "1.35.0".into();
        plan.pools = vec![PoolPlan {
            pool: "a".into(),
            name: "team-a-a".into(),
            version: "1.34.4".into(),
            replicas: 1,
            make: false,
        }];
        let status = pass(&mut kc, &plan, jiff::Timestamp::now());
        assert!(status.upgrade.unwrap().finished.is_empty());
    }

    #[test]
    fn a_cluster_being_made_is_provisioning_with_no_upgrade_and_says_what_it_waits_for() {
        let mut kc = cluster("1.34", "[{ name: a, replicas: 2 }]");
        let mut plan = plan_at(Step::ControlPlane, "1.34.4");
        plan.waiting_for_control_plane = vec!["a".into()];
        let status = pass(&mut kc, &plan, jiff::Timestamp::now());
        assert_eq!(status.phase, Some(KubernetesClusterPhase::Provisioning));
        assert_eq!(status.upgrade, None);
        assert_eq!(
            status.nodes.as_deref(),
            Some("0/2"),
            "the pool's machines, asked for already"
        );
        let ready = status.conditions.iter().find(|c| c.type_ == READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "ControlPlaneNotMade")
        );
        let workers = status.conditions.iter().find(|c| c.type_ == WORKERS_READY).unwrap();
        assert!(
            workers.message.contains("pool a waits for the control plane"),
            "{}",
            workers.message
        );
    }
}
