//! Environment variables a container reads from the downward API.

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector};

/// `POD_IP`: the pod's address, which programs are told to advertise (`$(POD_IP)` in args).
pub fn pod_ip_env() -> EnvVar {
    EnvVar {
        name: "POD_IP".into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "status.podIP".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
