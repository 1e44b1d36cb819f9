//! One pass over an EtcdBackup: read its cluster → check it can be backed up → stream a
//! snapshot from a healthy member into the cluster's bucket → status and an Event. A backup
//! that is done (Succeeded or Failed) is never made again; one interrupted (an operator
//! restart, a member or the store away for a moment) is tried again under the same key until
//! [`BACKUP_DEADLINE`], then fails. Deleting an EtcdBackup deletes its snapshot (a
//! finalizer), from the store recorded in its status, so it works once the cluster is gone.

use noops_api::backup::BackupPhase;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ListParams;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use noops_api::EtcdCluster;
use noops_api::backup::BackupReason;
use noops_api::etcd::{S3Destination, VolumeDestination};
use noops_api::etcd_backup::{EtcdBackup, EtcdBackupStatus};
use tracing::info;

use super::volume::{self, Job, Outcome};
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
pub type Context = crate::core::backup::controller::Context<noops_api::EtcdCluster>;
use crate::core::backup::schedule::elapsed;
use crate::core::{Error, Result, crash};
use crate::etcd::client::{Credentials, EtcdAccess};
use crate::etcd::names::{CLUSTER_LABEL, Names};
use crate::etcd::observe;
use crate::etcd::snapshot::{self, TakeError};
use crate::etcd::store::{self, Destination, SnapshotDestination};

/// The finalizer that deletes the snapshot with the EtcdBackup.
pub const FINALIZER: &str = "noops.dev/etcd-backup-snapshot";
/// How long a backup is tried before it fails.
pub const BACKUP_DEADLINE: Duration = Duration::from_secs(600);
/// How soon an interrupted backup is tried again, and how often a pod saving one is looked at
/// besides when it changes.
pub const TIMING: Timing = Timing {
    wait_deadline: BACKUP_DEADLINE,
    retry: Duration::from_secs(5),
    in_progress_check: Duration::from_secs(10),
};

backup_resource!(EtcdBackup, EtcdBackupStatus, FINALIZER);

/// Where a backup stands after this pass.
type Verdict = progress::Verdict<snapshot::Taken>;

fn pod_name(backup: &EtcdBackup, job: Job) -> String {
    volume::pod_name(&backup.name_any(), &backup.uid().unwrap_or_default(), job)
}

/// The cluster a backup is taken of: confirmed with the API server when the cache holds none,
/// or one with no spec.backup while the backup records nowhere yet (it fails on either word).
pub async fn observe(backup: &EtcdBackup, ctx: &Context) -> Result<Option<EtcdCluster>> {
    let recorded = backup.status.as_ref().and_then(Destination::of_status).is_some();
    let says_where = |c: &EtcdCluster| recorded || c.spec.backup.as_ref().and_then(Destination::of_spec).is_some();
    source_of(
        ctx,
        &backup.namespace().unwrap_or_default(),
        &backup.spec.cluster,
        says_where,
    )
    .await
}

/// One look at a backup not done yet (see [`take_or_go_on`]).
pub async fn make(
    backup: &EtcdBackup,
    cluster: Option<&EtcdCluster>,
    mut begun: Begun<EtcdBackup>,
    ctx: &Context,
) -> Result<Option<Made<EtcdBackup>>> {
    let Some(verdict) = take_or_go_on(backup, cluster, &mut begun, ctx).await? else {
        return Ok(None);
    };
    // (A snapshot is small and quick: it reports no progress while it runs.)
    Ok(Some(begun.made(verdict, record_snapshot, None)))
}

/// Records what a snapshot stored in `status`, and says it.
fn record_snapshot(status: &mut EtcdBackupStatus, taken: snapshot::Taken) -> String {
    crash::point("backup: snapshot stored, status not written");
    let note = format!(
        "stored revision {} of cluster {:x} ({} bytes, etcd {}) at {}",
        taken.revision,
        taken.cluster_id,
        taken.size,
        taken.version,
        status.progress.location.clone().unwrap_or_default()
    );
    status.progress.size = Some(taken.size);
    status.progress.sha256 = Some(taken.sha256);
    status.revision = Some(taken.revision);
    status.etcd_version = Some(taken.version);
    status.cluster_id = Some(format!("{:x}", taken.cluster_id));
    note
}

/// The snapshot taken (or one more attempt at it), recorded where it goes first: what came of
/// it, or `None` if the backup changed since it was read (its status is written only over the
/// version read).
async fn take_or_go_on(
    backup: &EtcdBackup,
    cluster: Option<&EtcdCluster>,
    begun: &mut Begun<EtcdBackup>,
    ctx: &Context,
) -> Result<Option<Verdict>> {
    let namespace = backup.namespace().unwrap_or_default();
    let started = begun.started;
    let status = &mut begun.status;
    Ok(Some(match cluster {
        None => Verdict::Failed {
            reason: BackupReason::ClusterNotFound,
            message: format!("EtcdCluster {:?} does not exist in this namespace", backup.spec.cluster),
        },
        Some(cluster) => {
            let recorded = Destination::of_status(status).zip(status.key.clone());
            match (recorded, cluster.spec.backup.as_ref().and_then(Destination::of_spec)) {
                // Once recorded, where it goes stays: a retry after the cluster's destination
                // was edited (or removed) still goes where the status says.
                (Some((destination, key)), _) => {
                    attempt_until_deadline(backup, cluster, &destination, &key, started, ctx).await?
                }
                (None, None) => Verdict::Failed {
                    reason: BackupReason::NoDestination,
                    message: format!(
                        "EtcdCluster {:?} has no spec.backup: it does not say where backups go",
                        backup.spec.cluster
                    ),
                },
                (None, Some(destination)) => {
                    let key = destination.key(&namespace, &backup.spec.cluster, &backup.name_any());
                    // Recorded before anything is written, so that a deletion finds it
                    // whatever happens next.
                    status.progress.phase = Some(BackupPhase::Running);
                    status.progress.started_at = Some(Time(started));
                    destination.record(status);
                    status.key = Some(key.clone());
                    status.progress.location = Some(destination.url(&key));
                    if !begun.record_ahead(ctx, backup).await? {
                        return Ok(None);
                    }
                    info!(cluster = %backup.spec.cluster, location = %destination.url(&key), "backing up");
                    attempt_until_deadline(backup, cluster, &destination, &key, started, ctx).await?
                }
            }
        }
    }))
}

/// One attempt with what is left of the backup's deadline: a snapshot stream that stalls (a
/// member or the store that stops answering without an error) does not hold it Running.
async fn attempt_until_deadline(
    backup: &EtcdBackup,
    cluster: &EtcdCluster,
    destination: &Destination,
    key: &str,
    started: jiff::Timestamp,
    ctx: &Context,
) -> Result<Verdict> {
    let left = BACKUP_DEADLINE.saturating_sub(elapsed(started, jiff::Timestamp::now()));
    match destination {
        Destination::S3(bucket) => attempt_to_bucket(cluster, bucket, key, left, ctx).await,
        Destination::Volume(volume) => attempt_to_volume(backup, cluster, volume, key, left, ctx).await,
    }
}

/// A healthy voting member to take a snapshot from (a follower first: a snapshot is work the
/// leader is spared), and the client certificate; or why there is none.
async fn source(
    cluster: &EtcdCluster,
    ctx: &Context,
) -> Result<std::result::Result<(String, Option<Credentials>), Verdict>> {
    let names = Names::of(cluster);
    let namespace = &names.namespace;
    let members: Vec<Arc<Pod>> = ctx
        .source_pods
        .state()
        .into_iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(namespace.as_str()))
        .filter(|p| p.labels().get(CLUSTER_LABEL) == Some(&names.cluster))
        .collect();
    let status = cluster.status.clone().unwrap_or_default();
    let mut healthy: Vec<_> = status
        .members
        .iter()
        .filter(|m| m.healthy && !m.learner && m.id.is_some())
        .collect();
    healthy.sort_by_key(|m| m.leader);
    let endpoint = healthy.iter().find_map(|m| {
        let pod = members
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(m.name.as_str()))?;
        observe::pod_endpoint(pod, &names)
    });
    let Some(endpoint) = endpoint else {
        return Ok(Err(Verdict::Wait {
            reason: BackupReason::NoHealthyMember,
            message: format!("no healthy member of {} to take a snapshot from", names.cluster),
        }));
    };
    if !names.tls {
        return Ok(Ok((endpoint, None)));
    }
    let Some(secret) = ctx.secret(namespace, &names.client_secret()).await? else {
        return Ok(Err(Verdict::Wait {
            reason: BackupReason::NoClientCertificate,
            message: format!("Secret {} is not there yet", names.client_secret()),
        }));
    };
    Ok(Ok((endpoint, observe::credentials_from(&secret, &names))))
}

/// One attempt at streaming a snapshot of `cluster` to `key` in a bucket, within `limit`.
async fn attempt_to_bucket(
    cluster: &EtcdCluster,
    destination: &S3Destination,
    key: &str,
    limit: Duration,
    ctx: &Context,
) -> Result<Verdict> {
    let (endpoint, credentials) = match source(cluster, ctx).await? {
        Ok(found) => found,
        Err(verdict) => return Ok(verdict),
    };
    let bucket = match store::open(&ctx.client, &Names::of(cluster).namespace, destination).await {
        Ok(bucket) => bucket,
        Err(e) => {
            return Ok(Verdict::Wait {
                reason: BackupReason::StoreUnavailable,
                message: e.to_string(),
            });
        }
    };
    Ok(
        match snapshot::take(&EtcdAccess::new(credentials), &endpoint, bucket, key, limit).await {
            Ok(taken) => Verdict::Succeeded(taken),
            Err(e @ TakeError::Stalled(_)) => Verdict::Wait {
                reason: BackupReason::SnapshotStalled,
                message: e.to_string(),
            },
            Err(e @ (TakeError::Etcd(_) | TakeError::Stream(_) | TakeError::Empty)) => Verdict::Wait {
                reason: BackupReason::SnapshotFailed,
                message: e.to_string(),
            },
            Err(e @ TakeError::Store(_)) => Verdict::Wait {
                reason: BackupReason::UploadFailed,
                message: e.to_string(),
            },
        },
    )
}

/// One look at the pod that saves a snapshot of `cluster` to `key` in a volume: it is made
/// if there is none, read once it has ended, and removed after a failure (the next attempt
/// makes a fresh one) or once `limit` is spent.
async fn attempt_to_volume(
    backup: &EtcdBackup,
    cluster: &EtcdCluster,
    destination: &VolumeDestination,
    key: &str,
    limit: Duration,
    ctx: &Context,
) -> Result<Verdict> {
    let names = Names::of(cluster);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let name = volume::pod_name(&backup.name_any(), &backup.uid().unwrap_or_default(), Job::Save);
    let pod = ctx.task_pod(&names.namespace, &name);
    match volume::outcome(pod.as_deref(), jiff::Timestamp::now()) {
        Outcome::NotStarted => {
            let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &names.namespace);
            if confirm::get(&claims, &destination.claim_name, VOLUME_BEFORE_POD)
                .await?
                .is_none()
            {
                return Ok(Verdict::Wait {
                    reason: BackupReason::ClaimNotFound,
                    message: format!(
                        "PersistentVolumeClaim {:?} (backup.volume.claimName) does not exist in this namespace",
                        destination.claim_name
                    ),
                });
            }
            let endpoint = match source(cluster, ctx).await? {
                Ok((endpoint, _)) => endpoint,
                Err(verdict) => return Ok(verdict),
            };
            let Some(owner) = controller_reference(backup) else {
                return Ok(Verdict::Wait {
                    reason: BackupReason::NotStored,
                    message: "the EtcdBackup has no uid yet".into(),
                });
            };
            // The pod is given a little less than what is left, so that it reports before
            // the operator gives up on it.
            let seconds = limit.as_secs().saturating_sub(10).max(10);
            let pod = volume::save_pod(
                &name,
                &names,
                destination,
                key,
                &endpoint,
                seconds,
                &ctx.image,
                &ctx.images,
                &owner,
            );
            if create_if_missing(&pods, &pod).await? {
                info!(pod = %name, %endpoint, "a pod saves the snapshot into the volume");
            }
            Ok(saving(&name))
        }
        Outcome::Running if limit.is_zero() => {
            remove_pod(ctx, backup, &pod_name(backup, Job::Save)).await?;
            Ok(Verdict::Wait {
                reason: BackupReason::SnapshotStalled,
                message: format!("pod {name} did not save the snapshot in time"),
            })
        }
        Outcome::Running => Ok(saving(&name)),
        Outcome::Stuck(message) => Ok(Verdict::Wait {
            reason: BackupReason::BackupPodStuck,
            message,
        }),
        Outcome::Succeeded(message) => match volume::saved(&message).and_then(|s| s.into_taken()) {
            Some(taken) => Ok(Verdict::Succeeded(taken)),
            None => {
                remove_pod(ctx, backup, &pod_name(backup, Job::Save)).await?;
                Ok(Verdict::Wait {
                    reason: BackupReason::SnapshotFailed,
                    message: format!("pod {name} ended without saying what it saved: {message:?}"),
                })
            }
        },
        Outcome::Failed(message) => {
            remove_pod(ctx, backup, &pod_name(backup, Job::Save)).await?;
            Ok(Verdict::Wait {
                reason: BackupReason::SnapshotFailed,
                message,
            })
        }
    }
}

fn saving(pod: &str) -> Verdict {
    Verdict::InProgress {
        message: format!("pod {pod} saves the snapshot into the volume"),
    }
}

/// How long the deletion of a snapshot is tried (the store away for a moment) before it is
/// given up, and the EtcdBackup goes anyway.
const CLEANUP_DEADLINE: Duration = Duration::from_secs(300);

/// Deletes the snapshot of a deleted EtcdBackup. While a new cluster is being restored from it,
/// it waits. One that cannot be deleted (its keys gone, or the store away past the deadline)
/// is reported and left: the EtcdBackup still goes.
pub async fn clean_up(backup: Arc<EtcdBackup>, ctx: &Context) -> Result<Action> {
    let backup = &*backup;
    let status = backup.status.clone().unwrap_or_default();
    let (Some(destination), Some(key)) = (Destination::of_status(&status), status.key) else {
        return Ok(Action::await_change());
    };
    let namespace = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    let clusters: Api<EtcdCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    // Confirmed: the snapshot is deleted on this word.
    let restoring = confirm::list(&clusters, &ListParams::default(), "restoring-before-delete")
        .await?
        .items
        .into_iter()
        .find(|c| crate::etcd::backups::restores_from(c, &name));
    if let Some(cluster) = restoring {
        let note = format!(
            "EtcdCluster {} is being restored from this backup: its snapshot is kept until that cluster has started",
            cluster.name_any()
        );
        // An error keeps the finalizer (and the snapshot); the deletion is tried again.
        return Err(Error::Blocked(note));
    }
    let what = format!("the snapshot at {}", destination.url(&key));
    let deleted = match &destination {
        Destination::S3(s3) => match store::open(&ctx.client, &namespace, s3).await {
            Ok(bucket) => snapshot::delete(bucket, &key)
                .await
                .map(|()| "deleted".to_string())
                .map_err(|e| (e.to_string(), true)),
            // Without its keys it will never be deleted: no use waiting.
            Err(e @ (store::StoreError::Credentials { .. } | store::StoreError::MissingKey { .. })) => {
                Err((e.to_string(), false))
            }
            Err(e) => Err((e.to_string(), true)),
        },
        Destination::Volume(volume) => {
            let deleting_for = deleting_for(backup, jiff::Timestamp::now());
            match delete_from_volume(backup, volume, &key, deleting_for, ctx).await? {
                Some(deleted) => deleted,
                None => return Err(Error::UnderWay(format!("a pod is deleting {what}"))),
            }
        }
    };
    let pod = pod_name(backup, Job::Delete);
    finish_clean_up(ctx, backup, deleted, CLEANUP_DEADLINE, &what, "SnapshotKept", &pod).await
}

/// One look at the deletion of a snapshot in a volume, by a pod: `None` while it is under
/// way, else whether it was deleted (or why not, and whether waiting could help). A pod still
/// saving this backup is stopped first, so that it cannot put the snapshot back after. A pod
/// that cannot be made, or runs past the cleanup deadline, is a failure like any other, so
/// that the deadline holds (a namespace being deleted refuses new pods).
async fn delete_from_volume(
    backup: &EtcdBackup,
    destination: &VolumeDestination,
    key: &str,
    deleting_for: Duration,
    ctx: &Context,
) -> Result<Option<Deletion>> {
    let namespace = backup.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    // Confirmed with the API, not the cache: a save pod made a moment ago that the cache does
    // not hold yet would write the snapshot back after its deletion.
    if confirm::get(&pods, &pod_name(backup, Job::Save), "save-pod-before-delete")
        .await?
        .is_some()
    {
        remove_pod(ctx, backup, &pod_name(backup, Job::Save)).await?;
        return Ok(None);
    }
    let name = pod_name(backup, Job::Delete);
    let pod = ctx.task_pod(&namespace, &name);
    Ok(match volume::outcome(pod.as_deref(), jiff::Timestamp::now()) {
        Outcome::NotStarted => {
            // A pass on a stale copy, after the finalizer went: no new pod for a backup gone.
            let backups: Api<EtcdBackup> = Api::namespaced(ctx.client.clone(), &namespace);
            let still_ours = confirm::get(&backups, &backup.name_any(), "finalizer-before-pod")
                .await?
                .is_some_and(|b| b.finalizers().iter().any(|f| f == FINALIZER));
            if !still_ours {
                return Ok(Some(Ok("its finalizer was gone already".to_string())));
            }
            let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &namespace);
            let claim = confirm::get(&claims, &destination.claim_name, VOLUME_BEFORE_POD).await?;
            if claim.is_none_or(|c| c.metadata.deletion_timestamp.is_some()) {
                // The volume went (or is going), and the snapshot with it.
                return Ok(Some(Ok("the volume is gone".to_string())));
            }
            let Some(owner) = controller_reference(backup) else {
                return Ok(Some(Err(("the EtcdBackup has no uid".into(), false))));
            };
            let place = (namespace.as_str(), backup.spec.cluster.as_str());
            let pod = volume::delete_pod(&name, place, destination, key, &ctx.image, &ctx.images, &owner);
            if let Err(e) = create_if_missing(&pods, &pod).await {
                // Its namespace is going: no pod will ever be made there.
                let waiting_helps = !crate::core::error::namespace_terminating(&e);
                return Ok(Some(Err((format!("pod {name} cannot be made: {e}"), waiting_helps))));
            }
            None
        }
        Outcome::Running if deleting_for >= CLEANUP_DEADLINE => Some(Err((
            format!("pod {name} did not finish within {}s", CLEANUP_DEADLINE.as_secs()),
            true,
        ))),
        Outcome::Running => None,
        Outcome::Stuck(message) => Some(Err((message, true))),
        Outcome::Succeeded(_) => Some(Ok("deleted".to_string())),
        Outcome::Failed(message) => {
            // The next pass makes a fresh pod.
            remove_pod(ctx, backup, &pod_name(backup, Job::Delete)).await?;
            Some(Err((message, true)))
        }
    })
}
