//! The container runtime's default seccomp profile, set at the pod level on the pods the
//! operator makes for an operand: one of the things Pod Security "restricted" asks (the others,
//! a non-root user and no privilege escalation, depend on what each operand's image allows).
//! A VM's pod is privileged and does without. Pure.

use k8s_openapi::api::core::v1::SeccompProfile;

/// The runtime's default seccomp profile, for a pod's `securityContext.seccompProfile`.
pub fn runtime_default_seccomp() -> Option<SeccompProfile> {
    Some(SeccompProfile {
        type_: "RuntimeDefault".into(),
        localhost_profile: None,
    })
}
