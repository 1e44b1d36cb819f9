//! The MaintPage operator on the local Kubernetes: switching with no failed request, reverting
//! hand edits, cleanup, validation, restarts mid-switch, leader election, metrics, and the
//! operator running in the cluster as a pod. Needs `make cluster-up`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Service};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use noops_api::MaintPage;
use noops_api::maintpage::Side;
use noops_e2e::*;

/// What a container that cannot get its image waits with: the node agent's reason, or a
/// kubelet's (real nodes) before and after its back-off.
const PULL_FAILED: [&str; 3] = ["ImageNotMapped", "ErrImagePull", "ImagePullBackOff"];
const MINUTE: Duration = Duration::from_secs(60);

fn manifest(name: &str, enabled: bool) -> String {
    format!(
        r#"
apiVersion: noops.dev/v1alpha1
kind: MaintPage
metadata: {{ name: {name} }}
spec:
  app:
    name: {name}
    image: hashicorp/http-echo:1.0
    args: ["-text=app page", "-listen=:8080"]
    replicas: 2
  maintenance:
    image: hashicorp/http-echo:1.0
    args: ["-text=maintenance page", "-listen=:8080"]
    enabled: {enabled}
"#
    )
}

async fn wait_ready(ns: &TestNamespace, name: &str) -> MaintPage {
    let api: Api<MaintPage> = ns.api();
    wait_for(&format!("MaintPage {name} Ready"), 2 * MINUTE, || async {
        api.get_opt(name).await.ok().flatten().filter(|mp| {
            let status = mp.status.clone().unwrap_or_default();
            status.observed_generation == mp.metadata.generation
                && status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    })
    .await
}

async fn set_enabled(ns: &TestNamespace, name: &str, enabled: bool) {
    let api: Api<MaintPage> = ns.api();
    let patch = serde_json::json!({ "spec": { "maintenance": { "enabled": enabled } } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Waits until the Service at `addr` answers with `page`.
async fn wait_for_page(addr: &str, page: &str, what: &str) {
    wait_until(what, MINUTE, || async {
        http_get(addr, "/").await.is_some_and(|b| b.trim() == page)
    })
    .await;
}

async fn maintenance_replicas(deployments: &Api<Deployment>) -> Option<i32> {
    deployments
        .get("shop-maintenance")
        .await
        .unwrap()
        .spec
        .unwrap()
        .replicas
}

async fn cluster_ip(ns: &TestNamespace, name: &str) -> String {
    ns.api::<Service>()
        .get(name)
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap()
}

async fn events(ns: &TestNamespace) -> Vec<Event> {
    ns.api::<Event>().list(&ListParams::default()).await.unwrap().items
}

async fn has_event(ns: &TestNamespace, reason: &str) -> bool {
    events(ns).await.iter().any(|e| e.reason.as_deref() == Some(reason))
}

/// Polls the Service every 50 ms until stopped; returns every answer in order ("FAIL after
/// N ms" for a failed request).
fn poll(addr: String, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut seen = vec![];
        while !stop.load(Ordering::Relaxed) {
            let started = std::time::Instant::now();
            // A failure says how long it took: a refusal is quick, a lost packet times out.
            let answer = http_get_within(&addr, "/", Duration::from_secs(10))
                .await
                .map(|b| b.trim().to_string())
                .unwrap_or_else(|| format!("FAIL after {} ms", started.elapsed().as_millis()));
            seen.push(answer);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seen
    })
}

#[tokio::test]
async fn toggling_switches_the_service_with_no_failed_request() {
    install_crds();
    let ns = TestNamespace::new("mp-toggle").await;
    let operator = Operator::start(&ns.name, &["--leader-elect=false"]);
    ns.apply(&manifest("shop", false));
    wait_ready(&ns, "shop").await;
    let addr = format!("{}:80", cluster_ip(&ns, "shop").await);
    wait_for_page(&addr, "app page", "the app answering through the Service").await;
    // Settled, a pass reads its children from the caches and writes nothing: no API request.
    wait_ready(&ns, "shop").await;
    let requests = operator
        .requests_of_settled_passes(&ns, "maintpage/shop", "maintpage")
        .await;
    assert!(
        requests.is_empty(),
        "a settled MaintPage's passes made API requests: {requests:?}"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let poller = poll(addr.clone(), stop.clone());
    set_enabled(&ns, "shop", true).await;
    let mp = wait_ready(&ns, "shop").await;
    assert_eq!(mp.status.unwrap().published, Some(Side::Maintenance));
    wait_for_page(&addr, "maintenance page", "the maintenance page answering").await;
    set_enabled(&ns, "shop", false).await;
    let mp = wait_ready(&ns, "shop").await;
    assert_eq!(mp.status.unwrap().published, Some(Side::App));
    wait_for_page(&addr, "app page", "the app answering again").await;
    // Past the drain, the maintenance pods are gone.
    let deployments: Api<Deployment> = ns.api();
    wait_until("maintenance scaled to zero", MINUTE, || async {
        maintenance_replicas(&deployments).await == Some(0)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let seen = poller.await.unwrap();

    let failures = seen.iter().filter(|s| s.starts_with("FAIL")).count();
    assert_eq!(failures, 0, "failed requests during the switch: {seen:?}");
    let mut phases: Vec<&str> = seen.iter().map(String::as_str).collect();
    phases.dedup();
    assert_eq!(
        phases,
        vec!["app page", "maintenance page", "app page"],
        "answers in order"
    );
    assert!(has_event(&ns, "SwitchedToMaintenance").await && has_event(&ns, "SwitchedToApp").await);
}

#[tokio::test]
async fn hand_edits_of_the_image_and_the_selector_are_reverted() {
    install_crds();
    let ns = TestNamespace::new("mp-drift").await;
    let _operator = Operator::start(&ns.name, &["--leader-elect=false"]);
    ns.apply(&manifest("shop", false));
    wait_ready(&ns, "shop").await;

    kubectl_ok(
        &["set", "image", "-n", &ns.name, "deployment/shop", "app=nginx:1.27"],
        None,
    );
    let deployments: Api<Deployment> = ns.api();
    let image = |d: Deployment| {
        d.spec.unwrap().template.spec.unwrap().containers[0]
            .image
            .clone()
            .unwrap()
    };
    wait_until("the image set back", Duration::from_secs(5), || async {
        image(deployments.get("shop").await.unwrap()) == "hashicorp/http-echo:1.0"
    })
    .await;
    wait_until("an ImageReverted event", Duration::from_secs(5), || {
        has_event(&ns, "ImageReverted")
    })
    .await;

    let selector = r#"{"spec":{"selector":{"app.kubernetes.io/component":"maintenance"}}}"#;
    kubectl_ok(
        &["patch", "-n", &ns.name, "service/shop", "--type=merge", "-p", selector],
        None,
    );
    let services: Api<Service> = ns.api();
    wait_until("the selector set back", Duration::from_secs(5), || async {
        let svc = services.get("shop").await.unwrap();
        svc.spec
            .unwrap()
            .selector
            .unwrap()
            .get("app.kubernetes.io/component")
            .map(String::as_str)
            == Some("app")
    })
    .await;
    wait_until("a SelectorReverted event", Duration::from_secs(5), || {
        has_event(&ns, "SelectorReverted")
    })
    .await;
}

#[tokio::test]
async fn deleting_a_maintpage_deletes_what_it_owns() {
    install_crds();
    let ns = TestNamespace::new("mp-delete").await;
    let _operator = Operator::start(&ns.name, &["--leader-elect=false"]);
    ns.apply(&manifest("shop", true));
    wait_ready(&ns, "shop").await;
    kubectl_ok(&["delete", "-n", &ns.name, "maintpage/shop", "--wait=true"], None);
    let deployments: Api<Deployment> = ns.api();
    let services: Api<Service> = ns.api();
    wait_until("Deployments and Service garbage-collected", MINUTE, || async {
        deployments.list(&ListParams::default()).await.unwrap().items.is_empty()
            && services.get_opt("shop").await.unwrap().is_none()
    })
    .await;
}

/// Specs the API server must refuse, each with the words its message must contain.
const INVALID: &[(&str, &str, &str)] = &[
    (
        "name not a DNS label",
        r#"app: { name: Shop_1, image: x }"#,
        "app.name must be a DNS label",
    ),
    (
        "name ending with a dash",
        r#"app: { name: shop-, image: x }"#,
        "app.name must be a DNS label",
    ),
    (
        "name too long",
        r#"app: { name: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa, image: x }"#,
        "may not be more than 51",
    ),
    (
        "empty image",
        r#"app: { name: shop, image: "" }"#,
        "app.image must be a container image reference",
    ),
    (
        "image with a space",
        r#"app: { name: shop, image: "nginx latest" }"#,
        "app.image must be a container image reference",
    ),
    (
        "port zero",
        r#"app: { name: shop, image: x, port: 0 }"#,
        "should be greater than or equal to 1",
    ),
    (
        "port too high",
        r#"app: { name: shop, image: x, port: 70000 }"#,
        "should be less than or equal to 65535",
    ),
    (
        "negative replicas",
        r#"app: { name: shop, image: x, replicas: -1 }"#,
        "should be greater than or equal to 0",
    ),
    ("missing image", r#"app: { name: shop }"#, "Required value"),
];

/// The same for the maintenance and service parts.
const INVALID_REST: &[(&str, &str, &str)] = &[
    (
        "zero maintenance replicas",
        r#"maintenance: { image: x, replicas: 0 }"#,
        "should be greater than or equal to 1",
    ),
    (
        "maintenance image with a space",
        r#"maintenance: { image: "a b" }"#,
        "maintenance.image must be a container image",
    ),
    (
        "nodePort without NodePort type",
        r#"{ maintenance: { image: x }, service: { nodePort: 30100 } }"#,
        "only allowed with service.type NodePort",
    ),
    (
        "unknown service type",
        r#"{ maintenance: { image: x }, service: { type: LoadBalancer } }"#,
        "Unsupported value",
    ),
    (
        "unknown field",
        r#"{ maintenance: { image: x, enabeld: true } }"#,
        "unknown field",
    ),
];

fn invalid_manifest(name: &str, app: &str, rest: &str) -> String {
    let rest = if rest.starts_with('{') {
        rest.trim_matches(|c| c == '{' || c == '}').to_string()
    } else {
        rest.to_string()
    };
    format!(
        "apiVersion: noops.dev/v1alpha1\nkind: MaintPage\nmetadata: {{ name: {name} }}\nspec: {{ {app}, {rest} }}\n"
    )
}

#[tokio::test]
async fn invalid_specs_are_rejected_with_a_message_that_says_what_to_fix() {
    install_crds();
    let ns = TestNamespace::new("mp-invalid").await;
    let mut operator = Operator::start(&ns.name, &["--leader-elect=false"]);
    let mut cases = vec![];
    for (what, app, expected) in INVALID {
        cases.push((
            *what,
            invalid_manifest("bad", app, "maintenance: { image: x }"),
            *expected,
        ));
    }
    for (what, rest, expected) in INVALID_REST {
        cases.push((
            *what,
            invalid_manifest("bad", "app: { name: shop, image: x }", rest),
            *expected,
        ));
    }
    assert!(cases.len() >= 10);
    for (what, yaml, expected) in &cases {
        let out = kubectl(&["apply", "-n", &ns.name, "-f", "-"], Some(yaml));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: accepted but must be rejected:\n{yaml}");
        assert!(
            stderr.contains(expected),
            "{what}: message {stderr:?} lacks {expected:?}"
        );
    }

    // A MaintPage name labels what it owns, so it must fit in a label value.
    let long = invalid_manifest(
        &"a".repeat(64),
        "app: { name: shop, image: x }",
        "maintenance: { image: x }",
    );
    let out = kubectl(&["apply", "-n", &ns.name, "-f", "-"], Some(&long));
    assert!(!out.status.success(), "a 64-character name must be refused");
    assert!(String::from_utf8_lossy(&out.stderr).contains("at most 63 characters"));

    // Renaming the app of an existing MaintPage is refused (it would orphan the old app).
    ns.apply(&manifest("shop", false));
    let renamed = manifest("shop", false).replacen("name: shop\n    image", "name: boutique\n    image", 1);
    let out = kubectl(&["apply", "-n", &ns.name, "-f", "-"], Some(&renamed));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("app.name is immutable"));

    // A name that is taken by someone else's Deployment is reported, and that Deployment is left
    // alone.
    ns.apply(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: { name: taken }
spec:
  replicas: 0
  selector: { matchLabels: { app: taken } }
  template:
    metadata: { labels: { app: taken } }
    spec: { containers: [{ name: c, image: "someone/else:1" }] }
"#,
    );
    ns.apply(&manifest("taken", false));
    let api: Api<MaintPage> = ns.api();
    let degraded = wait_for("a NameConflict condition", MINUTE, || async {
        let mp = api.get("taken").await.ok()?;
        mp.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Degraded" && c.status == "True")
    })
    .await;
    assert_eq!(degraded.reason, "NameConflict");
    assert!(
        degraded.message.contains("Deployment \"taken\" already exists"),
        "{}",
        degraded.message
    );
    let deployments: Api<Deployment> = ns.api();
    let theirs = deployments.get("taken").await.unwrap();
    assert_eq!(
        theirs.spec.unwrap().template.spec.unwrap().containers[0]
            .image
            .as_deref(),
        Some("someone/else:1")
    );
    assert!(theirs.metadata.owner_references.is_none(), "not adopted");
    wait_until("a NameConflict event", Duration::from_secs(10), || {
        has_event(&ns, "NameConflict")
    })
    .await;
    assert!(
        operator.running(),
        "the operator survived every bad spec:\n{}",
        operator.log_text()
    );
    assert!(
        operator
            .metric("noops_reconcile_errors_total{controller=\"maintpage\",reason=\"NameConflict\"}")
            .await
            .is_some()
    );
}

#[tokio::test]
async fn an_operator_killed_mid_switch_finishes_it_after_a_restart() {
    install_crds();
    let ns = TestNamespace::new("mp-restart").await;
    // The maintenance page takes 4 s to start listening: a window to kill the operator in.
    // A real node runs busybox's own web server; the node agent's busybox is this machine's
    // shell, which runs the http-echo built here.
    let page = if noops_e2e::on_real_nodes() {
        "mkdir -p /tmp/www && echo maintenance >/tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www".to_string()
    } else {
        format!(
            "exec {} -text=maintenance -listen=:8080",
            root().join("target/debug/http-echo").display()
        )
    };
    let slow = manifest("shop", false).replace(
        "image: hashicorp/http-echo:1.0\n    args: [\"-text=maintenance page\", \"-listen=:8080\"]",
        &format!("image: busybox\n    args: [\"sh\", \"-c\", \"sleep 4; {page}\"]"),
    );
    assert!(slow.contains("busybox"));
    let mut operator = Operator::start(&ns.name, &["--leader-elect=false"]);
    ns.apply(&slow);
    wait_ready(&ns, "shop").await;
    set_enabled(&ns, "shop", true).await;
    let api: Api<MaintPage> = ns.api();
    let deployments: Api<Deployment> = ns.api();
    wait_until("the maintenance pods to be started", MINUTE, || async {
        maintenance_replicas(&deployments).await == Some(1)
    })
    .await;
    operator.kill();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let status = api.get("shop").await.unwrap().status.unwrap();
    assert_eq!(
        status.published,
        Some(Side::App),
        "nobody switched while the operator was down"
    );

    let _restarted = Operator::start(&ns.name, &["--leader-elect=false"]);
    let mp = wait_ready(&ns, "shop").await;
    assert_eq!(mp.status.unwrap().published, Some(Side::Maintenance));
    let selector = ns
        .api::<Service>()
        .get("shop")
        .await
        .unwrap()
        .spec
        .unwrap()
        .selector
        .unwrap();
    assert_eq!(selector["app.kubernetes.io/component"], "maintenance");
}

#[tokio::test]
async fn of_two_replicas_one_leads_and_the_other_takes_over_when_it_dies() {
    install_crds();
    let ns = TestNamespace::new("mp-leader").await;
    let args = ["--lease-duration-seconds", "4"];
    let mut first = Operator::start(&ns.name, &args);
    // The gauge reads 0 while the replica campaigns: the first takes the free lease soon after.
    wait_until(
        "the first replica leading (it takes the free lease)",
        MINUTE,
        || async { first.metric("noops_leader").await == Some(1.0) },
    )
    .await;
    let second = Operator::start(&ns.name, &args);
    wait_until("the second replica standing by", MINUTE, || async {
        second.metric("noops_leader").await == Some(0.0)
    })
    .await;

    ns.apply(&manifest("shop", false));
    wait_ready(&ns, "shop").await;
    let reconciles = "noops_reconciles_total{controller=\"maintpage\",result=\"success\"}";
    assert!(
        first.metric(reconciles).await.unwrap_or(0.0) >= 1.0,
        "the leader reconciles"
    );
    assert_eq!(second.metric(reconciles).await, None, "the standby does not");

    first.kill();
    let started = std::time::Instant::now();
    wait_until("the standby to take over", MINUTE, || async {
        second.metric("noops_leader").await == Some(1.0)
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "takeover within the lease time: {:?}",
        started.elapsed()
    );
    set_enabled(&ns, "shop", true).await;
    let mp = wait_ready(&ns, "shop").await;
    assert_eq!(
        mp.status.unwrap().published,
        Some(Side::Maintenance),
        "the new leader reconciles"
    );
}

#[tokio::test]
async fn kubectl_wait_printer_columns_and_metrics_work() {
    install_crds();
    let ns = TestNamespace::new("mp-kubectl").await;
    let operator = Operator::start(&ns.name, &["--leader-elect=false"]);
    let reconciles = "noops_reconciles_total{controller=\"maintpage\",result=\"success\"}";
    let before = operator.metric(reconciles).await.unwrap_or(0.0);
    ns.apply(&manifest("shop", false));
    kubectl_ok(
        &[
            "wait",
            "-n",
            &ns.name,
            "--for=condition=Ready",
            "maintpage/shop",
            "--timeout=120s",
        ],
        None,
    );
    let table = kubectl_ok(&["get", "-n", &ns.name, "maintpages"], None);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, vec!["NAME", "APP", "MAINTENANCE", "PUBLISHED", "READY", "AGE"]);
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..5], &["shop", "shop", "false", "app", "True"]);
    let after = operator.metric(reconciles).await.unwrap();
    assert!(after > before, "reconcile counter moved: {before} → {after}");
    // Once stable, the status is not rewritten: the object stays at its version.
    let api: Api<MaintPage> = ns.api();
    let version = |mp: MaintPage| mp.metadata.resource_version;
    let settled = version(api.get("shop").await.unwrap());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        version(api.get("shop").await.unwrap()),
        settled,
        "no status write without a change"
    );
    let short = kubectl_ok(&["get", "-n", &ns.name, "mp", "shop", "-o", "name"], None);
    assert_eq!(short.trim(), "maintpage.noops.dev/shop");
}

#[tokio::test]
async fn the_operator_runs_in_the_cluster_with_its_service_account() {
    install_crds();
    let ns = TestNamespace::new("mp-incluster").await;
    let deploy = root().join("deploy");
    for file in ["00-namespace.yaml", "10-rbac.yaml"] {
        kubectl_ok(&["apply", "-f", deploy.join(file).to_str().unwrap()], None);
    }
    // The shipped Deployment, restricted to this test's namespace so it stays out of the way of
    // other tests, and with one replica.
    let operator = std::fs::read_to_string(deploy.join("20-operator.yaml"))
        .unwrap()
        .replace(
            r#"args: ["run", "#,
            &format!(r#"args: ["run", "--namespaces={}", "#, ns.name),
        )
        .replace("replicas: 2", "replicas: 1");
    assert!(operator.contains(&format!("--namespaces={}", ns.name)));
    kubectl_ok(&["apply", "-f", "-"], Some(&operator));
    let cleanup = DeleteOnDrop(vec!["deployment/noops-operator".into()]);
    kubectl_ok(
        &[
            "rollout",
            "status",
            "-n",
            "noops-system",
            "deployment/noops-operator",
            "--timeout=120s",
        ],
        None,
    );
    ns.apply(&manifest("shop", false));
    wait_ready(&ns, "shop").await;
    // Every controller started with what the shipped RBAC grants: no watch or list refused.
    let logs = kubectl_ok(
        &["logs", "-n", "noops-system", "deployment/noops-operator", "--tail=-1"],
        None,
    );
    assert!(
        !logs.contains("forbidden"),
        "the shipped RBAC refused the operator something:\n{logs}"
    );
    drop(cleanup);
}

/// Deletes objects in noops-system when dropped (also when the test fails).
struct DeleteOnDrop(Vec<String>);

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        for object in &self.0 {
            let _ = kubectl(
                &[
                    "delete",
                    "-n",
                    "noops-system",
                    object,
                    "--ignore-not-found",
                    "--wait=false",
                ],
                None,
            );
        }
    }
}

#[tokio::test]
async fn a_new_maintpage_whose_page_cannot_start_serves_the_app_and_says_why() {
    install_crds();
    let ns = TestNamespace::new("mp-first").await;
    let _operator = Operator::start(&ns.name, &["--leader-elect=false"]);
    // Created in maintenance, with a maintenance image this cluster cannot run.
    ns.apply(
        r#"
apiVersion: noops.dev/v1alpha1
kind: MaintPage
metadata: { name: shop }
spec:
  app:
    name: shop
    image: hashicorp/http-echo:1.0
    args: ["-text=app page", "-listen=:8080"]
    replicas: 2
  maintenance:
    image: example.com/no-such-page:1.0
    args: ["-text=maintenance page", "-listen=:8080"]
    enabled: true
"#,
    );
    let services: Api<Service> = ns.api();
    wait_until("the Service", MINUTE, || async {
        services.get_opt("shop").await.ok().flatten().is_some()
    })
    .await;
    let addr = format!("{}:80", cluster_ip(&ns, "shop").await);
    wait_for_page(&addr, "app page", "the app answering through the Service").await;
    let stop = Arc::new(AtomicBool::new(false));
    let poller = poll(addr.clone(), stop.clone());

    // The status says why the page is not published, and what is wrong with it.
    let api: Api<MaintPage> = ns.api();
    let mp = wait_for("Degraded naming why the page cannot start", MINUTE, || async {
        let mp = api.get_opt("shop").await.ok()??;
        let status = mp.status.clone()?;
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Degraded" && c.status == "True" && PULL_FAILED.contains(&c.reason.as_str()))
            .then_some(mp)
    })
    .await;
    let status = mp.status.unwrap();
    assert_eq!(status.published, Some(Side::App), "the Ready side is published");
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "Switching"));
    assert!(
        ready.message.contains("until the maintenance page is Ready"),
        "{}",
        ready.message
    );
    let degraded = status.conditions.iter().find(|c| c.type_ == "Degraded").unwrap();
    assert!(
        degraded.message.contains("example.com/no-such-page:1.0"),
        "{}",
        degraded.message
    );
    for reason in ["Published", "WaitingForMaintenance"] {
        wait_until(&format!("a {reason} Event"), MINUTE, || has_event(&ns, reason)).await;
    }
    wait_until("an Event saying the page's image cannot be pulled", MINUTE, || async {
        for reason in PULL_FAILED {
            if has_event(&ns, reason).await {
                return true;
            }
        }
        false
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Fixing the image publishes the page, still without a failed request.
    api.patch(
        "shop",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "spec": { "maintenance": { "image": "hashicorp/http-echo:1.0" } } })),
    )
    .await
    .unwrap();
    let mp = wait_for("the page published and nothing degraded", 2 * MINUTE, || async {
        let mp = api.get_opt("shop").await.ok()??;
        let status = mp.status.clone()?;
        let healthy = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Degraded" && c.status == "False");
        (status.published == Some(Side::Maintenance) && healthy).then_some(mp)
    })
    .await;
    assert_eq!(mp.status.unwrap().waiting_for, None);
    wait_for_page(&addr, "maintenance page", "the maintenance page answering").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let seen = poller.await.unwrap();
    let failures = seen.iter().filter(|s| s.starts_with("FAIL")).count();
    assert_eq!(failures, 0, "failed requests: {seen:?}");
    let mut phases: Vec<&str> = seen.iter().map(String::as_str).collect();
    phases.dedup();
    assert_eq!(phases, vec!["app page", "maintenance page"], "answers in order");
}
