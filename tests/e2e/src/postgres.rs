//! Helpers for the PostgreSQL end-to-end tests: manifests, waits, and `psql` against the
//! instance's pod address (inside the local Kubernetes's own network namespaces).

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use noops_api::PostgreSQL;

use crate::{TestNamespace, kubectl_ok, pod_ready, wait_for};

/// The psql of the PostgreSQL setup installs.
pub const PSQL: &str = "/usr/lib/postgresql/15/bin/psql";

/// The original's manifest: a Secret with `postgresql_password` and a PostgreSQL naming it.
pub fn manifest(name: &str, password: &str, extra: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Secret
metadata: {{ name: {name}-db }}
stringData: {{ postgresql_password: "{password}" }}
---
apiVersion: noops.dev/v1alpha1
kind: PostgreSQL
metadata: {{ name: {name} }}
spec:
  db: shop
  user: app
  passwordSecret: {name}-db
{extra}"#
    )
}

/// A PostgreSQL manifest alone.
pub fn database_manifest(name: &str, spec: &str) -> String {
    format!("apiVersion: noops.dev/v1alpha1\nkind: PostgreSQL\nmetadata: {{ name: {name} }}\nspec:\n{spec}")
}

/// The condition `type_` of a PostgreSQL: (status, reason, message).
pub fn condition(pg: &PostgreSQL, type_: &str) -> Option<(String, String, String)> {
    pg.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Waits until the PostgreSQL has Ready=True for its current generation.
pub async fn wait_ready(ns: &TestNamespace, name: &str, timeout: Duration) -> PostgreSQL {
    let api = ns.api::<PostgreSQL>();
    wait_for(&format!("PostgreSQL {name} Ready"), timeout, || async {
        api.get_opt(name).await.ok().flatten().filter(|pg| {
            let status = pg.status.as_ref();
            status.and_then(|s| s.observed_generation) == pg.metadata.generation
                && condition(pg, "Ready").is_some_and(|(s, _, _)| s == "True")
        })
    })
    .await
}

/// Waits until the PostgreSQL's Ready condition is False with `reason`.
pub async fn wait_not_ready(ns: &TestNamespace, name: &str, reason: &str, timeout: Duration) -> PostgreSQL {
    let api = ns.api::<PostgreSQL>();
    wait_for(&format!("PostgreSQL {name} Ready=False {reason}"), timeout, || async {
        api.get_opt(name)
            .await
            .ok()
            .flatten()
            .filter(|pg| condition(pg, "Ready").is_some_and(|(s, r, _)| s == "False" && r == reason))
    })
    .await
}

/// The address of the instance's pod, once it is Ready.
pub async fn instance_ip(ns: &TestNamespace, name: &str) -> String {
    let pod: Pod = ns.wait_pod_ready(&format!("{name}-0"), Duration::from_secs(120)).await;
    assert!(pod_ready(&pod));
    pod.status.and_then(|s| s.pod_ip).expect("pod IP")
}

/// Runs `sql` with psql as `user` with `password` on database `db` at `ip`: its output, or
/// what psql said on failure.
pub fn psql(ip: &str, user: &str, password: &str, db: &str, sql: &str) -> Result<String, String> {
    let out = Command::new(PSQL)
        .args(["-h", ip, "-U", user, "-d", db, "-v", "ON_ERROR_STOP=1", "-tAc", sql])
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "5")
        .output()
        .map_err(|e| format!("cannot run {PSQL}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

/// The value of `key` in Secret `name`.
pub async fn secret_value(ns: &TestNamespace, name: &str, key: &str) -> String {
    let secret: Secret = ns.api::<Secret>().get(name).await.expect("Secret");
    let value = secret.data.and_then(|d| d.get(key).cloned()).expect("key in Secret");
    String::from_utf8(value.0).expect("UTF-8")
}

/// `kubectl get pg` as a user would read it.
pub fn kubectl_get(ns: &TestNamespace) -> String {
    kubectl_ok(&["get", "pg", "-n", &ns.name], None)
}
