//! Leader election on a coordination.k8s.io Lease, so that of several replicas exactly one
//! reconciles and another takes over within the lease duration when the leader dies.
//! [`run_while_leading`] is the one entry point: it runs the controllers while this replica
//! leads and stops them before the lease is given up.
//!
//! Why not the `kube-lease-manager` crate (0.13, which builds against our kube): while the API
//! server cannot be reached, its leader keeps reporting that it leads, even after its lease has
//! expired and another replica has taken it, so two replicas would reconcile at once. Here a
//! leader that cannot renew steps down before its lease can expire; the end-to-end test
//! `a_leader_cut_off_from_the_api_server_steps_down_before_its_lease_expires` shows it.
//!
//! The rules are client-go's: the holder renews the lease three times per lease duration (an
//! update with the version it last wrote, no read), candidates look every `retry_period`; anyone may take
//! a lease whose `renewTime + leaseDurationSeconds` has passed; every write carries the
//! resourceVersion it read, so of two candidates racing for the same lease one gets a conflict
//! and stays a follower. A leader that cannot renew for the lease duration steps down. On a
//! clean shutdown the leader gives the lease up, so the next one takes over at once.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::core::controller::Shutdown;

/// Timing of the election.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long a lease lasts without renewal.
    pub lease_duration: Duration,
    /// How often the holder renews and candidates retry.
    pub retry_period: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What one attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// We hold the lease (acquired or renewed).
    Leading,
    /// Someone else holds a live lease.
    Following { holder: String },
}

/// Decides, from a lease as read, whether we may write it and how. Pure.
pub fn next_lease(
    current: Option<&Lease>,
    identity: &str,
    timing: Timing,
    now: jiff::Timestamp,
) -> Result<Lease, Verdict> {
    let duration_secs = timing.lease_duration.as_secs() as i32;
    let fresh = |transitions: i32, acquired: Option<MicroTime>| LeaseSpec {
        holder_identity: Some(identity.to_string()),
        lease_duration_seconds: Some(duration_secs),
        acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..Default::default()
    };
    let Some(lease) = current else {
        return Ok(Lease {
            metadata: ObjectMeta::default(),
            spec: Some(fresh(0, None)),
        });
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let transitions = spec.lease_transitions.unwrap_or(0);
    let mut next = lease.clone();
    if holder == identity {
        next.spec = Some(fresh(transitions, spec.acquire_time));
        return Ok(next);
    }
    let expires = spec.renew_time.map(|t| {
        t.0 + jiff::SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(duration_secs)))
    });
    let free = holder.is_empty() || expires.is_none_or(|e| e <= now);
    if free {
        next.spec = Some(fresh(transitions + 1, None));
        Ok(next)
    } else {
        Err(Verdict::Following { holder })
    }
}

/// A candidate for one lease.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    /// The lease as we last wrote it: while leading, renewals go straight to an update with
    /// its resourceVersion, without reading first (a conflict means someone else wrote it).
    last_written: tokio::sync::Mutex<Option<Lease>>,
}

impl Elector {
    pub fn new(client: Client, namespace: &str, name: &str, identity: String, timing: Timing) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            identity,
            timing,
            last_written: tokio::sync::Mutex::new(None),
        }
    }

    /// This candidate's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// One attempt to acquire or renew.
    pub async fn try_once(&self) -> kube::Result<Verdict> {
        let mut last_written = self.last_written.lock().await;
        let current = match last_written.take() {
            Some(ours) => Some(ours),
            None => self.api.get_opt(&self.name).await?,
        };
        let next = match next_lease(current.as_ref(), &self.identity, self.timing, jiff::Timestamp::now()) {
            Ok(lease) => lease,
            Err(verdict) => return Ok(verdict),
        };
        let result = match current {
            None => {
                let mut lease = next;
                lease.metadata.name = Some(self.name.clone());
                self.api.create(&PostParams::default(), &lease).await
            }
            // `next` keeps the resourceVersion we read: a concurrent writer makes this a 409.
            Some(_) => self.api.replace(&self.name, &PostParams::default(), &next).await,
        };
        match result {
            Ok(written) => {
                *last_written = Some(written);
                Ok(Verdict::Leading)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Verdict::Following {
                holder: "another candidate (lost a race)".into(),
            }),
            Err(e) => Err(e),
        }
    }

    /// Campaigns until `release` flips, publishing whether we lead. A leader that has not
    /// renewed within two thirds of the lease duration (counted from when its last successful
    /// renewal was sent) publishes `false` and returns, well before another replica may take the
    /// lease: the caller must stop reconciling. On `release` a leader gives the lease up; the
    /// caller flips it only after its controllers have stopped.
    pub async fn run(self, leading: watch::Sender<bool>, mut release: watch::Receiver<bool>) {
        let renew_deadline = self.timing.lease_duration * 2 / 3;
        let request_timeout = self.timing.lease_duration / 3;
        let mut last_renewal: Option<tokio::time::Instant> = None;
        let mut reported_holder = String::new();
        loop {
            let sent = tokio::time::Instant::now();
            let attempt = tokio::time::timeout(request_timeout, self.try_once()).await;
            match attempt {
                Ok(Ok(Verdict::Leading)) => {
                    if last_renewal.is_none() {
                        info!(lease = %self.name, identity = %self.identity, "became the leader");
                        let _ = leading.send(true);
                    }
                    last_renewal = Some(sent);
                }
                Ok(Ok(Verdict::Following { holder })) => {
                    if last_renewal.is_some() {
                        warn!(lease = %self.name, %holder, "lost the lease to another replica; stepping down");
                        let _ = leading.send(false);
                        return;
                    }
                    if holder != reported_holder {
                        info!(lease = %self.name, %holder, "standing by while another replica leads");
                        reported_holder = holder;
                    }
                }
                Ok(Err(e)) => warn!(lease = %self.name, error = %e, "leader election request failed"),
                Err(_) => warn!(lease = %self.name, timeout = ?request_timeout, "leader election request timed out"),
            }
            if last_renewal.is_some_and(|t| t.elapsed() >= renew_deadline) {
                warn!(lease = %self.name, "could not renew the lease in time; stepping down");
                let _ = leading.send(false);
                return;
            }
            // The leader renews three times per lease duration; candidates retry more often.
            let pause = if last_renewal.is_some() {
                self.timing.lease_duration / 3
            } else {
                self.timing.retry_period
            };
            let released = tokio::select! {
                _ = tokio::time::sleep(pause) => false,
                changed = release.changed() => changed.is_err() || *release.borrow(),
            };
            if released {
                if last_renewal.is_some() {
                    self.release().await;
                }
                return;
            }
        }
    }

    /// Gives the lease up (clean shutdown), so a standby takes over without waiting it out.
    async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else { return };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => info!(lease = %self.name, "released the lease"),
            Err(e) => warn!(lease = %self.name, error = %e, "failed to release the lease"),
        }
    }
}

/// How a leadership ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Asked to stop (SIGTERM): the controllers stopped, then the lease was given up.
    Stopped,
    /// The lease was lost (or could not be renewed in time): the controllers stopped.
    LostLease,
    /// Asked to stop before ever leading.
    NeverLed,
}

/// Campaigns with `elector` (or leads at once without one), runs `work` while leading, and
/// returns once it has ended. `work` gets a [`Shutdown`] that fires on `stop` or when the lease
/// is lost, and must return soon after it fires; only then is the lease given up, so no other
/// replica starts before these controllers have stopped. `on_leading` hears when leadership
/// starts and ends (for the leader metric).
pub async fn run_while_leading<W, Fut>(
    elector: Option<Elector>,
    mut stop: watch::Receiver<bool>,
    on_leading: impl Fn(bool),
    work: W,
) -> Outcome
where
    W: FnOnce(Shutdown) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (leading_tx, mut leading) = watch::channel(elector.is_none());
    // Flipped once the work has ended: only then may the leader give the lease up.
    let (release_tx, release_rx) = watch::channel(false);
    // Without an election this replica leads for good: the sender stays here, unchanged. With
    // one, the campaign owns it; its end without a word is taken as a lost lease.
    let (campaign, _always_leading) = match elector {
        Some(e) => (Some(tokio::spawn(e.run(leading_tx, release_rx))), None),
        None => (None, Some(leading_tx)),
    };
    tokio::select! {
        led = leading.wait_for(|l| *l) => if led.is_err() {
            // The campaign ended without ever leading (it cannot, short of a bug).
            return Outcome::NeverLed;
        },
        _ = stop.wait_for(|s| *s) => return Outcome::NeverLed,
    }
    on_leading(true);
    let (halt_tx, halt_rx) = watch::channel(false);
    let watcher = tokio::spawn(async move {
        let lost = tokio::select! {
            _ = leading.wait_for(|l| !*l) => true,
            _ = stop.wait_for(|s| *s) => false,
        };
        let _ = halt_tx.send(true);
        lost
    });
    work(Shutdown::new(halt_rx)).await;
    on_leading(false);
    // If the work ended by itself, nothing fired the watcher: end it as a stop.
    watcher.abort();
    let lost = watcher.await.unwrap_or(false);
    if lost {
        return Outcome::LostLease;
    }
    let _ = release_tx.send(true);
    if let Some(task) = campaign {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    Outcome::Stopped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(secs).unwrap()
    }

    fn held_by(holder: &str, renewed: i64) -> Lease {
        Lease {
            metadata: ObjectMeta {
                resource_version: Some("7".into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(at(renewed))),
                acquire_time: Some(MicroTime(at(renewed))),
                lease_transitions: Some(3),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_missing_lease_is_taken() {
        let lease = next_lease(None, "me", Timing::default(), at(100)).unwrap();
        assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("me"));
    }

    #[test]
    fn a_live_lease_of_another_is_respected() {
        let verdict = next_lease(Some(&held_by("other", 100)), "me", Timing::default(), at(110)).unwrap_err();
        assert_eq!(verdict, Verdict::Following { holder: "other".into() });
    }

    #[test]
    fn an_expired_lease_is_taken_over_with_the_version_read() {
        let lease = next_lease(Some(&held_by("other", 100)), "me", Timing::default(), at(116)).unwrap();
        let spec = lease.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(
            lease.metadata.resource_version.as_deref(),
            Some("7"),
            "optimistic concurrency"
        );
    }

    #[test]
    fn our_own_lease_is_renewed_keeping_the_acquire_time() {
        let lease = next_lease(Some(&held_by("me", 100)), "me", Timing::default(), at(105)).unwrap();
        let spec = lease.spec.unwrap();
        assert_eq!(spec.renew_time.unwrap().0, at(105));
        assert_eq!(spec.acquire_time.unwrap().0, at(100));
        assert_eq!(spec.lease_transitions, Some(3));
    }

    #[tokio::test]
    async fn without_an_election_the_work_runs_until_stopped() {
        let (stop_tx, stop) = watch::channel(false);
        let led = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
        let record = led.clone();
        let run = tokio::spawn(run_while_leading(
            None,
            stop,
            move |l| record.lock().unwrap().push(l),
            |shutdown| async move { shutdown.fired().await },
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!run.is_finished(), "the work runs while leading");
        let _ = stop_tx.send(true);
        assert_eq!(run.await.unwrap(), Outcome::Stopped);
        assert_eq!(*led.lock().unwrap(), vec![true, false]);
    }

    #[test]
    fn a_released_lease_is_free() {
        let mut released = held_by("other", 100);
        released.spec.as_mut().unwrap().holder_identity = None;
        assert!(next_lease(Some(&released), "me", Timing::default(), at(101)).is_ok());
    }
}
