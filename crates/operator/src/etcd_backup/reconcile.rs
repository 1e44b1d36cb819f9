//! One pass over an EtcdBackup: read its cluster → check it can be backed up → stream a
//! snapshot from a healthy member into the cluster's bucket → status and an Event. A backup
//! that is done (Succeeded or Failed) is never made again; one interrupted (an operator
//! restart, a member or the store away for a moment) is tried again under the same key until
//! [`BACKUP_DEADLINE`], then fails. Deleting an EtcdBackup deletes its snapshot (a
//! finalizer), from the store recorded in its status, so it works once the cluster is gone.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ListParams;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Api, Resource, ResourceExt};
use noops_api::etcd_backup::{EtcdBackup, EtcdBackupStatus};
use noops_api::EtcdCluster;
use serde_json::json;
use tracing::{info, warn};

use super::Context;
use super::store::{self, location};
use super::take::{self, TakeError};
use crate::core::apply::apply_status;
use crate::core::conditions::{Decided, merge};
use crate::core::{Error, Result, crash};
use crate::etcd::client::{Credentials, EtcdAccess};
use crate::etcd::names::{CLUSTER_LABEL, Names};
use crate::etcd::observe;

/// The finalizer that deletes the snapshot with the EtcdBackup.
pub const FINALIZER: &str = "noops.dev/etcd-backup-snapshot";
/// How long a backup is tried before it fails.
pub const BACKUP_DEADLINE: Duration = Duration::from_secs(600);
/// How soon an interrupted backup is tried again.
const RETRY: Duration = Duration::from_secs(5);

const SUCCEEDED: &str = "Succeeded";

pub async fn reconcile(backup: Arc<EtcdBackup>, ctx: &Context) -> Result<Action> {
    let namespace = backup.namespace().unwrap_or_default();
    let api: Api<EtcdBackup> = Api::namespaced(ctx.client.clone(), &namespace);
    finalizer(&api, FINALIZER, backup, |event| async {
        match event {
            Finalizer::Apply(backup) => make(&backup, ctx).await,
            Finalizer::Cleanup(backup) => clean_up(&backup, ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e) | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        kube::runtime::finalizer::Error::AddFinalizer(e) | kube::runtime::finalizer::Error::RemoveFinalizer(e) => {
            Error::Kube(e)
        }
        other => Error::InvalidSpec(other.to_string()),
    })
}

/// Where a backup stands after this pass.
enum Verdict {
    Succeeded(take::Taken),
    /// Not this time; tried again unless past the deadline.
    Retry { reason: &'static str, message: String },
    /// Cannot be made as things stand.
    Failed { reason: &'static str, message: String },
}

async fn make(cached: &EtcdBackup, ctx: &Context) -> Result<Action> {
    let namespace = cached.namespace().unwrap_or_default();
    // The watch cache may not have seen the last status yet: a snapshot is taken only on the
    // latest word, and every status write below is made over that version.
    let api: Api<EtcdBackup> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(backup) = api.get_opt(&cached.name_any()).await? else {
        return Ok(Action::await_change());
    };
    let backup = &backup;
    let mut version = backup.resource_version();
    let mut status = backup.status.clone().unwrap_or_default();
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return Ok(Action::await_change());
    }
    let now = jiff::Timestamp::now();
    let started = status.started_at.as_ref().map_or(now, |t| t.0);
    let clusters: Api<EtcdCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let verdict = match clusters.get_opt(&backup.spec.cluster).await? {
        None => Verdict::Failed {
            reason: "ClusterNotFound",
            message: format!("EtcdCluster {:?} does not exist in this namespace", backup.spec.cluster),
        },
        Some(cluster) => match (status.store.clone(), status.key.clone(), cluster.spec.backup.clone()) {
            // Once recorded, where it goes stays: a retry after the cluster's destination was
            // edited (or removed) still goes where the status says.
            (Some(destination), Some(key), _) => attempt_until_deadline(&cluster, &destination, &key, started, ctx).await?,
            (_, _, None) => Verdict::Failed {
                reason: "NoDestination",
                message: format!(
                    "EtcdCluster {:?} has no spec.backup: it does not say where backups go",
                    backup.spec.cluster
                ),
            },
            (_, _, Some(spec)) => {
                let key = store::key(&spec.s3, &namespace, &backup.spec.cluster, &backup.name_any());
                // Recorded before anything is uploaded, so that a deletion finds it whatever
                // happens next.
                status.phase = Some("Running".into());
                status.started_at = Some(Time(started));
                status.store = Some(spec.s3.clone());
                status.key = Some(key.clone());
                status.location = Some(location(&spec.s3, &key));
                if !write_status(backup, &mut version, ctx, &status).await? {
                    return Ok(Action::requeue(Duration::from_secs(1)));
                }
                info!(cluster = %backup.spec.cluster, location = %location(&spec.s3, &key), "backing up");
                attempt_until_deadline(&cluster, &spec.s3, &key, started, ctx).await?
            }
        },
    };
    let mut next = status.clone();
    next.started_at = Some(Time(started));
    let reference = backup.object_ref(&());
    let events = &ctx.core.events;
    match verdict {
        Verdict::Succeeded(taken) => {
            crash::point("backup: snapshot stored, status not written");
            let where_ = next.location.clone().unwrap_or_default();
            let note = format!(
                "stored revision {} of cluster {:x} ({} bytes, etcd {}) at {where_}",
                taken.revision, taken.cluster_id, taken.size, taken.version
            );
            next.phase = Some("Succeeded".into());
            next.size = Some(taken.size);
            next.revision = Some(taken.revision);
            next.sha256 = Some(taken.sha256);
            next.etcd_version = Some(taken.version);
            next.cluster_id = Some(format!("{:x}", taken.cluster_id));
            next.completed_at = Some(Time(now));
            next.conditions = merge(&next.conditions, &[Decided::new(SUCCEEDED, true, "Stored", note.clone())], None, now);
            if !write_status(backup, &mut version, ctx, &next).await? {
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
            info!("{note}");
            events.normal(&reference, "BackupSucceeded", note).await;
            Ok(Action::await_change())
        }
        Verdict::Retry { reason, message } if elapsed(started, now) < BACKUP_DEADLINE => {
            next.phase = Some("Running".into());
            next.conditions = merge(&next.conditions, &[Decided::new(SUCCEEDED, false, reason, message.clone())], None, now);
            if status != next {
                if !write_status(backup, &mut version, ctx, &next).await? {
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
                info!(reason, "the backup waits: {message}");
            }
            Ok(Action::requeue(RETRY))
        }
        Verdict::Retry { reason, message } | Verdict::Failed { reason, message } => {
            next.phase = Some("Failed".into());
            next.completed_at = Some(Time(now));
            next.conditions = merge(&next.conditions, &[Decided::new(SUCCEEDED, false, reason, message.clone())], None, now);
            if !write_status(backup, &mut version, ctx, &next).await? {
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
            warn!(reason, "the backup failed: {message}");
            events.warning(&reference, reason, message).await;
            Ok(Action::await_change())
        }
    }
}

fn elapsed(since: jiff::Timestamp, now: jiff::Timestamp) -> Duration {
    Duration::try_from(now.duration_since(since)).unwrap_or_default()
}

/// [`attempt`] with what is left of the backup's deadline: a snapshot stream that stalls (a
/// member or the store that stops answering without an error) does not hold it Running.
async fn attempt_until_deadline(
    cluster: &EtcdCluster,
    destination: &noops_api::etcd::S3Destination,
    key: &str,
    started: jiff::Timestamp,
    ctx: &Context,
) -> Result<Verdict> {
    let left = BACKUP_DEADLINE.saturating_sub(elapsed(started, jiff::Timestamp::now()));
    attempt(cluster, destination, key, left, ctx).await
}

/// One attempt at streaming a snapshot of `cluster` to `key`, within `limit`.
async fn attempt(
    cluster: &EtcdCluster,
    destination: &noops_api::etcd::S3Destination,
    key: &str,
    limit: Duration,
    ctx: &Context,
) -> Result<Verdict> {
    let names = Names::of(cluster);
    let namespace = &names.namespace;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let members = pods
        .list(&ListParams::default().labels(&format!("{CLUSTER_LABEL}={}", names.cluster)))
        .await?;
    let status = cluster.status.clone().unwrap_or_default();
    // A healthy voting member, a follower first: a snapshot is work the leader is spared.
    let mut healthy: Vec<_> = status
        .members
        .iter()
        .filter(|m| m.healthy && !m.learner && m.id.is_some())
        .collect();
    healthy.sort_by_key(|m| m.leader);
    let endpoint = healthy.iter().find_map(|m| {
        let pod = members.items.iter().find(|p| p.metadata.name.as_deref() == Some(m.name.as_str()))?;
        observe::pod_endpoint(pod, &names)
    });
    let Some(endpoint) = endpoint else {
        return Ok(Verdict::Retry {
            reason: "NoHealthyMember",
            message: format!("no healthy member of {} to take a snapshot from", names.cluster),
        });
    };
    let credentials = if names.tls {
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
        let Some(secret) = secrets.get_opt(&names.client_secret()).await? else {
            return Ok(Verdict::Retry {
                reason: "NoClientCertificate",
                message: format!("Secret {} is not there yet", names.client_secret()),
            });
        };
        observe::credentials_from(&secret, &names)
    } else {
        None::<Credentials>
    };
    let bucket = match store::open(&ctx.client, namespace, destination).await {
        Ok(bucket) => bucket,
        Err(e) => {
            return Ok(Verdict::Retry {
                reason: "StoreUnavailable",
                message: e.to_string(),
            });
        }
    };
    Ok(match take::take(&EtcdAccess::new(credentials), &endpoint, bucket, key, limit).await {
        Ok(taken) => Verdict::Succeeded(taken),
        Err(e @ TakeError::Stalled(_)) => Verdict::Retry {
            reason: "SnapshotStalled",
            message: e.to_string(),
        },
        Err(e @ (TakeError::Etcd(_) | TakeError::Stream(_) | TakeError::Empty)) => Verdict::Retry {
            reason: "SnapshotFailed",
            message: e.to_string(),
        },
        Err(e @ TakeError::Store(_)) => Verdict::Retry {
            reason: "UploadFailed",
            message: e.to_string(),
        },
    })
}

/// Writes the status over `version` of `backup` (the one this pass read, or last wrote), and
/// moves `version` on; false if the object changed since (the pass ends, and the next one
/// reads it afresh).
async fn write_status(
    backup: &EtcdBackup,
    version: &mut Option<String>,
    ctx: &Context,
    status: &EtcdBackupStatus,
) -> Result<bool> {
    let api: Api<EtcdBackup> = Api::namespaced(ctx.client.clone(), &backup.namespace().unwrap_or_default());
    let body = json!({
        "apiVersion": "noops.dev/v1alpha1",
        "kind": "EtcdBackup",
        "metadata": { "resourceVersion": version },
        "status": status,
    });
    match apply_status(&api, &backup.name_any(), &body).await {
        Ok(written) => {
            *version = written.resource_version();
            Ok(true)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// How long the deletion of a snapshot is tried (the store away for a moment) before it is
/// given up, and the EtcdBackup goes anyway.
const CLEANUP_DEADLINE: Duration = Duration::from_secs(300);

/// Deletes the snapshot of a deleted EtcdBackup. While a new cluster is being restored from it,
/// it waits. One that cannot be deleted (its keys gone, or the store away past the deadline)
/// is reported and left: the EtcdBackup still goes.
async fn clean_up(backup: &EtcdBackup, ctx: &Context) -> Result<Action> {
    let status = backup.status.clone().unwrap_or_default();
    let (Some(destination), Some(key)) = (status.store, status.key) else {
        return Ok(Action::await_change());
    };
    let namespace = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    let clusters: Api<EtcdCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let restoring = clusters.list(&ListParams::default()).await?.items.into_iter().find(|c| {
        restores_from(c, &name)
    });
    if let Some(cluster) = restoring {
        let note = format!(
            "EtcdCluster {} is being restored from this backup: its snapshot is kept until that cluster has started",
            cluster.name_any()
        );
        // An error keeps the finalizer (and the snapshot); the deletion is tried again.
        return Err(Error::Blocked(note));
    }
    let where_ = location(&destination, &key);
    let deleted = match store::open(&ctx.client, &namespace, &destination).await {
        Ok(bucket) => take::delete(bucket, &key).await.map_err(|e| (e.to_string(), true)),
        // Without its keys it will never be deleted: no use waiting.
        Err(e @ (store::StoreError::Credentials { .. } | store::StoreError::MissingKey { .. })) => Err((e.to_string(), false)),
        Err(e) => Err((e.to_string(), true)),
    };
    let deleting_for = backup
        .metadata
        .deletion_timestamp
        .as_ref()
        .map_or(Duration::ZERO, |t| elapsed(t.0, jiff::Timestamp::now()));
    match deleted {
        Ok(()) => info!(location = %where_, "deleted the snapshot of a deleted backup"),
        Err((e, true)) if deleting_for < CLEANUP_DEADLINE => {
            return Err(Error::Blocked(format!("could not delete the snapshot at {where_} yet: {e}")));
        }
        Err((e, _)) => {
            let note = format!("could not delete the snapshot at {where_}: {e}; it is left in the store");
            warn!("{note}");
            ctx.core.events.warning(&backup.object_ref(&()), "SnapshotKept", note).await;
        }
    }
    Ok(Action::await_change())
}

/// Whether `cluster` is a new cluster still starting from backup `name`.
pub fn restores_from(cluster: &EtcdCluster, name: &str) -> bool {
    cluster.status.as_ref().and_then(|s| s.cluster_id.as_ref()).is_none()
        && cluster
            .spec
            .bootstrap
            .as_ref()
            .and_then(|b| b.from_backup.as_ref())
            .is_some_and(|b| b.name == name)
}
