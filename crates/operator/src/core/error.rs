//! The errors a reconcile can end with, each classified into a reason that shows up the same way
//! in conditions, Events and metric labels, and, when it happened in one of the stages of a
//! reconcile, the stage it happened in.

use std::fmt;

/// The stages of a reconcile, in order (the module doc of each controller states its pipeline).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Reading the resource's children and the state of what it runs.
    Observe,
    /// Checking that the spec can be carried out against what was observed.
    Validate,
    /// Applying the desired children.
    Apply,
    /// Writing the resource's status.
    Status,
    /// Removing what the resource no longer asks for, or what it leaves behind.
    Cleanup,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Observe => "reading the cluster",
            Stage::Validate => "checking the spec",
            Stage::Apply => "applying the desired objects",
            Stage::Status => "writing the status",
            Stage::Cleanup => "cleaning up",
        })
    }
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request (network, conflict, forbidden, ...).
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    /// The spec asks for something that cannot be done as it stands (caught after the schema).
    #[error("{0}")]
    InvalidSpec(String),
    /// A certificate the operator keeps cannot be read or made (a CA Secret edited by hand, a
    /// key the library refuses): not the spec's fault, and not fixed by waiting.
    #[error("certificates: {0}")]
    Certificate(String),
    /// What should not happen to an object the API server sent (it has no uid), or a misuse of
    /// a library by the operator itself (a finalizer name it refuses).
    #[error("internal: {0}")]
    Internal(String),
    /// A child object the operator would create already exists and belongs to someone else.
    #[error("{kind} {name:?} already exists and is not owned by this {owner}: rename the app or remove the {kind}")]
    NameConflict {
        kind: &'static str,
        name: String,
        owner: &'static str,
    },
    /// The object could not be read as its kind (it breaks the current schema).
    #[error("object cannot be read as {kind}: {message}")]
    Malformed { kind: String, message: String },
    /// etcd refused or failed a request (a member unreachable, a membership change refused).
    #[error("etcd: {0}")]
    Etcd(String),
    /// A step must wait for something outside the object (a deletion held back, a store away
    /// for a moment); it is tried again.
    #[error("{0}")]
    Blocked(String),
    /// A step is under way and ends on its own (a pod deleting a snapshot): not a failure, but
    /// the only way a finalizer's cleanup can say "not yet". Looked at again soon, quietly.
    #[error("{0}")]
    UnderWay(String),
    /// A step waits for the object itself to change (a paused object's deletion, which only
    /// a finalizer's error can hold): not a failure, and not looked at again until it changes.
    #[error("{0}")]
    Held(String),
    /// An error in one stage of a reconcile.
    #[error("while {stage}: {source}")]
    During {
        stage: Stage,
        #[source]
        source: Box<Error>,
    },
}

/// What a reconcile through kube's `finalizer()` helper ends in: its own error, or the API's.
/// Whether `error` is the API server refusing to make an object in a namespace being deleted:
/// waiting cannot help (a finalizer that needs a pod there must let go, not wait for ever).
pub fn namespace_terminating(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status
        .details
        .as_ref()
        .is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating")))
}

pub fn from_finalizer(
    result: std::result::Result<kube::runtime::controller::Action, kube::runtime::finalizer::Error<Error>>,
) -> Result<kube::runtime::controller::Action> {
    use kube::runtime::finalizer::Error as Failed;
    match result {
        Ok(action) => Ok(action),
        // A pass on a stale copy of an object already gone: nothing left to do.
        Err(Failed::RemoveFinalizer(kube::Error::Api(e))) if e.code == 404 => {
            Ok(kube::runtime::controller::Action::await_change())
        }
        Err(Failed::ApplyFailed(e) | Failed::CleanupFailed(e)) => Err(e),
        Err(Failed::AddFinalizer(e) | Failed::RemoveFinalizer(e)) => Err(Error::Kube(e)),
        Err(other) => Err(Error::Internal(other.to_string())),
    }
}

impl Error {
    /// A CamelCase reason for conditions, Events and the `reason` label of error metrics (the
    /// stage does not change it: it stays a short, bounded label).
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(e)) if e.code == 409 => "Conflict",
            Error::Kube(kube::Error::Api(e)) if e.code == 403 => "Forbidden",
            Error::Kube(kube::Error::Api(e)) if e.code == 422 => "Rejected",
            Error::Kube(_) => "ApiError",
            Error::InvalidSpec(_) => "InvalidSpec",
            Error::Certificate(_) => "CertificateError",
            Error::Internal(_) => "InternalError",
            Error::NameConflict { .. } => "NameConflict",
            Error::Malformed { .. } => "Malformed",
            Error::Etcd(_) => "EtcdError",
            Error::Blocked(_) => "Blocked",
            Error::UnderWay(_) => "UnderWay",
            Error::Held(_) => "Held",
            Error::During { source, .. } => source.reason(),
        }
    }

    /// Whether retrying can help without a change to the spec or the cluster.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Kube(_) | Error::Etcd(_) | Error::Blocked(_) => true,
            Error::During { source, .. } => source.is_transient(),
            _ => false,
        }
    }

    /// The stage of the reconcile it happened in, if known.
    pub fn stage(&self) -> Option<Stage> {
        match self {
            Error::During { stage, .. } => Some(*stage),
            _ => None,
        }
    }
}

/// Says which stage of a reconcile a failure happened in.
pub trait DuringStage<T> {
    /// Tags the error with `stage` (an error already tagged keeps its first stage).
    fn during(self, stage: Stage) -> Result<T>;
}

impl<T, E: Into<Error>> DuringStage<T> for std::result::Result<T, E> {
    fn during(self, stage: Stage) -> Result<T> {
        self.map_err(|e| match e.into() {
            tagged @ Error::During { .. } => tagged,
            source => Error::During {
                stage,
                source: Box::new(source),
            },
        })
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
        assert_eq!(Error::Certificate("x".into()).reason(), "CertificateError");
        assert_eq!(Error::Internal("x".into()).reason(), "InternalError");
    }

    #[test]
    fn an_error_says_its_stage_and_keeps_its_reason() {
        let failed: Result<()> = Err(Error::InvalidSpec("replicas must be odd".into()));
        let tagged = failed.during(Stage::Validate).unwrap_err();
        assert_eq!(tagged.stage(), Some(Stage::Validate));
        assert_eq!(tagged.reason(), "InvalidSpec", "the reason stays a short label");
        assert_eq!(tagged.to_string(), "while checking the spec: replicas must be odd");
        let retagged = Err::<(), _>(tagged).during(Stage::Status).unwrap_err();
        assert_eq!(retagged.stage(), Some(Stage::Validate), "the first stage stays");
        let api = kube::Error::Api(Box::new(kube::core::Status {
            code: 409,
            ..Default::default()
        }));
        let tagged = Err::<(), _>(api).during(Stage::Apply).unwrap_err();
        assert_eq!((tagged.reason(), tagged.is_transient()), ("Conflict", true));
    }

    #[test]
    fn a_namespace_being_deleted_is_told_from_other_refusals() {
        let refusal: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 403, "reason": "Forbidden",
            "message": "pods \"x\" is forbidden: unable to create new content in namespace demo because it is being terminated",
            "details": { "name": "x", "kind": "pods", "causes": [{ "reason": "NamespaceTerminating", "message": "namespace demo is being terminated", "field": "metadata.namespace" }] }
        }))
        .unwrap();
        assert!(namespace_terminating(&kube::Error::Api(Box::new(refusal))));
        let other = kube::core::Status::failure("forbidden", "Forbidden").with_code(403);
        assert!(!namespace_terminating(&kube::Error::Api(Box::new(other))));
    }
}
