//! KubernetesControlPlane on the local Kubernetes: what its schema refuses; a control plane made,
//! used through its admin kubeconfig and deleted with everything it ran; an upgrade and a lost
//! API server with a client writing throughout (no failed request), a stalled upgrade set back;
//! and the operator killed at each crash point of making and upgrading one. Needs
//! `make cluster-up` (3 nodes).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Secret;
use noops_api::KubernetesControlPlane;
use noops_api::control_plane::KubernetesControlPlanePhase;
use noops_e2e::certificates::{certificate_in, not_after, presented_certificate};
use noops_e2e::*;

/// A KubernetesControlPlane `name` with `spec` (YAML lines indented by two).
fn control_plane(name: &str, spec: &str) -> String {
    format!("apiVersion: noops.dev/v1alpha1\nkind: KubernetesControlPlane\nmetadata: {{ name: {name} }}\nspec:\n{spec}")
}

#[tokio::test]
async fn bad_specs_are_refused_with_a_reason() {
    install_crds();
    let ns = TestNamespace::new("kcp-bad").await;
    let v = |version: &str, rest: &str| control_plane("c", &format!("  version: \"{version}\"\n{rest}"));

    let refused_on_create = [
        (v("1.32", ""), "version must be 1.33 or later"),
        (v("2.0", ""), "version must be a Kubernetes version"),
        (v("v1.34.4", ""), "version must be a Kubernetes version"),
        (v("latest", ""), "version must be a Kubernetes version"),
        (v("1.34", "  replicas: 2\n"), "replicas must be 1 or 3"),
        (
            v("1.34", "  etcd: { replicas: 4 }\n"),
            "etcd.replicas must be 1, 3 or 5",
        ),
        (
            v("1.34", "  etcd: { storage: { size: lots } }\n"),
            "storage.size must be a quantity",
        ),
        (
            v("1.34", "  networking: { podCIDR: banana }\n"),
            "networking.podCIDR must be an IPv4 range",
        ),
        (
            v("1.34", "  networking: { podCIDR: \"fd00::/64\" }\n"),
            "networking.podCIDR must be an IPv4 range",
        ),
        (
            v("1.34", "  networking: { serviceCIDR: 10.100.0.1/16 }\n"),
            "networking.serviceCIDR must be a range's first address",
        ),
        (
            v(
                "1.34",
                "  networking: { podCIDR: 10.0.0.0/8, serviceCIDR: 10.100.0.0/16 }\n",
            ),
            "must not overlap",
        ),
        (
            v(
                "1.34",
                "  extraArgs: { apiServer: [\"--etcd-servers=https://elsewhere:2379\"] }\n",
            ),
            "extraArgs.apiServer cannot set a flag the operator sets",
        ),
        (
            v(
                "1.34",
                "  extraArgs: { controllerManager: [\"--cluster-cidr=10.0.0.0/8\"] }\n",
            ),
            "extraArgs.controllerManager cannot set a flag the operator sets",
        ),
        (
            v("1.34", "  extraArgs: { scheduler: [\"v=2\"] }\n"),
            "extraArgs.scheduler must be flags",
        ),
        (
            v("1.34", "  service: { nodePort: 30001 }\n"),
            "service.nodePort needs service.type: NodePort",
        ),
        (
            v(
                "1.34",
                "  etcd: { storage: { ephemeral: true } }\n  bootstrap: { fromBackup: { name: b } }\n",
            ),
            "bootstrap.fromBackup needs persistent etcd storage",
        ),
        (
            control_plane(&"x".repeat(36), "  version: \"1.34\"\n"),
            "at most 35 characters",
        ),
    ];
    for (yaml, expected) in &refused_on_create {
        let error = apply_error(&ns, yaml).unwrap_or_else(|| panic!("accepted:\n{yaml}"));
        assert!(error.contains(expected), "refused, but not with {expected:?}: {error}");
    }

    // Refused as changes of an existing (paused, so nothing runs) control plane. Its ranges
    // can change until it has served (a range found taken can be fixed), not after.
    let paused = "  paused: true\n";
    ns.apply(&v("1.33", paused));
    let moved = format!("{paused}  networking: {{ podCIDR: 10.201.0.0/16 }}\n");
    assert_eq!(
        apply_error(&ns, &v("1.33", &moved)),
        None,
        "ranges are editable before serving"
    );
    ns.apply(&v("1.33", paused));
    // As the operator says once every API server runs 1.33.13.
    let served = |version: &str| {
        let api = ns.api::<KubernetesControlPlane>();
        let body = serde_json::json!({ "status": { "version": version } });
        async move {
            api.patch_status("c", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&body))
                .await
                .unwrap();
        }
    };
    served("1.33.13").await;
    let refused_on_update = [
        (v("1.35", paused), "upgrade one minor version at a time"),
        (v("1.32", paused), "version must be 1.33 or later"),
        (
            v(
                "1.33",
                &format!("{paused}  networking: {{ dnsDomain: tenant.local }}\n"),
            ),
            "spec.networking is immutable once the control plane has served",
        ),
        (
            v("1.33", &format!("{paused}  etcd: {{ storage: {{ size: 2Gi }} }}\n")),
            "etcd.storage is immutable",
        ),
        (
            v(
                "1.33",
                &format!("{paused}  bootstrap: {{ fromBackup: {{ name: b }} }}\n"),
            ),
            "bootstrap is immutable",
        ),
    ];
    for (yaml, expected) in &refused_on_update {
        let error = apply_error(&ns, yaml).unwrap_or_else(|| panic!("accepted:\n{yaml}"));
        assert!(error.contains(expected), "refused, but not with {expected:?}: {error}");
    }
    // One minor up is accepted; back down again is not, once 1.34 runs.
    ns.apply(&v("1.34", paused));
    served("1.34.4").await;
    let error = apply_error(&ns, &v("1.33", paused)).expect("a downgrade was accepted");
    assert!(error.contains("downgrades are refused"), "{error}");
    let kept = ns.api::<KubernetesControlPlane>().get("c").await.unwrap();
    assert_eq!(kept.spec.version, "1.34", "a refused edit changes nothing");
    assert_eq!(kept.spec.networking.service_cidr, "10.112.0.0/16", "the default range");
    // The example of the docs is accepted (no operator runs here: nothing is made).
    let example = std::fs::read_to_string(root().join("examples/kubernetes/team-a.yaml")).unwrap();
    assert_eq!(
        apply_error(&ns, &example),
        None,
        "examples/kubernetes/team-a.yaml refused"
    );
}

/// Processes of this machine that belong to the control plane `name` of `ns`: its etcd and API
/// servers name the namespace's Services on their command lines, and every pod's processes
/// carry the pod's name as HOSTNAME.
fn processes_of(name: &str, ns: &TestNamespace) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let path = entry.path();
        let read = |file: &str| std::fs::read(path.join(file)).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&read("cmdline")).replace('\0', " ");
        let environ = String::from_utf8_lossy(&read("environ")).into_owned();
        let hostname = format!("HOSTNAME={name}-");
        if cmdline.contains(&format!(".{}.svc", ns.name)) || environ.split('\0').any(|v| v.starts_with(&hostname)) {
            found.push(cmdline);
        }
    }
    found
}

/// Runs kubectl against the tenant with `kubeconfig`.
fn tenant_kubectl(kubeconfig: &std::path::Path, args: &[&str], stdin: Option<&str>) -> std::process::Output {
    kubectl_with(kubeconfig, args, stdin)
}

#[tokio::test]
async fn a_control_plane_serves_its_tenant_and_goes_away_with_everything_it_ran() {
    install_crds();
    let ns = TestNamespace::new("kcp-life").await;
    let operator = Operator::start(&ns.name, &["--controllers", "kubernetescontrolplane,etcd"]);
    let name = "kcplife";
    let api = ns.api::<KubernetesControlPlane>();

    // First with a pod range that overlaps this cluster's nodes' (10.244.<n>.0/24): refused
    // with a reason and a Warning, nothing made; the range corrected, it is made.
    let spec =
        |pods: &str| format!("  version: \"1.33\"\n  etcd: {{ replicas: 1 }}\n  networking: {{ podCIDR: {pods} }}\n");
    ns.apply(&control_plane(name, &spec("10.244.0.0/16")));
    let refused = wait_status(&ns, name, "RangeTaken", std::time::Duration::from_secs(60), |s| {
        condition_is(s, "Degraded", "True").is_some_and(|(reason, _)| reason == "RangeTaken")
    })
    .await;
    let (_, message) = condition_is(&refused, "Ready", "False").unwrap();
    assert!(
        message.starts_with("networking.podCIDR 10.244.0.0/16 overlaps 10.244."),
        "{message}"
    );
    assert!(message.contains("(the pods of node noops-node-"), "{message}");
    assert_eq!(refused.phase, Some(KubernetesControlPlanePhase::Degraded));
    assert!(
        event_reasons(&ns, "KubernetesControlPlane", name)
            .await
            .contains(&"RangeTaken".to_string())
    );
    let etcd = ns.api::<noops_api::EtcdCluster>();
    assert!(
        etcd.get_opt(&format!("{name}-etcd")).await.unwrap().is_none(),
        "nothing is made"
    );
    ns.apply(&control_plane(name, &spec("10.201.0.0/16")));
    // As a user waits for it.
    let (namespace, target) = (ns.name.clone(), format!("kcp/{name}"));
    let waited = tokio::task::spawn_blocking(move || {
        kubectl(
            &[
                "wait",
                "--for=condition=Ready",
                &target,
                "-n",
                &namespace,
                "--timeout=300s",
            ],
            None,
        )
    })
    .await
    .unwrap();
    assert!(
        waited.status.success(),
        "kubectl wait: {}",
        String::from_utf8_lossy(&waited.stderr)
    );
    let ready = api.get(name).await.unwrap().status.unwrap();
    assert_eq!(ready.version.as_deref(), Some("1.33.13"));
    assert_eq!(ready.phase, Some(KubernetesControlPlanePhase::Running));
    assert_eq!(ready.ready.as_deref(), Some("1/1"));
    let endpoint = ready.endpoint.clone().unwrap();
    assert!(endpoint.starts_with("https://10.96."), "{endpoint}");

    // Its EtcdCluster paused by hand stays paused: pausing it (and its pod settings) is left to
    // whoever runs it. Unpaused again after.
    let etcd_name = format!("{name}-etcd");
    let pause = |paused: bool| {
        let etcd = etcd.clone();
        let etcd_name = etcd_name.clone();
        async move {
            let body = serde_json::json!({ "spec": { "paused": paused } });
            let params = kube::api::PatchParams::default();
            etcd.patch(&etcd_name, &params, &kube::api::Patch::Merge(&body))
                .await
                .unwrap();
        }
    };
    pause(true).await;
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let paused = etcd.get(&etcd_name).await.unwrap();
    assert!(paused.spec.paused, "the control plane unpaused its EtcdCluster");
    pause(false).await;

    // The admin kubeconfig works from this machine: the version, and objects written and read.
    let secret = ready.admin_kubeconfig_secret.clone().unwrap();
    let secret = ns.api::<Secret>().get(&secret).await.unwrap();
    let decoded = secret.data.unwrap().remove("kubeconfig").unwrap().0;
    let kubeconfig = std::env::temp_dir().join(format!("{}-{name}.kubeconfig", ns.name));
    std::fs::write(&kubeconfig, decoded).unwrap();
    let version = tenant_kubectl(&kubeconfig, &["version", "-o", "json"], None);
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(version.contains("\"gitVersion\": \"v1.33.13\""), "{version}");
    let made = tenant_kubectl(&kubeconfig, &["create", "namespace", "shop"], None);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let config_map =
        "apiVersion: v1\nkind: ConfigMap\nmetadata: { name: settings, namespace: shop }\ndata: { colour: green }\n";
    let applied = tenant_kubectl(&kubeconfig, &["apply", "-f", "-"], Some(config_map));
    assert!(applied.status.success(), "{}", String::from_utf8_lossy(&applied.stderr));
    let read = tenant_kubectl(
        &kubeconfig,
        &[
            "get",
            "configmap",
            "-n",
            "shop",
            "settings",
            "-o",
            "jsonpath={.data.colour}",
        ],
        None,
    );
    assert_eq!(String::from_utf8_lossy(&read.stdout), "green");
    // A Deployment is accepted (its pods wait: the tenant has no nodes yet), and the
    // controller-manager makes its ReplicaSet.
    let made = tenant_kubectl(
        &kubeconfig,
        &[
            "create",
            "deployment",
            "-n",
            "shop",
            "web",
            "--image=hashicorp/http-echo",
        ],
        None,
    );
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    wait_until(
        "the tenant's controller-manager makes a ReplicaSet",
        std::time::Duration::from_secs(60),
        || {
            let kubeconfig = kubeconfig.clone();
            async move {
                let out = tenant_kubectl(&kubeconfig, &["get", "replicasets", "-n", "shop", "-o", "name"], None);
                !String::from_utf8_lossy(&out.stdout).trim().is_empty()
            }
        },
    )
    .await;
    let columns = kubectl_ok(&["get", "kcp", "-n", &ns.name, name], None);
    assert!(
        columns.contains("1.33.13") && columns.contains("Running") && columns.contains("1/1"),
        "{columns}"
    );
    assert!(
        event_reasons(&ns, "KubernetesControlPlane", name)
            .await
            .contains(&"ControlPlaneReady".to_string())
    );

    // Deleting it removes every child, and every process it ran.
    assert!(
        !processes_of(name, &ns).is_empty(),
        "its processes are found while it runs"
    );
    kubectl_ok(&["delete", "kcp", "-n", &ns.name, name], None);
    wait_until(
        "every process of the control plane gone",
        std::time::Duration::from_secs(120),
        || async { processes_of(name, &ns).is_empty() },
    )
    .await;
    // The objects go a moment after the processes (a pod's object once its node agent has
    // seen its containers stop).
    let left = || {
        kubectl_ok(
            &[
                "get",
                "etcdclusters,deployments,services,secrets,pods",
                "-n",
                &ns.name,
                "-o",
                "name",
            ],
            None,
        )
    };
    wait_until(
        "every object of the control plane gone",
        std::time::Duration::from_secs(60),
        || async { !left().contains(name) },
    )
    .await;
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
    let _ = std::fs::remove_file(&kubeconfig);
}

/// A client of the tenant from the kubeconfig in Secret `secret`.
async fn tenant_client(ns: &TestNamespace, secret: &str) -> kube::Client {
    let secret = ns.api::<Secret>().get(secret).await.unwrap();
    let text = String::from_utf8(secret.data.unwrap().remove("kubeconfig").unwrap().0).unwrap();
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&text).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// What the tenant's client saw: requests that succeeded, that failed, that were told to come
/// back (429 with Retry-After, from an API server shutting down), that were asked again
/// because the server closed their kept-alive connection before answering, and that were
/// asked again because etcd's leadership moved under them.
#[derive(Debug, Default)]
struct Traffic {
    written: usize,
    failed: Vec<String>,
    retried: usize,
    reconnected: usize,
    /// Requests answered 500 by etcd's leader change: "raft proposal dropped" (a write etcd's
    /// leader refused while it handed leadership over: never in etcd's log) or "leader
    /// changed" (a read whose leader changed while it waited for the read index). The API
    /// server passes both on without asking again, as it does whenever an etcd member
    /// restarts; the client asks again (a create may then find its own object).
    asked_again_after_leader_change: usize,
}

/// Whether `error` says that the server closed an established connection before it answered.
/// An API server that stops closes its idle kept-alive connections (Go's `Server.Shutdown`); a
/// request written to one of them at that moment was never read. Over HTTP/2, which client-go
/// speaks, the server says so with a GOAWAY and client-go asks again on its own; kube-rs speaks
/// HTTP/1.1 and only sees the connection close.
fn closed_before_answer(error: &kube::Error) -> bool {
    let kube::Error::Service(source) = error else {
        return false;
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
    while let Some(e) = cause {
        let text = e.to_string();
        if text.contains("connection closed before message completed")
            || text.contains("Connection reset by peer")
            || text.contains("Broken pipe")
        {
            return true;
        }
        cause = e.source();
    }
    false
}

/// The whole chain of an error, for a failure message that says what went wrong.
fn error_chain(error: &kube::Error) -> String {
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(error);
    while let Some(e) = cause {
        text.push_str(&format!(": {e}"));
        cause = e.source();
    }
    text
}

/// Runs `request` as client-go would: an answer 429 (an API server that is shutting down) is
/// asked again after a moment, and so is a request whose connection was closed before an
/// answer (see [`closed_before_answer`]), on a new connection; up to 5 tries.
async fn as_client_go<T, F, Fut>(traffic: &mut Traffic, mut request: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut tries = 1;
    loop {
        match request().await {
            Err(kube::Error::Api(e)) if e.code == 429 && tries < 5 => {
                traffic.retried += 1;
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(e) if closed_before_answer(&e) && tries < 5 => traffic.reconnected += 1,
            Err(kube::Error::Api(e)) if e.code == 500 && etcd_leader_changed(&e.message) && tries < 5 => {
                traffic.asked_again_after_leader_change += 1;
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            other => return other,
        }
        tries += 1;
    }
}

/// Whether an API server's 500 says etcd's leadership changed under the request.
fn etcd_leader_changed(message: &str) -> bool {
    message.contains("raft proposal dropped") || message.contains("leader changed")
}

/// Creates a ConfigMap and reads it back every 100 ms until `stop`. A create asked again after
/// a closed connection may find its own object there (409): it counts when it holds what was
/// written.
async fn write_and_read(client: kube::Client, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Traffic {
    use k8s_openapi::api::core::v1::ConfigMap;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, "default");
    let mut traffic = Traffic::default();
    let mut i = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let name = format!("beat-{i}");
        let data: std::collections::BTreeMap<String, String> = [("i".to_string(), i.to_string())].into();
        let map = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            data: Some(data.clone()),
            ..Default::default()
        };
        let params = kube::api::PostParams::default();
        let asked_again_before = traffic.reconnected + traffic.asked_again_after_leader_change;
        let outcome = match as_client_go(&mut traffic, || api.create(&params, &map)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e))
                if e.code == 409
                    && traffic.reconnected + traffic.asked_again_after_leader_change > asked_again_before =>
            {
                Ok(())
            }
            Err(e) => Err(error_chain(&e)),
        };
        let read = match outcome {
            Ok(()) => match as_client_go(&mut traffic, || api.get(&name)).await {
                Ok(read) if read.data.as_ref() == Some(&data) => Ok(()),
                Ok(read) => Err(format!("read back {:?}", read.data)),
                Err(e) => Err(error_chain(&e)),
            },
            Err(e) => Err(e),
        };
        match read {
            Ok(()) => traffic.written += 1,
            Err(e) => traffic.failed.push(format!("{name}: {e}")),
        }
        i += 1;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    traffic
}

/// Waits until the control plane's status satisfies `check`.
async fn wait_status(
    ns: &TestNamespace,
    name: &str,
    what: &str,
    timeout: std::time::Duration,
    check: impl Fn(&noops_api::KubernetesControlPlaneStatus) -> bool,
) -> noops_api::KubernetesControlPlaneStatus {
    let api = ns.api::<KubernetesControlPlane>();
    wait_for(what, timeout, || async {
        let status = api.get(name).await.ok()?.status?;
        check(&status).then_some(status)
    })
    .await
}

fn condition_is(
    status: &noops_api::KubernetesControlPlaneStatus,
    type_: &str,
    value: &str,
) -> Option<(String, String)> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == value)
        .map(|c| (c.reason.clone(), c.message.clone()))
}

#[tokio::test]
async fn an_upgrade_and_a_lost_api_server_fail_no_request_and_an_upgrade_that_cannot_start_stalls_until_set_back() {
    install_crds();
    let ns = TestNamespace::new("kcp-upgrade").await;
    let operator = Operator::start(&ns.name, &["--controllers", "kubernetescontrolplane,etcd"]);
    let name = "kcpup";
    let spec = |version: &str| format!("  version: \"{version}\"\n  replicas: 3\n  etcd: {{ replicas: 3 }}\n");
    ns.apply(&control_plane(name, &spec("1.33")));
    let minutes = |m: u64| std::time::Duration::from_secs(60 * m);
    let ready = wait_status(&ns, name, "Ready at 1.33", minutes(5), |s| {
        condition_is(s, "Ready", "True").is_some()
    })
    .await;
    assert_eq!(ready.version.as_deref(), Some("1.33.13"));
    let client = tenant_client(&ns, &ready.admin_kubeconfig_secret.unwrap()).await;

    // 1.33 → 1.34 with a client writing and reading through the Service throughout.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = tokio::spawn(write_and_read(client.clone(), stop.clone()));
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    ns.apply(&control_plane(name, &spec("1.34")));
    let upgraded = wait_status(&ns, name, "upgraded to 1.34", minutes(5), |s| {
        s.version.as_deref() == Some("1.34.4") && s.phase == Some(KubernetesControlPlanePhase::Running)
    })
    .await;
    // One of the three API servers deleted, the client still writing: it is made again.
    let pods = ns.pods();
    let selector = format!("noops.dev/kubernetescontrolplane={name},app.kubernetes.io/component=apiserver");
    let listed = pods
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .unwrap();
    let gone = listed.items[0].metadata.name.clone().unwrap();
    pods.delete(&gone, &Default::default()).await.unwrap();
    wait_until("the deleted API server replaced", minutes(2), || {
        let (pods, selector, gone) = (pods.clone(), selector.clone(), gone.clone());
        async move {
            let now = pods
                .list(&kube::api::ListParams::default().labels(&selector))
                .await
                .unwrap()
                .items;
            now.len() == 3
                && now
                    .iter()
                    .all(|p| p.metadata.name.as_deref() != Some(gone.as_str()) && pod_ready(p))
        }
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let traffic = writer.await.unwrap();
    eprintln!(
        "upgrade traffic: {} written and read, {} answers 429 asked again, {} asked again after a closed connection, {} after etcd's leader changed",
        traffic.written, traffic.retried, traffic.reconnected, traffic.asked_again_after_leader_change
    );
    assert!(
        traffic.failed.is_empty(),
        "failed requests during the upgrade: {:?}",
        traffic.failed
    );
    assert!(traffic.written > 100, "too few requests to say anything: {traffic:?}");
    // The etcd upgrade moves leadership once (off the member it restarts last): the client,
    // one request at a time, meets it once or twice (the request and the one asked again).
    assert!(
        traffic.asked_again_after_leader_change <= 2,
        "more answers of a leader change than one leader move makes: {traffic:?}"
    );
    // One client, one connection at a time: each API server that stops (three replaced by the
    // upgrade, one deleted) can close it under a request at most once.
    assert!(
        traffic.reconnected <= 4,
        "more closed connections than API servers stopped: {traffic:?}"
    );
    assert_eq!(
        upgraded.etcd.as_deref().map(|e| e.ends_with("3.6.16")),
        Some(true),
        "{:?}",
        upgraded.etcd
    );
    let maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(client.clone(), "default");
    let beats: Vec<String> = maps
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|m| m.metadata.name.filter(|n| n.starts_with("beat-")))
        .collect();
    assert_eq!(beats.len(), traffic.written, "every object written is still there");
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, "v1.34.4");
    let reasons = event_reasons(&ns, "KubernetesControlPlane", name).await;
    for reason in ["UpgradeStarted", "UpgradeStep", "Upgraded"] {
        assert!(reasons.contains(&reason.to_string()), "{reason} in {reasons:?}");
    }

    // Skipping a minor is refused; an upgrade to a version with no image stalls, the old API
    // servers serving, and setting the version back recovers.
    let error = apply_error(&ns, &control_plane(name, &spec("1.36"))).expect("a skipped minor was accepted");
    assert!(error.contains("one minor version at a time"), "{error}");
    ns.apply(&control_plane(name, &spec("1.35")));
    let stalled = wait_status(&ns, name, "the upgrade to 1.35 stalled", minutes(3), |s| {
        s.phase == Some(KubernetesControlPlanePhase::Stalled)
    })
    .await;
    let (reason, message) = condition_is(&stalled, "Degraded", "True").unwrap();
    assert_eq!(reason, "UpgradeStalled");
    assert!(message.contains("kube-apiserver cannot start"), "{message}");
    assert_eq!(stalled.version.as_deref(), Some("1.34.4"));
    assert_eq!(
        client.apiserver_version().await.unwrap().git_version,
        "v1.34.4",
        "the old version serves"
    );
    ns.apply(&control_plane(name, &spec("1.34")));
    wait_status(&ns, name, "back to Running at 1.34", minutes(3), |s| {
        s.phase == Some(KubernetesControlPlanePhase::Running) && condition_is(s, "Ready", "True").is_some()
    })
    .await;

    // A first apply at a version with no image: it says why it cannot start, and deleting it
    // leaves nothing.
    let new = "kcpnew";
    ns.apply(&control_plane(new, "  version: \"1.35\"\n  etcd: { replicas: 1 }\n"));
    let cannot = wait_status(&ns, new, "a new control plane that cannot start", minutes(3), |s| {
        condition_is(s, "Ready", "False").is_some_and(|(reason, _)| reason == "PodsCannotStart")
    })
    .await;
    let (reason, message) = condition_is(&cannot, "Degraded", "True").unwrap();
    assert_eq!(reason, "PodsCannotStart");
    assert!(message.contains("kube-apiserver cannot start"), "{message}");
    assert_eq!(cannot.version, None, "nothing has served");
    ns.api::<KubernetesControlPlane>()
        .delete(new, &Default::default())
        .await
        .unwrap();
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

/// The crash points the operator went through, from the file it records them in.
fn crashed_at(file: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Applies control plane `name` with `spec`, the operator killing itself once at each crash point it reaches (a
/// supervisor starts it again), until the status satisfies `done`; every point of `expected`
/// must have been crossed. The status then.
async fn through_crash_points(
    ns: &TestNamespace,
    phase: &str,
    name: &str,
    spec: &str,
    done: impl Fn(&noops_api::KubernetesControlPlaneStatus) -> bool,
    expected: &[&str],
) -> noops_api::KubernetesControlPlaneStatus {
    let file = std::env::temp_dir().join(format!("noops-crash-points-{}-{phase}", ns.name));
    let etcd_file = std::env::temp_dir().join(format!("noops-crash-points-{}-{phase}-etcd", ns.name));
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&etcd_file);
    // Two processes: a kill at an etcd point cannot cut a control-plane request short after
    // the server took it, before its point was recorded.
    let supervisor = Supervisor::start_controllers(&ns.name, &file, "kubernetescontrolplane");
    let etcd_supervisor = Supervisor::start_controllers(&ns.name, &etcd_file, "etcd");
    ns.apply(&control_plane(name, spec));
    let status = wait_status(ns, name, phase, std::time::Duration::from_secs(360), done).await;
    let (restarts, logs) = supervisor.stop().await;
    let (etcd_restarts, etcd_logs) = etcd_supervisor.stop().await;
    assert!(!logs.contains("panicked"), "{logs}");
    assert!(!etcd_logs.contains("panicked"), "{etcd_logs}");
    let crossed = crashed_at(&file);
    eprintln!("{phase}: {restarts} restarts at {crossed:?}");
    eprintln!("{phase}: etcd {etcd_restarts} restarts at {:?}", crashed_at(&etcd_file));
    for point in expected {
        assert!(crossed.iter().any(|p| p == point), "{point} in {crossed:?}");
    }
    status
}

#[tokio::test]
async fn the_operator_killed_at_each_crash_point_makes_and_upgrades_a_control_plane_losing_nothing() {
    install_crds();
    let ns = TestNamespace::new("kcp-crash").await;
    let name = "kcpcrash";
    let spec = |version: &str| format!("  version: \"{version}\"\n  etcd: {{ replicas: 1 }}\n");
    let ready_at = |version: &'static str| {
        move |s: &noops_api::KubernetesControlPlaneStatus| {
            s.version.as_deref() == Some(version)
                && s.phase == Some(KubernetesControlPlanePhase::Running)
                && condition_is(s, "Ready", "True").is_some()
        }
    };

    // Made, with a kill at each point of the way (the etcd controller's included).
    let made = [
        "control plane: a CA made",
        "control plane: a certificate issued",
        "control plane: API server Deployment applied",
    ];
    let ready = through_crash_points(&ns, "made", name, &spec("1.33"), ready_at("1.33.13"), &made).await;

    // Objects the tenant holds before the upgrade.
    let client = tenant_client(&ns, &ready.admin_kubeconfig_secret.unwrap()).await;
    let maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(client.clone(), "default");
    for i in 0..20 {
        let map = k8s_openapi::api::core::v1::ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("kept-{i}")),
                ..Default::default()
            },
            ..Default::default()
        };
        maps.create(&Default::default(), &map).await.unwrap();
    }

    // Upgraded, with a kill at each point again.
    let upgrade = [
        "control plane: EtcdCluster applied",
        "control plane: API server Deployment applied",
        "control plane: controller-manager or scheduler Deployment applied",
    ];
    let upgraded = through_crash_points(&ns, "upgrade", name, &spec("1.34"), ready_at("1.34.4"), &upgrade).await;
    assert_eq!(upgraded.upgrade, None, "the upgrade is recorded as done");
    let kept = maps.list(&Default::default()).await.unwrap().items;
    let kept = kept
        .iter()
        .filter(|m| m.metadata.name.as_deref().is_some_and(|n| n.starts_with("kept-")))
        .count();
    assert_eq!(kept, 20, "every object of the tenant is still there");
    // The old API server serves the connections it holds until its shutdown delay is over.
    wait_until(
        "the client answered by 1.34",
        std::time::Duration::from_secs(60),
        || async {
            client
                .apiserver_version()
                .await
                .is_ok_and(|v| v.git_version == "v1.34.4")
        },
    )
    .await;
}

#[tokio::test]
async fn a_tenant_backed_up_comes_back_in_a_new_control_plane() {
    use noops_e2e::etcd::backup_manifest;
    install_crds();
    let ns = TestNamespace::new("kcp-backup").await;
    noops_e2e::s3::deploy(&ns);
    noops_e2e::s3::create_bucket(&ns, "backups").await;
    let operator = Operator::start(&ns.name, &["--controllers", "kubernetescontrolplane,etcd,etcdbackup"]);
    let minutes = |m: u64| std::time::Duration::from_secs(60 * m);
    let etcd_with_backups = format!(
        "  etcd:\n    replicas: 1\n    backup:\n      maxBackups: 3\n      s3: {{ endpoint: \"{}\", bucket: backups, credentialsSecret: object-store-credentials }}\n",
        noops_e2e::s3::service_url(&ns)
    );
    ns.apply(&control_plane(
        "first",
        &format!("  version: \"1.34\"\n{etcd_with_backups}"),
    ));
    let ready = wait_status(&ns, "first", "the first control plane Ready", minutes(5), |s| {
        condition_is(s, "Ready", "True").is_some()
    })
    .await;

    // The tenant's objects, then a backup of its etcd.
    let client = tenant_client(&ns, &ready.admin_kubeconfig_secret.unwrap()).await;
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    let shop = k8s_openapi::api::core::v1::Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some("shop".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces.create(&Default::default(), &shop).await.unwrap();
    let maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(client, "shop");
    let settings = k8s_openapi::api::core::v1::ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("settings".into()),
            ..Default::default()
        },
        data: Some([("colour".to_string(), "green".to_string())].into()),
        ..Default::default()
    };
    maps.create(&Default::default(), &settings).await.unwrap();
    ns.apply(&backup_manifest("tenant-snapshot", "first-etcd"));
    kubectl_ok(
        &[
            "wait",
            "-n",
            &ns.name,
            "--for=condition=Succeeded",
            "etcdbackup/tenant-snapshot",
            "--timeout=180s",
        ],
        None,
    );

    // A new control plane from that backup has them.
    let restored =
        "  version: \"1.34\"\n  etcd: { replicas: 1 }\n  bootstrap: { fromBackup: { name: tenant-snapshot } }\n";
    ns.apply(&control_plane("second", restored));
    let ready = wait_status(&ns, "second", "the restored control plane Ready", minutes(5), |s| {
        condition_is(s, "Ready", "True").is_some()
    })
    .await;
    let client = tenant_client(&ns, &ready.admin_kubeconfig_secret.unwrap()).await;
    let maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(client, "shop");
    let back = maps.get("settings").await.unwrap();
    assert_eq!(back.data.unwrap().get("colour").map(String::as_str), Some("green"));
    let etcd = ns.api::<noops_api::EtcdCluster>().get("second-etcd").await.unwrap();
    assert_eq!(etcd.status.unwrap().restored_from.as_deref(), Some("tenant-snapshot"));
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

#[tokio::test]
async fn a_control_plane_renews_its_certificates_before_they_expire_and_follows_a_new_ca() {
    // Certificates that last 90 s: issued again with 30 s left, which rolls the pods that
    // mount them (some components read their certificates only when they start).
    install_crds();
    let ns = TestNamespace::new("kcp-renew").await;
    let operator = Operator::start(
        &ns.name,
        &[
            "--controllers",
            "kubernetescontrolplane,etcd",
            "--certificate-lifetime-seconds",
            "90",
        ],
    );
    let name = "kcprenew";
    ns.apply(&control_plane(name, "  version: \"1.34\"\n  etcd: { replicas: 1 }\n"));
    let minutes = |m: u64| std::time::Duration::from_secs(60 * m);
    let ready = wait_status(&ns, name, "Ready", minutes(3), |s| {
        condition_is(s, "Ready", "True").is_some()
    })
    .await;
    let endpoint = ready.endpoint.clone().unwrap();
    let serving = format!("{name}-apiserver-tls");
    let ca = certificate_in(&ns, &format!("{name}-ca"), "ca.crt").await;
    let first = not_after(&ns, &serving).await;
    assert_eq!(
        presented_certificate(endpoint.trim_start_matches("https://"), None, &ca).unwrap(),
        certificate_in(&ns, &serving, "tls.crt").await,
        "the API server serves the certificate of its Secret"
    );

    let renewed = wait_for("the serving certificate issued again", minutes(2), || async {
        let now = not_after(&ns, &serving).await;
        (now != first).then_some(now)
    })
    .await;
    assert!(
        jiff::Timestamp::now() < first,
        "renewed before the first one expired ({first})"
    );
    assert!(renewed > first);
    // The API server's pod rolled onto it: what it presents is the renewed certificate.
    let expected = certificate_in(&ns, &serving, "tls.crt").await;
    wait_until("the API server serving the renewed certificate", minutes(1), || async {
        presented_certificate(endpoint.trim_start_matches("https://"), None, &ca).is_ok_and(|c| c == expected)
    })
    .await;
    // The renewed admin kubeconfig gets in, and the controller-manager (its kubeconfig renewed
    // and its pods rolled too) still works: a Deployment gets its ReplicaSet.
    let admin = ready.admin_kubeconfig_secret.clone().unwrap();
    assert!(not_after(&ns, &admin).await > first, "the admin kubeconfig renewed too");
    let client = tenant_client(&ns, &admin).await;
    let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
        kube::Api::namespaced(client.clone(), "default");
    let deployment = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": { "name": "web" },
        "spec": { "replicas": 1, "selector": { "matchLabels": { "app": "web" } },
            "template": { "metadata": { "labels": { "app": "web" } },
                "spec": { "containers": [{ "name": "web", "image": "nginx" }] } } }
    });
    deployments
        .create(&Default::default(), &serde_json::from_value(deployment).unwrap())
        .await
        .unwrap();
    let replica_sets: kube::Api<k8s_openapi::api::apps::v1::ReplicaSet> = kube::Api::namespaced(client, "default");
    wait_until(
        "the tenant's controller-manager making a ReplicaSet",
        minutes(1),
        || async {
            replica_sets
                .list(&Default::default())
                .await
                .is_ok_and(|l| !l.items.is_empty())
        },
    )
    .await;

    // The CA's Secret deleted by hand: a new CA is made, and everything it signs follows.
    ns.api::<Secret>()
        .delete(&format!("{name}-ca"), &Default::default())
        .await
        .unwrap();
    let new_ca = wait_for("a new CA", minutes(1), || async {
        let secret = ns.api::<Secret>().get_opt(&format!("{name}-ca")).await.ok()??;
        secret.data?.get("ca.crt")?;
        let der = certificate_in(&ns, &format!("{name}-ca"), "ca.crt").await;
        (der != ca).then_some(der)
    })
    .await;
    // The operator's part is timed: the serving certificate is issued again by the new CA at
    // once, not at its next renewal. How soon the API server's pod rolls onto it is the
    // cluster's (a loaded node takes tens of seconds), so that is only waited for.
    wait_until("the serving certificate issued by the new CA", minutes(1), || async {
        certificate_in(&ns, &serving, "ca.crt").await == new_ca
    })
    .await;
    let next_renewal = renewed - jiff::SignedDuration::from_secs(30);
    assert!(
        jiff::Timestamp::now() < next_renewal,
        "followed the new CA before the renewal due at {next_renewal} would have"
    );
    wait_until(
        "the API server serving a certificate of the new CA",
        minutes(2),
        || async { presented_certificate(endpoint.trim_start_matches("https://"), None, &new_ca).is_ok() },
    )
    .await;
    // Once the old pod is gone (it serves until its successor is Ready), the renewed admin
    // kubeconfig trusts what answers.
    wait_until("the admin kubeconfig of the new CA getting in", minutes(1), || async {
        tenant_client(&ns, &admin).await.apiserver_version().await.is_ok()
    })
    .await;
    let reasons = event_reasons(&ns, "KubernetesControlPlane", name).await;
    assert!(reasons.contains(&"CertificatesIssued".to_string()), "{reasons:?}");
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}
