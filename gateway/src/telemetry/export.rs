//! The exporter: one task that takes finished spans, events and turns from
//! a bounded queue, batches them, and sends them to the collector as OTLP:
//! a POST of the binary protobuf message ([`super::proto`]) for
//! `http/protobuf`, or a unary gRPC call carrying it ([`super::grpc`]).
//!
//! Guarantees:
//! - **Never blocks a session.** Producers only `try_send` into the queue
//!   (`[telemetry] queue_size`, default 2048 items); a full queue drops the
//!   item and counts it in `patchbay_telemetry_dropped_total{signal,
//!   reason="queue_full"}`. Nothing here runs on a relay's task.
//! - **Bounded.** A batch holds at most `batch_size` items per signal;
//!   every request is bounded by `export_timeout_ms` (connect included).
//!   A batch the collector refuses (an HTTP error status, or a gRPC
//!   `grpc-status` other than OK), or that cannot reach it, is dropped
//!   and counted (`reason="export_failed"`): no retry queue grows behind
//!   an unreachable collector. While a request waits, items queue, and past
//!   the bound they are dropped: a slow collector costs telemetry, never a
//!   session's latency.
//! - Batches leave when full or every `batch_delay_ms`; the metrics every
//!   `metrics_interval_ms` (cumulative, so a lost export loses no count).
//!   At shutdown what is queued is exported once more, within a bound.
//!
//! One connection per collector address and protocol is kept open between
//! exports ([`super::transport`]: HTTP/1.1, or HTTP/2 for gRPC).

use std::collections::HashMap;
use std::time::SystemTime;

use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{interval, Instant, MissedTickBehavior};

use super::aggregate::{Aggregates, TurnSample};
use super::config::{shown, Endpoint, Protocol, Settings};
use super::grpc;
use super::proto::{self, LogData, MetricData, Origin, SpanData};
use super::transport::ExportError;
use super::transport::{connect, Answer, Conn};
use crate::metrics::TelemetryDropLabels;

/// What the queue carries.
#[derive(Debug)]
pub enum Item {
    Span(Box<SpanData>),
    Log(Box<LogData>),
    Turn(Box<TurnSample>),
    /// Export what is queued now, then answer (shutdown).
    Flush(oneshot::Sender<()>),
}

/// The three signals, as the drop counter labels them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Traces,
    Logs,
    Metrics,
}

impl Signal {
    pub const ALL: [Signal; 3] = [Signal::Traces, Signal::Logs, Signal::Metrics];

    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Traces => "traces",
            Signal::Logs => "logs",
            Signal::Metrics => "metrics",
        }
    }

    /// The signal's gRPC method.
    pub fn grpc_method(self) -> &'static str {
        match self {
            Signal::Traces => grpc::TRACES_METHOD,
            Signal::Logs => grpc::LOGS_METHOD,
            Signal::Metrics => grpc::METRICS_METHOD,
        }
    }
}

/// `reason` of a drop.
pub const QUEUE_FULL: &str = "queue_full";
pub const EXPORT_FAILED: &str = "export_failed";

/// Counts dropped items.
#[derive(Debug, Clone)]
pub struct Drops(pub Family<TelemetryDropLabels, Counter>);

impl Drops {
    pub fn add(&self, signal: Signal, reason: &'static str, n: u64) {
        if n > 0 {
            self.0
                .get_or_create(&TelemetryDropLabels {
                    signal: signal.as_str().into(),
                    reason: reason.into(),
                })
                .inc_by(n);
        }
    }

    /// Every series at 0, so the family reads 0 before the first drop.
    pub fn export_at_zero(&self) {
        for s in Signal::ALL {
            for r in [QUEUE_FULL, EXPORT_FAILED] {
                let _ = self.0.get_or_create(&TelemetryDropLabels {
                    signal: s.as_str().into(),
                    reason: r.into(),
                });
            }
        }
    }
}

/// The exporter task's state.
pub struct Exporter {
    settings: Settings,
    origin: Origin,
    drops: Drops,
    spans: Vec<SpanData>,
    logs: Vec<LogData>,
    aggregates: Aggregates,
    /// Turns recorded since the last metrics export.
    metrics_dirty: bool,
    conns: HashMap<String, Conn>,
    /// The export is failing (so only the first failure is logged).
    failing: bool,
}

impl Exporter {
    pub fn new(settings: Settings, origin: Origin, drops: Drops) -> Self {
        Self {
            spans: Vec::with_capacity(settings.batch_size),
            logs: Vec::new(),
            settings,
            origin,
            drops,
            aggregates: Aggregates::new(SystemTime::now()),
            metrics_dirty: false,
            conns: HashMap::new(),
            failing: false,
        }
    }

    /// Runs until every sender is gone, exporting what is left at the end.
    pub async fn run(mut self, mut rx: mpsc::Receiver<Item>) {
        let mut batch_tick = interval(self.settings.batch_delay);
        batch_tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let mut metrics_tick = tokio::time::interval_at(
            Instant::now() + self.settings.metrics_interval,
            self.settings.metrics_interval,
        );
        metrics_tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                item = rx.recv() => match item {
                    Some(Item::Span(s)) => {
                        self.spans.push(*s);
                        if self.spans.len() >= self.settings.batch_size {
                            self.export_spans().await;
                        }
                    }
                    Some(Item::Log(l)) => {
                        self.logs.push(*l);
                        if self.logs.len() >= self.settings.batch_size {
                            self.export_logs().await;
                        }
                    }
                    Some(Item::Turn(t)) => {
                        self.aggregates.record(&t);
                        self.metrics_dirty = true;
                    }
                    Some(Item::Flush(done)) => {
                        self.export_all().await;
                        let _ = done.send(());
                    }
                    None => break,
                },
                _ = batch_tick.tick() => {
                    self.export_spans().await;
                    self.export_logs().await;
                }
                _ = metrics_tick.tick() => self.export_metrics().await,
            }
        }
        self.export_all().await;
    }

    async fn export_all(&mut self) {
        self.export_spans().await;
        self.export_logs().await;
        self.export_metrics().await;
    }

    async fn export_spans(&mut self) {
        if self.spans.is_empty() {
            return;
        }
        let spans = std::mem::take(&mut self.spans);
        let body = proto::encode_spans(&self.origin, &spans);
        let endpoint = self.settings.endpoints.traces.clone();
        self.send(Signal::Traces, &endpoint, body, spans.len())
            .await;
    }

    async fn export_logs(&mut self) {
        if self.logs.is_empty() {
            return;
        }
        let logs = std::mem::take(&mut self.logs);
        let body = proto::encode_logs(&self.origin, &logs);
        let endpoint = self.settings.endpoints.logs.clone();
        self.send(Signal::Logs, &endpoint, body, logs.len()).await;
    }

    async fn export_metrics(&mut self) {
        if !self.metrics_dirty || self.aggregates.is_empty() {
            return;
        }
        self.metrics_dirty = false;
        let snapshot = self.aggregates.snapshot(SystemTime::now());
        let body = proto::encode_metrics(&self.origin, &snapshot);
        let endpoint = self.settings.endpoints.metrics.clone();
        let points = snapshot.iter().map(MetricData::points).sum();
        if !self.send(Signal::Metrics, &endpoint, body, points).await {
            // Cumulative: the next export carries these counts again.
            self.metrics_dirty = true;
        }
    }

    /// Sends one request; on failure counts `items` dropped. True when the
    /// collector took it.
    async fn send(
        &mut self,
        signal: Signal,
        endpoint: &Endpoint,
        body: Vec<u8>,
        items: usize,
    ) -> bool {
        let timeout = self.settings.export_timeout;
        let result = match tokio::time::timeout(timeout, self.post(signal, endpoint, body)).await {
            Ok(r) => r,
            Err(_) => Err(ExportError::Timeout(timeout)),
        };
        match result {
            Ok(()) => {
                if self.failing {
                    tracing::info!(signal = signal.as_str(), "telemetry export works again");
                }
                self.failing = false;
                true
            }
            Err(e) => {
                // The connection may be half-used: start afresh next time.
                self.conns.remove(&conn_key(endpoint));
                self.drops.add(signal, EXPORT_FAILED, items as u64);
                if !self.failing {
                    tracing::warn!(signal = signal.as_str(), url = %shown(&endpoint.url), protocol = endpoint.protocol.as_str(), error = %e, "telemetry export failed: the batch is dropped (counted in patchbay_telemetry_dropped_total); sessions are unaffected");
                }
                self.failing = true;
                false
            }
        }
    }

    async fn post(
        &mut self,
        signal: Signal,
        endpoint: &Endpoint,
        body: Vec<u8>,
    ) -> Result<(), ExportError> {
        let url = &endpoint.url;
        let key = conn_key(endpoint);
        let kept = match self.conns.remove(&key) {
            Some(mut c) => c.ready().await.then_some(c),
            None => None,
        };
        let mut conn = match kept {
            Some(c) => c,
            None => connect(url, endpoint.protocol).await?,
        };
        let mut req = match endpoint.protocol {
            Protocol::HttpProtobuf => Request::builder()
                .method(Method::POST)
                .uri(url.path())
                .header(header::HOST, url.authority())
                .header(header::CONTENT_TYPE, "application/x-protobuf")
                .body(Bytes::from(body)),
            // HTTP/2 takes `:scheme` and `:authority` from an absolute URI.
            Protocol::Grpc => Request::builder()
                .method(Method::POST)
                .uri(format!(
                    "{}://{}{}",
                    url.scheme(),
                    host_port(url),
                    signal.grpc_method()
                ))
                .header(header::CONTENT_TYPE, grpc::CONTENT_TYPE)
                .header(header::TE, "trailers")
                .header(
                    "grpc-timeout",
                    grpc::timeout_value(self.settings.export_timeout),
                )
                .body(Bytes::from(grpc::frame(&body))),
        }
        .map_err(|e| ExportError::Http(e.to_string()))?;
        for (k, v) in &self.settings.headers {
            if let (Ok(name), Ok(value)) = (
                header::HeaderName::from_bytes(k.as_bytes()),
                header::HeaderValue::from_str(v),
            ) {
                req.headers_mut().insert(name, value);
            }
        }
        let Answer { head, trailers } = conn.exchange(req).await?;
        match endpoint.protocol {
            Protocol::HttpProtobuf if !head.status.is_success() => {
                return Err(ExportError::Status(head.status.as_u16()));
            }
            Protocol::HttpProtobuf => {}
            Protocol::Grpc => {
                if head.status != StatusCode::OK {
                    return Err(ExportError::Status(head.status.as_u16()));
                }
                grpc::outcome(&head.headers, trailers.as_ref())?;
            }
        }
        self.conns.insert(key, conn);
        Ok(())
    }
}

fn conn_key(endpoint: &Endpoint) -> String {
    let url = &endpoint.url;
    format!(
        "{} {}://{}",
        endpoint.protocol.as_str(),
        url.scheme(),
        url.authority()
    )
}

/// `host:port` of `url` (no user name or password).
fn host_port(url: &url::Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    }
}
