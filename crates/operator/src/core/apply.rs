//! Server-side apply under one field manager, and owner references.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The field manager of everything the operator writes.
pub const FIELD_MANAGER: &str = "noops";

/// Applies `object` (server-side apply, forced: the operator owns the fields it sets, so hand
/// edits of them are taken back).
pub async fn apply<K>(api: &Api<K>, name: &str, object: &K) -> kube::Result<K>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(object))
        .await
}

/// Applies the status subresource from a partial object (`apiVersion`, `kind`, `status`).
pub async fn apply_status<K>(api: &Api<K>, name: &str, status: &serde_json::Value) -> kube::Result<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(status))
        .await
}

/// The controller owner reference pointing at `owner` (children are garbage-collected with it).
pub fn controller_reference<K: Resource<DynamicType = ()>>(owner: &K) -> Option<OwnerReference> {
    owner.controller_owner_ref(&())
}

/// Whether `child` is controlled by the object with `owner_uid`.
pub fn controlled_by(child: &ObjectMeta, owner_uid: &str) -> bool {
    child
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.uid == owner_uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_is_by_uid_and_controller_flag() {
        let mut meta = ObjectMeta::default();
        assert!(!controlled_by(&meta, "u1"));
        meta.owner_references = Some(vec![OwnerReference {
            api_version: "noops.dev/v1alpha1".into(),
            kind: "MaintPage".into(),
            name: "shop".into(),
            uid: "u1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        assert!(controlled_by(&meta, "u1"));
        assert!(!controlled_by(&meta, "u2"));
    }
}

/// The annotation holding a hash of what the operator last applied to an object.
pub const DESIRED_HASH_ANNOTATION: &str = "noops.dev/desired-hash";

/// A stable short hash of an object's JSON.
pub fn hash_of(value: &serde_json::Value) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.to_string().hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// Whether every field set in `wanted` has the same value in `live` (arrays element by
/// element). Fields only `live` has (defaults, status, other managers' fields) do not matter.
pub fn is_subset(wanted: &serde_json::Value, live: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (wanted, live) {
        (Value::Null, _) => true,
        (Value::Object(w), Value::Object(l)) => w.iter().all(|(k, v)| l.get(k).is_some_and(|lv| is_subset(v, lv))),
        (Value::Array(w), Value::Array(l)) => w.len() == l.len() && w.iter().zip(l).all(|(a, b)| is_subset(a, b)),
        (w, l) => w == l,
    }
}

/// Stamps `desired` with the hash of its content (the `noops.dev/desired-hash` annotation).
pub fn stamp<K: Resource + Serialize>(desired: &mut K) {
    let hash = serde_json::to_value(&*desired).map(|v| hash_of(&v)).unwrap_or_default();
    desired
        .meta_mut()
        .annotations
        .get_or_insert_with(Default::default)
        .insert(DESIRED_HASH_ANNOTATION.into(), hash);
}

/// Whether `live` was last applied from the same desired state as the stamped `desired`.
pub fn same_stamp<K: Resource>(desired: &K, live: &K) -> bool {
    let hash = |o: &K| {
        o.meta()
            .annotations
            .as_ref()
            .and_then(|a| a.get(DESIRED_HASH_ANNOTATION))
            .cloned()
    };
    hash(desired).is_some() && hash(desired) == hash(live)
}

/// Whether `live` already is as the stamped `desired` asks: same stamp (nothing was dropped
/// from the desired state since) and every desired field in place (no hand edit). Then the
/// apply can be skipped.
pub fn up_to_date<K: Resource + Serialize>(desired: &K, live: Option<&K>) -> bool {
    let Some(live) = live else { return false };
    if !same_stamp(desired, live) {
        return false;
    }
    match (serde_json::to_value(desired), serde_json::to_value(live)) {
        (Ok(w), Ok(l)) => is_subset(&w, &l),
        _ => false,
    }
}

#[cfg(test)]
mod subset_tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;

    #[test]
    fn subset_ignores_extra_fields_but_not_changes() {
        let wanted = json!({ "spec": { "replicas": 2, "ports": [{ "port": 80 }] } });
        let live =
            json!({ "spec": { "replicas": 2, "ports": [{ "port": 80, "protocol": "TCP" }], "x": 1 }, "status": {} });
        assert!(is_subset(&wanted, &live));
        assert!(!is_subset(&json!({ "spec": { "replicas": 3 } }), &live));
        assert!(
            !is_subset(&json!({ "spec": { "ports": [] } }), &live),
            "array length matters"
        );
    }

    #[test]
    fn applies_are_skipped_only_for_an_unchanged_stamped_object() {
        let cm = |v: &str| ConfigMap {
            metadata: ObjectMeta {
                name: Some("c".into()),
                ..Default::default()
            },
            data: Some([("k".to_string(), v.to_string())].into()),
            ..Default::default()
        };
        let stamped = |v: &str| {
            let mut c = cm(v);
            stamp(&mut c);
            c
        };
        let desired = stamped("1");
        assert!(!up_to_date(&desired, None), "nothing live yet");
        let live = desired.clone();
        assert!(up_to_date(&stamped("1"), Some(&live)), "same desired state, untouched");
        let mut edited_live = live.clone();
        edited_live.data = Some([("k".to_string(), "hand".to_string())].into());
        assert!(
            !up_to_date(&stamped("1"), Some(&edited_live)),
            "a hand edit is applied over"
        );
        assert!(same_stamp(&stamped("1"), &edited_live), "and recognised as one");
        assert!(
            !up_to_date(&stamped("2"), Some(&live)),
            "a new desired state is applied"
        );
        assert!(!same_stamp(&stamped("2"), &live), "and is no hand edit");
    }
}
