//! The admin listener's routes, on an axum router: `/healthz` (the process
//! answers), `/readyz` (the pools warmed up and the gateway is not draining;
//! 503 otherwise, so Kubernetes takes the pod out of the Service endpoints
//! as soon as a drain starts), `/metrics` (Prometheus/OpenMetrics text) and
//! `/status` (`/` redirects there), the live status page of
//! [`crate::status_page`].
//! Served on its own port ([`crate::server::serve_admin`]), never on the
//! client listener.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

use crate::gateway::Gateway;
use crate::status_page::History;

/// The OpenMetrics text format `prometheus-client` writes.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The admin routes; `history` holds the status page's samples
/// ([`crate::status_page::spawn_sampler`] fills it).
pub fn router(gw: Arc<Gateway>, history: Arc<History>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route(
            "/status",
            get(move |State(gw): State<Arc<Gateway>>| async move {
                Html(crate::status_page::page(&gw, &history))
            }),
        )
        .route("/", get(|| async { Redirect::to("/status") }))
        .fallback(not_found)
        .with_state(gw)
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(gw): State<Arc<Gateway>>) -> (StatusCode, &'static str) {
    if gw.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn metrics(State(gw): State<Arc<Gateway>>) -> Response {
    let mut r = gw.metrics.encode().into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(METRICS_CONTENT_TYPE),
    );
    r
}

async fn not_found() -> (StatusCode, &'static str) {
    (StatusCode::NOT_FOUND, "not found\n")
}
