//! What the worker tells the API server about its pod: the status (phase, conditions, container
//! statuses), written with server-side apply only when it changed, and Events.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource};
use tracing::{debug, warn};

use super::PodWorker;
use super::containers::Slot;
use crate::node::FIELD_MANAGER;
use crate::pods::status::{self, ConditionFacts, PodPhase, PodView};

impl PodWorker {
    /// The pod phase: as computed from the containers, except that a pod that had finished
    /// before this agent started keeps the phase its status says.
    pub(super) fn phase(&self) -> PodPhase {
        let recorded = PodPhase::parse(self.pod.status.as_ref().and_then(|s| s.phase.as_deref()));
        match recorded {
            Some(phase) if self.finished && phase.is_terminal() => phase,
            _ => {
                let init: Vec<_> = self.init.iter().map(Slot::phase).collect();
                let main: Vec<_> = self.main.iter().map(Slot::phase).collect();
                let init_done = self.init.iter().all(|s| s.completed);
                status::pod_phase(self.restart_policy(), &init, init_done, &main)
            }
        }
    }

    pub(super) async fn publish_status(&mut self) {
        if self.finished && self.last_status.is_some() {
            return;
        }
        let now = jiff::Timestamp::now();
        let phase = self.phase();
        let terminal = phase.is_terminal();
        let facts = ConditionFacts {
            sandbox_ready: self.sandbox.is_some() && !terminal,
            initialized: self.init.iter().all(|s| s.completed),
            terminal,
            not_ready: self
                .main
                .iter()
                .filter(|s| !s.serving())
                .map(|s| s.name().to_string())
                .collect(),
            gates_ok: self.readiness_gates_ok(),
        };
        let view = PodView {
            phase,
            host_ip: self.agent.node.ip.to_string(),
            pod_ip: self.ip.filter(|_| !terminal).map(|ip| ip.to_string()),
            start_time: self.start_time,
            conditions: status::pod_conditions(&facts, &mut self.transitions, now),
            init: self.init.iter().map(|s| s.view(&self.sandbox_problem)).collect(),
            main: self.main.iter().map(|s| s.view(&self.sandbox_problem)).collect(),
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

    /// Whether every readiness gate of the spec is a True condition of the pod.
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

    /// An Event about the pod; one that cannot be written is only logged.
    pub(super) async fn event(&self, type_: EventType, reason: &str, note: &str) {
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
