//! A database's backups, from its side: the first base backup is taken as soon as the database
//! serves with a destination (WAL archiving alone restores nothing), the scheduled one that is
//! due is made, the scheduled ones beyond `maxBackups` are deleted (their files go with them),
//! and the status counts what is kept and says how the newest finished backup went
//! (`BackupSucceeded`). The PostgresBackup controller takes the backups.
//!
//! Nothing here makes a backup of a database that does not serve: a restore that fails never
//! leads to a backup of something else, and retention deletes successful backups only once
//! `maxBackups` newer ones have succeeded.

use noops_api::backup::BackupPhase;
use std::collections::BTreeSet;
use std::time::Duration;

use kube::api::DeleteParams;
use kube::{Api, Client, ResourceExt};
use noops_api::PostgreSQL;
use noops_api::postgres::PostgreSQLReason;
use noops_api::postgres_backup::{PostgresBackup, PostgresBackupSpec};

use super::names::{Names, POSTGRES_LABEL};
use super::problem::PlanProblem;
use super::store::{BaseBackupDestination, Destination};
use crate::core::apply::{create_if_missing, delete_if_present};
use crate::core::backup::retention::{self, BackupsReason, BackupsSummary};
use crate::core::backup::schedule;
use crate::core::events::Announcement;
use crate::core::{Result, crash};

/// The UID of the PostgreSQL a backup was made for (a database deleted and made again under
/// the same name is another database).
pub const POSTGRES_UID_LABEL: &str = "noops.dev/postgresql-uid";
/// How long after a first backup failed another first one is made; it doubles with each
/// failure in a row, up to [`FIRST_AGAIN_AT_MOST`].
const FIRST_AGAIN_AFTER: Duration = Duration::from_secs(60);
const FIRST_AGAIN_AT_MOST: Duration = Duration::from_secs(3600);

impl BackupsReason for PostgreSQLReason {
    const BACKUP_STORED: Self = PostgreSQLReason::BackupStored;
    const BACKUP_FAILED: Self = PostgreSQLReason::BackupFailed;
}

/// What the database's last status said of its backups.
pub fn summary(pg: &PostgreSQL) -> BackupsSummary<PostgreSQLReason> {
    let status = pg.status.clone().unwrap_or_default();
    BackupsSummary::of(&status.conditions, &status.backups)
}

fn phase(backup: &PostgresBackup) -> Option<BackupPhase> {
    backup.status.as_ref().and_then(|s| s.progress.phase)
}

/// The backups of this database: of this PostgreSQL (by its UID, which the operator's own
/// backups carry; a user's are taken as this one's if made after it), of this data (by the
/// system identifier they were taken from, once taken). An earlier PostgreSQL of the same name,
/// even one this one was restored from, is another database. Pure.
pub fn of_database<'a>(pg: &PostgreSQL, backups: &'a [PostgresBackup]) -> Vec<&'a PostgresBackup> {
    let uid = pg.metadata.uid.clone().unwrap_or_default();
    let created = pg.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let system_id = pg.status.as_ref().and_then(|s| s.system_identifier.clone());
    backups
        .iter()
        .filter(|b| b.spec.postgresql == pg.name_any())
        .filter(|b| match b.labels().get(POSTGRES_UID_LABEL) {
            Some(made_for) => *made_for == uid,
            None => match (created, b.creation_timestamp()) {
                (Some(pg_created), Some(made)) => made.0 >= pg_created,
                _ => true,
            },
        })
        .filter(|b| {
            let taken_from = b.status.as_ref().and_then(|s| s.system_identifier.clone());
            taken_from.is_none() || taken_from == system_id
        })
        .collect()
}

/// Whether a first backup is to be made now: the database serves with a destination, and no
/// backup of it there has succeeded, runs, or failed a moment ago (a pause that doubles with
/// each failure), unless the destination was seen broken and works again since: WAL archiving
/// failed after the failure before the last one (or at all, after a first one) and has
/// succeeded since the last, as when a bucket is made or credentials are fixed, so the user
/// need not wait out the pause. Once per such repair: a backup that goes on failing while
/// archiving works (for any other reason) keeps its pauses. Pure.
pub fn first_backup_due(pg: &PostgreSQL, of_database: &[&PostgresBackup], serving: bool, now: jiff::Timestamp) -> bool {
    let Some(destination) = pg.spec.backup.as_ref().and_then(Destination::of_spec) else {
        return false;
    };
    if !serving {
        return false;
    }
    let here: Vec<&&PostgresBackup> = of_database
        .iter()
        .filter(|b| {
            // One not started yet goes to the destination of now.
            let went = b
                .status
                .as_ref()
                .and_then(|s| s.destination.as_ref())
                .and_then(Destination::of_location);
            went.is_none_or(|d| d == destination)
        })
        .collect();
    if here.iter().any(|b| phase(b) != Some(BackupPhase::Failed)) {
        return false;
    }
    // Only failures so far: again after a pause that doubles with each of them.
    let failures = u32::try_from(here.len()).unwrap_or(u32::MAX);
    let pause = FIRST_AGAIN_AFTER
        .saturating_mul(2u32.saturating_pow(failures.saturating_sub(1)))
        .min(FIRST_AGAIN_AT_MOST);
    let mut failed_at: Vec<jiff::Timestamp> = here
        .iter()
        .filter_map(|b| b.status.as_ref()?.progress.completed_at.as_ref().map(|t| t.0))
        .collect();
    failed_at.sort();
    let Some(&last) = failed_at.last() else {
        return true;
    };
    let before_last = failed_at.iter().rev().nth(1).copied();
    let status = pg.status.as_ref();
    let archived = status.and_then(|s| s.last_archived_time.as_ref()).map(|t| t.0);
    let archive_failed = status.and_then(|s| s.last_failed_time.as_ref()).map(|t| t.0);
    let repaired = match (archive_failed, archived) {
        (Some(broken), Some(works)) => works > broken && works > last && before_last.is_none_or(|b| broken > b),
        _ => false,
    };
    repaired || crate::core::backup::schedule::elapsed(last, now) >= pause
}

/// Why `backup.schedule` cannot be followed, if it cannot: the schema counts its fields, but
/// only the parser knows a minute of 99. No scheduled backup is made until it is fixed; the
/// first backup and WAL archiving go on.
pub fn schedule_problem(pg: &PostgreSQL) -> Option<PlanProblem> {
    let pattern = pg.spec.backup.as_ref()?.plan.schedule.as_deref()?;
    let bad = schedule::parse(pattern).err()?;
    Some(PlanProblem {
        reason: PostgreSQLReason::InvalidSchedule,
        message: format!("{bad}; no scheduled backup is made until it is fixed"),
    })
}

/// A backup of `pg` made by the operator (first or scheduled), for `at`.
fn scheduled_backup(pg: &PostgreSQL, names: &Names, at: jiff::Timestamp) -> PostgresBackup {
    let uid = pg.metadata.uid.clone().unwrap_or_default();
    PostgresBackup {
        metadata: retention::scheduled_metadata(
            schedule::backup_name(&names.name, at),
            &names.namespace,
            (POSTGRES_LABEL, &names.name),
            (POSTGRES_UID_LABEL, &uid),
        ),
        spec: PostgresBackupSpec {
            postgresql: names.name.clone(),
            paused: false,
        },
        status: None,
    }
}

/// The PostgresBackups and the PostgreSQLs of a database's namespace, from the caches: its
/// backups, and the databases that may still be starting from one.
pub struct NamespaceView<'a> {
    pub backups: &'a [PostgresBackup],
    /// The backups a new database is still starting from.
    pub being_restored: &'a BTreeSet<String>,
}

/// What a pass did with the backups: when to look again, and what it decided (reason, note),
/// for Events.
#[derive(Debug, Default)]
pub struct BackupDecisions {
    pub look_again: Option<Duration>,
    pub decisions: Vec<Announcement>,
}

/// Makes the backup that is due (the first one, or the scheduled one), applies retention and
/// counts the backups kept. Nothing for a database without `spec.backup`. `serving`: the
/// database answers (a backup can be taken).
pub async fn keep(
    pg: &PostgreSQL,
    names: &Names,
    client: &Client,
    namespace: &NamespaceView<'_>,
    serving: bool,
    summary: &mut BackupsSummary<PostgreSQLReason>,
    now: jiff::Timestamp,
) -> Result<BackupDecisions> {
    let mut pass = BackupDecisions::default();
    let Some(spec) = pg.spec.backup.as_ref() else {
        return Ok(pass);
    };
    let api: Api<PostgresBackup> = Api::namespaced(client.clone(), &names.namespace);
    let ours = of_database(pg, namespace.backups);
    let mut look_again = None;
    if first_backup_due(pg, &ours, serving, now) {
        let backup = scheduled_backup(pg, names, now);
        if create_if_missing(&api, &backup).await? {
            crash::point("postgres: first backup made");
            pass.decisions.push(Announcement::normal(
                "FirstBackup",
                format!("made PostgresBackup {}: the first base backup in this destination (archived WAL alone restores nothing)", backup.name_any()),
            ));
        }
        look_again = Some(FIRST_AGAIN_AFTER);
    }
    // A schedule the parser refuses is told as a plan problem; the rest goes on.
    if let Some(pattern) = spec.plan.schedule.as_deref().filter(|p| schedule::parse(p).is_ok()) {
        let due = summary
            .follow_schedule(pattern, now)
            .map_err(|e| crate::core::Error::InvalidSpec(e.to_string()))?;
        if let Some(at) = due.now {
            if serving {
                let backup = scheduled_backup(pg, names, at);
                if create_if_missing(&api, &backup).await? {
                    crash::point("postgres: scheduled backup made, bookmark not written");
                    pass.decisions.push(Announcement::normal(
                        "BackupScheduled",
                        format!("made PostgresBackup {} for {at}", backup.name_any()),
                    ));
                }
            } else {
                pass.decisions.push(Announcement::normal(
                    "BackupSkipped",
                    format!("skipped the backup scheduled for {at}: the database does not serve"),
                ));
            }
        }
        look_again = Some(look_again.map_or(due.next_in, |l: Duration| l.min(due.next_in)));
    } else {
        summary.no_schedule();
    }

    // Backups a new database is being restored from are never deleted under it.
    let in_use = |name: &str| namespace.being_restored.contains(name);
    // Nor while the database is paused: someone may be restoring one by hand.
    let gone = if pg.spec.paused {
        Vec::new()
    } else {
        retention::beyond_max(&ours, in_use, spec.plan.max_backups, now)
    };
    let max = spec.plan.max_backups;
    for name in &gone {
        if delete_if_present(&api, name, &DeleteParams::default()).await? {
            crash::point("postgres: a backup deleted by retention");
            pass.decisions.push(Announcement::normal(
                "BackupDeleted",
                format!("deleted PostgresBackup {name}: {max} newer scheduled backups are kept (maxBackups)"),
            ));
        }
    }
    let left: Vec<&PostgresBackup> = ours.into_iter().filter(|b| !gone.contains(&b.name_any())).collect();
    summary.count(&left, stored);
    pass.look_again = look_again;
    Ok(pass)
}

/// What a successful backup stored, for the database's condition.
fn stored(backup: &PostgresBackup) -> String {
    let status = backup.status.clone().unwrap_or_default();
    format!(
        "PostgresBackup {} stored a base backup ending at WAL {} at {}",
        backup.name_any(),
        status.end_wal.unwrap_or_default(),
        status.progress.location.unwrap_or_default()
    )
}

/// The backup `pg` is a new database still starting from, if it is one.
pub fn starting_from(pg: &PostgreSQL) -> Option<&str> {
    if pg.status.as_ref().and_then(|s| s.system_identifier.as_ref()).is_some() {
        return None;
    }
    Some(pg.spec.bootstrap.as_ref()?.from_backup.as_ref()?.name.as_str())
}

/// Whether `pg` is a new database still starting from backup `name`.
pub fn restores_from(pg: &PostgreSQL, name: &str) -> bool {
    starting_from(pg) == Some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_database_starts_from_its_bootstrap_backup_until_it_has_run() {
        let mut pg = crate::postgres::fixtures::postgres("copy");
        assert_eq!(starting_from(&pg), None, "no bootstrap backup");
        pg.spec.bootstrap = Some(noops_api::postgres::BootstrapSpec {
            from_backup: Some(noops_api::postgres::BackupSource {
                name: "shop-1".into(),
                target_time: None,
            }),
        });
        assert_eq!(starting_from(&pg), Some("shop-1"));
        assert!(restores_from(&pg, "shop-1") && !restores_from(&pg, "shop-2"));
        pg.status = Some(noops_api::postgres::PostgreSQLStatus {
            system_identifier: Some("7301".into()),
            ..Default::default()
        });
        assert_eq!(starting_from(&pg), None, "it ran: the backup is no longer in use");
    }
    use crate::postgres::fixtures::{backup, postgres, with_backups};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(seconds: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(seconds).unwrap()
    }

    fn serving(system_id: &str) -> PostgreSQL {
        let mut pg = with_backups(postgres("shop"));
        pg.status = Some(noops_api::postgres::PostgreSQLStatus {
            system_identifier: Some(system_id.into()),
            ..Default::default()
        });
        pg
    }

    #[test]
    fn a_first_backup_is_made_once_the_database_serves_and_not_again_while_one_exists() {
        let pg = serving("7");
        assert!(first_backup_due(&pg, &[], true, at(1000)));
        assert!(
            !first_backup_due(&pg, &[], false, at(1000)),
            "a database that does not serve is not backed up"
        );
        assert!(
            !first_backup_due(&postgres("shop"), &[], true, at(1000)),
            "no destination, no backup"
        );
        let running = backup("shop-1", "shop", "Running", "7", 900);
        assert!(!first_backup_due(&pg, &[&running], true, at(1000)));
        let stored = backup("shop-1", "shop", "Succeeded", "7", 900);
        assert!(!first_backup_due(&pg, &[&stored], true, at(1000)));
        let failed = backup("shop-1", "shop", "Failed", "7", 990);
        assert!(
            !first_backup_due(&pg, &[&failed], true, at(1000)),
            "not at once after a failure"
        );
        assert!(first_backup_due(&pg, &[&failed], true, at(1100)), "but a minute later");
        let again = backup("shop-2", "shop", "Failed", "7", 1100);
        assert!(
            !first_backup_due(&pg, &[&failed, &again], true, at(1200)),
            "two minutes after a second one"
        );
        assert!(first_backup_due(&pg, &[&failed, &again], true, at(1221)));
        // Archiving failed after the failure before the last (the destination was broken) and
        // works since the last: repaired, no more pause.
        let archiving = |failed: Option<i64>, archived: i64| {
            let mut pg = pg.clone();
            if let Some(status) = pg.status.as_mut() {
                status.last_failed_time = failed.map(|t| Time(at(t)));
                status.last_archived_time = Some(Time(at(archived)));
            }
            pg
        };
        let repaired = archiving(Some(1050), 1150);
        assert!(first_backup_due(&repaired, &[&failed, &again], true, at(1151)));
        assert!(
            !first_backup_due(&archiving(Some(1050), 1090), &[&failed, &again], true, at(1151)),
            "archived before the last failure says nothing"
        );
        // A backup that fails while archiving works (for another reason) keeps its pauses: no
        // archive failure since the failure before the last, or none at all.
        assert!(!first_backup_due(
            &archiving(Some(980), 1150),
            &[&failed, &again],
            true,
            at(1151)
        ));
        assert!(!first_backup_due(
            &archiving(None, 1150),
            &[&failed, &again],
            true,
            at(1151)
        ));
        // After one failure, an archive failure at any time before counts once: the retry that
        // follows, failing again, waits.
        assert!(first_backup_due(
            &archiving(Some(500), 1000),
            &[&failed],
            true,
            at(1001)
        ));
        let retried = backup("shop-3", "shop", "Failed", "7", 1010);
        assert!(!first_backup_due(
            &archiving(Some(500), 1020),
            &[&failed, &retried],
            true,
            at(1021)
        ));
    }

    #[test]
    fn a_new_destination_gets_a_first_backup_of_its_own() {
        let pg = serving("7");
        let mut elsewhere = backup("shop-1", "shop", "Succeeded", "7", 900);
        if let Some(d) = elsewhere.status.as_mut().and_then(|s| s.destination.as_mut()) {
            d.s3.as_mut().unwrap().bucket = "old".into();
        }
        assert!(first_backup_due(&pg, &[&elsewhere], true, at(1000)));
    }

    #[test]
    fn backups_of_an_earlier_database_of_the_same_name_are_not_this_ones() {
        let pg = serving("7");
        let all = [
            backup("shop-1", "shop", "Succeeded", "6", 100),
            backup("shop-2", "shop", "Succeeded", "7", 200),
            backup("other-1", "other", "Succeeded", "7", 300),
        ];
        let names: Vec<String> = of_database(&pg, &all).iter().map(|b| b.name_any()).collect();
        assert_eq!(names, ["shop-2"]);
    }

    #[test]
    fn the_condition_and_the_count_follow_the_newest_backups() {
        let (old, failed, running) = (
            backup("old", "shop", "Succeeded", "7", 100),
            backup("new", "shop", "Failed", "7", 200),
            backup("running", "shop", "Running", "7", 300),
        );
        let mut summary = BackupsSummary::<PostgreSQLReason>::default();
        summary.count(&[&old, &failed, &running], stored);
        let condition = summary.condition.clone().unwrap();
        assert_eq!(
            (condition.status, condition.reason),
            (false, PostgreSQLReason::BackupFailed)
        );
        assert_eq!(
            summary.status.stored_backups,
            Some(1),
            "a failure still leaves the older backup"
        );
        assert_eq!(summary.status.last_backup.as_deref(), Some("old"));
        let newer = backup("newer", "shop", "Succeeded", "7", 250);
        summary.count(&[&old, &failed, &newer], stored);
        let condition = summary.condition.unwrap();
        assert_eq!(
            (condition.status, condition.reason),
            (true, PostgreSQLReason::BackupStored)
        );
        assert!(
            condition
                .message
                .contains("newer stored a base backup ending at WAL 0/2000100"),
            "{}",
            condition.message
        );
        assert_eq!(summary.status.last_backup.as_deref(), Some("newer"));
        assert_eq!(summary.status.last_backup_time.map(|t| t.0), Some(at(250)));
    }

    #[test]
    fn a_schedule_the_parser_refuses_is_a_problem_told_and_a_good_one_is_not() {
        let mut pg = with_backups(postgres("shop"));
        assert_eq!(schedule_problem(&pg), None, "no schedule");
        if let Some(backup) = pg.spec.backup.as_mut() {
            backup.plan.schedule = Some("0 3 * * *".into());
        }
        assert_eq!(schedule_problem(&pg), None);
        if let Some(backup) = pg.spec.backup.as_mut() {
            backup.plan.schedule = Some("99 * * * *".into());
        }
        let problem = schedule_problem(&pg).unwrap();
        assert_eq!(problem.reason, PostgreSQLReason::InvalidSchedule);
        assert!(problem.message.contains("99 * * * *"), "{}", problem.message);
    }
}
