//! Applying a MaintPage's children, and telling which differences the apply takes back were hand
//! edits.
//!
//! The maintenance Deployment goes first (its pods start before the Service may point at
//! them), then the app, then the Service (the plan moved it only to pods that are Ready). Each
//! child is applied on the condition that it is still as observed: a hand edit made since would
//! otherwise be reverted without being noticed and reported. An apply that would change
//! nothing is skipped.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::{Api, Resource};

use super::desired::Children;
use super::observe::Live;
use crate::core::Result;
use crate::core::apply::apply;
use crate::core::rollout::image_of;
use crate::core::stamp::{same_stamp, up_to_date};

/// The Deployments as they are after the apply (their status feeds the MaintPage's).
pub struct Applied {
    pub app: Deployment,
    pub maintenance: Deployment,
}

/// Applies every child; `None` if one changed since it was observed (the reconcile looks again).
pub async fn apply_children(
    client: &kube::Client,
    namespace: &str,
    desired: &Children,
    live: &Live,
) -> Result<Option<Applied>> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let Some(maintenance) = apply_unchanged(&deployments, &desired.maintenance, live.maintenance.as_ref()).await?
    else {
        return Ok(None);
    };
    let Some(app) = apply_unchanged(&deployments, &desired.app, live.app.as_ref()).await? else {
        return Ok(None);
    };
    if apply_unchanged(&services, &desired.service, live.service.as_ref())
        .await?
        .is_none()
    {
        return Ok(None);
    }
    Ok(Some(Applied { app, maintenance }))
}

/// Applies the stamped `desired` if the live object is still at the version read (`None` if it
/// changed); skips the request when the live object already is as desired.
async fn apply_unchanged<K>(api: &Api<K>, desired: &K, read: Option<&K>) -> Result<Option<K>>
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if up_to_date(desired, read) {
        return Ok(read.cloned());
    }
    let mut desired = desired.clone();
    desired.meta_mut().resource_version = read.and_then(|r| r.meta().resource_version.clone());
    let name = desired.meta().name.clone().unwrap_or_default();
    match apply(api, &name, &desired).await {
        Ok(applied) => Ok(Some(applied)),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Hand-made changes to fields the operator owns, as (Event reason, words). Only a child whose
/// live copy was applied from the same desired state counts: if what the operator wants has
/// changed (a spec edit, a switch), a difference is that change, not a hand edit. The apply
/// reverts them. Pure.
pub fn hand_edits(desired: &Children, live: &Live) -> Vec<(&'static str, String)> {
    let mut notes = vec![];
    for (live, want, what) in [
        (live.app.as_ref(), &desired.app, "app"),
        (live.maintenance.as_ref(), &desired.maintenance, "maintenance"),
    ] {
        let Some(live) = live.filter(|l| same_stamp(want, *l)) else {
            continue;
        };
        let Some(wanted) = image_of(want) else { continue };
        if let Some(found) = image_of(live).filter(|found| *found != wanted) {
            let name = live.metadata.name.as_deref().unwrap_or_default();
            let note = format!("image of the {what} Deployment {name} was changed to {found}; set back to {wanted}");
            notes.push(("ImageReverted", note));
        }
    }
    if let Some(live) = live.service.as_ref().filter(|l| same_stamp(&desired.service, *l)) {
        let wanted = desired.service.spec.as_ref().and_then(|s| s.selector.clone());
        let found = live.spec.as_ref().and_then(|s| s.selector.clone());
        if found != wanted {
            let name = live.metadata.name.as_deref().unwrap_or_default();
            let note = format!("selector of the Service {name} was changed to {found:?}; set back to {wanted:?}");
            notes.push(("SelectorReverted", note));
        }
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::images::Images;
    use crate::maintpage::desired::{build, selector};
    use crate::maintpage::fixtures::{self, plan};
    use noops_api::maintpage::Side;

    #[test]
    fn hand_edits_are_described_but_spec_changes_are_not() {
        let mp = fixtures::maintpage().build();
        let desired = build(&mp, &plan(Side::App, 0), &Images::default(), &fixtures::owner());
        let mut edited = desired.app.clone();
        edited.spec.as_mut().unwrap().template.spec.as_mut().unwrap().containers[0].image = Some("evil:2".into());
        let mut service = desired.service.clone();
        service.spec.as_mut().unwrap().selector = Some(selector(&mp, Side::Maintenance));
        let live = Live {
            app: Some(edited),
            maintenance: Some(desired.maintenance.clone()),
            service: Some(service),
        };
        let notes = hand_edits(&desired, &live);
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert_eq!(notes[0].0, "ImageReverted");
        assert!(notes[0].1.contains("changed to evil:2; set back to app:1"));
        assert_eq!(notes[1].0, "SelectorReverted");

        // The user changes the image in the spec, and a switch moves the selector: both make
        // the live children differ from the new desired ones, and neither is a hand edit.
        let changed = fixtures::maintpage().app_image("app:2").build();
        let next = build(
            &changed,
            &plan(Side::Maintenance, 1),
            &Images::default(),
            &fixtures::owner(),
        );
        let before = Live {
            app: Some(desired.app.clone()),
            maintenance: Some(desired.maintenance.clone()),
            service: Some(desired.service.clone()),
        };
        assert!(hand_edits(&next, &before).is_empty());
    }
}
