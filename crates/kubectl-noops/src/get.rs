//! `kubectl noops get [-A]`: every noops resource of the namespace (or of every namespace), a
//! line each: its kind, name, Ready condition (a backup's Succeeded), phase, age, and that
//! condition's reason. A kind whose CRD is not installed is left out; a kind the user may not
//! list is named below the table, and the others are still listed.

use anyhow::Context as _;
use comfy_table::{Table, presets::NOTHING};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use noops_api::condition;
use serde_json::Value;

use crate::report::age;
use crate::resources::Kind;

/// One resource's line.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Row {
    kind: Kind,
    namespace: String,
    name: String,
    ready: String,
    phase: String,
    age: String,
    message: String,
}

/// Lists every kind in `namespace` (every namespace when `None`) and renders the table.
pub async fn get(client: &Client, namespace: Option<&str>) -> anyhow::Result<String> {
    let now = jiff::Timestamp::now();
    let mut rows = Vec::new();
    let mut forbidden = Vec::new();
    for kind in Kind::ALL {
        let resource = kind.resource();
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        match api.list(&ListParams::default()).await {
            Ok(list) => rows.extend(list.items.iter().map(|o| row(kind, o, now))),
            // Its CRD is not installed: there is none of it.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(kube::Error::Api(status)) if status.code == 403 => {
                forbidden.push(format!("{}.{}", resource.plural, resource.group));
            }
            Err(e) => return Err(e).with_context(|| format!("listing {}", resource.plural)),
        }
    }
    rows.sort();
    Ok(render(&rows, namespace, &forbidden))
}

/// The line of `object`, of kind `kind`, at `now`.
fn row(kind: Kind, object: &DynamicObject, now: jiff::Timestamp) -> Row {
    // A backup is never Ready: what it has instead is whether it is stored.
    let state = if matches!(kind, Kind::EtcdBackup | Kind::PostgresBackup) {
        condition::SUCCEEDED
    } else {
        condition::READY
    };
    let status = &object.data["status"];
    let condition = status["conditions"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["type"] == state));
    let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).unwrap_or("-").to_string();
    Row {
        kind,
        namespace: object.metadata.namespace.clone().unwrap_or_default(),
        name: object.metadata.name.clone().unwrap_or_default(),
        ready: condition.map_or_else(|| "-".into(), |c| text(&c["status"])),
        phase: text(&status["phase"]),
        age: object
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or_else(|| "-".into(), |t| age(now.duration_since(t.0).as_secs())),
        message: condition.map_or_else(|| "-".into(), |c| text(&c["reason"])),
    }
}

/// The table, with a NAMESPACE column when every namespace was listed, then the kinds that
/// could not be listed.
fn render(rows: &[Row], namespace: Option<&str>, forbidden: &[String]) -> String {
    let mut out = String::new();
    if rows.is_empty() {
        match namespace {
            Some(ns) => out.push_str(&format!("No noops resources found in {ns} namespace.\n")),
            None => out.push_str("No noops resources found.\n"),
        }
    } else {
        let mut header = vec!["KIND", "NAMESPACE", "NAME", "READY", "PHASE", "AGE", "MESSAGE"];
        if namespace.is_some() {
            header.remove(1);
        }
        let mut table = Table::new();
        table.load_preset(NOTHING).set_header(header);
        for row in rows {
            let mut cells = vec![
                row.kind.to_string(),
                row.namespace.clone(),
                row.name.clone(),
                row.ready.clone(),
                row.phase.clone(),
                row.age.clone(),
                row.message.clone(),
            ];
            if namespace.is_some() {
                cells.remove(1);
            }
            table.add_row(cells);
        }
        for line in table.to_string().lines() {
            // Flush left, as kubectl's tables are.
            out.push_str(line.strip_prefix(' ').unwrap_or(line).trim_end());
            out.push('\n');
        }
    }
    for kinds in forbidden {
        out.push_str(&format!("Forbidden: you may not list {kinds} here; left out\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(kind: Kind, namespace: &str, name: &str, status: Value) -> DynamicObject {
        let mut o = DynamicObject::new(name, &kind.resource())
            .within(namespace)
            .data(json!({ "status": status }));
        o.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-11-26T11:00:00Z".parse().unwrap(),
        ));
        o
    }

    fn condition(type_: &str, status: &str, reason: &str) -> Value {
        json!([{ "type": type_, "status": status, "reason": reason, "message": "m" }])
    }

    #[test]
    fn a_line_has_the_ready_condition_phase_age_and_reason_a_backup_its_succeeded() {
        let now: jiff::Timestamp = "2026-11-26T12:00:00Z".parse().unwrap();
        let etcd = object(
            Kind::EtcdCluster,
            "db",
            "main",
            json!({ "phase": "Running", "conditions": condition("Ready", "True", "Ready") }),
        );
        let r = row(Kind::EtcdCluster, &etcd, now);
        assert_eq!(
            (r.ready.as_str(), r.phase.as_str(), r.age.as_str(), r.message.as_str()),
            ("True", "Running", "1h", "Ready")
        );
        let backup = object(
            Kind::EtcdBackup,
            "db",
            "main-1",
            json!({ "phase": "Failed", "conditions": condition("Succeeded", "False", "ClaimNotFound") }),
        );
        let r = row(Kind::EtcdBackup, &backup, now);
        assert_eq!((r.ready.as_str(), r.message.as_str()), ("False", "ClaimNotFound"));
        let bare = object(Kind::MaintPage, "web", "shop", Value::Null);
        let r = row(Kind::MaintPage, &bare, now);
        assert_eq!(
            (r.ready.as_str(), r.phase.as_str(), r.message.as_str()),
            ("-", "-", "-")
        );
    }

    #[test]
    fn the_table_has_a_namespace_column_only_for_every_namespace_and_names_what_was_forbidden() {
        let now: jiff::Timestamp = "2026-11-26T12:00:00Z".parse().unwrap();
        let mut rows = vec![
            row(
                Kind::Machine,
                &object(Kind::Machine, "t", "acme-0", json!({ "phase": "Running" })),
                now,
            ),
            row(
                Kind::KubernetesCluster,
                &object(Kind::KubernetesCluster, "t", "acme", json!({ "phase": "Running" })),
                now,
            ),
        ];
        rows.sort();
        let one = render(&rows, Some("t"), &[]);
        let lines: Vec<&str> = one.lines().collect();
        assert!(lines[0].starts_with("KIND") && !lines[0].contains("NAMESPACE"), "{one}");
        assert!(lines[1].starts_with("KubernetesCluster  acme"), "{one}");
        assert!(lines[2].starts_with("Machine"), "a cluster before its machines:\n{one}");
        let every = render(&rows, None, &["machines.noops.dev".into()]);
        assert!(every.lines().next().unwrap().contains("NAMESPACE"), "{every}");
        assert!(every.contains("KubernetesCluster  t "), "{every}");
        assert!(
            every
                .trim_end()
                .ends_with("Forbidden: you may not list machines.noops.dev here; left out"),
            "{every}"
        );
        assert_eq!(
            render(&[], Some("t"), &[]),
            "No noops resources found in t namespace.\n"
        );
    }
}
