//! The S3-compatible object store of `examples/object-store`, started from its manifest as a user
//! would, used from this machine (through its Service's ClusterIP, with the `object_store` crate
//! the operators use) and from pods (through its Service's DNS name, with curl).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use noops_e2e::s3;
use noops_e2e::*;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};

const SIZE: usize = 100 * 1024 * 1024;

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// `SIZE` pseudo-random bytes (xorshift), different for each `seed`.
fn random_bytes(seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(SIZE);
    while out.len() < SIZE {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(SIZE);
    out
}

/// The value after `label ` in a log.
fn logged(logs: &str, label: &str) -> String {
    logs.lines()
        .find_map(|l| l.strip_prefix(label)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {label:?} in {logs}"))
        .trim()
        .to_string()
}

#[tokio::test]
async fn the_object_store_keeps_100_mb_objects_for_this_machine_and_for_pods() {
    let ns = TestNamespace::new("s3").await;
    s3::deploy(&ns);

    // A pod creates a bucket, another writes 100 MB and reads it back.
    s3::create_bucket(&ns, "backups").await;
    let logs = s3::run_client(
        &ns,
        "writer",
        "head -c 104857600 /dev/urandom > /scratch/object\n\
         echo \"wrote $(sha256sum /scratch/object | cut -d' ' -f1)\"\n\
         curl $S3 -T /scratch/object $E/backups/from-pod\n\
         curl $S3 -o /scratch/back $E/backups/from-pod\n\
         echo \"read $(sha256sum /scratch/back | cut -d' ' -f1)\"",
    )
    .await;
    let pod_sum = logged(&logs, "wrote");
    assert_eq!(logged(&logs, "read"), pod_sum, "the pod read back what it wrote");

    // This machine, at the Service's ClusterIP, with the keys from the Secret.
    let store = s3::bucket(&ns, "backups").await;
    let from_pod = store.get(&Path::from("from-pod")).await.unwrap().bytes().await.unwrap();
    assert_eq!(from_pod.len(), SIZE);
    assert_eq!(sha256_hex(&from_pod), pod_sum, "this machine reads what the pod wrote");
    let data = random_bytes(7);
    let host_sum = sha256_hex(&data);
    store
        .put(&Path::from("from-host"), PutPayload::from(data))
        .await
        .unwrap();
    let back = store
        .get(&Path::from("from-host"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(sha256_hex(&back), host_sum, "this machine reads back what it wrote");

    // And a pod reads what this machine wrote.
    let logs = s3::run_client(
        &ns,
        "reader",
        "curl $S3 -o /scratch/object $E/backups/from-host\n\
         echo \"read $(sha256sum /scratch/object | cut -d' ' -f1)\"",
    )
    .await;
    assert_eq!(logged(&logs, "read"), host_sum, "a pod reads what this machine wrote");
}
