//! The reports of the backup kinds: an EtcdBackup or a PostgresBackup, what it backs up,
//! where it went, its size, when, and how far it has got. A backup is Ready once it is stored
//! (phase Succeeded). Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use noops_api::backup::BackupPhase;
use noops_api::backup::BackupProgress;
use noops_api::{EtcdBackup, PostgresBackup};

use super::{Around, base, work_progress};
use crate::report::{Report, size};

/// The reason of the Succeeded condition while a backup runs as it should.
const IN_PROGRESS: &str = "InProgress";

/// An EtcdBackup: its cluster, then its progress, the revision and etcd version it holds.
pub fn etcd_backup(backup: &EtcdBackup, around: &Around) -> Report {
    let status = backup.status.clone().unwrap_or_default();
    let mut report = started("EtcdBackup", &backup.metadata, &status.progress, around);
    report.paused = backup.spec.paused;
    report.fact("cluster", format!("EtcdCluster {}", backup.spec.cluster));
    progress(&mut report, &status.progress, around);
    if let Some(revision) = status.revision {
        report.fact("revision", revision.to_string());
    }
    if let Some(version) = &status.etcd_version {
        report.fact("etcd version", version.clone());
    }
    report
}

/// A PostgresBackup: its database, then its progress, the WAL range and timeline it covers,
/// and the instance it was read from.
pub fn postgres_backup(backup: &PostgresBackup, around: &Around) -> Report {
    let status = backup.status.clone().unwrap_or_default();
    let mut report = started("PostgresBackup", &backup.metadata, &status.progress, around);
    report.paused = backup.spec.paused;
    report.fact("postgresql", format!("PostgreSQL {}", backup.spec.postgresql));
    progress(&mut report, &status.progress, around);
    match (&status.start_wal, &status.end_wal) {
        (Some(start), Some(end)) => report.fact("WAL", format!("{start} to {end}")),
        (Some(start), None) => report.fact("WAL", format!("from {start}")),
        _ => {}
    }
    if let Some(timeline) = status.timeline {
        report.fact("timeline", timeline.to_string());
    }
    if let Some(version) = &status.server_version {
        report.fact("server version", version.clone());
    }
    if let Some(instance) = &status.instance {
        let pod = status
            .pod
            .as_deref()
            .map(|p| format!(", by pod {p}"))
            .unwrap_or_default();
        report.fact("read from", format!("{instance}{pod}"));
    }
    report
}

/// The report every backup starts from: Ready once stored, its phase (Pending before the
/// operator took it), and its Succeeded condition a problem only when it is not just running.
fn started(kind: &str, meta: &ObjectMeta, progress: &BackupProgress, around: &Around) -> Report {
    // A backup's status has no observedGeneration: it is taken as of its generation (only
    // `paused` can change, and a paused backup's status says so).
    let mut report = base(kind, meta, &progress.conditions, meta.generation, around);
    report.ready = progress.succeeded();
    report.phase = Some(progress.phase.map_or("Pending", BackupPhase::as_str).to_string());
    report.problems.retain(|(_, reason, _)| reason != IN_PROGRESS);
    report
}

/// Its size, where it is, when it started and ended, and the work under way.
fn progress(report: &mut Report, progress: &BackupProgress, around: &Around) {
    if let Some(bytes) = progress.size {
        report.fact("size", size(bytes));
    }
    if let Some(location) = &progress.location {
        report.fact("where", location.clone());
    }
    if let Some(sha) = &progress.sha256 {
        report.fact("sha256", sha.clone());
    }
    match (&progress.started_at, &progress.completed_at) {
        (Some(start), Some(end)) => {
            let took = crate::report::age(end.0.duration_since(start.0).as_secs());
            report.fact("completed", format!("{} ago, in {took}", around.since(end)));
        }
        (Some(start), None) => report.fact("started", format!("{} ago", around.since(start))),
        (None, Some(end)) => report.fact("completed", format!("{} ago", around.since(end))),
        (None, None) => {}
    }
    if let Some(work) = &progress.under_way {
        report.fact("under way", work_progress(work));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn around() -> Around {
        Around {
            now: "2026-11-26T12:00:00Z".parse().unwrap(),
            ..Default::default()
        }
    }

    #[test]
    fn a_stored_etcd_backup_is_ready_with_its_cluster_size_place_and_time() {
        let backup: EtcdBackup = serde_json::from_value(serde_json::json!({
            "apiVersion": "noops.dev/v1alpha1", "kind": "EtcdBackup",
            "metadata": { "name": "main-manual-1", "namespace": "db", "generation": 1 },
            "spec": { "cluster": "main" },
            "status": {
                "phase": "Succeeded", "size": 2_097_152, "location": "pvc://etcd-backups/etcd/main/x.db",
                "startedAt": "2026-11-26T11:50:00Z", "completedAt": "2026-11-26T11:50:12Z",
                "revision": 42, "etcdVersion": "3.5.21",
                "conditions": [{ "type": "Succeeded", "status": "True", "reason": "Stored", "message": "",
                                 "lastTransitionTime": "2026-11-26T11:50:12Z" }],
            },
        }))
        .unwrap();
        let report = etcd_backup(&backup, &around());
        assert!(report.ready && report.problems.is_empty(), "{report:?}");
        let text = report.text();
        for expected in [
            "EtcdBackup db/main-manual-1: Ready (Succeeded)",
            "EtcdCluster main",
            "2.0 MiB",
            "pvc://etcd-backups/etcd/main/x.db",
            "9m ago, in 12s",
            "revision      42",
        ] {
            assert!(text.contains(expected), "no {expected:?} in\n{text}");
        }
    }

    #[test]
    fn a_running_postgres_backup_is_not_ready_and_not_a_problem_until_it_fails() {
        let mut backup: PostgresBackup = serde_json::from_value(serde_json::json!({
            "apiVersion": "noops.dev/v1alpha1", "kind": "PostgresBackup",
            "metadata": { "name": "shop-1", "namespace": "prod", "generation": 1 },
            "spec": { "postgresql": "shop" },
            "status": {
                "phase": "Running", "startedAt": "2026-11-26T11:59:00Z", "startWal": "0/2000028",
                "instance": "shop-1", "pod": "shop-backup-1",
                "underWay": { "step": "streaming database files", "bytesDone": 1024, "bytesTotal": 4096 },
                "conditions": [{ "type": "Succeeded", "status": "False", "reason": "InProgress",
                                 "message": "streaming", "lastTransitionTime": "2026-11-26T11:59:00Z" }],
            },
        }))
        .unwrap();
        let report = postgres_backup(&backup, &around());
        assert!(!report.ready && report.problems.is_empty(), "{report:?}");
        let text = report.text();
        for expected in [
            "PostgresBackup prod/shop-1: Not ready (Running)",
            "PostgreSQL shop",
            "started     1m ago",
            "streaming database files, 1.0 KiB of 4.0 KiB (25%)",
            "from 0/2000028",
            "shop-1, by pod shop-backup-1",
        ] {
            assert!(text.contains(expected), "no {expected:?} in\n{text}");
        }
        let status = backup.status.as_mut().unwrap();
        status.progress.phase = Some(BackupPhase::Failed);
        status.progress.conditions[0].reason = "NoDestination".into();
        let report = postgres_backup(&backup, &around());
        assert_eq!(report.problems[0].1, "NoDestination");
        let pending: PostgresBackup = serde_json::from_value(serde_json::json!({
            "apiVersion": "noops.dev/v1alpha1", "kind": "PostgresBackup",
            "metadata": { "name": "shop-2", "namespace": "prod" },
            "spec": { "postgresql": "shop" },
        }))
        .unwrap();
        assert_eq!(postgres_backup(&pending, &around()).phase.as_deref(), Some("Pending"));
    }
}
