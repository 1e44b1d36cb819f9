//! The lease stage of a pass: who the primary is, and the lease made, removed, handed over to
//! a replica when the primary is lost (`failover.rs`), or released and handed over for a
//! switchover a user asked for (`switchover.rs`).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use noops_api::PostgreSQL;
use noops_api::postgres::{FailoverStatus, PROMOTE_ANNOTATION};
use serde_json::json;
use tracing::{debug, info, warn};

use super::{ASK_REPLICA_WITHIN, Observed, Pass};
use crate::core::apply::{create_if_missing, delete_if_present};
use crate::core::events::Announcement;
use crate::core::{DuringStage, Result, Stage, crash};
use crate::postgres::names::Names;
use crate::postgres::sql::Instance;
use crate::postgres::switchover::{self, Next, Record, Stopped};
use crate::postgres::{account, failover, observe, replication, secrets, synchronous};

/// How long the checkpoint a primary makes before it steps down may take: one that takes
/// longer has too much to write for a clean step-down within its bound.
const CHECKPOINT_WITHIN: Duration = Duration::from_secs(10);
/// How many times a lease release for a switchover that met a renewal is made again at once.
const RELEASE_CONFLICTS: u32 = 3;

/// Who the primary is this pass, and what became of a primary lost or asked to step down.
pub(super) struct Primacy {
    pub primary: String,
    /// The lease handed over this pass.
    pub failover: Option<FailoverStatus>,
    /// Why a lost primary is not replaced: no replica can be promoted.
    pub no_replica: Option<String>,
    /// A switchover is under way: the pass looks again soon.
    pub switching: bool,
    /// How long the primary has not renewed its lease, once that is long enough that its
    /// server is not asked this pass (`failover::NOT_ASKED_AFTER`).
    pub silent_for: Option<Duration>,
    /// What this stage decided that no status change tells (told after the status write).
    pub told: Vec<Announcement>,
}

impl Primacy {
    fn of(primary: String) -> Self {
        Self {
            primary,
            failover: None,
            no_replica: None,
            switching: false,
            silent_for: None,
            told: Vec::new(),
        }
    }

    /// Paused: the primary as the lease (or the status) says; nothing is handed over.
    pub fn as_is(pass: &Pass, observed: &Observed) -> Self {
        let primary = observed
            .children
            .lease
            .as_deref()
            .and_then(account::holder)
            .unwrap_or_else(|| pass.primary.clone());
        Self::of(primary)
    }
}

/// How to reach instance `pod` as the superuser: its Ready address and the password.
fn reach(children: &observe::Children, names: &Names, pod: &str) -> Option<(String, String)> {
    let pods = replication::instance_pods(names, &children.pods);
    let ip = observe::ready_address(pods.get(pod)?)?;
    let password = children
        .superuser_secret
        .as_deref()
        .and_then(secrets::superuser_password)?;
    Some((ip, password))
}

/// A lost primary, as a failover starts from it.
struct Lost<'a> {
    from: Option<String>,
    why: String,
    /// What it noted when it gave its lease up, if it did.
    release: Option<&'a failover::Release>,
}

/// Whether instance `pod` runs again: its pod is not going and its PostgreSQL container has
/// started (its instance manager reads the lease within a second).
fn runs_again(children: &observe::Children, names: &Names, pod: &str) -> bool {
    let pods = replication::instance_pods(names, &children.pods);
    let Some(pod) = pods.get(pod) else { return false };
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|statuses| {
                statuses
                    .iter()
                    .any(|c| c.name == "postgres" && c.state.as_ref().is_some_and(|s| s.running.is_some()))
            })
}

/// Why a switchover is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Asker {
    /// A user named the replica (`noops.dev/promote`): a refusal is a Warning, and the
    /// request goes either way.
    User,
    /// The last step of a rolling change (`rollout.rs`): a refusal waits for the next pass.
    Rollout,
    /// The primary's node is being drained (`drain.rs`): likewise.
    Drain { node: String },
}

impl Asker {
    fn reason(&self) -> String {
        match self {
            Asker::User => ASKED_FOR.into(),
            Asker::Rollout => "the last step of a rolling change: every replica runs the new revision".into(),
            Asker::Drain { node } => format!("node {node}, the primary's, is being drained"),
        }
    }
}

/// Why a switchover a user asked for was made.
const ASKED_FOR: &str = "a switchover was asked for";

/// The instance a user asked to promote (`noops.dev/promote`), if any.
pub(super) fn requested(pg: &PostgreSQL) -> Option<&str> {
    pg.metadata
        .annotations
        .as_ref()?
        .get(PROMOTE_ANNOTATION)
        .map(|to| to.trim())
        .filter(|to| !to.is_empty())
}

impl Pass<'_> {
    /// The primary's lease: made, removed, handed over to the replica that received the most
    /// WAL once the primary's time is up, or released for a switchover and handed over.
    pub(super) async fn keep_primary(&self, observed: &Observed) -> Result<Primacy> {
        let children = &observed.children;
        let lease = children.lease.as_deref();
        let unchanged_for = lease.and_then(|l| {
            self.ctx.lease_clock.unchanged_for(
                &self.names.namespace,
                &self.names.lease(),
                l.metadata.resource_version.as_deref(),
            )
        });
        let view = lease.map(|l| failover::LeaseView {
            holder: account::holder(l),
            taken: account::taken(l),
            unchanged_for,
            switchover: switchover::record(l),
            release: failover::release(l),
        });
        let recorded = self.pg.status.as_ref().and_then(|s| s.current_primary.as_deref());
        let (primary, step) = failover::primary(&self.names, self.pg.spec.instances, view.as_ref(), recorded);
        let mut primacy = Primacy::of(primary);
        let leases = self.api::<Lease>();
        match step {
            failover::LeaseStep::Keep => {
                if let Some(lease) = lease {
                    primacy.failover = self.passed_while_away(lease, &primacy.primary);
                }
                primacy.silent_for = view.as_ref().and_then(|v| failover::silent_for(v, &primacy.primary));
                let held = view
                    .as_ref()
                    .is_some_and(|v| v.taken && v.holder.as_ref() == Some(&primacy.primary));
                match requested(self.pg) {
                    // Paused: a request waits (a switchover begun goes on: `SwitchOver`).
                    _ if self.pg.spec.paused => {}
                    None => {}
                    // Done (by a switchover whose operator stopped before it said so), or
                    // asked for the primary: nothing to do.
                    Some(to) if to == primacy.primary => {
                        info!(primary = %primacy.primary, "the instance asked for is the primary: the request is done");
                        self.forget_request().await;
                    }
                    Some(to) if lease.is_none() => {
                        let why = "the database has one instance: there is no replica to promote";
                        self.refuse_switchover(to, why.into(), &mut primacy).await;
                    }
                    Some(to) if held => self.ask_switchover(children, to, &Asker::User, &mut primacy).await?,
                    // Not taken yet (a new database): later.
                    Some(_) => {}
                }
            }
            failover::LeaseStep::Make(holder) => {
                let lease = account::lease(&self.names, &self.owner, &holder, self.now);
                if create_if_missing(&leases, &lease).await.during(Stage::Apply)? {
                    info!(%holder, "made the primary's lease: the database has replicas");
                }
            }
            failover::LeaseStep::Remove => {
                delete_if_present(&leases, &self.names.lease(), &Default::default())
                    .await
                    .during(Stage::Apply)?;
                info!("removed the primary's lease: the database is one instance again");
            }
            failover::LeaseStep::FailOver { from, why } => {
                if let Some(lease) = lease {
                    let release = view.as_ref().and_then(|v| v.release.as_ref());
                    let lost = Lost { from, why, release };
                    self.fail_over(children, lease, unchanged_for, lost, &mut primacy)
                        .await?;
                }
            }
            failover::LeaseStep::SwitchOver(record) => {
                if let Some(lease) = lease {
                    self.carry_switchover(children, lease, record, unchanged_for, &mut primacy)
                        .await?;
                }
            }
        }
        Ok(primacy)
    }

    /// The primary `lost.from` is lost: the lease goes to the replica that received the most
    /// WAL, once enough replicas have said where they are; after a clean stop, only to one
    /// that received all of it, or else back to the old primary once its pod runs again.
    /// `unchanged`: how long the operator has seen the lease unchanged.
    async fn fail_over(
        &self,
        children: &observe::Children,
        lease: &Lease,
        unchanged: Option<Duration>,
        lost: Lost<'_>,
        primacy: &mut Primacy,
    ) -> Result<()> {
        let Lost { from, why, release } = lost;
        let leases = self.api::<Lease>();
        let candidates = self.positions(children, from.as_deref()).await;
        if !candidates.is_empty() {
            info!(from = ?from, candidates = ?candidates, "the primary is lost: where each Ready replica is");
        }
        let answered: Vec<String> = candidates.iter().map(|(pod, _)| pod.clone()).collect();
        let candidates = match failover::complete(&candidates, release) {
            Ok(complete) => complete,
            Err(short) => {
                return self
                    .await_old_primary(children, lease, release, &why, short, primacy)
                    .await;
            }
        };
        let spec = &self.pg.spec;
        let choice = synchronous::enough_answered(
            spec.synchronous.as_ref(),
            &self.names,
            spec.instances,
            from.as_deref(),
            &answered,
        )
        .and_then(|()| {
            failover::choose(&self.names, &candidates, from.as_deref())
                .ok_or_else(|| "no replica can be promoted (none is Ready and streaming)".to_string())
        });
        let choice = match choice {
            Ok(chosen) => self.prepare_chosen(children, &chosen).await.map(|()| chosen),
            Err(why_not) => Err(why_not),
        };
        match choice {
            // A primary that gave its lease up can take it back: it has every commit.
            Err(why_not) if release.is_some() => {
                return self
                    .await_old_primary(children, lease, release, &why, why_not, primacy)
                    .await;
            }
            Err(why_not) => {
                self.say_lost(
                    format!("{why}; {why_not}: waiting for one, or for the primary to come back"),
                    primacy,
                );
            }
            Ok(chosen) => {
                let received = candidates
                    .iter()
                    .find(|(pod, _)| *pod == chosen)
                    .map(|(_, at)| at.lsn.clone())
                    .unwrap_or_default();
                let next = switchover::hand_over_to(lease, &chosen, self.now);
                match leases.replace(&self.names.lease(), &Default::default(), &next).await {
                    Ok(_) => {
                        warn!(from = ?from, to = %chosen, %received, %why, "failed over: handed the primary's lease to the replica that received the most WAL");
                        crash::point("postgres: lease handed over, status not written");
                        let unchanged = unchanged.unwrap_or_default();
                        primacy.failover = Some(noops_api::postgres::FailoverStatus {
                            from,
                            to: chosen.clone(),
                            reason: why,
                            received_lsn: Some(received),
                            primary_last_seen: Some(Time(
                                self.now - jiff::SignedDuration::try_from(unchanged).unwrap_or_default(),
                            )),
                            handed_over_at: Time(self.now),
                            promoted_at: None,
                            write_gap_millis: None,
                            switchover: false,
                        });
                        primacy.primary = chosen;
                    }
                    // Renewed or handed over meanwhile: the next pass looks again.
                    Err(kube::Error::Api(e)) if e.code == 409 => {
                        info!("the primary's lease changed while choosing a replica: looking again");
                    }
                    Err(e) => return Err(e).during(Stage::Apply),
                }
            }
        }
        Ok(())
    }

    /// The old primary gave its lease up and no replica can take its place (`short`: none has
    /// all of its WAL, or none can be promoted at all): nothing is promoted. Once its pod runs
    /// again the lease goes back to it and it serves again as it was, with every commit it
    /// made; until then the database has no primary, and says why.
    async fn await_old_primary(
        &self,
        children: &observe::Children,
        lease: &Lease,
        release: Option<&failover::Release>,
        why: &str,
        short: String,
        primacy: &mut Primacy,
    ) -> Result<()> {
        let Some(old) = release.map(|r| r.by.clone()) else {
            return Ok(());
        };
        // Looked at again soon: the pod coming back is what ends the wait.
        primacy.switching = true;
        if !runs_again(children, &self.names, &old) {
            self.say_lost(
                format!("{why}; {short}: waiting for {old} to run again, which then serves as it was"),
                primacy,
            );
            return Ok(());
        }
        let told = Announcement::warning(
            "PrimaryKept",
            format!(
                "{old} gave its lease up and {short}: the lease went back to {old}, which serves again as it was, no commit lost"
            ),
        );
        if self
            .give_back(
                lease,
                &old,
                told,
                "postgres: lease given back to a stopped primary",
                primacy,
            )
            .await?
        {
            warn!(primary = %old, %short, "gave the lease back to the old primary: no replica could take its place without losing commits");
        }
        Ok(())
    }

    /// Hands `lease` back to the old primary `old`, which serves again as it was; `told` once
    /// done. False: the lease changed meanwhile, and the next pass looks again.
    async fn give_back(
        &self,
        lease: &Lease,
        old: &str,
        told: Announcement,
        point: &str,
        primacy: &mut Primacy,
    ) -> Result<bool> {
        let next = switchover::hand_over_to(lease, old, self.now);
        match self
            .api::<Lease>()
            .replace(&self.names.lease(), &Default::default(), &next)
            .await
        {
            Ok(_) => {
                crash::point(point);
                primacy.primary = old.to_string();
                primacy.told.push(told);
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                info!("the primary's lease changed while giving it back: looking again");
                primacy.switching = true;
                Ok(false)
            }
            Err(e) => Err(e).during(Stage::Apply),
        }
    }

    /// The primary is lost and nothing can be done yet (`message` says why): said once when it
    /// starts; the condition says it while it lasts.
    fn say_lost(&self, message: String, primacy: &mut Primacy) {
        let said = self
            .pg
            .status
            .as_ref()
            .is_some_and(|s| s.conditions.iter().any(|c| c.reason == "PrimaryLost"));
        if said {
            debug!(%message, "the primary is still lost");
        } else {
            warn!(%message, "the primary is lost");
        }
        primacy.no_replica = Some(message);
    }

    /// `asker` asks for `to` to be the primary: checked against what the primary says of its
    /// stream, then the lease is released for it, the switchover recorded on it.
    pub(super) async fn ask_switchover(
        &self,
        children: &observe::Children,
        to: &str,
        asker: &Asker,
        primacy: &mut Primacy,
    ) -> Result<()> {
        let from = primacy.primary.clone();
        let standby = self.ask_primary_of(children, &from, to).await;
        let checked = standby
            .and_then(|standby| switchover::refusal(&self.names, self.pg.spec.instances, &from, to, standby.as_ref()));
        let checked = match checked {
            Ok(()) => self.prepare_chosen(children, to).await,
            Err(why) => Err(why),
        };
        let checked = match checked {
            Ok(()) => self.checkpoint(children, &from).await,
            Err(why) => Err(why),
        };
        match (checked, asker) {
            (Ok(()), _) => {}
            (Err(why), Asker::User) => {
                self.refuse_switchover(to, why, primacy).await;
                return Ok(());
            }
            (Err(why), _) => {
                info!(%to, %why, asked = %asker.reason(), "a switchover waits");
                return Ok(());
            }
        }
        // The lease as it is now: the cache's is a renewal or two behind, and the release is
        // made over the version it read. The primary renews it every second, so a release can
        // meet a renewal made since it was read: it is read and made again at once, a few
        // times, rather than a pass later (seconds of the switchover's write gap).
        let leases = self.api::<Lease>();
        let mut conflicts = 0;
        let released = loop {
            let lease = crate::core::confirm::read(&leases, &self.names.lease(), "lease-before-step-down")
                .await
                .during(Stage::Observe)?;
            if account::holder(&lease).as_deref() != Some(from.as_str()) {
                info!("the primary's lease changed while a switchover was being asked for: looking again");
                primacy.switching = true;
                return Ok(());
            }
            let next = switchover::step_down(&lease, (&from, to), &asker.reason(), self.now);
            match leases.replace(&self.names.lease(), &Default::default(), &next).await {
                Err(kube::Error::Api(e)) if e.code == 409 && conflicts < RELEASE_CONFLICTS => conflicts += 1,
                other => break other,
            }
        };
        match released {
            Ok(_) => {
                info!(%from, %to, why = %asker.reason(), "switching over: released the primary's lease; the primary shuts down cleanly, then the replica is promoted once it has all of its WAL");
                crash::point("postgres: lease released for a switchover");
                primacy.switching = true;
                let why = match asker {
                    Asker::User => "as asked".to_string(),
                    Asker::Rollout => format!("the last step of a rolling change ({to} runs the new revision)"),
                    Asker::Drain { node } => format!("as node {node} is being drained"),
                };
                primacy.told.push(Announcement::normal(
                    "SwitchingOver",
                    format!(
                        "{from} steps down for {to}, {why}: {to} is promoted once it has received all of {from}'s WAL"
                    ),
                ));
                if *asker == Asker::User {
                    self.forget_request().await;
                }
            }
            // Renewed meanwhile, each time: the next pass, soon, asks again.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                info!("the primary renewed its lease while it was being released for a switchover: looking again");
                primacy.switching = true;
            }
            Err(e) => return Err(e).during(Stage::Apply),
        }
        Ok(())
    }

    /// A checkpoint on primary `from` before it steps down, so that its shutdown checkpoint
    /// has little left to write and the step-down stays within its bound. `Err`: the primary
    /// did not checkpoint in time (it is busy, or going): no switchover now.
    async fn checkpoint(&self, children: &observe::Children, from: &str) -> std::result::Result<(), String> {
        let Some((ip, password)) = reach(children, &self.names, from) else {
            return Err(format!("the primary {from} is not Ready"));
        };
        let done = async { Instance::connect(&ip, &password).await?.checkpoint().await };
        match tokio::time::timeout(CHECKPOINT_WITHIN, done).await {
            Ok(Ok(())) => {
                debug!(primary = %from, "checkpointed the primary before it steps down");
                Ok(())
            }
            Ok(Err(e)) => Err(format!(
                "the primary {from} could not checkpoint before stepping down ({e})"
            )),
            Err(_) => Err(format!(
                "the primary {from} did not checkpoint within {}s, so it could not step down within its bound",
                CHECKPOINT_WITHIN.as_secs()
            )),
        }
    }

    /// The handover to `holder` that an operator made and did not record in the status before
    /// it stopped (the status names another primary, no handover to it is recorded, and it
    /// was made before this process started: one of this process's own is recorded by its
    /// pass, and the cache may show the status a moment late): recorded now, from what the
    /// lease notes of it. When the old primary stopped taking writes is not known any more:
    /// no write gap is said.
    fn passed_while_away(&self, lease: &Lease, holder: &str) -> Option<FailoverStatus> {
        let status = self.pg.status.as_ref()?;
        let recorded = status.current_primary.as_deref()?;
        let last_to = status.last_failover.as_ref().map(|f| f.to.as_str());
        let handed_over_at = lease.spec.as_ref()?.acquire_time.as_ref()?.0;
        // Known: the last record is of this holder, or it has held the lease from the start.
        if last_to == Some(holder) || (recorded == holder && last_to.is_none()) {
            return None;
        }
        // Handed over by this operator and not recorded: a pass that read a stale cache wrote
        // an older record back over it (`finish`). Recorded now, with what the lease says; the
        // old primary is the last record's new one when the status already names this holder.
        let ours = handed_over_at >= self.ctx.started;
        let recorded = if recorded == holder {
            last_to.unwrap_or(recorded)
        } else {
            recorded
        };
        info!(from = %recorded, to = %holder, ours, "the lease passed and the status does not say so: recording it");
        Some(match switchover::done(lease).filter(|d| d.to == holder) {
            Some(done) => FailoverStatus {
                from: Some(done.from),
                to: holder.to_string(),
                reason: done.why.unwrap_or_else(|| ASKED_FOR.into()),
                switchover: true,
                received_lsn: done.received,
                primary_last_seen: None,
                handed_over_at: Time(handed_over_at),
                promoted_at: None,
                write_gap_millis: None,
            },
            None => FailoverStatus {
                from: Some(recorded.to_string()),
                to: holder.to_string(),
                reason: if ours {
                    format!(
                        "the lease passed to {holder}; its record was written over by a pass that read a stale cache"
                    )
                } else {
                    format!("the lease passed to {holder} by a handover the operator made just before it stopped")
                },
                switchover: false,
                received_lsn: None,
                primary_last_seen: None,
                handed_over_at: Time(handed_over_at),
                promoted_at: None,
                write_gap_millis: None,
            },
        })
    }

    /// What primary `from` says of `to`'s stream. `Err`: why it could not be asked.
    async fn ask_primary_of(
        &self,
        children: &observe::Children,
        from: &str,
        to: &str,
    ) -> std::result::Result<Option<crate::postgres::sql::Standby>, String> {
        let Some((ip, password)) = reach(children, &self.names, from) else {
            return Err(format!("the primary {from} is not Ready"));
        };
        let asked = async {
            let instance = Instance::connect(&ip, &password).await?;
            instance.replication().await
        };
        match tokio::time::timeout(ASK_REPLICA_WITHIN, asked).await {
            Ok(Ok(replication)) => Ok(replication.standbys.into_iter().find(|s| s.name == to)),
            Ok(Err(e)) => Err(format!(
                "the primary {from} could not be asked about its replicas ({e})"
            )),
            Err(_) => Err(format!(
                "the primary {from} did not say in time how its replicas stream"
            )),
        }
    }

    /// Refuses the switchover to `to`: the request goes, an Event says why.
    async fn refuse_switchover(&self, to: &str, why: String, primacy: &mut Primacy) {
        warn!(%to, %why, "refused a switchover");
        primacy.told.push(Announcement::warning(
            noops_api::postgres::SWITCHOVER_REFUSED,
            format!("switchover to {to} refused: {why}"),
        ));
        self.forget_request().await;
    }

    /// Removes the request annotation: it has been acted on. A failure is said and left to
    /// the next pass (a request naming the primary is done), never a failed pass: the lease is
    /// what a switchover goes by.
    async fn forget_request(&self) {
        let api = self.api::<PostgreSQL>();
        let body = json!({ "metadata": { "annotations": { (PROMOTE_ANNOTATION): null } } });
        match api
            .patch(&self.names.name, &PatchParams::default(), &Patch::Merge(body))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => warn!(error = %e, "could not remove the switchover request (noops.dev/promote) it acted on"),
        }
    }

    /// A switchover under way (`switchover.rs`): waits for the old primary to stop and the
    /// replica to receive its last record, then hands the lease over; gives it back to the old
    /// primary when that cannot be; fails over if the old primary said nothing for a lease.
    async fn carry_switchover(
        &self,
        children: &observe::Children,
        lease: &Lease,
        record: Record,
        unchanged_for: Option<Duration>,
        primacy: &mut Primacy,
    ) -> Result<()> {
        let received = match &record.stopped {
            Some(Stopped::Clean(_)) => self.position_of(children, &record.to).await,
            _ => None,
        };
        let (from, to) = (record.from.clone(), record.to.clone());
        match switchover::next(&record, unchanged_for, received.as_ref()) {
            Next::Wait => {
                debug!(%from, %to, stopped = ?record.stopped, received = ?received, "switching over: waiting");
                primacy.switching = true;
            }
            Next::HandOver => {
                let at = received.as_ref().map(|r| r.lsn.clone()).unwrap_or_default();
                let next = switchover::hand_over(lease, &record, &at, self.now);
                match self
                    .api::<Lease>()
                    .replace(&self.names.lease(), &Default::default(), &next)
                    .await
                {
                    Ok(_) => {
                        let received = received.map(|r| r.lsn).unwrap_or_default();
                        info!(%from, %to, %received, "switched over: handed the primary's lease to the replica, which has all of the old primary's WAL");
                        crash::point("postgres: lease handed over for a switchover, status not written");
                        primacy.failover = Some(FailoverStatus {
                            from: Some(from),
                            to: to.clone(),
                            reason: record.why.clone().unwrap_or_else(|| ASKED_FOR.into()),
                            switchover: true,
                            received_lsn: Some(received),
                            primary_last_seen: record.at.map(Time),
                            handed_over_at: Time(self.now),
                            promoted_at: None,
                            write_gap_millis: None,
                        });
                        primacy.primary = to;
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => {
                        info!("the primary's lease changed during the switchover: looking again");
                        primacy.switching = true;
                    }
                    Err(e) => return Err(e).during(Stage::Apply),
                }
            }
            Next::GiveBack(why) => {
                let told = Announcement::warning(
                    noops_api::postgres::SWITCHOVER_GIVEN_BACK,
                    format!("the switchover to {to} was given up and {from} is the primary again: {why}"),
                );
                if self
                    .give_back(lease, &from, told, "postgres: switchover given back", primacy)
                    .await?
                {
                    warn!(%from, %to, %why, "gave the switchover up: the lease is back with the old primary");
                }
            }
            Next::FailOver(why) => {
                let lost = Lost {
                    from: Some(from),
                    why,
                    release: None,
                };
                self.fail_over(children, lease, unchanged_for, lost, primacy).await?;
            }
        }
        Ok(())
    }

    /// Where replica `pod` is, if it says in time.
    async fn position_of(
        &self,
        children: &observe::Children,
        pod: &str,
    ) -> Option<crate::postgres::position::Position> {
        let (ip, password) = reach(children, &self.names, pod)?;
        let asked = async { Instance::connect(&ip, &password).await?.standby_position().await };
        match tokio::time::timeout(ASK_REPLICA_WITHIN, asked).await {
            Ok(Ok(position)) => position,
            Ok(Err(e)) => {
                debug!(replica = %pod, error = %e, "cannot ask the replica where it is");
                None
            }
            Err(_) => None,
        }
    }

    /// Prepares replica `chosen`, about to be handed the lease: the replication slots of the
    /// other instances (so that they stream from it as soon as they follow it, before it has
    /// even promoted, rather than after the first pass once it serves), and the
    /// `synchronous_standby_names` it will need as the primary, so that its first commit waits
    /// as the spec asks. `Err`: why it cannot be handed the lease yet (only the list is a
    /// must; slots not made now are made once it serves).
    pub(super) async fn prepare_chosen(
        &self,
        children: &observe::Children,
        chosen: &str,
    ) -> std::result::Result<(), String> {
        let spec = &self.pg.spec;
        let wanted = synchronous::standby_names(spec.synchronous.as_ref(), &self.names, spec.instances, chosen, &[]);
        let Some((ip, password)) = reach(children, &self.names, chosen) else {
            return Err(format!("{chosen} is no longer Ready"));
        };
        let instance = match Instance::connect(&ip, &password).await {
            Ok(instance) => instance,
            // Asynchronous: nothing it must have; the pass after its promotion makes the rest.
            Err(e) if wanted.is_empty() => {
                info!(replica = %chosen, error = %e, "cannot prepare the replica to promote: it gets its slots once it serves");
                return Ok(());
            }
            Err(e) => return Err(format!("{chosen} could not be given its synchronous replicas ({e})")),
        };
        for slot in replication::wanted_slots(&self.names, spec.instances, chosen) {
            if let Err(e) = instance.ensure_slot(&slot).await {
                info!(replica = %chosen, %slot, error = %e, "could not make a slot on the replica to promote: made once it serves");
            }
        }
        if wanted.is_empty() {
            return Ok(());
        }
        match instance.set_synchronous_standby_names(&wanted).await {
            Ok(()) => {
                info!(replica = %chosen, setting = %wanted, "gave the replica to promote what its commits will wait for");
                Ok(())
            }
            Err(e) => Err(format!(
                "{chosen} could not be given its synchronous replicas before its promotion ({e})"
            )),
        }
    }

    /// Where each Ready replica is (the last WAL position it received), but `lost`'s: what
    /// it says when asked, each asked at once.
    async fn positions(
        &self,
        children: &observe::Children,
        lost: Option<&str>,
    ) -> Vec<(String, crate::postgres::position::Position)> {
        let Some(password) = children
            .superuser_secret
            .as_deref()
            .and_then(secrets::superuser_password)
        else {
            return Vec::new();
        };
        let asked = replication::instance_pods(&self.names, &children.pods)
            .into_iter()
            .filter(|(name, _)| Some(name.as_str()) != lost)
            .filter_map(|(name, pod)| Some((name, observe::ready_address(pod)?)))
            .map(|(name, ip)| {
                let password = password.clone();
                async move {
                    let position = async {
                        let instance = Instance::connect(&ip, &password).await?;
                        instance.standby_position().await
                    };
                    // A replica that does not answer at once is not waited for: the failover is.
                    match tokio::time::timeout(ASK_REPLICA_WITHIN, position).await {
                        Ok(Ok(Some(at))) => Some((name, at)),
                        Ok(Ok(None)) => None,
                        Ok(Err(e)) => {
                            info!(replica = %name, error = %e, "cannot ask a replica where it is: not a candidate");
                            None
                        }
                        Err(_) => {
                            info!(replica = %name, "a replica did not say where it is in time: not a candidate");
                            None
                        }
                    }
                }
            });
        futures::future::join_all(asked).await.into_iter().flatten().collect()
    }
}
