//! Helpers for the EtcdCluster tests: manifests, waiting for Ready, a client with the cluster's
//! own client certificate, and a writer whose history is checked for lost or stale data.

use noops_api::backup::BackupPhase;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions, Txn, TxnOp};
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::Api;
use kube::api::ListParams;
use kube::api::{Patch, PatchParams};
use noops_api::{EtcdBackup, EtcdCluster};
use std::collections::BTreeSet;

use crate::{TestNamespace, pod_ip, root, s3, wait_for};

/// The etcd version the local Kubernetes runs for `minor` ("3.5"), from its Go module.
pub fn etcd_version(minor: &str) -> String {
    let gomod = std::fs::read_to_string(root().join(format!("tools/etcd-{minor}/go.mod"))).unwrap();
    gomod
        .lines()
        .find_map(|l| l.trim().strip_prefix("go.etcd.io/etcd/server/v3 v"))
        .map(|v| v.trim().to_string())
        .expect("the etcd server version in its go.mod")
}

/// An EtcdCluster manifest; `extra` is YAML added under `spec` (indented by two spaces).
pub fn cluster_manifest(name: &str, replicas: i32, version: &str, extra: &str) -> String {
    format!(
        "apiVersion: noops.dev/v1alpha1\nkind: EtcdCluster\nmetadata: {{ name: {name} }}\nspec:\n  replicas: {replicas}\n  version: \"{version}\"\n{extra}"
    )
}

/// Whether the cluster reports Ready for its current generation with `replicas` healthy members.
pub fn cluster_ready(cluster: &EtcdCluster, replicas: i32) -> bool {
    let Some(status) = &cluster.status else { return false };
    status.observed_generation == cluster.metadata.generation
        && status.ready_members == replicas
        && status.operation.is_none()
        && status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Waits until EtcdCluster `name` is Ready with `replicas` members.
pub async fn wait_cluster_ready(ns: &TestNamespace, name: &str, replicas: i32, timeout: Duration) -> EtcdCluster {
    let api: Api<EtcdCluster> = ns.api();
    wait_for(
        &format!("EtcdCluster {name} Ready with {replicas} members"),
        timeout,
        || async {
            api.get_opt(name)
                .await
                .ok()
                .flatten()
                .filter(|c| cluster_ready(c, replicas))
        },
    )
    .await
}

/// The condition `type_` of the cluster, as (status, reason, message).
pub fn condition(cluster: &EtcdCluster, type_: &str) -> Option<(String, String, String)> {
    cluster
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The cluster's Events, oldest first, as (reason, message).
pub async fn cluster_events(ns: &TestNamespace, name: &str) -> Vec<(String, String)> {
    let events: Api<Event> = ns.api();
    let mut list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={name},involvedObject.kind=EtcdCluster")))
        .await
        .unwrap()
        .items;
    list.sort_by_key(|e| {
        e.event_time
            .as_ref()
            .map(|t| t.0)
            .or(e.first_timestamp.as_ref().map(|t| t.0))
            .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
    });
    list.into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

/// The cluster's Events once `holds` is true of them (a minute at most). An Event comes
/// after the status write of its pass, so a test that has just seen the status must wait for it.
pub async fn cluster_events_when(
    ns: &TestNamespace,
    name: &str,
    what: &str,
    holds: impl Fn(&[(String, String)]) -> bool,
) -> Vec<(String, String)> {
    wait_for(what, Duration::from_secs(60), || async {
        let events = cluster_events(ns, name).await;
        holds(&events).then_some(events)
    })
    .await
}

/// The client URLs of the member pods `members` (by pod IP, reachable from this machine).
pub async fn member_endpoints(ns: &TestNamespace, members: &[&str]) -> Vec<String> {
    let mut endpoints = vec![];
    for member in members {
        let pod = ns.pods().get(member).await.unwrap();
        endpoints.push(format!(
            "https://{}:2379",
            pod_ip(&pod).expect("a member pod has an IP")
        ));
    }
    endpoints
}

/// The client Service of cluster `name`, at its ClusterIP (routed into this machine's pod
/// namespaces): an endpoint that outlives any member's pod.
pub async fn service_endpoint(ns: &TestNamespace, name: &str) -> String {
    let service = ns
        .api::<k8s_openapi::api::core::v1::Service>()
        .get(&format!("{name}-client"))
        .await
        .unwrap();
    format!("https://{}:2379", service.spec.unwrap().cluster_ip.unwrap())
}

/// A client of cluster `name` through the pods of the members its status lists.
pub async fn members_client(ns: &TestNamespace, name: &str, cluster: &EtcdCluster) -> Client {
    let names: Vec<String> = member_names(cluster).into_iter().collect();
    let endpoints = member_endpoints(ns, &names.iter().map(String::as_str).collect::<Vec<_>>()).await;
    etcd_client(ns, name, &endpoints).await
}

/// A client of cluster `name` through `endpoints`, with the client certificate from its Secret.
pub async fn etcd_client(ns: &TestNamespace, name: &str, endpoints: &[String]) -> Client {
    try_etcd_client(ns, name, endpoints).await.unwrap()
}

/// [`etcd_client`], or the error of connecting (a member that is down).
pub async fn try_etcd_client(
    ns: &TestNamespace,
    name: &str,
    endpoints: &[String],
) -> Result<Client, etcd_client::Error> {
    try_etcd_client_of(ns, name, &format!("{name}-client"), endpoints).await
}

/// [`try_etcd_client`] with the client certificate from Secret `secret`.
pub async fn try_etcd_client_of(
    ns: &TestNamespace,
    name: &str,
    secret: &str,
    endpoints: &[String],
) -> Result<Client, etcd_client::Error> {
    let secrets: Api<Secret> = ns.api();
    let secret = secrets.get(secret).await.unwrap();
    let data = secret.data.unwrap();
    let text = |key: &str| String::from_utf8(data[key].0.clone()).unwrap();
    let tls = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(text("ca.crt")))
        .identity(Identity::from_pem(text("tls.crt"), text("tls.key")))
        .domain_name(format!("{name}-client.{}.svc", ns.name));
    let options = ConnectOptions::new()
        .with_tls(tls)
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5));
    Client::connect(endpoints, Some(options)).await
}

/// The register the writer writes, and the prefix of the key each write also leaves.
const REGISTER: &str = "history/register";
/// The prefix of the keys the writer leaves, one per acknowledged write.
pub const WRITTEN: &str = "history/written/";

/// One operation of the writer, as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Wrote value n: acknowledged, or failed (it may or may not have taken effect).
    Write { value: u64, acked: bool },
    /// Read the register: the value seen, or a failure.
    Read { value: Option<u64> },
}

/// What the writer did, in order.
#[derive(Debug, Default, Clone)]
pub struct History {
    pub ops: Vec<Op>,
}

impl History {
    pub fn acked_writes(&self) -> usize {
        self.ops
            .iter()
            .filter(|o| matches!(o, Op::Write { acked: true, .. }))
            .count()
    }

    pub fn failed(&self) -> usize {
        self.ops
            .iter()
            .filter(|o| matches!(o, Op::Write { acked: false, .. } | Op::Read { value: None }))
            .count()
    }

    pub fn reads(&self) -> usize {
        self.ops
            .iter()
            .filter(|o| matches!(o, Op::Read { value: Some(_) }))
            .count()
    }

    /// Checks every read against the writes before it. One sequential writer with increasing
    /// values: etcd orders a failed write before every later one or drops it, so a read must
    /// return the last acknowledged value or a later one that was attempted, and never go back.
    pub fn check_reads(&self) -> Result<(), String> {
        let (mut floor, mut attempted) = (0u64, 0u64);
        for (i, op) in self.ops.iter().enumerate() {
            match *op {
                Op::Write { value, acked } => {
                    attempted = value;
                    if acked {
                        floor = value;
                    }
                }
                Op::Read { value: Some(v) } => {
                    if v < floor {
                        return Err(format!(
                            "op {i}: read {v} after {floor} was acknowledged (a lost or stale write)"
                        ));
                    }
                    if v > attempted {
                        return Err(format!("op {i}: read {v}, never written (last attempted {attempted})"));
                    }
                    floor = v;
                }
                Op::Read { value: None } => {}
            }
        }
        Ok(())
    }

    /// The values whose keys are in the cluster now.
    async fn present(client: &mut Client) -> Result<std::collections::BTreeSet<u64>, String> {
        let written = client
            .get(WRITTEN, Some(etcd_client::GetOptions::new().with_prefix()))
            .await
            .map_err(|e| format!("reading the written keys: {e}"))?;
        Ok(written
            .kvs()
            .iter()
            .filter_map(|kv| kv.key_str().ok()?.strip_prefix(WRITTEN)?.parse().ok())
            .collect())
    }

    /// The acknowledged writes that are not in the cluster now (an error if it cannot be read).
    pub async fn lost_writes(&self, client: &mut Client) -> Result<Vec<u64>, String> {
        let present = Self::present(client).await?;
        Ok(self.missing_from(&present))
    }

    fn missing_from(&self, present: &std::collections::BTreeSet<u64>) -> Vec<u64> {
        self.ops
            .iter()
            .filter_map(|o| match o {
                Op::Write { value, acked: true } if !present.contains(value) => Some(*value),
                _ => None,
            })
            .collect()
    }

    /// Checks the data left in the cluster: every acknowledged write is there, and the register
    /// holds the last value that took effect.
    pub async fn check_data(&self, client: &mut Client) -> Result<(), String> {
        let present = Self::present(client).await?;
        let lost = self.missing_from(&present);
        if !lost.is_empty() {
            return Err(format!("acknowledged writes lost: {lost:?}"));
        }
        let register = client
            .get(REGISTER, None)
            .await
            .map_err(|e| format!("reading the register: {e}"))?;
        let value: u64 = register
            .kvs()
            .first()
            .and_then(|kv| kv.value_str().ok()?.parse().ok())
            .unwrap_or(0);
        let highest = present.iter().max().copied().unwrap_or(0);
        if value != highest {
            return Err(format!(
                "the register holds {value}, the highest write that took effect is {highest}"
            ));
        }
        Ok(())
    }
}

/// Merges `spec` into EtcdCluster `name`'s spec.
pub async fn patch_spec(ns: &TestNamespace, name: &str, spec: serde_json::Value) {
    let api: Api<EtcdCluster> = ns.api();
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({ "spec": spec })),
    )
    .await
    .unwrap();
}

/// The member names in the cluster's status.
pub fn member_names(cluster: &EtcdCluster) -> BTreeSet<String> {
    cluster
        .status
        .as_ref()
        .map(|s| s.members.iter().map(|m| m.name.clone()).collect())
        .unwrap_or_default()
}

/// An on-demand EtcdBackup of `cluster`.
pub fn backup_manifest(name: &str, cluster: &str) -> String {
    format!(
        "apiVersion: noops.dev/v1alpha1\nkind: EtcdBackup\nmetadata: {{ name: {name} }}\nspec: {{ cluster: {cluster} }}\n"
    )
}

/// A `backup:` block (to be put in a cluster's spec) to the test's object store.
pub fn backup_spec(ns: &TestNamespace, schedule: Option<&str>, max: i32) -> String {
    let schedule = schedule.map(|s| format!("    schedule: \"{s}\"\n")).unwrap_or_default();
    format!(
        "  backup:\n{schedule}    maxBackups: {max}\n    s3:\n      endpoint: {}\n      bucket: backups\n      credentialsSecret: object-store-credentials\n",
        s3::service_url(ns)
    )
}

/// Waits until cluster `name` is Ready=False with `reason`.
pub async fn wait_ready_false(ns: &TestNamespace, name: &str, reason: &str) -> EtcdCluster {
    let api: Api<EtcdCluster> = ns.api();
    wait_for(
        &format!("{name}: Ready=False {reason}"),
        Duration::from_secs(120),
        || async {
            api.get_opt(name)
                .await
                .ok()
                .flatten()
                .filter(|c| condition(c, "Ready").is_some_and(|(s, r, _)| s == "False" && r == reason))
        },
    )
    .await
}

/// A `backup:` block (to be put in a cluster's spec) to PersistentVolumeClaim `claim`.
pub fn volume_backup_spec(claim: &str, schedule: Option<&str>, max: i32) -> String {
    let schedule = schedule.map(|s| format!("    schedule: \"{s}\"\n")).unwrap_or_default();
    format!("  backup:\n{schedule}    maxBackups: {max}\n    volume:\n      claimName: {claim}\n")
}

/// A PersistentVolumeClaim of the default StorageClass.
pub fn claim_manifest(name: &str, size: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{ name: {name} }}\nspec:\n  accessModes: [ReadWriteOnce]\n  resources: {{ requests: {{ storage: {size} }} }}\n"
    )
}

/// Waits for EtcdBackup `name` to succeed or fail.
pub async fn wait_backup_done(ns: &TestNamespace, name: &str) -> EtcdBackup {
    let api: Api<EtcdBackup> = ns.api();
    wait_for(
        &format!("EtcdBackup {name} to finish"),
        Duration::from_secs(120),
        || async {
            api.get_opt(name).await.ok().flatten().filter(|b| {
                matches!(
                    b.status.as_ref().and_then(|s| s.progress.phase),
                    Some(BackupPhase::Succeeded | BackupPhase::Failed)
                )
            })
        },
    )
    .await
}

/// Makes EtcdBackup `name` of `cluster` on demand and waits for it to succeed.
pub async fn back_up(ns: &TestNamespace, name: &str, cluster: &str) -> EtcdBackup {
    ns.apply(&backup_manifest(name, cluster));
    let backup = wait_backup_done(ns, name).await;
    assert_eq!(
        backup.status.as_ref().and_then(|s| s.progress.phase),
        Some(BackupPhase::Succeeded),
        "{backup:?}"
    );
    backup
}

/// A voting member of `cluster` that does not lead, by its status.
pub fn follower(cluster: &EtcdCluster) -> noops_api::etcd::MemberStatus {
    let status = cluster.status.as_ref().expect("a status");
    status
        .members
        .iter()
        .find(|m| !m.leader && !m.learner)
        .cloned()
        .expect("a follower")
}

/// Deletes `member`'s volume claim and pod, as a lost disk would take them.
pub fn lose_pod_and_volume(ns: &TestNamespace, member: &str) {
    crate::kubectl_ok(
        &[
            "delete",
            "-n",
            &ns.name,
            "pvc",
            &format!("{member}-data"),
            "--wait=false",
        ],
        None,
    );
    crate::kubectl_ok(&["delete", "-n", &ns.name, "pod", member, "--wait=false"], None);
}

/// Waits until cluster `name` is Ready with `replicas` members, `lost` not among them.
pub async fn wait_replaced(ns: &TestNamespace, name: &str, replicas: i32, lost: &str) -> EtcdCluster {
    let api: Api<EtcdCluster> = ns.api();
    wait_for(&format!("{lost} replaced"), Duration::from_secs(300), || async {
        api.get(name)
            .await
            .ok()
            .filter(|c| cluster_ready(c, replicas) && !member_names(c).contains(lost))
    })
    .await
}

/// Waits until cluster `name` is Ready with `replicas` members, every one of them on `version`.
pub async fn wait_on_version(ns: &TestNamespace, name: &str, replicas: i32, version: &str) -> EtcdCluster {
    let api: Api<EtcdCluster> = ns.api();
    wait_for(
        &format!("every member on {version}"),
        Duration::from_secs(300),
        || async {
            api.get(name).await.ok().filter(|c| {
                cluster_ready(c, replicas)
                    && c.status.as_ref().is_some_and(|s| {
                        s.current_version.as_deref() == Some(version)
                            && s.members.iter().all(|m| m.version.as_deref() == Some(version))
                    })
            })
        },
    )
    .await
}

/// An EtcdCluster that starts from EtcdBackup `backup`.
pub fn restore_manifest(name: &str, replicas: i32, version: &str, backup: &str) -> String {
    cluster_manifest(
        name,
        replicas,
        version,
        &format!("  bootstrap:\n    fromBackup: {{ name: {backup} }}\n"),
    )
}

/// SIGKILLs the etcd process of `member` (its container restarts it).
pub fn kill_member_process(ns: &TestNamespace, cluster: &str, member: &str) {
    let pattern = format!("advertise-client-urls=https://{member}.{cluster}.{}.svc", ns.name);
    let status = std::process::Command::new("pkill")
        .args(["-KILL", "-f", &pattern])
        .status()
        .unwrap();
    assert!(status.success(), "no etcd process of {member} to kill");
}

/// A writer and reader running in the background until stopped.
pub struct Writer {
    stop: Arc<AtomicBool>,
    /// Writes acknowledged so far.
    acked: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<History>,
}

/// A writer stopped before this many acknowledged writes runs on (at most [`WRITER_RUNS_ON`])
/// until it has them: an operation that became faster must not leave too little history to
/// judge it by.
const ENOUGH_ACKED: usize = 100;
const WRITER_RUNS_ON: Duration = Duration::from_secs(10);

impl Writer {
    /// Starts writing 1, 2, 3… to the register (each write also leaves its own key) and reading
    /// it back after every write, one operation at a time.
    pub fn start(mut client: Client) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let acked_so_far = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let acked_count = acked_so_far.clone();
        let task = tokio::spawn(async move {
            let mut history = History::default();
            let mut value = 0u64;
            while !stopping.load(Ordering::Relaxed) {
                value += 1;
                let txn = Txn::new().and_then([
                    TxnOp::put(REGISTER, value.to_string(), None),
                    TxnOp::put(format!("{WRITTEN}{value:010}"), value.to_string(), None),
                ]);
                let acked = tokio::time::timeout(Duration::from_secs(6), client.txn(txn))
                    .await
                    .is_ok_and(|r| r.is_ok());
                history.ops.push(Op::Write { value, acked });
                if acked {
                    acked_count.fetch_add(1, Ordering::Relaxed);
                }
                let read = tokio::time::timeout(Duration::from_secs(6), client.get(REGISTER, None)).await;
                let seen = read
                    .ok()
                    .and_then(|r| r.ok())
                    .and_then(|r| r.kvs().first().and_then(|kv| kv.value_str().ok()?.parse().ok()));
                history.ops.push(Op::Read { value: seen });
                if !acked || seen.is_none() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                } else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            history
        });
        Self {
            stop,
            acked: acked_so_far,
            task,
        }
    }

    /// Stops the writer, once it has [`ENOUGH_ACKED`] acknowledged writes or has run on
    /// [`WRITER_RUNS_ON`] more, and returns what it did.
    pub async fn stop(self) -> History {
        let asked = Instant::now();
        while self.acked.load(Ordering::Relaxed) < ENOUGH_ACKED && asked.elapsed() < WRITER_RUNS_ON {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// Removes what a writer left (its register and the key of each write), so that another
/// writer's history is judged against its own writes only.
pub async fn forget_writes(client: &mut Client) {
    client.delete(REGISTER, None).await.unwrap();
    client
        .delete(WRITTEN, Some(etcd_client::DeleteOptions::new().with_prefix()))
        .await
        .unwrap();
}

/// Checks a writer's history and the data it left, with a summary on failure.
pub async fn assert_no_write_lost(history: &History, client: &mut Client, min_acked: usize) {
    let summary = format!(
        "{} acknowledged writes, {} reads, {} failed operations",
        history.acked_writes(),
        history.reads(),
        history.failed()
    );
    eprintln!("writer: {summary}");
    assert!(
        history.acked_writes() >= min_acked,
        "too few writes went through: {summary}"
    );
    if let Err(e) = history.check_reads() {
        panic!("the history is not linearizable: {e} ({summary})");
    }
    let started = Instant::now();
    // The check reads through a healthy member; a moment after a change it may still be busy.
    loop {
        match history.check_data(client).await {
            Ok(()) => return,
            Err(e) if e.starts_with("reading") && started.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => panic!("{e} ({summary})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(value: u64, acked: bool) -> Op {
        Op::Write { value, acked }
    }

    fn r(value: u64) -> Op {
        Op::Read { value: Some(value) }
    }

    #[test]
    fn the_checker_catches_stale_and_invented_reads() {
        let good = History {
            ops: vec![w(1, true), r(1), w(2, false), r(1), w(3, false), r(3), w(4, true), r(4)],
        };
        assert_eq!(good.check_reads(), Ok(()));
        let stale = History {
            ops: vec![w(1, true), r(1), w(2, true), r(1)],
        };
        assert!(stale.check_reads().is_err());
        let back = History {
            ops: vec![w(1, true), w(2, false), r(2), r(1)],
        };
        assert!(back.check_reads().is_err(), "once seen, a write stays");
        let invented = History {
            ops: vec![w(1, true), r(5)],
        };
        assert!(invented.check_reads().is_err());
    }
}
