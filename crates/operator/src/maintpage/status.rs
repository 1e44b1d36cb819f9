//! The MaintPage status: which side is published, ready pods, and the three conditions. Pure.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use noops_api::condition::{DEGRADED, PROGRESSING, READY};
use noops_api::maintpage::{MaintPage, MaintPageStatus, Side};

use super::desired::{ready_replicas, rolled_out};
use super::switch::Plan;
use crate::core::conditions::{Decided, merge};

fn side_name(side: Side) -> &'static str {
    match side {
        Side::App => "the app",
        Side::Maintenance => "the maintenance page",
    }
}

/// A Deployment whose rollout has stalled, with the reason Kubernetes gives.
fn stalled(deployment: Option<&Deployment>) -> Option<String> {
    let conditions = deployment?.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .find(|c| c.type_ == "Progressing" && c.status == "False")
        .map(|c| {
            c.message
                .clone()
                .unwrap_or_else(|| c.reason.clone().unwrap_or_default())
        })
}

/// Builds the status after a reconcile that carried out `plan`; `app` and `maintenance` are the
/// Deployments as the apply returned them.
pub fn build(
    mp: &MaintPage,
    plan: &Plan,
    app: Option<&Deployment>,
    maintenance: Option<&Deployment>,
    now: jiff::Timestamp,
) -> MaintPageStatus {
    let spec = &mp.spec;
    let desired = spec.desired_side();
    let service = &spec.app.name;
    let (published_deployment, published_replicas) = match plan.publish {
        Side::App => (app, spec.app.replicas),
        Side::Maintenance => (maintenance, spec.maintenance.replicas),
    };
    let published_ready = rolled_out(published_deployment, published_replicas);
    let counts = format!(
        "{}/{} pods ready",
        ready_replicas(published_deployment),
        published_replicas
    );

    let ready = if plan.publish != desired {
        let waited = plan.waiting_for.unwrap_or(desired);
        Decided::new(
            READY,
            false,
            "Switching",
            format!(
                "Service {service} still sends traffic to {} until {} is Ready",
                side_name(plan.publish),
                side_name(waited)
            ),
        )
    } else if published_ready {
        let reason = match plan.publish {
            Side::App => "AppPublished",
            Side::Maintenance => "MaintenancePublished",
        };
        Decided::new(
            READY,
            true,
            reason,
            format!(
                "Service {service} sends traffic to {} ({counts})",
                side_name(plan.publish)
            ),
        )
    } else if plan.publish == Side::App && spec.app.replicas == 0 {
        Decided::new(
            READY,
            false,
            "ScaledToZero",
            format!("app {service} has 0 replicas: nothing answers"),
        )
    } else {
        let reason = match plan.publish {
            Side::App => "AppNotReady",
            Side::Maintenance => "MaintenanceNotReady",
        };
        Decided::new(
            READY,
            false,
            reason,
            format!(
                "Service {service} sends traffic to {} ({counts})",
                side_name(plan.publish)
            ),
        )
    };

    let progressing = if plan.publish != desired {
        let reason = match desired {
            Side::App => "SwitchingToApp",
            Side::Maintenance => "SwitchingToMaintenance",
        };
        Decided::new(
            PROGRESSING,
            true,
            reason,
            format!("waiting for {} to be Ready before switching", side_name(desired)),
        )
    } else if !published_ready && published_replicas > 0 {
        Decided::new(
            PROGRESSING,
            true,
            "RollingOut",
            format!("{} is rolling out ({counts})", side_name(plan.publish)),
        )
    } else {
        Decided::new(
            PROGRESSING,
            false,
            "Stable",
            format!("{} is published", side_name(plan.publish)),
        )
    };

    let degraded = match stalled(app)
        .map(|m| ("app", m))
        .or_else(|| stalled(maintenance).map(|m| ("maintenance", m)))
    {
        Some((which, message)) => Decided::new(
            DEGRADED,
            true,
            "RolloutStalled",
            format!("{which} Deployment: {message}"),
        ),
        None => Decided::new(DEGRADED, false, "AsExpected", "no problems found"),
    };

    let previous = mp.status.clone().unwrap_or_default();
    MaintPageStatus {
        observed_generation: mp.metadata.generation,
        conditions: merge(
            &previous.conditions,
            &[ready, progressing, degraded],
            mp.metadata.generation,
            now,
        ),
        published: Some(plan.publish),
        switched_at: plan.switched_at.map(Time),
        app_ready_replicas: ready_replicas(app),
        maintenance_ready_replicas: ready_replicas(maintenance),
        service_name: Some(service.clone()),
    }
}

/// The status when the spec cannot be carried out (a name conflict): Degraded with the error's
/// reason, not Ready, nothing else changed.
pub fn blocked(mp: &MaintPage, reason: &'static str, message: &str, now: jiff::Timestamp) -> MaintPageStatus {
    let previous = mp.status.clone().unwrap_or_default();
    let decided = [
        Decided::new(READY, false, reason, message),
        Decided::new(PROGRESSING, false, reason, "blocked until the problem is fixed"),
        Decided::new(DEGRADED, true, reason, message),
    ];
    MaintPageStatus {
        observed_generation: mp.metadata.generation,
        conditions: merge(&previous.conditions, &decided, mp.metadata.generation, now),
        ..previous
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::conditions::is_true;
    use crate::maintpage::switch::Plan;
    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStatus};
    use noops_api::maintpage::{AppSpec, MaintPageSpec, MaintenanceSpec, ServiceSpec};

    fn mp(enabled: bool) -> MaintPage {
        let mut mp = MaintPage::new(
            "shop",
            MaintPageSpec {
                app: AppSpec {
                    name: "shop".into(),
                    image: "a".into(),
                    args: None,
                    port: 80,
                    replicas: 1,
                },
                maintenance: MaintenanceSpec {
                    image: "m".into(),
                    args: None,
                    port: 80,
                    replicas: 1,
                    enabled,
                },
                service: ServiceSpec::default(),
            },
        );
        mp.metadata.generation = Some(4);
        mp
    }

    fn ready_deployment() -> Deployment {
        Deployment {
            spec: Some(DeploymentSpec {
                replicas: Some(1),
                ..Default::default()
            }),
            status: Some(DeploymentStatus {
                updated_replicas: Some(1),
                ready_replicas: Some(1),
                available_replicas: Some(1),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn plan(publish: Side, waiting_for: Option<Side>) -> Plan {
        Plan {
            publish,
            switched: false,
            switched_at: None,
            waiting_for,
            maintenance_replicas: 1,
            requeue_after: None,
        }
    }

    #[test]
    fn published_and_ready() {
        let d = ready_deployment();
        let s = build(
            &mp(false),
            &plan(Side::App, None),
            Some(&d),
            None,
            jiff::Timestamp::UNIX_EPOCH,
        );
        assert!(is_true(&s.conditions, READY));
        assert!(!is_true(&s.conditions, PROGRESSING));
        assert_eq!(s.published, Some(Side::App));
        assert_eq!(s.observed_generation, Some(4));
        assert!(s.conditions.iter().all(|c| c.observed_generation == Some(4)));
    }

    #[test]
    fn switching_is_not_ready_and_says_what_it_waits_for() {
        let d = ready_deployment();
        let s = build(
            &mp(true),
            &plan(Side::App, Some(Side::Maintenance)),
            Some(&d),
            None,
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
    }

    #[test]
    fn a_conflict_blocks_with_its_reason() {
        let s = blocked(
            &mp(false),
            "NameConflict",
            "Deployment shop exists",
            jiff::Timestamp::UNIX_EPOCH,
        );
        assert!(is_true(&s.conditions, DEGRADED));
        assert!(!is_true(&s.conditions, READY));
        assert_eq!(s.conditions[0].reason, "NameConflict");
    }
}
