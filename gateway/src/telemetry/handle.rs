//! The handles the rest of the gateway holds: [`Telemetry`] (the process's,
//! off or feeding the exporter) and [`SessionTrace`] (one session's trace
//! context and facts, given to its meter).
//!
//! Everything here is cheap and never waits: a span or an event is built
//! from data already at hand and offered to the exporter's bounded queue
//! with `try_send`; a full queue drops it, counted. With telemetry off,
//! [`Telemetry::session`] returns `None` and a session carries nothing.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::HeaderMap;
use tokio::sync::{mpsc, oneshot};

use super::aggregate::{TokenCounts, TurnSample};
use super::config::{shown, Settings};
use super::context::{new_trace_id, Sampler, TraceParent, TRACEPARENT};
use super::export::{Drops, Exporter, Item, Signal, QUEUE_FULL};
use super::proto::Origin;
use super::semconv::{
    ended_event, provider_name, started_event, turn_span, Ending, SessionFacts, Turn, SCHEMA_URL,
};

/// The instrumentation scope's name.
pub const SCOPE_NAME: &str = "patchbay-gateway";

/// The process's telemetry: off (the default), or a queue to the exporter.
#[derive(Debug, Clone, Default)]
pub struct Telemetry {
    inner: Option<Arc<Inner>>,
}

#[derive(Debug)]
struct Inner {
    tx: mpsc::Sender<Item>,
    sampler: Sampler,
    drops: Drops,
}

impl Telemetry {
    /// Off: nothing is recorded or sent.
    pub fn off() -> Self {
        Self::default()
    }

    /// Starts the exporter task when `settings` is `Some` (must be called
    /// inside the runtime); its drops counted in `drops`.
    pub fn start(settings: Option<Settings>, drops: Drops) -> Self {
        drops.export_at_zero();
        let Some(settings) = settings else {
            return Self::off();
        };
        let (tx, rx) = mpsc::channel(settings.queue_size);
        let origin = Origin {
            resource: settings.resource.clone(),
            scope_name: SCOPE_NAME,
            scope_version: env!("CARGO_PKG_VERSION"),
            schema_url: SCHEMA_URL,
        };
        tracing::info!(
            traces = %shown(&settings.endpoints.traces.url),
            traces_protocol = settings.endpoints.traces.protocol.as_str(),
            logs = %shown(&settings.endpoints.logs.url),
            logs_protocol = settings.endpoints.logs.protocol.as_str(),
            metrics = %shown(&settings.endpoints.metrics.url),
            metrics_protocol = settings.endpoints.metrics.protocol.as_str(),
            sampler = ?settings.sampler,
            "exporting OpenTelemetry (OTLP)"
        );
        let sampler = settings.sampler;
        tokio::spawn(Exporter::new(settings, origin, drops.clone()).run(rx));
        Self {
            inner: Some(Arc::new(Inner { tx, sampler, drops })),
        }
    }

    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// The client's `traceparent`, when telemetry is on and it sent a
    /// valid one.
    pub fn parent(&self, headers: &HeaderMap) -> Option<TraceParent> {
        self.inner.as_ref()?;
        let value = headers.get(TRACEPARENT)?.to_str().ok()?;
        TraceParent::parse(value)
    }

    /// A session's trace, its `.started` event sent; `None` when off.
    /// `inference_spans`: whether its response turns become
    /// `realtime_inference` spans (not for translation or transcription
    /// sessions, as the conventions say).
    pub fn session(
        &self,
        parent: Option<TraceParent>,
        facts: SessionFacts,
        inference_spans: bool,
    ) -> Option<Arc<SessionTrace>> {
        let inner = self.inner.as_ref()?;
        let trace_id = parent.map_or_else(new_trace_id, |p| p.trace_id);
        let sampled = inner.sampler.sample(parent.as_ref(), &trace_id);
        let trace = SessionTrace {
            telemetry: self.clone(),
            trace_id,
            parent_span_id: parent.map(|p| p.span_id),
            sampled,
            inference_spans,
            started: Instant::now(),
            facts,
        };
        let event = started_event(
            &trace.facts,
            trace_id,
            trace.parent_span_id,
            SystemTime::now(),
        );
        self.offer(Signal::Logs, Item::Log(Box::new(event)));
        Some(Arc::new(trace))
    }

    fn offer(&self, signal: Signal, item: Item) {
        let Some(inner) = &self.inner else {
            return;
        };
        if inner.tx.try_send(item).is_err() {
            inner.drops.add(signal, QUEUE_FULL, 1);
        }
    }

    /// Exports what is queued, waiting at most `within` (at shutdown).
    pub async fn flush(&self, within: Duration) {
        let Some(inner) = &self.inner else {
            return;
        };
        let (done, answered) = oneshot::channel();
        let flushed = async {
            if inner.tx.send(Item::Flush(done)).await.is_ok() {
                let _ = answered.await;
            }
        };
        let _ = tokio::time::timeout(within, flushed).await;
    }
}

/// One session's trace: the trace it continues or starts, whether it is
/// sampled, and the facts its spans and events name.
#[derive(Debug)]
pub struct SessionTrace {
    telemetry: Telemetry,
    pub trace_id: [u8; 16],
    /// The client's span, parent of the session's spans.
    pub parent_span_id: Option<[u8; 8]>,
    pub sampled: bool,
    inference_spans: bool,
    started: Instant,
    pub facts: SessionFacts,
}

impl SessionTrace {
    /// A metered response turn: its span (when sampled) and its metrics.
    pub fn turn(&self, turn: &Turn<'_>) {
        if !self.inference_spans {
            return;
        }
        if self.sampled {
            let span = turn_span(&self.facts, self.trace_id, self.parent_span_id, turn);
            self.telemetry
                .offer(Signal::Traces, Item::Span(Box::new(span)));
        }
        let row = turn.row;
        let sample = TurnSample {
            model: row.model.clone(),
            provider: provider_name(&row.provider),
            tokens: TokenCounts::of(turn),
            seconds: turn
                .ended_at
                .duration_since(turn.started_at)
                .unwrap_or_default()
                .as_secs_f64(),
        };
        self.telemetry
            .offer(Signal::Metrics, Item::Turn(Box::new(sample)));
    }

    /// The session's `.ended` event.
    pub fn ended(
        &self,
        outcome: &'static str,
        client_close_code: Option<u16>,
        upstream_close_code: Option<u16>,
    ) {
        let ending = Ending {
            outcome,
            client_close_code,
            upstream_close_code,
            duration: self.started.elapsed(),
        };
        let event = ended_event(
            &self.facts,
            self.trace_id,
            self.parent_span_id,
            SystemTime::now(),
            &ending,
        );
        self.telemetry
            .offer(Signal::Logs, Item::Log(Box::new(event)));
    }
}
