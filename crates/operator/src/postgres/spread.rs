//! Instances apart. Each instance prefers a node no other instance of its database runs on,
//! but those made while other nodes were down or cordoned land together, and nothing moves a
//! running pod: one node lost then takes a primary and its replica, or every replica. Once every
//! instance serves (the primary) or streams (the replicas) and has settled, and a node that
//! could hold an instance holds at least two fewer than the most crowded one, a replica of that
//! node is made anew: its pod and volume go, and the StatefulSet's new pod, preferring a node
//! without an instance, copies the primary again. Never the primary, never below the replicas a
//! synchronous commit waits for; one at a time. Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use noops_api::postgres::{MemberStatus, Role};

/// How long after the youngest instance pod was made a replica may be moved: one just copied
/// settles first, and one the scheduler still put beside another is not chased faster.
pub const SETTLE: Duration = Duration::from_secs(30);

/// Where the instances are, and which nodes could hold one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spread {
    /// Instances by node: (name, is the primary, serves or streams).
    pub by_node: BTreeMap<String, Vec<(String, bool, bool)>>,
    /// Nodes that could hold an instance now (Ready, not cordoned, its taints tolerated, the
    /// spec's required node affinity met).
    pub eligible: BTreeSet<String>,
}

impl Spread {
    /// The spread of `members` over `eligible` nodes.
    pub fn of(members: &[MemberStatus], eligible: BTreeSet<String>) -> Self {
        let mut by_node: BTreeMap<String, Vec<(String, bool, bool)>> =
            eligible.iter().map(|n| (n.clone(), Vec::new())).collect();
        for m in members {
            let Some(node) = &m.node else { continue };
            let primary = m.role == Role::Primary;
            let works = m.ready && (primary || m.streaming == Some(true));
            by_node
                .entry(node.clone())
                .or_default()
                .push((m.name.clone(), primary, works));
        }
        Self { by_node, eligible }
    }

    /// The move that would spread the instances: (replica, its node, a node that could take
    /// it), whether or not it may be made now.
    fn move_of(&self) -> Option<(String, String, String)> {
        let (crowded, there) = self
            .by_node
            .iter()
            .max_by_key(|(node, there)| (there.len(), std::cmp::Reverse(node.as_str())))?;
        let (free, fewer) = self
            .by_node
            .iter()
            .filter(|(node, _)| self.eligible.contains(*node))
            .min_by_key(|(node, there)| (there.len(), node.as_str()))?;
        if there.len() < fewer.len() + 2 {
            return None;
        }
        let replica = there
            .iter()
            .filter(|(_, primary, _)| !primary)
            .map(|(name, _, _)| name)
            .max()?;
        Some((replica.clone(), crowded.clone(), free.clone()))
    }

    /// Which instances share a node while another could take one of them, said, with what is
    /// done about it (`spare`: a replica can be spared while it is copied anew).
    pub fn fixable(&self, spare: bool) -> Option<String> {
        let (_, crowded, free) = self.move_of()?;
        let names: Vec<&str> = self.by_node[&crowded].iter().map(|(n, _, _)| n.as_str()).collect();
        let done = if spare {
            "a replica is copied anew where it runs apart, one at a time"
        } else {
            "no replica can be spared while one is copied anew (synchronous commits wait for every one that streams): add an instance"
        };
        Some(format!(
            "{} share node {crowded} while node {free} holds none: losing {crowded} would take them together; {done}",
            names.join(" and ")
        ))
    }

    /// The replica to make anew now: once every instance serves or streams, no pod is
    /// younger than [`SETTLE`] (`settled`), and losing one replica for a while leaves enough
    /// for the commits (`replicas_spare`: more replicas stream than a synchronous commit waits
    /// for).
    pub fn replica_to_move(&self, settled: bool, replicas_spare: bool) -> Option<(String, String, String)> {
        let all_work = self.by_node.values().flatten().all(|(_, _, works)| *works);
        (settled && replicas_spare && all_work)
            .then(|| self.move_of())
            .flatten()
    }
}

/// Whether one streaming replica can be spared for a while: more stream than the synchronous
/// commits wait for (`synchronous`: its `number`, if commits wait at all).
pub fn replicas_spare(members: &[MemberStatus], synchronous: Option<i32>) -> bool {
    let streaming = members
        .iter()
        .filter(|m| m.role == Role::Replica && m.streaming == Some(true))
        .count();
    let needed = usize::try_from(synchronous.unwrap_or(0)).unwrap_or(0);
    streaming > needed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, role: Role, node: &str) -> MemberStatus {
        MemberStatus {
            name: name.into(),
            role,
            node: Some(node.into()),
            ready: true,
            timeline: None,
            received_lsn: None,
            replayed_lsn: None,
            lag_bytes: None,
            lag_millis: None,
            streaming: (role == Role::Replica).then_some(true),
            observed_at: None,
        }
    }

    fn nodes(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_replica_beside_others_is_made_anew_on_a_node_without_one() {
        let together = [
            member("shop-0", Role::Primary, "n1"),
            member("shop-1", Role::Replica, "n1"),
            member("shop-2", Role::Replica, "n1"),
        ];
        let spread = Spread::of(&together, nodes(&["n1", "n2", "n3"]));
        assert_eq!(
            spread.replica_to_move(true, true),
            Some(("shop-2".into(), "n1".into(), "n2".into()))
        );
        assert!(
            spread
                .fixable(true)
                .unwrap()
                .starts_with("shop-0 and shop-1 and shop-2 share node n1")
        );
        assert!(spread.fixable(false).unwrap().ends_with("add an instance"));
        // Not settled, no replica to spare, or one not streaming: no move (still said).
        assert_eq!(spread.replica_to_move(false, true), None);
        assert_eq!(spread.replica_to_move(true, false), None);
        let mut catching_up = together.clone();
        catching_up[1].streaming = Some(false);
        assert_eq!(
            Spread::of(&catching_up, nodes(&["n1", "n2", "n3"])).replica_to_move(true, true),
            None
        );
        // One moved: the last move.
        let half = [
            member("shop-0", Role::Primary, "n1"),
            member("shop-1", Role::Replica, "n1"),
            member("shop-2", Role::Replica, "n2"),
        ];
        assert_eq!(
            Spread::of(&half, nodes(&["n1", "n2", "n3"])).replica_to_move(true, true),
            Some(("shop-1".into(), "n1".into(), "n3".into()))
        );
    }

    #[test]
    fn never_the_primary_and_nothing_where_no_other_node_could_take_one() {
        let apart = [
            member("shop-0", Role::Primary, "n1"),
            member("shop-1", Role::Replica, "n1"),
        ];
        // Only n1 can hold an instance.
        let alone = Spread::of(&apart, nodes(&["n1"]));
        assert_eq!(alone.replica_to_move(true, true), None);
        assert_eq!(alone.fixable(true), None);
        // Two together, n2 free: the replica moves, the primary stays.
        let two = Spread::of(&apart, nodes(&["n1", "n2"]));
        assert_eq!(
            two.replica_to_move(true, true),
            Some(("shop-1".into(), "n1".into(), "n2".into()))
        );
        // A primary alone on a crowded node of primaries cannot be: one primary. Two instances
        // on three nodes, one each on n1 and n2: nothing.
        let spread = [
            member("shop-0", Role::Primary, "n1"),
            member("shop-1", Role::Replica, "n2"),
        ];
        assert_eq!(
            Spread::of(&spread, nodes(&["n1", "n2", "n3"])).replica_to_move(true, true),
            None
        );
    }

    #[test]
    fn a_replica_is_spared_only_beyond_what_synchronous_commits_wait_for() {
        let members = [
            member("shop-0", Role::Primary, "n1"),
            member("shop-1", Role::Replica, "n1"),
            member("shop-2", Role::Replica, "n2"),
        ];
        assert!(replicas_spare(&members, None));
        assert!(replicas_spare(&members, Some(1)));
        assert!(!replicas_spare(&members, Some(2)));
        assert!(!replicas_spare(&members[..2], Some(1)));
    }
}
