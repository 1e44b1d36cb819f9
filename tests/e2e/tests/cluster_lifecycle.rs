//! KubernetesClusters through their life: deleted and made again from a backup, and an
//! ordered upgrade with the operator killed at each of its crash points. Needs `make cluster-up`
//! (3 nodes). Apart from `clusters.rs`, so that its upgrade without a failed request runs beside
//! fewer clusters.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use noops_api::{KubernetesCluster, KubernetesControlPlane};
use noops_e2e::clusters::{CONTROLLERS, SkewWatch, UpgradeOrderWatch, cluster, wait_cluster};
use noops_e2e::tenant::{ForgetMachines, Tenant, wait_machines_gone, wait_nodes_at};
use noops_e2e::traffic::web_app;
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);
/// How soon after a cluster made from a backup is Ready its apps run on its new machines.
const APPS_BACK_WITHIN: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_cluster_deleted_comes_back_from_its_scheduled_backup_and_its_deployment_runs_on_new_machines() {
    install_crds();
    let ns = TestNamespace::new("kc-restore").await;
    let _forget = ForgetMachines(ns.name.clone());
    noops_e2e::s3::deploy(&ns);
    noops_e2e::s3::create_bucket(&ns, "backups").await;
    let operator = Operator::start(&ns.name, &["--controllers", CONTROLLERS]);
    let with_backups = format!(
        "  version: \"1.34\"\n  controlPlane:\n    etcd:\n      replicas: 1\n      backup:\n        schedule: \"*/10 * * * * *\"\n        maxBackups: 2\n        s3: {{ endpoint: \"{}\", bucket: backups, credentialsSecret: object-store-credentials }}\n  workers: [{{ name: pool, replicas: 1 }}]\n",
        noops_e2e::s3::service_url(&ns)
    );
    ns.apply(&cluster("first", &with_backups));
    wait_cluster(&ns, "first", "1.34.4", 5 * MINUTE).await;
    let tenant = Tenant::ready(&ns, "first", MINUTE).await;
    tenant.apply(&web_app(2, 1));
    tenant.kubectl_ok(&["rollout", "status", "deployment/web", "--timeout=120s"], None);
    let old_nodes: Vec<String> = Api::<Node>::all(tenant.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();

    // A scheduled backup made after the app ran.
    let app_ran = jiff::Timestamp::now();
    let backups = ns.api::<noops_api::EtcdBackup>();
    let backup = wait_for("a scheduled backup of the app", 2 * MINUTE, || async {
        let listed = backups
            .list(&ListParams::default().labels("noops.dev/scheduled"))
            .await
            .ok()?;
        listed.items.into_iter().find_map(|b| {
            let made = b.metadata.creation_timestamp.as_ref()?.0;
            let done = b
                .status
                .as_ref()?
                .progress
                .conditions
                .iter()
                .any(|c| c.type_ == "Succeeded" && c.status == "True");
            (made > app_ran && done).then(|| b.metadata.name.clone())?
        })
    })
    .await;
    drop(tenant);

    // The whole cluster deleted; its backups stay.
    ns.api::<KubernetesCluster>()
        .delete("first", &Default::default())
        .await
        .unwrap();
    wait_machines_gone(&ns, 3 * MINUTE).await;
    let control_planes = ns.api::<KubernetesControlPlane>();
    wait_until("the first control plane gone", 2 * MINUTE, || async {
        control_planes.get_opt("first").await.is_ok_and(|c| c.is_none())
    })
    .await;
    assert!(
        backups.get_opt(&backup).await.unwrap().is_some(),
        "the backup outlives its cluster"
    );

    // A new cluster from it: the app's objects are back, and it runs on the new machines.
    ns.apply(&cluster(
        "second",
        &format!(
            "  version: \"1.34\"\n  controlPlane: {{ etcd: {{ replicas: 1 }} }}\n  bootstrap: {{ fromBackup: {{ name: {backup} }} }}\n  workers: [{{ name: pool, replicas: 1 }}]\n"
        ),
    ));
    wait_cluster(&ns, "second", "1.34.4", 5 * MINUTE).await;
    let ready_at = std::time::Instant::now();
    let tenant = Tenant::ready(&ns, "second", MINUTE).await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(tenant.client.clone(), "default");
    wait_until("the app's pods running on the new machine", 4 * MINUTE, || async {
        let Ok(listed) = pods.list(&ListParams::default().labels("app=web")).await else {
            return false;
        };
        let running: Vec<_> = listed
            .items
            .iter()
            .filter(|p| pod_ready(p) && !old_nodes.contains(&pod_node(p)))
            .collect();
        running.len() == 2
    })
    .await;
    // The operator knows none of the old Nodes' machines exists: it removes them and their
    // pods as soon as the new control plane serves, not after their heartbeats are missed and
    // their pods evicted (two minutes).
    let back_after = ready_at.elapsed();
    eprintln!("the app ran on the new machine {back_after:?} after the cluster was Ready");
    assert!(
        back_after <= APPS_BACK_WITHIN,
        "the app ran on the new machine {back_after:?} after the cluster was Ready"
    );
    wait_event(&ns, "KubernetesCluster", "second", "StaleNodeRemoved").await;
    let nodes = Api::<Node>::all(tenant.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert!(
        nodes
            .iter()
            .all(|n| !old_nodes.contains(n.metadata.name.as_ref().unwrap())),
        "the old cluster's Nodes are gone"
    );
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

/// The crash points of the control plane and of etcd that a control plane's upgrade reaches.
const CONTROL_PLANE_POINTS: [&str; 12] = [
    "control plane: API server Deployment applied",
    "control plane: controller-manager or scheduler Deployment applied",
    "control plane: EtcdCluster applied",
    "control plane: a certificate issued",
    "control plane: a CA made",
    "upgrade: member stopped for its restart",
    "upgrade: member with an unavailable image stopped",
    "finish: upgrade of a member done, not recorded",
    "add: learner's pod made",
    "add: learner added to etcd, its ID not recorded",
    "add: learner promoted, not recorded",
    "status written, its Events not yet told",
];

#[tokio::test]
async fn the_operator_killed_at_each_step_of_an_ordered_upgrade_finishes_it_in_order() {
    install_crds();
    let ns = TestNamespace::new("kc-crash").await;
    let _forget = ForgetMachines(ns.name.clone());
    let points = std::env::temp_dir().join(format!("noops-crash-{}", ns.name));
    let _ = std::fs::remove_file(&points);
    let spec = |version: &str| {
        cluster(
            "ordered",
            &format!(
                "  version: \"{version}\"\n  controlPlane: {{ etcd: {{ replicas: 1 }} }}\n  workers: [{{ name: a, replicas: 1 }}, {{ name: b, replicas: 1 }}]\n"
            ),
        )
    };
    // Made without crashes, then upgraded with them.
    let operator = Operator::start(&ns.name, &["--controllers", CONTROLLERS]);
    ns.apply(&spec("1.33"));
    wait_cluster(&ns, "ordered", "1.33.13", 5 * MINUTE).await;
    drop(operator);
    let tenant = Tenant::ready(&ns, "ordered", MINUTE).await;
    let nodes: Api<Node> = Api::all(tenant.client.clone());
    let skew = SkewWatch::start(nodes.clone(), ns.api::<KubernetesControlPlane>(), "ordered".into());
    let order = UpgradeOrderWatch::start(&ns, "ordered", "1.34.4", &["a", "b"]);
    // The control plane's and etcd's own crash points are marked as passed: those controllers
    // react to the cluster's write of the control plane's new version, and one of them could
    // reach its point (and kill the process) between that write and the cluster's own point,
    // which would then never be reached. Their steps are killed in `control_plane.rs` and
    // `etcd_crash.rs`; this test kills the cluster's.
    std::fs::write(&points, CONTROL_PLANE_POINTS.join("\n") + "\n").unwrap();
    let supervisor = Supervisor::start(&ns.name, &points);
    ns.apply(&spec("1.34"));
    let upgraded = wait_cluster(&ns, "ordered", "1.34.4", 10 * MINUTE).await;
    // The old machines go while the operator still runs (a pool has rolled out once its new
    // machines are Ready; its old ones may still be draining).
    wait_nodes_at(&nodes, 2, "v1.34.4", 2 * MINUTE).await;
    let (restarts, logs) = supervisor.stop().await;
    let (checked, skews) = skew.stop();
    let crashed = std::fs::read_to_string(&points).unwrap_or_default();
    for point in [
        "kubernetescluster: control plane given a new version, status not written",
        "kubernetescluster: pool a given a new version, status not written",
        "kubernetescluster: pool b given a new version, status not written",
    ] {
        assert!(
            crashed.lines().any(|l| l == point),
            "never crashed at {point:?}: {crashed}"
        );
    }
    assert!(restarts >= 2, "restarted {restarts} times");
    let upgrade = upgraded.status.unwrap().upgrade.unwrap();
    assert_eq!(upgrade.finished, vec!["ControlPlane", "Pool a", "Pool b"]);
    let timeline = order.stop();
    eprintln!("{timeline}");
    timeline.assert_in_order();
    assert!(skews.is_empty(), "{skews:?}");
    assert!(checked > 4, "only {checked} Node changes checked");
    assert!(!logs.contains("panicked"), "{logs}");
    // Machines go while an operator runs (their finalizer drains them).
    let operator = Operator::start(&ns.name, &["--controllers", CONTROLLERS]);
    ns.api::<KubernetesCluster>()
        .delete("ordered", &Default::default())
        .await
        .unwrap();
    wait_machines_gone(&ns, 3 * MINUTE).await;
    drop(operator);
    let _ = std::fs::remove_file(&points);
}
