//! Machines, MachineSets and MachineDeployments on the local Kubernetes: what their schemas
//! refuse; machines that join a hosted control plane, run its pods across them and drain before
//! they go. Needs `make cluster-up` (3 nodes).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use noops_api::machine_deployment::MachineDeploymentPhase;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, LogParams};
use noops_api::{Machine, MachineDeployment, MachineSet};
use noops_e2e::certificates::{certificate_in, not_after, presented_certificate};
use noops_e2e::deletions::DeletionWatch;
use noops_e2e::tenant::{ForgetMachines, Tenant, wait_machines_gone, wait_nodes_at};
use noops_e2e::traffic::{EndpointHistory, Poller, held_app, load_balancer, web_app_without_budget};
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

/// `kubectl wait` (up to 3 minutes) for these machines of `ns` to be Ready.
fn wait_machines_ready(ns: &TestNamespace, names: &[&str]) {
    let machines: Vec<String> = names.iter().map(|n| format!("machine/{n}")).collect();
    let mut args = vec!["wait", "-n", &ns.name, "--for=condition=Ready", "--timeout=180s"];
    args.extend(machines.iter().map(String::as_str));
    kubectl_ok(&args, None);
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

#[tokio::test]
async fn machines_join_their_control_plane_run_its_pods_and_drain_before_they_go() {
    install_crds();
    let ns = TestNamespace::new("machines").await;
    let _forget = ForgetMachines(ns.name.clone());
    let operator = Operator::start(&ns.name, &["--controllers", "kubernetescontrolplane,etcd,machine"]);
    ns.apply("apiVersion: noops.dev/v1alpha1\nkind: KubernetesControlPlane\nmetadata: { name: c }\nspec: { version: \"1.33\", replicas: 1, etcd: { replicas: 1 } }\n");
    // Machines applied with their control plane: they wait for it to serve.
    ns.apply(&joined_machine("c-a", "c", "1.33"));
    ns.apply(&joined_machine("c-b", "c", "1.33"));
    // A kubelet newer than its API server is refused: no VM is made for it.
    ns.apply(&joined_machine("c-too-new", "c", "1.34"));
    let tenant = Tenant::ready(&ns, "c", 4 * MINUTE).await;
    wait_machines_ready(&ns, &["c-a", "c-b"]);
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
        assert!(line.contains("Running") && line.contains("1.33.13"), "{line}");
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
        assert_eq!(info.kubelet_version, "v1.33.13");
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
    let (target, logs) = reach_across(&tenant, &pods, "c-a", "c-b").await;
    assert!(
        logs.contains(&format!("http://{target}:8080/ hello from c-b")),
        "{logs}"
    );
    assert!(
        logs.contains("http://web.default.svc.cluster.local/ hello from c-"),
        "{logs}"
    );

    // What of machine c-b runs on this machine: its agent and kube-proxy, and its tenant pods
    // (their text names their node). All of it must end with the machine.
    let of_b = |p: &String| p.contains("=c-b ") || p.contains("hello from c-b ");
    let running: Vec<String> = processes_with("c-b ").into_iter().filter(of_b).collect();
    assert!(
        running.iter().filter(|p| p.contains("=c-b ")).count() >= 2,
        "the agent and kube-proxy of c-b are not seen running: {running:?}"
    );
    assert!(
        running.iter().any(|p| p.contains("hello from c-b ")),
        "no tenant pod of c-b seen running: {running:?}"
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
        !processes_with("c-b ").iter().any(of_b)
    })
    .await;
    // The last machine goes before its control plane, while the operator runs (without the
    // budget, which would rightly hold the drain of the only machine left).
    tenant.kubectl_ok(&["delete", "pdb", "web"], None);
    machines.delete("c-a", &Default::default()).await.unwrap();
    machines.delete("c-too-new", &Default::default()).await.unwrap();
    wait_machines_gone(&ns, 2 * MINUTE).await;
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

/// From a pod on machine `from`, asks a web pod on machine `to` by its address and the web
/// Service by its DNS name (a few tries each: endpoints reach kube-proxy a moment after the
/// pods are Ready). Returns the address asked and what the probe printed.
async fn reach_across(tenant: &Tenant, pods: &Api<Pod>, from: &str, to: &str) -> (String, String) {
    let web = pods.list(&ListParams::default().labels("app=web")).await.unwrap().items;
    let on_to = web
        .iter()
        .find(|p| pod_node(p) == to)
        .unwrap_or_else(|| panic!("no web pod on {to}: {:?}", web.iter().map(pod_node).collect::<Vec<_>>()));
    assert!(web.iter().any(|p| pod_node(p) == from), "no web pod on {from}");
    let target = pod_ip(on_to).unwrap();
    let name = format!("probe-{from}");
    tenant.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{ name: {name}, namespace: default }}
spec:
  nodeName: {from}
  restartPolicy: Never
  containers:
    - name: probe
      image: python:3
      command: ["python3", "-c", "import time, urllib.request as u\nfor url in ['http://{target}:8080/', 'http://web.default.svc.cluster.local/']:\n  for attempt in range(20):\n    try:\n      print(url, u.urlopen(url, timeout=5).read().decode().strip()); break\n    except Exception as e:\n      print(url, 'not yet:', e); time.sleep(0.5)\n"]
"#
    ));
    let logs = wait_for("the probe's answers", MINUTE, || async {
        let pod = pods.get_opt(&name).await.ok().flatten()?;
        matches!(pod.status?.phase.as_deref(), Some("Succeeded" | "Failed")).then_some(())?;
        pods.logs(&name, &LogParams::default()).await.ok()
    })
    .await;
    (target, logs)
}

/// Waits until the MachineDeployment has rolled out `replicas` machines of its template, none
/// left being deleted.
async fn wait_rolled_out(ns: &TestNamespace, replicas: i32, timeout: Duration) -> MachineDeployment {
    let api = ns.api::<MachineDeployment>();
    wait_for(
        &format!("the pool rolled out with {replicas} machines"),
        timeout,
        || async {
            let md = api.get("pool").await.ok()?;
            let status = md.status.clone()?;
            let ready = status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (ready
                && status.observed_generation == md.metadata.generation
                && status.ready_replicas == Some(replicas)
                && status.replicas == Some(replicas)
                && status.deleting_replicas == Some(0))
            .then_some(md)
        },
    )
    .await
}

/// The pool's MachineDeployment `pool` of cluster `c`, `replicas` machines of `template`.
fn pool(replicas: i32, template: &str) -> String {
    format!(
        "apiVersion: noops.dev/v1alpha1\nkind: MachineDeployment\nmetadata: {{ name: pool }}\nspec:\n  clusterName: c\n  replicas: {replicas}\n  progressDeadlineSeconds: 30\n  selector: {{ matchLabels: {{ pool: p }} }}\n  template:\n    metadata: {{ labels: {{ pool: p }} }}\n    spec: {{ {template} }}\n"
    )
}

/// Control plane `c` of one API server and one etcd member at `version`.
fn control_plane(version: &str) -> String {
    format!(
        "apiVersion: noops.dev/v1alpha1\nkind: KubernetesControlPlane\nmetadata: {{ name: c }}\nspec: {{ version: \"{version}\", replicas: 1, etcd: {{ replicas: 1 }} }}\n"
    )
}

#[tokio::test]
async fn a_machine_deployment_scales_and_rolls_to_a_new_version_without_a_failed_request() {
    install_crds();
    let ns = TestNamespace::new("md").await;
    let _forget = ForgetMachines(ns.name.clone());
    let operator = Operator::start(
        &ns.name,
        &[
            "--controllers",
            "kubernetescontrolplane,etcd,machine,machineset,machinedeployment",
        ],
    );
    ns.apply(&control_plane("1.33"));
    ns.apply(&pool(2, "version: \"1.33\""));
    let tenant = Tenant::ready(&ns, "c", 4 * MINUTE).await;
    wait_rolled_out(&ns, 2, 4 * MINUTE).await;
    let story = kubectl_ok(&["get", "md,ms,machines", "-n", &ns.name], None);
    assert_eq!(
        story.matches("Running").count(),
        3,
        "the pool and its 2 machines: {story}"
    );
    // Every deletion from here on is judged as the watch sees it.
    let deletions = DeletionWatch::start(&ns, "pool", "pool=p");

    // Scaled up to 4, then down to 1: machines are added, then drained and deleted; then 3.
    kubectl_ok(&["scale", "-n", &ns.name, "md/pool", "--replicas=4"], None);
    wait_rolled_out(&ns, 4, 3 * MINUTE).await;
    kubectl_ok(&["scale", "-n", &ns.name, "md/pool", "--replicas=1"], None);
    wait_rolled_out(&ns, 1, 3 * MINUTE).await;
    let machines = ns.api::<Machine>();
    assert_eq!(
        machines.list(&ListParams::default()).await.unwrap().items.len(),
        1,
        "rolled out only once the machines scaled away are gone"
    );
    // Paused means one thing on every kind: nothing changes. The deployment paused, its scale
    // to 3 waits; then its set paused, the deployment resumed scales the set, and the set
    // still makes nothing; the set resumed, the machines come.
    let noops = |args: &[&str]| {
        let out = noops_e2e::plugin::kubectl_noops(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
    };
    let paused_condition = |conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]| {
        conditions.iter().any(|c| c.type_ == "Paused" && c.status == "True")
    };
    let md_api = ns.api::<MachineDeployment>();
    let set_api = ns.api::<MachineSet>();
    noops(&["pause", "md/pool", "-n", &ns.name]);
    kubectl_ok(&["scale", "-n", &ns.name, "md/pool", "--replicas=3"], None);
    wait_until("the deployment says Paused", MINUTE, || async {
        md_api
            .get("pool")
            .await
            .ok()
            .and_then(|d| d.status)
            .is_some_and(|s| paused_condition(&s.conditions) && s.phase == Some(MachineDeploymentPhase::Paused))
    })
    .await;
    let set = set_api.list(&ListParams::default()).await.unwrap().items[0]
        .metadata
        .name
        .clone()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let count = || async { machines.list(&ListParams::default()).await.unwrap().items.len() };
    assert_eq!(count().await, 1, "a paused deployment scaled");
    noops(&["pause", &format!("ms/{set}"), "-n", &ns.name]);
    noops(&["resume", "md/pool", "-n", &ns.name]);
    wait_until("the set scaled to 3 and saying Paused", MINUTE, || async {
        set_api
            .get(&set)
            .await
            .is_ok_and(|s| s.spec.replicas == 3 && s.status.is_some_and(|st| paused_condition(&st.conditions)))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(count().await, 1, "a paused set made machines");
    noops(&["resume", &format!("ms/{set}"), "-n", &ns.name]);
    wait_rolled_out(&ns, 3, 3 * MINUTE).await;
    let resumed = md_api.get("pool").await.unwrap().status.unwrap_or_default();
    assert!(
        resumed
            .conditions
            .iter()
            .any(|c| c.type_ == "Paused" && c.status == "False"),
        "{resumed:?}"
    );

    // The tenant's app, one pod per machine and no budget, behind a NodePort; and a load
    // balancer in front of the machines, as a cloud gives one: a Service of this cluster over
    // the machines' pods.
    tenant.apply(&web_app_without_budget(3));
    tenant.kubectl_ok(&["rollout", "status", "deployment/web", "--timeout=120s"], None);
    // Across the machines: a pod on one reaches a pod on another and the Service.
    let pods: Api<Pod> = Api::namespaced(tenant.client.clone(), "default");
    let machine_names: Vec<String> = machines
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|m| m.metadata.name.clone())
        .collect();
    let (target, logs) = reach_across(&tenant, &pods, &machine_names[0], &machine_names[1]).await;
    assert!(logs.contains(&format!("http://{target}:8080/ hello")), "{logs}");
    assert!(logs.contains("http://web.default.svc.cluster.local/ hello"), "{logs}");
    let address = load_balancer(&ns, "c").await;
    let poller = Poller::start(address.clone())
        .following(EndpointHistory::start("management's lb", ns.api(), "lb"))
        .following(EndpointHistory::start(
            "tenant's web",
            Api::namespaced(tenant.client.clone(), "default"),
            "web",
        ));

    // The control plane first, then the machines to 1.34, one more at a time and none fewer
    // (the watch judges each deletion). An app whose budget allows no eviction holds the drain
    // of its machine: the rollout is not done while that old machine drains.
    ns.apply(&control_plane("1.34"));
    let api = ns.api::<noops_api::KubernetesControlPlane>();
    wait_until("the control plane at 1.34", 5 * MINUTE, || async {
        api.get("c").await.ok().and_then(|c| c.status).is_some_and(|s| {
            s.version.as_deref() == Some("1.34.4")
                && s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
        })
    })
    .await;
    tenant.apply(&held_app());
    tenant.kubectl_ok(&["rollout", "status", "deployment/held", "--timeout=120s"], None);
    ns.apply(&pool(3, "version: \"1.34\""));
    let md_api = ns.api::<MachineDeployment>();
    let held = wait_for(
        "every machine replaced but the one whose drain the budget holds",
        6 * MINUTE,
        || async {
            let listed = machines.list(&ListParams::default()).await.ok()?.items;
            let new_ready = listed
                .iter()
                .filter(|m| {
                    m.spec.template.version == "1.34"
                        && m.metadata.deletion_timestamp.is_none()
                        && machine_condition(m, "Ready").is_some_and(|(s, _, _)| s == "True")
                })
                .count();
            let old: Vec<&Machine> = listed.iter().filter(|m| m.spec.template.version != "1.34").collect();
            let [draining] = old.as_slice() else { return None };
            let (status, reason, message) = machine_condition(draining, "DrainingSucceeded")?;
            (new_ready == 3 && status == "False" && reason == "EvictionBlocked").then_some(message)
        },
    )
    .await;
    assert!(held.contains("held-"), "{held}");
    let md = wait_for("the deployment to count the draining machine", MINUTE, || async {
        let md = md_api.get("pool").await.ok()?;
        let status = md.status.clone()?;
        // The held drain named, and counted: the deployment's MachinesDeleting comes from the
        // set's, a pass after the set counted its machine.
        let named = status
            .conditions
            .iter()
            .any(|c| c.type_ == "MachinesDeleting" && c.reason == "DrainHeld");
        (status.deleting_replicas == Some(1) && status.updated_replicas == Some(3) && named).then_some(status)
    })
    .await;
    let ready = md.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        ready.status, "False",
        "rolled out while an old machine drains: {ready:?}"
    );
    assert_eq!(md.phase, Some(MachineDeploymentPhase::Rolling));
    // What holds it is named on the deployment: the machine, the pod and the budget.
    let deleting = md.conditions.iter().find(|c| c.type_ == "MachinesDeleting").unwrap();
    assert_eq!(
        (deleting.status.as_str(), deleting.reason.as_str()),
        ("True", "DrainHeld")
    );
    assert!(
        deleting.message.starts_with("machine pool-")
            && deleting.message.contains("default/held-")
            && deleting.message.contains("(budget held needs 1 healthy pods"),
        "{deleting:?}"
    );
    let line = kubectl_ok(&["get", "md/pool", "-n", &ns.name, "--no-headers"], None);
    assert!(line.contains("Rolling"), "{line}");
    tenant.kubectl_ok(&["delete", "pdb", "held"], None);
    wait_rolled_out(&ns, 3, 3 * MINUTE).await;
    let nodes: Api<Node> = Api::all(tenant.client.clone());
    wait_nodes_at(&nodes, 3, "v1.34.4", 2 * MINUTE).await;

    // A template whose image cannot start stalls with the reason; the old machines stay.
    let before: Vec<String> = machines
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|m| m.metadata.name.clone())
        .collect();
    ns.apply(&pool(3, "version: \"1.34\", image: \"noops/node:v1.34.99\""));
    let stalled = wait_for("the rollout to stall", 3 * MINUTE, || async {
        let md = md_api.get("pool").await.ok()?;
        let c = md.status?.conditions.into_iter().find(|c| c.type_ == "Progressing")?;
        (c.status == "False" && c.reason == "ProgressDeadlineExceeded").then_some(c.message)
    })
    .await;
    assert!(
        stalled.contains("ImagePull") || stalled.contains("ErrImagePull"),
        "{stalled}"
    );
    for name in &before {
        let m = machines.get(name).await.unwrap();
        assert!(
            m.metadata.deletion_timestamp.is_none(),
            "{name} was touched by a stalled rollout"
        );
        assert_eq!(m.status.unwrap().phase.map(|p| p.as_str()), Some("Running"));
    }
    wait_event(&ns, "MachineDeployment", "pool", "ProgressDeadlineExceeded").await;
    // Fixing the template completes the rollout (to the same version: nothing else changes).
    ns.apply(&pool(3, "version: \"1.34\""));
    wait_rolled_out(&ns, 3, 3 * MINUTE).await;

    poller.stop_expecting_every_answer(100).await;
    // Ready machines deleted: 3 by the scale-down, 3 by the rollout.
    let seen = deletions.stop_expecting_within_bounds(6).await;
    assert!(
        seen.most <= 4,
        "{} machines at once: more than maxSurge (1) above 3",
        seen.most
    );

    // Deleting the deployment removes every machine, and nothing of them runs here any more.
    let marker = format!("--provider-id=noops://{}/", ns.name);
    assert_eq!(
        processes_with(&marker).len(),
        3,
        "the agents of the 3 machines run here"
    );
    // A machine paused waits even once deleted: nothing of it is drained or removed until it
    // is resumed.
    let kept = machines.list(&ListParams::default()).await.unwrap().items[0]
        .metadata
        .name
        .clone()
        .unwrap();
    noops(&["pause", &format!("ma/{kept}"), "-n", &ns.name]);
    wait_until("the machine says Paused", MINUTE, || async {
        machines
            .get(&kept)
            .await
            .ok()
            .and_then(|m| m.status)
            .is_some_and(|s| paused_condition(&s.conditions))
    })
    .await;
    md_api.delete("pool", &Default::default()).await.unwrap();
    wait_until("every machine but the paused one gone", 3 * MINUTE, || async {
        let left = machines.list(&ListParams::default()).await.unwrap().items;
        left.len() == 1 && left[0].metadata.deletion_timestamp.is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        machines.get_opt(&kept).await.unwrap().is_some(),
        "a paused machine was removed"
    );
    assert_eq!(
        processes_with(&marker).len(),
        1,
        "the paused machine's agent still runs"
    );
    noops(&["resume", &format!("ma/{kept}"), "-n", &ns.name]);
    wait_machines_gone(&ns, 3 * MINUTE).await;
    wait_until("the machines' processes to end", MINUTE, || async {
        processes_with(&marker).is_empty()
    })
    .await;
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

#[tokio::test]
async fn the_operator_killed_at_each_step_of_a_rollout_and_a_drain_finishes_them_within_max_surge() {
    install_crds();
    let ns = TestNamespace::new("md-crash").await;
    let _forget = ForgetMachines(ns.name.clone());
    let points = std::env::temp_dir().join(format!("noops-crash-{}", ns.name));
    let _ = std::fs::remove_file(&points);
    let supervisor = Supervisor::start(&ns.name, &points);
    ns.apply("apiVersion: noops.dev/v1alpha1\nkind: KubernetesControlPlane\nmetadata: { name: c }\nspec: { version: \"1.34\", replicas: 1, etcd: { replicas: 1 } }\n");
    let pool = |cpu: i32| {
        format!(
            "apiVersion: noops.dev/v1alpha1\nkind: MachineDeployment\nmetadata: {{ name: pool }}\nspec:\n  clusterName: c\n  replicas: 2\n  selector: {{ matchLabels: {{ pool: p }} }}\n  template:\n    metadata: {{ labels: {{ pool: p }} }}\n    spec: {{ version: \"1.34\", flavor: {{ cpu: {cpu} }} }}\n"
        )
    };
    ns.apply(&pool(2));
    let tenant = Tenant::ready(&ns, "c", 4 * MINUTE).await;
    wait_rolled_out(&ns, 2, 4 * MINUTE).await;
    let echo = root().join("target/debug/http-echo");
    tenant.apply(&format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{ name: web, namespace: default }}\nspec:\n  replicas: 2\n  selector: {{ matchLabels: {{ app: web }} }}\n  template:\n    metadata: {{ labels: {{ app: web }} }}\n    spec:\n      containers: [{{ name: web, image: busybox, command: [\"{}\", \"-listen=:8080\", \"-text=hello\"] }}]\n---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{ name: web, namespace: default }}\nspec: {{ minAvailable: 1, selector: {{ matchLabels: {{ app: web }} }} }}\n",
        echo.display()
    ));
    tenant.kubectl_ok(&["rollout", "status", "deployment/web", "--timeout=120s"], None);
    let deletions = DeletionWatch::start(&ns, "pool", "pool=p");
    // A new flavor is a new template: every machine is replaced, each old one drained.
    ns.apply(&pool(3));
    wait_rolled_out(&ns, 2, 6 * MINUTE).await;
    let nodes: Api<Node> = Api::all(tenant.client.clone());
    wait_until("only Nodes of the new flavor", 3 * MINUTE, || async {
        let listed = nodes.list(&ListParams::default()).await.unwrap().items;
        listed.len() == 2
            && listed.iter().all(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.capacity.as_ref())
                    .and_then(|c| c.get("cpu"))
                    .is_some_and(|q| q.0 == "3")
            })
    })
    .await;
    tenant.kubectl_ok(&["rollout", "status", "deployment/web", "--timeout=120s"], None);
    // Both old machines went, each only with two others Ready, never more than 3 at once.
    let seen = deletions.stop_expecting_within_bounds(2).await;
    let (restarts, logs) = supervisor.stop().await;
    let crashed = std::fs::read_to_string(&points).unwrap_or_default();
    for point in [
        "machine: bootstrap Secret made, VM not yet",
        "machine: VM made, providerID not recorded",
        "machine: Node cordoned, not drained",
        "machine: Node deleted, VM not yet",
        "machineset: a machine made, the others and the status not yet",
        "machineset: a machine deleted, status not written",
        "machinedeployment: new set made, older sets not scaled",
        "machinedeployment: an older set scaled down, status not written",
    ] {
        assert!(
            crashed.lines().any(|l| l == point),
            "never crashed at {point:?}: {crashed}"
        );
    }
    assert!(restarts >= 8, "restarted {restarts} times");
    assert!(
        seen.most <= 3,
        "{} machines at once: more than maxSurge (1) above 2",
        seen.most
    );
    assert!(!logs.contains("panicked"), "{logs}");
    // Machines go while an operator runs (their finalizer drains them; the budget would hold
    // the drain of the last one).
    tenant.kubectl_ok(&["delete", "pdb", "web"], None);
    let operator = Operator::start(&ns.name, &[]);
    ns.api::<MachineDeployment>()
        .delete("pool", &Default::default())
        .await
        .unwrap();
    wait_machines_gone(&ns, 3 * MINUTE).await;
    drop(operator);
    let _ = std::fs::remove_file(&points);
}

#[tokio::test]
async fn a_machine_renews_its_certificates_before_they_expire() {
    // Certificates that last 150 s: issued again with 50 s left, on the VM's disk within its
    // node's 10 s sync (`node_sync_seconds` in hack/lib.sh), read by the agent within 10 s of
    // that.
    const LIFETIME: Duration = Duration::from_secs(150);
    install_crds();
    let ns = TestNamespace::new("machine-certs").await;
    let _forget = ForgetMachines(ns.name.clone());
    let lifetime = LIFETIME.as_secs().to_string();
    let _operator = Operator::start(
        &ns.name,
        &[
            "--controllers",
            "kubernetescontrolplane,etcd,machine",
            "--certificate-lifetime-seconds",
            &lifetime,
        ],
    );
    ns.apply("apiVersion: noops.dev/v1alpha1\nkind: KubernetesControlPlane\nmetadata: { name: c }\nspec: { version: \"1.34\", replicas: 1, etcd: { replicas: 1 } }\n");
    ns.apply(&joined_machine("c-a", "c", "1.34"));
    Tenant::ready(&ns, "c", 4 * MINUTE).await;
    wait_machines_ready(&ns, &["c-a"]);
    let bootstrap = "c-a-bootstrap";
    let first = not_after(&ns, bootstrap).await;

    let renewed = wait_for("the machine's certificates issued again", LIFETIME, || async {
        let now = not_after(&ns, bootstrap).await;
        (now != first).then_some(now)
    })
    .await;
    assert!(
        jiff::Timestamp::now() < first,
        "renewed before the first ones expired ({first})"
    );
    assert!(renewed > first);
    wait_event(&ns, "Machine", "c-a", "CertificatesRenewed").await;

    // The machine's kubelet API presents the renewed serving certificate, without a restart.
    let vm = ns.pods().get("c-a").await.unwrap();
    let address = format!("{}:10250", pod_ip(&vm).unwrap());
    let ca = certificate_in(&ns, bootstrap, "ca.crt").await;
    let serving = certificate_in(&ns, bootstrap, "serving.crt").await;
    wait_until(
        "the kubelet API serving the renewed certificate",
        2 * MINUTE,
        || async { presented_certificate(&address, Some("c-a"), &ca).is_ok_and(|c| c == serving) },
    )
    .await;

    // Past the end of the first certificates the machine works on the new ones: its Node's lease
    // is renewed after that, and a pod made then runs there and reports it.
    let expired = first + jiff::SignedDuration::from_secs(5);
    tokio::time::sleep(Duration::try_from(expired - jiff::Timestamp::now()).unwrap_or_default()).await;
    let tenant = Tenant::ready(&ns, "c", 2 * MINUTE).await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(tenant.client.clone(), "kube-node-lease");
    wait_until("the Node's lease renewed on the new certificate", MINUTE, || async {
        let renew = leases
            .get_opt("c-a")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.renew_time)
            .map(|t| t.0);
        renew.is_some_and(|t| t > expired)
    })
    .await;
    let echo = root().join("target/debug/http-echo");
    tenant.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{ name: after, namespace: default }}\nspec:\n  nodeName: c-a\n  containers:\n  - {{ name: echo, image: busybox, command: [\"{}\", \"-listen=:8080\"] }}\n",
        echo.display()
    ));
    let pods: Api<Pod> = Api::namespaced(tenant.client.clone(), "default");
    wait_until(
        "a pod made after the first certificates expired running",
        MINUTE,
        || async {
            pods.get_opt("after")
                .await
                .ok()
                .flatten()
                .and_then(|p| p.status?.phase)
                .is_some_and(|phase| phase == "Running")
        },
    )
    .await;
    let nodes: Api<Node> = Api::all(tenant.client.clone());
    let node = nodes.get("c-a").await.unwrap();
    assert_eq!(node_ready_status(&node).as_deref(), Some("True"));
}
