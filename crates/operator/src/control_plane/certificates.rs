//! The tenant's certificates, from two CAs of its own that the operator keeps in Secrets (the
//! cluster's CA, which signs the API server's serving certificate and every client certificate,
//! and the front proxy's, for aggregated APIs), and the service-account key pair. Leaf
//! certificates last a year and are issued again when a third of that is left, or when what
//! they name changes (the Service's address); the kubeconfigs of the admin, the
//! controller-manager and the scheduler carry theirs.
//!
//! Which certificates and what they say is pure; `core::pki` makes them.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::json;

use super::names::Names;
use crate::core::pki::{self, Ca, Issued, Usage};
use crate::core::stamp::hash_of;

/// The annotation of a leaf Secret holding a hash of what its certificate says (names,
/// addresses, subject): a change issues it again.
pub const ISSUED_FOR_ANNOTATION: &str = "noops.dev/issued-for";
/// The key of a kubeconfig in its Secret.
pub const KUBECONFIG_KEY: &str = "kubeconfig";

/// The two CAs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authority {
    Cluster,
    FrontProxy,
}

impl Authority {
    pub fn secret(self, names: &Names) -> String {
        match self {
            Authority::Cluster => names.ca_secret(),
            Authority::FrontProxy => names.front_proxy_ca_secret(),
        }
    }

    /// Its subject's common name.
    pub fn common_name(self, names: &Names) -> String {
        let which = match self {
            Authority::Cluster => "Kubernetes CA",
            Authority::FrontProxy => "front proxy CA",
        };
        format!("noops {which} {}/{}", names.namespace, names.control_plane)
    }
}

/// The leaf certificates of a control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Certificate {
    /// The API server's serving certificate.
    ApiServer,
    /// The API server to kubelets (logs, exec).
    KubeletClient,
    /// The API server to aggregated API servers.
    FrontProxyClient,
    /// The user's kubeconfig (`system:masters`).
    Admin,
    ControllerManager,
    Scheduler,
}

/// What the API server's certificate must name beside the Service's DNS names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addresses {
    /// The Service's ClusterIP (clients reach the API there).
    pub service_ip: Option<IpAddr>,
    /// The tenant's own `kubernetes` Service address: the first of its service range.
    pub tenant_service_ip: Option<IpAddr>,
    /// The tenant's DNS domain.
    pub dns_domain: String,
    /// Names and addresses outside clients use (`endpoint::extra_names`).
    pub extra: Vec<String>,
}

/// Where kubeconfigs send their clients: the Service's ClusterIP, and for the admin's, the
/// external endpoint too when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Servers {
    pub internal: String,
    pub external: Option<String>,
}

impl Servers {
    /// What `certificate`'s Secret is made for, as its issued-for hash records it: a change
    /// of the external endpoint makes the admin's Secret again, and only the admin's.
    pub fn said_for(&self, certificate: Certificate) -> String {
        match (certificate, &self.external) {
            (Certificate::Admin, Some(external)) => format!("{} {external}", self.internal),
            _ => self.internal.clone(),
        }
    }
}

impl Certificate {
    pub const ALL: [Certificate; 6] = [
        Certificate::ApiServer,
        Certificate::KubeletClient,
        Certificate::FrontProxyClient,
        Certificate::Admin,
        Certificate::ControllerManager,
        Certificate::Scheduler,
    ];

    pub fn secret(self, names: &Names) -> String {
        let part = match self {
            Certificate::ApiServer => "apiserver-tls",
            Certificate::KubeletClient => "apiserver-kubelet-client",
            Certificate::FrontProxyClient => "front-proxy-client",
            Certificate::Admin => "admin-kubeconfig",
            Certificate::ControllerManager => "controller-manager-kubeconfig",
            Certificate::Scheduler => "scheduler-kubeconfig",
        };
        format!("{}-{part}", names.control_plane)
    }

    /// What it is, in words.
    pub fn describe(self) -> &'static str {
        match self {
            Certificate::ApiServer => "the API server's serving certificate",
            Certificate::KubeletClient => "the API server's kubelet client",
            Certificate::FrontProxyClient => "the front proxy client",
            Certificate::Admin => "the admin kubeconfig",
            Certificate::ControllerManager => "the controller-manager's kubeconfig",
            Certificate::Scheduler => "the scheduler's kubeconfig",
        }
    }

    pub fn authority(self) -> Authority {
        match self {
            Certificate::FrontProxyClient => Authority::FrontProxy,
            _ => Authority::Cluster,
        }
    }

    /// The user a kubeconfig certificate logs in as; `None` for the API server's own.
    pub fn kubeconfig_user(self) -> Option<&'static str> {
        match self {
            Certificate::Admin => Some("kubernetes-admin"),
            Certificate::ControllerManager => Some("system:kube-controller-manager"),
            Certificate::Scheduler => Some("system:kube-scheduler"),
            _ => None,
        }
    }

    /// What the certificate says.
    pub fn leaf(self, names: &Names, addresses: &Addresses) -> pki::Leaf {
        match self {
            Certificate::ApiServer => {
                let mut leaf = pki::Leaf::new("kube-apiserver", Usage::Server);
                let domain = &addresses.dns_domain;
                leaf.dns_names = vec![
                    "kubernetes".into(),
                    "kubernetes.default".into(),
                    "kubernetes.default.svc".into(),
                    format!("kubernetes.default.svc.{domain}"),
                    "localhost".into(),
                ];
                leaf.dns_names.extend(names.service_dns_names());
                leaf.ips = [addresses.service_ip, addresses.tenant_service_ip]
                    .into_iter()
                    .flatten()
                    .chain([IpAddr::V4(Ipv4Addr::LOCALHOST)])
                    .collect();
                for extra in &addresses.extra {
                    match extra.parse::<IpAddr>() {
                        Ok(ip) if !leaf.ips.contains(&ip) => leaf.ips.push(ip),
                        Ok(_) => {}
                        Err(_) if !leaf.dns_names.contains(extra) => leaf.dns_names.push(extra.clone()),
                        Err(_) => {}
                    }
                }
                leaf
            }
            Certificate::KubeletClient => {
                let mut leaf = pki::Leaf::new("kube-apiserver-kubelet-client", Usage::Client);
                leaf.organizations.push("system:masters".into());
                leaf
            }
            Certificate::FrontProxyClient => pki::Leaf::new("front-proxy-client", Usage::Client),
            Certificate::Admin => {
                let mut leaf = pki::Leaf::new("kubernetes-admin", Usage::Client);
                leaf.organizations.push("system:masters".into());
                leaf
            }
            Certificate::ControllerManager => pki::Leaf::new("system:kube-controller-manager", Usage::Client),
            Certificate::Scheduler => pki::Leaf::new("system:kube-scheduler", Usage::Client),
        }
    }
}

/// The hash of what a leaf says and of the server its kubeconfig names, kept on its Secret.
pub fn issued_for(leaf: &pki::Leaf, server: &str) -> String {
    let ips: Vec<String> = leaf.ips.iter().map(|ip| ip.to_string()).collect();
    let said = json!({
        "cn": leaf.common_name, "o": leaf.organizations, "dns": leaf.dns_names, "ips": ips,
        "usage": format!("{:?}", leaf.usage), "server": server,
    });
    hash_of(&said)
}

/// Whether `certificate` must be issued (again): its Secret missing or unreadable, a third of
/// its life left, issued for other names or another server address, or by another CA than
/// `ca` (a CA Secret deleted is made anew, and everything it signed must follow).
pub fn due(
    secret: Option<&Secret>,
    leaf: &pki::Leaf,
    ca: &Ca,
    server: &str,
    now: jiff::Timestamp,
    lifetime: std::time::Duration,
) -> bool {
    let for_now = secret
        .and_then(|s| s.metadata.annotations.as_ref())
        .and_then(|a| a.get(ISSUED_FOR_ANNOTATION))
        .is_some_and(|h| *h == issued_for(leaf, server));
    let by_this_ca = secret
        .and_then(|s| s.data.as_ref()?.get("ca.crt"))
        .is_some_and(|pem| pem.0 == ca.cert.as_bytes());
    !for_now || !by_this_ca || pki::needs_issuing(secret, now, lifetime)
}

/// The API server's address for clients: its Service's ClusterIP.
pub fn server_url(service_ip: IpAddr) -> String {
    format!("https://{service_ip}:{}", super::names::API_SERVER_PORT)
}

/// A kubeconfig for `user` with its certificate, for the API at `server`.
pub fn kubeconfig(names: &Names, user: &str, issued: &Issued, ca: &Ca, server: &str) -> String {
    use base64::Engine as _;
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text.as_bytes());
    let cluster = &names.control_plane;
    let context = format!("{user}@{cluster}");
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": cluster, "cluster": { "server": server, "certificate-authority-data": b64(&ca.cert) } }],
        "users": [{ "name": user, "user": { "client-certificate-data": b64(&issued.cert), "client-key-data": b64(&issued.key) } }],
        "contexts": [{ "name": context, "context": { "cluster": cluster, "user": user } }],
        "current-context": context,
    });
    serde_saphyr::to_string(&config).unwrap_or_else(|_| config.to_string())
}

/// The Secret of a leaf certificate, with the kubeconfig for kubeconfig certificates.
pub fn leaf_secret(
    names: &Names,
    certificate: Certificate,
    leaf: &pki::Leaf,
    issued: &Issued,
    ca: &Ca,
    servers: &Servers,
    owner: &OwnerReference,
) -> Secret {
    let (mut data, mut annotations) = issued.secret_data(ca);
    annotations.insert(
        ISSUED_FOR_ANNOTATION.into(),
        issued_for(leaf, &servers.said_for(certificate)),
    );
    if let Some(user) = certificate.kubeconfig_user() {
        data.insert(
            KUBECONFIG_KEY.into(),
            kubeconfig(names, user, issued, ca, &servers.internal),
        );
        if let (Certificate::Admin, Some(external)) = (certificate, &servers.external) {
            data.insert(
                super::endpoint::EXTERNAL_KUBECONFIG_KEY.into(),
                kubeconfig(names, user, issued, ca, external),
            );
        }
    }
    let type_ = match certificate.kubeconfig_user() {
        Some(_) => "Opaque",
        None => "kubernetes.io/tls",
    };
    secret(names, certificate.secret(names), type_, (data, annotations), owner)
}

/// The Secret of a CA.
pub fn ca_secret(names: &Names, authority: Authority, ca: &Ca, owner: &OwnerReference) -> Secret {
    let contents = (ca.secret_data(), BTreeMap::new());
    secret(names, authority.secret(names), "Opaque", contents, owner)
}

/// The Secret of the service-account key pair (`sa.key`, `sa.pub`).
pub fn service_account_secret(names: &Names, private: String, public: String, owner: &OwnerReference) -> Secret {
    let data = BTreeMap::from([("sa.key".to_string(), private), ("sa.pub".to_string(), public)]);
    secret(
        names,
        names.service_account_secret(),
        "Opaque",
        (data, BTreeMap::new()),
        owner,
    )
}

type Contents = (BTreeMap<String, String>, BTreeMap<String, String>);

fn secret(names: &Names, name: String, type_: &str, contents: Contents, owner: &OwnerReference) -> Secret {
    let labels = names.labels(Some("certificates"));
    pki::secret(name, &names.namespace, labels, owner, type_, contents)
}

/// The tenant's `kubernetes` Service address: the first address of its service range.
pub fn tenant_service_ip(service_cidr: &str) -> Option<IpAddr> {
    let (base, _) = service_cidr.split_once('/')?;
    let base: Ipv4Addr = base.parse().ok()?;
    Some(IpAddr::V4(Ipv4Addr::from(u32::from(base).checked_add(1)?)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fixtures::owner_reference;
    use std::time::Duration;

    const YEAR: Duration = Duration::from_secs(365 * 86_400);

    fn names() -> Names {
        Names {
            control_plane: "team-a".into(),
            namespace: "tenants".into(),
        }
    }

    fn addresses(service_ip: [u8; 4]) -> Addresses {
        Addresses {
            service_ip: Some(IpAddr::from(service_ip)),
            tenant_service_ip: tenant_service_ip("10.112.0.0/16"),
            dns_domain: "cluster.local".into(),
            extra: vec![],
        }
    }

    fn only(url: &str) -> Servers {
        Servers {
            internal: url.into(),
            external: None,
        }
    }

    fn at(days: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000 + days * 86_400).unwrap()
    }

    #[test]
    fn the_serving_certificate_names_the_service_and_the_tenants_kubernetes_service() {
        let leaf = Certificate::ApiServer.leaf(&names(), &addresses([10, 96, 3, 4]));
        for name in ["kubernetes.default.svc.cluster.local", "team-a.tenants.svc", "team-a"] {
            assert!(
                leaf.dns_names.iter().any(|n| n == name),
                "{name} in {:?}",
                leaf.dns_names
            );
        }
        assert!(leaf.ips.contains(&IpAddr::from([10, 96, 3, 4])));
        assert!(leaf.ips.contains(&IpAddr::from([10, 112, 0, 1])), "{:?}", leaf.ips);
        assert_eq!(
            Certificate::Admin
                .leaf(&names(), &addresses([10, 96, 3, 4]))
                .organizations,
            vec!["system:masters"]
        );
        assert_eq!(Certificate::FrontProxyClient.authority(), Authority::FrontProxy);
        assert_eq!(Certificate::Scheduler.secret(&names()), "team-a-scheduler-kubeconfig");
    }

    #[test]
    fn a_certificate_is_issued_again_when_the_service_moves_or_its_life_runs_short() {
        let ca = Ca::new(&Authority::Cluster.common_name(&names()), at(0)).unwrap();
        let owner = owner_reference("KubernetesControlPlane", "team-a", "u1");
        let leaf = Certificate::ApiServer.leaf(&names(), &addresses([10, 96, 3, 4]));
        let issued = ca.issue(&leaf, at(0), YEAR).unwrap();
        let url = server_url(IpAddr::from([10, 96, 3, 4]));
        let secret = leaf_secret(
            &names(),
            Certificate::ApiServer,
            &leaf,
            &issued,
            &ca,
            &only(&url),
            &owner,
        );
        assert!(due(None, &leaf, &ca, &url, at(0), YEAR), "missing");
        assert!(!due(Some(&secret), &leaf, &ca, &url, at(1), YEAR));
        assert!(
            due(Some(&secret), &leaf, &ca, &url, at(300), YEAR),
            "a third of its life left"
        );
        let moved = Certificate::ApiServer.leaf(&names(), &addresses([10, 96, 9, 9]));
        assert!(
            due(Some(&secret), &moved, &ca, &url, at(1), YEAR),
            "the Service's address changed"
        );
        let admin = Certificate::Admin.leaf(&names(), &addresses([10, 96, 3, 4]));
        let issued = ca.issue(&admin, at(0), YEAR).unwrap();
        let kubeconfig = leaf_secret(&names(), Certificate::Admin, &admin, &issued, &ca, &only(&url), &owner);
        let elsewhere = server_url(IpAddr::from([10, 96, 9, 9]));
        assert!(!due(Some(&kubeconfig), &admin, &ca, &url, at(1), YEAR));
        assert!(
            due(Some(&kubeconfig), &admin, &ca, &elsewhere, at(1), YEAR),
            "a kubeconfig names the server"
        );
        let another = Ca::new(&Authority::Cluster.common_name(&names()), at(0)).unwrap();
        assert!(
            due(Some(&secret), &leaf, &another, &url, at(1), YEAR),
            "signed by a CA that is no longer the control plane's"
        );
    }

    #[test]
    fn a_kubeconfig_names_the_server_its_ca_and_its_user() {
        let ca = Ca::new("test CA", at(0)).unwrap();
        let leaf = Certificate::Admin.leaf(&names(), &addresses([10, 96, 3, 4]));
        let issued = ca.issue(&leaf, at(0), YEAR).unwrap();
        let owner = owner_reference("KubernetesControlPlane", "team-a", "u1");
        let url = server_url(IpAddr::from([10, 96, 3, 4]));
        let secret = leaf_secret(&names(), Certificate::Admin, &leaf, &issued, &ca, &only(&url), &owner);
        let data = secret.data.unwrap();
        let kubeconfig = String::from_utf8(data[KUBECONFIG_KEY].0.clone()).unwrap();
        let parsed: serde_json::Value = serde_saphyr::from_str(&kubeconfig).unwrap();
        assert_eq!(parsed["clusters"][0]["cluster"]["server"], "https://10.96.3.4:6443");
        assert!(!data.contains_key(super::super::endpoint::EXTERNAL_KUBECONFIG_KEY));
        // With an external endpoint: a second kubeconfig naming it, and the serving
        // certificate naming its host.
        let servers = Servers {
            internal: url.clone(),
            external: Some("https://api.acme.example:443".into()),
        };
        let secret = leaf_secret(&names(), Certificate::Admin, &leaf, &issued, &ca, &servers, &owner);
        let data = secret.data.unwrap();
        let external = String::from_utf8(data[super::super::endpoint::EXTERNAL_KUBECONFIG_KEY].0.clone()).unwrap();
        let parsed: serde_json::Value = serde_saphyr::from_str(&external).unwrap();
        assert_eq!(
            parsed["clusters"][0]["cluster"]["server"],
            "https://api.acme.example:443"
        );
        assert_ne!(
            servers.said_for(Certificate::Admin),
            only(&url).said_for(Certificate::Admin)
        );
        assert_eq!(
            servers.said_for(Certificate::Scheduler),
            url,
            "only the admin's follows it"
        );
        let mut outside = addresses([10, 96, 3, 4]);
        outside.extra = vec!["api.acme.example".into(), "203.0.113.5".into()];
        let serving = Certificate::ApiServer.leaf(&names(), &outside);
        assert!(serving.dns_names.contains(&"api.acme.example".to_string()));
        assert!(serving.ips.contains(&IpAddr::from([203, 0, 113, 5])));
        assert_eq!(parsed["current-context"], "kubernetes-admin@team-a");
        assert_eq!(parsed["users"][0]["name"], "kubernetes-admin");
        assert_eq!(tenant_service_ip("10.112.0.0/16"), Some(IpAddr::from([10, 112, 0, 1])));
        assert_eq!(tenant_service_ip("banana"), None);
    }
}
