//! Request-log rows: one per metered turn, and where they go.
//!
//! A row's field names are a contract with whatever reads the log (billing
//! exports, dashboards): [`FIELDS`] lists them in order, and both sinks use
//! exactly those names:
//! - stdout, always: one JSON object per line (`tracing` output goes to
//!   stderr, so stdout carries nothing else);
//! - the Redis stream `{prefix}request_logs`, when Redis is configured: one
//!   flat stream field per row field, every value a string (`ttft_ms`,
//!   `team`, `client_secret_id`, `call_id` and `live_session_id` are empty when absent,
//!   `usage_unknown`, `usage_implausible`, `usage_estimated` and `usage_unpriced` are `true`/`false`). The
//!   stream write rides in the meter's flush round trip
//!   ([`crate::store::Store::flush`]), and waits in the outbox
//!   ([`crate::metering::outbox`]) while the store fails.
//!
//! Rows never block the runtime. [`RequestLog::write`] serialises the rows
//! and appends them to a bounded queue (a short lock, never I/O); one
//! writer thread (`patchbay-rows`) takes everything queued and writes it
//! with one `write_all`, so rows never interleave mid-line. The thread is
//! woken and lingers as [`crate::linger`] says (up to [`LINGER`] or
//! [`LINGER_BYTES`]): one wake-up and one write for the rows of a moment. A
//! row therefore reaches stdout at most [`LINGER`] after its turn ended;
//! the drain's [`RequestLog::settle`] cuts the linger short. A stalled
//! stdout reader (a slow log collector) therefore stalls only that thread:
//! rows wait in the queue, counted by `patchbay_outbox_rows{sink="stdout"}`,
//! up to [`crate::lane::MAX_ROWS`] rows or
//! [`crate::lane::MAX_BYTES`]; past that the oldest are dropped,
//! counted by `patchbay_outbox_dropped_total{sink="stdout"}` with a warning.
//! A failed write (stdout closed) drops its rows the same way.
//! [`RequestLog::settle`] waits (polling, never blocking a worker) for the
//! queue to be written; the drain calls it.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;

use crate::lane::{Bounds, Lane, SETTLE_POLL};
use crate::linger::{self, Batching, Linger};
use crate::metrics::{sink, Metrics};

/// How long the writer thread waits, once woken, for more rows before it
/// writes (only when its last write was less than this ago).
pub const LINGER: Duration = Duration::from_millis(100);
/// Queued bytes at which the writer thread stops lingering.
pub const LINGER_BYTES: usize = 256 * 1024;

/// The row's field names, in the order they are written.
pub const FIELDS: [&str; 37] = [
    "request_id",
    "session_id",
    "key_id",
    "client_secret_id",
    "transport",
    "call_id",
    "live_session_id",
    "response_id",
    "delegation_id",
    "team",
    "model",
    "upstream_model",
    "provider",
    "upstream",
    "started_at",
    "ended_at",
    "latency_ms",
    "ttft_ms",
    "status",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "input_text_tokens",
    "input_audio_tokens",
    "input_image_tokens",
    "input_cached_tokens",
    "output_text_tokens",
    "output_audio_tokens",
    "transcription_tokens",
    "audio_seconds",
    "output_audio_seconds",
    "cost_usd",
    "usage_unknown",
    "usage_implausible",
    "usage_estimated",
    "usage_unpriced",
    "end_reason",
];

/// What a row's JSON line is allocated with: a row is about 700 bytes.
const ROW_LINE_CAPACITY: usize = 1024;

/// A JSON object being written: `{` before the first field, `,` before
/// each next one.
struct JsonObject<'a>(&'a mut Vec<u8>);

impl JsonObject<'_> {
    /// `name` must need no JSON escaping (the row's names are `[a-z_]+`).
    fn field<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) {
        self.0.push(if self.0.is_empty() { b'{' } else { b',' });
        self.0.push(b'"');
        self.0.extend_from_slice(name.as_bytes());
        self.0.extend_from_slice(b"\":");
        // Serializing plain strings and numbers into a Vec cannot fail.
        let _ = value.serialize(&mut serde_json::Serializer::new(&mut *self.0));
    }
}

/// One metered turn.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RequestLogRow {
    /// `<upgrade id>:<turn n>`.
    pub request_id: String,
    pub session_id: String,
    pub key_id: String,
    /// The client secret the session was opened with (its parent is
    /// `key_id`); `None` for a session opened with the key itself.
    pub client_secret_id: Option<String>,
    /// How the client reached the model: `websocket`, `webrtc` or `sip`.
    pub transport: String,
    /// The call a WebRTC or SIP row belongs to (metered over its sideband).
    pub call_id: Option<String>,
    /// The Live session a Live row belongs to (its id upstream).
    pub live_session_id: Option<String>,
    /// The response a delegated row charges (a Live session's Responses
    /// delegation, [`crate::metering::delegated`]); `None` otherwise.
    pub response_id: Option<String>,
    /// The Live delegation that response belongs to, when the upstream
    /// named one.
    pub delegation_id: Option<String>,
    pub team: Option<String>,
    pub model: String,
    pub upstream_model: String,
    pub provider: String,
    /// The upstream's `name` (a single-upstream route's model).
    pub upstream: String,
    /// RFC 3339, UTC, milliseconds.
    pub started_at: String,
    pub ended_at: String,
    pub latency_ms: u64,
    pub ttft_ms: Option<u64>,
    /// HTTP-style: 200, or why the turn was cut short (see `docs/metering.md`).
    pub status: u16,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
    pub input_text_tokens: u64,
    pub input_audio_tokens: u64,
    pub input_image_tokens: u64,
    pub input_cached_tokens: u64,
    pub output_text_tokens: u64,
    pub output_audio_tokens: u64,
    pub transcription_tokens: u64,
    /// Seconds of audio of a duration usage (a transcription billed per
    /// minute, a translation window's input); `None` for token usage.
    pub audio_seconds: Option<f64>,
    /// Seconds of output audio of a translation window (measured, not
    /// billed); `None` for other rows.
    pub output_audio_seconds: Option<f64>,
    /// What the turn was charged: its cost at the flush's prices, capped at
    /// `[metering] max_turn_usd` when `usage_implausible`.
    pub cost_usd: f64,
    pub usage_unknown: bool,
    /// The usage reported was beyond the plausibility bound
    /// ([`crate::metering::pricing::charge`]): the token counts are as
    /// reported, `cost_usd` is capped.
    pub usage_implausible: bool,
    /// The session's last figure never came (a Live session closed without
    /// `session.closed`): `audio_seconds` is the last figure seen plus the
    /// time since it ([`crate::metering::live`]).
    pub usage_estimated: bool,
    /// No `[[prices]]` row applied to the row's usage: `cost_usd` is 0 for
    /// want of a price, not because nothing was used.
    pub usage_unpriced: bool,
    pub end_reason: String,
}

impl RequestLogRow {
    /// The row as one JSON object, its fields in [`FIELDS`] order: the same
    /// text as serde's derived serializer writes (a test holds them equal),
    /// with the keys written as they are (they need no escaping) and only
    /// the values serialized.
    pub fn to_json_line(&self) -> String {
        let mut out = Vec::with_capacity(ROW_LINE_CAPACITY);
        let mut w = JsonObject(&mut out);
        w.field("request_id", &self.request_id);
        w.field("session_id", &self.session_id);
        w.field("key_id", &self.key_id);
        w.field("client_secret_id", &self.client_secret_id);
        w.field("transport", &self.transport);
        w.field("call_id", &self.call_id);
        w.field("live_session_id", &self.live_session_id);
        w.field("response_id", &self.response_id);
        w.field("delegation_id", &self.delegation_id);
        w.field("team", &self.team);
        w.field("model", &self.model);
        w.field("upstream_model", &self.upstream_model);
        w.field("provider", &self.provider);
        w.field("upstream", &self.upstream);
        w.field("started_at", &self.started_at);
        w.field("ended_at", &self.ended_at);
        w.field("latency_ms", &self.latency_ms);
        w.field("ttft_ms", &self.ttft_ms);
        w.field("status", &self.status);
        w.field("input_tokens", &self.input_tokens);
        w.field("output_tokens", &self.output_tokens);
        w.field("total_tokens", &self.total_tokens);
        w.field("input_text_tokens", &self.input_text_tokens);
        w.field("input_audio_tokens", &self.input_audio_tokens);
        w.field("input_image_tokens", &self.input_image_tokens);
        w.field("input_cached_tokens", &self.input_cached_tokens);
        w.field("output_text_tokens", &self.output_text_tokens);
        w.field("output_audio_tokens", &self.output_audio_tokens);
        w.field("transcription_tokens", &self.transcription_tokens);
        w.field("audio_seconds", &self.audio_seconds);
        w.field("output_audio_seconds", &self.output_audio_seconds);
        w.field("cost_usd", &self.cost_usd);
        w.field("usage_unknown", &self.usage_unknown);
        w.field("usage_implausible", &self.usage_implausible);
        w.field("usage_estimated", &self.usage_estimated);
        w.field("usage_unpriced", &self.usage_unpriced);
        w.field("end_reason", &self.end_reason);
        out.push(b'}');
        // serde_json writes UTF-8 only.
        String::from_utf8(out).unwrap_or_default()
    }

    /// Bytes of the row's variable fields (a queue-size estimate).
    pub fn approx_bytes(&self) -> usize {
        self.request_id.len()
            + self.session_id.len()
            + self.key_id.len()
            + self.team.as_ref().map_or(0, String::len)
            + self.call_id.as_ref().map_or(0, String::len)
            + self.live_session_id.as_ref().map_or(0, String::len)
            + self.response_id.as_ref().map_or(0, String::len)
            + self.delegation_id.as_ref().map_or(0, String::len)
            + self.model.len()
            + self.upstream_model.len()
            + self.provider.len()
            + self.started_at.len()
            + self.ended_at.len()
            + self.end_reason.len()
    }

    /// The row as flat string fields for `XADD`, in [`FIELDS`] order.
    pub fn stream_fields(&self) -> [(&'static str, String); FIELDS.len()] {
        let n = |v: u64| v.to_string();
        [
            ("request_id", self.request_id.clone()),
            ("session_id", self.session_id.clone()),
            ("key_id", self.key_id.clone()),
            (
                "client_secret_id",
                self.client_secret_id.clone().unwrap_or_default(),
            ),
            ("transport", self.transport.clone()),
            ("call_id", self.call_id.clone().unwrap_or_default()),
            (
                "live_session_id",
                self.live_session_id.clone().unwrap_or_default(),
            ),
            ("response_id", self.response_id.clone().unwrap_or_default()),
            (
                "delegation_id",
                self.delegation_id.clone().unwrap_or_default(),
            ),
            ("team", self.team.clone().unwrap_or_default()),
            ("model", self.model.clone()),
            ("upstream_model", self.upstream_model.clone()),
            ("provider", self.provider.clone()),
            ("upstream", self.upstream.clone()),
            ("started_at", self.started_at.clone()),
            ("ended_at", self.ended_at.clone()),
            ("latency_ms", n(self.latency_ms)),
            ("ttft_ms", self.ttft_ms.map(n).unwrap_or_default()),
            ("status", self.status.to_string()),
            ("input_tokens", n(self.input_tokens)),
            ("output_tokens", n(self.output_tokens)),
            ("total_tokens", n(self.total_tokens)),
            ("input_text_tokens", n(self.input_text_tokens)),
            ("input_audio_tokens", n(self.input_audio_tokens)),
            ("input_image_tokens", n(self.input_image_tokens)),
            ("input_cached_tokens", n(self.input_cached_tokens)),
            ("output_text_tokens", n(self.output_text_tokens)),
            ("output_audio_tokens", n(self.output_audio_tokens)),
            ("transcription_tokens", n(self.transcription_tokens)),
            (
                "audio_seconds",
                self.audio_seconds
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
            ),
            (
                "output_audio_seconds",
                self.output_audio_seconds
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
            ),
            ("cost_usd", self.cost_usd.to_string()),
            ("usage_unknown", self.usage_unknown.to_string()),
            ("usage_implausible", self.usage_implausible.to_string()),
            ("usage_estimated", self.usage_estimated.to_string()),
            ("usage_unpriced", self.usage_unpriced.to_string()),
            ("end_reason", self.end_reason.clone()),
        ]
    }
}

/// Where rows are written: stdout (through the writer thread), any other
/// writer the same way, or (tests) a shared vector. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RequestLog {
    sink: Sink,
}

#[derive(Debug, Clone)]
enum Sink {
    Capture(Captured),
    Pipe(Arc<PipeHandle>),
}

/// Rows captured by [`RequestLog::capture`].
#[derive(Debug, Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<RequestLogRow>>>);

impl Captured {
    pub fn rows(&self) -> Vec<RequestLogRow> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The queue between [`RequestLog::write`] and the writer thread.
struct Pipe {
    state: Mutex<PipeState>,
    wake: Condvar,
    rows_gauge: Gauge,
    bytes_gauge: Gauge,
    dropped: Counter,
}

struct PipeState {
    /// Serialised lines of one `write` call each.
    lane: Lane<String>,
    /// Rows the writer thread took and is writing.
    writing: usize,
    /// Every [`RequestLog`] handle is gone: the thread ends.
    closed: bool,
    /// Ended by [`RequestLog::settle`].
    linger: Linger,
}

impl Batching for PipeState {
    fn linger(&mut self) -> &mut Linger {
        &mut self.linger
    }

    fn ready(&self) -> bool {
        !self.lane.is_empty() || self.closed
    }

    fn closed(&self) -> bool {
        self.closed
    }

    fn queued_bytes(&self) -> usize {
        self.lane.bytes()
    }
}

/// Owned by every clone of a piped [`RequestLog`]; the last one dropped
/// tells the writer thread to finish what is queued and end.
#[derive(Debug)]
struct PipeHandle(Arc<Pipe>);

impl Drop for PipeHandle {
    fn drop(&mut self) {
        self.0.lock().closed = true;
        self.0.wake.notify_all();
    }
}

impl std::fmt::Debug for Pipe {
    // Counts only: the queue can hold many rows.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("Pipe")
            .field("queued_rows", &s.lane.rows())
            .field("writing", &s.writing)
            .finish_non_exhaustive()
    }
}

impl Pipe {
    fn lock(&self) -> std::sync::MutexGuard<'_, PipeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn gauges(&self, s: &PipeState) {
        self.rows_gauge.set((s.lane.rows() + s.writing) as i64);
        self.bytes_gauge.set(s.lane.bytes() as i64);
    }

    /// The writer thread: takes everything queued, writes it, repeats.
    fn run(&self, mut out: Box<dyn Write + Send>) {
        let mut failing = false;
        let mut last_write: Option<Instant> = None;
        loop {
            let (batch, rows) = {
                let mut s = linger::wait_for_batch(&self.wake, self.lock(), last_write);
                if s.lane.is_empty() {
                    return;
                }
                let items = s.lane.take_all();
                let rows: usize = items.iter().map(|(_, r)| r).sum();
                s.writing = rows;
                self.gauges(&s);
                (items, rows)
            };
            let buf: String = batch.into_iter().map(|(t, _)| t).collect();
            let result = out.write_all(buf.as_bytes()).and_then(|()| out.flush());
            last_write = Some(Instant::now());
            match result {
                Ok(()) => failing = false,
                Err(e) => {
                    self.dropped.inc_by(rows as u64);
                    if !failing {
                        tracing::warn!(error = %e, rows, "cannot write request-log rows to stdout; dropped");
                    }
                    failing = true;
                }
            }
            let mut s = self.lock();
            s.writing = 0;
            self.gauges(&s);
        }
    }
}

impl RequestLog {
    /// JSON lines on stdout (production), through the writer thread.
    pub fn stdout(metrics: &Metrics) -> Self {
        Self::to_writer(Box::new(std::io::stdout()), Bounds::default(), metrics)
    }

    /// JSON lines on `out`, written by a thread of their own; at most
    /// `bounds` wait (oldest dropped past that).
    pub fn to_writer(out: Box<dyn Write + Send>, bounds: Bounds, metrics: &Metrics) -> Self {
        let label = sink("stdout");
        let pipe = Arc::new(Pipe {
            state: Mutex::new(PipeState {
                lane: Lane::new(bounds),
                writing: 0,
                closed: false,
                linger: Linger::new(LINGER, LINGER_BYTES),
            }),
            wake: Condvar::new(),
            rows_gauge: metrics.outbox_rows.get_or_create(&label).clone(),
            bytes_gauge: metrics.outbox_bytes.get_or_create(&label).clone(),
            dropped: metrics.outbox_dropped.get_or_create(&label).clone(),
        });
        let thread_pipe = pipe.clone();
        let spawned = std::thread::Builder::new()
            .name("patchbay-rows".into())
            .spawn(move || thread_pipe.run(out));
        if let Err(e) = spawned {
            // Without the thread rows would only pile up: say so once; the
            // queue bound still holds and drops are counted.
            tracing::error!(error = %e, "cannot start the request-log writer thread");
        }
        Self {
            sink: Sink::Pipe(Arc::new(PipeHandle(pipe))),
        }
    }

    /// Rows kept in memory instead of printed (tests).
    pub fn capture() -> (Self, Captured) {
        let c = Captured::default();
        (
            Self {
                sink: Sink::Capture(c.clone()),
            },
            c,
        )
    }

    /// Queues `rows` for the sink; never blocks on I/O.
    pub fn write(&self, rows: &[RequestLogRow]) {
        if rows.is_empty() {
            return;
        }
        let pipe = match &self.sink {
            Sink::Capture(c) => {
                c.0.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend_from_slice(rows);
                return;
            }
            Sink::Pipe(h) => &h.0,
        };
        let mut buf = String::with_capacity(rows.len() * 640);
        for row in rows {
            buf.push_str(&row.to_json_line());
            buf.push('\n');
        }
        let bytes = buf.len();
        let (dropped, wake) = {
            let mut s = pipe.lock();
            let before = s.lane.bytes();
            let (_, dropped) = s.lane.push(buf, rows.len(), bytes);
            pipe.gauges(&s);
            let after = s.lane.bytes();
            (dropped, s.linger.wakes(before, after))
        };
        if wake {
            pipe.wake.notify_one();
        }
        if !dropped.is_empty() {
            let n: usize = dropped.iter().map(|(_, r)| r).sum();
            pipe.dropped.inc_by(n as u64);
            tracing::warn!(
                rows = n,
                "request-log row queue full (stdout not read?): dropped the oldest rows"
            );
        }
    }

    /// Rows queued or being written.
    pub fn pending(&self) -> usize {
        match &self.sink {
            Sink::Capture(_) => 0,
            Sink::Pipe(h) => {
                let s = h.0.lock();
                s.lane.rows() + s.writing
            }
        }
    }

    /// Waits until every queued row was written, or `deadline`; true when
    /// nothing is left. Polls, so it never blocks a runtime thread.
    pub async fn settle(&self, deadline: tokio::time::Instant) -> bool {
        if let Sink::Pipe(h) = &self.sink {
            h.0.lock().linger.hurry();
            h.0.wake.notify_all();
        }
        loop {
            if self.pending() == 0 {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(SETTLE_POLL.min(deadline - tokio::time::Instant::now())).await;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> RequestLogRow {
        RequestLogRow {
            request_id: "abc:1".into(),
            session_id: "abc".into(),
            key_id: "k1".into(),
            client_secret_id: None,
            transport: "websocket".into(),
            call_id: None,
            live_session_id: None,
            response_id: None,
            delegation_id: None,
            team: Some("support".into()),
            model: "gpt-realtime".into(),
            upstream_model: "gpt-realtime-2025-08-28".into(),
            provider: "openai".into(),
            upstream: "gpt-realtime".into(),
            started_at: "2025-01-01T00:00:00.000Z".into(),
            ended_at: "2025-01-01T00:00:01.250Z".into(),
            latency_ms: 1250,
            ttft_ms: None,
            status: 200,
            input_tokens: 125,
            output_tokens: 62,
            total_tokens: 187,
            input_text_tokens: 25,
            input_audio_tokens: 100,
            input_image_tokens: 0,
            input_cached_tokens: 0,
            output_text_tokens: 12,
            output_audio_tokens: 50,
            transcription_tokens: 0,
            audio_seconds: None,
            output_audio_seconds: None,
            cost_usd: 0.0065,
            usage_unknown: false,
            usage_implausible: false,
            usage_estimated: false,
            usage_unpriced: false,
            end_reason: "completed".into(),
        }
    }

    #[test]
    fn json_row_has_exactly_the_documented_fields_in_order() {
        let line = sample().to_json_line();
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let mut expected = FIELDS.to_vec();
        expected.sort_unstable();
        let mut got = keys.clone();
        got.sort_unstable();
        assert_eq!(got, expected);
        // serde writes struct fields in declaration order.
        let order: Vec<usize> = FIELDS
            .iter()
            .map(|f| line.find(&format!("\"{f}\":")).unwrap())
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{line}");
        assert_eq!(v["ttft_ms"], serde_json::Value::Null);
        assert_eq!(v["usage_unknown"], false);
        assert_eq!(v["usage_implausible"], false);
        assert_eq!(v["team"], "support");
        assert_eq!(v["client_secret_id"], serde_json::Value::Null);
        assert_eq!(v["cost_usd"], 0.0065);
    }

    /// The hand-ordered writer and serde's derived serializer write the
    /// same text, whatever the strings hold and whichever options are set.
    #[test]
    fn json_row_is_what_serde_writes() {
        assert!(FIELDS
            .iter()
            .all(|f| f.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')));
        let odd: String = (0u8..0x80).map(char::from).collect::<String>() + "é \u{2028} 🎧 \\ \"";
        let mut rows = vec![sample()];
        let mut row = sample();
        row.request_id = odd.clone();
        row.session_id = odd.clone();
        row.client_secret_id = Some(odd.clone());
        row.call_id = Some("rtc_1".into());
        row.team = None;
        row.end_reason = odd;
        row.ttft_ms = Some(u64::MAX);
        row.status = 499;
        row.usage_unknown = true;
        row.usage_implausible = true;
        rows.push(row);
        for cost in [
            0.0,
            1e-9,
            12_345.678_9,
            0.1 + 0.2,
            f64::MAX,
            f64::NAN,
            f64::INFINITY,
        ] {
            let mut row = sample();
            row.cost_usd = cost;
            rows.push(row);
        }
        for row in rows {
            assert_eq!(row.to_json_line(), serde_json::to_string(&row).unwrap());
        }
    }

    #[test]
    fn stream_fields_are_flat_strings_named_like_the_json() {
        let mut row = sample();
        row.team = None;
        row.ttft_ms = Some(87);
        row.usage_unknown = true;
        row.usage_implausible = true;
        let fields = row.stream_fields();
        let names: Vec<&str> = fields.iter().map(|(k, _)| *k).collect();
        assert_eq!(names, FIELDS.to_vec());
        let get = |k: &str| fields.iter().find(|(f, _)| *f == k).unwrap().1.clone();
        assert_eq!(get("team"), "");
        assert_eq!(get("client_secret_id"), "");
        assert_eq!(get("ttft_ms"), "87");
        assert_eq!(get("usage_unknown"), "true");
        assert_eq!(get("usage_implausible"), "true");
        assert_eq!(get("cost_usd"), "0.0065");
        assert_eq!(get("status"), "200");
    }

    #[test]
    fn captured_rows_are_kept_in_order() {
        let (log, captured) = RequestLog::capture();
        let mut b = sample();
        b.request_id = "abc:2".into();
        log.write(&[sample(), b]);
        let ids: Vec<String> = captured.rows().into_iter().map(|r| r.request_id).collect();
        assert_eq!(ids, ["abc:1", "abc:2"]);
    }

    /// A writer that blocks until the test opens its gate, then appends to
    /// a shared buffer.
    struct Gated {
        gate: Arc<(Mutex<bool>, Condvar)>,
        out: Arc<Mutex<Vec<u8>>>,
        entered: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Write for Gated {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.entered
                .store(true, std::sync::atomic::Ordering::SeqCst);
            let (open, cv) = &*self.gate;
            let mut g = open.lock().unwrap();
            while !*g {
                g = cv.wait(g).unwrap();
            }
            self.out.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn row(n: usize) -> RequestLogRow {
        RequestLogRow {
            request_id: format!("abc:{n}"),
            ..sample()
        }
    }

    #[tokio::test]
    async fn a_stalled_writer_never_blocks_write_and_rows_follow_when_it_resumes() {
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let out = Arc::new(Mutex::new(Vec::new()));
        let metrics = Metrics::new();
        let log = RequestLog::to_writer(
            Box::new(Gated {
                gate: gate.clone(),
                out: out.clone(),
                entered: Default::default(),
            }),
            Bounds::default(),
            &metrics,
        );
        // The writer is stuck in its first write; every later write call
        // returns at once and the rows wait in the queue.
        for n in 0..1000 {
            log.write(&[row(n)]);
        }
        assert_eq!(log.pending(), 1000);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(50);
        assert!(!log.settle(deadline).await, "nothing can be written yet");
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        assert!(log.settle(deadline).await);
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        let ids: Vec<String> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["request_id"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        let expected: Vec<String> = (0..1000).map(|n| format!("abc:{n}")).collect();
        assert_eq!(ids, expected, "every row once, in order");
        assert!(metrics
            .encode()
            .contains("patchbay_outbox_rows{sink=\"stdout\"} 0"));
    }

    #[tokio::test]
    async fn past_its_bound_the_row_queue_drops_the_oldest_and_counts_them() {
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let out = Arc::new(Mutex::new(Vec::new()));
        let metrics = Metrics::new();
        let entered = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let log = RequestLog::to_writer(
            Box::new(Gated {
                gate: gate.clone(),
                out: out.clone(),
                entered: entered.clone(),
            }),
            Bounds {
                max_rows: 10,
                max_bytes: usize::MAX,
            },
            &metrics,
        );
        log.write(&[row(0)]);
        // Wait until the writer holds row 0 (stuck in write).
        let mut spins = 0;
        while !entered.load(std::sync::atomic::Ordering::SeqCst) {
            spins += 1;
            assert!(spins < 10_000, "the writer never took the first row");
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        for n in 1..=15 {
            log.write(&[row(n)]);
        }
        assert!(metrics
            .encode()
            .contains("patchbay_outbox_dropped_total{sink=\"stdout\"} 5"));
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        assert!(log.settle(deadline).await);
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        let ids: Vec<String> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["request_id"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        let mut expected = vec!["abc:0".to_string()];
        expected.extend((6..=15).map(|n| format!("abc:{n}")));
        assert_eq!(ids, expected, "the oldest queued rows were dropped");
    }
}
