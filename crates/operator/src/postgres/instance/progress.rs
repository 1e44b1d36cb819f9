//! How far a restore in the instance pod's bootstrap has got, told to the operator: the init
//! container answers `GET /progress` on [`PROGRESS_PORT`] with its [`WorkProgress`] as JSON
//! (the pod has its address while its init container runs), and the operator reads it into
//! the PostgreSQL's `status.restoring` at each pass. Nothing is kept anywhere else: a restore
//! that ends takes its progress with it, and the record it leaves says what it recovered.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use noops_api::backup::WorkProgress;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::warn;

/// The port a restoring init container answers on.
pub const PROGRESS_PORT: u16 = 8009;
/// The most of an answer the operator reads.
const MOST_READ: u64 = 64 * 1024;
/// How long the operator waits for an answer: a pass never waits long on a busy pod.
const READ_TIMEOUT: Duration = Duration::from_secs(1);

/// The progress of the work under way, shared by the work and the endpoint.
#[derive(Clone, Default)]
pub struct Reporter(Arc<Mutex<WorkProgress>>);

impl Reporter {
    /// Changes what is reported.
    pub fn update(&self, change: impl FnOnce(&mut WorkProgress)) {
        if let Ok(mut progress) = self.0.lock() {
            change(&mut progress);
        }
    }

    fn current(&self) -> WorkProgress {
        self.0.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// Answers `GET /progress` on every address of the pod until the process ends. A port
    /// that cannot be bound costs the report, not the work.
    pub async fn serve(&self) {
        match tokio::net::TcpListener::bind(("0.0.0.0", PROGRESS_PORT)).await {
            Ok(listener) => self.serve_on(listener),
            Err(e) => warn!(port = PROGRESS_PORT, error = %e, "cannot report progress"),
        }
    }

    fn serve_on(&self, listener: tokio::net::TcpListener) {
        let app = Router::new().route("/progress", get(answer)).with_state(self.clone());
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                warn!(error = %e, "the progress endpoint stopped");
            }
        });
    }
}

async fn answer(State(reporter): State<Reporter>) -> axum::Json<WorkProgress> {
    axum::Json(reporter.current())
}

/// Reads the progress a pod at `ip` reports; none if it reports none (not restoring, or not
/// answering within a second).
pub async fn read(ip: &str) -> Option<WorkProgress> {
    read_from(ip, PROGRESS_PORT).await
}

async fn read_from(ip: &str, port: u16) -> Option<WorkProgress> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect((ip, port)).await.ok()?;
        let request = format!("GET /progress HTTP/1.0\r\nHost: {ip}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut answer = Vec::new();
        stream.take(MOST_READ).read_to_end(&mut answer).await.ok()?;
        Some(answer)
    };
    let answer = tokio::time::timeout(READ_TIMEOUT, exchange).await.ok()??;
    body_of(&answer)
}

/// The JSON body of an HTTP answer with status 200. Pure.
fn body_of(answer: &[u8]) -> Option<WorkProgress> {
    let text = std::str::from_utf8(answer).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.lines().next()?.split_whitespace().nth(1)?;
    if status != "200" {
        return None;
    }
    serde_json::from_str(body).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_whole_answer_with_status_200_is_read() {
        let ok = b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{\"step\":\"downloading the base backup\",\"bytesDone\":10,\"bytesTotal\":40}";
        let progress = body_of(ok).unwrap();
        assert_eq!(progress.step, "downloading the base backup");
        assert_eq!((progress.bytes_done, progress.bytes_total), (Some(10), Some(40)));
        assert_eq!(body_of(b"HTTP/1.0 404 Not Found\r\n\r\n{\"step\":\"x\"}"), None);
        assert_eq!(body_of(b"HTTP/1.0 200 OK\r\n\r\n{\"step\":"), None);
        assert_eq!(body_of(b"garbage"), None);
    }

    #[tokio::test]
    async fn what_the_work_reports_is_what_the_operator_reads() {
        let reporter = Reporter::default();
        reporter.update(|p| {
            p.step = "replaying WAL".into();
            p.replayed_wal = Some("0/3000060".into());
        });
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        reporter.serve_on(listener);
        let progress = read_from("127.0.0.1", port).await.expect("the endpoint answers");
        assert_eq!(progress.step, "replaying WAL");
        assert_eq!(progress.replayed_wal.as_deref(), Some("0/3000060"));
    }
}
