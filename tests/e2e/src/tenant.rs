//! A tenant's cluster (a KubernetesControlPlane of the operator), as tests use it: its admin
//! kubeconfig in a file for kubectl, and a client.

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use noops_api::KubernetesControlPlane;

use crate::{TestNamespace, kubectl_with, wait_for};

/// A tenant reached through its admin kubeconfig; the file goes when this is dropped.
pub struct Tenant {
    pub kubeconfig: PathBuf,
    pub client: kube::Client,
}

impl Tenant {
    /// Waits (up to `timeout`) for control plane `name` of `ns` to be Ready, then reaches it.
    pub async fn ready(ns: &TestNamespace, name: &str, timeout: Duration) -> Self {
        let api = ns.api::<KubernetesControlPlane>();
        let secret = wait_for(&format!("control plane {name} Ready"), timeout, || async {
            let kcp = api.get_opt(name).await.ok().flatten()?;
            let status = kcp.status?;
            status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
                .then_some(status.admin_kubeconfig_secret)?
        })
        .await;
        let secret = ns.api::<Secret>().get(&secret).await.unwrap();
        let text = String::from_utf8(secret.data.unwrap().remove("kubeconfig").unwrap().0).unwrap();
        let kubeconfig = std::env::temp_dir().join(format!("noops-tenant-{}-{name}.kubeconfig", ns.name));
        std::fs::write(&kubeconfig, &text).unwrap();
        let parsed = kube::config::Kubeconfig::from_yaml(&text).unwrap();
        let config = kube::Config::from_custom_kubeconfig(parsed, &Default::default())
            .await
            .unwrap();
        Self {
            kubeconfig,
            client: kube::Client::try_from(config).unwrap(),
        }
    }

    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        kubectl_with(&self.kubeconfig, args, stdin)
    }

    /// kubectl that must succeed; its stdout.
    pub fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl(args, stdin);
        assert!(
            out.status.success(),
            "tenant kubectl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of `yaml` in the tenant.
    pub fn apply(&self, yaml: &str) {
        self.kubectl_ok(&["apply", "-f", "-"], Some(yaml));
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

/// Drops the finalizers of the Machines left in a namespace when a test ends (its operator is
/// gone by then, and nothing else would let the namespace go).
pub struct ForgetMachines(pub String);

impl Drop for ForgetMachines {
    fn drop(&mut self) {
        let listed = crate::kubectl(&["get", "machines", "-n", &self.0, "-o", "name"], None);
        for machine in String::from_utf8_lossy(&listed.stdout).lines() {
            let _ = crate::kubectl(
                &[
                    "patch",
                    "-n",
                    &self.0,
                    machine,
                    "--type",
                    "merge",
                    "-p",
                    r#"{"metadata":{"finalizers":[]}}"#,
                ],
                None,
            );
        }
    }
}

/// The Machine whose VM pod runs on this cluster's node `node`, if one does.
pub async fn machine_on(ns: &TestNamespace, node: &str) -> Option<String> {
    let vm_pods = ns
        .pods()
        .list(&kube::api::ListParams::default().labels("app.kubernetes.io/component=vm"))
        .await
        .ok()?
        .items;
    vm_pods
        .iter()
        .find(|p| crate::pod_node(p) == node)
        .and_then(|p| p.metadata.name.clone())
}

/// Waits (up to `timeout`) until `ns` holds no Machine.
pub async fn wait_machines_gone(ns: &TestNamespace, timeout: Duration) {
    let machines = ns.api::<noops_api::Machine>();
    crate::wait_until("every machine gone", timeout, || async {
        machines
            .list(&Default::default())
            .await
            .is_ok_and(|l| l.items.is_empty())
    })
    .await;
}

/// Waits (up to `timeout`) until the tenant has exactly `count` Nodes, every one's kubelet at
/// `version` (such as `v1.34.4`): a rollout's old machines are gone.
pub async fn wait_nodes_at(
    nodes: &kube::Api<k8s_openapi::api::core::v1::Node>,
    count: usize,
    version: &str,
    timeout: Duration,
) {
    crate::wait_until(&format!("{count} Nodes, every one at {version}"), timeout, || async {
        let Ok(listed) = nodes.list(&Default::default()).await else {
            return false;
        };
        listed.items.len() == count
            && listed.items.iter().all(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.node_info.as_ref())
                    .is_some_and(|i| i.kubelet_version == version)
            })
    })
    .await;
}
