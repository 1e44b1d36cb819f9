//! What a cluster's children should be now: the control plane's version, each pool's version
//! and size, the pools to remove, and the step an upgrade is at. Pure.
//!
//! The order is the whole point. Workers are made once the control plane is Ready, at the
//! version its API servers run. A new version goes to the control plane only once every pool
//! runs the control plane's current version and has finished rolling (so no worker falls more
//! than one minor behind); then to the pools one at a time, in the order listed, each only once
//! the control plane runs it and every pool before it has rolled (so no worker is ever newer
//! than its API server). Everything is read from the children as they are, not from memory or
//! the status: a restarted operator plans the same.

use noops_api::control_plane::KubernetesControlPlane;
use noops_api::kubernetes_cluster::{KubernetesCluster, WorkerPoolSpec};
use noops_api::machine::Machine;
use noops_api::machine_deployment::MachineDeployment;

use super::desired::{POOL_LABEL, pool_deployment_name};
use crate::control_plane::versions::{Release, minor};

/// The control plane as the plan needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlaneView {
    /// The version it was last given (its spec).
    pub asked: String,
    /// The version its API servers run (its status).
    pub running: Option<String>,
    /// Ready, its status of its latest spec, no upgrade of its own under way.
    pub settled: bool,
}

impl ControlPlaneView {
    pub fn of(kcp: &KubernetesControlPlane) -> Self {
        let status = kcp.status.as_ref();
        let current = status.and_then(|s| s.observed_generation) == kcp.metadata.generation;
        let ready = status.is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let upgrading = status.is_some_and(|s| s.upgrade.is_some());
        Self {
            asked: kcp.spec.version.clone(),
            running: status.and_then(|s| s.version.clone()),
            settled: current && ready && !upgrading,
        }
    }

    /// Whether it runs `version` and nothing of it is moving.
    fn runs(&self, version: &str) -> bool {
        self.asked == version && self.running.as_deref() == Some(version) && self.settled
    }
}

/// A pool's MachineDeployment as the plan needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolView {
    /// The pool it is (its label).
    pub pool: String,
    pub name: String,
    /// The version its machines are given (its template).
    pub version: String,
    /// The oldest version a kubelet of the pool may run: the oldest of its machines' (those
    /// being deleted too) and its template's.
    pub oldest: String,
    pub replicas: i32,
    /// Every machine of its current template, Ready, none older left (not even one still
    /// draining), its status of its latest spec.
    pub rolled_out: bool,
    /// Every machine it asks for has its Node Ready (of any version).
    pub machines_ready: bool,
    /// It is being deleted (its pool was removed).
    pub deleting: bool,
}

impl PoolView {
    /// The view of `md`, whose machines (those being deleted too) are `machines`.
    pub fn of<'m>(md: &MachineDeployment, machines: impl Iterator<Item = &'m Machine>) -> Self {
        let status = md.status.clone().unwrap_or_default();
        let replicas = md.spec.replicas;
        let version = &md.spec.template.spec.version;
        let given = exact(version);
        let machine_versions: Vec<String> = machines.map(|m| exact(&m.spec.template.version)).collect();
        // The deployment's counts leave out machines being deleted, but a draining machine
        // still runs its kubelet: the pool has not moved on until it is gone.
        let rolled_out = status.observed_generation == md.metadata.generation
            && status.updated_replicas == Some(replicas)
            && status.ready_replicas == Some(replicas)
            && status.replicas == Some(replicas)
            && machine_versions.iter().all(|v| *v == given);
        let oldest = machine_versions
            .into_iter()
            .min_by_key(|v| minor(v))
            .filter(|v| minor(v) < minor(&given))
            .unwrap_or(given);
        Self {
            pool: md
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(POOL_LABEL))
                .cloned()
                .unwrap_or_default(),
            name: md.metadata.name.clone().unwrap_or_default(),
            version: version.clone(),
            oldest,
            replicas,
            rolled_out,
            machines_ready: status.ready_replicas.unwrap_or(0) >= replicas,
            deleting: md.metadata.deletion_timestamp.is_some(),
        }
    }

    fn runs(&self, version: &str) -> bool {
        self.version == version && self.rolled_out
    }
}

/// One pool's MachineDeployment as it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolPlan {
    pub pool: String,
    pub name: String,
    pub version: String,
    pub replicas: i32,
    /// It does not exist yet.
    pub make: bool,
}

/// Where an upgrade (or the making of a cluster) is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The control plane moves to the target.
    ControlPlane,
    /// A pool rolls to the version it is given (the target, or the control plane's version
    /// that it must reach before the control plane moves on).
    Pool(String),
    /// Everything runs the target.
    Done,
}

impl Step {
    pub fn name(&self) -> String {
        match self {
            Step::ControlPlane => "ControlPlane".into(),
            Step::Pool(pool) => format!("Pool {pool}"),
            Step::Done => "Done".into(),
        }
    }
}

/// What the pass should make the children.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The exact version the spec asks for.
    pub target: String,
    /// The version the control plane gets.
    pub control_plane_version: String,
    /// The pools, in the spec's order; a pool that must wait for the control plane is left out.
    pub pools: Vec<PoolPlan>,
    /// MachineDeployments of pools no longer in the spec, to delete now.
    pub remove: Vec<String>,
    /// MachineDeployments of pools no longer in the spec that wait for the pools that stay
    /// to have every machine ready, so the cluster never has fewer workers than asked.
    pub removal_waits: Vec<String>,
    pub step: Step,
    /// Pools not made yet because the control plane is not Ready.
    pub waiting_for_control_plane: Vec<String>,
    /// Why the target cannot be given to the control plane, if it cannot be (a downgrade).
    pub refused: Option<String>,
}

impl Plan {
    /// Gives the pools the autoscaler resized their new sizes, kept within their bounds (a
    /// paused cluster keeps its sizes).
    pub fn scale(&mut self, kc: &KubernetesCluster, replicas: &std::collections::BTreeMap<String, i32>) {
        if kc.spec.paused {
            return;
        }
        for pool in &mut self.pools {
            let Some(spec) = kc.spec.workers.iter().find(|p| p.name == pool.pool) else {
                continue;
            };
            if let (Some(wanted), Some(min), Some(max)) =
                (replicas.get(&pool.pool), spec.min_replicas, spec.max_replicas)
            {
                pool.replicas = (*wanted).clamp(min, max.max(min));
            }
        }
    }
}

/// The version `version` of a spec comes to, exactly.
pub fn exact(version: &str) -> String {
    Release::of(version).map_or_else(|| version.to_string(), |r| r.kubernetes)
}

/// The machines a pool asks for: a fixed count, or what its deployment has now (a scaler's
/// last word) kept between its bounds, its minimum at first.
fn replicas(pool: &WorkerPoolSpec, live: Option<&PoolView>) -> i32 {
    match (pool.replicas, pool.min_replicas, pool.max_replicas) {
        (Some(fixed), _, _) => fixed,
        (None, Some(min), Some(max)) => live.map_or(min, |l| l.replicas).clamp(min, max.max(min)),
        // The schema allows neither of these.
        (None, Some(min), None) => live.map_or(min, |l| l.replicas.max(min)),
        (None, None, _) => live.map_or(0, |l| l.replicas),
    }
}

/// The plan for `kc`, its control plane as it is (if made) and its pools' deployments. A
/// paused cluster keeps every version and pool as it is (its children are paused with it).
pub fn plan(kc: &KubernetesCluster, control_plane: Option<&ControlPlaneView>, deployments: &[PoolView]) -> Plan {
    let moving = moving_plan(kc, control_plane, deployments);
    if !kc.spec.paused {
        return moving;
    }
    let cluster = kc.metadata.name.clone().unwrap_or_default();
    Plan {
        control_plane_version: control_plane.map_or(moving.target.clone(), |cp| cp.asked.clone()),
        pools: deployments
            .iter()
            .filter_map(|d| {
                let pool = kc.spec.workers.iter().find(|p| p.name == d.pool)?;
                Some(PoolPlan {
                    pool: d.pool.clone(),
                    name: pool_deployment_name(&cluster, &d.pool),
                    version: d.version.clone(),
                    replicas: replicas(pool, Some(d)),
                    make: false,
                })
            })
            .collect(),
        remove: vec![],
        removal_waits: vec![],
        ..moving
    }
}

/// Whether the control plane may be given `version` now: never a minor older than its API
/// servers run (Kubernetes has no downgrade), never older than a pool's kubelets are given, and
/// never more than one minor newer than the oldest kubelet.
fn control_plane_may_take(version: &str, control_plane: &ControlPlaneView, deployments: &[PoolView]) -> bool {
    let wanted = minor(version);
    let running = control_plane.running.as_deref().and_then(minor);
    running.is_none_or(|r| wanted >= Some(r))
        && deployments.iter().all(|d| minor(&d.version) <= wanted)
        && deployments
            .iter()
            .all(|d| minor(&d.oldest).is_some_and(|o| wanted <= Some(o + 1)))
}

/// Why the target is refused: it is a minor older than what the control plane or a pool runs.
fn downgrade(target: &str, control_plane: &ControlPlaneView, deployments: &[PoolView]) -> Option<String> {
    let wanted = minor(target);
    let newer = control_plane
        .running
        .iter()
        .chain(deployments.iter().map(|d| &d.version))
        .filter(|v| minor(v) > wanted)
        .max_by_key(|v| minor(v))?;
    Some(format!(
        "version {target} is older than {newer}, which parts of the cluster run: Kubernetes cannot go back a minor; set spec.version to {newer} or later"
    ))
}

fn moving_plan(kc: &KubernetesCluster, control_plane: Option<&ControlPlaneView>, deployments: &[PoolView]) -> Plan {
    let target = exact(&kc.spec.version);
    let cluster = kc.metadata.name.clone().unwrap_or_default();
    let live = |pool: &str| deployments.iter().find(|d| d.pool == pool);
    let refused = control_plane.and_then(|cp| downgrade(&target, cp, deployments));
    // The control plane takes the target as soon as no kubelet would be newer or two minors
    // behind; an upgrade it cannot finish (an image that is not there) is set back the same way.
    let control_plane_version = match control_plane {
        None => target.clone(),
        Some(cp) if cp.asked == target => target.clone(),
        Some(cp) if control_plane_may_take(&target, cp, deployments) => target.clone(),
        Some(cp) => cp.asked.clone(),
    };
    let control_plane_done = control_plane.is_some_and(|cp| cp.runs(&target));
    // Kubelets too old for the target catch up with the control plane first, pool by pool.
    let catch_up = control_plane
        .filter(|cp| refused.is_none() && control_plane_version != target && cp.runs(&cp.asked))
        .map(|cp| cp.asked.as_str());
    let serving = control_plane
        .filter(|cp| cp.settled || cp.running.is_some())
        .and_then(|cp| cp.running.clone());
    let ready = control_plane.is_some_and(|cp| cp.settled);

    let mut pools = Vec::new();
    let mut waiting_for_control_plane = Vec::new();
    // Every pool before this one has rolled out the version it is given.
    let mut before_settled = true;
    for pool in &kc.spec.workers {
        let existing = live(&pool.name);
        let version = match (existing, &serving) {
            (Some(d), _) if d.version == target => target.clone(),
            (Some(_), _) if refused.is_none() && control_plane_done && before_settled => target.clone(),
            (Some(d), _) if before_settled && catch_up.is_some_and(|v| minor(&d.version) < minor(v)) => {
                catch_up.map_or_else(|| d.version.clone(), str::to_string)
            }
            (Some(d), _) => d.version.clone(),
            // A new pool joins a Ready control plane, at the version its API servers run.
            (None, Some(running)) if ready => running.clone(),
            (None, _) => {
                waiting_for_control_plane.push(pool.name.clone());
                before_settled = false;
                continue;
            }
        };
        before_settled &= existing.is_some_and(|d| d.runs(&version));
        pools.push(PoolPlan {
            pool: pool.name.clone(),
            name: pool_deployment_name(&cluster, &pool.name),
            version,
            replicas: replicas(pool, existing),
            make: existing.is_none(),
        });
    }

    let (remove, removal_waits) = removals(kc, deployments, waiting_for_control_plane.is_empty());
    let step = next_step(kc, control_plane, deployments, &target, &control_plane_version);

    Plan {
        target,
        control_plane_version,
        pools,
        remove,
        removal_waits,
        step,
        waiting_for_control_plane,
        refused,
    }
}

/// The pools' MachineDeployments to remove now, and those that wait. A pool renamed or removed
/// goes once the pools that stay (a renamed one's successor too) are made and have their
/// machines ready, so its pods have somewhere to go.
fn removals(kc: &KubernetesCluster, deployments: &[PoolView], all_made: bool) -> (Vec<String>, Vec<String>) {
    let live = |pool: &str| deployments.iter().find(|d| d.pool == pool);
    let unlisted = deployments
        .iter()
        .filter(|d| !d.deleting && !kc.spec.workers.iter().any(|p| p.name == d.pool))
        .map(|d| d.name.clone());
    let stayers_whole = all_made
        && kc
            .spec
            .workers
            .iter()
            .all(|p| live(&p.name).is_some_and(|d| d.machines_ready));
    if stayers_whole {
        (unlisted.collect(), vec![])
    } else {
        (vec![], unlisted.collect())
    }
}

/// What moves next towards `target`: the control plane, or a pool (workers first catch up
/// with the control plane as it is), or nothing.
fn next_step(
    kc: &KubernetesCluster,
    control_plane: Option<&ControlPlaneView>,
    deployments: &[PoolView],
    target: &str,
    control_plane_version: &str,
) -> Step {
    let live = |pool: &str| deployments.iter().find(|d| d.pool == pool);
    let lagging = |version: &str| {
        kc.spec
            .workers
            .iter()
            .filter_map(|p| live(&p.name))
            .find(|d| !d.runs(version))
            .map(|d| d.pool.clone())
    };
    match control_plane {
        Some(cp) if !cp.runs(target) => match lagging(&cp.asked) {
            Some(pool) if control_plane_version != target => Step::Pool(pool),
            _ => Step::ControlPlane,
        },
        None => Step::ControlPlane,
        Some(_) => kc
            .spec
            .workers
            .iter()
            .find(|p| !live(&p.name).is_some_and(|d| d.runs(target)))
            .map_or(Step::Done, |p| Step::Pool(p.name.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes_cluster::fixtures::cluster;

    const OLD: &str = "1.33.13";
    const NEW: &str = "1.34.4";

    fn cp(asked: &str, running: &str, settled: bool) -> ControlPlaneView {
        ControlPlaneView {
            asked: asked.into(),
            running: Some(running.into()),
            settled,
        }
    }

    fn pool(name: &str, version: &str, replicas: i32, rolled_out: bool) -> PoolView {
        PoolView {
            pool: name.into(),
            name: format!("team-a-{name}"),
            version: version.into(),
            oldest: version.into(),
            replicas,
            rolled_out,
            machines_ready: rolled_out,
            deleting: false,
        }
    }

    /// Pool `name` rolling to `version`, machines of `oldest` still running.
    fn rolling(name: &str, version: &str, oldest: &str) -> PoolView {
        PoolView {
            oldest: oldest.into(),
            ..pool(name, version, 1, false)
        }
    }

    const TWO_POOLS: &str = "[{ name: a, replicas: 2 }, { name: b, minReplicas: 1, maxReplicas: 3 }]";

    fn versions(plan: &Plan) -> Vec<(String, String)> {
        plan.pools.iter().map(|p| (p.pool.clone(), p.version.clone())).collect()
    }

    #[test]
    fn a_pool_has_not_rolled_out_while_a_machine_of_its_old_version_still_drains() {
        let spec = serde_json::from_value(serde_json::json!({
            "clusterName": "team-a", "replicas": 2,
            "selector": { "matchLabels": { "pool": "a" } },
            "template": { "metadata": { "labels": { "pool": "a" } }, "spec": { "version": NEW } },
        }))
        .unwrap();
        let mut md = MachineDeployment::new("team-a-a", spec);
        md.metadata.generation = Some(3);
        // Its counts say done: they leave out machines being deleted.
        md.status = Some(noops_api::machine_deployment::MachineDeploymentStatus {
            observed_generation: Some(3),
            replicas: Some(2),
            ready_replicas: Some(2),
            updated_replicas: Some(2),
            ..Default::default()
        });
        use crate::machine::fixtures::machine;
        let new = [machine("n1", "team-a", NEW), machine("n2", "team-a", NEW)];
        let mut draining = machine("o1", "team-a", OLD);
        draining.metadata.deletion_timestamp = new[0].metadata.creation_timestamp.clone();
        let with_draining: Vec<&Machine> = new.iter().chain([&draining]).collect();
        assert!(!PoolView::of(&md, with_draining.into_iter()).rolled_out);
        assert!(PoolView::of(&md, new.iter()).rolled_out);
    }

    #[test]
    fn workers_wait_for_a_ready_control_plane_then_join_at_the_version_it_serves() {
        let kc = cluster("1.33", TWO_POOLS);
        let first = plan(&kc, None, &[]);
        assert_eq!(first.control_plane_version, OLD);
        assert!(first.pools.is_empty());
        assert_eq!(first.waiting_for_control_plane, vec!["a", "b"]);
        assert_eq!(first.step, Step::ControlPlane);

        let starting = ControlPlaneView {
            asked: OLD.into(),
            running: None,
            settled: false,
        };
        assert!(plan(&kc, Some(&starting), &[]).pools.is_empty());

        let ready = plan(&kc, Some(&cp(OLD, OLD, true)), &[]);
        assert_eq!(
            versions(&ready),
            vec![("a".into(), OLD.into()), ("b".into(), OLD.into())]
        );
        assert!(ready.pools.iter().all(|p| p.make));
        assert_eq!(ready.pools[0].replicas, 2);
        assert_eq!(ready.pools[1].replicas, 1, "a scaling pool starts at its minimum");
        assert_eq!(ready.step, Step::Pool("a".into()));
    }

    #[test]
    fn an_upgrade_goes_to_the_control_plane_first_then_to_each_pool_in_turn() {
        let kc = cluster("1.34", TWO_POOLS);
        let settled = [pool("a", OLD, 2, true), pool("b", OLD, 1, true)];

        // The control plane moves first; the pools stay.
        let start = plan(&kc, Some(&cp(OLD, OLD, true)), &settled);
        assert_eq!(start.control_plane_version, NEW);
        assert_eq!(
            versions(&start),
            vec![("a".into(), OLD.into()), ("b".into(), OLD.into())]
        );
        assert_eq!(start.step, Step::ControlPlane);

        // Its API servers on the new version, its own upgrade not finished: pools wait.
        let moving = plan(&kc, Some(&cp(NEW, NEW, false)), &settled);
        assert_eq!(
            versions(&moving),
            vec![("a".into(), OLD.into()), ("b".into(), OLD.into())]
        );
        assert_eq!(moving.step, Step::ControlPlane);

        // Done: the first pool, only.
        let first = plan(&kc, Some(&cp(NEW, NEW, true)), &settled);
        assert_eq!(
            versions(&first),
            vec![("a".into(), NEW.into()), ("b".into(), OLD.into())]
        );
        assert_eq!(first.step, Step::Pool("a".into()));

        // The first pool rolling: the second waits.
        let rolling = [pool("a", NEW, 2, false), pool("b", OLD, 1, true)];
        let waiting = plan(&kc, Some(&cp(NEW, NEW, true)), &rolling);
        assert_eq!(
            versions(&waiting),
            vec![("a".into(), NEW.into()), ("b".into(), OLD.into())]
        );
        assert_eq!(waiting.step, Step::Pool("a".into()));

        // The first rolled out: the second goes.
        let rolled = [pool("a", NEW, 2, true), pool("b", OLD, 1, true)];
        let second = plan(&kc, Some(&cp(NEW, NEW, true)), &rolled);
        assert_eq!(
            versions(&second),
            vec![("a".into(), NEW.into()), ("b".into(), NEW.into())]
        );
        assert_eq!(second.step, Step::Pool("b".into()));

        let all = [pool("a", NEW, 2, true), pool("b", NEW, 1, true)];
        assert_eq!(plan(&kc, Some(&cp(NEW, NEW, true)), &all).step, Step::Done);
    }

    #[test]
    fn the_control_plane_waits_for_workers_to_catch_up_so_none_falls_two_minors_behind() {
        // The control plane already on 1.34, a pool still rolling to it, and 1.35 asked.
        let kc = cluster("1.35", TWO_POOLS);
        let behind = [pool("a", NEW, 2, true), rolling("b", NEW, OLD)];
        let p = plan(&kc, Some(&cp(NEW, NEW, true)), &behind);
        assert_eq!(p.control_plane_version, NEW, "the control plane stays");
        assert_eq!(p.step, Step::Pool("b".into()));
        assert_eq!(versions(&p), vec![("a".into(), NEW.into()), ("b".into(), NEW.into())]);
        let caught_up = [pool("a", NEW, 2, true), pool("b", NEW, 1, true)];
        let p = plan(&kc, Some(&cp(NEW, NEW, true)), &caught_up);
        assert_eq!(p.control_plane_version, "1.35.0");
        assert_eq!(p.step, Step::ControlPlane);
    }

    #[test]
    fn a_worker_is_never_given_a_version_newer_than_its_api_servers() {
        let kc = cluster("1.34", TWO_POOLS);
        // Pools in every state, the control plane in every state short of done at the target.
        for control_plane in [cp(OLD, OLD, true), cp(NEW, OLD, false), cp(NEW, NEW, false)] {
            for rolled in [true, false] {
                let pools = [pool("a", OLD, 2, rolled), pool("b", OLD, 1, rolled)];
                let p = plan(&kc, Some(&control_plane), &pools);
                assert!(p.pools.iter().all(|pp| pp.version == OLD), "{control_plane:?} {p:?}");
            }
        }
    }

    #[test]
    fn an_upgrade_the_control_plane_cannot_finish_is_set_back_by_setting_the_version_back() {
        // 1.35 was asked and its images are not there: the API servers still run 1.34.
        let kc = cluster("1.34", TWO_POOLS);
        let pools = [pool("a", NEW, 2, true), pool("b", NEW, 1, true)];
        let p = plan(&kc, Some(&cp("1.35.0", NEW, false)), &pools);
        assert_eq!(p.control_plane_version, NEW);
        assert_eq!(versions(&p), vec![("a".into(), NEW.into()), ("b".into(), NEW.into())]);
        assert_eq!(p.refused, None);
    }

    #[test]
    fn a_version_changed_in_the_middle_of_an_upgrade_is_reached_in_order() {
        // 1.33 → 1.34: the control plane and pool a done, pool b not started; then 1.34.5.
        let kc = cluster("1.34.5", TWO_POOLS);
        let pools = [pool("a", NEW, 2, true), pool("b", OLD, 1, true)];
        let p = plan(&kc, Some(&cp(NEW, NEW, true)), &pools);
        assert_eq!(
            p.control_plane_version, "1.34.5",
            "no kubelet would be newer or two behind"
        );
        assert_eq!(versions(&p), vec![("a".into(), NEW.into()), ("b".into(), OLD.into())]);
        assert_eq!(p.step, Step::ControlPlane);
        let p = plan(&kc, Some(&cp("1.34.5", "1.34.5", true)), &pools);
        assert_eq!(
            versions(&p),
            vec![("a".into(), "1.34.5".into()), ("b".into(), OLD.into())]
        );
        assert_eq!(p.step, Step::Pool("a".into()));
    }

    #[test]
    fn a_downgrade_below_what_runs_is_refused_and_moves_nothing() {
        let kc = cluster("1.33", TWO_POOLS);
        let pools = [pool("a", NEW, 2, true), pool("b", OLD, 1, true)];
        let p = plan(&kc, Some(&cp(NEW, NEW, true)), &pools);
        assert_eq!(p.control_plane_version, NEW);
        assert_eq!(versions(&p), vec![("a".into(), NEW.into()), ("b".into(), OLD.into())]);
        let why = p.refused.expect("refused");
        assert!(why.contains("older than 1.34.4"), "{why}");
    }

    #[test]
    fn kubelets_two_minors_behind_the_target_catch_up_with_the_control_plane_pool_by_pool() {
        // An upgrade to 1.34 left both pools on 1.33 (the version was changed before they moved).
        let kc = cluster("1.35", TWO_POOLS);
        let old = [pool("a", OLD, 2, true), pool("b", OLD, 1, true)];
        let p = plan(&kc, Some(&cp(NEW, NEW, true)), &old);
        assert_eq!(p.control_plane_version, NEW, "1.35 would be two minors ahead of 1.33");
        assert_eq!(versions(&p), vec![("a".into(), NEW.into()), ("b".into(), OLD.into())]);
        assert_eq!(p.step, Step::Pool("a".into()));
        let a_done = [pool("a", NEW, 2, true), pool("b", OLD, 1, true)];
        let p = plan(&kc, Some(&cp(NEW, NEW, true)), &a_done);
        assert_eq!(versions(&p), vec![("a".into(), NEW.into()), ("b".into(), NEW.into())]);
        assert_eq!(p.step, Step::Pool("b".into()));
        let both = [pool("a", NEW, 2, true), pool("b", NEW, 1, true)];
        let p = plan(&kc, Some(&cp(NEW, NEW, true)), &both);
        assert_eq!(p.control_plane_version, "1.35.0");
        assert_eq!(p.step, Step::ControlPlane);
    }

    #[test]
    fn a_paused_cluster_changes_no_version_and_makes_or_removes_no_pool() {
        let mut kc = cluster("1.34", "[{ name: b, replicas: 2 }, { name: c, replicas: 1 }]");
        kc.spec.paused = true;
        let live = [pool("a", OLD, 2, true), pool("b", OLD, 2, true)];
        let p = plan(&kc, Some(&cp(OLD, OLD, true)), &live);
        assert_eq!(p.control_plane_version, OLD);
        assert_eq!(versions(&p), vec![("b".into(), OLD.into())]);
        assert!(p.remove.is_empty());
    }

    #[test]
    fn the_autoscaler_resizes_only_scaling_pools_and_within_their_bounds() {
        let kc = cluster(
            "1.34",
            "[{ name: a, replicas: 2 }, { name: b, minReplicas: 1, maxReplicas: 3 }]",
        );
        let live = [pool("a", NEW, 2, true), pool("b", NEW, 1, true)];
        let mut p = plan(&kc, Some(&cp(NEW, NEW, true)), &live);
        p.scale(
            &kc,
            &std::collections::BTreeMap::from([("a".to_string(), 5), ("b".to_string(), 9)]),
        );
        let sizes: Vec<i32> = p.pools.iter().map(|p| p.replicas).collect();
        assert_eq!(sizes, vec![2, 3]);
    }

    #[test]
    fn a_pool_added_joins_one_removed_goes_and_a_scaling_pool_keeps_its_size_within_bounds() {
        let kc = cluster(
            "1.34",
            "[{ name: b, minReplicas: 1, maxReplicas: 3 }, { name: c, replicas: 1 }]",
        );
        let live = [pool("a", NEW, 2, true), pool("b", NEW, 5, true)];
        let p = plan(&kc, Some(&cp(NEW, NEW, true)), &live);
        // Pool a goes once c, which joins now, has its machines.
        assert_eq!(p.remove, Vec::<String>::new());
        assert_eq!(p.removal_waits, vec!["team-a-a".to_string()]);
        let b = &p.pools[0];
        assert_eq!((b.replicas, b.make), (3, false), "kept within maxReplicas");
        let c = &p.pools[1];
        assert_eq!((c.version.as_str(), c.make), (NEW, true));
        let joined = [
            pool("a", NEW, 2, true),
            pool("b", NEW, 3, true),
            pool("c", NEW, 1, true),
        ];
        let p = plan(&kc, Some(&cp(NEW, NEW, true)), &joined);
        assert_eq!(p.remove, vec!["team-a-a".to_string()]);
        assert!(p.removal_waits.is_empty());
        // A pool that stays rolling (or stalled) with its machines ready does not hold it.
        let mut rolling_b = joined.clone();
        rolling_b[1].rolled_out = false;
        assert_eq!(
            plan(&kc, Some(&cp(NEW, NEW, true)), &rolling_b).remove,
            vec!["team-a-a".to_string()]
        );
        // Being deleted: not deleted again.
        let mut going = joined.clone();
        going[0].deleting = true;
        assert!(plan(&kc, Some(&cp(NEW, NEW, true)), &going).remove.is_empty());
    }
}
