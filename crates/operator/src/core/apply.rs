//! Server-side apply under one field manager, create and delete that tolerate what is
//! already so, and owner references.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
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

/// Applies `status` to `name` only if it is still at `version` (the one a pass read, or last
/// wrote), and moves `version` on; false if the object changed since (the pass ends, and the
/// next one reads it afresh). For status that records work done outside Kubernetes: it is
/// never written over a newer word.
pub async fn apply_status_at<K, S>(
    api: &Api<K>,
    name: &str,
    version: &mut Option<String>,
    status: &S,
) -> kube::Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    S: Serialize,
{
    let body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": { "resourceVersion": version },
        "status": status,
    });
    match apply_status(api, name, &body).await {
        Ok(written) => {
            *version = written.meta().resource_version.clone();
            Ok(true)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Creates `object` unless one of its name exists already; true if this call created it.
pub async fn create_if_missing<K>(api: &Api<K>, object: &K) -> kube::Result<bool>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Deletes `name` with `params`; one already gone is fine. True if this call deleted it.
pub async fn delete_if_present<K>(api: &Api<K>, name: &str, params: &DeleteParams) -> kube::Result<bool>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
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
