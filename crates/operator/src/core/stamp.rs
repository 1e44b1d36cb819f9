//! The desired-state stamp: a hash of what the operator applied, kept in an annotation of the
//! object, so that a reconcile can skip an apply that would change nothing and tell a hand edit
//! (the stamp matches, a field does not) from a change of the desired state (the stamp differs).

use kube::Resource;
use serde::Serialize;

/// The annotation holding a hash of what the operator last applied to an object.
pub const DESIRED_HASH_ANNOTATION: &str = "noops.dev/desired-hash";

/// A short hash of an object's JSON that stays the same across builds, toolchains and
/// machines: SHA-256 of the canonical JSON (object keys sorted at every level, no spaces), its
/// first 8 bytes in hex. The stamp is stored in the cluster, so it must never change for the
/// same content (an operator upgrade would otherwise take every child for changed).
pub fn hash_of(value: &serde_json::Value) -> String {
    use sha2::{Digest, Sha256};
    let mut canonical = String::new();
    write_canonical(value, &mut canonical);
    Sha256::digest(canonical.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Writes `value` as JSON with the keys of every object in sorted order, whatever the map type
/// serde_json was built with.
fn write_canonical(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
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
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    #[test]
    fn the_hash_is_pinned_and_ignores_key_order() {
        // SHA-256 of `{"a":1,"b":[true,null,"x"]}`, first 8 bytes: if this changes, every
        // stamp in every cluster changes with it.
        let value = json!({ "b": [true, null, "x"], "a": 1 });
        assert_eq!(hash_of(&value), "eca8cfb31ab74533");
        let mut reordered = serde_json::Map::new();
        reordered.insert("b".into(), json!([true, null, "x"]));
        reordered.insert("a".into(), json!(1));
        assert_eq!(hash_of(&serde_json::Value::Object(reordered)), hash_of(&value));
        assert_ne!(hash_of(&json!({ "a": 2, "b": [true, null, "x"] })), hash_of(&value));
    }

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
