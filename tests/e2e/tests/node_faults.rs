//! Node faults, injected with `hack/node.sh` as a user would: a machine that dies and comes back,
//! a node cut off from the network, every node rebooting at once. Kubernetes' own node lifecycle
//! reacts to them (NotReady, taints, eviction).
//!
//! These tests stop and partition nodes, so they run one at a time, after the other end-to-end
//! tests: `make e2e` runs them with `--ignored --test-threads=1`. `make chaos` runs the node-kill
//! test with many rounds (`NOOPS_CHAOS_NODE_KILLS`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{ListParams, LogParams};
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);

/// A StatefulSet whose pods write a stamp into their volume once, and print it at every start.
/// `placement` goes into the pod spec (a nodeSelector or a spread constraint).
fn keeper(replicas: u32, placement: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{ name: keeper }}
spec: {{ clusterIP: None, selector: {{ app: keeper }}, ports: [{{ port: 80 }}] }}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{ name: keeper }}
spec:
  serviceName: keeper
  replicas: {replicas}
  podManagementPolicy: Parallel
  selector: {{ matchLabels: {{ app: keeper }} }}
  template:
    metadata: {{ labels: {{ app: keeper }} }}
    spec:
      terminationGracePeriodSeconds: 1
{placement}
      containers:
        - name: keeper
          image: busybox
          env: [{{ name: POD_NAME, valueFrom: {{ fieldRef: {{ fieldPath: metadata.name }} }} }}]
          command: ["sh", "-c"]
          args:
            - |
              if [ ! -f /data/stamp ]; then
                echo "$POD_NAME-$(date +%s%N)" > /data/stamp.tmp && sync && mv /data/stamp.tmp /data/stamp
              fi
              echo "data: $(cat /data/stamp)"
              exec sleep 100000
          readinessProbe: {{ exec: {{ command: ["cat", "/data/stamp"] }}, periodSeconds: 1 }}
          volumeMounts: [{{ name: data, mountPath: /data }}]
  volumeClaimTemplates:
    - metadata: {{ name: data }}
      spec: {{ accessModes: [ReadWriteOnce], resources: {{ requests: {{ storage: 1Gi }} }} }}
"#
    )
}

const SPREAD: &str = "      topologySpreadConstraints:
        - { maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: { matchLabels: { app: keeper } } }";

/// The stamp a keeper pod printed at its current start, once it is Ready.
async fn stamp(ns: &TestNamespace, name: &str) -> String {
    let pods = ns.pods();
    wait_for(&format!("{name} Ready with its stamp"), 2 * MINUTE, || async {
        let pod = pods.get_opt(name).await.ok()??;
        if !pod_ready(&pod) {
            return None;
        }
        let logs = pods.logs(name, &LogParams::default()).await.ok()?;
        logs.lines().find_map(|l| l.strip_prefix("data: ")).map(str::to_string)
    })
    .await
}

async fn wait_node_status(client: &Client, node: &str, want_ready: bool, timeout: Duration) {
    let what = format!("{node} {}", if want_ready { "Ready" } else { "NotReady" });
    wait_until(&what, timeout, || async {
        let status = nodes(client)
            .await
            .into_iter()
            .find(|n| n.metadata.name.as_deref() == Some(node))
            .and_then(|n| node_ready_status(&n));
        (status.as_deref() == Some("True")) == want_ready
    })
    .await;
}

#[tokio::test]
#[ignore = "node faults disturb other tests: `make e2e` runs them alone"]
async fn a_stopped_node_goes_not_ready_its_pods_move_and_it_comes_back_with_its_volumes() {
    let _restore = RestoreNodesOnDrop;
    let ns = TestNamespace::new("node-stop").await;
    let client = ns.client.clone();
    ready_nodes(&client, 3).await;
    ns.apply(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: { name: web }
spec:
  replicas: 3
  selector: { matchLabels: { app: web } }
  template:
    metadata: { labels: { app: web } }
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
        - { maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway, labelSelector: { matchLabels: { app: web } } }
      containers:
        - { name: web, image: hashicorp/http-echo, args: ["-text=web", "-listen=:8080"] }
"#,
    );
    let pods = ns.pods();
    let web = ListParams::default().labels("app=web");
    let first: Vec<Pod> = wait_for("three web pods Ready", 2 * MINUTE, || async {
        let list = pods.list(&web).await.ok()?.items;
        (list.len() == 3 && list.iter().all(pod_ready)).then_some(list)
    })
    .await;
    let victim = pod_node(&first[0]);
    let placement = format!("      nodeSelector: {{ kubernetes.io/hostname: {victim} }}");
    ns.apply(&keeper(1, &placement));
    let before = stamp(&ns, "keeper-0").await;
    let keeper_uid = pods.get("keeper-0").await.unwrap().metadata.uid;

    node_fault(&["stop", &victim]);
    // NotReady within the grace period (10 s) and the controller's next look.
    wait_node_status(&client, &victim, false, Duration::from_secs(30)).await;
    // The Deployment's pods are recreated on the other nodes once evicted (toleration 10 s).
    wait_until(
        "three web pods Ready away from the stopped node",
        2 * MINUTE,
        || async {
            let Ok(list) = pods.list(&web).await else { return false };
            let live: Vec<&Pod> = list
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            live.len() == 3 && live.iter().all(|p| pod_ready(p) && pod_node(p) != victim)
        },
    )
    .await;
    // The StatefulSet pod stays on its node, the same pod, until that node says otherwise.
    let stuck = pods.get("keeper-0").await.unwrap();
    assert_eq!(stuck.metadata.uid, keeper_uid, "keeper-0 was not replaced");
    assert_eq!(pod_node(&stuck), victim);
    assert!(!pod_ready(&stuck), "keeper-0 on a dead node is not Ready");

    node_fault(&["start", &victim]);
    wait_node_status(&client, &victim, true, MINUTE).await;
    // keeper-0 runs again on its node (restarted in place, or recreated there after its
    // eviction finished) with the data it wrote before.
    let after = stamp(&ns, "keeper-0").await;
    assert_eq!(after, before, "keeper-0 came back with its volume");
    assert_eq!(pod_node(&pods.get("keeper-0").await.unwrap()), victim);
    // The evicted web pod is finished off by the node that comes back.
    wait_until("no web pod left terminating on the node", MINUTE, || async {
        pods.list(&web).await.is_ok_and(|l| {
            l.items
                .iter()
                .all(|p| pod_node(p) != victim || p.metadata.deletion_timestamp.is_none())
        })
    })
    .await;
}

#[tokio::test]
#[ignore = "node faults disturb other tests: `make e2e` runs them alone"]
async fn a_partitioned_node_is_cut_off_from_other_nodes_pods_until_healed() {
    let _restore = RestoreNodesOnDrop;
    let ns = TestNamespace::new("partition").await;
    let client = ns.client.clone();
    let nodes = ready_nodes(&client, 3).await;
    let (target_node, prober_node) = (&nodes[1], &nodes[2]);
    // Both tolerate an unreachable node for longer than the test, so nothing is evicted while
    // the partition lasts.
    let tolerations = r#"
  tolerations:
    - { key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 600 }
    - { key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 600 }"#;
    ns.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{ name: target }}
spec:
  nodeSelector: {{ kubernetes.io/hostname: {target_node} }}
  terminationGracePeriodSeconds: 1{tolerations}
  containers: [{{ name: web, image: hashicorp/http-echo, args: ["-text=target", "-listen=:8080"] }}]
"#
    ));
    let target = ns.wait_pod_ready("target", MINUTE).await;
    let target_ip = pod_ip(&target).unwrap();
    ns.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{ name: prober }}
spec:
  nodeSelector: {{ kubernetes.io/hostname: {prober_node} }}
  terminationGracePeriodSeconds: 1{tolerations}
  containers:
    - name: prober
      image: busybox
      command: ["sh", "-c", "while true; do if curl -sf --max-time 1 http://{target_ip}:8080/ >/dev/null; then r=ok; else r=fail; fi; echo \"$(date +%s) $r\"; sleep 0.5; done"]
"#
    ));
    ns.wait_pod_ready("prober", MINUTE).await;
    let pods = ns.pods();
    // Results the prober logged at or after `since` (unix seconds).
    let results_since = |since: u64| {
        let pods = pods.clone();
        async move {
            let logs = pods.logs("prober", &LogParams::default()).await.unwrap_or_default();
            logs.lines()
                .filter_map(|l| l.split_once(' '))
                .filter(|(t, _)| t.parse::<u64>().is_ok_and(|t| t >= since))
                .map(|(_, r)| r.to_string())
                .collect::<Vec<_>>()
        }
    };
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    wait_until("the prober to reach the target", MINUTE, || async {
        results_since(0).await.iter().any(|r| r == "ok")
    })
    .await;
    let safety_before = nft_table("noops_safety");

    node_fault(&["partition", target_node]);
    let cut = now() + 1;
    wait_until("the prober to lose the target", Duration::from_secs(30), || async {
        let r = results_since(cut).await;
        r.len() >= 3 && r.iter().all(|r| r == "fail")
    })
    .await;
    assert!(
        http_get(&format!("{target_ip}:8080"), "/").await.is_none(),
        "this machine reaches a partitioned pod"
    );
    // The node's agent is cut off too: the control plane stops hearing from it.
    wait_node_status(&client, target_node, false, Duration::from_secs(30)).await;
    // Nothing but drops on our own ranges, and the safety rules unchanged.
    let partition = nft_table("noops_partition");
    let rules: Vec<&str> = partition.lines().filter(|l| l.contains("ip ")).collect();
    assert!(!rules.is_empty(), "{partition}");
    for rule in rules {
        assert!(
            rule.contains("10.244.") && rule.trim_end().ends_with("drop"),
            "unexpected partition rule: {rule}"
        );
    }
    assert_eq!(nft_table("noops_safety"), safety_before, "the safety table changed");

    node_fault(&["heal", target_node]);
    let healed = now() + 1;
    wait_until("the prober to reach the target again", MINUTE, || async {
        results_since(healed)
            .await
            .iter()
            .rev()
            .take(3)
            .filter(|r| *r == "ok")
            .count()
            == 3
    })
    .await;
    wait_node_status(&client, target_node, true, MINUTE).await;
    for family in ["inet", "bridge"] {
        assert!(
            std::process::Command::new("nft")
                .args(["list", "table", family, "noops_partition"])
                .output()
                .is_ok_and(|o| !o.status.success()),
            "no {family} partition table left once every node is healed"
        );
    }
}

fn nft_table(name: &str) -> String {
    let out = std::process::Command::new("nft")
        .args(["list", "table", "inet", name])
        .output()
        .expect("nft");
    assert!(
        out.status.success(),
        "nft list table {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Stamps of every keeper pod, by pod name.
async fn stamps(ns: &TestNamespace, replicas: u32) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for i in 0..replicas {
        let name = format!("keeper-{i}");
        out.insert(name.clone(), stamp(ns, &name).await);
    }
    out
}

/// A pod's identity and restart count: either changes when its container starts again (a
/// pod evicted during a long outage comes back as a new pod).
type Incarnation = (Option<String>, i32);

fn incarnation(pod: &Pod) -> Incarnation {
    (pod.metadata.uid.clone(), restart_count(pod))
}

/// Waits until every keeper pod has started again since `before` and is Ready.
async fn wait_restarted(ns: &TestNamespace, before: &BTreeMap<String, Incarnation>) {
    let pods = ns.pods();
    for (name, (uid, restarts)) in before {
        wait_until(&format!("{name} restarted and Ready"), 2 * MINUTE, || async {
            pods.get_opt(name)
                .await
                .ok()
                .flatten()
                .is_some_and(|p| pod_ready(&p) && (p.metadata.uid != *uid || restart_count(&p) > *restarts))
        })
        .await;
    }
}

async fn incarnations(ns: &TestNamespace, replicas: u32) -> BTreeMap<String, Incarnation> {
    let mut out = BTreeMap::new();
    for i in 0..replicas {
        let name = format!("keeper-{i}");
        out.insert(name.clone(), incarnation(&ns.pods().get(&name).await.unwrap()));
    }
    out
}

#[tokio::test]
#[ignore = "node faults disturb other tests: `make e2e` runs them alone"]
async fn every_node_rebooting_at_once_brings_a_statefulset_back_with_its_data() {
    let _restore = RestoreNodesOnDrop;
    let ns = TestNamespace::new("restart-all").await;
    ready_nodes(&ns.client, 3).await;
    ns.apply(&keeper(3, SPREAD));
    let before = stamps(&ns, 3).await;
    let restarts = incarnations(&ns, 3).await;

    node_fault(&["restart-all"]);
    wait_restarted(&ns, &restarts).await;
    assert_eq!(stamps(&ns, 3).await, before, "every pod came back with its own data");
}

/// Kills a node, then brings it back, `NOOPS_CHAOS_NODE_KILLS` times (2 by default; `make
/// chaos` runs many), and checks after each round that every pod of a StatefulSet spread over
/// the nodes has the data it wrote first. Prints how many kills it injected and what was lost.
#[tokio::test]
#[ignore = "node faults disturb other tests: `make e2e` runs them alone"]
async fn repeated_node_kills_lose_no_data() {
    let rounds = chaos::rounds("NOOPS_CHAOS_NODE_KILLS", 2);
    let _restore = RestoreNodesOnDrop;
    let ns = TestNamespace::new("node-kills").await;
    let nodes = ready_nodes(&ns.client, 3).await;
    ns.apply(&keeper(3, SPREAD));
    let first = stamps(&ns, 3).await;
    let mut lost = 0;
    for round in 0..rounds {
        let victim = &nodes[round % nodes.len()];
        let on_victim: BTreeMap<String, Incarnation> = ns
            .pods()
            .list(&ListParams::default().labels("app=keeper"))
            .await
            .unwrap()
            .items
            .iter()
            .filter(|p| pod_node(p) == *victim)
            .map(|p| (p.metadata.name.clone().unwrap(), incarnation(p)))
            .collect();
        node_fault(&["stop", victim]);
        // Down for a moment only, as a crash and reboot: less than the grace period.
        tokio::time::sleep(Duration::from_secs(2)).await;
        node_fault(&["start", victim]);
        wait_restarted(&ns, &on_victim).await;
        let now = stamps(&ns, 3).await;
        lost += now
            .iter()
            .filter(|(pod, stamp)| first.get(*pod) != Some(*stamp))
            .count();
    }
    println!("chaos: injected {rounds} node kills; pods that lost their data: {lost}");
    assert_eq!(lost, 0, "data lost after node kills");
}

#[tokio::test]
#[ignore = "node faults disturb other tests: `make e2e` runs them alone"]
async fn an_etcd_member_whose_node_dies_is_removed_then_replaced_without_losing_a_write() {
    use noops_api::EtcdCluster;
    use noops_e2e::etcd::*;

    let _restore = RestoreNodesOnDrop;
    install_crds();
    let ns = TestNamespace::new("etcd-node").await;
    ready_nodes(&ns.client, 3).await;
    let _operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    ns.apply(&cluster_manifest("main", 3, &etcd_version("3.5"), ""));
    let cluster = wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
    let status = cluster.status.unwrap();
    // The leader's machine dies: the hardest case (an election, then the repair).
    let leader = status.leader.clone().unwrap();
    let victim_node = status
        .members
        .iter()
        .find(|m| m.name == leader)
        .unwrap()
        .node
        .clone()
        .unwrap();
    let endpoints = member_endpoints(&ns, &["main-0", "main-1", "main-2"]).await;
    let writer = Writer::start(etcd_client(&ns, "main", &endpoints).await);
    tokio::time::sleep(Duration::from_secs(2)).await;

    node_fault(&["stop", &victim_node]);
    // Removed from etcd once unhealthy past the grace period, its pod (stuck on the dead node)
    // deleted, and a new member added on a live node.
    let api: kube::Api<EtcdCluster> = ns.api();
    let repaired = wait_for("the cluster repaired without the dead member", 4 * MINUTE, || async {
        api.get("main").await.ok().filter(|c| {
            cluster_ready(c, 3)
                && c.status.as_ref().is_some_and(|s| {
                    !s.members.iter().any(|m| m.name == leader)
                        && s.members
                            .iter()
                            .all(|m| m.node.as_deref() != Some(victim_node.as_str()))
                })
        })
    })
    .await;
    let history = writer.stop().await;
    let names: Vec<String> = repaired
        .status
        .unwrap()
        .members
        .iter()
        .map(|m| m.name.clone())
        .collect();
    let mut checker = etcd_client(
        &ns,
        "main",
        &member_endpoints(&ns, &names.iter().map(String::as_str).collect::<Vec<_>>()).await,
    )
    .await;
    assert_no_write_lost(&history, &mut checker, 20).await;
    let events = cluster_events(&ns, "main").await;
    let position = |reason: &str, member: &str| {
        events
            .iter()
            .position(|(r, m)| r == reason && m.contains(member))
            .unwrap_or_else(|| panic!("no {reason} for {member}: {events:?}"))
    };
    let successor = names
        .iter()
        .find(|n| !["main-0", "main-1", "main-2"].contains(&n.as_str()))
        .unwrap();
    assert!(
        position("MemberRemoved", &leader) < position("AddingMember", successor),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "ForceDeletedPod" && m.contains(&leader)),
        "the pod stuck on the dead node was force-deleted, and said so: {events:?}"
    );

    // Two members now share a node: losing it would lose the quorum, and the status says so.
    let shared = wait_for("the status saying that two members share a node", MINUTE, || async {
        let status = api.get("main").await.ok()?.status?;
        let degraded = status.conditions.into_iter().find(|c| c.type_ == "Degraded")?;
        (degraded.reason == "MembersShareNode").then_some(degraded.message)
    })
    .await;
    assert!(shared.contains("share node"), "{shared}");

    // The machine comes back: nothing of the old member rejoins, and a member that shares a
    // node moves to it (removed, then a successor added), every acknowledged write kept.
    forget_writes(&mut checker).await;
    let writer = Writer::start(etcd_client(&ns, "main", &[service_endpoint(&ns, "main").await]).await);
    // Every status the move goes through, from a watch: never fewer voters than asked for
    // (the member on the free node is added before one of the shared node's goes).
    let fewest_voters = std::sync::Arc::new(std::sync::Mutex::new((usize::MAX, String::new())));
    let voter_watch = {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        let statuses = watcher(api.clone(), watcher::Config::default().fields("metadata.name=main"))
            .default_backoff()
            .applied_objects();
        let fewest = fewest_voters.clone();
        tokio::spawn(async move {
            futures::pin_mut!(statuses);
            while let Some(Ok(cluster)) = statuses.next().await {
                let members = cluster.status.map(|s| s.members).unwrap_or_default();
                let voters = members.iter().filter(|m| m.id.is_some() && !m.learner).count();
                let mut seen = fewest.lock().unwrap();
                if voters < seen.0 {
                    let names: Vec<String> = members
                        .iter()
                        .map(|m| format!("{}{}", m.name, if m.learner { "(learner)" } else { "" }))
                        .collect();
                    *seen = (voters, names.join(","));
                }
            }
        })
    };
    node_fault(&["start", &victim_node]);
    wait_node_status(&ns.client, &victim_node, true, MINUTE).await;
    let apart = wait_for("the members on three nodes again", 5 * MINUTE, || async {
        let c = api.get("main").await.ok().filter(|c| cluster_ready(c, 3))?;
        let status = c.status.clone()?;
        let nodes: std::collections::BTreeSet<String> = status.members.iter().filter_map(|m| m.node.clone()).collect();
        let said = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Degraded" && c.status == "False");
        (nodes.len() == 3 && status.operation.is_none() && said).then_some(status)
    })
    .await;
    assert!(!apart.members.iter().any(|m| m.name == leader));
    voter_watch.abort();
    let (fewest, then) = fewest_voters.lock().unwrap().clone();
    assert_eq!(
        fewest, 3,
        "fewest voters while the members moved apart: {fewest} ({then})"
    );
    let history = writer.stop().await;
    let names: Vec<&str> = apart.members.iter().map(|m| m.name.as_str()).collect();
    let mut checker = etcd_client(&ns, "main", &member_endpoints(&ns, &names).await).await;
    assert_no_write_lost(&history, &mut checker, 20).await;
    assert_eq!(checker.member_list().await.unwrap().members().len(), 3);
    let events = cluster_events(&ns, "main").await;
    assert!(
        events.iter().any(|(r, _)| r == "MembersShareNode"),
        "a Warning said so: {events:?}"
    );
}

#[tokio::test]
#[ignore = "node faults disturb other tests: `make e2e` runs them alone"]
async fn every_node_rebooting_at_once_brings_an_etcd_cluster_back_as_itself() {
    use noops_api::EtcdCluster;
    use noops_e2e::etcd::*;

    let _restore = RestoreNodesOnDrop;
    install_crds();
    let ns = TestNamespace::new("etcd-reboot").await;
    ready_nodes(&ns.client, 3).await;
    let _operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    ns.apply(&cluster_manifest("main", 3, &etcd_version("3.5"), ""));
    let before = wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
    let status = before.status.clone().unwrap();
    let ids: BTreeSet<Option<String>> = status.members.iter().map(|m| m.id.clone()).collect();
    let members = ["main-0", "main-1", "main-2"];
    let mut client = etcd_client(&ns, "main", &member_endpoints(&ns, &members).await).await;
    for i in 0..50 {
        client
            .put(format!("reboot/{i:02}"), format!("value {i}"), None)
            .await
            .unwrap();
    }
    let mut restarts = BTreeMap::new();
    for member in members {
        restarts.insert(member.to_string(), incarnation(&ns.pods().get(member).await.unwrap()));
    }

    let told_before = cluster_events(&ns, "main").await.len();

    // Every machine reboots at once: every member stops together, none has a quorum to
    // join, and all must come back as the same cluster.
    node_fault(&["restart-all"]);
    wait_restarted(&ns, &restarts).await;
    let api: kube::Api<EtcdCluster> = ns.api();
    let after = wait_for("the same cluster Ready again", 3 * MINUTE, || async {
        api.get("main").await.ok().filter(|c| {
            cluster_ready(c, 3)
                && c.status
                    .as_ref()
                    .is_some_and(|s| s.members.iter().map(|m| m.id.clone()).collect::<BTreeSet<_>>() == ids)
        })
    })
    .await;
    let after = after.status.unwrap();
    assert_eq!(after.cluster_id, status.cluster_id, "the same cluster, not a new one");
    let mut client = etcd_client(&ns, "main", &member_endpoints(&ns, &members).await).await;
    let kept = client
        .get("reboot/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(kept.kvs().len(), 50, "every key written before the reboot is there");
    let events = cluster_events(&ns, "main").await;
    let since = &events[told_before.min(events.len())..];
    assert!(
        !since
            .iter()
            .any(|(r, _)| ["RemovingMember", "MemberRemoved", "AddingMember"].contains(&r.as_str())),
        "a reboot replaces no member: {since:?}"
    );
}

#[tokio::test]
#[ignore = "node faults disturb other tests: `make e2e` runs them alone"]
async fn two_of_three_etcd_nodes_down_past_the_eviction_toleration_come_back_as_the_same_members() {
    use noops_api::EtcdCluster;
    use noops_e2e::etcd::*;

    let _restore = RestoreNodesOnDrop;
    install_crds();
    let ns = TestNamespace::new("etcd-nodes-back").await;
    ready_nodes(&ns.client, 3).await;
    let _operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    ns.apply(&cluster_manifest("main", 3, &etcd_version("3.5"), ""));
    let ready = wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
    let status = ready.status.clone().unwrap();
    let ids: BTreeMap<String, Option<String>> = status.members.iter().map(|m| (m.name.clone(), m.id.clone())).collect();
    // Every machine but one follower's dies, the leader's among them: one member is left,
    // without a quorum.
    let survivor = follower(&ready).name;
    let victims: Vec<(String, String)> = status
        .members
        .iter()
        .filter(|m| m.name != survivor)
        .map(|m| (m.name.clone(), m.node.clone().unwrap()))
        .collect();
    assert_eq!(victims.len(), 2, "{victims:?}");
    let writer = Writer::start(etcd_client(&ns, "main", &[service_endpoint(&ns, "main").await]).await);
    tokio::time::sleep(Duration::from_secs(2)).await;

    for (_, node) in &victims {
        node_fault(&["stop", node]);
    }
    // Past the toleration their pods are evicted, and stay (no node confirms they stopped): the
    // members wait for their nodes, and the status names them.
    let api: kube::Api<EtcdCluster> = ns.api();
    let waiting = wait_for(
        "QuorumLost naming the nodes the members wait for",
        2 * MINUTE,
        || async {
            let evicted = {
                let pods = ns.pods();
                let mut all = true;
                for (member, _) in &victims {
                    all &= pods
                        .get_opt(member)
                        .await
                        .ok()
                        .flatten()
                        .is_some_and(|p| p.metadata.deletion_timestamp.is_some());
                }
                all
            };
            let cluster = api.get("main").await.ok()?;
            let (_, reason, message) = condition(&cluster, "Ready")?;
            (evicted
                && reason == "QuorumLost"
                && victims
                    .iter()
                    .all(|(m, node)| message.contains(&format!("{m} waits for node {node}"))))
            .then_some(message)
        },
    )
    .await;
    assert!(waiting.contains("Waiting can bring it back"), "{waiting}");
    tokio::time::sleep(Duration::from_secs(5)).await;

    for (_, node) in &victims {
        node_fault(&["start", node]);
    }
    let back = wait_for("the same members Ready again", 3 * MINUTE, || async {
        api.get("main").await.ok().filter(|c| {
            cluster_ready(c, 3)
                && c.status.as_ref().is_some_and(|s| {
                    s.members
                        .iter()
                        .map(|m| (m.name.clone(), m.id.clone()))
                        .collect::<BTreeMap<_, _>>()
                        == ids
                })
        })
    })
    .await;
    assert_eq!(
        back.status.as_ref().unwrap().cluster_id,
        status.cluster_id,
        "the same cluster"
    );
    let history = writer.stop().await;
    let mut checker = members_client(&ns, "main", &back).await;
    assert_eq!(checker.member_list().await.unwrap().members().len(), 3);
    assert_no_write_lost(&history, &mut checker, 20).await;
    let events = cluster_events(&ns, "main").await;
    assert!(
        events.iter().any(|(r, _)| r == "RestartingMembers"),
        "the evicted members were started again on their volumes: {events:?}"
    );
}

/// Starts the object store in `ns` with a bucket `pg-backups`, and picks a node to stop that
/// does not run it: (that node, the others).
async fn store_and_victim(ns: &TestNamespace) -> (String, Vec<String>) {
    let nodes = ready_nodes(&ns.client, 3).await;
    s3::deploy(ns);
    s3::create_bucket(ns, "pg-backups").await;
    let store_pod = ns
        .pods()
        .list(&ListParams::default().labels("app.kubernetes.io/name=versitygw"))
        .await
        .unwrap();
    let store_node = pod_node(&store_pod.items[0]);
    let victim = nodes.iter().find(|n| **n != store_node).unwrap().clone();
    let others = nodes.into_iter().filter(|n| *n != victim).collect();
    (victim, others)
}

#[tokio::test]
#[ignore = "node faults disturb other tests: `make e2e` runs them alone"]
async fn a_postgresql_whose_node_dies_comes_back_elsewhere_from_its_backups_or_waits_without_them() {
    use noops_e2e::postgres::*;

    let _restore = RestoreNodesOnDrop;
    install_crds();
    let ns = TestNamespace::new("pg-node").await;
    // Both databases go on a node of their own, away from the store: the others are cordoned
    // while they start.
    let (victim, others) = store_and_victim(&ns).await;
    for node in &others {
        kubectl_ok(&["cordon", node], None);
    }
    let _operator = Operator::start(&ns.name, &["--controllers", "postgres,postgresbackup"]);
    ns.apply(&manifest("shop", "pw", &backup_to_bucket(&ns, "pg-backups", "")));
    ns.apply(&manifest("plain", "pw", ""));
    wait_ready(&ns, "shop", 3 * MINUTE).await;
    wait_ready(&ns, "plain", 3 * MINUTE).await;
    for node in &others {
        kubectl_ok(&["uncordon", node], None);
    }
    wait_condition(&ns, "shop", "BackupSucceeded", "True", 2 * MINUTE).await;
    for name in ["shop", "plain"] {
        let pod = ns.pods().get(&format!("{name}-0")).await.unwrap();
        assert_eq!(pod_node(&pod), victim);
        let ip = pod_ip(&pod).unwrap();
        make_items(&ip, "pw", 100);
    }
    let ip = instance_ip(&ns, "shop").await;
    let superuser = superuser_password(&ns, "shop").await;
    let segment = current_segment(&ip, &superuser);
    wait_archived(&ip, &superuser, &segment, MINUTE).await;

    let claims = ns.api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>();
    let old_volume = claims
        .get("data-shop-0")
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_name
        .unwrap();
    node_fault(&["stop", &victim]);
    // With a backup: its volume given up, it starts on another node, restored.
    let pods = ns.pods();
    let moved = wait_for("shop-0 Ready on another node", 5 * MINUTE, || async {
        pods.get_opt("shop-0")
            .await
            .ok()
            .flatten()
            .filter(|p| pod_ready(p) && pod_node(p) != victim)
    })
    .await;
    let pg = wait_ready(&ns, "shop", 2 * MINUTE).await;
    assert!(pg.status.unwrap().restore.is_some(), "it was restored");
    let ip = pod_ip(&moved).unwrap();
    assert_eq!(contiguous_ids(&ip, "app", "pw", "shop"), 100);
    let events = ns
        .api::<k8s_openapi::api::core::v1::Event>()
        .list(&Default::default())
        .await
        .unwrap();
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("VolumeGivenUp") && e.involved_object.name.as_deref() == Some("shop")),
        "the operator said it gave the volume up"
    );
    let volumes: kube::Api<k8s_openapi::api::core::v1::PersistentVolume> = kube::Api::all(ns.client.clone());
    let kept = volumes.get(&old_volume).await.unwrap();
    assert_eq!(
        kept.spec.unwrap().persistent_volume_reclaim_policy.as_deref(),
        Some("Retain"),
        "the volume given up is kept for salvage"
    );
    let _ = volumes.delete(&old_volume, &Default::default()).await;
    // Without one: it waits for its node, and says why.
    let waiting = wait_not_ready(&ns, "plain", "NodeLost", 2 * MINUTE).await;
    assert!(
        condition(&waiting, "Degraded")
            .unwrap()
            .2
            .contains("waits for the node"),
        "{waiting:?}"
    );

    // The node comes back: the one that waited has its data again.
    node_fault(&["start", &victim]);
    wait_node_status(&ns.client, &victim, true, MINUTE).await;
    let back = wait_ready(&ns, "plain", 3 * MINUTE).await;
    let ip = instance_ip(&ns, "plain").await;
    assert_eq!(contiguous_ids(&ip, "app", "pw", "shop"), 100);
    assert!(back.status.unwrap().restore.is_none(), "the same volume, not a restore");
}

#[tokio::test]
#[ignore = "node faults disturb other tests: `make e2e` runs them alone"]
async fn a_postgresql_primary_whose_node_stops_is_replaced_without_the_node_controller_losing_no_commit() {
    use noops_e2e::postgres::*;

    let _restore = RestoreNodesOnDrop;
    install_crds();
    let ns = TestNamespace::new("pg-ha-node").await;
    ready_nodes(&ns.client, 3).await;
    let _operator = Operator::start(&ns.name, &["--controllers", "postgres"]);
    let (password, rw, ledger) = three_instances_under_a_ledger(&ns, "  synchronous: { number: 1 }\n").await;
    let pg = ns.api::<noops_api::PostgreSQL>().get("shop").await.unwrap();
    assert_eq!(pg.status.unwrap().placement, None, "one instance a node");
    let victim = pod_node(&ns.pods().get("shop-0").await.unwrap());

    // The primary's machine dies: nothing on it says goodbye. Its lease runs out and a replica
    // takes over, long before the node controller would evict anything.
    node_fault(&["stop", &victim]);
    let stopped = std::time::Instant::now();
    let failover = wait_failed_over(&ns, "shop", "shop-0").await;
    let replaced = stopped.elapsed();
    eprintln!("node {victim} stopped: {failover:?}, promoted {replaced:?} after the stop");
    let node = ns.client.clone();
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(node);
    let still_ready = nodes
        .get(&victim)
        .await
        .unwrap()
        .status
        .unwrap()
        .conditions
        .unwrap_or_default();
    eprintln!(
        "the node as the node controller saw it at the promotion: {:?}",
        still_ready
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| (&c.status, &c.reason))
    );

    // The machine back: the old primary rejoins as a replica, rewound.
    node_fault(&["start", &victim]);
    wait_node_status(&ns.client, &victim, true, MINUTE).await;
    wait_rejoined(&ns, "shop-0").await;
    wait_reason(&ns, "shop", "ReplicasReady", "True", "Streaming").await;

    // The new primary's node drained (its database's pods only, so that nothing else moves):
    // the primary's budget holds the eviction, the primary switches over to a replica on
    // another node, and the drain, asking again, evicts it as a replica.
    let primary = failover.to.clone();
    let drained = pod_node(&ns.pods().get(&primary).await.unwrap());
    // Commits flow again (the failover's tail is not the drain's).
    wait_until("commits acknowledged at once", MINUTE, || async {
        commits_within(
            &rw,
            "app",
            &password,
            "shop",
            "CREATE TABLE IF NOT EXISTS probe (x int); INSERT INTO probe VALUES (1)",
            Duration::from_millis(500),
        )
        .await
    })
    .await;
    let drain_started = std::time::Instant::now();
    // Off the runtime's thread: the ledger shares it, and kubectl blocks for the whole drain.
    let node = drained.clone();
    tokio::task::spawn_blocking(move || {
        kubectl_ok(
            &[
                "drain",
                &node,
                "--pod-selector=noops.dev/postgres=shop",
                "--delete-emptydir-data",
                "--timeout=180s",
            ],
            None,
        )
    })
    .await
    .unwrap();
    let drain_ended = std::time::Instant::now();
    let switched = last_failover(&ns, "shop").await;
    eprintln!(
        "node {drained} drained in {:?}: {switched:?}",
        drain_ended - drain_started
    );
    assert!(
        switched.switchover
            && switched.from.as_deref() == Some(primary.as_str())
            && switched.reason.contains("drained"),
        "{switched:?}"
    );
    kubectl_ok(&["uncordon", &drained], None);
    wait_rejoined(&ns, &primary).await;
    wait_reason(&ns, "shop", "ReplicasReady", "True", "Streaming").await;
    let report = ledger.stop().await;
    let missing = report.lost_in_shop(&rw, &password, "synchronous");
    assert!(missing.is_empty(), "acknowledged and lost: {missing:?}");
    assert!(
        report.longest_gap < Duration::from_secs(30),
        "writes waited {:?}",
        report.longest_gap
    );
    let drain_gap = report.longest_gap_between(drain_started, drain_ended);
    eprintln!("the drain: writes waited at most {drain_gap:?}");
    // A switchover's gap: 1.2–2.1 s seen; a failover would cost a lease (6 s) and more.
    assert!(
        drain_gap <= Duration::from_secs(4),
        "the drain: writes waited {drain_gap:?}"
    );
}

#[tokio::test]
#[ignore = "node faults disturb other tests: `make e2e` runs them alone"]
async fn a_postgresql_primary_cut_off_by_a_partition_takes_no_commit_past_its_fence_and_rejoins_when_healed() {
    use noops_e2e::postgres::*;
    // The instance manager's fence: a primary that has not renewed its lease for this long
    // stops its server (2 s before the lease, 6 s, runs out and a replica may be promoted).
    const FENCE_AFTER: Duration = Duration::from_secs(4);

    let _restore = RestoreNodesOnDrop;
    install_crds();
    let ns = TestNamespace::new("pg-ha-cut").await;
    ready_nodes(&ns.client, 3).await;
    let _operator = Operator::start(&ns.name, &["--controllers", "postgres"]);
    // Asynchronous: the isolated primary could go on acknowledging commits on its own, so
    // only its fence stops it (synchronous, its commits would wait for replicas it cannot reach).
    let (password, rw, ledger) = three_instances_under_a_ledger(&ns, "").await;
    let primary = ns.pods().get("shop-0").await.unwrap();
    let cut = pod_node(&primary);
    let primary_ip = pod_ip(&primary).unwrap();
    psql(
        &rw,
        "app",
        &password,
        "shop",
        "CREATE TABLE inside (id bigint PRIMARY KEY)",
    )
    .unwrap();

    // A client on the primary's side of the partition: a pod on its node committing straight
    // to the primary's address, printing each acknowledged id with the time (this machine's
    // clock). It tolerates the node being unreachable, so it stays to be read after the heal.
    let script = format!(
        "i=0; while true; do i=$((i+1)); psql -h {primary_ip} -U app -d shop -qAtc \"INSERT INTO inside VALUES ($i)\" >/dev/null 2>&1 && echo \"ack $i $(date +%s.%N)\"; sleep 0.05; done"
    );
    ns.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{ name: inside }}\nspec:\n  nodeName: {cut}\n  restartPolicy: Never\n  tolerations: [{{ operator: Exists }}]\n  containers:\n  - name: client\n    image: postgres:15\n    env:\n    - {{ name: PGPASSWORD, valueFrom: {{ secretKeyRef: {{ name: shop-db, key: postgresql_password }} }} }}\n    - {{ name: PGCONNECT_TIMEOUT, value: \"2\" }}\n    command: [\"bash\", \"-c\", {script:?}]\n"
    ));
    let inside_acks = || async {
        let log = ns
            .pods()
            .logs("inside", &LogParams::default())
            .await
            .unwrap_or_default();
        log.lines()
            .filter_map(|l| {
                let mut words = l.strip_prefix("ack ")?.split(' ');
                let id: i64 = words.next()?.parse().ok()?;
                let at: f64 = words.next()?.parse().ok()?;
                Some((id, std::time::UNIX_EPOCH + Duration::from_secs_f64(at)))
            })
            .collect::<Vec<_>>()
    };
    wait_until("the client beside the primary committing", MINUTE, || async {
        inside_acks().await.len() > 10
    })
    .await;

    // The cut: the primary's node reaches nothing outside its own pods, the API server
    // included, so the primary cannot renew its lease.
    node_fault(&["partition", &cut]);
    let (cut_at, cut_instant) = (std::time::SystemTime::now(), std::time::Instant::now());
    let failover = wait_failed_over(&ns, "shop", "shop-0").await;
    eprintln!(
        "node {cut} cut off: {failover:?}, promoted {:?} after the cut",
        cut_instant.elapsed()
    );
    // Past the lease and the failover, with the partition still on: the isolated primary
    // stays down, as it cannot read the lease.
    tokio::time::sleep(Duration::from_secs(10)).await;
    node_fault(&["heal", &cut]);
    wait_rejoined(&ns, "shop-0").await;
    wait_reason(&ns, "shop", "ReplicasReady", "True", "Streaming").await;
    let report = ledger.stop().await;

    // The isolated primary took no commit past its fence deadline (counted from its last
    // renewal, at the latest the cut), and its last one came before the new primary's first.
    let acks = inside_acks().await;
    let (last_id, last_at) = *acks.last().unwrap();
    let after_cut = last_at.duration_since(cut_at).unwrap_or_default();
    eprintln!(
        "the client beside the isolated primary: {} commits acknowledged, the last ({last_id}) {after_cut:?} after the cut",
        acks.len()
    );
    assert!(
        after_cut <= FENCE_AFTER + Duration::from_secs(1),
        "the isolated primary acknowledged commit {last_id} {after_cut:?} after the cut, past its fence deadline"
    );
    // The ledger's first commit after the cut, which the new primary acknowledged (the old
    // one is unreachable from this machine).
    let first_on_new = report
        .acked_at
        .iter()
        .find(|at| **at > cut_instant + Duration::from_millis(500))
        .copied()
        .unwrap();
    assert!(
        cut_instant + after_cut < first_on_new,
        "the isolated primary acknowledged a commit {after_cut:?} after the cut, once the new primary took writes ({:?} after it)",
        first_on_new - cut_instant
    );
    // What the isolated primary acknowledged after the cut never reached a replica: the
    // rejoin rewound it away. Nothing else is missing.
    let present: BTreeSet<i64> = psql(&rw, "app", &password, "shop", "SELECT id FROM inside")
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let kept_after_cut = acks
        .iter()
        .filter(|(id, at)| *at > cut_at && present.contains(id))
        .count();
    let acked_after_cut = acks.iter().filter(|(_, at)| *at > cut_at).count();
    eprintln!("of its {acked_after_cut} commits acknowledged after the cut, {kept_after_cut} are on the new primary");
    // Asynchronous: the ledger may lose only commits the old primary acknowledged just before
    // the cut (its replicas' lag, milliseconds here).
    let missing = report.lost_in_shop(&rw, &password, "asynchronous");
    for id in &missing {
        let at = report.acked_at[report.acked.iter().position(|a| a == id).unwrap()];
        assert!(
            at + Duration::from_secs(1) > cut_instant,
            "commit {id}, acknowledged long before the cut, is lost"
        );
    }
}

/// The faults of a PostgreSQL primary that the HA chaos test injects.
#[derive(Debug, Clone, Copy)]
enum PrimaryFault {
    /// Its pod force-deleted: a failover, or its replacement recovers in place.
    PodKilled,
    /// Its node stopped, started again once a replica took over.
    NodeStopped,
    /// Its node cut off, healed once a replica took over.
    Partitioned,
    /// The operator SIGKILLed and started again (no failover).
    OperatorKilled,
    /// Every process of its server stopped (SIGSTOP), its instance manager running on;
    /// resumed once a replica took over.
    ServerHung,
}

impl PrimaryFault {
    /// How long writes may wait in a round of this fault before it counts as a stall, not a
    /// slow failover (those are measured by `make bench`): a pod kill costs ~2 s, a failover
    /// ~6-8 s; the bounds leave room for a loaded machine.
    fn stall_after(self) -> Duration {
        match self {
            PrimaryFault::PodKilled | PrimaryFault::OperatorKilled => Duration::from_secs(20),
            PrimaryFault::NodeStopped | PrimaryFault::Partitioned | PrimaryFault::ServerHung => Duration::from_secs(40),
        }
    }
}

/// How long a killed operator's leader lease outlives it (`leader.rs`): its successor leads
/// only after that.
const OPERATOR_LEASE: Duration = Duration::from_secs(15);

const PRIMARY_FAULTS: [PrimaryFault; 5] = [
    PrimaryFault::PodKilled,
    PrimaryFault::NodeStopped,
    PrimaryFault::Partitioned,
    PrimaryFault::OperatorKilled,
    PrimaryFault::ServerHung,
];

#[tokio::test]
#[ignore = "node faults disturb other tests: `make e2e` runs them alone"]
async fn repeated_primary_faults_lose_no_acknowledged_commit_and_leave_one_primary() {
    use noops_api::PostgreSQL;
    use noops_e2e::postgres::*;
    // NOOPS_CHAOS_PG_HA_KINDS=Partitioned,ServerHung draws only those (to chase one).
    let kinds: Vec<PrimaryFault> = match std::env::var("NOOPS_CHAOS_PG_HA_KINDS") {
        Ok(names) => PRIMARY_FAULTS
            .into_iter()
            .filter(|f| names.split(',').any(|n| n.trim() == format!("{f:?}")))
            .collect(),
        Err(_) => PRIMARY_FAULTS.to_vec(),
    };
    assert!(
        !kinds.is_empty(),
        "NOOPS_CHAOS_PG_HA_KINDS names none of {PRIMARY_FAULTS:?}"
    );
    let rounds = chaos::rounds("NOOPS_CHAOS_PG_HA_FAULTS", kinds.len());
    let mut dice = chaos::Dice::from_env();
    let _restore = RestoreNodesOnDrop;
    install_crds();
    let ns = TestNamespace::new("pg-ha-chaos").await;
    ready_nodes(&ns.client, 3).await;
    let controllers = ["--controllers", "postgres"];
    let mut operator = Operator::start(&ns.name, &controllers);
    let (password, rw, ledger) = three_instances_under_a_ledger(&ns, "  synchronous: { number: 1 }\n").await;
    let superuser = superuser_password(&ns, "shop").await;
    // Every change of the lease, from a watch: no handover between rounds goes unseen.
    let lease = LeaseWatch::start(&ns, "shop-primary").await;
    let status = || async {
        let pg = ns.api::<PostgreSQL>().get("shop").await.unwrap();
        pg.status.unwrap_or_default()
    };
    let mut injected: BTreeMap<String, usize> = BTreeMap::new();
    let mut failovers = 0;
    // Each round's fault, when it began and ended, and what it may cost beyond its own bound:
    // how long writes waited in each.
    let mut windows: Vec<(PrimaryFault, std::time::Instant, std::time::Instant, Duration)> = vec![];
    // When the operator was last killed: until its successor holds the leader lease (the
    // killed one's runs out first), nothing fails a primary over, so a fault then waits for
    // that too (a double fault).
    let mut operator_killed: Option<std::time::Instant> = None;
    for round in 0..rounds {
        // One of each kind first; the rest are drawn.
        let fault = kinds[if round < kinds.len() {
            round
        } else {
            dice.roll(kinds.len() as u64) as usize
        }];
        let began = std::time::Instant::now();
        let leaderless = operator_killed.map_or(Duration::ZERO, |killed| OPERATOR_LEASE.saturating_sub(began - killed));
        let before = status().await;
        let primary = before.current_primary.clone().unwrap();
        let primary_pod = ns.pods().get(&primary).await.unwrap();
        let node = pod_node(&primary_pod);
        let taken_over = || async {
            wait_for(&format!("a replica taking over from {primary}"), 2 * MINUTE, || async {
                let now = status().await.last_failover?;
                (Some(&now) != before.last_failover.as_ref()
                    && now.from.as_deref() == Some(primary.as_str())
                    && now.promoted_at.is_some())
                .then_some(now)
            })
            .await
        };
        match fault {
            PrimaryFault::PodKilled => {
                kubectl_ok(
                    &["delete", "pod", "-n", &ns.name, &primary, "--grace-period=0", "--force"],
                    None,
                );
                // A failover, or the new pod of the same name still holding the lease.
                let (old_uid, pods) = (primary_pod.metadata.uid.clone(), ns.pods());
                wait_until("serving again after the force-delete", 2 * MINUTE, || async {
                    let now = status().await;
                    let failed_over = now.last_failover != before.last_failover;
                    let Some(current) = now.current_primary else {
                        return false;
                    };
                    let pod = pods.get(&current).await.ok();
                    pod.is_some_and(|p| pod_ready(&p) && (failed_over || p.metadata.uid != old_uid))
                })
                .await;
                if status().await.last_failover != before.last_failover {
                    failovers += 1;
                }
            }
            PrimaryFault::NodeStopped => {
                node_fault(&["stop", &node]);
                taken_over().await;
                failovers += 1;
                node_fault(&["start", &node]);
                wait_node_status(&ns.client, &node, true, MINUTE).await;
            }
            PrimaryFault::Partitioned => {
                node_fault(&["partition", &node]);
                taken_over().await;
                failovers += 1;
                node_fault(&["heal", &node]);
                wait_node_status(&ns.client, &node, true, MINUTE).await;
            }
            PrimaryFault::OperatorKilled => {
                operator.kill();
                operator_killed = Some(std::time::Instant::now());
                operator = Operator::start(&ns.name, &controllers);
            }
            PrimaryFault::ServerHung => {
                let hung = StoppedServer::of(&ns, &primary);
                taken_over().await;
                failovers += 1;
                wait_until("every process of the hung server killed", MINUTE, || async {
                    hung.gone()
                })
                .await;
                hung.resume();
            }
        }
        *injected.entry(format!("{fault:?}")).or_default() += 1;
        windows.push((fault, began, std::time::Instant::now(), leaderless));
        // Whole again: every replica streams, and exactly one instance takes writes.
        wait_reason(&ns, "shop", "ReplicasReady", "True", "Streaming").await;
        // A long run tells how far it got: a failure in round 300 is then not a mystery.
        println!(
            "chaos: round {round} ({fault:?} of {primary}) whole again after {:.1} s (at {})",
            began.elapsed().as_secs_f64(),
            jiff::Timestamp::now()
        );
        let mut primaries = vec![];
        for pod in ["shop-0", "shop-1", "shop-2"] {
            let ip = pod_ip(&ns.pods().get(pod).await.unwrap()).unwrap();
            if psql(&ip, "postgres", &superuser, "postgres", "SELECT pg_is_in_recovery()").unwrap() == "f" {
                primaries.push(pod);
            }
        }
        let current = status().await.current_primary;
        assert_eq!(
            primaries.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
            Vec::from_iter(current),
            "round {round} ({fault:?}): the instances that take writes against the status's primary"
        );
    }
    // One primary at a time: a lease taken from a holder that did not give it up passed on
    // only after that holder had gone past its fence deadline (4 s) without renewing.
    let handovers = lease.direct_handovers();
    let early: Vec<_> = handovers
        .iter()
        .filter(|(_, _, quiet)| *quiet < Duration::from_secs(4))
        .collect();
    assert!(
        early.is_empty(),
        "handed over before the old primary's fence: {early:?}"
    );
    let report = ledger.stop().await;
    let missing = report.lost_in_shop(&rw, &password, "synchronous");
    // The longest waits, and in which rounds: a slow recovery is named, not just counted.
    let mut waits: Vec<(Duration, usize, PrimaryFault, Duration)> = windows
        .iter()
        .enumerate()
        .map(|(round, (fault, from, to, leaderless))| {
            (report.longest_wait_since(*from, *to), round, *fault, *leaderless)
        })
        .collect();
    waits.sort_by_key(|w| std::cmp::Reverse(w.0));
    for (waited, round, fault, _) in waits.iter().take(3) {
        println!("chaos: round {round} ({fault:?}): writes waited {waited:?}");
    }
    println!(
        "chaos: injected {rounds} primary faults {injected:?}, {failovers} failovers; acknowledged commits lost: {}; writes waited at most {:?}",
        missing.len(),
        report.longest_gap
    );
    assert!(missing.is_empty(), "acknowledged and lost: {missing:?}");
    let stalls: Vec<_> = waits
        .iter()
        .filter(|(waited, _, fault, leaderless)| *waited > fault.stall_after() + *leaderless)
        .collect();
    assert!(stalls.is_empty(), "writes stalled (waited, round, fault): {stalls:?}");
}

#[tokio::test]
#[ignore = "node faults disturb other tests: `make e2e` runs them alone"]
async fn a_base_backup_whose_node_dies_fails_says_why_and_the_next_one_is_stored() {
    use noops_api::PostgresBackup;
    use noops_e2e::postgres::*;

    let _restore = RestoreNodesOnDrop;
    install_crds();
    let ns = TestNamespace::new("pg-backup-node").await;
    // The node that dies runs only the backup pod: neither the store nor the instance.
    let (victim, others) = store_and_victim(&ns).await;
    kubectl_ok(&["cordon", &victim], None);
    let _operator = Operator::start(&ns.name, &["--controllers", "postgres,postgresbackup"]);
    ns.apply(&manifest("shop", "pw", &backup_to_bucket(&ns, "pg-backups", "")));
    wait_ready(&ns, "shop", 3 * MINUTE).await;
    wait_condition(&ns, "shop", "BackupSucceeded", "True", 2 * MINUTE).await;
    let ip = instance_ip(&ns, "shop").await;
    // About 250 MB, so that a base backup takes seconds.
    psql(
        &ip,
        "app",
        "pw",
        "shop",
        "CREATE TABLE big AS SELECT g AS id, repeat(md5(g::text), 7) AS filler FROM generate_series(1, 1000000) g",
    )
    .unwrap();

    // Only the victim takes new pods while the backup starts; it dies once the pod runs.
    for node in &others {
        kubectl_ok(&["cordon", node], None);
    }
    kubectl_ok(&["uncordon", &victim], None);
    let backup = |name: &str| {
        format!(
            "apiVersion: noops.dev/v1alpha1\nkind: PostgresBackup\nmetadata: {{ name: {name} }}\nspec: {{ postgresql: shop }}\n"
        )
    };
    ns.apply(&backup("during-the-fault"));
    let pods = ns.pods();
    let running = wait_for("the base backup pod running", 2 * MINUTE, || async {
        let pod = pods.get_opt("during-the-fault-base").await.ok()??;
        let statuses = pod.status.as_ref()?.container_statuses.clone()?;
        statuses
            .iter()
            .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
            .then_some(pod)
    })
    .await;
    assert_eq!(pod_node(&running), victim);
    node_fault(&["stop", &victim]);
    for node in &others {
        kubectl_ok(&["uncordon", node], None);
    }

    // The backup fails, and says where and why; the database serves throughout.
    let backups = ns.api::<PostgresBackup>();
    let failed = wait_for("the backup failed", 3 * MINUTE, || async {
        let b = backups.get_opt("during-the-fault").await.ok()??;
        (phase(&b) == "Failed").then_some(b)
    })
    .await;
    let said = failed
        .status
        .unwrap()
        .progress
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Succeeded")
        .unwrap();
    assert!(
        said.message.contains("deleted before it ended") && said.message.contains(&victim),
        "{}",
        said.message
    );
    assert_eq!(
        psql(&ip, "app", "pw", "shop", "SELECT count(*) FROM big").unwrap(),
        "1000000"
    );
    // The next backup is stored, on a node that lives.
    ns.apply(&backup("after-the-fault"));
    wait_until("the next backup stored", 3 * MINUTE, || async {
        backups
            .get_opt("after-the-fault")
            .await
            .ok()
            .flatten()
            .is_some_and(|b| phase(&b) == "Succeeded")
    })
    .await;
    // The failed one can be deleted: its pod on the dead node does not hold it.
    backups.delete("during-the-fault", &Default::default()).await.unwrap();
    wait_until("the failed backup deleted", 3 * MINUTE, || async {
        backups.get_opt("during-the-fault").await.ok().flatten().is_none()
    })
    .await;
    assert!(
        pods.get_opt("during-the-fault-base").await.unwrap().is_none(),
        "its pod is gone"
    );
    node_fault(&["start", &victim]);
    wait_node_status(&ns.client, &victim, true, MINUTE).await;
}

#[tokio::test]
#[ignore = "node faults disturb other tests: `make e2e` runs them alone"]
async fn a_control_plane_keeps_answering_when_the_node_of_an_api_server_stops() {
    let _restore = RestoreNodesOnDrop;
    install_crds();
    let ns = TestNamespace::new("node-kcp").await;
    ready_nodes(&ns.client, 3).await;
    let _operator = Operator::start(&ns.name, &["--controllers", "kubernetescontrolplane,etcd"]);
    ns.apply(
        "apiVersion: noops.dev/v1alpha1\nkind: KubernetesControlPlane\nmetadata: { name: tenant }\nspec: { version: \"1.34\", replicas: 3, etcd: { replicas: 3 } }\n",
    );
    let api = ns.api::<noops_api::KubernetesControlPlane>();
    let secret = wait_for("the control plane Ready", 5 * MINUTE, || async {
        let status = api.get("tenant").await.ok()?.status?;
        let ready = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(status.admin_kubeconfig_secret?)
    })
    .await;
    let secret = ns
        .api::<k8s_openapi::api::core::v1::Secret>()
        .get(&secret)
        .await
        .unwrap();
    let text = String::from_utf8(secret.data.unwrap().remove("kubeconfig").unwrap().0).unwrap();
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&text).unwrap();
    let pods = ns.pods();
    let api_servers =
        ListParams::default().labels("noops.dev/kubernetescontrolplane=tenant,app.kubernetes.io/component=apiserver");
    let before = pods.list(&api_servers).await.unwrap().items;
    let victim = pod_node(&before[0]);

    node_fault(&["stop", &victim]);
    let stopped = std::time::Instant::now();
    // For 40 s, a request every 250 ms with a new client (as kubectl runs would), each given
    // 2 s: when the first was answered, and when the last went unanswered (one that reached the
    // dead API server, until the Service drops it).
    let mut asked = Vec::new();
    while stopped.elapsed() < Duration::from_secs(40) {
        let kubeconfig = kubeconfig.clone();
        let at = stopped.elapsed();
        asked.push(tokio::spawn(async move {
            let answered = async {
                let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                    .await
                    .ok()?;
                let client = kube::Client::try_from(config).ok()?;
                client.apiserver_version().await.ok()
            };
            (
                at,
                tokio::time::timeout(Duration::from_secs(2), answered)
                    .await
                    .ok()
                    .flatten()
                    .is_some(),
            )
        }));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut results = Vec::new();
    for request in asked {
        results.push(request.await.unwrap());
    }
    let first_answer = results.iter().find(|(_, ok)| *ok).map(|(at, _)| *at).unwrap();
    let unanswered: Vec<Duration> = results.iter().filter(|(_, ok)| !*ok).map(|(at, _)| *at).collect();
    eprintln!(
        "after the node stopped: first answer at {first_answer:?}, {} of {} unanswered, at {unanswered:?}",
        unanswered.len(),
        results.len()
    );
    assert!(
        first_answer < Duration::from_secs(3),
        "the API took {first_answer:?} to answer"
    );
    // Past 30 s the Service has dropped the dead API server: while it still routes there, about
    // one request in three goes unanswered (13 of the last 40). One slow answer is not that (seen
    // once, at 37 s, while the etcd member of the stopped node was being replaced).
    let late: Vec<&Duration> = unanswered.iter().filter(|t| **t >= Duration::from_secs(30)).collect();
    assert!(
        late.len() <= 1,
        "requests still went unanswered after the node stopped, at {late:?}"
    );
    // The API server of the dead node is replaced on another one.
    wait_until("a third API server Ready on a live node", 3 * MINUTE, || async {
        let now = pods.list(&api_servers).await.unwrap().items;
        now.iter().filter(|p| pod_ready(p) && pod_node(p) != victim).count() == 3
    })
    .await;
    node_fault(&["start", &victim]);
    wait_node_status(&ns.client, &victim, true, 2 * MINUTE).await;
}

#[tokio::test]
#[ignore = "node faults disturb other tests: `make e2e` runs them alone"]
async fn a_lost_nodes_machine_is_replaced_unless_too_many_machines_are_unhealthy() {
    use noops_api::{Machine, MachineDeployment, MachineSet};
    use noops_e2e::tenant::{ForgetMachines, Tenant, machine_on, wait_machines_gone};
    install_crds();
    let ns = TestNamespace::new("machine-loss").await;
    let _forget = ForgetMachines(ns.name.clone());
    let client = client().await;
    let victim = ready_nodes(&client, 3).await.last().unwrap().clone();
    // The control plane away from the node that will be stopped: only a machine is lost.
    kubectl_ok(&["cordon", &victim], None);
    let operator = Operator::start(&ns.name, &[]);
    ns.apply("apiVersion: noops.dev/v1alpha1\nkind: KubernetesControlPlane\nmetadata: { name: c }\nspec:\n  version: \"1.34\"\n  replicas: 1\n  etcd: { replicas: 1 }\n  extraArgs: { controllerManager: [\"--node-monitor-grace-period=10s\"] }\n");
    let tenant = Tenant::ready(&ns, "c", 4 * MINUTE).await;
    kubectl_ok(&["uncordon", &victim], None);
    let pool = |max_unhealthy: u32| {
        format!(
            "apiVersion: noops.dev/v1alpha1\nkind: MachineDeployment\nmetadata: {{ name: pool }}\nspec:\n  clusterName: c\n  replicas: 3\n  selector: {{ matchLabels: {{ pool: p }} }}\n  template:\n    metadata: {{ labels: {{ pool: p }} }}\n    spec: {{ version: \"1.34\", nodeDrainTimeoutSeconds: 20 }}\n  healthCheck: {{ unhealthyTimeoutSeconds: 15, maxUnhealthy: {max_unhealthy} }}\n"
        )
    };
    ns.apply(&pool(0));
    let machines = ns.api::<Machine>();
    let md = ns.api::<MachineDeployment>();
    wait_until("3 machines Running", 4 * MINUTE, || async {
        md.get("pool")
            .await
            .ok()
            .and_then(|m| m.status)
            .and_then(|s| s.ready_replicas)
            == Some(3)
    })
    .await;
    let deletions = noops_e2e::deletions::DeletionWatch::start(&ns, "pool", "pool=p");
    // One machine per node (they spread); the victim's is the one to lose.
    let lost = machine_on(&ns, &victim)
        .await
        .unwrap_or_else(|| panic!("no machine on {victim}: machines spread over the nodes"));
    let echo = root().join("target/debug/http-echo");
    tenant.apply(&format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{ name: web, namespace: default }}\nspec:\n  replicas: 3\n  selector: {{ matchLabels: {{ app: web }} }}\n  template:\n    metadata: {{ labels: {{ app: web }} }}\n    spec:\n      tolerations: [{{ key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 5 }}, {{ key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 5 }}]\n      containers: [{{ name: web, image: busybox, command: [\"{}\", \"-listen=:8080\", \"-text=hello\"] }}]\n",
        echo.display()
    ));
    tenant.kubectl_ok(&["rollout", "status", "deployment/web", "--timeout=120s"], None);

    node_fault(&["stop", &victim]);
    // maxUnhealthy 0: the lost machine is unhealthy, and nothing is deleted; the set says why.
    let sets = ns.api::<MachineSet>();
    let held = wait_for("repair held by maxUnhealthy", 3 * MINUTE, || async {
        let set = sets.list(&ListParams::default()).await.ok()?.items.into_iter().next()?;
        let c = set
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "RemediationAllowed")?;
        (c.status == "False" && c.reason == "TooManyUnhealthy").then_some(c.message)
    })
    .await;
    assert!(held.contains("1 of 3 machines are unhealthy"), "{held}");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let kept = machines.get(&lost).await.unwrap();
    assert!(
        kept.metadata.deletion_timestamp.is_none(),
        "a held repair deleted {lost}"
    );
    assert_eq!(machines.list(&ListParams::default()).await.unwrap().items.len(), 3);

    // One unhealthy machine allowed: it is replaced, on the nodes left, and its pods run there.
    let allowed = std::time::Instant::now();
    ns.apply(&pool(1));
    wait_until("the lost machine replaced", 3 * MINUTE, || async {
        let listed = machines.list(&ListParams::default()).await.unwrap().items;
        let ready = listed
            .iter()
            .filter(|m| m.metadata.name.as_deref() != Some(lost.as_str()))
            .filter(|m| {
                m.status
                    .as_ref()
                    .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        ready == 3
    })
    .await;
    let replaced_in = allowed.elapsed();
    wait_until("the lost machine gone", 3 * MINUTE, || async {
        machines.get_opt(&lost).await.unwrap().is_none()
    })
    .await;
    tenant.kubectl_ok(&["rollout", "status", "deployment/web", "--timeout=120s"], None);
    let pods: kube::Api<Pod> = kube::Api::namespaced(tenant.client.clone(), "default");
    let web = pods.list(&ListParams::default().labels("app=web")).await.unwrap().items;
    assert!(
        web.iter().all(|p| pod_node(p) != lost),
        "pods still on the lost machine"
    );
    wait_event(
        &ns,
        "MachineSet",
        &sets.list(&ListParams::default()).await.unwrap().items[0]
            .metadata
            .name
            .clone()
            .unwrap(),
        "MachineRemediated",
    )
    .await;
    eprintln!("lost machine replaced {replaced_in:?} after repair was allowed");
    // Its Node could not be reached: its pods were deleted without eviction, and it said so.
    wait_event(&ns, "Machine", &lost, "DrainForced").await;
    // The repair deleted the lost machine alone, once it was no longer Ready: no Ready one.
    let seen = deletions.stop_expecting_within_bounds(0).await;
    assert_eq!(
        seen.judged
            .iter()
            .map(|(n, ready, _)| (n.as_str(), *ready))
            .collect::<Vec<_>>(),
        vec![(lost.as_str(), false)]
    );

    node_fault(&["start", &victim]);
    md.delete("pool", &Default::default()).await.unwrap();
    wait_machines_gone(&ns, 3 * MINUTE).await;
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

/// A whole cluster (3 API servers, 3 etcd members, 3 machines) under management nodes stopped
/// and started again at random, one at a time, while a client polls its app through a load
/// balancer: after each round the cluster is Ready again with its 3 Nodes and every tenant
/// object made before is there. `make test` makes one round, `make chaos` many
/// (`NOOPS_CHAOS_CLUSTER_FAULTS`); it prints the faults injected, the requests that failed (a
/// machine lost takes its pods' answers with it until they move), and the machines replaced.
#[tokio::test]
#[ignore = "node faults disturb other tests: `make e2e` runs them alone"]
async fn a_cluster_keeps_every_tenant_object_and_its_nodes_through_management_node_faults() {
    use noops_api::{KubernetesCluster, Machine};
    use noops_e2e::tenant::{ForgetMachines, Tenant, wait_machines_gone};
    use noops_e2e::traffic::{Poller, load_balancer};
    let rounds = chaos::rounds("NOOPS_CHAOS_CLUSTER_FAULTS", 1);
    let mut dice = chaos::Dice::from_env();
    let _restore = RestoreNodesOnDrop;
    install_crds();
    let ns = TestNamespace::new("kc-faults").await;
    let _forget = ForgetMachines(ns.name.clone());
    let nodes = ready_nodes(&ns.client, 3).await;
    let operator = Operator::start(&ns.name, &[]);
    ns.apply(
        "apiVersion: noops.dev/v1alpha1\nkind: KubernetesCluster\nmetadata: { name: sturdy }\nspec:\n  version: \"1.34\"\n  controlPlane:\n    replicas: 3\n    etcd: { replicas: 3 }\n    extraArgs: { controllerManager: [\"--node-monitor-grace-period=10s\"] }\n  workers:\n    - { name: pool, replicas: 3, healthCheck: { unhealthyTimeoutSeconds: 15, maxUnhealthy: 1 } }\n  upgrade: { drainTimeoutSeconds: 20 }\n",
    );
    let clusters = ns.api::<KubernetesCluster>();
    let whole = || async {
        clusters
            .get("sturdy")
            .await
            .ok()
            .and_then(|kc| kc.status)
            .is_some_and(|s| {
                s.nodes.as_deref() == Some("3/3")
                    && s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
            })
    };
    wait_until("the cluster Ready with 3 Nodes", 8 * MINUTE, whole).await;
    let tenant = Tenant::ready(&ns, "sturdy", MINUTE).await;
    let echo = root().join("target/debug/http-echo");
    tenant.apply(&format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{ name: web, namespace: default }}\nspec:\n  replicas: 3\n  selector: {{ matchLabels: {{ app: web }} }}\n  template:\n    metadata: {{ labels: {{ app: web }} }}\n    spec:\n      tolerations: [{{ key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 5 }}, {{ key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 5 }}]\n      containers: [{{ name: web, image: busybox, command: [\"{}\", \"-listen=:8080\", \"-text=hello\"], readinessProbe: {{ httpGet: {{ path: /health, port: 8080 }}, periodSeconds: 1 }} }}]\n---\napiVersion: v1\nkind: Service\nmetadata: {{ name: web, namespace: default }}\nspec:\n  type: NodePort\n  selector: {{ app: web }}\n  ports: [{{ port: 80, targetPort: 8080, nodePort: 30080 }}]\n",
        echo.display()
    ));
    tenant.kubectl_ok(&["rollout", "status", "deployment/web", "--timeout=120s"], None);
    let poller = Poller::start(load_balancer(&ns, "sturdy").await);
    let machines = ns.api::<Machine>();
    let machine_names = || async {
        machines
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .filter_map(|m| m.metadata.name)
                    .collect::<BTreeSet<_>>()
            })
            .unwrap_or_default()
    };
    let first_machines = machine_names().await;
    let mut made: BTreeSet<String> = BTreeSet::new();
    let mut written = Vec::new();
    for round in 0..rounds {
        // A tenant object each round, made before the fault.
        let name = format!("kept-{round}");
        let client = Tenant::ready(&ns, "sturdy", MINUTE).await;
        wait_until("the tenant taking a ConfigMap", MINUTE, || async {
            client
                .kubectl(&["create", "configmap", &name, "--from-literal=round=x"], None)
                .status
                .success()
                || client.kubectl(&["get", "configmap", &name], None).status.success()
        })
        .await;
        written.push(name);
        let victim = &nodes[dice.roll(nodes.len() as u64) as usize];
        let down = 5 + dice.roll(20);
        node_fault(&["stop", victim]);
        tokio::time::sleep(Duration::from_secs(down)).await;
        node_fault(&["start", victim]);
        wait_until("the cluster whole again", 6 * MINUTE, whole).await;
        made.extend(machine_names().await);
    }
    let (answered, failed) = poller.stop().await;
    let replaced = made.difference(&first_machines).count();
    let client = Tenant::ready(&ns, "sturdy", MINUTE).await;
    let missing: Vec<&String> = written
        .iter()
        .filter(|name| !client.kubectl(&["get", "configmap", name], None).status.success())
        .collect();
    println!(
        "chaos: injected {rounds} management node faults; requests failed {} of {}; machines replaced {replaced}; tenant objects lost {}",
        failed.len(),
        answered + failed.len(),
        missing.len()
    );
    assert!(missing.is_empty(), "tenant objects lost: {missing:?}");
    assert!(answered > 0, "the app never answered");
    // The cluster goes while an operator runs.
    clusters.delete("sturdy", &Default::default()).await.unwrap();
    wait_machines_gone(&ns, 4 * MINUTE).await;
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

/// Uncordons `nodes` when dropped, also when the test holding it fails.
struct UncordonOnDrop(Vec<String>);

impl Drop for UncordonOnDrop {
    fn drop(&mut self) {
        for node in &self.0 {
            let _ = kubectl(&["uncordon", node], None);
        }
    }
}

/// Where the pods of each component of control plane `name` run (pods being deleted left out).
async fn control_plane_placement(ns: &TestNamespace, name: &str) -> BTreeMap<String, Vec<String>> {
    let pods = ns
        .pods()
        .list(&ListParams::default().labels(&format!("noops.dev/kubernetescontrolplane={name}")))
        .await
        .unwrap()
        .items;
    let mut by_component: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let component = labels.get("app.kubernetes.io/component").cloned().unwrap_or_default();
        by_component.entry(component).or_default().push(pod_node(pod));
    }
    by_component
}

/// What a control plane's status said, each change once: (ready, Degraded status and reason,
/// Degraded message).
type Said = std::sync::Arc<std::sync::Mutex<Vec<(String, String, String)>>>;

/// Every status of control plane `name` a watch delivers (each write of it, not a sample), as
/// (ready, Degraded status and reason, Degraded message), each change once, until aborted.
fn watch_control_plane(
    api: kube::Api<noops_api::KubernetesControlPlane>,
    name: &'static str,
) -> (tokio::task::JoinHandle<()>, Said) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let seen: Said = Default::default();
    let task = tokio::spawn({
        let seen = seen.clone();
        async move {
            let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
            let mut events = std::pin::pin!(watcher(api, config).default_backoff().applied_objects());
            while let Some(Ok(kcp)) = events.next().await {
                let Some(status) = kcp.status else { continue };
                let degraded = status.conditions.iter().find(|c| c.type_ == "Degraded");
                let said = (
                    status.ready.clone().unwrap_or_default(),
                    degraded
                        .map(|c| format!("{} {}", c.status, c.reason))
                        .unwrap_or_default(),
                    degraded.map(|c| c.message.clone()).unwrap_or_default(),
                );
                let mut seen = seen.lock().unwrap();
                if seen.last() != Some(&said) {
                    seen.push(said);
                }
            }
        }
    });
    (task, seen)
}

/// Both made while two of three nodes were cordoned, on the third: a control plane's replicas
/// (3 API servers, 2 controller-managers, 2 schedulers) and a PostgreSQL's two instances. Once
/// the nodes are uncordoned, each moves apart one at a time: never fewer than two API servers
/// Ready, the database's replica (not its primary) made anew elsewhere under a ledger of
/// commits, no failover, no commit lost; while they shared a node, the status said so.
#[tokio::test]
#[ignore = "node faults disturb other tests: `make e2e` runs them alone"]
async fn replicas_made_on_one_node_move_apart_one_at_a_time_once_other_nodes_can_take_them() {
    use noops_api::{KubernetesControlPlane, PostgreSQL};
    use noops_e2e::postgres::*;
    install_crds();
    let client = client().await;
    let nodes = ready_nodes(&client, 3).await;
    let _uncordon = UncordonOnDrop(nodes[1..].to_vec());
    for node in &nodes[1..] {
        kubectl_ok(&["cordon", node], None);
    }
    let ns = TestNamespace::new("apart").await;
    let operator = Operator::start(&ns.name, &["--controllers", "kubernetescontrolplane,etcd,postgres"]);
    ns.apply(
        "apiVersion: noops.dev/v1alpha1\nkind: KubernetesControlPlane\nmetadata: { name: apart }\nspec:\n  version: \"1.34\"\n  replicas: 3\n  etcd: { replicas: 1 }\n",
    );
    let (password, rw, ledger) = instances_under_a_ledger(&ns, 2, "").await;
    let shop = ns.api::<PostgreSQL>();
    let before = shop.get("shop").await.unwrap().status.unwrap();
    assert!(
        before.placement.as_ref().is_some_and(|p| p.contains(&nodes[0])),
        "{:?}",
        before.placement
    );
    let api = ns.api::<KubernetesControlPlane>();
    let ready = |kcp: &KubernetesControlPlane| {
        kcp.status.as_ref().is_some_and(|s| {
            s.ready.as_deref() == Some("3/3") && s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
        })
    };
    wait_until("the control plane Ready on one node", 5 * MINUTE, || async {
        api.get("apart").await.is_ok_and(|k| ready(&k))
    })
    .await;
    let together = control_plane_placement(&ns, "apart").await;
    assert!(
        together.values().flatten().all(|node| *node == nodes[0]),
        "{together:?}"
    );

    let (watching, seen) = watch_control_plane(api.clone(), "apart");
    for node in &nodes[1..] {
        kubectl_ok(&["uncordon", node], None);
    }
    let apart = wait_for("every component's replicas on different nodes", 6 * MINUTE, || async {
        let placed = control_plane_placement(&ns, "apart").await;
        let distinct = |c: &str| placed.get(c).map(|n| n.iter().collect::<BTreeSet<_>>().len());
        (distinct("apiserver") == Some(3)
            && distinct("controller-manager") == Some(2)
            && distinct("scheduler") == Some(2))
        .then_some(placed)
    })
    .await;
    wait_until("the control plane Ready and not Degraded", 2 * MINUTE, || async {
        api.get("apart").await.is_ok_and(|k| {
            ready(&k)
                && k.status
                    .unwrap()
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Degraded" && c.status == "False" && c.reason == "AsExpected")
        })
    })
    .await;
    watching.abort();
    let seen = seen.lock().unwrap().clone();
    eprintln!("{apart:?}\n{seen:#?}");
    // Said while they shared a node, by name.
    assert!(
        seen.iter()
            .any(|(_, degraded, message)| degraded == "True ReplicasShareNode" && message.contains(&nodes[0])),
        "{seen:?}"
    );
    // One at a time: never fewer than two of three API servers Ready.
    assert!(
        seen.iter().all(|(ready, _, _)| ready != "0/3" && ready != "1/3"),
        "{seen:?}"
    );
    let events = event_reasons(&ns, "KubernetesControlPlane", "apart").await;
    let moves = events.iter().filter(|r| *r == "ReplicaMoved").count();
    assert!(events.contains(&"ReplicasShareNode".to_string()), "{events:?}");
    // Two API servers, one controller-manager, one scheduler.
    assert!(moves >= 4, "{moves} moves: {events:?}");

    // The database: its replica made anew on another node, its primary where it was.
    let moved = wait_for("the replica streaming from another node", 5 * MINUTE, || async {
        let status = shop.get("shop").await.ok()?.status?;
        let on: BTreeSet<&String> = status.members.iter().filter_map(|m| m.node.as_ref()).collect();
        let streaming = status
            .members
            .iter()
            .any(|m| format!("{:?}", m.role) == "Replica" && m.streaming == Some(true));
        (on.len() == 2 && streaming && status.placement.is_none()).then_some(status)
    })
    .await;
    wait_reason(&ns, "shop", "Degraded", "False", "AsExpected").await;
    let report = ledger.stop().await;
    let missing = report.lost_in_shop(&rw, &password, "asynchronous");
    assert!(missing.is_empty(), "acknowledged and lost: {missing:?}");
    assert_eq!(moved.current_primary, before.current_primary);
    assert_eq!(moved.last_failover, before.last_failover, "no failover");
    let events = event_reasons(&ns, "PostgreSQL", "shop").await;
    assert!(events.contains(&"InstancesShareNode".to_string()), "{events:?}");
    assert!(events.contains(&"InstanceMoved".to_string()), "{events:?}");
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}
