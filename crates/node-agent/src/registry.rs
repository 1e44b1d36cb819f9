//! The registry of a real node: the images this machine built (OCI layout tarballs made by
//! `hack/images.sh`), served read-only over the registry API, as the mirror of every registry
//! in the node's containerd. A pull of a built image (an `imagePullPolicy: Always`, a `:latest`)
//! resolves here to the same digest the node already imported; any other is refused with 403
//! and a reason phrase that names what is built, which containerd reports as the pull's error.
//! Blobs are read in place from the tarballs: nothing is unpacked.

use std::collections::BTreeMap;
use std::io::SeekFrom;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::net::TcpListener;
use tracing::{info, warn};

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// Where a blob's bytes are: a span of one tarball.
#[derive(Debug, Clone, PartialEq)]
struct Span {
    tarball: PathBuf,
    offset: u64,
    size: u64,
}

/// A built image: its full reference split as a pull splits it.
#[derive(Debug, Clone, PartialEq)]
struct Named {
    host: String,
    repository: String,
    tag: String,
    manifest: String,
}

/// What the tarballs of a folder hold.
#[derive(Debug, Default)]
pub struct Store {
    images: Vec<Named>,
    blobs: BTreeMap<String, Span>,
}

/// The store of the images folder, read again once `hack/images.sh` has rebuilt it (its
/// `built.txt` changed): after a rebuild, a pull gets the new image rather than spans of a
/// tarball that was written anew.
#[derive(Debug, Default)]
pub struct Shelf {
    dir: Option<PathBuf>,
    /// The store and the `built.txt` modification time it was read at.
    read: RwLock<(Option<SystemTime>, Arc<Store>)>,
}

impl Shelf {
    /// The images of `dir` (none: no images).
    pub fn open(dir: Option<&Path>) -> std::io::Result<Self> {
        let shelf = Shelf {
            dir: dir.map(Path::to_path_buf),
            read: RwLock::default(),
        };
        if let Some(dir) = dir {
            let stamp = Self::stamp(dir);
            let store = Store::load(dir)?;
            if let Ok(mut read) = shelf.read.write() {
                *read = (stamp, Arc::new(store));
            }
        }
        Ok(shelf)
    }

    fn stamp(dir: &Path) -> Option<SystemTime> {
        std::fs::metadata(dir.join("built.txt")).and_then(|m| m.modified()).ok()
    }

    /// The store as the folder holds it now.
    pub fn store(&self) -> Arc<Store> {
        let Some(dir) = &self.dir else {
            return Arc::new(Store::default());
        };
        let stamp = Self::stamp(dir);
        if let Ok(read) = self.read.read()
            && read.0 == stamp
        {
            return read.1.clone();
        }
        match Store::load(dir) {
            Ok(store) => {
                let store = Arc::new(store);
                info!(images = store.images.len(), "the built images changed: read them again");
                if let Ok(mut read) = self.read.write() {
                    *read = (stamp, store.clone());
                }
                store
            }
            // Being written: what was read before serves until it is whole.
            Err(e) => {
                warn!(error = %e, "cannot read the built images again yet");
                self.read.read().map(|r| r.1.clone()).unwrap_or_default()
            }
        }
    }
}

#[derive(Debug, Deserialize)]
struct Index {
    manifests: Vec<IndexEntry>,
}

#[derive(Debug, Deserialize)]
struct IndexEntry {
    digest: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// Splits `host/repository:tag` (a full reference, as containerd names an image).
fn split_reference(reference: &str) -> Option<(String, String, String)> {
    let (host, rest) = reference.split_once('/')?;
    let (repository, tag) = rest.rsplit_once(':')?;
    Some((host.to_string(), repository.to_string(), tag.to_string()))
}

/// The registry host a mirror request is for (`?ns=`), as images name it.
fn canonical_host(ns: &str) -> &str {
    match ns {
        "registry-1.docker.io" | "index.docker.io" => "docker.io",
        other => other,
    }
}

impl Store {
    /// Reads every `*.tar` of `dir`: where each file of each layout is, and the names in its
    /// `index.json`.
    pub fn load(dir: &Path) -> std::io::Result<Self> {
        let mut store = Store::default();
        let mut tarballs: Vec<PathBuf> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "tar"))
            .collect();
        tarballs.sort();
        for tarball in tarballs {
            let mut archive = tar::Archive::new(std::fs::File::open(&tarball)?);
            let mut index = None;
            // Seeking past each entry's data: only the headers and index.json are read.
            for entry in archive.entries_with_seek()? {
                let mut entry = entry?;
                let path = entry.path()?.to_string_lossy().trim_start_matches("./").to_string();
                if path == "index.json" {
                    let mut text = String::new();
                    std::io::Read::read_to_string(&mut entry, &mut text)?;
                    index = serde_json::from_str::<Index>(&text).ok();
                } else if let Some(hex) = path.strip_prefix("blobs/sha256/") {
                    store.blobs.insert(
                        format!("sha256:{hex}"),
                        Span {
                            tarball: tarball.clone(),
                            offset: entry.raw_file_position(),
                            size: entry.size(),
                        },
                    );
                }
            }
            for manifest in index.map(|i| i.manifests).unwrap_or_default() {
                let Some(name) = manifest.annotations.get("io.containerd.image.name") else {
                    continue;
                };
                if let Some((host, repository, tag)) = split_reference(name) {
                    store.images.push(Named {
                        host,
                        repository,
                        tag,
                        manifest: manifest.digest.clone(),
                    });
                }
            }
        }
        Ok(store)
    }

    /// The manifest digest of `repository` at `reference` (a tag or a digest), in registry
    /// `ns` when the request says which.
    fn resolve(&self, ns: Option<&str>, repository: &str, reference: &str) -> Option<&str> {
        self.images
            .iter()
            .filter(|i| i.repository == repository && ns.is_none_or(|ns| canonical_host(ns) == i.host))
            .find(|i| i.tag == reference || i.manifest == reference)
            .map(|i| i.manifest.as_str())
    }

    /// The built images, as users write them: each once, by its own name (the first; the
    /// others are its mirrors').
    pub fn built(&self) -> String {
        let mut seen = std::collections::BTreeSet::new();
        let names: Vec<String> = self
            .images
            .iter()
            .filter(|i| seen.insert(i.manifest.clone()))
            .map(|i| {
                let short = match (i.host.as_str(), i.repository.strip_prefix("library/")) {
                    ("docker.io", Some(official)) => official.to_string(),
                    ("docker.io", None) => i.repository.clone(),
                    _ => format!("{}/{}", i.host, i.repository),
                };
                format!("{short}:{}", i.tag)
            })
            .collect();
        names.join(", ")
    }
}

/// `<repository>/manifests/<reference>` or `<repository>/blobs/<digest>`, after `/v2/`.
#[derive(Debug, PartialEq)]
enum Asked<'a> {
    Base,
    Manifest { repository: &'a str, reference: &'a str },
    Blob { repository: &'a str, digest: &'a str },
}

fn asked(path: &str) -> Option<Asked<'_>> {
    let rest = path.strip_prefix("/v2/")?;
    if rest.is_empty() {
        return Some(Asked::Base);
    }
    if let Some((repository, reference)) = rest.rsplit_once("/manifests/") {
        return Some(Asked::Manifest { repository, reference });
    }
    let (repository, digest) = rest.rsplit_once("/blobs/")?;
    Some(Asked::Blob { repository, digest })
}

#[derive(Debug, Deserialize)]
struct Mirrored {
    ns: Option<String>,
}

/// A refusal containerd reports as it is: 403 (a 404 would read "not found" and lose why)
/// with the reason in the status line.
fn refused(reason: &str) -> Response {
    let reason: String = reason.chars().filter(|c| !c.is_control()).collect();
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::FORBIDDEN;
    if let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(reason.into_bytes()) {
        response.extensions_mut().insert(phrase);
    }
    response
}

/// How much of a blob is read at a time: a layer is streamed, not held in memory.
const CHUNK: usize = 256 * 1024;

/// The bytes of a span, as a body read from the tarball chunk by chunk.
async fn span_body(span: &Span) -> std::io::Result<Body> {
    let mut file = tokio::fs::File::open(&span.tarball).await?;
    file.seek(SeekFrom::Start(span.offset)).await?;
    let chunks = futures::stream::unfold(file.take(span.size), |mut rest| async move {
        let mut chunk = vec![0u8; CHUNK];
        match rest.read(&mut chunk).await {
            Ok(0) => None,
            Ok(n) => {
                chunk.truncate(n);
                Some((Ok::<_, std::io::Error>(chunk), rest))
            }
            Err(e) => Some((Err(e), rest)),
        }
    });
    Ok(Body::from_stream(chunks))
}

async fn answer(State(shelf): State<Arc<Shelf>>, Query(mirrored): Query<Mirrored>, request: Request) -> Response {
    let store = shelf.store();
    let head = request.method() == Method::HEAD;
    let path = request.uri().path().to_string();
    let not_built = |what: &str| {
        warn!(%what, "refused a pull: not built here");
        refused(&format!(
            "{what} is not built here: only images built by make setup run on the local Kubernetes ({})",
            store.built()
        ))
    };
    let (digest, content_type) = match asked(&path) {
        Some(Asked::Base) => return Response::new(Body::from("{}")),
        Some(Asked::Manifest { repository, reference }) => {
            match store.resolve(mirrored.ns.as_deref(), repository, reference) {
                Some(digest) => (digest.to_string(), OCI_MANIFEST),
                None => {
                    let host = mirrored.ns.as_deref().unwrap_or("?");
                    return not_built(&format!("{host}/{repository}:{reference}"));
                }
            }
        }
        Some(Asked::Blob { digest, .. }) => (digest.to_string(), "application/octet-stream"),
        None => return not_built(&path),
    };
    let Some(span) = store.blobs.get(&digest) else {
        return not_built(&digest);
    };
    let body = if head {
        Body::empty()
    } else {
        match span_body(span).await {
            Ok(body) => body,
            Err(e) => {
                warn!(error = %e, tarball = %span.tarball.display(), "cannot read a built image");
                let mut response = Response::new(Body::empty());
                *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                return response;
            }
        }
    };
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(span.size));
    if let Ok(value) = HeaderValue::from_str(&digest) {
        headers.insert("Docker-Content-Digest", value);
    }
    response
}

/// Serves the images of the shelf until the listener fails.
pub async fn serve(addr: SocketAddr, shelf: Arc<Shelf>) -> std::io::Result<()> {
    info!(%addr, images = shelf.store().images.len(), "serving the built images as every registry's mirror");
    let router = Router::new().fallback(answer).with_state(shelf);
    let listener = TcpListener::bind(addr).await?;
    loop {
        let (tcp, _) = listener.accept().await?;
        let service = TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_as_the_registry_api_says() {
        assert_eq!(asked("/v2/"), Some(Asked::Base));
        assert_eq!(
            asked("/v2/library/postgres/manifests/15"),
            Some(Asked::Manifest {
                repository: "library/postgres",
                reference: "15"
            })
        );
        assert_eq!(
            asked("/v2/coreos/etcd/blobs/sha256:ab"),
            Some(Asked::Blob {
                repository: "coreos/etcd",
                digest: "sha256:ab"
            })
        );
        assert_eq!(asked("/healthz"), None);
    }

    fn store() -> Store {
        let named = |host: &str, repository: &str, tag: &str, manifest: &str| Named {
            host: host.into(),
            repository: repository.into(),
            tag: tag.into(),
            manifest: manifest.into(),
        };
        Store {
            images: vec![
                named("docker.io", "library/postgres", "15", "sha256:pg"),
                named("quay.io", "coreos/etcd", "v3.6.16", "sha256:etcd"),
                named("registry.example.com", "etcd-team/etcd", "v3.6.16", "sha256:etcd"),
            ],
            blobs: BTreeMap::new(),
        }
    }

    #[test]
    fn an_image_resolves_by_tag_or_digest_in_the_registry_asked() {
        let store = store();
        assert_eq!(
            store.resolve(Some("docker.io"), "library/postgres", "15"),
            Some("sha256:pg")
        );
        assert_eq!(
            store.resolve(Some("registry-1.docker.io"), "library/postgres", "15"),
            Some("sha256:pg")
        );
        assert_eq!(store.resolve(None, "coreos/etcd", "sha256:etcd"), Some("sha256:etcd"));
        assert_eq!(
            store.resolve(Some("quay.io"), "library/postgres", "15"),
            None,
            "another registry"
        );
        assert_eq!(
            store.resolve(Some("docker.io"), "library/postgres", "16"),
            None,
            "a tag not built"
        );
        assert_eq!(
            store.built(),
            "postgres:15, quay.io/coreos/etcd:v3.6.16",
            "mirrors' names left out"
        );
    }

    /// Writes a layout tarball `name.tar` into `dir` naming `reference`, and `built.txt`.
    fn write_image(dir: &Path, name: &str, reference: &str) {
        let index = serde_json::json!({
            "manifests": [{ "digest": format!("sha256:{name}"), "annotations": { "io.containerd.image.name": reference } }]
        })
        .to_string();
        let mut tarball = tar::Builder::new(std::fs::File::create(dir.join(format!("{name}.tar"))).unwrap());
        let blob = format!("the layer of {name}");
        for (path, data) in [
            (format!("blobs/sha256/{name}"), blob.as_str()),
            ("index.json".into(), &index),
        ] {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            tarball.append_data(&mut header, path, data.as_bytes()).unwrap();
        }
        tarball.finish().unwrap();
        std::fs::write(dir.join("built.txt"), reference).unwrap();
    }

    #[test]
    fn the_shelf_reads_the_images_again_once_they_were_built_anew() {
        let dir = std::env::temp_dir().join(format!("noops-shelf-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        write_image(&dir, "one", "docker.io/library/busybox:1.35");
        let shelf = Shelf::open(Some(&dir)).unwrap();
        assert_eq!(shelf.store().built(), "busybox:1.35");
        // A blob is found where it lies in its tarball (the entries were read by seeking).
        let store = shelf.store();
        let span = &store.blobs["sha256:one"];
        let mut bytes = vec![0; span.size as usize];
        let mut file = std::fs::File::open(&span.tarball).unwrap();
        std::io::Seek::seek(&mut file, SeekFrom::Start(span.offset)).unwrap();
        std::io::Read::read_exact(&mut file, &mut bytes).unwrap();
        assert_eq!(bytes, b"the layer of one");
        // Built anew (a later modification time, as a rebuild minutes later has).
        write_image(&dir, "two", "docker.io/library/busybox:latest");
        let later = SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(dir.join("built.txt"))
            .unwrap()
            .set_modified(later)
            .unwrap();
        assert_eq!(shelf.store().built(), "busybox:1.35, busybox:latest");
        assert_eq!(Shelf::open(None).unwrap().store().built(), "");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_full_reference_splits_into_host_repository_and_tag() {
        assert_eq!(
            split_reference("registry.local:5000/team/app:1.0"),
            Some(("registry.local:5000".into(), "team/app".into(), "1.0".into()))
        );
        assert_eq!(split_reference("postgres"), None);
    }
}
