//! What the schema cannot check about an EtcdCluster: the user's own certificates, flags the
//! operator owns, and the version against the one the members actually run. Pure.

use noops_api::EtcdCluster;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use noops_api::etcd::EtcdClusterReason;

use super::names::Names;
use super::pod::forbidden_extra_args;
use super::user_tls;

/// The minor version of `3.5.21`: 5.
fn minor(version: &str) -> Option<u64> {
    version.split('.').nth(1)?.parse().ok()
}

/// Why the spec cannot be carried out as it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The condition reason.
    pub reason: EtcdClusterReason,
    pub message: String,
    /// No member may be started from this spec: membership changes wait until it is fixed
    /// (what runs is left alone). Otherwise the operator carries on with what runs.
    pub stops_changes: bool,
    /// The version asked for is refused: the members keep theirs.
    pub stops_upgrade: bool,
}

impl Refusal {
    fn new(reason: EtcdClusterReason, message: String, stops_changes: bool) -> Self {
        Self {
            reason,
            message,
            stops_changes,
            stops_upgrade: true,
        }
    }

    /// A refusal of something beside the members (a backup schedule): they carry on as asked.
    fn aside(reason: EtcdClusterReason, message: String) -> Self {
        Self {
            stops_upgrade: false,
            ..Self::new(reason, message, false)
        }
    }
}

/// Why the spec cannot be carried out as it stands, if it cannot. `running` is the version the
/// members run (the lowest, from the status); `secrets` are the cluster's Secrets (the user's
/// own certificates among them), checked at `now`.
pub fn validate(
    cluster: &EtcdCluster,
    running: Option<&str>,
    secrets: &BTreeMap<String, Arc<Secret>>,
    now: jiff::Timestamp,
) -> Option<Refusal> {
    if let Some(unusable) = user_tls::check(&Names::of(cluster), secrets, now) {
        // Members cannot start or join on certificates that do not work: what runs is left
        // alone, and changes wait until the Secrets are fixed.
        return Some(Refusal::new(unusable.reason, unusable.message, true));
    }
    let forbidden = forbidden_extra_args(cluster);
    if !forbidden.is_empty() {
        return Some(Refusal::new(
            EtcdClusterReason::ForbiddenFlags,
            format!(
                "pod.extraArgs set flags the operator sets itself: {}; remove them (membership changes wait until then)",
                forbidden.join(", ")
            ),
            true,
        ));
    }
    version_refusal(cluster, running).or_else(|| schedule_refusal(cluster))
}

/// Why the repository asked for is not used: it had no image for a member (the members run
/// from the one they ran; versions and membership go on as asked).
pub fn repository_refusal(names: &Names) -> Option<Refusal> {
    let asked = names.refused_repository.as_ref()?;
    Some(Refusal::aside(
        EtcdClusterReason::ImageRepositoryUnavailable,
        format!(
            "{asked} had no etcd image for a member when it was moved there; the members run from {}: fix the registry, or ask for another repository",
            names.image_repository
        ),
    ))
}

/// Why the version asked for cannot be run, against the one the members run.
fn version_refusal(cluster: &EtcdCluster, running: Option<&str>) -> Option<Refusal> {
    let (Some(want), Some(have)) = (minor(&cluster.spec.version), running.and_then(minor)) else {
        return None;
    };
    let running = running.unwrap_or_default();
    let unavailable = cluster.status.as_ref().and_then(|s| s.unavailable_version.as_deref());
    if unavailable == Some(cluster.spec.version.as_str()) {
        return Some(Refusal::new(
            EtcdClusterReason::VersionUnavailable,
            format!(
                "the image of etcd {} could not be pulled when a member was upgraded to it; the members stay on {running}: set a version whose image exists",
                cluster.spec.version
            ),
            false,
        ));
    }
    if want < have {
        return Some(Refusal::new(
            EtcdClusterReason::DowngradeRefused,
            format!(
                "version {} is older than the {running} the members run: etcd cannot go back a minor version",
                cluster.spec.version
            ),
            false,
        ));
    }
    if want > have + 1 {
        return Some(Refusal::new(
            EtcdClusterReason::SkippedMinorVersion,
            format!(
                "version {} skips a minor version from the {running} the members run: upgrade one minor version at a time",
                cluster.spec.version
            ),
            false,
        ));
    }
    if cluster.spec.storage.ephemeral && running != cluster.spec.version {
        return Some(Refusal::new(
            EtcdClusterReason::UpgradeNeedsPersistentStorage,
            format!(
                "members with ephemeral storage lose their data when restarted on a new version: keep {running}, or create a cluster on {} from a backup",
                cluster.spec.version
            ),
            false,
        ));
    }
    if want == have + 1
        && let Some((_, least)) = LEAST_PATCH_BEFORE_NEXT_MINOR.iter().find(|(m, _)| *m == have)
        && patch(running).is_some_and(|p| p < *least)
    {
        return Some(Refusal::new(
            EtcdClusterReason::UpgradeNeedsNewerPatch,
            format!(
                "members on {running} cannot safely move to {}: upgrade them to 3.{have}.{least} or later first, as etcd's upgrade guide requires",
                cluster.spec.version
            ),
            false,
        ));
    }
    None
}

/// Why the backup schedule cannot be followed.
fn schedule_refusal(cluster: &EtcdCluster) -> Option<Refusal> {
    if let Some(Err(bad)) = cluster
        .spec
        .backup
        .as_ref()
        .and_then(|b| b.schedule.as_deref())
        .map(crate::core::backup::schedule::parse)
    {
        return Some(Refusal::aside(
            EtcdClusterReason::InvalidSchedule,
            format!("{bad}; no scheduled backup is made until it is fixed"),
        ));
    }
    None
}

/// The patch version of `3.5.21`: 21.
fn patch(version: &str) -> Option<u64> {
    version.split('.').nth(2)?.parse().ok()
}

/// The least patch of a minor version from which etcd's upgrade guide allows the next minor
/// (3.5 members must run 3.5.26 or later before any moves to 3.6: older ones can make the
/// upgrade fail with "too many learner members").
const LEAST_PATCH_BEFORE_NEXT_MINOR: [(u64, u64); 1] = [(5, 26)];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::fixtures;

    #[test]
    fn owned_flags_downgrades_and_skipped_minors_are_refused_with_a_reason() {
        let plain = fixtures::cluster().build();
        assert_eq!(
            validate(&plain, None, &BTreeMap::new(), jiff::Timestamp::UNIX_EPOCH),
            None,
            "nothing runs yet"
        );
        assert_eq!(
            validate(&plain, Some("3.5.35"), &BTreeMap::new(), jiff::Timestamp::UNIX_EPOCH),
            None,
            "same minor, any patch"
        );
        let flags = fixtures::cluster().extra_args(&["--data-dir=/tmp"]).build();
        assert_eq!(
            validate(&flags, None, &BTreeMap::new(), jiff::Timestamp::UNIX_EPOCH)
                .unwrap()
                .reason,
            EtcdClusterReason::ForbiddenFlags
        );
        assert_eq!(
            validate(&plain, Some("3.6.4"), &BTreeMap::new(), jiff::Timestamp::UNIX_EPOCH)
                .unwrap()
                .reason,
            EtcdClusterReason::DowngradeRefused
        );
        let mut far = fixtures::cluster().build();
        far.spec.version = "3.7.0".into();
        assert_eq!(
            validate(&far, Some("3.5.21"), &BTreeMap::new(), jiff::Timestamp::UNIX_EPOCH)
                .unwrap()
                .reason,
            EtcdClusterReason::SkippedMinorVersion
        );
        let mut next = fixtures::cluster().build();
        next.spec.version = "3.6.16".into();
        assert_eq!(
            validate(&next, Some("3.5.35"), &BTreeMap::new(), jiff::Timestamp::UNIX_EPOCH),
            None,
            "one minor up is an upgrade"
        );
        assert_eq!(
            validate(&next, Some("3.5.21"), &BTreeMap::new(), jiff::Timestamp::UNIX_EPOCH)
                .unwrap()
                .reason,
            EtcdClusterReason::UpgradeNeedsNewerPatch,
            "3.5 before 3.5.26 must take the patch first"
        );
        let mut bad_schedule = fixtures::cluster().build();
        bad_schedule.spec.backup = Some(noops_api::etcd::BackupSpec {
            schedule: Some("61 * * * *".into()),
            max_backups: 3,
            destination: noops_api::backup::BackupDestination {
                s3: Some(noops_api::etcd::S3Destination {
                    endpoint: "http://store.db.svc:7070".into(),
                    bucket: "backups".into(),
                    prefix: "etcd".into(),
                    region: "us-east-1".into(),
                    credentials_secret: "keys".into(),
                    engine: std::marker::PhantomData,
                }),
                volume: None,
            },
        });
        let refused = validate(&bad_schedule, None, &BTreeMap::new(), jiff::Timestamp::UNIX_EPOCH).unwrap();
        assert_eq!(refused.reason, EtcdClusterReason::InvalidSchedule);
        assert!(
            !refused.stops_upgrade && !refused.stops_changes,
            "a bad schedule holds up nothing else"
        );
        let mut ephemeral = fixtures::cluster().ephemeral().build();
        ephemeral.spec.version = "3.6.16".into();
        assert_eq!(
            validate(
                &ephemeral,
                Some("3.5.35"),
                &BTreeMap::new(),
                jiff::Timestamp::UNIX_EPOCH
            )
            .unwrap()
            .reason,
            EtcdClusterReason::UpgradeNeedsPersistentStorage
        );
        let mut ephemeral_patch = fixtures::cluster().ephemeral().build();
        ephemeral_patch.spec.version = "3.5.36".into();
        assert_eq!(
            validate(
                &ephemeral_patch,
                Some("3.5.35"),
                &BTreeMap::new(),
                jiff::Timestamp::UNIX_EPOCH
            )
            .unwrap()
            .reason,
            EtcdClusterReason::UpgradeNeedsPersistentStorage
        );
    }
}
