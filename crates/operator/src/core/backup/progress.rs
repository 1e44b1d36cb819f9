//! How one backup moves: what a look at it found (a [`Verdict`]) and the progress that leaves
//! in its status, with the Event to send. Pure: the time is a parameter.
//!
//! A backup is Running until it is Succeeded or Failed, and never taken again after that. One
//! that waits (its database not serving, its volume not there yet, a member away for a moment)
//! waits until its deadline, then fails.

use noops_api::backup::BackupPhase;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use noops_api::backup::BackupReason;
use noops_api::backup::{BackupProgress, WorkProgress};

use super::schedule::elapsed;
use crate::core::conditions::{Decided, merge};
use crate::core::events::Announcement;

/// The condition of a backup: True once it is stored.
pub use noops_api::condition::SUCCEEDED;

/// Where a backup stands after one look at it.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict<T> {
    /// Stored; `T` is what the engine learnt of it.
    Succeeded(T),
    /// A pod is at work on it; `message` says which, for the condition.
    InProgress { message: String },
    /// Not yet: looked at again, up to the deadline.
    Wait { reason: BackupReason, message: String },
    /// Cannot be made as things stand.
    Failed { reason: BackupReason, message: String },
}

impl<T> Verdict<T> {
    /// The same verdict with what a success learnt turned into `U` (an engine records its own
    /// fields and says what was stored).
    pub fn map_succeeded<U>(self, f: impl FnOnce(T) -> U) -> Verdict<U> {
        match self {
            Verdict::Succeeded(taken) => Verdict::Succeeded(f(taken)),
            Verdict::InProgress { message } => Verdict::InProgress { message },
            Verdict::Wait { reason, message } => Verdict::Wait { reason, message },
            Verdict::Failed { reason, message } => Verdict::Failed { reason, message },
        }
    }
}

/// How often progress is written while the step stays the same: each write of a status wakes
/// its controller again, so what moves every second is written every so often.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// The progress to put in status: what was `read` now, stamped, once the step changes or
/// [`PROGRESS_EVERY`] has passed since the `previous` one; the previous one otherwise (so the
/// status does not change); none once the work reports none. Pure.
pub fn paced(
    previous: Option<&WorkProgress>,
    read: Option<WorkProgress>,
    now: jiff::Timestamp,
) -> Option<WorkProgress> {
    let mut read = read?;
    if let Some(previous) = previous
        && previous.step == read.step
        && previous
            .updated_at
            .as_ref()
            .is_some_and(|at| elapsed(at.0, now) < PROGRESS_EVERY)
    {
        return Some(previous.clone());
    }
    read.updated_at = Some(Time(now));
    Some(read)
}

/// Whether progress `previous` is due to be read again (a read costs a connection). Pure.
pub fn progress_due(previous: Option<&WorkProgress>, now: jiff::Timestamp) -> bool {
    previous
        .and_then(|p| p.updated_at.as_ref())
        .is_none_or(|at| elapsed(at.0, now) >= PROGRESS_EVERY)
}

/// How soon a backup is looked at again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// How long a backup may wait before it fails.
    pub wait_deadline: Duration,
    /// How soon a waiting backup is looked at again.
    pub retry: Duration,
    /// How often a pod at work is looked at, besides when it changes.
    pub in_progress_check: Duration,
}

/// What a verdict leaves.
#[derive(Debug, Clone, PartialEq)]
pub struct Settled {
    /// The backup's progress from now on (written only if it changed).
    pub progress: BackupProgress,
    /// The Event to send once it is written.
    pub announcement: Option<Announcement>,
    /// When to look again; none once it is done (Succeeded or Failed: its pod goes).
    pub look_again: Option<Duration>,
}

/// The progress `verdict` leaves, for a backup started at `started`; a success says `note`
/// of what was stored.
pub fn settle(
    progress: &BackupProgress,
    verdict: Verdict<String>,
    started: jiff::Timestamp,
    now: jiff::Timestamp,
    timing: Timing,
) -> Settled {
    let mut next = progress.clone();
    // (`started` is the deadlines' clock: a resumed backup's, from its resume; the status
    // keeps when it really began.)
    next.started_at = next.started_at.clone().or(Some(Time(started)));
    let (stored, reason, message) = match &verdict {
        Verdict::Succeeded(note) => (true, BackupReason::Stored, note.clone()),
        Verdict::InProgress { message } => (false, BackupReason::InProgress, message.clone()),
        Verdict::Wait { reason, message } | Verdict::Failed { reason, message } => (false, *reason, message.clone()),
    };
    next.conditions = merge(
        &next.conditions,
        &[Decided::new(SUCCEEDED, stored, reason, message.clone())],
        None,
        now,
    );
    let waited_too_long = elapsed(started, now) >= timing.wait_deadline;
    let (phase, announcement, look_again) = match verdict {
        Verdict::Succeeded(_) => (
            BackupPhase::Succeeded,
            Some(Announcement::normal("BackupSucceeded", message)),
            None,
        ),
        Verdict::InProgress { .. } => (BackupPhase::Running, None, Some(timing.in_progress_check)),
        Verdict::Wait { .. } if !waited_too_long => (BackupPhase::Running, None, Some(timing.retry)),
        Verdict::Wait { .. } | Verdict::Failed { .. } => {
            (BackupPhase::Failed, Some(Announcement::warning(reason, message)), None)
        }
    };
    next.phase = Some(phase);
    if look_again.is_none() {
        next.completed_at = Some(Time(now));
    }
    Settled {
        progress: next,
        announcement,
        look_again,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMING: Timing = Timing {
        wait_deadline: Duration::from_secs(600),
        retry: Duration::from_secs(5),
        in_progress_check: Duration::from_secs(30),
    };

    fn at(seconds: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(seconds).unwrap()
    }

    #[test]
    fn progress_is_written_when_its_step_changes_or_every_so_often() {
        let work = |step: &str, done: i64| WorkProgress {
            step: step.into(),
            bytes_done: Some(done),
            ..Default::default()
        };
        let first = paced(None, Some(work("downloading", 10)), at(100)).unwrap();
        assert_eq!(first.updated_at, Some(Time(at(100))));
        // Moved, but soon after: the status stays as it is (its write would wake a pass).
        let soon = paced(Some(&first), Some(work("downloading", 20)), at(105)).unwrap();
        assert_eq!(soon, first);
        assert!(!progress_due(Some(&first), at(105)));
        // A new step at once; the same step after a while.
        let next = paced(Some(&first), Some(work("replaying", 20)), at(105)).unwrap();
        assert_eq!(
            (next.step.as_str(), next.updated_at.clone()),
            ("replaying", Some(Time(at(105))))
        );
        let later = paced(Some(&first), Some(work("downloading", 30)), at(111)).unwrap();
        assert_eq!(later.bytes_done, Some(30));
        assert!(progress_due(Some(&first), at(111)));
        // Nothing reported: nothing said.
        assert_eq!(paced(Some(&first), None, at(111)), None);
    }

    fn condition(settled: &Settled) -> (String, String, String) {
        let c = &settled.progress.conditions[0];
        (c.type_.clone(), c.status.clone(), c.reason.clone())
    }

    #[test]
    fn a_stored_backup_succeeds_and_says_so_in_an_event() {
        let settled = settle(
            &BackupProgress::default(),
            Verdict::Succeeded("stored 3 bytes".into()),
            at(100),
            at(160),
            TIMING,
        );
        assert_eq!(settled.progress.phase, Some(BackupPhase::Succeeded));
        assert_eq!(settled.progress.started_at, Some(Time(at(100))));
        assert_eq!(settled.progress.completed_at, Some(Time(at(160))));
        assert_eq!(
            condition(&settled),
            ("Succeeded".into(), "True".into(), "Stored".into())
        );
        assert!(settled.look_again.is_none());
        let event = settled.announcement.unwrap();
        assert_eq!(
            (event.reason.as_str(), event.note.as_str()),
            ("BackupSucceeded", "stored 3 bytes")
        );
    }

    #[test]
    fn a_waiting_backup_runs_until_its_deadline_then_fails_with_the_reason_it_waited_for() {
        let waiting = || Verdict::Wait {
            reason: BackupReason::ClaimNotFound,
            message: "no claim".into(),
        };
        let settled = settle(&BackupProgress::default(), waiting(), at(0), at(599), TIMING);
        assert_eq!(settled.progress.phase, Some(BackupPhase::Running));
        assert_eq!(settled.look_again, Some(TIMING.retry));
        assert!(settled.look_again.is_some() && settled.announcement.is_none());
        assert_eq!(settled.progress.completed_at, None);
        assert_eq!(condition(&settled).2, "ClaimNotFound");

        let settled = settle(&settled.progress, waiting(), at(0), at(600), TIMING);
        assert_eq!(settled.progress.phase, Some(BackupPhase::Failed));
        assert!(settled.look_again.is_none());
        assert_eq!(settled.announcement.unwrap().reason, "ClaimNotFound");
    }

    #[test]
    fn a_backup_at_work_is_looked_at_again_and_a_failed_one_is_done_at_once() {
        let settled = settle(
            &BackupProgress::default(),
            Verdict::InProgress {
                message: "pod x saves it".into(),
            },
            at(0),
            at(5000),
            TIMING,
        );
        assert_eq!(settled.progress.phase, Some(BackupPhase::Running));
        assert_eq!(settled.look_again, Some(TIMING.in_progress_check));
        assert_eq!(condition(&settled).2, "InProgress");

        let settled = settle(
            &BackupProgress::default(),
            Verdict::Failed {
                reason: BackupReason::NoDestination,
                message: "nowhere".into(),
            },
            at(0),
            at(1),
            TIMING,
        );
        assert_eq!(settled.progress.phase, Some(BackupPhase::Failed));
        assert!(settled.look_again.is_none());
        assert!(settled.announcement.unwrap().warning);
    }

    #[test]
    fn a_success_maps_what_it_learnt_and_the_rest_stays() {
        let learnt: Verdict<u32> = Verdict::Succeeded(3);
        assert_eq!(learnt.map_succeeded(|n| n * 2), Verdict::Succeeded(6));
        let waiting: Verdict<u32> = Verdict::Wait {
            reason: BackupReason::NotStored,
            message: "m".into(),
        };
        assert_eq!(
            waiting.map_succeeded(|n| n * 2),
            Verdict::Wait {
                reason: BackupReason::NotStored,
                message: "m".into()
            }
        );
    }
}
