//! A growing back-off per object: kube-runtime requeues failures at a fixed delay unless told
//! otherwise, so the failure count of each object is kept here and reset on success.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Failure counts per object key (`namespace/name`).
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(300))
    }
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Records a failure of `key` and returns how long to wait before the next try.
    pub fn failed(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = failures.entry(key.to_string()).or_insert(0);
        let delay = self.initial.saturating_mul(2u32.saturating_pow(*n)).min(self.max);
        *n = n.saturating_add(1);
        delay
    }

    /// Forgets the failures of `key` after a successful reconcile.
    pub fn succeeded(&self, key: &str) {
        self.failures.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_caps_and_resets() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let delays: Vec<u64> = (0..5).map(|_| b.failed("ns/a").as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 5, 5]);
        assert_eq!(b.failed("ns/b").as_secs(), 1, "per object");
        b.succeeded("ns/a");
        assert_eq!(b.failed("ns/a").as_secs(), 1);
    }
}
