//! Builders of the objects controller tests need, so that a test says what matters about them
//! (`fixtures::deployment("web").replicas(2).ready(2)`) and nothing else.

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentCondition, DeploymentSpec, DeploymentStatus, StatefulSet, StatefulSetSpec, StatefulSetStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};

/// A controller owner reference to a noops resource.
pub fn owner_reference(kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "noops.dev/v1alpha1".into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some("test".into()),
        generation: Some(1),
        ..Default::default()
    }
}

/// The setters every fixture of a workload with replicas has.
macro_rules! replicas_and_generation {
    ($fixture:ident) => {
        impl $fixture {
            pub fn replicas(mut self, n: i32) -> Self {
                if let Some(spec) = self.0.spec.as_mut() {
                    spec.replicas = Some(n);
                }
                self
            }

            pub fn generation(mut self, g: i64) -> Self {
                self.0.metadata.generation = Some(g);
                self
            }
        }
    };
}

/// A Deployment under construction.
pub struct DeploymentFixture(Deployment);

/// A Deployment of one replica, generation 1, without status.
pub fn deployment(name: &str) -> DeploymentFixture {
    DeploymentFixture(Deployment {
        metadata: meta(name),
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            ..Default::default()
        }),
        status: None,
    })
}

replicas_and_generation!(DeploymentFixture);

impl DeploymentFixture {
    /// Its controller has seen the current generation and `n` pods are updated, Ready and
    /// available.
    pub fn ready(mut self, n: i32) -> Self {
        let status = self.0.status.get_or_insert_with(Default::default);
        status.observed_generation = self.0.metadata.generation;
        status.replicas = Some(n);
        status.updated_replicas = Some(n);
        status.ready_replicas = Some(n);
        status.available_replicas = Some(n);
        self
    }

    /// Its rollout has passed its progress deadline.
    pub fn stalled(mut self, message: &str) -> Self {
        let status = self.0.status.get_or_insert_with(DeploymentStatus::default);
        status.conditions = Some(vec![DeploymentCondition {
            type_: "Progressing".into(),
            status: "False".into(),
            reason: Some("ProgressDeadlineExceeded".into()),
            message: Some(message.into()),
            ..Default::default()
        }]);
        self
    }

    pub fn owned_by(mut self, owner: &OwnerReference) -> Self {
        self.0.metadata.owner_references = Some(vec![owner.clone()]);
        self
    }

    pub fn build(self) -> Deployment {
        self.0
    }
}

/// A StatefulSet under construction.
pub struct StatefulSetFixture(StatefulSet);

/// A StatefulSet of one replica, generation 1, without status.
pub fn statefulset(name: &str) -> StatefulSetFixture {
    StatefulSetFixture(StatefulSet {
        metadata: meta(name),
        spec: Some(StatefulSetSpec {
            replicas: Some(1),
            service_name: Some(name.into()),
            ..Default::default()
        }),
        status: None,
    })
}

replicas_and_generation!(StatefulSetFixture);

impl StatefulSetFixture {
    /// Its controller has seen the current generation and `n` pods of one revision are Ready.
    pub fn ready(mut self, n: i32) -> Self {
        let status = self.0.status.get_or_insert_with(StatefulSetStatus::default);
        status.observed_generation = self.0.metadata.generation;
        status.replicas = n;
        status.updated_replicas = Some(n);
        status.ready_replicas = Some(n);
        status.available_replicas = Some(n);
        status.current_revision = Some("rev-1".into());
        status.update_revision = Some("rev-1".into());
        self
    }

    /// Pods of `current` still run while `update` is being rolled out.
    pub fn revisions(mut self, current: &str, update: &str) -> Self {
        let status = self.0.status.get_or_insert_with(StatefulSetStatus::default);
        status.current_revision = Some(current.into());
        status.update_revision = Some(update.into());
        self
    }

    pub fn build(self) -> StatefulSet {
        self.0
    }
}

/// A condition as a status holds it (its transition time of no interest to the test).
pub fn condition(type_: &str, status: bool, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: None,
        last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
    }
}
