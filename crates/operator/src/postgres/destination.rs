//! Whether the instance can be given the backup destination its spec names: the credentials
//! Secret of a bucket with both keys, or the claim of a volume. A pod whose environment names a
//! Secret that is not there, or whose volume names a claim that is not there, cannot start; for
//! a database that serves, rolling its pod onto such a spec would take it down. So the spec is
//! checked first, and the StatefulSet is left as it is while the check fails. Pure.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use noops_api::postgres::PostgreSQLReason;

use super::problem::PlanProblem;
use super::store::Destination;

/// The keys a bucket's credentials Secret must hold.
pub const CREDENTIAL_KEYS: [&str; 2] = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"];

/// What the check needs to read: the credentials Secret of a bucket, or the claim of a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needed<'a> {
    Secret(&'a str),
    Claim(&'a str),
}

/// What `destination` needs to be there before a pod is given it.
pub fn needed(destination: &Destination) -> Needed<'_> {
    match destination {
        Destination::S3(s3) => Needed::Secret(&s3.credentials_secret),
        Destination::Volume(volume) => Needed::Claim(&volume.claim_name),
    }
}

/// Why the instance cannot be given `destination`, given the Secret or claim it needs as read
/// (`None`: not there).
pub fn problem(
    destination: &Destination,
    secret: Option<&Secret>,
    claim: Option<&PersistentVolumeClaim>,
) -> Option<PlanProblem> {
    match needed(destination) {
        Needed::Secret(name) => {
            let Some(secret) = secret else {
                return Some(PlanProblem {
                    reason: PostgreSQLReason::BackupCredentialsMissing,
                    message: format!(
                        "Secret {name} (spec.backup.s3.credentialsSecret) does not exist: create it with the keys {} and {}",
                        CREDENTIAL_KEYS[0], CREDENTIAL_KEYS[1]
                    ),
                });
            };
            let data = secret.data.clone().unwrap_or_default();
            let missing: Vec<&str> = CREDENTIAL_KEYS
                .into_iter()
                .filter(|key| data.get(*key).is_none_or(|value| value.0.is_empty()))
                .collect();
            (!missing.is_empty()).then(|| PlanProblem {
                reason: PostgreSQLReason::BackupCredentialsInvalid,
                message: format!(
                    "Secret {name} (spec.backup.s3.credentialsSecret) has no {}: the instance could not archive WAL with it",
                    missing.join(" and no ")
                ),
            })
        }
        Needed::Claim(name) => match claim {
            Some(claim) if claim.metadata.deletion_timestamp.is_none() => None,
            Some(_) => Some(PlanProblem {
                reason: PostgreSQLReason::BackupClaimNotFound,
                message: format!("PersistentVolumeClaim {name} (spec.backup.volume.claimName) is being deleted"),
            }),
            None => Some(PlanProblem {
                reason: PostgreSQLReason::BackupClaimNotFound,
                message: format!(
                    "PersistentVolumeClaim {name} (spec.backup.volume.claimName) does not exist in this namespace: create it"
                ),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::fixtures::{postgres, with_backups};
    use crate::postgres::store::BaseBackupDestination;
    use k8s_openapi::ByteString;
    use noops_api::postgres::VolumeDestination;

    fn secret(keys: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                keys.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn bucket() -> Destination {
        let pg = with_backups(postgres("shop"));
        pg.spec.backup.as_ref().and_then(Destination::of_spec).unwrap()
    }

    #[test]
    fn a_bucket_needs_its_credentials_secret_with_both_keys() {
        let destination = bucket();
        assert_eq!(needed(&destination), Needed::Secret("keys"));
        let whole = secret(&[("AWS_ACCESS_KEY_ID", "id"), ("AWS_SECRET_ACCESS_KEY", "key")]);
        assert_eq!(problem(&destination, Some(&whole), None), None);
        let missing = problem(&destination, None, None).unwrap();
        assert_eq!(missing.reason, PostgreSQLReason::BackupCredentialsMissing);
        assert!(missing.message.contains("Secret keys"), "{}", missing.message);
        let half = problem(&destination, Some(&secret(&[("AWS_ACCESS_KEY_ID", "id")])), None).unwrap();
        assert_eq!(half.reason, PostgreSQLReason::BackupCredentialsInvalid);
        assert!(half.message.contains("no AWS_SECRET_ACCESS_KEY"), "{}", half.message);
        let empty = secret(&[("AWS_ACCESS_KEY_ID", ""), ("AWS_SECRET_ACCESS_KEY", "key")]);
        assert!(
            problem(&destination, Some(&empty), None)
                .unwrap()
                .message
                .contains("no AWS_ACCESS_KEY_ID")
        );
    }

    #[test]
    fn a_volume_needs_its_claim_and_not_one_being_deleted() {
        let destination = Destination::Volume(VolumeDestination {
            claim_name: "pg-backups".into(),
            prefix: "postgres".into(),
            engine: std::marker::PhantomData,
        });
        assert_eq!(needed(&destination), Needed::Claim("pg-backups"));
        let mut claim = PersistentVolumeClaim::default();
        assert_eq!(problem(&destination, None, Some(&claim)), None);
        assert_eq!(
            problem(&destination, None, None).unwrap().reason,
            PostgreSQLReason::BackupClaimNotFound
        );
        claim.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::now(),
        ));
        assert!(
            problem(&destination, None, Some(&claim))
                .unwrap()
                .message
                .contains("being deleted")
        );
    }
}
