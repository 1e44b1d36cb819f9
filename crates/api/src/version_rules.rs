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

/// `spec.version` is not older than the one running (on the resource). Against the version that
/// runs (the status's), not the spec's: an upgrade that stalls can be set back to the version
/// still running.
pub fn no_downgrade() -> Rule {
    Rule::new("!self.spec.version.matches('^1\\\\.[0-9]{1,2}(\\\\.[0-9]{1,3})?$') || int(self.spec.version.split('.')[1]) >= int((has(oldSelf.status) && has(oldSelf.status.version) ? oldSelf.status.version : oldSelf.spec.version).split('.')[1])").message("spec.version: downgrades are refused; Kubernetes cannot go back to a minor version older than the one running")
}

/// `spec.version` is at most one minor newer than the one running (on the resource).
pub fn one_minor_at_a_time() -> Rule {
    Rule::new("!self.spec.version.matches('^1\\\\.[0-9]{1,2}(\\\\.[0-9]{1,3})?$') || int(self.spec.version.split('.')[1]) <= int((has(oldSelf.status) && has(oldSelf.status.version) ? oldSelf.status.version : oldSelf.spec.version).split('.')[1]) + 1").message("spec.version: upgrade one minor version at a time from the one running (1.33 to 1.34), as Kubernetes requires")
}
