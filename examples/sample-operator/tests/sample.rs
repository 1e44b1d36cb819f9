//! The sample operator against the local Kubernetes (`make cluster-up` first): a Sample gets its
//! ConfigMap and a Ready status, follows edits, and takes its ConfigMap with it when deleted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn kubectl(args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new(root().join(".noops/bin/kubectl"))
        .arg("--kubeconfig")
        .arg(root().join(".noops/kubeconfig"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl (run `make cluster-up`)");
    if let Some(input) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

struct Killed(std::process::Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
    }
}

#[test]
fn a_sample_gets_its_config_map_and_a_ready_status() {
    let crd = Command::new(env!("CARGO_BIN_EXE_sample")).arg("crd").output().unwrap();
    kubectl(&["apply", "-f", "-"], Some(&String::from_utf8_lossy(&crd.stdout)));
    kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "crd/samples.examples.noops.dev",
            "--timeout=30s",
        ],
        None,
    );
    let ns = format!("sample-{}", std::process::id());
    kubectl(&["create", "namespace", &ns], None);
    let _operator = Killed(
        Command::new(env!("CARGO_BIN_EXE_sample"))
            .arg("run")
            .env("KUBECONFIG", root().join(".noops/kubeconfig"))
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let sample = "apiVersion: examples.noops.dev/v1\nkind: Sample\nmetadata: { name: hello }\nspec: { message: hi }\n";
    kubectl(&["apply", "-n", &ns, "-f", "-"], Some(sample));
    kubectl(
        &[
            "wait",
            "-n",
            &ns,
            "--for=condition=Ready",
            "sample/hello",
            "--timeout=60s",
        ],
        None,
    );
    let message = || {
        kubectl(
            &[
                "get",
                "-n",
                &ns,
                "configmap",
                "hello-message",
                "-o",
                "jsonpath={.data.message}",
            ],
            None,
        )
    };
    assert_eq!(message(), "hi");
    let table = kubectl(&["get", "-n", &ns, "samples"], None);
    assert!(
        table.starts_with("NAME") && table.contains("hello-message") && table.contains("True"),
        "{table}"
    );

    kubectl(
        &[
            "patch",
            "-n",
            &ns,
            "sample/hello",
            "--type=merge",
            "-p",
            r#"{"spec":{"message":"bye"}}"#,
        ],
        None,
    );
    eventually("the ConfigMap to follow the edit", || message() == "bye");

    // An empty message is refused by the schema.
    let bad = sample.replace("message: hi", "message: \"\"");
    let out = Command::new(root().join(".noops/bin/kubectl"))
        .arg("--kubeconfig")
        .arg(root().join(".noops/kubeconfig"))
        .args(["apply", "-n", &ns, "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(bad.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(!out.status.success());

    kubectl(&["delete", "-n", &ns, "sample/hello"], None);
    eventually("the ConfigMap to be garbage-collected", || {
        kubectl(&["get", "-n", &ns, "configmaps", "-o", "name"], None)
            .lines()
            .all(|l| !l.contains("hello-message"))
    });
    kubectl(&["delete", "namespace", &ns, "--wait=false"], None);
}
