//! What a VM joins the tenant with, in the Secret `<machine>-bootstrap`: the tenant's CA, a
//! kubeconfig for the node agent (a client certificate for `system:node:<name>` in
//! `system:nodes`, as the Node authorizer wants a kubelet's), one for kube-proxy
//! (`system:kube-proxy`, which the tenant's default RBAC binds to `system:node-proxier`), and
//! the serving certificate of the agent's kubelet API. All issued by the tenant's CA.

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
                    kubeconfig(&cluster, &leaf.common_name, &issued, ca, &server),
                );
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
    }
}
