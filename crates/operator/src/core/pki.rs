//! Certificates the operator issues from CAs of its own (an etcd cluster's, a hosted control
//! plane's): a CA, leaf certificates for a subject, names and usages, the data of their
//! Secrets, and when a leaf must be issued again. Pure but for the keys it generates: the time
//! is a parameter.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// The annotation of a leaf Secret holding when its certificate expires (RFC 3339).
pub const NOT_AFTER_ANNOTATION: &str = "noops.dev/not-after";
/// How long a CA lasts.
const CA_DAYS: i64 = 3650;

/// Errors making certificates.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("failed to make a certificate: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("secret {secret} lacks {key}")]
    Missing { secret: String, key: &'static str },
    #[error("time out of range: {0}")]
    Time(String),
}

/// A CA: its subject's common name, certificate and key (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ca {
    pub common_name: String,
    pub cert: String,
    pub key: String,
}

fn ca_params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn offset(t: jiff::Timestamp) -> Result<time::OffsetDateTime, PkiError> {
    time::OffsetDateTime::from_unix_timestamp(t.as_second()).map_err(|e| PkiError::Time(e.to_string()))
}

impl Ca {
    /// A new CA named `common_name`, valid from `now` for ten years.
    pub fn new(common_name: &str, now: jiff::Timestamp) -> Result<Self, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = ca_params(common_name);
        params.not_before = offset(now - jiff::SignedDuration::from_hours(1))?;
        params.not_after = offset(now + jiff::SignedDuration::from_hours(24 * CA_DAYS))?;
        let cert = params.self_signed(&key)?;
        Ok(Self {
            common_name: common_name.into(),
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }

    /// The CA named `common_name` read back from its Secret (`ca.crt`, `ca.key`).
    pub fn of(secret: &Secret, common_name: &str) -> Result<Self, PkiError> {
        Ok(Self {
            common_name: common_name.into(),
            cert: secret_text(secret, "ca.crt")?,
            key: secret_text(secret, "ca.key")?,
        })
    }

    /// The data of its Secret.
    pub fn secret_data(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("ca.crt".to_string(), self.cert.clone()),
            ("ca.key".to_string(), self.key.clone()),
        ])
    }

    /// Issues `leaf`, valid from `now` for `lifetime`.
    pub fn issue(&self, leaf: &Leaf, now: jiff::Timestamp, lifetime: Duration) -> Result<Issued, PkiError> {
        let issuer = Issuer::new(ca_params(&self.common_name), KeyPair::from_pem(&self.key)?);
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, leaf.common_name.as_str());
        for organization in &leaf.organizations {
            params
                .distinguished_name
                .push(DnType::OrganizationName, organization.as_str());
        }
        params.subject_alt_names = leaf.subject_alt_names();
        params.extended_key_usages = leaf.usage.extended();
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
}

/// What a leaf certificate is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    Server,
    Client,
    ServerAndClient,
}

impl Usage {
    fn extended(self) -> Vec<ExtendedKeyUsagePurpose> {
        match self {
            Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Usage::ServerAndClient => vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
        }
    }
}

/// A leaf certificate to issue: its subject (a Kubernetes client certificate's user and
/// groups), the names and addresses it serves, and its usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub usage: Usage,
}

impl Leaf {
    /// A leaf for `common_name` with no names, groups or addresses.
    pub fn new(common_name: impl Into<String>, usage: Usage) -> Self {
        Self {
            common_name: common_name.into(),
            organizations: Vec::new(),
            dns_names: Vec::new(),
            ips: Vec::new(),
            usage,
        }
    }

    pub(crate) fn subject_alt_names(&self) -> Vec<SanType> {
        let names = self
            .dns_names
            .iter()
            .filter_map(|n| n.clone().try_into().ok().map(SanType::DnsName));
        names.chain(self.ips.iter().map(|ip| SanType::IpAddress(*ip))).collect()
    }
}

/// A leaf certificate (PEM) and when it expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    pub cert: String,
    pub key: String,
    pub not_after: jiff::Timestamp,
}

impl Issued {
    /// The data of its Secret (`tls.crt`, `tls.key`, `ca.crt`), and its annotations (when it
    /// expires).
    pub fn secret_data(&self, ca: &Ca) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
        let data = BTreeMap::from([
            ("tls.crt".to_string(), self.cert.clone()),
            ("tls.key".to_string(), self.key.clone()),
            ("ca.crt".to_string(), ca.cert.clone()),
        ]);
        let annotations = BTreeMap::from([(NOT_AFTER_ANNOTATION.to_string(), self.not_after.to_string())]);
        (data, annotations)
    }
}

/// When the leaf in `secret` expires, as the operator noted when it issued it.
pub fn not_after(secret: &Secret) -> Option<jiff::Timestamp> {
    secret
        .metadata
        .annotations
        .as_ref()?
        .get(NOT_AFTER_ANNOTATION)?
        .parse()
        .ok()
}

/// Whether a leaf Secret must be issued (again): missing, unreadable, or with less than a
/// third of `lifetime` left.
pub fn needs_issuing(secret: Option<&Secret>, now: jiff::Timestamp, lifetime: Duration) -> bool {
    let not_after = secret.and_then(not_after);
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

/// A new key pair (ECDSA P-256, PEM): the private key (PKCS #8) and the public key (SPKI), as
/// a service-account signing key is given to the API server and the controller-manager.
pub fn new_key_pair() -> Result<(String, String), PkiError> {
    let key = KeyPair::generate()?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

/// The Secret a CA or a leaf is kept in, owned by `owner`: `data` as text, and `annotations`
/// (when a leaf expires, what it was issued for) if there are any.
pub fn secret(
    name: String,
    namespace: &str,
    labels: BTreeMap<String, String>,
    owner: &OwnerReference,
    type_: &str,
    (data, annotations): (BTreeMap<String, String>, BTreeMap<String, String>),
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.into()),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        type_: Some(type_.into()),
        data: Some(data.into_iter().map(|(k, v)| (k, ByteString(v.into_bytes()))).collect()),
        ..Default::default()
    }
}

/// A key of a Secret, as text.
pub fn secret_text(secret: &Secret, key: &'static str) -> Result<String, PkiError> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .ok_or_else(|| PkiError::Missing {
            secret: secret.metadata.name.clone().unwrap_or_default(),
            key,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const YEAR: Duration = Duration::from_secs(365 * 86_400);

    fn at(days: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000 + days * 86_400).unwrap()
    }

    fn secret_of(data: BTreeMap<String, String>, annotations: BTreeMap<String, String>) -> Secret {
        let mut secret = Secret::default();
        secret.metadata.annotations = Some(annotations);
        secret.data = Some(data.into_iter().map(|(k, v)| (k, ByteString(v.into_bytes()))).collect());
        secret
    }

    #[test]
    fn a_ca_read_back_from_its_secret_issues_leaves_with_their_subject_and_names() {
        let ca = Ca::new("noops test CA", at(0)).unwrap();
        assert!(ca.cert.starts_with("-----BEGIN CERTIFICATE-----"));
        let again = Ca::of(&secret_of(ca.secret_data(), BTreeMap::new()), "noops test CA").unwrap();
        assert_eq!(again, ca);
        let mut leaf = Leaf::new("system:kube-scheduler", Usage::Client);
        leaf.organizations.push("system:masters".into());
        leaf.dns_names.push("kcp.tenants.svc".into());
        leaf.ips.push(IpAddr::from([10, 96, 0, 7]));
        let issued = again.issue(&leaf, at(0), YEAR).unwrap();
        assert!(issued.cert.contains("BEGIN CERTIFICATE") && issued.key.contains("PRIVATE KEY"));
        assert_eq!(issued.not_after, at(365));
        let sans = leaf.subject_alt_names();
        assert!(sans.contains(&SanType::IpAddress(IpAddr::from([10, 96, 0, 7]))));
        assert_eq!(sans.len(), 2);
        assert_eq!(Usage::Client.extended(), vec![ExtendedKeyUsagePurpose::ClientAuth]);
        let mut missing = secret_of(ca.secret_data(), BTreeMap::new());
        missing.data.as_mut().unwrap().remove("ca.key");
        assert!(matches!(
            Ca::of(&missing, "x"),
            Err(PkiError::Missing { key: "ca.key", .. })
        ));
    }

    #[test]
    fn leaves_are_issued_again_with_a_third_of_their_life_left() {
        let ca = Ca::new("noops test CA", at(0)).unwrap();
        let leaf = Leaf::new("peer", Usage::ServerAndClient);
        let issued = ca.issue(&leaf, at(0), YEAR).unwrap();
        let (data, annotations) = issued.secret_data(&ca);
        let secret = secret_of(data, annotations);
        assert!(needs_issuing(None, at(0), YEAR), "missing");
        assert!(!needs_issuing(Some(&secret), at(200), YEAR));
        assert!(needs_issuing(Some(&secret), at(244), YEAR), "a third of a year left");
        let mut broken = secret.clone();
        broken.data.as_mut().unwrap().remove("tls.key");
        assert!(needs_issuing(Some(&broken), at(1), YEAR), "unreadable");
        // A shorter lifetime: issued for 90 s, again with 30 s left.
        let minute_and_a_half = Duration::from_secs(90);
        let short = ca.issue(&leaf, at(0), minute_and_a_half).unwrap();
        assert_eq!(short.not_after, at(0) + jiff::SignedDuration::from_secs(90));
        let (data, annotations) = short.secret_data(&ca);
        let secret = secret_of(data, annotations);
        let later = |s: i64| at(0) + jiff::SignedDuration::from_secs(s);
        assert!(!needs_issuing(Some(&secret), later(59), minute_and_a_half));
        assert!(needs_issuing(Some(&secret), later(60), minute_and_a_half));
    }
}
