//! A KubernetesControlPlane pass as the core's stages: observe → validate → plan → apply
//! (build and apply the children) → status, each once, in that order (`core::stages` drives
//! them).

use std::sync::Arc;
use std::time::Duration;

use noops_api::control_plane::{KubernetesControlPlane, KubernetesControlPlaneReason, KubernetesControlPlaneStatus};
use tracing::info;

use super::KubernetesControlPlanes;
use super::certificates::{Addresses, Certificate, Servers, server_url, tenant_service_ip};
use super::context::Context;
use super::endpoint;
use super::names::Names;
use super::plan::{Plan, Step};
use super::status::StatusFacts;
use super::versions::Release;
use super::{act, desired, observe, plan, ranges, spread, status};
use crate::core::apply::controller_reference;
use crate::core::events::Announcement;
use crate::core::pki::NOT_AFTER_ANNOTATION;
use crate::core::stages::{Applied, Observed, Refusal, Report, Stages};
use crate::core::{DuringStage, Error, Result, Stage};

/// How soon a control plane whose range is taken looks at this cluster's ranges again.
const RANGES_RECHECK: Duration = Duration::from_secs(60);

/// What a pass sees: its children and their facts, a range of its networking this cluster
/// uses (checked until it has served), and when its first certificate is due.
pub struct Seen {
    observation: observe::Observation,
    range_taken: Option<String>,
    renew_in: Option<Duration>,
}

impl Stages for KubernetesControlPlanes {
    type Observation = Seen;
    type Plan = Plan;
    type Applied = Done;

    /// Its children from the caches. Until it has served, the tenant's ranges must stay clear
    /// of this cluster's (they are fixed after that): those are read from the API.
    async fn observe(
        kcp: Arc<KubernetesControlPlane>,
        ctx: &Context,
        now: jiff::Timestamp,
    ) -> Result<Observed<KubernetesControlPlane, Seen>> {
        let names = Names::of(&kcp);
        let observation = observe::observe(&kcp, &names, ctx, now);
        let range_taken = if ranges::must_check(&kcp, observation.live.etcd.is_some()) {
            let taken = ranges::read_taken(&ctx.client).await?;
            ranges::overlap(&kcp.spec.networking, &taken)
        } else {
            None
        };
        let renew_in = next_renewal(&observation.live.secrets, now, ctx.certificate_lifetime);
        let seen = Seen {
            observation,
            range_taken,
            renew_in,
        };
        Ok(Observed::new(kcp, seen))
    }

    /// A version it cannot run; a range this cluster uses (looked at again now and then: this
    /// cluster's ranges may change): a control plane with a range taken is not made.
    fn validate(
        kcp: &KubernetesControlPlane,
        seen: &Seen,
    ) -> std::result::Result<(), Refusal<KubernetesControlPlaneReason>> {
        if let Err(error) = target(kcp) {
            return Err(Refusal::new(KubernetesControlPlaneReason::UnsupportedVersion, error));
        }
        match &seen.range_taken {
            Some(taken) => Err(Refusal::looked_at_again(
                KubernetesControlPlaneReason::RangeTaken,
                Error::InvalidSpec(taken.clone()),
                RANGES_RECHECK,
            )),
            None => Ok(()),
        }
    }

    fn refused(
        kcp: &KubernetesControlPlane,
        seen: &Seen,
        refusal: &Refusal<KubernetesControlPlaneReason>,
        now: jiff::Timestamp,
    ) -> Report<KubernetesControlPlaneStatus> {
        let Ok(target) = target(kcp) else {
            return Report::of(status::refused(kcp, refusal.reason, &refusal.error.to_string(), now));
        };
        let plan = plan::plan(target, &seen.observation.facts);
        let status = status_after(kcp, seen, &plan, &not_applied(kcp, seen), now);
        Report {
            news: announcements(kcp.status.as_ref(), &status, &plan, &[]),
            next: next_look(seen),
            ..Report::of(status)
        }
    }

    fn plan(kcp: &KubernetesControlPlane, seen: &Seen, _: jiff::Timestamp) -> Result<Plan> {
        Ok(plan::plan(target(kcp)?, &seen.observation.facts))
    }

    async fn apply(kcp: &KubernetesControlPlane, seen: &Seen, plan: &Plan, ctx: &Context) -> Result<Applied<Done>> {
        let owner = controller_reference(kcp)
            .ok_or_else(|| Error::Internal("the KubernetesControlPlane has no uid yet".into()))?;
        let names = Names::of(kcp);
        let done = apply(
            ctx,
            kcp,
            &names,
            plan,
            &seen.observation,
            &owner,
            jiff::Timestamp::now(),
        )
        .await?;
        Ok(Applied::Done(done))
    }

    fn status(
        kcp: &KubernetesControlPlane,
        seen: &Seen,
        plan: &Plan,
        applied: Option<&Done>,
        now: jiff::Timestamp,
    ) -> Report<KubernetesControlPlaneStatus> {
        let paused = not_applied(kcp, seen);
        let applied = applied.unwrap_or(&paused);
        let status = status_after(kcp, seen, plan, applied, now);
        // What the pass did (certificates issued, a replica moved) is told whatever becomes of
        // the status write: the next pass does neither again and would not tell it.
        let done = issued_news(&applied.issued)
            .into_iter()
            .chain(applied.moved.clone())
            .collect();
        let news = announcements(kcp.status.as_ref(), &status, plan, &[]);
        Report {
            status,
            done,
            news,
            next: next_look(seen),
        }
    }
}

/// When to look again if nothing wakes the control plane: a certificate due, a pod that
/// waits counting as stuck, pods that share a node (a node that comes back wakes nothing here).
fn next_look(seen: &Seen) -> Option<Duration> {
    let recheck_spread = seen.observation.spread.together().map(|_| spread::RECHECK);
    [seen.renew_in, seen.observation.recheck_after, recheck_spread]
        .into_iter()
        .flatten()
        .min()
}

/// The release the spec asks for, or why it names none.
fn target(kcp: &KubernetesControlPlane) -> Result<Release> {
    Release::of(&kcp.spec.version)
        .ok_or_else(|| Error::InvalidSpec(format!("version {:?} is not a Kubernetes version", kcp.spec.version)))
}

/// The status of a pass that saw `seen`, planned `plan` and applied `applied`.
fn status_after(
    kcp: &KubernetesControlPlane,
    seen: &Seen,
    plan: &Plan,
    applied: &Done,
    now: jiff::Timestamp,
) -> KubernetesControlPlaneStatus {
    let names = Names::of(kcp);
    let facts = StatusFacts {
        kcp,
        names: &names,
        plan,
        observation: &seen.observation,
        service_ip: applied.service_ip,
        external_endpoint: applied.external.clone(),
        range_taken: seen.range_taken.as_deref(),
    };
    status::build(&facts, now)
}

/// What a pass that applies nothing leaves: the endpoints as the live Service gives them.
fn not_applied(kcp: &KubernetesControlPlane, seen: &Seen) -> Done {
    let service = seen.observation.live.service.as_ref();
    Done {
        service_ip: service.and_then(act::cluster_ip),
        external: endpoint::external(
            &kcp.spec.service,
            service,
            kcp.status.as_ref().and_then(|s| s.external_endpoint.as_deref()),
        )
        .map(|(_, url)| url),
        issued: Vec::new(),
        moved: None,
    }
}

/// What a pass that applies leaves for the status and the Events.
pub struct Done {
    /// The control plane Service's cluster IP, once it has one.
    service_ip: Option<std::net::IpAddr>,
    /// The URL the API servers are reached at from outside, if the Service gives one.
    external: Option<String>,
    /// The certificates issued this pass.
    issued: Vec<Certificate>,
    /// A replica moved off a node it shared.
    moved: Option<Announcement>,
}

/// Apply: the EtcdCluster and the Service, the certificate authorities, the certificates due
/// and, once every certificate is there, the Deployments; then a replica moved apart.
async fn apply(
    ctx: &Context,
    kcp: &KubernetesControlPlane,
    names: &Names,
    plan: &Plan,
    observation: &observe::Observation,
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    now: jiff::Timestamp,
) -> Result<Done> {
    let previous_external = kcp.status.as_ref().and_then(|s| s.external_endpoint.clone());
    let etcd = desired::etcd_cluster(kcp, names, &plan.etcd_version, owner);
    let service = desired::service(kcp, names, owner);
    let applied = act::apply_etcd_and_service(ctx, names, &etcd, &service, &observation.live)
        .await
        .during(Stage::Apply)?;
    let service_ip = act::cluster_ip(&applied);
    let external =
        endpoint::external(&kcp.spec.service, Some(&applied), previous_external.as_deref()).map(|(_, url)| url);
    let mut issued = Vec::new();
    let mut moved = None;
    let authorities = act::ensure_authorities(ctx, names, &observation.live, owner, now)
        .await
        .during(Stage::Apply)?;
    if let Some(ip) = service_ip {
        let addresses = Addresses {
            service_ip: Some(ip),
            tenant_service_ip: tenant_service_ip(&kcp.spec.networking.service_cidr),
            dns_domain: kcp.spec.networking.dns_domain.clone(),
            extra: endpoint::extra_names(&kcp.spec.service, Some(&applied), previous_external.as_deref()),
        };
        let servers = Servers {
            internal: server_url(ip),
            external: external.clone(),
        };
        issued = act::issue_due(
            ctx,
            names,
            &observation.live,
            &authorities,
            &addresses,
            &servers,
            owner,
            now,
        )
        .await
        .during(Stage::Apply)?;
        // A pod mounting a certificate that is not there yet cannot start: the Deployments
        // follow once their certificates are in the cache (the next pass).
        if issued.is_empty() {
            act::apply_deployments(ctx, kcp, names, plan, &observation.live, owner)
                .await
                .during(Stage::Apply)?;
            moved = move_apart(ctx, kcp, names, plan, &observation.spread).await?;
        }
    }
    Ok(Done {
        service_ip,
        external,
        issued,
        moved,
    })
}

/// Evicts one pod of a component whose pods share a node another could take (spread.rs),
/// once every part runs the release asked for; what to tell of it.
async fn move_apart(
    ctx: &Context,
    kcp: &KubernetesControlPlane,
    names: &Names,
    plan: &Plan,
    spread: &spread::Spread,
) -> Result<Option<Announcement>> {
    if plan.step != Step::Done {
        return Ok(None);
    }
    let Some((component, pod, from, to)) = spread.pod_to_move(|c| desired::replicas(kcp, c)) else {
        return Ok(None);
    };
    if !act::evict_to_spread(ctx, names, &pod).await.during(Stage::Apply)? {
        return Ok(None);
    }
    info!(%pod, %from, %to, "evicted a replica that shared its node, so that its replacement runs apart");
    Ok(Some(Announcement::normal(
        "ReplicaMoved",
        format!(
            "evicted {pod} from node {from}, which it shared with another {}: its replacement prefers node {to}",
            component.part()
        ),
    )))
}

/// When the first leaf certificate is due again (a third of its lifetime before it expires).
fn next_renewal(
    secrets: &std::collections::BTreeMap<String, k8s_openapi::api::core::v1::Secret>,
    now: jiff::Timestamp,
    lifetime: Duration,
) -> Option<Duration> {
    let margin = jiff::SignedDuration::try_from(lifetime / 3).ok()?;
    secrets
        .values()
        .filter_map(|s| s.metadata.annotations.as_ref()?.get(NOT_AFTER_ANNOTATION))
        .filter_map(|t| t.parse::<jiff::Timestamp>().ok())
        .map(|not_after| Duration::try_from(not_after - margin - now).unwrap_or(Duration::ZERO))
        .min()
        .map(|d| d.max(Duration::from_secs(1)))
}

/// The certificates a pass issued, as an Event.
fn issued_news(issued: &[Certificate]) -> Option<Announcement> {
    (!issued.is_empty()).then(|| {
        let which: Vec<&str> = issued.iter().map(|c| c.describe()).collect();
        Announcement::normal("CertificatesIssued", format!("issued {}", which.join(", ")))
    })
}

/// What the pass did that is worth an Event: certificates issued, an upgrade started, moved to
/// its next step or finished, the control plane Ready (again), a newly degraded
/// state. Pure.
fn announcements(
    previous: Option<&KubernetesControlPlaneStatus>,
    now: &KubernetesControlPlaneStatus,
    plan: &Plan,
    issued: &[Certificate],
) -> Vec<Announcement> {
    let mut out: Vec<Announcement> = issued_news(issued).into_iter().collect();
    let was = previous.and_then(|s| s.upgrade.as_ref());
    match (was, now.upgrade.as_ref()) {
        (None, Some(u)) => out.push(Announcement::normal(
            "UpgradeStarted",
            format!("upgrading from {} to {}: etcd first, then the API servers one by one, then the controller-manager and the scheduler", u.from, u.to),
        )),
        (Some(w), Some(u)) if w.step != u.step => {
            let now_moving = match plan.step {
                Step::Etcd => format!("etcd moves to {}", plan.etcd_version),
                Step::ApiServer => "the API servers move, one at a time".to_string(),
                Step::Controllers => "the controller-manager and the scheduler move".to_string(),
                Step::Done => "every part has moved".to_string(),
            };
            out.push(Announcement::normal("UpgradeStep", format!("upgrade to {}: {now_moving}", u.to)));
        }
        (Some(w), None) if plan.step == Step::Done => out.push(Announcement::normal(
            "Upgraded",
            format!("every part runs {} (from {})", plan.target.kubernetes, w.from),
        )),
        _ => {}
    }
    let is = |s: Option<&KubernetesControlPlaneStatus>, type_: &str| {
        s.is_some_and(|s| s.conditions.iter().any(|c| c.type_ == type_ && c.status == "True"))
    };
    if !is(previous, "Ready") && is(Some(now), "Ready") {
        out.push(Announcement::normal(
            "ControlPlaneReady",
            format!(
                "Kubernetes {} serves at {}",
                plan.target.kubernetes,
                now.endpoint.clone().unwrap_or_default()
            ),
        ));
    }
    let degraded = now
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded" && c.status == "True");
    if let Some(c) = degraded.filter(|_| !is(previous, "Degraded")) {
        out.push(Announcement::warning(c.reason.clone(), c.message.clone()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use noops_api::control_plane::UpgradeStatus;

    fn at(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn condition(type_: &str, status: bool, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: if status { "True" } else { "False" }.into(),
            reason: reason.into(),
            message: format!("{reason} said"),
            observed_generation: Some(1),
            last_transition_time: Time(at(0)),
        }
    }

    fn upgrade(step: &str) -> Option<UpgradeStatus> {
        Some(UpgradeStatus {
            from: "1.33.13".into(),
            to: "1.34.4".into(),
            step: step.into(),
            started_at: Time(at(0)),
        })
    }

    fn reasons(list: Vec<Announcement>) -> Vec<String> {
        list.into_iter().map(|a| a.reason).collect()
    }

    #[test]
    fn events_say_what_changed_once() {
        let plan_at = |step: Step| Plan {
            target: Release::of("1.34").unwrap(),
            etcd_version: "3.6.16".into(),
            api_server: None,
            controllers: None,
            step,
            waiting_for: None,
        };
        let before = KubernetesControlPlaneStatus::default();
        let ready = KubernetesControlPlaneStatus {
            conditions: vec![condition("Ready", true, "Ready")],
            ..Default::default()
        };
        let issued = [Certificate::ApiServer, Certificate::Admin];
        let first = announcements(Some(&before), &ready, &plan_at(Step::Done), &issued);
        assert_eq!(reasons(first), vec!["CertificatesIssued", "ControlPlaneReady"]);
        assert!(
            reasons(announcements(Some(&ready), &ready, &plan_at(Step::Done), &[])).is_empty(),
            "nothing new"
        );

        let started = KubernetesControlPlaneStatus {
            upgrade: upgrade("Etcd"),
            ..ready.clone()
        };
        assert_eq!(
            reasons(announcements(Some(&ready), &started, &plan_at(Step::Etcd), &[])),
            vec!["UpgradeStarted"]
        );
        let stepped = KubernetesControlPlaneStatus {
            upgrade: upgrade("APIServer"),
            ..ready.clone()
        };
        let step = announcements(Some(&started), &stepped, &plan_at(Step::ApiServer), &[]);
        assert_eq!(step[0].note, "upgrade to 1.34.4: the API servers move, one at a time");
        assert_eq!(
            reasons(announcements(Some(&stepped), &ready, &plan_at(Step::Done), &[])),
            vec!["Upgraded"]
        );

        let degraded = KubernetesControlPlaneStatus {
            conditions: vec![
                condition("Ready", false, "UpgradeStalled"),
                condition("Degraded", true, "UpgradeStalled"),
            ],
            ..Default::default()
        };
        let told = announcements(Some(&ready), &degraded, &plan_at(Step::ApiServer), &[]);
        assert_eq!(reasons(told), vec!["UpgradeStalled"]);
        assert!(
            announcements(Some(&degraded), &degraded, &plan_at(Step::ApiServer), &[]).is_empty(),
            "said once"
        );
    }
}
