//! Where the images of the services the operator runs come from (etcd, PostgreSQL): the
//! project's own repository, the same path in a registry of yours (`noops run
//! --image-registry`, for a mirror or a cluster with no way out), or a repository a resource
//! names itself (`spec.imageRepository`). The tag is always the resource's version, so an
//! upgrade is still a version change. A registry that asks for credentials gets them from the
//! Secrets `noops run --image-pull-secrets` names, which every pod the operator makes for an
//! operand carries. Pure.

use k8s_openapi::api::core::v1::LocalObjectReference;

/// The operator-wide choice of registry, and the credentials to pull with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Images {
    /// A registry (and path) that holds the projects' images under their own paths, such as
    /// `registry.example.com/mirror`; none: the projects' registries.
    pub registry: Option<String>,
    /// The Secrets (in each operand's namespace) that pods pull their images with.
    pub pull_secrets: Vec<String>,
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

    /// The `imagePullSecrets` of a pod: none when there are none, so that an applied object
    /// does not gain an empty field (nor a blank name from a stray comma).
    pub fn image_pull_secrets(&self) -> Option<Vec<LocalObjectReference>> {
        let secrets: Vec<_> = self
            .pull_secrets
            .iter()
            .map(|name| name.trim())
            .filter(|name| !name.is_empty())
            .map(|name| LocalObjectReference { name: name.into() })
            .collect();
        (!secrets.is_empty()).then_some(secrets)
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
            ..Default::default()
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

    #[test]
    fn pods_carry_the_pull_secrets_only_when_there_are_some() {
        assert_eq!(Images::default().image_pull_secrets(), None);
        let blank = Images {
            pull_secrets: vec!["".into(), " ".into()],
            ..Default::default()
        };
        assert_eq!(blank.image_pull_secrets(), None);
        let private = Images {
            pull_secrets: vec!["mirror-creds".into(), " ".into(), "quay-creds".into()],
            ..Default::default()
        };
        let names: Vec<String> = private
            .image_pull_secrets()
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["mirror-creds", "quay-creds"]);
    }
}
