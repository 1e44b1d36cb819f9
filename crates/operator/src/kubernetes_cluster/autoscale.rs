//! Pools that scale themselves (`minReplicas`/`maxReplicas`), as a cluster autoscaler does. Pure.
//!
//! Up: tenant pods the scheduler has found no room for (Unschedulable) for more than
//! [`PENDING_GRACE`] are packed, largest first, into the machines a pool is already making and
//! then into new machines of the first pool (in the order listed) whose flavor holds them, up to
//! its `maxReplicas`. A pod no pool's flavor can hold is reported and makes no machine; a pod
//! that would need a pool past its maximum is reported too.
//!
//! Down: a Ready machine that holds no pod but DaemonSet and static pods is idle; one idle for
//! the pool's `scaleDownDelaySeconds` is marked to go first and the pool shrinks by it, never
//! below `minReplicas`. A pool that grows, rolls, or could hold a pod waiting for room does not
//! shrink. When each machine became idle is kept in the cluster's status, so a restarted
//! operator counts on from there.

use std::collections::BTreeMap;
use std::time::Duration;

use noops_api::kubernetes_cluster::WorkerPoolSpec;

/// How long a pod must have found no room before a pool grows for it (the scheduler retries
/// in between, and a machine just made may take it).
pub const PENDING_GRACE: Duration = Duration::from_secs(5);

/// CPU (millicores), memory (bytes) and pod slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resources {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub pods: i64,
}

impl Resources {
    /// What one machine of `pool`'s flavor offers.
    pub fn of_pool(pool: &WorkerPoolSpec) -> Self {
        Self {
            cpu_millis: i64::from(pool.flavor.cpu) * 1000,
            memory_bytes: pool
                .flavor
                .memory_mib()
                .map_or(0, |m| i64::try_from(m * 1024 * 1024).unwrap_or(i64::MAX)),
            pods: i64::from(pool.flavor.pods),
        }
    }

    fn holds(&self, other: &Resources) -> bool {
        self.cpu_millis >= other.cpu_millis && self.memory_bytes >= other.memory_bytes && self.pods >= other.pods
    }

    fn take(&mut self, other: &Resources) {
        self.cpu_millis -= other.cpu_millis;
        self.memory_bytes -= other.memory_bytes;
        self.pods -= other.pods;
    }
}

/// A tenant pod the scheduler found no room for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingPod {
    /// `<namespace>/<name>`.
    pub name: String,
    /// What it asks for (one pod slot included).
    pub requests: Resources,
    /// How long it has been Unschedulable.
    pub pending_for: Duration,
}

/// What runs on a Ready Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeUse {
    /// It holds a pod other than a DaemonSet's or a static one.
    pub busy: bool,
    /// What its pods ask for.
    pub used: Resources,
}

/// A pool that scales itself, as it is.
#[derive(Debug, Clone)]
pub struct ScalingPool<'a> {
    pub spec: &'a WorkerPoolSpec,
    /// Its machines asked for now (its MachineDeployment's replicas).
    pub replicas: i32,
    /// Its machines whose Nodes are Ready, by Node name.
    pub ready: BTreeMap<String, NodeUse>,
    /// Its machines lost (a VM failed, a Node whose kubelet stopped reporting): no room on the
    /// way, unlike machines still being made or just joined.
    pub lost: usize,
    /// It is rolling to a new version or flavor.
    pub rolling: bool,
}

/// What the autoscaler decided this pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// The machines each pool that changes should have.
    pub replicas: BTreeMap<String, i32>,
    /// Machines (Node names) to mark to go first, as their pools shrink.
    pub remove: Vec<String>,
    /// Per pool: its idle machines and since when.
    pub idle_since: BTreeMap<String, BTreeMap<String, jiff::Timestamp>>,
    /// Pools grown: (pool, from, to, the pods it grew for).
    pub grew: Vec<(String, i32, i32, Vec<String>)>,
    /// Pools shrunk: (pool, from, to, the idle machines removed).
    pub shrank: Vec<(String, i32, i32, Vec<String>)>,
    /// Pods no pool's flavor can hold.
    pub unfit: Vec<String>,
    /// Pods that need a pool already at its maximum: (pod, pool).
    pub at_max: Vec<(String, String)>,
    /// When to look again for a pod or an idle machine whose time has not come yet.
    pub look_again: Option<Duration>,
}

fn sooner(a: Option<Duration>, b: Duration) -> Option<Duration> {
    Some(a.map_or(b, |a| a.min(b)))
}

/// The decision for `pools` (in the spec's order), the pods waiting for room, and when each
/// machine was last seen to become idle (from the status).
pub fn decide(
    pools: &[ScalingPool],
    pending: &[PendingPod],
    idle_before: &BTreeMap<String, BTreeMap<String, jiff::Timestamp>>,
    now: jiff::Timestamp,
) -> Decision {
    let mut decision = Decision::default();
    let added = scale_up(pools, pending, &mut decision);
    // Pools whose flavor holds a pod waiting for room (in its grace or not) do not shrink, nor
    // do those that just grew.
    for (i, pool) in pools.iter().enumerate() {
        let wanted = pending
            .iter()
            .any(|pod| Resources::of_pool(pool.spec).holds(&pod.requests));
        scale_down(pool, added[i] > 0 || wanted, idle_before, now, &mut decision);
    }
    decision
}

/// Up: each pod past its grace goes where there is room (on Ready machines the scheduler may
/// not have tried yet, or on machines being made), else grows the first pool whose flavor
/// holds it and that is below its maximum. Returns the machines added per pool.
fn scale_up(pools: &[ScalingPool], pending: &[PendingPod], decision: &mut Decision) -> Vec<i32> {
    let mut due: Vec<&PendingPod> = Vec::new();
    for pod in pending {
        match PENDING_GRACE.checked_sub(pod.pending_for) {
            Some(left) if !left.is_zero() => decision.look_again = sooner(decision.look_again, left),
            _ => due.push(pod),
        }
    }
    due.sort_by_key(|p| std::cmp::Reverse((p.requests.cpu_millis, p.requests.memory_bytes)));
    let mut room = room_on_the_way(pools);
    let mut added = vec![0i32; pools.len()];
    let mut grew_for: Vec<Vec<String>> = vec![Vec::new(); pools.len()];
    for pod in &due {
        let fitting: Vec<usize> = (0..pools.len())
            .filter(|i| Resources::of_pool(pools[*i].spec).holds(&pod.requests))
            .collect();
        if fitting.is_empty() {
            decision.unfit.push(pod.name.clone());
            continue;
        }
        if let Some((_, free)) = room
            .iter_mut()
            .find(|(i, free)| fitting.contains(i) && free.holds(&pod.requests))
        {
            free.take(&pod.requests);
            continue;
        }
        let max = |i: usize| pools[i].spec.max_replicas.unwrap_or(pools[i].replicas);
        match fitting.iter().find(|i| pools[**i].replicas + added[**i] < max(**i)) {
            Some(&i) => {
                added[i] += 1;
                grew_for[i].push(pod.name.clone());
                let mut free = Resources::of_pool(pools[i].spec);
                free.take(&pod.requests);
                room.push((i, free));
            }
            None => decision
                .at_max
                .push((pod.name.clone(), pools[fitting[0]].spec.name.clone())),
        }
    }
    for (i, pool) in pools.iter().enumerate() {
        if added[i] > 0 {
            let to = pool.replicas + added[i];
            decision.replicas.insert(pool.spec.name.clone(), to);
            decision.grew.push((
                pool.spec.name.clone(),
                pool.replicas,
                to,
                std::mem::take(&mut grew_for[i]),
            ));
        }
    }
    added
}

/// The room left on each pool's Ready machines, then its machines being made (empty machines
/// of its flavor): (pool index, room).
fn room_on_the_way(pools: &[ScalingPool]) -> Vec<(usize, Resources)> {
    let mut room: Vec<(usize, Resources)> = Vec::new();
    for (i, p) in pools.iter().enumerate() {
        for node in p.ready.values() {
            let mut free = Resources::of_pool(p.spec);
            free.take(&node.used);
            room.push((i, free));
        }
        let coming = usize::try_from(p.replicas)
            .unwrap_or(0)
            .saturating_sub(p.ready.len() + p.lost);
        room.extend(std::iter::repeat_n((i, Resources::of_pool(p.spec)), coming));
    }
    room
}

/// Down: a pool's machines idle past its delay go, the longest idle first, down to its
/// minimum; unless `held` (it grew, or a waiting pod fits its flavor), it rolls, or a removal
/// is under way. Records every pool's idle machines either way.
fn scale_down(
    pool: &ScalingPool,
    held: bool,
    idle_before: &BTreeMap<String, BTreeMap<String, jiff::Timestamp>>,
    now: jiff::Timestamp,
    decision: &mut Decision,
) {
    let name = &pool.spec.name;
    let before = idle_before.get(name);
    let idle: BTreeMap<String, jiff::Timestamp> = pool
        .ready
        .iter()
        .filter(|(_, node)| !node.busy)
        .map(|(node, _)| {
            let since = before.and_then(|b| b.get(node)).copied().unwrap_or(now);
            (node.clone(), since)
        })
        .collect();
    if !idle.is_empty() {
        decision.idle_since.insert(name.clone(), idle.clone());
    }
    let min = pool.spec.min_replicas.unwrap_or(pool.replicas);
    // More Ready machines than asked for: a removal is under way (its machine may not look
    // marked yet); the next one waits for it.
    let removing = pool.ready.len() > usize::try_from(pool.replicas).unwrap_or(0);
    if held || pool.rolling || removing || pool.replicas <= min {
        return;
    }
    let delay = jiff::SignedDuration::from_secs(pool.spec.scale_down_delay_seconds.max(0));
    let mut due: Vec<(&String, &jiff::Timestamp)> = idle.iter().filter(|(_, since)| **since + delay <= now).collect();
    due.sort_by_key(|(node, since)| (**since, (*node).clone()));
    for (_, since) in idle.iter().filter(|(_, since)| **since + delay > now) {
        let left = Duration::try_from(*since + delay - now).unwrap_or(Duration::ZERO);
        decision.look_again = sooner(decision.look_again, left.max(Duration::from_secs(1)));
    }
    let removable = usize::try_from(pool.replicas - min).unwrap_or(0).min(due.len());
    if removable == 0 {
        return;
    }
    let going: Vec<String> = due.iter().take(removable).map(|(n, _)| (*n).clone()).collect();
    let to = pool.replicas - removable as i32;
    decision.replicas.insert(name.clone(), to);
    decision.remove.extend(going.iter().cloned());
    decision.shrank.push((name.clone(), pool.replicas, to, going));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes_cluster::fixtures::cluster;

    const CPU: i64 = 1000;

    fn pod(name: &str, cpu_millis: i64, pending_secs: u64) -> PendingPod {
        PendingPod {
            name: format!("default/{name}"),
            requests: Resources {
                cpu_millis,
                memory_bytes: 64 * 1024 * 1024,
                pods: 1,
            },
            pending_for: Duration::from_secs(pending_secs),
        }
    }

    /// Ready Nodes: busy ones hold a pod of 1.5 CPU.
    fn ready(nodes: &[(&str, bool)]) -> BTreeMap<String, NodeUse> {
        nodes
            .iter()
            .map(|(n, busy)| {
                let used = if *busy {
                    pod("x", 1500, 0).requests
                } else {
                    Resources::default()
                };
                (n.to_string(), NodeUse { busy: *busy, used })
            })
            .collect()
    }

    #[test]
    fn pods_that_found_no_room_grow_the_first_pool_that_holds_them_within_its_maximum() {
        // Flavors of 2 CPUs: pods of 1.5 CPU take a machine each.
        let kc = cluster(
            "1.34",
            "[{ name: small, minReplicas: 1, maxReplicas: 2, flavor: { cpu: 1 } }, { name: burst, minReplicas: 1, maxReplicas: 3 }]",
        );
        let pools = [
            ScalingPool {
                spec: &kc.spec.workers[0],
                replicas: 1,
                ready: ready(&[("small-1", true)]),
                rolling: false,
                lost: 0,
            },
            ScalingPool {
                spec: &kc.spec.workers[1],
                replicas: 1,
                ready: ready(&[("burst-1", true)]),
                rolling: false,
                lost: 0,
            },
        ];
        let now = jiff::Timestamp::now();
        let pending = [
            pod("a", 1500, 10),
            pod("b", 1500, 10),
            pod("c", 1500, 10),
            pod("d", 1500, 2),
        ];
        let d = decide(&pools, &pending, &BTreeMap::new(), now);
        // Only burst's flavor holds them; it may add 2; the third is reported; d waits its grace.
        assert_eq!(d.replicas, BTreeMap::from([("burst".to_string(), 3)]));
        assert_eq!(d.grew.len(), 1);
        assert_eq!(d.at_max.len(), 1, "{d:?}");
        assert_eq!(d.at_max[0].1, "burst");
        assert_eq!(d.look_again, Some(Duration::from_secs(3)));
        assert!(d.remove.is_empty());
    }

    #[test]
    fn machines_being_made_are_counted_before_new_ones_and_small_pods_share_a_machine() {
        let kc = cluster("1.34", "[{ name: burst, minReplicas: 1, maxReplicas: 5 }]");
        let pools = [ScalingPool {
            spec: &kc.spec.workers[0],
            // One machine on its way already.
            replicas: 2,
            ready: ready(&[("burst-1", true)]),
            rolling: false,
            lost: 0,
        }];
        let pending = [
            pod("a", 500, 10),
            pod("b", 500, 10),
            pod("c", 500, 10),
            pod("d", 500, 10),
        ];
        let d = decide(&pools, &pending, &BTreeMap::new(), jiff::Timestamp::now());
        assert_eq!(d.replicas, BTreeMap::new(), "the machine on its way holds all four");
        let more = [pod("a", 1500, 10), pod("b", 1500, 10)];
        let d = decide(&pools, &more, &BTreeMap::new(), jiff::Timestamp::now());
        assert_eq!(d.replicas, BTreeMap::from([("burst".to_string(), 3)]));
    }

    #[test]
    fn a_machine_whose_node_was_lost_is_no_room_on_the_way() {
        let kc = cluster("1.34", "[{ name: burst, minReplicas: 1, maxReplicas: 3 }]");
        // Two machines: one Ready and full, one whose Node went NotReady (its pods evicted).
        let mut lost = ScalingPool {
            spec: &kc.spec.workers[0],
            replicas: 2,
            ready: ready(&[("burst-1", true)]),
            rolling: false,
            lost: 1,
        };
        lost.ready
            .values_mut()
            .for_each(|n| n.used = Resources::of_pool(&kc.spec.workers[0]));
        let pending = [pod("evicted", 1500, 10)];
        let d = decide(
            std::slice::from_ref(&lost),
            &pending,
            &BTreeMap::new(),
            jiff::Timestamp::now(),
        );
        assert_eq!(d.replicas, BTreeMap::from([("burst".to_string(), 3)]));
        // The same machine still being made holds the pod.
        lost.lost = 0;
        let d = decide(
            std::slice::from_ref(&lost),
            &pending,
            &BTreeMap::new(),
            jiff::Timestamp::now(),
        );
        assert_eq!(d.replicas, BTreeMap::new());
    }

    #[test]
    fn room_left_on_a_ready_machine_is_used_before_a_new_one_and_a_removal_under_way_is_waited_for() {
        let kc = cluster(
            "1.34",
            "[{ name: burst, minReplicas: 1, maxReplicas: 3, scaleDownDelaySeconds: 0 }]",
        );
        // A new machine Ready and empty: the pod the scheduler has not retried yet goes there.
        let pools = [ScalingPool {
            spec: &kc.spec.workers[0],
            replicas: 2,
            ready: ready(&[("burst-1", true), ("burst-2", false)]),
            rolling: false,
            lost: 0,
        }];
        let d = decide(&pools, &[pod("a", 1500, 10)], &BTreeMap::new(), jiff::Timestamp::now());
        assert!(d.replicas.is_empty() && d.at_max.is_empty(), "{d:?}");
        // Two idle, one asked for: a removal is under way, nothing more goes.
        let shrinking = [ScalingPool {
            spec: &kc.spec.workers[0],
            replicas: 1,
            ready: ready(&[("burst-1", false), ("burst-2", false)]),
            rolling: false,
            lost: 0,
        }];
        let d = decide(&shrinking, &[], &BTreeMap::new(), jiff::Timestamp::now());
        assert!(d.replicas.is_empty() && d.remove.is_empty(), "{d:?}");
    }

    #[test]
    fn a_pod_no_flavor_can_hold_makes_no_machine() {
        let kc = cluster("1.34", "[{ name: burst, minReplicas: 1, maxReplicas: 3 }]");
        let pools = [ScalingPool {
            spec: &kc.spec.workers[0],
            replicas: 1,
            ready: ready(&[("burst-1", true)]),
            rolling: false,
            lost: 0,
        }];
        let d = decide(
            &pools,
            &[pod("huge", 64 * CPU, 30)],
            &BTreeMap::new(),
            jiff::Timestamp::now(),
        );
        assert_eq!(d.unfit, vec!["default/huge".to_string()]);
        assert!(d.replicas.is_empty());
    }

    #[test]
    fn an_idle_machine_goes_after_the_delay_never_below_the_minimum() {
        let kc = cluster(
            "1.34",
            "[{ name: burst, minReplicas: 1, maxReplicas: 3, scaleDownDelaySeconds: 60 }]",
        );
        let pool = |rolling| ScalingPool {
            spec: &kc.spec.workers[0],
            replicas: 3,
            ready: ready(&[("burst-1", false), ("burst-2", false), ("burst-3", false)]),
            rolling,
            lost: 0,
        };
        let t0 = jiff::Timestamp::now();
        let first = decide(&[pool(false)], &[], &BTreeMap::new(), t0);
        assert!(first.replicas.is_empty(), "idle from now: not yet");
        assert_eq!(first.idle_since["burst"].len(), 3);
        assert_eq!(first.look_again, Some(Duration::from_secs(60)));

        let later = t0 + jiff::SignedDuration::from_secs(61);
        let d = decide(&[pool(false)], &[], &first.idle_since, later);
        assert_eq!(d.replicas, BTreeMap::from([("burst".to_string(), 1)]));
        assert_eq!(d.remove.len(), 2, "down to the minimum, not below");
        assert!(
            decide(&[pool(true)], &[], &first.idle_since, later).replicas.is_empty(),
            "not while rolling"
        );
        // A pod waiting for room that the pool could hold keeps it.
        let d = decide(&[pool(false)], &[pod("a", 500, 1)], &first.idle_since, later);
        assert_eq!(d.replicas, BTreeMap::new(), "{d:?}");
    }

    #[test]
    fn a_busy_machine_is_not_idle_and_its_clock_starts_again() {
        let kc = cluster(
            "1.34",
            "[{ name: burst, minReplicas: 0, maxReplicas: 3, scaleDownDelaySeconds: 60 }]",
        );
        let t0 = jiff::Timestamp::now();
        let before = BTreeMap::from([("burst".to_string(), BTreeMap::from([("burst-1".to_string(), t0)]))]);
        let pools = [ScalingPool {
            spec: &kc.spec.workers[0],
            replicas: 1,
            ready: ready(&[("burst-1", true)]),
            rolling: false,
            lost: 0,
        }];
        let d = decide(&pools, &[], &before, t0 + jiff::SignedDuration::from_secs(120));
        assert!(d.replicas.is_empty());
        assert!(d.idle_since.is_empty());
    }
}
