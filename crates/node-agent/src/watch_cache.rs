//! Cluster-wide caches kept fresh by a watch (kube-rs reflectors), shared by DNS and the
//! provisioner.

use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::Notify;
use tracing::warn;

/// Starts a reflector over every `K` in the cluster and returns its store. `changed`, if given,
/// is notified after each change. Watch errors are logged and retried with back-off.
pub fn cache<K>(client: Client, changed: Option<Arc<Notify>>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(Api::<K>::all(client), watcher::Config::default()))
        .default_backoff()
        .touched_objects();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            match item {
                Ok(_) => {
                    if let Some(n) = &changed {
                        n.notify_one();
                    }
                }
                Err(e) => warn!(kind = K::kind(&()).as_ref(), error = %e, "watch failed; retrying"),
            }
        }
    });
    reader
}
