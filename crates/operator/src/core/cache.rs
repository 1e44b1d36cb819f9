//! Caches of child objects kept fresh by a watch (kube-runtime reflectors), so that reconciles
//! read children without API requests.
//!
//! The same watch both fills the cache and triggers reconciles (a shared reflector): an object
//! reaches the store before the reconcile it triggers runs, so a reconcile never reads a child
//! older than the change that woke it. (With two separate watches, one for the cache and one
//! for `Controller::owns`, the reconcile can win the race, read the old child, conclude that
//! nothing changed, and wait forever.) This uses kube-runtime's `unstable-runtime` features.

use futures::StreamExt;
use kube::runtime::reflector::{self, ReflectHandle, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::warn;

/// Objects buffered for subscribers before the watch waits for them to catch up.
const SUBSCRIBER_BUFFER: usize = 1024;

/// Starts a shared reflector over `api` (filtered by `config`). Returns its store, once it holds
/// the first full list, and a stream of changed objects for `Controller::owns_shared_stream`.
/// Objects are stored without their managed fields, which are most of their size and which
/// nothing here reads.
pub async fn shared_cache<K>(api: Api<K>, config: watcher::Config) -> (Store<K>, Option<ReflectHandle<K>>)
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + DeserializeOwned + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store_shared(SUBSCRIBER_BUFFER);
    let subscriber = writer.subscribe();
    let stream = watcher(api, config)
        .modify(|o| o.managed_fields_mut().clear())
        .default_backoff()
        .reflect_shared(writer);
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
    (reader, subscriber)
}
