//! Prometheus metrics (prefix `patchbay_`), served on the admin listener.
//!
//! Labels carry the route's model and an outcome or result, never a key or
//! a key id. Histograms use buckets from 1 ms to 10 s, which cover a pooled
//! session start (sub-millisecond to a few ms) and a cold upstream dial.
//!
//! Every family is exported from the start, with no series yet
//! ([`Declared`]); the series whose labels the configuration tells (each
//! route's model and upstreams, fixed reason sets) are created at 0 when
//! the routes are built ([`ModelMeters::export_at_zero`], the pools and
//! `Route` in [`crate::gateway`]), so dashboards read 0, not "no data".

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::metric_family::Declared;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabel {
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub model: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub model: String,
    pub upstream: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabels {
    pub model: String,
    pub upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailoverLabels {
    pub model: String,
    pub from: String,
    pub to: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub model: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub model: String,
    pub status: String,
}

/// Where a queued row goes: `stdout` (the row writer) or `store` (Redis).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SinkLabel {
    pub sink: String,
}

/// A dropped telemetry item (`patchbay_telemetry_dropped_total`): its
/// signal (`traces`, `logs`, `metrics`) and why (`queue_full`,
/// `export_failed`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TelemetryDropLabels {
    pub signal: String,
    pub reason: String,
}

pub fn sink(s: &str) -> SinkLabel {
    SinkLabel { sink: s.into() }
}

/// Where a new pool size came from: `configmap` (the watch) or `file`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: String,
}

/// A live-reloaded file (`pool_size`, `keys`, `config`) and what a changed
/// read of it came to (`applied`, `rejected`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    pub file: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    pub model: String,
    pub direction: String,
    pub modality: String,
}

/// Client-secret refusals: `stage` is `mint`, `connect` or `usage`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SecretRefusalLabels {
    pub stage: String,
    pub reason: String,
}

/// A refused call action (`patchbay_call_action_refusals_total`):
/// `action` is `hangup`, `refer`, `reject`, a Live session's `attach`,
/// `fork` (WebSocket) or `content`, or `unknown` (an accept's refusals are
/// admission refusals); `reason` is the refusal's code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionRefusalLabels {
    pub action: String,
    pub reason: String,
}

/// Why the store refused a write (`patchbay_store_refusals_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabel {
    pub reason: String,
}

fn seconds_histogram() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

type HistogramFamily = Family<ModelLabel, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Registry,
    pub sessions_active: Family<ModelLabel, Gauge>,
    pub sessions_total: Family<OutcomeLabels, Counter>,
    pub upstream_dial_seconds: HistogramFamily,
    pub session_setup_seconds: HistogramFamily,
    pub pool_hits: Family<ModelLabel, Counter>,
    pub pool_misses: Family<ReasonLabels, Counter>,
    pub pool_warm_sockets: Family<UpstreamLabels, Gauge>,
    /// Each pool's target (its share of the route's pool size).
    pub pool_target_sockets: Family<UpstreamLabels, Gauge>,
    /// 1 while the pool size ConfigMap's watch is open.
    pub pool_size_watch_up: Gauge,
    pub pool_size_updates: Family<SourceLabel, Counter>,
    pub upstream_failovers: Family<FailoverLabels, Counter>,
    pub upstream_circuit_open: Family<UpstreamLabels, Gauge>,
    pub pool_dials: Family<ResultLabels, Counter>,
    pub refusals: Family<ReasonLabels, Counter>,
    pub turns: Family<StatusLabels, Counter>,
    pub tokens: Family<TokenLabels, Counter>,
    pub cost_usd: Family<ModelLabel, Counter<f64, std::sync::atomic::AtomicU64>>,
    /// [`ModelMeters`] of the routes' models, shared by their sessions.
    model_meters: Mutex<HashMap<String, Arc<ModelMeters>>>,
    pub budget_blocks: Family<ModelLabel, Counter>,
    pub rate_limit_blocks: Family<ModelLabel, Counter>,
    pub client_disconnects: Family<ModelLabel, Counter>,
    pub usage_records_dropped: Family<ModelLabel, Counter>,
    pub usage_implausible: Family<ModelLabel, Counter>,
    pub usage_duplicates: Family<ModelLabel, Counter>,
    pub store_errors: Counter,
    /// Writes the store refused whole (`noperm`, `wrongtype`,
    /// `not_a_number`), kept in the outbox and replayed.
    pub store_refusals: Family<RefusalLabel, Counter>,
    /// Failed `accept()`s on the client listener (`EMFILE` and friends).
    pub accept_errors: Counter,
    pub session_lease_fallbacks: Counter,
    pub outbox_rows: Family<SinkLabel, Gauge>,
    pub outbox_bytes: Family<SinkLabel, Gauge>,
    pub outbox_dropped: Family<SinkLabel, Counter>,
    pub outbox_dropped_usd: Counter<f64, std::sync::atomic::AtomicU64>,
    pub outbox_replayed: Counter,
    pub config_reloads: Family<ReloadLabels, Counter>,
    pub client_secrets_minted: Family<ModelLabel, Counter>,
    pub client_secrets_refused: Family<SecretRefusalLabels, Counter>,
    pub call_action_refusals: Family<ActionRefusalLabels, Counter>,
    pub telemetry_dropped: Family<TelemetryDropLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("patchbay");
        let m = Self {
            sessions_active: Family::default(),
            sessions_total: Family::default(),
            upstream_dial_seconds: Family::new_with_constructor(seconds_histogram),
            session_setup_seconds: Family::new_with_constructor(seconds_histogram),
            pool_hits: Family::default(),
            pool_misses: Family::default(),
            pool_warm_sockets: Family::default(),
            pool_target_sockets: Family::default(),
            pool_size_watch_up: Gauge::default(),
            pool_size_updates: Family::default(),
            upstream_failovers: Family::default(),
            upstream_circuit_open: Family::default(),
            pool_dials: Family::default(),
            refusals: Family::default(),
            turns: Family::default(),
            tokens: Family::default(),
            cost_usd: Family::default(),
            model_meters: Mutex::default(),
            budget_blocks: Family::default(),
            rate_limit_blocks: Family::default(),
            client_disconnects: Family::default(),
            usage_records_dropped: Family::default(),
            usage_implausible: Family::default(),
            usage_duplicates: Family::default(),
            store_errors: Counter::default(),
            store_refusals: Family::default(),
            accept_errors: Counter::default(),
            session_lease_fallbacks: Counter::default(),
            outbox_rows: Family::default(),
            outbox_bytes: Family::default(),
            outbox_dropped: Family::default(),
            outbox_dropped_usd: Counter::default(),
            outbox_replayed: Counter::default(),
            config_reloads: Family::default(),
            client_secrets_minted: Family::default(),
            client_secrets_refused: Family::default(),
            call_action_refusals: Family::default(),
            telemetry_dropped: Family::default(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "realtime_sessions_active",
            "Live client sessions",
            Declared(m.sessions_active.clone()),
        );
        r.register(
            "realtime_sessions",
            "Client sessions ended, by outcome",
            Declared(m.sessions_total.clone()),
        );
        r.register(
            "upstream_dial_seconds",
            "Successful upstream dials: connect + upgrade + session.created",
            Declared(m.upstream_dial_seconds.clone()),
        );
        r.register(
            "session_setup_seconds",
            "Client upgrade to session.created sent to the client",
            Declared(m.session_setup_seconds.clone()),
        );
        r.register(
            "pool_hits",
            "Sessions served a warm socket",
            Declared(m.pool_hits.clone()),
        );
        r.register(
            "pool_misses",
            "Sessions that dialled fresh, by reason",
            Declared(m.pool_misses.clone()),
        );
        r.register(
            "pool_warm_sockets",
            "Warm upstream sockets waiting",
            Declared(m.pool_warm_sockets.clone()),
        );
        r.register(
            "pool_target_sockets",
            "Warm upstream sockets each pool is sized for (its share of the pool size)",
            Declared(m.pool_target_sockets.clone()),
        );
        r.register(
            "pool_size_watch_up",
            "1 while the watch of the pool size ConfigMap ([pool] size_configmap) is open",
            Declared(m.pool_size_watch_up.clone()),
        );
        r.register(
            "pool_size_updates",
            "Pool size changes applied, by source (configmap, file)",
            Declared(m.pool_size_updates.clone()),
        );
        for source in ["configmap", "file"] {
            drop(m.pool_size_updates.get_or_create(&SourceLabel {
                source: source.into(),
            }));
        }
        r.register(
            "pool_dials",
            "Pool dials, by upstream and result",
            Declared(m.pool_dials.clone()),
        );
        r.register(
            "upstream_failovers",
            "Session set-ups moved to another upstream after a failed dial",
            Declared(m.upstream_failovers.clone()),
        );
        r.register(
            "upstream_circuit_open",
            "1 while an upstream's circuit breaker is open (no dials go to it)",
            Declared(m.upstream_circuit_open.clone()),
        );
        r.register(
            "admission_refusals",
            "Upgrades refused before any upstream dial, by reason",
            Declared(m.refusals.clone()),
        );
        r.register(
            "turns",
            "Response turns metered, by status",
            Declared(m.turns.clone()),
        );
        r.register("tokens", "Tokens metered", Declared(m.tokens.clone()));
        r.register(
            "cost_usd",
            "Metered cost in USD",
            Declared(m.cost_usd.clone()),
        );
        r.register(
            "budget_blocks",
            "Sessions refused or closed for a spent budget",
            Declared(m.budget_blocks.clone()),
        );
        r.register(
            "rate_limit_blocks",
            "Sessions refused by rpm/tpm",
            Declared(m.rate_limit_blocks.clone()),
        );
        r.register(
            "client_disconnects",
            "Clients that left without a close handshake",
            Declared(m.client_disconnects.clone()),
        );
        r.register(
            "usage_records_dropped",
            "never_done evictions dropped because the meter's channel was full (a record closing a turn is never dropped)",
            Declared(m.usage_records_dropped.clone()),
        );
        r.register(
            "usage_implausible",
            "Turns whose usage was beyond the plausibility bound: charged at most [metering] max_turn_usd",
            Declared(m.usage_implausible.clone()),
        );
        r.register(
            "usage_duplicates",
            "Repeated response.done events for a response already metered in the session: not charged again",
            Declared(m.usage_duplicates.clone()),
        );
        r.register(
            "store_errors",
            "Failed or timed-out store calls (fail open)",
            Declared(m.store_errors.clone()),
        );
        r.register(
            "store_refusals",
            "Store writes refused whole (by reason: noperm, wrongtype, not_a_number), kept in the outbox and replayed",
            Declared(m.store_refusals.clone()),
        );
        r.register(
            "accept_errors",
            "Failed accepts of client connections (out of file descriptors, mostly)",
            Declared(m.accept_errors.clone()),
        );
        r.register(
            "session_lease_fallbacks",
            "Capped-key admissions decided by this process's own session count because Redis did not answer",
            Declared(m.session_lease_fallbacks.clone()),
        );
        r.register(
            "outbox_rows",
            "Request-log rows waiting for their sink (stdout writer, or the store while it fails)",
            Declared(m.outbox_rows.clone()),
        );
        r.register(
            "outbox_bytes",
            "Approximate bytes of the rows waiting for their sink",
            Declared(m.outbox_bytes.clone()),
        );
        r.register(
            "outbox_dropped",
            "Rows dropped past the outbox bound (oldest first) or refused by their sink",
            Declared(m.outbox_dropped.clone()),
        );
        r.register(
            "outbox_dropped_usd",
            "Spend of store writes dropped from the outbox, never counted in a budget",
            Declared(m.outbox_dropped_usd.clone()),
        );
        r.register(
            "outbox_replayed",
            "Store writes sent from the outbox and confirmed",
            Declared(m.outbox_replayed.clone()),
        );
        r.register(
            "config_reloads",
            "Changed contents of a live-reloaded file, by file and result",
            Declared(m.config_reloads.clone()),
        );
        r.register_collector(Box::new(LogLinesDropped));
        r.register(
            "client_secrets_minted",
            "Client secrets minted, by model",
            Declared(m.client_secrets_minted.clone()),
        );
        r.register(
            "client_secrets_refused",
            "Client-secret mints and connects refused, by stage and reason",
            Declared(m.client_secrets_refused.clone()),
        );
        r.register(
            "call_action_refusals",
            "Call actions (hangup, refer, reject) the gateway refused before forwarding, \
             by action and reason; an accept's refusals are admission refusals",
            Declared(m.call_action_refusals.clone()),
        );
        r.register(
            "telemetry_dropped",
            "OpenTelemetry items dropped (never waited for), by signal and reason",
            Declared(m.telemetry_dropped.clone()),
        );
        Self { registry, ..m }
    }

    /// Counts a pool size change from `source` (`configmap`, `file`).
    pub fn pool_size_updated(&self, source: &str) {
        self.pool_size_updates
            .get_or_create(&SourceLabel {
                source: source.into(),
            })
            .inc();
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// `patchbay_log_lines_dropped_total`: read from the log writer at each
/// scrape (logging is process-wide, set up before any gateway exists).
#[derive(Debug)]
struct LogLinesDropped;

impl Collector for LogLinesDropped {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counter = ConstCounter::new(crate::logging::lines_dropped());
        let metric = encoder.encode_descriptor(
            "log_lines_dropped",
            "Log lines dropped because the queue to stderr was full",
            None,
            counter.metric_type(),
        )?;
        counter.encode(metric)
    }
}

pub fn model(m: &str) -> ModelLabel {
    ModelLabel { model: m.into() }
}

/// `patchbay_tokens_total`'s `direction` and `modality` pairs, in
/// [`ModelMeters`]' order.
pub const TOKEN_KINDS: [(&str, &str); 7] = [
    ("input", "text"),
    ("input", "audio"),
    ("input", "image"),
    ("input_cached", "text"),
    ("input_cached", "audio"),
    ("output", "text"),
    ("output", "audio"),
];

/// One model's per-session and per-turn series (`sessions_active`,
/// `upstream_dial_seconds`, `session_setup_seconds`, `sessions_total` by
/// outcome, `pool_hits`, `usage_records_dropped`, `usage_duplicates`,
/// `turns` with status 200, `tokens`, `cost_usd`), looked up in their families once per process instead of on
/// every session and turn (a lookup allocates the label set and hashes it).
/// Each is taken from its family at its first use, so a series appears in
/// `/metrics` exactly when it would without the cache; a route's model
/// has them all from the start ([`ModelMeters::export_at_zero`]).
#[derive(Debug, Default)]
pub struct ModelMeters {
    model: String,
    sessions_active: OnceLock<Gauge>,
    dial_seconds: OnceLock<Histogram>,
    setup_seconds: OnceLock<Histogram>,
    /// `sessions_total` by outcome (a handful of `&'static str`s).
    sessions: Mutex<Vec<(&'static str, Counter)>>,
    records_dropped: OnceLock<Counter>,
    duplicates: OnceLock<Counter>,
    pool_hits: OnceLock<Counter>,
    turns_ok: OnceLock<Counter>,
    tokens: [OnceLock<Counter>; TOKEN_KINDS.len()],
    cost_usd: OnceLock<Counter<f64, std::sync::atomic::AtomicU64>>,
}

impl ModelMeters {
    /// Uncached counters of `model`, for one use (each looked up in its
    /// family when used).
    pub fn for_model(model: &str) -> Self {
        Self {
            model: model.to_string(),
            ..Self::default()
        }
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// `cell`'s series of `family` for this model, taken at the first use.
    fn of_model<'a, M: Clone, C: MetricConstructor<M>>(
        &self,
        cell: &'a OnceLock<M>,
        family: &Family<ModelLabel, M, C>,
    ) -> &'a M {
        cell.get_or_init(|| family.get_or_create(&model(&self.model)).clone())
    }

    /// The model's `sessions_active` gauge (a handle to the family's).
    pub fn sessions_active(&self, m: &Metrics) -> Gauge {
        self.of_model(&self.sessions_active, &m.sessions_active)
            .clone()
    }

    /// Times a dial that took `took`, if it succeeded: failures are
    /// counted by result elsewhere, not timed (a refusal in a millisecond
    /// would read as a fast dial).
    pub fn dialled<T, E>(&self, m: &Metrics, result: &Result<T, E>, took: std::time::Duration) {
        if result.is_ok() {
            self.of_model(&self.dial_seconds, &m.upstream_dial_seconds)
                .observe(took.as_secs_f64());
        }
    }

    pub fn setup_seconds(&self, m: &Metrics, seconds: f64) {
        self.of_model(&self.setup_seconds, &m.session_setup_seconds)
            .observe(seconds);
    }

    /// Counts a session of this model that ended with `outcome`.
    pub fn session_ended(&self, m: &Metrics, outcome: &'static str) {
        let mut seen = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, c)) = seen.iter().find(|(o, _)| *o == outcome) {
            c.inc();
            return;
        }
        let c = m
            .sessions_total
            .get_or_create(&OutcomeLabels {
                model: self.model.clone(),
                outcome: outcome.into(),
            })
            .clone();
        c.inc();
        seen.push((outcome, c));
    }

    pub fn pool_hit(&self, m: &Metrics) {
        self.of_model(&self.pool_hits, &m.pool_hits).inc();
    }

    /// The model's `usage_records_dropped` counter (a handle).
    pub fn records_dropped(&self, m: &Metrics) -> Counter {
        self.of_model(&self.records_dropped, &m.usage_records_dropped)
            .clone()
    }

    /// The model's `usage_duplicates` counter (a handle).
    pub fn usage_duplicates(&self, m: &Metrics) -> Counter {
        self.of_model(&self.duplicates, &m.usage_duplicates).clone()
    }

    /// Counts a turn of this model with `status`.
    pub fn turn(&self, m: &Metrics, status: u16) {
        let labels = |status: u16| StatusLabels {
            model: self.model.clone(),
            status: status.to_string(),
        };
        if status == 200 {
            self.turns_ok
                .get_or_init(|| m.turns.get_or_create(&labels(200)).clone())
                .inc();
        } else {
            m.turns.get_or_create(&labels(status)).inc();
        }
    }

    /// Adds `n` tokens of [`TOKEN_KINDS`]`[kind]`.
    pub fn tokens(&self, m: &Metrics, kind: usize, n: u64) {
        let (Some(cell), Some((direction, modality))) =
            (self.tokens.get(kind), TOKEN_KINDS.get(kind))
        else {
            return;
        };
        cell.get_or_init(|| {
            m.tokens
                .get_or_create(&TokenLabels {
                    model: self.model.clone(),
                    direction: (*direction).into(),
                    modality: (*modality).into(),
                })
                .clone()
        })
        .inc_by(n);
    }

    pub fn cost_usd(&self, m: &Metrics, usd: f64) {
        self.of_model(&self.cost_usd, &m.cost_usd).inc_by(usd);
    }

    /// Creates, at 0, every series of this model whose labels are known
    /// before any session: the cached ones above (tokens of each of
    /// [`TOKEN_KINDS`]), the model's blocks, disconnects, implausible usage
    /// and minted secrets. A dashboard then reads 0, not "no data", on a
    /// fresh pod. Series keyed by what only a session tells (a turn's
    /// status, a session's outcome, a refusal's reason) stay lazy.
    pub fn export_at_zero(&self, m: &Metrics) {
        self.sessions_active(m);
        self.of_model(&self.dial_seconds, &m.upstream_dial_seconds);
        self.of_model(&self.setup_seconds, &m.session_setup_seconds);
        self.records_dropped(m);
        self.usage_duplicates(m);
        self.of_model(&self.pool_hits, &m.pool_hits);
        for kind in 0..TOKEN_KINDS.len() {
            self.tokens(m, kind, 0);
        }
        self.cost_usd(m, 0.0);
        let label = model(&self.model);
        for family in [
            &m.budget_blocks,
            &m.rate_limit_blocks,
            &m.client_disconnects,
            &m.usage_implausible,
            &m.client_secrets_minted,
        ] {
            drop(family.get_or_create(&label));
        }
    }
}

impl Metrics {
    /// The [`ModelMeters`] of `model`, made at its first use. Only for the
    /// models of configured routes: the cache lives as long as the process.
    pub fn model_meters(&self, model: &str) -> Arc<ModelMeters> {
        let mut cache = self.model_meters.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = cache.get(model) {
            return m.clone();
        }
        let m = Arc::new(ModelMeters::for_model(model));
        cache.insert(model.to_string(), m.clone());
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_carries_the_documented_names() {
        let m = Metrics::new();
        m.sessions_active.get_or_create(&model("m")).set(2);
        m.sessions_total
            .get_or_create(&OutcomeLabels {
                model: "m".into(),
                outcome: "client_closed".into(),
            })
            .inc();
        m.upstream_dial_seconds
            .get_or_create(&model("m"))
            .observe(0.01);
        let text = m.encode();
        assert!(
            text.contains("patchbay_realtime_sessions_active{model=\"m\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "patchbay_realtime_sessions_total{model=\"m\",outcome=\"client_closed\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("patchbay_upstream_dial_seconds_count{model=\"m\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("\npatchbay_log_lines_dropped_total 0\n"),
            "{text}"
        );
    }

    /// A model's cached counters are the families' own series, made when
    /// first used: the exposition is what the families alone would give.
    #[test]
    fn model_meters_count_into_the_families_and_add_no_series_unused() {
        let m = Metrics::new();
        let meters = m.model_meters("m");
        assert!(Arc::ptr_eq(&meters, &m.model_meters("m")));
        meters.turn(&m, 200);
        let text = m.encode();
        assert!(
            text.contains("patchbay_turns_total{model=\"m\",status=\"200\"} 1"),
            "{text}"
        );
        assert!(!text.contains("patchbay_tokens_total{"), "{text}");
        assert!(!text.contains("patchbay_cost_usd_total{"), "{text}");
        for unused in [
            "patchbay_realtime_sessions_total{",
            "patchbay_realtime_sessions_active{",
            "patchbay_upstream_dial_seconds_count{",
            "patchbay_session_setup_seconds_count{",
            "patchbay_usage_records_dropped_total{",
            "patchbay_pool_hits_total{",
        ] {
            assert!(!text.contains(unused), "{unused} in {text}");
        }

        meters.sessions_active(&m).inc();
        meters.sessions_active(&m).inc();
        meters.sessions_active(&m).dec();
        meters.dialled(&m, &Ok::<(), ()>(()), std::time::Duration::from_millis(500));
        meters.dialled(&m, &Err::<(), ()>(()), std::time::Duration::from_millis(1));
        meters.setup_seconds(&m, 0.001);
        meters.setup_seconds(&m, 0.002);
        meters.session_ended(&m, "client_closed");
        meters.session_ended(&m, "idle_timeout");
        meters.session_ended(&m, "client_closed");
        meters.records_dropped(&m).inc();
        meters.pool_hit(&m);

        meters.turn(&m, 200);
        meters.turn(&m, 499);
        meters.tokens(&m, 6, 50);
        meters.tokens(&m, 6, 5);
        meters.tokens(&m, 0, 7);
        meters.cost_usd(&m, 0.25);
        // Another model, uncached: the same families.
        ModelMeters::for_model("t").tokens(&m, 0, 3);
        let text = m.encode();
        for line in [
            "patchbay_turns_total{model=\"m\",status=\"200\"} 2",
            "patchbay_turns_total{model=\"m\",status=\"499\"} 1",
            "patchbay_tokens_total{model=\"m\",direction=\"output\",modality=\"audio\"} 55",
            "patchbay_tokens_total{model=\"m\",direction=\"input\",modality=\"text\"} 7",
            "patchbay_tokens_total{model=\"t\",direction=\"input\",modality=\"text\"} 3",
            "patchbay_cost_usd_total{model=\"m\"} 0.25",
            "patchbay_realtime_sessions_active{model=\"m\"} 1",
            "patchbay_upstream_dial_seconds_count{model=\"m\"} 1",
            "patchbay_session_setup_seconds_count{model=\"m\"} 2",
            "patchbay_realtime_sessions_total{model=\"m\",outcome=\"client_closed\"} 2",
            "patchbay_realtime_sessions_total{model=\"m\",outcome=\"idle_timeout\"} 1",
            "patchbay_usage_records_dropped_total{model=\"m\"} 1",
            "patchbay_pool_hits_total{model=\"m\"} 1",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(!text.contains("modality=\"image\""), "{text}");
    }

    #[test]
    fn a_models_known_series_are_exported_at_zero_and_per_turn_ones_stay_lazy() {
        let m = Metrics::new();
        m.model_meters("m").export_at_zero(&m);
        let text = m.encode();
        for line in [
            "patchbay_realtime_sessions_active{model=\"m\"} 0",
            "patchbay_upstream_dial_seconds_count{model=\"m\"} 0",
            "patchbay_pool_hits_total{model=\"m\"} 0",
            "patchbay_budget_blocks_total{model=\"m\"} 0",
            "patchbay_rate_limit_blocks_total{model=\"m\"} 0",
            "patchbay_client_disconnects_total{model=\"m\"} 0",
            "patchbay_usage_implausible_total{model=\"m\"} 0",
            "patchbay_client_secrets_minted_total{model=\"m\"} 0",
            "patchbay_tokens_total{model=\"m\",direction=\"input\",modality=\"image\"} 0",
            "patchbay_cost_usd_total{model=\"m\"} 0",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        // A turn's status and a session's outcome are not known at start.
        assert!(text.contains("# TYPE patchbay_turns counter\n"), "{text}");
        assert!(!text.contains("patchbay_turns_total{"), "{text}");
        assert!(
            !text.contains("patchbay_realtime_sessions_total{"),
            "{text}"
        );
    }
}
