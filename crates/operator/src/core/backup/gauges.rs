//! What a resource's status says of its backups, as the metrics monitoring alerts on: when the
//! newest backup succeeded and how often the schedule makes one. Pure.

use noops_api::backup::BackupsStatus;

use super::schedule;
use crate::core::metrics::BackupGauges;

/// Seconds since the epoch, as Prometheus takes timestamps.
pub fn epoch_seconds(t: jiff::Timestamp) -> f64 {
    t.as_millisecond() as f64 / 1000.0
}

/// The gauges of a resource whose backups are `status` and whose schedule is `schedule`.
pub fn of(status: &BackupsStatus, schedule: Option<&str>, now: jiff::Timestamp) -> BackupGauges {
    BackupGauges {
        last_success: status.last_backup_time.as_ref().map(|t| epoch_seconds(t.0)),
        interval: schedule
            .and_then(|s| schedule::parse(s).ok())
            .and_then(|cron| schedule::interval(&cron, now))
            .map(|d| d.as_secs_f64()),
        schedule_since: schedule.and(status.schedule_since.as_ref()).map(|t| epoch_seconds(t.0)),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_last_success_and_the_schedules_interval() {
        let status = BackupsStatus {
            last_backup_time: Some(Time(at("2026-11-26T10:00:00Z"))),
            schedule_since: Some(Time(at("2026-11-20T00:00:00Z"))),
            ..Default::default()
        };
        let gauges = of(&status, Some("0 */6 * * *"), at("2026-11-26T13:00:00Z"));
        assert_eq!(gauges.last_success, Some(epoch_seconds(at("2026-11-26T10:00:00Z"))));
        assert_eq!(gauges.interval, Some(6.0 * 3600.0));
        assert_eq!(gauges.schedule_since, Some(epoch_seconds(at("2026-11-20T00:00:00Z"))));
        // A schedule taken away takes its series with it, whatever the status still says.
        assert_eq!(of(&status, None, at("2026-11-26T13:00:00Z")).schedule_since, None);
    }

    #[test]
    fn no_backup_yet_and_no_schedule_give_no_series() {
        let gauges = of(&BackupsStatus::default(), None, at("2026-11-26T13:00:00Z"));
        assert_eq!(gauges, BackupGauges::default());
        let unreadable = of(
            &BackupsStatus::default(),
            Some("not a schedule"),
            at("2026-11-26T13:00:00Z"),
        );
        assert_eq!(unreadable.interval, None);
    }
}
