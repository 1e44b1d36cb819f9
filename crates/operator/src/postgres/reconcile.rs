//! One PostgreSQL pass, on the core's stages (`core/stages.rs`): observe (children and backups
//! from the caches, the user's password Secret) → plan (pure: the password; what an empty data
//! directory would become, `restore.rs`; whether the children are left as they are) → apply,
//! each step deciding the next: the primary (`reconcile/primacy.rs`), the children (superuser
//! Secret once, the plan's ConfigMap, StatefulSet, Service), the database (as the superuser:
//! its owner, the password, the database; what it says of its WAL archiving and of a
//! restore), the role labels, the roll and the spread, the connection Secret, the backups (the
//! first, the scheduled, retention) → status (pure), and an Event for each decision.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Resource};
use noops_api::postgres::BackupLocation;
use noops_api::postgres::{PostgreSQLReason, PostgreSQLStatus};
use noops_api::{PostgreSQL, PostgresBackup};
use serde_json::json;
use tracing::{info, warn};

use super::PostgreSQLs;
use super::backups;
use super::context::Context;
use super::database::{self, InDatabase};
use super::events::announcements;
use super::names::{Names, ROLE_LABEL};
use super::node_loss::{self, Elsewhere, NodeLoss};
use super::placement;
use super::problem::PlanProblem;
use super::restore::InstancePlan;
use super::secrets::{self, Password, PasswordProblem};
use super::status::{self, InstanceState, StatusFacts};
use super::store::{BaseBackupDestination, Destination};
use super::{account, destination, drain, observe, replication, restore, services, statefulset, switchover};
use crate::core::apply::{apply, controller_reference, create_if_missing, delete_if_present};
use crate::core::backup::progress;
use crate::core::backup::retention::{BackupsSummary, being_restored};
use crate::core::cache::in_namespace;
use crate::core::events::Announcement;
use crate::core::stages::{self, Report, Stages};
use crate::core::stamp::{stamp, up_to_date};
use crate::core::{DuringStage, Error, Result, Stage, crash};

mod apart;
mod primacy;
mod rolling;
use primacy::Primacy;

/// How often a serving database is looked at without a change. Everything that moves it
/// comes through a watch (its spec, its pod, its StatefulSet, its password Secret, its
/// backups); this catches hand changes inside PostgreSQL (a dropped role) and, with backups,
/// keeps the last archived WAL segment in status current.
const LOOK_AGAIN: Duration = Duration::from_secs(300);
const LOOK_AGAIN_ARCHIVING: Duration = Duration::from_secs(60);
/// How soon a database that is not serving yet is looked at again, if nothing wakes it first.
const NOT_YET: Duration = Duration::from_secs(5);
/// How often a data directory being made is looked at: a restore's progress in status.
const BOOTSTRAPPING: Duration = Duration::from_secs(1);
/// How soon a database whose instances could be moved apart is looked at again.
const SPREAD_RECHECK: Duration = Duration::from_secs(15);
/// How long a failover waits for a replica to say where it is.
const ASK_REPLICA_WITHIN: Duration = Duration::from_secs(3);
/// How often a primary whose commits wait for replicas only while they are there
/// (`synchronous.dataDurability: Preferred`) is asked which stream: a replica that stopped
/// holds its commits until then.
const SYNCHRONOUS_PREFERRED: Duration = Duration::from_secs(2);
/// How often a replica handed the lease is looked at until it has promoted: the moment it
/// takes writes is in the status (`lastFailover.promotedAt`), and nothing else wakes the pass.
const PROMOTING: Duration = Duration::from_millis(500);

/// What a pass decides before it acts: what validation concluded, and whether the pass leaves
/// the children as they are.
pub struct Decided {
    checked: Checked,
    hands_off: bool,
    now: jiff::Timestamp,
}

/// What a pass did, for the status.
pub struct Finished {
    names: Names,
    facts: StatusFacts,
    made: InDatabase,
    /// What the lease stage did (a failover, a switchover), told with the status's news.
    told: Vec<Announcement>,
    look_again: Duration,
}

/// A PostgreSQL's pass on the core's stages. Its `apply` acts between its own reads (the lease
/// and the primary, then the children, then SQL in the instance, the role labels, the roll
/// and the spread, the backups), each of which decides the next.
impl Stages for PostgreSQLs {
    type Observation = Observed;
    type Plan = Decided;
    type Applied = Finished;

    // Not `GUARDED`: a guard on the pass's resourceVersion, tried in 97eda33, lost news and
    // made switchovers slower under load; a pass that read a stale cache can still write an
    // older failover record back, which the next pass records again from the lease.

    /// Paused, a database is still asked how it stands (the status says so), a switchover
    /// begun is finished (its primary has stopped), and its backups keep their schedule.
    const APPLIES_WHILE_PAUSED: bool = true;

    async fn observe(
        pg: Arc<PostgreSQL>,
        ctx: &Context,
        now: jiff::Timestamp,
    ) -> Result<stages::Observed<PostgreSQL, Observed>> {
        let observed = Pass::new(&pg, ctx, now)?.observe().await?;
        Ok(stages::Observed::new(pg, observed))
    }

    fn plan(pg: &PostgreSQL, observed: &Observed, now: jiff::Timestamp) -> Result<Decided> {
        let checked = validate(pg, observed);
        // A database not made yet whose spec is refused (the backup it starts from is not
        // there) makes nothing: no Secret, account, Service or budget for a StatefulSet held
        // back. Its status says why; the pass after the fix makes them all.
        let hands_off = pg.spec.paused || (observed.children.statefulset.is_none() && checked.plan.is_err());
        Ok(Decided {
            checked,
            hands_off,
            now,
        })
    }

    async fn apply(
        pg: &PostgreSQL,
        observed: &Observed,
        decided: &Decided,
        ctx: &Context,
    ) -> Result<stages::Applied<Finished>> {
        let mut pass = Pass::new(pg, ctx, decided.now)?;
        pass.hands_off = decided.hands_off;
        Ok(stages::Applied::Done(
            pass.act(observed.clone(), &decided.checked).await?,
        ))
    }

    fn status(
        pg: &PostgreSQL,
        _observed: &Observed,
        _decided: &Decided,
        finished: Option<&Finished>,
        now: jiff::Timestamp,
    ) -> Report<PostgreSQLStatus> {
        let previous = pg.status.clone().unwrap_or_default();
        // (Its apply runs while paused too.)
        let Some(finished) = finished else {
            return Report::of(previous);
        };
        let status = status::build(pg, &finished.names, &finished.facts, now);
        let mut news = announcements(pg, &previous, &status, &finished.made);
        news.extend(finished.told.iter().cloned());
        Report {
            status,
            done: Vec::new(),
            news,
            next: Some(finished.look_again),
        }
    }

    async fn settled(
        pg: &PostgreSQL,
        _observed: &Observed,
        decided: &Decided,
        finished: Option<&Finished>,
        status: &PostgreSQLStatus,
        ctx: &Context,
    ) {
        let Some(names) = finished.map(|f| &f.names) else {
            return;
        };
        let now = decided.now;
        ctx.core.metrics.set_backups(
            "PostgreSQL",
            &names.namespace,
            &names.name,
            &status::gauges(pg, status, now),
        );
        ctx.core
            .metrics
            .set_replication(&names.namespace, &names.name, &status::replication_gauges(pg, status));
    }
}

/// Validate (pure): the password's Secret, and what an empty data directory would become.
fn validate(pg: &PostgreSQL, observed: &Observed) -> Checked {
    let previous = pg.status.clone().unwrap_or_default();
    Checked {
        password: secrets::password(observed.user_secret.as_deref(), &pg.spec.password_secret),
        plan: restore::plan(pg, &observed.backups),
        schedule_problem: backups::schedule_problem(pg),
        bootstrap_source: previous
            .bootstrap_source
            .or_else(|| restore::bootstrap_location(pg, &observed.backups)),
    }
}

impl Pass<'_> {
    /// Apply, stage by stage, each deciding the next: who the primary is (with replicas, the
    /// lease's holder, handed over first if its time is up; the rest builds around it), the
    /// children, the database, the role labels, the roll, the spread, the backups, the
    /// connection Secret.
    async fn act(mut self, mut observed: Observed, checked: &Checked) -> Result<Finished> {
        let pg = self.pg;
        // Paused, nothing is handed over, but a switchover begun is finished: its primary has
        // stopped.
        let switching = observed.children.lease.as_deref().is_some_and(switchover::under_way);
        let mut primacy = if self.hands_off && !switching {
            Primacy::as_is(&self, &observed)
        } else {
            self.keep_primary(&observed).await?
        };
        self.primary = primacy.primary.clone();
        observed.children = observed
            .children
            .with_primary(&self.ctx.caches, &self.names, &self.primary);
        let applied = if self.hands_off {
            self.leave_children(&observed)
        } else {
            self.apply_children(&observed, checked).await?
        };
        let (instance, made) = self
            .in_database(&observed, checked, &applied, primacy.silent_for)
            .await?;
        let members = self.label_roles(&observed, &made, primacy.silent_for.is_some()).await?;
        let rolling = self.roll(&observed, &members, &mut primacy).await?;
        let instance_serving = matches!(instance, InstanceState::Serving(_));
        let serving = instance_serving && made.database_ready;
        let spread = self.spread(&observed, &members);
        self.move_apart(&observed, &members, &spread, rolling || !serving, &mut primacy)
            .await?;
        let bootstrapping = matches!(instance, InstanceState::Bootstrapping);
        let (summary, kept) = self.keep_backups(&observed, serving).await?;
        let promoting = primacy.failover.is_some()
            || primacy.switching
            || pg
                .status
                .as_ref()
                .and_then(|s| s.last_failover.as_ref())
                .is_some_and(|f| f.promoted_at.is_none());
        let look_again = if promoting {
            PROMOTING
        } else if bootstrapping {
            BOOTSTRAPPING
        } else if rolling
            || members
                .iter()
                .any(|m| m.role == noops_api::postgres::Role::Replica && m.streaming != Some(true))
        {
            // A replica catching up, being rewound or copied anew changes no object the pass
            // watches: it is looked at until it streams.
            NOT_YET
        } else if let Some(sync) = pg.spec.synchronous.as_ref().filter(|_| serving) {
            // Nothing the pass watches changes when a replica stops replying: the primary is
            // asked who streams, and with `Preferred` stops waiting for one that does not.
            match sync.data_durability {
                noops_api::postgres::DataDurability::Preferred => SYNCHRONOUS_PREFERRED,
                noops_api::postgres::DataDurability::Required => NOT_YET,
            }
        } else {
            self.look_again(serving, &applied, kept.look_again)
        };
        // Instances that could be moved apart are looked at again soon: the move waits for them
        // to settle. (A node that can take pods again wakes the databases whose instances share
        // a node: `node_wakes`.)
        let apart = spread.fixable(self.replicas_spare(&members));
        let look_again = match apart {
            Some(_) => look_again.min(SPREAD_RECHECK),
            None => look_again,
        };
        let told = std::mem::take(&mut primacy.told);
        self.write_connection_secret(&observed.children, &checked.password)
            .await?;
        let mut facts = seen(
            &self,
            (instance, members, primacy),
            &observed,
            checked,
            applied,
            &made,
            summary,
        );
        facts.apart = apart;
        // (A serving instance's restore record is what the status gives.)
        let previous_restore = pg.status.as_ref().and_then(|s| s.restore.as_ref());
        let restore_seen = instance_serving && made.restore.as_ref() != previous_restore;
        if made.password_set || restore_seen {
            crash::point("postgres: restore or password seen, status not written");
        }
        Ok(Finished {
            names: self.names,
            facts,
            made,
            told,
            look_again,
        })
    }
}

/// What every stage of one pass knows of the database.
struct Pass<'a> {
    pg: &'a PostgreSQL,
    names: Names,
    owner: OwnerReference,
    ctx: &'a Context,
    now: jiff::Timestamp,
    /// The primary instance's pod: as the status last said until the lease stage decides.
    primary: String,
    /// Whether the pass leaves every child as it is (paused, or refused before anything was
    /// made): set once validated.
    hands_off: bool,
}

/// What the pass read: from the caches, and the user's Secret (`core::user_secrets`).
#[derive(Clone)]
pub struct Observed {
    children: observe::Children,
    backups: Vec<PostgresBackup>,
    /// The backups a new database of the namespace still starts from.
    backups_being_restored: BTreeSet<String>,
    user_secret: Option<Arc<Secret>>,
}

/// What validation concluded: the schema checked the spec; the password's Secret and the
/// backup a new database starts from are left.
pub struct Checked {
    password: std::result::Result<Password, PasswordProblem>,
    /// What an empty data directory becomes.
    plan: std::result::Result<InstancePlan, PlanProblem>,
    schedule_problem: Option<PlanProblem>,
    /// Where a bootstrap backup is, recorded once: the pod is built to reach it.
    bootstrap_source: Option<BackupLocation>,
}

/// What applying the children left.
struct Applied {
    superuser_password: String,
    /// Why the StatefulSet is left as it is (a destination the pod cannot reach, no node
    /// that fits).
    held_back: Option<PlanProblem>,
    /// The API server refused the StatefulSet or the Service as the spec makes them.
    refused: Option<PlanProblem>,
    live_service: Option<Service>,
    /// Why the instance waits for its dead node, if it does.
    node_lost: Option<String>,
}

impl<'a> Pass<'a> {
    fn new(pg: &'a PostgreSQL, ctx: &'a Context, now: jiff::Timestamp) -> Result<Self> {
        let owner = controller_reference(pg).ok_or_else(|| Error::Internal("the PostgreSQL has no uid yet".into()))?;
        let names = Names::pulling_from(pg, &ctx.images);
        let primary = pg
            .status
            .as_ref()
            .and_then(|s| s.current_primary.clone())
            .unwrap_or_else(|| names.instance());
        Ok(Self {
            pg,
            names,
            owner,
            ctx,
            now,
            primary,
            hands_off: pg.spec.paused,
        })
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.ctx.client.clone(), &self.names.namespace)
    }

    /// Observe: the children and the namespace's backups and databases from the caches, and the
    /// user's Secret, which carries none of the operator's labels (read again only when it
    /// changed).
    async fn observe(&self) -> Result<Observed> {
        Ok(Observed {
            children: observe::children(&self.ctx.caches, &self.names),
            backups: in_namespace(&self.ctx.caches.backups, &self.names.namespace),
            backups_being_restored: being_restored(&self.ctx.databases, &self.names.namespace, backups::starting_from),
            user_secret: self
                .ctx
                .user_secrets
                .get(&self.names.namespace, &self.pg.spec.password_secret)
                .await?,
        })
    }

    /// Apply the children: the superuser's Secret once, the plan's ConfigMap, the StatefulSet
    /// (unless held back), the Service; then what the pods need (a stuck pod of an old spec
    /// deleted, a pod whose claim is gone replaced, a dead node's instance handled).
    async fn apply_children(&self, observed: &Observed, checked: &Checked) -> Result<Applied> {
        let children = &observed.children;
        let superuser_password = ensure_superuser_secret(&self.names, &self.owner, children, &self.api())
            .await
            .during(Stage::Apply)?;
        self.apply_account(children).await.during(Stage::Apply)?;
        if let Ok(plan) = &checked.plan {
            let plan = restore::for_primary(plan.clone(), &self.names, &self.primary, self.pg.spec.instances);
            self.write_plan(children, &plan).await.during(Stage::Apply)?;
        }
        let (held_back, mut refused) = self.apply_statefulset(children, checked).await?;
        let mut live_service = children.service.as_deref().cloned();
        for mut service in services::build_all(self.pg, &self.names, &self.owner, &self.primary) {
            stamp(&mut service);
            let name = service.metadata.name.clone().unwrap_or_default();
            let live = children.services.get(&name).map(|s| s.as_ref());
            if up_to_date(&service, live) {
                continue;
            }
            match apply(&self.api::<Service>(), &name, &service).await {
                Ok(applied) if name == self.names.service() => live_service = Some(applied),
                Ok(_) => {}
                Err(error) => {
                    refused = refused.or(Some(refusal("Service", error).during(Stage::Apply)?));
                }
            }
        }
        self.apply_budgets(children).await.during(Stage::Apply)?;
        self.replace_pods_that_cannot_start(children).await?;
        // A node that died with the instance on it.
        let node_lost = match children
            .instance
            .as_deref()
            .filter(|p| node_loss::stuck_in_deletion(p, self.now))
        {
            Some(stuck) => handle_node_loss(self.pg, &self.names, self.ctx, stuck, &checked.plan, self.now)
                .await
                .during(Stage::Apply)?,
            None => None,
        };
        Ok(Applied {
            superuser_password,
            held_back,
            refused,
            live_service,
            node_lost,
        })
    }

    /// Paused (or refused before anything was made): the children stay as they are, whatever
    /// they are; the pass only reads them.
    fn leave_children(&self, observed: &Observed) -> Applied {
        let children = &observed.children;
        if self.pg.spec.paused {
            info!("paused: the instance's objects are left as they are");
        } else {
            info!("the spec is refused and nothing was made yet: nothing is made until it is mended");
        }
        Applied {
            superuser_password: children
                .superuser_secret
                .as_deref()
                .and_then(secrets::superuser_password)
                .unwrap_or_default(),
            held_back: None,
            refused: None,
            live_service: children.service.as_deref().cloned(),
            node_lost: None,
        }
    }

    /// The instances' service account, and its Role and RoleBinding (the primary's lease),
    /// made before the pods that run as it.
    async fn apply_account(&self, children: &observe::Children) -> kube::Result<()> {
        let mut account = account::service_account(&self.names, &self.owner);
        stamp(&mut account);
        if !up_to_date(&account, children.service_account.as_deref()) {
            apply(&self.api::<ServiceAccount>(), &self.names.instance_account(), &account).await?;
        }
        let mut role = account::role(&self.names, &self.owner);
        stamp(&mut role);
        if !up_to_date(&role, children.role.as_deref()) {
            apply(&self.api::<Role>(), &self.names.instance_account(), &role).await?;
        }
        let mut binding = account::role_binding(&self.names, &self.owner);
        stamp(&mut binding);
        if !up_to_date(&binding, children.role_binding.as_deref()) {
            apply(&self.api::<RoleBinding>(), &self.names.instance_account(), &binding).await?;
        }
        Ok(())
    }

    /// The PodDisruptionBudgets the instances get (`drain.rs`), and none they no longer do.
    async fn apply_budgets(&self, children: &observe::Children) -> kube::Result<()> {
        let api = self.api::<PodDisruptionBudget>();
        let wanted = drain::budgets(&self.names, &self.owner, self.pg.spec.instances);
        for mut budget in wanted.iter().cloned() {
            stamp(&mut budget);
            let name = budget.metadata.name.clone().unwrap_or_default();
            if !up_to_date(&budget, children.budgets.get(&name).map(|b| b.as_ref())) {
                apply(&api, &name, &budget).await?;
                info!(budget = %name, "applied a disruption budget: drains take the instances as it says");
            }
        }
        for name in children.budgets.keys() {
            if !wanted.iter().any(|b| b.metadata.name.as_ref() == Some(name)) {
                delete_if_present(&api, name, &Default::default()).await?;
                info!(budget = %name, "removed a disruption budget the instances no longer get");
            }
        }
        Ok(())
    }

    /// The plan's ConfigMap, which the pod's bootstrap reads, written before the StatefulSet.
    async fn write_plan(&self, children: &observe::Children, plan: &InstancePlan) -> Result<()> {
        let mut config = restore::config_map(&self.names, &self.owner, plan);
        stamp(&mut config);
        if !up_to_date(&config, children.instance_config.as_deref()) {
            apply(&self.api::<ConfigMap>(), &self.names.instance_config(), &config).await?;
            crash::point("postgres: plan written");
            info!(restore_from = ?plan.restore.as_ref().map(|r| &r.backup), "an empty data directory now becomes what the plan says");
        }
        Ok(())
    }

    /// The StatefulSet, unless it must be left as it is: a new database whose bootstrap backup
    /// cannot be used yet gets no pod (it would have nothing to start from); a pod given a
    /// backup destination it cannot reach cannot start, so the StatefulSet is left as it is
    /// until the destination is there (a bad edit never stops a database that serves); a spec
    /// no node could ever hold (`placement.rs`) is left out the same way. Returns (why it is
    /// held back, why the API server refused it).
    async fn apply_statefulset(
        &self,
        children: &observe::Children,
        checked: &Checked,
    ) -> Result<(Option<PlanProblem>, Option<PlanProblem>)> {
        if checked.plan.is_err() && children.statefulset.is_none() {
            return Ok((None, None));
        }
        let mut sts = statefulset::build(
            self.pg,
            &self.names,
            &self.owner,
            &self.ctx.image,
            checked.bootstrap_source.as_ref(),
            &self.primary,
            &self.ctx.images,
        );
        stamp(&mut sts);
        if up_to_date(&sts, children.statefulset.as_deref()) {
            return Ok((None, None));
        }
        let mut held_back = check_destination(self.pg, &self.names, self.ctx)
            .await
            .during(Stage::Validate)?;
        if held_back.is_none() {
            held_back = check_placement(self.pg, self.ctx);
        }
        if let Some(problem) = &held_back {
            info!(
                reason = problem.reason.as_str(),
                "the StatefulSet is left as it is: {}", problem.message
            );
            return Ok((held_back, None));
        }
        match apply(&self.api::<StatefulSet>(), &self.names.statefulset(), &sts).await {
            Ok(_) => {
                info!("applied the StatefulSet");
                Ok((None, None))
            }
            Err(error) => Ok((None, Some(refusal("StatefulSet", error).during(Stage::Apply)?))),
        }
    }

    /// A pod that waits for a volume claim that is gone is deleted: the StatefulSet makes both
    /// anew. (A pod that cannot start on an old spec is the rolling stage's: `reconcile/rolling.rs`.)
    async fn replace_pods_that_cannot_start(&self, children: &observe::Children) -> Result<()> {
        let pods = self.api::<Pod>();
        if let Some(pod) = observe::pod_without_its_claim(children) {
            // The caches may have seen a new pod before its new claim: the API server says.
            let claim = self.api::<PersistentVolumeClaim>();
            let claim = crate::core::confirm::get(
                &claim,
                &self.names.data_claim_of(&self.primary),
                "claim-before-pod-delete",
            )
            .await
            .during(Stage::Observe)?;
            if claim.is_none_or(|c| c.metadata.deletion_timestamp.is_some()) {
                delete_if_present(&pods, &pod, &Default::default())
                    .await
                    .during(Stage::Apply)?;
                info!(
                    pod,
                    "deleted the instance's pod, which waited for a volume claim that is gone: the StatefulSet makes both anew"
                );
            }
        }
        Ok(())
    }

    /// The instance and the database in it: as the superuser, its owner, the password, the
    /// database; what it says of its WAL archiving and of a restore. A primary silent on its
    /// lease (`silent_for`) is not asked: the failover must not wait for a connection to it
    /// to time out.
    async fn in_database(
        &self,
        observed: &Observed,
        checked: &Checked,
        applied: &Applied,
        silent_for: Option<Duration>,
    ) -> Result<(InstanceState, InDatabase)> {
        if let Some(silent) = silent_for {
            let why = format!(
                "{} has not renewed the primary's lease for {}s: not asked until it does (a replica is promoted at {}s)",
                self.primary,
                silent.as_secs(),
                super::lease::LEASE.as_secs()
            );
            info!(%why, "not asking the primary this pass");
            return Ok((InstanceState::Unreachable(why), InDatabase::default()));
        }
        let previous = self.pg.status.clone().unwrap_or_default();
        let pod = observed.children.instance.as_deref();
        let (mut instance, made) = database::instance_and_database(
            self.pg,
            (&self.names, &self.primary),
            &previous,
            pod,
            &applied.superuser_password,
            &checked.password,
            !self.pg.spec.paused,
        )
        .await;
        if let InstanceState::Unreachable(why) = &instance {
            // The caches may be a moment behind a pod deleted (or no longer Ready) while the
            // pass talked to it: that one is being replaced, not unreachable, and worth no
            // Warning.
            let pods = self.api::<Pod>();
            let latest = crate::core::confirm::get(&pods, &self.primary, "pod-before-warning")
                .await
                .during(Stage::Observe)?;
            if latest.as_ref().and_then(observe::ready_address).is_none() {
                info!(error = %why, "the instance's pod stopped serving while this pass talked to it");
                instance = InstanceState::Starting(format!("pod {} is stopping or starting", self.primary));
            } else {
                warn!(error = %why, "cannot talk to the instance");
            }
        }
        Ok((instance, made))
    }

    /// Each instance as the primary reports it, and its pod's role label set to match (unless
    /// paused): `<name>-ro` follows the label. A primary not asked this pass (`silent`) said
    /// nothing of its replicas: they stay as the status last said, and so do their labels.
    async fn label_roles(
        &self,
        observed: &Observed,
        made: &InDatabase,
        silent: bool,
    ) -> Result<Vec<noops_api::postgres::MemberStatus>> {
        if silent {
            return Ok(self.pg.status.as_ref().map(|s| s.members.clone()).unwrap_or_default());
        }
        let pods = replication::instance_pods(&self.names, &observed.children.pods);
        let members = replication::members(&pods, &self.primary, made.replication.as_ref(), self.now);
        for slot in &made.slots_made {
            info!(%slot, "made a replication slot on the primary for a replica");
        }
        for slot in &made.slots_dropped {
            info!(%slot, "dropped the replication slot of an instance scaled away");
        }
        if let Some(setting) = &made.synchronous_set {
            info!(%setting, streaming = ?made.synchronous.as_ref().map(|s| &s.synchronous), "set what the primary's commits wait for (synchronous_standby_names)");
        }
        if self.pg.spec.paused {
            return Ok(members);
        }
        let api = self.api::<Pod>();
        for (pod, role) in replication::labels_to_set(&pods, &members) {
            let body = json!({ "metadata": { "labels": { (ROLE_LABEL): role } } });
            match api.patch(&pod, &PatchParams::default(), &Patch::Merge(body)).await {
                Ok(_) => info!(%pod, %role, "labelled the instance with its role"),
                // Gone since the cache saw it: its successor is labelled by the next pass.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e).during(Stage::Apply),
            }
        }
        Ok(members)
    }

    /// Backups: the first, the scheduled, retention; an Event for each decision.
    async fn keep_backups(
        &self,
        observed: &Observed,
        serving: bool,
    ) -> Result<(BackupsSummary<PostgreSQLReason>, backups::BackupDecisions)> {
        let mut summary = backups::summary(self.pg);
        let namespace = backups::NamespaceView {
            backups: &observed.backups,
            being_restored: &observed.backups_being_restored,
        };
        let mut kept = backups::keep(
            self.pg,
            &self.names,
            &self.ctx.client,
            &namespace,
            serving,
            &mut summary,
            self.now,
        )
        .await
        .during(Stage::Apply)?;
        // Told at once: a backup made is not made again by the next pass, whatever becomes of
        // this one.
        let reference = self.pg.object_ref(&());
        for announcement in std::mem::take(&mut kept.decisions) {
            self.ctx.core.events.tell(&reference, announcement).await;
        }
        Ok((summary, kept))
    }

    /// When to look again without a change.
    fn look_again(&self, serving: bool, applied: &Applied, backups_due: Option<Duration>) -> Duration {
        let look = if !serving || applied.held_back.is_some() {
            // (Nothing watches the user's backup claim, nor the nodes: a problem with them is
            // looked at again.)
            NOT_YET
        } else if self.pg.spec.backup.is_some() {
            LOOK_AGAIN_ARCHIVING
        } else {
            LOOK_AGAIN
        };
        backups_due.map_or(look, |next| next.min(look))
    }
}

/// What the status is built from.
fn seen(
    pass: &Pass,
    (instance, members, primacy): (InstanceState, Vec<noops_api::postgres::MemberStatus>, Primacy),
    observed: &Observed,
    checked: &Checked,
    applied: Applied,
    made: &InDatabase,
    summary: BackupsSummary<PostgreSQLReason>,
) -> StatusFacts {
    let pod = observed.children.instance.as_deref();
    StatusFacts {
        instance,
        instance_pod: pod.and_then(|p| p.metadata.name.clone()),
        node: pod.and_then(observe::node),
        password_problem: checked.password.as_ref().err().cloned(),
        password_version: made.password_version.clone(),
        database_ready: made.database_ready,
        node_port: applied
            .live_service
            .as_ref()
            .and_then(|s| s.spec.as_ref()?.ports.as_ref()?.first()?.node_port)
            .filter(|_| pass.pg.spec.service.type_ == noops_api::postgres::ServiceType::NodePort),
        restores_from: checked
            .plan
            .as_ref()
            .ok()
            .and_then(|p| p.restore.as_ref())
            .map(|r| r.backup.clone()),
        initdb_refused: checked.plan.as_ref().is_ok_and(|p| p.initdb_refused.is_some()),
        plan_problem: checked.plan.as_ref().err().cloned(),
        held_back: applied.held_back.or(applied.refused),
        schedule_problem: checked.schedule_problem.clone(),
        service_missing: applied.live_service.is_none(),
        archiver: made.archiver.clone(),
        restore: made.restore.clone(),
        // Written every so often, not at every byte: a status write wakes the next pass.
        restoring: progress::paced(
            pass.pg.status.as_ref().and_then(|s| s.restoring.as_ref()),
            made.restoring.clone(),
            pass.now,
        ),
        backups: summary,
        bootstrap_source: checked.bootstrap_source.clone(),
        node_lost: applied.node_lost,
        members,
        primary: primacy.primary,
        failover: primacy.failover,
        primary_lost: primacy.no_replica,
        synchronous: made.synchronous.clone(),
        apart: None,
    }
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
                reason: PostgreSQLReason::SpecRejected,
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
            (
                None,
                crate::core::confirm::get(&api, name, "destination-before-change").await?,
            )
        }
    };
    Ok(destination::problem(&wanted, secret.as_deref(), claim.as_ref()))
}

/// Why no node could hold the instance's pod as the spec sizes it, if none could, from the
/// Node cache; looked at only when the spec sets resources and the StatefulSet is about to
/// change.
fn check_placement(pg: &PostgreSQL, ctx: &Context) -> Option<PlanProblem> {
    let resources = pg
        .spec
        .resources
        .as_ref()
        .filter(|r| !placement::requests(r).is_empty())?;
    let nodes: Vec<Node> = ctx.caches.nodes.state().iter().map(|n| (**n).clone()).collect();
    placement::no_node_fits(Some(resources), &nodes)
}

/// Why the node, claims and volumes of an instance stuck on a lost node are read from the API:
/// what `node_loss.rs` decides deletes claims.
const NODE_LOSS: &str = "node-loss-before-delete";

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
    let node = crate::core::confirm::get(&Api::<Node>::all(ctx.client.clone()), &node_name, NODE_LOSS).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let volume_of = |claim: Option<PersistentVolumeClaim>| async {
        match claim.and_then(|c| c.spec?.volume_name) {
            Some(name) => crate::core::confirm::get(&volumes, &name, NODE_LOSS).await,
            None => Ok(None),
        }
    };
    let pod_name = pod.metadata.name.clone().unwrap_or_else(|| names.instance());
    let data_claim = crate::core::confirm::get(&claims, &names.data_claim_of(&pod_name), NODE_LOSS).await?;
    let data_volume = volume_of(data_claim.clone()).await?;
    let backup_claim = pg
        .spec
        .backup
        .as_ref()
        .and_then(Destination::of_spec)
        .and_then(|d| d.claim().map(str::to_string));
    let backups_pinned = match backup_claim {
        Some(claim) => volume_of(crate::core::confirm::get(&claims, &claim, NODE_LOSS).await?)
            .await?
            .is_some_and(|pv| node_loss::pinned_to(&pv, &node_name)),
        None => false,
    };
    let restore_from = elsewhere(pg, plan, backups_pinned.then_some(node_name.as_str()));
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
    let note = match decision {
        NodeLoss::Fine => return Ok(None),
        NodeLoss::WaitForNode { node, why } => {
            return Ok(Some(format!(
                "node {node} is not ready, with the instance's volume on its disk; {why}, so the instance waits for the node to come back"
            )));
        }
        NodeLoss::ForceDelete { node } => {
            delete_if_present(&pods, &pod_name, &force).await?;
            Announcement::warning(
                "PodForceDeleted",
                format!(
                    "node {node} is not ready and did not stop pod {pod_name}: deleted it, so that the StatefulSet starts it again, on its volume"
                ),
            )
        }
        NodeLoss::GiveUpVolume { node } => {
            if data_claim.is_some_and(|c| c.metadata.deletion_timestamp.is_none()) {
                // The volume itself is kept: should the node come back, what it holds (the
                // commits not archived yet) can still be salvaged by hand.
                if let Some(pv) = data_volume.as_ref().and_then(|pv| pv.metadata.name.clone()) {
                    let retain = serde_json::json!({ "spec": { "persistentVolumeReclaimPolicy": "Retain" } });
                    let merge = kube::api::Patch::Merge(&retain);
                    volumes.patch(&pv, &kube::api::PatchParams::default(), &merge).await?;
                }
                delete_if_present(&claims, &names.data_claim_of(&pod_name), &DeleteParams::default()).await?;
                crash::point("postgres node loss: volume given up, pod not deleted");
            }
            delete_if_present(&pods, &pod_name, &force).await?;
            let kept = data_volume.as_ref().and_then(|pv| pv.metadata.name.clone());
            Announcement::warning("VolumeGivenUp", volume_given_up(pg, &node, &restore_from, kept))
        }
    };
    ctx.core.events.tell(&pg.object_ref(&()), note).await;
    Ok(None)
}

/// What could make the database again away from its lost node: a restore of the backup the
/// plan names (not on that node's disk: `backups_on` names the node if they are), with the WAL
/// archived up to the moment the node died; or a new database, for one that never served.
/// Otherwise why not. Pure.
fn elsewhere(
    pg: &PostgreSQL,
    plan: &std::result::Result<InstancePlan, PlanProblem>,
    backups_on: Option<&str>,
) -> std::result::Result<Elsewhere, String> {
    let status = pg.status.clone().unwrap_or_default();
    let archiving_failed = match (&status.last_failed_time, &status.last_archived_time) {
        (Some(failed), Some(archived)) => failed.0 > archived.0,
        (Some(_), None) => true,
        _ => false,
    };
    match plan.as_ref().ok().and_then(|p| p.restore.as_ref()) {
        // It never served (the node died during its first initdb): nothing on the volume to lose.
        None if status.system_identifier.is_none() => Ok(Elsewhere::NewDatabase),
        None => Err("the database has no base backup to restore from elsewhere".to_string()),
        Some(_) if archiving_failed => Err(format!(
            "its WAL archiving was failing (segment {}): a restore would lose the commits since",
            status.last_failed_wal.clone().unwrap_or_default()
        )),
        Some(_) if backups_on.is_some() => Err(format!(
            "its backups are on node {}'s disk too",
            backups_on.unwrap_or_default()
        )),
        Some(restore) => Ok(Elsewhere::Restore(restore.backup.clone())),
    }
}

/// The Event note of a volume given up on lost node `node`: what the new instance starts from,
/// what is lost, and the volume `kept` for salvage.
fn volume_given_up(
    pg: &PostgreSQL,
    node: &str,
    restore_from: &std::result::Result<Elsewhere, String>,
    kept: Option<String>,
) -> String {
    let kept = kept.unwrap_or_default();
    match restore_from {
        Ok(Elsewhere::Restore(backup)) => format!(
            "node {node} is not ready, with the instance's volume on its disk: gave the volume up; the instance starts on another node and restores backup {backup} and the archived WAL (commits after the last archived segment, {}, are lost). The volume {kept} is kept (Retain): delete it once nothing is to be salvaged from it",
            pg.status
                .as_ref()
                .and_then(|s| s.last_archived_wal.clone())
                .unwrap_or_else(|| "none".into()),
        ),
        _ => format!(
            "node {node} is not ready, with the instance's volume on its disk: the database never served, so nothing is lost; gave the volume up, and the instance is made anew on another node. The volume {kept} is kept (Retain): delete it"
        ),
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
    // InDatabase by an earlier pass the cache has not seen yet: use the one that is there.
    let made = crate::core::confirm::read(api, &names.superuser_secret(), "secret-made-meanwhile").await?;
    secrets::superuser_password(&made)
        .ok_or_else(|| Error::Blocked(format!("Secret {} has no password", names.superuser_secret())))
}

impl Pass<'_> {
    /// The connection Secret, once the instance is known. (Paused, the database keeps its
    /// password: so does the connection Secret. Refused before anything was made, there is no
    /// database to connect to.)
    async fn write_connection_secret(
        &self,
        children: &observe::Children,
        password: &std::result::Result<Password, PasswordProblem>,
    ) -> Result<()> {
        let (false, Ok(password)) = (self.hands_off, password) else {
            return Ok(());
        };
        let pg = self.pg;
        let mut secret = secrets::connection_secret(&self.names, &self.owner, &pg.spec.db, &pg.spec.user, password);
        stamp(&mut secret);
        if !up_to_date(&secret, children.connection_secret.as_deref()) {
            apply(&self.api::<Secret>(), &self.names.connection_secret(), &secret)
                .await
                .during(Stage::Apply)?;
        }
        Ok(())
    }
}
