//! The rollout planner (`rollout.rs`) against a pod cache that lags: every pass may see the
//! pods as they were up to two steps earlier (what a watch cache shows a moment late), while
//! what the primary says of its replicas is this pass's. Whatever the lag, at every step of
//! the world at most one instance is unavailable, the primary's pod is never deleted while it
//! is the primary, and the rollout ends with every instance on the new revision after one
//! switchover.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use noops_api::postgres::{MemberStatus, Role};

use super::fixtures::{self, names};
use super::rollout::{Instances, Step, next};
use crate::core::rollout::REVISION_LABEL;

/// Where one instance's pod is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Ready; a replica streams.
    Up,
    /// Deleted: its server stops.
    Stopping,
    /// Gone; the StatefulSet has not made it again yet.
    Absent,
    /// Made again on the new revision, not Ready yet.
    Starting,
    /// Ready, not streaming yet (a replica catching up, or an old primary following anew).
    Behind,
}

#[derive(Debug, Clone)]
struct Instance {
    revision: &'static str,
    uid: u32,
    phase: Phase,
}

#[derive(Debug, Clone)]
struct World {
    instances: Vec<Instance>,
    primary: usize,
    switchovers: usize,
    next_uid: u32,
}

impl World {
    fn new() -> Self {
        let up = |uid| Instance {
            revision: "old",
            uid,
            phase: Phase::Up,
        };
        Self {
            instances: vec![up(0), up(1), up(2)],
            primary: 0,
            switchovers: 0,
            next_uid: 3,
        }
    }

    /// Each pod one step further along.
    fn advance(&mut self) {
        for instance in &mut self.instances {
            instance.phase = match instance.phase {
                Phase::Stopping => Phase::Absent,
                Phase::Absent => {
                    instance.revision = "new";
                    instance.uid = self.next_uid;
                    self.next_uid += 1;
                    Phase::Starting
                }
                Phase::Starting => Phase::Behind,
                Phase::Behind | Phase::Up => Phase::Up,
            };
        }
    }

    /// The pods as a watch cache holds them.
    fn pods(&self) -> Vec<Pod> {
        self.instances
            .iter()
            .enumerate()
            .filter(|(_, i)| i.phase != Phase::Absent)
            .map(|(o, i)| {
                let ready = matches!(i.phase, Phase::Up | Phase::Behind);
                serde_json::from_value(serde_json::json!({
                    "metadata": {
                        "name": format!("shop-{o}"),
                        "uid": i.uid.to_string(),
                        "labels": { REVISION_LABEL: i.revision },
                        "deletionTimestamp": (i.phase == Phase::Stopping).then_some("2026-11-27T10:00:00Z"),
                    },
                    "status": { "podIP": "10.0.0.5", "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }] },
                }))
                .unwrap()
            })
            .collect()
    }

    /// What the primary says of each instance now, readiness as the cache `seen` has it.
    fn members(&self, seen: &[Pod]) -> Vec<MemberStatus> {
        seen.iter()
            .map(|p| {
                let name = p.metadata.name.clone().unwrap();
                let o: usize = name.trim_start_matches("shop-").parse().unwrap();
                let role = if o == self.primary {
                    Role::Primary
                } else {
                    Role::Replica
                };
                let mut m = fixtures::member(&name, role, 0);
                m.ready = super::observe::ready_address(p).is_some();
                if role == Role::Replica {
                    m.streaming = Some(self.instances[o].phase == Phase::Up);
                }
                m
            })
            .collect()
    }

    fn unavailable(&self) -> usize {
        self.instances.iter().filter(|i| i.phase != Phase::Up).count()
    }

    fn done(&self) -> bool {
        self.instances
            .iter()
            .all(|i| i.revision == "new" && i.phase == Phase::Up)
    }

    /// Carries out `step`, planned on pods `seen`, as the API server would.
    fn act(&mut self, step: &Step, seen: &[Pod]) {
        match step {
            Step::Restart { pod, .. } => {
                let o: usize = pod.trim_start_matches("shop-").parse().unwrap();
                assert_ne!(o, self.primary, "the primary's pod deleted while it is the primary");
                let judged = seen.iter().find(|p| p.metadata.name.as_deref() == Some(pod.as_str()));
                let uid = judged.and_then(|p| p.metadata.uid.clone()).unwrap();
                let instance = &mut self.instances[o];
                // The delete's uid precondition: a pod made since is not the one judged.
                if instance.uid.to_string() == uid && instance.phase != Phase::Absent {
                    instance.phase = Phase::Stopping;
                }
            }
            Step::SwitchOver { to } => {
                let o: usize = to.trim_start_matches("shop-").parse().unwrap();
                // The switchover's own check, against the primary itself.
                if self.instances[o].phase == Phase::Up {
                    self.instances[self.primary].phase = Phase::Behind;
                    self.primary = o;
                    self.switchovers += 1;
                }
            }
            Step::Wait(_) | Step::Done => {}
        }
    }
}

/// Runs a rollout where pass `i` sees the pods `lags[i % lags.len()]` steps late.
fn roll(lags: &[usize]) -> World {
    let names = names();
    let mut world = World::new();
    let mut history: Vec<Vec<Pod>> = vec![world.pods()];
    for pass in 0..60 {
        if world.done() {
            return world;
        }
        let lag = lags[pass % lags.len()].min(history.len() - 1);
        let seen = history[history.len() - 1 - lag].clone();
        let members = world.members(&seen);
        let pods: BTreeMap<String, &Pod> = seen.iter().map(|p| (p.metadata.name.clone().unwrap(), p)).collect();
        let primary = format!("shop-{}", world.primary);
        let step = next(
            &names,
            "new",
            &Instances {
                pods: &pods,
                members: &members,
                stuck: &BTreeSet::new(),
                primary: &primary,
                wanted: 3,
            },
        );
        world.act(&step, &seen);
        assert!(
            world.unavailable() <= 1,
            "two instances down at once after {step:?} (lags {lags:?}): {world:?}"
        );
        world.advance();
        history.push(world.pods());
    }
    panic!("the rollout did not end (lags {lags:?}): {:?}", world);
}

#[test]
fn at_most_one_instance_is_down_whatever_the_cache_lag_and_one_switchover_ends_it() {
    let mut schedules: Vec<Vec<usize>> = Vec::new();
    for a in 0..3 {
        for b in 0..3 {
            for c in 0..3 {
                for d in 0..3 {
                    schedules.push(vec![a, b, c, d]);
                }
            }
        }
    }
    for lags in schedules {
        let world = roll(&lags);
        assert_eq!(world.switchovers, 1, "lags {lags:?}");
    }
}
