//! The tree of a KubernetesCluster: its KubernetesControlPlane, that one's EtcdCluster, each
//! pool's MachineDeployment, their MachineSets and those sets' Machines, each on a line with
//! its Ready condition, the reason, its phase and what tells it apart (versions, counts, a
//! machine's node). Pure: the objects of the namespace come in, text goes out.
//!
//! A child is found by its owner reference, or else by the name the operator gives it (the
//! control plane `<cluster>`, its EtcdCluster `<control plane>-etcd`, a pool's
//! MachineDeployment `<cluster>-<pool>`), so that a child made before its owner was set still
//! shows.

use comfy_table::{Table, presets::NOTHING};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use noops_api::{EtcdCluster, KubernetesCluster, KubernetesControlPlane, Machine, MachineDeployment, MachineSet};

/// The objects of the cluster's namespace a tree may show.
#[derive(Debug, Clone, Default)]
pub struct Parts {
    pub control_planes: Vec<KubernetesControlPlane>,
    pub etcds: Vec<EtcdCluster>,
    pub deployments: Vec<MachineDeployment>,
    pub sets: Vec<MachineSet>,
    pub machines: Vec<Machine>,
}

/// One object's line, before it is indented.
#[derive(Debug, Clone, Default, PartialEq)]
struct Line {
    what: String,
    ready: String,
    reason: String,
    phase: String,
    details: String,
}

#[derive(Debug, Clone, Default)]
struct Node {
    line: Line,
    children: Vec<Node>,
}

/// The tree of `kc` as text, a header and one line per object.
pub fn render(kc: &KubernetesCluster, parts: &Parts) -> String {
    let mut table = Table::new();
    table
        .load_preset(NOTHING)
        .set_header(["RESOURCE", "READY", "REASON", "PHASE", "DETAILS"]);
    for (prefix, line) in flatten(&cluster(kc, parts)) {
        table.add_row([
            format!("{prefix}{}", line.what),
            line.ready,
            line.reason,
            line.phase,
            line.details,
        ]);
    }
    table
        .to_string()
        .lines()
        // Flush left, as kubectl's tables are.
        .map(|l| format!("{}\n", l.strip_prefix(' ').unwrap_or(l).trim_end()))
        .collect()
}

/// Each node's line after the branches that lead to it, depth first.
fn flatten(root: &Node) -> Vec<(String, Line)> {
    let mut out = vec![(String::new(), root.line.clone())];
    branches(&root.children, "", &mut out);
    out
}

fn branches(children: &[Node], indent: &str, out: &mut Vec<(String, Line)>) {
    for (i, child) in children.iter().enumerate() {
        let last = i + 1 == children.len();
        let (branch, below) = if last { ("└─ ", "   ") } else { ("├─ ", "│  ") };
        out.push((format!("{indent}{branch}"), child.line.clone()));
        branches(&child.children, &format!("{indent}{below}"), out);
    }
}

fn cluster(kc: &KubernetesCluster, parts: &Parts) -> Node {
    let name = kc.metadata.name.clone().unwrap_or_default();
    let status = kc.status.clone().unwrap_or_default();
    let mut details = vec![status.version.clone().unwrap_or_else(|| "no version yet".into())];
    if let Some(nodes) = &status.nodes {
        details.push(format!("nodes {nodes}"));
    }
    let mut children = Vec::new();
    let control_plane = parts
        .control_planes
        .iter()
        .find(|c| owns(&kc.metadata, &c.metadata))
        .or_else(|| {
            parts
                .control_planes
                .iter()
                .find(|c| c.metadata.name.as_ref() == Some(&name))
        });
    match control_plane {
        Some(kcp) => children.push(control_plane_node(kcp, parts)),
        None => children.push(missing(format!("KubernetesControlPlane {name}"))),
    }
    let mut shown: Vec<&MachineDeployment> = Vec::new();
    for pool in &kc.spec.workers {
        let deployment_name = status
            .pools
            .iter()
            .find(|p| p.name == pool.name)
            .map(|p| p.machine_deployment.clone())
            .unwrap_or_else(|| format!("{name}-{}", pool.name));
        let md = parts
            .deployments
            .iter()
            .find(|d| d.metadata.name.as_ref() == Some(&deployment_name));
        match md {
            Some(md) => {
                shown.push(md);
                children.push(deployment_node(md, &format!("pool {}", pool.name), parts));
            }
            None => children.push(missing(format!(
                "MachineDeployment {deployment_name} (pool {})",
                pool.name
            ))),
        }
    }
    // A pool taken out of the spec keeps its MachineDeployment while its machines drain.
    for md in parts.deployments.iter().filter(|d| owns(&kc.metadata, &d.metadata)) {
        if !shown.iter().any(|s| s.metadata.name == md.metadata.name) {
            children.push(deployment_node(md, "pool removed from the spec", parts));
        }
    }
    // Machines that joined the cluster outside its pools (made by hand, or of a set no pool
    // holds): the cluster has them all the same.
    let control_plane_name = control_plane
        .and_then(|c| c.metadata.name.clone())
        .unwrap_or_else(|| name.clone());
    let in_pools: Vec<&MachineSet> = parts
        .sets
        .iter()
        .filter(|s| parts.deployments.iter().any(|d| owns(&d.metadata, &s.metadata)))
        .collect();
    for machine in &parts.machines {
        let of_cluster = machine.spec.cluster_name == control_plane_name;
        let in_a_pool = in_pools.iter().any(|s| owns(&s.metadata, &machine.metadata));
        if of_cluster && !in_a_pool {
            let mut node = machine_node(machine);
            node.line.details = format!("{}, in no pool", node.line.details);
            children.push(node);
        }
    }
    Node {
        line: line(
            format!(
                "KubernetesCluster {}/{name}",
                kc.metadata.namespace.as_deref().unwrap_or_default()
            ),
            &status.conditions,
            status.phase.map(|p| p.to_string()),
            details.join(", "),
        ),
        children,
    }
}

fn control_plane_node(kcp: &KubernetesControlPlane, parts: &Parts) -> Node {
    let name = kcp.metadata.name.clone().unwrap_or_default();
    let status = kcp.status.clone().unwrap_or_default();
    let mut details = vec![status.version.clone().unwrap_or_else(|| "no version yet".into())];
    if let Some(ready) = &status.ready {
        details.push(format!("API servers {ready}"));
    }
    if let Some(endpoint) = &status.endpoint {
        details.push(endpoint.clone());
    }
    let etcd_name = format!("{name}-etcd");
    let etcd = parts
        .etcds
        .iter()
        .find(|e| owns(&kcp.metadata, &e.metadata))
        .or_else(|| {
            parts
                .etcds
                .iter()
                .find(|e| e.metadata.name.as_ref() == Some(&etcd_name))
        });
    let child = match etcd {
        Some(etcd) => {
            let status = etcd.status.clone().unwrap_or_default();
            let version = status
                .current_version
                .clone()
                .unwrap_or_else(|| etcd.spec.version.clone());
            Node {
                line: line(
                    format!("EtcdCluster {}", etcd.metadata.name.clone().unwrap_or_default()),
                    &status.conditions,
                    status.phase.map(|p| p.to_string()),
                    format!("{version}, members {}/{}", status.ready_members, etcd.spec.replicas),
                ),
                children: Vec::new(),
            }
        }
        None => missing(format!("EtcdCluster {etcd_name}")),
    };
    Node {
        line: line(
            format!("KubernetesControlPlane {name}"),
            &status.conditions,
            status.phase.map(|p| p.to_string()),
            details.join(", "),
        ),
        children: vec![child],
    }
}

fn deployment_node(md: &MachineDeployment, pool: &str, parts: &Parts) -> Node {
    let status = md.status.clone().unwrap_or_default();
    let current = status.current_machine_set.clone();
    let mut sets: Vec<&MachineSet> = parts.sets.iter().filter(|s| owns(&md.metadata, &s.metadata)).collect();
    sets.sort_by_key(|s| s.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let children = sets
        .into_iter()
        .map(|set| set_node(set, current.as_deref(), parts))
        .collect();
    Node {
        line: line(
            format!("MachineDeployment {}", md.metadata.name.clone().unwrap_or_default()),
            &status.conditions,
            status.phase.map(|p| p.to_string()),
            format!(
                "{pool}, {}, ready {}/{}, updated {}",
                md.spec.template.spec.version,
                status.ready_replicas.unwrap_or(0),
                md.spec.replicas,
                status.updated_replicas.unwrap_or(0)
            ),
        ),
        children,
    }
}

fn set_node(set: &MachineSet, current: Option<&str>, parts: &Parts) -> Node {
    let name = set.metadata.name.clone().unwrap_or_default();
    let status = set.status.clone().unwrap_or_default();
    let mut machines: Vec<&Machine> = parts
        .machines
        .iter()
        .filter(|m| owns(&set.metadata, &m.metadata))
        .collect();
    machines.sort_by_key(|m| m.metadata.name.clone());
    let mut details = format!(
        "{}, ready {}/{}",
        set.spec.template.spec.version,
        status.ready_replicas.unwrap_or(0),
        set.spec.replicas
    );
    if current == Some(name.as_str()) {
        details.push_str(", current");
    }
    Node {
        line: line(format!("MachineSet {name}"), &status.conditions, None, details),
        children: machines.into_iter().map(machine_node).collect(),
    }
}

fn machine_node(machine: &Machine) -> Node {
    let status = machine.status.clone().unwrap_or_default();
    let phase = match (&machine.metadata.deletion_timestamp, status.phase) {
        (Some(_), _) => Some("Deleting".to_string()),
        (None, phase) => phase.map(|p| p.as_str().to_string()),
    };
    let mut details = vec![match &status.node_name {
        Some(node) => format!("node {node}"),
        None => "no node yet".into(),
    }];
    details.extend(status.version.clone());
    details.extend(status.address.clone());
    Node {
        line: line(
            format!("Machine {}", machine.metadata.name.clone().unwrap_or_default()),
            &status.conditions,
            phase,
            details.join(", "),
        ),
        children: Vec::new(),
    }
}

/// The line of an object: its Ready condition's status and reason.
fn line(what: String, conditions: &[Condition], phase: Option<String>, details: String) -> Line {
    let ready = conditions.iter().find(|c| c.type_ == noops_api::condition::READY);
    Line {
        what,
        ready: ready.map_or_else(|| "-".into(), |c| c.status.clone()),
        reason: ready.map(|c| c.reason.clone()).unwrap_or_default(),
        phase: phase.unwrap_or_default(),
        details,
    }
}

/// The line of a child the cluster should have and the namespace does not hold (yet).
fn missing(what: String) -> Node {
    Node {
        line: Line {
            what,
            ready: "-".into(),
            reason: "NotFound".into(),
            details: "not made yet, or deleted".into(),
            ..Default::default()
        },
        children: Vec::new(),
    }
}

/// Whether `owner` is among the owners of `child`.
fn owns(owner: &ObjectMeta, child: &ObjectMeta) -> bool {
    let Some(uid) = &owner.uid else { return false };
    child
        .owner_references
        .as_ref()
        .is_some_and(|refs| refs.iter().any(|r| &r.uid == uid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn condition(status: &str, reason: &str) -> serde_json::Value {
        json!([{ "type": "Ready", "status": status, "reason": reason, "message": "",
                 "lastTransitionTime": "2026-11-26T11:00:00Z" }])
    }

    fn owned(name: &str, uid: &str, owner: Option<&str>) -> serde_json::Value {
        let mut meta = json!({ "name": name, "namespace": "t", "uid": uid,
                               "creationTimestamp": "2026-11-26T10:00:00Z" });
        if let Some(owner) = owner {
            meta["ownerReferences"] = json!([{ "apiVersion": "noops.dev/v1alpha1", "kind": "Owner",
                                                "name": "owner", "uid": owner }]);
        }
        meta
    }

    fn template(version: &str) -> serde_json::Value {
        json!({ "metadata": { "labels": { "pool": "p" } }, "spec": { "version": version } })
    }

    fn fixture() -> (KubernetesCluster, Parts) {
        let kc = serde_json::from_value(json!({
            "apiVersion": "noops.dev/v1alpha1", "kind": "KubernetesCluster",
            "metadata": owned("acme", "kc", None),
            "spec": { "version": "1.34", "workers": [
                { "name": "general", "replicas": 2 },
                { "name": "burst", "minReplicas": 1, "maxReplicas": 3 },
            ] },
            "status": { "phase": "Running", "version": "1.34.4", "nodes": "1/2",
                        "conditions": condition("False", "WorkersNotReady"),
                        "pools": [{ "name": "general", "machineDeployment": "acme-general",
                                    "desired": 2, "ready": 1, "updated": 2 }] },
        }))
        .unwrap();
        let kcp = serde_json::from_value(json!({
            "apiVersion": "noops.dev/v1alpha1", "kind": "KubernetesControlPlane",
            "metadata": owned("acme", "kcp", Some("kc")),
            "spec": { "version": "1.34.4" },
            "status": { "phase": "Running", "version": "1.34.4", "ready": "1/1",
                        "endpoint": "https://10.96.0.9:6443", "conditions": condition("True", "Ready") },
        }))
        .unwrap();
        // Found by its name: no owner reference.
        let etcd = serde_json::from_value(json!({
            "apiVersion": "noops.dev/v1alpha1", "kind": "EtcdCluster",
            "metadata": owned("acme-etcd", "etcd", None),
            "spec": { "replicas": 3, "version": "3.6.5" },
            "status": { "phase": "Running", "readyMembers": 3, "currentVersion": "3.6.5",
                        "conditions": condition("True", "Ready") },
        }))
        .unwrap();
        let md = |name: &str, uid: &str| -> MachineDeployment {
            serde_json::from_value(json!({
                "apiVersion": "noops.dev/v1alpha1", "kind": "MachineDeployment",
                "metadata": owned(name, uid, Some("kc")),
                "spec": { "clusterName": "acme", "replicas": 2, "selector": { "matchLabels": { "pool": "p" } },
                          "template": template("1.34.4") },
                "status": { "phase": "Running", "readyReplicas": 1, "updatedReplicas": 2,
                            "currentMachineSet": format!("{name}-a"),
                            "conditions": condition("False", "MachinesNotReady") },
            }))
            .unwrap()
        };
        let set = |name: &str, uid: &str, owner: &str| -> MachineSet {
            serde_json::from_value(json!({
                "apiVersion": "noops.dev/v1alpha1", "kind": "MachineSet",
                "metadata": owned(name, uid, Some(owner)),
                "spec": { "clusterName": "acme", "replicas": 2, "selector": { "matchLabels": { "pool": "p" } },
                          "template": template("1.34.4") },
                "status": { "readyReplicas": 1, "conditions": condition("False", "MachinesNotReady") },
            }))
            .unwrap()
        };
        let machine = |name: &str, owner: Option<&str>, ready: &str, reason: &str| -> Machine {
            serde_json::from_value(json!({
                "apiVersion": "noops.dev/v1alpha1", "kind": "Machine",
                "metadata": owned(name, name, owner),
                "spec": { "clusterName": "acme", "version": "1.34.4" },
                "status": { "phase": "Running", "nodeName": name, "version": "v1.34.4",
                            "conditions": condition(ready, reason) },
            }))
            .unwrap()
        };
        let parts = Parts {
            control_planes: vec![kcp],
            etcds: vec![etcd],
            deployments: vec![md("acme-general", "md-general"), md("acme-old", "md-old")],
            sets: vec![
                set("acme-general-a", "ms-a", "md-general"),
                set("acme-old-a", "ms-old", "md-old"),
            ],
            machines: vec![
                machine("acme-general-a-1", Some("ms-a"), "False", "NodeNotReady"),
                machine("acme-general-a-0", Some("ms-a"), "True", "NodeReady"),
                machine("acme-old-a-0", Some("ms-old"), "True", "NodeReady"),
                machine("by-hand", None, "True", "NodeReady"),
            ],
        };
        (kc, parts)
    }

    #[test]
    fn the_tree_goes_from_the_cluster_to_each_machine_with_its_ready_reason_and_node() {
        let (kc, parts) = fixture();
        let text = render(&kc, &parts);
        let lines: Vec<&str> = text.lines().collect();
        // The first column, up to where the header's second starts.
        let width = lines[0].find("READY").unwrap();
        let starts: Vec<String> = lines
            .iter()
            .skip(1)
            .map(|l| l.chars().take(width).collect::<String>().trim_end().to_string())
            .collect();
        assert_eq!(
            starts,
            [
                "KubernetesCluster t/acme",
                "├─ KubernetesControlPlane acme",
                "│  └─ EtcdCluster acme-etcd",
                "├─ MachineDeployment acme-general",
                "│  └─ MachineSet acme-general-a",
                "│     ├─ Machine acme-general-a-0",
                "│     └─ Machine acme-general-a-1",
                "├─ MachineDeployment acme-burst (pool burst)",
                "├─ MachineDeployment acme-old",
                "│  └─ MachineSet acme-old-a",
                "│     └─ Machine acme-old-a-0",
                "└─ Machine by-hand",
            ],
            "\n{text}"
        );
        let line = |start: &str| {
            *lines
                .iter()
                .find(|l| l.contains(start))
                .unwrap_or_else(|| panic!("no {start}:\n{text}"))
        };
        assert!(
            line("KubernetesCluster t/acme").contains("False  WorkersNotReady"),
            "{text}"
        );
        assert!(line("EtcdCluster").contains("3.6.5, members 3/3"), "{text}");
        assert!(line("KubernetesControlPlane").contains("API servers 1/1"), "{text}");
        let sick = line("Machine acme-general-a-1");
        assert!(
            sick.contains("False  NodeNotReady") && sick.contains("node acme-general-a-1"),
            "{sick}"
        );
        assert!(line("acme-burst").contains("NotFound"), "{text}");
        assert!(
            line("MachineDeployment acme-general").contains("pool general"),
            "{text}"
        );
        assert!(line("MachineDeployment acme-old").contains("pool removed"), "{text}");
        assert!(line("MachineSet acme-general-a").contains("current"), "{text}");
        assert!(line("Machine by-hand").contains("in no pool"), "{text}");
    }

    #[test]
    fn a_cluster_without_children_yet_says_what_is_missing() {
        let (kc, _) = fixture();
        let text = render(&kc, &Parts::default());
        assert!(text.contains("KubernetesControlPlane acme"), "{text}");
        assert!(
            text.lines().filter(|l| l.contains("NotFound")).count() == 3,
            "the control plane and both pools:\n{text}"
        );
    }
}
