//! The stage of a pass that moves instances apart (`spread.rs`): a replica that shares its node
//! while another node could take it has its pod and volume deleted, so that the StatefulSet
//! makes it again, where it prefers, and it copies the primary anew.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::DeleteParams;
use noops_api::postgres::MemberStatus;
use tracing::info;

use super::primacy::{Primacy, requested};
use super::{Observed, Pass};
use crate::core::apply::delete_if_present;
use crate::core::events::Announcement;
use crate::core::nodes::{admitted_selector, could_hold};
use crate::core::{DuringStage, Result, Stage, crash};
use crate::postgres::replication;
use crate::postgres::spread::{self, SETTLE, Spread};

impl Pass<'_> {
    /// Where the instances are, and which nodes could hold one (the instance pods' admitted
    /// node selector met).
    pub(super) fn spread(&self, observed: &Observed, members: &[MemberStatus]) -> Spread {
        let pods = replication::instance_pods(&self.names, &observed.children.pods);
        let selector = admitted_selector(pods.into_values());
        let eligible: BTreeSet<String> = self
            .ctx
            .caches
            .nodes
            .state()
            .iter()
            .filter(|n| could_hold(n, &[], None, &selector))
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        Spread::of(members, eligible)
    }

    /// Whether one streaming replica can be spared while it is copied anew.
    pub(super) fn replicas_spare(&self, members: &[MemberStatus]) -> bool {
        spread::replicas_spare(members, self.pg.spec.synchronous.as_ref().map(|s| s.number))
    }

    /// Makes one replica anew where it runs apart from the others, when `spread` says one
    /// could and nothing else moves this pass (`busy`: a rollout, a failover, a switchover, a
    /// user's request, a paused database).
    pub(super) async fn move_apart(
        &self,
        observed: &Observed,
        members: &[MemberStatus],
        spread: &Spread,
        busy: bool,
        primacy: &mut Primacy,
    ) -> Result<()> {
        if busy
            || self.pg.spec.paused
            || primacy.failover.is_some()
            || primacy.switching
            || requested(self.pg).is_some()
        {
            return Ok(());
        }
        let pods = replication::instance_pods(&self.names, &observed.children.pods);
        // A move begun by a pass that ended between its two deletions is finished first: the
        // claim going is its record, and a replica left running on it would lose its volume
        // whenever its pod next restarts.
        let claims = self.api::<PersistentVolumeClaim>();
        for (name, pod) in &pods {
            let claim = self.names.data_claim_of(name);
            let claim_going = self
                .ctx
                .caches
                .claims
                .get(&kube::runtime::reflector::ObjectRef::new(&claim).within(&self.names.namespace))
                .is_some_and(|c| c.metadata.deletion_timestamp.is_some());
            if claim_going && *name != primacy.primary && pod.metadata.deletion_timestamp.is_none() {
                delete_if_present(&self.api::<Pod>(), name, &DeleteParams::default())
                    .await
                    .during(Stage::Apply)?;
                info!(replica = %name, "finished making a replica anew: its volume was already going");
                return Ok(());
            }
        }
        // Every instance the spec asks for is there (a scale under way is not a time to move).
        let instances = usize::try_from(self.pg.spec.instances).unwrap_or_default();
        if pods.len() != instances || members.len() != instances {
            return Ok(());
        }
        let settled = pods.values().all(|p| {
            p.metadata
                .creation_timestamp
                .as_ref()
                .is_some_and(|made| Duration::try_from(self.now.duration_since(made.0)).unwrap_or_default() >= SETTLE)
        });
        let Some((replica, from, to)) = spread.replica_to_move(settled, self.replicas_spare(members)) else {
            return Ok(());
        };
        delete_if_present(&claims, &self.names.data_claim_of(&replica), &DeleteParams::default())
            .await
            .during(Stage::Apply)?;
        crash::point("postgres apart: volume deleted, pod not yet");
        delete_if_present(&self.api::<Pod>(), &replica, &DeleteParams::default())
            .await
            .during(Stage::Apply)?;
        info!(%replica, %from, %to, "made a replica anew: it shared its node with another instance while another node could take it");
        primacy.told.push(Announcement::normal(
            "InstanceMoved",
            format!(
                "deleted replica {replica}'s pod and volume on node {from}, which it shared with another instance: it is made again where it runs apart (node {to} holds none) and copies the primary anew"
            ),
        ));
        Ok(())
    }
}
