//! What every controller shares: conditions, Events, server-side apply, per-object back-off,
//! error classification and metrics.

pub mod apply;
pub mod backoff;
pub mod cache;
pub mod conditions;
pub mod error;
pub mod events;
pub mod metrics;

pub use error::{Error, Result};
