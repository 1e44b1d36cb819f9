//! What every backup controller (EtcdBackup, PostgresBackup) is made of: its context, how it
//! runs, the finalizer that deletes a backup's files with it, and the end of a pass, which
//! writes what a [`Verdict`](super::progress::Verdict) left, sends its Event and removes the
//! task pod of a backup that is done. An engine writes only how a backup is taken and deleted.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Pod;
use kube::core::DeserializeGuard;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use noops_api::backup::BackupProgress;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::info;

use super::progress::Settled;
use super::schedule::elapsed;
use super::task_pod;
use crate::core::Result;
use crate::core::apply::{apply_status_at, delete_if_present};
use crate::core::controller::{ControllerCore, HasCore, Runtime, drive, scoped_api};
use crate::core::labels;

/// At most this many backups are looked at once.
const MAX_CONCURRENT_RECONCILES: u16 = 2;

/// What every pass of a backup controller shares.
pub struct Context {
    pub core: ControllerCore,
    pub client: Client,
    /// The operator's own image, which task pods run (or copy a program from).
    pub image: String,
}

impl HasCore for Context {
    fn core(&self) -> &ControllerCore {
        &self.core
    }
}

/// A backup resource, as the kit sees it: an object whose status has a [`BackupProgress`].
pub trait BackupResource:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + std::fmt::Debug
    + DeserializeOwned
    + Serialize
    + Send
    + Sync
    + 'static
{
    type Status: Clone + Default + PartialEq + Serialize + std::fmt::Debug + Send + Sync;
    /// The progress part of a status.
    fn progress_mut(status: &mut Self::Status) -> &mut BackupProgress;
}

/// Runs the controller of backups `K` named `name` until shutdown: each backup, and its task
/// pods (labelled with `component`) waking it when they change.
pub async fn run<K, R, Fut>(runtime: Runtime, name: &'static str, component: &str, reconcile: R)
where
    K: BackupResource,
    R: Fn(Arc<K>, Arc<Context>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Action>> + Send + 'static,
{
    let Runtime {
        client,
        namespace,
        metrics,
        shutdown,
        image,
        ..
    } = runtime;
    let ctx = Arc::new(Context {
        core: ControllerCore::new(name, client.clone(), metrics),
        client: client.clone(),
        image,
    });
    let controller = Controller::new(
        scoped_api::<DeserializeGuard<K>>(&client, &namespace),
        watcher::Config::default().any_semantic(),
    )
    .owns(
        scoped_api::<Pod>(&client, &namespace),
        watcher::Config::default().labels(&format!("{}={component}", labels::COMPONENT)),
    )
    .with_config(kube::runtime::controller::Config::default().concurrency(MAX_CONCURRENT_RECONCILES))
    .graceful_shutdown_on(shutdown.fired());
    drive(controller, ctx, reconcile).await;
}

/// One pass under `finalizer_name`: `make` while the backup lives, `clean_up` once it is being
/// deleted (the finalizer goes when it succeeds).
pub async fn with_finalizer<K, M, MF, C, CF>(
    backup: Arc<K>,
    client: &Client,
    finalizer_name: &str,
    make: M,
    clean_up: C,
) -> Result<Action>
where
    K: BackupResource,
    M: FnOnce(Arc<K>) -> MF,
    MF: Future<Output = Result<Action>>,
    C: FnOnce(Arc<K>) -> CF,
    CF: Future<Output = Result<Action>>,
{
    let api: Api<K> = Api::namespaced(client.clone(), &backup.namespace().unwrap_or_default());
    let result = finalizer(&api, finalizer_name, backup, |event| async {
        match event {
            Finalizer::Apply(backup) => make(backup).await,
            Finalizer::Cleanup(backup) => clean_up(backup).await,
        }
    })
    .await;
    crate::core::error::from_finalizer(result)
}

/// The backup as the API has it now: the watch cache may not have seen the last status yet,
/// and the work is decided on the latest word (every status write is made over its version).
pub async fn latest<K: BackupResource>(client: &Client, cached: &K) -> Result<Option<K>> {
    let api: Api<K> = Api::namespaced(client.clone(), &cached.namespace().unwrap_or_default());
    Ok(api.get_opt(&cached.name_any()).await?)
}

/// Writes `status` over `version` of `backup` (see [`apply_status_at`]): false if the backup
/// changed since.
pub async fn write_status<K: BackupResource>(
    client: &Client,
    backup: &K,
    version: &mut Option<String>,
    status: &K::Status,
) -> Result<bool> {
    let api: Api<K> = Api::namespaced(client.clone(), &backup.namespace().unwrap_or_default());
    Ok(apply_status_at(&api, &backup.name_any(), version, status).await?)
}

/// Deletes task pod `name` of `backup`, if there is one (at once if it was deleted already and
/// its node never confirmed it: a dead node). Returns what to do next: look again while the
/// pod lingers, to force it out once its grace has passed.
pub async fn remove_pod<K: BackupResource>(client: &Client, backup: &K, name: &str) -> Result<Action> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &backup.namespace().unwrap_or_default());
    let Some(pod) = pods.get_opt(name).await? else {
        return Ok(Action::await_change());
    };
    let params = task_pod::delete_params(Some(&pod), jiff::Timestamp::now());
    let forced = params.grace_period_seconds == Some(0);
    delete_if_present(&pods, name, &params).await?;
    Ok(if forced || pod.metadata.deletion_timestamp.is_none() {
        Action::await_change()
    } else {
        Action::requeue(task_pod::ABANDONED_AFTER)
    })
}

/// The end of a pass: `next` (the engine's fields of the status, over `read`) with the
/// progress `settled` left is written if it changed, its Event sent, and the task pod `pod`
/// removed once the backup is done.
pub async fn conclude<K: BackupResource>(
    ctx: &Context,
    backup: &K,
    version: &mut Option<String>,
    read: &K::Status,
    mut next: K::Status,
    settled: Settled,
    pod: &str,
) -> Result<Action> {
    let waits = settled.look_again.is_some() && settled.progress.phase.as_deref() == Some("Running");
    *K::progress_mut(&mut next) = settled.progress;
    if next != *read {
        if !write_status(&ctx.client, backup, version, &next).await? {
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        if waits && let Some(condition) = K::progress_mut(&mut next).conditions.first() {
            info!(reason = %condition.reason, "the backup waits: {}", condition.message);
        }
    }
    if let Some(announcement) = settled.announcement {
        ctx.core.events.tell(&backup.object_ref(&()), announcement).await;
    }
    match settled.look_again {
        Some(after) => Ok(Action::requeue(after)),
        None => remove_pod(&ctx.client, backup, pod).await,
    }
}

/// How long `backup` has been being deleted.
pub fn deleting_for<K: Resource>(backup: &K, now: jiff::Timestamp) -> Duration {
    backup
        .meta()
        .deletion_timestamp
        .as_ref()
        .map_or(Duration::ZERO, |t| elapsed(t.0, now))
}

/// What came of deleting a deleted backup's files: what the deletion said, or why they are not
/// deleted and whether trying again may help.
pub type Deletion = std::result::Result<String, (String, bool)>;

/// The end of a clean-up: files `what` (such as "the snapshot at s3://…") deleted, or not yet
/// (the finalizer stays and it is tried again until `deadline` after the deletion began), or
/// given up (a Warning Event `kept_reason`; the backup goes and leaves its files). The task
/// pod `pod` goes either way.
#[allow(clippy::too_many_arguments)]
pub async fn finish_clean_up<K: BackupResource>(
    ctx: &Context,
    backup: &K,
    deleted: Deletion,
    deadline: Duration,
    what: &str,
    kept_reason: &str,
    pod: &str,
) -> Result<Action> {
    let deleting_for = deleting_for(backup, jiff::Timestamp::now());
    match deleted {
        Ok(said) => info!("deleted {what} of a deleted backup: {said}"),
        Err((why, true)) if deleting_for < deadline => {
            return Err(crate::core::Error::Blocked(format!(
                "could not delete {what} yet: {why}"
            )));
        }
        Err((why, _)) => {
            let note = format!("could not delete {what}: {why}; it is left in the store");
            ctx.core
                .events
                .tell(
                    &backup.object_ref(&()),
                    crate::core::events::Announcement::warning(kept_reason, note),
                )
                .await;
        }
    }
    remove_pod(&ctx.client, backup, pod).await?;
    Ok(Action::await_change())
}
