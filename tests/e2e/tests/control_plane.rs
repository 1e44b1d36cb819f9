//! KubernetesControlPlane on the local Kubernetes: what its schema refuses, on creation and as
//! a change, each with a message that says what to fix. Needs `make cluster-up`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Secret;
use noops_api::KubernetesControlPlane;
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

    // Refused as changes of an existing (paused, so nothing runs) control plane.
    let paused = "  paused: true\n";
    ns.apply(&v("1.33", paused));
    let refused_on_update = [
        (v("1.35", paused), "upgrade one minor version at a time"),
        (v("1.32", paused), "version must be 1.33 or later"),
        (
            v(
                "1.33",
                &format!("{paused}  networking: {{ dnsDomain: tenant.local }}\n"),
            ),
            "networking is immutable",
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
    // One minor up is accepted; back down again is not.
    ns.apply(&v("1.34", paused));
    let error = apply_error(&ns, &v("1.33", paused)).expect("a downgrade was accepted");
    assert!(error.contains("downgrades are refused"), "{error}");
    let kept = ns.api::<KubernetesControlPlane>().get("c").await.unwrap();
    assert_eq!(kept.spec.version, "1.34", "a refused edit changes nothing");
    assert_eq!(kept.spec.networking.service_cidr, "10.100.0.0/16", "the default range");
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
    let mut command = std::process::Command::new(upstream_bin("kubectl"));
    command.arg("--kubeconfig").arg(kubeconfig).args(args);
    command.stdin(if stdin.is_some() {
        std::process::Stdio::piped()
    } else {
        std::process::Stdio::null()
    });
    command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    if let Some(input) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap()
}

#[tokio::test]
async fn a_control_plane_serves_its_tenant_and_goes_away_with_everything_it_ran() {
    install_crds();
    let ns = TestNamespace::new("kcp-life").await;
    let operator = Operator::start(&ns.name, &["--controllers", "kubernetescontrolplane,etcd"]);
    let name = "kcplife";
    ns.apply(&control_plane(name, "  version: \"1.33\"\n  etcd: { replicas: 1 }\n"));
    let api = ns.api::<KubernetesControlPlane>();
    let ready = wait_for(
        "the control plane Ready",
        std::time::Duration::from_secs(300),
        || async {
            let kcp = api.get(name).await.ok()?;
            let status = kcp.status.clone()?;
            status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
                .then_some(status)
        },
    )
    .await;
    assert_eq!(ready.version.as_deref(), Some("1.33.13"));
    assert_eq!(ready.phase.as_deref(), Some("Running"));
    assert_eq!(ready.ready.as_deref(), Some("1/1"));
    let endpoint = ready.endpoint.clone().unwrap();
    assert!(endpoint.starts_with("https://10.96."), "{endpoint}");

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
    let left = kubectl_ok(
        &[
            "get",
            "etcdclusters,deployments,services,secrets,pods",
            "-n",
            &ns.name,
            "-o",
            "name",
        ],
        None,
    );
    assert!(!left.contains(name), "left behind: {left}");
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
    let _ = std::fs::remove_file(&kubeconfig);
}
