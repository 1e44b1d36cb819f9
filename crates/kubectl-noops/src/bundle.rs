//! `kubectl noops report <kind>/<name>`: one tar.gz with what a support request needs. The
//! resource, everything it owns (followed through owner references, so a KubernetesCluster
//! brings its control plane, its EtcdCluster and their pods), its backups, the Events of all of
//! them, the logs of its pods and of the operator, and the plugin's own status report.
//!
//! No secret leaves: a Secret's data is replaced by its size, the last-applied annotation (a
//! copy of the data) is dropped, and every value of every Secret in the namespace is scrubbed
//! from the text of every file (logs included) before it is written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use base64::Engine as _;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Event, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, LogParams};
use kube::{Client, ResourceExt};
use noops_api::{
    EtcdBackup, EtcdCluster, KubernetesControlPlane, Machine, MachineDeployment, MachineSet, PostgresBackup,
};
use serde_json::Value;

use crate::resources::Kind;
use crate::status::NOT_AFTER_ANNOTATION;

/// What goes in place of a secret value.
const REDACTED: &str = "<redacted>";
/// Keys of a Secret whose values are not secret (a connection Secret's address, a CA's or a
/// serving certificate): scrubbing them from logs would hide what a reader needs.
const NOT_SECRET_KEYS: [&str; 8] = [
    "host", "port", "database", "dbname", "username", "user", "ca.crt", "tls.crt",
];
/// Shorter values are not scrubbed from text: they would match everywhere.
const SHORTEST_SCRUBBED: usize = 6;

/// Where the operator runs, and how much of each log to take.
pub struct Options {
    pub output: Option<PathBuf>,
    pub operator_namespace: String,
    pub operator_selector: String,
    pub log_lines: i64,
}

/// The files of a report, before they are packed: path in the archive → text.
#[derive(Default)]
struct Files {
    files: BTreeMap<String, String>,
    problems: Vec<String>,
}

impl Files {
    fn json(&mut self, path: String, value: &impl serde::Serialize) {
        let text = serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("cannot be written: {e}"));
        self.files.insert(path, text);
    }

    fn problem(&mut self, what: String) {
        self.problems.push(what);
    }
}

/// The kinds whose objects may be owned by (or belong to) a noops resource.
fn child_kinds() -> Vec<ApiResource> {
    vec![
        ApiResource::erase::<Pod>(&()),
        ApiResource::erase::<Service>(&()),
        ApiResource::erase::<ConfigMap>(&()),
        ApiResource::erase::<Secret>(&()),
        ApiResource::erase::<PersistentVolumeClaim>(&()),
        ApiResource::erase::<StatefulSet>(&()),
        ApiResource::erase::<Deployment>(&()),
        ApiResource::erase::<ReplicaSet>(&()),
        ApiResource::erase::<Job>(&()),
        ApiResource::erase::<PodDisruptionBudget>(&()),
        ApiResource::erase::<EtcdCluster>(&()),
        ApiResource::erase::<EtcdBackup>(&()),
        ApiResource::erase::<PostgresBackup>(&()),
        ApiResource::erase::<KubernetesControlPlane>(&()),
        ApiResource::erase::<MachineDeployment>(&()),
        ApiResource::erase::<MachineSet>(&()),
        ApiResource::erase::<Machine>(&()),
    ]
}

/// Writes the report of `kind/name`; returns where, and a line that says what it holds.
pub async fn write(
    client: &Client,
    namespace: &str,
    kind: Kind,
    name: &str,
    options: &Options,
) -> anyhow::Result<(PathBuf, String)> {
    let now = jiff::Timestamp::now();
    let root_resource = kind.resource();
    let root = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &root_resource)
        .get(name)
        .await
        .with_context(|| format!("reading {} {namespace}/{name}", root_resource.kind))?;
    let mut files = Files::default();

    // Every object of the namespace that could belong to it, then those that do.
    let mut candidates = Vec::new();
    for resource in child_kinds() {
        let api = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource);
        match api.list(&ListParams::default()).await {
            Ok(list) => candidates.extend(list.items.into_iter().map(|o| (resource.clone(), o))),
            // Without the Secrets' values nothing could be scrubbed of them: no report.
            Err(e) if resource.kind == "Secret" => {
                anyhow::bail!(
                    "listing the Secrets of {namespace}, whose values the report must leave out: {e} (report needs list on Secrets)"
                )
            }
            Err(e) => files.problem(format!("listing {}: {e}", resource.plural)),
        }
    }
    let secrets = secret_values(&candidates);
    let members = belonging(&root, &root_resource, &candidates);
    let mut uids: BTreeSet<String> = root.uid().into_iter().collect();
    uids.extend(members.iter().filter_map(|(_, o)| o.uid()));

    files.json(format!("{}.json", root_resource.kind), &tidy(&root_resource, &root));
    for (resource, object) in &members {
        files.json(
            format!("objects/{}/{}.json", resource.kind, object.name_any()),
            &tidy(resource, object),
        );
    }
    events(client, namespace, &uids, &mut files).await;
    let pods: Vec<&DynamicObject> = members
        .iter()
        .filter(|(r, _)| r.kind == "Pod")
        .map(|(_, o)| o)
        .collect();
    for pod in pods {
        pod_logs(client, namespace, pod, options.log_lines, &mut files).await;
    }
    operator_logs(client, options, &mut files).await;
    match crate::status::status(client, namespace, kind, name).await {
        Ok(report) => {
            files.files.insert("status.txt".into(), report.text());
            files.json("status.json".into(), &report);
        }
        Err(e) => files.problem(format!("the status report: {e:#}")),
    }
    let summary = format!(
        "{} {namespace}/{name}, {} objects it owns, {} Events, {} logs",
        root_resource.kind,
        members.len(),
        files.files.get("events.txt").map_or(0, |t| t.lines().count()),
        files.files.keys().filter(|k| k.ends_with(".log")).count(),
    );
    files.files.insert(
        "README.txt".into(),
        format!(
            "kubectl noops report of {summary}, made at {now}.\n\
             Secrets' data is replaced by its size; every value of a Secret in the namespace is\n\
             replaced by {REDACTED} in every file.\n\
             Files: <Kind>.json (the resource), objects/<Kind>/<name>.json (what it owns, and its\n\
             backups), events.txt and events.json, logs/<pod>/<container>.log, operator/<pod>.log,\n\
             status.txt (kubectl noops status), problems.txt (what could not be read).\n"
        ),
    );
    if !files.problems.is_empty() {
        let text = files.problems.join("\n") + "\n";
        files.files.insert("problems.txt".into(), text);
    }

    let stamp = now.strftime("%Y%m%dT%H%M%SZ").to_string();
    let top = format!("noops-report-{}-{name}-{stamp}", root_resource.kind.to_lowercase());
    let path = options
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{top}.tar.gz")));
    pack(&path, &top, &files.files, &secrets)?;
    Ok((path, summary))
}

/// The objects that belong to `root`: owned by it or by one of its own, at any depth; and the
/// backups of it (a manual backup names its cluster but has no owner).
fn belonging<'a>(
    root: &DynamicObject,
    root_resource: &ApiResource,
    candidates: &'a [(ApiResource, DynamicObject)],
) -> Vec<&'a (ApiResource, DynamicObject)> {
    let mut owners: BTreeSet<String> = root.uid().into_iter().collect();
    let name = root.name_any();
    let backs_up = |resource: &ApiResource, object: &DynamicObject| {
        let field = match (root_resource.kind.as_str(), resource.kind.as_str()) {
            ("EtcdCluster", "EtcdBackup") => "cluster",
            ("PostgreSQL", "PostgresBackup") => "postgresql",
            _ => return false,
        };
        object.data["spec"][field].as_str() == Some(name.as_str())
    };
    let mut chosen: BTreeSet<usize> = BTreeSet::new();
    loop {
        let before = chosen.len();
        for (i, (resource, object)) in candidates.iter().enumerate() {
            let owned = object.owner_references().iter().any(|o| owners.contains(&o.uid));
            if !chosen.contains(&i) && (owned || backs_up(resource, object)) {
                chosen.insert(i);
                owners.extend(object.uid());
            }
        }
        if chosen.len() == before {
            break;
        }
    }
    chosen.into_iter().map(|i| &candidates[i]).collect()
}

/// The object as JSON without what only adds noise (managed fields), with a Secret's data
/// replaced by its size.
fn tidy(resource: &ApiResource, object: &DynamicObject) -> Value {
    let mut object = object.clone();
    object.metadata.managed_fields = None;
    if let Some(annotations) = object.metadata.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
        // A Secret's other annotations may be derived from its data (a hash of it): only its
        // expiry stays.
        if resource.kind == "Secret" {
            annotations.retain(|key, _| key == NOT_AFTER_ANNOTATION);
        }
    }
    let mut value = serde_json::to_value(&object).unwrap_or(Value::Null);
    value["apiVersion"] = Value::String(resource.api_version.clone());
    value["kind"] = Value::String(resource.kind.clone());
    if resource.kind == "Secret" {
        for field in ["data", "stringData"] {
            if let Some(map) = value.get_mut(field).and_then(Value::as_object_mut) {
                for v in map.values_mut() {
                    let size = v.as_str().map_or(0, |s| s.len());
                    *v = Value::String(format!("{REDACTED} ({size} characters)"));
                }
            }
        }
    }
    value
}

/// Every secret value of the namespace's Secrets, decoded and as stored (base64): what must
/// appear in no file.
fn secret_values(candidates: &[(ApiResource, DynamicObject)]) -> Vec<String> {
    let mut values = BTreeSet::new();
    for (_, secret) in candidates.iter().filter(|(r, _)| r.kind == "Secret") {
        for field in ["data", "stringData"] {
            let Some(map) = secret.data.get(field).and_then(Value::as_object) else {
                continue;
            };
            for (key, value) in map {
                let Some(stored) = value.as_str() else { continue };
                if NOT_SECRET_KEYS.contains(&key.as_str()) {
                    continue;
                }
                if field == "data"
                    && let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(stored)
                {
                    let decoded = String::from_utf8_lossy(&bytes).into_owned();
                    // A PEM block is scrubbed line by line too: logs may print it wrapped.
                    if decoded.contains("-----BEGIN ") {
                        values.extend(decoded.lines().map(str::to_string));
                    }
                    values.insert(decoded);
                }
                values.insert(stored.to_string());
            }
        }
    }
    let mut values: Vec<String> = values
        .into_iter()
        .filter(|v| v.len() >= SHORTEST_SCRUBBED && !v.starts_with("-----"))
        .collect();
    // The longest first, so that a value holding another goes whole.
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    values
}

/// `text` with every secret value replaced, as written and as JSON or a URL would escape it,
/// and every private key and bearer token (a JWT) whatever Secret it came from.
fn scrub(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    for secret in secrets {
        let json = serde_json::to_string(secret).unwrap_or_default();
        let json = json.trim_matches('"').to_string();
        for form in [secret.clone(), json, noops_api::uri::percent_encode(secret)] {
            if out.contains(form.as_str()) {
                out = out.replace(form.as_str(), REDACTED);
            }
        }
    }
    without_tokens(&without_private_keys(&out))
}

/// `text` without the body of any PEM private key block.
fn without_private_keys(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN ") {
        let header_end = rest[start..]
            .find("-----\n")
            .or_else(|| rest[start + 11..].find("-----").map(|i| i + 11));
        let Some(header_end) = header_end else { break };
        let header = &rest[start..start + header_end];
        if !header.contains("PRIVATE KEY") {
            out.push_str(&rest[..start + header_end]);
            rest = &rest[start + header_end..];
            continue;
        }
        out.push_str(&rest[..start]);
        out.push_str(REDACTED);
        rest = match rest[start..].find("-----END ") {
            Some(end) => {
                let after = &rest[start + end + 9..];
                after.find("-----").map_or("", |i| &after[i + 5..])
            }
            None => "",
        };
    }
    out.push_str(rest);
    out
}

/// `text` without anything shaped like a JWT (a service account token): three base64url parts,
/// the first a JSON header.
fn without_tokens(text: &str) -> String {
    let is_part = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("eyJ") {
        let candidate = &rest[start..];
        let end = candidate
            .find(|c: char| !(is_part(c) || c == '.'))
            .unwrap_or(candidate.len());
        let token = &candidate[..end];
        if token.split('.').count() == 3 && token.len() > 40 {
            out.push_str(&rest[..start]);
            out.push_str(REDACTED);
        } else {
            out.push_str(&rest[..start + end.max(3)]);
        }
        rest = &rest[start + end.max(3)..];
    }
    out.push_str(rest);
    out
}

/// The Events of the resource and of what it owns, oldest first: as JSON and as lines.
async fn events(client: &Client, namespace: &str, uids: &BTreeSet<String>, files: &mut Files) {
    let list = match Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(e) => return files.problem(format!("listing Events: {e}")),
    };
    let when = |e: &Event| {
        e.series
            .as_ref()
            .and_then(|s| s.last_observed_time.as_ref())
            .map(|t| t.0)
            .or(e.last_timestamp.as_ref().map(|t| t.0))
            .or(e.event_time.as_ref().map(|t| t.0))
    };
    let mut ours: Vec<Event> = list
        .into_iter()
        .filter(|e| e.involved_object.uid.as_ref().is_some_and(|u| uids.contains(u)))
        .collect();
    ours.sort_by_key(|e| when(e));
    let lines: String = ours
        .iter()
        .map(|e| {
            format!(
                "{} {} {} {}/{}: {}\n",
                when(e).map_or_else(|| "-".into(), |t| t.to_string()),
                e.type_.as_deref().unwrap_or("-"),
                e.reason.as_deref().unwrap_or("-"),
                e.involved_object.kind.as_deref().unwrap_or("-"),
                e.involved_object.name.as_deref().unwrap_or("-"),
                e.message.as_deref().unwrap_or_default(),
            )
        })
        .collect();
    files.files.insert("events.txt".into(), lines);
    files.json("events.json".into(), &ours);
}

/// The last `lines` of each container of `pod`, and of its previous run if it restarted.
async fn pod_logs(client: &Client, namespace: &str, pod: &DynamicObject, lines: i64, files: &mut Files) {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let name = pod.name_any();
    let spec = &pod.data["spec"];
    let statuses = &pod.data["status"];
    let containers = ["initContainers", "containers"]
        .iter()
        .flat_map(|field| spec[field].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["name"].as_str().map(str::to_string));
    for container in containers {
        let restarted = ["initContainerStatuses", "containerStatuses"].iter().any(|field| {
            statuses[field].as_array().is_some_and(|all| {
                all.iter()
                    .any(|s| s["name"] == container.as_str() && s["restartCount"].as_i64().unwrap_or(0) > 0)
            })
        });
        for previous in [false, true].into_iter().filter(|p| !p || restarted) {
            let params = LogParams {
                container: Some(container.clone()),
                tail_lines: Some(lines),
                previous,
                ..Default::default()
            };
            let file = if previous { "previous.log" } else { "log" };
            match api.logs(&name, &params).await {
                Ok(text) => {
                    files.files.insert(format!("logs/{name}/{container}.{file}"), text);
                }
                Err(e) => files.problem(format!("logs of {name}/{container} ({file}): {e}")),
            }
        }
    }
}

/// The operator's logs, from its pods.
async fn operator_logs(client: &Client, options: &Options, files: &mut Files) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &options.operator_namespace);
    let pods = match api
        .list(&ListParams::default().labels(&options.operator_selector))
        .await
    {
        Ok(list) => list.items,
        Err(e) => {
            return files.problem(format!(
                "listing the operator's pods in {}: {e}",
                options.operator_namespace
            ));
        }
    };
    if pods.is_empty() {
        files.problem(format!(
            "no operator pod ({}) in namespace {}: pass --operator-namespace and --operator-selector if it runs elsewhere; an operator run outside the cluster logs where it was started",
            options.operator_selector, options.operator_namespace
        ));
    }
    for pod in pods {
        let name = pod.name_any();
        let params = LogParams {
            tail_lines: Some(options.log_lines),
            ..Default::default()
        };
        match api.logs(&name, &params).await {
            Ok(text) => {
                files.files.insert(format!("operator/{name}.log"), text);
            }
            Err(e) => files.problem(format!("logs of the operator's pod {name}: {e}")),
        }
    }
}

/// Writes the files, scrubbed, as `<top>/<path>` in a tar.gz at `path`.
fn pack(path: &Path, top: &str, files: &BTreeMap<String, String>, secrets: &[String]) -> anyhow::Result<()> {
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let gzip = flate2::write::GzEncoder::new(file, flate2::Compression::default());
    let mut tar = tar::Builder::new(gzip);
    let mtime = jiff::Timestamp::now().as_second().max(0) as u64;
    for (name, text) in files {
        let text = scrub(text, secrets);
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(mtime);
        header.set_cksum();
        tar.append_data(&mut header, format!("{top}/{name}"), text.as_bytes())
            .with_context(|| format!("writing {name} into {}", path.display()))?;
    }
    tar.into_inner()
        .and_then(|gzip| gzip.finish())
        .with_context(|| format!("finishing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(
        kind: &ApiResource,
        name: &str,
        uid: &str,
        owner: Option<&str>,
        data: Value,
    ) -> (ApiResource, DynamicObject) {
        let mut o = DynamicObject::new(name, kind).data(data);
        o.metadata.uid = Some(uid.into());
        o.metadata.owner_references = owner.map(|owner| {
            vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                uid: owner.into(),
                ..Default::default()
            }]
        });
        (kind.clone(), o)
    }

    #[test]
    fn what_belongs_is_owned_at_any_depth_or_a_backup_of_it() {
        let cluster = ApiResource::erase::<EtcdCluster>(&());
        let (pod, backup, secret) = (
            ApiResource::erase::<Pod>(&()),
            ApiResource::erase::<EtcdBackup>(&()),
            ApiResource::erase::<Secret>(&()),
        );
        let (_, root) = object(&cluster, "main", "root", None, Value::Null);
        let candidates = vec![
            object(&pod, "grandchild", "g", Some("c"), Value::Null),
            object(&pod, "child", "c", Some("root"), Value::Null),
            object(&pod, "stranger", "s", Some("other"), Value::Null),
            object(
                &backup,
                "manual",
                "b",
                None,
                serde_json::json!({"spec": {"cluster": "main"}}),
            ),
            object(
                &backup,
                "another",
                "a",
                None,
                serde_json::json!({"spec": {"cluster": "other"}}),
            ),
            object(&secret, "user", "u", None, Value::Null),
        ];
        let mut names: Vec<String> = belonging(&root, &cluster, &candidates)
            .iter()
            .map(|(_, o)| o.name_any())
            .collect();
        names.sort();
        assert_eq!(names, ["child", "grandchild", "manual"]);
    }

    #[test]
    fn secrets_are_redacted_in_objects_and_scrubbed_from_text() {
        let kind = ApiResource::erase::<Secret>(&());
        let encoded = base64::engine::general_purpose::STANDARD.encode("s3cret-Pa55");
        let host = base64::engine::general_purpose::STANDARD.encode("shop.prod.svc");
        let candidates = vec![object(
            &kind,
            "shop",
            "u",
            None,
            serde_json::json!({ "data": { "password": encoded, "host": host }, "stringData": { "token": "abcdefgh" } }),
        )];
        let (_, secret) = &candidates[0];
        let tidied = tidy(&kind, secret).to_string();
        assert!(!tidied.contains(&encoded) && !tidied.contains("abcdefgh"), "{tidied}");
        assert!(tidied.contains("<redacted> (16 characters)"), "{tidied}");
        let secrets = secret_values(&candidates);
        let log = format!("login with s3cret-Pa55 at shop.prod.svc, stored {encoded}, token abcdefgh");
        assert_eq!(
            scrub(&log, &secrets),
            "login with <redacted> at shop.prod.svc, stored <redacted>, token <redacted>"
        );
    }

    #[test]
    fn escaped_values_private_keys_and_tokens_are_scrubbed_too() {
        let secrets = vec!["pa\"ss@word".to_string()];
        let json =
            serde_json::json!({ "uri": "postgres://app:pa%22ss%40word@shop", "said": "pa\"ss@word" }).to_string();
        let scrubbed = scrub(&json, &secrets);
        assert!(
            !scrubbed.contains("ss@word") && !scrubbed.contains("ss%40word"),
            "{scrubbed}"
        );
        let key = "before\n-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIB\n-----END EC PRIVATE KEY-----\nafter";
        assert_eq!(scrub(key, &[]), "before\n<redacted>\nafter");
        let certificate = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----";
        assert_eq!(scrub(certificate, &[]), certificate, "a certificate is public");
        let token =
            "Authorization: Bearer eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJlLXNpZ25hdHVyZQ end";
        assert_eq!(scrub(token, &[]), "Authorization: Bearer <redacted> end");
    }
}
