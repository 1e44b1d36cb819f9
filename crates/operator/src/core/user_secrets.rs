//! Secrets a user names in a spec (a password, certificates, the keys of a bucket), read with
//! no API request on a settled pass. They carry none of the operator's labels, so no child
//! cache holds them, and holding the data of every Secret of a cluster in memory is out of the
//! question. So the metadata of every Secret is watched (a change also wakes whatever names
//! the Secret), and a Secret's data is read through the API only when its resourceVersion is
//! not the one last read. Only the Secrets asked for are kept.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};

/// The user Secrets of one controller.
pub struct UserSecrets {
    client: Client,
    /// The metadata of every Secret in the watched namespaces.
    metadata: Store<PartialObjectMeta<Secret>>,
    /// The Secrets read so far, by namespace and name.
    read: Mutex<HashMap<(String, String), Arc<Secret>>>,
}

impl UserSecrets {
    /// `metadata`: a cache of every Secret's metadata (`cache::shared_cache` over
    /// `Api<PartialObjectMeta<Secret>>`), which holds its first full list.
    pub fn new(client: Client, metadata: Store<PartialObjectMeta<Secret>>) -> Self {
        Self {
            client,
            metadata,
            read: Mutex::new(HashMap::new()),
        }
    }

    /// The user Secrets of a controller watching `namespace` (all if `None`): the metadata of
    /// every Secret is watched (its first full list is in memory when this returns), and the
    /// changes come out to wake the objects that name them.
    pub async fn watch(
        client: &Client,
        namespace: &Option<String>,
    ) -> (Self, crate::core::cache::Changes<PartialObjectMeta<Secret>>) {
        let (metadata, changes) = crate::core::cache::shared_cache(
            crate::core::controller::scoped_api::<PartialObjectMeta<Secret>>(client, namespace),
            kube::runtime::watcher::Config::default(),
        )
        .await;
        (Self::new(client.clone(), metadata), changes)
    }

    /// Secret `name` in `namespace`, or `None` if there is none: from memory if it has not
    /// changed since it was last read, otherwise through the API.
    pub async fn get(&self, namespace: &str, name: &str) -> Result<Option<Arc<Secret>>, kube::Error> {
        let key = (namespace.to_string(), name.to_string());
        let Some(current) = self.metadata.get(&ObjectRef::new(name).within(namespace)) else {
            self.forget(&key);
            return Ok(None);
        };
        if let Some(known) = self.known(&key)
            && known.metadata.resource_version.is_some()
            && known.metadata.resource_version == current.metadata.resource_version
        {
            return Ok(Some(known));
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        // (Its content: only the metadata of users' Secrets is watched.)
        let fresh = crate::core::confirm::get(&api, name, "secret-content")
            .await?
            .map(Arc::new);
        match &fresh {
            Some(secret) => self.remember(key, secret.clone()),
            None => self.forget(&key),
        }
        Ok(fresh)
    }

    fn known(&self, key: &(String, String)) -> Option<Arc<Secret>> {
        self.read.lock().ok()?.get(key).cloned()
    }

    fn remember(&self, key: (String, String), secret: Arc<Secret>) {
        if let Ok(mut read) = self.read.lock() {
            read.insert(key, secret);
        }
    }

    fn forget(&self, key: &(String, String)) {
        if let Ok(mut read) = self.read.lock() {
            read.remove(key);
        }
    }
}
