//! Machines, MachineSets and MachineDeployments on the local Kubernetes: what their schemas
//! refuse; machines that join a hosted control plane, run its pods across them and drain before
//! they go. Needs `make cluster-up` (3 nodes).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, LogParams};
use noops_api::{Machine, MachineDeployment, MachineSet};
use noops_e2e::tenant::Tenant;
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);

/// A MachineDeployment `md` of cluster `c` whose spec adds `rest` (YAML lines indented by two)
/// and whose template spec is `template`.
fn deployment(rest: &str, template: &str) -> String {
    format!(
        "apiVersion: noops.dev/v1alpha1\nkind: MachineDeployment\nmetadata: {{ name: md }}\nspec:\n  clusterName: c\n  selector: {{ matchLabels: {{ pool: p }} }}\n  template:\n    metadata: {{ labels: {{ pool: p }} }}\n    spec: {{ {template} }}\n{rest}"
    )
}

fn machine(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: noops.dev/v1alpha1\nkind: Machine\nmetadata: {{ name: {name} }}\nspec:\n  clusterName: c\n{spec}"
    )
}

#[tokio::test]
async fn bad_specs_are_refused_with_a_reason() {
    install_crds();
    let ns = TestNamespace::new("machines-bad").await;
    let v = "version: \"1.34\"";
    let refused_on_create = [
        (deployment("  replicas: -1\n", v), "replicas must be between 0 and 100"),
        (
            deployment("  replicas: 1000\n", v),
            "replicas must be between 0 and 100",
        ),
        (
            deployment("  strategy: { rollingUpdate: { maxSurge: 0, maxUnavailable: 0 } }\n", v),
            "maxSurge and maxUnavailable cannot both be 0",
        ),
        (
            deployment(
                "  strategy: { rollingUpdate: { maxSurge: \"0%\", maxUnavailable: 0 } }\n",
                v,
            ),
            "maxSurge and maxUnavailable cannot both be 0",
        ),
        (
            deployment("  strategy: { rollingUpdate: { maxSurge: \"150%\" } }\n", v),
            "maxSurge must be a number of machines",
        ),
        (
            deployment("  strategy: { rollingUpdate: { maxUnavailable: -1 } }\n", v),
            "maxUnavailable must be a number of machines",
        ),
        (
            deployment("  strategy: { type: OnDelete, rollingUpdate: { maxSurge: 1 } }\n", v),
            "strategy.rollingUpdate is only for type RollingUpdate",
        ),
        (
            deployment("", "version: \"v1.34.4\""),
            "version must be a Kubernetes version",
        ),
        (
            deployment("", "version: \"1.34.x\""),
            "version must be a Kubernetes version",
        ),
        (deployment("", "version: \"1.31\""), "version must be 1.33 or later"),
        (
            deployment("", &format!("{v}, flavor: {{ cpu: 0 }}")),
            "flavor.cpu must be between 1 and 64",
        ),
        (
            deployment("", &format!("{v}, flavor: {{ memory: 2GB }}")),
            "flavor.memory must be a whole number of Mi or Gi",
        ),
        (
            deployment("", &format!("{v}, flavor: {{ memory: 64Mi }}")),
            "flavor.memory must be at least 256Mi",
        ),
        (
            deployment("", &format!("{v}, flavor: {{ pods: 500 }}")),
            "flavor.pods must be between 1 and 250",
        ),
        (
            deployment("", &format!("{v}, nodeDrainTimeoutSeconds: -5")),
            "nodeDrainTimeoutSeconds must be between 0 and 86400",
        ),
        (
            deployment("  healthCheck: { unhealthyTimeoutSeconds: 1 }\n", v),
            "healthCheck.unhealthyTimeoutSeconds must be between 10 and 86400",
        ),
        (
            deployment("  healthCheck: { maxUnhealthy: lots }\n", v),
            "healthCheck.maxUnhealthy must be a number of machines",
        ),
        (
            deployment("  progressDeadlineSeconds: 0\n", v),
            "progressDeadlineSeconds must be between 30 and 86400",
        ),
        (
            deployment("  deletePolicy: Smallest\n", v),
            "Unsupported value: \"Smallest\"",
        ),
        (
            deployment("", v).replace(
                "    metadata: { labels: { pool: p } }",
                "    metadata: { labels: { pool: q } }",
            ),
            "selector.matchLabels must be among template.metadata.labels",
        ),
        (
            deployment("", v).replace("clusterName: c", "clusterName: Not_A_Name"),
            "clusterName must name a KubernetesControlPlane",
        ),
        (
            machine("m", "  version: \"1.34\"\n  image: \"noops/node v1\"\n"),
            "image must be an image reference",
        ),
        (
            machine("M_1", "  version: \"1.34\"\n"),
            "a Machine name must be a DNS label",
        ),
    ];
    for (yaml, expected) in &refused_on_create {
        let error = apply_error(&ns, yaml).unwrap_or_else(|| panic!("accepted:\n{yaml}"));
        assert!(error.contains(expected), "refused, but not with {expected:?}: {error}");
    }

    // Refused as changes. No operator runs here: nothing is made.
    ns.apply(&deployment("", v));
    ns.apply(&machine("m", "  version: \"1.34\"\n"));
    let refused_on_update = [
        (
            deployment("", v).replace("clusterName: c", "clusterName: d"),
            "clusterName is immutable",
        ),
        (
            deployment("", v)
                .replace("matchLabels: { pool: p }", "matchLabels: { pool: p, x: z }")
                .replace("labels: { pool: p }", "labels: { pool: p, x: z }"),
            "selector is immutable",
        ),
        (
            machine("m", "  version: \"1.33\"\n"),
            "version, flavor and image are immutable",
        ),
        (
            machine("m", "  version: \"1.34\"\n  flavor: { cpu: 4 }\n"),
            "version, flavor and image are immutable",
        ),
    ];
    for (yaml, expected) in &refused_on_update {
        let error = apply_error(&ns, yaml).unwrap_or_else(|| panic!("accepted:\n{yaml}"));
        assert!(error.contains(expected), "refused, but not with {expected:?}: {error}");
    }
    // The template may change (that is a rollout); defaults are Cluster API's.
    assert_eq!(apply_error(&ns, &deployment("", "version: \"1.33\"")), None);
    let md = ns.api::<MachineDeployment>().get("md").await.unwrap();
    let surge = md.spec.strategy.rolling_update.clone().unwrap_or_default();
    assert_eq!(
        (surge.max_surge, surge.max_unavailable),
        (
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1),
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0)
        )
    );
    assert_eq!(md.spec.replicas, 1);
    assert_eq!(md.spec.template.spec.flavor.memory, "2Gi");
    // `kubectl scale` works on both (the scale subresource).
    kubectl_ok(&["scale", "-n", &ns.name, "md/md", "--replicas=3"], None);
    assert_eq!(ns.api::<MachineDeployment>().get("md").await.unwrap().spec.replicas, 3);
    ns.apply(
        &deployment("", v)
            .replace("kind: MachineDeployment", "kind: MachineSet")
            .replace("name: md", "name: ms"),
    );
    kubectl_ok(&["scale", "-n", &ns.name, "ms/ms", "--replicas=0"], None);
    assert_eq!(ns.api::<MachineSet>().get("ms").await.unwrap().spec.replicas, 0);
    let example = std::fs::read_to_string(root().join("examples/kubernetes/workers.yaml")).unwrap();
    assert_eq!(
        apply_error(&ns, &example),
        None,
        "examples/kubernetes/workers.yaml refused"
    );
}

/// A Machine of cluster `cluster` at `version`.
fn joined_machine(name: &str, cluster: &str, version: &str) -> String {
    format!(
        "apiVersion: noops.dev/v1alpha1\nkind: Machine\nmetadata: {{ name: {name} }}\nspec: {{ clusterName: {cluster}, version: \"{version}\" }}\n"
    )
}

/// The condition `type_` of a machine as (status, reason, message).
fn machine_condition(machine: &Machine, type_: &str) -> Option<(String, String, String)> {
    let c = machine.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Processes of this machine whose command line contains `text`.
fn processes_with(text: &str) -> Vec<String> {
    let mut out = vec![];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if entry.file_name().to_string_lossy().parse::<u32>().is_err() {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(text) {
                out.push(cmdline);
            }
        }
    }
    out
}

/// Drops the finalizers of the Machines left in a namespace when a test ends (its operator is
/// gone by then, and nothing else would let the namespace go).
struct ForgetMachines(String);

impl Drop for ForgetMachines {
    fn drop(&mut self) {
        let listed = kubectl(&["get", "machines", "-n", &self.0, "-o", "name"], None);
        for machine in String::from_utf8_lossy(&listed.stdout).lines() {
            let _ = kubectl(
                &[
                    "patch",
                    "-n",
                    &self.0,
                    machine,
                    "--type",
                    "merge",
                    "-p",
                    r#"{"metadata":{"finalizers":[]}}"#,
                ],
                None,
            );
        }
    }
}

#[tokio::test]
async fn machines_join_their_control_plane_run_its_pods_and_drain_before_they_go() {
    install_crds();
    let ns = TestNamespace::new("machines").await;
    let _forget = ForgetMachines(ns.name.clone());
    let operator = Operator::start(&ns.name, &["--controllers", "kubernetescontrolplane,etcd,machine"]);
    ns.apply("apiVersion: noops.dev/v1alpha1\nkind: KubernetesControlPlane\nmetadata: { name: c }\nspec: { version: \"1.34\", replicas: 1, etcd: { replicas: 1 } }\n");
    // Machines applied with their control plane: they wait for it to serve.
    ns.apply(&joined_machine("c-a", "c", "1.34"));
    ns.apply(&joined_machine("c-b", "c", "1.34"));
    // A kubelet newer than its API server is refused: no VM is made for it.
    ns.apply(&joined_machine("c-too-new", "c", "1.35"));
    let tenant = Tenant::ready(&ns, "c", 4 * MINUTE).await;
    kubectl_ok(
        &[
            "wait",
            "-n",
            &ns.name,
            "--for=condition=Ready",
            "machine/c-a",
            "machine/c-b",
            "--timeout=180s",
        ],
        None,
    );
    let machines = ns.api::<Machine>();
    let too_new = machines.get("c-too-new").await.unwrap();
    let (_, reason, message) = machine_condition(&too_new, "Ready").unwrap();
    assert_eq!(reason, "VersionTooNew", "{message}");
    assert!(message.contains("never newer than its API server"), "{message}");
    assert_eq!(
        too_new.status.as_ref().unwrap().phase.map(|p| p.as_str()),
        Some("Pending")
    );
    assert!(
        ns.pods().get_opt("c-too-new").await.unwrap().is_none(),
        "no VM for a refused machine"
    );
    wait_event(&ns, "Machine", "c-too-new", "VersionTooNew").await;

    // kubectl get machines tells the story; the tenant's Nodes say which machine they are.
    let listed = kubectl_ok(&["get", "machines", "-n", &ns.name], None);
    for name in ["c-a", "c-b"] {
        let line = listed
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{listed}"));
        assert!(line.contains("Running") && line.contains("1.34.4"), "{line}");
    }
    let nodes: Api<Node> = Api::all(tenant.client.clone());
    for name in ["c-a", "c-b"] {
        let node = nodes.get(name).await.unwrap();
        assert_eq!(node_ready_status(&node).as_deref(), Some("True"));
        let spec = node.spec.unwrap();
        assert_eq!(spec.provider_id, Some(format!("noops://{}/{name}", ns.name)));
        let range = spec.pod_cidr.clone().unwrap_or_default();
        assert!(
            range.starts_with("10.200."),
            "a range of the tenant's pod network: {spec:?}"
        );
        let info = node.status.unwrap().node_info.unwrap();
        assert_eq!(info.kubelet_version, "v1.34.4");
    }

    // A Deployment of 3 runs across both machines; a pod on one reaches a pod on the other by
    // its address and the Service by its DNS name.
    let echo = root().join("target/debug/http-echo");
    tenant.apply(&format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{ name: web, namespace: default }}
spec:
  replicas: 3
  selector: {{ matchLabels: {{ app: web }} }}
  template:
    metadata: {{ labels: {{ app: web }} }}
    spec:
      containers:
        - name: web
          image: busybox
          command: ["{}", "-listen=:8080", "-text=hello from $(NODE)"]
          env: [{{ name: NODE, valueFrom: {{ fieldRef: {{ fieldPath: spec.nodeName }} }} }}]
          readinessProbe: {{ httpGet: {{ path: /, port: 8080 }}, periodSeconds: 1 }}
---
apiVersion: v1
kind: Service
metadata: {{ name: web, namespace: default }}
spec:
  selector: {{ app: web }}
  ports: [{{ port: 80, targetPort: 8080 }}]
"#,
        echo.display()
    ));
    tenant.kubectl_ok(&["rollout", "status", "deployment/web", "--timeout=120s"], None);
    let pods: Api<Pod> = Api::namespaced(tenant.client.clone(), "default");
    let web = pods.list(&ListParams::default().labels("app=web")).await.unwrap().items;
    let on_b = web
        .iter()
        .find(|p| pod_node(p) == "c-b")
        .expect("a web pod on each machine");
    assert!(web.iter().any(|p| pod_node(p) == "c-a"), "a web pod on each machine");
    let target = pod_ip(on_b).unwrap();
    tenant.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{ name: probe, namespace: default }}
spec:
  nodeName: c-a
  restartPolicy: Never
  containers:
    - name: probe
      image: python:3
      command: ["python3", "-c", "import time, urllib.request as u\nfor url in ['http://{target}:8080/', 'http://web.default.svc.cluster.local/']:\n  for attempt in range(20):\n    try:\n      print(url, u.urlopen(url, timeout=5).read().decode().strip()); break\n    except Exception as e:\n      print(url, 'not yet:', e); time.sleep(0.5)\n"]
"#
    ));
    let logs = wait_for("the probe's answers", MINUTE, || async {
        let pod = pods.get_opt("probe").await.ok().flatten()?;
        matches!(pod.status?.phase.as_deref(), Some("Succeeded" | "Failed")).then_some(())?;
        pods.logs("probe", &LogParams::default()).await.ok()
    })
    .await;
    assert!(
        logs.contains(&format!("http://{target}:8080/ hello from c-b")),
        "{logs}"
    );
    assert!(
        logs.contains("http://web.default.svc.cluster.local/ hello from c-"),
        "{logs}"
    );

    // Deleting machine c-b drains it first: a PodDisruptionBudget that allows no disruption
    // holds the drain, and the Machine names the pods it keeps; allowing one lets it finish.
    tenant.apply("apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: { name: web, namespace: default }\nspec: { minAvailable: 3, selector: { matchLabels: { app: web } } }\n");
    tokio::time::sleep(Duration::from_secs(2)).await;
    machines.delete("c-b", &Default::default()).await.unwrap();
    let blocked = wait_for("the drain to be held by the budget", MINUTE, || async {
        let m = machines.get_opt("c-b").await.ok().flatten()?;
        let (status, reason, message) = machine_condition(&m, "DrainingSucceeded")?;
        (status == "False" && reason == "EvictionBlocked").then_some(message)
    })
    .await;
    let held = pods.list(&ListParams::default().labels("app=web")).await.unwrap().items;
    for pod in held.iter().filter(|p| pod_node(p) == "c-b") {
        assert!(blocked.contains(pod.metadata.name.as_deref().unwrap()), "{blocked}");
    }
    let b_node = nodes.get("c-b").await.unwrap();
    assert_eq!(b_node.spec.unwrap().unschedulable, Some(true), "cordoned first");
    wait_event(&ns, "Machine", "c-b", "EvictionBlocked").await;
    tenant.apply("apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: { name: web, namespace: default }\nspec: { minAvailable: 2, selector: { matchLabels: { app: web } } }\n");
    wait_until("machine c-b gone", 2 * MINUTE, || async {
        machines.get_opt("c-b").await.unwrap().is_none()
    })
    .await;
    assert!(nodes.get_opt("c-b").await.unwrap().is_none(), "its Node is deleted");
    assert!(ns.pods().get_opt("c-b").await.unwrap().is_none(), "its VM is deleted");
    let moved = pods.list(&ListParams::default().labels("app=web")).await.unwrap().items;
    assert!(
        moved.iter().all(|p| pod_node(p) == "c-a"),
        "the pods moved to the machine left"
    );
    tenant.kubectl_ok(&["rollout", "status", "deployment/web", "--timeout=60s"], None);
    // Nothing of machine c-b runs on this machine any more: its agent, kube-proxy, tenant pods.
    wait_until("c-b's processes to end", MINUTE, || async {
        processes_with("=c-b ").is_empty() && processes_with("=c-b\0").is_empty()
    })
    .await;
    // The last machine goes before its control plane, while the operator runs (without the
    // budget, which would rightly hold the drain of the only machine left).
    tenant.kubectl_ok(&["delete", "pdb", "web"], None);
    machines.delete("c-a", &Default::default()).await.unwrap();
    machines.delete("c-too-new", &Default::default()).await.unwrap();
    wait_until("every machine gone", 2 * MINUTE, || async {
        machines.list(&ListParams::default()).await.unwrap().items.is_empty()
    })
    .await;
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}
