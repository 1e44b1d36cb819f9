//! A pass as stages the core drives: an engine that implements [`Stages`] says how it
//! observes, validates, plans, applies and reports; [`drive`] calls each once, in that order,
//! and owns what is the same for every kind:
//! - a refused spec: the status the engine builds for it, written, and a Warning Event told
//!   once (when the status first gives the refusal's reason); the pass then fails (tried again
//!   after a growing back-off), or, for a refusal that may end without the object changing,
//!   looks again after a while;
//! - pause: a paused object is observed, planned and reported, never applied (but for a kind
//!   whose pause lets something beside it go on: its apply does that alone), and its deletion
//!   waits (for an engine whose objects carry a finalizer) until it is resumed;
//! - the status write: only if it changed, over the version read for a kind whose status
//!   records progress ([`Stages::GUARDED`]), and noted so that no pass runs on the version
//!   written over until the cache holds the write;
//! - Events after the status: what the pass did (told whatever becomes of the status write,
//!   since the next pass would not do it again), then what the status newly says; a `Paused`
//!   or `Resumed` Event when the `Paused` condition turns;
//! - when to look again.
//!
//! The engine's own methods are pure but for `observe` (caches, and reads it declares through
//! [`super::confirm`]), `apply` (its writes, and the reads a write must confirm first) and
//! `clean_up` (a deletion's pass).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Api, ResourceExt};
use noops_api::governed::Governed;
use noops_api::reason::Reason;
use tracing::debug;

use futures::future::BoxFuture;

use super::controller::{Context, Registration, Runtime};
use super::engine::{Engine, Wiring};
use super::error::from_finalizer;
use super::events::Announcement;
use super::report::with_pause_news;
use super::{DuringStage, Error, Result, Stage, crash};

/// What `observe` found: the object (as the pass goes on with it: a step that confirms it with
/// the API server passes on the confirmed one) and what it saw of the cluster.
pub struct Observed<K, O> {
    pub object: Arc<K>,
    pub seen: O,
}

impl<K, O> Observed<K, O> {
    pub fn new(object: Arc<K>, seen: O) -> Self {
        Self { object, seen }
    }
}

/// What `apply` did: done (and what it saw on the way, for the status), or stopped because
/// something changed under it (the pass looks again after `after`).
pub enum Applied<A> {
    Done(A),
    Again { after: Duration, why: &'static str },
}

/// Why a spec cannot be carried out: the reason its status and its Warning give, and the error
/// whose words are the condition's message and the Event's note. The pass fails with it
/// (retried after a growing back-off) unless the refusal may end without the object changing
/// (a name or a range someone else holds, given up): then it looks again after `recheck`.
#[derive(Debug)]
pub struct Refusal<R> {
    pub reason: R,
    pub error: Error,
    pub recheck: Option<Duration>,
}

impl<R> Refusal<R> {
    /// A refusal that only a change of the object ends.
    pub fn new(reason: R, error: Error) -> Self {
        Self {
            reason,
            error,
            recheck: None,
        }
    }

    /// A refusal that may end without the object changing: looked at again after `after`.
    pub fn looked_at_again(reason: R, error: Error, after: Duration) -> Self {
        Self {
            reason,
            error,
            recheck: Some(after),
        }
    }
}

/// What a pass reports: its status, what it did (told whatever becomes of the status write),
/// what the status newly says (told once it is written), and when to look again if no change
/// wakes the object first.
pub struct Report<S> {
    pub status: S,
    pub done: Vec<Announcement>,
    pub news: Vec<Announcement>,
    pub next: Option<Duration>,
}

impl<S> Report<S> {
    /// A report of `status` that tells nothing and waits for a change.
    pub fn of(status: S) -> Self {
        Self {
            status,
            done: Vec::new(),
            news: Vec::new(),
            next: None,
        }
    }
}

/// The stages of one pass of an engine. Every method but `observe`, `apply` and `clean_up` is
/// pure.
pub trait Stages: Engine<Object: Governed<Status: Status>> {
    /// What a pass sees of the cluster.
    type Observation: Send + Sync;
    /// What a pass decides to do.
    type Plan: Send + Sync;
    /// What `apply` returns for the status (the children as applied, ...).
    type Applied: Send + Sync;

    /// Whether the status records progress a status built from an older object would take
    /// back: then it is written only over the version the pass read.
    const GUARDED: bool = false;

    /// Observe: its watch caches, and the reads it declares it must confirm with the API server.
    fn observe(
        object: Arc<Self::Object>,
        ctx: &Context<Self::State>,
        now: jiff::Timestamp,
    ) -> impl Future<Output = Result<Observed<Self::Object, Self::Observation>>> + Send;

    /// Validate: whether the spec can be carried out against what was seen. Nothing to refuse
    /// by default (the schema's rules hold every spec the kind can carry out).
    fn validate(object: &Self::Object, seen: &Self::Observation) -> std::result::Result<(), Refusal<ReasonOf<Self>>> {
        let _ = (object, seen);
        Ok(())
    }

    /// What a refused pass reports: the status that says why the spec is refused (nothing
    /// else changed), and what else it newly says (the core adds the refusal's Warning). The
    /// status as it is by default, for a kind that refuses nothing.
    fn refused(
        object: &Self::Object,
        seen: &Self::Observation,
        refusal: &Refusal<ReasonOf<Self>>,
        now: jiff::Timestamp,
    ) -> Report<StatusOf<Self>> {
        let _ = (seen, refusal, now);
        Report::of(object.status().cloned().unwrap_or_default())
    }

    /// Plan: what the pass does (a paused object's plan is reported, not applied).
    fn plan(object: &Self::Object, seen: &Self::Observation, now: jiff::Timestamp) -> Result<Self::Plan>;

    /// Apply: carry out `plan` (called while paused only if [`Self::APPLIES_WHILE_PAUSED`]).
    fn apply(
        object: &Self::Object,
        seen: &Self::Observation,
        plan: &Self::Plan,
        ctx: &Context<Self::State>,
    ) -> impl Future<Output = Result<Applied<Self::Applied>>> + Send;

    /// Whether `apply` is called while paused: for a kind whose pause lets something beside
    /// the object go on, which its apply then does alone: its children that carry a
    /// `spec.paused` of their own told so (a KubernetesCluster), its backup schedule kept (an
    /// EtcdCluster).
    const APPLIES_WHILE_PAUSED: bool = false;

    /// The crash point between a status written and the Events it earned (crash-safety tests
    /// kill the operator there), for a kind whose tests prove those Events survive it.
    const CRASH_BEFORE_EVENTS: Option<&'static str> = None;

    /// The finalizer its objects carry when deleting one is work of its own
    /// ([`Self::clean_up`]); none by default.
    const FINALIZER: Option<&'static str> = None;

    /// A deletion's pass (only with a [`Self::FINALIZER`]): `Ok` once all of it is done (the
    /// finalizer then goes), [`Error::UnderWay`] while it goes on. Never called while paused:
    /// a paused object's deletion waits, its finalizer kept, its status reported.
    fn clean_up(object: Arc<Self::Object>, ctx: &Context<Self::State>) -> impl Future<Output = Result<Action>> + Send {
        let _ = (object, ctx);
        async { Ok(Action::await_change()) }
    }

    /// What follows the status once it is written (or found as it was), after its Events: a
    /// request the pass used, dropped; gauges of what the status says. Nothing by default.
    fn settled(
        object: &Self::Object,
        seen: &Self::Observation,
        plan: &Self::Plan,
        applied: Option<&Self::Applied>,
        status: &StatusOf<Self>,
        ctx: &Context<Self::State>,
    ) -> impl Future<Output = ()> + Send {
        let _ = (object, seen, plan, applied, status, ctx);
        async {}
    }

    /// The version `apply` left when it wrote the status itself, ahead of the work it records
    /// (a backup's destination, recorded before anything is stored there): the pass's status
    /// is then written over that version rather than the one read. None by default.
    fn written_ahead(applied: &Self::Applied) -> Option<String> {
        let _ = applied;
        None
    }

    /// Status: what the pass reports; `applied` is `None` when paused and nothing was applied.
    fn status(
        object: &Self::Object,
        seen: &Self::Observation,
        plan: &Self::Plan,
        applied: Option<&Self::Applied>,
        now: jiff::Timestamp,
    ) -> Report<StatusOf<Self>>;
}

/// A status the core writes.
pub trait Status: serde::Serialize + PartialEq + Clone + Default + Send + Sync {}

impl<S: serde::Serialize + PartialEq + Clone + Default + Send + Sync> Status for S {}

/// The status of engine `E`'s kind.
pub type StatusOf<E> = <<E as Engine>::Object as Governed>::Status;

/// The reasons of engine `E`'s kind.
pub type ReasonOf<E> = <<E as Engine>::Object as Governed>::Reason;

/// The status `object` has now.
fn status_of<E: Stages>(object: &E::Object) -> Option<&StatusOf<E>> {
    object.status()
}

/// The registration of engine `E` (`noops run --controllers <E::NAME>`): every controller is
/// an engine with stages, its passes driven by the core.
pub const fn registration<E: Stages>() -> Registration {
    Registration {
        name: E::NAME,
        about: E::ABOUT,
        concurrency: E::CONCURRENCY,
        run: run::<E>,
    }
}

/// Runs engine `E` in `runtime.namespace` (all namespaces if `None`) until shutdown.
fn run<E: Stages>(runtime: Runtime) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let controller = runtime.controller::<E::Object>(E::CONCURRENCY);
        let Wiring {
            state,
            controller,
            beside,
        } = E::wire(&runtime, controller).await;
        runtime.serve(E::NAME, controller, state, reconcile::<E>).await;
        for task in beside {
            task.abort();
        }
    })
}

/// One pass of `E`, driven by [`drive`]; for an engine with a finalizer, through kube's
/// finalizer helper, its deletions by [`Stages::clean_up`] unless paused.
async fn reconcile<E: Stages>(object: Arc<E::Object>, ctx: Arc<Context<E::State>>) -> Result<Action> {
    let Some(name) = E::FINALIZER else {
        return drive::<E>(object, &ctx).await;
    };
    let api: Api<E::Object> = Api::namespaced(ctx.client.clone(), &object.namespace().unwrap_or_default());
    let result = finalizer(&api, name, object, |event| async {
        match event {
            Finalizer::Apply(object) => drive::<E>(object, &ctx).await,
            Finalizer::Cleanup(object) if object.paused() => {
                // Its status still says how it stands (and that it is paused).
                drive::<E>(object, &ctx).await?;
                Err(Error::Held("paused: it is deleted once spec.paused is false".into()))
            }
            Finalizer::Cleanup(object) => E::clean_up(object, &ctx).await,
        }
    })
    .await;
    from_finalizer(result)
}

/// How soon a pass whose guarded status write found the object changed looks again (the
/// change's own watch event usually wakes it first).
const CHANGED_SINCE_READ: Duration = Duration::from_secs(1);

/// One pass of `E` over `object`: observe → validate → plan → apply (unless paused) →
/// status, each once.
pub async fn drive<E: Stages>(object: Arc<E::Object>, ctx: &Context<E::State>) -> Result<Action> {
    let now = jiff::Timestamp::now();
    let Observed { object, seen } = E::observe(object, ctx, now).await.during(Stage::Observe)?;

    if let Err(refusal) = E::validate(&object, &seen) {
        let Report {
            status,
            done,
            mut news,
            next,
        } = E::refused(&object, &seen, &refusal, now);
        // Told once, when the status first gives the refusal's reason.
        let reason = refusal.reason.as_str();
        if !gives_reason(status_of::<E>(&object), reason) && gives_reason(Some(&status), reason) {
            news.push(Announcement::warning(reason, refusal.error.to_string()));
        }
        write::<E>(ctx, &object, None, &status, done, news).await?;
        return match refusal.recheck {
            Some(after) => {
                debug!(reason, error = %refusal.error, "refused; looking again later");
                Ok(Action::requeue(next.map_or(after, |next| next.min(after))))
            }
            None => Err(refusal.error).during(Stage::Validate),
        };
    }

    let plan = E::plan(&object, &seen, now).during(Stage::Validate)?;
    let applied = if object.paused() && !E::APPLIES_WHILE_PAUSED {
        debug!("paused: nothing is applied");
        None
    } else {
        match E::apply(&object, &seen, &plan, ctx).await.during(Stage::Apply)? {
            Applied::Done(applied) => Some(applied),
            Applied::Again { after, why } => {
                debug!(why, "stopped applying; looking again");
                return Ok(Action::requeue(after));
            }
        }
    };

    let Report {
        status,
        done,
        news,
        next,
    } = E::status(&object, &seen, &plan, applied.as_ref(), now);
    let ahead = applied.as_ref().and_then(E::written_ahead);
    if !write::<E>(ctx, &object, ahead, &status, done, news).await? {
        debug!("the object changed since this pass read it: the next pass writes its status");
        return Ok(Action::requeue(CHANGED_SINCE_READ));
    }
    E::settled(&object, &seen, &plan, applied.as_ref(), &status, ctx).await;
    Ok(next.map(Action::requeue).unwrap_or_else(Action::await_change))
}

/// Whether `status` has a condition of reason `reason`.
fn gives_reason<S: serde::Serialize>(status: Option<&S>, reason: &str) -> bool {
    let Some(value) = status.and_then(|s| serde_json::to_value(s).ok()) else {
        return false;
    };
    value
        .get("conditions")
        .and_then(|c| c.as_array())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.get("reason").and_then(|r| r.as_str()) == Some(reason))
        })
}

/// Writes `status` if it changed (over the version read if `E::GUARDED`, or over the version
/// `ahead` a write of the pass's apply left), then tells `done` and `news` (and a `Paused` or
/// `Resumed` Event when the `Paused` condition turned); false, telling only `done`, if a
/// guarded write found the object changed. A failed write tells `done` too, then fails.
async fn write<E: Stages>(
    ctx: &Context<E::State>,
    object: &E::Object,
    ahead: Option<String>,
    status: &StatusOf<E>,
    done: Vec<Announcement>,
    news: Vec<Announcement>,
) -> Result<bool> {
    let previous = status_of::<E>(object);
    let told = with_pause_news(previous, status, done.iter().cloned().chain(news));
    // (A status written ahead is not the one read: compared with that, it may have changed.)
    if ahead.is_some() || previous != Some(status) {
        let written = if E::GUARDED {
            let mut version = ahead.or_else(|| kube::Resource::meta(object).resource_version.clone());
            ctx.write_status_at(object, &mut version, status).await
        } else {
            ctx.write_status(object, status).await.map(|()| true)
        };
        match written.during(Stage::Status) {
            Ok(true) => {
                if let Some(point) = E::CRASH_BEFORE_EVENTS.filter(|_| !told.is_empty()) {
                    crash::point(point);
                }
            }
            Ok(false) => {
                ctx.tell(object, done).await;
                return Ok(false);
            }
            Err(error) => {
                ctx.tell(object, done).await;
                return Err(error);
            }
        }
    }
    ctx.tell(object, told).await;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_gives_a_reason_only_in_a_condition() {
        let status = serde_json::json!({
            "phase": "NameTaken",
            "conditions": [{ "type": "Ready", "status": "False", "reason": "NameTaken" }],
        });
        assert!(gives_reason(Some(&status), "NameTaken"));
        assert!(!gives_reason(Some(&status), "RangeTaken"));
        assert!(!gives_reason(
            Some(&serde_json::json!({ "phase": "RangeTaken" })),
            "RangeTaken"
        ));
        assert!(!gives_reason::<serde_json::Value>(None, "NameTaken"));
    }
}
