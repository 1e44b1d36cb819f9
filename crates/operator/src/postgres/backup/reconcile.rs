//! One pass over a PostgresBackup: read it and its PostgreSQL → record where it goes (before
//! anything is written there) → have a pod take the base backup (`pods.rs`) → read what the
//! pod reports → status and an Event. All progress is in the status and the pod: an operator
//! restarted at any point finds the pod and goes on. A backup that is done (Succeeded or
//! Failed) is never taken again; a failed base backup is not retried (the schedule takes the
//! next one), while a backup waiting for its database or its volume waits up to
//! [`WAIT_DEADLINE`]. Deleting a PostgresBackup deletes its base backup, and the WAL only it
//! needed (a finalizer), from where its status says, so it works once the PostgreSQL is gone.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ListParams;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Api, Resource, ResourceExt};
use noops_api::PostgreSQL;
use noops_api::postgres::BackupLocation;
use noops_api::postgres_backup::{PostgresBackup, PostgresBackupStatus};
use tracing::{info, warn};

use super::Context;
use super::pods::{self, Job, Place};
use crate::core::apply::{apply_status_at, controller_reference, create_if_missing, delete_if_present};
use crate::core::backup::schedule::elapsed;
use crate::core::backup::task_pod::{self, Outcome};
use crate::core::conditions::{Decided, merge};
use crate::core::events::Announcement;
use crate::core::{Error, Result, crash};
use crate::postgres::instance::base_backup::Taken;
use crate::postgres::instance::wal::segment_name;
use crate::postgres::names::Names;
use crate::postgres::observe;
use crate::postgres::store::{BaseBackupDestination, Destination};

/// The finalizer that deletes the base backup with the PostgresBackup.
pub const FINALIZER: &str = "noops.dev/postgres-backup";
/// How long a backup waits for its database to serve (or its volume to exist) before it fails.
pub const WAIT_DEADLINE: Duration = Duration::from_secs(600);
/// How long a base backup pod may run before it is stopped and the backup fails.
pub const RUN_DEADLINE: Duration = Duration::from_secs(6 * 3600);
/// How soon a waiting backup is looked at again.
const RETRY: Duration = Duration::from_secs(5);
/// How often a running base backup pod is looked at, besides when it changes.
const IN_PROGRESS_CHECK: Duration = Duration::from_secs(30);
/// How long the deletion of a backup is tried before it is given up, and the PostgresBackup
/// goes anyway (its files are left in the store, with a Warning).
const CLEANUP_DEADLINE: Duration = Duration::from_secs(300);

const SUCCEEDED: &str = "Succeeded";

pub async fn reconcile(backup: Arc<PostgresBackup>, ctx: &Context) -> Result<Action> {
    let namespace = backup.namespace().unwrap_or_default();
    let api: Api<PostgresBackup> = Api::namespaced(ctx.client.clone(), &namespace);
    let result = finalizer(&api, FINALIZER, backup, |event| async {
        match event {
            Finalizer::Apply(backup) => make(&backup, ctx).await,
            Finalizer::Cleanup(backup) => clean_up(&backup, ctx).await,
        }
    })
    .await;
    crate::core::error::from_finalizer(result)
}

/// Where a backup stands after this pass.
enum Verdict {
    Succeeded(Box<Taken>),
    /// Its pod is taking it.
    InProgress,
    /// Not yet: waits, up to the deadline.
    Wait {
        reason: &'static str,
        message: String,
    },
    Failed {
        reason: &'static str,
        message: String,
    },
}

fn pod_name(backup: &PostgresBackup, job: Job) -> String {
    task_pod::name(&backup.name_any(), &backup.uid().unwrap_or_default(), job.verb())
}

async fn make(cached: &PostgresBackup, ctx: &Context) -> Result<Action> {
    let namespace = cached.namespace().unwrap_or_default();
    // The watch cache may not have seen the last status yet: the work is decided on the
    // latest word, and every status write below is made over that version.
    let api: Api<PostgresBackup> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(backup) = api.get_opt(&cached.name_any()).await? else {
        return Ok(Action::await_change());
    };
    let backup = &backup;
    let mut version = backup.resource_version();
    let mut status = backup.status.clone().unwrap_or_default();
    if matches!(status.progress.phase.as_deref(), Some("Succeeded" | "Failed")) {
        // An operator stopped between the last status write and removing the pod (or a pod
        // left on a dead node, removed once its grace has passed).
        return remove_pod(backup, Job::Base, ctx).await;
    }
    let now = jiff::Timestamp::now();
    let started = status.progress.started_at.as_ref().map_or(now, |t| t.0);
    let databases: Api<PostgreSQL> = Api::namespaced(ctx.client.clone(), &namespace);
    let pg = databases.get_opt(&backup.spec.postgresql).await?;
    let verdict = match (&pg, status.destination.clone()) {
        // Applied with its database, maybe a moment before it: waits for it a while. Or the
        // database was deleted while its backup was under way: what the pod did still counts
        // (a backup it stored is whole, and is kept as such).
        (None, destination) => {
            let under_way = match destination {
                Some(_) => progress(backup, started, now, ctx).await?,
                None => None,
            };
            under_way.unwrap_or_else(|| Verdict::Wait {
                reason: "PostgreSQLNotFound",
                message: format!(
                    "PostgreSQL {:?} does not exist in this namespace",
                    backup.spec.postgresql
                ),
            })
        }
        // Once recorded, where it goes stays: a pass after the database's destination was
        // edited (or removed) still goes where the status says.
        (Some(pg), Some(location)) => attempt(backup, pg, &location, started, now, ctx).await?,
        (Some(pg), None) => match where_to(pg, &backup.name_any()) {
            Err(verdict) => verdict,
            Ok((location, url)) => {
                // Recorded before anything is written, so that a deletion finds it whatever
                // happens next.
                status.progress.phase = Some("Running".into());
                status.progress.started_at = Some(Time(started));
                status.destination = Some(location.clone());
                status.progress.location = Some(url.clone());
                status.pod = Some(pod_name(backup, Job::Base));
                if !write_status(backup, &mut version, ctx, &status).await? {
                    return Ok(Action::requeue(Duration::from_secs(1)));
                }
                crash::point("postgres backup: destination recorded, no pod made");
                info!(postgresql = %backup.spec.postgresql, location = %url, "backing up");
                attempt(backup, pg, &location, started, now, ctx).await?
            }
        },
    };
    settle(backup, &mut version, status, verdict, started, now, ctx).await
}

/// Where the backup of `pg` named `backup` goes: its location and URL; or why it cannot be
/// taken (the database has no destination, or has never run).
fn where_to(pg: &PostgreSQL, backup: &str) -> std::result::Result<(BackupLocation, String), Verdict> {
    let names = Names::of(pg);
    let Some(destination) = pg.spec.backup.as_ref().and_then(Destination::of_spec) else {
        return Err(Verdict::Failed {
            reason: "NoDestination",
            message: format!(
                "PostgreSQL {} has no spec.backup: it does not say where backups go",
                names.name
            ),
        });
    };
    let Some(system_id) = pg.status.as_ref().and_then(|s| s.system_identifier.clone()) else {
        return Err(Verdict::Wait {
            reason: "NotServing",
            message: format!("PostgreSQL {} has not served yet", names.name),
        });
    };
    let root = destination.folder(&names.namespace, &names.name);
    let location = destination.location(&root, backup, &system_id);
    let url = destination.url(&location.base);
    Ok((location, url))
}

/// The status a verdict leaves, with its Event.
#[allow(clippy::too_many_arguments)]
async fn settle(
    backup: &PostgresBackup,
    version: &mut Option<String>,
    status: PostgresBackupStatus,
    verdict: Verdict,
    started: jiff::Timestamp,
    now: jiff::Timestamp,
    ctx: &Context,
) -> Result<Action> {
    let mut next = status.clone();
    next.progress.started_at = Some(Time(started));
    let reference = backup.object_ref(&());
    let events = &ctx.core.events;
    match verdict {
        Verdict::Succeeded(taken) => {
            crash::point("postgres backup: stored, status not written");
            let where_ = next.progress.location.clone().unwrap_or_default();
            let note = format!(
                "stored a base backup of {} bytes at {where_}: WAL {} to {} on timeline {}",
                taken.size, taken.start_wal, taken.end_wal, taken.timeline
            );
            if let Some(location) = next.destination.as_mut() {
                // Taken from the database that serves now (a new one since it began, if its
                // volume was lost meanwhile): its WAL is that database's.
                let root = location.wal.rsplit_once("/wal/").map(|(root, _)| root.to_string());
                if let Some(root) = root {
                    location.wal = crate::postgres::store::wal_folder(&root, &taken.system_identifier);
                }
            }
            next.progress.phase = Some("Succeeded".into());
            next.progress.size = Some(taken.size);
            next.progress.sha256 = Some(taken.sha256);
            next.start_wal = Some(taken.start_wal);
            next.end_wal = Some(taken.end_wal);
            next.timeline = Some(taken.timeline);
            next.system_identifier = Some(taken.system_identifier);
            next.server_version = Some(taken.server_version);
            next.progress.completed_at = Some(Time(now));
            next.progress.conditions = merge(
                &next.progress.conditions,
                &[Decided::new(SUCCEEDED, true, "Stored", note.clone())],
                None,
                now,
            );
            if !write_status(backup, version, ctx, &next).await? {
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
            events
                .tell(&reference, Announcement::normal("BackupSucceeded", note))
                .await;
            crash::point("postgres backup: status written, pod not removed");
            remove_pod(backup, Job::Base, ctx).await
        }
        Verdict::InProgress => {
            let message = format!("pod {} takes the base backup", pod_name(backup, Job::Base));
            next.progress.phase = Some("Running".into());
            next.progress.conditions = merge(
                &next.progress.conditions,
                &[Decided::new(SUCCEEDED, false, "InProgress", message)],
                None,
                now,
            );
            if status != next && !write_status(backup, version, ctx, &next).await? {
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
            Ok(Action::requeue(IN_PROGRESS_CHECK))
        }
        Verdict::Wait { reason, message } if elapsed(started, now) < WAIT_DEADLINE => {
            next.progress.phase = Some("Running".into());
            next.progress.conditions = merge(
                &next.progress.conditions,
                &[Decided::new(SUCCEEDED, false, reason, message.clone())],
                None,
                now,
            );
            if status != next {
                if !write_status(backup, version, ctx, &next).await? {
                    return Ok(Action::requeue(Duration::from_secs(1)));
                }
                info!(reason, "the backup waits: {message}");
            }
            Ok(Action::requeue(RETRY))
        }
        Verdict::Wait { reason, message } | Verdict::Failed { reason, message } => {
            next.progress.phase = Some("Failed".into());
            next.progress.completed_at = Some(Time(now));
            next.progress.conditions = merge(
                &next.progress.conditions,
                &[Decided::new(SUCCEEDED, false, reason, message.clone())],
                None,
                now,
            );
            if !write_status(backup, version, ctx, &next).await? {
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
            warn!(reason, "the backup failed: {message}");
            events.publish(&reference, Announcement::warning(reason, message)).await;
            remove_pod(backup, Job::Base, ctx).await
        }
    }
}

/// One look at the pod that takes the backup: made if there is none (once the instance
/// serves), read once it has ended, stopped past [`RUN_DEADLINE`].
async fn attempt(
    backup: &PostgresBackup,
    pg: &PostgreSQL,
    location: &BackupLocation,
    started: jiff::Timestamp,
    now: jiff::Timestamp,
    ctx: &Context,
) -> Result<Verdict> {
    if let Some(verdict) = progress(backup, started, now, ctx).await? {
        return Ok(verdict);
    }
    let names = Names::of(pg);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let name = pod_name(backup, Job::Base);
    if let Some(claim) = Destination::of_location(location)
        .as_ref()
        .and_then(|d| d.claim().map(str::to_string))
    {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &names.namespace);
        if claims.get_opt(&claim).await?.is_none() {
            return Ok(Verdict::Wait {
                reason: "ClaimNotFound",
                message: format!(
                    "PersistentVolumeClaim {claim:?} (backup.volume.claimName) does not exist in this namespace"
                ),
            });
        }
    }
    let instance = pods.get_opt(&names.instance()).await?;
    let Some(host) = instance.as_ref().and_then(observe::ready_address) else {
        return Ok(Verdict::Wait {
            reason: "InstanceNotReady",
            message: format!(
                "the instance {} is not serving: a base backup waits for it",
                names.instance()
            ),
        });
    };
    let Some(owner) = controller_reference(backup) else {
        return Ok(Verdict::Wait {
            reason: "NotStored",
            message: "the PostgresBackup has no uid yet".into(),
        });
    };
    let version = &pg.spec.version;
    let Some(pod) = pods::base_pod(
        &name,
        &backup.name_any(),
        &names,
        version,
        &host,
        location,
        &ctx.image,
        &owner,
    ) else {
        return Ok(Verdict::Failed {
            reason: "NoDestination",
            message: "the recorded destination names no store".into(),
        });
    };
    if create_if_missing(&pods, &pod).await? {
        crash::point("postgres backup: pod made");
        info!(pod = %name, %host, "a pod takes the base backup");
    }
    Ok(Verdict::InProgress)
}

/// How the backup's pod is doing, once it was made (None: it was not).
async fn progress(
    backup: &PostgresBackup,
    started: jiff::Timestamp,
    now: jiff::Timestamp,
    ctx: &Context,
) -> Result<Option<Verdict>> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &backup.namespace().unwrap_or_default());
    let name = pod_name(backup, Job::Base);
    let pod = pods.get_opt(&name).await?;
    Ok(Some(match task_pod::outcome(pod.as_ref(), now) {
        Outcome::NotStarted => return Ok(None),
        Outcome::Running if elapsed(started, now) >= RUN_DEADLINE => {
            remove_pod(backup, Job::Base, ctx).await?;
            Verdict::Failed {
                reason: "BackupTooLong",
                message: format!("pod {name} did not finish within {}s", RUN_DEADLINE.as_secs()),
            }
        }
        Outcome::Running => Verdict::InProgress,
        Outcome::Stuck(message) => Verdict::Wait {
            reason: "BackupPodStuck",
            message,
        },
        Outcome::Succeeded(message) => match serde_json::from_str::<Taken>(&message) {
            Ok(taken) => Verdict::Succeeded(Box::new(taken)),
            Err(_) => Verdict::Failed {
                reason: "BaseBackupFailed",
                message: format!("pod {name} ended without saying what it stored: {message:?}"),
            },
        },
        Outcome::Failed(message) => Verdict::Failed {
            reason: "BaseBackupFailed",
            message,
        },
    }))
}

/// Deletes the pod of `job` for `backup`, if there is one (at once if it was deleted already
/// and its node never confirmed it: a dead node). Returns what to do next: look again while
/// the pod lingers, to force it out once its grace has passed.
async fn remove_pod(backup: &PostgresBackup, job: Job, ctx: &Context) -> Result<Action> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &backup.namespace().unwrap_or_default());
    let name = pod_name(backup, job);
    let Some(pod) = pods.get_opt(&name).await? else {
        return Ok(Action::await_change());
    };
    let params = task_pod::delete_params(Some(&pod), jiff::Timestamp::now());
    let forced = params.grace_period_seconds == Some(0);
    delete_if_present(&pods, &name, &params).await?;
    Ok(if forced || pod.metadata.deletion_timestamp.is_none() {
        Action::await_change()
    } else {
        Action::requeue(task_pod::ABANDONED_AFTER)
    })
}

/// Writes the status over `version` of `backup` (see [`apply_status_at`]).
async fn write_status(
    backup: &PostgresBackup,
    version: &mut Option<String>,
    ctx: &Context,
    status: &PostgresBackupStatus,
) -> Result<bool> {
    let api: Api<PostgresBackup> = Api::namespaced(ctx.client.clone(), &backup.namespace().unwrap_or_default());
    Ok(apply_status_at(&api, &backup.name_any(), version, status).await?)
}

/// The WAL segment from which the other backups kept in the same archive as `backup` need
/// the WAL: where the oldest of them starts. None (no WAL is deleted) if no other backup is
/// kept there, or one of the same database is still being taken (it needs the WAL from where
/// it started, which is known only once it ends). Pure.
pub fn keep_wal_from(backup: &PostgresBackup, all: &[PostgresBackup]) -> Option<String> {
    let wal = backup.status.as_ref()?.destination.as_ref()?.wal.clone();
    let unfinished = all.iter().any(|b| {
        b.spec.postgresql == backup.spec.postgresql
            && !matches!(
                b.status.as_ref().and_then(|s| s.progress.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
    });
    if unfinished {
        return None;
    }
    all.iter()
        .filter(|b| b.name_any() != backup.name_any() && b.metadata.deletion_timestamp.is_none())
        .filter_map(|b| {
            let status = b.status.as_ref()?;
            if status.progress.phase.as_deref() != Some("Succeeded") || status.destination.as_ref()?.wal != wal {
                return None;
            }
            segment_name(status.start_wal.as_deref()?, status.timeline?)
        })
        .min_by_key(|name| crate::postgres::instance::wal::segment(name).map(|(_, position)| position))
}

/// Deletes the base backup of a deleted PostgresBackup. While a new database is being
/// restored from it, it waits. One that cannot be deleted (its keys gone, its pod unable to
/// start, the store away past the deadline) is reported and left: the PostgresBackup still goes.
async fn clean_up(backup: &PostgresBackup, ctx: &Context) -> Result<Action> {
    let status = backup.status.clone().unwrap_or_default();
    let Some(location) = status.destination.clone() else {
        return Ok(Action::await_change());
    };
    let namespace = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    let databases: Api<PostgreSQL> = Api::namespaced(ctx.client.clone(), &namespace);
    let all_databases = databases.list(&ListParams::default()).await?.items;
    if let Some(pg) = all_databases
        .iter()
        .find(|pg| crate::postgres::backups::restores_from(pg, &name))
    {
        // An error keeps the finalizer (and the backup); the deletion is tried again.
        return Err(Error::Blocked(format!(
            "PostgreSQL {} is being restored from this backup: it is kept until that database has started",
            pg.name_any()
        )));
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    if pods.get_opt(&pod_name(backup, Job::Base)).await?.is_some() {
        // A pod still taking it would put it back after: stopped first.
        remove_pod(backup, Job::Base, ctx).await?;
        return Err(Error::UnderWay(format!("stopping the pod taking backup {name}")));
    }
    let where_ = status.progress.location.clone().unwrap_or_default();
    let deleting_for = backup
        .metadata
        .deletion_timestamp
        .as_ref()
        .map_or(Duration::ZERO, |t| elapsed(t.0, jiff::Timestamp::now()));
    let pod_name = pod_name(backup, Job::Delete);
    let pod = pods.get_opt(&pod_name).await?;
    let deleted: std::result::Result<String, String> = match task_pod::outcome(pod.as_ref(), jiff::Timestamp::now()) {
        Outcome::NotStarted => {
            if let Some(claim) = Destination::of_location(&location)
                .as_ref()
                .and_then(|d| d.claim().map(str::to_string))
            {
                let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &namespace);
                if claims
                    .get_opt(&claim)
                    .await?
                    .is_none_or(|c| c.metadata.deletion_timestamp.is_some())
                {
                    info!(location = %where_, "the backup's volume is gone, and the backup with it");
                    return Ok(Action::await_change());
                }
            }
            let backups: Api<PostgresBackup> = Api::namespaced(ctx.client.clone(), &namespace);
            let all = backups.list(&ListParams::default()).await?.items;
            // A pass on a stale copy, after the finalizer went: no new pod for a backup gone.
            if !all
                .iter()
                .any(|b| b.name_any() == name && b.finalizers().iter().any(|f| f == FINALIZER))
            {
                return Ok(Action::await_change());
            }
            let keep_from = keep_wal_from(backup, &all);
            let database = all_databases.iter().find(|pg| pg.name_any() == backup.spec.postgresql);
            let version = status
                .server_version
                .clone()
                .or_else(|| database.map(|pg| pg.spec.version.clone()))
                .unwrap_or_else(|| "15".into());
            let place = Place {
                namespace: &namespace,
                postgresql: &backup.spec.postgresql,
                version: &version,
            };
            let owner = controller_reference(backup);
            let made = match owner
                .and_then(|o| pods::delete_pod(&pod_name, place, &location, keep_from.as_deref(), &ctx.image, &o))
            {
                Some(pod) => {
                    let made = create_if_missing(&pods, &pod).await;
                    crash::point("postgres backup: delete pod made");
                    made.map_err(|e| format!("pod {pod_name} cannot be made: {e}"))
                }
                None => Err("the recorded destination names no store".to_string()),
            };
            match made {
                Ok(_) if deleting_for < CLEANUP_DEADLINE => {
                    return Err(Error::UnderWay(format!("a pod deletes the backup at {where_}")));
                }
                Ok(_) => Err(format!(
                    "pod {pod_name} did not finish within {}s",
                    CLEANUP_DEADLINE.as_secs()
                )),
                Err(e) => Err(e),
            }
        }
        Outcome::Running | Outcome::Stuck(_) if deleting_for < CLEANUP_DEADLINE => {
            return Err(Error::UnderWay(format!("a pod deletes the backup at {where_}")));
        }
        Outcome::Running => Err(format!(
            "pod {pod_name} did not finish within {}s",
            CLEANUP_DEADLINE.as_secs()
        )),
        Outcome::Stuck(why) => Err(why),
        Outcome::Succeeded(said) => Ok(said),
        Outcome::Failed(why) => {
            // The next pass makes a fresh pod, until the deadline.
            remove_pod(backup, Job::Delete, ctx).await?;
            if deleting_for < CLEANUP_DEADLINE {
                return Err(Error::Blocked(format!(
                    "could not delete the backup at {where_} yet: {why}"
                )));
            }
            Err(why)
        }
    };
    match deleted {
        Ok(said) => info!(location = %where_, "deleted the backup of a deleted PostgresBackup: {said}"),
        Err(why) if deleting_for < CLEANUP_DEADLINE => {
            return Err(Error::Blocked(format!(
                "could not delete the backup at {where_} yet: {why}"
            )));
        }
        Err(why) => {
            let note = format!("could not delete the backup at {where_}: {why}; it is left in the store");
            ctx.core
                .events
                .tell(&backup.object_ref(&()), Announcement::warning("BackupKept", note))
                .await;
        }
    }
    crash::point("postgres backup: deleted, finalizer not removed");
    remove_pod(backup, Job::Delete, ctx).await?;
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::fixtures::backup;

    #[test]
    fn wal_is_kept_from_where_the_oldest_other_kept_backup_of_the_same_archive_starts() {
        let at = |name: &str, start: &str, wal_of: &str| {
            let mut b = backup(name, "shop", "Succeeded", wal_of, 100);
            if let Some(s) = b.status.as_mut() {
                s.start_wal = Some(start.into());
                s.timeline = Some(1);
            }
            b
        };
        let deleted = at("shop-1", "0/2000028", "7");
        let all = [
            deleted.clone(),
            at("shop-2", "0/9000028", "7"),
            at("shop-3", "0/5000028", "7"),
            at("other", "0/1000028", "8"),
            backup("failed", "shop", "Failed", "7", 200),
        ];
        assert_eq!(
            keep_wal_from(&deleted, &all).as_deref(),
            Some("000000010000000000000005")
        );
        assert_eq!(
            keep_wal_from(&deleted, &all[..1]),
            None,
            "the last backup: no WAL is deleted"
        );
        let mut busy = all.to_vec();
        busy.push(backup("running", "shop", "Running", "7", 300));
        assert_eq!(
            keep_wal_from(&deleted, &busy),
            None,
            "one being taken may need any of it"
        );
    }
}
