//! Kubernetes Events about the objects the operator manages (kube-runtime's Recorder, which
//! also folds repeats of the same note into series), and the one way a pass says what it decided:
//! [`Announcement`]s that pure code returns, told (logged and published) with [`Events::tell`]
//! once the pass knows they hold.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tracing::{debug, info, warn};

/// A decision worth a log line and an Event.
#[derive(Debug, Clone, PartialEq)]
pub struct Announcement {
    pub warning: bool,
    /// The Event's reason (`CamelCase`).
    pub reason: String,
    pub note: String,
    /// Another object it concerns (an etcd member's pod, say): Events with the same reason
    /// about different such objects are not folded into one series.
    pub related: Option<ObjectReference>,
}

impl Announcement {
    /// A Normal Event.
    pub fn normal(reason: impl Into<String>, note: impl Into<String>) -> Self {
        Self {
            warning: false,
            reason: reason.into(),
            note: note.into(),
            related: None,
        }
    }

    /// A Warning Event.
    pub fn warning(reason: impl Into<String>, note: impl Into<String>) -> Self {
        Self {
            warning: true,
            ..Self::normal(reason, note)
        }
    }

    /// The same, concerning `object` too.
    pub fn related(mut self, object: ObjectReference) -> Self {
        self.related = Some(object);
        self
    }
}

/// The Event's action: its reason, and a digest of its note. The Recorder folds an Event into
/// an earlier one with the same type, action, reason and objects (as a series, keeping the
/// earlier note), where client-go folds only the same note: without the digest, "pool b runs
/// 1.34" after "pool a runs 1.34" would only count as a repeat of the first.
fn action(reason: &str, note: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut digest = std::collections::hash_map::DefaultHasher::new();
    note.hash(&mut digest);
    format!("{reason}-{:08x}", digest.finish() as u32)
}

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

    /// Logs `announcement` (a warning at warn level) and publishes it as an Event about `about`.
    pub async fn tell(&self, about: &ObjectReference, announcement: Announcement) {
        if announcement.warning {
            warn!(reason = announcement.reason, "{}", announcement.note);
        } else {
            info!(reason = announcement.reason, "{}", announcement.note);
        }
        self.publish(about, announcement).await;
    }

    /// Publishes `announcement` as an Event about `about`, for a caller that logs it itself
    /// (with more than the Event says).
    pub async fn publish(&self, about: &ObjectReference, announcement: Announcement) {
        let Announcement {
            warning,
            reason,
            note,
            related,
        } = announcement;
        let event = Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.clone(),
            action: action(&reason, &note),
            note: Some(note),
            secondary: related,
        };
        // An event that cannot be written must not fail the reconcile that reports it.
        if let Err(e) = self.recorder.publish(&event, about).await {
            debug!(error = %e, reason, "failed to publish event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::action;

    #[test]
    fn only_the_same_note_is_folded_into_a_series() {
        let a = action("PoolUpgraded", "Pool a runs 1.34.4");
        assert_eq!(a, action("PoolUpgraded", "Pool a runs 1.34.4"));
        assert_ne!(a, action("PoolUpgraded", "Pool b runs 1.34.4"));
        assert!(a.starts_with("PoolUpgraded-") && a.len() <= 128, "{a}");
    }
}
