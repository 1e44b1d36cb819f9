//! A pass as stages the core drives: an engine that implements [`Stages`] says how it
//! observes, validates, plans, applies and reports; [`drive`] calls each once, in that order,
//! and owns what is the same for every kind:
//! - a refused spec: the status the engine builds for it, written, and a Warning Event told
//!   once (when the status first says so); the pass then waits for a change;
//! - pause: a paused object is observed, planned and reported, never applied;
//! - the status write: only if it changed, over the version read for a kind whose status
//!   records progress ([`Stages::GUARDED`]), and noted so that no pass runs on the version
//!   written over until the cache holds the write;
//! - Events after the status: what the pass did (told whatever becomes of the status write,
//!   since the next pass would not do it again), then what the status newly says; a `Paused`
//!   or `Resumed` Event when the `Paused` condition turns;
//! - when to look again.
//!
//! The engine's own methods are pure but for `observe` (caches, and reads it declares through
//! [`super::confirm`]) and `apply` (its writes).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use noops_api::reason::Reason;
use tracing::debug;

use super::controller::Context;
use super::engine::{Engine, Reconcile};
use super::events::Announcement;
use super::{DuringStage, Error, Result, Stage};

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

/// Why a spec cannot be carried out: the reason its status gives, and the error the pass ends
/// with (its words are the condition's message and the Event's note).
#[derive(Debug)]
pub struct Refusal<R> {
    pub reason: R,
    pub error: Error,
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

/// The stages of one pass of an engine. Every method but `observe` and `apply` is pure.
pub trait Stages: Engine {
    /// The status of its kind.
    type Status: serde::Serialize + PartialEq + Send + Sync;
    /// The reasons its conditions give.
    type Reason: Reason + Send;
    /// What a pass sees of the cluster.
    type Observation: Send + Sync;
    /// What a pass decides to do.
    type Plan: Send + Sync;
    /// What `apply` returns for the status (the children as applied, ...).
    type Applied: Send + Sync;

    /// Whether the status records progress a status built from an older object would take
    /// back: then it is written only over the version the pass read.
    const GUARDED: bool = false;

    /// The status the object has now.
    fn status_of(object: &Self::Object) -> Option<&Self::Status>;

    /// Whether `spec.paused` asks the operator to change nothing of it.
    fn paused(object: &Self::Object) -> bool;

    /// Observe: its watch caches, and the reads it declares it must confirm with the API server.
    fn observe(
        object: Arc<Self::Object>,
        ctx: &Context<Self::State>,
        now: jiff::Timestamp,
    ) -> impl Future<Output = Result<Observed<Self::Object, Self::Observation>>> + Send;

    /// Validate: whether the spec can be carried out against what was seen.
    fn validate(object: &Self::Object, seen: &Self::Observation) -> std::result::Result<(), Refusal<Self::Reason>>;

    /// The status that says why the spec is refused (nothing else changed).
    fn refused(
        object: &Self::Object,
        seen: &Self::Observation,
        refusal: &Refusal<Self::Reason>,
        now: jiff::Timestamp,
    ) -> Self::Status;

    /// Plan: what the pass does (a paused object's plan is reported, not applied).
    fn plan(object: &Self::Object, seen: &Self::Observation, now: jiff::Timestamp) -> Result<Self::Plan>;

    /// Apply: carry out `plan` (never called while paused).
    fn apply(
        object: &Self::Object,
        seen: &Self::Observation,
        plan: &Self::Plan,
        ctx: &Context<Self::State>,
    ) -> impl Future<Output = Result<Applied<Self::Applied>>> + Send;

    /// Status: what the pass reports; `applied` is `None` when paused (nothing was applied).
    fn status(
        object: &Self::Object,
        seen: &Self::Observation,
        plan: &Self::Plan,
        applied: Option<&Self::Applied>,
        now: jiff::Timestamp,
    ) -> Report<Self::Status>;
}

/// Every engine with stages has its passes driven by [`drive`].
impl<E: Stages> Reconcile for E {
    async fn reconcile(object: Arc<E::Object>, ctx: Arc<Context<E::State>>) -> Result<Action> {
        drive::<E>(object, &ctx).await
    }
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
        let status = E::refused(&object, &seen, &refusal, now);
        let previous = E::status_of(&object);
        // Told once, when the status first says so.
        let told = (previous != Some(&status))
            .then(|| Announcement::warning(refusal.error.reason(), refusal.error.to_string()));
        write::<E>(ctx, &object, status, Vec::new(), told.into_iter().collect()).await?;
        return Err(refusal.error).during(Stage::Validate);
    }

    let plan = E::plan(&object, &seen, now).during(Stage::Validate)?;
    let applied = if E::paused(&object) {
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
    if !write::<E>(ctx, &object, status, done, news).await? {
        debug!("the object changed since this pass read it: the next pass writes its status");
        return Ok(Action::requeue(CHANGED_SINCE_READ));
    }
    Ok(next.map(Action::requeue).unwrap_or_else(Action::await_change))
}

/// Writes `status` if it changed (over the version read if `E::GUARDED`), then tells `done`
/// and `news`; false, telling only `done`, if a guarded write found the object changed. A
/// failed write tells `done` too, then fails.
async fn write<E: Stages>(
    ctx: &Context<E::State>,
    object: &E::Object,
    status: E::Status,
    done: Vec<Announcement>,
    news: Vec<Announcement>,
) -> Result<bool> {
    let previous = E::status_of(object);
    let told = done.iter().cloned().chain(news);
    let written = if E::GUARDED {
        let mut version = kube::Resource::meta(object).resource_version.clone();
        ctx.report_at(object, previous, &mut version, &status, told).await
    } else {
        ctx.report(object, previous, &status, told).await.map(|()| true)
    };
    match written {
        Ok(true) => Ok(true),
        Ok(false) => {
            ctx.tell(object, done).await;
            Ok(false)
        }
        Err(error) => {
            ctx.tell(object, done).await;
            Err(error)
        }
    }
}
