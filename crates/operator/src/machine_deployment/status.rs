//! The status of a MachineDeployment, from its MachineSets and the plan. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use noops_api::condition::{DEGRADED, PROGRESSING, READY};
use noops_api::machine_deployment::MachineDeploymentPhase;
use noops_api::machine_deployment::MachineDeploymentReason;
use noops_api::machine_deployment::{MachineDeployment, MachineDeploymentStatus};
use noops_api::machine_set::MachineSet;

use super::plan::{DeploymentPlan, TEMPLATE_HASH_LABEL, template_hash};
use crate::core::conditions::{Decided, merge, passed_on, paused};
use crate::machine::status::DRAIN_HELD;
use crate::machine_set::health::scaled;
use crate::machine_set::status::MACHINES_DELETING;

/// True while at least `replicas - maxUnavailable` machines are available.
pub const AVAILABLE: &str = "Available";

/// The status the deployment should have now; `sets` are the MachineSets it owns.
pub fn build(
    md: &MachineDeployment,
    sets: &[MachineSet],
    plan: &DeploymentPlan,
    now: jiff::Timestamp,
) -> MachineDeploymentStatus {
    let previous = md.status.clone().unwrap_or_default();
    let hash = template_hash(md);
    let is_current =
        |s: &MachineSet| s.metadata.labels.as_ref().and_then(|l| l.get(TEMPLATE_HASH_LABEL)) == Some(&hash);
    let current = sets.iter().find(|s| is_current(s));
    let totals = Totals::of(sets, current);
    let progress_at = progress_at(md, &previous, &totals, now);
    let deadline = jiff::SignedDuration::from_secs(md.spec.progress_deadline_seconds);
    let held_back = md.spec.rollout_paused || md.spec.paused;
    let situation = Situation {
        complete: plan.complete,
        // An older set with a machine asked, left or still draining.
        rolling: sets.iter().any(|s| !is_current(s) && left_of(s) + s.spec.replicas > 0),
        stalled: !plan.complete && !held_back && now >= progress_at.0 + deadline,
    };
    // The current set's machines first; else an older set's (a drain held past its bound is
    // an old machine's).
    let current_problem = current
        .and_then(degraded_of)
        .or_else(|| sets.iter().filter(|s| !is_current(s)).find_map(degraded_of));
    let deleting_machines = machines_deleting(sets);
    let held =
        (deleting_machines.reason == MachineDeploymentReason::DrainHeld).then_some(deleting_machines.message.as_str());
    let counts = Counts {
        available: totals.available,
        updated: totals.updated,
        deleting: totals.deleting,
        wanted: md.spec.replicas,
    };
    let mut decided = decide(md, &counts, situation, current_problem, held);
    decided.push(deleting_machines.clone());
    decided.push(paused(md.spec.paused));
    MachineDeploymentStatus {
        observed_generation: md.metadata.generation,
        conditions: merge(&previous.conditions, &decided, md.metadata.generation, now),
        phase: Some(phase(md, plan, &totals, situation)),
        replicas: Some(totals.replicas),
        ready_replicas: Some(totals.ready),
        updated_replicas: Some(totals.updated),
        available_replicas: Some(totals.available),
        deleting_replicas: Some(totals.deleting),
        selector: Some(
            md.spec
                .selector
                .match_labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(","),
        ),
        current_machine_set: plan.current.as_ref().map(|(n, _)| n.clone()),
        progress_at: Some(progress_at),
    }
}

/// The machines of a deployment's sets, counted from the sets' status.
struct Totals {
    replicas: i32,
    ready: i32,
    available: i32,
    deleting: i32,
    /// The current template's set's machines.
    updated: i32,
}

impl Totals {
    fn of(sets: &[MachineSet], current: Option<&MachineSet>) -> Self {
        let sum = |f: fn(&MachineSet) -> Option<i32>| sets.iter().filter_map(f).sum::<i32>();
        Self {
            replicas: sum(|s| s.status.as_ref()?.replicas),
            ready: sum(|s| s.status.as_ref()?.ready_replicas),
            available: sum(|s| s.status.as_ref()?.available_replicas),
            deleting: sum(|s| s.status.as_ref()?.deleting_replicas),
            updated: current.and_then(|s| s.status.as_ref()?.replicas).unwrap_or(0),
        }
    }
}

/// The machines a set still has, the ones being deleted included.
fn left_of(set: &MachineSet) -> i32 {
    let status = set.status.as_ref();
    status.and_then(|s| s.replicas).unwrap_or(0) + status.and_then(|s| s.deleting_replicas).unwrap_or(0)
}

/// When the deployment last moved: now if anything moved since the last status, or the spec
/// is new; else when the last status said.
fn progress_at(
    md: &MachineDeployment,
    previous: &MachineDeploymentStatus,
    totals: &Totals,
    now: jiff::Timestamp,
) -> Time {
    let moved = (
        Some(totals.replicas),
        Some(totals.ready),
        Some(totals.updated),
        Some(totals.available),
        Some(totals.deleting),
    ) != (
        previous.replicas,
        previous.ready_replicas,
        previous.updated_replicas,
        previous.available_replicas,
        previous.deleting_replicas.or(Some(0)),
    ) || previous.observed_generation != md.metadata.generation;
    match &previous.progress_at {
        Some(at) if !moved => at.clone(),
        _ => Time(now),
    }
}

/// The phase `kubectl get` shows.
fn phase(md: &MachineDeployment, plan: &DeploymentPlan, totals: &Totals, at: Situation) -> MachineDeploymentPhase {
    let wanted = md.spec.replicas;
    if md.spec.paused || (md.spec.rollout_paused && !plan.complete) {
        MachineDeploymentPhase::Paused
    } else if at.stalled {
        MachineDeploymentPhase::Stalled
    } else if at.rolling {
        MachineDeploymentPhase::Rolling
    } else if totals.replicas < wanted {
        MachineDeploymentPhase::ScalingUp
    } else if totals.replicas > wanted || totals.deleting > 0 {
        MachineDeploymentPhase::ScalingDown
    } else if plan.complete {
        MachineDeploymentPhase::Running
    } else {
        MachineDeploymentPhase::ScalingUp
    }
}

/// Why a set's machines are degraded, if they are.
fn degraded_of(set: &MachineSet) -> Option<String> {
    set.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == DEGRADED && c.status == "True")
        .map(|c| passed_on(MachineDeploymentReason::MachinesDegraded, c))
}

/// [`MACHINES_DELETING`] of a deployment: its sets' together.
fn machines_deleting(sets: &[MachineSet]) -> Decided<MachineDeploymentReason> {
    let deleting: Vec<&Condition> = sets
        .iter()
        .filter_map(|s| s.status.as_ref())
        .filter_map(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == MACHINES_DELETING && c.status == "True")
        })
        .collect();
    let held: Vec<&str> = deleting
        .iter()
        .filter(|c| c.reason == DRAIN_HELD)
        .map(|c| c.message.as_str())
        .collect();
    let all: Vec<&str> = deleting.iter().map(|c| c.message.as_str()).collect();
    match (all.is_empty(), held.is_empty()) {
        (true, _) => Decided::new(
            MACHINES_DELETING,
            false,
            MachineDeploymentReason::NoneDeleting,
            "no machine is being deleted",
        ),
        (false, false) => Decided::new(
            MACHINES_DELETING,
            true,
            MachineDeploymentReason::DrainHeld,
            held.join("; "),
        ),
        (false, true) => Decided::new(
            MACHINES_DELETING,
            true,
            MachineDeploymentReason::Deleting,
            all.join("; "),
        ),
    }
}

/// The machine counts the conditions speak of.
#[derive(Clone, Copy)]
struct Counts {
    available: i32,
    updated: i32,
    deleting: i32,
    wanted: i32,
}

/// Where the deployment is.
#[derive(Clone, Copy)]
struct Situation {
    complete: bool,
    rolling: bool,
    stalled: bool,
}

/// Ready, Available, Progressing and Degraded. `current_problem`: why the current set's machines
/// are degraded, if they are.
fn decide(
    md: &MachineDeployment,
    counts: &Counts,
    at: Situation,
    current_problem: Option<String>,
    held: Option<&str>,
) -> Vec<Decided<MachineDeploymentReason>> {
    let Counts {
        available,
        updated,
        deleting,
        wanted,
    } = *counts;
    let Situation {
        complete: plan_complete,
        rolling,
        stalled,
    } = at;
    let mut counts =
        format!("{available}/{wanted} available, {updated} of the current template, {deleting} being deleted");
    // What holds a machine's deletion, in every message that a rollout's watcher reads.
    if let Some(held) = held {
        counts.push_str(&format!("; held: {held}"));
    }
    let mut decided = vec![if plan_complete {
        Decided::new(READY, true, MachineDeploymentReason::RolledOut, counts.clone())
    } else {
        Decided::new(
            READY,
            false,
            if rolling {
                MachineDeploymentReason::Rolling
            } else {
                MachineDeploymentReason::Scaling
            },
            counts.clone(),
        )
    }];
    let unavailable = md
        .spec
        .strategy
        .rolling_update
        .clone()
        .map_or(0, |r| scaled(&r.max_unavailable, wanted, false));
    decided.push(Decided::new(
        AVAILABLE,
        available >= wanted - unavailable,
        if available >= wanted - unavailable {
            MachineDeploymentReason::MinimumMachinesAvailable
        } else {
            MachineDeploymentReason::MachinesUnavailable
        },
        counts.clone(),
    ));
    decided.push(progressing(md, &counts, at, current_problem.as_deref(), held));
    decided.push(degraded(stalled, current_problem));
    decided
}

/// `Progressing`: a rollout stalled (and what holds it), done, paused, or under way.
fn progressing(
    md: &MachineDeployment,
    counts: &str,
    at: Situation,
    current_problem: Option<&str>,
    held: Option<&str>,
) -> Decided<MachineDeploymentReason> {
    if at.stalled {
        let why = match held {
            // An old machine's drain is what waits, not the new machines.
            Some(held) => format!("held: {held}"),
            None => format!(
                "the old machines are left as they are until the template is fixed: {}",
                current_problem.unwrap_or("the new machines do not become ready")
            ),
        };
        Decided::new(
            PROGRESSING,
            false,
            MachineDeploymentReason::ProgressDeadlineExceeded,
            format!("no progress for {}s; {why}", md.spec.progress_deadline_seconds),
        )
    } else if at.complete {
        Decided::new(
            PROGRESSING,
            true,
            MachineDeploymentReason::NewMachineSetAvailable,
            counts,
        )
    } else if md.spec.paused {
        Decided::new(
            PROGRESSING,
            false,
            MachineDeploymentReason::Paused,
            "spec.paused: no MachineSet is made, scaled or removed",
        )
    } else if md.spec.rollout_paused {
        Decided::new(
            PROGRESSING,
            false,
            MachineDeploymentReason::Paused,
            "the rollout is paused",
        )
    } else {
        Decided::new(PROGRESSING, true, MachineDeploymentReason::MachineSetUpdated, counts)
    }
}

/// `Degraded`: a stalled rollout, or a machine's problem.
fn degraded(stalled: bool, current_problem: Option<String>) -> Decided<MachineDeploymentReason> {
    match (stalled, current_problem) {
        (true, problem) => Decided::new(
            DEGRADED,
            true,
            MachineDeploymentReason::ProgressDeadlineExceeded,
            problem.unwrap_or_else(|| "the rollout makes no progress".into()),
        ),
        (false, Some(problem)) => Decided::new(DEGRADED, true, MachineDeploymentReason::MachinesDegraded, problem),
        (false, None) => Decided::new(DEGRADED, false, MachineDeploymentReason::AsExpected, "nothing is wrong"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine_deployment::plan::{SetView, plan, set_name};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use noops_api::machine_set::MachineSetStatus;
    use serde_json::json;

    fn md(version: &str) -> MachineDeployment {
        let spec = serde_json::from_value(json!({
            "clusterName": "c", "replicas": 2, "progressDeadlineSeconds": 60,
            "selector": { "matchLabels": { "pool": "p" } },
            "template": { "metadata": { "labels": { "pool": "p" } }, "spec": { "version": version } },
        }))
        .unwrap();
        let mut d = MachineDeployment::new("pool", spec);
        d.metadata.generation = Some(2);
        d
    }

    fn set(of: &MachineDeployment, replicas: i32, machines: i32, available: i32, problem: Option<&str>) -> MachineSet {
        let owner = Default::default();
        let mut s = crate::machine_deployment::desired::machine_set(of, &set_name(of), replicas, &owner);
        s.status = Some(MachineSetStatus {
            replicas: Some(machines),
            ready_replicas: Some(available),
            available_replicas: Some(available),
            conditions: problem
                .map(|p| {
                    vec![Condition {
                        type_: DEGRADED.into(),
                        status: "True".into(),
                        reason: "MachinesDegraded".into(),
                        message: p.into(),
                        observed_generation: None,
                        last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
                    }]
                })
                .unwrap_or_default(),
            ..Default::default()
        });
        s
    }

    fn condition(status: &MachineDeploymentStatus, type_: &str) -> (String, String, String) {
        let c = status.conditions.iter().find(|c| c.type_ == type_).unwrap();
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    #[test]
    fn a_drain_a_budget_holds_in_an_older_set_is_named_by_the_deployment() {
        let now = jiff::Timestamp::now();
        let old = md("1.33");
        let new = md("1.34");
        let mut older = set(&old, 0, 0, 0, None);
        let held = "machine pool-a: a PodDisruptionBudget keeps shop/web-1 (budget web needs 1 healthy pods and has 1) on the Node for now";
        let status = older.status.get_or_insert_with(Default::default);
        status.deleting_replicas = Some(1);
        status.conditions.push(crate::core::fixtures::condition(
            MACHINES_DELETING,
            true,
            DRAIN_HELD,
            held,
        ));
        let sets = vec![older, set(&new, 2, 2, 2, None)];
        let views: Vec<SetView> = sets.iter().map(SetView::of).collect();
        let status = build(&new, &sets, &plan(&new, &views), now);
        assert_eq!(
            condition(&status, MACHINES_DELETING),
            ("True".into(), DRAIN_HELD.into(), held.into())
        );
        let (_, _, progressing) = condition(&status, PROGRESSING);
        assert!(progressing.ends_with(&format!("; held: {held}")), "{progressing}");
        assert_eq!(
            status.phase,
            Some(MachineDeploymentPhase::Rolling),
            "not rolled out while it drains"
        );
    }

    #[test]
    fn a_rollout_that_makes_no_progress_stalls_with_the_reason_its_new_machines_give() {
        let now = jiff::Timestamp::now();
        let old = md("1.33");
        let mut new = md("1.34");
        let sets = vec![
            set(&old, 2, 2, 2, None),
            set(
                &new,
                1,
                1,
                0,
                Some("pool-x (VmCannotStart: the VM cannot start: ImagePullBackOff)"),
            ),
        ];
        let views: Vec<SetView> = sets.iter().map(SetView::of).collect();
        let p = plan(&new, &views);
        let first = build(&new, &sets, &p, now);
        assert_eq!(first.phase, Some(MachineDeploymentPhase::Rolling));
        assert_eq!(condition(&first, PROGRESSING).0, "True");
        assert_eq!(condition(&first, READY).0, "False");
        assert_eq!(condition(&first, AVAILABLE).0, "True", "the old machines serve");
        // The set's reason is the deployment's: said once, not twice.
        assert_eq!(
            condition(&first, DEGRADED),
            (
                "True".into(),
                "MachinesDegraded".into(),
                "pool-x (VmCannotStart: the VM cannot start: ImagePullBackOff)".into()
            )
        );
        // Nothing moved for longer than the deadline.
        new.status = Some(first.clone());
        let later = build(&new, &sets, &p, now + jiff::SignedDuration::from_secs(61));
        assert_eq!(later.phase, Some(MachineDeploymentPhase::Stalled));
        let (status, reason, message) = condition(&later, PROGRESSING);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "ProgressDeadlineExceeded")
        );
        assert!(message.contains("ImagePullBackOff"), "{message}");
        assert_eq!(condition(&later, DEGRADED).1, "ProgressDeadlineExceeded");
    }

    #[test]
    fn a_deployment_with_every_machine_of_its_template_available_is_ready() {
        let d = md("1.34");
        let sets = vec![set(&d, 2, 2, 2, None)];
        let views: Vec<SetView> = sets.iter().map(SetView::of).collect();
        let status = build(&d, &sets, &plan(&d, &views), jiff::Timestamp::now());
        assert_eq!(status.phase, Some(MachineDeploymentPhase::Running));
        assert_eq!(condition(&status, READY).1, "RolledOut");
        assert_eq!((status.replicas, status.updated_replicas), (Some(2), Some(2)));
        assert_eq!(status.selector.as_deref(), Some("pool=p"));
    }
}
