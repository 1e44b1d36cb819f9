//! Who the primary is, and when and to whom the operator hands the primary's lease over. Pure.
//!
//! - With replicas, the primary is the lease's holder: the lease is the only word (`lease.rs`).
//!   The operator makes it, held by the primary it knew (`status.currentPrimary`, or the first
//!   instance of a new database), and deletes it when the database is one instance again.
//! - The operator makes the lease unrenewed: until its holder renews it once, the primary has
//!   not started (a new database still in its init container), which is not a lost primary.
//!   A lease handed over counts as renewed, so a chosen replica that dies before it promotes
//!   is replaced in turn.
//! - A lease that has gone unchanged for `LEASE` (as the operator counts it) ran out: its
//!   holder is dead, cut off or stuck, and has stopped its server by its own deadline. One given
//!   up (no holder) was released by a primary whose server stopped. Either way the operator
//!   promotes the Ready replica that received the most WAL (not the one that replayed the most:
//!   what it received is what it will have once it has replayed), the lowest ordinal of those
//!   equal; with none to promote, it waits, and says so.
//! - A primary that gives its lease up writes with the release where its server's WAL ended
//!   (`Release`). After a clean stop only a replica that received its last record is
//!   promoted: one behind it would lose commits the primary acknowledged (a replica that was
//!   reconnecting when its pod was deleted). With none, the old primary is waited for: the
//!   lease goes back to it once its pod runs again, and it serves again as it was.
//! - One instance: no lease; the first instance is the primary, as before replicas.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;

use super::lease::{LEASE, RENEW_EVERY};
use super::names::Names;
use super::position::{Position, lsn};
pub use super::switchover::RELEASED_BY_ANNOTATION;
use super::switchover::{Record, STOPPED_ANNOTATION, Stopped};

/// A primary that gave its lease up, as the lease notes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub by: String,
    /// Where its WAL ended.
    pub stopped: Stopped,
}

/// The release `lease` notes, if nobody holds it and it was given up by its primary (an
/// instance manager of an earlier version gave it up without a word: none).
pub fn release(lease: &Lease) -> Option<Release> {
    if super::account::holder(lease).is_some() {
        return None;
    }
    let notes = lease.metadata.annotations.as_ref()?;
    Some(Release {
        by: notes.get(RELEASED_BY_ANNOTATION)?.clone(),
        stopped: notes
            .get(STOPPED_ANNOTATION)
            .map_or(Stopped::Unclean, |s| Stopped::from_note(s)),
    })
}

/// `lease` given up by its holder `by`, whose server stopped as `stopped` says (its
/// resourceVersion kept: the precondition of the write).
pub fn given_up(lease: &Lease, by: &str, stopped: &Stopped) -> Lease {
    let mut next = lease.clone();
    next.metadata.managed_fields = None;
    let notes = next.metadata.annotations.get_or_insert_with(Default::default);
    notes.insert(RELEASED_BY_ANNOTATION.into(), by.into());
    notes.insert(STOPPED_ANNOTATION.into(), stopped.note());
    if let Some(spec) = next.spec.as_mut() {
        spec.holder_identity = None;
    }
    next
}

/// The replicas among `candidates` that a failover after `release` may promote. After a
/// clean stop, only those that received the old primary's last record; `Err` (why none may)
/// when none did: the old primary is to be waited for, not a commit lost. Otherwise (a primary
/// killed, crashed or cut off) all of them: what none received is not known.
pub fn complete(
    candidates: &[(String, Position)],
    release: Option<&Release>,
) -> Result<Vec<(String, Position)>, String> {
    let Some(Release {
        by,
        stopped: Stopped::Clean(end),
    }) = release
    else {
        return Ok(candidates.to_vec());
    };
    let complete: Vec<_> = candidates.iter().filter(|(_, at)| at.past(end)).cloned().collect();
    if !complete.is_empty() {
        return Ok(complete);
    }
    let seen = if candidates.is_empty() {
        "no Ready replica said where it is".to_string()
    } else {
        candidates
            .iter()
            .map(|(pod, at)| format!("{pod} received up to {at}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(format!(
        "no replica has all of {by}'s WAL, which ended at {end} ({seen})"
    ))
}

/// The lease as the pass sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    pub holder: Option<String>,
    /// Its holder renewed it at least once (or the operator handed it over).
    pub taken: bool,
    /// How long the operator has seen it unchanged (none: not seen change yet since it started,
    /// counted as fresh).
    pub unchanged_for: Option<Duration>,
    /// The switchover it records, if the operator released it for one.
    pub switchover: Option<Record>,
    /// What its primary noted when it gave it up, if it did.
    pub release: Option<Release>,
}

/// What the pass does about the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseStep {
    /// Nothing: as it should be.
    Keep,
    /// Make it, held by this instance.
    Make(String),
    /// The database is one instance again: the lease goes.
    Remove,
    /// Hand it over to a replica: the primary `from` is lost, for `why`.
    FailOver { from: Option<String>, why: String },
    /// Released for a switchover (`switchover.rs`): carry it on.
    SwitchOver(Record),
}

/// Who the primary is and what to do about the lease. `recorded`: the primary the status
/// last named.
pub fn primary(
    names: &Names,
    instances: i32,
    lease: Option<&LeaseView>,
    recorded: Option<&str>,
) -> (String, LeaseStep) {
    let known = recorded.map_or_else(|| names.instance(), str::to_string);
    match lease {
        None if instances > 1 => (known.clone(), LeaseStep::Make(known)),
        None => (known, LeaseStep::Keep),
        Some(_) if instances <= 1 && known == names.instance() => (known, LeaseStep::Remove),
        Some(view) => match &view.holder {
            // Released by the operator for a switchover: the old primary stays the primary
            // until the lease is handed over.
            None if let Some(record) = &view.switchover => (record.from.clone(), LeaseStep::SwitchOver(record.clone())),
            // Given up by its primary: the one it names is the old primary, whatever the
            // status said last.
            None => {
                let from = view.release.as_ref().map_or(known, |r| r.by.clone());
                let why = match view.release.as_ref().map(|r| &r.stopped) {
                    Some(Stopped::Clean(end)) => {
                        format!("the primary gave its lease up: its server stopped cleanly at {end}")
                    }
                    _ => "the primary gave its lease up: its server stopped".into(),
                };
                (from.clone(), LeaseStep::FailOver { from: Some(from), why })
            }
            Some(holder) if view.taken && view.unchanged_for.is_some_and(|d| d >= LEASE) => (
                holder.clone(),
                LeaseStep::FailOver {
                    from: Some(holder.clone()),
                    why: format!(
                        "the primary's lease ran out: {holder} has not renewed it for {}s",
                        view.unchanged_for.map_or(0, |d| d.as_secs())
                    ),
                },
            ),
            Some(holder) => (holder.clone(), LeaseStep::Keep),
        },
    }
}

/// How long a holder may go without renewing its lease before a pass stops asking its server
/// anything: a primary that is dead or cut off answers no connection, and a pass waiting for
/// one to time out would hold the failover back (the lease running out wakes a pass that
/// cannot start before the last one ends). Three renewals missed: a slow API server alone
/// rarely does that, and a pass that starts just before it waits at most a connection timeout
/// (3 s), ending before the lease (6 s) runs out.
pub const NOT_ASKED_AFTER: Duration = Duration::from_secs(3 * RENEW_EVERY.as_secs());

/// How long the lease's holder `primary` has gone without renewing it, if that is long enough
/// that its server is not asked this pass (`NOT_ASKED_AFTER`). A lease not yet taken (a new
/// primary still starting) or handed over is not silent.
pub fn silent_for(view: &LeaseView, primary: &str) -> Option<Duration> {
    let held = view.taken && view.holder.as_deref() == Some(primary);
    view.unchanged_for.filter(|d| held && *d >= NOT_ASKED_AFTER)
}

/// The replica to promote among `candidates` (pod, where it is), none of them the lost
/// primary `from`: the most advanced, the lowest ordinal of those equal. Only replicas on the
/// newest timeline among them may be chosen.
pub fn choose(names: &Names, candidates: &[(String, Position)], from: Option<&str>) -> Option<String> {
    candidates
        .iter()
        .filter(|(pod, _)| Some(pod.as_str()) != from)
        .filter_map(|(pod, at)| Some(((at.timeline, lsn(&at.lsn)?), pod)))
        .max_by(|(a, pa), (b, pb)| a.cmp(b).then_with(|| names.ordinal(pb).cmp(&names.ordinal(pa))))
        .map(|(_, pod)| pod.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::postgres::fixtures::names;

    fn view(holder: Option<&str>, unchanged: u64) -> LeaseView {
        LeaseView {
            holder: holder.map(str::to_string),
            taken: true,
            unchanged_for: Some(Duration::from_secs(unchanged)),
            switchover: None,
            release: None,
        }
    }

    #[test]
    fn with_replicas_the_lease_is_made_for_the_known_primary_and_its_holder_is_the_primary() {
        let names = names();
        assert_eq!(
            primary(&names, 3, None, None),
            ("shop-0".into(), LeaseStep::Make("shop-0".into()))
        );
        assert_eq!(
            primary(&names, 3, None, Some("shop-2")),
            ("shop-2".into(), LeaseStep::Make("shop-2".into()))
        );
        assert_eq!(
            primary(&names, 3, Some(&view(Some("shop-1"), 1)), Some("shop-0")),
            ("shop-1".into(), LeaseStep::Keep),
            "the lease is the word"
        );
        assert_eq!(primary(&names, 1, None, None), ("shop-0".into(), LeaseStep::Keep));
        assert_eq!(
            primary(&names, 1, Some(&view(Some("shop-0"), 1)), Some("shop-0")),
            ("shop-0".into(), LeaseStep::Remove)
        );
        // An operator just started has seen no change yet: the lease counts as fresh.
        let unseen = LeaseView {
            holder: Some("shop-0".into()),
            taken: true,
            unchanged_for: None,
            switchover: None,
            release: None,
        };
        assert_eq!(primary(&names, 3, Some(&unseen), None).1, LeaseStep::Keep);
        // A primary still in its init container has not taken the lease: not lost.
        let untaken = LeaseView {
            holder: Some("shop-0".into()),
            taken: false,
            unchanged_for: Some(Duration::from_secs(300)),
            switchover: None,
            release: None,
        };
        assert_eq!(primary(&names, 3, Some(&untaken), None).1, LeaseStep::Keep);
    }

    #[test]
    fn a_lease_run_out_or_given_up_is_a_failover() {
        let names = names();
        let (_, step) = primary(&names, 3, Some(&view(Some("shop-0"), 6)), Some("shop-0"));
        assert!(
            matches!(&step, LeaseStep::FailOver { from: Some(f), why } if f == "shop-0" && why.contains("ran out")),
            "{step:?}"
        );
        assert_eq!(
            primary(&names, 3, Some(&view(Some("shop-0"), 5)), None).1,
            LeaseStep::Keep
        );
        let (_, step) = primary(&names, 3, Some(&view(None, 0)), Some("shop-1"));
        assert!(matches!(step, LeaseStep::FailOver { from: Some(f), .. } if f == "shop-1"));
        // Given up by the primary it names, whatever the status said last.
        let given_up = LeaseView {
            release: Some(Release {
                by: "shop-2".into(),
                stopped: Stopped::Clean(Position {
                    timeline: 2,
                    lsn: "0/4026F00".into(),
                }),
            }),
            ..view(None, 0)
        };
        let (primary_now, step) = primary(&names, 3, Some(&given_up), Some("shop-1"));
        assert_eq!(primary_now, "shop-2");
        assert!(
            matches!(&step, LeaseStep::FailOver { from: Some(f), why } if f == "shop-2" && why.contains("cleanly at 0/4026F00")),
            "{step:?}"
        );
    }

    #[test]
    fn after_a_clean_stop_only_a_replica_with_all_of_its_wal_may_be_promoted() {
        let at = |timeline: u32, lsn: &str| Position {
            timeline,
            lsn: lsn.into(),
        };
        let candidates = vec![
            ("shop-0".to_string(), at(2, "0/4026FA0")),
            // Reconnecting after the timeline change: it has received nothing of timeline 2.
            ("shop-2".to_string(), at(2, "0/4000000")),
        ];
        let clean = Release {
            by: "shop-1".into(),
            stopped: Stopped::Clean(at(2, "0/4026F00")),
        };
        assert_eq!(
            complete(&candidates, Some(&clean)),
            Ok(vec![candidates[0].clone()]),
            "only the replica past the shutdown checkpoint"
        );
        let short = complete(&candidates[1..], Some(&clean)).unwrap_err();
        assert!(
            short.contains("no replica has all of shop-1's WAL")
                && short.contains("0/4026F00")
                && short.contains("shop-2 received up to 0/4000000"),
            "{short}"
        );
        assert!(
            complete(&[], Some(&clean)).is_err(),
            "nobody answered: nobody is known to be complete"
        );
        // Killed, crashed, or an earlier instance manager: its end is unknown, any may be.
        let unclean = Release {
            stopped: Stopped::Unclean,
            ..clean
        };
        assert_eq!(complete(&candidates[1..], Some(&unclean)), Ok(candidates[1..].to_vec()));
        assert_eq!(complete(&candidates[1..], None), Ok(candidates[1..].to_vec()));
    }

    #[test]
    fn a_release_is_read_back_as_written_and_only_while_nobody_holds_the_lease() {
        let names = names();
        let lease = crate::postgres::account::lease(
            &names,
            &crate::postgres::fixtures::owner(),
            "shop-1",
            jiff::Timestamp::UNIX_EPOCH,
        );
        let stopped = Stopped::Clean(Position {
            timeline: 3,
            lsn: "0/5000028".into(),
        });
        let released = given_up(&lease, "shop-1", &stopped);
        assert_eq!(crate::postgres::account::holder(&released), None);
        assert_eq!(
            release(&released),
            Some(Release {
                by: "shop-1".into(),
                stopped
            })
        );
        let handed = crate::postgres::switchover::hand_over_to(&released, "shop-1", jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(release(&handed), None, "handed back: no release any more");
        let notes = handed.metadata.annotations.unwrap_or_default();
        assert!(!notes.contains_key(RELEASED_BY_ANNOTATION) && !notes.contains_key(STOPPED_ANNOTATION));
    }

    #[test]
    fn a_lease_released_for_a_switchover_is_carried_on_not_failed_over() {
        let names = names();
        let record = Record {
            from: "shop-0".into(),
            to: "shop-2".into(),
            at: None,
            stopped: None,
            why: None,
        };
        let released = LeaseView {
            switchover: Some(record.clone()),
            ..view(None, 0)
        };
        assert_eq!(
            primary(&names, 3, Some(&released), Some("shop-0")),
            ("shop-0".into(), LeaseStep::SwitchOver(record.clone())),
            "the old primary stays the primary until the handover"
        );
        // A record left on a lease that has a holder is no switchover under way.
        let held = LeaseView {
            switchover: Some(record),
            ..view(Some("shop-2"), 1)
        };
        assert_eq!(primary(&names, 3, Some(&held), Some("shop-0")).1, LeaseStep::Keep);
    }

    #[test]
    fn the_replica_that_received_the_most_is_promoted_the_lowest_of_equals() {
        let names = names();
        assert_eq!(lsn("0/3000060"), Some(0x300_0060));
        assert_eq!(lsn("1/0"), Some(1 << 32));
        let at = |timeline: u32, lsn: &str| Position {
            timeline,
            lsn: lsn.into(),
        };
        let candidates = vec![
            ("shop-0".to_string(), at(1, "0/9000000")),
            ("shop-1".to_string(), at(1, "0/5000000")),
            ("shop-2".to_string(), at(1, "0/5000100")),
            ("shop-3".to_string(), at(1, "0/5000100")),
        ];
        assert_eq!(choose(&names, &candidates, Some("shop-0")).as_deref(), Some("shop-2"));
        assert_eq!(
            choose(&names, &candidates[..2], Some("shop-0")).as_deref(),
            Some("shop-1")
        );
        assert_eq!(choose(&names, &candidates[..1], Some("shop-0")), None);
    }

    #[test]
    fn a_replica_left_on_an_older_timeline_is_behind_whatever_its_position() {
        // shop-2 received the lost first primary's last records after shop-1 was promoted
        // (timeline 2 parted at 0/40224E0); shop-1 is lost in turn: shop-0, which follows
        // timeline 2, is promoted, not shop-2.
        let candidates = vec![
            (
                "shop-0".to_string(),
                Position {
                    timeline: 2,
                    lsn: "0/4022500".into(),
                },
            ),
            (
                "shop-2".to_string(),
                Position {
                    timeline: 1,
                    lsn: "0/4022518".into(),
                },
            ),
        ];
        assert_eq!(choose(&names(), &candidates, Some("shop-1")).as_deref(), Some("shop-0"));
    }

    #[test]
    fn a_holder_that_missed_three_renewals_is_not_asked_before_its_lease_runs_out() {
        assert_eq!(silent_for(&view(Some("shop-0"), 2), "shop-0"), None);
        assert_eq!(
            silent_for(&view(Some("shop-0"), 4), "shop-0"),
            Some(Duration::from_secs(4))
        );
        assert_eq!(silent_for(&view(Some("shop-1"), 4), "shop-0"), None, "handed over");
        let unstarted = LeaseView {
            taken: false,
            ..view(Some("shop-0"), 30)
        };
        assert_eq!(silent_for(&unstarted, "shop-0"), None, "a new primary still starting");
        assert!(NOT_ASKED_AFTER < LEASE);
    }
}
