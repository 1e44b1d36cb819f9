//! The rolling planner against every interleaving of what moves under it: the deployment
//! lowering or raising a set, the set marking or making machines, a machine becoming ready,
//! a machine being gone, a set's status written late, and the deployment's view of a set one
//! pass behind. Every state reachable from a pool of old machines is visited; in each, the
//! machines available never fall below `replicas - maxUnavailable`, the machines not being
//! deleted never exceed `replicas + maxSurge`, and the rollout can still finish.

use std::collections::{HashMap, VecDeque};

use noops_api::machine_deployment::MachineDeployment;
use serde_json::json;

use super::plan::{DeploymentPlan, SetView, plan, set_name, template_hash};

/// One MachineSet as it is, and what its status last said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Set {
    /// 0 for the current template's set; older sets are older the higher this is.
    age: u8,
    replicas: i32,
    /// Its machines: ready, not ready yet, being deleted.
    ready: i32,
    starting: i32,
    deleting: i32,
    /// Its status: machines (not being deleted), available, being deleted; `None` before
    /// the set's first status.
    status: Option<(i32, i32, i32)>,
    /// The status was written after the last change of `replicas`.
    settled: bool,
}

impl Set {
    fn old(age: u8, ready: i32) -> Self {
        Self {
            age,
            replicas: ready,
            ready,
            starting: 0,
            deleting: 0,
            status: Some((ready, ready, 0)),
            settled: true,
        }
    }

    fn active(&self) -> i32 {
        self.ready + self.starting
    }
}

/// At most this many sets at once: the current one and two older.
const SETS: usize = 3;

/// The sets as they are (by age), and as they were when the deployment last planned (what a
/// cache one pass behind shows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct World {
    sets: [Option<Set>; SETS],
    last_pass: [Option<Set>; SETS],
}

impl World {
    fn sets(&self) -> impl Iterator<Item = &Set> {
        self.sets.iter().flatten()
    }

    /// The world packed into words, 32 bits a set (every count is below 16).
    fn key(&self) -> (u128, u64) {
        let mut bits = [0u32; 2 * SETS];
        for (i, s) in self.sets.iter().chain(&self.last_pass).enumerate() {
            bits[i] = pack(s.as_ref());
        }
        let word = |i: usize| u128::from(bits[i]);
        (
            word(0) | word(1) << 32 | word(2) << 64 | word(3) << 96,
            u64::from(bits[4]) | u64::from(bits[5]) << 32,
        )
    }
}

fn pack(set: Option<&Set>) -> u32 {
    let Some(s) = set else { return 0 };
    let nibble = |n: i32| u32::try_from(n).unwrap_or(15) & 15;
    let (m, a, d) = s.status.unwrap_or((0, 0, 0));
    1 | u32::from(s.settled) << 1
        | u32::from(s.status.is_some()) << 2
        | nibble(s.replicas) << 4
        | nibble(s.ready) << 8
        | nibble(s.starting) << 12
        | nibble(s.deleting) << 16
        | nibble(m) << 20
        | nibble(a) << 24
        | nibble(d) << 28
}

/// What a plan writes, by set age: its replicas, whether it is removed; and whether the plan
/// found the rollout complete.
#[derive(Debug, Clone, Copy)]
struct Writes {
    replicas: [Option<i32>; SETS],
    remove: [bool; SETS],
    complete: bool,
}

/// A hasher of whole words: the worlds are many, packed into words (`World::key`), and the
/// standard hasher is slow in a debug build.
#[derive(Default)]
struct Words(u64);

impl std::hash::Hasher for Words {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn write_u128(&mut self, word: u128) {
        self.write_u64(word as u64);
        self.write_u64((word >> 64) as u64);
    }
}

type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<Words>>;

struct Model {
    md: MachineDeployment,
    /// Each set's name and template hash, by age.
    names: Vec<(String, String)>,
    /// What the plan writes for each view (views recur: planning is the costly part).
    plans: FastMap<u128, Writes>,
    min_available: i32,
    most: i32,
}

impl Model {
    fn new(replicas: i32, surge: serde_json::Value, unavailable: serde_json::Value) -> Self {
        let spec = serde_json::from_value(json!({
            "clusterName": "c", "replicas": replicas,
            "selector": { "matchLabels": { "pool": "p" } },
            "template": { "metadata": { "labels": { "pool": "p" } }, "spec": { "version": "1.34" } },
            "strategy": { "rollingUpdate": { "maxSurge": surge, "maxUnavailable": unavailable } },
        }))
        .unwrap();
        let md = MachineDeployment::new("pool", spec);
        let rolling = md.spec.strategy.rolling_update.clone().unwrap_or_default();
        let up = crate::machine_set::health::scaled(&rolling.max_surge, replicas, true);
        let mut down = crate::machine_set::health::scaled(&rolling.max_unavailable, replicas, false);
        if up == 0 && down == 0 {
            down = 1;
        }
        let names = (0..SETS)
            .map(|age| match age {
                0 => (set_name(&md), template_hash(&md)),
                _ => (format!("pool-old{age}"), format!("old{age}")),
            })
            .collect();
        Self {
            md,
            names,
            plans: FastMap::default(),
            min_available: replicas - down,
            most: replicas + up,
        }
    }

    fn view(&self, set: &Set) -> SetView {
        let (machines, available, deleting) = set.status.unwrap_or((0, 0, 0));
        let (name, hash) = self.names[usize::from(set.age)].clone();
        SetView {
            name,
            template_hash: hash,
            replicas: set.replicas,
            machines,
            available,
            deleting,
            settled: set.status.is_some() && set.settled,
            created: Some(jiff::Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(1_000 - i64::from(set.age))),
        }
    }

    fn plan(&mut self, seen: [Option<Set>; SETS]) -> Writes {
        let key = seen
            .iter()
            .enumerate()
            .fold(0u128, |k, (i, s)| k | u128::from(pack(s.as_ref())) << (32 * i));
        if let Some(w) = self.plans.get(&key) {
            return *w;
        }
        let views: Vec<SetView> = seen.iter().flatten().map(|s| self.view(s)).collect();
        let p: DeploymentPlan = plan(&self.md, &views);
        let mut writes = Writes {
            replicas: [None; SETS],
            remove: [false; SETS],
            complete: p.complete,
        };
        for (name, replicas) in p.current.iter().chain(p.older.iter()) {
            writes.replicas[self.age_of(name)] = Some(*replicas);
        }
        for name in &p.remove {
            writes.remove[self.age_of(name)] = true;
        }
        self.plans.insert(key, writes);
        writes
    }

    /// The deployment's pass over `seen` (each set fresh or as the last pass saw it), its
    /// writes made to the sets as they are.
    fn pass(&mut self, world: &World, seen: [Option<Set>; SETS]) -> (World, bool) {
        let writes = self.plan(seen);
        let mut next = *world;
        next.last_pass = world.sets;
        for (age, slot) in next.sets.iter_mut().enumerate() {
            let Some(replicas) = writes.replicas[age] else { continue };
            match slot {
                // A set the view lacks is made, never overwritten.
                Some(_) if seen[age].is_none() => {}
                Some(s) if s.replicas != replicas => {
                    s.replicas = replicas;
                    s.settled = false;
                }
                Some(_) => {}
                None => {
                    *slot = Some(Set {
                        age: age as u8,
                        replicas,
                        ready: 0,
                        starting: 0,
                        deleting: 0,
                        status: None,
                        settled: false,
                    })
                }
            }
        }
        for (age, slot) in next.sets.iter_mut().enumerate() {
            if !writes.remove[age] {
                continue;
            }
            if let Some(s) = slot {
                assert_eq!(
                    s.active() + s.deleting,
                    0,
                    "set {age} removed with machines: {world:?} seen as {seen:?}"
                );
            }
            *slot = None;
        }
        (next, writes.complete)
    }

    fn age_of(&self, name: &str) -> usize {
        self.names.iter().position(|(n, _)| n == name).unwrap()
    }

    /// Every world one step from `world`, and whether a pass found the rollout complete.
    fn steps(&mut self, world: &World) -> (Vec<World>, bool) {
        let mut out = Vec::new();
        let mut complete = false;
        // The deployment's pass, each set seen fresh or one pass behind (not in the cache yet
        // if the last pass did not see it).
        let present: Vec<usize> = (0..SETS).filter(|i| world.sets[*i].is_some()).collect();
        for stale in 0..(1u32 << present.len()) {
            let mut seen = world.sets;
            for (bit, i) in present.iter().enumerate() {
                if stale & (1 << bit) != 0 {
                    seen[*i] = world.last_pass[*i];
                }
            }
            if stale != 0 && seen == world.sets {
                continue;
            }
            let (next, done) = self.pass(world, seen);
            complete |= done && stale == 0;
            out.push(next);
        }
        for i in present {
            let Some(set) = world.sets[i] else { continue };
            let mut with = |f: &dyn Fn(&mut Set)| {
                let mut next = *world;
                if let Some(s) = next.sets[i].as_mut() {
                    f(s);
                }
                out.push(next);
            };
            // The set's pass: it marks what is too many (those not ready first) or makes
            // what is missing.
            if set.active() > set.replicas {
                with(&|s: &mut Set| {
                    let mut extra = s.active() - s.replicas;
                    let from_starting = extra.min(s.starting);
                    s.starting -= from_starting;
                    extra -= from_starting;
                    s.ready -= extra;
                    s.deleting += from_starting + extra;
                });
            } else if set.active() < set.replicas {
                with(&|s: &mut Set| s.starting += s.replicas - s.active());
            }
            // Its status, written whenever.
            with(&|s: &mut Set| {
                s.status = Some((s.active(), s.ready, s.deleting));
                s.settled = true;
            });
            if set.starting > 0 {
                with(&|s: &mut Set| {
                    s.starting -= 1;
                    s.ready += 1;
                });
            }
            if set.deleting > 0 {
                with(&|s: &mut Set| s.deleting -= 1);
            }
        }
        out.retain(|w| w != world);
        (out, complete)
    }

    /// Visits every world reachable from `sets`; panics on the first that breaks a promise.
    /// Returns how many worlds were visited.
    fn explore(&mut self, sets: &[Set]) -> usize {
        let mut start = World {
            sets: [None; SETS],
            last_pass: [None; SETS],
        };
        for s in sets {
            start.sets[usize::from(s.age)] = Some(*s);
        }
        start.last_pass = start.sets;
        let mut edges: Vec<(u32, u32)> = Vec::new();
        let mut index: FastMap<(u128, u64), u32> = FastMap::default();
        let mut worlds: Vec<World> = vec![start];
        let mut done: Vec<bool> = vec![false];
        let mut queue = VecDeque::from([0u32]);
        index.insert(start.key(), 0);
        while let Some(from) = queue.pop_front() {
            let world = worlds[from as usize];
            let available: i32 = world.sets().map(|s| s.ready).sum();
            let not_deleting: i32 = world.sets().map(Set::active).sum();
            assert!(
                available >= self.min_available,
                "{available} available, fewer than {}: {world:?}",
                self.min_available
            );
            assert!(
                not_deleting <= self.most,
                "{not_deleting} machines not being deleted, more than {}: {world:?}",
                self.most
            );
            let (next, complete) = self.steps(&world);
            if complete {
                let finished = world.sets().all(|s| {
                    if s.age == 0 {
                        s.ready == self.md.spec.replicas && s.starting == 0 && s.deleting == 0
                    } else {
                        s.active() + s.deleting == 0
                    }
                });
                assert!(finished, "complete while old machines remain: {world:?}");
                done[from as usize] = true;
            }
            for w in next {
                let to = *index.entry(w.key()).or_insert_with(|| {
                    worlds.push(w);
                    done.push(false);
                    let i = (worlds.len() - 1) as u32;
                    queue.push_back(i);
                    i
                });
                edges.push((from, to));
            }
        }
        // From every world the rollout can still finish: walk back from the finished ones
        // (the edges grouped by where they lead, a counting sort).
        let mut first = vec![0usize; done.len() + 1];
        for (_, to) in &edges {
            first[*to as usize + 1] += 1;
        }
        for i in 0..done.len() {
            first[i + 1] += first[i];
        }
        let mut filled = first.clone();
        let mut sources = vec![0u32; edges.len()];
        for (from, to) in &edges {
            sources[filled[*to as usize]] = *from;
            filled[*to as usize] += 1;
        }
        let mut finishes = done.clone();
        let mut queue: VecDeque<usize> = (0..done.len()).filter(|i| done[*i]).collect();
        while let Some(i) = queue.pop_front() {
            for &from in &sources[first[i]..first[i + 1]] {
                if !finishes[from as usize] {
                    finishes[from as usize] = true;
                    queue.push_back(from as usize);
                }
            }
        }
        if let Some(stuck) = finishes.iter().position(|f| !f) {
            panic!("a rollout that can never finish from {:?}", worlds[stuck]);
        }
        worlds.len()
    }
}

/// Explores a pool of 3 and one of 5 rolling with `surge` and `unavailable`.
fn explore_pools(surge: serde_json::Value, unavailable: serde_json::Value) {
    for replicas in [3, 5] {
        let mut model = Model::new(replicas, surge.clone(), unavailable.clone());
        let worlds = model.explore(&[Set::old(1, replicas)]);
        assert!(worlds > 1000, "{worlds} worlds for {replicas} ({surge}/{unavailable})");
    }
}

#[test]
fn one_more_none_fewer_holds_in_every_interleaving() {
    explore_pools(json!(1), json!(0));
}

#[test]
fn one_fewer_none_more_holds_in_every_interleaving() {
    explore_pools(json!(0), json!(1));
}

#[test]
fn two_more_none_fewer_holds_in_every_interleaving() {
    explore_pools(json!(2), json!(0));
}

#[test]
fn a_quarter_more_and_a_quarter_fewer_holds_in_every_interleaving() {
    // 25% of 3 is 1 more, none fewer; of 5, 2 more and 1 fewer.
    explore_pools(json!("25%"), json!("25%"));
}

#[test]
fn a_rollout_changed_half_way_keeps_the_same_promises() {
    // Pool of 3 rolling from old2 to old1 (surge 1: one of old1's machines made, ready) when
    // the template changes again.
    // The oldest set was asked to give one machine up and has not marked it yet.
    let mut model = Model::new(3, json!(1), json!(0));
    let mut oldest = Set::old(2, 3);
    oldest.replicas = 2;
    oldest.settled = false;
    model.explore(&[Set::old(1, 1), oldest]);
}
