//! The primary's lease: a `coordination.k8s.io` Lease `<name>-primary` whose holder is the
//! instance that may take writes. Only a database with replicas has one (a single instance has
//! nothing to fail over to, and keeps serving without the API server).
//!
//! The holder's instance manager renews it every [`RENEW_EVERY`]; one that has not renewed for
//! [`FENCE_AFTER`] (counted from when it sent its last successful renewal, on its own clock)
//! stops its server at once, so it accepts no commit past that deadline. The operator fails over
//! only once it has seen no renewal for [`LEASE`] (counted from when it saw the last one, on its
//! own clock): since a renewal is seen after it was sent and `FENCE_AFTER < LEASE`, the old
//! primary has stopped before any replica is promoted, whatever the clocks say, and whether the
//! old primary is dead, partitioned or merely slow. No wait for the node controller.
//!
//! The operator changes the holder with the lease's resourceVersion as a precondition, so a
//! late renewal and a failover cannot both succeed. An instance manager that finds another
//! holder stops its server and starts again as a replica. Pure: what to do given what was
//! read; the reads and writes are in `instance/keeper.rs` and the operator's pass.

use std::time::Duration;

/// How long the lease lasts without a renewal, as the operator counts it.
pub const LEASE: Duration = Duration::from_secs(6);
/// How often the holder renews it.
pub const RENEW_EVERY: Duration = Duration::from_secs(1);
/// How long a holder goes without a successful renewal before it stops its server.
pub const FENCE_AFTER: Duration = Duration::from_secs(4);
/// How long one request to the API server may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// What the deadline leaves for a stopped server's processes to be gone before the operator
/// may promote: the instance manager stops its server on a timer of its own at the deadline,
/// not after a read that may hang.
pub const STOP_MARGIN: Duration = Duration::from_secs(2);
/// How long a server asked to stop at once (SIGQUIT) has before it is killed.
pub const KILL_WITHIN: Duration = Duration::from_secs(5);
/// How long a primary's server may go without answering its instance manager (a connection
/// and a query over its socket) before the lease is renewed no more: a server that hangs (a
/// stopped or stuck process) then fences itself and a replica takes over, as if its node had
/// died. (The question writes nothing: a volume that hangs only writes is not seen by it.)
pub const SILENT_AFTER: Duration = Duration::from_secs(3);
/// How long one look at the server may take.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(2);
/// How long a server that became the primary may take to answer at all. A server in crash
/// recovery answers at once ("the database system is starting up" is an answer), so only one
/// that never opened its socket or hangs is silent this long (a volume that hangs from the
/// start, a process stopped right after it started).
pub const FIRST_ANSWER_WITHIN: Duration = Duration::from_secs(15);

/// What an instance does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Running {
    Primary,
    Replica,
}

/// What the instance manager read of the lease this time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// No lease: a single instance, nothing to fence.
    Absent,
    /// Its holder (none: released, the operator chooses).
    HeldBy(Option<String>),
    /// The API server could not be asked.
    Unreadable,
}

/// What the instance manager does after a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing to change.
    Carry,
    /// Renew the lease (this instance holds it).
    Renew,
    /// Renew, then promote the server: the operator chose this replica.
    RenewAndPromote,
    /// Stop the server now: another instance holds the lease. It starts again as what the
    /// lease then says.
    Stop,
    /// Stop the server now: this primary could not renew the lease in time (its fence
    /// deadline; a server already stepping down keeps to its own bound).
    Fence,
    /// The operator released the lease of this primary for a switchover (`switchover.rs`):
    /// shut the server down cleanly, so that the replicas receive all of its WAL, and say
    /// where it ended.
    StepDown,
}

/// What instance `me`, running as `running`, does given what it read and how long since it
/// last renewed (`since_renewed`: none if it never did; only a holder counts it).
pub fn step(me: &str, running: Running, seen: &Seen, since_renewed: Option<Duration>, leased: bool) -> Step {
    let overdue = since_renewed.is_none_or(|d| d >= FENCE_AFTER);
    match (seen, running) {
        (Seen::Absent, _) => Step::Carry,
        (Seen::HeldBy(Some(holder)), Running::Primary) if holder == me => Step::Renew,
        (Seen::HeldBy(Some(holder)), Running::Replica) if holder == me => Step::RenewAndPromote,
        // Someone else's: a primary stops; released (only the operator releases a lease
        // whose holder serves): it steps down; a replica carries on.
        (Seen::HeldBy(Some(_)), Running::Primary) => Step::Stop,
        (Seen::HeldBy(None), Running::Primary) => Step::StepDown,
        (Seen::HeldBy(_), Running::Replica) => Step::Carry,
        // Cannot be read: a primary under a lease keeps serving only until its deadline.
        (Seen::Unreadable, Running::Primary) if leased && overdue => Step::Fence,
        (Seen::Unreadable, _) => Step::Carry,
    }
}

/// Whether the server counts as silent, given how long since it last answered and how long
/// since it became the primary: [`SILENT_AFTER`] without an answer once it has answered, and
/// [`FIRST_ANSWER_WITHIN`] while it never has (it may still be opening its socket).
pub fn silent(since_last_answer: Option<Duration>, since_primary: Option<Duration>) -> bool {
    match since_last_answer {
        Some(since) => since >= SILENT_AFTER,
        None => since_primary.is_some_and(|since| since >= FIRST_ANSWER_WITHIN),
    }
}

/// What an instance manager has heard from its server while it is the primary.
#[derive(Debug, Clone, Copy, Default)]
pub struct Answers {
    /// Since when it is the primary (its first answer is awaited from then).
    pub primary_since: Option<std::time::Instant>,
    /// When it last answered.
    pub last: Option<std::time::Instant>,
}

impl Answers {
    /// Whether the server counts as silent now ([`silent`]).
    pub fn silent(&self) -> bool {
        silent(
            self.last.map(|at| at.elapsed()),
            self.primary_since.map(|at| at.elapsed()),
        )
    }
}

/// `step`, for a server that may be silent: a primary whose server does not answer renews no
/// more, so its own deadline stops it and the operator fails over once the lease runs out.
/// Everything else is as the lease says.
pub fn unless_silent(step: Step, silent: bool) -> Step {
    match step {
        Step::Renew if silent => Step::Carry,
        other => other,
    }
}

/// What an instance starts as, given the lease (when it can be read) and the plan's word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    Primary,
    Replica,
    /// Not yet: the lease must say (it cannot be read, or nobody holds it).
    Wait,
}

/// What instance `me` starts as: under a lease (`leased`: the plan says the database has one)
/// only what the lease says; a single instance as the plan says (`plan_primary`).
pub fn start(me: &str, leased: bool, seen: &Seen, plan_primary: bool) -> Start {
    match seen {
        Seen::HeldBy(Some(holder)) if holder == me => Start::Primary,
        Seen::HeldBy(Some(_)) => Start::Replica,
        Seen::HeldBy(None) => Start::Wait,
        Seen::Absent | Seen::Unreadable if !leased => {
            if plan_primary {
                Start::Primary
            } else {
                Start::Replica
            }
        }
        Seen::Absent => {
            // The plan says there is a lease and there is none (yet, or any more): the
            // operator makes it first; until then only a replica may start.
            if plan_primary { Start::Wait } else { Start::Replica }
        }
        Seen::Unreadable => Start::Wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "shop-0";

    fn held(by: &str) -> Seen {
        Seen::HeldBy(Some(by.into()))
    }

    #[test]
    fn the_holder_renews_and_a_replica_chosen_by_the_operator_promotes() {
        let fresh = Some(Duration::from_secs(1));
        assert_eq!(step(ME, Running::Primary, &held(ME), fresh, true), Step::Renew);
        assert_eq!(step(ME, Running::Replica, &held(ME), None, true), Step::RenewAndPromote);
        assert_eq!(step(ME, Running::Replica, &held("shop-1"), None, true), Step::Carry);
    }

    #[test]
    fn a_primary_stops_when_another_holds_the_lease_or_it_cannot_renew_in_time() {
        assert_eq!(
            step(ME, Running::Primary, &held("shop-1"), Some(Duration::ZERO), true),
            Step::Stop
        );
        assert_eq!(
            step(ME, Running::Primary, &Seen::HeldBy(None), None, true),
            Step::StepDown,
            "released for a switchover"
        );
        let unreadable = Seen::Unreadable;
        assert_eq!(
            step(
                ME,
                Running::Primary,
                &unreadable,
                Some(Duration::from_millis(3_900)),
                true
            ),
            Step::Carry,
            "within its deadline"
        );
        assert_eq!(
            step(ME, Running::Primary, &unreadable, Some(FENCE_AFTER), true),
            Step::Fence
        );
        // A single instance has no lease: the API server's absence stops nothing.
        assert_eq!(step(ME, Running::Primary, &unreadable, None, false), Step::Carry);
        assert_eq!(step(ME, Running::Primary, &Seen::Absent, None, true), Step::Carry);
    }

    #[test]
    fn a_primary_whose_server_stopped_answering_renews_no_more() {
        let fresh = Some(Duration::from_secs(1));
        let renew = step(ME, Running::Primary, &held(ME), fresh, true);
        assert!(
            !silent(None, Some(Duration::from_secs(5))),
            "a server that has not answered yet may still be opening its socket"
        );
        assert!(!silent(None, None), "not the primary: nobody asks it");
        assert!(
            silent(None, Some(FIRST_ANSWER_WITHIN)),
            "a server stopped before it ever answered is silent all the same"
        );
        assert!(!silent(
            Some(Duration::from_millis(2_900)),
            Some(Duration::from_secs(60))
        ));
        assert!(silent(Some(SILENT_AFTER), Some(Duration::from_secs(60))));
        assert!(SILENT_AFTER < FIRST_ANSWER_WITHIN && FIRST_ANSWER_WITHIN < 2 * LEASE + LEASE);
        assert_eq!(unless_silent(renew, false), Step::Renew);
        assert_eq!(unless_silent(renew, true), Step::Carry);
        // Only renewals wait for the server: a chosen replica still promotes, a primary that
        // lost the lease still stops.
        for other in [Step::RenewAndPromote, Step::Stop, Step::Fence, Step::StepDown] {
            assert_eq!(unless_silent(other, true), other);
        }
        assert!(ANSWER_WITHIN < SILENT_AFTER, "one look that times out is not silence");
    }

    #[test]
    fn the_deadline_falls_before_the_operator_may_promote() {
        assert!(
            FENCE_AFTER + STOP_MARGIN <= LEASE,
            "the server is stopped before a promotion"
        );
        assert!(
            RENEW_EVERY + REQUEST_TIMEOUT < FENCE_AFTER,
            "one slow renewal does not fence"
        );
    }

    #[test]
    fn an_instance_starts_as_the_lease_says_and_waits_when_it_cannot_know() {
        assert_eq!(start(ME, true, &held(ME), false), Start::Primary);
        assert_eq!(start(ME, true, &held("shop-1"), true), Start::Replica);
        assert_eq!(start(ME, true, &Seen::HeldBy(None), true), Start::Wait);
        assert_eq!(
            start(ME, true, &Seen::Unreadable, true),
            Start::Wait,
            "a partitioned old primary"
        );
        assert_eq!(start(ME, true, &Seen::Absent, true), Start::Wait);
        assert_eq!(start(ME, true, &Seen::Absent, false), Start::Replica);
        // A single instance starts without the API server, as before replicas.
        assert_eq!(start(ME, false, &Seen::Unreadable, true), Start::Primary);
    }
}
