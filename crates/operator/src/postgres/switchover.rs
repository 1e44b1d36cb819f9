//! A switchover: the primary steps down for a replica a user names (the `noops.dev/promote`
//! annotation, which `kubectl noops promote` sets), and no commit is lost. Pure: the checks of
//! a request, the switchover's record on the primary's lease, and the next step.
//!
//! 1. Asked: the request is checked (an instance of the spec, a replica that streams, within
//!    the lag bound). Refused: a `SwitchoverRefused` Event says why, the annotation goes.
//! 2. Stepping down: the operator releases the lease (no holder) and records on it, in the same
//!    write, who steps down, for whom, and when. The primary's instance manager sees the lease
//!    released and shuts its server down cleanly (a fast shutdown: its WAL senders send every
//!    record, the shutdown checkpoint last, to the replicas that stream, and wait until they
//!    have flushed it), then writes on the lease where its WAL ends, or that it could not stop
//!    cleanly.
//! 3. Handed over: once the chosen replica has received past that end, the lease is handed to
//!    it and it promotes. Nothing the old primary acknowledged is missing from it.
//! 4. Given back: if the old primary could not stop cleanly, or the replica does not receive
//!    its last record within [`CATCH_UP_WITHIN`], the lease goes back to the old primary, which
//!    starts again as the primary: a switchover costs a write gap, never a commit. An old
//!    primary that says nothing for [`SILENT_FOR`] (it died meanwhile, or is cut off: its
//!    fence deadline or its step-down bound has stopped it by then) is lost, and a failover
//!    follows as for any lost primary.
//!
//! The record lives on the lease, written with the release itself: an operator restarted at any
//! point carries on from what the lease says.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;

use super::names::Names;
use super::position::{Position, lsn};
use super::sql::Standby;
use super::synchronous::FRESH_REPLY;

/// Who steps down, for whom, when (RFC 3339), and where the old primary's WAL ended.
pub const FROM_ANNOTATION: &str = "noops.dev/switchover-from";
pub const TO_ANNOTATION: &str = "noops.dev/switchover-to";
pub const AT_ANNOTATION: &str = "noops.dev/switchover-at";
pub const STOPPED_ANNOTATION: &str = "noops.dev/stopped-at";
/// Who gave the lease up as its server stopped (`failover::given_up`), written with the release
/// itself beside where its WAL ended; a handover forgets it with the rest.
pub const RELEASED_BY_ANNOTATION: &str = "noops.dev/released-by";
/// Why the switchover is made: asked for, or the last step of a rolling change.
pub const WHY_ANNOTATION: &str = "noops.dev/switchover-why";
/// The last switchover handed over: `<from>,<to>,<received LSN>`, so that an operator that
/// stopped right after the handover still records it in the status.
pub const DONE_ANNOTATION: &str = "noops.dev/switched-over";
/// The value of [`STOPPED_ANNOTATION`] for a server that did not stop cleanly.
const UNCLEAN: &str = "unclean";

pub use noops_api::postgres::SWITCHOVER_LAG_BOUND_BYTES as LAG_BOUND_BYTES;
/// How long the chosen replica may take to receive the old primary's last record once it
/// stopped (as the operator saw the report), before the lease goes back to the old primary.
pub const CATCH_UP_WITHIN: Duration = Duration::from_secs(10);
/// How long a primary stepping down may take to shut down cleanly before it is stopped at
/// once (and the switchover given back to it).
pub const STEP_DOWN_WITHIN: Duration = Duration::from_secs(5);
/// How long the operator waits, from the release, for the old primary to say it stopped
/// before it counts it lost and fails over: longer than the slowest step-down and its report
/// (it sees the release within a read and a request, steps down for [`STEP_DOWN_WITHIN`], is
/// killed within [`KILL_WITHIN`](super::lease::KILL_WITHIN), then reads and writes the lease)
/// and than its fence deadline, with the margin a stopped server's processes need to be gone.
/// By then its server has stopped, whatever became of it.
pub const SILENT_FOR: Duration = Duration::from_secs(20);

/// Where a stopped server's WAL ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// A clean shutdown: its last record is the shutdown checkpoint at this position.
    Clean(Position),
    /// Stopped any other way (killed, or the shutdown took too long): WAL may follow its last
    /// checkpoint that no replica has.
    Unclean,
}

impl Stopped {
    /// What [`STOPPED_ANNOTATION`] says: `<timeline>:<LSN>`, or anything else for unclean.
    pub fn from_note(text: &str) -> Self {
        let clean = text.split_once(':').and_then(|(timeline, at)| {
            lsn(at)?;
            Some(Position {
                timeline: timeline.parse().ok()?,
                lsn: at.to_string(),
            })
        });
        clean.map_or(Stopped::Unclean, Stopped::Clean)
    }

    /// What [`STOPPED_ANNOTATION`] is to say of it.
    pub fn note(&self) -> String {
        match self {
            Stopped::Clean(at) => format!("{}:{}", at.timeline, at.lsn),
            Stopped::Unclean => UNCLEAN.into(),
        }
    }
}

/// A switchover as the lease records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub from: String,
    pub to: String,
    /// When the operator released the lease (its clock).
    pub at: Option<jiff::Timestamp>,
    /// What the old primary wrote once its server stopped.
    pub stopped: Option<Stopped>,
    /// Why it is made.
    pub why: Option<String>,
}

fn annotations(lease: &Lease) -> Option<&BTreeMap<String, String>> {
    lease.metadata.annotations.as_ref()
}

/// The switchover `lease` records, if it does.
pub fn record(lease: &Lease) -> Option<Record> {
    let notes = annotations(lease)?;
    Some(Record {
        from: notes.get(FROM_ANNOTATION)?.clone(),
        to: notes.get(TO_ANNOTATION)?.clone(),
        at: notes.get(AT_ANNOTATION).and_then(|t| t.parse().ok()),
        stopped: notes.get(STOPPED_ANNOTATION).map(|s| Stopped::from_note(s)),
        why: notes.get(WHY_ANNOTATION).cloned(),
    })
}

/// Whether `lease` is released for a switchover now.
pub fn under_way(lease: &Lease) -> bool {
    record(lease).is_some() && super::account::holder(lease).is_none()
}

/// `lease` released by its holder `from` for `to` (`why`), the switchover recorded on it (its
/// resourceVersion kept: the precondition of the write, so a renewal meanwhile wins).
pub fn step_down(lease: &Lease, (from, to): (&str, &str), why: &str, now: jiff::Timestamp) -> Lease {
    let mut next = lease.clone();
    next.metadata.managed_fields = None;
    let notes = next.metadata.annotations.get_or_insert_with(Default::default);
    notes.insert(FROM_ANNOTATION.into(), from.into());
    notes.insert(TO_ANNOTATION.into(), to.into());
    notes.insert(AT_ANNOTATION.into(), now.to_string());
    notes.insert(WHY_ANNOTATION.into(), why.into());
    notes.remove(STOPPED_ANNOTATION);
    if let Some(spec) = next.spec.as_mut() {
        spec.holder_identity = None;
    }
    next
}

/// `lease` with where the stepped-down server's WAL ended written on it.
pub fn with_stopped(lease: &Lease, stopped: &Stopped) -> Lease {
    let mut next = lease.clone();
    next.metadata.managed_fields = None;
    next.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(STOPPED_ANNOTATION.into(), stopped.note());
    next
}

/// `lease` without a switchover's record, nor the last one's: a handover ends it.
pub fn forget(lease: &mut Lease) {
    if let Some(notes) = lease.metadata.annotations.as_mut() {
        for key in [
            FROM_ANNOTATION,
            TO_ANNOTATION,
            AT_ANNOTATION,
            STOPPED_ANNOTATION,
            WHY_ANNOTATION,
            DONE_ANNOTATION,
            RELEASED_BY_ANNOTATION,
        ] {
            notes.remove(key);
        }
    }
}

/// `lease` handed to `holder` now (a failover, or a switchover given back): whatever a
/// switchover noted on it is over.
pub fn hand_over_to(lease: &Lease, holder: &str, now: jiff::Timestamp) -> Lease {
    let mut next = super::account::hand_over(lease, holder, now);
    forget(&mut next);
    next
}

/// `lease` handed over to the replica of `record`, which had received up to `received`, the
/// switchover noted as done.
pub fn hand_over(lease: &Lease, record: &Record, received: &str, now: jiff::Timestamp) -> Lease {
    let mut next = hand_over_to(lease, &record.to, now);
    let notes = next.metadata.annotations.get_or_insert_with(Default::default);
    notes.insert(
        DONE_ANNOTATION.into(),
        format!("{},{},{received}", record.from, record.to),
    );
    if let Some(why) = &record.why {
        notes.insert(WHY_ANNOTATION.into(), why.clone());
    }
    next
}

/// The last switchover handed over, as `lease` notes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    pub from: String,
    pub to: String,
    pub received: Option<String>,
    pub why: Option<String>,
}

pub fn done(lease: &Lease) -> Option<Done> {
    let notes = annotations(lease)?;
    let text = notes.get(DONE_ANNOTATION)?;
    let mut parts = text.split(',');
    let (from, to) = (parts.next()?.to_string(), parts.next()?.to_string());
    Some(Done {
        from,
        to,
        received: parts.next().filter(|r| !r.is_empty()).map(str::to_string),
        why: notes.get(WHY_ANNOTATION).cloned(),
    })
}

/// Why replica `to` (not the primary: a request naming the primary is done) cannot be
/// switched to now, as the primary `primary` reports its streams. `standby`: what the primary
/// says of `to`'s stream (none: it has none).
pub fn refusal(
    names: &Names,
    instances: i32,
    primary: &str,
    to: &str,
    standby: Option<&Standby>,
) -> Result<(), String> {
    match names.ordinal(to) {
        Some(i) if i < instances => {}
        _ => {
            return Err(format!(
                "{to} is not an instance of this database (its instances are {}-0 to {}-{})",
                names.name,
                names.name,
                instances - 1
            ));
        }
    }
    let Some(standby) = standby else {
        return Err(format!("{to} does not stream from the primary {primary}"));
    };
    let fresh = FRESH_REPLY.as_millis() as i64;
    if standby.state != "streaming" || standby.reply_age_millis.is_none_or(|age| age > fresh) {
        return Err(format!(
            "{to} does not stream from the primary {primary} now (its stream is {}, last reply {})",
            if standby.state.is_empty() {
                "unknown"
            } else {
                &standby.state
            },
            standby
                .reply_age_millis
                .map_or_else(|| "never".to_string(), |age| format!("{age} ms ago"))
        ));
    }
    match standby.lag_bytes {
        Some(lag) if lag > LAG_BOUND_BYTES => Err(format!(
            "{to} lags {lag} bytes of WAL behind the primary, more than the {LAG_BOUND_BYTES} a switchover allows"
        )),
        _ => Ok(()),
    }
}

/// What a pass does about a switchover under way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Nothing yet: the old primary is stopping, or the replica is receiving its last records.
    Wait,
    /// The replica has received everything: hand the lease to it.
    HandOver,
    /// Back to the old primary, for this reason.
    GiveBack(String),
    /// The old primary said nothing for a whole lease: it is lost.
    FailOver(String),
}

/// The next step of `record`. `unchanged_for`: how long the operator has seen the lease
/// unchanged (none: not seen a change since it started): since the release until the old
/// primary reports, since its report after; `received`: where the replica is, if it said.
pub fn next(record: &Record, unchanged_for: Option<Duration>, received: Option<&Position>) -> Next {
    let unchanged = unchanged_for.unwrap_or_default();
    let Some(stopped) = &record.stopped else {
        return if unchanged >= SILENT_FOR {
            Next::FailOver(format!(
                "{} did not say it had stopped for the switchover to {} within {}s",
                record.from,
                record.to,
                SILENT_FOR.as_secs()
            ))
        } else {
            Next::Wait
        };
    };
    let Stopped::Clean(end) = stopped else {
        return Next::GiveBack(format!(
            "{} could not shut its server down cleanly, so {} may not have all of its WAL",
            record.from, record.to
        ));
    };
    let caught_up = received.is_some_and(|at| at.past(end));
    if caught_up {
        Next::HandOver
    } else if unchanged >= CATCH_UP_WITHIN {
        Next::GiveBack(format!(
            "{} had not received {}'s last record ({end}) {}s after it stopped (it is at {})",
            record.to,
            record.from,
            CATCH_UP_WITHIN.as_secs(),
            received.map_or_else(|| "an unknown position".to_string(), ToString::to_string)
        ))
    } else {
        Next::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::account;
    use crate::postgres::fixtures::{names, owner};
    use crate::postgres::lease::{FENCE_AFTER, KILL_WITHIN, RENEW_EVERY, REQUEST_TIMEOUT, STOP_MARGIN};

    const LEASE: Duration = crate::postgres::lease::LEASE;

    fn standby(state: &str, lag: i64, reply_age: Option<i64>) -> Standby {
        Standby {
            name: "shop-1".into(),
            state: state.into(),
            flush_lsn: None,
            replay_lsn: None,
            lag_bytes: Some(lag),
            replay_lag_millis: None,
            reply_age_millis: reply_age,
        }
    }

    fn at(timeline: u32, lsn: &str) -> Position {
        Position {
            timeline,
            lsn: lsn.into(),
        }
    }

    #[test]
    fn a_request_names_a_replica_of_the_spec_that_streams_within_the_bound() {
        let names = names();
        let ok = standby("streaming", 1024, Some(300));
        assert_eq!(refusal(&names, 3, "shop-0", "shop-1", Some(&ok)), Ok(()));
        let why = |to: &str, s: Option<&Standby>| refusal(&names, 3, "shop-0", to, s).unwrap_err();
        assert!(why("shop-3", Some(&ok)).contains("not an instance"));
        assert!(why("other-1", Some(&ok)).contains("not an instance"));
        assert!(why("shop-1", None).contains("does not stream"));
        assert!(why("shop-1", Some(&standby("catchup", 0, Some(100)))).contains("catchup"));
        assert!(
            why("shop-1", Some(&standby("streaming", 0, Some(9_000)))).contains("9000 ms ago"),
            "a frozen replica is not streaming, whatever its state"
        );
        let lagging = why("shop-1", Some(&standby("streaming", LAG_BOUND_BYTES + 1, Some(100))));
        assert!(lagging.contains("lags") && lagging.contains("bytes"), "{lagging}");
    }

    #[test]
    fn the_record_is_written_with_the_release_and_forgotten_with_the_handover() {
        let names = names();
        let now = jiff::Timestamp::now();
        let mut held = account::lease(&names, &owner(), "shop-0", now);
        held.metadata.resource_version = Some("7".into());
        let released = step_down(&held, ("shop-0", "shop-2"), "a switchover was asked for", now);
        assert_eq!(account::holder(&released), None);
        assert_eq!(released.metadata.resource_version.as_deref(), Some("7"));
        let recorded = record(&released).unwrap();
        assert_eq!((recorded.from.as_str(), recorded.to.as_str()), ("shop-0", "shop-2"));
        assert_eq!(recorded.at, Some(now));
        assert_eq!(recorded.stopped, None);
        assert_eq!(recorded.why.as_deref(), Some("a switchover was asked for"));
        let stopped = with_stopped(&released, &Stopped::Clean(at(3, "0/5000028")));
        assert_eq!(
            record(&stopped).unwrap().stopped,
            Some(Stopped::Clean(at(3, "0/5000028")))
        );
        let unclean = with_stopped(&released, &Stopped::Unclean);
        assert_eq!(record(&unclean).unwrap().stopped, Some(Stopped::Unclean));
        let handed = hand_over(&stopped, &record(&stopped).unwrap(), "0/50000A0", now);
        assert_eq!(record(&handed), None);
        assert_eq!(account::holder(&handed).as_deref(), Some("shop-2"));
        assert_eq!(
            done(&handed),
            Some(Done {
                from: "shop-0".into(),
                to: "shop-2".into(),
                received: Some("0/50000A0".into()),
                why: Some("a switchover was asked for".into()),
            })
        );
        // A failover after it forgets it.
        assert_eq!(done(&hand_over_to(&handed, "shop-1", now)), None);
    }

    #[test]
    fn the_replica_is_promoted_only_once_it_has_received_past_the_old_primarys_last_record() {
        let stopped = |s: Option<Stopped>| Record {
            from: "shop-0".into(),
            to: "shop-1".into(),
            at: None,
            stopped: s,
            why: None,
        };
        let second = Some(Duration::from_secs(1));
        // Still stopping.
        assert_eq!(next(&stopped(None), second, None), Next::Wait);
        assert_eq!(next(&stopped(None), None, None), Next::Wait, "an operator just started");
        assert_eq!(
            next(&stopped(None), Some(LEASE), None),
            Next::Wait,
            "a step-down takes longer than a lease"
        );
        assert!(matches!(
            next(&stopped(None), Some(SILENT_FOR), None),
            Next::FailOver(why) if why.contains("did not say")
        ));
        let clean = stopped(Some(Stopped::Clean(at(1, "0/5000028"))));
        // Received up to the checkpoint's start, not past it: not yet.
        assert_eq!(next(&clean, second, Some(&at(1, "0/5000028"))), Next::Wait);
        assert_eq!(next(&clean, second, Some(&at(1, "0/50000A0"))), Next::HandOver);
        // Another timeline is not the old primary's WAL.
        assert_eq!(next(&clean, second, Some(&at(2, "0/6000000"))), Next::Wait);
        assert!(matches!(
            next(&clean, Some(CATCH_UP_WITHIN), Some(&at(1, "0/4000000"))),
            Next::GiveBack(why) if why.contains("0/4000000 on timeline 1")
        ));
        assert!(matches!(
            next(&stopped(Some(Stopped::Unclean)), second, None),
            Next::GiveBack(why) if why.contains("cleanly")
        ));
    }

    #[test]
    fn the_old_primary_has_stopped_before_it_is_counted_lost() {
        let slowest_step_down = RENEW_EVERY + REQUEST_TIMEOUT + STEP_DOWN_WITHIN + KILL_WITHIN;
        // Its report: a read and a write of the lease.
        let reported = slowest_step_down + 2 * REQUEST_TIMEOUT;
        assert!(reported.max(FENCE_AFTER + STOP_MARGIN) < SILENT_FOR);
    }
}
