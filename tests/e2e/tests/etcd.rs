//! The EtcdCluster operator on the local Kubernetes, against real etcd: bootstrap with
//! learners, scaling with a client writing throughout, a member whose process dies, a member
//! whose volume is lost, deletion, and bad input. Needs `make cluster-up` (3 nodes for the
//! spread check; `make e2e` starts them).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use noops_api::etcd::EtcdClusterPhase;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use kube::Api;
use kube::api::ListParams;
use noops_api::EtcdCluster;
use noops_api::etcd::OperationKind;
use noops_e2e::certificates::not_after;
use noops_e2e::etcd::*;
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);

fn reasons(events: &[(String, String)]) -> Vec<&str> {
    events.iter().map(|(r, _)| r.as_str()).collect()
}

/// Runs `etcdctl args` in a pod of the cluster's own etcd image, with the client certificate
/// mounted, through the client Service (cluster DNS), and returns its output.
async fn etcdctl_in_pod(ns: &TestNamespace, cluster: &str, version: &str, pod: &str, args: &[&str]) -> String {
    let endpoint = format!("https://{cluster}-client.{}.svc:2379", ns.name);
    let mut command = vec![
        "etcdctl".to_string(),
        format!("--endpoints={endpoint}"),
        "--cacert=/certs/ca.crt".into(),
        "--cert=/certs/tls.crt".into(),
        "--key=/certs/tls.key".into(),
        "--dial-timeout=5s".into(),
    ];
    command.extend(args.iter().map(|a| a.to_string()));
    let manifest = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": pod },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "etcdctl",
                "image": format!("quay.io/coreos/etcd:v{version}"),
                "command": command,
                "volumeMounts": [{ "name": "certs", "mountPath": "/certs" }],
            }],
            "volumes": [{ "name": "certs", "secret": { "secretName": format!("{cluster}-client") } }],
        },
    });
    ns.apply(&manifest.to_string());
    let pods = ns.pods();
    let phase = wait_for(&format!("pod {pod} to finish"), MINUTE, || async {
        pods.get(pod)
            .await
            .ok()
            .and_then(|p| p.status?.phase)
            .filter(|phase| phase == "Succeeded" || phase == "Failed")
    })
    .await;
    let logs = kubectl_ok(&["logs", "-n", &ns.name, pod], None);
    assert_eq!(phase, "Succeeded", "etcdctl {args:?} failed: {logs}");
    logs
}

/// Kills (SIGKILL) the etcd process of `member`, wherever its node runs it.
#[tokio::test]
async fn a_cluster_bootstraps_scales_heals_and_goes_away_without_losing_a_write() {
    install_crds();
    let ns = TestNamespace::new("etcd-life").await;
    let mut operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    let version = etcd_version("3.5");

    // A first apply of the short manifest: three members, one per node.
    ns.apply(&cluster_manifest("main", 3, &version, ""));
    let cluster = wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
    kubectl_ok(
        &[
            "wait",
            "-n",
            &ns.name,
            "--for=condition=Ready",
            "etcdcluster/main",
            "--timeout=10s",
        ],
        None,
    );
    let status = cluster.status.clone().unwrap();
    assert_eq!(
        member_names(&cluster),
        BTreeSet::from(["main-0".to_string(), "main-1".into(), "main-2".into()])
    );
    assert!(status.members.iter().all(|m| m.healthy && !m.learner && m.id.is_some()));
    let leader = status.leader.clone().expect("a leader in status");
    assert!(member_names(&cluster).contains(&leader));
    assert_eq!(status.current_version.as_deref(), Some(version.as_str()));
    assert_eq!(status.client_secret.as_deref(), Some("main-client"));
    assert!(status.cluster_id.is_some());
    // Settled, a pass reads its children from the caches and writes nothing: no API request
    // but the lease's.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let requests = operator
        .requests_of_settled_passes(&ns, "etcdcluster/main", "etcd")
        .await;
    assert!(
        requests.is_empty(),
        "a settled cluster's passes made API requests: {requests:?}"
    );
    assert!(!status.endpoints.is_empty(), "client endpoints in status");
    assert_eq!(status.ready.as_deref(), Some("3/3"));
    assert_eq!(status.phase, Some(EtcdClusterPhase::Running));
    let pods = ns.pods();
    let member_pods = pods
        .list(&ListParams::default().labels("noops.dev/etcdcluster=main,app.kubernetes.io/component=member"))
        .await
        .unwrap()
        .items;
    let nodes: BTreeSet<String> = member_pods.iter().map(pod_node).collect();
    assert_eq!(nodes.len(), 3, "members spread over the three nodes: {nodes:?}");
    // Bootstrap is one member, then learners promoted one at a time.
    wait_until("Events of the bootstrap and both promotions", MINUTE, || async {
        let events = cluster_events(&ns, "main").await;
        let r = reasons(&events);
        r.contains(&"Bootstrapped") && r.iter().filter(|r| **r == "Promoted").count() == 2
    })
    .await;
    let printed = kubectl_ok(&["get", "-n", &ns.name, "etcdcluster", "main"], None);
    assert!(
        printed.contains("3/3") && printed.contains(&version) && printed.contains("Running"),
        "{printed}"
    );

    // A client in the cluster, with the client Secret, through the client Service.
    etcdctl_in_pod(&ns, "main", &version, "put", &["put", "greeting", "hello"]).await;
    let got = etcdctl_in_pod(&ns, "main", &version, "get", &["get", "greeting", "--print-value-only"]).await;
    assert_eq!(got.trim(), "hello");

    // Scale 3 → 5 → 3 while a client writes and reads.
    let endpoints = member_endpoints(&ns, &["main-0", "main-1", "main-2"]).await;
    let writer = Writer::start(etcd_client(&ns, "main", &endpoints).await);
    patch_spec(&ns, "main", serde_json::json!({ "replicas": 5 })).await;
    // The operator dies mid-scale, twice, with a member addition recorded in status; the next
    // one carries on from the status.
    let api: Api<EtcdCluster> = ns.api();
    for _ in 0..2 {
        wait_until("a member addition in progress", 2 * MINUTE, || async {
            api.get("main")
                .await
                .ok()
                .and_then(|c| c.status?.operation)
                .is_some_and(|op| op.kind == OperationKind::AddMember)
        })
        .await;
        operator.kill();
        operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    }
    let five = wait_cluster_ready(&ns, "main", 5, 4 * MINUTE).await;
    assert_eq!(
        member_names(&five),
        (0..5).map(|i| format!("main-{i}")).collect::<BTreeSet<_>>(),
        "no member was added twice or given up across the restarts"
    );
    patch_spec(&ns, "main", serde_json::json!({ "replicas": 3 })).await;
    let three = wait_cluster_ready(&ns, "main", 3, 4 * MINUTE).await;
    let history = writer.stop().await;
    let mut checker = etcd_client(
        &ns,
        "main",
        &member_endpoints(
            &ns,
            &member_names(&three).iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .await,
    )
    .await;
    assert_no_write_lost(&history, &mut checker, 50).await;
    let listed = checker.member_list().await.unwrap();
    assert_eq!(listed.members().len(), 3, "etcd itself has three members again");
    // Scale down removed members from etcd before their pods and volumes.
    wait_until("the removed members' pods and volumes to go", MINUTE, || async {
        let pods = ns
            .pods()
            .list(&ListParams::default().labels("noops.dev/etcdcluster=main,app.kubernetes.io/component=member"))
            .await
            .unwrap();
        let volumes = ns
            .api::<PersistentVolumeClaim>()
            .list(&ListParams::default())
            .await
            .unwrap();
        pods.items.len() == 3 && volumes.items.len() == 3
    })
    .await;

    // A drain evicts one member, never two at once: the cluster's budget refuses the second
    // eviction while the first member is down, whatever the order.
    // (Back at three members, the budget follows: two must stay up.)
    wait_until(
        "the budget to keep two members and allow one eviction",
        MINUTE,
        || async {
            let Ok(budget) = ns
                .api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>()
                .get("main")
                .await
            else {
                return false;
            };
            let two = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(2);
            budget.spec.and_then(|s| s.min_available) == Some(two)
                && budget
                    .status
                    .is_some_and(|s| s.disruptions_allowed == 1 && s.current_healthy == 3)
        },
    )
    .await;
    let mut evictable: Vec<String> = member_names(&three).into_iter().collect();
    evictable.sort();
    let pods: Api<Pod> = Api::namespaced(client_without_retries().await, &ns.name);
    let evict = |name: String| {
        let pods = pods.clone();
        async move { pods.evict(&name, &Default::default()).await }
    };
    let first_uid = ns.pods().get(&evictable[0]).await.unwrap().metadata.uid;
    evict(evictable[0].clone())
        .await
        .expect("the first eviction is allowed");
    let refused = evict(evictable[1].clone()).await.expect_err("a second member evicted");
    assert!(
        matches!(&refused, kube::Error::Api(e) if e.code == 429),
        "not refused by the budget: {refused:?}"
    );
    wait_until("the evicted member's pod made again and Ready", 3 * MINUTE, || async {
        ns.pods()
            .get(&evictable[0])
            .await
            .is_ok_and(|p| p.metadata.uid != first_uid && pod_ready(&p))
    })
    .await;
    let three = wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
    assert_eq!(
        member_names(&three),
        evictable.iter().cloned().collect::<BTreeSet<_>>(),
        "the evicted member came back as itself"
    );

    // A member's process dies: the container restarts it, the member stays itself.
    let before = member_names(&three);
    let victim = before
        .iter()
        .find(|m| Some(*m) != three.status.as_ref().unwrap().leader.as_ref())
        .unwrap()
        .clone();
    kill_member_process(&ns, "main", &victim);
    wait_until(&format!("{victim} to restart"), MINUTE, || async {
        pods.get(&victim)
            .await
            .ok()
            .and_then(|p| p.status?.container_statuses?.first().map(|c| c.restart_count))
            .unwrap_or(0)
            >= 1
    })
    .await;
    let healed = wait_cluster_ready(&ns, "main", 3, 2 * MINUTE).await;
    assert_eq!(member_names(&healed), before, "a restarted process is not replaced");

    // A member loses its volume and pod: it is removed from etcd first, then a new member
    // with a new name is added; the old identity is never reused.
    let leader = healed.status.as_ref().unwrap().leader.clone().unwrap();
    let lost = before.iter().find(|m| **m != leader && **m != victim).unwrap().clone();
    lose_pod_and_volume(&ns, &lost);
    let replaced = wait_replaced(&ns, "main", 3, &lost).await;
    let successor = member_names(&replaced)
        .difference(&before)
        .next()
        .cloned()
        .expect("a new member");
    let events = cluster_events_when(&ns, "main", "the successor's MemberAdded Event", |events| {
        events.iter().any(|(r, m)| r == "MemberAdded" && m.contains(&successor))
    })
    .await;
    let removed_at = events
        .iter()
        .position(|(r, m)| r == "MemberRemoved" && m.contains(&lost))
        .unwrap_or_else(|| panic!("no MemberRemoved for {lost}: {events:?}"));
    let added_at = events
        .iter()
        .position(|(r, m)| r == "AddingMember" && m.contains(&successor))
        .unwrap_or_else(|| panic!("no AddingMember for {successor}: {events:?}"));
    assert!(
        removed_at < added_at,
        "removed before its successor was added: {events:?}"
    );
    // main-0 to main-4 have been used: the successor's name is new.
    let index: i64 = successor.strip_prefix("main-").and_then(|i| i.parse().ok()).unwrap();
    assert!(index >= 5, "a member name is never reused: {successor}");
    // The data written before is still there.
    let got = etcdctl_in_pod(
        &ns,
        "main",
        &version,
        "get-after",
        &["get", "greeting", "--print-value-only"],
    )
    .await;
    assert_eq!(got.trim(), "hello");
    // Nothing here was stuck: a pod made a moment after its claim is not said to be.
    let events = cluster_events(&ns, "main").await;
    assert!(!events.iter().any(|(r, _)| r == "MemberPodStuck"), "{events:?}");

    // Deleting the cluster takes every child with it.
    kubectl_ok(
        &[
            "delete",
            "-n",
            &ns.name,
            "etcdcluster",
            "main",
            "--wait=true",
            "--timeout=60s",
        ],
        None,
    );
    wait_until("every child of the cluster to go", 2 * MINUTE, || async {
        let labelled = ListParams::default().labels("noops.dev/etcdcluster=main");
        ns.pods().list(&labelled).await.unwrap().items.is_empty()
            && ns
                .api::<PersistentVolumeClaim>()
                .list(&labelled)
                .await
                .unwrap()
                .items
                .is_empty()
            && ns.api::<Service>().list(&labelled).await.unwrap().items.is_empty()
            && ns.api::<Secret>().list(&labelled).await.unwrap().items.is_empty()
            && ns.api::<ConfigMap>().list(&labelled).await.unwrap().items.is_empty()
    })
    .await;
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

#[tokio::test]
async fn bad_specs_are_refused_with_a_reason() {
    install_crds();
    let ns = TestNamespace::new("etcd-bad").await;
    let v35 = etcd_version("3.5");
    let v36 = etcd_version("3.6");

    // Refused on creation, each with a message that says what is wrong.
    let refused_on_create = [
        (cluster_manifest("c", 0, &v35, ""), "replicas must be 1, 3, 5 or 7"),
        (cluster_manifest("c", -1, &v35, ""), "replicas must be 1, 3, 5 or 7"),
        (cluster_manifest("c", 2, &v35, ""), "replicas must be 1, 3, 5 or 7"),
        (cluster_manifest("c", 4, &v35, ""), "replicas must be 1, 3, 5 or 7"),
        (cluster_manifest("c", 9, &v35, ""), "replicas must be 1, 3, 5 or 7"),
        (cluster_manifest("c", 3, "3.4.0", ""), "version must be an etcd version"),
        (
            cluster_manifest("c", 3, "latest", ""),
            "version must be an etcd version",
        ),
        (cluster_manifest("c", 3, "3.5", ""), "version must be an etcd version"),
        (cluster_manifest("c", 3, "3.7.0", ""), "version must be an etcd version"),
        (
            cluster_manifest("c", 3, &format!("v{v35}"), ""),
            "version must be an etcd version",
        ),
        (
            cluster_manifest("c", 3, &v35, "  storage: { size: lots }\n"),
            "storage.size must be a quantity",
        ),
        (
            cluster_manifest("c", 3, &v35, "  pod: { extraArgs: [\"quota-backend-bytes=1\"] }\n"),
            "pod.extraArgs must be etcd flags",
        ),
        (cluster_manifest(&"x".repeat(41), 3, &v35, ""), "at most 40 characters"),
        (cluster_manifest("a.b", 3, &v35, ""), "must be a DNS label"),
    ];
    for (yaml, expected) in &refused_on_create {
        let error = apply_error(&ns, yaml).unwrap_or_else(|| panic!("accepted:\n{yaml}"));
        assert!(error.contains(expected), "refused, but not with {expected:?}: {error}");
    }

    // Refused as changes of an existing (paused, so nothing runs) cluster.
    let paused = "  paused: true\n";
    ns.apply(&cluster_manifest("c", 3, &v36, paused));
    let refused_on_update = [
        (cluster_manifest("c", 3, &v35, paused), "downgrades are refused"),
        (
            cluster_manifest("c", 3, &v36, &format!("{paused}  storage: {{ size: 2Gi }}\n")),
            "storage is immutable",
        ),
        (
            cluster_manifest("c", 3, &v36, &format!("{paused}  storage: {{ ephemeral: true }}\n")),
            "storage is immutable",
        ),
        (
            cluster_manifest("c", 3, &v36, &format!("{paused}  tls: {{ enabled: false }}\n")),
            "tls is immutable",
        ),
        (cluster_manifest("c", 4, &v36, paused), "replicas must be 1, 3, 5 or 7"),
    ];
    for (yaml, expected) in &refused_on_update {
        let error = apply_error(&ns, yaml).unwrap_or_else(|| panic!("accepted:\n{yaml}"));
        assert!(error.contains(expected), "refused, but not with {expected:?}: {error}");
    }
    let api: Api<EtcdCluster> = ns.api();
    let kept = api.get("c").await.unwrap();
    assert_eq!(kept.spec.version, v36, "a refused edit changes nothing");
    assert_eq!(kept.spec.storage.size, "1Gi");
}

#[tokio::test]
async fn a_forbidden_flag_is_refused_in_status_and_harms_nothing_running() {
    install_crds();
    let ns = TestNamespace::new("etcd-flags").await;
    let _operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    let version = etcd_version("3.6");
    ns.apply(&cluster_manifest("solo", 1, &version, ""));
    wait_cluster_ready(&ns, "solo", 1, 2 * MINUTE).await;
    let pod = ns.pods().get("solo-0").await.unwrap();

    // A flag the operator sets itself passes the schema (it is a flag) but is refused.
    patch_spec(
        &ns,
        "solo",
        serde_json::json!({ "pod": { "extraArgs": ["--data-dir=/tmp/elsewhere"] } }),
    )
    .await;
    let api: Api<EtcdCluster> = ns.api();
    let refused = wait_for("Ready=False ForbiddenFlags", MINUTE, || async {
        api.get("solo").await.ok().filter(|c| {
            c.status.as_ref().and_then(|s| s.observed_generation) == c.metadata.generation
                && condition(c, "Ready").is_some_and(|(s, r, _)| s == "False" && r == "ForbiddenFlags")
        })
    })
    .await;
    let (_, _, message) = condition(&refused, "Ready").unwrap();
    assert!(message.contains("--data-dir"), "{message}");
    wait_until("a ForbiddenFlags Event", MINUTE, || async {
        cluster_events(&ns, "solo")
            .await
            .iter()
            .any(|(r, m)| r == "ForbiddenFlags" && m.contains("--data-dir"))
    })
    .await;
    let still = ns.pods().get("solo-0").await.unwrap();
    assert_eq!(
        still.metadata.uid, pod.metadata.uid,
        "the running member was not touched"
    );
    assert!(pod_ready(&still));

    // Taking the flag out makes it Ready again.
    patch_spec(&ns, "solo", serde_json::json!({ "pod": { "extraArgs": [] } })).await;
    wait_cluster_ready(&ns, "solo", 1, MINUTE).await;
}

#[tokio::test]
async fn a_minor_upgrade_rolls_one_member_at_a_time_the_leader_last_without_losing_a_write() {
    install_crds();
    let ns = TestNamespace::new("etcd-upgrade").await;
    let _operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    let (from, to) = (etcd_version("3.5"), etcd_version("3.6"));
    ns.apply(&cluster_manifest("main", 3, &from, ""));
    let before = wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
    let status = before.status.clone().unwrap();
    let first_leader = status.leader.clone().unwrap();
    let ids: BTreeSet<Option<String>> = status.members.iter().map(|m| m.id.clone()).collect();
    let volumes = ns.api::<PersistentVolumeClaim>();
    let volume_uids = |list: Vec<PersistentVolumeClaim>| -> BTreeSet<String> {
        list.into_iter().filter_map(|v| v.metadata.uid).collect()
    };
    let uids_before = volume_uids(volumes.list(&ListParams::default()).await.unwrap().items);
    etcdctl_in_pod(&ns, "main", &from, "put", &["put", "before-upgrade", "kept"]).await;

    // Through the client Service: each member comes back in a new pod, at a new address.
    let writer = Writer::start(etcd_client(&ns, "main", &[service_endpoint(&ns, "main").await]).await);
    patch_spec(&ns, "main", serde_json::json!({ "version": to })).await;
    let after = wait_on_version(&ns, "main", 3, &to).await;
    let history = writer.stop().await;
    let mut checker = members_client(&ns, "main", &after).await;
    assert_no_write_lost(&history, &mut checker, 50).await;

    // The same members, on the same volumes: an upgrade restarts members, it replaces none.
    let status = after.status.clone().unwrap();
    assert_eq!(
        status.members.iter().map(|m| m.id.clone()).collect::<BTreeSet<_>>(),
        ids
    );
    assert_eq!(
        volume_uids(volumes.list(&ListParams::default()).await.unwrap().items),
        uids_before
    );
    // One member at a time (each finished before the next began), the leader last.
    let events = cluster_events_when(&ns, "main", "three MemberUpgraded Events", |events| {
        events.iter().filter(|(r, _)| r == "MemberUpgraded").count() == 3
    })
    .await;
    let upgrades: Vec<(&str, &str)> = events
        .iter()
        .filter(|(r, _)| r == "UpgradingMember" || r == "MemberUpgraded")
        .map(|(r, m)| (r.as_str(), m.split(' ').nth(1).unwrap_or_default()))
        .collect();
    assert_eq!(upgrades.len(), 6, "{events:?}");
    for pair in upgrades.chunks(2) {
        assert_eq!(pair[0].0, "UpgradingMember", "{events:?}");
        assert_eq!(pair[1], ("MemberUpgraded", pair[0].1), "{events:?}");
    }
    assert_ne!(upgrades[0].1, first_leader, "the leader goes last: {events:?}");
    let got = etcdctl_in_pod(
        &ns,
        "main",
        &to,
        "get",
        &["get", "before-upgrade", "--print-value-only"],
    )
    .await;
    assert_eq!(got.trim(), "kept");
    // Going back is refused by the API server.
    let error = apply_error(&ns, &cluster_manifest("main", 3, &from, "")).expect("a downgrade is refused");
    assert!(error.contains("downgrades are refused"), "{error}");
}

#[tokio::test]
async fn an_image_that_cannot_be_pulled_is_reported_and_an_upgrade_or_a_repository_change_to_it_goes_back_harming_nothing()
 {
    install_crds();
    let ns = TestNamespace::new("etcd-bad-image").await;
    let _operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    let api: Api<EtcdCluster> = ns.api();

    // A first apply on a tag the registry does not have: the pod says why, and so does the
    // cluster, at once.
    ns.apply(&cluster_manifest("fresh", 1, "3.6.99", ""));
    let stuck = wait_refused(&ns, "fresh", "MemberPodStuck").await;
    assert!(stuck.contains("fresh-0") && stuck.contains("3.6.99"), "{stuck}");
    wait_until("a MemberPodStuck Event", MINUTE, || async {
        cluster_events(&ns, "fresh")
            .await
            .iter()
            .any(|(r, _)| r == "MemberPodStuck")
    })
    .await;

    // A running cluster asked to upgrade to it: the first member tries, cannot get the image,
    // and starts again on the version it ran, on its own data; the version is refused, no
    // member is replaced, and no write is lost.
    let (from, to) = (etcd_version("3.5"), etcd_version("3.6"));
    ns.apply(&cluster_manifest("main", 3, &from, ""));
    let before = wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
    let ids: BTreeSet<Option<String>> = before
        .status
        .as_ref()
        .unwrap()
        .members
        .iter()
        .map(|m| m.id.clone())
        .collect();
    let endpoints = member_endpoints(&ns, &["main-0", "main-1", "main-2"]).await;
    let writer = Writer::start(etcd_client(&ns, "main", &endpoints).await);
    patch_spec(&ns, "main", serde_json::json!({ "version": "3.6.99" })).await;
    let refused = wait_for(
        "the unavailable version refused, the members back on theirs",
        3 * MINUTE,
        || async {
            let cluster = api.get("main").await.ok()?;
            let status = cluster.status.clone()?;
            (status.unavailable_version.as_deref() == Some("3.6.99")
                && status.operation.is_none()
                && status.ready.as_deref() == Some("3/3")
                && condition(&cluster, "Ready").is_some_and(|(s, r, _)| s == "False" && r == "VersionUnavailable"))
            .then_some(cluster)
        },
    )
    .await;
    let status = refused.status.clone().unwrap();
    assert_eq!(status.current_version.as_deref(), Some(from.as_str()));
    assert_eq!(
        status.members.iter().map(|m| m.id.clone()).collect::<BTreeSet<_>>(),
        ids,
        "no member replaced"
    );
    let events = cluster_events_when(&ns, "main", "a MemberReverted Event", |events| {
        events.iter().any(|(r, _)| r == "MemberReverted")
    })
    .await;
    assert!(events.iter().any(|(r, _)| r == "UpgradeReverted"), "{events:?}");
    assert!(events.iter().any(|(r, _)| r == "MemberReverted"), "{events:?}");
    assert!(
        !events
            .iter()
            .any(|(r, m)| r == "MemberUpgraded" && m.contains("3.6.99")),
        "{events:?}"
    );

    // A version whose image exists: the upgrade goes on, and the refusal is forgotten.
    patch_spec(&ns, "main", serde_json::json!({ "version": to })).await;
    let after = wait_on_version(&ns, "main", 3, &to).await;
    assert_eq!(after.status.as_ref().unwrap().unavailable_version, None);

    // A repository without the image (a registry that lacks it): the first member moved there
    // goes back to the repository the members ran, which is refused while it is asked for.
    let running_image = format!("quay.io/coreos/etcd:v{to}");
    let images_of = || async {
        let pods = ns.pods().list(&Default::default()).await.unwrap().items;
        pods.iter()
            .filter(|p| p.metadata.name.as_deref().is_some_and(|n| n.starts_with("main-")))
            .filter_map(|p| p.spec.as_ref()?.containers.first()?.image.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(images_of().await, vec![running_image.clone(); 3]);
    patch_spec(
        &ns,
        "main",
        serde_json::json!({ "imageRepository": "registry.invalid/etcd" }),
    )
    .await;
    wait_for(
        "the repository refused, the members back on theirs",
        4 * MINUTE,
        || async {
            let cluster = api.get("main").await.ok()?;
            let status = cluster.status.clone()?;
            (status.unavailable_repository.as_deref() == Some("registry.invalid/etcd")
                && status.operation.is_none()
                && status.ready.as_deref() == Some("3/3")
                && status.image_repository.as_deref() == Some("quay.io/coreos/etcd")
                && condition(&cluster, "Ready")
                    .is_some_and(|(s, r, _)| s == "False" && r == "ImageRepositoryUnavailable"))
            .then_some(())
        },
    )
    .await;
    assert_eq!(
        images_of().await,
        vec![running_image; 3],
        "every member on the repository it ran"
    );
    let events = cluster_events(&ns, "main").await;
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "UpgradeReverted" && m.contains("registry.invalid/etcd")),
        "{events:?}"
    );
    // A repository that has it: the members move there, and the refusal is forgotten.
    patch_spec(
        &ns,
        "main",
        serde_json::json!({ "imageRepository": "registry.example.com/etcd-team/etcd" }),
    )
    .await;
    let moved = format!("registry.example.com/etcd-team/etcd:v{to}");
    let after = wait_for("the members on the new repository", 4 * MINUTE, || async {
        let cluster = api.get("main").await.ok()?;
        (cluster_ready(&cluster, 3) && images_of().await == vec![moved.clone(); 3]).then_some(cluster)
    })
    .await;
    let status = after.status.clone().unwrap();
    assert_eq!(status.unavailable_repository, None);
    assert_eq!(
        status.image_repository.as_deref(),
        Some("registry.example.com/etcd-team/etcd")
    );
    let history = writer.stop().await;
    let mut checker = members_client(&ns, "main", &after).await;
    assert_no_write_lost(&history, &mut checker, 50).await;
}

#[tokio::test]
async fn fragmented_members_are_defragmented_one_at_a_time_the_leader_last() {
    use etcd_client::{CompactionOptions, DeleteOptions, Txn, TxnOp};

    install_crds();
    let ns = TestNamespace::new("etcd-defrag").await;
    let _operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    // Off first, so that the database can be filled and emptied before anything is decided.
    let off = "  defragmentation: { enabled: false, fragmentedPercent: 30, minDatabaseSize: 1Mi }\n";
    ns.apply(&cluster_manifest("main", 3, &etcd_version("3.6"), off));
    wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
    let mut client = etcd_client(
        &ns,
        "main",
        &member_endpoints(&ns, &["main-0", "main-1", "main-2"]).await,
    )
    .await;
    let value = "x".repeat(1024);
    for batch in 0..40 {
        let puts: Vec<TxnOp> = (0..100)
            .map(|i| TxnOp::put(format!("fill/{batch:03}/{i:03}"), value.clone(), None))
            .collect();
        client.txn(Txn::new().and_then(puts)).await.unwrap();
    }
    client.put("keep", "me", None).await.unwrap();
    let deleted = client
        .delete("fill/", Some(DeleteOptions::new().with_prefix()))
        .await
        .unwrap();
    let revision = deleted.header().unwrap().revision();
    client
        .compact(revision, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    let api: Api<EtcdCluster> = ns.api();
    let leader = api.get("main").await.unwrap().status.unwrap().leader.unwrap();

    patch_spec(
        &ns,
        "main",
        serde_json::json!({ "defragmentation": { "enabled": true } }),
    )
    .await;
    let events = wait_for("every member defragmented", 3 * MINUTE, || async {
        let events = cluster_events(&ns, "main").await;
        let done: Vec<(String, String)> = events.into_iter().filter(|(r, _)| r == "Defragmented").collect();
        (done.len() >= 3).then_some(done)
    })
    .await;
    let order: Vec<&str> = events
        .iter()
        .map(|(_, m)| {
            m.trim_start_matches("defragmented ")
                .split(':')
                .next()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(order.len(), 3, "each member once: {events:?}");
    assert_eq!(order.iter().collect::<BTreeSet<_>>().len(), 3, "{events:?}");
    assert_eq!(order[2], leader, "the leader last: {events:?}");
    // The status shows the sizes as the next pass reads them.
    wait_until("every member's database compact in status", MINUTE, || async {
        let c = api.get("main").await.unwrap();
        cluster_ready(&c, 3)
            && c.status.unwrap().members.iter().all(|m| {
                let (size, in_use) = (m.db_size.unwrap_or(0), m.db_size_in_use.unwrap_or(0));
                size > 0 && (size - in_use) * 100 < 30 * size && m.defragmented_at.is_some()
            })
    })
    .await;
    assert_eq!(
        client.get("keep", None).await.unwrap().kvs()[0].value_str().unwrap(),
        "me"
    );
}

/// The folder on this machine that holds `member`'s etcd data (its volume is a local folder).
async fn data_dir(ns: &TestNamespace, member: &str) -> std::path::PathBuf {
    claim_folder(ns, &format!("{member}-data")).await.join("data")
}

/// Waits until `lost` is no longer a member and the cluster is Ready with 3 others; checks
/// that it was removed from etcd before its successor was added.
async fn wait_removed_then_replaced(ns: &TestNamespace, lost: &str) -> EtcdCluster {
    let replaced = wait_replaced(ns, "main", 3, lost).await;
    let events = cluster_events(ns, "main").await;
    let removed = events
        .iter()
        .position(|(r, m)| r == "MemberRemoved" && m.contains(lost))
        .unwrap_or_else(|| panic!("no MemberRemoved for {lost}: {events:?}"));
    let added = events
        .iter()
        .rposition(|(r, _)| r == "AddingMember")
        .unwrap_or_else(|| panic!("no AddingMember: {events:?}"));
    assert!(
        removed < added,
        "{lost} removed before its successor was added: {events:?}"
    );
    replaced
}

#[tokio::test]
async fn a_member_whose_data_is_wiped_or_corrupt_is_replaced_and_never_forms_a_cluster_of_its_own() {
    install_crds();
    let ns = TestNamespace::new("etcd-disk").await;
    let operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    ns.apply(&cluster_manifest("main", 3, &etcd_version("3.5"), ""));
    let ready = wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
    let cluster_id = ready.status.as_ref().unwrap().cluster_id.clone();
    let healthy_members = format!(
        "noops_etcd_healthy_members{{namespace=\"{}\",cluster=\"main\"}}",
        ns.name
    );
    let mut client = etcd_client(&ns, "main", &[service_endpoint(&ns, "main").await]).await;
    for i in 0..50 {
        client
            .put(format!("disk/{i:02}"), format!("value {i}"), None)
            .await
            .unwrap();
    }
    // A member's data folder is wiped and its process killed: it comes back empty, with the
    // cluster state "existing", so it can neither start a cluster of its own nor rejoin as
    // itself. It is removed from etcd, then replaced under a new name.
    let wiped = follower(&ready).name;
    let dir = data_dir(&ns, &wiped).await;
    let wiped_endpoint = member_endpoints(&ns, &[wiped.as_str()]).await;
    std::fs::remove_dir_all(dir.join("member")).unwrap();
    kill_member_process(&ns, "main", &wiped);
    // Until it is gone, whatever answers at its address belongs to the cluster, never to one
    // of its own.
    let gone = AtomicBool::new(false);
    let watch_answers = async {
        let mut seen = BTreeSet::new();
        while !gone.load(Ordering::Relaxed) {
            if let Ok(mut client) = try_etcd_client(&ns, "main", &wiped_endpoint).await
                && let Ok(status) = client.status().await
                && let Some(header) = status.header()
            {
                seen.insert(format!("{:x}", header.cluster_id()));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        seen
    };
    let replace = async {
        let healed = wait_removed_then_replaced(&ns, &wiped).await;
        gone.store(true, Ordering::Relaxed);
        healed
    };
    let (answered_as, healed) = tokio::join!(watch_answers, replace);
    assert!(
        answered_as.iter().all(|id| Some(id) == cluster_id.as_ref()),
        "the wiped member answered as cluster(s) {answered_as:?}, not {cluster_id:?}"
    );

    // Another member's database file is overwritten with garbage: replaced the same way.
    let corrupt = follower(&healed).name;
    let db = data_dir(&ns, &corrupt).await.join("member/snap/db");
    std::fs::write(&db, vec![0xA5u8; 64 * 1024]).unwrap();
    kill_member_process(&ns, "main", &corrupt);
    let healed = wait_removed_then_replaced(&ns, &corrupt).await;

    assert_eq!(
        healed.status.as_ref().unwrap().cluster_id,
        cluster_id,
        "still the same cluster"
    );
    let mut checker = members_client(&ns, "main", &healed).await;
    assert_eq!(
        checker.member_list().await.unwrap().members().len(),
        3,
        "no member left behind"
    );
    let kept = checker
        .get("disk/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(kept.kvs().len(), 50, "every key is still there");
    wait_until("the metric to count three healthy members", MINUTE, || async {
        operator.metric(&healthy_members).await == Some(3.0)
    })
    .await;
}

/// Each member pod's UID and restart count.
async fn incarnations(ns: &TestNamespace, cluster: &EtcdCluster) -> Vec<(Option<String>, i32)> {
    let mut out = vec![];
    for member in member_names(cluster) {
        let pod = ns.pods().get(&member).await.unwrap();
        out.push((pod.metadata.uid.clone(), restart_count(&pod)));
    }
    out
}

#[tokio::test]
async fn certificates_are_renewed_before_they_expire_without_downtime() {
    // Certificates that last 150 s: issued again with 50 s left (within the operator's 10 s
    // look), and on the members' disks within the nodes' 10 s sync (`node_sync_seconds` in
    // hack/lib.sh), half a minute before the old ones expire.
    const LIFETIME: Duration = Duration::from_secs(150);
    install_crds();
    let ns = TestNamespace::new("etcd-certs").await;
    let lifetime = LIFETIME.as_secs().to_string();
    let _operator = Operator::start(
        &ns.name,
        &["--controllers", "etcd", "--certificate-lifetime-seconds", &lifetime],
    );
    let issued = std::time::Instant::now();
    ns.apply(&cluster_manifest("main", 3, &etcd_version("3.5"), ""));
    let ready = wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
    let secrets = ["main-peer", "main-server", "main-client"];
    let mut first = vec![];
    for secret in secrets {
        first.push(not_after(&ns, secret).await);
    }
    let pods_before = incarnations(&ns, &ready).await;
    let writer = Writer::start(etcd_client(&ns, "main", &[service_endpoint(&ns, "main").await]).await);

    // Renewed: every Secret holds a new certificate, with no pod restarted for it.
    wait_until("every certificate issued again", LIFETIME, || async {
        let mut renewed = true;
        for (secret, was) in secrets.iter().zip(&first) {
            renewed &= not_after(&ns, secret).await != *was;
        }
        renewed
    })
    .await;
    // Past the nodes' volume refresh, before the writer's own (old) client certificate expires.
    tokio::time::sleep(
        LIFETIME
            .saturating_sub(issued.elapsed())
            .saturating_sub(Duration::from_secs(20)),
    )
    .await;
    let history = writer.stop().await;
    assert_eq!(
        history.failed(),
        0,
        "no operation failed while certificates were renewed"
    );
    let pods_after = incarnations(&ns, &ready).await;
    assert_eq!(pods_after, pods_before, "no member restarted for the renewal");

    // Once the first certificates have expired, only the new ones can open a connection: a
    // member started again must join its peers, and a new client must get in.
    tokio::time::sleep(LIFETIME.saturating_sub(issued.elapsed()) + Duration::from_secs(10)).await;
    let restarted = member_names(&ready).into_iter().next().unwrap();
    kill_member_process(&ns, "main", &restarted);
    wait_until(&format!("{restarted} back and healthy"), 2 * MINUTE, || async {
        let pod = ns.pods().get(&restarted).await.unwrap();
        restart_count(&pod) > 0
            && pod_ready(&pod)
            && ns.api::<EtcdCluster>().get("main").await.ok().is_some_and(|c| {
                cluster_ready(&c, 3) && c.status.as_ref().is_some_and(|s| s.members.iter().all(|m| m.healthy))
            })
    })
    .await;
    let mut checker = members_client(&ns, "main", &ready).await;
    assert_no_write_lost(&history, &mut checker, 50).await;
}

/// Certificate Secrets a user would bring (made here with rcgen, as openssl or cert-manager
/// would): a CA of their own; a peer certificate for every member; a server certificate for
/// every member and the client Service, or (`server_names_members` false) for `localhost`
/// only; a client certificate. Applied as `<prefix>-peer`, `<prefix>-server`, `<prefix>-client`.
fn apply_user_certificates(ns: &TestNamespace, cluster: &str, prefix: &str, server_names_members: bool) {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose as Eku, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let members = format!("*.{cluster}.{}.svc", ns.name);
    let client_service = format!("{cluster}-client.{}.svc", ns.name);
    let server_names = if server_names_members {
        vec![members.clone(), client_service]
    } else {
        vec!["localhost".to_string()]
    };
    let leaves = [
        ("peer", vec![members], vec![Eku::ServerAuth, Eku::ClientAuth]),
        ("server", server_names, vec![Eku::ServerAuth, Eku::ClientAuth]),
        ("client", vec![], vec![Eku::ClientAuth]),
    ];
    for (role, sans, usages) in leaves {
        let mut params = CertificateParams::new(sans).unwrap();
        params.extended_key_usages = usages;
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap().pem();
        let indent = |pem: &str| pem.lines().map(|l| format!("    {l}\n")).collect::<String>();
        ns.apply(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{ name: {prefix}-{role} }}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}  ca.crt: |\n{}",
            indent(&cert),
            indent(&key.serialize_pem()),
            indent(&ca_pem)
        ));
    }
}

/// Waits until cluster `name` is refused with `reason`; its message.
async fn wait_refused(ns: &TestNamespace, name: &str, reason: &str) -> String {
    let cluster = wait_ready_false(ns, name, reason).await;
    condition(&cluster, "Ready").map(|(_, _, m)| m).unwrap_or_default()
}

#[tokio::test]
async fn a_cluster_runs_on_the_users_own_certificates_and_refuses_ones_that_cannot_work() {
    install_crds();
    let ns = TestNamespace::new("etcd-user-tls").await;
    let _operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    let version = etcd_version("3.6");
    let tls = |prefix: &str| {
        format!("  tls:\n    secrets: {{ peer: {prefix}-peer, server: {prefix}-server, client: {prefix}-client }}\n")
    };

    // Named before they exist: said so, and nothing starts.
    ns.apply(&cluster_manifest("mine", 3, &version, &tls("mine")));
    let message = wait_refused(&ns, "mine", "TlsSecretMissing").await;
    assert!(message.contains("mine-peer"), "{message}");
    assert!(ns.pods().get_opt("mine-0").await.unwrap().is_none());

    // Once they exist, the cluster runs on them, and the operator issues nothing of its own.
    apply_user_certificates(&ns, "mine", "mine", true);
    let cluster = wait_cluster_ready(&ns, "mine", 3, 3 * MINUTE).await;
    assert_eq!(
        cluster.status.as_ref().unwrap().client_secret.as_deref(),
        Some("mine-client")
    );
    let names: Vec<String> = member_names(&cluster).into_iter().collect();
    let endpoints = member_endpoints(&ns, &names.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let mut client = try_etcd_client_of(&ns, "mine", "mine-client", &endpoints)
        .await
        .unwrap();
    client.put("brought", "my own", None).await.unwrap();
    let got = client.get("brought", None).await.unwrap();
    assert_eq!(got.kvs()[0].value_str().unwrap(), "my own");
    let secrets: Api<Secret> = ns.api();
    assert!(
        secrets.get_opt("mine-ca").await.unwrap().is_none(),
        "the operator made a CA"
    );

    // A server certificate that does not name the members: refused before anything starts.
    apply_user_certificates(&ns, "wrong", "wrong", false);
    ns.apply(&cluster_manifest("wrong", 1, &version, &tls("wrong")));
    let message = wait_refused(&ns, "wrong", "TlsSecretInvalid").await;
    assert!(
        message.contains("tls.secrets.server") && message.contains("*.wrong."),
        "{message}"
    );
    assert!(ns.pods().get_opt("wrong-0").await.unwrap().is_none());
    // Asked for without TLS: refused by the API server.
    let plain = "  tls:\n    enabled: false\n    secrets: { peer: a, server: b, client: c }\n";
    let out = kubectl(
        &["apply", "-n", &ns.name, "-f", "-"],
        Some(&cluster_manifest("plain", 1, &version, plain)),
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("tls.secrets needs tls.enabled"),
        "{out:?}"
    );
}
