//! A first member whose start was cut short. etcd makes its data directory and writes the
//! first member into it a few milliseconds later: a node that dies in between leaves a
//! directory with no member in it, and every later start waits forever for voters it never
//! recorded (seen when a node was stopped during a cluster's first start). Such a member has
//! committed nothing, not even its own bootstrap, while a member of a new cluster waiting for
//! its peers has committed that. Its gRPC API never serves (it waits for a leader), so this is
//! read from its metrics endpoint, which serves from the start.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::names::METRICS_PORT;

/// The most of the metrics page read (etcd's is about 150 KiB).
const MOST_READ: u64 = 1024 * 1024;
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether the member at `ip` says it has no leader and has committed nothing; false when it
/// does not answer.
pub async fn committed_nothing(ip: &str) -> bool {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect((ip, METRICS_PORT as u16)).await.ok()?;
        let request = format!("GET /metrics HTTP/1.0\r\nHost: {ip}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut answer = Vec::new();
        stream.take(MOST_READ).read_to_end(&mut answer).await.ok()?;
        Some(answer)
    };
    let Ok(Some(answer)) = tokio::time::timeout(READ_TIMEOUT, exchange).await else {
        return false;
    };
    said_nothing_committed(&String::from_utf8_lossy(&answer))
}

/// Whether a metrics page says no leader and nothing committed (both gauges there). Pure.
fn said_nothing_committed(page: &str) -> bool {
    let value = |name: &str| {
        page.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
    };
    value("etcd_server_has_leader") == Some(0.0) && value("etcd_server_proposals_committed_total") == Some(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_no_leader_and_nothing_committed_is_an_empty_start() {
        let page = |leader: u8, committed: u8| {
            format!(
                "HTTP/1.0 200 OK\r\n\r\n# TYPE etcd_server_has_leader gauge\netcd_server_has_leader {leader}\netcd_server_proposals_committed_total {committed}\n"
            )
        };
        assert!(said_nothing_committed(&page(0, 0)));
        // Waiting for its peers, a new member has committed its bootstrap (3 entries for 3).
        assert!(!said_nothing_committed(&page(0, 3)));
        assert!(!said_nothing_committed(&page(1, 0)));
        assert!(!said_nothing_committed("HTTP/1.0 503 Service Unavailable\r\n\r\n"));
    }
}
