//! Images from a registry of yours: an operator started with `--image-registry` pulls etcd and
//! PostgreSQL from it under their projects' paths, and a resource's `spec.imageRepository`
//! wins over both. The local Kubernetes maps those names to its builds (cluster/images.yaml),
//! so the pods run, and are Ready, from exactly the names asked for.
//! Needs `make cluster-up`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use noops_e2e::etcd::{cluster_manifest, etcd_version, wait_cluster_ready};
use noops_e2e::postgres::{manifest, wait_ready};
use noops_e2e::*;

const MINUTE: Duration = Duration::from_secs(60);
const REGISTRY: &str = "registry.example.com/mirror";

async fn image_of(ns: &TestNamespace, pod: &str, container: &str) -> String {
    let pod = ns.pods().get(pod).await.unwrap();
    pod.spec
        .unwrap()
        .containers
        .into_iter()
        .find(|c| c.name == container)
        .and_then(|c| c.image)
        .unwrap_or_default()
}

#[tokio::test]
async fn etcd_and_postgres_come_from_the_operators_registry_or_the_resources_own_repository() {
    install_crds();
    let ns = TestNamespace::new("images").await;
    let _operator = Operator::start(
        &ns.name,
        &["--controllers", "etcd,postgres", "--image-registry", REGISTRY],
    );
    let version = etcd_version("3.5");
    ns.apply(&cluster_manifest("mirrored", 1, &version, ""));
    ns.apply(&cluster_manifest(
        "own",
        1,
        &version,
        "  imageRepository: registry.example.com/etcd-team/etcd\n",
    ));
    ns.apply(&manifest("shop", "x-Pa55", ""));
    ns.apply(&manifest(
        "own-db",
        "y-Pa55",
        "  imageRepository: registry.example.com/db-team/postgres\n",
    ));

    wait_cluster_ready(&ns, "mirrored", 1, 3 * MINUTE).await;
    wait_cluster_ready(&ns, "own", 1, 3 * MINUTE).await;
    assert_eq!(
        image_of(&ns, "mirrored-0", "etcd").await,
        format!("{REGISTRY}/coreos/etcd:v{version}")
    );
    assert_eq!(
        image_of(&ns, "own-0", "etcd").await,
        format!("registry.example.com/etcd-team/etcd:v{version}")
    );
    wait_ready(&ns, "shop", 3 * MINUTE).await;
    wait_ready(&ns, "own-db", 3 * MINUTE).await;
    assert_eq!(
        image_of(&ns, "shop-0", "postgres").await,
        format!("{REGISTRY}/library/postgres:15")
    );
    assert_eq!(
        image_of(&ns, "own-db-0", "postgres").await,
        "registry.example.com/db-team/postgres:15"
    );

    // A repository with a tag is refused: the tag is always the version.
    for (yaml, what) in [
        (
            cluster_manifest("tagged", 1, &version, "  imageRepository: quay.io/coreos/etcd:v3.5.0\n"),
            "etcd",
        ),
        (
            manifest("tagged-db", "z-Pa55", "  imageRepository: postgres:15\n"),
            "postgres",
        ),
    ] {
        let error = apply_error(&ns, &yaml).unwrap_or_else(|| panic!("a tagged {what} repository accepted"));
        assert!(
            error.contains("imageRepository must be an image repository without a tag"),
            "{error}"
        );
    }
}
