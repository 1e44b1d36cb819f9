//! A Machine pass as the core's stages: observe → plan (admission, pure) → apply (make the VM,
//! renew certificates, record the VM) → status, each once, in that order, and one write of the
//! Machine: the pass that records its new VM (`spec.providerID`) ends there, and the pass that
//! change wakes writes the status. A Machine carries a finalizer: its deletion is a pass of its
//! own (`clean_up`: cordon, drain, delete the Node, delete the VM), going on from what the
//! status and the tenant say.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource};
use noops_api::machine::{Machine, MachinePhase, MachineStatus};
use serde_json::json;
use tracing::info;

use super::Machines;
use super::bootstrap;
use super::context::Context;
use super::drain::drain_pass;
use super::names::{FINALIZER, Names};
use super::plan::{self, Admission, NodeView};
use super::provider::{Provider, VmSpec, VmState};
use super::status::{self, DRAINING_SUCCEEDED, Deletion, StatusFacts};
use super::tenant::{self, Tenant};
use crate::control_plane::certificates::{Authority, tenant_service_ip};
use crate::control_plane::names::Names as ControlPlaneNames;
use crate::core::apply::{apply, controller_reference, create_if_missing};
use crate::core::events::Announcement;
use crate::core::pki::Ca;
use crate::core::stages::{Applied, Observed, Report, Stages};
use crate::core::{DuringStage, Error, Result, Stage, crash};

/// How soon a machine is looked at again when nothing wakes it: its VM pod, its Node (from the
/// tenant's watch), its control plane and its Secrets do, so these are only a safety net.
const MAKING: Duration = Duration::from_secs(10);
const NOT_READY: Duration = Duration::from_secs(30);
const RUNNING: Duration = Duration::from_secs(120);
const WAITING: Duration = Duration::from_secs(60);

/// What one pass sees.
pub struct Observation {
    cluster: Option<noops_api::KubernetesControlPlane>,
    vm: VmState,
    bootstrap: Option<Arc<Secret>>,
    tenant: Option<Arc<Tenant>>,
    node: NodeView,
}

/// Where a pass reads the machine's Node.
#[derive(Clone, Copy, PartialEq, Eq)]
enum NodeFrom {
    /// The tenant's Node watch.
    Cache,
    /// The tenant's API: a deletion acts on the Node, and must tell a tenant that does not
    /// answer from one whose cache is merely old.
    Api,
}

/// What a pass sees of the machine's cluster, VM, bootstrap Secret and Node (read from
/// `node_from`).
async fn look(machine: &Machine, names: &Names, ctx: &Context, node_from: NodeFrom) -> Result<Observation> {
    let cluster = ctx
        .control_planes
        .get(&ObjectRef::new(&names.cluster).within(&names.namespace))
        .map(|c| (*c).clone());
    if cluster.as_ref().is_none_or(|c| c.metadata.deletion_timestamp.is_some()) {
        ctx.tenants.forget(&names.namespace, &names.cluster);
    }
    // A VM made once that the cache does not hold fails the machine (its set replaces it):
    // confirmed with the provider first, since the cache may not hold one made a moment ago.
    // Once the status says Failed it was confirmed: a VM is never made again under a machine.
    let failed = machine.status.as_ref().and_then(|s| s.phase) == Some(MachinePhase::Failed);
    let vm = match ctx.provider.observe(names) {
        VmState::Missing if machine.spec.provider_id.is_some() && !failed => {
            ctx.provider.confirm(names).await.during(Stage::Observe)?
        }
        vm => vm,
    };
    let bootstrap = ctx
        .secrets
        .get(&ObjectRef::new(&names.bootstrap_secret()).within(&names.namespace));
    // A control plane that has not served yet is not asked.
    let admin = cluster
        .as_ref()
        .and_then(|c| c.status.as_ref())
        .filter(|s| s.version.is_some())
        .and_then(|s| s.admin_kubeconfig_secret.clone())
        .and_then(|s| ctx.secrets.get(&ObjectRef::new(&s).within(&names.namespace)));
    let tenant = match admin {
        Some(secret) => ctx.tenants.get(&names.namespace, &names.cluster, &secret).await.ok(),
        None => None,
    };
    let read = match (&tenant, node_from) {
        (None, _) => None,
        (Some(t), NodeFrom::Cache) => Some(t.node(&names.node()).await),
        (Some(t), NodeFrom::Api) => Some(tenant::node(&t.client, &names.node()).await.map_err(|e| e.to_string())),
    };
    let node = match read {
        None => NodeView::NotAsked,
        Some(Ok(Some(node))) => NodeView::Present(Box::new(node)),
        Some(Ok(None)) => NodeView::Missing,
        Some(Err(why)) => NodeView::Unreachable(why),
    };
    Ok(Observation {
        cluster,
        vm,
        bootstrap,
        tenant,
        node,
    })
}

/// What a pass over a machine not being deleted decides (pure).
pub struct MachinePlan {
    admission: Admission,
    /// Make its VM: admitted, none there, none made before under this machine.
    make_vm: bool,
}

/// What a pass's apply did, for its status.
pub struct Done {
    /// When the certificates are due again, if they are watched.
    renewal_due: Option<Duration>,
    done: Vec<Announcement>,
}

impl Stages for Machines {
    type Observation = Observation;
    type Plan = MachinePlan;
    type Applied = Done;
    const FINALIZER: Option<&'static str> = Some(FINALIZER);

    async fn observe(
        machine: Arc<Machine>,
        ctx: &Context,
        _: jiff::Timestamp,
    ) -> Result<Observed<Machine, Observation>> {
        let seen = look(&machine, &Names::of(&machine), ctx, NodeFrom::Cache).await?;
        Ok(Observed::new(machine, seen))
    }

    /// Whether its cluster admits it (one that cannot says so in its status, and waits for a
    /// change); made once, from nothing: a VM gone after it was made is a failed machine.
    fn plan(machine: &Machine, seen: &Observation, _: jiff::Timestamp) -> Result<MachinePlan> {
        let admission = plan::admit(machine, seen.cluster.as_ref());
        let make_vm = matches!(admission, Admission::Allowed(_))
            && seen.vm == VmState::Missing
            && machine.spec.provider_id.is_none();
        Ok(MachinePlan { admission, make_vm })
    }

    async fn apply(machine: &Machine, seen: &Observation, plan: &MachinePlan, ctx: &Context) -> Result<Applied<Done>> {
        let names = Names::of(machine);
        let now = jiff::Timestamp::now();
        if let (true, Admission::Allowed(release), Some(cluster)) = (plan.make_vm, &plan.admission, &seen.cluster) {
            make_machine(machine, ctx, &names, seen, release, cluster, now).await?;
        }
        // A machine's certificates are issued again before they expire, or when its CA changed:
        // the VM's mounted files follow and its agent and kube-proxy read them again.
        let renewal = match (&seen.bootstrap, &seen.vm) {
            (_, VmState::Missing) => None,
            (Some(current), _) if !plan.make_vm => cluster_ca(ctx, &names).map(|ca| (current, ca)),
            _ => None,
        };
        let mut done = Vec::new();
        if let Some((current, ca)) = &renewal
            && bootstrap::needs_renewal(current, &ca.cert, now, ctx.certificate_lifetime)
        {
            renew_certificates(machine, ctx, &names, ca, now).await?;
            let note = "issued the machine's certificates again; its agent and kube-proxy read them from its files";
            done.push(Announcement::normal("CertificatesRenewed", note));
        }
        if machine.spec.provider_id.is_none() && (plan.make_vm || seen.vm != VmState::Missing) {
            // (No status follows in this pass: what it did is told now.)
            ctx.tell(machine, done).await;
            let api: Api<Machine> = Api::namespaced(ctx.client.clone(), &names.namespace);
            let body = json!({ "spec": { "providerID": names.provider_id() } });
            api.patch(&names.machine, &PatchParams::default(), &Patch::Merge(body))
                .await?;
            // One write of the machine a pass: the pass this change wakes writes the status.
            info!(provider_id = %names.provider_id(), "recorded the machine's VM; its status follows");
            return Ok(Applied::Again {
                after: MAKING,
                why: "the machine's VM is recorded; the pass it wakes writes the status",
            });
        }
        // Back when the certificates are due (the Secret just renewed wakes the machine itself).
        let renewal_due = renewal
            .and_then(|(current, _)| bootstrap::due_in(current, now, ctx.certificate_lifetime))
            .map(|d| d.max(Duration::from_secs(1)));
        Ok(Applied::Done(Done { renewal_due, done }))
    }

    fn status(
        machine: &Machine,
        seen: &Observation,
        plan: &MachinePlan,
        applied: Option<&Done>,
        now: jiff::Timestamp,
    ) -> Report<MachineStatus> {
        let status = status::build(
            &StatusFacts {
                machine,
                admission: &plan.admission,
                vm: &seen.vm,
                node: &seen.node,
                deletion: None,
            },
            now,
        );
        let look_again = match status.phase {
            Some(MachinePhase::Running) if seen.node.ready() => RUNNING,
            Some(MachinePhase::Running) => NOT_READY,
            Some(MachinePhase::Provisioning | MachinePhase::Provisioned) => MAKING,
            Some(MachinePhase::Failed) => WAITING * 4,
            _ => WAITING,
        };
        let due = applied.and_then(|a| a.renewal_due);
        Report {
            news: announcements(machine.status.as_ref(), &status),
            status,
            done: applied.map(|a| a.done.clone()).unwrap_or_default(),
            next: Some(due.map_or(look_again, |d| d.min(look_again))),
        }
    }

    async fn clean_up(machine: Arc<Machine>, ctx: &Context) -> Result<Action> {
        remove(machine, ctx).await
    }
}

/// Makes a machine: the tenant's role for machines, its bootstrap Secret (certificates issued
/// by its cluster's CA) and its VM, at the admitted release.
async fn make_machine(
    machine: &Machine,
    ctx: &Context,
    names: &Names,
    observation: &Observation,
    release: &crate::control_plane::versions::Release,
    cluster: &noops_api::KubernetesControlPlane,
    now: jiff::Timestamp,
) -> Result<()> {
    let tenant = observation
        .tenant
        .as_ref()
        .ok_or_else(|| Error::Blocked(format!("control plane {} does not answer yet", names.cluster)))
        .during(Stage::Apply)?;
    tenant.grant_machine_role().await.during(Stage::Apply)?;
    let owner = controller_reference(machine)
        .ok_or_else(|| Error::Internal("the Machine has no uid yet".into()))
        .during(Stage::Apply)?;
    if observation.bootstrap.is_none() {
        let secret = bootstrap_secret(ctx, names, &owner, now).during(Stage::Apply)?;
        let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
        create_if_missing(&api, &secret).await.during(Stage::Apply)?;
        crash::point("machine: bootstrap Secret made, VM not yet");
    }
    let networking = &cluster.spec.networking;
    let spec = VmSpec {
        names: names.clone(),
        kubernetes_version: release.kubernetes.clone(),
        image: machine.spec.template.image.clone(),
        flavor: machine.spec.template.flavor.clone(),
        cluster_cidr: networking.pod_cidr.clone(),
        api_service_ip: tenant_service_ip(&networking.service_cidr)
            .ok_or_else(|| Error::InvalidSpec(format!("{} is not a service range", networking.service_cidr)))
            .during(Stage::Apply)?,
        dns_domain: networking.dns_domain.clone(),
        owner,
    };
    ctx.provider.create(&spec).await.during(Stage::Apply)?;
    info!(version = %release.kubernetes, "made the machine's VM");
    crash::point("machine: VM made, providerID not recorded");
    Ok(())
}

/// Issues the machine's certificates again (its bootstrap Secret, applied).
async fn renew_certificates(
    machine: &Machine,
    ctx: &Context,
    names: &Names,
    ca: &Ca,
    now: jiff::Timestamp,
) -> Result<()> {
    let owner = controller_reference(machine)
        .ok_or_else(|| Error::Internal("the Machine has no uid yet".into()))
        .during(Stage::Apply)?;
    let secret = bootstrap::secret(names, ca, &owner, now, ctx.certificate_lifetime)
        .map_err(|e| Error::Certificate(e.to_string()))
        .during(Stage::Apply)?;
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
    apply(&api, &names.bootstrap_secret(), &secret)
        .await
        .during(Stage::Apply)?;
    info!("issued the machine's certificates again");
    Ok(())
}

/// The CA of the machine's cluster, if it has one now.
fn cluster_ca(ctx: &Context, names: &Names) -> Option<Ca> {
    let cluster = ControlPlaneNames {
        control_plane: names.cluster.clone(),
        namespace: names.namespace.clone(),
    };
    let secret = ctx
        .secrets
        .get(&ObjectRef::new(&Authority::Cluster.secret(&cluster)).within(&names.namespace))?;
    Ca::of(&secret, &Authority::Cluster.common_name(&cluster)).ok()
}

/// The bootstrap Secret of a machine, issued by its cluster's CA.
fn bootstrap_secret(
    ctx: &Context,
    names: &Names,
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    now: jiff::Timestamp,
) -> Result<Secret> {
    let ca = cluster_ca(ctx, names)
        .ok_or_else(|| Error::Blocked(format!("control plane {} has no usable CA yet", names.cluster)))?;
    bootstrap::secret(names, &ca, owner, now, ctx.certificate_lifetime).map_err(|e| Error::Certificate(e.to_string()))
}

/// A machine being deleted: cordon and drain its Node, delete the Node, then the VM. Says
/// "not yet" (UnderWay) until all of it is done.
async fn remove(machine: Arc<Machine>, ctx: &Context) -> Result<Action> {
    let names = Names::of(&machine);
    let now = jiff::Timestamp::now();
    let observation = look(&machine, &names, ctx, NodeFrom::Api).await?;
    let mut seen = (*machine).clone();
    let previous = seen.status.clone().unwrap_or_default();
    let drain_started = previous.drain_started_at.as_ref().map(|t| t.0).unwrap_or(now);
    let timeout = jiff::SignedDuration::from_secs(machine.spec.template.node_drain_timeout_seconds.max(0));
    let past_timeout = now >= drain_started + timeout;

    let deletion = match (&observation.tenant, &observation.node) {
        // Its cluster is gone or going: nothing to drain it for.
        _ if observation
            .cluster
            .as_ref()
            .is_none_or(|c| c.metadata.deletion_timestamp.is_some()) =>
        {
            Deletion::Removing
        }
        (Some(tenant), NodeView::Present(node)) => drain(&machine, ctx, &names, tenant, node, past_timeout).await?,
        (_, NodeView::Missing) => Deletion::Removing,
        (_, NodeView::Unreachable(why)) if !past_timeout => Deletion::TenantUnreachable(why.clone()),
        (_, NodeView::NotAsked) if !past_timeout && machine.spec.provider_id.is_some() => {
            Deletion::TenantUnreachable("its control plane does not serve".into())
        }
        _ => Deletion::Removing,
    };

    if previous.drain_started_at.is_none() {
        let mut status = previous.clone();
        status.drain_started_at = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
        seen.status = Some(status);
    }
    let admission = plan::admit(&machine, observation.cluster.as_ref());
    let status = status::build(
        &StatusFacts {
            machine: &seen,
            admission: &admission,
            vm: &observation.vm,
            node: &observation.node,
            deletion: Some(&deletion),
        },
        now,
    );
    write_status(ctx, &machine, status).await?;

    match deletion {
        Deletion::Draining(progress) => Err(Error::UnderWay(format!(
            "draining: {} blocked, {} ending",
            progress.blocked.len(),
            progress.ending.len()
        ))),
        Deletion::TenantUnreachable(why) => Err(Error::UnderWay(format!("cannot drain yet: {why}"))),
        Deletion::Removing | Deletion::DrainedWithoutEviction(_) => {
            if let (Some(tenant), NodeView::Present(_)) = (&observation.tenant, &observation.node) {
                tenant::delete_node(&tenant.client, &names.node())
                    .await
                    .during(Stage::Cleanup)?;
                info!(node = %names.node(), "deleted the machine's Node");
                crash::point("machine: Node deleted, VM not yet");
            }
            if ctx.provider.delete(&names).await.during(Stage::Cleanup)? {
                info!("the machine's VM is gone");
                Ok(Action::await_change())
            } else {
                Err(Error::UnderWay("the machine's VM is being removed".into()))
            }
        }
    }
}

/// One drain pass over the machine's Node: cordon it, evict what may go (delete without
/// eviction once the Node has been unreachable past the drain timeout), and say where the
/// deletion stands.
async fn drain(
    machine: &Machine,
    ctx: &Context,
    names: &Names,
    tenant: &Tenant,
    node: &k8s_openapi::api::core::v1::Node,
    past_timeout: bool,
) -> Result<Deletion> {
    let client = &tenant.client;
    // A request the cluster's API server fails (a timeout on a loaded machine, a
    // restart) is tried again in a moment, as an unreachable cluster is: the back-off
    // of a failed pass grows to minutes, and a rollout waits on this machine.
    let cordoned = tenant::cordon(client, node).await.during(Stage::Cleanup);
    if cordoned.is_ok() {
        crash::point("machine: Node cordoned, not drained");
    }
    // A Node that cannot be reached is drained without evictions once the timeout
    // has passed: its pods may be gone with it, and nothing else would end them.
    let force = !crate::core::nodes::ready(node) && past_timeout;
    let drained = match cordoned {
        Ok(()) => drain_pass(client, &names.node(), force).await.during(Stage::Cleanup),
        Err(e) => Err(e),
    };
    let progress = match drained {
        Ok(progress) => progress,
        Err(e) if e.is_transient() && !past_timeout => {
            return Ok(Deletion::TenantUnreachable(format!(
                "its cluster's API server failed a request: {e}"
            )));
        }
        Err(e) => return Err(e),
    };
    if !progress.ending.is_empty() {
        crash::point("machine: pods evicted, status not written");
    }
    if !progress.forced.is_empty() {
        let note = format!(
            "deleted {} without eviction: the Node could not be reached for {}s",
            progress.forced.join(", "),
            machine.spec.template.node_drain_timeout_seconds.max(0)
        );
        ctx.core
            .events
            .tell(&machine.object_ref(&()), Announcement::warning("DrainForced", note))
            .await;
    }
    Ok(match (progress.done(), progress.forced.is_empty()) {
        (true, true) => Deletion::Removing,
        (true, false) => Deletion::DrainedWithoutEviction(progress.forced),
        (false, _) => Deletion::Draining(progress),
    })
}

/// Writes the status if it changed, then Events for what changed.
async fn write_status(ctx: &Context, machine: &Machine, status: MachineStatus) -> Result<()> {
    let told = announcements(machine.status.as_ref(), &status);
    ctx.report(machine, machine.status.as_ref(), &status, told).await
}

/// What changed, as Events: a new phase, a new reason to be degraded, a drain held.
fn announcements(previous: Option<&MachineStatus>, now: &MachineStatus) -> Vec<Announcement> {
    let mut out = Vec::new();
    let condition = |s: Option<&MachineStatus>, type_: &str| {
        s.and_then(|s| s.conditions.iter().find(|c| c.type_ == type_).cloned())
    };
    let previous_phase = previous.and_then(|s| s.phase);
    if let Some(phase) = now.phase
        && Some(phase) != previous_phase
    {
        let note = match phase {
            MachinePhase::Running => format!(
                "Node {} joined at {}",
                now.node_name.clone().unwrap_or_default(),
                now.address.clone().unwrap_or_default()
            ),
            MachinePhase::Failed => now.failure_message.clone().unwrap_or_default(),
            MachinePhase::Provisioned => format!("its VM runs at {}", now.address.clone().unwrap_or_default()),
            MachinePhase::Provisioning => "making its VM".into(),
            MachinePhase::Deleting => "cordoning and draining its Node, then removing it and its VM".into(),
            MachinePhase::Pending => condition(Some(now), noops_api::condition::READY)
                .map(|c| c.message)
                .unwrap_or_default(),
        };
        out.push(match phase {
            MachinePhase::Failed => Announcement::warning(phase.as_str(), note),
            _ => Announcement::normal(phase.as_str(), note),
        });
    }
    for type_ in [noops_api::condition::DEGRADED, DRAINING_SUCCEEDED] {
        let (before, after) = (condition(previous, type_), condition(Some(now), type_));
        if let Some(after) = after
            && after.reason != "AsExpected"
            && after.reason != "Drained"
            && after.reason != "Draining"
            && after.status == if type_ == DRAINING_SUCCEEDED { "False" } else { "True" }
            && before.as_ref().map(|b| (&b.reason, &b.message)) != Some((&after.reason, &after.message))
        {
            out.push(Announcement::warning(after.reason.clone(), after.message.clone()));
        }
    }
    out
}
