//! The status of a PostgreSQL, from what one pass saw and did. Pure.

use noops_api::PostgreSQL;
use noops_api::condition::{DEGRADED, READY};
use noops_api::postgres::PostgreSQLStatus;

use super::names::{Names, PORT};
use super::secrets::PasswordProblem;
use super::sql::InstanceFacts;
use crate::core::conditions::{Decided, merge};
use crate::core::stuck::Stuck;

/// Where the instance stands, as one pass saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstanceState {
    /// No pod yet, or it is starting (initialising, or recovering its WAL).
    Starting(String),
    /// The pod cannot start without a change (image, crash loop, scheduling).
    Stuck(Stuck),
    /// The server answers the operator.
    Serving(InstanceFacts),
    /// The pod is Ready but the operator could not talk to the server.
    Unreachable(String),
}

/// What one pass saw and did.
#[derive(Debug, Clone)]
pub struct Seen {
    pub instance: InstanceState,
    pub instance_pod: Option<String>,
    pub node: Option<String>,
    /// Why the user's password cannot be read, if it cannot.
    pub password_problem: Option<PasswordProblem>,
    /// The password Secret version the database has now.
    pub password_version: Option<String>,
    /// The database and its owner are there (this pass saw or made them).
    pub database_ready: bool,
    pub node_port: Option<i32>,
}

pub fn build(pg: &PostgreSQL, names: &Names, seen: &Seen, now: jiff::Timestamp) -> PostgreSQLStatus {
    let previous = pg.status.clone().unwrap_or_default();
    let serving = match &seen.instance {
        InstanceState::Serving(facts) => Some(facts),
        _ => None,
    };
    let ready = serving.is_some() && seen.database_ready;
    let ready_condition = if ready {
        let message = format!("serving database {} at {}:{PORT}", pg.spec.db, names.host());
        Decided::new(READY, true, "Serving", message)
    } else {
        match (&seen.instance, &seen.password_problem) {
            (InstanceState::Stuck(stuck), _) => Decided::new(READY, false, "InstancePodStuck", stuck.message.clone()),
            (InstanceState::Serving(_), Some(problem)) => problem.condition(READY, false),
            (InstanceState::Serving(_), None) => {
                Decided::new(READY, false, "CreatingDatabase", "making the database and its owner")
            }
            (InstanceState::Starting(why), _) => Decided::new(READY, false, "Starting", why.clone()),
            (InstanceState::Unreachable(why), _) => Decided::new(READY, false, "Unreachable", why.clone()),
        }
    };
    let degraded = match (&seen.instance, &seen.password_problem) {
        (InstanceState::Stuck(stuck), _) => Decided::new(DEGRADED, true, "InstancePodStuck", stuck.message.clone()),
        (_, Some(problem)) => problem.condition(DEGRADED, true),
        (InstanceState::Unreachable(why), _) => Decided::new(DEGRADED, true, "Unreachable", why.clone()),
        _ => Decided::new(DEGRADED, false, "AsExpected", "nothing needs attention"),
    };
    let was_serving = previous.system_identifier.is_some();
    let phase = if ready && seen.password_problem.is_none() {
        "Running"
    } else if ready || was_serving {
        "Degraded"
    } else if matches!(seen.instance, InstanceState::Stuck(_)) {
        "Failed"
    } else {
        "Creating"
    };
    PostgreSQLStatus {
        observed_generation: pg.metadata.generation,
        conditions: merge(&previous.conditions, &[ready_condition, degraded], pg.metadata.generation, now),
        phase: Some(phase.into()),
        endpoint: Some(format!("{}:{PORT}", names.host())),
        node_port: seen.node_port,
        connection_secret: seen.password_version.as_ref().map(|_| names.connection_secret()),
        instance: seen.instance_pod.clone(),
        node: seen.node.clone(),
        server_version: serving.map(|f| f.server_version.clone()).or(previous.server_version),
        system_identifier: serving.map(|f| f.system_identifier.clone()).or(previous.system_identifier),
        password_secret_version: seen.password_version.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::fixtures::postgres;

    fn facts() -> InstanceFacts {
        InstanceFacts {
            server_version: "15.14".into(),
            system_identifier: "7300000000000000001".into(),
        }
    }

    fn seen(instance: InstanceState) -> Seen {
        Seen {
            instance,
            instance_pod: Some("shop-0".into()),
            node: Some("node-1".into()),
            password_problem: None,
            password_version: Some("u/1".into()),
            database_ready: true,
            node_port: None,
        }
    }

    fn condition<'a>(status: &'a PostgreSQLStatus, type_: &str) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        status.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn serving_with_the_database_made_is_ready() {
        let pg = postgres("shop");
        let status = build(&pg, &Names::of(&pg), &seen(InstanceState::Serving(facts())), jiff::Timestamp::now());
        assert_eq!(condition(&status, READY).status, "True");
        assert_eq!(condition(&status, DEGRADED).status, "False");
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.endpoint.as_deref(), Some("shop.prod.svc:5432"));
        assert_eq!(status.server_version.as_deref(), Some("15.14"));
        assert_eq!(status.connection_secret.as_deref(), Some("shop-connection"));
        assert_eq!(condition(&status, READY).observed_generation, Some(1));
    }

    #[test]
    fn a_stuck_pod_and_a_missing_password_say_why() {
        let pg = postgres("shop");
        let stuck = Stuck {
            reason: "ImagePullBackOff",
            message: "pod shop-0, container postgres: no such image".into(),
        };
        let status = build(&pg, &Names::of(&pg), &seen(InstanceState::Stuck(stuck)), jiff::Timestamp::now());
        assert_eq!(condition(&status, READY).reason, "InstancePodStuck");
        assert!(condition(&status, READY).message.contains("no such image"));
        assert_eq!(status.phase.as_deref(), Some("Failed"));

        let mut no_password = seen(InstanceState::Serving(facts()));
        no_password.database_ready = false;
        no_password.password_version = None;
        no_password.password_problem = Some(PasswordProblem {
            reason: "PasswordSecretMissing",
            message: "Secret shop-db does not exist".into(),
        });
        let status = build(&pg, &Names::of(&pg), &no_password, jiff::Timestamp::now());
        assert_eq!(condition(&status, READY).reason, "PasswordSecretMissing");
        assert_eq!(condition(&status, DEGRADED).status, "True");
        assert_eq!(status.phase.as_deref(), Some("Creating"));
        assert_eq!(status.connection_secret, None);
    }

    #[test]
    fn a_lost_password_secret_degrades_a_serving_database_without_stopping_it() {
        let pg = postgres("shop");
        let mut later = seen(InstanceState::Serving(facts()));
        later.password_problem = Some(PasswordProblem {
            reason: "PasswordSecretMissing",
            message: "gone".into(),
        });
        let status = build(&pg, &Names::of(&pg), &later, jiff::Timestamp::now());
        assert_eq!(condition(&status, READY).status, "True");
        assert_eq!(condition(&status, DEGRADED).reason, "PasswordSecretMissing");
        assert_eq!(status.phase.as_deref(), Some("Degraded"));
    }
}
