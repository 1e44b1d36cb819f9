//! One pass over a PostgresBackup: read it and its PostgreSQL → record where it goes (before
//! anything is written there) → have a pod take the base backup (`pods.rs`) → read what the
//! pod reports → status and an Event. All progress is in the status and the pod: an operator
//! restarted at any point finds the pod and goes on. A backup that is done (Succeeded or
//! Failed) is never taken again; a failed base backup is not retried (the schedule takes the
//! next one), while a backup waiting for its database or its volume waits up to
//! [`WAIT_DEADLINE`]. Deleting a PostgresBackup deletes its base backup, and the WAL only it
//! needed (a finalizer), from where its status says, so it works once the PostgreSQL is gone.

use noops_api::backup::BackupPhase;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ListParams;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use noops_api::PostgreSQL;
use noops_api::backup::BackupReason;
use noops_api::backup::WorkProgress;
use noops_api::postgres::BackupLocation;
use noops_api::postgres_backup::{PostgresBackup, PostgresBackupStatus};
use tracing::{debug, info};

use super::pods::{self, BackupOf, Job};
use super::source;
use crate::core::apply::{controller_reference, create_if_missing};
use crate::core::backup::controller::{
    Begun, Deletion, Made, backup_resource, deleting_for, finish_clean_up, remove_pod, source_of,
};
use crate::core::backup::progress::{self, Timing};
use crate::core::confirm;

/// Why a volume's claim is read before a pod is made on it: a pod made on a claim being
/// deleted waits for it for ever.
const VOLUME_BEFORE_POD: &str = "volume-before-pod";

/// What every pass of this controller shares.
pub type Context = crate::core::backup::controller::Context<noops_api::PostgreSQL>;
use crate::core::backup::schedule::elapsed;
use crate::core::backup::task_pod::{self, Outcome};
use crate::core::{Error, Result, crash};
use crate::postgres::instance::base_backup::Taken;
use crate::postgres::instance::wal::segment_name;
use crate::postgres::names::{Names, POSTGRES_REPOSITORY};
use crate::postgres::observe;
use crate::postgres::secrets;
use crate::postgres::sql::Instance;
use crate::postgres::store::{BaseBackupDestination, Destination};

/// The finalizer that deletes the base backup with the PostgresBackup.
pub const FINALIZER: &str = "noops.dev/postgres-backup";
/// How long a backup waits for its database to serve (or its volume to exist) before it fails.
pub const WAIT_DEADLINE: Duration = Duration::from_secs(600);
/// How long a base backup pod may run before it is stopped and the backup fails.
pub const RUN_DEADLINE: Duration = Duration::from_secs(6 * 3600);
/// How soon a waiting backup is looked at again, and how often a running base backup pod is
/// looked at besides when it changes.
pub const TIMING: Timing = Timing {
    wait_deadline: WAIT_DEADLINE,
    retry: Duration::from_secs(5),
    // As often as its progress in status is written.
    in_progress_check: progress::PROGRESS_EVERY,
};
/// How long a pass waits for the database to say how far a base backup has got.
const PROGRESS_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the deletion of a backup is tried before it is given up, and the PostgresBackup
/// goes anyway (its files are left in the store, with a Warning).
const CLEANUP_DEADLINE: Duration = Duration::from_secs(300);

/// How long a deletion waits for a backup of the same database being taken to end (below
/// [`CLEANUP_DEADLINE`]).
const WAL_WAIT: Duration = Duration::from_secs(120);

backup_resource!(PostgresBackup, PostgresBackupStatus, FINALIZER);

/// Where a backup stands after this pass.
type Verdict = progress::Verdict<Box<Taken>>;

fn pod_name(backup: &PostgresBackup, job: Job) -> String {
    task_pod::name(&backup.name_any(), &backup.uid().unwrap_or_default(), job.verb())
}

/// The database a backup is taken of: confirmed with the API server when the cache holds
/// none (the backup waits for it), or one with no spec.backup while the backup records nowhere
/// yet (it fails on that word).
pub async fn observe(backup: &PostgresBackup, ctx: &Context) -> Result<Option<PostgreSQL>> {
    let recorded = backup.status.as_ref().is_some_and(|s| s.destination.is_some());
    let says_where = |pg: &PostgreSQL| recorded || pg.spec.backup.as_ref().and_then(Destination::of_spec).is_some();
    source_of(
        ctx,
        &backup.namespace().unwrap_or_default(),
        &backup.spec.postgresql,
        says_where,
    )
    .await
}

/// One look at a backup not done yet (see [`look`]), and how far its pod has got.
pub async fn make(
    backup: &PostgresBackup,
    pg: Option<&PostgreSQL>,
    mut begun: Begun<PostgresBackup>,
    ctx: &Context,
) -> Result<Option<Made<PostgresBackup>>> {
    let Some(verdict) = look(backup, pg, &mut begun, ctx).await? else {
        return Ok(None);
    };
    // Read every so often while it runs (a read opens a connection to the database), and
    // written only then: a status write wakes the next pass.
    let previous = begun.status.progress.under_way.clone();
    let under_way = match &verdict {
        Verdict::InProgress { .. } if progress::progress_due(previous.as_ref(), begun.now) => {
            let read = match pg {
                Some(pg) => tokio::time::timeout(
                    PROGRESS_READ_TIMEOUT,
                    streamed(pg, begun.status.instance.as_deref(), ctx),
                )
                .await
                .ok()
                .flatten(),
                None => None,
            };
            progress::paced(previous.as_ref(), read, begun.now)
        }
        Verdict::InProgress { .. } => previous,
        _ => None,
    };
    Ok(Some(begun.made(
        verdict,
        |status, taken| record_taken(status, *taken),
        under_way,
    )))
}

/// How far the running base backup has got, as `instance`, the server that streams it, says
/// (a backup begun before the status named it: the first instance); none if it cannot say now
/// (the report is news, not a reason to fail).
async fn streamed(pg: &PostgreSQL, instance: Option<&str>, ctx: &Context) -> Option<WorkProgress> {
    let names = Names::of(pg);
    let namespace = &names.namespace;
    let pod = ctx.source_pod(namespace, &instance.map_or_else(|| names.instance(), str::to_string))?;
    let ip = observe::ready_address(&pod)?;
    let secret = ctx.secret(namespace, &names.superuser_secret()).await.ok()??;
    let password = secrets::superuser_password(&secret)?;
    match Instance::connect(&ip, &password).await {
        Ok(instance) => instance.base_backup_progress().await.ok().flatten(),
        Err(e) => {
            debug!(error = %e, "cannot ask the instance how far the base backup has got");
            None
        }
    }
}

/// One look at the backup of database `pg` (as observed): where it goes (recorded first), its
/// pod; `None` if the backup changed since it was read (its status is written only over the
/// version read).
async fn look(
    backup: &PostgresBackup,
    pg: Option<&PostgreSQL>,
    begun: &mut Begun<PostgresBackup>,
    ctx: &Context,
) -> Result<Option<Verdict>> {
    let (started, now) = (begun.started, begun.now);
    let verdict = match (pg, begun.status.destination.clone()) {
        // Applied with its database, maybe a moment before it: waits for it a while. Or the
        // database was deleted while its backup was under way: what the pod did still counts
        // (a backup it stored is whole, and is kept as such).
        (None, destination) => {
            let under_way = match destination {
                Some(_) => pod_progress(backup, started, now, ctx).await?,
                None => None,
            };
            under_way.unwrap_or_else(|| Verdict::Wait {
                reason: BackupReason::PostgreSQLNotFound,
                message: format!(
                    "PostgreSQL {:?} does not exist in this namespace",
                    backup.spec.postgresql
                ),
            })
        }
        // Once recorded, where it goes stays: a pass after the database's destination was
        // edited (or removed) still goes where the status says.
        (Some(pg), Some(location)) => attempt(backup, pg, &location, (started, now), &mut begun.status, ctx).await?,
        (Some(pg), None) => match where_to(pg, &backup.name_any()) {
            Err(verdict) => verdict,
            Ok((location, url)) => {
                // Recorded before anything is written, so that a deletion finds it whatever
                // happens next.
                let status = &mut begun.status;
                status.progress.phase = Some(BackupPhase::Running);
                status.progress.started_at = Some(Time(started));
                status.destination = Some(location.clone());
                status.progress.location = Some(url.clone());
                status.pod = Some(pod_name(backup, Job::Base));
                if !begun.record_ahead(ctx, backup).await? {
                    return Ok(None);
                }
                crash::point("postgres backup: destination recorded, no pod made");
                info!(postgresql = %backup.spec.postgresql, location = %url, "backing up");
                attempt(backup, pg, &location, (started, now), &mut begun.status, ctx).await?
            }
        },
    };
    Ok(Some(verdict))
}

/// Records what a base backup pod stored in `status`, and says it.
fn record_taken(status: &mut PostgresBackupStatus, taken: Taken) -> String {
    crash::point("postgres backup: stored, status not written");
    let note = format!(
        "stored a base backup of {} bytes at {}: WAL {} to {} on timeline {}",
        taken.size,
        status.progress.location.clone().unwrap_or_default(),
        taken.start_wal,
        taken.end_wal,
        taken.timeline
    );
    if let Some(location) = status.destination.as_mut() {
        // Taken from the database that serves now (a new one since it began, if its volume
        // was lost meanwhile): its WAL is that database's.
        let root = location.wal.rsplit_once("/wal/").map(|(root, _)| root.to_string());
        if let Some(root) = root {
            location.wal = crate::postgres::store::wal_folder(&root, &taken.system_identifier);
        }
    }
    status.progress.size = Some(taken.size);
    status.progress.sha256 = Some(taken.sha256);
    status.start_wal = Some(taken.start_wal);
    status.end_wal = Some(taken.end_wal);
    status.timeline = Some(taken.timeline);
    status.system_identifier = Some(taken.system_identifier);
    status.server_version = Some(taken.server_version);
    note
}

/// Where the backup of `pg` named `backup` goes: its location and URL; or why it cannot be
/// taken (the database has no destination, or has never run).
fn where_to(pg: &PostgreSQL, backup: &str) -> std::result::Result<(BackupLocation, String), Verdict> {
    let names = Names::of(pg);
    let Some(destination) = pg.spec.backup.as_ref().and_then(Destination::of_spec) else {
        return Err(Verdict::Failed {
            reason: BackupReason::NoDestination,
            message: format!(
                "PostgreSQL {} has no spec.backup: it does not say where backups go",
                names.name
            ),
        });
    };
    let Some(system_id) = pg.status.as_ref().and_then(|s| s.system_identifier.clone()) else {
        return Err(Verdict::Wait {
            reason: BackupReason::NotServing,
            message: format!("PostgreSQL {} has not served yet", names.name),
        });
    };
    let root = destination.folder(&names.namespace, &names.name);
    let location = destination.location(&root, backup, &system_id);
    let url = destination.url(&location.base);
    Ok((location, url))
}

/// One look at the pod that takes the backup: made if there is none (once an instance it may
/// read serves, `source.rs`; the one chosen goes in `status.instance`), read once it has
/// ended, stopped past [`RUN_DEADLINE`].
async fn attempt(
    backup: &PostgresBackup,
    pg: &PostgreSQL,
    location: &BackupLocation,
    (started, now): (jiff::Timestamp, jiff::Timestamp),
    status: &mut PostgresBackupStatus,
    ctx: &Context,
) -> Result<Verdict> {
    if let Some(verdict) = pod_progress(backup, started, now, ctx).await? {
        return Ok(verdict);
    }
    let names = Names::pulling_from(pg, &ctx.images);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let name = pod_name(backup, Job::Base);
    if let Some(claim) = Destination::of_location(location)
        .as_ref()
        .and_then(|d| d.claim().map(str::to_string))
    {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &names.namespace);
        if confirm::get(&claims, &claim, VOLUME_BEFORE_POD).await?.is_none() {
            return Ok(Verdict::Wait {
                reason: BackupReason::ClaimNotFound,
                message: format!(
                    "PersistentVolumeClaim {claim:?} (backup.volume.claimName) does not exist in this namespace"
                ),
            });
        }
    }
    let candidates = source::candidates(pg, &names);
    let mut chosen = None;
    for candidate in &candidates {
        let pod = ctx.source_pod(&names.namespace, &candidate.instance);
        if let Some(host) = pod.as_deref().and_then(observe::ready_address) {
            chosen = Some((candidate, host));
            break;
        }
    }
    let Some((source, host)) = chosen else {
        let primary = candidates.last().map(|c| c.instance.clone()).unwrap_or_default();
        return Ok(Verdict::Wait {
            reason: BackupReason::InstanceNotReady,
            message: format!("the primary {primary} is not serving: a base backup waits for it"),
        });
    };
    let Some(owner) = controller_reference(backup) else {
        return Ok(Verdict::Wait {
            reason: BackupReason::NotStored,
            message: "the PostgresBackup has no uid yet".into(),
        });
    };
    let version = &pg.spec.version;
    let from = pods::Reading {
        host: &host,
        // From a replica, the pod waits for the primary to archive the WAL the backup ends
        // in, asking it to switch segments through `<name>-rw`.
        primary: source.standby.then(|| names.primary_host()),
        max_rate_kib: pg.spec.backup.as_ref().and_then(|b| b.base_backup_max_rate),
    };
    let Some(pod) = pods::base_pod(
        &name,
        &backup.name_any(),
        &names,
        version,
        &from,
        location,
        &ctx.image,
        &ctx.images,
        &owner,
    ) else {
        return Ok(Verdict::Failed {
            reason: BackupReason::NoDestination,
            message: "the recorded destination names no store".into(),
        });
    };
    if create_if_missing(&pods, &pod).await? {
        crash::point("postgres backup: pod made");
        info!(pod = %name, instance = %source.instance, standby = source.standby, "a pod takes the base backup");
    }
    status.instance = Some(source.instance.clone());
    Ok(taking(&name))
}

fn taking(pod: &str) -> Verdict {
    Verdict::InProgress {
        message: format!("pod {pod} takes the base backup"),
    }
}

/// How the backup's pod is doing, once it was made (None: it was not).
async fn pod_progress(
    backup: &PostgresBackup,
    started: jiff::Timestamp,
    now: jiff::Timestamp,
    ctx: &Context,
) -> Result<Option<Verdict>> {
    let name = pod_name(backup, Job::Base);
    let pod = ctx.task_pod(&backup.namespace().unwrap_or_default(), &name);
    Ok(Some(match task_pod::outcome(pod.as_deref(), now) {
        Outcome::NotStarted => return Ok(None),
        Outcome::Running if elapsed(started, now) >= RUN_DEADLINE => {
            remove_pod(ctx, backup, &pod_name(backup, Job::Base)).await?;
            Verdict::Failed {
                reason: BackupReason::BackupTooLong,
                message: format!("pod {name} did not finish within {}s", RUN_DEADLINE.as_secs()),
            }
        }
        Outcome::Running => taking(&name),
        Outcome::Stuck(message) => Verdict::Wait {
            reason: BackupReason::BackupPodStuck,
            message,
        },
        Outcome::Succeeded(message) => match serde_json::from_str::<Taken>(&message) {
            Ok(taken) => Verdict::Succeeded(Box::new(taken)),
            Err(_) => Verdict::Failed {
                reason: BackupReason::BaseBackupFailed,
                message: format!("pod {name} ended without saying what it stored: {message:?}"),
            },
        },
        Outcome::Failed(message) => Verdict::Failed {
            reason: BackupReason::BaseBackupFailed,
            message,
        },
    }))
}

/// Whether `b` is still being taken (neither stored nor failed) and will be kept. One being
/// deleted will never be kept (its pod is stopped first), so the WAL it would need does not
/// matter; counting it made two unfinished backups deleted together wait for each other.
fn being_taken(b: &PostgresBackup) -> bool {
    b.metadata.deletion_timestamp.is_none()
        && !matches!(
            b.status.as_ref().and_then(|s| s.progress.phase),
            Some(BackupPhase::Succeeded | BackupPhase::Failed)
        )
}

/// The other backups kept in the same WAL archive as `backup`: stored, and not being deleted
/// unless a new database still restores from one (`restoring`: its deletion waits for that
/// restore, which needs the WAL from its start).
fn kept_beside<'a>(backup: &PostgresBackup, all: &'a [PostgresBackup], restoring: &[&str]) -> Vec<&'a PostgresBackup> {
    let archive = |b: &PostgresBackup| Some(b.status.as_ref()?.destination.as_ref()?.wal.clone());
    let Some(wal) = archive(backup) else {
        return Vec::new();
    };
    all.iter()
        .filter(|b| {
            b.name_any() != backup.name_any()
                && (b.metadata.deletion_timestamp.is_none() || restoring.contains(&b.name_any().as_str()))
        })
        .filter(|b| {
            b.status
                .as_ref()
                .is_some_and(|s| s.progress.phase == Some(BackupPhase::Succeeded))
        })
        .filter(|b| archive(b).as_ref() == Some(&wal))
        .collect()
}

/// The WAL segment from which the other backups kept in the same archive as `backup` need
/// the WAL: where the oldest of them starts. None (no WAL is deleted) if no other backup is
/// kept there, or one of the same database is still being taken (it needs the WAL from where
/// it started, which is known only once it ends). Pure.
pub fn keep_wal_from(backup: &PostgresBackup, all: &[PostgresBackup], restoring: &[&str]) -> Option<String> {
    if all
        .iter()
        .any(|b| b.spec.postgresql == backup.spec.postgresql && being_taken(b))
    {
        return None;
    }
    kept_beside(backup, all, restoring)
        .into_iter()
        .filter_map(|b| {
            let status = b.status.as_ref()?;
            segment_name(status.start_wal.as_deref()?, status.timeline?)
        })
        .min_by_key(|name| crate::postgres::instance::wal::segment(name).map(|(_, position)| position))
}

/// Whether the deletion of `backup` waits for another backup of the same database still being
/// taken: it would leave all the WAL (see [`keep_wal_from`]) while another kept backup could
/// let it go once that one ends. Pure.
pub fn waits_for_a_backup_being_taken(backup: &PostgresBackup, all: &[PostgresBackup], restoring: &[&str]) -> bool {
    !kept_beside(backup, all, restoring).is_empty()
        && all
            .iter()
            .any(|b| b.name_any() != backup.name_any() && b.spec.postgresql == backup.spec.postgresql && being_taken(b))
}

/// Deletes the base backup of a deleted PostgresBackup. While a new database is being
/// restored from it, it waits. One that cannot be deleted (its keys gone, its pod unable to
/// start, the store away past the deadline) is reported and left: the PostgresBackup still goes.
pub async fn clean_up(backup: Arc<PostgresBackup>, ctx: &Context) -> Result<Action> {
    let backup = &*backup;
    let status = backup.status.clone().unwrap_or_default();
    let Some(location) = status.destination.clone() else {
        return Ok(Action::await_change());
    };
    let namespace = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    let databases: Api<PostgreSQL> = Api::namespaced(ctx.client.clone(), &namespace);
    // Confirmed: the backup (and the WAL only it needed) is deleted on this word.
    let all_databases = confirm::list(&databases, &ListParams::default(), "restoring-before-delete")
        .await?
        .items;
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
    // Confirmed with the API, not the cache: a pod made a moment ago that the cache does not
    // hold yet would put the backup back after its deletion.
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    if confirm::get(&pods, &pod_name(backup, Job::Base), "base-pod-before-delete")
        .await?
        .is_some()
    {
        // A pod still taking it would put it back after: stopped first.
        remove_pod(ctx, backup, &pod_name(backup, Job::Base)).await?;
        return Err(Error::UnderWay(format!("stopping the pod taking backup {name}")));
    }
    let what = format!("the backup at {}", status.progress.location.clone().unwrap_or_default());
    let deleting_for = deleting_for(backup, jiff::Timestamp::now());
    let under_way = || Error::UnderWay(format!("a pod deletes {what}"));
    let delete_pod = pod_name(backup, Job::Delete);
    let pod = ctx.task_pod(&namespace, &delete_pod);
    let too_long = || format!("pod {delete_pod} did not finish within {}s", CLEANUP_DEADLINE.as_secs());
    let deleted: Deletion = match task_pod::outcome(pod.as_deref(), jiff::Timestamp::now()) {
        Outcome::NotStarted => {
            let database = all_databases.iter().find(|pg| pg.name_any() == backup.spec.postgresql);
            let restoring: Vec<&str> = all_databases
                .iter()
                .filter_map(crate::postgres::backups::starting_from)
                .collect();
            match start_deletion(backup, &location, (database, &restoring), ctx).await? {
                Some(deleted) => deleted,
                None if deleting_for < CLEANUP_DEADLINE => return Err(under_way()),
                None => Err((too_long(), true)),
            }
        }
        Outcome::Running | Outcome::Stuck(_) if deleting_for < CLEANUP_DEADLINE => return Err(under_way()),
        Outcome::Running => Err((too_long(), true)),
        Outcome::Stuck(why) => Err((why, true)),
        Outcome::Succeeded(said) => Ok(format!("deleted: {said}")),
        Outcome::Failed(why) => {
            // The next pass makes a fresh pod, until the deadline.
            remove_pod(ctx, backup, &delete_pod).await?;
            Err((why, true))
        }
    };
    if deleted.is_ok() {
        crash::point("postgres backup: deleted, finalizer not removed");
    }
    finish_clean_up(ctx, backup, deleted, CLEANUP_DEADLINE, &what, "BackupKept", &delete_pod).await
}

/// Makes the pod that deletes `backup` at `location` (with the WAL only it needed): `None`
/// once it is made, or what came of it when there is nothing to delete or no pod can be made.
async fn start_deletion(
    backup: &PostgresBackup,
    location: &BackupLocation,
    (database, restoring): (Option<&PostgreSQL>, &[&str]),
    ctx: &Context,
) -> Result<Option<Deletion>> {
    let namespace = backup.namespace().unwrap_or_default();
    if let Some(claim) = Destination::of_location(location)
        .as_ref()
        .and_then(|d| d.claim().map(str::to_string))
    {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &namespace);
        if confirm::get(&claims, &claim, VOLUME_BEFORE_POD)
            .await?
            .is_none_or(|c| c.metadata.deletion_timestamp.is_some())
        {
            return Ok(Some(Ok("the volume is gone, and the backup with it".into())));
        }
    }
    let backups: Api<PostgresBackup> = Api::namespaced(ctx.client.clone(), &namespace);
    // Confirmed: which WAL the others still need decides what is deleted.
    let all = confirm::list(&backups, &ListParams::default(), "backups-before-wal-prune")
        .await?
        .items;
    // A pass on a stale copy, after the finalizer went: no new pod for a backup gone.
    if !all
        .iter()
        .any(|b| b.name_any() == backup.name_any() && b.finalizers().iter().any(|f| f == FINALIZER))
    {
        return Ok(Some(Ok("nothing to do: its finalizer was gone already".into())));
    }
    // A backup being taken may need any of the WAL: the deletion waits a while for it to end,
    // so that the WAL no kept backup needs goes too (deleting each backup while another runs,
    // as a frequent schedule does, left it forever). Past that, the backup goes and its WAL
    // stays.
    if deleting_for(backup, jiff::Timestamp::now()) < WAL_WAIT
        && waits_for_a_backup_being_taken(backup, &all, restoring)
    {
        return Err(Error::UnderWay(format!(
            "waiting up to {}s for a backup of {} being taken to end, so that the WAL only backup {} needed goes too",
            WAL_WAIT.as_secs(),
            backup.spec.postgresql,
            backup.name_any()
        )));
    }
    let keep_from = keep_wal_from(backup, &all, restoring);
    let version = backup
        .status
        .as_ref()
        .and_then(|s| s.server_version.clone())
        .or_else(|| database.map(|pg| pg.spec.version.clone()))
        .unwrap_or_else(|| "15".into());
    // The database may be gone: then its programs come from the default repository.
    let repository = match database {
        Some(pg) => Names::pulling_from(pg, &ctx.images).image_repository,
        None => ctx.images.repository(POSTGRES_REPOSITORY, None),
    };
    let place = BackupOf {
        namespace: &namespace,
        postgresql: &backup.spec.postgresql,
        repository: &repository,
        version: &version,
    };
    let name = pod_name(backup, Job::Delete);
    let keep_from = keep_from.as_deref();
    let Some(pod) = controller_reference(backup)
        .and_then(|owner| pods::delete_pod(&name, place, location, keep_from, &ctx.image, &ctx.images, &owner))
    else {
        return Ok(Some(Err(("the recorded destination names no store".into(), true))));
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let made = create_if_missing(&pods, &pod).await;
    crash::point("postgres backup: delete pod made");
    Ok(match made {
        Ok(_) => None,
        // Its namespace is going: no pod will ever be made there, so the files stay.
        Err(e) if crate::core::error::namespace_terminating(&e) => Some(Err((
            format!("pod {name} cannot be made: its namespace is being deleted"),
            false,
        ))),
        Err(e) => Some(Err((format!("pod {name} cannot be made: {e}"), true))),
    })
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
            keep_wal_from(&deleted, &all, &[]).as_deref(),
            Some("000000010000000000000005")
        );
        assert_eq!(
            keep_wal_from(&deleted, &all[..1], &[]),
            None,
            "the last backup: no WAL is deleted"
        );
        assert!(!waits_for_a_backup_being_taken(&deleted, &all, &[]));
        let mut busy = all.to_vec();
        busy.push(backup("running", "shop", "Running", "7", 300));
        assert_eq!(
            keep_wal_from(&deleted, &busy, &[]),
            None,
            "one being taken may need any of it"
        );
        assert!(
            waits_for_a_backup_being_taken(&deleted, &busy, &[]),
            "its end lets the WAL go"
        );
        assert!(
            !waits_for_a_backup_being_taken(
                &deleted,
                &[deleted.clone(), backup("running", "shop", "Running", "7", 300)],
                &[]
            ),
            "no other backup kept: the WAL stays whatever happens"
        );
        // Retention deletes a backup not taken yet once newer ones are stored: being
        // deleted, it is never kept, so neither the WAL nor another deletion waits for it.
        let being_deleted = |mut b: PostgresBackup| {
            b.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                jiff::Timestamp::now(),
            ));
            b
        };
        let mut stopping = all.to_vec();
        stopping.push(being_deleted(backup("superseded", "shop", "Running", "7", 300)));
        assert_eq!(
            keep_wal_from(&deleted, &stopping, &[]).as_deref(),
            Some("000000010000000000000005")
        );
        assert!(!waits_for_a_backup_being_taken(&deleted, &stopping, &[]));
        // A backup being deleted that a new database still restores from keeps the WAL from
        // its start: the restore needs it, and that backup's own deletion waits for it.
        let mut with_restore = all.to_vec();
        with_restore.push(being_deleted(at("shop-0", "0/3000028", "7")));
        assert_eq!(
            keep_wal_from(&deleted, &with_restore, &[]).as_deref(),
            Some("000000010000000000000005"),
            "deleted and restored from by no one: not kept"
        );
        assert_eq!(
            keep_wal_from(&deleted, &with_restore, &["shop-0"]).as_deref(),
            Some("000000010000000000000003")
        );
    }
}
