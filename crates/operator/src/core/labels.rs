//! The labels on everything the operator makes: the recommended `app.kubernetes.io` set, so
//! that `kubectl get all -l app.kubernetes.io/managed-by=noops` lists it, and so that the watch
//! caches of the controllers hold only the operator's own objects.

use std::collections::BTreeMap;

/// The application (for MaintPage, the app's name).
pub const NAME: &str = "app.kubernetes.io/name";
/// The part of the application (a side, a member, a backup job).
pub const COMPONENT: &str = "app.kubernetes.io/component";
/// Who manages the object.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY`] on everything noops makes.
pub const MANAGER: &str = "noops";

/// The label selector of everything noops makes (for watches and `kubectl get -l`).
pub fn managed_by_noops() -> String {
    format!("{MANAGED_BY}={MANAGER}")
}

/// The labels of a child object: the application `name`, managed by noops, the owning
/// resource (`owner_key` = the owner's name, e.g. `noops.dev/maintpage=shop`), and its
/// `component` if it is one part of several.
pub fn child(name: &str, owner_key: &str, owner_name: &str, component: Option<&str>) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (NAME.to_string(), name.to_string()),
        (MANAGED_BY.to_string(), MANAGER.to_string()),
        (owner_key.to_string(), owner_name.to_string()),
    ]);
    if let Some(component) = component {
        labels.insert(COMPONENT.to_string(), component.to_string());
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_carry_the_recommended_labels_and_their_owner() {
        let labels = child("shop", "noops.dev/maintpage", "front", Some("app"));
        assert_eq!(labels[NAME], "shop");
        assert_eq!(labels[MANAGED_BY], "noops");
        assert_eq!(labels["noops.dev/maintpage"], "front");
        assert_eq!(labels[COMPONENT], "app");
        assert!(!child("shop", "noops.dev/maintpage", "front", None).contains_key(COMPONENT));
        assert_eq!(managed_by_noops(), "app.kubernetes.io/managed-by=noops");
    }
}
