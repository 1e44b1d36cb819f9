//! Packaging: the Helm chart renders the same objects as the plain manifests in deploy/, and
//! carries the same CRDs; the image's build stage installs what `make setup` installs for
//! cargo. Needs helm (built by `make setup`); only the last test needs the local Kubernetes:
//! `kubectl get noops` lists every kind.
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

/// The words of `text` after the first `start`, up to the next `end`.
fn words_between(text: &str, start: &str, end: char) -> Vec<String> {
    let from = text.find(start).unwrap_or_else(|| panic!("no {start:?}"));
    let rest = &text[from + start.len()..];
    let upto = rest.find(end).unwrap_or_else(|| panic!("no {end:?} after {start:?}"));
    rest[..upto]
        .split(|c: char| c.is_whitespace() || c == '\\')
        .filter(|w| !w.is_empty())
        .map(String::from)
        .collect()
}

#[test]
fn the_image_build_installs_what_setup_installs_for_cargo() {
    let setup = std::fs::read_to_string(root().join("hack/setup.sh")).unwrap();
    let wanted = words_between(&setup, "cargo_build_packages=(", ')');
    assert!(wanted.contains(&"protobuf-compiler".to_string()), "{wanted:?}");
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    // The build stage: from its FROM up to the next FROM.
    let build = dockerfile
        .split("\nFROM ")
        .find(|stage| stage.contains("AS build"))
        .expect("a build stage");
    let installed = words_between(build, "apt-get install", '&');
    for package in &wanted {
        assert!(
            installed.contains(package),
            "the Dockerfile's build stage does not install {package} (it installs {installed:?})"
        );
    }
    assert!(
        build.contains("cargo build --release --locked -p noops"),
        "the build stage builds something else"
    );
}

#[test]
fn kubectl_get_noops_lists_every_kind() {
    noops_e2e::install_crds();
    let listed = noops_e2e::kubectl_ok(&["api-resources", "--categories=noops", "-o", "name"], None);
    let mut kinds: Vec<&str> = listed.lines().collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "etcdbackups.noops.dev",
            "etcdclusters.noops.dev",
            "kubernetesclusters.noops.dev",
            "kubernetescontrolplanes.noops.dev",
            "machinedeployments.noops.dev",
            "machines.noops.dev",
            "machinesets.noops.dev",
            "maintpages.noops.dev",
            "postgresbackups.noops.dev",
            "postgresqls.noops.dev",
        ]
    );
    // And the category answers as a resource name.
    noops_e2e::kubectl_ok(&["get", "noops", "-A"], None);
}
