//! `kubectl noops backup`: an on-demand backup, made as the resource's own kind of backup
//! object (EtcdBackup, PostgresBackup), waited for with a line at each change.

use noops_api::backup::BackupPhase;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use noops_api::backup::BackupProgress;
use noops_api::{EtcdBackup, EtcdBackupSpec, PostgresBackup, PostgresBackupSpec};

use crate::report::{age, size};
use crate::resources::Kind;

/// The name of an on-demand backup of `name` made at `now`: sortable, and the resource's.
pub fn backup_name(name: &str, now: jiff::Timestamp) -> String {
    format!("{name}-manual-{}", now.strftime("%Y%m%d-%H%M%S"))
}

/// The line that says where a backup stands.
pub fn progress_line(progress: &BackupProgress, waited: Duration) -> String {
    let phase = progress.phase.map_or("Pending", BackupPhase::as_str);
    let mut line = format!("{:>5}  {phase}", age(waited.as_secs() as i64));
    if let Some(bytes) = progress.size {
        line.push_str(&format!(", {}", size(bytes)));
    }
    if let Some(work) = &progress.under_way {
        line.push_str(&format!(", {}", crate::kinds::work_progress(work)));
    }
    if let Some(location) = &progress.location {
        line.push_str(&format!(", {location}"));
    }
    let not_stored = progress
        .conditions
        .iter()
        .find(|c| c.type_ == noops_api::condition::SUCCEEDED && c.status == "False" && !c.message.is_empty());
    if let Some(condition) = not_stored {
        line.push_str(&format!(": {}", condition.message));
    }
    line
}

/// Makes the backup and waits for it (up to `deadline`).
pub async fn take(
    client: &Client,
    namespace: &str,
    kind: Kind,
    name: &str,
    deadline: Duration,
) -> anyhow::Result<ExitCode> {
    let backup = backup_name(name, jiff::Timestamp::now());
    match kind {
        Kind::EtcdCluster => {
            let spec = EtcdBackupSpec {
                cluster: name.into(),
                paused: false,
            };
            let object = EtcdBackup::new(&backup, spec);
            let progress = |b: EtcdBackup| b.status.map(|s| s.progress);
            make_and_wait(Api::namespaced(client.clone(), namespace), object, progress, deadline).await
        }
        Kind::PostgreSQL => {
            let spec = PostgresBackupSpec {
                postgresql: name.into(),
                paused: false,
            };
            let object = PostgresBackup::new(&backup, spec);
            let progress = |b: PostgresBackup| b.status.map(|s| s.progress);
            make_and_wait(Api::namespaced(client.clone(), namespace), object, progress, deadline).await
        }
        Kind::MaintPage => bail!("a MaintPage has nothing to back up"),
        Kind::EtcdBackup | Kind::PostgresBackup => {
            bail!("{kind} {name} is a backup already: back up what it backs up (etcd/<cluster> or pg/<database>)")
        }
        Kind::MachineDeployment | Kind::MachineSet | Kind::Machine => bail!(
            "machines keep no state to back up: their cluster's state is its control plane's etcd (kubectl noops backup etcd/<control plane>-etcd)"
        ),
        Kind::KubernetesCluster | Kind::KubernetesControlPlane => bail!(
            "a cluster's state is its control plane's etcd: back up that EtcdCluster \
             (kubectl noops backup etcd/<the name in status.etcd of its KubernetesControlPlane>)"
        ),
    }
}

async fn make_and_wait<K>(
    api: Api<K>,
    object: K,
    progress: impl Fn(K) -> Option<BackupProgress>,
    deadline: Duration,
) -> anyhow::Result<ExitCode>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let name = object.name_any();
    let kind = K::kind(&()).to_string();
    api.create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating {kind} {name}"))?;
    println!("{kind} {name}");
    let started = std::time::Instant::now();
    let mut last = String::new();
    loop {
        let now = progress(api.get(&name).await.with_context(|| format!("reading {kind} {name}"))?).unwrap_or_default();
        let line = progress_line(&now, started.elapsed());
        // The time waited leads the line: print it when what follows changes.
        let news = line
            .trim_start()
            .split_once("  ")
            .map(|(_, rest)| rest.to_string())
            .unwrap_or_default();
        if news != last {
            println!("{line}");
            last = news;
        }
        if now.is_done() {
            return Ok(if now.succeeded() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
        if started.elapsed() > deadline {
            eprintln!("error: {kind} {name} is not done after {}s", deadline.as_secs());
            return Ok(ExitCode::FAILURE);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    #[test]
    fn names_sort_by_time_and_lines_say_the_phase_size_and_why() {
        let now: jiff::Timestamp = "2026-11-26T12:34:56Z".parse().unwrap();
        assert_eq!(backup_name("main", now), "main-manual-20261126-123456");
        let mut progress = BackupProgress::default();
        assert_eq!(progress_line(&progress, Duration::from_secs(2)), "   2s  Pending");
        progress.phase = Some(BackupPhase::Succeeded);
        progress.size = Some(2048);
        progress.location = Some("pvc://backups/etcd/db/main/x.db".into());
        assert_eq!(
            progress_line(&progress, Duration::from_secs(9)),
            "   9s  Succeeded, 2.0 KiB, pvc://backups/etcd/db/main/x.db"
        );
        progress.phase = Some(BackupPhase::Failed);
        progress.size = None;
        progress.location = None;
        progress.conditions = vec![Condition {
            type_: "Succeeded".into(),
            status: "False".into(),
            reason: "NoDestination".into(),
            message: "the cluster has no spec.backup".into(),
            observed_generation: None,
            last_transition_time: Time(now),
        }];
        assert_eq!(
            progress_line(&progress, Duration::from_secs(1)),
            "   1s  Failed: the cluster has no spec.backup"
        );
    }
}
