//! Packaging: the Helm chart renders the same objects as the plain manifests in deploy/, and
//! carries the same CRDs. Needs helm (built by `make setup`), no cluster.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::Command;

use noops_e2e::{root, upstream_bin};
use serde_json::Value;

/// Parses multi-document YAML into objects keyed by kind/namespace/name.
fn objects(yaml: &str) -> BTreeMap<String, Value> {
    serde_saphyr::from_multiple::<Value>(yaml)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .map(|v| {
            let key = format!(
                "{}/{}/{}",
                v["kind"].as_str().unwrap_or(""),
                v["metadata"]["namespace"].as_str().unwrap_or(""),
                v["metadata"]["name"].as_str().unwrap_or("")
            );
            (key, v)
        })
        .collect()
}

#[test]
fn the_chart_renders_what_deploy_holds() {
    let out = Command::new(upstream_bin("helm"))
        .args([
            "template",
            "noops",
            root().join("charts/noops").to_str().unwrap(),
            "--namespace",
            "noops-system",
        ])
        .output()
        .expect("helm (run `make setup`)");
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = objects(&String::from_utf8_lossy(&out.stdout));
    let mut plain = String::new();
    for file in ["10-rbac.yaml", "20-operator.yaml"] {
        plain.push_str(&std::fs::read_to_string(root().join("deploy").join(file)).unwrap());
        plain.push_str("\n---\n");
    }
    let plain = objects(&plain);
    assert_eq!(rendered.keys().collect::<Vec<_>>(), plain.keys().collect::<Vec<_>>());
    for (key, object) in &plain {
        assert_eq!(&rendered[key], object, "{key} differs between the chart and deploy/");
    }
}

#[test]
fn the_chart_carries_the_generated_crds() {
    let chart = std::fs::read_to_string(root().join("charts/noops/crds/noops.dev.yaml")).unwrap();
    let deploy = std::fs::read_to_string(root().join("deploy/crds/noops.dev.yaml")).unwrap();
    assert!(chart == deploy, "charts/noops/crds is out of date: run `make crds`");
}
