//! PostgreSQL on the local Kubernetes, with real PostgreSQL 15 and psql: the original
//! walkthrough, password changes, bad specs and what the operator says of problems.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use noops_api::postgres::PostgreSQLPhase;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use noops_api::PostgreSQL;
use noops_e2e::postgres::{
    condition, database_manifest, instance_ip, instances_under_a_ledger, kubectl_get, last_failover, manifest, psql,
    secret_value, service_ip, three_instances_under_a_ledger, wait_failed_over, wait_not_ready, wait_ready,
    wait_reason, wait_rejoined,
};
use noops_e2e::{
    Operator, Supervisor, TestNamespace, apply_error, install_crds, kubectl_ok, wait_event, wait_for, wait_until,
};

const MINUTE: Duration = Duration::from_secs(60);

async fn event_reasons(ns: &TestNamespace, name: &str) -> Vec<String> {
    noops_e2e::event_reasons(ns, "PostgreSQL", name).await
}

#[tokio::test]
async fn the_original_walkthrough_keeps_every_row_across_a_pod_deletion_and_takes_a_new_password() {
    install_crds();
    let ns = TestNamespace::new("pg-walk").await;
    let operator = Operator::start(&ns.name, &["--controllers", "postgres"]);
    ns.apply(&manifest("shop", "first-Pa55'word", ""));
    kubectl_ok(
        &[
            "wait",
            "-n",
            &ns.name,
            "--for=condition=Ready",
            "pg/shop",
            "--timeout=180s",
        ],
        None,
    );

    // Connect with the password from the Secret, make a table, insert rows.
    let password = secret_value(&ns, "shop-db", "postgresql_password").await;
    let ip = instance_ip(&ns, "shop").await;
    psql(
        &ip,
        "app",
        &password,
        "shop",
        "CREATE TABLE items (id int PRIMARY KEY, name text); INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 100) g",
    )
    .unwrap();
    let listed = kubectl_get(&ns);
    assert!(listed.contains("READY") && listed.contains("ENDPOINT"), "{listed}");
    // Settled, a pass reads its children from the caches and the user's Secret from memory
    // (unchanged since it was read), and writes nothing: no API request but the lease's.
    // (Ready is said by the first pass that sees it serve: on a loaded machine the next ones
    // may still record what came with it. Settled, at the latest on the third try.)
    let mut requests = Vec::new();
    for _ in 0..3 {
        requests = operator
            .requests_of_settled_passes(&ns, "postgresql/shop", "postgres")
            .await;
        if requests.is_empty() {
            break;
        }
        println!("passes not settled yet made API requests: {requests:?}");
    }
    assert!(
        requests.is_empty(),
        "a settled database's passes made API requests: {requests:?}"
    );
    assert!(
        listed.contains("True") && listed.contains("Running") && listed.contains(&format!("shop.{}.svc:5432", ns.name)),
        "{listed}"
    );
    let api = ns.api::<PostgreSQL>();
    let before = api.get("shop").await.unwrap().status.unwrap();
    assert!(
        before.server_version.as_deref().unwrap_or_default().starts_with("15."),
        "{before:?}"
    );
    assert_eq!(secret_value(&ns, "shop-connection", "password").await, password);
    assert_eq!(secret_value(&ns, "shop-connection", "database").await, "shop");
    assert_eq!(
        secret_value(&ns, "shop-connection", "host").await,
        format!("shop.{}.svc", ns.name)
    );

    // Delete the pod while a client sits in a long query: the server shuts down fast (the
    // query is cancelled) and cleanly, rather than waiting for the client until it is killed
    // and recovering from a crash. The new pod starts on the same volume, with every row.
    let mut sleeper = std::process::Command::new(noops_e2e::postgres::PSQL)
        .args(["-h", &ip, "-U", "app", "-d", "shop", "-c", "SELECT pg_sleep(600)"])
        .env("PGPASSWORD", &password)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the client's query runs", MINUTE, || async {
        psql(
            &ip,
            "app",
            &password,
            "shop",
            "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(600)'",
        )
        .is_ok_and(|n| n == "1")
    })
    .await;
    let old_uid = ns.pods().get("shop-0").await.unwrap().metadata.uid;
    kubectl_ok(&["delete", "pod", "-n", &ns.name, "shop-0", "--wait=false"], None);
    let pods = ns.pods();
    wait_for("a new pod shop-0, Ready", 2 * MINUTE, || async {
        pods.get_opt("shop-0")
            .await
            .ok()
            .flatten()
            .filter(|p: &Pod| p.metadata.uid != old_uid && noops_e2e::pod_ready(p))
    })
    .await;
    wait_ready(&ns, "shop", MINUTE).await;
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let started = kubectl_ok(&["logs", "-n", &ns.name, "shop-0", "-c", "postgres"], None);
    assert!(
        started.contains("database system was shut down at") && !started.contains("interrupted"),
        "the server did not shut down cleanly:\n{started}"
    );
    let ip = instance_ip(&ns, "shop").await;
    assert_eq!(
        psql(&ip, "app", &password, "shop", "SELECT count(*) FROM items").unwrap(),
        "100"
    );
    let after = api.get("shop").await.unwrap().status.unwrap();
    assert_eq!(
        after.system_identifier, before.system_identifier,
        "the same database, not a new one"
    );

    // Paused, the operator changes nothing: a new password in the Secret is not set, a
    // deleted Service is not made again; the status says Paused and still Ready.
    ns.merge_spec("pg/shop", serde_json::json!({ "paused": true }));
    wait_until("the status says Paused", MINUTE, || async {
        let pg = api.get("shop").await.unwrap();
        let status = pg.status.unwrap_or_default();
        status.phase == Some(PostgreSQLPhase::Paused) && status.observed_generation == pg.metadata.generation
    })
    .await;
    ns.apply(
        "apiVersion: v1\nkind: Secret\nmetadata: { name: shop-db }\nstringData: { postgresql_password: second-Pa55 }\n",
    );
    kubectl_ok(&["delete", "service", "shop", "-n", &ns.name], None);
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        psql(&ip, "app", &password, "shop", "SELECT 1").is_ok(),
        "the password changed while paused"
    );
    assert_eq!(secret_value(&ns, "shop-connection", "password").await, password);
    let services = kubectl_ok(&["get", "service", "-n", &ns.name, "-o", "name"], None);
    assert!(
        !services.contains("service/shop\n"),
        "the Service was made again while paused: {services}"
    );
    // Its deletion wakes the database, whose status says what is missing (and changes nothing).
    wait_until("Ready False: the Service is missing", MINUTE, || async {
        condition(&api.get("shop").await.unwrap(), "Ready")
            .is_some_and(|(status, reason, _)| status == "False" && reason == "ServiceMissing")
    })
    .await;
    // The plugin says so, and a script sees it as not Ready (exit code 2).
    let out = noops_e2e::plugin::kubectl_noops(&["status", "pg/shop", "-n", &ns.name]);
    let text = noops_e2e::plugin::stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.lines().next().unwrap().ends_with("(Paused), PAUSED"), "{text}");
    assert!(text.contains("shop-0 on "), "{text}");
    assert!(event_reasons(&ns, "shop").await.iter().any(|r| r == "Paused"));

    // Resumed: the new password in the Secret becomes the database's; the old one stops
    // working; the Service is back.
    ns.merge_spec("pg/shop", serde_json::json!({ "paused": false }));
    wait_until("the new password works", MINUTE, || async {
        psql(&ip, "app", "second-Pa55", "shop", "SELECT 1").is_ok()
    })
    .await;
    let refused = psql(&ip, "app", &password, "shop", "SELECT 1").unwrap_err();
    assert!(refused.contains("password authentication failed"), "{refused}");
    wait_until("the connection Secret has the new password", MINUTE, || async {
        secret_value(&ns, "shop-connection", "password").await == "second-Pa55"
    })
    .await;
    wait_until("the Service made again", MINUTE, || async {
        kubectl_ok(&["get", "service", "-n", &ns.name, "-o", "name"], None).contains("service/shop\n")
    })
    .await;
    // The superuser is not reachable with the user's password, nor without one.
    assert!(psql(&ip, "postgres", "second-Pa55", "postgres", "SELECT 1").is_err());

    let reasons = event_reasons(&ns, "shop").await;
    for expected in [
        "UserCreated",
        "DatabaseCreated",
        "Serving",
        "PasswordChanged",
        "Resumed",
    ] {
        assert!(
            reasons.iter().any(|r| r == expected),
            "no {expected} Event in {reasons:?}"
        );
    }
    // A pod deleted by its user is being replaced: no Warning that the server is unreachable.
    assert!(!reasons.iter().any(|r| r == "Unreachable"), "{reasons:?}");
    assert!(
        !operator.log_text().contains("second-Pa55"),
        "a password in the operator's log"
    );
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());

    // A report holds the instance, its logs and Events, and neither password.
    let dir = std::env::temp_dir().join(format!("noops-report-{}", ns.name));
    let files = noops_e2e::plugin::report_files(&ns, "pg/shop", &dir);
    assert!(
        files.contains_key("objects/StatefulSet/shop.json"),
        "{:?}",
        files.keys()
    );
    assert!(files.contains_key("logs/shop-0/postgres.log"), "{:?}", files.keys());
    assert!(
        files["events.txt"].contains("PasswordChanged"),
        "{}",
        files["events.txt"]
    );
    for (path, text) in &files {
        assert!(
            !text.contains("second-Pa55") && !text.contains(&password),
            "a password in {path}"
        );
    }
    assert!(noops_e2e::plugin::assert_no_secret_in(&ns, &files).await >= 4);
    let _ = std::fs::remove_dir_all(&dir);

    // Deleting the PostgreSQL takes its StatefulSet, Service, Secrets and volume with it; the
    // user's own Secret stays.
    kubectl_ok(&["delete", "pg", "-n", &ns.name, "shop"], None);
    wait_until("everything the database owned is gone", 2 * MINUTE, || async {
        let left = kubectl_ok(
            &["get", "statefulset,service,pvc,secret", "-n", &ns.name, "-o", "name"],
            None,
        );
        !left.contains("statefulset")
            && !left.contains("persistentvolumeclaim")
            && !left.contains("shop-connection")
            && left.contains("secret/shop-db")
    })
    .await;
}

#[tokio::test]
async fn bad_specs_are_refused_with_a_reason() {
    install_crds();
    let ns = TestNamespace::new("pg-bad").await;
    let spec = |db: &str, user: &str, extra: &str| format!("  db: {db}\n  user: {user}\n  passwordSecret: s\n{extra}");
    let s3 = "{ endpoint: \"http://store\", bucket: pgb, credentialsSecret: k }";
    let refused_on_create = [
        (
            database_manifest("p", &spec("Shop", "app", "")),
            "db must be a plain PostgreSQL name",
        ),
        (
            database_manifest("p", &spec("my-shop", "app", "")),
            "db must be a plain PostgreSQL name",
        ),
        (
            database_manifest("p", &spec("postgres", "app", "")),
            "db cannot be postgres",
        ),
        (
            database_manifest("p", &spec("template1", "app", "")),
            "db cannot be postgres",
        ),
        (
            database_manifest("p", &spec("shop", "postgres", "")),
            "user cannot be postgres",
        ),
        (
            database_manifest("p", &spec("shop", "pg_admin", "")),
            "user cannot be postgres",
        ),
        (
            database_manifest("p", &spec("shop", "1app", "")),
            "user must be a plain PostgreSQL name",
        ),
        (
            database_manifest("p", "  db: shop\n  user: app\n"),
            "passwordSecret: Required",
        ),
        (
            database_manifest("p", &spec("shop", "app", "  version: \"9\"\n")),
            "version must be a PostgreSQL major version",
        ),
        (
            database_manifest("p", &spec("shop", "app", "  version: latest\n")),
            "version must be a PostgreSQL major version",
        ),
        (
            database_manifest("p", &spec("shop", "app", "  version: \"15.4\"\n")),
            "version must be a PostgreSQL major version",
        ),
        (
            database_manifest("p", &spec("shop", "app", "  storage: { size: lots }\n")),
            "storage.size must be a quantity",
        ),
        (
            database_manifest("p", &spec("shop", "app", "  service: { nodePort: 30432 }\n")),
            "service.nodePort needs service.type: NodePort",
        ),
        (
            database_manifest(
                "p",
                &spec("shop", "app", "  service: { type: NodePort, nodePort: 80 }\n"),
            ),
            "node port range",
        ),
        (
            database_manifest("p", &spec("shop", "app", "  service: { type: LoadBalancer }\n")),
            "Unsupported value: \"LoadBalancer\"",
        ),
        (
            database_manifest(&"x".repeat(46), &spec("shop", "app", "")),
            "at most 45 characters",
        ),
        (
            database_manifest("a.b", &spec("shop", "app", "")),
            "must be a DNS label",
        ),
        // Synchronous replication.
        (
            database_manifest("p", &spec("shop", "app", "  synchronous: { number: 1 }\n")),
            "spec.synchronous.number must be less than spec.instances",
        ),
        (
            database_manifest(
                "p",
                &spec("shop", "app", "  instances: 3\n  synchronous: { number: 0 }\n"),
            ),
            "synchronous.number must be between 1 and 8",
        ),
        (
            database_manifest(
                "p",
                &spec(
                    "shop",
                    "app",
                    "  instances: 3\n  synchronous: { number: 1, dataDurability: Sometimes }\n",
                ),
            ),
            "Unsupported value: \"Sometimes\"",
        ),
        // Backups and bootstrap.
        (
            database_manifest("p", &spec("shop", "app", "  backup: { maxBackups: 3 }\n")),
            "backup needs exactly one destination",
        ),
        (
            database_manifest(
                "p",
                &spec(
                    "shop",
                    "app",
                    &format!("  backup: {{ volume: {{ claimName: b }}, s3: {s3} }}\n"),
                ),
            ),
            "backup needs exactly one destination",
        ),
        (
            database_manifest(
                "p",
                &spec(
                    "shop",
                    "app",
                    "  backup: { s3: { endpoint: \"ftp://store\", bucket: pgb, credentialsSecret: k } }\n",
                ),
            ),
            "backup.s3.endpoint must be an http",
        ),
        (
            database_manifest(
                "p",
                &spec(
                    "shop",
                    "app",
                    "  backup: { s3: { endpoint: \"http://store\", bucket: pg, credentialsSecret: k } }\n",
                ),
            ),
            "should be at least 3 chars long",
        ),
        (
            database_manifest(
                "p",
                &spec(
                    "shop",
                    "app",
                    "  backup: { s3: { endpoint: \"http://store\", bucket: pgb, prefix: ../up, credentialsSecret: k } }\n",
                ),
            ),
            "backup.s3.prefix must be a relative key prefix",
        ),
        (
            database_manifest(
                "p",
                &spec("shop", "app", "  backup: { volume: { claimName: b, prefix: /etc } }\n"),
            ),
            "backup.volume.prefix must be a relative path",
        ),
        (
            database_manifest(
                "p",
                &spec(
                    "shop",
                    "app",
                    "  backup: { schedule: every hour, volume: { claimName: b } }\n",
                ),
            ),
            "backup.schedule must be a cron expression",
        ),
        (
            database_manifest(
                "p",
                &spec("shop", "app", "  backup: { maxBackups: 0, volume: { claimName: b } }\n"),
            ),
            "backup.maxBackups must be between 1 and 1000",
        ),
        (
            database_manifest(
                "p",
                &spec(
                    "shop",
                    "app",
                    "  backup: { archiveTimeoutSeconds: 0, volume: { claimName: b } }\n",
                ),
            ),
            "backup.archiveTimeoutSeconds must be between 1 and 3600",
        ),
        (
            database_manifest(
                "p",
                &spec(
                    "shop",
                    "app",
                    "  bootstrap: { fromBackup: { name: b, targetTime: yesterday } }\n",
                ),
            ),
            "bootstrap.fromBackup.targetTime must be an RFC 3339 time",
        ),
        (
            database_manifest(
                "p",
                &spec(
                    "shop",
                    "app",
                    "  bootstrap: { fromBackup: { targetTime: \"2026-01-01T00:00:00Z\" } }\n",
                ),
            ),
            "spec.bootstrap.fromBackup.name: Required",
        ),
    ];
    for (yaml, expected) in &refused_on_create {
        let error = apply_error(&ns, yaml).unwrap_or_else(|| panic!("accepted:\n{yaml}"));
        assert!(error.contains(expected), "refused, but not with {expected:?}: {error}");
    }

    // Changes that would orphan data or need a migration are refused on an existing database
    // (no operator runs here: nothing starts).
    ns.apply(&database_manifest("p", &spec("shop", "app", "")));
    let refused_on_update = [
        (database_manifest("p", &spec("other", "app", "")), "db is immutable"),
        (database_manifest("p", &spec("shop", "owner", "")), "user is immutable"),
        (
            database_manifest("p", &spec("shop", "app", "  storage: { size: 2Gi }\n")),
            "storage is immutable",
        ),
        (
            database_manifest("p", &spec("shop", "app", "  bootstrap: { fromBackup: { name: b } }\n")),
            "spec.bootstrap is immutable",
        ),
    ];
    for (yaml, expected) in &refused_on_update {
        let error = apply_error(&ns, yaml).unwrap_or_else(|| panic!("accepted:\n{yaml}"));
        assert!(error.contains(expected), "refused, but not with {expected:?}: {error}");
    }
    // Scaled below what synchronous replication asks for: refused through the scale
    // subresource too.
    ns.apply(&database_manifest(
        "q",
        &spec("shop", "app", "  instances: 2\n  synchronous: { number: 1 }\n"),
    ));
    let scaled = noops_e2e::kubectl(&["scale", "-n", &ns.name, "pg/q", "--replicas=1"], None);
    let said = String::from_utf8_lossy(&scaled.stderr);
    assert!(
        !scaled.status.success() && said.contains("spec.synchronous.number must be less than spec.instances"),
        "{said}"
    );
    // The version may change while the database has never run, not after.
    assert_eq!(
        apply_error(
            &ns,
            &database_manifest("p", &spec("shop", "app", "  version: \"16\"\n"))
        ),
        None
    );
    let status = serde_json::json!({ "status": { "systemIdentifier": "7300000000000000001" } });
    kubectl_ok(
        &[
            "patch",
            "pg",
            "p",
            "-n",
            &ns.name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ],
        None,
    );
    let error = apply_error(
        &ns,
        &database_manifest("p", &spec("shop", "app", "  version: \"15\"\n")),
    )
    .expect("refused");
    assert!(
        error.contains("spec.version cannot change once the database has run"),
        "{error}"
    );
    let kept = ns.api::<PostgreSQL>().get("p").await.unwrap();
    assert_eq!(
        (kept.spec.db.as_str(), kept.spec.version.as_str()),
        ("shop", "16"),
        "a refused edit changes nothing"
    );
}

#[tokio::test]
async fn a_missing_password_or_image_is_reported_and_fixed_by_the_user() {
    install_crds();
    let ns = TestNamespace::new("pg-problems").await;
    let operator = Operator::start(&ns.name, &["--controllers", "postgres"]);

    // A database whose Secret is not there yet: the instance runs, the database waits.
    ns.apply(&database_manifest(
        "shop",
        "  db: shop\n  user: app\n  passwordSecret: later\n",
    ));
    let waiting = wait_not_ready(&ns, "shop", "PasswordSecretMissing", 2 * MINUTE).await;
    let (_, _, message) = condition(&waiting, "Ready").unwrap();
    assert!(message.contains("Secret later"), "{message}");
    // A Secret with the wrong key says so; the right key makes it Ready.
    ns.apply("apiVersion: v1\nkind: Secret\nmetadata: { name: later }\nstringData: { pass: x }\n");
    wait_not_ready(&ns, "shop", "PasswordKeyMissing", MINUTE).await;
    ns.apply("apiVersion: v1\nkind: Secret\nmetadata: { name: later }\nstringData: { password: now-Pa55 }\n");
    wait_ready(&ns, "shop", MINUTE).await;
    let ip = instance_ip(&ns, "shop").await;
    assert_eq!(
        psql(&ip, "app", "now-Pa55", "shop", "SELECT current_user").unwrap(),
        "app"
    );
    noops_e2e::wait_event(&ns, "PostgreSQL", "shop", "PasswordSecretMissing").await;

    // A major version the local Kubernetes has no image for: said at once, and a corrected
    // version (the database never ran) starts.
    ns.apply(&manifest("other", "x-Pa55", "  version: \"16\"\n"));
    let stuck = wait_not_ready(&ns, "other", "InstancePodStuck", 2 * MINUTE).await;
    let (_, _, message) = condition(&stuck, "Ready").unwrap();
    // The node agent's pull error, or a real node's registry refusal (docs/local-kubernetes.md).
    assert!(
        message.contains("only PostgreSQL 15") || message.contains("postgres:16 is not built here"),
        "{message}"
    );
    assert_eq!(stuck.status.as_ref().unwrap().phase, Some(PostgreSQLPhase::Failed));
    ns.apply(&manifest("other", "x-Pa55", "  version: \"15\"\n"));
    wait_ready(&ns, "other", 3 * MINUTE).await;
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

#[tokio::test]
async fn a_spec_the_api_server_refuses_is_reported_and_never_stops_a_serving_database() {
    install_crds();
    let ns = TestNamespace::new("pg-refused").await;
    let operator = Operator::start(&ns.name, &["--controllers", "postgres"]);
    ns.apply(&manifest("shop", "pw-1", ""));
    wait_ready(&ns, "shop", 3 * MINUTE).await;
    let ip = instance_ip(&ns, "shop").await;
    psql(
        &ip,
        "app",
        "pw-1",
        "shop",
        "CREATE TABLE t (id int); INSERT INTO t VALUES (1)",
    )
    .unwrap();
    let pods = ns.api::<Pod>();
    let serving_pod = pods.get("shop-0").await.unwrap().metadata.uid;

    // Requests above limits pass the schema (a ResourceRequirements as Kubernetes has it) but
    // not the API server: said, with its words, and the running pod is left alone.
    let too_much = "  resources:\n    requests: { memory: 2Gi }\n    limits: { memory: 1Gi }\n";
    ns.apply(&manifest("shop", "pw-1", too_much));
    let pg = wait_reason(&ns, "shop", "Degraded", "True", "SpecRejected").await;
    let (_, _, message) = condition(&pg, "Degraded").unwrap();
    assert!(
        message.contains("StatefulSet") && message.contains("limit"),
        "{message}"
    );
    assert!(
        condition(&pg, "Ready").is_some_and(|(s, _, _)| s == "True"),
        "it still serves"
    );
    noops_e2e::wait_event(&ns, "PostgreSQL", "shop", "SpecRejected").await;
    // The rest of the pass goes on: a password changed meanwhile is still applied.
    ns.apply("apiVersion: v1\nkind: Secret\nmetadata: { name: shop-db }\nstringData: { postgresql_password: pw-2 }\n");
    wait_until("the new password while the spec is refused", MINUTE, || async {
        psql(&ip, "app", "pw-2", "shop", "SELECT 1").is_ok()
    })
    .await;
    assert_eq!(
        pods.get("shop-0").await.unwrap().metadata.uid,
        serving_pod,
        "the serving pod was not replaced"
    );
    assert_eq!(psql(&ip, "app", "pw-2", "shop", "SELECT count(*) FROM t").unwrap(), "1");
    // Corrected, it is applied (the pod rolls onto it) and the problem goes.
    ns.apply(&manifest("shop", "pw-2", "  resources:\n    limits: { memory: 1Gi }\n"));
    wait_reason(&ns, "shop", "Degraded", "False", "AsExpected").await;
    wait_until("the pod rolled onto the corrected spec", 2 * MINUTE, || async {
        pods.get_opt("shop-0").await.ok().flatten().is_some_and(|p| {
            let limit = p
                .spec
                .as_ref()
                .and_then(|s| s.containers.iter().find(|c| c.name == "postgres").cloned());
            limit
                .and_then(|c| c.resources?.limits?.get("memory").cloned())
                .is_some_and(|q| q.0 == "1Gi")
        })
    })
    .await;
    wait_ready(&ns, "shop", 2 * MINUTE).await;
    let ip = instance_ip(&ns, "shop").await;
    assert_eq!(psql(&ip, "app", "pw-2", "shop", "SELECT count(*) FROM t").unwrap(), "1");

    // Requests no node could ever give (64 CPUs): the API server takes them, but the pod would
    // never be scheduled. Said, with what the nodes have, and the serving pod is left alone.
    let serving_pod = pods.get("shop-0").await.unwrap().metadata.uid;
    let corrected = "  resources:\n    limits: { memory: 1Gi }\n";
    ns.apply(&manifest(
        "shop",
        "pw-2",
        "  resources:\n    requests: { cpu: \"64\" }\n    limits: { memory: 1Gi }\n",
    ));
    let pg = wait_reason(&ns, "shop", "Degraded", "True", "NoNodeFits").await;
    let (_, _, message) = condition(&pg, "Degraded").unwrap();
    assert!(
        message.contains("cpu 64") && message.contains("noops-node-"),
        "{message}"
    );
    assert!(
        condition(&pg, "Ready").is_some_and(|(s, _, _)| s == "True"),
        "it still serves"
    );
    noops_e2e::wait_event(&ns, "PostgreSQL", "shop", "NoNodeFits").await;
    ns.apply(&manifest("shop", "pw-2", corrected));
    wait_reason(&ns, "shop", "Degraded", "False", "AsExpected").await;
    assert_eq!(
        pods.get("shop-0").await.unwrap().metadata.uid,
        serving_pod,
        "the serving pod was never replaced"
    );
    assert_eq!(psql(&ip, "app", "pw-2", "shop", "SELECT count(*) FROM t").unwrap(), "1");

    // A node port another Service holds, on a first apply: not Ready (it has no Service),
    // with the API server's reason; a free port makes it Ready.
    ns.apply(&manifest(
        "first",
        "pw-3",
        "  service: { type: NodePort, nodePort: 32107 }\n",
    ));
    wait_ready(&ns, "first", 3 * MINUTE).await;
    ns.apply(&manifest(
        "second",
        "pw-4",
        "  service: { type: NodePort, nodePort: 32107 }\n",
    ));
    let second = wait_not_ready(&ns, "second", "SpecRejected", 3 * MINUTE).await;
    let (_, _, message) = condition(&second, "Ready").unwrap();
    assert!(message.contains("Service") && message.contains("32107"), "{message}");
    ns.apply(&manifest(
        "second",
        "pw-4",
        "  service: { type: NodePort, nodePort: 32108 }\n",
    ));
    let second = wait_ready(&ns, "second", 2 * MINUTE).await;
    assert_eq!(second.status.unwrap().node_port, Some(32108));
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}

#[tokio::test]
async fn three_instances_stream_from_the_primary_and_serve_reads_behind_their_own_services() {
    install_crds();
    let ns = TestNamespace::new("pg-replicas").await;
    let operator = Operator::start(&ns.name, &["--controllers", "postgres"]);
    // The example, as a user applies it.
    let example = std::fs::read_to_string(noops_e2e::root().join("examples/postgres/replicas.yaml")).unwrap();
    ns.apply(&example.replace("change-me", "Pa55word"));
    wait_ready(&ns, "shop", 3 * MINUTE).await;
    let pg = wait_reason(&ns, "shop", "ReplicasReady", "True", "Streaming").await;
    let status = pg.status.clone().unwrap();
    assert_eq!(status.current_primary.as_deref(), Some("shop-0"));
    assert_eq!(status.ready_instances, Some(3));
    let roles: Vec<(String, String)> = status
        .members
        .iter()
        .map(|m| (m.name.clone(), format!("{:?}", m.role)))
        .collect();
    assert_eq!(
        roles,
        vec![
            ("shop-0".to_string(), "Primary".to_string()),
            ("shop-1".to_string(), "Replica".to_string()),
            ("shop-2".to_string(), "Replica".to_string())
        ]
    );
    let nodes: std::collections::BTreeSet<_> = status.members.iter().filter_map(|m| m.node.clone()).collect();
    assert_eq!(
        nodes.len() < 3,
        status.placement.is_some(),
        "the status says when instances share a node: {:?}",
        status.placement
    );
    let listed = kubectl_get(&ns);
    assert!(
        listed.contains("INSTANCES") && listed.contains("PRIMARY") && listed.contains("shop-0"),
        "{listed}"
    );
    let out = noops_e2e::plugin::kubectl_noops(&["status", "pg/shop", "-n", &ns.name]);
    let said = noops_e2e::plugin::stdout(&out);
    assert!(said.contains("3 of 3 ready, primary shop-0"), "{said}");
    let replicas = said
        .lines()
        .filter(|l| l.contains("Replica") && l.contains("ready"))
        .count();
    assert_eq!(replicas, 2, "{said}");
    for (pod, role) in [("shop-0", "primary"), ("shop-1", "replica"), ("shop-2", "replica")] {
        let labels = ns.pods().get(pod).await.unwrap().metadata.labels.unwrap();
        assert_eq!(labels.get("noops.dev/role").map(String::as_str), Some(role), "{pod}");
    }
    // What the alerts on replicas read: replicas asked for, streaming, and each one's lag.
    let resource = format!("kind=\"PostgreSQL\",namespace=\"{}\",name=\"shop\"", ns.name);
    let replicas_in_metrics = |wanted: f64, lagging: &'static [&'static str]| {
        let (operator, resource) = (&operator, resource.clone());
        async move {
            let series = |metric: &str, instance: Option<&str>| match instance {
                Some(i) => format!("{metric}{{{resource},instance=\"{i}\"}}"),
                None => format!("{metric}{{{resource}}}"),
            };
            wait_until(&format!("{wanted} replicas streaming in /metrics"), MINUTE, || async {
                let mut right = operator.metric(&series("noops_postgres_replicas_wanted", None)).await == Some(wanted)
                    && operator
                        .metric(&series("noops_postgres_replicas_streaming", None))
                        .await
                        == Some(wanted);
                for instance in ["shop-0", "shop-1", "shop-2"] {
                    let lag = operator
                        .metric(&series("noops_postgres_replication_lag_bytes", Some(instance)))
                        .await;
                    right &= lag.is_some() == lagging.contains(&instance);
                }
                right
            })
            .await;
        }
    };
    replicas_in_metrics(2.0, &["shop-1", "shop-2"]).await;

    // Writes through <name>-rw (and <name>), reads through <name>-ro, which refuses writes.
    let password = secret_value(&ns, "shop-db", "postgresql_password").await;
    let (rw, ro) = (service_ip(&ns, "shop-rw").await, service_ip(&ns, "shop-ro").await);
    let user = "shop";
    psql(
        &rw,
        user,
        &password,
        "shop",
        "CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, 100)",
    )
    .unwrap();
    let replicated = |count: &'static str| {
        let ro = ro.clone();
        let password = password.clone();
        async move {
            wait_until(&format!("{count} rows read through shop-ro"), MINUTE, || async {
                psql(&ro, user, &password, "shop", "SELECT count(*) FROM items").is_ok_and(|c| c == count)
            })
            .await
        }
    };
    replicated("100").await;
    let refused = psql(&ro, user, &password, "shop", "INSERT INTO items VALUES (101)").unwrap_err();
    assert!(refused.contains("read-only transaction"), "{refused}");
    let read_only_uri = secret_value(&ns, "shop-connection", "ro_uri").await;
    assert!(
        read_only_uri.contains(&format!("@shop-ro.{}.svc:5432/shop", ns.name)),
        "{read_only_uri}"
    );

    // A replica's pod deleted comes back on its volume and catches up with what it missed.
    ns.pods().delete("shop-2", &Default::default()).await.unwrap();
    psql(
        &rw,
        user,
        &password,
        "shop",
        "INSERT INTO items SELECT generate_series(101, 200)",
    )
    .unwrap();
    ns.wait_pod_ready("shop-2", 2 * MINUTE).await;
    let replica_2 = wait_for("shop-2 streaming again with every row", 2 * MINUTE, || async {
        let ip = ns.pods().get("shop-2").await.ok()?.status?.pod_ip?;
        let rows = psql(&ip, user, &password, "shop", "SELECT count(*) FROM items").ok()?;
        (rows == "200").then_some(ip)
    })
    .await;
    assert!(!replica_2.is_empty());
    wait_reason(&ns, "shop", "ReplicasReady", "True", "Streaming").await;

    rolls_out_a_new_image_with_one_switchover(&ns, &rw, &password).await;
    // The highest instance is never scaled away while it is the primary: moved off it first.
    let mut primary = last_primary(&ns).await;
    if primary == "shop-2" {
        let (code, said) =
            noops_e2e::plugin::kubectl_noops_waiting(&["promote", "pg/shop", "shop-0", "-n", &ns.name]).await;
        assert_eq!(code, Some(0), "{said}");
        primary = "shop-0".into();
    }
    let remaining_replica = if primary == "shop-0" { "shop_1" } else { "shop_0" };

    // Scaled down: the last replica goes, and so does its slot on the primary.
    kubectl_ok(&["scale", "-n", &ns.name, "pg/shop", "--replicas=2"], None);
    let superuser = noops_e2e::postgres::superuser_password(&ns, "shop").await;
    let primary_ip = ns
        .wait_pod_ready(&primary, 2 * MINUTE)
        .await
        .status
        .unwrap()
        .pod_ip
        .unwrap();
    wait_until("shop-2's slot dropped", 2 * MINUTE, || async {
        psql(
            &primary_ip,
            "postgres",
            &superuser,
            "postgres",
            "SELECT string_agg(slot_name, ',' ORDER BY slot_name) FROM pg_replication_slots",
        )
        .is_ok_and(|slots| slots == format!("noops_{remaining_replica}"))
    })
    .await;
    let pg = wait_reason(&ns, "shop", "ReplicasReady", "True", "Streaming").await;
    assert_eq!(pg.status.unwrap().ready_instances, Some(2));
    replicated("200").await;
    // The series of the replica scaled away go with it.
    let replica = if primary == "shop-0" { "shop-1" } else { "shop-0" };
    replicas_in_metrics(1.0, if replica == "shop-1" { &["shop-1"] } else { &["shop-0"] }).await;
    let claims = ns.api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>();
    wait_until("shop-2's volume gone with it", MINUTE, || async {
        claims.get_opt("data-shop-2").await.is_ok_and(|c| c.is_none())
    })
    .await;
}

/// A rolling change of `shop` (its image pulled from a mirror), with a client committing into
/// a database of its own through `rw` every 20 ms: the replicas restart one at a time, then
/// the primary steps down once for an updated replica (a watch on the lease sees one release
/// and one handover, no failover), then restarts as a replica. Writes wait about a second, and
/// no acknowledged commit is lost (synchronous: a commit is on a replica when acknowledged).
async fn rolls_out_a_new_image_with_one_switchover(ns: &TestNamespace, rw: &str, password: &str) {
    let superuser = noops_e2e::postgres::superuser_password(ns, "shop").await;
    psql(
        rw,
        "postgres",
        &superuser,
        "postgres",
        "CREATE DATABASE ledger OWNER shop",
    )
    .unwrap();
    psql(
        rw,
        "shop",
        password,
        "ledger",
        "CREATE TABLE items (id bigint PRIMARY KEY)",
    )
    .unwrap();
    let primary = last_primary(ns).await;
    let lease = noops_e2e::postgres::LeaseWatch::start(ns, "shop-primary").await;
    let ledger = noops_e2e::postgres::Ledger::start(rw, "shop", password, "ledger", Duration::from_millis(20));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let image = pull_from_a_mirror(ns);
    wait_all_on_image(ns, image).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = ledger.stop().await;
    let holders = lease.holders();
    let record = last_failover(ns, "shop").await;
    eprintln!("rolling change: lease holders {holders:?}, {record:?}");
    assert_eq!(holders.first(), Some(&Some(primary.clone())), "{holders:?}");
    assert_eq!(holders.len(), 3, "one release and one handover: {holders:?}");
    assert_eq!(holders[1], None, "{holders:?}");
    assert!(
        record.switchover && record.reason.contains("rolling change") && record.from.as_deref() == Some(&primary),
        "{record:?}"
    );
    assert_eq!(holders[2].as_deref(), Some(record.to.as_str()));
    let reasons = event_reasons(ns, "shop").await;
    assert_eq!(
        reasons.iter().filter(|r| *r == "SwitchingOver").count(),
        1,
        "{reasons:?}"
    );
    assert!(!reasons.iter().any(|r| r == "FailedOver"), "{reasons:?}");
    let missing = report.lost_in((rw, "shop", password, "ledger"), "synchronous");
    assert!(missing.is_empty(), "lost {missing:?}");
    // About 1.1 s alone on this machine, 2.2 s seen beside three other tests; a failover
    // would cost a lease (6 s) and more.
    assert!(
        report.longest_gap <= Duration::from_secs(4),
        "writes waited {:?}",
        report.longest_gap
    );
}

/// Changes `shop`'s image repository to a mirror's (a rolling change); returns the image.
fn pull_from_a_mirror(ns: &TestNamespace) -> &'static str {
    kubectl_ok(
        &[
            "patch",
            "pg/shop",
            "-n",
            &ns.name,
            "--type=merge",
            "-p",
            r#"{"spec":{"imageRepository":"registry.local/postgres"}}"#,
        ],
        None,
    );
    "registry.local/postgres:15"
}

/// Waits until every instance of `shop` runs `image`, Ready, the replicas streaming.
async fn wait_all_on_image(ns: &TestNamespace, image: &str) {
    let pods = ns.pods();
    wait_until("every instance on the new image, streaming", 5 * MINUTE, || async {
        let all = pods.list(&Default::default()).await.unwrap().items;
        let updated = all
            .iter()
            .filter(|p| p.metadata.name.as_deref().is_some_and(|n| n.starts_with("shop-")))
            .filter(|p| {
                let spec = p.spec.as_ref().unwrap();
                spec.containers[0].image.as_deref() == Some(image) && noops_e2e::pod_ready(p)
            })
            .count();
        let pg = ns.api::<PostgreSQL>().get("shop").await.unwrap();
        updated == 3 && condition(&pg, "ReplicasReady").is_some_and(|(s, r, _)| s == "True" && r == "Streaming")
    })
    .await;
}

/// The primary `shop`'s status names.
async fn last_primary(ns: &TestNamespace) -> String {
    let pg = ns.api::<PostgreSQL>().get("shop").await.unwrap();
    pg.status.and_then(|s| s.current_primary).expect("a primary")
}

#[tokio::test]
async fn a_lost_primary_is_replaced_by_the_most_advanced_replica_and_comes_back_as_a_replica() {
    install_crds();
    let ns = TestNamespace::new("pg-failover").await;
    let operator = Operator::start(&ns.name, &["--controllers", "postgres"]);
    let (password, rw, ledger) = three_instances_under_a_ledger(&ns, "").await;

    // The primary's pod frozen whole, as a hung node: it renews nothing, its lease runs out,
    // and the replica that received the most WAL is promoted; the Services follow it.
    let lease = noops_e2e::postgres::LeaseWatch::start(&ns, "shop-primary").await;
    let frozen = noops_e2e::postgres::Frozen::pod(&ns, "shop-0");
    let first = wait_failed_over(&ns, "shop", "shop-0").await;
    let failed_over_at = std::time::Instant::now();
    assert!(first.reason.contains("ran out"), "{first:?}");
    eprintln!("frozen primary: {first:?}");
    // One primary: the old one stops its server 4 s after its last renewal; the lease, seen
    // by a watch (every renewal is a change), passed on only after it had gone unrenewed for
    // longer than that (the operator waits 6 s).
    let silence = lease
        .silence_before_handover("shop-0", &first.to)
        .expect("the watch saw the handover");
    assert!(
        silence > Duration::from_secs(5),
        "the lease passed on after only {silence:?}"
    );
    let pods = ns.pods();
    let labels = pods.get(&first.to).await.unwrap().metadata.labels.unwrap();
    assert_eq!(labels.get("noops.dev/role").map(String::as_str), Some("primary"));
    wait_event(&ns, "PostgreSQL", "shop", "FailedOver").await;
    // Thawed, it finds its deadline passed and another holding the lease: it stops its server
    // at once and starts again as a replica.
    frozen.thaw();

    // The old primary comes back as a replica of the new one (rewound), streaming.
    wait_rejoined(&ns, "shop-0").await;

    // The new primary's pod deleted gracefully once both replicas stream from it: its server
    // stops (its WAL senders send them every record first), it gives its lease up saying
    // where its WAL ended, and the replica that has all of it is promoted at once. (A replica
    // not streaming yet would lack commits: `every_pod_deleted_at_once…` is that case.)
    wait_reason(&ns, "shop", "ReplicasReady", "True", "Streaming").await;
    pods.delete(&first.to, &Default::default()).await.unwrap();
    let second = wait_failed_over(&ns, "shop", &first.to).await;
    assert!(second.reason.contains("gave its lease up"), "{second:?}");
    eprintln!("deleted primary: {second:?}");

    // The primary's pod force-deleted on a live node: the node agent still sends its
    // processes SIGTERM and kills them at once. Either the instance manager had the time to
    // stop the server and give its lease up (a failover, as for a deletion), or it was killed
    // first and its replacement (same name, same volume) still holds the lease and recovers in
    // place. Either way the database serves again from one primary, a pod of the new
    // generation, and no commit the replicas had is lost.
    wait_reason(&ns, "shop", "ReplicasReady", "True", "Streaming").await;
    let old_uid = pods.get(&second.to).await.unwrap().metadata.uid;
    kubectl_ok(
        &[
            "delete",
            "pod",
            "-n",
            &ns.name,
            &second.to,
            "--grace-period=0",
            "--force",
        ],
        None,
    );
    let primary = wait_for("serving again after the force-delete", 2 * MINUTE, || async {
        let pg = ns.api::<PostgreSQL>().get("shop").await.ok()?;
        let status = pg.status?;
        let primary = status.current_primary?;
        let pod = pods.get(&primary).await.ok()?;
        let failed_over = status
            .last_failover
            .as_ref()
            .is_some_and(|f| f.from.as_deref() == Some(second.to.as_str()) && f.to == primary);
        let in_place = primary == second.to && pod.metadata.uid != old_uid;
        (noops_e2e::pod_ready(&pod) && (failed_over || in_place)).then_some(primary)
    })
    .await;
    eprintln!("force-deleted primary {}: {primary} serves", second.to);
    // A switchover, asynchronous, with the operator killed (SIGKILL) right after it released
    // the lease and right after it handed it over: it finishes, and loses no commit. (Then a
    // rolling change, below, under the same kills.)
    drop(operator);
    let points = std::env::temp_dir().join(format!("noops-pg-switchover-points-{}", ns.name));
    let _ = std::fs::remove_file(&points);
    let supervisor = Supervisor::start(&ns.name, &points);
    wait_reason(&ns, "shop", "ReplicasReady", "True", "Streaming").await;
    let target = ["shop-0", "shop-1", "shop-2"]
        .into_iter()
        .find(|p| *p != primary)
        .unwrap()
        .to_string();
    let switch_started = std::time::Instant::now();
    let (code, said) =
        noops_e2e::plugin::kubectl_noops_waiting(&["promote", "pg/shop", &target, "-n", &ns.name, "--timeout", "180"])
            .await;
    assert_eq!(code, Some(0), "{said}");
    let crashed = std::fs::read_to_string(&points).unwrap_or_default();
    for point in [
        "postgres: lease released for a switchover",
        "postgres: lease handed over for a switchover, status not written",
    ] {
        assert!(
            crashed.lines().any(|l| l == point),
            "never crashed at {point}: {crashed}"
        );
    }
    let record = last_failover(&ns, "shop").await;
    assert!(record.switchover && record.to == target, "{record:?}");
    // Recorded by the operator started after the kill that followed the handover, from the
    // lease: when writes stopped is not known to it, and no gap is made up.
    assert_eq!(record.write_gap_millis, None, "{record:?}");
    assert_eq!(record.from.as_deref(), Some(primary.as_str()));
    eprintln!("switchover through two operator kills: {said}");
    wait_rejoined(&ns, &primary).await;

    // A rolling change with the operator killed right after it restarted a replica: the
    // operator started again goes on from the pods' revisions, and the change ends with one
    // switchover away from the primary.
    let image = pull_from_a_mirror(&ns);
    wait_all_on_image(&ns, image).await;
    let crashed = std::fs::read_to_string(&points).unwrap_or_default();
    assert!(
        crashed
            .lines()
            .any(|l| l == "postgres: instance restarted for a rolling change"),
        "never crashed during the rollout: {crashed}"
    );
    let rolled = wait_failed_over(&ns, "shop", &target).await;
    assert!(
        rolled.switchover && rolled.reason.contains("rolling change"),
        "{rolled:?}"
    );
    eprintln!("rolling change through an operator kill: {rolled:?}");

    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = ledger.stop().await;
    let pg = wait_reason(&ns, "shop", "ReplicasReady", "True", "Streaming").await;
    assert_eq!(pg.status.unwrap().current_primary.as_deref(), Some(rolled.to.as_str()));
    // (Stopped only now: the status above is the operator's.)
    let (restarts, _) = supervisor.stop().await;
    assert!(restarts >= 2, "the operator was started again {restarts} times");
    let missing = report.lost_in_shop(&rw, &password, "asynchronous");
    let since_switchover: Vec<i64> = report
        .acked
        .iter()
        .zip(&report.acked_at)
        .filter(|(_, at)| **at >= switch_started)
        .map(|(id, _)| *id)
        .collect();
    assert!(
        missing.iter().all(|id| !since_switchover.contains(id)),
        "the switchover lost commits: {missing:?}"
    );
    // Asynchronous: what is lost is what the frozen primary acknowledged and no replica had
    // received: its last commits, one run of them, right before the write gap of the failover
    // (the next commit acknowledged is the new primary's, seconds later), never a commit of a
    // later primary. (Judged by order, not by the time of the freeze: on a loaded machine the
    // client may read an acknowledgement a second or more after the server sent it.)
    let lost_at: Vec<usize> = report
        .acked
        .iter()
        .enumerate()
        .filter(|(_, id)| missing.contains(id))
        .map(|(i, _)| i)
        .collect();
    if let (Some(&first_lost), Some(&last_lost)) = (lost_at.first(), lost_at.last()) {
        assert_eq!(
            last_lost - first_lost + 1,
            lost_at.len(),
            "lost commits that are not one run of the frozen primary's last: {missing:?}"
        );
        assert!(
            report.acked_at[last_lost] < failed_over_at,
            "a commit acknowledged after the failover was lost: {missing:?}"
        );
        let next = report.acked_at.get(last_lost + 1).copied();
        assert!(
            next.is_none_or(|next| next.duration_since(report.acked_at[last_lost]) >= Duration::from_secs(2)),
            "lost commits followed by one the same primary acknowledged (no failover gap after them): {missing:?}"
        );
    }
    assert!(
        report.longest_gap < Duration::from_secs(30),
        "writes waited {:?}",
        report.longest_gap
    );
}

#[tokio::test]
async fn every_pod_deleted_at_once_brings_the_primary_back_as_the_primary_with_every_commit() {
    install_crds();
    let ns = TestNamespace::new("pg-all-deleted").await;
    let _operator = Operator::start(&ns.name, &["--controllers", "postgres"]);
    let (password, rw, ledger) = instances_under_a_ledger(&ns, 2, "").await;
    let primary = last_primary(&ns).await;
    let pods = ns.pods();
    let old_uid = pods.get(&primary).await.unwrap().metadata.uid;
    // Every holder of the lease, from a watch: a handover to the replica, however brief, is seen.
    let lease = noops_e2e::postgres::LeaseWatch::start(&ns, "shop-primary").await;

    // Both pods deleted together (`kubectl delete pods -l …`, a node drained with both on
    // it): the primary stops cleanly and gives its lease up, and the replica, stopped too,
    // cannot take its place (it is not Ready, and may lack its last commits). Nothing is
    // promoted: the lease goes back to the old primary once its pod runs again, and it serves
    // again with every commit it acknowledged.
    kubectl_ok(
        &[
            "delete",
            "pods",
            "-n",
            &ns.name,
            "-l",
            "noops.dev/postgres=shop",
            "--wait=false",
        ],
        None,
    );
    wait_event(&ns, "PostgreSQL", "shop", "PrimaryKept").await;
    let pg = wait_reason(&ns, "shop", "ReplicasReady", "True", "Streaming").await;
    let status = pg.status.unwrap();
    assert_eq!(status.current_primary.as_deref(), Some(primary.as_str()));
    assert!(
        status.last_failover.is_none(),
        "nothing was promoted: {:?}",
        status.last_failover
    );
    assert_ne!(
        pods.get(&primary).await.unwrap().metadata.uid,
        old_uid,
        "a new pod serves"
    );
    assert_eq!(
        lease.holders(),
        vec![Some(primary.clone()), None, Some(primary.clone())],
        "given up by the primary and given back to it, never to the replica"
    );

    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = ledger.stop().await;
    let missing = report.lost_in_shop(&rw, &password, "asynchronous");
    assert!(missing.is_empty(), "lost acknowledged commits: {missing:?}");
    assert!(
        report.longest_gap < Duration::from_secs(60),
        "writes waited {:?}",
        report.longest_gap
    );
}

#[tokio::test]
async fn with_synchronous_replication_no_acknowledged_commit_is_lost_and_commits_wait_as_the_user_chose() {
    install_crds();
    let ns = TestNamespace::new("pg-sync").await;
    let operator = Operator::start(&ns.name, &["--controllers", "postgres"]);
    let (password, rw, ledger) = three_instances_under_a_ledger(&ns, "  synchronous: { number: 1 }\n").await;
    let pg = wait_reason(&ns, "shop", "SynchronousReplicas", "True", "Synchronous").await;
    assert_eq!(
        pg.status.unwrap().synchronous_standby_names.as_deref(),
        Some(r#"ANY 1 ("shop-1", "shop-2")"#)
    );
    // Replicas being made on a first apply are waited for, not news.
    let reasons = event_reasons(&ns, "shop").await;
    assert!(
        !reasons.iter().any(|r| r.starts_with("SynchronousReplicas")),
        "{reasons:?}"
    );
    // Every holder of the lease, from a watch: no sampling can miss a handover.
    let lease = noops_e2e::postgres::LeaseWatch::start(&ns, "shop-primary").await;

    // shop-2 stops (frozen): commits go on, acknowledged by shop-1 alone, and shop-2 falls
    // behind. Then the primary and shop-1 stop together and shop-2 comes back: the only
    // replica that answers lacks commits that were acknowledged, so it is not promoted.
    let frozen_2 = noops_e2e::postgres::Frozen::pod(&ns, "shop-2");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let frozen_0 = noops_e2e::postgres::Frozen::pod(&ns, "shop-0");
    let frozen_1 = noops_e2e::postgres::Frozen::pod(&ns, "shop-1");
    frozen_2.thaw();
    let waiting = wait_for(
        "the failover waiting for a replica with every commit",
        2 * MINUTE,
        || async {
            let pg = ns.api::<PostgreSQL>().get("shop").await.ok()?;
            condition(&pg, "Ready")
                .filter(|(s, r, m)| s == "False" && r == "PrimaryLost" && m.contains("2 must answer"))
        },
    )
    .await;
    eprintln!("primary and shop-1 stopped: {waiting:?}");
    // shop-1 back: it holds every acknowledged commit, and is promoted.
    frozen_1.thaw();
    let failover = wait_failed_over(&ns, "shop", "shop-0").await;
    assert_eq!(failover.to, "shop-1", "{failover:?}");
    assert_eq!(
        lease.holders(),
        vec![Some("shop-0".to_string()), Some("shop-1".to_string())],
        "the lease went from shop-0 to shop-1 and to nobody else (never to the lagging shop-2)"
    );
    frozen_0.thaw();
    wait_rejoined(&ns, "shop-0").await;
    let pg = wait_reason(&ns, "shop", "SynchronousReplicas", "True", "Synchronous").await;
    assert_eq!(
        pg.status.unwrap().synchronous_standby_names.as_deref(),
        Some(r#"ANY 1 ("shop-0", "shop-2")"#),
        "the new primary waits for the others"
    );

    // A switchover to a replica that does not stream (frozen for longer than a reply may
    // take), asked without the plugin (which checks the status first): the operator asks the
    // primary, refuses with the reason, and removes the request; the lease is untouched.
    let promote = |to: &'static str| {
        let ns = ns.name.clone();
        async move {
            noops_e2e::plugin::kubectl_noops_waiting(&["promote", "pg/shop", to, "-n", &ns, "--timeout", "90"]).await
        }
    };
    let frozen_0 = noops_e2e::postgres::Frozen::pod(&ns, "shop-0");
    tokio::time::sleep(Duration::from_secs(7)).await;
    kubectl_ok(
        &[
            "annotate",
            "-n",
            &ns.name,
            "postgresql/shop",
            "noops.dev/promote=shop-0",
        ],
        None,
    );
    wait_event(&ns, "PostgreSQL", "shop", "SwitchoverRefused").await;
    let events = kubectl_ok(
        &[
            "get",
            "events",
            "-n",
            &ns.name,
            "--field-selector",
            "reason=SwitchoverRefused",
        ],
        None,
    );
    assert!(events.contains("shop-0 does not stream"), "{events}");
    wait_until("the refused request removed", MINUTE, || async {
        let pg = ns.api::<PostgreSQL>().get("shop").await.unwrap();
        pg.metadata
            .annotations
            .is_none_or(|a| !a.contains_key("noops.dev/promote"))
    })
    .await;
    // The plugin's own check: not an instance of the database.
    let (code, said) = promote("shop-7").await;
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("refused") && said.contains("not an instance"), "{said}");
    frozen_0.thaw();
    wait_rejoined(&ns, "shop-0").await;
    // To a replica that streams (as its status says: on a loaded machine a reply may come
    // late, and the plugin then refuses, rightly): the primary steps down cleanly, the replica
    // is promoted once it has all of its WAL, the old primary follows it; writes wait
    // briefly, none is lost.
    wait_rejoined(&ns, "shop-2").await;
    let asked = std::time::Instant::now();
    let (code, said) = promote("shop-2").await;
    let done = std::time::Instant::now();
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("shop-2 is the primary"), "{said}");
    eprintln!("switchover: {said}");
    let record = last_failover(&ns, "shop").await;
    assert!(record.switchover, "{record:?}");
    assert_eq!((record.from.as_deref(), record.to.as_str()), (Some("shop-1"), "shop-2"));
    assert_eq!(
        lease.holders(),
        ["shop-0", "shop-1", "", "shop-2"].map(|h| Some(h.to_string()).filter(|h| !h.is_empty())),
        "released by shop-1, then held by shop-2 only"
    );
    wait_rejoined(&ns, "shop-1").await;
    wait_event(&ns, "PostgreSQL", "shop", "SwitchedOver").await;

    // The new primary's pod deleted: a replica that holds every commit takes over.
    ns.pods().delete("shop-2", &Default::default()).await.unwrap();
    let second = wait_failed_over(&ns, "shop", "shop-2").await;
    eprintln!("deleted primary: {second:?}");
    wait_reason(&ns, "shop", "ReplicasReady", "True", "Streaming").await;

    // The new primary's server hangs: every process of it stopped, its instance manager
    // running on. It stops answering, so the lease is renewed no more; at the deadline the
    // server is killed whole and the lease given up, and a replica holding every commit takes
    // over. Resumed, nothing of the old server is left to acknowledge anything.
    let hung = noops_e2e::postgres::StoppedServer::of(&ns, &second.to);
    let third = wait_failed_over(&ns, "shop", &second.to).await;
    assert!(third.reason.contains("gave its lease up"), "{third:?}");
    eprintln!("hung server: {third:?}");
    wait_until("every process of the hung server killed", MINUTE, || async {
        hung.gone()
    })
    .await;
    hung.resume();
    wait_rejoined(&ns, &second.to).await;
    wait_reason(&ns, "shop", "ReplicasReady", "True", "Streaming").await;
    let report = ledger.stop().await;
    let missing = report.lost_in_shop(&rw, &password, "synchronous");
    assert!(missing.is_empty(), "acknowledged and lost: {missing:?}");
    let switchover_gap = report.longest_gap_between(asked, done);
    eprintln!(
        "switchover: writes waited {switchover_gap:?} (the operator measured {:?} ms)",
        record.write_gap_millis
    );
    assert!(
        switchover_gap < Duration::from_secs(3),
        "writes waited {switchover_gap:?} in the switchover"
    );

    // Both replicas stopped: with Required (the default) a commit waits for one of them...
    let primary = third.to.clone();
    let replicas: Vec<String> = ["shop-0", "shop-1", "shop-2"]
        .into_iter()
        .filter(|p| *p != primary)
        .map(str::to_string)
        .collect();
    let frozen: Vec<_> = replicas
        .iter()
        .map(|r| noops_e2e::postgres::Frozen::pod(&ns, r))
        .collect();
    let commit = |id: i64, within: Duration| {
        let (rw, password) = (rw.clone(), password.clone());
        async move {
            let sql = format!("INSERT INTO items VALUES ({id}) ON CONFLICT DO NOTHING");
            noops_e2e::postgres::commits_within(&rw, "app", &password, "shop", &sql, within).await
        }
    };
    assert!(
        !commit(-1, Duration::from_secs(4)).await,
        "a commit with no replica was acknowledged"
    );
    let short = wait_reason(&ns, "shop", "SynchronousReplicas", "False", "TooFewReplicas").await;
    eprintln!("{:?}", condition(&short, "SynchronousReplicas"));
    wait_event(&ns, "PostgreSQL", "shop", "SynchronousReplicasShort").await;
    // ...and with Preferred, commits go on without them, said in the condition.
    ns.apply(&manifest(
        "shop",
        "Pa55word",
        "  instances: 3\n  synchronous: { number: 1, dataDurability: Preferred }\n",
    ));
    wait_until("a commit acknowledged with no replica", MINUTE, || {
        commit(-2, Duration::from_secs(2))
    })
    .await;
    let pg = wait_reason(&ns, "shop", "SynchronousReplicas", "False", "TooFewReplicas").await;
    let (_, _, message) = condition(&pg, "SynchronousReplicas").unwrap();
    assert!(message.contains("asynchronously"), "{message}");
    drop(frozen);
    wait_reason(&ns, "shop", "SynchronousReplicas", "True", "Synchronous").await;
    wait_event(&ns, "PostgreSQL", "shop", "SynchronousReplicasBack").await;
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}
