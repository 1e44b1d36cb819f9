//! How long each primary's lease has gone unchanged, as this operator has seen it, on its own
//! clock (the renewal times the instances write are not compared across clocks), and a wake-up
//! for a database whose lease ran out or was given up. A renewal, every second, wakes nobody:
//! a pass of the database follows only when the lease's time is up.
//!
//! Kept in memory: an operator that starts anew has seen no change yet and counts every lease
//! as fresh, so it may fail over no sooner than a whole lease after it started (never sooner
//! than it safely could).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::ObjectRef;
use noops_api::PostgreSQL;

use super::account::holder;
use super::lease::LEASE;
use super::names::POSTGRES_LABEL;
use crate::core::cache::Changes;

/// A database to look at again.
pub type Wake = ObjectRef<DeserializeGuard<PostgreSQL>>;

/// How often the clock looks for leases whose time is up.
const TICK: Duration = Duration::from_millis(250);

/// One lease as last seen.
struct Seen {
    version: String,
    since: Instant,
    /// The database it is of (its label), to wake.
    database: Wake,
    /// Its database was woken for this version already.
    woken: bool,
}

/// The leases' clock.
#[derive(Clone, Default)]
pub struct LeaseClock {
    seen: Arc<Mutex<HashMap<(String, String), Seen>>>,
}

impl LeaseClock {
    /// Follows the lease cache's `changes`; returns the clock and the databases to wake.
    pub fn start(mut changes: Changes<Lease>) -> (Self, mpsc::UnboundedReceiver<Wake>) {
        let clock = Self::default();
        let (wake, woken) = mpsc::unbounded();
        let seen = clock.seen.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            loop {
                tokio::select! {
                    change = changes.next() => {
                        let Some(lease) = change else { return };
                        let Some(database) = lease.labels().get(POSTGRES_LABEL).cloned() else { continue };
                        let namespace = lease.namespace().unwrap_or_default();
                        let key = (namespace.clone(), lease.name_any());
                        let version = lease.resource_version().unwrap_or_default();
                        let given_up = holder(&lease).is_none();
                        let mut seen = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        let changed = seen.get(&key).is_none_or(|s| s.version != version);
                        if changed {
                            seen.insert(key, Seen {
                                version,
                                since: Instant::now(),
                                database: ObjectRef::new(&database).within(&namespace),
                                woken: given_up,
                            });
                            if given_up && wake.unbounded_send(ObjectRef::new(&database).within(&namespace)).is_err() {
                                return;
                            }
                        }
                    }
                    _ = tick.tick() => {
                        let mut seen = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        for s in seen.values_mut().filter(|s| !s.woken && s.since.elapsed() >= LEASE) {
                            s.woken = true;
                            if wake.unbounded_send(s.database.clone()).is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        });
        (clock, woken)
    }

    /// How long lease `name` in `namespace` has gone unchanged: none if this operator has not
    /// seen it yet.
    pub fn unchanged_for(&self, namespace: &str, name: &str, version: Option<&str>) -> Option<Duration> {
        let seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let s = seen.get(&(namespace.to_string(), name.to_string()))?;
        // The cache may hold a version the clock has not been told of yet: that is a change.
        (version.is_none_or(|v| v == s.version)).then(|| s.since.elapsed())
    }
}
