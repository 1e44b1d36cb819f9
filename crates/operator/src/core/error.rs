//! The errors a reconcile can end with, each classified into a reason that shows up the same way
//! in conditions, Events and metric labels.

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request (network, conflict, forbidden, ...).
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    /// The spec asks for something that cannot be done as it stands (caught after the schema).
    #[error("{0}")]
    InvalidSpec(String),
    /// A child object the operator would create already exists and belongs to someone else.
    #[error("{kind} {name:?} already exists and is not owned by this {owner}: rename the app or remove the {kind}")]
    NameConflict {
        kind: &'static str,
        name: String,
        owner: &'static str,
    },
    /// The object could not be read as its kind (it breaks the current schema).
    #[error("object cannot be read as {kind}: {message}")]
    Malformed { kind: &'static str, message: String },
}

impl Error {
    /// A CamelCase reason for conditions, Events and the `reason` label of error metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(e)) if e.code == 409 => "Conflict",
            Error::Kube(kube::Error::Api(e)) if e.code == 403 => "Forbidden",
            Error::Kube(kube::Error::Api(e)) if e.code == 422 => "Rejected",
            Error::Kube(_) => "ApiError",
            Error::InvalidSpec(_) => "InvalidSpec",
            Error::NameConflict { .. } => "NameConflict",
            Error::Malformed { .. } => "Malformed",
        }
    }

    /// Whether retrying can help without a change to the spec or the cluster.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Kube(_))
    }
}

/// The result of a reconcile.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_stable() {
        let conflict = Error::NameConflict {
            kind: "Deployment",
            name: "shop".into(),
            owner: "MaintPage",
        };
        assert_eq!(conflict.reason(), "NameConflict");
        assert!(conflict.to_string().contains("Deployment \"shop\" already exists"));
        assert!(!conflict.is_transient());
        assert_eq!(Error::InvalidSpec("x".into()).reason(), "InvalidSpec");
    }
}
