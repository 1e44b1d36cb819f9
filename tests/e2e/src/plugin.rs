//! Running `kubectl noops` as a user does, and opening what its `report` writes.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::ListParams;

use crate::{TestNamespace, kubeconfig, root, upstream_bin};

/// Keys whose values are not secret (a connection Secret's address, public certificates).
const NOT_SECRET_KEYS: [&str; 8] = [
    "host", "port", "database", "dbname", "username", "user", "ca.crt", "tls.crt",
];

/// `kubectl noops <args>` as a user runs it: kubectl finds the plugin on the PATH.
pub fn kubectl_noops(args: &[&str]) -> Output {
    let path = format!(
        "{}:{}",
        root().join(".noops/bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new(upstream_bin("kubectl"))
        .arg("noops")
        .args(args)
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig())
        .output()
        .expect("kubectl")
}

/// `kubectl noops <args>` off the async runtime (a command that waits, such as `promote`,
/// must not hold up what the test runs meanwhile): its exit code, and what it printed on
/// standard output and error.
pub async fn kubectl_noops_waiting(args: &[&str]) -> (Option<i32>, String) {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = kubectl_noops(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let said = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
        (out.status.code(), said)
    })
    .await
    .expect("the plugin's thread")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes `kubectl noops report <resource>` into `dir` and opens it with `tar`: each file's
/// path below the report's top folder → its text.
pub fn report_files(ns: &TestNamespace, resource: &str, dir: &Path) -> BTreeMap<String, String> {
    std::fs::create_dir_all(dir).unwrap();
    let archive = dir.join("report.tar.gz");
    let out = kubectl_noops(&["report", resource, "-n", &ns.name, "-f", archive.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stdout(&out).starts_with("wrote "), "{}", stdout(&out));
    let opened = Command::new("tar")
        .args(["-xzf", archive.to_str().unwrap(), "-C", dir.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(opened.success(), "tar cannot open the report");
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(folder) = stack.pop() {
        for entry in std::fs::read_dir(&folder).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path != archive {
                let relative = path.strip_prefix(dir).unwrap();
                // Below the top folder, noops-report-<kind>-<name>-<time>/.
                let inside: std::path::PathBuf = relative.components().skip(1).collect();
                files.insert(
                    inside.to_string_lossy().into_owned(),
                    std::fs::read_to_string(&path).unwrap(),
                );
            }
        }
    }
    files
}

/// Asserts that no value of any Secret of the namespace (as stored, nor decoded, nor a line
/// of it) is in any of `files`; returns how many values were looked for.
pub async fn assert_no_secret_in(ns: &TestNamespace, files: &BTreeMap<String, String>) -> usize {
    let secrets = ns.api::<Secret>().list(&ListParams::default()).await.unwrap().items;
    let mut values = Vec::new();
    for secret in &secrets {
        for (key, value) in secret.data.clone().unwrap_or_default() {
            if NOT_SECRET_KEYS.contains(&key.as_str()) {
                continue;
            }
            let decoded = String::from_utf8_lossy(&value.0).into_owned();
            values.push((
                format!("{}/{key}", secret.metadata.name.clone().unwrap_or_default()),
                decoded.clone(),
            ));
            values.push((
                format!("{}/{key} (base64)", secret.metadata.name.clone().unwrap_or_default()),
                base64::engine::general_purpose::STANDARD.encode(&value.0),
            ));
            for line in decoded.lines().filter(|l| l.len() >= 16 && !l.starts_with("-----")) {
                values.push((format!("a line of {key}"), line.to_string()));
            }
        }
    }
    values.retain(|(_, v)| v.len() >= 6);
    for (path, text) in files {
        for (what, value) in &values {
            assert!(!text.contains(value.as_str()), "{what} is in {path} of the report");
        }
    }
    values.len()
}

/// `kubectl __complete noops <words>`, as a shell asks kubectl to complete `kubectl noops …`,
/// with `kubectl_complete-noops` (what `kubectl noops completion kubectl` prints) on the PATH:
/// the candidates, one a line, then `:<directive>`.
pub fn complete_through_kubectl(ns: &TestNamespace, words: &[&str]) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = std::env::temp_dir().join(format!("noops-completion-{}", ns.name));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("kubectl_complete-noops");
    let out = kubectl_noops(&["completion", "kubectl"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    std::fs::write(&script, &out.stdout).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}:{}",
        dir.display(),
        root().join(".noops/bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(upstream_bin("kubectl"))
        .args(["__complete", "noops"])
        .args(words)
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig())
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    stdout(&out)
}

/// The line of `text` that contains `what`.
pub fn line_with<'a>(text: &'a str, what: &str) -> &'a str {
    text.lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("no line with {what:?} in\n{text}"))
}
