//! One EtcdCluster reconcile, one pass: observe the children → validate the spec (pure) → the
//! fixed children (certificates, Services, the state ConfigMap), unless the spec is refused or
//! the cluster paused → observe etcd → plan the next membership step (pure) → take it →
//! status. One membership step per pass; the pass comes back at once for the next one.

use noops_api::backup::BackupPhase;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use noops_api::EtcdCluster;
use noops_api::etcd_backup::EtcdBackup;
use serde_json::json;
use tracing::{debug, info, warn};

use super::act::{NEXT_STEP, Runner};
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
use crate::core::stamp::{stamp, up_to_date};
use crate::core::stuck::stuck;
use crate::core::{DuringStage, Error, Result, Stage, crash};

impl From<EtcdError> for Error {
    fn from(e: EtcdError) -> Self {
        Error::Etcd(e.to_string())
    }
}

/// Reconciles one EtcdCluster (the caller's span names it), stage by stage. One membership
/// step per pass; the pass comes back at once for the next one.
pub async fn reconcile(cluster: Arc<EtcdCluster>, ctx: &Context) -> Result<Action> {
    let pass = Pass::new(&cluster, ctx).during(Stage::Validate)?;
    let children = pass.observe_children().await.during(Stage::Observe)?;
    let refusal = pass.refusal(&children);
    // Nothing is written while the cluster is paused, and nothing new from a spec that is
    // refused: the certificates it has are still renewed, or what runs would stop when they
    // expire. They come first: without the client's, etcd cannot be asked anything.
    let refused = refusal.as_ref().is_some_and(|r| r.stops_changes);
    if !cluster.spec.paused {
        ensure_certificates(&pass.names, &children, &pass.owner, ctx, pass.now, refused)
            .await
            .during(Stage::Apply)?;
        if !refused {
            ensure_fixed_children(&cluster, &pass.names, &children, &pass.owner, ctx)
                .await
                .during(Stage::Apply)?;
        }
    }
    let (etcd, credentials, facts) = pass.observe_etcd(&children).await.during(Stage::Observe)?;
    let (mut outcome, mut facts, mut later) = pass.outcome(refusal, &children, facts);
    let restore_from = pass.restore_source(&children, &outcome, &mut facts).await?;
    let (step, recovery_request_used) = pass.plan(&facts, &outcome, &mut later).await?;
    let runner = Runner {
        cluster: &cluster,
        names: &pass.names,
        owner: &pass.owner,
        children: &children,
        etcd: &etcd,
        access: EtcdAccess::new(credentials),
        ctx,
        upgrade_to: facts.upgrade_to.clone(),
        restore_from,
        now: pass.now,
    };
    let mut after = runner.take(step, &mut outcome, &mut later).await.during(Stage::Apply)?;
    if let Some(next_backup) = pass.keep_backups(&mut outcome).await {
        after = after.min(next_backup);
    }
    let status = status::build(&cluster, &pass.names, &facts, &children, &etcd, &outcome, pass.now);
    if !pass.write_status(&status, &outcome, &mut later).await? {
        return Ok(Action::requeue(NEXT_STEP));
    }
    pass.tell(later, recovery_request_used).await;
    Ok(Action::requeue(after))
}

/// What every stage of one pass knows of the cluster.
struct Pass<'a> {
    cluster: &'a EtcdCluster,
    names: Names,
    owner: k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    previous: noops_api::etcd::EtcdClusterStatus,
    ctx: &'a Context,
    now: jiff::Timestamp,
}

impl<'a> Pass<'a> {
    fn new(cluster: &'a EtcdCluster, ctx: &'a Context) -> Result<Self> {
        let owner =
            controller_reference(cluster).ok_or_else(|| Error::Internal("the EtcdCluster has no uid yet".into()))?;
        Ok(Self {
            cluster,
            names: Names::pulling_from(cluster, &ctx.images),
            owner,
            previous: cluster.status.clone().unwrap_or_default(),
            ctx,
            now: jiff::Timestamp::now(),
        })
    }

    /// Observe the children, from the caches. The user's own certificate Secrets carry none
    /// of the operator's labels, so they are not in its caches: they are read again only when
    /// they changed (`core::user_secrets`).
    async fn observe_children(&self) -> Result<Children> {
        let mut children = observe::children(&self.ctx.caches, &self.names);
        for name in self.names.user_secret_names() {
            if let Some(secret) = self.ctx.user_secrets.get(&self.names.namespace, &name).await? {
                children.secrets.insert(name, secret);
            }
        }
        Ok(children)
    }

    /// Observe etcd: what each member says of itself, the nodes of those that do not answer,
    /// and the facts the planner reads. Returns the client credentials too.
    async fn observe_etcd(
        &self,
        children: &Children,
    ) -> Result<(EtcdView, Option<super::client::Credentials>, membership::ClusterFacts)> {
        let credentials = observe::credentials(children, &self.names);
        let mut etcd = if self.names.tls && credentials.is_none() {
            EtcdView::default()
        } else {
            observe::ask_etcd(&EtcdAccess::new(credentials.clone()), children, &self.names).await
        };
        observe::ask_empty_starts(&mut etcd, self.cluster, children, self.now).await;
        let nodes_down = observe::nodes_down(&self.ctx.client, children, &etcd, &self.ctx.caches.nodes).await?;
        let nodes = self.ctx.caches.nodes.state();
        let facts = observe::facts(
            self.cluster,
            &self.names,
            children,
            &etcd,
            &nodes_down,
            &nodes,
            self.now,
        );
        Ok((etcd, credentials, facts))
    }

    /// Validate (pure): what the schema cannot check (the user's certificates among the
    /// children).
    fn refusal(&self, children: &Children) -> Option<validate::Refusal> {
        let running = self.previous.current_version.as_deref();
        validate::validate(self.cluster, running, &children.secrets, self.now)
            .or_else(|| validate::repository_refusal(&self.names))
    }

    /// The outcome the pass starts from (pure). A refused spec is told (once the status is
    /// written) and, if it refuses the version, changes no version.
    fn outcome(
        &self,
        refusal: Option<validate::Refusal>,
        children: &Children,
        mut facts: membership::ClusterFacts,
    ) -> (Outcome, membership::ClusterFacts, Vec<Announcement>) {
        let (cluster, previous, now) = (self.cluster, &self.previous, self.now);
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
            restored_from: previous.restored_from.clone().or_else(|| {
                previous
                    .cluster_id
                    .is_none()
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
            }),
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

    /// A cluster (new, or recovering) started from a backup: the backup, and how its restore
    /// stands (in `facts`).
    async fn restore_source(
        &self,
        children: &Children,
        outcome: &Outcome,
        facts: &mut membership::ClusterFacts,
    ) -> Result<Option<EtcdBackup>> {
        let Some(name) = outcome
            .restored_from
            .clone()
            .filter(|_| self.previous.cluster_id.is_none())
        else {
            return Ok(None);
        };
        // From the cache (a backup's change wakes the clusters that start from it).
        let backup = self
            .ctx
            .caches
            .backups
            .get(&kube::runtime::reflector::ObjectRef::new(&name).within(&self.names.namespace))
            .map(|b| (*b).clone());
        let member = self
            .previous
            .operation
            .as_ref()
            .map_or(facts.next_member.clone(), |op| op.member.clone());
        facts.restore = Some(
            match restore::usable(backup.as_ref(), &name, &self.cluster.spec.version) {
                Err(blocked) => blocked,
                Ok(()) => restore::state(
                    children
                        .restore_pods
                        .get(&restore::pod_name(&member))
                        .map(AsRef::as_ref),
                    self.now,
                ),
            },
        );
        Ok(backup)
    }

    /// Plan the next membership step (`membership.rs`, pure), and whether a recovery asked for
    /// with the annotation is used by this pass. A recovery from a backup happens only over a
    /// lost quorum; the request is used once either way (the annotation is removed once the
    /// status says what was done).
    async fn plan(
        &self,
        facts: &membership::ClusterFacts,
        outcome: &Outcome,
        later: &mut Vec<Announcement>,
    ) -> Result<(Step, bool)> {
        let cluster = self.cluster;
        let step = if cluster.spec.paused {
            Step::Wait {
                reason: "paused".into(),
            }
        } else if outcome.problems.invalid.as_ref().is_some_and(|r| r.stops_changes) {
            Step::Wait {
                reason: "the spec is refused".into(),
            }
        } else {
            membership::next_step(facts)
        };
        let asked_recovery = cluster
            .annotations()
            .get(RECOVER_ANNOTATION)
            .cloned()
            .filter(|_| !cluster.spec.paused);
        Ok(match (&asked_recovery, step) {
            // Members are being started again: the request waits until that is done, then is
            // used (over a quorum still lost) or dropped (over one that came back).
            (Some(_), step @ Step::RestartMembers { .. }) => (step, false),
            (Some(asked), Step::QuorumLost { reason }) => {
                match recovery_backup(cluster, &self.names, asked, self.ctx).await? {
                    Ok(backup) => (Step::RecoverFromBackup { backup }, true),
                    Err(why) => {
                        later.push(Announcement::warning("RecoveryRefused", why));
                        (Step::QuorumLost { reason }, true)
                    }
                }
            }
            (Some(_), step) => {
                later.push(Announcement::warning(
                    "RecoveryNotNeeded",
                    format!("{RECOVER_ANNOTATION} asks for a recovery from a backup, but the cluster has not lost its quorum: nothing is done, and the request is dropped"),
                ));
                (step, true)
            }
            (None, step) => (step, false),
        })
    }

    /// Scheduled backups and retention; returns when the next is due. Backups are bookkeeping
    /// beside the cluster: a failure here is logged and tried again, and never holds up the
    /// cluster's own progress or status.
    async fn keep_backups(&self, outcome: &mut Outcome) -> Option<Duration> {
        // A cluster not bootstrapped yet has nothing to back up.
        outcome.cluster_id.as_ref()?;
        let backups = in_namespace(&self.ctx.caches.backups, &self.names.namespace);
        let being_restored = being_restored(&self.ctx.clusters, &self.names.namespace, backups::starting_from);
        match backups::keep(
            self.cluster,
            &self.names,
            &self.ctx.client,
            (&backups, &being_restored),
            &mut outcome.backups,
            self.now,
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

    /// Writes the status if it changed, only over the version this pass read (it carries the
    /// operation in progress, so a pass that read a stale copy cannot undo a newer step);
    /// false if the cluster changed since. A member pod that cannot start is told when the
    /// status starts saying it (it says it only while nothing graver is said).
    async fn write_status(
        &self,
        status: &noops_api::etcd::EtcdClusterStatus,
        outcome: &Outcome,
        later: &mut Vec<Announcement>,
    ) -> Result<bool> {
        let says_stuck = |conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]| {
            conditions.iter().any(|c| c.reason == status::MEMBER_POD_STUCK)
        };
        if let Some(stuck) = &outcome.problems.stuck_pod
            && says_stuck(&status.conditions)
            && !says_stuck(&self.previous.conditions)
        {
            later.push(Announcement::warning(
                status::MEMBER_POD_STUCK,
                format!("{}: {}", stuck.reason, stuck.message),
            ));
        }
        // Members that came to share a node are told once, when the status starts saying so.
        let says_shared = |conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]| {
            conditions
                .iter()
                .find(|c| c.reason == status::MEMBERS_SHARE_NODE && c.status == "True")
                .map(|c| c.message.clone())
        };
        if let Some(message) = says_shared(&status.conditions)
            && says_shared(&self.previous.conditions).is_none()
        {
            later.push(Announcement::warning(status::MEMBERS_SHARE_NODE, message));
        }
        let metrics = &self.ctx.core.metrics;
        metrics.set_etcd_cluster(
            &self.names.namespace,
            &self.names.cluster,
            i64::from(status.ready_members),
            outcome.problems.quorum_lost.is_some(),
            status.leader.is_some(),
        );
        let schedule = self.cluster.spec.backup.as_ref().and_then(|b| b.schedule.as_deref());
        metrics.set_backups(
            "EtcdCluster",
            &self.names.namespace,
            &self.names.cluster,
            &crate::core::backup::gauges::of(&status.backups, schedule, jiff::Timestamp::now()),
        );
        if self.cluster.status.as_ref() == Some(status) {
            return Ok(true);
        }
        let mut version = self.cluster.resource_version();
        let written = self
            .ctx
            .write_status_at(self.cluster, &mut version, status)
            .await
            .during(Stage::Status)?;
        if !written {
            debug!("the cluster changed since this pass read it; looking again");
        }
        Ok(written)
    }

    /// Tells what the written status now says, and drops a recovery request this pass used.
    async fn tell(&self, later: Vec<Announcement>, recovery_request_used: bool) {
        if !later.is_empty() {
            crash::point("status written, its Events not yet told");
        }
        for announcement in later {
            self.ctx
                .core
                .events
                .tell(&self.cluster.object_ref(&()), announcement)
                .await;
        }
        if recovery_request_used {
            let api: Api<EtcdCluster> = Api::namespaced(self.ctx.client.clone(), &self.names.namespace);
            let drop = json!({ "metadata": { "annotations": { RECOVER_ANNOTATION: null } } });
            if let Err(e) = api
                .patch(&self.names.cluster, &PatchParams::default(), &Patch::Merge(&drop))
                .await
            {
                warn!(error = %e, "could not remove the recovery request annotation");
            }
        }
    }
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
