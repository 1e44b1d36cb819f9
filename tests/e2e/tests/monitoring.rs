//! The alerts in a real Prometheus (Debian's, run as a process on 127.0.0.1) scraping a real
//! operator on the local Kubernetes, as the chart's ServiceMonitor has it scraped (its
//! `honorLabels`, and the target's own `namespace` label that Prometheus would give it):
//! - two of three etcd members frozen fire NoopsEtcdQuorumLost and NoopsResourceNotReady
//!   naming the EtcdCluster's own namespace and name, and both resolve once they thaw;
//! - the operator gone fires NoopsOperatorAbsent, which resolves once an operator is back.
//!
//! The rules are the chart's, each `for:` cut to seconds so the test takes minutes, not hours;
//! `promtool test rules` (crates/operator/tests/monitoring.rs) checks the real durations.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use noops_e2e::etcd::*;
use noops_e2e::frozen::Frozen;
use noops_e2e::*;
use serde_json::Value;

const MINUTE: Duration = Duration::from_secs(60);
/// Every alert's `for:` here (the real ones are minutes to an hour).
const FOR: &str = "2s";
/// The namespace the operator's pods run in, as a ServiceMonitor's target would be labelled.
const OPERATOR_NAMESPACE: &str = "noops-system";

/// A Prometheus process with its own folder, scraping the targets of `targets.json`; killed
/// when dropped.
struct Prometheus {
    child: Child,
    dir: PathBuf,
    address: String,
}

impl Prometheus {
    fn start(name: &str, operator: &Operator) -> Self {
        let dir = std::env::temp_dir().join(format!("noops-prometheus-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("rules.yaml"), rules_with_short_waits()).unwrap();
        let config = format!(
            "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\n\
             rule_files: [rules.yaml]\n\
             scrape_configs:\n\
             \x20 - job_name: noops\n\
             \x20   honor_labels: {}\n\
             \x20   file_sd_configs: [{{ files: [targets.json], refresh_interval: 1s }}]\n",
            chart_honors_labels()
        );
        std::fs::write(dir.join("prometheus.yaml"), config).unwrap();
        let address = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .current_dir(&dir)
            .arg("--config.file=prometheus.yaml")
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={address}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus (make setup installs Debian's prometheus package)");
        let prometheus = Self { child, dir, address };
        prometheus.scrape(operator);
        prometheus
    }

    /// Scrapes `operator` (the only target), labelled as the ServiceMonitor's target would be.
    fn scrape(&self, operator: &Operator) {
        let targets = serde_json::json!([{
            "targets": [operator.http],
            "labels": { "namespace": OPERATOR_NAMESPACE, "job": "noops-operator-metrics" },
        }]);
        let file = self.dir.join("targets.json");
        let tmp = self.dir.join("targets.json.tmp");
        std::fs::write(&tmp, targets.to_string()).unwrap();
        std::fs::rename(tmp, file).unwrap();
    }

    async fn api(&self, path: &str) -> Option<Value> {
        let body = http_get(&self.address, path).await?;
        let answer: Value = serde_json::from_str(&body).ok()?;
        (answer["status"] == "success").then(|| answer["data"].clone())
    }

    /// The alerts firing now, by their labels.
    async fn firing(&self) -> Option<Vec<Value>> {
        let data = self.api("/api/v1/alerts").await?;
        Some(
            data["alerts"]
                .as_array()?
                .iter()
                .filter(|a| a["state"] == "firing")
                .map(|a| a["labels"].clone())
                .collect(),
        )
    }

    /// Waits until alert `name` fires with `labels` among its labels, and returns its labels.
    async fn wait_firing(&self, name: &str, labels: &[(&str, &str)]) -> Value {
        wait_for(&format!("alert {name} {labels:?} firing"), 3 * MINUTE, || async {
            self.firing()
                .await?
                .into_iter()
                .find(|alert| alert["alertname"] == name && labels.iter().all(|(k, v)| alert[*k] == *v))
        })
        .await
    }

    /// Waits until no alert `name` with `labels` fires (nor waits to).
    async fn wait_resolved(&self, name: &str, labels: &[(&str, &str)]) {
        wait_until(&format!("alert {name} {labels:?} resolved"), 3 * MINUTE, || async {
            let Some(data) = self.api("/api/v1/alerts").await else {
                return false;
            };
            !data["alerts"].as_array().into_iter().flatten().any(|alert| {
                let l = &alert["labels"];
                l["alertname"] == name && labels.iter().all(|(k, v)| l[*k] == *v)
            })
        })
        .await
    }

    /// Waits until a scrape has brought a series of `metric` with `labels` valued `value`.
    async fn wait_series(&self, metric: &str, labels: &[(&str, &str)], value: &str) {
        wait_until(
            &format!("{metric} {labels:?} = {value} scraped"),
            2 * MINUTE,
            || async {
                let Some(data) = self.api(&format!("/api/v1/query?query={metric}")).await else {
                    return false;
                };
                data["result"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|series| labels.iter().all(|(k, v)| series["metric"][*k] == *v) && series["value"][1] == value)
            },
        )
        .await
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Its log stays for a failed test to be read; its data goes.
        let _ = std::fs::remove_dir_all(self.dir.join("data"));
    }
}

/// The chart's rules, each `for:` cut to [`FOR`].
fn rules_with_short_waits() -> String {
    let rules = std::fs::read_to_string(root().join("charts/noops/files/prometheus-rules.yaml")).unwrap();
    rules
        .lines()
        .map(|line| match line.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: {FOR}", &line[..line.len() - line.trim_start().len()]),
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether the chart's ServiceMonitor keeps the operator's own labels (`honorLabels`).
fn chart_honors_labels() -> bool {
    let plain = std::fs::read_to_string(root().join("deploy/monitoring/prometheus-operator.yaml")).unwrap();
    let monitor = plain
        .split("\n---\n")
        .find(|doc| doc.contains("kind: ServiceMonitor"))
        .expect("a ServiceMonitor in deploy/monitoring");
    let monitor: Value = serde_saphyr::from_str(monitor).unwrap();
    monitor["spec"]["endpoints"][0]["honorLabels"] == true
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap()
}

#[tokio::test]
async fn alerts_fire_in_prometheus_with_the_resources_own_namespace_and_name_and_resolve() {
    // Its own CRDs: on a fresh cluster this test may run first.
    install_crds();
    let ns = TestNamespace::new("e2e-monitoring").await;
    let mut operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    let prometheus = Prometheus::start(&ns.name, &operator);
    ns.apply(&cluster_manifest("main", 3, &etcd_version("3.5"), ""));
    wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
    let cluster = [("namespace", ns.name.as_str()), ("cluster", "main")];
    let resource = [
        ("kind", "EtcdCluster"),
        ("namespace", ns.name.as_str()),
        ("name", "main"),
    ];
    let ready_series = [resource.as_slice(), &[("condition", "Ready")]].concat();
    // Seen Ready by Prometheus first, so what fires next is the fault's doing.
    prometheus
        .wait_series("noops_resource_condition", &ready_series, "1")
        .await;
    prometheus.wait_resolved("NoopsResourceNotReady", &resource).await;

    // Two of three members frozen: the quorum is lost.
    let members = ns
        .pods()
        .list(&ListParams::default().labels("noops.dev/etcdcluster=main,app.kubernetes.io/component=member"))
        .await
        .unwrap()
        .items;
    assert_eq!(members.len(), 3);
    let frozen: Vec<Frozen> = members[..2].iter().map(|p| Frozen::pod_uid(&uid(p))).collect();
    let lost = prometheus.wait_firing("NoopsEtcdQuorumLost", &cluster).await;
    // The resource's own namespace, not the operator's (nor renamed to exported_namespace).
    assert!(lost.get("exported_namespace").is_none(), "{lost}");
    let not_ready = prometheus.wait_firing("NoopsResourceNotReady", &resource).await;
    assert_eq!(not_ready["severity"], "warning", "{not_ready}");
    for f in frozen {
        f.thaw();
    }
    wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;
    prometheus.wait_resolved("NoopsEtcdQuorumLost", &cluster).await;
    prometheus.wait_resolved("NoopsResourceNotReady", &resource).await;

    // The operator gone: nothing serves noops_leader any more.
    prometheus.wait_resolved("NoopsOperatorAbsent", &[]).await;
    operator.kill();
    let absent = prometheus.wait_firing("NoopsOperatorAbsent", &[]).await;
    assert_eq!(absent["severity"], "critical", "{absent}");
    let operator = Operator::start(&ns.name, &["--controllers", "etcd"]);
    prometheus.scrape(&operator);
    prometheus.wait_resolved("NoopsOperatorAbsent", &[]).await;
    // And the state series come back from the new operator's cache.
    prometheus
        .wait_series("noops_resource_condition", &ready_series, "1")
        .await;
}
