//! The report of each kind, from the resource and what lies around it (its backups, the
//! certificates the operator issued it, its Warning Events). Pure: the time is a parameter.
//! The machine kinds and the backups have files of their own.

mod backups;
mod machines;

pub use backups::{etcd_backup, postgres_backup};
pub use machines::{machine, machine_deployment, machine_set};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use noops_api::backup::BackupPhase;
use noops_api::backup::BackupProgress;
use noops_api::condition::{DEGRADED, PAUSED, PROGRESSING, READY};
use noops_api::etcd::OperationKind;
use noops_api::kubernetes_cluster::{SCALING, UPGRADING};
use noops_api::machine::DRAIN_HELD;
use noops_api::machine_set::MACHINES_DELETING;
use noops_api::postgres::{SYNCHRONOUS_REPLICAS, TOO_FEW_REPLICAS};
use noops_api::{EtcdCluster, KubernetesCluster, KubernetesControlPlane, MaintPage, PostgreSQL};

use crate::report::{Report, Section, age, size};

/// What was read beside the resource.
#[derive(Debug, Clone, Default)]
pub struct Around {
    pub now: jiff::Timestamp,
    /// Its backups: (name, their progress).
    pub backups: Vec<(String, BackupProgress)>,
    /// The certificates the operator issued it: (Secret, when it expires).
    pub certificates: Vec<(String, jiff::Timestamp)>,
    /// Its Warning Events: (when last seen, reason, message).
    pub warnings: Vec<(jiff::Timestamp, String, String)>,
}

impl Around {
    fn since(&self, t: &Time) -> String {
        age(self.now.duration_since(t.0).as_secs())
    }
}

/// The report every kind starts from: its name, whether it is Ready for its current
/// generation, its phase, what its conditions say is wrong, and its last warnings.
fn base(kind: &str, meta: &ObjectMeta, conditions: &[Condition], observed: Option<i64>, around: &Around) -> Report {
    let ready = observed == meta.generation && conditions.iter().any(|c| c.type_ == READY && c.status == "True");
    // A condition is a problem when it says something is wrong: Degraded True, machines whose
    // deletion a budget holds, or any other False but those that are only news (Progressing,
    // a cluster's Upgrading and Scaling) and Paused (said on a line of its own, from the spec).
    let problems = conditions
        .iter()
        .filter(|c| match c.type_.as_str() {
            DEGRADED => c.status == "True",
            MACHINES_DELETING => c.status == "True" && c.reason == DRAIN_HELD,
            PROGRESSING | UPGRADING | SCALING | PAUSED => false,
            _ => c.status == "False",
        })
        .map(|c| (c.type_.clone(), c.reason.clone(), c.message.clone()))
        .collect();
    let mut warnings = around.warnings.clone();
    warnings.sort_by_key(|(t, _, _)| *t);
    let recent = warnings.len().saturating_sub(5);
    Report {
        kind: kind.into(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        ready,
        problems,
        warnings: warnings[recent..]
            .iter()
            .map(|(t, reason, message)| {
                (
                    age(around.now.duration_since(*t).as_secs()),
                    reason.clone(),
                    message.clone(),
                )
            })
            .collect(),
        ..Default::default()
    }
}

fn backups(around: &Around) -> Section {
    let mut rows: Vec<(Option<jiff::Timestamp>, Vec<String>)> = around
        .backups
        .iter()
        .map(|(name, p)| {
            let when = p.completed_at.as_ref().or(p.started_at.as_ref());
            let phase = p.phase.map_or("Pending", BackupPhase::as_str).to_string();
            let phase = match &p.under_way {
                Some(work) => format!("{phase}: {}", work_progress(work)),
                None => phase,
            };
            (
                when.map(|t| t.0),
                vec![
                    name.clone(),
                    phase,
                    p.size.map(size).unwrap_or_default(),
                    when.map(|t| around.since(t)).unwrap_or_default(),
                    p.location.clone().unwrap_or_default(),
                ],
            )
        })
        .collect();
    rows.sort_by_key(|(when, _)| *when);
    Section {
        title: "Backups (oldest first)".into(),
        header: ["NAME", "PHASE", "SIZE", "AGE", "WHERE"].map(String::from).to_vec(),
        rows: rows.into_iter().map(|(_, row)| row).collect(),
    }
}

/// Long work under way in words: its step, the bytes done of how many, and for a WAL replay
/// how far it has got. Pure.
pub fn work_progress(work: &noops_api::backup::WorkProgress) -> String {
    let mut out = work.step.clone();
    match (work.bytes_done, work.bytes_total) {
        (Some(done), Some(total)) if total > 0 => {
            let percent = (done.min(total) * 100) / total;
            out.push_str(&format!(", {} of {} ({percent}%)", size(done), size(total)));
        }
        (Some(done), _) => out.push_str(&format!(", {} so far", size(done))),
        _ => {}
    }
    if let Some(wal) = &work.replayed_wal {
        out.push_str(&format!(", at WAL {wal}"));
    }
    if let Some(to) = &work.replayed_to {
        out.push_str(&format!(", transactions up to {to}"));
    }
    out
}

fn certificates(around: &Around) -> Section {
    Section {
        title: "Certificates".into(),
        header: ["SECRET", "EXPIRES", "IN"].map(String::from).to_vec(),
        rows: around
            .certificates
            .iter()
            .map(|(secret, at)| {
                vec![
                    secret.clone(),
                    at.strftime("%Y-%m-%d %H:%M UTC").to_string(),
                    age(at.duration_since(around.now).as_secs()),
                ]
            })
            .collect(),
    }
}

/// An EtcdCluster: its members (leader, learners, versions, health, database sizes), the
/// operation under way and for how long, its backups and certificates.
pub fn etcd(cluster: &EtcdCluster, around: &Around) -> Report {
    let status = cluster.status.clone().unwrap_or_default();
    let mut report = base(
        "EtcdCluster",
        &cluster.metadata,
        &status.conditions,
        status.observed_generation,
        around,
    );
    report.phase = status.phase.map(|p| p.to_string());
    report.paused = cluster.spec.paused;
    report.fact(
        "version",
        status
            .current_version
            .clone()
            .unwrap_or_else(|| cluster.spec.version.clone()),
    );
    if status.current_version.as_deref() != Some(cluster.spec.version.as_str()) {
        report.fact("asked", cluster.spec.version.clone());
    }
    report.fact(
        "members",
        format!("{} ready of {}", status.ready_members, cluster.spec.replicas),
    );
    report.fact("leader", status.leader.clone().unwrap_or_else(|| "none".into()));
    if let Some(op) = &status.operation {
        let what = match op.kind {
            OperationKind::AddMember => "adding",
            OperationKind::RemoveMember => "removing",
            OperationKind::Upgrade => "upgrading",
            _ => "changing",
        };
        report.fact(
            "under way",
            format!(
                "{what} {} ({}) for {}",
                op.member,
                op.reason,
                around.since(&op.started_at)
            ),
        );
    }
    if let Some(secret) = &status.client_secret {
        report.fact("client Secret", secret.clone());
    }
    last_backup(&mut report, &status.backups, around);
    report.tables.push(Section {
        title: "Members".into(),
        header: ["NAME", "ROLE", "HEALTH", "VERSION", "NODE", "DB SIZE (IN USE)"]
            .map(String::from)
            .to_vec(),
        rows: status
            .members
            .iter()
            .map(|m| {
                let role = if m.leader {
                    "leader"
                } else if m.learner {
                    "learner"
                } else {
                    "voter"
                };
                let health = match (&m.healthy, &m.unhealthy_since) {
                    (true, _) => "healthy".to_string(),
                    (false, Some(since)) => format!("unhealthy for {}", around.since(since)),
                    (false, None) => "unhealthy".to_string(),
                };
                let db = match (m.db_size, m.db_size_in_use) {
                    (Some(total), Some(used)) => format!("{} ({})", size(total), size(used)),
                    (Some(total), None) => size(total),
                    _ => String::new(),
                };
                vec![
                    m.name.clone(),
                    role.into(),
                    health,
                    m.version.clone().unwrap_or_default(),
                    m.node.clone().unwrap_or_default(),
                    db,
                ]
            })
            .collect(),
    });
    report.tables.push(backups(around));
    report.tables.push(certificates(around));
    report
}

fn last_backup(report: &mut Report, backups: &noops_api::backup::BackupsStatus, around: &Around) {
    match (&backups.last_backup, &backups.last_backup_time) {
        (Some(name), Some(at)) => report.fact("last backup", format!("{name}, {} ago", around.since(at))),
        _ => report.fact("last backup", "none yet"),
    }
}

/// A PostgreSQL: its instance and node, timeline, the last archived WAL and its age, its
/// backups with size and age, a restore and how far it got.
pub fn postgres(pg: &PostgreSQL, around: &Around) -> Report {
    let status = pg.status.clone().unwrap_or_default();
    let mut report = base(
        "PostgreSQL",
        &pg.metadata,
        &status.conditions,
        status.observed_generation,
        around,
    );
    report.phase = status.phase.map(|p| p.to_string());
    report.paused = pg.spec.paused;
    report.fact(
        "version",
        status.server_version.clone().unwrap_or_else(|| pg.spec.version.clone()),
    );
    let instance = status.instance.clone().unwrap_or_else(|| "none yet".into());
    let node = status.node.as_deref().map(|n| format!(" on {n}")).unwrap_or_default();
    report.fact("instance", format!("{instance}{node}"));
    if pg.spec.instances > 1 {
        report.fact(
            "instances",
            format!(
                "{} of {} ready, primary {}",
                status.ready_instances.unwrap_or(0),
                pg.spec.instances,
                status.current_primary.as_deref().unwrap_or("none yet")
            ),
        );
        if let Some(shared) = &status.placement {
            report.fact("PLACEMENT", shared.clone());
        }
        // What a commit waits for, and whether enough replicas are there to give it.
        let commits = match (&pg.spec.synchronous, &status.synchronous_standby_names) {
            (None, _) => "acknowledged by the primary alone (asynchronous)".to_string(),
            (Some(_), Some(names)) => format!("wait for {names}"),
            (Some(_), None) => "acknowledged by the primary alone for now".to_string(),
        };
        let short = status
            .conditions
            .iter()
            .find(|c| c.type_ == SYNCHRONOUS_REPLICAS && c.reason == TOO_FEW_REPLICAS);
        match short {
            Some(c) => report.fact("COMMITS", format!("{commits}: {}", c.message)),
            None => report.fact("commits", commits),
        }
    }
    if let Some(endpoint) = &status.endpoint {
        report.fact("endpoint", endpoint.clone());
    }
    if let Some(secret) = &status.connection_secret {
        report.fact("connection Secret", secret.clone());
    }
    if pg.spec.backup.is_some() {
        let archived = match (&status.last_archived_wal, &status.last_archived_time) {
            (Some(wal), Some(at)) => format!("{wal}, {} ago", around.since(at)),
            _ => "none yet".into(),
        };
        report.fact("last archived WAL", archived);
        if let (Some(wal), Some(at)) = (&status.last_failed_wal, &status.last_failed_time) {
            let failing = status.last_archived_time.as_ref().is_none_or(|ok| ok.0 < at.0);
            if failing {
                report.fact("ARCHIVING FAILS", format!("{wal}, since {} ago", around.since(at)));
            }
        }
        last_backup(&mut report, &status.backups, around);
    } else {
        report.fact("backups", "none (no spec.backup: a lost volume loses the database)");
    }
    if let Some(work) = &status.restoring {
        let from = work.source.as_deref().map(|b| format!(" from {b}")).unwrap_or_default();
        report.fact("RESTORING", format!("{}{from}", work_progress(work)));
    }
    if let Some(restore) = &status.restore {
        let timeline = restore.timeline.map(|t| format!(", timeline {t}")).unwrap_or_default();
        let to = restore
            .recovered_to
            .as_deref()
            .map(|t| format!(", recovered to {t}"))
            .unwrap_or_default();
        let done = restore
            .completed_at
            .as_deref()
            .map(|t| format!(", done at {t}"))
            .unwrap_or_else(|| ", under way".into());
        report.fact("restored from", format!("{}{timeline}{to}{done}", restore.backup));
    }
    if pg.spec.instances > 1 || status.members.len() > 1 {
        report.tables.push(members(&status.members, around));
    }
    report.tables.push(backups(around));
    report
}

/// A PostgreSQL's instances: role, node, whether Ready and streaming, WAL positions and lag.
fn members(members: &[noops_api::postgres::MemberStatus], around: &Around) -> Section {
    let rows = members
        .iter()
        .map(|m| {
            let state = match (m.ready, m.streaming) {
                (false, _) => "not ready",
                (true, Some(false)) => "not streaming",
                (true, _) => "ready",
            };
            let lag = match (m.lag_bytes, m.lag_millis) {
                (Some(bytes), Some(ms)) => format!("{} / {ms} ms", size(bytes)),
                (Some(bytes), None) => size(bytes),
                _ => String::new(),
            };
            vec![
                m.name.clone(),
                format!("{:?}", m.role),
                m.node.clone().unwrap_or_default(),
                state.into(),
                m.received_lsn.clone().unwrap_or_default(),
                m.replayed_lsn.clone().unwrap_or_default(),
                lag,
                m.observed_at.as_ref().map(|t| around.since(t)).unwrap_or_default(),
            ]
        })
        .collect();
    Section {
        title: "Instances".into(),
        header: [
            "INSTANCE", "ROLE", "NODE", "STATE", "RECEIVED", "REPLAYED", "LAG", "SEEN",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    }
}

/// A MaintPage: which side its Service publishes, and since when.
pub fn maintpage(page: &MaintPage, around: &Around) -> Report {
    let status = page.status.clone().unwrap_or_default();
    let mut report = base(
        "MaintPage",
        &page.metadata,
        &status.conditions,
        status.observed_generation,
        around,
    );
    report.paused = page.spec.paused;
    let side = |s: &Option<noops_api::maintpage::Side>| {
        s.as_ref()
            .map(|s| format!("{s:?}").to_lowercase())
            .unwrap_or_else(|| "none".into())
    };
    report.fact("published", side(&status.published));
    if let Some(at) = &status.switched_at {
        report.fact("switched", format!("{} ago", around.since(at)));
    }
    if status.waiting_for.is_some() {
        report.fact("waiting for", side(&status.waiting_for));
    }
    report.fact(
        "ready pods",
        format!(
            "app {}, maintenance {}",
            status.app_ready_replicas, status.maintenance_ready_replicas
        ),
    );
    report
}

/// A KubernetesCluster: its version, control plane and nodes, each pool (desired, ready,
/// updated, version, and for a pool that scales itself its bounds), and an upgrade under way
/// with the steps it finished.
pub fn kubernetes_cluster(kc: &KubernetesCluster, around: &Around) -> Report {
    let status = kc.status.clone().unwrap_or_default();
    let mut report = base(
        "KubernetesCluster",
        &kc.metadata,
        &status.conditions,
        status.observed_generation,
        around,
    );
    report.phase = status.phase.map(|p| p.to_string());
    report.paused = kc.spec.paused;
    report.fact("version", status.version.clone().unwrap_or_else(|| "none yet".into()));
    if status
        .version
        .as_deref()
        .is_none_or(|v| !v.starts_with(&kc.spec.version))
    {
        report.fact("asked", kc.spec.version.clone());
    }
    report.fact(
        "control plane",
        status.control_plane.clone().unwrap_or_else(|| "not serving yet".into()),
    );
    report.fact("nodes", status.nodes.clone().unwrap_or_default());
    if let Some(secret) = &status.kubeconfig_secret {
        report.fact("kubeconfig Secret", secret.clone());
    }
    if let Some(upgrade) = status.upgrade.as_ref().filter(|u| u.finished_at.is_none()) {
        let done = if upgrade.finished.is_empty() {
            String::new()
        } else {
            format!("; done: {}", upgrade.finished.join(", "))
        };
        report.fact(
            "under way",
            format!(
                "upgrading {} to {} for {}: {}{done}",
                upgrade.from,
                upgrade.to,
                around.since(&upgrade.started_at),
                upgrade.step
            ),
        );
    }
    report.tables.push(Section {
        title: "Pools".into(),
        header: ["POOL", "DESIRED", "READY", "UPDATED", "VERSION", "SCALES"]
            .map(String::from)
            .to_vec(),
        rows: kc
            .spec
            .workers
            .iter()
            .map(|pool| {
                let seen = status.pools.iter().find(|p| p.name == pool.name);
                let scales = match (pool.min_replicas, pool.max_replicas) {
                    (Some(min), Some(max)) => format!("{min}-{max}"),
                    _ => "fixed".into(),
                };
                vec![
                    pool.name.clone(),
                    seen.map(|p| p.desired.to_string()).unwrap_or_default(),
                    seen.map(|p| p.ready.to_string()).unwrap_or_default(),
                    seen.map(|p| p.updated.to_string()).unwrap_or_default(),
                    seen.and_then(|p| p.version.clone()).unwrap_or_default(),
                    scales,
                ]
            })
            .collect(),
    });
    report
}

/// A KubernetesControlPlane: its version, API servers ready, endpoint, etcd, an upgrade's
/// step, and the certificates it was issued.
pub fn control_plane(kcp: &KubernetesControlPlane, around: &Around) -> Report {
    let status = kcp.status.clone().unwrap_or_default();
    let mut report = base(
        "KubernetesControlPlane",
        &kcp.metadata,
        &status.conditions,
        status.observed_generation,
        around,
    );
    report.phase = status.phase.map(|p| p.to_string());
    report.paused = kcp.spec.paused;
    report.fact("version", status.version.clone().unwrap_or_else(|| "none yet".into()));
    report.fact("API servers ready", status.ready.clone().unwrap_or_default());
    if let Some(endpoint) = &status.endpoint {
        report.fact("endpoint", endpoint.clone());
    }
    if let Some(etcd) = &status.etcd {
        report.fact("etcd", format!("EtcdCluster {etcd}"));
    }
    if let Some(secret) = &status.admin_kubeconfig_secret {
        report.fact("kubeconfig Secret", secret.clone());
    }
    if let Some(upgrade) = &status.upgrade {
        report.fact(
            "under way",
            format!(
                "upgrading {} to {} for {}: {}",
                upgrade.from,
                upgrade.to,
                around.since(&upgrade.started_at),
                upgrade.step
            ),
        );
    }
    report.tables.push(certificates(around));
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use noops_api::etcd::{EtcdClusterStatus, MemberStatus, Operation};

    /// The reasons the report matches on are ones the kinds it reads them from list (the
    /// CRD schema's enum, which the operator can only say).
    #[test]
    fn every_reason_matched_is_one_the_kind_says() {
        use noops_api::machine_deployment::MachineDeploymentReason;
        use noops_api::machine_set::MachineSetReason;
        use noops_api::postgres::PostgreSQLReason;
        assert!(MachineSetReason::from_name(DRAIN_HELD).is_some());
        assert!(MachineDeploymentReason::from_name(DRAIN_HELD).is_some());
        assert!(PostgreSQLReason::from_name(TOO_FEW_REPLICAS).is_some());
    }

    #[test]
    fn work_under_way_says_its_step_bytes_and_replay() {
        let downloading = noops_api::backup::WorkProgress {
            step: "downloading the base backup".into(),
            bytes_done: Some(3 * 1024 * 1024),
            bytes_total: Some(12 * 1024 * 1024),
            ..Default::default()
        };
        assert_eq!(
            work_progress(&downloading),
            "downloading the base backup, 3.0 MiB of 12.0 MiB (25%)"
        );
        let replaying = noops_api::backup::WorkProgress {
            step: "replaying WAL".into(),
            replayed_wal: Some("0/3000060".into()),
            replayed_to: Some("2026-11-26T18:35:02Z".into()),
            ..Default::default()
        };
        assert_eq!(
            work_progress(&replaying),
            "replaying WAL, at WAL 0/3000060, transactions up to 2026-11-26T18:35:02Z"
        );
    }

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_postgresql_with_replicas_lists_each_instance_its_role_and_lag() {
        let mut pg: PostgreSQL = serde_json::from_value(serde_json::json!({
            "apiVersion": "noops.dev/v1alpha1", "kind": "PostgreSQL",
            "metadata": { "name": "shop", "namespace": "prod", "generation": 1 },
            "spec": { "db": "shop", "user": "shop", "passwordSecret": "s", "instances": 2 },
        }))
        .unwrap();
        let seen = Some(Time(at("2026-11-26T11:59:55Z")));
        let member = |name: &str, role, lag: Option<i64>| noops_api::postgres::MemberStatus {
            name: name.into(),
            role,
            node: Some("n1".into()),
            ready: true,
            timeline: None,
            received_lsn: Some("0/5000000".into()),
            replayed_lsn: None,
            lag_bytes: lag,
            lag_millis: lag.map(|_| 40),
            streaming: lag.map(|_| true),
            observed_at: seen.clone(),
        };
        pg.status = Some(noops_api::postgres::PostgreSQLStatus {
            current_primary: Some("shop-0".into()),
            ready_instances: Some(2),
            placement: Some("shop-0 and shop-1 share node n1".into()),
            members: vec![
                member("shop-0", noops_api::postgres::Role::Primary, None),
                member("shop-1", noops_api::postgres::Role::Replica, Some(2048)),
            ],
            ..Default::default()
        });
        let around = Around {
            now: at("2026-11-26T12:00:00Z"),
            ..Default::default()
        };
        let text = postgres(&pg, &around).text();
        assert!(text.contains("2 of 2 ready, primary shop-0"), "{text}");
        assert!(text.contains("asynchronous"), "{text}");
        pg.spec.synchronous = Some(noops_api::postgres::SynchronousSpec {
            number: 1,
            data_durability: noops_api::postgres::DataDurability::Required,
        });
        if let Some(status) = pg.status.as_mut() {
            status.synchronous_standby_names = Some(r#"ANY 1 ("shop-1")"#.into());
        }
        let text = postgres(&pg, &around).text();
        assert!(text.contains(r#"wait for ANY 1 ("shop-1")"#), "{text}");
        assert!(text.contains("PLACEMENT"), "{text}");
        let line = text
            .lines()
            .find(|l| l.contains("shop-1") && l.contains("Replica"))
            .unwrap();
        assert!(line.contains("2.0 KiB / 40 ms") && line.contains("5s"), "{line}");
    }

    fn condition(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: format!("{type_} says {reason}"),
            observed_generation: Some(1),
            last_transition_time: Time(at("2026-11-26T11:00:00Z")),
        }
    }

    #[test]
    fn an_etcd_report_shows_members_the_operation_backups_and_certificates() {
        let mut cluster: EtcdCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "noops.dev/v1alpha1", "kind": "EtcdCluster",
            "metadata": { "name": "main", "namespace": "db", "generation": 1 },
            "spec": { "replicas": 3, "version": "3.5.21" },
        }))
        .unwrap();
        let member = |name: &str, leader: bool, learner: bool| MemberStatus {
            name: name.into(),
            healthy: !learner,
            leader,
            learner,
            version: Some("3.5.21".into()),
            node: Some("noops-node-1".into()),
            db_size: Some(2 * 1024 * 1024),
            db_size_in_use: Some(1024 * 1024),
            ..Default::default()
        };
        cluster.status = Some(EtcdClusterStatus {
            observed_generation: Some(1),
            conditions: vec![
                condition("Ready", "True", "Ready"),
                condition("Degraded", "False", "AsExpected"),
            ],
            phase: Some(noops_api::etcd::EtcdClusterPhase::Running),
            ready_members: 2,
            leader: Some("main-0".into()),
            current_version: Some("3.5.21".into()),
            members: vec![
                member("main-0", true, false),
                member("main-1", false, false),
                member("main-3", false, true),
            ],
            operation: Some(Operation {
                kind: OperationKind::AddMember,
                member: "main-3".into(),
                member_id: None,
                reason: "scale up".into(),
                version: None,
                node: None,
                started_at: Time(at("2026-11-26T11:59:15Z")),
            }),
            ..Default::default()
        });
        let around = Around {
            now: at("2026-11-26T12:00:00Z"),
            backups: vec![(
                "main-1".into(),
                BackupProgress {
                    phase: Some(BackupPhase::Succeeded),
                    size: Some(3 * 1024 * 1024),
                    completed_at: Some(Time(at("2026-11-26T11:00:00Z"))),
                    ..Default::default()
                },
            )],
            certificates: vec![("main-server".into(), at("2027-11-26T12:00:00Z"))],
            warnings: vec![],
        };
        let report = etcd(&cluster, &around);
        assert!(report.ready && report.problems.is_empty(), "{report:?}");
        let text = report.text();
        for expected in [
            "EtcdCluster db/main: Ready (Running)",
            "main-0\n",
            "adding main-3 (scale up) for 45s",
            "learner",
            "2.0 MiB (1.0 MiB)",
            "3.0 MiB",
            "main-server",
            "365d",
        ] {
            assert!(text.contains(expected), "no {expected:?} in\n{text}");
        }
    }

    #[test]
    fn problems_and_the_last_five_warnings_are_reported() {
        let mut page: MaintPage = serde_json::from_value(serde_json::json!({
            "apiVersion": "noops.dev/v1alpha1", "kind": "MaintPage",
            "metadata": { "name": "shop", "namespace": "web", "generation": 2 },
            "spec": {
                "app": { "name": "shop", "image": "x", "port": 8080 },
                "maintenance": { "image": "y", "port": 8080, "enabled": false },
            },
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        page.status = Some(noops_api::maintpage::MaintPageStatus {
            observed_generation: Some(1),
            conditions: vec![condition("Ready", "True", "Published")],
            ..Default::default()
        });
        let now = at("2026-11-26T12:00:00Z");
        let around = Around {
            now,
            warnings: (0..7)
                .map(|i| {
                    (
                        now - jiff::SignedDuration::from_secs(60 * (7 - i)),
                        format!("W{i}"),
                        "m".into(),
                    )
                })
                .collect(),
            ..Default::default()
        };
        let report = maintpage(&page, &around);
        assert!(!report.ready, "a status of an older generation is not Ready");
        let reasons: Vec<&str> = report.warnings.iter().map(|(_, r, _)| r.as_str()).collect();
        assert_eq!(reasons, ["W2", "W3", "W4", "W5", "W6"]);
        let mut broken = page.clone();
        broken.status.as_mut().unwrap().conditions = vec![condition("Ready", "False", "AppNotReady")];
        let problems = maintpage(&broken, &around).problems;
        assert_eq!(problems[0].1, "AppNotReady");
        // Paused is said on a line of its own, never as a problem, whichever way it is.
        let mut told = page.clone();
        told.status.as_mut().unwrap().conditions = vec![
            condition("Ready", "True", "Published"),
            condition("Paused", "False", "NotPaused"),
        ];
        assert!(maintpage(&told, &around).problems.is_empty());
    }

    #[test]
    fn a_cluster_report_shows_each_pool_and_the_upgrade_under_way() {
        let mut kc: KubernetesCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "noops.dev/v1alpha1", "kind": "KubernetesCluster",
            "metadata": { "name": "acme", "namespace": "t", "generation": 2 },
            "spec": { "version": "1.34", "workers": [
                { "name": "general", "replicas": 2 },
                { "name": "burst", "minReplicas": 1, "maxReplicas": 3 },
            ] },
        }))
        .unwrap();
        kc.status = Some(serde_json::from_value(serde_json::json!({
            "observedGeneration": 2, "phase": "Upgrading", "version": "1.33.13",
            "controlPlane": "1.34.4 1/1", "nodes": "3/3",
            "conditions": [
                { "type": "Ready", "status": "True", "reason": "Ready", "message": "",
                  "lastTransitionTime": "2026-11-26T11:00:00Z" },
            ],
            "pools": [
                { "name": "general", "machineDeployment": "acme-general", "desired": 2, "ready": 2, "updated": 1, "version": "1.34.4" },
            ],
            "upgrade": { "from": "1.33.13", "to": "1.34.4", "step": "Pool general",
                         "finished": ["ControlPlane"], "startedAt": "2026-11-26T11:58:00Z" },
        }))
        .unwrap());
        let around = Around {
            now: at("2026-11-26T12:00:00Z"),
            ..Default::default()
        };
        let text = kubernetes_cluster(&kc, &around).text();
        for expected in [
            "KubernetesCluster t/acme: Ready (Upgrading)",
            "upgrading 1.33.13 to 1.34.4 for 2m: Pool general; done: ControlPlane",
            "asked",
            "1-3",
            "fixed",
        ] {
            assert!(text.contains(expected), "no {expected:?} in\n{text}");
        }
        let general = text.lines().find(|l| l.trim_start().starts_with("general")).unwrap();
        assert!(general.contains("1.34.4"), "{general}");
    }
}
