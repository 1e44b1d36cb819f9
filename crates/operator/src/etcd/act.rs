//! The act stage of an EtcdCluster pass: the membership step the planner chose
//! (`membership.rs`), carried out, one function per kind of step. Each records what it changed
//! in the pass's [`Outcome`] (written to the status after it) and says when to come back; an
//! Event that only holds once the status is written waits in `later`.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, PersistentVolumeClaim, Pod};
use kube::api::DeleteParams;
use kube::{Api, Resource, ResourceExt};
use noops_api::EtcdCluster;
use noops_api::etcd::EtcdClusterReason;
use noops_api::etcd::{Operation, OperationKind};
use noops_api::etcd_backup::EtcdBackup;
use tracing::{debug, info, warn};

use super::client::{EtcdAccess, EtcdError};
use super::context::Context;
use super::membership::Step;
use super::names::{Names, RECOVER_ANNOTATION};
use super::observe::{self, Children, EtcdView};
use super::status::{self, Outcome};
use super::{bootstrap, pod, restore, volume};
use crate::core::apply::{apply, create_if_missing, delete_if_present};
use crate::core::events::Announcement;
use crate::core::{Result, crash};

/// How often a settled cluster is looked at (member health is not something Kubernetes
/// watches).
pub(super) const LOOK_AGAIN: Duration = Duration::from_secs(10);
/// How soon the next step of a change is taken.
pub(super) const NEXT_STEP: Duration = Duration::from_millis(500);

/// A member's volume claim, as read from the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    Missing,
    /// Being deleted (its finalizer waits for the pod that mounts it).
    Going,
    Kept,
}
/// How soon a step etcd was not ready for is tried again.
const NOT_NOW_RETRY: Duration = Duration::from_secs(1);

/// Takes membership steps.
pub(super) struct Runner<'a> {
    pub(super) cluster: &'a EtcdCluster,
    pub(super) names: &'a Names,
    pub(super) owner: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    pub(super) children: &'a Children,
    pub(super) etcd: &'a EtcdView,
    pub(super) access: EtcdAccess,
    pub(super) ctx: &'a Context,
    /// The version members are to run, when changing to it is allowed.
    pub(super) upgrade_to: Option<String>,
    /// The backup a new cluster starts from.
    pub(super) restore_from: Option<EtcdBackup>,
    /// The time of this pass.
    pub(super) now: jiff::Timestamp,
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

    /// Creates `member`'s volume if it has none (and is not ephemeral). False while a volume of
    /// that name is still being deleted: a pod made now would be bound to the claim that goes,
    /// and wait for ever for a claim nobody makes again.
    async fn create_volume(&self, member: &str) -> Result<bool> {
        let Some(pvc) = volume::member_volume(self.cluster, self.names, member, self.owner) else {
            return Ok(true);
        };
        match self.claim_now(member).await? {
            Claim::Going => {
                debug!(
                    member,
                    "its former volume is still being deleted: no pod until a new one is made"
                );
                Ok(false)
            }
            Claim::Kept => Ok(true),
            Claim::Missing => {
                let api: Api<PersistentVolumeClaim> = Api::namespaced(self.ctx.client.clone(), &self.names.namespace);
                create_if_missing(&api, &pvc).await?;
                Ok(true)
            }
        }
    }

    /// `member`'s volume claim as the API server has it now (a confirmation before a pod is
    /// made on it): a claim deleted with its pod can reach the cache after the pod's deletion,
    /// as unchanged, and a pod made on a claim being deleted waits for it for ever.
    async fn claim_now(&self, member: &str) -> Result<Claim> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.ctx.client.clone(), &self.names.namespace);
        Ok(
            match crate::core::confirm::get(&api, &self.names.volume(member), "claim-before-pod").await? {
                None => Claim::Missing,
                Some(claim) if claim.metadata.deletion_timestamp.is_some() => Claim::Going,
                Some(_) => Claim::Kept,
            },
        )
    }

    /// Creates the volume (if the cluster keeps data) and the pod of `member`; either may exist.
    /// `node`: the node the pod must run on (a member added to spread the members).
    async fn make_member(
        &self,
        member: &str,
        version: &str,
        initial_cluster: &[(String, String)],
        node: Option<&str>,
    ) -> Result<()> {
        let ns = &self.names.namespace;
        let volume_ready = self.create_volume(member).await?;
        if volume_ready && !self.children.pods.contains_key(member) {
            let mut pod = pod::member_pod(
                self.cluster,
                self.names,
                member,
                version,
                initial_cluster,
                &self.ctx.images,
                self.owner,
            );
            if let Some(node) = node {
                pod::pin_to_node(&mut pod, node);
            }
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
    pub(super) async fn take(
        &self,
        step: Step,
        outcome: &mut Outcome,
        later: &mut Vec<Announcement>,
    ) -> Result<Duration> {
        match step {
            Step::Begin(op) => self.begin(op, outcome, later).await,
            Step::StartFirstMember { member } => self.start_first_member(member, outcome).await,
            Step::RestoreFirstMember { member } => self.restore_first_member(member, outcome).await,
            Step::RestoreBlocked { reason, message } => self.restore_blocked(reason, message, outcome, later).await,
            Step::RecoverFromBackup { backup } => self.recover_from_backup(backup, outcome, later).await,
            Step::FinishBootstrap { member } => self.finish_bootstrap(member, outcome, later).await,
            Step::StartOver { member } => self.start_over(member).await,
            Step::AddLearner { member } => self.add_learner(member, outcome).await,
            Step::StartMember { member } => self.start_member(member, outcome).await,
            Step::RestartMembers { members } => self.restart_members(members).await,
            Step::Promote { member, id } => self.promote(member, id).await,
            Step::GiveUp { member, id, reason } => self.give_up(member, id, reason, outcome, later).await,
            Step::Abandon { member, reason } => self.abandon(member, reason, outcome, later).await,
            Step::Defragment { member } => self.defragment(member, outcome).await,
            Step::MoveLeader { from, to } => self.move_leader(from, to).await,
            Step::RemoveFromEtcd { member, id } => self.remove_from_etcd(member, id).await,
            Step::DeleteMember { member, force } => self.delete_member(member, force).await,
            Step::VersionUnavailable { member, version } => {
                self.version_unavailable(member, version, outcome, later).await
            }
            Step::RestartMember { member } => self.restart_member(member).await,
            Step::CheckUpgraded { member } => self.check_upgraded(member, outcome, later).await,
            Step::Finish => self.finish(outcome, later).await,
            Step::Wait { .. } => Ok(if outcome.operation.is_some() {
                Duration::from_secs(1)
            } else {
                LOOK_AGAIN
            }),
            Step::QuorumLost { reason } => self.quorum_lost(reason, outcome, later).await,
        }
    }

    /// Takes [`Step::Begin`].
    async fn begin(&self, op: Operation, outcome: &mut Outcome, later: &mut Vec<Announcement>) -> Result<Duration> {
        if op.member == self.names.member(outcome.next_member_index) {
            outcome.next_member_index += 1;
        }
        let (reason, note) = match op.kind {
            OperationKind::Bootstrap => ("Bootstrapping", format!("{} starts a new cluster", op.member)),
            OperationKind::AddMember => ("AddingMember", format!("adding {} ({})", op.member, op.reason)),
            OperationKind::RemoveMember => ("RemovingMember", format!("removing {} ({})", op.member, op.reason)),
            OperationKind::Upgrade => (
                "UpgradingMember",
                format!("restarting {} on {}", op.member, op.version.as_deref().unwrap_or("?")),
            ),
        };
        later.push(Announcement::normal(reason, note).related(self.member_ref(&op.member)));
        outcome.operation = Some(op);
        Ok(NEXT_STEP)
    }

    /// Takes [`Step::StartFirstMember`].
    async fn start_first_member(&self, member: String, outcome: &mut Outcome) -> Result<Duration> {
        self.set_state(true).await?;
        let me = vec![(member.clone(), self.names.peer_url(&member))];
        let version = self.version(&member, outcome.operation.as_ref());
        self.make_member(&member, &version, &me, None).await?;
        crash::point("bootstrap: first member started");
        Ok(NEXT_STEP)
    }

    /// Takes [`Step::RestoreFirstMember`].
    async fn restore_first_member(&self, member: String, outcome: &mut Outcome) -> Result<Duration> {
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
            &self.ctx.images,
            self.owner,
        ) else {
            return Ok(NEXT_STEP);
        };
        self.set_state(true).await?;
        if !self.create_volume(&member).await? {
            return Ok(NEXT_STEP);
        }
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

    /// Takes [`Step::RestoreBlocked`].
    async fn restore_blocked(
        &self,
        reason: EtcdClusterReason,
        message: String,
        outcome: &mut Outcome,
        later: &mut Vec<Announcement>,
    ) -> Result<Duration> {
        let before = self
            .cluster
            .status
            .as_ref()
            .is_some_and(|s| status::has_reason(&s.conditions, reason.as_str()));
        if !before {
            later.push(Announcement::warning(reason, message.clone()));
        }
        outcome.problems.restore_blocked = Some((reason, message));
        Ok(Duration::from_secs(5))
    }

    /// Takes [`Step::RecoverFromBackup`].
    async fn recover_from_backup(
        &self,
        backup: String,
        outcome: &mut Outcome,
        later: &mut Vec<Announcement>,
    ) -> Result<Duration> {
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
            node: None,
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

    /// Takes [`Step::FinishBootstrap`].
    async fn finish_bootstrap(
        &self,
        member: String,
        outcome: &mut Outcome,
        later: &mut Vec<Announcement>,
    ) -> Result<Duration> {
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

    /// Takes [`Step::AddLearner`].
    async fn add_learner(&self, member: String, outcome: &mut Outcome) -> Result<Duration> {
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

    /// Takes [`Step::StartMember`].
    async fn start_member(&self, member: String, outcome: &mut Outcome) -> Result<Duration> {
        let initial = self.initial_cluster(&member);
        let version = self.version(&member, outcome.operation.as_ref());
        let node = outcome
            .operation
            .as_ref()
            .filter(|op| op.member == member)
            .and_then(|op| op.node.clone());
        self.make_member(&member, &version, &initial, node.as_deref()).await?;
        crash::point("add: learner's pod made");
        Ok(NEXT_STEP)
    }

    /// Takes [`Step::RestartMembers`].
    async fn restart_members(&self, members: Vec<String>) -> Result<Duration> {
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.names.namespace);
        let quorum_lost = self
            .cluster
            .status
            .as_ref()
            .is_some_and(|s| status::has_reason(&s.conditions, "QuorumLost"));
        for member in &members {
            if self.claim_now(member).await? != Claim::Kept {
                debug!(member, "its volume is going: not started again");
                continue;
            }
            // Its own name only: a member with data ignores the list, and one whose data
            // is gone finds no peer to join through and stops, rather than rejoining
            // empty under an identity that may have voted.
            let me = vec![(member.clone(), self.names.peer_url(member))];
            let version = self.restart_version(member);
            let pod = pod::member_pod(
                self.cluster,
                self.names,
                member,
                &version,
                &me,
                &self.ctx.images,
                self.owner,
            );
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

    /// Takes [`Step::Promote`].
    async fn promote(&self, member: String, id: u64) -> Result<Duration> {
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
            Announcement::normal("Promoted", format!("{member} caught up and votes")).related(self.member_ref(&member)),
        )
        .await;
        Ok(NEXT_STEP)
    }

    /// Takes [`Step::GiveUp`].
    async fn give_up(
        &self,
        member: String,
        id: Option<u64>,
        reason: String,
        outcome: &mut Outcome,
        later: &mut Vec<Announcement>,
    ) -> Result<Duration> {
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

    /// Takes [`Step::Abandon`].
    async fn abandon(
        &self,
        member: String,
        reason: String,
        outcome: &mut Outcome,
        later: &mut Vec<Announcement>,
    ) -> Result<Duration> {
        later.push(Announcement::warning("OperationAbandoned", reason).related(self.member_ref(&member)));
        outcome.operation = None;
        Ok(NEXT_STEP)
    }

    /// Takes [`Step::Defragment`].
    async fn defragment(&self, member: String, outcome: &mut Outcome) -> Result<Duration> {
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

    /// Takes [`Step::MoveLeader`].
    async fn move_leader(&self, from: u64, to: u64) -> Result<Duration> {
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

    /// Takes [`Step::RemoveFromEtcd`].
    async fn remove_from_etcd(&self, member: String, id: u64) -> Result<Duration> {
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

    /// Takes [`Step::StartOver`].
    async fn start_over(&self, member: String) -> Result<Duration> {
        self.delete_member(member.clone(), false).await?;
        warn!(
            member,
            "the first member committed nothing and names no leader: its start was cut short; starting it again on a new volume"
        );
        self.tell(
            Announcement::warning(
                "BootstrapRestarted",
                format!(
                    "{member} answered with nothing committed and no leader {}s after its pod was made: its first start was cut short (etcd then waits forever for members it never recorded); deleted its pod and volume to start it again (nothing was committed, nothing is lost)",
                    super::membership::EMPTY_START_PATIENCE.as_secs()
                ),
            )
            .related(self.member_ref(&member)),
        )
        .await;
        Ok(NEXT_STEP)
    }

    /// Takes [`Step::DeleteMember`].
    async fn delete_member(&self, member: String, force: bool) -> Result<Duration> {
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

    /// Takes [`Step::VersionUnavailable`].
    async fn version_unavailable(
        &self,
        member: String,
        version: String,
        outcome: &mut Outcome,
        later: &mut Vec<Announcement>,
    ) -> Result<Duration> {
        let status = self.cluster.status.as_ref();
        // A new repository (of the spec or of the operator's registry) without the image: the
        // member goes back to the repository the members ran, which is refused from then on.
        let ran = status.and_then(|s| s.image_repository.clone());
        if let Some(ran) = ran.filter(|ran| *ran != self.names.image_repository) {
            let asked = self.names.image_repository.clone();
            outcome.unavailable_repository = Some(asked.clone());
            warn!(member, repository = %asked, "the new repository has no image for the member: going back");
            later.push(
                Announcement::warning(
                    "UpgradeReverted",
                    format!("the image of etcd {version} cannot be pulled from {asked} for {member}; {member} starts again from {ran}, and {asked} is refused while it is the repository asked for"),
                )
                .related(self.member_ref(&member)),
            );
            // From the next pass on the members run from `ran` again: this member's pod is
            // outdated then, and the upgrade restarts it from there.
            return Ok(NEXT_STEP);
        }
        let recorded = status.and_then(|s| s.unavailable_version.as_deref());
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
                version, "stopped the member whose new image cannot be pulled, to start it on the version it ran"
            );
            crash::point("upgrade: member with an unavailable image stopped");
        }
        Ok(NEXT_STEP)
    }

    /// Takes [`Step::RestartMember`].
    async fn restart_member(&self, member: String) -> Result<Duration> {
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.names.namespace);
        if delete_if_present(&pods, &member, &DeleteParams::default()).await? {
            info!(member, "stopped a member to start it on another version");
            crash::point("upgrade: member stopped for its restart");
        }
        Ok(NEXT_STEP)
    }

    /// Takes [`Step::CheckUpgraded`].
    async fn check_upgraded(
        &self,
        member: String,
        outcome: &mut Outcome,
        later: &mut Vec<Announcement>,
    ) -> Result<Duration> {
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
        self.finish(outcome, later).await
    }

    /// Takes [`Step::Finish`].
    async fn finish(&self, outcome: &mut Outcome, later: &mut Vec<Announcement>) -> Result<Duration> {
        if let Some(op) = outcome.operation.take() {
            let (reason, note) = match op.kind {
                OperationKind::Bootstrap => ("Bootstrapped", format!("{} started the cluster", op.member)),
                OperationKind::AddMember => ("MemberAdded", format!("{} joined ({})", op.member, op.reason)),
                OperationKind::RemoveMember => ("MemberGone", format!("{} is gone ({})", op.member, op.reason)),
                OperationKind::Upgrade if op.version.is_some() && op.version == outcome.unavailable_version => (
                    "MemberReverted",
                    format!(
                        "{} runs the version it ran before again: the image of {} cannot be pulled",
                        op.member,
                        op.version.as_deref().unwrap_or_default()
                    ),
                ),
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

    /// Takes [`Step::QuorumLost`].
    async fn quorum_lost(
        &self,
        reason: String,
        outcome: &mut Outcome,
        later: &mut Vec<Announcement>,
    ) -> Result<Duration> {
        let before = self
            .cluster
            .status
            .as_ref()
            .is_some_and(|s| status::has_reason(&s.conditions, "QuorumLost"));
        if !before {
            later.push(Announcement::warning("QuorumLost", reason.clone()));
        }
        outcome.problems.quorum_lost = Some(reason);
        Ok(LOOK_AGAIN)
    }
}

/// A reference to a member's Pod (which may not exist yet, or any more), so that Events about
/// different members are not folded into one series.
pub(super) fn member_reference(cluster: &EtcdCluster, member: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(member.into()),
        namespace: cluster.metadata.namespace.clone(),
        ..Default::default()
    }
}
