//! What the gateway's telemetry says, in the OpenTelemetry GenAI semantic
//! conventions for realtime sessions: pure functions from a metered turn
//! (its request-log row) to a `realtime_inference {model}` span, and from
//! a session's facts to its `gen_ai.client.realtime_session.started` /
//! `.ended` events.
//!
//! The version implemented: the realtime conventions of
//! open-telemetry/semantic-conventions-genai (`gen-ai-realtime-spans.md`,
//! Development status) as named in its realtime proposal: the
//! `realtime_inference` operation, `gen_ai.realtime_session.id`, and the
//! `gen_ai.client.realtime_session.*` events. They are in no released
//! schema yet, so the export names none ([`SCHEMA_URL`] is empty). Later
//! revisions of that document rename the session words to
//! `live_session`; the names live here as constants only.
//!
//! Every value comes from the row the meter already built (tokens per
//! modality, cost, status) and the tracker's times: nothing is parsed for
//! telemetry. The row and the span of a turn therefore always agree.

use std::time::{Duration, SystemTime};

use super::context::new_span_id;
use super::proto::{Attribute, EventData, LogData, SpanData, SpanKind, Value};
use crate::logs::RequestLogRow;

/// The schema the attributes follow: none released has them yet.
pub const SCHEMA_URL: &str = "";
/// `gen_ai.operation.name` of a turn.
pub const OPERATION: &str = "realtime_inference";
pub const EVENT_STARTED: &str = "gen_ai.client.realtime_session.started";
pub const EVENT_ENDED: &str = "gen_ai.client.realtime_session.ended";
/// The span event at a turn's first output token.
pub const EVENT_FIRST_TOKEN: &str = "gen_ai.first_token";
pub const SESSION_ID: &str = "gen_ai.realtime_session.id";
/// The upstream's conversation, on each turn's span: a conversation can
/// outlive a session, so it is never the session's id.
pub const CONVERSATION_ID: &str = "gen_ai.conversation.id";

/// A session, as its events and spans name it.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionFacts {
    /// The gateway's session id (the rows' `session_id`).
    pub session_id: String,
    /// The route's (client-facing) model.
    pub model: String,
    pub upstream_model: String,
    /// `openai` or `azure` (the rows' `provider`).
    pub provider: &'static str,
    pub key_id: String,
    /// `websocket`, `webrtc` or `sip`.
    pub transport: &'static str,
}

/// A metered turn: its row, and what the row keeps only in summary.
#[derive(Debug, Clone, Copy)]
pub struct Turn<'a> {
    pub row: &'a RequestLogRow,
    pub started_at: SystemTime,
    pub ended_at: SystemTime,
    pub ttft: Option<Duration>,
    /// The upstream's response id, when its events named one.
    pub response_id: Option<&'a str>,
    /// The upstream's conversation the response was added to
    /// (`gen_ai.conversation.id`); `None` for a response out of band.
    pub conversation_id: Option<&'a str>,
    /// Cached input tokens by modality (the row has their sum).
    pub cached_text: u64,
    pub cached_audio: u64,
    pub cached_image: u64,
}

/// `gen_ai.provider.name` for the rows' provider word.
pub fn provider_name(provider: &str) -> &'static str {
    match provider {
        "azure" => "azure.ai.openai",
        _ => "openai",
    }
}

/// The statuses a `response.done` reports; any other `end_reason` means the
/// turn was cut before its `response.done` (the session ended).
const DONE_STATUSES: [&str; 4] = ["completed", "incomplete", "cancelled", "failed"];

fn int(v: u64) -> Value {
    Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
}

/// The `realtime_inference {model}` CLIENT span of one turn, in trace
/// `trace_id` under `parent` (the client's span, when it sent one).
pub fn turn_span(
    facts: &SessionFacts,
    trace_id: [u8; 16],
    parent: Option<[u8; 8]>,
    turn: &Turn<'_>,
) -> SpanData {
    let row = turn.row;
    let done = DONE_STATUSES.contains(&row.end_reason.as_str());
    // A cut turn had a finish reason coming that never came: `error`, as
    // the conventions ask; else the response's own status.
    let finish = if done {
        row.end_reason.as_str()
    } else {
        "error"
    };
    let error = (!done || row.status >= 500).then(|| row.end_reason.clone());
    let mut a: Vec<Attribute> = Vec::with_capacity(32);
    a.push(("gen_ai.operation.name", Value::Str(OPERATION.into())));
    a.push((
        "gen_ai.provider.name",
        Value::Str(provider_name(&row.provider).into()),
    ));
    a.push(("gen_ai.request.model", Value::Str(row.model.clone())));
    a.push((
        "gen_ai.response.model",
        Value::Str(row.upstream_model.clone()),
    ));
    a.push((SESSION_ID, Value::Str(facts.session_id.clone())));
    if let Some(id) = turn.response_id {
        a.push(("gen_ai.response.id", Value::Str(id.to_string())));
    }
    // The provider's own id (never one made up here, as the conventions
    // ask): OpenAI names it in each response (`conversation_id`).
    if let Some(id) = turn.conversation_id {
        a.push((CONVERSATION_ID, Value::Str(id.to_string())));
    }
    a.push((
        "gen_ai.response.finish_reasons",
        Value::StrArray(vec![finish.to_string()]),
    ));
    if !row.usage_unknown {
        let usage = [
            ("gen_ai.usage.input_tokens", row.input_tokens),
            ("gen_ai.usage.output_tokens", row.output_tokens),
            ("gen_ai.usage.text.input_tokens", row.input_text_tokens),
            ("gen_ai.usage.audio.input_tokens", row.input_audio_tokens),
            ("gen_ai.usage.image.input_tokens", row.input_image_tokens),
            ("gen_ai.usage.text.output_tokens", row.output_text_tokens),
            ("gen_ai.usage.audio.output_tokens", row.output_audio_tokens),
            (
                "gen_ai.usage.cache_read.input_tokens",
                row.input_cached_tokens,
            ),
            (
                "gen_ai.usage.text.cache_read.input_tokens",
                turn.cached_text,
            ),
            (
                "gen_ai.usage.audio.cache_read.input_tokens",
                turn.cached_audio,
            ),
            (
                "gen_ai.usage.image.cache_read.input_tokens",
                turn.cached_image,
            ),
        ];
        a.extend(usage.into_iter().map(|(k, v)| (k, int(v))));
    }
    a.push(("patchbay.cost_usd", Value::Double(row.cost_usd)));
    a.push(("patchbay.request_id", Value::Str(row.request_id.clone())));
    a.push(("patchbay.status", int(u64::from(row.status))));
    a.push(("patchbay.end_reason", Value::Str(row.end_reason.clone())));
    a.push(("patchbay.usage_unknown", Value::Bool(row.usage_unknown)));
    a.push(("patchbay.key_id", Value::Str(row.key_id.clone())));
    a.push(("patchbay.transport", Value::Str(row.transport.clone())));
    a.push(("patchbay.upstream", Value::Str(row.upstream.clone())));
    if let Some(ms) = row.ttft_ms {
        a.push(("patchbay.ttft_ms", int(ms)));
    }
    if let Some(e) = &error {
        a.push(("error.type", Value::Str(e.clone())));
    }
    let events = turn
        .ttft
        .map(|t| EventData {
            time: turn.started_at + t,
            name: EVENT_FIRST_TOKEN,
            attributes: Vec::new(),
        })
        .into_iter()
        .collect();
    SpanData {
        trace_id,
        span_id: new_span_id(),
        parent_span_id: parent,
        name: format!("{OPERATION} {}", row.model),
        kind: SpanKind::Client,
        start: turn.started_at,
        end: turn.ended_at.max(turn.started_at),
        attributes: a,
        events,
        error,
    }
}

/// How a session ended, for its `.ended` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ending {
    /// The `outcome` of `patchbay_realtime_sessions_total`.
    pub outcome: &'static str,
    pub client_close_code: Option<u16>,
    pub upstream_close_code: Option<u16>,
    pub duration: Duration,
}

fn session_attributes(facts: &SessionFacts) -> Vec<Attribute> {
    vec![
        (
            "gen_ai.provider.name",
            Value::Str(provider_name(facts.provider).into()),
        ),
        ("gen_ai.request.model", Value::Str(facts.model.clone())),
        (SESSION_ID, Value::Str(facts.session_id.clone())),
        ("patchbay.route", Value::Str(facts.model.clone())),
        (
            "patchbay.upstream_model",
            Value::Str(facts.upstream_model.clone()),
        ),
        ("patchbay.transport", Value::Str(facts.transport.into())),
        ("patchbay.key_id", Value::Str(facts.key_id.clone())),
    ]
}

/// The `.started` event.
pub fn started_event(
    facts: &SessionFacts,
    trace_id: [u8; 16],
    span_id: Option<[u8; 8]>,
    at: SystemTime,
) -> LogData {
    LogData {
        time: at,
        event_name: EVENT_STARTED,
        trace_id,
        span_id,
        attributes: session_attributes(facts),
    }
}

/// The `.ended` event.
pub fn ended_event(
    facts: &SessionFacts,
    trace_id: [u8; 16],
    span_id: Option<[u8; 8]>,
    at: SystemTime,
    ending: &Ending,
) -> LogData {
    let mut attributes = session_attributes(facts);
    attributes.push(("patchbay.outcome", Value::Str(ending.outcome.into())));
    attributes.push((
        "patchbay.duration_ms",
        int(ending.duration.as_millis() as u64),
    ));
    if let Some(c) = ending.client_close_code {
        attributes.push(("patchbay.client_close_code", int(u64::from(c))));
    }
    if let Some(c) = ending.upstream_close_code {
        attributes.push(("patchbay.upstream_close_code", int(u64::from(c))));
    }
    LogData {
        time: at,
        event_name: EVENT_ENDED,
        trace_id,
        span_id,
        attributes,
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    fn facts() -> SessionFacts {
        SessionFacts {
            session_id: "s1".into(),
            model: "gpt-realtime".into(),
            upstream_model: "gpt-realtime-2025-08-28".into(),
            provider: "azure",
            key_id: "team-a-1".into(),
            transport: "websocket",
        }
    }

    fn row(end_reason: &str, status: u16, usage_unknown: bool) -> RequestLogRow {
        RequestLogRow {
            request_id: "s1:1".into(),
            session_id: "s1".into(),
            key_id: "team-a-1".into(),
            client_secret_id: None,
            transport: "websocket".into(),
            call_id: None,
            live_session_id: None,
            response_id: None,
            delegation_id: None,
            team: None,
            model: "gpt-realtime".into(),
            upstream_model: "gpt-realtime-2025-08-28".into(),
            provider: "azure".into(),
            upstream: "gpt-realtime".into(),
            started_at: String::new(),
            ended_at: String::new(),
            latency_ms: 900,
            ttft_ms: Some(120),
            status,
            input_tokens: 30,
            output_tokens: 50,
            total_tokens: 80,
            input_text_tokens: 10,
            input_audio_tokens: 20,
            input_image_tokens: 0,
            input_cached_tokens: 8,
            output_text_tokens: 5,
            output_audio_tokens: 45,
            transcription_tokens: 0,
            audio_seconds: None,
            output_audio_seconds: None,
            cost_usd: 0.0042,
            usage_unknown,
            usage_implausible: false,
            usage_estimated: false,
            usage_unpriced: false,
            end_reason: end_reason.into(),
        }
    }

    fn span_of(r: &RequestLogRow) -> SpanData {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let turn = Turn {
            row: r,
            started_at: t0,
            ended_at: t0 + Duration::from_millis(900),
            ttft: Some(Duration::from_millis(120)),
            response_id: Some("resp_1"),
            conversation_id: Some("conv_1"),
            cached_text: 3,
            cached_audio: 5,
            cached_image: 0,
        };
        turn_span(&facts(), [7; 16], Some([9; 8]), &turn)
    }

    fn attr<'a>(s: &'a SpanData, k: &str) -> Option<&'a Value> {
        s.attributes
            .iter()
            .find(|(key, _)| *key == k)
            .map(|(_, v)| v)
    }

    #[test]
    fn a_completed_turn_is_a_client_span_with_the_rows_usage_and_cost() {
        let r = row("completed", 200, false);
        let s = span_of(&r);
        assert_eq!(s.name, "realtime_inference gpt-realtime");
        assert_eq!(s.kind, SpanKind::Client);
        assert_eq!((s.trace_id, s.parent_span_id), ([7; 16], Some([9; 8])));
        assert_eq!(s.error, None);
        assert_eq!(
            attr(&s, "gen_ai.provider.name"),
            Some(&Value::Str("azure.ai.openai".into()))
        );
        assert_eq!(
            attr(&s, "gen_ai.usage.audio.output_tokens"),
            Some(&Value::Int(45))
        );
        assert_eq!(
            attr(&s, "gen_ai.usage.cache_read.input_tokens"),
            Some(&Value::Int(8))
        );
        assert_eq!(
            attr(&s, "gen_ai.usage.audio.cache_read.input_tokens"),
            Some(&Value::Int(5))
        );
        assert_eq!(attr(&s, "patchbay.cost_usd"), Some(&Value::Double(0.0042)));
        assert_eq!(
            attr(&s, "gen_ai.conversation.id"),
            Some(&Value::Str("conv_1".into()))
        );
        assert_eq!(
            attr(&s, "gen_ai.response.finish_reasons"),
            Some(&Value::StrArray(vec!["completed".into()]))
        );
        assert_eq!(s.events.len(), 1);
        assert_eq!(s.events[0].time, s.start + Duration::from_millis(120));
    }

    #[test]
    fn a_turn_cut_by_the_sessions_end_is_an_error_without_usage() {
        let r = row("client_closed", 499, true);
        let s = span_of(&r);
        assert_eq!(s.error.as_deref(), Some("client_closed"));
        assert_eq!(
            attr(&s, "gen_ai.response.finish_reasons"),
            Some(&Value::StrArray(vec!["error".into()]))
        );
        assert_eq!(attr(&s, "gen_ai.usage.input_tokens"), None);
        assert_eq!(
            attr(&s, "error.type"),
            Some(&Value::Str("client_closed".into()))
        );
        // A cancelled response (the client interrupted it) is no error.
        let s = span_of(&row("cancelled", 499, false));
        assert_eq!(s.error, None);
        assert_eq!(
            span_of(&row("failed", 502, false)).error.as_deref(),
            Some("failed")
        );
    }

    #[test]
    fn a_response_out_of_band_names_no_conversation() {
        let r = row("completed", 200, false);
        let turn = Turn {
            row: &r,
            started_at: UNIX_EPOCH,
            ended_at: UNIX_EPOCH,
            ttft: None,
            response_id: Some("resp_2"),
            conversation_id: None,
            cached_text: 0,
            cached_audio: 0,
            cached_image: 0,
        };
        let s = turn_span(&facts(), [7; 16], None, &turn);
        assert_eq!(attr(&s, "gen_ai.conversation.id"), None);
        assert_eq!(
            attr(&s, "gen_ai.response.id"),
            Some(&Value::Str("resp_2".into()))
        );
    }

    #[test]
    fn session_events_carry_the_key_id_and_the_ending() {
        let t = UNIX_EPOCH;
        let started = started_event(&facts(), [1; 16], None, t);
        assert_eq!(started.event_name, EVENT_STARTED);
        let ending = Ending {
            outcome: "client_closed",
            client_close_code: Some(1000),
            upstream_close_code: None,
            duration: Duration::from_secs(3),
        };
        let ended = ended_event(&facts(), [1; 16], Some([2; 8]), t, &ending);
        let get = |k: &str| {
            ended
                .attributes
                .iter()
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(get("patchbay.key_id"), Some(Value::Str("team-a-1".into())));
        assert_eq!(get("patchbay.client_close_code"), Some(Value::Int(1000)));
        assert_eq!(get("patchbay.upstream_close_code"), None);
        assert_eq!(
            get("patchbay.outcome"),
            Some(Value::Str("client_closed".into()))
        );
    }
}
