//! The local Kubernetes, end to end: the node, real workloads, Services, DNS, probes, restarts,
//! volumes, env, graceful deletion and in-cluster clients. Needs `make cluster-up`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, PersistentVolumeClaim, Pod, Service};
use kube::Api;
use kube::api::{DeleteParams, LogParams};
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);

fn container_status(pod: &Pod) -> Option<ContainerStatus> {
    pod.status.as_ref()?.container_statuses.as_ref()?.first().cloned()
}

#[tokio::test]
async fn node_is_ready_and_reports_the_real_version() {
    let client = client().await;
    // Those of this test's zone: node faults may be under way in another.
    let nodes = nodes(&client).await;
    assert!(!nodes.is_empty(), "at least one node");
    for node in &nodes {
        assert_eq!(
            node_ready_status(node).as_deref(),
            Some("True"),
            "{:?}",
            node.metadata.name
        );
        assert_eq!(
            node.status
                .as_ref()
                .unwrap()
                .node_info
                .as_ref()
                .unwrap()
                .kubelet_version,
            built_kubernetes_version()
        );
    }
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, built_kubernetes_version());
    let out = kubectl_ok(&["version", "-o", "json"], None);
    assert!(
        out.contains(&format!("\"gitVersion\": \"{}\"", built_kubernetes_version())),
        "{out}"
    );
}

const ETCD: &str = r#"
apiVersion: v1
kind: Service
metadata: { name: etcd }
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: { app: etcd }
  ports: [{ name: client, port: 2379 }, { name: peer, port: 2380 }]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: { name: etcd }
spec:
  serviceName: etcd
  replicas: 3
  podManagementPolicy: Parallel
  selector: { matchLabels: { app: etcd } }
  template:
    metadata: { labels: { app: etcd } }
    spec:
      terminationGracePeriodSeconds: 10
      containers:
        - name: etcd
          image: quay.io/coreos/etcd:v3.5.21
          env:
            - { name: POD_NAME, valueFrom: { fieldRef: { fieldPath: metadata.name } } }
            - { name: NS, valueFrom: { fieldRef: { fieldPath: metadata.namespace } } }
            - { name: PEERS, value: "etcd-0=http://etcd-0.etcd.$(NS).svc.cluster.local:2380,etcd-1=http://etcd-1.etcd.$(NS).svc.cluster.local:2380,etcd-2=http://etcd-2.etcd.$(NS).svc.cluster.local:2380" }
          args:
            - --name=$(POD_NAME)
            - --data-dir=/var/lib/etcd
            - --listen-client-urls=http://0.0.0.0:2379
            - --advertise-client-urls=http://$(POD_NAME).etcd.$(NS).svc.cluster.local:2379
            - --listen-peer-urls=http://0.0.0.0:2380
            - --initial-advertise-peer-urls=http://$(POD_NAME).etcd.$(NS).svc.cluster.local:2380
            - --initial-cluster=$(PEERS)
            - --initial-cluster-state=new
            - --initial-cluster-token=e2e
          ports: [{ name: client, containerPort: 2379 }, { name: peer, containerPort: 2380 }]
          readinessProbe: { httpGet: { path: /health, port: client }, periodSeconds: 2 }
          volumeMounts: [{ name: data, mountPath: /var/lib/etcd }]
  volumeClaimTemplates:
    - metadata: { name: data }
      spec: { accessModes: [ReadWriteOnce], resources: { requests: { storage: 1Gi } } }
"#;

fn etcdctl(endpoint: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(upstream_bin("etcd-3.5/etcdctl"))
        .arg(format!("--endpoints=http://{endpoint}:2379"))
        .arg("--dial-timeout=2s")
        .arg("--command-timeout=5s")
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn ip_of(pod: &Pod) -> String {
    pod_ip(pod).unwrap()
}

#[tokio::test]
async fn etcd_statefulset_forms_a_cluster_by_dns_and_keeps_data_across_pod_deletion() {
    let ns = TestNamespace::new("etcd").await;
    ns.apply(ETCD);
    let mut pods = vec![];
    for i in 0..3 {
        pods.push(ns.wait_pod_ready(&format!("etcd-{i}"), 3 * MINUTE).await);
    }
    let members = etcdctl(&ip_of(&pods[0]), &["member", "list"]).unwrap();
    assert_eq!(members.lines().count(), 3, "{members}");
    assert!(
        members.contains(&format!("http://etcd-2.etcd.{}.svc.cluster.local:2380", ns.name)),
        "{members}"
    );

    etcdctl(&ip_of(&pods[1]), &["put", "greeting", "hello"]).unwrap();
    let got = etcdctl(&ip_of(&pods[2]), &["get", "greeting", "--print-value-only"]).unwrap();
    assert_eq!(got.trim(), "hello");

    // Delete etcd-1: the StatefulSet brings it back on the same claim, and it rejoins as the
    // same member, which it can only do with its old data directory.
    let old_uid = pods[1].metadata.uid.clone();
    ns.pods().delete("etcd-1", &DeleteParams::default()).await.unwrap();
    let pods_api = ns.pods();
    wait_until("a new etcd-1", 2 * MINUTE, || async {
        pods_api
            .get_opt("etcd-1")
            .await
            .ok()
            .flatten()
            .is_some_and(|p| p.metadata.uid != old_uid && pod_ready(&p))
    })
    .await;
    let reborn = pods_api.get("etcd-1").await.unwrap();
    let claim = reborn.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0]
        .persistent_volume_claim
        .clone()
        .unwrap();
    assert_eq!(claim.claim_name, "data-etcd-1");
    let pvc: PersistentVolumeClaim = ns.api::<PersistentVolumeClaim>().get("data-etcd-1").await.unwrap();
    assert_eq!(pvc.status.unwrap().phase.as_deref(), Some("Bound"));
    let members_after = etcdctl(&ip_of(&reborn), &["member", "list"]).unwrap();
    assert_eq!(members_after, members, "same members, same IDs");
    let local = etcdctl(
        &ip_of(&reborn),
        &["get", "greeting", "--print-value-only", "--consistency=s"],
    )
    .unwrap();
    assert_eq!(local.trim(), "hello");
}

const ECHO: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: { name: echo }
spec:
  replicas: 2
  selector: { matchLabels: { app: echo } }
  template:
    metadata: { labels: { app: echo } }
    spec:
      containers:
        - name: echo
          image: hashicorp/http-echo:1.0
          args: ["-text=hello from $(POD_NAME)", "-listen=:8080"]
          env: [{ name: POD_NAME, valueFrom: { fieldRef: { fieldPath: metadata.name } } }]
          ports: [{ containerPort: 8080, name: http }]
          readinessProbe: { httpGet: { path: /health, port: http }, periodSeconds: 1 }
---
apiVersion: v1
kind: Service
metadata: { name: echo }
spec:
  selector: { app: echo }
  ports: [{ port: 80, targetPort: http }]
---
apiVersion: v1
kind: Service
metadata: { name: echo-nodeport }
spec:
  type: NodePort
  selector: { app: echo }
  ports: [{ port: 80, targetPort: http }]
"#;

#[tokio::test]
async fn deployment_answers_through_cluster_ip_and_node_port() {
    let ns = TestNamespace::new("svc").await;
    ns.apply(ECHO);
    let services: Api<Service> = ns.api();
    let cluster_ip = services.get("echo").await.unwrap().spec.unwrap().cluster_ip.unwrap();
    let node_port = services
        .get("echo-nodeport")
        .await
        .unwrap()
        .spec
        .unwrap()
        .ports
        .unwrap()[0]
        .node_port
        .unwrap();
    // Both replicas answer through the ClusterIP (kube-proxy balances between them).
    let mut seen = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + 2 * MINUTE;
    while seen.len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "both replicas answering through {cluster_ip}: saw {seen:?}"
        );
        if let Some(body) = http_get(&format!("{cluster_ip}:80"), "/").await {
            seen.insert(body.trim().to_string());
        } else {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    assert!(seen.iter().all(|b| b.starts_with("hello from echo-")), "{seen:?}");
    let body = wait_for("the NodePort on 127.0.0.1", MINUTE, || {
        http_get_owned(format!("127.0.0.1:{node_port}"))
    })
    .await;
    assert!(body.starts_with("hello from echo-"), "{body}");
}

async fn http_get_owned(addr: String) -> Option<String> {
    http_get(&addr, "/").await
}

#[tokio::test]
async fn readiness_probe_gates_ready_and_failing_liveness_restarts() {
    let ns = TestNamespace::new("probes").await;
    ns.apply(
        r#"
apiVersion: v1
kind: Pod
metadata: { name: slow-start }
spec:
  containers:
    - name: app
      image: busybox
      command: ["sh", "-c", "sleep 4; touch /work/ready; exec sleep 3600"]
      readinessProbe: { exec: { command: ["cat", "/work/ready"] }, periodSeconds: 1 }
      volumeMounts: [{ name: work, mountPath: /work }]
  volumes: [{ name: work, emptyDir: {} }]
---
apiVersion: v1
kind: Pod
metadata: { name: unhealthy }
spec:
  containers:
    - name: app
      image: hashicorp/http-echo
      args: ["-text=x", "-listen=:8080"]
      livenessProbe: { httpGet: { path: /, port: 8081 }, periodSeconds: 1, failureThreshold: 2 }
"#,
    );
    let pods = ns.pods();
    // Running but not Ready until the probe passes.
    let running = wait_for("slow-start running", MINUTE, || async {
        pods.get_opt("slow-start").await.ok().flatten().filter(|p| {
            container_status(p)
                .and_then(|s| s.state)
                .and_then(|s| s.running)
                .is_some()
        })
    })
    .await;
    assert!(!pod_ready(&running), "must not be Ready before its probe passes");
    ns.wait_pod_ready("slow-start", MINUTE).await;

    // A liveness probe that never passes gets the container killed and restarted.
    let restarted = wait_for("unhealthy restarted", 2 * MINUTE, || async {
        pods.get_opt("unhealthy")
            .await
            .ok()
            .flatten()
            .filter(|p| container_status(p).is_some_and(|s| s.restart_count >= 1))
    })
    .await;
    let status = container_status(&restarted).unwrap();
    let last = status
        .last_state
        .and_then(|s| s.terminated)
        .expect("last termination recorded");
    assert_eq!(last.message.as_deref(), Some("Liveness probe failed"));
}

#[tokio::test]
async fn crashing_container_restarts_with_growing_back_off() {
    let ns = TestNamespace::new("crash").await;
    ns.apply(
        r#"
apiVersion: v1
kind: Pod
metadata: { name: crasher }
spec:
  containers:
    # Runs two seconds before failing, so each restart can be seen running.
    - { name: app, image: busybox, command: ["sh", "-c", "echo starting; sleep 2; exit 3"] }
"#,
    );
    let pods = ns.pods();
    let mut gaps = vec![];
    for restarts in 1..=2 {
        let pod = wait_for(&format!("restart {restarts}"), 2 * MINUTE, || async {
            pods.get_opt("crasher").await.ok().flatten().filter(|p| {
                container_status(p).is_some_and(|s| {
                    s.restart_count == restarts && s.state.as_ref().is_some_and(|st| st.running.is_some())
                })
            })
        })
        .await;
        let status = container_status(&pod).unwrap();
        let last = status.last_state.unwrap().terminated.unwrap();
        assert_eq!(last.exit_code, 3);
        let started = status.state.unwrap().running.unwrap().started_at.unwrap().0;
        let gap = started.duration_since(last.finished_at.unwrap().0).as_secs();
        gaps.push(gap);
    }
    assert!(gaps[1] > gaps[0], "back-off grows between restarts: {gaps:?}");
    let waiting = wait_for("CrashLoopBackOff", MINUTE, || async {
        pods.get_opt("crasher")
            .await
            .ok()
            .flatten()
            .and_then(|p| container_status(&p)?.state?.waiting?.reason)
    })
    .await;
    assert_eq!(waiting, "CrashLoopBackOff");
}

#[tokio::test]
async fn secrets_configmaps_and_downward_api_reach_the_container() {
    let ns = TestNamespace::new("config").await;
    ns.apply(
        r#"
apiVersion: v1
kind: Secret
metadata: { name: creds }
stringData: { password: s3cr3t, user: admin }
---
apiVersion: v1
kind: ConfigMap
metadata: { name: settings }
data: { mode: fast, "app.conf": "threads=4" }
---
apiVersion: v1
kind: Pod
metadata: { name: reader, labels: { tier: backend } }
spec:
  restartPolicy: Never
  containers:
    - name: app
      image: busybox
      command: ["sh", "-c", "echo password=$PASSWORD mode=$MODE ip=$MY_IP pod=$MY_POD ns=$MY_NS cfg_user=$CFG_user; cat /secret/password; echo; cat /config/renamed.conf; echo; cat /info/labels; echo"]
      env:
        - { name: PASSWORD, valueFrom: { secretKeyRef: { name: creds, key: password } } }
        - { name: MODE, valueFrom: { configMapKeyRef: { name: settings, key: mode } } }
        - { name: MY_IP, valueFrom: { fieldRef: { fieldPath: status.podIP } } }
        - { name: MY_POD, valueFrom: { fieldRef: { fieldPath: metadata.name } } }
        - { name: MY_NS, valueFrom: { fieldRef: { fieldPath: metadata.namespace } } }
      envFrom: [{ secretRef: { name: creds }, prefix: CFG_ }]
      volumeMounts:
        - { name: secret, mountPath: /secret, readOnly: true }
        - { name: config, mountPath: /config }
        - { name: info, mountPath: /info }
  volumes:
    - { name: secret, secret: { secretName: creds } }
    - { name: config, configMap: { name: settings, items: [{ key: app.conf, path: renamed.conf }] } }
    - { name: info, downwardAPI: { items: [{ path: labels, fieldRef: { fieldPath: metadata.labels } }] } }
"#,
    );
    let pods = ns.pods();
    let done = wait_for("reader to finish", MINUTE, || async {
        pods.get_opt("reader")
            .await
            .ok()
            .flatten()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))
    })
    .await;
    let ip = pod_ip_or_log(&done, &pods).await;
    let logs = pods.logs("reader", &LogParams::default()).await.unwrap();
    let expected = format!(
        "password=s3cr3t mode=fast ip={ip} pod=reader ns={} cfg_user=admin\ns3cr3t\nthreads=4\ntier=\"backend\"\n",
        ns.name
    );
    assert_eq!(logs, expected);
}

/// The pod IP of a finished pod is no longer in its status; read it from the first log line.
async fn pod_ip_or_log(pod: &Pod, pods: &Api<Pod>) -> String {
    if let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) {
        return ip;
    }
    let logs = pods
        .logs(pod.metadata.name.as_deref().unwrap(), &LogParams::default())
        .await
        .unwrap();
    let ip = logs
        .split("ip=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_default()
        .to_string();
    assert!(ip.starts_with("10.244."), "pod IP from the pod network: {logs}");
    ip
}

#[tokio::test]
async fn deletion_sends_sigterm_and_waits_for_the_grace_period() {
    let ns = TestNamespace::new("grace").await;
    let out = std::env::temp_dir().join(format!("noops-e2e-{}", ns.name));
    std::fs::create_dir_all(&out).unwrap();
    ns.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{ name: stubborn }}
spec:
  terminationGracePeriodSeconds: 120
  containers:
    - name: app
      image: busybox
      command: ["sh", "-c", "trap 'echo TERM > /out/signal' TERM; echo started > /out/signal; while true; do sleep 0.2; done"]
      volumeMounts: [{{ name: out, mountPath: /out }}]
  volumes: [{{ name: out, hostPath: {{ path: {} }} }}]
"#,
        out.display()
    ));
    ns.wait_pod_ready("stubborn", MINUTE).await;
    let signal_file = out.join("signal");
    wait_until("the container to start", MINUTE, || async {
        std::fs::read_to_string(&signal_file).is_ok_and(|s| s.trim() == "started")
    })
    .await;
    ns.pods().delete("stubborn", &DeleteParams::default()).await.unwrap();
    wait_until("SIGTERM to reach the container", MINUTE, || async {
        std::fs::read_to_string(&signal_file).is_ok_and(|s| s.trim() == "TERM")
    })
    .await;
    // It ignores SIGTERM: within its grace period the pod still exists, terminating.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pod = ns.pods().get("stubborn").await.unwrap();
    assert!(pod.metadata.deletion_timestamp.is_some());
    // Forcing the deletion ends it.
    ns.pods()
        .delete(
            "stubborn",
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let pods = ns.pods();
    wait_until("the pod to be gone", MINUTE, || async {
        pods.get_opt("stubborn").await.ok().flatten().is_none()
    })
    .await;
    let _ = std::fs::remove_dir_all(&out);
}

#[tokio::test]
async fn a_pre_stop_hook_runs_before_the_container_is_signalled() {
    let ns = TestNamespace::new("prestop").await;
    let out = std::env::temp_dir().join(format!("noops-e2e-{}", ns.name));
    std::fs::create_dir_all(&out).unwrap();
    ns.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{ name: draining }}
spec:
  terminationGracePeriodSeconds: 20
  containers:
    - name: app
      image: busybox
      command: ["sh", "-c", "trap 'echo TERM >> /out/log; exit 0' TERM; echo started >> /out/log; while true; do sleep 0.2; done"]
      lifecycle: {{ preStop: {{ exec: {{ command: ["sh", "-c", "echo preStop >> /out/log; sleep 2"] }} }} }}
      volumeMounts: [{{ name: out, mountPath: /out }}]
  volumes: [{{ name: out, hostPath: {{ path: {} }} }}]
"#,
        out.display()
    ));
    ns.wait_pod_ready("draining", MINUTE).await;
    let log = out.join("log");
    wait_until("the container to start", MINUTE, || async {
        std::fs::read_to_string(&log).is_ok_and(|s| s.contains("started"))
    })
    .await;
    let deleted = std::time::Instant::now();
    ns.pods().delete("draining", &DeleteParams::default()).await.unwrap();
    wait_until("SIGTERM to reach the container", MINUTE, || async {
        std::fs::read_to_string(&log).is_ok_and(|s| s.contains("TERM"))
    })
    .await;
    let waited = deleted.elapsed();
    let lines: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(
        lines,
        vec!["started", "preStop", "TERM"],
        "the hook ran, then the signal came"
    );
    assert!(
        waited >= Duration::from_secs(2),
        "SIGTERM came after the hook's 2 s: {waited:?}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[tokio::test]
async fn in_cluster_client_lists_pods_with_its_service_account_token() {
    let ns = TestNamespace::new("incluster").await;
    ns.apply(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: { name: lister }
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: { name: pod-reader }
rules: [{ apiGroups: [""], resources: ["pods"], verbs: ["get", "list"] }]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: { name: lister-reads-pods }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-reader }
subjects: [{ kind: ServiceAccount, name: lister }]
---
apiVersion: v1
kind: Pod
metadata: { name: lister }
spec:
  serviceAccountName: lister
  restartPolicy: OnFailure
  containers:
    - name: kubectl
      image: registry.k8s.io/kubectl:v1.34.4
      command: ["kubectl", "get", "pods", "-o", "name"]
"#,
    );
    let pods = ns.pods();
    wait_until("lister to succeed", 2 * MINUTE, || async {
        pods.get_opt("lister")
            .await
            .ok()
            .flatten()
            .is_some_and(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))
    })
    .await;
    let logs = pods.logs("lister", &LogParams::default()).await.unwrap();
    assert_eq!(logs.trim(), "pod/lister");
}

#[tokio::test]
async fn only_the_api_server_can_read_logs_from_the_node_agent() {
    let ns = TestNamespace::new("logs").await;
    ns.apply("apiVersion: v1\nkind: Pod\nmetadata: { name: talker }\nspec:\n  containers: [{ name: app, image: busybox, command: [sh, -c, 'echo hello; exec sleep 3600'] }]\n");
    let talker = ns.wait_pod_ready("talker", MINUTE).await;
    let node_ip = talker.status.as_ref().unwrap().host_ip.clone().unwrap();
    let pods = ns.pods();
    wait_until("kubectl logs through the API server", MINUTE, || async {
        pods.logs("talker", &LogParams::default())
            .await
            .is_ok_and(|l| l == "hello\n")
    })
    .await;
    // The admin's certificate is valid for the API server, not for the node agent.
    let pki = root().join(".noops/cluster/pki");
    let out = Command::new("curl")
        .args(["-s", "--max-time", "5", "--cacert"])
        .arg(pki.join("serving-ca.crt"))
        .arg("--cert")
        .arg(pki.join("admin.crt"))
        .arg("--key")
        .arg(pki.join("admin.key"))
        .arg(format!("https://{node_ip}:10250/containerLogs/{}/talker/app", ns.name))
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "the node agent served logs to the admin certificate"
    );
}

#[tokio::test]
async fn pods_resolve_services_by_name_and_reach_them() {
    let ns = TestNamespace::new("dns").await;
    ns.apply(ECHO);
    ns.apply(
        r#"
apiVersion: v1
kind: Pod
metadata: { name: client }
spec:
  restartPolicy: OnFailure
  containers:
    - name: sh
      image: busybox
      command: ["sh", "-c", "getent hosts echo && curl -sf --max-time 3 http://echo/"]
"#,
    );
    let pods = ns.pods();
    wait_until("the client to reach echo by name", 2 * MINUTE, || async {
        pods.get_opt("client")
            .await
            .ok()
            .flatten()
            .is_some_and(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))
    })
    .await;
    let logs = pods.logs("client", &LogParams::default()).await.unwrap();
    let cluster_ip = ns
        .api::<Service>()
        .get("echo")
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap();
    let resolved: Vec<&str> = logs.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        resolved,
        vec![cluster_ip.clone(), format!("echo.{}.svc.cluster.local", ns.name)],
        "{logs}"
    );
    assert!(logs.contains("hello from echo-"), "{logs}");
}

#[tokio::test]
async fn unknown_image_is_reported_with_the_image_map_file() {
    let ns = TestNamespace::new("image").await;
    ns.apply(
        r#"
apiVersion: v1
kind: Pod
metadata: { name: mystery }
spec:
  containers: [{ name: app, image: "example.com/not-mapped:1.0" }]
"#,
    );
    let pods = ns.pods();
    let waiting = wait_for("ImageNotMapped", MINUTE, || async {
        pods.get_opt("mystery")
            .await
            .ok()
            .flatten()
            .and_then(|p| container_status(&p)?.state?.waiting)
            .filter(|w| w.reason.as_deref() == Some("ImageNotMapped"))
    })
    .await;
    let message = waiting.message.unwrap();
    assert!(
        message.contains("example.com/not-mapped:1.0") && message.contains("cluster/images.yaml"),
        "{message}"
    );
}

#[tokio::test]
async fn a_container_ends_with_its_main_process_and_leaves_nothing_behind() {
    let ns = TestNamespace::new("orphans").await;
    let echo = root().join("target/debug/http-echo");
    // The main process starts a server in the background and fails: the server must not
    // outlive it, or the next instance could not listen on the same port.
    ns.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{ name: parent }}
spec:
  containers:
    - name: app
      image: busybox
      command: ["sh", "-c", "{} -listen=:9000 -text=x & sleep 2; exit 1"]
"#,
        echo.display()
    ));
    let pods = ns.pods();
    wait_for("a restart that is running", 2 * MINUTE, || async {
        pods.get_opt("parent").await.ok().flatten().filter(|p| {
            container_status(p)
                .is_some_and(|s| s.restart_count >= 1 && s.state.as_ref().is_some_and(|st| st.running.is_some()))
        })
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let logs = pods.logs("parent", &LogParams::default()).await.unwrap();
    assert!(logs.contains("http-echo: serving"), "the new server started: {logs}");
    assert!(!logs.contains("listen on"), "the old server was gone: {logs}");
}

/// Processes of this machine whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<(u32, String)> {
    let mut out = vec![];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(marker) {
            out.push((pid, cmdline));
        }
    }
    out
}

/// The session id of a process (field 6 of /proc/<pid>/stat).
fn session_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(3)?.parse().ok()
}

#[tokio::test]
async fn a_process_that_starts_its_own_session_ends_with_its_pod() {
    let ns = TestNamespace::new("setsid").await;
    let marker = format!("escape-{}", ns.name);
    // A daemon that leaves the container's session (as a nested node agent's containers do).
    ns.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{ name: daemonizer }}
spec:
  terminationGracePeriodSeconds: 2
  containers:
    - name: app
      image: busybox
      command: ["sh", "-c", "setsid sh -c 'while :; do sleep 1; done # {marker}' & exec sleep 100000"]
"#
    ));
    ns.wait_pod_ready("daemonizer", MINUTE).await;
    // It leads a session of its own: signalling the container's process group misses it.
    wait_for("the daemon to run in a session of its own", MINUTE, || async {
        processes_with(&marker)
            .into_iter()
            .find(|(pid, cmd)| cmd.starts_with("sh -c") && session_of(*pid) == Some(*pid))
    })
    .await;
    ns.pods().delete("daemonizer", &DeleteParams::default()).await.unwrap();
    let pods = ns.pods();
    wait_until("the pod to be gone", MINUTE, || async {
        pods.get_opt("daemonizer").await.ok().flatten().is_none()
    })
    .await;
    // The pod object goes after its containers are stopped: nothing of it is left by then.
    let left = processes_with(&marker);
    assert!(left.is_empty(), "processes outlived their pod: {left:?}");
}

#[tokio::test]
async fn changing_a_pod_image_restarts_the_container_whatever_the_restart_policy() {
    let ns = TestNamespace::new("image-change").await;
    ns.apply(
        r#"
apiVersion: v1
kind: Pod
metadata: { name: app }
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 2
  containers: [{ name: app, image: busybox, command: ["sh", "-c", "exec sleep 3600"] }]
"#,
    );
    ns.wait_pod_ready("app", MINUTE).await;
    kubectl_ok(&["set", "image", "-n", &ns.name, "pod/app", "app=debian:12"], None);
    let pods = ns.pods();
    let pod = wait_for("the container restarted with the new image", MINUTE, || async {
        pods.get_opt("app").await.ok().flatten().filter(|p| {
            container_status(p).is_some_and(|s| {
                s.restart_count == 1
                    && s.image == "debian:12"
                    && s.state.as_ref().is_some_and(|st| st.running.is_some())
            })
        })
    })
    .await;
    assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Running"));
}

/// Writes outside any volume: a file in `/var/lib/etcd` counting its starts, a file in
/// `/usr/bin`; crashes on its first start, stays up on the next.
const LAYER_WRITER: &str = r#"
mkdir -p /var/lib/etcd
n=$(cat /var/lib/etcd/starts 2>/dev/null || echo 0)
n=$((n + 1))
echo $n > /var/lib/etcd/starts
echo $POD_NAME >> /var/lib/etcd/owners
touch /usr/bin/noops-e2e-was-here
echo "starts=$n owners=$(sort -u /var/lib/etcd/owners | tr '\n' ' ')"
if [ $n -ge 2 ]; then exec sleep 3600; fi
sleep 1
exit 1
"#;

#[tokio::test]
async fn each_container_writes_into_a_layer_of_its_own_kept_across_restarts() {
    let ns = TestNamespace::new("layers").await;
    let etcd_dir = std::path::Path::new("/var/lib/etcd");
    let host_had_etcd_dir = etcd_dir.exists();
    let node = ready_nodes(&ns.client, 1).await.remove(0);
    for name in ["writer-a", "writer-b"] {
        let pod = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": name },
            "spec": {
                "nodeSelector": { "kubernetes.io/hostname": node },
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "app",
                    "image": "busybox",
                    "command": ["sh", "-c", LAYER_WRITER],
                    "env": [{ "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } }],
                }],
            },
        });
        ns.apply(&pod.to_string());
    }
    let pods = ns.pods();
    for name in ["writer-a", "writer-b"] {
        // The restarted container finds what its first run wrote, and only that. (Its log can
        // come before the node reports the restart: both are waited for.)
        let pod = wait_for(&format!("{name} restarted with its layer"), 2 * MINUTE, || async {
            let logs = pods.logs(name, &LogParams::default()).await.ok()?;
            let pod = pods.get(name).await.ok()?;
            let restarted = container_status(&pod).is_some_and(|c| c.restart_count >= 1);
            (logs.trim() == format!("starts=2 owners={name}") && restarted).then_some(pod)
        })
        .await;
        assert_eq!(container_status(&pod).unwrap().restart_count, 1);
    }
    // Nothing reached this machine's files.
    assert!(
        !std::path::Path::new("/usr/bin/noops-e2e-was-here").exists(),
        "a container wrote into this machine's /usr/bin"
    );
    if host_had_etcd_dir {
        assert!(!etcd_dir.join("starts").exists() && !etcd_dir.join("owners").exists());
    } else {
        assert!(!etcd_dir.exists(), "a container created /var/lib/etcd on this machine");
    }
    // The layer lives with the pod, and goes with it.
    let uid = pods.get("writer-a").await.unwrap().metadata.uid.unwrap();
    let pod_dir = root()
        .join(".noops/cluster/nodes")
        .join(&node)
        .join("state/pods")
        .join(&uid);
    assert!(
        pod_dir.join("containers/app/upper/var/lib/etcd/starts").is_file(),
        "the layer is in the pod's folder"
    );
    pods.delete("writer-a", &DeleteParams::default()).await.unwrap();
    wait_until("writer-a and its layer to be gone", MINUTE, || async {
        pods.get_opt("writer-a").await.ok().flatten().is_none() && !pod_dir.exists()
    })
    .await;
}

#[tokio::test]
async fn containers_cannot_read_the_cluster_keys_or_reach_this_machine() {
    let ns = TestNamespace::new("confined").await;
    let kubeconfig = root().join(".noops/kubeconfig");
    let pki = root().join(".noops/cluster/pki");
    assert!(kubeconfig.is_file() && pki.is_dir(), "the keys exist on this machine");
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": "curious" },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "app",
                "image": "busybox",
                "command": ["sh", "-c", "\
                    echo kubeconfig=$(cat $KUBECONFIG_FILE 2>/dev/null | wc -c); \
                    echo pki=$(ls $PKI 2>/dev/null | wc -l); \
                    echo host-root=$(ls /proc/1/root/ 2>/dev/null | wc -l); \
                    if mount -t tmpfs none /mnt 2>/dev/null; then echo mount=yes; else echo mount=no; fi; \
                    if mknod /tmp/disk b 254 0 2>/dev/null; then echo mknod=yes; else echo mknod=no; fi"],
                "env": [
                    { "name": "KUBECONFIG_FILE", "value": kubeconfig },
                    { "name": "PKI", "value": pki },
                ],
            }],
        },
    });
    ns.apply(&pod.to_string());
    let pods = ns.pods();
    wait_until("curious to finish", MINUTE, || async {
        pods.get_opt("curious")
            .await
            .ok()
            .flatten()
            .is_some_and(|p| p.status.and_then(|s| s.phase).as_deref() == Some("Succeeded"))
    })
    .await;
    let logs = pods.logs("curious", &LogParams::default()).await.unwrap();
    assert_eq!(
        logs, "kubeconfig=0\npki=0\nhost-root=0\nmount=no\nmknod=no\n",
        "the cluster's keys are hidden, and neither other processes' roots, mounts nor devices are in reach"
    );
}

#[tokio::test]
async fn postgres_15_runs_as_the_official_image_lays_it_out_and_other_majors_say_why_not() {
    let ns = TestNamespace::new("postgres").await;
    ns.apply(
        r#"
apiVersion: v1
kind: Pod
metadata: { name: pg }
spec:
  containers:
    - name: postgres
      image: postgres:15
      command: ["sh", "-c"]
      args:
        - initdb -D "$PGDATA" -U postgres --auth=trust >/dev/null &&
          echo "host all all 0.0.0.0/0 trust" >>"$PGDATA/pg_hba.conf" &&
          exec postgres -D "$PGDATA" -c listen_addresses='*' -k /tmp
      volumeMounts: [{ name: data, mountPath: /var/lib/postgresql }]
      readinessProbe: { exec: { command: [pg_isready, -h, 127.0.0.1] }, periodSeconds: 1 }
  volumes: [{ name: data, emptyDir: {} }]
---
apiVersion: v1
kind: Pod
metadata: { name: pg16 }
spec:
  containers: [{ name: postgres, image: "postgres:16", command: [postgres] }]
"#,
    );
    let pods = ns.pods();
    let pod = wait_for("postgres Ready", 2 * MINUTE, || async {
        pods.get_opt("pg").await.ok().flatten().filter(pod_ready)
    })
    .await;
    let out = Command::new("/usr/lib/postgresql/15/bin/psql")
        .args([
            "-h",
            &ip_of(&pod),
            "-U",
            "postgres",
            "-tAc",
            "select current_user || ' ' || version()",
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.starts_with("postgres PostgreSQL 15."), "{said}");

    let waiting = wait_for("ErrImagePull for postgres:16", MINUTE, || async {
        pods.get_opt("pg16")
            .await
            .ok()
            .flatten()
            .and_then(|p| container_status(&p)?.state?.waiting)
            .filter(|w| matches!(w.reason.as_deref(), Some("ErrImagePull" | "ImagePullBackOff")))
    })
    .await;
    assert!(waiting.message.unwrap_or_default().contains("only PostgreSQL 15"));
}
