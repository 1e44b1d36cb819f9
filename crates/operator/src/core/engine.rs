//! The one shape of every controller: an [`Engine`] says what it reconciles and what it
//! watches, and its [`Stages`](super::stages::Stages) how one pass over an object goes; the
//! core registers it ([`registration`](super::stages::registration), which takes only an
//! engine with stages) and drives it (its caches and controller from [`Engine::wire`], each
//! pass stage by stage through the core's wrapper: span, metrics, back-off, malformed objects,
//! state series).
//!
//! A controller module is an engine and one line, `pub const CONTROLLER: Registration =
//! registration::<TheEngine>();`; `lib.rs` lists the modules.

use std::future::Future;

use kube::core::DeserializeGuard;
use kube::runtime::controller::Controller;
use tokio::task::JoinHandle;

use super::controller::{Runtime, Watched};

/// A controller's engine. Implemented by a unit type per controller; its passes share a
/// [`Context`](super::controller::Context) of its [`Engine::State`].
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
