//! Short-lived pods that do one job for a controller (save a snapshot, take a base backup,
//! delete a backup) and report how it went in their termination message: their names, and how
//! one stands. Pure.

use k8s_openapi::api::core::v1::Pod;

use super::stuck::stuck;

/// The name of the pod that does `job` for `owner` (uid `uid`): `<owner>-<job>`, shortened
/// with the uid's start when that is too long for a pod.
pub fn name(owner: &str, uid: &str, job: &str) -> String {
    if owner.len() + job.len() < 253 {
        return format!("{owner}-{job}");
    }
    let uid: String = uid.chars().take(8).collect();
    let head: String = owner.chars().take(253 - job.len() - uid.len() - 2).collect();
    format!("{}-{uid}-{job}", head.trim_end_matches(['-', '.']))
}

/// How a task pod stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    NotStarted,
    Running,
    /// It cannot start (the claim or a Secret missing, no node for it): why.
    Stuck(String),
    /// It did its work; its termination message.
    Succeeded(String),
    /// It failed: why, as it said.
    Failed(String),
}

/// How `pod` (if any) stands.
pub fn outcome(pod: Option<&Pod>) -> Outcome {
    let Some(pod) = pod else { return Outcome::NotStarted };
    let status = pod.status.clone().unwrap_or_default();
    let terminated = status
        .container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref().and_then(|s| s.terminated.clone()));
    let message = terminated.as_ref().and_then(|t| t.message.clone()).unwrap_or_default();
    match status.phase.as_deref() {
        Some("Succeeded") => Outcome::Succeeded(message.trim().to_string()),
        Some("Failed") => {
            let name = pod.metadata.name.clone().unwrap_or_default();
            Outcome::Failed(match terminated {
                Some(t) if !message.trim().is_empty() => {
                    format!("pod {name} exited with code {}: {}", t.exit_code, message.trim())
                }
                Some(t) => format!(
                    "pod {name} exited with code {}: `kubectl logs {name}` says why",
                    t.exit_code
                ),
                // Evicted, or its node lost: the pod says why, not a container.
                None => format!(
                    "pod {name} failed: {} {}",
                    status.reason.as_deref().unwrap_or("Failed"),
                    status.message.as_deref().unwrap_or_default()
                )
                .trim()
                .to_string(),
            })
        }
        _ => match stuck([pod]) {
            Some(s) => Outcome::Stuck(format!("{}: {}", s.reason, s.message)),
            None => Outcome::Running,
        },
    }
}
