//! Certificates of an etcd cluster, from a CA of its own that the operator keeps in a Secret:
//! a peer certificate (members to each other), a server certificate (members to clients) and a
//! client certificate (for the operator and for users, in Secret `<cluster>-client`). Leaf
//! certificates last a year (`--etcd-certificate-lifetime-seconds`) and are issued again when a
//! third of that is left; members read them again on every new connection, so a renewal needs
//! no restart.
//!
//! Building and checking are pure (the time is a parameter); the reconcile applies the Secrets.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use super::names::Names;

/// The annotation holding when a leaf certificate expires (RFC 3339).
pub const NOT_AFTER_ANNOTATION: &str = "noops.dev/not-after";
/// How long the CA lasts.
const CA_DAYS: i64 = 3650;

/// Errors making certificates.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("failed to make a certificate: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("secret {secret} lacks {key}")]
    Missing { secret: String, key: &'static str },
    #[error("time out of range: {0}")]
    Time(String),
}

/// The cluster's CA: its certificate and key (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ca {
    pub cert: String,
    pub key: String,
}

fn ca_name(names: &Names) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!("noops etcd CA {}/{}", names.namespace, names.cluster),
    );
    dn
}

fn ca_params(names: &Names) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = ca_name(names);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn offset(t: jiff::Timestamp) -> Result<time::OffsetDateTime, TlsError> {
    time::OffsetDateTime::from_unix_timestamp(t.as_second()).map_err(|e| TlsError::Time(e.to_string()))
}

/// A new CA, valid from `now`.
pub fn new_ca(names: &Names, now: jiff::Timestamp) -> Result<Ca, TlsError> {
    let key = KeyPair::generate()?;
    let mut params = ca_params(names);
    params.not_before = offset(now - jiff::SignedDuration::from_hours(1))?;
    params.not_after = offset(now + jiff::SignedDuration::from_hours(24 * CA_DAYS))?;
    let cert = params.self_signed(&key)?;
    Ok(Ca {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
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

    fn subject_alt_names(self, names: &Names) -> Vec<SanType> {
        let members = format!("*.{}.{}.svc", names.peer_service(), names.namespace);
        let (client, ns) = (names.client_service(), &names.namespace);
        let dns_names: Vec<String> = match self {
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
        let mut sans: Vec<SanType> = dns_names
            .into_iter()
            .filter_map(|n| n.try_into().ok().map(SanType::DnsName))
            .collect();
        if self == Leaf::Server {
            sans.push(SanType::IpAddress(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)));
        }
        sans
    }

    fn usages(self) -> Vec<ExtendedKeyUsagePurpose> {
        match self {
            Leaf::Peer | Leaf::Server => vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
            Leaf::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        }
    }

    fn common_name(self, names: &Names) -> String {
        match self {
            Leaf::Peer => format!("{}-peer", names.cluster),
            Leaf::Server => format!("{}-server", names.cluster),
            Leaf::Client => "root".into(),
        }
    }
}

/// A leaf certificate (PEM) and when it expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    pub cert: String,
    pub key: String,
    pub not_after: jiff::Timestamp,
}

/// Issues `leaf` from `ca`, valid from `now` for `lifetime`.
pub fn issue(ca: &Ca, names: &Names, leaf: Leaf, now: jiff::Timestamp, lifetime: Duration) -> Result<Issued, TlsError> {
    let ca_key = KeyPair::from_pem(&ca.key)?;
    let issuer = Issuer::new(ca_params(names), ca_key);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, leaf.common_name(names));
    params.subject_alt_names = leaf.subject_alt_names(names);
    params.extended_key_usages = leaf.usages();
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    let not_after = now + jiff::SignedDuration::try_from(lifetime).unwrap_or(jiff::SignedDuration::MAX);
    params.not_before = offset(now - jiff::SignedDuration::from_hours(1))?;
    params.not_after = offset(not_after)?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Issued {
        cert: cert.pem(),
        key: key.serialize_pem(),
        not_after,
    })
}

/// Whether a leaf Secret must be issued (again): missing, unreadable, or with less than a
/// third of `lifetime` left.
pub fn needs_issuing(secret: Option<&Secret>, now: jiff::Timestamp, lifetime: Duration) -> bool {
    let not_after = secret
        .and_then(|s| s.metadata.annotations.as_ref())
        .and_then(|a| a.get(NOT_AFTER_ANNOTATION))
        .and_then(|t| t.parse::<jiff::Timestamp>().ok());
    let has_keys = secret
        .and_then(|s| s.data.as_ref())
        .is_some_and(|d| ["tls.crt", "tls.key", "ca.crt"].iter().all(|k| d.contains_key(*k)));
    match not_after {
        Some(t) if has_keys => {
            t - jiff::SignedDuration::try_from(lifetime / 3).unwrap_or(jiff::SignedDuration::MAX) <= now
        }
        _ => true,
    }
}

/// The CA read back from its Secret.
pub fn ca_of(secret: &Secret) -> Result<Ca, TlsError> {
    let get = |key: &'static str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .ok_or_else(|| TlsError::Missing {
                secret: secret.metadata.name.clone().unwrap_or_default(),
                key,
            })
    };
    Ok(Ca {
        cert: get("ca.crt")?,
        key: get("ca.key")?,
    })
}

fn secret(
    name: String,
    names: &Names,
    owner: &OwnerReference,
    type_: &str,
    data: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(names.namespace.clone()),
            labels: Some(names.cluster_labels()),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        type_: Some(type_.into()),
        data: Some(data.into_iter().map(|(k, v)| (k, ByteString(v.into_bytes()))).collect()),
        ..Default::default()
    }
}

/// The Secret of the CA.
pub fn ca_secret(ca: &Ca, names: &Names, owner: &OwnerReference) -> Secret {
    let data = BTreeMap::from([
        ("ca.crt".to_string(), ca.cert.clone()),
        ("ca.key".to_string(), ca.key.clone()),
    ]);
    secret(names.ca_secret(), names, owner, "Opaque", data, BTreeMap::new())
}

/// The Secret of a leaf certificate (`tls.crt`, `tls.key`, `ca.crt`).
pub fn leaf_secret(issued: &Issued, ca: &Ca, names: &Names, leaf: Leaf, owner: &OwnerReference) -> Secret {
    let data = BTreeMap::from([
        ("tls.crt".to_string(), issued.cert.clone()),
        ("tls.key".to_string(), issued.key.clone()),
        ("ca.crt".to_string(), ca.cert.clone()),
    ]);
    let annotations = BTreeMap::from([(NOT_AFTER_ANNOTATION.to_string(), issued.not_after.to_string())]);
    secret(leaf.secret(names), names, owner, "kubernetes.io/tls", data, annotations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fixtures::owner_reference;

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
        let sans = Leaf::Server.subject_alt_names(&names());
        for expected in ["*.main.db.svc", "main-client.db.svc", "localhost"] {
            assert!(
                sans.iter()
                    .any(|s| matches!(s, SanType::DnsName(n) if n.as_str() == expected)),
                "{expected} in {sans:?}"
            );
        }
        assert!(Leaf::Peer.subject_alt_names(&names()).len() == 2);
        assert!(Leaf::Client.usages() == vec![ExtendedKeyUsagePurpose::ClientAuth]);
        // A CA read back from its Secret issues too.
        let owner = owner_reference("EtcdCluster", "main", "u1");
        let again = ca_of(&ca_secret(&ca, &names(), &owner)).unwrap();
        assert_eq!(again, ca);
        assert!(issue(&again, &names(), Leaf::Client, at(1), YEAR).is_ok());
    }

    #[test]
    fn leaves_are_issued_again_with_a_third_of_their_life_left() {
        let ca = new_ca(&names(), at(0)).unwrap();
        let owner = owner_reference("EtcdCluster", "main", "u1");
        let issued = issue(&ca, &names(), Leaf::Peer, at(0), YEAR).unwrap();
        let secret = leaf_secret(&issued, &ca, &names(), Leaf::Peer, &owner);
        assert!(needs_issuing(None, at(0), YEAR), "missing");
        assert!(!needs_issuing(Some(&secret), at(200), YEAR));
        assert!(needs_issuing(Some(&secret), at(244), YEAR), "a third of a year left");
        let mut broken = secret.clone();
        broken.data.as_mut().unwrap().remove("tls.key");
        assert!(needs_issuing(Some(&broken), at(1), YEAR), "unreadable");
        // A shorter lifetime: issued for 90 s, again with 30 s left.
        let minute_and_a_half = Duration::from_secs(90);
        let short = issue(&ca, &names(), Leaf::Peer, at(0), minute_and_a_half).unwrap();
        assert_eq!(short.not_after, at(0) + jiff::SignedDuration::from_secs(90));
        let secret = leaf_secret(&short, &ca, &names(), Leaf::Peer, &owner);
        let later = |s: i64| at(0) + jiff::SignedDuration::from_secs(s);
        assert!(!needs_issuing(Some(&secret), later(59), minute_and_a_half));
        assert!(needs_issuing(Some(&secret), later(60), minute_and_a_half));
    }
}
