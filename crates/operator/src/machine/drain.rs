//! Draining a Node before its machine goes, as `kubectl drain` does: every pod that is not a
//! DaemonSet's or a static pod is evicted through the Eviction API, so PodDisruptionBudgets
//! hold; an eviction a budget refuses (429) is asked again on the next pass, and the pods it
//! keeps are named in the Machine's `DrainingSucceeded` condition. Only a Node that cannot be
//! reached (its agent silent: the pods may be gone with it) past `nodeDrainTimeoutSeconds` has
//! its pods deleted without eviction, and the status says so.

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, EvictParams, ListParams};
use tracing::info;

use crate::core::Result;

/// What a pass of a drain leaves.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DrainProgress {
    /// Pods a PodDisruptionBudget keeps on the Node for now: `namespace/name`, and the budget
    /// with what it needs when the API server said (`namespace/name (budget web needs 1
    /// healthy pods and has 1)`).
    pub blocked: Vec<String>,
    /// Pods evicted or deleted that have not ended yet.
    pub ending: Vec<String>,
    /// Pods deleted without eviction (the Node could not be reached past the timeout).
    pub forced: Vec<String>,
}

impl DrainProgress {
    /// Whether nothing but DaemonSet and static pods is left.
    pub fn done(&self) -> bool {
        self.blocked.is_empty() && self.ending.is_empty()
    }
}

/// What the drain does with one pod. Pure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodFate {
    /// Left where it is: a DaemonSet's pod (its controller would put it back) or a static pod.
    Stays,
    /// Ended already (Succeeded or Failed): nothing runs.
    Ended,
    /// Being deleted: wait for it.
    Ending,
    /// To be evicted.
    Evict,
}

/// A DaemonSet's pod (its controller would put it back) or a static (mirror) pod: one that
/// stays with its node rather than moving elsewhere. Pure.
pub fn stays_with_its_node(pod: &Pod) -> bool {
    let owned_by_daemon_set = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet" && o.controller == Some(true));
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    owned_by_daemon_set || mirror
}

/// What the drain does with `pod`. Pure.
pub fn fate(pod: &Pod) -> PodFate {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if stays_with_its_node(pod) {
        PodFate::Stays
    } else if matches!(phase, Some("Succeeded") | Some("Failed")) {
        PodFate::Ended
    } else if pod.metadata.deletion_timestamp.is_some() {
        PodFate::Ending
    } else {
        PodFate::Evict
    }
}

fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// `pod` and the budget that refused its eviction, as the API server names it in the refusal's
/// causes ("The disruption budget web needs 1 healthy pods and has 1 currently"). Pure.
fn held_by(pod: &str, refusal: &kube::core::Status) -> String {
    let budget = refusal
        .details
        .as_ref()
        .and_then(|d| d.causes.iter().find(|c| c.reason == "DisruptionBudget"))
        .map(|c| {
            c.message
                .trim_start_matches("The disruption budget ")
                .trim_end_matches(" currently")
                .to_string()
        });
    match budget {
        Some(budget) => format!("{pod} (budget {budget})"),
        None => pod.to_string(),
    }
}

/// One pass of the drain of Node `node`: evicts what may go (or, with `force`, deletes it).
pub async fn drain_pass(client: &Client, node: &str, force: bool) -> Result<DrainProgress> {
    // The tenant's pods on the node, as its API server has them now: each is evicted on this
    // word.
    let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let pods = crate::core::confirm::list(&Api::<Pod>::all(client.clone()), &on_node, "pods-before-eviction").await?;
    let mut progress = DrainProgress::default();
    for pod in pods.items {
        let (namespace, name) = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        match fate(&pod) {
            PodFate::Stays => {}
            // An ended pod or one being deleted on a Node that cannot be reached would wait for
            // an agent that is gone: it is removed outright.
            PodFate::Ended | PodFate::Ending if force => {
                let _ = api.delete(&name, &DeleteParams::default().grace_period(0)).await;
                progress.forced.push(key(&pod));
            }
            PodFate::Ended => {}
            PodFate::Ending => progress.ending.push(key(&pod)),
            PodFate::Evict if force => {
                info!(pod = %key(&pod), node, "deleting a pod without eviction: its node cannot be reached past the drain timeout");
                match api.delete(&name, &DeleteParams::default().grace_period(0)).await {
                    Ok(_) => progress.forced.push(key(&pod)),
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            PodFate::Evict => match api.evict(&name, &EvictParams::default()).await {
                Ok(_) => {
                    info!(pod = %key(&pod), node, "evicted");
                    progress.ending.push(key(&pod));
                }
                // A PodDisruptionBudget allows no disruption now.
                Err(kube::Error::Api(e)) if e.code == 429 => progress.blocked.push(held_by(&key(&pod), &e)),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            },
        }
    }
    Ok(progress)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

    fn pod(owner: Option<&str>, phase: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("p".into());
        p.metadata.owner_references = owner.map(|kind| {
            vec![OwnerReference {
                kind: kind.into(),
                controller: Some(true),
                ..Default::default()
            }]
        });
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        p
    }

    #[test]
    fn daemon_set_and_static_pods_stay_the_rest_is_evicted() {
        assert_eq!(fate(&pod(Some("ReplicaSet"), "Running")), PodFate::Evict);
        assert_eq!(fate(&pod(None, "Pending")), PodFate::Evict, "a bare pod goes too");
        assert_eq!(fate(&pod(Some("DaemonSet"), "Running")), PodFate::Stays);
        let mut mirror = pod(None, "Running");
        mirror.metadata.annotations = Some([("kubernetes.io/config.mirror".to_string(), "x".to_string())].into());
        assert_eq!(fate(&mirror), PodFate::Stays);
        assert_eq!(fate(&pod(Some("Job"), "Succeeded")), PodFate::Ended);
        let mut leaving = pod(Some("ReplicaSet"), "Running");
        leaving.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
        assert_eq!(fate(&leaving), PodFate::Ending);
        assert!(DrainProgress::default().done());
        let blocked = DrainProgress {
            blocked: vec!["a/b".into()],
            ..Default::default()
        };
        assert!(!blocked.done());
    }

    #[test]
    fn a_refused_eviction_names_its_budget() {
        // What kube-apiserver answers an eviction a budget refuses.
        let refusal: kube::core::Status = serde_json::from_value(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 429,
            "reason": "TooManyRequests",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "details": { "causes": [{
                "reason": "DisruptionBudget",
                "message": "The disruption budget web needs 1 healthy pods and has 1 currently"
            }]}
        }))
        .unwrap();
        assert_eq!(
            held_by("shop/web-1", &refusal),
            "shop/web-1 (budget web needs 1 healthy pods and has 1)"
        );
        let bare = kube::core::Status::failure("too many requests", "TooManyRequests");
        assert_eq!(held_by("shop/web-1", &bare), "shop/web-1");
    }
}
