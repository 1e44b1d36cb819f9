//! An EtcdCluster pass as the core's stages: observe (the children, then etcd itself) → plan
//! (the spec's refusal, pure, then the next membership step, pure) → apply (the certificates,
//! the fixed children unless the spec is refused, the step, the backup schedule) → status, each
//! once (`core::stages` drives them). One membership step per pass; the pass comes back at once
//! for the next one.

use noops_api::backup::BackupPhase;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use noops_api::EtcdCluster;
use noops_api::etcd::EtcdClusterStatus;
use noops_api::etcd_backup::EtcdBackup;
use serde_json::json;
use tracing::{info, warn};

use super::EtcdClusters;
use super::act::{LOOK_AGAIN, Runner};
use super::client::{EtcdAccess, EtcdError};
use super::context::Context;
use super::membership::{self, Step};
use super::names::{Names, RECOVER_ANNOTATION};
use super::observe::{self, Children, EtcdView};
use super::status::{self, Outcome, Problems};
use super::{backups, bootstrap, disruption, restore, services, tls, validate};
use crate::core::apply::{apply, controller_reference, create_if_missing};
use crate::core::backup::retention::being_restored;
use crate::core::cache::in_namespace;
use crate::core::events::Announcement;
use crate::core::stages::{Applied, Observed, Report, Stages};
use crate::core::stamp::{stamp, up_to_date};
use crate::core::stuck::stuck;
use crate::core::{DuringStage, Error, Result, Stage};

impl From<EtcdError> for Error {
    fn from(e: EtcdError) -> Self {
        Error::Etcd(e.to_string())
    }
}

/// What a pass sees: the children (from the caches, with the user's certificate Secrets), what
/// etcd says of itself, the facts the planner reads, the backup a new cluster starts from, and
/// the backup a recovery request names.
pub struct Seen {
    names: Names,
    children: Children,
    etcd: EtcdView,
    credentials: Option<super::client::Credentials>,
    facts: membership::ClusterFacts,
    /// The backup a new (or recovering) cluster starts from, from the cache.
    restore_from: Option<EtcdBackup>,
    /// The backup a recovery request names, if it can be restored (or why not): read while a
    /// request stands.
    recovery: Option<std::result::Result<String, String>>,
    /// The time of the pass.
    now: jiff::Timestamp,
}

/// What a pass decides: the outcome it starts from (what the status carries on, what a refused
/// spec holds back), the facts as the plan reads them, the one membership step, whether a
/// recovery request is used, and what the status will newly say.
pub struct EtcdPlan {
    outcome: Outcome,
    facts: membership::ClusterFacts,
    step: Step,
    /// A refused spec makes nothing new: only the certificates it has are issued again.
    refused: bool,
    recovery_request_used: bool,
    later: Vec<Announcement>,
}

/// What apply leaves: the outcome after the step, what to tell once the status is written,
/// and when to come back.
pub struct Done {
    outcome: Outcome,
    later: Vec<Announcement>,
    after: Duration,
}

impl Stages for EtcdClusters {
    type Observation = Seen;
    type Plan = EtcdPlan;
    type Applied = Done;
    /// Written only over the version the pass read: the status carries the operation in
    /// progress, so a pass that read a stale copy cannot undo a newer step.
    const GUARDED: bool = true;
    /// Paused, its backup schedule is kept (bookkeeping beside the cluster); nothing else is
    /// applied.
    const APPLIES_WHILE_PAUSED: bool = true;
    const CRASH_BEFORE_EVENTS: Option<&'static str> = Some("status written, its Events not yet told");

    /// The children from the caches (the user's own certificate Secrets carry none of the
    /// operator's labels: they are read again only when they changed, `core::user_secrets`);
    /// then etcd itself, with the client certificate the children hold; the nodes of members
    /// that do not answer.
    async fn observe(
        cluster: Arc<EtcdCluster>,
        ctx: &Context,
        now: jiff::Timestamp,
    ) -> Result<Observed<EtcdCluster, Seen>> {
        let names = Names::pulling_from(&cluster, &ctx.images);
        let mut children = observe::children(&ctx.caches, &names);
        for name in names.user_secret_names() {
            if let Some(secret) = ctx.user_secrets.get(&names.namespace, &name).await? {
                children.secrets.insert(name, secret);
            }
        }
        let credentials = observe::credentials(&children, &names);
        let mut etcd = if names.tls && credentials.is_none() {
            EtcdView::default()
        } else {
            observe::ask_etcd(&EtcdAccess::new(credentials.clone()), &children, &names).await
        };
        observe::ask_empty_starts(&mut etcd, &cluster, &children, now).await;
        let nodes_down = observe::nodes_down(&ctx.client, &children, &etcd, &ctx.caches.nodes).await?;
        let nodes = ctx.caches.nodes.state();
        let mut facts = observe::facts(&cluster, &names, &children, &etcd, &nodes_down, &nodes, now);
        let restore_from = restore_source(&cluster, &names, &children, &mut facts, ctx, now);
        let recovery = match asked_recovery(&cluster) {
            Some(asked) => Some(recovery_backup(&cluster, &names, &asked, ctx).await?),
            None => None,
        };
        let seen = Seen {
            names,
            children,
            etcd,
            credentials,
            facts,
            restore_from,
            recovery,
            now,
        };
        Ok(Observed::new(cluster, seen))
    }

    /// What the schema cannot check (the user's certificates among the children) does not end
    /// the pass: a refused spec changes no member and makes nothing new, but the certificates
    /// it has are still issued again, or what runs would stop when they expire. So the
    /// refusal is the plan's (`validate.rs`, pure).
    fn plan(cluster: &EtcdCluster, seen: &Seen, _: jiff::Timestamp) -> Result<EtcdPlan> {
        let previous = cluster.status.clone().unwrap_or_default();
        let running = previous.current_version.as_deref();
        let refusal = validate::validate(cluster, running, &seen.children.secrets, seen.now)
            .or_else(|| validate::repository_refusal(&seen.names));
        let refused = refusal.as_ref().is_some_and(|r| r.stops_changes);
        let (outcome, facts, mut later) = outcome(cluster, refusal, &seen.children, seen.facts.clone(), seen.now);
        let step = if cluster.spec.paused {
            Step::Wait {
                reason: "paused".into(),
            }
        } else if refused {
            Step::Wait {
                reason: "the spec is refused".into(),
            }
        } else {
            membership::next_step(&facts)
        };
        let (step, recovery_request_used) = with_recovery(step, seen.recovery.as_ref(), &mut later);
        Ok(EtcdPlan {
            outcome,
            facts,
            step,
            refused,
            recovery_request_used,
            later,
        })
    }

    /// The certificates (they come first: without the client's, etcd cannot be asked
    /// anything), the fixed children, then the one membership step, then the backup schedule.
    /// Paused, only the backup schedule.
    async fn apply(cluster: &EtcdCluster, seen: &Seen, plan: &EtcdPlan, ctx: &Context) -> Result<Applied<Done>> {
        let owner =
            controller_reference(cluster).ok_or_else(|| Error::Internal("the EtcdCluster has no uid yet".into()))?;
        let (names, children, now) = (&seen.names, &seen.children, seen.now);
        if !cluster.spec.paused {
            ensure_certificates(names, children, &owner, ctx, now, plan.refused).await?;
            if !plan.refused {
                ensure_fixed_children(cluster, names, children, &owner, ctx).await?;
            }
        }
        let runner = Runner {
            cluster,
            names,
            owner: &owner,
            children,
            etcd: &seen.etcd,
            access: EtcdAccess::new(seen.credentials.clone()),
            ctx,
            upgrade_to: plan.facts.upgrade_to.clone(),
            restore_from: seen.restore_from.clone(),
            now,
        };
        let (mut outcome, mut later) = (plan.outcome.clone(), plan.later.clone());
        let mut after = runner.take(plan.step.clone(), &mut outcome, &mut later).await?;
        if let Some(next_backup) = keep_backups(cluster, names, ctx, &mut outcome, now).await {
            after = after.min(next_backup);
        }
        Ok(Applied::Done(Done { outcome, later, after }))
    }

    fn status(
        cluster: &EtcdCluster,
        seen: &Seen,
        plan: &EtcdPlan,
        applied: Option<&Done>,
        _: jiff::Timestamp,
    ) -> Report<EtcdClusterStatus> {
        let (outcome, mut later, after) = match applied {
            Some(done) => (&done.outcome, done.later.clone(), done.after),
            None => (&plan.outcome, plan.later.clone(), LOOK_AGAIN),
        };
        let status = status::build(
            cluster,
            &seen.names,
            &plan.facts,
            &seen.children,
            &seen.etcd,
            outcome,
            seen.now,
        );
        later.extend(newly_said(cluster.status.as_ref(), &status, outcome));
        Report {
            status,
            done: Vec::new(),
            news: later,
            next: Some(after),
        }
    }

    /// The health series, and a recovery request this pass used dropped (once the status says
    /// what was done).
    async fn settled(
        cluster: &EtcdCluster,
        seen: &Seen,
        plan: &EtcdPlan,
        applied: Option<&Done>,
        status: &EtcdClusterStatus,
        ctx: &Context,
    ) {
        let names = &seen.names;
        let outcome = applied.map_or(&plan.outcome, |done| &done.outcome);
        let metrics = &ctx.core.metrics;
        metrics.set_etcd_cluster(
            &names.namespace,
            &names.cluster,
            i64::from(status.ready_members),
            outcome.problems.quorum_lost.is_some(),
            status.leader.is_some(),
        );
        let schedule = cluster.spec.backup.as_ref().and_then(|b| b.schedule.as_deref());
        metrics.set_backups(
            "EtcdCluster",
            &names.namespace,
            &names.cluster,
            &crate::core::backup::gauges::of(&status.backups, schedule, jiff::Timestamp::now()),
        );
        if plan.recovery_request_used {
            let api: Api<EtcdCluster> = Api::namespaced(ctx.client.clone(), &names.namespace);
            let drop = json!({ "metadata": { "annotations": { RECOVER_ANNOTATION: null } } });
            if let Err(e) = api
                .patch(&names.cluster, &PatchParams::default(), &Patch::Merge(&drop))
                .await
            {
                warn!(error = %e, "could not remove the recovery request annotation");
            }
        }
    }
}

/// The backup that was (or is being) the cluster's start: the status's, or, for a cluster not
/// bootstrapped yet, the one its spec names.
fn restored_from(cluster: &EtcdCluster) -> Option<String> {
    let previous = cluster.status.as_ref();
    previous.and_then(|p| p.restored_from.clone()).or_else(|| {
        previous
            .is_none_or(|p| p.cluster_id.is_none())
            .then(|| {
                cluster
                    .spec
                    .bootstrap
                    .as_ref()?
                    .from_backup
                    .as_ref()
                    .map(|b| b.name.clone())
            })
            .flatten()
    })
}

/// The outcome the pass starts from (pure). A refused spec is told (once the status is
/// written) and, if it refuses the version, changes no version.
fn outcome(
    cluster: &EtcdCluster,
    refusal: Option<validate::Refusal>,
    children: &Children,
    mut facts: membership::ClusterFacts,
    now: jiff::Timestamp,
) -> (Outcome, membership::ClusterFacts, Vec<Announcement>) {
    let previous = cluster.status.clone().unwrap_or_default();
    let outcome = Outcome {
        operation: previous.operation.clone(),
        next_member_index: previous.next_member_index,
        cluster_id: previous.cluster_id.clone(),
        problems: Problems {
            invalid: refusal,
            quorum_lost: None,
            restore_blocked: None,
            // Said at once: the pod knows long before a grace period or a deadline passes.
            stuck_pod: stuck(observe::pods_that_serve(children, &facts), now),
        },
        backups: backups::summary(cluster),
        defragmented: None,
        unavailable_version: previous.unavailable_version.clone(),
        unavailable_repository: previous.unavailable_repository.clone(),
        restored_from: restored_from(cluster),
    };
    // What only changes the status is told once the status is written: a pass that read a
    // stale copy writes nothing and tells nothing.
    let mut later = Vec::new();
    if let Some(refusal) = &outcome.problems.invalid
        && !status::has_reason(&previous.conditions, refusal.reason.as_str())
    {
        later.push(Announcement::warning(refusal.reason, refusal.message.clone()));
    }
    if outcome.problems.invalid.as_ref().is_some_and(|r| r.stops_upgrade) {
        facts.upgrade_to = None;
    }
    (outcome, facts, later)
}

/// A cluster (new, or recovering) started from a backup: the backup, from the cache (a
/// backup's change wakes the clusters that start from it), and how its restore stands (in
/// `facts`).
fn restore_source(
    cluster: &EtcdCluster,
    names: &Names,
    children: &Children,
    facts: &mut membership::ClusterFacts,
    ctx: &Context,
    now: jiff::Timestamp,
) -> Option<EtcdBackup> {
    let previous = cluster.status.clone().unwrap_or_default();
    let name = restored_from(cluster).filter(|_| previous.cluster_id.is_none())?;
    let backup = ctx
        .caches
        .backups
        .get(&kube::runtime::reflector::ObjectRef::new(&name).within(&names.namespace))
        .map(|b| (*b).clone());
    let member = previous
        .operation
        .as_ref()
        .map_or(facts.next_member.clone(), |op| op.member.clone());
    facts.restore = Some(match restore::usable(backup.as_ref(), &name, &cluster.spec.version) {
        Err(blocked) => blocked,
        Ok(()) => restore::state(
            children
                .restore_pods
                .get(&restore::pod_name(&member))
                .map(AsRef::as_ref),
            now,
        ),
    });
    backup
}

/// The recovery a user asks for with the annotation, unless the cluster is paused.
fn asked_recovery(cluster: &EtcdCluster) -> Option<String> {
    cluster
        .annotations()
        .get(RECOVER_ANNOTATION)
        .cloned()
        .filter(|_| !cluster.spec.paused)
}

/// The step, with a recovery asked for with the annotation (`recovery`: the backup it names,
/// or why not), and whether the request is used by this pass. A recovery from a backup
/// happens only over a lost quorum; the request is used once either way (the annotation is
/// removed once the status says what was done). Pure.
fn with_recovery(
    step: Step,
    recovery: Option<&std::result::Result<String, String>>,
    later: &mut Vec<Announcement>,
) -> (Step, bool) {
    match (recovery, step) {
        // Members are being started again: the request waits until that is done, then is
        // used (over a quorum still lost) or dropped (over one that came back).
        (Some(_), step @ Step::RestartMembers { .. }) => (step, false),
        (Some(Ok(backup)), Step::QuorumLost { .. }) => (Step::RecoverFromBackup { backup: backup.clone() }, true),
        (Some(Err(why)), Step::QuorumLost { reason }) => {
            later.push(Announcement::warning("RecoveryRefused", why.clone()));
            (Step::QuorumLost { reason }, true)
        }
        (Some(_), step) => {
            later.push(Announcement::warning(
                "RecoveryNotNeeded",
                format!("{RECOVER_ANNOTATION} asks for a recovery from a backup, but the cluster has not lost its quorum: nothing is done, and the request is dropped"),
            ));
            (step, true)
        }
        (None, step) => (step, false),
    }
}

/// Scheduled backups and retention; returns when the next is due. Backups are bookkeeping
/// beside the cluster: a failure here is logged and tried again, and never holds up the
/// cluster's own progress or status.
async fn keep_backups(
    cluster: &EtcdCluster,
    names: &Names,
    ctx: &Context,
    outcome: &mut Outcome,
    now: jiff::Timestamp,
) -> Option<Duration> {
    // A cluster not bootstrapped yet has nothing to back up.
    outcome.cluster_id.as_ref()?;
    let backups = in_namespace(&ctx.caches.backups, &names.namespace);
    let being_restored = being_restored(&ctx.clusters, &names.namespace, backups::starting_from);
    match backups::keep(
        cluster,
        names,
        &ctx.client,
        (&backups, &being_restored),
        &mut outcome.backups,
        now,
    )
    .await
    {
        Ok(next_backup) => next_backup,
        Err(e) => {
            warn!(error = %e, "could not keep the backup schedule this time");
            Some(Duration::from_secs(10))
        }
    }
}

/// What the status newly says that is told once it is written: a member pod that cannot start
/// (said only while nothing graver is), members that came to share a node.
fn newly_said(
    previous: Option<&EtcdClusterStatus>,
    status: &EtcdClusterStatus,
    outcome: &Outcome,
) -> Vec<Announcement> {
    let mut out = Vec::new();
    let previous: &[Condition] = previous.map_or(&[], |p| &p.conditions);
    let says_stuck = |conditions: &[Condition]| conditions.iter().any(|c| c.reason == status::MEMBER_POD_STUCK);
    if let Some(stuck) = &outcome.problems.stuck_pod
        && says_stuck(&status.conditions)
        && !says_stuck(previous)
    {
        out.push(Announcement::warning(
            status::MEMBER_POD_STUCK,
            format!("{}: {}", stuck.reason, stuck.message),
        ));
    }
    let says_shared = |conditions: &[Condition]| {
        conditions
            .iter()
            .find(|c| c.reason == status::MEMBERS_SHARE_NODE && c.status == "True")
            .map(|c| c.message.clone())
    };
    if let Some(message) = says_shared(&status.conditions)
        && says_shared(previous).is_none()
    {
        out.push(Announcement::warning(status::MEMBERS_SHARE_NODE, message));
    }
    out
}

/// Makes sure the cluster's certificates exist as they should: the CA (created once, never
/// replaced), the leaf certificates (issued again when due). `renew_only`: only those it has
/// are issued again, nothing is made (a refused spec).
async fn ensure_certificates(
    names: &Names,
    children: &Children,
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    ctx: &Context,
    now: jiff::Timestamp,
    renew_only: bool,
) -> Result<()> {
    let ns = &names.namespace;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    // With the user's own certificates there is nothing to issue (validation checks them).
    if names.tls && names.user_secrets.is_none() {
        let ca = match children.secrets.get(&names.ca_secret()) {
            Some(secret) => tls::ca_of(secret, names).map_err(|e| Error::Certificate(e.to_string()))?,
            None if renew_only => return Ok(()),
            None => {
                let ca = tls::new_ca(names, now).map_err(|e| Error::Certificate(e.to_string()))?;
                match secrets
                    .create(&PostParams::default(), &tls::ca_secret(&ca, names, owner))
                    .await
                {
                    Ok(_) => info!("made the cluster's certificate authority"),
                    // Another reconcile made it: use that one (read again next pass).
                    Err(kube::Error::Api(e)) if e.code == 409 => return Ok(()),
                    Err(e) => return Err(e.into()),
                }
                ca
            }
        };
        for leaf in [tls::Leaf::Peer, tls::Leaf::Server, tls::Leaf::Client] {
            let lifetime = ctx.certificate_lifetime;
            let name = leaf.secret(names);
            let expires = |at| {
                ctx.core
                    .metrics
                    .set_certificate_expiry("EtcdCluster", ns, &names.cluster, &name, at)
            };
            let live = children.secrets.get(&name).map(|s| s.as_ref());
            if tls::needs_issuing(live, now, lifetime) && !(renew_only && live.is_none()) {
                let issued =
                    tls::issue(&ca, names, leaf, now, lifetime).map_err(|e| Error::Certificate(e.to_string()))?;
                let secret = tls::leaf_secret(&issued, &ca, names, leaf, owner);
                apply(&secrets, &name, &secret).await?;
                info!(secret = name, not_after = %issued.not_after, "issued a certificate");
                expires(issued.not_after);
            } else if let Some(at) = live.and_then(crate::core::pki::not_after) {
                expires(at);
            }
        }
    }
    Ok(())
}

/// Makes sure the other children every cluster has exist as they should: the two Services,
/// the PodDisruptionBudget and the state ConfigMap (created once; only the bootstrap steps
/// change it).
async fn ensure_fixed_children(
    cluster: &EtcdCluster,
    names: &Names,
    children: &Children,
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    ctx: &Context,
) -> Result<()> {
    let ns = &names.namespace;
    let service_api: Api<Service> = Api::namespaced(ctx.client.clone(), ns);
    for mut service in [
        services::peer_service(names, owner),
        services::client_service(names, owner),
    ] {
        stamp(&mut service);
        let name = service.metadata.name.clone().unwrap_or_default();
        if !up_to_date(&service, children.services.get(&name).map(|s| s.as_ref())) {
            apply(&service_api, &name, &service).await?;
        }
    }
    let mut budget = disruption::budget(cluster, names, owner);
    stamp(&mut budget);
    if !up_to_date(&budget, children.budgets.get(&names.cluster).map(|b| b.as_ref())) {
        let api: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), ns);
        apply(&api, &names.cluster, &budget).await?;
    }
    if !children.config_maps.contains_key(&names.state_config_map()) {
        let bootstrapped = cluster.status.as_ref().is_some_and(|s| s.cluster_id.is_some());
        let config_map = bootstrap::state_config_map(names, owner, !bootstrapped);
        let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
        create_if_missing(&api, &config_map).await?;
    }
    Ok(())
}

/// Why the backup a recovery asks for is read from the API.
const RECOVERY: &str = "backup-before-recovery";

/// The backup a recovery asks for (`latest`: the newest successful backup of this cluster, by
/// its etcd cluster ID), if it can be restored; otherwise why not.
async fn recovery_backup(
    cluster: &EtcdCluster,
    names: &Names,
    asked: &str,
    ctx: &Context,
) -> Result<std::result::Result<String, String>> {
    // Confirmed with the API, not the cache: a recovery replaces the cluster's data, and a
    // request refused is dropped, so it is judged on the newest word.
    let api: Api<EtcdBackup> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let backup = if asked == "latest" {
        let cluster_id = cluster.status.as_ref().and_then(|s| s.cluster_id.clone());
        crate::core::confirm::list(&api, &kube::api::ListParams::default(), RECOVERY)
            .await
            .during(Stage::Observe)?
            .items
            .into_iter()
            .filter(|b| b.spec.cluster == names.cluster)
            .filter(|b| {
                let status = b.status.clone().unwrap_or_default();
                status.progress.phase == Some(BackupPhase::Succeeded)
                    && status.cluster_id.is_some()
                    && status.cluster_id == cluster_id
            })
            .max_by_key(|b| {
                b.status
                    .as_ref()
                    .and_then(|s| s.progress.completed_at.as_ref())
                    .map(|t| t.0)
            })
    } else {
        crate::core::confirm::get(&api, asked, RECOVERY)
            .await
            .during(Stage::Observe)?
    };
    let Some(backup) = backup else {
        return Ok(Err(format!(
            "{RECOVER_ANNOTATION}={asked}: there is no such successful backup of this cluster; nothing is done, and the request is dropped"
        )));
    };
    let name = backup.name_any();
    Ok(match restore::usable(Some(&backup), &name, &cluster.spec.version) {
        Ok(()) => Ok(name),
        Err(restore::Restore::Blocked { message, .. }) => Err(format!(
            "{RECOVER_ANNOTATION}={asked}: {message}; nothing is done, and the request is dropped"
        )),
        Err(_) => Err(format!(
            "{RECOVER_ANNOTATION}={asked}: EtcdBackup {name} cannot be restored; nothing is done"
        )),
    })
}
