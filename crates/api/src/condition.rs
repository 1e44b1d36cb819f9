//! Condition types and reasons shared by every noops resource.
//!
//! Every resource reports the same condition types, with `observedGeneration`, so that
//! `kubectl wait --for=condition=Ready` works the same way everywhere.

/// The resource does what its spec asks and is serving.
pub const READY: &str = "Ready";
/// The operator is moving the resource towards its spec (rolling out, switching, scaling).
pub const PROGRESSING: &str = "Progressing";
/// Something needs attention: the spec cannot be carried out as it is, or a part is failing.
pub const DEGRADED: &str = "Degraded";
/// A backup (EtcdBackup, PostgresBackup) is stored; such a one-off task is never Ready.
pub const SUCCEEDED: &str = "Succeeded";
/// `spec.paused` is true: the operator changes nothing of the resource until it is false (its
/// status is still reported). False otherwise, on every kind that has `spec.paused`.
pub const PAUSED: &str = "Paused";
