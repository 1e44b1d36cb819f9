//! When to move the Service between the app and the maintenance page. Pure.
//!
//! The Service moves to a side only once that side's pods are all Ready, so clients never see
//! a gap. That holds from the first reconcile on: a new MaintPage publishes the side its spec
//! asks for once that side is Ready, and until then the other side if that one is Ready;
//! nothing counts as published before a side is Ready. The maintenance pods run while the page is published or about to be, and for a short
//! drain after the Service has moved back to the app, so that connections kube-proxy still sends
//! them while it catches up are answered. Everything the plan depends on comes from the
//! resource's status and the observed Deployments, never from memory: a restarted operator
//! makes the same decision.

use std::time::Duration;

use noops_api::maintpage::{MaintPageSpec, Side};

/// How long the maintenance pods keep running after the Service has moved back to the app.
pub const DRAIN: Duration = Duration::from_secs(5);

/// What the controller knows when it plans (from `observe.rs`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Facts {
    /// The side the Service sends traffic to (status, else the live selector).
    pub published: Option<Side>,
    /// When the Service last switched.
    pub switched_at: Option<jiff::Timestamp>,
    pub app_ready: bool,
    pub maintenance_ready: bool,
    /// The side the last reconcile held the switch back for (and said so), from the status.
    pub waiting_for: Option<Side>,
}

/// The decision of one reconcile.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The side the Service selects after this reconcile.
    pub publish: Side,
    /// The side recorded as published: `publish`, once a Ready side has been published; `None`
    /// while a new MaintPage has no Ready side yet.
    pub published: Option<Side>,
    /// Whether this reconcile publishes a side for the first time.
    pub first_publish: bool,
    /// Whether this reconcile moves the Service from one published side to the other.
    pub switched: bool,
    /// When the Service last moved (now, if `switched`).
    pub switched_at: Option<jiff::Timestamp>,
    /// The side the Service is waiting to move to, until its pods are Ready.
    pub waiting_for: Option<Side>,
    /// Whether this reconcile is the first to hold the switch back (it says so in an Event).
    pub started_waiting: bool,
    /// Replicas of the maintenance Deployment.
    pub maintenance_replicas: i32,
    /// Come back after this long even if nothing changes (end of the drain).
    pub requeue_after: Option<Duration>,
}

/// Plans the next step.
pub fn plan(spec: &MaintPageSpec, observed: &Facts, now: jiff::Timestamp) -> Plan {
    let desired = spec.desired_side();
    let ready = |side| match side {
        Side::App => observed.app_ready,
        Side::Maintenance => observed.maintenance_ready,
    };
    let other = match desired {
        Side::App => Side::Maintenance,
        Side::Maintenance => Side::App,
    };
    // (the side selected, the side published, whether it moved, the side waited for)
    let (publish, published, switched, waiting_for) = match observed.published {
        // The first publish: only ever a Ready side, the one asked for first.
        None if ready(desired) => (desired, Some(desired), false, None),
        None if ready(other) => (other, Some(other), false, Some(desired)),
        // Nothing is Ready yet: the Service selects the side asked for, which answers as soon
        // as its first pod is Ready; it counts as published only then.
        None => (desired, None, false, Some(desired)),
        Some(current) if current == desired => (current, Some(current), false, None),
        Some(_) if ready(desired) => (desired, Some(desired), true, None),
        Some(current) => (current, Some(current), false, Some(desired)),
    };
    let switched_at = if switched { Some(now) } else { observed.switched_at };
    let (maintenance_replicas, requeue_after) = if publish == Side::Maintenance || desired == Side::Maintenance {
        (spec.maintenance.replicas, None)
    } else {
        let since = switched_at.map(|t| now.duration_since(t).unsigned_abs());
        match since {
            Some(elapsed) if elapsed < DRAIN => (spec.maintenance.replicas, Some(DRAIN - elapsed)),
            _ => (0, None),
        }
    };
    Plan {
        publish,
        published,
        first_publish: observed.published.is_none() && published.is_some(),
        switched,
        switched_at,
        waiting_for,
        started_waiting: waiting_for.is_some() && waiting_for != observed.waiting_for,
        maintenance_replicas,
        requeue_after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maintpage::fixtures;

    fn spec(enabled: bool) -> MaintPageSpec {
        fixtures::maintpage().enabled(enabled).build().spec
    }

    fn at(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(s).unwrap()
    }

    fn observed(published: Option<Side>, app_ready: bool, maintenance_ready: bool) -> Facts {
        Facts {
            published,
            app_ready,
            maintenance_ready,
            ..Default::default()
        }
    }

    #[test]
    fn a_new_resource_publishes_the_app_once_ready_without_maintenance_pods() {
        let starting = plan(&spec(false), &observed(None, false, false), at(0));
        assert_eq!(
            (starting.publish, starting.published),
            (Side::App, None),
            "not yet published"
        );
        assert_eq!(starting.maintenance_replicas, 0);
        assert_eq!(starting.waiting_for, Some(Side::App));
        let ready = plan(&spec(false), &observed(None, true, false), at(1));
        assert_eq!((ready.publish, ready.published), (Side::App, Some(Side::App)));
        assert!(ready.first_publish && !ready.switched);
        assert_eq!((ready.switched_at, ready.maintenance_replicas), (None, 0), "no drain");
    }

    #[test]
    fn a_new_resource_in_maintenance_publishes_the_app_until_the_page_is_ready() {
        let waiting = plan(&spec(true), &observed(None, true, false), at(0));
        assert_eq!((waiting.publish, waiting.published), (Side::App, Some(Side::App)));
        assert_eq!(waiting.waiting_for, Some(Side::Maintenance));
        assert!(waiting.first_publish && waiting.started_waiting);
        assert_eq!(waiting.maintenance_replicas, 1, "the page keeps starting");
        // Once published, the usual rule holds: the page is switched to when Ready.
        let later = plan(&spec(true), &observed(Some(Side::App), true, true), at(5));
        assert_eq!((later.publish, later.switched), (Side::Maintenance, true));
        // Both Ready at once: the side asked for.
        let both = plan(&spec(true), &observed(None, true, true), at(0));
        assert_eq!(
            (both.publish, both.published),
            (Side::Maintenance, Some(Side::Maintenance))
        );
        // Neither: the Service selects the page, nothing is published.
        let neither = plan(&spec(true), &observed(None, false, false), at(0));
        assert_eq!((neither.publish, neither.published), (Side::Maintenance, None));
        assert!(!neither.first_publish);
    }

    #[test]
    fn toggling_on_waits_for_the_maintenance_pods() {
        let waiting = plan(&spec(true), &observed(Some(Side::App), true, false), at(0));
        assert_eq!(
            waiting.publish,
            Side::App,
            "keep serving the app until the page is Ready"
        );
        assert_eq!(waiting.waiting_for, Some(Side::Maintenance));
        assert_eq!(waiting.maintenance_replicas, 1, "start the maintenance pods");
        assert!(waiting.started_waiting, "the first reconcile that waits says so");
        let still = Facts {
            waiting_for: Some(Side::Maintenance),
            ..observed(Some(Side::App), true, false)
        };
        assert!(!plan(&spec(true), &still, at(1)).started_waiting, "and only the first");
        let ready = plan(&spec(true), &observed(Some(Side::App), true, true), at(10));
        assert_eq!(
            (ready.publish, ready.switched, ready.switched_at),
            (Side::Maintenance, true, Some(at(10)))
        );
    }

    #[test]
    fn toggling_off_waits_for_the_app_then_drains_the_page() {
        let waiting = plan(&spec(false), &observed(Some(Side::Maintenance), false, true), at(0));
        assert_eq!(
            (waiting.publish, waiting.waiting_for),
            (Side::Maintenance, Some(Side::App))
        );
        assert_eq!(waiting.maintenance_replicas, 1);
        let switched = plan(&spec(false), &observed(Some(Side::Maintenance), true, true), at(100));
        assert_eq!((switched.publish, switched.switched), (Side::App, true));
        assert_eq!(switched.maintenance_replicas, 1, "still draining");
        assert_eq!(switched.requeue_after, Some(DRAIN));
        let later = Facts {
            switched_at: Some(at(100)),
            ..observed(Some(Side::App), true, true)
        };
        let draining = plan(&spec(false), &later, at(102));
        assert_eq!(
            (draining.maintenance_replicas, draining.requeue_after),
            (1, Some(Duration::from_secs(3)))
        );
        let drained = plan(&spec(false), &later, at(106));
        assert_eq!((drained.maintenance_replicas, drained.requeue_after), (0, None));
    }

    #[test]
    fn a_restarted_operator_finishes_a_switch_from_status_alone() {
        // Status says maintenance is published, spec says maintenance: stable, nothing to do.
        let p = plan(&spec(true), &observed(Some(Side::Maintenance), true, true), at(50));
        assert_eq!((p.publish, p.switched, p.waiting_for), (Side::Maintenance, false, None));
    }
}
