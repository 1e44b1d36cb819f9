//! The status of a Machine, from what its provider and its tenant say. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use noops_api::condition::{DEGRADED, PROGRESSING, READY};
use noops_api::machine::MachineReason;
use noops_api::machine::{Machine, MachinePhase, MachineStatus};

use super::drain::DrainProgress;
use super::plan::{Admission, NodeView, phase};
use super::provider::VmState;
use crate::core::conditions::{Decided, merge, with_paused};

/// How long a drain may wait on PodDisruptionBudgets before the machine counts as degraded:
/// long enough for a budget to let pods go one after another as their replacements start,
/// short enough that a budget that allows nothing is raised while someone still watches.
pub const DRAIN_HELD_AFTER: jiff::SignedDuration = jiff::SignedDuration::from_mins(5);

/// How long after its Node joined a machine whose Node was never Ready counts as starting.
pub const STARTING_AT_MOST: jiff::SignedDuration = jiff::SignedDuration::from_mins(10);

/// Degraded's reason for a drain held past [`DRAIN_HELD_AFTER`] (see the API's).
pub use noops_api::machine::DRAIN_HELD;

/// The machine's Node is Ready (False: why not, and since when).
pub const NODE_HEALTHY: &str = "NodeHealthy";
/// The drain of a machine being deleted: False names the pods that hold it.
pub const DRAINING_SUCCEEDED: &str = "DrainingSucceeded";

/// Where the deletion of a machine is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deletion {
    /// Draining its Node.
    Draining(DrainProgress),
    /// Its Node cannot be drained: the tenant does not answer (why).
    TenantUnreachable(String),
    /// Drained (or nothing to drain); the Node and the VM are being removed.
    Removing,
    /// Drained by deleting these pods without eviction: the Node could not be reached past
    /// `nodeDrainTimeoutSeconds`.
    DrainedWithoutEviction(Vec<String>),
}

/// What the status is built from.
pub struct StatusFacts<'a> {
    pub machine: &'a Machine,
    pub admission: &'a Admission,
    pub vm: &'a VmState,
    pub node: &'a NodeView,
    /// Set while the machine is being deleted.
    pub deletion: Option<&'a Deletion>,
}

/// The status the machine should have now.
pub fn build(facts: &StatusFacts, now: jiff::Timestamp) -> MachineStatus {
    let machine = facts.machine;
    let previous = machine.status.clone().unwrap_or_default();
    let joined = previous.node_joined_at.is_some();
    let provider_id_set = machine.spec.provider_id.is_some();
    let phase = match facts.deletion {
        Some(_) => MachinePhase::Deleting,
        None => phase(facts.admission, provider_id_set, joined, facts.vm, facts.node),
    };
    let node = facts.node.node();
    let node_name = node
        .and_then(|n| n.metadata.name.clone())
        .or(previous.node_name.clone());
    let address = node
        .and_then(|n| {
            n.status
                .as_ref()?
                .addresses
                .as_ref()?
                .iter()
                .find(|a| a.type_ == "InternalIP")
                .map(|a| a.address.clone())
        })
        .or_else(|| match facts.vm {
            VmState::Running { address } => address.clone(),
            _ => None,
        })
        .or(previous.address.clone());
    let version = node
        .and_then(|n| {
            n.status
                .as_ref()?
                .node_info
                .as_ref()
                .map(|i| i.kubelet_version.trim_start_matches('v').to_string())
        })
        .or(previous.version.clone());
    let node_joined_at = previous.node_joined_at.clone().or_else(|| node.map(|_| Time(now)));
    let (failure_reason, failure_message) = match (phase, facts.vm) {
        (MachinePhase::Failed, VmState::Failed { reason, message }) => (Some(reason.clone()), Some(message.clone())),
        (MachinePhase::Failed, _) => (
            Some("VmGone".to_string()),
            Some(
                "the machine's VM is gone (its pod was deleted or its node lost); its disk and pods went with it"
                    .to_string(),
            ),
        ),
        _ => (None, None),
    };
    let decided = conditions(facts, phase, joined, now);
    MachineStatus {
        observed_generation: machine.metadata.generation,
        conditions: merge(
            &previous.conditions,
            &with_paused(&decided, machine.spec.paused),
            machine.metadata.generation,
            now,
        ),
        phase: Some(phase),
        node_name,
        address,
        version,
        failure_reason,
        failure_message,
        drain_started_at: previous.drain_started_at,
        node_joined_at,
    }
}

/// A machine whose Node has joined but was never Ready: still starting, not degraded. Known
/// from the machine's own Ready condition, which is True once the Node was Ready and keeps the
/// reason `NodeNotReady` when it went NotReady after that.
fn node_starting(facts: &StatusFacts, phase: MachinePhase, node_ready: bool, now: jiff::Timestamp) -> bool {
    let previous = facts.machine.status.as_ref();
    let previous_ready = previous.and_then(|s| s.conditions.iter().find(|c| c.type_ == READY));
    let was_ready = previous_ready.is_some_and(|c| c.status == "True" || c.reason == "NodeNotReady");
    // A Node never Ready long after it joined is not starting any more: it is degraded.
    let joined_long_ago = previous
        .and_then(|s| s.node_joined_at.as_ref())
        .is_some_and(|at| now.duration_since(at.0) >= STARTING_AT_MOST);
    phase == MachinePhase::Running
        && !node_ready
        && matches!(facts.node, NodeView::Present(_))
        && !was_ready
        && !joined_long_ago
}

fn conditions(
    facts: &StatusFacts,
    phase: MachinePhase,
    joined: bool,
    now: jiff::Timestamp,
) -> Vec<Decided<MachineReason>> {
    let mut decided = Vec::new();
    let node_ready = facts.node.ready();
    let vm_problem = match facts.vm {
        VmState::Starting {
            problem: Some((reason, message)),
        } => Some(format!("the VM cannot start: {reason}: {message}")),
        _ => None,
    };
    let starting = node_starting(facts, phase, node_ready, now);
    let not_ready = if starting {
        Some((
            MachineReason::NodeStarting,
            format!("its Node joined and is getting Ready: {}", node_not_ready(facts.node)),
        ))
    } else {
        why_not_ready(facts, phase, node_ready, vm_problem.clone())
    };
    decided.push(match &not_ready {
        None => Decided::new(READY, true, MachineReason::NodeReady, "its Node is Ready"),
        Some((reason, message)) => Decided::new(READY, false, *reason, message.clone()),
    });
    decided.extend(node_health(facts, node_ready, joined));
    let progressing = starting
        || matches!(
            phase,
            MachinePhase::Provisioning | MachinePhase::Provisioned | MachinePhase::Deleting
        );
    decided.push(Decided::new(
        PROGRESSING,
        progressing,
        match phase {
            MachinePhase::Deleting => MachineReason::Deleting,
            MachinePhase::Provisioning | MachinePhase::Provisioned => MachineReason::Provisioning,
            MachinePhase::Running if starting => MachineReason::NodeStarting,
            MachinePhase::Running => MachineReason::Provisioned,
            MachinePhase::Failed => MachineReason::MachineFailed,
            MachinePhase::Pending => MachineReason::Pending,
        },
        match phase {
            MachinePhase::Running if !starting => "the machine joined its cluster".to_string(),
            _ => not_ready.as_ref().map(|(_, m)| m.clone()).unwrap_or_default(),
        },
    ));
    let degraded: Option<(MachineReason, String)> = match (phase, facts.admission) {
        _ if drain_held(facts, now).is_some() => drain_held(facts, now),
        (MachinePhase::Failed, _) => Some((
            MachineReason::MachineFailed,
            "the machine's VM is gone or stopped".into(),
        )),
        (MachinePhase::Pending, Admission::Refused(reason, message)) => Some((*reason, message.clone())),
        _ if vm_problem.is_some() => Some((MachineReason::VmCannotStart, vm_problem.clone().unwrap_or_default())),
        (MachinePhase::Running, _) if !starting && !node_ready && matches!(facts.node, NodeView::Present(_)) => {
            Some((MachineReason::NodeNotReady, node_not_ready(facts.node)))
        }
        _ => None,
    };
    decided.push(match degraded {
        Some((reason, message)) => Decided::new(DEGRADED, true, reason, message),
        None => Decided::new(DEGRADED, false, MachineReason::AsExpected, "nothing is wrong"),
    });
    decided.extend(draining(facts));
    decided
}

/// Why the machine is not Ready, as (reason, message); `None` when it is.
fn why_not_ready(
    facts: &StatusFacts,
    phase: MachinePhase,
    node_ready: bool,
    vm_problem: Option<String>,
) -> Option<(MachineReason, String)> {
    match (phase, facts.admission) {
        (MachinePhase::Deleting, _) => Some((
            MachineReason::Deleting,
            "the machine is being drained and removed".into(),
        )),
        (MachinePhase::Failed, _) => Some((
            MachineReason::MachineFailed,
            "the machine's VM is gone or stopped; its MachineSet replaces it".into(),
        )),
        (MachinePhase::Pending, Admission::Refused(reason, message)) => Some((*reason, message.clone())),
        (MachinePhase::Pending, Admission::Waiting(reason, message)) => Some((*reason, message.clone())),
        _ if vm_problem.is_some() => Some((MachineReason::VmCannotStart, vm_problem.unwrap_or_default())),
        (MachinePhase::Pending | MachinePhase::Provisioning, _) => {
            Some((MachineReason::Provisioning, "its VM is being made".into()))
        }
        (MachinePhase::Provisioned, _) => Some((
            MachineReason::NodeNotJoined,
            "its VM runs; its Node has not joined yet".into(),
        )),
        (MachinePhase::Running, _) if node_ready => None,
        (MachinePhase::Running, _) => Some((MachineReason::NodeNotReady, node_not_ready(facts.node))),
    }
}

/// Node health, as the MachineSet's health check reads it. A tenant that does not answer says
/// nothing new: the condition stays as it was.
fn node_health(facts: &StatusFacts, node_ready: bool, joined: bool) -> Option<Decided<MachineReason>> {
    match facts.node {
        NodeView::Present(_) if node_ready => Some(Decided::new(
            NODE_HEALTHY,
            true,
            MachineReason::NodeReady,
            "its Node is Ready",
        )),
        NodeView::Present(_) => Some(Decided::new(
            NODE_HEALTHY,
            false,
            MachineReason::NodeNotReady,
            node_not_ready(facts.node),
        )),
        NodeView::Missing if joined => Some(Decided::new(
            NODE_HEALTHY,
            false,
            MachineReason::NodeGone,
            "its Node was deleted from the cluster",
        )),
        NodeView::Missing => Some(Decided::new(
            NODE_HEALTHY,
            false,
            MachineReason::NodeNotJoined,
            "its Node has not joined yet",
        )),
        NodeView::NotAsked | NodeView::Unreachable(_) => None,
    }
}

/// A drain that PodDisruptionBudgets have held past [`DRAIN_HELD_AFTER`]: (reason, message
/// naming the pods and their budgets).
fn drain_held(facts: &StatusFacts, now: jiff::Timestamp) -> Option<(MachineReason, String)> {
    let Some(Deletion::Draining(progress)) = facts.deletion else {
        return None;
    };
    let status = facts.machine.status.as_ref()?;
    let started = status.drain_started_at.as_ref()?.0;
    // Once said, said until the drain ends: a budget that lets pods go one at a time
    // alternates between holding and not, and the condition would flap with it.
    let said = status
        .conditions
        .iter()
        .find(|c| c.type_ == DEGRADED && c.status == "True" && c.reason == DRAIN_HELD);
    if progress.blocked.is_empty() {
        return said.map(|c| (MachineReason::DrainHeld, c.message.clone()));
    }
    (now.duration_since(started) >= DRAIN_HELD_AFTER).then(|| {
        (
            MachineReason::DrainHeld,
            format!(
                "its drain, begun at {}, has waited more than {} min: a PodDisruptionBudget keeps {} on the Node",
                started.strftime("%Y-%m-%dT%H:%M:%SZ"),
                DRAIN_HELD_AFTER.as_mins(),
                progress.blocked.join(", ")
            ),
        )
    })
}

/// The drain of a machine being deleted.
fn draining(facts: &StatusFacts) -> Vec<Decided<MachineReason>> {
    let mut decided = Vec::new();
    if let Some(deletion) = facts.deletion {
        decided.push(match deletion {
            Deletion::Draining(p) if !p.blocked.is_empty() => Decided::new(
                DRAINING_SUCCEEDED,
                false,
                MachineReason::EvictionBlocked,
                format!("a PodDisruptionBudget keeps {} on the Node for now; asked again until it allows them to go", p.blocked.join(", ")),
            ),
            Deletion::Draining(p) => Decided::new(
                DRAINING_SUCCEEDED,
                false,
                MachineReason::Draining,
                format!("waiting for {} evicted pod(s) to end: {}", p.ending.len(), p.ending.join(", ")),
            ),
            Deletion::TenantUnreachable(why) => Decided::new(
                DRAINING_SUCCEEDED,
                false,
                MachineReason::ClusterUnreachable,
                format!("the cluster does not answer ({why}); the VM is removed after nodeDrainTimeoutSeconds without a drain"),
            ),
            Deletion::DrainedWithoutEviction(pods) => Decided::new(
                DRAINING_SUCCEEDED,
                true,
                MachineReason::DrainedWithoutEviction,
                format!(
                    "the Node could not be reached past nodeDrainTimeoutSeconds: {} deleted without eviction",
                    pods.join(", ")
                ),
            ),
            Deletion::Removing => Decided::new(DRAINING_SUCCEEDED, true, MachineReason::Drained, "nothing but DaemonSet pods is left on the Node"),
        });
        // A drain finished by deletion says so until the machine is gone.
        let previous = facts
            .machine
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        if matches!(deletion, Deletion::Removing)
            && previous
                .iter()
                .any(|c| c.type_ == DRAINING_SUCCEEDED && c.reason == "DrainedWithoutEviction")
        {
            decided.pop();
        }
    }
    decided
}

/// Why the Node is not Ready, from its own Ready condition.
fn node_not_ready(node: &NodeView) -> String {
    let ready = node.node().and_then(|n| {
        n.status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == "Ready")
            .cloned()
    });
    match ready {
        Some(c) => format!(
            "its Node is {} Ready ({}): {}",
            if c.status == "Unknown" {
                "not known to be"
            } else {
                "not"
            },
            c.reason.unwrap_or_default(),
            c.message.unwrap_or_default()
        ),
        None => "its Node reports no Ready condition yet".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control_plane::versions::Release;
    use crate::machine::fixtures::machine;
    use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};

    fn node(ready: &str) -> NodeView {
        let mut n = Node::default();
        n.metadata.name = Some("m".into());
        n.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                reason: Some("NodeStatusUnknown".into()),
                message: Some("Kubelet stopped posting node status.".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        NodeView::Present(Box::new(n))
    }

    fn condition<'a>(status: &'a MachineStatus, type_: &str) -> (&'a str, &'a str, &'a str) {
        let c = status.conditions.iter().find(|c| c.type_ == type_).unwrap();
        (c.status.as_str(), c.reason.as_str(), c.message.as_str())
    }

    #[test]
    fn a_machine_is_ready_when_its_node_is_and_says_why_not_otherwise() {
        let mut m = machine("m", "team-a", "1.34");
        m.spec.provider_id = Some("noops://tenants/m".into());
        let allowed = Admission::Allowed(Release::of("1.34").unwrap());
        let running = VmState::Running {
            address: Some("10.244.1.9".into()),
        };
        let now = jiff::Timestamp::now();
        let facts = |node| StatusFacts {
            machine: &m,
            admission: &allowed,
            vm: &running,
            node,
            deletion: None,
        };
        let (ready_node, lost_node, missing) = (node("True"), node("Unknown"), NodeView::Missing);
        let ready = build(&facts(&ready_node), now);
        assert_eq!(ready.phase, Some(MachinePhase::Running));
        assert_eq!(condition(&ready, READY).0, "True");
        assert_eq!(condition(&ready, NODE_HEALTHY).0, "True");
        assert!(ready.node_joined_at.is_some());
        assert_eq!(
            ready.address.as_deref(),
            Some("10.244.1.9"),
            "the VM's until the Node says"
        );

        // A Node that joined and is not Ready yet: the machine is starting, not degraded (a
        // cluster being made raises no Warning for it).
        let starting = build(&facts(&lost_node), now);
        assert_eq!(condition(&starting, READY).1, "NodeStarting");
        assert_eq!(condition(&starting, PROGRESSING).0, "True");
        assert_eq!(condition(&starting, DEGRADED).0, "False");
        assert_eq!(
            condition(&starting, NODE_HEALTHY).1,
            "NodeNotReady",
            "the health check still counts it"
        );
        // Never Ready long after it joined: no longer starting, degraded.
        let mut stuck = m.clone();
        stuck.status = Some(MachineStatus {
            node_joined_at: Some(Time(now - STARTING_AT_MOST)),
            ..starting.clone()
        });
        let stuck = build(
            &StatusFacts {
                machine: &stuck,
                ..facts(&lost_node)
            },
            now,
        );
        assert_eq!(condition(&stuck, DEGRADED).0, "True");
        assert_eq!(condition(&stuck, DEGRADED).1, "NodeNotReady");

        // Once Ready, a Node that goes NotReady is a degraded machine, pass after pass.
        let mut was_ready = m.clone();
        was_ready.status = Some(ready.clone());
        let lost = build(
            &StatusFacts {
                machine: &was_ready,
                ..facts(&lost_node)
            },
            now,
        );
        let (status, reason, message) = condition(&lost, NODE_HEALTHY);
        assert_eq!((status, reason), ("False", "NodeNotReady"));
        assert!(message.contains("not known to be Ready"), "{message}");
        assert_eq!(condition(&lost, DEGRADED).0, "True");
        assert_eq!(condition(&lost, READY).1, "NodeNotReady");
        let mut still_lost = m.clone();
        still_lost.status = Some(lost);
        let again = build(
            &StatusFacts {
                machine: &still_lost,
                ..facts(&lost_node)
            },
            now,
        );
        assert_eq!(condition(&again, DEGRADED).0, "True");
        assert_eq!(condition(&again, PROGRESSING).0, "False");

        let joining = build(&facts(&missing), now);
        assert_eq!(joining.phase, Some(MachinePhase::Provisioned));
        assert_eq!(condition(&joining, NODE_HEALTHY).1, "NodeNotJoined");
    }

    #[test]
    fn a_refused_machine_is_pending_and_degraded_and_a_blocked_drain_names_its_pods() {
        let m = machine("m", "team-a", "1.35");
        let refused = Admission::Refused(MachineReason::VersionTooNew, "version 1.35.0 is newer".into());
        let now = jiff::Timestamp::now();
        let status = build(
            &StatusFacts {
                machine: &m,
                admission: &refused,
                vm: &VmState::Missing,
                node: &NodeView::NotAsked,
                deletion: None,
            },
            now,
        );
        assert_eq!(status.phase, Some(MachinePhase::Pending));
        assert_eq!(condition(&status, READY).1, "VersionTooNew");
        assert_eq!(
            condition(&status, DEGRADED),
            ("True", "VersionTooNew", "version 1.35.0 is newer")
        );

        let blocked = Deletion::Draining(DrainProgress {
            blocked: vec!["shop/web-1".into()],
            ..Default::default()
        });
        let status = build(
            &StatusFacts {
                machine: &m,
                admission: &refused,
                vm: &VmState::Running { address: None },
                node: &node("True"),
                deletion: Some(&blocked),
            },
            now,
        );
        assert_eq!(status.phase, Some(MachinePhase::Deleting));
        let (s, reason, message) = condition(&status, DRAINING_SUCCEEDED);
        assert_eq!((s, reason), ("False", "EvictionBlocked"));
        assert!(message.contains("shop/web-1"), "{message}");
        assert_eq!(
            condition(&status, DEGRADED).0,
            "False",
            "a drain just begun waits quietly"
        );
        // Held past the bound, the machine is degraded: its MachineSet, deployment and
        // cluster pass that up, so a blocked drain is told from a slow one.
        let mut held = m.clone();
        held.status = Some(MachineStatus {
            drain_started_at: Some(Time(now - DRAIN_HELD_AFTER - jiff::SignedDuration::from_secs(60))),
            ..status.clone()
        });
        let status = build(
            &StatusFacts {
                machine: &held,
                admission: &refused,
                vm: &VmState::Running { address: None },
                node: &node("True"),
                deletion: Some(&blocked),
            },
            now,
        );
        let (s, reason, message) = condition(&status, DEGRADED);
        assert_eq!((s, reason), ("True", "DrainHeld"));
        assert!(
            message.contains("more than 5 min") && message.contains("shop/web-1"),
            "{message}"
        );
        // Between two evictions the budget holds nothing for a moment: still said, unchanged.
        let mut between = held.clone();
        between.status = Some(status.clone());
        let evicting = Deletion::Draining(DrainProgress {
            ending: vec!["shop/web-1".into()],
            ..Default::default()
        });
        let later = build(
            &StatusFacts {
                machine: &between,
                admission: &refused,
                vm: &VmState::Running { address: None },
                node: &node("True"),
                deletion: Some(&evicting),
            },
            now + jiff::SignedDuration::from_secs(90),
        );
        assert_eq!(condition(&later, DEGRADED), condition(&status, DEGRADED));

        // A Node that could not be reached: its pods deleted, and the status keeps saying so.
        let forced = Deletion::DrainedWithoutEviction(vec!["shop/web-2".into()]);
        let mut m = m.clone();
        m.status = Some(build(
            &StatusFacts {
                machine: &m,
                admission: &refused,
                vm: &VmState::Running { address: None },
                node: &node("Unknown"),
                deletion: Some(&forced),
            },
            now,
        ));
        let later = build(
            &StatusFacts {
                machine: &m,
                admission: &refused,
                vm: &VmState::Running { address: None },
                node: &NodeView::Missing,
                deletion: Some(&Deletion::Removing),
            },
            now,
        );
        let (s, reason, message) = condition(&later, DRAINING_SUCCEEDED);
        assert_eq!((s, reason), ("True", "DrainedWithoutEviction"));
        assert!(message.contains("shop/web-2 deleted without eviction"), "{message}");
    }
}
