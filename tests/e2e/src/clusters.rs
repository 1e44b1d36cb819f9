//! KubernetesClusters as tests use them: a manifest, waiting for one Ready at a version, and
//! watches: every Node's kubelet against its API servers' version, the order an upgrade moved
//! its control plane and pools in, and the most machines present at once.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use noops_api::{KubernetesCluster, KubernetesControlPlane, Machine, MachineDeployment};

use crate::{TestNamespace, wait_for};

/// The label naming the KubernetesCluster a child (and a machine) belongs to.
const CLUSTER_LABEL: &str = "noops.dev/kubernetescluster";
/// The label naming the pool a machine is of.
const POOL_LABEL: &str = "noops.dev/pool";

/// The controllers a cluster needs.
pub const CONTROLLERS: &str =
    "kubernetescluster,kubernetescontrolplane,etcd,etcdbackup,machine,machineset,machinedeployment";

pub fn minor(version: &str) -> Option<u32> {
    version.trim_start_matches('v').split('.').nth(1)?.parse().ok()
}

/// Waits until cluster `name` is Ready and runs `version` everywhere.
pub async fn wait_cluster(ns: &TestNamespace, name: &str, version: &str, timeout: Duration) -> KubernetesCluster {
    let api = ns.api::<KubernetesCluster>();
    wait_for(&format!("cluster {name} Ready at {version}"), timeout, || async {
        let kc = api.get(name).await.ok()?;
        let status = kc.status.as_ref()?;
        let ready = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        (ready && status.version.as_deref() == Some(version) && status.observed_generation == kc.metadata.generation)
            .then_some(kc)
    })
    .await
}

/// Every tenant Node's kubelet checked against the control plane's version at every change of a
/// Node, both from watches: the changes where a kubelet was newer than the API servers, or more
/// than one minor older.
pub struct SkewWatch {
    task: tokio::task::JoinHandle<()>,
    tally: Arc<Mutex<SkewTally>>,
}

/// What a [`SkewWatch`] saw.
#[derive(Clone, Debug, Default)]
struct SkewTally {
    /// Node changes checked against the control plane's version (one seen before any version
    /// of the control plane was is not: the caller's count of checked changes shows it).
    checked: usize,
    skews: Vec<String>,
}

/// What a [`SkewWatch`] needs of a change seen by either of its watches.
enum SkewChange {
    ControlPlaneVersion(String),
    Kubelet { node: String, version: String },
}

impl SkewWatch {
    pub fn start(nodes: Api<Node>, control_planes: Api<KubernetesControlPlane>, name: String) -> Self {
        let tally = Arc::new(Mutex::new(SkewTally::default()));
        let record = tally.clone();
        let task = tokio::spawn(async move {
            let control_plane = serving_versions(control_planes, &name).map(SkewChange::ControlPlaneVersion);
            // Backing off while the tenant's API servers restart in the upgrade.
            let nodes = watcher(nodes, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .filter_map(|node| {
                    let kubelet = node.ok().and_then(|node| {
                        Some(SkewChange::Kubelet {
                            version: node.status?.node_info?.kubelet_version,
                            node: node.metadata.name.unwrap_or_default(),
                        })
                    });
                    std::future::ready(kubelet)
                });
            let changes = futures::stream::select(control_plane, nodes);
            futures::pin_mut!(changes);
            // The newest version seen, not one read after the Node changed: the version only
            // goes up, so a later read could hide a kubelet that was newer than its API servers.
            let mut serving: Option<String> = None;
            while let Some(change) = changes.next().await {
                let (node, kubelet) = match change {
                    SkewChange::ControlPlaneVersion(version) => {
                        serving = Some(version);
                        continue;
                    }
                    SkewChange::Kubelet { node, version } => (node, version),
                };
                let mut tally = record.lock().unwrap();
                let Some(serving) = &serving else {
                    continue;
                };
                tally.checked += 1;
                let (Some(k), Some(s)) = (minor(&kubelet), minor(serving)) else {
                    continue;
                };
                if k > s || k + 1 < s {
                    tally
                        .skews
                        .push(format!("node {node} at {kubelet} with API servers at {serving}"));
                }
            }
        });
        Self { task, tally }
    }

    /// (Node changes checked, the skews seen).
    pub fn stop(self) -> (usize, Vec<String>) {
        self.task.abort();
        let tally = self.tally.lock().unwrap().clone();
        (tally.checked, tally.skews)
    }
}

/// The versions control plane `name`'s API servers are seen to run, as its status changes.
fn serving_versions(
    control_planes: Api<KubernetesControlPlane>,
    name: &str,
) -> impl futures::Stream<Item = String> + Send + 'static {
    watcher(control_planes, only_named(name))
        .default_backoff()
        .applied_objects()
        .filter_map(|kcp| std::future::ready(kcp.ok().and_then(|kcp| kcp.status?.version)))
}

/// A watch of the one object named `name`.
fn only_named(name: &str) -> watcher::Config {
    watcher::Config::default().fields(&format!("metadata.name={name}"))
}

/// When an upgrade of cluster `cluster` to `target` reached each step, seen from watches of its
/// children rather than from the cluster's status (which the operator writes from its own plan).
pub struct UpgradeOrderWatch {
    task: tokio::task::JoinHandle<()>,
    timeline: Arc<Mutex<UpgradeTimeline>>,
}

/// When each step of an upgrade was first seen done.
#[derive(Clone, Debug)]
pub struct UpgradeTimeline {
    pub target: String,
    pub watch_started: Instant,
    /// The control plane's status.version first at the target.
    pub control_plane_upgraded: Option<Instant>,
    /// In the spec's order.
    pub pools: Vec<PoolTimeline>,
}

#[derive(Clone, Debug)]
pub struct PoolTimeline {
    pub name: String,
    /// Its MachineDeployment's template first at the target.
    pub started: Option<Instant>,
    /// Its template at the target and every machine of it (those being deleted too) as well.
    pub finished: Option<Instant>,
}

/// What an [`UpgradeOrderWatch`] needs of a change seen by one of its watches.
enum UpgradeChange {
    ControlPlaneVersion(String),
    DeploymentVersion {
        name: String,
        version: String,
    },
    /// Every event, to follow which machines are there through a watch started again.
    Machine(Box<watcher::Event<Machine>>),
}

/// A cluster's children as the watches have them.
#[derive(Default)]
struct WatchedChildren {
    control_plane_version: Option<String>,
    /// Pool → its MachineDeployment's template version.
    deployment_versions: BTreeMap<String, String>,
    /// Machine → (its pool, its version).
    machines: BTreeMap<String, (String, String)>,
    /// The machines of a list under way: a watch started again lists everything anew, and a
    /// half-done list must not read as machines gone.
    relisting: Option<BTreeMap<String, (String, String)>>,
}

impl WatchedChildren {
    fn pool_finished(&self, pool: &str, target: &str) -> bool {
        let mut of_pool = self.machines.values().filter(|(p, _)| p == pool).peekable();
        self.deployment_versions.get(pool).is_some_and(|v| v == target)
            && of_pool.peek().is_some()
            && of_pool.all(|(_, version)| version == target)
    }
}

impl UpgradeOrderWatch {
    /// Starts watching; call it before the cluster is given its new version.
    pub fn start(ns: &TestNamespace, cluster: &str, target: &str, pools: &[&str]) -> Self {
        let (control_planes, deployments, machines) = (
            ns.api::<KubernetesControlPlane>(),
            ns.api::<MachineDeployment>(),
            ns.api::<Machine>(),
        );
        let timeline = Arc::new(Mutex::new(UpgradeTimeline {
            target: target.to_string(),
            watch_started: Instant::now(),
            control_plane_upgraded: None,
            pools: pools
                .iter()
                .map(|p| PoolTimeline {
                    name: p.to_string(),
                    started: None,
                    finished: None,
                })
                .collect(),
        }));
        let record = timeline.clone();
        let (cluster, target) = (cluster.to_string(), target.to_string());
        let of_cluster = watcher::Config::default().labels(&format!("{CLUSTER_LABEL}={cluster}"));
        let task = tokio::spawn(async move {
            let control_plane = serving_versions(control_planes, &cluster).map(UpgradeChange::ControlPlaneVersion);
            let deployments = watcher(deployments, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .filter_map(|md| {
                    let change = md.ok().map(|md| UpgradeChange::DeploymentVersion {
                        name: md.metadata.name.unwrap_or_default(),
                        version: md.spec.template.spec.version,
                    });
                    std::future::ready(change)
                });
            let machines = watcher(machines, of_cluster)
                .default_backoff()
                .filter_map(|event| std::future::ready(event.ok().map(|e| UpgradeChange::Machine(Box::new(e)))));
            let changes = futures::stream::select(control_plane, futures::stream::select(deployments, machines));
            futures::pin_mut!(changes);
            let mut children = WatchedChildren::default();
            while let Some(change) = changes.next().await {
                let now = Instant::now();
                children.apply(change, &cluster);
                let mut timeline = record.lock().unwrap();
                if timeline.control_plane_upgraded.is_none()
                    && children.control_plane_version.as_deref() == Some(target.as_str())
                {
                    timeline.control_plane_upgraded = Some(now);
                }
                for pool in &mut timeline.pools {
                    if pool.started.is_none() && children.deployment_versions.get(&pool.name) == Some(&target) {
                        pool.started = Some(now);
                    }
                    if pool.finished.is_none() && children.pool_finished(&pool.name, &target) {
                        pool.finished = Some(now);
                    }
                }
            }
        });
        Self { task, timeline }
    }

    pub fn stop(self) -> UpgradeTimeline {
        self.task.abort();
        self.timeline.lock().unwrap().clone()
    }
}

impl WatchedChildren {
    fn apply(&mut self, change: UpgradeChange, cluster: &str) {
        match change {
            UpgradeChange::ControlPlaneVersion(version) => self.control_plane_version = Some(version),
            UpgradeChange::DeploymentVersion { name, version } => {
                // A pool's MachineDeployment is `<cluster>-<pool>`.
                if let Some(pool) = name.strip_prefix(cluster).and_then(|rest| rest.strip_prefix('-')) {
                    self.deployment_versions.insert(pool.to_string(), version);
                }
            }
            UpgradeChange::Machine(event) => match *event {
                watcher::Event::Init => self.relisting = Some(BTreeMap::new()),
                watcher::Event::InitApply(m) => {
                    let (name, pool_and_version) = pool_and_version(m);
                    self.relisting
                        .get_or_insert_with(BTreeMap::new)
                        .insert(name, pool_and_version);
                }
                watcher::Event::InitDone => self.machines = self.relisting.take().unwrap_or_default(),
                watcher::Event::Apply(m) => {
                    let (name, pool_and_version) = pool_and_version(m);
                    self.machines.insert(name, pool_and_version);
                }
                watcher::Event::Delete(m) => {
                    self.machines.remove(&m.metadata.name.unwrap_or_default());
                }
            },
        }
    }
}

/// A machine's name, and its pool (its label) and version.
fn pool_and_version(machine: Machine) -> (String, (String, String)) {
    let pool = machine
        .metadata
        .labels
        .and_then(|mut l| l.remove(POOL_LABEL))
        .unwrap_or_default();
    (
        machine.metadata.name.unwrap_or_default(),
        (pool, machine.spec.template.version),
    )
}

/// How much later one watch may deliver a change than another: the operator acts on what its
/// own caches saw within a pass, so a step can show on one watch just before the one before it
/// shows on another. A step out of order is out by a pool's rollout, tens of seconds.
const CROSS_WATCH_SLACK: Duration = Duration::from_secs(2);

impl UpgradeTimeline {
    /// Asserts the control plane reached the target before the first pool started, each pool
    /// finished before the next started, and every pool finished.
    pub fn assert_in_order(&self) {
        let target = &self.target;
        let control_plane = self
            .control_plane_upgraded
            .unwrap_or_else(|| panic!("the control plane never reached {target}:\n{self}"));
        for pool in &self.pools {
            assert!(pool.finished.is_some(), "pool {} never finished:\n{self}", pool.name);
        }
        if let Some(first) = self.pools.first() {
            let started = first
                .started
                .unwrap_or_else(|| panic!("pool {} never started:\n{self}", first.name));
            assert!(
                control_plane < started + CROSS_WATCH_SLACK,
                "pool {} started before the control plane reached {target}:\n{self}",
                first.name
            );
        }
        for pair in self.pools.windows(2) {
            let [before, after] = pair else { continue };
            let started = after
                .started
                .unwrap_or_else(|| panic!("pool {} never started:\n{self}", after.name));
            assert!(
                before
                    .finished
                    .is_some_and(|finished| finished < started + CROSS_WATCH_SLACK),
                "pool {} started before pool {} finished:\n{self}",
                after.name,
                before.name
            );
        }
    }
}

impl fmt::Display for UpgradeTimeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = |moment: Option<Instant>| {
            moment.map_or_else(
                || "never".to_string(),
                |m| format!("{:.1}s", m.duration_since(self.watch_started).as_secs_f64()),
            )
        };
        writeln!(f, "upgrade to {}, since the watch started:", self.target)?;
        writeln!(f, "  control plane at the target: {}", at(self.control_plane_upgraded))?;
        for pool in &self.pools {
            writeln!(
                f,
                "  pool {}: started {}, finished {}",
                pool.name,
                at(pool.started),
                at(pool.finished)
            )?;
        }
        Ok(())
    }
}

/// The most Machines present at once in a namespace (those being deleted too), from a watch.
pub struct MostMachinesWatch {
    task: tokio::task::JoinHandle<()>,
    most: Arc<Mutex<usize>>,
}

impl MostMachinesWatch {
    pub fn start(machines: Api<Machine>) -> Self {
        let most = Arc::new(Mutex::new(0));
        let record = most.clone();
        let task = tokio::spawn(async move {
            let stream = watcher(machines, watcher::Config::default()).default_backoff();
            futures::pin_mut!(stream);
            let mut present = BTreeSet::new();
            // A watch started again lists everything anew: counted once the list is whole.
            let mut relisting: Option<BTreeSet<String>> = None;
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::Init) => relisting = Some(BTreeSet::new()),
                    Ok(watcher::Event::InitApply(m)) => {
                        relisting
                            .get_or_insert_with(BTreeSet::new)
                            .insert(m.metadata.name.unwrap_or_default());
                    }
                    Ok(watcher::Event::InitDone) => present = relisting.take().unwrap_or_default(),
                    Ok(watcher::Event::Apply(m)) => {
                        present.insert(m.metadata.name.unwrap_or_default());
                    }
                    Ok(watcher::Event::Delete(m)) => {
                        present.remove(&m.metadata.name.unwrap_or_default());
                    }
                    Err(_) => continue,
                }
                let mut most = record.lock().unwrap();
                *most = (*most).max(present.len());
            }
        });
        Self { task, most }
    }

    pub fn stop(self) -> usize {
        self.task.abort();
        *self.most.lock().unwrap()
    }
}

/// A KubernetesCluster `kc` whose spec is `spec` (YAML lines indented by two).
pub fn cluster(name: &str, spec: &str) -> String {
    format!("apiVersion: noops.dev/v1alpha1\nkind: KubernetesCluster\nmetadata: {{ name: {name} }}\nspec:\n{spec}")
}
