//! What a VM joins the tenant with, in the Secret `<machine>-bootstrap`: the tenant's CA, a
//! kubeconfig for the node agent (a client certificate for `system:node:<name>` in
//! `system:nodes`, as the Node authorizer wants a kubelet's), one for kube-proxy
//! (`system:kube-proxy`, which the tenant's default RBAC binds to `system:node-proxier`), and
//! the serving certificate of the agent's kubelet API. All issued by the tenant's CA, and
//! issued again with a third of their lifetime left or when that CA changes: the VM's mounted
//! files follow, the agent reads its kubeconfig and serving certificate again, and kube-proxy's
//! kubeconfig names its certificate files, which client-go reads again (every five minutes).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::names::Names;
use crate::control_plane::certificates::kubeconfig;
use crate::control_plane::names::Names as ControlPlaneNames;
use crate::core::pki::{self, Ca, Leaf, PkiError, Usage};

pub const TENANT_CA: &str = "ca.crt";
pub const NODE_KUBECONFIG: &str = "node.kubeconfig";
pub const KUBE_PROXY_KUBECONFIG: &str = "kube-proxy.kubeconfig";
pub const SERVING_CERT: &str = "serving.crt";
pub const SERVING_KEY: &str = "serving.key";
const KUBE_PROXY_CERT: &str = "kube-proxy.crt";
const KUBE_PROXY_KEY: &str = "kube-proxy.key";

/// The certificates of one machine. Pure but for the keys it generates.
pub fn leaves(names: &Names) -> [(&'static str, Leaf); 3] {
    let mut node = Leaf::new(format!("system:node:{}", names.node()), Usage::Client);
    node.organizations.push("system:nodes".into());
    let mut serving = Leaf::new(names.node(), Usage::Server);
    serving.dns_names.push(names.node());
    [
        ("node", node),
        ("kube-proxy", Leaf::new("system:kube-proxy", Usage::Client)),
        ("serving", serving),
    ]
}

/// The bootstrap Secret, its certificates issued now by `ca`.
pub fn secret(
    names: &Names,
    ca: &Ca,
    owner: &OwnerReference,
    now: jiff::Timestamp,
    lifetime: Duration,
) -> Result<Secret, PkiError> {
    let server = names.api_server_url();
    // The kubeconfigs name the cluster as the control plane's own do.
    let cluster = ControlPlaneNames {
        control_plane: names.cluster.clone(),
        namespace: names.namespace.clone(),
    };
    let mut data = BTreeMap::from([(TENANT_CA.to_string(), ca.cert.clone())]);
    let mut not_after = None;
    for (role, leaf) in leaves(names) {
        let issued = ca.issue(&leaf, now, lifetime)?;
        not_after = Some(issued.not_after);
        match role {
            "node" => {
                data.insert(
                    NODE_KUBECONFIG.into(),
                    kubeconfig(&cluster, &leaf.common_name, &issued, ca, &server),
                );
            }
            "kube-proxy" => {
                data.insert(
                    KUBE_PROXY_KUBECONFIG.into(),
                    kubeconfig_of_files(&cluster.control_plane, &leaf.common_name, &server),
                );
                data.insert(KUBE_PROXY_CERT.into(), issued.cert);
                data.insert(KUBE_PROXY_KEY.into(), issued.key);
            }
            _ => {
                data.insert(SERVING_CERT.into(), issued.cert);
                data.insert(SERVING_KEY.into(), issued.key);
            }
        }
    }
    let annotations = not_after
        .map(|t| BTreeMap::from([(pki::NOT_AFTER_ANNOTATION.to_string(), t.to_string())]))
        .unwrap_or_default();
    Ok(pki::secret(
        names.bootstrap_secret(),
        &names.namespace,
        names.labels("bootstrap"),
        owner,
        "Opaque",
        (data, annotations),
    ))
}

/// A kubeconfig naming the files beside it: client-go reads a client certificate given as files
/// again when they change, and resolves relative paths from the kubeconfig's folder.
fn kubeconfig_of_files(cluster: &str, user: &str, server: &str) -> String {
    let context = format!("{user}@{cluster}");
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": cluster, "cluster": { "server": server, "certificate-authority": TENANT_CA } }],
        "users": [{ "name": user, "user": { "client-certificate": KUBE_PROXY_CERT, "client-key": KUBE_PROXY_KEY } }],
        "contexts": [{ "name": context, "context": { "cluster": cluster, "user": user } }],
        "current-context": context,
    });
    serde_saphyr::to_string(&config).unwrap_or_else(|_| config.to_string())
}

/// Whether the bootstrap Secret must be issued again: a third of its lifetime or less left, or
/// issued by another CA than the cluster's (a CA made anew). Pure.
pub fn needs_renewal(secret: &Secret, ca_cert: &str, now: jiff::Timestamp, lifetime: Duration) -> bool {
    let same_ca = secret
        .data
        .as_ref()
        .and_then(|d| d.get(TENANT_CA))
        .is_some_and(|pem| pem.0 == ca_cert.as_bytes());
    !same_ca || due_in(secret, now, lifetime).is_some_and(|d| d.is_zero())
}

/// How long until the bootstrap Secret is due again (zero when it is due); `None` when it says
/// nothing of when it expires. Pure.
pub fn due_in(secret: &Secret, now: jiff::Timestamp, lifetime: Duration) -> Option<Duration> {
    let not_after: jiff::Timestamp = secret
        .metadata
        .annotations
        .as_ref()?
        .get(pki::NOT_AFTER_ANNOTATION)?
        .parse()
        .ok()?;
    let margin = jiff::SignedDuration::try_from(lifetime / 3).ok()?;
    Some(Duration::try_from(not_after - margin - now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_joins_as_its_node_and_its_kube_proxy_as_the_proxier() {
        let names = Names {
            machine: "pool-a-1".into(),
            namespace: "tenants".into(),
            cluster: "team-a".into(),
        };
        let [(_, node), (_, proxy), (_, serving)] = leaves(&names);
        assert_eq!(node.common_name, "system:node:pool-a-1");
        assert_eq!(node.organizations, vec!["system:nodes".to_string()]);
        assert_eq!(proxy.common_name, "system:kube-proxy");
        assert_eq!(serving.dns_names, vec!["pool-a-1".to_string()]);
        let now = jiff::Timestamp::now();
        let ca = Ca::new("team-a-ca", now).unwrap();
        let owner = OwnerReference::default();
        let secret = secret(&names, &ca, &owner, now, Duration::from_secs(3600)).unwrap();
        let data = secret.data.unwrap();
        for key in [
            TENANT_CA,
            NODE_KUBECONFIG,
            KUBE_PROXY_KUBECONFIG,
            SERVING_CERT,
            SERVING_KEY,
        ] {
            assert!(data.contains_key(key), "{key}");
        }
        let kubeconfig = String::from_utf8(data[NODE_KUBECONFIG].0.clone()).unwrap();
        assert!(kubeconfig.contains("https://team-a.tenants.svc:6443"), "{kubeconfig}");
        // kube-proxy's names the files beside it, which client-go reads again when they change.
        let proxy: serde_json::Value =
            serde_saphyr::from_str(std::str::from_utf8(&data[KUBE_PROXY_KUBECONFIG].0).unwrap()).unwrap();
        let user = &proxy["users"][0]["user"];
        assert_eq!(user["client-certificate"], KUBE_PROXY_CERT);
        assert_eq!(user["client-key"], KUBE_PROXY_KEY);
        assert_eq!(proxy["clusters"][0]["cluster"]["certificate-authority"], TENANT_CA);
        for key in [KUBE_PROXY_CERT, KUBE_PROXY_KEY] {
            assert!(data.contains_key(key), "{key}");
        }
    }

    #[test]
    fn the_bootstrap_secret_is_renewed_with_a_third_left_or_when_its_ca_changes() {
        let names = Names {
            machine: "pool-a-1".into(),
            namespace: "tenants".into(),
            cluster: "team-a".into(),
        };
        let issued_at = jiff::Timestamp::now();
        let ca = Ca::new("team-a-ca", issued_at).unwrap();
        let lifetime = Duration::from_secs(300);
        let secret = secret(&names, &ca, &OwnerReference::default(), issued_at, lifetime).unwrap();
        let at = |s: i64| issued_at + jiff::SignedDuration::from_secs(s);
        assert!(!needs_renewal(&secret, &ca.cert, at(0), lifetime));
        assert_eq!(due_in(&secret, at(0), lifetime), Some(Duration::from_secs(200)));
        assert!(!needs_renewal(&secret, &ca.cert, at(199), lifetime));
        assert!(needs_renewal(&secret, &ca.cert, at(200), lifetime));
        assert_eq!(due_in(&secret, at(250), lifetime), Some(Duration::ZERO));
        let other = Ca::new("team-a-ca", issued_at).unwrap();
        assert!(needs_renewal(&secret, &other.cert, at(0), lifetime), "a new CA");
    }
}
