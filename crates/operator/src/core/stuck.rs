//! Whether pods cannot start, and why. A Deployment says so only when its progress
//! deadline passes (minutes); the pods say it at once: an image that cannot be pulled (or, on
//! the local Kubernetes, is not mapped), a crash loop, a missing Secret, no node to run on
//! (once the scheduler has said so for [`UNSCHEDULABLE_PATIENCE`]). Pure.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition};

/// How long the scheduler may say a pod has no node before that counts as stuck. Its first
/// word can be older than what it needs: a claim made a moment before the pod is "not found"
/// until the scheduler's cache has it, and the scheduler tries again by itself.
pub const UNSCHEDULABLE_PATIENCE: Duration = Duration::from_secs(10);

/// Why the pods of a side cannot start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stuck {
    /// The reason the pod reports (`ImagePullBackOff`, `CrashLoopBackOff`, `Unschedulable`, ...).
    pub reason: &'static str,
    /// Which pod and container, and what the pod says.
    pub message: String,
}

/// Waiting reasons of a container that will not start without a change to the spec or the
/// cluster. `ContainerCreating` and `PodInitializing` are not among them: they pass.
const STUCK_WAITING: [&str; 8] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ImageNotMapped",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// The first problem found among `pods` (by pod name) at `now`, if any. Pods being deleted are
/// left out.
pub fn stuck<'a>(pods: impl IntoIterator<Item = &'a Pod>, now: jiff::Timestamp) -> Option<Stuck> {
    let mut pods: Vec<&Pod> = pods
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    pods.into_iter().find_map(|p| pod_stuck(p, now))
}

/// How soon a pod of `pods` that the scheduler has not placed yet counts as stuck, if one
/// will: a controller that otherwise waits for a change looks again then.
pub fn recheck_after<'a>(pods: impl IntoIterator<Item = &'a Pod>, now: jiff::Timestamp) -> Option<Duration> {
    pods.into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| unschedulable(p).map(|c| UNSCHEDULABLE_PATIENCE.saturating_sub(unschedulable_for(p, c, now))))
        .filter(|left| !left.is_zero())
        .min()
}

/// The scheduler's "no node for it" condition of `pod`, if it says so.
fn unschedulable(pod: &Pod) -> Option<&PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
}

/// How long the scheduler has said so (since the condition changed, else since the pod was made).
fn unschedulable_for(pod: &Pod, condition: &PodCondition, now: jiff::Timestamp) -> Duration {
    let since = condition
        .last_transition_time
        .as_ref()
        .or(pod.metadata.creation_timestamp.as_ref())
        .map_or(jiff::Timestamp::UNIX_EPOCH, |t| t.0);
    Duration::try_from(now.duration_since(since)).unwrap_or_default()
}

fn pod_stuck(pod: &Pod, now: jiff::Timestamp) -> Option<Stuck> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let status = pod.status.as_ref()?;
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    for container in containers {
        let Some(waiting) = container.state.as_ref().and_then(|s| s.waiting.as_ref()) else {
            continue;
        };
        let said = waiting.reason.as_deref().unwrap_or_default();
        if let Some(reason) = STUCK_WAITING.into_iter().find(|r| *r == said) {
            let message = waiting.message.as_deref().unwrap_or(reason);
            return Some(Stuck {
                reason,
                message: format!("pod {name}, container {}: {message}", container.name),
            });
        }
    }
    let condition = unschedulable(pod).filter(|c| unschedulable_for(pod, c, now) >= UNSCHEDULABLE_PATIENCE)?;
    Some(Stuck {
        reason: "Unschedulable",
        message: format!(
            "pod {name}: {}",
            condition.message.as_deref().unwrap_or("no node can run it")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateWaiting, ContainerStatus, PodStatus};

    fn at(second: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(second).unwrap()
    }

    fn pod(name: &str, waiting: Option<(&str, &str)>) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.status = Some(PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                name: "maintenance".into(),
                state: Some(ContainerState {
                    waiting: waiting.map(|(reason, message)| ContainerStateWaiting {
                        reason: Some(reason.into()),
                        message: Some(message.into()),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        });
        pod
    }

    #[test]
    fn images_that_cannot_run_and_crash_loops_are_stuck_creating_is_not() {
        for reason in [
            "ImagePullBackOff",
            "ErrImagePull",
            "ImageNotMapped",
            "CrashLoopBackOff",
            "CreateContainerConfigError",
        ] {
            let found = stuck([&pod("page-1", Some((reason, "it says why")))], at(0)).unwrap();
            assert_eq!(found.reason, reason);
            assert_eq!(found.message, "pod page-1, container maintenance: it says why");
        }
        assert_eq!(stuck([&pod("page-1", Some(("ContainerCreating", "")))], at(0)), None);
        assert_eq!(stuck([&pod("page-1", None)], at(0)), None, "running");
        assert_eq!(stuck([], at(0)), None);
    }

    #[test]
    fn the_first_stuck_pod_by_name_is_reported_and_deleted_pods_are_not() {
        let a = pod("page-a", Some(("ImageNotMapped", "not mapped")));
        let b = pod("page-b", Some(("CrashLoopBackOff", "back-off")));
        assert_eq!(stuck([&b, &a], at(0)).unwrap().reason, "ImageNotMapped");
        let mut leaving = a.clone();
        leaving.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::UNIX_EPOCH,
        ));
        assert_eq!(stuck([&leaving, &b], at(0)).unwrap().reason, "CrashLoopBackOff");
    }

    #[test]
    fn a_pod_no_node_can_run_is_stuck_once_the_scheduler_has_said_so_for_a_while() {
        let mut p = pod("page-1", None);
        p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some("0/3 nodes are available".into()),
            last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(100))),
            ..Default::default()
        }]);
        // Its claim made a moment before: the scheduler's first word may be behind.
        assert_eq!(stuck([&p], at(101)), None);
        assert_eq!(
            recheck_after([&p], at(101)),
            Some(UNSCHEDULABLE_PATIENCE - Duration::from_secs(1))
        );
        let found = stuck([&p], at(110)).unwrap();
        assert_eq!(
            (found.reason, found.message.as_str()),
            ("Unschedulable", "pod page-1: 0/3 nodes are available")
        );
        assert_eq!(recheck_after([&p], at(110)), None, "said already");
    }
}
