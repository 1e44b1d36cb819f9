//! Deleting children the spec no longer asks for: objects a resource controls (owner reference
//! with `controller: true`) that are not among the children it wants now. Garbage collection
//! only removes children with their owner; this removes them while the owner lives on (a
//! member scaled away, a renamed part).

use std::fmt::Debug;

use kube::api::DeleteParams;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tracing::info;

use super::apply::{controlled_by, delete_if_present};

/// The names of the objects among `children` that the owner with `owner_uid` controls and no
/// longer wants (`wanted` are the names it wants). Objects of others are never chosen. Pure.
pub fn unwanted<'a, K, I>(children: I, owner_uid: &str, wanted: &[String]) -> Vec<String>
where
    K: Resource + 'a,
    I: IntoIterator<Item = &'a K>,
{
    let mut names: Vec<String> = children
        .into_iter()
        .filter(|c| controlled_by(c.meta(), owner_uid))
        .filter(|c| c.meta().deletion_timestamp.is_none())
        .filter_map(|c| c.meta().name.clone())
        .filter(|name| !wanted.contains(name))
        .collect();
    names.sort();
    names
}

/// Deletes the children [`unwanted`] picks; one already gone is fine. Returns what it deleted.
pub async fn delete_unwanted<'a, K, I>(
    api: &Api<K>,
    children: I,
    owner_uid: &str,
    wanted: &[String],
) -> kube::Result<Vec<String>>
where
    K: Resource + Clone + DeserializeOwned + Debug + 'a,
    K::DynamicType: Default,
    I: IntoIterator<Item = &'a K>,
{
    let names = unwanted(children, owner_uid, wanted);
    for name in &names {
        if delete_if_present(api, name, &DeleteParams::background()).await? {
            info!(kind = %K::kind(&Default::default()), %name, "deleted a child the spec no longer asks for");
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fixtures;

    #[test]
    fn only_our_own_unwanted_children_are_chosen() {
        let owner = fixtures::owner_reference("EtcdCluster", "main", "uid-1");
        let ours = |name: &str| fixtures::deployment(name).owned_by(&owner).build();
        let theirs = fixtures::deployment("other").build();
        let mut leaving = ours("main-3");
        leaving.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::UNIX_EPOCH,
        ));
        let children = [ours("main-0"), ours("main-1"), ours("main-2"), theirs, leaving];
        let wanted = vec!["main-0".to_string(), "main-1".to_string()];
        assert_eq!(unwanted(&children, "uid-1", &wanted), vec!["main-2".to_string()]);
        assert!(unwanted(&children, "uid-2", &[]).is_empty(), "another owner's children");
    }
}
