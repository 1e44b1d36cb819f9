//! The Helm chart (`charts/noops`): rendered with `helm template`, and the operator installed
//! from it into a test's namespace, running from its image as a user runs it.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use crate::{kubectl, kubectl_ok, namespace_object, root, upstream_bin};

/// `helm template` of the chart as release `release` in `namespace` with `settings` (`--set`
/// values): its output, or what helm said when it refused.
pub fn template(release: &str, namespace: &str, settings: &[&str]) -> Result<String, String> {
    let mut args = vec![
        "template".to_string(),
        release.into(),
        root().join("charts/noops").to_str().unwrap_or_default().into(),
        "--namespace".into(),
        namespace.into(),
    ];
    for setting in settings {
        args.extend(["--set".to_string(), setting.to_string()]);
    }
    let out = Command::new(upstream_bin("helm"))
        .args(&args)
        .output()
        .expect("helm (run `make setup`)");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// How many handles each installed release has: a test that starts its operator again
/// (`operator = Operator::start(…)`) drops the old handle after the new one installed the same
/// release, which must outlive it.
static HANDLES: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());

/// The operator installed by the chart into a namespace of its own (`<watched>-op`, so that a
/// test's namespace holds only what the test made), watching the test's namespace only, with
/// the rights the chart gives it there: one replica (it still elects itself leader, as the
/// chart's two would), the image built here.
pub struct Deployed {
    /// Where it runs.
    pub namespace: String,
    pub release: String,
}

impl Deployed {
    /// Installs it to watch `watched` with `controllers` (none: all) and waits until its pod
    /// is Ready.
    pub fn install(watched: &str, controllers: Option<&str>) -> Self {
        let namespace = format!("{watched}-op");
        let release = format!("op{}", &watched[watched.len().saturating_sub(8)..]);
        // The namespace of an operator of this test dropped a moment ago may still be going.
        let phase = || {
            let out = kubectl(
                &["get", "namespace", &namespace, "-o", "jsonpath={.status.phase}"],
                None,
            );
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        };
        for _ in 0..120 {
            if phase().as_deref() != Some("Terminating") {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        if phase().is_none() {
            kubectl_ok(&["create", "-f", "-"], Some(&namespace_object(&namespace).to_string()));
        }
        let watching = format!("namespaces={{{watched}}}");
        let controllers = controllers.map(|c| format!("controllers={{{c}}}"));
        let mut settings = vec![watching.as_str(), "replicas=1", "logFormat=text"];
        settings.extend(controllers.as_deref());
        let yaml = template(&release, &namespace, &settings).unwrap_or_else(|e| panic!("helm template: {e}"));
        kubectl_ok(&["apply", "-f", "-"], Some(&yaml));
        let deployed = Self { namespace, release };
        if let Ok(mut handles) = HANDLES.lock() {
            *handles.entry(deployed.release.clone()).or_default() += 1;
        }
        deployed.scale(1);
        deployed
    }

    fn deployment(&self) -> String {
        format!("deployment/{}-noops-operator", self.release)
    }

    fn selector(&self) -> String {
        format!("app.kubernetes.io/name={}-noops-operator", self.release)
    }

    /// Scales it to `replicas` and waits for the rollout.
    pub fn scale(&self, replicas: u32) {
        let replicas = format!("--replicas={replicas}");
        kubectl_ok(&["scale", "-n", &self.namespace, &self.deployment(), &replicas], None);
        let rolled = kubectl(
            &[
                "rollout",
                "status",
                "-n",
                &self.namespace,
                &self.deployment(),
                "--timeout=180s",
            ],
            None,
        );
        if !rolled.status.success() {
            let pods = kubectl(
                &["describe", "pods", "-n", &self.namespace, "-l", &self.selector()],
                None,
            );
            panic!(
                "the operator did not roll out: {}\n{}",
                String::from_utf8_lossy(&rolled.stderr),
                String::from_utf8_lossy(&pods.stdout)
            );
        }
    }

    /// Its pods killed at once (no grace) and none started again.
    pub fn kill(&self) {
        let _ = kubectl(
            &["scale", "-n", &self.namespace, &self.deployment(), "--replicas=0"],
            None,
        );
        let _ = kubectl(
            &[
                "delete",
                "pods",
                "-n",
                &self.namespace,
                "-l",
                &self.selector(),
                "--grace-period=0",
                "--force",
                "--wait=false",
            ],
            None,
        );
    }

    /// `jsonpath` over its pods.
    fn pods(&self, jsonpath: &str) -> String {
        let selector = self.selector();
        let output = format!("jsonpath={jsonpath}");
        let out = kubectl(
            &["get", "pods", "-n", &self.namespace, "-l", &selector, "-o", &output],
            None,
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Whether a pod of it runs.
    pub fn running(&self) -> bool {
        self.pods("{.items[*].status.phase}").contains("Running")
    }

    /// Where its Ready pod serves /metrics (its address on the pods' network, which this
    /// machine reaches).
    pub fn http(&self) -> Option<String> {
        let ready = self
            .pods(r#"{range .items[*]}{.status.podIP}{" "}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#);
        ready
            .lines()
            .filter_map(|line| line.split_once(' '))
            .find(|(ip, ready)| !ip.is_empty() && *ready == "True")
            .map(|(ip, _)| format!("{ip}:8080"))
    }

    /// Its pods' logs, the earlier containers' too.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for previous in ["--previous=true", "--previous=false"] {
            let out = kubectl(
                &[
                    "logs",
                    "-n",
                    &self.namespace,
                    "-l",
                    &self.selector(),
                    "--tail=-1",
                    "--prefix",
                    previous,
                ],
                None,
            );
            text.push_str(&String::from_utf8_lossy(&out.stdout));
        }
        text
    }

    /// Waits up to `limit` for a Ready pod.
    pub async fn wait_http(&self, limit: Duration) -> Option<String> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(http) = self.http() {
                return Some(http);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl Drop for Deployed {
    /// The release goes with its last handle: its cluster-wide objects and its namespace.
    fn drop(&mut self) {
        if let Ok(mut handles) = HANDLES.lock() {
            let left = handles.get(&self.release).map_or(0, |n| n.saturating_sub(1));
            handles.insert(self.release.clone(), left);
            if left > 0 {
                return;
            }
        }
        self.kill();
        let name = format!("{}-noops-operator", self.release);
        let _ = kubectl(
            &[
                "delete",
                "clusterrole,clusterrolebinding",
                &name,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
        let _ = kubectl(
            &[
                "delete",
                "namespace",
                &self.namespace,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
    }
}
