//! One pod's life on this node, as a task that owns everything about it. This file is the loop:
//! take the pod as the API server has it now, make sure its sandbox exists, start what the
//! pure decision (`decide.rs`) says to start, report, then wait for the next thing to happen (a
//! pod update, a container exit, a probe verdict, a back-off ending). The concerns live beside
//! it:
//! - `sandbox.rs`: the pod's network, files and volumes;
//! - `containers.rs`: starting, stopping and restarting containers, and what their probes say;
//! - `termination.rs`: stopping everything, graceful deletion, teardown;
//! - `report.rs`: the pod status and Events.

mod containers;
mod report;
mod sandbox;
mod termination;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::info;

use self::containers::{ExitInfo, Slot};
use super::backoff::Backoff;
use super::decide::RestartPolicy;
use super::launch::PodSandbox;
use super::status::{PodPhase, Transitions};
use super::{Agent, PodUpdate};
use crate::network::PodNetNames;
use crate::probes::ProbeReport;

/// Grace period when the agent itself stops, or when a pod object vanished.
const SHORT_GRACE: Duration = Duration::from_secs(5);
/// Longest wait between two looks at the pod when nothing happens.
const IDLE_LOOK: Duration = Duration::from_secs(30);

/// What the tasks of a pod's containers (exit watchers, probes) tell its worker. `instance`
/// tells a report about the current instance of a container from one about an earlier one.
enum WorkerEvent {
    Exited {
        container: String,
        instance: u64,
        exit: ExitInfo,
    },
    Probe {
        container: String,
        instance: u64,
        report: ProbeReport,
    },
}

pub struct PodWorker {
    agent: Arc<Agent>,
    pod: Arc<Pod>,
    updates: watch::Receiver<PodUpdate>,
    uid: String,
    dir: PathBuf,
    names: PodNetNames,
    ip: Option<Ipv4Addr>,
    sandbox: Option<PodSandbox>,
    /// Why the sandbox could not be made (reason, message), shown on waiting containers.
    sandbox_problem: Option<(String, String)>,
    next_sandbox_try: Instant,
    sandbox_backoff: Backoff,
    last_volume_refresh: Instant,
    init: Vec<Slot>,
    main: Vec<Slot>,
    events_tx: mpsc::UnboundedSender<WorkerEvent>,
    events_rx: mpsc::UnboundedReceiver<WorkerEvent>,
    next_instance: u64,
    start_time: jiff::Timestamp,
    transitions: Transitions,
    last_status: Option<serde_json::Value>,
    /// Terminal pods (Succeeded/Failed) run nothing more.
    finished: bool,
    manager_gone: bool,
}

impl PodWorker {
    pub fn new(agent: Arc<Agent>, pod: Arc<Pod>, updates: watch::Receiver<PodUpdate>) -> Self {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let status = pod.status.clone().unwrap_or_default();
        let (init, main) = Slot::restore_all(&pod, agent.crash_backoff);
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let finished = PodPhase::parse(status.phase.as_deref()).is_some_and(PodPhase::is_terminal);
        let start_time = status.start_time.map(|t| t.0).unwrap_or_else(jiff::Timestamp::now);
        Self {
            dir: agent.pod_dir(&uid),
            names: agent.network.names(&uid),
            agent,
            pod,
            updates,
            uid,
            ip: None,
            sandbox: None,
            sandbox_problem: None,
            next_sandbox_try: Instant::now(),
            sandbox_backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(30)),
            last_volume_refresh: Instant::now(),
            init,
            main,
            events_tx,
            events_rx,
            next_instance: 1,
            start_time,
            transitions: Transitions::default(),
            // A pod that finished before this agent started keeps the status it has (with its
            // containers' exit codes): there is nothing new to say about it.
            last_status: finished.then_some(serde_json::Value::Null),
            finished,
            manager_gone: false,
        }
    }

    fn host_network(&self) -> bool {
        self.pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false)
    }

    fn restart_policy(&self) -> RestartPolicy {
        RestartPolicy::of(&self.pod)
    }

    fn pod_name(&self) -> String {
        format!(
            "{}/{}",
            self.pod.metadata.namespace.as_deref().unwrap_or("default"),
            self.pod.metadata.name.as_deref().unwrap_or("")
        )
    }

    pub async fn run(mut self) {
        crate::process::kill_recorded_processes(&self.dir);
        self.agent.cgroups.kill_pod(&self.uid);
        if self.finished {
            info!(pod = %self.pod_name(), "pod already finished; not starting it again");
        }
        while !self.manager_gone {
            let update = self.updates.borrow_and_update().clone();
            match update {
                PodUpdate::Gone => {
                    info!(pod = %self.pod_name(), "pod object is gone; stopping its containers");
                    self.stop_all(SHORT_GRACE, "pod deleted").await;
                    self.teardown(true).await;
                    return;
                }
                PodUpdate::AgentStopping => {
                    self.stop_all(SHORT_GRACE, "node agent stopping").await;
                    self.teardown(false).await;
                    return;
                }
                PodUpdate::Present(pod) => self.adopt_spec_changes(pod).await,
            }
            if self.pod.metadata.deletion_timestamp.is_some() {
                self.delete_gracefully().await;
                return;
            }
            if !self.finished {
                let had_sandbox = self.sandbox.is_some();
                self.ensure_sandbox().await;
                if !had_sandbox && self.sandbox.is_some() {
                    // Report the pod IP before any container starts, so that peers can find it
                    // (endpoints, DNS) by the time it looks for them.
                    self.publish_status().await;
                }
                if self.sandbox.is_some() {
                    self.refresh_volumes_if_due().await;
                    self.start_due_containers().await;
                }
            }
            self.publish_status().await;
            if self.phase().is_terminal() && !self.finished {
                self.finished = true;
                info!(pod = %self.pod_name(), "pod finished; releasing its network");
                self.release_network().await;
                self.publish_status().await;
            }
            self.wait_for_something().await;
        }
    }

    async fn wait_for_something(&mut self) {
        let deadline = self.next_deadline();
        tokio::select! {
            changed = self.updates.changed() => {
                if changed.is_err() {
                    // The manager is gone without a word: behave as on agent shutdown.
                    self.stop_all(SHORT_GRACE, "node agent stopping").await;
                    self.teardown(false).await;
                    self.manager_gone = true;
                }
            }
            Some(event) = self.events_rx.recv() => self.handle(event).await,
            _ = tokio::time::sleep_until(deadline) => {}
        }
        while let Ok(event) = self.events_rx.try_recv() {
            self.handle(event).await;
        }
    }

    async fn handle(&mut self, event: WorkerEvent) {
        match event {
            WorkerEvent::Exited {
                container,
                instance,
                exit,
            } => self.on_exit(&container, instance, exit).await,
            WorkerEvent::Probe {
                container,
                instance,
                report,
            } => self.on_probe(&container, instance, report).await,
        }
    }

    /// The next moment something is due without a word from outside: the sandbox retry, the
    /// volume refresh, a container's back-off.
    fn next_deadline(&self) -> Instant {
        let mut deadline = Instant::now() + IDLE_LOOK;
        if self.sandbox.is_none() && !self.finished {
            deadline = deadline.min(self.next_sandbox_try);
        }
        if self.sandbox.is_some() {
            deadline = deadline.min(self.last_volume_refresh + self.agent.sync_frequency);
        }
        for slot in self.init.iter().chain(self.main.iter()) {
            if let Some(t) = slot.next_start {
                deadline = deadline.min(t);
            }
        }
        deadline.max(Instant::now() + Duration::from_millis(50))
    }
}
