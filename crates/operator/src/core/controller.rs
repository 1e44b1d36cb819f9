//! What every controller of the operator is and shares.
//!
//! - [`Registration`]: a controller's name, how many passes it runs at once and how to run it.
//!   Each controller module exports one as `CONTROLLER`, made of its engine by
//!   [`registration`](super::stages::registration), and `lib.rs` lists the modules once
//!   (`controllers!`): that list is what `noops run --controllers` accepts and runs.
//! - [`Runtime`]: what `noops run` gives a controller (client, namespace, metrics, shutdown),
//!   and what an engine is wired of ([`Engine::wire`](super::engine::Engine::wire)): its
//!   watch caches (`cache`), its controller (`controller`), wired to the children that wake
//!   it; then `serve`, which runs every pass through the core.
//! - [`Context`]: what every pass shares (the core, the client, the controller's own state).
//! - [`ControllerCore`]: the wrapper around each reconcile: a tracing span naming the controller
//!   and the object (so log lines need not repeat them), metrics, a growing back-off per object,
//!   a Warning Event for failures, and objects that cannot be read (one malformed object gets
//!   an Event; the watch goes on for everyone else).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::core::DeserializeGuard;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tracing::{Instrument, debug, warn};

/// How soon an object whose cleanup is under way ([`Error::UnderWay`]) is looked at again.
const UNDER_WAY_CHECK: Duration = Duration::from_secs(2);
/// How soon a pass skipped because the cache has not shown the last pass's write yet is
/// tried again, should the write's own watch event not wake it first.
const CACHE_BEHIND_CHECK: Duration = Duration::from_secs(2);
/// How often each object's state series are read again from the cache (a scrape sees a
/// change of condition at most this late).
const STATE_SERIES_EVERY: Duration = Duration::from_secs(5);

use super::backoff::Backoff;
use super::cache::{Changes, shared_cache};
use super::events::{Announcement, Events};
use super::metrics::Metrics;
use super::resource_metrics::ResourceState;
use super::written::Written;
use super::{Error, Result};

/// One controller of the operator.
pub struct Registration {
    /// Its name in `--controllers`, metric labels, log spans and Events (`noops-<name>`).
    pub name: &'static str,
    /// What it manages, for `noops run --help`.
    pub about: &'static str,
    /// At most this many objects are reconciled at once (most passes wait on the API server;
    /// a bound keeps a burst of thousands of objects from queueing all at once there and in
    /// memory).
    pub concurrency: u16,
    /// Runs it until its shutdown fires.
    pub run: fn(Runtime) -> BoxFuture<'static, ()>,
}

/// What a running controller gets.
#[derive(Clone)]
pub struct Runtime {
    pub client: Client,
    /// The same API server without kube's retries of a 429, 503 or 504: for a request whose
    /// 429 is an answer (an eviction a budget refuses now), not a server's load, which a retry
    /// would only hold up for minutes.
    pub client_asking_once: Client,
    /// The namespace to watch; all namespaces if `None`.
    pub namespace: Option<String>,
    pub metrics: Arc<Metrics>,
    pub shutdown: Shutdown,
    /// The operator's own image: helper containers run it (a restore pod fetching a snapshot).
    pub image: String,
    /// How long the certificates the operator issues are valid.
    pub certificate_lifetime: std::time::Duration,
    /// Where the services' images are pulled from, and with which Secrets (`--image-registry`,
    /// `--image-pull-secrets`).
    pub images: super::images::Images,
}

/// A namespaced kind a controller watches: read from JSON, shared by its passes.
pub trait Watched:
    Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
    + Clone
    + DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

impl Runtime {
    /// A watch cache of `K` in the controller's scope, shared by its passes, and the changes
    /// it has taken in (see [`shared_cache`]).
    pub async fn cache<K>(&self, config: kube::runtime::watcher::Config) -> (Store<K>, Changes<K>)
    where
        K: Watched,
    {
        shared_cache(scoped_api::<K>(&self.client, &self.namespace), config).await
    }

    /// A controller of `K` in the controller's scope, with at most `concurrency` passes at
    /// once (its registration's).
    pub fn controller<K>(&self, concurrency: u16) -> Controller<DeserializeGuard<K>>
    where
        K: Watched,
    {
        controller_of::<K>(&self.client, &self.namespace, concurrency)
    }

    /// Runs `controller` (from [`Self::controller`], wired to its children) of the controller
    /// registered as `name` with `state` until the shutdown fires: each pass `reconcile`
    /// through the core (span, metrics, back-off, malformed objects), each failure through its
    /// error policy, and each object's state as series.
    pub(super) async fn serve<K, S, R, Fut>(
        self,
        name: &'static str,
        controller: Controller<DeserializeGuard<K>>,
        state: S,
        reconcile: R,
    ) where
        K: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
        S: Send + Sync + 'static,
        R: Fn(Arc<K>, Arc<Context<S>>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Action>> + Send + 'static,
    {
        let ctx = Context::new(name, &self.client, self.metrics, state);
        let controller = controller.graceful_shutdown_on(self.shutdown.fired());
        let namespace = &self.namespace;
        // Each object's state as series, read from the cache; the per-resource series of an
        // object that is gone go with it (those of namespaces another instance of this controller
        // watches are not this one's to judge).
        let store = controller.store();
        let metrics = ctx.core.metrics.clone();
        let scope = namespace.clone();
        let janitor = tokio::spawn(async move {
            let kind = K::kind(&()).to_string();
            loop {
                tokio::time::sleep(STATE_SERIES_EVERY).await;
                for object in store.state() {
                    // An object that cannot be read has its metadata only: no status, so alerts on
                    // a resource without one see it.
                    let json = match &object.0 {
                        Ok(object) => serde_json::to_value(object).ok(),
                        Err(invalid) => serde_json::to_value(serde_json::json!({ "metadata": invalid.metadata })).ok(),
                    };
                    let meta = match &object.0 {
                        Ok(object) => object.meta(),
                        Err(invalid) => &invalid.metadata,
                    };
                    let (Some(json), Some(namespace), Some(name)) = (json, &meta.namespace, &meta.name) else {
                        continue;
                    };
                    metrics.set_resource_state(&kind, namespace, name, ResourceState::read(&json));
                }
                metrics.retain_resources(&kind, |namespace, name| {
                    scope.as_deref().is_some_and(|watched| watched != namespace)
                        || store
                            .get(&kube::runtime::reflector::ObjectRef::new(name).within(namespace))
                            .is_some()
                });
            }
        });
        controller
            .run(
                move |obj, ctx: Arc<Context<S>>| {
                    let reconcile = reconcile.clone();
                    async move {
                        let pass = ctx.clone();
                        ctx.core.reconcile(&obj, |object| reconcile(object, pass)).await
                    }
                },
                |obj, error, ctx| ctx.core.error_policy(&obj, error),
                ctx,
            )
            .for_each(|result| async move {
                match result {
                    Ok((object, _)) => {
                        debug!(object = %format!("{}/{}", object.namespace.unwrap_or_default(), object.name), "reconciled");
                    }
                    Err(e) => debug!(error = %e, "controller event"),
                }
            })
            .await;
        janitor.abort();
    }
}

/// Fires when the controllers must stop (SIGTERM, or this replica lost its leader lease).
#[derive(Clone)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// A shutdown that fires once `halt` is true.
    pub fn new(halt: watch::Receiver<bool>) -> Self {
        Self(halt)
    }

    /// Completes when the shutdown fires (or its sender is gone).
    pub async fn fired(mut self) {
        let _ = self.0.wait_for(|halt| *halt).await;
    }
}

/// What every pass of a controller shares: the core, the client, and the controller's own
/// state `S` (its watch caches and settings), whose fields read as the context's own.
pub struct Context<S> {
    pub core: ControllerCore,
    pub client: Client,
    pub state: S,
}

impl<S> Context<S> {
    /// The context of controller `name`, with `state`.
    pub fn new(name: &'static str, client: &Client, metrics: Arc<Metrics>, state: S) -> Arc<Self> {
        Arc::new(Self {
            core: ControllerCore::new(name, client.clone(), metrics),
            client: client.clone(),
            state,
        })
    }
}

impl<S> std::ops::Deref for Context<S> {
    type Target = S;

    fn deref(&self) -> &S {
        &self.state
    }
}

/// A controller of `K` in `namespace` (every namespace for `None`), woken by every change of
/// an object's spec, labels or annotations, with at most `concurrency` passes at once (most
/// passes wait on the API server; a bound keeps a burst of thousands of objects from queueing
/// all at once there and in memory).
pub fn controller_of<K>(
    client: &Client,
    namespace: &Option<String>,
    concurrency: u16,
) -> Controller<DeserializeGuard<K>>
where
    K: Watched,
{
    Controller::new(
        scoped_api::<DeserializeGuard<K>>(client, namespace),
        kube::runtime::watcher::Config::default().any_semantic(),
    )
    .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
}

/// The API of `K` in `namespace`, or in every namespace for `None` (a controller's scope).
pub fn scoped_api<K>(client: &Client, namespace: &Option<String>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The `namespace/name` of an object, read or not.
fn key<K>(obj: &DeserializeGuard<K>) -> String
where
    K: Resource,
{
    super::written::key_of(match &obj.0 {
        Ok(o) => o.meta(),
        Err(invalid) => &invalid.metadata,
    })
}

/// What every reconcile of one controller shares.
pub struct ControllerCore {
    pub name: &'static str,
    pub events: Events,
    pub metrics: Arc<Metrics>,
    /// The objects its passes wrote that the cache has not shown yet: a pass over one of them
    /// is skipped.
    pub written: Written,
    backoff: Backoff,
}

impl ControllerCore {
    pub fn new(name: &'static str, client: Client, metrics: Arc<Metrics>) -> Self {
        Self {
            name,
            events: Events::new(client, &format!("noops-{name}")),
            metrics,
            written: Written::default(),
            backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(300)),
        }
    }

    /// Runs one reconcile of `obj` with `reconcile`, inside a span naming the controller and the
    /// object, counting it in the metrics and resetting the object's back-off on success. An
    /// object that cannot be read as `K` gets a Warning Event and waits for its next change; one
    /// whose cached version a pass has written over is not passed over until the cache holds
    /// the write ([`Written`]).
    pub async fn reconcile<K, F, Fut>(&self, obj: &DeserializeGuard<K>, reconcile: F) -> Result<Action>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned,
        F: FnOnce(Arc<K>) -> Fut,
        Fut: Future<Output = Result<Action>>,
    {
        let started = Instant::now();
        let key = key(obj);
        let span = tracing::info_span!("reconcile", controller = self.name, object = %key);
        let object = match &obj.0 {
            Ok(o) if self.written.behind(&key, o.meta().resource_version.as_deref()) => {
                debug!(controller = self.name, object = %key, "the cache does not hold the last pass's write yet; its watch event wakes the next pass");
                return Ok(Action::requeue(CACHE_BEHIND_CHECK));
            }
            Ok(o) => Arc::new(o.clone()),
            Err(invalid) => {
                let kind = K::kind(&()).to_string();
                let error = Error::Malformed {
                    kind: kind.clone(),
                    message: invalid.error.clone(),
                };
                let reference = ObjectReference {
                    api_version: Some(K::api_version(&()).into()),
                    kind: Some(kind),
                    name: invalid.metadata.name.clone(),
                    namespace: invalid.metadata.namespace.clone(),
                    uid: invalid.metadata.uid.clone(),
                    ..Default::default()
                };
                async {
                    warn!(%error, "skipping an object that cannot be read");
                    self.events
                        .publish(&reference, Announcement::warning(error.reason(), error.to_string()))
                        .await;
                }
                .instrument(span)
                .await;
                self.metrics.failed(self.name, error.reason(), started.elapsed());
                return Ok(Action::await_change());
            }
        };
        let result = reconcile(object).instrument(span).await;
        match &result {
            Ok(_) | Err(Error::UnderWay(_) | Error::Held(_)) => {
                self.metrics.succeeded(self.name, started.elapsed());
                self.backoff.succeeded(&key);
            }
            Err(e) => self.metrics.failed(self.name, e.reason(), started.elapsed()),
        }
        result
    }

    /// Requeues a failed object after a back-off that grows with its consecutive failures, and
    /// says so in a Warning Event when retrying may help (errors that need a spec change say
    /// why in the status instead).
    pub fn error_policy<K>(&self, obj: &DeserializeGuard<K>, error: &Error) -> Action
    where
        K: Resource<DynamicType = ()>,
    {
        let key = key(obj);
        if let Error::Held(what) = error {
            debug!(controller = self.name, object = %key, "{what}; waiting for it to change");
            return Action::await_change();
        }
        if let Error::UnderWay(what) = error {
            debug!(controller = self.name, object = %key, "{what}; looking again in {}s", UNDER_WAY_CHECK.as_secs());
            return Action::requeue(UNDER_WAY_CHECK);
        }
        let delay = self.backoff.failed(&key);
        let stage = error.stage().map(|s| s.to_string());
        warn!(controller = self.name, object = %key, reason = error.reason(), stage, %error, retry_in = ?delay, "reconcile failed");
        if error.is_transient()
            && let Ok(o) = &obj.0
        {
            let reference = o.object_ref(&());
            let events = self.events.clone();
            let (reason, note) = (error.reason(), format!("{error}; retrying in {}s", delay.as_secs()));
            tokio::spawn(async move { events.publish(&reference, Announcement::warning(reason, note)).await });
        }
        Action::requeue(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn shutdown_fires_when_halted_or_abandoned() {
        let (halt, rx) = watch::channel(false);
        let shutdown = Shutdown::new(rx);
        let waiting = tokio::spawn(shutdown.clone().fired());
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        let _ = halt.send(true);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .unwrap()
            .unwrap();
        let (halt, rx) = watch::channel(false);
        drop(halt);
        tokio::time::timeout(Duration::from_secs(1), Shutdown::new(rx).fired())
            .await
            .unwrap();
    }
}
