//! Token usage of the responses a GPT-Live session delegates to a
//! Responses backend, read from the session's nested `response.event`s.
//!
//! A Live session configured with `session.delegation = {type:
//! "responses", responses: {model, …}}` (openai-python
//! `types/live/session_config_param.py`, `DelegationResponses`;
//! `responses_delegation_config.py`: "The model used for server-owned
//! Responses delegations") runs Responses API requests of its own. Their
//! usage is not in the Live session's seconds: it comes only inside
//! `response.event` (`types/live/response_event.py`: `event` is "the
//! nested Responses streaming event. Dispatch on its type field. Response
//! lifecycle snapshots omit input and clear instructions, tools, and
//! output"), so a nested `response.completed` / `response.incomplete` /
//! `response.failed` (`types/responses/response_*_event.py`) still carries
//! `response.id`, `response.model` and `response.usage`
//! (`types/responses/response_usage.py`: `input_tokens`,
//! `input_tokens_details.cached_tokens`, `output_tokens` with
//! `output_tokens_details.reasoning_tokens` inside it, `total_tokens`).
//!
//! Each such response is charged once, as a text token turn of its own
//! model ([`Delegated`]): input at the text input rate, cached input at the
//! cached text rate, output (reasoning included, as the Responses API
//! bills it) at the text output rate. A response id seen before charges
//! nothing ([`DelegatedLedger`]).
//!
//! The ids seen are kept per metering of a session, in memory. A WebSocket
//! session is metered by one replica for its whole life (it is never
//! handed over), so for it the rule is exact. A WebRTC session's sideband
//! can move to another replica (a drain, a kill): with Redis, the ids of
//! the responses charged are added to the session's `live_delegated` set
//! *before* they are charged ([`crate::metering::live::ChargedMark`]), and
//! the adopting replica starts from that set, so a terminal event the
//! upstream repeats after the hand-over charges nothing there either; a
//! replica killed between the two leaves those responses charged by
//! nobody. Remaining bound: a response whose id the store did not confirm
//! is charged in a later flush (the last flush charges whatever the store
//! says), and the replica letting a session go on a drain marks its last
//! ids in its final flush, which can land after the adopting replica read
//! the set: a terminal event repeated on the new sideband within that gap
//! (milliseconds) is charged once more. A sideband carries only the events
//! that happen while it is attached, so nothing else is seen twice.
//!
//! Under `unpriced = "block"` a Live session whose `session.start` names a
//! delegated model without a token price on every upstream of its route is
//! refused before the dial ([`unpriced_start_model`]), as an unpriced
//! session model is; under `allow` the delegated rows are written at cost
//! 0 and flagged `usage_unpriced`.
//!
//! Only frames that are `response.event`s and carry a `"usage"` key are
//! parsed ([`read`]): nested deltas, by far the most of them, never are.

use std::collections::HashSet;

use memchr::memmem;
use serde::Deserialize;

use super::pricing::Usage;

/// The Live server event that wraps a delegated Responses event.
pub const RESPONSE_EVENT: &[u8] = b"response.event";
/// The nested events that end a response and carry its usage.
const TERMINAL: [&str; 3] = [
    "response.completed",
    "response.incomplete",
    "response.failed",
];
/// Response ids remembered per session; past it the oldest half is
/// forgotten (a session delegating this often is far past any real one).
pub const MAX_DELEGATED_IDS: usize = 4096;

/// One delegated response's usage, to be charged once.
#[derive(Debug, Clone, PartialEq)]
pub struct Delegated {
    pub response_id: String,
    pub delegation_id: Option<String>,
    /// The model the Responses backend ran (`response.model`).
    pub model: String,
    /// `completed`, `incomplete` or `failed`: the row's end reason.
    pub status: &'static str,
    pub usage: Usage,
}

/// The delegated usage in `text`, a Live server event, when it is a
/// `response.event` wrapping a terminal Responses event with a response
/// id, a model and a usage. `known_response_event`: the caller already
/// read the event's type as `response.event` (`None`: the type was not
/// the first key, and the frame is looked at whole).
pub fn read(text: &[u8], known_response_event: Option<bool>) -> Option<Delegated> {
    match known_response_event {
        Some(false) => return None,
        Some(true) => {}
        None if memmem::find(text, RESPONSE_EVENT).is_none() => return None,
        None => {}
    }
    // A delta's text that spells `"usage"` is escaped (`\"usage\"`), so
    // this skips every frame without a usage object.
    memmem::find(text, b"\"usage\"")?;
    #[derive(Deserialize)]
    struct Outer {
        #[serde(rename = "type")]
        kind: String,
        delegation_id: Option<String>,
        event: Nested,
    }
    #[derive(Deserialize)]
    struct Nested {
        #[serde(rename = "type")]
        kind: String,
        response: Option<Response>,
    }
    #[derive(Deserialize)]
    struct Response {
        id: Option<String>,
        model: Option<String>,
        usage: Option<ResponseUsage>,
    }
    // openai-python `types/responses/response_usage.py`.
    #[derive(Deserialize)]
    struct ResponseUsage {
        #[serde(default)]
        input_tokens: u64,
        #[serde(default)]
        input_tokens_details: Option<InputDetails>,
        #[serde(default)]
        output_tokens: u64,
        #[serde(default)]
        total_tokens: Option<u64>,
    }
    #[derive(Deserialize)]
    struct InputDetails {
        #[serde(default)]
        cached_tokens: u64,
    }
    let outer: Outer = serde_json::from_slice(text).ok()?;
    if outer.kind.as_bytes() != RESPONSE_EVENT {
        return None;
    }
    let status = TERMINAL
        .iter()
        .find(|t| **t == outer.event.kind)
        .map(|t| &t["response.".len()..])?;
    let r = outer.event.response?;
    let u = r.usage?;
    let cached = u
        .input_tokens_details
        .map_or(0, |d| d.cached_tokens)
        .min(u.input_tokens);
    let total = u
        .total_tokens
        .unwrap_or(0)
        .max(u.input_tokens.saturating_add(u.output_tokens));
    Some(Delegated {
        response_id: r.id.filter(|id| !id.is_empty())?,
        delegation_id: outer.delegation_id,
        model: r.model.filter(|m| !m.is_empty())?,
        status,
        usage: Usage {
            input: u.input_tokens,
            output: u.output_tokens,
            total,
            input_text: u.input_tokens,
            cached_text: cached,
            output_text: u.output_tokens,
            ..Usage::default()
        },
    })
}

/// The Responses model a Live `session.start` delegates to
/// (`session.delegation = {type: "responses", responses: {model}}`).
pub fn start_model(start: &serde_json::Value) -> Option<&str> {
    delegation_model(start.get("session")?.get("delegation")?)
}

/// The Responses model a Live `session.delegation` names, in a
/// `session.start` or a `session.update` (`types/live/session_update_config.py`,
/// `DelegationResponses.responses.model`: "The Responses backend model to
/// use for subsequent delegated requests").
pub fn delegation_model(delegation: &serde_json::Value) -> Option<&str> {
    if delegation.get("type").and_then(serde_json::Value::as_str) != Some("responses") {
        return None;
    }
    delegation.get("responses")?.get("model")?.as_str()
}

/// The `param` naming a delegated model in Live's errors.
pub const DELEGATED_MODEL_PARAM: &str = "session.delegation.responses.model";

/// The delegated model of `start` when it has no token price on one of
/// `upstreams` (the route's upstream names): what `unpriced = "block"`
/// refuses.
pub fn unpriced_start_model<'a>(
    start: &'a serde_json::Value,
    prices: &[crate::config::PriceRow],
    upstreams: &[&str],
) -> Option<&'a str> {
    let m = start_model(start)?;
    let priced = upstreams.iter().all(|u| {
        super::pricing::find(prices, m, m, u).is_some_and(crate::config::PriceRow::prices_tokens)
    });
    (!priced).then_some(m)
}

/// The delegated responses of one session not yet charged, and the ids of
/// every one seen, so each is charged once.
#[derive(Debug, Default)]
pub struct DelegatedLedger {
    seen: HashSet<String>,
    /// Oldest first, for forgetting past [`MAX_DELEGATED_IDS`].
    order: Vec<String>,
    pending: Vec<Delegated>,
}

impl DelegatedLedger {
    /// Queues `d` unless its response id was seen; true if queued.
    pub fn add(&mut self, d: Delegated) -> bool {
        if self.seen.contains(&d.response_id) {
            return false;
        }
        if self.order.len() >= MAX_DELEGATED_IDS {
            for old in self.order.drain(..MAX_DELEGATED_IDS / 2) {
                self.seen.remove(&old);
            }
        }
        self.seen.insert(d.response_id.clone());
        self.order.push(d.response_id.clone());
        self.pending.push(d);
        true
    }

    /// The responses queued since the last take.
    pub fn take(&mut self) -> Vec<Delegated> {
        std::mem::take(&mut self.pending)
    }

    /// Puts taken responses back, to be taken again (their ids stay seen).
    pub fn requeue(&mut self, taken: Vec<Delegated>) {
        let later = std::mem::replace(&mut self.pending, taken);
        self.pending.extend(later);
    }

    /// A response id charged elsewhere (the replica that metered the
    /// session before): never queued here.
    pub fn seen_already(&mut self, response_id: String) {
        if self.order.len() >= MAX_DELEGATED_IDS {
            for old in self.order.drain(..MAX_DELEGATED_IDS / 2) {
                self.seen.remove(&old);
            }
        }
        if self.seen.insert(response_id.clone()) {
            self.order.push(response_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completed(kind: &str, id: &str) -> String {
        format!(
            r#"{{"type":"response.event","event_id":"e","delegation_id":"dlg_1","event":{{"type":"{kind}","sequence_number":9,"response":{{"id":"{id}","object":"response","model":"gpt-5.5","status":"completed","output":[],"usage":{{"input_tokens":1000,"input_tokens_details":{{"cached_tokens":200,"cache_write_tokens":0}},"output_tokens":300,"output_tokens_details":{{"reasoning_tokens":100}},"total_tokens":1300}}}}}}}}"#
        )
    }

    #[test]
    fn a_terminal_nested_event_gives_its_models_text_token_usage() {
        let d = read(
            completed("response.completed", "resp_1").as_bytes(),
            Some(true),
        )
        .unwrap();
        assert_eq!(
            (
                d.response_id.as_str(),
                d.delegation_id.as_deref(),
                d.model.as_str()
            ),
            ("resp_1", Some("dlg_1"), "gpt-5.5")
        );
        assert_eq!(d.status, "completed");
        let u = d.usage;
        assert_eq!((u.input, u.input_text, u.cached_text), (1000, 1000, 200));
        assert_eq!((u.output, u.output_text, u.total), (300, 300, 1300));
        assert_eq!(u.audio_seconds, None);
        for (kind, status) in [
            ("response.incomplete", "incomplete"),
            ("response.failed", "failed"),
        ] {
            let d = read(completed(kind, "r").as_bytes(), None).unwrap();
            assert_eq!(d.status, status);
        }
    }

    #[test]
    fn other_frames_are_not_delegated_usage() {
        let text = completed("response.completed", "resp_1");
        assert!(read(text.as_bytes(), Some(false)).is_none());
        // Not terminal, not wrapped, or missing what a row needs.
        assert!(read(completed("response.created", "r").as_bytes(), Some(true)).is_none());
        let bare = text.replace("response.event", "session.output_transcript.delta");
        assert!(read(bare.as_bytes(), None).is_none());
        assert!(read(completed("response.completed", "").as_bytes(), Some(true)).is_none());
        let delta = r#"{"type":"response.event","event":{"type":"response.output_text.delta","delta":"\"usage\""}}"#;
        assert!(read(delta.as_bytes(), Some(true)).is_none());
        let no_usage = r#"{"type":"response.event","event":{"type":"response.completed","response":{"id":"r","model":"m","usage":null}}}"#;
        assert!(read(no_usage.as_bytes(), Some(true)).is_none());
    }

    #[test]
    fn a_start_delegating_to_a_model_without_token_prices_is_named() {
        let row = |model: &str, text_input: f64| crate::config::PriceRow {
            upstream: None,
            model: model.into(),
            text_input,
            cached_text_input: 0.0,
            audio_input: 0.0,
            cached_audio_input: 0.0,
            text_output: 0.0,
            audio_output: 0.0,
            usd_per_minute: None,
        };
        let prices = [row("gpt-5.5", 1.25)];
        let start = |m: &str| {
            serde_json::json!({"type": "session.start", "session": {"model": "gpt-live-1",
                "delegation": {"type": "responses", "responses": {"model": m}}}})
        };
        assert_eq!(
            unpriced_start_model(&start("gpt-5.5"), &prices, &["a"]),
            None
        );
        let other = start("gpt-other");
        assert_eq!(
            unpriced_start_model(&other, &prices, &["a"]),
            Some("gpt-other")
        );
        let client = serde_json::json!({"session": {"delegation": {"type": "client"}}});
        assert_eq!(unpriced_start_model(&client, &prices, &["a"]), None);
    }

    #[test]
    fn each_response_id_is_charged_once() {
        let d = read(
            completed("response.completed", "resp_1").as_bytes(),
            Some(true),
        )
        .unwrap();
        let mut ledger = DelegatedLedger::default();
        assert!(ledger.add(d.clone()));
        assert!(!ledger.add(d.clone()));
        assert_eq!(ledger.take().len(), 1);
        assert!(!ledger.add(d), "still seen after a take");
        assert!(ledger.take().is_empty());
    }
}
