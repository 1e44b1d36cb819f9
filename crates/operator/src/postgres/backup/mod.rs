//! The PostgresBackup controller: one base backup of a PostgreSQL per PostgresBackup, in the
//! database's S3-compatible bucket or backup volume, with its size, SHA-256 and WAL range in
//! status; with the WAL the database archives continuously, it restores the database to any
//! moment from its end on.
//!
//! One pass, on the backup kit's stages (`reconcile.rs`): observe its database → record where
//! it goes → have a pod take it from the instance `backup.target` names (`source.rs`;
//! `pods.rs`; what the pod runs is `crate::postgres::instance::base_backup`) → status and
//! Event. Deleting a PostgresBackup deletes its base backup and the WAL only it needed. The PostgreSQL controller makes the
//! first and the scheduled PostgresBackups and applies retention (`crate::postgres::backups`).
//! What every backup controller shares (context, finalizer, the end of a pass) is the backup
//! kit's (`crate::core::backup`).

pub mod pods;
mod reconcile;
mod source;

use std::sync::Arc;

use kube::runtime::controller::Action;
use noops_api::{PostgreSQL, PostgresBackup};

use crate::core::Result;
use crate::core::backup::controller::{BackupEngine, Backups, Begun, Made};
use crate::core::backup::progress::Timing;
use crate::core::controller::Registration;
use crate::core::stages::registration;
use reconcile::Context;

pub use reconcile::{FINALIZER, keep_wal_from};

/// The controller's registration (`noops run --controllers postgresbackup`).
pub const CONTROLLER: Registration = registration::<Backups<PostgresBackups>>();

/// The PostgresBackup engine.
pub struct PostgresBackups;

impl BackupEngine for PostgresBackups {
    type Backup = PostgresBackup;
    type Source = PostgreSQL;
    const NAME: &'static str = "postgresbackup";
    const ABOUT: &'static str = "PostgresBackup: base backups of PostgreSQLs in an S3-compatible store or a volume";
    const CONCURRENCY: u16 = 2;
    const COMPONENT: &'static str = pods::COMPONENT;
    const SOURCE_LABEL: &'static str = crate::postgres::names::POSTGRES_LABEL;
    const MAKER_JOB: &'static str = "base";
    const TIMING: Timing = reconcile::TIMING;

    async fn observe(backup: &PostgresBackup, ctx: &Context) -> Result<Option<PostgreSQL>> {
        reconcile::observe(backup, ctx).await
    }

    async fn make(
        backup: &PostgresBackup,
        pg: Option<&PostgreSQL>,
        begun: Begun<PostgresBackup>,
        ctx: &Context,
    ) -> Result<Option<Made<PostgresBackup>>> {
        reconcile::make(backup, pg, begun, ctx).await
    }

    async fn clean_up(backup: Arc<PostgresBackup>, ctx: &Context) -> Result<Action> {
        reconcile::clean_up(backup, ctx).await
    }
}
