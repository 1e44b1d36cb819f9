//! What every kind the operator reconciles shares, as the operator's core reads it: its status
//! (whose conditions give reasons of its [`Reason`] enum) and `spec.paused`, which means one
//! thing on every kind: the operator changes nothing of it until it is false.

use crate::reason::Reason;

/// A kind the operator reconciles.
pub trait Governed {
    /// Its status.
    type Status;
    /// The reasons its conditions give.
    type Reason: Reason;

    /// Its status, if it has one yet.
    fn status(&self) -> Option<&Self::Status>;

    /// Its `spec.paused`.
    fn paused(&self) -> bool;
}

/// Implements [`Governed`] for `$kind` with status `$status` and reasons `$reason`.
macro_rules! governed {
    ($($kind:ty: $status:ty, $reason:ty;)*) => {
        $(
            impl Governed for $kind {
                type Status = $status;
                type Reason = $reason;

                fn status(&self) -> Option<&$status> {
                    self.status.as_ref()
                }

                fn paused(&self) -> bool {
                    self.spec.paused
                }
            }
        )*
    };
}

governed! {
    crate::MaintPage: crate::MaintPageStatus, crate::maintpage::MaintPageReason;
    crate::EtcdCluster: crate::EtcdClusterStatus, crate::etcd::EtcdClusterReason;
    crate::PostgreSQL: crate::PostgreSQLStatus, crate::postgres::PostgreSQLReason;
    crate::KubernetesControlPlane: crate::KubernetesControlPlaneStatus, crate::control_plane::KubernetesControlPlaneReason;
    crate::KubernetesCluster: crate::KubernetesClusterStatus, crate::kubernetes_cluster::KubernetesClusterReason;
    crate::Machine: crate::MachineStatus, crate::machine::MachineReason;
    crate::MachineSet: crate::MachineSetStatus, crate::machine_set::MachineSetReason;
    crate::MachineDeployment: crate::MachineDeploymentStatus, crate::machine_deployment::MachineDeploymentReason;
    crate::EtcdBackup: crate::EtcdBackupStatus, crate::backup::BackupReason;
    crate::PostgresBackup: crate::PostgresBackupStatus, crate::backup::BackupReason;
}
