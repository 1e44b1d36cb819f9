//! The tail of every pass: the status written (only if it changed), then the Events of what
//! the pass did. In that order for every kind: an Event never tells of a state the status does
//! not show yet, and a pass whose status write fails tells nothing, so the next pass, which
//! compares against the status it reads, tells it then.

use k8s_openapi::NamespaceResourceScope;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::apply::{apply_status, apply_status_at};
use super::controller::Context;
use super::events::Announcement;
use super::{DuringStage, Result, Stage};

impl<S> Context<S> {
    /// Writes `status` of `obj` if it differs from `previous` (what the pass read), then tells
    /// `told`.
    pub async fn report<K, T>(
        &self,
        obj: &K,
        previous: Option<&T>,
        status: &T,
        told: impl IntoIterator<Item = Announcement>,
    ) -> Result<()>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + DeserializeOwned + std::fmt::Debug,
        T: Serialize + PartialEq,
    {
        if previous != Some(status) {
            let body = serde_json::json!({
                "apiVersion": K::api_version(&()),
                "kind": K::kind(&()),
                "status": status,
            });
            apply_status(&self.api_of(obj), &obj.name_any(), &body)
                .await
                .during(Stage::Status)?;
        }
        self.tell(obj, told).await;
        Ok(())
    }

    /// Writes `status` of `obj`, if it differs from `previous`, only over `version` (see
    /// [`apply_status_at`]: for status that records work done outside Kubernetes, never
    /// written over a newer word), then tells `told`; false, telling nothing, if the object
    /// changed since.
    pub async fn report_at<K, T>(
        &self,
        obj: &K,
        previous: Option<&T>,
        version: &mut Option<String>,
        status: &T,
        told: impl IntoIterator<Item = Announcement>,
    ) -> Result<bool>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + DeserializeOwned + std::fmt::Debug,
        T: Serialize + PartialEq,
    {
        if previous != Some(status)
            && !apply_status_at(&self.api_of(obj), &obj.name_any(), version, status)
                .await
                .during(Stage::Status)?
        {
            return Ok(false);
        }
        self.tell(obj, told).await;
        Ok(true)
    }

    /// Tells `told` of `obj`, for a pass that writes no status.
    pub async fn tell<K>(&self, obj: &K, told: impl IntoIterator<Item = Announcement>)
    where
        K: Resource<DynamicType = ()>,
    {
        let reference = obj.object_ref(&());
        for announcement in told {
            self.core.events.tell(&reference, announcement).await;
        }
    }

    /// The API of `obj`'s kind in its namespace.
    fn api_of<K>(&self, obj: &K) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    {
        Api::namespaced(self.client.clone(), &obj.namespace().unwrap_or_default())
    }
}
