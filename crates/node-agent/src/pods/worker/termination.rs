//! Ending a pod's containers: all at once within a grace period (deletion, agent shutdown), and
//! the graceful deletion of the pod, finished by removing the pod object as the kubelet does.

use std::time::Duration;

use k8s_openapi::api::core::v1::{LifecycleHandler, Pod};
use kube::Api;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::events::EventType;
use nix::sys::signal::Signal;
use tokio::time::Instant;
use tracing::{info, warn};

use super::PodWorker;
use super::containers::stop_process;
use crate::pods::PodUpdate;
use crate::pods::backoff::Backoff;
use crate::process;

/// How many times the final delete of a pod object is tried.
const DELETE_ATTEMPTS: u32 = 12;

impl PodWorker {
    /// Stops every running container at once, giving them `grace` together. A pod update that
    /// shortens the grace period (or a forced deletion) while waiting is honoured.
    pub(super) async fn stop_all(&mut self, grace: Duration, reason: &str) {
        let started = Instant::now();
        // preStop hooks first, all at once, within the grace period (as the kubelet runs them
        // before it signals): an app can keep serving while its endpoints go.
        let hooks: Vec<_> = self
            .main
            .iter()
            .filter_map(|slot| {
                let hook = slot.spec.lifecycle.as_ref()?.pre_stop.clone()?;
                let pid = slot.running.as_ref()?.pid;
                Some(run_pre_stop(self.pod_name(), slot.spec.name.clone(), hook, pid))
            })
            .collect();
        if !hooks.is_empty() {
            let _ = tokio::time::timeout(grace, futures::future::join_all(hooks)).await;
        }
        let mut targets = vec![];
        for (init, slots) in [(true, &mut self.init), (false, &mut self.main)] {
            for (idx, slot) in slots.iter_mut().enumerate() {
                if let Some(r) = slot.running.as_mut() {
                    r.stop_reason = Some(reason.to_string());
                    let _ = process::signal_group(r.pid, Signal::SIGTERM);
                    targets.push((init, idx, r.pid, r.exited.clone()));
                }
            }
        }
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
    pub(super) async fn delete_gracefully(&mut self) {
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
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        for attempt in 1..=DELETE_ATTEMPTS {
            match api.delete(&name, &params).await {
                Ok(_) => {
                    info!(pod = %self.pod_name(), "pod deleted");
                    return;
                }
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return,
                Err(e) if attempt < DELETE_ATTEMPTS => {
                    warn!(pod = %self.pod_name(), error = %e, attempt, "failed to delete pod object; retrying")
                }
                Err(e) => {
                    warn!(pod = %self.pod_name(), error = %e, "failed to delete pod object; giving up until the agent restarts");
                    return;
                }
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }
}

/// The PATH a hook's command is looked up in (the container's own is not kept).
const HOOK_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs a container's preStop hook: a `sleep`, or a command inside the container. An HTTP
/// hook is not supported here and is said so.
async fn run_pre_stop(pod: String, container: String, hook: LifecycleHandler, pid: u32) {
    if let Some(sleep) = hook.sleep {
        info!(pod = %pod, container = %container, seconds = sleep.seconds, "preStop: sleeping");
        tokio::time::sleep(Duration::from_secs(sleep.seconds.max(0) as u64)).await;
    } else if let Some(exec) = hook.exec {
        let command = exec.command.unwrap_or_default();
        info!(pod = %pod, container = %container, ?command, "preStop: running a command");
        let env = [("PATH".to_string(), HOOK_PATH.to_string())];
        match process::exec_in(pid, &command, &env, Duration::from_secs(3600)).await {
            Ok(Some(0)) => {}
            Ok(code) => warn!(pod = %pod, container = %container, ?code, "preStop command failed"),
            Err(e) => warn!(pod = %pod, container = %container, error = %e, "preStop command could not run"),
        }
    } else {
        warn!(pod = %pod, container = %container, "preStop: only sleep and exec hooks are supported here");
    }
}
