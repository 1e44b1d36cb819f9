//! Running the pods bound to this node.
//!
//! A watch on pods with `spec.nodeName=<node>` feeds one worker task per pod UID. The worker owns
//! everything about its pod: sandbox (network namespace, volumes), container processes, probes,
//! restarts, status and deletion. The manager only routes updates and notices pods that vanished.
//!
//! Pure parts, tested without a cluster: `decide` (what to start, what follows an exit),
//! `backoff`, `launch` (a container's process, environment and mounts) and `status`.

mod backoff;
mod decide;
mod launch;
mod status;
mod worker;

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::Recorder;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::images::ImageMapFileWatch;
use crate::network::PodNetwork;
use crate::node::NodeInfo;

/// Shared by every pod worker.
pub struct Agent {
    pub client: Client,
    pub node: NodeInfo,
    /// The image map, reloaded when its file changes.
    pub images: ImageMapFileWatch,
    pub network: PodNetwork,
    /// `<state>/pods/<uid>` holds each pod's generated files, emptyDirs and logs.
    pub pods_dir: PathBuf,
    pub recorder: Recorder,
    pub cluster_domain: String,
    /// The node's address on its pods' bridge: their gateway and DNS server, and where probes
    /// come from.
    pub gateway: Ipv4Addr,
    pub api_service: (Ipv4Addr, u16),
    /// First delay before restarting a crashed container; doubles up to five minutes.
    pub crash_backoff: Duration,
    /// How often a running pod's generated volumes are written again (ConfigMap and Secret
    /// changes, tokens near their end): the kubelet's `--sync-frequency`.
    pub sync_frequency: Duration,
    /// Paths of this machine that containers must not read.
    pub private_paths: Vec<PathBuf>,
    /// Each container's cgroup, which holds every process it starts.
    pub cgroups: crate::cgroups::Cgroups,
}

impl Agent {
    /// The folder of one pod.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.pods_dir.join(uid)
    }
}

/// What a worker is told about its pod.
#[derive(Debug, Clone)]
pub enum PodUpdate {
    /// The pod as the API server has it now.
    Present(Arc<Pod>),
    /// The pod object is gone (force-deleted, or deleted while the agent was away).
    Gone,
    /// The agent is shutting down: stop containers, keep the pod.
    AgentStopping,
}

struct WorkerHandle {
    tx: watch::Sender<PodUpdate>,
    task: JoinHandle<()>,
}

/// Watches this node's pods and runs a worker for each until `shutdown` fires.
pub async fn run(agent: Arc<Agent>, mut shutdown: watch::Receiver<bool>) {
    let api: Api<Pod> = Api::all(agent.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", agent.node.name));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let mut workers: HashMap<String, WorkerHandle> = HashMap::new();
    let mut listed: Option<HashSet<String>> = None;
    let mut cleaned_orphans = false;
    loop {
        let event = tokio::select! {
            e = events.next() => e,
            _ = shutdown.changed() => None,
        };
        let Some(event) = event else { break };
        match event {
            Ok(Event::Init) => listed = Some(HashSet::new()),
            Ok(Event::InitApply(pod)) => {
                if let (Some(set), Some(uid)) = (listed.as_mut(), pod.metadata.uid.clone()) {
                    set.insert(uid);
                }
                dispatch(&agent, &mut workers, pod);
            }
            Ok(Event::InitDone) => {
                let present = listed.take().unwrap_or_default();
                for (uid, handle) in &workers {
                    if !present.contains(uid) {
                        let _ = handle.tx.send(PodUpdate::Gone);
                    }
                }
                if !cleaned_orphans {
                    cleaned_orphans = true;
                    clean_orphans(&agent, &present).await;
                }
            }
            Ok(Event::Apply(pod)) => dispatch(&agent, &mut workers, pod),
            Ok(Event::Delete(pod)) => {
                if let Some(handle) = pod.metadata.uid.as_ref().and_then(|u| workers.get(u)) {
                    let _ = handle.tx.send(PodUpdate::Gone);
                }
            }
            Err(e) => warn!(error = %e, "pod watch failed; retrying"),
        }
        workers.retain(|_, h| !h.task.is_finished());
    }
    info!(pods = workers.len(), "stopping pod workers");
    for handle in workers.values() {
        let _ = handle.tx.send(PodUpdate::AgentStopping);
    }
    for (_, handle) in workers {
        let _ = handle.task.await;
    }
}

fn dispatch(agent: &Arc<Agent>, workers: &mut HashMap<String, WorkerHandle>, pod: Pod) {
    let Some(uid) = pod.metadata.uid.clone() else { return };
    let pod = Arc::new(pod);
    if let Some(handle) = workers.get(&uid)
        && !handle.task.is_finished()
    {
        let _ = handle.tx.send(PodUpdate::Present(pod));
        return;
    }
    let (tx, rx) = watch::channel(PodUpdate::Present(pod.clone()));
    let task = tokio::spawn(worker::PodWorker::new(agent.clone(), pod, rx).run());
    workers.insert(uid, WorkerHandle { tx, task });
}

/// Removes what pods that no longer exist left behind (after an agent crash): processes,
/// network namespaces, addresses and folders.
async fn clean_orphans(agent: &Agent, present: &HashSet<String>) {
    let known_namespaces: HashSet<String> = present.iter().map(|uid| agent.network.names(uid).netns).collect();
    if let Ok(dirs) = std::fs::read_dir(&agent.pods_dir) {
        for dir in dirs.flatten() {
            let uid = dir.file_name().to_string_lossy().to_string();
            if present.contains(&uid) {
                continue;
            }
            info!(pod_uid = %uid, "cleaning up after a pod that no longer exists");
            crate::process::kill_recorded_processes(&dir.path());
            agent.cgroups.remove_pod(&uid).await;
            let _ = agent.network.destroy(&agent.network.names(&uid)).await;
            let _ = agent.network.release(&uid);
            let _ = std::fs::remove_dir_all(dir.path());
        }
    }
    for uid in agent.cgroups.pod_uids() {
        if !present.contains(&uid) {
            agent.cgroups.remove_pod(&uid).await;
        }
    }
    // Only this node's namespaces: the other nodes' pods share the bridge and /run/netns.
    for names in agent.network.existing_namespaces() {
        if !known_namespaces.contains(&names.netns) {
            let _ = agent.network.destroy(&names).await;
        }
    }
    if let Ok(holders) = agent.network.holders() {
        for (_, uid) in holders {
            if !present.contains(&uid) {
                let _ = agent.network.release(&uid);
            }
        }
    }
}

/// The file a container writes its termination message to (bind-mounted at its
/// `terminationMessagePath`), read when it exits.
pub fn termination_file(pod_dir: &Path, container: &str) -> PathBuf {
    pod_dir.join("termination").join(container)
}

/// The log file of a container instance.
pub fn log_path(pod_dir: &Path, container: &str, restart: i32) -> PathBuf {
    pod_dir.join("logs").join(container).join(format!("{restart}.log"))
}
