//! Each noops resource's state as series, for every kind the same way: each condition (1 while
//! True) and when it last changed, the phase, and when the resource was made. One alert then
//! covers "not Ready for a while" or "progressing for an hour" of any kind.
//!
//! Read from each controller's cache (the statuses the engines wrote), not set by the engines:
//! no engine can forget it, and it says what `kubectl get` says.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::Value;

/// A gauge of seconds (since the epoch, mostly).
pub(super) type Seconds = Gauge<f64, AtomicU64>;

/// One noops resource.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub(super) struct ResourceLabels {
    pub(super) kind: String,
    pub(super) namespace: String,
    pub(super) name: String,
}

/// One condition of one resource.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct ConditionLabels {
    kind: String,
    namespace: String,
    name: String,
    condition: String,
}

/// The phase one resource is in.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct PhaseLabels {
    kind: String,
    namespace: String,
    name: String,
    phase: String,
}

/// What a resource's object says of its state.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResourceState {
    /// Its creationTimestamp, in seconds since the epoch.
    pub created: Option<f64>,
    pub phase: Option<String>,
    pub conditions: Vec<ConditionState>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ConditionState {
    pub type_: String,
    /// Whether its status is "True" (False and Unknown alike are not).
    pub holds: bool,
    /// Its lastTransitionTime, in seconds since the epoch.
    pub since: Option<f64>,
}

impl ResourceState {
    /// The state of an object of any noops kind, as its JSON.
    pub fn read(object: &Value) -> Self {
        let status = &object["status"];
        let conditions = status["conditions"]
            .as_array()
            .map(|conditions| {
                conditions
                    .iter()
                    .filter_map(|c| {
                        Some(ConditionState {
                            type_: c["type"].as_str()?.to_string(),
                            holds: c["status"].as_str() == Some("True"),
                            since: seconds(&c["lastTransitionTime"]),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            created: seconds(&object["metadata"]["creationTimestamp"]),
            phase: status["phase"].as_str().filter(|p| !p.is_empty()).map(str::to_string),
            conditions,
        }
    }
}

/// An RFC 3339 time as seconds since the epoch.
fn seconds(value: &Value) -> Option<f64> {
    let time: jiff::Timestamp = value.as_str()?.parse().ok()?;
    Some(time.as_millisecond() as f64 / 1000.0)
}

/// The series of every resource's state, and what each resource has, so that a condition or a
/// phase it no longer has (or a resource that is gone) loses its series.
pub(super) struct ResourceStates {
    condition: Family<ConditionLabels, Gauge>,
    condition_since: Family<ConditionLabels, Seconds>,
    phase: Family<PhaseLabels, Gauge>,
    created: Family<ResourceLabels, Seconds>,
    known: Mutex<BTreeMap<ResourceLabels, ResourceState>>,
}

impl ResourceStates {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let states = Self {
            condition: Family::default(),
            condition_since: Family::default(),
            phase: Family::default(),
            created: Family::default(),
            known: Mutex::new(BTreeMap::new()),
        };
        registry.register(
            "resource_condition",
            "1 while a condition of a noops resource is True, 0 while it is False or Unknown",
            states.condition.clone(),
        );
        registry.register(
            "resource_condition_last_transition_timestamp_seconds",
            "When a condition of a noops resource last changed its status",
            states.condition_since.clone(),
        );
        registry.register(
            "resource_phase",
            "1 for the phase a noops resource is in (the only phase series it has)",
            states.phase.clone(),
        );
        registry.register(
            "resource_created_timestamp_seconds",
            "When a noops resource was made",
            states.created.clone(),
        );
        states
    }

    pub(super) fn set(&self, resource: ResourceLabels, state: ResourceState) {
        let Ok(mut known) = self.known.lock() else {
            return;
        };
        if let Some(before) = known.get(&resource) {
            if *before == state {
                return;
            }
            self.remove(&resource, before, Some(&state));
        }
        if let Some(created) = state.created {
            self.created.get_or_create(&resource).set(created);
        }
        if let Some(phase) = &state.phase {
            self.phase.get_or_create(&phase_labels(&resource, phase)).set(1);
        }
        for c in &state.conditions {
            let labels = condition_labels(&resource, &c.type_);
            self.condition.get_or_create(&labels).set(i64::from(c.holds));
            if let Some(since) = c.since {
                self.condition_since.get_or_create(&labels).set(since);
            }
        }
        known.insert(resource, state);
    }

    /// Drops every series of resources of `kind` for which `exists(namespace, name)` is false.
    pub(super) fn retain(&self, kind: &str, exists: impl Fn(&str, &str) -> bool) {
        let Ok(mut known) = self.known.lock() else {
            return;
        };
        known.retain(|resource, state| {
            let keep = resource.kind != kind || exists(&resource.namespace, &resource.name);
            if !keep {
                self.remove(resource, state, None);
            }
            keep
        });
    }

    /// Removes the series `before` made that `after` (none: the resource is gone) does not
    /// make again.
    fn remove(&self, resource: &ResourceLabels, before: &ResourceState, after: Option<&ResourceState>) {
        if after.is_none_or(|a| a.created.is_none()) {
            self.created.remove(resource);
        }
        if let Some(phase) = &before.phase
            && after.is_none_or(|a| a.phase.as_ref() != Some(phase))
        {
            self.phase.remove(&phase_labels(resource, phase));
        }
        for c in &before.conditions {
            let still = after.and_then(|a| a.conditions.iter().find(|n| n.type_ == c.type_));
            let labels = condition_labels(resource, &c.type_);
            if still.is_none() {
                self.condition.remove(&labels);
            }
            if still.is_none_or(|n| n.since.is_none()) {
                self.condition_since.remove(&labels);
            }
        }
    }
}

fn condition_labels(resource: &ResourceLabels, condition: &str) -> ConditionLabels {
    ConditionLabels {
        kind: resource.kind.clone(),
        namespace: resource.namespace.clone(),
        name: resource.name.clone(),
        condition: condition.into(),
    }
}

fn phase_labels(resource: &ResourceLabels, phase: &str) -> PhaseLabels {
    PhaseLabels {
        kind: resource.kind.clone(),
        namespace: resource.namespace.clone(),
        name: resource.name.clone(),
        phase: phase.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The series of `registry`, as /metrics serves them.
    fn render(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    fn main_cluster() -> ResourceLabels {
        ResourceLabels {
            kind: "EtcdCluster".into(),
            namespace: "db".into(),
            name: "main".into(),
        }
    }

    fn etcd_cluster(phase: &str, ready: &str, since: &str) -> Value {
        json!({
            "metadata": {"name": "main", "namespace": "db", "creationTimestamp": "2026-11-28T10:00:00Z"},
            "status": {
                "phase": phase,
                "conditions": [
                    {"type": "Ready", "status": ready, "reason": "X", "lastTransitionTime": since},
                    {"type": "Degraded", "status": "Unknown", "reason": "Y", "lastTransitionTime": "garbled"},
                ],
            },
        })
    }

    #[test]
    fn reads_conditions_phase_and_creation_of_any_kind() {
        let state = ResourceState::read(&etcd_cluster("Running", "True", "2026-11-28T10:01:00Z"));
        let made = 1_795_860_000.0;
        assert_eq!(state.created, Some(made));
        assert_eq!(state.phase.as_deref(), Some("Running"));
        assert_eq!(
            state.conditions,
            vec![
                ConditionState {
                    type_: "Ready".into(),
                    holds: true,
                    since: Some(made + 60.0),
                },
                ConditionState {
                    type_: "Degraded".into(),
                    holds: false,
                    since: None,
                },
            ]
        );
        // An object with no status yet (a first apply) has no phase and no condition.
        let fresh = ResourceState::read(&json!({"metadata": {"name": "x"}}));
        assert_eq!(fresh, ResourceState::default());
    }

    fn lines(text: &str, prefix: &str) -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn a_changed_phase_or_a_deleted_resource_leaves_no_series_behind() {
        let mut registry = Registry::with_prefix("noops");
        let states = ResourceStates::register(&mut registry);
        // Sets the cluster's state and checks its only phase series and its Ready series.
        let set = |phase: &str, ready: &str, since: &str, ready_value: u8| {
            states.set(main_cluster(), ResourceState::read(&etcd_cluster(phase, ready, since)));
            let text = render(&registry);
            let labels = r#"kind="EtcdCluster",namespace="db",name="main""#;
            assert_eq!(
                lines(&text, "noops_resource_phase{"),
                vec![format!(r#"noops_resource_phase{{{labels},phase="{phase}"}} 1"#)]
            );
            let ready_line = format!(r#"noops_resource_condition{{{labels},condition="Ready"}} {ready_value}"#);
            assert!(text.contains(&ready_line), "no {ready_line} in {text}");
            text
        };
        set("Running", "True", "2026-11-28T10:01:00Z", 1);
        let text = set("Degraded", "False", "2026-11-28T10:05:00Z", 0);
        assert_eq!(
            lines(&text, "noops_resource_condition_last_transition_timestamp_seconds{"),
            vec![
                r#"noops_resource_condition_last_transition_timestamp_seconds{kind="EtcdCluster",namespace="db",name="main",condition="Ready"} 1795860300.0"#
            ]
        );

        // Another kind's resource of the same name is not this one.
        states.retain("PostgreSQL", |_, _| false);
        assert!(render(&registry).contains(r#"phase="Degraded"} 1"#));
        states.retain("EtcdCluster", |_, _| false);
        let text = render(&registry);
        assert!(lines(&text, "noops_resource_").is_empty(), "{text}");
    }
}
