//! KubernetesClusters on the local Kubernetes: one manifest for a whole tenant cluster, and its
//! upgrade in order (the control plane, then each pool) with an app answering throughout.
//! Needs `make cluster-up` (3 nodes).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use noops_api::kubernetes_cluster::KubernetesClusterPhase;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use noops_api::{KubernetesCluster, KubernetesControlPlane};
use noops_e2e::clusters::{CONTROLLERS, MostMachinesWatch, SkewWatch, UpgradeOrderWatch, cluster, wait_cluster};
use noops_e2e::deletions::DeletionWatch;
use noops_e2e::plugin::{kubectl_noops, stdout};
use noops_e2e::tenant::{ForgetMachines, Tenant, wait_machines_gone, wait_nodes_at};
use noops_e2e::traffic::{BudgetWatch, EndpointHistory, Poller, held_app, load_balancer, web_app};
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn bad_cluster_specs_are_refused_with_a_reason() {
    install_crds();
    let ns = TestNamespace::new("kc-bad").await;
    let v = "  version: \"1.33\"\n";
    let with = |rest: &str| cluster("kc", &format!("{v}{rest}"));
    let refused = [
        (cluster("kc", "  version: \"1.32\"\n"), "version must be 1.33 or later"),
        (
            cluster("kc", "  version: \"v1.34\"\n"),
            "version must be a Kubernetes version",
        ),
        (
            with("  controlPlane: { replicas: 2 }\n"),
            "controlPlane.replicas must be 1 or 3",
        ),
        (
            with("  controlPlane: { etcd: { replicas: 2 } }\n"),
            "etcd.replicas must be 1, 3 or 5",
        ),
        (
            with("  workers: [{ name: a }]\n"),
            "a pool has either replicas, or minReplicas and maxReplicas",
        ),
        (
            with("  workers: [{ name: a, replicas: 1, minReplicas: 1, maxReplicas: 2 }]\n"),
            "a pool has either replicas, or minReplicas and maxReplicas",
        ),
        (
            with("  workers: [{ name: a, minReplicas: 1 }]\n"),
            "a pool has either replicas",
        ),
        (
            with("  workers: [{ name: a, minReplicas: 3, maxReplicas: 2 }]\n"),
            "minReplicas must not be more than maxReplicas",
        ),
        (
            with("  workers: [{ name: a, replicas: 1 }, { name: a, replicas: 2 }]\n"),
            "pool names must be unique",
        ),
        (
            with("  workers: [{ name: Pool_A, replicas: 1 }]\n"),
            "a pool name must be a DNS label",
        ),
        (
            with("  workers: [{ name: a, replicas: 101 }]\n"),
            "replicas must be between 0 and 100",
        ),
        (
            with("  workers: [{ name: a, replicas: 1, flavor: { memory: 2GB } }]\n"),
            "flavor.memory must be a whole number of Mi or Gi",
        ),
        (
            with("  workers: [{ name: a, replicas: 1, scaleDownDelaySeconds: -1 }]\n"),
            "scaleDownDelaySeconds must be between 0 and 86400",
        ),
        (
            with("  upgrade: { maxSurge: 0, maxUnavailable: 0 }\n"),
            "maxSurge and maxUnavailable cannot both be 0",
        ),
        (
            with("  upgrade: { drainTimeoutSeconds: -5 }\n"),
            "upgrade.drainTimeoutSeconds must be between 0 and 86400",
        ),
        (
            cluster("a-cluster-name-that-is-far-too-long-for-its-children", v),
            "a KubernetesCluster name is at most 35 characters",
        ),
        (
            cluster(
                "a-much-longer-cluster-name",
                &format!("{v}  workers: [{{ name: a-long-pool-name-x, replicas: 1 }}]\n"),
            ),
            "a pool's MachineDeployment is <cluster>-<pool>, at most 40 characters",
        ),
        (
            with(
                "  bootstrap: { fromBackup: { name: b } }\n  controlPlane: { etcd: { storage: { ephemeral: true } } }\n",
            ),
            "bootstrap.fromBackup needs persistent etcd storage",
        ),
    ];
    for (yaml, expected) in &refused {
        let error = apply_error(&ns, yaml).unwrap_or_else(|| panic!("accepted:\n{yaml}"));
        assert!(error.contains(expected), "refused, but not with {expected:?}: {error}");
    }
    // The example is accepted; then a skipped minor, a downgrade and a changed bootstrap are not.
    let example = std::fs::read_to_string(root().join("examples/kubernetes/cluster.yaml")).unwrap();
    assert_eq!(
        apply_error(&ns, &example),
        None,
        "examples/kubernetes/cluster.yaml refused"
    );
    let kc = ns.api::<KubernetesCluster>().get("acme").await.unwrap();
    assert_eq!(
        kc.spec.upgrade.rolling_update.max_surge,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1)
    );
    assert_eq!(kc.spec.workers[1].scale_down_delay_seconds, 600);
    let edits = [
        (
            example.replace("version: \"1.33\"", "version: \"1.35\""),
            "upgrade one minor version at a time",
        ),
        (
            example.replace("upgrade: {", "bootstrap: { fromBackup: { name: b } }\n  upgrade: {"),
            "bootstrap is immutable",
        ),
    ];
    for (yaml, expected) in &edits {
        let error = apply_error(&ns, yaml).unwrap_or_else(|| panic!("accepted:\n{yaml}"));
        assert!(error.contains(expected), "refused, but not with {expected:?}: {error}");
    }
    // Versions are checked against what runs, as the operator writes it: the whole cluster
    // (status.version) and the API servers (status.controlPlaneVersion).
    let set_status = |status: &str| {
        kubectl_ok(
            &[
                "patch",
                "-n",
                &ns.name,
                "kc/acme",
                "--subresource=status",
                "--type=merge",
                "-p",
                status,
            ],
            None,
        )
    };
    set_status(r#"{"status":{"version":"1.33.13","controlPlaneVersion":"1.33.13"}}"#);
    let at = |version: &str| example.replace("version: \"1.33\"", &format!("version: \"{version}\""));
    ns.apply(&at("1.34"));
    // Mid-upgrade: the API servers on 1.34, a pool still on 1.33.
    set_status(r#"{"status":{"version":"1.33.13","controlPlaneVersion":"1.34.4"}}"#);
    let error = apply_error(&ns, &at("1.33")).expect("a downgrade below the API servers accepted");
    assert!(error.contains("downgrades are refused"), "{error}");
    let error = apply_error(&ns, &at("1.35")).expect("1.35 accepted while a pool runs 1.33");
    assert!(error.contains("one minor version at a time"), "{error}");
    let error = apply_error(
        &ns,
        &at("1.34").replace(
            "etcd: { replicas: 3 }",
            "etcd: { replicas: 3 }\n    networking: { podCIDR: 10.99.0.0/16 }",
        ),
    )
    .expect("a networking change accepted once the cluster served");
    assert!(error.contains("networking is immutable"), "{error}");
    // The rules judge a change of spec.version only: the status stays writable when it moves
    // past a version the schema let through before (here the API servers reach 1.35 while the
    // spec says 1.34).
    set_status(r#"{"status":{"controlPlaneVersion":"1.35.0"}}"#);
    set_status(r#"{"status":{"phase":"Degraded"}}"#);
    // A cluster that never served (its version's images are not there, say) may be set to any
    // supported version.
    let never_served = cluster("fresh", "  version: \"1.35\"\n");
    ns.apply(&never_served);
    assert_eq!(apply_error(&ns, &cluster("fresh", "  version: \"1.34\"\n")), None);
    // Ranges the control plane would refuse are refused here already.
    let error = apply_error(
        &ns,
        &with("  controlPlane: { networking: { podCIDR: 10.96.0.0/12, serviceCIDR: 10.96.0.0/16 } }\n"),
    )
    .expect("overlapping ranges accepted");
    assert!(error.contains("must not overlap"), "{error}");
}

#[tokio::test]
async fn one_manifest_makes_a_whole_cluster_and_an_upgrade_goes_in_order_without_a_failed_request() {
    install_crds();
    let ns = TestNamespace::new("kc").await;
    let _forget = ForgetMachines(ns.name.clone());
    let operator = Operator::start(&ns.name, &["--controllers", CONTROLLERS]);
    let manifest = std::fs::read_to_string(root().join("examples/kubernetes/cluster.yaml")).unwrap();
    ns.apply(&manifest);

    // One manifest: the control plane, then its pools (2 + 1 machines), all Ready.
    let kc = wait_cluster(&ns, "acme", "1.33.13", 8 * MINUTE).await;
    let status = kc.status.unwrap();
    assert_eq!(status.nodes.as_deref(), Some("3/3"));
    assert_eq!(status.kubeconfig_secret.as_deref(), Some("acme-admin-kubeconfig"));
    let pools: Vec<(String, i32, i32)> = status
        .pools
        .iter()
        .map(|p| (p.name.clone(), p.desired, p.ready))
        .collect();
    assert_eq!(pools, vec![("general".into(), 2, 2), ("burst".into(), 1, 1)]);
    assert!(
        status.pools.iter().all(|p| p.updated == p.desired),
        "{:?}",
        status.pools
    );
    for (type_, expected) in [
        ("ControlPlaneReady", "True"),
        ("WorkersReady", "True"),
        ("Upgrading", "False"),
        ("Scaling", "False"),
        ("Degraded", "False"),
    ] {
        let c = status.conditions.iter().find(|c| c.type_ == type_).unwrap();
        assert_eq!(c.status, expected, "{type_}: {c:?}");
        assert_eq!(c.observed_generation, kc.metadata.generation, "{type_}");
    }
    assert_eq!(status.control_plane_version.as_deref(), Some("1.33.13"));
    let story = kubectl_ok(&["get", "kc,kcp,md", "-n", &ns.name], None);
    let line = story
        .lines()
        .find(|l| l.starts_with("kubernetescluster.noops.dev/acme"))
        .unwrap_or_else(|| panic!("{story}"));
    assert!(
        line.contains("1.33.13") && line.contains("3/3") && line.contains("Running"),
        "{line}"
    );
    assert!(
        story.contains("acme-general") && story.contains("acme-burst"),
        "{story}"
    );
    // `kubectl noops status` of the cluster and of its control plane: Ready, with the pools.
    let out = kubectl_noops(&["status", "kc/acme", "-n", &ns.name]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{out:?}");
    assert!(
        text.starts_with(&format!("KubernetesCluster {}/acme: Ready (Running)", ns.name)),
        "{text}"
    );
    for pool in ["general", "burst"] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(pool) && l.contains("1.33.13")),
            "no line for pool {pool}:\n{text}"
        );
    }
    let out = kubectl_noops(&["status", "kcp/acme", "-n", &ns.name]);
    assert_eq!(out.status.code(), Some(0), "{}{out:?}", stdout(&out));
    assert!(stdout(&out).contains("1.33.13"), "{}", stdout(&out));
    the_plugin_draws_the_cluster_and_reaches_it(&ns).await;

    let tenant = Tenant::ready(&ns, "acme", MINUTE).await;
    let nodes: Api<Node> = Api::all(tenant.client.clone());
    let listed = nodes.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(listed.len(), 3);
    assert!(listed.iter().all(|n| node_ready_status(n).as_deref() == Some("True")));
    // Settled, a pass over any of the cluster's objects writes nothing.
    let first_of = |kind: &str| {
        let names = kubectl_ok(&["get", kind, "-n", &ns.name, "-o", "name"], None);
        names.lines().next().unwrap_or_else(|| panic!("no {kind}")).to_string()
    };
    let (set, machine) = (first_of("machinesets"), first_of("machines"));
    let objects = [
        ("kubernetescluster/acme", "kubernetescluster"),
        ("kubernetescontrolplane/acme", "kubernetescontrolplane"),
        ("machinedeployment/acme-general", "machinedeployment"),
        (set.as_str(), "machineset"),
        (machine.as_str(), "machine"),
    ];
    // Once through first: a cluster that has just become Ready may still settle (the control
    // plane given its exact version, say); what the second round writes is what every pass
    // over an unchanged object would.
    let settling = operator.writes_of_settled_passes(&ns, &objects).await;
    let writes = operator.writes_of_settled_passes(&ns, &objects).await;
    assert!(
        writes.is_empty(),
        "settled objects' passes wrote: {writes:?} (while settling: {settling:?})"
    );

    // An app answers through a load balancer in front of the machines.
    tenant.apply(&web_app(3, 2));
    tenant.kubectl_ok(&["rollout", "status", "deployment/web", "--timeout=180s"], None);
    let address = load_balancer(&ns, "acme").await;
    let pods = Api::namespaced(tenant.client.clone(), "default");
    let poller = Poller::start(address)
        .following(EndpointHistory::start("management's lb", ns.api(), "lb"))
        .following(EndpointHistory::start(
            "tenant's web",
            Api::namespaced(tenant.client.clone(), "default"),
            "web",
        ));
    let budget = BudgetWatch::start(pods, 2);
    let skew = SkewWatch::start(nodes.clone(), ns.api::<KubernetesControlPlane>(), "acme".into());
    let order = UpgradeOrderWatch::start(&ns, "acme", "1.34.4", &["general", "burst"]);
    let general = DeletionWatch::start(
        &ns,
        "acme-general",
        "noops.dev/kubernetescluster=acme,noops.dev/pool=general",
    );

    // An app whose budget allows no eviction: the drain of its machine waits for it, and the
    // cluster says so itself (machine, pod and budget), not just "Upgrading".
    tenant.apply(&held_app());
    tenant.kubectl_ok(&["rollout", "status", "deployment/held", "--timeout=120s"], None);

    // The upgrade: the control plane, then pool general, then pool burst.
    ns.merge_spec("kc/acme", serde_json::json!({ "version": "1.34" }));
    let clusters = ns.api::<KubernetesCluster>();
    wait_until("the cluster Upgrading, the control plane first", 2 * MINUTE, || async {
        clusters
            .get("acme")
            .await
            .ok()
            .and_then(|kc| kc.status)
            .is_some_and(|s| {
                s.phase == Some(KubernetesClusterPhase::Upgrading)
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "Upgrading" && c.status == "True" && c.reason == "UpgradingControlPlane")
            })
    })
    .await;
    let held = wait_for("the cluster naming the drain its budget holds", 12 * MINUTE, || async {
        let status = clusters.get("acme").await.ok()?.status?;
        let upgrading = status.conditions.into_iter().find(|c| c.type_ == "Upgrading")?;
        (upgrading.status == "True"
            && upgrading.message.contains("held: pool ")
            && upgrading.message.contains("default/held-"))
        .then_some(upgrading.message)
    })
    .await;
    assert!(
        held.contains("machine acme-")
            && held.contains("default/held-")
            && held.contains("(budget held needs 1 healthy pods"),
        "{held}"
    );
    tenant.kubectl_ok(&["delete", "pdb", "held"], None);
    let upgraded = wait_cluster(&ns, "acme", "1.34.4", 15 * MINUTE).await;
    let upgrade = upgraded.status.unwrap().upgrade.unwrap();
    assert_eq!((upgrade.from.as_str(), upgrade.to.as_str()), ("1.33.13", "1.34.4"));
    assert_eq!(upgrade.finished, vec!["ControlPlane", "Pool general", "Pool burst"]);
    // The status's list is the operator's own account; the watches see what the children did.
    let timeline = order.stop();
    eprintln!("{timeline}");
    timeline.assert_in_order();
    // Each old machine of pool general went only once 2 others were Ready, one more at most.
    let seen = general.stop_expecting_within_bounds(2).await;
    assert!(seen.most <= 3, "{} machines of pool general at once", seen.most);
    assert_eq!(upgrade.step, "Done");
    assert!(upgrade.finished_at.is_some());
    for reason in [
        "UpgradeStarted",
        "ControlPlaneUpgraded",
        "PoolUpgraded",
        "UpgradeCompleted",
    ] {
        wait_event(&ns, "KubernetesCluster", "acme", reason).await;
    }

    poller.stop_expecting_every_answer(100).await;
    budget.stop_expecting_held(2, 5);
    let (checked, skews) = skew.stop();
    assert!(skews.is_empty(), "{skews:?}");
    assert!(checked > 10, "only {checked} Node changes checked");
    wait_nodes_at(&nodes, 3, "v1.34.4", 2 * MINUTE).await;

    // Deleting the cluster takes its control plane and every machine with it.
    ns.api::<KubernetesCluster>()
        .delete("acme", &Default::default())
        .await
        .unwrap();
    wait_machines_gone(&ns, 4 * MINUTE).await;
    let control_planes = ns.api::<KubernetesControlPlane>();
    wait_until("the control plane gone", 2 * MINUTE, || async {
        control_planes.get_opt("acme").await.is_ok_and(|c| c.is_none())
    })
    .await;
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

#[tokio::test]
async fn a_pool_grows_for_pods_with_no_room_and_shrinks_back_once_its_machines_are_idle() {
    install_crds();
    let ns = TestNamespace::new("kc-scale").await;
    let _forget = ForgetMachines(ns.name.clone());
    let operator = Operator::start(&ns.name, &["--controllers", CONTROLLERS]);
    ns.apply(&cluster(
        "elastic",
        "  version: \"1.34\"\n  controlPlane: { etcd: { replicas: 1 } }\n  workers: [{ name: burst, minReplicas: 1, maxReplicas: 3, scaleDownDelaySeconds: 15, flavor: { cpu: 2 } }]\n",
    ));
    wait_cluster(&ns, "elastic", "1.34.4", 5 * MINUTE).await;
    let tenant = Tenant::ready(&ns, "elastic", MINUTE).await;
    let machines = ns.api::<noops_api::Machine>();
    let count = || async {
        machines
            .list(&ListParams::default())
            .await
            .map(|l| l.items.len())
            .unwrap_or(0)
    };
    assert_eq!(count().await, 1);
    let most_machines = MostMachinesWatch::start(machines.clone());
    let deletions = DeletionWatch::start(
        &ns,
        "elastic-burst",
        "noops.dev/kubernetescluster=elastic,noops.dev/pool=burst",
    );

    // Three pods of 1.5 CPU: one machine of 2 CPUs holds one; the pool grows to hold them all.
    let echo = root().join("target/debug/http-echo");
    tenant.apply(&format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{ name: hungry, namespace: default }}
spec:
  replicas: 3
  selector: {{ matchLabels: {{ app: hungry }} }}
  template:
    metadata: {{ labels: {{ app: hungry }} }}
    spec:
      # Gone at once when deleted: the scale-down delay is measured from the delete.
      terminationGracePeriodSeconds: 0
      containers:
        - name: echo
          image: busybox
          command: ["{}", "-listen=:8080", "-text=hungry"]
          resources: {{ requests: {{ cpu: 1500m, memory: 64Mi }} }}
"#,
        echo.display()
    ));
    tenant.kubectl_ok(&["rollout", "status", "deployment/hungry", "--timeout=180s"], None);
    assert_eq!(count().await, 3, "grown to what the pods need, within maxReplicas");
    wait_event(&ns, "KubernetesCluster", "elastic", "ScaledUp").await;
    let kc = ns.api::<KubernetesCluster>().get("elastic").await.unwrap();
    let pool = &kc.status.unwrap().pools[0];
    assert_eq!((pool.desired, pool.name.as_str()), (3, "burst"));

    // A fourth pod has no room and the pool is at its maximum: it is said, nothing is made.
    tenant.kubectl_ok(&["scale", "deployment/hungry", "--replicas=4"], None);
    wait_event(&ns, "KubernetesCluster", "elastic", "AtMaxReplicas").await;
    assert_eq!(count().await, 3);

    // Gone: the idle machines go after the delay, down to the minimum.
    tenant.kubectl_ok(&["delete", "deployment", "hungry"], None);
    let deleted_at = Instant::now();
    let most = most_machines.stop();
    assert!(most <= 3, "{most} machines at once, more than maxReplicas");
    // A machine's idle clock starts once its pods are gone, after the delete: none may go in the
    // first 15 s (12 s leaves slack). A machine counts as going once it is being deleted, as its
    // drain could otherwise hide a delay not kept.
    let first_gone_after = wait_for("a machine of the pool going", 2 * MINUTE, || async {
        let listed = machines.list(&ListParams::default()).await.ok()?;
        let staying = listed
            .items
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
            .count();
        (staying < 3).then(|| deleted_at.elapsed())
    })
    .await;
    assert!(
        first_gone_after >= Duration::from_secs(12),
        "a machine went {first_gone_after:?} after the pods' Deployment was deleted, before scaleDownDelaySeconds (15)"
    );
    wait_until("the pool back at its minimum", 2 * MINUTE, || async {
        count().await == 1
    })
    .await;
    // The idle machines went as the pool shrank, never below what it asked for then.
    deletions.stop_expecting_within_bounds(2).await;
    wait_event(&ns, "KubernetesCluster", "elastic", "ScaledDown").await;
    let clusters = ns.api::<KubernetesCluster>();
    // The status is written after the pass's children, so it may trail the machines by a pass.
    wait_until(
        "the pool's status desired back at 1",
        Duration::from_secs(30),
        || async {
            clusters
                .get("elastic")
                .await
                .ok()
                .and_then(|kc| kc.status?.pools.first().map(|p| p.desired))
                == Some(1)
        },
    )
    .await;
    let nodes: Api<Node> = Api::all(tenant.client.clone());
    let one_node_left = || {
        wait_until("one Node left", MINUTE, || async {
            nodes
                .list(&ListParams::default())
                .await
                .is_ok_and(|l| l.items.len() == 1)
        })
    };
    one_node_left().await;

    // A pod no machine of any pool can hold is reported and makes no machine.
    tenant.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{ name: huge, namespace: default }}\nspec:\n  containers:\n  - {{ name: echo, image: busybox, command: [\"{}\"], resources: {{ requests: {{ cpu: \"16\" }} }} }}\n",
        echo.display()
    ));
    let api = ns.api::<KubernetesCluster>();
    let said = wait_for("the Scaling condition naming the pod", MINUTE, || async {
        let kc = api.get("elastic").await.ok()?;
        let c = kc.status?.conditions.into_iter().find(|c| c.type_ == "Scaling")?;
        (c.reason == "NoPoolFits").then_some(c.message)
    })
    .await;
    assert!(said.contains("default/huge"), "{said}");
    wait_event(&ns, "KubernetesCluster", "elastic", "NoPoolFits").await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(count().await, 1, "no machine for a pod none can hold");
    tenant.kubectl_ok(&["delete", "pod", "huge"], None);

    // A pool added while the cluster is paused waits; unpaused, it joins; removed, it goes.
    let patch = |body: &str| {
        kubectl_ok(
            &["patch", "-n", &ns.name, "kc/elastic", "--type=merge", "-p", body],
            None,
        )
    };
    let burst = r#"{"name":"burst","minReplicas":1,"maxReplicas":3,"scaleDownDelaySeconds":15,"flavor":{"cpu":2}}"#;
    let extra = r#"{"name":"extra","replicas":1}"#;
    patch(&format!(r#"{{"spec":{{"paused":true,"workers":[{burst},{extra}]}}}}"#));
    let deployments = ns.api::<noops_api::MachineDeployment>();
    let api = ns.api::<KubernetesCluster>();
    wait_until("the cluster Paused, its children too", MINUTE, || async {
        let paused = api
            .get("elastic")
            .await
            .ok()
            .and_then(|kc| kc.status?.phase)
            .is_some_and(|p| p == KubernetesClusterPhase::Paused);
        let children = ns
            .api::<KubernetesControlPlane>()
            .get("elastic")
            .await
            .is_ok_and(|c| c.spec.paused)
            && deployments.get("elastic-burst").await.is_ok_and(|d| d.spec.paused);
        paused && children
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        deployments.get_opt("elastic-extra").await.unwrap().is_none(),
        "a paused cluster made a pool"
    );
    patch(r#"{"spec":{"paused":false}}"#);
    wait_until("the added pool's machine Ready", 3 * MINUTE, || async {
        deployments
            .get_opt("elastic-extra")
            .await
            .ok()
            .flatten()
            .and_then(|d| d.status?.ready_replicas)
            == Some(1)
    })
    .await;
    assert_eq!(count().await, 2);
    patch(&format!(r#"{{"spec":{{"workers":[{burst}]}}}}"#));
    wait_until("the removed pool's machine gone", 3 * MINUTE, || async {
        count().await == 1
    })
    .await;
    assert!(deployments.get_opt("elastic-extra").await.unwrap().is_none());
    wait_event(&ns, "KubernetesCluster", "elastic", "PoolRemoved").await;
    one_node_left().await;

    // An upgrade to a version whose images are not there stalls in the control plane, its old
    // API servers serving and no machine touched; the version set back undoes it.
    patch(r#"{"spec":{"version":"1.35"}}"#);
    let said = wait_for(
        "the cluster Degraded by the stalled control plane",
        3 * MINUTE,
        || async {
            let status = api.get("elastic").await.ok()?.status?;
            let degraded = status
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Degraded" && c.status == "True")?;
            (status.phase == Some(KubernetesClusterPhase::Upgrading)).then_some(degraded.message)
        },
    )
    .await;
    assert!(said.contains("cannot start"), "{said}");
    let md = deployments.get("elastic-burst").await.unwrap();
    assert_eq!(
        md.spec.template.spec.version, "1.34.4",
        "no pool moves before its API servers"
    );
    patch(r#"{"spec":{"version":"1.34"}}"#);
    // Its status.version never moved, so wait for the upgrade's end rather than the version.
    let status = wait_for("the upgrade set back", 3 * MINUTE, || async {
        let kc = api.get("elastic").await.ok()?;
        let status = kc.status?;
        let done = status.observed_generation == kc.metadata.generation
            && status.upgrade.as_ref()?.step == "SetBack"
            && status.phase == Some(KubernetesClusterPhase::Running);
        done.then_some(status)
    })
    .await;
    let upgrade = status.upgrade.clone().unwrap();
    assert_eq!(upgrade.to, "1.35.0");
    assert!(upgrade.finished_at.is_some());
    assert_eq!(status.control_plane_version.as_deref(), Some("1.34.4"));
    wait_event(&ns, "KubernetesCluster", "elastic", "UpgradeSetBack").await;
    let control_plane = ns.api::<KubernetesControlPlane>().get("elastic").await.unwrap();
    assert_eq!(
        control_plane.spec.version, "1.34.4",
        "the control plane was given the old version back"
    );
    tenant.kubectl_ok(&["get", "nodes"], None);
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

/// `kubectl noops describe kc/acme` draws the cluster's tree, each object Ready and each
/// machine with its node; `kubeconfig kc/acme` writes a private file with which kubectl from
/// this machine lists the tenant's nodes; `status` and `get` answer for the machines, their
/// sets and deployments. (Here rather than in plugin.rs: tests that need a tenant cluster
/// share one.)
async fn the_plugin_draws_the_cluster_and_reaches_it(ns: &TestNamespace) {
    use noops_api::Machine;
    use noops_e2e::plugin::{complete_through_kubectl, line_with};
    let machines = ns.api::<Machine>().list(&Default::default()).await.unwrap().items;
    assert_eq!(machines.len(), 3, "{machines:?}");

    let out = kubectl_noops(&["describe", "kc/acme", "-n", &ns.name]);
    let tree = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{tree}{out:?}");
    let mut at = 0;
    for start in [
        format!("KubernetesCluster {}/acme ", ns.name),
        "KubernetesControlPlane acme ".to_string(),
        "EtcdCluster acme-etcd ".to_string(),
        "MachineDeployment acme-general ".to_string(),
        "MachineDeployment acme-burst ".to_string(),
    ] {
        let line = line_with(&tree, &start);
        let index = tree.find(line).unwrap();
        assert!(index >= at, "{start:?} out of order:\n{tree}");
        at = index;
        assert!(line.contains(" True "), "not Ready: {line}\n{tree}");
    }
    for machine in &machines {
        let name = machine.metadata.name.clone().unwrap();
        let node = machine.status.clone().unwrap().node_name.unwrap();
        let line = line_with(&tree, &format!("Machine {name} "));
        assert!(
            line.contains(" True ") && line.contains(&format!("node {node}")),
            "{line}\n{tree}"
        );
        let out = kubectl_noops(&["status", &format!("ma/{name}"), "-n", &ns.name]);
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(0), "{text}{out:?}");
        assert!(
            text.starts_with(&format!("Machine {}/{name}: Ready (Running)\n", ns.name)),
            "{text}"
        );
        assert!(text.contains(&format!("noops://{}/{name}", ns.name)), "{text}");
        let set = machine.metadata.owner_references.as_ref().unwrap()[0].name.clone();
        let out = kubectl_noops(&["status", &format!("ms/{set}"), "-n", &ns.name]);
        assert_eq!(out.status.code(), Some(0), "{}{out:?}", stdout(&out));
        assert!(
            line_with(&stdout(&out), &format!("{name} ")).contains(&node),
            "{}",
            stdout(&out)
        );
    }
    for pool in ["md/acme-general", "md/acme-burst", "etcd/acme-etcd"] {
        let out = kubectl_noops(&["status", pool, "-n", &ns.name]);
        assert_eq!(out.status.code(), Some(0), "{pool}: {}{out:?}", stdout(&out));
    }

    // Published outside this cluster: a node port, at an address this machine reaches (the
    // local Kubernetes serves node ports on 127.0.0.1). The control plane says where, and the
    // admin Secret gets a kubeconfig that names it.
    ns.merge_spec(
        "kc/acme",
        serde_json::json!({ "controlPlane": { "service": { "type": "NodePort", "externalEndpoint": { "host": "127.0.0.1" } } } }),
    );
    let control_planes = ns.api::<KubernetesControlPlane>();
    let external = wait_for("the control plane's external endpoint", 2 * MINUTE, || async {
        let status = control_planes.get("acme").await.ok()?.status?;
        status
            .external_endpoint
            .filter(|e| e.starts_with("https://127.0.0.1:3"))
    })
    .await;
    let secrets = ns.api::<k8s_openapi::api::core::v1::Secret>();
    wait_until("the admin Secret's external kubeconfig", MINUTE, || async {
        secrets
            .get("acme-admin-kubeconfig")
            .await
            .ok()
            .and_then(|s| s.data)
            .is_some_and(|d| d.contains_key("external-kubeconfig"))
    })
    .await;

    // The admin kubeconfig, written private, names that endpoint; kubectl from here lists the
    // tenant's nodes with it.
    let file = std::env::temp_dir().join(format!("noops-plugin-{}.kubeconfig", ns.name));
    let out = kubectl_noops(&["kubeconfig", "kc/acme", "-n", &ns.name, "-f", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stdout(&out).contains(&external), "{}", stdout(&out));
    let internal = stdout(&kubectl_noops(&["kubeconfig", "kc/acme", "-n", &ns.name, "--internal"]));
    assert!(
        !internal.contains("127.0.0.1") && internal.contains("https://10.96."),
        "{internal}"
    );
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    // The Secret may name the node port a moment before kube-proxy serves it (both follow the
    // Service's change), as on any cluster: kubectl answers within a bound.
    // Each new refusal is printed, so a run that times out shows why kubectl failed.
    let last_refusal = std::sync::Mutex::new(String::new());
    let nodes = wait_for("kubectl get nodes with the written kubeconfig", MINUTE, || async {
        let out = kubectl_with(&file, &["get", "nodes", "-o", "name"], None);
        if out.status.success() {
            return Some(out);
        }
        // Its last line: the earlier ones carry a timestamp each.
        let stderr = String::from_utf8_lossy(&out.stderr);
        let said = stderr.lines().last().unwrap_or_default().to_string();
        let mut last = last_refusal.lock().unwrap();
        if *last != said {
            eprintln!("kubectl get nodes with the written kubeconfig: {said}");
            *last = said;
        }
        None
    })
    .await;
    let mut listed: Vec<String> = stdout(&nodes).lines().map(String::from).collect();
    listed.sort();
    let mut expected: Vec<String> = machines
        .iter()
        .map(|m| format!("node/{}", m.status.clone().unwrap().node_name.unwrap()))
        .collect();
    expected.sort();
    assert_eq!(listed, expected);
    let out = kubectl_noops(&["kubeconfig", "kcp/acme", "-n", &ns.name]);
    assert_eq!(stdout(&out), std::fs::read_to_string(&file).unwrap());
    let _ = std::fs::remove_file(&file);

    // `get`: every object of the cluster, each Ready; completion names the cluster.
    let listed = stdout(&kubectl_noops(&["get", "-n", &ns.name]));
    for (kind, object) in [
        ("KubernetesCluster", "acme"),
        ("KubernetesControlPlane", "acme"),
        ("EtcdCluster", "acme-etcd"),
        ("MachineDeployment", "acme-general"),
        ("MachineDeployment", "acme-burst"),
    ] {
        let line = listed
            .lines()
            .find(|l| l.starts_with(&format!("{kind} ")) && l.split_whitespace().nth(1) == Some(object))
            .unwrap_or_else(|| panic!("no {kind} {object} in\n{listed}"));
        assert_eq!(line.split_whitespace().nth(2), Some("True"), "{line}\n{listed}");
    }
    let completed = complete_through_kubectl(ns, &["-n", &ns.name, "describe", "kc/"]);
    assert!(completed.starts_with("kc/acme\n"), "{completed}");
}
