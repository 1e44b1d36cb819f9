//! One PostgreSQL reconcile, one pass: observe (children and backups from the caches, the
//! user's password Secret) → validate (the password; what an empty data directory would
//! become, `restore.rs`) → apply the children (superuser Secret once, the plan's ConfigMap,
//! StatefulSet, Service) → the database (as the superuser: its owner, the password, the
//! database; what it says of its WAL archiving and of a restore) → backups (the first, the
//! scheduled, retention) → the connection Secret → status, and an Event for each decision.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::DeleteParams;
use kube::runtime::controller::Action;
use kube::{Api, Resource};
use noops_api::PostgreSQL;
use serde_json::json;
use tracing::{info, warn};

use super::backups::{self, Book};
use super::database::{self, Made};
use super::events::announcements;
use super::names::Names;
use super::node_loss::{self, Elsewhere, NodeLoss};
use super::placement;
use super::problem::PlanProblem;
use super::restore::InstancePlan;
use super::secrets::{self, Password};
use super::status::{self, InstanceState, Seen};
use super::store::Destination;
use super::{Context, destination, observe, restore, services, statefulset};
use crate::core::apply::{apply, apply_status, controller_reference, create_if_missing, delete_if_present};
use crate::core::events::Announcement;
use crate::core::stamp::{stamp, up_to_date};
use crate::core::stuck::stuck;
use crate::core::{DuringStage, Error, Result, Stage, crash};

/// How often a serving database is looked at without a change. Everything that moves it
/// comes through a watch (its spec, its pod, its StatefulSet, its password Secret, its
/// backups); this catches hand changes inside PostgreSQL (a dropped role) and, with backups,
/// keeps the last archived WAL segment in status current.
const LOOK_AGAIN: Duration = Duration::from_secs(300);
const LOOK_AGAIN_ARCHIVING: Duration = Duration::from_secs(60);
/// How soon a database that is not serving yet is looked at again, if nothing wakes it first.
const NOT_YET: Duration = Duration::from_secs(5);

/// Reconciles one PostgreSQL (the caller's span names it).
pub async fn reconcile(pg: Arc<PostgreSQL>, ctx: &Context) -> Result<Action> {
    let names = Names::of(&pg);
    let now = jiff::Timestamp::now();
    let owner = controller_reference(pg.as_ref())
        .ok_or_else(|| Error::Internal("the PostgreSQL has no uid yet".into()))
        .during(Stage::Validate)?;
    let previous = pg.status.clone().unwrap_or_default();
    let secrets_api: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);

    // Observe. The user's Secret carries none of the operator's labels, so it is not in the
    // caches: it is read again only when it changed (`core::user_secrets`).
    let children = observe::children(&ctx.caches, &names);
    let all_backups = observe::backups(&ctx.caches, &names);
    let databases = observe::databases(&ctx.databases, &names);
    let user_secret = ctx
        .user_secrets
        .get(&names.namespace, &pg.spec.password_secret)
        .await
        .during(Stage::Observe)?;

    // Validate: the schema checked the spec; the password's Secret and the backup a new
    // database starts from are left.
    let password = secrets::password(user_secret.as_deref(), &pg.spec.password_secret);
    let plan = restore::plan(&pg, &all_backups);
    let schedule_problem = backups::schedule_problem(&pg);
    // Where a bootstrap backup is, recorded once: the pod is built to reach it.
    let bootstrap_source = previous
        .bootstrap_source
        .clone()
        .or_else(|| restore::bootstrap_location(&pg, &all_backups));

    // Apply.
    let superuser_password = ensure_superuser_secret(&names, &owner, &children, &secrets_api)
        .await
        .during(Stage::Apply)?;
    if let Ok(plan) = &plan {
        let mut config = restore::config_map(&names, &owner, plan);
        stamp(&mut config);
        if !up_to_date(&config, children.instance_config.as_deref()) {
            let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &names.namespace);
            apply(&api, &names.instance_config(), &config)
                .await
                .during(Stage::Apply)?;
            crash::point("postgres: plan written");
            info!(restore_from = ?plan.restore.as_ref().map(|r| &r.backup), "an empty data directory now becomes what the plan says");
        }
    }
    // A new database whose bootstrap backup cannot be used yet gets no pod: it would have
    // nothing to start from.
    // A pod given a backup destination it cannot reach cannot start: the StatefulSet is left
    // as it is until the destination is there, so that a bad edit never stops a database
    // that serves.
    // A spec no node could ever hold (`placement.rs`) is left out the same way.
    let mut held_back = None;
    let mut refused = None;
    if plan.is_ok() || children.statefulset.is_some() {
        let mut sts = statefulset::build(&pg, &names, &owner, &ctx.image, bootstrap_source.as_ref());
        stamp(&mut sts);
        if !up_to_date(&sts, children.statefulset.as_deref()) {
            held_back = check_destination(&pg, &names, ctx).await.during(Stage::Validate)?;
            if held_back.is_none() {
                held_back = check_placement(&pg, ctx).await.during(Stage::Validate)?;
            }
            match &held_back {
                None => {
                    let api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &names.namespace);
                    match apply(&api, &names.statefulset(), &sts).await {
                        Ok(_) => info!("applied the StatefulSet"),
                        Err(error) => refused = Some(refusal("StatefulSet", error).during(Stage::Apply)?),
                    }
                }
                Some(problem) => {
                    info!(
                        reason = problem.reason,
                        "the StatefulSet is left as it is: {}", problem.message
                    );
                }
            }
        }
    }
    let mut service = services::build(&pg, &names, &owner);
    stamp(&mut service);
    let live_service = if up_to_date(&service, children.service.as_deref()) {
        children.service.as_deref().cloned()
    } else {
        let api: Api<Service> = Api::namespaced(ctx.client.clone(), &names.namespace);
        match apply(&api, &names.service(), &service).await {
            Ok(applied) => Some(applied),
            Err(error) => {
                refused = refused.or(Some(refusal("Service", error).during(Stage::Apply)?));
                children.service.as_deref().cloned()
            }
        }
    };
    // A pod that cannot start never makes way for a corrected one by itself (the StatefulSet
    // waits for it to be Ready first): it is deleted, and the StatefulSet makes the new one.
    if let Some(pod) = outdated_stuck_pod(&children, now) {
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &names.namespace);
        delete_if_present(&api, &pod, &Default::default())
            .await
            .during(Stage::Apply)?;
        info!(
            pod,
            "deleted the instance's pod, which cannot start, for one of the new spec"
        );
    }

    if let Some(pod) = observe::pod_without_its_claim(&children) {
        // The caches may have seen a new pod before its new claim: the API server says.
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &names.namespace);
        let claim = claims.get_opt(&names.data_claim()).await.during(Stage::Observe)?;
        if claim.is_none_or(|c| c.metadata.deletion_timestamp.is_some()) {
            let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &names.namespace);
            delete_if_present(&api, &pod, &Default::default())
                .await
                .during(Stage::Apply)?;
            info!(
                pod,
                "deleted the instance's pod, which waited for a volume claim that is gone: the StatefulSet makes both anew"
            );
        }
    }

    // A node that died with the instance on it.
    let pod = children.instance.as_deref();
    let node_lost = match pod.filter(|p| node_loss::stuck_in_deletion(p, now)) {
        Some(stuck) => handle_node_loss(&pg, &names, ctx, stuck, &plan, now)
            .await
            .during(Stage::Apply)?,
        None => None,
    };

    // The instance and the database in it.
    let (mut instance, made) =
        database::instance_and_database(&pg, &names, &previous, pod, &superuser_password, &password).await;
    if let InstanceState::Unreachable(why) = &instance {
        // The caches may be a moment behind a pod deleted (or no longer Ready) while the pass
        // talked to it: that one is being replaced, not unreachable, and worth no Warning.
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &names.namespace);
        let latest = pods.get_opt(&names.instance()).await.during(Stage::Observe)?;
        if latest.as_ref().and_then(observe::ready_address).is_none() {
            info!(error = %why, "the instance's pod stopped serving while this pass talked to it");
            instance = InstanceState::Starting(format!("pod {} is stopping or starting", names.instance()));
        } else {
            warn!(error = %why, "cannot talk to the instance");
        }
    }
    let serving = matches!(instance, InstanceState::Serving(_)) && made.database_ready;

    // Backups.
    let mut book = Book::of(&pg);
    let namespace = backups::NamespaceView {
        backups: &all_backups,
        databases: &databases,
    };
    let pass = backups::keep(&pg, &names, &ctx.client, &namespace, serving, &mut book, now)
        .await
        .during(Stage::Apply)?;
    let reference = pg.object_ref(&());
    for announcement in pass.decisions {
        ctx.core.events.tell(&reference, announcement).await;
    }

    let seen = Seen {
        instance,
        instance_pod: pod.and_then(|p| p.metadata.name.clone()),
        node: pod.and_then(observe::node),
        password_problem: password.as_ref().err().cloned(),
        password_version: made.password_version.clone(),
        database_ready: made.database_ready,
        node_port: live_service
            .as_ref()
            .and_then(|s| s.spec.as_ref()?.ports.as_ref()?.first()?.node_port)
            .filter(|_| pg.spec.service.type_ == noops_api::postgres::ServiceType::NodePort),
        restores_from: plan
            .as_ref()
            .ok()
            .and_then(|p| p.restore.as_ref())
            .map(|r| r.backup.clone()),
        initdb_refused: plan.as_ref().is_ok_and(|p| p.initdb_refused.is_some()),
        plan_problem: plan.as_ref().err().cloned(),
        held_back: held_back.clone().or(refused),
        schedule_problem,
        service_missing: live_service.is_none(),
        archiver: made.archiver.clone(),
        restore: made.restore.clone(),
        book,
        bootstrap_source,
        node_lost,
    };
    finish(&pg, &names, ctx, &owner, &children, seen, &made, &password, now).await?;
    let look = if !serving || held_back.is_some() {
        // (Nothing watches the user's backup claim, nor the nodes: a problem with them is
        // looked at again.)
        NOT_YET
    } else if pg.spec.backup.is_some() {
        LOOK_AGAIN_ARCHIVING
    } else {
        LOOK_AGAIN
    };
    Ok(Action::requeue(pass.look_again.map_or(look, |next| next.min(look))))
}

/// A child the API server refuses to take as this spec makes it (a resource quantity it cannot
/// parse, requests above limits, a node port another Service holds) is a problem of the spec, told
/// in the status, not a failed pass: the child is left as it was, and the rest of the pass (the
/// password, backups, the status) goes on. Any other error is returned.
fn refusal(kind: &str, error: kube::Error) -> std::result::Result<PlanProblem, kube::Error> {
    match &error {
        kube::Error::Api(response) if response.code == 400 || response.code == 422 => {
            warn!(kind, message = %response.message, "the API server refused the spec's {kind}; it is left as it was");
            Ok(PlanProblem {
                reason: "SpecRejected",
                message: format!(
                    "the API server refused the {kind} this spec makes, so it is left as it was: {}",
                    response.message
                ),
            })
        }
        _ => Err(error),
    }
}

/// Why the instance cannot be given the backup destination of `pg`'s spec, if it cannot: its
/// credentials Secret or its claim, read from the API (neither carries the operator's labels,
/// so neither is in the caches). Read only when the StatefulSet is about to change.
async fn check_destination(pg: &PostgreSQL, names: &Names, ctx: &Context) -> Result<Option<PlanProblem>> {
    let Some(wanted) = pg.spec.backup.as_ref().and_then(Destination::of_spec) else {
        return Ok(None);
    };
    let (secret, claim) = match destination::needed(&wanted) {
        destination::Needed::Secret(name) => (ctx.user_secrets.get(&names.namespace, name).await?, None),
        destination::Needed::Claim(name) => {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &names.namespace);
            (None, api.get_opt(name).await?)
        }
    };
    Ok(destination::problem(&wanted, secret.as_deref(), claim.as_ref()))
}

/// Why no node could hold the instance's pod as the spec sizes it, if none could. The nodes
/// are listed only when the spec sets resources and the StatefulSet is about to change.
async fn check_placement(pg: &PostgreSQL, ctx: &Context) -> Result<Option<PlanProblem>> {
    let Some(resources) = pg
        .spec
        .resources
        .as_ref()
        .filter(|r| !placement::requests(r).is_empty())
    else {
        return Ok(None);
    };
    let nodes = Api::<Node>::all(ctx.client.clone()).list(&Default::default()).await?;
    Ok(placement::no_node_fits(Some(resources), &nodes.items))
}

/// The instance's pod, if it cannot start and the StatefulSet has a newer revision for it.
fn outdated_stuck_pod(children: &observe::Children, now: jiff::Timestamp) -> Option<String> {
    let pod = children.instance.as_deref()?;
    stuck([pod], now)?;
    let update = children
        .statefulset
        .as_deref()?
        .status
        .as_ref()?
        .update_revision
        .clone()?;
    let revision = pod.metadata.labels.as_ref()?.get("controller-revision-hash")?;
    (*revision != update).then(|| pod.metadata.name.clone()).flatten()
}

/// Looks at the node of an instance pod stuck in its deletion, and acts as `node_loss.rs`
/// decides; returns why the instance waits for its node, if it does.
async fn handle_node_loss(
    pg: &PostgreSQL,
    names: &Names,
    ctx: &Context,
    pod: &Pod,
    plan: &std::result::Result<InstancePlan, PlanProblem>,
    now: jiff::Timestamp,
) -> Result<Option<String>> {
    let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    let node = Api::<Node>::all(ctx.client.clone()).get_opt(&node_name).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let volume_of = |claim: Option<PersistentVolumeClaim>| async {
        match claim.and_then(|c| c.spec?.volume_name) {
            Some(name) => volumes.get_opt(&name).await,
            None => Ok(None),
        }
    };
    let data_claim = claims.get_opt(&names.data_claim()).await?;
    let data_volume = volume_of(data_claim.clone()).await?;
    // What could restore the database elsewhere: a backup the plan names, not on that node,
    // with the WAL archived up to the moment the node died.
    let status = pg.status.clone().unwrap_or_default();
    let archiving_failed = match (&status.last_failed_time, &status.last_archived_time) {
        (Some(failed), Some(archived)) => failed.0 > archived.0,
        (Some(_), None) => true,
        _ => false,
    };
    let restore_from = match plan.as_ref().ok().and_then(|p| p.restore.as_ref()) {
        // It never served (the node died during its first initdb): nothing on the volume to lose.
        None if status.system_identifier.is_none() => Ok(Elsewhere::Anew),
        None => Err("the database has no base backup to restore from elsewhere".to_string()),
        Some(_) if archiving_failed => Err(format!(
            "its WAL archiving was failing (segment {}): a restore would lose the commits since",
            status.last_failed_wal.clone().unwrap_or_default()
        )),
        Some(restore) => {
            let backup_claim = pg
                .spec
                .backup
                .as_ref()
                .and_then(Destination::of_spec)
                .and_then(|d| d.claim().map(str::to_string));
            let backup_volume = match backup_claim {
                Some(claim) => volume_of(claims.get_opt(&claim).await?).await?,
                None => None,
            };
            if backup_volume.is_some_and(|pv| node_loss::pinned_to(&pv, &node_name)) {
                Err(format!("its backups are on node {node_name}'s disk too"))
            } else {
                Ok(Elsewhere::Restore(restore.backup.clone()))
            }
        }
    };
    let decision = node_loss::decide(
        pod,
        node.as_ref(),
        data_volume.as_ref(),
        restore_from.as_ref().map_err(String::as_str),
        now,
    );
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    let reference = pg.object_ref(&());
    let pod_name = names.instance();
    match decision {
        NodeLoss::Fine => Ok(None),
        NodeLoss::ForceDelete { node } => {
            delete_if_present(&pods, &pod_name, &force).await?;
            let note = format!(
                "node {node} is not ready and did not stop pod {pod_name}: deleted it, so that the StatefulSet starts it again, on its volume"
            );
            ctx.core
                .events
                .tell(&reference, Announcement::warning("PodForceDeleted", note))
                .await;
            Ok(None)
        }
        NodeLoss::GiveUpVolume { node } => {
            if data_claim.is_some_and(|c| c.metadata.deletion_timestamp.is_none()) {
                // The volume itself is kept: should the node come back, what it holds (the
                // commits not archived yet) can still be salvaged by hand.
                if let Some(pv) = data_volume.as_ref().and_then(|pv| pv.metadata.name.clone()) {
                    let retain = serde_json::json!({ "spec": { "persistentVolumeReclaimPolicy": "Retain" } });
                    volumes
                        .patch(
                            &pv,
                            &kube::api::PatchParams::default(),
                            &kube::api::Patch::Merge(&retain),
                        )
                        .await?;
                }
                delete_if_present(&claims, &names.data_claim(), &DeleteParams::default()).await?;
                crash::point("postgres node loss: volume given up, pod not deleted");
            }
            delete_if_present(&pods, &pod_name, &force).await?;
            let kept = data_volume
                .as_ref()
                .and_then(|pv| pv.metadata.name.clone())
                .unwrap_or_default();
            let note = match restore_from {
                Ok(Elsewhere::Restore(backup)) => format!(
                    "node {node} is not ready, with the instance's volume on its disk: gave the volume up; the instance starts on another node and restores backup {backup} and the archived WAL (commits after the last archived segment, {}, are lost). The volume {kept} is kept (Retain): delete it once nothing is to be salvaged from it",
                    status.last_archived_wal.clone().unwrap_or_else(|| "none".into()),
                ),
                _ => format!(
                    "node {node} is not ready, with the instance's volume on its disk: the database never served, so nothing is lost; gave the volume up, and the instance is made anew on another node. The volume {kept} is kept (Retain): delete it"
                ),
            };
            ctx.core
                .events
                .tell(&reference, Announcement::warning("VolumeGivenUp", note))
                .await;
            Ok(None)
        }
        NodeLoss::WaitForNode { node, why } => Ok(Some(format!(
            "node {node} is not ready, with the instance's volume on its disk; {why}, so the instance waits for the node to come back"
        ))),
    }
}

/// Makes the superuser's Secret once; returns the superuser's password.
async fn ensure_superuser_secret(
    names: &Names,
    owner: &OwnerReference,
    children: &observe::Children,
    api: &Api<Secret>,
) -> Result<String> {
    if let Some(password) = children
        .superuser_secret
        .as_deref()
        .and_then(secrets::superuser_password)
    {
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
    ctx: &Context,
    owner: &OwnerReference,
    children: &observe::Children,
    seen: Seen,
    made: &Made,
    password: &Result<Password, secrets::PasswordProblem>,
    now: jiff::Timestamp,
) -> Result<()> {
    if let Ok(password) = password {
        let mut secret = secrets::connection_secret(names, owner, &pg.spec.db, &pg.spec.user, password);
        stamp(&mut secret);
        if !up_to_date(&secret, children.connection_secret.as_deref()) {
            let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
            apply(&api, &names.connection_secret(), &secret)
                .await
                .during(Stage::Apply)?;
        }
    }
    let previous = pg.status.clone().unwrap_or_default();
    let status = status::build(pg, names, &seen, now);
    let events = announcements(pg, &previous, &status, made);
    if pg.status.as_ref() != Some(&status) {
        if status.restore != previous.restore || made.password_set {
            crash::point("postgres: restore or password seen, status not written");
        }
        let api: Api<PostgreSQL> = Api::namespaced(ctx.client.clone(), &names.namespace);
        let body = json!({ "apiVersion": "noops.dev/v1alpha1", "kind": "PostgreSQL", "status": status });
        apply_status(&api, &names.name, &body).await.during(Stage::Status)?;
    }
    let reference = pg.object_ref(&());
    for announcement in events {
        ctx.core.events.tell(&reference, announcement).await;
    }
    Ok(())
}
