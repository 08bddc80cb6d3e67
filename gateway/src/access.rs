//! The access log: one line per refused or completed HTTP request on the
//! client listener, and per WebSocket upgrade (when it is refused, or when
//! its session ends: then the session's own `session ended` line, written
//! by `session.rs` under this target with these fields, is its access line,
//! one line per session), through `tracing` at INFO under the target
//! [`TARGET`], so that `RUST_LOG` can keep or drop it on its own
//! (`RUST_LOG=info,patchbay_gateway::access=off`); `[server] access_log =
//! false` turns it off in the config.
//!
//! A line carries what an operator asks first: `kind` (`http` or
//! `websocket`), `method`, `path`, `status`, the refusal's `code`, the
//! session's `outcome`, `key_id` (the id from the keys file, never the key),
//! `model`, `client` (the peer address) and `duration_ms`. The path keeps
//! only the query parameters that are not secrets and say what was asked
//! for ([`logged_path`]: `model`, `deployment`, `intent`); anything else in
//! a query (an `api-key=` a client put there, say) never reaches the log.
//!
//! The refusal code travels from [`crate::http_error`] to the router's
//! edge as a response extension ([`RefusalCode`]), so axum handlers need
//! not know about this log.

use std::net::SocketAddr;
use std::time::Duration;

use crate::telemetry::context::TraceParent;

/// The `tracing` target of every access line.
pub const TARGET: &str = "patchbay_gateway::access";

/// The query parameters a logged path keeps: what was asked for, never a
/// credential.
const KEPT_PARAMS: [&str; 3] = ["model", "deployment", "intent"];

/// A refusal's OpenAI error `code`, set on the response by
/// [`crate::http_error::refusal_response`] for the access line.
#[derive(Debug, Clone, Copy)]
pub struct RefusalCode(pub &'static str);

/// Where a request came from and what it asked for, kept by a WebSocket
/// session for its line at the end.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    /// The path with only the kept query parameters ([`logged_path`]).
    pub path: String,
    pub client: Option<SocketAddr>,
    /// The client's W3C `traceparent`, read when telemetry is on.
    pub trace: Option<TraceParent>,
}

impl Origin {
    pub fn new(path: &str, query: Option<&str>, client: Option<SocketAddr>) -> Self {
        Self {
            path: logged_path(path, query),
            client,
            trace: None,
        }
    }
}

/// One access line's fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Line<'a> {
    /// `http` or `websocket`.
    pub kind: &'static str,
    pub method: &'a str,
    pub path: &'a str,
    pub status: u16,
    /// The refusal's code, for a refusal.
    pub code: Option<&'a str>,
    /// How a session ended, for a completed WebSocket session.
    pub outcome: Option<&'a str>,
    pub key_id: Option<&'a str>,
    pub model: Option<&'a str>,
    pub client: Option<SocketAddr>,
    pub duration: Duration,
}

impl Line<'_> {
    /// Writes the line at INFO under [`TARGET`].
    pub fn emit(&self) {
        tracing::info!(
            target: TARGET,
            kind = self.kind,
            method = self.method,
            path = self.path,
            status = self.status,
            code = self.code,
            outcome = self.outcome,
            key_id = self.key_id,
            model = self.model,
            client = self.client.map(tracing::field::display),
            duration_ms = self.duration.as_millis() as u64,
            "access"
        );
    }
}

/// `path` with only the query parameters of [`KEPT_PARAMS`], in their
/// order: `/v1/realtime?model=m&api-key=…` logs as `/v1/realtime?model=m`.
pub fn logged_path(path: &str, query: Option<&str>) -> String {
    let mut kept = url::form_urlencoded::Serializer::new(String::new());
    let mut any = false;
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if KEPT_PARAMS.contains(&k.as_ref()) {
            kept.append_pair(&k, &v);
            any = true;
        }
    }
    if any {
        format!("{path}?{}", kept.finish())
    } else {
        path.to_string()
    }
}

/// The `model` (or Azure's `deployment`) a query asks for.
pub fn query_model(query: Option<&str>) -> Option<String> {
    url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .find(|(k, _)| k == "model" || k == "deployment")
        .map(|(_, v)| v.into_owned())
        .filter(|m| !m.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logged_path_keeps_only_what_was_asked_for() {
        assert_eq!(logged_path("/v1/realtime", None), "/v1/realtime");
        assert_eq!(logged_path("/v1/realtime", Some("")), "/v1/realtime");
        assert_eq!(
            logged_path(
                "/v1/realtime",
                Some("api-key=pb-secret&model=gpt-realtime&intent=transcription")
            ),
            "/v1/realtime?model=gpt-realtime&intent=transcription"
        );
        assert_eq!(
            logged_path("/openai/v1/realtime", Some("deployment=d&key=pb-x")),
            "/openai/v1/realtime?deployment=d"
        );
        assert_eq!(logged_path("/x", Some("token=pb-secret")), "/x");
    }

    #[test]
    fn a_kept_parameter_is_encoded_again_so_it_cannot_forge_another() {
        assert_eq!(
            logged_path("/v1/realtime", Some("model=a%26api-key%3Dpb-x")),
            "/v1/realtime?model=a%26api-key%3Dpb-x"
        );
    }

    #[test]
    fn the_query_model_is_model_or_deployment_and_never_empty() {
        assert_eq!(query_model(Some("model=m")).as_deref(), Some("m"));
        assert_eq!(query_model(Some("deployment=d")).as_deref(), Some("d"));
        assert_eq!(query_model(Some("model=")), None);
        assert_eq!(query_model(None), None);
    }
}
