//! The programs the operator's image runs in the pods of an EtcdCluster's backups and
//! restores (`noops save-snapshot`, `fetch-snapshot`, `delete-snapshot`, `install-restored`;
//! `cli.rs`): each does one job inside its pod and reports through the container's exit code
//! and termination message, which the controllers read.

pub mod cli;
pub mod fetch;
pub mod install;
pub mod save;
