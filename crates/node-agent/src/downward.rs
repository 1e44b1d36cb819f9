//! The downward API: facts about a pod exposed to its containers as env values or files.

use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceFieldSelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The pod plus facts the agent knows before they reach the pod's status.
#[derive(Debug, Clone, Copy)]
pub struct PodFacts<'a> {
    pub pod: &'a Pod,
    pub pod_ip: Ipv4Addr,
    pub host_ip: Ipv4Addr,
    /// Node allocatable CPU cores and memory bytes: the value of an unset limit.
    pub node_cpu: f64,
    pub node_memory: f64,
}

/// A downward API reference that cannot be resolved.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{0}")]
pub struct DownwardError(pub String);

/// The value of a `fieldRef.fieldPath`.
pub fn field_value(facts: &PodFacts<'_>, path: &str) -> Result<String, DownwardError> {
    let meta = &facts.pod.metadata;
    let spec = facts.pod.spec.as_ref();
    let map_entry = |map: &Option<std::collections::BTreeMap<String, String>>, key: &str| {
        map.as_ref().and_then(|m| m.get(key)).cloned().unwrap_or_default()
    };
    if let Some(key) = subscript(path, "metadata.labels") {
        return Ok(map_entry(&meta.labels, key));
    }
    if let Some(key) = subscript(path, "metadata.annotations") {
        return Ok(map_entry(&meta.annotations, key));
    }
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(&meta.labels),
        "metadata.annotations" => format_map(&meta.annotations),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
        "status.podIP" | "status.podIPs" => facts.pod_ip.to_string(),
        "status.hostIP" | "status.hostIPs" => facts.host_ip.to_string(),
        other => return Err(DownwardError(format!("unsupported fieldRef fieldPath {other:?}"))),
    })
}

/// `metadata.labels['key']` → `key`.
fn subscript<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    path.strip_prefix(prefix)?.strip_prefix("['")?.strip_suffix("']")
}

fn format_map(map: &Option<std::collections::BTreeMap<String, String>>) -> String {
    map.iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value of a `resourceFieldRef` for `container`, rounded up to whole `divisor`s as the
/// kubelet does. An unset limit reads as the node's allocatable amount.
pub fn resource_value(
    facts: &PodFacts<'_>,
    container: &Container,
    selector: &ResourceFieldSelector,
) -> Result<String, DownwardError> {
    let resources = container.resources.as_ref();
    let (list, name) = selector
        .resource
        .split_once('.')
        .ok_or_else(|| DownwardError(format!("unsupported resource {:?}", selector.resource)))?;
    let set = match list {
        "limits" => resources.and_then(|r| r.limits.as_ref()),
        "requests" => resources.and_then(|r| r.requests.as_ref()),
        _ => None,
    };
    let value = match set.and_then(|s| s.get(name)) {
        Some(q) => parse_quantity(q)?,
        None => match name {
            "cpu" if list == "limits" => facts.node_cpu,
            "memory" if list == "limits" => facts.node_memory,
            "cpu" | "memory" | "ephemeral-storage" => 0.0,
            _ => return Err(DownwardError(format!("unsupported resource {:?}", selector.resource))),
        },
    };
    let divisor = match &selector.divisor {
        Some(d) => parse_quantity(d)?,
        None => 1.0,
    };
    if divisor <= 0.0 {
        return Err(DownwardError("resourceFieldRef divisor must be positive".into()));
    }
    Ok(format!("{}", (value / divisor).ceil() as u64))
}

/// Parses a Kubernetes quantity ("100m", "1Gi", "2", "1e3") into a number.
pub fn parse_quantity(q: &Quantity) -> Result<f64, DownwardError> {
    noops_api::quantity::parse(&q.0).ok_or_else(|| DownwardError(format!("invalid quantity {:?}", q.0.trim())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use std::collections::BTreeMap;

    fn pod() -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web-0".into());
        p.metadata.namespace = Some("shop".into());
        p.metadata.labels = Some(BTreeMap::from([("app".into(), "web".into())]));
        p.spec = Some(PodSpec {
            node_name: Some("n1".into()),
            ..Default::default()
        });
        p
    }

    fn facts(p: &Pod) -> PodFacts<'_> {
        PodFacts {
            pod: p,
            pod_ip: Ipv4Addr::new(10, 244, 0, 7),
            host_ip: Ipv4Addr::new(10, 244, 0, 1),
            node_cpu: 2.0,
            node_memory: 1024.0 * 1024.0 * 1024.0,
        }
    }

    #[test]
    fn fields() {
        let p = pod();
        let f = facts(&p);
        assert_eq!(field_value(&f, "metadata.name").unwrap(), "web-0");
        assert_eq!(field_value(&f, "metadata.namespace").unwrap(), "shop");
        assert_eq!(field_value(&f, "status.podIP").unwrap(), "10.244.0.7");
        assert_eq!(field_value(&f, "metadata.labels['app']").unwrap(), "web");
        assert_eq!(field_value(&f, "metadata.labels").unwrap(), "app=\"web\"");
        assert_eq!(field_value(&f, "spec.nodeName").unwrap(), "n1");
        assert!(field_value(&f, "spec.bogus").is_err());
    }

    #[test]
    fn quantities() {
        let q = |s: &str| parse_quantity(&Quantity(s.into())).unwrap();
        assert_eq!(q("100m"), 0.1);
        assert_eq!(q("1Gi"), 1073741824.0);
        assert_eq!(q("2"), 2.0);
        assert_eq!(q("1e3"), 1000.0);
        assert!(parse_quantity(&Quantity("12x".into())).is_err());
    }

    #[test]
    fn resources_round_up_and_default_to_node() {
        let p = pod();
        let f = facts(&p);
        let c = Container {
            resources: Some(ResourceRequirements {
                limits: Some(BTreeMap::from([("memory".into(), Quantity("64Mi".into()))])),
                requests: Some(BTreeMap::from([("cpu".into(), Quantity("250m".into()))])),
                ..Default::default()
            }),
            ..Default::default()
        };
        let sel = |r: &str, d: Option<&str>| ResourceFieldSelector {
            resource: r.into(),
            divisor: d.map(|d| Quantity(d.into())),
            container_name: None,
        };
        assert_eq!(
            resource_value(&f, &c, &sel("limits.memory", Some("1Mi"))).unwrap(),
            "64"
        );
        assert_eq!(resource_value(&f, &c, &sel("requests.cpu", None)).unwrap(), "1");
        assert_eq!(resource_value(&f, &c, &sel("requests.cpu", Some("1m"))).unwrap(), "250");
        assert_eq!(resource_value(&f, &c, &sel("limits.cpu", None)).unwrap(), "2");
    }
}
