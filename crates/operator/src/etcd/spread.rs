//! Members apart. Member pods prefer different nodes, but a member replaced while a node was
//! down lands beside another, and nothing moved it back when the node returned: one more node
//! failure then took two members and the quorum with it. Once every member is healthy and a
//! node that could hold a member holds two fewer than the most crowded one, a member is added
//! there (a learner whose pod must run on that node, promoted once caught up), then the scale
//! rule takes the cluster back to its size by removing a member of the most crowded node: the
//! cluster never has fewer voters than asked for on the way. One move at a time; until then
//! the status says which members share a node. Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use noops_api::EtcdCluster;

use crate::core::nodes::{admitted_selector, could_hold};

/// How long after the youngest member pod was made a move may begin: a member just added
/// settles first, and a successor the scheduler still put beside another is not chased
/// around faster than this.
pub const SETTLE: Duration = Duration::from_secs(30);

/// Where the members are, and where they could be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spread {
    /// The node each member's pod is bound to.
    pub members: BTreeMap<String, String>,
    /// Nodes that could hold a member pod now (Ready, not cordoned, taints tolerated, the
    /// cluster's required node affinity and the member pods' admitted node selector met).
    pub eligible: BTreeSet<String>,
    /// No member pod was made within [`SETTLE`].
    pub settled: bool,
}

impl Spread {
    /// The spread of `cluster`'s member pods (`pods`, by member) over `nodes`.
    pub fn of(
        cluster: &EtcdCluster,
        pods: &BTreeMap<String, Arc<Pod>>,
        nodes: &[Arc<Node>],
        now: jiff::Timestamp,
    ) -> Self {
        let pod = &cluster.spec.pod;
        let members = pods
            .iter()
            .filter_map(|(member, p)| Some((member.clone(), p.spec.as_ref()?.node_name.clone()?)))
            .collect();
        let selector = admitted_selector(pods.values().map(|p| &**p));
        let eligible = nodes
            .iter()
            .filter(|n| could_hold(n, &pod.tolerations, pod.affinity.as_ref(), &selector))
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        let settled = pods.values().all(|p| {
            p.metadata
                .creation_timestamp
                .as_ref()
                .is_none_or(|made| Duration::try_from(now.duration_since(made.0)).unwrap_or_default() >= SETTLE)
        });
        Self {
            members,
            eligible,
            settled,
        }
    }

    /// Members by node, for `voters` (the members that count).
    fn by_node<'a>(&'a self, voters: &[&'a str]) -> BTreeMap<&'a str, Vec<&'a str>> {
        let mut by_node: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for member in voters {
            if let Some(node) = self.members.get(*member) {
                by_node.entry(node.as_str()).or_default().push(member);
            }
        }
        by_node
    }

    /// Which of `voters` share a node with more members than the cluster can lose, "main-0
    /// and main-3 share node-2", if any do: losing that one node would lose the quorum. (Five
    /// members on three nodes share nodes, two to a node, and lose no quorum with one.)
    pub fn shared(&self, voters: &[&str]) -> Option<String> {
        let can_lose = voters.len().saturating_sub(voters.len() / 2 + 1);
        let shared: Vec<String> = self
            .by_node(voters)
            .into_iter()
            .filter(|(_, members)| members.len() > can_lose.max(1))
            .map(|(node, members)| format!("{} share node {node}", members.join(" and ")))
            .collect();
        (!shared.is_empty()).then(|| shared.join("; "))
    }

    /// Whether a member of `voters` could move to spread them (see [`Spread::member_to_move`]),
    /// settled or not.
    pub fn could_spread(&self, voters: &[&str]) -> bool {
        self.move_of(voters, None).is_some()
    }

    /// A member of `voters` to move, as (member, its node, the node that could take it): one
    /// on the most crowded node when a node that could hold a member has at least two fewer,
    /// so that the move spreads them. `keep` (the leader) is moved only if nothing else can be.
    /// None until the members have settled.
    pub fn member_to_move(&self, voters: &[&str], keep: Option<&str>) -> Option<(String, String, String)> {
        if !self.settled {
            return None;
        }
        self.move_of(voters, keep)
    }

    /// The member of `voters` to give up when there is one too many: one on the most crowded
    /// node when that node holds more than one (so a member added to spread them ends the
    /// move), the newest there that is not `keep`; None when no node holds two.
    pub fn crowded_member(&self, voters: &[&str], keep: Option<&str>) -> Option<String> {
        let by_node = self.by_node(voters);
        let (_, members) = by_node
            .iter()
            .filter(|(_, members)| members.len() > 1)
            .max_by_key(|(node, members)| (members.len(), std::cmp::Reverse(*node)))?;
        members
            .iter()
            .filter(|m| Some(**m) != keep)
            .max_by(|a, b| super::names::index_order(a, b))
            .map(|m| m.to_string())
    }

    fn move_of(&self, voters: &[&str], keep: Option<&str>) -> Option<(String, String, String)> {
        let by_node = self.by_node(voters);
        let load = |node: &str| by_node.get(node).map_or(0, Vec::len);
        let (crowded, members) = by_node
            .iter()
            .max_by_key(|(node, members)| (members.len(), std::cmp::Reverse(*node)))?;
        let emptiest = self.eligible.iter().min_by_key(|node| (load(node), node.as_str()))?;
        if members.len() < load(emptiest) + 2 {
            return None;
        }
        let member = members
            .iter()
            .filter(|m| Some(**m) != keep)
            .max_by(|a, b| super::names::index_order(a, b))
            .or(members.first())?;
        Some((member.to_string(), crowded.to_string(), emptiest.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spread(members: &[(&str, &str)], eligible: &[&str]) -> Spread {
        Spread {
            members: members.iter().map(|(m, n)| (m.to_string(), n.to_string())).collect(),
            eligible: eligible.iter().map(|n| n.to_string()).collect(),
            settled: true,
        }
    }

    #[test]
    fn a_member_beside_another_moves_to_a_node_with_none_once_settled() {
        let voters = ["main-0", "main-1", "main-3"];
        let after_a_node_returned = spread(
            &[("main-0", "n1"), ("main-1", "n2"), ("main-3", "n2")],
            &["n1", "n2", "n3"],
        );
        assert_eq!(
            after_a_node_returned.shared(&voters).as_deref(),
            Some("main-1 and main-3 share node n2")
        );
        // The newest that does not lead goes; the leader only if it alone could.
        assert_eq!(
            after_a_node_returned.member_to_move(&voters, Some("main-1")),
            Some(("main-3".into(), "n2".into(), "n3".into()))
        );
        assert_eq!(
            after_a_node_returned.member_to_move(&voters, Some("main-3")),
            Some(("main-1".into(), "n2".into(), "n3".into()))
        );
        let unsettled = Spread {
            settled: false,
            ..after_a_node_returned.clone()
        };
        assert_eq!(unsettled.member_to_move(&voters, None), None);
        assert!(unsettled.shared(&voters).is_some(), "still said");
    }

    #[test]
    fn one_too_many_gives_up_a_member_of_the_most_crowded_node() {
        // A member added on n3 to spread them: four voters, main-1 and main-2 share n2.
        let voters = ["main-0", "main-1", "main-2", "main-3"];
        let added = spread(
            &[("main-0", "n1"), ("main-1", "n2"), ("main-2", "n2"), ("main-3", "n3")],
            &["n1", "n2", "n3"],
        );
        assert_eq!(added.crowded_member(&voters, Some("main-2")).as_deref(), Some("main-1"));
        assert_eq!(added.crowded_member(&voters, None).as_deref(), Some("main-2"));
        let apart = spread(&[("main-0", "n1"), ("main-1", "n2")], &["n1", "n2", "n3"]);
        assert_eq!(apart.crowded_member(&["main-0", "main-1"], None), None);
        assert!(spread(&[("main-0", "n1"), ("main-1", "n1")], &["n1", "n2"]).could_spread(&["main-0", "main-1"]));
        // No voters yet (a cluster starting): nothing shared, nothing to move.
        assert_eq!(added.shared(&[]), None);
        assert!(!added.could_spread(&[]));
    }

    #[test]
    fn no_move_where_no_node_could_take_one_or_it_would_not_spread_them() {
        let voters = ["main-0", "main-1", "main-3"];
        // The third node is down (not eligible): sharing is the best there is.
        let two_nodes = spread(&[("main-0", "n1"), ("main-1", "n2"), ("main-3", "n2")], &["n1", "n2"]);
        assert_eq!(two_nodes.member_to_move(&voters, None), None);
        // Spread already.
        let apart = spread(
            &[("main-0", "n1"), ("main-1", "n2"), ("main-3", "n3")],
            &["n1", "n2", "n3"],
        );
        assert_eq!(apart.shared(&voters), None);
        assert_eq!(apart.member_to_move(&voters, None), None);
        // Five members on three nodes: 2/2/1 is as spread as it gets; 3/1/1 is not.
        let five = ["m-0", "m-1", "m-2", "m-3", "m-4"];
        let even = spread(
            &[
                ("m-0", "n1"),
                ("m-1", "n1"),
                ("m-2", "n2"),
                ("m-3", "n2"),
                ("m-4", "n3"),
            ],
            &["n1", "n2", "n3"],
        );
        assert_eq!(even.member_to_move(&five, None), None);
        assert_eq!(
            even.shared(&five),
            None,
            "two to a node: one node lost leaves three of five"
        );
        let piled = spread(
            &[
                ("m-0", "n1"),
                ("m-1", "n1"),
                ("m-2", "n1"),
                ("m-3", "n2"),
                ("m-4", "n3"),
            ],
            &["n1", "n2", "n3"],
        );
        assert_eq!(
            piled.member_to_move(&five, None),
            Some(("m-2".into(), "n1".into(), "n2".into()))
        );
        assert_eq!(
            piled.shared(&five).as_deref(),
            Some("m-0 and m-1 and m-2 share node n1")
        );
    }
}
