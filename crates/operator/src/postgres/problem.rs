//! Why a database cannot be made or changed as its spec says: a bad destination, no node that
//! fits, a refused restore, a schedule the parser refuses. The plan holds what it cannot do
//! and the status says it (a condition's reason and message, and an Event).

use noops_api::postgres::PostgreSQLReason;

/// Why a database cannot start, or change, as its spec says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanProblem {
    /// The condition reason, such as `NoNodeFits`.
    pub reason: PostgreSQLReason,
    pub message: String,
}
