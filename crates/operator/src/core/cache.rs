//! Caches of child objects kept fresh by a watch (kube-runtime reflectors), so that reconciles
//! read children without API requests.

use futures::StreamExt;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tracing::warn;

/// Starts a reflector over `api` (filtered by `config`) and returns its store once it holds the
/// first full list. Objects are stored without their managed fields.
pub async fn cache<K>(api: Api<K>, config: watcher::Config) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + DeserializeOwned + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config))
        .default_backoff()
        .touched_objects();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            if let Err(e) = item {
                warn!(kind = K::kind(&()).as_ref(), error = %e, "cache watch failed; retrying");
            }
        }
    });
    // A closed writer is the only error, and it cannot close while the task above holds it.
    let _ = reader.wait_until_ready().await;
    reader
}
