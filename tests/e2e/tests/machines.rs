//! Machines, MachineSets and MachineDeployments on the local Kubernetes: what their schemas
//! refuse. Needs `make cluster-up`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use noops_api::{MachineDeployment, MachineSet};
use noops_e2e::*;

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
