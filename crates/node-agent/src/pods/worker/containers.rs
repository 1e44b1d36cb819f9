//! A pod's containers: what the worker knows of each (its slot), starting the ones the
//! decision says to start, what follows an exit, what their probes report, and stopping one.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod};
use kube::runtime::events::EventType;
use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{PodWorker, WorkerEvent};
use crate::env::{EnvSources, container_env};
use crate::pods::backoff::Backoff;
use crate::pods::decide::{self, AfterExit, ContainerFacts, RestartPolicy, Start};
use crate::pods::launch::{self, PodSandbox};
use crate::pods::status::{ContainerPhase, ContainerView, StateView, TerminatedView};
use crate::pods::{log_path, termination_file};
use crate::probes::{self, ProbeKind, ProbeReport, ProbeTarget};
use crate::process::{self, ProcessSpec};

/// How long a container whose configuration is missing (a Secret, the image map) waits before
/// it is tried again: it may be fixed at any moment.
const CONFIG_RETRY: Duration = Duration::from_secs(5);

/// How a container instance ended.
#[derive(Debug, Clone, Copy)]
pub struct ExitInfo {
    pub code: i32,
    pub signal: Option<i32>,
    pub at: jiff::Timestamp,
}

/// A running container instance.
pub struct Running {
    pub instance: u64,
    pub pid: u32,
    pub started_at: jiff::Timestamp,
    pub started_instant: Instant,
    pub exited: watch::Receiver<Option<ExitInfo>>,
    pub probes: Option<JoinHandle<()>>,
    pub container_id: String,
    /// Why the agent is stopping this instance, if it is (shown as the termination message
    /// when the container wrote none).
    pub stop_reason: Option<String>,
    /// What the container writes its termination message to.
    pub termination_file: PathBuf,
    pub log_file: PathBuf,
}

/// Everything the worker knows about one container of its pod.
pub struct Slot {
    pub spec: Container,
    pub restart_count: i32,
    /// Whether an instance ever ran (restarts count from the second start on).
    pub ran_before: bool,
    pub running: Option<Running>,
    pub last_terminated: Option<TerminatedView>,
    /// Why it is not running (reason, message), when it is waiting.
    pub waiting: Option<(String, Option<String>)>,
    /// When it may start (again): the end of its back-off or of a retry delay.
    pub next_start: Option<Instant>,
    pub backoff: Backoff,
    /// Init containers: finished successfully.
    pub completed: bool,
    pub started: bool,
    pub ready: bool,
}

impl Slot {
    /// A slot for `spec`, picking up where `previous` (its status before this agent started)
    /// left it: an init container that succeeded is not run again, and the restart policy
    /// decides about the others as if they had just exited.
    fn restore(
        spec: Container,
        init: bool,
        previous: Option<&ContainerStatus>,
        policy: RestartPolicy,
        crash_backoff: Duration,
    ) -> Self {
        let state = previous.and_then(|s| s.state.as_ref());
        let at = |t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
            t.map(|t| t.0).unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        };
        let finished = state.and_then(|s| s.terminated.as_ref()).map(|t| TerminatedView {
            exit_code: t.exit_code,
            signal: t.signal,
            reason: t.reason.clone().unwrap_or_else(|| "Error".into()),
            message: t.message.clone(),
            started_at: at(t.started_at.as_ref()),
            finished_at: at(t.finished_at.as_ref()),
            container_id: t.container_id.clone().unwrap_or_default(),
        });
        let completed = init && finished.as_ref().is_some_and(|t| t.exit_code == 0);
        let restart = finished
            .as_ref()
            .is_some_and(|t| decide::restart_restored(policy, completed, t.exit_code));
        Self {
            spec,
            restart_count: previous.map(|s| s.restart_count).unwrap_or(0),
            ran_before: state.is_some_and(|s| s.running.is_some() || s.terminated.is_some()),
            running: None,
            waiting: (!completed).then(|| ("ContainerCreating".into(), None)),
            last_terminated: finished,
            next_start: restart.then(Instant::now),
            backoff: Backoff::first_free(crash_backoff, decide::MAX_CRASH_BACKOFF),
            completed,
            started: false,
            ready: false,
        }
    }

    /// The slots of every init and main container of `pod`.
    pub fn restore_all(pod: &Pod, crash_backoff: Duration) -> (Vec<Slot>, Vec<Slot>) {
        let spec = pod.spec.clone().unwrap_or_default();
        let status = pod.status.clone().unwrap_or_default();
        let policy = RestartPolicy::of(pod);
        let slots = |containers: &[Container], statuses: &Option<Vec<ContainerStatus>>, init: bool| {
            containers
                .iter()
                .map(|c| {
                    let previous = statuses.iter().flatten().find(|s| s.name == c.name);
                    Slot::restore(c.clone(), init, previous, policy, crash_backoff)
                })
                .collect()
        };
        (
            slots(
                spec.init_containers.as_deref().unwrap_or_default(),
                &status.init_container_statuses,
                true,
            ),
            slots(&spec.containers, &status.container_statuses, false),
        )
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn phase(&self) -> ContainerPhase {
        match (&self.running, &self.last_terminated, self.next_start) {
            (Some(_), _, _) => ContainerPhase::Running,
            (None, None, _) => ContainerPhase::NeverStarted,
            (None, Some(_), Some(_)) => ContainerPhase::Restarting,
            (None, Some(t), None) => ContainerPhase::Terminated { exit_code: t.exit_code },
        }
    }

    fn facts(&self) -> ContainerFacts {
        ContainerFacts {
            running: self.running.is_some(),
            exit_code: self.last_terminated.as_ref().map(|t| t.exit_code),
            completed: self.completed,
            start_at: self.next_start,
        }
    }

    /// Running and Ready.
    pub fn serving(&self) -> bool {
        self.ready && self.running.is_some()
    }

    /// This container's status; a container still being created shows why the sandbox is not
    /// there yet, if it is not.
    pub fn view(&self, sandbox_problem: &Option<(String, String)>) -> ContainerView {
        let state = if let Some(r) = &self.running {
            StateView::Running {
                started_at: r.started_at,
            }
        } else if let Some((reason, message)) = &self.waiting {
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
        } else if let Some(t) = &self.last_terminated {
            StateView::Terminated(t.clone())
        } else {
            StateView::Waiting {
                reason: "ContainerCreating".into(),
                message: None,
            }
        };
        let last_state = match &state {
            StateView::Terminated(_) => None,
            _ => self.last_terminated.clone(),
        };
        ContainerView {
            name: self.spec.name.clone(),
            image: self.spec.image.clone().unwrap_or_default(),
            restart_count: self.restart_count,
            state,
            last_state,
            ready: self.serving(),
            started: self.started && self.running.is_some(),
            container_id: self.running.as_ref().map(|r| r.container_id.clone()),
        }
    }
}

impl PodWorker {
    fn slot(&mut self, init: bool, idx: usize) -> &mut Slot {
        if init { &mut self.init[idx] } else { &mut self.main[idx] }
    }

    /// Containers whose image changed (the only mutable part of a pod's containers) are
    /// restarted, at once and without counting as a crash, whatever the restart policy.
    pub(super) async fn adopt_spec_changes(&mut self, pod: Arc<Pod>) {
        let new_containers = pod.spec.as_ref().map(|s| s.containers.clone()).unwrap_or_default();
        self.pod = pod;
        for c in new_containers {
            let Some(idx) = self.main.iter().position(|s| s.spec.name == c.name) else {
                continue;
            };
            if self.main[idx].spec.image == c.image {
                continue;
            }
            info!(pod = %self.pod_name(), container = %c.name, image = ?c.image, "container image changed; restarting it");
            self.main[idx].spec = c;
            let note = format!(
                "Container {} definition changed, will be restarted",
                self.main[idx].name()
            );
            self.event(EventType::Normal, "Killing", &note).await;
            let grace = self.grace_period();
            self.stop_only(false, idx, grace, "definition changed").await;
            // A new definition is a new container: it starts from a fresh layer.
            let layer = self.layer_dir(&self.main[idx].spec.name);
            if let Err(e) = std::fs::remove_dir_all(&layer)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                warn!(pod = %self.pod_name(), error = %e, "failed to remove the old container layer");
            }
            let slot = &mut self.main[idx];
            slot.backoff.reset();
            slot.waiting = None;
            slot.next_start = Some(Instant::now());
        }
    }

    /// The folder of a container's own layer of its root file system.
    fn layer_dir(&self, container: &str) -> PathBuf {
        self.dir.join("containers").join(container)
    }

    /// Starts the containers the decision says are due now.
    pub(super) async fn start_due_containers(&mut self) {
        let init: Vec<ContainerFacts> = self.init.iter().map(Slot::facts).collect();
        let main: Vec<ContainerFacts> = self.main.iter().map(Slot::facts).collect();
        for start in decide::containers_to_start(self.restart_policy(), &init, &main, Instant::now()) {
            match start {
                Start::Init(idx) => self.start(true, idx).await,
                Start::Main(idx) => self.start(false, idx).await,
            }
        }
    }

    /// Starts one container; failures to start are recorded as the container's waiting reason.
    async fn start(&mut self, init: bool, idx: usize) {
        let Some(sandbox) = self.sandbox.clone() else { return };
        let spec = self.slot(init, idx).spec.clone();
        if let Err((reason, message)) = self.launch(&spec, &sandbox, init, idx).await {
            warn!(pod = %self.pod_name(), container = %spec.name, %reason, %message, "container not started");
            let slot = self.slot(init, idx);
            let before = slot.waiting.as_ref().map(|w| w.0.clone());
            let repeated = before.as_ref() == Some(&reason)
                || (reason == "ErrImagePull" && before.as_deref() == Some("ImagePullBackOff"));
            // As the kubelet: a pull that failed before is backed off.
            let reason = if repeated && reason == "ErrImagePull" {
                "ImagePullBackOff".to_string()
            } else {
                reason
            };
            slot.waiting = Some((reason, Some(message.clone())));
            // Configuration problems may be fixed (a Secret created, the image map edited).
            slot.next_start = Some(Instant::now() + CONFIG_RETRY);
            if !repeated {
                self.event(EventType::Warning, "Failed", &format!("Error: {message}"))
                    .await;
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
        let mut mounts = launch::mounts(spec, sandbox).map_err(|e| config_error(&e))?;
        // A program may be in one of the container's volumes (an init container copied it
        // there): a path is looked at where the container will see it.
        let is_executable = |p: &std::path::Path| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(launch::through_mounts(p, &mounts))
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
                crate::images::ImageError::PullFailed { .. } => ("ErrImagePull".to_string(), e.to_string()),
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
        let identity = launch::image_ids(identity, &program.ids, &lookup_user).map_err(|e| config_error(&e))?;
        let env = launch::environment(&program, sandbox, &identity, &own_env);
        let termination_file = termination_file(&self.dir, &spec.name);
        if let Some(mount) = launch::termination_mount(spec, &termination_file, &mounts) {
            fresh_termination_file(&termination_file).map_err(|e| config_error(&e))?;
            mounts.push(mount);
        }
        let capabilities = launch::capabilities(spec).map_err(|e| config_error(&e))?;
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
        let cgroup = self.agent.cgroups.container(&self.uid, &spec.name).map_err(|e| {
            (
                "RunContainerError".to_string(),
                format!("failed to make the container's cgroup: {e}"),
            )
        })?;
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
            layer_dir: self.layer_dir(&spec.name),
            hidden: self.agent.private_paths.clone(),
            capabilities,
            log_file: log_path(&self.dir, &spec.name, restart),
            cgroup: cgroup.clone(),
        };
        let log_file = process.log_file.clone();
        let child = process::spawn(&process).map_err(|e| {
            (
                "RunContainerError".to_string(),
                format!("failed to start {}: {e}", program.program.display()),
            )
        })?;
        let pid = child.id().unwrap_or(0);
        process::record_pid(&self.dir, &spec.name, pid);
        let instance = self.next_instance;
        self.next_instance += 1;
        let exited = self.watch_exit(child, pid, cgroup, spec.name.clone(), instance);
        let target = ProbeTarget {
            source: self.agent.gateway,
            pod_ip: sandbox.pod_ip,
            host_network: sandbox.host_network,
            pid,
            env,
        };
        let report = {
            let (events, container) = (self.events_tx.clone(), spec.name.clone());
            move |report: ProbeReport| {
                let _ = events.send(WorkerEvent::Probe {
                    container: container.clone(),
                    instance,
                    report,
                });
            }
        };
        let probes = probes::spawn_probes(spec.clone(), target, report);
        let uid_short: String = self.uid.chars().take(8).collect();
        let slot = self.slot(init, idx);
        slot.ran_before = true;
        slot.waiting = None;
        slot.next_start = None;
        slot.started = spec.startup_probe.is_none();
        slot.ready = false;
        slot.running = Some(Running {
            instance,
            pid,
            started_at: jiff::Timestamp::now(),
            started_instant: Instant::now(),
            exited,
            probes: Some(probes),
            container_id: format!("noops://{uid_short}-{}-{restart}", spec.name),
            stop_reason: None,
            termination_file,
            log_file,
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

    /// Waits for the process in the background; its exit reaches the worker as an event.
    fn watch_exit(
        &self,
        mut child: tokio::process::Child,
        pid: u32,
        cgroup: Option<PathBuf>,
        container: String,
        instance: u64,
    ) -> watch::Receiver<Option<ExitInfo>> {
        let (exit_tx, exit_rx) = watch::channel(None);
        let events = self.events_tx.clone();
        tokio::spawn(async move {
            let exit = match child.wait().await {
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
            // it left running (in its process group, or anywhere in its cgroup) is killed, so
            // nothing holds the port or the network namespace of the next instance.
            let _ = process::signal_group(pid, Signal::SIGKILL);
            if let Some(dir) = &cgroup {
                crate::cgroups::kill(dir);
                // Killing is asynchronous: the exit is reported (and the container may start
                // again) only once its processes are gone.
                if !crate::cgroups::wait_empty(dir, std::time::Duration::from_secs(10)).await {
                    warn!(cgroup = %dir.display(), "processes of an exited container are still there 10 s after they were killed");
                }
            }
            let _ = exit_tx.send(Some(exit));
            let _ = events.send(WorkerEvent::Exited {
                container,
                instance,
                exit,
            });
        });
        exit_rx
    }

    /// The slot whose current instance is `instance` of `container`.
    fn find_running(&self, container: &str, instance: u64) -> Option<(bool, usize)> {
        let matches = |s: &Slot| s.name() == container && s.running.as_ref().map(|r| r.instance) == Some(instance);
        if let Some(i) = self.init.iter().position(matches) {
            return Some((true, i));
        }
        self.main.iter().position(matches).map(|i| (false, i))
    }

    pub(super) async fn on_exit(&mut self, container: &str, instance: u64, exit: ExitInfo) {
        let Some((init, idx)) = self.find_running(container, instance) else {
            return;
        };
        let ran_for = self.record_exit(init, idx, exit);
        self.after_exit(init, idx, exit, ran_for).await;
    }

    pub(super) async fn on_probe(&mut self, container: &str, instance: u64, report: ProbeReport) {
        let Some((init, idx)) = self.find_running(container, instance) else {
            return;
        };
        match report {
            ProbeReport::Failed { kind, message } => {
                let note = format!("{} probe failed: {message}", kind.name());
                debug!(pod = %self.pod_name(), %container, %note);
                self.event(EventType::Warning, "Unhealthy", &note).await;
            }
            ProbeReport::Verdict {
                kind: ProbeKind::Readiness,
                healthy,
            } => self.slot(init, idx).ready = healthy,
            ProbeReport::Verdict {
                kind: ProbeKind::Startup,
                healthy: true,
            } => self.slot(init, idx).started = true,
            ProbeReport::Verdict {
                kind: ProbeKind::Liveness,
                healthy: true,
            } => {}
            ProbeReport::Verdict { kind, healthy: false } => {
                let note = format!(
                    "Container {container} failed {} probe, will be restarted",
                    kind.name().to_lowercase()
                );
                info!(pod = %self.pod_name(), %container, "{note}");
                self.event(EventType::Normal, "Killing", &note).await;
                let grace = self.grace_period();
                let reason = format!("{} probe failed", kind.name());
                if let Some((exit, ran_for)) = self.stop_only(init, idx, grace, &reason).await {
                    self.after_exit(init, idx, exit, ran_for).await;
                }
            }
        }
    }

    /// Carries out what the decision says follows an exit: done, a restart after the back-off
    /// (`CrashLoopBackOff` until then), or nothing.
    async fn after_exit(&mut self, init: bool, idx: usize, exit: ExitInfo, ran_for: Duration) {
        let policy = self.restart_policy();
        let pod = self.pod_name();
        let slot = self.slot(init, idx);
        info!(%pod, container = slot.name(), exit_code = exit.code, restarts = slot.restart_count, "container exited");
        match decide::after_exit(policy, init, exit.code, ran_for, &mut slot.backoff) {
            AfterExit::Completed => slot.completed = true,
            AfterExit::Stays => {}
            // The first crash: started again at once, as the kubelet does, with no back-off.
            AfterExit::RestartAfter(Duration::ZERO) => slot.next_start = Some(Instant::now()),
            AfterExit::RestartAfter(delay) => {
                slot.next_start = Some(Instant::now() + delay);
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
        }
    }

    /// Moves a finished instance into `last_terminated`; returns how long it ran.
    pub(super) fn record_exit(&mut self, init: bool, idx: usize, exit: ExitInfo) -> Duration {
        let slot = self.slot(init, idx);
        let Some(running) = slot.running.take() else {
            return Duration::ZERO;
        };
        if let Some(task) = &running.probes {
            task.abort();
        }
        slot.ready = false;
        slot.started = false;
        let written = read_start(&running.termination_file, 4096);
        let log = read_end(&running.log_file, 64 * 1024);
        let message = launch::termination_message(&slot.spec, &written, exit.code, &log);
        slot.last_terminated = Some(TerminatedView {
            exit_code: exit.code,
            signal: exit.signal,
            reason: if exit.code == 0 {
                "Completed".into()
            } else {
                "Error".into()
            },
            message: message.or_else(|| running.stop_reason.clone()),
            started_at: running.started_at,
            finished_at: exit.at,
            container_id: running.container_id.clone(),
        });
        running.started_instant.elapsed()
    }

    /// The pod's termination grace period.
    pub(super) fn grace_period(&self) -> Duration {
        let secs = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30);
        Duration::from_secs(secs.max(0) as u64)
    }

    /// Stops one container (TERM to its process group, KILL after `grace`) and records its end,
    /// without deciding what comes next. Returns the exit and how long it ran.
    async fn stop_only(
        &mut self,
        init: bool,
        idx: usize,
        grace: Duration,
        reason: &str,
    ) -> Option<(ExitInfo, Duration)> {
        let slot = self.slot(init, idx);
        let running = slot.running.as_mut()?;
        running.stop_reason = Some(reason.to_string());
        let pid = running.pid;
        let mut exited = running.exited.clone();
        let exit = stop_process(pid, &mut exited, grace).await;
        let ran_for = self.record_exit(init, idx, exit);
        Some((exit, ran_for))
    }
}

/// An empty termination file that any user of the container can write.
fn fresh_termination_file(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, b"")?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
}

/// Up to `limit` bytes from the start of `path` (nothing if it cannot be read).
fn read_start(path: &std::path::Path, limit: u64) -> Vec<u8> {
    use std::io::Read;
    let mut out = vec![];
    if let Ok(file) = std::fs::File::open(path) {
        let _ = file.take(limit).read_to_end(&mut out);
    }
    out
}

/// Up to `limit` bytes from the end of `path` (nothing if it cannot be read).
fn read_end(path: &std::path::Path, limit: u64) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut out = vec![];
    if let Ok(mut file) = std::fs::File::open(path) {
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        if file.seek(SeekFrom::Start(len.saturating_sub(limit))).is_ok() {
            let _ = file.read_to_end(&mut out);
        }
    }
    out
}

/// TERM the process group, wait up to `grace`, then KILL and wait for the exit.
pub async fn stop_process(pid: u32, exited: &mut watch::Receiver<Option<ExitInfo>>, grace: Duration) -> ExitInfo {
    if exited.borrow().is_none() {
        let _ = process::signal_group(pid, Signal::SIGTERM);
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
    let _ = process::signal_group(pid, Signal::SIGKILL);
    wait(exited, Duration::from_secs(10)).await.unwrap_or(ExitInfo {
        code: 137,
        signal: Some(9),
        at: jiff::Timestamp::now(),
    })
}
