//! Prometheus metrics of every controller: reconciles by result, errors by reason, reconcile
//! duration, whether this replica leads, and the requests it sends to the API server.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::api_requests::{CountRequests, RequestCounts};

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

type HistogramFamily = Family<ControllerLabels, Histogram, fn() -> Histogram>;

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
    /// The clusters that have series, so that those of deleted clusters can be dropped.
    etcd_clusters: Mutex<BTreeSet<ClusterLabels>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("noops");
        let reconciles = Family::<ResultLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let duration: HistogramFamily =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 15)));
        let leader = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "reconciles",
            "Reconciles by controller and result (success, error)",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles by controller and reason",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "How long reconciles take, by controller",
            duration.clone(),
        );
        registry.register("leader", "1 while this replica holds the leader lease", leader.clone());
        let api_requests = RequestCounts::default();
        registry.register(
            "api_requests",
            "Requests sent to the API server, by verb and resource",
            api_requests.clone(),
        );
        let etcd_healthy_members = Family::<ClusterLabels, Gauge>::default();
        let etcd_quorum_lost = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "etcd_healthy_members",
            "Healthy voting members of an EtcdCluster",
            etcd_healthy_members.clone(),
        );
        registry.register(
            "etcd_quorum_lost",
            "1 while an EtcdCluster has lost its quorum (reported after a grace period)",
            etcd_quorum_lost.clone(),
        );
        Self {
            registry,
            reconciles,
            errors,
            duration,
            leader,
            api_requests,
            etcd_healthy_members,
            etcd_quorum_lost,
            etcd_clusters: Mutex::new(BTreeSet::new()),
        }
    }

    /// Records the health of EtcdCluster `cluster` in `namespace`.
    pub fn set_etcd_cluster(&self, namespace: &str, cluster: &str, healthy_members: i64, quorum_lost: bool) {
        let labels = ClusterLabels {
            namespace: namespace.into(),
            cluster: cluster.into(),
        };
        self.etcd_healthy_members.get_or_create(&labels).set(healthy_members);
        self.etcd_quorum_lost.get_or_create(&labels).set(i64::from(quorum_lost));
        if let Ok(mut known) = self.etcd_clusters.lock() {
            known.insert(labels);
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
    fn etcd_cluster_series_go_with_their_cluster() {
        let m = Metrics::new();
        m.set_etcd_cluster("db", "main", 1, true);
        m.set_etcd_cluster("db", "gone", 3, false);
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
}
