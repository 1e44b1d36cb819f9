//! The reports of the machine kinds: a Machine (its node, address, version, provider ID, a
//! failure, its drain), a MachineSet with its machines, a MachineDeployment with its sets.
//! Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use noops_api::machine::FlavorSpec;
use noops_api::machine_deployment::StrategyType;
use noops_api::{Machine, MachineDeployment, MachineSet};

use super::{Around, base, certificates};
use crate::report::{Report, Section};

/// The Machine condition that says how its drain goes, while it is deleted.
const DRAINING_SUCCEEDED: &str = "DrainingSucceeded";

/// A Machine: its cluster, node and address, the version its kubelet reports, its size, the
/// provider's ID of its VM, why it failed, how its drain goes, its certificates.
pub fn machine(m: &Machine, around: &Around) -> Report {
    let status = m.status.clone().unwrap_or_default();
    let mut report = base(
        "Machine",
        &m.metadata,
        &status.conditions,
        status.observed_generation,
        around,
    );
    report.phase = status.phase.map(|p| p.as_str().to_string());
    report.paused = m.spec.paused;
    // The drain has a line of its own below: a drain under way is news, not a fault.
    report.problems.retain(|(type_, _, _)| type_ != DRAINING_SUCCEEDED);
    report.fact("cluster", m.spec.cluster_name.clone());
    report.fact(
        "node",
        status.node_name.clone().unwrap_or_else(|| "not joined yet".into()),
    );
    if let Some(address) = &status.address {
        report.fact("address", address.clone());
    }
    match &status.version {
        Some(version) => report.fact("version", version.clone()),
        None => report.fact("version", format!("{} (asked)", m.spec.template.version)),
    }
    report.fact("flavor", flavor(&m.spec.template.flavor));
    report.fact(
        "provider ID",
        m.spec.provider_id.clone().unwrap_or_else(|| "none yet".into()),
    );
    if let Some(joined) = &status.node_joined_at {
        report.fact("joined", format!("{} ago", around.since(joined)));
    }
    if let Some(deleted) = &m.metadata.deletion_timestamp {
        report.fact("DELETING", format!("for {}", around.since(deleted)));
    }
    if let Some(drain) = status.conditions.iter().find(|c| c.type_ == DRAINING_SUCCEEDED) {
        let since = status
            .drain_started_at
            .as_ref()
            .map(|t| format!(" (started {} ago)", around.since(t)))
            .unwrap_or_default();
        report.fact("drain", format!("{}: {}{since}", drain.reason, drain.message));
    }
    if status.failure_reason.is_some() || status.failure_message.is_some() {
        report.fact(
            "FAILED",
            format!(
                "{}: {}",
                status.failure_reason.as_deref().unwrap_or("Failed"),
                status.failure_message.as_deref().unwrap_or_default()
            ),
        );
    }
    if !around.certificates.is_empty() {
        report.tables.push(certificates(around));
    }
    report
}

/// A MachineSet: its cluster, version and size, its machines counted and listed (phase,
/// Ready and why not, node, address, version, age).
pub fn machine_set(set: &MachineSet, machines: &[Machine], around: &Around) -> Report {
    let status = set.status.clone().unwrap_or_default();
    let mut report = base(
        "MachineSet",
        &set.metadata,
        &status.conditions,
        status.observed_generation,
        around,
    );
    report.paused = set.spec.paused;
    report.fact("cluster", set.spec.cluster_name.clone());
    if let Some(owner) = owner_of_kind(&set.metadata, "MachineDeployment") {
        report.fact("deployment", owner);
    }
    report.fact("version", set.spec.template.spec.version.clone());
    report.fact("flavor", flavor(&set.spec.template.spec.flavor));
    report.fact(
        "machines",
        counts(
            set.spec.replicas,
            &[
                ("exist", status.replicas),
                ("ready", status.ready_replicas),
                ("available", status.available_replicas),
                ("deleting", status.deleting_replicas),
            ],
        ),
    );
    let health = &set.spec.health_check;
    report.fact(
        "repair",
        format!(
            "after {}s NotReady or {}s not joined, while at most {} are unhealthy",
            health.unhealthy_timeout_seconds,
            health.startup_timeout_seconds,
            int_or_string(&health.max_unhealthy)
        ),
    );
    report.tables.push(machines_table(machines, around));
    report
}

/// A MachineDeployment: its cluster, version and size, its rollout strategy and how the
/// rollout goes, and its MachineSets (the current one marked).
pub fn machine_deployment(md: &MachineDeployment, sets: &[MachineSet], around: &Around) -> Report {
    let status = md.status.clone().unwrap_or_default();
    let mut report = base(
        "MachineDeployment",
        &md.metadata,
        &status.conditions,
        status.observed_generation,
        around,
    );
    report.phase = status.phase.map(|p| p.to_string());
    report.paused = md.spec.paused;
    if md.spec.rollout_paused {
        report.fact(
            "rollout",
            "paused (rolloutPaused): no new MachineSet, none scaled".to_string(),
        );
    }
    report.fact("cluster", md.spec.cluster_name.clone());
    report.fact("version", md.spec.template.spec.version.clone());
    report.fact("flavor", flavor(&md.spec.template.spec.flavor));
    report.fact(
        "machines",
        counts(
            md.spec.replicas,
            &[
                ("exist", status.replicas),
                ("ready", status.ready_replicas),
                ("updated", status.updated_replicas),
                ("available", status.available_replicas),
                ("deleting", status.deleting_replicas),
            ],
        ),
    );
    let strategy = match md.spec.strategy.type_ {
        StrategyType::OnDelete => "OnDelete (new machines replace those deleted by hand)".to_string(),
        StrategyType::RollingUpdate => {
            let rolling = md.spec.strategy.rolling_update.clone().unwrap_or_default();
            format!(
                "RollingUpdate (maxSurge {}, maxUnavailable {})",
                int_or_string(&rolling.max_surge),
                int_or_string(&rolling.max_unavailable)
            )
        }
    };
    report.fact("strategy", strategy);
    if let Some(current) = &status.current_machine_set {
        report.fact("current set", current.clone());
    }
    if let Some(at) = &status.progress_at {
        report.fact(
            "last progress",
            format!(
                "{} ago (a rollout stalls after {}s without)",
                around.since(at),
                md.spec.progress_deadline_seconds
            ),
        );
    }
    let mut sets: Vec<&MachineSet> = sets.iter().collect();
    sets.sort_by_key(|s| s.metadata.creation_timestamp.as_ref().map(|t| t.0));
    report.tables.push(Section {
        title: "MachineSets (oldest first)".into(),
        header: [
            "NAME",
            "CURRENT",
            "DESIRED",
            "READY",
            "AVAILABLE",
            "DELETING",
            "VERSION",
            "AGE",
        ]
        .map(String::from)
        .to_vec(),
        rows: sets
            .iter()
            .map(|set| {
                let name = set.metadata.name.clone().unwrap_or_default();
                let seen = set.status.clone().unwrap_or_default();
                let number = |n: Option<i32>| n.unwrap_or(0).to_string();
                vec![
                    name.clone(),
                    if status.current_machine_set.as_ref() == Some(&name) {
                        "*".into()
                    } else {
                        String::new()
                    },
                    set.spec.replicas.to_string(),
                    number(seen.ready_replicas),
                    number(seen.available_replicas),
                    number(seen.deleting_replicas),
                    set.spec.template.spec.version.clone(),
                    created(&set.metadata, around),
                ]
            })
            .collect(),
    });
    report
}

/// Machines as a table, by name.
fn machines_table(machines: &[Machine], around: &Around) -> Section {
    let mut machines: Vec<&Machine> = machines.iter().collect();
    machines.sort_by_key(|m| m.metadata.name.clone());
    Section {
        title: "Machines".into(),
        header: ["NAME", "PHASE", "READY", "NODE", "ADDRESS", "VERSION", "AGE"]
            .map(String::from)
            .to_vec(),
        rows: machines
            .iter()
            .map(|m| {
                let status = m.status.clone().unwrap_or_default();
                let phase = match (&m.metadata.deletion_timestamp, status.phase) {
                    (Some(_), _) => "Deleting".to_string(),
                    (None, Some(phase)) => phase.as_str().to_string(),
                    (None, None) => String::new(),
                };
                vec![
                    m.metadata.name.clone().unwrap_or_default(),
                    phase,
                    ready_and_why(&status.conditions),
                    status.node_name.unwrap_or_default(),
                    status.address.unwrap_or_default(),
                    status.version.unwrap_or_default(),
                    created(&m.metadata, around),
                ]
            })
            .collect(),
    }
}

/// `True`, or `False (<reason>)`: the Ready condition in a table cell.
fn ready_and_why(conditions: &[Condition]) -> String {
    match conditions.iter().find(|c| c.type_ == noops_api::condition::READY) {
        Some(c) if c.status == "True" => "True".into(),
        Some(c) => format!("{} ({})", c.status, c.reason),
        None => "-".into(),
    }
}

/// `desired 3: 3 exist, 2 ready, …`, leaving out what the status does not say yet.
fn counts(desired: i32, seen: &[(&str, Option<i32>)]) -> String {
    let said: Vec<String> = seen
        .iter()
        .filter_map(|(what, n)| n.map(|n| format!("{n} {what}")))
        .collect();
    if said.is_empty() {
        format!("{desired} desired")
    } else {
        format!("{desired} desired: {}", said.join(", "))
    }
}

fn flavor(flavor: &FlavorSpec) -> String {
    format!("{} CPU, {}, {} pods", flavor.cpu, flavor.memory, flavor.pods)
}

fn int_or_string(value: &IntOrString) -> String {
    match value {
        IntOrString::Int(n) => n.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

fn created(meta: &ObjectMeta, around: &Around) -> String {
    meta.creation_timestamp
        .as_ref()
        .map(|t| around.since(t))
        .unwrap_or_default()
}

/// The name of the owner of kind `kind`, if it has one.
fn owner_of_kind(meta: &ObjectMeta, kind: &str) -> Option<String> {
    meta.owner_references
        .as_ref()?
        .iter()
        .find(|o| o.kind == kind)
        .map(|o| o.name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    fn around() -> Around {
        Around {
            now: at("2026-11-26T12:00:00Z"),
            ..Default::default()
        }
    }

    fn a_machine(name: &str, ready: &str, reason: &str) -> Machine {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "noops.dev/v1alpha1", "kind": "Machine",
            "metadata": { "name": name, "namespace": "t", "generation": 1,
                          "creationTimestamp": "2026-11-26T11:00:00Z" },
            "spec": { "clusterName": "acme", "version": "1.34.4", "providerID": format!("noops://t/{name}") },
            "status": {
                "observedGeneration": 1, "phase": "Running", "nodeName": name, "address": "10.0.0.7",
                "version": "v1.34.4", "nodeJoinedAt": "2026-11-26T11:02:00Z",
                "conditions": [
                    { "type": "Ready", "status": ready, "reason": reason, "message": "its Node says so",
                      "lastTransitionTime": "2026-11-26T11:00:00Z" },
                ],
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_machine_report_has_its_node_address_version_provider_and_drain() {
        let mut m = a_machine("acme-general-0", "True", "NodeReady");
        let report = machine(&m, &around());
        assert!(report.ready && report.problems.is_empty(), "{report:?}");
        let text = report.text();
        for expected in [
            "Machine t/acme-general-0: Ready (Running)",
            "node         acme-general-0",
            "address      10.0.0.7",
            "v1.34.4",
            "noops://t/acme-general-0",
            "2 CPU, 2Gi, 110 pods",
            "58m ago",
        ] {
            assert!(text.contains(expected), "no {expected:?} in\n{text}");
        }
        let status = m.status.as_mut().unwrap();
        status.drain_started_at = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(
            "2026-11-26T11:58:00Z",
        )));
        status.conditions.push(Condition {
            type_: DRAINING_SUCCEEDED.into(),
            status: "False".into(),
            reason: "EvictionBlocked".into(),
            message: "a PodDisruptionBudget keeps default/web-1 on the Node for now".into(),
            observed_generation: Some(1),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at("2026-11-26T11:58:00Z")),
        });
        status.failure_reason = Some("VMGone".into());
        status.failure_message = Some("its pod was deleted".into());
        let report = machine(&m, &around());
        assert!(report.problems.is_empty(), "the drain is a fact: {report:?}");
        let text = report.text();
        assert!(
            text.contains(
                "EvictionBlocked: a PodDisruptionBudget keeps default/web-1 on the Node for now (started 2m ago)"
            ),
            "{text}"
        );
        assert!(text.contains("FAILED       VMGone: its pod was deleted"), "{text}");
    }

    #[test]
    fn a_set_lists_its_machines_and_says_why_one_is_not_ready() {
        let set: MachineSet = serde_json::from_value(serde_json::json!({
            "apiVersion": "noops.dev/v1alpha1", "kind": "MachineSet",
            "metadata": { "name": "acme-general-7f9c", "namespace": "t", "generation": 1,
                          "ownerReferences": [{ "apiVersion": "noops.dev/v1alpha1", "kind": "MachineDeployment",
                                                "name": "acme-general", "uid": "md" }] },
            "spec": {
                "clusterName": "acme", "replicas": 2,
                "selector": { "matchLabels": { "pool": "general" } },
                "template": { "metadata": { "labels": { "pool": "general" } }, "spec": { "version": "1.34.4" } },
            },
            "status": { "observedGeneration": 1, "replicas": 2, "readyReplicas": 1, "availableReplicas": 1,
                        "deletingReplicas": 0,
                        "conditions": [{ "type": "Ready", "status": "False", "reason": "MachinesNotReady",
                                         "message": "1 of 2 machines Ready", "lastTransitionTime": "2026-11-26T11:00:00Z" }] },
        }))
        .unwrap();
        let machines = [
            a_machine("acme-general-7f9c-1", "False", "NodeNotReady"),
            a_machine("acme-general-7f9c-0", "True", "NodeReady"),
        ];
        let report = machine_set(&set, &machines, &around());
        assert!(!report.ready);
        assert_eq!(report.problems[0].1, "MachinesNotReady");
        let text = report.text();
        assert!(text.contains("deployment  acme-general"), "{text}");
        assert!(
            text.contains("2 desired: 2 exist, 1 ready, 1 available, 0 deleting"),
            "{text}"
        );
        assert!(text.contains("while at most 40% are unhealthy"), "{text}");
        let first = text.find("acme-general-7f9c-0").unwrap();
        let second = text.find("acme-general-7f9c-1").unwrap();
        assert!(first < second, "machines by name:\n{text}");
        let line = text.lines().find(|l| l.contains("acme-general-7f9c-1")).unwrap();
        assert!(
            line.contains("False (NodeNotReady)") && line.contains("10.0.0.7"),
            "{line}"
        );
    }

    #[test]
    fn a_deployment_says_its_strategy_and_marks_its_current_set() {
        let md: MachineDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "noops.dev/v1alpha1", "kind": "MachineDeployment",
            "metadata": { "name": "acme-general", "namespace": "t", "generation": 3 },
            "spec": {
                "clusterName": "acme", "replicas": 2,
                "selector": { "matchLabels": { "pool": "general" } },
                "template": { "metadata": { "labels": { "pool": "general" } }, "spec": { "version": "1.34.4" } },
                "strategy": { "type": "RollingUpdate", "rollingUpdate": { "maxSurge": "50%", "maxUnavailable": 0 } },
            },
            "status": { "observedGeneration": 3, "phase": "Rolling", "replicas": 3, "readyReplicas": 3,
                        "updatedReplicas": 1, "currentMachineSet": "acme-general-new",
                        "progressAt": "2026-11-26T11:59:30Z" },
        }))
        .unwrap();
        let set = |name: &str, version: &str, created: &str| -> MachineSet {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "noops.dev/v1alpha1", "kind": "MachineSet",
                "metadata": { "name": name, "namespace": "t", "creationTimestamp": created },
                "spec": {
                    "clusterName": "acme", "replicas": 1,
                    "selector": { "matchLabels": { "pool": "general" } },
                    "template": { "metadata": { "labels": { "pool": "general" } }, "spec": { "version": version } },
                },
            }))
            .unwrap()
        };
        let sets = [
            set("acme-general-new", "1.34.4", "2026-11-26T11:55:00Z"),
            set("acme-general-old", "1.33.13", "2026-11-25T12:00:00Z"),
        ];
        let text = machine_deployment(&md, &sets, &around()).text();
        for expected in [
            "MachineDeployment t/acme-general: Not ready (Rolling)",
            "RollingUpdate (maxSurge 50%, maxUnavailable 0)",
            "2 desired: 3 exist, 3 ready, 1 updated",
            "current set    acme-general-new",
            "30s ago (a rollout stalls after 600s without)",
        ] {
            assert!(text.contains(expected), "no {expected:?} in\n{text}");
        }
        let old = text.find("acme-general-old  ").unwrap();
        let new = text.lines().find(|l| l.contains("acme-general-new  ")).unwrap();
        assert!(new.contains('*') && new.contains("5m"), "{new}");
        assert!(old < text.find(new).unwrap(), "oldest first:\n{text}");
    }
}
