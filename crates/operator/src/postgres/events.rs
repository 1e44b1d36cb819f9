//! The decisions of a pass worth an Event, from the status before and after it and what the
//! pass made. Pure: a problem is told once, when it starts or changes, not at every pass.

use noops_api::PostgreSQL;
use noops_api::postgres::PostgreSQLPhase;
use noops_api::postgres::PostgreSQLStatus;

use super::database::InDatabase;
use super::status::restored_message;
use super::synchronous::SYNCHRONOUS_REPLICAS;

use crate::core::events::Announcement;

/// The Events of a pass.
pub fn announcements(
    pg: &PostgreSQL,
    previous: &PostgreSQLStatus,
    status: &PostgreSQLStatus,
    made: &InDatabase,
) -> Vec<Announcement> {
    let mut out = database_news(previous, status);
    out.extend(failover_news(previous, status));
    out.extend(synchronous_change(previous, status));
    out.extend(pause_news(previous, status));
    out.extend(made_news(pg, made));
    out.extend(condition_news(pg, previous, status));
    out
}

/// A database replaced (its volume lost with nothing to restore) or restored.
fn database_news(previous: &PostgreSQLStatus, status: &PostgreSQLStatus) -> Vec<Announcement> {
    let mut out = Vec::new();
    if let (Some(was), Some(now)) = (&previous.system_identifier, &status.system_identifier)
        && was != now
    {
        out.push(Announcement::warning(
            "DatabaseReplaced",
            format!("the instance runs a new database (system identifier {now}, was {was}): its volume was lost, with no backup of it in its backup destination to restore"),
        ));
    }
    if let Some(record) = &status.restore
        && previous.restore.as_ref().map(|r| &r.completed_at) != Some(&record.completed_at)
    {
        out.push(Announcement::normal("Restored", restored_message(record)));
    }
    out
}

/// A new handover (a switchover or a failover), and its promotion once the replica takes
/// writes: once per handover (a replica that promoted before the pass that handed it the lease
/// asked it is promoted in the same status as the handover).
fn failover_news(previous: &PostgreSQLStatus, status: &PostgreSQLStatus) -> Vec<Announcement> {
    let Some(failover) = &status.last_failover else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let handed = |s: &PostgreSQLStatus| s.last_failover.as_ref().map(|f| f.handed_over_at.clone());
    let new_handover = handed(previous) != Some(failover.handed_over_at.clone());
    let received = failover.received_lsn.as_deref().unwrap_or("?");
    if new_handover && failover.switchover {
        out.push(Announcement::normal(
            "SwitchedOver",
            format!(
                "{} stepped down cleanly; promoted {}, which had received all of its WAL (up to {received})",
                failover.from.as_deref().unwrap_or("the primary"),
                failover.to,
            ),
        ));
    } else if new_handover {
        out.push(Announcement::warning(
            "FailedOver",
            format!(
                "{}: promoted {}, which had received WAL up to {received}",
                failover.reason, failover.to,
            ),
        ));
    }
    let promoted = |s: &PostgreSQLStatus| s.last_failover.as_ref().and_then(|f| f.promoted_at.clone());
    if promoted(status).is_some() && (promoted(previous).is_none() || new_handover) {
        let waited = failover
            .write_gap_millis
            .map_or_else(String::new, |gap| format!(": writes waited at most {gap} ms"));
        out.push(Announcement::normal(
            "Promoted",
            format!("{} takes writes{waited}", failover.to),
        ));
    }
    out
}

/// `spec.paused` taking effect, and lifted.
fn pause_news(previous: &PostgreSQLStatus, status: &PostgreSQLStatus) -> Option<Announcement> {
    let paused = |s: &PostgreSQLStatus| s.phase == Some(PostgreSQLPhase::Paused);
    if paused(status) && !paused(previous) {
        Some(Announcement::normal(
            "Paused",
            "spec.paused: the operator changes nothing of the database until it is false; backups go on",
        ))
    } else if paused(previous) && !paused(status) {
        Some(Announcement::normal(
            "Resumed",
            "spec.paused is false: the operator manages the database again",
        ))
    } else {
        None
    }
}

/// What the pass made in the database: its role, the database, a new password.
fn made_news(pg: &PostgreSQL, made: &InDatabase) -> Vec<Announcement> {
    let (db, user) = (&pg.spec.db, &pg.spec.user);
    let mut out = Vec::new();
    if made.user_created {
        out.push(Announcement::normal(
            "UserCreated",
            format!("made role {user}, with the password from the Secret"),
        ));
    }
    if made.database_created {
        out.push(Announcement::normal(
            "DatabaseCreated",
            format!("made database {db}, owned by {user}"),
        ));
    }
    if made.password_set {
        out.push(Announcement::normal(
            "PasswordChanged",
            format!("set role {user}'s password from Secret {}", pg.spec.password_secret),
        ));
    }
    out
}

/// A problem, told once, when Degraded turns True or its reason changes; and serving, when
/// Ready turns True.
fn condition_news(pg: &PostgreSQL, previous: &PostgreSQLStatus, status: &PostgreSQLStatus) -> Vec<Announcement> {
    let mut out = Vec::new();
    let degraded = |s: &PostgreSQLStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "Degraded" && c.status == "True")
            .cloned()
    };
    if let Some(now) = degraded(status)
        && degraded(previous).is_none_or(|was| was.reason != now.reason)
    {
        out.push(Announcement::warning(now.reason, now.message));
    }
    let ready = |s: &PostgreSQLStatus| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
    if ready(status) && !ready(previous) {
        out.push(Announcement::normal(
            "Serving",
            format!(
                "database {} is ready at {}",
                pg.spec.db,
                status.endpoint.clone().unwrap_or_default()
            ),
        ));
    }
    out
}

/// Fewer synchronous replicas than asked (once there had been enough: a new database's
/// replicas being made are not news), and enough again.
fn synchronous_change(previous: &PostgreSQLStatus, status: &PostgreSQLStatus) -> Option<Announcement> {
    let find = |s: &PostgreSQLStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == SYNCHRONOUS_REPLICAS)
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let (was, (reason, message)) = (find(previous)?.0, find(status)?);
    match (was.as_str(), reason.as_str()) {
        ("Synchronous", "TooFewReplicas") => Some(Announcement::warning("SynchronousReplicasShort", message)),
        ("TooFewReplicas", "Synchronous") => Some(Announcement::normal("SynchronousReplicasBack", message)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::conditions::{Decided, merge};
    use crate::postgres::fixtures::postgres;
    use noops_api::postgres::PostgreSQLReason;
    use noops_api::postgres::RestoreStatus;

    fn with(conditions: &[Decided<PostgreSQLReason>]) -> PostgreSQLStatus {
        PostgreSQLStatus {
            conditions: merge(&[], conditions, Some(1), jiff::Timestamp::now()),
            ..Default::default()
        }
    }

    #[test]
    fn a_problem_is_told_when_it_starts_or_changes_not_at_every_pass() {
        let pg = postgres("shop");
        let fine = with(&[Decided::new("Degraded", false, PostgreSQLReason::AsExpected, "")]);
        let missing = with(&[Decided::new(
            "Degraded",
            true,
            PostgreSQLReason::PasswordSecretMissing,
            "no Secret",
        )]);
        let no_key = with(&[Decided::new(
            "Degraded",
            true,
            PostgreSQLReason::PasswordKeyMissing,
            "no key",
        )]);
        let told = |before: &PostgreSQLStatus, after: &PostgreSQLStatus| {
            announcements(&pg, before, after, &InDatabase::default())
                .into_iter()
                .filter(|a| a.warning)
                .map(|a| a.reason)
                .collect::<Vec<_>>()
        };
        assert_eq!(told(&fine, &missing), ["PasswordSecretMissing"]);
        assert!(
            told(&missing, &missing).is_empty(),
            "the same problem again is not news"
        );
        assert_eq!(told(&missing, &no_key), ["PasswordKeyMissing"]);
        assert!(told(&missing, &fine).is_empty());
    }

    #[test]
    fn a_new_system_identifier_is_a_warning() {
        let pg = postgres("shop");
        let was = PostgreSQLStatus {
            system_identifier: Some("1".into()),
            ..Default::default()
        };
        let now = PostgreSQLStatus {
            system_identifier: Some("2".into()),
            ..Default::default()
        };
        let told = announcements(&pg, &was, &now, &InDatabase::default());
        assert!(
            told.iter().any(|a| a.warning && a.reason == "DatabaseReplaced"),
            "{told:?}"
        );
        assert!(announcements(&pg, &was, &was, &InDatabase::default()).is_empty());
    }

    #[test]
    fn a_restore_is_told_once() {
        let pg = postgres("shop");
        let restored = PostgreSQLStatus {
            restore: Some(RestoreStatus {
                backup: "shop-1".into(),
                recovered_to: Some("2026-11-24T10:00:00Z".into()),
                completed_at: Some("2026-11-24T10:01:00Z".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let told = announcements(&pg, &PostgreSQLStatus::default(), &restored, &InDatabase::default());
        assert!(
            told.iter()
                .any(|a| !a.warning && a.reason == "Restored" && a.note.contains("2026-11-24T10:00:00Z")),
            "{told:?}"
        );
        assert!(announcements(&pg, &restored, &restored, &InDatabase::default()).is_empty());
    }

    #[test]
    fn each_promotion_is_told_once_also_when_seen_in_the_pass_that_handed_the_lease_over() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let pg = postgres("shop");
        let at = |s: i64| Time(jiff::Timestamp::from_second(s).unwrap());
        let failover = |from: &str, to: &str, handed: i64, promoted: Option<i64>| PostgreSQLStatus {
            last_failover: Some(noops_api::postgres::FailoverStatus {
                from: Some(from.into()),
                to: to.into(),
                reason: "the primary's lease ran out".into(),
                switchover: false,
                received_lsn: None,
                primary_last_seen: None,
                handed_over_at: at(handed),
                promoted_at: promoted.map(at),
                write_gap_millis: None,
            }),
            ..Default::default()
        };
        let told = |before: &PostgreSQLStatus, after: &PostgreSQLStatus| {
            announcements(&pg, before, after, &InDatabase::default())
                .into_iter()
                .map(|a| a.reason)
                .collect::<Vec<_>>()
        };
        let first = failover("shop-0", "shop-1", 100, Some(101));
        let handed = failover("shop-1", "shop-0", 200, None);
        let promoted = failover("shop-1", "shop-0", 200, Some(201));
        assert_eq!(told(&first, &handed), ["FailedOver"]);
        assert_eq!(told(&handed, &promoted), ["Promoted"]);
        assert!(told(&promoted, &promoted).is_empty());
        // Promoted before the handing pass asked it: both in one status.
        assert_eq!(told(&first, &promoted), ["FailedOver", "Promoted"]);
    }
}
