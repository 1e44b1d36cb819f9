//! The only way the operator talks to PostgreSQL: as the superuser, over the pod's address,
//! to learn what the instance is and to make the database and its owner as the spec says.
//!
//! Passwords never travel in clear: the SCRAM-SHA-256 verifier is computed here and sent in
//! its place, so neither the server's logs nor `pg_stat_activity` can show the password.

use std::time::Duration;

use tokio_postgres::{Client, NoTls};
use tracing::warn;

use super::names::{PORT, SUPERUSER};

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
#[error("PostgreSQL at {address}: {source}")]
pub struct SqlError {
    address: String,
    #[source]
    source: tokio_postgres::Error,
}

/// What the instance says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceFacts {
    /// `SHOW server_version`, such as `15.14 (Debian 15.14-0+deb12u1)`, cut at the space.
    pub server_version: String,
    /// The database system identifier, fixed at `initdb`.
    pub system_identifier: String,
}

/// A connection to one instance as the superuser.
pub struct Instance {
    client: Client,
    address: String,
}

impl Instance {
    /// Connects to the `postgres` database at `ip`.
    pub async fn connect(ip: &str, superuser_password: &str) -> Result<Self, SqlError> {
        let address = format!("{ip}:{PORT}");
        let mut config = tokio_postgres::Config::new();
        config
            .host(ip)
            .port(PORT as u16)
            .user(SUPERUSER)
            .password(superuser_password)
            .dbname("postgres")
            .application_name("noops-operator")
            .connect_timeout(CONNECT_TIMEOUT);
        let (client, connection) = config.connect(NoTls).await.map_err(|source| SqlError {
            address: address.clone(),
            source,
        })?;
        let task_address = address.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                warn!(address = %task_address, error = %e, "connection to PostgreSQL ended");
            }
        });
        Ok(Self { client, address })
    }

    fn failed(&self, source: tokio_postgres::Error) -> SqlError {
        SqlError {
            address: self.address.clone(),
            source,
        }
    }

    /// Whether `query` (with `name` as its one parameter) finds a row.
    async fn exists(&self, query: &str, name: &str) -> Result<bool, SqlError> {
        let row = self.client.query_opt(query, &[&name]).await.map_err(|e| self.failed(e))?;
        Ok(row.is_some())
    }

    pub async fn facts(&self) -> Result<InstanceFacts, SqlError> {
        let row = self
            .client
            .query_one(
                "SELECT current_setting('server_version'), system_identifier::text FROM pg_control_system()",
                &[],
            )
            .await
            .map_err(|e| self.failed(e))?;
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
        self.client.batch_execute(&statement).await.map_err(|e| self.failed(e))?;
        Ok(true)
    }

    /// Sets `user`'s password (and makes sure it can log in).
    pub async fn set_password(&self, user: &str, password: &str) -> Result<(), SqlError> {
        let statement = format!(
            "ALTER ROLE {} LOGIN PASSWORD {}",
            identifier(user),
            literal(&verifier(password))
        );
        self.client.batch_execute(&statement).await.map_err(|e| self.failed(e))
    }

    /// Makes database `db` owned by `owner` if it is not there; true if this call made it.
    pub async fn ensure_database(&self, db: &str, owner: &str) -> Result<bool, SqlError> {
        if self.exists("SELECT 1 FROM pg_database WHERE datname = $1", db).await? {
            return Ok(false);
        }
        // CREATE DATABASE cannot run in a transaction block, hence the simple query.
        let statement = format!("CREATE DATABASE {} OWNER {}", identifier(db), identifier(owner));
        self.client.batch_execute(&statement).await.map_err(|e| self.failed(e))?;
        Ok(true)
    }
}

impl Instance {
    /// Whether database `db` and role `user` are both there.
    pub async fn has_database_and_user(&self, db: &str, user: &str) -> Result<bool, SqlError> {
        let row = self
            .client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1) AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $2)",
                &[&db, &user],
            )
            .await
            .map_err(|e| self.failed(e))?;
        Ok(row.get(0))
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
