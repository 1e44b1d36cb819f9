//! The slice of the kubelet API that `kubectl logs` needs, served to the API server only.
//!
//! HTTPS on the node IP with a certificate from the cluster's serving CA; every client must
//! present a certificate from the CA given with `--client-ca`, which `make cluster-up` uses only
//! for the API server's kubelet-client certificate; certificate files that change are read
//! again for the connections after. Container logs are files that the container's stdout and stderr
//! are appended to, one per container start.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::stream;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

/// Certificate files of the kubelet API.
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

/// Errors starting the kubelet API.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("failed to read {path}: {message}")]
    Pem { path: PathBuf, message: String },
    #[error("invalid TLS setup: {0}")]
    Tls(String),
    #[error("failed to listen: {0}")]
    Io(#[from] std::io::Error),
}

#[derive(Clone)]
pub struct KubeletApi {
    pub pods_dir: PathBuf,
    pub client: Client,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogParams {
    #[serde(default)]
    follow: Option<String>,
    #[serde(default)]
    previous: Option<String>,
    tail_lines: Option<usize>,
    limit_bytes: Option<usize>,
}

fn flag(v: &Option<String>) -> bool {
    matches!(v.as_deref(), Some("true") | Some("1") | Some(""))
}

fn tls_config(files: &TlsFiles) -> Result<rustls::ServerConfig, ApiError> {
    let pem = |path: &Path, message: String| ApiError::Pem {
        path: path.to_path_buf(),
        message,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| pem(&files.cert, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| pem(&files.cert, e.to_string()))?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| pem(&files.key, e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(&files.client_ca).map_err(|e| pem(&files.client_ca, e.to_string()))? {
        let ca = ca.map_err(|e| pem(&files.client_ca, e.to_string()))?;
        roots.add(ca).map_err(|e| ApiError::Tls(e.to_string()))?;
    }
    let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
        .build()
        .map_err(|e| ApiError::Tls(e.to_string()))?;
    let mut config = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| ApiError::Tls(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// How often the certificate files are read again: a machine's serving certificate is issued
/// again before it expires, and its mounted files follow.
const LOOK_EVERY: Duration = Duration::from_secs(10);

/// The TLS settings of the files as they were last read.
struct Acceptor {
    files: TlsFiles,
    contents: Vec<Vec<u8>>,
    acceptor: TlsAcceptor,
    looked: std::time::Instant,
}

impl Acceptor {
    fn load(files: TlsFiles) -> Result<Self, ApiError> {
        let contents = Self::contents(&files);
        let acceptor = TlsAcceptor::from(Arc::new(tls_config(&files)?));
        Ok(Self {
            files,
            contents,
            acceptor,
            looked: std::time::Instant::now(),
        })
    }

    fn contents(files: &TlsFiles) -> Vec<Vec<u8>> {
        [&files.cert, &files.key, &files.client_ca]
            .iter()
            .map(|path| std::fs::read(path).unwrap_or_default())
            .collect()
    }

    /// The acceptor for the next connection, from the files as they are now.
    fn current(&mut self) -> TlsAcceptor {
        if self.looked.elapsed() >= LOOK_EVERY {
            self.looked = std::time::Instant::now();
            let contents = Self::contents(&self.files);
            if contents != self.contents {
                match tls_config(&self.files) {
                    Ok(config) => {
                        self.acceptor = TlsAcceptor::from(Arc::new(config));
                        self.contents = contents;
                        info!("kubelet API certificates changed: new connections use them");
                    }
                    // Files caught half written: the next look tries again.
                    Err(e) => warn!(error = %e, "keeping the kubelet API certificates in use"),
                }
            }
        }
        self.acceptor.clone()
    }
}

impl KubeletApi {
    /// Serves until the process ends.
    pub async fn serve(self, addr: std::net::SocketAddr, files: TlsFiles) -> Result<(), ApiError> {
        let mut acceptor = Acceptor::load(files)?;
        let router = Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/containerLogs/{namespace}/{pod}/{container}", get(container_logs))
            .with_state(Arc::new(self));
        let listener = TcpListener::bind(addr).await?;
        info!(%addr, "kubelet API listening (mutual TLS)");
        loop {
            let (tcp, peer) = listener.accept().await?;
            let acceptor = acceptor.current();
            let service = TowerToHyperService::new(router.clone());
            tokio::spawn(async move {
                let tls = match acceptor.accept(tcp).await {
                    Ok(tls) => tls,
                    Err(e) => {
                        debug!(%peer, error = %e, "TLS handshake refused");
                        return;
                    }
                };
                let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service);
                if let Err(e) = conn.await {
                    debug!(%peer, error = %e, "kubelet API connection ended");
                }
            });
        }
    }
}

async fn container_logs(
    State(api): State<Arc<KubeletApi>>,
    UrlPath((namespace, pod, container)): UrlPath<(String, String, String)>,
    Query(params): Query<LogParams>,
) -> Response {
    let pods: Api<Pod> = Api::namespaced(api.client.clone(), &namespace);
    let uid = match pods.get_opt(&pod).await {
        Ok(Some(p)) => p.metadata.uid.unwrap_or_default(),
        Ok(None) => return (StatusCode::NOT_FOUND, format!("pod {namespace}/{pod} not found\n")).into_response(),
        Err(e) => return (StatusCode::BAD_GATEWAY, format!("looking up pod: {e}\n")).into_response(),
    };
    let dir = api.pods_dir.join(&uid).join("logs").join(&container);
    let files = log_files(&dir);
    let chosen = if flag(&params.previous) {
        files.iter().rev().nth(1)
    } else {
        files.last()
    };
    let Some(path) = chosen.cloned() else {
        let what = if flag(&params.previous) {
            "previous terminated container"
        } else {
            "container"
        };
        return (
            StatusCode::BAD_REQUEST,
            format!("{what} {container:?} in pod {pod:?} has no logs\n"),
        )
            .into_response();
    };
    let mut data = tokio::fs::read(&path).await.unwrap_or_default();
    if let Some(n) = params.tail_lines {
        data = tail(&data, n).to_vec();
    }
    if let Some(limit) = params.limit_bytes {
        data.truncate(limit);
    }
    if !flag(&params.follow) || flag(&params.previous) {
        return (StatusCode::OK, data).into_response();
    }
    let offset = tokio::fs::metadata(&path).await.map(|m| m.len()).unwrap_or(0);
    let pid_file = api.pods_dir.join(&uid).join("pids").join(&container);
    let follow = stream::unfold(
        (Some(data), offset, path, pid_file),
        |(first, offset, path, pid_file)| async move {
            if let Some(first) = first {
                return Some((Ok::<_, std::io::Error>(first), (None, offset, path, pid_file)));
            }
            loop {
                let grown = read_from(&path, offset).await;
                if !grown.is_empty() {
                    let next = offset + grown.len() as u64;
                    return Some((Ok(grown), (None, next, path, pid_file)));
                }
                if !still_running(&pid_file).await || newest_file_changed(&path) {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        },
    );
    Response::new(Body::from_stream(follow))
}

/// Log files of a container, oldest first (named by restart count).
fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<(i64, PathBuf)> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let n = e.path().file_stem()?.to_str()?.parse::<i64>().ok()?;
                    Some((n, e.path()))
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files.into_iter().map(|(_, p)| p).collect()
}

fn newest_file_changed(path: &Path) -> bool {
    path.parent().map(log_files).and_then(|f| f.last().cloned()).as_deref() != Some(path)
}

async fn still_running(pid_file: &Path) -> bool {
    let Ok(text) = tokio::fs::read_to_string(pid_file).await else {
        return false;
    };
    let pid = text.split_whitespace().next().unwrap_or("0");
    Path::new("/proc").join(pid).exists()
}

async fn read_from(path: &Path, offset: u64) -> Vec<u8> {
    let Ok(mut f) = tokio::fs::File::open(path).await else {
        return vec![];
    };
    if f.seek(std::io::SeekFrom::Start(offset)).await.is_err() {
        return vec![];
    }
    let mut buf = vec![];
    let _ = f.read_to_end(&mut buf).await;
    buf
}

/// The last `n` lines of `data`.
pub fn tail(data: &[u8], n: usize) -> &[u8] {
    if n == 0 {
        return &[];
    }
    let body = data.strip_suffix(b"\n").unwrap_or(data);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return &data[i + 1..];
            }
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_lines() {
        assert_eq!(tail(b"a\nb\nc\n", 2), b"b\nc\n");
        assert_eq!(tail(b"a\nb\nc", 1), b"c");
        assert_eq!(tail(b"a\n", 5), b"a\n");
        assert_eq!(tail(b"a\nb\n", 0), b"");
    }

    #[test]
    fn log_files_sort_numerically() {
        let dir = std::env::temp_dir().join(format!("noops-logs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for n in [0, 2, 10] {
            std::fs::write(dir.join(format!("{n}.log")), "x").unwrap();
        }
        let names: Vec<String> = log_files(&dir)
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().to_string())
            .collect();
        assert_eq!(names, vec!["0.log", "2.log", "10.log"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
