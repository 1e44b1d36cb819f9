//! The rules every resource with a Kubernetes `version` shares: its form, the oldest minor
//! supported, and (for what runs a control plane) moving one minor at a time, never back.
//! Checked by the API server (CEL), so a bad version is refused at `kubectl apply`.

use kube::core::Rule;

/// `version` is `1.<minor>` or `1.<minor>.<patch>` (on the field).
pub fn kubernetes_version() -> Rule {
    Rule::new("self.matches('^1\\\\.[0-9]{1,2}(\\\\.[0-9]{1,3})?$')")
        .message("version must be a Kubernetes version such as \"1.34\" or \"1.34.4\"")
}

/// `version` is a supported minor (on the field).
pub fn supported_version() -> Rule {
    Rule::new("!self.matches('^1\\\\.[0-9]{1,2}(\\\\.[0-9]{1,3})?$') || int(self.split('.')[1]) >= 33")
        .message("version must be 1.33 or later: older Kubernetes versions are out of support")
}

/// The minor of the first of the old object's status fields `fields` that is set, or else of
/// `otherwise` (a CEL expression).
fn running_minor(fields: &[&str], otherwise: &str) -> String {
    let version = fields.iter().rev().fold(otherwise.to_string(), |rest, field| {
        format!("(has(oldSelf.status) && has(oldSelf.status.{field}) ? oldSelf.status.{field} : {rest})")
    });
    format!("int({version}.split('.')[1])")
}

/// Rules on a change of `spec.version` only: a status written (the spec as it was) must never
/// be refused for a version the schema let through before the status caught up.
const FORM: &str =
    "self.spec.version == oldSelf.spec.version || !self.spec.version.matches('^1\\\\.[0-9]{1,2}(\\\\.[0-9]{1,3})?$')";

/// `spec.version` is not older than the one running (on the resource): the first of the status
/// fields `fields` set. Against the version that runs, not the spec's: an upgrade that stalls can
/// be set back to the version still running, and one that never ran (its images are not there)
/// to any version.
pub fn no_downgrade(fields: &[&str]) -> Rule {
    Rule::new(format!(
        "{FORM} || int(self.spec.version.split('.')[1]) >= {}",
        running_minor(fields, "self.spec.version")
    ))
    .message(
        "spec.version: downgrades are refused; Kubernetes cannot go back to a minor version older than the one running",
    )
}

/// `spec.version` is at most one minor newer than the one running (on the resource): the first
/// of the status fields `fields` set, or else the version asked before.
pub fn one_minor_at_a_time(fields: &[&str]) -> Rule {
    Rule::new(format!(
        "{FORM} || int(self.spec.version.split('.')[1]) <= {} + 1",
        running_minor(fields, "oldSelf.spec.version")
    ))
    .message(
        "spec.version: upgrade one minor version at a time from the one running (1.33 to 1.34), as Kubernetes requires",
    )
}
