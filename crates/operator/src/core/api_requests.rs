//! The operator's own requests to the API server, counted by verb and resource: a layer on its
//! client (`noops run` adds it), exported as `noops_api_requests_total`. A settled cluster
//! should cost the API server nothing but the leader's lease renewals; this is how a
//! benchmark (and anyone with a Prometheus) sees whether it does.
//!
//! The verbs are Kubernetes' own (as in its audit log): `get`, `list` and `watch` for reads,
//! `create`, `update`, `patch`, `delete` and `deletecollection` for writes. The resource is
//! the plural name with its subresource (`etcdclusters/status`), never an object's name, so
//! the series stay few.

use std::task::{Context, Poll};

use http::{Method, Request};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// The labels of one series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub verb: String,
    pub resource: String,
}

/// The counters, shared by the layer and the registry.
pub type RequestCounts = Family<RequestLabels, Counter>;

/// A tower layer that counts every request going through it.
#[derive(Clone)]
pub struct CountRequests {
    counts: RequestCounts,
}

impl CountRequests {
    pub fn new(counts: RequestCounts) -> Self {
        Self { counts }
    }
}

impl<S> tower::Layer<S> for CountRequests {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            counts: self.counts.clone(),
        }
    }
}

/// The client's service, counting.
#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
    counts: RequestCounts,
}

impl<S, B> tower::Service<Request<B>> for Counted<S>
where
    S: tower::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (verb, resource) = classify(request.method(), request.uri().path(), request.uri().query());
        self.counts
            .get_or_create(&RequestLabels {
                verb: verb.into(),
                resource,
            })
            .inc();
        self.inner.call(request)
    }
}

/// The verb and resource of a request to the API server. Pure.
pub fn classify(method: &Method, path: &str, query: Option<&str>) -> (&'static str, String) {
    let segments = segments(path);
    let Some(rest) = resource_part(&segments) else {
        return (verb(method, true, query), "nonresource".into());
    };
    let (resource, named) = match rest {
        [] => ("discovery".to_string(), false),
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, sub, ..] => (format!("{resource}/{sub}"), true),
    };
    (verb(method, named, query), resource)
}

/// The name of the object a request path names, if it names one (for tests that record
/// requests). Pure.
pub fn object_name(path: &str) -> Option<String> {
    let segments = segments(path);
    resource_part(&segments)?.get(1).map(|name| name.to_string())
}

fn segments(path: &str) -> Vec<&str> {
    path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect()
}

/// The part of a path from the resource on: `/api/v1/...` or `/apis/<group>/<version>/...`,
/// past `namespaces/<ns>`; none for anything else (`/version`), which is not a resource.
fn resource_part<'a>(segments: &'a [&'a str]) -> Option<&'a [&'a str]> {
    let rest = match segments.first() {
        Some(&"api") => segments.get(2..)?,
        Some(&"apis") => segments.get(3..)?,
        _ => return None,
    };
    Some(if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        &rest[2..]
    } else {
        rest
    })
}

fn verb(method: &Method, named: bool, query: Option<&str>) -> &'static str {
    let watching = query.is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    match *method {
        Method::GET if watching => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(method: Method, uri: &str) -> (&'static str, String) {
        let (path, query) = uri.split_once('?').map_or((uri, None), |(p, q)| (p, Some(q)));
        classify(&method, path, query)
    }

    #[test]
    fn requests_are_named_by_kubernetes_verb_and_resource_never_by_object() {
        assert_eq!(
            of(Method::GET, "/api/v1/namespaces/db/secrets/main-ca"),
            ("get", "secrets".into())
        );
        assert_eq!(
            of(Method::GET, "/api/v1/namespaces/db/pods?labelSelector=a"),
            ("list", "pods".into())
        );
        assert_eq!(
            of(Method::GET, "/api/v1/pods?watch=true&resourceVersion=5"),
            ("watch", "pods".into())
        );
        assert_eq!(
            of(
                Method::PATCH,
                "/apis/noops.dev/v1alpha1/namespaces/db/etcdclusters/main/status?fieldManager=noops"
            ),
            ("patch", "etcdclusters/status".into())
        );
        assert_eq!(
            of(
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/noops/leases/noops"
            ),
            ("update", "leases".into())
        );
        assert_eq!(
            of(Method::POST, "/api/v1/namespaces/db/events"),
            ("create", "events".into())
        );
        assert_eq!(
            of(Method::DELETE, "/api/v1/namespaces/db/pods/main-0"),
            ("delete", "pods".into())
        );
        assert_eq!(
            of(Method::DELETE, "/api/v1/namespaces/db/pods"),
            ("deletecollection", "pods".into())
        );
        assert_eq!(of(Method::GET, "/api/v1/nodes/node-1"), ("get", "nodes".into()));
        assert_eq!(of(Method::GET, "/api/v1/namespaces/db"), ("get", "namespaces".into()));
        assert_eq!(of(Method::GET, "/version"), ("get", "nonresource".into()));
        assert_eq!(
            object_name("/api/v1/namespaces/db/pods/main-0").as_deref(),
            Some("main-0")
        );
        assert_eq!(
            object_name("/apis/noops.dev/v1alpha1/namespaces/db/etcdclusters/main/status").as_deref(),
            Some("main")
        );
        assert_eq!(object_name("/api/v1/namespaces/db/pods"), None);
        assert_eq!(object_name("/api/v1/nodes/node-1").as_deref(), Some("node-1"));
        assert_eq!(
            of(Method::GET, "/apis/noops.dev/v1alpha1"),
            ("list", "discovery".into())
        );
    }
}
