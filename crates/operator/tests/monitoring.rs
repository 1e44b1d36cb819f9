//! The alerting rules and the dashboard (charts/noops/files/) against what the operator
//! exports: every query parses as PromQL, and every metric it names is one `/metrics` serves.
//! No cluster: the operator's own registry is rendered, with a series of every kind set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use noops::core::metrics::{BackupGauges, Metrics, ReplicaLag, ReplicationGauges};
use noops::core::resource_metrics::{ConditionState, ResourceState};
use promql_parser::parser::Expr;
use promql_parser::util::{ExprVisitor, walk_expr};

fn chart_file(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../charts/noops/files")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The sample names `/metrics` serves: from each `# TYPE` line (so a family with no sample
/// yet counts), with the suffixes of its type.
fn exported() -> BTreeSet<String> {
    let metrics = Metrics::new();
    metrics.set_leader(true);
    metrics.succeeded("etcd", std::time::Duration::from_millis(1));
    metrics.failed("etcd", "EtcdError", std::time::Duration::from_millis(1));
    count_one_request(&metrics);
    metrics.set_etcd_cluster("db", "main", 3, false, true);
    metrics.set_backups(
        "PostgreSQL",
        "db",
        "shop",
        &BackupGauges {
            last_success: Some(1.0),
            interval: Some(1.0),
            last_archived_wal: Some(1.0),
            archiving_failing: Some(false),
            schedule_since: Some(1.0),
        },
    );
    metrics.set_resource_state(
        "EtcdCluster",
        "db",
        "main",
        ResourceState {
            created: Some(1.0),
            phase: Some("Running".into()),
            conditions: vec![ConditionState {
                type_: "Ready".into(),
                holds: true,
                since: Some(1.0),
            }],
        },
    );
    metrics.set_certificate_expiry("EtcdCluster", "db", "main", "main-server", jiff::Timestamp::UNIX_EPOCH);
    metrics.set_replication(
        "db",
        "shop",
        &ReplicationGauges {
            wanted: 2,
            streaming: 2,
            lag: vec![ReplicaLag {
                instance: "shop-1".into(),
                bytes: Some(0),
                seconds: Some(0.0),
            }],
        },
    );
    let text = metrics.render();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    names
}

/// Sends one request through the layer that counts the operator's API requests.
fn count_one_request(metrics: &Metrics) {
    use tower::{Layer, Service};
    struct Answers;
    impl Service<http::Request<()>> for Answers {
        type Response = ();
        type Error = ();
        type Future = std::future::Ready<Result<(), ()>>;
        fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), ()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            std::future::ready(Ok(()))
        }
    }
    let mut counted = metrics.count_requests().layer(Answers);
    let request = http::Request::get("/api/v1/namespaces/db/pods").body(()).unwrap();
    drop(counted.call(request));
}

/// The metric names an expression selects.
fn selected(query: &str) -> Result<BTreeSet<String>, String> {
    struct Names(BTreeSet<String>);
    impl ExprVisitor for Names {
        type Error = String;
        fn pre_visit(&mut self, expr: &Expr) -> Result<bool, String> {
            let selector = match expr {
                Expr::VectorSelector(vs) => Some(vs),
                Expr::MatrixSelector(ms) => Some(&ms.vs),
                _ => None,
            };
            if let Some(selector) = selector {
                let name = selector
                    .name
                    .clone()
                    .ok_or_else(|| format!("a selector without a metric name in {expr}"))?;
                self.0.insert(name);
            }
            Ok(true)
        }
    }
    let expr = promql_parser::parser::parse(query)?;
    let mut names = Names(BTreeSet::new());
    walk_expr(&mut names, &expr)?;
    Ok(names.0)
}

/// What is wrong with `query`: it does not parse, names no metric, or names metrics that are
/// not exported.
fn problems(query: &str, exported: &BTreeSet<String>) -> Option<String> {
    match selected(query) {
        Err(e) => Some(format!("{query:?} does not parse: {e}")),
        Ok(names) => {
            let unknown: Vec<&String> = names.iter().filter(|n| !exported.contains(*n)).collect();
            (!unknown.is_empty() || names.is_empty())
                .then(|| format!("{query:?} names metrics /metrics does not export: {unknown:?}"))
        }
    }
}

#[test]
fn the_checker_catches_a_query_that_cannot_work() {
    let exported = exported();
    assert!(exported.contains("noops_reconciles_total"), "{exported:?}");
    assert!(
        exported.contains("noops_reconcile_duration_seconds_bucket"),
        "{exported:?}"
    );
    assert_eq!(problems("max(noops_leader) == 0", &exported), None);
    assert!(problems("noops_no_such_metric > 0", &exported).is_some());
    assert!(problems("rate(noops_reconciles_total[5m]", &exported).is_some());
    assert!(problems("time() > 0", &exported).is_some(), "names no metric");
}

#[test]
fn every_alert_parses_and_names_only_exported_metrics() {
    let exported = exported();
    let rules: serde_json::Value = serde_saphyr::from_str(&chart_file("prometheus-rules.yaml")).unwrap();
    let mut alerts = Vec::new();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let alert = rule["alert"].as_str().unwrap();
            let expr = rule["expr"].as_str().unwrap();
            if let Some(problem) = problems(expr, &exported) {
                panic!("alert {alert}: {problem}");
            }
            assert!(
                rule["annotations"]["summary"].is_string() && rule["labels"]["severity"].is_string(),
                "alert {alert} has no summary or severity"
            );
            alerts.push(alert.to_string());
        }
    }
    // What the issue asks to alert on, each at least once.
    for wanted in [
        "NoopsEtcdQuorumLost",
        "NoopsEtcdNoLeader",
        "NoopsBackupTooOld",
        "NoopsWalArchivingFailing",
        "NoopsReconcileErrorsRising",
        "NoopsCertificateExpiringSoon",
        "NoopsOperatorAbsent",
        "NoopsBackupNeverSucceeded",
        "NoopsResourceNotReady",
        "NoopsProgressingTooLong",
    ] {
        assert!(alerts.iter().any(|a| a == wanted), "no alert {wanted}: {alerts:?}");
    }
}

/// The alerts of the rules file, by name.
fn alert_names() -> BTreeSet<String> {
    let rules: serde_json::Value = serde_saphyr::from_str(&chart_file("prometheus-rules.yaml")).unwrap();
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect()
}

/// Every alert, evaluated by Prometheus's own rule engine (`promtool test rules`) on series
/// like those the operator serves: quiet before its fault has lasted, firing with the
/// resource's own labels and annotations, resolved once the fault ends.
#[test]
fn promtool_fires_and_resolves_every_alert() {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/monitoring/prometheus-rules.test.yaml");
    let tests: serde_json::Value = serde_saphyr::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let (mut fired, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for test in tests["tests"].as_array().unwrap() {
        for check in test["alert_rule_test"].as_array().unwrap() {
            let alert = check["alertname"].as_str().unwrap().to_string();
            let firing = check["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
            if firing { &mut fired } else { &mut quiet }.insert(alert);
        }
    }
    let alerts = alert_names();
    let not_fired: Vec<&String> = alerts.difference(&fired).collect();
    let never_quiet: Vec<&String> = alerts.difference(&quiet).collect();
    assert!(
        not_fired.is_empty() && never_quiet.is_empty(),
        "{} does not fire {not_fired:?}, or never expects quiet {never_quiet:?}",
        file.display()
    );
    let run = std::process::Command::new("promtool")
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("promtool: {e} (make setup installs Debian's prometheus package)"));
    assert!(
        run.status.success(),
        "promtool test rules:\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
}

#[test]
fn every_dashboard_panel_parses_and_names_only_exported_metrics() {
    let exported = exported();
    let dashboard: serde_json::Value = serde_json::from_str(&chart_file("dashboard.json")).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 10, "{} panels", panels.len());
    for panel in panels {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            if let Some(problem) = problems(expr, &exported) {
                panic!("panel {}: {problem}", panel["title"]);
            }
            // A panel of resources follows the namespace and resource chosen at the top.
            if expr.contains("namespace") {
                assert!(
                    expr.contains(r#"namespace=~"$namespace""#) && expr.contains(r#"=~"$name""#),
                    "panel {} ignores the namespace or resource chosen: {expr}",
                    panel["title"]
                );
            }
        }
    }
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(variables, ["datasource", "namespace", "kind", "name"]);
    for variable in &dashboard["templating"]["list"].as_array().unwrap()[1..] {
        let query = variable["query"]["query"].as_str().unwrap();
        let inner = query
            .strip_prefix("label_values(")
            .and_then(|q| q.rsplit_once(','))
            .map(|(selector, _)| selector)
            .unwrap_or_else(|| panic!("variable query {query}"));
        assert_eq!(problems(inner, &exported), None, "variable {}", variable["name"]);
    }
}
