//! Synchronous replication, as one pass decides it. Pure.
//!
//! - `Required`: the primary's `synchronous_standby_names` is `ANY n (...)` over every other
//!   instance the spec asks for, whether it streams now or not: a commit is acknowledged once
//!   `n` of them have flushed it, and waits while fewer stream. The list changes only with the
//!   spec and the primary, never with who streams: the failover rule below counts on it.
//! - `Preferred`: `ANY min(n, k) (...)` over the `k` replicas that stream now (a reply within
//!   [`FRESH_REPLY`]); empty, asynchronous, when none does. Commits never wait for a replica
//!   that is gone, at the price of a failover that may lose the last of them.
//! - Neither names an instance the spec no longer has (one scaled away): nothing waits for it.
//! - A failover under `Required` promotes only a replica that holds every acknowledged commit:
//!   each is on `n` of the `m` other instances, so the most advanced of any `m - n + 1` of them
//!   has it. With fewer answering, the operator waits (`failover.rs` says who is promoted).
//! - The chosen replica is given the list before it is handed the lease: it takes its first
//!   commit as synchronously as the primary it replaces.

use std::time::Duration;

use noops_api::postgres::PostgreSQLReason;
use noops_api::postgres::{DataDurability, SynchronousSpec};

use super::names::Names;
use super::sql::Standby;
use crate::core::conditions::Decided;

/// The condition (enough replicas stream synchronously) and its reason when too few do.
pub use noops_api::postgres::{SYNCHRONOUS_REPLICAS, TOO_FEW_REPLICAS};
/// A standby whose last reply is older than this is not counted as streaming (replicas reply
/// every second: `replica.rs`).
pub const FRESH_REPLY: Duration = Duration::from_secs(5);

/// What the primary says of its synchronous replication.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// Its `synchronous_standby_names`, after this pass.
    pub setting: String,
    /// The replicas that stream and count towards an acknowledgement now.
    pub synchronous: Vec<String>,
}

/// The replicas of the spec that stream from the primary now, by name.
pub fn streaming(standbys: &[Standby], names: &Names, instances: i32) -> Vec<String> {
    let fresh = FRESH_REPLY.as_millis() as i64;
    standbys
        .iter()
        .filter(|s| s.state == "streaming" && s.reply_age_millis.is_some_and(|age| age <= fresh))
        .filter(|s| names.ordinal(&s.name).is_some_and(|i| i < instances))
        .map(|s| s.name.clone())
        .collect()
}

/// Those of `streaming` that `setting` (a `synchronous_standby_names`) names: the replicas
/// that count towards an acknowledgement now.
pub fn named(setting: &str, streaming: &[String]) -> Vec<String> {
    streaming
        .iter()
        .filter(|pod| setting.contains(&format!("\"{pod}\"")))
        .cloned()
        .collect()
}

/// The `synchronous_standby_names` of primary `primary`; `streaming`: the replicas that stream
/// from it now.
pub fn standby_names(
    sync: Option<&SynchronousSpec>,
    names: &Names,
    instances: i32,
    primary: &str,
    streaming: &[String],
) -> String {
    let Some(sync) = sync else { return String::new() };
    let others = |pod: &String| pod != primary;
    let listed: Vec<String> = match sync.data_durability {
        DataDurability::Required => (0..instances).map(|i| names.instance_at(i)).filter(others).collect(),
        DataDurability::Preferred => streaming.iter().filter(|p| others(p)).cloned().collect(),
    };
    let number = match sync.data_durability {
        DataDurability::Required => sync.number,
        DataDurability::Preferred => sync.number.min(listed.len() as i32),
    };
    if number < 1 || listed.is_empty() {
        return String::new();
    }
    let quoted: Vec<String> = listed.iter().map(|p| format!("\"{p}\"")).collect();
    format!("ANY {number} ({})", quoted.join(", "))
}

/// Whether enough replicas answered for a failover to promote one that holds every
/// acknowledged commit: `Err` says why not. `answered`: the replicas whose position is known.
pub fn enough_answered(
    sync: Option<&SynchronousSpec>,
    names: &Names,
    instances: i32,
    lost: Option<&str>,
    answered: &[String],
) -> Result<(), String> {
    let Some(sync) = sync.filter(|s| s.data_durability == DataDurability::Required) else {
        return Ok(());
    };
    let others: Vec<String> = (0..instances)
        .map(|i| names.instance_at(i))
        .filter(|p| Some(p.as_str()) != lost)
        .collect();
    let have: Vec<&String> = answered.iter().filter(|a| others.contains(a)).collect();
    let need = (others.len() as i32 - sync.number + 1).max(1);
    if have.len() as i32 >= need {
        return Ok(());
    }
    Err(format!(
        "with synchronous replication only a replica holding every acknowledged commit is promoted: each is on {} of the {} other instances, so {need} must answer, and {} do{}",
        sync.number,
        others.len(),
        have.len(),
        if have.is_empty() {
            String::new()
        } else {
            format!(" ({})", have.iter().map(|h| h.as_str()).collect::<Vec<_>>().join(", "))
        }
    ))
}

/// `SynchronousReplicas`: whether as many replicas as asked acknowledge commits. None: the
/// primary was not seen this pass (what was said stays). Too few is `WaitingForReplicas`
/// until there have been enough once (a new database's replicas being made are no loss),
/// `TooFewReplicas` after; `previous`: the reason the condition had.
pub fn condition(
    sync: Option<&SynchronousSpec>,
    seen: Option<&Seen>,
    previous: Option<&str>,
) -> Option<Decided<PostgreSQLReason>> {
    let Some(sync) = sync else {
        return Some(Decided::new(
            SYNCHRONOUS_REPLICAS,
            false,
            PostgreSQLReason::Asynchronous,
            "spec.synchronous is not set: a commit is acknowledged once the primary has it, and a failover may lose the last ones",
        ));
    };
    let seen = seen?;
    let have = seen.synchronous.len() as i32;
    let which = if seen.synchronous.is_empty() {
        "none".to_string()
    } else {
        seen.synchronous.join(", ")
    };
    if have >= sync.number {
        return Some(Decided::new(
            SYNCHRONOUS_REPLICAS,
            true,
            PostgreSQLReason::Synchronous,
            format!(
                "a commit is acknowledged once {} replicas have it ({}); streaming: {which}",
                sync.number, seen.setting
            ),
        ));
    }
    let then = match sync.data_durability {
        DataDurability::Required => format!("commits wait until {} do (dataDurability: Required)", sync.number),
        DataDurability::Preferred => format!(
            "commits are acknowledged with {} rather than wait (dataDurability: Preferred), and a failover now may lose the last of them",
            if have == 0 {
                "none (asynchronously)".to_string()
            } else {
                have.to_string()
            }
        ),
    };
    let reason = match previous {
        Some("Synchronous" | TOO_FEW_REPLICAS) => PostgreSQLReason::TooFewReplicas,
        _ => PostgreSQLReason::WaitingForReplicas,
    };
    Some(Decided::new(
        SYNCHRONOUS_REPLICAS,
        false,
        reason,
        format!(
            "{have} of the {} synchronous replicas asked for stream ({which}): {then}",
            sync.number
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::fixtures::names;

    fn sync(number: i32, data_durability: DataDurability) -> SynchronousSpec {
        SynchronousSpec {
            number,
            data_durability,
        }
    }

    fn standby(name: &str, state: &str, reply_age_millis: i64) -> Standby {
        Standby {
            name: name.into(),
            state: state.into(),
            reply_age_millis: Some(reply_age_millis),
            ..Default::default()
        }
    }

    #[test]
    fn required_lists_every_other_instance_of_the_spec_whoever_streams() {
        let names = names();
        let required = sync(1, DataDurability::Required);
        assert_eq!(
            standby_names(Some(&required), &names, 3, "shop-0", &[]),
            r#"ANY 1 ("shop-1", "shop-2")"#
        );
        assert_eq!(
            standby_names(Some(&required), &names, 3, "shop-1", &["shop-2".into()]),
            r#"ANY 1 ("shop-0", "shop-2")"#
        );
        assert_eq!(
            standby_names(Some(&sync(2, DataDurability::Required)), &names, 3, "shop-2", &[]),
            r#"ANY 2 ("shop-0", "shop-1")"#
        );
        assert_eq!(standby_names(None, &names, 3, "shop-0", &[]), "");
    }

    #[test]
    fn preferred_lists_who_streams_and_asks_no_more_than_there_are() {
        let names = names();
        let preferred = sync(2, DataDurability::Preferred);
        let both = ["shop-1".to_string(), "shop-2".to_string()];
        assert_eq!(
            standby_names(Some(&preferred), &names, 3, "shop-0", &both),
            r#"ANY 2 ("shop-1", "shop-2")"#
        );
        assert_eq!(
            standby_names(Some(&preferred), &names, 3, "shop-0", &both[1..]),
            r#"ANY 1 ("shop-2")"#
        );
        assert_eq!(standby_names(Some(&preferred), &names, 3, "shop-0", &[]), "");
    }

    #[test]
    fn a_standby_counts_while_it_streams_and_replies_and_the_spec_has_it() {
        let names = names();
        let standbys = [
            standby("shop-1", "streaming", 800),
            standby("shop-2", "catchup", 100),
            standby("shop-3", "streaming", 100),
            standby("shop-4", "streaming", 9_000),
        ];
        assert_eq!(streaming(&standbys, &names, 5), vec!["shop-1", "shop-3"]);
        // shop-3 scaled away: never named again.
        assert_eq!(streaming(&standbys, &names, 3), vec!["shop-1"]);
        let now = streaming(&standbys, &names, 5);
        assert_eq!(named(r#"ANY 1 ("shop-1", "shop-2")"#, &now), vec!["shop-1"]);
        assert!(named("", &now).is_empty(), "asynchronous: none counts");
    }

    #[test]
    fn a_required_failover_waits_until_enough_replicas_answer_to_find_every_commit() {
        let names = names();
        let one = sync(1, DataDurability::Required);
        // 3 instances, ANY 1 of 2: a commit may be on either; both must answer.
        assert!(enough_answered(Some(&one), &names, 3, Some("shop-0"), &["shop-1".into()]).is_err());
        assert!(
            enough_answered(
                Some(&one),
                &names,
                3,
                Some("shop-0"),
                &["shop-1".into(), "shop-2".into()]
            )
            .is_ok()
        );
        // ANY 2 of 2: each commit is on both; one answering is enough.
        let two = sync(2, DataDurability::Required);
        assert!(enough_answered(Some(&two), &names, 3, Some("shop-0"), &["shop-2".into()]).is_ok());
        // 5 instances, ANY 2 of 4: three must answer.
        let answered = ["shop-1".to_string(), "shop-3".to_string()];
        let refused = enough_answered(Some(&two), &names, 5, Some("shop-0"), &answered).unwrap_err();
        assert!(
            refused.contains("3 must answer, and 2 do (shop-1, shop-3)"),
            "{refused}"
        );
        // Asynchronous or preferred: whoever answers.
        assert!(enough_answered(None, &names, 3, Some("shop-0"), &[]).is_ok());
        let preferred = sync(1, DataDurability::Preferred);
        assert!(enough_answered(Some(&preferred), &names, 3, Some("shop-0"), &[]).is_ok());
    }

    #[test]
    fn the_condition_says_how_many_replicas_acknowledge_and_what_commits_do_meanwhile() {
        let seen = |synchronous: &[&str]| Seen {
            setting: r#"ANY 1 ("shop-1", "shop-2")"#.into(),
            synchronous: synchronous.iter().map(|s| s.to_string()).collect(),
        };
        let required = sync(1, DataDurability::Required);
        let ok = condition(Some(&required), Some(&seen(&["shop-2"])), None).unwrap();
        assert!(ok.status && ok.reason == PostgreSQLReason::Synchronous, "{ok:?}");
        let short = condition(Some(&required), Some(&seen(&[])), Some("Synchronous")).unwrap();
        assert!(!short.status && short.reason == PostgreSQLReason::TooFewReplicas);
        assert!(short.message.contains("commits wait"), "{}", short.message);
        let preferred = sync(1, DataDurability::Preferred);
        let short = condition(Some(&preferred), Some(&seen(&[])), Some("TooFewReplicas")).unwrap();
        assert_eq!(short.reason, PostgreSQLReason::TooFewReplicas);
        assert!(short.message.contains("asynchronously"), "{}", short.message);
        // Replicas of a new database being made: waited for, not lost.
        let new = condition(Some(&required), Some(&seen(&[])), None).unwrap();
        assert_eq!(new.reason, PostgreSQLReason::WaitingForReplicas);
        assert_eq!(condition(Some(&required), None, None), None, "not seen: kept");
        assert_eq!(
            condition(None, None, None).unwrap().reason,
            PostgreSQLReason::Asynchronous
        );
    }
}
