//! Kubernetes Events about the objects the operator manages (kube-runtime's Recorder, which
//! also folds repeats into series).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tracing::debug;

/// Publishes Events as the operator.
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl Events {
    pub fn new(client: kube::Client, controller: &str) -> Self {
        let instance = std::env::var("POD_NAME").ok();
        Self {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: controller.into(),
                    instance,
                },
            ),
        }
    }

    /// A Normal event.
    pub async fn normal(&self, about: &ObjectReference, reason: &str, note: impl Into<String>) {
        self.publish(about, EventType::Normal, reason, note.into()).await;
    }

    /// A Warning event.
    pub async fn warning(&self, about: &ObjectReference, reason: &str, note: impl Into<String>) {
        self.publish(about, EventType::Warning, reason, note.into()).await;
    }

    /// An Event about `about` that concerns `related` too (an etcd member's Pod, say). The
    /// recorder folds Events with the same reason, object and related object into one series
    /// that keeps the first note: naming the related object keeps "Promoted main-2" from being
    /// counted as a repeat of "Promoted main-1".
    pub async fn related(
        &self,
        about: &ObjectReference,
        related: Option<ObjectReference>,
        warning: bool,
        reason: &str,
        note: impl Into<String>,
    ) {
        let type_ = if warning { EventType::Warning } else { EventType::Normal };
        self.publish_event(about, type_, reason, note.into(), related).await;
    }

    async fn publish(&self, about: &ObjectReference, type_: EventType, reason: &str, note: String) {
        self.publish_event(about, type_, reason, note, None).await;
    }

    async fn publish_event(
        &self,
        about: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
        related: Option<ObjectReference>,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: reason.into(),
            secondary: related,
        };
        // An event that cannot be written must not fail the reconcile that reports it.
        if let Err(e) = self.recorder.publish(&event, about).await {
            debug!(error = %e, reason, "failed to publish event");
        }
    }
}
