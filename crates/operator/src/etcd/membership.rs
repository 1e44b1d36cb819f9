//! The next membership step: pure, one change at a time, following etcd's own rules.
//!
//! - A new cluster starts from one member; every other member joins as a **learner** (added to
//!   etcd before its pod exists, started with `initial-cluster-state=existing`), and is
//!   **promoted** once it has caught up. A voting member is never added directly.
//! - A member that is gone for good (its volume lost, its node lost, unhealthy past the grace
//!   period) is **removed first**, then the scaling rule adds its successor under a new name:
//!   its old volume is never reused under a stale identity.
//! - A member whose pod is gone while its volume is there comes back on that volume, as
//!   itself, **with or without a quorum**: starting it needs no membership call, and it is how a
//!   lost quorum comes back. Every such member is started at once. A pod loss never shrinks the
//!   cluster, and a member's unhealthy time counts afresh from its new pod.
//! - Scaling up or down happens only while every voting member is healthy; on scale down, the
//!   member goes from etcd (leadership moved away first if it leads) before its pod and volume.
//! - Every change is written to the status before it is made ([`Operation`]), and carried on
//!   from the status after a restart: each sub-step checks what is already done.
//! - Nothing is removed if the remaining voters could not form a quorum; a cluster that has
//!   lost its quorum is reported (saying whether waiting can bring it back, or only a recovery
//!   from a backup can), never "repaired" by bootstrapping over live volumes.

use std::time::Duration;

use noops_api::etcd::EtcdClusterReason;
use noops_api::etcd::{Operation, OperationKind};

use super::names::{RECOVER_ANNOTATION, index_order};
use super::restore::Restore;

/// How long a member may be unhealthy (its process crashing, its node gone) before it is
/// replaced.
pub const UNHEALTHY_GRACE: Duration = Duration::from_secs(30);
/// How long a member's pod fails to pull its image before the image is taken to be missing
/// (a registry that throttles or blinks recovers within it).
pub const IMAGE_PULL_PATIENCE: Duration = Duration::from_secs(60);
/// How long a learner may take to start and catch up before it is given up.
pub const LEARNER_DEADLINE: Duration = Duration::from_secs(300);
/// How long voting members may be without a leader before the quorum counts as lost (a leader
/// election takes a second or two).
pub const QUORUM_GRACE: Duration = Duration::from_secs(10);
/// How long a pod being deleted by a live node is waited for before its member is judged by
/// its health alone.
pub const LEAVING_PATIENCE: Duration = Duration::from_secs(300);
/// How long after its pod was made a first member that answers with nothing committed counts
/// as a start cut short: a single member elects itself within seconds.
pub const EMPTY_START_PATIENCE: Duration = Duration::from_secs(45);
/// How long one member's upgrade (stop, start on the new version, become healthy) may take
/// before it is abandoned and the member is treated like any unhealthy one.
pub const UPGRADE_DEADLINE: Duration = Duration::from_secs(300);

/// A member's pod, as observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    Missing,
    /// Created, not Ready yet (scheduling, starting, restarting).
    Starting,
    Ready,
    /// Being deleted.
    Terminating,
    /// Being deleted, and well past the time its node should have stopped it: the node is gone
    /// or does not answer.
    Stuck,
}

/// What the planner knows about one member: from etcd's member list, its pod, its volume and
/// its health.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberFacts {
    pub name: String,
    /// Its etcd member ID, if etcd lists it.
    pub id: Option<u64>,
    pub learner: bool,
    pub healthy: bool,
    pub leader: bool,
    pub pod: PodState,
    /// Its volume exists (always true for ephemeral storage while the pod exists).
    pub volume: bool,
    /// How long it has been unhealthy, if it is.
    pub unhealthy_for: Option<Duration>,
    /// Its pod runs another version than the spec's (an upgrade is due).
    pub outdated: bool,
    /// Its database is to be defragmented (see `defrag.rs`).
    pub fragmented: bool,
    /// The image its pod has failed to get for [`IMAGE_PULL_PATIENCE`] (a tag the registry
    /// does not have), if it has.
    pub image_unavailable: Option<String>,
    /// The node its pod is bound to, or its volume pinned to, when that node is not Ready: the
    /// member cannot run until the node comes back.
    pub node_down: Option<String>,
    /// Its pod was made after it stopped being healthy: a pod made again, still starting.
    pub fresh_pod: bool,
    /// Its pod is being deleted by a node that is Ready (a node back after it was down, ending
    /// the pods evicted meanwhile), for at most [`LEAVING_PATIENCE`]: it is made again on its
    /// volume in a moment.
    pub leaving_live_node: bool,
    /// It answers, names no leader and has committed nothing (raft index 0) though its pod was
    /// made [`EMPTY_START_PATIENCE`] ago: holding nothing, it loses nothing if started anew.
    pub holds_nothing: bool,
    /// Its volume is being deleted (a member is not started on it again until it is gone).
    pub volume_leaving: bool,
}

impl MemberFacts {
    /// A healthy voting member `name` with ID `id`, its pod Ready on its volume (for tests).
    #[cfg(test)]
    pub fn fixture(name: &str, id: u64) -> Self {
        Self {
            name: name.into(),
            id: Some(id),
            learner: false,
            healthy: true,
            leader: false,
            pod: PodState::Ready,
            volume: true,
            unhealthy_for: None,
            outdated: false,
            fragmented: false,
            image_unavailable: None,
            node_down: None,
            fresh_pod: false,
            leaving_live_node: false,
            holds_nothing: false,
            volume_leaving: false,
        }
    }

    fn in_etcd(&self) -> bool {
        self.id.is_some()
    }

    fn voter(&self) -> bool {
        self.in_etcd() && !self.learner
    }

    /// Its data is still there: its volume (or, with ephemeral storage, its pod).
    fn has_data(&self, ephemeral: bool) -> bool {
        if ephemeral {
            self.pod != PodState::Missing
        } else {
            self.volume
        }
    }
}

/// Everything the planner knows about the cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterFacts {
    /// Voting members asked for.
    pub replicas: usize,
    /// The cluster ID is recorded: the cluster exists, and is never bootstrapped again.
    pub bootstrapped: bool,
    /// etcd's member list could be read (through a member that answered).
    pub reachable: bool,
    /// The member list came from the leader, so it holds every committed change (another
    /// member's list may lag behind).
    /// Where etcd is pulled from (an upgrade's image is `<this>:v<version>`).
    pub image_repository: String,
    pub listed_by_leader: bool,
    /// Members known from etcd, from their pods or volumes, or from the operation in progress.
    pub members: Vec<MemberFacts>,
    /// The operation in progress, from the status.
    pub operation: Option<Operation>,
    /// How long the operation has been going on.
    pub operation_age: Duration,
    /// The name the next new member gets.
    pub next_member: String,
    /// Data is kept in the pod only: a member whose pod is gone has lost its data.
    pub ephemeral: bool,
    /// The version members are to run, when changing to it is allowed (None while the spec's
    /// version is refused).
    pub upgrade_to: Option<String>,
    /// For a new cluster from a backup: how the restore into the first member stands.
    pub restore: Option<Restore>,
    /// Where the members' pods are, and which nodes could hold one.
    pub spread: super::spread::Spread,
    /// Now (an operation begun now starts at this time).
    pub now: jiff::Timestamp,
}

/// What to do now. One step per reconcile; the reconcile comes back to take the next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Record `operation` in the status (before anything is changed for it).
    Begin(Operation),
    /// Create the first member's volume and pod, starting a new cluster.
    StartFirstMember { member: String },
    /// Restore the backup into the first member's volume (a restore pod), before it starts.
    RestoreFirstMember { member: String },
    /// The backup to start from cannot be restored as things stand: say why, change nothing.
    RestoreBlocked { reason: EtcdClusterReason, message: String },
    /// The quorum is lost and a recovery from `backup` was asked for: the members (and their
    /// volumes) go, and the cluster starts again from the backup under a new cluster ID.
    RecoverFromBackup { backup: String },
    /// The first member answers: record the cluster ID and end the bootstrap.
    FinishBootstrap { member: String },
    /// The first member's start was cut short and left a data directory that can never form
    /// the cluster (it committed nothing): delete its pod and volume, so that it starts again.
    StartOver { member: String },
    /// Add `member` to etcd as a learner.
    AddLearner { member: String },
    /// Create the volume and pod of the member an operation is about (a learner just added, or
    /// a member being upgraded).
    StartMember { member: String },
    /// Make the pods of voting members whose pods are gone and whose volumes are there again,
    /// each on its own volume, as the member it was (no membership call: with or without a
    /// quorum).
    RestartMembers { members: Vec<String> },
    /// Promote the learner `member` to a voting member.
    Promote { member: String, id: u64 },
    /// Give up adding `member` (a learner that did not catch up in time): remove it from etcd
    /// if it is there, say why, and end the operation. Its pod and volume go as leftovers.
    GiveUp {
        member: String,
        id: Option<u64>,
        reason: String,
    },
    /// End the operation on `member` without finishing it, and say why: its data is gone, or
    /// it did not come back in time; the rules for lost and unhealthy members take over.
    Abandon { member: String, reason: String },
    /// Defragment `member`'s database.
    Defragment { member: String },
    /// Move leadership away from `from` to `to` (before `from` is removed).
    MoveLeader { from: u64, to: u64 },
    /// Remove `member` from etcd.
    RemoveFromEtcd { member: String, id: u64 },
    /// Delete the pod and volume of `member` (it is not, or no longer, in etcd).
    DeleteMember { member: String, force: bool },
    /// Delete the pod of `member`, not its volume, so that it starts again on another version.
    RestartMember { member: String },
    /// The image of `version` cannot be pulled for `member`, being upgraded to it: record the
    /// version as unavailable (refused from then on), then (once recorded) delete the pod, so
    /// that `member` starts again on the version it ran, on its untouched data.
    VersionUnavailable { member: String, version: String },
    /// `member` runs the new version and is healthy: check a read through it, then end the
    /// upgrade of this member.
    CheckUpgraded { member: String },
    /// The operation is complete: clear it from the status.
    Finish,
    /// Nothing to change now; look again later.
    Wait { reason: String },
    /// The cluster cannot make progress without a human: quorum is lost.
    QuorumLost { reason: String },
}

fn quorum(voters: usize) -> usize {
    voters / 2 + 1
}

fn operation(facts: &ClusterFacts, kind: OperationKind, member: &str, reason: &str) -> Step {
    Step::Begin(Operation {
        kind,
        member: member.to_string(),
        member_id: None,
        reason: reason.to_string(),
        version: None,
        node: None,
        started_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(facts.now),
    })
}

/// Decides the next step.
pub fn next_step(facts: &ClusterFacts) -> Step {
    let voters: Vec<&MemberFacts> = facts.members.iter().filter(|m| m.voter()).collect();
    let healthy_voters = voters.iter().filter(|m| m.healthy).count();
    let without_quorum = facts.bootstrapped && (!facts.reachable || healthy_voters < quorum(voters.len()));
    let in_progress = facts.operation.as_ref().map(|op| (op, continue_operation(facts, op)));
    // The member an operation is about is started by the operation itself.
    if let Some((_, step @ Step::StartMember { .. })) = &in_progress {
        return step.clone();
    }
    let bootstrapping = !facts.bootstrapped
        || facts
            .operation
            .as_ref()
            .is_some_and(|op| op.kind == OperationKind::Bootstrap);
    if !bootstrapping {
        let members = to_restart(facts, without_quorum);
        if !members.is_empty() {
            return Step::RestartMembers { members };
        }
    }
    if let Some((op, step)) = in_progress {
        // Without a quorum no membership call can succeed and no restart is safe: the
        // operation waits, and a quorum lost for good is reported even in its middle.
        return if without_quorum && op.kind != OperationKind::Bootstrap {
            no_quorum(facts, &voters, healthy_voters)
        } else {
            step
        };
    }
    if !facts.bootstrapped {
        return operation(facts, OperationKind::Bootstrap, &facts.next_member, "a new cluster");
    }
    if without_quorum {
        return no_quorum(facts, &voters, healthy_voters);
    }
    if !facts.listed_by_leader {
        // Another member's list may miss a member that just joined: deciding from it could
        // remove what is there.
        return Step::Wait {
            reason: "the leader has not answered; membership decisions wait for its member list".into(),
        };
    }
    if let Some(step) = repair(facts, &voters, healthy_voters) {
        return step;
    }
    change_asked(facts, &voters).unwrap_or_else(|| Step::Wait {
        reason: "the cluster is as asked".into(),
    })
}

/// A repair of the membership, if one is due: a member lost for good removed (its successor
/// is added by the scaling rule), what is left of an add or a removal that did not finish.
fn repair(facts: &ClusterFacts, voters: &[&MemberFacts], healthy_voters: usize) -> Option<Step> {
    // A member gone for good is removed first (its successor is added by the scaling rule).
    if let Some((m, why)) = facts
        .members
        .iter()
        .filter(|m| m.in_etcd())
        .find_map(|m| lost(m, facts.ephemeral).map(|why| (m, why)))
    {
        let voters_after = voters.len() - usize::from(m.voter());
        let healthy_after = healthy_voters - usize::from(m.voter() && m.healthy);
        if healthy_after < quorum(voters_after) {
            return Some(Step::Wait {
                reason: format!("{} is lost ({why}) but removing it now would leave no quorum", m.name),
            });
        }
        return Some(operation(facts, OperationKind::RemoveMember, &m.name, why));
    }
    // Pods and volumes of members etcd does not know (a removal or an add that did not
    // finish) go; pods already on their way out do not hold anything up.
    if let Some(step) = facts.members.iter().filter(|m| !m.in_etcd()).find_map(clean_up) {
        return Some(step);
    }
    // A learner that no operation covers is what is left of an add that did not finish: it
    // goes (learners do not vote, so this never touches the quorum).
    if let Some(m) = facts.members.iter().find(|m| m.in_etcd() && m.learner) {
        return Some(operation(
            facts,
            OperationKind::RemoveMember,
            &m.name,
            "a learner left over from an add that did not finish",
        ));
    }
    None
}

/// The change the spec asks for, if any: a version rolled one member at a time, a scale up or
/// down, members apart again, a defragmentation; each only while every member is healthy.
fn change_asked(facts: &ClusterFacts, voters: &[&MemberFacts]) -> Option<Step> {
    let all_healthy = facts
        .members
        .iter()
        .filter(|m| m.in_etcd())
        .all(|m| m.healthy && !m.learner);
    upgrade_step(facts, voters, all_healthy)
        .or_else(|| scale_step(facts, voters, all_healthy))
        .or_else(|| spread_step(facts, voters).filter(|_| all_healthy))
        .or_else(|| defragment_step(voters).filter(|_| all_healthy))
}

/// A version change rolls one member at a time, the leader last, before any scaling (new
/// members then join on the new version).
fn upgrade_step(facts: &ClusterFacts, voters: &[&MemberFacts], all_healthy: bool) -> Option<Step> {
    let version = facts.upgrade_to.as_ref()?;
    let m = leader_last(voters, |m| m.outdated)?;
    if !all_healthy {
        return Some(Step::Wait {
            reason: "upgrading waits until every member is healthy".into(),
        });
    }
    let mut step = operation(facts, OperationKind::Upgrade, &m.name, "upgrade");
    if let Step::Begin(op) = &mut step {
        op.version = Some(version.clone());
    }
    Some(step)
}

/// Fewer voters than asked for: one is added; more: one goes, a member of the most crowded
/// node (a member added to spread them ends the move here), else the newest member that does
/// not lead (there are at least two voters, one leads).
fn scale_step(facts: &ClusterFacts, voters: &[&MemberFacts], all_healthy: bool) -> Option<Step> {
    if voters.len() == facts.replicas {
        return None;
    }
    let up = voters.len() < facts.replicas;
    if !all_healthy {
        let reason = if up {
            "scaling up waits until every member is healthy"
        } else {
            "scaling down waits until every member is healthy"
        };
        return Some(Step::Wait { reason: reason.into() });
    }
    if up {
        return Some(operation(
            facts,
            OperationKind::AddMember,
            &facts.next_member,
            "scale up",
        ));
    }
    let names: Vec<&str> = voters.iter().map(|m| m.name.as_str()).collect();
    let leader = voters.iter().find(|m| m.leader).map(|m| m.name.as_str());
    if let Some(m) = facts.spread.crowded_member(&names, leader) {
        return Some(operation(
            facts,
            OperationKind::RemoveMember,
            &m,
            "scale down: a member of the node that holds the most",
        ));
    }
    let m = voters
        .iter()
        .filter(|m| !m.leader)
        .max_by(|a, b| index_order(&a.name, &b.name))?;
    Some(operation(facts, OperationKind::RemoveMember, &m.name, "scale down"))
}

/// Members apart again: a member is added on a node that holds two fewer than the most
/// crowded one (its pod must run there), then the scale-down rule gives up one of the crowded
/// node's: never fewer voters than asked for. One at a time.
fn spread_step(facts: &ClusterFacts, voters: &[&MemberFacts]) -> Option<Step> {
    if voters.len() != facts.replicas {
        return None;
    }
    let names: Vec<&str> = voters.iter().map(|m| m.name.as_str()).collect();
    let leader = voters.iter().find(|m| m.leader).map(|m| m.name.as_str());
    let (member, from, to) = facts.spread.member_to_move(&names, leader)?;
    let mut step = operation(
        facts,
        OperationKind::AddMember,
        &facts.next_member,
        &format!(
            "spread: {member} shares node {from} while {to} holds none; a member is added on {to}, then one of {from}'s goes"
        ),
    );
    if let Step::Begin(op) = &mut step {
        op.node = Some(to);
    }
    Some(step)
}

/// Defragmentation (the member being defragmented stops serving for a while): one at a time,
/// the leader last.
fn defragment_step(voters: &[&MemberFacts]) -> Option<Step> {
    let m = leader_last(voters, |m| m.fragmented)?;
    Some(Step::Defragment { member: m.name.clone() })
}

/// The next of the voters that `need` something done, one at a time: the lowest index first,
/// the leader last.
fn leader_last<'a>(voters: &[&'a MemberFacts], need: impl Fn(&MemberFacts) -> bool) -> Option<&'a MemberFacts> {
    let needing: Vec<&MemberFacts> = voters.iter().copied().filter(|m| need(m)).collect();
    needing
        .iter()
        .copied()
        .filter(|m| !m.leader)
        .min_by(|a, b| index_order(&a.name, &b.name))
        .or(needing.first().copied())
}

/// Voting members whose pods are gone while their data is on their volumes: they come back
/// as themselves. A member being removed comes back only while the quorum is lost (it may be
/// what brings the quorum back; with a quorum, its removal goes on).
fn to_restart(facts: &ClusterFacts, without_quorum: bool) -> Vec<String> {
    let removing = facts
        .operation
        .as_ref()
        .filter(|op| op.kind == OperationKind::RemoveMember && !without_quorum)
        .map(|op| op.member.as_str());
    facts
        .members
        .iter()
        .filter(|m| m.voter() && m.pod == PodState::Missing && m.volume && !facts.ephemeral)
        .filter(|m| Some(m.name.as_str()) != removing)
        .map(|m| m.name.clone())
        .collect()
}

/// Voting members that are not healthy and are coming back on their own data: their pod is
/// gone (to be made again), made again and starting, ending on a node that is back, or waiting
/// for the node that holds them (named) to come back. The status says it as `RestartingMembers`.
pub fn restarting(facts: &ClusterFacts) -> Vec<(&str, Option<&str>)> {
    facts
        .members
        .iter()
        .filter(|m| m.voter() && !m.healthy && m.has_data(facts.ephemeral))
        .filter(|m| {
            m.pod == PodState::Missing
                || (m.pod == PodState::Starting && m.fresh_pod)
                || m.node_down.is_some()
                || m.leaving_live_node
        })
        .map(|m| (m.name.as_str(), m.node_down.as_deref()))
        .collect()
}

/// [`restarting`] in words, if any member is coming back: who starts again, and who waits for
/// which node.
pub fn coming_back(facts: &ClusterFacts) -> Option<String> {
    let members = restarting(facts);
    let starting: Vec<&str> = members
        .iter()
        .filter(|(_, node)| node.is_none())
        .map(|(m, _)| *m)
        .collect();
    let mut parts = Vec::new();
    if !starting.is_empty() {
        parts.push(format!(
            "starting again, each on its own volume as the member it was: {}",
            listed(&starting)
        ));
    }
    parts.extend(members.iter().filter_map(|(m, node)| {
        Some(format!(
            "{m} waits for node {}, which holds it and is not Ready",
            (*node)?
        ))
    }));
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// Names in words: `a`, `a and b`, `a, b and c`.
pub fn listed(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => (*one).to_string(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// Without a quorum: briefly (an election) it waits; for longer it is reported, saying whether
/// waiting can bring the quorum back (enough members still have their data) or only a recovery
/// from a backup can.
fn no_quorum(facts: &ClusterFacts, voters: &[&MemberFacts], healthy_voters: usize) -> Step {
    // A member whose pod was made again has been without a leader since before that pod: its
    // fresh grace period is for its replacement, not for an election.
    let recently_healthy = voters
        .iter()
        .filter(|m| m.healthy || (m.unhealthy_for.is_some_and(|d| d < QUORUM_GRACE) && !m.fresh_pod))
        .count();
    if recently_healthy >= quorum(voters.len()) {
        return Step::Wait {
            reason: "no leader for a moment; waiting for an election".into(),
        };
    }
    Step::QuorumLost {
        reason: quorum_lost_message(facts, voters, healthy_voters),
    }
}

/// Why the quorum is lost, and whether waiting can bring it back (enough members keep their
/// data) or only a recovery from a backup can.
fn quorum_lost_message(facts: &ClusterFacts, voters: &[&MemberFacts], healthy_voters: usize) -> String {
    let needed = quorum(voters.len());
    let head = if facts.reachable {
        format!(
            "{healthy_voters} of {} voting members are healthy, fewer than the {needed} a quorum needs",
            voters.len()
        )
    } else {
        format!(
            "no member answers: none of the {} voting members has a quorum ({needed} needed)",
            voters.len()
        )
    };
    let data_gone: Vec<&str> = voters
        .iter()
        .filter(|m| !m.has_data(facts.ephemeral))
        .map(|m| m.name.as_str())
        .collect();
    let with_data = voters.len() - data_gone.len();
    if with_data < needed {
        let cause = if facts.ephemeral {
            "pod gone, and ephemeral storage with it"
        } else {
            "volume deleted"
        };
        return format!(
            "{head}. Waiting cannot bring it back: no data is left on {} ({cause}), and the {with_data} member(s) with data are too few for a quorum. \
             Only a recovery from a backup can, losing the writes made after that backup: annotate the cluster {RECOVER_ANNOTATION}=latest (or =<EtcdBackup name>)",
            listed(&data_gone)
        );
    }
    let back: Vec<&str> = restarting(facts).into_iter().map(|(m, _)| m).collect();
    let silent: Vec<&str> = voters
        .iter()
        .filter(|m| !m.healthy && m.has_data(facts.ephemeral) && !back.contains(&m.name.as_str()))
        .map(|m| m.name.as_str())
        .collect();
    let mut parts: Vec<String> = coming_back(facts).into_iter().collect();
    if !silent.is_empty() {
        parts.push(format!("running but not serving: {}", listed(&silent)));
    }
    if !data_gone.is_empty() {
        parts.push(format!(
            "data lost, replaced once the quorum is back: {}",
            listed(&data_gone)
        ));
    }
    format!(
        "{head}. Waiting can bring it back: {}; the quorum returns, with every acknowledged write, once {needed} of them run",
        parts.join("; ")
    )
}

/// What to do with the pod and volume of a member etcd does not know, if anything.
fn clean_up(m: &MemberFacts) -> Option<Step> {
    let delete = |force| Step::DeleteMember {
        member: m.name.clone(),
        force,
    };
    match m.pod {
        // Out of etcd, it holds nothing: a careful human deletes a pod its node never stops.
        PodState::Stuck => Some(delete(true)),
        PodState::Ready | PodState::Starting => Some(delete(false)),
        PodState::Missing | PodState::Terminating => m.volume.then(|| delete(false)),
    }
}

/// Why a member that etcd knows is gone for good, if it is.
fn lost(m: &MemberFacts, ephemeral: bool) -> Option<&'static str> {
    if ephemeral && m.pod == PodState::Missing {
        return Some("its pod is gone, and its data (ephemeral storage) with it");
    }
    if !ephemeral && !m.volume {
        return Some("its volume is gone, and its data with it");
    }
    // A member whose node is back is about to come back too: its pod ends, and is made again.
    if m.unhealthy_for.is_some_and(|d| d >= UNHEALTHY_GRACE) && !m.learner && !m.leaving_live_node {
        return Some("it has been unhealthy past the grace period");
    }
    None
}

fn continue_operation(facts: &ClusterFacts, op: &Operation) -> Step {
    let member = facts.members.iter().find(|m| m.name == op.member);
    match op.kind {
        // A recovery starts the cluster again: what is left of the old members (pods,
        // volumes) goes before the first new member starts, so none serves old data.
        OperationKind::Bootstrap
            if let Some(old) = facts.members.iter().find(|m| {
                m.name != op.member
                    && (m.volume || matches!(m.pod, PodState::Ready | PodState::Starting | PodState::Stuck))
            }) =>
        {
            Step::DeleteMember {
                member: old.name.clone(),
                force: false,
            }
        }
        OperationKind::Bootstrap => match member {
            Some(m) if m.healthy => Step::FinishBootstrap { member: m.name.clone() },
            // Its first start was cut short (its node died under it): etcd made the data
            // directory but never recorded the member in it, and then waits forever for
            // voters it does not know. Nothing was committed, so nothing is lost: it starts
            // again on a new volume. (Not a member restored from a backup: that one has data.)
            Some(m) if m.holds_nothing && facts.restore.is_none() && m.pod == PodState::Starting => {
                Step::StartOver { member: m.name.clone() }
            }
            Some(m) if m.pod != PodState::Missing => Step::Wait {
                reason: format!("{} is starting the cluster", m.name),
            },
            Some(m) if m.volume_leaving => Step::Wait {
                reason: format!("{}'s old volume is being deleted before it starts again", m.name),
            },
            _ => match &facts.restore {
                None | Some(Restore::Succeeded) => Step::StartFirstMember {
                    member: op.member.clone(),
                },
                Some(Restore::NotStarted) => Step::RestoreFirstMember {
                    member: op.member.clone(),
                },
                Some(Restore::Running) => Step::Wait {
                    reason: format!("restoring the backup into {}", op.member),
                },
                Some(Restore::Stuck { message }) => Step::RestoreBlocked {
                    reason: EtcdClusterReason::RestorePodStuck,
                    message: message.clone(),
                },
                Some(Restore::Blocked { reason, message }) => Step::RestoreBlocked {
                    reason: *reason,
                    message: message.clone(),
                },
                Some(Restore::Failed { message }) => Step::RestoreBlocked {
                    reason: EtcdClusterReason::RestoreFailed,
                    message: format!(
                        "{message}; the cluster is not started (delete it, and create it from a good backup)"
                    ),
                },
            },
        },
        OperationKind::AddMember => continue_add(facts, op, member),
        OperationKind::RemoveMember => continue_remove(facts, member),
        OperationKind::Upgrade => continue_upgrade(facts, op, member),
    }
}

fn continue_upgrade(facts: &ClusterFacts, op: &Operation, member: Option<&MemberFacts>) -> Step {
    let Some(m) = member.filter(|m| m.in_etcd()) else {
        // No longer a member (removed as lost meanwhile): nothing left to upgrade.
        return Step::Finish;
    };
    let version = op.version.as_deref().unwrap_or("the new version");
    // An image that cannot be pulled never started: the member's data is as the old version
    // left it, and it goes back to that version rather than waiting out the deadline and
    // being replaced (by a member that could not start either).
    if let (Some(missing), Some(version)) = (&m.image_unavailable, &op.version)
        && *missing == super::pod::image(&facts.image_repository, version)
    {
        return Step::VersionUnavailable {
            member: m.name.clone(),
            version: version.clone(),
        };
    }
    match m.pod {
        PodState::Missing if facts.ephemeral || !m.volume => {
            // Starting it again would bring it back under its old identity with an empty log.
            return Step::Abandon {
                member: m.name.clone(),
                reason: format!(
                    "{}'s data went with its pod or volume during its upgrade; it is replaced instead",
                    m.name
                ),
            };
        }
        PodState::Missing => return Step::StartMember { member: m.name.clone() },
        PodState::Terminating | PodState::Stuck => {
            return Step::Wait {
                reason: format!("{} is stopping, to start again on {version}", m.name),
            };
        }
        PodState::Ready | PodState::Starting => {}
    }
    // Still on the old version (and the spec still asks for a change): restart it, after
    // moving leadership away from it; only while every other voter is healthy, since the
    // restart takes it out for a moment.
    if m.outdated && facts.upgrade_to.is_some() {
        let others: Vec<&MemberFacts> = facts.members.iter().filter(|o| o.name != m.name && o.voter()).collect();
        if !facts.reachable || !facts.listed_by_leader || !others.iter().all(|o| o.healthy) {
            return Step::Wait {
                reason: format!("upgrading {} waits until every other member is healthy", m.name),
            };
        }
        if m.leader {
            let successor = others
                .iter()
                .filter(|o| !o.outdated)
                .min_by(|a, b| index_order(&a.name, &b.name))
                .or_else(|| others.first());
            if let (Some(from), Some(to)) = (m.id, successor.and_then(|s| s.id)) {
                return Step::MoveLeader { from, to };
            }
            // A single member has no one to hand over to: it restarts leading.
        }
        return Step::RestartMember { member: m.name.clone() };
    }
    if m.healthy && m.pod == PodState::Ready {
        return Step::CheckUpgraded { member: m.name.clone() };
    }
    if facts.operation_age >= UPGRADE_DEADLINE {
        return Step::Abandon {
            member: m.name.clone(),
            reason: format!(
                "{} did not become healthy on {version} within {}s; it is treated as an unhealthy member",
                m.name,
                UPGRADE_DEADLINE.as_secs()
            ),
        };
    }
    Step::Wait {
        reason: format!("{} is starting on {version}", m.name),
    }
}

fn continue_add(facts: &ClusterFacts, op: &Operation, member: Option<&MemberFacts>) -> Step {
    let Some(m) = member.filter(|m| m.in_etcd()) else {
        if !facts.reachable || (op.member_id.is_some() && !facts.listed_by_leader) {
            return Step::Wait {
                reason: format!("adding {} waits for the cluster to answer", op.member),
            };
        }
        if op.member_id.is_some() {
            // It was added once and is gone from etcd now (given up, and the status that
            // said so was not written): it is not added again under this operation.
            return Step::Abandon {
                member: op.member.clone(),
                reason: format!("{} was added to etcd, and is no longer there", op.member),
            };
        }
        return Step::AddLearner {
            member: op.member.clone(),
        };
    };
    let id = m.id.unwrap_or_default();
    if m.pod == PodState::Missing {
        return Step::StartMember { member: m.name.clone() };
    }
    if !m.learner {
        // A member that has just joined says it votes until it applies its own addition
        // (etcd builds its first view from --initial-cluster, where all vote): only the
        // leader's list tells a learner from a voter.
        if !facts.listed_by_leader {
            return Step::Wait {
                reason: format!("{} says it votes; waiting for the leader's member list", m.name),
            };
        }
        return if m.healthy {
            Step::Finish
        } else {
            Step::Wait {
                reason: format!("{} is a voting member; waiting for it to be healthy", m.name),
            }
        };
    }
    if facts.operation_age >= LEARNER_DEADLINE {
        // A learner that cannot catch up is given up, never promoted.
        return Step::GiveUp {
            member: m.name.clone(),
            id: Some(id),
            reason: format!(
                "learner {} did not start and catch up within {}s",
                m.name,
                LEARNER_DEADLINE.as_secs()
            ),
        };
    }
    if m.healthy {
        Step::Promote {
            member: m.name.clone(),
            id,
        }
    } else {
        Step::Wait {
            reason: format!("learner {} is starting and catching up", m.name),
        }
    }
}

fn continue_remove(facts: &ClusterFacts, member: Option<&MemberFacts>) -> Step {
    if let Some(m) = member.filter(|m| m.in_etcd()) {
        if !facts.reachable {
            return Step::Wait {
                reason: format!("removing {} waits for the cluster to answer", m.name),
            };
        }
        let id = m.id.unwrap_or_default();
        if m.leader {
            let successor = facts
                .members
                .iter()
                .filter(|o| o.name != m.name && o.voter() && o.healthy)
                .max_by(|a, b| index_order(&b.name, &a.name));
            return match successor.and_then(|s| s.id) {
                Some(to) => Step::MoveLeader { from: id, to },
                None => Step::Wait {
                    reason: format!("{} leads and no other member can take over yet", m.name),
                },
            };
        }
        return Step::RemoveFromEtcd {
            member: m.name.clone(),
            id,
        };
    }
    // Out of etcd: its pod and volume go; one already on its way out is left to finish (or,
    // stuck, to the clean-up of leftovers) while its successor joins.
    match member.and_then(clean_up) {
        Some(step) => step,
        None => Step::Finish,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, id: u64) -> MemberFacts {
        MemberFacts::fixture(name, id)
    }

    fn cluster(replicas: usize, members: Vec<MemberFacts>) -> ClusterFacts {
        ClusterFacts {
            replicas,
            bootstrapped: true,
            reachable: true,
            image_repository: crate::etcd::names::ETCD_REPOSITORY.into(),
            listed_by_leader: true,
            members,
            operation: None,
            operation_age: Duration::ZERO,
            next_member: "main-9".into(),
            ephemeral: false,
            upgrade_to: None,
            restore: None,
            spread: Default::default(),
            now: jiff::Timestamp::UNIX_EPOCH,
        }
    }

    fn three() -> Vec<MemberFacts> {
        let mut members = vec![member("main-0", 10), member("main-1", 11), member("main-2", 12)];
        members[0].leader = true;
        members
    }

    fn begun(step: &Step) -> (OperationKind, String) {
        match step {
            Step::Begin(op) => (op.kind, op.member.clone()),
            other => panic!("expected an operation to begin, got {other:?}"),
        }
    }

    fn with_op(mut c: ClusterFacts, kind: OperationKind, member: &str) -> ClusterFacts {
        c.operation = Some(Operation {
            kind,
            member: member.into(),
            member_id: None,
            reason: "test".into(),
            version: Some("3.6.16".into()),
            node: None,
            started_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        });
        c
    }

    #[test]
    fn a_member_beside_another_is_replaced_on_a_node_with_none_only_while_all_are_healthy() {
        let mut c = cluster(3, three());
        c.spread = crate::etcd::spread::Spread {
            members: [("main-0", "n1"), ("main-1", "n2"), ("main-2", "n2")]
                .into_iter()
                .map(|(m, n)| (m.to_string(), n.to_string()))
                .collect(),
            eligible: ["n1", "n2", "n3"].into_iter().map(String::from).collect(),
            settled: true,
        };
        // A member added first, on the node with none; the cluster never has fewer voters.
        let step = next_step(&c);
        assert_eq!(begun(&step), (OperationKind::AddMember, "main-9".into()));
        let Step::Begin(op) = step else { unreachable!() };
        assert_eq!(op.node.as_deref(), Some("n3"));
        // Once it is a voter, one of the crowded node's goes (not the leader).
        let mut four = c.clone();
        four.members.push(member("main-9", 19));
        four.spread.members.insert("main-9".into(), "n3".into());
        assert_eq!(begun(&next_step(&four)), (OperationKind::RemoveMember, "main-2".into()));
        // A cache one pass behind, without the new member's pod: still one of the crowded
        // node's, never the member just added.
        let mut behind = four.clone();
        behind.spread.members.remove("main-9");
        assert_eq!(
            begun(&next_step(&behind)),
            (OperationKind::RemoveMember, "main-2".into())
        );
        assert!(
            op.reason.contains("shares node n2") && op.reason.contains("n3 holds none"),
            "{}",
            op.reason
        );
        // Never while a member is unhealthy, nor before the members settled.
        let mut sick = c.clone();
        sick.members[0].healthy = false;
        sick.members[0].unhealthy_for = Some(Duration::from_secs(5));
        assert!(matches!(next_step(&sick), Step::Wait { .. }), "{:?}", next_step(&sick));
        let mut young = c.clone();
        young.spread.settled = false;
        assert!(matches!(next_step(&young), Step::Wait { .. }));
        // Without a node that holds none, sharing is the best there is.
        let mut full = c.clone();
        full.spread.eligible.remove("n3");
        assert!(matches!(next_step(&full), Step::Wait { .. }));
    }

    #[test]
    fn a_new_cluster_starts_from_one_member() {
        let mut c = cluster(3, vec![]);
        c.bootstrapped = false;
        c.reachable = false;
        c.next_member = "main-0".into();
        assert_eq!(begun(&next_step(&c)), (OperationKind::Bootstrap, "main-0".into()));
        let c = with_op(c, OperationKind::Bootstrap, "main-0");
        assert_eq!(
            next_step(&c),
            Step::StartFirstMember {
                member: "main-0".into()
            }
        );
        let mut started = c.clone();
        started.members = vec![MemberFacts {
            healthy: false,
            pod: PodState::Starting,
            id: None,
            ..member("main-0", 0)
        }];
        assert!(matches!(next_step(&started), Step::Wait { .. }));
        started.members[0].healthy = true;
        assert_eq!(
            next_step(&started),
            Step::FinishBootstrap {
                member: "main-0".into()
            }
        );
    }

    #[test]
    fn a_first_member_whose_start_was_cut_short_starts_again_on_a_new_volume() {
        let mut c = cluster(1, vec![]);
        c.bootstrapped = false;
        c.reachable = false;
        let c = with_op(c, OperationKind::Bootstrap, "main-0");
        let mut stuck = c.clone();
        stuck.members = vec![MemberFacts {
            healthy: false,
            pod: PodState::Starting,
            id: None,
            holds_nothing: true,
            ..member("main-0", 0)
        }];
        assert_eq!(
            next_step(&stuck),
            Step::StartOver {
                member: "main-0".into()
            }
        );
        // Restored from a backup, its volume holds the backup: never thrown away.
        let mut restored = stuck.clone();
        restored.restore = Some(Restore::Succeeded);
        assert!(matches!(next_step(&restored), Step::Wait { .. }));
        // Its pod gone, its volume still being deleted: it waits, then starts afresh.
        let mut leaving = stuck.clone();
        leaving.members[0].pod = PodState::Missing;
        leaving.members[0].volume = false;
        leaving.members[0].volume_leaving = true;
        assert!(matches!(next_step(&leaving), Step::Wait { .. }));
        leaving.members[0].volume_leaving = false;
        assert_eq!(
            next_step(&leaving),
            Step::StartFirstMember {
                member: "main-0".into()
            }
        );
    }

    #[test]
    fn a_bootstrapped_cluster_is_never_bootstrapped_again_even_with_nothing_answering() {
        let mut c = cluster(3, vec![]);
        c.reachable = false;
        assert!(matches!(next_step(&c), Step::QuorumLost { .. }));
    }

    #[test]
    fn members_join_as_learners_added_before_their_pods_and_promoted_when_healthy() {
        let c = cluster(3, vec![member("main-0", 10)]);
        assert_eq!(begun(&next_step(&c)), (OperationKind::AddMember, "main-9".into()));
        let adding = with_op(c.clone(), OperationKind::AddMember, "main-9");
        assert_eq!(
            next_step(&adding),
            Step::AddLearner {
                member: "main-9".into()
            },
            "etcd first"
        );
        let mut added = adding.clone();
        added.members.push(MemberFacts {
            learner: true,
            healthy: false,
            pod: PodState::Missing,
            volume: false,
            ..member("main-9", 19)
        });
        assert_eq!(
            next_step(&added),
            Step::StartMember {
                member: "main-9".into()
            },
            "then its pod"
        );
        added.members[1].pod = PodState::Starting;
        assert!(matches!(next_step(&added), Step::Wait { .. }), "catching up");
        added.members[1].healthy = true;
        added.members[1].pod = PodState::Ready;
        assert_eq!(
            next_step(&added),
            Step::Promote {
                member: "main-9".into(),
                id: 19
            }
        );
        added.members[1].learner = false;
        assert_eq!(next_step(&added), Step::Finish, "promoted: idempotent once a voter");
    }

    #[test]
    fn a_learner_that_cannot_catch_up_is_removed_not_promoted() {
        let mut c = with_op(
            cluster(3, vec![member("main-0", 10)]),
            OperationKind::AddMember,
            "main-9",
        );
        c.members.push(MemberFacts {
            learner: true,
            healthy: false,
            ..member("main-9", 19)
        });
        c.operation_age = LEARNER_DEADLINE;
        assert!(
            matches!(next_step(&c), Step::GiveUp { id: Some(19), .. }),
            "{:?}",
            next_step(&c)
        );
    }

    #[test]
    fn scaling_waits_for_health_and_goes_one_member_at_a_time() {
        let mut c = cluster(5, three());
        assert_eq!(begun(&next_step(&c)).0, OperationKind::AddMember);
        c.members[2].healthy = false;
        c.members[2].unhealthy_for = Some(Duration::from_secs(1));
        assert!(
            matches!(next_step(&c), Step::Wait { .. }),
            "not while a member is unhealthy"
        );
    }

    #[test]
    fn scale_down_removes_the_newest_non_leader_from_etcd_before_its_pod() {
        let mut five = three();
        five.push(member("main-3", 13));
        five.push(member("main-10", 20));
        let c = cluster(3, five);
        assert_eq!(begun(&next_step(&c)), (OperationKind::RemoveMember, "main-10".into()));
        let removing = with_op(c.clone(), OperationKind::RemoveMember, "main-10");
        assert_eq!(
            next_step(&removing),
            Step::RemoveFromEtcd {
                member: "main-10".into(),
                id: 20
            }
        );
        let mut gone = removing.clone();
        gone.members.retain(|m| m.name != "main-10");
        gone.members.push(MemberFacts {
            id: None,
            ..member("main-10", 0)
        });
        assert_eq!(
            next_step(&gone),
            Step::DeleteMember {
                member: "main-10".into(),
                force: false
            },
            "then its pod and volume"
        );
        gone.members.pop();
        assert_eq!(next_step(&gone), Step::Finish);
    }

    #[test]
    fn a_leader_being_removed_hands_leadership_over_first() {
        let c = with_op(cluster(1, three()), OperationKind::RemoveMember, "main-0");
        assert_eq!(next_step(&c), Step::MoveLeader { from: 10, to: 11 });
    }

    fn restart(members: &[&str]) -> Step {
        Step::RestartMembers {
            members: members.iter().map(|m| m.to_string()).collect(),
        }
    }

    /// `three()` with the pods of `gone` deleted (volumes kept) long enough ago that the quorum
    /// counts as lost if they are a majority.
    fn pods_gone(gone: &[usize]) -> ClusterFacts {
        let mut c = cluster(3, three());
        for i in gone {
            let m = &mut c.members[*i];
            m.pod = PodState::Missing;
            m.healthy = false;
            m.leader = false;
            m.unhealthy_for = Some(UNHEALTHY_GRACE * 4);
        }
        c
    }

    /// What the quorum loss the planner reports says.
    fn quorum_lost_reason(c: &ClusterFacts) -> String {
        match next_step(c) {
            Step::QuorumLost { reason } => reason,
            other => panic!("expected QuorumLost, got {other:?}"),
        }
    }

    #[test]
    fn a_pod_that_vanished_comes_back_on_its_volume_never_shrinking_the_cluster() {
        assert_eq!(next_step(&pods_gone(&[1])), restart(&["main-1"]));
        // Long gone: started again, not removed as unhealthy past the grace period.
        let mut c = pods_gone(&[1]);
        c.members[1].unhealthy_for = Some(UNHEALTHY_GRACE * 10);
        assert_eq!(next_step(&c), restart(&["main-1"]));
    }

    #[test]
    fn members_whose_pods_are_gone_come_back_together_on_their_volumes_without_a_quorum() {
        assert_eq!(
            next_step(&pods_gone(&[1, 2])),
            restart(&["main-1", "main-2"]),
            "two of three"
        );
        let mut all = pods_gone(&[0, 1, 2]);
        assert_eq!(next_step(&all), restart(&["main-0", "main-1", "main-2"]), "all three");
        // The operator restarted with every pod gone: etcd cannot be asked, the status knows
        // the members.
        all.reachable = false;
        all.listed_by_leader = false;
        assert_eq!(next_step(&all), restart(&["main-0", "main-1", "main-2"]));
        // Once made, the pods start; nothing else is done meanwhile. Their grace period starts
        // afresh, but the quorum was lost before: that is not an election.
        for m in &mut all.members {
            m.pod = PodState::Starting;
            m.fresh_pod = true;
            m.unhealthy_for = Some(Duration::from_secs(1));
        }
        assert!(
            matches!(next_step(&all), Step::QuorumLost { .. }),
            "{:?}",
            next_step(&all)
        );
    }

    #[test]
    fn a_member_whose_volume_is_gone_is_not_started_again_and_nothing_is_replaced_without_a_quorum() {
        let mut c = pods_gone(&[1, 2]);
        c.members[2].volume = false;
        assert_eq!(
            next_step(&c),
            restart(&["main-1"]),
            "the one with its volume comes back"
        );
        c.members[1].pod = PodState::Starting;
        c.members[1].fresh_pod = true;
        let reason = quorum_lost_reason(&c);
        assert!(reason.contains("Waiting can bring it back"), "{reason}");
        assert!(
            reason.contains("starting again, each on its own volume as the member it was: main-1"),
            "{reason}"
        );
        assert!(reason.contains("replaced once the quorum is back: main-2"), "{reason}");
        // Two volumes gone: waiting cannot help, and the way out is named.
        c.members[1].volume = false;
        c.members[1].pod = PodState::Missing;
        let reason = quorum_lost_reason(&c);
        assert!(reason.contains("Waiting cannot bring it back"), "{reason}");
        assert!(reason.contains("main-1 and main-2"), "{reason}");
        assert!(reason.contains("noops.dev/recover-from-backup=latest"), "{reason}");
    }

    #[test]
    fn a_member_on_a_node_that_is_down_is_waited_for_and_the_others_start_at_once() {
        let mut c = pods_gone(&[1, 2]);
        c.members[2].node_down = Some("node-3".into());
        assert_eq!(
            next_step(&c),
            restart(&["main-1", "main-2"]),
            "both pods are made; main-2's waits for its node to be placed"
        );
        for m in &mut c.members[1..] {
            m.pod = PodState::Starting;
            m.fresh_pod = true;
        }
        // The member left runs on, its pod not Ready without a leader: not said to restart.
        c.members[0].healthy = false;
        c.members[0].pod = PodState::Starting;
        c.members[0].unhealthy_for = Some(UNHEALTHY_GRACE);
        let reason = quorum_lost_reason(&c);
        assert!(reason.contains("main-2 waits for node node-3"), "{reason}");
        assert!(reason.contains("as the member it was: main-1;"), "{reason}");
        assert!(reason.contains("running but not serving: main-0"), "{reason}");
    }

    #[test]
    fn a_member_whose_node_is_back_is_waited_for_not_replaced_when_the_others_bring_the_quorum_back() {
        // Two nodes were down past the eviction toleration; main-1 is back on its volume, and
        // main-2's node is back, ending the evicted pod.
        let mut c = pods_gone(&[2]);
        c.members[2].pod = PodState::Stuck;
        c.members[2].leaving_live_node = true;
        assert!(matches!(next_step(&c), Step::Wait { .. }), "{:?}", next_step(&c));
        assert_eq!(restarting(&c), vec![("main-2", None)]);
        // Its node down again (or the pod not ending in time): judged by its health.
        c.members[2].leaving_live_node = false;
        assert_eq!(begun(&next_step(&c)), (OperationKind::RemoveMember, "main-2".into()));
    }

    #[test]
    fn ephemeral_members_are_never_started_again_and_their_loss_is_said_to_be_final() {
        let mut c = pods_gone(&[1, 2]);
        c.ephemeral = true;
        for m in &mut c.members[1..] {
            m.volume = false;
        }
        let reason = quorum_lost_reason(&c);
        assert!(reason.contains("Waiting cannot bring it back"), "{reason}");
        assert!(reason.contains("ephemeral"), "{reason}");
    }

    #[test]
    fn a_member_being_removed_comes_back_only_if_the_quorum_needs_it() {
        // Scale down of main-2 under way; main-1 and main-2 lose their pods: both come back.
        let c = with_op(pods_gone(&[1, 2]), OperationKind::RemoveMember, "main-2");
        assert_eq!(next_step(&c), restart(&["main-1", "main-2"]));
        // With a quorum, the removal goes on instead.
        let c = with_op(pods_gone(&[2]), OperationKind::RemoveMember, "main-2");
        assert_eq!(
            next_step(&c),
            Step::RemoveFromEtcd {
                member: "main-2".into(),
                id: 12
            }
        );
    }

    #[test]
    fn members_lost_during_an_upgrade_or_an_add_come_back_and_the_operation_goes_on() {
        // main-1 is being upgraded (its pod deleted for it); main-0 and main-2 lose theirs.
        let c = with_op(
            upgrading(outdated(pods_gone(&[0, 1, 2]).members)),
            OperationKind::Upgrade,
            "main-1",
        );
        assert_eq!(
            next_step(&c),
            Step::StartMember {
                member: "main-1".into()
            },
            "the operation's own first"
        );
        let mut c = c;
        c.members[1].pod = PodState::Starting;
        assert_eq!(next_step(&c), restart(&["main-0", "main-2"]));
        // A learner being added: the voters come back; the learner is the add's to start.
        let mut c = with_op(pods_gone(&[0, 1]), OperationKind::AddMember, "main-3");
        let mut learner = member("main-3", 13);
        learner.learner = true;
        learner.healthy = false;
        learner.pod = PodState::Starting;
        c.members.push(learner);
        assert_eq!(next_step(&c), restart(&["main-0", "main-1"]));
    }

    #[test]
    fn a_recovery_from_a_backup_never_starts_the_old_members_again() {
        let mut c = pods_gone(&[0, 1, 2]);
        c.bootstrapped = false;
        c.restore = Some(Restore::NotStarted);
        let c = with_op(c, OperationKind::Bootstrap, "main-3");
        assert_eq!(
            next_step(&c),
            Step::DeleteMember {
                member: "main-0".into(),
                force: false
            }
        );
    }

    #[test]
    fn a_leftover_learner_whose_pod_is_gone_is_removed_not_started() {
        let mut members = three();
        let mut learner = member("main-3", 13);
        learner.learner = true;
        learner.pod = PodState::Missing;
        members.push(learner);
        assert_eq!(
            begun(&next_step(&cluster(3, members))),
            (OperationKind::RemoveMember, "main-3".into())
        );
    }

    #[test]
    fn names_are_listed_in_words() {
        assert_eq!(listed(&[]), "");
        assert_eq!(listed(&["a"]), "a");
        assert_eq!(listed(&["a", "b"]), "a and b");
        assert_eq!(listed(&["a", "b", "c"]), "a, b and c");
    }

    #[test]
    fn a_member_whose_volume_is_gone_is_removed_first_then_replaced() {
        let mut c = cluster(3, three());
        c.members[2].pod = PodState::Missing;
        c.members[2].volume = false;
        c.members[2].healthy = false;
        assert_eq!(begun(&next_step(&c)), (OperationKind::RemoveMember, "main-2".into()));
        // Once removed, the scaling rule adds a successor under a new name.
        let mut removed = cluster(3, three());
        removed.members.truncate(2);
        assert_eq!(begun(&next_step(&removed)), (OperationKind::AddMember, "main-9".into()));
    }

    #[test]
    fn a_member_unhealthy_past_the_grace_is_replaced_but_not_before() {
        let mut c = cluster(3, three());
        c.members[2].healthy = false;
        c.members[2].unhealthy_for = Some(UNHEALTHY_GRACE / 2);
        assert!(matches!(next_step(&c), Step::Wait { .. }), "a restart is not a loss");
        c.members[2].unhealthy_for = Some(UNHEALTHY_GRACE);
        assert_eq!(begun(&next_step(&c)), (OperationKind::RemoveMember, "main-2".into()));
    }

    #[test]
    fn nothing_is_removed_when_the_rest_could_not_form_a_quorum() {
        let mut c = cluster(3, three());
        for m in &mut c.members[1..] {
            m.healthy = false;
            m.unhealthy_for = Some(UNHEALTHY_GRACE);
        }
        assert!(matches!(next_step(&c), Step::QuorumLost { .. }));
    }

    #[test]
    fn leftovers_of_members_etcd_does_not_know_are_deleted() {
        let mut c = cluster(3, three());
        c.members.push(MemberFacts {
            id: None,
            healthy: false,
            pod: PodState::Missing,
            volume: true,
            ..member("main-7", 0)
        });
        assert_eq!(
            next_step(&c),
            Step::DeleteMember {
                member: "main-7".into(),
                force: false
            }
        );
    }

    #[test]
    fn ephemeral_members_whose_pods_go_have_lost_their_data() {
        let mut c = cluster(3, three());
        c.ephemeral = true;
        c.members[1].pod = PodState::Missing;
        c.members[1].volume = false;
        c.members[1].healthy = false;
        assert_eq!(begun(&next_step(&c)), (OperationKind::RemoveMember, "main-1".into()));
    }

    #[test]
    fn a_moment_without_a_leader_is_an_election_not_a_lost_quorum() {
        let mut c = cluster(3, three());
        for m in &mut c.members {
            m.healthy = false;
            m.unhealthy_for = Some(Duration::from_secs(2));
        }
        assert!(matches!(next_step(&c), Step::Wait { .. }), "{:?}", next_step(&c));
        c.reachable = false;
        assert!(
            matches!(next_step(&c), Step::Wait { .. }),
            "nobody answers, for a moment"
        );
        for m in &mut c.members[1..] {
            m.unhealthy_for = Some(QUORUM_GRACE);
        }
        assert!(matches!(next_step(&c), Step::QuorumLost { .. }));
    }

    #[test]
    fn without_the_leaders_member_list_nothing_is_removed() {
        let mut c = cluster(3, three());
        c.members[2].volume = false;
        c.members.push(MemberFacts {
            id: None,
            ..member("main-3", 0)
        });
        c.listed_by_leader = false;
        assert!(matches!(next_step(&c), Step::Wait { .. }), "{:?}", next_step(&c));
        c.listed_by_leader = true;
        assert_eq!(begun(&next_step(&c)), (OperationKind::RemoveMember, "main-2".into()));
    }

    #[test]
    fn a_removed_members_pod_stuck_on_a_dead_node_is_force_deleted_without_holding_up_its_successor() {
        let mut c = with_op(cluster(3, three()), OperationKind::RemoveMember, "main-2");
        c.members[2].id = None;
        c.members[2].healthy = false;
        c.members[2].pod = PodState::Terminating;
        c.members[2].volume = false;
        assert_eq!(next_step(&c), Step::Finish, "its pod is on its way out");
        c.operation = None;
        assert_eq!(
            begun(&next_step(&c)),
            (OperationKind::AddMember, "main-9".into()),
            "the successor"
        );
        c.members[2].pod = PodState::Stuck;
        assert_eq!(
            next_step(&c),
            Step::DeleteMember {
                member: "main-2".into(),
                force: true
            }
        );
    }

    fn upgrading(members: Vec<MemberFacts>) -> ClusterFacts {
        let mut c = cluster(3, members);
        c.upgrade_to = Some("3.6.16".into());
        c
    }

    fn outdated(mut members: Vec<MemberFacts>) -> Vec<MemberFacts> {
        for m in &mut members {
            m.outdated = true;
        }
        members
    }

    #[test]
    fn an_upgrade_takes_one_member_at_a_time_the_leader_last() {
        // main-0 leads: the others go first, lowest index first.
        let c = upgrading(outdated(three()));
        let step = next_step(&c);
        assert_eq!(begun(&step), (OperationKind::Upgrade, "main-1".into()));
        let Step::Begin(op) = step else { unreachable!() };
        assert_eq!(op.version.as_deref(), Some("3.6.16"));
        let mut members = outdated(three());
        members[1].outdated = false;
        members[2].outdated = false;
        assert_eq!(
            begun(&next_step(&upgrading(members))),
            (OperationKind::Upgrade, "main-0".into())
        );
        // Nothing outdated: nothing to do.
        assert!(matches!(next_step(&upgrading(three())), Step::Wait { .. }));
    }

    #[test]
    fn an_upgrade_waits_for_every_member_to_be_healthy() {
        let mut members = outdated(three());
        members[2].healthy = false;
        members[2].unhealthy_for = Some(Duration::from_secs(1));
        assert!(matches!(next_step(&upgrading(members)), Step::Wait { .. }));
    }

    #[test]
    fn an_upgraded_member_restarts_on_its_volume_and_is_checked_before_the_next() {
        let c = with_op(upgrading(outdated(three())), OperationKind::Upgrade, "main-1");
        assert_eq!(
            next_step(&c),
            Step::RestartMember {
                member: "main-1".into()
            }
        );
        let mut stopping = outdated(three());
        stopping[1].pod = PodState::Terminating;
        let c = with_op(upgrading(stopping), OperationKind::Upgrade, "main-1");
        assert!(matches!(next_step(&c), Step::Wait { .. }));
        let mut gone = outdated(three());
        gone[1].pod = PodState::Missing;
        gone[1].outdated = false;
        let c = with_op(upgrading(gone), OperationKind::Upgrade, "main-1");
        assert_eq!(
            next_step(&c),
            Step::StartMember {
                member: "main-1".into()
            }
        );
        let mut starting = outdated(three());
        starting[1].outdated = false;
        starting[1].pod = PodState::Starting;
        starting[1].healthy = false;
        let c = with_op(upgrading(starting), OperationKind::Upgrade, "main-1");
        assert!(matches!(next_step(&c), Step::Wait { .. }));
        let mut back = outdated(three());
        back[1].outdated = false;
        let c = with_op(upgrading(back), OperationKind::Upgrade, "main-1");
        assert_eq!(
            next_step(&c),
            Step::CheckUpgraded {
                member: "main-1".into()
            }
        );
    }

    #[test]
    fn the_leader_hands_over_to_an_upgraded_member_before_its_own_restart() {
        let mut members = three();
        members[0].outdated = true;
        let c = with_op(upgrading(members), OperationKind::Upgrade, "main-0");
        assert_eq!(next_step(&c), Step::MoveLeader { from: 10, to: 11 });
        // A single member restarts leading: there is no one to hand over to.
        let mut solo = cluster(1, vec![member("main-0", 10)]);
        solo.members[0].leader = true;
        solo.members[0].outdated = true;
        solo.upgrade_to = Some("3.6.16".into());
        let c = with_op(solo, OperationKind::Upgrade, "main-0");
        assert_eq!(
            next_step(&c),
            Step::RestartMember {
                member: "main-0".into()
            }
        );
    }

    #[test]
    fn an_upgrade_never_restarts_a_member_while_another_is_down() {
        let mut members = outdated(three());
        members[2].healthy = false;
        members[2].unhealthy_for = Some(Duration::from_secs(1));
        let c = with_op(upgrading(members), OperationKind::Upgrade, "main-1");
        assert!(matches!(next_step(&c), Step::Wait { .. }), "{:?}", next_step(&c));
        let mut c = with_op(upgrading(outdated(three())), OperationKind::Upgrade, "main-1");
        c.listed_by_leader = false;
        assert!(matches!(next_step(&c), Step::Wait { .. }));
    }

    #[test]
    fn a_member_whose_data_went_during_its_upgrade_is_not_started_again() {
        let mut members = outdated(three());
        members[1].pod = PodState::Missing;
        members[1].volume = false;
        let c = with_op(upgrading(members), OperationKind::Upgrade, "main-1");
        assert!(matches!(next_step(&c), Step::Abandon { .. }));
        let mut members = outdated(three());
        members[1].pod = PodState::Missing;
        let mut c = with_op(upgrading(members), OperationKind::Upgrade, "main-1");
        c.ephemeral = true;
        assert!(matches!(next_step(&c), Step::Abandon { .. }));
    }

    #[test]
    fn an_upgrade_that_does_not_come_back_in_time_is_abandoned() {
        let mut members = outdated(three());
        members[1].outdated = false;
        members[1].healthy = false;
        members[1].pod = PodState::Starting;
        let mut c = with_op(upgrading(members), OperationKind::Upgrade, "main-1");
        assert!(matches!(next_step(&c), Step::Wait { .. }));
        c.operation_age = UPGRADE_DEADLINE;
        assert!(matches!(next_step(&c), Step::Abandon { .. }));
    }

    #[test]
    fn a_cluster_from_a_backup_starts_only_on_restored_data() {
        let mut c = cluster(3, vec![]);
        c.bootstrapped = false;
        c.restore = Some(Restore::NotStarted);
        let c = with_op(c, OperationKind::Bootstrap, "main-0");
        assert_eq!(
            next_step(&c),
            Step::RestoreFirstMember {
                member: "main-0".into()
            }
        );
        let mut running = c.clone();
        running.restore = Some(Restore::Running);
        assert!(matches!(next_step(&running), Step::Wait { .. }));
        let mut done = c.clone();
        done.restore = Some(Restore::Succeeded);
        assert_eq!(
            next_step(&done),
            Step::StartFirstMember {
                member: "main-0".into()
            }
        );
        let mut failed = c.clone();
        failed.restore = Some(Restore::Failed {
            message: "fetch exited with code 1".into(),
        });
        assert!(matches!(
            next_step(&failed),
            Step::RestoreBlocked {
                reason: EtcdClusterReason::RestoreFailed,
                ..
            }
        ));
        let mut missing = c;
        missing.restore = Some(Restore::Blocked {
            reason: EtcdClusterReason::BackupNotFound,
            message: "no such backup".into(),
        });
        assert!(matches!(
            next_step(&missing),
            Step::RestoreBlocked {
                reason: EtcdClusterReason::BackupNotFound,
                ..
            }
        ));
    }

    #[test]
    fn a_quorum_lost_in_the_middle_of_an_operation_stops_it_and_is_reported() {
        // main-1 was being removed when main-2 went too: only main-0 is left.
        let mut members = three();
        for m in &mut members[1..] {
            m.healthy = false;
            m.unhealthy_for = Some(QUORUM_GRACE);
        }
        members[1].volume = false;
        let c = with_op(cluster(3, members.clone()), OperationKind::RemoveMember, "main-1");
        assert!(matches!(next_step(&c), Step::QuorumLost { .. }), "{:?}", next_step(&c));
        // A member that comes back is still started: it can only help.
        members[2].pod = PodState::Missing;
        let c = with_op(cluster(3, members), OperationKind::Upgrade, "main-2");
        assert_eq!(
            next_step(&c),
            Step::StartMember {
                member: "main-2".into()
            }
        );
    }

    #[test]
    fn defragmentation_goes_one_member_at_a_time_the_leader_last_and_only_when_all_are_healthy() {
        let mut members = three();
        for m in &mut members {
            m.fragmented = true;
        }
        assert_eq!(
            next_step(&cluster(3, members.clone())),
            Step::Defragment {
                member: "main-1".into()
            }
        );
        members[1].fragmented = false;
        members[2].fragmented = false;
        assert_eq!(
            next_step(&cluster(3, members.clone())),
            Step::Defragment {
                member: "main-0".into()
            }
        );
        members[2].healthy = false;
        members[2].unhealthy_for = Some(Duration::from_secs(1));
        assert!(matches!(next_step(&cluster(3, members)), Step::Wait { .. }));
    }

    #[test]
    fn a_recovery_deletes_what_is_left_of_the_old_members_before_the_first_new_one_starts() {
        let mut c = cluster(3, three());
        c.bootstrapped = false;
        c.restore = Some(Restore::NotStarted);
        let c = with_op(c, OperationKind::Bootstrap, "main-3");
        assert_eq!(
            next_step(&c),
            Step::DeleteMember {
                member: "main-0".into(),
                force: false
            }
        );
        let mut gone = c.clone();
        for m in &mut gone.members {
            m.pod = PodState::Terminating;
            m.volume = false;
        }
        assert_eq!(
            next_step(&gone),
            Step::RestoreFirstMember {
                member: "main-3".into()
            }
        );
    }

    #[test]
    fn an_upgrade_whose_image_cannot_be_pulled_goes_back_instead_of_waiting() {
        let mut members = outdated(three());
        members[1].image_unavailable = Some(super::super::pod::image(crate::etcd::names::ETCD_REPOSITORY, "3.5.21"));
        members[1].healthy = false;
        members[1].pod = PodState::Starting;
        let c = with_op(upgrading(members.clone()), OperationKind::Upgrade, "main-1");
        assert!(
            !matches!(next_step(&c), Step::VersionUnavailable { .. }),
            "the old version's image failing to pull says nothing about the new one"
        );
        members[1].image_unavailable = Some(super::super::pod::image(crate::etcd::names::ETCD_REPOSITORY, "3.6.99"));
        members[1].healthy = false;
        members[1].pod = PodState::Starting;
        let mut c = with_op(upgrading(members), OperationKind::Upgrade, "main-1");
        if let Some(op) = c.operation.as_mut() {
            op.version = Some("3.6.99".into());
        }
        assert_eq!(
            next_step(&c),
            Step::VersionUnavailable {
                member: "main-1".into(),
                version: "3.6.99".into()
            }
        );
        // Once refused (no version change asked) and started again on the old version, it
        // ends like any upgrade.
        c.upgrade_to = None;
        c.members[1].image_unavailable = None;
        c.members[1].healthy = true;
        c.members[1].pod = PodState::Ready;
        assert_eq!(
            next_step(&c),
            Step::CheckUpgraded {
                member: "main-1".into()
            }
        );
    }

    #[test]
    fn an_addition_ends_only_when_the_leaders_list_says_the_member_votes() {
        // main-3 answers as a voter, but the list is not the leader's: it may be main-3's own
        // view, from before it applied its addition as a learner.
        let mut members = three();
        members.push(member("main-3", 13));
        let mut c = with_op(cluster(3, members), OperationKind::AddMember, "main-3");
        c.listed_by_leader = false;
        assert!(matches!(next_step(&c), Step::Wait { .. }), "{:?}", next_step(&c));
        c.listed_by_leader = true;
        assert_eq!(next_step(&c), Step::Finish);
    }

    #[test]
    fn a_learner_given_up_is_never_added_again_and_a_leftover_learner_goes() {
        // GiveUp removed main-3 from etcd; the status that ended the operation was lost.
        let mut c = with_op(cluster(3, three()), OperationKind::AddMember, "main-3");
        if let Some(op) = c.operation.as_mut() {
            op.member_id = Some("13".into());
        }
        assert!(matches!(next_step(&c), Step::Abandon { .. }), "{:?}", next_step(&c));
        // A learner with no operation: removed.
        let mut members = three();
        let mut learner = member("main-3", 13);
        learner.learner = true;
        members.push(learner);
        assert_eq!(
            begun(&next_step(&cluster(3, members))),
            (OperationKind::RemoveMember, "main-3".into())
        );
    }

    #[test]
    fn an_upgrade_of_a_member_that_is_gone_ends() {
        let mut members = three();
        members[1].id = None;
        let c = with_op(upgrading(members), OperationKind::Upgrade, "main-1");
        assert_eq!(next_step(&c), Step::Finish);
    }
}
