//! The one shape of every controller: an [`Engine`] says what it reconciles and what it
//! watches, and its [`Stages`](super::stages::Stages) how one pass over an object goes; the
//! core registers it ([`registration`](super::stages::registration), which takes only an
//! engine with stages) and drives it (its caches and controller from [`Engine::wire`], each
//! pass stage by stage through the core's wrapper: span, metrics, back-off, malformed objects,
//! state series).
//!
//! A controller module declares its engine and registration in one [`engine!`]
//! and writes its `wire`; `lib.rs` lists the modules.

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

    /// Its watch caches, and `controller` (of its kind, at most [`Self::CONCURRENCY`] objects
    /// at once: the core's) wired to the changes that wake an object.
    fn wire(runtime: &Runtime, controller: ControllerOf<Self::Object>) -> impl Future<Output = Wiring<Self>> + Send;
}

/// The controller of kind `K`, as the core makes it for an engine.
pub type ControllerOf<K> = Controller<DeserializeGuard<K>>;

/// Declares a controller module's engine, the unit type `$engine` that reconciles `$kind` with
/// the shared `$state`, under `$name` (`noops run --controllers $name`), at most `$concurrency`
/// objects at once, managing `$about` (for `--help`); and its registration, `CONTROLLER`. The
/// module writes `async fn wire(runtime: &Runtime, controller: ControllerOf<$kind>) ->
/// Wiring<$engine>` ([`Engine::wire`]) and implements [`Stages`](super::stages::Stages) for
/// `$engine`.
macro_rules! engine {
    ($(#[$doc:meta])* $engine:ident reconciles $kind:ident with $state:ident, named $name:literal,
     $concurrency:literal at once: $about:literal) => {
        $(#[$doc])*
        pub struct $engine;

        #[doc = concat!("The controller's registration (`noops run --controllers ", $name, "`).")]
        pub const CONTROLLER: $crate::core::controller::Registration =
            $crate::core::stages::registration::<$engine>();

        impl $crate::core::engine::Engine for $engine {
            type Object = $kind;
            type State = $state;
            const NAME: &'static str = $name;
            const ABOUT: &'static str = $about;
            const CONCURRENCY: u16 = $concurrency;

            fn wire(
                runtime: &$crate::core::controller::Runtime,
                controller: $crate::core::engine::ControllerOf<$kind>,
            ) -> impl ::std::future::Future<Output = $crate::core::engine::Wiring<Self>> + Send {
                wire(runtime, controller)
            }
        }
    };
}
pub(crate) use engine;

/// What [`Engine::wire`] makes: the state its passes share, its controller, and tasks of its
/// own that run beside it (stopped with it).
pub struct Wiring<E: Engine + ?Sized> {
    pub state: E::State,
    pub controller: ControllerOf<E::Object>,
    pub beside: Vec<JoinHandle<()>>,
}

impl<E: Engine + ?Sized> Wiring<E> {
    /// A wiring with no task beside the controller.
    pub fn new(state: E::State, controller: ControllerOf<E::Object>) -> Self {
        Self {
            state,
            controller,
            beside: Vec::new(),
        }
    }
}
