//! A resource's backups from its own side (an EtcdCluster's EtcdBackups, a PostgreSQL's
//! PostgresBackups): when the scheduled one is due, which scheduled ones retention deletes,
//! and what they add up to in the resource's status (how many are kept, the newest, and the
//! `BackupSucceeded` condition that follows the newest finished one). Pure: the backups come
//! from a watch cache and the time is a parameter.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::ResourceExt;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::Store;
use noops_api::backup::BackupsStatus;
use noops_api::reason::Reason;

use super::controller::BackupResource;
use super::schedule::{self, BadSchedule, Counted, Kept, SCHEDULED_LABEL};
use crate::core::conditions::Decided;

/// The resource's condition that says how its newest finished backup went.
pub const BACKUP_SUCCEEDED: &str = "BackupSucceeded";

/// The reasons of [`BACKUP_SUCCEEDED`] in a kind that schedules backups.
pub trait BackupsReason: Reason {
    /// The newest finished backup is stored.
    const BACKUP_STORED: Self;
    /// The newest finished backup failed.
    const BACKUP_FAILED: Self;
}

/// What a resource's status says of its backups (its conditions' reasons are `R`).
#[derive(Debug, Clone, PartialEq)]
pub struct BackupsSummary<R: BackupsReason> {
    /// The fields of the status (the schedule's bookmark, the newest, how many are kept).
    pub status: BackupsStatus,
    /// [`BACKUP_SUCCEEDED`]: the newest finished backup succeeded, or why it failed.
    pub condition: Option<Decided<R>>,
}

impl<R: BackupsReason> Default for BackupsSummary<R> {
    fn default() -> Self {
        Self {
            status: BackupsStatus::default(),
            condition: None,
        }
    }
}

impl<R: BackupsReason> BackupsSummary<R> {
    /// As the last status left it (`conditions` are the resource's).
    pub fn of(conditions: &[Condition], status: &BackupsStatus) -> Self {
        let condition = conditions.iter().find(|c| c.type_ == BACKUP_SUCCEEDED).map(|c| {
            let stored = c.status == "True";
            Decided::new(BACKUP_SUCCEEDED, stored, reason(stored), c.message.clone())
        });
        Self {
            status: status.clone(),
            condition,
        }
    }

    /// Counts `backups` (the resource's, those retention keeps): the successful ones, the
    /// newest, and how the newest finished one went, which a success says with `stored`.
    pub fn count<K: BackupResource>(&mut self, backups: &[&K], stored: impl Fn(&K) -> String) {
        let counted: Vec<Counted> = backups
            .iter()
            .map(|b| {
                let progress = b.status().map(K::progress);
                Counted {
                    name: b.name_any(),
                    phase: progress.and_then(|p| p.phase),
                    completed: progress.and_then(|p| p.completed_at.as_ref()).map(|t| t.0),
                    deleting: b.meta().deletion_timestamp.is_some(),
                }
            })
            .collect();
        let tally = schedule::tally(&counted);
        self.status.stored_backups = Some(tally.stored);
        if let Some((name, at)) = tally.newest_stored {
            self.status.last_backup = Some(name);
            self.status.last_backup_time = Some(Time(at));
        }
        if let Some((index, succeeded)) = tally.newest_finished {
            let backup = backups[index];
            let message = if succeeded {
                stored(backup)
            } else {
                let conditions = backup.status().map(|s| K::progress(s).conditions.as_slice());
                schedule::failure(&K::kind(&()), &backup.name_any(), conditions.unwrap_or_default())
            };
            self.condition = Some(Decided::new(BACKUP_SUCCEEDED, succeeded, reason(succeeded), message));
        }
    }

    /// No schedule (any more): one added later is followed from then on.
    pub fn no_schedule(&mut self) {
        self.status.schedule_since = None;
    }

    /// Where `pattern` stands now: the scheduled time due now, if one is, and how long until the
    /// next. The bookmark moves to the time due (a schedule first seen now makes its first
    /// backup at its next time, and is followed since now).
    pub fn follow_schedule(&mut self, pattern: &str, now: jiff::Timestamp) -> Result<Due, BadSchedule> {
        let cron = schedule::parse(pattern)?;
        self.status.schedule_since.get_or_insert(Time(now));
        let last = self.status.last_scheduled_time.as_ref().map_or(now, |t| t.0);
        let due = schedule::due(&cron, last, now)?;
        self.status.last_scheduled_time = Some(Time(due.now.unwrap_or(last)));
        Ok(Due {
            now: due.now,
            next_in: Duration::try_from(due.next.duration_since(now)).unwrap_or_default(),
        })
    }
}

/// A schedule, as one pass sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Due {
    /// The scheduled time whose backup is to be made now.
    pub now: Option<jiff::Timestamp>,
    /// How long until the next scheduled time.
    pub next_in: Duration,
}

fn reason<R: BackupsReason>(stored: bool) -> R {
    if stored { R::BACKUP_STORED } else { R::BACKUP_FAILED }
}

/// The scheduled backups among `backups` that retention deletes so that `max` successful ones
/// are kept; none that is being deleted already, paused, or `in_use` (a new resource is
/// being restored from it).
pub fn beyond_max<K: BackupResource>(
    backups: &[&K],
    in_use: impl Fn(&str) -> bool,
    max: i32,
    now: jiff::Timestamp,
) -> Vec<String> {
    let scheduled: Vec<Kept> = backups
        .iter()
        .filter(|b| b.labels().get(SCHEDULED_LABEL).map(String::as_str) == Some("true"))
        // A paused backup is left as it is, by retention too.
        .filter(|b| b.meta().deletion_timestamp.is_none() && !b.paused() && !in_use(&b.name_any()))
        .map(|b| Kept {
            name: b.name_any(),
            created: b.creation_timestamp().map_or(now, |t| t.0),
            succeeded: b.status().is_some_and(|s| K::progress(s).succeeded()),
        })
        .collect();
    schedule::to_delete(&scheduled, usize::try_from(max).unwrap_or(1).max(1))
}

/// The metadata of a backup the operator makes for resource `owner` (uid `uid`) in
/// `namespace`, named `name`: labelled with the owner's name (`owner_label`), its UID
/// (`uid_label`: a resource deleted and made again under the same name is another) and as
/// scheduled. Not owned by the resource: backups outlive it, to restore from.
pub fn scheduled_metadata(
    name: String,
    namespace: &str,
    (owner_label, owner): (&str, &str),
    (uid_label, uid): (&str, &str),
) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(namespace.to_string()),
        labels: Some(
            [
                (owner_label.to_string(), owner.to_string()),
                (uid_label.to_string(), uid.to_string()),
                (SCHEDULED_LABEL.to_string(), "true".to_string()),
            ]
            .into(),
        ),
        ..Default::default()
    }
}

/// The backups a new resource of `namespace` (from the controller's own store) is still
/// starting from, as `starting_from` tells: retention never deletes one under it.
pub fn being_restored<K>(
    store: &Store<DeserializeGuard<K>>,
    namespace: &str,
    starting_from: impl Fn(&K) -> Option<&str>,
) -> BTreeSet<String>
where
    K: kube::Resource<DynamicType = ()> + Clone,
{
    crate::core::cache::own_in_namespace(store, namespace)
        .iter()
        .filter_map(|o| starting_from(o).map(String::from))
        .collect()
}
