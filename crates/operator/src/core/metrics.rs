//! Prometheus metrics of every controller: reconciles by result, errors by reason, reconcile
//! duration, whether this replica leads, and the requests it sends to the API server; and per
//! resource what people alert on: its conditions and phase (resource_metrics.rs), an etcd cluster's health, the age of the last backup against
//! its schedule, the last archived WAL, a PostgreSQL's replicas and their lag, and when each
//! certificate the operator issued expires.
//! `charts/noops/files/` holds the alerting rules and the dashboard built on them (a test
//! parses every query and checks each metric it names is one of these).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

use super::api_requests::{CountRequests, RequestCounts};
use super::resource_metrics::{ResourceLabels, ResourceState, ResourceStates, Seconds};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    controller: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    controller: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct ClusterLabels {
    namespace: String,
    cluster: String,
}

/// One certificate of a noops resource, by the Secret that holds it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct CertificateLabels {
    kind: String,
    namespace: String,
    name: String,
    secret: String,
}

impl CertificateLabels {
    fn resource(&self) -> ResourceLabels {
        ResourceLabels {
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// One instance of a noops resource (a PostgreSQL's replica).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct InstanceLabels {
    kind: String,
    namespace: String,
    name: String,
    instance: String,
}

impl InstanceLabels {
    fn resource(&self) -> ResourceLabels {
        ResourceLabels {
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

type HistogramFamily = Family<ControllerLabels, Histogram, fn() -> Histogram>;

/// What a resource's status says of its backups and WAL archive, as seconds since the epoch
/// (`None`: no such series for it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BackupGauges {
    /// When its newest successful backup completed.
    pub last_success: Option<f64>,
    /// The time between two scheduled backups (for a schedule).
    pub interval: Option<f64>,
    /// When its last WAL segment was archived (PostgreSQL).
    pub last_archived_wal: Option<f64>,
    /// Whether the last archiving attempt failed (PostgreSQL).
    pub archiving_failing: Option<bool>,
    /// When the schedule was first followed (for a schedule).
    pub schedule_since: Option<f64>,
}

/// What a PostgreSQL's status says of its replicas.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplicationGauges {
    /// The replicas its spec asks for (instances less the primary).
    pub wanted: i64,
    /// The replicas streaming from the primary now.
    pub streaming: i64,
    /// Each replica's lag: WAL bytes not received yet, and seconds its replay trails the
    /// primary (either unknown while it does not stream).
    pub lag: Vec<ReplicaLag>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplicaLag {
    pub instance: String,
    pub bytes: Option<i64>,
    pub seconds: Option<f64>,
}

/// The operator's metrics, registered once and shared by every controller.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ResultLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    duration: HistogramFamily,
    leader: Gauge<i64, AtomicI64>,
    api_requests: RequestCounts,
    etcd_healthy_members: Family<ClusterLabels, Gauge>,
    etcd_quorum_lost: Family<ClusterLabels, Gauge>,
    etcd_leader: Family<ClusterLabels, Gauge>,
    /// The clusters that have series, so that those of deleted clusters can be dropped.
    etcd_clusters: Mutex<BTreeSet<ClusterLabels>>,
    backup_last_success: Family<ResourceLabels, Seconds>,
    backup_interval: Family<ResourceLabels, Seconds>,
    backup_schedule_since: Family<ResourceLabels, Seconds>,
    wal_last_archived: Family<ResourceLabels, Seconds>,
    wal_archiving_failing: Family<ResourceLabels, Gauge>,
    certificate_expiry: Family<CertificateLabels, Seconds>,
    replicas_wanted: Family<ResourceLabels, Gauge>,
    replicas_streaming: Family<ResourceLabels, Gauge>,
    replication_lag_bytes: Family<InstanceLabels, Gauge>,
    replication_lag_seconds: Family<InstanceLabels, Seconds>,
    /// The resources and certificates that have series, likewise.
    resources: Mutex<BTreeSet<ResourceLabels>>,
    certificates: Mutex<BTreeSet<CertificateLabels>>,
    instances: Mutex<BTreeSet<InstanceLabels>>,
    /// Every resource's conditions and phase (resource_metrics.rs).
    states: ResourceStates,
}

/// `metric`, registered under `name` with `help`.
fn register<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// A new metric of its default value, registered under `name` with `help`.
fn registered<M: Metric + Clone + Default>(registry: &mut Registry, name: &str, help: &str) -> M {
    register(registry, name, help, M::default())
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("noops");
        let r = &mut registry;
        Self {
            reconciles: registered(r, "reconciles", "Reconciles by controller and result (success, error)"),
            errors: registered(r, "reconcile_errors", "Failed reconciles by controller and reason"),
            duration: register(
                r,
                "reconcile_duration_seconds",
                "How long reconciles take, by controller",
                Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 15))),
            ),
            leader: registered(r, "leader", "1 while this replica holds the leader lease"),
            api_requests: registered(
                r,
                "api_requests",
                "Requests sent to the API server, by verb and resource",
            ),
            etcd_healthy_members: registered(r, "etcd_healthy_members", "Healthy voting members of an EtcdCluster"),
            etcd_quorum_lost: registered(
                r,
                "etcd_quorum_lost",
                "1 while an EtcdCluster has lost its quorum (reported after a grace period)",
            ),
            etcd_leader: registered(
                r,
                "etcd_has_leader",
                "1 while the members of an EtcdCluster that answer name a leader",
            ),
            etcd_clusters: Mutex::new(BTreeSet::new()),
            backup_last_success: registered(
                r,
                "backup_last_success_timestamp_seconds",
                "When the newest successful backup of a resource completed (EtcdCluster, PostgreSQL)",
            ),
            backup_interval: registered(
                r,
                "backup_schedule_interval_seconds",
                "The time between two scheduled backups of a resource",
            ),
            backup_schedule_since: registered(
                r,
                "backup_schedule_since_timestamp_seconds",
                "When the backup schedule of a resource was first followed",
            ),
            wal_last_archived: registered(
                r,
                "postgres_wal_last_archived_timestamp_seconds",
                "When a PostgreSQL's last WAL segment was archived",
            ),
            wal_archiving_failing: registered(
                r,
                "postgres_wal_archiving_failing",
                "1 while a PostgreSQL's last attempt to archive a WAL segment failed",
            ),
            certificate_expiry: registered(
                r,
                "certificate_expiry_timestamp_seconds",
                "When a certificate the operator issued expires, by resource and Secret",
            ),
            replicas_wanted: registered(
                r,
                "postgres_replicas_wanted",
                "The replicas a PostgreSQL's spec asks for (instances less the primary)",
            ),
            replicas_streaming: registered(
                r,
                "postgres_replicas_streaming",
                "The replicas of a PostgreSQL streaming from its primary now",
            ),
            replication_lag_bytes: registered(
                r,
                "postgres_replication_lag_bytes",
                "WAL a PostgreSQL's replica has not received yet, in bytes",
            ),
            replication_lag_seconds: registered(
                r,
                "postgres_replication_lag_seconds",
                "How far a PostgreSQL replica's replay trails its primary, as the primary measures it",
            ),
            resources: Mutex::new(BTreeSet::new()),
            certificates: Mutex::new(BTreeSet::new()),
            instances: Mutex::new(BTreeSet::new()),
            states: ResourceStates::register(r),
            registry,
        }
    }

    /// Records what the object of `kind` `namespace/name` says of its state.
    pub fn set_resource_state(&self, kind: &str, namespace: &str, name: &str, state: ResourceState) {
        let resource = ResourceLabels {
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        };
        self.states.set(resource, state);
    }

    /// Records the health of EtcdCluster `cluster` in `namespace`.
    pub fn set_etcd_cluster(
        &self,
        namespace: &str,
        cluster: &str,
        healthy_members: i64,
        quorum_lost: bool,
        has_leader: bool,
    ) {
        let labels = ClusterLabels {
            namespace: namespace.into(),
            cluster: cluster.into(),
        };
        self.etcd_healthy_members.get_or_create(&labels).set(healthy_members);
        self.etcd_quorum_lost.get_or_create(&labels).set(i64::from(quorum_lost));
        self.etcd_leader.get_or_create(&labels).set(i64::from(has_leader));
        if let Ok(mut known) = self.etcd_clusters.lock() {
            known.insert(labels);
        }
    }

    /// Records what the status of resource `kind` `namespace`/`name` says of its backups.
    pub fn set_backups(&self, kind: &str, namespace: &str, name: &str, gauges: &BackupGauges) {
        let labels = ResourceLabels {
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        };
        let seconds = |family: &Family<ResourceLabels, Seconds>, value: Option<f64>| match value {
            Some(v) => {
                family.get_or_create(&labels).set(v);
            }
            None => {
                family.remove(&labels);
            }
        };
        seconds(&self.backup_last_success, gauges.last_success);
        seconds(&self.backup_interval, gauges.interval);
        seconds(&self.backup_schedule_since, gauges.schedule_since);
        seconds(&self.wal_last_archived, gauges.last_archived_wal);
        match gauges.archiving_failing {
            Some(failing) => {
                self.wal_archiving_failing
                    .get_or_create(&labels)
                    .set(i64::from(failing));
            }
            None => {
                self.wal_archiving_failing.remove(&labels);
            }
        }
        if let Ok(mut known) = self.resources.lock() {
            known.insert(labels);
        }
    }

    /// Records what the status of PostgreSQL `namespace`/`name` says of its replicas; the lag
    /// series of instances no longer listed go.
    pub fn set_replication(&self, namespace: &str, name: &str, gauges: &ReplicationGauges) {
        let labels = ResourceLabels {
            kind: "PostgreSQL".into(),
            namespace: namespace.into(),
            name: name.into(),
        };
        self.replicas_wanted.get_or_create(&labels).set(gauges.wanted);
        self.replicas_streaming.get_or_create(&labels).set(gauges.streaming);
        let listed: Vec<InstanceLabels> = gauges
            .lag
            .iter()
            .map(|lag| InstanceLabels {
                kind: labels.kind.clone(),
                namespace: labels.namespace.clone(),
                name: labels.name.clone(),
                instance: lag.instance.clone(),
            })
            .collect();
        for (instance, lag) in listed.iter().zip(&gauges.lag) {
            match lag.bytes {
                Some(bytes) => {
                    self.replication_lag_bytes.get_or_create(instance).set(bytes);
                }
                None => {
                    self.replication_lag_bytes.remove(instance);
                }
            }
            match lag.seconds {
                Some(seconds) => {
                    self.replication_lag_seconds.get_or_create(instance).set(seconds);
                }
                None => {
                    self.replication_lag_seconds.remove(instance);
                }
            }
        }
        if let Ok(mut known) = self.instances.lock() {
            known.retain(|instance| {
                let gone = instance.resource() == labels && !listed.contains(instance);
                if gone {
                    self.replication_lag_bytes.remove(instance);
                    self.replication_lag_seconds.remove(instance);
                }
                !gone
            });
            known.extend(listed);
        }
        if let Ok(mut known) = self.resources.lock() {
            known.insert(labels);
        }
    }

    /// Records that the certificate in Secret `secret` of resource `kind` `namespace`/`name`
    /// expires at `not_after`.
    pub fn set_certificate_expiry(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
        secret: &str,
        not_after: jiff::Timestamp,
    ) {
        let labels = CertificateLabels {
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
            secret: secret.into(),
        };
        self.certificate_expiry
            .get_or_create(&labels)
            .set(not_after.as_millisecond() as f64 / 1000.0);
        if let Ok(mut known) = self.certificates.lock() {
            known.insert(labels);
        }
    }

    /// Drops the state, backup and certificate series of resources of `kind` for which
    /// `exists(namespace, name)` is false.
    pub fn retain_resources(&self, kind: &str, exists: impl Fn(&str, &str) -> bool) {
        self.states.retain(kind, &exists);
        let gone = |labels: &ResourceLabels| labels.kind == kind && !exists(&labels.namespace, &labels.name);
        if let Ok(mut known) = self.resources.lock() {
            known.retain(|labels| {
                if gone(labels) {
                    self.backup_last_success.remove(labels);
                    self.backup_interval.remove(labels);
                    self.backup_schedule_since.remove(labels);
                    self.wal_last_archived.remove(labels);
                    self.wal_archiving_failing.remove(labels);
                    self.replicas_wanted.remove(labels);
                    self.replicas_streaming.remove(labels);
                    return false;
                }
                true
            });
        }
        if let Ok(mut known) = self.certificates.lock() {
            known.retain(|labels| {
                if gone(&labels.resource()) {
                    self.certificate_expiry.remove(labels);
                    return false;
                }
                true
            });
        }
        if let Ok(mut known) = self.instances.lock() {
            known.retain(|labels| {
                if gone(&labels.resource()) {
                    self.replication_lag_bytes.remove(labels);
                    self.replication_lag_seconds.remove(labels);
                    return false;
                }
                true
            });
        }
    }

    /// Drops the series of EtcdClusters for which `exists(namespace, cluster)` is false.
    pub fn retain_etcd_clusters(&self, exists: impl Fn(&str, &str) -> bool) {
        let Ok(mut known) = self.etcd_clusters.lock() else {
            return;
        };
        known.retain(|labels| {
            let keep = exists(&labels.namespace, &labels.cluster);
            if !keep {
                self.etcd_healthy_members.remove(labels);
                self.etcd_quorum_lost.remove(labels);
                self.etcd_leader.remove(labels);
            }
            keep
        });
    }

    /// Counts a successful reconcile of `controller` that took `took`.
    pub fn succeeded(&self, controller: &str, took: Duration) {
        self.count(controller, "success", took);
    }

    /// Counts a failed reconcile with its error reason.
    pub fn failed(&self, controller: &str, reason: &str, took: Duration) {
        self.count(controller, "error", took);
        self.errors
            .get_or_create(&ErrorLabels {
                controller: controller.into(),
                reason: reason.into(),
            })
            .inc();
    }

    fn count(&self, controller: &str, result: &str, took: Duration) {
        self.reconciles
            .get_or_create(&ResultLabels {
                controller: controller.into(),
                result: result.into(),
            })
            .inc();
        self.duration
            .get_or_create(&ControllerLabels {
                controller: controller.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// A layer for the operator's client that counts its requests into these metrics.
    pub fn count_requests(&self) -> CountRequests {
        CountRequests::new(self.api_requests.clone())
    }

    /// Records whether this replica leads.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_with_labels() {
        let m = Metrics::new();
        m.succeeded("maintpage", Duration::from_millis(3));
        m.failed("maintpage", "ApiError", Duration::from_millis(3));
        m.set_leader(true);
        let text = m.render();
        assert!(
            text.contains(r#"noops_reconciles_total{controller="maintpage",result="success"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"noops_reconcile_errors_total{controller="maintpage",reason="ApiError"} 1"#),
            "{text}"
        );
        assert!(text.contains("noops_leader 1"), "{text}");
        assert!(text.contains("noops_reconcile_duration_seconds_bucket"), "{text}");
    }

    #[test]
    fn a_replicas_lag_series_goes_with_the_replica_and_all_go_with_the_database() {
        let m = Metrics::new();
        let lag = |instance: &str, bytes, seconds| ReplicaLag {
            instance: instance.into(),
            bytes,
            seconds,
        };
        m.set_replication(
            "db",
            "shop",
            &ReplicationGauges {
                wanted: 2,
                streaming: 1,
                lag: vec![lag("shop-1", Some(4096), Some(0.25)), lag("shop-2", None, None)],
            },
        );
        let text = m.render();
        for series in [
            r#"noops_postgres_replicas_wanted{kind="PostgreSQL",namespace="db",name="shop"} 2"#,
            r#"noops_postgres_replicas_streaming{kind="PostgreSQL",namespace="db",name="shop"} 1"#,
            r#"noops_postgres_replication_lag_bytes{kind="PostgreSQL",namespace="db",name="shop",instance="shop-1"} 4096"#,
            r#"noops_postgres_replication_lag_seconds{kind="PostgreSQL",namespace="db",name="shop",instance="shop-1"} 0.25"#,
        ] {
            assert!(text.contains(series), "{series} in {text}");
        }
        assert!(
            !text.contains(r#"instance="shop-2""#),
            "no lag known, no series: {text}"
        );
        // Scaled down to one replica (shop-1 gone, shop-2 streaming now).
        m.set_replication(
            "db",
            "shop",
            &ReplicationGauges {
                wanted: 1,
                streaming: 1,
                lag: vec![lag("shop-2", Some(0), Some(0.0))],
            },
        );
        let text = m.render();
        assert!(!text.contains(r#"instance="shop-1""#), "{text}");
        assert!(text.contains(r#"instance="shop-2"} 0"#), "{text}");
        m.retain_resources("PostgreSQL", |_, _| false);
        let text = m.render();
        assert!(!text.contains(r#"name="shop""#), "{text}");
    }

    #[test]
    fn etcd_cluster_series_go_with_their_cluster() {
        let m = Metrics::new();
        m.set_etcd_cluster("db", "main", 1, true, false);
        m.set_etcd_cluster("db", "gone", 3, false, true);
        let text = m.render();
        assert!(
            text.contains(r#"noops_etcd_quorum_lost{namespace="db",cluster="main"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"noops_etcd_healthy_members{namespace="db",cluster="gone"} 3"#),
            "{text}"
        );
        m.retain_etcd_clusters(|_, cluster| cluster == "main");
        let text = m.render();
        assert!(!text.contains(r#"cluster="gone""#), "{text}");
        assert!(text.contains(r#"cluster="main""#), "{text}");
    }

    #[test]
    fn backup_archive_and_certificate_series_go_with_their_resource() {
        let m = Metrics::new();
        let gauges = BackupGauges {
            last_success: Some(1_700_000_000.0),
            interval: Some(3600.0),
            last_archived_wal: Some(1_700_000_100.0),
            archiving_failing: Some(true),
            schedule_since: Some(1_690_000_000.0),
        };
        m.set_backups("PostgreSQL", "shop", "db", &gauges);
        m.set_backups("EtcdCluster", "shop", "main", &BackupGauges::default());
        let at = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        m.set_certificate_expiry("EtcdCluster", "shop", "main", "main-server", at);
        let text = m.render();
        for line in [
            r#"noops_backup_last_success_timestamp_seconds{kind="PostgreSQL",namespace="shop",name="db"} 1700000000"#,
            r#"noops_backup_schedule_interval_seconds{kind="PostgreSQL",namespace="shop",name="db"} 3600"#,
            r#"noops_backup_schedule_since_timestamp_seconds{kind="PostgreSQL",namespace="shop",name="db"} 1690000000"#,
            r#"noops_postgres_wal_last_archived_timestamp_seconds{kind="PostgreSQL",namespace="shop",name="db"} 1700000100"#,
            r#"noops_postgres_wal_archiving_failing{kind="PostgreSQL",namespace="shop",name="db"} 1"#,
            r#"noops_certificate_expiry_timestamp_seconds{kind="EtcdCluster",namespace="shop",name="main",secret="main-server"} 1800000000"#,
        ] {
            assert!(text.contains(line), "no {line} in\n{text}");
        }
        // A resource with no backup yet has no series (an alert on its age cannot fire wrongly).
        assert!(
            !text.contains(r#"noops_backup_last_success_timestamp_seconds{kind="EtcdCluster""#),
            "{text}"
        );
        // A schedule removed takes its series with it.
        m.set_backups(
            "PostgreSQL",
            "shop",
            "db",
            &BackupGauges {
                last_success: Some(1.0),
                ..Default::default()
            },
        );
        let text = m.render();
        assert!(!text.contains("noops_backup_schedule_interval_seconds{"), "{text}");
        assert!(
            !text.contains("noops_backup_schedule_since_timestamp_seconds{"),
            "{text}"
        );
        m.retain_resources("EtcdCluster", |_, _| false);
        let text = m.render();
        assert!(!text.contains("main-server"), "{text}");
        assert!(text.contains(r#"name="db""#), "another kind is kept: {text}");
    }
}
