//! The way out of a real node's containerd (its HTTPS_PROXY): an HTTP proxy that refuses every
//! request, saying which images this machine builds.
//!
//! containerd asks the node's registry (`registry.rs`, every registry's mirror) first; for an
//! image that is not built it then tries the registry itself, through its proxy. The proxy is
//! here, so no pull leaves this machine, and the refusal's reason phrase is what Go's HTTP
//! client reports.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::registry::Shelf;

/// The longest request head read before answering; the refusal does not depend on it.
const MAX_HEAD: usize = 8 * 1024;

/// The status line of the refusal: 403 and a reason phrase that names what is built.
pub fn refusal_status_line(built: &str) -> String {
    let built = if built.is_empty() { "none" } else { built };
    // A reason phrase is one line of visible characters: strip anything else.
    let reason: String = format!(
        "no registry is reachable from the local Kubernetes: only images built by `make setup` can run here ({built})"
    )
    .chars()
    .filter(|c| !c.is_control())
    .collect();
    format!("HTTP/1.1 403 {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
}

/// Which host a proxied request was for (`CONNECT host:443` or `GET http://host/...`), for the log.
pub fn requested_target(head: &str) -> Option<&str> {
    let mut parts = head.lines().next()?.split_whitespace();
    let _method = parts.next()?;
    parts.next()
}

/// Answers every connection with the refusal (naming what `shelf` holds then), until the
/// listener fails.
pub async fn serve(addr: SocketAddr, shelf: Arc<Shelf>) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    info!(%addr, "refusing image pulls that leave this machine");
    loop {
        let (mut conn, _) = listener.accept().await?;
        let answer = refusal_status_line(&shelf.store().built());
        tokio::spawn(async move {
            let mut head = vec![0u8; MAX_HEAD];
            let read = tokio::time::timeout(std::time::Duration::from_secs(5), conn.read(&mut head)).await;
            let n = match read {
                Ok(Ok(n)) => n,
                _ => 0,
            };
            let head = String::from_utf8_lossy(&head[..n]);
            warn!(
                target = requested_target(&head).unwrap_or("?"),
                "refused an image pull: that image is not built here"
            );
            let _ = conn.write_all(answer.as_bytes()).await;
            let _ = conn.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_names_what_is_built_on_one_status_line() {
        let line = refusal_status_line("postgres:15, quay.io/coreos/etcd:v3.6.5\n");
        let status = line.split("\r\n").next().unwrap_or_default();
        assert!(status.starts_with("HTTP/1.1 403 no registry is reachable"), "{status}");
        assert!(status.contains("postgres:15, quay.io/coreos/etcd:v3.6.5"), "{status}");
        assert!(line.ends_with("\r\n\r\n"));
        assert_eq!(
            line.matches("\r\n").count(),
            4,
            "one status line, two headers, one blank line"
        );
    }

    #[test]
    fn the_target_is_read_from_connect_and_absolute_requests() {
        assert_eq!(
            requested_target("CONNECT registry-1.docker.io:443 HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some("registry-1.docker.io:443")
        );
        assert_eq!(
            requested_target("HEAD http://quay.io/v2/ HTTP/1.1\r\n"),
            Some("http://quay.io/v2/")
        );
        assert_eq!(requested_target(""), None);
    }
}
