//! Whether the spec can be carried out against what was observed. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use noops_api::maintpage::MaintPage;

use super::observe::Live;
use crate::core::apply::controlled_by;
use crate::core::{Error, Result};

/// Refuses to take over objects that exist but belong to someone else: applying over them
/// would break whatever they serve.
pub fn validate(mp: &MaintPage, live: &Live) -> Result<()> {
    let uid = mp.uid().unwrap_or_default();
    let found: [(&'static str, Option<&ObjectMeta>); 3] = [
        ("Deployment", live.app.as_ref().map(|d| &d.metadata)),
        ("Deployment", live.maintenance.as_ref().map(|d| &d.metadata)),
        ("Service", live.service.as_ref().map(|s| &s.metadata)),
    ];
    for (kind, meta) in found {
        if let Some(meta) = meta.filter(|m| !controlled_by(m, &uid)) {
            return Err(Error::NameConflict {
                kind,
                name: meta.name.clone().unwrap_or_default(),
                owner: "MaintPage",
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fixtures::deployment;
    use crate::maintpage::fixtures;

    #[test]
    fn objects_of_others_with_our_names_are_refused() {
        let mp = fixtures::maintpage().build();
        assert!(validate(&mp, &Live::default()).is_ok(), "nothing there yet");
        let ours = Live {
            app: Some(deployment("shop").owned_by(&fixtures::owner()).build()),
            ..Default::default()
        };
        assert!(validate(&mp, &ours).is_ok());
        let theirs = Live {
            app: Some(deployment("shop").build()),
            ..Default::default()
        };
        let error = validate(&mp, &theirs).unwrap_err();
        assert_eq!(error.reason(), "NameConflict");
        assert!(
            error.to_string().contains("Deployment \"shop\" already exists"),
            "{error}"
        );
    }
}
