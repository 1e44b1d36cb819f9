//! Replicas, as one pass sees them and decides about them. Pure.
//!
//! - The primary keeps a physical replication slot for each replica the spec asks for
//!   (`noops_<pod>`), so that it keeps the WAL a replica has not received yet; a slot of an
//!   instance scaled away is dropped once no standby uses it.
//! - Each instance is a member of the status: its role, node, WAL positions and lag, read from
//!   the primary (`pg_stat_replication`), refreshed at most every [`MEMBERS_EVERY`] (a status
//!   write wakes the next pass: positions that move at every commit must not be written at
//!   every pass).
//! - Each pod carries its role in a label: `primary`; `replica` while it streams within the
//!   lag bound (behind `<name>-ro`); `replica-behind` otherwise.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use noops_api::postgres::{MemberStatus, Role};

use super::names::{Names, ROLE_LABEL};
use super::observe;
use super::sql::Replication;

/// How often the members' positions may be written into the status.
pub const MEMBERS_EVERY: Duration = Duration::from_secs(10);
/// A replica further behind than this (WAL it has not received) is not offered for reads.
pub const LAG_BOUND_BYTES: i64 = 16 * 1024 * 1024;

/// The role labels.
pub const PRIMARY: &str = "primary";
pub const REPLICA: &str = "replica";
pub const REPLICA_BEHIND: &str = "replica-behind";

/// The slots the primary `primary` keeps: one for every other instance the spec asks for.
pub fn wanted_slots(names: &Names, instances: i32, primary: &str) -> Vec<String> {
    (0..instances)
        .map(|i| names.instance_at(i))
        .filter(|pod| pod != primary)
        .map(|pod| Names::slot_of(&pod))
        .collect()
}

/// The slots to make and to drop, given those the primary has (and whether each is in use).
pub fn slot_changes(wanted: &[String], have: &[(String, bool)]) -> (Vec<String>, Vec<String>) {
    let make = wanted
        .iter()
        .filter(|w| !have.iter().any(|(h, _)| h == *w))
        .cloned()
        .collect();
    let drop = have
        .iter()
        .filter(|(h, active)| !active && !wanted.contains(h))
        .map(|(h, _)| h.clone())
        .collect();
    (make, drop)
}

/// The instance pods of the database (not its backup pods), by name.
pub fn instance_pods<'a>(names: &Names, pods: &'a [std::sync::Arc<Pod>]) -> BTreeMap<String, &'a Pod> {
    pods.iter()
        .filter_map(|p| {
            let name = p.metadata.name.clone()?;
            names.ordinal(&name)?;
            Some((name, p.as_ref()))
        })
        .collect()
}

/// Every instance as this pass sees it: its pod, and what the primary says of it.
pub fn members(
    pods: &BTreeMap<String, &Pod>,
    primary: &str,
    replication: Option<&Replication>,
    now: jiff::Timestamp,
) -> Vec<MemberStatus> {
    pods.iter()
        .map(|(name, pod)| {
            let ready = observe::ready_address(pod).is_some();
            let node = observe::node(pod);
            if name == primary {
                // Its position means something beside replicas; alone it would only change
                // the status at every commit.
                let position = replication.filter(|_| pods.len() > 1);
                return MemberStatus {
                    name: name.clone(),
                    role: Role::Primary,
                    node,
                    ready,
                    timeline: position.map(|r| r.timeline),
                    received_lsn: position.map(|r| r.current_lsn.clone()),
                    replayed_lsn: None,
                    lag_bytes: None,
                    lag_millis: None,
                    streaming: None,
                    observed_at: Some(Time(now)),
                };
            }
            let standby = replication.and_then(|r| r.standbys.iter().find(|s| &s.name == name));
            MemberStatus {
                name: name.clone(),
                role: Role::Replica,
                node,
                ready,
                timeline: None,
                received_lsn: standby.and_then(|s| s.flush_lsn.clone()),
                replayed_lsn: standby.and_then(|s| s.replay_lsn.clone()),
                lag_bytes: standby.and_then(|s| s.lag_bytes),
                lag_millis: standby.map(|s| s.replay_lag_millis.unwrap_or(0)),
                streaming: Some(standby.is_some_and(|s| s.state == "streaming")),
                observed_at: Some(Time(now)),
            }
        })
        .collect()
}

/// The members to write into the status: this pass's, if the last ones are older than
/// [`MEMBERS_EVERY`] or the instances changed otherwise than by their positions; else the
/// last ones.
pub fn paced(previous: &[MemberStatus], now_seen: Vec<MemberStatus>, now: jiff::Timestamp) -> Vec<MemberStatus> {
    let untimed = |m: &MemberStatus| MemberStatus {
        observed_at: None,
        ..m.clone()
    };
    let shape = |m: &MemberStatus| (m.name.clone(), m.role, m.node.clone(), m.ready, m.streaming);
    let unchanged = previous.iter().map(untimed).eq(now_seen.iter().map(untimed));
    let same_shape = previous.len() == now_seen.len() && previous.iter().map(shape).eq(now_seen.iter().map(shape));
    let fresh = previous
        .iter()
        .filter_map(|m| m.observed_at.as_ref())
        .all(|t| now < t.0 + MEMBERS_EVERY);
    // Nothing but the time moved: nothing to write.
    if unchanged || (same_shape && fresh && !previous.is_empty()) {
        previous.to_vec()
    } else {
        now_seen
    }
}

/// The role label member `m` should carry.
pub fn role_label(m: &MemberStatus) -> &'static str {
    match m.role {
        Role::Primary => PRIMARY,
        Role::Replica if m.ready && m.streaming == Some(true) && m.lag_bytes.unwrap_or(0) <= LAG_BOUND_BYTES => REPLICA,
        Role::Replica => REPLICA_BEHIND,
    }
}

/// The pods whose role label is not what it should be: (pod, label).
pub fn labels_to_set(pods: &BTreeMap<String, &Pod>, members: &[MemberStatus]) -> Vec<(String, &'static str)> {
    members
        .iter()
        .filter_map(|m| {
            let wanted = role_label(m);
            let has = pods
                .get(&m.name)
                .and_then(|p| p.metadata.labels.as_ref()?.get(ROLE_LABEL).cloned());
            (has.as_deref() != Some(wanted)).then(|| (m.name.clone(), wanted))
        })
        .collect()
}

/// Instances that are Ready: the primary serving, replicas streaming.
pub fn ready_instances(members: &[MemberStatus], primary_serves: bool, names: &Names, instances: i32) -> i32 {
    members
        .iter()
        // An instance scaled away still streams until its pod is gone: it is not counted.
        .filter(|m| m.role == Role::Primary || names.ordinal(&m.name).is_some_and(|i| i < instances))
        .filter(|m| match m.role {
            Role::Primary => primary_serves,
            Role::Replica => m.ready && m.streaming == Some(true),
        })
        .count() as i32
}

/// Instances that share a node, said: one node lost would take each group at once.
pub fn shared_nodes(members: &[MemberStatus]) -> Option<String> {
    let mut by_node: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for m in members {
        if let Some(node) = m.node.as_deref() {
            by_node.entry(node).or_default().push(&m.name);
        }
    }
    let shared: Vec<String> = by_node
        .iter()
        .filter(|(_, pods)| pods.len() > 1)
        .map(|(node, pods)| format!("{} share node {node}", pods.join(" and ")))
        .collect();
    (!shared.is_empty()).then(|| format!("{}: losing that node takes them together", shared.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::sql::Standby;
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus};

    use crate::postgres::fixtures::names;

    fn pod(name: &str, node: &str, ready: bool) -> std::sync::Arc<Pod> {
        std::sync::Arc::new(Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                pod_ip: Some("10.0.0.1".into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        })
    }

    #[test]
    fn the_primary_keeps_a_slot_per_replica_and_drops_one_scaled_away_once_unused() {
        let names = names();
        let wanted = wanted_slots(&names, 3, "shop-0");
        assert_eq!(wanted, vec!["noops_shop_1", "noops_shop_2"]);
        let have = vec![
            ("noops_shop_1".to_string(), true),
            ("noops_shop_3".to_string(), false),
            ("noops_shop_4".to_string(), true),
        ];
        let (make, drop) = slot_changes(&wanted, &have);
        assert_eq!(make, vec!["noops_shop_2"]);
        assert_eq!(drop, vec!["noops_shop_3"], "shop-4 still streams: its slot waits");
    }

    #[test]
    fn members_say_each_role_and_how_far_each_replica_is() {
        let names = names();
        let all = vec![
            pod("shop-0", "n1", true),
            pod("shop-1", "n2", true),
            pod("shop-2", "n2", true),
            pod("shop-db-base", "n3", true),
        ];
        let pods = instance_pods(&names, &all);
        assert_eq!(pods.len(), 3, "the backup pod is not an instance");
        let replication = Replication {
            current_lsn: "0/5000000".into(),
            timeline: 1,
            standbys: vec![
                Standby {
                    name: "shop-1".into(),
                    state: "streaming".into(),
                    flush_lsn: Some("0/5000000".into()),
                    replay_lsn: Some("0/4FFFF00".into()),
                    lag_bytes: Some(0),
                    replay_lag_millis: Some(12),
                    reply_age_millis: Some(300),
                },
                Standby {
                    name: "shop-2".into(),
                    state: "streaming".into(),
                    flush_lsn: Some("0/3000000".into()),
                    lag_bytes: Some(32 * 1024 * 1024),
                    ..Default::default()
                },
            ],
            slots: vec![],
            synchronous_standby_names: String::new(),
        };
        let now = jiff::Timestamp::now();
        let members = members(&pods, "shop-0", Some(&replication), now);
        assert_eq!(members[0].role, Role::Primary);
        assert_eq!(members[0].received_lsn.as_deref(), Some("0/5000000"));
        assert_eq!(members[1].lag_millis, Some(12));
        let labels: Vec<&str> = members.iter().map(role_label).collect();
        assert_eq!(
            labels,
            vec![PRIMARY, REPLICA, REPLICA_BEHIND],
            "shop-2 is 32 MiB behind"
        );
        assert_eq!(ready_instances(&members, true, &names, 3), 3);
        assert_eq!(
            ready_instances(&members, true, &names, 2),
            2,
            "shop-2, scaled away, is not counted while it goes"
        );
        assert_eq!(
            shared_nodes(&members).unwrap(),
            "shop-1 and shop-2 share node n2: losing that node takes them together"
        );
        let to_set = labels_to_set(&pods, &members);
        assert_eq!(to_set.len(), 3, "none labelled yet");
    }

    #[test]
    fn positions_are_written_at_most_every_ten_seconds_but_a_change_of_role_or_readiness_at_once() {
        let names = names();
        let all = vec![pod("shop-0", "n1", true), pod("shop-1", "n2", true)];
        let pods = instance_pods(&names, &all);
        let t0 = jiff::Timestamp::now();
        let first = members(&pods, "shop-0", None, t0);
        let soon = t0 + jiff::SignedDuration::from_secs(3);
        let mut moved = members(&pods, "shop-0", None, soon);
        moved[0].received_lsn = Some("0/6000000".into());
        assert_eq!(paced(&first, moved.clone(), soon), first, "only positions moved");
        let later = t0 + jiff::SignedDuration::from_secs(11);
        assert_eq!(paced(&first, moved.clone(), later), moved);
        let idle = members(&pods, "shop-0", None, later);
        assert_eq!(
            paced(&first, idle, later),
            first,
            "only the time moved: nothing to write"
        );
        let not_ready = vec![pod("shop-0", "n1", true), pod("shop-1", "n2", false)];
        let changed = members(&instance_pods(&names, &not_ready), "shop-0", None, soon);
        assert_eq!(paced(&first, changed.clone(), soon), changed);
    }
}
