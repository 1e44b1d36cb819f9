//! The rolling stage of a pass: an outdated pod that cannot start is replaced, a primary whose
//! node is drained steps down (`drain.rs`), and a change of the instances' pod is carried out
//! by `rollout.rs`'s next step (a replica restarted, or the switchover that ends it).

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Preconditions};
use noops_api::postgres::MemberStatus;
use tracing::{debug, info};

use super::primacy::{Asker, Primacy, requested};
use super::{Observed, Pass};
use crate::core::events::Announcement;
use crate::core::rollout::statefulset_update_revision;
use crate::core::stuck::stuck;
use crate::core::{DuringStage, Result, Stage, crash};
use crate::postgres::drain::{self, Drain};
use crate::postgres::rollout::{self, Instances, Step};
use crate::postgres::{replication, statefulset};

impl Pass<'_> {
    /// Carries a rolling change one step on, unless something else moves the primary this
    /// pass (a failover, a switchover, a user's request) or the database is paused. Returns
    /// whether a change is rolling out (the pass looks again soon).
    pub(super) async fn roll(
        &self,
        observed: &Observed,
        members: &[MemberStatus],
        primacy: &mut Primacy,
    ) -> Result<bool> {
        let children = &observed.children;
        if self.pg.spec.paused {
            return Ok(false);
        }
        let revision = children.statefulset.as_deref().and_then(statefulset_update_revision);
        let pods = replication::instance_pods(&self.names, &children.pods);
        let stuck: BTreeSet<String> = pods
            .iter()
            .filter(|(_, pod)| stuck([**pod], self.now).is_some())
            .map(|(name, _)| name.clone())
            .collect();
        // A pod that cannot start moves nothing: replaced even while the primary moves.
        if let Some(revision) = revision
            && let Some(pod) = rollout::stuck_outdated(revision, &pods, &stuck)
        {
            let why = format!("{pod}, which cannot start, on the new revision");
            self.restart_step(&pods, (&pod, &why), revision, primacy).await?;
            return Ok(true);
        }
        let busy = primacy.switching
            || primacy.failover.is_some()
            || primacy.no_replica.is_some()
            || requested(self.pg).is_some();
        if busy {
            return Ok(false);
        }
        match drain::primary_drain(&self.names, &primacy.primary, members, &children.cordoned) {
            Drain::Stay => {}
            Drain::StepDownFor { node, to } => {
                self.ask_switchover(children, &to, &Asker::Drain { node }, primacy)
                    .await?;
                return Ok(true);
            }
            Drain::Held { node, why } => {
                debug!(%node, %why, "the primary's node is being drained and the primary stays: its budget holds the drain");
                return Ok(true);
            }
        }
        let Some(revision) = revision else {
            return Ok(false);
        };
        let instances = Instances {
            pods: &pods,
            members,
            stuck: &stuck,
            primary: &primacy.primary,
            wanted: statefulset::pods_kept(self.pg, &self.names, &primacy.primary),
        };
        match rollout::next(&self.names, revision, &instances) {
            Step::Done => Ok(false),
            Step::Wait(why) => {
                debug!(%why, "a rolling change waits");
                Ok(true)
            }
            Step::Restart { pod, why } => {
                if let Some(why) = rollout::settling_after_handover(children.lease.as_deref(), self.now) {
                    debug!(%why, "a rolling change waits");
                    return Ok(true);
                }
                self.restart_step(&pods, (&pod, &why), revision, primacy).await?;
                Ok(true)
            }
            Step::SwitchOver { to } => {
                self.ask_switchover(children, &to, &Asker::Rollout, primacy).await?;
                Ok(true)
            }
        }
    }

    /// Restarts instance `pod` of `pods` on `revision` (`why`), and says so.
    async fn restart_step(
        &self,
        pods: &std::collections::BTreeMap<String, &Pod>,
        (pod, why): (&str, &str),
        revision: &str,
        primacy: &mut Primacy,
    ) -> Result<()> {
        let Some(uid) = pods.get(pod).and_then(|p| p.metadata.uid.clone()) else {
            return Ok(());
        };
        if self.restart(pod, &uid, revision).await? {
            info!(%pod, %why, "restarted an instance on the StatefulSet's new revision");
            crash::point("postgres: instance restarted for a rolling change");
            primacy
                .told
                .push(Announcement::normal("RestartingInstance", format!("restarting {why}")));
        }
        Ok(())
    }

    /// Deletes instance `pod` (of uid `uid`, judged not to run `revision`) for the StatefulSet
    /// to make again: confirmed first against the StatefulSet as the API server has it (the
    /// cache may be behind a pod already made on a newer revision). Whether it was deleted.
    async fn restart(&self, pod: &str, uid: &str, revision: &str) -> Result<bool> {
        let statefulsets = self.api::<StatefulSet>();
        let sts = crate::core::confirm::read(&statefulsets, &self.names.statefulset(), "revision-before-restart")
            .await
            .during(Stage::Observe)?;
        if statefulset_update_revision(&sts) != Some(revision) {
            info!(%pod, "the StatefulSet moved on since the cache saw it: looking again");
            return Ok(false);
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.api::<Pod>().delete(pod, &params).await {
            Ok(_) => Ok(true),
            // Gone, or a new pod of that name already: the next pass looks again.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(false),
            Err(e) => Err(e).during(Stage::Apply),
        }
    }
}
