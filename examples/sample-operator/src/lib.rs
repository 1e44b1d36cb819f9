//! The smallest correct operator in kube-rs, for people learning to write one.
//!
//! A `Sample` holds a message. The operator keeps a ConfigMap `<name>-message` with that
//! message, owned by the Sample (so deleting the Sample deletes it), and reports in the Sample's
//! status which ConfigMap it wrote and whether it is Ready. What makes it *correct*, not just
//! small:
//!
//! - the CRD is generated from these Rust types (`sample crd`), never written by hand;
//! - it is watch-driven: it reconciles when a Sample or its ConfigMap changes, and never polls;
//! - the ConfigMap is written with server-side apply under one field manager, so reconciling
//!   twice changes nothing and a hand edit of the message is taken back;
//! - the ConfigMap has an owner reference, so `.owns()` sees it and garbage collection removes it;
//! - the status has `observedGeneration` and a `Ready` condition (`kubectl wait` works), and is
//!   written only when it changes, so writing it does not trigger endless reconciles.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::{CustomResource, Resource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The spec of a Sample: a message to keep in a ConfigMap.
#[derive(CustomResource, JsonSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "examples.noops.dev",
    version = "v1",
    kind = "Sample",
    namespaced,
    status = "SampleStatus",
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".spec.message"}"#,
    printcolumn = r#"{"name":"ConfigMap","type":"string","jsonPath":".status.configMap"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct SampleSpec {
    /// The message (1 to 256 characters).
    #[schemars(length(min = 1, max = 256))]
    pub message: String,
}

/// What the operator reports about a Sample.
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SampleStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The field manager of everything this operator writes.
pub const MANAGER: &str = "sample-operator";

/// The ConfigMap a Sample should have. Pure: easy to test, no cluster needed.
pub fn desired_config_map(sample: &Sample) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("{}-message", sample.name_any())),
            namespace: sample.namespace(),
            owner_references: sample.controller_owner_ref(&()).map(|r| vec![r]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("message".to_string(), sample.spec.message.clone())])),
        ..Default::default()
    }
}

/// The status after the ConfigMap has been written. Keeps the condition's transition time when
/// it was already Ready, so an unchanged Sample gets an identical status (and no write).
pub fn desired_status(sample: &Sample, now: jiff::Timestamp) -> SampleStatus {
    let previous = sample.status.clone().unwrap_or_default();
    let since = previous
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    SampleStatus {
        observed_generation: sample.metadata.generation,
        config_map: desired_config_map(sample).metadata.name,
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "ConfigMapWritten".into(),
            message: "the message is in the ConfigMap".into(),
            observed_generation: sample.metadata.generation,
            last_transition_time: since,
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Sample {
        let mut s = Sample::new("hello", SampleSpec { message: "hi".into() });
        s.metadata.namespace = Some("demo".into());
        s.metadata.uid = Some("u1".into());
        s.metadata.generation = Some(2);
        s
    }

    #[test]
    fn config_map_is_named_owned_and_holds_the_message() {
        let cm = desired_config_map(&sample());
        assert_eq!(cm.metadata.name.as_deref(), Some("hello-message"));
        assert_eq!(cm.metadata.owner_references.unwrap()[0].uid, "u1");
        assert_eq!(cm.data.unwrap()["message"], "hi");
    }

    #[test]
    fn status_is_stable_once_ready() {
        let t0 = jiff::Timestamp::from_second(10).unwrap();
        let mut s = sample();
        let first = desired_status(&s, t0);
        assert_eq!(first.observed_generation, Some(2));
        s.status = Some(first.clone());
        let again = desired_status(&s, jiff::Timestamp::from_second(99).unwrap());
        assert_eq!(again, first, "nothing changed, nothing to write");
    }
}
