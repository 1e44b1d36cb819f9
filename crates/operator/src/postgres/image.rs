//! The image a PostgreSQL runs from, the user it runs as, and how the instance manager gets
//! into it: the instance's pod and the pods that take and delete its backups use the same.

/// The user and group of the official image's `postgres` (the local Kubernetes runs its
/// image as its own `postgres` user).
pub const POSTGRES_UID: i64 = 999;

/// The image of a major version in `repository` (tagged as the official image is).
pub fn image(repository: &str, version: &str) -> String {
    format!("{repository}:{version}")
}

/// The init container that copies the instance manager out of the operator's image into the
/// `controller` volume, for a pod of the PostgreSQL image to run it.
pub fn install_container(operator_image: &str) -> k8s_openapi::api::core::v1::Container {
    use super::names::{CONTROLLER_DIR, INSTANCE_MANAGER};
    k8s_openapi::api::core::v1::Container {
        name: "install".into(),
        image: Some(operator_image.into()),
        args: Some(vec![
            "pg-instance".into(),
            "install".into(),
            format!("--to={INSTANCE_MANAGER}"),
        ]),
        volume_mounts: Some(vec![k8s_openapi::api::core::v1::VolumeMount {
            name: "controller".into(),
            mount_path: CONTROLLER_DIR.into(),
            ..Default::default()
        }]),
        ..Default::default()
    }
}
