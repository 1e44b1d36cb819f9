//! Every machine deletion of a pool judged as it happens, from watches (not sampling): when a
//! machine is first seen being deleted, the others that are Ready and not being deleted must
//! be at least the deployment's `replicas - maxUnavailable` (or, when fewer were Ready before,
//! no fewer than before: a machine that was not Ready costs nothing); and the machines not being
//! deleted never more than `replicas + maxSurge`; and no machine name is given again after its
//! machine was gone.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::runtime::{WatchStreamExt, watcher};
use noops_api::{Machine, MachineDeployment};

use crate::TestNamespace;

/// How much later either watch may deliver a change than the other: a deletion is judged by
/// the lowest floor (and highest ceiling) the deployment had in this time before it or, its
/// change delivered late, within this time after it.
const CROSS_WATCH_SLACK: Duration = Duration::from_secs(2);

/// A machine as the watch keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    ready: bool,
    deleting: bool,
}

fn seen(m: &Machine) -> Seen {
    let ready = m
        .status
        .as_ref()
        .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    Seen {
        ready,
        deleting: m.metadata.deletion_timestamp.is_some(),
    }
}

/// The deployment's bounds: (when, floor, ceiling).
type Bounds = (Instant, i32, i32);

/// What a [`DeletionWatch`] saw.
#[derive(Clone, Debug, Default)]
pub struct Deletions {
    /// Every deletion: the machine, whether it was Ready, and the others Ready and not being
    /// deleted once it was marked.
    pub judged: Vec<(String, bool, i32)>,
    /// Deletions that left fewer available than allowed, moments with more machines than
    /// allowed, and machine names given twice.
    pub violations: Vec<String>,
    /// The most machines not being deleted at once.
    pub most: i32,
    /// Breaks of the bounds seen in force, which bounds the deployment's watch delivers within
    /// [`CROSS_WATCH_SLACK`] after may still allow: its change can reach this process after the
    /// machines' change it caused. Violations unless allowed so.
    pending: Vec<Pending>,
}

/// A moment judged against the bounds in force when the machines' watch delivered it.
#[derive(Clone, Debug)]
struct Pending {
    at: Instant,
    broke: Broke,
    line: String,
}

#[derive(Clone, Copy, Debug)]
enum Broke {
    /// A deletion left `others` Ready of the `had` there were.
    Floor { others: i32, had: i32 },
    /// `count` machines were not being deleted.
    Ceiling { count: i32 },
}

impl Broke {
    fn allowed_by(self, floor: i32, ceiling: i32) -> bool {
        match self {
            Broke::Floor { others, had } => others >= floor.min(had),
            Broke::Ceiling { count } => count <= ceiling,
        }
    }
}

/// What either watch saw.
enum Change {
    Deployment(MachineDeployment),
    Machine(watcher::Event<Machine>),
}

/// Watches MachineDeployment `deployment` of `ns` and its machines (label query `selector`).
pub struct DeletionWatch {
    task: tokio::task::JoinHandle<()>,
    tally: Arc<Mutex<Deletions>>,
}

/// `value` of `total`, as a number: percentages rounded up or down, as the operator does.
fn scaled(value: &IntOrString, total: i32, round_up: bool) -> i32 {
    match value {
        IntOrString::Int(n) => *n,
        IntOrString::String(s) => {
            let percent: i32 = s.trim_end_matches('%').parse().unwrap_or(0);
            let product = percent * total;
            if round_up { (product + 99) / 100 } else { product / 100 }
        }
    }
}

/// (floor, ceiling) of a deployment as its spec is now.
fn bounds(md: &MachineDeployment) -> (i32, i32) {
    let replicas = md.spec.replicas;
    let rolling = md.spec.strategy.rolling_update.clone().unwrap_or_default();
    let surge = scaled(&rolling.max_surge, replicas, true);
    let mut unavailable = scaled(&rolling.max_unavailable, replicas, false);
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    (replicas - unavailable, replicas + surge)
}

impl DeletionWatch {
    /// Starts watching; the deployment must exist.
    pub fn start(ns: &TestNamespace, deployment: &str, selector: &str) -> Self {
        let tally = Arc::new(Mutex::new(Deletions::default()));
        let record = tally.clone();
        let deployments = watcher(
            ns.api::<MachineDeployment>(),
            watcher::Config::default().fields(&format!("metadata.name={deployment}")),
        )
        .default_backoff()
        .applied_objects()
        .filter_map(|md| std::future::ready(md.ok().map(Change::Deployment)));
        let machines = watcher(ns.api::<Machine>(), watcher::Config::default().labels(selector))
            .default_backoff()
            .filter_map(|e| std::future::ready(e.ok().map(Change::Machine)));
        let task = tokio::spawn(async move {
            let changes = futures::stream::select(deployments, machines);
            futures::pin_mut!(changes);
            let mut history: Vec<Bounds> = Vec::new();
            let mut machines: BTreeMap<String, Seen> = BTreeMap::new();
            let mut relisting: Option<BTreeMap<String, Seen>> = None;
            // Names of machines seen gone: a set never gives a name twice.
            let mut gone: std::collections::BTreeSet<String> = Default::default();
            let mut given_again: Vec<String> = Vec::new();
            while let Some(change) = changes.next().await {
                let now = Instant::now();
                let event = match change {
                    Change::Deployment(md) => {
                        let (floor, ceiling) = bounds(&md);
                        if history.last().is_none_or(|(_, f, c)| (*f, *c) != (floor, ceiling)) {
                            history.push((now, floor, ceiling));
                        }
                        record
                            .lock()
                            .unwrap()
                            .pending
                            .retain(|p| !(now <= p.at + CROSS_WATCH_SLACK && p.broke.allowed_by(floor, ceiling)));
                        continue;
                    }
                    Change::Machine(event) => event,
                };
                // A watch started again lists everything anew: judged once the list is whole.
                let marked = match event {
                    watcher::Event::Init => {
                        relisting = Some(BTreeMap::new());
                        continue;
                    }
                    watcher::Event::InitApply(m) => {
                        let name = m.metadata.name.clone().unwrap_or_default();
                        if gone.remove(&name) {
                            given_again.push(name.clone());
                        }
                        relisting.get_or_insert_with(BTreeMap::new).insert(name, seen(&m));
                        continue;
                    }
                    watcher::Event::InitDone => {
                        let listed = relisting.take().unwrap_or_default();
                        let marked: Vec<(String, Option<Seen>)> = listed
                            .iter()
                            .filter(|(n, s)| s.deleting && machines.get(*n).is_some_and(|b| !b.deleting))
                            .map(|(n, _)| (n.clone(), machines.get(n).copied()))
                            .collect();
                        machines = listed;
                        marked
                    }
                    watcher::Event::Apply(m) => {
                        let name = m.metadata.name.clone().unwrap_or_default();
                        if gone.remove(&name) {
                            given_again.push(name.clone());
                        }
                        let before = machines.insert(name.clone(), seen(&m));
                        let now_deleting = m.metadata.deletion_timestamp.is_some();
                        if now_deleting && before.is_none_or(|b| !b.deleting) {
                            vec![(name, before)]
                        } else {
                            vec![]
                        }
                    }
                    watcher::Event::Delete(m) => {
                        let name = m.metadata.name.unwrap_or_default();
                        machines.remove(&name);
                        gone.insert(name);
                        vec![]
                    }
                };
                let mut tally = record.lock().unwrap();
                for name in given_again.drain(..) {
                    tally
                        .violations
                        .push(format!("machine name {name} given again after that machine was gone"));
                }
                let window: Vec<&Bounds> = history
                    .iter()
                    .enumerate()
                    .filter(|(i, (at, _, _))| {
                        // In force at some moment within the slack before now.
                        let next = history.get(i + 1).map(|(t, _, _)| *t);
                        next.is_none_or(|t| t + CROSS_WATCH_SLACK >= now) && *at <= now
                    })
                    .map(|(_, b)| b)
                    .collect();
                let (Some(floor), Some(ceiling)) = (
                    window.iter().map(|(_, f, _)| *f).min(),
                    window.iter().map(|(_, _, c)| *c).max(),
                ) else {
                    continue;
                };
                let not_deleting = machines.values().filter(|s| !s.deleting).count() as i32;
                tally.most = tally.most.max(not_deleting);
                if not_deleting > ceiling {
                    let line = format!("{not_deleting} machines not being deleted, more than {ceiling}: {machines:?}");
                    tally.pending.push(Pending {
                        at: now,
                        broke: Broke::Ceiling { count: not_deleting },
                        line,
                    });
                }
                for (name, before) in marked {
                    let was_ready = before.is_some_and(|b| b.ready && !b.deleting);
                    let others = machines
                        .iter()
                        .filter(|(n, s)| **n != name && s.ready && !s.deleting)
                        .count() as i32;
                    let had = others + i32::from(was_ready);
                    if others < floor.min(had) {
                        tally.pending.push(Pending {
                            at: now,
                            broke: Broke::Floor { others, had },
                            line: format!(
                                "{name} (Ready: {was_ready}) marked for deletion leaving {others} others Ready, fewer than {floor}: {machines:?}"
                            ),
                        });
                    }
                    tally.judged.push((name, was_ready, others));
                }
            }
        });
        Self { task, tally }
    }

    pub async fn stop(self) -> Deletions {
        // The deployment's watch may still deliver bounds that allow what is pending.
        tokio::time::sleep(CROSS_WATCH_SLACK).await;
        self.task.abort();
        let mut seen = self.tally.lock().unwrap().clone();
        let pending = std::mem::take(&mut seen.pending);
        seen.violations.extend(pending.into_iter().map(|p| p.line));
        seen
    }

    /// Stops, asserting that no deletion and no moment broke the bounds and that at least
    /// `at_least` machines that were Ready were deleted (the watch judged something).
    pub async fn stop_expecting_within_bounds(self, at_least: usize) -> Deletions {
        let seen = self.stop().await;
        eprintln!(
            "deletions judged (machine, was Ready, others Ready then): {:?}; most at once {}",
            seen.judged, seen.most
        );
        assert!(seen.violations.is_empty(), "{:#?}", seen.violations);
        let ready = seen.judged.iter().filter(|(_, ready, _)| *ready).count();
        assert!(
            ready >= at_least,
            "only {ready} Ready machines seen deleted (of {:?})",
            seen.judged
        );
        seen
    }
}
