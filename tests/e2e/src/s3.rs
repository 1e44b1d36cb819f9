//! The S3-compatible object store of `examples/object-store`, started from its manifest as a
//! user would, and reached from this machine (its Service's ClusterIP) and from pods.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Secret, Service};
use object_store::aws::{AmazonS3, AmazonS3Builder};

use crate::{TestNamespace, kubectl_ok, root, wait_for};

/// Starts versitygw in `ns` from the example manifest and waits until it serves.
pub fn deploy(ns: &TestNamespace) {
    let manifest = std::fs::read_to_string(root().join("examples/object-store/versitygw.yaml")).unwrap();
    ns.apply(&manifest);
    kubectl_ok(
        &[
            "wait",
            "-n",
            &ns.name,
            "--for=condition=Available",
            "deployment/versitygw",
            "--timeout=120s",
        ],
        None,
    );
}

/// The URL pods (and the operator) are given: the Service's DNS name.
pub fn service_url(ns: &TestNamespace) -> String {
    format!("http://versitygw.{}.svc:7070", ns.name)
}

/// A pod that runs `script` with the store's credentials in its environment and curl's S3
/// signing options in `$S3` (the store at `$E`); returns its log once it has succeeded.
pub async fn run_client(ns: &TestNamespace, name: &str, script: &str) -> String {
    let script = format!(
        "set -e\nS3=\"-sSf --aws-sigv4 aws:amz:$AWS_REGION:s3 --user $AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY -H x-amz-content-sha256:UNSIGNED-PAYLOAD\"\nE=http://versitygw:7070\n{script}"
    );
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "client",
                "image": "busybox",
                "command": ["sh", "-c", script],
                "envFrom": [{ "secretRef": { "name": "object-store-credentials" } }],
                "volumeMounts": [{ "name": "scratch", "mountPath": "/scratch" }],
            }],
            "volumes": [{ "name": "scratch", "emptyDir": {} }],
        },
    });
    ns.apply(&pod.to_string());
    let pods = ns.pods();
    let phase = wait_for(&format!("{name} to finish"), Duration::from_secs(180), || async {
        let phase = pods.get_opt(name).await.ok()??.status?.phase?;
        matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
    })
    .await;
    let logs = pods.logs(name, &Default::default()).await.unwrap_or_default();
    assert_eq!(phase, "Succeeded", "{name} failed: {logs}");
    logs
}

/// The store's Secret keys and its Service's ClusterIP endpoint, as this machine reaches it.
struct Store {
    endpoint: String,
    region: String,
    access_key: String,
    secret_key: String,
}

async fn store(ns: &TestNamespace) -> Store {
    let secret = ns.api::<Secret>().get("object-store-credentials").await.unwrap();
    let key = |k: &str| String::from_utf8(secret.data.as_ref().unwrap()[k].0.clone()).unwrap();
    let service = ns.api::<Service>().get("versitygw").await.unwrap();
    Store {
        endpoint: format!("http://{}:7070", service.spec.unwrap().cluster_ip.unwrap()),
        region: key("AWS_REGION"),
        access_key: key("AWS_ACCESS_KEY_ID"),
        secret_key: key("AWS_SECRET_ACCESS_KEY"),
    }
}

/// Creates `bucket`, from this machine (curl signs the request: object_store makes no
/// buckets), so that it needs no client image on the nodes. The store's Service may reach it
/// a moment after the Deployment is Available: tried for 30 s.
pub async fn create_bucket(ns: &TestNamespace, bucket: &str) {
    let store = store(ns).await;
    let url = format!("{}/{bucket}", store.endpoint);
    let signing = format!("aws:amz:{}:s3", store.region);
    let user = format!("{}:{}", store.access_key, store.secret_key);
    wait_for(&format!("bucket {bucket} made"), Duration::from_secs(30), || async {
        let made = tokio::process::Command::new("curl")
            .args(["-sSf", "--max-time", "5", "--aws-sigv4", &signing, "--user", &user])
            .args(["-H", "x-amz-content-sha256:UNSIGNED-PAYLOAD", "-X", "PUT", &url])
            .output()
            .await
            .ok()?;
        made.status.success().then_some(())
    })
    .await;
}

/// `bucket` as seen from this machine, at the Service's ClusterIP, with the Secret's keys.
pub async fn bucket(ns: &TestNamespace, bucket: &str) -> AmazonS3 {
    let store = store(ns).await;
    AmazonS3Builder::new()
        .with_endpoint(&store.endpoint)
        .with_allow_http(true)
        .with_region(store.region)
        .with_bucket_name(bucket)
        .with_access_key_id(store.access_key)
        .with_secret_access_key(store.secret_key)
        .build()
        .unwrap()
}
