//! The pod's sandbox: its network namespace and address, its generated files (`/etc/hosts`,
//! `/etc/resolv.conf`) and its volumes, made before any container starts and retried with a
//! back-off while they cannot be.

use std::net::Ipv4Addr;

use kube::runtime::events::EventType;
use tokio::time::Instant;
use tracing::{info, warn};

use super::PodWorker;
use crate::downward::PodFacts;
use crate::pods::launch::{self, PodSandbox};
use crate::volumes::Volumes;

impl PodWorker {
    pub(super) async fn ensure_sandbox(&mut self) {
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
                self.next_sandbox_try = Instant::now() + self.sandbox_backoff.next_delay();
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
        std::fs::write(&resolv_file, launch::resolv_conf(&self.pod, self.agent.gateway, domain)).map_err(|e| io(&e))?;
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

    pub(super) fn facts(&self, ip: Ipv4Addr) -> PodFacts<'_> {
        PodFacts {
            pod: &self.pod,
            pod_ip: ip,
            host_ip: self.agent.node.ip,
            node_cpu: self.agent.node.cpu as f64,
            node_memory: self.agent.node.memory_bytes as f64,
        }
    }

    pub(super) async fn refresh_volumes_if_due(&mut self) {
        if self.last_volume_refresh.elapsed() < self.agent.sync_frequency {
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

    pub(super) async fn release_network(&mut self) {
        if !self.host_network() {
            if let Err(e) = self.agent.network.destroy(&self.names).await {
                warn!(pod = %self.pod_name(), error = %e, "failed to remove pod network");
            }
            let _ = self.agent.network.release(&self.uid);
        }
    }

    /// Removes the pod's sandbox: its network; with `everything`, also its address and folder (the pod is
    /// gone for good). Persistent volumes live elsewhere and are untouched.
    pub(super) async fn teardown(&mut self, everything: bool) {
        // Whatever a container left running (in a session of its own) ends with the pod.
        self.agent.cgroups.remove_pod(&self.uid).await;
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
}
