//! When scheduled backups (EtcdBackups, PostgresBackups) are due, what they are called, and
//! which ones retention deletes.
//! Pure: the time is a parameter.

use croner::Cron;
use croner::parser::{CronParser, Year};
use noops_api::backup::BackupPhase;

/// The label that marks a backup the schedule made (retention only deletes those).
pub const SCHEDULED_LABEL: &str = "noops.dev/scheduled";

/// A schedule that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("backup.schedule {pattern:?} is not a cron expression: {reason}")]
pub struct BadSchedule {
    pub pattern: String,
    pub reason: String,
}

/// Reads a cron expression of five fields, or six with seconds first (UTC).
pub fn parse(pattern: &str) -> Result<Cron, BadSchedule> {
    CronParser::builder()
        .year(Year::Disallowed)
        .build()
        .parse(pattern)
        .map_err(|e| BadSchedule {
            pattern: pattern.to_string(),
            reason: e.to_string(),
        })
}

/// What the schedule asks for now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// A backup is due for this time (the latest scheduled time not yet taken), if any.
    pub now: Option<jiff::Timestamp>,
    /// The scheduled time after it: when to look again.
    pub next: jiff::Timestamp,
}

/// The backup due at `now`, given the last scheduled time taken (or, for a schedule never
/// run, the time the schedule was first seen: nothing before it is due). Missed times are not
/// made up one by one: only the latest is due, as CronJobs do.
pub fn due(cron: &Cron, last: jiff::Timestamp, now: jiff::Timestamp) -> Result<Due, BadSchedule> {
    let fail = |e: croner::errors::CronError| BadSchedule {
        pattern: cron.pattern.to_string(),
        reason: e.to_string(),
    };
    let utc = |t: jiff::Timestamp| t.to_zoned(jiff::tz::TimeZone::UTC);
    let next = cron.find_next_occurrence(&utc(now), false).map_err(fail)?.timestamp();
    let latest = cron
        .find_previous_occurrence(&utc(now), true)
        .map_err(fail)?
        .timestamp();
    Ok(Due {
        now: (latest > last).then_some(latest),
        next,
    })
}

/// The time between the scheduled time at or before `now` and the next one: how old the last
/// backup may be expected to get (an alert fires at twice that).
pub fn interval(cron: &Cron, now: jiff::Timestamp) -> Option<std::time::Duration> {
    let utc = now.to_zoned(jiff::tz::TimeZone::UTC);
    let next = cron.find_next_occurrence(&utc, false).ok()?.timestamp();
    let latest = cron.find_previous_occurrence(&utc, true).ok()?.timestamp();
    Some(elapsed(latest, next))
}

/// The name of the scheduled backup of `cluster` for `at`: the same time gives the same
/// name, so a backup asked for twice (an operator restarted in between) is made once.
pub fn backup_name(cluster: &str, at: jiff::Timestamp) -> String {
    format!("{cluster}-{}", at.strftime("%Y%m%d-%H%M%S"))
}

/// The time from `since` to `now` (zero if `now` is earlier).
pub fn elapsed(since: jiff::Timestamp, now: jiff::Timestamp) -> std::time::Duration {
    std::time::Duration::try_from(now.duration_since(since)).unwrap_or_default()
}

/// A scheduled backup, as retention sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub name: String,
    pub created: jiff::Timestamp,
    pub succeeded: bool,
}

/// A backup as the resource it backs up counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    pub name: String,
    /// None before it began.
    pub phase: Option<BackupPhase>,
    pub completed: Option<jiff::Timestamp>,
    pub deleting: bool,
}

/// What the backups of one resource add up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// How many succeeded (and are not being deleted).
    pub stored: i32,
    /// The newest of those, and when it completed.
    pub newest_stored: Option<(String, jiff::Timestamp)>,
    /// The newest finished one (its index in the input) and whether it succeeded: the
    /// resource's `BackupSucceeded` condition follows it.
    pub newest_finished: Option<(usize, bool)>,
}

/// Counts `backups`. Pure.
pub fn tally(backups: &[Counted]) -> Tally {
    let live = || backups.iter().enumerate().filter(|(_, b)| !b.deleting);
    let stored: Vec<&Counted> = live()
        .map(|(_, b)| b)
        .filter(|b| b.phase == Some(BackupPhase::Succeeded))
        .collect();
    let newest_stored = stored
        .iter()
        .filter_map(|b| Some((b.name.clone(), b.completed?)))
        .max_by_key(|(name, at)| (*at, name.clone()));
    let newest_finished = live()
        .filter_map(|(i, b)| {
            let succeeded = match b.phase? {
                BackupPhase::Succeeded => true,
                BackupPhase::Failed => false,
                BackupPhase::Running => return None,
            };
            Some((b.completed?, b.name.clone(), i, succeeded))
        })
        .max_by_key(|(at, name, _, _)| (*at, name.clone()))
        .map(|(_, _, i, succeeded)| (i, succeeded));
    Tally {
        stored: i32::try_from(stored.len()).unwrap_or(i32::MAX),
        newest_stored,
        newest_finished,
    }
}

/// `<kind> <name> failed: <reason>: <message>`, from a backup's `Succeeded` condition.
pub fn failure(
    kind: &str,
    name: &str,
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> String {
    let why = conditions.iter().find(|c| c.type_ == "Succeeded");
    format!(
        "{kind} {name} failed: {}: {}",
        why.map_or("", |c| c.reason.as_str()),
        why.map_or("", |c| c.message.as_str())
    )
}

/// The scheduled backups to delete so that `max` successful ones are kept: the oldest
/// successful ones beyond `max`, and the others (failed, or not stored yet) older than the
/// oldest kept (a failure stays visible until a newer backup is kept; one not stored yet
/// that a newer stored one overtook is not worth finishing).
pub fn to_delete(backups: &[Kept], max: usize) -> Vec<String> {
    let mut succeeded: Vec<&Kept> = backups.iter().filter(|b| b.succeeded).collect();
    succeeded.sort_by_key(|b| std::cmp::Reverse(b.created));
    let kept = &succeeded[..succeeded.len().min(max)];
    let Some(oldest_kept) = kept.last().map(|b| b.created) else {
        return vec![];
    };
    let mut out: Vec<String> = succeeded[kept.len()..].iter().map(|b| b.name.clone()).collect();
    out.extend(
        backups
            .iter()
            .filter(|b| !b.succeeded && b.created < oldest_kept)
            .map(|b| b.name.clone()),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> jiff::Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn five_and_six_field_schedules_are_read_and_others_are_refused() {
        assert!(parse("0 */6 * * *").is_ok());
        assert!(parse("*/5 * * * * *").is_ok(), "seconds first");
        assert!(parse("every hour").is_err());
        assert!(parse("0 0 * * * * 2030").is_err(), "no years");
        assert!(parse("61 * * * *").is_err());
    }

    #[test]
    fn the_latest_missed_time_is_due_once() {
        let hourly = parse("0 * * * *").unwrap();
        let due_now = due(&hourly, at("2026-01-01T08:00:00Z"), at("2026-01-01T10:30:00Z")).unwrap();
        assert_eq!(
            due_now.now,
            Some(at("2026-01-01T10:00:00Z")),
            "only the latest of 09:00 and 10:00"
        );
        assert_eq!(due_now.next, at("2026-01-01T11:00:00Z"));
        let taken = due(&hourly, at("2026-01-01T10:00:00Z"), at("2026-01-01T10:30:00Z")).unwrap();
        assert_eq!(taken.now, None, "10:00 is taken");
        // A schedule first seen at 10:30 makes nothing for 10:00.
        let fresh = due(&hourly, at("2026-01-01T10:30:00Z"), at("2026-01-01T10:30:00Z")).unwrap();
        assert_eq!(fresh.now, None);
    }

    #[test]
    fn names_follow_the_scheduled_time() {
        assert_eq!(backup_name("main", at("2026-01-01T10:00:05Z")), "main-20260101-100005");
    }

    #[test]
    fn retention_keeps_the_newest_successes_and_clears_older_failures() {
        let b = |name: &str, minute: i64, succeeded| Kept {
            name: name.into(),
            created: jiff::Timestamp::from_second(minute * 60).unwrap(),
            succeeded,
        };
        let backups = vec![
            b("a", 1, true),
            b("b", 2, false),
            b("c", 3, true),
            b("d", 4, true),
            b("e", 5, false),
            b("f", 6, true),
        ];
        let mut gone = to_delete(&backups, 2);
        gone.sort();
        assert_eq!(
            gone,
            vec!["a", "b", "c"],
            "e failed after the oldest kept one: it stays visible"
        );
        assert!(to_delete(&backups, 10).is_empty());
        assert!(
            to_delete(&[b("x", 1, false)], 1).is_empty(),
            "a failure alone stays visible"
        );
    }

    #[test]
    fn a_tally_counts_what_is_stored_and_follows_the_newest_finished_backup() {
        let b = |name: &str, phase: BackupPhase, completed: Option<i64>, deleting| Counted {
            name: name.into(),
            phase: Some(phase),
            completed: completed.map(|m| jiff::Timestamp::from_second(m * 60).unwrap()),
            deleting,
        };
        let backups = [
            b("a", BackupPhase::Succeeded, Some(1), false),
            b("b", BackupPhase::Succeeded, Some(3), false),
            b("c", BackupPhase::Failed, Some(4), false),
            b("d", BackupPhase::Running, None, false),
            b("e", BackupPhase::Succeeded, Some(9), true),
        ];
        let tally = tally(&backups);
        assert_eq!(tally.stored, 2, "one being deleted is not kept");
        assert_eq!(tally.newest_stored.map(|(name, _)| name).as_deref(), Some("b"));
        assert_eq!(
            tally.newest_finished,
            Some((2, false)),
            "the newest finished one failed"
        );
        assert_eq!(super::tally(&[]), Tally::default());
    }
}
