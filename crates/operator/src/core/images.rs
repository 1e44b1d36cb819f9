//! Where the images of the services the operator runs come from (etcd, PostgreSQL): the
//! project's own repository, the same path in a registry of yours (`noops run
//! --image-registry`, for a mirror or a cluster with no way out), or a repository a resource
//! names itself (`spec.imageRepository`). The tag is always the resource's version, so an
//! upgrade is still a version change. Pure.

/// The operator-wide choice of registry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Images {
    /// A registry (and path) that holds the projects' images under their own paths, such as
    /// `registry.example.com/mirror`; none: the projects' registries.
    pub registry: Option<String>,
}

impl Images {
    /// The repository to pull from: the resource's own choice, else `default` (as its project
    /// publishes it, such as `quay.io/coreos/etcd` or `postgres`) moved into the registry.
    pub fn repository(&self, default: &str, chosen: Option<&str>) -> String {
        if let Some(chosen) = chosen.filter(|c| !c.is_empty()) {
            return chosen.to_string();
        }
        match self.registry.as_deref().map(|r| r.trim_end_matches('/')) {
            Some(registry) if !registry.is_empty() => format!("{registry}/{}", path_in_registry(default)),
            _ => default.to_string(),
        }
    }
}

/// The path of `repository` without its registry: `quay.io/coreos/etcd` is `coreos/etcd`, and
/// Docker Hub's `postgres` is `library/postgres` (as Docker Hub mirrors lay them out).
fn path_in_registry(repository: &str) -> String {
    match repository.split_once('/') {
        Some((first, rest)) if first.contains('.') || first.contains(':') || first == "localhost" => rest.to_string(),
        Some(_) => repository.to_string(),
        None => format!("library/{repository}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_projects_images_unless_a_registry_or_the_resource_says_otherwise() {
        let projects = Images::default();
        assert_eq!(projects.repository("quay.io/coreos/etcd", None), "quay.io/coreos/etcd");
        assert_eq!(projects.repository("postgres", None), "postgres");

        let mirror = Images {
            registry: Some("registry.example.com/mirror/".into()),
        };
        assert_eq!(
            mirror.repository("quay.io/coreos/etcd", None),
            "registry.example.com/mirror/coreos/etcd"
        );
        assert_eq!(
            mirror.repository("postgres", None),
            "registry.example.com/mirror/library/postgres"
        );
        assert_eq!(
            mirror.repository("bitnami/etcd", None),
            "registry.example.com/mirror/bitnami/etcd"
        );
        // A resource's own repository wins, registry or not.
        assert_eq!(
            mirror.repository("postgres", Some("registry.example.com/db/pg")),
            "registry.example.com/db/pg"
        );
        assert_eq!(
            mirror.repository("postgres", Some("")),
            "registry.example.com/mirror/library/postgres"
        );
    }
}
