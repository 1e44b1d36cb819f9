//! A change of the instances' pod (image, resources, settings on their command line, the
//! operator's own image) rolled out the way that costs the least: the StatefulSet updates no
//! pod by itself (`OnDelete`), and the operator restarts the replicas one at a time, each back
//! and streaming before the next, then switches over to an updated replica, then restarts the
//! old primary as a replica. A rolling change costs one switchover (a write gap, no commit),
//! never a failover, and never two; a database of one instance has no replica to switch to,
//! and its pod is restarted. Pure.
//!
//! Everything the next step needs is in the objects (each pod's revision, the StatefulSet's,
//! who holds the lease): an operator restarted at any point carries on from there.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use noops_api::postgres::{MemberStatus, Role};

use super::names::Names;
use super::observe;
use super::replication::{LAG_BOUND_BYTES, REPLICA, role_label};
use crate::core::rollout::runs_revision;

/// The next step of a rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Every instance runs the StatefulSet's revision (or the StatefulSet has not said which
    /// revision is current for its spec yet).
    Done,
    /// Not now, and why (an instance is restarting, not Ready, or catching up).
    Wait(String),
    /// Delete this pod: the StatefulSet makes it again on the new revision.
    Restart { pod: String, why: String },
    /// Every replica is updated: the primary steps down for this one.
    SwitchOver { to: String },
}

/// An outdated pod that cannot start (`stuck`), if any: restarted whatever else goes on (a
/// failover, a switchover, a rollout waiting), since it serves nothing and the new revision
/// may be what lets it start: a single instance whose bad image the user corrected, say. The
/// StatefulSet makes no pod of the new revision before the old one is gone.
pub fn stuck_outdated(revision: &str, pods: &BTreeMap<String, &Pod>, stuck: &BTreeSet<String>) -> Option<String> {
    pods.iter()
        .filter(|(name, pod)| stuck.contains(name.as_str()) && !runs_revision(pod, revision))
        .map(|(name, _)| name.clone())
        .next_back()
}

/// The instances as a rollout sees them.
pub struct Instances<'a> {
    /// Their pods, by name.
    pub pods: &'a BTreeMap<String, &'a Pod>,
    /// This pass's word of the primary on each (`replication::members`).
    pub members: &'a [MemberStatus],
    /// The pods that cannot start (`core::stuck`).
    pub stuck: &'a BTreeSet<String>,
    pub primary: &'a str,
    /// How many pods the StatefulSet keeps.
    pub wanted: i32,
}

/// The next step for `instances`, the StatefulSet at `revision`.
pub fn next(names: &Names, revision: &str, instances: &Instances) -> Step {
    let Instances {
        pods,
        members,
        stuck,
        primary,
        wanted,
    } = *instances;
    let outdated: Vec<&str> = pods
        .iter()
        .filter(|(_, pod)| !runs_revision(pod, revision))
        .map(|(name, _)| name.as_str())
        .collect();
    if outdated.is_empty() {
        return Step::Done;
    }
    if let Some((name, _)) = pods.iter().find(|(_, p)| p.metadata.deletion_timestamp.is_some()) {
        return Step::Wait(format!("{name} is stopping"));
    }
    if (pods.len() as i32) < wanted {
        return Step::Wait(format!("{} of {wanted} instances exist", pods.len()));
    }
    let member = |name: &str| members.iter().find(|m| m.name == name);
    let healthy = |name: &str| match member(name) {
        Some(m) if m.role == Role::Replica => role_label(m) == REPLICA,
        Some(m) => m.ready,
        None => false,
    };
    // An outdated replica that serves nothing (Ready and not streaming as it should; one that
    // cannot start is `stuck_outdated`'s) is restarted first: it may be what the new revision
    // fixes. One still starting is waited for, as the StatefulSet's own rolling update does.
    let replicas_outdated = outdated.iter().rev().filter(|name| **name != primary);
    let ready = |name: &str| pods.get(name).is_some_and(|p| observe::ready_address(p).is_some());
    let broken = |name: &&&str| ready(name) && !healthy(name);
    if let Some(broken) = replicas_outdated.clone().find(broken) {
        // Restarting it takes nothing that serves: only a pod still starting (the last one
        // restarted, say) is waited for. Several broken ones go one after another.
        if let Some(other) = pods
            .keys()
            .find(|n| n.as_str() != *broken && !ready(n) && !stuck.contains(n.as_str()))
        {
            return Step::Wait(format!("{other} is starting"));
        }
        return Step::Restart {
            pod: broken.to_string(),
            why: format!("{broken}, a replica that serves nothing now, on the new revision"),
        };
    }
    if let Some(unhealthy) = pods.keys().find(|n| !healthy(n)) {
        return Step::Wait(format!("{unhealthy} is not Ready and streaming yet"));
    }
    if let Some(replica) = replicas_outdated.clone().next() {
        return Step::Restart {
            pod: replica.to_string(),
            why: format!("{replica}, a replica, on the new revision (replicas one at a time, then one switchover)"),
        };
    }
    // Only the primary is left.
    let updated_replicas = pods
        .keys()
        .filter(|n| n.as_str() != primary && names.ordinal(n).is_some_and(|o| o < wanted))
        .filter_map(|n| member(n))
        .filter(|m| m.lag_bytes.unwrap_or(0) <= LAG_BOUND_BYTES);
    match updated_replicas.min_by_key(|m| (m.lag_bytes.unwrap_or(0), names.ordinal(&m.name))) {
        Some(to) => Step::SwitchOver { to: to.name.clone() },
        None if pods.len() == 1 => Step::Restart {
            pod: primary.to_string(),
            why: format!("{primary}, the only instance, on the new revision"),
        },
        None => Step::Wait(format!(
            "no updated replica within {} MiB of the primary to switch over to",
            LAG_BOUND_BYTES / (1024 * 1024)
        )),
    }
}

/// How long after the primary's lease changed hands no instance's pod is restarted: the
/// `<name>-rw` Service's endpoints move to the new primary first (the endpoint controller, then
/// every node's kube-proxy), so that no client's connection is sent to the former primary's
/// address once it is gone (a SYN there goes unanswered until the client's own timeout: seconds
/// added to a switchover's write gap).
pub const AFTER_HANDOVER: jiff::SignedDuration = jiff::SignedDuration::from_secs(3);

/// Why a restart waits, if it does: `lease` changed hands less than `AFTER_HANDOVER` ago (its
/// acquire time). The lease is the one the pass took the primary from, so a cache that lags
/// cannot show the former primary as a replica without also showing when it stopped being
/// the primary. Pure.
pub fn settling_after_handover(lease: Option<&Lease>, now: jiff::Timestamp) -> Option<String> {
    let spec = lease?.spec.as_ref()?;
    let since = spec.acquire_time.as_ref()?.0;
    (now < since + AFTER_HANDOVER).then(|| {
        format!(
            "the primary's lease passed to {} at {since}: the Services move to it before a pod goes",
            spec.holder_identity.as_deref().unwrap_or("nobody")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::rollout::REVISION_LABEL;
    use crate::postgres::fixtures::{self, names};

    fn pod(name: &str, revision: &str, ready: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": { REVISION_LABEL: revision } },
            "status": { "podIP": "10.0.0.5", "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }] },
        }))
        .unwrap()
    }

    fn member(name: &str, role: Role, streaming: bool, lag: i64) -> MemberStatus {
        let mut m = fixtures::member(name, role, lag);
        if role == Role::Replica {
            m.streaming = Some(streaming);
        }
        m
    }

    struct Case {
        pods: Vec<Pod>,
        members: Vec<MemberStatus>,
        stuck: BTreeSet<String>,
    }

    impl Case {
        fn three(revisions: [&str; 3], primary: usize) -> Self {
            let names = ["shop-0", "shop-1", "shop-2"];
            Self {
                pods: names.iter().zip(revisions).map(|(n, r)| pod(n, r, true)).collect(),
                members: names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| {
                        let role = if i == primary { Role::Primary } else { Role::Replica };
                        member(n, role, true, 0)
                    })
                    .collect(),
                stuck: BTreeSet::new(),
            }
        }

        fn next(&self, primary: &str) -> Step {
            self.next_of(primary, self.pods.len() as i32)
        }

        fn by_name(&self) -> BTreeMap<String, &Pod> {
            self.pods
                .iter()
                .map(|p| (p.metadata.name.clone().unwrap(), p))
                .collect()
        }

        fn stuck_outdated(&self) -> Option<String> {
            stuck_outdated("new", &self.by_name(), &self.stuck)
        }

        fn next_of(&self, primary: &str, wanted: i32) -> Step {
            let pods = self.by_name();
            let instances = Instances {
                pods: &pods,
                members: &self.members,
                stuck: &self.stuck,
                primary,
                wanted,
            };
            next(&names(), "new", &instances)
        }
    }

    #[test]
    fn replicas_go_first_highest_first_then_one_switchover_then_the_old_primary() {
        let mut case = Case::three(["old", "old", "old"], 1);
        assert!(matches!(case.next("shop-1"), Step::Restart { pod, .. } if pod == "shop-2"));
        case.pods[2] = pod("shop-2", "new", true);
        assert!(matches!(case.next("shop-1"), Step::Restart { pod, .. } if pod == "shop-0"));
        case.pods[0] = pod("shop-0", "new", true);
        case.members[0].lag_bytes = Some(100);
        assert_eq!(
            case.next("shop-1"),
            Step::SwitchOver { to: "shop-2".into() },
            "the replica least behind"
        );
        // Switched over: shop-2 is the primary, shop-1 an outdated replica.
        case.members[1] = member("shop-1", Role::Replica, true, 0);
        case.members[2] = member("shop-2", Role::Primary, true, 0);
        assert!(matches!(case.next("shop-2"), Step::Restart { pod, .. } if pod == "shop-1"));
        case.pods[1] = pod("shop-1", "new", true);
        assert_eq!(case.next("shop-2"), Step::Done);
    }

    #[test]
    fn one_at_a_time_each_back_and_streaming_before_the_next() {
        let mut case = Case::three(["old", "old", "new"], 0);
        // shop-2 restarted and streams not yet.
        case.members[2].streaming = Some(false);
        assert!(matches!(case.next("shop-0"), Step::Wait(why) if why.contains("shop-2")));
        // Far behind still.
        case.members[2] = member("shop-2", Role::Replica, true, LAG_BOUND_BYTES + 1);
        assert!(matches!(case.next("shop-0"), Step::Wait(_)));
        // Its pod not Ready.
        case.members[2] = member("shop-2", Role::Replica, true, 0);
        case.pods[2] = pod("shop-2", "new", false);
        case.members[2].ready = false;
        assert!(matches!(case.next("shop-0"), Step::Wait(_)));
        // Gone: the StatefulSet has not made it again yet.
        case.pods.remove(2);
        assert!(matches!(case.next_of("shop-0", 3), Step::Wait(why) if why.contains("2 of 3")));
    }

    #[test]
    fn a_pod_stopping_is_waited_for() {
        let mut case = Case::three(["old", "old", "old"], 0);
        case.pods[2].metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::UNIX_EPOCH,
        ));
        assert!(matches!(case.next("shop-0"), Step::Wait(why) if why.contains("shop-2 is stopping")));
    }

    #[test]
    fn an_outdated_replica_that_does_not_stream_is_restarted_at_once_unless_another_is_starting() {
        let mut case = Case::three(["old", "old", "old"], 0);
        case.members[1].streaming = Some(false);
        assert!(matches!(case.next("shop-0"), Step::Restart { pod, .. } if pod == "shop-1"));
        // Both replicas serve nothing (a setting the new revision fixes): one after another,
        // the highest first, never waiting for the other to stream.
        case.members[2].streaming = Some(false);
        assert!(matches!(case.next("shop-0"), Step::Restart { pod, .. } if pod == "shop-2"));
        case.pods[2] = pod("shop-2", "new", false);
        case.members[2].ready = false;
        assert!(
            matches!(case.next("shop-0"), Step::Wait(why) if why.contains("shop-2 is starting")),
            "the one restarted is waited for"
        );
        case.stuck.insert("shop-2".into());
        assert!(
            matches!(case.next("shop-0"), Step::Restart { pod, .. } if pod == "shop-1"),
            "a new revision that cannot start either holds no broken replica back"
        );
    }

    #[test]
    fn an_outdated_pod_still_starting_is_waited_for_and_one_stuck_is_restarted_primary_or_not() {
        let mut case = Case::three(["old", "old", "old"], 0);
        case.pods[2] = pod("shop-2", "old", false);
        case.members[2].ready = false;
        case.members[2].streaming = Some(false);
        assert!(matches!(case.next("shop-0"), Step::Wait(why) if why.contains("shop-2")));
        assert_eq!(case.stuck_outdated(), None, "starting, not stuck");
        case.stuck.insert("shop-2".into());
        assert_eq!(case.stuck_outdated().as_deref(), Some("shop-2"));
        // The only instance, on a bad image the user then corrected.
        let mut one = Case {
            pods: vec![pod("shop-0", "old", false)],
            members: vec![member("shop-0", Role::Primary, false, 0)],
            stuck: BTreeSet::from(["shop-0".to_string()]),
        };
        assert_eq!(one.stuck_outdated().as_deref(), Some("shop-0"));
        // Stuck on the new revision itself: nothing to restart it to.
        one.pods[0] = pod("shop-0", "new", false);
        assert_eq!(one.stuck_outdated(), None);
    }

    #[test]
    fn an_updated_replica_that_cannot_start_holds_the_rollout_and_the_primary_is_never_touched() {
        // The new image does not start: shop-2 on it is not Ready; shop-1 and the primary stay.
        let mut case = Case::three(["old", "old", "new"], 0);
        case.pods[2] = pod("shop-2", "new", false);
        case.members[2].ready = false;
        case.members[2].streaming = Some(false);
        for _ in 0..3 {
            assert!(matches!(case.next("shop-0"), Step::Wait(why) if why.contains("shop-2")));
        }
    }

    #[test]
    fn the_primary_steps_down_only_for_a_replica_close_enough() {
        let mut case = Case::three(["old", "new", "new"], 0);
        case.members[1].lag_bytes = Some(LAG_BOUND_BYTES + 1);
        case.members[2].lag_bytes = Some(LAG_BOUND_BYTES + 1);
        // Both too far behind: labelled behind, so not healthy: waited for.
        assert!(matches!(case.next("shop-0"), Step::Wait(_)));
    }

    #[test]
    fn one_instance_is_restarted_and_nothing_is_done_when_all_are_updated() {
        let one = Case {
            pods: vec![pod("shop-0", "old", true)],
            members: vec![member("shop-0", Role::Primary, false, 0)],
            stuck: BTreeSet::new(),
        };
        assert!(matches!(one.next("shop-0"), Step::Restart { pod, .. } if pod == "shop-0"));
        assert_eq!(Case::three(["new", "new", "new"], 2).next("shop-2"), Step::Done);
    }

    #[test]
    fn no_pod_is_restarted_until_the_services_followed_a_handover() {
        use k8s_openapi::api::coordination::v1::LeaseSpec;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        let handed: jiff::Timestamp = "2026-11-28T06:00:00Z".parse().unwrap();
        let lease = Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some("shop-1".into()),
                acquire_time: Some(MicroTime(handed)),
                ..Default::default()
            }),
            ..Default::default()
        };
        let at = |millis: i64| handed + jiff::SignedDuration::from_millis(millis);
        let why = settling_after_handover(Some(&lease), at(2900)).unwrap();
        assert!(why.contains("shop-1"), "{why}");
        assert_eq!(settling_after_handover(Some(&lease), at(3000)), None);
        // No lease (one instance), or one never acquired, holds nothing back.
        assert_eq!(settling_after_handover(None, at(0)), None);
        assert_eq!(settling_after_handover(Some(&Lease::default()), at(0)), None);
    }
}
