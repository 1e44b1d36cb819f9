//! What every backup controller (EtcdBackup, PostgresBackup) is made of: its context, its
//! engine (a [`BackupEngine`], run by the core as [`Backups`] on the core's stages), the
//! finalizer that deletes a backup's files with it, and the status a pass reports, from what
//! a [`Verdict`](super::progress::Verdict) left. An engine writes only how it reads what it
//! backs up, and how a backup is taken and deleted.
//!
//! A pass: observe (the resource backed up, from the cache, confirmed before the backup waits
//! or fails on its absence) → plan (a backup done: its task pod goes; else its work, with its
//! deadlines' clock) → apply (the engine's look: where it goes recorded ahead of the work, its
//! task pod made or read) → status (pure: progress settled, its Event once written). A paused
//! backup is observed and reported, never made, and its deletion waits.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DeleteParams, Preconditions};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use noops_api::backup::BackupReason;
use noops_api::backup::{BackupProgress, WorkProgress};
use noops_api::governed::Governed;
use serde::Serialize;
use tracing::info;

use super::progress::{self, Timing, Verdict};
use super::schedule::elapsed;
use super::task_pod;
use crate::core::Result;
use crate::core::apply::delete_if_present;
use crate::core::conditions::{self, merge};
use crate::core::controller::{Runtime, Watched};
use crate::core::engine::{ControllerOf, Engine, Wiring};
use crate::core::labels;
use crate::core::stages::{Applied, Observed, Report, Stages};

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

/// A backup resource, as the kit sees it: a kind the core governs whose status has a
/// [`BackupProgress`].
pub trait BackupResource:
    Watched
    + Serialize
    + Governed<Status: Clone + Default + PartialEq + Serialize + std::fmt::Debug + Send + Sync, Reason = BackupReason>
{
    /// The finalizer that deletes a backup's files with it.
    const FINALIZER: &'static str;
    /// The progress part of a status.
    fn progress(status: &Self::Status) -> &BackupProgress;
    fn progress_mut(status: &mut Self::Status) -> &mut BackupProgress;
}

/// Implements [`BackupResource`] for backup type `$kind`, whose status `$status` keeps its
/// progress in a `progress` field, with finalizer `$finalizer`.
macro_rules! backup_resource {
    ($kind:ty, $status:ty, $finalizer:expr) => {
        impl $crate::core::backup::controller::BackupResource for $kind {
            const FINALIZER: &'static str = $finalizer;

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

/// The status of backup kind `K`.
pub type StatusOf<K> = <K as Governed>::Status;

/// A backup controller's engine: its name, its task pods, how it reads what it backs up, and
/// how it makes and deletes a backup. The core runs it as the [`Engine`] [`Backups<B>`],
/// stage by stage; its registration is `registration::<Backups<B>>()`.
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
    /// How long a backup waits, and how soon it is looked at again.
    const TIMING: Timing;

    /// What a pass over a backup being made observes: the resource it is taken of (see
    /// [`source_of`]).
    fn observe(
        backup: &Self::Backup,
        ctx: &Context<Self::Source>,
    ) -> impl Future<Output = Result<Option<Self::Source>>> + Send;

    /// One look at a backup not done yet: its work begun or followed, and what came of it
    /// ([`Begun::made`]); `None` if the backup changed since it was read (a record written
    /// ahead of the work, [`Begun::record_ahead`], found it changed).
    fn make(
        backup: &Self::Backup,
        source: Option<&Self::Source>,
        begun: Begun<Self::Backup>,
        ctx: &Context<Self::Source>,
    ) -> impl Future<Output = Result<Option<Made<Self::Backup>>>> + Send;

    /// A pass over a backup being deleted: its files go (its finalizer goes when this succeeds).
    fn clean_up(backup: Arc<Self::Backup>, ctx: &Context<Self::Source>) -> impl Future<Output = Result<Action>> + Send;
}

/// The resource `name` a backup in `namespace` is taken of, from the cache; confirmed with
/// the API server when the cache holds none, or one that is not `enough` (one that says
/// nowhere to put the backup): a backup waits or fails on that word, and the cache may be a
/// moment behind a resource applied (or given a destination) together with its backup. One
/// that cannot be read is an error, not missing.
pub async fn source_of<S: Watched>(
    ctx: &Context<S>,
    namespace: &str,
    name: &str,
    enough: impl Fn(&S) -> bool,
) -> Result<Option<S>> {
    if let Some(source) = ctx.source(namespace, name).filter(&enough) {
        return Ok(Some(source));
    }
    let api: Api<S> = Api::namespaced(ctx.client.clone(), namespace);
    Ok(crate::core::confirm::get(&api, name, "source-before-failing").await?)
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

    async fn wire(runtime: &Runtime, controller: ControllerOf<B::Backup>) -> Wiring<Self> {
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
        let controller = controller.owns_shared_stream(pod_changes);
        Wiring::new(state, controller)
    }
}

/// What a pass over a backup does.
pub enum BackupPlan {
    /// A backup done (Succeeded or Failed, never taken again): only its task pod goes, left by
    /// an operator stopped between the status that said so and removing it (or not removed
    /// yet: the pass that wrote that status leaves it to the next).
    RemovePod { pod: String },
    /// A backup not done: its work begun or followed. Its deadlines count from `started` (its
    /// start, or its resume if it was paused since); `now` is the pass's time.
    Make {
        started: jiff::Timestamp,
        now: jiff::Timestamp,
        pod: String,
    },
}

/// What applying a [`BackupPlan`] did.
pub enum BackupApplied<K: BackupResource> {
    /// The task pod removed; looked at again after a while if it lingers.
    Removed {
        look_again: Option<Duration>,
    },
    Made(Made<K>),
}

impl<B: BackupEngine> Stages for Backups<B> {
    type Observation = Option<B::Source>;
    type Plan = BackupPlan;
    type Applied = BackupApplied<B::Backup>;

    // Its status records where its files go and what was stored.
    const GUARDED: bool = true;
    const FINALIZER: Option<&'static str> = Some(<B::Backup as BackupResource>::FINALIZER);

    async fn observe(
        backup: Arc<B::Backup>,
        ctx: &Context<B::Source>,
        _now: jiff::Timestamp,
    ) -> Result<Observed<B::Backup, Option<B::Source>>> {
        let done = backup.status().is_some_and(|s| B::Backup::progress(s).is_done());
        // A paused backup is not looked at further; one done needs nothing but its pod gone.
        let source = if done || backup.paused() {
            None
        } else {
            B::observe(&backup, ctx).await?
        };
        Ok(Observed::new(backup, source))
    }

    fn plan(backup: &B::Backup, _seen: &Option<B::Source>, now: jiff::Timestamp) -> Result<BackupPlan> {
        let pod = task_pod::name(&backup.name_any(), &backup.uid().unwrap_or_default(), B::MAKER_JOB);
        let Some(progress) = backup.status().map(B::Backup::progress) else {
            return Ok(BackupPlan::Make { started: now, now, pod });
        };
        if progress.is_done() {
            return Ok(BackupPlan::RemovePod { pod });
        }
        // Its deadlines count from its start, or from its resume if it was paused since.
        let started = progress.started_at.as_ref().map_or(now, |t| t.0);
        let started = resumed_at(progress, now).map_or(started, |resumed| resumed.max(started));
        Ok(BackupPlan::Make { started, now, pod })
    }

    async fn apply(
        backup: &B::Backup,
        source: &Option<B::Source>,
        plan: &BackupPlan,
        ctx: &Context<B::Source>,
    ) -> Result<Applied<BackupApplied<B::Backup>>> {
        Ok(match plan {
            BackupPlan::RemovePod { pod } => Applied::Done(BackupApplied::Removed {
                look_again: remove_pod(ctx, backup, pod).await?,
            }),
            BackupPlan::Make { started, now, pod } => {
                let begun = Begun {
                    status: backup.status().cloned().unwrap_or_default(),
                    version: backup.resource_version(),
                    written_ahead: false,
                    started: *started,
                    now: *now,
                    pod: pod.clone(),
                };
                match B::make(backup, source.as_ref(), begun, ctx).await? {
                    Some(made) => Applied::Done(BackupApplied::Made(made)),
                    None => Applied::Again {
                        after: Duration::from_secs(1),
                        why: "the backup changed since it was read",
                    },
                }
            }
        })
    }

    fn written_ahead(applied: &BackupApplied<B::Backup>) -> Option<String> {
        match applied {
            BackupApplied::Made(made) => made.written_ahead.clone(),
            BackupApplied::Removed { .. } => None,
        }
    }

    fn status(
        backup: &B::Backup,
        _seen: &Option<B::Source>,
        plan: &BackupPlan,
        applied: Option<&BackupApplied<B::Backup>>,
        now: jiff::Timestamp,
    ) -> Report<StatusOf<B::Backup>> {
        let previous = backup.status().cloned().unwrap_or_default();
        match (plan, applied) {
            (BackupPlan::Make { started, .. }, Some(BackupApplied::Made(made))) => {
                let mut next = made.status.clone();
                with_pause_condition(backup, B::Backup::progress_mut(&mut next), false, now);
                let settled = progress::settle(
                    B::Backup::progress(&next),
                    made.verdict.clone(),
                    *started,
                    now,
                    B::TIMING,
                );
                let running = settled.look_again.is_some();
                *B::Backup::progress_mut(&mut next) = settled.progress;
                // How far it has got, while it runs; nothing once it is done.
                B::Backup::progress_mut(&mut next).under_way = made.under_way.clone().filter(|_| running);
                // A backup done is looked at again when its status is written: its pod goes then.
                Report {
                    status: next,
                    done: Vec::new(),
                    news: settled.announcement.into_iter().collect(),
                    next: settled.look_again,
                }
            }
            (_, Some(BackupApplied::Removed { look_again })) => {
                let mut next = previous;
                with_pause_condition(backup, B::Backup::progress_mut(&mut next), false, now);
                Report {
                    next: *look_again,
                    ..Report::of(next)
                }
            }
            // Paused: nothing of it changes but its `Paused` condition (the core tells the turn).
            _ => {
                let mut next = previous;
                with_pause_condition(backup, B::Backup::progress_mut(&mut next), true, now);
                Report::of(next)
            }
        }
    }

    async fn settled(
        backup: &B::Backup,
        _seen: &Option<B::Source>,
        _plan: &BackupPlan,
        _applied: Option<&BackupApplied<B::Backup>>,
        status: &StatusOf<B::Backup>,
        _ctx: &Context<B::Source>,
    ) {
        // A backup done says so in its Event; one still running says why in the log, when
        // that changes.
        let progress = B::Backup::progress(status);
        if backup.status() != Some(status)
            && !progress.is_done()
            && let Some(condition) = progress.conditions.iter().find(|c| c.type_ == progress::SUCCEEDED)
        {
            info!(reason = %condition.reason, "the backup is not stored yet: {}", condition.message);
        }
    }

    async fn clean_up(backup: Arc<B::Backup>, ctx: &Context<B::Source>) -> Result<Action> {
        // Resumed while being deleted: said first, and its deadline counts from now.
        let previous = backup.status().cloned().unwrap_or_default();
        let mut status = previous.clone();
        with_pause_condition(
            &*backup,
            B::Backup::progress_mut(&mut status),
            false,
            jiff::Timestamp::now(),
        );
        let mut version = backup.resource_version();
        if !ctx
            .report_at(&*backup, Some(&previous), &mut version, &status, [])
            .await?
        {
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        B::clean_up(backup, ctx).await
    }
}

/// Sets the `Paused` condition of `backup`'s `progress` (every backup carries it, as every
/// kind does). One it did not have yet and that is not paused has not been since `backup` was
/// made: its deadlines, which count from the last resume, are not restarted by it.
fn with_pause_condition<K: BackupResource>(
    backup: &K,
    progress: &mut BackupProgress,
    paused: bool,
    now: jiff::Timestamp,
) {
    let new = !progress
        .conditions
        .iter()
        .any(|c| c.type_ == noops_api::condition::PAUSED);
    let created = backup.meta().creation_timestamp.as_ref().map(|t| t.0);
    let since = match created {
        Some(created) if new && !paused => created.min(now),
        _ => now,
    };
    progress.conditions = merge(
        &progress.conditions,
        &[conditions::paused::<BackupReason>(paused)],
        None,
        since,
    );
}

/// A backup not done yet, as a pass over it goes: its status as this controller last wrote
/// it (the core passes over no version a pass has written over, so the work is decided on
/// this controller's last word), with what the pass records.
pub struct Begun<K: BackupResource> {
    /// Its status, and what the pass records in it.
    pub status: K::Status,
    /// The version read, or the one a record written ahead left: every status write of the
    /// pass is made over it, so nobody else's newer word is written over.
    version: Option<String>,
    written_ahead: bool,
    /// When the backup began (now, for one not begun yet; its resume, if it was paused
    /// since: its deadlines count from here), and the time of this pass.
    pub started: jiff::Timestamp,
    pub now: jiff::Timestamp,
    /// The task pod that makes it: it goes once the backup is done.
    pub pod: String,
}

/// What a look at a backup not done yet came to: its status with what the pass recorded
/// (where it goes, what was stored), where it stands, and how far its work has got.
pub struct Made<K: BackupResource> {
    pub status: K::Status,
    pub verdict: Verdict<String>,
    pub under_way: Option<WorkProgress>,
    /// The version a record written ahead left (the pass's status is written over it).
    pub written_ahead: Option<String>,
}

impl<K: BackupResource> Begun<K> {
    /// Writes the status as recorded so far, before the work it records (where a backup goes,
    /// so that a deletion finds it whatever happens next), over the version read: false if
    /// the backup changed since.
    pub async fn record_ahead<S: Watched>(&mut self, ctx: &Context<S>, backup: &K) -> Result<bool> {
        let written = ctx.write_status_at(backup, &mut self.version, &self.status).await?;
        self.written_ahead |= written;
        Ok(written)
    }

    /// What the look came to: `verdict`, a success recorded in the status by `record` (which
    /// says what was stored), and how far the work has got.
    pub fn made<T>(
        mut self,
        verdict: Verdict<T>,
        record: impl FnOnce(&mut K::Status, T) -> String,
        under_way: Option<WorkProgress>,
    ) -> Made<K> {
        let verdict = verdict.map_succeeded(|taken| record(&mut self.status, taken));
        Made {
            status: self.status,
            verdict,
            under_way,
            written_ahead: self.version.filter(|_| self.written_ahead),
        }
    }
}

/// Deletes task pod `name` of `backup`, if the cache holds one (at once if it was deleted
/// already and its node never confirmed it: a dead node). Returns when to look again: while
/// the pod lingers, to force it out once its grace has passed.
pub async fn remove_pod<K: BackupResource, S: Watched>(
    ctx: &Context<S>,
    backup: &K,
    name: &str,
) -> Result<Option<Duration>> {
    let namespace = backup.namespace().unwrap_or_default();
    let Some(pod) = ctx.task_pod(&namespace, name) else {
        return Ok(None);
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
        Err(kube::Error::Api(e)) if e.code == 409 => return Ok(Some(Duration::from_secs(1))),
        Err(e) => return Err(e.into()),
    }
    Ok((!forced && pod.metadata.deletion_timestamp.is_some()).then_some(task_pod::ABANDONED_AFTER))
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

/// When the backup of `progress` was last resumed: now for the pass that resumes it (its status
/// still says Paused), else when its `Paused` condition turned False (its creation, if it was
/// never paused); `None` for a status written before backups carried the condition. The
/// deadlines of its work count from there, or from its start if later: time paused is not
/// time spent. Pure.
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
