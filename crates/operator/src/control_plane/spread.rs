//! Replicas apart. The pods of a component (API servers, controller-managers, schedulers)
//! prefer different nodes, but those made while other nodes were down or cordoned land
//! together, and the scheduler never moves a running pod: one node failure then takes every
//! API server with it. Once every replica of a component is Ready and has settled, and a node
//! that could hold one holds at least two fewer than the most crowded node, one replica of
//! that node is evicted; its Deployment makes another, which prefers the nodes without one.
//! One move at a time; until then the status says which pods share a node. Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};

use super::names::Component;
use crate::core::nodes::{admitted_selector, could_hold};

/// How long after its youngest pod was made a component's pods may be moved: a replacement
/// settles first, and one the scheduler still put beside another is not chased faster.
pub const SETTLE: Duration = Duration::from_secs(15);

/// How soon a control plane whose pods share a node looks again (a node that comes back or
/// is uncordoned wakes nothing here).
pub const RECHECK: Duration = Duration::from_secs(20);

/// One pod of a component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub node: String,
    pub ready: bool,
    /// Made within [`SETTLE`].
    pub young: bool,
}

/// Where each component's pods are, and which nodes could hold one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spread {
    /// The bound pods of each component (not being deleted), by pod name.
    pub pods: BTreeMap<Component, BTreeMap<String, Placed>>,
    /// Nodes that could hold a pod of the control plane now (Ready, not cordoned, no taint
    /// it does not tolerate: its pods tolerate none; the pods' admitted node selector met).
    pub eligible: BTreeSet<String>,
}

/// A pod to move: (component, pod, its node, a node that could take it).
pub type Move = (Component, String, String, String);

impl Spread {
    /// The spread of `pods` (a component's, by component) over `nodes`.
    pub fn of(pods: &BTreeMap<Component, Vec<&Pod>>, nodes: &[std::sync::Arc<Node>], now: jiff::Timestamp) -> Self {
        // Every component's pods are made in one namespace from one spec: the youngest pod's
        // admitted node selector is theirs.
        let selector = admitted_selector(pods.values().flatten().copied());
        let placed = |pod: &Pod| -> Option<(String, Placed)> {
            if pod.metadata.deletion_timestamp.is_some() {
                return None;
            }
            let ready = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let young = pod
                .metadata
                .creation_timestamp
                .as_ref()
                .is_some_and(|made| Duration::try_from(now.duration_since(made.0)).unwrap_or_default() < SETTLE);
            Some((
                pod.metadata.name.clone()?,
                Placed {
                    node: pod.spec.as_ref()?.node_name.clone()?,
                    ready,
                    young,
                },
            ))
        };
        Self {
            pods: pods
                .iter()
                .map(|(c, pods)| (*c, pods.iter().filter_map(|p| placed(p)).collect()))
                .collect(),
            eligible: nodes
                .iter()
                .filter(|n| could_hold(n, &[], None, &selector))
                .filter_map(|n| n.metadata.name.clone())
                .collect(),
        }
    }

    /// A component's pods by node, the eligible nodes with none included.
    fn by_node(&self, component: Component) -> BTreeMap<&str, Vec<&str>> {
        let mut by_node: BTreeMap<&str, Vec<&str>> = self.eligible.iter().map(|n| (n.as_str(), Vec::new())).collect();
        for (pod, placed) in self.pods.get(&component).into_iter().flatten() {
            by_node.entry(placed.node.as_str()).or_default().push(pod.as_str());
        }
        by_node
    }

    /// The move that spreads `component`'s pods, whether or not they may move now.
    fn move_of(&self, component: Component) -> Option<Move> {
        let by_node = self.by_node(component);
        let (crowded, pods) = by_node
            .iter()
            .max_by_key(|(node, pods)| (pods.len(), std::cmp::Reverse(**node)))?;
        let (free, _) = by_node
            .iter()
            .filter(|(node, _)| self.eligible.contains(**node))
            .min_by_key(|(node, pods)| (pods.len(), **node))?;
        let fewer = by_node[free].len();
        (pods.len() >= fewer + 2).then(|| {
            let pod = pods.iter().max().copied().unwrap_or_default();
            (component, pod.to_string(), crowded.to_string(), free.to_string())
        })
    }

    /// Which pods share a node, "kcp-apiserver-a and kcp-apiserver-b share node n1", for every
    /// component whose pods could be spread out (`fixable`), or for every component.
    fn said(&self, fixable: bool) -> Option<String> {
        let said: Vec<String> = Component::ALL
            .into_iter()
            .filter(|c| !fixable || self.move_of(*c).is_some())
            .flat_map(|c| {
                self.by_node(c)
                    .into_iter()
                    .filter(|(_, pods)| pods.len() > 1)
                    .map(|(node, pods)| format!("{} share node {node}", pods.join(" and ")))
                    .collect::<Vec<_>>()
            })
            .collect();
        (!said.is_empty()).then(|| said.join("; "))
    }

    /// The pods that share a node while another could take one of them.
    pub fn shared(&self) -> Option<String> {
        self.said(true)
    }

    /// The pods that share a node, whether or not another could take one.
    pub fn together(&self) -> Option<String> {
        self.said(false)
    }

    /// The pod to move now: of the first component (API servers first) whose pods could be
    /// spread, once each of its `replicas` pods is there, Ready and settled. None while any
    /// component is short of a Ready pod, so that one move ends before the next begins.
    pub fn pod_to_move(&self, replicas: impl Fn(Component) -> i32) -> Option<Move> {
        let whole = |c: Component| {
            let pods = self.pods.get(&c);
            pods.map_or(0, |p| p.len()) == usize::try_from(replicas(c)).unwrap_or_default()
                && pods.into_iter().flatten().all(|(_, p)| p.ready && !p.young)
        };
        if !Component::ALL.into_iter().all(whole) {
            return None;
        }
        Component::ALL.into_iter().find_map(|c| self.move_of(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spread(api_servers: &[(&str, &str, bool)], eligible: &[&str]) -> Spread {
        let placed = |list: &[(&str, &str, bool)]| {
            list.iter()
                .map(|(pod, node, ready)| {
                    (
                        pod.to_string(),
                        Placed {
                            node: node.to_string(),
                            ready: *ready,
                            young: false,
                        },
                    )
                })
                .collect()
        };
        Spread {
            pods: BTreeMap::from([
                (Component::ApiServer, placed(api_servers)),
                (
                    Component::ControllerManager,
                    placed(&[("cm-a", "n1", true), ("cm-b", "n2", true)]),
                ),
                (
                    Component::Scheduler,
                    placed(&[("s-a", "n2", true), ("s-b", "n3", true)]),
                ),
            ]),
            eligible: eligible.iter().map(|n| n.to_string()).collect(),
        }
    }

    fn replicas(c: Component) -> i32 {
        if c == Component::ApiServer { 3 } else { 2 }
    }

    #[test]
    fn three_api_servers_on_one_node_move_one_at_a_time_to_the_empty_nodes() {
        let together = spread(
            &[("a", "n1", true), ("b", "n1", true), ("c", "n1", true)],
            &["n1", "n2", "n3"],
        );
        assert_eq!(
            together.pod_to_move(replicas),
            Some((Component::ApiServer, "c".into(), "n1".into(), "n2".into()))
        );
        assert_eq!(together.shared().as_deref(), Some("a and b and c share node n1"));
        // The replacement is not Ready yet: nothing else moves.
        let moving = spread(
            &[("a", "n1", true), ("b", "n1", true), ("d", "n2", false)],
            &["n1", "n2", "n3"],
        );
        assert_eq!(moving.pod_to_move(replicas), None);
        // Two on n1, one on n2, none on n3: one more move.
        let half = spread(
            &[("a", "n1", true), ("b", "n1", true), ("d", "n2", true)],
            &["n1", "n2", "n3"],
        );
        assert_eq!(
            half.pod_to_move(replicas),
            Some((Component::ApiServer, "b".into(), "n1".into(), "n3".into()))
        );
        let apart = spread(
            &[("a", "n1", true), ("d", "n2", true), ("e", "n3", true)],
            &["n1", "n2", "n3"],
        );
        assert_eq!(apart.pod_to_move(replicas), None);
        assert_eq!(apart.shared(), None);
    }

    #[test]
    fn pods_that_share_a_node_no_other_could_take_stay_and_are_not_called_fixable() {
        // n3 is down (not eligible): two on n1 and one on n2 is as spread as it gets.
        let two_nodes = spread(
            &[("a", "n1", true), ("b", "n1", true), ("d", "n2", true)],
            &["n1", "n2"],
        );
        assert_eq!(two_nodes.pod_to_move(replicas), None);
        assert_eq!(two_nodes.shared(), None);
        assert_eq!(two_nodes.together().as_deref(), Some("a and b share node n1"));
        // A pod on a node that is down counts where it is bound, yet the move waits for it to
        // be Ready (a node that is down is the node controller's, then the Deployment's).
        let one_down = spread(
            &[("a", "n1", true), ("b", "n1", true), ("c", "n3", false)],
            &["n1", "n2"],
        );
        assert_eq!(one_down.pod_to_move(replicas), None);
    }

    #[test]
    fn no_move_while_a_component_is_short_or_young() {
        let mut short = spread(&[("a", "n1", true), ("b", "n1", true)], &["n1", "n2", "n3"]);
        assert_eq!(short.pod_to_move(replicas), None, "two of three API servers");
        short.pods.get_mut(&Component::ApiServer).unwrap().insert(
            "c".into(),
            Placed {
                node: "n1".into(),
                ready: true,
                young: true,
            },
        );
        assert_eq!(short.pod_to_move(replicas), None, "one just made");
        assert!(short.shared().is_some(), "said while it waits");
    }

    #[test]
    fn controllers_move_after_the_api_servers() {
        let mut s = spread(
            &[("a", "n1", true), ("d", "n2", true), ("e", "n3", true)],
            &["n1", "n2", "n3"],
        );
        s.pods.insert(
            Component::ControllerManager,
            BTreeMap::from([
                (
                    "cm-a".into(),
                    Placed {
                        node: "n2".into(),
                        ready: true,
                        young: false,
                    },
                ),
                (
                    "cm-b".into(),
                    Placed {
                        node: "n2".into(),
                        ready: true,
                        young: false,
                    },
                ),
            ]),
        );
        assert_eq!(
            s.pod_to_move(replicas),
            Some((Component::ControllerManager, "cm-b".into(), "n2".into(), "n1".into()))
        );
    }
}
