//! Which Kubernetes a control plane runs: a `version` of the spec (a minor, or an exact
//! version) made exact, the images of that version, and the etcd it runs on. Pure.

use super::names::Component;

/// The minors the operator knows: the newest patch of each (the one a minor-only `version`
/// runs) and the etcd version that Kubernetes minor is released with, as kubeadm pairs them.
const KNOWN: [(u32, &str, &str); 2] = [(33, "1.33.13", "3.5.35"), (34, "1.34.4", "3.6.16")];

/// The minor of `version` (`34` of `1.34.4`); the skew rules between kubelets and API servers
/// are in minors.
pub fn minor(version: &str) -> Option<u32> {
    version.trim_start_matches('v').split('.').nth(1)?.parse().ok()
}

/// What a `version` of the spec comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// The exact Kubernetes version, such as `1.34.4`.
    pub kubernetes: String,
    /// The etcd version the tenant's EtcdCluster runs.
    pub etcd: String,
}

impl Release {
    /// The release `version` names (`1.34` or `1.34.4`); `None` if it is not a Kubernetes
    /// version (the schema refuses those). A minor the operator does not know runs its `.0`
    /// patch on the newest etcd it knows.
    pub fn of(version: &str) -> Option<Self> {
        let mut parts = version.split('.');
        let (major, minor, patch) = (parts.next()?, parts.next()?, parts.next());
        if major != "1" || parts.next().is_some() {
            return None;
        }
        let minor: u32 = minor.parse().ok()?;
        let patch: Option<u32> = match patch {
            Some(p) => Some(p.parse().ok()?),
            None => None,
        };
        let known = KNOWN.iter().find(|(m, _, _)| *m == minor);
        let newest_etcd = KNOWN[KNOWN.len() - 1].2;
        let kubernetes = match (patch, known) {
            (Some(patch), _) => format!("1.{minor}.{patch}"),
            (None, Some((_, newest, _))) => (*newest).to_string(),
            (None, None) => format!("1.{minor}.0"),
        };
        let etcd = known.map_or(newest_etcd, |(_, _, etcd)| *etcd).to_string();
        Some(Self { kubernetes, etcd })
    }

    /// The image of `component` at this version, as Kubernetes publishes it.
    pub fn image(&self, component: Component) -> String {
        format!("registry.k8s.io/{}:v{}", component.program(), self.kubernetes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minor_runs_its_newest_known_patch_and_an_exact_version_runs_as_it_is() {
        let minor_only = Release::of("1.34").unwrap();
        assert_eq!(minor_only.kubernetes, "1.34.4");
        assert_eq!(minor_only.etcd, "3.6.16");
        assert_eq!(
            minor_only.image(Component::ApiServer),
            "registry.k8s.io/kube-apiserver:v1.34.4"
        );
        let older = Release::of("1.33").unwrap();
        assert_eq!((older.kubernetes.as_str(), older.etcd.as_str()), ("1.33.13", "3.5.35"));
        let exact = Release::of("1.34.2").unwrap();
        assert_eq!(
            exact.kubernetes, "1.34.2",
            "a patch we have no binaries for fails to pull"
        );
        let unknown = Release::of("1.36").unwrap();
        assert_eq!(
            (unknown.kubernetes.as_str(), unknown.etcd.as_str()),
            ("1.36.0", "3.6.16")
        );
        for bad in ["2.0", "1", "1.x", "1.34.4.1", "v1.34", ""] {
            assert_eq!(Release::of(bad), None, "{bad}");
        }
    }
}
