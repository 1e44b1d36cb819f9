//! The backup kit: what every engine's backups are made of, so that an engine says only what
//! is its own (what a backup holds, how it is taken and restored).
//!
//! - `destination.rs`: where backups go (a bucket or a volume) and one resource's folder there;
//! - `stores.rs`: how the operator and the pods it runs open a store;
//! - `schedule.rs`: when scheduled backups are due, their names, what retention deletes;
//! - `gauges.rs`: what a resource's backups say to monitoring;
//! - `task_pod.rs`: the short-lived pods that do one job (take, save or delete a backup) and
//!   report how it went.
//!
//! The API types beside it are in `noops_api::backup` (the destinations, `BackupProgress`).

pub mod controller;
pub mod destination;
pub mod gauges;
pub mod progress;
pub mod retention;
pub mod schedule;
pub mod stores;
pub mod task_pod;

pub use destination::Destination;
