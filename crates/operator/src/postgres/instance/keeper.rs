//! The instance manager's side of the primary's lease (`postgres/lease.rs`): reading it, and
//! renewing it while this instance holds it. A task of its own, so that a read the API server
//! is slow to answer never delays the deadline the server runs to (`run.rs` keeps that timer).
//!
//! It reads the lease every second, and at once when a watch on the lease sees its holder
//! change: a primary released for a switchover steps down, and the replica handed the lease
//! promotes, without waiting for the next read (a switchover's write gap is mostly those
//! waits). Without the watch (not allowed, or broken) the reads alone keep every promise.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{PostParams, WatchEvent, WatchParams};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::postgres::failover;
use crate::postgres::lease::{self, RENEW_EVERY, REQUEST_TIMEOUT, Running, Seen, Step};
use crate::postgres::switchover::{self, Stopped};

/// The lease of this database, as this instance reaches it.
#[derive(Clone)]
pub struct Keeper {
    /// None without access to the API server (a pod without a token: a single instance).
    api: Option<Api<Lease>>,
    name: String,
    me: String,
}

/// What the keeper task tells the instance manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Told {
    /// This instance renewed the lease; the request was sent at `sent`. With `promote`, it
    /// was a replica the operator chose: it is to promote now.
    Renewed { sent: Instant, promote: bool },
    /// Whether the database has a lease now (one appeared, or went).
    Leased(bool),
    /// Stop the server: another instance holds the lease.
    Stop,
    /// Stop the server: its fence deadline passed (the lease could not be renewed in time).
    Fence,
    /// Step down for a switchover: the operator released the lease of this primary.
    StepDown,
    /// The lease passed from one instance to another (a failover): a replica follows the new
    /// primary now rather than once its stream from the old one times out.
    HolderChanged,
}

impl Keeper {
    /// The keeper of lease `name` in `namespace` for pod `me`: without either, or without a
    /// service account token, one that never finds a lease.
    pub async fn new(namespace: Option<&str>, name: &str, me: Option<&str>) -> Self {
        let api = match (namespace, me) {
            (Some(namespace), Some(_)) => match kube::Client::try_default().await {
                Ok(client) => Some(Api::namespaced(client, namespace)),
                Err(e) => {
                    warn!(error = %e, "no access to the API server: this instance cannot hold a primary's lease");
                    None
                }
            },
            _ => None,
        };
        Self {
            api,
            name: name.to_string(),
            me: me.unwrap_or_default().to_string(),
        }
    }

    pub fn me(&self) -> &str {
        &self.me
    }

    /// The lease as the API server has it now.
    pub async fn read(&self) -> (Seen, Option<Lease>) {
        let Some(api) = &self.api else {
            return (Seen::Absent, None);
        };
        // (The instance's own agent, no engine: its lease as the API server has it.)
        match tokio::time::timeout(REQUEST_TIMEOUT, crate::core::confirm::get(api, &self.name, "lease")).await {
            Ok(Ok(Some(lease))) => {
                let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
                (Seen::HeldBy(holder.filter(|h| !h.is_empty())), Some(lease))
            }
            Ok(Ok(None)) => (Seen::Absent, None),
            Ok(Err(kube::Error::Api(e))) if e.code == 403 => {
                warn!(message = %e.message, "not allowed to read the primary's lease");
                (Seen::Unreadable, None)
            }
            Ok(Err(_)) | Err(_) => (Seen::Unreadable, None),
        }
    }

    /// Renews `lease` (read just before: its resourceVersion is the precondition, so a holder
    /// the operator changed meanwhile is not written over). True if renewed.
    pub async fn renew(&self, mut lease: Lease) -> bool {
        let Some(api) = &self.api else { return false };
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
        let params = PostParams::default();
        let replace = api.replace(&self.name, &params, &lease);
        matches!(tokio::time::timeout(REQUEST_TIMEOUT, replace).await, Ok(Ok(_)))
    }

    /// Gives the lease up, if this instance holds it: its server has stopped, and the operator
    /// may promote a replica at once rather than wait for the lease to run out. Where the
    /// server's WAL ended goes with the release: after a clean stop, the operator promotes
    /// only a replica that has all of it.
    pub async fn release(&self, stopped: &Stopped) {
        let (Seen::HeldBy(Some(holder)), Some(lease)) = self.read().await else {
            return;
        };
        if holder != self.me {
            return;
        }
        let released = failover::given_up(&lease, &self.me, stopped);
        if let Some(api) = &self.api {
            let params = PostParams::default();
            let replace = api.replace(&self.name, &params, &released);
            if matches!(tokio::time::timeout(REQUEST_TIMEOUT, replace).await, Ok(Ok(_))) {
                info!(?stopped, "gave the primary's lease up: the server has stopped");
            }
        }
    }

    /// Writes on the lease where this instance's server, stepped down for a switchover, ended
    /// its WAL: the operator hands the lease over once the replica has received that far. Only
    /// while the lease still records this instance stepping down; tried again while the API
    /// server does not answer (the operator fails over if it hears nothing for a lease).
    pub async fn report_stopped(&self, stopped: &Stopped) {
        let Some(api) = &self.api else { return };
        for _ in 0..10 {
            let (seen, lease) = self.read().await;
            if let (Seen::HeldBy(None), Some(lease)) = (&seen, lease) {
                let ours = switchover::record(&lease).is_some_and(|r| r.from == self.me && r.stopped.is_none());
                if !ours {
                    info!("the lease no longer waits for this instance to step down: nothing to tell");
                    return;
                }
                let next = switchover::with_stopped(&lease, stopped);
                let params = PostParams::default();
                let replace = api.replace(&self.name, &params, &next);
                if matches!(tokio::time::timeout(REQUEST_TIMEOUT, replace).await, Ok(Ok(_))) {
                    info!(?stopped, "told the operator where the stepped-down server's WAL ends");
                    return;
                }
            } else if !matches!(seen, Seen::Unreadable) {
                info!(lease = ?seen, "the lease was handed on meanwhile: nothing to tell");
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        warn!(
            "could not tell the operator where the stepped-down server's WAL ends: it fails over once the lease runs out"
        );
    }

    /// Runs until `running` is dropped: reads the lease every second, renews it while this
    /// instance holds it, and tells what it found. `renewed`: when this instance last renewed
    /// it, if it did before the task started.
    pub async fn watch(
        self,
        running: watch::Receiver<Running>,
        answered: watch::Receiver<lease::Answers>,
        told: mpsc::Sender<Told>,
        mut renewed: Option<Instant>,
    ) {
        let mut said_silent = false;
        let mut leased = None;
        let mut holder: Option<String> = None;
        let mut tick = tokio::time::interval(RENEW_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (changed, mut holder_changed) = mpsc::channel(1);
        let changes = self
            .api
            .clone()
            .map(|api| tokio::spawn(holder_changes(api, self.name.clone(), changed)));
        let _stop_changes = AbortOnDrop(changes);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                Some(()) = holder_changed.recv() => {}
            }
            if running.has_changed().is_err() {
                return;
            }
            let now_running = *running.borrow();
            let (seen, lease) = self.read().await;
            let has = match seen {
                Seen::Absent => Some(false),
                Seen::HeldBy(_) => Some(true),
                Seen::Unreadable => leased,
            };
            if has != leased {
                leased = has;
                if told.send(Told::Leased(has.unwrap_or(false))).await.is_err() {
                    return;
                }
            }
            if let Seen::HeldBy(Some(now_held)) = &seen {
                let moved = holder.as_ref().is_some_and(|h| h != now_held) && *now_held != self.me;
                holder = Some(now_held.clone());
                if moved && told.send(Told::HolderChanged).await.is_err() {
                    return;
                }
            }
            let since = renewed.map(|r| r.elapsed());
            let silent = answered.borrow().silent();
            if silent != said_silent && now_running == Running::Primary {
                if silent {
                    warn!(after = ?lease::SILENT_AFTER, "the server does not answer: renewing the primary's lease no more, so that a replica takes over");
                } else {
                    info!("the server answers again");
                }
                said_silent = silent;
            }
            let step = lease::step(&self.me, now_running, &seen, since, leased.unwrap_or(false));
            let message = match lease::unless_silent(step, silent) {
                Step::Carry => None,
                step @ (Step::Renew | Step::RenewAndPromote) => {
                    let sent = Instant::now();
                    let done = match lease {
                        Some(lease) => self.renew(lease).await,
                        None => false,
                    };
                    done.then(|| {
                        renewed = Some(sent);
                        Told::Renewed {
                            sent,
                            promote: step == Step::RenewAndPromote,
                        }
                    })
                }
                Step::Stop => Some(Told::Stop),
                Step::Fence => Some(Told::Fence),
                Step::StepDown => Some(Told::StepDown),
            };
            if let Some(message) = message
                && told.send(message).await.is_err()
            {
                return;
            }
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// The holder of a lease event's object.
fn holder_of(lease: &Lease) -> Option<String> {
    lease.spec.as_ref()?.holder_identity.clone().filter(|h| !h.is_empty())
}

/// Tells `changed` whenever a watch on lease `name` sees its holder change (renewals, which
/// change only the renew time, tell nothing). Watches again from where it stopped, a second
/// after an error; gives up only when not allowed to watch (a Role of an older operator).
async fn holder_changes(api: Api<Lease>, name: String, changed: mpsc::Sender<()>) {
    let params = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(290);
    let mut version = "0".to_string();
    let mut holder: Option<Option<String>> = None;
    let mut refused = 0;
    while refused < 3 {
        let stream = match api.watch(&params, &version).await {
            Ok(stream) => stream,
            Err(e) => {
                if matches!(&e, kube::Error::Api(status) if status.code == 403) {
                    refused += 1;
                }
                debug!(error = %e, "cannot watch the primary's lease now: reading it every second meanwhile");
                version = "0".into();
                tokio::time::sleep(RENEW_EVERY).await;
                continue;
            }
        };
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let lease = match event {
                Ok(WatchEvent::Added(lease) | WatchEvent::Modified(lease) | WatchEvent::Deleted(lease)) => lease,
                Ok(WatchEvent::Bookmark(_)) => continue,
                // Gone (its version too old) or failed: watch again from the start.
                Ok(WatchEvent::Error(_)) | Err(_) => {
                    version = "0".into();
                    break;
                }
            };
            refused = 0;
            if let Some(v) = lease.metadata.resource_version.clone() {
                version = v;
            }
            let now = holder_of(&lease);
            if holder.as_ref().is_some_and(|h| *h != now) && changed.try_send(()).is_err() && changed.is_closed() {
                return;
            }
            holder = Some(now);
        }
        tokio::time::sleep(RENEW_EVERY).await;
    }
    warn!("not allowed to watch the primary's lease: reading it every second only");
}
