//! The tail of every pass: the status written (only if it changed), then the Events of what
//! the pass did. In that order for every kind: an Event never tells of a state the status does
//! not show yet, and a pass whose status write fails tells nothing, so the next pass, which
//! compares against the status it reads, tells it then. A `Paused` condition that turns True
//! or False is told (`Paused`, `Resumed`) for every kind whose pass does not tell it itself.

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
        let told = with_pause_news(previous, status, told);
        if previous != Some(status) {
            self.write_status(obj, status).await.during(Stage::Status)?;
        }
        self.tell(obj, told).await;
        Ok(())
    }

    /// Writes `status` of `obj` (server-side apply) and notes the write, so that no pass runs
    /// on the version written over. The one unguarded status write: [`Self::report`]'s and
    /// the core's stages'.
    pub async fn write_status<K, T>(&self, obj: &K, status: &T) -> kube::Result<()>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + DeserializeOwned + std::fmt::Debug,
        T: Serialize,
    {
        let body = serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "status": status,
        });
        let written = apply_status(&self.api_of(obj), &obj.name_any(), &body).await?;
        let read = obj.meta().resource_version.clone();
        self.wrote(obj, read.as_deref(), written.meta().resource_version.as_deref());
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
        let told = with_pause_news(previous, status, told);
        if previous != Some(status) && !self.write_status_at(obj, version, status).await.during(Stage::Status)? {
            return Ok(false);
        }
        self.tell(obj, told).await;
        Ok(true)
    }

    /// Writes `status` of `obj` only over `version` (see [`apply_status_at`]) and notes the
    /// write, so that no pass runs on the version written over; false if the object changed
    /// since. The one guarded status write: [`Self::report_at`], etcd's and the backups'.
    pub async fn write_status_at<K, T>(&self, obj: &K, version: &mut Option<String>, status: &T) -> kube::Result<bool>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + DeserializeOwned + std::fmt::Debug,
        T: Serialize,
    {
        let over = version.clone();
        let written = apply_status_at(&self.api_of(obj), &obj.name_any(), version, status).await?;
        if written {
            self.wrote(obj, over.as_deref(), version.as_deref());
        }
        Ok(written)
    }

    /// Notes that this pass wrote `obj` over version `before`, which left version `after`:
    /// the core skips passes over `before` until the cache holds a later one
    /// ([`super::written::Written`]).
    fn wrote<K: Resource>(&self, obj: &K, before: Option<&str>, after: Option<&str>) {
        self.core
            .written
            .wrote(&super::written::key_of(obj.meta()), before, after);
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

/// `told`, and a `Paused` or `Resumed` Event when the `Paused` condition turns True or False
/// between `previous` and `status` and `told` does not say so already.
pub(super) fn with_pause_news<T: Serialize>(
    previous: Option<&T>,
    status: &T,
    told: impl IntoIterator<Item = Announcement>,
) -> Vec<Announcement> {
    let mut told: Vec<Announcement> = told.into_iter().collect();
    let paused = |status: Option<&T>| -> Option<(bool, String)> {
        let value = serde_json::to_value(status?).ok()?;
        let condition = value
            .get("conditions")?
            .as_array()?
            .iter()
            .find(|c| c.get("type").and_then(|t| t.as_str()) == Some(noops_api::condition::PAUSED))?;
        let message = condition.get("message").and_then(|m| m.as_str()).unwrap_or_default();
        Some((condition.get("status")?.as_str()? == "True", message.to_string()))
    };
    // A status written before the condition existed says nothing of a pause: no news then
    // (an object paused before an upgrade of the operator is not paused anew).
    let before = paused(previous);
    if previous.is_some() && before.is_none() {
        return told;
    }
    let was = before.is_some_and(|(p, _)| p);
    let news = match paused(Some(status)) {
        Some((true, message)) if !was => Some(Announcement::normal("Paused", message)),
        Some((false, _)) if was => Some(Announcement::normal(
            "Resumed",
            "spec.paused is false: the operator manages it again",
        )),
        _ => None,
    };
    if let Some(news) = news
        && !told.iter().any(|a| a.reason == news.reason)
    {
        told.push(news);
    }
    told
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(paused: Option<bool>) -> serde_json::Value {
        let conditions: Vec<serde_json::Value> = paused
            .map(
                |p| serde_json::json!({ "type": "Paused", "status": if p { "True" } else { "False" }, "message": "m" }),
            )
            .into_iter()
            .collect();
        serde_json::json!({ "conditions": conditions })
    }

    fn reasons(told: Vec<Announcement>) -> Vec<String> {
        told.into_iter().map(|a| a.reason).collect()
    }

    #[test]
    fn a_pause_and_a_resume_are_told_once_by_whoever_tells_them_first() {
        let (unset, off, on) = (status(None), status(Some(false)), status(Some(true)));
        assert_eq!(reasons(with_pause_news(Some(&off), &on, [])), ["Paused"]);
        assert_eq!(reasons(with_pause_news(None, &on, [])), ["Paused"]);
        assert_eq!(reasons(with_pause_news(Some(&on), &off, [])), ["Resumed"]);
        assert!(with_pause_news(Some(&on), &on, []).is_empty());
        assert!(with_pause_news(Some(&unset), &off, []).is_empty());
        assert!(
            with_pause_news(Some(&unset), &on, []).is_empty(),
            "paused before the condition existed"
        );
        assert!(with_pause_news(None, &off, []).is_empty());
        // A pass that tells it itself (with its own note) is not told twice.
        let own = Announcement::normal("Paused", "the kind's own note");
        let told = with_pause_news(Some(&off), &on, [own]);
        assert_eq!(told.len(), 1);
        assert_eq!(told[0].note, "the kind's own note");
    }
}
