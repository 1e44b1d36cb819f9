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
//! The rules are client-go's:
//! - the holder renews three times per lease duration (an update with the version it last
//!   wrote, no read); a leader that has not renewed within two thirds of the lease duration
//!   steps down, and no request of it may outlast that deadline;
//! - a candidate takes a lease only once it has seen the lease record (holder and renew time)
//!   unchanged for the lease duration, by its own clock: clocks of replicas may differ, so the
//!   holder's `renewTime` is never compared with the local time;
//! - every write carries the resourceVersion read, so of two candidates racing for the same
//!   lease one gets a conflict and stays a follower;
//! - on a clean shutdown the leader gives the lease up, so the next one takes over at once.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::core::controller::Shutdown;

/// Timing of the election.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long a lease lasts without renewal.
    pub lease_duration: Duration,
    /// How often candidates look, and a leader retries a failed renewal.
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

impl Timing {
    /// A leader that has not renewed for this long steps down.
    pub fn renew_deadline(&self) -> Duration {
        self.lease_duration * 2 / 3
    }

    /// How long the controllers may take to stop once told to, before the process gives up on
    /// them (and exits without giving the lease up).
    pub fn stop_grace(&self) -> Duration {
        self.lease_duration / 4
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

/// Decides, from a lease as read, whether we may write it and how. `unchanged_for` is how long
/// this replica has seen the same holder and renew time. Pure.
pub fn next_lease(
    current: Option<&Lease>,
    identity: &str,
    timing: Timing,
    now: jiff::Timestamp,
    unchanged_for: Duration,
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
    let their_duration = spec
        .lease_duration_seconds
        .map(|s| Duration::from_secs(s.max(0) as u64))
        .unwrap_or(timing.lease_duration);
    if holder.is_empty() || unchanged_for >= their_duration {
        next.spec = Some(fresh(transitions + 1, None));
        Ok(next)
    } else {
        Err(Verdict::Following { holder })
    }
}

/// The record of a lease whose changes tell that its holder is alive.
type Record = (Option<String>, Option<MicroTime>);

fn record(lease: Option<&Lease>) -> Record {
    let spec = lease.and_then(|l| l.spec.as_ref());
    (
        spec.and_then(|s| s.holder_identity.clone()),
        spec.and_then(|s| s.renew_time.clone()),
    )
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
    /// The lease record as last read, and since when (by this replica's clock) it is so.
    observed: tokio::sync::Mutex<Option<(Record, Instant)>>,
}

impl Elector {
    pub fn new(client: Client, namespace: &str, name: &str, identity: String, timing: Timing) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            identity,
            timing,
            last_written: tokio::sync::Mutex::new(None),
            observed: tokio::sync::Mutex::new(None),
        }
    }

    /// This candidate's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Its timing.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// How long the lease record `current` has been as it is, as this replica saw it.
    async fn unchanged_for(&self, current: Option<&Lease>) -> Duration {
        let mut observed = self.observed.lock().await;
        let now = record(current);
        match observed.as_ref() {
            Some((seen, since)) if *seen == now => since.elapsed(),
            _ => {
                *observed = Some((now, Instant::now()));
                Duration::ZERO
            }
        }
    }

    /// One attempt to acquire or renew.
    pub async fn try_once(&self) -> kube::Result<Verdict> {
        let mut last_written = self.last_written.lock().await;
        let current = match last_written.take() {
            Some(ours) => Some(ours),
            // (Leader election is no engine: it reads its lease itself, as it must be now.)
            None => crate::core::confirm::get(&self.api, &self.name, "lease").await?,
        };
        let unchanged_for = self.unchanged_for(current.as_ref()).await;
        let next = match next_lease(
            current.as_ref(),
            &self.identity,
            self.timing,
            jiff::Timestamp::now(),
            unchanged_for,
        ) {
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
    /// renewed within the renew deadline (counted from when its last successful renewal was
    /// sent) publishes `false` and returns, well before another replica may take the lease:
    /// the caller must stop reconciling. No request of a leader outlasts that deadline. On
    /// `release` a leader gives the lease up; the caller flips it only after its controllers
    /// have stopped.
    pub async fn run(self, leading: watch::Sender<bool>, mut release: watch::Receiver<bool>) {
        let renew_deadline = self.timing.renew_deadline();
        let request_timeout = self.timing.lease_duration / 3;
        let mut last_renewal: Option<Instant> = None;
        let mut reported_holder = String::new();
        loop {
            let left = last_renewal.map(|t| renew_deadline.saturating_sub(t.elapsed()));
            if left == Some(Duration::ZERO) {
                warn!(lease = %self.name, "could not renew the lease in time; stepping down");
                let _ = leading.send(false);
                return;
            }
            let sent = Instant::now();
            let limit = left.map_or(request_timeout, |l| l.min(request_timeout));
            let renewed = match tokio::time::timeout(limit, self.try_once()).await {
                Ok(Ok(Verdict::Leading)) => {
                    if last_renewal.is_none() {
                        info!(lease = %self.name, identity = %self.identity, "became the leader");
                        let _ = leading.send(true);
                    }
                    last_renewal = Some(sent);
                    true
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
                    false
                }
                Ok(Err(e)) => {
                    warn!(lease = %self.name, error = %e, "leader election request failed");
                    false
                }
                Err(_) => {
                    warn!(lease = %self.name, timeout = ?limit, "leader election request timed out");
                    false
                }
            };
            // The leader renews three times per lease duration, retries a failed renewal
            // sooner, and never sleeps past its deadline; candidates look every retry period.
            let pause = match last_renewal {
                Some(t) if renewed => (self.timing.lease_duration / 3).min(renew_deadline.saturating_sub(t.elapsed())),
                Some(t) => self.timing.retry_period.min(renew_deadline.saturating_sub(t.elapsed())),
                None => self.timing.retry_period,
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
        let Ok(Some(mut lease)) = crate::core::confirm::get(&self.api, &self.name, "lease").await else {
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
    /// Asked to stop before ever leading.
    NeverLed,
    /// The lease was lost (or could not be renewed in time): the work was cancelled.
    LostLease,
    /// The controllers did not stop within the grace after being told to: the lease was kept
    /// (it expires), and the process must exit so that they end.
    StuckStopping,
    /// The controllers ended on their own; the lease was given up.
    WorkEnded,
    /// The election ended without a word (a bug): nothing ran.
    ElectionFailed,
}

/// Campaigns with `elector` (or leads at once without one), runs `work` while leading, and
/// returns once it has ended. `work` gets a [`Shutdown`] that fires on `stop`, and must return
/// within the stop grace after it fires; only then is the lease given up, so no other replica
/// starts before these controllers have stopped. When the lease is lost, `work` is dropped at
/// once: it must own what it runs (a `JoinSet`, not detached tasks), so that dropping it
/// cancels every reconcile in flight. `on_leading` hears
/// when leadership starts and ends (for the leader metric).
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
    let grace = elector
        .as_ref()
        .map_or(Duration::from_secs(30), |e| e.timing().stop_grace());
    let (leading_tx, mut leading) = watch::channel(elector.is_none());
    // Flipped once the work has ended: only then may the leader give the lease up.
    let (release_tx, release_rx) = watch::channel(false);
    // Without an election this replica leads for good: the sender stays here, unchanged. With
    // one, the campaign owns it; its end without a word is taken as a lost lease.
    let (campaign, _always_leading) = match elector {
        Some(e) => (Some(tokio::spawn(e.run(leading_tx, release_rx))), None),
        None => (None, Some(leading_tx)),
    };
    let release_and_wait = |campaign: Option<tokio::task::JoinHandle<()>>| async move {
        let _ = release_tx.send(true);
        if let Some(task) = campaign {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    };
    let led = tokio::select! {
        // A stop that has already come wins over a leadership that has too.
        biased;
        _ = stop.wait_for(|s| *s) => None,
        led = leading.wait_for(|l| *l) => Some(led.is_ok()),
    };
    match led {
        None => {
            // A request in flight may still take the lease: give it up if it did.
            release_and_wait(campaign).await;
            return Outcome::NeverLed;
        }
        Some(false) => return Outcome::ElectionFailed,
        Some(true) => {}
    }
    on_leading(true);
    let (halt_tx, mut halt_rx) = watch::channel(false);
    let watcher = tokio::spawn(async move {
        let lost = tokio::select! {
            _ = leading.wait_for(|l| !*l) => true,
            _ = stop.wait_for(|s| *s) => false,
        };
        let _ = halt_tx.send(true);
        lost
    });
    // Boxed, not pinned in place, so that it can be dropped early.
    let mut work = Box::pin(work(Shutdown::new(halt_rx.clone())));
    let work_done = tokio::select! {
        biased;
        _ = halt_rx.wait_for(|h| *h) => false,
        _ = &mut work => true,
    };
    // The work may end because the halt fired a moment ago: that is no end by itself.
    let ended_by_itself = work_done && !*halt_rx.borrow();
    if ended_by_itself {
        on_leading(false);
        watcher.abort();
        release_and_wait(campaign).await;
        return Outcome::WorkEnded;
    }
    // The watcher has fired the halt, so it has ended or is about to.
    let lost = watcher.await.unwrap_or(true);
    if lost {
        // Another replica may take the lease soon after its deadline: the work in flight is
        // cancelled now rather than awaited (a reconcile is safe to cut anywhere, as a crash).
        drop(work);
        on_leading(false);
        return Outcome::LostLease;
    }
    let stopped_in_time = work_done || tokio::time::timeout(grace, &mut work).await.is_ok();
    on_leading(false);
    if !stopped_in_time {
        warn!(grace = ?grace, "the controllers did not stop in time; keeping the lease until it expires");
        return Outcome::StuckStopping;
    }
    release_and_wait(campaign).await;
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

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_missing_lease_is_taken() {
        let lease = next_lease(None, "me", Timing::default(), at(100), Duration::ZERO).unwrap();
        assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("me"));
    }

    #[test]
    fn a_lease_of_another_is_respected_until_seen_unchanged_for_its_duration() {
        let lease = held_by("other", 100);
        let verdict = next_lease(Some(&lease), "me", Timing::default(), at(110), 10 * SECOND).unwrap_err();
        assert_eq!(verdict, Verdict::Following { holder: "other".into() });
        // Our clock far ahead of the holder's does not make its lease look expired.
        assert!(next_lease(Some(&lease), "me", Timing::default(), at(10_000), SECOND).is_err());
    }

    #[test]
    fn an_expired_lease_is_taken_over_with_the_version_read() {
        let lease = next_lease(
            Some(&held_by("other", 100)),
            "me",
            Timing::default(),
            at(116),
            15 * SECOND,
        )
        .unwrap();
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
        let lease = next_lease(
            Some(&held_by("me", 100)),
            "me",
            Timing::default(),
            at(105),
            Duration::ZERO,
        )
        .unwrap();
        let spec = lease.spec.unwrap();
        assert_eq!(spec.renew_time.unwrap().0, at(105));
        assert_eq!(spec.acquire_time.unwrap().0, at(100));
        assert_eq!(spec.lease_transitions, Some(3));
    }

    #[test]
    fn a_released_lease_is_free() {
        let mut released = held_by("other", 100);
        released.spec.as_mut().unwrap().holder_identity = None;
        assert!(next_lease(Some(&released), "me", Timing::default(), at(101), Duration::ZERO).is_ok());
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

    #[tokio::test]
    async fn work_that_ends_by_itself_or_will_not_stop_is_not_a_clean_end() {
        let (_stop_tx, stop) = watch::channel(false);
        let ended = run_while_leading(None, stop, |_| {}, |_| async {}).await;
        assert_eq!(ended, Outcome::WorkEnded);
        let (stop_tx, stop) = watch::channel(false);
        let _ = stop_tx.send(true);
        assert_eq!(
            run_while_leading(None, stop, |_| {}, |_| async {}).await,
            Outcome::NeverLed,
            "a stop before leading runs nothing"
        );
    }
}
