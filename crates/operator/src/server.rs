//! The operator's HTTP endpoints: `/metrics` (Prometheus text), `/healthz` and `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::core::metrics::Metrics;

/// What the endpoints report.
pub struct Health {
    pub metrics: Arc<Metrics>,
    /// Set once the operator has reached the API server and is leading or standing by.
    pub ready: AtomicBool,
}

async fn metrics(State(health): State<Arc<Health>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        health.metrics.render(),
    )
}

async fn readyz(State(health): State<Arc<Health>>) -> impl IntoResponse {
    if health.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

/// Serves until the process ends.
pub async fn serve(addr: SocketAddr, health: Arc<Health>) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(health);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    axum::serve(listener, app).await
}
