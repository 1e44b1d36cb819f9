//! The status of a KubernetesControlPlane, built from the plan and the children as they are:
//! one small function per condition and one for the phase. Pure.

use noops_api::control_plane::KubernetesControlPlanePhase;
use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use noops_api::control_plane::KubernetesControlPlaneReason;
use noops_api::control_plane::{KubernetesControlPlane, KubernetesControlPlaneStatus, UpgradeStatus};

use super::certificates::{Certificate, server_url};
use super::desired::replicas;
use super::names::{Component, Names};
use super::observe::Observation;
use super::plan::{Plan, Step};
use crate::core::conditions::{Decided, merge, with_paused};

/// What the status is built from.
pub struct StatusFacts<'a> {
    pub kcp: &'a KubernetesControlPlane,
    pub names: &'a Names,
    pub plan: &'a Plan,
    pub observation: &'a Observation,
    /// The Service's ClusterIP, once it has one.
    pub service_ip: Option<IpAddr>,
    /// Where clients outside this cluster connect, if that is known.
    pub external_endpoint: Option<String>,
    /// Why the tenant's ranges cannot be used here, if one overlaps this cluster's.
    pub range_taken: Option<&'a str>,
}

impl StatusFacts<'_> {
    fn ready_api_servers(&self) -> i32 {
        let api = self.observation.facts.deployed.get(&Component::ApiServer);
        api.map_or(0, |d| d.ready)
    }

    /// The version every API server runs: the Deployment's once it has rolled out, else the
    /// one the last status said (the older, during an upgrade).
    fn running_version(&self) -> Option<String> {
        let api = self.observation.facts.deployed.get(&Component::ApiServer)?;
        let previous = self.kcp.status.as_ref().and_then(|s| s.version.clone());
        if api.rolled_out {
            Some(api.version.clone())
        } else {
            previous
        }
    }

    /// An upgrade: one under way to the version asked for, or a version that ran before and
    /// is not the one asked for. What it comes from.
    fn upgrading_from(&self) -> Option<String> {
        let status = self.kcp.status.as_ref()?;
        let target = &self.plan.target.kubernetes;
        let under_way = status
            .upgrade
            .as_ref()
            .filter(|u| u.to == *target && self.plan.step != Step::Done);
        if let Some(upgrade) = under_way {
            return Some(upgrade.from.clone());
        }
        status.version.clone().filter(|previous| previous != target)
    }

    /// What the EtcdCluster says is wrong with it, if it is Degraded for a reason of its own (a
    /// refused spec, a backup to start from not found, a member pod that cannot start, quorum
    /// lost). Members unhealthy for a
    /// while are not one: an etcd upgrade passes through that, and a lasting one shows as
    /// EtcdNotReady.
    fn etcd_degraded(&self) -> Option<(&str, &str)> {
        let status = self.observation.live.etcd.as_ref()?.status.as_ref()?;
        status
            .conditions
            .iter()
            // Members being replaced or moved apart: the EtcdCluster says so and mends it.
            .find(|c| {
                c.type_ == "Degraded"
                    && c.status == "True"
                    && c.reason != "MembersUnhealthy"
                    && c.reason != crate::etcd::status::MEMBERS_SHARE_NODE
            })
            .map(|c| (c.reason.as_str(), c.message.as_str()))
    }

    /// Why a component cannot go on, if one cannot.
    fn stalled(&self) -> Option<(Component, &crate::core::stuck::Stuck)> {
        self.observation.stuck.iter().map(|(c, s)| (*c, s)).next()
    }
}

fn ready(f: &StatusFacts) -> Decided<KubernetesControlPlaneReason> {
    if let Some(why) = f.range_taken {
        return Decided::new("Ready", false, KubernetesControlPlaneReason::RangeTaken, why);
    }
    match (f.plan.step, f.stalled(), f.upgrading_from()) {
        (Step::Done, None, _) if f.observation.facts.etcd_ready => Decided::new(
            "Ready",
            true,
            KubernetesControlPlaneReason::Ready,
            format!(
                "Kubernetes {} serves at {}",
                f.plan.target.kubernetes,
                endpoint(f).unwrap_or_default()
            ),
        ),
        (_, Some(_), Some(_)) => Decided::new(
            "Ready",
            false,
            KubernetesControlPlaneReason::UpgradeStalled,
            stalled_message(f),
        ),
        (_, Some(_), None) => Decided::new(
            "Ready",
            false,
            KubernetesControlPlaneReason::PodsCannotStart,
            stalled_message(f),
        ),
        (Step::Etcd, _, _) => Decided::new(
            "Ready",
            false,
            KubernetesControlPlaneReason::EtcdNotReady,
            etcd_waiting(f),
        ),
        (_, _, Some(_)) => Decided::new("Ready", false, KubernetesControlPlaneReason::Upgrading, waiting(f)),
        _ => Decided::new(
            "Ready",
            false,
            KubernetesControlPlaneReason::APIServerNotReady,
            waiting(f),
        ),
    }
}

fn available(f: &StatusFacts) -> Decided<KubernetesControlPlaneReason> {
    let ready = f.ready_api_servers();
    if ready > 0 {
        Decided::new(
            "Available",
            true,
            KubernetesControlPlaneReason::APIServerAvailable,
            format!("{ready} API server(s) Ready"),
        )
    } else {
        Decided::new(
            "Available",
            false,
            KubernetesControlPlaneReason::APIServerNotReady,
            "no API server is Ready",
        )
    }
}

fn progressing(f: &StatusFacts) -> Decided<KubernetesControlPlaneReason> {
    if let Some(why) = f.range_taken {
        return Decided::new("Progressing", false, KubernetesControlPlaneReason::RangeTaken, why);
    }
    match (f.plan.step, f.upgrading_from()) {
        (Step::Done, _) => Decided::new(
            "Progressing",
            false,
            KubernetesControlPlaneReason::Settled,
            "every part runs the version asked for",
        ),
        (_, Some(from)) => Decided::new(
            "Progressing",
            true,
            KubernetesControlPlaneReason::Upgrading,
            format!("{from} → {}: {}", f.plan.target.kubernetes, waiting(f)),
        ),
        _ => Decided::new("Progressing", true, KubernetesControlPlaneReason::Creating, waiting(f)),
    }
}

fn degraded(f: &StatusFacts) -> Decided<KubernetesControlPlaneReason> {
    let asked = replicas(f.kcp, Component::ApiServer);
    if let Some(why) = f.range_taken {
        return Decided::new("Degraded", true, KubernetesControlPlaneReason::RangeTaken, why);
    }
    if f.stalled().is_some() {
        let reason = if f.upgrading_from().is_some() {
            KubernetesControlPlaneReason::UpgradeStalled
        } else {
            KubernetesControlPlaneReason::PodsCannotStart
        };
        return Decided::new("Degraded", true, reason, stalled_message(f));
    }
    if let Some((reason, message)) = f.etcd_degraded() {
        let message = format!("EtcdCluster {}: {message} ({reason})", f.names.etcd());
        return Decided::new("Degraded", true, KubernetesControlPlaneReason::EtcdDegraded, message);
    }
    let was_ready = f.kcp.status.as_ref().and_then(|s| s.version.as_ref()).is_some();
    // An etcd moving member by member to the release's version is the upgrade, not a fault.
    let moving_etcd = f.upgrading_from().is_some() && f.plan.step == Step::Etcd;
    if was_ready && !f.observation.facts.etcd_ready && !moving_etcd {
        return Decided::new(
            "Degraded",
            true,
            KubernetesControlPlaneReason::EtcdNotReady,
            "the tenant's etcd is not Ready",
        );
    }
    if was_ready && f.ready_api_servers() < asked {
        let message = format!("{} of {asked} API servers Ready", f.ready_api_servers());
        return Decided::new(
            "Degraded",
            true,
            KubernetesControlPlaneReason::APIServerNotReady,
            message,
        );
    }
    // Replicas on one node go down together with it: said while they could be moved apart
    // (and they are, one at a time), and said without alarm when no other node could take one.
    let spread = &f.observation.spread;
    if let Some(shared) = spread.shared() {
        let message = format!("{shared}: one node failure would take them together; moving them apart, one at a time");
        return Decided::new(
            "Degraded",
            true,
            KubernetesControlPlaneReason::ReplicasShareNode,
            message,
        );
    }
    if let Some(together) = spread.together() {
        let message = format!("{together}; no other node could take one now");
        return Decided::new(
            "Degraded",
            false,
            KubernetesControlPlaneReason::ReplicasShareNode,
            message,
        );
    }
    Decided::new(
        "Degraded",
        false,
        KubernetesControlPlaneReason::AsExpected,
        "every part is Ready",
    )
}

fn waiting(f: &StatusFacts) -> String {
    match &f.plan.waiting_for {
        Some(what) => format!("waiting for {what}"),
        None => "every part runs the version asked for".into(),
    }
}

/// What the pass waits for at the etcd step, with what the EtcdCluster says of itself.
fn etcd_waiting(f: &StatusFacts) -> String {
    let said = f
        .observation
        .live
        .etcd
        .as_ref()
        .and_then(|e| e.status.as_ref())
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready" && c.status != "True"))
        .map(|c| format!("; EtcdCluster {}: {} ({})", f.names.etcd(), c.message, c.reason));
    format!("{}{}", waiting(f), said.unwrap_or_default())
}

fn stalled_message(f: &StatusFacts) -> String {
    match f.stalled() {
        Some((component, stuck)) => format!(
            "{} cannot start ({}): {}; what runs keeps serving",
            component.program(),
            stuck.reason,
            stuck.message
        ),
        None => String::new(),
    }
}

fn endpoint(f: &StatusFacts) -> Option<String> {
    f.service_ip.map(server_url)
}

fn phase(f: &StatusFacts, conditions: &[Decided<KubernetesControlPlaneReason>]) -> KubernetesControlPlanePhase {
    let is = |type_: &str| conditions.iter().any(|c| c.type_ == type_ && c.status);
    if f.kcp.spec.paused {
        KubernetesControlPlanePhase::Paused
    } else if f.stalled().is_some() && f.upgrading_from().is_some() {
        KubernetesControlPlanePhase::Stalled
    } else if is("Ready") {
        KubernetesControlPlanePhase::Running
    } else if f.upgrading_from().is_some() {
        KubernetesControlPlanePhase::Upgrading
    } else if is("Degraded") {
        KubernetesControlPlanePhase::Degraded
    } else {
        KubernetesControlPlanePhase::Creating
    }
}

/// The etcd in one line: `3/3 Running 3.6.16`.
fn etcd_line(f: &StatusFacts) -> Option<String> {
    let status = f.observation.live.etcd.as_ref()?.status.as_ref()?;
    let phase = status.phase.map(|p| p.as_str());
    let parts: Vec<&str> = [status.ready.as_deref(), phase, status.current_version.as_deref()]
        .into_iter()
        .flatten()
        .collect();
    Some(parts.join(" "))
}

fn upgrade(f: &StatusFacts, now: jiff::Timestamp) -> Option<UpgradeStatus> {
    let from = f.upgrading_from()?;
    let to = f.plan.target.kubernetes.clone();
    let previous = f.kcp.status.as_ref().and_then(|s| s.upgrade.as_ref());
    let started_at = previous
        .filter(|u| u.to == to)
        .map(|u| u.started_at.clone())
        .unwrap_or(Time(now));
    Some(UpgradeStatus {
        from,
        to,
        step: f.plan.step.name().into(),
        started_at,
    })
}

/// The status of this pass.
pub fn build(f: &StatusFacts, now: jiff::Timestamp) -> KubernetesControlPlaneStatus {
    let previous = f.kcp.status.clone().unwrap_or_default();
    let decided = [ready(f), available(f), progressing(f), degraded(f)];
    let generation = f.kcp.metadata.generation;
    let asked = replicas(f.kcp, Component::ApiServer);
    KubernetesControlPlaneStatus {
        observed_generation: generation,
        conditions: merge(
            &previous.conditions,
            &with_paused(&decided, f.kcp.spec.paused),
            generation,
            now,
        ),
        phase: Some(phase(f, &decided)),
        version: f.running_version(),
        ready: Some(format!("{}/{asked}", f.ready_api_servers())),
        endpoint: endpoint(f),
        external_endpoint: f.external_endpoint.clone(),
        admin_kubeconfig_secret: Some(Certificate::Admin.secret(f.names))
            .filter(|name| f.observation.live.secrets.contains_key(name)),
        etcd: etcd_line(f),
        upgrade: upgrade(f, now),
    }
}

/// The status of a control plane whose spec cannot be carried out (a version it cannot run,
/// past a loosened schema): not Ready, Degraded with the reason, nothing else changed.
pub fn refused(
    kcp: &KubernetesControlPlane,
    reason: KubernetesControlPlaneReason,
    message: &str,
    now: jiff::Timestamp,
) -> KubernetesControlPlaneStatus {
    let previous = kcp.status.clone().unwrap_or_default();
    let decided = [
        Decided::new(noops_api::condition::READY, false, reason, message),
        Decided::new(noops_api::condition::DEGRADED, true, reason, message),
    ];
    KubernetesControlPlaneStatus {
        observed_generation: kcp.metadata.generation,
        conditions: merge(
            &previous.conditions,
            &with_paused(&decided, kcp.spec.paused),
            kcp.metadata.generation,
            now,
        ),
        ..previous
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control_plane::fixtures::control_plane;
    use crate::control_plane::observe::{Facts, Live};
    use crate::control_plane::plan::plan;
    use crate::control_plane::ranges::RANGE_TAKEN;
    use crate::control_plane::versions::Release;
    use std::collections::BTreeMap;

    fn at(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn observation(facts: Facts) -> Observation {
        Observation {
            live: Live::default(),
            facts,
            stuck: BTreeMap::new(),
            recheck_after: None,
            spread: Default::default(),
        }
    }

    fn condition<'a>(status: &'a KubernetesControlPlaneStatus, type_: &str) -> (&'a str, &'a str) {
        let c = status.conditions.iter().find(|c| c.type_ == type_).unwrap();
        (c.status.as_str(), c.reason.as_str())
    }

    /// The status `kcp` gets from `facts` (and `stuck` components) at the time `s`.
    fn status_of(
        kcp: &KubernetesControlPlane,
        facts: Facts,
        stuck: Option<Component>,
        s: i64,
    ) -> KubernetesControlPlaneStatus {
        let mut obs = observation(facts.clone());
        if let Some(component) = stuck {
            let said = crate::core::stuck::Stuck {
                reason: "ImagePullBackOff",
                message: "pod x: no such image".into(),
            };
            obs.stuck.insert(component, said);
        }
        status_observed(kcp, &obs, s)
    }

    /// The status `kcp` gets from `obs` at the time `s`.
    fn status_observed(kcp: &KubernetesControlPlane, obs: &Observation, s: i64) -> KubernetesControlPlaneStatus {
        let facts = &obs.facts;
        let p = plan(Release::of(&kcp.spec.version).unwrap(), facts);
        let names = Names::of(kcp);
        let service_ip = Some(IpAddr::from([10, 96, 0, 9]));
        let f = StatusFacts {
            kcp,
            names: &names,
            plan: &p,
            observation: obs,
            service_ip,
            external_endpoint: None,
            range_taken: None,
        };
        build(&f, at(s))
    }

    /// A control plane that has served, every part at 1.34.4 and rolled out.
    fn served() -> (KubernetesControlPlane, Facts) {
        let served = KubernetesControlPlaneStatus {
            version: Some("1.34.4".into()),
            ..Default::default()
        };
        let kcp = control_plane("team-a").status(served).build();
        let mut facts = Facts::etcd_ready("3.6.16");
        for component in Component::ALL {
            facts.deployed(component, "1.34.4", true);
        }
        (kcp, facts)
    }

    #[test]
    fn replicas_that_share_a_node_are_said_and_an_alarm_only_while_another_could_take_one() {
        use crate::control_plane::spread::{Placed, Spread};
        let (kcp, facts) = served();
        let on = |node: &str| Placed {
            node: node.into(),
            ready: true,
            young: false,
        };
        let status_with = |eligible: &[&str]| {
            let mut obs = observation(facts.clone());
            obs.spread = Spread {
                pods: BTreeMap::from([(
                    Component::ControllerManager,
                    BTreeMap::from([("cm-a".to_string(), on("n1")), ("cm-b".to_string(), on("n1"))]),
                )]),
                eligible: eligible.iter().map(|n| n.to_string()).collect(),
            };
            status_observed(&kcp, &obs, 0)
        };
        let movable = status_with(&["n1", "n2"]);
        assert_eq!(
            condition(&movable, "Degraded"),
            ("True", KubernetesControlPlaneReason::ReplicasShareNode.as_str())
        );
        assert_eq!(condition(&movable, "Ready"), ("True", "Ready"));
        let message = &movable
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .unwrap()
            .message;
        assert!(message.contains("cm-a and cm-b share node n1"), "{message}");
        let alone = status_with(&["n1"]);
        assert_eq!(
            condition(&alone, "Degraded"),
            ("False", KubernetesControlPlaneReason::ReplicasShareNode.as_str())
        );
    }

    #[test]
    fn what_its_etcd_cluster_says_is_wrong_makes_the_control_plane_degraded() {
        let (kcp, facts) = served();
        let degraded_etcd = |reason: &str| {
            let condition = k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: "Degraded".into(),
                status: "True".into(),
                reason: reason.into(),
                message: "backup b1 not found".into(),
                observed_generation: Some(1),
                last_transition_time: Time(at(0)),
            };
            let status = noops_api::EtcdClusterStatus {
                conditions: vec![condition],
                ..Default::default()
            };
            crate::etcd::fixtures::cluster().status(status).build()
        };
        let status_with = |etcd| {
            let mut obs = observation(facts.clone());
            obs.live.etcd = Some(etcd);
            let p = plan(Release::of(&kcp.spec.version).unwrap(), &obs.facts);
            let names = Names::of(&kcp);
            let f = StatusFacts {
                kcp: &kcp,
                names: &names,
                plan: &p,
                observation: &obs,
                service_ip: Some(IpAddr::from([10, 96, 0, 9])),
                external_endpoint: None,
                range_taken: None,
            };
            build(&f, at(1))
        };
        let status = status_with(degraded_etcd("BackupNotFound"));
        assert_eq!(condition(&status, "Degraded"), ("True", "EtcdDegraded"));
        let said = status.conditions.iter().find(|c| c.type_ == "Degraded").unwrap();
        assert_eq!(
            said.message,
            "EtcdCluster team-a-etcd: backup b1 not found (BackupNotFound)"
        );
        assert_eq!(condition(&status, "Ready"), ("True", "Ready"), "it still serves");
        let passing = status_with(degraded_etcd("MembersUnhealthy"));
        assert_eq!(
            condition(&passing, "Degraded"),
            ("False", "AsExpected"),
            "as an upgrade passes through"
        );
    }

    #[test]
    fn a_control_plane_whose_range_is_taken_says_so_and_is_not_ready() {
        let kcp = control_plane("team-a").build();
        let obs = observation(Facts::default());
        let p = plan(Release::of(&kcp.spec.version).unwrap(), &obs.facts);
        let names = Names::of(&kcp);
        let why = "networking.podCIDR 10.244.0.0/16 overlaps 10.244.1.0/24 (the pods of node n1)";
        let f = StatusFacts {
            kcp: &kcp,
            names: &names,
            plan: &p,
            observation: &obs,
            service_ip: None,
            external_endpoint: None,
            range_taken: Some(why),
        };
        let status = build(&f, at(0));
        assert_eq!(status.phase, Some(KubernetesControlPlanePhase::Degraded));
        for type_ in ["Ready", "Progressing"] {
            assert_eq!(condition(&status, type_), ("False", RANGE_TAKEN), "{type_}");
        }
        assert_eq!(condition(&status, "Degraded"), ("True", RANGE_TAKEN));
        let said = status.conditions.iter().find(|c| c.type_ == "Degraded").unwrap();
        assert_eq!(said.message, why);
    }

    #[test]
    fn a_new_control_plane_is_creating_until_every_part_runs_then_ready() {
        let kcp = control_plane("team-a").build();
        let status = status_of(&kcp, Facts::default(), None, 0);
        assert_eq!(status.phase, Some(KubernetesControlPlanePhase::Creating));
        assert_eq!(condition(&status, "Ready"), ("False", "EtcdNotReady"));
        assert_eq!(condition(&status, "Progressing"), ("True", "Creating"));
        assert_eq!(status.upgrade, None);

        let mut facts = Facts::etcd_ready("3.6.16");
        for component in Component::ALL {
            facts.deployed(component, "1.34.4", true);
        }
        let status = status_of(&kcp, facts, None, 1);
        assert_eq!(status.phase, Some(KubernetesControlPlanePhase::Running));
        assert_eq!(condition(&status, "Ready"), ("True", "Ready"));
        assert_eq!(status.version.as_deref(), Some("1.34.4"));
        assert_eq!(status.endpoint.as_deref(), Some("https://10.96.0.9:6443"));
    }

    #[test]
    fn an_upgrade_says_where_it_is_and_a_stalled_one_says_why_while_the_old_version_serves() {
        let previous = KubernetesControlPlaneStatus {
            version: Some("1.33.13".into()),
            ..Default::default()
        };
        let kcp = control_plane("team-a").status(previous).build();
        let mut facts = Facts::etcd_ready("3.6.16");
        facts.deployed(Component::ApiServer, "1.34.4", false);
        facts.deployed(Component::ControllerManager, "1.33.13", true);
        facts.deployed(Component::Scheduler, "1.33.13", true);
        let status = status_of(&kcp, facts.clone(), None, 5);
        assert_eq!(status.phase, Some(KubernetesControlPlanePhase::Upgrading));
        assert_eq!(
            status.version.as_deref(),
            Some("1.33.13"),
            "the older version until all moved"
        );
        let upgrade = status.upgrade.clone().unwrap();
        let said = (upgrade.from.as_str(), upgrade.to.as_str(), upgrade.step.as_str());
        assert_eq!(said, ("1.33.13", "1.34.4", "APIServer"));
        let stalled = status_of(&kcp, facts, Some(Component::ApiServer), 6);
        assert_eq!(stalled.phase, Some(KubernetesControlPlanePhase::Stalled));
        assert_eq!(condition(&stalled, "Ready"), ("False", "UpgradeStalled"));
        assert_eq!(condition(&stalled, "Degraded"), ("True", "UpgradeStalled"));
        let message = &stalled
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .unwrap()
            .message;
        assert!(
            message.contains("kube-apiserver cannot start (ImagePullBackOff)"),
            "{message}"
        );
    }

    #[test]
    fn an_etcd_moving_to_the_releases_version_is_an_upgrade_not_a_fault() {
        let previous = KubernetesControlPlaneStatus {
            version: Some("1.33.13".into()),
            ..Default::default()
        };
        let kcp = control_plane("team-a").status(previous).build();
        let mut facts = Facts::etcd_ready("3.5.35");
        facts.etcd_ready = false;
        for component in Component::ALL {
            facts.deployed(component, "1.33.13", true);
        }
        let status = status_of(&kcp, facts.clone(), None, 5);
        assert_eq!(status.phase, Some(KubernetesControlPlanePhase::Upgrading));
        assert_eq!(condition(&status, "Degraded"), ("False", "AsExpected"));
        // The same etcd, not Ready with no upgrade asked for, is a fault.
        let settled = control_plane("team-a").status(KubernetesControlPlaneStatus {
            version: Some("1.33.13".into()),
            ..Default::default()
        });
        let mut kcp = settled.build();
        kcp.spec.version = "1.33".into();
        assert_eq!(
            condition(&status_of(&kcp, facts, None, 6), "Degraded"),
            ("True", "EtcdNotReady")
        );
    }
}
