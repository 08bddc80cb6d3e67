//! What every meter of the process shares ([`Shared`]: settings, prices,
//! store, outbox, request log, metrics, keys), what a meter knows of its
//! session ([`SessionMeta`]), and the bound on every store call
//! ([`bounded`]).

use std::sync::{Arc, RwLock};

use crate::auth::{KeyEntry, KeyStore};
use crate::config::{
    BudgetPeriod, Endpoint, Intent, MeteringConfig, PriceRow, Provider, RouteConfig, UpstreamConfig,
};
use crate::logs::RequestLog;
use crate::metering::outbox::Outbox;
use crate::metrics::Metrics;
use crate::store::{Store, StoreError, CALL_TIMEOUT};
use crate::telemetry::context::TraceParent;
use crate::telemetry::handle::{SessionTrace, Telemetry};
use crate::telemetry::semconv::SessionFacts;

#[derive(Debug)]
pub(crate) struct Shared {
    /// Replaced live when the config file's `[metering]` changes ([`Metering::set_config`]).
    pub(crate) config: RwLock<MeteringConfig>,
    pub(crate) prices: RwLock<Arc<Vec<PriceRow>>>,
    pub(crate) store: Arc<dyn Store>,
    /// Store writes that could not be made yet, replayed in order.
    pub(crate) outbox: Arc<Outbox>,
    pub(crate) log: RequestLog,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) keys: Arc<KeyStore>,
    /// Models already warned about as unpriced (one warning per model per
    /// process, not one per session).
    pub(crate) warned_unpriced: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Shared {
    /// True the first time `model` is reported unpriced in this process.
    pub(crate) fn first_unpriced(&self, model: &str) -> bool {
        let mut warned = self
            .warned_unpriced
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        warned.insert(model.to_string())
    }

    /// The `[metering]` settings as they are now.
    pub(crate) fn config(&self) -> MeteringConfig {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn prices(&self) -> Arc<Vec<PriceRow>> {
        match self.prices.read() {
            Ok(p) => p.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    pub(crate) fn store_error(&self, e: &StoreError, during: &'static str) {
        self.metrics.store_errors.inc();
        if let Some((reason, refused)) = e.refusal() {
            count_refusal(&self.metrics, reason);
            tracing::warn!(store = %self.store.describe(), reason, refused = %refused, during,
                "the store refused a write (nothing of it applied); it waits in the outbox");
            return;
        }
        tracing::warn!(store = %self.store.describe(), error = %e, during, "store call failed; failing open");
    }
}

/// What the meter needs to know about a session.
#[derive(Debug, Clone)]
pub struct SessionMeta {
    /// The upgrade id; rows are `<session_id>:<turn n>`.
    pub session_id: String,
    /// The key at admission; the meter re-reads it from the key store.
    pub key: KeyEntry,
    /// The client secret the session was opened with (`key` is its parent).
    pub client_secret_id: Option<String>,
    /// `websocket`, `webrtc` or `sip` ([`crate::calls::Transport`]).
    pub transport: &'static str,
    /// The call metered over a sideband.
    pub call_id: Option<String>,
    /// A Live session's id upstream (`session.started`'s `session.id`).
    pub live_session_id: Option<String>,
    pub team: Option<String>,
    /// The route's client-facing model.
    pub model: String,
    pub upstream_model: String,
    pub provider: &'static str,
    /// The upstream's name (a single-upstream route's model).
    pub upstream: String,
    pub route_budget: Option<(f64, BudgetPeriod)>,
    /// The session's trace, when telemetry is on: its response turns
    /// become spans when the meter flushes them.
    pub trace: Option<Arc<SessionTrace>>,
}

impl SessionMeta {
    pub fn new(session_id: impl Into<String>, key: &KeyEntry, route: &RouteConfig) -> Self {
        Self {
            session_id: session_id.into(),
            key: key.clone(),
            client_secret_id: None,
            transport: "websocket",
            call_id: None,
            live_session_id: None,
            team: key.team.clone(),
            model: route.model.clone(),
            upstream_model: route.upstream_model().to_string(),
            provider: provider_name(route.provider),
            upstream: route.model.clone(),
            route_budget: route.budget_usd.map(|b| (b, route.budget_period)),
            trace: None,
        }
    }

    /// Starts the session's trace (its `.started` event sent) when
    /// `telemetry` is on, continuing the client's `parent` trace. Its
    /// response turns become spans unless it is a translation or
    /// transcription session (`route`'s, or asked for by the client's
    /// `params`), as the conventions say.
    pub fn traced(
        mut self,
        telemetry: &Telemetry,
        parent: Option<TraceParent>,
        route: &RouteConfig,
        params: &[(String, String)],
    ) -> Self {
        if !telemetry.is_on() {
            return self;
        }
        let transcription = route.intent == Some(Intent::Transcription)
            || params
                .iter()
                .any(|(k, v)| k == "intent" && v == Intent::Transcription.as_str());
        let inference_spans = route.endpoint == Endpoint::Realtime && !transcription;
        let facts = SessionFacts {
            session_id: self.session_id.clone(),
            model: self.model.clone(),
            upstream_model: self.upstream_model.clone(),
            provider: self.provider,
            key_id: self.key.id.clone(),
            transport: self.transport,
        };
        self.trace = telemetry.session(parent, facts, inference_spans);
        self
    }

    /// Marks the session as opened with client secret `id`.
    pub fn with_client_secret(mut self, id: Option<String>) -> Self {
        self.client_secret_id = id;
        self
    }

    /// Marks the session as Live session `id` upstream.
    pub fn for_live_session(mut self, id: Option<String>) -> Self {
        self.live_session_id = id;
        self
    }

    /// Marks the session as the sideband of call `call_id`.
    pub fn for_call(mut self, transport: &'static str, call_id: &str) -> Self {
        self.transport = transport;
        self.call_id = Some(call_id.to_string());
        self
    }

    /// The session runs on `up`, one of the route's upstreams.
    pub fn on_upstream(mut self, up: &UpstreamConfig, route: &RouteConfig) -> Self {
        self.upstream_model = up.upstream_model(route).to_string();
        self.provider = provider_name(up.provider);
        self.upstream = up.name.clone();
        self
    }
}

fn provider_name(p: Provider) -> &'static str {
    match p {
        Provider::Openai => "openai",
        Provider::Azure => "azure",
    }
}

/// An error and its sources, `: `-separated.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// Bounds any store call with [`CALL_TIMEOUT`].
pub(crate) async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, StoreError>>,
    op: &'static str,
) -> Result<T, StoreError> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::Timeout {
            op,
            after: CALL_TIMEOUT,
        }),
    }
}

/// Counts a write the store refused whole, by reason.
pub(crate) fn count_refusal(metrics: &Metrics, reason: &str) {
    metrics
        .store_refusals
        .get_or_create(&crate::metrics::RefusalLabel {
            reason: reason.to_string(),
        })
        .inc();
}
