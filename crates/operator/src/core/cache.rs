//! Caches of child objects kept fresh by a watch (kube-runtime reflectors), so that reconciles
//! read children without API requests.
//!
//! The same watch both fills the cache and triggers reconciles: an object reaches the store
//! before the reconcile it triggers runs, so a reconcile never reads a child older than the
//! change that woke it. (With two separate watches, one for the cache and one for
//! `Controller::owns`, the reconcile can win the race, read the old child, conclude that
//! nothing changed, and wait forever.)
//!
//! The triggers are our own, not kube-runtime's shared-reflector handle: that handle says
//! nothing when an object is deleted (a member's pod that is finally gone would wake nobody,
//! and the pod made again would wait for the next periodic pass), and it can stall when an
//! object is deleted between its change and the read of it. Here every change and every
//! deletion is passed on, once the store holds it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tracing::warn;

/// Changes buffered for the controller before the watch waits for it to catch up.
const CHANGES_BUFFER: usize = 1024;

/// The objects of a cache that changed or were deleted, each once the store holds the change:
/// a trigger for `Controller::owns_shared_stream` and `watches_shared_stream`. A deleted object
/// comes as it was last seen (its labels and owners say whom it wakes).
pub struct Changes<K> {
    receiver: mpsc::Receiver<Arc<K>>,
}

impl<K> Stream for Changes<K> {
    type Item = Arc<K>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Arc<K>>> {
        self.receiver.poll_recv(cx)
    }
}

/// Starts a reflector over `api` (filtered by `config`). Returns its store, once it holds the
/// first full list, and its [`Changes`]. Objects are stored without their managed fields, which
/// are most of their size and which nothing here reads. Changes nobody listens to (the stream
/// dropped) cost nothing.
pub async fn shared_cache<K>(api: Api<K>, config: watcher::Config) -> (Store<K>, Changes<K>)
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + DeserializeOwned + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let (sender, receiver) = mpsc::channel(CHANGES_BUFFER);
    let stream = watcher(api, config)
        .modify(|o| o.managed_fields_mut().clear())
        .default_backoff()
        .reflect(writer);
    let store = reader.clone();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            // The store has applied the event by now (`reflect` applies it on the way through).
            let changed: Vec<Arc<K>> = match item {
                Ok(watcher::Event::Apply(object) | watcher::Event::Delete(object)) => vec![Arc::new(object)],
                // A (re)list is applied as a whole at its end: then everything may have changed.
                Ok(watcher::Event::InitDone) => store.state(),
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => Vec::new(),
                Err(e) => {
                    warn!(kind = K::kind(&()).as_ref(), error = %e, "cache watch failed; retrying");
                    Vec::new()
                }
            };
            for object in changed {
                // A receiver gone (no controller listens) is not an error: the cache still serves.
                let _ = sender.send(object).await;
            }
        }
    });
    // A closed writer is the only error, and it cannot close while the task above holds it.
    let _ = reader.wait_until_ready().await;
    (reader, Changes { receiver })
}

/// The objects of `store` in `namespace`.
pub fn in_namespace<K>(store: &Store<K>, namespace: &str) -> Vec<K>
where
    K: kube::Resource<DynamicType = ()> + Clone,
{
    store
        .state()
        .iter()
        .filter(|o| o.meta().namespace.as_deref() == Some(namespace))
        .map(|o| (**o).clone())
        .collect()
}

/// The controller's own objects (from its store) in `namespace`, those that could be read.
pub fn own_in_namespace<K>(store: &Store<kube::core::DeserializeGuard<K>>, namespace: &str) -> Vec<K>
where
    K: kube::Resource<DynamicType = ()> + Clone,
{
    store
        .state()
        .iter()
        .filter_map(|guard| guard.0.as_ref().ok())
        .filter(|o| o.meta().namespace.as_deref() == Some(namespace))
        .cloned()
        .collect()
}

/// The controller's own objects (from its store) in `namespace` for which `concerned` holds,
/// as the references a change wakes: how a change of an object they name (a user Secret, a
/// backup) reaches them.
pub fn concerned<K>(
    store: &Store<kube::core::DeserializeGuard<K>>,
    namespace: &str,
    concerned: impl Fn(&K) -> bool,
) -> Vec<reflector::ObjectRef<kube::core::DeserializeGuard<K>>>
where
    K: kube::Resource<DynamicType = ()> + Clone,
{
    own_in_namespace(store, namespace)
        .iter()
        .filter(|o| concerned(o))
        .map(|o| reflector::ObjectRef::new(&o.name_any()).within(namespace))
        .collect()
}
