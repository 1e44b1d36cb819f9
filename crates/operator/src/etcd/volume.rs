//! A member's volume. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use noops_api::EtcdCluster;

use super::names::Names;

/// The PersistentVolumeClaim of `member` (none for ephemeral storage).
pub fn member_volume(
    cluster: &EtcdCluster,
    names: &Names,
    member: &str,
    owner: &OwnerReference,
) -> Option<PersistentVolumeClaim> {
    let storage = &cluster.spec.storage;
    (!storage.ephemeral).then(|| PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(names.volume(member)),
            namespace: Some(names.namespace.clone()),
            labels: Some(names.member_labels(member)),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: storage.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(storage.size.clone()),
                )])),
                limits: None,
            }),
            ..Default::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::fixtures;

    #[test]
    fn each_member_has_a_volume_named_after_it_unless_ephemeral() {
        let cluster = fixtures::cluster().build();
        let names = Names::of(&cluster);
        let pvc = member_volume(&cluster, &names, "main-2", &fixtures::owner()).unwrap();
        assert_eq!(pvc.metadata.name.as_deref(), Some("main-2-data"));
        let requests = pvc.spec.unwrap().resources.unwrap().requests.unwrap();
        assert_eq!(requests["storage"].0, "1Gi");
        let ephemeral = fixtures::cluster().ephemeral().build();
        assert!(member_volume(&ephemeral, &names, "main-2", &fixtures::owner()).is_none());
    }
}
