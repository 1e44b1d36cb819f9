//! The image a PostgreSQL runs from, and the user it runs as: the instance's pod and the pods
//! that take and delete its backups use the same ones.

/// The user and group of the official image's `postgres` (the local Kubernetes runs its
/// image as its own `postgres` user).
pub const POSTGRES_UID: i64 = 999;

/// The image of a major version.
pub fn image(version: &str) -> String {
    format!("postgres:{version}")
}
