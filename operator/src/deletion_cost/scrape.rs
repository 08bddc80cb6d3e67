//! Reading a gateway pod's live session count from its admin listener.
//!
//! `GET http://<pod IP>:9090/metrics` (plain HTTP/1.1 on the pod network, the same endpoint
//! Prometheus scrapes), bounded by [`SCRAPE_TIMEOUT`] for the whole exchange and
//! [`MAX_METRICS_BYTES`] for the body, then [`figures`] sums, over every series, the live
//! sessions (`patchbay_realtime_sessions_active`), the warm sockets and pool targets, and the
//! metered cost: the deletion cost uses the first, the route's live status all of them.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

pub use crate::live_status::PodFigures;

/// The gauge of live sessions, one series per route.
pub const SESSIONS_ACTIVE: &str = "patchbay_realtime_sessions_active";
/// Bound on one scrape: connect, request and body.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest `/metrics` body read.
pub const MAX_METRICS_BYTES: usize = 4 * 1024 * 1024;

/// Why a scrape gave no number.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("no answer within {SCRAPE_TIMEOUT:?}")]
    Timeout,
    #[error("connect: {0}")]
    Connect(#[source] std::io::Error),
    #[error("http: {0}")]
    Http(String),
    #[error("status {0}")]
    Status(u16),
    #[error("no {SESSIONS_ACTIVE} series in the exposition")]
    NoSeries,
}

/// Warm upstream sockets waiting, one series per route and upstream.
pub const WARM_SOCKETS: &str = "patchbay_pool_warm_sockets";
/// Each pool's current target, with the same labels.
pub const POOL_TARGET: &str = "patchbay_pool_target_sockets";
/// Metered USD, a counter per model.
pub const COST_USD: &str = "patchbay_cost_usd_total";

/// The sum of every sample of `metric` in a Prometheus text exposition, or `None` when there is
/// none. Another metric whose name merely starts with `metric` is not counted.
pub fn sum_of(exposition: &str, metric: &str) -> Option<f64> {
    let mut total: Option<f64> = None;
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix(metric) else {
            continue;
        };
        let value = if let Some(labelled) = rest.strip_prefix('{') {
            // Skip the label set; a quoted label value may contain `}`.
            let mut in_quotes = false;
            let mut escaped = false;
            let mut end = None;
            for (i, c) in labelled.char_indices() {
                match c {
                    _ if escaped => escaped = false,
                    '\\' if in_quotes => escaped = true,
                    '"' => in_quotes = !in_quotes,
                    '}' if !in_quotes => {
                        end = Some(i);
                        break;
                    }
                    _ => {}
                }
            }
            end.and_then(|i| labelled[i + 1..].split_whitespace().next())
        } else if rest.starts_with([' ', '\t']) {
            rest.split_whitespace().next()
        } else {
            // Another metric sharing the prefix (`..._active_total`).
            None
        };
        if let Some(v) = value.and_then(|v| v.parse::<f64>().ok()) {
            if v.is_finite() {
                *total.get_or_insert(0.0) += v;
            }
        }
    }
    total
}

/// The sum of every `patchbay_realtime_sessions_active` sample, or `None` when there is none (a
/// gateway always exposes the gauge once a route served).
pub fn sessions_active(exposition: &str) -> Option<i64> {
    sum_of(exposition, SESSIONS_ACTIVE).map(|t| t.round() as i64)
}

/// Every figure of one exposition; `None` without the sessions gauge (not a gateway).
pub fn figures(exposition: &str) -> Option<PodFigures> {
    Some(PodFigures {
        sessions: sessions_active(exposition)?,
        warm_sockets: sum_of(exposition, WARM_SOCKETS).map(|t| t.round() as i64),
        pool_target: sum_of(exposition, POOL_TARGET).map(|t| t.round() as i64),
        cost_usd: sum_of(exposition, COST_USD),
    })
}

/// Scrape one pod's admin listener and return its figures.
pub async fn scrape(addr: SocketAddr) -> Result<PodFigures, ScrapeError> {
    tokio::time::timeout(SCRAPE_TIMEOUT, fetch(addr))
        .await
        .map_err(|_| ScrapeError::Timeout)?
        .and_then(|text| figures(&text).ok_or(ScrapeError::NoSeries))
}

async fn fetch(addr: SocketAddr) -> Result<String, ScrapeError> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(ScrapeError::Connect)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ScrapeError::Http(e.to_string()))?;
    let driver = tokio::spawn(connection);
    let request = http::Request::get("/metrics")
        .header(http::header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())
        .map_err(|e| ScrapeError::Http(e.to_string()))?;
    let result = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| ScrapeError::Http(e.to_string()))?;
        if !response.status().is_success() {
            return Err(ScrapeError::Status(response.status().as_u16()));
        }
        let body = Limited::new(response.into_body(), MAX_METRICS_BYTES)
            .collect()
            .await
            .map_err(|e| ScrapeError::Http(e.to_string()))?
            .to_bytes();
        Ok(String::from_utf8_lossy(&body).into_owned())
    }
    .await;
    driver.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_summed_over_every_route() {
        let text = "\
# HELP patchbay_realtime_sessions_active Live sessions.
# TYPE patchbay_realtime_sessions_active gauge
patchbay_realtime_sessions_active{model=\"gpt-realtime\"} 3
patchbay_realtime_sessions_active{model=\"gpt-realtime-mini\"} 4
patchbay_realtime_sessions_active_total 99
patchbay_realtime_sessions_total{model=\"gpt-realtime\",outcome=\"ok\"} 12
";
        assert_eq!(sessions_active(text), Some(7));
    }

    #[test]
    fn label_values_with_braces_and_spaces_and_timestamps_parse() {
        let text = "patchbay_realtime_sessions_active{model=\"a} b\\\"c\"} 2 1700000000000\n\
                    patchbay_realtime_sessions_active 1\n";
        assert_eq!(sessions_active(text), Some(3));
    }

    #[test]
    fn no_series_is_no_number_and_an_idle_gateway_is_zero() {
        assert_eq!(sessions_active("# nothing here\nother_metric 5\n"), None);
        assert_eq!(
            sessions_active("patchbay_realtime_sessions_active{model=\"m\"} 0\n"),
            Some(0)
        );
        assert_eq!(
            sessions_active("patchbay_realtime_sessions_active{model=\"m\"} NaN\n"),
            None
        );
    }

    #[tokio::test]
    async fn a_listener_that_never_answers_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hold = tokio::spawn(async move {
            let (_socket, _) = listener.accept().await.unwrap();
            std::future::pending::<()>().await;
        });
        tokio::time::pause();
        let result = scrape(addr).await;
        assert!(matches!(result, Err(ScrapeError::Timeout)), "{result:?}");
        hold.abort();
    }
}
