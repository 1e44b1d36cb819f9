//! Local-path provisioner: PersistentVolumes that are folders on this machine.
//!
//! Follows the external-provisioner protocol: for a pending claim of a StorageClass whose
//! provisioner is ours (and, with WaitForFirstConsumer, once the scheduler has put this node in
//! the claim's `volume.kubernetes.io/selected-node`), create a hostPath PV pinned to this node
//! with a claimRef; the controller-manager binds the pair. A Released PV with reclaim policy
//! Delete has its folder and object removed. Folders outlive pods, so a pod that comes back on
//! the same claim finds its data.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};

use crate::watch_cache;
use serde_json::json;
use tokio::sync::Notify;
use tracing::{info, warn};

/// Our provisioner name (StorageClass `provisioner`).
pub const PROVISIONER: &str = "noops.dev/local-path";
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// What the provisioner should do next, decided from the cached objects.
#[derive(Debug, PartialEq)]
pub enum Step {
    Provision {
        claim: Arc<PersistentVolumeClaim>,
        class: Arc<StorageClass>,
    },
    Reclaim {
        volume: Arc<PersistentVolume>,
    },
}

/// The PV name for a claim (the upstream convention: `pvc-<claim uid>`).
pub fn volume_name(claim: &PersistentVolumeClaim) -> String {
    format!("pvc-{}", claim.metadata.uid.as_deref().unwrap_or_default())
}

/// Decides what to do, given every claim, volume and class. Pure.
pub fn plan(
    node: &str,
    claims: &[Arc<PersistentVolumeClaim>],
    volumes: &[Arc<PersistentVolume>],
    classes: &[Arc<StorageClass>],
) -> Vec<Step> {
    let mut steps = vec![];
    let default_class = classes.iter().find(|c| {
        c.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("storageclass.kubernetes.io/is-default-class"))
            .map(String::as_str)
            == Some("true")
    });
    for claim in claims {
        let spec = claim.spec.clone().unwrap_or_default();
        let pending = claim
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("Pending")
            == "Pending";
        if !pending || spec.volume_name.is_some() || claim.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let class = match spec.storage_class_name.as_deref() {
            Some(name) => classes.iter().find(|c| c.metadata.name.as_deref() == Some(name)),
            None => default_class,
        };
        let Some(class) = class.filter(|c| c.provisioner == PROVISIONER) else {
            continue;
        };
        let wait_for_consumer = class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer");
        let selected = claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SELECTED_NODE))
            .map(String::as_str);
        if wait_for_consumer && selected != Some(node) {
            continue;
        }
        let name = volume_name(claim);
        if volumes.iter().any(|v| v.metadata.name.as_deref() == Some(&name)) {
            continue;
        }
        steps.push(Step::Provision {
            claim: claim.clone(),
            class: class.clone(),
        });
    }
    for volume in volumes {
        let ours = volume
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(PROVISIONED_BY))
            .map(String::as_str)
            == Some(PROVISIONER);
        let released = volume.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
        let delete = volume
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            == Some("Delete");
        // Only the node that holds a volume's folder may reclaim it.
        if ours && released && delete && pinned_to(volume) == Some(node) && volume.metadata.deletion_timestamp.is_none()
        {
            steps.push(Step::Reclaim { volume: volume.clone() });
        }
    }
    steps
}

/// The node a volume of ours is pinned to (its `kubernetes.io/hostname` affinity).
fn pinned_to(volume: &PersistentVolume) -> Option<&str> {
    let terms = &volume
        .spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms;
    terms
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .find(|e| e.key == "kubernetes.io/hostname" && e.operator == "In")
        .and_then(|e| e.values.as_ref()?.first())
        .map(String::as_str)
}

/// The PersistentVolume for a claim, at `path`.
pub fn volume_for(claim: &PersistentVolumeClaim, class: &StorageClass, node: &str, path: &Path) -> PersistentVolume {
    let spec = claim.spec.clone().unwrap_or_default();
    let size = spec
        .resources
        .and_then(|r| r.requests)
        .and_then(|r| r.get("storage").cloned())
        .map(|q| q.0)
        .unwrap_or_else(|| "1Gi".into());
    let value = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": volume_name(claim),
            "annotations": { PROVISIONED_BY: PROVISIONER },
        },
        "spec": {
            "capacity": { "storage": size },
            "accessModes": spec.access_modes.unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
            "persistentVolumeReclaimPolicy": class.reclaim_policy.clone().unwrap_or_else(|| "Delete".into()),
            "storageClassName": class.metadata.name,
            "volumeMode": "Filesystem",
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": claim.metadata.namespace,
                "name": claim.metadata.name,
                "uid": claim.metadata.uid,
            },
            "hostPath": { "path": path.display().to_string(), "type": "DirectoryOrCreate" },
            "nodeAffinity": { "required": { "nodeSelectorTerms": [{ "matchExpressions": [
                { "key": "kubernetes.io/hostname", "operator": "In", "values": [node] }
            ]}]}},
        },
    });
    serde_json::from_value(value).unwrap_or_default()
}

/// Runs the provisioner until cancelled.
pub async fn run(client: Client, node: String, volumes_dir: PathBuf) {
    let notify = Arc::new(Notify::new());
    let claims = watch_cache::cache::<PersistentVolumeClaim>(client.clone(), Some(notify.clone()));
    let volumes = watch_cache::cache::<PersistentVolume>(client.clone(), Some(notify.clone()));
    let classes = watch_cache::cache::<StorageClass>(client.clone(), Some(notify.clone()));
    let pv_api: Api<PersistentVolume> = Api::all(client.clone());
    loop {
        // Wake on any change, and now and then in case a step failed.
        let _ = tokio::time::timeout(Duration::from_secs(30), notify.notified()).await;
        for step in plan(&node, &claims.state(), &volumes.state(), &classes.state()) {
            match step {
                Step::Provision { claim, class } => {
                    let ns = claim.metadata.namespace.clone().unwrap_or_default();
                    let name = claim.metadata.name.clone().unwrap_or_default();
                    let path = volumes_dir.join(format!("{}_{ns}_{name}", volume_name(&claim)));
                    // The PV first: with Immediate binding every node tries, and only the one
                    // whose PV is created makes the folder (the others would leave orphans).
                    let pv = volume_for(&claim, &class, &node, &path);
                    match pv_api.create(&PostParams::default(), &pv).await {
                        Ok(_) => match std::fs::create_dir_all(&path).and_then(|()| crate::volumes::open_to_all(&path))
                        {
                            Ok(()) => {
                                info!(claim = %format!("{ns}/{name}"), path = %path.display(), "provisioned volume")
                            }
                            // The volume's first pod makes it (DirectoryOrCreate) if this failed.
                            Err(e) => {
                                warn!(claim = %format!("{ns}/{name}"), error = %e, "failed to create volume folder")
                            }
                        },
                        Err(kube::Error::Api(e)) if e.code == 409 => {}
                        Err(e) => warn!(claim = %format!("{ns}/{name}"), error = %e, "failed to create volume"),
                    }
                }
                Step::Reclaim { volume } => {
                    let name = volume.metadata.name.clone().unwrap_or_default();
                    let path = volume
                        .spec
                        .as_ref()
                        .and_then(|s| s.host_path.as_ref())
                        .map(|h| PathBuf::from(&h.path));
                    if let Some(path) = path.filter(|p| p.starts_with(&volumes_dir))
                        && let Err(e) = std::fs::remove_dir_all(&path)
                        && e.kind() != std::io::ErrorKind::NotFound
                    {
                        warn!(volume = %name, error = %e, "failed to remove volume folder");
                        continue;
                    }
                    match pv_api.delete(&name, &DeleteParams::default()).await {
                        Ok(_) => info!(volume = %name, "deleted released volume"),
                        Err(kube::Error::Api(e)) if e.code == 404 => {}
                        Err(e) => warn!(volume = %name, error = %e, "failed to delete volume"),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn class(mode: &str) -> Arc<StorageClass> {
        let mut c = StorageClass {
            provisioner: PROVISIONER.into(),
            volume_binding_mode: Some(mode.into()),
            ..Default::default()
        };
        c.metadata.name = Some("local".into());
        c.metadata.annotations = Some(BTreeMap::from([(
            "storageclass.kubernetes.io/is-default-class".into(),
            "true".into(),
        )]));
        Arc::new(c)
    }

    fn claim(selected: Option<&str>) -> Arc<PersistentVolumeClaim> {
        let mut c = PersistentVolumeClaim::default();
        c.metadata.name = Some("data-etcd-0".into());
        c.metadata.namespace = Some("db".into());
        c.metadata.uid = Some("u1".into());
        if let Some(n) = selected {
            c.metadata.annotations = Some(BTreeMap::from([(SELECTED_NODE.into(), n.into())]));
        }
        Arc::new(c)
    }

    #[test]
    fn waits_for_the_scheduler_then_provisions_once() {
        let classes = vec![class("WaitForFirstConsumer")];
        assert!(plan("n1", &[claim(None)], &[], &classes).is_empty());
        assert!(plan("n1", &[claim(Some("other"))], &[], &classes).is_empty());
        let steps = plan("n1", &[claim(Some("n1"))], &[], &classes);
        assert!(matches!(steps.as_slice(), [Step::Provision { .. }]));
        let pv = volume_for(&claim(Some("n1")), &classes[0], "n1", Path::new("/v/x"));
        assert_eq!(pv.metadata.name.as_deref(), Some("pvc-u1"));
        assert_eq!(
            pv.spec.as_ref().unwrap().claim_ref.as_ref().unwrap().uid.as_deref(),
            Some("u1")
        );
        assert!(
            plan("n1", &[claim(Some("n1"))], &[Arc::new(pv)], &classes).is_empty(),
            "already provisioned"
        );
    }

    #[test]
    fn immediate_classes_do_not_wait() {
        assert_eq!(plan("n1", &[claim(None)], &[], &[class("Immediate")]).len(), 1);
    }

    #[test]
    fn released_volumes_are_reclaimed() {
        let classes = vec![class("Immediate")];
        let mut pv = volume_for(&claim(None), &classes[0], "n1", Path::new("/v/x"));
        pv.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus {
            phase: Some("Released".into()),
            ..Default::default()
        });
        let pv = Arc::new(pv);
        assert!(matches!(
            plan("n1", &[], std::slice::from_ref(&pv), &classes).as_slice(),
            [Step::Reclaim { .. }]
        ));
        assert!(
            plan("n2", &[], &[pv], &classes).is_empty(),
            "another node's volume is left to that node"
        );
    }
}
