//! The noops operator: controllers for the noops custom resources, and what they share.
//!
//! `noops run` (see `main.rs`) runs the controllers with leader election, metrics and health
//! endpoints; `noops crds` prints the CRDs. The library is here so that tests and tools reuse
//! the same code.
#![forbid(unsafe_code)]

pub mod core;
pub mod leader;
pub mod server;

// One wing per engine: its controller, its backup controller (`<engine>::backup`) and the
// programs its pods run; and the hosted Kubernetes control plane.
pub mod control_plane;
pub mod etcd;
pub mod kubernetes_cluster;
pub mod machine;
pub mod machine_deployment;
pub mod machine_set;
pub mod maintpage;
pub mod postgres;

/// Declares [`CONTROLLERS`], the list `noops run` runs from: each controller module exports
/// its [`core::controller::Registration`] as `CONTROLLER`.
macro_rules! controllers {
    ($($($segment:ident)::+),+ $(,)?) => {
        /// Every controller of the operator, in the order they start.
        pub const CONTROLLERS: &[&core::controller::Registration] = &[$(&$($segment::)+CONTROLLER),+];
    };
}

// Adding a controller is adding its module here.
controllers!(
    control_plane,
    etcd,
    etcd::backup,
    kubernetes_cluster,
    machine,
    machine_deployment,
    machine_set,
    maintpage,
    postgres,
    postgres::backup
);

/// The controller registered under `name`.
pub fn controller(name: &str) -> Option<&'static core::controller::Registration> {
    CONTROLLERS.iter().copied().find(|c| c.name == name)
}

/// Every CRD as one multi-document YAML text, as committed under `deploy/crds`.
pub fn crds_yaml() -> Result<String, String> {
    let mut out = String::new();
    for crd in noops_api::crds() {
        let yaml = serde_saphyr::to_string(&crd).map_err(|e| e.to_string())?;
        out.push_str("---\n");
        out.push_str(&yaml);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    /// The committed CRDs must be what the types generate: edit the types, then `make crds`.
    #[test]
    fn committed_crds_match_the_types() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds/noops.dev.yaml");
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        let generated = super::crds_yaml().unwrap();
        assert!(
            committed == generated,
            "{} is out of date: run `make crds` and commit the result",
            path.display()
        );
    }

    #[test]
    fn every_controller_has_a_distinct_name() {
        let mut names: Vec<&str> = super::CONTROLLERS.iter().map(|c| c.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), super::CONTROLLERS.len());
        assert!(super::controller("maintpage").is_some());
        assert!(super::controller("nope").is_none());
    }
}
