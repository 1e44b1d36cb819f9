//! The names of everything an EtcdCluster owns, and the URLs members are reached at. One place,
//! so that the builders, the client and the membership planner agree.

use std::collections::BTreeMap;

use noops_api::EtcdCluster;
use noops_api::etcd::TlsSecrets;

use crate::core::images::Images;
use crate::core::labels;

/// The label naming the EtcdCluster an object belongs to.
pub const CLUSTER_LABEL: &str = "noops.dev/etcdcluster";
/// The label naming the member a pod or volume belongs to.
pub const MEMBER_LABEL: &str = "noops.dev/etcd-member";
/// Set on an EtcdCluster that has lost its quorum, it asks the operator to start the cluster
/// again from a backup: an EtcdBackup's name, or `latest` (the newest successful backup of
/// this cluster). One request, one recovery: the operator removes the annotation.
pub const RECOVER_ANNOTATION: &str = "noops.dev/recover-from-backup";

/// Client, peer and metrics ports.
pub const CLIENT_PORT: i32 = 2379;
pub const PEER_PORT: i32 = 2380;
pub const METRICS_PORT: i32 = 2381;

/// The etcd project's repository (the local Kubernetes maps its tags to its own builds).
pub const ETCD_REPOSITORY: &str = "quay.io/coreos/etcd";

/// Names derived from one EtcdCluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub cluster: String,
    pub namespace: String,
    pub tls: bool,
    /// The user's own certificate Secrets, if the cluster names them.
    pub user_secrets: Option<TlsSecrets>,
    /// Where etcd is pulled from (`core::images`): the image is `<this>:v<version>`. The one
    /// asked for, unless it was found to have no image: then the one the members ran.
    pub image_repository: String,
    /// The repository asked for, when it is refused (it had no image for a member).
    pub refused_repository: Option<String>,
}

impl Names {
    /// The names of `cluster`, its etcd pulled from the projects' registries.
    pub fn of(cluster: &EtcdCluster) -> Self {
        Self::pulling_from(cluster, &Images::default())
    }

    /// The names of `cluster`, its etcd pulled as `images` says, unless its status found that
    /// repository without an image for a member.
    pub fn pulling_from(cluster: &EtcdCluster, images: &Images) -> Self {
        let asked = images.repository(ETCD_REPOSITORY, cluster.spec.image_repository.as_deref());
        let status = cluster.status.as_ref();
        let ran = status.and_then(|s| s.image_repository.clone());
        let refused = status.and_then(|s| s.unavailable_repository.as_deref()) == Some(asked.as_str());
        let (image_repository, refused_repository) = match ran {
            Some(ran) if refused && ran != asked => (ran, Some(asked)),
            _ => (asked, None),
        };
        Self {
            cluster: cluster.metadata.name.clone().unwrap_or_default(),
            namespace: cluster.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            tls: cluster.spec.tls.enabled,
            user_secrets: cluster.spec.tls.secrets.clone().filter(|_| cluster.spec.tls.enabled),
            image_repository,
            refused_repository,
        }
    }

    /// The user's own certificate Secrets (peer, server, client), if the cluster names them.
    pub fn user_secret_names(&self) -> Vec<String> {
        self.user_secrets
            .iter()
            .flat_map(|u| [u.peer.clone(), u.server.clone(), u.client.clone()])
            .collect()
    }

    /// The name of the member with `index`: `<cluster>-<index>`. Indexes only grow, so a name
    /// (and the volume named after it) is never given to a second member.
    pub fn member(&self, index: i64) -> String {
        format!("{}-{index}", self.cluster)
    }

    /// The index of a member name of this cluster.
    pub fn member_index(&self, member: &str) -> Option<i64> {
        member.strip_prefix(&self.cluster)?.strip_prefix('-')?.parse().ok()
    }

    /// The headless Service that gives members their stable DNS names.
    pub fn peer_service(&self) -> String {
        self.cluster.clone()
    }

    /// The Service clients use.
    pub fn client_service(&self) -> String {
        format!("{}-client", self.cluster)
    }

    /// A member's volume.
    pub fn volume(&self, member: &str) -> String {
        format!("{member}-data")
    }

    /// The ConfigMap members read their initial cluster state from.
    pub fn state_config_map(&self) -> String {
        format!("{}-state", self.cluster)
    }

    pub fn ca_secret(&self) -> String {
        format!("{}-ca", self.cluster)
    }

    /// The peer certificate's Secret: the user's, or the one the operator issues.
    pub fn peer_secret(&self) -> String {
        match &self.user_secrets {
            Some(user) => user.peer.clone(),
            None => format!("{}-peer", self.cluster),
        }
    }

    /// The server certificate's Secret: the user's, or the one the operator issues.
    pub fn server_secret(&self) -> String {
        match &self.user_secrets {
            Some(user) => user.server.clone(),
            None => format!("{}-server", self.cluster),
        }
    }

    /// The client certificate's Secret: the user's, or the one the operator issues.
    pub fn client_secret(&self) -> String {
        match &self.user_secrets {
            Some(user) => user.client.clone(),
            None => format!("{}-client", self.cluster),
        }
    }

    fn scheme(&self) -> &'static str {
        if self.tls { "https" } else { "http" }
    }

    /// A member's stable DNS name.
    pub fn member_host(&self, member: &str) -> String {
        format!("{member}.{}.{}.svc", self.peer_service(), self.namespace)
    }

    /// The URL other members reach a member at.
    pub fn peer_url(&self, member: &str) -> String {
        format!("{}://{}:{PEER_PORT}", self.scheme(), self.member_host(member))
    }

    /// The URL a member advertises to clients.
    pub fn member_client_url(&self, member: &str) -> String {
        format!("{}://{}:{CLIENT_PORT}", self.scheme(), self.member_host(member))
    }

    /// The URL clients in the cluster use.
    pub fn client_url(&self) -> String {
        format!(
            "{}://{}.{}.svc:{CLIENT_PORT}",
            self.scheme(),
            self.client_service(),
            self.namespace
        )
    }

    /// The URL the operator reaches a member at: its pod IP (the operator may run outside the
    /// cluster, where cluster DNS does not answer); TLS checks the name [`Names::tls_name`].
    pub fn pod_url(&self, ip: &str) -> String {
        format!("{}://{ip}:{CLIENT_PORT}", self.scheme())
    }

    /// The name the server certificate is checked against when the operator connects by IP.
    pub fn tls_name(&self) -> String {
        format!("{}.{}.svc", self.client_service(), self.namespace)
    }

    /// The member a peer URL of this cluster belongs to.
    pub fn member_of_peer_url(&self, url: &str) -> Option<String> {
        let host = url.split("://").nth(1)?.split(':').next()?;
        let member = host.strip_suffix(&format!(".{}.{}.svc", self.peer_service(), self.namespace))?;
        self.member_index(member).map(|_| member.to_string())
    }

    /// The labels of every object of the cluster (the selector of its Services and caches).
    pub fn cluster_labels(&self) -> BTreeMap<String, String> {
        labels::child("etcd", CLUSTER_LABEL, &self.cluster, None)
    }

    /// The labels of one member's pod and volume.
    pub fn member_labels(&self, member: &str) -> BTreeMap<String, String> {
        let mut labels = labels::child("etcd", CLUSTER_LABEL, &self.cluster, Some("member"));
        labels.insert(MEMBER_LABEL.into(), member.into());
        labels
    }

    /// What the Services select: the cluster's members.
    pub fn selector(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (CLUSTER_LABEL.to_string(), self.cluster.clone()),
            (labels::COMPONENT.to_string(), "member".to_string()),
        ])
    }
}

/// Orders member names by their numeric suffix (`main-10` after `main-9`).
pub fn index_order(a: &str, b: &str) -> std::cmp::Ordering {
    let index = |n: &str| n.rsplit('-').next().and_then(|i| i.parse::<i64>().ok()).unwrap_or(-1);
    index(a).cmp(&index(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names {
        Names::of(&crate::etcd::fixtures::cluster().build())
    }

    #[test]
    fn members_and_urls_are_named_from_the_cluster() {
        let n = names();
        assert_eq!(n.member(4), "main-4");
        assert_eq!(n.member_index("main-4"), Some(4));
        assert_eq!(n.member_index("other-4"), None);
        assert_eq!(n.member_index("main-x"), None);
        assert_eq!(n.peer_url("main-4"), "https://main-4.main.db.svc:2380");
        assert_eq!(n.member_client_url("main-4"), "https://main-4.main.db.svc:2379");
        assert_eq!(n.client_url(), "https://main-client.db.svc:2379");
        assert_eq!(
            n.member_of_peer_url("https://main-4.main.db.svc:2380"),
            Some("main-4".into())
        );
        assert_eq!(n.member_of_peer_url("https://x-4.other.db.svc:2380"), None);
        let plain = Names { tls: false, ..names() };
        assert_eq!(plain.peer_url("main-0"), "http://main-0.main.db.svc:2380");
    }

    #[test]
    fn a_repository_found_without_an_image_is_refused_for_the_one_the_members_ran() {
        let mut cluster = crate::etcd::fixtures::cluster().build();
        cluster.spec.image_repository = Some("registry.invalid/etcd".into());
        let status = cluster.status.get_or_insert_with(Default::default);
        status.image_repository = Some(ETCD_REPOSITORY.into());
        // Not found wanting yet: the one asked for.
        let n = Names::of(&cluster);
        assert_eq!(
            (n.image_repository.as_str(), n.refused_repository),
            ("registry.invalid/etcd", None)
        );
        // Found wanting: the one the members ran, and the refused one said.
        cluster.status.as_mut().unwrap().unavailable_repository = Some("registry.invalid/etcd".into());
        let n = Names::of(&cluster);
        assert_eq!(n.image_repository, ETCD_REPOSITORY);
        assert_eq!(n.refused_repository.as_deref(), Some("registry.invalid/etcd"));
        // Another one asked for: tried.
        cluster.spec.image_repository = Some("registry.example/etcd".into());
        let n = Names::of(&cluster);
        assert_eq!(
            (n.image_repository.as_str(), n.refused_repository),
            ("registry.example/etcd", None)
        );
    }
}
