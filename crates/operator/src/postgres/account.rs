//! What the instances may ask of the API server, and the primary's lease itself. Pure.
//!
//! The instances' pods run as a service account `<name>-instance` whose Role allows reading,
//! watching and renewing the database's lease, `<name>-primary`, and nothing else. The lease exists only
//! while the database has replicas (`lease.rs`).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};

use super::lease::LEASE;
use super::names::Names;

fn meta(names: &Names, owner: &OwnerReference, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(names.namespace.clone()),
        labels: Some(names.labels()),
        owner_references: Some(vec![owner.clone()]),
        ..Default::default()
    }
}

/// The instances' service account.
pub fn service_account(names: &Names, owner: &OwnerReference) -> ServiceAccount {
    ServiceAccount {
        metadata: meta(names, owner, names.instance_account()),
        automount_service_account_token: Some(false),
        ..Default::default()
    }
}

/// What the instances may do: read, watch and renew the lease.
pub fn role(names: &Names, owner: &OwnerReference) -> Role {
    Role {
        metadata: meta(names, owner, names.instance_account()),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["coordination.k8s.io".into()]),
            resources: Some(vec!["leases".into()]),
            resource_names: Some(vec![names.lease()]),
            verbs: vec!["get".into(), "watch".into(), "update".into()],
            ..Default::default()
        }]),
    }
}

pub fn role_binding(names: &Names, owner: &OwnerReference) -> RoleBinding {
    RoleBinding {
        metadata: meta(names, owner, names.instance_account()),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: names.instance_account(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: names.instance_account(),
            namespace: Some(names.namespace.clone()),
            ..Default::default()
        }]),
    }
}

/// A new lease held by `holder`, as renewed now.
pub fn lease(names: &Names, owner: &OwnerReference, holder: &str, now: jiff::Timestamp) -> Lease {
    Lease {
        metadata: meta(names, owner, names.lease()),
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(LEASE.as_secs() as i32),
            acquire_time: Some(MicroTime(now)),
            // Not renewed until its holder runs: a primary not started yet is not lost.
            renew_time: None,
            lease_transitions: Some(0),
            ..Default::default()
        }),
    }
}

/// `lease` handed to `holder` now (its resourceVersion kept: the precondition of the write).
/// (`switchover::hand_over_to` also ends what a switchover noted on it.)
pub fn hand_over(lease: &Lease, holder: &str, now: jiff::Timestamp) -> Lease {
    let mut next = lease.clone();
    let spec = next.spec.get_or_insert_with(Default::default);
    spec.holder_identity = Some(holder.into());
    spec.acquire_time = Some(MicroTime(now));
    spec.renew_time = Some(MicroTime(now));
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    next.metadata.managed_fields = None;
    next
}

/// Whether `lease` was renewed since it was made (by its holder, or handed over).
pub fn taken(lease: &Lease) -> bool {
    lease.spec.as_ref().is_some_and(|s| s.renew_time.is_some())
}

/// The holder of `lease`, if anyone holds it.
pub fn holder(lease: &Lease) -> Option<String> {
    lease.spec.as_ref()?.holder_identity.clone().filter(|h| !h.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::fixtures::{owner, postgres};

    #[test]
    fn the_instances_may_read_and_renew_their_lease_and_nothing_else() {
        let names = Names::of(&postgres("shop"));
        let role = role(&names, &owner());
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].resource_names, Some(vec!["shop-primary".to_string()]));
        assert_eq!(rules[0].verbs, vec!["get", "watch", "update"]);
        let binding = role_binding(&names, &owner());
        assert_eq!(binding.subjects.unwrap()[0].name, "shop-instance");
    }

    #[test]
    fn a_lease_handed_over_keeps_its_version_and_counts_the_transition() {
        let names = Names::of(&postgres("shop"));
        let now = jiff::Timestamp::now();
        let mut first = lease(&names, &owner(), "shop-0", now);
        first.metadata.resource_version = Some("41".into());
        assert_eq!(holder(&first).as_deref(), Some("shop-0"));
        let next = hand_over(&first, "shop-2", now);
        assert_eq!(holder(&next).as_deref(), Some("shop-2"));
        assert_eq!(next.metadata.resource_version.as_deref(), Some("41"));
        assert_eq!(next.spec.unwrap().lease_transitions, Some(1));
    }
}
