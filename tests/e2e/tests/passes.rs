//! What a pass asks of the API server: controllers run in this test's own process against the
//! real API server, with every request their client sends recorded in order (`Recorded`).
//! Between the pure unit tests (what a pass decides) and the end-to-end tests (what comes of
//! it), these check the requests themselves: nothing written before the object is validated,
//! the status before the Events that tell of it, nothing asked by a pass over a settled
//! object, nothing read but from the caches or as a declared confirmation (every test, when
//! its controllers stop), and the writes of a first apply and of a switch against golden files, as well as
//! the states a MachineDeployment's rollout takes its sets through, seen by a watch, and a
//! drain's requests pass by pass (`tests/golden/`; `NOOPS_UPDATE_GOLDEN=1` writes them anew,
//! to be read and committed).
// A test's own helpers fail it outright.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use noops::core::controller::{Runtime, Shutdown};
use noops_api::MaintPage;
use noops_e2e::*;
use tokio::sync::watch;

const MINUTE: Duration = Duration::from_secs(60);

/// One request a controller sent: its verb and resource as Kubernetes' audit log names them,
/// the object's name when it names one, why it confirms (a declared read,
/// `noops::core::confirm`), and whether it is a watch cache's list.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Sent {
    verb: &'static str,
    resource: String,
    name: Option<String>,
    confirms: Option<String>,
    cache_list: bool,
}

impl Sent {
    fn writes(&self) -> bool {
        ["create", "update", "patch", "delete", "deletecollection"].contains(&self.verb)
    }

    /// A read a pass made of the API server without declaring it a confirmation: a pass
    /// reads its caches.
    fn undeclared_read(&self) -> bool {
        ["get", "list"].contains(&self.verb) && self.confirms.is_none() && !self.cache_list
    }

    /// `verb resource[ name]`; an Event is `events` whatever its verb and name (its name is
    /// random, and whether it is made or a repeat of one is counted is the recorder's choice).
    fn line(&self) -> String {
        match &self.name {
            _ if self.resource == "events" => "events".to_string(),
            Some(name) => format!("{} {} {name}", self.verb, self.resource),
            None => format!("{} {}", self.verb, self.resource),
        }
    }
}

/// Every request of a client, in order.
#[derive(Clone, Default)]
struct Recorded(Arc<Mutex<Vec<Sent>>>);

impl Recorded {
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// What was sent since `mark` (a [`Self::len`]), watches left out: a reflector's watch
    /// is re-made now and then whatever the passes do.
    /// Waits until nothing but watches has been sent for `quiet` (at most a minute): the
    /// passes that a settling object still makes are over.
    async fn quiet(&self, quiet: Duration) {
        let mut mark = self.len();
        let deadline = tokio::time::Instant::now() + MINUTE;
        loop {
            tokio::time::sleep(quiet).await;
            if self.since(mark).is_empty() || tokio::time::Instant::now() > deadline {
                return;
            }
            mark = self.len();
        }
    }

    /// The writes sent since `mark`, each as [`Sent::line`].
    fn writes_since(&self, mark: usize) -> Vec<String> {
        self.since(mark).iter().filter(|s| s.writes()).map(Sent::line).collect()
    }

    fn since(&self, mark: usize) -> Vec<Sent> {
        self.0.lock().unwrap()[mark..]
            .iter()
            .filter(|s| s.verb != "watch")
            .cloned()
            .collect()
    }
}

impl<S> tower::Layer<S> for Recorded {
    type Service = Recording<S>;

    fn layer(&self, inner: S) -> Recording<S> {
        Recording {
            inner,
            sent: self.clone(),
        }
    }
}

#[derive(Clone)]
struct Recording<S> {
    inner: S,
    sent: Recorded,
}

impl<S, B> tower::Service<http::Request<B>> for Recording<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let uri = request.uri();
        let (verb, resource) = noops::core::api_requests::classify(request.method(), uri.path(), uri.query());
        let confirms = request
            .headers()
            .get(noops::core::confirm::CONFIRMS_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        // A watch cache lists in pages (`limit`); a pass's own list does not.
        let cache_list = verb == "list" && uri.query().is_some_and(|q| q.contains("limit="));
        self.sent.0.lock().unwrap().push(Sent {
            verb,
            resource,
            name: noops::core::api_requests::object_name(uri.path()),
            confirms,
            cache_list,
        });
        self.inner.call(request)
    }
}

/// A client of `config` whose every request `sent` records; with kube's retries of a 429, 503
/// or 504 if `retry`.
fn recorded_client(mut config: kube::Config, retry: bool, sent: &Recorded) -> kube::Client {
    config.default_retry = retry;
    kube::client::ClientBuilder::try_from(config)
        .expect("client")
        .with_layer(sent)
        .build()
}

/// Controllers of the operator running in this process, scoped to one namespace, their
/// client recorded. They stop when this is dropped.
struct InProcess {
    sent: Recorded,
    metrics: Arc<noops::core::metrics::Metrics>,
    halt: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl InProcess {
    async fn start(controllers: &[&str], namespace: &str) -> Self {
        let sent = Recorded::default();
        let config = config().await;
        let client_asking_once = recorded_client(config.clone(), false, &sent);
        let client = recorded_client(config, true, &sent);
        let (halt, halted) = watch::channel(false);
        let metrics = Arc::new(noops::core::metrics::Metrics::new());
        let runtime = Runtime {
            client,
            client_asking_once,
            namespace: Some(namespace.to_string()),
            metrics: metrics.clone(),
            shutdown: Shutdown::new(halted),
            image: "ghcr.io/noops-dev/noops:test".into(),
            certificate_lifetime: Duration::from_secs(365 * 24 * 3600),
            images: Default::default(),
        };
        let tasks = controllers
            .iter()
            .map(|name| {
                let registration = noops::controller(name).unwrap_or_else(|| panic!("no controller {name}"));
                tokio::spawn((registration.run)(runtime.clone()))
            })
            .collect();
        Self {
            sent,
            metrics,
            halt,
            tasks,
        }
    }

    /// How many passes `controller` has ended (with success or an error), from its metrics.
    fn passes(&self, controller: &str) -> f64 {
        let prefix = format!("noops_reconciles_total{{controller=\"{controller}\",");
        self.metrics
            .render()
            .lines()
            .filter(|line| line.starts_with(&prefix))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for InProcess {
    /// Stops the controllers; then, unless the test failed already, checks that every read
    /// their passes made was of a cache or a declared confirmation (every test here, so every
    /// kind).
    fn drop(&mut self) {
        let _ = self.halt.send(true);
        for task in &self.tasks {
            task.abort();
        }
        if !std::thread::panicking() {
            let undeclared: Vec<Sent> = self.sent.since(0).into_iter().filter(Sent::undeclared_read).collect();
            assert!(
                undeclared.is_empty(),
                "passes read the API server neither from a cache nor as a declared confirmation: {undeclared:?}"
            );
        }
    }
}

/// The writes among `sent`, each once, in the order first sent: a golden file's lines (how
/// often a status is written again while pods start is timing, not behaviour).
fn distinct_writes(sent: &[Sent]) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for line in sent.iter().filter(|s| s.writes()).map(Sent::line) {
        if !lines.contains(&line) {
            lines.push(line);
        }
    }
    lines
}

/// Compares `lines` with golden file `name` (or writes it, with `NOOPS_UPDATE_GOLDEN=1`).
fn assert_golden(name: &str, lines: &[String]) {
    let path = root().join("tests/e2e/tests/golden").join(name);
    let text = lines.iter().map(|l| format!("{l}\n")).collect::<String>();
    if std::env::var_os("NOOPS_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let golden = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        golden,
        text,
        "the requests differ from {} (NOOPS_UPDATE_GOLDEN=1 writes it anew)",
        path.display()
    );
}

fn maintpage(enabled: bool) -> String {
    format!(
        r#"
apiVersion: noops.dev/v1alpha1
kind: MaintPage
metadata: {{ name: shop }}
spec:
  app:
    name: shop
    image: hashicorp/http-echo:1.0
    args: ["-text=app page", "-listen=:8080"]
    replicas: 1
  maintenance:
    image: hashicorp/http-echo:1.0
    args: ["-text=maintenance page", "-listen=:8080"]
    enabled: {enabled}
"#
    )
}

/// The MaintPage's Ready condition: (status, reason), once written for its generation.
async fn ready_condition(api: &Api<MaintPage>) -> Option<(String, String)> {
    let mp = api.get_opt("shop").await.ok()??;
    let status = mp.status?;
    (status.observed_generation == mp.metadata.generation).then_some(())?;
    let ready = status.conditions.into_iter().find(|c| c.type_ == "Ready")?;
    Some((ready.status, ready.reason))
}

#[tokio::test]
async fn a_maintpage_pass_writes_nothing_before_it_validated_tells_after_its_status_and_asks_nothing_once_settled() {
    install_crds();
    let ns = TestNamespace::new("passes-mp").await;
    // Someone else's Deployment has the app's name: the MaintPage must not take it over.
    ns.apply(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: { name: shop }
spec:
  replicas: 0
  selector: { matchLabels: { app: theirs } }
  template:
    metadata: { labels: { app: theirs } }
    spec: { containers: [{ name: c, image: hashicorp/http-echo:1.0 }] }
"#,
    );
    let operator = InProcess::start(&["maintpage"], &ns.name).await;
    let api: Api<MaintPage> = ns.api();
    ns.apply(&maintpage(false));
    wait_until("the MaintPage refused for the name conflict", MINUTE, || async {
        ready_condition(&api)
            .await
            .is_some_and(|(_, reason)| reason == "NameConflict")
    })
    .await;
    let refused = operator.sent.since(0);
    let writes: Vec<String> = refused.iter().filter(|s| s.writes()).map(Sent::line).collect();
    assert!(
        writes
            .iter()
            .all(|w| w == "patch maintpages/status shop" || w == "events" || w == "patch maintpages shop"),
        "a pass that did not validate wrote more than its status, its finalizer and its Events: {writes:?}"
    );
    assert!(
        writes.contains(&"patch maintpages/status shop".to_string()),
        "{writes:?}"
    );

    // Once the name is free, the first apply: children, then the status, then its Events.
    let mark = operator.sent.len();
    Api::<Deployment>::namespaced(client().await, &ns.name)
        .delete("shop", &DeleteParams::foreground())
        .await
        .unwrap();
    wait_until("the MaintPage Ready", 2 * MINUTE, || async {
        ready_condition(&api).await.is_some_and(|(status, _)| status == "True")
    })
    .await;
    assert_golden(
        "maintpage-first-apply.txt",
        &distinct_writes(&operator.sent.since(mark)),
    );

    // Settled: a pass woken by a touch reads its children from the caches and writes nothing.
    operator.sent.quiet(Duration::from_secs(3)).await;
    let mark = operator.sent.len();
    for touch in 0..3 {
        let patch = serde_json::json!({ "metadata": { "annotations": { "noops.dev/test-touch": touch.to_string() } } });
        api.patch("shop", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let settled = operator.sent.since(mark);
    assert!(settled.is_empty(), "a settled MaintPage's passes asked: {settled:?}");

    // The switch to the maintenance page, as requests.
    let mark = operator.sent.len();
    let patch = serde_json::json!({ "spec": { "maintenance": { "enabled": true } } });
    api.patch("shop", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_until("the maintenance page published", 2 * MINUTE, || async {
        api.get_opt("shop").await.ok().flatten().is_some_and(|mp| {
            let status = mp.status.unwrap_or_default();
            status.observed_generation == mp.metadata.generation
                && status.published == Some(noops_api::maintpage::Side::Maintenance)
                && status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    })
    .await;
    assert_golden("maintpage-switch.txt", &distinct_writes(&operator.sent.since(mark)));
    // Every Event of the switch comes after the status write that shows it.
    let sent = operator.sent.since(mark);
    let first_status = sent.iter().position(|s| s.line() == "patch maintpages/status shop");
    let first_event = sent.iter().position(|s| s.writes() && s.resource == "events");
    assert!(
        first_status.is_some() && first_event.is_none_or(|e| Some(e) > first_status),
        "an Event before the status that shows it: {sent:?}"
    );
}

fn machine_set(replicas: usize) -> String {
    format!(
        "apiVersion: noops.dev/v1alpha1\nkind: MachineSet\nmetadata: {{ name: ms }}\nspec:\n  clusterName: c\n  replicas: {replicas}\n  selector: {{ matchLabels: {{ pool: p }} }}\n  template:\n    metadata: {{ labels: {{ pool: p }} }}\n    spec: {{ version: \"1.34\" }}\n"
    )
}

/// How many requests of `sent` are `verb` of Machines, and the names they named.
fn of_machines(sent: &[Sent], verb: &str) -> Vec<String> {
    sent.iter()
        .filter(|s| s.verb == verb && s.resource == "machines")
        .map(|s| s.name.clone().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn a_machine_set_makes_and_deletes_exactly_the_machines_its_replicas_ask_for() {
    install_crds();
    let ns = TestNamespace::new("passes-ms").await;
    // The set's controller alone: its machines stay objects (no VM is made for them, and none
    // joins: the startup timeout, 10 minutes, is far off), so the passes that see them
    // come and go are the set's own, each waking the next while the cache catches up.
    let operator = InProcess::start(&["machineset"], &ns.name).await;
    let machines: Api<noops_api::Machine> = ns.api();
    let count = || async {
        machines
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
            .count()
    };
    let mut mark = 0;
    for (replicas, made, deleted) in [(3_usize, 3, 0), (5, 2, 0), (1, 0, 4)] {
        ns.apply(&machine_set(replicas));
        wait_until(&format!("{replicas} machines"), MINUTE, || async {
            count().await == replicas
        })
        .await;
        // Time for a pass that would make or delete one too many.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(count().await, replicas);
        let sent = operator.sent.since(mark);
        let (creates, deletes) = (of_machines(&sent, "create"), of_machines(&sent, "delete"));
        assert_eq!(
            (creates.len(), deletes.len()),
            (made, deleted),
            "to {replicas} replicas: made {creates:?}, deleted {deletes:?}"
        );
        mark = operator.sent.len();
    }
}

/// The reasons of `plural`/`name`'s status conditions, once its status is written for its
/// generation.
fn condition_reasons(ns: &TestNamespace, plural: &str, name: &str) -> Vec<String> {
    let resource = format!("{plural}.noops.dev");
    let out = kubectl(&["get", &resource, name, "-n", &ns.name, "-o", "json"], None);
    let object: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let status = &object["status"];
    let current =
        status["observedGeneration"].is_null() || status["observedGeneration"] == object["metadata"]["generation"];
    let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
    conditions
        .iter()
        .filter(|_| current)
        .filter_map(|c| c["reason"].as_str().map(str::to_string))
        .collect()
}

/// `controller`, alone in this process, over `manifest` (applied after `before`, objects it
/// does not own): until its status says `reason`, its passes write that status, its finalizer
/// and Events, and nothing else. Then a controller started anew, whose first pass meets the
/// object unchanged, writes nothing at all.
async fn held_writes_only_its_status(
    controller: &str,
    plural: &str,
    before: &str,
    manifest: &str,
    reason: &str,
) -> TestNamespace {
    install_crds();
    let ns = TestNamespace::new(&format!("passes-{controller}")).await;
    if !before.is_empty() {
        ns.apply(before);
    }
    let operator = InProcess::start(&[controller], &ns.name).await;
    ns.apply(manifest);
    wait_until(&format!("{plural}/x's status saying {reason}"), MINUTE, || async {
        condition_reasons(&ns, plural, "x").iter().any(|r| r == reason)
    })
    .await;
    operator.sent.quiet(Duration::from_secs(3)).await;
    let writes = operator.sent.writes_since(0);
    let (status, own) = (format!("patch {plural}/status x"), format!("patch {plural} x"));
    assert!(
        writes.iter().all(|w| *w == status || *w == own || w == "events"),
        "{controller}: a pass that holds back wrote more than its status, its finalizer and its Events: {writes:?}"
    );
    assert!(writes.contains(&status), "{controller}: {writes:?}");
    drop(operator);

    // A controller started anew: its first pass over the unchanged object (the only one of
    // its kind here), ended.
    let operator = InProcess::start(&[controller], &ns.name).await;
    wait_until(&format!("{controller}'s first pass"), MINUTE, || async {
        operator.passes(controller) >= 1.0
    })
    .await;
    operator.sent.quiet(Duration::from_secs(3)).await;
    let sent = operator.sent.since(0);
    assert!(
        sent.iter().any(|s| s.resource == plural),
        "{controller}: the new controller never read {plural}: {sent:?}"
    );
    let writes: Vec<String> = sent.iter().filter(|s| s.writes()).map(Sent::line).collect();
    assert!(
        writes.is_empty(),
        "{controller}: a pass over an unchanged object wrote: {writes:?}"
    );
    ns
}

#[tokio::test]
async fn an_etcd_cluster_refused_writes_no_certificate_service_or_config_map() {
    held_writes_only_its_status(
        "etcd",
        "etcdclusters",
        "",
        "apiVersion: noops.dev/v1alpha1\nkind: EtcdCluster\nmetadata: { name: x }\nspec: { version: \"3.5.21\", replicas: 1, pod: { extraArgs: [\"--name=x\"] } }\n",
        "ForbiddenFlags",
    )
    .await;
}

#[tokio::test]
async fn an_etcd_backup_of_no_cluster_writes_only_its_status() {
    held_writes_only_its_status(
        "etcdbackup",
        "etcdbackups",
        "",
        "apiVersion: noops.dev/v1alpha1\nkind: EtcdBackup\nmetadata: { name: x }\nspec: { cluster: nope }\n",
        "ClusterNotFound",
    )
    .await;
}

#[tokio::test]
async fn a_postgres_backup_with_no_destination_writes_only_its_status() {
    held_writes_only_its_status(
        "postgresbackup",
        "postgresbackups",
        // Its database, which no controller runs here.
        "apiVersion: noops.dev/v1alpha1\nkind: PostgreSQL\nmetadata: { name: db }\nspec: { db: app, user: app, passwordSecret: nope }\n",
        "apiVersion: noops.dev/v1alpha1\nkind: PostgresBackup\nmetadata: { name: x }\nspec: { postgresql: db }\n",
        "NoDestination",
    )
    .await;
}

#[tokio::test]
async fn a_control_plane_whose_pod_range_is_taken_writes_only_its_status() {
    held_writes_only_its_status(
        "kubernetescontrolplane",
        "kubernetescontrolplanes",
        "",
        // The local Kubernetes' own pod range.
        "apiVersion: noops.dev/v1alpha1\nkind: KubernetesControlPlane\nmetadata: { name: x }\nspec: { version: \"1.34\", networking: { podCIDR: 10.244.0.0/16 } }\n",
        "RangeTaken",
    )
    .await;
}

#[tokio::test]
async fn a_cluster_whose_control_planes_name_is_taken_writes_only_its_status() {
    held_writes_only_its_status(
        "kubernetescluster",
        "kubernetesclusters",
        // A control plane of that name, someone else's.
        "apiVersion: noops.dev/v1alpha1\nkind: KubernetesControlPlane\nmetadata: { name: x }\nspec: { version: \"1.34\" }\n",
        "apiVersion: noops.dev/v1alpha1\nkind: KubernetesCluster\nmetadata: { name: x }\nspec: { version: \"1.34\" }\n",
        "NameTaken",
    )
    .await;
}

#[tokio::test]
async fn a_machine_of_no_cluster_writes_only_its_status() {
    held_writes_only_its_status(
        "machine",
        "machines",
        "",
        "apiVersion: noops.dev/v1alpha1\nkind: Machine\nmetadata: { name: x }\nspec: { clusterName: nope, version: \"1.34\" }\n",
        "ClusterNotFound",
    )
    .await;
}

#[tokio::test]
async fn a_paused_maintpage_makes_no_deployment_or_service() {
    held_writes_only_its_status(
        "maintpage",
        "maintpages",
        "",
        &maintpage(false)
            .replace("metadata: { name: shop }", "metadata: { name: x }")
            .replace("spec:\n", "spec:\n  paused: true\n"),
        "Paused",
    )
    .await;
}

#[tokio::test]
async fn a_paused_machine_set_makes_no_machine() {
    held_writes_only_its_status(
        "machineset",
        "machinesets",
        "",
        &machine_set(3)
            .replace("metadata: { name: ms }", "metadata: { name: x }")
            .replace("  replicas: 3\n", "  replicas: 3\n  paused: true\n"),
        "Paused",
    )
    .await;
}

#[tokio::test]
async fn a_paused_machine_deployment_makes_no_machine_set() {
    held_writes_only_its_status(
        "machinedeployment",
        "machinedeployments",
        "",
        "apiVersion: noops.dev/v1alpha1\nkind: MachineDeployment\nmetadata: { name: x }\nspec:\n  clusterName: c\n  paused: true\n  selector: { matchLabels: { pool: p } }\n  template: { metadata: { labels: { pool: p } }, spec: { version: \"1.34\" } }\n",
        "Paused",
    )
    .await;
}

#[tokio::test]
async fn a_cluster_paused_before_it_had_children_makes_none() {
    held_writes_only_its_status(
        "kubernetescluster",
        "kubernetesclusters",
        "",
        "apiVersion: noops.dev/v1alpha1\nkind: KubernetesCluster\nmetadata: { name: x }\nspec: { version: \"1.34\", paused: true }\n",
        "Paused",
    )
    .await;
}

#[tokio::test]
async fn a_database_to_start_from_a_missing_backup_makes_no_secret_account_or_service() {
    held_writes_only_its_status(
        "postgres",
        "postgresqls",
        "",
        "apiVersion: noops.dev/v1alpha1\nkind: PostgreSQL\nmetadata: { name: x }\nspec: { db: app, user: app, passwordSecret: pw, bootstrap: { fromBackup: { name: no-such-backup } } }\n",
        "BootstrapBackupNotFound",
    )
    .await;
}

#[tokio::test]
async fn a_paused_etcd_backup_is_not_begun_until_resumed() {
    let ns = held_writes_only_its_status(
        "etcdbackup",
        "etcdbackups",
        "",
        "apiVersion: noops.dev/v1alpha1\nkind: EtcdBackup\nmetadata: { name: x }\nspec: { cluster: nope, paused: true }\n",
        "Paused",
    )
    .await;
    noops_e2e::wait_event(&ns, "EtcdBackup", "x", "Paused").await;
    // Resumed, it is begun: here, to find its cluster is not there.
    let _operator = InProcess::start(&["etcdbackup"], &ns.name).await;
    ns.merge_spec("etcdbackup/x", serde_json::json!({ "paused": false }));
    wait_until("etcdbackups/x begun after its resume", MINUTE, || async {
        condition_reasons(&ns, "etcdbackups", "x")
            .iter()
            .any(|r| r == "ClusterNotFound")
    })
    .await;
    noops_e2e::wait_event(&ns, "EtcdBackup", "x", "Resumed").await;
}

#[tokio::test]
async fn a_paused_postgres_backup_is_not_begun_nor_deleted_until_resumed() {
    let ns = held_writes_only_its_status(
        "postgresbackup",
        "postgresbackups",
        "",
        "apiVersion: noops.dev/v1alpha1\nkind: PostgresBackup\nmetadata: { name: x }\nspec: { postgresql: db, paused: true }\n",
        "Paused",
    )
    .await;
    // Deleted while paused, it stays (its files would go with it) until resumed.
    let _operator = InProcess::start(&["postgresbackup"], &ns.name).await;
    let backups: Api<noops_api::PostgresBackup> = ns.api();
    backups.delete("x", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let held = backups.get_opt("x").await.unwrap();
    assert!(
        held.is_some_and(|b| b.metadata.deletion_timestamp.is_some()),
        "a paused backup went before it was resumed"
    );
    ns.merge_spec("pgbackup/x", serde_json::json!({ "paused": false }));
    wait_until("the resumed backup gone", MINUTE, || async {
        backups.get_opt("x").await.unwrap().is_none()
    })
    .await;
}

/// Every state the MachineSets of the namespace pass through, from a watch: each set's
/// `spec.replicas`, the sets in the order they were made (a set gone is left out).
#[derive(Clone, Default)]
struct SetStates(Arc<Mutex<Vec<Vec<i32>>>>);

impl SetStates {
    /// Returns once the watch listed the sets (none yet): no change after it is missed.
    async fn start(ns: &TestNamespace) -> (Self, tokio::task::JoinHandle<()>) {
        use futures::StreamExt;
        use kube::runtime::WatchStreamExt;
        use kube::runtime::watcher::{self, Event};
        let states = SetStates::default();
        let record = states.clone();
        let (listed_tx, listed) = tokio::sync::oneshot::channel();
        let sets: Api<noops_api::MachineSet> = ns.api();
        let task = tokio::spawn(async move {
            let mut listed_tx = Some(listed_tx);
            // Each set's replicas now, reported in the order the sets were first seen: the watch
            // starts before any set is made, and creation times have only seconds.
            let mut now: std::collections::BTreeMap<String, i32> = Default::default();
            let mut order: Vec<String> = Vec::new();
            let mut events = watcher::watcher(sets, watcher::Config::default())
                .default_backoff()
                .boxed();
            // A (re)list is taken whole at its end, not as the partial states it comes in.
            let mut listing = false;
            while let Some(event) = events.next().await {
                let Ok(event) = event else { continue };
                match event {
                    Event::Init => {
                        now.clear();
                        listing = true;
                    }
                    Event::Apply(set) | Event::InitApply(set) => {
                        let name = set.metadata.name.clone().unwrap_or_default();
                        if !order.contains(&name) {
                            order.push(name.clone());
                        }
                        now.insert(name, set.spec.replicas);
                    }
                    Event::Delete(set) => {
                        now.remove(set.metadata.name.as_deref().unwrap_or_default());
                    }
                    Event::InitDone => {
                        listing = false;
                        if let Some(tx) = listed_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                }
                if listing {
                    continue;
                }
                let state: Vec<i32> = order.iter().filter_map(|n| now.get(n).copied()).collect();
                let mut seen = record.0.lock().unwrap();
                if seen.last() != Some(&state) {
                    seen.push(state);
                }
            }
        });
        tokio::time::timeout(MINUTE, listed).await.unwrap().unwrap();
        (states, task)
    }

    fn since(&self, from: usize) -> Vec<Vec<i32>> {
        self.0.lock().unwrap()[from..].to_vec()
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// Plays the machine controller (not run here): every machine is Running with its Node Ready
/// as soon as it is made, so the deployment's rollout goes at the pace of its own passes.
async fn machines_ready_when_made(ns: &TestNamespace) -> tokio::task::JoinHandle<()> {
    let machines: Api<noops_api::Machine> = ns.api();
    tokio::spawn(async move {
        loop {
            for machine in machines
                .list(&Default::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
            {
                if machine.metadata.deletion_timestamp.is_some()
                    || machine.status.as_ref().is_some_and(|s| s.phase.is_some())
                {
                    continue;
                }
                let name = machine.metadata.name.clone().unwrap_or_default();
                let status = serde_json::json!({ "status": {
                    "phase": "Running",
                    "nodeName": name,
                    "conditions": [{ "type": "Ready", "status": "True", "reason": "NodeReady", "message": "",
                        "lastTransitionTime": jiff::Timestamp::now().to_string() }],
                } });
                let _ = machines
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

fn machine_deployment(version: &str) -> String {
    format!(
        "apiVersion: noops.dev/v1alpha1\nkind: MachineDeployment\nmetadata: {{ name: md }}\nspec:\n  clusterName: c\n  replicas: 3\n  strategy: {{ rollingUpdate: {{ maxSurge: 1, maxUnavailable: 0 }} }}\n  selector: {{ matchLabels: {{ pool: p }} }}\n  template:\n    metadata: {{ labels: {{ pool: p }} }}\n    spec: {{ version: \"{version}\" }}\n"
    )
}

#[tokio::test]
async fn a_machine_deployment_rollout_with_none_unavailable_adds_one_then_removes_one() {
    install_crds();
    let ns = TestNamespace::new("passes-md").await;
    let (states, watch) = SetStates::start(&ns).await;
    let ready = machines_ready_when_made(&ns).await;
    let _operator = InProcess::start(&["machinedeployment", "machineset"], &ns.name).await;
    let deployments: Api<noops_api::MachineDeployment> = ns.api();
    // Done: every machine of the template available, and the sets that held the old ones gone.
    let rolled_out = || {
        let deployments = deployments.clone();
        let states = states.clone();
        async move {
            let md = deployments.get("md").await.ok()?;
            let status = md.status?;
            (status.observed_generation == md.metadata.generation
                && status.updated_replicas == Some(3)
                && status.available_replicas == Some(3)
                && status.replicas == Some(3)
                && states.since(0).last() == Some(&vec![3]))
            .then_some(())
        }
    };
    ns.apply(&machine_deployment("1.34"));
    wait_for("3 machines of md available", MINUTE, rolled_out).await;
    let from = states.len() - 1;
    // A new template: with maxSurge 1 and maxUnavailable 0, one machine more, then one old
    // one fewer once it is available, never two at once (the defect: every old one at once).
    ns.apply(&machine_deployment("1.35"));
    wait_for("md rolled out to 1.35", 2 * MINUTE, rolled_out).await;
    let seen = states.since(from);
    for state in &seen {
        assert!(
            state.iter().sum::<i32>() <= 4,
            "more than replicas + maxSurge: {seen:?}"
        );
    }
    let lines: Vec<String> = seen
        .iter()
        .map(|s| s.iter().map(i32::to_string).collect::<Vec<_>>().join(" "))
        .collect();
    assert_golden("machinedeployment-rollout.txt", &lines);
    ready.abort();
    watch.abort();
}

#[tokio::test]
async fn a_paused_cluster_without_its_control_plane_pauses_its_pools_and_makes_none() {
    install_crds();
    let ns = TestNamespace::new("passes-kc-pools").await;
    ns.apply("apiVersion: noops.dev/v1alpha1\nkind: KubernetesCluster\nmetadata: { name: x }\nspec: { version: \"1.34\", paused: true, workers: [{ name: p, replicas: 1 }] }\n");
    let cluster: noops_api::KubernetesCluster = ns.api().get("x").await.unwrap();
    let uid = cluster.metadata.uid.unwrap();
    // A pool the cluster made before (its owner reference says so), its control plane gone
    // since: the pool is told the cluster is paused, and no control plane is made.
    ns.apply(&format!(
        "apiVersion: noops.dev/v1alpha1\nkind: MachineDeployment\nmetadata:\n  name: x-p\n  labels: {{ noops.dev/kubernetescluster: x, noops.dev/pool: p }}\n  ownerReferences: [{{ apiVersion: noops.dev/v1alpha1, kind: KubernetesCluster, name: x, uid: {uid}, controller: true }}]\nspec:\n  clusterName: x\n  replicas: 1\n  selector: {{ matchLabels: {{ noops.dev/kubernetescluster: x, noops.dev/pool: p }} }}\n  template: {{ metadata: {{ labels: {{ noops.dev/kubernetescluster: x, noops.dev/pool: p }} }}, spec: {{ version: \"1.34\" }} }}\n"
    ));
    let operator = InProcess::start(&["kubernetescluster"], &ns.name).await;
    let deployments: Api<noops_api::MachineDeployment> = ns.api();
    wait_until("the pool paused with its cluster", MINUTE, || async {
        deployments.get("x-p").await.is_ok_and(|d| d.spec.paused)
    })
    .await;
    operator.sent.quiet(Duration::from_secs(3)).await;
    let control_planes: Api<noops_api::KubernetesControlPlane> = ns.api();
    assert!(
        control_planes.get_opt("x").await.unwrap().is_none(),
        "a paused cluster made a control plane"
    );
    let writes = operator.sent.writes_since(0);
    assert!(
        writes.iter().all(|w| [
            "patch machinedeployments x-p",
            "patch kubernetesclusters/status x",
            "patch kubernetesclusters x",
            "events"
        ]
        .contains(&w.as_str())),
        "{writes:?}"
    );
}

/// A drain's requests, pass by pass, against the API server (the drain a Machine's deletion
/// runs against its tenant's, with the tenant client's settings: a 429 is an answer, not
/// retried): the Node's pods listed each pass (a declared confirmation) and evicted through the
/// Eviction API, so that a budget refuses (429) and is asked again on the next pass; an ended
/// pod left; a pod evicted and still ending not asked again; and only once the Node cannot be
/// reached past the drain timeout (`force`), each pod deleted outright. The Node is a name
/// only: no kubelet ends an evicted pod, so it stays ending.
#[tokio::test]
async fn a_drain_evicts_through_budgets_and_deletes_without_eviction_only_when_forced() {
    let ns = TestNamespace::new("passes-drain").await;
    let node = format!("gone-{}", ns.name);
    let pod = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{ name: {name}, labels: {{ app: {name} }} }}\nspec: {{ nodeName: {node}, containers: [{{ name: c, image: registry.invalid/none }}] }}\n"
        )
    };
    for name in ["ended", "free", "kept"] {
        ns.apply(&pod(name));
    }
    ns.apply("apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: { name: kept }\nspec: { minAvailable: 1, selector: { matchLabels: { app: kept } } }\n");
    // What a kubelet would report: one pod ended, one running and ready (a budget counts
    // only those: the Eviction API lets a pending pod go whatever its budget says).
    let set_status = |pod: &str, status: &str| {
        kubectl_ok(
            &[
                "patch",
                "pod",
                pod,
                "-n",
                &ns.name,
                "--subresource=status",
                "--type=merge",
                "-p",
                status,
            ],
            None,
        )
    };
    set_status("ended", r#"{"status":{"phase":"Succeeded"}}"#);
    set_status(
        "kept",
        r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}"#,
    );
    let budgets = ns.api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>();
    wait_until("the budget counting its one ready pod", MINUTE, || async {
        budgets.get("kept").await.is_ok_and(|b| {
            b.status
                .is_some_and(|s| s.current_healthy == 1 && s.disruptions_allowed == 0)
        })
    })
    .await;

    let sent = Recorded::default();
    // An eviction's 429 is the budget's answer: asked again by the next pass, not retried.
    let client = recorded_client(config().await, false, &sent);
    let key = |name: &str| format!("{}/{name}", ns.name);
    let mut lines = Vec::new();
    let pass = |label: &str, mark: usize, lines: &mut Vec<String>| {
        lines.push(format!("# {label}"));
        lines.extend(sent.since(mark).iter().map(|s| {
            let confirms = s
                .confirms
                .as_deref()
                .map(|c| format!(" (confirms {c})"))
                .unwrap_or_default();
            format!("{}{confirms}", s.line())
        }));
    };

    let mark = sent.len();
    let first = noops::machine::drain::drain_pass(&client, &node, false).await.unwrap();
    pass("a pass", mark, &mut lines);
    assert_eq!(first.ending, [key("free")], "{first:?} {lines:?}");
    assert!(
        first.blocked.len() == 1 && first.blocked[0].starts_with(&key("kept")),
        "{first:?} {lines:?}"
    );
    assert!(first.forced.is_empty() && !first.done(), "{first:?}");

    let mark = sent.len();
    let second = noops::machine::drain::drain_pass(&client, &node, false).await.unwrap();
    pass("the next pass", mark, &mut lines);
    assert_eq!(
        (second.ending.clone(), second.blocked.len()),
        (vec![key("free")], 1),
        "{second:?}"
    );

    let mark = sent.len();
    let forced = noops::machine::drain::drain_pass(&client, &node, true).await.unwrap();
    pass(
        "a pass past the drain timeout of a Node that cannot be reached",
        mark,
        &mut lines,
    );
    assert_eq!(forced.forced, [key("ended"), key("free"), key("kept")], "{forced:?}");
    assert!(forced.done(), "{forced:?}");
    wait_until("every pod gone", MINUTE, || async {
        ns.api::<k8s_openapi::api::core::v1::Pod>()
            .list(&Default::default())
            .await
            .is_ok_and(|pods| pods.items.is_empty())
    })
    .await;
    assert_golden("drain.txt", &lines);
}
