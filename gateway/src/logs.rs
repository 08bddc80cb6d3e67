//! Request-log rows: one per metered turn, and where they go.
//!
//! A row's field names are a contract with whatever reads the log (billing
//! exports, dashboards): [`FIELDS`] lists them in order, and both sinks use
//! exactly those names:
//! - stdout, always: one JSON object per line (`tracing` output goes to
//!   stderr, so stdout carries nothing else). A flush writes its rows with
//!   one `write_all` under the stdout lock, so rows of concurrent sessions
//!   never interleave mid-line;
//! - the Redis stream `{prefix}request_logs`, when Redis is configured: one
//!   flat stream field per row field, every value a string (`ttft_ms`,
//!   `team` and `client_secret_id` are empty when absent, `usage_unknown` is `true`/`false`). The
//!   stream write rides in the meter's flush round trip
//!   ([`crate::store::Store::flush`]).
//!
//! Caveat: stdout is written synchronously. A stalled stdout reader stalls
//! the meter tasks (never the relays, which only `try_send` to the meter).

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde::Serialize;

/// The row's field names, in the order they are written.
pub const FIELDS: [&str; 25] = [
    "request_id",
    "session_id",
    "key_id",
    "client_secret_id",
    "team",
    "model",
    "upstream_model",
    "provider",
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
    "input_cached_tokens",
    "output_text_tokens",
    "output_audio_tokens",
    "transcription_tokens",
    "cost_usd",
    "usage_unknown",
    "end_reason",
];

/// One metered turn.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestLogRow {
    /// `<upgrade id>:<turn n>`.
    pub request_id: String,
    pub session_id: String,
    pub key_id: String,
    /// The client secret the session was opened with (its parent is
    /// `key_id`); `None` for a session opened with the key itself.
    pub client_secret_id: Option<String>,
    pub team: Option<String>,
    pub model: String,
    pub upstream_model: String,
    pub provider: String,
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
    pub input_cached_tokens: u64,
    pub output_text_tokens: u64,
    pub output_audio_tokens: u64,
    pub transcription_tokens: u64,
    pub cost_usd: f64,
    pub usage_unknown: bool,
    pub end_reason: String,
}

impl RequestLogRow {
    pub fn to_json_line(&self) -> String {
        // Serialising plain strings and numbers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
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
            ("team", self.team.clone().unwrap_or_default()),
            ("model", self.model.clone()),
            ("upstream_model", self.upstream_model.clone()),
            ("provider", self.provider.clone()),
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
            ("input_cached_tokens", n(self.input_cached_tokens)),
            ("output_text_tokens", n(self.output_text_tokens)),
            ("output_audio_tokens", n(self.output_audio_tokens)),
            ("transcription_tokens", n(self.transcription_tokens)),
            ("cost_usd", self.cost_usd.to_string()),
            ("usage_unknown", self.usage_unknown.to_string()),
            ("end_reason", self.end_reason.clone()),
        ]
    }
}

/// Where rows are written: stdout, or (tests) a shared vector.
#[derive(Debug, Clone, Default)]
pub struct RequestLog {
    capture: Option<Captured>,
}

/// Rows captured by [`RequestLog::capture`].
#[derive(Debug, Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<RequestLogRow>>>);

impl Captured {
    pub fn rows(&self) -> Vec<RequestLogRow> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl RequestLog {
    /// JSON lines on stdout (production).
    pub fn stdout() -> Self {
        Self::default()
    }

    /// Rows kept in memory instead of printed (tests).
    pub fn capture() -> (Self, Captured) {
        let c = Captured::default();
        (
            Self {
                capture: Some(c.clone()),
            },
            c,
        )
    }

    pub fn write(&self, rows: &[RequestLogRow]) {
        if rows.is_empty() {
            return;
        }
        if let Some(c) = &self.capture {
            c.0.lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(rows);
            return;
        }
        let mut buf = String::with_capacity(rows.len() * 640);
        for row in rows {
            buf.push_str(&row.to_json_line());
            buf.push('\n');
        }
        if let Err(e) = std::io::stdout().lock().write_all(buf.as_bytes()) {
            tracing::warn!(error = %e, rows = rows.len(), "cannot write request-log rows to stdout");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> RequestLogRow {
        RequestLogRow {
            request_id: "abc:1".into(),
            session_id: "abc".into(),
            key_id: "k1".into(),
            client_secret_id: None,
            team: Some("support".into()),
            model: "gpt-realtime".into(),
            upstream_model: "gpt-realtime-2025-08-28".into(),
            provider: "openai".into(),
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
            input_cached_tokens: 0,
            output_text_tokens: 12,
            output_audio_tokens: 50,
            transcription_tokens: 0,
            cost_usd: 0.0065,
            usage_unknown: false,
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
        assert_eq!(v["team"], "support");
        assert_eq!(v["client_secret_id"], serde_json::Value::Null);
        assert_eq!(v["cost_usd"], 0.0065);
    }

    #[test]
    fn stream_fields_are_flat_strings_named_like_the_json() {
        let mut row = sample();
        row.team = None;
        row.ttft_ms = Some(87);
        row.usage_unknown = true;
        let fields = row.stream_fields();
        let names: Vec<&str> = fields.iter().map(|(k, _)| *k).collect();
        assert_eq!(names, FIELDS.to_vec());
        let get = |k: &str| fields.iter().find(|(f, _)| *f == k).unwrap().1.clone();
        assert_eq!(get("team"), "");
        assert_eq!(get("client_secret_id"), "");
        assert_eq!(get("ttft_ms"), "87");
        assert_eq!(get("usage_unknown"), "true");
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
}
