//! `kubectl noops` (status, get, describe, kubeconfig, backup, report, pause, resume,
//! completion; `promote` is run in postgres.rs) against real resources, through kubectl's
//! plugin lookup (the plugin on the PATH as `setup` puts it, in .noops/bin): what it prints
//! for an EtcdCluster (members, leader, a backup and its size, certificates, the paused state),
//! its EtcdBackup, a MaintPage (its side, paused and resumed), machines that wait and machines
//! that run, a whole tenant cluster's tree, its JSON, and its exit codes; the admin kubeconfig
//! it writes reaches the tenant from here; kubectl completes `kubectl noops` through the
//! script it prints. Needs `make cluster-up`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use noops_api::Machine;
use noops_e2e::etcd::{
    claim_manifest, cluster_manifest, etcd_version, volume_backup_spec, wait_backup_done, wait_cluster_ready,
};
use noops_e2e::plugin::{
    assert_no_secret_in, complete_through_kubectl, kubectl_noops, line_with, report_files, stdout,
};
use noops_e2e::tenant::ForgetMachines;
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

    // The backup itself: Ready once stored, with its cluster, its size and where it went.
    let out = kubectl_noops(&["status", &format!("etcdbackup/{manual}"), "-n", &ns.name]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{out:?}");
    assert!(
        text.starts_with(&format!("EtcdBackup {}/{manual}: Ready (Succeeded)\n", ns.name)),
        "{text}"
    );
    assert!(text.contains("EtcdCluster main"), "{text}");
    assert!(text.contains("pvc://etcd-backups/"), "{text}");
    assert!(
        text.contains(&kib) || text.contains(&mib) || text.contains(&bytes),
        "size {size} not in {text}"
    );

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

    // Every noops resource of the namespace, a line each with its Ready condition and phase;
    // with -A, of every namespace, with the namespace.
    let out = kubectl_noops(&["get", "-n", &ns.name]);
    let listed = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{listed}{out:?}");
    assert!(
        listed.starts_with("KIND") && !listed.lines().next().unwrap().contains("NAMESPACE"),
        "{listed}"
    );
    let row = |listed: &str, kind: &str, name: &str| {
        listed
            .lines()
            .find(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                cells.first() == Some(&kind) && cells.contains(&name)
            })
            .unwrap_or_else(|| panic!("no {kind} {name} in\n{listed}"))
            .to_string()
    };
    let etcd_row = row(&listed, "EtcdCluster", "main");
    assert!(
        etcd_row.contains(" True ") && etcd_row.contains("Running"),
        "{etcd_row}"
    );
    let backup_row = row(&listed, "EtcdBackup", &manual);
    assert!(
        backup_row.contains(" True ") && backup_row.contains("Succeeded"),
        "{backup_row}"
    );
    assert!(row(&listed, "MaintPage", "shop").contains(" True "), "{listed}");
    let out = kubectl_noops(&["get", "-A"]);
    let everywhere = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(everywhere.lines().next().unwrap().contains("NAMESPACE"), "{everywhere}");
    // Other tests' clusters are named `main` too: this one is there, in its namespace.
    assert!(
        everywhere.lines().any(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            cells.starts_with(&["EtcdCluster", ns.name.as_str(), "main"])
        }),
        "{everywhere}"
    );

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

#[tokio::test]
async fn machines_that_wait_say_why_in_status_get_and_completion() {
    install_crds();
    let ns = TestNamespace::new("plugin-machines").await;
    let _forget = ForgetMachines(ns.name.clone());
    let operator = Operator::start(&ns.name, &["--controllers", "machine,machineset,machinedeployment"]);
    // A pool of a control plane that does not exist: its machines are made, and wait saying
    // why (no VM is made for them: cheap).
    ns.apply(
        "apiVersion: noops.dev/v1alpha1\nkind: MachineDeployment\nmetadata: { name: pool }\nspec:\n  clusterName: nowhere\n  replicas: 2\n  selector: { matchLabels: { pool: p } }\n  template:\n    metadata: { labels: { pool: p } }\n    spec: { version: \"1.34\" }\n",
    );
    let machines = ns.api::<Machine>();
    let waiting = wait_for("2 machines saying ClusterNotFound", 2 * MINUTE, || async {
        let listed = machines.list(&Default::default()).await.ok()?.items;
        let saying = listed
            .iter()
            .filter(|m| {
                m.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "ClusterNotFound")
                })
            })
            .count();
        (listed.len() == 2 && saying == 2).then_some(listed)
    })
    .await;
    let mut names: Vec<String> = waiting.iter().map(|m| m.metadata.name.clone().unwrap()).collect();
    names.sort();
    let set = waiting[0].metadata.owner_references.as_ref().unwrap()[0].name.clone();

    // A Machine: not Ready, Pending, no node, and why.
    let out = kubectl_noops(&["status", &format!("ma/{}", names[0]), "-n", &ns.name]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{text}{out:?}");
    assert!(
        text.starts_with(&format!("Machine {}/{}: Not ready (Pending)\n", ns.name, names[0])),
        "{text}"
    );
    assert!(line_with(&text, "node").contains("not joined yet"), "{text}");
    assert!(line_with(&text, "cluster").contains("nowhere"), "{text}");
    assert!(
        text.contains("Ready (ClusterNotFound): no KubernetesControlPlane \"nowhere\""),
        "{text}"
    );

    // Its MachineSet: both machines, each not Ready with the reason.
    let out = kubectl_noops(&["status", &format!("machineset/{set}"), "-n", &ns.name]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{text}{out:?}");
    assert!(line_with(&text, "deployment").contains("pool"), "{text}");
    for machine in &names {
        assert!(
            line_with(&text, &format!("{machine} ")).contains("False (ClusterNotFound)"),
            "{text}"
        );
    }

    // Its MachineDeployment: the strategy, the set marked current; and as JSON.
    let out = kubectl_noops(&["status", "md/pool", "-n", &ns.name]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{text}{out:?}");
    assert!(
        text.starts_with(&format!("MachineDeployment {}/pool: Not ready", ns.name)),
        "{text}"
    );
    assert!(text.contains("RollingUpdate (maxSurge 1, maxUnavailable 0)"), "{text}");
    assert!(line_with(&text, &format!("{set} ")).contains('*'), "{text}");
    let out = kubectl_noops(&["status", "md/pool", "-n", &ns.name, "-o", "json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (json["kind"].as_str(), json["ready"].as_bool()),
        (Some("MachineDeployment"), Some(false))
    );

    // `get`: each with its Ready condition and reason.
    let listed = stdout(&kubectl_noops(&["get", "-n", &ns.name]));
    for machine in &names {
        let line = line_with(&listed, &format!("{machine} "));
        assert!(
            line.starts_with("Machine ") && line.contains("False") && line.contains("ClusterNotFound"),
            "{listed}"
        );
    }
    assert!(
        line_with(&listed, &format!("{set} ")).starts_with("MachineSet "),
        "{listed}"
    );
    assert!(
        line_with(&listed, "pool ").starts_with("MachineDeployment "),
        "{listed}"
    );

    // kubectl completes the kinds, then the names it reads from the cluster.
    let kinds = complete_through_kubectl(&ns, &["status", ""]);
    assert!(kinds.lines().any(|l| l == "ma/") && kinds.ends_with(":6\n"), "{kinds}");
    let completed = complete_through_kubectl(&ns, &["-n", &ns.name, "status", "ma/"]);
    let expected: Vec<String> = names.iter().map(|n| format!("ma/{n}")).collect();
    let offered: Vec<&str> = completed.lines().filter(|l| !l.starts_with(':')).collect();
    assert_eq!(offered, expected, "{completed}");
    for shell in ["bash", "zsh", "fish"] {
        let out = kubectl_noops(&["completion", shell]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert!(stdout(&out).contains("kubectl-noops"), "{shell}");
    }

    // What is not there, or not a cluster, says so with exit code 1.
    for args in [
        ["describe", "kc/nothing"],
        ["describe", "md/pool"],
        ["kubeconfig", "kc/nothing"],
        ["kubeconfig", "md/pool"],
    ] {
        let out = kubectl_noops(&[args[0], args[1], "-n", &ns.name]);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
    }
    assert!(!operator.log_text().contains("panicked"), "{}", operator.log_text());
}
