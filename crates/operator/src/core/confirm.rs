//! Declared confirmations: the reads a step makes of the API server itself instead of a watch
//! cache, because it is about to create or destroy something on their word and a cache may lag
//! (a claim deleted a moment ago, a save pod made a moment ago, an object of that name that is
//! not ours). Every other read a pass makes is of its caches.
//!
//! Each confirmation says why (`why`, a short kebab-case label) and carries it to the API
//! server in header [`CONFIRMS_HEADER`], so a recording of a pass's requests (the passes tests)
//! tells a confirmation from any other read.

use http::HeaderValue;
use kube::api::{GetParams, ListParams, ObjectList};
use kube::{Api, Client};
use serde::de::DeserializeOwned;

/// The header of a confirmation; its value is why the step confirms.
pub const CONFIRMS_HEADER: &str = "x-noops-confirms";

/// Object `name` of `api`, as the API server has it now, if it exists: confirmed for `why`.
pub async fn get<K>(api: &Api<K>, name: &str, why: &'static str) -> kube::Result<Option<K>>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match read(api, name, why).await {
        Ok(object) => Ok(Some(object)),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Object `name` of `api`, as the API server has it now (an error if there is none, as
/// `Api::get`): confirmed for `why`.
pub async fn read<K>(api: &Api<K>, name: &str, why: &'static str) -> kube::Result<K>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let client = Client::from(api.clone());
    let request = kube::core::Request::new(api.resource_url())
        .get(name, &GetParams::default())
        .map_err(kube::Error::BuildRequest)?;
    client.request::<K>(declared(request, "get", why)).await
}

/// The objects of `api` that `params` select, as the API server has them now: confirmed for
/// `why`.
pub async fn list<K>(api: &Api<K>, params: &ListParams, why: &'static str) -> kube::Result<ObjectList<K>>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let client = Client::from(api.clone());
    let request = kube::core::Request::new(api.resource_url())
        .list(params)
        .map_err(kube::Error::BuildRequest)?;
    client.request::<ObjectList<K>>(declared(request, "list", why)).await
}

/// `request` (of `verb`, for the client's own span) with its confirmation header.
fn declared(mut request: http::Request<Vec<u8>>, verb: &'static str, why: &'static str) -> http::Request<Vec<u8>> {
    // A label is ASCII kebab-case, a valid header value; one that is not is sent unnamed.
    let value = HeaderValue::from_str(why).unwrap_or(HeaderValue::from_static("unnamed"));
    request.headers_mut().insert(CONFIRMS_HEADER, value);
    request.extensions_mut().insert(verb);
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_confirmation_carries_why_in_its_header() {
        let request = kube::core::Request::new("/api/v1/namespaces/a/pods")
            .get("p", &GetParams::default())
            .unwrap();
        let request = declared(request, "get", "before-delete");
        assert_eq!(request.headers()[CONFIRMS_HEADER], "before-delete");
        assert_eq!(request.uri().path(), "/api/v1/namespaces/a/pods/p");
    }
}
