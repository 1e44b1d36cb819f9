//! What the pods the operator makes for an operand declare so that a namespace enforcing Pod
//! Security "restricted" admits them: the container runtime's default seccomp profile, set
//! at the pod level. (A VM's pod is privileged and cannot be restricted: it does without.) Pure.

use k8s_openapi::api::core::v1::SeccompProfile;

/// The runtime's default seccomp profile, for a pod's `securityContext.seccompProfile`.
pub fn runtime_default_seccomp() -> Option<SeccompProfile> {
    Some(SeccompProfile {
        type_: "RuntimeDefault".into(),
        localhost_profile: None,
    })
}
