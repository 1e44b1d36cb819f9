//! Whether a tenant's address ranges overlap this cluster's: its nodes' pod ranges and its
//! Service ranges. The tenant's machines (part 2) are pods of this cluster that route the
//! tenant's ranges inside their own network namespaces; an overlap would hide this cluster's
//! addresses from them, the tenant's own API server among them. The schema cannot see this
//! cluster's ranges, so the controller reads them, until the control plane has served (its
//! ranges cannot change after that).

use std::fmt;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::Api;
use noops_api::control_plane::{KubernetesControlPlane, NetworkingSpec};

/// An IPv4 range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    base: u32,
    prefix: u8,
}

impl Range {
    /// `10.244.1.0/24`, or a bare address as its /32. `None` for anything else (IPv6 too: the
    /// tenant's ranges are IPv4, so an IPv6 range cannot overlap them).
    pub fn parse(text: &str) -> Option<Self> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, prefix.parse::<u8>().ok()?),
            None => (text, 32),
        };
        let base = u32::from(address.parse::<Ipv4Addr>().ok()?);
        (prefix <= 32).then_some(Self { base, prefix })
    }

    fn mask(prefix: u8) -> u32 {
        u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
    }

    /// Whether the two ranges share an address: the shorter prefix's mask makes them equal.
    pub fn overlaps(&self, other: &Self) -> bool {
        let mask = Self::mask(self.prefix.min(other.prefix));
        self.base & mask == other.base & mask
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.base), self.prefix)
    }
}

/// A range this cluster uses, and what uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    pub range: Range,
    /// Such as "the pods of node noops-node-1" or "ServiceCIDR kubernetes".
    pub by: String,
}

/// Why the tenant's ranges cannot be used here, if one overlaps a range this cluster uses.
pub fn overlap(networking: &NetworkingSpec, taken: &[Taken]) -> Option<String> {
    let tenant = [
        ("networking.podCIDR", &networking.pod_cidr),
        ("networking.serviceCIDR", &networking.service_cidr),
    ];
    for (field, text) in tenant {
        let Some(range) = Range::parse(text) else { continue };
        if let Some(hit) = taken.iter().find(|t| t.range.overlaps(&range)) {
            return Some(format!(
                "{field} {range} overlaps {} ({}), which this cluster uses; choose a range outside every range of this cluster",
                hit.range, hit.by
            ));
        }
    }
    None
}

/// Whether a pass must read this cluster's ranges: not once the control plane has served (its
/// ranges are fixed then), nor when the last status, written for this generation, found them
/// clear and its EtcdCluster is made (`made`). So the nodes and ServiceCIDRs are listed on the
/// first passes, after an edit, and while a range is taken, not on every pass of a creation.
pub fn must_check(kcp: &KubernetesControlPlane, made: bool) -> bool {
    let Some(status) = kcp.status.as_ref() else {
        return true;
    };
    let served = status.version.is_some();
    let checked_this_generation =
        status.observed_generation.is_some() && status.observed_generation == kcp.metadata.generation;
    let found_taken = status.conditions.iter().any(|c| c.reason == RANGE_TAKEN);
    !served && (!made || !checked_this_generation || found_taken)
}

/// The reason of the conditions that say a range is taken.
pub const RANGE_TAKEN: &str = noops_api::control_plane::KubernetesControlPlaneReason::RangeTaken.as_str();

/// Why the ranges are read from the API (checked before a control plane is made or changed, and
/// nothing else of this cluster's nodes and Service ranges is watched).
const RANGES: &str = "ranges-before-create";

/// The ranges this cluster uses: each node's pod ranges, and its Service ranges (ServiceCIDR
/// objects; on a cluster without them, the address of its `kubernetes` Service).
pub async fn read_taken(client: &kube::Client) -> Result<Vec<Taken>, kube::Error> {
    let mut taken = Vec::new();
    let nodes = Api::<Node>::all(client.clone());
    for node in crate::core::confirm::list(&nodes, &Default::default(), RANGES).await? {
        let name = node.metadata.name.unwrap_or_default();
        let spec = node.spec.unwrap_or_default();
        let ranges = spec.pod_cidrs.unwrap_or_default().into_iter().chain(spec.pod_cidr);
        for range in ranges.filter_map(|r| Range::parse(&r)) {
            let by = format!("the pods of node {name}");
            if !taken.contains(&Taken { range, by: by.clone() }) {
                taken.push(Taken { range, by });
            }
        }
    }
    match crate::core::confirm::list(&Api::<ServiceCIDR>::all(client.clone()), &Default::default(), RANGES).await {
        Ok(list) => {
            for cidr in list {
                let name = cidr.metadata.name.unwrap_or_default();
                let ranges = cidr.spec.and_then(|s| s.cidrs).unwrap_or_default();
                for range in ranges.iter().filter_map(|r| Range::parse(r)) {
                    let by = format!("ServiceCIDR {name}");
                    taken.push(Taken { range, by });
                }
            }
        }
        Err(kube::Error::Api(e)) if e.code == 404 => {
            let services = Api::<Service>::namespaced(client.clone(), "default");
            let kubernetes = crate::core::confirm::get(&services, "kubernetes", RANGES).await?;
            let address = kubernetes.and_then(|s| s.spec?.cluster_ip);
            if let Some(range) = address.as_deref().and_then(Range::parse) {
                let by = "the Service range of this cluster (its kubernetes Service)".into();
                taken.push(Taken { range, by });
            }
        }
        Err(e) => return Err(e),
    }
    Ok(taken)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(text: &str) -> Range {
        Range::parse(text).unwrap()
    }

    #[test]
    fn ranges_parse_and_overlap_as_addresses_do() {
        assert_eq!(range("10.244.1.0/24").to_string(), "10.244.1.0/24");
        assert_eq!(range("10.96.0.1").to_string(), "10.96.0.1/32");
        for bad in ["fd00::/64", "10.0.0.0/33", "banana", "10.0.0/8", ""] {
            assert_eq!(Range::parse(bad), None, "{bad}");
        }
        assert!(
            range("10.96.0.0/12").overlaps(&range("10.100.0.0/16")),
            "kubeadm's default holds 10.100"
        );
        assert!(
            range("10.100.0.0/16").overlaps(&range("10.96.0.0/12")),
            "either way round"
        );
        assert!(!range("10.96.0.0/12").overlaps(&range("10.112.0.0/16")));
        assert!(range("10.244.0.0/16").overlaps(&range("10.244.3.0/24")));
        assert!(!range("10.244.0.0/16").overlaps(&range("10.245.0.0/16")));
        assert!(range("0.0.0.0/0").overlaps(&range("192.168.1.1")));
        assert!(range("10.96.0.1").overlaps(&range("10.96.0.0/16")));
    }

    #[test]
    fn ranges_are_read_until_served_only_when_something_may_have_changed() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        use noops_api::control_plane::KubernetesControlPlaneStatus;
        let status = |generation: i64, version: Option<&str>, reason: &str| KubernetesControlPlaneStatus {
            observed_generation: Some(generation),
            version: version.map(str::to_string),
            conditions: vec![Condition {
                type_: "Degraded".into(),
                status: if reason == RANGE_TAKEN { "True" } else { "False" }.into(),
                reason: reason.into(),
                message: String::new(),
                observed_generation: Some(generation),
                last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
            }],
            ..Default::default()
        };
        let kcp = |s: Option<KubernetesControlPlaneStatus>| {
            let mut kcp = crate::control_plane::fixtures::control_plane("team-a").build();
            kcp.metadata.generation = Some(2);
            kcp.status = s;
            kcp
        };
        assert!(must_check(&kcp(None), false), "a first pass");
        assert!(
            must_check(&kcp(Some(status(2, None, "AsExpected"))), false),
            "nothing made yet"
        );
        assert!(
            !must_check(&kcp(Some(status(2, None, "AsExpected"))), true),
            "found clear, made"
        );
        assert!(
            must_check(&kcp(Some(status(1, None, "AsExpected"))), true),
            "edited since"
        );
        assert!(
            must_check(&kcp(Some(status(2, None, RANGE_TAKEN))), true),
            "a range taken is looked at again"
        );
        assert!(
            !must_check(&kcp(Some(status(2, Some("1.34.4"), RANGE_TAKEN))), true),
            "served: fixed"
        );
    }

    #[test]
    fn an_overlap_names_the_field_the_range_and_who_uses_it() {
        let taken = vec![
            Taken {
                range: range("10.244.1.0/24"),
                by: "the pods of node n1".into(),
            },
            Taken {
                range: range("10.96.0.0/16"),
                by: "ServiceCIDR kubernetes".into(),
            },
        ];
        let defaults = NetworkingSpec::default();
        assert_eq!(
            overlap(&defaults, &taken),
            None,
            "the defaults stay clear of common ranges"
        );
        let pods = NetworkingSpec {
            pod_cidr: "10.244.0.0/16".into(),
            ..NetworkingSpec::default()
        };
        let message = overlap(&pods, &taken).unwrap();
        assert!(
            message.starts_with("networking.podCIDR 10.244.0.0/16 overlaps 10.244.1.0/24 (the pods of node n1)"),
            "{message}"
        );
        let services = NetworkingSpec {
            service_cidr: "10.96.0.0/12".into(),
            ..NetworkingSpec::default()
        };
        let message = overlap(&services, &taken).unwrap();
        assert!(
            message.contains("networking.serviceCIDR 10.96.0.0/12 overlaps 10.96.0.0/16 (ServiceCIDR kubernetes)"),
            "{message}"
        );
        assert_eq!(overlap(&pods, &[]), None, "nothing taken, nothing to say");
    }
}
