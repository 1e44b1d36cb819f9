//! When a machine counts as unhealthy (Cluster API's MachineHealthCheck, kept on the set): its
//! VM is gone or stopped, its Node has been NotReady (or gone) for `unhealthyTimeoutSeconds`,
//! or it has not joined `startupTimeoutSeconds` after it was made. And how many may be
//! repaired at once (`maxUnhealthy`). Pure.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use noops_api::machine::{Machine, MachinePhase};
use noops_api::machine_set::HealthCheckSpec;

use crate::machine::status::NODE_HEALTHY;

/// Why `machine` is unhealthy at `now`, or `None`. A machine being deleted, or one that waits
/// for its control plane (Pending), is not judged.
pub fn unhealthy(machine: &Machine, check: &HealthCheckSpec, now: jiff::Timestamp) -> Option<String> {
    if machine.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = machine.status.as_ref()?;
    match status.phase? {
        MachinePhase::Failed => {
            return Some(format!(
                "{}: {}",
                status.failure_reason.clone().unwrap_or_default(),
                status.failure_message.clone().unwrap_or_default()
            ));
        }
        MachinePhase::Pending | MachinePhase::Deleting => return None,
        _ => {}
    }
    if status.node_joined_at.is_none() {
        let made = machine.metadata.creation_timestamp.as_ref()?.0;
        let limit = jiff::SignedDuration::from_secs(check.startup_timeout_seconds);
        return (now >= made + limit).then(|| {
            format!(
                "its Node has not joined within startupTimeoutSeconds ({}s)",
                check.startup_timeout_seconds
            )
        });
    }
    let health = status.conditions.iter().find(|c| c.type_ == NODE_HEALTHY)?;
    let limit = jiff::SignedDuration::from_secs(check.unhealthy_timeout_seconds);
    (health.status == "False" && now >= health.last_transition_time.0 + limit).then(|| {
        format!(
            "{} for more than unhealthyTimeoutSeconds ({}s): {}",
            health.reason, check.unhealthy_timeout_seconds, health.message
        )
    })
}

/// `value` (a number, or a percentage of `total`) as a number: percentages rounded up or down.
pub fn scaled(value: &IntOrString, total: i32, round_up: bool) -> i32 {
    match value {
        IntOrString::Int(n) => (*n).max(0),
        IntOrString::String(s) => {
            let percent: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            let product = percent.clamp(0, 100) * i64::from(total.max(0));
            let scaled = if round_up { (product + 99) / 100 } else { product / 100 };
            i32::try_from(scaled).unwrap_or(i32::MAX)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::fixtures::machine;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use noops_api::machine::MachineStatus;

    fn running(node_healthy: &str, since_seconds: i64, now: jiff::Timestamp) -> Machine {
        let mut m = machine("m", "c", "1.34");
        m.status = Some(MachineStatus {
            phase: Some(MachinePhase::Running),
            node_joined_at: Some(Time(now - jiff::SignedDuration::from_secs(3600))),
            conditions: vec![Condition {
                type_: NODE_HEALTHY.into(),
                status: node_healthy.into(),
                reason: "NodeNotReady".into(),
                message: "Kubelet stopped posting node status.".into(),
                observed_generation: None,
                last_transition_time: Time(now - jiff::SignedDuration::from_secs(since_seconds)),
            }],
            ..Default::default()
        });
        m
    }

    #[test]
    fn a_node_not_ready_past_the_timeout_a_gone_vm_and_a_slow_start_are_unhealthy() {
        let now = jiff::Timestamp::now();
        let check = HealthCheckSpec {
            unhealthy_timeout_seconds: 60,
            ..Default::default()
        };
        assert_eq!(unhealthy(&running("True", 600, now), &check, now), None);
        assert_eq!(
            unhealthy(&running("False", 30, now), &check, now),
            None,
            "not for long enough"
        );
        let why = unhealthy(&running("False", 61, now), &check, now).unwrap();
        assert!(
            why.contains("NodeNotReady for more than unhealthyTimeoutSeconds (60s)"),
            "{why}"
        );
        let mut failed = running("True", 0, now);
        failed.status.as_mut().unwrap().phase = Some(MachinePhase::Failed);
        failed.status.as_mut().unwrap().failure_reason = Some("VmGone".into());
        assert!(unhealthy(&failed, &check, now).unwrap().starts_with("VmGone"));
        let mut slow = running("False", 0, now);
        slow.status.as_mut().unwrap().node_joined_at = None;
        slow.status.as_mut().unwrap().phase = Some(MachinePhase::Provisioning);
        assert_eq!(unhealthy(&slow, &check, now), None, "made a minute ago, 600 s allowed");
        let late = now + jiff::SignedDuration::from_secs(600);
        assert!(unhealthy(&slow, &check, late).unwrap().contains("has not joined"));
        let mut deleting = running("False", 600, now);
        deleting.metadata.deletion_timestamp = Some(Time(now));
        assert_eq!(unhealthy(&deleting, &check, now), None);
    }

    #[test]
    fn percentages_scale_with_the_set() {
        assert_eq!(scaled(&IntOrString::String("40%".into()), 2, true), 1);
        assert_eq!(scaled(&IntOrString::String("40%".into()), 5, true), 2);
        assert_eq!(scaled(&IntOrString::String("25%".into()), 3, false), 0);
        assert_eq!(scaled(&IntOrString::String("100%".into()), 3, false), 3);
        assert_eq!(scaled(&IntOrString::Int(2), 10, true), 2);
    }
}
