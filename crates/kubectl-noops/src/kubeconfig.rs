//! `kubectl noops kubeconfig kc/<name>` (or `kcp/<name>`): the tenant's admin kubeconfig, read
//! from the Secret the resource's status names (key `kubeconfig`), to standard output or into
//! a file only its owner may read.
//!
//! The operator writes an admin kubeconfig for the ClusterIP of the API servers' Service
//! (`kubeconfig`: it works from pods, and from the machine the local Kubernetes runs on, which
//! routes to ClusterIPs), and, when the control plane has `service.externalEndpoint`, one for
//! that endpoint (`external-kubeconfig`), for clients outside the cluster. The external one is
//! given when there is one, unless `--internal` asks for the Service's.

use std::io::Write as _;
use std::path::Path;

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;
use kube::config::Kubeconfig;
use noops_api::{KubernetesCluster, KubernetesControlPlane};

use crate::resources::Kind;

/// The key of the admin kubeconfig in its Secret.
pub const KUBECONFIG_KEY: &str = "kubeconfig";
/// The key of the admin kubeconfig for the external endpoint, when there is one.
pub const EXTERNAL_KUBECONFIG_KEY: &str = "external-kubeconfig";

/// The admin kubeconfig of `kind` `name`, as text: the external endpoint's if there is one
/// and `internal` is false.
pub async fn read(client: &Client, namespace: &str, kind: Kind, name: &str, internal: bool) -> anyhow::Result<String> {
    let named = match kind {
        Kind::KubernetesCluster => Api::<KubernetesCluster>::namespaced(client.clone(), namespace)
            .get(name)
            .await
            .with_context(|| format!("reading KubernetesCluster {namespace}/{name}"))?
            .status
            .and_then(|s| s.kubeconfig_secret),
        Kind::KubernetesControlPlane => Api::<KubernetesControlPlane>::namespaced(client.clone(), namespace)
            .get(name)
            .await
            .with_context(|| format!("reading KubernetesControlPlane {namespace}/{name}"))?
            .status
            .and_then(|s| s.admin_kubeconfig_secret),
        other => bail!(
            "only a KubernetesCluster (kc/<name>) or a KubernetesControlPlane (kcp/<name>) has a kubeconfig, not a {other}"
        ),
    };
    let Some(secret) = named else {
        bail!(
            "{kind} {namespace}/{name} names no kubeconfig Secret yet: its control plane has not served (kubectl noops status {}/{name})",
            kind.short_name()
        );
    };
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get(&secret)
        .await
        .with_context(|| format!("reading Secret {namespace}/{secret} (kubectl noops kubeconfig needs get on it)"))?;
    text_of(&secret, internal)
}

/// The kubeconfig in `secret`: the external one if it holds one and `internal` is false.
fn text_of(secret: &Secret, internal: bool) -> anyhow::Result<String> {
    let name = secret.metadata.name.as_deref().unwrap_or_default();
    let data = secret.data.as_ref();
    let external = data.and_then(|d| d.get(EXTERNAL_KUBECONFIG_KEY)).filter(|_| !internal);
    let (key, bytes) = match external {
        Some(bytes) => (EXTERNAL_KUBECONFIG_KEY, bytes),
        None => match data.and_then(|d| d.get(KUBECONFIG_KEY)) {
            Some(bytes) => (KUBECONFIG_KEY, bytes),
            None => bail!("Secret {name} has no key {KUBECONFIG_KEY} yet"),
        },
    };
    String::from_utf8(bytes.0.clone()).with_context(|| format!("the {key} of Secret {name} is not text"))
}

/// The server the current context of `text` talks to: said when it is written to a file.
pub fn server_of(text: &str) -> Option<String> {
    let config = Kubeconfig::from_yaml(text).ok()?;
    let context = config.current_context.as_deref()?;
    let cluster = &config
        .contexts
        .iter()
        .find(|c| c.name == context)?
        .context
        .as_ref()?
        .cluster;
    config
        .clusters
        .iter()
        .find(|c| &c.name == cluster)?
        .cluster
        .as_ref()?
        .server
        .clone()
}

/// Writes `text` to `path`, readable and writable by its owner only (it holds a client key).
pub fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    // A file that was there keeps its mode through open: narrowed before the key goes in.
    #[cfg(unix)]
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .with_context(|| format!("making {} private", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    const KUBECONFIG: &str = "apiVersion: v1
kind: Config
current-context: admin@acme
clusters:
- name: acme
  cluster: { server: https://10.96.0.9:6443, certificate-authority-data: Zm9v }
contexts:
- name: admin@acme
  context: { cluster: acme, user: admin }
users:
- name: admin
  user: { client-certificate-data: Zm9v, client-key-data: YmFy }
";

    #[test]
    fn the_kubeconfig_is_the_secrets_key_and_names_its_server() {
        let mut secret = Secret::default();
        secret.metadata.name = Some("acme-admin-kubeconfig".into());
        assert!(
            text_of(&secret, false)
                .unwrap_err()
                .to_string()
                .contains("no key kubeconfig")
        );
        secret.data = Some([(KUBECONFIG_KEY.to_string(), ByteString(KUBECONFIG.into()))].into());
        let text = text_of(&secret, false).unwrap();
        assert_eq!(text, KUBECONFIG);
        assert_eq!(server_of(&text).as_deref(), Some("https://10.96.0.9:6443"));
        assert_eq!(server_of("not: [a kubeconfig"), None);
        // An external endpoint's kubeconfig is given first, the Service's when asked for.
        let external = KUBECONFIG.replace("https://10.96.0.9:6443", "https://127.0.0.1:31443");
        if let Some(data) = secret.data.as_mut() {
            data.insert(EXTERNAL_KUBECONFIG_KEY.into(), ByteString(external.clone().into()));
        }
        assert_eq!(text_of(&secret, false).unwrap(), external);
        assert_eq!(text_of(&secret, true).unwrap(), KUBECONFIG);
    }

    #[cfg(unix)]
    #[test]
    fn the_file_is_its_owners_only_even_if_it_was_there() {
        use std::os::unix::fs::PermissionsExt as _;
        let path = std::env::temp_dir().join(format!("noops-kubeconfig-test-{}", std::process::id()));
        std::fs::write(&path, "an older and longer text than the new one").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write(&path, KUBECONFIG).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), KUBECONFIG);
        let _ = std::fs::remove_file(&path);
    }
}
