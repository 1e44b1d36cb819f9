//! `kubectl noops promote pg/<name> <instance>`: a switchover. Checks what the status says of
//! the instance, asks the operator (the `noops.dev/promote` annotation), and waits until the
//! instance takes writes, or the operator says why it did not.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use noops_api::PostgreSQL;
use noops_api::postgres::{
    FailoverStatus, PROMOTE_ANNOTATION, Role, SWITCHOVER_GIVEN_BACK, SWITCHOVER_LAG_BOUND_BYTES, SWITCHOVER_REFUSED,
};

/// The operator's Events that end a request without a switchover.
const ENDS_WITHOUT: [&str; 2] = [SWITCHOVER_REFUSED, SWITCHOVER_GIVEN_BACK];

/// Why `instance` cannot be switched to, as the status of `pg` says (the operator checks
/// again, against the primary itself).
pub fn refusal(pg: &PostgreSQL, instance: &str) -> Result<(), String> {
    let status = pg.status.clone().unwrap_or_default();
    if status.current_primary.as_deref() == Some(instance) {
        return Err(format!("{instance} is the primary already"));
    }
    let Some(member) = status.members.iter().find(|m| m.name == instance) else {
        let names: Vec<&str> = status.members.iter().map(|m| m.name.as_str()).collect();
        return Err(format!(
            "{instance} is not an instance of this database (its instances: {})",
            names.join(", ")
        ));
    };
    if member.role != Role::Replica || member.streaming != Some(true) {
        return Err(format!("{instance} does not stream from the primary now"));
    }
    match member.lag_bytes {
        Some(lag) if lag > SWITCHOVER_LAG_BOUND_BYTES => Err(format!(
            "{instance} lags {lag} bytes of WAL behind the primary, more than the {SWITCHOVER_LAG_BOUND_BYTES} a switchover allows"
        )),
        _ => Ok(()),
    }
}

/// The switchover to `instance` recorded in `after` and not in `before`, if there is one.
fn switched<'a>(
    before: Option<&FailoverStatus>,
    after: Option<&'a FailoverStatus>,
    instance: &str,
) -> Option<&'a FailoverStatus> {
    let after = after?;
    let new = before.is_none_or(|b| b.handed_over_at != after.handed_over_at);
    (after.switchover && after.to == instance && new).then_some(after)
}

/// How many of each Event that ends a request the database has had, by Event name.
async fn endings(events: &Api<Event>, name: &str) -> anyhow::Result<BTreeMap<String, (i32, String, String)>> {
    let selector = format!("involvedObject.kind=PostgreSQL,involvedObject.name={name}");
    let list = events
        .list(&ListParams::default().fields(&selector))
        .await
        .context("listing Events")?;
    Ok(list
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref().is_some_and(|r| ENDS_WITHOUT.contains(&r)))
        .filter_map(|e| {
            let key = e.metadata.name?;
            Some((
                key,
                (
                    e.count.unwrap_or(1),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default(),
                ),
            ))
        })
        .collect())
}

/// Asks for `instance` to be the primary of PostgreSQL `name` and waits (up to `deadline`).
pub async fn promote(
    client: &Client,
    namespace: &str,
    name: &str,
    instance: &str,
    deadline: Duration,
) -> anyhow::Result<ExitCode> {
    let api: Api<PostgreSQL> = Api::namespaced(client.clone(), namespace);
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let pg = api
        .get(name)
        .await
        .with_context(|| format!("reading PostgreSQL {namespace}/{name}"))?;
    if let Err(why) = refusal(&pg, instance) {
        bail!("switchover to {instance} refused: {why}");
    }
    let before = pg.status.as_ref().and_then(|s| s.last_failover.clone());
    let ended_before = endings(&events, name).await?;
    let patch = Patch::Merge(serde_json::json!({ "metadata": { "annotations": { PROMOTE_ANNOTATION: instance } } }));
    api.patch(name, &PatchParams::default(), &patch)
        .await
        .with_context(|| format!("asking for a switchover of PostgreSQL {namespace}/{name}"))?;
    println!("asked for {instance} to be the primary of {namespace}/{name}");
    let started = Instant::now();
    let mut handed = false;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let pg = api
            .get(name)
            .await
            .with_context(|| format!("reading PostgreSQL {namespace}/{name}"))?;
        let after = pg.status.as_ref().and_then(|s| s.last_failover.as_ref());
        if let Some(done) = switched(before.as_ref(), after, instance) {
            if !handed {
                handed = true;
                let from = done.from.as_deref().unwrap_or("the primary");
                println!("{from} stepped down; {instance} has all of its WAL and is being promoted");
            }
            if done.promoted_at.is_some() {
                match done.write_gap_millis {
                    Some(gap) => println!("{instance} is the primary: writes waited {gap} ms"),
                    None => println!("{instance} is the primary"),
                }
                return Ok(ExitCode::SUCCESS);
            }
        }
        for (key, (count, reason, message)) in endings(&events, name).await? {
            if ended_before.get(&key).is_none_or(|(was, _, _)| count > *was) {
                eprintln!("{reason}: {message}");
                return Ok(ExitCode::FAILURE);
            }
        }
        if started.elapsed() > deadline {
            let waiting = pg
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(PROMOTE_ANNOTATION));
            if waiting {
                eprintln!(
                    "error: the operator has not acted on the request after {}s: is it running?",
                    deadline.as_secs()
                );
            } else {
                eprintln!("error: {instance} is not the primary after {}s", deadline.as_secs());
            }
            return Ok(ExitCode::FAILURE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use noops_api::postgres::{MemberStatus, PostgreSQLStatus};

    #[test]
    fn a_switchover_is_the_one_recorded_after_the_request() {
        let record = |to: &str, at: &str, switchover: bool| FailoverStatus {
            from: Some("shop-0".into()),
            to: to.into(),
            reason: String::new(),
            switchover,
            received_lsn: None,
            primary_last_seen: None,
            handed_over_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at.parse().unwrap()),
            promoted_at: None,
            write_gap_millis: None,
        };
        let old = record("shop-1", "2026-11-27T10:00:00Z", true);
        let new = record("shop-1", "2026-11-27T11:00:00Z", true);
        assert_eq!(switched(Some(&old), Some(&old), "shop-1"), None);
        assert_eq!(switched(Some(&old), Some(&new), "shop-1"), Some(&new));
        assert_eq!(switched(None, Some(&new), "shop-2"), None);
        let failover = record("shop-1", "2026-11-27T11:00:00Z", false);
        assert_eq!(switched(Some(&old), Some(&failover), "shop-1"), None);
    }

    fn database() -> PostgreSQL {
        let mut pg: PostgreSQL = serde_json::from_value(serde_json::json!({
            "apiVersion": "noops.dev/v1alpha1", "kind": "PostgreSQL",
            "metadata": { "name": "shop", "namespace": "default" },
            "spec": { "db": "shop", "user": "shop", "passwordSecret": "shop-password", "instances": 3 }
        }))
        .unwrap();
        let member = |name: &str, role: &str, lag: i64| -> MemberStatus {
            serde_json::from_value(serde_json::json!({
                "name": name, "role": role, "ready": true, "streaming": role == "Replica", "lagBytes": lag
            }))
            .unwrap()
        };
        pg.status = Some(PostgreSQLStatus {
            current_primary: Some("shop-0".into()),
            members: vec![
                member("shop-0", "Primary", 0),
                member("shop-1", "Replica", 0),
                member("shop-2", "Replica", SWITCHOVER_LAG_BOUND_BYTES + 1),
            ],
            ..Default::default()
        });
        pg
    }

    #[test]
    fn only_a_replica_that_streams_within_the_bound_is_asked_for() {
        let pg = database();
        assert_eq!(refusal(&pg, "shop-1"), Ok(()));
        assert!(refusal(&pg, "shop-0").unwrap_err().contains("primary already"));
        assert!(refusal(&pg, "shop-2").unwrap_err().contains("lags"));
        assert!(refusal(&pg, "shop-7").unwrap_err().contains("shop-0, shop-1, shop-2"));
    }
}
