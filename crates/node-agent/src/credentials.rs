//! The agent's API client follows its kubeconfig file. A machine's certificates are issued
//! again before they expire: the operator rewrites the machine's bootstrap Secret and the
//! mounted file follows. Every request made after the file changed uses what it says now;
//! requests under way (watches) keep their connection, whose certificate the API server checked
//! when the request began, and end on their own in minutes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use tracing::{info, warn};

/// How often the file is read again. Certificates are issued again with a third of their
/// lifetime left, so this only needs to be well below that.
const LOOK_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("reading {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{path} is not a kubeconfig the agent can use: {message}")]
    Unusable { path: PathBuf, message: String },
}

/// The client that the agent's requests go through now.
#[derive(Clone)]
struct Current(Arc<RwLock<Client>>);

impl tower::Service<Request<Body>> for Current {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, kube::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // A writer never panics while holding the lock; a poisoned one still holds a client.
        let client = self.0.read().unwrap_or_else(|e| e.into_inner()).clone();
        Box::pin(async move { client.send(request).await })
    }
}

/// A client of the kubeconfig at `path`, and the task that keeps it following the file.
pub async fn following(path: &Path) -> Result<(Client, BoxFuture<'static, ()>), CredentialsError> {
    let text = read(path).await?;
    let first = client_of(path).await?;
    let namespace = first.default_namespace().to_string();
    let current = Current(Arc::new(RwLock::new(first)));
    let client = Client::new(current.clone(), namespace);
    Ok((client, Box::pin(follow(path.to_path_buf(), current, text))))
}

async fn follow(path: PathBuf, current: Current, mut text: String) {
    loop {
        tokio::time::sleep(LOOK_EVERY).await;
        let now = match read(&path).await {
            Ok(now) if now != text => now,
            Ok(_) => continue,
            Err(e) => {
                warn!(error = %e, "keeping the credentials in use");
                continue;
            }
        };
        match client_of(&path).await {
            Ok(client) => {
                *current.0.write().unwrap_or_else(|e| e.into_inner()) = client;
                text = now;
                info!(path = %path.display(), "the kubeconfig changed: new requests use its credentials");
            }
            // A file caught half written, or a bad one: the next look tries again.
            Err(e) => warn!(error = %e, "keeping the credentials in use"),
        }
    }
}

async fn read(path: &Path) -> Result<String, CredentialsError> {
    tokio::fs::read_to_string(path)
        .await
        .map_err(|e| CredentialsError::Read {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
}

/// A client of the kubeconfig at `path` (read from the file again, which resolves the paths it
/// names from its folder).
async fn client_of(path: &Path) -> Result<Client, CredentialsError> {
    let unusable = |message: String| CredentialsError::Unusable {
        path: path.to_path_buf(),
        message,
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| unusable(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| unusable(e.to_string()))?;
    Client::try_from(config).map_err(|e| unusable(e.to_string()))
}
