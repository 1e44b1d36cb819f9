//! Whether a Deployment or a StatefulSet has rolled out what it was asked for: every replica of
//! the current spec running and Ready. Controllers switch traffic, move to the next member or
//! report Ready only on these answers.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;

/// Whether the Deployment runs `replicas` Ready pods of its current spec (and its controller
/// has seen that spec).
pub fn deployment_rolled_out(deployment: Option<&Deployment>, replicas: i32) -> bool {
    let Some(d) = deployment else { return false };
    let Some(status) = &d.status else { return false };
    let spec_replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let current = status.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0);
    replicas > 0
        && spec_replicas == replicas
        && current
        && status.updated_replicas.unwrap_or(0) == replicas
        && status.ready_replicas.unwrap_or(0) >= replicas
        && status.available_replicas.unwrap_or(0) >= replicas
        && status.unavailable_replicas.unwrap_or(0) == 0
}

/// The image of a Deployment's (first) container.
pub fn image_of(d: &Deployment) -> Option<&str> {
    d.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .image
        .as_deref()
}

/// Ready pods of a Deployment.
pub fn deployment_ready_replicas(deployment: Option<&Deployment>) -> i32 {
    deployment
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
}

/// The message of a Deployment whose rollout has stalled (its Progressing condition is False,
/// past its progress deadline), if it has.
pub fn deployment_stalled(deployment: Option<&Deployment>) -> Option<String> {
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

/// Whether the StatefulSet runs `replicas` Ready pods, all of its current revision (and its
/// controller has seen its current spec).
pub fn statefulset_rolled_out(statefulset: Option<&StatefulSet>, replicas: i32) -> bool {
    let Some(s) = statefulset else { return false };
    let Some(status) = &s.status else { return false };
    let spec_replicas = s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let current = status.observed_generation.unwrap_or(0) >= s.metadata.generation.unwrap_or(0);
    let one_revision = status.update_revision.is_none() || status.current_revision == status.update_revision;
    spec_replicas == replicas
        && current
        && one_revision
        && status.replicas == replicas
        && status.updated_replicas.unwrap_or(0) == replicas
        && status.ready_replicas.unwrap_or(0) >= replicas
}

/// The label a StatefulSet gives each pod: the revision of the template it was made from.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// The revision every pod of the StatefulSet should run: its update revision, once its
/// controller has seen its current spec (before, the revision it says is the old spec's).
pub fn statefulset_update_revision(statefulset: &StatefulSet) -> Option<&str> {
    let status = statefulset.status.as_ref()?;
    let seen = status.observed_generation? >= statefulset.metadata.generation?;
    seen.then_some(status.update_revision.as_deref()?)
}

/// Whether `pod` (of a StatefulSet) was made from revision `revision`.
pub fn runs_revision(pod: &Pod, revision: &str) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(REVISION_LABEL))
        .map(String::as_str)
        == Some(revision)
}

/// Ready pods of a StatefulSet.
pub fn statefulset_ready_replicas(statefulset: Option<&StatefulSet>) -> i32 {
    statefulset
        .and_then(|s| s.status.as_ref())
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fixtures;

    #[test]
    fn a_deployment_is_rolled_out_with_every_pod_of_its_spec_ready() {
        assert!(!deployment_rolled_out(None, 1));
        let unseen = fixtures::deployment("web").replicas(2).generation(3).build();
        assert!(!deployment_rolled_out(Some(&unseen), 2), "no status yet");
        let ready = fixtures::deployment("web").replicas(2).generation(3).ready(2).build();
        assert!(deployment_rolled_out(Some(&ready), 2));
        assert!(
            !deployment_rolled_out(Some(&ready), 3),
            "spec replicas differ from what is asked"
        );
        let mut stale = ready.clone();
        stale.status.as_mut().unwrap().observed_generation = Some(2);
        assert!(
            !deployment_rolled_out(Some(&stale), 2),
            "controller has not seen the spec"
        );
        let half = fixtures::deployment("web").replicas(2).ready(1).build();
        assert!(!deployment_rolled_out(Some(&half), 2));
        assert_eq!(deployment_ready_replicas(Some(&half)), 1);
    }

    #[test]
    fn a_stalled_deployment_says_why() {
        let stalled = fixtures::deployment("web")
            .stalled("ReplicaSet \"web-1\" has timed out progressing.")
            .build();
        assert_eq!(
            deployment_stalled(Some(&stalled)).as_deref(),
            Some("ReplicaSet \"web-1\" has timed out progressing.")
        );
        assert_eq!(
            deployment_stalled(Some(&fixtures::deployment("web").ready(1).build())),
            None
        );
    }

    #[test]
    fn a_statefulset_is_rolled_out_with_every_pod_ready_on_one_revision() {
        assert!(!statefulset_rolled_out(None, 3));
        let ready = fixtures::statefulset("etcd").replicas(3).generation(2).ready(3).build();
        assert!(statefulset_rolled_out(Some(&ready), 3));
        assert_eq!(statefulset_ready_replicas(Some(&ready)), 3);
        let rolling = fixtures::statefulset("etcd")
            .replicas(3)
            .ready(3)
            .revisions("etcd-1", "etcd-2")
            .build();
        assert!(
            !statefulset_rolled_out(Some(&rolling), 3),
            "a revision is still rolling"
        );
        let short = fixtures::statefulset("etcd").replicas(3).ready(2).build();
        assert!(!statefulset_rolled_out(Some(&short), 3));
    }

    #[test]
    fn the_update_revision_counts_once_the_controller_has_seen_the_spec() {
        let seen = fixtures::statefulset("pg")
            .generation(2)
            .ready(3)
            .revisions("pg-1", "pg-2")
            .build();
        assert_eq!(statefulset_update_revision(&seen), Some("pg-2"));
        let mut unseen = seen.clone();
        unseen.metadata.generation = Some(3);
        assert_eq!(
            statefulset_update_revision(&unseen),
            None,
            "the revision is the old spec's"
        );
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "pg-0", "labels": { REVISION_LABEL: "pg-1" } },
        }))
        .unwrap();
        assert!(runs_revision(&pod, "pg-1") && !runs_revision(&pod, "pg-2"));
    }
}
