//! One pod's life on this node: sandbox, init containers in order, containers, probes, restarts
//! with back-off, status, and graceful deletion.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, ObjectReference, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource};
use nix::sys::signal::Signal;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::launch::{self, PodSandbox};
use super::status::{self, Condition, ContainerPhase, ContainerView, PodView, StateView, TerminatedView};
use super::{Agent, PodUpdate, log_path};
use crate::downward::PodFacts;
use crate::env::{EnvSources, container_env};
use crate::network::PodNetNames;
use crate::node::FIELD_MANAGER;
use crate::probes::{self, ProbeKind, ProbeTarget, ProbeTiming, ProbeTracker};
use crate::sandbox::{self, ProcessSpec};
use crate::volumes::Volumes;

/// Longest back-off between restarts of a crashing container (the kubelet's).
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// A container that ran this long without crashing starts its back-off afresh.
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(600);
/// How often generated volumes are refreshed (ConfigMap/Secret changes, token renewal).
const VOLUME_REFRESH: Duration = Duration::from_secs(60);
/// Grace period when the agent itself stops, or when a pod object vanished.
const SHORT_GRACE: Duration = Duration::from_secs(5);

/// How a container instance ended.
#[derive(Debug, Clone, Copy)]
struct ExitInfo {
    code: i32,
    signal: Option<i32>,
    at: jiff::Timestamp,
}

enum WorkerEvent {
    Exited {
        container: String,
        instance: u64,
        exit: ExitInfo,
    },
    ProbeFailed {
        container: String,
        instance: u64,
        kind: ProbeKind,
        message: String,
    },
    ProbeVerdict {
        container: String,
        instance: u64,
        kind: ProbeKind,
        healthy: bool,
    },
}

struct Running {
    instance: u64,
    pid: u32,
    started_at: jiff::Timestamp,
    started_instant: Instant,
    exited: watch::Receiver<Option<ExitInfo>>,
    probes: Option<JoinHandle<()>>,
    container_id: String,
    /// Why the agent is stopping this instance, if it is (shown as the termination message).
    stop_reason: Option<String>,
}

struct Slot {
    spec: Container,
    restart_count: i32,
    /// Whether an instance ever ran (restarts count from the second start on).
    ran_before: bool,
    running: Option<Running>,
    last_terminated: Option<TerminatedView>,
    waiting: Option<(String, Option<String>)>,
    next_start: Option<Instant>,
    backoff: Duration,
    /// Init containers: finished successfully.
    completed: bool,
    started: bool,
    ready: bool,
}

impl Slot {
    fn new(
        spec: Container,
        init: bool,
        previous: Option<&k8s_openapi::api::core::v1::ContainerStatus>,
        backoff: Duration,
    ) -> Self {
        // A container that had finished before this agent started stays finished: an init
        // container that succeeded is not run again, and the restart policy decides about the
        // others as if they had just exited.
        let state = previous.and_then(|s| s.state.as_ref());
        let finished = state.and_then(|s| s.terminated.as_ref()).map(|t| TerminatedView {
            exit_code: t.exit_code,
            signal: t.signal,
            reason: t.reason.clone().unwrap_or_else(|| "Error".into()),
            message: t.message.clone(),
            started_at: t
                .started_at
                .as_ref()
                .map(|t| t.0)
                .unwrap_or(jiff::Timestamp::UNIX_EPOCH),
            finished_at: t
                .finished_at
                .as_ref()
                .map(|t| t.0)
                .unwrap_or(jiff::Timestamp::UNIX_EPOCH),
            container_id: t.container_id.clone().unwrap_or_default(),
        });
        let completed = init && finished.as_ref().is_some_and(|t| t.exit_code == 0);
        Self {
            spec,
            restart_count: previous.map(|s| s.restart_count).unwrap_or(0),
            ran_before: state
                .map(|s| s.running.is_some() || s.terminated.is_some())
                .unwrap_or(false),
            running: None,
            waiting: (!completed).then(|| ("ContainerCreating".into(), None)),
            last_terminated: finished,
            next_start: None,
            backoff,
            completed,
            started: false,
            ready: false,
        }
    }

    fn name(&self) -> &str {
        &self.spec.name
    }

    fn phase(&self) -> ContainerPhase {
        match (&self.running, &self.last_terminated, self.next_start) {
            (Some(_), _, _) => ContainerPhase::Running,
            (None, None, _) => ContainerPhase::NeverStarted,
            (None, Some(_), Some(_)) => ContainerPhase::Restarting,
            (None, Some(t), None) => ContainerPhase::Terminated { exit_code: t.exit_code },
        }
    }
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
    sandbox_problem: Option<(String, String)>,
    next_sandbox_try: Instant,
    sandbox_backoff: Duration,
    last_volume_refresh: Instant,
    init: Vec<Slot>,
    main: Vec<Slot>,
    events_tx: mpsc::UnboundedSender<WorkerEvent>,
    events_rx: mpsc::UnboundedReceiver<WorkerEvent>,
    next_instance: u64,
    start_time: jiff::Timestamp,
    conditions: BTreeMap<&'static str, (bool, jiff::Timestamp)>,
    last_status: Option<serde_json::Value>,
    /// Terminal pods (Succeeded/Failed) run nothing more.
    finished: bool,
    manager_gone: bool,
}

impl PodWorker {
    pub fn new(agent: Arc<Agent>, pod: Arc<Pod>, updates: watch::Receiver<PodUpdate>) -> Self {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let status = pod.status.clone().unwrap_or_default();
        let previous = |list: &Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>, name: &str| {
            list.iter().flatten().find(|s| s.name == name).cloned()
        };
        let init = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| {
                Slot::new(
                    c.clone(),
                    true,
                    previous(&status.init_container_statuses, &c.name).as_ref(),
                    agent.crash_backoff,
                )
            })
            .collect();
        let main = spec
            .containers
            .iter()
            .map(|c| {
                Slot::new(
                    c.clone(),
                    false,
                    previous(&status.container_statuses, &c.name).as_ref(),
                    agent.crash_backoff,
                )
            })
            .collect();
        let mut init: Vec<Slot> = init;
        let mut main: Vec<Slot> = main;
        // Containers restored as finished come back when the restart policy says so.
        let policy = spec.restart_policy.clone().unwrap_or_else(|| "Always".into());
        for slot in init.iter_mut().chain(main.iter_mut()) {
            let failed = slot.last_terminated.as_ref().is_some_and(|t| t.exit_code != 0);
            let restart = match policy.as_str() {
                "Never" => false,
                "OnFailure" => failed,
                _ => !slot.completed,
            };
            if slot.last_terminated.is_some() && restart {
                slot.next_start = Some(Instant::now());
            }
        }
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let finished = matches!(status.phase.as_deref(), Some("Succeeded") | Some("Failed"));
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
            sandbox_backoff: Duration::from_secs(1),
            last_volume_refresh: Instant::now(),
            init,
            main,
            events_tx,
            events_rx,
            next_instance: 1,
            start_time,
            conditions: BTreeMap::new(),
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

    fn restart_policy(&self) -> String {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into())
    }

    fn pod_name(&self) -> String {
        format!(
            "{}/{}",
            self.pod.metadata.namespace.as_deref().unwrap_or("default"),
            self.pod.metadata.name.as_deref().unwrap_or("")
        )
    }

    pub async fn run(mut self) {
        kill_recorded_processes(&self.dir);
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
                    self.drive_containers().await;
                }
            }
            self.publish_status().await;
            if self.is_terminal() && !self.finished {
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

    fn next_deadline(&self) -> Instant {
        let mut deadline = Instant::now() + Duration::from_secs(30);
        if self.sandbox.is_none() && !self.finished {
            deadline = deadline.min(self.next_sandbox_try);
        }
        if self.sandbox.is_some() {
            deadline = deadline.min(self.last_volume_refresh + VOLUME_REFRESH);
        }
        for slot in self.init.iter().chain(self.main.iter()) {
            if let Some(t) = slot.next_start {
                deadline = deadline.min(t);
            }
        }
        deadline.max(Instant::now() + Duration::from_millis(50))
    }

    /// Containers whose image changed (the only mutable part of a pod's containers) are restarted.
    async fn adopt_spec_changes(&mut self, pod: Arc<Pod>) {
        let new_containers = pod.spec.as_ref().map(|s| s.containers.clone()).unwrap_or_default();
        self.pod = pod;
        for c in new_containers {
            let Some(idx) = self.main.iter().position(|s| s.spec.name == c.name) else {
                continue;
            };
            if self.main[idx].spec.image != c.image {
                info!(pod = %self.pod_name(), container = %c.name, image = ?c.image, "container image changed; restarting it");
                self.main[idx].spec = c;
                let reason = format!(
                    "Container {} definition changed, will be restarted",
                    self.main[idx].name()
                );
                self.event(EventType::Normal, "Killing", &reason).await;
                // A changed definition restarts the container whatever the restart policy,
                // at once and without counting as a crash.
                let grace = self.grace_period();
                self.stop_only(false, idx, grace, "definition changed").await;
                let slot = &mut self.main[idx];
                slot.backoff = self.agent.crash_backoff;
                slot.waiting = None;
                slot.next_start = Some(Instant::now());
            }
        }
    }

    // ---- sandbox --------------------------------------------------------------------------

    async fn ensure_sandbox(&mut self) {
        if self.sandbox.is_some() || Instant::now() < self.next_sandbox_try {
            return;
        }
        match self.create_sandbox().await {
            Ok(sandbox) => {
                self.sandbox = Some(sandbox);
                self.sandbox_problem = None;
                self.last_volume_refresh = Instant::now();
            }
            Err((reason, message)) => {
                warn!(pod = %self.pod_name(), %reason, %message, "pod sandbox not ready");
                if self.sandbox_problem.as_ref().map(|p| &p.1) != Some(&message) {
                    self.event(EventType::Warning, &reason, &message).await;
                }
                self.sandbox_problem = Some((reason, message));
                self.next_sandbox_try = Instant::now() + self.sandbox_backoff;
                self.sandbox_backoff = (self.sandbox_backoff * 2).min(Duration::from_secs(30));
            }
        }
    }

    async fn create_sandbox(&mut self) -> Result<PodSandbox, (String, String)> {
        let failed = |reason: &str| {
            let reason = reason.to_string();
            move |e: &dyn std::fmt::Display| (reason.clone(), e.to_string())
        };
        let host_network = self.host_network();
        let ip = if host_network {
            self.agent.node.ip
        } else {
            let ip = self
                .agent
                .network
                .allocate(&self.uid)
                .map_err(|e| failed("FailedCreatePodSandBox")(&e))?;
            self.agent
                .network
                .create(&self.names, ip)
                .await
                .map_err(|e| failed("FailedCreatePodSandBox")(&e))?;
            info!(pod = %self.pod_name(), %ip, netns = %self.names.netns, "created pod network");
            ip
        };
        self.ip = Some(ip);
        let io = failed("FailedCreatePodSandBox");
        std::fs::create_dir_all(&self.dir).map_err(|e| io(&e))?;
        let hosts_file = self.dir.join("hosts");
        let resolv_file = self.dir.join("resolv.conf");
        let domain = &self.agent.cluster_domain;
        std::fs::write(&hosts_file, launch::hosts_file(&self.pod, ip, domain)).map_err(|e| io(&e))?;
        std::fs::write(
            &resolv_file,
            launch::resolv_conf(&self.pod, self.agent.dns_server, domain),
        )
        .map_err(|e| io(&e))?;
        let fs_group = self.fs_group();
        let facts = self.facts(ip);
        let volumes = Volumes {
            client: &self.agent.client,
            facts,
            dir: &self.dir.join("volumes"),
            fs_group,
        };
        let volumes = volumes.prepare_all().await.map_err(|e| failed(e.reason())(&e))?;
        Ok(PodSandbox {
            hostname: launch::hostname(&self.pod),
            pod_ip: ip,
            host_network,
            volumes,
            hosts_file,
            resolv_file,
            api_service: self.agent.api_service,
        })
    }

    fn fs_group(&self) -> Option<u32> {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|s| s.fs_group)
            .and_then(|g| u32::try_from(g).ok())
    }

    fn facts(&self, ip: Ipv4Addr) -> PodFacts<'_> {
        PodFacts {
            pod: &self.pod,
            pod_ip: ip,
            host_ip: self.agent.node.ip,
            node_cpu: self.agent.node.cpu as f64,
            node_memory: self.agent.node.memory_bytes as f64,
        }
    }

    async fn refresh_volumes_if_due(&mut self) {
        if self.last_volume_refresh.elapsed() < VOLUME_REFRESH {
            return;
        }
        self.last_volume_refresh = Instant::now();
        let Some(ip) = self.ip else { return };
        let volumes = Volumes {
            client: &self.agent.client,
            facts: self.facts(ip),
            dir: &self.dir.join("volumes"),
            fs_group: self.fs_group(),
        };
        if let Err(e) = volumes.refresh().await {
            warn!(pod = %self.pod_name(), error = %e, "failed to refresh volumes");
        }
    }

    async fn release_network(&mut self) {
        if !self.host_network() {
            if let Err(e) = self.agent.network.destroy(&self.names).await {
                warn!(pod = %self.pod_name(), error = %e, "failed to remove pod network");
            }
            let _ = self.agent.network.release(&self.uid);
        }
    }

    /// Removes the pod's network; with `everything`, also its address and folder (the pod is
    /// gone for good). Persistent volumes live elsewhere and are untouched.
    async fn teardown(&mut self, everything: bool) {
        if !self.host_network()
            && let Err(e) = self.agent.network.destroy(&self.names).await
        {
            warn!(pod = %self.pod_name(), error = %e, "failed to remove pod network");
        }
        if everything {
            let _ = self.agent.network.release(&self.uid);
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    // ---- containers -----------------------------------------------------------------------

    async fn drive_containers(&mut self) {
        let policy = self.restart_policy();
        for idx in 0..self.init.len() {
            if self.init[idx].completed {
                continue;
            }
            if self.init[idx].running.is_some() {
                return;
            }
            if self.init[idx].last_terminated.is_some() && policy == "Never" {
                return;
            }
            if let Some(at) = self.init[idx].next_start
                && Instant::now() < at
            {
                return;
            }
            self.start(true, idx).await;
            return;
        }
        for idx in 0..self.main.len() {
            let slot = &self.main[idx];
            if slot.running.is_some() {
                continue;
            }
            let due = match (&slot.last_terminated, slot.next_start) {
                (_, Some(at)) => Instant::now() >= at,
                (None, None) => true,
                (Some(_), None) => false,
            };
            if due {
                self.start(false, idx).await;
            }
        }
    }

    fn slot(&mut self, init: bool, idx: usize) -> &mut Slot {
        if init { &mut self.init[idx] } else { &mut self.main[idx] }
    }

    /// Starts one container; failures to start are recorded as the container's waiting reason.
    async fn start(&mut self, init: bool, idx: usize) {
        let Some(sandbox) = self.sandbox.clone() else { return };
        let spec = self.slot(init, idx).spec.clone();
        match self.launch(&spec, &sandbox, init, idx).await {
            Ok(()) => {}
            Err((reason, message)) => {
                warn!(pod = %self.pod_name(), container = %spec.name, %reason, %message, "container not started");
                let slot = self.slot(init, idx);
                let repeated = slot.waiting.as_ref().map(|w| &w.0) == Some(&reason);
                slot.waiting = Some((reason.clone(), Some(message.clone())));
                // Configuration problems may be fixed (a Secret created, the image map edited).
                slot.next_start = Some(Instant::now() + Duration::from_secs(5));
                if !repeated {
                    self.event(EventType::Warning, "Failed", &format!("Error: {message}"))
                        .await;
                }
            }
        }
    }

    async fn launch(
        &mut self,
        spec: &Container,
        sandbox: &PodSandbox,
        init: bool,
        idx: usize,
    ) -> Result<(), (String, String)> {
        let image = spec.image.clone().unwrap_or_default();
        let namespace = self.pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let config_error = |e: &dyn std::fmt::Display| ("CreateContainerConfigError".to_string(), e.to_string());
        let sources = EnvSources::fetch(&self.agent.client, &namespace, spec)
            .await
            .map_err(|e| config_error(&e))?;
        let facts = self.facts(sandbox.pod_ip);
        let own_env = container_env(&facts, spec, &sources, &BTreeMap::new()).map_err(|e| config_error(&e))?;
        let (command, args) = launch::command_and_args(spec, &own_env);
        let is_executable = |p: &Path| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        };
        let program = self
            .agent
            .images
            .current()
            .resolve(&image, &command, &args, &is_executable)
            .map_err(|e| match e {
                crate::images::ImageError::NotMapped { .. } => ("ImageNotMapped".to_string(), e.to_string()),
                other => ("CreateContainerError".to_string(), other.to_string()),
            })?;
        let lookup_user = |name: &str| {
            nix::unistd::User::from_name(name)
                .ok()
                .flatten()
                .map(|u| (u.uid.as_raw(), u.gid.as_raw()))
        };
        let identity =
            launch::identity(&self.pod, spec, program.user.as_deref(), &lookup_user).map_err(|e| config_error(&e))?;
        let env = launch::environment(&program, sandbox, &identity, &own_env);
        let mounts = launch::mounts(spec, sandbox).map_err(|e| config_error(&e))?;
        let working_dir = spec
            .working_dir
            .clone()
            .or(program.working_dir.clone())
            .map(PathBuf::from);
        let slot = self.slot(init, idx);
        if slot.ran_before {
            slot.restart_count += 1;
        }
        let restart = slot.restart_count;
        let log_file = log_path(&self.dir, &spec.name, restart);
        let process = ProcessSpec {
            program: program.program.clone(),
            args: program.args.clone(),
            env: env.clone(),
            working_dir,
            uid: identity.uid,
            gid: identity.gid,
            supplementary_groups: identity.groups.clone(),
            netns: (!sandbox.host_network).then(|| self.names.netns_path()),
            hostname: (!sandbox.host_network).then(|| sandbox.hostname.clone()),
            mounts,
            layer_dir: self.dir.join("containers").join(&spec.name),
            log_file,
        };
        let mut child = sandbox::spawn(&process).map_err(|e| {
            (
                "RunContainerError".to_string(),
                format!("failed to start {}: {e}", program.program.display()),
            )
        })?;
        let pid = child.id().unwrap_or(0);
        record_pid(&self.dir, &spec.name, pid);
        let instance = self.next_instance;
        self.next_instance += 1;
        let (exit_tx, exit_rx) = watch::channel(None);
        let events = self.events_tx.clone();
        let name = spec.name.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            let exit = match status {
                Ok(s) => ExitInfo {
                    code: s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
                    signal: s.signal(),
                    at: jiff::Timestamp::now(),
                },
                Err(_) => ExitInfo {
                    code: 255,
                    signal: None,
                    at: jiff::Timestamp::now(),
                },
            };
            // A container ends with its main process, as when PID 1 of a container exits: what
            // it left running in its process group is killed, so nothing holds the port or the
            // network namespace of the next instance.
            let _ = sandbox::signal_group(pid, Signal::SIGKILL);
            let _ = exit_tx.send(Some(exit));
            let _ = events.send(WorkerEvent::Exited {
                container: name,
                instance,
                exit,
            });
        });
        let target = ProbeTarget {
            source: self.agent.node.ip,
            pod_ip: sandbox.pod_ip,
            host_network: sandbox.host_network,
            pid,
            env,
        };
        let has_startup = spec.startup_probe.is_some();
        let probes = probe_task(spec.clone(), target, instance, self.events_tx.clone());
        let uid_short: String = self.uid.chars().take(8).collect();
        let slot = self.slot(init, idx);
        slot.ran_before = true;
        slot.waiting = None;
        slot.next_start = None;
        slot.started = !has_startup;
        slot.ready = false;
        slot.running = Some(Running {
            instance,
            pid,
            started_at: jiff::Timestamp::now(),
            started_instant: Instant::now(),
            exited: exit_rx,
            probes,
            container_id: format!("noops://{uid_short}-{}-{restart}", spec.name),
            stop_reason: None,
        });
        info!(pod = %self.pod_name(), container = %spec.name, pid, restart, program = %program.program.display(), "started container");
        self.event(
            EventType::Normal,
            "Started",
            &format!("Started container {}", spec.name),
        )
        .await;
        Ok(())
    }

    async fn handle(&mut self, event: WorkerEvent) {
        match event {
            WorkerEvent::Exited {
                container,
                instance,
                exit,
            } => self.on_exit(&container, instance, exit).await,
            WorkerEvent::ProbeFailed {
                container,
                instance,
                kind,
                message,
            } => {
                if self.find_running(&container, instance).is_some() {
                    let note = format!("{} probe failed: {message}", kind.name());
                    debug!(pod = %self.pod_name(), %container, %note);
                    self.event(EventType::Warning, "Unhealthy", &note).await;
                }
            }
            WorkerEvent::ProbeVerdict {
                container,
                instance,
                kind,
                healthy,
            } => {
                let Some((init, idx)) = self.find_running(&container, instance) else {
                    return;
                };
                match (kind, healthy) {
                    (ProbeKind::Readiness, ready) => self.slot(init, idx).ready = ready,
                    (ProbeKind::Startup, true) => self.slot(init, idx).started = true,
                    (ProbeKind::Liveness, true) => {}
                    (kind, false) => {
                        let note = format!(
                            "Container {container} failed {} probe, will be restarted",
                            kind.name().to_lowercase()
                        );
                        info!(pod = %self.pod_name(), %container, "{note}");
                        self.event(EventType::Normal, "Killing", &note).await;
                        let grace = self.grace_period();
                        let reason = format!("{} probe failed", kind.name());
                        self.stop_slot(init, idx, grace, &reason).await;
                    }
                }
            }
        }
    }

    fn find_running(&self, container: &str, instance: u64) -> Option<(bool, usize)> {
        let matches = |s: &Slot| s.name() == container && s.running.as_ref().map(|r| r.instance) == Some(instance);
        if let Some(i) = self.init.iter().position(matches) {
            return Some((true, i));
        }
        self.main.iter().position(matches).map(|i| (false, i))
    }

    async fn on_exit(&mut self, container: &str, instance: u64, exit: ExitInfo) {
        let Some((init, idx)) = self.find_running(container, instance) else {
            return;
        };
        self.record_exit(init, idx, exit);
        self.after_exit(init, idx, exit).await;
    }

    /// Decides what follows an exit: an init container that succeeded is done; otherwise the
    /// restart policy says whether the container comes back, after its back-off.
    async fn after_exit(&mut self, init: bool, idx: usize, exit: ExitInfo) {
        let policy = self.restart_policy();
        let pod = self.pod_name();
        let slot = self.slot(init, idx);
        let succeeded = exit.code == 0;
        info!(%pod, container = slot.name(), exit_code = exit.code, restarts = slot.restart_count, "container exited");
        if init && succeeded {
            slot.completed = true;
            return;
        }
        let restart = match policy.as_str() {
            "Never" => false,
            "OnFailure" => !succeeded,
            _ => true,
        };
        if !restart {
            return;
        }
        let delay = slot.backoff;
        slot.next_start = Some(Instant::now() + delay);
        slot.backoff = (slot.backoff * 2).min(MAX_BACKOFF);
        let name = slot.name().to_string();
        slot.waiting = Some((
            "CrashLoopBackOff".into(),
            Some(format!(
                "back-off {}s restarting failed container={name}",
                delay.as_secs()
            )),
        ));
        self.event(
            EventType::Warning,
            "BackOff",
            &format!("Back-off restarting failed container {name} in pod {pod}"),
        )
        .await;
    }

    /// Moves a finished instance into `last_terminated`.
    fn record_exit(&mut self, init: bool, idx: usize, exit: ExitInfo) {
        let crash_backoff = self.agent.crash_backoff;
        let slot = self.slot(init, idx);
        let Some(running) = slot.running.take() else { return };
        if let Some(task) = &running.probes {
            task.abort();
        }
        if running.started_instant.elapsed() >= BACKOFF_RESET_AFTER {
            slot.backoff = crash_backoff;
        }
        slot.ready = false;
        slot.started = false;
        slot.last_terminated = Some(TerminatedView {
            exit_code: exit.code,
            signal: exit.signal,
            reason: if exit.code == 0 {
                "Completed".into()
            } else {
                "Error".into()
            },
            message: running.stop_reason.clone(),
            started_at: running.started_at,
            finished_at: exit.at,
            container_id: running.container_id.clone(),
        });
    }

    fn grace_period(&self) -> Duration {
        let secs = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30);
        Duration::from_secs(secs.max(0) as u64)
    }

    /// Stops one container (TERM to its process group, KILL after `grace`); the restart policy
    /// then applies as after any exit.
    async fn stop_slot(&mut self, init: bool, idx: usize, grace: Duration, reason: &str) {
        if let Some(exit) = self.stop_only(init, idx, grace, reason).await {
            self.after_exit(init, idx, exit).await;
        }
    }

    /// Stops one container and records its end, without deciding what comes next.
    async fn stop_only(&mut self, init: bool, idx: usize, grace: Duration, reason: &str) -> Option<ExitInfo> {
        let slot = self.slot(init, idx);
        let running = slot.running.as_mut()?;
        running.stop_reason = Some(reason.to_string());
        let pid = running.pid;
        let mut exited = running.exited.clone();
        let exit = stop_process(pid, &mut exited, grace).await;
        self.record_exit(init, idx, exit);
        Some(exit)
    }

    /// Stops every running container at once, giving them `grace` together. A pod update that
    /// shortens the grace period (or a forced deletion) while waiting is honoured.
    async fn stop_all(&mut self, grace: Duration, reason: &str) {
        let mut targets = vec![];
        for (init, slots) in [(true, &mut self.init), (false, &mut self.main)] {
            for (idx, slot) in slots.iter_mut().enumerate() {
                if let Some(r) = slot.running.as_mut() {
                    r.stop_reason = Some(reason.to_string());
                    let _ = sandbox::signal_group(r.pid, Signal::SIGTERM);
                    targets.push((init, idx, r.pid, r.exited.clone()));
                }
            }
        }
        let started = Instant::now();
        let mut deadline = started + grace;
        for (init, idx, pid, mut exited) in targets {
            let exit = loop {
                if let Some(exit) = *exited.borrow() {
                    break exit;
                }
                tokio::select! {
                    _ = exited.changed() => {}
                    _ = tokio::time::sleep_until(deadline) => break stop_process(pid, &mut exited, Duration::ZERO).await,
                    changed = self.updates.changed() => {
                        let shorter = match &*self.updates.borrow() {
                            _ if changed.is_err() => Some(Duration::ZERO),
                            PodUpdate::Gone | PodUpdate::AgentStopping => Some(Duration::ZERO),
                            PodUpdate::Present(pod) => pod.metadata.deletion_grace_period_seconds.map(|s| Duration::from_secs(s.max(0) as u64)),
                        };
                        if let Some(g) = shorter {
                            deadline = deadline.min(started + g);
                        }
                        if changed.is_err() {
                            break stop_process(pid, &mut exited, Duration::ZERO).await;
                        }
                    }
                }
            };
            self.record_exit(init, idx, exit);
        }
    }

    /// Graceful pod deletion: stop containers within the grace period, tear down, then remove
    /// the pod object (grace 0, same UID) as the kubelet does.
    async fn delete_gracefully(&mut self) {
        let grace = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .map(|s| Duration::from_secs(s.max(0) as u64))
            .unwrap_or_else(|| self.grace_period());
        info!(pod = %self.pod_name(), grace_seconds = grace.as_secs(), "pod is being deleted; stopping containers");
        if self.init.iter().chain(self.main.iter()).any(|s| s.running.is_some()) {
            for name in self
                .main
                .iter()
                .filter(|s| s.running.is_some())
                .map(|s| s.name().to_string())
                .collect::<Vec<_>>()
            {
                self.event(EventType::Normal, "Killing", &format!("Stopping container {name}"))
                    .await;
            }
        }
        self.stop_all(grace, "pod deleted").await;
        self.teardown(true).await;
        let api: Api<Pod> = Api::namespaced(
            self.agent.client.clone(),
            self.pod.metadata.namespace.as_deref().unwrap_or("default"),
        );
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(self.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        let name = self.pod.metadata.name.clone().unwrap_or_default();
        // Nothing else will finish the deletion (no further event comes for a pod that is not
        // changing), so transient failures are retried here.
        let mut delay = Duration::from_secs(1);
        for attempt in 1..=12 {
            match api.delete(&name, &params).await {
                Ok(_) => {
                    info!(pod = %self.pod_name(), "pod deleted");
                    return;
                }
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return,
                Err(e) => warn!(pod = %self.pod_name(), error = %e, attempt, "failed to delete pod object; retrying"),
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(30));
        }
    }

    // ---- status ---------------------------------------------------------------------------

    fn is_terminal(&self) -> bool {
        matches!(self.phase(), "Succeeded" | "Failed")
    }

    fn phase(&self) -> &'static str {
        if self.finished {
            return match self.pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
                Some("Failed") => "Failed",
                Some("Succeeded") => "Succeeded",
                _ => self.computed_phase(),
            };
        }
        self.computed_phase()
    }

    fn computed_phase(&self) -> &'static str {
        let init: Vec<_> = self.init.iter().map(Slot::phase).collect();
        let main: Vec<_> = self.main.iter().map(Slot::phase).collect();
        let init_done = self.init.iter().all(|s| s.completed);
        status::pod_phase(&self.restart_policy(), &init, init_done, &main)
    }

    fn condition(&mut self, type_: &'static str, value: bool, now: jiff::Timestamp) -> Condition {
        let entry = self.conditions.entry(type_).or_insert((value, now));
        if entry.0 != value {
            *entry = (value, now);
        }
        Condition {
            type_,
            status: value,
            reason: None,
            message: None,
            since: entry.1,
        }
    }

    async fn publish_status(&mut self) {
        if self.finished && self.last_status.is_some() {
            return;
        }
        let now = jiff::Timestamp::now();
        let phase = self.phase();
        let terminal = matches!(phase, "Succeeded" | "Failed");
        let sandbox_ready = self.sandbox.is_some() && !terminal;
        let initialized = self.init.iter().all(|s| s.completed);
        let containers_ready = !terminal && self.main.iter().all(|s| s.ready && s.running.is_some());
        let gates_ok = self.readiness_gates_ok();
        let mut conditions = vec![
            self.condition("PodReadyToStartContainers", sandbox_ready, now),
            self.condition("Initialized", initialized, now),
            self.condition("ContainersReady", containers_ready, now),
            self.condition("Ready", containers_ready && gates_ok, now),
        ];
        let not_ready: Vec<String> = self
            .main
            .iter()
            .filter(|s| !(s.ready && s.running.is_some()))
            .map(|s| s.name().to_string())
            .collect();
        for c in conditions.iter_mut() {
            if !c.status {
                match c.type_ {
                    "ContainersReady" | "Ready" if terminal => c.reason = Some("PodCompleted".into()),
                    "ContainersReady" | "Ready" => {
                        c.reason = Some("ContainersNotReady".into());
                        c.message = Some(format!("containers with unready status: [{}]", not_ready.join(" ")));
                    }
                    "Initialized" => c.reason = Some("ContainersNotInitialized".into()),
                    _ => {}
                }
            }
        }
        let sandbox_problem = self.sandbox_problem.clone();
        let view = PodView {
            phase,
            host_ip: self.agent.node.ip.to_string(),
            pod_ip: self.ip.filter(|_| !terminal).map(|ip| ip.to_string()),
            start_time: self.start_time,
            conditions,
            init: self.init.iter().map(|s| container_view(s, &sandbox_problem)).collect(),
            main: self.main.iter().map(|s| container_view(s, &sandbox_problem)).collect(),
        };
        let patch = status::status_patch(&view);
        if self.last_status.as_ref() == Some(&patch) {
            return;
        }
        let api: Api<Pod> = Api::namespaced(
            self.agent.client.clone(),
            self.pod.metadata.namespace.as_deref().unwrap_or("default"),
        );
        let name = self.pod.metadata.name.clone().unwrap_or_default();
        match api
            .patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
            .await
        {
            Ok(_) => self.last_status = Some(patch),
            Err(e) => warn!(pod = %self.pod_name(), error = %e, "failed to update pod status"),
        }
    }

    fn readiness_gates_ok(&self) -> bool {
        let gates = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.readiness_gates.clone())
            .unwrap_or_default();
        let conditions = self
            .pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        gates.iter().all(|g| {
            conditions
                .iter()
                .any(|c| c.type_ == g.condition_type && c.status == "True")
        })
    }

    async fn event(&self, type_: EventType, reason: &str, note: &str) {
        let reference: ObjectReference = self.pod.object_ref(&());
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note.chars().take(1000).collect()),
            action: reason.to_string(),
            secondary: None,
        };
        if let Err(e) = self.agent.recorder.publish(&event, &reference).await {
            debug!(error = %e, "failed to publish event");
        }
    }
}

fn container_view(slot: &Slot, sandbox_problem: &Option<(String, String)>) -> ContainerView {
    let state = if let Some(r) = &slot.running {
        StateView::Running {
            started_at: r.started_at,
        }
    } else if let Some((reason, message)) = &slot.waiting {
        match (reason.as_str(), sandbox_problem) {
            ("ContainerCreating", Some((_, m))) => StateView::Waiting {
                reason: reason.clone(),
                message: Some(m.clone()),
            },
            _ => StateView::Waiting {
                reason: reason.clone(),
                message: message.clone(),
            },
        }
    } else if let Some(t) = &slot.last_terminated {
        StateView::Terminated(t.clone())
    } else {
        StateView::Waiting {
            reason: "ContainerCreating".into(),
            message: None,
        }
    };
    let last_state = match &state {
        StateView::Terminated(_) => None,
        _ => slot.last_terminated.clone(),
    };
    ContainerView {
        name: slot.spec.name.clone(),
        image: slot.spec.image.clone().unwrap_or_default(),
        restart_count: slot.restart_count,
        state,
        last_state,
        ready: slot.ready && slot.running.is_some(),
        started: slot.started && slot.running.is_some(),
        container_id: slot.running.as_ref().map(|r| r.container_id.clone()),
    }
}

/// TERM the process group, wait up to `grace`, then KILL and wait for the exit.
async fn stop_process(pid: u32, exited: &mut watch::Receiver<Option<ExitInfo>>, grace: Duration) -> ExitInfo {
    if exited.borrow().is_none() {
        let _ = sandbox::signal_group(pid, Signal::SIGTERM);
    }
    let wait = |exited: &mut watch::Receiver<Option<ExitInfo>>, limit: Duration| {
        let mut exited = exited.clone();
        async move {
            let _ = tokio::time::timeout(limit, exited.wait_for(|e| e.is_some())).await;
            *exited.borrow()
        }
    };
    if let Some(exit) = wait(exited, grace).await {
        return exit;
    }
    let _ = sandbox::signal_group(pid, Signal::SIGKILL);
    wait(exited, Duration::from_secs(10)).await.unwrap_or(ExitInfo {
        code: 137,
        signal: Some(9),
        at: jiff::Timestamp::now(),
    })
}

/// Runs a container instance's probes: the startup probe until it passes, then liveness and
/// readiness side by side. Verdicts and failures go to the worker.
fn probe_task(
    container: Container,
    target: ProbeTarget,
    instance: u64,
    events: mpsc::UnboundedSender<WorkerEvent>,
) -> Option<JoinHandle<()>> {
    let startup = container.startup_probe.clone();
    let liveness = container.liveness_probe.clone();
    let readiness = container.readiness_probe.clone();
    let name = container.name.clone();
    let send = {
        let events = events.clone();
        let name = name.clone();
        move |kind: ProbeKind, healthy: bool| {
            let _ = events.send(WorkerEvent::ProbeVerdict {
                container: name.clone(),
                instance,
                kind,
                healthy,
            });
        }
    };
    Some(tokio::spawn(async move {
        let run = |kind: ProbeKind, probe: k8s_openapi::api::core::v1::Probe, stop_on_success: bool| {
            let container = container.clone();
            let target = target.clone();
            let events = events.clone();
            let name = name.clone();
            let send = send.clone();
            async move {
                let timing = ProbeTiming::of(&probe);
                let mut tracker = ProbeTracker::new(timing);
                tokio::time::sleep(timing.initial_delay).await;
                loop {
                    let result = probes::run_once(&probe, &container, &target).await;
                    if let Err(message) = &result {
                        let _ = events.send(WorkerEvent::ProbeFailed {
                            container: name.clone(),
                            instance,
                            kind,
                            message: message.clone(),
                        });
                    }
                    if let Some(verdict) = tracker.record(result.is_ok()) {
                        send(kind, verdict);
                        if stop_on_success && verdict {
                            return;
                        }
                    }
                    tokio::time::sleep(timing.period).await;
                }
            }
        };
        if let Some(p) = startup {
            run(ProbeKind::Startup, p, true).await;
        }
        let readiness_loop = async {
            match readiness.clone() {
                Some(p) => run(ProbeKind::Readiness, p, false).await,
                None => send(ProbeKind::Readiness, true),
            }
        };
        let liveness_loop = async {
            if let Some(p) = liveness.clone() {
                run(ProbeKind::Liveness, p, false).await;
            }
        };
        tokio::join!(readiness_loop, liveness_loop);
    }))
}

/// Records a container's process (group) so a restarted agent can stop what it left running.
fn record_pid(pod_dir: &Path, container: &str, pid: u32) {
    let dir = pod_dir.join("pids");
    let _ = std::fs::create_dir_all(&dir);
    if let Some(start) = process_start_time(pid) {
        let _ = std::fs::write(dir.join(container), format!("{pid} {start}"));
    }
}

/// The start time of a process in clock ticks since boot (from /proc), which tells a recorded
/// pid apart from a later process that reused the number.
fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: count fields after it.
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Kills the process groups recorded in a pod folder whose processes still run.
pub fn kill_recorded_processes(pod_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(pod_dir.join("pids")) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let mut parts = text.split_whitespace();
        let (Some(pid), Some(start)) = (parts.next().and_then(|p| p.parse::<u32>().ok()), parts.next()) else {
            continue;
        };
        // The group may outlive its leader. While any member lives, its number cannot be given
        // to a new process, so signalling the group is safe unless the number now belongs to a
        // different process (another start time).
        let leader_start = process_start_time(pid).map(|s| s.to_string());
        if leader_start.is_none() || leader_start.as_deref() == Some(start) {
            info!(pid, "stopping container processes left by an earlier agent");
            let _ = sandbox::signal_group(pid, Signal::SIGKILL);
        }
        let _ = std::fs::remove_file(entry.path());
    }
}
