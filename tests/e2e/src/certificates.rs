//! Certificates as tests look at them: when a Secret's expires, what it holds, and what a
//! server presents.

use k8s_openapi::api::core::v1::Secret;
use rustls::pki_types::ServerName;

use crate::TestNamespace;

/// When the certificate of Secret `name` expires, as the operator's annotation says.
pub async fn not_after(ns: &TestNamespace, name: &str) -> jiff::Timestamp {
    let secret = ns.api::<Secret>().get(name).await.unwrap();
    secret.metadata.annotations.unwrap_or_default()["noops.dev/not-after"]
        .parse()
        .unwrap()
}

/// The certificate under `key` of Secret `name`, DER.
pub async fn certificate_in(ns: &TestNamespace, name: &str, key: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    let secret = ns.api::<Secret>().get(name).await.unwrap();
    let pem = secret.data.unwrap().remove(key).unwrap().0;
    rustls::pki_types::CertificateDer::from_pem_slice(&pem)
        .unwrap()
        .to_vec()
}

/// The certificate the server at `address` (`<ip>:<port>`) presents, checked against the CA `ca`
/// (DER) as a client would: valid now, for `server_name` (the address's IP when `None`). The
/// server may go on to refuse us for having no client certificate: by then it has shown its own.
pub fn presented_certificate(address: &str, server_name: Option<&str>, ca: &[u8]) -> Result<Vec<u8>, String> {
    let name = match server_name {
        Some(dns) => ServerName::try_from(dns.to_string()).map_err(|e| e.to_string())?,
        None => {
            let ip: std::net::IpAddr = address
                .rsplit_once(':')
                .ok_or("no port")?
                .0
                .parse()
                .map_err(|e: std::net::AddrParseError| e.to_string())?;
            ServerName::IpAddress(ip.into())
        }
    };
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(ca.to_vec()))
        .map_err(|e| e.to_string())?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut tls = rustls::ClientConnection::new(std::sync::Arc::new(config), name).map_err(|e| e.to_string())?;
    let mut socket = std::net::TcpStream::connect(address).map_err(|e| e.to_string())?;
    socket
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    while tls.is_handshaking() {
        tls.complete_io(&mut socket).map_err(|e| e.to_string())?;
    }
    let chain = tls.peer_certificates().ok_or("no certificate presented")?;
    Ok(chain[0].to_vec())
}
