//! The status of a PostgreSQL, from what one pass saw and did. Pure.
//!
//! Conditions: `Ready` (serving, or why not), `Degraded` (what needs attention),
//! `ContinuousArchiving` (WAL reaches the backup destination), `BackupSucceeded` (the newest
//! finished base backup), `Restored` (the data directory came from a backup, or why a restore
//! failed), `SynchronousReplicas` (as many replicas as `spec.synchronous` asks acknowledge
//! commits: `synchronous.rs`).

use noops_api::PostgreSQL;
use noops_api::condition::{DEGRADED, READY};
use noops_api::postgres::PostgreSQLPhase;
use noops_api::postgres::PostgreSQLReason;
use noops_api::postgres::{BackupLocation, FailoverStatus, MemberStatus, PostgreSQLStatus, RestoreStatus, Role};

use super::names::{Names, PORT};
use super::problem::PlanProblem;
use super::replication;
use super::secrets::PasswordProblem;
use super::sql::{Archiver, InstanceFacts};
use crate::core::backup::gauges::epoch_seconds;
use crate::core::backup::retention::BackupsSummary;
use crate::core::conditions::{Decided, merge, with_paused};
use crate::core::metrics::{BackupGauges, ReplicaLag, ReplicationGauges};
use crate::core::stuck::Stuck;

pub const CONTINUOUS_ARCHIVING: &str = "ContinuousArchiving";
pub const RESTORED: &str = "Restored";
/// True while every replica the spec asks for streams from the primary within the lag bound.
pub const REPLICAS_READY: &str = "ReplicasReady";

/// Where the instance stands, as one pass saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstanceState {
    /// No pod yet, or it is starting (recovering its WAL after a stop).
    Starting(String),
    /// The pod's init container makes the data directory: a new database, or a restore.
    Bootstrapping,
    /// Making the data directory failed (a restore from a corrupt or missing backup, a hole in
    /// the WAL): what it said. The pod is not Ready and not in the Service.
    BootstrapFailed(String),
    /// The pod cannot start without a change (image, crash loop, scheduling).
    Stuck(Stuck),
    /// The server answers the operator.
    Serving(InstanceFacts),
    /// The pod is Ready but the operator could not talk to the server.
    Unreachable(String),
}

/// What one pass saw and did.
#[derive(Debug, Clone, Default)]
pub struct StatusFacts {
    pub instance: InstanceState,
    pub instance_pod: Option<String>,
    pub node: Option<String>,
    /// Why the user's password cannot be read, if it cannot.
    pub password_problem: Option<PasswordProblem>,
    /// The password Secret version the database has now.
    pub password_version: Option<String>,
    /// The database and its owner are there (this pass saw or made them).
    pub database_ready: bool,
    pub node_port: Option<i32>,
    /// What an empty data directory would become: the backup it would be restored from.
    pub restores_from: Option<String>,
    /// An empty data directory is neither restored nor made anew: the database ran, and its
    /// backups are not where the pod can reach them (the plan says why).
    pub initdb_refused: bool,
    /// Why the database cannot start as its spec says (its bootstrap backup).
    pub plan_problem: Option<PlanProblem>,
    /// Why the StatefulSet or the Service is left as it is: a backup destination the instance
    /// cannot be given, or a spec the API server refuses for them.
    pub held_back: Option<PlanProblem>,
    /// The database has no Service (the API server refused it): nothing reaches it by name.
    pub service_missing: bool,
    /// Why `backup.schedule` cannot be followed (the database runs on; no scheduled backup).
    pub schedule_problem: Option<PlanProblem>,
    /// What the server's WAL archiver says (when it serves with a destination).
    pub archiver: Option<Archiver>,
    /// What the restore that made the data directory recovered, as the instance says (when it
    /// serves).
    pub restore: Option<RestoreStatus>,
    /// A restore under way, as the pod's bootstrap reports it.
    pub restoring: Option<noops_api::backup::WorkProgress>,
    pub backups: BackupsSummary<PostgreSQLReason>,
    pub bootstrap_source: Option<BackupLocation>,
    /// Why the instance waits for its dead node, if it does.
    pub node_lost: Option<String>,
    /// Every instance as this pass saw it (`replication.rs`).
    pub members: Vec<MemberStatus>,
    /// The primary's pod.
    pub primary: String,
    /// A failover this pass made.
    pub failover: Option<FailoverStatus>,
    /// Why a lost primary is not replaced yet.
    pub primary_lost: Option<String>,
    /// The primary's synchronous replication (when it serves).
    pub synchronous: Option<super::synchronous::Seen>,
    /// Instances that share a node while another could take one, said (`spread.rs`).
    pub apart: Option<String>,
}

impl Default for InstanceState {
    fn default() -> Self {
        InstanceState::Starting(String::new())
    }
}

/// The status after a pass: one builder per condition and the phase, from what the pass saw.
/// What `status` says to monitoring: the backups' gauges, and with archiving on, when the last
/// WAL segment was archived and whether the last attempt failed.
pub fn gauges(pg: &PostgreSQL, status: &PostgreSQLStatus, now: jiff::Timestamp) -> BackupGauges {
    let schedule = pg.spec.backup.as_ref().and_then(|b| b.plan.schedule.as_deref());
    let mut gauges = crate::core::backup::gauges::of(&status.backups, schedule, now);
    if pg.spec.backup.is_some() {
        let archived = status.last_archived_time.as_ref().map(|t| t.0);
        let failed = status.last_failed_time.as_ref().map(|t| t.0);
        gauges.last_archived_wal = archived.map(epoch_seconds);
        gauges.archiving_failing = Some(match (failed, archived) {
            (Some(failed), Some(archived)) => failed > archived,
            (failed, _) => failed.is_some(),
        });
    }
    gauges
}

/// What the status says of the replicas, for the metrics: those the spec asks for, those
/// streaming, and each one's lag.
pub fn replication_gauges(pg: &PostgreSQL, status: &PostgreSQLStatus) -> ReplicationGauges {
    let replicas = status.members.iter().filter(|m| m.role == Role::Replica);
    ReplicationGauges {
        wanted: i64::from(pg.spec.instances.max(1) - 1),
        streaming: replicas.clone().filter(|m| m.streaming == Some(true)).count() as i64,
        lag: replicas
            .map(|m| ReplicaLag {
                instance: m.name.clone(),
                bytes: m.lag_bytes,
                seconds: m.lag_millis.map(|ms| ms as f64 / 1000.0),
            })
            .collect(),
    }
}

/// The status the database should have now, from what the pass saw.
pub fn build(pg: &PostgreSQL, names: &Names, seen: &StatusFacts, now: jiff::Timestamp) -> PostgreSQLStatus {
    let previous = pg.status.clone().unwrap_or_default();
    let serving = match &seen.instance {
        InstanceState::Serving(facts) => Some(facts),
        _ => None,
    };
    let ready = serving.is_some() && seen.database_ready && !seen.service_missing;
    let restore = if serving.is_some() {
        seen.restore.clone()
    } else {
        previous.restore.clone()
    };
    let decided = decide(pg, names, seen, &previous, ready, restore.as_ref());
    let phase = if pg.spec.paused {
        PostgreSQLPhase::Paused
    } else {
        phase(seen, &previous, ready)
    };
    let archiver = seen.archiver.clone();
    let time = |t: Option<String>| whole_second(t?);
    PostgreSQLStatus {
        observed_generation: pg.metadata.generation,
        conditions: merge(
            &previous.conditions,
            &with_paused(&decided, pg.spec.paused),
            pg.metadata.generation,
            now,
        ),
        phase: Some(phase),
        endpoint: Some(format!("{}:{PORT}", names.host())),
        node_port: seen.node_port,
        connection_secret: seen.password_version.as_ref().map(|_| names.connection_secret()),
        instance: seen.instance_pod.clone(),
        node: seen.node.clone(),
        current_primary: Some(seen.primary.clone())
            .filter(|p| !p.is_empty())
            .or_else(|| Some(names.instance())),
        last_failover: last_failover(&previous, seen, ready, now),
        ready_instances: Some(replication::ready_instances(
            &seen.members,
            ready,
            names,
            pg.spec.instances,
        )),
        selector: Some(
            names
                .selector()
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(","),
        ),
        members: replication::paced(&previous.members, seen.members.clone(), now),
        placement: replication::shared_nodes(&seen.members),
        synchronous_standby_names: match &seen.synchronous {
            Some(sync) => Some(sync.setting.clone()).filter(|s| !s.is_empty()),
            None => previous.synchronous_standby_names.clone(),
        },
        server_version: serving.map(|f| f.server_version.clone()).or(previous.server_version),
        system_identifier: serving
            .map(|f| f.system_identifier.clone())
            .or(previous.system_identifier),
        password_secret_version: seen.password_version.clone(),
        backups: seen.backups.status.clone(),
        last_archived_wal: archiver
            .as_ref()
            .map_or(previous.last_archived_wal, |a| a.last_archived_wal.clone()),
        last_archived_time: archiver
            .as_ref()
            .map_or(previous.last_archived_time, |a| time(a.last_archived_time.clone())),
        last_failed_wal: archiver
            .as_ref()
            .map_or(previous.last_failed_wal, |a| a.last_failed_wal.clone()),
        last_failed_time: archiver
            .as_ref()
            .map_or(previous.last_failed_time, |a| time(a.last_failed_time.clone())),
        restore,
        restoring: seen.restoring.clone(),
        bootstrap_source: seen.bootstrap_source.clone(),
    }
}

/// The conditions of the status, before they are merged with the previous ones.
fn decide(
    pg: &PostgreSQL,
    names: &Names,
    seen: &StatusFacts,
    previous: &PostgreSQLStatus,
    ready: bool,
    restore: Option<&RestoreStatus>,
) -> Vec<Decided<PostgreSQLReason>> {
    let archiving = archiving(pg, seen, previous);
    let mut decided = vec![
        ready_condition(pg, names, seen, ready),
        degraded(seen, archiving.as_ref()),
        restored(seen, restore),
        replicas_ready(pg, seen),
    ];
    let synchronous_was = previous
        .conditions
        .iter()
        .find(|c| c.type_ == super::synchronous::SYNCHRONOUS_REPLICAS)
        .map(|c| c.reason.as_str());
    decided.extend(super::synchronous::condition(
        pg.spec.synchronous.as_ref(),
        seen.synchronous.as_ref(),
        synchronous_was,
    ));
    decided.extend(archiving);
    decided.extend(seen.backups.condition.clone());
    decided
}

/// A time the server told, cut to the second as a stored `Time` is: a status that kept the
/// server's microseconds would differ from the stored one at every pass, and be written again
/// each time.
fn whole_second(time: String) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time> {
    time.parse::<jiff::Timestamp>()
        .ok()
        .map(|t| jiff::Timestamp::from_second(t.as_second()).unwrap_or(t))
        .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time)
}

/// What a restore recovered, in words.
pub fn restored_message(record: &RestoreStatus) -> String {
    let to = match &record.recovered_to {
        Some(time) => format!("every transaction committed up to {time}"),
        None => "the end of the base backup (no transaction after it was archived)".into(),
    };
    format!(
        "restored from backup {} with the archived WAL: {to} (WAL {}, now on timeline {})",
        record.backup,
        record.end_wal.as_deref().unwrap_or("?"),
        record.timeline.map_or("?".into(), |t| t.to_string())
    )
}

/// What keeps the spec from being applied: its bootstrap backup, its backup destination, or
/// the API server's refusal.
fn spec_problem(seen: &StatusFacts) -> Option<&PlanProblem> {
    seen.plan_problem.as_ref().or(seen.held_back.as_ref())
}

/// A data directory that should have come from a backup and did not: a failed restore.
fn restore_due(seen: &StatusFacts) -> bool {
    seen.restores_from.is_some() || seen.initdb_refused
}

/// The reason and message of a failed bootstrap: a failed restore, or a failed initdb.
fn failed_bootstrap(seen: &StatusFacts, message: &str) -> (PostgreSQLReason, String) {
    if restore_due(seen) {
        (PostgreSQLReason::RestoreFailed, message.to_string())
    } else {
        (PostgreSQLReason::BootstrapFailed, message.to_string())
    }
}

/// Ready: the instance serves the database, in the Service; otherwise the gravest reason not.
fn ready_condition(pg: &PostgreSQL, names: &Names, seen: &StatusFacts, ready: bool) -> Decided<PostgreSQLReason> {
    if ready {
        let message = format!("serving database {} at {}:{PORT}", pg.spec.db, names.host());
        return Decided::new(READY, true, PostgreSQLReason::Serving, message);
    }
    match (&seen.instance, &seen.password_problem, spec_problem(seen)) {
        _ if seen.primary_lost.is_some() => Decided::new(
            READY,
            false,
            PostgreSQLReason::PrimaryLost,
            seen.primary_lost.clone().unwrap_or_default(),
        ),
        _ if seen.node_lost.is_some() => Decided::new(
            READY,
            false,
            PostgreSQLReason::NodeLost,
            seen.node_lost.clone().unwrap_or_default(),
        ),
        (_, _, Some(problem)) => Decided::new(READY, false, problem.reason, problem.message.clone()),
        (InstanceState::BootstrapFailed(message), _, _) => {
            let (reason, message) = failed_bootstrap(seen, message);
            Decided::new(READY, false, reason, message)
        }
        (InstanceState::Stuck(stuck), _, _) => {
            Decided::new(READY, false, PostgreSQLReason::InstancePodStuck, stuck.message.clone())
        }
        (InstanceState::Serving(_), Some(problem), _) => problem.condition(READY, false),
        (InstanceState::Serving(_), None, _) if seen.service_missing => {
            let again = if pg.spec.paused {
                "it is made again once spec.paused is false"
            } else {
                "it is being made again"
            };
            let message = format!(
                "Service {} is missing: nothing reaches the database by name; {again}",
                names.service()
            );
            Decided::new(READY, false, PostgreSQLReason::ServiceMissing, message)
        }
        (InstanceState::Serving(_), None, _) => Decided::new(
            READY,
            false,
            PostgreSQLReason::CreatingDatabase,
            "making the database and its owner",
        ),
        (InstanceState::Bootstrapping, _, _) => match &seen.restores_from {
            Some(backup) => Decided::new(
                READY,
                false,
                PostgreSQLReason::Restoring,
                format!(
                    "restoring from backup {backup} and the WAL archived after it; the instance is not in the Service until it is done"
                ),
            ),
            None => Decided::new(
                READY,
                false,
                PostgreSQLReason::Initialising,
                "initialising a new database",
            ),
        },
        (InstanceState::Starting(why), _, _) => Decided::new(READY, false, PostgreSQLReason::Starting, why.clone()),
        (InstanceState::Unreachable(why), _, _) => {
            Decided::new(READY, false, PostgreSQLReason::Unreachable, why.clone())
        }
    }
}

/// The last failover: this pass's, or the last one, completed once its new primary serves
/// (how long writes waited, from the old primary last seen renewing its lease).
fn last_failover(
    previous: &PostgreSQLStatus,
    seen: &StatusFacts,
    ready: bool,
    now: jiff::Timestamp,
) -> Option<FailoverStatus> {
    let mut last = seen.failover.clone().or_else(|| previous.last_failover.clone())?;
    if last.promoted_at.is_none() && ready && seen.primary == last.to {
        let at = jiff::Timestamp::from_second(now.as_second()).unwrap_or(now);
        last.promoted_at = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at));
        // (A handover recorded after the operator restarted knows no such moment: no gap.)
        last.write_gap_millis = last
            .primary_last_seen
            .as_ref()
            .map(|from| now.duration_since(from.0).as_millis() as i64);
    }
    Some(last)
}

/// ReplicasReady: every replica asked for streams within the lag bound, or which do not.
fn replicas_ready(pg: &PostgreSQL, seen: &StatusFacts) -> Decided<PostgreSQLReason> {
    let wanted = pg.spec.instances - 1;
    if wanted == 0 {
        return Decided::new(
            REPLICAS_READY,
            true,
            PostgreSQLReason::NoReplicas,
            "one instance: no replica is asked for",
        );
    }
    let replicas: Vec<&MemberStatus> = seen.members.iter().filter(|m| m.role == Role::Replica).collect();
    let behind: Vec<String> = replicas
        .iter()
        .filter(|m| replication::role_label(m) != replication::REPLICA)
        .map(|m| match (m.ready, m.streaming, m.lag_bytes) {
            (false, _, _) => format!("{} is not Ready", m.name),
            (true, Some(true), Some(lag)) => format!("{} is {lag} bytes behind", m.name),
            _ => format!("{} does not stream from the primary", m.name),
        })
        .collect();
    let streaming = replicas.len() as i32 - behind.len() as i32;
    if behind.is_empty() && streaming >= wanted {
        Decided::new(
            REPLICAS_READY,
            true,
            PostgreSQLReason::Streaming,
            format!("{streaming} of {wanted} replicas stream from the primary"),
        )
    } else {
        let mut why = behind;
        if (replicas.len() as i32) < wanted {
            why.push(format!("{} of {wanted} replicas have a pod", replicas.len()));
        }
        Decided::new(REPLICAS_READY, false, PostgreSQLReason::ReplicasBehind, why.join("; "))
    }
}

/// The reason of a Degraded condition that says which instances share a node another could
/// take one from.
pub const INSTANCES_SHARE_NODE: &str = PostgreSQLReason::InstancesShareNode.as_str();

/// Degraded: the gravest of what needs attention.
fn degraded(seen: &StatusFacts, archiving: Option<&Decided<PostgreSQLReason>>) -> Decided<PostgreSQLReason> {
    match (&seen.instance, &seen.password_problem) {
        _ if seen.primary_lost.is_some() => Decided::new(
            DEGRADED,
            true,
            PostgreSQLReason::PrimaryLost,
            seen.primary_lost.clone().unwrap_or_default(),
        ),
        _ if seen.node_lost.is_some() => Decided::new(
            DEGRADED,
            true,
            PostgreSQLReason::NodeLost,
            seen.node_lost.clone().unwrap_or_default(),
        ),
        (InstanceState::BootstrapFailed(message), _) => {
            let (reason, message) = failed_bootstrap(seen, message);
            Decided::new(DEGRADED, true, reason, message)
        }
        (InstanceState::Stuck(stuck), _) => Decided::new(
            DEGRADED,
            true,
            PostgreSQLReason::InstancePodStuck,
            stuck.message.clone(),
        ),
        (_, Some(problem)) => problem.condition(DEGRADED, true),
        (InstanceState::Unreachable(why), _) => {
            Decided::new(DEGRADED, true, PostgreSQLReason::Unreachable, why.clone())
        }
        _ => match spec_problem(seen).or(seen.schedule_problem.as_ref()) {
            Some(problem) => Decided::new(DEGRADED, true, problem.reason, problem.message.clone()),
            None => match archiving.filter(|a| a.reason == PostgreSQLReason::ArchiveFailing) {
                Some(failing) => Decided::new(
                    DEGRADED,
                    true,
                    PostgreSQLReason::ArchiveFailing,
                    failing.message.clone(),
                ),
                None => match &seen.apart {
                    Some(shared) => Decided::new(DEGRADED, true, PostgreSQLReason::InstancesShareNode, shared.clone()),
                    None => Decided::new(DEGRADED, false, PostgreSQLReason::AsExpected, "nothing needs attention"),
                },
            },
        },
    }
}

/// Restored: whether the data directory came from a backup, and what it recovered.
fn restored(seen: &StatusFacts, restore: Option<&RestoreStatus>) -> Decided<PostgreSQLReason> {
    match (&seen.instance, restore) {
        (InstanceState::BootstrapFailed(message), _) if restore_due(seen) => {
            Decided::new(RESTORED, false, PostgreSQLReason::RestoreFailed, message.clone())
        }
        (_, Some(record)) => Decided::new(RESTORED, true, PostgreSQLReason::Restored, restored_message(record)),
        (_, None) => Decided::new(
            RESTORED,
            false,
            PostgreSQLReason::NotRestored,
            "the data directory was made new (initdb), not restored from a backup",
        ),
    }
}

/// The phase `kubectl get` shows.
fn phase(seen: &StatusFacts, previous: &PostgreSQLStatus, ready: bool) -> PostgreSQLPhase {
    let spec_problem = spec_problem(seen);
    let was_serving = previous.system_identifier.is_some();
    if ready && seen.password_problem.is_none() && spec_problem.is_none() && seen.schedule_problem.is_none() {
        PostgreSQLPhase::Running
    } else if ready || was_serving {
        PostgreSQLPhase::Degraded
    } else if matches!(
        seen.instance,
        InstanceState::Stuck(_) | InstanceState::BootstrapFailed(_)
    ) || spec_problem.is_some()
    {
        PostgreSQLPhase::Failed
    } else if matches!(seen.instance, InstanceState::Bootstrapping) && seen.restores_from.is_some() {
        PostgreSQLPhase::Restoring
    } else {
        PostgreSQLPhase::Creating
    }
}

/// `ContinuousArchiving`, from what the archiver says (kept as it was while the server does
/// not answer).
fn archiving(pg: &PostgreSQL, seen: &StatusFacts, previous: &PostgreSQLStatus) -> Option<Decided<PostgreSQLReason>> {
    if pg.spec.backup.is_none() {
        return Some(Decided::new(
            CONTINUOUS_ARCHIVING,
            false,
            PostgreSQLReason::NoDestination,
            "spec.backup is not set: WAL is not archived, and a lost volume loses the database",
        ));
    }
    let Some(archiver) = &seen.archiver else {
        // Not serving: what was said stays.
        let kept = previous.conditions.iter().find(|c| c.type_ == CONTINUOUS_ARCHIVING)?;
        let reason = [
            PostgreSQLReason::WalArchived,
            PostgreSQLReason::ArchiveFailing,
            PostgreSQLReason::NotYetArchived,
        ]
        .into_iter()
        .find(|r| r.as_str() == kept.reason)?;
        return Some(Decided::new(
            CONTINUOUS_ARCHIVING,
            kept.status == "True",
            reason,
            kept.message.clone(),
        ));
    };
    let failing_since = match (&archiver.last_failed_time, &archiver.last_archived_time) {
        (Some(failed), Some(archived)) if failed > archived => Some(failed),
        (Some(failed), None) => Some(failed),
        _ => None,
    };
    Some(match (failing_since, &archiver.last_archived_wal) {
        (Some(since), _) => Decided::new(
            CONTINUOUS_ARCHIVING,
            false,
            PostgreSQLReason::ArchiveFailing,
            format!(
                "archiving WAL segment {} failed at {since} (the instance's log says why): a lost volume would lose every commit since the last archived segment",
                archiver.last_failed_wal.as_deref().unwrap_or("?")
            ),
        ),
        (None, Some(wal)) => Decided::new(
            CONTINUOUS_ARCHIVING,
            true,
            PostgreSQLReason::WalArchived,
            format!(
                "WAL is archived within {}s of a commit; the last segment, {wal}, at {}",
                pg.spec.backup.as_ref().map_or(0, |b| b.archive_timeout_seconds),
                archiver.last_archived_time.as_deref().unwrap_or("?")
            ),
        ),
        (None, None) => Decided::new(
            CONTINUOUS_ARCHIVING,
            false,
            PostgreSQLReason::NotYetArchived,
            "no WAL segment has been archived yet",
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::fixtures::{postgres, with_backups};

    fn facts() -> InstanceFacts {
        InstanceFacts {
            server_version: "15.14".into(),
            system_identifier: "7300000000000000001".into(),
        }
    }

    fn seen(instance: InstanceState) -> StatusFacts {
        StatusFacts {
            instance,
            instance_pod: Some("shop-0".into()),
            node: Some("node-1".into()),
            password_version: Some("u/1".into()),
            database_ready: true,
            ..Default::default()
        }
    }

    fn condition<'a>(
        status: &'a PostgreSQLStatus,
        type_: &str,
    ) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        status.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn serving_with_the_database_made_is_ready() {
        let pg = postgres("shop");
        let status = build(
            &pg,
            &Names::of(&pg),
            &seen(InstanceState::Serving(facts())),
            jiff::Timestamp::now(),
        );
        assert_eq!(condition(&status, READY).status, "True");
        assert_eq!(condition(&status, DEGRADED).status, "False");
        assert_eq!(status.phase, Some(PostgreSQLPhase::Running));
        assert_eq!(status.endpoint.as_deref(), Some("shop.prod.svc:5432"));
        assert_eq!(status.server_version.as_deref(), Some("15.14"));
        assert_eq!(status.connection_secret.as_deref(), Some("shop-connection"));
        assert_eq!(condition(&status, READY).observed_generation, Some(1));
        assert_eq!(condition(&status, CONTINUOUS_ARCHIVING).reason, "NoDestination");
        assert_eq!(condition(&status, RESTORED).reason, "NotRestored");
    }

    #[test]
    fn paused_says_so_in_the_phase_and_still_reports_readiness() {
        let mut pg = postgres("shop");
        pg.spec.paused = true;
        let status = build(
            &pg,
            &Names::of(&pg),
            &seen(InstanceState::Serving(facts())),
            jiff::Timestamp::now(),
        );
        assert_eq!(status.phase, Some(PostgreSQLPhase::Paused));
        assert_eq!(condition(&status, READY).status, "True");
        let events = crate::postgres::events::announcements(&pg, &Default::default(), &status, &Default::default());
        assert!(events.iter().any(|e| e.reason == "Paused"), "{events:?}");
    }

    #[test]
    fn a_stuck_pod_and_a_missing_password_say_why() {
        let pg = postgres("shop");
        let stuck = Stuck {
            reason: "ImagePullBackOff",
            message: "pod shop-0, container postgres: no such image".into(),
        };
        let status = build(
            &pg,
            &Names::of(&pg),
            &seen(InstanceState::Stuck(stuck)),
            jiff::Timestamp::now(),
        );
        assert_eq!(condition(&status, READY).reason, "InstancePodStuck");
        assert!(condition(&status, READY).message.contains("no such image"));
        assert_eq!(status.phase, Some(PostgreSQLPhase::Failed));

        let mut no_password = seen(InstanceState::Serving(facts()));
        no_password.database_ready = false;
        no_password.password_version = None;
        no_password.password_problem = Some(PasswordProblem {
            reason: PostgreSQLReason::PasswordSecretMissing,
            message: "Secret shop-db does not exist".into(),
        });
        let status = build(&pg, &Names::of(&pg), &no_password, jiff::Timestamp::now());
        assert_eq!(condition(&status, READY).reason, "PasswordSecretMissing");
        assert_eq!(condition(&status, DEGRADED).status, "True");
        assert_eq!(status.phase, Some(PostgreSQLPhase::Creating));
        assert_eq!(status.connection_secret, None);
    }

    #[test]
    fn a_lost_password_secret_degrades_a_serving_database_without_stopping_it() {
        let pg = postgres("shop");
        let mut later = seen(InstanceState::Serving(facts()));
        later.password_problem = Some(PasswordProblem {
            reason: PostgreSQLReason::PasswordSecretMissing,
            message: "gone".into(),
        });
        let status = build(&pg, &Names::of(&pg), &later, jiff::Timestamp::now());
        assert_eq!(condition(&status, READY).status, "True");
        assert_eq!(condition(&status, DEGRADED).reason, "PasswordSecretMissing");
        assert_eq!(status.phase, Some(PostgreSQLPhase::Degraded));
    }

    #[test]
    fn a_restore_in_progress_then_failed_keeps_the_database_out_and_says_why() {
        let pg = with_backups(postgres("shop"));
        let mut restoring = seen(InstanceState::Bootstrapping);
        restoring.restores_from = Some("shop-1".into());
        let status = build(&pg, &Names::of(&pg), &restoring, jiff::Timestamp::now());
        assert_eq!(condition(&status, READY).reason, "Restoring");
        assert_eq!(status.phase, Some(PostgreSQLPhase::Restoring));

        let mut failed = seen(InstanceState::BootstrapFailed("the base backup is corrupt".into()));
        failed.restores_from = Some("shop-1".into());
        let status = build(&pg, &Names::of(&pg), &failed, jiff::Timestamp::now());
        for type_ in [READY, RESTORED] {
            assert_eq!(condition(&status, type_).status, "False");
            assert_eq!(condition(&status, type_).reason, "RestoreFailed");
        }
        assert_eq!(condition(&status, DEGRADED).reason, "RestoreFailed");
        assert!(condition(&status, READY).message.contains("corrupt"));
    }

    #[test]
    fn a_database_held_from_initdb_is_a_failed_restore() {
        let pg = with_backups(postgres("shop"));
        let mut held = seen(InstanceState::BootstrapFailed(
            "its newest base backup, shop-1, is at pvc://old/".into(),
        ));
        held.initdb_refused = true;
        let status = build(&pg, &Names::of(&pg), &held, jiff::Timestamp::now());
        for type_ in [READY, RESTORED, DEGRADED] {
            assert_eq!(condition(&status, type_).reason, "RestoreFailed");
        }
        assert!(condition(&status, READY).message.contains("pvc://old/"));
    }

    #[test]
    fn a_restored_database_says_from_which_backup_and_to_when() {
        let pg = with_backups(postgres("shop"));
        let mut restored = seen(InstanceState::Serving(facts()));
        restored.restore = Some(RestoreStatus {
            backup: "shop-1".into(),
            recovered_to: Some("2026-11-24T10:00:03.123456Z".into()),
            end_wal: Some("0/5000060".into()),
            timeline: Some(2),
            completed_at: Some("2026-11-24T10:01:00Z".into()),
        });
        let status = build(&pg, &Names::of(&pg), &restored, jiff::Timestamp::now());
        let condition = condition(&status, RESTORED);
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("True", "Restored")
        );
        assert!(
            condition.message.contains("shop-1") && condition.message.contains("2026-11-24T10:00:03.123456Z"),
            "{}",
            condition.message
        );
        assert_eq!(
            status.restore.unwrap().recovered_to.as_deref(),
            Some("2026-11-24T10:00:03.123456Z")
        );
    }

    #[test]
    fn archiving_is_reported_from_the_archiver_and_a_failure_degrades() {
        let pg = with_backups(postgres("shop"));
        let mut archiving = seen(InstanceState::Serving(facts()));
        archiving.archiver = Some(Archiver {
            last_archived_wal: Some("000000010000000000000003".into()),
            last_archived_time: Some("2026-11-24T10:00:00.000000Z".into()),
            ..Default::default()
        });
        let status = build(&pg, &Names::of(&pg), &archiving, jiff::Timestamp::now());
        assert_eq!(condition(&status, CONTINUOUS_ARCHIVING).status, "True");
        assert_eq!(status.last_archived_wal.as_deref(), Some("000000010000000000000003"));
        assert!(status.last_archived_time.is_some());

        let mut failing = archiving.clone();
        failing.archiver = Some(Archiver {
            last_failed_wal: Some("000000010000000000000004".into()),
            last_failed_time: Some("2026-11-24T10:00:05.000000Z".into()),
            ..archiving.archiver.clone().unwrap()
        });
        let status = build(&pg, &Names::of(&pg), &failing, jiff::Timestamp::now());
        assert_eq!(condition(&status, CONTINUOUS_ARCHIVING).reason, "ArchiveFailing");
        assert_eq!(condition(&status, DEGRADED).reason, "ArchiveFailing");
    }

    #[test]
    fn archive_times_are_kept_to_the_second_so_an_unchanged_status_is_not_written_again() {
        let pg = with_backups(postgres("shop"));
        let mut archiving = seen(InstanceState::Serving(facts()));
        archiving.archiver = Some(Archiver {
            last_archived_wal: Some("000000010000000000000003".into()),
            last_archived_time: Some("2026-11-24T10:00:00.123456Z".into()),
            ..Default::default()
        });
        let status = build(&pg, &Names::of(&pg), &archiving, jiff::Timestamp::now());
        // What the API server gives back: the status as stored, through its JSON.
        let stored: PostgreSQLStatus = serde_json::from_value(serde_json::to_value(&status).unwrap()).unwrap();
        assert_eq!(stored.last_archived_time, status.last_archived_time);
    }

    #[test]
    fn a_refused_spec_or_a_bad_schedule_degrades_a_serving_database_and_a_refused_spec_holds_back_a_new_one() {
        let pg = postgres("shop");
        let refused = PlanProblem {
            reason: PostgreSQLReason::SpecRejected,
            message: "the API server refused the StatefulSet this spec makes".into(),
        };
        let mut serving = seen(InstanceState::Serving(facts()));
        serving.held_back = Some(refused.clone());
        let status = build(&pg, &Names::of(&pg), &serving, jiff::Timestamp::now());
        assert_eq!(
            condition(&status, READY).status,
            "True",
            "the running database still serves"
        );
        assert_eq!(condition(&status, DEGRADED).reason, "SpecRejected");
        assert_eq!(status.phase, Some(PostgreSQLPhase::Degraded));

        let mut new = seen(InstanceState::Starting("no pod yet".into()));
        new.held_back = Some(refused.clone());
        let status = build(&pg, &Names::of(&pg), &new, jiff::Timestamp::now());
        assert_eq!(condition(&status, READY).reason, "SpecRejected");
        assert_eq!(status.phase, Some(PostgreSQLPhase::Failed));

        let mut no_service = seen(InstanceState::Serving(facts()));
        no_service.held_back = Some(refused);
        no_service.service_missing = true;
        let status = build(&pg, &Names::of(&pg), &no_service, jiff::Timestamp::now());
        assert_eq!(
            condition(&status, READY).reason,
            "SpecRejected",
            "no Service, not Ready"
        );
        // Deleted by hand (say while paused): Ready says what is missing, not "creating".
        no_service.held_back = None;
        let status = build(&pg, &Names::of(&pg), &no_service, jiff::Timestamp::now());
        let ready = condition(&status, READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "ServiceMissing")
        );
        assert!(ready.message.contains("Service shop is missing"), "{}", ready.message);

        let mut bad_schedule = seen(InstanceState::Serving(facts()));
        bad_schedule.schedule_problem = Some(PlanProblem {
            reason: PostgreSQLReason::InvalidSchedule,
            message: "backup.schedule \"99 * * * *\" is not a cron expression".into(),
        });
        let status = build(&pg, &Names::of(&pg), &bad_schedule, jiff::Timestamp::now());
        assert_eq!(condition(&status, READY).status, "True");
        assert_eq!(condition(&status, DEGRADED).reason, "InvalidSchedule");
        assert_eq!(status.phase, Some(PostgreSQLPhase::Degraded));

        let mut starting = seen(InstanceState::Bootstrapping);
        starting.schedule_problem = bad_schedule.schedule_problem.clone();
        let status = build(&pg, &Names::of(&pg), &starting, jiff::Timestamp::now());
        assert_eq!(
            condition(&status, READY).reason,
            "Initialising",
            "a bad schedule does not hold a new database back"
        );
        assert_eq!(condition(&status, DEGRADED).reason, "InvalidSchedule");
    }

    #[test]
    fn monitoring_sees_the_last_archived_wal_and_a_failing_archive() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let now: jiff::Timestamp = "2026-11-26T12:00:00Z".parse().unwrap();
        let t = |s: i64| Time(now - jiff::SignedDuration::from_secs(s));
        let pg = with_backups(postgres("shop"));
        let mut status = PostgreSQLStatus {
            last_archived_time: Some(t(60)),
            ..Default::default()
        };
        let gauges = gauges(&pg, &status, now);
        assert_eq!(gauges.last_archived_wal, Some(epoch_seconds(t(60).0)));
        assert_eq!(gauges.archiving_failing, Some(false));
        status.last_failed_time = Some(t(10));
        assert_eq!(gauges_of(&pg, &status, now), Some(true));
        status.last_archived_time = Some(t(5));
        assert_eq!(gauges_of(&pg, &status, now), Some(false), "archived again since");
        // Without backups nothing is archived, and nothing is said of archiving.
        assert_eq!(gauges_of(&postgres("shop"), &status, now), None);
    }

    fn gauges_of(pg: &PostgreSQL, status: &PostgreSQLStatus, now: jiff::Timestamp) -> Option<bool> {
        gauges(pg, status, now).archiving_failing
    }
}
