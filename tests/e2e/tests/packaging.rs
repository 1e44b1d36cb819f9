//! Packaging: the Helm chart renders the same objects as the plain manifests in deploy/, and
//! carries the same CRDs; the image's build stage installs what `make setup` installs for
//! cargo. Needs helm (built by `make setup`); only the last test needs the local Kubernetes:
//! `kubectl get noops` lists every kind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use noops_e2e::chart::template;
use noops_e2e::root;
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
    let yaml = template("noops", "noops-system", settings).unwrap_or_else(|e| panic!("helm template: {e}"));
    objects(&yaml)
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

/// The operator's pod template as the chart renders it with `settings`.
fn operator_pod(settings: &[&str]) -> Value {
    rendered(settings)["Deployment/noops-system/noops-operator"]["spec"]["template"].clone()
}

#[test]
fn every_value_of_the_chart_renders() {
    // Pull secrets: on the operator's pod, and passed on for the pods it makes.
    let pod = operator_pod(&["imagePullSecrets[0].name=regcred", "imagePullSecrets[1].name=mirror"]);
    assert_eq!(
        pod["spec"]["imagePullSecrets"],
        serde_json::json!([{"name": "regcred"}, {"name": "mirror"}])
    );
    let args = pod["spec"]["containers"][0]["args"].as_array().unwrap();
    assert!(args.contains(&"--image-pull-secrets=regcred,mirror".into()), "{args:?}");
    // Scheduling.
    let pod = operator_pod(&[
        "nodeSelector.pool=system",
        "tolerations[0].key=dedicated",
        "tolerations[0].operator=Exists",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=zone",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        "priorityClassName=system-cluster-critical",
        "spreadAcrossNodes=DoNotSchedule",
        "topologySpreadConstraints[0].maxSkew=1",
        "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
        "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
    ]);
    let spec = &pod["spec"];
    assert_eq!(spec["nodeSelector"], serde_json::json!({"pool": "system"}));
    assert_eq!(
        spec["tolerations"],
        serde_json::json!([{"key": "dedicated", "operator": "Exists"}])
    );
    let term =
        &spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0];
    assert_eq!(term["matchExpressions"][0]["key"], "zone");
    assert_eq!(spec["priorityClassName"], "system-cluster-critical");
    let spread = spec["topologySpreadConstraints"].as_array().unwrap();
    assert_eq!(spread.len(), 2, "{spread:?}");
    assert_eq!(spread[0]["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(spread[0]["whenUnsatisfiable"], "DoNotSchedule");
    assert_eq!(spread[0]["labelSelector"]["matchLabels"], pod["metadata"]["labels"]);
    assert_eq!(spread[1]["topologyKey"], "topology.kubernetes.io/zone");
    // By default the replicas spread over nodes, where nodes allow, and what Pod Security
    // "restricted" asks of a pod is there (the e2e test below installs it under that level).
    let pod = operator_pod(&[]);
    assert_eq!(
        pod["spec"]["topologySpreadConstraints"][0]["whenUnsatisfiable"],
        "ScheduleAnyway"
    );
    assert_eq!(
        pod["spec"]["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true);
    assert!(operator_pod(&["spreadAcrossNodes="])["spec"]["topologySpreadConstraints"].is_null());
    // Labels a Prometheus selects its ServiceMonitors and rules by (kube-prometheus-stack's
    // `release`), beside the chart's own.
    let monitoring = rendered(&[
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.labels.release=kps",
        "metrics.prometheusRule.enabled=true",
        "metrics.prometheusRule.labels.release=kps",
        "metrics.prometheusRule.labels.team=platform",
    ]);
    let monitor = &monitoring["ServiceMonitor/noops-system/noops-operator"]["metadata"]["labels"];
    assert_eq!(monitor["release"], "kps");
    assert_eq!(monitor["app.kubernetes.io/name"], "noops-operator");
    let rule = &monitoring["PrometheusRule/noops-system/noops"]["metadata"]["labels"];
    assert_eq!(
        (&rule["release"], &rule["team"], &rule["app.kubernetes.io/name"]),
        (&"kps".into(), &"platform".into(), &"noops-operator".into())
    );
    // The budget: on by default, its bound a value, or none.
    let budget =
        &rendered(&["podDisruptionBudget.maxUnavailable=2"])["PodDisruptionBudget/noops-system/noops-operator"];
    assert_eq!(budget["spec"]["maxUnavailable"], 2);
    assert!(
        !rendered(&["podDisruptionBudget.enabled=false"])
            .keys()
            .any(|k| k.starts_with("PodDisruptionBudget/"))
    );
}

#[test]
fn names_come_from_the_release_so_two_releases_share_nothing() {
    let other = objects(&template("edge", "edge-system", &[]).unwrap());
    let names: Vec<&String> = other.keys().collect();
    for key in [
        "ClusterRole//edge-noops-operator",
        "ClusterRoleBinding//edge-noops-operator",
        "Deployment/edge-system/edge-noops-operator",
        "ServiceAccount/edge-system/edge-noops",
        "Role/edge-system/edge-noops-leader-election",
        "PodDisruptionBudget/edge-system/edge-noops-operator",
        "Service/edge-system/edge-noops-operator-metrics",
    ] {
        assert!(other.contains_key(key), "no {key} in {names:?}");
    }
    let deployment = &other["Deployment/edge-system/edge-noops-operator"];
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap();
    assert!(args.contains(&"--lease-name=edge-noops-operator".into()), "{args:?}");
    let selector = &deployment["spec"]["selector"]["matchLabels"];
    assert_eq!(selector["app.kubernetes.io/name"], "edge-noops-operator");
    let role = &other["Role/edge-system/edge-noops-leader-election"];
    assert_eq!(
        role["rules"][1]["resourceNames"],
        serde_json::json!(["edge-noops-operator"])
    );
    // fullnameOverride names everything.
    let named = objects(&template("edge", "edge-system", &["fullnameOverride=db-operators"]).unwrap());
    assert!(
        named.contains_key("Deployment/edge-system/db-operators-operator"),
        "{:?}",
        named.keys()
    );
}

#[test]
fn watching_given_namespaces_grants_roles_there_and_reads_nodes_cluster_wide() {
    let chart = rendered(&["namespaces={shop,billing}"]);
    let cluster_wide = &chart["ClusterRole//noops-operator"]["rules"];
    let resources: Vec<&str> = cluster_wide
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["resources"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()))
        .collect();
    assert_eq!(resources, ["nodes", "servicecidrs", "persistentvolumes"]);
    // Each watched namespace: a Role with everything else the ClusterRole holds by default.
    let everything = rendered(&[])["ClusterRole//noops-operator"]["rules"]
        .as_array()
        .unwrap()
        .clone();
    let namespaced: Vec<&Value> = everything
        .iter()
        .filter(|r| !cluster_wide.as_array().unwrap().contains(r))
        .collect();
    for namespace in ["shop", "billing"] {
        let role = &chart[&format!("Role/{namespace}/noops-operator")];
        assert_eq!(role["rules"].as_array().unwrap().iter().collect::<Vec<_>>(), namespaced);
        let binding = &chart[&format!("RoleBinding/{namespace}/noops-operator")];
        assert_eq!(binding["subjects"][0]["namespace"], "noops-system");
        assert_eq!(binding["roleRef"]["kind"], "Role");
    }
}

#[test]
fn an_unknown_or_mistyped_value_is_refused() {
    for setting in [
        "nodeSelektor.pool=system",
        "image.pullpolicy=Always",
        "imagePullSecrets=regcred",
        "logFormat=yaml",
        "spreadAcrossNodes=Always",
        "podDisruptionBudget.minAvailable=1",
        "metrics.serviceMonitor.labels.release=1",
        "metrics.serviceMonitor.enable=true",
    ] {
        let refused = template("noops", "noops-system", &[setting]);
        assert!(refused.is_err(), "{setting} was taken");
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

/// Removes the cluster-wide objects of a release when the test ends, however it ends.
struct ClusterWideOf(String);

impl Drop for ClusterWideOf {
    fn drop(&mut self) {
        let name = format!("{}-noops-operator", self.0);
        let _ = noops_e2e::kubectl(
            &["delete", "clusterrole,clusterrolebinding", &name, "--ignore-not-found"],
            None,
        );
    }
}

#[tokio::test]
async fn the_chart_with_its_defaults_runs_under_pod_security_restricted() {
    use noops_e2e::{TestNamespace, kubectl_ok};
    noops_e2e::install_crds();
    // The operator's namespace enforces "restricted"; it watches another one only, so that it
    // leaves the other tests' resources alone (and its Roles are what lets it act there).
    let home = TestNamespace::new("chart-home").await;
    let watched = TestNamespace::new("chart-watched").await;
    kubectl_ok(
        &[
            "label",
            "namespace",
            &home.name,
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/enforce-version=latest",
        ],
        None,
    );
    let release = format!("r{}", &home.name[home.name.len() - 6..]);
    let _cleanup = ClusterWideOf(release.clone());
    let namespaces = format!("namespaces={{{}}}", watched.name);
    let yaml = template(&release, &home.name, &[&namespaces, "controllers={maintpage}"]).unwrap();
    // Rejected pods would show as a ReplicaSet that never gets them, so the rollout waits.
    // Every namespaced object names its namespace (the Role in the watched one too).
    let applied = noops_e2e::kubectl(&["apply", "-f", "-"], Some(&yaml));
    assert!(applied.status.success(), "{}", String::from_utf8_lossy(&applied.stderr));
    let warnings = String::from_utf8_lossy(&applied.stderr).to_string();
    assert!(!warnings.contains("violate PodSecurity"), "{warnings}");
    let deployment = format!("deployment/{release}-noops-operator");
    let rolled = noops_e2e::kubectl(
        &["rollout", "status", "-n", &home.name, &deployment, "--timeout=180s"],
        None,
    );
    if !rolled.status.success() {
        let events = kubectl_ok(&["get", "events", "-n", &home.name], None);
        panic!("{}\n{events}", String::from_utf8_lossy(&rolled.stderr));
    }
    // And it works there with the rights the chart gave it.
    watched.apply(
        r#"
apiVersion: noops.dev/v1alpha1
kind: MaintPage
metadata: { name: web }
spec:
  app: { name: web, image: "hashicorp/http-echo:1.0", args: ["-text=app", "-listen=:8080"], replicas: 1 }
  maintenance: { image: "hashicorp/http-echo:1.0", args: ["-text=down", "-listen=:8080"], enabled: false }
"#,
    );
    kubectl_ok(
        &[
            "wait",
            "-n",
            &watched.name,
            "--for=condition=Ready",
            "maintpage/web",
            "--timeout=180s",
        ],
        None,
    );
}
