//! The only way noops talks to PostgreSQL: the operator as the superuser over the pod's
//! address, to learn what the instance is (its version, its WAL archiving, what a restore
//! recovered) and to make the database and its owner as the spec says; the instance manager
//! through the socket, to follow a restore.
//!
//! Passwords never travel in clear: the SCRAM-SHA-256 verifier is computed here and sent in
//! its place, so neither the server's logs nor `pg_stat_activity` can show the password.

use std::time::Duration;

use noops_api::backup::WorkProgress;
use tokio_postgres::{Client, NoTls};
use tracing::warn;

use super::names::{PORT, SUPERUSER};

/// How long a connection attempt may take: a server a few hops away on this cluster's network
/// answers in milliseconds, and a pass waiting on one that is gone holds back what follows (a
/// failover among it).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long the server may take to answer a connection or a statement. A server that is
/// stopped whole (a frozen process, a hung node) still has its kernel accept connections and
/// acknowledge what is sent: without this, a pass that asked it would wait for ever.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    #[error("PostgreSQL at {address}: {}", said(.source))]
    Failed {
        address: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("PostgreSQL at {address} did not answer in time")]
    Silent { address: String },
}

impl SqlError {
    /// Whether the server itself sent this error (it answers, if only to refuse).
    pub fn sent_by_the_server(&self) -> bool {
        matches!(self, SqlError::Failed { source, .. } if source.as_db_error().is_some())
    }
}

/// What the server said (an error of the server's own is shown with its message, not as
/// tokio-postgres's bare "db error").
fn said(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => error.to_string(),
    }
}

/// What the instance says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceFacts {
    /// `SHOW server_version`, such as `15.14 (Debian 15.14-0+deb12u1)`, cut at the space.
    pub server_version: String,
    /// The database system identifier, fixed at `initdb`.
    pub system_identifier: String,
}

/// What the WAL archiver reports (`pg_stat_archiver`), times in RFC 3339.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Archiver {
    pub last_archived_wal: Option<String>,
    pub last_archived_time: Option<String>,
    pub last_failed_wal: Option<String>,
    pub last_failed_time: Option<String>,
}

/// What a recovery replayed, times in RFC 3339.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// The commit time of the last transaction replayed (none if none was).
    pub last_transaction: Option<String>,
    /// The last WAL position replayed.
    pub end_wal: Option<String>,
}

/// What the primary says of its replication: where its WAL is, the standbys streaming from it
/// (`pg_stat_replication`), and the slots of ours it keeps (`pg_replication_slots`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replication {
    pub current_lsn: String,
    pub timeline: i64,
    pub standbys: Vec<Standby>,
    /// The physical slots named `noops_*`, and whether a standby uses each now.
    pub slots: Vec<(String, bool)>,
    /// Its `synchronous_standby_names`.
    pub synchronous_standby_names: String,
}

/// One standby connected to the primary, by its application name (its pod).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Standby {
    pub name: String,
    /// `streaming`, `catchup`, `startup`, ...
    pub state: String,
    /// The last WAL position it has written to its disk, and replayed.
    pub flush_lsn: Option<String>,
    pub replay_lsn: Option<String>,
    /// The bytes the primary has written past what the standby has flushed.
    pub lag_bytes: Option<i64>,
    /// How far its replay is behind, as the primary measures it (none when idle).
    pub replay_lag_millis: Option<i64>,
    /// How long ago it last replied (none: never).
    pub reply_age_millis: Option<i64>,
}

/// A time column as RFC 3339 in UTC.
fn rfc3339(column: &str) -> String {
    format!("to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')")
}

/// A connection to one instance as the superuser.
pub struct Instance {
    client: Client,
    address: String,
}

impl Instance {
    /// Connects to the `postgres` database at `ip`.
    pub async fn connect(ip: &str, superuser_password: &str) -> Result<Self, SqlError> {
        let mut config = tokio_postgres::Config::new();
        config.host(ip).password(superuser_password);
        Self::open(config, format!("{ip}:{PORT}")).await
    }

    /// Connects through the socket in `dir`, as the OS user this program runs as (peer).
    pub async fn local(dir: &std::path::Path) -> Result<Self, SqlError> {
        let mut config = tokio_postgres::Config::new();
        config.host_path(dir);
        Self::open(config, dir.display().to_string()).await
    }

    async fn open(mut config: tokio_postgres::Config, address: String) -> Result<Self, SqlError> {
        config
            .port(PORT as u16)
            .user(SUPERUSER)
            .dbname("postgres")
            .application_name("noops")
            // The operator's own changes (its role, the password, the database) never wait
            // for synchronous replicas: a pass must not hang while they are away. What it
            // made is made again if a failover loses it (it is looked at at every pass, and
            // the password is set again once a new primary serves).
            .options("-c synchronous_commit=local")
            .connect_timeout(CONNECT_TIMEOUT);
        let (client, connection) = match tokio::time::timeout(ANSWER_WITHIN, config.connect(NoTls)).await {
            Ok(connected) => connected.map_err(|source| SqlError::Failed {
                address: address.clone(),
                source,
            })?,
            Err(_) => return Err(SqlError::Silent { address }),
        };
        let task_address = address.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                warn!(address = %task_address, error = %e, "connection to PostgreSQL ended");
            }
        });
        Ok(Self { client, address })
    }

    fn failed(&self, source: tokio_postgres::Error) -> SqlError {
        SqlError::Failed {
            address: self.address.clone(),
            source,
        }
    }

    /// What the server answers to `request`, if it answers within [`ANSWER_WITHIN`].
    async fn answer<T>(
        &self,
        request: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, SqlError> {
        self.answer_within(ANSWER_WITHIN, request).await
    }

    /// What the server answers to `request`, a statement that may take `within`.
    async fn answer_within<T>(
        &self,
        within: Duration,
        request: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, SqlError> {
        match tokio::time::timeout(within, request).await {
            Ok(answer) => answer.map_err(|e| self.failed(e)),
            Err(_) => Err(SqlError::Silent {
                address: self.address.clone(),
            }),
        }
    }

    /// Whether `query` (with `name` as its one parameter) finds a row.
    async fn exists(&self, query: &str, name: &str) -> Result<bool, SqlError> {
        let row = self.answer(self.client.query_opt(query, &[&name])).await?;
        Ok(row.is_some())
    }

    pub async fn facts(&self) -> Result<InstanceFacts, SqlError> {
        let row = self
            .answer(self.client.query_one(
                "SELECT current_setting('server_version'), system_identifier::text FROM pg_control_system()",
                &[],
            ))
            .await?;
        let version: String = row.get(0);
        Ok(InstanceFacts {
            server_version: version.split_whitespace().next().unwrap_or_default().to_string(),
            system_identifier: row.get(1),
        })
    }

    /// Makes `user` (a login role) if it is not there; true if this call made it. A new role
    /// gets `password` at once.
    pub async fn ensure_user(&self, user: &str, password: &str) -> Result<bool, SqlError> {
        if self.exists("SELECT 1 FROM pg_roles WHERE rolname = $1", user).await? {
            return Ok(false);
        }
        let statement = format!(
            "CREATE ROLE {} LOGIN PASSWORD {}",
            identifier(user),
            literal(&verifier(password))
        );
        self.answer(self.client.batch_execute(&statement)).await?;
        Ok(true)
    }

    /// Sets `user`'s password (and makes sure it can log in).
    pub async fn set_password(&self, user: &str, password: &str) -> Result<(), SqlError> {
        let statement = format!(
            "ALTER ROLE {} LOGIN PASSWORD {}",
            identifier(user),
            literal(&verifier(password))
        );
        self.answer(self.client.batch_execute(&statement)).await
    }

    /// Makes database `db` owned by `owner` if it is not there; true if this call made it.
    pub async fn ensure_database(&self, db: &str, owner: &str) -> Result<bool, SqlError> {
        if self.exists("SELECT 1 FROM pg_database WHERE datname = $1", db).await? {
            return Ok(false);
        }
        // CREATE DATABASE cannot run in a transaction block, hence the simple query.
        let statement = format!("CREATE DATABASE {} OWNER {}", identifier(db), identifier(owner));
        self.answer_within(Duration::from_secs(120), self.client.batch_execute(&statement))
            .await?;
        Ok(true)
    }
}

impl Instance {
    /// What the WAL archiver has done.
    pub async fn archiver(&self) -> Result<Archiver, SqlError> {
        let query = format!(
            "SELECT last_archived_wal, {}, last_failed_wal, {} FROM pg_stat_archiver",
            rfc3339("last_archived_time"),
            rfc3339("last_failed_time")
        );
        let row = self.answer(self.client.query_one(&query, &[])).await?;
        Ok(Archiver {
            last_archived_wal: row.get(0),
            last_archived_time: row.get(1),
            last_failed_wal: row.get(2),
            last_failed_time: row.get(3),
        })
    }

    /// The text of the file at `path` on the instance (none if it is not there).
    pub async fn read_file(&self, path: &str) -> Result<Option<String>, SqlError> {
        let row = self
            .answer(
                self.client
                    .query_one("SELECT pg_read_file($1::text, 0, 1048576, true)", &[&path]),
            )
            .await?;
        Ok(row.get(0))
    }

    /// Whether the server still recovers.
    pub async fn in_recovery(&self) -> Result<bool, SqlError> {
        let row = self
            .answer(self.client.query_one("SELECT pg_is_in_recovery()", &[]))
            .await?;
        Ok(row.get(0))
    }

    /// The timeline of the server's last checkpoint, if it is a primary (a standby's is of
    /// its last restartpoint, which says nothing of where it replays).
    pub async fn primary_timeline(&self) -> Result<Option<u32>, SqlError> {
        let row = self
            .answer(self.client.query_one(
                "SELECT pg_is_in_recovery(), timeline_id FROM pg_control_checkpoint()",
                &[],
            ))
            .await?;
        let in_recovery: bool = row.get(0);
        let timeline: i32 = row.get(1);
        Ok((!in_recovery).then_some(timeline.max(0) as u32))
    }

    /// Whether this standby's WAL receiver is streaming from its primary, and the last
    /// position it replayed.
    pub async fn streaming(&self) -> Result<(bool, Option<String>), SqlError> {
        let row = self
            .answer(self.client.query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_wal_receiver WHERE status = 'streaming'),
                        pg_last_wal_replay_lsn()::text",
                &[],
            ))
            .await?;
        Ok((row.get(0), row.get(1)))
    }

    /// What the recovery that just ended replayed.
    pub async fn recovered(&self) -> Result<Recovered, SqlError> {
        let query = format!(
            "SELECT {}, pg_last_wal_replay_lsn()::text",
            rfc3339("pg_last_xact_replay_timestamp()")
        );
        let row = self.answer(self.client.query_one(&query, &[])).await?;
        Ok(Recovered {
            last_transaction: row.get(0),
            end_wal: row.get(1),
        })
    }

    /// How far the base backup the server streams has got (`pg_stat_progress_basebackup`):
    /// its step, the bytes streamed and the estimated total; none if none runs.
    pub async fn base_backup_progress(&self) -> Result<Option<WorkProgress>, SqlError> {
        let row = self
            .answer(self.client.query_opt(
                "SELECT phase, backup_streamed, backup_total FROM pg_stat_progress_basebackup ORDER BY pid LIMIT 1",
                &[],
            ))
            .await?;
        Ok(row.map(|row| WorkProgress {
            step: row.get(0),
            bytes_done: row.get(1),
            bytes_total: row.get(2),
            ..Default::default()
        }))
    }

    pub async fn checkpoint(&self) -> Result<(), SqlError> {
        // A checkpoint writes every dirty page: it may take a while on a busy server.
        self.answer_within(Duration::from_secs(600), self.client.batch_execute("CHECKPOINT"))
            .await
    }

    /// Switches to a new WAL segment (`pg_switch_wal()`): the one being written is archived
    /// now rather than at `archive_timeout`.
    pub async fn switch_wal(&self) -> Result<(), SqlError> {
        self.answer(self.client.batch_execute("SELECT pg_switch_wal()")).await
    }

    /// The timeline of the last checkpoint.
    pub async fn timeline(&self) -> Result<i64, SqlError> {
        let row = self
            .answer(
                self.client
                    .query_one("SELECT timeline_id::bigint FROM pg_control_checkpoint()", &[]),
            )
            .await?;
        Ok(row.get(0))
    }

    /// Whether database `db` and role `user` are both there.
    pub async fn has_database_and_user(&self, db: &str, user: &str) -> Result<bool, SqlError> {
        let row = self.answer(self.client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1) AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $2)",
                &[&db, &user],
            )).await?;
        Ok(row.get(0))
    }
}

impl Instance {
    /// What the primary says of its replication.
    pub async fn replication(&self) -> Result<Replication, SqlError> {
        let row = self
            .answer(self.client.query_one(
                "SELECT pg_current_wal_lsn()::text, (SELECT timeline_id::bigint FROM pg_control_checkpoint()), \
                 current_setting('synchronous_standby_names')",
                &[],
            ))
            .await?;
        let standbys = self
            .answer(self.client.query(
                "SELECT application_name, state, flush_lsn::text, replay_lsn::text, \
                 pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)::bigint, \
                 (extract(epoch FROM replay_lag) * 1000)::bigint, \
                 (extract(epoch FROM clock_timestamp() - reply_time) * 1000)::bigint \
                 FROM pg_stat_replication ORDER BY application_name",
                &[],
            ))
            .await?
            .into_iter()
            .map(|r| Standby {
                name: r.get(0),
                state: r.get::<_, Option<String>>(1).unwrap_or_default(),
                flush_lsn: r.get(2),
                replay_lsn: r.get(3),
                lag_bytes: r.get(4),
                replay_lag_millis: r.get(5),
                reply_age_millis: r.get(6),
            })
            .collect();
        let slots = self.answer(self.client
            .query(
                "SELECT slot_name::text, active FROM pg_replication_slots WHERE slot_type = 'physical' AND slot_name LIKE 'noops\\_%' ORDER BY slot_name",
                &[],
            )).await?
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        Ok(Replication {
            current_lsn: row.get(0),
            timeline: row.get(1),
            standbys,
            slots,
            synchronous_standby_names: row.get(2),
        })
    }

    /// Sets `synchronous_standby_names` (in `postgresql.auto.conf`, which a copy or a rewind
    /// of this instance carries too) and has the server take it now. Allowed on a standby.
    pub async fn set_synchronous_standby_names(&self, value: &str) -> Result<(), SqlError> {
        // Two statements: ALTER SYSTEM refuses to run in a (multi-statement) transaction.
        self.answer(self.client.batch_execute(&format!(
            "ALTER SYSTEM SET synchronous_standby_names = {}",
            literal(value)
        )))
        .await?;
        self.answer(self.client.batch_execute("SELECT pg_reload_conf()"))
            .await?;
        Ok(())
    }

    /// Promotes a standby, waiting until it takes writes; a server already promoted (by an
    /// earlier request that was not answered in time) is left as it is.
    pub async fn promote(&self) -> Result<(), SqlError> {
        let promote = "SELECT CASE WHEN pg_is_in_recovery() THEN pg_promote(true, 60) ELSE true END";
        self.answer_within(Duration::from_secs(70), self.client.execute(promote, &[]))
            .await?;
        Ok(())
    }

    /// Where this standby is: the newest timeline it has WAL of (the timeline in the names of
    /// its WAL segments: what it streamed is written under the timeline it came on) and the
    /// last position it received, or replayed if that is further (a WAL receiver that starts
    /// on a new timeline counts from the start of its segment until it receives). None: not a
    /// standby.
    pub async fn standby_position(&self) -> Result<Option<crate::postgres::position::Position>, SqlError> {
        let row = self
            .answer(self.client.query_one(
                "SELECT pg_is_in_recovery(),
                        greatest(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())::text,
                        (SELECT max(substr(name, 1, 8)) FROM pg_ls_waldir() WHERE name ~ '^[0-9A-F]{24}$')",
                &[],
            ))
            .await?;
        let in_recovery: bool = row.get(0);
        let lsn: Option<String> = row.get(1);
        let newest: Option<String> = row.get(2);
        let timeline = newest.and_then(|t| u32::from_str_radix(&t, 16).ok()).unwrap_or(0);
        Ok(in_recovery
            .then_some(lsn)
            .flatten()
            .map(|lsn| crate::postgres::position::Position { timeline, lsn }))
    }

    /// Ends this standby's WAL receiver, if it runs (the server starts another): true if one
    /// was ended.
    pub async fn end_wal_receiver(&self) -> Result<bool, SqlError> {
        let rows = self
            .answer(
                self.client
                    .query("SELECT pg_terminate_backend(pid) FROM pg_stat_wal_receiver", &[]),
            )
            .await?;
        Ok(rows.iter().any(|r| r.get::<_, bool>(0)))
    }

    /// Makes physical replication slot `name`, keeping WAL from now on, unless it is there. (A
    /// standby may have slots too: the replicas of one about to be promoted stream from it
    /// through them.)
    pub async fn ensure_slot(&self, name: &str) -> Result<(), SqlError> {
        self.answer(self.client.execute(
            "SELECT pg_create_physical_replication_slot($1, true) \
             WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)",
            &[&name],
        ))
        .await?;
        Ok(())
    }

    /// Drops replication slot `name` (not in use).
    pub async fn drop_slot(&self, name: &str) -> Result<(), SqlError> {
        self.answer(self.client.execute("SELECT pg_drop_replication_slot($1)", &[&name]))
            .await?;
        Ok(())
    }
}

/// The SCRAM-SHA-256 verifier of `password`, which PostgreSQL stores as it is.
fn verifier(password: &str) -> String {
    postgres_protocol::password::scram_sha_256(password.as_bytes())
}

/// `name` as a quoted SQL identifier.
fn identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `text` as a quoted SQL string literal (with standard_conforming_strings, the default).
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_literals_are_quoted() {
        assert_eq!(identifier("shop"), "\"shop\"");
        assert_eq!(identifier("a\"b"), "\"a\"\"b\"");
        assert_eq!(literal("it's"), "'it''s'");
    }

    #[test]
    fn the_password_is_sent_as_a_scram_verifier() {
        let v = verifier("hunter2");
        assert!(v.starts_with("SCRAM-SHA-256$4096:"), "{v}");
        assert!(!v.contains("hunter2"));
        assert_ne!(verifier("hunter2"), v, "a new salt each time");
    }
}
