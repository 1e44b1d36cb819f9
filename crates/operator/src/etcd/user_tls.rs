//! The user's own certificates (`tls.secrets`): the operator issues nothing, so it checks,
//! before any member starts on them and on every pass after, that they would work: each
//! Secret is there with `tls.crt`, `tls.key` and `ca.crt`; the peer certificate chains to its
//! CA and is valid for every member name, as server and as client; the server certificate is
//! valid for every member name and for the client Service name the operator checks, and
//! chains to the client Secret's CA too (what the operator trusts); the client certificate
//! chains to the server's CA (which members trust for clients); each key goes with its
//! certificate. The checks a TLS handshake makes (rustls), at `now`, so an expired
//! certificate is caught too.
//! Pure.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use noops_api::etcd::EtcdClusterReason;
use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use super::names::Names;

/// Why the user's certificates cannot be used: a condition reason and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unusable {
    pub reason: EtcdClusterReason,
    pub message: String,
}

/// A name a wildcard over the members covers and a list of today's members does not: members
/// replaced get new names.
const ANY_MEMBER: &str = "any-member";

struct Pem {
    chain: Vec<CertificateDer<'static>>,
    roots: Arc<RootCertStore>,
}

/// A verification failure in words that do not change from one pass to the next (rustls puts
/// the time of the check in its expiry errors; a status quoting it would change every pass).
fn said(error: rustls::Error) -> String {
    use rustls::CertificateError as C;
    match error {
        rustls::Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => "it has expired".into(),
        rustls::Error::InvalidCertificate(C::NotValidYet | C::NotValidYetContext { .. }) => {
            "it is not valid yet".into()
        }
        other => other.to_string(),
    }
}

/// Checks the user's Secrets (found in `secrets` by name) for `names`; `None` if the cluster
/// uses the operator's CA.
pub fn check(names: &Names, secrets: &BTreeMap<String, Arc<Secret>>, now: jiff::Timestamp) -> Option<Unusable> {
    let user = names.user_secrets.as_ref()?;
    let now = UnixTime::since_unix_epoch(std::time::Duration::from_secs(now.as_second().max(0).unsigned_abs()));
    let members = format!("*.{}.{}.svc", names.peer_service(), names.namespace);
    let any_member = names.member_host(ANY_MEMBER);
    let result = (|| {
        let peer = read(secrets, &user.peer, "peer")?;
        let server = read(secrets, &user.server, "server")?;
        let client = read(secrets, &user.client, "client")?;
        let invalid = |field: &str, name: &str, what: String| Unusable {
            reason: EtcdClusterReason::TlsSecretInvalid,
            message: format!("the certificate in Secret {name:?} (tls.secrets.{field}) {what}"),
        };
        serves(&peer, &any_member, now).map_err(|e| {
            invalid(
                "peer",
                &user.peer,
                format!("is not valid for every member ({members}) as a server: {e}"),
            )
        })?;
        is_client(&peer.chain, &peer.roots, now).map_err(|e| {
            invalid(
                "peer",
                &user.peer,
                format!("is not valid as a client of its own CA: {e}"),
            )
        })?;
        serves(&server, &any_member, now).map_err(|e| {
            invalid(
                "server",
                &user.server,
                format!("is not valid for every member ({members}): {e}"),
            )
        })?;
        serves(&server, &names.tls_name(), now).map_err(|e| {
            invalid(
                "server",
                &user.server,
                format!("is not valid for {}: {e}", names.tls_name()),
            )
        })?;
        // The operator and the backup pods check members against the client Secret's CA.
        let server_as_clients_see_it = Pem {
            chain: server.chain.clone(),
            roots: client.roots.clone(),
        };
        serves(&server_as_clients_see_it, &names.tls_name(), now).map_err(|e| {
            invalid(
                "server",
                &user.server,
                format!("is not trusted by the CA in tls.secrets.client ({}): {e}", user.client),
            )
        })?;
        is_client(&client.chain, &server.roots, now).map_err(|e| {
            invalid(
                "client",
                &user.client,
                format!("is not a client certificate the server Secret's CA accepts: {e}"),
            )
        })?;
        Ok(())
    })();
    result.err()
}

fn read(secrets: &BTreeMap<String, Arc<Secret>>, name: &str, field: &str) -> Result<Pem, Unusable> {
    let secret = secrets.get(name).ok_or_else(|| Unusable {
        reason: EtcdClusterReason::TlsSecretMissing,
        message: format!("Secret {name:?} (tls.secrets.{field}) does not exist in this namespace"),
    })?;
    let invalid = |what: String| Unusable {
        reason: EtcdClusterReason::TlsSecretInvalid,
        message: format!("Secret {name:?} (tls.secrets.{field}) {what}"),
    };
    let get = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| v.0.clone())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| invalid(format!("has no {key}")))
    };
    let (cert, key, ca) = (get("tls.crt")?, get("tls.key")?, get("ca.crt")?);
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert)
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(format!("has a tls.crt that is not PEM certificates: {e}")))?;
    if chain.is_empty() {
        return Err(invalid("has no certificate in tls.crt".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(&key)
        .map_err(|e| invalid(format!("has a tls.key that is not a PEM private key: {e}")))?;
    rustls::sign::CertifiedKey::from_der(chain.clone(), key, &provider())
        .map_err(|e| invalid(format!("has a tls.key that does not go with its tls.crt: {e}")))?;
    let mut roots = RootCertStore::empty();
    for der in CertificateDer::pem_slice_iter(&ca) {
        let der = der.map_err(|e| invalid(format!("has a ca.crt that is not PEM certificates: {e}")))?;
        roots
            .add(der)
            .map_err(|e| invalid(format!("has a ca.crt that cannot be trusted: {e}")))?;
    }
    if roots.is_empty() {
        return Err(invalid("has no certificate in ca.crt".into()));
    }
    Ok(Pem {
        chain,
        roots: Arc::new(roots),
    })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Whether `pem`'s certificate chains to its own CA and is a server certificate for `host`.
fn serves(pem: &Pem, host: &str, now: UnixTime) -> Result<(), String> {
    let verifier = WebPkiServerVerifier::builder_with_provider(pem.roots.clone(), provider())
        .build()
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(host.to_string()).map_err(|e| e.to_string())?;
    let (leaf, intermediates) = pem.chain.split_first().ok_or("no certificate")?;
    verifier
        .verify_server_cert(leaf, intermediates, &name, &[], now)
        .map(|_| ())
        .map_err(said)
}

/// Whether `chain` is a client certificate that `roots` accept.
fn is_client(chain: &[CertificateDer<'static>], roots: &Arc<RootCertStore>, now: UnixTime) -> Result<(), String> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
        .build()
        .map_err(|e| e.to_string())?;
    let (leaf, intermediates) = chain.split_first().ok_or("no certificate")?;
    verifier
        .verify_client_cert(leaf, intermediates, now)
        .map(|_| ())
        .map_err(said)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fixtures::owner_reference;
    use crate::etcd::tls::{Leaf, issue, leaf_secret, new_ca};
    use noops_api::etcd::TlsSecrets;
    use std::time::Duration;

    const YEAR: Duration = Duration::from_secs(365 * 86_400);

    fn at(days: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000 + days * 86_400).unwrap()
    }

    /// Names with user Secrets, and those Secrets made by the operator's own issuing code
    /// (what a user's cert-manager would make: the same names and usages).
    fn user_cluster() -> (Names, BTreeMap<String, Arc<Secret>>) {
        let mut names = Names::of(&crate::etcd::fixtures::cluster().build());
        let operator_names = names.clone();
        names.user_secrets = Some(TlsSecrets {
            peer: "my-peer".into(),
            server: "my-server".into(),
            client: "my-client".into(),
        });
        let ca = new_ca(&operator_names, at(0)).unwrap();
        let owner = owner_reference("EtcdCluster", "main", "u1");
        let secrets = [
            (Leaf::Peer, "my-peer"),
            (Leaf::Server, "my-server"),
            (Leaf::Client, "my-client"),
        ]
        .into_iter()
        .map(|(leaf, name)| {
            let issued = issue(&ca, &operator_names, leaf, at(0), YEAR).unwrap();
            (
                name.to_string(),
                Arc::new(leaf_secret(&issued, &ca, &operator_names, leaf, &owner)),
            )
        })
        .collect();
        (names, secrets)
    }

    #[test]
    fn good_certificates_pass() {
        let (names, secrets) = user_cluster();
        assert_eq!(check(&names, &secrets, at(1)), None);
    }

    #[test]
    fn a_missing_secret_key_or_an_expired_certificate_is_named() {
        let (names, mut secrets) = user_cluster();
        let reason = |secrets: &BTreeMap<String, Arc<Secret>>, at| check(&names, secrets, at).unwrap();
        let expired = reason(&secrets, at(400));
        assert_eq!(expired.reason, EtcdClusterReason::TlsSecretInvalid);
        assert!(
            expired.message.contains("my-peer") && expired.message.contains("expired"),
            "{}",
            expired.message
        );
        assert_eq!(
            reason(&secrets, at(401)),
            expired,
            "the same words every pass: no status churn"
        );

        let mut swapped = (*secrets["my-peer"]).clone();
        let other_key = secrets["my-client"].data.as_ref().unwrap()["tls.key"].clone();
        swapped.data.as_mut().unwrap().insert("tls.key".into(), other_key);
        let mut mismatched = secrets.clone();
        mismatched.insert("my-peer".into(), Arc::new(swapped));
        let wrong_key = reason(&mismatched, at(1));
        assert!(
            wrong_key.message.contains("does not go with its tls.crt"),
            "{}",
            wrong_key.message
        );

        let mut keyless = (*secrets["my-server"]).clone();
        keyless.data.as_mut().unwrap().remove("tls.key");
        secrets.insert("my-server".into(), Arc::new(keyless));
        let no_key = reason(&secrets, at(1));
        assert_eq!(
            (no_key.reason, no_key.message.as_str()),
            (
                EtcdClusterReason::TlsSecretInvalid,
                "Secret \"my-server\" (tls.secrets.server) has no tls.key"
            )
        );

        secrets.remove("my-client");
        secrets.insert("my-server".into(), user_cluster().1["my-server"].clone());
        let missing = reason(&secrets, at(1));
        assert_eq!(missing.reason, EtcdClusterReason::TlsSecretMissing);
        assert!(missing.message.contains("my-client"), "{}", missing.message);
    }

    #[test]
    fn certificates_for_other_names_or_another_ca_are_refused() {
        let (names, original) = user_cluster();
        let mut secrets = original.clone();
        // A server certificate of another cluster: not valid for these members.
        let mut other = crate::etcd::fixtures::cluster().build();
        other.metadata.name = Some("other".into());
        let other_names = Names::of(&other);
        let ca = new_ca(&other_names, at(0)).unwrap();
        let issued = issue(&ca, &other_names, Leaf::Server, at(0), YEAR).unwrap();
        let owner = owner_reference("EtcdCluster", "other", "u2");
        secrets.insert(
            "my-server".into(),
            Arc::new(leaf_secret(&issued, &ca, &other_names, Leaf::Server, &owner)),
        );
        let wrong = check(&names, &secrets, at(1)).unwrap();
        assert!(
            wrong.message.contains("tls.secrets.server") && wrong.message.contains("*.main.db.svc"),
            "{}",
            wrong.message
        );
        // The right names, but from a CA the client Secret does not trust: the operator could
        // not check the members.
        let (_, elsewhere) = user_cluster();
        secrets.insert("my-server".into(), elsewhere["my-server"].clone());
        let wrong = check(&names, &secrets, at(1)).unwrap();
        assert!(
            wrong.message.starts_with("the certificate in Secret \"my-server\"")
                && wrong.message.contains("not trusted by the CA in tls.secrets.client"),
            "{}",
            wrong.message
        );
        // A client certificate the server's CA never issued (its own ca.crt still trusts the
        // server): members would refuse it.
        secrets.insert("my-server".into(), original["my-server"].clone());
        let mut stranger = (*elsewhere["my-client"]).clone();
        let trusted_ca = original["my-client"].data.as_ref().unwrap()["ca.crt"].clone();
        stranger.data.as_mut().unwrap().insert("ca.crt".into(), trusted_ca);
        secrets.insert("my-client".into(), Arc::new(stranger));
        let wrong = check(&names, &secrets, at(1)).unwrap();
        assert!(
            wrong.message.starts_with("the certificate in Secret \"my-client\"")
                && wrong
                    .message
                    .contains("not a client certificate the server Secret's CA accepts"),
            "{}",
            wrong.message
        );
        assert_eq!(check(&names, &original, at(1)), None, "the originals still pass");
    }
}
