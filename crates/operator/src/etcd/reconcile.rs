//! One EtcdCluster reconcile, one pass: observe (children, etcd) → validate → the fixed children
//! (certificates, Services, the state ConfigMap) → plan the next membership step (pure) → take
//! it → status. One membership step per pass; the pass comes back at once for the next one.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, PersistentVolumeClaim, Pod, Secret, Service};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use noops_api::EtcdCluster;
use noops_api::etcd::{Operation, OperationKind};
use noops_api::etcd_backup::EtcdBackup;
use serde_json::json;
use tracing::{debug, info, warn};

use super::client::{EtcdAccess, EtcdError};
use super::membership::{self, Step};
use super::names::{Names, RECOVER_ANNOTATION};
use super::observe::{self, Children, EtcdView};
use super::status::{self, Outcome, Problems};
use super::{Context, backups, bootstrap, pod, restore, services, tls, validate, volume};
use crate::core::apply::{apply, apply_status, controller_reference, create_if_missing, delete_if_present};
use crate::core::events::Announcement;
use crate::core::stamp::{stamp, up_to_date};
use crate::core::stuck::stuck;
use crate::core::{DuringStage, Error, Result, Stage, crash};

/// How often a settled cluster is looked at (member health is not something Kubernetes
/// watches).
const LOOK_AGAIN: Duration = Duration::from_secs(10);
/// How soon the next step of a change is taken.
const NEXT_STEP: Duration = Duration::from_millis(500);
/// How soon a step etcd was not ready for is tried again.
const NOT_NOW_RETRY: Duration = Duration::from_secs(1);

impl From<EtcdError> for Error {
    fn from(e: EtcdError) -> Self {
        Error::Etcd(e.to_string())
    }
}

/// Reconciles one EtcdCluster (the caller's span names it).
pub async fn reconcile(cluster: Arc<EtcdCluster>, ctx: &Context) -> Result<Action> {
    let names = Names::of(&cluster);
    let now = jiff::Timestamp::now();
    let owner = controller_reference(cluster.as_ref())
        .ok_or_else(|| Error::InvalidSpec("the EtcdCluster has no uid yet".into()))
        .during(Stage::Validate)?;
    let previous = cluster.status.clone().unwrap_or_default();

    let mut children = observe::children(&ctx.caches, &names);
    if let Some(user) = &names.user_secrets {
        // The user's own certificate Secrets carry none of the operator's labels, so they are
        // not in its caches: read them.
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
        for name in [&user.peer, &user.server, &user.client] {
            if let Some(secret) = secrets.get_opt(name).await.during(Stage::Observe)? {
                children.secrets.insert(name.clone(), Arc::new(secret));
            }
        }
    }
    let children = children;
    ensure_fixed_children(&cluster, &names, &children, &owner, ctx, now)
        .await
        .during(Stage::Apply)?;
    let credentials = observe::credentials(&children, &names);
    let etcd = if names.tls && credentials.is_none() {
        EtcdView::default()
    } else {
        observe::ask_etcd(&EtcdAccess::new(credentials.clone()), &children, &names).await
    };
    let nodes_down = observe::nodes_down(&ctx.client, &children, &etcd)
        .await
        .during(Stage::Observe)?;
    let facts = observe::facts(&cluster, &names, &children, &etcd, &nodes_down, now);

    let mut outcome = Outcome {
        operation: previous.operation.clone(),
        next_member_index: previous.next_member_index,
        cluster_id: previous.cluster_id.clone(),
        problems: Problems {
            invalid: validate::validate(&cluster, previous.current_version.as_deref(), &children.secrets, now),
            quorum_lost: None,
            restore_blocked: None,
            // Said at once: the pod knows long before a grace period or a deadline passes.
            stuck_pod: stuck(observe::pods_that_serve(&children, &facts), now),
        },
        backups: backups::Book::of(&cluster),
        defragmented: None,
        unavailable_version: previous.unavailable_version.clone(),
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
        && !has_condition_reason(&previous.conditions, refusal.reason)
    {
        later.push(Announcement::warning(refusal.reason, refusal.message.clone()));
    }

    let mut facts = facts;
    if outcome.problems.invalid.as_ref().is_some_and(|r| r.stops_upgrade) {
        // A refused version (or spec) changes no version.
        facts.upgrade_to = None;
    }
    // A cluster (new, or recovering) started from a backup: the backup, and how its restore
    // stands.
    let restore_from = match outcome.restored_from.clone() {
        Some(name) if previous.cluster_id.is_none() => {
            let backups: Api<EtcdBackup> = Api::namespaced(ctx.client.clone(), &names.namespace);
            let backup = backups.get_opt(&name).await.during(Stage::Observe)?;
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
        _ => None,
    };
    let step = if cluster.spec.paused {
        Step::Wait {
            reason: "paused".into(),
        }
    } else if outcome.problems.invalid.as_ref().is_some_and(|r| r.stops_changes) {
        Step::Wait {
            reason: "the spec is refused".into(),
        }
    } else {
        membership::next_step(&facts)
    };
    // A recovery from a backup, asked for with an annotation, happens only over a lost quorum;
    // the request is used once either way (the annotation is removed once the status says
    // what was done).
    let asked_recovery = cluster
        .annotations()
        .get(RECOVER_ANNOTATION)
        .cloned()
        .filter(|_| !cluster.spec.paused);
    let mut recovery_request_used = asked_recovery.is_some();
    let step = match (&asked_recovery, step) {
        // Members are being started again: the request waits until that is done, then is
        // used (over a quorum still lost) or dropped (over one that came back).
        (Some(_), step @ Step::RestartMembers { .. }) => {
            recovery_request_used = false;
            step
        }
        (Some(asked), Step::QuorumLost { reason }) => match recovery_backup(&cluster, &names, asked, ctx).await? {
            Ok(backup) => Step::RecoverFromBackup { backup },
            Err(why) => {
                later.push(Announcement::warning("RecoveryRefused", why));
                Step::QuorumLost { reason }
            }
        },
        (Some(_), step) => {
            later.push(Announcement::warning(
                "RecoveryNotNeeded",
                format!("{RECOVER_ANNOTATION} asks for a recovery from a backup, but the cluster has not lost its quorum: nothing is done, and the request is dropped"),
            ));
            step
        }
        (None, step) => step,
    };
    let runner = Runner {
        cluster: &cluster,
        names: &names,
        owner: &owner,
        children: &children,
        etcd: &etcd,
        access: EtcdAccess::new(credentials),
        ctx,
        upgrade_to: facts.upgrade_to.clone(),
        restore_from,
        now,
    };
    let mut after = runner.take(step, &mut outcome, &mut later).await.during(Stage::Apply)?;
    let busy = outcome.operation.is_some();
    if outcome.cluster_id.is_some() && backups::worth_a_look(&cluster, &outcome.backups, busy, now) {
        // Backups are bookkeeping beside the cluster: a failure here is logged and tried again,
        // and never holds up the cluster's own progress or status.
        match backups::keep(&cluster, &names, &ctx.client, &mut outcome.backups, now).await {
            Ok(Some(next_backup)) => after = after.min(next_backup),
            Ok(None) => {}
            Err(e) => {
                warn!(error = %e, "could not keep the backup schedule this time");
                after = after.min(Duration::from_secs(10));
            }
        }
    }

    let status = status::build(&cluster, &names, &facts, &children, &etcd, &outcome, now);
    // Told when the status starts saying it (it says it only while nothing graver is said).
    let says_stuck = |conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]| {
        conditions.iter().any(|c| c.reason == status::MEMBER_POD_STUCK)
    };
    if let Some(stuck) = &outcome.problems.stuck_pod
        && says_stuck(&status.conditions)
        && !says_stuck(&previous.conditions)
    {
        later.push(Announcement::warning(
            status::MEMBER_POD_STUCK,
            format!("{}: {}", stuck.reason, stuck.message),
        ));
    }
    ctx.core.metrics.set_etcd_cluster(
        &names.namespace,
        &names.cluster,
        i64::from(status.ready_members),
        outcome.problems.quorum_lost.is_some(),
    );
    if cluster.status.as_ref() != Some(&status) {
        // The status carries the operation in progress: it is written only over the version
        // this pass read, so a pass that read a stale copy cannot undo a newer step.
        let body = json!({
            "apiVersion": "noops.dev/v1alpha1",
            "kind": "EtcdCluster",
            "metadata": { "resourceVersion": cluster.resource_version() },
            "status": status,
        });
        let clusters: Api<EtcdCluster> = Api::namespaced(ctx.client.clone(), &names.namespace);
        match apply_status(&clusters, &cluster.name_any(), &body).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                debug!("the cluster changed since this pass read it; looking again");
                return Ok(Action::requeue(NEXT_STEP));
            }
            Err(e) => return Err(Error::from(e)).during(Stage::Status),
        }
    }
    if !later.is_empty() {
        crash::point("status written, its Events not yet told");
    }
    for announcement in later {
        ctx.core.events.tell(&cluster.object_ref(&()), announcement).await;
    }
    if recovery_request_used {
        let api: Api<EtcdCluster> = Api::namespaced(ctx.client.clone(), &names.namespace);
        let drop = json!({ "metadata": { "annotations": { RECOVER_ANNOTATION: null } } });
        if let Err(e) = api
            .patch(&names.cluster, &PatchParams::default(), &Patch::Merge(&drop))
            .await
        {
            warn!(error = %e, "could not remove the recovery request annotation");
        }
    }
    Ok(Action::requeue(after))
}

/// A reference to a member's Pod (which may not exist yet, or any more), so that Events about
/// different members are not folded into one series.
fn member_reference(cluster: &EtcdCluster, member: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(member.into()),
        namespace: cluster.metadata.namespace.clone(),
        ..Default::default()
    }
}

fn has_condition_reason(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    reason: &str,
) -> bool {
    conditions.iter().any(|c| c.reason == reason && c.status == "True")
}

/// Makes sure the children every cluster has exist as they should: the CA (created once,
/// never replaced), the leaf certificates (issued again when due), the two Services, and the
/// state ConfigMap (created once; only the bootstrap steps change it).
async fn ensure_fixed_children(
    cluster: &EtcdCluster,
    names: &Names,
    children: &Children,
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    ctx: &Context,
    now: jiff::Timestamp,
) -> Result<()> {
    let ns = &names.namespace;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    // With the user's own certificates there is nothing to issue (validation checks them).
    if names.tls && names.user_secrets.is_none() {
        let ca = match children.secrets.get(&names.ca_secret()) {
            Some(secret) => tls::ca_of(secret).map_err(|e| Error::InvalidSpec(e.to_string()))?,
            None => {
                let ca = tls::new_ca(names, now).map_err(|e| Error::InvalidSpec(e.to_string()))?;
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
            if tls::needs_issuing(
                children.secrets.get(&leaf.secret(names)).map(|s| s.as_ref()),
                now,
                lifetime,
            ) {
                let issued =
                    tls::issue(&ca, names, leaf, now, lifetime).map_err(|e| Error::InvalidSpec(e.to_string()))?;
                let secret = tls::leaf_secret(&issued, &ca, names, leaf, owner);
                apply(&secrets, &leaf.secret(names), &secret).await?;
                info!(secret = leaf.secret(names), not_after = %issued.not_after, "issued a certificate");
            }
        }
    }
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
    if !children.config_maps.contains_key(&names.state_config_map()) {
        let bootstrapped = cluster.status.as_ref().is_some_and(|s| s.cluster_id.is_some());
        let config_map = bootstrap::state_config_map(names, owner, !bootstrapped);
        let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
        create_if_missing(&api, &config_map).await?;
    }
    Ok(())
}

/// Takes membership steps.
struct Runner<'a> {
    cluster: &'a EtcdCluster,
    names: &'a Names,
    owner: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    children: &'a Children,
    etcd: &'a EtcdView,
    access: EtcdAccess,
    ctx: &'a Context,
    /// The version members are to run, when changing to it is allowed.
    upgrade_to: Option<String>,
    /// The backup a new cluster starts from.
    restore_from: Option<EtcdBackup>,
    /// The time of this pass.
    now: jiff::Timestamp,
}

impl Runner<'_> {
    /// Endpoints of the voting members that answered (a learner refuses membership calls).
    fn answering(&self) -> Vec<String> {
        observe::voter_endpoints(self.etcd, self.children, self.names)
    }

    fn member_of_id(&self, id: u64) -> Option<String> {
        self.etcd
            .listed
            .iter()
            .flatten()
            .find(|m| m.id == id)
            .and_then(|m| observe::listed_name(m, self.names))
    }

    /// Logs and publishes `announcement` about the cluster.
    async fn tell(&self, announcement: Announcement) {
        self.ctx
            .core
            .events
            .tell(&self.cluster.object_ref(&()), announcement)
            .await;
    }

    /// A member's Pod, as the object an Event concerns too.
    fn member_ref(&self, member: &str) -> ObjectReference {
        member_reference(self.cluster, member)
    }

    /// Makes a membership call; `None` when etcd answers "not now" (a learner not yet in sync,
    /// a member that joined a moment ago), which is expected and tried again shortly.
    async fn membership_call<T>(&self, call: impl Future<Output = Result<T, EtcdError>>) -> Result<Option<T>> {
        match call.await {
            Ok(value) => Ok(Some(value)),
            Err(e) if e.not_now() => {
                debug!(reason = %e, "etcd is not ready for the change; trying again shortly");
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The version `member` starts on. A new member (a learner, or the first member) joins
    /// on the version the members run, as their equal (the spec's for a new cluster); a member
    /// that starts again (being upgraded, or whose pod vanished) starts on the version asked
    /// for when a change to it is allowed, so that one already upgraded never goes back.
    fn version(&self, member: &str, operation: Option<&Operation>) -> String {
        let joining = operation.is_some_and(|op| {
            op.member == member && matches!(op.kind, OperationKind::AddMember | OperationKind::Bootstrap)
        });
        let running = || {
            self.cluster
                .status
                .as_ref()
                .and_then(|s| s.current_version.clone())
                .unwrap_or_else(|| self.cluster.spec.version.clone())
        };
        match &self.upgrade_to {
            Some(version) if !joining => version.clone(),
            _ => running(),
        }
    }

    /// The version a member whose pod is gone starts again on: the one it last said it ran, so
    /// that a restart neither upgrades it out of turn nor takes it back; the usual choice for a
    /// member that never said.
    fn restart_version(&self, member: &str) -> String {
        self.cluster
            .status
            .as_ref()
            .and_then(|s| s.members.iter().find(|m| m.name == member)?.version.clone())
            .unwrap_or_else(|| self.version(member, None))
    }

    async fn set_state(&self, bootstrapping: bool) -> Result<()> {
        let api: Api<ConfigMap> = Api::namespaced(self.ctx.client.clone(), &self.names.namespace);
        let config_map = bootstrap::state_config_map(self.names, self.owner, bootstrapping);
        apply(&api, &self.names.state_config_map(), &config_map).await?;
        Ok(())
    }

    /// Creates the volume (if the cluster keeps data) and the pod of `member`; either may exist.
    /// Creates `member`'s volume if it has none (and is not ephemeral).
    async fn create_volume(&self, member: &str) -> Result<()> {
        if let Some(pvc) = volume::member_volume(self.cluster, self.names, member, self.owner)
            && !self.children.volumes.contains_key(member)
        {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(self.ctx.client.clone(), &self.names.namespace);
            create_if_missing(&api, &pvc).await?;
        }
        Ok(())
    }

    async fn start_member(&self, member: &str, version: &str, initial_cluster: &[(String, String)]) -> Result<()> {
        let ns = &self.names.namespace;
        self.create_volume(member).await?;
        if !self.children.pods.contains_key(member) {
            let pod = pod::member_pod(self.cluster, self.names, member, version, initial_cluster, self.owner);
            let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), ns);
            if create_if_missing(&api, &pod).await? {
                info!(member, "started a member pod");
            }
        }
        Ok(())
    }

    /// The members etcd lists, with `member` among them, as (name, peer URL).
    fn initial_cluster(&self, member: &str) -> Vec<(String, String)> {
        let mut list: Vec<(String, String)> = self
            .etcd
            .listed
            .iter()
            .flatten()
            .filter_map(|m| Some((observe::listed_name(m, self.names)?, m.peer_urls.first()?.clone())))
            .collect();
        if !list.iter().any(|(n, _)| n == member) {
            list.push((member.to_string(), self.names.peer_url(member)));
        }
        list.sort();
        list
    }

    /// Takes `step`, recording what it changes in `outcome`; returns when to come back.
    /// Announcements that only hold once the status is written go to `later`.
    async fn take(&self, step: Step, outcome: &mut Outcome, later: &mut Vec<Announcement>) -> Result<Duration> {
        match step {
            Step::Begin(op) => {
                if op.member == self.names.member(outcome.next_member_index) {
                    outcome.next_member_index += 1;
                }
                let (reason, note) = match op.kind {
                    OperationKind::Bootstrap => ("Bootstrapping", format!("{} starts a new cluster", op.member)),
                    OperationKind::AddMember => ("AddingMember", format!("adding {} ({})", op.member, op.reason)),
                    OperationKind::RemoveMember => {
                        ("RemovingMember", format!("removing {} ({})", op.member, op.reason))
                    }
                    OperationKind::Upgrade => (
                        "UpgradingMember",
                        format!("restarting {} on {}", op.member, op.version.as_deref().unwrap_or("?")),
                    ),
                };
                later.push(Announcement::normal(reason, note).related(self.member_ref(&op.member)));
                outcome.operation = Some(op);
                Ok(NEXT_STEP)
            }
            Step::StartFirstMember { member } => {
                self.set_state(true).await?;
                let me = vec![(member.clone(), self.names.peer_url(&member))];
                let version = self.version(&member, outcome.operation.as_ref());
                self.start_member(&member, &version, &me).await?;
                crash::point("bootstrap: first member started");
                Ok(NEXT_STEP)
            }
            Step::RestoreFirstMember { member } => {
                let Some(backup) = self.restore_from.as_ref() else {
                    return Ok(NEXT_STEP);
                };
                let version = self.version(&member, outcome.operation.as_ref());
                let Some(pod) = restore::restore_pod(
                    self.cluster,
                    self.names,
                    &member,
                    &version,
                    backup,
                    &self.ctx.image,
                    self.owner,
                ) else {
                    return Ok(NEXT_STEP);
                };
                self.set_state(true).await?;
                self.create_volume(&member).await?;
                crash::point("restore: volume made, restore pod not yet");
                let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.names.namespace);
                create_if_missing(&pods, &pod).await?;
                crash::point("restore: restore pod made");
                // Told now: the pod is made, whatever becomes of this pass's status.
                let note = format!("restoring EtcdBackup {} into {member}", backup.name_any());
                self.tell(Announcement::normal("Restoring", note).related(self.member_ref(&member)))
                    .await;
                Ok(NEXT_STEP)
            }
            Step::RestoreBlocked { reason, message } => {
                let before = self
                    .cluster
                    .status
                    .as_ref()
                    .is_some_and(|s| has_condition_reason(&s.conditions, reason));
                if !before {
                    later.push(Announcement::warning(reason, message.clone()));
                }
                outcome.problems.restore_blocked = Some((reason, message));
                Ok(Duration::from_secs(5))
            }
            Step::RecoverFromBackup { backup } => {
                // Only recorded here: the members' pods and volumes are deleted by the
                // bootstrap that follows, once the status says it is a recovery.
                let member = self.names.member(outcome.next_member_index);
                outcome.next_member_index += 1;
                outcome.cluster_id = None;
                outcome.restored_from = Some(backup.clone());
                outcome.problems.quorum_lost = None;
                outcome.operation = Some(Operation {
                    kind: OperationKind::Bootstrap,
                    member: member.clone(),
                    member_id: None,
                    reason: format!("recovery from EtcdBackup {backup}"),
                    version: None,
                    started_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(self.now),
                });
                later.push(Announcement::warning(
                    "RecoveringFromBackup",
                    format!(
                        "the quorum is lost and {RECOVER_ANNOTATION} asks for it: the members and their volumes are deleted, and the cluster starts again from EtcdBackup {backup} under a new cluster ID, first member {member}; writes made after that backup are lost"
                    ),
                ));
                Ok(NEXT_STEP)
            }
            Step::FinishBootstrap { member } => {
                let Some(health) = self.etcd.health.get(&member) else {
                    return Ok(NEXT_STEP);
                };
                if let Some(backup) = &self.restore_from {
                    // The restore pod has done its work: the member runs on what it restored.
                    let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.names.namespace);
                    delete_if_present(&pods, &restore::pod_name(&member), &DeleteParams::default()).await?;
                    crash::point("restore: restore pod deleted, cluster ID not recorded");
                    let revision = backup.status.as_ref().and_then(|s| s.revision).unwrap_or_default();
                    later.push(
                        Announcement::normal(
                            "Restored",
                            format!(
                                "{member} started cluster {:x} from EtcdBackup {} (revision {revision})",
                                health.cluster_id,
                                backup.name_any()
                            ),
                        )
                        .related(self.member_ref(&member)),
                    );
                }
                self.set_state(false).await?;
                crash::point("bootstrap: state set to existing, cluster ID not recorded");
                outcome.cluster_id = Some(format!("{:x}", health.cluster_id));
                outcome.operation = None;
                later.push(
                    Announcement::normal(
                        "Bootstrapped",
                        format!("{member} started cluster {:x}", health.cluster_id),
                    )
                    .related(self.member_ref(&member)),
                );
                Ok(NEXT_STEP)
            }
            Step::AddLearner { member } => {
                let (voters, url) = (self.answering(), self.names.peer_url(&member));
                let Some(id) = self.membership_call(self.access.add_learner(&voters, &url)).await? else {
                    return Ok(NOT_NOW_RETRY);
                };
                info!(member, id = %format!("{id:x}"), "added a learner to etcd");
                crash::point("add: learner added to etcd, its ID not recorded");
                if let Some(op) = outcome.operation.as_mut() {
                    op.member_id = Some(format!("{id:x}"));
                }
                Ok(NEXT_STEP)
            }
            Step::StartMember { member } => {
                let initial = self.initial_cluster(&member);
                let version = self.version(&member, outcome.operation.as_ref());
                self.start_member(&member, &version, &initial).await?;
                crash::point("add: learner's pod made");
                Ok(NEXT_STEP)
            }
            Step::RestartMembers { members } => {
                let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.names.namespace);
                let claims: Api<PersistentVolumeClaim> =
                    Api::namespaced(self.ctx.client.clone(), &self.names.namespace);
                let quorum_lost = self
                    .cluster
                    .status
                    .as_ref()
                    .is_some_and(|s| has_condition_reason(&s.conditions, "QuorumLost"));
                for member in &members {
                    // Read afresh: a claim deleted with its pod may reach the cache after the
                    // pod's deletion, and a pod made on a claim being deleted would hold it.
                    let claim = claims.get_opt(&self.names.volume(member)).await?;
                    if claim.is_none_or(|c| c.metadata.deletion_timestamp.is_some()) {
                        debug!(member, "its volume is going: not started again");
                        continue;
                    }
                    // Its own name only: a member with data ignores the list, and one whose data
                    // is gone finds no peer to join through and stops, rather than rejoining
                    // empty under an identity that may have voted.
                    let me = vec![(member.clone(), self.names.peer_url(member))];
                    let version = self.restart_version(member);
                    let pod = pod::member_pod(self.cluster, self.names, member, &version, &me, self.owner);
                    if !create_if_missing(&pods, &pod).await? {
                        continue;
                    }
                    let note = format!(
                        "{member} started again on its own volume, as the member it was (etcd {version}), since its pod was gone ({})",
                        if quorum_lost {
                            "the quorum is lost, and comes back once a majority runs"
                        } else {
                            "no membership change is needed"
                        }
                    );
                    // Told now: the pod is made, whatever becomes of this pass's status.
                    self.tell(Announcement::normal(status::RESTARTING_MEMBERS, note).related(self.member_ref(member)))
                        .await;
                    crash::point("restart: a member's pod made again");
                }
                Ok(NEXT_STEP)
            }
            Step::Promote { member, id } => {
                if self
                    .membership_call(self.access.promote(&self.answering(), id))
                    .await?
                    .is_none()
                {
                    return Ok(NOT_NOW_RETRY);
                }
                info!(member, "promoted a learner to a voting member");
                crash::point("add: learner promoted, not recorded");
                self.tell(
                    Announcement::normal("Promoted", format!("{member} caught up and votes"))
                        .related(self.member_ref(&member)),
                )
                .await;
                Ok(NEXT_STEP)
            }
            Step::GiveUp { member, id, reason } => {
                if let Some(id) = id
                    && self
                        .membership_call(self.access.remove(&self.answering(), id))
                        .await?
                        .is_none()
                {
                    return Ok(NOT_NOW_RETRY);
                }
                later.push(
                    Announcement::warning(
                        "LearnerGivenUp",
                        format!("{reason}; removed it, a new member will be added"),
                    )
                    .related(self.member_ref(&member)),
                );
                outcome.operation = None;
                Ok(NEXT_STEP)
            }
            Step::Abandon { member, reason } => {
                later.push(Announcement::warning("OperationAbandoned", reason).related(self.member_ref(&member)));
                outcome.operation = None;
                Ok(NEXT_STEP)
            }
            Step::Defragment { member } => {
                let Some(endpoint) = self
                    .children
                    .pods
                    .get(&member)
                    .and_then(|p| observe::pod_endpoint(p, self.names))
                else {
                    return Ok(Duration::from_secs(1));
                };
                let before = self.etcd.health.get(&member).map(|h| (h.db_size, h.db_size_in_use));
                if self.membership_call(self.access.defragment(&endpoint)).await?.is_none() {
                    return Ok(NOT_NOW_RETRY);
                }
                let after = self.access.health(&endpoint).await.ok().map(|h| h.db_size);
                outcome.defragmented = Some(member.clone());
                let (size, in_use) = before.unwrap_or_default();
                let note = format!(
                    "defragmented {member}: its database file went from {size} to {} bytes ({in_use} in use)",
                    after.map_or_else(|| "?".to_string(), |a| a.to_string())
                );
                crash::point("defragment: member defragmented, not recorded");
                self.tell(Announcement::normal("Defragmented", note).related(self.member_ref(&member)))
                    .await;
                Ok(NEXT_STEP)
            }
            Step::MoveLeader { from, to } => {
                let leader = self.member_of_id(from);
                let endpoint = leader
                    .as_ref()
                    .and_then(|m| observe::pod_endpoint(self.children.pods.get(m)?, self.names));
                let Some(endpoint) = endpoint else {
                    return Ok(Duration::from_secs(1));
                };
                if self
                    .membership_call(self.access.move_leader(&endpoint, to))
                    .await?
                    .is_none()
                {
                    return Ok(NOT_NOW_RETRY);
                }
                let to_name = self.member_of_id(to).unwrap_or_else(|| format!("{to:x}"));
                info!(from = ?leader, to = %to_name, "moved leadership before removing the leader");
                crash::point("remove: leadership moved away");
                self.tell(
                    Announcement::normal("LeaderMoved", format!("leadership moved to {to_name}"))
                        .related(self.member_ref(&to_name)),
                )
                .await;
                Ok(NEXT_STEP)
            }
            Step::RemoveFromEtcd { member, id } => {
                if self
                    .membership_call(self.access.remove(&self.answering(), id))
                    .await?
                    .is_none()
                {
                    return Ok(NOT_NOW_RETRY);
                }
                info!(member, "removed a member from etcd");
                crash::point("remove: member removed from etcd, not recorded");
                self.tell(
                    Announcement::normal("MemberRemoved", format!("{member} is no longer a member"))
                        .related(self.member_ref(&member)),
                )
                .await;
                Ok(NEXT_STEP)
            }
            Step::DeleteMember { member, force } => {
                let ns = &self.names.namespace;
                let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), ns);
                let params = if force {
                    DeleteParams {
                        grace_period_seconds: Some(0),
                        ..Default::default()
                    }
                } else {
                    DeleteParams::default()
                };
                let volumes: Api<PersistentVolumeClaim> = Api::namespaced(self.ctx.client.clone(), ns);
                delete_if_present(&pods, &member, &params).await?;
                crash::point("remove: pod deleted, volume not yet");
                delete_if_present(&volumes, &self.names.volume(&member), &DeleteParams::default()).await?;
                crash::point("remove: pod and volume deleted");
                info!(member, force, "deleted the pod and volume of a former member");
                if force {
                    self.tell(Announcement::normal("ForceDeletedPod", format!(
                            "{member} is no longer an etcd member, and its node did not stop its pod {}s past the grace period: deleted it without waiting for the node",
                            observe::STUCK_AFTER.as_secs()
                        )).related(self.member_ref(&member)))
                    .await;
                }
                Ok(NEXT_STEP)
            }
            Step::VersionUnavailable { member, version } => {
                let recorded = self
                    .cluster
                    .status
                    .as_ref()
                    .and_then(|s| s.unavailable_version.as_deref());
                if recorded != Some(version.as_str()) {
                    // Recorded first: from the next pass on the version is refused, so the pod
                    // deleted then comes back on the version the member ran.
                    outcome.unavailable_version = Some(version.clone());
                    warn!(
                        member,
                        version, "the image of the new version cannot be pulled: going back"
                    );
                    later.push(
                        Announcement::warning(
                            "UpgradeReverted",
                            format!("the image of etcd {version} cannot be pulled for {member}; {member} starts again on the version it ran, and {version} is refused until spec.version names another"),
                        )
                        .related(self.member_ref(&member)),
                    );
                    return Ok(NEXT_STEP);
                }
                let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.names.namespace);
                if delete_if_present(&pods, &member, &DeleteParams::default()).await? {
                    info!(
                        member,
                        version,
                        "stopped the member whose new image cannot be pulled, to start it on the version it ran"
                    );
                    crash::point("upgrade: member with an unavailable image stopped");
                }
                Ok(NEXT_STEP)
            }
            Step::RestartMember { member } => {
                let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.names.namespace);
                if delete_if_present(&pods, &member, &DeleteParams::default()).await? {
                    info!(member, "stopped a member to start it on another version");
                    crash::point("upgrade: member stopped for its restart");
                }
                Ok(NEXT_STEP)
            }
            Step::CheckUpgraded { member } => {
                let endpoint = self
                    .children
                    .pods
                    .get(&member)
                    .and_then(|p| observe::pod_endpoint(p, self.names));
                let Some(endpoint) = endpoint else {
                    return Ok(Duration::from_secs(1));
                };
                // Health said it has a leader; a linearizable read says it serves clients.
                if let Err(e) = self.access.read_through(&endpoint).await {
                    debug!(member, error = %e, "the read check failed; trying again shortly");
                    return Ok(Duration::from_secs(1));
                }
                Box::pin(self.take(Step::Finish, outcome, later)).await
            }
            Step::Finish => {
                if let Some(op) = outcome.operation.take() {
                    let (reason, note) = match op.kind {
                        OperationKind::Bootstrap => ("Bootstrapped", format!("{} started the cluster", op.member)),
                        OperationKind::AddMember => ("MemberAdded", format!("{} joined ({})", op.member, op.reason)),
                        OperationKind::RemoveMember => ("MemberGone", format!("{} is gone ({})", op.member, op.reason)),
                        OperationKind::Upgrade if op.version.is_some() && op.version == outcome.unavailable_version => {
                            (
                                "MemberReverted",
                                format!(
                                    "{} runs the version it ran before again: the image of {} cannot be pulled",
                                    op.member,
                                    op.version.as_deref().unwrap_or_default()
                                ),
                            )
                        }
                        OperationKind::Upgrade => (
                            "MemberUpgraded",
                            format!(
                                "upgraded {} to {}",
                                op.member,
                                op.version.as_deref().unwrap_or("the new version")
                            ),
                        ),
                    };
                    later.push(Announcement::normal(reason, note).related(self.member_ref(&op.member)));
                    crash::point(match op.kind {
                        OperationKind::Bootstrap => "finish: bootstrap done, not recorded",
                        OperationKind::AddMember => "finish: add done, not recorded",
                        OperationKind::RemoveMember => "finish: removal done, not recorded",
                        OperationKind::Upgrade => "finish: upgrade of a member done, not recorded",
                    });
                }
                Ok(NEXT_STEP)
            }
            Step::Wait { .. } => Ok(if outcome.operation.is_some() {
                Duration::from_secs(1)
            } else {
                LOOK_AGAIN
            }),
            Step::QuorumLost { reason } => {
                let before = self
                    .cluster
                    .status
                    .as_ref()
                    .is_some_and(|s| has_condition_reason(&s.conditions, "QuorumLost"));
                if !before {
                    later.push(Announcement::warning("QuorumLost", reason.clone()));
                }
                outcome.problems.quorum_lost = Some(reason);
                Ok(LOOK_AGAIN)
            }
        }
    }
}

/// The backup a recovery asks for (`latest`: the newest successful backup of this cluster, by
/// its etcd cluster ID), if it can be restored; otherwise why not.
async fn recovery_backup(
    cluster: &EtcdCluster,
    names: &Names,
    asked: &str,
    ctx: &Context,
) -> Result<std::result::Result<String, String>> {
    let api: Api<EtcdBackup> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let backup = if asked == "latest" {
        let cluster_id = cluster.status.as_ref().and_then(|s| s.cluster_id.clone());
        api.list(&kube::api::ListParams::default())
            .await
            .during(Stage::Observe)?
            .items
            .into_iter()
            .filter(|b| b.spec.cluster == names.cluster)
            .filter(|b| {
                let status = b.status.clone().unwrap_or_default();
                status.phase.as_deref() == Some("Succeeded")
                    && status.cluster_id.is_some()
                    && status.cluster_id == cluster_id
            })
            .max_by_key(|b| b.status.as_ref().and_then(|s| s.completed_at.as_ref()).map(|t| t.0))
    } else {
        api.get_opt(asked).await.during(Stage::Observe)?
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
