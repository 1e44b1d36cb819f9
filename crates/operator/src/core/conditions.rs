//! Status conditions with the Kubernetes conventions: one entry per type, `observedGeneration`,
//! and a `lastTransitionTime` that moves only when the status flips.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use noops_api::reason::Reason;

/// A condition as a controller decides it, before times are filled in; its reason is one of
/// its kind's (`R`, which the CRD schema lists).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided<R: Reason> {
    pub type_: &'static str,
    pub status: bool,
    pub reason: R,
    pub message: String,
}

impl<R: Reason> Decided<R> {
    pub fn new(type_: &'static str, status: bool, reason: R, message: impl Into<String>) -> Self {
        Self {
            type_,
            status,
            reason,
            message: message.into(),
        }
    }
}

/// The `Paused` condition of a resource whose `spec.paused` is `paused`: one meaning on every
/// kind, the operator changes nothing of it (its status is still reported).
pub fn paused<R: Reason>(paused: bool) -> Decided<R> {
    if paused {
        Decided::new(
            noops_api::condition::PAUSED,
            true,
            R::PAUSED,
            "spec.paused: the operator changes nothing of it until spec.paused is false",
        )
    } else {
        Decided::new(
            noops_api::condition::PAUSED,
            false,
            R::NOT_PAUSED,
            "the operator manages it",
        )
    }
}

/// `decided` and the `Paused` condition of `spec.paused` = `paused`: every kind reports it.
pub fn with_paused<R: Reason>(decided: &[Decided<R>], is_paused: bool) -> Vec<Decided<R>> {
    let mut all = decided.to_vec();
    all.push(paused(is_paused));
    all
}

/// The message of a condition that passes on `inner` under reason `outer`: the inner reason
/// and message, without the reason when it is the outer one (a message never repeats its
/// reason: "MachinesDegraded: MachinesDegraded: ..." told nothing twice).
pub fn passed_on<R: Reason>(outer: R, inner: &Condition) -> String {
    if inner.reason == outer.as_str() {
        inner.message.clone()
    } else {
        format!("{}: {}", inner.reason, inner.message)
    }
}

/// Merges decided conditions into the previous list: a condition whose status did not change
/// keeps its `lastTransitionTime`; types not decided now are kept as they were, if their
/// reason is one of `R`.
pub fn merge<R: Reason>(
    previous: &[Condition],
    decided: &[Decided<R>],
    generation: Option<i64>,
    now: jiff::Timestamp,
) -> Vec<Condition> {
    // A condition kept from before whose reason this version does not list (another
    // version's) is left out: the schema lists this version's, and the API server would refuse
    // the whole status for it.
    let mut out: Vec<Condition> = previous
        .iter()
        .filter(|c| R::ALL.contains(&c.reason.as_str()))
        .cloned()
        .collect();
    for d in decided {
        let status = if d.status { "True" } else { "False" }.to_string();
        let transition = previous
            .iter()
            .find(|c| c.type_ == d.type_ && c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or(Time(now));
        let condition = Condition {
            type_: d.type_.to_string(),
            status,
            reason: d.reason.as_str().to_string(),
            message: d.message.clone(),
            observed_generation: generation,
            last_transition_time: transition,
        };
        match out.iter_mut().find(|c| c.type_ == d.type_) {
            Some(slot) => *slot = condition,
            None => out.push(condition),
        }
    }
    out
}

/// Whether the condition of `type_` is True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;
    use noops_api::maintpage::MaintPageReason;

    #[test]
    fn transition_time_moves_only_on_flips() {
        let t0 = jiff::Timestamp::from_second(1000).unwrap();
        let t1 = jiff::Timestamp::from_second(2000).unwrap();
        let first = merge(
            &[],
            &[Decided::new(
                "Ready",
                false,
                MaintPageReason::SwitchingToApp,
                "pods starting",
            )],
            Some(1),
            t0,
        );
        assert_eq!(first[0].last_transition_time.0, t0);
        let same = merge(
            &first,
            &[Decided::new("Ready", false, MaintPageReason::AppNotReady, "still")],
            Some(2),
            t1,
        );
        assert_eq!(same[0].last_transition_time.0, t0, "status unchanged: time kept");
        assert_eq!(same[0].reason, "AppNotReady");
        assert_eq!(same[0].observed_generation, Some(2));
        let flipped = merge(
            &same,
            &[Decided::new("Ready", true, MaintPageReason::AppPublished, "ok")],
            Some(2),
            t1,
        );
        assert_eq!(flipped[0].last_transition_time.0, t1);
        assert!(is_true(&flipped, "Ready"));
        let other = merge(
            &flipped,
            &[Decided::new("Degraded", false, MaintPageReason::AsExpected, "")],
            Some(2),
            t1,
        );
        assert_eq!(other.len(), 2);
    }

    #[test]
    fn a_kept_condition_whose_reason_this_version_does_not_list_is_left_out() {
        let t0 = jiff::Timestamp::from_second(1000).unwrap();
        let mut previous = merge(
            &[],
            &[Decided::new("Ready", true, MaintPageReason::AppPublished, "ok")],
            Some(1),
            t0,
        );
        let mut older = previous[0].clone();
        older.type_ = "Retired".into();
        older.reason = "SaidByAnOlderVersion".into();
        previous.push(older);
        let merged = merge(
            &previous,
            &[Decided::new("Degraded", false, MaintPageReason::AsExpected, "")],
            Some(1),
            t0,
        );
        let types: Vec<&str> = merged.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Ready", "Degraded"]);
    }
}
