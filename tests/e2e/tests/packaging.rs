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

/// The chart's objects with `settings` (`--set` values), by kind/namespace/name.
fn rendered(settings: &[&str]) -> BTreeMap<String, Value> {
    let mut args = vec![
        "template".to_string(),
        "noops".into(),
        root().join("charts/noops").to_str().unwrap().into(),
        "--namespace".into(),
        "noops-system".into(),
    ];
    for setting in settings {
        args.extend(["--set".to_string(), setting.to_string()]);
    }
    let out = Command::new(upstream_bin("helm"))
        .args(&args)
        .output()
        .expect("helm (run `make setup`)");
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    objects(&String::from_utf8_lossy(&out.stdout))
}

/// The objects of files under deploy/, by kind/namespace/name.
fn deployed(files: &[&str]) -> BTreeMap<String, Value> {
    let mut plain = String::new();
    for file in files {
        plain.push_str(&std::fs::read_to_string(root().join("deploy").join(file)).unwrap());
        plain.push_str("\n---\n");
    }
    objects(&plain)
}

fn assert_same(rendered: &BTreeMap<String, Value>, plain: &BTreeMap<String, Value>) {
    assert_eq!(rendered.keys().collect::<Vec<_>>(), plain.keys().collect::<Vec<_>>());
    for (key, object) in plain {
        assert_eq!(&rendered[key], object, "{key} differs between the chart and deploy/");
    }
}

#[test]
fn the_chart_renders_what_deploy_holds() {
    let plain = deployed(&["10-rbac.yaml", "20-operator.yaml", "30-metrics.yaml"]);
    assert_same(&rendered(&[]), &plain);
}

#[test]
fn with_monitoring_on_the_chart_renders_what_deploy_monitoring_holds() {
    let monitoring = [
        "metrics.serviceMonitor.enabled=true",
        "metrics.prometheusRule.enabled=true",
    ];
    let mut chart = rendered(&monitoring);
    let mut plain = deployed(&["10-rbac.yaml", "20-operator.yaml", "30-metrics.yaml"]);
    plain.extend(deployed(&["monitoring/prometheus-operator.yaml"]));
    assert_same(&chart, &plain);
    // The rules are the chart's file of rules.
    let rules: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(root().join("charts/noops/files/prometheus-rules.yaml")).unwrap(),
    )
    .unwrap();
    let rule = chart.remove("PrometheusRule/noops-system/noops").unwrap();
    assert_eq!(rule["spec"]["groups"], rules["groups"]);
    // The dashboard, for Grafana's sidecar, is the chart's dashboard file.
    let mut with_dashboard = rendered(&["metrics.dashboard.enabled=true"]);
    let dashboard = with_dashboard.remove("ConfigMap/noops-system/noops-dashboard").unwrap();
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json = std::fs::read_to_string(root().join("charts/noops/files/dashboard.json")).unwrap();
    assert_eq!(dashboard["data"]["noops.json"].as_str(), Some(json.as_str()));
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
