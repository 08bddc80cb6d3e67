//! Models a client names in its own frames, checked before the frame is
//! forwarded: the key's (and its team's) `models` allow-list and the
//! `unpriced` policy cover them as they cover the `?model=` of the upgrade.
//!
//! A `session.update` (beta: also `transcription_session.update`) may name
//! - a transcription model: `session.audio.input.transcription.model` (GA),
//!   `session.input_audio_transcription.model` (beta); it must be allowed
//!   for the key and its team, and priced (a `[[prices]]` row for it, per
//!   token or per minute) under `unpriced = "block"`;
//! - `session.model`: a session's model is the one it connected to (the
//!   route's model or its upstream model), metered on its route's prices;
//!   another one named here is taken out of the update, which is forwarded
//!   without it ([`Verdict::Replace`]): frameworks send their configuration
//!   with their own default model, and the rest of it (tools, instructions)
//!   must reach the upstream.
//!
//! A refused frame is dropped: the client gets an OpenAI-shaped `error`
//! event (`model_not_allowed` or `model_not_priced`, `param` naming the
//! field, `event_id` the client's), the session goes on with its previous
//! settings, and the refusal is counted in
//! `patchbay_admission_refusals_total{reason}` and logged. A
//! `session.update` that cannot be read is refused too
//! (`invalid_session_update`): forwarding what the gateway could not check
//! would let a frame the upstream reads differently (a duplicate key, say)
//! through. So is a fragmented one whose first frame names it (the relay
//! holds no fragments back; the SDKs never fragment).
//!
//! Which frames are read whole ([`wants_whole`]): those whose leading bytes
//! name a session update, and those whose type is not in the leading bytes
//! (written later in the object, or with escapes). Every other frame — the
//! audio appends that are most of a call — costs the relay a 256-byte peek.
//!
//! What the frame check cannot see (a fragmented message whose type is not
//! in its leading bytes; a frame whose first `type` names another event and
//! that repeats `type` later, for an upstream that reads the last) reaches
//! the upstream; the backstop ([`SessionTap`]) ends the session when its
//! `session.updated` shows a model the policy refuses. No SDK writes such
//! frames.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::StatusCode;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::oneshot;

use super::delegated::{delegation_model as delegated_model, DELEGATED_MODEL_PARAM};
use super::live::{LiveUsage, CLOSE_EVENT as LIVE_CLOSE_EVENT};
use super::pricing;
use super::tracker::{TurnTracker, OUTCOME_MODEL_REFUSED};
use super::translation::TranslationAudio;
use crate::admission::Refusal;
use crate::auth::{model_allowed, KeyEntry, TeamEntry};
use crate::config::{PriceRow, RouteConfig, Unpriced, UpstreamConfig};
use crate::event::leading_event_type_bytes;
use crate::metrics::{Metrics, ReasonLabels};
use crate::relay::client_text::{Peek, Verdict};
use crate::relay::reader::RawFrame;
use crate::relay::{End, Kill, Tap};

/// Client events that can name a model.
const UPDATES: [&[u8]; 2] = [b"session.update", b"transcription_session.update"];

/// What a session's client may name in its frames.
#[derive(Debug, Clone)]
pub struct ModelPolicy {
    pub key: KeyEntry,
    pub team: Option<TeamEntry>,
    /// `unpriced = "block"`: a model without a price row is refused.
    pub block_unpriced: bool,
    pub prices: Arc<Vec<PriceRow>>,
    /// The upstream serving the session (a price row may name it).
    pub upstream: String,
    /// The models `session.model` may name: the route's and its upstream's.
    pub session_models: Vec<String>,
}

/// Why a client's frame is refused.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// `model_not_allowed`, `model_not_priced` or `invalid_session_update`.
    pub code: &'static str,
    /// The field, as OpenAI's `param`.
    pub param: Option<&'static str>,
    pub message: String,
    /// The client event's `event_id`.
    pub event_id: Option<String>,
}

impl Refused {
    /// As an HTTP refusal (a client secret's config): 403 for a model the
    /// key may not use, 402 for an unpriced one (as admission answers
    /// them), else 400.
    pub fn refusal(&self) -> Refusal {
        let status = match self.code {
            "model_not_allowed" => StatusCode::FORBIDDEN,
            "model_not_priced" => StatusCode::PAYMENT_REQUIRED,
            _ => StatusCode::BAD_REQUEST,
        };
        let r = Refusal::new(
            status,
            "invalid_request_error",
            self.code,
            self.message.clone(),
        );
        match self.param {
            Some(p) => r.with_param(p),
            None => r,
        }
    }

    /// The `error` event the client gets.
    pub fn event(&self) -> String {
        json!({
            "type": "error",
            "event_id": format!("event_patchbay_{}", crate::ids::short_id()),
            "error": {
                "type": "invalid_request_error",
                "code": self.code,
                "message": self.message,
                "param": self.param,
                "event_id": self.event_id,
                // The name Live's errors give it (openai-python
                // `types/live/error.py`).
                "client_event_id": self.event_id,
            }
        })
        .to_string()
    }
}

#[derive(Deserialize)]
struct TypeOnly {
    #[serde(rename = "type")]
    kind: Option<String>,
}

#[derive(Deserialize)]
struct Update {
    event_id: Option<String>,
    session: Option<UpdateSession>,
}

#[derive(Deserialize)]
struct UpdateSession {
    model: Option<String>,
    audio: Option<Audio>,
    /// Beta.
    input_audio_transcription: Option<Transcription>,
    /// GPT-Live: the delegation's Responses model may change
    /// (`types/live/session_update_config.py`); read leniently, as only
    /// its `responses.model` is checked.
    delegation: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Audio {
    input: Option<AudioInput>,
}

#[derive(Deserialize)]
struct AudioInput {
    transcription: Option<Transcription>,
}

#[derive(Deserialize)]
struct Transcription {
    model: Option<String>,
}

/// From a client message's leading bytes: whether it must be read whole.
pub fn wants_whole(leading: &[u8]) -> bool {
    whole_for(leading_event_type_bytes(leading))
}

/// [`wants_whole`] on the type read from the leading bytes (`None`: not
/// there).
fn whole_for(kind: Option<&[u8]>) -> bool {
    kind.is_none_or(|t| UPDATES.contains(&t))
}

impl ModelPolicy {
    /// The policy of a session of `key` on `upstream` of `route`, with the
    /// prices and `unpriced` setting as they are now.
    pub fn for_session(
        key: &KeyEntry,
        team: Option<&TeamEntry>,
        metering: &super::Metering,
        route: &RouteConfig,
        upstream: &UpstreamConfig,
    ) -> Self {
        Self {
            key: key.clone(),
            team: team.cloned(),
            block_unpriced: metering.config().unpriced == Unpriced::Block,
            prices: metering.prices(),
            upstream: upstream.name.clone(),
            session_models: vec![
                route.model.clone(),
                upstream.upstream_model(route).to_string(),
            ],
        }
    }

    /// The verdict on a whole client message: `Ok(None)` to forward it,
    /// `Ok(Some(text))` to forward `text` instead (`session.model` taken
    /// out), `Err` to refuse it.
    pub fn check(&self, text: &[u8]) -> Result<Option<String>, Refused> {
        let unreadable = |event_id: Option<String>| {
            Refused {
            code: "invalid_session_update",
            param: None,
            message: "this gateway could not read the session.update to check the models it names; it was not forwarded".into(),
            event_id,
        }
        };
        let kind = match serde_json::from_slice::<TypeOnly>(text) {
            Ok(t) => t.kind,
            // Not a JSON object: nothing the upstream takes as an update.
            Err(e) if !e.is_data() => return Ok(None),
            Err(_) => return Err(unreadable(None)),
        };
        if !kind.is_some_and(|k| UPDATES.contains(&k.as_bytes())) {
            return Ok(None);
        }
        let update: Update =
            serde_json::from_slice(text).map_err(|_| unreadable(event_id_of(text)))?;
        let Some(session) = update.session else {
            return Ok(None);
        };
        let refuse = |code, param, message: String| Refused {
            code,
            param: Some(param),
            message,
            event_id: update.event_id.clone(),
        };
        // A session's model is the one it connected to: another one named
        // here is taken out of the update (the rest of it is the client's
        // configuration, which frameworks send with their own default
        // model), so the session stays on the model its prices are for.
        let replaced = match &session.model {
            Some(m) if !self.session_models.iter().any(|s| s == m) => {
                tracing::warn!(
                    key_id = %self.key.id,
                    model = %m,
                    session_model = %self.session_models[0],
                    "session.update names another model than the session's: forwarded without session.model"
                );
                Some(
                    without_session_model(text)
                        .ok_or_else(|| unreadable(update.event_id.clone()))?,
                )
            }
            _ => None,
        };
        let ga = session
            .audio
            .and_then(|a| a.input)
            .and_then(|i| i.transcription)
            .and_then(|t| t.model)
            .map(|m| (m, "session.audio.input.transcription.model"));
        let beta = session
            .input_audio_transcription
            .and_then(|t| t.model)
            .map(|m| (m, "session.input_audio_transcription.model"));
        for (m, param) in ga.into_iter().chain(beta) {
            self.check_transcription_model(&m, param)
                .map_err(|(code, message)| refuse(code, param, message))?;
        }
        // A Live session's delegation moved to another Responses model is
        // held to what its `session.start` was: allowed, and token-priced
        // under `unpriced = "block"` (its usage is charged at its rates).
        if let Some(m) = session.delegation.as_ref().and_then(delegated_model) {
            self.check_delegated_model(m)
                .map_err(|(code, message)| refuse(code, DELEGATED_MODEL_PARAM, message))?;
        }
        Ok(replaced)
    }

    /// Whether the session may delegate to `m`: allowed for the key and its
    /// team, and priced per token under `unpriced = "block"`.
    pub fn check_delegated_model(&self, m: &str) -> Result<(), (&'static str, String)> {
        let param = DELEGATED_MODEL_PARAM;
        if !model_allowed(&self.key, self.team.as_ref(), m) {
            return Err((
                "model_not_allowed",
                format!("this API key is not allowed to use the model '{m}' ({param})"),
            ));
        }
        let priced =
            pricing::find(&self.prices, m, m, &self.upstream).is_some_and(PriceRow::prices_tokens);
        if self.block_unpriced && !priced {
            return Err((
                "model_not_priced",
                format!("the delegated model '{m}' ({param}) has no token price configured and this gateway refuses unpriced models"),
            ));
        }
        Ok(())
    }

    /// Whether the session may transcribe with `m`: allowed for the key
    /// and its team, and priced under `unpriced = "block"`; else the code
    /// and message of the refusal.
    pub fn check_transcription_model(
        &self,
        m: &str,
        param: &str,
    ) -> Result<(), (&'static str, String)> {
        if !model_allowed(&self.key, self.team.as_ref(), m) {
            return Err((
                "model_not_allowed",
                format!("this API key is not allowed to use the model '{m}' ({param})"),
            ));
        }
        let priced = pricing::find(&self.prices, m, m, &self.upstream)
            .is_some_and(|p| p.prices_tokens() || p.prices_duration());
        if self.block_unpriced && !priced {
            return Err((
                "model_not_priced",
                format!("the model '{m}' ({param}) has no price configured and this gateway refuses unpriced models"),
            ));
        }
        Ok(())
    }
}

/// The update `text` without its `session.model` (its other members as
/// they were; their order as serde_json writes them).
fn without_session_model(text: &[u8]) -> Option<String> {
    let mut v: serde_json::Value = serde_json::from_slice(text).ok()?;
    v.get_mut("session")?.as_object_mut()?.remove("model");
    Some(v.to_string())
}

/// A Live client's `session.start` (`types/live/session_start_event.py`).
const LIVE_START: &[u8] = b"session.start";

/// Whether a whole client message is a `session.start`, its type anywhere.
fn is_live_start(text: &[u8]) -> bool {
    match leading_event_type_bytes(text) {
        Some(kind) => kind == LIVE_START,
        None => serde_json::from_slice::<TypeOnly>(text)
            .is_ok_and(|t| t.kind.as_deref() == Some("session.start")),
    }
}

/// The `event_id` of a message that could not be read as an update.
fn event_id_of(text: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Id {
        event_id: Option<String>,
    }
    serde_json::from_slice::<Id>(text).ok()?.event_id
}

/// A WebSocket session's tap: its turn tracker, and the model policy on
/// its client's frames.
///
/// Backstop: the frame check reads a message's type from its leading bytes,
/// and a fragmented message that does not name its type there is forwarded
/// unread (the relay holds no fragments back). Whatever reached the
/// upstream, its `session.updated` says which transcription model the
/// session now has: one the policy refuses ends the session at once (close
/// 1008 with the `error` event, outcome `model_refused`), before a
/// transcription on it can be billed.
pub struct SessionTap<'a> {
    tracker: &'a mut TurnTracker,
    policy: Box<ModelPolicy>,
    /// Refused frames are counted here, under the route's `model` label
    /// (looked up only when one is refused: the session's future stays
    /// small).
    metrics: &'a Metrics,
    model: &'a str,
    session_id: &'a str,
    /// The session events the tracker had seen at the last check.
    session_events: u64,
    /// The last peek named a session update (so its fragments are refused).
    peeked_update: bool,
    /// Ends the session (the backstop).
    end: Option<oneshot::Sender<Kill>>,
    /// A translation session's audio, measured as it passes.
    audio: Option<Box<TranslationAudio>>,
    /// A Live session's cumulative usage, kept as it passes.
    live: Option<Arc<LiveUsage>>,
}

impl<'a> SessionTap<'a> {
    /// `tracker`'s session, its client's frames checked against `policy`;
    /// `end` is fired when the upstream's session takes a model the policy
    /// refuses.
    pub fn new(
        tracker: &'a mut TurnTracker,
        policy: Box<ModelPolicy>,
        metrics: &'a Metrics,
        model: &'a str,
        session_id: &'a str,
        end: oneshot::Sender<Kill>,
    ) -> Self {
        Self {
            session_events: tracker.session_events(),
            tracker,
            policy,
            metrics,
            model,
            session_id,
            peeked_update: false,
            end: Some(end),
            audio: None,
            live: None,
        }
    }

    /// Also keeps a Live session's usage figures; the teardown asks a Live
    /// upstream to close (`session.close`) and waits (bounded) for
    /// `session.closed`, which carries the final figure.
    pub fn measure_live(&mut self, usage: Arc<LiveUsage>) {
        self.live = Some(usage);
    }

    /// Also measures a translation session's audio.
    pub fn measure(&mut self, audio: TranslationAudio) {
        self.audio = Some(Box::new(audio));
    }

    fn refused(&self, r: &Refused) -> String {
        let labels = ReasonLabels {
            model: self.model.into(),
            reason: r.code.into(),
        };
        self.metrics.refusals.get_or_create(&labels).inc();
        tracing::warn!(
            target: "patchbay_gateway::access",
            session_id = %self.session_id,
            key_id = %self.policy.key.id,
            code = r.code,
            param = r.param.unwrap_or(""),
            "client frame refused: {}",
            r.message
        );
        r.event()
    }

    /// The backstop, after a session event.
    fn check_session(&mut self) {
        let Some(m) = self.tracker.transcription_model() else {
            return;
        };
        let Err((code, message)) = self
            .policy
            .check_transcription_model(m, "session.audio.input.transcription.model")
        else {
            return;
        };
        let r = Refused {
            code,
            param: Some("session.audio.input.transcription.model"),
            message: format!("{message}; the session is closed"),
            event_id: None,
        };
        let event = self.refused(&r);
        if let Some(end) = self.end.take() {
            let _ = end.send(Kill {
                code: crate::relay::code::POLICY,
                reason: "model not allowed".into(),
                error_event: Some(event),
                outcome: OUTCOME_MODEL_REFUSED,
            });
        }
    }
}

impl SessionTap<'_> {
    fn after_upstream(&mut self) {
        let seen = self.tracker.session_events();
        if seen != self.session_events {
            self.session_events = seen;
            self.check_session();
        }
    }
}

impl Tap for SessionTap<'_> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.tracker.poll_ready(cx)
    }
    fn on_upstream_text(&mut self, text: &str) {
        self.tracker.on_upstream_text(text);
        self.after_upstream();
    }
    fn on_upstream_frame(&mut self, text: &[u8]) {
        self.tracker.on_upstream_frame(text);
        if let Some(a) = &self.audio {
            a.on_upstream(text);
        }
        if let Some(l) = &self.live {
            l.on_upstream(text);
        }
        self.after_upstream();
    }
    fn responses_in_flight(&self) -> Vec<Option<String>> {
        match &self.live {
            // A Live session is "in flight" until its `session.closed`.
            Some(l) if l.closed() => Vec::new(),
            Some(_) => vec![None],
            None => self.tracker.responses_in_flight(),
        }
    }
    fn cancel_text(&self, response_id: Option<&str>) -> String {
        match &self.live {
            Some(_) => LIVE_CLOSE_EVENT.to_string(),
            None => crate::relay::cancel_event(response_id),
        }
    }
    fn ending(&mut self, end: &End) {
        self.tracker.ending(end)
    }
    fn inspects_client(&self) -> bool {
        true
    }
    fn peek_client(&mut self, leading: &[u8], frame: &RawFrame) -> Peek {
        // The type is read once per frame, for every check below.
        let kind = leading_event_type_bytes(leading);
        self.peeked_update = kind.is_some_and(|t| UPDATES.contains(&t));
        if self.live.is_some() && kind == Some(LIVE_START) {
            return Peek::Whole;
        }
        let audio = self
            .audio
            .as_ref()
            .map(|a| a.peek_typed(kind, leading, frame));
        if whole_for(kind) || audio == Some(Peek::Whole) {
            Peek::Whole
        } else {
            Peek::Forward
        }
    }
    fn on_client_text(&mut self, text: &[u8]) -> Verdict {
        if self.live.is_some() && is_live_start(text) {
            // The session started with the model it was admitted for.
            return Verdict::Refuse(self.refused(&Refused {
                code: "session_already_started",
                param: None,
                message: "this Live session has already started; a second session.start was not forwarded".into(),
                event_id: event_id_of(text),
            }));
        }
        if let Some(Err(message)) = self.audio.as_ref().map(|a| a.on_client_text(text)) {
            return Verdict::Refuse(self.refused(&Refused {
                code: "invalid_event",
                param: None,
                message: message.into(),
                event_id: None,
            }));
        }
        match self.policy.check(text) {
            Ok(None) => Verdict::Forward,
            Ok(Some(replaced)) => Verdict::Replace(replaced),
            Err(r) => Verdict::Refuse(self.refused(&r)),
        }
    }
    /// A fragmented session update is refused; a fragmented message whose
    /// type is not in its leading bytes goes through (the backstop covers
    /// it).
    fn on_client_fragmented(&mut self) -> Result<(), String> {
        if self.audio.is_some() {
            // Its audio could not be measured.
            return Err(self.refused(&Refused {
                code: "invalid_event",
                param: None,
                message: "a translation session takes each event as one WebSocket message (its audio is measured from it); this fragmented message was not forwarded".into(),
                event_id: None,
            }));
        }
        if !self.peeked_update {
            return Ok(());
        }
        Err(self.refused(&Refused {
            code: "invalid_session_update",
            param: None,
            message: "a session.update sent in fragments is not accepted by this gateway: send each event as one WebSocket message".into(),
            event_id: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::KeySet;
    use crate::secret::Secret;

    const WHISPER: &str = "gpt-realtime-whisper";

    fn policy(key_models: Option<&[&str]>, block_unpriced: bool) -> ModelPolicy {
        let mut key = KeySet::default()
            .with_master(&Secret::new("m"))
            .by_id("master")
            .unwrap()
            .clone();
        key.models = key_models.map(|l| l.iter().map(|m| m.to_string()).collect());
        ModelPolicy {
            key,
            team: None,
            block_unpriced,
            prices: Arc::new(vec![PriceRow {
                model: WHISPER.into(),
                usd_per_minute: Some(0.017),
                ..PriceRow::default()
            }]),
            upstream: "gpt-realtime-mini".into(),
            session_models: vec!["gpt-realtime-mini".into(), "gpt-realtime-mini-2".into()],
        }
    }

    fn ga_update(model: &str) -> String {
        json!({"type": "session.update", "event_id": "evt_1", "session": {"type": "realtime",
            "audio": {"input": {"transcription": {"model": model}}}}})
        .to_string()
    }

    #[test]
    fn a_transcription_model_outside_the_allow_list_is_refused_naming_the_field() {
        let p = policy(Some(&["gpt-realtime-mini"]), false);
        let r = p.check(ga_update(WHISPER).as_bytes()).unwrap_err();
        assert_eq!(r.code, "model_not_allowed");
        assert_eq!(r.param, Some("session.audio.input.transcription.model"));
        assert_eq!(r.event_id.as_deref(), Some("evt_1"));
        let event: serde_json::Value = serde_json::from_str(&r.event()).unwrap();
        assert_eq!(event["type"], "error");
        assert_eq!(event["error"]["code"], "model_not_allowed");
        assert_eq!(
            event["error"]["param"],
            "session.audio.input.transcription.model"
        );
        assert_eq!(event["error"]["event_id"], "evt_1");

        let p = policy(Some(&["gpt-realtime-mini", WHISPER]), false);
        assert_eq!(p.check(ga_update(WHISPER).as_bytes()), Ok(None));
        // No list: every model.
        assert_eq!(
            policy(None, false).check(ga_update("x").as_bytes()),
            Ok(None)
        );
    }

    #[test]
    fn a_live_update_delegating_to_a_model_outside_the_list_or_unpriced_is_refused() {
        let update = |m: &str| {
            json!({"type": "session.update", "event_id": "evt_2", "session": {"delegation":
                {"type": "responses", "responses": {"model": m, "instructions": "x"}}}})
            .to_string()
        };
        let p = policy(Some(&["gpt-realtime-mini"]), false);
        let r = p.check(update("gpt-5.5").as_bytes()).unwrap_err();
        assert_eq!(
            (r.code, r.param, r.event_id.as_deref()),
            (
                "model_not_allowed",
                Some("session.delegation.responses.model"),
                Some("evt_2")
            )
        );
        let p = policy(Some(&["gpt-realtime-mini", "gpt-5.5"]), false);
        assert_eq!(p.check(update("gpt-5.5").as_bytes()), Ok(None));
        // Under block, a token price is needed (WHISPER's is per minute).
        let r = policy(None, true).check(update(WHISPER).as_bytes());
        assert_eq!(r.unwrap_err().code, "model_not_priced");
        assert_eq!(
            policy(None, false).check(update(WHISPER).as_bytes()),
            Ok(None)
        );
        // Another delegation type names no Responses model.
        let client =
            json!({"type": "session.update", "session": {"delegation": {"type": "client"}}});
        let p = policy(Some(&["gpt-realtime-mini"]), true);
        assert_eq!(p.check(client.to_string().as_bytes()), Ok(None));
    }

    #[test]
    fn an_unpriced_transcription_model_is_refused_only_under_block() {
        let beta = json!({"type": "transcription_session.update",
            "session": {"input_audio_transcription": {"model": "whisper-1"}}})
        .to_string();
        let r = policy(None, true).check(beta.as_bytes()).unwrap_err();
        assert_eq!(r.code, "model_not_priced");
        assert_eq!(r.param, Some("session.input_audio_transcription.model"));
        assert_eq!(policy(None, false).check(beta.as_bytes()), Ok(None));
        // Priced per minute: a price for either usage shape will do.
        assert_eq!(
            policy(None, true).check(ga_update(WHISPER).as_bytes()),
            Ok(None)
        );
    }

    #[test]
    fn another_session_model_is_taken_out_of_the_update_and_the_rest_forwarded() {
        let p = policy(None, false);
        let update = |m: &str| {
            json!({"type": "session.update", "session": {"model": m, "instructions": "x"}})
                .to_string()
        };
        assert_eq!(p.check(update("gpt-realtime-mini").as_bytes()), Ok(None));
        assert_eq!(p.check(update("gpt-realtime-mini-2").as_bytes()), Ok(None));
        let replaced = p.check(update("gpt-realtime").as_bytes()).unwrap().unwrap();
        let v: serde_json::Value = serde_json::from_str(&replaced).unwrap();
        assert_eq!(
            v,
            json!({"type": "session.update", "session": {"instructions": "x"}})
        );
        // The rest is still checked.
        let both = json!({"type": "session.update", "session": {"model": "gpt-realtime",
            "audio": {"input": {"transcription": {"model": WHISPER}}}}});
        let r = policy(Some(&["gpt-realtime-mini"]), false)
            .check(both.to_string().as_bytes())
            .unwrap_err();
        assert_eq!(r.code, "model_not_allowed");
    }

    #[test]
    fn an_update_that_cannot_be_read_is_refused_and_other_events_pass() {
        let p = policy(Some(&["gpt-realtime-mini"]), true);
        // A duplicate key: an upstream might read either value.
        let dup = r#"{"type":"session.update","session":{"audio":{"input":{"transcription":{"model":"a","model":"b"}}}}}"#;
        assert_eq!(
            p.check(dup.as_bytes()).unwrap_err().code,
            "invalid_session_update"
        );
        let wrong = r#"{"type":"session.update","session":{"model":7}}"#;
        assert_eq!(
            p.check(wrong.as_bytes()).unwrap_err().code,
            "invalid_session_update"
        );
        // An escaped type is the same event to the upstream.
        let escaped = ga_update(WHISPER).replace("session.update", "session\\u002eupdate");
        assert_eq!(
            p.check(escaped.as_bytes()).unwrap_err().code,
            "model_not_allowed"
        );
        for ok in [
            r#"{"type":"input_audio_buffer.append","audio":"AAAA"}"#,
            r#"{"type":"session.update","session":{"instructions":"x","audio":{"input":{"transcription":null}}}}"#,
            r#"{"type":"session.update"}"#,
            "not json",
        ] {
            assert_eq!(p.check(ok.as_bytes()), Ok(None), "{ok}");
        }
    }

    #[test]
    fn only_updates_and_messages_whose_type_is_not_leading_are_read_whole() {
        assert!(wants_whole(br#"{"type":"session.update","session":{"#));
        assert!(wants_whole(
            br#"{"event_id":"e1","type":"transcription_session.update""#
        ));
        assert!(!wants_whole(
            br#"{"type":"input_audio_buffer.append","audio":"AAAA"#
        ));
        assert!(!wants_whole(
            br#"{"event_id":"e","type":"response.create"}"#
        ));
        assert!(wants_whole(
            br#"{"audio":"AAAA","type":"input_audio_buffer.append"}"#
        ));
        assert!(wants_whole(br#"{"type":"session\u002eupdate"}"#));
    }
}
