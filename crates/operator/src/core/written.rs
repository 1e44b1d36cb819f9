//! What a controller's passes wrote that its cache has not shown yet.
//!
//! A pass reads its object from the watch cache. When a pass has written the object's status,
//! the cache holds the version it wrote over until the watch brings the write, and a pass that
//! starts meanwhile (woken by a child) would decide on what the last pass already changed: do
//! the same work again, or write a status over the newer one. The core skips such a pass
//! instead ([`Written::behind`]); the write's own watch event wakes the next one. A pass that
//! writes its status more than once (a backup says Running, takes the snapshot, then says
//! Succeeded) wrote over each version in between as well: the cache is behind while it holds
//! any of them. This is what lets a pass trust its cache for its last status rather than read
//! its object again from the API server.
//!
//! Only a hint kept in memory: a restarted operator starts with fresh caches, which hold every
//! write made before.

use std::collections::HashMap;
use std::sync::Mutex;

/// By object (`namespace/name`), the versions passes of this controller wrote over.
#[derive(Default)]
pub struct Written {
    over: Mutex<HashMap<String, Vec<String>>>,
}

impl Written {
    /// A pass wrote object `key` over version `before` (what it read, or what its last write
    /// left), and the API server answered with version `after`.
    pub fn wrote(&self, key: &str, before: Option<&str>, after: Option<&str>) {
        if let (Some(before), Some(after)) = (before, after)
            && before != after
        {
            let mut over = self.lock();
            let versions = over.entry(key.to_string()).or_default();
            if !versions.iter().any(|v| v == before) {
                versions.push(before.to_string());
            }
        }
    }

    /// Whether the cache still holds a version of object `key` that a pass has written over.
    /// Once the cache has moved past them, the object is forgotten.
    pub fn behind(&self, key: &str, version: Option<&str>) -> bool {
        let mut over = self.lock();
        let Some(versions) = over.get(key) else {
            return false;
        };
        if version.is_some_and(|version| versions.iter().any(|v| v == version)) {
            return true;
        }
        over.remove(key);
        false
    }

    /// The map; a pass that panicked while holding it left nothing half-written (one insert
    /// or remove), so it is used as it is.
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<String>>> {
        self.over.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The key of an object in [`Written`]: `namespace/name`.
pub fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_over_the_version_written_over_is_behind_until_the_cache_moves_on() {
        let written = Written::default();
        assert!(!written.behind("db/main", Some("10")), "nothing written yet");
        written.wrote("db/main", Some("10"), Some("11"));
        assert!(written.behind("db/main", Some("10")));
        assert!(written.behind("db/main", Some("10")), "still the cache's version");
        assert!(!written.behind("db/other", Some("10")), "another object");
        assert!(!written.behind("db/main", Some("11")), "the cache holds the write");
        assert!(!written.behind("db/main", Some("10")), "forgotten once seen past");
    }

    #[test]
    fn every_version_a_pass_wrote_over_is_behind() {
        let written = Written::default();
        // Read at 10, Running written (11), then Succeeded written over 11 (12).
        written.wrote("db/nightly", Some("10"), Some("11"));
        written.wrote("db/nightly", Some("11"), Some("12"));
        assert!(written.behind("db/nightly", Some("10")));
        assert!(
            written.behind("db/nightly", Some("11")),
            "the first write is not the last word"
        );
        assert!(!written.behind("db/nightly", Some("12")));
        assert!(!written.behind("db/nightly", Some("11")), "forgotten once seen past");
    }

    #[test]
    fn a_write_that_changed_nothing_or_has_no_version_is_not_waited_for() {
        let written = Written::default();
        written.wrote("db/main", Some("10"), Some("10"));
        assert!(!written.behind("db/main", Some("10")), "no new version comes for it");
        written.wrote("db/main", None, Some("11"));
        assert!(!written.behind("db/main", None));
        written.wrote("db/main", Some("12"), Some("13"));
        assert!(
            !written.behind("db/main", None),
            "an object without a version is not the one written over"
        );
    }
}
