//! `kubectl noops` (status, backup, report, pause, resume; `promote` is run in postgres.rs)
//! against real resources, through kubectl's plugin lookup (the plugin on the PATH as `setup`
//! puts it, in .noops/bin): what it prints for an EtcdCluster (members,
//! leader, a backup and its size, certificates, the paused state) and a MaintPage (its side,
//! paused and resumed), its JSON, and its exit codes. Needs `make cluster-up`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use noops_e2e::etcd::{
    claim_manifest, cluster_manifest, etcd_version, volume_backup_spec, wait_backup_done, wait_cluster_ready,
};
use noops_e2e::plugin::{assert_no_secret_in, kubectl_noops, report_files, stdout};
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn status_shows_members_leader_backups_certificates_and_the_paused_state() {
    install_crds();
    let ns = TestNamespace::new("plugin").await;
    let _operator = Operator::start(&ns.name, &["--controllers", "etcd,etcdbackup,maintpage"]);
    let version = etcd_version("3.5");
    ns.apply(&claim_manifest("etcd-backups", "1Gi"));
    ns.apply(&cluster_manifest(
        "main",
        3,
        &version,
        &volume_backup_spec("etcd-backups", None, 3),
    ));
    let shop = std::fs::read_to_string(root().join("examples/maintpage/shop.yaml")).unwrap();
    ns.apply(&shop);
    let cluster = wait_cluster_ready(&ns, "main", 3, 3 * MINUTE).await;

    // A backup now, waited for with a line at each change.
    let out = kubectl_noops(&["backup", "etcd/main", "-n", &ns.name]);
    let said = stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manual = said
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("EtcdBackup "))
        .unwrap_or_else(|| panic!("{said}"))
        .to_string();
    assert!(manual.starts_with("main-manual-"), "{said}");
    assert!(said.lines().last().unwrap().contains("Succeeded"), "{said}");
    let backup = wait_backup_done(&ns, &manual).await;
    let size = backup.status.unwrap().progress.size.unwrap();

    // Text: the state, the members with the leader, the backup with its size, certificates.
    let out = kubectl_noops(&["status", "etcdcluster/main", "-n", &ns.name]);
    let text = stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let leader = cluster.status.unwrap().leader.unwrap();
    assert!(
        text.starts_with(&format!("EtcdCluster {}/main: Ready (Running)\n", ns.name)),
        "{text}"
    );
    let leader_line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{leader} ")))
        .unwrap_or_else(|| panic!("no member line for the leader {leader}:\n{text}"));
    assert!(
        leader_line.contains("leader") && leader_line.contains("healthy"),
        "{leader_line}"
    );
    assert_eq!(text.lines().filter(|l| l.contains(" voter ")).count(), 2, "{text}");
    let backup_line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{manual} ")))
        .unwrap_or_else(|| panic!("no backup line:\n{text}"));
    assert!(backup_line.contains("Succeeded"), "{backup_line}");
    let kib = format!("{:.1} KiB", size as f64 / 1024.0);
    let mib = format!("{:.1} MiB", size as f64 / 1024.0 / 1024.0);
    let bytes = format!("{size} B");
    assert!(
        backup_line.contains(&kib) || backup_line.contains(&mib) || backup_line.contains(&bytes),
        "size {size} not in {backup_line}"
    );
    for secret in ["main-peer", "main-server", "main-client"] {
        assert!(text.contains(secret), "no certificate {secret}:\n{text}");
    }

    // JSON, for scripts.
    let out = kubectl_noops(&["status", "etcd/main", "-n", &ns.name, "-o", "json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["ready"], true);
    assert_eq!(json["paused"], false);
    let members = json["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["title"] == "Members")
        .unwrap();
    assert_eq!(members["rows"].as_array().unwrap().len(), 3);

    // A report: a tar.gz that opens, with the cluster, its members' pods and their logs, its
    // backups, Events and status, and no secret (the certificates' keys are Secrets here).
    let dir = std::env::temp_dir().join(format!("noops-report-{}", ns.name));
    let files = report_files(&ns, "etcd/main", &dir);
    let names: Vec<&String> = files.keys().collect();
    assert!(files["EtcdCluster.json"].contains("\"replicas\": 3"), "{names:?}");
    let member_pods: Vec<&&String> = names.iter().filter(|n| n.starts_with("objects/Pod/main-")).collect();
    assert_eq!(member_pods.len(), 3, "{names:?}");
    assert!(
        names
            .iter()
            .filter(|n| n.starts_with("logs/main-") && n.ends_with(".log"))
            .count()
            >= 3,
        "{names:?}"
    );
    assert!(
        files.contains_key(&format!("objects/EtcdBackup/{manual}.json")),
        "{names:?}"
    );
    assert!(files.keys().any(|n| n.starts_with("objects/Secret/main-")), "{names:?}");
    assert!(files["events.txt"].lines().count() >= 3, "{}", files["events.txt"]);
    assert!(files["status.txt"].contains("Members"), "{}", files["status.txt"]);
    // The operator runs outside the cluster in this test: said, not an error.
    assert!(
        files["problems.txt"].contains("no operator pod"),
        "{}",
        files["problems.txt"]
    );
    assert!(assert_no_secret_in(&ns, &files).await >= 6);
    let _ = std::fs::remove_dir_all(&dir);

    // Paused: said, and not Ready for a script; resumed, Ready again.
    let out = kubectl_noops(&["pause", "etcd/main", "-n", &ns.name]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let paused = ns.api::<noops_api::EtcdCluster>().get("main").await.unwrap();
    assert!(paused.spec.paused);
    let out = kubectl_noops(&["status", "etcd/main", "-n", &ns.name]);
    assert!(
        stdout(&out).lines().next().unwrap().ends_with(", PAUSED"),
        "{}",
        stdout(&out)
    );
    assert_eq!(out.status.code(), Some(2));
    let out = kubectl_noops(&["resume", "etcd/main", "-n", &ns.name]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    wait_until("Ready again once resumed", MINUTE, || async {
        kubectl_noops(&["status", "etcd/main", "-n", &ns.name]).status.code() == Some(0)
    })
    .await;
    // A MaintPage: the side its Service publishes.
    wait_until("the shop Ready", 2 * MINUTE, || async {
        kubectl_noops(&["status", "mp/shop", "-n", &ns.name]).status.code() == Some(0)
    })
    .await;
    let text = stdout(&kubectl_noops(&["status", "maintpage/shop", "-n", &ns.name]));
    let published = text.lines().find(|l| l.trim_start().starts_with("published")).unwrap();
    assert!(published.trim_end().ends_with("app"), "{text}");

    // Paused, a MaintPage asked for its maintenance page keeps the Service on the app and
    // says so; resumed, it switches.
    let selector = || {
        kubectl_ok(
            &[
                "get",
                "service",
                "shop",
                "-n",
                &ns.name,
                "-o",
                "jsonpath={.spec.selector}",
            ],
            None,
        )
    };
    let serving_app = selector();
    let out = kubectl_noops(&["pause", "mp/shop", "-n", &ns.name]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    ns.merge_spec(
        "maintpage/shop",
        serde_json::json!({ "maintenance": { "enabled": true } }),
    );
    wait_until("the paused MaintPage to say it stays", MINUTE, || async {
        let mp = ns.api::<noops_api::MaintPage>().get("shop").await.unwrap();
        let status = mp.status.unwrap_or_default();
        status.observed_generation == mp.metadata.generation
            && status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "Paused")
    })
    .await;
    let out = kubectl_noops(&["status", "mp/shop", "-n", &ns.name]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(stdout(&out).contains("PAUSED"), "{}", stdout(&out));
    assert!(stdout(&out).contains("stays on the app"), "{}", stdout(&out));
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert_eq!(selector(), serving_app, "the Service switched while paused");
    wait_event(&ns, "MaintPage", "shop", "Paused").await;
    let out = kubectl_noops(&["resume", "mp/shop", "-n", &ns.name]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    wait_until("the maintenance page published once resumed", 2 * MINUTE, || async {
        let text = stdout(&kubectl_noops(&["status", "mp/shop", "-n", &ns.name]));
        text.lines()
            .find(|l| l.trim_start().starts_with("published"))
            .is_some_and(|l| l.trim_end().ends_with("maintenance"))
    })
    .await;
    assert_ne!(selector(), serving_app);

    // What cannot be read says why, with exit code 1.
    let out = kubectl_noops(&["status", "etcd/nothing", "-n", &ns.name]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("EtcdCluster"), "{out:?}");
    let out = kubectl_noops(&["status", "deployment/x", "-n", &ns.name]);
    assert_eq!(out.status.code(), Some(1));
}
