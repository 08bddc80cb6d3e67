//! A simulated Live session's Responses delegation: what the upstream sends
//! when the session hands a task to its Responses backend.
//!
//! A session delegates to Responses when its configuration says so
//! (openai-python `types/live/session_config_param.py`,
//! `DelegationResponses`: `delegation = {type: "responses", responses:
//! {model, …}}`). The client's `response.create` (`response_create_event.py`:
//! "Request a response from the Live session's Responses backend ...
//! Requires Responses delegation") makes one delegated response here,
//! answered with:
//! - `session.delegation.created` (`delegation_created_event.py`:
//!   `delegation {id, target: "responses", type: "delegation",
//!   response_id}`, `offset_ms`);
//! - two `response.event`s (`response_event.py`: the nested Responses
//!   streaming event under `event`, with the outer `delegation_id`): the
//!   nested `response.created` (no usage yet) and `response.completed`,
//!   whose `response` carries the delegated `model` and its `usage`
//!   (`types/responses/response_usage.py`), fixed at
//!   [`DELEGATED_INPUT_TOKENS`], [`DELEGATED_CACHED_TOKENS`] and
//!   [`DELEGATED_OUTPUT_TOKENS`] (reasoning [`DELEGATED_REASONING_TOKENS`]
//!   of them) so a test knows what is owed.
//!
//! A session without Responses delegation answers `response.create` with
//! an `error` instead.

use serde_json::{json, Value};

use crate::wire::short_id;

/// Input tokens of every delegated response.
pub const DELEGATED_INPUT_TOKENS: u64 = 1_000;
/// Of which cached.
pub const DELEGATED_CACHED_TOKENS: u64 = 200;
/// Output tokens of every delegated response (reasoning included).
pub const DELEGATED_OUTPUT_TOKENS: u64 = 300;
/// Of which reasoning.
pub const DELEGATED_REASONING_TOKENS: u64 = 100;

/// The Responses model a session delegates to, when its configuration
/// (`session.delegation`) is a Responses delegation.
pub(crate) fn delegated_model(session: &Value) -> Option<&str> {
    let d = session.get("delegation")?;
    if d.get("type").and_then(Value::as_str) != Some("responses") {
        return None;
    }
    d.get("responses")?
        .get("model")?
        .as_str()
        .filter(|m| !m.is_empty())
}

/// The events (type, rest) of one delegated response on `model`, created
/// `offset_ms` into the session; `repeat_completed` sends the nested
/// `response.completed` twice (a fault a meter must not charge twice).
pub(crate) fn delegated_events(
    model: &str,
    offset_ms: u64,
    client_event_id: Option<&str>,
    repeat_completed: bool,
) -> Vec<(&'static str, Value)> {
    let delegation_id = format!("dlg_{}", short_id());
    let response_id = format!("resp_{}", short_id());
    let snapshot = |status: &str, usage: Value| {
        json!({"id": response_id, "object": "response", "model": model,
               "status": status, "output": [], "usage": usage})
    };
    let usage = json!({
        "input_tokens": DELEGATED_INPUT_TOKENS,
        "input_tokens_details": {"cached_tokens": DELEGATED_CACHED_TOKENS, "cache_write_tokens": 0},
        "output_tokens": DELEGATED_OUTPUT_TOKENS,
        "output_tokens_details": {"reasoning_tokens": DELEGATED_REASONING_TOKENS},
        "total_tokens": DELEGATED_INPUT_TOKENS + DELEGATED_OUTPUT_TOKENS,
    });
    let nested = |kind: &str, seq: u64, response: Value| {
        json!({"delegation_id": delegation_id, "client_event_id": client_event_id,
               "event": {"type": kind, "sequence_number": seq, "response": response}})
    };
    let completed = nested("response.completed", 2, snapshot("completed", usage));
    let mut out = vec![
        (
            "session.delegation.created",
            json!({"delegation": {"id": delegation_id, "target": "responses",
                                  "type": "delegation", "response_id": response_id},
                   "offset_ms": offset_ms, "client_event_id": client_event_id}),
        ),
        (
            "response.event",
            nested("response.created", 1, snapshot("in_progress", Value::Null)),
        ),
        ("response.event", completed.clone()),
    ];
    if repeat_completed {
        out.push(("response.event", completed));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delegated_response_is_announced_then_created_then_completed_with_its_usage() {
        let session = json!({"model": "gpt-live-1",
                             "delegation": {"type": "responses", "responses": {"model": "gpt-5.5"}}});
        let model = delegated_model(&session).unwrap();
        assert_eq!(model, "gpt-5.5");
        assert!(delegated_model(&json!({"delegation": {"type": "client"}})).is_none());
        assert!(delegated_model(&json!({"model": "gpt-live-1"})).is_none());

        let events = delegated_events(model, 1500, Some("c1"), false);
        let kinds: Vec<&str> = events.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            kinds,
            [
                "session.delegation.created",
                "response.event",
                "response.event"
            ]
        );
        let created = &events[0].1["delegation"];
        let done = &events[2].1;
        assert_eq!(done["delegation_id"], created["id"]);
        assert_eq!(done["event"]["type"], "response.completed");
        assert_eq!(done["event"]["response"]["id"], created["response_id"]);
        assert_eq!(done["event"]["response"]["model"], "gpt-5.5");
        assert_eq!(done["event"]["response"]["usage"]["total_tokens"], 1300);
        assert!(events[1].1["event"]["response"]["usage"].is_null());
        assert_eq!(delegated_events(model, 0, None, true).len(), 4);
    }
}
