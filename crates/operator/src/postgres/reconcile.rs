//! One PostgreSQL reconcile, one pass: observe (children from the caches, the user's password
//! Secret) → validate (the password) → apply the children (superuser Secret once, StatefulSet,
//! Service) → the database (as the superuser: its owner, the password, the database) → the
//! connection Secret → status, and an Event for each decision.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::runtime::controller::Action;
use kube::{Api, Resource};
use noops_api::PostgreSQL;
use noops_api::postgres::PostgreSQLStatus;
use serde_json::json;
use tracing::{info, warn};

use super::names::Names;
use super::secrets::{self, Password};
use super::sql::{Instance, InstanceFacts};
use super::status::{self, InstanceState, Seen};
use super::{Context, observe, services, statefulset};
use crate::core::apply::{apply, apply_status, controller_reference, create_if_missing, delete_if_present};
use crate::core::stamp::{stamp, up_to_date};
use crate::core::stuck::stuck;
use crate::core::{DuringStep, Error, Result, Step};

/// How often a serving database is looked at without a change. Everything that moves it
/// comes through a watch (its spec, its pod, its StatefulSet, its password Secret); this only
/// catches hand changes inside PostgreSQL (a dropped role), at the cost of one Secret read.
const LOOK_AGAIN: Duration = Duration::from_secs(300);
/// How soon a database that is not serving yet is looked at again, if nothing wakes it first.
const NOT_YET: Duration = Duration::from_secs(5);

/// Reconciles one PostgreSQL (the caller's span names it).
pub async fn reconcile(pg: Arc<PostgreSQL>, ctx: &Context) -> Result<Action> {
    let names = Names::of(&pg);
    let now = jiff::Timestamp::now();
    let owner = controller_reference(pg.as_ref())
        .ok_or_else(|| Error::InvalidSpec("the PostgreSQL has no uid yet".into()))
        .during(Step::Validate)?;
    let previous = pg.status.clone().unwrap_or_default();
    let secrets_api: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);

    // Observe. The user's Secret carries none of the operator's labels, so it is not in the
    // caches: read it (a watch on Secret metadata wakes the database when it changes).
    let children = observe::children(&ctx.caches, &names);
    let user_secret = secrets_api.get_opt(&pg.spec.password_secret).await.during(Step::Observe)?;

    // Validate: the schema checked the spec; only the password's Secret is left.
    let password = secrets::password(user_secret.as_ref(), &pg.spec.password_secret);

    // Apply.
    let superuser_password = ensure_superuser_secret(&names, &owner, &children, &secrets_api)
        .await
        .during(Step::Apply)?;
    let mut sts = statefulset::build(&pg, &names, &owner, &ctx.image);
    stamp(&mut sts);
    if !up_to_date(&sts, children.statefulset.as_deref()) {
        let api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &names.namespace);
        apply(&api, &names.statefulset(), &sts).await.during(Step::Apply)?;
        info!("applied the StatefulSet");
    }
    let mut service = services::build(&pg, &names, &owner);
    stamp(&mut service);
    let live_service = if up_to_date(&service, children.service.as_deref()) {
        children.service.as_deref().cloned()
    } else {
        let api: Api<Service> = Api::namespaced(ctx.client.clone(), &names.namespace);
        Some(apply(&api, &names.service(), &service).await.during(Step::Apply)?)
    };

    // A pod that cannot start never makes way for a corrected one by itself (the StatefulSet
    // waits for it to be Ready first): it is deleted, and the StatefulSet makes the new one.
    if let Some(pod) = outdated_stuck_pod(&children) {
        let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(ctx.client.clone(), &names.namespace);
        delete_if_present(&api, &pod, &Default::default()).await.during(Step::Apply)?;
        info!(pod, "deleted the instance's pod, which cannot start, for one of the new spec");
    }

    // The instance and the database in it.
    let (instance, made) = instance_and_database(&pg, &names, &previous, &children, &superuser_password, &password).await;
    if let InstanceState::Unreachable(why) = &instance {
        warn!(error = %why, "cannot talk to the instance");
    }
    finish(&pg, &names, &previous, ctx, now, &owner, &children, instance, made, &password, live_service.as_ref()).await
}

/// The instance's pod, if it cannot start and the StatefulSet has a newer revision for it.
fn outdated_stuck_pod(children: &observe::Children) -> Option<String> {
    let pod = children.instance.as_deref()?;
    stuck([pod])?;
    let update = children.statefulset.as_deref()?.status.as_ref()?.update_revision.clone()?;
    let revision = pod.metadata.labels.as_ref()?.get("controller-revision-hash")?;
    (*revision != update).then(|| pod.metadata.name.clone()).flatten()
}

/// Where the instance stands and, if it serves, what this pass made in it.
async fn instance_and_database(
    pg: &PostgreSQL,
    names: &Names,
    previous: &PostgreSQLStatus,
    children: &observe::Children,
    superuser_password: &str,
    password: &Result<Password, secrets::PasswordProblem>,
) -> (InstanceState, Made) {
    let pod = children.instance.as_deref();
    if let Some(stuck) = pod.and_then(|p| stuck([p])) {
        return (InstanceState::Stuck(stuck), Made::default());
    }
    let Some(ip) = pod.and_then(observe::ready_address) else {
        let why = match pod {
            None => format!("waiting for pod {} (StatefulSet {})", names.instance(), names.statefulset()),
            Some(_) => format!("pod {} is starting: initialising or recovering its database", names.instance()),
        };
        return (InstanceState::Starting(why), Made::default());
    };
    let served = async {
        let instance = Instance::connect(&ip, superuser_password).await?;
        let facts = instance.facts().await?;
        let made = make_database(pg, previous, &instance, &facts, password).await?;
        Ok::<_, super::sql::SqlError>((facts, made))
    };
    match served.await {
        Ok((facts, made)) => (InstanceState::Serving(facts), made),
        Err(e) => (InstanceState::Unreachable(e.to_string()), Made::default()),
    }
}

/// What a pass did in the database.
#[derive(Debug, Default)]
struct Made {
    /// The database and its owner are there.
    database_ready: bool,
    user_created: bool,
    database_created: bool,
    password_set: bool,
    /// The password Secret version the database has now.
    password_version: Option<String>,
}

/// Makes the owner, sets the password when the Secret has a new one (or the data directory is
/// a new one), and makes the database.
async fn make_database(
    pg: &PostgreSQL,
    previous: &PostgreSQLStatus,
    instance: &Instance,
    facts: &InstanceFacts,
    password: &Result<Password, secrets::PasswordProblem>,
) -> Result<Made, super::sql::SqlError> {
    let (db, user) = (&pg.spec.db, &pg.spec.user);
    let Ok(password) = password else {
        // The password cannot be read: nothing is changed; the database may still be there.
        let database_ready = instance.has_database_and_user(db, user).await?;
        let same_database = previous.system_identifier.as_deref() == Some(facts.system_identifier.as_str());
        return Ok(Made {
            database_ready,
            password_version: previous.password_secret_version.clone().filter(|_| same_database),
            ..Default::default()
        });
    };
    let user_created = instance.ensure_user(user, &password.value).await?;
    let password_set = !user_created && secrets::needs_setting(previous, password, &facts.system_identifier);
    if password_set {
        instance.set_password(user, &password.value).await?;
    }
    let database_created = instance.ensure_database(db, user).await?;
    Ok(Made {
        database_ready: true,
        user_created,
        database_created,
        password_set,
        password_version: Some(password.version.clone()),
    })
}

/// Makes the superuser's Secret once; returns the superuser's password.
async fn ensure_superuser_secret(
    names: &Names,
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    children: &observe::Children,
    api: &Api<Secret>,
) -> Result<String> {
    if let Some(password) = children.superuser_secret.as_deref().and_then(secrets::superuser_password) {
        return Ok(password);
    }
    let password = secrets::new_password().map_err(|e| Error::Blocked(format!("cannot draw a password: {e}")))?;
    let secret = secrets::superuser_secret(names, owner, password.clone());
    if create_if_missing(api, &secret).await? {
        info!(secret = names.superuser_secret(), "made the superuser's Secret");
        return Ok(password);
    }
    // Made by an earlier pass the cache has not seen yet: use the one that is there.
    let made = api.get(&names.superuser_secret()).await?;
    secrets::superuser_password(&made)
        .ok_or_else(|| Error::Blocked(format!("Secret {} has no password", names.superuser_secret())))
}

/// The connection Secret, the status and the Events, once the instance is known.
#[allow(clippy::too_many_arguments)]
async fn finish(
    pg: &PostgreSQL,
    names: &Names,
    previous: &PostgreSQLStatus,
    ctx: &Context,
    now: jiff::Timestamp,
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    children: &observe::Children,
    instance: InstanceState,
    made: Made,
    password: &Result<Password, secrets::PasswordProblem>,
    service: Option<&Service>,
) -> Result<Action> {
    if let Ok(password) = password {
        let mut secret = secrets::connection_secret(names, owner, &pg.spec.db, &pg.spec.user, password);
        stamp(&mut secret);
        if !up_to_date(&secret, children.connection_secret.as_deref()) {
            let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
            apply(&api, &names.connection_secret(), &secret).await.during(Step::Apply)?;
        }
    }
    let pod = children.instance.as_deref();
    let seen = Seen {
        instance,
        instance_pod: pod.and_then(|p| p.metadata.name.clone()),
        node: pod.and_then(observe::node),
        password_problem: password.as_ref().err().cloned(),
        password_version: made.password_version.clone(),
        database_ready: made.database_ready,
        node_port: service
            .and_then(|s| s.spec.as_ref()?.ports.as_ref()?.first()?.node_port)
            .filter(|_| pg.spec.service.type_ == noops_api::postgres::ServiceType::NodePort),
    };
    let status = status::build(pg, names, &seen, now);
    let serving = matches!(seen.instance, InstanceState::Serving(_));
    let events = announcements(pg, previous, &status, &made);
    if pg.status.as_ref() != Some(&status) {
        let api: Api<PostgreSQL> = Api::namespaced(ctx.client.clone(), &names.namespace);
        let body = json!({ "apiVersion": "noops.dev/v1alpha1", "kind": "PostgreSQL", "status": status });
        apply_status(&api, &names.name, &body).await.during(Step::Status)?;
    }
    let reference = pg.object_ref(&());
    for (warning, reason, note) in events {
        if warning {
            warn!(reason, "{note}");
            ctx.core.events.warning(&reference, &reason, note).await;
        } else {
            info!(reason, "{note}");
            ctx.core.events.normal(&reference, &reason, note).await;
        }
    }
    Ok(Action::requeue(if serving && made.database_ready { LOOK_AGAIN } else { NOT_YET }))
}

/// The decisions of a pass worth an Event: (warning, reason, note).
fn announcements(
    pg: &PostgreSQL,
    previous: &PostgreSQLStatus,
    status: &PostgreSQLStatus,
    made: &Made,
) -> Vec<(bool, String, String)> {
    let (db, user) = (&pg.spec.db, &pg.spec.user);
    let mut out = Vec::new();
    if let (Some(was), Some(now)) = (&previous.system_identifier, &status.system_identifier)
        && was != now
    {
        out.push((
            true,
            "DatabaseReplaced".into(),
            format!("the instance runs a new database (system identifier {now}, was {was}): its volume was lost and there was no backup to restore"),
        ));
    }
    if made.user_created {
        out.push((false, "UserCreated".into(), format!("made role {user}, with the password from the Secret")));
    }
    if made.database_created {
        out.push((false, "DatabaseCreated".into(), format!("made database {db}, owned by {user}")));
    }
    if made.password_set {
        out.push((false, "PasswordChanged".into(), format!("set role {user}'s password from Secret {}", pg.spec.password_secret)));
    }
    // A problem is told once, when Degraded turns True or its reason changes.
    let degraded = |s: &PostgreSQLStatus| s.conditions.iter().find(|c| c.type_ == "Degraded" && c.status == "True").cloned();
    if let Some(now) = degraded(status)
        && degraded(previous).is_none_or(|was| was.reason != now.reason)
    {
        out.push((true, now.reason, now.message));
    }
    let ready = |s: &PostgreSQLStatus| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
    if ready(status) && !ready(previous) {
        out.push((false, "Serving".into(), format!("database {db} is ready at {}", status.endpoint.clone().unwrap_or_default())));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::conditions::{Decided, merge};
    use crate::postgres::fixtures::postgres;

    fn with(conditions: &[Decided]) -> PostgreSQLStatus {
        PostgreSQLStatus {
            conditions: merge(&[], conditions, Some(1), jiff::Timestamp::now()),
            ..Default::default()
        }
    }

    #[test]
    fn a_problem_is_told_when_it_starts_or_changes_not_at_every_pass() {
        let pg = postgres("shop");
        let fine = with(&[Decided::new("Degraded", false, "AsExpected", "")]);
        let missing = with(&[Decided::new("Degraded", true, "PasswordSecretMissing", "no Secret")]);
        let no_key = with(&[Decided::new("Degraded", true, "PasswordKeyMissing", "no key")]);
        let told = |before: &PostgreSQLStatus, after: &PostgreSQLStatus| {
            announcements(&pg, before, after, &Made::default())
                .into_iter()
                .filter(|(warning, _, _)| *warning)
                .map(|(_, reason, _)| reason)
                .collect::<Vec<_>>()
        };
        assert_eq!(told(&fine, &missing), ["PasswordSecretMissing"]);
        assert!(told(&missing, &missing).is_empty(), "the same problem again is not news");
        assert_eq!(told(&missing, &no_key), ["PasswordKeyMissing"]);
        assert!(told(&missing, &fine).is_empty());
    }

    #[test]
    fn a_new_system_identifier_is_a_warning() {
        let pg = postgres("shop");
        let was = PostgreSQLStatus {
            system_identifier: Some("1".into()),
            ..Default::default()
        };
        let now = PostgreSQLStatus {
            system_identifier: Some("2".into()),
            ..Default::default()
        };
        let told = announcements(&pg, &was, &now, &Made::default());
        assert!(told.iter().any(|(w, r, _)| *w && r == "DatabaseReplaced"), "{told:?}");
        assert!(announcements(&pg, &was, &was, &Made::default()).is_empty());
    }
}
