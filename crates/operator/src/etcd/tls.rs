//! Certificates of an etcd cluster, from a CA of its own that the operator keeps in a Secret:
//! a peer certificate (members to each other), a server certificate (members to clients) and a
//! client certificate (for the operator and for users, in Secret `<cluster>-client`). Leaf
//! certificates last a year (`--certificate-lifetime-seconds`) and are issued again when a
//! third of that is left; members read them again on every new connection, so a renewal needs
//! no restart.
//!
//! The certificates themselves are the core's (`core::pki`); this file says which the cluster
//! has, what they name, and their Secrets.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::names::Names;
use crate::core::pki::{self, Ca, Issued, PkiError, Usage};

pub use crate::core::pki::needs_issuing;

/// The common name of the cluster's CA.
fn ca_name(names: &Names) -> String {
    format!("noops etcd CA {}/{}", names.namespace, names.cluster)
}

/// A new CA, valid from `now`.
pub fn new_ca(names: &Names, now: jiff::Timestamp) -> Result<Ca, PkiError> {
    Ca::new(&ca_name(names), now)
}

/// The CA read back from its Secret.
pub fn ca_of(secret: &Secret, names: &Names) -> Result<Ca, PkiError> {
    Ca::of(secret, &ca_name(names))
}

/// One leaf certificate to issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leaf {
    /// Members to each other (server and client of the peer port).
    Peer,
    /// Members to clients. etcd also uses it as a client certificate for its own gateway.
    Server,
    /// Clients of the cluster (the operator, users).
    Client,
}

impl Leaf {
    pub fn secret(self, names: &Names) -> String {
        match self {
            Leaf::Peer => names.peer_secret(),
            Leaf::Server => names.server_secret(),
            Leaf::Client => names.client_secret(),
        }
    }

    /// What the certificate says: its name, the names it serves, its usage.
    fn spec(self, names: &Names) -> pki::Leaf {
        let members = format!("*.{}.{}.svc", names.peer_service(), names.namespace);
        let (client, ns) = (names.client_service(), &names.namespace);
        let mut leaf = match self {
            Leaf::Peer => pki::Leaf::new(format!("{}-peer", names.cluster), Usage::ServerAndClient),
            Leaf::Server => pki::Leaf::new(format!("{}-server", names.cluster), Usage::ServerAndClient),
            Leaf::Client => pki::Leaf::new("root", Usage::Client),
        };
        leaf.dns_names = match self {
            Leaf::Peer => vec![members.clone(), format!("{members}.cluster.local")],
            Leaf::Server => vec![
                members.clone(),
                format!("{members}.cluster.local"),
                client.clone(),
                format!("{client}.{ns}"),
                format!("{client}.{ns}.svc"),
                format!("{client}.{ns}.svc.cluster.local"),
                "localhost".into(),
            ],
            Leaf::Client => vec![],
        };
        if self == Leaf::Server {
            leaf.ips.push(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        }
        leaf
    }
}

/// Issues `leaf` from `ca`, valid from `now` for `lifetime`.
pub fn issue(ca: &Ca, names: &Names, leaf: Leaf, now: jiff::Timestamp, lifetime: Duration) -> Result<Issued, PkiError> {
    ca.issue(&leaf.spec(names), now, lifetime)
}

/// The Secret of the CA.
pub fn ca_secret(ca: &Ca, names: &Names, owner: &OwnerReference) -> Secret {
    let labels = names.cluster_labels();
    pki::secret(
        names.ca_secret(),
        &names.namespace,
        labels,
        owner,
        "Opaque",
        (ca.secret_data(), BTreeMap::new()),
    )
}

/// The Secret of a leaf certificate (`tls.crt`, `tls.key`, `ca.crt`).
pub fn leaf_secret(issued: &Issued, ca: &Ca, names: &Names, leaf: Leaf, owner: &OwnerReference) -> Secret {
    let (name, labels) = (leaf.secret(names), names.cluster_labels());
    pki::secret(
        name,
        &names.namespace,
        labels,
        owner,
        "kubernetes.io/tls",
        issued.secret_data(ca),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fixtures::owner_reference;
    use rcgen::SanType;

    fn names() -> Names {
        Names::of(&crate::etcd::fixtures::cluster().build())
    }

    const YEAR: Duration = Duration::from_secs(365 * 86_400);

    fn at(days: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000 + days * 86_400).unwrap()
    }

    #[test]
    fn leaves_are_signed_by_the_ca_and_name_what_they_serve() {
        let ca = new_ca(&names(), at(0)).unwrap();
        assert!(ca.cert.starts_with("-----BEGIN CERTIFICATE-----"));
        let server = issue(&ca, &names(), Leaf::Server, at(0), YEAR).unwrap();
        assert!(server.cert.contains("BEGIN CERTIFICATE") && server.key.contains("PRIVATE KEY"));
        assert_eq!(server.not_after, at(365));
        let sans = Leaf::Server.spec(&names()).subject_alt_names();
        for expected in ["*.main.db.svc", "main-client.db.svc", "localhost"] {
            assert!(
                sans.iter()
                    .any(|s| matches!(s, SanType::DnsName(n) if n.as_str() == expected)),
                "{expected} in {sans:?}"
            );
        }
        assert!(Leaf::Peer.spec(&names()).subject_alt_names().len() == 2);
        assert_eq!(Leaf::Client.spec(&names()).usage, Usage::Client);
        // A CA read back from its Secret issues too.
        let owner = owner_reference("EtcdCluster", "main", "u1");
        let again = ca_of(&ca_secret(&ca, &names(), &owner), &names()).unwrap();
        assert_eq!(again, ca);
        assert!(issue(&again, &names(), Leaf::Client, at(1), YEAR).is_ok());
    }
}
