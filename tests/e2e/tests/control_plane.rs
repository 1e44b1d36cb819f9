//! KubernetesControlPlane on the local Kubernetes: what its schema refuses, on creation and as
//! a change, each with a message that says what to fix. Needs `make cluster-up`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

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
            control_plane(&"x".repeat(41), "  version: \"1.34\"\n"),
            "at most 40 characters",
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
