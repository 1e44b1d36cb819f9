//! The EtcdCluster status: members, leader, version, endpoints, the operation in progress, and
//! the conditions Ready, Available, Progressing, Degraded and (with backups) BackupSucceeded.
//! Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use noops_api::EtcdCluster;
use noops_api::condition::{DEGRADED, PROGRESSING, READY};
use noops_api::etcd::EtcdClusterPhase;
use noops_api::etcd::EtcdClusterReason;
use noops_api::etcd::{EtcdClusterStatus, MemberStatus, Operation, OperationKind};

use super::membership::ClusterFacts;
use super::names::Names;
use super::observe::{Children, EtcdView};
use crate::core::conditions::{Decided, merge, with_paused};

/// The cluster serves clients: a quorum of voting members is healthy.
pub const AVAILABLE: &str = "Available";

/// What the reconcile found wrong that the status must say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Problems {
    /// The cluster has lost its quorum (or nothing answers), with why.
    pub quorum_lost: Option<String>,
    /// The spec asks for something that cannot be done (reason, message).
    pub invalid: Option<super::validate::Refusal>,
    /// The backup a new cluster starts from cannot be restored (reason, message).
    pub restore_blocked: Option<(EtcdClusterReason, String)>,
    /// A member's pod cannot start (its image, a crash loop, no node for it), and why.
    pub stuck_pod: Option<crate::core::stuck::Stuck>,
}

/// The reason of a member pod that cannot start.
pub const MEMBER_POD_STUCK: &str = EtcdClusterReason::MemberPodStuck.as_str();
/// Degraded's reason while voting members share a node whose loss would lose the quorum.
pub const MEMBERS_SHARE_NODE: &str = EtcdClusterReason::MembersShareNode.as_str();
/// The reason while members come back on their own volumes (their pods were gone).
pub const RESTARTING_MEMBERS: &str = EtcdClusterReason::RestartingMembers.as_str();

fn version_key(v: &str) -> Vec<u64> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

/// What a reconcile leaves behind for the status: the operation in progress, the next member
/// index, the cluster ID, and what is wrong.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    pub operation: Option<Operation>,
    pub next_member_index: i64,
    pub cluster_id: Option<String>,
    pub problems: Problems,
    pub backups: crate::core::backup::retention::BackupsSummary<EtcdClusterReason>,
    /// The backup the cluster was (or is being) started from.
    pub restored_from: Option<String>,
    /// The member defragmented in this pass, if any.
    pub defragmented: Option<String>,
    /// A version whose image could not be pulled (see the status field).
    pub unavailable_version: Option<String>,
    /// A repository whose image could not be pulled (see the status field).
    pub unavailable_repository: Option<String>,
}

/// The status after a reconcile: the members as they stand, then one builder per condition
/// and the phase, from what the pass saw ([`Standing`]) and what it found wrong.
pub fn build(
    cluster: &EtcdCluster,
    names: &Names,
    facts: &ClusterFacts,
    children: &Children,
    etcd: &EtcdView,
    outcome: &Outcome,
    now: jiff::Timestamp,
) -> EtcdClusterStatus {
    let previous = cluster.status.clone().unwrap_or_default();
    let members = member_statuses(&previous, facts, children, etcd, outcome.defragmented.as_deref(), now);
    let standing = Standing::of(cluster, facts, &members, outcome);
    let problems = &outcome.problems;
    let mut decided = vec![
        ready(&standing, problems, outcome.operation.as_ref()),
        availability(&standing, problems),
        progressing(&standing, outcome.operation.as_ref()),
        degraded(&standing, problems),
    ];
    decided.extend(
        outcome
            .backups
            .condition
            .clone()
            .filter(|_| cluster.spec.backup.is_some()),
    );
    let mut conditions = merge(
        &previous.conditions,
        &with_paused(&decided, cluster.spec.paused),
        cluster.metadata.generation,
        now,
    );
    // A cluster that no longer says where backups go has nothing to report on them.
    if cluster.spec.backup.is_none() {
        conditions.retain(|c| c.type_ != crate::core::backup::retention::BACKUP_SUCCEEDED);
    }
    let mut endpoints = vec![names.client_url()];
    endpoints.extend(
        members
            .iter()
            .filter(|m| m.id.is_some() && !m.learner)
            .map(|m| names.member_client_url(&m.name)),
    );
    let current_version = members
        .iter()
        .filter_map(|m| m.version.clone())
        .min_by_key(|v| version_key(v))
        .or(previous.current_version.clone());
    EtcdClusterStatus {
        observed_generation: cluster.metadata.generation,
        conditions,
        phase: Some(phase(&standing, problems, outcome.operation.as_ref())),
        ready: Some(format!("{}/{}", standing.healthy_voters, standing.replicas)),
        ready_members: i32::try_from(standing.healthy_voters).unwrap_or(i32::MAX),
        leader: members.iter().find(|m| m.leader).map(|m| m.name.clone()),
        members,
        current_version,
        cluster_id: outcome.cluster_id.clone(),
        endpoints,
        client_secret: names.tls.then(|| names.client_secret()),
        operation: outcome.operation.clone(),
        next_member_index: outcome.next_member_index,
        backups: outcome.backups.status.clone(),
        restored_from: outcome.restored_from.clone(),
        // Forgotten once the spec names another version.
        unavailable_version: outcome
            .unavailable_version
            .clone()
            .filter(|v| *v == cluster.spec.version),
        // What the members run from, once each runs the image asked for (a member going back
        // to it needs it).
        image_repository: if facts.members.iter().any(|m| m.outdated) || facts.members.is_empty() {
            previous.image_repository.clone()
        } else {
            Some(names.image_repository.clone())
        },
        // Forgotten once another repository is asked for.
        unavailable_repository: outcome
            .unavailable_repository
            .clone()
            .filter(|r| Some(r) == names.refused_repository.as_ref() || *r == names.image_repository),
    }
}

/// Each member as the status shows it: what etcd says of it now, or the last it said while it
/// does not answer.
fn member_statuses(
    previous: &EtcdClusterStatus,
    facts: &ClusterFacts,
    children: &Children,
    etcd: &EtcdView,
    defragmented: Option<&str>,
    now: jiff::Timestamp,
) -> Vec<MemberStatus> {
    facts
        .members
        .iter()
        .filter(|m| m.id.is_some() || m.pod != super::membership::PodState::Missing)
        .map(|m| {
            let known = previous.members.iter().find(|p| p.name == m.name);
            MemberStatus {
                name: m.name.clone(),
                id: m.id.map(|id| format!("{id:x}")),
                // The last it said while it does not answer: a member started again runs it.
                version: etcd
                    .health
                    .get(&m.name)
                    .map(|h| h.version.clone())
                    .or_else(|| known.and_then(|k| k.version.clone())),
                healthy: m.healthy,
                learner: m.learner,
                leader: m.leader,
                node: children
                    .pods
                    .get(&m.name)
                    .and_then(|p| p.spec.as_ref()?.node_name.clone()),
                unhealthy_since: (!m.healthy)
                    .then(|| known.and_then(|k| k.unhealthy_since.clone()).unwrap_or(Time(now))),
                // Rounded: the exact figures move with every write, and a status that changes
                // on every pass would wake the controller again on every pass.
                db_size: etcd.health.get(&m.name).map(|h| to_mib_above(h.db_size)),
                db_size_in_use: etcd.health.get(&m.name).map(|h| to_mib_above(h.db_size_in_use)),
                defragmented_at: if defragmented == Some(m.name.as_str()) {
                    Some(Time(now))
                } else {
                    known.and_then(|k| k.defragmented_at.clone())
                },
            }
        })
        .collect()
}

/// How the cluster stands, as every condition and the phase read it.
struct Standing<'a> {
    voters: usize,
    healthy_voters: usize,
    replicas: usize,
    quorum: usize,
    /// It has a cluster ID: the first member started it.
    bootstrapped: bool,
    /// A quorum of voting members is healthy.
    available: bool,
    /// As many healthy voting members as asked for, no learner, nothing in progress.
    settled: bool,
    /// Members on an older version than the one a version change rolls to.
    outdated: Vec<&'a str>,
    /// Members whose pods do not pass readiness (the client Service does not send to them).
    pods_not_ready: Vec<&'a str>,
    unhealthy: Vec<String>,
    /// Members coming back on their own data (their pods gone or starting): a repair that
    /// needs no membership change.
    coming_back: Option<String>,
    paused: bool,
    upgrade_to: Option<&'a str>,
    /// Voting members that share a node with more members than the cluster can lose, and
    /// whether a node that could hold one has room to spread them.
    crowded: Option<(String, bool)>,
}

impl<'a> Standing<'a> {
    fn of(cluster: &EtcdCluster, facts: &'a ClusterFacts, members: &[MemberStatus], outcome: &Outcome) -> Self {
        let voters = members.iter().filter(|m| m.id.is_some() && !m.learner).count();
        let healthy_voters = members
            .iter()
            .filter(|m| m.id.is_some() && !m.learner && m.healthy)
            .count();
        let replicas = usize::try_from(cluster.spec.replicas).unwrap_or(1);
        let bootstrapped = outcome.cluster_id.is_some();
        let quorum = voters / 2 + 1;
        Standing {
            voters,
            healthy_voters,
            replicas,
            quorum,
            bootstrapped,
            available: bootstrapped && voters > 0 && healthy_voters >= quorum && outcome.problems.quorum_lost.is_none(),
            settled: bootstrapped
                && outcome.operation.is_none()
                && healthy_voters == replicas
                && voters == replicas
                && members.iter().all(|m| m.healthy && !m.learner),
            outdated: facts
                .members
                .iter()
                .filter(|m| facts.upgrade_to.is_some() && m.id.is_some() && m.outdated)
                .map(|m| m.name.as_str())
                .collect(),
            pods_not_ready: facts
                .members
                .iter()
                .filter(|m| m.id.is_some() && m.pod != super::membership::PodState::Ready)
                .map(|m| m.name.as_str())
                .collect(),
            unhealthy: members.iter().filter(|m| !m.healthy).map(|m| m.name.clone()).collect(),
            coming_back: super::membership::coming_back(facts),
            paused: cluster.spec.paused,
            upgrade_to: facts.upgrade_to.as_deref(),
            crowded: {
                let voters: Vec<&str> = members
                    .iter()
                    .filter(|m| m.id.is_some() && !m.learner)
                    .map(|m| m.name.as_str())
                    .collect();
                facts
                    .spread
                    .shared(&voters)
                    .map(|shared| (shared, facts.spread.could_spread(&voters)))
            },
        }
    }

    fn members_healthy(&self) -> String {
        format!("{} of {} members healthy", self.healthy_voters, self.replicas)
    }

    fn quorum_note(&self) -> String {
        format!(
            "{} of {} voting members healthy; a quorum is {}",
            self.healthy_voters, self.voters, self.quorum
        )
    }
}

/// Ready: every member healthy, as asked, and its pod Ready (the client Service sends to it).
fn ready(standing: &Standing, problems: &Problems, operation: Option<&Operation>) -> Decided<EtcdClusterReason> {
    let stops_everything = |r: &&super::validate::Refusal| r.stops_changes && problems.quorum_lost.is_none();
    if let Some(refusal) = problems
        .invalid
        .as_ref()
        .filter(|r| standing.settled || stops_everything(r))
    {
        // Healthy but not as asked; or nothing moves until the spec is fixed.
        Decided::new(READY, false, refusal.reason, refusal.message.clone())
    } else if standing.settled && !standing.outdated.is_empty() {
        Decided::new(
            READY,
            false,
            EtcdClusterReason::Upgrading,
            format!(
                "{} still run an older version than {}",
                standing.outdated.join(", "),
                standing.upgrade_to.unwrap_or_default()
            ),
        )
    } else if standing.settled && !standing.pods_not_ready.is_empty() {
        Decided::new(
            READY,
            false,
            EtcdClusterReason::PodsNotReady,
            format!(
                "healthy in etcd, but the pods of {} are not Ready yet",
                standing.pods_not_ready.join(", ")
            ),
        )
    } else if standing.settled {
        Decided::new(
            READY,
            true,
            EtcdClusterReason::MembersHealthy,
            standing.members_healthy(),
        )
    } else if let Some(why) = &problems.quorum_lost {
        Decided::new(READY, false, EtcdClusterReason::QuorumLost, why.clone())
    } else if let Some((reason, message)) = &problems.restore_blocked {
        Decided::new(READY, false, *reason, message.clone())
    } else if let Some(stuck) = &problems.stuck_pod {
        Decided::new(READY, false, EtcdClusterReason::MemberPodStuck, stuck.message.clone())
    } else if !standing.bootstrapped {
        Decided::new(
            READY,
            false,
            EtcdClusterReason::Bootstrapping,
            "the first member is starting the cluster",
        )
    } else if let Some(op) = operation {
        Decided::new(READY, false, EtcdClusterReason::MembershipChanging, describe(op))
    } else if let Some(note) = &standing.coming_back {
        Decided::new(READY, false, EtcdClusterReason::RestartingMembers, note.clone())
    } else {
        Decided::new(
            READY,
            false,
            EtcdClusterReason::MembersUnhealthy,
            standing.members_healthy(),
        )
    }
}

/// Available: a quorum of voting members is healthy, so the cluster serves clients.
fn availability(standing: &Standing, problems: &Problems) -> Decided<EtcdClusterReason> {
    if standing.available {
        Decided::new(
            AVAILABLE,
            true,
            EtcdClusterReason::QuorumHealthy,
            standing.quorum_note(),
        )
    } else if !standing.bootstrapped {
        Decided::new(
            AVAILABLE,
            false,
            EtcdClusterReason::Bootstrapping,
            "the cluster is not started yet",
        )
    } else {
        Decided::new(
            AVAILABLE,
            false,
            EtcdClusterReason::QuorumLost,
            problems.quorum_lost.clone().unwrap_or_else(|| standing.quorum_note()),
        )
    }
}

/// Progressing: a membership operation, or members coming back on their own volumes.
fn progressing(standing: &Standing, operation: Option<&Operation>) -> Decided<EtcdClusterReason> {
    match (operation, &standing.coming_back) {
        (Some(op), _) => Decided::new(PROGRESSING, true, kind_reason(op.kind), describe(op)),
        (None, Some(note)) => Decided::new(PROGRESSING, true, EtcdClusterReason::RestartingMembers, note.clone()),
        (None, None) => Decided::new(PROGRESSING, false, EtcdClusterReason::Stable, "no change in progress"),
    }
}

/// Degraded: the gravest of what is wrong.
fn degraded(standing: &Standing, problems: &Problems) -> Decided<EtcdClusterReason> {
    if let Some(why) = &problems.quorum_lost {
        Decided::new(DEGRADED, true, EtcdClusterReason::QuorumLost, why.clone())
    } else if let Some(refusal) = &problems.invalid {
        Decided::new(DEGRADED, true, refusal.reason, refusal.message.clone())
    } else if let Some((reason, message)) = &problems.restore_blocked {
        Decided::new(DEGRADED, true, *reason, message.clone())
    } else if let Some(stuck) = &problems.stuck_pod {
        Decided::new(DEGRADED, true, EtcdClusterReason::MemberPodStuck, stuck.message.clone())
    } else if standing.bootstrapped && !standing.unhealthy.is_empty() {
        Decided::new(
            DEGRADED,
            true,
            EtcdClusterReason::MembersUnhealthy,
            format!("unhealthy: {}", standing.unhealthy.join(", ")),
        )
    } else if let Some((shared, could_spread)) = &standing.crowded {
        // Said either way, never "no problems found"; degraded only while a node could take a
        // member (a cluster of one node, or with every other node down, is as spread as it can
        // be, and a Degraded that nothing can end would only train people to ignore it).
        let message = if *could_spread {
            format!(
                "{shared}: losing that node would lose the quorum; a member moves to another node once every member is healthy"
            )
        } else {
            format!(
                "{shared}: losing that node would lose the quorum, and no other node could hold a member now; they move once one can"
            )
        };
        Decided::new(DEGRADED, *could_spread, EtcdClusterReason::MembersShareNode, message)
    } else {
        Decided::new(DEGRADED, false, EtcdClusterReason::AsExpected, "no problems found")
    }
}

/// The phase `kubectl get` shows.
fn phase(standing: &Standing, problems: &Problems, operation: Option<&Operation>) -> EtcdClusterPhase {
    if standing.paused {
        EtcdClusterPhase::Paused
    } else if problems.quorum_lost.is_some() {
        EtcdClusterPhase::QuorumLost
    } else if !standing.bootstrapped {
        EtcdClusterPhase::Creating
    } else if operation.is_none() && !standing.outdated.is_empty() && standing.unhealthy.is_empty() {
        EtcdClusterPhase::Upgrading
    } else if let Some(op) = operation {
        match op.kind {
            OperationKind::Upgrade => EtcdClusterPhase::Upgrading,
            _ if op.reason.starts_with("scale") => EtcdClusterPhase::Scaling,
            _ => EtcdClusterPhase::Repairing,
        }
    } else if standing.coming_back.is_some() {
        EtcdClusterPhase::Repairing
    } else if !standing.unhealthy.is_empty() {
        EtcdClusterPhase::Degraded
    } else {
        EtcdClusterPhase::Running
    }
}

/// `bytes` rounded up to a whole MiB, in bytes.
fn to_mib_above(bytes: i64) -> i64 {
    const MIB: i64 = 1 << 20;
    (bytes.max(0) + MIB - 1) / MIB * MIB
}

fn kind_reason(kind: OperationKind) -> EtcdClusterReason {
    match kind {
        OperationKind::Bootstrap => EtcdClusterReason::Bootstrapping,
        OperationKind::AddMember => EtcdClusterReason::AddingMember,
        OperationKind::RemoveMember => EtcdClusterReason::RemovingMember,
        OperationKind::Upgrade => EtcdClusterReason::UpgradingMember,
    }
}

/// An operation in words.
pub fn describe(op: &Operation) -> String {
    match op.kind {
        OperationKind::Bootstrap => format!("{} is starting a new cluster", op.member),
        OperationKind::AddMember => format!(
            "adding {} as a learner, then a voting member ({})",
            op.member, op.reason
        ),
        OperationKind::RemoveMember => format!("removing {} ({})", op.member, op.reason),
        OperationKind::Upgrade => format!(
            "upgrading {} to {}, one member at a time, the leader last",
            op.member,
            op.version.as_deref().unwrap_or("the new version")
        ),
    }
}

/// Whether `conditions` hold one that is True with `reason`.
pub fn has_reason(conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition], reason: &str) -> bool {
    conditions.iter().any(|c| c.reason == reason && c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::conditions::is_true;
    use crate::etcd::client::MemberHealth;
    use crate::etcd::fixtures;
    use crate::etcd::membership::{MemberFacts, PodState};

    #[test]
    fn database_sizes_are_rounded_up_to_the_mib() {
        assert_eq!(to_mib_above(0), 0);
        assert_eq!(to_mib_above(1), 1 << 20);
        assert_eq!(to_mib_above(1 << 20), 1 << 20);
        assert_eq!(to_mib_above((1 << 20) + 1), 2 << 20);
    }

    fn member(name: &str, id: u64, healthy: bool) -> MemberFacts {
        MemberFacts {
            healthy,
            leader: id == 1,
            ..MemberFacts::fixture(name, id)
        }
    }

    fn facts(members: Vec<MemberFacts>) -> ClusterFacts {
        ClusterFacts {
            replicas: 3,
            bootstrapped: true,
            reachable: true,
            image_repository: crate::etcd::names::ETCD_REPOSITORY.into(),
            listed_by_leader: true,
            members,
            operation: None,
            operation_age: std::time::Duration::ZERO,
            next_member: "main-3".into(),
            ephemeral: false,
            upgrade_to: None,
            restore: None,
            spread: Default::default(),
            now: jiff::Timestamp::UNIX_EPOCH,
        }
    }

    fn view(versions: &[(&str, &str)]) -> EtcdView {
        EtcdView {
            health: versions
                .iter()
                .map(|(m, v)| {
                    (
                        m.to_string(),
                        MemberHealth {
                            id: 0,
                            cluster_id: 1,
                            leader: 1,
                            version: v.to_string(),
                            learner: false,
                            raft_index: 1,
                            db_size: 1,
                            db_size_in_use: 1,
                            errors: vec![],
                        },
                    )
                })
                .collect(),
            listed: Some(vec![]),
            listed_by_leader: true,
            ..Default::default()
        }
    }

    fn build_for(members: Vec<MemberFacts>, problems: &Problems) -> EtcdClusterStatus {
        let cluster = fixtures::cluster().build();
        let names = Names::of(&cluster);
        let f = facts(members);
        build(
            &cluster,
            &names,
            &f,
            &Children::default(),
            &view(&[("main-0", "3.5.21"), ("main-1", "3.5.9"), ("main-2", "3.5.21")]),
            &Outcome {
                operation: None,
                next_member_index: 3,
                cluster_id: Some("1".into()),
                problems: problems.clone(),
                backups: Default::default(),
                restored_from: None,
                defragmented: None,
                unavailable_version: None,
                unavailable_repository: None,
            },
            jiff::Timestamp::UNIX_EPOCH,
        )
    }

    #[test]
    fn a_healthy_cluster_is_ready_and_lists_members_leader_and_endpoints() {
        let s = build_for(
            vec![
                member("main-0", 1, true),
                member("main-1", 2, true),
                member("main-2", 3, true),
            ],
            &Problems::default(),
        );
        assert!(is_true(&s.conditions, READY) && is_true(&s.conditions, AVAILABLE));
        assert!(!is_true(&s.conditions, DEGRADED));
        assert_eq!(s.ready.as_deref(), Some("3/3"));
        assert_eq!(s.leader.as_deref(), Some("main-0"));
        assert_eq!(s.members[1].id.as_deref(), Some("2"));
        assert_eq!(s.current_version.as_deref(), Some("3.5.9"), "the lowest version");
        assert_eq!(s.endpoints[0], "https://main-client.db.svc:2379");
        assert_eq!(s.endpoints.len(), 4);
        assert_eq!(s.phase, Some(EtcdClusterPhase::Running));
        assert_eq!(s.client_secret.as_deref(), Some("main-client"));
    }

    #[test]
    fn healthy_members_whose_pods_are_not_ready_are_not_ready_yet() {
        let mut starting = member("main-2", 3, true);
        starting.pod = PodState::Starting;
        let s = build_for(
            vec![member("main-0", 1, true), member("main-1", 2, true), starting],
            &Problems::default(),
        );
        let ready = s.conditions.iter().find(|c| c.type_ == READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "PodsNotReady")
        );
        assert!(ready.message.contains("main-2"), "{}", ready.message);
        assert!(is_true(&s.conditions, AVAILABLE));
    }

    #[test]
    fn a_cluster_with_members_on_an_older_version_is_not_ready_while_it_upgrades() {
        let mut old = member("main-2", 3, true);
        old.outdated = true;
        let cluster = fixtures::cluster().build();
        let names = Names::of(&cluster);
        let mut f = facts(vec![member("main-0", 1, true), member("main-1", 2, true), old]);
        f.upgrade_to = Some("3.6.16".into());
        let s = build(
            &cluster,
            &names,
            &f,
            &Children::default(),
            &view(&[("main-0", "3.6.16"), ("main-1", "3.6.16"), ("main-2", "3.5.35")]),
            &Outcome {
                operation: None,
                next_member_index: 3,
                cluster_id: Some("1".into()),
                problems: Problems::default(),
                backups: Default::default(),
                restored_from: None,
                defragmented: None,
                unavailable_version: None,
                unavailable_repository: None,
            },
            jiff::Timestamp::UNIX_EPOCH,
        );
        let ready = s.conditions.iter().find(|c| c.type_ == READY).unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "Upgrading"));
        assert_eq!(s.phase, Some(EtcdClusterPhase::Upgrading));
    }

    #[test]
    fn an_unhealthy_member_degrades_but_a_quorum_keeps_it_available() {
        let s = build_for(
            vec![
                member("main-0", 1, true),
                member("main-1", 2, true),
                member("main-2", 3, false),
            ],
            &Problems::default(),
        );
        assert!(!is_true(&s.conditions, READY));
        assert!(is_true(&s.conditions, AVAILABLE));
        assert!(is_true(&s.conditions, DEGRADED));
        assert!(s.members[2].unhealthy_since.is_some());
        let lost = build_for(
            vec![
                member("main-0", 1, true),
                member("main-1", 2, false),
                member("main-2", 3, false),
            ],
            &Problems {
                quorum_lost: Some("1 of 3 healthy".into()),
                ..Default::default()
            },
        );
        assert!(!is_true(&lost.conditions, AVAILABLE));
        assert_eq!(lost.phase, Some(EtcdClusterPhase::QuorumLost));
    }

    fn condition<'a>(s: &'a EtcdClusterStatus, type_: &str) -> (&'a str, &'a str, &'a str) {
        let c = s.conditions.iter().find(|c| c.type_ == type_).unwrap();
        (c.status.as_str(), c.reason.as_str(), c.message.as_str())
    }

    #[test]
    fn members_coming_back_on_their_volumes_are_said_to_restart_and_one_on_a_dead_node_names_it() {
        let mut starting = member("main-2", 3, false);
        starting.pod = PodState::Starting;
        starting.fresh_pod = true;
        let s = build_for(
            vec![member("main-0", 1, true), member("main-1", 2, true), starting.clone()],
            &Problems::default(),
        );
        let (status, reason, message) = condition(&s, PROGRESSING);
        assert_eq!((status, reason), ("True", RESTARTING_MEMBERS));
        assert!(message.contains("own volume as the member it was: main-2"), "{message}");
        assert_eq!(condition(&s, READY).1, RESTARTING_MEMBERS);
        assert_eq!(s.phase, Some(EtcdClusterPhase::Repairing));
        assert!(is_true(&s.conditions, AVAILABLE));

        let mut pinned = member("main-1", 2, false);
        pinned.pod = PodState::Missing;
        pinned.node_down = Some("node-2".into());
        let lost = build_for(
            vec![member("main-0", 1, false), pinned, starting],
            &Problems {
                quorum_lost: Some("0 of 3 voting members are healthy".into()),
                ..Default::default()
            },
        );
        let (_, reason, message) = condition(&lost, PROGRESSING);
        assert_eq!(reason, RESTARTING_MEMBERS);
        assert!(
            message.contains("main-2") && message.contains("main-1 waits for node node-2"),
            "{message}"
        );
        assert_eq!(condition(&lost, READY).1, "QuorumLost", "the graver news first");
        assert_eq!(lost.phase, Some(EtcdClusterPhase::QuorumLost));
    }

    #[test]
    fn a_member_that_does_not_answer_keeps_the_version_it_last_said() {
        let previous = EtcdClusterStatus {
            members: vec![MemberStatus {
                name: "main-3".into(),
                id: Some("4".into()),
                version: Some("3.5.30".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let cluster = fixtures::cluster().status(previous).build();
        let names = Names::of(&cluster);
        let mut silent = member("main-3", 4, false);
        silent.pod = PodState::Missing;
        let s = build(
            &cluster,
            &names,
            &facts(vec![member("main-0", 1, true), silent]),
            &Children::default(),
            &view(&[("main-0", "3.5.35")]),
            &Outcome {
                cluster_id: Some("1".into()),
                ..Default::default()
            },
            jiff::Timestamp::UNIX_EPOCH,
        );
        assert_eq!(s.members[1].version.as_deref(), Some("3.5.30"));
        assert_eq!(s.members[0].version.as_deref(), Some("3.5.35"));
    }

    #[test]
    fn a_member_pod_that_cannot_start_is_named_in_ready_and_degraded() {
        let stuck = crate::core::stuck::Stuck {
            reason: "ImagePullBackOff",
            message: "pod main-2, container etcd: Back-off pulling image".into(),
        };
        let s = build_for(
            vec![
                member("main-0", 1, true),
                member("main-1", 2, true),
                member("main-2", 3, false),
            ],
            &Problems {
                stuck_pod: Some(stuck),
                ..Default::default()
            },
        );
        for type_ in [READY, DEGRADED] {
            let c = s.conditions.iter().find(|c| c.type_ == type_).unwrap();
            assert_eq!(c.reason, MEMBER_POD_STUCK, "{type_}");
            assert!(c.message.contains("pulling image"), "{type_}: {}", c.message);
        }
        assert!(is_true(&s.conditions, AVAILABLE), "two of three still serve");
    }

    #[test]
    fn an_unchanged_status_is_equal_so_it_is_not_written_again() {
        let members = vec![
            member("main-0", 1, true),
            member("main-1", 2, true),
            member("main-2", 3, true),
        ];
        let first = build_for(members.clone(), &Problems::default());
        let cluster = fixtures::cluster().status(first.clone()).build();
        let names = Names::of(&cluster);
        let again = build(
            &cluster,
            &names,
            &facts(members),
            &Children::default(),
            &view(&[("main-0", "3.5.21"), ("main-1", "3.5.9"), ("main-2", "3.5.21")]),
            &Outcome {
                operation: None,
                next_member_index: 3,
                cluster_id: Some("1".into()),
                problems: Problems::default(),
                backups: Default::default(),
                restored_from: None,
                defragmented: None,
                unavailable_version: None,
                unavailable_repository: None,
            },
            jiff::Timestamp::from_second(100).unwrap(),
        );
        assert_eq!(again, first);
    }
}
