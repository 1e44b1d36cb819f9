//! What every controller shares: registration and the reconcile wrapper (`controller`), the
//! count of its API requests, pods of one group preferring different nodes (`apart`),
//! conditions, Events, server-side apply and the desired-state stamp, labels, rollout checks,
//! pruning of children no longer wanted, the tail of every pass (`report`: the status, then
//! the Events), per-object back-off, error classification, metrics,
//! nodes and the volumes pinned to them, certificates from the operator's own CAs (`pki`), and
//! the crash points of the crash-safety tests, downward-API variables, clients of a tenant's
//! cluster (`tenant`), where images are pulled from (`images`) and what pods declare for Pod
//! Security (`pod_security`).
//! What a pass wrote that the cache has not shown yet (`written`: the core skips a pass over
//! an object its last pass wrote over).
//! `backup/` is the backup kit every engine's backups are made of.

pub mod apart;
pub mod api_requests;
pub mod apply;
pub mod backoff;
pub mod backup;
pub mod cache;
pub mod conditions;
pub mod confirm;
pub mod controller;
pub mod crash;
pub mod downward;
pub mod engine;
pub mod error;
pub mod events;
#[cfg(test)]
pub mod fixtures;
pub mod images;
pub mod labels;
pub mod metrics;
pub mod nodes;
pub mod pki;
pub mod pod_security;
pub mod prune;
pub mod report;
pub mod resource_metrics;
pub mod rollout;
pub mod stages;
pub mod stamp;
pub mod stuck;
pub mod tenant;
pub mod user_secrets;
pub mod written;

pub use error::{DuringStage, Error, Result, Stage};
