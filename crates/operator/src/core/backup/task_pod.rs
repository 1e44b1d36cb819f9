//! Short-lived pods that do one job for a controller (save a snapshot, take a base backup,
//! delete a backup) and report how it went in their termination message: their names, what
//! every one of them is, how one stands, and how to remove one. Pure.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::DeleteParams;

use crate::core::pod_security::runtime_default_seccomp;
use crate::core::stuck::stuck;

/// The name of the pod that does `job` for `owner` (uid `uid`): `<owner>-<job>`, shortened
/// with the uid's start when that is too long for a pod.
pub fn name(owner: &str, uid: &str, job: &str) -> String {
    if owner.len() + job.len() < 253 {
        return format!("{owner}-{job}");
    }
    let uid: String = uid.chars().take(8).collect();
    let head: String = owner.chars().take(253 - job.len() - uid.len() - 2).collect();
    format!("{}-{uid}-{job}", head.trim_end_matches(['-', '.']))
}

/// Where a task pod is and whose it is.
pub struct Owned<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub labels: std::collections::BTreeMap<String, String>,
    pub owner: &'a OwnerReference,
}

/// A task pod running `spec`: owned by the object it works for (it goes with it), run once
/// (never restarted: a failure is read and a fresh pod made), without Service links or an API
/// token (it never calls the API), its volumes' files given to its security context's
/// `fsGroup` only when they are not its already, under the runtime's default seccomp profile
/// (`core::pod_security`).
pub fn build(owned: Owned, mut spec: PodSpec) -> Pod {
    spec.restart_policy = Some("Never".into());
    spec.enable_service_links = Some(false);
    spec.automount_service_account_token = Some(false);
    let security = spec.security_context.get_or_insert_with(Default::default);
    if security.fs_group.is_some() {
        security.fs_group_change_policy = Some("OnRootMismatch".into());
    }
    security.seccomp_profile = runtime_default_seccomp();
    Pod {
        metadata: ObjectMeta {
            name: Some(owned.name.into()),
            namespace: Some(owned.namespace.into()),
            labels: Some(owned.labels),
            owner_references: Some(vec![owned.owner.clone()]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// How a task pod stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    NotStarted,
    Running,
    /// It cannot start (the claim or a Secret missing, no node for it): why.
    Stuck(String),
    /// It did its work; its termination message.
    Succeeded(String),
    /// It failed: why, as it said.
    Failed(String),
}

/// How `pod` (if any) stands.
pub fn outcome(pod: Option<&Pod>, now: jiff::Timestamp) -> Outcome {
    let Some(pod) = pod else { return Outcome::NotStarted };
    let status = pod.status.clone().unwrap_or_default();
    let terminated = status
        .container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref().and_then(|s| s.terminated.clone()));
    let message = terminated.as_ref().and_then(|t| t.message.clone()).unwrap_or_default();
    match status.phase.as_deref() {
        Some("Succeeded") => Outcome::Succeeded(message.trim().to_string()),
        Some("Failed") => {
            let name = pod.metadata.name.clone().unwrap_or_default();
            Outcome::Failed(match terminated {
                Some(t) if !message.trim().is_empty() => {
                    format!("pod {name} exited with code {}: {}", t.exit_code, message.trim())
                }
                Some(t) => format!(
                    "pod {name} exited with code {}: `kubectl logs {name}` says why",
                    t.exit_code
                ),
                // Evicted, or its node lost: the pod says why, not a container.
                None => format!(
                    "pod {name} failed: {} {}",
                    status.reason.as_deref().unwrap_or("Failed"),
                    status.message.as_deref().unwrap_or_default()
                )
                .trim()
                .to_string(),
            })
        }
        // Deleted before it ended: evicted from a node that died, or deleted by hand. It will
        // not report, and a pod on a dead node never goes by itself.
        _ if pod.metadata.deletion_timestamp.is_some() => {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let why = status
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
                .map(|c| c.message.clone().or(c.reason.clone()).unwrap_or_default());
            Outcome::Failed(match (why, pod.spec.as_ref().and_then(|s| s.node_name.clone())) {
                (Some(why), Some(node)) => format!("pod {name} was deleted before it ended, on node {node}: {why}"),
                (Some(why), None) => format!("pod {name} was deleted before it ended: {why}"),
                (None, _) => format!("pod {name} was deleted before it ended"),
            })
        }
        _ => match stuck([pod], now) {
            Some(s) => Outcome::Stuck(format!("{}: {}", s.reason, s.message)),
            None => Outcome::Running,
        },
    }
}

/// How long past its grace period a pod being deleted may still be there before nobody is
/// taken to be honouring the deletion: its node is dead (no kubelet confirms the stop).
pub const ABANDONED_AFTER: Duration = Duration::from_secs(30);

/// How to delete `pod`: in the background, or at once (no grace) when an earlier deletion has
/// been left unhonoured past its grace period, as on a node that died. Otherwise the pod would
/// stay, and a new one of its name could never be made.
pub fn delete_params(pod: Option<&Pod>, now: jiff::Timestamp) -> DeleteParams {
    // A pod's deletion timestamp is the end of its grace period, not when it was asked to go.
    let abandoned = pod
        .and_then(|pod| pod.metadata.deletion_timestamp.as_ref())
        .is_some_and(|deadline| now > deadline.0 && super::schedule::elapsed(deadline.0, now) > ABANDONED_AFTER);
    if abandoned {
        DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::background()
        }
    } else {
        DeleteParams::background()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn evicted(at: jiff::Timestamp) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some("shop-1-base".into());
        pod.metadata.deletion_timestamp = Some(Time(at));
        pod.metadata.deletion_grace_period_seconds = Some(30);
        pod.spec = Some(PodSpec {
            node_name: Some("noops-node-2".into()),
            ..Default::default()
        });
        pod.status = Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "DisruptionTarget".into(),
                status: "True".into(),
                reason: Some("DeletionByTaintManager".into()),
                message: Some("Taint manager: deleting due to NoExecute taint".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        pod
    }

    #[test]
    fn a_pod_deleted_before_it_ended_has_failed_and_says_where_and_why() {
        let pod = evicted(jiff::Timestamp::now());
        assert_eq!(
            outcome(Some(&pod), jiff::Timestamp::UNIX_EPOCH),
            Outcome::Failed(
                "pod shop-1-base was deleted before it ended, on node noops-node-2: Taint manager: deleting due to NoExecute taint"
                    .into()
            )
        );
        let mut finished = pod.clone();
        if let Some(status) = finished.status.as_mut() {
            status.phase = Some("Succeeded".into());
        }
        assert_eq!(
            outcome(Some(&finished), jiff::Timestamp::UNIX_EPOCH),
            Outcome::Succeeded(String::new()),
            "it ended before"
        );
    }

    #[test]
    fn a_deletion_left_unhonoured_past_its_grace_is_forced() {
        let now = jiff::Timestamp::now();
        let gentle = |pod: Option<&Pod>, at| delete_params(pod, at).grace_period_seconds;
        assert_eq!(gentle(None, now), None);
        let pod = evicted(now);
        assert_eq!(gentle(Some(&pod), now), None, "its node has its grace period");
        let soon = now + jiff::SignedDuration::from_secs(29);
        assert_eq!(gentle(Some(&pod), soon), None, "its node may be slow to confirm");
        let later = now + jiff::SignedDuration::from_secs(31);
        assert_eq!(gentle(Some(&pod), later), Some(0), "nobody honours it: forced");
        let mut running = pod.clone();
        running.metadata.deletion_timestamp = None;
        assert_eq!(gentle(Some(&running), later), None, "not deleted yet: deleted gently");
    }
}
