//! The MaintPage status: which side is published, ready pods, and the three conditions. Pure.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use noops_api::condition::{DEGRADED, PROGRESSING, READY};
use noops_api::maintpage::MaintPageReason;
use noops_api::maintpage::{MaintPage, MaintPageStatus, Side};

use super::switch::Plan;
use crate::core::conditions::{self, Decided, merge, with_paused};
use crate::core::rollout::{
    deployment_ready_replicas as ready_replicas, deployment_rolled_out as rolled_out, deployment_stalled as stalled,
};
use crate::core::stuck::Stuck;

fn side_name(side: Side) -> &'static str {
    match side {
        Side::App => "the app",
        Side::Maintenance => "the maintenance page",
    }
}

/// What the status says about the children: the Deployments as the apply returned them, and
/// whether the pods of a side cannot start.
#[derive(Debug, Clone, Copy, Default)]
pub struct StatusFacts<'a> {
    pub app: Option<&'a Deployment>,
    pub maintenance: Option<&'a Deployment>,
    pub app_stuck: Option<&'a Stuck>,
    pub maintenance_stuck: Option<&'a Stuck>,
}

/// What the conditions are built from: the published side's rollout, in words.
struct Published<'a> {
    service: &'a str,
    desired: Side,
    replicas: i32,
    ready: bool,
    /// `<ready>/<wanted> pods ready`.
    counts: String,
}

/// Builds the status after a reconcile that carried out `plan`: one builder per condition.
pub fn build(mp: &MaintPage, plan: &Plan, seen: &StatusFacts, now: jiff::Timestamp) -> MaintPageStatus {
    let (app, maintenance) = (seen.app, seen.maintenance);
    let spec = &mp.spec;
    let published = Published::of(mp, plan.publish, seen);
    let previous = mp.status.clone().unwrap_or_default();
    MaintPageStatus {
        observed_generation: mp.metadata.generation,
        conditions: merge(
            &previous.conditions,
            &[
                ready_condition(plan.publish, plan.waiting_for, &published, spec.app.replicas),
                progressing(plan, &published),
                degraded(seen),
                conditions::paused(spec.paused),
            ],
            mp.metadata.generation,
            now,
        ),
        published: plan.published,
        switched_at: plan.switched_at.map(Time),
        waiting_for: plan.waiting_for,
        app_ready_replicas: ready_replicas(app),
        maintenance_ready_replicas: ready_replicas(maintenance),
        service_name: Some(spec.app.name.clone()),
    }
}

impl<'a> Published<'a> {
    /// Side `side` of `mp` as the Service's: its Deployment's rollout, in words.
    fn of(mp: &'a MaintPage, side: Side, seen: &StatusFacts) -> Self {
        let (deployment, replicas) = match side {
            Side::App => (seen.app, mp.spec.app.replicas),
            Side::Maintenance => (seen.maintenance, mp.spec.maintenance.replicas),
        };
        Published {
            service: &mp.spec.app.name,
            desired: mp.spec.desired_side(),
            replicas,
            ready: rolled_out(deployment, replicas),
            counts: format!("{}/{replicas} pods ready", ready_replicas(deployment)),
        }
    }
}

/// Ready: the side asked for is published (`publish`, switching to `waiting_for`), and its
/// pods are Ready.
fn ready_condition(
    publish: Side,
    waiting_for: Option<Side>,
    published: &Published,
    app_replicas: i32,
) -> Decided<MaintPageReason> {
    let Published { service, counts, .. } = published;
    let sends = || format!("Service {service} sends traffic to {} ({counts})", side_name(publish));
    if publish != published.desired {
        let waited = waiting_for.unwrap_or(published.desired);
        let message = format!(
            "Service {service} still sends traffic to {} until {} is Ready",
            side_name(publish),
            side_name(waited)
        );
        Decided::new(READY, false, MaintPageReason::Switching, message)
    } else if published.ready {
        let reason = match publish {
            Side::App => MaintPageReason::AppPublished,
            Side::Maintenance => MaintPageReason::MaintenancePublished,
        };
        Decided::new(READY, true, reason, sends())
    } else if publish == Side::App && app_replicas == 0 {
        let message = format!("app {service} has 0 replicas: nothing answers");
        Decided::new(READY, false, MaintPageReason::ScaledToZero, message)
    } else {
        let reason = match publish {
            Side::App => MaintPageReason::AppNotReady,
            Side::Maintenance => MaintPageReason::MaintenanceNotReady,
        };
        Decided::new(READY, false, reason, sends())
    }
}

/// Progressing: a switch waits for the other side, or the published side rolls out.
fn progressing(plan: &Plan, published: &Published) -> Decided<MaintPageReason> {
    if plan.publish != published.desired {
        let reason = match published.desired {
            Side::App => MaintPageReason::SwitchingToApp,
            Side::Maintenance => MaintPageReason::SwitchingToMaintenance,
        };
        let message = format!(
            "waiting for {} to be Ready before switching",
            side_name(published.desired)
        );
        Decided::new(PROGRESSING, true, reason, message)
    } else if !published.ready && published.replicas > 0 {
        let message = format!("{} is rolling out ({})", side_name(plan.publish), published.counts);
        Decided::new(PROGRESSING, true, MaintPageReason::RollingOut, message)
    } else {
        let message = format!("{} is published", side_name(plan.publish));
        Decided::new(PROGRESSING, false, MaintPageReason::Stable, message)
    }
}

/// Degraded: pods that cannot start say so at once; a stalled rollout only after its deadline.
fn degraded(seen: &StatusFacts) -> Decided<MaintPageReason> {
    let stuck = seen
        .app_stuck
        .map(|s| ("app", s))
        .or(seen.maintenance_stuck.map(|s| ("maintenance", s)));
    if let Some((which, stuck)) = stuck {
        let message = format!("{which} pods cannot start ({}): {}", stuck.reason, stuck.message);
        // The pods' own reason where the kind lists it (the CRD schema lists every reason).
        let reason = MaintPageReason::from_name(stuck.reason).unwrap_or(MaintPageReason::PodsCannotStart);
        return Decided::new(DEGRADED, true, reason, message);
    }
    let stalled = stalled(seen.app)
        .map(|m| ("app", m))
        .or_else(|| stalled(seen.maintenance).map(|m| ("maintenance", m)));
    match stalled {
        Some((which, message)) => Decided::new(
            DEGRADED,
            true,
            MaintPageReason::RolloutStalled,
            format!("{which} Deployment: {message}"),
        ),
        None => Decided::new(DEGRADED, false, MaintPageReason::AsExpected, "no problems found"),
    }
}

/// The Degraded condition of `new` if it just became True, or True for another reason than in
/// `previous` (so that it is announced once, in an Event).
pub fn newly_degraded<'a>(previous: Option<&MaintPageStatus>, new: &'a MaintPageStatus) -> Option<&'a Condition> {
    let degraded = |s: &'a MaintPageStatus| s.conditions.iter().find(|c| c.type_ == DEGRADED && c.status == "True");
    let now = degraded(new)?;
    let before = previous.and_then(|p| p.conditions.iter().find(|c| c.type_ == DEGRADED && c.status == "True"));
    (before.map(|c| c.reason.as_str()) != Some(now.reason.as_str())).then_some(now)
}

/// The status when the spec cannot be carried out (a name conflict): Degraded with the error's
/// reason, not Ready, nothing else changed.
pub fn blocked(mp: &MaintPage, reason: MaintPageReason, message: &str, now: jiff::Timestamp) -> MaintPageStatus {
    let previous = mp.status.clone().unwrap_or_default();
    let decided = [
        Decided::new(READY, false, reason, message),
        Decided::new(PROGRESSING, false, reason, "blocked until the problem is fixed"),
        Decided::new(DEGRADED, true, reason, message),
    ];
    MaintPageStatus {
        observed_generation: mp.metadata.generation,
        conditions: merge(
            &previous.conditions,
            &with_paused(&decided, mp.spec.paused),
            mp.metadata.generation,
            now,
        ),
        ..previous
    }
}

/// The status while paused: the Service stays where it is, and Ready says whether that is the
/// side the spec asks for; nothing else is decided.
pub fn paused(mp: &MaintPage, seen: &StatusFacts, now: jiff::Timestamp) -> MaintPageStatus {
    let previous = mp.status.clone().unwrap_or_default();
    let desired = mp.spec.desired_side();
    let service = &mp.spec.app.name;
    let mut decided = vec![
        Decided::new(
            PROGRESSING,
            false,
            MaintPageReason::Paused,
            "spec.paused: the operator changes nothing until it is false",
        ),
        degraded(seen),
    ];
    // Ready: the side the spec asks for is the one served, and its pods are Ready.
    decided.push(match previous.published {
        Some(published) if published == desired => ready_condition(
            published,
            None,
            &Published::of(mp, published, seen),
            mp.spec.app.replicas,
        ),
        published => {
            let serves = published.map_or("nothing", side_name);
            let message = format!(
                "paused: Service {service} stays on {serves} although the spec asks for {}",
                side_name(desired)
            );
            Decided::new(READY, false, MaintPageReason::Paused, message)
        }
    });
    MaintPageStatus {
        observed_generation: mp.metadata.generation,
        conditions: merge(
            &previous.conditions,
            &with_paused(&decided, mp.spec.paused),
            mp.metadata.generation,
            now,
        ),
        app_ready_replicas: ready_replicas(seen.app),
        maintenance_ready_replicas: ready_replicas(seen.maintenance),
        ..previous
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::conditions::is_true;
    use crate::core::fixtures::deployment;
    use crate::maintpage::fixtures::{self, plan};

    fn mp(enabled: bool) -> MaintPage {
        fixtures::maintpage()
            .enabled(enabled)
            .app_replicas(1)
            .generation(4)
            .build()
    }

    fn waiting_for(publish: Side, side: Side) -> Plan {
        Plan {
            waiting_for: Some(side),
            ..plan(publish, 1)
        }
    }

    #[test]
    fn published_and_ready() {
        let d = deployment("shop").ready(1).build();
        let seen = StatusFacts {
            app: Some(&d),
            ..Default::default()
        };
        let s = build(&mp(false), &plan(Side::App, 1), &seen, jiff::Timestamp::UNIX_EPOCH);
        assert!(is_true(&s.conditions, READY));
        assert!(!is_true(&s.conditions, PROGRESSING));
        assert_eq!(s.published, Some(Side::App));
        assert_eq!(s.observed_generation, Some(4));
        assert!(s.conditions.iter().all(|c| c.observed_generation == Some(4)));
    }

    #[test]
    fn switching_is_not_ready_and_says_what_it_waits_for() {
        let d = deployment("shop").ready(1).build();
        let seen = StatusFacts {
            app: Some(&d),
            ..Default::default()
        };
        let s = build(
            &mp(true),
            &waiting_for(Side::App, Side::Maintenance),
            &seen,
            jiff::Timestamp::UNIX_EPOCH,
        );
        let ready = s.conditions.iter().find(|c| c.type_ == READY).unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "Switching"));
        assert!(
            ready.message.contains("until the maintenance page is Ready"),
            "{}",
            ready.message
        );
        assert!(is_true(&s.conditions, PROGRESSING));
        assert_eq!(
            s.waiting_for,
            Some(Side::Maintenance),
            "recorded, so it is announced once"
        );
    }

    #[test]
    fn paused_keeps_the_published_side_and_says_when_the_spec_asks_for_the_other() {
        let d = deployment("shop").ready(1).build();
        let seen = StatusFacts {
            app: Some(&d),
            ..Default::default()
        };
        let serving = build(&mp(false), &plan(Side::App, 1), &seen, jiff::Timestamp::UNIX_EPOCH);
        let mut asked = fixtures::maintpage()
            .enabled(true)
            .app_replicas(1)
            .generation(5)
            .status(serving)
            .build();
        asked.spec.paused = true;
        let s = paused(&asked, &seen, jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(s.published, Some(Side::App), "no switch while paused");
        assert_eq!(s.observed_generation, Some(5));
        let ready = s.conditions.iter().find(|c| c.type_ == READY).unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "Paused"));
        assert!(ready.message.contains("stays on the app"), "{}", ready.message);
        let progressing = s.conditions.iter().find(|c| c.type_ == PROGRESSING).unwrap();
        assert_eq!(progressing.reason, "Paused");

        // Still paused, the spec back on the side served: Ready again, from its pods.
        asked.status = Some(s);
        asked.spec.maintenance.enabled = false;
        asked.metadata.generation = Some(6);
        let s = paused(&asked, &seen, jiff::Timestamp::UNIX_EPOCH);
        let ready = s.conditions.iter().find(|c| c.type_ == READY).unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("True", "AppPublished"));
        assert!(s.conditions.iter().all(|c| c.observed_generation == Some(6)));
        // Its pods not Ready: said.
        let none_ready = deployment("shop").ready(0).build();
        let seen = StatusFacts {
            app: Some(&none_ready),
            ..Default::default()
        };
        let s = paused(&asked, &seen, jiff::Timestamp::UNIX_EPOCH);
        assert!(!is_true(&s.conditions, READY));
    }

    #[test]
    fn a_stalled_rollout_is_degraded() {
        let app = deployment("shop")
            .stalled("ReplicaSet has timed out progressing")
            .build();
        let seen = StatusFacts {
            app: Some(&app),
            ..Default::default()
        };
        let s = build(&mp(false), &plan(Side::App, 0), &seen, jiff::Timestamp::UNIX_EPOCH);
        let degraded = s.conditions.iter().find(|c| c.type_ == DEGRADED).unwrap();
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "RolloutStalled")
        );
        assert!(degraded.message.contains("timed out"), "{}", degraded.message);
    }

    #[test]
    fn pods_that_cannot_start_are_degraded_at_once_and_announced_once() {
        let app = deployment("shop").ready(1).build();
        let stuck = Stuck {
            reason: "ImageNotMapped",
            message: "pod shop-maintenance-1, container maintenance: not mapped".into(),
        };
        let seen = StatusFacts {
            app: Some(&app),
            maintenance_stuck: Some(&stuck),
            ..Default::default()
        };
        let plan = waiting_for(Side::App, Side::Maintenance);
        let s = build(&mp(true), &plan, &seen, jiff::Timestamp::UNIX_EPOCH);
        let degraded = s.conditions.iter().find(|c| c.type_ == DEGRADED).unwrap();
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "ImageNotMapped")
        );
        assert!(
            degraded.message.contains("maintenance pods cannot start"),
            "{}",
            degraded.message
        );
        assert!(newly_degraded(None, &s).is_some(), "announced");
        assert!(newly_degraded(Some(&s), &s).is_none(), "once");
        let recovered = build(
            &mp(true),
            &plan,
            &StatusFacts {
                app: Some(&app),
                ..Default::default()
            },
            jiff::Timestamp::UNIX_EPOCH,
        );
        assert!(
            !is_true(&recovered.conditions, DEGRADED),
            "cleared when the pods recover"
        );
    }

    #[test]
    fn a_conflict_blocks_with_its_reason() {
        let s = blocked(
            &mp(false),
            MaintPageReason::NameConflict,
            "Deployment shop exists",
            jiff::Timestamp::UNIX_EPOCH,
        );
        assert!(is_true(&s.conditions, DEGRADED));
        assert!(!is_true(&s.conditions, READY));
        assert_eq!(s.conditions[0].reason, "NameConflict");
    }
}
