//! The Secrets around the database: the superuser's (made once, never shown), the user's
//! password as read from the user's Secret, and the connection Secret applications read.
//! Pure, except for drawing a new password.

use std::collections::BTreeMap;
use std::io::Read;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use noops_api::postgres::PostgreSQLReason;
use noops_api::postgres::{PASSWORD_KEYS, PostgreSQLStatus};

use super::names::{Names, PORT, SUPERUSER};
use crate::core::conditions::Decided;

/// The key of a password in the superuser and connection Secrets.
pub const PASSWORD: &str = "password";

/// Why the user's password cannot be read: a reason for conditions and Events, and what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasswordProblem {
    pub reason: PostgreSQLReason,
    pub message: String,
}

impl PasswordProblem {
    pub fn condition(&self, type_: &'static str, status: bool) -> Decided<PostgreSQLReason> {
        Decided::new(type_, status, self.reason, self.message.clone())
    }
}

/// The user's password, and the version of the Secret it came from (`<uid>/<resourceVersion>`:
/// a new one is set in the database).
#[derive(Clone, PartialEq, Eq)]
pub struct Password {
    pub value: String,
    pub version: String,
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Password")
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// Reads the password from the user's Secret `name` (`None`: there is no such Secret).
pub fn password(secret: Option<&Secret>, name: &str) -> Result<Password, PasswordProblem> {
    let Some(secret) = secret else {
        return Err(PasswordProblem {
            reason: PostgreSQLReason::PasswordSecretMissing,
            message: format!(
                "Secret {name} (spec.passwordSecret) does not exist: create it with the user's password under the key password (or postgresql_password)"
            ),
        });
    };
    let data = secret.data.clone().unwrap_or_default();
    let mut found: Vec<(&str, &ByteString)> = PASSWORD_KEYS
        .iter()
        .filter_map(|key| data.get(*key).map(|value| (*key, value)))
        .collect();
    found.dedup_by(|a, b| a.1 == b.1);
    let (key, value) = match found.as_slice() {
        [] => {
            return Err(PasswordProblem {
                reason: PostgreSQLReason::PasswordKeyMissing,
                message: format!(
                    "Secret {name} has neither of the keys password and postgresql_password: put the user's password under one of them"
                ),
            });
        }
        [one] => *one,
        _ => {
            return Err(PasswordProblem {
                reason: PostgreSQLReason::PasswordAmbiguous,
                message: format!(
                    "Secret {name} has two different passwords, under password and postgresql_password: keep one of the keys"
                ),
            });
        }
    };
    let Ok(value) = String::from_utf8(value.0.clone()) else {
        return Err(PasswordProblem {
            reason: PostgreSQLReason::PasswordInvalid,
            message: format!("the password in Secret {name} (key {key}) is not UTF-8 text"),
        });
    };
    if value.is_empty() || value.contains('\0') {
        return Err(PasswordProblem {
            reason: PostgreSQLReason::PasswordInvalid,
            message: format!("the password in Secret {name} (key {key}) is empty or holds a NUL character"),
        });
    }
    let version = format!(
        "{}/{}",
        secret.metadata.uid.as_deref().unwrap_or_default(),
        secret.metadata.resource_version.as_deref().unwrap_or_default()
    );
    Ok(Password { value, version })
}

/// Whether `password` must be set in the database: the Secret changed since it was last set,
/// or the database is another one (a new data directory) than the one it was set in.
pub fn needs_setting(previous: &PostgreSQLStatus, password: &Password, system_identifier: &str) -> bool {
    previous.password_secret_version.as_deref() != Some(password.version.as_str())
        || previous.system_identifier.as_deref() != Some(system_identifier)
}

/// A new random password: 32 hex digits (128 bits) from the kernel's generator.
pub fn new_password() -> std::io::Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn secret(name: String, names: &Names, owner: &OwnerReference, data: BTreeMap<String, String>) -> Secret {
    Secret {
        metadata: names.child(name, owner),
        type_: Some("Opaque".into()),
        string_data: None,
        data: Some(data.into_iter().map(|(k, v)| (k, ByteString(v.into_bytes()))).collect()),
        ..Default::default()
    }
}

/// The superuser's Secret: made once with a new password, which `initdb` gives the superuser.
pub fn superuser_secret(names: &Names, owner: &OwnerReference, password: String) -> Secret {
    let data = BTreeMap::from([
        ("username".to_string(), SUPERUSER.to_string()),
        (PASSWORD.to_string(), password),
    ]);
    secret(names.superuser_secret(), names, owner, data)
}

/// The superuser's password, from its Secret.
pub fn superuser_password(secret: &Secret) -> Option<String> {
    let value = secret.data.as_ref()?.get(PASSWORD)?;
    String::from_utf8(value.0.clone()).ok().filter(|p| !p.is_empty())
}

/// The Secret applications connect with.
pub fn connection_secret(names: &Names, owner: &OwnerReference, db: &str, user: &str, password: &Password) -> Secret {
    let host = names.host();
    let uri = format!(
        "postgresql://{}:{}@{host}:{PORT}/{db}",
        noops_api::uri::percent_encode(user),
        noops_api::uri::percent_encode(&password.value)
    );
    let read_only_host = names.read_only_host();
    let read_only_uri = format!(
        "postgresql://{}:{}@{read_only_host}:{PORT}/{db}",
        noops_api::uri::percent_encode(user),
        noops_api::uri::percent_encode(&password.value)
    );
    let data = BTreeMap::from([
        ("host".to_string(), host),
        ("port".to_string(), PORT.to_string()),
        ("database".to_string(), db.to_string()),
        ("user".to_string(), user.to_string()),
        (PASSWORD.to_string(), password.value.clone()),
        ("uri".to_string(), uri),
        // Replicas only (`<name>-ro`): reads that may trail the primary by the lag bound.
        ("ro_host".to_string(), read_only_host),
        ("ro_uri".to_string(), read_only_uri),
    ]);
    secret(names.connection_secret(), names, owner, data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn user_secret(data: &[(&str, &[u8])]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("shop-db".into()),
                uid: Some("u1".into()),
                resource_version: Some("7".into()),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn the_password_is_read_from_either_key() {
        let original = password(Some(&user_secret(&[("postgresql_password", b"s3cret")])), "shop-db").unwrap();
        assert_eq!(original.value, "s3cret");
        assert_eq!(original.version, "u1/7");
        let plain = password(Some(&user_secret(&[("password", b"s3cret")])), "shop-db").unwrap();
        assert_eq!(plain.value, "s3cret");
        let both_same = password(
            Some(&user_secret(&[("password", b"a"), ("postgresql_password", b"a")])),
            "x",
        );
        assert_eq!(both_same.unwrap().value, "a");
    }

    #[test]
    fn an_unusable_password_secret_says_what_to_fix() {
        let reason = |s: Option<&Secret>| password(s, "shop-db").unwrap_err().reason;
        assert_eq!(reason(None), PostgreSQLReason::PasswordSecretMissing);
        assert_eq!(
            reason(Some(&user_secret(&[("pass", b"x")]))),
            PostgreSQLReason::PasswordKeyMissing
        );
        assert_eq!(
            reason(Some(&user_secret(&[("password", b"a"), ("postgresql_password", b"b")]))),
            PostgreSQLReason::PasswordAmbiguous
        );
        assert_eq!(
            reason(Some(&user_secret(&[("password", b"")]))),
            PostgreSQLReason::PasswordInvalid
        );
        assert_eq!(
            reason(Some(&user_secret(&[("password", &[0xff, 0xfe])]))),
            PostgreSQLReason::PasswordInvalid
        );
        let missing = password(None, "shop-db").unwrap_err();
        assert!(missing.message.contains("Secret shop-db"), "{}", missing.message);
    }

    #[test]
    fn a_password_is_set_again_for_a_new_secret_version_or_a_new_database() {
        let p = Password {
            value: "x".into(),
            version: "u/2".into(),
        };
        let previous = PostgreSQLStatus {
            password_secret_version: Some("u/2".into()),
            system_identifier: Some("73".into()),
            ..Default::default()
        };
        assert!(!needs_setting(&previous, &p, "73"));
        assert!(needs_setting(&previous, &p, "74"), "a new data directory");
        let older = PostgreSQLStatus {
            password_secret_version: Some("u/1".into()),
            ..previous.clone()
        };
        assert!(needs_setting(&older, &p, "73"), "the Secret changed");
        assert!(needs_setting(&PostgreSQLStatus::default(), &p, "73"));
    }

    #[test]
    fn a_password_never_shows_in_debug_output() {
        let p = password(Some(&user_secret(&[("password", b"hunter2")])), "x").unwrap();
        assert!(!format!("{p:?}").contains("hunter2"));
    }

    #[test]
    fn the_connection_secret_has_everything_to_connect() {
        let names = Names {
            name: "shop".into(),
            namespace: "prod".into(),
            image_repository: "postgres".into(),
        };
        let owner = crate::postgres::fixtures::owner();
        let p = Password {
            value: "p@ss word".into(),
            version: "u/1".into(),
        };
        let secret = connection_secret(&names, &owner, "shop", "app", &p);
        let data = secret.data.unwrap();
        let text = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
        assert_eq!(text("host"), "shop.prod.svc");
        assert_eq!(text("port"), "5432");
        assert_eq!(text("password"), "p@ss word");
        assert_eq!(text("uri"), "postgresql://app:p%40ss%20word@shop.prod.svc:5432/shop");
        assert_eq!(new_password().unwrap().len(), 32);
        assert_ne!(new_password().unwrap(), new_password().unwrap());
    }
}
