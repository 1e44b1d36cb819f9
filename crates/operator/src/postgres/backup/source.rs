//! Which instance a base backup reads (`backup.target`). Pure.
//!
//! - `Primary` (the default): the primary, as the status names it (the lease's holder).
//! - `PreferStandby`: a Ready replica that streams, the least behind (fewest bytes of WAL not
//!   received yet, then the lowest ordinal), so that the backup's reads do not compete with
//!   the primary's clients; the primary when no replica streams. WAL is archived by the
//!   primary alone: a backup read from a replica is whole only once the primary has archived
//!   the segment it ends in, which its pod waits for (`instance/base_backup.rs`).

use noops_api::PostgreSQL;
use noops_api::postgres::{BackupTarget, Role};

use crate::postgres::names::Names;

/// An instance a base backup may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// Its pod.
    pub instance: String,
    /// A replica: the backup waits for the primary to archive the WAL it ends in.
    pub standby: bool,
}

/// The instances a base backup of `pg` may read, the preferred first. The primary is always
/// among them (the last, with `PreferStandby`).
pub fn candidates(pg: &PostgreSQL, names: &Names) -> Vec<Source> {
    let status = pg.status.as_ref();
    let primary = status
        .and_then(|s| s.current_primary.clone())
        .unwrap_or_else(|| names.instance());
    let target = pg.spec.backup.as_ref().map(|b| b.target).unwrap_or_default();
    let mut replicas: Vec<_> = match target {
        BackupTarget::Primary => vec![],
        BackupTarget::PreferStandby => status
            .map(|s| s.members.as_slice())
            .unwrap_or_default()
            .iter()
            .filter(|m| m.role == Role::Replica && m.ready && m.streaming == Some(true) && m.name != primary)
            .collect(),
    };
    replicas.sort_by_key(|m| (m.lag_bytes.unwrap_or(i64::MAX), names.ordinal(&m.name)));
    replicas
        .into_iter()
        .map(|m| Source {
            instance: m.name.clone(),
            standby: true,
        })
        .chain(std::iter::once(Source {
            instance: primary,
            standby: false,
        }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use noops_api::postgres::{MemberStatus, PostgreSQLStatus};

    use crate::postgres::fixtures::{member, names, postgres, with_backups};

    fn database(target: BackupTarget, primary: &str, members: Vec<MemberStatus>) -> PostgreSQL {
        let mut pg = with_backups(postgres("shop"));
        if let Some(backup) = pg.spec.backup.as_mut() {
            backup.target = target;
        }
        pg.status = Some(PostgreSQLStatus {
            current_primary: Some(primary.into()),
            members,
            ..Default::default()
        });
        pg
    }

    fn chosen(pg: &PostgreSQL) -> Vec<(String, bool)> {
        candidates(pg, &names())
            .into_iter()
            .map(|s| (s.instance, s.standby))
            .collect()
    }

    #[test]
    fn the_primary_by_default_and_the_least_behind_streaming_replica_when_preferred() {
        let members = vec![
            member("shop-0", Role::Replica, 4096),
            member("shop-1", Role::Primary, 0),
            member("shop-2", Role::Replica, 0),
        ];
        let pg = database(BackupTarget::Primary, "shop-1", members.clone());
        assert_eq!(chosen(&pg), [("shop-1".to_string(), false)]);
        let pg = database(BackupTarget::PreferStandby, "shop-1", members);
        assert_eq!(
            chosen(&pg),
            [
                ("shop-2".to_string(), true),
                ("shop-0".to_string(), true),
                ("shop-1".to_string(), false)
            ]
        );
    }

    #[test]
    fn a_replica_that_does_not_stream_is_never_read_and_the_primary_is_the_last_resort() {
        let members = vec![
            member("shop-0", Role::Primary, 0),
            MemberStatus {
                streaming: Some(false),
                ..member("shop-1", Role::Replica, 0)
            },
            MemberStatus {
                ready: false,
                ..member("shop-2", Role::Replica, 0)
            },
        ];
        let pg = database(BackupTarget::PreferStandby, "shop-0", members);
        assert_eq!(chosen(&pg), [("shop-0".to_string(), false)]);
        // A database that never named its primary (one instance): its first instance.
        let mut one = with_backups(postgres("shop"));
        one.status = None;
        assert_eq!(chosen(&one), [("shop-0".to_string(), false)]);
    }
}
