//! The one shape of every controller: an [`Engine`] says what it reconciles and what it
//! watches, and [`Reconcile`] how one pass over an object goes (for an engine with
//! [`Stages`](super::stages::Stages), the core's own stage by stage); the core registers it
//! ([`registration`]) and drives it (its caches and controller from [`Engine::wire`], each pass
//! through the core's wrapper: span, metrics, back-off, malformed objects, state series).
//!
//! A controller module is an engine and one line, `pub const CONTROLLER: Registration =
//! registration::<TheEngine>();`; `lib.rs` lists the modules.

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use kube::core::DeserializeGuard;
use kube::runtime::controller::{Action, Controller};
use tokio::task::JoinHandle;

use super::Result;
use super::controller::{Context, Registration, Runtime, Watched};

/// A controller's engine. Implemented by a unit type per controller; its passes share a
/// [`Context`] of its [`Engine::State`].
pub trait Engine: Send + Sync + 'static {
    /// The kind it reconciles.
    type Object: Watched + serde::Serialize;
    /// What its passes share beside the core: its watch caches and settings.
    type State: Send + Sync + 'static;
    /// Its name in `--controllers`, metric labels, log spans and Events (`noops-<name>`).
    const NAME: &'static str;
    /// What it manages, for `noops run --help`.
    const ABOUT: &'static str;
    /// At most this many objects are reconciled at once (most passes wait on the API server; a
    /// bound keeps a burst of thousands of objects from queueing all at once there and in
    /// memory).
    const CONCURRENCY: u16;

    /// Its watch caches and its controller (from [`Runtime::controller`] with
    /// [`Self::CONCURRENCY`]), wired to the changes that wake an object.
    fn wire(runtime: &Runtime) -> impl Future<Output = Wiring<Self>> + Send;
}

/// How an engine passes over an object. An engine with [`Stages`](super::stages::Stages) has
/// its passes driven by the core, stage by stage; one not moved onto them yet writes its pass
/// whole.
pub trait Reconcile: Engine {
    /// One pass over `object`.
    fn reconcile(
        object: Arc<Self::Object>,
        ctx: Arc<Context<Self::State>>,
    ) -> impl Future<Output = Result<Action>> + Send;
}

/// What [`Engine::wire`] makes: the state its passes share, its controller, and tasks of its
/// own that run beside it (stopped with it).
pub struct Wiring<E: Engine + ?Sized> {
    pub state: E::State,
    pub controller: Controller<DeserializeGuard<E::Object>>,
    pub beside: Vec<JoinHandle<()>>,
}

impl<E: Engine + ?Sized> Wiring<E> {
    /// A wiring with no task beside the controller.
    pub fn new(state: E::State, controller: Controller<DeserializeGuard<E::Object>>) -> Self {
        Self {
            state,
            controller,
            beside: Vec::new(),
        }
    }
}

/// The registration of engine `E` (`noops run --controllers <E::NAME>`).
pub const fn registration<E: Reconcile>() -> Registration {
    Registration {
        name: E::NAME,
        about: E::ABOUT,
        concurrency: E::CONCURRENCY,
        run: run::<E>,
    }
}

/// Runs engine `E` in `runtime.namespace` (all namespaces if `None`) until shutdown.
fn run<E: Reconcile>(runtime: Runtime) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let Wiring {
            state,
            controller,
            beside,
        } = E::wire(&runtime).await;
        runtime.serve(E::NAME, controller, state, E::reconcile).await;
        for task in beside {
            task.abort();
        }
    })
}
