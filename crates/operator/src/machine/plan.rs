//! What a Machine may be and where it is: whether its VM may be made (its control plane and
//! the version skew), and its phase from what the provider and the tenant say. Pure.

use k8s_openapi::api::core::v1::Node;
use noops_api::KubernetesControlPlane;
use noops_api::machine::{Machine, MachinePhase, MachineReason};

use super::provider::VmState;
use crate::control_plane::versions::{Release, minor};
use crate::core::nodes;

/// Whether the machine's VM may be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Yes, at this release.
    Allowed(Release),
    /// Not yet: its control plane has not served (reason, message).
    Waiting(MachineReason, String),
    /// Not as the spec stands (reason, message): a condition and an Event say why.
    Refused(MachineReason, String),
}

/// Whether `machine` may join `cluster` (the KubernetesControlPlane it names) now. A kubelet is
/// never newer than its API server, nor more than one minor older. Pure.
pub fn admit(machine: &Machine, cluster: Option<&KubernetesControlPlane>) -> Admission {
    let name = &machine.spec.cluster_name;
    let Some(cluster) = cluster else {
        return Admission::Refused(
            MachineReason::ClusterNotFound,
            format!("no KubernetesControlPlane {name:?} in this namespace: create it, or fix clusterName"),
        );
    };
    let Some(release) = Release::of(&machine.spec.template.version) else {
        return Admission::Refused(
            MachineReason::InvalidVersion,
            format!(
                "version {:?} is not a Kubernetes version",
                machine.spec.template.version
            ),
        );
    };
    let Some(serving) = cluster.status.as_ref().and_then(|s| s.version.clone()) else {
        return Admission::Waiting(
            MachineReason::ControlPlaneNotReady,
            format!("waiting for control plane {name} to serve"),
        );
    };
    if cluster
        .status
        .as_ref()
        .and_then(|s| s.admin_kubeconfig_secret.as_ref())
        .is_none()
    {
        return Admission::Waiting(
            MachineReason::ControlPlaneNotReady,
            format!("waiting for control plane {name} to give its admin kubeconfig"),
        );
    }
    let (Some(wanted), Some(running)) = (minor(&release.kubernetes), minor(&serving)) else {
        return Admission::Refused(
            MachineReason::InvalidVersion,
            format!("cannot compare {} with {serving}", release.kubernetes),
        );
    };
    if wanted > running {
        return Admission::Refused(
            MachineReason::VersionTooNew,
            format!(
                "version {} is newer than control plane {name}'s {serving}: a kubelet is never newer than its API server (upgrade the control plane first)",
                release.kubernetes
            ),
        );
    }
    if wanted + 1 < running {
        return Admission::Refused(
            MachineReason::VersionTooOld,
            format!(
                "version {} is more than one minor older than control plane {name}'s {serving}",
                release.kubernetes
            ),
        );
    }
    Admission::Allowed(release)
}

/// What the tenant says of the machine's Node.
#[derive(Debug, Clone)]
pub enum NodeView {
    /// Not asked: the control plane does not serve (or is not known).
    NotAsked,
    /// The tenant did not answer.
    Unreachable(String),
    Missing,
    Present(Box<Node>),
}

impl NodeView {
    pub fn node(&self) -> Option<&Node> {
        match self {
            NodeView::Present(n) => Some(n),
            _ => None,
        }
    }

    /// Whether the Node is there and Ready.
    pub fn ready(&self) -> bool {
        self.node().is_some_and(nodes::ready)
    }
}

/// The machine's phase (not being deleted). `joined`: its Node joined at some point.
pub fn phase(
    admission: &Admission,
    provider_id_set: bool,
    joined: bool,
    vm: &VmState,
    node: &NodeView,
) -> MachinePhase {
    match vm {
        VmState::Failed { .. } => MachinePhase::Failed,
        // Made once: a VM that is gone afterwards took the machine's disk and pods with it.
        VmState::Missing | VmState::Deleting if provider_id_set => MachinePhase::Failed,
        VmState::Missing | VmState::Deleting => match admission {
            Admission::Allowed(_) => MachinePhase::Provisioning,
            _ => MachinePhase::Pending,
        },
        VmState::Starting { .. } => MachinePhase::Provisioning,
        VmState::Running { .. } => match node {
            NodeView::Present(_) => MachinePhase::Running,
            // The tenant did not answer: a machine that joined stays Running (its health says
            // more); one that has not joined is still Provisioned.
            NodeView::NotAsked | NodeView::Unreachable(_) if joined => MachinePhase::Running,
            _ => MachinePhase::Provisioned,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::fixtures::{control_plane, machine};

    #[test]
    fn a_kubelet_is_never_newer_than_its_api_server_nor_two_minors_older() {
        let serving_134 = control_plane("team-a", Some("1.34.4"));
        assert!(
            matches!(admit(&machine("m", "team-a", "1.34"), Some(&serving_134)), Admission::Allowed(r) if r.kubernetes == "1.34.4")
        );
        assert!(matches!(
            admit(&machine("m", "team-a", "1.33"), Some(&serving_134)),
            Admission::Allowed(_)
        ));
        let serving_133 = control_plane("team-a", Some("1.33.13"));
        let Admission::Refused(reason, message) = admit(&machine("m", "team-a", "1.34"), Some(&serving_133)) else {
            panic!("a newer kubelet was allowed");
        };
        assert_eq!(reason, MachineReason::VersionTooNew);
        assert!(message.contains("upgrade the control plane first"), "{message}");
        let serving_135 = control_plane("team-a", Some("1.35.0"));
        assert!(matches!(
            admit(&machine("m", "team-a", "1.33"), Some(&serving_135)),
            Admission::Refused(MachineReason::VersionTooOld, _)
        ));
        assert!(matches!(
            admit(&machine("m", "team-a", "1.34"), None),
            Admission::Refused(MachineReason::ClusterNotFound, _)
        ));
        let not_served = control_plane("team-a", None);
        assert!(matches!(
            admit(&machine("m", "team-a", "1.34"), Some(&not_served)),
            Admission::Waiting(MachineReason::ControlPlaneNotReady, _)
        ));
    }

    #[test]
    fn the_phase_follows_the_vm_then_the_node() {
        let allowed = Admission::Allowed(Release::of("1.34").unwrap());
        let refused = Admission::Refused(MachineReason::VersionTooNew, String::new());
        let running = VmState::Running { address: None };
        let node = NodeView::Present(Box::default());
        assert_eq!(
            phase(&refused, false, false, &VmState::Missing, &NodeView::NotAsked),
            MachinePhase::Pending
        );
        assert_eq!(
            phase(&allowed, false, false, &VmState::Missing, &NodeView::Missing),
            MachinePhase::Provisioning
        );
        assert_eq!(
            phase(
                &allowed,
                true,
                false,
                &VmState::Starting { problem: None },
                &NodeView::Missing
            ),
            MachinePhase::Provisioning
        );
        assert_eq!(
            phase(&allowed, true, false, &running, &NodeView::Missing),
            MachinePhase::Provisioned
        );
        assert_eq!(phase(&allowed, true, true, &running, &node), MachinePhase::Running);
        assert_eq!(
            phase(&allowed, true, true, &running, &NodeView::Unreachable("timeout".into())),
            MachinePhase::Running,
            "a tenant that does not answer says nothing of the machine"
        );
        assert_eq!(
            phase(&allowed, true, true, &VmState::Missing, &node),
            MachinePhase::Failed,
            "a VM gone after it was made"
        );
    }
}
