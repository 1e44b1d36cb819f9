//! The names of everything a KubernetesControlPlane owns, and its labels. One place, so that
//! the builders, the certificates and the status agree.

use std::collections::BTreeMap;

use noops_api::KubernetesControlPlane;

use crate::core::labels;

/// The label naming the control plane an object belongs to.
pub const CONTROL_PLANE_LABEL: &str = "noops.dev/kubernetescontrolplane";
/// The API server's port, in its pods and on the Service.
pub const API_SERVER_PORT: i32 = 6443;

/// The processes of a control plane, each a Deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Component {
    ApiServer,
    ControllerManager,
    Scheduler,
}

impl Component {
    pub const ALL: [Component; 3] = [Component::ApiServer, Component::ControllerManager, Component::Scheduler];

    /// The program, which is also the image's name (`registry.k8s.io/<program>`).
    pub fn program(self) -> &'static str {
        match self {
            Component::ApiServer => "kube-apiserver",
            Component::ControllerManager => "kube-controller-manager",
            Component::Scheduler => "kube-scheduler",
        }
    }

    /// Its part in names and the component label.
    pub fn part(self) -> &'static str {
        match self {
            Component::ApiServer => "apiserver",
            Component::ControllerManager => "controller-manager",
            Component::Scheduler => "scheduler",
        }
    }
}

/// Names derived from one control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub control_plane: String,
    pub namespace: String,
}

impl Names {
    pub fn of(kcp: &KubernetesControlPlane) -> Self {
        Self {
            control_plane: kcp.metadata.name.clone().unwrap_or_default(),
            namespace: kcp.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
        }
    }

    fn with(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.control_plane)
    }

    /// The tenant's EtcdCluster.
    pub fn etcd(&self) -> String {
        self.with("etcd")
    }

    /// The Secret with the client certificate of the tenant's etcd (the EtcdCluster's own).
    pub fn etcd_client_secret(&self) -> String {
        format!("{}-client", self.etcd())
    }

    /// Where the API servers reach etcd.
    pub fn etcd_url(&self) -> String {
        format!("https://{}-client.{}.svc:2379", self.etcd(), self.namespace)
    }

    /// The Service in front of the API servers: the control plane's own name.
    pub fn service(&self) -> String {
        self.control_plane.clone()
    }

    /// The DNS names of the Service.
    pub fn service_dns_names(&self) -> Vec<String> {
        let (service, ns) = (self.service(), &self.namespace);
        vec![
            service.clone(),
            format!("{service}.{ns}"),
            format!("{service}.{ns}.svc"),
            format!("{service}.{ns}.svc.cluster.local"),
        ]
    }

    /// A component's Deployment.
    pub fn deployment(&self, component: Component) -> String {
        self.with(component.part())
    }

    /// The Secrets of the CAs: the cluster's (clients and serving), the front proxy's
    /// (aggregated APIs), and the service-account key pair.
    pub fn ca_secret(&self) -> String {
        self.with("ca")
    }
    pub fn front_proxy_ca_secret(&self) -> String {
        self.with("front-proxy-ca")
    }
    pub fn service_account_secret(&self) -> String {
        self.with("service-account")
    }

    /// The labels of a child; `component` for the parts of several.
    pub fn labels(&self, component: Option<&str>) -> BTreeMap<String, String> {
        labels::child(&self.control_plane, CONTROL_PLANE_LABEL, &self.control_plane, component)
    }

    /// The labels that select a component's pods.
    pub fn selector(&self, component: Component) -> BTreeMap<String, String> {
        BTreeMap::from([
            (CONTROL_PLANE_LABEL.to_string(), self.control_plane.clone()),
            (labels::COMPONENT.to_string(), component.part().to_string()),
        ])
    }
}
