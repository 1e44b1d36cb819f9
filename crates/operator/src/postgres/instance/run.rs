//! The PostgreSQL container (`noops pg-instance run`): decides what the instance starts as,
//! prepares its data directory for that, runs the server as a child with the settings the
//! operator owns, and, under the primary's lease (`postgres/lease.rs`), stops it the moment
//! the lease says so; then decides again.
//!
//! - What it starts as: a single instance, as the plan says; under a lease, only what the
//!   lease says, and a primary only once it has renewed the lease itself (so that the
//!   operator, seeing the renewal, cannot be promoting another meanwhile). While the lease
//!   cannot be read or nobody holds it, nothing starts: a partitioned old primary stays down.
//! - A primary stops its server at once (immediate shutdown: no commit after it) when it has
//!   not renewed the lease for `FENCE_AFTER`, or when another instance holds it; a replica the
//!   operator chose (it finds itself the holder) renews the lease and promotes.
//! - A primary renews only while its server answers (a connection and a query over its socket
//!   every second): a server that hangs (a stopped or stuck process) reaches its deadline like
//!   a cut-off one, and is killed whole then (the postmaster and
//!   every child: a stopped process would not act on a request to stop, and could acknowledge
//!   a commit when it resumes).
//! - A primary whose lease the operator released (a switchover, `switchover.rs`) shuts its
//!   server down cleanly (its WAL senders send the replicas every record first), writes on the
//!   lease where its WAL ended, and waits for the lease to say what it is next.
//! - A replica that sees the lease pass to another instance ends its stream from the old
//!   primary at once and follows the new one through `<name>-rw` (a primary whose node stopped
//!   never resets that stream: it would last until `wal_receiver_timeout`).
//! - A former primary starts again as a replica: rewound to the new primary's timeline
//!   (`replica.rs`), or copied anew when it cannot be.
//! - The pod's stop (SIGTERM, or SIGINT: the official image's STOPSIGNAL, which a container
//!   runtime sends instead, and which PID 1 would otherwise ignore) is a fast shutdown (open transactions rolled back), not the smart one
//!   that waits for every client to leave; a primary then gives its lease up, saying where its
//!   WAL ended, so that the operator promotes at once a replica that has all of it.
//! - A server of an earlier pod still running on the data directory (a pod force-deleted, its
//!   processes not gone yet) is waited for rather than met by a second postmaster.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::keeper::{Keeper, Told};
use super::{
    DataDir, InstanceError, Settings, bootstrap, clear_socket_folder, control, io, replica, server_args, signal_server,
    system_identifier, write_hba,
};
use crate::postgres::lease::{self, FENCE_AFTER, KILL_WITHIN, RENEW_EVERY, Running, Start};
use crate::postgres::restore::InstancePlan;
use crate::postgres::sql::Instance;
use crate::postgres::switchover::{STEP_DOWN_WITHIN, Stopped};

/// How long a replica may stream and replay nothing before it checks whether it was left
/// behind on an old timeline.
const PARTED_AFTER: Duration = Duration::from_secs(15);

/// How the server ended.
enum Ended {
    /// It exited (the pod is stopping, or it failed): the container ends with it.
    Exited(ExitStatus),
    /// The lease stopped it: decide again what this instance is.
    Stopped,
    /// It stepped down for a switchover: say where its WAL ended, then decide again (or end,
    /// if the pod is stopping).
    SteppedDown,
}

/// Runs the instance until the server exits; returns its exit status. The data directory is
/// made (or restored, or copied) by the pod's init container; if it is not there, it is made
/// here.
pub async fn run(settings: &Settings) -> Result<ExitStatus, InstanceError> {
    match DataDir::at(&settings.pgdata)? {
        DataDir::Database => info!(pgdata = %settings.pgdata.display(), "starting on the database in the volume"),
        DataDir::Foreign => return Err(InstanceError::Foreign(settings.pgdata.clone())),
        DataDir::Empty => {
            warn!(pgdata = %settings.pgdata.display(), "no database in the volume: the init container did not make one");
            bootstrap::bootstrap(settings).await?;
        }
    }
    std::fs::create_dir_all(&settings.socket_dir).map_err(io(format!("making {}", settings.socket_dir.display())))?;
    clear_socket_folder(&settings.socket_dir)?;
    // A plan the pod cannot read (a database made before replicas) is a single instance's.
    let plan = bootstrap::read_plan(&settings.plan_file).unwrap_or_default();
    let lease_name = settings.lease.clone().unwrap_or_default();
    let keeper = Keeper::new(settings.namespace.as_deref(), &lease_name, settings.pod_name.as_deref()).await;
    let mut terminate = StopSignals::listen()?;
    loop {
        let decided = tokio::select! {
            decided = decide(settings, &plan, &keeper) => decided,
            _ = terminate.recv() => return Ok(ExitStatus::from_raw(0)),
        };
        let (mut running, renewed) = decided;
        if running == Running::Replica {
            replica::prepare(settings, &plan).await?;
        } else if settings.pgdata.join("standby.signal").exists() {
            // Chosen while a replica, and restarted before it promoted: it starts in standby
            // and promotes as soon as it has renewed the lease.
            info!(
                "this instance holds the primary's lease but has not promoted yet: starting in standby, then promoting"
            );
            running = Running::Replica;
        }
        write_hba(&settings.pgdata)?;
        let system_id = system_identifier(&settings.pgdata)?;
        let mut args = server_args(settings, &settings.pgdata, &system_id);
        if running == Running::Replica
            && let (Some(host), Some(pod)) = (&plan.primary_host, &settings.pod_name)
        {
            replica::write_passfile(settings)?;
            for (name, value) in replica::standby_settings(settings, host, pod) {
                args.push("-c".into());
                args.push(format!("{name}={value}"));
            }
        }
        wait_for_an_old_server(&settings.pgdata).await;
        let leased = plan.lease.is_some();
        let follows = plan.primary_host.clone().filter(|_| running == Running::Replica);
        match serve(
            settings,
            args,
            (running, renewed, leased),
            follows,
            &keeper,
            &mut terminate,
        )
        .await?
        {
            Ended::Exited(status) => return Ok(status),
            Ended::Stopped | Ended::SteppedDown => {
                info!("the server is stopped: deciding again what this instance is")
            }
        }
    }
}

/// What this instance starts as, and when it renewed the lease if it starts as the primary
/// under one. Waits while the lease cannot say.
async fn decide(settings: &Settings, plan: &InstancePlan, keeper: &Keeper) -> (Running, Option<Instant>) {
    let plan_primary = plan
        .primary
        .as_deref()
        .is_none_or(|p| Some(p) == settings.pod_name.as_deref());
    let leased = plan.lease.is_some();
    let mut said = None::<Instant>;
    loop {
        let (seen, lease) = keeper.read().await;
        match lease::start(keeper.me(), leased, &seen, plan_primary) {
            Start::Primary => match lease {
                Some(lease) => {
                    let sent = Instant::now();
                    if keeper.renew(lease).await {
                        info!("this instance holds the primary's lease: starting as the primary");
                        return (Running::Primary, Some(sent));
                    }
                }
                None => return (Running::Primary, None),
            },
            Start::Replica => return (Running::Replica, None),
            Start::Wait => {
                if said.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    info!(lease = ?seen, "waiting for the primary's lease to say what this instance is");
                    said = Some(Instant::now());
                }
            }
        }
        tokio::time::sleep(RENEW_EVERY).await;
    }
}

/// Runs the server with `args` until it exits or the lease stops it. `at_start`: what it
/// runs as, when it last renewed the lease, whether the database has one. `follows`: the
/// primary a replica streams from.
async fn serve(
    settings: &Settings,
    args: Vec<String>,
    at_start: (Running, Option<Instant>, bool),
    follows: Option<String>,
    keeper: &Keeper,
    terminate: &mut StopSignals,
) -> Result<Ended, InstanceError> {
    let (mut running, renewed, mut leased) = at_start;
    let mut server = Command::new("postgres")
        .args(args)
        .spawn()
        .map_err(io("starting postgres"))?;
    if settings.archive.is_some() && running == Running::Primary {
        tokio::spawn(checkpoint_once_primary(settings.socket_dir.clone()));
    }
    let mut watchers = Watchers::start(settings, keeper, running, renewed, follows);
    let mut deadline = renewed.map(|r| r + FENCE_AFTER);
    let mut stopping = false;
    // When a step-down for a switchover began; whether the pod is stopping.
    let mut stepping_down = None::<Instant>;
    let mut terminated = false;
    let mut hung = false;
    let ended = loop {
        let fenced = deadline.filter(|_| leased && running == Running::Primary && !stopping);
        tokio::select! {
            status = server.wait() => {
                let status = status.map_err(io("waiting for postgres"))?;
                break if stepping_down.is_some() { Ended::SteppedDown } else { Ended::Exited(status) };
            }
            _ = terminate.recv() => {
                info!("the pod is stopping: shutting the server down (fast)");
                signal_server(&server, nix::sys::signal::Signal::SIGINT);
                stopping = true;
                // The pod is going: the container ends with the server (a step-down under
                // way still says where its WAL ended first).
                terminated = true;
            }
            _ = sleep_until(stepping_down.map(|at| at + STEP_DOWN_WITHIN)) => {
                warn!(within = ?STEP_DOWN_WITHIN, "the server did not shut down cleanly in time for the switchover: stopping it now; the switchover is given back to this instance");
                stop_now(&mut server).await;
                break Ended::SteppedDown;
            }
            _ = sleep_until(fenced) => {
                // Read, and its lock let go, before the server is stopped.
                let silent = watchers.answered.borrow().silent();
                hung = fence(&mut server, silent).await;
                break Ended::Stopped;
            }
            Some(()) = watchers.parted.recv(), if running == Running::Replica && !stopping => {
                warn!("this replica has not streamed for a while and the primary is on a later timeline: stopping it to rewind");
                stop_now(&mut server).await;
                break Ended::Stopped;
            }
            message = watchers.told.recv() => match message {
                Some(Told::Renewed { sent, promote }) => {
                    deadline = Some(sent + FENCE_AFTER);
                    if promote && running == Running::Replica {
                        watchers.promoted(settings).await?;
                        running = Running::Primary;
                    }
                }
                Some(Told::Leased(now_leased)) => leased = now_leased,
                Some(Told::HolderChanged) if running == Running::Replica && !stopping => {
                    info!("the primary's lease passed to another instance: reconnecting to follow the new primary");
                    tokio::spawn(follow_anew(settings.socket_dir.clone()));
                }
                Some(Told::StepDown) if running == Running::Primary && !stopping => {
                    info!("the operator released the primary's lease for a switchover: shutting the server down cleanly, so that the replicas receive all of its WAL");
                    signal_server(&server, nix::sys::signal::Signal::SIGINT);
                    stopping = true;
                    stepping_down = Some(Instant::now());
                }
                // Another instance holds the lease (also while a step-down is slow): at once.
                Some(Told::Stop) if running == Running::Primary && (!stopping || stepping_down.is_some()) => {
                    warn!("another instance holds the primary's lease: stopping the server now; it starts again as a replica");
                    stop_now(&mut server).await;
                    break Ended::Stopped;
                }
                // Its deadline passed (the lease could not be read in time). A server stepping
                // down is stopping already, within its own bound, and says where it ended.
                Some(Told::Fence) if running == Running::Primary && !stopping => {
                    warn!("could not read the primary's lease past the fence deadline: stopping the server now, so that it takes no commit a failover could lose");
                    stop_now(&mut server).await;
                    break Ended::Stopped;
                }
                _ => {}
            }
        }
    };
    watchers.stop();
    let how = HowItEnded {
        running,
        leased,
        hung,
        terminated,
    };
    Ok(wind_up(settings, keeper, ended, how).await)
}

/// What watches a running server beside it: whether it answers, the lease (through the
/// keeper), and for a replica whether it was left behind on an old timeline.
struct Watchers {
    /// What the server runs as, for the watchers.
    role: watch::Sender<Running>,
    /// Whether the server answers its probes.
    answered: watch::Receiver<lease::Answers>,
    /// What the lease tells.
    told: mpsc::Receiver<Told>,
    /// The replica's stream has parted from a primary on a later timeline.
    parted: mpsc::Receiver<()>,
    probing: tokio::task::JoinHandle<()>,
    watching: tokio::task::JoinHandle<()>,
    following: Option<tokio::task::JoinHandle<()>>,
}

impl Watchers {
    fn start(
        settings: &Settings,
        keeper: &Keeper,
        running: Running,
        renewed: Option<Instant>,
        follows: Option<String>,
    ) -> Self {
        let (role, role_seen) = watch::channel(running);
        let (answered_tx, answered) = watch::channel(lease::Answers::default());
        let probing = tokio::spawn(look_at_the_primary(
            settings.socket_dir.clone(),
            role_seen.clone(),
            answered_tx,
        ));
        let (told_tx, told) = mpsc::channel(8);
        let watching = tokio::spawn(keeper.clone().watch(role_seen, answered.clone(), told_tx, renewed));
        let (parted_tx, parted) = mpsc::channel(1);
        let following = follows.map(|host| tokio::spawn(watch_the_timeline(settings.clone(), host, parted_tx)));
        Self {
            role,
            answered,
            told,
            parted,
            probing,
            watching,
            following,
        }
    }

    /// Promotes this replica the operator chose: the server, then what watches its role; a
    /// primary follows nobody, so the rejoin check ends.
    async fn promoted(&self, settings: &Settings) -> Result<(), InstanceError> {
        info!("the operator chose this replica: promoting it");
        promote_server(&settings.socket_dir).await?;
        let _ = self.role.send(Running::Primary);
        info!("promoted: this instance is the primary");
        if let Some(task) = &self.following {
            task.abort();
        }
        // Its new timeline is in its control file only after a checkpoint: a former primary
        // cannot rewind to it before.
        tokio::spawn(checkpoint_once_primary(settings.socket_dir.clone()));
        Ok(())
    }

    fn stop(self) {
        self.watching.abort();
        self.probing.abort();
        if let Some(task) = self.following {
            task.abort();
        }
    }
}

/// The primary's lease was not renewed in time: the server is stopped now, so that it takes no
/// commit a failover could lose; killed whole if it does not answer (`silent`). True if killed.
async fn fence(server: &mut Child, silent: bool) -> bool {
    if silent {
        warn!(deadline = ?FENCE_AFTER, "the server has not answered, so the primary's lease was not renewed: killing every process of the server now, so that it takes no commit a failover could lose");
        kill_now(server).await;
    } else {
        warn!(deadline = ?FENCE_AFTER, "could not renew the primary's lease in time: stopping the server now, so that it takes no commit a failover could lose");
        stop_now(server).await;
    }
    silent
}

/// Where the server stood when it ended.
struct HowItEnded {
    running: Running,
    /// The database has a lease (it is not a first start with none yet).
    leased: bool,
    /// The server was killed for not answering: the lease is given up, so that a replica takes
    /// over at once rather than this instance starting again as the primary on what may be a
    /// sick volume.
    hung: bool,
    /// The pod is stopping.
    terminated: bool,
}

/// After the server ended: a primary that held the lease and exited (or hung) gives the lease
/// up with where its WAL ended; a step-down says where its WAL ended; a stopping pod's
/// container ends whatever stopped the server.
async fn wind_up(settings: &Settings, keeper: &Keeper, ended: Ended, how: HowItEnded) -> Ended {
    let HowItEnded {
        running,
        leased,
        hung,
        terminated,
    } = how;
    if (matches!(ended, Ended::Exited(_)) || hung) && running == Running::Primary && leased {
        // A server killed because it hung may have written past its last checkpoint.
        let stopped = match control::read(&settings.pgdata).await {
            Some(text) if !hung => control::stopped(&text),
            _ => Stopped::Unclean,
        };
        keeper.release(&stopped).await;
    }
    // The pod is going: whatever stopped the server, the container ends.
    if terminated && matches!(ended, Ended::Stopped) {
        return Ended::Exited(ExitStatus::from_raw(0));
    }
    if matches!(ended, Ended::SteppedDown) {
        let stopped = match control::read(&settings.pgdata).await {
            Some(text) => control::stopped(&text),
            None => Stopped::Unclean,
        };
        info!(?stopped, "the server stepped down for a switchover");
        keeper.report_stopped(&stopped).await;
        return if terminated {
            Ended::Exited(ExitStatus::from_raw(0))
        } else {
            Ended::Stopped
        };
    }
    ended
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Stops the server at once (an immediate shutdown: every backend ends, no commit after it;
/// it recovers from its WAL at its next start), killing it if it lingers.
async fn stop_now(server: &mut Child) {
    signal_server(server, nix::sys::signal::Signal::SIGQUIT);
    if tokio::time::timeout(KILL_WITHIN, server.wait()).await.is_err() {
        kill_now(server).await;
    }
}

/// Kills every process of the server, stopped ones included: the postmaster and its children
/// (each of which PostgreSQL puts in a session of its own, so no process group holds them
/// all), all before waiting for any (a postmaster stuck in the kernel may take long to go, and
/// its children must not outlive the kill meanwhile); then waits for the postmaster, a while.
async fn kill_now(server: &mut Child) {
    // Listed first: once the postmaster is gone its children are no longer its own.
    let children = server.id().map(children_of).unwrap_or_default();
    let _ = server.start_kill();
    for child in children {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child), nix::sys::signal::Signal::SIGKILL);
    }
    if tokio::time::timeout(KILL_WITHIN, server.wait()).await.is_err() {
        warn!(within = ?KILL_WITHIN, "the killed server has not gone yet: going on without it");
    }
}

/// The processes whose parent is `parent` (from /proc).
fn children_of(parent: u32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // The command name is in parentheses and may hold spaces: the parent is the
            // second field after it.
            let ppid: u32 = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

/// Looks at the server every [`RENEW_EVERY`] while it is the primary, and records when it
/// last answered: connected and queried over its socket within [`lease::ANSWER_WITHIN`]. An
/// error it sends (too many connections, shutting down) is an answer too; only silence is not.
async fn look_at_the_primary(
    socket_dir: PathBuf,
    mut running: watch::Receiver<Running>,
    answered: watch::Sender<lease::Answers>,
) {
    let mut tick = tokio::time::interval(RENEW_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if running.has_changed().is_err() {
            return;
        }
        if *running.borrow_and_update() != Running::Primary {
            continue;
        }
        answered.send_if_modified(|a| {
            let first = a.primary_since.is_none();
            a.primary_since.get_or_insert_with(Instant::now);
            first
        });
        let look = async {
            let instance = Instance::local(&socket_dir).await?;
            instance.in_recovery().await
        };
        let answer = tokio::time::timeout(lease::ANSWER_WITHIN, look).await;
        let spoke = match answer {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => e.sent_by_the_server(),
            Err(_) => false,
        };
        if spoke {
            answered.send_modify(|a| a.last = Some(Instant::now()));
        }
    }
}

/// Promotes the server (a standby) through its socket, once it accepts connections.
async fn promote_server(socket_dir: &Path) -> Result<(), InstanceError> {
    let mut last = None;
    for _ in 0..60 {
        match Instance::local(socket_dir).await {
            Ok(instance) => match instance.promote().await {
                Ok(()) => return Ok(()),
                Err(e) => last = Some(e),
            },
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last.map_or_else(
        || InstanceError::Restore("the server could not be promoted".into()),
        InstanceError::Sql,
    ))
}

/// Waits while a server of an earlier pod still runs on `pgdata` (its `postmaster.pid` names a
/// live process): two postmasters on one data directory would corrupt it, and PostgreSQL's own
/// check would only end this one and cost a restart with back-off.
async fn wait_for_an_old_server(pgdata: &Path) {
    let started = Instant::now();
    let mut said = false;
    let lock_file = pgdata.join("postmaster.pid");
    loop {
        match old_postmaster(&lock_file) {
            OldPostmaster::None => return,
            // No server holds it, but PostgreSQL would take its PID for a live one: a server
            // that is dead and not yet reaped by whoever inherited it (PostgreSQL's shared
            // memory check still refuses to start while any process of it is attached), or,
            // after a server was killed with its node, another process of this fresh container
            // (a thread of the instance manager, whose ids follow its own as the old server's
            // did), which would stop every start for ever. Its lock file goes.
            OldPostmaster::Dead(pid) | OldPostmaster::Stale(pid) => {
                info!(pid, "the lock file names no live server: removing it");
                if let Err(e) = std::fs::remove_file(&lock_file) {
                    warn!(error = %e, "could not remove a stale lock file");
                }
                return;
            }
            OldPostmaster::Running(pid) => {
                if started.elapsed() > Duration::from_secs(120) {
                    warn!(
                        pid,
                        "a server of an earlier pod still runs on the data directory after 2 minutes: starting anyway (PostgreSQL refuses a second one)"
                    );
                    return;
                }
                if !said {
                    info!(
                        pid,
                        "a server of an earlier pod still runs on the data directory: waiting for it to end"
                    );
                    said = true;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The process a `postmaster.pid` names.
#[derive(Debug, PartialEq, Eq)]
enum OldPostmaster {
    /// No lock file, or it names no process (PostgreSQL removes such a lock file itself).
    None,
    /// A process that has exited but not been reaped (a zombie).
    Dead(i32),
    Running(i32),
    /// A live process (or thread) that is not a postgres.
    Stale(i32),
}

fn old_postmaster(lock_file: &Path) -> OldPostmaster {
    let Some(pid) = std::fs::read_to_string(lock_file)
        .ok()
        .and_then(|t| t.lines().next()?.trim().parse::<i32>().ok())
    else {
        return OldPostmaster::None;
    };
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return OldPostmaster::None;
    };
    of_stat(pid, &stat)
}

/// What process `pid`, whose `/proc/<pid>/stat` is `stat`, is to a lock file naming it. Pure.
fn of_stat(pid: i32, stat: &str) -> OldPostmaster {
    // `pid (comm) state ...`: the state follows the last parenthesis.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    let comm = stat
        .split_once('(')
        .and_then(|(_, rest)| rest.rsplit_once(')'))
        .map(|(c, _)| c);
    match (state, comm) {
        (Some('Z' | 'X'), Some(c)) if c.starts_with("postgres") => OldPostmaster::Dead(pid),
        (_, Some(c)) if c.starts_with("postgres") => OldPostmaster::Running(pid),
        (Some(_), Some(_)) => OldPostmaster::Stale(pid),
        _ => OldPostmaster::None,
    }
}

/// Tells `parted` once this replica has neither streamed nor replayed anything for
/// `PARTED_AFTER` while the primary at `host` answers on a later timeline than its own: it
/// received WAL the promoted replica had not, and cannot follow until it is rewound. (One
/// still replaying the WAL it has, before it streams, is moving: it is left alone.)
async fn watch_the_timeline(settings: Settings, host: String, parted: mpsc::Sender<()>) {
    let mut moving_at = Instant::now();
    let mut replayed = None;
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (streaming, now_replayed) = match Instance::local(&settings.socket_dir).await {
            Ok(instance) => instance.streaming().await.unwrap_or((false, None)),
            Err(_) => (false, None),
        };
        let replaying = now_replayed.is_some() && now_replayed != replayed;
        replayed = now_replayed.or(replayed);
        if streaming || replaying {
            moving_at = Instant::now();
            continue;
        }
        if moving_at.elapsed() >= PARTED_AFTER && replica::primary_moved_on(&settings, &host).await == Some(true) {
            let _ = parted.send(()).await;
            return;
        }
    }
}

/// Ends this replica's WAL receiver, so that the server starts another at once (a second
/// later: `wal_retrieve_retry_interval`) through `<name>-rw`, which the operator has pointed at
/// the new primary. Without this, a stream from a primary whose node stopped (no reset ever
/// comes) lasts until `wal_receiver_timeout`.
async fn follow_anew(socket_dir: PathBuf) {
    let ended = async { Instance::local(&socket_dir).await?.end_wal_receiver().await };
    match ended.await {
        Ok(true) => info!("ended the stream from the old primary"),
        Ok(false) => {}
        Err(e) => warn!(error = %e, "could not end the stream from the old primary: it ends at its timeout"),
    }
}

/// Runs one CHECKPOINT once the server is a primary. Two reasons:
/// - PostgreSQL's checkpointer, which also forces the WAL segment switches of
///   `archive_timeout`, starts while the server is still in recovery and then sleeps a whole
///   `checkpoint_timeout` (five minutes) before it looks at `archive_timeout` again: a restarted
///   server would archive nothing for that long unless something wakes it.
/// - A promoted server writes its new timeline into its control file only at a checkpoint,
///   and a former primary cannot rewind to it before (`replica.rs`).
///
/// A checkpoint request does both, and costs little after a start.
async fn checkpoint_once_primary(socket_dir: PathBuf) {
    for _ in 0..120 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Ok(instance) = Instance::local(&socket_dir).await else {
            continue;
        };
        match instance.in_recovery().await {
            Ok(false) => {}
            _ => continue,
        }
        match instance.checkpoint().await {
            Ok(()) => info!(
                "checkpointed as the primary: archive_timeout holds from the start, and the timeline is in the control file"
            ),
            Err(e) => {
                warn!(error = %e, "could not checkpoint as the primary: archive_timeout and a former primary's rewind wait for the next checkpoint")
            }
        }
        return;
    }
}

/// What stops the pod's container: SIGTERM, or the image's STOPSIGNAL, which a container runtime
/// sends instead (SIGINT for the official postgres image). The instance manager is PID 1 in its
/// container, where a signal without a handler is ignored: both need one.
struct StopSignals {
    term: Signal,
    int: Signal,
}

impl StopSignals {
    fn listen() -> Result<Self, InstanceError> {
        Ok(Self {
            term: signal(SignalKind::terminate()).map_err(io("listening for SIGTERM"))?,
            int: signal(SignalKind::interrupt()).map_err(io("listening for SIGINT"))?,
        })
    }

    /// Waits for either.
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_file_naming_a_process_that_is_no_server_is_stale() {
        assert_eq!(of_stat(12, "12 (postgres) S 10 12 12 0"), OldPostmaster::Running(12));
        assert_eq!(of_stat(12, "12 (postgres) Z 10 12 12 0"), OldPostmaster::Dead(12));
        // A thread of the instance manager, which took the killed server's id in a fresh
        // container: PostgreSQL would refuse to start for ever.
        assert_eq!(
            of_stat(12, "12 (tokio-runtime-w) S 10 10 10 0"),
            OldPostmaster::Stale(12)
        );
        assert_eq!(of_stat(12, "garbage"), OldPostmaster::None);
    }
}
