//! Helpers for the PostgreSQL end-to-end tests: manifests, waits, and `psql` against the
//! instance's pod address (inside the local Kubernetes's own network namespaces).

use noops_api::backup::BackupPhase;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use noops_api::{PostgreSQL, PostgresBackup};

use crate::{TestNamespace, kubectl_ok, pod_ready, wait_for, wait_until};

/// The psql of the PostgreSQL setup installs.
pub const PSQL: &str = "/usr/lib/postgresql/15/bin/psql";

/// The original's manifest: a Secret with `postgresql_password` and a PostgreSQL naming it.
pub fn manifest(name: &str, password: &str, extra: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Secret
metadata: {{ name: {name}-db }}
stringData: {{ postgresql_password: "{password}" }}
---
apiVersion: noops.dev/v1alpha1
kind: PostgreSQL
metadata: {{ name: {name} }}
spec:
  db: shop
  user: app
  passwordSecret: {name}-db
{extra}"#
    )
}

/// A PostgreSQL manifest alone.
pub fn database_manifest(name: &str, spec: &str) -> String {
    format!("apiVersion: noops.dev/v1alpha1\nkind: PostgreSQL\nmetadata: {{ name: {name} }}\nspec:\n{spec}")
}

/// The condition `type_` of a PostgreSQL: (status, reason, message).
pub fn condition(pg: &PostgreSQL, type_: &str) -> Option<(String, String, String)> {
    pg.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Waits until the PostgreSQL has Ready=True for its current generation.
pub async fn wait_ready(ns: &TestNamespace, name: &str, timeout: Duration) -> PostgreSQL {
    let api = ns.api::<PostgreSQL>();
    wait_for(&format!("PostgreSQL {name} Ready"), timeout, || async {
        api.get_opt(name).await.ok().flatten().filter(|pg| {
            let status = pg.status.as_ref();
            status.and_then(|s| s.observed_generation) == pg.metadata.generation
                && condition(pg, "Ready").is_some_and(|(s, _, _)| s == "True")
        })
    })
    .await
}

/// Waits until condition `type_` of PostgreSQL `name` is `status` with `reason`.
pub async fn wait_reason(ns: &TestNamespace, name: &str, type_: &str, status: &str, reason: &str) -> PostgreSQL {
    wait_for(
        &format!("PostgreSQL {name} {type_}={status} {reason}"),
        Duration::from_secs(180),
        || async {
            let pg = ns.api::<PostgreSQL>().get(name).await.ok()?;
            let generation = pg.metadata.generation;
            let current = pg.status.as_ref().is_some_and(|s| s.observed_generation == generation);
            (current && condition(&pg, type_).is_some_and(|(s, r, _)| s == status && r == reason)).then_some(pg)
        },
    )
    .await
}

/// Waits until the PostgreSQL's Ready condition is False with `reason`.
pub async fn wait_not_ready(ns: &TestNamespace, name: &str, reason: &str, timeout: Duration) -> PostgreSQL {
    let api = ns.api::<PostgreSQL>();
    wait_for(&format!("PostgreSQL {name} Ready=False {reason}"), timeout, || async {
        api.get_opt(name)
            .await
            .ok()
            .flatten()
            .filter(|pg| condition(pg, "Ready").is_some_and(|(s, r, _)| s == "False" && r == reason))
    })
    .await
}

/// The address of the instance's pod, once it is Ready.
pub async fn instance_ip(ns: &TestNamespace, name: &str) -> String {
    let pod: Pod = ns.wait_pod_ready(&format!("{name}-0"), Duration::from_secs(120)).await;
    assert!(pod_ready(&pod));
    pod.status.and_then(|s| s.pod_ip).expect("pod IP")
}

/// Runs `sql` with psql as `user` with `password` on database `db` at `ip`: its output, or
/// what psql said on failure.
pub fn psql(ip: &str, user: &str, password: &str, db: &str, sql: &str) -> Result<String, String> {
    let out = Command::new(PSQL)
        .args(["-h", ip, "-U", user, "-d", db, "-v", "ON_ERROR_STOP=1", "-tAc", sql])
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "5")
        .output()
        .map_err(|e| format!("cannot run {PSQL}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

/// How a client connects to database `db` at `host` as `user`.
fn client_config(
    host: &str,
    user: &str,
    password: &str,
    db: &str,
    connect_timeout: Duration,
) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    config
        .host(host)
        .port(5432)
        .user(user)
        .password(password)
        .dbname(db)
        .connect_timeout(connect_timeout);
    config
}

/// Whether `sql` (a commit) is acknowledged within `within`, as a client that gives up then
/// sees it. (A statement timeout would not do: PostgreSQL ends a commit's wait for its
/// synchronous replicas on a cancel and reports success, with a warning.)
pub async fn commits_within(host: &str, user: &str, password: &str, db: &str, sql: &str, within: Duration) -> bool {
    let config = client_config(host, user, password, db, Duration::from_secs(5));
    let Ok((client, connection)) = config.connect(tokio_postgres::NoTls).await else {
        return false;
    };
    tokio::spawn(connection);
    matches!(
        tokio::time::timeout(within, client.batch_execute(sql)).await,
        Ok(Ok(()))
    )
}

/// The value of `key` in Secret `name`.
pub async fn secret_value(ns: &TestNamespace, name: &str, key: &str) -> String {
    let secret: Secret = ns.api::<Secret>().get(name).await.expect("Secret");
    let value = secret.data.and_then(|d| d.get(key).cloned()).expect("key in Secret");
    String::from_utf8(value.0).expect("UTF-8")
}

/// `kubectl get pg` as a user would read it.
pub fn kubectl_get(ns: &TestNamespace) -> String {
    kubectl_ok(&["get", "pg", "-n", &ns.name], None)
}

/// The `spec.backup` of a database backing up to `bucket` of the store of [`crate::s3`] in
/// `ns`, with `extra` fields (indented by four spaces).
pub fn backup_to_bucket(ns: &TestNamespace, bucket: &str, extra: &str) -> String {
    format!(
        "  backup:\n    archiveTimeoutSeconds: 1\n    s3: {{ endpoint: \"{}\", bucket: {bucket}, credentialsSecret: object-store-credentials }}\n{extra}",
        crate::s3::service_url(ns)
    )
}

/// The superuser's password of PostgreSQL `name`.
pub async fn superuser_password(ns: &TestNamespace, name: &str) -> String {
    secret_value(ns, &format!("{name}-superuser"), "password").await
}

/// Waits until condition `type_` of PostgreSQL `name` has `status` (and returns the object).
pub async fn wait_condition(
    ns: &TestNamespace,
    name: &str,
    type_: &str,
    status: &str,
    timeout: Duration,
) -> PostgreSQL {
    let api = ns.api::<PostgreSQL>();
    wait_for(&format!("PostgreSQL {name} {type_}={status}"), timeout, || async {
        api.get_opt(name)
            .await
            .ok()
            .flatten()
            .filter(|pg| condition(pg, type_).is_some_and(|(s, _, _)| s == status))
    })
    .await
}

/// The segment the server writes to now, after everything committed so far (as the
/// superuser): once it is archived, every commit before this call is in the archive.
pub fn current_segment(ip: &str, superuser_password: &str) -> String {
    psql(
        ip,
        "postgres",
        superuser_password,
        "postgres",
        "SELECT pg_walfile_name(pg_current_wal_lsn())",
    )
    .unwrap()
}

/// Waits until the server at `ip` has archived `segment` (or a later one).
pub async fn wait_archived(ip: &str, superuser_password: &str, segment: &str, timeout: Duration) {
    let query = "SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver";
    crate::wait_until(&format!("segment {segment} archived"), timeout, || async {
        psql(ip, "postgres", superuser_password, "postgres", query).is_ok_and(|last| last.get(..24) >= Some(segment))
    })
    .await;
}

/// A client that commits one row after another into `items (id)` of `db` as `user`, each in
/// its own transaction, and remembers the last id the server acknowledged.
pub struct Writer {
    acked: std::sync::Arc<std::sync::atomic::AtomicI64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    /// Starts after id `from` (exclusive), a row every `pause`; it stops at the first error.
    pub async fn start(ip: &str, user: &str, password: &str, db: &str, from: i64, pause: Duration) -> Self {
        let mut config = tokio_postgres::Config::new();
        config.host(ip).port(5432).user(user).password(password).dbname(db);
        let (client, connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .expect("the writer connects");
        tokio::spawn(connection);
        let acked = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(from));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (acked_by_task, stop_seen) = (acked.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut id = from;
            while !stop_seen.load(std::sync::atomic::Ordering::SeqCst) {
                id += 1;
                if client
                    .execute("INSERT INTO items (id) VALUES ($1)", &[&id])
                    .await
                    .is_err()
                {
                    return;
                }
                acked_by_task.store(id, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(pause).await;
            }
        });
        Self { acked, stop, task }
    }

    /// The last id acknowledged.
    pub fn acked(&self) -> i64 {
        self.acked.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Stops it; returns the last id acknowledged.
    pub async fn stop(self) -> i64 {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let acked = self.acked.clone();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        acked.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The ids in `items`, checked to run 1, 2, ... without a hole: the highest.
pub fn contiguous_ids(ip: &str, user: &str, password: &str, db: &str) -> i64 {
    let out = psql(
        ip,
        user,
        password,
        db,
        "SELECT count(*), coalesce(max(id), 0), coalesce(min(id), 1) FROM items",
    )
    .unwrap();
    let numbers: Vec<i64> = out.split('|').map(|n| n.parse().unwrap()).collect();
    assert_eq!(
        (numbers[0], numbers[2]),
        (numbers[1], 1),
        "the rows are 1 to {} without a hole: {out}",
        numbers[1]
    );
    numbers[1]
}

/// Deletes the instance's volume claim and pod (the claim goes once the pod is gone), as a
/// lost disk would; returns the old pod's uid.
pub async fn lose_the_volume(ns: &TestNamespace, name: &str) -> Option<String> {
    let old = ns.pods().get(&format!("{name}-0")).await.unwrap().metadata.uid;
    kubectl_ok(
        &[
            "delete",
            "pvc",
            "-n",
            &ns.name,
            &format!("data-{name}-0"),
            "--wait=false",
        ],
        None,
    );
    kubectl_ok(
        &["delete", "pod", "-n", &ns.name, &format!("{name}-0"), "--wait=false"],
        None,
    );
    old
}

/// Makes table `items` in database `shop` as user `app`, with ids 1 to `count`.
pub fn make_items(ip: &str, password: &str, count: i64) {
    let sql =
        format!("CREATE TABLE items (id bigint PRIMARY KEY); INSERT INTO items SELECT generate_series(1, {count})");
    if let Err(error) = psql(ip, "app", password, "shop", &sql) {
        panic!("making table items: {error}");
    }
}

/// Waits for a new instance pod (not `old`) that is Ready.
pub async fn wait_new_instance(ns: &TestNamespace, name: &str, old: &Option<String>, timeout: Duration) -> Pod {
    let pods = ns.pods();
    wait_for(&format!("a new pod {name}-0, Ready"), timeout, || async {
        pods.get_opt(&format!("{name}-0"))
            .await
            .ok()
            .flatten()
            .filter(|p: &Pod| &p.metadata.uid != old && pod_ready(p))
    })
    .await
}

/// The PostgresBackups of `postgresql` among `all`.
pub fn backups_of(all: &[PostgresBackup], postgresql: &str) -> Vec<PostgresBackup> {
    all.iter()
        .filter(|b| b.spec.postgresql == postgresql)
        .cloned()
        .collect()
}

/// A backup's phase (empty before its first status).
pub fn phase(backup: &PostgresBackup) -> &str {
    backup
        .status
        .as_ref()
        .and_then(|s| s.progress.phase)
        .map_or("", BackupPhase::as_str)
}

/// Waits until every PostgresBackup of `postgresql` has finished.
pub async fn wait_backups_finished(ns: &TestNamespace, postgresql: &str, timeout: Duration) {
    let api = ns.api::<PostgresBackup>();
    crate::wait_until(&format!("every backup of {postgresql} finished"), timeout, || async {
        let all = api.list(&Default::default()).await.unwrap().items;
        backups_of(&all, postgresql)
            .iter()
            .all(|b| matches!(phase(b), "Succeeded" | "Failed"))
    })
    .await;
}

/// What a [`Ledger`] saw.
#[derive(Debug, Clone, Default)]
pub struct LedgerReport {
    /// Every id the server acknowledged, in order.
    pub acked: Vec<i64>,
    /// Ids whose commit ended in an error: they may or may not have committed.
    pub uncertain: Vec<i64>,
    /// The longest time between two acknowledged commits: how long writes waited.
    pub longest_gap: Duration,
    /// When each of `acked` was acknowledged.
    pub acked_at: Vec<std::time::Instant>,
}

impl LedgerReport {
    /// Checks `present` (the ids in the table) against what was acknowledged: returns the
    /// acknowledged ids that are missing. Panics on an id present that was never attempted.
    /// The acknowledged commits missing from `items` in database `shop` behind `rw` (as
    /// `app`), after a line saying how the history went; `replication` names the mode for it.
    /// Asserts the history is long enough to judge.
    pub fn lost_in_shop(&self, rw: &str, password: &str, replication: &str) -> Vec<i64> {
        self.lost_in((rw, "app", password, "shop"), replication)
    }

    /// The acknowledged commits missing from `items` in database `db` at `host`, read as
    /// `user`, after a line saying how the history went, as [`Self::lost_in_shop`].
    pub fn lost_in(&self, (host, user, password, db): (&str, &str, &str, &str), replication: &str) -> Vec<i64> {
        let missing = self.missing(&ids(host, user, password, db));
        eprintln!(
            "{} commits acknowledged, {} uncertain, {} lost ({replication} replication), writes waited at most {:?}",
            self.acked.len(),
            self.uncertain.len(),
            missing.len(),
            self.longest_gap
        );
        assert!(
            self.acked.len() > 100,
            "too little history to judge: {} acknowledged",
            self.acked.len()
        );
        missing
    }

    /// The longest time writes waited between `from` and `to`: the longest stretch between
    /// two acknowledged commits that overlaps that window.
    pub fn longest_gap_between(&self, from: std::time::Instant, to: std::time::Instant) -> Duration {
        longest_gap_between(&self.acked_at, from, to)
    }

    /// The longest wait for a commit that a moment in `[from, to]` saw: a gap that began
    /// before `from` counts from `from` (an outage of an earlier fault is not this one's).
    pub fn longest_wait_since(&self, from: std::time::Instant, to: std::time::Instant) -> Duration {
        self.acked_at
            .windows(2)
            .filter(|w| w[1] >= from && w[0] <= to)
            .map(|w| w[1] - w[0].max(from))
            .max()
            .unwrap_or(to - from)
    }

    pub fn missing(&self, present: &[i64]) -> Vec<i64> {
        let present: std::collections::BTreeSet<i64> = present.iter().copied().collect();
        for id in &present {
            assert!(
                self.acked.contains(id) || self.uncertain.contains(id),
                "id {id} is in the table but was never committed by the client"
            );
        }
        self.acked.iter().copied().filter(|id| !present.contains(id)).collect()
    }
}

/// A client that commits one row after another into `items (id)` through `host` (a Service),
/// each in its own transaction, every `pause`, reconnecting after an error as an application
/// does; it keeps what the server acknowledged. It runs on a thread and runtime of its own:
/// a test blocking its own thread (kubectl, psql) must not hold its commits back, which would
/// read as a write gap.
pub struct Ledger {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::sync::oneshot::Receiver<LedgerReport>,
}

impl Ledger {
    pub fn start(host: &str, user: &str, password: &str, db: &str, pause: Duration) -> Self {
        let config = client_config(host, user, password, db, Duration::from_secs(2));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop_seen = stop.clone();
        let (done, task) = tokio::sync::oneshot::channel();
        let commits = async move {
            let mut report = LedgerReport::default();
            let mut last_ack = std::time::Instant::now();
            let mut id = 0;
            let mut client: Option<tokio_postgres::Client> = None;
            while !stop_seen.load(std::sync::atomic::Ordering::SeqCst) {
                if client.as_ref().is_none_or(|c| c.is_closed()) {
                    match tokio::time::timeout(Duration::from_secs(3), config.connect(tokio_postgres::NoTls)).await {
                        Ok(Ok((c, connection))) => {
                            tokio::spawn(connection);
                            client = Some(c);
                        }
                        _ => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    }
                }
                let Some(c) = &client else { continue };
                id += 1;
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&id];
                let insert = c.execute("INSERT INTO items (id) VALUES ($1)", &params);
                match tokio::time::timeout(Duration::from_secs(3), insert).await {
                    Ok(Ok(_)) => {
                        report.longest_gap = report.longest_gap.max(last_ack.elapsed());
                        last_ack = std::time::Instant::now();
                        report.acked.push(id);
                        report.acked_at.push(last_ack);
                    }
                    _ => {
                        report.uncertain.push(id);
                        client = None;
                    }
                }
                tokio::time::sleep(pause).await;
            }
            report
        };
        on_a_thread_of_its_own(commits, done);
        Self { stop, task }
    }

    pub async fn stop(self) -> LedgerReport {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.task.await.expect("the ledger's thread")
    }
}

/// Runs `work` on a thread and runtime of its own and sends its outcome to `done`: a test
/// blocking its own thread (kubectl, psql) must not hold a client's requests back, which would
/// read as a write gap.
fn on_a_thread_of_its_own<T: Send + 'static>(
    work: impl std::future::Future<Output = T> + Send + 'static,
    done: tokio::sync::oneshot::Sender<T>,
) {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a client's runtime");
        let _ = done.send(runtime.block_on(work));
    });
}

/// Short write attempts through `host` started every `every`, each on a new connection that
/// gives up after a second, so that when writes are possible again is seen within about
/// `every`, not after one client's own timeouts: a [`Ledger`]'s single client may sit out a
/// connect or an INSERT to a gone primary for seconds, overstating the gap by as much. What
/// it measures is the database's, not a client's: the first write acknowledged after a fault.
/// Each attempt is a transaction that is given an id (`txid_current()`), which only a primary
/// taking writes gives, and commits it.
pub struct WriteProbe {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::sync::oneshot::Receiver<Vec<std::time::Instant>>,
}

impl WriteProbe {
    pub fn start(host: &str, user: &str, password: &str, db: &str, every: Duration) -> Self {
        let config = client_config(host, user, password, db, Duration::from_secs(1));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop_seen = stop.clone();
        let (done, task) = tokio::sync::oneshot::channel();
        let attempts = async move {
            let (acked, mut acks) = tokio::sync::mpsc::unbounded_channel();
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            while !stop_seen.load(std::sync::atomic::Ordering::SeqCst) {
                tick.tick().await;
                let (config, acked) = (config.clone(), acked.clone());
                tokio::spawn(async move {
                    let attempt = async {
                        let (client, connection) = config.connect(tokio_postgres::NoTls).await.ok()?;
                        tokio::spawn(connection);
                        client.batch_execute("SELECT txid_current()").await.ok()
                    };
                    if let Ok(Some(())) = tokio::time::timeout(Duration::from_secs(1), attempt).await {
                        let _ = acked.send(std::time::Instant::now());
                    }
                });
            }
            // Attempts still under way end within their second.
            tokio::time::sleep(Duration::from_millis(1100)).await;
            drop(acked);
            let mut at = Vec::new();
            while let Some(instant) = acks.recv().await {
                at.push(instant);
            }
            at.sort();
            at
        };
        on_a_thread_of_its_own(attempts, done);
        Self { stop, task }
    }

    /// When each acknowledged attempt was acknowledged, in order.
    pub async fn stop(self) -> Vec<std::time::Instant> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.task.await.expect("the probe's thread")
    }
}

/// The longest stretch between two acknowledgements in `acked_at` (in order) that overlaps
/// `[from, to]`: how long writes waited then.
pub fn longest_gap_between(
    acked_at: &[std::time::Instant],
    from: std::time::Instant,
    to: std::time::Instant,
) -> Duration {
    acked_at
        .windows(2)
        .filter(|w| w[1] >= from && w[0] <= to)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or(to - from)
}

/// Every id in `items` at `host`.
pub fn ids(host: &str, user: &str, password: &str, db: &str) -> Vec<i64> {
    psql(host, user, password, db, "SELECT id FROM items ORDER BY id")
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The process of the instance manager (`noops pg-instance run`) of pod `pod`, found by the
/// pod's name and namespace in its environment.
fn instance_manager(ns: &TestNamespace, pod: &str) -> Option<i32> {
    let wanted = [
        format!("NOOPS_POD_NAME={pod}"),
        format!("NOOPS_POD_NAMESPACE={}", ns.name),
    ];
    let managers: Vec<i32> = std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_string_lossy().parse::<i32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            if !(args.contains(&b"pg-instance".as_slice()) && args.contains(&b"run".as_slice())) {
                return None;
            }
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
            wanted.iter().all(|w| vars.contains(&w.as_bytes())).then_some(pid)
        })
        .collect();
    // As a container's PID 1 it runs under an init of its own (`instance/init.rs`), the same
    // program: the manager is the one that is no other's parent.
    let parents: std::collections::BTreeMap<i32, i32> = processes().into_iter().collect();
    managers
        .iter()
        .copied()
        .find(|pid| !managers.iter().any(|other| parents.get(other) == Some(pid)))
}

pub use crate::frozen::Frozen;

impl Frozen {
    /// A PostgreSQL pod frozen whole (its cgroup), as a hung node or a paused VM would be: its
    /// instance manager renews nothing and stops nothing, its server answers nothing.
    pub fn pod(ns: &TestNamespace, pod: &str) -> Self {
        let pid = instance_manager(ns, pod).unwrap_or_else(|| panic!("no instance manager of {pod}"));
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let path = cgroup
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or_else(|| panic!("{pod} is in no cgroup v2: {cgroup}"));
        // The container's cgroup is in its pod's: freeze the whole pod.
        Self::cgroup(std::path::Path::new(path.trim()).parent().unwrap())
    }
}

/// Every process of a PostgreSQL pod's server stopped (SIGSTOP: the postmaster, then each of
/// its children), its instance manager running on: a server that hangs, as on a volume that
/// hangs every write. Resumed (SIGCONT) when dropped, if anything of it is left.
pub struct StoppedServer {
    postmaster: i32,
    children: Vec<i32>,
}

/// (pid, parent) of every process.
fn processes() -> Vec<(i32, i32)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_string_lossy().parse::<i32>().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let parent = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, parent))
        })
        .collect()
}

impl StoppedServer {
    pub fn of(ns: &TestNamespace, pod: &str) -> Self {
        let manager = instance_manager(ns, pod).unwrap_or_else(|| panic!("no instance manager of {pod}"));
        // The running postmaster: not a zombie left by an earlier server (none is on the
        // node agent; the init of a real container reaps them, but maybe not yet).
        let postmaster = processes()
            .into_iter()
            .filter(|(_, parent)| *parent == manager)
            .map(|(pid, _)| pid)
            .find(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| cmdline.starts_with(b"postgres"))
            })
            .unwrap_or_else(|| panic!("no server of {pod}"));
        signal(postmaster, "STOP");
        let children: Vec<i32> = processes()
            .into_iter()
            .filter(|(_, parent)| *parent == postmaster)
            .map(|(pid, _)| pid)
            .collect();
        for child in &children {
            signal(*child, "STOP");
        }
        Self { postmaster, children }
    }

    /// Whether no process of the server is left.
    pub fn gone(&self) -> bool {
        let alive: Vec<i32> = processes().into_iter().map(|(pid, _)| pid).collect();
        !std::iter::once(&self.postmaster)
            .chain(&self.children)
            .any(|pid| alive.contains(pid))
    }

    pub fn resume(self) {}
}

impl Drop for StoppedServer {
    fn drop(&mut self) {
        for pid in std::iter::once(&self.postmaster).chain(&self.children) {
            signal(*pid, "CONT");
        }
    }
}

/// Sends `signal` to `pid`; one that is gone already (killed by its instance manager) is no
/// news.
fn signal(pid: i32, signal: &str) {
    let _ = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status();
}

/// When the test saw a change of the lease, and who held it then.
type LeaseChanges = std::sync::Arc<std::sync::Mutex<Vec<(std::time::Instant, Option<String>)>>>;

/// Every change of a database's primary Lease, from a watch (each renewal is a change).
pub struct LeaseWatch {
    task: tokio::task::JoinHandle<()>,
    seen: LeaseChanges,
}

impl LeaseWatch {
    /// Returns once the watch has seen the lease as it is now: a change made after this call
    /// is never missed (started and left, the first change could come before the first list).
    pub async fn start(ns: &TestNamespace, lease: &str) -> Self {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        let seen = LeaseChanges::default();
        let record = seen.clone();
        let leases = ns.api::<k8s_openapi::api::coordination::v1::Lease>();
        let config = watcher::Config::default().fields(&format!("metadata.name={lease}"));
        let task = tokio::spawn(async move {
            let mut changes = watcher(leases, config).default_backoff().applied_objects().boxed();
            while let Some(change) = changes.next().await {
                if let Ok(lease) = change {
                    let holder = lease.spec.and_then(|s| s.holder_identity).filter(|h| !h.is_empty());
                    record.lock().unwrap().push((std::time::Instant::now(), holder));
                }
            }
        });
        let first = seen.clone();
        crate::wait_until(
            &format!("the watch of lease {lease} to list it"),
            Duration::from_secs(30),
            || {
                let listed = !first.lock().unwrap().is_empty();
                async move { listed }
            },
        )
        .await;
        Self { task, seen }
    }

    /// Every holder the lease had, in order, each once per stretch it held it (none: given
    /// up).
    pub fn holders(&self) -> Vec<Option<String>> {
        let seen = self.seen.lock().unwrap();
        let mut holders: Vec<Option<String>> = Vec::new();
        for (_, holder) in seen.iter() {
            if holders.last() != Some(holder) {
                holders.push(holder.clone());
            }
        }
        holders
    }

    /// Every handover straight from one holder to another (not given up first), with how long
    /// the old holder had gone without a renewal, as the watch saw it: at least the fence
    /// deadline, or two primaries could have taken commits at once.
    pub fn direct_handovers(&self) -> Vec<(String, String, Duration)> {
        let seen = self.seen.lock().unwrap();
        seen.windows(2)
            .filter_map(|w| match (&w[0].1, &w[1].1) {
                (Some(from), Some(to)) if from != to => Some((from.clone(), to.clone(), w[1].0 - w[0].0)),
                _ => None,
            })
            .collect()
    }

    /// How long the lease went unchanged, as the watch saw it, before it first passed from
    /// `from` to `to`: the old holder's last renewal to the handover.
    pub fn silence_before_handover(&self, from: &str, to: &str) -> Option<Duration> {
        let seen = self.seen.lock().unwrap();
        let handover = seen
            .windows(2)
            .find(|w| w[0].1.as_deref() == Some(from) && w[1].1.as_deref() == Some(to))?;
        Some(handover[1].0 - handover[0].0)
    }
}

impl Drop for LeaseWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The ClusterIP of Service `name`.
pub async fn service_ip(ns: &TestNamespace, name: &str) -> String {
    let service = ns.api::<k8s_openapi::api::core::v1::Service>().get(name).await.unwrap();
    service.spec.unwrap().cluster_ip.unwrap()
}

/// Database `shop` of three instances (with `extra` in its spec), Ready with its replicas
/// streaming, a table `items`, and a ledger committing into it through `shop-rw` every 20 ms:
/// (the owner's password, the address of `shop-rw`, the ledger).
pub async fn three_instances_under_a_ledger(ns: &TestNamespace, extra: &str) -> (String, String, Ledger) {
    instances_under_a_ledger(ns, 3, extra).await
}

/// As [`three_instances_under_a_ledger`], with `instances` instances.
pub async fn instances_under_a_ledger(ns: &TestNamespace, instances: u32, extra: &str) -> (String, String, Ledger) {
    ns.apply(&manifest(
        "shop",
        "Pa55word",
        &format!("  instances: {instances}\n{extra}"),
    ));
    wait_ready(ns, "shop", Duration::from_secs(180)).await;
    wait_reason(ns, "shop", "ReplicasReady", "True", "Streaming").await;
    let password = secret_value(ns, "shop-db", "postgresql_password").await;
    let rw = service_ip(ns, "shop-rw").await;
    psql(
        &rw,
        "app",
        &password,
        "shop",
        "CREATE TABLE items (id bigint PRIMARY KEY)",
    )
    .unwrap();
    let ledger = Ledger::start(&rw, "app", &password, "shop", Duration::from_millis(20));
    tokio::time::sleep(Duration::from_secs(3)).await;
    (password, rw, ledger)
}

/// Waits until former primary `pod` of `shop` streams as a replica again.
pub async fn wait_rejoined(ns: &TestNamespace, pod: &str) {
    wait_until(
        &format!("{pod} back, streaming from the new primary"),
        Duration::from_secs(180),
        || async {
            let pg = ns.api::<PostgreSQL>().get("shop").await.ok();
            pg.and_then(|pg| pg.status).is_some_and(|s| {
                s.members
                    .iter()
                    .any(|m| m.name == pod && format!("{:?}", m.role) == "Replica" && m.streaming == Some(true))
            })
        },
    )
    .await;
}

/// The last failover (or switchover) `name`'s status records.
pub async fn last_failover(ns: &TestNamespace, name: &str) -> noops_api::postgres::FailoverStatus {
    let pg = ns.api::<PostgreSQL>().get(name).await.unwrap();
    pg.status.and_then(|s| s.last_failover).expect("a failover recorded")
}

/// Waits until the last failover of `name` has a new primary other than `old` taking writes.
pub async fn wait_failed_over(ns: &TestNamespace, name: &str, old: &str) -> noops_api::postgres::FailoverStatus {
    let api = ns.api::<PostgreSQL>();
    wait_for(
        &format!("{name} failed over from {old}"),
        Duration::from_secs(120),
        || async {
            let pg = api.get(name).await.ok()?;
            let failover = pg.status?.last_failover?;
            (failover.from.as_deref() == Some(old) && failover.promoted_at.is_some()).then_some(failover)
        },
    )
    .await
}
