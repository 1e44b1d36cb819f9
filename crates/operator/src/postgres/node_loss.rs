//! A node that dies with the instance on it. Kubernetes evicts the pod, but the pod object
//! stays (no kubelet confirms it stopped), and a StatefulSet makes no replacement while it is
//! there; with the volume on that node's disk, a replacement could not use it anyway. Decided<PostgreSQLReason>
//! here, pure, from the pod, its node and its volume:
//!
//! - a pod evicted from a node that is not Ready, `STUCK_AFTER` after it was asked to go, is
//!   **force deleted**: its node cannot stop it, and waiting for its termination grace period
//!   (a minute, for a fast shutdown of a live server) changes nothing on a dead node;
//! - if its volume is on that node's disk, the volume is **given up** first, but only when a
//!   backup can restore the database elsewhere (the plan names one, and the backups are not on
//!   the same node): the next pod starts on another node with an empty volume and restores the
//!   newest base backup and the archived WAL, losing only what was not archived yet;
//! - a database that never served (no system identifier recorded: the node died during its
//!   first `initdb`) has nothing on its volume to lose: the volume is **given up** too, and the
//!   next pod makes the database anew on another node;
//! - without such a backup, the instance **waits for the node** (giving up the volume would lose
//!   the database), and says so.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};

use crate::core::nodes::{pinned_node, ready};

/// How long after it was asked to go a pod on a node that is not Ready counts as stuck there.
pub const STUCK_AFTER: Duration = Duration::from_secs(15);

/// What to do about the instance's node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeLoss {
    /// Nothing: the node is there, or the pod is not stuck on it.
    Fine,
    /// The pod is stuck on node `node`, whose disk does not hold its volume: delete it.
    ForceDelete { node: String },
    /// The pod and its volume are on dead node `node`: give up the volume (a backup restores
    /// the database elsewhere), then delete the pod.
    GiveUpVolume { node: String },
    /// The pod and its volume are on dead node `node`, and nothing can restore the database
    /// elsewhere: wait for the node, and say why.
    WaitForNode { node: String, why: String },
}

/// Whether `pod` is being deleted and is still there `STUCK_AFTER` after it was asked to go
/// (its deletion deadline less its grace period).
pub fn stuck_in_deletion(pod: &Pod, now: jiff::Timestamp) -> bool {
    let Some(deadline) = pod.metadata.deletion_timestamp.as_ref() else {
        return false;
    };
    let grace = jiff::SignedDuration::from_secs(pod.metadata.deletion_grace_period_seconds.unwrap_or(0));
    let asked = deadline.0.checked_sub(grace).unwrap_or(deadline.0);
    now > asked && crate::core::backup::schedule::elapsed(asked, now) >= STUCK_AFTER
}

/// Whether volume `pv` lives on node `node` only (a local volume: its node affinity names it).
pub fn pinned_to(pv: &PersistentVolume, node: &str) -> bool {
    pinned_node(pv).as_deref() == Some(node)
}

/// How the database can come back on another node, once its volume is given up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Elsewhere {
    /// Restored from this base backup and the WAL archived since.
    Restore(String),
    /// InDatabase anew by `initdb`: it never served, so its volume holds nothing to lose.
    NewDatabase,
}

/// What to do, given the instance's pod, its node (None: the Node object is gone), its data
/// volume, and how the database can come back elsewhere (`elsewhere`, or why it cannot).
pub fn decide(
    pod: &Pod,
    node: Option<&Node>,
    volume: Option<&PersistentVolume>,
    elsewhere: Result<&Elsewhere, &str>,
    now: jiff::Timestamp,
) -> NodeLoss {
    let Some(name) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return NodeLoss::Fine;
    };
    if node.is_some_and(ready) || !stuck_in_deletion(pod, now) {
        return NodeLoss::Fine;
    }
    if !volume.is_some_and(|pv| pinned_to(pv, &name)) {
        return NodeLoss::ForceDelete { node: name };
    }
    match elsewhere {
        Ok(_) => NodeLoss::GiveUpVolume { node: name },
        Err(why) => NodeLoss::WaitForNode {
            node: name,
            why: why.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(seconds).unwrap()
    }

    /// A pod asked to go at `deleted_at`, with a 60 s grace period.
    fn pod(deleted_at: Option<i64>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "shop-0", "deletionTimestamp": deleted_at.map(|t| at(t + 60)),
                          "deletionGracePeriodSeconds": 60 },
            "spec": { "nodeName": "node-2", "containers": [] },
        }))
        .unwrap()
    }

    fn node(ready: bool) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "node-2" },
            "status": { "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "Unknown" } }] },
        }))
        .unwrap()
    }

    fn local_volume(on: &str) -> PersistentVolume {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "pvc-1" },
            "spec": { "nodeAffinity": { "required": { "nodeSelectorTerms": [{ "matchExpressions": [
                { "key": "kubernetes.io/hostname", "operator": "In", "values": [on] }
            ] }] } } },
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_evicted_from_a_dead_node_with_its_local_volume_is_restored_elsewhere_only_with_a_backup() {
        let stuck = pod(Some(100));
        let later = at(100 + 16);
        let volume = local_volume("node-2");
        assert_eq!(
            decide(
                &stuck,
                Some(&node(false)),
                Some(&volume),
                Ok(&Elsewhere::Restore("shop-1".into())),
                later
            ),
            NodeLoss::GiveUpVolume { node: "node-2".into() }
        );
        assert_eq!(
            decide(&stuck, Some(&node(false)), Some(&volume), Err("no backup"), later),
            NodeLoss::WaitForNode {
                node: "node-2".into(),
                why: "no backup".into()
            }
        );
        assert_eq!(
            decide(
                &stuck,
                None,
                Some(&volume),
                Ok(&Elsewhere::Restore("shop-1".into())),
                later
            ),
            NodeLoss::GiveUpVolume { node: "node-2".into() },
            "a Node object deleted is a dead node"
        );
        assert_eq!(
            decide(
                &stuck,
                Some(&node(false)),
                Some(&volume),
                Ok(&Elsewhere::NewDatabase),
                later
            ),
            NodeLoss::GiveUpVolume { node: "node-2".into() },
            "a database that never served is made anew elsewhere"
        );
    }

    #[test]
    fn a_volume_elsewhere_only_needs_the_pod_deleted() {
        let stuck = pod(Some(100));
        let elsewhere = local_volume("node-1");
        assert_eq!(
            decide(&stuck, Some(&node(false)), Some(&elsewhere), Err("no backup"), at(120)),
            NodeLoss::ForceDelete { node: "node-2".into() }
        );
    }

    #[test]
    fn nothing_is_done_while_the_node_is_ready_or_the_pod_is_within_its_deadline() {
        let volume = local_volume("node-2");
        assert_eq!(
            decide(
                &pod(Some(100)),
                Some(&node(true)),
                Some(&volume),
                Ok(&Elsewhere::NewDatabase),
                at(200)
            ),
            NodeLoss::Fine
        );
        assert_eq!(
            decide(
                &pod(Some(100)),
                Some(&node(false)),
                Some(&volume),
                Ok(&Elsewhere::NewDatabase),
                at(110)
            ),
            NodeLoss::Fine
        );
        assert_eq!(
            decide(
                &pod(None),
                Some(&node(false)),
                Some(&volume),
                Ok(&Elsewhere::NewDatabase),
                at(200)
            ),
            NodeLoss::Fine
        );
    }
}
