//! MaintPage: an app behind a Service, and a maintenance page the Service can be switched to.
//!
//! ```yaml
//! apiVersion: noops.dev/v1alpha1
//! kind: MaintPage
//! metadata: { name: shop }
//! spec:
//!   app: { name: shop, image: hashicorp/http-echo:1.0, args: ["-text=the shop"], port: 5678 }
//!   maintenance: { image: hashicorp/http-echo:1.0, args: ["-text=back soon"], port: 5678, enabled: false }
//! ```
//!
//! The operator runs the app as a Deployment, the maintenance page as a second Deployment, and
//! a Service that selects one of them. Setting `maintenance.enabled` moves the Service to the
//! maintenance pods once they are Ready, and back to the app once it is Ready.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

/// The desired state of a MaintPage.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "noops.dev",
    version = "v1alpha1",
    kind = "MaintPage",
    plural = "maintpages",
    shortname = "mp",
    category = "noops",
    namespaced,
    status = "MaintPageStatus",
    validation = Rule::new("self.metadata.name.size() <= 63").message("a MaintPage name is at most 63 characters: it labels the objects it owns"),
    printcolumn = r#"{"name":"App","type":"string","jsonPath":".spec.app.name"}"#,
    printcolumn = r#"{"name":"Maintenance","type":"boolean","jsonPath":".spec.maintenance.enabled"}"#,
    printcolumn = r#"{"name":"Published","type":"string","jsonPath":".status.published"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MaintPageSpec {
    /// The application: a Deployment and the Service in front of it.
    pub app: AppSpec,
    /// The maintenance page, published instead of the app while `enabled` is true.
    pub maintenance: MaintenanceSpec,
    /// The Service that clients use.
    #[serde(default)]
    pub service: ServiceSpec,
    /// Stop changing the app's objects (no switch, no hand edit reverted) until set back to
    /// false: the Service stays on the side it serves.
    #[serde(default)]
    pub paused: bool,
}

/// The application.
#[skip_serializing_none]
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AppSpec {
    /// Name of the app's Deployment and of the Service; a DNS label, at most 51 characters (the
    /// maintenance Deployment is named `<name>-maintenance`). Immutable.
    #[schemars(length(max = 51))]
    #[x_kube(
        validation = Rule::new("self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("app.name must be a DNS label: lower-case letters, digits and '-', starting with a letter and not ending with '-'"),
        validation = Rule::new("self == oldSelf").message("app.name is immutable: create a new MaintPage to rename the app")
    )]
    pub name: String,
    /// Container image of the app, e.g. `hashicorp/http-echo:1.0`.
    #[schemars(length(max = 512))]
    #[x_kube(validation = Rule::new("self.matches('^[^\\\\s]+$')").message("app.image must be a container image reference such as hashicorp/http-echo:1.0 (not empty, no spaces)"))]
    pub image: String,
    /// Arguments for the app's container (its image's default command gets them).
    #[schemars(length(max = 32), inner(length(max = 1024)))]
    pub args: Option<Vec<String>>,
    /// The port the app's container listens on.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// How many app pods to run.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 100))]
    pub replicas: i32,
}

/// The maintenance page.
#[skip_serializing_none]
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceSpec {
    /// Container image of the maintenance page.
    #[schemars(length(max = 512))]
    #[x_kube(validation = Rule::new("self.matches('^[^\\\\s]+$')").message("maintenance.image must be a container image reference such as hashicorp/http-echo:1.0 (not empty, no spaces)"))]
    pub image: String,
    /// Arguments for the maintenance page's container.
    #[schemars(length(max = 32), inner(length(max = 1024)))]
    pub args: Option<Vec<String>>,
    /// The port the maintenance page's container listens on.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// How many maintenance pods to run while the page is (or is about to be) published.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 10))]
    pub replicas: i32,
    /// Publish the maintenance page instead of the app.
    #[serde(default)]
    pub enabled: bool,
}

/// The Service in front of the app.
#[skip_serializing_none]
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.nodePort) || self.type == 'NodePort'").message("service.nodePort is only allowed with service.type NodePort"))]
pub struct ServiceSpec {
    /// The port clients connect to.
    #[serde(default = "default_service_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// `ClusterIP` (default) or `NodePort`.
    #[serde(default, rename = "type")]
    pub type_: ServiceType,
    /// With `type: NodePort`, a fixed node port (30000-32767); chosen by Kubernetes if unset.
    #[schemars(range(min = 30000, max = 32767))]
    pub node_port: Option<i32>,
}

impl Default for ServiceSpec {
    fn default() -> Self {
        Self {
            port: default_service_port(),
            type_: ServiceType::ClusterIP,
            node_port: None,
        }
    }
}

/// How the Service is exposed.
#[derive(JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ServiceType {
    #[default]
    ClusterIP,
    NodePort,
}

/// Which side the Service sends traffic to.
#[derive(JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    App,
    Maintenance,
}

impl Side {
    /// The value of the `app.kubernetes.io/component` label of this side's pods.
    pub fn component(self) -> &'static str {
        match self {
            Side::App => "app",
            Side::Maintenance => "maintenance",
        }
    }
}

/// The observed state of a MaintPage.
#[skip_serializing_none]
#[derive(JsonSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MaintPageStatus {
    /// The generation of the spec this status describes.
    pub observed_generation: Option<i64>,
    /// Ready, Progressing and Degraded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "MaintPageReason::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The side the Service sends traffic to.
    pub published: Option<Side>,
    /// When the Service last switched sides.
    pub switched_at: Option<Time>,
    /// The side the Service waits to move to, until that side's pods are Ready.
    pub waiting_for: Option<Side>,
    /// Ready app pods.
    #[serde(default)]
    pub app_ready_replicas: i32,
    /// Ready maintenance pods.
    #[serde(default)]
    pub maintenance_ready_replicas: i32,
    /// The Service clients use.
    pub service_name: Option<String>,
}

fn default_port() -> i32 {
    8080
}

fn default_replicas() -> i32 {
    1
}

fn default_service_port() -> i32 {
    80
}

impl MaintPageSpec {
    /// The side the spec asks to publish.
    pub fn desired_side(&self) -> Side {
        if self.maintenance.enabled {
            Side::Maintenance
        } else {
            Side::App
        }
    }

    /// The name of the maintenance Deployment.
    pub fn maintenance_name(&self) -> String {
        format!("{}-maintenance", self.app.name)
    }
}

crate::reason::reasons! {
    /// Why a MaintPage's condition is as it is (`status.conditions[].reason`; the CRD schema
    /// lists them).
    MaintPageReason {
        Switching,
        ScaledToZero,
        RollingOut,
        Stable,
        RolloutStalled,
        AsExpected,
        AppPublished,
        MaintenancePublished,
        AppNotReady,
        MaintenanceNotReady,
        SwitchingToApp,
        SwitchingToMaintenance,
        NameConflict,
        InvalidSpec,
        /// Pods that cannot start, for a reason of their own not listed here (the message
        /// says it); the listed ones are said as the pods say them.
        PodsCannotStart,
        ErrImagePull,
        ImagePullBackOff,
        InvalidImageName,
        ImageNotMapped,
        CrashLoopBackOff,
        CreateContainerConfigError,
        CreateContainerError,
        RunContainerError,
        Unschedulable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn defaults_fill_in_a_short_manifest() {
        let mp: MaintPage = serde_json::from_value(serde_json::json!({
            "apiVersion": "noops.dev/v1alpha1",
            "kind": "MaintPage",
            "metadata": { "name": "shop" },
            "spec": {
                "app": { "name": "shop", "image": "hashicorp/http-echo" },
                "maintenance": { "image": "hashicorp/http-echo" },
            },
        }))
        .unwrap();
        assert_eq!(mp.spec.app.port, 8080);
        assert_eq!(mp.spec.app.replicas, 1);
        assert!(!mp.spec.maintenance.enabled);
        assert_eq!(mp.spec.service.port, 80);
        assert_eq!(mp.spec.desired_side(), Side::App);
        assert_eq!(mp.spec.maintenance_name(), "shop-maintenance");
    }

    #[test]
    fn crd_carries_validation_and_printer_columns() {
        let crd = serde_json::to_string(&MaintPage::crd()).unwrap();
        for needle in [
            "app.name must be a DNS label",
            "app.name is immutable",
            "\"maximum\":65535",
            "\"maxLength\":51",
            "\"name\":\"Published\"",
            "\"shortNames\":[\"mp\"]",
        ] {
            assert!(crd.contains(needle), "CRD lacks {needle}");
        }
    }

    #[test]
    fn side_serializes_lower_case() {
        assert_eq!(serde_json::to_value(Side::Maintenance).unwrap(), "maintenance");
        assert_eq!(Side::App.component(), "app");
    }
}
