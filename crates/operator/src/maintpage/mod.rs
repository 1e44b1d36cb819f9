//! The MaintPage controller.
//!
//! Watches MaintPages and the Deployments and Services they own (so hand edits are seen and
//! reverted at once), and reconciles each MaintPage in stages: read the live children →
//! validate that they are ours → plan the switch and build the desired children (pure) → apply
//! them with server-side apply → write the status if it changed. All progress of a switch is in
//! the status, so a restarted operator carries on where the last one stopped.

pub mod desired;
mod reconcile;
pub mod status;
pub mod switch;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use kube::core::DeserializeGuard;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use noops_api::MaintPage;
use tracing::{debug, warn};

use crate::core::backoff::Backoff;
use crate::core::cache::shared_cache;
use crate::core::events::Events;
use crate::core::metrics::Metrics;
use crate::core::{Error, Result};

/// The controller's name in metrics, logs and Events.
pub const CONTROLLER: &str = "maintpage";

/// At most this many MaintPages are reconciled at once.
const MAX_CONCURRENT_RECONCILES: u16 = 16;

/// What every reconcile of this controller shares.
pub struct Context {
    pub client: Client,
    pub events: Events,
    pub metrics: Arc<Metrics>,
    pub backoff: Backoff,
    /// The Deployments and Services the operator manages, kept by watches: reconciles read
    /// children from here, not from the API server.
    pub deployments: Store<Deployment>,
    pub services: Store<Service>,
}

fn key(obj: &DeserializeGuard<MaintPage>) -> String {
    let meta = match &obj.0 {
        Ok(mp) => &mp.metadata,
        Err(invalid) => &invalid.metadata,
    };
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

/// Wraps the reconcile with metrics, back-off bookkeeping, and the handling of objects that do
/// not deserialize (they get a Warning Event; the watch goes on for everyone else).
async fn reconcile(obj: Arc<DeserializeGuard<MaintPage>>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    let mp = match &obj.0 {
        Ok(mp) => Arc::new(mp.clone()),
        Err(invalid) => {
            let error = Error::Malformed {
                kind: "MaintPage",
                message: invalid.error.clone(),
            };
            warn!(object = %key(&obj), %error, "skipping a MaintPage that cannot be read");
            let reference = ObjectReference {
                api_version: Some(MaintPage::api_version(&()).into()),
                kind: Some("MaintPage".into()),
                name: invalid.metadata.name.clone(),
                namespace: invalid.metadata.namespace.clone(),
                uid: invalid.metadata.uid.clone(),
                ..Default::default()
            };
            ctx.events.warning(&reference, error.reason(), error.to_string()).await;
            ctx.metrics.failed(CONTROLLER, error.reason(), started.elapsed());
            return Ok(Action::await_change());
        }
    };
    let result = reconcile::reconcile(mp, &ctx).await;
    match &result {
        Ok(_) => {
            ctx.metrics.succeeded(CONTROLLER, started.elapsed());
            ctx.backoff.succeeded(&key(&obj));
        }
        Err(e) => ctx.metrics.failed(CONTROLLER, e.reason(), started.elapsed()),
    }
    result
}

/// Requeues a failed object after a back-off that grows with its consecutive failures.
fn error_policy(obj: Arc<DeserializeGuard<MaintPage>>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.failed(&key(&obj));
    warn!(object = %key(&obj), reason = error.reason(), %error, retry_in = ?delay, "reconcile failed");
    if error.is_transient()
        && let Ok(mp) = &obj.0
    {
        let reference = mp.object_ref(&());
        let events = ctx.events.clone();
        let (reason, note) = (error.reason(), format!("{error}; retrying in {}s", delay.as_secs()));
        tokio::spawn(async move { events.warning(&reference, reason, note).await });
    }
    Action::requeue(delay)
}

/// Runs the controller for `namespace` (all namespaces if `None`) until `shutdown` completes.
pub async fn run(
    client: Client,
    namespace: Option<String>,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let (maintpages, deployments, services) = match &namespace {
        Some(ns) => (
            Api::<DeserializeGuard<MaintPage>>::namespaced(client.clone(), ns),
            Api::<Deployment>::namespaced(client.clone(), ns),
            Api::<Service>::namespaced(client.clone(), ns),
        ),
        None => (
            Api::all(client.clone()),
            Api::all(client.clone()),
            Api::all(client.clone()),
        ),
    };
    let ours = watcher::Config::default().labels(&format!("{}={}", desired::MANAGED_BY_LABEL, desired::MANAGED_BY));
    let (deployment_store, deployment_changes) = shared_cache(deployments, ours.clone()).await;
    let (service_store, service_changes) = shared_cache(services, ours).await;
    let (Some(deployment_changes), Some(service_changes)) = (deployment_changes, service_changes) else {
        warn!("shared caches without subscribers: the controller cannot watch its children");
        return;
    };
    let ctx = Arc::new(Context {
        events: Events::new(client.clone(), "noops-maintpage"),
        client,
        metrics,
        backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(300)),
        deployments: deployment_store,
        services: service_store,
    });
    Controller::new(maintpages, watcher::Config::default().any_semantic())
        // Reconciles mostly wait on the API server; a bound keeps a burst of thousands of
        // objects from queueing all at once there and in memory.
        .with_config(kube::runtime::controller::Config::default().concurrency(MAX_CONCURRENT_RECONCILES))
        // A child change wakes its MaintPage only after the cache holds it.
        .owns_shared_stream(deployment_changes)
        .owns_shared_stream(service_changes)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => {
                    debug!(object = %format!("{}/{}", object.namespace.unwrap_or_default(), object.name), "reconciled")
                }
                Err(e) => debug!(error = %e, "controller event"),
            }
        })
        .await;
}
