//! What every backup controller (EtcdBackup, PostgresBackup) is made of: its context, its
//! engine (a [`BackupEngine`], run by the core as [`Backups`]), the finalizer that deletes a backup's files with it, and the end of a pass, which
//! writes what a [`Verdict`](super::progress::Verdict) left, sends its Event and removes the
//! task pod of a backup that is done. An engine writes only how a backup is taken and deleted.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DeleteParams, Preconditions};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use noops_api::backup::BackupReason;
use noops_api::backup::{BackupProgress, WorkProgress};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::info;

use super::progress::{self, Timing, Verdict};
use super::schedule::elapsed;
use super::task_pod;
use crate::core::Result;
use crate::core::apply::delete_if_present;
use crate::core::conditions::merge;
use crate::core::controller::{Runtime, Watched};
use crate::core::engine::{Engine, Reconcile, Wiring};
use crate::core::labels;

/// What a backup controller keeps beside the core; `S` is the kind it backs up (EtcdCluster,
/// PostgreSQL). A pass reads from these caches; it reads the API only to confirm
/// (`crate::core::confirm`) before it makes a pod or deletes files.
pub struct BackupState<S: Watched> {
    /// The operator's own image, which task pods run (or copy a program from).
    pub image: String,
    /// Where the services' images are pulled from (task pods run the service's programs).
    pub images: crate::core::images::Images,
    /// Its task pods, from the watch that wakes their backups.
    pub pods: Store<Pod>,
    /// The resources it backs up, from a watch.
    pub sources: Store<DeserializeGuard<S>>,
    /// Their pods and Secrets (those with the engine's [`BackupEngine::SOURCE_LABEL`]: the
    /// members or instances a backup is taken from, and the credentials to reach them).
    pub source_pods: Store<Pod>,
    pub source_secrets: Store<Secret>,
}

impl<S: Watched> BackupState<S> {
    /// Task pod `name` in `namespace`, as the cache holds it.
    pub fn task_pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods.get(&ObjectRef::new(name).within(namespace))
    }

    /// The resource `name` in `namespace` that backups are taken of, if the cache holds it
    /// (and it could be read).
    pub fn source(&self, namespace: &str, name: &str) -> Option<S> {
        let guard = self.sources.get(&ObjectRef::new(name).within(namespace))?;
        guard.0.as_ref().ok().cloned()
    }

    /// A pod of the resources backed up.
    pub fn source_pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.source_pods.get(&ObjectRef::new(name).within(namespace))
    }
}

/// What every pass of a backup controller of `S` shares.
pub type Context<S> = crate::core::controller::Context<BackupState<S>>;

impl<S: Watched> Context<S> {
    /// Secret `name` in `namespace`: the cache holds those of the resources backed up; a
    /// user's own (a certificate the spec names) is read.
    pub async fn secret(&self, namespace: &str, name: &str) -> kube::Result<Option<Arc<Secret>>> {
        if let Some(secret) = self.source_secrets.get(&ObjectRef::new(name).within(namespace)) {
            return Ok(Some(secret));
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        Ok(crate::core::confirm::get(&api, name, "secret-content")
            .await?
            .map(Arc::new))
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
    /// The finalizer that deletes a backup's files with it.
    const FINALIZER: &'static str;
    /// Its status, if it has one yet.
    fn status(&self) -> Option<&Self::Status>;
    /// Its `spec.paused`: the operator changes nothing of it.
    fn paused(&self) -> bool;
    /// The progress part of a status.
    fn progress(status: &Self::Status) -> &BackupProgress;
    fn progress_mut(status: &mut Self::Status) -> &mut BackupProgress;
}

/// Implements [`BackupResource`] for backup type `$kind`, whose status `$status` keeps its
/// progress in a `progress` field, with finalizer `$finalizer`.
macro_rules! backup_resource {
    ($kind:ty, $status:ty, $finalizer:expr) => {
        impl $crate::core::backup::controller::BackupResource for $kind {
            type Status = $status;
            const FINALIZER: &'static str = $finalizer;

            fn status(&self) -> Option<&$status> {
                self.status.as_ref()
            }

            fn paused(&self) -> bool {
                self.spec.paused
            }

            fn progress(status: &$status) -> &noops_api::backup::BackupProgress {
                &status.progress
            }

            fn progress_mut(status: &mut $status) -> &mut noops_api::backup::BackupProgress {
                &mut status.progress
            }
        }
    };
}
pub(crate) use backup_resource;

/// A backup controller's engine: its name, its task pods, and its two passes. The core runs
/// it as the [`Engine`] [`Backups<B>`]; its registration is `registration::<Backups<B>>()`.
pub trait BackupEngine: Send + Sync + 'static {
    /// The backups it makes.
    type Backup: BackupResource;
    /// The kind it backs up.
    type Source: Watched;
    /// Its registration's name, what it manages and its concurrency (see [`Engine`]).
    const NAME: &'static str;
    const ABOUT: &'static str;
    const CONCURRENCY: u16;
    /// The component label of its task pods: a change of one wakes its backup.
    const COMPONENT: &'static str;
    /// The label (a key) of the children of the kind it backs up: its caches hold their pods
    /// and Secrets.
    const SOURCE_LABEL: &'static str;
    /// The job of the task pod that makes a backup (`save`, `base`): it goes once the backup
    /// is done.
    const MAKER_JOB: &'static str;

    /// A pass over a backup not done yet ([`begin`] read it).
    fn make(begun: Begun<Self::Backup>, ctx: Arc<Context<Self::Source>>)
    -> impl Future<Output = Result<Action>> + Send;

    /// A pass over a backup being deleted: its files go (its finalizer goes when this succeeds).
    fn clean_up(
        backup: Arc<Self::Backup>,
        ctx: Arc<Context<Self::Source>>,
    ) -> impl Future<Output = Result<Action>> + Send;
}

/// The controller of backup engine `B`: each backup, and its task pods waking it when they
/// change; a backup's files go with it (its finalizer).
pub struct Backups<B>(PhantomData<B>);

impl<B: BackupEngine> Engine for Backups<B> {
    type Object = B::Backup;
    type State = BackupState<B::Source>;
    const NAME: &'static str = B::NAME;
    const ABOUT: &'static str = B::ABOUT;
    const CONCURRENCY: u16 = B::CONCURRENCY;

    async fn wire(runtime: &Runtime) -> Wiring<Self> {
        let (pods, pod_changes) = runtime
            .cache::<Pod>(watcher::Config::default().labels(&format!("{}={}", labels::COMPONENT, B::COMPONENT)))
            .await;
        let (sources, _) = runtime
            .cache::<DeserializeGuard<B::Source>>(watcher::Config::default())
            .await;
        let children = watcher::Config::default().labels(B::SOURCE_LABEL);
        let (source_pods, _) = runtime.cache::<Pod>(children.clone()).await;
        let (source_secrets, _) = runtime.cache::<Secret>(children).await;
        let state = BackupState {
            image: runtime.image.clone(),
            images: runtime.images.clone(),
            pods,
            sources,
            source_pods,
            source_secrets,
        };
        // A task pod's change wakes its backup once the cache holds it.
        let controller = runtime
            .controller::<B::Backup>(Self::CONCURRENCY)
            .owns_shared_stream(pod_changes);
        Wiring::new(state, controller)
    }
}

impl<B: BackupEngine> Reconcile for Backups<B> {
    async fn reconcile(backup: Arc<B::Backup>, ctx: Arc<Context<B::Source>>) -> Result<Action> {
        let api: Api<B::Backup> = Api::namespaced(ctx.client.clone(), &backup.namespace().unwrap_or_default());
        let result = finalizer(&api, B::Backup::FINALIZER, backup, |event| async {
            match event {
                Finalizer::Apply(backup) if backup.paused() => hold(&ctx, &*backup).await,
                Finalizer::Cleanup(backup) if backup.paused() => {
                    hold(&ctx, &*backup).await?;
                    Err(crate::core::Error::Held(
                        "paused: the backup's files are deleted, and it goes, once spec.paused is false".into(),
                    ))
                }
                Finalizer::Apply(backup) => {
                    let pod = |b: &B::Backup| task_pod::name(&b.name_any(), &b.uid().unwrap_or_default(), B::MAKER_JOB);
                    match begin(&ctx, &*backup, pod).await? {
                        Ok(begun) => B::make(begun, ctx.clone()).await,
                        Err(action) => Ok(action),
                    }
                }
                Finalizer::Cleanup(backup) => {
                    // (Resumed while being deleted: said first, and its deadline counts from now.)
                    report_pause(&ctx, &*backup, false).await?;
                    B::clean_up(backup, ctx.clone()).await
                }
            }
        })
        .await;
        crate::core::error::from_finalizer(result)
    }
}

/// A paused backup: nothing of it is changed (not begun, its task pod neither read nor
/// stopped, its files kept); its status says Paused.
async fn hold<K: BackupResource, S: Watched>(ctx: &Context<S>, backup: &K) -> Result<Action> {
    report_pause(ctx, backup, true).await?;
    info!("paused: the backup is left as it is until spec.paused is false");
    Ok(Action::await_change())
}

/// Writes the `Paused` condition of `backup` as `paused`, if it changes (with the `Paused` or
/// `Resumed` Event). A pass that goes on to [`conclude`] needs none: it writes it there.
async fn report_pause<K: BackupResource, S: Watched>(ctx: &Context<S>, backup: &K, paused: bool) -> Result<()> {
    let previous = backup.status().cloned().unwrap_or_default();
    let mut status = previous.clone();
    with_pause_condition(K::progress_mut(&mut status), paused);
    // A backup never paused has no Paused condition, so the core sees no news in the first
    // one: told here.
    let was = crate::core::conditions::is_true(&K::progress(&previous).conditions, noops_api::condition::PAUSED);
    let told = (paused && !was).then(|| {
        crate::core::events::Announcement::normal(
            "Paused",
            crate::core::conditions::paused::<BackupReason>(true).message,
        )
    });
    let mut version = backup.resource_version();
    ctx.report_at(backup, Some(&previous), &mut version, &status, told)
        .await?;
    Ok(())
}

/// Sets the `Paused` condition of `progress` (once a backup was paused; one never paused has
/// none, so no status of a backup changes for it).
fn with_pause_condition(progress: &mut BackupProgress, paused: bool) {
    let was_paused = progress
        .conditions
        .iter()
        .any(|c| c.type_ == noops_api::condition::PAUSED);
    if paused || was_paused {
        progress.conditions = merge(
            &progress.conditions,
            &[crate::core::conditions::paused::<BackupReason>(paused)],
            None,
            jiff::Timestamp::now(),
        );
    }
}

/// A backup still to be made, as this controller last wrote it.
pub struct Begun<K: BackupResource> {
    pub backup: K,
    /// The version read: every status write of the pass is made over it.
    pub version: Option<String>,
    pub status: K::Status,
    /// When the backup began (now, for one not begun yet; its resume, if it was paused
    /// since: its deadlines count from here), and the time of this pass.
    pub started: jiff::Timestamp,
    pub now: jiff::Timestamp,
    /// The task pod that makes it: it goes once the backup is done.
    pub pod: String,
}

/// The start of a pass over `backup` from the cache (the core passes over no version a pass
/// has written over, so the work is decided on this controller's last word; every status
/// write is made over the version read, so nobody else's newer word is written over), or what
/// to do instead: for a backup done (Succeeded or Failed, never taken again) only its task
/// pod `pod` removed, left by an operator stopped between the last status write and removing
/// it.
async fn begin<K: BackupResource, S: Watched>(
    ctx: &Context<S>,
    backup: &K,
    pod: impl Fn(&K) -> String,
) -> Result<std::result::Result<Begun<K>, Action>> {
    let backup = backup.clone();
    let status = backup.status().cloned().unwrap_or_default();
    let progress = K::progress(&status);
    if progress.is_done() {
        // (Resumed after it was done: no pass concludes it again, so it is said here.)
        report_pause(ctx, &backup, false).await?;
        return Ok(Err(remove_pod(ctx, &backup, &pod(&backup)).await?));
    }
    let now = jiff::Timestamp::now();
    // Its deadlines count from its start, or from its resume if it was paused since.
    let started = progress.started_at.as_ref().map_or(now, |t| t.0);
    let started = resumed_at(progress, now).map_or(started, |resumed| resumed.max(started));
    Ok(Ok(Begun {
        pod: pod(&backup),
        version: backup.resource_version(),
        backup,
        status,
        started,
        now,
    }))
}

/// Writes `status` over `version` of `backup` (see [`apply_status_at`]): false if the backup
/// changed since.
pub async fn write_status<K: BackupResource, S: Watched>(
    ctx: &Context<S>,
    backup: &K,
    version: &mut Option<String>,
    status: &K::Status,
) -> Result<bool> {
    Ok(ctx.write_status_at(backup, version, status).await?)
}

/// Deletes task pod `name` of `backup`, if the cache holds one (at once if it was deleted
/// already and its node never confirmed it: a dead node). Returns what to do next: look again
/// while the pod lingers, to force it out once its grace has passed.
pub async fn remove_pod<K: BackupResource, S: Watched>(ctx: &Context<S>, backup: &K, name: &str) -> Result<Action> {
    let namespace = backup.namespace().unwrap_or_default();
    let Some(pod) = ctx.task_pod(&namespace, name) else {
        return Ok(Action::await_change());
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    // Only the pod the cache holds: a new one of its name is never deleted on a stale word.
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..task_pod::delete_params(Some(&pod), jiff::Timestamp::now())
    };
    let forced = params.grace_period_seconds == Some(0);
    match delete_if_present(&pods, name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => return Ok(Action::requeue(Duration::from_secs(1))),
        Err(e) => return Err(e.into()),
    }
    Ok(if forced || pod.metadata.deletion_timestamp.is_none() {
        Action::await_change()
    } else {
        Action::requeue(task_pod::ABANDONED_AFTER)
    })
}

/// The end of a pass over `begun`, whose status is as written so far: what `verdict` leaves
/// (a success recorded in the status by `record`, which says what was stored) is written if
/// it changed, its Event sent, and the task pod removed once the backup is done.
pub async fn conclude<K: BackupResource, S: Watched, T>(
    ctx: &Context<S>,
    begun: Begun<K>,
    verdict: Verdict<T>,
    record: impl FnOnce(&mut K::Status, T) -> String,
    under_way: Option<WorkProgress>,
    timing: Timing,
) -> Result<Action> {
    let Begun {
        backup,
        mut version,
        status,
        started,
        now,
        pod,
    } = begun;
    let mut next = status.clone();
    with_pause_condition(K::progress_mut(&mut next), false);
    let verdict = verdict.map_succeeded(|taken| record(&mut next, taken));
    let settled = progress::settle(K::progress(&next), verdict, started, now, timing);
    let running = settled.look_again.is_some();
    *K::progress_mut(&mut next) = settled.progress;
    // How far it has got, while it runs; nothing once it is done.
    K::progress_mut(&mut next).under_way = under_way.filter(|_| running);
    // (With the Event it earned, and `Resumed` when it was paused.)
    if !ctx
        .report_at(&backup, Some(&status), &mut version, &next, settled.announcement)
        .await?
    {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    if next != status {
        // A backup done says so in its Event; one still running says why in the log.
        let succeeded = K::progress(&next)
            .conditions
            .iter()
            .find(|c| c.type_ == progress::SUCCEEDED);
        if running && let Some(condition) = succeeded {
            info!(reason = %condition.reason, "the backup is not stored yet: {}", condition.message);
        }
    }
    match settled.look_again {
        Some(after) => Ok(Action::requeue(after)),
        None => remove_pod(ctx, &backup, &pod).await,
    }
}

/// How long `backup` has been being deleted, not counting a pause: from its resume, if it was
/// paused meanwhile (a deletion resumed is given its whole deadline).
pub fn deleting_for<K: BackupResource>(backup: &K, now: jiff::Timestamp) -> Duration {
    let Some(deleted) = backup.meta().deletion_timestamp.as_ref() else {
        return Duration::ZERO;
    };
    let resumed = backup.status().and_then(|s| resumed_at(K::progress(s), now));
    elapsed(resumed.map_or(deleted.0, |r| r.max(deleted.0)), now)
}

/// When the backup of `progress` was last resumed, if it was ever paused: now for the pass
/// that resumes it (its status still says Paused), else when its `Paused` condition turned
/// False. The deadlines of its work count from there: time paused is not time spent. Pure.
pub fn resumed_at(progress: &BackupProgress, now: jiff::Timestamp) -> Option<jiff::Timestamp> {
    let paused = progress
        .conditions
        .iter()
        .find(|c| c.type_ == noops_api::condition::PAUSED)?;
    Some(if paused.status == "True" {
        now
    } else {
        paused.last_transition_time.0
    })
}

/// What came of deleting a deleted backup's files: what the deletion said, or why they are not
/// deleted and whether trying again may help.
pub type Deletion = std::result::Result<String, (String, bool)>;

/// The end of a clean-up: files `what` (such as "the snapshot at s3://…") deleted, or not yet
/// (the finalizer stays and it is tried again until `deadline` after the deletion began), or
/// given up (a Warning Event `kept_reason`; the backup goes and leaves its files). The task
/// pod `pod` goes either way.
#[allow(clippy::too_many_arguments)]
pub async fn finish_clean_up<K: BackupResource, S: Watched>(
    ctx: &Context<S>,
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
    remove_pod(ctx, backup, pod).await?;
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(seconds: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000 + seconds).unwrap_or_default()
    }

    fn paused(status: &str, since: i64) -> BackupProgress {
        let mut conditions = merge(
            &[],
            &[crate::core::conditions::paused::<BackupReason>(status == "True")],
            None,
            at(since),
        );
        conditions[0].last_transition_time = Time(at(since));
        BackupProgress {
            conditions,
            ..Default::default()
        }
    }

    #[test]
    fn time_paused_is_not_counted_against_a_backups_deadlines() {
        // Never paused: the clocks run from the start (or the deletion) as they always did.
        assert_eq!(resumed_at(&BackupProgress::default(), at(100)), None);
        // Paused now, the pass that resumes it starts the clocks afresh.
        assert_eq!(resumed_at(&paused("True", 10), at(100)), Some(at(100)));
        // Resumed at 50: from there.
        assert_eq!(resumed_at(&paused("False", 50), at(100)), Some(at(50)));
    }
}
